"""Job order across the queue tree (KAI's JobsOrderByQueues): at each level of the tree the best queue by the
queue-order rules (comparing the next job of each subtree), down to a leaf queue, whose best job goes next.
Within a leaf queue: higher priority first, then jobs below their minimum, then exactly at it, then above it
(elastic), then older, then name.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from kai_opt.fairshare.order import QueueOrder
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import elastic_state, elastic_states, tasks_to_allocate


class JobQueue:
    def __init__(self, sess: Session, jobs: list[int]) -> None:
        self.sess = sess
        st = sess.state
        # the rules read the session's ledger live (one object, updated in place): one per session
        self.order = sess.static("queue_order", lambda: QueueOrder(sess.fs, sess.ledger, st.q_names, st.q_creation,
                                                                   st.q_priority))
        self.leaf: dict[int, list[tuple[tuple[Any, ...], int]]] = {}
        self.count = [0] * st.n_queues  # jobs in each queue's subtree
        self._request: dict[int, np.ndarray] = {}
        self.tops = sess.static("top_queues", lambda: [q for q in range(st.n_queues) if st.q_parent[q] < 0])
        self._choice: dict[int, int] = {}  # queue (-1: the top level) -> its child that goes first
        self._dirty: set[int] = {-1}  # queues whose choice must be recomputed
        self._seen = sess.ledger.allocated.copy()
        # queue -> (its head job, that job's request, its queue-order key): valid while the queue's allocation
        # stays the same (_sync drops it) and its head job and request are the same objects
        self._keys: dict[int, tuple[int, np.ndarray, tuple[Any, ...]]] = {}
        # queues whose subtree had a job pushed or popped, or an allocation change, since their key was last read:
        # any other queue's kept key is still its key (its head job, request and allocation are unchanged)
        self._stale: set[int] = set()
        for g in jobs:
            self.push(g)

    def __len__(self) -> int:
        return int(sum(len(v) for v in self.leaf.values()))

    def job_key(self, g: int) -> tuple[Any, ...]:
        st = self.sess.state
        return _job_key(int(st.pg_priority[g]), elastic_state(self.sess, g), float(st.pg_creation[g]), st.pg_keys[g])

    def push(self, g: int) -> None:
        q = int(self.sess.state.pg_queue[g])
        bisect.insort(self.leaf.setdefault(q, []), (self.job_key(g), g))
        self._request.pop(g, None)
        for a in self.sess.ledger.ancestors[q]:
            self.count[a] += 1
        self._dirty_above(q)

    def request(self, g: int) -> np.ndarray:
        r = self._request.get(g)
        if r is None:
            tasks = tasks_to_allocate(self.sess, g)
            r = self.sess.queue_request(tasks).sum(axis=0) if tasks else np.zeros(3)
            self._request[g] = r
        return r

    # -- the best child of each queue, recomputed only where something changed ------------------------------
    def _sync(self) -> None:
        """Queues whose allocation changed since the last pop (placements, evictions) dirty their parents' choice."""
        now = self.sess.ledger.allocated
        diff = now != self._seen
        if not diff.any():  # (most pops: nothing placed or evicted since the last)
            return
        changed = np.flatnonzero(diff.any(axis=1))
        if len(changed):
            self._seen = now.copy()
            for q in changed.tolist():
                self._keys.pop(q, None)
                self._dirty_above(q)

    def _dirty_above(self, q: int) -> None:
        """q's subtree changed: q's key and its ancestors' may have, and its ancestors' choices."""
        parent = self.sess.state.q_parent
        stale = self._stale
        while q >= 0:
            stale.add(q)
            q = int(parent[q])
            if q in self._dirty:
                if q < 0:
                    return
                continue
            self._dirty.add(q)

    def _best_child(self, parent: int) -> int:
        q = self._choice.get(parent)
        if q is None or parent in self._dirty:
            kids = self.tops if parent < 0 else self.sess.state.q_children[parent]
            count = self.count
            q = self._best([c for c in kids if count[c] > 0])
            self._choice[parent] = q
            self._dirty.discard(parent)
        return q

    def _head(self, q: int) -> int:
        """The job queue q's subtree would run next (for comparing queues)."""
        while q not in self.leaf or not self.leaf[q]:
            q = self._best_child(q)
        return self.leaf[q][0][1]

    def _best(self, queues: list[int]) -> int:
        if len(queues) == 1:
            return queues[0]
        return self.order.best_by_key(queues, {q: self._key(q) for q in queues})

    def _key(self, q: int) -> tuple[Any, ...]:
        hit = self._keys.get(q)
        if hit is not None and q not in self._stale:
            return hit[2]
        self._stale.discard(q)
        g = self._head(q)
        r = self.request(g)
        if hit is not None and hit[0] == g and hit[1] is r:
            return hit[2]
        k = self.order.key(q, r)
        self._keys[q] = (g, r, k)
        return k

    def pop(self) -> int | None:
        count = self.count
        if not any(count[t] for t in self.tops):
            return None
        self._sync()
        q = self._best_child(-1)
        while q not in self.leaf or not self.leaf[q]:
            q = self._best_child(q)
        _, g = self.leaf[q].pop(0)
        for a in self.sess.ledger.ancestors[q]:
            count[a] -= 1
        self._dirty_above(q)
        return g


def job_keys(sess: Session, groups: list[int]) -> list[tuple[Any, ...]]:
    """JobQueue.job_key of each of `groups` on `sess` as it is now (one pass over their pods)."""
    st = sess.state
    arr = np.asarray(groups, dtype=np.int64)
    return [_job_key(*row) for row in zip(st.pg_priority[arr].tolist(), elastic_states(sess, arr),
                                          st.pg_creation[arr].tolist(), [st.pg_keys[g] for g in groups],
                                          strict=True)]


def _job_key(priority: int, elastic: int, created: float, name: str) -> tuple[Any, ...]:
    """Within a leaf queue: higher priority, then elastic state (below, at, above minMember), then older (unknown
    creation last), then name."""
    return (-priority, elastic, created if not math.isnan(created) else math.inf, name)
