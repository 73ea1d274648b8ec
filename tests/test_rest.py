"""The REST API (spec `rest`, #18): slurmrestd's objects, the JWT key (generated, mounted only by
slurmctld and slurmdbd, never in a ConfigMap), the auth lines of slurm.conf and slurmdbd.conf, and
`slurmk8s token`'s argument handling."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import kubernetes_validate
import pytest
from factories import node
from typer.testing import CliRunner

from provisioner import manifests as m
from provisioner import usercli
from provisioner.config import load_spec, parse_spec
from provisioner.deploy.keys import JWT_KEY, JWT_KEY_BYTES, generate, secrets_from_values
from provisioner.errors import SpecError
from provisioner.generate import generate_for_kubernetes as _generate

NODES = [node("localk8s", {"kubernetes.io/os": "linux"}, cpu="2", memory="23Gi")]


def generate_for_kubernetes(spec, _nodes):
    return _generate(spec, NODES)

ROOT = Path(__file__).resolve().parents[1]
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJhbGljZSJ9.c2lnbmF0dXJl"


def _spec(**rest):
    data = load_spec(ROOT / "examples/local.yaml").model_dump(mode="json", exclude_defaults=True)
    data["rest"] = {"enabled": True, **rest}
    data["users"] = [{"name": "alice", "uid": 2001}, {"name": "bob", "uid": 2002}]
    return parse_spec(data)


@pytest.fixture(scope="module")
def secrets():
    return secrets_from_values(generate())


@pytest.fixture(scope="module")
def cluster(secrets):
    spec = _spec()
    gen = generate_for_kubernetes(spec, [])
    return spec, gen, m.all_objects(spec, gen.inventory, gen.files, secrets)


def _by(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _pod_specs(objs):
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]


# ---------------------------------------------------------------- spec


def test_rest_is_off_by_default_and_its_node_port_needs_a_node_port_service():
    spec = load_spec(ROOT / "examples/local.yaml")
    assert spec.rest.enabled is False and spec.rest.service_type == "ClusterIP"
    with pytest.raises(SpecError, match="rest: node_port is set but service_type is not .NodePort."):
        _spec(node_port=30820)
    with pytest.raises(SpecError, match="also login.node_port"):
        parse_spec({"name": "x", "pools": [{"name": "c"}], "login": {"service_type": "NodePort", "node_port": 30022},
                    "rest": {"service_type": "NodePort", "node_port": 30022}})
    for key in ("AuthAltTypes", "AuthAltParameters"):
        with pytest.raises(SpecError, match=f"may not set {key}"):
            parse_spec({"name": "x", "pools": [{"name": "c"}], "slurm": {"extra_conf": {key: "auth/jwt"}}})


def test_without_rest_nothing_changes():
    spec = load_spec(ROOT / "examples/local.yaml")
    gen = generate_for_kubernetes(spec, [])
    objs = m.all_objects(spec, gen.inventory, gen.files, secrets_from_values(generate()))
    assert not [o for o in objs if m.REST in o["metadata"]["name"] or o["metadata"]["name"] == m.JWT_SECRET]
    assert "AuthAlt" not in gen.files["slurm.conf"] and "AuthAlt" not in m.slurmdbd_conf(spec)
    text = json.dumps(objs)  # (not a bare "jwt": random key material may hold it)
    assert "auth/jwt" not in text and m.JWT_SECRET not in text and m.JWT_DIR not in text


# ---------------------------------------------------------------- Slurm's configuration


def test_slurm_conf_and_slurmdbd_conf_turn_on_jwt_with_the_key_path(cluster):
    spec, gen, _ = cluster
    conf = gen.files["slurm.conf"]
    assert "AuthType=auth/munge\n" in conf  # munge stays the cluster's own auth
    assert f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={m.JWT_KEY_PATH},max_token_lifespan=86400\n" in conf
    # slurmdbd checks tokens but never makes one (`scontrol token` asks slurmctld): the key only
    assert f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={m.JWT_KEY_PATH}\n" in m.slurmdbd_conf(spec)


def test_token_lifespan_is_capped_at_the_spec_s_max_24h_by_default():
    """Without a cap any user could `scontrol token lifespan=315360000` (a 10-year password)."""
    assert _spec().rest.max_token_lifespan == 86400
    spec = _spec(max_token_lifespan="2h")
    conf = generate_for_kubernetes(spec, []).files["slurm.conf"]
    assert f"AuthAltParameters=jwt_key={m.JWT_KEY_PATH},max_token_lifespan=7200\n" in conf
    for bad in (0, -5):
        with pytest.raises(SpecError, match="rest.max_token_lifespan"):
            _spec(max_token_lifespan=bad)


def test_slurmk8s_token_keeps_to_the_spec_s_cap():
    spec = _spec(max_token_lifespan="1h")
    assert usercli.token_argv(spec, "alice", 3600)[-1] == "lifespan=3600"
    with pytest.raises(usercli.UserError, match=r"--lifetime 3601s is out of range; use 1s to 3600s "
                                                r"\(rest.max_token_lifespan\)"):
        usercli.token_argv(spec, "alice", 3601)


def test_slurmrestd_reads_a_client_conf_without_nodes_or_secrets(cluster):
    spec, _, objs = cluster
    conf = _by(objs, "ConfigMap", m.REST_CONFIG)["data"]["slurm.conf"]
    lines = [ln for ln in conf.splitlines() if not ln.startswith("#")]
    assert lines == ["ClusterName=local", "SlurmctldHost=slurmctld-0", "SlurmctldPort=6817", "SlurmUser=slurm",
                     "AuthType=auth/munge", "AuthAltTypes=auth/jwt", "CredType=cred/munge",
                     "AccountingStorageType=accounting_storage/slurmdbd",
                     "AccountingStorageHost=slurmdbd.slurm-local.svc.cluster.local", "AccountingStoragePort=6819"]
    no_acct = parse_spec({**spec.model_dump(mode="json"), "accounting": {"enabled": False}})
    assert "AccountingStorage" not in m.rest_conf(no_acct)
    assert m.rest_openapi_plugins(no_acct) == "openapi/slurmctld"
    assert m.rest_openapi_plugins(spec) == "openapi/slurmctld,openapi/slurmdbd"


# ---------------------------------------------------------------- objects


@pytest.mark.parametrize("version", ["1.31.0", "1.34.0"])
def test_rest_objects_validate_against_the_kubernetes_schema(cluster, version):
    for obj in cluster[2]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_slurmrestd_runs_unprivileged_with_no_key_and_no_token(cluster):
    spec, _, objs = cluster
    dep = _by(objs, "Deployment", m.REST)
    assert dep["metadata"]["labels"][m.L_COMPONENT] == m.REST
    assert m.L_TIER not in dep["metadata"]["labels"], "not part of the control tier: it stays up while it sleeps"
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsUser"] == sc["runAsGroup"] == m.REST_UID != m.SLURM_UID and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": []} and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    # no Secret of any kind: its config, the cluster's users (for user names) and a memory emptyDir
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": m.REST_CONFIG, "defaultMode": 0o444}},
                              {"name": "users", "configMap": {"name": "slurm-users", "defaultMode": 0o444}},
                              {"name": "nss", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
    (init,) = pod["initContainers"]
    assert init["securityContext"] == sc and init["image"] == c["image"]
    assert "cat /etc/passwd /etc/slurmk8s/users/passwd >/run/slurmk8s-nss/passwd" in init["command"][-1]
    assert {(v["mountPath"], v.get("subPath")) for v in c["volumeMounts"]} == {
        ("/etc/slurm", None), ("/etc/passwd", "passwd"), ("/etc/group", "group")}
    assert c["env"] == [{"name": "SLURM_JWT", "value": "daemon"}]
    assert c["args"] == ["-a", "rest_auth/jwt", "-s", "openapi/slurmctld,openapi/slurmdbd", "0.0.0.0:6820"]
    assert c["image"] == "slurmk8s/slurmrestd:dev"
    # the namespace's Pod Security level is unchanged
    assert _by(objs, "Namespace", spec.namespace_name)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "baseline"


def test_service_type_like_the_login_service(secrets):
    assert m.rest_service(_spec())["spec"] == {
        "type": "ClusterIP", "selector": {m.L_CLUSTER: "local", m.L_COMPONENT: m.REST},
        "ports": [{"name": "http", "port": 6820, "targetPort": 6820, "protocol": "TCP"}]}
    svc = m.rest_service(_spec(service_type="NodePort", node_port=30820))["spec"]
    assert svc["type"] == "NodePort" and svc["ports"][0]["nodePort"] == 30820
    assert m.rest_service(_spec(service_type="LoadBalancer"))["spec"]["type"] == "LoadBalancer"


def test_network_policy_admits_the_rest_port_from_anywhere(cluster):
    pol = _by(cluster[2], "NetworkPolicy", "rest-http")
    assert pol["spec"] == {"podSelector": {"matchLabels": {m.L_CLUSTER: "local", m.L_COMPONENT: m.REST}},
                           "policyTypes": ["Ingress"], "ingress": [{"ports": [{"protocol": "TCP", "port": 6820}]}]}


# ---------------------------------------------------------------- the JWT key


def test_jwt_key_is_generated_once_per_stack():
    keys = generate()
    assert len(base64.b64decode(keys[JWT_KEY])) == JWT_KEY_BYTES >= 32
    assert generate(missing_only=keys) == {}
    assert JWT_KEY not in generate(missing_only={JWT_KEY: "kept"})
    assert secrets_from_values(keys).jwt_key_b64 == keys[JWT_KEY]


def test_jwt_key_reaches_slurmctld_and_slurmdbd_only(cluster):
    """slurmdbd mounts it; slurmctld's pod reads it from the API at its start (its Role names it)."""
    _, _, objs = cluster
    mounted = {}
    for name, pod in _pod_specs(objs):
        vols = {v["name"] for v in pod.get("volumes", []) if (v.get("secret") or {}).get("secretName") == m.JWT_SECRET}
        for c in pod["containers"] + pod.get("initContainers", []):
            if any(vm["name"] in vols for vm in c.get("volumeMounts", [])):
                mounted.setdefault(name, []).append(c["name"])
    assert mounted == {"slurmdbd": ["slurmdbd"]}
    pod = dict(_pod_specs(objs))["slurmdbd"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "jwt-key"]
    assert vol["secret"] == {"secretName": m.JWT_SECRET, "defaultMode": 0o400}
    (mount,) = [vm for c in pod["containers"] for vm in c["volumeMounts"] if vm["name"] == "jwt-key"]
    assert mount == {"name": "jwt-key", "mountPath": m.JWT_DIR, "readOnly": True}
    ctld = dict(_pod_specs(objs))[m.CONTROLLER]
    (files,) = [e["value"] for e in ctld["containers"][0]["env"] if e["name"] == "SLURMK8S_POD_FILES"]
    assert f"secret/{m.JWT_SECRET}:jwt" in files.split()
    assert [c["name"] for c in ctld["containers"] if m.JWT_SECRET in json.dumps(c)] == ["slurmctld"]
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == m.WORKER_ROLE]
    assert [r["resourceNames"] for r in role["rules"] if r["resources"] == ["secrets"]] == [
        [m.AUTH_SECRET, m.JWT_SECRET]]
    # nor do worker pods (their template) or the login pod
    spec, gen, _ = cluster
    for pool in spec.pools:
        assert m.JWT_SECRET not in json.dumps(m.worker_template_config_map(spec, pool))
    assert m.JWT_SECRET not in json.dumps(_by(objs, "Deployment", m.LOGIN))


