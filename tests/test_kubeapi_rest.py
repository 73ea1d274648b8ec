"""RawClient (provisioner.kubeapi): requests by REST path through the official client's ApiClient
and through a KubeconfigClient (each test runs over both), over real HTTP to a small local server
that answers as the API server does (JSON, Status bodies, a chunked watch stream). The real API
server is exercised by the e2e tier (the reconcile watch and the pod calls in
tests/test_kube_backend.py, the wake in e2e/test_e2e_sleep.py, through `slurmk8s submit`)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml

from provisioner.kubeapi import MERGE_PATCH, ApiError, KubeconfigClient, RawClient, api_path, quick_client


class Api:
    """A local HTTP server: records each request, answers from `answers` (path -> (status, body,
    content type) or a list of chunks for a streamed watch; "cut": a body shorter than its
    Content-Length; "cut-close": a body without a length, cut by the connection's close)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: dict[str, Any] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                url = urlsplit(self.path)
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                api.requests.append({"method": self.command, "path": url.path, "query": dict(parse_qsl(url.query)),
                                     "headers": {k.lower(): v for k, v in self.headers.items()},
                                     "body": json.loads(body) if body else None})
                answer = api.answers.get(url.path, (404, {"kind": "Status", "reason": "NotFound",
                                                          "message": f"{url.path} not found"}, "application/json"))
                if answer == "cut":  # a body that ends before its Content-Length: the connection lost
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"kind": "PodList", "ite')
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if answer == "cut-close":  # no length said, the connection closed before the body's end
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(b'{"kind": "PodList", "ite')
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if isinstance(answer, list):  # a watch: chunked transfer, one chunk per item
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in answer:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                status, doc, kind = answer
                data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _kubeconfig(server: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "secret-token"}}]}


def _client(server: str) -> Any:
    """The official client's ApiClient for `server`."""
    from kubernetes import config

    return config.new_client_from_config_dict(_kubeconfig(server))


def _quick(server: str) -> Any:
    """The same kubeconfig as a KubeconfigClient (the CLI's wake)."""
    client = quick_client(yaml.safe_dump(_kubeconfig(server)))
    assert isinstance(client, KubeconfigClient)
    return client


@pytest.fixture(params=["ApiClient", "KubeconfigClient"])
def make_client(request):
    """Every RawClient test runs over both clients: they must send and answer the same."""
    return _client if request.param == "ApiClient" else _quick


@pytest.fixture
def api(make_client):
    server = Api()
    yield server, RawClient(make_client(server.url), timeout=(2.0, 5.0))
    server.server.shutdown()


def test_api_path_names_core_and_group_resources():
    assert api_path("v1", "slurm-x", "pods") == "/api/v1/namespaces/slurm-x/pods"
    assert api_path("v1", "slurm-x", "pods", "w-1", "log") == "/api/v1/namespaces/slurm-x/pods/w-1/log"
    assert (api_path("apps/v1", "slurm-x", "statefulsets", "slurmctld", "scale")
            == "/apis/apps/v1/namespaces/slurm-x/statefulsets/slurmctld/scale")
    assert api_path("v1", "a/b", "pods", "c?d") == "/api/v1/namespaces/a%2Fb/pods/c%3Fd"  # never a path escape


def test_a_get_sends_the_query_and_the_credentials_and_returns_the_json(api):
    server, raw = api
    server.answers["/api/v1/namespaces/slurm-x/pods"] = (200, {"kind": "PodList", "items": [{"a": 1}]},
                                                         "application/json")
    doc = raw.request("GET", api_path("v1", "slurm-x", "pods"),
                      {"labelSelector": "slurmk8s.io/pool=cpu,x!=y", "limit": 500, "continue": None})
    assert doc == {"kind": "PodList", "items": [{"a": 1}]}
    req = server.requests[-1]
    assert req["query"] == {"labelSelector": "slurmk8s.io/pool=cpu,x!=y", "limit": "500"}  # None left out
    assert req["headers"]["authorization"] == "Bearer secret-token"
    assert req["headers"]["accept"] == "application/json"


def test_the_tier_lists_a_services_endpoint_slices_by_its_label(api):
    from provisioner.controltier.api import ClientTierApi

    server, _ = api
    path = "/apis/discovery.k8s.io/v1/namespaces/slurm-x/endpointslices"
    server.answers[path] = (200, {"kind": "EndpointSliceList", "items": [{"endpoints": []}]}, "application/json")
    tier = ClientTierApi(_client(server.url), timeout=(2.0, 5.0))
    assert tier.list_endpoint_slices("slurm-x", "slurmctld") == [{"endpoints": []}]
    req = server.requests[-1]
    assert (req["method"], req["query"]) == ("GET", {"labelSelector": "kubernetes.io/service-name=slurmctld"})


def test_the_tier_deletes_a_pod_with_its_uid_as_precondition(api, make_client):
    from provisioner.controltier.api import ClientTierApi

    server, _ = api
    path = "/api/v1/namespaces/slurm-x/pods/slurmctld-0"
    server.answers[path] = (200, {"kind": "Pod", "metadata": {"name": "slurmctld-0", "uid": "u-1"}}, "application/json")
    tier = ClientTierApi(make_client(server.url), timeout=(2.0, 5.0))
    assert tier.get_pod("slurm-x", "slurmctld-0")["metadata"]["uid"] == "u-1"
    tier.delete_pod("slurm-x", "slurmctld-0", "u-1")
    req = server.requests[-1]
    assert (req["method"], req["path"]) == ("DELETE", path)
    assert req["body"] == {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "u-1"}}


