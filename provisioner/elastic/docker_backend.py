"""A node backend that runs each Slurm node as a slurmd container (test bed, no Kubernetes).

Talks to the Docker Engine HTTP API over its unix socket with the standard library only, so the
slurmctld container needs no docker CLI. A worker container is named like its Slurm node, has it
as hostname, joins the cluster's network and carries the cluster's label; everything else comes
from the environment of the slurmctld container (set by the test fixture):

  SLURMK8S_DOCKER_CLUSTER    label value identifying the cluster's containers (required)
  SLURMK8S_DOCKER_NETWORK    Docker network to join (required)
  SLURMK8S_DOCKER_IMAGE      slurmd image (default slurmk8s/slurmd:dev)
  SLURMK8S_DOCKER_MOUNTS     JSON list of {"type": "bind"|"volume", "source", "target", "read_only"}
  SLURMK8S_DOCKER_ENV        JSON object of extra environment for the workers
  SLURMK8S_CONTROLLER        host[:port] of slurmctld, passed on to the workers
  SLURMK8S_DOCKER_SOCKET     the engine's socket (default /var/run/docker.sock)
  SLURMK8S_DOCKER_OVERRIDES  path of a JSON file read on every call (tests inject failures with
                             it): {"images": {node: image}, "fail": {node: reason}}
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import SlurmK8sError
from ..inventory import SlurmNode
from ..kueue import PodGroup
from .. import settings
from .backend import BackendError, Worker, WorkerGone, WorkerReplaced

API = "/v1.41"
LABEL_CLUSTER = "org.slurmk8s.cluster"
LABEL_NODE = "org.slurmk8s.node"
LABEL_ROLE = "org.slurmk8s.role"

# Docker container state -> Worker.phase (the Kubernetes pod phases, plus Terminating).
PHASES = {
    # create() starts what it creates at once; a container left "created" lost its starter
    "created": "Failed",
    "restarting": "Pending",
    "running": "Running",
    "paused": "Running",
    "removing": "Terminating",
    "exited": "Failed",
    "dead": "Failed",
}


class DockerError(SlurmK8sError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"Docker API {status}: {message}")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class DockerClient:
    """The few Docker Engine API calls the backend needs; one connection per call (thread-safe)."""

    socket_path: str = settings.default(settings.DOCKER_SOCKET)
    timeout: float = 20.0

    def call(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        url = API + path + ("?" + urllib.parse.urlencode(query) if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            conn.request(method, url, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        data: Any = None
        if raw:
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                data = raw.decode(errors="replace")
        return resp.status, data

    def checked(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
                ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        status, data = self.call(method, path, body, query)
        if status not in ok:
            message = data.get("message", "") if isinstance(data, dict) else str(data or "")
            raise DockerError(status, message.strip())
        return data


@dataclass(frozen=True)
class Mount:
    type: str  # bind | volume
    source: str
    target: str
    read_only: bool = False

    def api(self) -> dict[str, Any]:
        return {"Type": self.type, "Source": self.source, "Target": self.target, "ReadOnly": self.read_only}


SECURITY_KEYS = {"CapDrop", "CapAdd", "SecurityOpt"}


def security_host_config(container_security: Mapping[str, Any], seccomp_profiles: Mapping[str, str] = {}) -> dict[str, Any]:
    """A pod container's securityContext as Docker HostConfig keys, for a worker container that is
    confined as its pod would be: capabilities dropped and added, no-new-privileges, and the seccomp
    profile (RuntimeDefault: Docker's default; Unconfined; Localhost: the profile's JSON text from
    `seccomp_profiles`, by its localhostProfile path)."""
    caps = container_security.get("capabilities", {})
    opts = []
    if container_security.get("allowPrivilegeEscalation") is False:
        opts.append("no-new-privileges")
    profile = container_security.get("seccompProfile", {"type": "RuntimeDefault"})
    if profile["type"] == "Unconfined":
        opts.append("seccomp=unconfined")
    elif profile["type"] == "Localhost":
        opts.append("seccomp=" + seccomp_profiles[profile["localhostProfile"]])
    return {"CapDrop": list(caps.get("drop", ())), "CapAdd": list(caps.get("add", ())), "SecurityOpt": opts}


@dataclass(frozen=True)
class DockerConfig:
    cluster: str
    network: str
    controller: str
    image: str = settings.default(settings.DOCKER_IMAGE)
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    overrides_path: str | None = None
    # the worker pod's securityContext as Docker HostConfig keys (CapDrop, CapAdd, SecurityOpt),
    # from SLURMK8S_DOCKER_SECURITY; empty: Docker's defaults (see security_host_config)
    security: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "DockerConfig":
        missing = settings.missing(env, settings.DOCKER_CLUSTER, settings.DOCKER_NETWORK, settings.CONTROLLER)
        if missing:
            raise BackendError("*", f"docker backend: {', '.join(missing)} not set on the slurmctld container")
        try:
            given = settings.Docker.from_env(env)
            mounts = tuple(Mount(m["type"], m["source"], m["target"], bool(m.get("read_only", False)))
                           for m in given.mounts)
            extra_env, security = given.env, given.security
            if not isinstance(security, dict) or set(security) - SECURITY_KEYS:
                raise TypeError(f"{settings.DOCKER_SECURITY} may hold only {sorted(SECURITY_KEYS)}")
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise BackendError("*", f"docker backend: bad SLURMK8S_DOCKER_MOUNTS / _ENV / _SECURITY: {err}") from None
        return cls(
            cluster=given.cluster,
            network=given.network,
            controller=given.controller,
            image=given.image,
            mounts=mounts,
            env={str(k): str(v) for k, v in extra_env.items()},
            overrides_path=given.overrides,
            security=security,
        )


def container_spec(config: DockerConfig, node: SlurmNode, image: str) -> dict[str, Any]:
    """The Engine API body that creates `node`'s slurmd container (pure)."""
    env = {**config.env, settings.CONTROLLER: config.controller, settings.NODENAME: node.name,
           **node.gres_env}
    return {
        "Image": image,
        "Hostname": node.name,
        "Env": [f"{k}={v}" for k, v in sorted(env.items())],
        "Labels": {LABEL_CLUSTER: config.cluster, LABEL_NODE: node.name, LABEL_ROLE: "slurmd"},
        "HostConfig": {
            "NetworkMode": config.network,
            "Mounts": [m.api() for m in config.mounts],
            # /dev/shm is a tmpfs (memory-backed) in every container; size it like the pods do
            "ShmSize": max(64, node.real_memory // 2) * 2**20,
            "RestartPolicy": {"Name": "no"},
            **config.security,
        },
        "NetworkingConfig": {"EndpointsConfig": {config.network: {"Aliases": [node.name]}}},
    }


@dataclass
class DockerBackend:
    config: DockerConfig
    client: DockerClient = field(default_factory=DockerClient)

    def _overrides(self) -> dict[str, Any]:
        if not self.config.overrides_path:
            return {}
        try:
            with open(self.config.overrides_path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as err:
            raise BackendError("*", f"cannot read {self.config.overrides_path}: {err}") from None
        return data if isinstance(data, dict) else {}

    def create(self, node: SlurmNode, group: PodGroup | None = None) -> None:  # no Kueue here: group unused
        overrides = self._overrides()
        injected = (overrides.get("fail") or {}).get(node.name)
        if injected:
            raise BackendError(node.name, str(injected))
        image = (overrides.get("images") or {}).get(node.name) or self.config.image
        try:
            status, data = self.client.call("POST", "/containers/create", container_spec(self.config, node, image),
                                            {"name": node.name})
            if status == 404:
                raise BackendError(node.name, f"image {image} not found on the Docker host; build it (images/build.sh)")
            if status == 409:
                self._adopt(node.name)
            elif status != 201:
                message = data.get("message", "") if isinstance(data, dict) else str(data)
                raise BackendError(node.name, f"container create failed ({status}): {message.strip()}",
                                   retryable=status >= 500)
            self._start(node.name)
        except DockerError as err:
            raise BackendError(node.name, f"container create failed: {err}", retryable=err.status >= 500) from None
        except (OSError, http.client.HTTPException) as err:
            raise BackendError(node.name, f"Docker engine unreachable at {self.client.socket_path}: {err}",
                               retryable=True) from None

    def _adopt(self, name: str) -> None:
        """A container with the node's name exists: it must be ours (same cluster label)."""
        info = self.client.checked("GET", f"/containers/{name}/json")
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_CLUSTER) != self.config.cluster:
            raise BackendError(name, f"container name {name} is taken by something outside cluster "
                                     f"{self.config.cluster}; remove it")

    def _start(self, name: str) -> None:
        try:
            self.client.checked("POST", f"/containers/{name}/start", ok=(204, 304))
        except DockerError as err:
            # do not leave a created-but-dead container behind
            self.client.call("DELETE", f"/containers/{name}", query={"force": "1", "v": "1"})
            raise BackendError(name, f"container start failed: {err.message}") from None

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        """By name, or (with `uid`) by container id: the engine has no preconditions, but an id names
        one container only, so a container that replaced it under the name is never removed.
        Always forced (`force` changes nothing): the engine removes a running container at once.
        `version` changes nothing either: a container has none (in this test bed a resume's
        adoption does not stop a delete judged before it, see :meth:`adopt`)."""
        try:
            status, data = self.client.call("DELETE", f"/containers/{uid or name}", query={"force": "1", "v": "1"})
            if status == 404 and uid:
                now, info = self.client.call("GET", f"/containers/{name}/json")
                if now == 200 and isinstance(info, dict) and info.get("Id") != uid:
                    raise WorkerReplaced(name, f"container {name} was replaced since (id {uid[:12]} is gone); "
                                               "the new container is left alone")
                raise WorkerGone(name, f"container {name} (id {uid[:12]}) is gone already; nothing removed")
        except (OSError, http.client.HTTPException) as err:
            raise BackendError(name, f"Docker engine unreachable at {self.client.socket_path}: {err}",
                               retryable=True) from None
        # 404: already gone; 409: removal already in progress
        if status not in (204, 404, 409):
            message = data.get("message", "") if isinstance(data, dict) else str(data)
            raise BackendError(name, f"container removal failed ({status}): {message.strip()}", retryable=True)

    def adopt(self, name: str, uid: str, version: str = "") -> bool:
        """Kept when the container `uid` is there and not finished. The engine cannot mark a
        container (labels are fixed at its create) nor refuse a removal on a condition, so in the
        Docker test bed a delete judged before the adoption still goes through."""
        try:
            status, info = self.client.call("GET", f"/containers/{uid or name}/json")
        except (OSError, http.client.HTTPException) as err:
            raise BackendError(name, f"Docker engine unreachable at {self.client.socket_path}: {err}",
                               retryable=True) from None
        state = ((info.get("State") or {}).get("Status") if isinstance(info, dict) else "") or ""
        return status == 200 and state in ("created", "running")

    def queues(self) -> dict[str, str]:
        return {}  # no Kueue on the Docker test bed

    def workload(self, group: str) -> None:
        return None

    def mark_busy(self, name: str, uid: str, busy: bool) -> bool:
        return True  # no autoscaler on the Docker test bed

    def taken_gone(self) -> dict[str, str]:
        return {}  # no other actor takes containers away here

    def list(self, names: Sequence[str] | None = None) -> dict[str, Worker]:
        filters = json.dumps({"label": [f"{LABEL_CLUSTER}={self.config.cluster}"]})
        wanted = None if names is None else set(names)  # Docker ANDs label filters: picked here
        try:
            items = self.client.checked("GET", "/containers/json", query={"all": "1", "filters": filters})
        except (OSError, http.client.HTTPException, DockerError) as err:
            raise BackendError("*", f"cannot list containers at {self.client.socket_path}: {err}",
                               retryable=True) from None
        workers = {}
        for item in items:
            name = (item.get("Labels") or {}).get(LABEL_NODE)
            if not name or (wanted is not None and name not in wanted):
                continue
            state = item.get("State", "")
            workers[name] = Worker(
                name=name,
                phase=PHASES.get(state, "Unknown"),
                reason=item.get("Status", "") if state in ("created", "exited", "dead") else "",
                created_at=float(item.get("Created", 0)) or None,
                uid=str(item.get("Id") or ""),
            )
        return workers


def from_env(env: Mapping[str, str]) -> DockerBackend:
    return DockerBackend(DockerConfig.from_env(env), DockerClient(settings.Docker.from_env(env).socket))
