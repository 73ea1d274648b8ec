"""Kueue in the local lab: the toolchain's `kueue` tool, the manifest changes, the status and teardown
decisions. Fast, no cluster, no Docker (the e2e tier runs it for real: e2e/test_e2e_kueue_lab.py)."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml

from provisioner.localk8s import kueue as lab
from provisioner.localk8s import kueue_manifests as km
from provisioner.localk8s.scripts import TOOLCHAIN_SCRIPT, script_argv

UPSTREAM_CONFIG = """\
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
integrations:
  frameworks:
  - "batch/job"
  - "pod"
  - "deployment"
"""
UPSTREAM_PODS_SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                "values": ["kube-system", "kueue-system"]}]}


def crd(plural: str, kind: str, scope: str) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
            "spec": {"group": "kueue.x-k8s.io", "names": {"plural": plural, "kind": kind}, "scope": scope}}


def hook(name: str, resource: str, selector: dict | None) -> dict:
    out = {"name": name, "failurePolicy": "Fail", "sideEffects": "None",
           "clientConfig": {"service": {"name": "kueue-webhook-service", "namespace": "kueue-system"}},
           "rules": [{"apiGroups": [""], "resources": [resource], "operations": ["CREATE", "UPDATE"]}]}
    if selector is not None:
        out["namespaceSelector"] = selector
    return out


def upstream() -> list[dict]:
    """The shape of `kubectl kustomize config/default` of Kueue v0.17.0, cut down."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}},
        crd("clusterqueues", "ClusterQueue", "Cluster"),
        crd("resourceflavors", "ResourceFlavor", "Cluster"),
        crd("localqueues", "LocalQueue", "Namespaced"),
        crd("workloads", "Workload", "Namespaced"),
        crd("cohorts", "Cohort", "Cluster"),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
         "data": {"controller_manager_config.yaml": UPSTREAM_CONFIG}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kueue-webhook-service", "namespace": "kueue-system"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "kueue-controller-manager", "namespace": "kueue-system"},
         "spec": {"replicas": 1, "template": {"metadata": {"annotations": {"kubectl.kubernetes.io/default-container": "manager"}},
                  "spec": {"containers": [{
                      "name": "manager", "image": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:main",
                      "imagePullPolicy": "Always",
                      "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "initialDelaySeconds": 5,
                                         "periodSeconds": 10},
                      "resources": {"limits": {"cpu": "2", "memory": "512Mi"},
                                    "requests": {"cpu": "500m", "memory": "512Mi"}}}]}}}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta2.visibility.kueue.x-k8s.io"},
         "spec": {"group": "visibility.kueue.x-k8s.io", "version": "v1beta2"}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "kueue-mutating-webhook-configuration"},
         "webhooks": [hook("mpod.kb.io", "pods", UPSTREAM_PODS_SELECTOR), hook("mjob.kb.io", "jobs", None),
                      hook("mresourceflavor.kb.io", "resourceflavors", None)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "kueue-validating-webhook-configuration"},
         "webhooks": [hook("vpod.kb.io", "pods", UPSTREAM_PODS_SELECTOR), hook("vworkload.kb.io", "workloads", None)]},
    ]


SETTINGS = km.LabSettings(version="v0.17.0", image="slurmk8s/kueue:v0.17.0-0123456789ab")


@pytest.fixture
def manifests() -> km.LabManifests:
    return km.lab_manifests(upstream(), SETTINGS)


def of_kind(m: km.LabManifests, kind: str) -> list[dict]:
    return [d for d in m.objects if d["kind"] == kind]


# ---- the manifest changes ------------------------------------------------------------------------------
def test_the_visibility_api_is_left_out_and_said(manifests):
    assert not of_kind(manifests, "APIService")
    assert manifests.dropped == ("APIService/v1beta2.visibility.kueue.x-k8s.io",)


def test_every_webhook_selects_only_managed_namespaces(manifests):
    hooks = [h for d in manifests.webhook_configurations for h in d["webhooks"]]
    assert {h["name"] for h in hooks} == {"mpod.kb.io", "mjob.kb.io", "mresourceflavor.kb.io", "vpod.kb.io",
                                          "vworkload.kb.io"}
    for h in hooks:
        assert h["namespaceSelector"]["matchLabels"] == {"slurmk8s.io/kueue": "managed"}, h["name"]
    # upstream's exclusions stay: kube-system and kueue-system never call Kueue, even labelled
    pod = next(h for h in hooks if h["name"] == "mpod.kb.io")
    assert pod["namespaceSelector"]["matchExpressions"] == UPSTREAM_PODS_SELECTOR["matchExpressions"]
    assert km.webhooks_restricted(manifests.webhook_configurations, SETTINGS)


