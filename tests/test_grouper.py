"""Pod grouper: the PodGroup each kind of owner gets (names, minMember, queue, priority class), deferral of pods
whose owner is not known yet, user-chosen groups, and the idempotent create/patch of `sync_podgroups`."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from kai_opt.api.pod import PODGROUP_ANNOTATION
from kai_opt.k8s import grouper
from kai_opt.k8s.grouper import OWNER_KINDS, annotate_pods, desired_podgroups, group_pods, sync_podgroups

NS = "team"


def obj(api_version: str, kind: str, name: str, *, uid: str | None = None, owner: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None, namespace: str = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                    "controller": True}]
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec or {}}


def pod(name: str, owner: dict[str, Any] | None = None, *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return obj("v1", "Pod", name, owner=owner, labels=labels, annotations=annotations,
               spec={"schedulerName": "kai-opt", "containers": [{"name": "c"}], **(spec or {})})


class Owners:
    """`get_owner` over a fixed set of objects; records what was asked."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        self.asked: list[tuple[str, str, str, str]] = []

    def __call__(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append((api_version, kind, namespace, name))
        return self.objects.get((kind, namespace, name))


def by_name(pgs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {pg["metadata"]["name"]: pg for pg in pgs}


# -- kinds -------------------------------------------------------------------------------------------------------------
def test_bare_pod_gets_its_own_group_of_one_owned_by_the_pod() -> None:
    p = pod("solo")
    [pg] = desired_podgroups([p], Owners(), "default-queue")
    assert pg["apiVersion"] == "scheduling.run.ai/v2alpha2" and pg["kind"] == "PodGroup"
    assert pg["metadata"]["name"] == "pg-solo-uid-solo"
    assert pg["metadata"]["namespace"] == NS
    assert pg["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "solo",
                                                  "uid": "uid-solo"}]
    assert pg["spec"] == {"minMember": 1, "queue": "default-queue", "priorityClassName": "train"}


def test_batch_job_gets_one_group_per_pod_named_after_pod_and_job_uid() -> None:
    job = obj("batch/v1", "Job", "etl", labels={"kai.scheduler/queue": "team-a"}, spec={"parallelism": 3})
    pods = [pod(f"etl-{i}", job) for i in range(3)]
    grouping = group_pods(pods, Owners(job), "default-queue")
    pgs = by_name(grouping.podgroups)
    assert set(pgs) == {f"pg-etl-{i}-uid-etl" for i in range(3)}
    for pg in pgs.values():
        assert pg["spec"] == {"minMember": 1, "queue": "team-a", "priorityClassName": "train"}
        assert pg["metadata"]["ownerReferences"][0]["kind"] == "Job"
        assert pg["metadata"]["labels"] == {"kai.scheduler/queue": "team-a"}
    assert grouping.assignments == {f"{NS}/etl-{i}": f"pg-etl-{i}-uid-etl" for i in range(3)}


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "ReplicaSet"])
def test_serving_kinds_get_one_inference_group_per_pod(kind: str) -> None:
    top = obj("apps/v1", kind, "web")
    parent = obj("apps/v1", "ReplicaSet", "web-7d9", owner=top) if kind == "Deployment" else top
    pods = [pod("web-a", parent), pod("web-b", parent)]
    pgs = by_name(desired_podgroups(pods, Owners(top, parent), "q"))
    assert set(pgs) == {"pg-web-a-uid-web-a", "pg-web-b-uid-web-b"}
    for name, pg in pgs.items():
        assert pg["spec"] == {"minMember": 1, "queue": "q", "priorityClassName": "inference"}
        assert pg["metadata"]["ownerReferences"][0]["kind"] == "Pod"
        assert pg["metadata"]["ownerReferences"][0]["name"] == name.split("-uid-")[0].removeprefix("pg-")


