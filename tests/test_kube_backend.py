"""The Kubernetes node backend against the in-memory API (FakePodApi) and, marked e2e, against the
real API server of the cluster in KUBECONFIG (or the local one), in a throwaway namespace."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from factories import node
from fakes.kube import FakePodApi

from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.elastic.backend import BackendError
from provisioner.elastic.k8s_backend import (LIST_BY_NAME_MAX, ClientPodApi, KubernetesBackend, from_env,
                                             worker_from_pod)
from provisioner.generate import generate
from provisioner.inventory import SlurmNode, nodes_from_api
from provisioner.kubeapi import ApiError, api_error_from, api_path
from provisioner.names import A_ADOPTED

NS = "slurm-t"


def _spec(namespace: str | None = None, **pool):
    data = {"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}, **pool}]}
    if namespace:
        data["namespace"] = namespace
    return parse_spec(data)


def _inventory(spec, names=("n1", "n2")):
    return generate(spec, nodes_from_api([node(n, {"p": "c"}) for n in names])).inventory


@pytest.fixture
def world():
    spec = _spec()
    inv = _inventory(spec)
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock, poll=0.5)
    return spec, inv, api, backend


def test_create_makes_exactly_the_nodes_pod(world):
    spec, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    assert list(api.pods) == [(NS, "cpu-n1")]
    pod = api.pods[(NS, "cpu-n1")]
    want = m.worker_pod(spec, inv["cpu-n1"])
    assert pod["spec"] == {**want["spec"], "nodeName": "n1"}
    assert pod["metadata"]["labels"] == want["metadata"]["labels"]
    workers = backend.list()
    assert set(workers) == {"cpu-n1"}
    w = workers["cpu-n1"]
    assert (w.name, w.phase, w.host, w.reason) == ("cpu-n1", "Pending", "n1", "")
    assert w.created_at == pytest.approx(api.now, abs=1)


def test_create_is_idempotent(world):
    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    uid = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    api.set_phase(NS, "cpu-n1", "Running")
    api.calls.clear()
    backend.create(inv["cpu-n1"])
    assert api.pods[(NS, "cpu-n1")]["metadata"]["uid"] == uid
    # 409, then a look at what is there, then the adoption's mark (conditional on its version)
    assert [c[0] for c in api.calls] == ["create", "get", "patch"]


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_create_replaces_a_finished_pod_at_once(world, phase):
    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    old = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    api.set_phase(NS, "cpu-n1", phase)
    t0 = api.now
    backend.create(inv["cpu-n1"])
    assert api.pods[(NS, "cpu-n1")]["metadata"]["uid"] != old
    assert api.pods[(NS, "cpu-n1")]["status"]["phase"] == "Pending"
    assert api.now == t0  # no waiting


def test_create_waits_for_a_terminating_pod_then_creates(world):
    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    backend.delete("cpu-n1")  # suspend, then Slurm resumes the node again at once
    assert backend.list()["cpu-n1"].phase == "Terminating"
    t0 = api.now
    backend.create(inv["cpu-n1"])
    assert api.now - t0 == pytest.approx(m.WORKER_GRACE_SECONDS, abs=1)
    assert backend.list()["cpu-n1"].phase == "Pending"


def test_create_gives_up_on_a_slow_termination_with_a_retryable_error(world):
    spec, inv, api, _ = world
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock, terminating_wait=3)
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    backend.delete("cpu-n1")
    with pytest.raises(BackendError) as err:
        backend.create(inv["cpu-n1"])
    assert err.value.retryable and "still terminating" in err.value.reason


def test_create_replaces_a_pod_built_from_an_older_spec(world):
    spec, inv, api, backend = world
    old_spec = parse_spec({**spec.model_dump(mode="json"), "images": {"worker": "slurmk8s/slurmd:old"}})
    KubernetesBackend(old_spec, api).create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    backend.create(inv["cpu-n1"])
    assert api.pods[(NS, "cpu-n1")]["spec"]["containers"][0]["image"] == spec.images.worker


def test_create_refuses_to_touch_a_foreign_pod(world):
    _, inv, api, backend = world
    api.create(NS, {"metadata": {"name": "cpu-n1"}, "spec": {"containers": [{"name": "x", "image": "x"}]}})
    with pytest.raises(BackendError) as err:
        backend.create(inv["cpu-n1"])
    assert not err.value.retryable and "not this cluster's worker" in err.value.reason
    with pytest.raises(BackendError):
        backend.delete("cpu-n1")
    assert (NS, "cpu-n1") in api.pods


def test_delete_is_idempotent_and_graceful(world):
    _, inv, api, backend = world
    backend.delete("cpu-n2")  # never existed: fine
    backend.create(inv["cpu-n2"])
    api.set_phase(NS, "cpu-n2", "Running")
    backend.delete("cpu-n2")
    backend.delete("cpu-n2")  # while terminating: fine
    assert api.pods[(NS, "cpu-n2")]["metadata"]["deletionGracePeriodSeconds"] == m.WORKER_GRACE_SECONDS
    api.advance(m.WORKER_GRACE_SECONDS)
    assert backend.list() == {}


def test_delete_of_a_pod_replaced_meanwhile_does_not_fail(world):
    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    real_get = api.get

    def get_then_replace(ns, name):  # the pod is replaced between our get and our delete
        pod = real_get(ns, name)
        api.pods.pop((ns, name))
        api.create(ns, m.worker_pod(backend.spec, inv["cpu-n1"]))
        return pod

    api.get = get_then_replace
    backend.delete("cpu-n1")  # uid precondition -> 409: left for the next suspend / reconcile
    assert (NS, "cpu-n1") in api.pods


@pytest.mark.parametrize("error,needle,retryable", [
    (ApiError(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:slurm-t:slurmctld" cannot create '
                                'resource "pods"'), "RBAC: not allowed to create pods in namespace slurm-t", False),
    (ApiError(403, "Forbidden", 'pods "cpu-n1" is forbidden: exceeded quota: compute, requested: cpu=7'),
     "resource quota", True),
    (ApiError(403, "Forbidden", 'pods "cpu-n1" is forbidden: violates PodSecurity "baseline:latest": host '
                                'namespaces (hostNetwork=true)'), "Pod Security", False),
    (ApiError(403, "Forbidden", 'pods "cpu-n1" is forbidden: ValidatingAdmissionPolicy \'slurmk8s-slurm-t-worker-pods\' '
                                "with binding 'slurmk8s-slurm-t-worker-pods' denied request: slurmk8s: the controller may "
                                "only create worker pods from the pool templates: container slurmd is privileged"),
     "worker pod refused by the admission policy slurmk8s-slurm-t-worker-pods", False),
    (ApiError(422, "Invalid", 'Pod "cpu-n1" is invalid: spec.containers[0].image: Required value'),
     "invalid worker pod spec", False),
    (ApiError(404, "NotFound", 'namespaces "slurm-t" not found'), "namespace slurm-t not found", False),
    (ApiError(500, "InternalError", "etcdserver: request timed out"), "API error 500", True),
    (ApiError(503, "ServiceUnavailable", ""), "API error 503", True),
    (ApiError(429, "TooManyRequests", "storage is (re)initializing"), "throttling", True),
    (ApiError(401, "Unauthorized", ""), "token", True),
    (ApiError(0, "Unreachable", "MaxRetryError: connection refused"), "unreachable", True),
])
def test_api_errors_become_readable_backend_errors(world, error, needle, retryable):
    _, inv, api, backend = world
    api.fail_next = [error]
    with pytest.raises(BackendError) as err:
        backend.create(inv["cpu-n1"])
    assert needle in err.value.reason and err.value.retryable is retryable
    assert err.value.node == "cpu-n1" and "\n" not in err.value.reason and len(err.value.reason) < 300


def test_rbac_is_enforced_by_the_fake_as_by_the_api_server(world):
    spec, inv, _, _ = world
    api = FakePodApi(allowed=frozenset({"get", "list"}))
    backend = KubernetesBackend(spec, api)
    with pytest.raises(BackendError, match="RBAC: not allowed to create pods"):
        backend.create(inv["cpu-n1"])
    assert backend.list() == {}


def test_invalid_node_name_is_rejected_like_the_api_server_does():
    spec = _spec()
    api = FakePodApi()
    bad = SlurmNode(name="Cpu_N1", pool="cpu", partition="cpu", cpus=1, real_memory=1024)
    with pytest.raises(BackendError, match="invalid worker pod spec"):
        KubernetesBackend(spec, api).create(bad)


def test_list_errors_and_reasons(world):
    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Pending", waiting="ErrImageNeverPull")
    assert backend.list()["cpu-n1"].reason == "ErrImageNeverPull"
    api.fail_next = [ApiError(500, "InternalError", "boom")]
    with pytest.raises(BackendError) as err:
        backend.list()
    assert err.value.retryable


def test_a_list_for_a_few_nodes_reads_only_their_pods(world):
    """A resume / suspend / resume-fail of a few nodes asks the API server for those nodes' pods
    only (a set-based label selector), so its cost does not grow with the cluster; past
    LIST_BY_NAME_MAX names it lists them all once and keeps the named ones."""
    spec, _, api, backend = world
    inv = _inventory(spec, names=[f"n{i}" for i in range(300)])
    for i in range(300):
        backend.create(inv[f"cpu-n{i}"])
    api.selectors.clear()
    assert set(backend.list(["cpu-n7", "cpu-n3", "cpu-n7"])) == {"cpu-n3", "cpu-n7"}
    assert api.selectors == [f"{backend._selector},{m.L_NODE} in (cpu-n3,cpu-n7)"]
    many = [f"cpu-n{i}" for i in range(LIST_BY_NAME_MAX + 1)]
    assert set(backend.list(many)) == set(many)
    assert api.selectors[-1] == backend._selector  # all, filtered here
    assert len(backend.list()) == 300 and backend.list([]) == {}


def test_worker_reasons_from_real_pod_statuses():
    unsched = {"metadata": {"name": "a", "labels": {m.L_NODE: "a"}}, "spec": {},
               "status": {"phase": "Pending", "conditions": [
                   {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}}
    assert worker_from_pod(unsched).reason == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    crash = {"metadata": {"name": "a", "labels": {m.L_NODE: "a"}}, "spec": {"nodeName": "k1"},
             "status": {"phase": "Running", "containerStatuses": [
                 {"name": "slurmd", "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                          "message": "back-off 40s restarting failed container"}}}]}}
    assert worker_from_pod(crash).reason.startswith("CrashLoopBackOff: back-off")
    evicted = {"metadata": {"name": "a"}, "spec": {},
               "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}}
    w = worker_from_pod(evicted)
    assert (w.phase, w.reason) == ("Failed", "Evicted: The node was low on resource: memory.")
    gone = {"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}
    assert worker_from_pod(gone).phase == "Terminating"


def test_api_exception_translation():
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=409, reason="Conflict")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "AlreadyExists",
                           "message": 'pods "cpu-n1" already exists', "code": 409})
    err = api_error_from(exc)
    assert (err.status, err.reason, err.message) == (409, "AlreadyExists", 'pods "cpu-n1" already exists')
    exc = ApiException(status=502, reason="Bad Gateway")
    exc.body = "<html>bad gateway</html>"
    err = api_error_from(exc)
    assert (err.status, err.reason) == (502, "Bad Gateway") and "bad gateway" in err.message
    from urllib3.exceptions import MaxRetryError

    assert api_error_from(MaxRetryError(None, "/api", "refused")).status == 0


def test_from_env_reads_the_mounted_spec(tmp_path):
    spec = _spec(namespace="slurm-x")
    (tmp_path / "spec.json").write_text(json.dumps(spec.model_dump(mode="json")))
    (tmp_path / "site.json").write_text(json.dumps({"cluster_domain": "corp.local", "host_network_sources": []}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    backend = from_env({"SLURMK8S_SPEC": str(tmp_path / "spec.json"), "SLURMK8S_SITE": str(tmp_path / "site.json"),
                        "KUBECONFIG": str(kubeconfig), "SLURMK8S_NAMESPACE": "slurm-x"})
    assert backend.namespace == "slurm-x" and backend.site.cluster_domain == "corp.local"
    assert backend.spec == spec
    # nothing listens on port 1: a readable, retryable error instead of a traceback
    backend.api._timeout = (0.5, 0.5)
    with pytest.raises(BackendError) as err:
        backend.list()
    assert err.value.retryable and "unreachable" in err.value.reason


def test_from_env_with_a_broken_spec_says_so(tmp_path):
    (tmp_path / "spec.json").write_text("{not json")
    with pytest.raises(BackendError, match="cannot read the cluster spec"):
        from_env({"SLURMK8S_SPEC": str(tmp_path / "spec.json")})


def test_resume_program_replaces_a_dead_worker_through_this_backend(world):
    """The elastic planner's REPLACE (delete, then create) works against API semantics."""
    from provisioner.elastic.backend import Worker
    from provisioner.elastic.plan import Action, plan_resume

    _, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Failed")
    (decision,) = plan_resume(["cpu-n1"], inv, backend.list(), None)
    assert decision.action == Action.REPLACE
    backend.delete(decision.node)
    backend.create(decision.slurm_node)
    new = api.pods[(NS, "cpu-n1")]["metadata"]
    assert backend.list() == {"cpu-n1": Worker("cpu-n1", "Pending", "", backend.list()["cpu-n1"].created_at, "n1",
                                               uid=new["uid"], version=new["resourceVersion"])}