def test_an_upstream_webhook_is_not_restricted():
    """What `status` and the e2e check: upstream's own webhooks call Kueue from every namespace."""
    configs = [d for d in upstream() if d["kind"] in km.WEBHOOK_KINDS]
    assert not km.webhooks_restricted(configs, SETTINGS)
    one_left = copy.deepcopy(km.lab_manifests(upstream(), SETTINGS).webhook_configurations)
    del one_left[1]["webhooks"][1]["namespaceSelector"]
    assert not km.webhooks_restricted(one_left, SETTINGS)


def test_a_webhook_selecting_another_value_is_refused():
    docs = upstream()
    docs[-1]["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"slurmk8s.io/kueue": "other"}}
    with pytest.raises(km.KueueManifestError, match="already selects"):
        km.lab_manifests(docs, SETTINGS)


def test_the_configuration_manages_pods_in_managed_namespaces_only(manifests):
    text = of_kind(manifests, "ConfigMap")[0]["data"]["controller_manager_config.yaml"]
    config = yaml.safe_load(text)
    assert config["integrations"]["frameworks"] == ["pod"]
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"slurmk8s.io/kueue": "managed"}}
    assert config["leaderElection"] == {"leaderElect": False, "resourceName": "c1f6bfd2.kueue.x-k8s.io"}
    assert config["featureGates"] == {"VisibilityOnDemand": False}  # no server for the API left out
    assert config["webhook"] == {"port": 9443} and config["health"] == {"healthProbeBindAddress": ":8081"}


def test_the_manager_runs_our_image_small_and_quick(manifests):
    dep = of_kind(manifests, "Deployment")[0]
    assert manifests.objects[-1] is dep  # after its ConfigMap and webhook configurations
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == SETTINGS.image and container["imagePullPolicy"] == "Never"
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    assert container["readinessProbe"]["periodSeconds"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    assert dep["metadata"]["annotations"][km.VERSION_ANNOTATION] == "v0.17.0"
    template = dep["spec"]["template"]["metadata"]["annotations"]
    assert template[km.DIGEST_ANNOTATION] == manifests.digest
    assert template["kubectl.kubernetes.io/default-container"] == "manager"


def test_the_digest_is_stable_and_follows_every_change(manifests):
    assert km.lab_manifests(upstream(), SETTINGS).digest == manifests.digest
    other_image = km.LabSettings(version="v0.17.0", image="slurmk8s/kueue:v0.17.0-ffffffffffff")
    assert km.lab_manifests(upstream(), other_image).digest != manifests.digest
    docs = upstream()
    docs[6]["data"]["controller_manager_config.yaml"] += "clientConnection:\n  qps: 5\n"
    assert km.lab_manifests(docs, SETTINGS).digest != manifests.digest


def test_the_input_is_not_changed():
    docs = upstream()
    before = json.dumps(docs, sort_keys=True)
    km.lab_manifests(docs, SETTINGS)
    assert json.dumps(docs, sort_keys=True) == before


@pytest.mark.parametrize("kind", ["Deployment", "Namespace", "ConfigMap", "MutatingWebhookConfiguration",
                                  "CustomResourceDefinition"])
def test_another_layout_is_refused_by_name(kind):
    docs = [d for d in upstream() if d["kind"] != kind]
    with pytest.raises(km.KueueManifestError):
        km.lab_manifests(docs, SETTINGS)


def test_namespace_and_crds_go_first_and_webhooks_are_deleted_first(manifests):
    assert manifests.namespace["metadata"]["name"] == "kueue-system"
    assert [d["kind"] for d in manifests.crds] == ["CustomResourceDefinition"] * 5
    order = [d["kind"] for d in km.delete_order(manifests)]
    assert order[:2] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert "CustomResourceDefinition" not in order and "Namespace" not in order


def test_parse_documents_drops_empty_ones():
    text = "---\nkind: A\nmetadata: {name: a}\n---\n---\nkind: B\nmetadata: {name: b}\n"
    assert [d["kind"] for d in km.parse_documents(text)] == ["A", "B"]


def test_image_is_the_base_plus_the_binary_as_a_numeric_user():
    text = km.dockerfile("debian:trixie-slim")
    assert text.startswith("FROM debian:trixie-slim\n")
    assert "COPY manager /manager" in text and "USER 65532:65532" in text  # runAsNonRoot needs a number
    assert km.image_tag("v0.17.0", "0123456789abcdef") == "slurmk8s/kueue:v0.17.0-0123456789ab"


def test_image_hash_follows_the_binary_and_the_base(tmp_path):
    binary = tmp_path / "kueue"
    binary.write_bytes(b"x" * 10)
    one = lab.image_inputs_hash(binary, "sha256:a", "FROM a")
    assert lab.image_inputs_hash(binary, "sha256:b", "FROM a") != one
    binary.write_bytes(b"y" * 11)
    assert lab.image_inputs_hash(binary, "sha256:a", "FROM a") != one


# ---- reading the cluster -----------------------------------------------------------------------------
def deployment(replicas=1, ready=1, updated=1, generation=2, observed=2, digest="d1") -> dict:
    return {"metadata": {"generation": generation, "annotations": {km.DIGEST_ANNOTATION: digest,
                                                                    km.VERSION_ANNOTATION: "v0.17.0"}},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "replicas": replicas, "readyReplicas": ready,
                       "updatedReplicas": updated}}


