"""The REST API's waking front (provisioner.controltier.restfront), over real sockets: a fake
slurmrestd behind it, the wake and slurmctld's port injected."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
from pathlib import Path

import pytest

from provisioner import manifests as m
from provisioner.config import load_spec, parse_spec
from provisioner.names import USER_FILES
from provisioner.manifests.rbac import control_tier_objects
from provisioner.controltier.decision import TierError
from provisioner.controltier.restfront import Front, KeyFile, TokenError, parse_headers, serve, verify_token
from provisioner.reconcile.idle import merge_activity

KEY = bytes(range(64))  # the cluster's JWT key in these tests


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(claims: dict | None = None, *, key: bytes = KEY, alg: str = "HS256", lifetime: int = 600) -> str:
    """A token as `scontrol token` makes it: HS256 over {"iat", "exp", "sun"} (`claims` replace them)."""
    now = int(time.time())
    body = {"iat": now, "exp": now + lifetime, "sun": "alice"} if claims is None else claims
    signed = f"{_b64(json.dumps({'alg': alg, 'typ': 'JWT'}).encode())}.{_b64(json.dumps(body).encode())}"
    sig = hmac.new(key, signed.encode(), hashlib.sha256).digest() if alg == "HS256" else b""
    return f"{signed}.{_b64(sig)}"


ALICE = jwt(lifetime=86400)  # made at collection: a long suite reaches this module many minutes later
TOKEN = f"X-SLURM-USER-NAME: alice\r\nX-SLURM-USER-TOKEN: {ALICE}\r\n"


class Tier:
    """The wake: `asleep` until a wake finishes (after `takes` seconds); counts the calls that woke."""

    def __init__(self, asleep: bool, takes: float = 0.0, error: str = "") -> None:
        self.asleep, self.takes, self.error = asleep, takes, error
        self.calls: list[str] = []
        self.woke = 0
        self._lock = threading.Lock()

    def wake(self, reason: str) -> bool:
        with self._lock:  # Tier.wake is called from one thread at a time by the front
            self.calls.append(reason)
            if self.error:
                raise TierError(self.error)
            if not self.asleep:
                return False
            time.sleep(self.takes)
            self.asleep = False
            self.woke += 1
            return True


async def _slurmrestd(seen: list[bytes]) -> tuple[asyncio.AbstractServer, int]:
    """A stand-in for slurmrestd: reads one request's head and answers 200 with a JSON body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        body = b'{"jobs": []}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _get(port: int, headers: str = TOKEN) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /slurm/v0.0.42/jobs HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, parse_headers(head + b"\r\n\r\n"), body


def _run(tier: Tier, scenario, *, controller_up=lambda: True, **kw):
    """Start a fake slurmrestd and the front before it, run `scenario(front, port, seen)`."""

    async def main():
        seen: list[bytes] = []
        upstream, up_port = await _slurmrestd(seen)
        front = Front(tier.wake, controller_up, ("127.0.0.1", up_port), lambda _l: None, jwt_key=lambda: KEY, **kw)
        server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await scenario(front, port, seen)
        finally:
            server.close()
            upstream.close()

    return asyncio.run(main())


def test_an_awake_tier_passes_requests_through_and_counts_them_as_activity():
    tier = Tier(asleep=False)

    async def scenario(front, port, seen):
        before = time.time()
        status, _h, body = await _get(port)
        assert status == 200 and json.loads(body) == {"jobs": []}
        assert f"X-SLURM-USER-TOKEN: {ALICE}".encode() in seen[0]  # the head reaches slurmrestd unchanged
        assert front.last_request is not None and front.last_request >= before
        assert front.activity()["last_request"] == front.last_request and front.activity()["sessions"] == 0
        await _get(port)  # within the awake cache: no second look at the tier

    _run(tier, scenario)
    assert tier.calls == ["a REST request by alice"] and tier.woke == 0


def test_a_request_to_an_asleep_tier_wakes_it_once_and_is_answered_when_slurmctld_is():
    tier = Tier(asleep=True, takes=0.3)
    up_at = time.monotonic() + 0.6  # slurmctld answers a little after its pod is Ready

    async def scenario(front, port, seen):
        answers = await asyncio.gather(*(_get(port) for _ in range(3)))
        assert [a[0] for a in answers] == [200, 200, 200] and len(seen) == 3
        assert time.monotonic() >= up_at

    _run(tier, scenario, controller_up=lambda: time.monotonic() >= up_at, hold=5)
    assert tier.woke == 1 and len(tier.calls) == 1  # the three requests shared one wake


