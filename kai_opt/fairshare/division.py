"""Divide one resource among sibling queues, as KAI-Scheduler's proportion plugin does.

For one sibling set and one resource:
1. deserved pass: each queue gets min(deserved, requestable); deserved -1 means the whole amount. Deserved quota
   is a guarantee: when quotas are over-committed (or nodes are down) the siblings together get more than their
   parent has, exactly as in KAI (reclaim and quota rules rely on it);
2. over-quota, by queue priority (highest first): rounds split what is left among unsatisfied queues by
   over-quota weight; a queue whose remaining request fits its share takes exactly that, otherwise it takes the
   whole units of its share and the fraction is remembered; rounds repeat while some queue took less than its
   share; a queue alone at its priority level takes what is left up to its request, whatever its weight (KAI
   gives it everything left, even beyond its request);
3. leftovers: one unit (or what is left, if less) to each remembered queue by largest remembered fraction, then
   older creation time, then name.
Two refinements over KAI, both so that more capacity never takes a share away and a priority level really gets
all surplus before the next: a level's leftovers are handed out right after its own rounds (KAI runs the rounds
of every level first, so a lower level could take whole units the higher level lost to rounding), and a leftover
unit never takes a queue above its remaining request (KAI may overshoot by a fraction of a unit).
Requestable = request capped by the limit (-1: no cap). Weight 0 gets no over-quota.
Time-based fair share (kai_opt/fairshare/history.py): when a queue of the round's priority level has past usage,
each round's weights become KAI's max(0, W' + kValue * (W' - usage)) with W' the weight normalised as above; with
no usage the division is exactly the plain one. A lone queue at its level still takes what is left (its
normalised weight is 1 whatever its usage, unless the usage floors it at 0, which the lone-queue rule ignores as it
ignores a weight of 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kai_opt.fairshare.history import share_weight

UNLIMITED = -1.0


@dataclass
class QueueShare:
    """One queue's numbers for one resource while dividing."""

    index: int
    name: str
    deserved: float
    limit: float
    weight: float
    priority: int
    creation: float
    request: float
    usage: float = 0.0  # past usage normalised to the window's capacity (time-based fair share)
    fair_share: float = 0.0
    steps: list[str] = field(default_factory=list)  # a readable trace (kai-opt explain --queue)

    @property
    def requestable(self) -> float:
        return self.request if self.limit == UNLIMITED else min(self.limit, self.request)

    @property
    def remaining_request(self) -> float:
        return max(0.0, self.requestable - self.fair_share)

    @property
    def satisfied(self) -> bool:
        if self.request <= self.fair_share:
            return True
        return self.limit != UNLIMITED and self.limit <= self.fair_share

    def give(self, amount: float, why: str, trace: bool) -> None:
        self.fair_share += amount
        if trace:
            self.steps.append(f"{why}: +{amount:g} -> {self.fair_share:g}")


def divide(total: float, queues: Sequence[QueueShare], *, trace: bool = False, k_value: float = 0.0) -> float:
    """Set `fair_share` of each sibling queue; returns what is left undivided. `k_value`: KAI's kValue, how much
    past usage (QueueShare.usage) lowers the over-quota weights."""
    remaining = total
    for q in queues:
        amount = min(total if q.deserved == UNLIMITED else q.deserved, q.requestable)
        q.give(amount, "deserved", trace)
        remaining -= amount
    if remaining <= 1e-9:
        return 0.0
    return _divide_over_quota(remaining, queues, trace, k_value)


def _order_key(q: QueueShare) -> tuple[float, str]:
    return (q.creation if not math.isnan(q.creation) else math.inf, q.name)


def _divide_over_quota(total: float, queues: Sequence[QueueShare], trace: bool, k_value: float) -> float:
    by_priority: dict[int, list[QueueShare]] = {}
    for q in sorted(queues, key=_order_key):
        by_priority.setdefault(q.priority, []).append(q)
    remaining = total
    for prio in sorted(by_priority, reverse=True):
        if remaining <= 0:
            break
        remaining, remembered = _rounds(remaining, by_priority[prio], trace, k_value)
        remaining = _leftovers(remaining, by_priority[prio], remembered, trace)
    return remaining


def _rounds(total: float, group: list[QueueShare], trace: bool, k_value: float) -> tuple[float, dict[int, float]]:
    remembered: dict[int, float] = {}
    if len(group) == 1:  # KAI: a queue alone at its priority takes what is left, whatever its weight
        q = group[0]
        give = min(total, q.remaining_request)
        if give > 0:
            q.give(give, f"over-quota (only queue at priority {q.priority})", trace)
        return total - give, remembered
    historic = k_value > 0 and any(q.usage != 0 for q in group)
    round_no = 0
    while True:
        round_no += 1
        weights_total = sum(q.weight for q in group if q.remaining_request > 0)
        if weights_total == 0:
            break
        weights = {q.index: q.weight / weights_total for q in group if not q.satisfied}
        if historic:
            weights = {q.index: share_weight(weights[q.index], q.usage, k_value) for q in group
                       if q.index in weights}
        weight_sum = sum(weights.values())
        if weight_sum == 0:
            break
        amount_this_round = total
        another_round = False
        for q in group:
            if total == 0:
                break
            if q.satisfied or q.weight == 0:
                continue
            requested = q.remaining_request
            share = amount_this_round * weights[q.index] / weight_sum
            if requested <= share:
                give = requested
                remembered.pop(q.index, None)
            else:
                give = math.floor(share)
                if give < 0:
                    give = 0.0
                if share - give > 0:
                    remembered[q.index] = share - give
            if give == 0:
                continue
            why = f"over-quota round {round_no} (share {share:g}"
            q.give(give, why + (f", usage {q.usage:g})" if historic else ")"), trace)
            total -= give
            another_round = another_round or requested < share
        if not another_round or total == 0:
            break
    return total, remembered


def _leftovers(total: float, group: list[QueueShare], remembered: dict[int, float], trace: bool) -> float:
    by_index = {q.index: q for q in group}
    order = sorted(remembered.items(), key=lambda kv: (-kv[1], *_order_key(by_index[kv[0]])))
    for index, _fraction in order:
        if total == 0:
            break
        q = by_index[index]
        give = min(1.0, total, q.remaining_request)
        if give <= 0:
            continue
        q.give(give, "leftover unit (largest remainder)", trace)
        total -= give
    return total