@pytest.mark.parametrize(("dep", "digest", "ready"), [
    (deployment(), "d1", True),
    (deployment(), None, True),
    (deployment(), "d2", False),  # another rendering: apply again
    (deployment(ready=0), "d1", False),
    (deployment(observed=1), "d1", False),  # the controller has not seen the new spec yet
    (deployment(updated=0), "d1", False),  # an old pod is Ready, the new one not
    (deployment(replicas=0, ready=0, updated=0), None, False),  # scaled to 0
    (None, None, False),
])
def test_deployment_ready(dep, digest, ready):
    assert km.deployment_ready(dep, digest) is ready


def test_webhooks_have_ca():
    configs = copy.deepcopy(km.lab_manifests(upstream(), SETTINGS).webhook_configurations)
    assert not km.webhooks_have_ca(configs)
    for c in configs:
        for h in c["webhooks"]:
            h["clientConfig"]["caBundle"] = "LS0t"
    assert km.webhooks_have_ca(configs)
    configs[0]["webhooks"][0]["clientConfig"]["caBundle"] = ""
    assert not km.webhooks_have_ca(configs)
    assert not km.webhooks_have_ca([])


def served(manifests: km.LabManifests) -> list[dict]:
    configs = copy.deepcopy(manifests.webhook_configurations)
    for c in configs:
        for h in c["webhooks"]:
            h["clientConfig"]["caBundle"] = "LS0t"
    return configs


def test_status_up_down_and_partly(manifests):
    up = lab.lab_status(deployment(), 5, 5, served(manifests), SETTINGS)
    assert (up.state, up.version) == (lab.State.UP, "v0.17.0")
    down = lab.lab_status(None, 0, 5, [], SETTINGS)
    assert (down.state, down.version, down.state.value) == (lab.State.DOWN, None, 3)
    stopped = lab.lab_status(deployment(replicas=0, ready=0, updated=0), 5, 5, served(manifests), SETTINGS)
    assert stopped.state is lab.State.PARTLY and stopped.state.value == 4 and "scaled to 0" in stopped.detail
    unrestricted = [d for d in upstream() if d["kind"] in km.WEBHOOK_KINDS]
    for c in unrestricted:
        for h in c["webhooks"]:
            h["clientConfig"]["caBundle"] = "LS0t"
    loose = lab.lab_status(deployment(), 5, 5, unrestricted, SETTINGS)
    assert loose.state is lab.State.PARTLY and "not restricted" in loose.detail
    half = lab.lab_status(None, 2, 5, [], SETTINGS)
    assert half.state is lab.State.PARTLY and "2 of 5 CRDs" in half.detail and "no manager" in half.detail


def test_removal_order_releases_pods_first(manifests):
    order = [c.plural for c in lab.removal_order(manifests.custom_resources())]
    assert order[0] == "workloads" and order[1] == "localqueues"
    assert order.index("clusterqueues") < order.index("resourceflavors")
    assert order.index("clusterqueues") < order.index("cohorts")


def test_leftovers_name_each_object():
    got = lab.leftovers({"pods": [{"metadata": {"namespace": "a", "name": "p"}}],
                         "clusterqueues.kueue.x-k8s.io": [{"metadata": {"name": "cq"}}],
                         "workloads.kueue.x-k8s.io": []})
    assert got == {"pods": ["a/p"], "clusterqueues.kueue.x-k8s.io": ["cq"]}


