"""Pool images (docs/pool-images.md): the check `slurmk8s up` runs before it applies anything
(provisioner/deploy/imagecheck.py) on pod objects shaped as the API server returns them, with a fake
API standing in for the cluster, and the image definitions that check relies on (labels, the
identify program, the entrypoints' hook)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest

import provisioner
from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.deploy import imagecheck as ic
from provisioner.kubeapi import ApiError

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"name": "pi", "pools": [{"name": "cpu"}, {"name": "bio", "image": "lab/bio:1"},
                                {"name": "bio2", "image": "lab/bio:1"}, {"name": "db", "image": "slurmk8s/mariadb:dev"}]}


def spec_of(**changes):
    return parse_spec({**copy.deepcopy(SPEC), **changes})


def identify_log(image="slurmd", interface=str(ic.IMAGE_INTERFACE), version="0.1.0", slurm="24.11.5", args="", missing=""):
    return (f"slurmk8s-identify: image={image}\nslurmk8s-identify: interface={interface}\n"
            f"slurmk8s-identify: version={version}\nslurmk8s-identify: slurm={slurm}\n"
            f"slurmk8s-identify: args={args}\nslurmk8s-identify: missing={missing}\nslurmk8s-identify: end\n")


# ---------------------------------------------------------------- pods as the API returns them


def pod_terminated(code=0, reason="Completed", message=None):
    term = {"exitCode": code, "reason": reason, "startedAt": "2025-01-01T00:00:00Z"}
    if message:
        term["message"] = message
    return {"spec": {"nodeName": "localk8s"}, "status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "identify", "ready": False, "restartCount": 0, "state": {"terminated": term}}]}}


def pod_waiting(reason, message=""):
    return {"spec": {"nodeName": "localk8s"}, "status": {"phase": "Pending", "containerStatuses": [
        {"name": "identify", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": reason, "message": message}}}]}}


def pod_running():
    return {"spec": {"nodeName": "localk8s"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "identify", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "x"}}}]}}


POD_UNSCHEDULABLE = {"spec": {}, "status": {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/1 nodes are available: 1 Insufficient memory."}]}}


class FakeCheckApi:
    """Pods in memory: each image follows a script of (pod status, log) looks, the last one repeating;
    create/get/log/delete with the API server's 404s; every call recorded."""

    def __init__(self, scripts, *, config_maps=(), login=None, forbid_create=False):
        self.scripts = scripts  # image -> [(pod, log), ...]
        self.pods = {}  # (ns, name) -> {"body", "looks"}
        self.calls = []
        self._config_maps = list(config_maps)
        self._login = login
        self.forbid_create = forbid_create

    def create(self, namespace, body):
        self.calls.append(("create", namespace, body["metadata"]["name"]))
        if self.forbid_create:
            raise ApiError(403, "Forbidden", 'pods "x" is forbidden: violates PodSecurity "restricted:latest"')
        self.pods[(namespace, body["metadata"]["name"])] = {"body": copy.deepcopy(body), "looks": 0}
        return body

    def _pod(self, namespace, name):
        if (namespace, name) not in self.pods:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return self.pods[(namespace, name)]

    def _step(self, entry):
        script = self.scripts[entry["body"]["spec"]["containers"][0]["image"]]
        return script[min(entry["looks"], len(script) - 1)]

    def get(self, namespace, name):
        self.calls.append(("get", namespace, name))
        entry = self._pod(namespace, name)
        pod, _ = self._step(entry)
        entry["looks"] += 1
        return {**copy.deepcopy(entry["body"]), **copy.deepcopy(pod),
                "spec": {**entry["body"]["spec"], **pod.get("spec", {})}}

    def log(self, namespace, name):
        self.calls.append(("log", namespace, name))
        entry = self._pod(namespace, name)
        entry["looks"] -= 1
        _, log = self._step(entry)
        entry["looks"] += 1
        return log

    def delete(self, namespace, name):
        self.calls.append(("delete", namespace, name))
        self._pod(namespace, name)
        del self.pods[(namespace, name)]

    def config_maps(self, namespace, selector):
        self.calls.append(("config_maps", namespace, selector))
        return self._config_maps

    def deployment(self, namespace, name):
        self.calls.append(("deployment", namespace, name))
        return self._login


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def run_check(spec, api, *, namespace_exists=True, local=True, env=None):
    clock, lines = Clock(), []
    err = None
    try:
        ic.check(spec, api, lines.append, namespace_exists=namespace_exists, local=local, env=env or {},
                 clock=clock, sleep=clock.sleep, stamp="1")
    except ic.ImageCheckError as exc:
        err = exc
    return err, lines, clock


