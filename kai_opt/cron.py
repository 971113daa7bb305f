"""Cron expressions in the dialect of KAI-Scheduler's cron usage window (supercronic's cronexpr), evaluated in UTC.

A cron window resets at every occurrence of the expression; the usage window at `now` starts at the last
occurrence strictly before `now` (at an occurrence itself, the one before: KAI's rule). Own parser rather than a
library: cronexpr's field layout (six fields = a year field, not seconds) and its `L`/`W`/`#` rules differ from
the common Python ones (docs/DESIGN-NOTES.md, "Cron windows").

Syntax: 5 fields (minute hour day-of-month month day-of-week), 6 (+ year) or 7 (seconds first, year last); the
macros @yearly, @annually, @monthly, @weekly, @daily, @hourly. Per field: `*` or `?`, numbers, names (jan..dec,
sun..sat, full names too), ranges `a-b`, steps `*/n`, `a/n`, `a-b/n`, lists `x,y`. Day of month also takes `L`
(last day), `LW` (last weekday), `nW` (weekday nearest day n within the month); day of week 0-7 (0 and 7 are
Sunday; as in cronexpr 7 reads as 0 before a range applies, so 0-7 is Sunday only and 1-7 is an error), `nL` (last
such day of the month), `n#k` (k-th such day). When both day fields are restricted (neither
`*` nor `?`), a day matching either counts (cron's rule). Years 1970-2099.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

YEARS = (1970, 2099)  # cronexpr's year domain
_END = int(datetime(YEARS[1], 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@hourly": "0 * * * *"}
_MONTHS = {name: i + 1 for i, name in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                                 "nov", "dec"))}
_MONTHS.update({name: i + 1 for i, name in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                                    "august", "september", "october", "november", "december"))})
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_DAYS.update({name: i for i, name in enumerate(("sunday", "monday", "tuesday", "wednesday", "thursday", "friday",
                                                "saturday"))})


class CronError(ValueError):
    """A malformed cron expression; the message names the field and the bad part."""


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: tuple[tuple[str, int], ...] = ()
    top: int | None = None  # highest number accepted, when above hi: it wraps to lo (day of week 7 = 0)


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, tuple(_MONTHS.items()))
_DOW = _Field("day-of-week", 0, 6, tuple(_DAYS.items()), top=7)
_YEAR = _Field("year", *YEARS)


@dataclass(frozen=True)
class CronExpr:
    """A parsed expression. Times are unix seconds; occurrences fall on whole seconds."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    years: frozenset[int]
    dom: frozenset[int]  # plain days of month
    dom_last: bool = False  # L
    dom_last_weekday: bool = False  # LW
    dom_nearest_weekday: frozenset[int] = frozenset()  # nW
    dow: frozenset[int] = frozenset()  # 0 = Sunday
    dow_last: frozenset[int] = frozenset()  # nL
    dow_nth: frozenset[tuple[int, int]] = frozenset()  # n#k as (n, k)
    dom_restricted: bool = False
    dow_restricted: bool = False

    def next(self, after: float) -> float | None:
        """The first occurrence strictly after `after`, or None (none up to 2099)."""
        t = datetime.fromtimestamp(max(math.floor(after) + 1, 0), UTC)  # 0: 1970-01-01, the first year
        for y, mo in _months_from(t.year, t.month, +1):
            if y not in self.years or mo not in self.months:
                continue
            for d in self.days(y, mo):
                if (y, mo) == (t.year, t.month) and d < t.day:
                    continue
                floor = (t.hour, t.minute, t.second) if (y, mo, d) == (t.year, t.month, t.day) else (0, 0, 0)
                hms = _first_at_or_after(self.hours, self.minutes, self.seconds, floor)
                if hms is not None:
                    return datetime(y, mo, d, *hms, tzinfo=UTC).timestamp()
        return None

    def previous(self, before: float) -> float | None:
        """The last occurrence strictly before `before`, or None (none since 1970)."""
        end = min(math.ceil(before) - 1, _END)
        if end < 0:
            return None
        t = datetime.fromtimestamp(end, UTC)
        for y, mo in _months_from(t.year, t.month, -1):
            if y not in self.years or mo not in self.months:
                continue
            for d in reversed(self.days(y, mo)):
                if (y, mo) == (t.year, t.month) and d > t.day:
                    continue
                ceil = (t.hour, t.minute, t.second) if (y, mo, d) == (t.year, t.month, t.day) else (23, 59, 59)
                hms = _last_at_or_before(self.hours, self.minutes, self.seconds, ceil)
                if hms is not None:
                    return datetime(y, mo, d, *hms, tzinfo=UTC).timestamp()
        return None

    def matches(self, t: float) -> bool:
        """Whether `t` (a whole second) is an occurrence."""
        if t != math.floor(t):
            return False
        x = datetime.fromtimestamp(t, UTC)
        return (x.year in self.years and x.month in self.months and x.day in self.days(x.year, x.month)
                and x.hour in self.hours and x.minute in self.minutes and x.second in self.seconds)

    def days(self, year: int, month: int) -> tuple[int, ...]:
        """The days of this month the expression fires on (sorted)."""
        return _days(self, year, month)


