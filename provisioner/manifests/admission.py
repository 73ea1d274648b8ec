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

from .. import kueue, settings
from ..config import ClusterSpec
from .common import K8sSite
from ..names import (A_ADOPTED, A_DO_NOT_DISRUPT, A_K8S_NODE, A_SAFE_TO_EVICT, A_SPEC_HASH, CONTROLLER, L_BUSY, L_NODE, L_POOL,
                     base_labels)
from .workers import worker_pod_template

API_VERSION = "admissionregistration.k8s.io/v1"
PREFIX = "slurmk8s: the controller may only create worker pods from the pool templates: "
# The pod-level fields a template may set that the policy has nothing to say about (scheduling,
# DNS, lifecycle) and those it checks below; any other field in a template stops allowed().
_POD_FIELDS_FREE = {"subdomain", "restartPolicy", "terminationGracePeriodSeconds", "enableServiceLinks", "dnsPolicy",
                    "dnsConfig", "affinity", "nodeSelector", "tolerations", "priorityClassName"}
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


def cel_dyn_literal(value: Any) -> str:
    """A CEL literal of JSON data whose maps and lists mix value types (a pod template): as
    :func:`cel_literal`, each value of a map and each element of a list wrapped in ``dyn()``, which
    the API server's CEL requires of mixed literals (it checks aggregate literals for one type).
    <, > and & are escaped as Go's encoding/json (Helm's ``toJson``) escapes them, so the chart's
    ``slurmk8s.celLiteral`` writes the same text."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_json(k)}:dyn({cel_dyn_literal(value[k])})" for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(f"dyn({cel_dyn_literal(v)})" for v in value) + "]"
    return _go_json(value)


def _go_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


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
    templates: dict[str, Any] = {}
    resources: dict[str, list[str]] = {}
    domains: dict[str, Any] = {}
    for pool in spec.pools:
        pod = worker_pod_template(spec, pool, site)
        pspec = pod["spec"]
        unknown = set(pspec) - _POD_FIELDS_FREE - _POD_FIELDS_CHECKED
        if unknown:
            raise ValueError(f"pool {pool.name}: the worker pod template sets {sorted(unknown)}, which the admission "
                             "policy does not judge: extend provisioner/manifests/admission.py")
        if len(pspec["containers"]) != 1 or set(pspec.get("affinity", {})) - {"podAffinity"}:
            raise ValueError(f"pool {pool.name}: the admission policy compares a pod with one container and no node "
                             "affinity of the template's own (a resume sets the node's): extend "
                             "provisioner/manifests/admission.py")
        templates[pool.name] = pod
        resources[pool.name] = sorted({"cpu", "memory", pool.gpu_resource, *pool.extra_resources})
        if pool.domain_label:
            domains[pool.name] = {"label": pool.domain_label, "values": sorted({d.name for d in pool.domains})}
        # every pool's (the template of each holds it to its own pool's, Kueue's queue included)
        want = {k: v for k, v in pod["metadata"]["labels"].items()
                if k not in (L_POOL, kueue.QUEUE_LABEL, kueue.PRIORITY_LABEL)}
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
            "claims": sorted(sources["claims"]), "serviceAccount": accounts.pop(),
            "poolTemplates": templates, "poolResources": resources, "poolDomains": domains}


# The spec-dependent variables whose literals mix value types (cel_dyn_literal).
DYN_VARIABLES = {"poolTemplates", "poolDomains"}


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


# ---- the whole pod against its pool's template (poolTemplates: worker_pod_template per pool)
#
# Every field of the pod, its metadata's labels and annotations and its one container must be the
# template's, but for what worker_pod sets per Slurm node (and what the API server fills in itself).
# Per node, of the pod spec: the hostname (the pod's name), the volumes (dshm's sizeLimit), the
# node's placement (nodeAffinity on the Kubernetes node's name, or on the pool's domain label and
# one of its domains), and nodeName once the scheduler bound the pod (an update keeps it).
POD_PER_NODE = ["affinity", "containers", "hostname", "nodeName", "schedulingGates", "tolerations", "volumes"]
# Of the container: SLURMK8S_NODENAME (the pod's name) and the GPU variables in env, the
# resources (the pool's resource names, any amount), the ports (hostPort = containerPort under
# hostNetwork, the API server's default).
CONTAINER_PER_NODE = ["env", "ports", "resources"]
NODE_ENV = [settings.GPUS, settings.GPU_TYPE]
# Of the metadata: the node label (the pod's name), the busy label ("true": reconcile/busy.py) and
# these annotations (any value).
ANNOTATIONS_PER_NODE = [A_SPEC_HASH, A_K8S_NODE, A_ADOPTED, A_DO_NOT_DISRUPT, A_SAFE_TO_EVICT]
# A pool under Kueue (its template has the queue label): the power-up's pod group (label, total),
# the pod's role in it, and what Kueue's webhook adds before this policy runs: the managed label
# and Kueue's scheduling gates (checked by their own rule: only Kueue's, only in such a pool).
KUEUE_ANNOTATIONS_PER_NODE = [kueue.GROUP_TOTAL, kueue.ROLE_HASH]
# What the API server fills in a pod that does not set it (defaulting, the ServiceAccount and
# Priority admission plugins; DefaultTolerationSeconds adds the two NoExecute tolerations below).
POD_DEFAULTS = ("{'preemptionPolicy': dyn('PreemptLowerPriority'), 'priority': dyn(0), "
                "'schedulerName': dyn('default-scheduler'), 'serviceAccount': dyn(variables.serviceAccount), "
                "'serviceAccountName': dyn(variables.serviceAccount)}")
CONTAINER_DEFAULTS = "{'terminationMessagePath': '/dev/termination-log', 'terminationMessagePolicy': 'File'}"
DEFAULT_TOLERATIONS = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]


def _list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _field_ok(obj: str, tmpl: str, key: str, skip: list[str], defaults: str = "{}") -> str:
    """CEL: field `key` of map `obj` is one `skip` names, or the template's, or (absent from the
    template) the API server's default."""
    return (f"({key} in {_list(skip)} || ({key} in {tmpl} ? {obj}[{key}] == {tmpl}[{key}] : "
            f"({key} in {defaults} && {obj}[{key}] == {defaults}[{key}])))")