# ---------------------------------------------------------------- e2e: the real API server

LOCAL_KUBECONFIG = "/var/lib/slurmk8s/localk8s/kubeconfig"


def _kubeconfig() -> str | None:
    path = os.environ.get("KUBECONFIG") or LOCAL_KUBECONFIG
    return path if Path(path).is_file() else None


@pytest.fixture
def live():
    """A throwaway namespace with the cluster's ServiceAccount/Role/RoleBinding; a backend that
    talks to the API server with that ServiceAccount's token (so RBAC is the real one)."""
    from kubernetes import client, config

    path = _kubeconfig()
    if path is None:
        pytest.skip("no kubeconfig (set KUBECONFIG or run `slurmk8s cluster up`)")
    admin = config.new_client_from_config(config_file=path)
    core = client.CoreV1Api(admin)
    rbac = client.RbacAuthorizationV1Api(admin)
    ns = f"slurmk8s-e2e-{uuid.uuid4().hex[:6]}"
    raw_nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
    real = [n for n in raw_nodes if not (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node")]
    k8s_node = real[0]["metadata"]["name"]
    spec = parse_spec({"name": "e2e", "namespace": ns,
                       "pools": [{"name": "cpu", "node_selector": {"kubernetes.io/hostname": k8s_node},
                                  "reserve_cpu": "1", "reserve_memory": "20Gi", "min_memory": "256Mi"}],
                       "images": {"pull_policy": "Never"}})
    inv = generate(spec, nodes_from_api(real)).inventory
    core.create_namespace({"metadata": {"name": ns}})
    try:
        core.create_namespaced_service_account(ns, m.controller_service_account(spec))
        rbac.create_namespaced_role(ns, m.worker_role(spec))
        rbac.create_namespaced_role_binding(ns, m.worker_role_binding(spec))
        # the owner every worker pod names (read by the backend before its first create); no replicas
        labels = {"app.kubernetes.io/component": m.CONTROLLER}
        client.AppsV1Api(admin).create_namespaced_stateful_set(ns, {
            "metadata": {"name": m.CONTROLLER},
            "spec": {"replicas": 0, "serviceName": m.CONTROLLER, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "slurmctld", "image": "slurmk8s/slurmctld:dev"}]}}}})
        token = core.create_namespaced_service_account_token(
            "slurmctld", ns, {"spec": {"expirationSeconds": 600}}).status.token
        cfg = client.Configuration()
        cfg.host = admin.configuration.host
        cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
        cfg.verify_ssl = admin.configuration.verify_ssl
        cfg.api_key = {"authorization": f"Bearer {token}"}
        api = ClientPodApi(client.ApiClient(cfg))
        yield spec, inv, api, core, ns
    finally:
        core.delete_namespace(ns, grace_period_seconds=0)


