"""The one seam to the Kubernetes API: every caller in slurmk8s (the resume / suspend programs,
the reconcile loop, the login agent, the chart's in-cluster render, the CLI, the Pulumi program)
gets its client from :func:`api_client` and sees failures as :class:`ApiError`.

- :func:`api_client`: one loader. An explicit kubeconfig (a path, or its YAML content) wins; else
  in-cluster credentials when the ServiceAccount token is mounted (or ``KUBERNETES_SERVICE_HOST`` is
  set), else ``KUBECONFIG`` / ``~/.kube/config``. Slurm runs ResumeProgram with a reduced
  environment, so inside a pod the API is reached as ``kubernetes.default.svc`` when
  ``KUBERNETES_SERVICE_HOST`` is missing.
- :class:`RawClient`: requests by REST path (:func:`api_path`) for raw JSON, and watches as raw
  events, with request timeouts; refusals become :class:`ApiError` with the API's own words. The
  hot paths (the CLI's wake, the login agent, the resume / suspend programs and the reconcile
  loop) use it. :func:`raw_call`: a call of a generated API method the same way (the deploy code).
  Every answer is read one way (:func:`read_json`): a body cut short, by a lost connection or
  before the end a length said or, without one, where only its JSON shows it, is an ApiError
  (status 0, retryable) like any answer that did not come.
- :func:`quick_client`: for the CLI's wake, a :class:`KubeconfigClient` that RawClient sends over
  (urllib3, the kubeconfig's server, CA and credentials) without importing the kubernetes package;
  for the common kubeconfig shapes only (token or client certificate), None for the rest, which
  :func:`api_client` then loads.
- :func:`pod_exec`: a command in a pod's container (`kubectl exec`), as (exit code, stdout, stderr).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from .errors import SlurmK8sError
from .names import SA_DIR

MAX_REASON = 200


RETRYABLE_STATUS = frozenset({0, 429, 500, 502, 503, 504})


class ApiError(SlurmK8sError):
    """A failed API call: HTTP status (0 = no answer), the Status reason and message. Retryable for
    no answer, throttling and server errors; not for a refusal (4xx) or a TLS setup problem."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status} {reason}: {message}", reason=reason,
                         retryable=status in RETRYABLE_STATUS and reason != "TLSVerify")


class KubeConfigError(SlurmK8sError):
    """No usable credentials: the kubeconfig is missing or invalid and no ServiceAccount is mounted."""

    reason = "NoCredentials"


def api_error_from(exc: Exception) -> ApiError:
    """kubernetes.client ApiException / urllib3 errors -> ApiError, message from the Status body."""
    status = getattr(exc, "status", None)
    if status is None or status == 0:
        return ApiError(0, "Unreachable", str(exc).splitlines()[0][:MAX_REASON] if str(exc) else type(exc).__name__)
    return http_error(int(status), getattr(exc, "reason", "") or "", getattr(exc, "body", None))


def http_error(status: int, reason: str, body: Any) -> ApiError:
    """An answer outside 2xx -> ApiError; reason and message from its Status body when it has one."""
    message = ""
    if body:
        try:
            doc = json.loads(body)
        except (TypeError, ValueError):
            message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:MAX_REASON]
        else:
            if isinstance(doc, dict):
                message = str(doc.get("message", ""))
                reason = str(doc.get("reason") or reason)
    return ApiError(status, reason, message)


def transport_error(exc: Exception) -> ApiError:
    """A connection-level failure: TLS verification (a setup problem, not transient) or no answer."""
    text = str(exc)
    tls = re.search(r"certificate verify failed: ([^(')\]]+)", text)
    if tls:
        return ApiError(0, "TLSVerify", tls.group(1).strip())
    return ApiError(0, "Unreachable", f"{type(exc).__name__}: {text[:MAX_REASON]}")


@contextmanager
def api_errors() -> Iterator[None]:
    """Failures of a call through the client as ApiError: a refusal with the API's own words (its
    Status), a transport failure as 'Unreachable' (or 'TLSVerify', not retryable)."""
    from urllib3.exceptions import HTTPError

    try:
        yield
    except (HTTPError, OSError) as exc:
        raise transport_error(exc) from None
    except Exception as exc:
        # an ApiException comes only from the kubernetes package's client, which is then imported;
        # a KubeconfigClient's call never imports it (that import is what it saves)
        errors = sys.modules.get("kubernetes.client.exceptions")
        if errors is not None and isinstance(exc, errors.ApiException):
            raise api_error_from(exc) from None
        raise