def _off(obj: str, tmpl: str, skip: list[str], defaults: str = "{}", key: str = "k") -> str:
    """CEL: the fields of `obj` not as the template `tmpl` has them (a list of names)."""
    return f"{obj}.filter({key}, !{_field_ok(obj, tmpl, key, skip, defaults)})"


def _missing(obj: str, tmpl: str, skip: list[str], key: str = "k") -> str:
    """CEL: the fields of the template `tmpl` that `obj` lacks (a list of names)."""
    return f"{tmpl}.filter({key}, !({key} in {_list(skip)}) && !({key} in {obj}))"


def _same(obj: str, tmpl: str, skip: list[str], key: str) -> str:
    return f"(size({_off(obj, tmpl, skip, key=key)}) == 0 && size({_missing(obj, tmpl, skip, key=key)}) == 0)"


_NODE_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"


def _placement(match: str, key: str, value: str) -> str:
    """CEL: the nodeAffinity worker_pod's placement writes (one term, one requirement, one value)."""
    # (spaced: no two braces together, which the chart's copy would take for Helm's)
    return (f"{{'{_NODE_AFFINITY}': {{'nodeSelectorTerms': [{{'{match}': [{{'key': dyn({key}), "
            f"'operator': dyn('In'), 'values': dyn([{value}])}}]}}] }} }}")


def _one_value(match: str) -> str:
    t = "variables.nodeTerm"
    return (f"has({t}.{match}) && size({t}.{match}) == 1 && has({t}.{match}[0].values) && "
            f"size({t}.{match}[0].values) == 1 ? {t}.{match}[0].values[0] : ''")


_EMPTY_TEMPLATE = "{'metadata': dyn({}), 'spec': dyn({'containers': dyn([dyn({})]), 'volumes': dyn([])})}"

