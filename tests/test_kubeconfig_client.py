"""kubeapi.quick_client / KubeconfigClient: the kubeconfig shapes it takes (and leaves to the official
loader), TLS with the kubeconfig's CA, server name and client certificate against a local HTTPS
server (certificates made here with `cryptography`), failures as the official client reports them,
and the point of it: `slurmk8s submit`'s wake does not import the kubernetes package. The plain
requests are checked over both clients in tests/test_kubeapi_rest.py; the real API server, with the
local cluster's kubeconfig (CA data, client certificate data), by every `slurmk8s submit` of the
e2e tier (e2e/test_e2e_sleep.py)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from provisioner.kubeapi import ApiError, KubeconfigClient, RawClient, api_client, quick_client

ROOT = Path(__file__).resolve().parents[1]


def _pem(obj: Any) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    """A certificate authority that signs server and client certificates."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def issue(self, cn: str, sans: list[x509.GeneralName] | None = None) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for `cn`, with `sans` as subject alternative names."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _pem(builder.sign(self.key, hashes.SHA256())), _pem(key)


class TlsApi:
    """An HTTPS server that wants a client certificate of `client_ca` (or none when None) and answers
    every GET with the requester's certificate name and Authorization header."""

    def __init__(self, server_ca: Ca, sans: list[x509.GeneralName], client_ca: Ca | None, work: Path) -> None:
        cert, key = server_ca.issue("kube-apiserver", sans)
        (work / "server.pem").write_bytes(cert + key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(work / "server.pem")
        if client_ca is not None:
            (work / "client-ca.pem").write_bytes(_pem(client_ca.cert))
            context.load_verify_locations(work / "client-ca.pem")
            context.verify_mode = ssl.CERT_REQUIRED

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                peer = self.connection.getpeercert() or {}
                names = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
                data = json.dumps({"client": names, "authorization": self.headers.get("Authorization")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


LOCAL_IP = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]


def _kubeconfig(cluster: dict[str, Any], user: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": cluster}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", **(context or {})}}],
            "users": [{"name": "u", "user": user}]}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def pki(tmp_path):
    ca = Ca("cluster-ca")
    server = TlsApi(ca, LOCAL_IP, ca, tmp_path)
    cert, key = ca.issue("alice-admin")
    yield ca, server, cert, key
    server.server.shutdown()


def _get(client: Any) -> dict[str, Any]:
    return RawClient(client, timeout=(2.0, 5.0)).request("GET", "/api/v1/namespaces/x")


def _client_files() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("slurmk8s-client-")}


def test_the_kubeconfigs_ca_and_client_certificate_as_data(pki):
    ca, server, cert, key = pki
    before = _client_files()
    doc = _kubeconfig({"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": _b64(_pem(ca.cert))},
                      {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)})
    client = quick_client(yaml.safe_dump(doc))
    assert isinstance(client, KubeconfigClient)
    assert _get(client) == {"client": ["alice-admin"], "authorization": None}
    assert _client_files() == before  # the certificate and key written for the TLS library are gone


def test_files_relative_to_the_kubeconfig_and_a_token_file(pki, tmp_path):
    ca, server, cert, key = pki
    conf = tmp_path / "kube"
    conf.mkdir()
    (conf / "ca.crt").write_bytes(_pem(ca.cert))
    (conf / "admin.crt").write_bytes(cert)
    (conf / "admin.key").write_bytes(key)
    (conf / "token").write_text("file-token\n")
    doc = _kubeconfig({"server": f"https://127.0.0.1:{server.port}", "certificate-authority": "ca.crt"},
                      {"client-certificate": "admin.crt", "client-key": "admin.key", "tokenFile": "token"})
    (conf / "config").write_text(yaml.safe_dump(doc))
    client = quick_client(str(conf / "config"), env={})
    assert _get(client) == {"client": ["alice-admin"], "authorization": "Bearer file-token"}


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # insecure-skip-tls-verify, asked for
def test_a_server_certificate_of_another_ca_is_refused_as_both_clients_refuse_it(tmp_path):
    ca, other = Ca("cluster-ca"), Ca("someone-else")
    server = TlsApi(other, LOCAL_IP, None, tmp_path)
    try:
        doc = _kubeconfig({"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": _b64(_pem(ca.cert))},
                          {"token": "t"})
        seen = []
        for client in (quick_client(yaml.safe_dump(doc)), api_client(yaml.safe_dump(doc))):
            with pytest.raises(ApiError) as err:
                _get(client)
            seen.append((err.value.status, err.value.reason, err.value.retryable))
        assert seen == [(0, "TLSVerify", False)] * 2  # a setup problem, reported the same by both
        # insecure-skip-tls-verify: taken as written
        doc["clusters"][0]["cluster"] = {"server": f"https://127.0.0.1:{server.port}", "insecure-skip-tls-verify": True}
        assert _get(quick_client(yaml.safe_dump(doc))) == {"client": [], "authorization": "Bearer t"}
    finally:
        server.server.shutdown()


