"""A pending podgroup as the explanation sees it: what it still needs (pods to minMember, per leaf sub-group) and
its pending pods grouped into shapes (identical requests, GPU needs, scheduling signature and sub-group)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import active_mask, group_shape, pending_mask
from kai_opt.state import R_GPU


@dataclass
class PodShape:
    pods: list[int]  # pending pods of this shape, task order
    subgroup: int  # leaf sub-group (global index), -1 = none
    kind: str  # whole | share | none
    whole: int  # whole devices per pod
    gpu_milli: int  # milli-GPU per pod (whole * 1000, or fraction x devices; gpu-memory at the smallest GPU)

    @property
    def pod(self) -> int:
        return self.pods[0]


@dataclass
class Need:
    group: int
    need: int  # pods still needed for minMember (1 for an elastic group that is already satisfied)
    elastic: bool  # satisfied already: the need is one more pod
    sub_need: dict[int, int]  # leaf sub-group -> pods still needed for its own minMember
    shapes: list[PodShape] = field(default_factory=list)
    active: int = 0
    pending: int = 0

    def request(self, sess: Session) -> np.ndarray:
        """Queue request (KAI units) of the pods placing `need` would take, largest shapes first."""
        pods: list[int] = []
        for s in sorted(self.shapes, key=lambda s: -s.gpu_milli):
            pods += s.pods
        pods = pods[: max(self.need, 1)]
        return sess.queue_request(pods).sum(axis=0) if pods else np.zeros(3)


def group_need(sess: Session, g: int) -> Need:
    st = sess.state
    shape = group_shape(sess, g)
    pods = shape.pods
    active = int(active_mask(sess, pods).sum())
    pend = pods[pending_mask(sess, pods)]
    need = max(0, int(st.pg_min_member[g]) - active)
    sub_need = {s: max(0, int(st.sg_min_member[s]) - int(active_mask(sess, sp).sum())) for s, sp in shape.leaves}
    elastic = need == 0 and not any(sub_need.values())
    out = Need(g, 1 if elastic else need, elastic, sub_need, active=active, pending=len(pend))
    by_key: dict[tuple, list[int]] = {}
    for p in pend.tolist():
        key = (int(st.pod_sg[p]), tuple(st.pod_req[p].tolist()), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
               int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]), int(st.pod_sig[p]))
        by_key.setdefault(key, []).append(p)
    for key, members in by_key.items():
        p0 = members[0]
        kind = "whole" if st.pod_gpu_whole[p0] else ("share" if (st.pod_gpu_frac[p0] or st.pod_gpu_mem[p0])
                                                      else "none")
        milli = round(float(sess.queue_request([p0])[0, 0]) * 1000) if kind == "share" \
            else int(st.pod_req[p0, R_GPU])
        out.shapes.append(PodShape(members, key[0], kind, int(st.pod_gpu_whole[p0]), milli))
    return out