GOOD = [(pod_running(), None), (pod_terminated(0), identify_log())]
GOOD_LOGIN = [(pod_terminated(0), identify_log(image="login"))]
MARIADB = [(pod_terminated(0), identify_log(image="mariadb", slurm=""))]


# ---------------------------------------------------------------- which images, how the pod looks


def test_distinct_images_each_with_the_spec_fields_that_name_them():
    wants = ic.wanted(spec_of())
    assert [(w.image, w.role, w.field) for w in wants] == [
        ("slurmk8s/slurmd:dev", "slurmd", "images.worker"),
        ("lab/bio:1", "slurmd", "pools[bio].image, pools[bio2].image"),
        ("slurmk8s/mariadb:dev", "slurmd", "pools[db].image"),
        ("slurmk8s/login:dev", "login", "images.login")]
    no_login = ic.wanted(spec_of(login={"enabled": False}), {"slurmd": {"slurmk8s/slurmd:dev", "lab/bio:1"}})
    assert [w.image for w in no_login] == ["slurmk8s/mariadb:dev"]


def test_images_the_cluster_runs_already_come_from_the_pool_templates_and_the_login_deployment():
    spec = spec_of()
    cms = [m.worker_template_config_map(spec, spec.pool("bio")),
           {"metadata": {"name": "slurm-config"}, "data": {"pod.json": json.dumps({"spec": {"containers": [
               {"image": "not/a-template"}]}})}}]
    login = {"spec": {"template": {"spec": {"containers": [{"name": "login", "image": "slurmk8s/login:dev"},
                                                          {"name": "login-agent", "image": "slurmk8s/slurmctld:dev"}]}}}}
    assert ic.in_use_from(cms, login) == {"slurmd": {"lab/bio:1"}, "login": {"slurmk8s/login:dev"}}
    assert ic.in_use_from([], None) == {"slurmd": set(), "login": set()}


def test_a_template_written_for_another_image_interface_has_its_images_checked_again():
    """An upgrade to a new entrypoint contract: a pool image the cluster runs is checked again (and
    refused if it was built on an older slurmd image), not waved through as already in use."""
    spec = spec_of()
    current = m.worker_template_config_map(spec, spec.pool("bio"))
    assert current["metadata"]["annotations"] == {"slurmk8s.io/image-interface": str(ic.IMAGE_INTERFACE)}
    older = json.loads(json.dumps(current))
    older["metadata"]["annotations"]["slurmk8s.io/image-interface"] = str(ic.IMAGE_INTERFACE - 1)
    before = json.loads(json.dumps(current))
    del before["metadata"]["annotations"]  # written before templates recorded it
    for template in (older, before):
        in_use = ic.in_use_from([template], None)
        assert in_use["slurmd"] == set()
        assert "lab/bio:1" in [w.image for w in ic.wanted(spec, in_use)]


