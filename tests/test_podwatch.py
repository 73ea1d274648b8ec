"""The reconcile loop's watch of the worker pods (provisioner.elastic.podwatch): list once, then
events; resumed from the last version; listed again after a 410 or a failure; and the backend that
serves the loop's list from it. The API here is scripted (each watch call returns the events given
for it); tests/test_kube_backend.py's e2e test runs the watch against the real API server."""

from __future__ import annotations

import io

import pytest
from fakes.kube import FakePodApi

from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.elastic.backend import BackendError
from provisioner.elastic.k8s_backend import KubernetesBackend, list_all
from provisioner.elastic.podwatch import PodWatch, WatchedBackend, watched
from provisioner.kubeapi import ApiError
from provisioner.logs import Log

NS = "slurm-t"
SEL = "slurmk8s.io/cluster=t,app.kubernetes.io/component=worker"


def pod(name: str, uid: str = "", phase: str = "Pending", version: str = "1") -> dict:
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": version,
                         "labels": {m.L_NODE: name}},
            "spec": {}, "status": {"phase": phase}}


def event(kind: str, obj: dict) -> dict:
    return {"type": kind, "object": obj}


class ScriptedApi:
    """list_page over `pods` at `version`; each watch call returns the next script: a list of events
    (the watch then ends, as the API server ends it after its timeout) or an exception to raise.
    When the scripts are used up it stops the PodWatch under test, so run() returns."""

    def __init__(self, pods: list[dict], version: str = "10") -> None:
        self.pods = pods
        self.version = version
        self.scripts: list = []
        self.lists: list[tuple[int, str]] = []  # (limit, continue) of each page asked for
        self.watched_from: list[str] = []
        self.watch_under_test: PodWatch | None = None
        self.final: dict | None = None

    def list_page(self, namespace: str, label_selector: str, limit: int, cont: str = "") -> dict:
        assert (namespace, label_selector) == (NS, SEL)
        self.lists.append((limit, cont))
        start = int(cont or 0)
        more = start + limit < len(self.pods)
        return {"items": self.pods[start:start + limit],
                "metadata": {"resourceVersion": self.version, "continue": str(start + limit) if more else ""}}

    def watch(self, namespace: str, label_selector: str, resource_version: str, timeout_s: int):
        self.watched_from.append(resource_version)
        if not self.scripts:
            self.final = self.watch_under_test.workers()  # the view at the end (dropped once run() returns)
            self.watch_under_test.stop()
            return iter(())
        script = self.scripts.pop(0)
        if isinstance(script, Exception):
            raise script
        return iter(script)


def run(api: ScriptedApi, **kw) -> tuple[PodWatch, str]:
    out = io.StringIO()
    w = PodWatch(api, NS, SEL, Log("reconcile", stream=out), retry_s=(0.0, 0.0), **kw)
    api.watch_under_test = w
    w.run()
    return w, out.getvalue()


