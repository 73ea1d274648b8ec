"""slurmk8s-pod-files (provisioner.podfiles): the slurmctld pod reads its spec, users and keys from
the API at its start instead of mounting Secret and ConfigMap volumes. The reads go over real TLS
to a small local server that answers as the API server does; the real API server and RBAC are
exercised by every e2e deploy (the slurmctld pod starts through it) and e2e/test_e2e_security.py."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provisioner.podfiles import Api, Entry, PodFilesError, fetch, parse_entries

SPEC = {"spec.json": json.dumps({"name": "c", "pools": [{"n": 1.5}]}, indent=1) + "\n",
        "site.json": '{"cluster_domain": "cluster.local"}\n', "elastic.env": "SLURMK8S_BACKEND=kubernetes\n"}
USERS = {"passwd": "alice:x:2000:2000::/home/alice:/bin/bash\n", "group": "alice:x:2000:\n"}
KEY = b"\x00\x01munge-key\xff"
ENTRIES = "configmap/slurmk8s-spec:spec configmap/slurm-users:users secret/slurm-auth:secret"


class Server:
    """HTTPS on 127.0.0.1 with a self-signed certificate (openssl); records each request, answers
    from `answers` (path -> list of (status, body), the last one repeated)."""

    def __init__(self, tmp: Path) -> None:
        self.requests: list[tuple[str, str]] = []
        self.answers: dict[str, list[tuple[int, Any]]] = {}
        cert, key = tmp / "tls.crt", tmp / "tls.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Authorization", "")))
                answers = server.answers.get(self.path) or [(404, {"kind": "Status", "reason": "NotFound"})]
                status, body = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.http.socket = ctx.wrap_socket(self.http.socket, server_side=True)
        self.port = self.http.server_address[1]
        self.sa = tmp / "sa"
        self.sa.mkdir()
        (self.sa / "token").write_text("pod-token\n")
        (self.sa / "namespace").write_text("slurm-x\n")
        (self.sa / "ca.crt").write_bytes(cert.read_bytes())
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def path(self, plural: str, name: str) -> str:
        return f"/api/v1/namespaces/slurm-x/{plural}/{name}"

    def serve_cluster(self) -> None:
        self.answers[self.path("configmaps", "slurmk8s-spec")] = [(200, {"data": SPEC})]
        self.answers[self.path("configmaps", "slurm-users")] = [(200, {"data": USERS})]
        self.answers[self.path("secrets", "slurm-auth")] = [
            (200, {"data": {"munge.key": base64.b64encode(KEY).decode()}})]

    def api(self) -> Api:
        return Api({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)},
                   sa_dir=str(self.sa), timeout=2.0)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.http.shutdown()


def _fetch(server: Server, out: Path, wait: float = 5.0, **kw: Any) -> list[str]:
    logged: list[str] = []
    fetch(out, parse_entries(ENTRIES), server.api().get, wait, logged.append, retry=0.01, **kw)
    return logged


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_files_land_where_the_volumes_were_with_secret_modes(server, tmp_path):
    server.serve_cluster()
    out = tmp_path / "etc"
    logged = _fetch(server, out)
    assert (out / "spec/spec.json").read_text() == SPEC["spec.json"]
    assert (out / "users/passwd").read_text() == USERS["passwd"]
    assert (out / "secret/munge.key").read_bytes() == KEY
    # the programs Slurm starts read DIR/elastic.env; a restarted container finds .fetched and reads nothing
    assert (out / "elastic.env").read_text() == SPEC["elastic.env"] and (out / ".fetched").exists()
    assert _mode(out / "secret") == 0o700 and _mode(out / "secret/munge.key") == 0o400
    assert _mode(out / "spec") == 0o755 and _mode(out / "spec/spec.json") == 0o644
    assert not list(out.glob("**/.*.tmp"))
    # by path, with the pod's token; the key never in the log
    assert {p for p, _ in server.requests} == {server.path("configmaps", "slurmk8s-spec"),
                                                server.path("configmaps", "slurm-users"),
                                                server.path("secrets", "slurm-auth")}
    assert {a for _, a in server.requests} == {"Bearer pod-token"}
    assert "munge-key" not in "".join(logged) and "slurm-auth" in logged[-1]


@pytest.mark.parametrize("failures", [(503, 429), (403, 404)], ids=["api-busy", "role-or-object-not-yet-there"])
def test_failures_and_refusals_are_read_again_until_the_wait(server, tmp_path, failures):
    """An API under load, or a first `up` that starts the pod a moment before its Role or an object."""
    server.serve_cluster()
    path = server.path("secrets", "slurm-auth")
    server.answers[path] = [(code, {"kind": "Status"}) for code in failures] + server.answers[path]
    _fetch(server, tmp_path / "etc")
    assert (tmp_path / "etc/secret/munge.key").read_bytes() == KEY


def test_refusals_past_the_wait_say_what_to_fix_and_write_nothing(server, tmp_path):
    server.serve_cluster()
    server.answers[server.path("secrets", "slurm-auth")] = [(403, {"kind": "Status", "reason": "Forbidden"})]
    with pytest.raises(PodFilesError, match=r"could not read secret slurm-auth in 0s: secret slurm-x/slurm-auth: "
                                            r"forbidden.*Role slurmk8s-worker-pods"):
        _fetch(server, tmp_path / "etc", wait=0.05)
    assert not (tmp_path / "etc").exists()
    del server.answers[server.path("secrets", "slurm-auth")]
    with pytest.raises(PodFilesError, match=r"secret slurm-x/slurm-auth not found: `slurmk8s up`"):
        _fetch(server, tmp_path / "etc", wait=0.05)


def test_an_api_that_never_answers_ends_naming_what_is_missing(server, tmp_path):
    server.serve_cluster()
    server.answers[server.path("configmaps", "slurm-users")] = [(500, {"kind": "Status"})]
    with pytest.raises(PodFilesError, match=r"could not read configmap slurm-users in 0s: HTTP 500"):
        _fetch(server, tmp_path / "etc", wait=0.05)


def test_an_unreachable_api_is_named(tmp_path):
    sa = tmp_path / "sa"
    sa.mkdir()
    for name, text in (("token", "t"), ("namespace", "ns")):
        (sa / name).write_text(text)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    api = Api({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}, sa_dir=str(sa))
    with pytest.raises(PodFilesError, match=r"could not read configmap a in 0s: ConnectionRefusedError"):
        fetch(tmp_path / "etc", parse_entries("configmap/a:spec"), api.get, 0.05, print, retry=0.01)


def test_the_entries_and_the_environment_are_checked():
    assert parse_entries(ENTRIES)[2] == Entry("secret", "slurm-auth", "secret")
    for bad in ("", "configmap/a", "pvc/a:b", "secret/a:../x", "secret/:x"):
        with pytest.raises(PodFilesError):
            parse_entries(bad)
    with pytest.raises(PodFilesError, match="KUBERNETES_SERVICE_HOST"):
        Api({})