def raw_call(fn: Callable[..., Any], timeout: tuple[float, float], *args: Any, **kwargs: Any) -> Any:
    """Call a kubernetes-client API method for its raw JSON (no model objects), with a request
    timeout; refusals become ApiError with the API's words, transport failures an 'Unreachable' one,
    and so does a body cut short (:func:`read_json`, the one way every call's answer is read)."""
    with api_errors():
        resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    return read_json(resp)


def decode(data: bytes) -> Any:
    """A 2xx answer's body (or a watch event's line) as JSON, {} when empty. A body that is not JSON
    is an ApiError with status 0 (no usable answer: retryable), as a connection lost while the body
    comes: where no length says where a body ends (a connection closed early, a proxy between), a
    body cut short is whole to the transport and only its JSON shows the cut."""
    if not data:
        return {}
    try:
        return json.loads(data)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ApiError(0, "Unreadable", f"the API's answer is not JSON (cut short?): {err}; "
                                        f"{len(data)} bytes, starting {bytes(data[:60])!r}") from None


def read_json(resp: Any) -> Any:
    """A 2xx response's body as JSON: read (a connection lost or timed out meanwhile is an ApiError,
    :func:`_read`) and decoded (:func:`decode`). Every call's answer goes this one way."""
    return decode(_read(resp))


def json_lines(resp: Any) -> Iterator[dict[str, Any]]:
    """A streamed response (urllib3's) as the JSON objects of its lines (a watch's events); a broken
    stream raises ApiError; the response is closed however the consumer stops."""
    try:
        with api_errors():
            rest = b""
            for chunk in resp.stream(1 << 16):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line.strip():
                        yield decode(line)
            if rest.strip():
                yield decode(rest)  # a last event cut short is an ApiError (decode)
    finally:
        resp.close()  # a consumer that stopped early leaves the rest unread: the connection is not reused
        resp.release_conn()


JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


def api_path(group_version: str, namespace: str, plural: str, name: str = "", sub: str = "") -> str:
    """The REST path of a namespaced resource: ("v1", "ns", "pods", "p") -> /api/v1/namespaces/ns/pods/p;
    a group's version ("apps/v1") goes under /apis; `sub` is a subresource (scale, log)."""
    from urllib.parse import quote

    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    parts = [root, "namespaces", quote(namespace, safe=""), plural] + [quote(x, safe="") for x in (name, sub) if x]
    return "/".join(parts)


