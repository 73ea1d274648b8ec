"""A worker list that fails is an error, never an empty list (issue #16 item 3): suspend and
resume-fail retry it, then fail loudly (exit 1, the nodes DOWN with a slurmk8s reason, so the
reconcile loop removes what is left and returns them); they never report "nothing to remove"."""

from __future__ import annotations

import time

import pytest
from factories import node
from fakes.kube import FakePodApi
from fakes.slurm import FakeSlurm

from provisioner.config import parse_spec
from provisioner.elastic.k8s_backend import KubernetesBackend
from provisioner.elastic.programs import LIST_RETRY_PAUSES, Context, run_resume_fail, run_suspend
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.kubeapi import ApiError
from provisioner.logs import Log

NS = "slurm-t"
UNAVAILABLE = ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")


@pytest.fixture
def world(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # the programs' retry pauses, not the fake API's clock
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}]})
    inv = generate(spec, nodes_from_api([node(n, {"p": "c"}) for n in ("n1", "n2")])).inventory
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock)
    for name in ("cpu-n1", "cpu-n2"):
        backend.create(inv[name])
        api.set_phase(NS, name, "Running")
    return inv, api, backend, slept


def ctx(backend, slurm, inv, api: FakePodApi | None = None, conf: str = "/nonexistent/slurm.conf") -> Context:
    """With `api`, the run's clock is the fake API's, and each pause (recorded by the patched
    time.sleep) moves it on: a deleted pod goes when its grace period has passed. `conf`: the
    slurm.conf read for SuspendTimeout (none by default: Slurm's 30 s, never the host's file)."""
    timing = {} if api is None else {"clock": api.clock, "sleep": lambda s: (time.sleep(s), api.advance(s))}
    return Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": conf}, Log("test"), backend=backend, slurm=slurm,
                   inventory=inv, **timing)


def lists(api: FakePodApi) -> int:
    return sum(1 for verb, _ in api.calls if verb == "list")


def test_suspend_retries_a_failed_list_and_removes_the_workers(world):
    inv, api, backend, slept = world
    api.fail_next = [UNAVAILABLE]
    slurm = FakeSlurm()
    result = run_suspend(["cpu-n1,cpu-n2"], ctx(backend, slurm, inv, api))
    verbs = [verb for verb, _ in api.calls]
    assert verbs.count("delete") == 2, "a failed list read as 'no pods'"
    assert result.code == 0 and not slurm.down and verbs[:verbs.index("delete")].count("list") == 2
    assert slept[0] == LIST_RETRY_PAUSES[0]
    # then the pods went (their grace period on the fake clock) and their power-down ended
    assert not api.pods and sorted(slurm.ended) == ["cpu-n1", "cpu-n2"]


def test_suspend_fails_loudly_when_the_list_keeps_failing(world):
    inv, api, backend, _ = world
    api.fail_next = [UNAVAILABLE] * 10
    slurm = FakeSlurm()
    result = run_suspend(["cpu-n1,cpu-n2"], ctx(backend, slurm, inv))
    assert result.code == 1, "suspend exited 0 with its workers still there"
    assert set(slurm.down) == {"cpu-n1", "cpu-n2"}
    assert slurm.down["cpu-n1"].startswith("slurmk8s suspend: cannot list workers: Kubernetes API error 503")
    assert lists(api) == 3  # tried three times


def test_resume_fail_keeps_nodes_out_of_service_while_their_workers_cannot_be_listed(world):
    inv, api, backend, _ = world
    api.fail_next = [UNAVAILABLE] * 10
    slurm = FakeSlurm()
    result = run_resume_fail(["cpu-n1,cpu-n2"], ctx(backend, slurm, inv))
    assert slurm.returned == [], "nodes returned to service with their pods still there"
    assert result.code == 1
    assert slurm.down["cpu-n2"].startswith("slurmk8s resume-failed: cannot list workers: Kubernetes API error 503")


def test_a_refused_list_is_not_retried(world):
    inv, api, backend, slept = world
    api.fail_next = [ApiError(403, "Forbidden", 'pods is forbidden: User "x" cannot list resource "pods"')]
    slurm = FakeSlurm()
    assert run_suspend(["cpu-n1"], ctx(backend, slurm, inv)).code == 1
    assert lists(api) == 1 and slept == []
    assert "RBAC: not allowed to list pods" in slurm.down["cpu-n1"]
