"""Checks against the live cluster before `slurmk8s up` / `preview` change anything.

A storage class that does not exist, a volume that no static PersistentVolume can hold, a kept claim
the spec would shrink or move, a missing password Secret, an external database that refuses the
credentials: each would otherwise surface as a pod Pending or crash-looping ten minutes into `up`,
with half the objects applied. Here they become one error naming the spec field and the fix, before
Pulumi runs.

:func:`storage_issues`, :func:`secret_issues` and :func:`kueue_issues` are pure (lists of API objects in, issues out);
:func:`read_cluster` gathers those objects; :func:`check_database` runs a short-lived pod that
tests the external database (only `up` runs it: `preview` creates nothing).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from .. import kueue
from .. import manifests as m
from .. import volumes
from ..config import ClusterSpec, Volume, parse_quantity
from ..errors import Issue, Problem
from ..manifests.admission import API_VERSION as ADMISSION_API

DEFAULT_CLASS_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                             "storageclass.beta.kubernetes.io/is-default-class")
STATIC_PROVISIONER = "kubernetes.io/no-provisioner"
DB_CHECK_TIMEOUT = 120.0


class PreflightError(Problem):
    """The live cluster cannot take the spec as it is; nothing was applied."""


@dataclass(frozen=True)
class ClusterFacts:
    """What the checks read from the API server (plain dicts as `kubectl get -o json` shows them)."""

    storage_classes: Sequence[Mapping[str, Any]] = ()
    claims: Sequence[Mapping[str, Any]] = ()  # PVCs in the cluster's namespace
    volumes: Sequence[Mapping[str, Any]] = ()  # PersistentVolumes
    namespace_exists: bool = True
    secrets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> Secret, namespace only
    local: bool = False  # the local cluster of this machine (`slurmk8s cluster up`)
    reclaimable: frozenset[str] = frozenset()  # local volumes `up` gives back before it applies (preview)
    # the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30)
    admission_policies: bool = True
    # Kueue (read only when a pool names a queue): the kueue.x-k8s.io version served ("" when none),
    # the namespace's LocalQueues and the cluster's ClusterQueues and WorkloadPriorityClasses by name
    kueue_api: str = ""
    local_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cluster_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    priority_classes: frozenset[str] = frozenset()
    # Kubernetes PriorityClasses by name (read only when a pool names one: pools[].priority_class)
    pod_priority_classes: frozenset[str] = frozenset()


def volumes_of(spec: ClusterSpec) -> list[tuple[str, str, Volume]]:
    """(spec field, claim name, volume) of every claim the spec makes."""
    out = [("home", m.HOME_PVC, spec.storage.home), ("controller_state", m.CONTROLLER_STATE_PVC,
                                                      spec.storage.controller_state)]
    if spec.accounting.enabled and spec.accounting.external_database is None:
        out.append(("database", m.DATABASE_PVC, spec.storage.database))
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _is_default(sc: Mapping[str, Any]) -> bool:
    ann = (sc.get("metadata") or {}).get("annotations") or {}
    return any(ann.get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS)


def _bytes(q: Any) -> float:
    try:
        return parse_quantity(q)
    except ValueError:
        return 0.0


def storage_issues(spec: ClusterSpec, facts: ClusterFacts) -> list[Issue]:
    issues: list[Issue] = []
    classes = {_name(sc): sc for sc in facts.storage_classes}
    defaults = [n for n, sc in classes.items() if _is_default(sc)]
    claims = {_name(c): c for c in facts.claims}
    have = ", ".join(sorted(classes)) or "none"
    for fname, claim, vol in volumes_of(spec):
        where = f"storage.{fname}"
        if vol.storage_class is not None and vol.storage_class not in classes:
            issues.append(Issue(f"{where}.storage_class",
                                f"StorageClass {vol.storage_class!r} does not exist in the cluster (it has: {have})",
                                "create it, pick one of those, or leave storage_class unset for the cluster's default"))
            continue
        existing = claims.get(claim)
        if existing is not None:
            issues += _kept_claim_issues(where, claim, vol, existing, classes)
            continue
        cls_name = vol.storage_class or (defaults[0] if defaults else None)
        if cls_name is None:
            issues.append(Issue(f"{where}.storage_class",
                                f"no storage_class given and the cluster has no default StorageClass (it has: {have})",
                                "set storage_class to one of those"))
            continue
        sc = classes.get(cls_name) or {}
        if sc.get("provisioner") == STATIC_PROVISIONER:
            issues += _static_issues(where, claim, vol, cls_name, spec.namespace_name, facts)
    return issues


def _kept_claim_issues(where: str, claim: str, vol: Volume, pvc: Mapping[str, Any],
                       classes: Mapping[str, Mapping[str, Any]]) -> list[Issue]:
    """A claim kept by `down`: Kubernetes refuses to shrink it, move it to another class or change its
    access mode; growing it needs a class that allows expansion."""
    issues = []
    pspec = pvc.get("spec") or {}
    current = ((pspec.get("resources") or {}).get("requests") or {}).get("storage")
    cls = pspec.get("storageClassName")
    if vol.storage_class is not None and cls is not None and vol.storage_class != cls:
        issues.append(Issue(f"{where}.storage_class",
                            f"the kept volume {claim} is of class {cls!r}, not {vol.storage_class!r} (a claim cannot "
                            "change class)", f"set storage_class: {cls}, or delete the volume with "
                            "`slurmk8s down --purge` (its data is lost)"))
    if vol.access_mode not in (pspec.get("accessModes") or [vol.access_mode]):
        issues.append(Issue(f"{where}.access_mode",
                            f"the kept volume {claim} is {', '.join(pspec.get('accessModes') or [])}, not "
                            f"{vol.access_mode}", "keep the volume's access mode, or `slurmk8s down --purge` first"))
    if current is not None and _bytes(vol.size) < _bytes(current):
        issues.append(Issue(f"{where}.size",
                            f"the kept volume {claim} is {current}; Kubernetes cannot shrink it to {vol.size}",
                            f"set {where}.size: {current} (or more)"))
    elif current is not None and _bytes(vol.size) > _bytes(current):
        sc = classes.get(cls or "") or {}
        if not sc.get("allowVolumeExpansion"):
            issues.append(Issue(f"{where}.size",
                                f"the kept volume {claim} is {current} and its StorageClass {cls!r} does not allow "
                                f"expansion to {vol.size}", f"set {where}.size: {current}, or use a class with "
                                "allowVolumeExpansion: true"))
    return issues


def _static_issues(where: str, claim: str, vol: Volume, cls: str, namespace: str, facts: ClusterFacts) -> list[Issue]:
    """A class without a provisioner binds only to PersistentVolumes made beforehand: one of them must
    be free (or reserved for this claim, and not still held by a deleted claim of the same name),
    hold the size and offer the access mode."""
    candidates = []
    uids = volumes.claim_uids({**c, "metadata": {**(c.get("metadata") or {}), "namespace": namespace}}
                              for c in facts.claims)
    held = []
    for pv in facts.volumes:
        ps = pv.get("spec") or {}
        if ps.get("storageClassName") != cls:
            continue
        ref = ps.get("claimRef") or {}
        free = (pv.get("status") or {}).get("phase") == "Available"
        mine = ref.get("name") == claim and ref.get("namespace") == namespace
        if mine and volumes.stale_reference(pv, uids, [namespace]) and _name(pv) not in facts.reclaimable:
            held.append(pv)  # Released: still bound to the deleted claim, no new claim binds to it
        elif not ref or mine or (free and not ref.get("name")):
            candidates.append(pv)
    if not candidates and held:
        pv = held[0]
        return [Issue(where, f"PersistentVolume {_name(pv)} is reserved for claim {namespace}/{claim} but still "
                             f"belongs to the deleted claim of that name ({volumes.phase(pv) or 'phase unknown'}, e.g. "
                             "after `slurmk8s down --purge`), so Kubernetes binds it to no new claim",
                      volumes.release_fix(_name(pv), local=facts.local and volumes.is_local_volume(pv),
                                          namespace=namespace))]
    if not candidates:
        return [Issue(f"{where}.storage_class",
                      f"StorageClass {cls!r} has no provisioner and no free PersistentVolume for claim "
                      f"{namespace}/{claim}", "create a PersistentVolume of that class (see "
                      "examples/localk8s/storage.yaml), or use a class with a provisioner")]
    fits = [pv for pv in candidates
            if _bytes(((pv.get("spec") or {}).get("capacity") or {}).get("storage")) >= _bytes(vol.size)
            and vol.access_mode in ((pv.get("spec") or {}).get("accessModes") or [])]
    if fits:
        return []
    offered = ", ".join(f"{_name(pv)} ({((pv.get('spec') or {}).get('capacity') or {}).get('storage', '?')}, "
                        f"{'/'.join((pv.get('spec') or {}).get('accessModes') or [])})" for pv in candidates)
    return [Issue(f"{where}.size",
                  f"{vol.size} {vol.access_mode} does not fit any PersistentVolume of class {cls!r} for "
                  f"{namespace}/{claim}: {offered}",
                  "lower the size (or change the access mode) to what a volume offers, or create a larger volume")]


def secret_issues(spec: ClusterSpec, facts: ClusterFacts) -> list[Issue]:
    ext = spec.accounting.external_database if spec.accounting.enabled else None
    if ext is None:
        return []
    ref = ext.password_secret
    ns = spec.namespace_name
    create = (f"kubectl create namespace {ns}; kubectl -n {ns} create secret generic {ref.name} "
              f"--from-literal={ref.key}=<password>")
    if not facts.namespace_exists:
        return [Issue("accounting.external_database.password_secret.name",
                      f"namespace {ns} does not exist yet, so neither does Secret {ref.name}",
                      f"create both before `slurmk8s up`: {create}")]
    secret = facts.secrets.get(ref.name)
    if secret is None:
        return [Issue("accounting.external_database.password_secret.name",
                      f"Secret {ref.name} not found in namespace {ns}", f"create it: {create.split('; ', 1)[1]}")]
    data = secret.get("data") or {}
    if ref.key not in data:
        return [Issue("accounting.external_database.password_secret.key",
                      f"Secret {ns}/{ref.name} has no key {ref.key!r} (it has: {', '.join(sorted(data)) or 'none'})",
                      "set password_secret.key to the key holding the password")]
    value = base64.b64decode(data[ref.key] or "").decode(errors="replace")
    if not value or any(c.isspace() or c in "#\"'\\" for c in value):
        return [Issue("accounting.external_database.password_secret.key",
                      f"the password in Secret {ns}/{ref.name} is empty or holds whitespace, '#', a quote or a "
                      "backslash, which slurmdbd.conf cannot carry", "give the database user another password")]
    return []


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def kueue_issues(spec: ClusterSpec, facts: ClusterFacts) -> list[Issue]:
    """A pool under a Kueue queue (``pools[].kueue``) needs Kueue's API, the LocalQueue in the cluster's
    namespace, its ClusterQueue, and the WorkloadPriorityClass it names: without them every worker pod
    of the pool would be created and wait forever (or be refused by Kueue's webhook)."""
    pools = [(i, p) for i, p in enumerate(spec.pools) if p.kueue is not None]
    if not pools:
        return []
    if not facts.kueue_api:
        names = ", ".join(p.name for _, p in pools)
        return [Issue(f"pools[{pools[0][0]}].kueue", f"pool(s) {names} name a Kueue queue, but the API server serves "
                      "no kueue.x-k8s.io API (Kueue is not installed)",
                      "install Kueue (docs/kueue.md), or remove the pools' kueue: to create their pods outside any queue")]
    issues: list[Issue] = []
    ns = spec.namespace_name
    for i, pool in pools:
        assert pool.kueue is not None
        where = f"pools[{i}].kueue"
        lq = facts.local_queues.get(pool.kueue.queue)
        if lq is None:
            have = ", ".join(sorted(facts.local_queues)) or "none"
            issues.append(Issue(f"{where}.queue", f"LocalQueue {pool.kueue.queue!r} not found in namespace {ns} "
                                f"(LocalQueues there: {have})",
                                f"create it before `slurmk8s up` (kubectl create namespace {ns}, then a LocalQueue "
                                f"{pool.kueue.queue} pointing at a ClusterQueue: docs/kueue.md), or fix the name"))
        else:
            cq = str((lq.get("spec") or {}).get("clusterQueue") or "")
            active = _condition(lq, "Active")
            if cq not in facts.cluster_queues:
                issues.append(Issue(f"{where}.queue", f"LocalQueue {ns}/{pool.kueue.queue} points at ClusterQueue "
                                    f"{cq!r}, which does not exist", "create the ClusterQueue, or point the "
                                    "LocalQueue at one that exists"))
            elif active is not None and active.get("status") == "False":
                issues.append(Issue(f"{where}.queue", f"LocalQueue {ns}/{pool.kueue.queue} is inactive: "
                                    f"{active.get('reason', '')}: {active.get('message', '')}".rstrip(": "),
                                    f"fix ClusterQueue {cq} (kubectl describe clusterqueue {cq})"))
        prio = pool.kueue.priority_class
        if prio is not None and prio not in facts.priority_classes:
            issues.append(Issue(f"{where}.priority_class", f"WorkloadPriorityClass {prio!r} not found",
                                "create it (docs/kueue.md), or leave priority_class out for Kueue's default"))
    return issues


# ---------------------------------------------------------------- the live cluster


def read_cluster(spec: ClusterSpec, api_client: Any) -> ClusterFacts:
    """Read what the checks need (storage classes, PVs, the namespace's PVCs and the password Secret,
    whether ValidatingAdmissionPolicy is served)."""
    import json

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    storage = client.StorageV1Api(api_client)
    ns = spec.namespace_name

    def items(resp: Any) -> list[dict[str, Any]]:
        return json.loads(resp.data)["items"]

    served = client.AdmissionregistrationV1Api(api_client).get_api_resources().resources or []
    policies = any(r.name == "validatingadmissionpolicies" for r in served)
    classes = items(storage.list_storage_class(_preload_content=False))
    volumes = items(core.list_persistent_volume(_preload_content=False))
    try:
        core.read_namespace(ns)
        exists = True
    except ApiException as err:
        if err.status != 404:
            raise
        exists = False
    claims = items(core.list_namespaced_persistent_volume_claim(ns, _preload_content=False)) if exists else []
    secrets: dict[str, Any] = {}
    ext = spec.accounting.external_database if spec.accounting.enabled else None
    if exists and ext is not None:
        try:
            # the raw response (its JSON in .data), not the V1Secret the client's types promise
            resp: Any = core.read_namespaced_secret(ext.password_secret.name, ns, _preload_content=False)
            secrets[ext.password_secret.name] = json.loads(resp.data)
        except ApiException as err:
            if err.status != 404:
                raise
    facts = ClusterFacts(classes, claims, volumes, exists, secrets, admission_policies=policies)
    if any(p.kueue is not None for p in spec.pools):
        facts = _with_kueue(facts, api_client, ns)
    if any(p.priority_class for p in spec.pools):
        found = client.SchedulingV1Api(api_client).list_priority_class(_preload_content=False)
        facts = replace(facts, pod_priority_classes=frozenset(_name(o) for o in items(found)))
    return facts


def _with_kueue(facts: ClusterFacts, api_client: Any, ns: str) -> ClusterFacts:
    """The Kueue objects :func:`kueue_issues` looks at (the API's preferred version, v1beta2 in 0.17)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    group = next((g for g in client.ApisApi(api_client).get_api_versions().groups or []
                  if g.name == kueue.GROUP), None)
    preferred = group.preferred_version if group is not None else None
    if preferred is None:
        return facts
    version = preferred.version
    api = client.CustomObjectsApi(api_client)

    def by_name(resp: Any) -> dict[str, Mapping[str, Any]]:  # the API's JSON (the client types it `object`)
        return {_name(o): o for o in resp.get("items") or []}

    local = by_name(api.list_namespaced_custom_object(kueue.GROUP, version, ns, "localqueues")) \
        if facts.namespace_exists else {}
    queues = by_name(api.list_cluster_custom_object(kueue.GROUP, version, "clusterqueues"))
    try:
        prios = frozenset(by_name(api.list_cluster_custom_object(kueue.GROUP, version, "workloadpriorityclasses")))
    except ApiException as err:
        if err.status != 404:
            raise
        prios = frozenset()
    return replace(facts, kueue_api=f"{kueue.GROUP}/{version}", local_queues=local, cluster_queues=queues,
                   priority_classes=prios)


def admission_issues(facts: ClusterFacts) -> list[Issue]:
    """The worker pods' admission policy (manifests/admission.py) needs ValidatingAdmissionPolicy v1."""
    if facts.admission_policies:
        return []
    return [Issue("kubernetes", f"the API server does not serve {ADMISSION_API} ValidatingAdmissionPolicy, "
                               "which holds slurmctld to creating the pool templates' worker pods only",
                  "use Kubernetes 1.30 or later (ValidatingAdmissionPolicy is GA there)")]


def priority_issues(spec: ClusterSpec, facts: ClusterFacts) -> list[Issue]:
    """A pool's PriorityClass must exist: the API server refuses every worker pod naming a missing one."""
    return [Issue(f"pools[{i}].priority_class", f"PriorityClass {p.priority_class!r} not found "
                  f"(PriorityClasses: {', '.join(sorted(facts.pod_priority_classes)) or 'none'})",
                  "create it (kubectl create priorityclass NAME --value=N), or fix the name, or leave "
                  "priority_class out for the cluster's default priority")
            for i, p in enumerate(spec.pools) if p.priority_class and p.priority_class not in facts.pod_priority_classes]


def check(spec: ClusterSpec, facts: ClusterFacts) -> None:
    issues = (admission_issues(facts) + storage_issues(spec, facts) + secret_issues(spec, facts)
              + kueue_issues(spec, facts) + priority_issues(spec, facts))
    if issues:
        raise PreflightError(issues, title="the cluster cannot take this spec (nothing was applied)")


DB_FIXES = {
    "credentials": "check the user and the password in the Secret (the database answered 'access denied')",
    "database": "create the database and grant the user all privileges on it "
                "(GRANT ALL ON <database>.* TO '<user>'@'%')",
    "host": "check accounting.external_database.host: the name does not resolve from the cluster's pods",
    "unreachable": "check host and port, and that the database admits connections from the cluster's pods",
    "secret": "fix the password in the Secret",
}


def check_database(spec: ClusterSpec, api_client: Any, echo: Callable[[str], Any],
                   timeout: float = DB_CHECK_TIMEOUT) -> None:
    """Test the external database from inside the namespace with the spec's address and the Secret's
    password (a pod from the slurmdbd image, deleted afterwards). Raises PreflightError."""
    ext = spec.accounting.external_database if spec.accounting.enabled else None
    if ext is None:
        return
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    ns = spec.namespace_name
    name = f"slurmk8s-db-check-{int(time.time())}"
    field_ = "accounting.external_database"
    t0 = time.monotonic()
    # the client takes a plain dict body (serialized as it is); its types name only V1Pod
    core.create_namespaced_pod(ns, m.db_check_pod(spec, name))  # type: ignore[arg-type]
    try:
        phase, reason = "Pending", ""
        while time.monotonic() - t0 < timeout:
            status = core.read_namespaced_pod(name, ns).status
            phase = (status.phase if status else None) or "Pending"
            if phase in ("Succeeded", "Failed"):
                break
            for cs in (status.container_statuses if status else None) or []:
                waiting = cs.state.waiting if cs.state else None
                if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                                  "CreateContainerConfigError"):
                    raise PreflightError(Issue("images.slurmdbd", f"the database check pod cannot start: "
                                               f"{waiting.reason}: {waiting.message or ''}".strip(),
                                               "make the slurmdbd image pullable from the cluster"),
                                         title="cannot test the external database (nothing was applied)")
            time.sleep(0.5)
        else:
            raise PreflightError(Issue(field_, f"the database check pod did not finish within {timeout:.0f}s "
                                       f"(phase {phase})", f"see `kubectl -n {ns} describe pod {name}`"),
                                 title="cannot test the external database (nothing was applied)")
        out = core.read_namespaced_pod_log(name, ns).strip().splitlines()
        line = out[-1] if out else ""
        if phase == "Succeeded" and line.startswith("ok"):
            echo(f"database check: {line} ({time.monotonic() - t0:.1f}s)")
            return
        kind = line.split(":", 1)[0].removeprefix("error ").strip() if line.startswith("error") else "other"
        reason = line.split(":", 1)[1].strip() if ":" in line else (line or f"check pod {phase}")
        raise PreflightError(Issue(field_, f"{ext.user}@{ext.host}:{ext.port}/{ext.database}: {reason}",
                                   DB_FIXES.get(kind, "check the database settings")),
                             title="the external accounting database is not usable (nothing was applied)")
    finally:
        _delete_pod(core, name, ns, echo)


def _delete_pod(core: Any, name: str, ns: str, echo: Callable[[str], Any], timeout: float = 30.0) -> None:
    """Delete the check pod and wait until it is gone (nothing of a refused `up` stays behind)."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            core.read_namespaced_pod(name, ns)
            time.sleep(0.5)
        echo(f"warning: the database check pod {ns}/{name} is still terminating after {timeout:.0f}s")
    except ApiException as err:
        if err.status != 404:
            echo(f"warning: could not delete the database check pod {ns}/{name}: {err.status} {err.reason}")
