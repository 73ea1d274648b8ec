"""``slurmk8s cluster kueue up | down | status``: real Kueue on the local cluster.

The toolchain's ``kueue`` tool gives the manager binary and the module's config/ tree; ``up`` builds
an image FROM the project's base image plus that binary, loads it into the nodes' containerd,
renders config/default with ``kubectl kustomize`` (cached: the render takes ~2 s), changes it for
the lab (:mod:`provisioner.localk8s.kueue_manifests`), applies it server-side and waits until the
manager is Ready and its webhooks serve. ``down`` removes the custom resources while the manager
still runs (their finalizers are Kueue's to remove), then Kueue itself.

Everything here talks to the cluster through :class:`Kubectl` (argv lists, JSON output), and to
Docker through argv lists; the decisions are pure functions (``lab_status``, ``leftovers``).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner import kueue as names
from provisioner.errors import SlurmK8sError
from provisioner.settings import BASE_IMAGE as BASE_IMAGE_KEY, default
from provisioner.localk8s import kueue_manifests as km

Say = Callable[[str], None]
BASE_IMAGE: str = default(BASE_IMAGE_KEY)  # images/build.sh's SLURMK8S_BASE_IMAGE default: the project's trixie base
PROBE_FLAVOR = "slurmk8s-kueue-probe"  # a dry-run ResourceFlavor: goes through both of Kueue's webhooks
CACHE_FORMAT = 1  # bump when the cached render's shape changes


class KueueLabError(SlurmK8sError):
    reason = "KueueLab"


@dataclass(frozen=True)
class LabPaths:
    bin_dir: Path  # the toolchain's bin dir (kubectl, kueue)
    share_dir: Path  # the toolchain's share dir (kueue-config)
    state_dir: Path  # the local cluster's state dir (the cached render goes under kueue/)
    kubeconfig: Path

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def binary(self) -> Path:
        return self.bin_dir / "kueue"

    @property
    def config_dir(self) -> Path:
        return self.share_dir / "kueue-config"

    def version(self) -> str:
        """The Kueue version the toolchain built (its config tree says it)."""
        try:
            return (self.config_dir / "VERSION").read_text().strip()
        except OSError:
            raise KueueLabError(f"Kueue is not in the toolchain ({self.config_dir} is missing). "
                                "Fix: slurmk8s toolchain build kueue") from None


def lab_paths(bin_dir: Path, state_dir: Path, kubeconfig: Path) -> LabPaths:
    return LabPaths(bin_dir=bin_dir, share_dir=bin_dir.parent / "share", state_dir=state_dir, kubeconfig=kubeconfig)


# ---- the seam to the cluster ------------------------------------------------------------------------
class Kubectl:
    """kubectl with the local cluster's kubeconfig: argv in, text or JSON out."""

    def __init__(self, exe: Path, kubeconfig: Path) -> None:
        self.exe, self.kubeconfig = exe, kubeconfig

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.exe), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise KueueLabError(f"kubectl {' '.join(args[:4])}: {done.stderr.strip()[-800:]}")
        return done

    def get(self, *args: str) -> Any:
        """`kubectl get ... -o json`, None when the object does not exist."""
        out = self.run("get", *args, "--ignore-not-found", "-o", "json").stdout.strip()
        return json.loads(out) if out else None

    def items(self, *args: str) -> list[dict[str, Any]]:
        got = self.get(*args)
        return list((got or {}).get("items") or [])


# ---- upstream's manifests, rendered once per version ---------------------------------------------------
def upstream_objects(paths: LabPaths, kubectl: Kubectl, say: Say) -> list[dict[str, Any]]:
    """config/default rendered by kubectl's kustomize, cached as JSON under the state dir."""
    version = paths.version()
    cache = paths.state_dir / "kueue" / f"upstream-{version}.json"
    key = {"format": CACHE_FORMAT, "config": str(paths.config_dir.resolve()), "version": version}
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["objects"]
    except (OSError, ValueError):
        pass
    t0 = time.monotonic()
    text = kubectl.run("kustomize", str(paths.config_dir / "default"), timeout=120).stdout
    objects = km.parse_documents(text)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "objects": objects}))
    tmp.replace(cache)
    say(f"rendered Kueue {version}'s config/default: {len(objects)} objects in {time.monotonic() - t0:.1f} s")
    return objects