def test_the_kubeconfigs_ca_alone_is_trusted_when_it_names_one(tmp_path, monkeypatch):
    """Not the system's CAs too: a server with a certificate another (e.g. publicly trusted) CA
    signed is refused, as by the official client, before any token is sent. Without a CA in the
    kubeconfig, the system's are used (SSL_CERT_FILE stands in for them here)."""
    ca, public = Ca("cluster-ca"), Ca("a-public-ca")
    (tmp_path / "system.pem").write_bytes(_pem(public.cert))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "system.pem"))
    server = TlsApi(public, LOCAL_IP, None, tmp_path)
    try:
        cluster = {"server": f"https://127.0.0.1:{server.port}"}
        pinned = yaml.safe_dump(_kubeconfig({**cluster, "certificate-authority-data": _b64(_pem(ca.cert))},
                                            {"token": "t"}))
        for client in (quick_client(pinned), api_client(pinned)):
            with pytest.raises(ApiError, match="TLSVerify"):
                _get(client)
        assert _get(quick_client(yaml.safe_dump(_kubeconfig(cluster, {"token": "t"}))))["authorization"] == "Bearer t"
    finally:
        server.server.shutdown()


def test_tls_server_name_checks_the_certificate_against_that_name(tmp_path):
    ca = Ca("cluster-ca")
    server = TlsApi(ca, [x509.DNSName("api.cluster.test")], None, tmp_path)  # no IP in the certificate
    try:
        cluster = {"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": _b64(_pem(ca.cert))}
        with pytest.raises(ApiError, match="TLSVerify"):
            _get(quick_client(yaml.safe_dump(_kubeconfig(cluster, {"token": "t"}))))
        named = _kubeconfig({**cluster, "tls-server-name": "api.cluster.test"}, {"token": "t"})
        assert _get(quick_client(yaml.safe_dump(named)))["authorization"] == "Bearer t"
    finally:
        server.server.shutdown()


