"""The admission policy of the worker pods (provisioner/manifests/admission.py), evaluated with a real
CEL implementation (cel-python, the test extra): every pod the Kubernetes backend would create for
every pool passes it, and each way out of the templates (a privileged container, hostPID, a foreign
image, an added capability, a hostPath, wrong labels, a ServiceAccount token) is refused with its own
message. cel-python is not Kubernetes' cel-go: the API server's own verdict is the e2e test
(e2e/test_e2e_security.py, ``test_the_controller_account_*``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import celpy  # cel-python, a test extra (pyproject.toml): missing, these tests fail rather than skip
import kubernetes_validate
import pytest
from celpy import celtypes
from factories import aws_fleet, node

from provisioner import manifests as m
from provisioner.config import load_spec, parse_spec
from provisioner.generate import generate as run_pipeline
from provisioner.inventory import nodes_from_api
from provisioner.manifests import admission

ROOT = Path(__file__).resolve().parents[1]
LINUX = {"kubernetes.io/os": "linux"}
_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _eval(expr: str, activation: dict[str, Any]) -> Any:
    if expr not in _PROGRAMS:
        _PROGRAMS[expr] = _ENV.program(_ENV.compile(expr))
    result = _PROGRAMS[expr].evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"CEL error in {expr!r}: {result}")
    return result


def admit(policy: dict[str, Any], pod: dict[str, Any], user: str, old: dict[str, Any] | None = None) -> list[str]:
    """The policy's verdict on creating `pod` (updating `old` to it) as `user`: [] admitted (or not matched), else the
    messages of the refusals, as the API server evaluates them (variables in order, each visible to
    the later ones; the match conditions first)."""
    act: dict[str, Any] = {"object": celpy.json_to_cel(pod),
                           "oldObject": celpy.json_to_cel(old) if old is not None else None,
                           "request": celpy.json_to_cel({"userInfo": {"username": user},
                                                         "operation": "CREATE" if old is None else "UPDATE"})}
    if not all(_eval(c["expression"], act) for c in policy["spec"]["matchConditions"]):
        return []
    variables: dict[Any, Any] = {}
    for var in policy["spec"]["variables"]:
        act["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(var["name"])] = _eval(var["expression"], act)
    act["variables"] = celtypes.MapType(variables)
    return [str(_eval(v["messageExpression"], act)) for v in policy["spec"]["validations"]
            if not _eval(v["expression"], act)]


# What a Kubernetes 1.34 API server added to the worker pod the e2e dry-runs (kubectl create
# --dry-run=server -o json): its defaulting and admission plugins (ServiceAccount, Priority,
# DefaultTolerationSeconds), before validating admission.
ADMITTED_DEFAULTS = {"preemptionPolicy": "PreemptLowerPriority", "priority": 0, "schedulerName": "default-scheduler",
                     "serviceAccount": "default", "serviceAccountName": "default"}
DEFAULT_TOLERATIONS = [{"effect": "NoExecute", "key": f"node.kubernetes.io/{taint}", "operator": "Exists",
                        "tolerationSeconds": 300} for taint in ("not-ready", "unreachable")]


def as_admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as validating admission sees it: the API server's defaults (ADMITTED_DEFAULTS, the
    containers' termination message, the default tolerations), and with hostNetwork each container
    port's hostPort defaults to its containerPort."""
    pod = copy.deepcopy(pod)
    for key, value in ADMITTED_DEFAULTS.items():
        pod["spec"].setdefault(key, value)
    pod["spec"]["tolerations"] = pod["spec"].get("tolerations", []) + copy.deepcopy(DEFAULT_TOLERATIONS)
    for c in pod["spec"]["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
    if pod["spec"].get("hostNetwork"):
        for c in pod["spec"]["containers"]:
            for p in c.get("ports", ()):
                p.setdefault("hostPort", p["containerPort"])
    return pod


def _fabric_spec():
    """Every pool feature: a pinned GPU pool with its own image, extra devices and Multus; a
    host-network pool; slot pools across zones."""
    return parse_spec({
        "name": "fab",
        "images": {"worker": "reg.example/slurmd:1"},
        "pools": [
            {"name": "h100", "node_selector": {"pool": "gpu"}, "image": "reg.example/slurmd-cuda:1",
             "extra_resources": {"vpc.amazonaws.com/efa": 32},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "network": {"multus_networks": ["kube-system/efa-0"], "nccl_env": {"FI_PROVIDER": "efa"}}},
            {"name": "hostnet", "node_selector": {"pool": "hostnet"}, "network": {"host_network": True}},
            {"name": "spot", "mode": "slots", "cpus": 4, "memory": "16Gi", "domain_label": "topology.kubernetes.io/zone",
             "domains": [{"name": "us-east-1a", "count": 2}, {"name": "us-east-1b", "count": 1}]},
        ],
        "users": [{"name": "alice", "uid": 2001}],
        "storage": {"home": {"size": "100Gi", "access_mode": "ReadWriteMany"}},
    })


CASES: dict[str, Callable[[], tuple[Any, list[dict[str, Any]]]]] = {
    "fabric": lambda: (_fabric_spec(), aws_fleet(1, 1, 2) + [node("hn-1", {"pool": "hostnet"}, cpu="16")]),
    "local": lambda: (load_spec(ROOT / "examples/local.yaml"), [node("localk8s", LINUX, cpu="2", memory="23Gi")]),
    "aws-gpu": lambda: (load_spec(ROOT / "examples/aws-gpu.yaml"), aws_fleet(2, 2, 2)),
    "chart-full": lambda: (load_spec(ROOT / "tests/chart/full.yaml"),
                           [node(f"fab-{i}", {"pool": "fab", **LINUX}, cpu="32", memory="128Gi") for i in range(3)]),
}


@pytest.fixture(scope="module")
def fabric():
    spec, nodes = CASES["fabric"]()
    gen = run_pipeline(spec, nodes_from_api(nodes))
    return spec, gen, m.worker_pod_policy(spec)


def _pod(spec, gen, pool: str) -> dict[str, Any]:
    return as_admitted(m.worker_pod(spec, next(n for n in gen.inventory.nodes if n.pool == pool)))


# ---------------------------------------------------------------- what the templates produce passes


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pod_the_backend_creates_passes(case):
    spec, nodes = CASES[case]()
    gen = run_pipeline(spec, nodes_from_api(nodes))
    policy = m.worker_pod_policy(spec)
    user = m.controller_user(spec)
    assert {n.pool for n in gen.inventory.nodes} == {p.name for p in spec.pools}, "every pool has a node here"
    for n in gen.inventory.nodes:
        pod = as_admitted(m.worker_pod(spec, n))
        assert admit(policy, pod, user) == [], f"{case}: the worker pod of {n.name} (pool {n.pool}) is refused"


def test_the_policy_knows_each_pools_image_and_host_network(fabric):
    spec, _, _ = fabric
    allowed = admission.allowed(spec)
    assert allowed["poolImages"] == {"h100": ["reg.example/slurmd-cuda:1"], "hostnet": ["reg.example/slurmd:1"],
                                     "spot": ["reg.example/slurmd:1"]}
    assert allowed["hostNetworkPools"] == ["hostnet"]
    assert allowed["poolCaps"]["h100"] == sorted(m.BASE_CAPS)
    assert (allowed["secrets"], allowed["configMaps"], allowed["claims"]) == (["slurm-auth"], ["slurm-users"], ["home"])
    assert allowed["serviceAccount"] == "default"
    assert allowed["workerLabels"][m.L_CLUSTER] == "fab" and m.L_POOL not in allowed["workerLabels"]


# ---------------------------------------------------------------- each way out of the templates is refused


def _container(pod):
    return pod["spec"]["containers"][0]


def _sc(pod):
    return _container(pod)["securityContext"]


MUTATIONS: dict[str, tuple[str, Callable[[dict[str, Any]], Any], str]] = {
    "privileged": ("spot", lambda p: _sc(p).update(privileged=True), "container slurmd is privileged"),
    "escalation": ("spot", lambda p: _sc(p).pop("allowPrivilegeEscalation"), "container slurmd may escalate privileges"),
    "sys-admin": ("spot", lambda p: _sc(p)["capabilities"]["add"].append("SYS_ADMIN"),
                  "container slurmd has capabilities the template of pool spot does not give"),
    "no-drop": ("spot", lambda p: _sc(p)["capabilities"].update(drop=[]),
                "container slurmd has capabilities the template of pool spot does not give"),
    "seccomp": ("spot", lambda p: _sc(p).update(seccompProfile={"type": "Unconfined"}),
                "container slurmd is not confined as the template is"),
    "pod-seccomp": ("spot", lambda p: p["spec"].pop("securityContext"), "the pod is not confined as the template is"),
    "host-pid": ("spot", lambda p: p["spec"].update(hostPID=True), "hostPID is set"),
    "host-ipc": ("spot", lambda p: p["spec"].update(hostIPC=True), "hostIPC is set"),
    "host-network": ("spot", lambda p: p["spec"].update(hostNetwork=True),
                     "hostNetwork is set but the template of pool spot has no host network"),
    "host-port": ("spot", lambda p: _container(p)["ports"][0].update(hostPort=22),
                  "container slurmd asks for a host port"),
    "host-path": ("hostnet", lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
                  "volume root is not one of the template volumes"),
    "other-secret": ("spot", lambda p: p["spec"]["volumes"][0]["secret"].update(secretName=m.SSH_HOST_KEYS_SECRET),
                     "volume munge-key is not one of the template volumes"),
    "foreign-image": ("spot", lambda p: _container(p).update(image="docker.io/library/busybox"),
                      "container slurmd runs image docker.io/library/busybox, not the image of pool spot"),
    "other-pools-image": ("spot", lambda p: _container(p).update(image="reg.example/slurmd-cuda:1"),
                          "container slurmd runs image reg.example/slurmd-cuda:1, not the image of pool spot"),
    "init-container": ("spot", lambda p: p["spec"].update(initContainers=[
        {**copy.deepcopy(_container(p)), "name": "init", "image": "docker.io/library/busybox"}]),
        "container init runs image docker.io/library/busybox"),
    "command": ("spot", lambda p: _container(p).update(command=["/bin/sh", "-c", "id"]),
                "container slurmd sets its own command or args"),
    "wrong-component": ("spot", lambda p: p["metadata"]["labels"].update({m.L_COMPONENT: "login"}),
                        "the pod lacks the worker label app.kubernetes.io/component=worker"),
    "no-labels": ("spot", lambda p: p["metadata"].pop("labels"), "the pod lacks the worker label"),
    "unknown-pool": ("spot", lambda p: p["metadata"]["labels"].update({m.L_POOL: "nope"}),
                     "the pool label slurmk8s.io/pool=nope names no pool of the spec"),
    "token": ("spot", lambda p: p["spec"].pop("automountServiceAccountToken"), "the pod would mount a ServiceAccount token"),
    "projected-token": ("spot", lambda p: p["spec"]["volumes"].append({"name": "tok", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}), "volume tok is not one of the template volumes"),
    "other-account": ("spot", lambda p: p["spec"].update(serviceAccountName=m.CONTROLLER),
                      "the pod runs as ServiceAccount slurmctld, not default"),
    "ephemeral": ("spot", lambda p: p["spec"].update(ephemeralContainers=[{"name": "dbg", "image": "busybox"}]),
                  "the pod has ephemeral containers"),
    # the whole pod against its pool's template (issue 40 item 9): each field below passed the
    # field-by-field checks above
    "env-secret": ("spot", lambda p: _container(p)["env"].append(
        {"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": m.SSH_HOST_KEYS_SECRET, "key": "k"}}}),
        "container slurmd sets env STOLEN other than the template of pool spot"),
    "env-config-map": ("spot", lambda p: _container(p)["env"].append(
        {"name": "CONF", "valueFrom": {"configMapKeyRef": {"name": "kube-root-ca.crt", "key": "ca.crt"}}}),
        "container slurmd sets env CONF other than the template of pool spot"),
    "env-overridden": ("spot", lambda p: _container(p)["env"][0].update(value="evil.example:6817"),
                       "container slurmd sets env SLURMK8S_CONTROLLER other than the template of pool spot"),
    "env-from-secret": ("spot", lambda p: _container(p).update(envFrom=[{"secretRef": {"name": m.AUTH_SECRET}}]),
                        "container slurmd sets envFrom other than the template of pool spot"),
    "node-name": ("spot", lambda p: p["spec"].update(nodeName="control-plane"),
                  "the pod sets nodeName control-plane"),
    "toleration": ("spot", lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}),
                   "the pod tolerates every taint other than the template of pool spot"),
    "control-plane-toleration": ("h100", lambda p: p["spec"]["tolerations"].append(
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}),
        "the pod tolerates node-role.kubernetes.io/control-plane other than the template of pool h100"),
    # with the priority the Priority admission plugin resolves from the class; the API server's
    # map order is random, and the message names the field the creator set, every time
    "priority-class": ("spot", lambda p: p["spec"].update(priority=2000001000, priorityClassName="system-node-critical"),
                       "the pod sets priorityClassName other than the template of pool spot"),
    "runtime-class": ("spot", lambda p: p["spec"].update(runtimeClassName="runc-unconfined"),
                      "the pod sets runtimeClassName other than the template of pool spot"),
    "hostname": ("spot", lambda p: p["spec"].update(hostname="slurmctld-0"),
                 "the hostname and the label slurmk8s.io/node of pod"),
    "subdomain": ("spot", lambda p: p["spec"].update(subdomain="login"),
                  "the pod sets subdomain other than the template of pool spot"),
    "scheduler": ("spot", lambda p: p["spec"].update(schedulerName="my-scheduler"),
                  "the pod sets schedulerName other than the template of pool spot"),
    "host-aliases": ("spot", lambda p: p["spec"].update(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["slurmctld"]}]),
                     "the pod sets hostAliases other than the template of pool spot"),
    "dns-config": ("spot", lambda p: p["spec"]["dnsConfig"].update(nameservers=["10.0.0.53"]),
                   "the pod sets dnsConfig other than the template of pool spot"),
    "share-pid": ("spot", lambda p: p["spec"].update(shareProcessNamespace=True),
                  "the pod sets shareProcessNamespace other than the template of pool spot"),
    "preemption": ("spot", lambda p: p["spec"].update(preemptionPolicy="Never"),
                   "the pod sets preemptionPolicy other than the template of pool spot"),
    "overhead": ("spot", lambda p: p["spec"].update(overhead={"cpu": "1"}),
                 "the pod sets overhead other than the template of pool spot"),
    "pod-affinity": ("spot", lambda p: p["spec"].update(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "x"}},
                                                             "topologyKey": "kubernetes.io/hostname"}]}}),
        "the pod sets affinity podAffinity other than the template of pool spot"),
    "node-affinity": ("spot", lambda p: p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0].update(
        key="kubernetes.io/hostname"), "the pod sets affinity nodeAffinity other than the template of pool spot"),
    "other-domain": ("spot", lambda p: p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0].update(
        values=["eu-west-1a"]), "the pod sets affinity nodeAffinity other than the template of pool spot"),
    "init-container-of-the-image": ("spot", lambda p: p["spec"].update(initContainers=[
        {"name": "init", "image": "reg.example/slurmd:1", "securityContext": copy.deepcopy(_sc(p))}]),
        "the pod sets initContainers other than the template of pool spot"),
    "second-container": ("spot", lambda p: p["spec"]["containers"].append({**copy.deepcopy(_container(p)), "name": "b"}),
                         "the pod has 2 containers, the template one"),
    "volume-mount": ("spot", lambda p: _container(p)["volumeMounts"][0].update(subPath="x"),
                     "container slurmd sets volumeMounts other than the template of pool spot"),
    "resources": ("spot", lambda p: _container(p)["resources"]["limits"].update({"nvidia.com/mig-1g.10gb": "1"}),
                  "container slurmd sets resources limits"),
    "dshm": ("spot", lambda p: p["spec"]["volumes"][3]["emptyDir"].pop("medium"),
             "volume dshm is not as the template of pool spot has it"),
    "extra-label": ("spot", lambda p: p["metadata"]["labels"].update({m.L_COMPONENT + "-x": "login"}),
                    "the pod has label app.kubernetes.io/component-x=login"),
    "multus": ("spot", lambda p: p["metadata"]["annotations"].update({m.A_MULTUS: "kube-system/host-net"}),
               "annotation k8s.v1.cni.cncf.io/networks is not as the template of pool spot has it"),
    "other-multus": ("h100", lambda p: p["metadata"]["annotations"].update({m.A_MULTUS: "kube-system/host-net"}),
                     "annotation k8s.v1.cni.cncf.io/networks is not as the template of pool h100 has it"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_pod_off_the_templates_is_refused_saying_why(case, fabric):
    spec, gen, policy = fabric
    pool, mutate, message = MUTATIONS[case]
    pod = _pod(spec, gen, pool)
    mutate(pod)
    refusals = admit(policy, pod, m.controller_user(spec))
    assert refusals, f"{case}: admitted"
    assert all(r.startswith(admission.PREFIX) for r in refusals), refusals
    assert any(r[len(admission.PREFIX):].startswith(message) for r in refusals), refusals


def test_a_privileged_pod_is_refused_even_in_the_host_network_pool(fabric):
    spec, gen, policy = fabric
    pod = _pod(spec, gen, "hostnet")
    assert pod["spec"]["hostNetwork"] is True and admit(policy, pod, m.controller_user(spec)) == []
    _sc(pod)["privileged"] = True
    assert admit(policy, pod, m.controller_user(spec)) == [
        admission.PREFIX + "container slurmd is privileged",
        admission.PREFIX + "container slurmd sets securityContext other than the template of pool hostnet"]


def test_an_update_may_keep_what_the_pod_has_and_add_the_adoption_mark(fabric):
    """A resume adopts a running worker with a patch of one annotation: the pod it updates has the
    scheduler's nodeName and what others wrote since (Multus' network status); the update may keep
    those, never bring its own."""
    spec, gen, policy = fabric
    user = m.controller_user(spec)
    old = _pod(spec, gen, "h100")
    old["spec"]["nodeName"] = "ip-10-0-0-2"
    old["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"] = "[]"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][admission.A_ADOPTED] = "1700000000.000 0a1b2c3d"
    assert admit(policy, new, user, old) == []
    assert admit(policy, new, user) != [], "a create with a nodeName of its own is refused"
    moved = copy.deepcopy(new)
    moved["spec"]["nodeName"] = "control-plane"
    assert any("the pod sets nodeName control-plane" in r for r in admit(policy, moved, user, old))
    relabelled = copy.deepcopy(new)
    relabelled["metadata"]["annotations"][m.A_MULTUS] = "kube-system/host-net"
    assert any("annotation k8s.v1.cni.cncf.io/networks" in r for r in admit(policy, relabelled, user, old))


