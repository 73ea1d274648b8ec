"""The live cluster around a Pulumi operation: the checks before `up` / `preview` (and the local
cluster's volumes `up` gives back), the watcher of `up`, one look for `preview`, and what `down`
deletes after Pulumi (worker pods; with --purge the kept claims and the namespace)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import SlurmK8sError
from .errors import DeployError

NAMESPACE_GONE_TIMEOUT = 180.0
CLAIM_PURPOSE = {"home": "/home", "slurmctld-state": "slurmctld state", "accounting-db": "accounting database"}

Printer = Callable[[str], Any]
Session = Any  # automation.Session


def _name(obj: Any) -> str:
    """metadata.name of an object the API server returned (always set there; the client's models type
    both metadata and name as optional)."""
    return obj.metadata.name


def _cluster(session: Session) -> tuple[Any, bool]:
    """The session's API client and whether it reaches the local cluster, made once per session
    (the checks, the watch of `up` and preview's look share them)."""
    from .. import volumes
    from .program import load_kubeconfig

    if session.api_client is None:
        session.api_client = load_kubeconfig(session.kubeconfig)
        session.local_cluster = volumes.is_local_cluster(session.api_client)
    return session.api_client, bool(session.local_cluster)


def preflight(session: Session, echo: Printer, *, database: bool, reclaim: bool = False,
              images: str = "labels") -> None:
    """Checks against the live cluster before anything is applied (storage classes, volumes, the
    external database's Secret; with `database`, a connection test of the external database). On the
    local cluster, with `reclaim`, its own volumes that a deleted claim of this cluster left Released
    are given back first (provisioner.volumes). The pool and login images (provisioner.deploy.imagecheck):
    `images="pods"` (up) runs each new one in a check pod, "labels" (preview) reads the local Docker
    engine's labels, "none" skips them."""
    from kubernetes.client.exceptions import ApiException

    from .. import manifests as m
    from . import imagecheck
    from . import preflight as pf

    t0 = time.monotonic()
    if session.generated is not None:
        m.check_home_access(session.spec, session.generated.inventory)
    api, local = _cluster(session)
    try:
        facts = pf.read_cluster(session.spec, api)
        if local:
            facts = _local_volumes(session, api, facts, echo, give_back=reclaim)
        pf.check(session.spec, facts)
        if database:
            pf.check_database(session.spec, api, echo)
        if images == "pods":
            imagecheck.check(session.spec, imagecheck.CheckApi(api), echo, namespace_exists=facts.namespace_exists,
                             local=local)
        elif images == "labels":
            imagecheck.preview_check(session.spec, imagecheck.CheckApi(api), echo,
                                     namespace_exists=facts.namespace_exists)
    except ApiException as err:
        raise DeployError(f"preflight checks could not read the cluster: {err.status} {err.reason}") from None
    finally:
        session.timings["preflight"] = time.monotonic() - t0


def _local_volumes(session: Session, api: Any, facts: Any, echo: Printer, *, give_back: bool) -> Any:
    """The local cluster: its volumes reserved for this cluster's claims and left Released by their
    deletion (`down --purge`) are given back (old data deleted) by `up`; `preview` says it will."""
    import dataclasses

    from .. import volumes
    from . import preflight as pf

    spec = session.spec
    items = volumes.reclaimable(facts.volumes, facts.claims, namespace=spec.namespace_name,
                                names=[claim for _, claim, _ in pf.volumes_of(spec)])
    if items and give_back:
        done, problems = volumes.reclaim(api, items, echo)
        if problems:
            raise DeployError("cannot give the local cluster's volumes back:\n  - " + "\n  - ".join(problems))
        return dataclasses.replace(pf.read_cluster(spec, api), local=True)
    for item in items:
        echo(f"note: `up` will give {item.describe()} back (its old data is deleted)")
    return dataclasses.replace(facts, local=True, reclaimable=frozenset(i.volume for i in items))


def watcher_for(session: Session, echo: Printer) -> Any:
    from . import watch

    api, local = _cluster(session)
    spec = session.spec

    def look() -> watch.Snapshot:
        return watch.read(api, spec.name, spec.namespace_name, local=local)

    return watch.Watcher(look, echo, lambda: session.engine.interrupt(echo))


def diagnose_now(session: Session, echo: Printer) -> None:
    """One look at what is already in the cluster (for preview): claims that cannot bind, pods that
    cannot start, printed as warnings."""
    from . import watch

    api, local = _cluster(session)
    spec = session.spec
    try:
        snap = watch.read(api, spec.name, spec.namespace_name, local=local)
    except SlurmK8sError as err:
        if getattr(err, "status", None) != 404:
            echo(f"note: cannot look at namespace {spec.namespace_name} ({err})")
        return
    for finding in watch.diagnose(snap):
        if finding.fatal:
            echo(f"warning: {finding.text()}")


def delete_leftovers(session: Session, echo: Printer, *, purge: bool) -> None:
    """After destroy: worker pods (created by the resume program, not by Pulumi) always go; with
    purge also the kept PVCs and the namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from .. import manifests as m

    spec = session.spec
    ns = spec.namespace_name
    core = client.CoreV1Api(_cluster(session)[0])
    selector = f"{m.L_CLUSTER}={spec.name},{m.L_COMPONENT}=worker"
    try:
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        for pod in pods:
            core.delete_namespaced_pod(_name(pod), ns, grace_period_seconds=m.WORKER_GRACE_SECONDS)
        echo(f"deleted {len(pods)} worker pod(s) left by the resume program")
        # the spec's claims, then any other claim of this cluster (e.g. the database's, after accounting
        # was turned off in the spec)
        labelled = [_name(c) for c in core.list_namespaced_persistent_volume_claim(
            ns, label_selector=f"{m.L_CLUSTER}={spec.name}").items]
        claims = m.kept_claims(spec) + sorted(set(labelled) - set(m.kept_claims(spec)))
        if purge:
            for claim in claims:
                try:
                    core.delete_namespaced_persistent_volume_claim(claim, ns)
                    echo(f"deleted PersistentVolumeClaim {ns}/{claim}")
                except ApiException as err:
                    if err.status != 404:
                        raise
            core.delete_namespace(ns)
            t0 = time.monotonic()
            while time.monotonic() - t0 < NAMESPACE_GONE_TIMEOUT:  # a next `up` must not meet it Terminating
                try:
                    core.read_namespace(ns)
                except ApiException as err:
                    if err.status == 404:
                        break
                    raise
                time.sleep(1)
            else:
                raise DeployError(f"namespace {ns} is still terminating after {NAMESPACE_GONE_TIMEOUT:.0f}s; "
                                  f"see `kubectl get ns {ns} -o yaml` (finalizers)")
            echo(f"deleted namespace {ns} ({time.monotonic() - t0:.1f}s)")
        else:
            kept = []
            for claim in claims:
                try:
                    pvc = core.read_namespaced_persistent_volume_claim(claim, ns)
                except ApiException as err:
                    if err.status != 404:
                        raise
                    continue
                resources = pvc.spec.resources if pvc.spec else None
                size = ((pvc.status.capacity or {}) if pvc.status else {}).get("storage") \
                    or ((resources.requests or {}) if resources else {}).get("storage", "?")
                kept.append(f"{claim} ({CLAIM_PURPOSE.get(claim, claim)}, {size})")
            echo(f"kept namespace {ns} and {len(kept)} volume(s): {', '.join(kept) or 'none'}; "
                 "`slurmk8s down --purge` deletes them")
    except ApiException as err:
        if err.status == 404:
            echo(f"namespace {ns} is already gone")
            return
        raise DeployError(f"cleaning up namespace {ns} failed: {err.status} {err.reason}") from None


# ---------------------------------------------------------------- after `up`: every rollout really done

ROLLOUT_TIMEOUT = 600.0


def rollout_pending(kind: str, obj: Any) -> str | None:
    """What a StatefulSet or Deployment (the API's dict) still waits for, by kubectl's `rollout
    status` rules (for a StatefulSet also its current revision, which kubectl leaves out); None once
    rolled out. Its controller must first have seen the latest spec
    (status.observedGeneration >= metadata.generation): before that the status is the old
    revision's, which looks rolled out. Pulumi's StatefulSet await (provider 4.25) does not check
    this, so `up` could return while slurmctld's pod was still about to be replaced (a researcher's
    first command then failed: "Unable to contact slurm controller")."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    name = f"{kind.lower()}/{meta.get('name', '?')}"
    if (status.get("observedGeneration") or 0) < (meta.get("generation") or 0):
        return f"{name}: its controller has not seen the new spec yet"
    want = spec.get("replicas", 1)
    updated, ready = status.get("updatedReplicas") or 0, status.get("readyReplicas") or 0
    if kind == "StatefulSet":
        strategy = spec.get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return None  # OnDelete: nothing rolls by itself
        partition = (strategy.get("rollingUpdate") or {}).get("partition") or 0
        if ready < want:
            return f"{name}: {ready} of {want} pod(s) ready"
        if updated < want - partition:
            return f"{name}: {updated} of {want - partition} pod(s) updated"
        if partition == 0 and status.get("updateRevision") != status.get("currentRevision"):
            return f"{name}: the new revision is not current yet"
        return None
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            raise DeployError(f"{name} did not roll out: {cond.get('message', 'progress deadline exceeded')}. "
                              f"See `kubectl -n {meta.get('namespace', '?')} describe {name}`")
    if updated < want:
        return f"{name}: {updated} of {want} pod(s) updated"
    if (status.get("replicas") or 0) > updated:
        return f"{name}: {status.get('replicas', 0) - updated} old pod(s) still terminating"
    if (status.get("availableReplicas") or 0) < updated:
        return f"{name}: {status.get('availableReplicas') or 0} of {updated} updated pod(s) available"
    return None


def wait_rollouts(session: Session, echo: Printer, *, timeout: float = ROLLOUT_TIMEOUT,
                  read: Callable[[], list[tuple[str, Any]]] | None = None,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep) -> float:
    """After `up`: wait until every StatefulSet and Deployment of the cluster has rolled out (its
    controller saw the spec `up` applied, its pods are the new ones and ready); seconds waited.
    `read` (tests): [(kind, object as the API's dict)]."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if read is None:
        read = _rollout_reader(session)
    t0 = clock()
    said = ""
    next_echo = t0
    while True:
        try:
            pending = [why for kind, obj in read() if (why := rollout_pending(kind, obj))]
        except ApiException as err:
            if err.status in (401, 403):
                raise DeployError(f"reading the cluster's StatefulSets and Deployments was refused ({err.status} "
                                  f"{err.reason}): `up` applied the spec; rerun `slurmk8s up` with credentials "
                                  "that may list them") from None
            pending = [f"the Kubernetes API answered {err.status} {err.reason}"]  # asked again
        except (HTTPError, OSError) as err:
            pending = [f"the Kubernetes API did not answer ({type(err).__name__})"]  # asked again
        now = clock()
        if not pending:
            if said:
                echo(f"rolled out after {now - t0:.1f}s")
            if isinstance(getattr(session, "timings", None), dict):
                session.timings["rollout"] = now - t0
            return now - t0
        if now - t0 >= timeout:
            raise DeployError(f"not rolled out after {timeout:.0f}s: {'; '.join(pending)}. `up` applied the spec; "
                              f"see `kubectl -n {session.spec.namespace_name} get pods` and rerun `slurmk8s up`")
        waiting = "; ".join(pending)
        if waiting != said or now >= next_echo:
            said = waiting
            echo(f"waiting for the rollout: {said}")
            next_echo = now + 10.0
        sleep(1.0)


def _rollout_reader(session: Session) -> Callable[[], list[tuple[str, Any]]]:
    from kubernetes import client

    from .. import manifests as m

    api_client = _cluster(session)[0]
    apps = client.AppsV1Api(api_client)
    ns, selector = session.spec.namespace_name, f"{m.L_CLUSTER}={session.spec.name}"

    def read() -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = [
            ("StatefulSet", o) for o in apps.list_namespaced_stateful_set(ns, label_selector=selector).items]
        found += [("Deployment", o) for o in apps.list_namespaced_deployment(ns, label_selector=selector).items]
        return [(kind, api_client.sanitize_for_serialization(o)) for kind, o in found]

    return read


# seconds `up` waits, after the rollout, for slurmctld to answer from the login pod
ANSWER_TIMEOUT = 120.0


def wait_login_reaches_controller(session: Session, echo: Printer, *, timeout: float = ANSWER_TIMEOUT,
                                  ask: Callable[[], tuple[int, str, str] | None] | None = None,
                                  clock: Callable[[], float] = time.monotonic,
                                  sleep: Callable[[float], Any] = time.sleep) -> float:
    """After the rollout: wait until `scontrol ping` on the login pod finds slurmctld UP, which is
    what a researcher's first `sbatch` needs. A new slurmctld pod has a new address, and the
    cluster's DNS may answer the old one for its cache's TTL (5-30 s) after the pod is Ready:
    `sbatch` then fails with "Unable to contact slurm controller". Seconds waited; nothing is
    asked while the control tier or the login pod sleeps (`ask` returns None). `ask` (tests):
    (exit code, stdout, stderr) of one ping, or None when there is nothing to ask."""
    if ask is None:
        ask = _login_ping(session)
    t0 = clock()
    said = ""
    next_echo = t0 + 2.0  # quiet when it answers at once, as it does when nothing rolled
    while True:
        answer = ask()
        if answer is None:
            return clock() - t0
        code, out, err = answer
        now = clock()
        if code == 0 and " UP" in out:
            if said:
                echo(f"slurmctld answers from the login pod after {now - t0:.1f}s")
            return now - t0
        why = " ".join((err or out).split())[:200] or f"exit {code}"
        if now - t0 >= timeout:
            raise DeployError(f"slurmctld does not answer from the login pod after {timeout:.0f}s (`scontrol ping`: "
                              f"{why}). `up` applied the spec and it rolled out; see `kubectl -n "
                              f"{session.spec.namespace_name} logs slurmctld-0 -c slurmctld`")
        if now >= next_echo:
            said = why
            echo(f"waiting for slurmctld to answer from the login pod: {why}")
            next_echo = now + 10.0
        sleep(0.5)


def _login_ping(session: Session) -> Callable[[], tuple[int, str, str] | None]:
    from kubernetes import client

    from .. import manifests as m
    from ..kubeapi import pod_exec

    api_client = _cluster(session)[0]
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    ns = session.spec.namespace_name
    selector = f"{m.L_CLUSTER}={session.spec.name},{m.L_COMPONENT}={m.LOGIN}"

    def ask() -> tuple[int, str, str] | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            ctld = apps.read_namespaced_stateful_set(m.CONTROLLER, ns)
            pods = core.list_namespaced_pod(ns, label_selector=selector).items
        except ApiException as err:
            return 1, "", f"the Kubernetes API answered {err.status} {err.reason}"  # asked again
        except (HTTPError, OSError) as err:
            return 1, "", f"the Kubernetes API did not answer ({type(err).__name__})"
        if not (ctld.spec.replicas or 0):
            return None  # the control tier sleeps: the next submit wakes it
        ready = [_name(p) for p in pods if p.metadata is not None and p.metadata.deletion_timestamp is None
                 and any(c.type == "Ready" and c.status == "True"
                         for c in ((p.status.conditions if p.status else None) or ()))]
        if not ready:
            return None  # the login pod sleeps (it wakes with the tier) or is not part of this cluster
        return pod_exec(api_client, ns, sorted(ready)[0], m.LOGIN, ["scontrol", "ping"], timeout=15.0)

    return ask
