"""Cron expressions of KAI's cron usage window (kai_opt.cron): KAI's own test values for the last reset,
supercronic cronexpr's answers recorded by scripts/cron-oracle (tests/data/cronexpr_next.jsonl), and properties
against brute-force stepping."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kai_opt.cron import CronError, CronExpr, parse

ORACLE = Path(__file__).parent / "data" / "cronexpr_next.jsonl"


def ts(*a: int) -> float:
    return datetime(*a, tzinfo=UTC).timestamp()


# -- KAI's TestGetLatestUsageResetTime_CronWindow values: the last occurrence strictly before now ----------------------
@pytest.mark.parametrize(("expr", "now", "reset"), [
    ("0 * * * *", ts(2025, 1, 15, 14, 30), ts(2025, 1, 15, 14)),
    ("0 * * * *", ts(2025, 1, 15, 14), ts(2025, 1, 15, 13)),  # at an occurrence: the one before
    ("0 0 * * *", ts(2025, 1, 15, 10, 30), ts(2025, 1, 15)),
    ("0 0 * * *", ts(2025, 1, 15, 23, 59, 59), ts(2025, 1, 15)),
    ("0 */6 * * *", ts(2025, 1, 15, 10), ts(2025, 1, 15, 6)),
    ("0 */6 * * *", ts(2025, 1, 15, 12), ts(2025, 1, 15, 6)),
    ("0 12 * * 1", ts(2025, 1, 15, 15), ts(2025, 1, 13, 12)),  # a Wednesday: Monday's noon
    ("0 0 1 * *", ts(2025, 3, 31, 23), ts(2025, 3, 1)),
    ("*/15 * * * *", ts(2025, 1, 15, 14, 37), ts(2025, 1, 15, 14, 30)),
    ("*/15 * * * *", ts(2025, 1, 15, 14, 45), ts(2025, 1, 15, 14, 30)),
])
def test_kais_reset_times(expr: str, now: float, reset: float) -> None:
    e = parse(expr)
    assert e.previous(now) == reset
    nxt = e.next(reset)
    assert nxt is not None and nxt >= now  # KAI's own check: the next occurrence after the reset is not before now


# -- supercronic cronexpr, recorded -----------------------------------------------------------------------------------
def _oracle() -> list[dict]:
    return [json.loads(line) for line in ORACLE.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", _oracle(), ids=lambda c: repr(c["expr"]))
def test_next_and_errors_equal_cronexpr(case: dict) -> None:
    if "error" in case:
        with pytest.raises(CronError):
            parse(case["expr"])
        return
    e = parse(case["expr"])
    assert [e.next(t) for t in case["times"]] == [None if n is None else float(n) for n in case["next"]]


def test_the_oracle_covers_every_syntax_form() -> None:
    exprs = {c["expr"] for c in _oracle() if "error" not in c}
    for form in ("L", "LW", "15W", "5L", "1#2", "@weekly", "mon-fri", "*/15", "3/4", "2026-2030/2", "30 0 0 * * * *"):
        assert any(form in e for e in exprs), form
    assert len([c for c in _oracle() if "error" in c]) >= 10


# -- errors ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("expr", "words"), [
    ("invalid", "1 fields"), ("61 * * * *", "minute field: 61"), ("0 0 30 2 *", "never fires"),
    ("0 0 0 * * * 2030 extra", "8 fields"), ("5-1 * * * *", "backwards"), ("@reboot", "unknown macro"),
    ("0 0 * * 1#0", "1-5"), ("0 0 1,,2 * *", "empty list entry"),
])
def test_bad_expressions_say_what_is_wrong(expr: str, words: str) -> None:
    with pytest.raises(CronError) as err:
        parse(expr)
    assert words in str(err.value) and "\n" not in str(err.value)


# -- properties against minute stepping -------------------------------------------------------------------------------
_FIELDS = st.tuples(
    st.sampled_from(["0", "*/15", "5,35", "10-20/5", "*"]),
    st.sampled_from(["*", "0", "*/6", "9-17", "23"]),
    st.sampled_from(["*", "1", "L", "15W", "1-7", "LW", "31"]),
    st.sampled_from(["*", "2", "jan,jul", "*/3"]),
    st.sampled_from(["*", "1", "mon-fri", "5L", "0#1", "sat,sun"]),
)


def _firing(fields: tuple[str, ...]) -> CronExpr:
    """The expression of these fields; an expression that never fires (31 in February) is not a case here."""
    try:
        return parse(" ".join(fields))
    except CronError as exc:
        assume("never fires" not in str(exc))
        raise


_NOW = st.integers(int(ts(2024, 1, 1)), int(ts(2030, 12, 31))).map(float)


@settings(max_examples=150, deadline=None)
@given(_FIELDS, _NOW)
def test_next_is_the_first_match_after_now(fields: tuple[str, ...], now: float) -> None:
    e = _firing(fields)
    nxt = e.next(now)
    assert nxt is not None and nxt > now and e.matches(nxt)
    # no occurrence skipped: step minute by minute (these expressions fire on minutes) up to a bounded horizon
    t = (now // 60 + 1) * 60
    horizon = min(nxt, now + 3 * 86400)
    while t < horizon:
        assert not e.matches(t), (fields, now, t, nxt)
        t += 60


@settings(max_examples=150, deadline=None)
@given(_FIELDS, _NOW)
def test_previous_is_the_last_match_before_now(fields: tuple[str, ...], now: float) -> None:
    e = _firing(fields)
    prev = e.previous(now)
    assert prev is not None and prev < now and e.matches(prev)
    nxt = e.next(prev)
    assert nxt is not None and nxt >= now  # nothing between the reset and now
    t = (now // 60) * 60 if now % 60 else now - 60
    floor = max(prev, now - 3 * 86400)
    while t > floor:
        assert not e.matches(t), (fields, now, t, prev)
        t -= 60


@settings(max_examples=100, deadline=None)
@given(_FIELDS, _NOW, st.floats(0.01, 0.99))
def test_fractional_now_rounds_the_way_kai_compares(fields: tuple[str, ...], now: float, frac: float) -> None:
    e = _firing(fields)
    assert e.next(now + frac) == e.next(now)
    assert e.previous(now + frac) in (e.previous(now), now)  # now itself counts once now has passed it


def test_previous_is_the_true_last_occurrence_where_kais_walk_falls_short() -> None:
    # KAI walks Next from three intervals back; ahead of New Year's burst of minutes that start is 23:57 on Dec 31,
    # no occurrence. The window starts at the last real one, a year before (docs/DESIGN-NOTES.md, "Cron windows").
    e = parse("* 0 1 1 *")
    assert e.previous(ts(2026, 12, 31, 23, 59, 30)) == ts(2026, 1, 1, 0, 59)
