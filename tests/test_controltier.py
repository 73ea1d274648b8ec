"""Idle sleep and wake of the control tier: the idle rule, the sleep and wake steps (order,
record, abort, idempotence) on the in-memory API, the login agent, the manifests (labels, least
privilege, no token in the login container) and the login image's wake / session-count scripts."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest.mock
from pathlib import Path

import kubernetes_validate
import pytest
from factories import node
from fakes.tier import FakeTierApi

from provisioner import manifests as m
from provisioner import names
from provisioner.config import SpecError, parse_spec
from provisioner.controltier.activity import activity_doc, activity_from_doc, read_activity_file
from provisioner.controltier.agent import Agent, UserNames, WakeServer
from provisioner.controltier.decision import A_REASON, A_SINCE, A_STATE, Activity, IdleTracker, TierError, active_jobs
from provisioner.controltier.tier import Tier
from provisioner.deploy.keys import generate, secrets_from_values
from provisioner.generate import generate as run_pipeline
from provisioner.inventory import nodes_from_api
from provisioner.reconcile.idle import IdleWatch

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images" / "login"


def _spec(**elasticity_and_login):
    login = elasticity_and_login.pop("login", {})
    return parse_spec({
        "name": "zz", "pools": [{"name": "cpu", "node_selector": {"kubernetes.io/os": "linux"}}],
        "users": [{"name": "alice", "uid": 2001, "ssh_keys": ["ssh-ed25519 AAAA a@b"]}],
        "elasticity": {"suspend_time": 60, **elasticity_and_login}, "login": login,
    })


def _objects(spec):
    gen = run_pipeline(spec, nodes_from_api([node("n1", {"kubernetes.io/os": "linux"}, cpu="8", memory="32Gi")]))
    return m.all_objects(spec, gen.inventory, gen.files, secrets_from_values(generate()))


def _tier(api, clock=None):
    t = [1000.0]

    def now():
        return t[0]

    def sleep(s):
        t[0] += s

    lines = []
    return Tier(api, "slurm-zz", "test", log=lines.append, clock=clock or now, sleep=sleep, poll=1.0), lines


def _full_tier(**kw):
    api = FakeTierApi(**kw)
    api.add("StatefulSet", "mariadb", "database")
    api.add("StatefulSet", "slurmdbd", "slurmdbd")
    api.add("StatefulSet", "slurmctld", "slurmctld")
    api.add("Deployment", "login", "login")
    api.add("Deployment", "other", "login", tier=False)  # not labelled: never touched
    return api


# ---------------------------------------------------------------- the idle rule


def test_idle_tracker_sleeps_only_after_a_full_quiet_period():
    tr = IdleTracker(teardown=60)
    quiet = Activity(jobs=0, workers=0, sessions=0)
    assert tr.update(quiet, 100) is None and tr.idle_since == 100
    assert tr.update(quiet, 159) is None
    reason = tr.update(quiet, 160)
    assert reason and "idle for 60s" in reason and "idle_teardown 60s" in reason
    # anything active restarts the clock
    for busy, words in ((Activity(1, 0, 0), "1 unfinished job"), (Activity(0, 2, 0), "2 worker pod"),
                        (Activity(0, 0, 1, users=("alice",)), "1 SSH session(s) on the login pod (alice)"),
                        (Activity(0, 0, None, unknown="login agent down"), "activity unknown (login agent down)"),
                        (Activity(None, 0, 0), "activity unknown")):
        tr = IdleTracker(teardown=60, idle_since=0)
        assert tr.update(busy, 1000) is None and tr.idle_since is None
        assert words in tr.why_awake(busy, 1000)
    # a Slurm command / SSH login on the login pod counts as activity at its time
    tr = IdleTracker(teardown=60, idle_since=0)
    assert tr.update(Activity(0, 0, 0, last_request=950), 1000) is None and tr.idle_since == 950
    assert tr.update(Activity(0, 0, 0, last_request=950), 1010) is not None


def test_active_jobs_counts_unfinished_ones():
    doc = {"jobs": [{"job_state": ["PENDING"]}, {"job_state": ["RUNNING"]}, {"job_state": ["COMPLETED"]},
                    {"job_state": ["CANCELLED"]}, {"job_state": ["COMPLETING"]}, {"job_state": ["FAILED"]},
                    {"job_state": ["PENDING", "REQUEUED"]}, {"job_state": ["SUSPENDED"]}]}
    assert active_jobs(doc) == 5
    assert active_jobs({}) == 0


# ---------------------------------------------------------------- wake and sleep


def _asleep_tier():
    """The whole tier at zero (but a Deployment of another component); readiness looks recorded as ('ready?', name)."""
    api = _full_tier(ready_after=3)
    for key in list(api.workloads):
        if key[1] != "other":
            api.workloads[key]["spec"]["replicas"] = 0
            api.workloads[key]["status"]["readyReplicas"] = 0
    tier, _ = _tier(api)
    get = api.get_workload
    api.get_workload = lambda ns, kind, name: (api.calls.append(("ready?", name)), get(ns, kind, name))[1]
    return tier, api


def test_wake_scales_everything_at_once_and_waits_for_slurmctld_and_login_only():
    """slurmdbd waits for its database by itself and slurmctld (woken: it has state files) takes
    jobs without slurmdbd: nothing is scaled only after another is ready, and the waker does not
    wait for accounting (P7: the sequential wake took 11-12 s to RUNNING)."""
    tier, api = _asleep_tier()
    progress = []
    assert tier.wake("slurmk8s submit by alice", progress.append) is True
    scaled = [c[2] for c in api.calls if c[0] == "scale"]
    assert scaled == ["mariadb", "slurmdbd", "slurmctld", "login"]
    scales = [i for i, c in enumerate(api.calls) if c[0] == "scale"]
    looks = [i for i, c in enumerate(api.calls) if c[0] == "ready?"]
    assert looks and max(scales) < min(looks), api.calls  # every scale before the first readiness look
    assert any(p.startswith("not waited for: statefulset/mariadb, statefulset/slurmdbd") for p in progress), progress
    assert not any(p.startswith(("statefulset/mariadb ready", "statefulset/slurmdbd ready")) for p in progress)
    assert [c for c in api.calls if c[0] == "event"] == [("event", "WakeRequested", "slurmk8s submit by alice")]
    assert progress[0] == "waking the control tier (slurmk8s submit by alice)"
    assert any(p.startswith("statefulset/slurmctld ready (") for p in progress)
    assert api.workloads[("Deployment", "other")]["spec"]["replicas"] == 1
    # idempotent: awake -> nothing scaled, no event
    api.calls.clear()
    assert tier.wake("again") is False and [c for c in api.calls if c[0] != "ready?"] == []


def _bound_pod(uid: str, state: str = "waiting") -> dict:
    return {"metadata": {"name": "slurmctld-0", "uid": uid}, "spec": {"nodeName": "node-a"},
            "status": {"containerStatuses": [{"name": "slurmctld", "state": {state: {}}}]}}


def _failed_mount(uid: str, message: str, count: int = 1) -> dict:
    return {"reason": "FailedMount", "count": count, "message": message,
            "involvedObject": {"kind": "Pod", "name": "slurmctld-0", "uid": uid}}


NO_RELATIONSHIP = ("Unable to attach or mount volumes: unmounted volumes=[state], unattached volumes=[], failed to "
                   "process volumes=[state]: error processing PVC slurm-zz/slurmctld-state: failed to fetch PVC from "
                   "API server: persistentvolumeclaims \"slurmctld-state\" is forbidden: User \"system:node:node-a\" "
                   "cannot get resource \"persistentvolumeclaims\" in API group \"\" in the namespace \"slurm-zz\": "
                   "no relationship found between node 'node-a' and this object")


def test_a_woken_pod_the_kubelet_skipped_for_its_claim_is_deleted_once_for_the_statefulset_to_make_again():
    """kubernetes#113429: the kubelet read the claim before the node authorizer knew the pod, and
    waits 10-15 s. The wake deletes that pod (its uid a precondition), once; an older pod's Event of
    the same name is not this pod's."""
    tier, api = _asleep_tier()
    api.ready_after = 6
    api.pods["slurmctld-0"] = _bound_pod("uid-new")
    api.events += [_failed_mount("uid-old", NO_RELATIONSHIP), _failed_mount("uid-new", NO_RELATIONSHIP)]
    progress = []
    lines = tier.log.__self__  # the list _tier logs into
    assert tier.wake("submit", progress.append) is True
    assert [c for c in api.calls if c[0] == "delete_pod"] == [("delete_pod", "slurmctld-0", "uid-new")], api.calls
    assert any("pod slurmctld-0: the kubelet could not read its volume claim" in p for p in progress), progress
    # the next polls found no pod (404: not made again yet): nothing said, nothing deleted again
    assert not [line for line in lines if "slurmctld-0" in line], lines
    # the pod made again loses the race too: deleted too, once
    api.calls.clear()
    api.pods["slurmctld-0"] = _bound_pod("uid-newer")
    api.events.append(_failed_mount("uid-newer", NO_RELATIONSHIP))
    api.workloads[("StatefulSet", "slurmctld")]["status"]["readyReplicas"] = 0
    api._pending[("StatefulSet", "slurmctld")] = 6
    assert tier.wake("again") is True
    assert [c[2] for c in api.calls if c[0] == "delete_pod"] == ["uid-newer"]