# ---- the image ------------------------------------------------------------------------------------
def docker(*args: str, check: bool = True, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if check and done.returncode != 0:
        raise KueueLabError(f"docker {' '.join(args[:3])}: {done.stderr.strip()[-800:]}")
    return done


def image_inputs_hash(binary: Path, base_id: str, dockerfile_text: str) -> str:
    """What the image is made of: the binary (size and mtime: a rebuild changes them), the base
    image's id and the Dockerfile."""
    st = binary.stat()
    text = json.dumps([st.st_size, st.st_mtime_ns, base_id, dockerfile_text])
    return hashlib.sha256(text.encode()).hexdigest()


def ensure_image(paths: LabPaths, base_image: str, say: Say) -> str:
    """The lab's Kueue image in the local Docker engine (built when missing); returns its tag."""
    if not paths.binary.exists():
        raise KueueLabError(f"the Kueue binary is not built ({paths.binary}). Fix: slurmk8s toolchain build kueue")
    base = docker("image", "inspect", "-f", "{{.Id}}", base_image, check=False)
    if base.returncode != 0:
        raise KueueLabError(f"the base image {base_image} is not in the local Docker engine. "
                            "Fix: images/build.sh (or images/base/build-base.sh)")
    text = km.dockerfile(base_image)
    tag = km.image_tag(paths.version(), image_inputs_hash(paths.binary, base.stdout.strip(), text))
    if docker("image", "inspect", "-f", "{{.Id}}", tag, check=False).returncode == 0:
        return tag
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="slurmk8s-kueue-") as ctx:
        try:
            os.link(paths.binary.resolve(), Path(ctx) / "manager")
        except OSError:
            shutil.copy2(paths.binary.resolve(), Path(ctx) / "manager")
        (Path(ctx) / "Dockerfile").write_text(text)
        # BuildKit where the CLI has buildx, else the classic builder (as images/build.sh does)
        classic = {} if docker("buildx", "version", check=False).returncode == 0 else {"DOCKER_BUILDKIT": "0"}
        docker("build", "-q", "-t", tag, "--label", "org.slurmk8s.image=kueue", ctx, env=classic)
    say(f"image {tag}: built in {time.monotonic() - t0:.1f} s")
    return tag


# ---- up -----------------------------------------------------------------------------------------------
def wait(what: str, probe: Callable[[], Any], timeout: float, say: Say, interval: float = 0.5,
         show: Callable[[], str] | None = None) -> Any:
    """Poll `probe` until it returns something true; on a timeout, say what was last seen."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        got = probe()
        if got:
            return got
        if show is not None:
            now = show()
            if now and now != last:
                say(f"waiting for {what}: {now}")
                last = now
        if time.monotonic() > deadline:
            raise KueueLabError(f"{what}: not after {timeout:.0f} s" + (f" ({last})" if last else ""))
        time.sleep(interval)


def manager_pod_state(kubectl: Kubectl) -> str:
    """One line about the manager's pods: phase, waiting reasons, readiness."""
    pods = kubectl.items("pods", "-n", km.NAMESPACE, "-l", "control-plane=controller-manager")
    parts = []
    for pod in pods:
        status = pod.get("status") or {}
        states = [s.get("state") or {} for s in status.get("containerStatuses") or []]
        why = [st["waiting"].get("reason", "") for st in states if "waiting" in st]
        ready = all(s.get("ready") for s in status.get("containerStatuses") or []) and bool(states)
        parts.append(f"{pod['metadata']['name']} {status.get('phase', '?')}"
                     + (f" {','.join(why)}" if why else "") + (" Ready" if ready else ""))
    return "; ".join(parts) or "no pod yet"


