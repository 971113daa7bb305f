"""The fast parse (kai_opt.api.trusted, cached quantities and timestamps, the paused GC) builds exactly what
pydantic's validation builds, and odd values still take the validated path with its errors."""

from __future__ import annotations

import functools
import gc
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kai_opt.api import Node, Pod, PodGroup, Queue
from kai_opt.api.meta import ObjectMeta, parse_time
from kai_opt.errors import InputError
from kai_opt.gcpause import gc_paused
from kai_opt.loaders import load_snapshot
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.units import to_internal
from models.generators import FAMILIES, NOW, write_json

EXAMPLES = Path(__file__).resolve().parents[1] / "models" / "examples"


def _assert_as_validated(m: BaseModel) -> None:
    """m and its nested models equal what validating the values m was given builds: same __dict__ (in order),
    fields_set, extras and private state."""
    again = type(m)(**{k: v for k, v in m.__dict__.items() if k in m.model_fields_set})
    assert _state(m) == _state(again), type(m).__name__
    assert _fields(m) == _fields(again)
    for v in m.__dict__.values():
        for item in v if isinstance(v, tuple) else (v,):
            if isinstance(item, BaseModel):
                _assert_as_validated(item)


def _cached(m: BaseModel) -> set[str]:
    """Names of m's cached properties (values computed from its fields on first use, kept in __dict__)."""
    return {k for k in dir(type(m)) if isinstance(getattr(type(m), k, None), functools.cached_property)}


def _fields(m: BaseModel) -> list[str]:
    return [k for k in m.__dict__ if k not in _cached(m)]


def _state(m: BaseModel) -> dict[str, Any]:
    state = dict(m.__getstate__())
    state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k not in _cached(m)}
    return state


def _all_models(snap: Snapshot) -> list[BaseModel]:
    return [*snap.nodes, *snap.pods, *snap.podgroups, *snap.queues, *snap.priority_classes, *snap.topologies]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generated_objects_parse_as_validated(family: str) -> None:
    snap = Snapshot.from_objects(FAMILIES[family](24, 1), now=NOW)
    assert snap.pods
    for m in _all_models(snap):
        _assert_as_validated(m)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse_as_validated(path: Path) -> None:
    for m in _all_models(load_snapshot(path)):
        _assert_as_validated(m)


def _pod(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"kai.scheduler/queue": "q"},
                     "annotations": {"pod-group-name": "g"}, "creationTimestamp": "2026-01-01T00:00:00Z",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "controller": True}]},
        "spec": {"schedulerName": "kai-opt", "priority": 7, "priorityClassName": "train", "nodeName": "n1",
                 "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"},
                                                            "limits": {"cpu": "1", "memory": "1Gi"}}},
                                {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 2}}}],
                 "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
                 "overhead": {"memory": "10Mi"},
                 "tolerations": [{"key": "k", "operator": "Exists"}],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                     "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}]}}},
                 "schedulingGates": [{"name": "wait"}]},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:01:00Z", "nominatedNodeName": "n2"},
    }
    for path, value in over.items():
        *head, last = path.split("__")
        d = obj
        for k in head:
            d = d[k]
        d[last] = value
    return obj


def test_full_pod_shape_parses_as_validated() -> None:
    pod = Pod.from_k8s(_pod())
    _assert_as_validated(pod)
    assert pod.requests == {"cpu": 4000, "memory": 2**30 + 10 * 2**20, "nvidia.com/gpu": 2000, "pods": 1}
    assert pod.meta.owner_references[0].controller and pod.priority == 7


@pytest.mark.parametrize(("over", "field", "value"), [
    ({"spec__priority": "5"}, "priority", 5),  # pydantic's lax conversion still applies
    ({"spec__priority": 5.0}, "priority", 5),
    ({"spec__priority": True}, "priority", 1),
])
def test_values_pydantic_converts_take_the_validated_path(over: dict[str, Any], field: str, value: Any) -> None:
    pod = Pod.from_k8s(_pod(**over))
    assert getattr(pod, field) == value and type(getattr(pod, field)) is type(value)