def test_the_templates_reach_the_policy_as_dyn_literals():
    """The API server's CEL takes an aggregate literal of one type only: every value of the pool
    templates is wrapped in dyn(), in the text Helm's toJson writes for each scalar."""
    assert admission.cel_dyn_literal({"b": [1, "x<&>"], "a": {"k": True}}) == \
        '{"a":dyn({"k":dyn(true)}),"b":dyn([dyn(1),dyn("x\\u003c\\u0026\\u003e")])}'
    spec, _ = CASES["local"]()
    (var,) = [v for v in m.worker_pod_policy(spec)["spec"]["variables"] if v["name"] == "poolTemplates"]
    assert var["expression"] == admission.cel_dyn_literal(
        {p.name: m.worker_pod_template(spec, p) for p in spec.pools})


def test_only_the_controller_account_is_held_to_the_templates(fabric):
    """The match condition: other users (the deployer, the StatefulSet controller) are not judged."""
    spec, gen, policy = fabric
    pod = _pod(spec, gen, "spot")
    _sc(pod)["privileged"] = True
    assert admit(policy, pod, m.controller_user(spec))
    assert admit(policy, pod, "system:serviceaccount:other-ns:slurmctld") == []
    assert admit(policy, pod, "kubernetes-admin") == []


# ---------------------------------------------------------------- the objects