def test_lists_once_then_applies_events_and_resumes_from_the_last_version():
    api = ScriptedApi([pod("a"), pod("b")])
    api.scripts = [
        [event("ADDED", pod("c", version="11")),
         event("MODIFIED", pod("a", phase="Running", version="12")),
         event("DELETED", pod("b", version="13")),
         event("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
        [event("MODIFIED", pod("c", phase="Running", version="16"))],
    ]
    w, _ = run(api)
    got = api.final
    assert {n: x.phase for n, x in got.items()} == {"a": "Running", "c": "Running"}
    assert w.lists == 1 and w.events == 4
    # each watch goes on from the last version seen (the bookmark's), the first from the list's
    assert api.watched_from == ["10", "15", "16"]


def test_a_deletion_of_an_older_pod_leaves_the_newer_one_of_that_name():
    api = ScriptedApi([pod("a", uid="old")])
    api.scripts = [[event("ADDED", pod("a", uid="new", version="11")),  # seen before the old one's end
                    event("DELETED", pod("a", uid="old", version="12"))]]
    w, _ = run(api)
    assert api.final["a"].uid == "new"


def test_a_pod_taken_away_and_deleted_is_remembered_with_its_cause_until_one_of_its_name_returns():
    """A scheduler preemption marks the pod (DisruptionTarget) and deletes it; its preStop hook may end
    it before the loop's next pass, so the watch keeps who took it (taken_gone), for that pass."""
    taken = pod("a", phase="Running", version="11")
    taken["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                                      "message": "hi: preempting to accommodate a higher priority pod"}]
    api = ScriptedApi([pod("a", phase="Running"), pod("b", phase="Running")])
    api.scripts = [[event("MODIFIED", taken), event("DELETED", {**taken, "metadata": {**taken["metadata"],
                                                                                        "resourceVersion": "12"}}),
                    event("DELETED", pod("b", phase="Running", version="13"))]]
    w, _ = run(api)
    gone = w.taken_gone()
    assert list(gone) == ["a"] and gone["a"].startswith("Kubernetes: PreemptionByScheduler: hi: preempting")
    api.scripts = [[event("ADDED", pod("a", uid="new", version="20"))]]  # its next pod: forgotten
    w._apply(iter(api.scripts.pop(0)))
    assert w.taken_gone() == {}


def test_an_expired_version_lists_again_and_watches_from_the_new_list():
    api = ScriptedApi([pod("a")])
    api.scripts = [[event("MODIFIED", pod("a", phase="Running", version="11")),
                    event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired",
                                    "message": "too old resource version: 11 (20)"})]]

    def relisted(*args):
        if api.lists:  # the second list finds another pod and a newer version
            api.pods, api.version = [pod("a"), pod("b")], "30"
        return ScriptedApi.list_page(api, *args)

    api.list_page = relisted  # what the second list sees
    w, log = run(api)
    assert sorted(api.final) == ["a", "b"] and w.lists == 2
    assert api.watched_from == ["10", "30"]
    assert "failed" not in log  # an expired version is routine, not an error


def test_a_failed_watch_drops_the_view_until_listed_again():
    api = ScriptedApi([pod("a")])
    seen_at_list = []

    def list_page(*args):
        if api.lists:  # the second list, after the failure: no view meanwhile
            seen_at_list.append(api.watch_under_test.workers())
        return ScriptedApi.list_page(api, *args)

    api.list_page = list_page
    api.scripts = [ApiError(0, "Unreachable", "connection refused")]
    w, log = run(api)
    assert seen_at_list == [None] and w.lists == 2
    assert "pod watch failed (0 Unreachable: connection refused)" in log
    assert "in sync again (1 worker pods)" in log


def test_a_410_answer_to_the_watch_lists_again_quietly():
    api = ScriptedApi([pod("a")])
    api.scripts = [[event("MODIFIED", pod("a", phase="Running", version="11"))],
                   ApiError(410, "Expired", "too old resource version: 11 (40)")]
    w, log = run(api)
    assert w.lists == 2 and "failed" not in log


def test_a_version_expired_before_any_event_waits_and_says_so():
    api = ScriptedApi([pod("a")])
    api.scripts = [ApiError(410, "Expired", "too old"), ApiError(410, "Expired", "too old")]
    waits = []
    out = io.StringIO()
    w = PodWatch(api, NS, SEL, Log("reconcile", stream=out), retry_s=(0.0, 0.0))
    w._stop.wait = lambda s: waits.append(s)  # each backoff, instead of sleeping
    api.watch_under_test = w
    w.run()
    assert w.lists == 3 and len(waits) == 2  # no relisting at full speed
    assert out.getvalue().count("already expired (410) before any event") == 1  # said once


def test_any_failure_drops_the_view_and_the_watch_goes_on():
    api = ScriptedApi([pod("a")])
    api.scripts = [RuntimeError("Token file exists but empty.")]  # e.g. the client's ConfigException
    w, log = run(api)
    assert w.lists == 2 and "pod watch failed (Token file exists but empty.)" in log


def synced(pods: list[dict], **kw) -> PodWatch:
    """A PodWatch that has made its first list and not started watching (its view stays as listed)."""
    w = PodWatch(ScriptedApi(pods), NS, SEL, Log("reconcile", stream=io.StringIO()), **kw)
    w._list()
    return w


def test_a_view_not_heard_of_for_longer_than_a_watch_lasts_is_not_used():
    w = synced([pod("a")], timeout_s=5)
    assert sorted(w.workers()) == ["a"] and w.stale_after == 35
    w._contact -= w.stale_after + 1  # a connection gone quiet: no event, no end of the watch
    assert w.workers() is None


def test_the_view_is_gone_once_the_thread_ends():
    api = ScriptedApi([pod("a")])
    w, _ = run(api)
    assert w.workers() is None and w.lists == 1


def test_list_all_reads_every_page_and_the_lists_version():
    api = ScriptedApi([pod(f"n{i}") for i in range(1201)], version="77")
    items, version = list_all(api, NS, SEL)
    assert len(items) == 1201 and version == "77"
    assert api.lists == [(500, ""), (500, "500"), (500, "1000")]


@pytest.fixture
def backend():
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}]})
    api = FakePodApi(namespaces={NS})
    return KubernetesBackend(spec, api, namespace=NS, sleep=api.sleep, clock=api.clock)


