"""One cluster, one owner (issue #16 item 9): the decision over a namespace's owner record, the
annotation the program puts on the Namespace, and the commands: a refused `up` / `preview` / `down`
applies and deletes nothing (the stack is never run), `up` refreshes first (objects deleted or changed
behind its back are restored), and --take-over keeps the cluster's running keys."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from provisioner.config import load_spec
from provisioner.deploy import owner as ow
from provisioner.deploy.owner import Found, decide

ROOT = Path(__file__).resolve().parents[1]
NS = "slurm-local"
MINE = "a1b2c3d4e5f60718"
ME = "bob@ci-runner:/tmp/bench/state (stack local)"
THEIRS = "99aa88bb77cc66dd"
THEM = "alice@laptop:/home/alice/.slurmk8s/state (stack local)"


def namespace(owner: str | None = None, description: str | None = None) -> dict[str, Any]:
    ann = ow.owner_annotations(owner, description)
    meta = {"name": NS, "labels": {"slurmk8s.io/cluster": "local"}}
    return {"metadata": {**meta, "annotations": ann} if ann else meta}


RUNNING = ("StatefulSet/slurmctld", "Deployment/login", "Deployment/slurmdbd", "StatefulSet/mariadb", "Pod/cpu-local-0")


# ---------------------------------------------------------------- the decision, case by case


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_no_namespace_proceeds_silently(op):
    assert decide(op, NS, Found(None), mine=MINE, me=ME, stack_holds_it=False) == ow.Decision(True)


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_same_owner_proceeds_silently(op):
    found = Found(namespace(MINE, ME), RUNNING)
    assert decide(op, NS, found, mine=MINE, me=ME, stack_holds_it=True) == ow.Decision(True)


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_another_owner_is_refused_naming_it_and_the_fix(op):
    found = Found(namespace(THEIRS, THEM), RUNNING)
    d = decide(op, NS, found, mine=MINE, me=ME, stack_holds_it=False)
    assert not d.proceed and not d.took_over
    assert f"namespace {NS} belongs to another slurmk8s stack: {THEM}" in d.message
    assert "nothing was changed" in d.message and "Fix: " in d.message
    assert f"`slurmk8s {op}`" in d.message and f"({ME})" in d.message
    assert "`--state /home/alice/.slurmk8s/state --stack local` on laptop" in d.message
    assert "--take-over" in d.message
    if op == "down":
        assert "would delete that cluster's worker pods" in d.message
    if op == "preview":
        assert "--take-over on `slurmk8s up`" in d.message


def test_another_owner_even_when_this_stack_once_held_the_namespace():
    """Stack A's state still lists the namespace, but B took it over: A's `up` is refused."""
    d = decide("up", NS, Found(namespace(THEIRS, THEM), RUNNING), mine=MINE, me=ME, stack_holds_it=True)
    assert not d.proceed


def test_an_owner_without_a_description_is_named_by_its_id():
    d = decide("up", NS, Found(namespace(THEIRS), RUNNING), mine=MINE, me=ME, stack_holds_it=False)
    assert not d.proceed and f"owner id {THEIRS}" in d.message and "its --state directory" in d.message


def test_a_stack_without_an_owner_id_is_not_the_owner():
    """`down` reads the id only; a stack that never recorded one does not own an annotated namespace."""
    d = decide("down", NS, Found(namespace(THEIRS, THEM), RUNNING), mine=None, me=ME, stack_holds_it=True)
    assert not d.proceed


@pytest.mark.parametrize("op", ["up", "down"])
def test_take_over_proceeds_and_says_so(op):
    d = decide(op, NS, Found(namespace(THEIRS, THEM), RUNNING), mine=MINE, me=ME, stack_holds_it=False,
               take_over=True)
    assert d.proceed and d.took_over
    assert d.message.startswith(f"--take-over: namespace {NS} was owned by {THEM}")


@pytest.mark.parametrize("op,says", [("up", "records"), ("preview", "will record")])
def test_no_record_but_this_stacks_state_holds_it_records_the_owner(op, says):
    """Clusters made before owners were recorded: their own stack goes on, and `up` records itself."""
    d = decide(op, NS, Found(namespace(), RUNNING), mine=MINE, me=ME, stack_holds_it=True)
    assert d.proceed and not d.took_over
    assert f"namespace {NS} has no owner record" in d.message and f"`slurmk8s up` {says} this stack ({ME})" in d.message


def test_no_record_but_this_stacks_state_holds_it_down_proceeds():
    assert decide("down", NS, Found(namespace(), RUNNING), mine=None, me=ME, stack_holds_it=True).proceed


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_no_record_and_someone_elses_workloads_are_refused(op):
    d = decide(op, NS, Found(namespace(), RUNNING), mine=MINE, me=ME, stack_holds_it=False)
    assert not d.proceed
    assert "made without an owner record" in d.message and "nothing was changed" in d.message
    assert "StatefulSet/slurmctld, Deployment/login, Deployment/slurmdbd, StatefulSet/mariadb and 1 more" in d.message
    assert "Fix: " in d.message and "--take-over" in d.message


def test_no_record_and_workloads_with_take_over_proceeds():
    d = decide("up", NS, Found(namespace(), RUNNING), mine=MINE, me=ME, stack_holds_it=False, take_over=True)
    assert d.proceed and d.took_over and "made without an owner record" in d.message


@pytest.mark.parametrize("take_over", [False, True])
def test_a_helm_release_is_refused_with_helm_as_the_fix(take_over):
    d = decide("up", NS, Found(namespace(), RUNNING, helm_release="research"), mine=MINE, me=ME,
               stack_holds_it=False, take_over=take_over)
    assert not d.proceed
    assert "Helm release 'research'" in d.message and "nothing was changed" in d.message
    assert f"helm upgrade research charts/slurmk8s -n {NS}" in d.message and "--take-over does not apply" in d.message


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_empty_namespace_without_record_proceeds(op):
    """e.g. made by hand, or left with its volumes by a cluster of old: nothing runs in it."""
    assert decide(op, NS, Found(namespace(), ()), mine=MINE, me=ME, stack_holds_it=False) == ow.Decision(True)


def test_found_from_names_workloads_and_the_helm_release():
    helm = {"annotations": {ow.HELM_RELEASE_ANNOTATION: "research"}}
    objs = [("StatefulSet", {"metadata": {"name": "slurmctld", **helm}}),
            ("Deployment", {"metadata": {"name": "login"}}),
            ("Pod", {"metadata": {"name": "slurmctld-0", "ownerReferences": [{"kind": "StatefulSet"}]}}),
            ("Pod", {"metadata": {"name": "cpu-local-1", "deletionTimestamp": "2027-01-01T00:00:00Z"}}),
            ("Pod", {"metadata": {"name": "cpu-local-0"}}),
            # a worker pod names the slurmctld StatefulSet as its owner (garbage collection) but is
            # not one of its replicas: it still counts
            ("Pod", {"metadata": {"name": "cpu-local-2", "labels": {"app.kubernetes.io/component": "worker"},
                                  "ownerReferences": [{"kind": "StatefulSet", "name": "slurmctld"}]}})]
    found = ow.found_from(namespace(), objs)
    assert found.workloads == ("StatefulSet/slurmctld", "Deployment/login", "Pod/cpu-local-0", "Pod/cpu-local-2")
    assert found.helm_release == "research"
    assert ow.found_from(namespace(), []).workloads == ()


def test_recorded_owner_and_description():
    assert ow.recorded_owner(None) == (None, "")
    assert ow.recorded_owner(namespace()) == (None, "")
    assert ow.recorded_owner(namespace(THEIRS, THEM)) == (THEIRS, THEM)
    assert ow.owner_annotations(None, THEM) == {}
    desc = ow.describe(Path("/tmp/s"), "local")
    assert desc.endswith(":/tmp/s (stack local)") and "@" in desc


# ---------------------------------------------------------------- the program puts the record on the Namespace


def _keys_config() -> tuple[dict[str, str], list[str]]:
    from provisioner.deploy.keys import generate

    keys = generate()
    return {f"slurmk8s:{k}": v.rstrip("\n") for k, v in keys.items()}, [f"slurmk8s:{k}" for k in keys]


def _nodes() -> list[dict]:
    from factories import node

    return [node("localk8s", {"kubernetes.io/os": "linux"}, cpu="2", memory="23Gi")]


def test_program_annotates_the_namespace_with_the_owner(pulumi_run):
    from provisioner.deploy import program as prog

    spec = load_spec(ROOT / "examples/local.yaml")
    cfg, secret = _keys_config()
    run = pulumi_run.run(prog.inline_program(spec, _nodes()),
                         {**cfg, "slurmk8s:owner": MINE, "slurmk8s:ownerDescription": ME}, secret)
    (ns,) = run.of_type(":Namespace")
    assert ns.inputs["metadata"]["annotations"] == {ow.OWNER_ANNOTATION: MINE, ow.DESCRIPTION_ANNOTATION: ME}
    others = [r.name for r in run.kubernetes() if not r.type.endswith(":Namespace")
              and ow.OWNER_ANNOTATION in (r.inputs["metadata"].get("annotations") or {})]
    assert others == [], "the record is on the Namespace only"
    # with --no-wait both the record and skipAwait
    run = pulumi_run.run(prog.inline_program(spec, _nodes()),
                         {**cfg, "slurmk8s:owner": MINE, "slurmk8s:wait": "false"}, secret)
    (ns,) = run.of_type(":Namespace")
    assert ns.inputs["metadata"]["annotations"] == {ow.OWNER_ANNOTATION: MINE, prog.SKIP_AWAIT: "true"}


def test_program_without_owner_config_records_none(pulumi_run):
    """A plain `pulumi up` in stacks/ has no owner config: no annotation, as before."""
    from provisioner.deploy import program as prog

    cfg, secret = _keys_config()
    run = pulumi_run.run(prog.inline_program(load_spec(ROOT / "examples/local.yaml"), _nodes()), cfg, secret)
    (ns,) = run.of_type(":Namespace")
    assert "annotations" not in ns.inputs["metadata"]


# ---------------------------------------------------------------- the commands


@dataclass
class Value:
    value: str
    secret: bool = False


@dataclass
class FakeDeployment:
    deployment: dict[str, Any]


class FakeStack:
    """What the commands call on a pulumi.automation.Stack; records every call."""

    name = "local"

    def __init__(self, resources: list[dict[str, Any]] | None = None) -> None:
        self.config: dict[str, Any] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.resources = resources or []

    def get_all_config(self) -> dict[str, Any]:
        return dict(self.config)

    def set_all_config(self, values: dict[str, Any]) -> None:
        self.config.update(values)

    def export_stack(self) -> FakeDeployment:
        return FakeDeployment({"resources": self.resources})

    def _op(self, name: str, **kw: Any) -> Any:
        self.calls.append((name, kw))

        class Res:
            summary = None
            outputs: dict[str, Any] = {}
            change_summary: dict[str, int] = {}

        return Res()

    def up(self, **kw: Any) -> Any:
        return self._op("up", **kw)

    def preview(self, **kw: Any) -> Any:
        return self._op("preview", **kw)

    def destroy(self, **kw: Any) -> Any:
        return self._op("destroy", **kw)

    def refresh(self, **kw: Any) -> Any:
        return self._op("refresh", **kw)


@dataclass
class Cli:
    stack: FakeStack
    found: Found
    calls: list[str] = field(default_factory=list)
    secrets_set: dict[str, str] = field(default_factory=dict)
    claims: list[Any] = field(default_factory=list)  # owner.claim's writes

    def invoke(self, *args: str) -> Any:
        from provisioner.cli import app

        return CliRunner().invoke(app, [*args, "--spec", str(ROOT / "examples/local.yaml")])


@pytest.fixture
def cli(monkeypatch, tmp_path) -> Cli:
    """The deploy commands over a fake stack and a fake namespace reader (no Pulumi engine, no cluster)."""
    from provisioner.deploy import automation as a

    state = Cli(FakeStack(), Found(None))

    def open_session(spec_path, **kw):
        return a.Session(spec=load_spec(spec_path), stack=state.stack, state=tmp_path / "state", tool=None, env={},
                         kubeconfig=None)

    def record(name, result=None):
        def fn(*args, **kw):
            state.calls.append(name)
            return result
        return fn

    monkeypatch.setattr(a, "open_session", open_session)
    monkeypatch.setattr(a, "preflight", record("preflight"))
    monkeypatch.setattr(a, "ensure_stack_config", record("ensure_stack_config", []))
    monkeypatch.setattr(a, "delete_leftovers", record("delete_leftovers"))
    monkeypatch.setattr(a, "describe_versions", lambda session: "versions")
    # the engine's process handling and the watch of `up` are tests/test_engine.py's and test_watch.py's
    monkeypatch.setattr(a, "recover", lambda *args, **kw: None)
    monkeypatch.setattr(a, "diagnose_now", lambda *args, **kw: None)
    monkeypatch.setattr(a, "watcher_for", lambda *args, **kw: None)
    monkeypatch.setattr(a, "wait_rollouts", record("wait_rollouts", 0.0))  # tests/test_rollout_wait.py's
    monkeypatch.setattr(a, "wait_login_reaches_controller", record("wait_login_reaches_controller", 0.0))

    def run(session, op, fn, started, echo, watcher=None):
        session.timings[op] = 0.0
        return fn()

    monkeypatch.setattr(a, "_run", run)
    monkeypatch.setattr(a, "set_secret_config", lambda session, key, value: state.secrets_set.__setitem__(key, value))
    monkeypatch.setattr(ow, "read", lambda kubeconfig, name: state.found)
    monkeypatch.setattr(ow, "claim", lambda kubeconfig, wanted: state.claims.append(wanted))
    return state


def _ran(cli: Cli) -> list[str]:
    return [name for name, _ in cli.stack.calls] + cli.calls


@pytest.mark.parametrize("op", ["up", "preview", "down"])
def test_a_refused_command_applies_and_deletes_nothing(cli, op):
    cli.found = Found(namespace(THEIRS, THEM), RUNNING)
    result = cli.invoke(op)
    assert result.exit_code != 0, result.output
    assert f"error: namespace {NS} belongs to another slurmk8s stack: {THEM}" in result.output
    assert "nothing was changed" in result.output
    assert _ran(cli) == [], "refused before preflight, keys, the stack or the cleanup of leftovers ran"


def test_up_as_the_owner_refreshes_first(cli):
    result = cli.invoke("up")
    assert result.exit_code == 0, result.output
    assert _ran(cli) == ["up", "preflight", "ensure_stack_config", "wait_rollouts", "wait_login_reaches_controller"]
    ((_, kw),) = cli.stack.calls
    assert kw["refresh"] is True, "objects deleted or changed behind the stack's back are seen and restored"
    # the stack got an owner id (kept) and a description (the program annotates the Namespace with both)
    mine = cli.stack.config["slurmk8s:owner"].value
    assert len(mine) == 16 and cli.stack.config["slurmk8s:ownerDescription"].value.endswith("(stack local)")
    cli.found = Found(namespace(mine, "x"), RUNNING)
    cli.stack.calls.clear()
    assert cli.invoke("up").exit_code == 0 and cli.stack.config["slurmk8s:owner"].value == mine  # generated once
    assert [n for n, _ in cli.stack.calls] == ["up"]


def test_preview_refreshes_too(cli):
    assert cli.invoke("preview").exit_code == 0
    (name, kw), = cli.stack.calls
    assert name == "preview" and kw["refresh"] is True


def test_down_as_the_owner_destroys_and_cleans_up(cli):
    cli.stack.config["slurmk8s:owner"] = Value(MINE)
    cli.found = Found(namespace(MINE, ME), RUNNING)
    result = cli.invoke("down")
    assert result.exit_code == 0, result.output
    assert _ran(cli) == ["destroy", "delete_leftovers"]


def test_down_records_nothing(cli):
    """`down` only reads the owner id: a stack with none gets none."""
    cli.found = Found(namespace(), ())
    assert cli.invoke("down").exit_code == 0
    assert "slurmk8s:owner" not in cli.stack.config


def test_an_old_cluster_of_this_stack_gets_recorded(cli):
    cli.stack.resources = [{"type": "kubernetes:core/v1:Namespace", "id": NS, "outputs": {"metadata": {"name": NS}}}]
    cli.found = Found(namespace(), RUNNING)
    result = cli.invoke("up")
    assert result.exit_code == 0, result.output
    assert "has no owner record" in result.output and "`slurmk8s up` records this stack" in result.output
    assert [n for n, _ in cli.stack.calls] == ["up"]


def test_up_take_over_keeps_the_clusters_keys(cli, monkeypatch):
    cli.found = Found(namespace(THEIRS, THEM), RUNNING)
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"
    secrets = {"slurm-auth": {"munge.key": "bXVuZ2U="},
            "ssh-host-keys": {f"ssh_host_{t}_key": base64.b64encode(pem.encode()).decode()
                              for t in ("ed25519", "ecdsa", "rsa")},
            "accounting-db": {"password": base64.b64encode(b"Secret123").decode()}}
    read: list[str] = []

    class Core:
        def __init__(self, api: Any) -> None:
            pass

        def read_namespaced_secret(self, name, ns, **kw):
            read.append(f"{ns}/{name}")
            resp = type("Resp", (), {})()
            resp.data = json.dumps({"data": secrets[name]}).encode()
            return resp

    import kubernetes.client

    from provisioner import kubeapi
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", Core)
    monkeypatch.setattr(kubeapi, "api_client", lambda kubeconfig=None: object())
    result = cli.invoke("up", "--take-over")
    assert result.exit_code == 0, result.output
    assert f"--take-over: namespace {NS} was owned by {THEM}" in result.output
    assert read == [f"{NS}/slurm-auth", f"{NS}/ssh-host-keys", f"{NS}/accounting-db"]
    assert cli.secrets_set == {"slurmk8s:mungeKey": "bXVuZ2U=", "slurmk8s:sshHostKeyEd25519": pem,
                               "slurmk8s:sshHostKeyEcdsa": pem, "slurmk8s:sshHostKeyRsa": pem,
                               "slurmk8s:accountingDbPassword": "Secret123"}
    assert _ran(cli) == ["up", "preflight", "ensure_stack_config", "wait_rollouts", "wait_login_reaches_controller"]


def test_down_take_over_deletes_as_asked(cli):
    cli.found = Found(namespace(THEIRS, THEM), RUNNING)
    result = cli.invoke("down", "--take-over")
    assert result.exit_code == 0, result.output
    assert "--take-over" in result.output and _ran(cli) == ["destroy", "delete_leftovers"]


def test_the_engine_forces_this_stacks_fields(tmp_path):
    """A field changed with `kubectl edit` belongs to another field manager; without force the next
    server-side apply stops on the conflict instead of restoring it. An operator's setting wins."""
    from provisioner.deploy import automation as a

    tool = a.Toolchain(tmp_path / "bin/pulumi", tmp_path / "ph", tmp_path / "plug/pulumi-resource-kubernetes", False)
    state = a.state_dir(tmp_path / "state")
    assert a.engine_env(tool, state, {})["PULUMI_K8S_ENABLE_PATCH_FORCE"] == "true"
    mine = a.engine_env(tool, state, {"PULUMI_K8S_ENABLE_PATCH_FORCE": "false"})
    assert mine["PULUMI_K8S_ENABLE_PATCH_FORCE"] == "false"