@pytest.mark.parametrize("case", ["no event", "another mount failure", "not bound", "started"])
def test_a_woken_pod_is_left_alone_unless_the_kubelet_skipped_it_for_its_claim(case):
    tier, api = _asleep_tier()
    api.ready_after = 4
    pod = _bound_pod("u1", "running" if case == "started" else "waiting")
    if case == "not bound":
        pod["spec"] = {}
    api.pods["slurmctld-0"] = pod
    if case != "no event":
        message = NO_RELATIONSHIP if case != "another mount failure" else (
            "MountVolume.SetUp failed for volume \"data\" : hostPath type check failed: /data is not a directory")
        api.events.append(_failed_mount("u1", message))
    assert tier.wake("submit") is True
    assert not [c for c in api.calls if c[0] == "delete_pod"], api.calls
    assert api.pods["slurmctld-0"] == pod


def test_a_woken_login_pod_the_kubelet_skipped_for_its_claim_is_deleted_for_its_replicaset_to_make_another():
    """The login pod, when it sleeps with the tier (`slurmk8s submit` waits for it), loses the same
    race: its Deployment's pods are listed by its selector, and the skipped one is deleted once."""
    tier, api = _asleep_tier()
    tier.replace_deployment_pods = True  # the CLI's wake (usercli.wake)
    api.ready_after = 6
    skipped = _bound_pod("uid-login")
    skipped["metadata"].update(name="login-5f7c9d-x2k4q", labels={m.L_COMPONENT: "login"})
    gone = _bound_pod("uid-old-login")
    gone["metadata"].update(name="login-5f7c9d-a1b2c", labels={m.L_COMPONENT: "login"}, deletionTimestamp="t")
    api.pods = {skipped["metadata"]["name"]: skipped, gone["metadata"]["name"]: gone}
    api.events += [_failed_mount("uid-login", NO_RELATIONSHIP), _failed_mount("uid-old-login", NO_RELATIONSHIP)]
    progress = []
    assert tier.wake("submit", progress.append) is True
    assert [c for c in api.calls if c[0] == "delete_pod"] == [("delete_pod", "login-5f7c9d-x2k4q", "uid-login")]
    assert ("pod login-5f7c9d-x2k4q: the kubelet could not read its volume claim (FailedMount) and would look again "
            "only after 10-15 s; deleted it, its ReplicaSet makes another at once") in progress, progress


def test_the_cli_wake_may_replace_the_login_pod(monkeypatch):
    """`slurmk8s submit` wakes with the user's own credentials, which may list and delete pods."""
    import provisioner.usercli as usercli
    from provisioner.controltier import tier as tier_module

    made = []

    class Recording(tier_module.Tier):
        def wake(self, *args, **kwargs):
            made.append(self)
            return False

    monkeypatch.setattr(tier_module, "Tier", Recording)
    assert usercli.wake(object(), "slurm-zz", "submit", 1.0) is False
    assert [t.replace_deployment_pods for t in made] == [True]


@pytest.mark.parametrize("refused, cli, said", [
    ("get_pod", False, "cannot look at pod slurmctld-0's volume mounts: 403 Forbidden: cannot get_pod"),
    ("list_pods", True, "cannot look at deployment/login's pods' volume mounts: 403 Forbidden: cannot list_pods"),
    ("list_pods", False, None),
])
def test_a_wake_without_the_rights_to_look_at_its_pods_goes_on_and_says_so_once(refused, cli, said):
    """An older Role (before `slurmk8s up` gave it get/delete on slurmctld-0 and list on Events), or
    a user who may not list pods. The wakers in pods (the login agent, the REST front: their Roles
    name slurmctld-0 alone) never list the login pods, though the REST front waits for a sleeping
    login pod: they are neither refused each wake nor given `delete` on every pod of the namespace."""
    tier, api = _asleep_tier()
    tier.replace_deployment_pods = cli  # the CLI's wake (usercli.wake) sets it
    api.ready_after = 4
    api.forbidden.add(refused)
    lines = tier.log.__self__  # the list _tier logs into
    assert tier.wake("submit") is True
    assert [line for line in lines if "volume mounts" in line] == ([said] if said else []), lines


