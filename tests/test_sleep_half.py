"""A sleep of the control tier is all or nothing, and a wake repairs any half (issue 40 item 3).

A sleep interrupted by one API error after slurmctld had stopped stayed recorded `asleep` with
slurmdbd and the database still up; every wake then found "a sleep under way" and waited its full
120 s for a sleep that nobody was running any more."""

from __future__ import annotations

import pytest
from fakes.tier import FakeTierApi

from provisioner.controltier.decision import A_REASON, A_STATE, IdleTracker, TierError
from provisioner.controltier.tier import SLEEP_WAIT, Tier
from provisioner.kubeapi import ApiError
from provisioner.reconcile.idle import IdleWatch

CTLD = ("StatefulSet", "slurmctld")


def _api() -> FakeTierApi:
    api = FakeTierApi()
    api.add("StatefulSet", "mariadb", "database")
    api.add("StatefulSet", "slurmdbd", "slurmdbd")
    api.add("StatefulSet", "slurmctld", "slurmctld")
    api.add("Deployment", "login", "login")
    api.pods["slurmctld-0"] = {"metadata": {"name": "slurmctld-0", "uid": "ctld-1"}}  # where the loop runs
    return api


def _tier(api: FakeTierApi) -> tuple[Tier, list[str], list[float]]:
    t = [1000.0]
    lines: list[str] = []
    tier = Tier(api, "slurm-zz", "test", log=lines.append, clock=lambda: t[0],
                sleep=lambda s: t.__setitem__(0, t[0] + s), poll=1.0)
    return tier, lines, t


def _fails_once(api: FakeTierApi, verb: str, match) -> None:
    """The next `verb` call whose arguments `match` raises one API error (a 500 from etcd)."""
    orig = getattr(api, verb)
    failed: list[bool] = []

    def call(*args):
        if match(*args) and not failed:
            failed.append(True)
            raise ApiError(500, "InternalError", "etcdserver: request timed out")
        return orig(*args)

    setattr(api, verb, call)


def _state(api: FakeTierApi) -> str:
    return api.state[A_STATE]


def test_a_sleep_interrupted_by_one_api_error_after_slurmctld_stopped_is_undone():
    api = _api()
    _fails_once(api, "scale", lambda ns, kind, name, replicas: name == "slurmdbd" and replicas == 0)
    tier, lines, _ = _tier(api)
    with pytest.raises(TierError, match="slurmdbd"):
        tier.sleep_tier("idle for 600s", recheck=lambda: "", controller_stopped=lambda: True)
    replicas = {name: w["spec"]["replicas"] for (_, name), w in api.workloads.items()}
    assert replicas == {"mariadb": 1, "slurmdbd": 1, "slurmctld": 1, "login": 1}, "a sleep left half-done"
    assert _state(api) == "awake", "recorded asleep while half scaled down"
    assert api.state[A_REASON].startswith("sleep failed")
    assert [e["reason"] for e in api.events] == ["ControlTierSleep", "ControlTierSleepAborted"]


def test_a_wake_repairs_at_once_a_half_that_no_sleep_is_finishing():
    """The sleeper (the reconcile loop, in slurmctld's pod) was killed half-way: slurmctld at zero,
    its pod gone, slurmdbd and the database still up, `asleep` recorded. Nothing can finish that
    sleep: the wake scales slurmctld up at once instead of waiting 120 s."""
    api = _api()
    tier, lines, t = _tier(api)
    tier.record("asleep", "idle", "ControlTierSleep")
    api.workloads[CTLD]["spec"]["replicas"] = 0
    del api.pods["slurmctld-0"]
    start = t[0]
    assert tier.wake("sbatch by alice", timeout=300)
    assert api.workloads[CTLD]["spec"]["replicas"] == 1
    assert t[0] - start < 10, f"the wake waited {t[0] - start:.0f}s for a sleep nobody runs"
    assert any("stopped half-way" in line for line in lines), lines


def test_a_wake_still_waits_for_a_sleep_whose_pod_is_finishing_it():
    """slurmctld's pod is still there (terminating: its loop scales slurmdbd and the database
    down): that sleep is under way, and is waited for, as long as SLEEP_WAIT at most."""
    api = _api()
    tier, lines, t = _tier(api)
    tier.record("asleep", "idle", "ControlTierSleep")
    api.workloads[CTLD]["spec"]["replicas"] = 0
    start = t[0]
    assert tier.wake("sbatch by alice", timeout=300)
    assert t[0] - start >= SLEEP_WAIT
    assert any(f"did not finish in {SLEEP_WAIT:.0f}s" in line for line in lines), lines


def test_the_loop_repairs_a_failed_sleep_it_could_not_record_at_its_next_pass():
    """The sleep failed before slurmctld and could not record `awake` either (the API refused the
    annotation once): the loop's next pass records it, so no wake waits for that sleep."""
    api = _api()
    _fails_once(api, "scale", lambda ns, kind, name, replicas: name == "login" and replicas == 0)
    tier, lines, t = _tier(api)
    watch = IdleWatch(tier, IdleTracker(30), sessions=lambda: (0, (), None, ""), jobs=lambda: {"jobs": []},
                      workers=lambda: 0, controller_stopped=lambda: True, log=lines.append)
    assert watch.step({"jobs": []}, 0, 100) is False  # started: recorded awake
    _fails_once(api, "set_state", lambda ns, ann: ann.get(A_STATE) == "awake")
    assert watch.step({"jobs": []}, 0, 131) is False  # idle 31 s: the sleep, which fails
    assert _state(api) == "asleep" and any("sleep failed" in line for line in lines)
    watch.step({"jobs": [{"job_state": ["PENDING"]}]}, 0, 140)  # the next pass
    assert _state(api) == "awake", "the failed sleep's record was never repaired"
    assert all(w["spec"]["replicas"] == 1 for w in api.workloads.values())
    start = t[0]
    assert tier.wake("sbatch by alice", timeout=300) is False
    assert t[0] - start < 10
