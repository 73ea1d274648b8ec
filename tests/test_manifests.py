"""The pure manifest builders: schema-valid objects, least privilege, secrets kept out of ConfigMaps,
worker pods placed and sized from the inventory."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest

from factories import AWS, aws_fleet, node
from provisioner import manifests as m
from provisioner.config import load_spec, parse_spec
from provisioner.deploy.keys import generate, secrets_from_values
from provisioner.errors import Problem
from provisioner.generate import generate as run_pipeline
from provisioner.inventory import nodes_from_api
from provisioner.names import L_BUSY

ROOT = Path(__file__).resolve().parents[1]
# Kubernetes releases to validate against: the local cluster's (1.34) and an older supported one.
K8S_VERSIONS = ("1.31.0", "1.34.0")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 a@b"
# Capabilities Pod Security "baseline" allows to add (the container runtime's default set).
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def _fabric_spec():
    """Every pool feature at once: pinned GPU pool on AWS nodes with EFA and Multus, a host-network
    pool, and slot pools (one per zone)."""
    return parse_spec({
        "name": "fab",
        "pools": [
            {"name": "h100", "node_selector": {"pool": "gpu"}, "extra_resources": {"vpc.amazonaws.com/efa": 32},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "network": {"multus_networks": ["kube-system/efa-0", "efa-1"],
                         "nccl_env": {"NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa"}}},
            {"name": "hostnet", "node_selector": {"pool": "hostnet"}, "shm_size": "8Gi",
             "network": {"host_network": True}},
            {"name": "spot", "mode": "slots", "cpus": 4, "memory": "16Gi", "domain_label": "topology.kubernetes.io/zone",
             "domains": [{"name": "us-east-1a", "count": 2}, {"name": "us-east-1b", "count": 1}],
             "node_selector": {"capacity": "spot"}},
        ],
        "users": [{"name": "alice", "uid": 2001, "ssh_keys": [KEY]}, {"name": "bob", "uid": 2002}],
        "login": {"service_type": "NodePort", "node_port": 30022},
        "storage": {"home": {"size": "100Gi", "storage_class": "efs-sc", "access_mode": "ReadWriteMany"}},
    })


def _fabric_nodes():
    gpu = aws_fleet(1, 1, 2)
    hostnet = [node("hn-1", {"pool": "hostnet"}, cpu="16", memory="64Gi")]
    hostnet[0]["status"]["addresses"] = [{"type": "InternalIP", "address": "10.1.2.3"}]
    return gpu + hostnet


@pytest.fixture(scope="module")
def secrets():
    return secrets_from_values(generate())


@pytest.fixture(scope="module")
def fabric():
    spec = _fabric_spec()
    return spec, run_pipeline(spec, nodes_from_api(_fabric_nodes()))


@pytest.fixture(scope="module")
def local():
    spec = load_spec(ROOT / "examples/local.yaml")
    return spec, run_pipeline(spec, nodes_from_api([node("localk8s", {"kubernetes.io/os": "linux"}, cpu="2",
                                                         memory="23Gi")]))


def _everything(spec, gen, secrets, site=m.K8sSite()):
    objs = m.all_objects(spec, gen.inventory, gen.files, secrets, site)
    return objs + [m.worker_pod(spec, n, site) for n in gen.inventory.nodes]


def _pod_specs(obj):
    if obj["kind"] == "Pod":
        return [obj["spec"]]
    if obj["kind"] in ("StatefulSet", "Deployment"):
        return [obj["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("which", ["local", "fabric", "gpu-example"])
def test_every_object_validates_against_the_kubernetes_schema(which, version, local, fabric, secrets):
    if which == "local":
        spec, gen = local
    elif which == "fabric":
        spec, gen = fabric
    else:
        spec = load_spec(ROOT / "examples/aws-gpu.yaml")
        gen = run_pipeline(spec, nodes_from_api(aws_fleet(2, 2, 2)))
    objs = _everything(spec, gen, secrets)
    kinds = {o["kind"] for o in objs}
    assert kinds >= {"Namespace", "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service",
                     "PersistentVolumeClaim", "StatefulSet", "Deployment", "PodDisruptionBudget", "NetworkPolicy", "Pod"}
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any unknown or wrong field
    # each object once: (kind, name) unique, all in the cluster's namespace
    keys = [(o["kind"], o["metadata"].get("name")) for o in objs]
    assert len(keys) == len(set(keys))
    # all in the cluster's namespace but the namespace itself and the worker pods' admission policy
    # and binding and the read access to the nodes (cluster-scoped, named after the namespace)
    cluster_scoped = {"Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                      "ClusterRoleBinding"}
    assert all(o["metadata"].get("namespace") == spec.namespace_name for o in objs if o["kind"] not in cluster_scoped)
    assert all("namespace" not in o["metadata"] and spec.namespace_name in o["metadata"]["name"]
               for o in objs if o["kind"] in cluster_scoped)


def test_the_schema_check_catches_a_broken_object(local, secrets):
    spec, gen = local
    pod = m.worker_pod(spec, gen.inventory.nodes[0])
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"nope": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)
    pod = m.worker_pod(spec, gen.inventory.nodes[0])
    pod["spec"]["hostName"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


def test_rbac_is_pods_only_in_the_own_namespace_and_reading_nodes(fabric, secrets):
    spec, gen = fabric
    objs = m.all_objects(spec, gen.inventory, gen.files, secrets)
    # cluster-wide: only reading the Kubernetes nodes, which the pinned pools follow
    cluster = [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert m.pinned(spec) and [o["kind"] for o in cluster] == ["ClusterRole", "ClusterRoleBinding"]
    assert cluster[0]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert cluster[1]["subjects"] == [{"kind": "ServiceAccount", "name": "slurmctld", "namespace": "slurm-fab"}]
    slots_only = spec.model_copy(update={"pools": [p for p in spec.pools if p.mode == "slots"]})
    # slots pools alone: the loop still lists the nodes for their interruption notices, unless off
    assert m.read_nodes_objects(slots_only)
    quiet = slots_only.elasticity.model_copy(update={"interruption_taints": [], "interruption_conditions": []})
    assert not m.read_nodes_objects(slots_only.model_copy(update={"elasticity": quiet}))
    roles = [o for o in objs if o["kind"] == "Role"]
    assert len(roles) == 1
    assert roles[0]["metadata"]["namespace"] == "slurm-fab"
    assert roles[0]["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                  # patch: a resume's adoption of a live pod (k8s_backend.adopt)
                                  "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
                                 # the worker pods' owner's uid (ownerReferences), nothing else of apps
                                 {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["slurmctld"],
                                  "verbs": ["get"]},
                                 # what slurmctld's pod reads at its start (podfiles), by name: no list, no other
                                 {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                                  "resourceNames": ["slurmk8s-spec", "slurm-users"]},
                                 {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                                  "resourceNames": ["slurm-auth"] + (["slurm-jwt"] if spec.rest.enabled else [])}]
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": m.WORKER_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "slurmctld", "namespace": "slurm-fab"}]
    # only slurmctld gets an API token; it runs as that ServiceAccount
    for obj in _everything(spec, gen, secrets):
        for ps in _pod_specs(obj):
            if obj["metadata"]["name"] == "slurmctld":
                assert ps["serviceAccountName"] == "slurmctld" and ps["automountServiceAccountToken"] is True
            else:
                assert ps["automountServiceAccountToken"] is False, obj["metadata"]["name"]


def test_no_container_is_privileged(fabric, local, secrets):
    for spec, gen in (fabric, local):
        for obj in _everything(spec, gen, secrets):
            for ps in _pod_specs(obj):
                assert not any("hostPath" in v for v in ps.get("volumes", []))
                assert not ps.get("hostPID") and not ps.get("hostIPC")
                assert ps["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
                for c in ps["containers"] + ps.get("initContainers", []):
                    sc = c["securityContext"]
                    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
                    assert sc["capabilities"]["drop"] == ["ALL"]
                    assert set(sc["capabilities"]["add"]) <= BASELINE_CAPS, c["name"]
                hostnet = ps.get("hostNetwork", False)
                pool = (obj["metadata"].get("labels") or {}).get(m.L_POOL)
                assert hostnet == (pool == "hostnet"), obj["metadata"]["name"]


def test_secrets_never_reach_a_config_map(fabric, secrets):
    spec, gen = fabric
    objs = m.all_objects(spec, gen.inventory, gen.files, secrets)
    needles = [secrets.munge_key_b64[:32]] + [k.splitlines()[1] for k in secrets.ssh_host_keys.values()]
    for obj in objs:
        if obj["kind"] != "Secret":
            text = json.dumps(obj)
            assert "PRIVATE KEY" not in text, obj["metadata"]["name"]
            assert not any(n in text for n in needles), obj["metadata"]["name"]
    by_name = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    assert by_name["slurm-auth"]["data"] == {"munge.key": secrets.munge_key_b64}
    assert set(by_name["ssh-host-keys"]["stringData"]) == {"ssh_host_ed25519_key", "ssh_host_ecdsa_key",
                                                          "ssh_host_rsa_key"}
    assert by_name["authorized-keys"]["stringData"] == {"alice": KEY + "\n"}  # bob has no key: no file


def test_worker_pod_lands_on_its_kubernetes_node_with_gpus_and_rdma(fabric):
    spec, gen = fabric
    node_ = gen.inventory["h100-ip-10-0-0-1"]
    pod = m.worker_pod(spec, node_)
    assert pod["metadata"]["name"] == "h100-ip-10-0-0-1"
    assert pod["metadata"]["labels"][m.L_NODE] == "h100-ip-10-0-0-1"
    assert pod["metadata"]["labels"][m.L_POOL] == "h100"
    assert pod["metadata"]["labels"][m.L_CLUSTER] == "fab"
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["ip-10-0-0-1.ec2.internal"]}]}]}
    assert pod["spec"]["hostname"] == "h100-ip-10-0-0-1" and pod["spec"]["subdomain"] == "workers"
    res = pod["spec"]["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {
        "cpu": str(node_.cpus), "memory": f"{node_.real_memory}Mi", "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32"}
    assert node_.cpus == 190 and node_.real_memory == 2000 * 1024 - 1024
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SLURMK8S_NODENAME"] == "h100-ip-10-0-0-1"
    assert env["SLURMK8S_CONTROLLER"] == "slurmctld-0.slurmctld.slurm-fab.svc.cluster.local:6817"
    assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa"
    assert pod["metadata"]["annotations"][m.A_MULTUS] == "kube-system/efa-0,efa-1"
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{node_.real_memory // 2}Mi"}
    assert pod["spec"]["restartPolicy"] == "Always"
    assert pod["spec"]["terminationGracePeriodSeconds"] <= 15
    assert pod["spec"]["dnsConfig"]["searches"] == ["workers.slurm-fab.svc.cluster.local",
                                                    "slurmctld.slurm-fab.svc.cluster.local"]
    # every Slurm node gets its own Kubernetes node
    targets = [m.worker_pod(spec, n)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
               ["nodeSelectorTerms"][0].get("matchFields", [{}])[0].get("values", [None])[0]
               for n in gen.inventory.in_pool("h100")]
    assert targets == ["ip-10-0-0-0.ec2.internal", "ip-10-0-0-1.ec2.internal"]


def test_host_network_and_slot_pools(fabric):
    spec, gen = fabric
    pod = m.worker_pod(spec, gen.inventory["hostnet-hn-1"])
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "8Gi"
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]

    slot = gen.inventory["spot-us-east-1b-0"]
    pod = m.worker_pod(spec, slot)
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                                     "values": ["us-east-1b"]}]}]}
    assert pod["spec"]["nodeSelector"] == {"capacity": "spot"}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "16384Mi"}
    assert "hostNetwork" not in pod["spec"] and pod["spec"]["dnsPolicy"] == "ClusterFirst"


def test_worker_pod_is_its_pool_template_plus_the_node(fabric):
    spec, gen = fabric
    for n in gen.inventory.nodes:
        pod = m.worker_pod(spec, n)
        template = json.loads(m.worker_template_config_map(spec, spec.pool(n.pool))["data"]["pod.json"])
        assert pod["spec"]["containers"][0]["image"] == template["spec"]["containers"][0]["image"]
        for key in ("subdomain", "restartPolicy", "dnsConfig", "securityContext", "automountServiceAccountToken"):
            assert pod["spec"][key] == template["spec"][key]
        assert {k: v for k, v in pod["metadata"]["labels"].items() if k != m.L_NODE} == template["metadata"]["labels"]
    # the spec hash changes when the spec does, so a resume can replace an outdated pod
    other = parse_spec({**spec.model_dump(mode="json"), "images": {"worker": "slurmk8s/slurmd:v2"}})
    n = gen.inventory.nodes[0]
    assert (m.worker_pod(spec, n)["metadata"]["annotations"][m.A_SPEC_HASH]
            != m.worker_pod(other, n)["metadata"]["annotations"][m.A_SPEC_HASH])
    assert m.worker_pod(spec, n) == m.worker_pod(spec, n)


def test_spec_config_map_round_trips(fabric, local):
    for spec, _ in (fabric, local):
        cm = m.spec_config_map(spec, m.K8sSite(cluster_domain="corp.local", host_network_sources=("10.0.0.1/32",)))
        assert parse_spec(json.loads(cm["data"]["spec.json"])) == spec
        assert json.loads(cm["data"]["site.json"]) == {"cluster_domain": "corp.local",
                                                       "host_network_sources": ["10.0.0.1/32"]}


def test_nothing_in_the_controller_pod_can_answer_on_slurmds_port(fabric, local):
    # slurmk8s gives a node it forces down the address NODE_ADDR_GONE (loopback): a message to it
    # must be refused at once, which holds while the control pod has its own network namespace and
    # no container of it serves slurmd's port
    from provisioner.names import SLURMD_PORT
    from provisioner.slurm.commands import NODE_ADDR_GONE

    assert NODE_ADDR_GONE.startswith("127.")
    for spec, gen in (fabric, local):
        ps = m.controller_statefulset(spec, gen.files)["spec"]["template"]["spec"]
        assert not ps.get("hostNetwork")
        assert SLURMD_PORT not in {p["containerPort"] for c in ps["containers"] for p in c.get("ports", ())}
        assert all(f"{SLURMD_PORT}" not in " ".join(c.get("command", []) + c.get("args", [])) for c in ps["containers"])


def test_the_reconcile_container_has_a_memory_limit_above_its_request(local):
    # the loop lives for weeks: a leak must end in an OOM kill of this container alone (restarted in
    # its pod, slurmctld untouched), not eat the node; the limit leaves room for the largest resumes
    # run warm in its threads (bench/reconcile_rss.py measures its RSS flat over 10,000 passes)
    from provisioner.config import mib
    from provisioner.names import RECONCILE_MEMORY_LIMIT

    spec, gen = local
    [reconcile] = [c for c in m.controller_statefulset(spec, gen.files)["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "reconcile"]
    res = reconcile["resources"]
    assert res["limits"] == {"memory": RECONCILE_MEMORY_LIMIT}, "a memory limit only: a CPU limit throttles passes"
    assert mib(res["limits"]["memory"]) >= 4 * mib(res["requests"]["memory"])


def test_controller_and_login_shape(local, secrets, tmp_path):
    spec, gen = local
    sts = m.controller_statefulset(spec, gen.files)
    assert "replicas" not in sts["spec"], "replicas belongs to the idle teardown (SSA field ownership)"
    assert sts["spec"]["serviceName"] == "slurmctld"
    ps = sts["spec"]["template"]["spec"]
    mounts = {v["mountPath"]: v["name"] for v in ps["containers"][0]["volumeMounts"]}
    assert mounts == {"/etc/slurm": "slurm-config", "/etc/slurmk8s": "pod-files", "/var/spool/slurmctld": "state",
                      "/run/munge": "munge-socket",
                      "/var/log/slurmk8s": "slurmk8s-log", "/run/slurmk8s/programs": "programs-socket"}
    # no Secret or ConfigMap volume: the node authorizer refuses the kubelet's first read of one for
    # about a second when it comes before the authorizer has seen the pod (provisioner.podfiles)
    assert not [v for v in ps["volumes"] if "secret" in v or "configMap" in v or "projected" in v]
    assert next(v for v in ps["volumes"] if v["name"] == "pod-files")["emptyDir"]["medium"] == "Memory"
    for c in ps["containers"][1:]:  # reconcile, accounting: the spec alone
        assert [(v["mountPath"], v.get("subPath")) for v in c["volumeMounts"] if v["name"] == "pod-files"] == [
            ("/etc/slurmk8s/spec", "spec")]
    reconcile = ps["containers"][1]
    assert reconcile["name"] == "reconcile" and reconcile["command"][0].endswith("/slurmk8s-reconcile")
    assert reconcile["securityContext"]["runAsUser"] == 64030 and reconcile["securityContext"]["runAsNonRoot"]
    assert {m["mountPath"] for m in reconcile["volumeMounts"]} >= {"/run/munge", "/var/spool/slurmctld", "/etc/slurm"}
    assert "/etc/slurmk8s/secret" not in {m["mountPath"] for m in reconcile["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in ps["containers"][0]["env"]}
    assert env.pop("SLURMK8S_POD_FILES") == "configmap/slurmk8s-spec:spec configmap/slurm-users:users secret/slurm-auth:secret"
    assert env["SLURMK8S_BACKEND"] == "kubernetes" and env["SLURMK8S_INVENTORY"] == "/etc/slurm/inventory.json"
    # Slurm starts ResumeProgram without slurmctld's environment: the same settings as a file
    from provisioner.elastic.programs import read_env_file

    envfile = tmp_path / "elastic.env"
    envfile.write_text(m.spec_config_map(spec, m.K8sSite())["data"]["elastic.env"])
    # (SLURMK8S_CONFIG_INIT is the entrypoint's alone: it fills /etc/slurm before slurmctld starts)
    assert env.pop("SLURMK8S_CONFIG_INIT") == m.CONFIG_INIT and "initContainers" not in ps
    assert read_env_file(str(envfile)) == {**env, "SLURMK8S_NAMESPACE": "slurm-local"}
    cfg = m.slurm_config_map(spec, gen.files)
    assert set(cfg["data"]) == {"slurm.conf"} and set(cfg["binaryData"]) == {"inventory.json.gz"}  # grows with the nodes
    assert "SlurmctldHost=slurmctld-0" in cfg["data"]["slurm.conf"]

    dep = m.login_deployment(spec, gen.files)
    assert "replicas" not in dep["spec"]
    lps = dep["spec"]["template"]["spec"]
    assert lps["hostname"] == "login-0" and lps["subdomain"] == "workers"
    lmounts = {v["mountPath"] for v in lps["containers"][0]["volumeMounts"]}
    assert lmounts == {"/etc/slurmk8s/users", "/etc/slurmk8s/authorized_keys", "/etc/slurmk8s/ssh-host-keys",
                       "/etc/slurmk8s/secret", "/home"}
    # every Secret a pod mounts is root-only inside it (users on login and workers read none of them)
    wpod = m.worker_pod_template(spec, spec.pools[0])
    for pod_spec in (ps, lps, wpod["spec"]):
        for vol in pod_spec["volumes"]:
            if "secret" in vol:
                assert vol["secret"]["defaultMode"] == 0o400, vol
    # a users change rolls slurmctld and login (their entrypoints merge passwd at start)
    other = parse_spec({**spec.model_dump(mode="json"),
                        "users": [*spec.model_dump(mode="json")["users"], {"name": "carol", "uid": 2003}]})
    gen2 = run_pipeline(other, nodes_from_api([node("localk8s", {"kubernetes.io/os": "linux"}, cpu="2",
                                                    memory="23Gi")]))
    assert (m.login_deployment(other, gen2.files)["spec"]["template"]["metadata"]["annotations"][m.A_USERS_HASH]
            != dep["spec"]["template"]["metadata"]["annotations"][m.A_USERS_HASH])


def test_services_storage_and_disruption(fabric, local):
    spec, gen = fabric
    login = m.login_service(spec)
    assert login["spec"]["type"] == "NodePort" and login["spec"]["ports"][0]["nodePort"] == 30022
    lspec, _ = local
    assert m.login_service(lspec)["spec"]["type"] == "ClusterIP"
    assert "nodePort" not in m.login_service(lspec)["spec"]["ports"][0]
    workers = m.workers_service(spec)
    assert workers["spec"]["clusterIP"] == "None" and workers["spec"]["publishNotReadyAddresses"] is True
    ctld = m.controller_service(spec)
    assert ctld["spec"]["clusterIP"] == "None" and ctld["spec"]["publishNotReadyAddresses"] is True
    home = m.home_pvc(spec)
    assert home["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}},
                            "storageClassName": "efs-sc"}
    assert "storageClassName" not in m.controller_state_pvc(spec)["spec"]  # cluster default class
    pdb = m.workers_pdb(spec)
    assert pdb["spec"]["maxUnavailable"] == 0
    # busy workers only (the loop labels them while a job runs): an idle one is evicted at once
    assert pdb["spec"]["selector"]["matchLabels"] == {m.L_CLUSTER: "fab", m.L_COMPONENT: "worker", L_BUSY: "true"}
    # the PDB (once the loop labels it busy) and the headless Service select worker pods as the
    # backend creates them
    pod = m.worker_pod(spec, gen.inventory.nodes[0])
    labels = pod["metadata"]["labels"]
    assert L_BUSY not in labels
    assert all({**labels, L_BUSY: "true"}.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert all(labels.get(k) == v for k, v in workers["spec"]["selector"].items())


def test_network_policy_admits_own_pods_and_ssh_only(fabric):
    spec, _ = fabric
    policies = {p["metadata"]["name"]: p for p in
                m.network_policies(spec, m.K8sSite(host_network_sources=("10.1.2.3/32",)))}
    intra, ssh, metrics = policies["intra-cluster"], policies["login-ssh"], policies["controller-metrics"]
    database = policies["database-from-slurmdbd"]
    assert metrics["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9410}]}]
    assert metrics["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "slurmctld"
    # every pod of the cluster but the internal database, which admits slurmdbd only, and those of
    # a guarded port (their own policy, test below)
    assert intra["spec"]["podSelector"] == {"matchLabels": {m.L_CLUSTER: "fab"}, "matchExpressions": [
        {"key": m.L_COMPONENT, "operator": "NotIn", "values": ["mariadb", "slurmctld", "login", "slurmrestd"]}]}
    assert database["spec"]["podSelector"] == {"matchLabels": {m.L_CLUSTER: "fab", m.L_COMPONENT: "mariadb"}}
    assert database["spec"]["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {m.L_CLUSTER: "fab", m.L_COMPONENT: "slurmdbd"}}}],
        "ports": [{"protocol": "TCP", "port": 3306}]}]
    assert intra["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {m.L_CLUSTER: "fab"}}},
                                                  {"ipBlock": {"cidr": "10.1.2.3/32"}}]}]
    assert ssh["spec"]["podSelector"] == {"matchLabels": {m.L_CLUSTER: "fab", m.L_COMPONENT: "login"}}
    assert ssh["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 22}]}]
    assert intra["spec"]["policyTypes"] == ssh["spec"]["policyTypes"] == ["Ingress"]


def test_workers_may_call_back_to_the_login_pod_on_any_port(local):
    """Jobs reach back to the login pod on ports chosen at run time: srun/salloc/sattach I/O and a
    dask-jobqueue scheduler in the user's Python there (e2e/test_e2e_researcher.py).
    The login pod admits worker pods on every port but the activity port (reconcile loop only)."""
    spec, gen = local
    policies = m.network_policies(spec)
    login = m.login_deployment(spec, gen.files)["spec"]["template"]["metadata"]["labels"]
    worker = m.worker_pod(spec, gen.inventory.nodes[0])["metadata"]["labels"]
    for protocol in ("TCP", "UDP", "SCTP"):
        for port in (1, 1023, 8786, 8787, m.ACTIVITY_PORT + 1, 32768, 60999, 65535):
            assert _admits(policies, login, port, src=worker, protocol=protocol), (port, protocol)


def test_namespace_pod_security_level(fabric, local):
    assert m.namespace(local[0])["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    # hostNetwork is not allowed by baseline: the namespace of a host-network pool is 'privileged'
    assert m.namespace(fabric[0])["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_login_disabled_drops_login_objects(secrets):
    spec = parse_spec({"name": "nl", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}],
                       "login": {"enabled": False}})
    gen = run_pipeline(spec, nodes_from_api([node("n1", {"p": "c"})]))
    names = {(o["kind"], o["metadata"]["name"]) for o in m.all_objects(spec, gen.inventory, gen.files, secrets)}
    assert ("Deployment", "login") not in names and ("Secret", "ssh-host-keys") not in names
    assert ("StatefulSet", "slurmctld") in names


def test_node_names_that_clash_with_cluster_pods_are_refused(secrets):
    spec = parse_spec({"name": "c", "pools": [{"name": "cpu", "node_selector": {"p": "c"}, "name_prefix": ""}]})
    gen = run_pipeline(spec, nodes_from_api([node("login", {"p": "c"})]))
    with pytest.raises(Problem, match="clashes"):
        m.all_objects(spec, gen.inventory, gen.files, secrets)


def test_topology_labels_stay_out_of_the_pod(fabric):
    spec, gen = fabric
    pod = m.worker_pod(spec, gen.inventory.nodes[0])
    assert not any(k.startswith(AWS) for k in pod["metadata"]["labels"])


def test_deliberate_overcommit_lowers_requests_only():
    spec = parse_spec({"name": "d", "pools": [{"name": "cpu", "mode": "slots", "cpus": 2, "memory": "4Gi", "gpus": 1,
                                               "domains": [{"name": "a", "count": 1}], "pod_cpu_request": "50m",
                                               "pod_memory_request": "128Mi"}]})
    gen = run_pipeline(spec, [])
    res = m.worker_pod(spec, gen.inventory.nodes[0])["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "2", "memory": "4096Mi", "nvidia.com/gpu": "1"}
    assert res["requests"] == {"cpu": "50m", "memory": "128Mi", "nvidia.com/gpu": "1"}
    kubernetes_validate.validate(m.worker_pod(spec, gen.inventory.nodes[0]), K8S_VERSIONS[-1], strict=True)


def test_memlock_unlimited_reaches_the_worker_and_adds_no_capability(fabric):
    """pools[].network.memlock_unlimited becomes SLURMK8S_MEMLOCK_UNLIMITED (1/0), which the slurmd
    entrypoint reads; neither value adds a capability (raising the hard limit would take
    SYS_RESOURCE, which Pod Security baseline refuses: the runtime's hard limit is what counts), so
    the namespace stays baseline."""
    spec, gen = fabric
    off = parse_spec({**spec.model_dump(mode="json"),
                      "pools": [{**p.model_dump(mode="json"), "network": {**p.network.model_dump(mode="json"),
                                                                          "memlock_unlimited": False}}
                                for p in spec.pools]})
    n = gen.inventory["h100-ip-10-0-0-1"]
    specs = {True: spec, False: off}
    pods = {flag: m.worker_pod(s, n) for flag, s in specs.items()}
    for flag, pod in pods.items():
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SLURMK8S_MEMLOCK_UNLIMITED"] == ("1" if flag else "0")
        assert container["securityContext"]["capabilities"]["add"] == list(m.BASE_CAPS)
        template = json.loads(m.worker_template_config_map(specs[flag], specs[flag].pool("h100"))["data"]["pod.json"])
        want = {"name": "SLURMK8S_MEMLOCK_UNLIMITED", "value": "1" if flag else "0"}
        assert want in template["spec"]["containers"][0]["env"]
    assert pods[True]["metadata"]["annotations"][m.A_SPEC_HASH] != pods[False]["metadata"]["annotations"][m.A_SPEC_HASH]
    # only host_network decides the namespace's Pod Security level
    only_cpu = parse_spec({"name": "x", "pools": [{"name": "cpu", "network": {"memlock_unlimited": True}}]})
    assert m.namespace(only_cpu)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def _admits(policies, dst: dict, port: int, *, src: dict | None = None, ip: str | None = None,
            protocol: str = "TCP") -> bool:
    """NetworkPolicy ingress semantics, for the policies of one namespace: a pod no policy selects
    admits everything; a selected pod admits what any rule of any policy selecting it admits.
    The source is a pod of the namespace (its labels) or an address outside every pod selector."""
    import ipaddress

    def selects(sel, labels):
        if labels is None:
            return False
        ok = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
        for e in sel.get("matchExpressions", []):
            assert e["operator"] in ("In", "NotIn"), e
            ok = ok and ((labels.get(e["key"]) in e["values"]) == (e["operator"] == "In"))
        return ok

    def peer_ok(peer):
        if "podSelector" in peer:
            assert "namespaceSelector" not in peer
            return selects(peer["podSelector"], src)
        return ip is not None and ipaddress.ip_address(ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])

    def port_ok(p):
        if p.get("protocol", "TCP") != protocol:
            return False
        return "port" not in p or p["port"] <= port <= p.get("endPort", p["port"])

    selecting = [p for p in policies if selects(p["spec"]["podSelector"], dst)]
    if not selecting:
        return True
    return any(("from" not in rule or any(peer_ok(peer) for peer in rule["from"]))
               and ("ports" not in rule or any(port_ok(p) for p in rule["ports"]))
               for p in selecting for rule in p["spec"].get("ingress", []))


def test_only_worker_pods_reach_the_boot_gate_and_only_slurmctld_the_activity_ports(local):
    """The boot gate (slurmctld pod, 9412) answers starting workers only: a job's process on a
    worker pod is a worker pod's address too (the gate itself checks who asks), but the login pod
    (every user's shell) and others are refused by the network. The activity port (9411) of the
    login and REST pods is read by the reconcile loop in the slurmctld pod alone. Every other port
    among the cluster's pods stays open (slurmctld 6817, srun I/O, MPI, NCCL), TCP, UDP and SCTP."""
    spec, gen = local
    spec = spec.model_copy(update={"rest": spec.rest.model_copy(update={"enabled": True})})
    site = m.K8sSite(host_network_sources=("10.1.2.3/32",))
    policies = m.network_policies(spec, site)
    assert {p["metadata"]["name"] for p in policies} >= {"slurmctld-from-cluster", "login-from-cluster",
                                                          "slurmrestd-from-cluster"}
    login = m.login_deployment(spec, gen.files)["spec"]["template"]["metadata"]["labels"]
    worker = m.worker_pod(spec, gen.inventory.nodes[0])["metadata"]["labels"]
    ctld = {m.L_CLUSTER: spec.name, m.L_COMPONENT: m.CONTROLLER}
    rest = {m.L_CLUSTER: spec.name, m.L_COMPONENT: m.REST}
    stranger = {"app": "other"}  # a pod of the namespace that is not the cluster's
    from provisioner.names import BOOT_GATE_PORT as gate, METRICS_PORT
    activity = m.ACTIVITY_PORT
    assert _admits(policies, ctld, gate, src=worker)
    assert _admits(policies, ctld, gate, ip="10.1.2.3")  # a host-network worker
    for src in (login, rest, ctld, stranger):
        assert not _admits(policies, ctld, gate, src=src), src
    assert not _admits(policies, ctld, gate, ip="192.0.2.9")
    for dst in (login, rest):
        assert _admits(policies, dst, activity, src=ctld)
        for src in (worker, login, stranger):
            assert not _admits(policies, dst, activity, src=src), (dst, src)
        assert not _admits(policies, dst, activity, ip="10.1.2.3")
    # everything else among the cluster's own pods, as before
    for dst, port in ((ctld, 6817), (ctld, gate - 1), (ctld, gate + 1), (ctld, 65535), (login, 40000),
                      (login, activity - 1), (login, activity + 1), (login, 1), (worker, gate), (worker, activity)):
        for src in (worker, login, ctld):
            assert _admits(policies, dst, port, src=src), (dst, port, src)
        assert not _admits(policies, dst, port, src=stranger) or port in (m.SSH_PORT,), (dst, port)
    for protocol in ("UDP", "SCTP"):
        assert _admits(policies, ctld, gate, src=login, protocol=protocol)  # the gate is TCP only
        assert _admits(policies, login, activity, src=worker, protocol=protocol)
    # SSH to login and the metrics port: from anywhere, as before
    assert _admits(policies, login, m.SSH_PORT, ip="198.51.100.7")
    assert _admits(policies, ctld, METRICS_PORT, ip="198.51.100.7")