def _kubeflow(kind: str, specs: dict[str, int], **extra: Any) -> dict[str, Any]:
    field = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}[kind]
    version = "kubeflow.org/v2beta1" if kind == "MPIJob" else "kubeflow.org/v1"
    return obj(version, kind, "train", spec={field: {k: {"replicas": n} for k, n in specs.items()}, **extra})


@pytest.mark.parametrize(("kind", "specs"), [
    ("PyTorchJob", {"Master": 1, "Worker": 3}),
    ("TFJob", {"Chief": 1, "PS": 2, "Worker": 4}),
    ("MPIJob", {"Launcher": 1, "Worker": 8}),
])
def test_kubeflow_jobs_gang_all_replicas_in_one_group(kind: str, specs: dict[str, int]) -> None:
    job = _kubeflow(kind, specs)
    pods = [pod(f"train-{i}", job) for i in range(3)]
    grouping = group_pods(pods, Owners(job), "q")
    [pg] = grouping.podgroups
    assert pg["metadata"]["name"] == "pg-train-uid-train"
    assert pg["spec"]["minMember"] == sum(specs.values())
    assert pg["spec"]["priorityClassName"] == "train"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == kind
    assert set(grouping.assignments.values()) == {"pg-train-uid-train"}


def test_kubeflow_min_available_wins_then_elastic_min_replicas() -> None:
    job = _kubeflow("PyTorchJob", {"Master": 1, "Worker": 7}, runPolicy={"schedulingPolicy": {"minAvailable": 5}},
                    elasticPolicy={"minReplicas": 2})
    [pg] = desired_podgroups([pod("p", job)], Owners(job), "q")
    assert pg["spec"]["minMember"] == 5
    elastic = _kubeflow("PyTorchJob", {"Worker": 7}, elasticPolicy={"minReplicas": 2})
    [pg] = desired_podgroups([pod("p", elastic)], Owners(elastic), "q")
    assert pg["spec"]["minMember"] == 2


def test_kubeflow_replicas_default_to_one_and_an_empty_spec_is_an_error() -> None:
    job = obj("kubeflow.org/v1", "PyTorchJob", "t", spec={"pytorchReplicaSpecs": {"Master": {}, "Worker": {
        "replicas": 2}}})
    [pg] = desired_podgroups([pod("p", job)], Owners(job), "q")
    assert pg["spec"]["minMember"] == 3
    bad = obj("kubeflow.org/v1", "TFJob", "bad", spec={})
    grouping = group_pods([pod("p", bad)], Owners(bad), "q")
    assert grouping.podgroups == [] and grouping.assignments == {}
    assert grouping.errors == ["pod team/p: TFJob team/bad: spec.tfReplicaSpecs is missing or empty"]


def test_mpi_wait_for_workers_leaves_the_launcher_out_until_it_exists() -> None:
    job = _kubeflow("MPIJob", {"Launcher": 1, "Worker": 4}, launcherCreationPolicy="WaitForWorkersReady")
    workers = [pod(f"train-worker-{i}", job, labels={"training.kubeflow.org/job-name": "train",
                                                     "training.kubeflow.org/job-role": "worker"}) for i in range(4)]
    [pg] = desired_podgroups(workers, Owners(job), "q")
    assert pg["spec"]["minMember"] == 4
    launcher = pod("train-launcher", job, labels={"training.kubeflow.org/job-name": "train",
                                                  "training.kubeflow.org/job-role": "launcher"})
    [pg] = desired_podgroups([*workers, launcher], Owners(job), "q")
    assert pg["spec"]["minMember"] == 5


def _jobset(order: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicatedJobs": [
        {"name": "coordinator", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
        {"name": "worker", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 3}}},
    ]}
    if order:
        spec["startupPolicy"] = {"startupPolicyOrder": order}
    return obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", spec=spec)


