"""Job order across the queue tree (KAI's JobsOrderByQueues): at each level of the tree the best queue by the
queue-order rules (comparing the next job of each subtree), down to a leaf queue, whose best job goes next.
Within a leaf queue: higher priority first, then jobs below their minimum, then exactly at it, then above it
(elastic), then older, then name.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from kai_opt.fairshare.order import QueueOrder
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import elastic_state, tasks_to_allocate


class JobQueue:
    def __init__(self, sess: Session, jobs: list[int]) -> None:
        self.sess = sess
        st = sess.state
        self.order = QueueOrder(sess.fs, sess.ledger, st.q_names, st.q_creation, st.q_priority)
        self.leaf: dict[int, list[tuple[tuple, int]]] = {}
        self.count = np.zeros(st.n_queues, dtype=np.int64)  # jobs in each queue's subtree
        self._request: dict[int, np.ndarray] = {}
        for g in jobs:
            self.push(g)

    def __len__(self) -> int:
        return int(sum(len(v) for v in self.leaf.values()))

    def job_key(self, g: int) -> tuple:
        st = self.sess.state
        created = st.pg_creation[g]
        return (-int(st.pg_priority[g]), elastic_state(self.sess, g),
                created if not math.isnan(created) else math.inf, st.pg_keys[g])

    def push(self, g: int) -> None:
        q = int(self.sess.state.pg_queue[g])
        bisect.insort(self.leaf.setdefault(q, []), (self.job_key(g), g))
        self._request.pop(g, None)
        for a in self.sess.ledger.ancestors[q]:
            self.count[a] += 1

    def request(self, g: int) -> np.ndarray:
        r = self._request.get(g)
        if r is None:
            tasks = tasks_to_allocate(self.sess, g)
            r = self.sess.queue_request(tasks).sum(axis=0) if tasks else np.zeros(3)
            self._request[g] = r
        return r

    def _head(self, q: int) -> int:
        """The job queue q's subtree would run next (for comparing queues)."""
        st = self.sess.state
        while q not in self.leaf or not self.leaf[q]:
            kids = [c for c in st.q_children[q] if self.count[c] > 0]
            q = self._best(kids)
        return self.leaf[q][0][1]

    def _best(self, queues: list[int]) -> int:
        if len(queues) == 1:
            return queues[0]
        heads = {q: self.request(self._head(q)) for q in queues}
        return self.order.best(queues, heads)

    def pop(self) -> int | None:
        st = self.sess.state
        tops = [q for q in range(st.n_queues) if st.q_parent[q] < 0 and self.count[q] > 0]
        if not tops:
            return None
        q = self._best(tops)
        while q not in self.leaf or not self.leaf[q]:
            q = self._best([c for c in st.q_children[q] if self.count[c] > 0])
        _, g = self.leaf[q].pop(0)
        for a in self.sess.ledger.ancestors[q]:
            self.count[a] -= 1
        return g
