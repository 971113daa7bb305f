"""The queries behind tests/data/cronexpr_next.jsonl: KAI's documented and tested cron strings and one of each
syntax form, each at fixed instants (boundaries, month and year ends, leap days) and seeded random ones.
Usage: python scripts/cron-oracle/queries.py | scripts/cron-oracle/run > tests/data/cronexpr_next.jsonl"""

import json
import random
from datetime import UTC, datetime

EXPRS = [
    # KAI's tests and examples
    "0 * * * *", "0 0 * * *", "0 */6 * * *", "0 12 * * 1", "0 0 1 * *", "*/15 * * * *", "@weekly", "@monthly",
    "@daily", "@hourly", "@yearly", "@annually",
    # ranges, steps, lists, names
    "5-50/7 1-3,22 * * *", "30 9 * * mon-fri", "0 18 * * SAT,sun", "0 0 1 jan,jul *", "0 0 1 January *",
    "15 3/4 * * *", "0 0 */10 * *", "0 0 * */3 *", "0 8 1-7 * 1", "0 0 13 * 5", "0 0 * * 7", "0 0 * * 0-7/2",
    "? ? ? ? ?", "0 0 ? * 1", "0 0 1,* * 1", "59 23 31 12 *",
    # L, W, #
    "0 0 L * *", "0 0 LW * *", "0 0 15W * *", "0 0 1W * *", "0 0 31W * *", "0 0 * * 5L", "0 0 * * 1#2",
    "0 0 * * 6#5", "0 0 L,15 * *", "0 0 * * 0L,3#1",
    # leap days, years, seconds
    "0 0 29 2 *", "0 0 * * * 2027", "0 0 1 1 * 2026-2030/2", "30 0 0 * * * *", "*/20 */30 * * * * *",
    "0 0 0 1 1 * 2099", "0 0 * * * 1980",
    # errors
    "invalid", "", "61 * * * *", "* 24 * * *", "5-1 * * * *", "*/0 * * * *", "0 0 * * 8", "0 0 * * 1#6",
    "0 0 32 * *", "0 0 * 13 *", "0 0 * * * 2100", "@reboot", "a b c d e", "0 0 1-L * *",
]


def ts(*a: int) -> int:
    return int(datetime(*a, tzinfo=UTC).timestamp())


FIXED = [ts(2025, 1, 15, 14, 30), ts(2025, 1, 15, 14), ts(2025, 3, 31, 23), ts(2024, 2, 28, 23, 59, 59),
         ts(2024, 2, 29, 12), ts(2025, 12, 31, 23, 59, 59), ts(2026, 1, 1), ts(2026, 12, 2, 3, 29, 7),
         ts(2028, 2, 29), ts(2030, 6, 30, 23, 59)]
rng = random.Random(23)
for e in EXPRS:
    times = FIXED + [rng.randrange(ts(2024, 1, 1), ts(2031, 1, 1)) for _ in range(15)]
    print(json.dumps({"expr": e, "times": times}))
