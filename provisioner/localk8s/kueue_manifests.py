"""Kueue for the local cluster: upstream's rendered manifests changed for the lab. Pure, no I/O.

Input: the objects ``kubectl kustomize <kueue-config>/default`` renders from the module's own
config/ tree (shipped by the toolchain's ``kueue`` tool). Output: what ``slurmk8s cluster kueue up``
applies, changed in four ways (the traps of the Kueue probe, ../shared notes kueue.md):

1. the aggregated visibility API (APIService ``visibility.kueue.x-k8s.io``) is dropped: while it
   is unavailable API discovery fails for every client, and a namespace delete can hang;
2. every webhook, mutating and validating, gets a ``namespaceSelector`` that matches only the
   namespaces labelled ``slurmk8s.io/kueue=managed``: upstream's are ``failurePolicy: Fail`` and
   cluster-wide, so a stopped Kueue would block pod creation in every namespace (a cluster-scoped
   object, e.g. a ClusterQueue, still needs Kueue: a namespaceSelector does not apply to it);
3. Kueue's configuration manages plain Pods only (``integrations.frameworks: [pod]``), in those
   same namespaces only (``managedJobsNamespaceSelector``), without leader election (one replica:
   a restarted manager serves at once instead of waiting out the old lease) and without the
   visibility server (feature gate ``VisibilityOnDemand``: nothing would call it);
4. the manager runs the image built here (``imagePullPolicy: Never``: there is no registry), with
   requests that fit a 2-CPU node and probes that report Ready within seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from provisioner import kueue
from provisioner.errors import SlurmK8sError

NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
CONTAINER = "manager"
MANAGED_KEY = "slurmk8s.io/kueue"  # the namespace label that puts a namespace under Kueue
MANAGED_VALUE = "managed"
FIELD_MANAGER = "slurmk8s-kueue"
VERSION_ANNOTATION = "slurmk8s.io/kueue-version"
DIGEST_ANNOTATION = "slurmk8s.io/kueue-lab-digest"  # on the Deployment and its pod template
IMAGE_REPOSITORY = "slurmk8s/kueue"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
KUEUE_GROUP = kueue.GROUP

Doc = dict[str, Any]


class KueueManifestError(SlurmK8sError, ValueError):
    """Upstream's manifests are not what this renderer expects (another Kueue version's layout)."""

    reason = "KueueManifests"


@dataclass(frozen=True)
class LabSettings:
    """What the lab sets in upstream's manifests."""

    version: str
    image: str
    managed_key: str = MANAGED_KEY
    managed_value: str = MANAGED_VALUE
    # the manager idles at ~50 MiB RSS (probe); upstream asks for 500m / 512Mi
    cpu_request: str = "50m"
    memory_request: str = "128Mi"
    memory_limit: str = "512Mi"

    @property
    def managed_selector(self) -> Doc:
        return {"matchLabels": {self.managed_key: self.managed_value}}


@dataclass(frozen=True)
class Crd:
    """A Kueue CustomResourceDefinition: what `down` lists and deletes."""

    plural: str
    group: str
    namespaced: bool

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}"


@dataclass(frozen=True)
class LabManifests:
    """What `up` applies, in order: the Namespace and the CRDs first (server-side), then the rest."""

    namespace: Doc
    crds: tuple[Doc, ...]
    objects: tuple[Doc, ...]
    dropped: tuple[str, ...]  # "Kind/name" of each upstream object left out, for the log
    digest: str  # of everything applied: unchanged digest, unchanged Kueue

    @property
    def webhook_configurations(self) -> tuple[Doc, ...]:
        return tuple(d for d in self.objects if d["kind"] in WEBHOOK_KINDS)

    def custom_resources(self) -> tuple[Crd, ...]:
        return tuple(crd_of(d) for d in self.crds)


