"""kubeapi.pod_exec and status.KubeReader by REST path, over real sockets to a small local server:
the exec subresource is a WebSocket (the channel protocol of `kubectl exec`: a channel byte, then
the data; channel 3 carries the exit status), the reads are plain GETs. The real API server and
kubelet are exercised by the e2e tier (`slurmk8s status` in e2e/test_e2e_observability.py, `slurmk8s
token` in e2e/test_e2e_rest.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from provisioner.kubeapi import pod_exec
from provisioner.status import KubeReader, StatusError
from test_kubeapi_rest import Api, _client

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class ExecServer:
    """Answers one exec upgrade: records the request line and headers, then sends `frames` (channel,
    bytes) as binary WebSocket frames and closes."""

    def __init__(self, frames: list[tuple[int, bytes]]) -> None:
        self.frames = frames
        self.request: dict[str, Any] = {}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
            method, target, _ = lines[0].split(" ")
            headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
            url = urlsplit(target)
            self.request = {"method": method, "path": url.path, "query": parse_qsl(url.query), "headers": headers}
            accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + WS_GUID).encode()).digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n")
            for channel, data in self.frames:
                payload = bytes([channel]) + data
                size = bytes([len(payload)]) if len(payload) < 126 else bytes([126]) + struct.pack("!H", len(payload))
                conn.sendall(bytes([0x82]) + size + payload)
            conn.sendall(bytes([0x88, 2]) + struct.pack("!H", 1000))
            try:
                conn.recv(64)  # the client's close frame
            except OSError:
                pass


def _exit_status(code: int) -> bytes:
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                       "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}).encode()


def test_pod_exec_runs_the_argv_in_the_container_by_path_and_returns_its_output_and_exit_code():
    server = ExecServer([(1, b"line one\n"), (2, b"a warning\n"), (1, b"line two\n"), (3, _exit_status(3))])
    code, out, err = pod_exec(_client(server.url), "slurm-x", "slurmctld-0", "slurmctld",
                              ["sh", "-c", "echo 'a b' && exit 3"], timeout=10)
    assert (code, out, err) == (3, "line one\nline two\n", "a warning\n")
    req = server.request
    assert req["method"] == "GET" and req["path"] == "/api/v1/namespaces/slurm-x/pods/slurmctld-0/exec"
    # every argument its own `command` parameter, in order, quoting kept
    assert [v for k, v in req["query"] if k == "command"] == ["sh", "-c", "echo 'a b' && exit 3"]
    assert {k: v for k, v in req["query"] if k != "command"} == {
        "container": "slurmctld", "stderr": "true", "stdin": "false", "stdout": "true", "tty": "false"}
    assert req["headers"]["authorization"] == "Bearer secret-token"
    assert "v4.channel.k8s.io" in req["headers"]["sec-websocket-protocol"]


def test_pod_exec_success_and_a_connection_that_ends_without_a_status():
    ok = ExecServer([(1, b"pong\n"), (3, _exit_status(0))])
    assert pod_exec(_client(ok.url), "ns", "p", "c", ["scontrol", "ping"], timeout=10) == (0, "pong\n", "")
    lost = ExecServer([(1, b"half")])
    code, out, err = pod_exec(_client(lost.url), "ns", "p", "c", ["true"], timeout=10)
    assert (code, out) == (125, "half") and "without an exit status" in err


def test_pod_exec_refused_upgrade_is_126_with_the_reason():
    server = Api()  # answers 404 with a Status: no WebSocket upgrade
    try:
        code, out, err = pod_exec(_client(server.url), "ns", "gone", "c", ["true"], timeout=10)
    finally:
        server.server.shutdown()
    assert code == 126 and out == "" and "404" in err


@pytest.fixture
def reader():
    server = Api()
    yield server, KubeReader(_client(server.url), request_timeout=(2.0, 5.0))
    server.server.shutdown()


def test_kube_reader_reads_by_path(reader):
    server, r = reader
    sts = {"kind": "StatefulSet", "metadata": {"name": "slurmctld"}, "spec": {"replicas": 1}}
    server.answers["/api/v1/namespaces/slurm-x"] = (200, {"kind": "Namespace"}, "application/json")
    server.answers["/apis/apps/v1/namespaces/slurm-x/statefulsets/slurmctld"] = (200, sts, "application/json")
    server.answers["/api/v1/namespaces/slurm-x/pods"] = (200, {"items": [{"metadata": {"name": "cpu-0"}}]},
                                                         "application/json")
    server.answers["/api/v1/namespaces/slurm-x/persistentvolumeclaims"] = (200, {"items": []}, "application/json")
    assert r.namespace_exists("slurm-x") and not r.namespace_exists("slurm-gone")
    assert r.statefulset("slurm-x", "slurmctld") == sts and r.statefulset("slurm-x", "other") is None
    assert r.pods("slurm-x", "app.kubernetes.io/component=worker") == [{"metadata": {"name": "cpu-0"}}]
    assert server.requests[-1]["query"] == {"labelSelector": "app.kubernetes.io/component=worker"}
    assert r.pvcs("slurm-x") == []


def test_kube_reader_says_what_refused_it(reader):
    server, r = reader
    forbidden = (403, {"kind": "Status", "reason": "Forbidden", "message": "namespaces is forbidden"}, "application/json")
    server.answers["/api/v1/namespaces/slurm-x"] = forbidden
    server.answers["/api/v1/namespaces/slurm-x/pods"] = forbidden
    assert r.namespace_exists("slurm-x")  # a user with rights in the namespace only: assumed to exist
    with pytest.raises(StatusError, match="listing pods: the Kubernetes API refused your kubeconfig's user "
                                          r"\(403 Forbidden\): namespaces is forbidden"):
        r.pods("slurm-x", "a=b")
    server.server.shutdown()
    with pytest.raises(StatusError, match="reading statefulset slurmctld: the Kubernetes API does not answer"):
        KubeReader(_client(server.url), request_timeout=(0.5, 0.5)).statefulset("slurm-x", "slurmctld")