def test_the_check_pod_runs_the_image_as_the_worker_does_with_only_the_identify_request_added():
    spec = spec_of(images={"pull_policy": "Never"})
    want = ic.wanted(spec)[1]
    pod = ic.check_pod(spec, want, "slurmk8s-image-check-1-1", "slurm-pi")
    c = pod["spec"]["containers"][0]
    worker = m.worker_pod_template(spec, spec.pool("bio"))["spec"]["containers"][0]
    assert "command" not in c and "args" not in c, "the image's own ENTRYPOINT and CMD, as in the worker pod"
    assert c["image"] == worker["image"] == "lab/bio:1" and c["imagePullPolicy"] == worker["imagePullPolicy"] == "Never"
    assert c["securityContext"] == worker["securityContext"]
    assert c["env"] == [{"name": "SLURMK8S_IDENTIFY", "value": "1"}]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["automountServiceAccountToken"] is False
    assert "volumes" not in pod["spec"], "no Secret, no claim: it needs nothing of the cluster"
    assert pod["metadata"]["labels"][m.L_COMPONENT] == "image-check"
    assert pod["metadata"]["namespace"] == "slurm-pi"


# ---------------------------------------------------------------- one look, the identity, the verdict


@pytest.mark.parametrize("pod, state", [
    (pod_terminated(0), ("done", "exit 0")),
    (pod_terminated(1, "Error"), ("done", "exit 1")),
    (pod_waiting("ErrImageNeverPull", 'Container image "lab/x:1" is not present with pull policy of Never'),
     ("never", 'ErrImageNeverPull: Container image "lab/x:1" is not present with pull policy of Never')),
    (pod_waiting("ImagePullBackOff", 'Back-off pulling image "lab/x:1"'),
     ("pull", 'ImagePullBackOff: Back-off pulling image "lab/x:1"')),
    (pod_waiting("ContainerCreating"), ("pending", "pulling or starting")),
    (pod_terminated(128, "StartError", 'exec: "/usr/bin/tini": stat /usr/bin/tini: no such file or directory'),
     ("start", 'StartError: exec: "/usr/bin/tini": stat /usr/bin/tini: no such file or directory')),
    (pod_running(), ("running", "")),
    (POD_UNSCHEDULABLE, ("unschedulable", "0/1 nodes are available: 1 Insufficient memory.")),
    ({"spec": {}, "status": {"phase": "Pending"}}, ("pending", "being scheduled")),
])
def test_a_look_at_a_check_pod(pod, state):
    assert ic.look(pod) == state


def test_the_identity_is_read_from_the_log_whatever_else_it_holds():
    log = "2025-01-01T00:00:00Z [slurmk8s-slurmd] something\n" + identify_log(args="bash -l",
                                                                              missing="/usr/sbin/slurmd,user slurm")
    assert ic.parse_identify(log) == ic.Identity("slurmd", ic.IMAGE_INTERFACE, "0.1.0", "24.11.5", "bash -l",
                                                 ("/usr/sbin/slurmd", "user slurm"))
    assert ic.parse_identify("hello\n") is None


def test_waiting_is_bounded_per_state():
    assert ic.outcome("running", "", 5, waited=6) is None
    assert ic.outcome("running", "", 20, waited=21).kind == "running"
    assert ic.outcome("pull", "ErrImagePull: x", 10, waited=12) is None
    assert ic.outcome("pull", "ErrImagePull: x", 0, waited=1, pull_bound=0).kind == "pull"
    assert ic.outcome("never", "ErrImageNeverPull: x", 0, waited=1).kind == "never"
    assert ic.outcome("pending", "pulling or starting", 299, waited=299) is None, "a large image may pull long"
    assert ic.outcome("pending", "pulling or starting", 300, waited=300).kind == "timeout"


def verdict_of(image, kind, detail="", identity=None, field="pools[db].image", role="slurmd", local=True):
    want = ic.Want(image, role, (field,))
    return ic.verdict(want, ic.Outcome(kind, detail, identity, 1.0), base="slurmk8s/slurmd:dev", local=local)


