"""Container jobs (pools[].containers, issue #15 item 4): the spec option, the worker pod's seccomp
profile and the namespace's Pod Security level it needs, oci.conf (rootless crun), the admission
policy per pool, and the Docker backend's confinement of a worker as its pod. The real run of a
step in another userland, on a Kubernetes node: e2e/test_e2e_researcher.py."""

from __future__ import annotations

import json

import pytest
from factories import node
from test_admission import admit, as_admitted

from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.errors import SpecError
from provisioner.elastic.docker_backend import DockerConfig, container_spec, security_host_config
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.manifests import admission
from provisioner.render import OCI_RUNTIME, parse_conf_lines

PROFILE = "profiles/slurmk8s-containers.json"


def _spec(**pools_containers):
    pools = [{"name": name, "node_selector": {"pool": name}, **({"containers": c} if c is not None else {})}
             for name, c in pools_containers.items()]
    return parse_spec({"name": "oci", "pools": pools, "users": [{"name": "alice", "uid": 2001}]})


def _gen(spec):
    return generate(spec, nodes_from_api([node(f"{p.name}-1", {"pool": p.name}, cpu="8", memory="32Gi")
                                          for p in spec.pools]))


@pytest.fixture(scope="module")
def mixed():
    spec = _spec(cpu=None, oci=True, ocil={"enabled": True, "seccomp": "Localhost", "localhost_profile": PROFILE})
    return spec, _gen(spec)


def _pod(spec, gen, pool):
    return m.worker_pod(spec, next(n for n in gen.inventory.nodes if n.pool == pool))


# ---------------------------------------------------------------- the spec


def test_off_by_default_and_true_is_unconfined():
    spec = _spec(cpu=None, oci=True)
    assert spec.pool("cpu").containers.enabled is False
    oci = spec.pool("oci").containers
    assert (oci.enabled, oci.seccomp, oci.localhost_profile) == (True, "Unconfined", None)
    assert spec.pool("cpu").containers.seccomp_profile() == {"type": "RuntimeDefault"}
    assert oci.seccomp_profile() == {"type": "Unconfined"}


@pytest.mark.parametrize("containers, message", [
    ({"enabled": True, "seccomp": "Localhost"}, "seccomp Localhost needs localhost_profile"),
    ({"enabled": True, "localhost_profile": PROFILE}, "localhost_profile applies to seccomp Localhost only"),
    ({"enabled": True, "seccomp": "Localhost", "localhost_profile": "/var/lib/kubelet/seccomp/x.json"},
     "must be a relative path"),
    ({"enabled": True, "seccomp": "RuntimeDefault"}, "Unconfined"),  # RuntimeDefault cannot work: not offered
    ({"enabled": True, "privileged": True}, "privileged"),
])
def test_a_combination_that_cannot_work_is_refused_at_load(containers, message):
    with pytest.raises(SpecError) as err:
        _spec(oci=containers)
    assert message in str(err.value)


# ---------------------------------------------------------------- worker pods and Pod Security


def test_only_opted_in_pools_leave_runtime_default(mixed):
    spec, gen = mixed
    want = {"cpu": {"type": "RuntimeDefault"}, "oci": {"type": "Unconfined"},
            "ocil": {"type": "Localhost", "localhostProfile": PROFILE}}
    for pool, profile in want.items():
        pod = _pod(spec, gen, pool)
        (c,) = pod["spec"]["containers"]
        assert pod["spec"]["securityContext"]["seccompProfile"] == profile
        sc = c["securityContext"]
        # nothing else moves: no privilege, no escalation, the base capabilities only
        assert sc == {"privileged": False, "allowPrivilegeEscalation": False,
                      "capabilities": {"drop": ["ALL"], "add": list(m.BASE_CAPS)}, "seccompProfile": profile}
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env.get("SLURMK8S_CONTAINERS") == (None if pool == "cpu" else "1")


@pytest.mark.parametrize("pools, level", [
    ({"cpu": None}, "baseline"),
    ({"cpu": None, "oci": True}, "privileged"),  # baseline forbids seccomp Unconfined
    ({"cpu": None, "ocil": {"enabled": True, "seccomp": "Localhost", "localhost_profile": PROFILE}}, "baseline"),
    ({"cpu": None, "oci": {"enabled": False}}, "baseline"),
])
def test_pod_security_level_the_pools_need(pools, level):
    spec = _spec(**pools)
    labels = m.namespace(spec)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == level
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"


# ---------------------------------------------------------------- oci.conf