class RawClient:
    """Base of the small API classes (pods, the control tier, the image check): requests by REST path
    over one ``ApiClient`` (its credentials, TLS and connection pool), or a :class:`KubeconfigClient`
    (the CLI's wake), raw JSON in and out, with the same request timeouts, refusals as :class:`ApiError`.

    By path, not through the generated ``CoreV1Api`` / ``AppsV1Api``: importing their modules costs
    0.2-0.5 s each on a 2-core machine (kubernetes 37 builds a pydantic validator for each of their
    hundreds of methods), paid before the first call by every command line and every starting pod
    (`slurmk8s submit`'s wake spent 0.6 s there before its first scale)."""

    def __init__(self, api_client: Any, timeout: tuple[float, float] = (5.0, 15.0)) -> None:
        self._client = api_client
        self._timeout = timeout

    def request(self, method: str, path: str, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = JSON, timeout: tuple[float, float] | None = None) -> Any:
        """`method` on `path` (:func:`api_path`) -> the answer's JSON ({} when empty)."""
        return read_json(self._send(method, path, query, body, content_type, timeout))

    def text(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        """GET of a plain-text answer (a container's log; the API server answers it in plain text,
        though it accepts only JSON, YAML or protobuf in the request's Accept)."""
        return _read(self._send("GET", path, query, None, JSON, None)).decode(errors="replace")

    def watch_path(self, path: str, query: Mapping[str, Any],
                   timeout: tuple[float, float]) -> Iterator[dict[str, Any]]:
        """A watch of the collection at `path` (``watch=true`` is added) as its raw events; the read
        timeout should outlast the watch's ``timeoutSeconds`` (it catches a silent connection)."""
        return json_lines(self._send("GET", path, {**query, "watch": True}, None, JSON, timeout))

    def _send(self, method: str, path: str, query: Mapping[str, Any] | None, body: Any, content_type: str,
              timeout: tuple[float, float] | None) -> Any:
        """The urllib3 response of a 2xx answer, unread; else ApiError."""
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        with api_errors():
            if isinstance(self._client, KubeconfigClient):
                resp = self._client.send(method, path, params, headers, body, timeout or self._timeout)
            else:
                req = self._client.param_serialize(method, path, query_params=params, header_params=headers,
                                                   body=body, auth_settings=["BearerToken"])
                resp = self._client.call_api(*req, _request_timeout=timeout or self._timeout).response
        if not 200 <= resp.status <= 299:
            raise http_error(resp.status, resp.reason or "", _read(resp))
        return resp


def _read(resp: Any) -> bytes:
    """A response's body; a connection lost or timed out while it comes is an ApiError too."""
    with api_errors():
        return resp.data


def _in_cluster(env: Mapping[str, str], sa_dir: str) -> bool:
    """No kubeconfig named: use the pod's ServiceAccount (KUBERNETES_SERVICE_HOST set, or the token
    mounted and KUBECONFIG not set). The one rule api_client and quick_client both follow."""
    return bool(env.get("KUBERNETES_SERVICE_HOST") or ((Path(sa_dir) / "token").exists() and not env.get("KUBECONFIG")))


def api_client(kubeconfig: str | None = None, env: Mapping[str, str] | None = None, sa_dir: str = SA_DIR) -> Any:
    """A kubernetes ``ApiClient``: from ``kubeconfig`` (a path, or the file's YAML content) when given;
    else in-cluster when ``KUBERNETES_SERVICE_HOST`` is set or the ServiceAccount token is mounted
    and ``KUBECONFIG`` is not set; else from ``KUBECONFIG`` / ``~/.kube/config``. ``env`` defaults
    to the process environment. Raises :class:`KubeConfigError` saying what is missing.

    Slurm runs ResumeProgram with a reduced environment, so KUBERNETES_SERVICE_HOST may be
    missing even inside the pod: then the API is reached as kubernetes.default.svc (which every
    pod resolves and the API server's certificate names).
    """
    import yaml
    from kubernetes import client, config
    from kubernetes.config.incluster_config import InClusterConfigLoader

    env = os.environ if env is None else env
    token = Path(sa_dir) / "token"
    try:
        if kubeconfig and "\n" in kubeconfig:
            return config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
        if kubeconfig:
            path = Path(kubeconfig).expanduser()
            if not path.exists():
                raise KubeConfigError(f"kubeconfig {kubeconfig}: no such file")
            return config.new_client_from_config(config_file=str(path))
        if _in_cluster(env, sa_dir):
            cfg = client.Configuration()
            InClusterConfigLoader(
                token_filename=str(token), cert_filename=str(Path(sa_dir) / "ca.crt"),
                environ={"KUBERNETES_SERVICE_HOST": env.get("KUBERNETES_SERVICE_HOST") or "kubernetes.default.svc",
                         "KUBERNETES_SERVICE_PORT": env.get("KUBERNETES_SERVICE_PORT") or "443"},
            ).load_and_set(cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=env.get("KUBECONFIG") or None)
    except config.ConfigException as err:
        raise KubeConfigError(f"no Kubernetes credentials (in-cluster or KUBECONFIG): {err}") from None


class KubeconfigClient:
    """What :class:`RawClient` needs of a client (its requests, with the kubeconfig's server, TLS and
    credentials), straight over urllib3, made by :func:`quick_client`.

    The kubernetes package takes 0.3-0.45 s to import on a 2-core machine (its config loader pulls
    in its dynamic client, jsonschema, pydantic and oauthlib), before `slurmk8s submit` could send the
    wake's first call; this client needs none of it."""

    def __init__(self, server: str, context: "ssl.SSLContext | None", headers: Mapping[str, str],
                 server_hostname: str | None = None) -> None:
        import urllib3

        self.server = server.rstrip("/")
        self.headers = dict(headers)
        tls: dict[str, Any] = {}
        if context is not None:
            verify = context.verify_mode != ssl.CERT_NONE
            tls = {"ssl_context": context, "cert_reqs": "CERT_REQUIRED" if verify else "CERT_NONE",
                   "assert_hostname": None if verify else False}
            if server_hostname:
                tls["server_hostname"] = server_hostname
        # a few connections: the wake's thread and the CLI's own reads go side by side
        self._pool = urllib3.PoolManager(maxsize=4, **tls)

    def send(self, method: str, path: str, query: Sequence[tuple[str, Any]], headers: Mapping[str, str],
             body: Any, timeout: float | tuple[float, float]) -> Any:
        """The unread urllib3 response (any status); the query's booleans as `true`/`false` and the
        body as JSON, as the kubernetes client sends them."""
        import urllib3
        from urllib.parse import quote, urlencode

        pairs = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query]
        url = self.server + path + (f"?{urlencode(pairs, quote_via=quote)}" if pairs else "")
        data = body if body is None or isinstance(body, (bytes, str)) else json.dumps(body)
        limit = (urllib3.Timeout(connect=timeout[0], read=timeout[1]) if isinstance(timeout, tuple)
                 else urllib3.Timeout(total=timeout))
        return self._pool.request(method, url, body=data, headers={**self.headers, **headers}, timeout=limit,
                                  preload_content=False)