def test_another_slurmk8s_image_is_refused_naming_what_it_is():
    issue, _ = verdict_of("slurmk8s/mariadb:dev", "identified", identity=ic.parse_identify(identify_log("mariadb")))
    assert str(issue) == (
        "pools[db].image: slurmk8s/mariadb:dev is not a slurmk8s worker image: it identified itself as the slurmk8s "
        "mariadb image (image=mariadb). Fix: build it FROM slurmk8s/slurmd:dev (the entrypoint, "
        "/usr/local/sbin/slurmk8s-identify and the org.slurmk8s.* labels come with it; add only packages and "
        "files), load or push it, see docs/pool-images.md")
    # the same image built before the identity: its entrypoint ran and died on the missing munge key
    old = ("2025-01-01T00:00:00Z [slurmk8s-mariadb] starting mariadb\n2025-01-01T00:00:00Z [slurmk8s-mariadb] FATAL: "
           "database password not found at /etc/slurmk8s/db/password")
    issue, _ = verdict_of("slurmk8s/mariadb:dev", "exited", detail="exit 1: " + old.replace("\n", " | "))
    assert issue.message == ("slurmk8s/mariadb:dev is not a slurmk8s worker image: its entrypoint logs as "
                             "slurmk8s-mariadb, i.e. it is the slurmk8s mariadb image")


def test_a_foreign_image_is_refused_whatever_it_does():
    issue, _ = verdict_of("debian:trixie-slim", "exited", detail="exit 0, no output")
    assert issue.message == ("debian:trixie-slim is not a slurmk8s worker image (no /usr/local/sbin/slurmk8s-identify "
                             "answered SLURMK8S_IDENTIFY=1; it ended with exit 0, no output)")
    issue, _ = verdict_of("nginx:1", "running", detail="still running after 20s")
    assert "its entrypoint kept running, still running after 20s" in issue.message
    issue, _ = verdict_of("lab/x:1", "start", detail="StartError: exec: no such file")
    assert issue.message == "lab/x:1 is not a slurmk8s worker image: the container cannot start (StartError: exec: no such file)"


def test_an_image_the_cluster_cannot_pull_is_only_warned_about_with_the_way_to_get_it_there():
    # the check pod may run on a node that pulls differently from the pool's: nothing is known of the image
    issue, line = verdict_of("lab/x:1", "never", detail="ErrImageNeverPull: not present")
    assert issue is None
    assert line == ("warning: pools[db].image: the cluster cannot pull lab/x:1 (ErrImageNeverPull: not present), so "
                    "it was not checked; worker pods on it will not start either. Fix: load it into the local "
                    "cluster: `slurmk8s cluster load-image lab/x:1`")
    issue, line = verdict_of("lab/x:1", "pull", detail="ImagePullBackOff: ...", local=False)
    assert issue is None and "Fix: push it to a registry the cluster's nodes pull from" in line
    issue, line = verdict_of("lab/x:1", "timeout", detail="pending: pulling or starting")
    assert issue is None and line.startswith("warning: pools[db].image: the check of lab/x:1 did not finish")


def test_a_derived_image_that_lost_part_of_the_worker_or_sets_cmd_is_refused():
    missing = ic.parse_identify(identify_log(missing="/usr/bin/python3,user slurm with uid 64030"))
    issue, _ = verdict_of("lab/bio:1", "identified", identity=missing)
    assert issue.message == ("lab/bio:1 is a slurmk8s slurmd image but lacks what a worker needs: /usr/bin/python3, "
                             "user slurm with uid 64030")
    issue, _ = verdict_of("lab/bio:1", "identified", identity=ic.parse_identify(identify_log(args="bash")))
    assert issue.message == "lab/bio:1 sets CMD ('bash'), which the entrypoint would append to slurmd's command line"
    issue, _ = verdict_of("lab/bio:1", "identified", identity=ic.parse_identify(identify_log(interface="5")))
    assert "speaks slurmk8s image interface 5, this slurmk8s speaks 4" in issue.message
    # interface 3: no worker Epilog, which slurm.conf names (every job would fail its node)
    issue, _ = verdict_of("lab/bio:1", "identified", identity=ic.parse_identify(identify_log(interface="3")))
    assert "speaks slurmk8s image interface 3, this slurmk8s speaks 4" in issue.message
    # interface 2: its entrypoint starts slurmd without asking the boot gate (elastic/bootgate.py)
    issue, _ = verdict_of("lab/bio:1", "identified", identity=ic.parse_identify(identify_log(interface="2")))
    assert "speaks slurmk8s image interface 2, this slurmk8s speaks 4" in issue.message