def webhook_configurations(kubectl: Kubectl, manifests: km.LabManifests) -> list[dict[str, Any]]:
    out = []
    for doc in manifests.webhook_configurations:
        got = kubectl.get(doc["kind"].lower(), doc["metadata"]["name"])
        if got is None:
            return []
        out.append(got)
    return out


def webhook_serves(kubectl: Kubectl) -> bool:
    """A server-side dry run of a ResourceFlavor: the API server calls Kueue's mutating and
    validating webhooks for it, through the webhook Service, as for any real object."""
    flavor = {"apiVersion": f"{km.KUEUE_GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": PROBE_FLAVOR}}
    return kubectl.run("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(flavor),
                       check=False, timeout=30).returncode == 0


def ready_now(kubectl: Kubectl, manifests: km.LabManifests, settings: km.LabSettings) -> bool:
    """Kueue runs exactly these manifests and serves: nothing to apply."""
    dep = kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE)
    if not km.deployment_ready(dep, manifests.digest):
        return False
    hooks = webhook_configurations(kubectl, manifests)
    return km.webhooks_restricted(hooks, settings) and km.webhooks_have_ca(hooks) and webhook_serves(kubectl)


def apply(kubectl: Kubectl, docs: Sequence[Mapping[str, Any]]) -> None:
    kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={km.FIELD_MANAGER}", "-f", "-",
                input=km.as_list(docs), timeout=180)


def up(paths: LabPaths, kubectl: Kubectl, load_image: Callable[[str], None], say: Say, *,
       base_image: str = BASE_IMAGE, timeout: float = 240) -> float:
    """Kueue running the lab's manifests, its webhooks serving; idempotent. Returns the seconds taken."""
    t0 = time.monotonic()
    version = paths.version()
    tag = ensure_image(paths, base_image, say)
    load_image(tag)
    settings = km.LabSettings(version=version, image=tag)
    manifests = km.lab_manifests(upstream_objects(paths, kubectl, say), settings)
    if ready_now(kubectl, manifests, settings):
        say(f"Kueue {version} is up, unchanged ({manifests.digest}), in {time.monotonic() - t0:.1f} s")
        return time.monotonic() - t0
    say(f"applying Kueue {version} ({len(manifests.crds)} CRDs, {len(manifests.objects)} objects; left out: "
        f"{', '.join(manifests.dropped) or 'nothing'})")
    apply(kubectl, [manifests.namespace, *manifests.crds])
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s",
                *(f"crd/{d['metadata']['name']}" for d in manifests.crds), timeout=90)
    apply(kubectl, manifests.objects)
    t_apply = time.monotonic()
    say(f"applied in {t_apply - t0:.1f} s; waiting for the manager")
    wait("the Kueue manager Ready", lambda: km.deployment_ready(
        kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE), manifests.digest),
        timeout, say, show=lambda: manager_pod_state(kubectl))
    t_ready = time.monotonic()
    say(f"manager Ready {t_ready - t_apply:.1f} s after the apply")
    wait("Kueue's CA in its webhook configurations",
         lambda: km.webhooks_have_ca(webhook_configurations(kubectl, manifests)), 60, say)
    wait("Kueue's webhooks to serve", lambda: webhook_serves(kubectl), 60, say)
    total = time.monotonic() - t0
    say(f"Kueue {version} is up in {total:.1f} s (webhooks serving {time.monotonic() - t_ready:.1f} s after Ready); "
        f"namespaces labelled {km.MANAGED_KEY}={km.MANAGED_VALUE} are managed")
    return total


# ---- down ---------------------------------------------------------------------------------------------
def leftovers(lists: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, list[str]]:
    """Per resource, the "namespace/name" (or "name") of each object still there."""
    out: dict[str, list[str]] = {}
    for resource, objs in lists.items():
        left = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" if o["metadata"].get("namespace")
                else o["metadata"]["name"] for o in objs]
        if left:
            out[resource] = left
    return out


