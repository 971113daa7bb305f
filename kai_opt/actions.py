"""The actions of a cycle as data, in the order a cycle runs them: the one list every other list derives from.

Each entry names an action (its config flag and cycle name), KAI's name for it (the behaviour cases' vocabulary),
the eviction reason it writes when it evicts, and the rules the checker holds those evictions to. The greedy
implementation of each action lives in kai_opt/heuristics/actions/ (one module per action) and is looked up by
this name. This module imports nothing of kai_opt, so the config, the plan and the checker read it without
depending on an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MinRuntime(StrEnum):
    """Which min-runtime protection shields an action's victims (queue preemptMinRuntime / reclaimMinRuntime)."""

    preempt = "preempt"
    reclaim = "reclaim"


class BeneficiaryQueue(StrEnum):
    """Where an eviction's beneficiary must be queued relative to its victim."""

    same = "same"
    other = "other"


@dataclass(frozen=True)
class EvictionRules:
    """An action's evictions: the reason they carry in a plan, and what the checker holds them to (it implements
    each rule itself)."""

    reason: str
    verb: str  # past participle in the checker's messages ("pod x preempted for ...")
    beneficiary: bool = True  # evicts for a podgroup placed in the same plan, only preemptible victims; False:
    # evicts for no one (a stale gang), and a gang it touches may be left below its minimum
    moved: bool = False  # every victim is re-placed in the same plan
    min_runtime: MinRuntime | None = None
    beneficiary_queue: BeneficiaryQueue | None = None
    lower_priority: bool = False  # victims of strictly lower priority than the beneficiary


@dataclass(frozen=True)
class ActionSpec:
    name: str  # cycle name and `actions.<name>` config flag
    kai_name: str  # KAI-Scheduler's action name (behaviour cases)
    description: str  # the config flag's meaning
    evictions: EvictionRules | None = None  # None: it does not evict
    modelled: bool = True  # the CP-SAT model decides it; else it runs on the model's decoded plan (a rule)

    @property
    def eviction_reason(self) -> str | None:
        return self.evictions.reason if self.evictions is not None else None


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("allocate", "allocate", "place pending work on free (or releasing) resources"),
    ActionSpec("consolidate", "consolidation", "move preemptible running pods so pending work fits (for a job that "
               "would leave its queue over its fair share, no pod of another queue below its own share moves)",
               EvictionRules("consolidate", "consolidated", moved=True)),
    ActionSpec("reclaim", "reclaim", "take resources back from queues above their fair share",
               EvictionRules("reclaim", "reclaimed", min_runtime=MinRuntime.reclaim,
                             beneficiary_queue=BeneficiaryQueue.other)),
    ActionSpec("preempt", "preempt", "evict lower-priority preemptible work of the same queue",
               EvictionRules("preempt", "preempted", min_runtime=MinRuntime.preempt,
                             beneficiary_queue=BeneficiaryQueue.same, lower_priority=True)),
    ActionSpec("stale_gang", "stalegangeviction", "evict running gangs that stayed below minMember",
               EvictionRules("stale-gang", "evicted as a stale gang", beneficiary=False), modelled=False),
)

ACTION_BY_NAME: dict[str, ActionSpec] = {a.name: a for a in ACTIONS}
ACTION_ORDER: tuple[str, ...] = tuple(a.name for a in ACTIONS)
# eviction reason -> the rules of the action that writes it
EVICTION_RULES: dict[str, EvictionRules] = {a.evictions.reason: a.evictions for a in ACTIONS if a.evictions}
EVICTION_REASONS: tuple[str, ...] = tuple(EVICTION_RULES)
KAI_ACTION_NAMES: dict[str, str] = {a.kai_name: a.name for a in ACTIONS}  # KAI's name -> ours