@pytest.mark.parametrize("order", [None, "AnyOrder"])
def test_jobset_any_order_is_one_gang_of_every_replicated_job(order: str | None) -> None:
    js = _jobset(order)
    coord = obj("batch/v1", "Job", "js-coordinator-0", owner=js)
    worker = obj("batch/v1", "Job", "js-worker-0", owner=js)
    pods = [pod("c0", coord, labels={"jobset.sigs.k8s.io/replicatedjob-name": "coordinator"}),
            pod("w0", worker, labels={"jobset.sigs.k8s.io/replicatedjob-name": "worker"})]
    grouping = group_pods(pods, Owners(js, coord, worker), "q")
    [pg] = grouping.podgroups
    assert pg["metadata"]["name"] == "pg-js-uid-js"
    assert pg["spec"]["minMember"] == 1 + 2 * 3  # completions 3 < parallelism 4
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    assert len(grouping.assignments) == 2


def test_jobset_in_order_is_one_gang_per_replicated_job() -> None:
    js = _jobset("InOrder")
    coord = obj("batch/v1", "Job", "js-coordinator-0", owner=js)
    worker = obj("batch/v1", "Job", "js-worker-0", owner=js)
    pods = [pod("c0", coord, labels={"jobset.sigs.k8s.io/replicatedjob-name": "coordinator"}),
            pod("w0", worker, labels={"jobset.sigs.k8s.io/replicatedjob-name": "worker"}),
            pod("w1", worker, labels={"jobset.sigs.k8s.io/replicatedjob-name": "worker"})]
    pgs = by_name(desired_podgroups(pods, Owners(js, coord, worker), "q"))
    assert {n: pg["spec"]["minMember"] for n, pg in pgs.items()} == {
        "pg-js-uid-js-coordinator": 1, "pg-js-uid-js-worker": 6}