@pytest.mark.e2e
def test_e2e_backend_creates_lists_and_deletes_real_pods(live):
    spec, inv, api, core, ns = live
    backend = KubernetesBackend(spec, api, namespace=ns)
    n = inv.nodes[0]
    t0 = time.monotonic()
    backend.create(n)
    created = time.monotonic() - t0
    backend.create(n)  # idempotent against the real 409
    workers = backend.list()
    assert set(workers) == {n.name} and workers[n.name].phase in ("Pending", "Running")
    pod = core.read_namespaced_pod(n.name, ns)
    assert pod.spec.hostname == n.name and pod.spec.subdomain == "workers"
    assert [(r.kind, r.name) for r in pod.metadata.owner_references] == [("StatefulSet", m.CONTROLLER)]
    assert pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        .node_selector_terms[0].match_fields[0].values == [n.k8s_node]
    t0 = time.monotonic()
    backend.delete(n.name)
    backend.delete(n.name)
    deleted = time.monotonic() - t0
    # resume right after suspend: waits for the old pod to go, then creates a fresh one
    backend.create(n)
    assert backend.list()[n.name].phase in ("Pending", "Running")
    backend.delete(n.name)
    print(f"e2e: create {created * 1000:.0f} ms, delete x2 {deleted * 1000:.0f} ms")