def test_jwt_key_never_reaches_a_config_map_or_a_pod_spec(cluster, secrets):
    _, _, objs = cluster
    key = secrets.jwt_key_b64
    assert _by(objs, "Secret", m.JWT_SECRET)["data"] == {m.JWT_KEY_FILE: key}
    for obj in objs:
        if obj["kind"] != "Secret":
            assert key[:24] not in json.dumps(obj), obj["metadata"]["name"]


def test_rest_objects_need_the_key():
    spec = _spec()
    with pytest.raises(ValueError, match="jwt_key_b64"):
        m.jwt_objects(spec, m.ClusterSecrets("bXVuZ2U=", {}, None, None))


# ---------------------------------------------------------------- slurmk8s token


def test_token_argv_only_for_users_of_the_spec():
    spec = _spec()
    assert usercli.token_argv(spec, "alice", 3600) == ["scontrol", "token", "username=alice", "lifespan=3600"]
    with pytest.raises(usercli.UserError, match=r"user 'mallory' is not in the spec of cluster local \(users: alice, bob\)"):
        usercli.token_argv(spec, "mallory", 3600)
    with pytest.raises(usercli.UserError, match="out of range"):
        usercli.token_argv(spec, "alice", 0)
    with pytest.raises(usercli.UserError, match="out of range"):
        usercli.token_argv(spec, "alice", 24 * 3600 + 1)
    no_rest = load_spec(ROOT / "examples/local.yaml")
    with pytest.raises(usercli.UserError, match="rest.enabled is false"):
        usercli.token_argv(no_rest, no_rest.users[0].name, 60)


