"""Where the control tier keeps its sleep / wake state: the ConfigMap slurmk8s-tier-state, whose
annotations slurmctld's account may patch by name, not the slurmctld StatefulSet (whose `patch`
would let that account rewrite slurmctld's pod template past the worker admission policy). A
cluster upgraded from a release that annotated the StatefulSet reads those annotations once, while
the ConfigMap has no state yet."""

from __future__ import annotations

import pytest
from fakes.tier import FakeTierApi

from provisioner import manifests as m
from provisioner import status as st
from provisioner.config import parse_spec
from provisioner.controltier.decision import A_REASON, A_SINCE, A_STATE, TierError, tier_state
from provisioner.controltier.tier import Tier
from provisioner.kubeapi import ApiError
from provisioner.manifests.rbac import control_tier_objects

CTLD = ("StatefulSet", "slurmctld")


def _tier(api: FakeTierApi) -> tuple[Tier, list[str]]:
    lines: list[str] = []
    return Tier(api, "slurm-t", "slurmk8s-reconcile", log=lines.append, clock=lambda: 1000.0,
                sleep=lambda _s: None, poll=0.0), lines


def _api(replicas: int = 1, **old: str) -> FakeTierApi:
    api = FakeTierApi()
    api.add("StatefulSet", "slurmctld", "slurmctld", replicas=replicas, annotations=old)
    return api


def test_sleep_and_wake_write_the_state_config_map_and_never_the_statefulset():
    api = _api()
    tier, _ = _tier(api)
    assert tier.sleep_tier("idle for 60s", recheck=lambda: "", controller_stopped=lambda: True)
    assert api.state[A_STATE] == "asleep" and api.state[A_REASON] == "idle for 60s" and api.state[A_SINCE].endswith("Z")
    assert api.workloads[CTLD]["metadata"]["annotations"] == {}, "the StatefulSet object was written"
    assert not [c for c in api.calls if c[0] == "annotate"], "patched the StatefulSet object"
    assert tier_state(tier.workloads()) == "asleep"
    api.scale("slurm-t", "StatefulSet", "slurmctld", 1)
    assert tier.on_controller_start() == "recorded awake (slurmctld started (no wake request recorded))"
    assert api.state[A_STATE] == "awake" and api.workloads[CTLD]["metadata"]["annotations"] == {}


def test_a_cluster_upgraded_while_asleep_reads_the_old_annotations_once():
    """Asleep under a release that annotated the StatefulSet: the new ConfigMap is empty. The wake
    finds it asleep, the woken loop names the wake request (its time after the old `since`) and
    records awake in the ConfigMap; from then on the stale annotations (which slurmctld's account
    can no longer remove) are not read."""
    api = _api(replicas=0, **{A_STATE: "asleep", A_REASON: "idle for 600s", A_SINCE: "1970-01-01T00:10:00Z"})
    tier, _ = _tier(api)
    assert api.state == {}
    assert tier_state(tier.workloads()) == "asleep", "the old annotation was not read"
    assert tier.wake("ssh alice", timeout=30)
    assert [e["reason"] for e in api.events] == ["WakeRequested"]
    assert tier.on_controller_start() == "recorded awake (ssh alice)"
    assert api.state[A_STATE] == "awake" and api.state[A_REASON] == "woken: ssh alice"
    assert api.workloads[CTLD]["metadata"]["annotations"][A_STATE] == "asleep"  # left as it was
    assert tier_state(tier.workloads()) == "awake", "the stale annotation won over the ConfigMap"
    assert tier.on_controller_start() == "already recorded awake"


def test_a_tier_state_config_map_not_deployed_yet_falls_back_to_the_annotations():
    api = _api(**{A_STATE: "asleep"})
    api.state = None  # a cluster deployed by a release without it: 404
    tier, _ = _tier(api)
    assert tier_state(tier.workloads()) == "asleep"


def test_controller_account_may_scale_and_record_state_but_not_patch_its_statefulset():
    spec = parse_spec({"name": "zz", "pools": [{"name": "cpu", "node_selector": {"kubernetes.io/os": "linux"}}],
                       "elasticity": {"suspend_time": 60, "idle_teardown": "30m"}, "rest": {"enabled": True}})
    rules = m.control_tier_role(spec)["rules"] + m.worker_role(spec)["rules"]
    writes = {"patch", "update", "create", "delete", "deletecollection", "*"}
    for r in rules:
        if "apps" in r["apiGroups"]:
            assert not (set(r["resources"]) & {"statefulsets", "deployments", "*"} and set(r["verbs"]) & writes), r
    scale = [r for r in rules if r["resources"] == ["statefulsets/scale"]]
    assert scale and "slurmctld" in scale[0]["resourceNames"] and "patch" in scale[0]["verbs"]
    state = [r for r in rules if r["resources"] == ["configmaps"] and m.TIER_STATE in r.get("resourceNames", ())]
    assert state == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [m.TIER_STATE],
                      "verbs": ["get", "patch"]}]
    for waker in (m.login_agent_role(spec), m.rest_front_role(spec)):
        assert {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [m.TIER_STATE],
                "verbs": ["get"]} in waker["rules"], waker["metadata"]["name"]
    cms = [o for o in control_tier_objects(spec) if o["kind"] == "ConfigMap"]
    assert [o["metadata"]["name"] for o in cms] == [m.TIER_STATE]
    assert "data" not in cms[0] and "annotations" not in cms[0]["metadata"], \
        "the deploy would own (and reset) the state the loop records"


def test_status_reads_the_state_config_map_before_the_old_annotations():
    sts = {"metadata": {"name": "slurmctld", "annotations": {st.A_STATE: "asleep"}},
           "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    assert st.controller_state(sts).state == "starting"  # old annotation, no ConfigMap state
    now = st.controller_state(sts, {st.A_STATE: "awake", st.A_STATE_REASON: "woken: ssh alice"})
    assert (now.state, now.reason) == ("awake", "woken: ssh alice")


def test_an_identity_that_may_not_read_the_state_wakes_and_says_so_once():
    """A user's kubeconfig with the wake rights documented before the ConfigMap: the wake goes on
    (the state only makes it wait for a sleep under way), and says once what to grant. Any other
    error reading it is the wake's error."""
    api = _api(replicas=0)
    api.forbidden = {"get_state"}
    tier, lines = _tier(api)
    assert tier.wake("slurmk8s submit by alice", timeout=30)
    refusals = [line for line in lines if "cannot read configmap/slurmk8s-tier-state" in line]
    assert len(refusals) == 1 and "grant get on it" in refusals[0], lines

    def etcd_away(namespace):
        raise ApiError(500, "InternalError", "etcdserver: request timed out")

    api.forbidden = set()
    api.get_state = etcd_away
    with pytest.raises(TierError, match="cannot read the control tier's state"):
        tier.workloads()