def test_a_worker_image_passes_and_one_from_before_the_identity_is_accepted_with_a_note():
    issue, line = verdict_of("lab/bio:1", "identified", identity=ic.parse_identify(identify_log()))
    assert issue is None and line == "lab/bio:1: slurmk8s slurmd image (interface 4, slurmk8s 0.1.0, Slurm 24.11.5)"
    issue, line = verdict_of("slurmk8s/slurmd:old", "exited",
                             detail="exit 1: 2025 [slurmk8s-slurmd] FATAL: set SLURMK8S_CONTROLLER (configless)")
    assert issue is None and "from before image identity" in line
    issue, _ = verdict_of("slurmk8s/slurmd:dev", "identified", identity=ic.parse_identify(identify_log()),
                          role="login", field="images.login")
    assert issue.message == ("slurmk8s/slurmd:dev is not a slurmk8s login image: it identified itself as the slurmk8s "
                             "slurmd image (image=slurmd)")


# ---------------------------------------------------------------- the whole check against a fake API


def test_up_refuses_the_pool_on_a_database_image_after_checking_all_images_at_once_and_deletes_every_pod():
    spec = spec_of()
    api = FakeCheckApi({"slurmk8s/slurmd:dev": GOOD, "lab/bio:1": GOOD, "slurmk8s/mariadb:dev": MARIADB,
                        "slurmk8s/login:dev": GOOD_LOGIN})
    err, lines, _ = run_check(spec, api)
    assert err is not None
    assert str(err) == (
        "the spec names images that cannot serve their role (nothing was applied): pools[db].image: "
        "slurmk8s/mariadb:dev is not a slurmk8s worker image: it identified itself as the slurmk8s mariadb image "
        "(image=mariadb). Fix: build it FROM slurmk8s/slurmd:dev (the entrypoint, /usr/local/sbin/slurmk8s-identify "
        "and the org.slurmk8s.* labels come with it; add only packages and files), load or push it, see "
        "docs/pool-images.md")
    creates = [i for i, c in enumerate(api.calls) if c[0] == "create"]
    first_get = next(i for i, c in enumerate(api.calls) if c[0] == "get")
    assert len(creates) == 4 and max(creates) < first_get, "all check pods start before the first is looked at"
    assert {c[1] for c in api.calls if c[0] == "create"} == {"slurm-pi"}
    assert api.pods == {}, "no check pod stays behind"
    assert lines[0].startswith("image check: 4 image(s) in pod(s) in namespace slurm-pi: slurmk8s/slurmd:dev "
                               "(images.worker), lab/bio:1 (pools[bio].image, pools[bio2].image)")
    assert "image check: lab/bio:1: slurmk8s slurmd image (interface 4, slurmk8s 0.1.0, Slurm 24.11.5) (0.5s)" in lines


def test_before_the_namespace_exists_the_check_runs_in_default_and_reads_nothing_of_the_cluster():
    api = FakeCheckApi({"slurmk8s/slurmd:dev": GOOD, "lab/bio:1": GOOD, "slurmk8s/login:dev": GOOD_LOGIN})
    err, _, _ = run_check(spec_of(pools=[{"name": "cpu"}, {"name": "bio", "image": "lab/bio:1"}]), api,
                          namespace_exists=False)
    assert err is None
    assert {c[1] for c in api.calls} == {"default"}
    assert not [c for c in api.calls if c[0] in ("config_maps", "deployment")]