def test_policy_and_binding_are_named_per_namespace_and_labelled(fabric):
    spec, _, policy = fabric
    binding = m.worker_pod_policy_binding(spec)
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == "slurmk8s-slurm-fab-worker-pods"
    for obj in (policy, binding):
        assert "namespace" not in obj["metadata"]
        assert obj["metadata"]["labels"][m.L_CLUSTER] == "fab"
    assert binding["spec"] == {
        "policyName": "slurmk8s-slurm-fab-worker-pods", "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "slurm-fab"}}}}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"] == [{
        "name": "slurmctld-account", "expression": 'request.userInfo.username == "system:serviceaccount:slurm-fab:slurmctld"'}]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods", "pods/ephemeralcontainers"] and rule["operations"] == ["CREATE", "UPDATE"]


@pytest.mark.parametrize("version", ("1.31.0", "1.34.0"))
def test_policy_and_binding_validate_against_the_kubernetes_schema(fabric, version):
    spec, _, _ = fabric
    for obj in m.admission_objects(spec):
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_template_the_policy_cannot_judge_stops_the_build(fabric, monkeypatch):
    spec, _, _ = fabric
    real = admission.worker_pod_template

    def with_host_pid(*args, **kwargs):
        pod = real(*args, **kwargs)
        pod["spec"]["hostPID"] = True
        return pod

    monkeypatch.setattr(admission, "worker_pod_template", with_host_pid)
    with pytest.raises(ValueError, match="sets \\['hostPID'\\], which the admission policy does not judge"):
        admission.allowed(spec)


