"""Per-state tables kept up to date from the pods whose status changed, instead of made again from every pod.

A search visits hundreds of session states in a cycle, each a few pods away from the last one seen; a reader keeps
its own copy of the pod statuses and compares arrays, so any path between two states (operations, undos,
rollbacks) is covered without reading the session's log.
"""

from __future__ import annotations

import numpy as np

from kai_opt.heuristics.session import IS_ACTIVE, Session


class StatusWatch:
    """A reader's copy of the session's pod statuses."""

    __slots__ = ("seen",)

    def __init__(self, status: np.ndarray) -> None:
        self.seen = status.copy()

    def changed(self, status: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pods whose status differs from the copy, their statuses in it); the copy is then brought up to date."""
        pods = np.flatnonzero(status != self.seen)
        before = self.seen[pods]
        self.seen[pods] = status[pods]
        return pods, before


class ActiveCounts:
    """Active pods (bound, pipelined, placed this cycle) per index of a pod-to-index map (-1: not counted)."""

    __slots__ = ("count", "index", "watch")

    def __init__(self, sess: Session, index: np.ndarray, size: int) -> None:
        self.index = index
        self.watch = StatusWatch(sess.status)
        ours = (index >= 0) & IS_ACTIVE[sess.status]
        self.count = np.bincount(index[ours], minlength=size).astype(np.int64)

    def any_active(self, sess: Session) -> np.ndarray:
        """bool[size]: indices with an active pod in the session's current state."""
        pods, before = self.watch.changed(sess.status)
        if len(pods):
            at = self.index[pods]
            ours = at >= 0
            delta = IS_ACTIVE[sess.status[pods]].astype(np.int64) - IS_ACTIVE[before]
            np.add.at(self.count, at[ours], delta[ours])
        return self.count > 0


def group_active_counts(sess: Session) -> ActiveCounts:
    """Active pods per pod group (one per session)."""
    st = sess.state
    return sess.static("group_active_counts", lambda: ActiveCounts(sess, st.pod_pg.astype(np.int64), st.n_groups))