def test_wake_says_when_everything_is_scaled_before_waiting_for_readiness():
    """`slurmk8s submit` goes on (logs in, asks slurmctld) once the wake has scaled, not after readiness."""
    tier, api = _asleep_tier()
    marks = []
    assert tier.wake("submit", scaled=lambda: marks.append(len(api.calls))) is True
    scales = [i for i, c in enumerate(api.calls) if c[0] == "scale"]
    looks = [i for i, c in enumerate(api.calls) if c[0] == "ready?"]
    assert marks == [max(scales) + 1] and marks[0] <= min(looks), (marks, api.calls)
    assert tier.wake("again", scaled=lambda: marks.append("awake")) is False and marks[-1] == "awake"


def test_a_wake_ends_once_slurmctld_takes_connections_before_its_pod_is_ready():
    """The login agent's wake: slurmctld's port answering ends the wait for slurmctld (its pod's
    readiness waits for every container and the next probe); asked only once it is scaled up."""
    tier, api = _asleep_tier()
    asked = []

    def answers() -> bool:
        asked.append(api.workloads[("StatefulSet", "slurmctld")]["spec"]["replicas"])
        return len(asked) >= 2

    progress: list[str] = []
    assert tier.wake("sbatch by alice", progress.append, running_in=m.LOGIN, answers=answers) is True
    assert asked == [1, 1]  # ready_after=3: the pod would be Ready only at the third look
    assert progress[-2].startswith("statefulset/slurmctld takes connections on its port ("), progress
    assert not any(p.startswith("statefulset/slurmctld ready") for p in progress)


def test_a_wake_asks_slurmctlds_port_more_often_than_it_reads_readiness():
    """The login agent asks the port each answer_poll (the pod's address appears up to a second
    after slurmctld listens) and reads the StatefulSet's ready count only each poll."""
    tier, api = _asleep_tier()
    tier.answer_poll = 0.25  # poll is 1.0
    asked = []

    def answers() -> bool:
        asked.append(tier.clock())
        return len(asked) >= 6

    assert tier.wake("sbatch by alice", running_in=m.LOGIN, answers=answers) is True
    looks = [c for c in api.calls if c == ("ready?", "slurmctld")]
    assert len(asked) == 6 and len(looks) == 2, (asked, api.calls)  # 1.25 s waited: a look at 0 s and at 1 s
    assert [round(b - a, 2) for a, b in zip(asked, asked[1:])] == [0.25] * 5


def test_controller_listens_connects_to_the_address_slurmctlds_service_publishes():
    """No address in the Service's EndpointSlices yet (the DNS name does not resolve), a pod being
    deleted, a port that refuses: not up. Listening at the published address: up."""
    from provisioner.controltier.tier import controller_listens

    api = FakeTierApi()
    listens = controller_listens(api, "ns", connect_timeout=0.5)
    assert listens() is False and api.calls[-1] == ("list_endpoint_slices", m.CONTROLLER)  # no address yet
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    with unittest.mock.patch.object(names, "SLURMCTLD_PORT", port):
        api.endpoint_ips["login-5d8f7-abcde"] = "127.0.0.1"  # another pod of the slice: not slurmctld's name
        server.listen(1)
        assert listens() is False
        api.endpoint_ips[m.CONTROLLER_POD] = "127.0.0.2"
        assert listens() is False  # published, but nothing listens at that address
        api.endpoint_ips[m.CONTROLLER_POD] = "127.0.0.1"
        assert listens() is True
        api.terminating.add(m.CONTROLLER_POD)
        assert listens() is False  # the pod of the sleep, going
    server.close()
    api.forbidden.add("list_endpoint_slices")
    assert controller_listens(api, "ns")() is False  # RBAC: the wake waits for readiness instead


def test_controller_addresses_reads_endpoint_slices_as_the_controller_writes_them():
    from provisioner.controltier.tier import controller_addresses

    slices = [{"endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}, "hostname": "slurmctld-0",
                              "targetRef": {"kind": "Pod", "name": "slurmctld-0"}}]},
              {"endpoints": None},
              {"endpoints": [{"addresses": ["10.0.0.7"], "targetRef": {"kind": "Pod", "name": "slurmctld-0"}},
                             {"addresses": ["10.0.0.8"], "conditions": {"ready": False}, "hostname": "slurmctld-0"},
                             {"addresses": ["10.0.0.9"], "conditions": {"terminating": True}, "hostname": "slurmctld-0"}]}]
    # the DNS serves ready endpoints and those that do not say (conditions unset); not the others
    assert controller_addresses(slices) == ["10.0.0.7"]


def test_a_slow_port_check_does_not_space_out_the_readiness_reads():
    """Each ask of the port takes 0.3 s (a connect that waits out its timeout): the ready count is
    still read about each poll (1.0 s here), not each 4 asks of 0.55 s."""
    tier, api = _asleep_tier()
    tier.answer_poll = 0.25

    def slow() -> bool:
        tier.sleep(0.3)
        return False

    assert tier.wake("sbatch by alice", running_in=m.LOGIN, answers=slow) is True
    looks = [i for i, c in enumerate(api.calls) if c == ("ready?", "slurmctld")]
    assert len(looks) == 3  # Ready at the third look (ready_after=3): at 0 s, ~1.1 s, ~2.2 s
    assert tier.clock() - 1000.0 < 2.5, tier.clock()


def test_a_wake_that_asks_the_port_still_ends_at_its_deadline():
    """answers() never True and the pod never Ready: the wake gives up at its timeout with the reason."""
    tier, api = _asleep_tier()
    api.ready_after = 10**6
    tier.answer_poll = 0.25
    with pytest.raises(TierError, match=r"statefulset/slurmctld not ready after 5s"):
        tier.wake("sbatch by alice", running_in=m.LOGIN, timeout=5, answers=lambda: False)