def test_oci_conf_only_with_a_container_pool():
    assert "oci.conf" not in _gen(_spec(cpu=None)).files
    files = _gen(_spec(cpu=None, oci=True)).files
    text = files["oci.conf"]
    conf = dict(pair for line in parse_conf_lines(text) for pair in line)
    assert conf["RunTimeRun"] == f"{OCI_RUNTIME} run --no-new-keyring --bundle %b %n.%u.%j.%s.%t"
    assert conf["RunTimeQuery"] == f"{OCI_RUNTIME} state %n.%u.%j.%s.%t"
    assert conf["RunTimeKill"] == f"{OCI_RUNTIME} kill -a %n.%u.%j.%s.%t"
    assert conf["RunTimeDelete"] == f"{OCI_RUNTIME} delete --force %n.%u.%j.%s.%t"
    assert f'RunTimeRun="{OCI_RUNTIME} run' in text  # quoted: the value holds spaces
    assert "--rootless=true" in OCI_RUNTIME and "--root=/run/user/%U/" in OCI_RUNTIME
    assert "pools with container jobs" in text.lower() and ": oci;" in text
    # slurmctld serves it (configless): it travels in the config map mounted at /etc/slurm
    spec = _spec(cpu=None, oci=True)
    assert m.slurm_config_map(spec, files)["data"]["oci.conf"] == text


# ---------------------------------------------------------------- the admission policy


def test_every_pool_pod_passes_and_seccomp_is_held_per_pool(mixed):
    spec, gen = mixed
    policy = m.worker_pod_policy(spec)
    user = m.controller_user(spec)
    assert admission.allowed(spec)["poolSeccomp"] == {
        "cpu": {"type": "RuntimeDefault"}, "oci": {"type": "Unconfined"},
        "ocil": {"type": "Localhost", "localhostProfile": PROFILE}}
    pods = {pool: as_admitted(_pod(spec, gen, pool)) for pool in ("cpu", "oci", "ocil")}
    for pool, pod in pods.items():
        assert admit(policy, pod, user) == [], pool
    refused = admission.PREFIX + "container slurmd is not confined as the template is (seccomp RuntimeDefault"
    # the Unconfined pool's profile on a pool without container jobs: refused, container and pod
    pod = json.loads(json.dumps(pods["cpu"]))
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    assert any(r.startswith(refused) for r in admit(policy, pod, user))
    pod = json.loads(json.dumps(pods["cpu"]))
    pod["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    assert any(r.startswith(admission.PREFIX + "the pod is not confined") for r in admit(policy, pod, user))
    # the Localhost pool with another profile than its own
    pod = json.loads(json.dumps(pods["ocil"]))
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"]["localhostProfile"] = "profiles/anything.json"
    assert any("is not confined as the template is (seccomp Localhost" in r for r in admit(policy, pod, user))
    # the Unconfined pool still refuses everything else (privilege, capabilities)
    pod = json.loads(json.dumps(pods["oci"]))
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")
    assert admit(policy, pod, user)


# ---------------------------------------------------------------- the Docker test bed


def test_docker_workers_can_be_confined_as_their_pods(mixed):
    spec, gen = mixed
    sc = {p: _pod(spec, gen, p)["spec"]["containers"][0]["securityContext"] for p in ("cpu", "oci", "ocil")}
    caps = list(m.BASE_CAPS)
    assert security_host_config(sc["cpu"]) == {"CapDrop": ["ALL"], "CapAdd": caps, "SecurityOpt": ["no-new-privileges"]}
    assert security_host_config(sc["oci"])["SecurityOpt"] == ["no-new-privileges", "seccomp=unconfined"]
    assert security_host_config(sc["ocil"], {PROFILE: '{"defaultAction": "SCMP_ACT_ERRNO"}'})["SecurityOpt"] == [
        "no-new-privileges", 'seccomp={"defaultAction": "SCMP_ACT_ERRNO"}']
    env = {"SLURMK8S_DOCKER_CLUSTER": "t", "SLURMK8S_DOCKER_NETWORK": "n", "SLURMK8S_CONTROLLER": "c:6817"}
    n = gen.inventory.nodes[0]
    plain = container_spec(DockerConfig.from_env(env), n, "img")["HostConfig"]
    assert not {"CapDrop", "CapAdd", "SecurityOpt"} & set(plain)  # Docker's defaults unless asked
    confined = container_spec(DockerConfig.from_env(
        {**env, "SLURMK8S_DOCKER_SECURITY": json.dumps(security_host_config(sc["oci"]))}), n, "img")["HostConfig"]
    assert confined["SecurityOpt"] == ["no-new-privileges", "seccomp=unconfined"] and confined["CapDrop"] == ["ALL"]
    with pytest.raises(Exception, match="SLURMK8S_DOCKER_SECURITY may hold only"):
        DockerConfig.from_env({**env, "SLURMK8S_DOCKER_SECURITY": '{"Privileged": true}'})