@pytest.mark.e2e
def test_e2e_rbac_allows_pods_only_in_the_own_namespace(live):
    from kubernetes.client.exceptions import ApiException

    spec, inv, api, core, ns = live
    with pytest.raises(ApiError) as err:
        api.request("GET", api_path("v1", ns, "secrets"))
    assert err.value.status == 403
    other = KubernetesBackend(spec, api, namespace="default")
    with pytest.raises(BackendError) as berr:
        other.create(inv.nodes[0])
    # its first request there, the read of the pods' owner, is refused: no pod is created
    assert f"RBAC: not allowed to get StatefulSet {m.CONTROLLER} in default" in berr.value.reason, berr.value.reason
    assert not berr.value.retryable
    with pytest.raises(ApiException):
        core.read_namespaced_pod(inv.nodes[0].name, "default")


@pytest.mark.e2e
def test_e2e_the_reconcile_watch_follows_real_pods(live):
    """The reconcile loop's pod watch (elastic/podwatch.py) against the real API server, with the
    ServiceAccount's own rights: listed, then a created pod, its progress and its deletion arrive
    as events; each view equals a fresh list; the watch is resumed across the server's end of it."""
    import io

    from provisioner.elastic.podwatch import PodWatch, WatchedBackend
    from provisioner.logs import Log

    spec, inv, api, _, ns = live
    backend = KubernetesBackend(spec, api, namespace=ns)
    out = io.StringIO()
    watch = PodWatch(api, ns, backend.selector, Log("reconcile", stream=out), timeout_s=2).start()
    try:
        assert watch.wait_synced(10), out.getvalue()
        assert watch.workers() == {}
        n = inv.nodes[0]
        backend.create(n)

        def until(check, what):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if check(watch.workers() or {}):
                    return
                time.sleep(0.1)
            pytest.fail(f"the watch never saw {what}: {watch.workers()} {out.getvalue()}")

        until(lambda w: n.name in w, "the pod created")
        time.sleep(3)  # past one end of the watch (timeout 2 s): resumed, nothing lost or doubled
        # the pod may still be starting: the view equals a fresh list within the events' delay
        until(lambda w: w == backend.list(), "the same pods as a fresh list")
        until(lambda w: WatchedBackend(backend, watch).list() == w, "its backend's list being the view")
        backend.delete(n.name, force=True)
        until(lambda w: n.name not in w, "the pod deleted")
        assert watch.lists == 1, out.getvalue()  # never had to list again
        assert watch.events >= 2
    finally:
        watch.stop()


