"""Queue-side checks of a pending podgroup on the cluster as the plan leaves it: every limit it would cross (its
queue or an ancestor, by how much), non-preemptible work beyond deserved quota, and where it stands against its
fair share (what decides whether it may reclaim). The same predicates as the engines (fairshare/capacity.py,
fairshare/reclaim.py), but all violations, not only the first."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.fairshare.quantities import le
from kai_opt.heuristics.session import Session
from kai_opt.state.resources import QR

UNLIMITED = -1.0
EPS = 1e-9


def queue_checks(sess: Session, g: int, request: np.ndarray) -> dict[str, Any]:
    st, fs, ledger = sess.state, sess.fs, sess.ledger
    q = int(st.pg_queue[g])
    if q < 0:
        return {}
    preemptible = bool(st.pg_preemptible[g])
    limits, quotas = [], []
    for a in ledger.ancestors[q]:
        for r, res in enumerate(QR):
            if request[r] <= 0:
                continue
            lim = float(fs.limit[a, r])
            cur = float(ledger.allocated[a, r])
            if lim != UNLIMITED and lim < cur + request[r] - EPS:
                limits.append({"queue": st.q_names[a], "own_queue": a == q, "resource": res, "limit": lim,
                               "allocated": cur, "requested": float(request[r]),
                               "over_by": cur + float(request[r]) - lim})
            des = float(fs.deserved[a, r])
            cur_np = float(ledger.allocated_np[a, r])
            if not preemptible and des != UNLIMITED and des < cur_np + request[r] - EPS:
                quotas.append({"queue": st.q_names[a], "own_queue": a == q, "resource": res, "quota": des,
                               "allocated_non_preemptible": cur_np, "requested": float(request[r]),
                               "over_by": cur_np + float(request[r]) - des})
    within = le(ledger.allocated[q] + request, fs.fair_share[q])
    allocatable = fs.allocatable_share[q]
    share = {res: {"allocated": float(ledger.allocated[q, r]), "requested": float(request[r]),
                   "fair_share": float(fs.fair_share[q, r]), "deserved": float(fs.deserved[q, r]),
                   "allocatable_share": float(allocatable[r])} for r, res in enumerate(QR)}
    return {"queue": st.q_names[q], "preemptible": preemptible, "over_limit": limits,
            "non_preemptible_over_quota": quotas, "within_fair_share": within, "fair_share": share}