# ---- down, against a fake kubectl ---------------------------------------------------------------------
class FakeKubectl:
    """Answers `get` from a dict of lists; objects vanish `after` polls once deleted (Kueue finalizing)."""

    def __init__(self, objects: dict[str, list[dict]], crds: list[str], deployment: dict | None, after: int = 1):
        self.objects, self.crds, self.deployment, self.after = objects, crds, deployment, after
        self.calls: list[tuple[str, ...]] = []
        self.deleted: dict[str, int] = {}

    def run(self, *args, input=None, check=True, timeout=120):
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    def get(self, *args):
        self.calls.append(("get", *args))
        if args[0] == "deployment":
            return self.deployment
        if args[0] == "crd":
            return {"items": [{"metadata": {"name": n}} for n in self.crds]}
        if args[0] == "namespaces":
            return {"items": []}
        resource = args[0]
        if any(c[:2] == ("delete", resource) for c in self.calls):
            self.deleted[resource] = self.deleted.get(resource, 0) + 1
            if self.deleted[resource] >= self.after:
                return {"items": []}
        return {"items": self.objects.get(resource, [])}

    def items(self, *args):
        return list((self.get(*args) or {}).get("items") or [])


@pytest.fixture
def paths(tmp_path):
    share = tmp_path / "share" / "kueue-config"
    share.mkdir(parents=True)
    (share / "VERSION").write_text("v0.17.0\n")
    state = tmp_path / "state"
    (state / "kueue").mkdir(parents=True)
    p = lab.lab_paths(tmp_path / "bin", state, tmp_path / "kubeconfig")
    key = {"format": lab.CACHE_FORMAT, "config": str(p.config_dir.resolve()), "version": "v0.17.0"}
    (state / "kueue" / "upstream-v0.17.0.json").write_text(json.dumps({"key": key, "objects": upstream()}))
    return p


def test_down_deletes_kueue_objects_before_kueue(paths):
    crds = [f"{p}.kueue.x-k8s.io" for p in ("clusterqueues", "resourceflavors", "localqueues", "workloads", "cohorts")]
    fake = FakeKubectl({"pods": [{"metadata": {"namespace": "team", "name": "p0"}}],
                        "workloads.kueue.x-k8s.io": [{"metadata": {"namespace": "team", "name": "w"}}],
                        "clusterqueues.kueue.x-k8s.io": [{"metadata": {"name": "cq"}}]}, crds, deployment())
    lines: list[str] = []
    lab.down(paths, fake, lines.append, timeout=5)
    deletes = [c for c in fake.calls if c[0] == "delete"]
    first_kueue = next(i for i, c in enumerate(deletes) if "-f" in c)
    targets = [c[1] for c in deletes[:first_kueue]]
    assert targets[:2] == ["workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io"] and targets[-1] == "pods"
    assert [c[1] for c in deletes[first_kueue + 1:]] == ["crd", "namespace"]
    assert not any(c[0] == "patch" for c in fake.calls)  # Kueue removed its finalizers itself
    # trap 4: the pods' groups are told to end with their pods before the pods are deleted
    annotate = next(i for i, c in enumerate(fake.calls) if c[0] == "annotate")
    assert "kueue.x-k8s.io/retriable-in-group=false" in fake.calls[annotate]
    assert annotate < fake.calls.index(next(c for c in fake.calls if c[:2] == ("delete", "pods")))
    assert any("Kueue is down (removed)" in line for line in lines)


def test_down_without_a_manager_strips_finalizers_loudly(paths):
    crds = ["clusterqueues.kueue.x-k8s.io"]
    fake = FakeKubectl({"clusterqueues.kueue.x-k8s.io": [{"metadata": {"name": "cq"}}]}, crds, None, after=10**6)
    lines: list[str] = []
    lab.down(paths, fake, lines.append, timeout=5)
    assert ("patch", "clusterqueues.kueue.x-k8s.io", "cq", "--type=merge", "-p",
            '{"metadata":{"finalizers":null}}') in fake.calls
    assert any(line.startswith("WARNING") and "no Kueue manager" in line for line in lines)


def test_down_with_nothing_installed_is_quiet(paths):
    fake = FakeKubectl({}, [], None)
    lines: list[str] = []
    lab.down(paths, fake, lines.append)
    assert not any(c[0] in ("patch", "scale") for c in fake.calls)
    assert any("nothing was installed" in line for line in lines)


def test_versions_without_the_toolchain_say_how_to_build(tmp_path):
    p = lab.lab_paths(tmp_path / "bin", tmp_path / "state", tmp_path / "kubeconfig")
    with pytest.raises(lab.KueueLabError, match="toolchain build kueue"):
        p.version()