def test_parse_token_takes_the_one_jwt_line():
    assert usercli.parse_token(f"SLURM_JWT={JWT}\n") == JWT
    with pytest.raises(usercli.UserError, match="no SLURM_JWT"):
        usercli.parse_token("scontrol: error: something\n")


def test_request_token_waits_for_a_waking_controller_then_fails_clearly():
    calls = []

    def fake_exec(core, ns, pod, container, argv, timeout):
        calls.append((ns, pod, container, tuple(argv)))
        if len(calls) < 3:
            return 1, "", "slurm_request_token: Unable to contact slurm controller (connect failure)"
        return 0, f"SLURM_JWT={JWT}\n", ""

    argv = ["scontrol", "token", "username=alice", "lifespan=60"]
    assert usercli.request_token(None, "slurm-local", argv, 30, exec_fn=fake_exec, sleep=lambda s: None) == JWT
    assert calls[0] == ("slurm-local", "slurmctld-0", "slurmctld", tuple(argv)) and len(calls) == 3

    def refused(*_a):
        return 1, "", "slurm_request_token: Invalid user id\n"

    with pytest.raises(usercli.UserError, match=r"`scontrol token` in slurm-local/slurmctld-0 failed \(exit 1\): "
                                                 "slurm_request_token: Invalid user id"):
        usercli.request_token(None, "slurm-local", argv, 30, exec_fn=refused, sleep=lambda s: None)