def ref(doc: Mapping[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def image_tag(version: str, inputs_hash: str) -> str:
    """The lab's image of Kueue `version`: one tag per build input (binary, base, Dockerfile)."""
    return f"{IMAGE_REPOSITORY}:{version}-{inputs_hash[:12]}"


def dockerfile(base_image: str) -> str:
    """The Kueue image: the project's trixie base plus the binary (the context holds `manager`).
    Kueue runs as a numeric non-root user (its pod says runAsNonRoot)."""
    return (f"FROM {base_image}\n"
            "COPY manager /manager\n"
            "USER 65532:65532\n"
            'ENTRYPOINT ["/manager"]\n')


def parse_documents(text: str) -> list[Doc]:
    """The objects of a multi-document YAML stream (kustomize's output), empty documents dropped."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 1.7 MB of CRDs: the C parser is ~10x faster
    return [d for d in yaml.load_all(text, Loader=loader) if d]


def is_visibility_api(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == "APIService" and (doc.get("spec") or {}).get("group") == VISIBILITY_GROUP


def restricted_selector(current: Mapping[str, Any] | None, settings: LabSettings) -> Doc:
    """A webhook's namespaceSelector narrowed to the managed namespaces: upstream's expressions (e.g.
    not kube-system, not kueue-system) are kept, the managed label is required on top."""
    out: Doc = copy.deepcopy(dict(current or {}))
    labels = dict(out.get("matchLabels") or {})
    if labels.get(settings.managed_key, settings.managed_value) != settings.managed_value:
        raise KueueManifestError(f"a webhook already selects {settings.managed_key}={labels[settings.managed_key]}")
    labels[settings.managed_key] = settings.managed_value
    out["matchLabels"] = labels
    return out


def restrict_webhooks(doc: Doc, settings: LabSettings) -> Doc:
    """A Mutating/ValidatingWebhookConfiguration whose every webhook calls Kueue only for objects
    in the managed namespaces."""
    out = copy.deepcopy(doc)
    hooks = out.get("webhooks") or []
    if not hooks:
        raise KueueManifestError(f"{ref(doc)} has no webhooks")
    for hook in hooks:
        hook["namespaceSelector"] = restricted_selector(hook.get("namespaceSelector"), settings)
    return out


def lab_configuration(text: str, settings: LabSettings) -> str:
    """Kueue's Configuration (the manager's config file) for the lab, as YAML."""
    config = yaml.safe_load(text)
    if not isinstance(config, dict) or config.get("kind") != "Configuration":
        raise KueueManifestError(f"{CONFIG_MAP}/{CONFIG_KEY} is not a Kueue Configuration")
    config["integrations"] = {**(config.get("integrations") or {}), "frameworks": ["pod"]}
    config["managedJobsNamespaceSelector"] = settings.managed_selector
    config["leaderElection"] = {**(config.get("leaderElection") or {}), "leaderElect": False}
    # the visibility API is not registered (1.): its server would only retry, logging an error each
    # time, for the front-proxy CA that a cluster without aggregation never publishes
    config["featureGates"] = {**(config.get("featureGates") or {}), "VisibilityOnDemand": False}
    return yaml.safe_dump(config, sort_keys=True)


def lab_config_map(doc: Doc, settings: LabSettings) -> Doc:
    out = copy.deepcopy(doc)
    data = out.get("data") or {}
    if CONFIG_KEY not in data:
        raise KueueManifestError(f"ConfigMap/{CONFIG_MAP} has no {CONFIG_KEY}")
    data[CONFIG_KEY] = lab_configuration(data[CONFIG_KEY], settings)
    return out


def manager_container(doc: Mapping[str, Any]) -> Doc:
    containers = doc["spec"]["template"]["spec"]["containers"]
    for container in containers:
        if container["name"] == CONTAINER:
            return container
    raise KueueManifestError(f"Deployment/{DEPLOYMENT} has no container {CONTAINER!r}")


def lab_deployment(doc: Doc, settings: LabSettings, digest: str) -> Doc:
    """The manager: our image, small requests, quick probes, and the digest of the lab's manifests on
    its pod template (the config file is a subPath mount, which a changed ConfigMap never reaches:
    a new digest rolls the pod instead)."""
    out = copy.deepcopy(doc)
    out["spec"]["replicas"] = 1
    # no leader election: two managers must never overlap, so the old pod goes before the new one starts
    out["spec"]["strategy"] = {"type": "Recreate"}
    meta = out["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), VERSION_ANNOTATION: settings.version,
                           DIGEST_ANNOTATION: digest}
    template = out["spec"]["template"]
    template["metadata"]["annotations"] = {**(template["metadata"].get("annotations") or {}),
                                           DIGEST_ANNOTATION: digest}
    container = manager_container(out)
    container["image"] = settings.image
    container["imagePullPolicy"] = "Never"
    container["resources"] = {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request},
                              "limits": {"memory": settings.memory_limit}}
    if "readinessProbe" in container:  # upstream: first look after 5 s, then every 10 s
        container["readinessProbe"] = {**container["readinessProbe"], "initialDelaySeconds": 1, "periodSeconds": 1}
    return out


def crd_of(doc: Mapping[str, Any]) -> Crd:
    spec = doc["spec"]
    return Crd(plural=spec["names"]["plural"], group=spec["group"], namespaced=spec["scope"] == "Namespaced")


def digest_of(docs: Iterable[Mapping[str, Any]]) -> str:
    text = json.dumps(list(docs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lab_manifests(upstream: Iterable[Mapping[str, Any]], settings: LabSettings) -> LabManifests:
    """Upstream's rendered objects (config/default) changed for the lab (see the module's docstring).
    Deterministic: the same input gives the same objects, in the same order, and the same digest."""
    namespace: Doc | None = None
    crds: list[Doc] = []
    objects: list[Doc] = []
    dropped: list[str] = []
    deployment: Doc | None = None
    seen = {kind: 0 for kind in WEBHOOK_KINDS}
    for original in upstream:
        doc = copy.deepcopy(dict(original))
        kind = doc.get("kind")
        if is_visibility_api(doc):
            dropped.append(ref(doc))
        elif kind == "Namespace":
            namespace = doc
        elif kind == "CustomResourceDefinition":
            crds.append(doc)
        elif kind in WEBHOOK_KINDS:
            seen[kind] += 1
            objects.append(restrict_webhooks(doc, settings))
        elif kind == "ConfigMap" and doc["metadata"]["name"] == CONFIG_MAP:
            objects.append(lab_config_map(doc, settings))
        elif kind == "Deployment" and doc["metadata"]["name"] == DEPLOYMENT:
            deployment = doc  # last: its annotation is the digest of everything else
        else:
            objects.append(doc)
    if namespace is None or namespace["metadata"]["name"] != NAMESPACE:
        raise KueueManifestError(f"upstream's manifests have no Namespace {NAMESPACE}")
    if deployment is None:
        raise KueueManifestError(f"upstream's manifests have no Deployment {DEPLOYMENT}")
    if not all(seen.values()):
        raise KueueManifestError(f"upstream's manifests lack one of {', '.join(WEBHOOK_KINDS)}")
    if not any(d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP for d in objects):
        raise KueueManifestError(f"upstream's manifests have no ConfigMap {CONFIG_MAP}")
    if not crds:
        raise KueueManifestError("upstream's manifests have no CustomResourceDefinitions")
    digest = digest_of([namespace, *crds, *objects, deployment, {"settings": dataclasses.asdict(settings)}])
    objects.append(lab_deployment(deployment, settings, digest))
    return LabManifests(namespace=namespace, crds=tuple(crds), objects=tuple(objects), dropped=tuple(dropped),
                        digest=digest)


def as_list(docs: Iterable[Mapping[str, Any]]) -> str:
    """A `kind: List` of the objects, as JSON: what `kubectl apply -f -` reads fastest."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})