def test_a_wake_that_asks_the_port_ends_at_readiness_too():
    """The port never answers (e.g. the probe of another network), the pod becomes Ready: done."""
    tier, api = _asleep_tier()  # Ready at the third look
    tier.answer_poll = 0.25
    progress: list[str] = []
    assert tier.wake("sbatch by alice", progress.append, running_in=m.LOGIN, answers=lambda: False) is True
    assert any(p.startswith("statefulset/slurmctld ready (") for p in progress), progress


def test_submit_wakes_in_a_thread_and_hands_its_failure_over(monkeypatch):
    from provisioner import usercli

    def failing(api, ns, why, timeout, scaled):
        raise usercli.UserError("statefulset/slurmctld not ready after 300s: ImagePullBackOff")

    monkeypatch.setattr(usercli, "wake", failing)
    waking = usercli.Waking(None, "slurm-x", "submit", 300)
    assert waking.scaled.wait(5)  # set on failure too: the caller goes on to check()
    with pytest.raises(usercli.UserError, match="ImagePullBackOff"):
        waking.check()
    calls = []
    monkeypatch.setattr(usercli, "wake", lambda api, ns, why, timeout, scaled: (calls.append(ns), scaled()))
    ok = usercli.Waking(None, "slurm-y", "submit", 300)
    assert ok.scaled.wait(5) and calls == ["slurm-y"]
    ok.check()


def test_wake_errors_name_the_workload_and_the_fix():
    api = FakeTierApi(ready_after=10**6)
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    tier, _ = _tier(api)
    with pytest.raises(TierError, match=r"statefulset/slurmctld not ready after 30s.*describe statefulset/slurmctld"):
        tier.wake("x", timeout=30)
    with pytest.raises(TierError, match="no statefulset/slurmctld labelled slurmk8s.io/tier=control"):
        _tier(FakeTierApi())[0].wake("x")
    api = FakeTierApi(forbidden={"list"})
    with pytest.raises(TierError, match="RBAC"):
        _tier(api)[0].wake("x")


def test_sleep_goes_login_first_database_last_and_records_why():
    api = _full_tier()
    tier, lines = _tier(api)
    stopped = iter([False, False, True, True])
    assert tier.sleep_tier("idle for 60s", recheck=lambda: "", controller_stopped=lambda: next(stopped))
    assert [c[2] for c in api.calls if c[0] == "scale"] == ["login", "slurmctld", "slurmdbd", "mariadb"]
    ann = api.state
    assert ann[A_STATE] == "asleep" and ann[A_REASON] == "idle for 60s" and ann[A_SINCE].endswith("Z")
    assert api.events[0]["reason"] == "ControlTierSleep" and api.events[0]["involvedObject"]["name"] == "slurmctld"
    assert "control tier asleep: idle for 60s" in lines
    assert all(api.workloads[k]["spec"]["replicas"] == 0 for k in api.workloads if k[1] != "other")


def test_a_job_submitted_while_the_login_pod_goes_aborts_the_sleep():
    api = _full_tier()
    tier, _ = _tier(api)
    assert not tier.sleep_tier("idle", recheck=lambda: "1 unfinished job(s)", controller_stopped=lambda: True)
    assert [(c[2], c[3]) for c in api.calls if c[0] == "scale"] == [("login", 0), ("login", 1)]
    ann = api.state
    assert ann[A_STATE] == "awake" and ann[A_REASON] == "sleep aborted: 1 unfinished job(s)"
    assert [e["reason"] for e in api.events] == ["ControlTierSleep", "ControlTierSleepAborted"]


def test_the_woken_loop_records_who_woke_it_and_finishes_an_interrupted_sleep():
    api = _full_tier()
    tier, _ = _tier(api)
    tier.record("asleep", "idle", "ControlTierSleep")
    api.workloads[("StatefulSet", "mariadb")]["spec"]["replicas"] = 0  # a sleep that went on while waking
    tier.clock = lambda: 2000.0
    tier.event("WakeRequested", "sbatch by alice on the login pod")
    done = tier.on_controller_start()
    assert done == "recorded awake (sbatch by alice on the login pod)"
    ann = api.state
    assert ann[A_STATE] == "awake" and ann[A_REASON] == "woken: sbatch by alice on the login pod"
    assert api.workloads[("StatefulSet", "mariadb")]["spec"]["replicas"] == 1
    assert api.events[-1]["reason"] == "ControlTierWake"
    assert tier.on_controller_start() == "already recorded awake"
    fresh = FakeTierApi()
    fresh.add("StatefulSet", "slurmctld", "slurmctld")
    assert _tier(fresh)[0].on_controller_start() == "recorded awake (deployed)"


def test_idle_watch_sleeps_the_tier_after_the_teardown():
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld")
    tier, lines = _tier(api)
    watch = IdleWatch(tier, IdleTracker(30), sessions=lambda: (0, (), None, ""), jobs=lambda: {"jobs": []},
                      workers=lambda: 0, controller_stopped=lambda: True, log=lines.append)
    assert watch.step({"jobs": []}, 0, 100) is False
    assert watch.started and api.state[A_STATE] == "awake"
    assert watch.step({"jobs": [{"job_state": ["RUNNING"]}]}, 1, 120) is False
    assert watch.step({"jobs": []}, 0, 130) is False
    assert watch.step({"jobs": []}, 0, 161) is True
    assert api.workloads[("StatefulSet", "slurmctld")]["spec"]["replicas"] == 0
    assert any("control tier awake: 1 unfinished job(s); 1 worker pod(s)" in line for line in lines)
    assert any(line.startswith("control tier going to sleep: idle for 31s") for line in lines)


# ---------------------------------------------------------------- the login agent


def test_agent_wakes_once_and_answers_awake_after(tmp_path):
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    tier, _ = _tier(api)
    agent = Agent(tier, str(tmp_path / "sessions"))
    out = []
    agent.handle("wake alice sbatch", out.append, "alice")
    assert out[0] == "progress waking the control tier (sbatch by alice on the login pod)" and out[-1] == "ok woken"
    out.clear()
    agent.handle("wake alice squeue", out.append, "alice")
    assert out == ["ok awake"]
    out.clear()
    agent.handle("hello", out.append, "alice")
    assert out[0].startswith("error unknown request")
    assert agent.last_request is not None


