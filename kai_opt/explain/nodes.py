"""Node-level reasons per pod shape, in kube-scheduler's form ("0/5000 nodes are available: 3000 Insufficient
nvidia.com/gpu, ..."), counted by the greedy placer's own filter on the cluster as the plan leaves it."""

from __future__ import annotations

from typing import Any

from kai_opt.explain.shapes import Need
from kai_opt.heuristics.nodefilter import format_fit_error
from kai_opt.heuristics.placer import Placer


def node_reasons(placer: Placer, need: Need) -> list[dict[str, Any]]:
    st = placer.sess.state
    out = []
    for s in need.shapes:
        p = s.pod
        d = placer.diagnose(p)
        total, why, fits = d.total, d.reasons, len(d.feasible)
        entry: dict[str, Any] = {
            "pod": st.pods[p].key, "pods": len(s.pods), "kind": s.kind, "gpus_per_pod": s.gpu_milli / 1000.0,
            "subgroup": st.sg_names[s.subgroup] if s.subgroup >= 0 else None,
            "nodes": total, "nodes_that_fit_one_pod": fits, "reasons": dict(sorted(why.items(), key=lambda kv: -kv[1])),
        }
        if fits == 0:
            entry["message"] = format_fit_error(total, why)
        elif why:
            entry["message"] = f"{fits}/{total} nodes can hold one pod; " + format_fit_error(total, why).replace(
                f"0/{total} nodes are available", "the others", 1)
        else:
            entry["message"] = f"{fits}/{total} nodes can hold one pod"
        out.append(entry)
    return out
