"""The filter: which nodes can hold one pod, and why every other node cannot, from one set of checks.

kube-scheduler's shape: a filter decides a node and says why not (Fit names every resource the node is short of,
so one node may count under several reasons); FitError only counts the reasons over the nodes. Here each check
is a mask over the candidate nodes; `fit` combines them, and only when asked for reasons (a FitReasons) does it
also count each check's failing nodes, so the placer's hot path pays nothing for them. The checks, in order:
node Ready and schedulable; node selector, required node affinity and taints (per node class, the first failing
rule); resources once releases finish (each requested resource, whole GPUs, or a GPU share: GPU-memory label and
device size first, then room on a device); required pod (anti-)affinity on the nodes that pass the rest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from kai_opt.heuristics.session import ACTIVE, DEV, Session
from kai_opt.state import R_GPU, R_PODS
from kai_opt.state.gpu_memory import gpu_memory_fits
from kai_opt.state.resources import short_name

FIT_MEMO_SHAPES = 256  # pod shapes whose verdicts over every node the filter keeps (two bools per node each)
FIT_MEMO_MIN = 32  # candidates from which a pod's memoised verdicts are read instead of computed

NOT_READY = "node(s) were unschedulable or not ready"
NO_GPU_MEMORY_LABEL = "node(s) had no GPU memory label (nvidia.com/gpu.memory), which a gpu-memory request needs"
NO_GPU_SHARE = "Insufficient GPU share on any device"
WHOLE_GPUS = "Insufficient nvidia.com/gpu"
POD_AFFINITY = "node(s) didn't match pod affinity/anti-affinity rules"


class FitReasons:
    """Reasons nodes fail, as FitError's histogram: per reason how many nodes fail it, in first-seen order (a
    node may count under several); `failed` marks every node with at least one."""

    def __init__(self, n_nodes: int) -> None:
        self.counts: Counter[str] = Counter()
        self.failed = np.zeros(n_nodes, dtype=bool)

    def add(self, reason: str, nodes: np.ndarray) -> None:
        """`nodes` (node indexes) fail the check `reason` names; nothing is recorded for none."""
        if len(nodes):
            self.counts[reason] += len(nodes)
            self.failed[nodes] = True

    def add_where(self, reason: str, candidates: np.ndarray, fails: np.ndarray) -> None:
        """The candidates where `fails` holds fail the check `reason` names."""
        self.add(reason, candidates[fails])


class _ReasonRows:
    """The checks' failing masks in the order `_fit` asks them (one row per check, aligned with its candidates):
    what a pod shape's kept verdicts keep to count reasons over any node set (NodeFilter.diagnose)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, np.ndarray]] = []

    def add_where(self, reason: str, candidates: np.ndarray, fails: np.ndarray) -> None:
        self.rows.append((reason, fails))


@dataclass
class Diagnosis:
    """One pod against the nodes considered: the ones it fits (once releases finish) and why the others not."""

    total: int  # nodes considered
    feasible: np.ndarray  # node indexes that pass every check
    why: FitReasons

    @property
    def reasons(self) -> Counter[str]:
        return self.why.counts


class _FitMemo:
    """One pod shape's fit verdicts over every node, as of `seen` entries of the session's touched list."""

    __slots__ = ("future", "now", "rows", "seen")

    def __init__(self, seen: int, now: np.ndarray, future: np.ndarray) -> None:
        self.seen, self.now, self.future = seen, now, future
        self.rows: list[tuple[str, np.ndarray]] | None = None  # each check's failing nodes, once diagnose asks


