"""A body cut short (issue 40 item 7), on every path to the API: the deploy code's raw_call (a
generated API method), RawClient's requests and its watches, and their callers in `up` (its watch
of the cluster) and the owner check. Each is one ApiError (status 0, retryable), never a bare
urllib3 or JSON error, over real HTTP to the small local server of tests/test_kubeapi_rest.py that
cuts its answer: shorter than its Content-Length ("cut"), or without a length and closed before its
end ("cut-close": only the JSON shows it), or a watch stream whose last line is cut."""

from __future__ import annotations

import pytest
import yaml
from test_kubeapi_rest import Api, _client, _kubeconfig, _quick

from provisioner.kubeapi import ApiError, RawClient, raw_call

PODS = "/api/v1/namespaces/slurm-x/pods"


@pytest.fixture
def server():
    api = Api()
    yield api
    api.server.shutdown()


def _assert_retryable(err: pytest.ExceptionInfo) -> None:
    assert isinstance(err.value, ApiError) and err.value.status == 0 and err.value.retryable, err.value


@pytest.mark.parametrize("cut", ["cut", "cut-close"])
def test_raw_call_of_a_generated_method_cut_short_is_an_api_error(server, cut):
    from kubernetes import client

    server.answers[PODS] = cut
    core = client.CoreV1Api(_client(server.url))
    with pytest.raises(ApiError) as err:
        raw_call(core.list_namespaced_pod, (2.0, 5.0), "slurm-x")
    _assert_retryable(err)


@pytest.mark.parametrize("make_client", [_client, _quick], ids=["ApiClient", "KubeconfigClient"])
def test_a_request_cut_without_a_length_is_an_api_error(server, make_client):
    server.answers[PODS] = "cut-close"
    with pytest.raises(ApiError) as err:
        RawClient(make_client(server.url), timeout=(2.0, 5.0)).request("GET", PODS)
    _assert_retryable(err)
    assert "not JSON" in err.value.message, err.value


@pytest.mark.parametrize("make_client", [_client, _quick], ids=["ApiClient", "KubeconfigClient"])
def test_a_watch_whose_last_event_is_cut_gives_the_whole_ones_then_an_api_error(server, make_client):
    server.answers[PODS] = [b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n{"type":"MODIFIED","obj']
    events = RawClient(make_client(server.url), timeout=(2.0, 5.0)).watch_path(PODS, {}, (2.0, 5.0))
    assert next(events)["type"] == "ADDED"
    with pytest.raises(ApiError) as err:
        next(events)
    _assert_retryable(err)


@pytest.mark.parametrize("cut", ["cut", "cut-close"])
def test_ups_watch_keeps_watching_after_an_answer_cut_short(server, cut):
    """`up`'s watch (deploy/watch.py) counts an answer cut short as a failed look and looks again;
    before, the bare error stopped the watch for the rest of `up` ("stopped by an internal error")."""
    from provisioner.deploy import watch

    server.answers["/api/v1/namespaces/slurm-x/persistentvolumeclaims"] = cut
    said: list[str] = []
    w = watch.Watcher(lambda: watch.read(_client(server.url), "x", "slurm-x"), said.append, lambda: None)
    assert w.check() == []
    assert w.failed_looks == 1 and not w._stop.is_set(), said
    assert not any("internal error" in s for s in said), said


@pytest.mark.parametrize("cut", ["cut", "cut-close"])
def test_the_owner_check_refuses_with_its_message_after_an_answer_cut_short(server, cut):
    """The owner check reads the namespace: an answer cut short is NotOwner saying what failed and
    that nothing was changed, not a traceback."""
    from provisioner.deploy import owner

    server.answers["/api/v1/namespaces/slurm-x"] = cut
    with pytest.raises(owner.NotOwner, match="cannot read namespace slurm-x to check which stack owns it: 0 "):
        owner.read(yaml.safe_dump(_kubeconfig(server.url)), "slurm-x")