@pytest.mark.e2e
def test_e2e_an_adoption_refuses_the_reconcile_delete_judged_before_it(live):
    """Issue 40 item 2 on the real API server, with the ServiceAccount's own Role and the worker
    pod admission policy bound to the namespace: the resume's adoption (a merge patch conditional
    on the resourceVersion) is allowed and admitted, and the loop's delete judged before it fails
    its resourceVersion precondition; a delete that came first makes the adoption's write fail
    (409) and the pod is not kept; a pod gone is WorkerGone."""
    from kubernetes import client, config

    from provisioner.elastic.backend import WorkerGone, WorkerReplaced

    spec, inv, api, core, ns = live
    admission = client.AdmissionregistrationV1Api(config.new_client_from_config(config_file=_kubeconfig()))
    policy, binding = m.admission_objects(spec)
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        backend = KubernetesBackend(spec, api, namespace=ns)
        n = inv.nodes[0]
        bad = m.worker_pod(spec, n)
        bad["metadata"]["name"] = "not-a-worker"
        bad["spec"]["containers"][0]["image"] = "busybox:latest"
        for _ in range(100):  # a policy takes a moment to be enforced: until it refuses a foreign image
            try:
                api.create(ns, bad)
                api.delete(ns, "not-a-worker", grace_seconds=0)
                time.sleep(0.2)
            except ApiError as err:
                assert err.status == 403 and "ValidatingAdmissionPolicy" in err.message, err.message
                break
        else:
            pytest.fail("the admission policy was never enforced")
        backend.create(n)
        judged = backend.list()[n.name]
        t0 = time.monotonic()
        assert backend.adopt(n.name, judged.uid, judged.version)  # allowed (Role) and admitted (UPDATE)
        adopted = time.monotonic() - t0
        pod = api.get(ns, n.name)
        assert pod["metadata"]["annotations"][A_ADOPTED] and pod["metadata"]["resourceVersion"] != judged.version
        with pytest.raises(WorkerReplaced, match="changed since"):
            backend.delete(n.name, judged.uid, version=judged.version)
        assert not api.get(ns, n.name)["metadata"].get("deletionTimestamp")
        # a merge patch's resourceVersion is a precondition: the adoption's write from a version gone stale
        with pytest.raises(ApiError) as err:
            api.patch(ns, n.name, {"metadata": {"resourceVersion": judged.version, "annotations": {A_ADOPTED: "x"}}})
        assert err.value.status == 409
        # the other order: a delete as judged now (the kubelet may write the pod's status between
        # a read and the delete: read again), then an adoption from the older version
        for _ in range(20):
            now = backend.list()[n.name]
            try:
                backend.delete(n.name, now.uid, version=now.version)
                break
            except WorkerReplaced:
                continue
        assert not backend.adopt(n.name, now.uid, now.version)  # terminating (or gone): not kept
        backend.delete(n.name, force=True)
        with pytest.raises(WorkerGone):
            backend.delete(n.name, now.uid, version=now.version)
        print(f"e2e: adoption {adopted * 1000:.0f} ms")
    finally:
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        admission.delete_validating_admission_policy(policy["metadata"]["name"])