def test_after_a_wake_that_ended_at_the_port_the_next_caller_is_not_told_awake_from_the_cache(tmp_path):
    """slurmctld may take connections before it serves RPCs: a caller right after such a wake looks
    at the tier again (and hears `ok woken` while the pod is not Ready), so its wrapper pings
    slurmctld before running the command; only a look that found everything up is cached."""
    api = FakeTierApi(ready_after=10**6)
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    tier, _ = _tier(api)
    agent = Agent(tier, str(tmp_path / "sessions"), answers=lambda: True)
    for command in ("sbatch", "squeue"):
        out: list[str] = []
        agent.handle(f"wake alice {command}", out.append, "alice")
        assert any(line.startswith("progress statefulset/slurmctld takes connections on its port") for line in out)
        assert out[-1] == "ok woken", out
    api.workloads[("StatefulSet", "slurmctld")]["status"]["readyReplicas"] = 1  # the pod is Ready now
    for _ in range(2):
        out = []
        agent.handle("wake alice sinfo", out.append, "alice")
        assert out == ["ok awake"]


def test_the_agent_never_waits_for_its_own_login_pod(tmp_path):
    # login sleeps with the tier; its restarted pod asks to wake before it can become ready
    api = FakeTierApi(ready_after=10**6)
    api.add("StatefulSet", "slurmctld", "slurmctld")
    api.add("Deployment", "login", "login")
    api.workloads[("Deployment", "login")]["status"]["readyReplicas"] = 0  # this very pod, starting
    tier, _ = _tier(api)
    out = []
    Agent(tier, str(tmp_path / "sessions"), timeout=30).handle("wake root login-pod-start", out.append, "root")
    assert out == ["ok awake"] and api.calls == []


def test_a_request_during_a_wake_waits_for_it_and_hears_woken(tmp_path):
    api = FakeTierApi(ready_after=3)
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    tier, _ = _tier(api)
    gate = threading.Event()
    tier.sleep = lambda s: gate.wait(5)  # the first wake blocks while polling readiness
    agent = Agent(tier, str(tmp_path / "sessions"))
    first, second = [], []
    t1 = threading.Thread(target=agent.handle, args=("wake alice ssh-login", first.append, "alice"))
    t1.start()
    while not agent._waking:
        time.sleep(0.01)
    t2 = threading.Thread(target=agent.handle, args=("wake alice sbatch", second.append, "alice"))
    t2.start()
    time.sleep(0.1)
    gate.set()
    t1.join(5)
    t2.join(5)
    assert first[-1] == "ok woken"
    assert second == ["progress waking the control tier (already under way for ssh-login by alice on the login pod)",
                      "ok woken"]
    assert [c for c in api.calls if c[0] == "scale"] == [("scale", "StatefulSet", "slurmctld", 1)]


# ---------------------------------------------------------------- the wake socket (real Unix sockets)


@pytest.fixture
def wake_dir():
    d = tempfile.mkdtemp(prefix="wk", dir="/tmp")  # short: a socket path has at most 107 bytes
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _wake_server(wake_dir, api, passwd="", **caps):
    tier, lines = _tier(api)
    tier.sleep = lambda s: None
    (wake_dir / "passwd").write_text(passwd)
    agent = Agent(tier, str(wake_dir / "sessions"))
    server = WakeServer(agent, str(wake_dir / "wake.sock"), UserNames(str(wake_dir / "passwd")), lines.append,
                        **caps)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, lines


def _connect(server):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(server.path)
    return c


def _ask(server, line):
    with _connect(server) as c:
        c.sendall(line)
        return c.makefile().read().splitlines()


