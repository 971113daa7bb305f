"""The CP-SAT model's reclaimer-side rows (formulation/reclaim_rows.py) agree with the greedy's rule
(fairshare/reclaim.py, KAI's boundary rule) at its boundary: on KAI's case reclaim/009 the greedy plan made with
saturation multiplier 1 reclaims one GPU from department d2; the model built with multiplier m must accept that plan
exactly when the greedy's predicate allows the same reclaim with m, ties (refused by both) included."""

from __future__ import annotations

import numpy as np
import pytest
from builders import departments

from kai_opt.config import parse_config
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import reclaimable
from kai_opt.formulation.hint import add_greedy_hint, hint_violations
from kai_opt.formulation.model import build_model
from kai_opt.formulation.reclaim_rows import comparison
from kai_opt.formulation.solve import model_scope


def _config(mult: float):  # type: ignore[no-untyped-def]
    return parse_config({"engine": "cpsat", "reclaim_saturation_multiplier": mult,
                         "solver": {"deterministic": True, "time_budget_s": 5, "seed": 0}})


# d1 ends at 5 of 4 (1.25) once inf-0 is placed; d2 at (running - 1) of 4: allowed iff 1.25 m < (running - 1) / 4
# (with d2 at 7, d3 runs 5 so that no GPU is free)
CASES = [(8, 1.0, True), (8, 1.39, True), (8, 1.4, False), (8, 1.5, False),
         (7, 1.0, True), (7, 1.19, True), (7, 1.2, False), (7, 1.3, False)]


@pytest.mark.parametrize(("d2_running", "mult", "allowed"), CASES)
def test_model_accepts_the_reclaim_exactly_when_the_greedy_rule_does(d2_running: int, mult: float,
                                                                      allowed: bool) -> None:
    st = departments(d2_running, 4 if d2_running == 8 else 5)
    fs = compute_fair_share(st)
    greedy = greedy_plan(st, fs, _config(1.0))
    assert [st.pods[e.pod].name.split("-")[0] for e in greedy.evictions] == ["d2_p1"]
    one = st.pod_queue_request(np.array([st.pod_index["default/inf-0"]]), np.array([-1]))[0]
    ledger = QueueLedger.start(st, fs)
    rule = reclaimable(fs, ledger, st.q_index["d1_p1"], one, [(st.q_index["d2_p1"], one)], preemptible=False,
                       saturation_multiplier=mult)
    assert (rule is None) == allowed, rule
    config = _config(mult)
    sess, scope = model_scope(st, fs, config, greedy)
    built = build_model(sess, scope)
    add_greedy_hint(built, scope, greedy, sess)
    broken = hint_violations(built.model)
    assert (not broken) == allowed, broken
    assert [k for k, v in built.reclaim_rows.takes.items()] == [(0, st.q_index["d2"])]


def test_comparison_coefficients_stay_exact_when_they_fit_and_round_towards_allowing_otherwise() -> None:
    assert comparison(1.0, 4.0, 4.0, 1000.0, 10_000, 10_000) == (1, 1, -1)  # A_q < A_s (margin below one unit)
    row = comparison(1.2, 4.0, 4.0, 1000.0, 10_000, 10_000)  # the float 1.2 (a 52-bit fraction) rounded down
    assert row is not None and 1.2 - 1e-12 < row[0] / row[1] <= 1.2 and row[2] < -1
    f_sib, f_mine, bound = 5.5e12 + 7, 3.3e12 + 1, 2**46  # memory fair shares and amounts in bytes: rounded
    c = 1.3 * f_sib / f_mine
    row = comparison(1.3, f_sib, f_mine, 1.0, bound, bound)
    assert row is not None
    n, d, _rhs = row
    assert n / d <= c and n * bound + d * bound < 2**61 and (c - n / d) / c < 1e-4
    assert comparison(1.0, 1e15, 1.0, 1.0, 2**50, 2**50) is None  # beyond int64 whatever the rounding
