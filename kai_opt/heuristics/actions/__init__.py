"""The greedy actions, one module each (KAI's pkg/scheduler/actions/ shape), and their registry in cycle order.

The order, names, config flags and eviction reasons come from kai_opt.actions.ACTIONS; this package only adds
each action's implementation, found by its name (a declared action without one, or an implementation of an
undeclared action, fails at import).
"""

from __future__ import annotations

from kai_opt.actions import ACTIONS
from kai_opt.config import Config
from kai_opt.heuristics.actions import allocate, consolidate, preempt, reclaim, stale_gang
from kai_opt.heuristics.actions.base import Action
from kai_opt.heuristics.actions.context import ActionContext

Actions = ActionContext  # the name kai_opt.formulation imports

_IMPLEMENTATIONS: dict[str, Action] = {m.ACTION.name: m.ACTION for m in (allocate, consolidate, reclaim, preempt,
                                                                         stale_gang)}
if set(_IMPLEMENTATIONS) != {a.name for a in ACTIONS}:
    raise ImportError(f"greedy actions {sorted(_IMPLEMENTATIONS)} do not match kai_opt.actions.ACTIONS")
REGISTRY: tuple[Action, ...] = tuple(_IMPLEMENTATIONS[a.name] for a in ACTIONS)  # in cycle order


def enabled_actions(config: Config, actions: tuple[str, ...] | None) -> tuple[str, ...]:
    """The actions a cycle runs: `actions` when given, else those whose flag (`actions.<name>`) is on."""
    return actions if actions is not None else tuple(a.name for a in REGISTRY if getattr(config.actions, a.flag))


def run_outside_model(ctx: ActionContext, config: Config, actions: tuple[str, ...] | None) -> None:
    """After a CP-SAT decode: the enabled actions the model does not decide (rules, not optimisations)."""
    enabled = enabled_actions(config, actions)
    for a in REGISTRY:
        if not a.spec.modelled and a.name in enabled:
            a.run(ctx)


__all__ = ["REGISTRY", "Action", "ActionContext", "Actions", "enabled_actions", "run_outside_model"]