# ---- the toolchain's kueue tool ----------------------------------------------------------------------
def test_toolchain_pins_kueue_under_its_own_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path), "KUEUE_VERSION": "v0.19.2"}
    out = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["versions"]), env=env, capture_output=True, text=True,
                         check=True)
    keys = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    assert keys["kueue"] == ["v0.19.2", f"{tmp_path}/kueue-v0.19.2"]
    env.pop("KUEUE_VERSION")
    out = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["versions"]), env=env, capture_output=True, text=True,
                         check=True)
    assert "kueue              v0.17.0" in out.stdout


def test_toolchain_check_wants_kueue_and_its_manifests(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path)}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["check"]), env=env, capture_output=True, text=True)
    missing = done.stderr.split("missing: ")[1].split(" (")[0].split()
    assert done.returncode == 1 and "kueue" in missing and "kueue-config" in missing and "kwok-stages" in missing


def test_toolchain_builds_only_the_missing_manifests_of_a_cached_kueue(tmp_path):
    """A cache with the binary but no config/ copy (e.g. built by an older toolchain.sh) fetches the
    manifests only: Go's `mod download`, no `go build`."""
    cache = tmp_path / "cache"
    (cache / "kueue-v0.17.0" / "bin").mkdir(parents=True)
    (cache / "kueue-v0.17.0" / "bin" / "kueue").write_text("#!/bin/sh\n")
    (cache / "kueue-v0.17.0" / "bin" / "kueue").chmod(0o755)
    onpath = tmp_path / "onpath"
    onpath.mkdir()
    (onpath / "go").write_text(f"#!/bin/sh\necho \"go $*\" >>{tmp_path}/go-calls\nexit 1\n")
    (onpath / "go").chmod(0o755)
    env = {"PATH": f"{onpath}:/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(cache)}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["build", "kueue"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "kueue v0.17.0: building kueue-config" in done.stdout, done.stdout
    calls = (tmp_path / "go-calls").read_text()
    assert "mod download -json sigs.k8s.io/kueue@v0.17.0" in calls and "build" not in calls
    assert (cache / "kueue-v0.17.0" / "bin" / "kueue").exists()  # a failed data fetch keeps the binary


# ---- up, against a fake kubectl ----------------------------------------------------------------------
class FakeCluster:
    """Keeps what `apply` sends; the manager is Ready and the CA injected as soon as they are applied."""

    def __init__(self):
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args, input=None, check=True, timeout=120):
        self.calls.append(args)
        if args[0] == "apply":
            for doc in json.loads(input)["items"]:
                self.objects[(doc["kind"].lower(), doc["metadata"]["name"])] = doc
        return subprocess.CompletedProcess(args, 0, "", "")

    def get(self, kind, name=None, *rest):
        self.calls.append(("get", kind, *(x for x in (name, *rest) if x)))
        if kind == "pods":
            return {"items": []}
        doc = copy.deepcopy(self.objects.get((kind, name)))
        if doc is None:
            return None
        if kind == "deployment":
            doc["metadata"]["generation"] = 1
            doc["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
        for h in doc.get("webhooks") or []:
            h["clientConfig"]["caBundle"] = "LS0t"
        return doc

    def items(self, *args):
        return list((self.get(*args) or {}).get("items") or [])


def test_up_applies_namespace_and_crds_first_then_waits_and_a_second_up_changes_nothing(paths, monkeypatch):
    monkeypatch.setattr(lab, "ensure_image", lambda p, base, say: SETTINGS.image)
    loaded: list[str] = []
    cluster = FakeCluster()
    lines: list[str] = []
    lab.up(paths, cluster, loaded.append, lines.append, timeout=5)
    assert loaded == [SETTINGS.image]
    applies = [c for c in cluster.calls if c[0] == "apply"]
    assert len(applies) == 2 and all("--server-side" in c and "--force-conflicts" in c for c in applies)
    kinds = [k for k, _ in cluster.objects]
    assert kinds.index("customresourcedefinition") < kinds.index("deployment")
    assert any(c[0] == "wait" and "--for=condition=Established" in c for c in cluster.calls)
    assert any(c[:2] == ("create", "--dry-run=server") for c in cluster.calls)  # the webhooks were tried
    assert "apiservice" not in kinds
    assert any("Kueue v0.17.0 is up in" in line for line in lines)

    cluster.calls.clear()
    lab.up(paths, cluster, loaded.append, lines.append, timeout=5)
    assert not [c for c in cluster.calls if c[0] == "apply"]
    assert "unchanged" in lines[-1]
