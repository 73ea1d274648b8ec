"""An in-memory Docker Engine (the few calls of provisioner.elastic.docker_backend's DockerClient),
with the engine's semantics for names (unique: 409 on create), references (a container is found by
its id or its name; 404 otherwise), forced removal and the label filter of the list. The real
engine is exercised by the integration tier (tests/integration/).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from provisioner.elastic.docker_backend import DockerError


@dataclass
class FakeDockerEngine:
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> container
    calls: list[tuple[str, str]] = field(default_factory=list)
    socket_path: str = "/fake/docker.sock"

    def _find(self, ref: str) -> dict[str, Any] | None:
        return self.containers.get(ref) or next((c for c in self.containers.values() if c["Name"] == ref), None)

    def run(self, name: str, labels: Mapping[str, str], state: str = "running", created: float | None = None) -> str:
        """A container as `docker run` would leave it (tests set the scene with it)."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        self.containers[cid] = {"Id": cid, "Name": name, "Labels": dict(labels), "State": state,
                                "Created": int(created if created is not None else time.time())}
        return cid

    def call(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        self.calls.append((method, path))
        path = path.removeprefix("/v1.41")
        parts = path.strip("/").split("/")
        if method == "POST" and path == "/containers/create":
            name = (query or {})["name"]
            if self._find(name):
                return 409, {"message": f'Conflict. The container name "/{name}" is already in use'}
            cid = self.run(name, (body or {}).get("Labels") or {}, state="created")
            return 201, {"Id": cid}
        if parts[0] != "containers":
            return 404, {"message": "page not found"}
        if method == "GET" and parts[1:] == ["json"]:
            want = dict(kv.split("=", 1) for kv in json.loads((query or {}).get("filters", "{}")).get("label", []))
            return 200, [{"Id": c["Id"], "Names": [f"/{c['Name']}"], "Labels": c["Labels"], "State": c["State"],
                          "Status": c["State"], "Created": c["Created"]}
                         for c in self.containers.values() if all(c["Labels"].get(k) == v for k, v in want.items())]
        found = self._find(parts[1])
        if found is None:
            return 404, {"message": f"No such container: {parts[1]}"}
        if method == "DELETE" and len(parts) == 2:
            del self.containers[found["Id"]]
            return 204, None
        if method == "POST" and parts[2:] == ["start"]:
            if found["State"] == "running":
                return 304, None
            found["State"] = "running"
            return 204, None
        if method == "GET" and parts[2:] == ["json"]:
            return 200, {"Id": found["Id"], "Name": f"/{found['Name']}", "Config": {"Labels": found["Labels"]},
                         "State": {"Status": found["State"]}}
        return 404, {"message": f"fake engine: no route {method} {path}"}

    def checked(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
                ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        status, data = self.call(method, path, body, query)
        if status not in ok:
            raise DockerError(status, data.get("message", "") if isinstance(data, dict) else str(data or ""))
        return data