TEMPLATE_VARIABLES: list[dict[str, str]] = [
    _var("tmpl", f"variables.pool in variables.poolTemplates ? variables.poolTemplates[variables.pool] : "
                 f"{_EMPTY_TEMPLATE}"),
    _var("tSpec", "variables.tmpl.spec"),
    _var("tLabels", "has(variables.tmpl.metadata.labels) ? variables.tmpl.metadata.labels : {}"),
    _var("tAnnotations", "has(variables.tmpl.metadata.annotations) ? variables.tmpl.metadata.annotations : {}"),
    _var("annotations", "has(object.metadata.annotations) ? object.metadata.annotations : {}"),
    # an update (a resume's adoption mark) may keep what the pod already had, and only that
    _var("oldLabels", "request.operation == 'UPDATE' && has(oldObject.metadata.labels) ? "
                      "oldObject.metadata.labels : {}"),
    _var("oldAnnotations", "request.operation == 'UPDATE' && has(oldObject.metadata.annotations) ? "
                           "oldObject.metadata.annotations : {}"),
    _var("kueuePool", f"'{kueue.QUEUE_LABEL}' in variables.tLabels"),
    _var("offLabels", f"variables.labels.filter(k, !(k == '{L_NODE}' ? variables.labels[k] == object.metadata.name : "
                      "(k in variables.tLabels && variables.labels[k] == variables.tLabels[k])) && "
                      f"!(k == '{L_BUSY}' && variables.labels[k] == 'true') && "
                      f"!(variables.kueuePool && (k == '{kueue.GROUP_LABEL}' || k == '{kueue.MANAGED_LABEL}' && "
                      "variables.labels[k] == 'true')) && "
                      "!(k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k]))"),
    _var("offAnnotations", f"variables.annotations.filter(k, !(k in {_list(ANNOTATIONS_PER_NODE)}) && "
                           f"!(variables.kueuePool && k in {_list(KUEUE_ANNOTATIONS_PER_NODE)}) && "
                           "!(k in variables.tAnnotations && variables.annotations[k] == variables.tAnnotations[k]) && "
                           "!(k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.annotations[k]))"
                           " + variables.tAnnotations.filter(k, !(k in variables.annotations))"),
    _var("podDefaults", POD_DEFAULTS),
    # an update may keep a field as it was: Kueue, admitting a pod, writes the flavor's
    # nodeSelector and tolerations into it, and the resume's adoption mark comes after
    _var("oldSpec", "request.operation == 'UPDATE' ? dyn(oldObject.spec) : dyn({})"),
    # a pool with a PriorityClass: the Priority plugin writes the class's priority and preemption
    # policy (the class is the template's: a pod naming another is refused for that field)
    _var("offFields", "object.spec.filter(k, !" + _field_ok("object.spec", "variables.tSpec", "k", POD_PER_NODE,
                                                            "variables.podDefaults")
         + " && !(k in variables.oldSpec && object.spec[k] == variables.oldSpec[k])"
         + " && !(has(variables.tSpec.priorityClassName) && k in ['priority', 'preemptionPolicy']))"),
    # the one field the refusal names, the same on every try (a map's order is random in the API
    # server): the least by name of those the creator set, before those the API server fills in
    # from them (the Priority plugin's priority, from priorityClassName)
    _var("offSet", "variables.offFields.filter(k, !(k in variables.podDefaults))"),
    _var("offNamed", "(size(variables.offSet) > 0 ? variables.offSet : variables.offFields)"
                     ".filter(k, (size(variables.offSet) > 0 ? variables.offSet : variables.offFields)"
                     ".all(j, j >= k))"),
    _var("missingFields", _missing("object.spec", "variables.tSpec", POD_PER_NODE)),
    _var("tolerations", "has(object.spec.tolerations) ? object.spec.tolerations : []"),
    _var("tTolerations", "has(variables.tSpec.tolerations) ? variables.tSpec.tolerations : []"),
    _var("oldTolerations", "has(variables.oldSpec.tolerations) ? variables.oldSpec.tolerations : []"),
    _var("offTolerations", "variables.tolerations.filter(t, !(t in variables.tTolerations) && "
                           "!(t in variables.oldTolerations) && !(size(t) == 4 && "
                           f"has(t.key) && t.key in {_list(DEFAULT_TOLERATIONS)} && has(t.operator) && "
                           "t.operator == 'Exists' && has(t.effect) && t.effect == 'NoExecute' && "
                           "has(t.tolerationSeconds))) + variables.tTolerations.filter(t, !(t in variables.tolerations))"),
    _var("affinity", "has(object.spec.affinity) ? object.spec.affinity : {}"),
    _var("tAffinity", "has(variables.tSpec.affinity) ? variables.tSpec.affinity : {}"),
    _var("nodeAffinity", "'nodeAffinity' in variables.affinity ? variables.affinity.nodeAffinity : {}"),
    _var("nodeTerm", f"has(variables.nodeAffinity.{_NODE_AFFINITY}) && "
                     f"has(variables.nodeAffinity.{_NODE_AFFINITY}.nodeSelectorTerms) && "
                     f"size(variables.nodeAffinity.{_NODE_AFFINITY}.nodeSelectorTerms) == 1 ? "
                     f"variables.nodeAffinity.{_NODE_AFFINITY}.nodeSelectorTerms[0] : {{}}"),
    _var("pinnedTo", _one_value("matchFields")),
    _var("domain", _one_value("matchExpressions")),
    _var("placed", "variables.pinnedTo != '' && variables.nodeAffinity == "
                   + _placement("matchFields", "'metadata.name'", "variables.pinnedTo")
                   + " || variables.pool in variables.poolDomains && "
                   "variables.domain in variables.poolDomains[variables.pool]['values'] && variables.nodeAffinity == "
                   + _placement("matchExpressions", "variables.poolDomains[variables.pool]['label']",
                                "variables.domain")),
    _var("offAffinity", "variables.affinity.filter(k, k == 'nodeAffinity' ? !variables.placed : "
                        "!(k in variables.tAffinity && variables.affinity[k] == variables.tAffinity[k])) + "
                        "variables.tAffinity.filter(k, !(k in variables.affinity))"),
    _var("container", "object.spec.containers[0]"),
    _var("tContainer", "variables.tSpec.containers[0]"),
    _var("offContainer", _off("variables.container", "variables.tContainer", CONTAINER_PER_NODE, CONTAINER_DEFAULTS)
         + " + " + _missing("variables.container", "variables.tContainer", CONTAINER_PER_NODE)),
    _var("env", "has(variables.container.env) ? variables.container.env : []"),
    _var("tEnv", "has(variables.tContainer.env) ? variables.tContainer.env : []"),
    _var("offEnv", "variables.env.filter(e, !(e in variables.tEnv) && "
                   "!(e == {'name': dyn('SLURMK8S_NODENAME'), 'value': dyn(object.metadata.name)}) && "
                   f"!(size(e) == 2 && has(e.name) && e.name in {_list(NODE_ENV)} && has(e.value))) + "
                   "variables.tEnv.filter(e, !(e in variables.env))"),
    _var("ports", "has(variables.container.ports) ? variables.container.ports : []"),
    _var("tPorts", "has(variables.tContainer.ports) ? variables.tContainer.ports : []"),
    _var("offPorts", "variables.ports.filter(p, !(p in variables.tPorts) && !(variables.hostNetwork && "
                     "has(p.hostPort) && p.hostPort == p.containerPort && variables.tPorts.exists(q, !has(q.hostPort) && "
                     + _same("p", "q", ["hostPort"], "f") + "))) + "
                     "variables.tPorts.filter(q, !variables.ports.exists(p, p.name == q.name))"),
    _var("resourceNames", "variables.pool in variables.poolResources ? variables.poolResources[variables.pool] : []"),
    _var("resources", "has(variables.container.resources) ? variables.container.resources : {}"),
    _var("offResources", "variables.resources.filter(k, !(k in ['limits', 'requests']) || "
                         "variables.resources[k].exists(r, !(r in variables.resourceNames)))"),
    _var("tVolumes", "has(variables.tSpec.volumes) ? variables.tSpec.volumes : []"),
    _var("offVolumes", "variables.volumes.filter(v, !(v in variables.tVolumes) && !(size(v) == 2 && has(v.emptyDir) && "
                       "variables.tVolumes.exists(w, w.name == v.name && has(w.emptyDir) && "
                       + _same("(has(v.emptyDir) ? v.emptyDir : {})", "(has(w.emptyDir) ? w.emptyDir : {})", ["sizeLimit"], "f") + "))) + "
                       "variables.tVolumes.filter(w, !variables.volumes.exists(v, v.name == w.name))"),
]