@pytest.mark.parametrize("over", [
    {"spec__nodeName": 5},
    {"spec__priority": "high"},
    {"spec__priorityClassName": ["x"]},
    {"status__nominatedNodeName": {"a": 1}},
    {"metadata__annotations": {"gpu-fraction": "0.5"}},  # with the whole GPUs of container b
])
def test_bad_values_still_give_one_line_errors(over: dict[str, Any]) -> None:
    with pytest.raises(InputError) as err:
        Pod.from_k8s(_pod(**over))
    assert "\n" not in str(err.value) and "Pod ns/p" in str(err.value)


def test_podgroup_and_meta_fall_back_to_validation() -> None:
    g = PodGroup.from_k8s({"metadata": {"name": "g", "namespace": "ns"}, "spec": {"queue": "q", "minMember": 2}})
    _assert_as_validated(g)
    with pytest.raises(InputError, match="Input should be a valid string"):
        PodGroup.from_k8s({"metadata": {"name": "g"}, "spec": {"queue": 5}})
    with pytest.raises(ValueError, match="valid string"):
        ObjectMeta.from_k8s("Pod", {"metadata": {"name": "p", "namespace": 3}}, namespaced=True)
    sub = PodGroup.from_k8s({"metadata": {"name": "g"}, "spec": {"subGroups": [{"name": "a"}, {"name": "b",
                                                                                               "parent": "a"}]}})
    _assert_as_validated(sub)


def test_node_and_queue_parse_as_validated() -> None:
    node = Node.from_k8s({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                          "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "2"}}})
    _assert_as_validated(node)
    _assert_as_validated(Queue.from_k8s({"metadata": {"name": "q"}, "spec": {"resources": {"gpu": {"quota": 2}}}}))


def test_cached_conversions_keep_their_errors() -> None:
    assert to_internal("cpu", "250m") == to_internal("cpu", "250m") == 250
    assert to_internal("memory", "1Ki") == 1024
    for _ in range(2):  # a failure is not cached as a value
        with pytest.raises(ValueError, match="invalid quantity"):
            to_internal("cpu", "lots")
        with pytest.raises(InputError, match="invalid timestamp"):
            parse_time("yesterday", obj="Pod p", field="status.startTime")
    assert parse_time("2026-01-01T00:00:00Z", obj="", field="") == NOW
    assert parse_time(" 2026-01-01T00:00:00 ", obj="", field="") == NOW


def test_gc_paused_nests_and_restores() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with gc_paused(freeze_above=10**9):
        keep = [{"a": [i]} for i in range(1000)]
    assert gc.get_freeze_count() == frozen and gc.isenabled() and keep


def test_json_file_loads_as_objects_do(tmp_path: Path) -> None:
    objs = FAMILIES["fractions"](16, 0)
    write_json(objs, tmp_path / "s.json")
    from_file = load_snapshot(tmp_path / "s.json", now=NOW)
    direct = Snapshot.from_objects([RawObject(o.kind, o.obj) for o in objs], now=NOW)
    assert from_file.pods == direct.pods and from_file.podgroups == direct.podgroups
    assert gc.isenabled()


def test_a_copy_with_other_metadata_computes_its_own_key() -> None:
    pod = Pod.from_k8s({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "ns"},
                        "spec": {"containers": []}})
    assert (pod.key, pod.namespace) == ("ns/a", "ns")  # cached now
    moved = pod.model_copy(update={"meta": pod.meta.model_copy(update={"name": "b", "namespace": "other"})})
    assert (moved.key, moved.namespace) == ("other/b", "other")
    assert pod.model_copy(update={"node_name": "n1"}).key == "ns/a"
    assert pod.group_key is None
    assert pod.model_copy(update={"podgroup": "pg"}).group_key == "ns/pg"
    group = PodGroup.from_k8s({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                               "metadata": {"name": "g"}, "spec": {"minMember": 1}})
    assert group.key == "default/g"
    renamed = group.model_copy(update={"meta": group.meta.model_copy(update={"name": "h"})})
    assert renamed.key == "default/h"
