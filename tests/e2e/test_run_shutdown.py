"""`kai-opt run` stops promptly on SIGTERM while its apiserver does not answer (a control-plane outage during a
rollout: connections are accepted but nothing comes back, so every request waits for its timeout): the status
writes still queued are dropped after their drain time instead of holding the process, and the exit code is 0 (a
stop, not a lost leadership)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .schedharness import (
    FAST_RUNTIME,
    NS,
    SchedulerProcess,
    create,
    namespace,
    node,
    pod,
    podgroup,
    pods,
    queue,
    wait_for,
)
from .testcluster import LocalCluster, find_testbin

pytestmark = [pytest.mark.e2e]

# the runner's own bounds: each status pool drains for 2 s (WorkPool.drain), the binder and watches stop with it;
# the rest is the interpreter's exit
STOP_WITHIN_S = 20.0


def test_sigterm_while_the_apiserver_answers_nothing_exits_promptly(tmp_path: Path) -> None:
    own = LocalCluster(find_testbin())  # its own apiserver: this test stops it
    own.start()
    try:
        own.install_crds()
        with own.api_client() as api:
            objs = [namespace(), queue("team"), *[node(f"n{i}", 8) for i in range(4)]]
            for g in range(6):
                objs.append(podgroup(f"g{g}", 2, "team"))
                objs += [pod(f"g{g}-{i}", gpus=1, group=f"g{g}") for i in range(2)]
            objs += [pod(f"big-{i}", gpus=8, queue_name="team") for i in range(4)]  # 2 of them stay pending
            create(api, objs)
            config = {"engine": "greedy", "schedule_period_s": 0.2,
                      "runtime": {**FAST_RUNTIME, "status_workers": 2}}
            sched = SchedulerProcess(own, tmp_path, config, identity="shutdown")
            try:
                wait_for("the gangs bound", lambda: sum(
                    1 for p in pods(api, NS).values() if p["spec"].get("nodeName")) >= 12, timeout=60)
                # more pending work right before the outage: the status pools have writes queued for it
                create(api, [pod(f"late-{i}", gpus=8, queue_name="team") for i in range(20)])
                time.sleep(0.5)
                apiserver = next(p for p in own.processes if p.name == "kube-apiserver")
                os.kill(apiserver.pid, signal.SIGSTOP)  # alive, accepting connections, answering nothing
                time.sleep(1.0)  # the runner's next writes hang
                assert sched.running(), sched.output()[-3000:]
                start = time.monotonic()
                code = sched.terminate(timeout=STOP_WITHIN_S + 30)
                took = time.monotonic() - start
            finally:
                sched.kill()
                if "apiserver" in locals():
                    os.kill(apiserver.pid, signal.SIGCONT)
            out = sched.output()
            assert code == 0, out[-3000:]
            assert took <= STOP_WITHIN_S, f"stopped after {took:.1f}s\n{out[-3000:]}"
            assert "SIGTERM: stopping" in out
            assert "Traceback" not in out, out[-3000:]
    finally:
        own.stop()