def _wait_for(cond, what, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_the_wake_socket_names_the_caller_by_its_uid_not_by_its_claim(wake_dir):
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    me = os.getuid()
    server, lines = _wake_server(wake_dir, api, f"# the cluster's users\ncarol:x:{me}:{me}::/home/carol:/bin/bash\n")
    try:
        assert stat.S_ISSOCK(os.stat(server.path).st_mode) and stat.S_IMODE(os.stat(server.path).st_mode) == 0o666
        replies = _ask(server, b"wake mallory sbatch\n")  # the old line format; the name is a lie
        assert replies[0] == "progress waking the control tier (sbatch by carol on the login pod)", replies
        assert replies[-1] == "ok woken"
        assert "woke the control tier for sbatch by carol on the login pod" in lines
        assert "wake request from carol names the user 'mallory': ignored" in lines
        # the WakeRequested Event (the woken reconcile loop records the awake state with it) names carol
        assert [c[2] for c in api.calls if c[0] == "event"] == ["sbatch by carol on the login pod"]
    finally:
        server.close()
    assert not os.path.exists(server.path)


def test_a_uid_outside_the_cluster_passwd_is_named_by_number(tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("alice:x:2001:2001::/home/alice:/bin/bash\nbroken line\n")
    names = UserNames(str(passwd))
    assert (names.name(2001), names.name(4242), names.name(0)) == ("alice", "uid 4242", "root")
    passwd.write_text("bob:x:4242:4242::/home/bob:/bin/bash\n")
    os.utime(passwd, ns=(1, 1))  # changed: re-read
    assert (names.name(4242), names.name(2001)) == ("bob", "uid 2001")
    assert UserNames(str(tmp_path / "missing")).name(2001) == "uid 2001"


def test_the_wake_socket_caps_connections_and_threads(wake_dir):
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    server, _ = _wake_server(wake_dir, api, max_connections=64, max_per_uid=100, read_timeout=60)
    clients = []
    try:
        threads_before = threading.active_count()
        clients = [_connect(server) for _ in range(100)]  # idle: none sends a request line
        for c in clients[64:]:
            assert c.makefile().readline() == "error busy: too many wake requests (64 in flight); try again\n"
        _wait_for(lambda: server.in_flight == 64, f"64 connections held, not {server.in_flight}")
        assert threading.active_count() - threads_before <= 64
        for c in clients[:64]:  # the admitted ones still wait for their request line
            c.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.recv(1)
        for c in clients:
            c.close()
        _wait_for(lambda: server.in_flight == 0, "the closed connections' slots come back")
        assert _ask(server, b"wake alice sbatch\n")[-1] == "ok woken"  # and the wake still works
        assert [c for c in api.calls if c[0] == "scale"] == [("scale", "StatefulSet", "slurmctld", 1)]
    finally:
        for c in clients:
            c.close()
        server.close()


def test_one_uid_holds_at_most_its_share_of_the_wake_socket(wake_dir):
    server, _ = _wake_server(wake_dir, FakeTierApi(), read_timeout=60)
    clients = [_connect(server) for _ in range(8)]
    try:
        _wait_for(lambda: server.in_flight == 8, "8 connections held")
        with _connect(server) as ninth:
            assert ninth.makefile().readline() == (
                f"error busy: too many wake requests from uid {os.getuid()} (8 in flight); try again\n")
    finally:
        for c in clients:
            c.close()
        server.close()


def test_the_wake_socket_refuses_an_over_long_line_and_drops_a_silent_client(wake_dir):
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=0)
    server, _ = _wake_server(wake_dir, api, read_timeout=0.5)
    try:
        assert _ask(server, b"wake alice " + b"x" * 600 + b"\n") == ["error request line too long (over 512 bytes)"]
        assert _ask(server, b"wake alice " + b"x" * 2000) == ["error request line too long (over 512 bytes)"]
        with _connect(server) as silent:  # sends nothing: dropped after the read timeout, no reply
            assert silent.makefile().read() == ""
        _wait_for(lambda: server.in_flight == 0, "the silent client's slot comes back")
        assert api.calls == []
        assert _ask(server, b"wake alice " + b"y" * 490 + b"\n")[-1] == "ok woken"  # 512 bytes: fine
    finally:
        server.close()


def test_the_wake_script_wakes_through_the_socket(wake_dir):
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld")  # awake
    server, lines = _wake_server(wake_dir, api, f"dave:x:{os.getuid()}:1::/home/dave:/bin/bash\n")
    try:
        assert _run_wake(server.path, "--probe").returncode == 0
        res = _run_wake(server.path, "sbatch")
        assert res.returncode == 0 and res.stderr == "", res.stderr
        api.forbidden.add("list")
        server.agent._awake_at = 0.0  # past the awake cache: the next request asks the API
        res = _run_wake(server.path, "srun")
        assert res.returncode == 1 and res.stderr.startswith("slurmk8s: could not wake the controller: "), res.stderr
        assert _run_wake(server.path, "--background", "ssh-login").returncode == 0
        _wait_for(lambda: any("ssh-login by dave" in line for line in lines), "the background wake's failure logged")
    finally:
        server.close()
    assert _run_wake(server.path, "--probe").returncode == 1


def test_activity_document_says_when_the_count_is_missing_or_stale(tmp_path):
    f = tmp_path / "sessions"
    assert activity_doc(str(f), None, 100)["sessions"] is None
    f.write_text("100 2 alice,bob\n")
    assert activity_doc(str(f), 90.0, 110) == {"sessions": 2, "users": ["alice", "bob"], "updated": 100.0,
                                                  "last_request": 90.0}
    assert "old" in activity_doc(str(f), None, 200)["error"]
    assert activity_from_doc({"sessions": 0, "users": [], "last_request": None}) == (0, (), None, "")
    assert activity_from_doc(None, "no answer")[0] is None


# ---------------------------------------------------------------- manifests


def test_no_idle_teardown_no_agent_no_tier_rbac():
    objs = _objects(_spec())
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Role"} == {m.WORKER_ROLE}
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["login"]
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    assert sts["metadata"]["labels"][m.L_TIER] == "control"
    assert m.L_TIER not in dep["metadata"]["labels"]


@pytest.mark.parametrize("login_sleeps", [False, True])
def test_tier_labels_and_rbac_name_exactly_the_tier(login_sleeps):
    spec = _spec(idle_teardown="30m", login={"sleeps_with_control_tier": login_sleeps})
    objs = _objects(spec)
    for obj in objs:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)
    labelled = [(o["kind"], o["metadata"]["name"]) for o in objs if (o["metadata"].get("labels") or {}).get(m.L_TIER)]
    assert sorted(labelled) == sorted(m.control_tier_workloads(spec))
    assert (("Deployment", "login") in labelled) is login_sleeps
    roles = {o["metadata"]["name"]: o["rules"] for o in objs if o["kind"] == "Role"}
    for name in (m.TIER_ROLE, m.LOGIN_AGENT):
        rules = roles[name]
        writes = [r for r in rules if set(r["verbs"]) & {"patch", "update", "create", "delete"}]
        for r in writes:  # every write is scale of named tier workloads, an Event, the loop's record of
            # the state (its ConfigMap), or (a waker) the delete of slurmctld's pod that the kubelet
            # skipped for its claim; never the workload objects themselves (a pod template)
            assert r["resources"] in (["statefulsets/scale"], ["deployments/scale"], ["events"], ["configmaps"],
                                      ["pods"])
            if r["resources"] != ["events"]:
                assert r["resourceNames"], r
            if r["resources"] == ["configmaps"]:
                assert r["resourceNames"] == [m.TIER_STATE] and name == m.TIER_ROLE, r
        assert not any("secrets" in r["resources"] for r in rules)
        # pods: the agent reads and deletes slurmctld's pod alone (Tier._replace_skipped_pod), the loop none;
        # the agent lists EndpointSlices (slurmctld's published address, controller_listens)
        pods = [r for r in rules if "pods" in r["resources"]]
        assert pods == ([{"apiGroups": [""], "resources": ["pods"], "resourceNames": [m.CONTROLLER_POD],
                          "verbs": ["get", "delete"]}] if name == m.LOGIN_AGENT else []), pods
        slices = [r for r in rules if r["apiGroups"] == ["discovery.k8s.io"]]
        assert slices == ([{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
                          if name == m.LOGIN_AGENT else []), slices
    agent_rules = roles[m.LOGIN_AGENT]
    assert not any(r["resources"] == ["statefulsets"] and "patch" in r["verbs"] for r in agent_rules)
    scale = {n for r in agent_rules if r["resources"][0].endswith("/scale") for n in r["resourceNames"]}
    assert scale == {n for _, n in m.control_tier_workloads(spec)}
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"] == m.LOGIN_AGENT]
    assert binding["subjects"][0]["name"] == m.LOGIN_AGENT


def test_only_the_agent_container_of_the_login_pod_gets_a_token():
    spec = _spec(idle_teardown="30m")
    dep = next(o for o in _objects(spec) if o["kind"] == "Deployment")
    ps = dep["spec"]["template"]["spec"]
    assert ps["automountServiceAccountToken"] is False and ps["serviceAccountName"] == m.LOGIN_AGENT
    login, agent = ps["containers"]
    token_volumes = {v["name"] for v in ps["volumes"] if "projected" in v}
    assert token_volumes == {"agent-token"}
    assert not token_volumes & {v["name"] for v in login["volumeMounts"]}
    assert {v["mountPath"] for v in agent["volumeMounts"]} == {m.SA_TOKEN_DIR, m.ACTIVITY_DIR, m.WAKE_DIR,
                                                                m.USERS_DIR}
    # the wake socket: on an emptyDir the agent writes and the login container only reads (its users
    # connect to the socket but cannot put a file of their own there); no TCP port for it
    wake_volume = next(v for v in ps["volumes"] if v["name"] == "wake")
    assert "emptyDir" in wake_volume
    assert {"name": "wake", "mountPath": m.WAKE_DIR, "readOnly": True} in login["volumeMounts"]
    assert {"name": "wake", "mountPath": m.WAKE_DIR} in agent["volumeMounts"]
    assert agent["command"][agent["command"].index("--wake-socket") + 1] == m.WAKE_SOCKET
    assert [p["containerPort"] for p in agent["ports"]] == [m.ACTIVITY_PORT]
    users = next(v for v in agent["volumeMounts"] if v["name"] == "users")
    assert users["readOnly"] is True and agent["command"][-2:] == ["--users-file", f"{m.USERS_DIR}/passwd"]
    assert agent["securityContext"]["runAsNonRoot"] and agent["securityContext"]["capabilities"]["add"] == []
    assert agent["command"][:2] == ["/usr/bin/tini", "--"]
    activity = next(v for v in agent["volumeMounts"] if v["name"] == "activity")
    assert activity["readOnly"] is True
    sts = next(o for o in _objects(spec) if o["kind"] == "StatefulSet")
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == m.CONTROLLER_GRACE_SECONDS


def test_idle_teardown_below_suspend_time_is_refused():
    with pytest.raises(SpecError, match="idle_teardown is shorter than suspend_time"):
        _spec(idle_teardown=30)


# ---------------------------------------------------------------- the login image's scripts


class _FakeAgent:
    """The agent's line protocol on a Unix socket, answering with canned lines."""

    def __init__(self, path, replies):
        self.replies = replies
        self.requests = []
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.makefile().readline().strip())
                for line in self.replies:
                    conn.sendall((line + "\n").encode())


def _run_wake(sock_path, *args):
    env = {"PATH": os.environ["PATH"], "SLURMK8S_WAKE_SOCKET": str(sock_path)}
    # the image runs it as `/usr/bin/python3 -IS` (its #! line); here the test's interpreter
    return subprocess.run([sys.executable, "-I", "-S", str(IMAGES / "slurmk8s-wake"), *args], capture_output=True,
                          text=True, env=env, timeout=20)


def test_wake_script_prints_progress_and_returns_when_awake(wake_dir):
    agent = _FakeAgent(wake_dir / "a.sock", ["progress waking the control tier (sbatch by alice)", "ok awake"])
    res = _run_wake(agent.path, "sbatch")
    assert res.returncode == 0, res.stderr
    assert res.stderr == "slurmk8s: waking the control tier (sbatch by alice)\n"
    assert agent.requests[0].startswith("wake ") and agent.requests[0].endswith(" sbatch")
    agent = _FakeAgent(wake_dir / "b.sock", ["error statefulset/slurmctld not ready after 300s"])
    res = _run_wake(agent.path, "srun")
    assert res.returncode == 1 and "could not wake the controller: statefulset/slurmctld" in res.stderr


def test_wake_script_without_an_agent_returns_at_once(wake_dir):
    t0 = time.monotonic()
    res = _run_wake(wake_dir / "none.sock", "sbatch")  # no socket: no idle teardown
    assert res.returncode == 0 and res.stderr == "" and time.monotonic() - t0 < 5
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(wake_dir / "dead.sock"))  # a socket nobody listens on (the agent is gone)
    dead.close()
    res = _run_wake(wake_dir / "dead.sock", "sbatch")
    assert res.returncode == 0 and res.stderr == ""
    assert _run_wake(wake_dir / "dead.sock", "--probe").returncode == 1