# ---------------------------------------------------------------- the claim: two first `up`s at once


def _session(stack: FakeStack, tmp_path: Path) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(spec=load_spec(ROOT / "examples/local.yaml"), stack=stack, state=tmp_path / "state",
                           kubeconfig=None)


def _race(monkeypatch, tmp_path, api, take_over: bool = False) -> tuple[list[Any], list[BaseException]]:
    """Two `up`s of two stacks check the namespace at once: both read before either writes."""
    import threading

    first_reads = threading.Barrier(2, timeout=10)
    reads = iter(range(1_000_000))
    api.after_read = lambda: first_reads.wait() if next(reads) < 2 else None
    monkeypatch.setattr(ow, "claim", api.claim, raising=False)
    decided: list[Any] = []
    refused: list[BaseException] = []

    def up(i: int) -> None:
        stack = FakeStack()
        stack.config[f"slurmk8s:{ow.OWNER_CONFIG}"] = Value(f"owner-{i}")
        try:
            decided.append((i, ow.check(_session(stack, tmp_path / str(i)), "up", lambda s: None,
                                        take_over=take_over, reader=api.read)))
        except ow.NotOwner as err:
            refused.append(err)

    threads = [threading.Thread(target=up, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return decided, refused


def test_two_first_ups_of_one_namespace_one_wins_the_other_is_refused(monkeypatch, tmp_path):
    """No namespace yet: both `up`s saw none. The claim is the Namespace's create with this stack's
    owner record, which the API server refuses (409 AlreadyExists) to the second: it reads again and
    is refused, naming the winner, before anything is applied."""
    from fakes.namespaces import FakeNamespaces

    api = FakeNamespaces()
    decided, refused = _race(monkeypatch, tmp_path, api)
    assert len(decided) == 1 and len(refused) == 1, (decided, refused)
    winner = decided[0][0]
    assert api.namespaces[NS]["metadata"]["annotations"][ow.OWNER_ANNOTATION] == f"owner-{winner}"
    assert f"namespace {NS} belongs to another slurmk8s stack" in str(refused[0])
    created = api.namespaces[NS]["metadata"]
    assert created["labels"]["pod-security.kubernetes.io/enforce"], "created as the program declares it"
    assert api.writes == [("create", NS)]


def test_two_ups_recording_an_unowned_namespace_one_wins(monkeypatch, tmp_path):
    """A namespace without an owner record and without workloads (made by hand, or by an old `up`):
    the claim writes the record under the resourceVersion read (409 Conflict for the second)."""
    from fakes.namespaces import FakeNamespaces

    api = FakeNamespaces()
    api.add(NS)
    decided, refused = _race(monkeypatch, tmp_path, api)
    assert len(decided) == 1 and len(refused) == 1, (decided, refused)
    assert api.namespaces[NS]["metadata"]["annotations"][ow.OWNER_ANNOTATION] == f"owner-{decided[0][0]}"
    assert api.writes == [("annotate", NS)]


def test_two_take_overs_at_once_one_wins(monkeypatch, tmp_path):
    """--take-over takes the namespace from the owner this run saw: a stack that took it meanwhile is
    not taken from again (the second take-over is refused, naming it)."""
    from fakes.namespaces import FakeNamespaces

    api = FakeNamespaces()
    api.add(NS, ow.owner_annotations(THEIRS, THEM))
    decided, refused = _race(monkeypatch, tmp_path, api, take_over=True)
    assert len(decided) == 1 and len(refused) == 1, (decided, refused)
    assert decided[0][1].took_over
    assert api.namespaces[NS]["metadata"]["annotations"][ow.OWNER_ANNOTATION] == f"owner-{decided[0][0]}"


def test_the_owner_and_preview_and_down_write_nothing(monkeypatch, tmp_path):
    from fakes.namespaces import FakeNamespaces

    api = FakeNamespaces()
    monkeypatch.setattr(ow, "claim", api.claim, raising=False)
    stack = FakeStack()
    stack.config[f"slurmk8s:{ow.OWNER_CONFIG}"] = Value(MINE)
    for op in ("preview", "down"):
        ow.check(_session(stack, tmp_path), op, lambda s: None, reader=api.read)
    assert api.writes == [] and NS not in api.namespaces
    api.add(NS, ow.owner_annotations(MINE, ME))
    ow.check(_session(stack, tmp_path), "up", lambda s: None, reader=api.read)
    assert api.writes == [], "the record names this stack already"
