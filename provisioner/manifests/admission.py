"""The ValidatingAdmissionPolicy that holds the controller to the pool templates.

slurmctld's ServiceAccount may create pods in its namespace (the resume program creates the worker
pods), and a pool with ``host_network`` makes the namespace's Pod Security level ``privileged``.
Without more, a compromised slurmctld container could start any pod there: privileged, on the
host's PID namespace, with a hostPath of the node's root. The policy below, bound to this
namespace and to requests made by that ServiceAccount, refuses every pod that the pool templates
(:func:`~provisioner.manifests.workers.worker_pod_template`) would not produce:

- the worker labels (those of the template, the pool label naming a pool of the spec);
- each container's image is its pool's image; no command or args of its own;
- no privileged container, no privilege escalation, capabilities: drop ALL and add only the
  template's; seccomp the template's (RuntimeDefault, or what a pool with container jobs sets:
  Unconfined or its Localhost profile); procMount Default;
- hostNetwork only for a pool whose template has it (and host ports only as hostNetwork defaults
  them); never hostPID, hostIPC nor ephemeral containers;
- volumes only the template's (its Secret, ConfigMap, claim, emptyDir): no hostPath, no
  projected token; the namespace's default ServiceAccount with automountServiceAccountToken false.

What is allowed is computed from the templates themselves (:func:`allowed`); a template that grows
something the policy does not know (a new volume kind, hostPID, an init container) fails
:func:`allowed` at once, so the two cannot drift apart unnoticed. The spec-dependent parts are
``variables`` at the head of the policy (CEL literals, JSON-formatted so the Helm chart writes the
same text with ``toJson``); the rest (:data:`STATIC_VARIABLES`, :data:`VALIDATIONS`) does not depend
on the spec and reaches the chart generated (``charts/slurmk8s/templates/_admission.tpl``, see
:mod:`provisioner.chartdefaults`).

Both objects are cluster-scoped and named per namespace (:func:`policy_name`); they carry the
cluster's labels. `slurmk8s up` registers them as Pulumi resources (so `down` deletes them) and the
chart renders them (``helm uninstall`` deletes them). ValidatingAdmissionPolicy is
admissionregistration.k8s.io/v1 from Kubernetes 1.30.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import ClusterSpec
from .common import K8sSite
from ..names import CONTROLLER, L_POOL, base_labels
from .workers import worker_pod_template

API_VERSION = "admissionregistration.k8s.io/v1"
PREFIX = "slurmk8s: the controller may only create worker pods from the pool templates: "
# The pod-level fields a template may set that the policy has nothing to say about (scheduling,
# DNS, lifecycle) and those it checks below; any other field in a template stops allowed().
_POD_FIELDS_FREE = {"subdomain", "restartPolicy", "terminationGracePeriodSeconds", "enableServiceLinks", "dnsPolicy",
                    "dnsConfig", "affinity", "nodeSelector", "tolerations"}
_POD_FIELDS_CHECKED = {"containers", "volumes", "securityContext", "automountServiceAccountToken", "hostNetwork",
                       "serviceAccountName"}
_VOLUME_SOURCES = {"secret": ("secrets", "secretName"), "configMap": ("configMaps", "name"),
                   "persistentVolumeClaim": ("claims", "claimName"), "emptyDir": (None, None)}


def policy_name(spec: ClusterSpec) -> str:
    """The policy's and its binding's name: cluster-scoped, so one per namespace."""
    return f"slurmk8s-{spec.namespace_name}-worker-pods"


def controller_user(spec: ClusterSpec) -> str:
    """The user name the API server gives requests made with slurmctld's ServiceAccount token."""
    return f"system:serviceaccount:{spec.namespace_name}:{CONTROLLER}"