def removal_order(crds: Iterable[km.Crd]) -> list[km.Crd]:
    """Workloads first (a deleted Workload releases its pods: trap 4), then the other namespaced
    resources (LocalQueues), then the cluster-scoped ones (ClusterQueues before ResourceFlavors and
    Cohorts, which they refer to)."""
    rank = {"workloads": 0, "localqueues": 1, "clusterqueues": 3, "resourceflavors": 4, "cohorts": 4}
    return sorted(crds, key=lambda c: (rank.get(c.plural, 2 if c.namespaced else 5), c.plural))


def kueue_objects(kubectl: Kubectl, crds: Sequence[km.Crd]) -> dict[str, list[dict[str, Any]]]:
    lists = {"pods": kubectl.items("pods", "-A", "-l", f"{names.MANAGED_LABEL}=true")}
    for crd in crds:
        lists[crd.resource] = kubectl.items(crd.resource, *(["-A"] if crd.namespaced else []))
    return lists


def strip_finalizers(kubectl: Kubectl, resource: str, objects: Iterable[str]) -> None:
    for obj in objects:
        ns, _, name = obj.rpartition("/")
        kubectl.run("patch", resource, name, *(["-n", ns] if ns else []), "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False)


def down(paths: LabPaths, kubectl: Kubectl, say: Say, *, timeout: float = 90) -> float:
    """Kueue's objects in the managed namespaces and its cluster-wide ones, then Kueue; idempotent."""
    t0 = time.monotonic()
    settings = km.LabSettings(version=paths.version(), image="")
    manifests = km.lab_manifests(upstream_objects(paths, kubectl, say), settings)
    crd_names = [d["metadata"]["name"] for d in manifests.crds]
    present = {c["metadata"]["name"] for c in kubectl.items("crd", *crd_names)}
    crds = [c for c in removal_order(manifests.custom_resources()) if c.resource in present]
    if crds:
        dep = kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE)
        if dep is not None and not km.deployment_ready(dep):
            say("the Kueue manager is not Ready: starting it, so that it removes its own finalizers")
            kubectl.run("scale", "deployment", km.DEPLOYMENT, "-n", km.NAMESPACE, "--replicas=1")
            try:
                wait("the Kueue manager Ready", lambda: km.deployment_ready(
                    kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE)), 60, say,
                    show=lambda: manager_pod_state(kubectl))
            except KueueLabError as err:
                say(f"{err}: going on without it")
        manager_up = km.deployment_ready(kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE))
        found = leftovers(kueue_objects(kubectl, crds))
        if found:
            say("deleting " + ", ".join(f"{len(v)} {k.split('.')[0]}" for k, v in found.items()))
        for crd in crds:
            if crd.resource in found:
                kubectl.run("delete", crd.resource, "--all", *(["-A"] if crd.namespaced else []), "--wait=false")
        if "pods" in found:
            # trap 4: a deleted member of a pod group keeps its finalizer while its Workload (which
            # Kueue makes again) waits for a replacement; this says the group ends with its pods
            kubectl.run("annotate", "pods", "-A", "-l", f"{names.MANAGED_LABEL}=true", f"{names.RETRIABLE}=false",
                        "--overwrite", check=False)
            kubectl.run("delete", "pods", "-A", "-l", f"{names.MANAGED_LABEL}=true", "--wait=false")
        deadline = time.monotonic() + (timeout if manager_up else 5)
        again = time.monotonic() + 5
        while found and time.monotonic() < deadline:
            time.sleep(0.5)
            found = leftovers(kueue_objects(kubectl, crds))
            if found and time.monotonic() > again:  # e.g. a Workload Kueue made again for pods still there
                again = time.monotonic() + 5
                for crd in crds:
                    if crd.resource in found:
                        kubectl.run("delete", crd.resource, "--all", *(["-A"] if crd.namespaced else []),
                                    "--wait=false", check=False)
        if found:
            say(f"WARNING: still there after {time.monotonic() - t0:.0f} s"
                f"{'' if manager_up else ' (no Kueue manager to finalize them)'}: removing Kueue's finalizers "
                "from " + "; ".join(f"{k}: {', '.join(v)}" for k, v in found.items()))
            for resource, objs in found.items():
                strip_finalizers(kubectl, resource, objs)
    objects = km.delete_order(manifests)
    kubectl.run("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=km.as_list(objects), timeout=120)
    if present:
        kubectl.run("delete", "crd", "--ignore-not-found", *sorted(present), timeout=120)
    kubectl.run("delete", "namespace", km.NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s",
                timeout=150)
    managed = [n["metadata"]["name"] for n in kubectl.items("namespaces", "-l", f"{km.MANAGED_KEY}={km.MANAGED_VALUE}")]
    total = time.monotonic() - t0
    say(f"Kueue is down ({'removed' if present else 'nothing was installed'}) in {total:.1f} s"
        + (f"; namespaces still labelled {km.MANAGED_KEY}={km.MANAGED_VALUE}: {', '.join(managed)}" if managed else ""))
    return total


# ---- status -------------------------------------------------------------------------------------------
class State(enum.Enum):
    UP = 0
    DOWN = 3
    PARTLY = 4


@dataclass(frozen=True)
class LabStatus:
    state: State
    version: str | None
    detail: str


def lab_status(deployment: Mapping[str, Any] | None, crds_present: int, crds_expected: int,
               hooks: Sequence[Mapping[str, Any]], settings: km.LabSettings) -> LabStatus:
    """Up, down or partly there (and why), from what the cluster holds."""
    version = ((deployment or {}).get("metadata", {}).get("annotations") or {}).get(km.VERSION_ANNOTATION)
    if deployment is None and crds_present == 0 and not hooks:
        return LabStatus(State.DOWN, None, "not installed")
    problems = []
    if crds_present < crds_expected:
        problems.append(f"{crds_present} of {crds_expected} CRDs")
    if deployment is None:
        problems.append("no manager Deployment")
    elif (deployment.get("spec") or {}).get("replicas", 1) == 0:
        problems.append("manager scaled to 0")
    elif not km.deployment_ready(deployment):
        problems.append("manager not Ready")
    if not hooks:
        problems.append("webhook configurations missing")
    else:
        if not km.webhooks_restricted(hooks, settings):
            problems.append(f"a webhook is not restricted to {km.MANAGED_KEY}={km.MANAGED_VALUE} namespaces")
        if not km.webhooks_have_ca(hooks):
            problems.append("webhook CA not injected")
    if problems:
        return LabStatus(State.PARTLY, version, "; ".join(problems))
    return LabStatus(State.UP, version, "manager Ready, webhooks restricted and with their CA")


def status(paths: LabPaths, kubectl: Kubectl, say: Say) -> LabStatus:
    settings = km.LabSettings(version=paths.version(), image="")
    manifests = km.lab_manifests(upstream_objects(paths, kubectl, say), settings)
    crd_names = [d["metadata"]["name"] for d in manifests.crds]
    present = len(kubectl.items("crd", *crd_names))
    dep = kubectl.get("deployment", km.DEPLOYMENT, "-n", km.NAMESPACE)
    hooks = [h for d in manifests.webhook_configurations
             if (h := kubectl.get(d["kind"].lower(), d["metadata"]["name"])) is not None]
    got = lab_status(dep, present, len(crd_names), hooks, settings)
    managed = [n["metadata"]["name"] for n in kubectl.items("namespaces", "-l", f"{km.MANAGED_KEY}={km.MANAGED_VALUE}")]
    say(f"Kueue: {got.state.name.lower()}" + (f" ({got.version})" if got.version else "")
        + f": {got.detail}" + (f"; managed namespaces: {', '.join(managed)}" if managed else ""))
    return got