@pytest.mark.e2e
def test_e2e_invalid_pod_is_a_readable_error(live):
    spec, _, api, _, ns = live
    bad = SlurmNode(name="Bad_Name", pool="cpu", partition="cpu", cpus=1, real_memory=256, k8s_node="x")
    with pytest.raises(BackendError) as err:
        KubernetesBackend(spec, api, namespace=ns).create(bad)
    assert "invalid worker pod spec" in err.value.reason and not err.value.retryable


def test_in_cluster_credentials_without_the_service_env(tmp_path):
    """Slurm starts ResumeProgram with a reduced environment: the mounted token is enough."""
    from provisioner.kubeapi import api_client

    (tmp_path / "token").write_text("tok")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    api = api_client(env={}, sa_dir=str(tmp_path))
    assert api.configuration.host == "https://kubernetes.default.svc:443"
    assert api.configuration.get_api_key_with_prefix("BearerToken").lower() == "bearer tok"
    api = api_client(env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
                      sa_dir=str(tmp_path))
    assert api.configuration.host == "https://10.0.0.1:6443"


def test_tls_verification_failure_is_named_and_not_retried(world):
    """Seen in the slurmctld pod (Python 3.13 verifies X.509 strictly) against a CA without keyUsage."""
    from urllib3.exceptions import MaxRetryError, SSLError

    from provisioner.kubeapi import transport_error

    inner = SSLError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: CA cert does not include key "
                     "usage extension (_ssl.c:1029)")
    err = transport_error(MaxRetryError(None, "/api/v1/namespaces/x/pods", inner))
    assert (err.status, err.reason, err.message) == (0, "TLSVerify", "CA cert does not include key usage extension")
    _, inv, api, backend = world
    api.fail_next = [err]
    with pytest.raises(BackendError) as berr:
        backend.create(inv["cpu-n1"])
    assert berr.value.reason == ("cannot verify the Kubernetes API server's TLS certificate: CA cert does not "
                                 "include key usage extension") and not berr.value.retryable


