"""Large resumes (issue #16 item 2): under the shipped settings (no SLURMK8S_BUDGET, 8 calls in
parallel, the rendered slurm.conf) a resume of any size the API can serve completes, failures are
reported as they come, and calls still running at Slurm's deadline are abandoned without counting
as pool failures. Against a slow fake API that serves one create at a time on a virtual clock (the
same scenario in real time, 200 creates of 0.12 s, failed on the previous code: 36 nodes abandoned
at the fixed 20 s budget, set DOWN and counted)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from factories import node
from fakes.kube import FakePodApi
from fakes.ledger import MemoryLedger
from fakes.slurm import FakeSlurm

from provisioner.config import parse_spec
from provisioner.elastic.k8s_backend import KubernetesBackend
from provisioner.elastic.programs import Context, run_resume
from provisioner.generate import generate
from provisioner.inventory import Inventory, SlurmNode, nodes_from_api
from provisioner.kubeapi import ApiError
from provisioner.logs import Log

NS = "slurm-t"
SPEC = parse_spec({"name": "t", "pools": [{"name": "cpu"}]})


class SlowPodApi(FakePodApi):
    """An API server that serves one create at a time, `per_call` seconds each on its clock; a
    create of a node in `refuse` is refused (422) after that time. From `hangs_after` seconds on its
    clock a create does not answer until `release` (or 10 s of real time, then fails: a program that
    waits for it fails its test instead of hanging it). So the clock stops there, however late the
    program's main thread runs on a busy machine; the calls' threads would otherwise move it on by
    `per_call` each while the main thread waits for a core."""

    def __init__(self, per_call: float, refuse: frozenset[str] = frozenset(), hangs_after: float | None = None,
                 **kw) -> None:
        super().__init__(**kw)
        self.per_call, self.refuse = per_call, refuse
        self.hangs_at = None if hangs_after is None else self.now + hangs_after
        self.lock, self.release = threading.Lock(), threading.Event()

    def create(self, namespace, body):
        time.sleep(0.001)  # a real API call leaves the program's main thread time to look at outcomes
        with self.lock:
            if self.hangs_at is None or self.now < self.hangs_at:
                self.advance(self.per_call)
                if body["metadata"]["name"] in self.refuse:
                    raise ApiError(422, "Invalid", "spec.containers[0].image: Required value")
                return super().create(namespace, body)
        self.release.wait(10)
        raise ApiError(0, "Unreachable", "the API server never answered")


class TimedSlurm(FakeSlurm):
    """Records when (on the API's clock) each node was set DOWN."""

    def __init__(self, clock) -> None:
        super().__init__()
        self.clock, self.down_at = clock, {}

    def set_down(self, names, reason):
        super().set_down(names, reason)
        self.down_at.update({n: self.clock() for n in names})


@pytest.fixture
def shipped_conf(tmp_path: Path) -> str:
    """slurm.conf as `render` writes it for a spec with the defaults (ResumeTimeout 300 s)."""
    path = tmp_path / "slurm.conf"
    path.write_text(generate(SPEC, nodes_from_api([node("k0")])).files["slurm.conf"])
    assert "ResumeTimeout=300" in path.read_text()
    return str(path)


def resume(n: int, api: SlowPodApi, conf: str, slurm: FakeSlurm | None = None):
    inv = Inventory(tuple(SlurmNode(f"cpu-{i}", "cpu", "cpu", 2, 1024, k8s_node=f"k{i}") for i in range(n)))
    slurm = slurm or FakeSlurm()
    ledger = MemoryLedger()
    ctx = Context({"SLURM_CONF": conf}, Log("test"), backend=KubernetesBackend(SPEC, api, namespace=NS),
                  slurm=slurm, inventory=inv, ledger=ledger, clock=api.clock)
    start = api.now
    result = run_resume([f"cpu-[0-{n - 1}]"], ctx, None)
    return result, slurm, ledger, api.now - start


def test_a_large_resume_the_api_can_serve_completes_under_the_shipped_settings(shipped_conf):
    api = SlowPodApi(0.5, namespaces={NS})  # 200 creates one at a time: 100 s
    result, slurm, ledger, took = resume(200, api, shipped_conf)
    assert took == pytest.approx(100)  # five times the old fixed 20 s budget
    assert len(api.pods) == 200 and not slurm.down and not result.abandoned and result.code == 0
    assert ledger.load() == {}


def test_failures_of_a_large_resume_are_set_down_as_they_come(shipped_conf):
    api = SlowPodApi(0.5, refuse=frozenset({"cpu-0", "cpu-1"}), namespaces={NS})
    slurm = TimedSlurm(api.clock)
    result, slurm, ledger, took = resume(200, api, shipped_conf, slurm)
    assert set(slurm.down) == {"cpu-0", "cpu-1"} and len(api.pods) == 198
    # set DOWN in the first waves (within a few seconds, scheduling allowing), not after the last one
    assert max(slurm.down_at.values()) - (api.now - took) < 50, "the first wave's failures waited for the last wave"
    assert sorted(f.node for f in ledger.load()["cpu"].failures) == ["cpu-0", "cpu-1"]


def test_calls_still_running_at_slurms_deadline_are_abandoned_not_counted(shipped_conf):
    # 200 creates would take 400 s, past ResumeTimeout (300 s); from 280 s on they hang
    api = SlowPodApi(2.0, hangs_after=280, namespaces={NS})
    try:
        result, slurm, ledger, took = resume(200, api, shipped_conf)
    finally:
        api.release.set()
    assert result.abandoned and result.code == 1
    assert took < 300  # ended before Slurm would kill it (ResumeTimeout 300 s, less a 30 s margin)
    assert len(api.pods) + len(result.pending) >= 200  # those not started were cancelled, their nodes DOWN
    assert set(result.pending) <= set(slurm.down)
    assert all("did not answer within the 270s budget" in slurm.down[n] for n in result.pending)
    assert ledger.load() == {}, "abandoned calls (outcome unknown) counted as pool failures"


def test_the_budget_follows_the_number_of_calls_and_slurms_timeout(shipped_conf, tmp_path):
    def budget(calls: int, **env: str) -> float:
        return Context({"SLURM_CONF": shipped_conf, **env}, Log("test")).budget_for(calls)

    assert budget(1) == budget(8) == 20  # one wave
    assert budget(9) == 40 and budget(64) == 160
    assert budget(1000) == 270  # max(ResumeTimeout 300, SuspendTimeout 30) less the margin
    assert budget(1000, SLURMK8S_BUDGET="45") == 45  # an explicit budget wins
    assert budget(1000, SLURMK8S_PARALLEL="100") == 200
    missing = Context({"SLURM_CONF": str(tmp_path / "absent.conf")}, Log("test"))
    assert missing.budget_for(1000) == 30  # Slurm's default ResumeTimeout (60 s) less the margin