def test_the_tier_reads_and_records_its_state_on_its_config_map_by_name(api):
    """The state is the annotations of ConfigMap slurmk8s-tier-state, written by a merge patch of
    that one object (what the Role names); never a write of the slurmctld StatefulSet."""
    from provisioner.controltier.api import ClientTierApi

    server, _ = api
    path = "/api/v1/namespaces/slurm-x/configmaps/slurmk8s-tier-state"
    server.answers[path] = (200, {"kind": "ConfigMap", "metadata": {"name": "slurmk8s-tier-state",
                                                                    "annotations": {"slurmk8s.io/state": "asleep"}}},
                            "application/json")
    tier = ClientTierApi(_client(server.url), timeout=(2.0, 5.0))
    assert tier.get_state("slurm-x") == {"slurmk8s.io/state": "asleep"}
    tier.set_state("slurm-x", {"slurmk8s.io/state": "awake"})
    req = server.requests[-1]
    assert (req["method"], req["path"], req["headers"]["content-type"]) == ("PATCH", path, MERGE_PATCH)
    assert req["body"] == {"metadata": {"annotations": {"slurmk8s.io/state": "awake"}}}
    assert not any("statefulsets" in r["path"] for r in server.requests)


def test_a_merge_patch_is_sent_as_one(api):
    server, raw = api
    path = api_path("apps/v1", "slurm-x", "statefulsets", "slurmctld", "scale")
    server.answers[path] = (200, {"kind": "Scale", "spec": {"replicas": 1}}, "application/json")
    raw.request("PATCH", path, {"fieldManager": "slurmk8s-control-tier"}, {"spec": {"replicas": 1}}, MERGE_PATCH)
    req = server.requests[-1]
    assert (req["method"], req["headers"]["content-type"], req["body"]) == ("PATCH", MERGE_PATCH,
                                                                           {"spec": {"replicas": 1}})
    assert req["query"] == {"fieldManager": "slurmk8s-control-tier"}


def test_refusals_carry_the_status_words_and_an_api_that_is_not_there_is_retryable(api, make_client):
    server, raw = api
    with pytest.raises(ApiError) as err:
        raw.request("GET", api_path("v1", "slurm-x", "pods", "gone"))
    assert (err.value.status, err.value.reason) == (404, "NotFound") and "gone not found" in err.value.message
    assert not err.value.retryable
    server.answers["/api/v1/namespaces/slurm-x/pods/w"] = (502, b"<html>bad gateway</html>", "text/html")
    with pytest.raises(ApiError) as err:
        raw.request("DELETE", api_path("v1", "slurm-x", "pods", "w"), None, {"kind": "DeleteOptions"})
    assert err.value.status == 502 and "bad gateway" in err.value.message and err.value.retryable
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = RawClient(make_client(f"http://127.0.0.1:{port}"), timeout=(0.5, 0.5))
    with pytest.raises(ApiError) as err:
        gone.request("GET", "/api/v1/nodes")
    assert err.value.status == 0 and err.value.retryable


def test_an_answer_cut_short_is_an_api_error_that_may_be_retried(api):
    server, raw = api
    server.answers["/api/v1/namespaces/slurm-x/pods"] = "cut"
    with pytest.raises(ApiError) as err:
        raw.request("GET", api_path("v1", "slurm-x", "pods"))
    assert err.value.status == 0 and err.value.retryable, err.value


def test_a_watch_streams_events_across_chunks(api):
    server, raw = api
    path = api_path("v1", "slurm-x", "pods")
    server.answers[path] = [b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n{"type":"BOOK',
                            b'MARK","object":{"metadata":{"resourceVersion":"9"}}}\n']
    events = list(raw.watch_path(path, {"labelSelector": "x=y", "resourceVersion": "5", "allowWatchBookmarks": True,
                                        "timeoutSeconds": 60}, (2.0, 90.0)))
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert server.requests[-1]["query"] == {"labelSelector": "x=y", "resourceVersion": "5", "watch": "true",
                                            "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
    server.answers[path] = (410, {"kind": "Status", "reason": "Expired", "message": "too old resource version"},
                            "application/json")
    with pytest.raises(ApiError) as err:  # refused at the request, before any event
        raw.watch_path(path, {"resourceVersion": "1"}, (2.0, 90.0))
    assert err.value.status == 410


def test_a_log_is_text(api):
    server, raw = api
    path = api_path("v1", "slurm-x", "pods", "check", "log")
    server.answers[path] = (200, b"line one\nline two\n", "text/plain")
    assert raw.text(path, {"tailLines": 200}) == "line one\nline two\n"
    req = server.requests[-1]
    # the API server refuses (406) an Accept of text/plain here, and answers a log in plain text anyway
    assert req["query"] == {"tailLines": "200"} and req["headers"]["accept"] == "application/json"


def test_the_login_service_read_says_what_failed(api, make_client):
    from provisioner import usercli

    server, raw = api
    with pytest.raises(usercli.UserError, match="cannot read service/login in slurm-x: 404 NotFound .is the cluster"):
        usercli.login_endpoint(raw, "slurm-x", None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(usercli.UserError, match="slurm-x: the Kubernetes API did not answer"):
        usercli.login_endpoint(RawClient(make_client(f"http://127.0.0.1:{port}"), timeout=(0.5, 0.5)), "slurm-x", None)
    server.answers["/api/v1/namespaces/slurm-x/services/login"] = (
        200, {"spec": {"type": "NodePort", "ports": [{"nodePort": 30022}]}}, "application/json")
    server.answers["/api/v1/nodes"] = (200, {"items": [{"status": {"addresses": [
        {"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.7"}]}}]}, "application/json")
    assert usercli.login_endpoint(raw, "slurm-x", None) == ("10.0.0.7", 30022)