def test_images_the_cluster_already_runs_are_not_checked_again():
    spec = spec_of(pools=[{"name": "cpu"}, {"name": "bio", "image": "lab/bio:1"}])
    cms = [m.worker_template_config_map(spec, spec.pool("cpu")), m.worker_template_config_map(spec, spec.pool("bio"))]
    login = {"spec": {"template": {"spec": {"containers": [{"name": "login", "image": "slurmk8s/login:dev"}]}}}}
    api = FakeCheckApi({}, config_maps=cms, login=login)
    err, lines, _ = run_check(spec, api)
    assert err is None and lines == []
    assert [c[0] for c in api.calls] == ["config_maps", "deployment"]
    assert api.calls[0][2] == "slurmk8s.io/cluster=pi,app.kubernetes.io/component=worker"


def test_a_pull_that_fails_on_the_local_cluster_is_a_warning_at_once_and_up_goes_on():
    api = FakeCheckApi({"lab/typo:1": [(pod_waiting("ErrImagePull", "failed to resolve reference"), None)]},
                       login=None)
    spec = spec_of(pools=[{"name": "bio", "image": "lab/typo:1"}], login={"enabled": False})
    err, lines, clock = run_check(spec, api)
    assert err is None
    assert lines[-1].startswith("warning: pools[bio].image: the cluster cannot pull lab/typo:1 (ErrImagePull: failed "
                                "to resolve reference)")
    assert lines[-1].endswith("Fix: load it into the local cluster: `slurmk8s cluster load-image lab/typo:1`")
    assert clock.now < 2 and api.pods == {}


def test_an_image_that_keeps_running_is_refused_after_the_bound_with_progress_shown():
    api = FakeCheckApi({"nginx:1": [(pod_waiting("ContainerCreating"), None)] * 10 + [(pod_running(), None)]})
    spec = spec_of(pools=[{"name": "web", "image": "nginx:1"}], login={"enabled": False})
    err, lines, clock = run_check(spec, api, local=False)
    assert err.issues[0].field == "pools[web].image"
    assert "its entrypoint kept running" in err.issues[0].message
    assert ic.RUN_BOUND <= clock.now < ic.RUN_BOUND + 10
    assert any(line.startswith("image check: waiting (10s): nginx:1 running") for line in lines)
    assert api.pods == {}


def test_a_check_pod_the_namespace_refuses_leaves_the_image_unchecked_with_a_warning():
    """No right to create pods there (`default` before the namespace exists), a quota, a Pod Security
    level: the deployer is told, the `up` goes on (the image is as unknown as before the check)."""
    api = FakeCheckApi({}, forbid_create=True)
    err, lines, _ = run_check(spec_of(pools=[{"name": "bio", "image": "lab/bio:1"}]), api)
    assert err is None
    warned = [line for line in lines if line.startswith("warning: pools[bio].image: lab/bio:1 not checked")]
    assert warned and "violates PodSecurity" in warned[0] and "SLURMK8S_SKIP_IMAGE_CHECK=1" in warned[0]


def test_the_check_can_be_skipped():
    api = FakeCheckApi({})
    err, lines, _ = run_check(spec_of(), api, env={"SLURMK8S_SKIP_IMAGE_CHECK": "1"})
    assert err is None and api.calls == [] and lines == ["image check: skipped (SLURMK8S_SKIP_IMAGE_CHECK=1)"]


# ---------------------------------------------------------------- preview: the labels