def test_the_loops_list_comes_from_the_watch_after_a_one_pod_list(backend):
    assert backend.selector == SEL
    wb = WatchedBackend(backend, synced([pod("a"), pod("b")]))
    backend.api.calls.clear()
    backend.api.selectors.clear()
    assert sorted(wb.list()) == ["a", "b"]  # the watch's view, not the (empty) fake API's pods
    assert backend.api.calls == [("list", NS)] and backend.api.limits == [1]  # the ping: one page of one pod
    # a few nodes by name are asked of the API (the DOWN re-check of reconcile.act never reads a view)
    assert wb.list(["a"]) == {}
    assert backend.api.selectors[-1].endswith(f"{m.L_NODE} in (a)")


def test_an_api_that_does_not_answer_fails_the_list_as_before(backend):
    w = synced([pod("a")])
    backend.api.fail_next = [ApiError(0, "Unreachable", "connection refused")]
    with pytest.raises(BackendError, match="Kubernetes API unreachable"):
        WatchedBackend(backend, w).list()


def test_without_a_view_the_list_is_the_backends_own(backend):
    w = PodWatch(ScriptedApi([]), NS, SEL, Log("reconcile", stream=io.StringIO()))  # never started
    backend.api.pods[(NS, "x")] = pod("x") | {"metadata": {"name": "x", "uid": "u", "labels": {
        m.L_CLUSTER: "t", m.L_COMPONENT: "worker", m.L_NODE: "x"}}}
    assert sorted(WatchedBackend(backend, w).list()) == ["x"]


def test_only_a_kubernetes_backend_is_watched():
    class Docker:
        pass

    d = Docker()
    assert watched(d, Log("reconcile", stream=io.StringIO())) is d


class Stream:
    """What the client returns for `_preload_content=False`: chunks as they arrive."""

    def __init__(self, chunks, error=None):
        self.chunks, self.error, self.closed, self.released = chunks, error, False, False

    def stream(self, amt):
        yield from self.chunks
        if self.error is not None:
            raise self.error

    def close(self):
        self.closed = True

    def release_conn(self):
        self.released = True


def test_json_lines_joins_lines_across_chunks_and_closes_the_response():
    from provisioner.kubeapi import json_lines

    resp = Stream([b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n{"ty', b'pe":"BOOKMARK","object":{}}\n',
                   b'\n{"type":"DELETED","object":{"metadata":{"name":"a"}}}'])  # the last line unterminated
    events = list(json_lines(resp))
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK", "DELETED"]
    assert resp.closed and resp.released
    early = Stream([b'{"type":"ADDED","object":{}}\n{"type":"ADDED","object":{}}\n'])
    gen = json_lines(early)
    next(gen)
    gen.close()  # the consumer stopped (e.g. an Expired): the connection is closed, not reused half read
    assert early.closed and early.released


def test_a_broken_watch_stream_is_an_api_error():
    from urllib3.exceptions import ProtocolError

    from provisioner.kubeapi import json_lines

    broken = Stream([b'{"type":"ADDED","object":{}}\n'], error=ProtocolError("Connection broken: IncompleteRead"))
    with pytest.raises(ApiError) as err:
        list(json_lines(broken))
    assert err.value.status == 0 and "IncompleteRead" in err.value.message and broken.closed