def cel_literal(value: Any) -> str:
    """A CEL literal of JSON data (strings, lists, maps of those): compact JSON with sorted keys, as
    Helm's ``toJson`` writes it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def allowed(spec: ClusterSpec, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """What the pool templates produce, per pool where it differs: the spec-dependent variables of
    the policy, by name, as plain data. Raises ValueError for a template the policy cannot judge."""
    labels: dict[str, str] | None = None
    images: dict[str, list[str]] = {}
    caps: dict[str, list[str]] = {}
    host_network: list[str] = []
    seccomp: dict[str, dict[str, str]] = {}
    sources: dict[str, set[str]] = {"secrets": set(), "configMaps": set(), "claims": set()}
    accounts: set[str] = set()
    for pool in spec.pools:
        pod = worker_pod_template(spec, pool, site)
        pspec = pod["spec"]
        unknown = set(pspec) - _POD_FIELDS_FREE - _POD_FIELDS_CHECKED
        if unknown:
            raise ValueError(f"pool {pool.name}: the worker pod template sets {sorted(unknown)}, which the admission "
                             "policy does not judge: extend provisioner/manifests/admission.py")
        want = {k: v for k, v in pod["metadata"]["labels"].items() if k != L_POOL}
        if labels is not None and want != labels:
            raise ValueError(f"pool {pool.name}: the worker labels differ between pools")
        labels = want
        if pspec.get("automountServiceAccountToken") is not False:
            raise ValueError(f"pool {pool.name}: the worker pod template mounts a ServiceAccount token")
        accounts.add(pspec.get("serviceAccountName", "default"))
        images[pool.name] = sorted({c["image"] for c in pspec["containers"]})
        added: set[str] = set()
        for c in pspec["containers"]:
            sc = c.get("securityContext") or {}
            if (sc.get("privileged") is not False or sc.get("allowPrivilegeEscalation") is not False
                    or "ALL" not in sc.get("capabilities", {}).get("drop", ())
                    or c.get("command") or c.get("args")):
                raise ValueError(f"pool {pool.name}: container {c['name']} of the template is not confined as the "
                                 "admission policy requires")
            added |= set(sc["capabilities"].get("add", ()))
        caps[pool.name] = sorted(added)
        if pspec.get("hostNetwork"):
            host_network.append(pool.name)
        profiles = [pspec.get("securityContext", {}).get("seccompProfile")]
        profiles += [(c.get("securityContext") or {}).get("seccompProfile") for c in pspec["containers"]]
        if any(p != profiles[0] for p in profiles) or not profiles[0]:
            raise ValueError(f"pool {pool.name}: the pod and its containers must set one and the same seccomp profile")
        seccomp[pool.name] = dict(profiles[0])
        for vol in pspec["volumes"]:
            (kind,) = set(vol) - {"name"}
            if kind not in _VOLUME_SOURCES:
                raise ValueError(f"pool {pool.name}: volume {vol['name']} is a {kind}, which the admission policy "
                                 "does not allow")
            var, key = _VOLUME_SOURCES[kind]
            if var:
                sources[var].add(vol[kind][key])
    if len(accounts) != 1:
        raise ValueError(f"the worker pod templates use different ServiceAccounts: {sorted(accounts)}")
    assert labels is not None  # a spec has at least one pool
    return {"workerLabels": labels, "poolImages": images, "poolCaps": caps, "hostNetworkPools": host_network,
            "poolSeccomp": seccomp,
            "secrets": sorted(sources["secrets"]), "configMaps": sorted(sources["configMaps"]),
            "claims": sorted(sources["claims"]), "serviceAccount": accounts.pop()}


def _var(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def _seccomp_is_the_pools(profile: str) -> str:
    """CEL: the seccompProfile `profile` is the pool's (its type, and for Localhost its profile),
    field by field (an object of the pod against a map literal)."""
    return (f"({profile}.type == variables.seccomp.type && ({profile}.type != 'Localhost' || "
            f"(has({profile}.localhostProfile) && {profile}.localhostProfile == variables.seccomp.localhostProfile)))")


# Computed from the spec-dependent ones above; no spec value in them.
STATIC_VARIABLES: list[dict[str, str]] = [
    _var("labels", "has(object.metadata.labels) ? object.metadata.labels : {}"),
    _var("pool", f"'{L_POOL}' in variables.labels ? variables.labels['{L_POOL}'] : ''"),
    _var("images", "variables.pool in variables.poolImages ? variables.poolImages[variables.pool] : []"),
    _var("caps", "variables.pool in variables.poolCaps ? variables.poolCaps[variables.pool] : []"),
    _var("hostNetwork", "variables.pool in variables.hostNetworkPools"),
    _var("seccomp", "variables.pool in variables.poolSeccomp ? variables.poolSeccomp[variables.pool] : "
                    "{'type': 'RuntimeDefault'}"),
    _var("containers", "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"),
    _var("volumes", "has(object.spec.volumes) ? object.spec.volumes : []"),
    _var("badLabels", "variables.workerLabels.filter(k, !(k in variables.labels) || "
                      "variables.labels[k] != variables.workerLabels[k])"),
    _var("badImages", "variables.containers.filter(c, !has(c.image) || !(c.image in variables.images))"),
    _var("commands", "variables.containers.filter(c, has(c.command) || has(c.args))"),
    _var("privileged", "variables.containers.filter(c, has(c.securityContext) && "
                       "has(c.securityContext.privileged) && c.securityContext.privileged)"),
    _var("escalating", "variables.containers.filter(c, !has(c.securityContext) || "
                       "!has(c.securityContext.allowPrivilegeEscalation) || "
                       "c.securityContext.allowPrivilegeEscalation)"),
    _var("badCaps", "variables.containers.filter(c, !has(c.securityContext) || "
                    "!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.drop) || "
                    "!('ALL' in c.securityContext.capabilities.drop) || "
                    "(has(c.securityContext.capabilities.add) && "
                    "!c.securityContext.capabilities.add.all(a, a in variables.caps)))"),
    _var("unconfined", "variables.containers.filter(c, has(c.securityContext) && "
                       "((has(c.securityContext.seccompProfile) && "
                       "!(" + _seccomp_is_the_pools("c.securityContext.seccompProfile") + ")) || "
                       "(has(c.securityContext.procMount) && c.securityContext.procMount != 'Default') || "
                       "(has(c.securityContext.appArmorProfile) && "
                       "c.securityContext.appArmorProfile.type == 'Unconfined')))"),
    _var("hostPorts", "variables.containers.filter(c, has(c.ports) && c.ports.exists(p, has(p.hostPort) && "
                      "p.hostPort != 0 && !(variables.hostNetwork && p.hostPort == p.containerPort)))"),
    _var("badVolumes", "variables.volumes.filter(v, !((has(v.secret) && has(v.secret.secretName) && "
                       "v.secret.secretName in variables.secrets) || (has(v.configMap) && has(v.configMap.name) && "
                       "v.configMap.name in variables.configMaps) || (has(v.persistentVolumeClaim) && "
                       "v.persistentVolumeClaim.claimName in variables.claims) || has(v.emptyDir)))"),
]


def _rule(expression: str, message: str, message_expression: str) -> dict[str, str]:
    """One refusal: `expression` must hold; `message_expression` says what is refused (CEL), with
    `message` as the fallback."""
    return {"expression": expression, "message": PREFIX + message,
            "messageExpression": f"'{PREFIX}' + {message_expression}", "reason": "Forbidden"}


VALIDATIONS: list[dict[str, str]] = [
    _rule("size(variables.badLabels) == 0", "the pod lacks the worker labels",
          "'the pod lacks the worker label ' + variables.badLabels[0] + '=' + "
          "variables.workerLabels[variables.badLabels[0]]"),
    _rule("variables.pool in variables.poolImages", "the pool label names no pool of the spec",
          f"'the pool label {L_POOL}=' + variables.pool + ' names no pool of the spec'"),
    _rule("size(variables.badImages) == 0", "a container runs an image that is not its pool's",
          "'container ' + variables.badImages[0].name + ' runs image ' + "
          "(has(variables.badImages[0].image) ? variables.badImages[0].image : '(none)') + "
          "', not the image of pool ' + variables.pool"),
    _rule("size(variables.commands) == 0", "a container sets its own command or args",
          "'container ' + variables.commands[0].name + ' sets its own command or args (the template runs the "
          "entrypoint of the image)'"),
    _rule("size(variables.privileged) == 0", "a container is privileged",
          "'container ' + variables.privileged[0].name + ' is privileged'"),
    _rule("size(variables.escalating) == 0", "a container may escalate privileges",
          "'container ' + variables.escalating[0].name + ' may escalate privileges "
          "(the template sets allowPrivilegeEscalation: false)'"),
    _rule("size(variables.badCaps) == 0", "a container has capabilities the template does not give",
          "'container ' + variables.badCaps[0].name + ' has capabilities the template of pool ' + variables.pool + "
          "' does not give (it drops ALL and adds only its own)'"),
    _rule("size(variables.unconfined) == 0 && has(object.spec.securityContext) && "
                         "has(object.spec.securityContext.seccompProfile) && "
                         + _seccomp_is_the_pools("object.spec.securityContext.seccompProfile"),
          "the pod or a container is not confined as the template is",
          "(size(variables.unconfined) > 0 ? 'container ' + variables.unconfined[0].name : 'the pod') + "
          "' is not confined as the template is (seccomp ' + variables.seccomp.type + ' as the template of pool ' + "
          "variables.pool + ', procMount Default, AppArmor not Unconfined)'"),
    _rule("!has(object.spec.hostNetwork) || !object.spec.hostNetwork || variables.hostNetwork",
          "hostNetwork is set but the pool's template has no host network",
          "'hostNetwork is set but the template of pool ' + variables.pool + ' has no host network'"),
    _rule("!has(object.spec.hostPID) || !object.spec.hostPID", "hostPID is set",
          "'hostPID is set (no template shares the process namespace of the node)'"),
    _rule("!has(object.spec.hostIPC) || !object.spec.hostIPC", "hostIPC is set",
          "'hostIPC is set (no template shares the IPC namespace of the node)'"),
    _rule("size(variables.hostPorts) == 0", "a container asks for a host port",
          "'container ' + variables.hostPorts[0].name + ' asks for a host port'"),
    _rule("size(variables.badVolumes) == 0", "a volume is not one of the template's",
          "'volume ' + variables.badVolumes[0].name + ' is not one of the template volumes (its Secret, ConfigMap, "
          "claim and emptyDir; never a hostPath or a projected token)'"),
    _rule("has(object.spec.automountServiceAccountToken) && !object.spec.automountServiceAccountToken",
          "the pod would mount a ServiceAccount token",
          "'the pod would mount a ServiceAccount token (the template sets automountServiceAccountToken: false)'"),
    _rule("!has(object.spec.serviceAccountName) || "
                            "object.spec.serviceAccountName == variables.serviceAccount",
          "the pod runs as another ServiceAccount than the template's",
          "'the pod runs as ServiceAccount ' + object.spec.serviceAccountName + ', not ' + variables.serviceAccount"),
    _rule("!has(object.spec.ephemeralContainers) || size(object.spec.ephemeralContainers) == 0",
          "the pod has ephemeral containers", "'the pod has ephemeral containers'"),
]

MATCH_CONSTRAINTS: dict[str, Any] = {"resourceRules": [{
    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
    "resources": ["pods", "pods/ephemeralcontainers"]}]}


def _metadata(spec: ClusterSpec) -> dict[str, Any]:
    return {"name": policy_name(spec), "labels": base_labels(spec, CONTROLLER)}


def worker_pod_policy(spec: ClusterSpec, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """The policy: pods created or updated by slurmctld's ServiceAccount must match a pool template."""
    dynamic = [_var(name, cel_literal(value)) for name, value in allowed(spec, site).items()]
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(spec),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": MATCH_CONSTRAINTS,
            "matchConditions": [{"name": "slurmctld-account",
                                 "expression": f"request.userInfo.username == {cel_literal(controller_user(spec))}"}],
            "variables": dynamic + STATIC_VARIABLES,
            "validations": VALIDATIONS,
        },
    }


def worker_pod_policy_binding(spec: ClusterSpec) -> dict[str, Any]:
    """Binds the policy to this namespace, refusing (Deny) what it does not admit."""
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _metadata(spec),
        "spec": {
            "policyName": policy_name(spec),
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": spec.namespace_name}}},
        },
    }


def admission_objects(spec: ClusterSpec, site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    return [worker_pod_policy(spec, site), worker_pod_policy_binding(spec)]
