"""A Slurm command in the window between the sleep's last look at the queue and slurmctld stopping
(issue #16 item 5): the job is saved with slurmctld's state, so the wake path must treat a sleep
under way as a reason to wake once it is down."""

from __future__ import annotations

import threading
import time

from fakes.tier import FakeTierApi

from provisioner.controltier.agent import Agent
from provisioner.controltier.decision import A_STATE
from provisioner.controltier.tier import Tier


def _tiers(login_sleeps: bool = False):
    api = FakeTierApi()
    api.add("StatefulSet", "mariadb", "database")
    api.add("StatefulSet", "slurmdbd", "slurmdbd")
    api.add("StatefulSet", "slurmctld", "slurmctld")
    if login_sleeps:
        api.add("Deployment", "login", "login")
    # the pod the loop (and so the sleep) runs in: there until the loop has ended
    api.pods["slurmctld-0"] = {"metadata": {"name": "slurmctld-0", "uid": "ctld-1"}}
    lines: list[str] = []
    # the loop's tier (in the slurmctld pod) and the agent's (in the login pod), one API
    loop = Tier(api, "slurm-zz", "slurmk8s-reconcile", log=lines.append, sleep=lambda s: time.sleep(0.01), poll=0.01)
    agent_tier = Tier(api, "slurm-zz", "slurmk8s-login-agent", log=lines.append,
                      sleep=lambda s: time.sleep(0.01), poll=0.01)
    return api, loop, agent_tier, lines


def _submit_in_the_window(api, loop, agent_tier, tmp_path):
    """Run a sleep whose last look finds the queue empty, and send `wake alice sbatch` right after
    that look, before slurmctld is scaled down (the agent's answer is what sbatch waits for)."""
    agent = Agent(agent_tier, str(tmp_path / "sessions"), timeout=30)
    out: list[str] = []
    handler = threading.Thread(target=agent.handle, args=("wake alice sbatch", out.append, "alice"))

    def recheck() -> str:
        handler.start()
        t0 = time.monotonic()
        while not out and time.monotonic() - t0 < 5:  # the agent answered, or says it waits
            time.sleep(0.01)
        return ""  # the queue looked empty: the job reaches slurmctld only now

    assert loop.sleep_tier("idle for 60s", recheck=recheck, controller_stopped=lambda: True, gone_timeout=1)
    handler.join(10)
    assert not handler.is_alive(), f"the wake request hangs: {out}"
    return out


def test_a_submit_after_the_sleeps_last_look_wakes_the_tier_once_it_is_down(tmp_path):
    api, loop, agent_tier, lines = _tiers()
    out = _submit_in_the_window(api, loop, agent_tier, tmp_path)
    assert out[-1] == "ok woken", out
    assert any("going to sleep" in line for line in out), out
    scales = [(c[2], c[3]) for c in api.calls if c[0] == "scale"]
    # the sleep finished in order, then the wake brought everything back, database first
    assert scales == [("slurmctld", 0), ("slurmdbd", 0), ("mariadb", 0),
                      ("mariadb", 1), ("slurmdbd", 1), ("slurmctld", 1)], scales
    assert all(w["spec"]["replicas"] == 1 for w in api.workloads.values())
    assert [e["reason"] for e in api.events] == ["ControlTierSleep", "WakeRequested"]


def test_a_wake_during_an_aborted_sleep_does_not_scale_anything(tmp_path):
    api, _, agent_tier, _ = _tiers()
    api.state[A_STATE] = "asleep"
    out: list[str] = []
    agent = Agent(agent_tier, str(tmp_path / "sessions"), timeout=30)
    handler = threading.Thread(target=agent.handle, args=("wake alice squeue", out.append, "alice"))
    handler.start()
    time.sleep(0.2)
    api.state[A_STATE] = "awake"  # the sleep aborted
    handler.join(5)
    assert out[-1] == "ok awake" and [c for c in api.calls if c[0] == "scale"] == []


def test_a_sleep_that_stops_half_way_is_not_waited_for_ever(tmp_path):
    api, _, agent_tier, lines = _tiers()
    api.state[A_STATE] = "asleep"
    api.workloads[("StatefulSet", "slurmctld")]["spec"]["replicas"] = 0  # slurmctld went, its loop was killed
    del api.pods["slurmctld-0"]  # with its pod: nothing finishes that sleep (issue 40: not waited for at all)
    t = [0.0]
    agent_tier.clock = lambda: t[0]
    agent_tier.sleep = lambda s: t.__setitem__(0, t[0] + s)
    agent_tier.poll = 5.0
    out: list[str] = []
    Agent(agent_tier, str(tmp_path / "sessions"), timeout=300).handle("wake alice sbatch", out.append, "alice")
    assert out[-1] == "ok woken", out
    assert api.workloads[("StatefulSet", "slurmctld")]["spec"]["replicas"] == 1
    assert any("stopped half-way" in line for line in lines) and t[0] < 10