class NodeFilter:
    """The checks over one session, with the per-signature label/taint verdicts cached (they never change) and,
    per pod shape, the resource verdicts over every node, refreshed for the nodes the session changed since (a
    placement attempt then reads its candidates' verdicts instead of recomputing them over every candidate)."""

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        st = sess.state
        self.n = st.n_nodes
        self.non_gpu_cols = np.array([c for c in range(len(st.resources)) if c != R_GPU], dtype=np.int64)
        self._static: dict[int, np.ndarray] = {}
        self._failures: dict[int, tuple[np.ndarray, list[str]]] = {}
        self._cols: dict[int, np.ndarray] = {}  # per pod: the resource columns it requests (GPUs aside)
        self.has_gpu = np.diff(st.dev_start) > 0
        # fit_key -> its verdicts over every node; insertion order is use order (the oldest is dropped)
        self._fit_memo: dict[tuple[object, ...], _FitMemo] = {}
        self._all_nodes = np.arange(self.n, dtype=np.int64)

    # -- node and signature ------------------------------------------------------------------------------------
    def static_mask(self, sig: int) -> np.ndarray:
        """Per node: Ready and schedulable, and no label/taint rule of signature `sig` fails."""
        mask = self._static.get(sig)
        if mask is None:
            codes, _ = self.static_failures(sig)
            mask = self._static[sig] = self.sess.state.node_ok & (codes < 0)
        return mask

    def static_failures(self, sig: int) -> tuple[np.ndarray, list[str]]:
        """Per node: index into the texts of the first label/taint rule it fails for this signature (-1: none),
        judged once per node class."""
        hit = self._failures.get(sig)
        if hit is None:
            st = self.sess.state
            s = st.sigs[sig]
            classes = st.node_class
            n_classes = int(classes.max()) + 1 if self.n else 0
            first = np.full(n_classes, -1, dtype=np.int64)
            first[classes[::-1]] = np.arange(self.n - 1, -1, -1)  # first node of each class
            texts: list[str] = []
            per_class = np.full(n_classes, -1, dtype=np.int64)
            for c, n in enumerate(first.tolist()):
                why = s.first_failure(st.node_labels[n], st.node_taints[n], st.node_names[n]) if n >= 0 else None
                if why:
                    if why not in texts:
                        texts.append(why)
                    per_class[c] = texts.index(why)
            hit = self._failures[sig] = (per_class[classes] if self.n else np.zeros(0, dtype=np.int64), texts)
        return hit

    # -- resources ---------------------------------------------------------------------------------------------
    def fit(self, p: int, candidates: np.ndarray,
            why: FitReasons | _ReasonRows | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(fits now, fits once releases finish) over the candidate node indexes; with `why`, each check's
        failing candidates (once releases finish) are added to it. Many candidates without `why`: read from the
        pod shape's memoised verdicts (fit_memo), the same values."""
        if why is None and len(candidates) >= FIT_MEMO_MIN:
            memo = self.fit_memo(p)
            if memo is not None:
                return memo.now[candidates], memo.future[candidates]
        return self._fit(p, candidates, why)

    def fit_memo(self, p: int) -> _FitMemo | None:
        """Pod p's verdicts over every node (`fit`'s two masks), kept per pod shape and refreshed for the nodes
        the session touched since they were made; None for a pod whose share spans several devices (its check
        walks each node's devices: not worth doing over every node)."""
        st = self.sess.state
        frac, mem, ndev = int(st.pod_gpu_frac[p]), int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p])
        if (frac or mem) and ndev > 1:
            return None
        key = (st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p]), frac, mem, ndev)
        caches = self.sess.caches
        memo = self._fit_memo.pop(key, None)
        nodes = None if memo is None else caches.changed_since(memo.seen, self.n)
        if memo is None or nodes is None:  # (new, or many changes: made whole)
            now, future = self._fit(p, self._all_nodes)
            memo = _FitMemo(len(caches.touched), now, future)
            while len(self._fit_memo) >= FIT_MEMO_SHAPES:
                del self._fit_memo[next(iter(self._fit_memo))]
        elif len(nodes):
            if memo.rows is None:
                memo.now[nodes], memo.future[nodes] = self._fit(p, nodes)
            else:
                fresh = _ReasonRows()
                memo.now[nodes], memo.future[nodes] = self._fit(p, nodes, fresh)
                for (_, row), (_, part) in zip(memo.rows, fresh.rows, strict=True):
                    row[nodes] = part
            memo.seen = len(caches.touched)
        self._fit_memo[key] = memo
        return memo

    def _reason_memo(self, p: int) -> _FitMemo | None:
        """fit_memo with each check's failing nodes kept as well (made on first use, refreshed with the verdicts
        from then on): reasons over any nodes are then counts of kept rows."""
        memo = self.fit_memo(p)
        if memo is not None and memo.rows is None:
            rows = _ReasonRows()
            self._fit(p, self._all_nodes, rows)
            memo.rows = rows.rows
        return memo

    def _fit(self, p: int, candidates: np.ndarray,
             why: FitReasons | _ReasonRows | None = None) -> tuple[np.ndarray, np.ndarray]:
        sess, st = self.sess, self.sess.state
        req = st.pod_req[p]
        cols = self.requested_cols(p)
        if why is None and len(candidates) == 1 and not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]):
            return self._fit_one(p, int(candidates[0]), cols)
        # the candidates' rows of the node arrays: every node's read in place (no copy) when they are every node
        at: np.ndarray | slice = slice(None) if candidates is self._all_nodes else candidates
        if len(cols) and len(candidates) <= 32:  # a few nodes: their rows at once
            need = req[cols]
            rows = candidates[:, None]
            free = sess.alloc[rows, cols] - sess.held[rows, cols]
            room = free >= need
            future_ok = room.all(axis=1)
            now_ok = (free - sess.rel[rows, cols] >= need).all(axis=1) & future_ok
            if why is not None:
                for j, c in enumerate(cols.tolist()):
                    why.add_where(self._resource_reason(c), candidates, ~room[:, j])
        else:  # many: column by column (cheaper than copying their whole rows)
            future_ok = np.ones(len(candidates), dtype=bool)
            now_ok = np.ones(len(candidates), dtype=bool)
            for c in cols.tolist():
                free = sess.alloc[at, c] - sess.held[at, c]
                room = free >= req[c]
                future_ok &= room
                now_ok &= free - sess.rel[at, c] >= req[c]
                if why is not None:
                    why.add_where(self._resource_reason(c), candidates, ~room)
            now_ok &= future_ok
        whole = int(st.pod_gpu_whole[p])
        if whole:
            now_ok &= sess.whole_idle[at] >= whole
            room = sess.whole_future[at] >= whole
            future_ok &= room
            if why is not None:
                why.add_where(WHOLE_GPUS, candidates, ~room)
        elif st.pod_gpu_frac[p] or st.pod_gpu_mem[p]:
            room = self._share_fits(p, candidates, now_ok)
            future_ok &= room
            if why is not None:
                self._share_reasons(p, candidates, room, why)
        gpu = int(req[R_GPU])
        if gpu and (whole or st.pod_gpu_frac[p]):
            # the node's GPU total holds too: a share bound there without a device of its own (the state warns
            # "no GPU device left for its share") holds node GPU no device shows
            free = sess.alloc[at, R_GPU] - sess.held[at, R_GPU]
            total = free >= gpu
            if why is not None:
                why.add_where(WHOLE_GPUS, candidates, future_ok & ~total)
            future_ok &= total
            now_ok &= total & (free - sess.rel[at, R_GPU] >= gpu)
        if st.pod_gpu_mem[p]:
            known = self.gpu_memory_ok(p, candidates)
            now_ok &= known
            future_ok &= known
        return now_ok, future_ok

    def requested_cols(self, p: int) -> np.ndarray:
        """The resource columns other than GPUs that pod p requests: as kube, only those are checked."""
        cols = self._cols.get(p)
        if cols is None:
            req = self.sess.state.pod_req[p]
            cols = self._cols[p] = self.non_gpu_cols[req[self.non_gpu_cols] > 0]
        return cols

    def _fit_one(self, p: int, n: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """_fit on one node for a pod without a GPU share, in scalars (the same checks, in the same order): the
        placer asks it of the node it just used, or of the one node an operation touched, thousands of times a
        cycle."""
        sess, st = self.sess, self.sess.state
        req = st.pod_req[p].tolist()
        alloc, held, rel = sess.alloc[n].tolist(), sess.held[n].tolist(), sess.rel[n].tolist()
        future = now = True
        for c in cols.tolist():
            free = alloc[c] - held[c]
            future = future and free >= req[c]
            now = now and free - rel[c] >= req[c]
        now = now and future
        whole = int(st.pod_gpu_whole[p])
        if whole:
            now = now and int(sess.whole_idle[n]) >= whole
            future = future and int(sess.whole_future[n]) >= whole
        gpu = req[R_GPU]
        if gpu and whole:  # the node's GPU total holds too (see _fit)
            free = alloc[R_GPU] - held[R_GPU]
            total = free >= gpu
            future = future and total
            now = now and total and free - rel[R_GPU] >= gpu
        return np.array([now]), np.array([future])

    def _share_fits(self, p: int, candidates: np.ndarray, now_ok: np.ndarray) -> np.ndarray:
        """Per candidate: room for p's GPU share on enough devices once releases finish; `now_ok` is narrowed to
        the candidates with that room now."""
        sess, st = self.sess, self.sess.state
        per = self.per_device(p, candidates)
        ndev = int(st.pod_gpu_ndev[p])
        if ndev == 1:
            now_ok &= (sess.max_idle[candidates] >= per) & self.has_gpu[candidates]
            return (sess.max_future[candidates] >= per) & self.has_gpu[candidates]
        room = np.ones(len(candidates), dtype=bool)
        for i, n in enumerate(candidates.tolist()):
            a, b = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
            now_ok[i] &= int((DEV - sess.dev_held[a:b] - sess.dev_rel[a:b] >= per[i]).sum()) >= ndev
            room[i] = int((DEV - sess.dev_held[a:b] >= per[i]).sum()) >= ndev
        return room

    def _share_reasons(self, p: int, candidates: np.ndarray, room: np.ndarray,
                       why: FitReasons | _ReasonRows) -> None:
        """A GPU node the GPU-memory rule refuses counts under that rule only; every other node without `room`
        (CPU-only nodes included) is short of a GPU share. Each check's nodes depend on their node alone."""
        st = self.sess.state
        refused = ~self.gpu_memory_ok(p, candidates)
        gpu = self.has_gpu[candidates]
        labelled = st.node_gpu_mem_known[candidates]
        why.add_where(NO_GPU_MEMORY_LABEL, candidates, refused & gpu & ~labelled)
        why.add_where(f"node(s) had less GPU memory per device than the requested {int(st.pod_gpu_mem[p])} MiB",
                      candidates, refused & labelled)
        why.add_where(NO_GPU_SHARE, candidates, ~room & ~(refused & gpu))

    def _resource_reason(self, col: int) -> str:
        return "Too many pods" if col == R_PODS else f"Insufficient {short_name(self.sess.state.resources[col])}"

    def gpu_memory_ok(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """Per node: a gpu-memory pod may go there (GPU-memory label set, a device holds the request); True for
        other pods."""
        st = self.sess.state
        if not st.pod_gpu_mem[p]:
            return np.ones(len(nodes), dtype=bool)
        return gpu_memory_fits(st.node_gpu_mem_known[nodes], st.node_gpu_mem_mib[nodes], int(st.pod_gpu_mem[p]))

    def per_device(self, p: int, nodes: np.ndarray) -> np.ndarray:
        st = self.sess.state
        if st.pod_gpu_frac[p]:
            return np.full(len(nodes), int(st.pod_gpu_frac[p]), dtype=np.int64)
        mem = np.maximum(st.node_gpu_mem_mib[nodes], 1)
        return np.minimum(DEV, -(-int(st.pod_gpu_mem[p]) * DEV // mem))

    # -- pod (anti-)affinity -----------------------------------------------------------------------------------
    def affinity_mask(self, p: int, candidates: np.ndarray) -> np.ndarray:
        st, sess = self.sess.state, self.sess
        pod = st.pods[p]
        mask = np.ones(len(candidates), dtype=bool)
        if not pod.pod_affinity and not pod.pod_anti_affinity:
            return mask
        placed = np.nonzero(np.isin(sess.status, (*ACTIVE, 3)) & (sess.node >= 0))[0]
        for terms, want in ((pod.pod_affinity, True), (pod.pod_anti_affinity, False)):
            for term in terms:
                namespaces = set(term.namespaces) or {pod.namespace}
                matching = [q for q in placed.tolist() if q != p and st.pods[q].namespace in namespaces
                            and term.selector.matches(st.pods[q].labels)]
                domains = {st.node_labels[int(sess.node[q])].get(term.topology_key) for q in matching}
                domains.discard(None)
                node_dom = [st.node_labels[n].get(term.topology_key) for n in candidates.tolist()]
                hit = np.array([d is not None and d in domains for d in node_dom], dtype=bool)
                if want:
                    if not matching and term.selector.matches(pod.labels):
                        continue  # the first pod of a group that selects itself may go anywhere
                    mask &= hit
                else:
                    mask &= ~hit
        return mask

    # -- the whole filter --------------------------------------------------------------------------------------
    def filter(self, p: int, candidates: np.ndarray, why: FitReasons | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`fit` and pod (anti-)affinity over candidates that already pass the static checks; with `why`, the
        affinity reason counts only nodes that fit otherwise."""
        now_ok, future_ok = self.fit(p, candidates, why)
        aff = self.affinity_mask(p, candidates)
        if why is not None:
            why.add(POD_AFFINITY, candidates[future_ok & ~aff])
        now_ok &= aff
        future_ok &= aff
        return now_ok, future_ok

    def diagnose(self, p: int, mask: np.ndarray | None = None) -> Diagnosis:
        """Every check over the nodes in `mask` (all when None), with the reasons: the pending reason's and
        explain's node-level counts."""
        st = self.sess.state
        why = FitReasons(self.n)
        considered = np.arange(self.n) if mask is None else np.flatnonzero(mask)
        ready = st.node_ok[considered]
        why.add(NOT_READY, considered[~ready])
        codes, texts = self.static_failures(int(st.pod_sig[p]))
        code = codes[considered]
        for c in np.unique(code[ready & (code >= 0)]).tolist():
            why.add(f"node(s) {texts[c]}", considered[ready & (code == c)])
        cand = considered[ready & (code < 0)]
        feasible = cand[:0]
        pod = st.pods[p]
        memo = None if pod.pod_affinity or pod.pod_anti_affinity else self._reason_memo(p)
        if memo is not None and memo.rows is not None:  # (no pod affinity: the filter is the checks alone)
            for reason, row in memo.rows:
                why.add_where(reason, cand, row[cand])
            feasible = cand[memo.future[cand]]
        elif len(cand):
            _, future_ok = self.filter(p, cand, why)
            feasible = cand[future_ok]
        return Diagnosis(len(considered), feasible, why)


def format_fit_error(total: int, reasons: Counter[str]) -> str:
    """kube-scheduler's FitError text: the reasons, most frequent first."""
    if not reasons:
        return f"0/{total} nodes are available."
    parts = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"0/{total} nodes are available: " + ", ".join(f"{c} {r}" for r, c in parts) + "."