def _lws(policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": 2, "leaderWorkerTemplate": {"size": 4}}
    if policy:
        spec["startupPolicy"] = policy
    return obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llm", spec=spec)


def _lws_pods(lws: dict[str, Any], group: int, *, workers: bool = True,
              leader_node: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pods, owners): leader pod from the leader StatefulSet; workers from a StatefulSet owned by the leader."""
    leader_sts = obj("apps/v1", "StatefulSet", "llm", owner=lws)
    labels = {"leaderworkerset.sigs.k8s.io/name": "llm", "leaderworkerset.sigs.k8s.io/group-index": str(group)}
    leader = pod(f"llm-{group}", leader_sts, labels={**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"},
                 annotations={"leaderworkerset.sigs.k8s.io/size": "4"},
                 spec={"nodeName": leader_node} if leader_node else None)
    out, owners = [leader], [leader_sts, leader]
    if workers:
        worker_sts = obj("apps/v1", "StatefulSet", f"llm-{group}", owner=leader)
        owners.append(worker_sts)
        out += [pod(f"llm-{group}-{w}", worker_sts, labels={**labels, "leaderworkerset.sigs.k8s.io/worker-index":
                                                           str(w)}) for w in range(1, 4)]
    return out, owners


def test_leaderworkerset_is_one_gang_of_group_size_per_group() -> None:
    lws = _lws()
    pods0, owners0 = _lws_pods(lws, 0)
    pods1, owners1 = _lws_pods(lws, 1)
    grouping = group_pods(pods0 + pods1, Owners(lws, *owners0, *owners1), "q")
    pgs = by_name(grouping.podgroups)
    assert {n: pg["spec"]["minMember"] for n, pg in pgs.items()} == {
        "pg-llm-uid-llm-group-0": 4, "pg-llm-uid-llm-group-1": 4}
    assert all(pg["metadata"]["ownerReferences"][0]["kind"] == "LeaderWorkerSet" for pg in pgs.values())
    assert grouping.assignments[f"{NS}/llm-1-3"] == "pg-llm-uid-llm-group-1"
    assert grouping.assignments[f"{NS}/llm-1"] == "pg-llm-uid-llm-group-1"


def test_leaderworkerset_leader_ready_starts_with_the_leader_alone() -> None:
    lws = _lws("LeaderReady")
    pods, owners = _lws_pods(lws, 0, workers=False)
    [pg] = desired_podgroups(pods, Owners(lws, *owners), "q")
    assert pg["spec"]["minMember"] == 1
    pods, owners = _lws_pods(lws, 0, leader_node="n1")
    [pg] = desired_podgroups(pods, Owners(lws, *owners), "q")
    assert pg["spec"]["minMember"] == 4


def test_raycluster_head_plus_worker_minimums_times_hosts() -> None:
    rc = obj("ray.io/v1", "RayCluster", "ray", labels={"ray.io/priority-class-name": "build"}, spec={
        "headGroupSpec": {}, "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 4, "minReplicas": 2, "numOfHosts": 2},
            {"groupName": "cpu", "replicas": 3},  # no minimum: the desired replicas
            {"groupName": "off", "replicas": 5, "minReplicas": 5, "suspended": True}]})
    [pg] = desired_podgroups([pod("ray-head", rc)], Owners(rc), "q")
    assert pg["metadata"]["name"] == "pg-ray-uid-ray"
    assert pg["spec"]["minMember"] == 1 + 2 * 2 + 3
    assert pg["spec"]["priorityClassName"] == "build"


# -- queue, priority, topology ---------------------------------------------------------------------------------------
def test_queue_from_owner_label_then_pod_label_then_default() -> None:
    job = obj("kubeflow.org/v1", "PyTorchJob", "t", labels={"kai.scheduler/queue": "owner-q"},
              spec={"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}})
    [pg] = desired_podgroups([pod("p", job, labels={"kai.scheduler/queue": "pod-q"})], Owners(job), "dq")
    assert pg["spec"]["queue"] == "owner-q"
    [pg] = desired_podgroups([pod("p", labels={"kai.scheduler/queue": "pod-q"})], Owners(), "dq")
    assert pg["spec"]["queue"] == "pod-q"
    [pg] = desired_podgroups([pod("p", labels={"runai/queue": "legacy-q"})], Owners(), "dq")
    assert pg["spec"]["queue"] == "legacy-q"
    [pg] = desired_podgroups([pod("p")], Owners(), "dq")
    assert pg["spec"]["queue"] == "dq"


def test_priority_from_pod_spec_then_owner_label_then_pod_label_then_kind_default() -> None:
    dep = obj("apps/v1", "Deployment", "d", labels={"priorityClassName": "build"})
    assert desired_podgroups([pod("p", dep, spec={"priorityClassName": "train"})], Owners(dep),
                             "q")[0]["spec"]["priorityClassName"] == "train"
    assert desired_podgroups([pod("p", dep, labels={"priorityClassName": "x"})], Owners(dep),
                             "q")[0]["spec"]["priorityClassName"] == "build"
    assert desired_podgroups([pod("p", labels={"priorityClassName": "build-preemptible"})], Owners(),
                             "q")[0]["spec"]["priorityClassName"] == "build-preemptible"
    plain = obj("apps/v1", "StatefulSet", "s")
    assert desired_podgroups([pod("p", plain)], Owners(plain), "q")[0]["spec"]["priorityClassName"] == "inference"


def test_topology_annotations_of_the_owner_become_the_constraint() -> None:
    job = obj("kubeflow.org/v1", "PyTorchJob", "t", annotations={
        "kai.scheduler/topology": "dc", "kai.scheduler/topology-required-placement": "rack"},
        spec={"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}})
    [pg] = desired_podgroups([pod("p", job)], Owners(job), "q")
    assert pg["spec"]["topologyConstraint"] == {"topology": "dc", "requiredTopologyLevel": "rack"}


# -- which pods are grouped ------------------------------------------------------------------------------------------
def test_a_pod_whose_owner_is_not_known_yet_is_deferred_not_grouped_alone() -> None:
    job = _kubeflow("PyTorchJob", {"Worker": 4})
    grouping = group_pods([pod("p", job)], Owners(), "q")
    assert grouping.podgroups == [] and grouping.assignments == {}
    assert grouping.deferred == [f"{NS}/p"]


def test_a_walk_stops_below_an_owner_of_a_kind_that_is_not_watched() -> None:
    workflow = obj("argoproj.io/v1alpha1", "Workflow", "wf")
    job = obj("batch/v1", "Job", "step", owner=workflow)
    owners = Owners(job)
    [pg] = desired_podgroups([pod("p", job)], owners, "q")
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert all(kind != "Workflow" for _, kind, _, _ in owners.asked)
    bare = pod("q", workflow)  # owned directly by an unwatched kind: grouped as a bare pod
    [pg] = desired_podgroups([bare], owners, "q")
    assert pg["metadata"]["name"] == "pg-q-uid-q"


def test_user_named_groups_and_finished_pods_are_left_alone_our_own_annotation_is_regrouped() -> None:
    job = _kubeflow("PyTorchJob", {"Worker": 2})
    user = pod("u", job, annotations={PODGROUP_ANNOTATION: "my-group"})
    done = pod("d", job)
    done["status"] = {"phase": "Succeeded"}
    ours = pod("o", job, annotations={PODGROUP_ANNOTATION: "pg-train-uid-train"})
    grouping = group_pods([user, done, ours], Owners(job), "q")
    assert grouping.assignments == {f"{NS}/o": "pg-train-uid-train"}
    assert [pg["metadata"]["name"] for pg in grouping.podgroups] == ["pg-train-uid-train"]


def test_a_changed_owner_uid_defers_the_pod_of_the_old_owner() -> None:
    job = obj("batch/v1", "Job", "j", uid="old")
    p = pod("p", job)
    newer = obj("batch/v1", "Job", "j", uid="new")
    assert group_pods([p], Owners(newer), "q").deferred == [f"{NS}/p"]


def test_long_names_are_shortened_to_a_valid_name_keeping_the_uid() -> None:
    p = pod("x" * 250)
    p["metadata"]["uid"] = "0b7c5a7e-2f4d-4a7e-9c3b-8d1e6f0a9b21"
    [pg] = desired_podgroups([p], Owners(), "q")
    name = pg["metadata"]["name"]
    assert len(name) <= 253 and name.startswith("pg-xxx")
    assert name.endswith(p["metadata"]["uid"])


def test_owner_kinds_list_watchable_resources() -> None:
    kinds = {(v, k) for v, k, _ in OWNER_KINDS}
    assert ("batch/v1", "Job") in kinds and ("kubeflow.org/v1", "PyTorchJob") in kinds
    assert ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") in kinds and ("ray.io/v1", "RayCluster") in kinds
    assert all(plural == plural.lower() and plural.endswith("s") for _, _, plural in OWNER_KINDS)


# -- syncing ---------------------------------------------------------------------------------------------------------
class FakeCustomObjects:
    calls: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, api: Any) -> None:
        pass

    def create_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, body: Any) -> None:
        assert (group, version, plural) == ("scheduling.run.ai", "v2alpha2", "podgroups")
        self.calls.append(("create", (ns, body["metadata"]["name"])))

    def patch_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str,
                                       body: Any) -> None:
        self.calls.append(("patch", (ns, name, body)))


class FakeCore:
    calls: ClassVar[list[tuple[str, str, Any]]] = []

    def __init__(self, api: Any) -> None:
        pass

    def patch_namespaced_pod(self, name: str, ns: str, body: Any) -> None:
        self.calls.append((ns, name, body))


def test_sync_creates_missing_patches_changed_and_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouper.client, "CustomObjectsApi", FakeCustomObjects)
    FakeCustomObjects.calls = []
    job = _kubeflow("PyTorchJob", {"Worker": 4})
    desired = desired_podgroups([pod("p", job), pod("solo")], Owners(job), "q")
    sync_podgroups(None, desired, [], workers=1)  # type: ignore[arg-type]
    assert sorted(FakeCustomObjects.calls) == [("create", (NS, "pg-solo-uid-solo")),
                                               ("create", (NS, "pg-train-uid-train"))]
    FakeCustomObjects.calls = []
    sync_podgroups(None, desired, desired, workers=1)  # type: ignore[arg-type]
    assert FakeCustomObjects.calls == []
    stale = [{**pg, "spec": {**pg["spec"], "minMember": 2, "queue": "old"}} for pg in desired]
    sync_podgroups(None, desired, stale, workers=4)  # type: ignore[arg-type]
    assert sorted(FakeCustomObjects.calls, key=str) == sorted([
        ("patch", (NS, "pg-solo-uid-solo", {"spec": {"minMember": 1, "queue": "q"}})),
        ("patch", (NS, "pg-train-uid-train", {"spec": {"minMember": 4, "queue": "q"}}))], key=str)


def test_annotate_pods_patches_only_pods_missing_their_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouper.client, "CoreV1Api", FakeCore)
    FakeCore.calls = []
    done = pod("a", annotations={PODGROUP_ANNOTATION: "pg-a-uid-a"})
    todo = pod("b")
    grouping = group_pods([done, todo], Owners(), "q")
    assert annotate_pods(None, [done, todo], grouping.assignments, workers=1) == 1  # type: ignore[arg-type]
    assert FakeCore.calls == [(NS, "b", {"metadata": {"annotations": {PODGROUP_ANNOTATION: "pg-b-uid-b"}}})]


# -- the memo across cycles --------------------------------------------------------------------------------------------
def _as_tuple(g: grouper.Grouping) -> tuple[Any, ...]:
    return (sorted(g.assignments.items()), sorted(g.deferred), sorted(g.errors),
            sorted((pg["metadata"]["name"], repr(pg)) for pg in g.podgroups))


def test_a_memo_kept_across_calls_gives_what_a_fresh_grouping_gives_as_objects_change() -> None:
    """Every call with the memo equals one without it, while owners and pods are replaced by changed copies (the
    watch replaces an object, never edits it), pods finish, appear and lose their owner."""
    memo = grouper.GroupMemo()
    job = _kubeflow("PyTorchJob", {"Master": 1, "Worker": 2})
    bjob = obj("batch/v1", "Job", "etl", labels={"kai.scheduler/queue": "team-a"})
    pods = [pod("pt-0", job), pod("pt-1", job), pod("etl-0", bjob), pod("solo"),
            pod("mine", annotations={PODGROUP_ANNOTATION: "my-own"}), pod("orphan", bjob)]
    owners = Owners(job, bjob)

    def check() -> None:
        assert _as_tuple(group_pods(pods, owners, "dq", memo)) == _as_tuple(group_pods(pods, owners, "dq"))

    check()
    check()  # everything from the memo
    # the owner changes: minMember and queue follow
    job2 = {**job, "metadata": {**job["metadata"], "labels": {"kai.scheduler/queue": "q2"}},
            "spec": {**job["spec"], "runPolicy": {"schedulingPolicy": {"minAvailable": 2}}}}
    owners.objects[("PyTorchJob", NS, job["metadata"]["name"])] = job2
    check()
    first = by_name(group_pods(pods, owners, "dq", memo).podgroups)
    assert any(pg["spec"]["queue"] == "q2" and pg["spec"]["minMember"] == 2 for pg in first.values())
    # a pod finishes, a pod's annotation changes, a new pod arrives, an owner goes away (deferred)
    pods[3] = {**pods[3], "status": {"phase": "Succeeded"}}
    pods[4] = {**pods[4], "metadata": {**pods[4]["metadata"], "annotations": {}}}
    pods.append(pod("pt-2", job))
    check()
    del owners.objects[("Job", NS, "etl")]
    check()
    assert {"team/etl-0", "team/orphan"} <= set(group_pods(pods, owners, "dq", memo).deferred)