def test_worker_from_pod_reports_the_containers_last_death():
    from provisioner.elastic.pods import worker_from_pod

    pod = {"metadata": {"name": "cpu-0", "labels": {"slurmk8s.io/node": "cpu-0"},
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"phase": "Running", "containerStatuses": [{
               "name": "slurmd", "restartCount": 1, "state": {"running": {"startedAt": "2026-01-01T00:05:01Z"}},
               "lastState": {"terminated": {"reason": "Error", "exitCode": 137,
                                            "finishedAt": "2026-01-01T00:05:00Z"}}}]}}
    w = worker_from_pod(pod)
    assert w.phase == "Running" and w.died_at == w.created_at + 300
    assert w.died_how == "slurmd Error (exit 137), 1 restarts"
    assert w.restarts == 1  # the kubelet's count: compared only with itself, never with Slurm's clock
    del pod["status"]["containerStatuses"][0]["lastState"]
    assert worker_from_pod(pod).died_at is None


# ---------------------------------------------------------------- worker pods are owned by the slurmctld StatefulSet


def test_worker_pods_name_the_slurmctld_statefulset_as_owner(world):
    """Every pod a resume creates names the live slurmctld StatefulSet (the uid read from the API, once
    per program run), so the garbage collector deletes it with the StatefulSet (helm uninstall,
    down, the namespace's deletion), also a pod created after the pre-delete hook ran."""
    spec, inv, api, backend = world
    backend.create(inv["cpu-n1"])
    backend.create(inv["cpu-n2"])
    for name in ("cpu-n1", "cpu-n2"):
        assert api.pods[(NS, name)]["metadata"]["ownerReferences"] == [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "slurmctld", "uid": f"sts-{NS}",
             "controller": False, "blockOwnerDeletion": False}]
    assert api.calls.count(("get-statefulset", NS)) == 1  # read once per run
    # still recognised as ours: listed, same spec hash (a second create is a no-op), deleted by name
    assert set(backend.list()) == {"cpu-n1", "cpu-n2"}
    before = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    backend.create(inv["cpu-n1"])
    assert api.pods[(NS, "cpu-n1")]["metadata"]["uid"] == before
    backend.delete("cpu-n2")
    gone = api.pods.get((NS, "cpu-n2"))
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    # the owner's uid is not part of the spec hash (a new deployment does not replace pods by itself)
    assert m.A_SPEC_HASH in api.pods[(NS, "cpu-n1")]["metadata"]["annotations"]
    assert api.pods[(NS, "cpu-n1")]["metadata"]["annotations"][m.A_SPEC_HASH] == \
        m.worker_pod(spec, inv["cpu-n1"])["metadata"]["annotations"][m.A_SPEC_HASH]


@pytest.mark.parametrize("error,reason,retryable", [
    (None, "StatefulSet slurmctld not found in slurm-t", False),
    (ApiError(403, "Forbidden", 'statefulsets.apps "slurmctld" is forbidden'), "RBAC: not allowed to get StatefulSet "
     "slurmctld in slurm-t", False),
    (ApiError(503, "ServiceUnavailable", "etcd"), "503 ServiceUnavailable: etcd", True),
])
def test_an_unreadable_owner_fails_the_resume_and_creates_no_ownerless_pod(world, error, reason, retryable):
    spec, inv, _, _ = world
    api = FakePodApi(namespaces={NS}, statefulsets={}, statefulset_error=error)
    backend = KubernetesBackend(spec, api)
    with pytest.raises(BackendError) as err:
        backend.create(inv["cpu-n1"])
    assert err.value.reason.startswith("cannot read the worker pods' owner (StatefulSet slurmctld in slurm-t): ")
    assert reason in err.value.reason and "no worker pod without an owner is created" in err.value.reason
    assert err.value.retryable is retryable
    assert api.pods == {}