# what quick_client understands of a kubeconfig; anything else (exec plugins, auth providers, basic
# auth, impersonation, a proxy) is left to the official loader
_QUICK_CLUSTER = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                  "tls-server-name", "extensions"}
_QUICK_USER = {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
               "client-key-data", "extensions"}
_QUICK_CONTEXT = {"cluster", "user", "namespace", "extensions"}


def quick_client(kubeconfig: str | None = None, env: Mapping[str, str] | None = None,
                 sa_dir: str = SA_DIR) -> KubeconfigClient | None:
    """A :class:`KubeconfigClient` from the kubeconfig :func:`api_client` would read (same arguments,
    same choice of source), when it is of the common shapes: a server with its CA (or
    insecure-skip-tls-verify), and a bearer token (or token file) or a client certificate. None
    for anything else (in-cluster credentials, a merged KUBECONFIG list, exec or auth-provider
    users, a proxy), and for a kubeconfig that is missing or incomplete: :func:`api_client` then
    does the work, with its own errors. A client certificate given as data is written to a private
    temporary file for the TLS library to read, and removed at once."""
    import base64

    import yaml

    env = os.environ if env is None else env
    if _proxied(env):
        return None
    base = Path.cwd()
    try:
        if kubeconfig and "\n" in kubeconfig:
            doc = yaml.safe_load(kubeconfig)
        else:
            if not kubeconfig:
                if _in_cluster(env, sa_dir):
                    return None
                kubeconfig = env.get("KUBECONFIG") or "~/.kube/config"
                if os.pathsep in kubeconfig:
                    return None
            path = Path(kubeconfig).expanduser()
            base = path.parent
            doc = yaml.safe_load(path.read_text())
        context = _named(doc, "contexts", "context")[doc["current-context"]]
        cluster = _named(doc, "clusters", "cluster")[context["cluster"]]
        user = _named(doc, "users", "user")[context["user"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, ValueError):
        return None
    if set(context) - _QUICK_CONTEXT or set(cluster) - _QUICK_CLUSTER or set(user) - _QUICK_USER:
        return None
    server = str(cluster.get("server") or "")
    headers = {"Accept": JSON, "User-Agent": "slurmk8s"}
    try:
        token = user.get("token") or (Path(base, user["tokenFile"]).read_text().strip() if user.get("tokenFile") else "")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if server.startswith("http://"):
            return KubeconfigClient(server, None, headers)
        if not server.startswith("https://"):
            return None
        # the kubeconfig's CA alone when it names one (as the official client: not the system's too,
        # which would let any publicly trusted certificate for the server's name pass)
        context_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cluster.get("insecure-skip-tls-verify"):
            context_tls.check_hostname = False
            context_tls.verify_mode = ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            context_tls.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif cluster.get("certificate-authority"):
            context_tls.load_verify_locations(cafile=str(Path(base, cluster["certificate-authority"])))
        else:
            context_tls.load_default_certs()
        cert = _pem(user, "client-certificate", base)
        key = _pem(user, "client-key", base)
        if cert and key:
            _load_client_cert(context_tls, cert, key)
        elif cert or key:
            return None
    except (OSError, ValueError, ssl.SSLError):
        return None
    return KubeconfigClient(server, context_tls, headers, cluster.get("tls-server-name") or None)


def _proxied(env: Mapping[str, str]) -> bool:
    """A proxy the official client would use: the environment's (any case), or the system's (macOS,
    Windows), as urllib.request.getproxies() finds them."""
    import urllib.request

    if env is os.environ:
        return any(scheme != "no" for scheme in urllib.request.getproxies())  # "no": NO_PROXY's list
    return any(k.lower().endswith("_proxy") and k.lower() != "no_proxy" and v for k, v in env.items())


def _named(doc: Mapping[str, Any], section: str, key: str) -> dict[str, Mapping[str, Any]]:
    """A kubeconfig section by name; a name given twice is an error for the official loader, so a
    ValueError here (left to it)."""
    entries = doc.get(section) or []
    out = {e["name"]: e.get(key) or {} for e in entries}
    if len(out) != len(entries):
        raise ValueError(f"a name twice in {section}")
    return out


def _pem(user: Mapping[str, Any], key: str, base: Path) -> bytes:
    import base64

    if user.get(f"{key}-data"):
        return base64.b64decode(user[f"{key}-data"])
    return Path(base, user[key]).read_bytes() if user.get(key) else b""


def _load_client_cert(context: "ssl.SSLContext", cert: bytes, key: bytes) -> None:
    """The TLS library reads a certificate chain from files only: both written to one private file
    (mode 0600), loaded, removed."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="slurmk8s-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(cert.rstrip(b"\n") + b"\n" + key)
        context.load_cert_chain(name)
    finally:
        os.unlink(name)


def pod_exec(api_client: Any, namespace: str, pod: str, container: str, argv: Sequence[str],
             timeout: float) -> tuple[int, str, str]:
    """Run argv in a pod's container (the exec subresource, as `kubectl exec`) over an ``ApiClient``:
    (exit code, stdout, stderr). A refused or failed exec is exit code 126 with the reason as stderr;
    124 when it runs past `timeout` seconds. By path, like :class:`RawClient`: the generated
    ``CoreV1Api`` took `slurmk8s status` 1.4 s to import before its first request."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream.ws_client import ERROR_CHANNEL, websocket_call
    from websocket import WebSocketException

    query = [("container", container), *(("command", arg) for arg in argv),
             ("stderr", "true"), ("stdin", "false"), ("stdout", "true"), ("tty", "false")]
    try:
        method, url, headers, _, _ = api_client.param_serialize(
            "GET", api_path("v1", namespace, "pods", pod, "exec"), query_params=query,
            header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
        resp = websocket_call(api_client.configuration, method, url, headers=headers, _preload_content=False)
    except ApiException as exc:
        reason = getattr(exc, "reason", "") or ""
        body = str(getattr(exc, "body", "") or "")[:300]
        return 126, "", f"exec refused ({getattr(exc, 'status', '?')} {reason}) {body}".strip()
    except (WebSocketException, OSError) as exc:
        return 126, "", f"exec failed: {type(exc).__name__}: {exc}"
    out: list[str] = []
    err: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while resp.is_open():
            if time.monotonic() > deadline:
                return 124, "".join(out), f"timed out after {timeout:.0f}s"
            resp.update(timeout=1)
            if resp.peek_stdout():
                out.append(resp.read_stdout())
            if resp.peek_stderr():
                err.append(resp.read_stderr())
        code, why = exec_status(resp.read_channel(ERROR_CHANNEL))
    finally:
        resp.close()
    return code, "".join(out), "".join(err) + (f"\n{why}" if why else "")


def exec_status(text: str) -> tuple[int, str]:
    """The exec API's status message (its error channel) -> (exit code, why when not a plain exit).

    Success -> 0; NonZeroExitCode -> the code; a command that could not start (no such binary, the
    container gone) -> 126 with the API's message; no status at all (connection lost) -> 125."""
    try:
        doc = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return 125, f"exec: unreadable status {text[:200]!r}"
    if not isinstance(doc, dict):
        return 125, "exec: the connection closed without an exit status"
    if doc.get("status") == "Success":
        return 0, ""
    for cause in (doc.get("details") or {}).get("causes") or ():
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"]), ""
    return 126, f"exec: {doc.get('reason', '')} {doc.get('message', '')}".strip()