def test_a_wake_longer_than_the_hold_is_answered_503_with_retry_after_and_goes_on():
    tier = Tier(asleep=True, takes=0.8)

    async def scenario(front, port, seen):
        status, headers, body = await _get(port)
        assert status == 503 and headers["retry-after"] == "5" and seen == []
        assert "waking up" in json.loads(body)["errors"][0]["error"]
        await asyncio.sleep(1.0)  # the wake finished meanwhile: the retry goes through
        assert (await _get(port))[0] == 200

    _run(tier, scenario, hold=0.2)
    assert tier.woke == 1


def test_a_request_without_a_token_neither_wakes_nor_counts():
    tier = Tier(asleep=True)

    async def scenario(front, port, seen):
        status, _h, _b = await _get(port, headers="")
        assert status == 200 and len(seen) == 1  # slurmrestd answers it (the real one: 401)
        assert front.last_request is None

    _run(tier, scenario)
    assert tier.calls == [] and tier.asleep


def test_a_failed_wake_is_a_503_naming_why_and_the_next_request_tries_again():
    tier = Tier(asleep=True, error="statefulset/slurmctld not ready after 300s")

    async def scenario(front, port, seen):
        status, _h, body = await _get(port)
        assert status == 503 and "could not be woken: statefulset/slurmctld not ready" in body.decode()
        await _get(port)

    _run(tier, scenario)
    assert len(tier.calls) == 2


def test_the_wake_is_recorded_for_the_tokens_user_and_an_odd_name_is_not_written_into_it():
    tier = Tier(asleep=False)
    odd = jwt({"exp": int(time.time()) + 60, "sun": "a\u00e9 b; rm"})

    async def scenario(front, port, seen):
        await _get(port, headers=f"X-SLURM-USER-NAME: mallory\r\nX-SLURM-USER-TOKEN: {ALICE}\r\n")
        front._awake_at = -1e9
        await _get(port, headers=f"X-SLURM-USER-TOKEN: {odd}\r\n")

    _run(tier, scenario)
    assert tier.calls == ["a REST request by alice", "a REST request by a user"]


def test_connections_over_the_cap_hear_503_at_once():
    tier = Tier(asleep=True, takes=0.5)

    async def scenario(front, port, seen):
        slow = asyncio.ensure_future(_get(port))
        await asyncio.sleep(0.1)
        status, _h, body = await _get(port)
        assert status == 503 and "too many connections" in body.decode()
        assert (await slow)[0] == 200

    _run(tier, scenario, max_connections=1, hold=5)


def test_slurmrestd_not_listening_is_a_503_not_a_reset():
    async def main():
        front = Front(lambda _r: False, lambda: True, ("127.0.0.1", 1), lambda _l: None, jwt_key=lambda: KEY)
        server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
        try:
            status, headers, body = await _get(server.sockets[0].getsockname()[1])
        finally:
            server.close()
        assert status == 503 and "slurmrestd is not answering yet" in body.decode() and headers["retry-after"]

    asyncio.run(main())


