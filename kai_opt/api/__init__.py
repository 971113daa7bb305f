"""Typed, normalised forms of the API objects kai-opt reads (pydantic v2).

Each kind has a model with kai-opt's internal units and a `from_k8s(obj)` that converts a Kubernetes object (as
`kubectl get -o json` writes it) and raises `InputError` naming the object and field on bad input.
"""

from kai_opt.api.node import Node, Taint
from kai_opt.api.pod import Pod, PodPhase
from kai_opt.api.podgroup import PodGroup, SubGroup, TopologyConstraint
from kai_opt.api.priorityclass import DEFAULT_PRIORITY_CLASSES, PriorityClass
from kai_opt.api.queue import Queue, QueueResource
from kai_opt.api.topology import Topology

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Node",
    "Pod",
    "PodGroup",
    "PodPhase",
    "PriorityClass",
    "Queue",
    "QueueResource",
    "SubGroup",
    "Taint",
    "Topology",
    "TopologyConstraint",
]
