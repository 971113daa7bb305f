#!/usr/bin/env python3
"""DRA against nvidia.com/gpu on the same cluster: N nodes x 8 devices (3 attributes: productName, memory class,
numa), N pending single-pod groups asking 1..4 devices, each DRA claim with CEL selectors on the 3 attributes.
Prints the greedy cycle time of both, and the DRA selector evaluations per second of state building.

    PYTHONPATH=$PWD python scripts/bench_dra.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from builders import NOW, node, pod, podgroup, queue

from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.state import build_state

V = "resource.k8s.io/v1"
D = "gpu.example.com"
PRODUCTS = ("H100", "A100", "L40S")


def objects(n: int, dra: bool) -> list[RawObject]:
    objs = [queue("q", gpu=(8 * n, 1, -1))]
    if dra:
        sel = [{"cel": {"expression": f'device.driver == "{D}"'}}]
        objs.append(RawObject("DeviceClass", {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": D},
                                              "spec": {"selectors": sel}}))
    for i in range(n):
        prod = PRODUCTS[i % 3]
        objs.append(node(f"n{i}", gpus=0 if dra else 8, labels={"product": prod}))
        if dra:
            devs = [{"name": f"g{j}", "attributes": {"productName": {"string": prod}, "numa": {"int": j // 4},
                                                     "memClass": {"string": "80g" if prod != "L40S" else "48g"}}}
                    for j in range(8)]
            objs.append(RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice",
                                                    "metadata": {"name": f"n{i}"},
                                                    "spec": {"driver": D, "nodeName": f"n{i}", "devices": devs,
                                                             "pool": {"name": f"n{i}", "generation": 1}}}))
    for k in range(n):
        prod, count = PRODUCTS[k % 3], 1 + k % 4
        objs.append(podgroup(f"g{k}", "q"))
        if dra:
            expr = (f'device.attributes["{D}"].productName == "{prod}" && device.attributes["{D}"].numa >= 0 '
                    f'&& device.attributes["{D}"].memClass != "none"')
            spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": D, "count": count, "selectors": [{"cel": {"expression": expr}}]}}]}}
            objs.append(RawObject("ResourceClaimTemplate", {"apiVersion": V, "kind": "ResourceClaimTemplate",
                                                            "metadata": {"name": f"t{k}", "namespace": "default"},
                                                            "spec": {"spec": spec}}))
            objs.append(pod(f"p{k}", f"g{k}", resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": f"t{k}"}]))
        else:
            objs.append(pod(f"p{k}", f"g{k}", gpus=count, nodeSelector={"product": prod}))
    return objs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    n = ap.parse_args().nodes
    cfg = parse_config({"engine": "greedy"})
    for dra in (False, True):
        snap = Snapshot.from_objects(objects(n, dra), now=NOW)
        t0 = time.perf_counter()
        st = build_state(snap)
        t1 = time.perf_counter()
        plan, _ = run_cycle(st, cfg, engine=Engine.greedy)
        t2 = time.perf_counter()
        what = "DRA claims      " if dra else "nvidia.com/gpu  "
        line = f"{what} state {t1 - t0:6.2f} s  cycle {t2 - t1:6.2f} s  binds {len(plan.binds)}"
        if dra and st.dra is not None:
            sel = st.dra.selectors
            line += (f"  selector checks {sel.lookups} ({sel.lookups / (t1 - t0):,.0f}/s of state building), "
                     f"CEL runs {sel.evaluations}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