OTHER_SHAPES = {
    "exec plugin": ({}, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws-iam-authenticator"}}, {}),
    "auth provider": ({}, {"auth-provider": {"name": "oidc", "config": {}}}, {}),
    "basic auth": ({}, {"username": "u", "password": "p"}, {}),
    "impersonation": ({}, {"token": "t", "as": "someone"}, {}),
    "a proxy": ({"proxy-url": "http://proxy:3128"}, {"token": "t"}, {}),
    "a certificate without its key": ({}, {"client-certificate-data": _b64(b"x")}, {}),
    "a field it does not know": ({"some-future-field": 1}, {"token": "t"}, {}),
    "a context field it does not know": ({}, {"token": "t"}, {"some-future-field": 1}),
    "no https server": ({"server": "unix:///run/api.sock"}, {"token": "t"}, {}),
}


def test_a_name_given_twice_is_left_to_the_official_loader():
    doc = _kubeconfig({"server": "http://127.0.0.1:1"}, {"token": "t"})
    doc["users"].append({"name": "u", "user": {"token": "other"}})
    assert quick_client(yaml.safe_dump(doc)) is None


@pytest.mark.parametrize("shape", sorted(OTHER_SHAPES))
def test_other_shapes_are_left_to_the_official_loader(shape):
    cluster, user, context = OTHER_SHAPES[shape]
    doc = _kubeconfig({"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True, **cluster}, user, context)
    assert quick_client(yaml.safe_dump(doc)) is None


def test_it_reads_the_kubeconfig_api_client_would_read(tmp_path):
    doc = _kubeconfig({"server": "http://127.0.0.1:1"}, {"token": "t"})
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    no_sa = str(tmp_path / "no-sa")
    assert quick_client(None, env={"KUBECONFIG": str(path)}, sa_dir=no_sa) is not None
    assert quick_client(str(path), env={"KUBECONFIG": "/nonexistent"}, sa_dir=no_sa) is not None  # the argument wins
    # what api_client reads another way, or not from one file: left to it
    assert quick_client(None, env={"KUBECONFIG": f"{path}{os.pathsep}{path}"}, sa_dir=no_sa) is None  # merged list
    assert quick_client(None, env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, sa_dir=no_sa) is None  # in-cluster
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    assert quick_client(None, env={}, sa_dir=str(sa)) is None  # a mounted ServiceAccount, no KUBECONFIG
    for proxy in ("HTTPS_PROXY", "https_proxy", "Http_Proxy", "ALL_PROXY"):  # any case, as urllib reads them
        assert quick_client(None, env={"KUBECONFIG": str(path), proxy: "http://p:3128"}, sa_dir=no_sa) is None
    assert quick_client(None, env={"KUBECONFIG": str(path), "NO_PROXY": "localhost"}, sa_dir=no_sa) is not None
    assert quick_client(str(tmp_path / "missing"), env={}, sa_dir=no_sa) is None  # api_client says what is missing
    (tmp_path / "broken").write_text("current-context: nowhere\n")
    assert quick_client(str(tmp_path / "broken"), env={}, sa_dir=no_sa) is None


def test_the_cli_says_what_is_missing_when_no_client_can_be_made(tmp_path):
    from provisioner import usercli

    with pytest.raises(usercli.UserError, match="no such file; pass --kubeconfig or set KUBECONFIG"):
        usercli._api_client(str(tmp_path / "missing"), quick=True)


def test_the_submit_wake_never_imports_the_kubernetes_package(tmp_path):
    """The point of the quick client: `slurmk8s submit`'s way to its wake's first calls (the CLI,
    `_prepare`'s client, the wake in its thread, the login Service read) runs without importing the
    kubernetes package (or the manifest builders), against a real server."""
    from test_kubeapi_rest import Api

    api = Api()
    try:
        apps = "/apis/apps/v1/namespaces/slurm-x"
        api.answers[f"{apps}/statefulsets"] = (200, {"items": []}, "application/json")
        api.answers[f"{apps}/deployments"] = (200, {"items": []}, "application/json")
        api.answers["/api/v1/namespaces/slurm-x/services/login"] = (
            200, {"spec": {"type": "ClusterIP", "clusterIP": "10.0.0.5"}}, "application/json")
        conf = tmp_path / "config"
        conf.write_text(yaml.safe_dump(_kubeconfig({"server": api.url}, {"token": "t"})))
        code = (
            "import sys\n"
            "import provisioner.cli\n"
            "from provisioner import usercli\n"
            f"ssh, waking = usercli._prepare(None, 'slurm-x', {str(conf)!r}, 'alice', None, None, None, True,\n"
            "                               'test', 5.0, wait=False)\n"
            "waking.settle()\n"
            "print(ssh.host, ssh.port, type(waking.error).__name__, waking.error)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'jinja2')))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                             env={**os.environ, "KUBECONFIG": str(conf)}).stdout
        lines = out.splitlines()
        assert lines[-1] == "[]", out
        # the wake ran over the client (and found no tier there), the login Service was read
        assert lines[-2].startswith("10.0.0.5 22 UserError no statefulset/slurmctld"), out
        assert {r["path"] for r in api.requests} == {f"{apps}/statefulsets", f"{apps}/deployments",
                                                     "/api/v1/namespaces/slurm-x/services/login"}
    finally:
        api.server.shutdown()