def delete_order(manifests: LabManifests) -> tuple[Doc, ...]:
    """What `down` deletes after the custom resources are gone: the webhook configurations first (no
    call may reach a manager that is going), then the manager and the rest; the CRDs and the
    Namespace are deleted after these."""
    hooks = manifests.webhook_configurations
    return (*hooks, *(d for d in manifests.objects if d["kind"] not in WEBHOOK_KINDS))


# ---- reading the cluster's answers (kubectl -o json), pure --------------------------------------
def webhooks_have_ca(configurations: Iterable[Mapping[str, Any]]) -> bool:
    """Kueue's internal certificate management has injected its CA into every webhook."""
    hooks = [h for c in configurations for h in c.get("webhooks") or []]
    return bool(hooks) and all((h.get("clientConfig") or {}).get("caBundle") for h in hooks)


def webhooks_restricted(configurations: Iterable[Mapping[str, Any]], settings: LabSettings) -> bool:
    """Every webhook in the cluster's configurations selects the managed namespaces only."""
    hooks = [h for c in configurations for h in c.get("webhooks") or []]
    return bool(hooks) and all(((h.get("namespaceSelector") or {}).get("matchLabels") or {}).get(settings.managed_key)
                               == settings.managed_value for h in hooks)


def deployment_ready(doc: Mapping[str, Any] | None, digest: str | None = None) -> bool:
    """The manager's Deployment has rolled out (at `digest`, if given) and its one pod is Ready."""
    if not doc:
        return False
    meta, spec, status = doc.get("metadata") or {}, doc.get("spec") or {}, doc.get("status") or {}
    if digest is not None and (meta.get("annotations") or {}).get(DIGEST_ANNOTATION) != digest:
        return False
    want = spec.get("replicas", 1)
    return (want >= 1 and status.get("observedGeneration", 0) >= meta.get("generation", 1)
            and status.get("updatedReplicas", 0) == want and status.get("readyReplicas", 0) == want
            and status.get("replicas", 0) == want)