def test_the_slurm_command_wrapper_skips_the_wake_without_a_socket(wake_dir):
    # /usr/local/bin/sbatch -> slurm-command: no socket, no Python started, straight to /usr/bin/sbatch
    text = (IMAGES / "slurm-command").read_text()
    assert '[ -S "${SLURMK8S_WAKE_SOCKET:-/run/slurmk8s/wake/wake.sock}" ]' in text
    assert (IMAGES / "slurmk8s-wake").read_text().startswith("#!/usr/bin/python3 -IS\n")
    login_sh = (ROOT / "images/entrypoint/login.sh").read_text()
    assert "/dev/tcp/127.0.0.1" not in login_sh and "slurmk8s-wake --probe" in login_sh
    assert f'SLURMK8S_WAKE_SOCKET:-{m.WAKE_SOCKET}' in login_sh


@pytest.mark.skipif(shutil.which("ps") is None, reason="needs procps")
def test_session_count_counts_sshd_sessions_of_cluster_users(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    # an unused uid for "alice" (root can start a process as it): other sshd-session processes on
    # this machine run as other users
    me = os.getuid() if os.getuid() != 0 else 54321
    (users / "passwd").write_text(f"alice:x:{me}:{me}::/home/alice:/bin/bash\nbob:x:{me + 1}:{me + 1}::/x:/bin/sh\n")
    exe_dir = Path(tempfile.mkdtemp(prefix="sshd-fake-"))  # outside pytest's 0700 directory
    exe_dir.chmod(0o755)
    fake = exe_dir / "sshd-session"  # a process whose comm is sshd-session, running as "alice"
    shutil.copy("/bin/sleep", fake)
    fake.chmod(0o755)
    proc = subprocess.Popen([str(fake), "30"], user=me if os.getuid() == 0 else None,
                            group=me if os.getuid() == 0 else None)
    out = tmp_path / "sessions"
    counter = subprocess.Popen(["bash", str(IMAGES / "session-count"), str(out)],
                               env={"PATH": os.environ["PATH"], "SLURMK8S_USERS_DIR": str(users),
                                    "SLURMK8S_ACTIVITY_PERIOD": "0.2"})
    try:
        deadline = time.monotonic() + 10
        got = None
        while time.monotonic() < deadline:
            got = read_activity_file(str(out))
            if got and got[1] >= 1:
                break
            time.sleep(0.1)
        assert got is not None and got[1] == 1 and got[2] == ("alice",), got
        assert abs(got[0] - time.time()) < 5
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = read_activity_file(str(out))
            if got and got[1] == 0:
                break
            time.sleep(0.1)
        assert got is not None and got[1] == 0 and got[2] == ()
    finally:
        counter.kill()
        proc.kill()
        shutil.rmtree(exe_dir, ignore_errors=True)


# ---------------------------------------------------------------- slurmk8s submit / ssh


def test_user_cli_addresses_namespaces_and_ssh_argv(tmp_path):
    from provisioner import usercli

    assert usercli._split("10.0.0.5") == ("10.0.0.5", 22)
    assert usercli._split("localhost:2222") == ("localhost", 2222)
    with pytest.raises(usercli.UserError, match="HOST\\[:PORT\\]"):
        usercli._split("host:ssh")
    with pytest.raises(usercli.UserError, match="--spec SPEC.yaml or --namespace"):
        usercli.namespace_of(None, None)
    assert usercli.namespace_of(None, "slurm-x") == "slurm-x"
    assert usercli.namespace_of(ROOT / "examples" / "local.yaml", None) == "slurm-local"
    ssh = usercli.Ssh("10.0.0.5", 2222, "alice", Path("/k"), None, insecure=True)
    assert ssh.ssh_argv(["squeue", "-u", "alice"]) == [
        "ssh", "-p", "2222", "-i", "/k", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "--", "alice@10.0.0.5", "squeue", "-u", "alice"]
    assert usercli.Ssh("h", 22, "bob", None, tmp_path / "kh", False).ssh_argv([]) == [
        "ssh", "-p", "22", "-o", f"UserKnownHostsFile={tmp_path / 'kh'}", "--", "bob@h"]


def test_a_sleep_that_fails_before_slurmctld_records_awake_again():
    api = _full_tier()
    tier, _ = _tier(api)
    orig = api.scale

    def scale(ns, kind, name, replicas):
        if name == "slurmctld":
            from provisioner.kubeapi import ApiError
            raise ApiError(403, "Forbidden", "statefulsets/scale slurmctld")
        orig(ns, kind, name, replicas)

    api.scale = scale
    with pytest.raises(TierError, match="RBAC"):
        tier.sleep_tier("idle", recheck=lambda: "", controller_stopped=lambda: True)
    assert api.workloads[("Deployment", "login")]["spec"]["replicas"] == 1
    ann = api.state
    assert ann[A_STATE] == "awake" and ann[A_REASON].startswith("sleep failed: cannot scale statefulset/slurmctld")


def test_idle_watch_is_off_without_idle_teardown_or_a_readable_spec(tmp_path):
    import json as _json

    from provisioner.logs import Log
    from provisioner.reconcile.idle import idle_watch_from_env
    from provisioner.slurm.commands import SlurmCli

    log = Log("test", str(tmp_path / "r.log"))
    spec = tmp_path / "spec.json"
    spec.write_text(_json.dumps(_spec().model_dump(mode="json")))
    assert idle_watch_from_env({"SLURMK8S_SPEC": str(spec)}, log, SlurmCli(), lambda: None) is None
    assert idle_watch_from_env({"SLURMK8S_SPEC": str(tmp_path / "missing.json")}, log, SlurmCli(),
                               lambda: None) is None
    assert any("idle teardown off: cannot read the spec" in line for line in log.lines)
    spec.write_text(_json.dumps({"name": "x"}))  # invalid spec: off, said why, no crash
    assert idle_watch_from_env({"SLURMK8S_SPEC": str(spec)}, log, SlurmCli(), lambda: None) is None


class _Result:
    def __init__(self, code: int, out: str = "", err: str = "") -> None:
        self.exit_status, self.stdout, self.stderr = code, out, err


class _Login:
    """asyncssh.connect as the login pod answers it: `script` maps a command's first word to what it
    does on each call (a _Result, or an exception to raise); every command is recorded with when."""

    def __init__(self, script: dict) -> None:
        self.script, self.ran, self.connects = script, [], 0

    def connect(self, host, **_opts):
        login = self

        class Conn:
            async def run(self, cmd, input=None, check=False):
                word = cmd.split()[0]
                login.ran.append((word, time.monotonic()))
                answers = login.script[word]
                answer = answers.pop(0) if len(answers) > 1 else answers[0]
                if isinstance(answer, Exception):
                    raise answer
                return answer

        class Ctx:
            async def __aenter__(self):
                login.connects += 1
                return Conn()

            async def __aexit__(self, *exc):
                return False

        return Ctx()


class _Waking:
    def __init__(self) -> None:
        import threading

        self.scaled, self.error = threading.Event(), None

    def check(self) -> None:
        if self.error is not None:
            raise self.error


def _ssh(monkeypatch, script):
    import asyncssh

    from provisioner import usercli

    login = _Login(script)
    monkeypatch.setattr(asyncssh, "connect", login.connect)
    return usercli.Ssh("10.0.0.5", 22, "alice", None, None, insecure=True), login


UP = _Result(0, "Slurmctld(primary) at slurmctld-0 is UP\n")


def test_submit_asks_slurmctld_only_after_the_wake_has_scaled(monkeypatch):
    """A ping before the scale could reach a slurmctld that a sleep under way is about to stop."""
    import threading

    ssh, login = _ssh(monkeypatch, {"scontrol": [UP], "sbatch": [_Result(0, "42\n")]})
    waking = _Waking()
    threading.Timer(0.3, waking.scaled.set).start()
    t0 = time.monotonic()
    assert ssh.submit("#!/bin/sh\n", [], 30, waking=waking) == "42"
    assert [w for w, _ in login.ran] == ["scontrol", "sbatch"]
    assert login.ran[0][1] - t0 >= 0.3


def test_submit_reports_the_failed_wake_rather_than_the_silent_controller(monkeypatch):
    from provisioner import usercli

    down = _Result(1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")
    ssh, login = _ssh(monkeypatch, {"scontrol": [down], "sbatch": [_Result(0, "42\n")]})
    waking = _Waking()
    waking.scaled.set()
    waking.error = usercli.UserError("statefulset/slurmctld not ready after 300s: ImagePullBackOff")
    with pytest.raises(usercli.UserError, match="ImagePullBackOff"):
        ssh.submit("#!/bin/sh\n", [], 30, waking=waking)
    assert "sbatch" not in [w for w, _ in login.ran]


def test_a_connection_lost_before_sbatch_is_retried_but_never_after(monkeypatch):
    import asyncssh

    from provisioner import usercli

    closed = asyncssh.ChannelOpenError(2, "SSH connection closed")
    ssh, login = _ssh(monkeypatch, {"scontrol": [closed, UP], "sbatch": [_Result(0, "7\n")]})
    assert ssh.submit("#!/bin/sh\n", [], 30) == "7" and login.connects == 2  # the login pod was replaced
    ssh, login = _ssh(monkeypatch, {"scontrol": [UP], "sbatch": [asyncssh.ConnectionLost("reset")]})
    with pytest.raises(usercli.UserError, match="may have been submitted: look with squeue"):
        ssh.submit("#!/bin/sh\n", [], 30)
    assert [w for w, _ in login.ran].count("sbatch") == 1  # never twice