# ---------------------------------------------------------------- before `up`: the API must serve it


def test_preflight_refuses_a_cluster_without_validating_admission_policies(fabric):
    from provisioner.deploy import preflight as pf

    spec, _, _ = fabric
    storage = [{"metadata": {"name": "std", "annotations": {pf.DEFAULT_CLASS_ANNOTATIONS[0]: "true"}},
                "provisioner": "csi.example"}]
    pf.check(spec, pf.ClusterFacts(storage_classes=storage))  # 1.30 and later: nothing to say
    with pytest.raises(pf.PreflightError) as err:
        pf.check(spec, pf.ClusterFacts(storage_classes=storage, admission_policies=False))
    text = str(err.value)
    assert "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in text
    assert "Kubernetes 1.30 or later" in text and "nothing was applied" in text


def test_a_pool_priority_class_is_the_only_one_its_pods_may_name_and_the_busy_label_is_true_or_absent():
    """pools[].priority_class: the Priority plugin then writes the class's priority and preemption
    policy into the pod, which the policy admits; another class (or none) is refused, and so is any
    priority in a pool without a class. The loop's busy label (the PodDisruptionBudget's) may only be
    "true"."""
    spec, nodes = CASES["chart-full"]()
    gen = run_pipeline(spec, nodes_from_api(nodes))
    policy, user = m.worker_pod_policy(spec), m.controller_user(spec)
    pod = as_admitted(m.worker_pod(spec, next(n for n in gen.inventory.nodes if n.pool == "fab")))
    assert pod["spec"]["priorityClassName"] == "hpc-high"
    pod["spec"].update(priority=100000, preemptionPolicy="Never")  # the class's, written by the plugin
    assert admit(policy, pod, user) == []
    assert admit(policy, {**pod, "spec": {**pod["spec"], "priorityClassName": "system-node-critical"}}, user)
    bare = as_admitted(m.worker_pod(spec, next(n for n in gen.inventory.nodes if n.pool == "burst")))
    assert admit(policy, bare, user) == []
    assert admit(policy, {**bare, "spec": {**bare["spec"], "priority": 100000}}, user)
    assert admit(policy, {**bare, "spec": {**bare["spec"], "priorityClassName": "hpc-high"}}, user)
    busy = copy.deepcopy(bare)
    busy["metadata"]["labels"][m.L_BUSY] = "true"
    assert admit(policy, busy, user) == []
    busy["metadata"]["labels"][m.L_BUSY] = "false"
    assert admit(policy, busy, user)


def test_up_refuses_a_pool_priority_class_that_does_not_exist():
    from provisioner.deploy import preflight as pf

    spec = parse_spec({"name": "t", "pools": [{"name": "cpu"}, {"name": "gpu", "priority_class": "hpc-high"}]})
    (issue,) = pf.priority_issues(spec, pf.ClusterFacts(pod_priority_classes=frozenset({"system-node-critical"})))
    assert issue.field == "pools[1].priority_class"
    assert issue.message == "PriorityClass 'hpc-high' not found (PriorityClasses: system-node-critical)"
    with pytest.raises(pf.PreflightError, match="nothing was applied"):
        pf.check(spec, pf.ClusterFacts())
    assert pf.priority_issues(spec, pf.ClusterFacts(pod_priority_classes=frozenset({"hpc-high"}))) == []