_OF_POOL = "' other than the template of pool ' + variables.pool"
TEMPLATE_VALIDATIONS_ARGS: list[tuple[str, str, str]] = [
    ("size(variables.offLabels) == 0", "the pod has a label the template does not give",
     "'the pod has label ' + variables.offLabels[0] + '=' + variables.labels[variables.offLabels[0]] + "
     "', which the template of pool ' + variables.pool + ' does not give'"),
    ("size(variables.offAnnotations) == 0", "the pod's annotations are not the template's",
     "'annotation ' + variables.offAnnotations[0] + ' is not as the template of pool ' + variables.pool + "
     "' has it'"),
    (f"'{L_NODE}' in variables.labels && variables.labels['{L_NODE}'] == object.metadata.name && "
     "has(object.spec.hostname) && object.spec.hostname == object.metadata.name",
     "the pod's hostname and node label are not its name",
     f"'the hostname and the label {L_NODE} of pod ' + object.metadata.name + ' must be its name, the Slurm node\\'s'"),
    ("size(variables.offFields) == 0", "the pod sets a field other than the template",
     "'the pod sets ' + variables.offNamed[0] + " + _OF_POOL
     + " + ' (only the node\\'s name, placement and size differ from it)'"),
    ("!has(object.spec.schedulingGates) || variables.kueuePool && "
     f"object.spec.schedulingGates.all(g, has(g.name) && g.name in {_list(list(kueue.GATES))})",
     "the pod has scheduling gates, and only Kueue's in a pool under Kueue may",
     "'the pod has scheduling gates other than Kueue\\'s, or pool ' + variables.pool + ' is under no Kueue queue'"),
    ("size(variables.missingFields) == 0", "the pod lacks a field of the template",
     "'the pod lacks ' + variables.missingFields[0] + ', which the template of pool ' + variables.pool + ' sets'"),
    ("!has(object.spec.nodeName) || request.operation == 'UPDATE' && has(oldObject.spec.nodeName) && "
     "oldObject.spec.nodeName == object.spec.nodeName",
     "the pod names its Kubernetes node (nodeName)",
     "'the pod sets nodeName ' + object.spec.nodeName + ' (the scheduler places a worker pod, past its taints)'"),
    ("size(variables.offTolerations) == 0", "the pod's tolerations are not the template's",
     "'the pod tolerates ' + (has(variables.offTolerations[0].key) ? variables.offTolerations[0].key : "
     "'every taint') + ' other than the template of pool ' + variables.pool + ' (or lacks its toleration)'"),
    ("size(variables.offAffinity) == 0", "the pod's affinity is not the template's and the node's placement",
     "'the pod sets affinity ' + variables.offAffinity[0] + " + _OF_POOL
     + " + ' and the placement of one Slurm node'"),
    ("size(object.spec.containers) == 1 && size(variables.offContainer) == 0",
     "the container is not the template's",
     "(size(object.spec.containers) != 1 ? 'the pod has ' + string(size(object.spec.containers)) + "
     "' containers, the template one' : 'container ' + variables.container.name + ' sets ' + "
     "variables.offContainer[0] + " + _OF_POOL + ")"),
    ("size(variables.offEnv) == 0", "an environment variable is not the template's",
     "'container ' + variables.container.name + ' sets env ' + (has(variables.offEnv[0].name) ? "
     "variables.offEnv[0].name : '') + " + _OF_POOL + " + ' (a Secret, ConfigMap or value of its own, or one "
     "it lacks)'"),
    ("size(variables.offPorts) == 0", "a container port is not the template's",
     "'container ' + variables.container.name + ' has port ' + string(variables.offPorts[0].containerPort) + "
     + _OF_POOL),
    ("size(variables.offResources) == 0", "the container asks for resources the pool does not use",
     "'container ' + variables.container.name + ' sets resources ' + variables.offResources[0] + "
     "' of a resource pool ' + variables.pool + ' does not use (DRA claims, a device of another pool)'"),
    ("size(variables.offVolumes) == 0", "a volume is not the template's",
     "'volume ' + variables.offVolumes[0].name + ' is not as the template of pool ' + variables.pool + ' has it'"),
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

VALIDATIONS += [_rule(*args) for args in TEMPLATE_VALIDATIONS_ARGS]
STATIC_VARIABLES += TEMPLATE_VARIABLES

MATCH_CONSTRAINTS: dict[str, Any] = {"resourceRules": [{
    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
    "resources": ["pods", "pods/ephemeralcontainers"]}]}


def _metadata(spec: ClusterSpec) -> dict[str, Any]:
    return {"name": policy_name(spec), "labels": base_labels(spec, CONTROLLER)}


def worker_pod_policy(spec: ClusterSpec, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """The policy: pods created or updated by slurmctld's ServiceAccount must match a pool template."""
    dynamic = [_var(name, (cel_dyn_literal if name in DYN_VARIABLES else cel_literal)(value))
               for name, value in allowed(spec, site).items()]
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