def test_preview_judges_the_labels_of_the_local_docker_engine_copy():
    labels = {"slurmk8s/slurmd:dev": {"org.slurmk8s.image": "slurmd", "org.slurmk8s.interface": str(ic.IMAGE_INTERFACE)},
              "lab/bio:1": {"org.slurmk8s.image": "slurmd", "org.slurmk8s.interface": str(ic.IMAGE_INTERFACE),
                            "lab": "x"},
              "slurmk8s/mariadb:dev": {"org.slurmk8s.image": "mariadb"},
              "slurmk8s/login:dev": {"org.slurmk8s.image": "login"}}
    lines = []
    with pytest.raises(ic.ImageCheckError) as exc:
        ic.preview_check(spec_of(), FakeCheckApi({}), lines.append, namespace_exists=False, labels_of=labels.get)
    assert [str(i) for i in exc.value.issues] == [
        "pools[db].image: slurmk8s/mariadb:dev is not a slurmk8s worker image: it is the slurmk8s mariadb image "
        "(org.slurmk8s.image=mariadb in the labels of the local Docker engine's copy). Fix: build it FROM "
        "slurmk8s/slurmd:dev, see docs/pool-images.md"]
    lines = []
    ic.preview_check(spec_of(pools=[{"name": "x", "image": "elsewhere/x:1"}]), FakeCheckApi({}), lines.append,
                     namespace_exists=False, labels_of=labels.get)
    assert lines == ["note: preview cannot check elsewhere/x:1 (pools[x].image): not in the local Docker engine; "
                     "`up` checks it in the cluster"]
    issue = ic.label_issue(ic.Want("debian:trixie", "slurmd", ("pools[x].image",)), {}, base="slurmk8s/slurmd:dev")
    assert issue.message == ("debian:trixie is not a slurmk8s worker image (no org.slurmk8s.image label in the labels "
                             "of the local Docker engine's copy)")


# ---------------------------------------------------------------- the image definitions


DOCKERFILE = (ROOT / "images" / "Dockerfile").read_text()


def test_every_image_is_labelled_with_its_role_and_the_common_stage_with_version_and_interface():
    targets = re.findall(r"^FROM \S+ AS (\w+)$", DOCKERFILE, re.M)
    final = [t for t in targets if re.search(rf"^ENV SLURMK8S_ROLE={t}\b", DOCKERFILE, re.M)]
    assert sorted(final) == ["login", "mariadb", "slurmctld", "slurmd", "slurmdbd", "slurmrestd"]
    for role in final:
        assert f'LABEL org.slurmk8s.image="{role}"' in DOCKERFILE
    assert re.search(r"^ARG SLURMK8S_VERSION=(\S+)$", DOCKERFILE, re.M).group(1) == provisioner.__version__
    assert f'org.slurmk8s.interface="{ic.IMAGE_INTERFACE}"' in DOCKERFILE
    identify = (ROOT / "images" / "entrypoint" / "identify.sh").read_text()
    assert re.search(r"^INTERFACE=(\d+)", identify, re.M).group(1) == str(ic.IMAGE_INTERFACE)
    assert "COPY images/entrypoint/identify.sh /usr/local/sbin/slurmk8s-identify" in DOCKERFILE
    build = (ROOT / "images" / "build.sh").read_text()
    assert "images/entrypoint/identify.sh" in re.search(r"local common=\(([^)]*)\)", build).group(1), \
        "an input of every image's content hash"


def test_the_login_image_has_a_cxx_compiler_for_mpicxx():
    assert re.search(r"libopenmpi-dev gcc g\+\+ ", DOCKERFILE)


def test_the_entrypoints_answer_the_identify_request_before_anything_else():
    lib = (ROOT / "images" / "entrypoint" / "lib.sh").read_text()
    hook = lib.index('if [ "${SLURMK8S_IDENTIFY:-}" = 1 ]; then')
    assert lib.index("exec /usr/local/sbin/slurmk8s-identify \"$@\"") > hook
    assert hook < lib.index("log() {"), "before any function runs"
    for script in ("slurmd.sh", "login.sh", "mariadb.sh", "slurmdbd.sh", "slurmctld.sh", "slurmrestd.sh"):
        text = (ROOT / "images" / "entrypoint" / script).read_text()
        assert text.index(". /usr/local/lib/slurmk8s/lib.sh") < text.index("log "), script


def test_the_identify_program_prints_what_the_check_reads(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "images" / "entrypoint" / "identify.sh"), "-vvv", "x"],
                          env={"SLURMK8S_ROLE": "slurmd", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    ident = ic.parse_identify(proc.stdout)
    assert ident.image == "slurmd" and ident.interface == ic.IMAGE_INTERFACE and ident.args == "-vvv x"
    assert "/usr/local/bin/slurmk8s-healthcheck" in ident.missing, "this host is no worker image"
    assert proc.stdout.rstrip().endswith("slurmk8s-identify: end")