@lru_cache(maxsize=4096)
def _days(e: CronExpr, year: int, month: int) -> tuple[int, ...]:
    first_weekday, last = calendar.monthrange(year, month)  # Monday = 0
    if not e.dom_restricted and not e.dow_restricted:
        return tuple(range(1, last + 1))
    out: set[int] = set()
    if e.dom_restricted:
        out.update(d for d in e.dom if d <= last)
        if e.dom_last:
            out.add(last)
        if e.dom_last_weekday:
            out.add(_nearest_weekday(year, month, last, last))
        out.update(_nearest_weekday(year, month, d, last) for d in e.dom_nearest_weekday if d <= last)
    if e.dow_restricted:
        sunday_based = (first_weekday + 1) % 7  # cron weekday of the 1st

        def first_of(wd: int) -> int:
            return 1 + (wd - sunday_based) % 7

        for wd in e.dow:
            out.update(range(first_of(wd), last + 1, 7))
        for wd, k in e.dow_nth:
            d = first_of(wd) + 7 * (k - 1)
            if d <= last:
                out.add(d)
        for wd in e.dow_last:
            d = first_of(wd)
            out.add(d + 7 * ((last - d) // 7))
    return tuple(sorted(out))


def _nearest_weekday(year: int, month: int, day: int, last: int) -> int:
    """The Monday-to-Friday day nearest `day` without leaving the month (cron's `W`)."""
    wd = calendar.weekday(year, month, day)  # Monday = 0
    if wd == 5:  # Saturday: the Friday before, or the Monday after on the 1st
        return day - 1 if day > 1 else day + 2
    if wd == 6:  # Sunday: the Monday after, or the Friday before on the last day
        return day + 1 if day < last else day - 2
    return day


def _months_from(year: int, month: int, step: int) -> Iterator[tuple[int, int]]:
    y, m = year, month
    while YEARS[0] <= y <= YEARS[1]:
        yield y, m
        m += step
        if m > 12:
            y, m = y + 1, 1
        elif m < 1:
            y, m = y - 1, 12


def _first_at_or_after(hours: tuple[int, ...], minutes: tuple[int, ...], seconds: tuple[int, ...],
                       floor: tuple[int, int, int]) -> tuple[int, int, int] | None:
    for h in hours:
        if h < floor[0]:
            continue
        for m in minutes:
            if (h, m) < floor[:2]:
                continue
            for s in seconds:
                if (h, m, s) >= floor:
                    return h, m, s
    return None


def _last_at_or_before(hours: tuple[int, ...], minutes: tuple[int, ...], seconds: tuple[int, ...],
                       ceil: tuple[int, int, int]) -> tuple[int, int, int] | None:
    for h in reversed(hours):
        if h > ceil[0]:
            continue
        for m in reversed(minutes):
            if (h, m) > ceil[:2]:
                continue
            for s in reversed(seconds):
                if (h, m, s) <= ceil:
                    return h, m, s
    return None


# -- parsing ----------------------------------------------------------------------------------------------------------
def parse(text: str) -> CronExpr:
    """The expression in `text`; raises CronError naming the bad field. An expression that never fires between
    1970 and 2099 (such as 0 0 30 2 *) is an error too: its window would never reset."""
    raw = text.strip()
    line = MACROS.get(raw.lower(), raw)
    if line.startswith("@"):
        raise CronError(f"unknown macro {raw!r} (want one of {', '.join(MACROS)})")
    fields = line.split()
    if len(fields) not in (5, 6, 7):
        raise CronError(f"{len(fields)} fields in {raw!r} (want 5: minute hour day-of-month month day-of-week, "
                        "6: and year, or 7: seconds first)")
    if len(fields) == 7:
        sec_f, fields = fields[0], fields[1:]
    else:
        sec_f = "0"
    year_f = fields[5] if len(fields) == 6 else "*"
    minute_f, hour_f, dom_f, month_f, dow_f = fields[:5]
    dom, dom_restricted, dom_last, dom_lw, dom_w = _parse_dom(dom_f)
    dow, dow_restricted, dow_last, dow_nth = _parse_dow(dow_f)
    expr = CronExpr(text=raw, seconds=tuple(sorted(_parse_field(sec_f, _SECOND)[0])),
                    minutes=tuple(sorted(_parse_field(minute_f, _MINUTE)[0])),
                    hours=tuple(sorted(_parse_field(hour_f, _HOUR)[0])),
                    months=frozenset(_parse_field(month_f, _MONTH)[0]),
                    years=frozenset(_parse_field(year_f, _YEAR)[0]),
                    dom=frozenset(dom), dom_last=dom_last, dom_last_weekday=dom_lw,
                    dom_nearest_weekday=frozenset(dom_w), dow=frozenset(dow), dow_last=frozenset(dow_last),
                    dow_nth=frozenset(dow_nth), dom_restricted=dom_restricted, dow_restricted=dow_restricted)
    if expr.next(-1) is None:
        raise CronError(f"{raw!r} never fires between {YEARS[0]} and {YEARS[1]}")
    return expr


def _value(s: str, f: _Field) -> int:
    names = dict(f.names)
    if s in names:
        return names[s]
    if not s.isdigit() or len(s) > max(2, len(str(f.hi))):
        raise CronError(f"{f.name} field: {s!r} is not a number{' or a name' if names else ''}")
    v = int(s)
    top = f.hi if f.top is None else f.top
    if not f.lo <= v <= top:
        raise CronError(f"{f.name} field: {v} is out of range {f.lo}-{top}")
    return f.lo if v > f.hi else v  # a wrapped value is the field's first before ranges apply: 0-7 is 0-0


def _step(s: str, f: _Field) -> int:
    if not s.isdigit() or not 1 <= int(s) <= f.hi:
        raise CronError(f"{f.name} field: step {s!r} must be 1-{f.hi}")
    return int(s)


def _entry(entry: str, f: _Field) -> tuple[set[int], bool]:
    """The values of one list entry and whether it was `*`/`?` (a wildcard)."""
    if entry in ("*", "?"):
        return set(range(f.lo, f.hi + 1)), True
    base, _, step_s = entry.partition("/")
    step = _step(step_s, f) if "/" in entry else 1
    if base == "*":
        lo, hi = f.lo, f.hi
    elif "-" in base:
        a, _, b = base.partition("-")
        lo, hi = _value(a, f), _value(b, f)
        if hi < lo:
            raise CronError(f"{f.name} field: range {base!r} runs backwards")
    else:
        lo = _value(base, f)
        hi = f.hi if "/" in entry else lo  # `a/n`: from a to the field's end
    return set(range(lo, hi + 1, step)), False


def _parse_field(text: str, f: _Field) -> tuple[set[int], bool]:
    """Values of a field and whether it is unrestricted (any entry a wildcard, as cronexpr)."""
    values: set[int] = set()
    wildcard = False
    for entry in _entries(text, f):
        v, w = _entry(entry, f)
        values |= v
        wildcard = wildcard or w
    return values, wildcard


def _entries(text: str, f: _Field) -> list[str]:
    entries = text.lower().split(",")
    if any(not e for e in entries):
        raise CronError(f"{f.name} field: empty list entry in {text!r}")
    return entries


def _parse_dom(text: str) -> tuple[set[int], bool, bool, bool, set[int]]:
    days: set[int] = set()
    last = last_weekday = wildcard = False
    nearest: set[int] = set()
    for entry in _entries(text, _DOM):
        if entry == "l":
            last = True
        elif entry == "lw":
            last_weekday = True
        elif entry.endswith("w") and entry[:-1].isdigit():
            nearest.add(_value(entry[:-1], _DOM))
        else:
            v, w = _entry(entry, _DOM)
            days |= v
            wildcard = wildcard or w
    return days, not wildcard, last, last_weekday, nearest


def _parse_dow(text: str) -> tuple[set[int], bool, set[int], set[tuple[int, int]]]:
    days: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()
    wildcard = False
    for entry in _entries(text, _DOW):
        if entry.endswith("l") and len(entry) > 1:
            last.add(_value(entry[:-1], _DOW))
        elif "#" in entry:
            day, _, k = entry.partition("#")
            if k not in ("1", "2", "3", "4", "5"):
                raise CronError(f"day-of-week field: {entry!r}: the week after # must be 1-5")
            nth.add((_value(day, _DOW), int(k)))
        else:
            v, w = _entry(entry, _DOW)
            days |= v
            wildcard = wildcard or w
    return days, not wildcard, last, nth