REFUSED = {
    "garbage": "X-SLURM-USER-TOKEN: garbage",
    "three garbage parts": "X-SLURM-USER-TOKEN: eyJhbGciOi.x.y",
    "expired": f"X-SLURM-USER-TOKEN: {jwt(lifetime=-5)}",
    "another key": f"X-SLURM-USER-TOKEN: {jwt(key=b'not the cluster key')}",
    "alg none": f"X-SLURM-USER-TOKEN: {jwt(alg='none')}",
    "no user": f"X-SLURM-USER-TOKEN: {jwt({'exp': int(time.time()) + 60})}",
    "not bearer": f"Authorization: Basic {ALICE}",
    "both headers": f"X-SLURM-USER-TOKEN: {ALICE}\r\nAuthorization: Bearer {ALICE}",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_token_is_answered_401_by_the_front_and_neither_wakes_nor_counts(case):
    header = REFUSED[case]
    tier = Tier(asleep=True)

    async def scenario(front, port, seen):
        status, headers, body = await _get(port, headers=f"X-SLURM-USER-NAME: alice\r\n{header}\r\n")
        assert status == 401 and seen == [], (case, status)  # never reaches slurmrestd
        assert "token is refused" in json.loads(body)["errors"][0]["error"], case
        assert front.last_request is None and "retry-after" not in headers, case

    _run(tier, scenario)
    assert tier.calls == [] and tier.asleep, case


def test_a_bearer_token_wakes_as_x_slurm_user_token_does():
    tier = Tier(asleep=True)

    async def scenario(front, port, seen):
        assert (await _get(port, headers=f"Authorization: Bearer {ALICE}\r\n"))[0] == 200
        assert front.last_request is not None

    _run(tier, scenario, hold=5)
    assert tier.woke == 1 and tier.calls == ["a REST request by alice"]


def test_verify_token_checks_alg_signature_expiry_and_user():
    now = time.time()
    assert verify_token(ALICE, KEY, now) == "alice"
    assert verify_token(jwt({"exp": int(now) + 5, "username": "bob"}), KEY, now) == "bob"
    for token, why in [(jwt(lifetime=-1), "expired"), (jwt(key=KEY + b"x"), "signature"),
                       (jwt(alg="none"), "not HS256"), (jwt(alg="HS512"), "not HS256"),
                       (jwt({"sun": "alice"}), "no expiry"), (jwt({"exp": True, "sun": "a"}), "no expiry"),
                       (jwt({"exp": int(now) + 5, "sun": ""}), "no user"), (ALICE + "x", "signature"),
                       ("a.b", "not a JWT"), ("\u00e9.\u00e9.\u00e9", "not a JWT")]:
        try:
            verify_token(token, KEY, now)
        except TokenError as err:
            assert why in str(err), (token, err)
        else:
            raise AssertionError(f"{token} was accepted, not refused for {why}")


def test_the_key_file_is_read_again_when_the_secret_changes(tmp_path):
    path = tmp_path / "jwt_hs256.key"
    path.write_bytes(KEY)
    key = KeyFile(str(path))
    assert key() == KEY
    new = tmp_path / "new"
    new.write_bytes(b"rotated key")
    new.replace(path)  # as the kubelet swaps a Secret volume's files
    assert key() == b"rotated key"


async def _silent(port: int) -> asyncio.StreamWriter:
    _r, writer = await asyncio.open_connection("127.0.0.1", port)
    return writer


def test_a_client_that_sends_no_head_loses_its_slot_after_the_read_timeout():
    tier = Tier(asleep=False)

    async def scenario(front, port, seen):
        silent = await _silent(port)  # connects, sends nothing
        await asyncio.sleep(0.1)
        assert (await _get(port))[0] == 503  # it holds the one slot
        await asyncio.sleep(0.5)
        assert (await _get(port))[0] == 200
        silent.close()

    _run(tier, scenario, max_connections=1, read_timeout=0.3)


def test_a_passed_through_connection_silent_both_ways_loses_its_slot():
    """slurmrestd keeps a connection open after its answer (keep-alive): a client that then says
    nothing, with a token or without one, does not hold its slot for ever."""

    async def keep_alive(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client (the front) closes

    async def main():
        upstream = await asyncio.start_server(keep_alive, "127.0.0.1", 0)
        front = Front(lambda _r: False, lambda: True, ("127.0.0.1", upstream.sockets[0].getsockname()[1]),
                      lambda _l: None, jwt_key=lambda: KEY, max_connections=1, read_timeout=0.3, idle_timeout=0.6)
        server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            for headers, idle in [("", 0.3), (TOKEN, 0.6)]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET /slurm/v0.0.42/jobs HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
                await writer.drain()
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401")
                await asyncio.sleep(0.1)
                assert front.in_flight == 1
                # freed after `idle` s; polled (a fixed 0.3 s margin failed under the unit tier's load)
                deadline = asyncio.get_running_loop().time() + idle + 5
                while front.in_flight and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                assert front.in_flight == 0, (headers, idle)
                assert await asyncio.wait_for(reader.read(), 1) == b""  # closed by the front
                writer.close()
        finally:
            server.close()
            upstream.close()

    asyncio.run(main())


def test_a_wake_whose_slurmctld_never_answers_ends_in_503_and_the_next_request_wakes_again():
    tier = Tier(asleep=True)

    async def scenario(front, port, seen):
        status, _h, body = await _get(port)
        assert status == 503 and "slurmctld did not answer within" in body.decode(), body
        # a new wake, not a wait for ever on the old one: the tier (up by now) lets it through
        assert (await _get(port))[0] == 200

    _run(tier, scenario, controller_up=lambda: False, controller_wait=0.3, hold=2)
    assert len(tier.calls) == 2


def test_serve_listens_on_the_given_port():
    assert asyncio.iscoroutinefunction(serve)


def test_merge_activity_adds_sessions_takes_the_latest_request_and_any_unknown_wins():
    login = (2, ("alice",), 100.0, "")
    rest = (0, (), 250.0, "")
    assert merge_activity(login, rest) == (2, ("alice",), 250.0, "")
    assert merge_activity(login, (0, (), None, "")) == (2, ("alice",), 100.0, "")
    unknown = merge_activity(login, (None, (), None, "http://slurmrestd.workers... did not answer"))
    assert unknown[0] is None and "did not answer" in unknown[3]


ROOT = Path(__file__).resolve().parents[1]


def _spec(**extra):
    data = load_spec(ROOT / "examples/local.yaml").model_dump(mode="json", exclude_defaults=True)
    return parse_spec({**data, "rest": {"enabled": True}, "users": [{"name": "alice", "uid": 2001}], **extra})


def _rest_pod(spec):
    return m.rest_deployment(spec, {name: "" for name in USER_FILES})["spec"]["template"]


def test_with_idle_teardown_the_front_owns_the_rest_port_and_alone_holds_the_token():
    pod = _rest_pod(_spec(elasticity={**_spec().elasticity.model_dump(mode="json", exclude_defaults=True), "idle_teardown": "30m"}))
    spec = pod["spec"]
    front, restd = spec["containers"]
    assert front["name"] == m.REST_FRONT and front["ports"][0]["containerPort"] == m.REST_PORT
    assert restd["args"][-1] == f"0.0.0.0:{m.REST_LOCAL_PORT}"
    assert spec["serviceAccountName"] == m.REST_FRONT and spec["automountServiceAccountToken"] is False
    assert [v["mountPath"] for v in front["volumeMounts"]] == [m.SA_TOKEN_DIR, m.JWT_DIR]
    assert all(v["mountPath"] not in (m.SA_TOKEN_DIR, m.JWT_DIR) for v in restd["volumeMounts"])
    # the front checks tokens with the cluster's JWT key: the Secret, read-only, its one file, at
    # the path the front is told
    key = next(v for v in spec["volumes"] if v["name"] == front["volumeMounts"][1]["name"])
    assert key["secret"]["secretName"] == m.JWT_SECRET and key["secret"]["items"] == [
        {"key": m.JWT_KEY_FILE, "path": m.JWT_KEY_FILE}]
    assert front["volumeMounts"][1]["readOnly"] is True
    assert front["command"][front["command"].index("--jwt-key") + 1] == f"{m.JWT_DIR}/{m.JWT_KEY_FILE}"
    assert (spec["hostname"], spec["subdomain"]) == (m.REST, m.WORKERS)
    assert pod["metadata"]["labels"][m.L_SUBDOMAIN] == m.WORKERS
    names = {(o["kind"], o["metadata"]["name"]) for o in control_tier_objects(_spec(elasticity={**_spec().elasticity.model_dump(mode="json", exclude_defaults=True), "idle_teardown": "30m"}))}
    assert {("ServiceAccount", m.REST_FRONT), ("Role", m.REST_FRONT), ("RoleBinding", m.REST_FRONT)} <= names


def test_without_idle_teardown_slurmrestd_owns_the_port_alone():
    spec = _rest_pod(_spec())["spec"]
    assert [c["name"] for c in spec["containers"]] == [m.REST]
    assert spec["containers"][0]["args"][-1] == f"0.0.0.0:{m.REST_PORT}" and "serviceAccountName" not in spec