def test_token_command_prints_only_the_token_line(tmp_path, monkeypatch):
    from provisioner.cli import app

    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(_spec().model_dump(mode="json")))
    seen = {}
    monkeypatch.setattr(usercli, "_api_client", lambda kubeconfig: "api")
    monkeypatch.setattr(usercli, "wake", lambda api, ns, why, timeout: seen.setdefault("wake", (ns, why)))

    def fake_request(core, ns, argv, timeout):
        seen["argv"] = argv
        return JWT

    monkeypatch.setattr(usercli, "request_token", fake_request)
    out = CliRunner().invoke(app, ["token", "--user", "alice", "--spec", str(path), "--lifetime", "30m"])
    assert out.exit_code == 0, out.output
    assert out.stdout == f"SLURM_JWT={JWT}\n"
    assert seen == {"wake": ("slurm-local", "slurmk8s token for alice"),
                    "argv": ["scontrol", "token", "username=alice", "lifespan=1800"]}

    out = CliRunner().invoke(app, ["token", "--user", "mallory", "--spec", str(path)])
    assert out.exit_code == 2 and "not in the spec" in out.output and "SLURM_JWT" not in out.output
    out = CliRunner().invoke(app, ["token", "--user", "alice", "--spec", str(path), "--lifetime", "2d"])
    assert out.exit_code == 2 and "--lifetime 172800s is out of range; use 1s to 86400s (rest.max_token_lifespan)" in out.output
    out = CliRunner().invoke(app, ["token", "--user", "alice", "--spec", str(path), "--lifetime", "soon"])
    assert out.exit_code == 2 and "--lifetime:" in out.output
