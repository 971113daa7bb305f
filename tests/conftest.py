import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def fork_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CP-SAT engine forks the second hint at the cycle start and its worker once allocate ran (when the plan
    may be beatable) whatever the cycle's size (engine.FORK_EARLY_WORK, engine.FORK_AT_START_WORK): for tests of that
    machinery on clusters small enough to skip it otherwise."""
    from kai_opt import engine

    monkeypatch.setattr(engine, "FORK_EARLY_WORK", 0)
    monkeypatch.setattr(engine, "FORK_AT_START_WORK", 0)
