"""The GPU reservation pod's container (`python -m kai_opt.reservation`, in kai-opt's image): reports the GPU the
device plugin gave this pod in the pod's own annotation `run.ai/reserve_for_gpu_index` (as KAI's reservation pod
does), then holds the GPU until the pod is deleted.

The GPU is read from `NVIDIA_VISIBLE_DEVICES`, which the NVIDIA device plugin sets to the allocated device's id
(a GPU UUID with its default `envvar` strategy). With the `volume-mounts` strategy the variable names a directory
(`/var/run/nvidia-container-devices`) whose entries are the ids. The pod is found from `POD_NAMESPACE` and
`POD_NAME` (downward API) and patched with the pod's service account (in-cluster config). An annotation already
present is left as it is (a restarted container keeps its report). Exit codes: 0 on SIGTERM/SIGINT, 1 when the GPU
or the pod cannot be found or the patch keeps failing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

RESERVED_GPU_ANNOTATION = "run.ai/reserve_for_gpu_index"
NOT_A_DEVICE = {"", "all", "none", "void"}


def visible_gpu(env: dict[str, str] | None = None) -> str:
    """The one GPU id the device plugin gave this container (ValueError when there is not exactly one)."""
    value = (env if env is not None else dict(os.environ)).get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value.startswith("/"):
        directory = Path(value)
        ids = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    else:
        ids = [v.strip() for v in value.split(",") if v.strip()]
    ids = [i for i in ids if i.lower() not in NOT_A_DEVICE]
    if len(ids) != 1:
        raise ValueError(f"expected one GPU in NVIDIA_VISIBLE_DEVICES, found {value!r}")
    return ids[0]


def report(api: Any, namespace: str, name: str, gpu: str, *, attempts: int = 10, delay_s: float = 1.0) -> bool:
    """Write the GPU id into the pod's annotation unless one is there; True when the pod carries a report."""
    from kai_opt.k8s.client import MERGE_PATCH, object_path, request

    path = object_path("v1", "pods", namespace, name)
    last: Exception | None = None
    for _ in range(attempts):
        try:
            pod = request(api, "GET", path)
            if ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVED_GPU_ANNOTATION):
                return True
            request(api, "PATCH", path, body={"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: gpu}}},
                    content_type=MERGE_PATCH)
            return True
        except Exception as exc:  # retried: the API server may be briefly unreachable at container start
            last = exc
            time.sleep(delay_s)
    print(f"kai-opt reservation: cannot annotate pod {namespace}/{name}: {last}", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    namespace, name = os.environ.get("POD_NAMESPACE", ""), os.environ.get("POD_NAME", "")
    if not namespace or not name:
        print("kai-opt reservation: POD_NAMESPACE and POD_NAME must be set (downward API)", file=sys.stderr)
        return 1
    try:
        gpu = visible_gpu()
    except (ValueError, OSError) as exc:
        print(f"kai-opt reservation: {exc}", file=sys.stderr)
        return 1
    from kai_opt.k8s.client import make_api_client

    api = make_api_client(in_cluster=True)
    if not report(api, namespace, name, gpu):
        return 1
    print(f"kai-opt reservation: {namespace}/{name} holds GPU {gpu}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(3600):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
