"""provisioner/settings.py: every SLURMK8S_* key read through it, documented, parsed as before."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import health, settings
from provisioner.settings import (KEYS, Backoff, Cli, ClusterFiles, Docker, MissingSetting, Programs, Reconcile,
                                  SlurmctldStart)

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "provisioner"
SOURCES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)
# Modules that read their keys themselves, and why.
OWN_READERS = {
    "provisioner/settings.py": "the registry",
    "provisioner/health.py": "copied alone into the slurmd image: it imports nothing of the package "
                             "(test_health_defaults_agree checks its defaults against the registry)",
}
# A read of a key named by its literal: env.get("SLURMK8S_X"), environ["SLURMK8S_X"], getenv("SLURMK8S_X"),
# environ.setdefault / pop, "SLURMK8S_X" in env (a subscript being assigned is a write: not matched).
LITERAL_READ = re.compile(
    r"""(\.(get|getenv|pop|setdefault)\(\s*f?["']SLURMK8S_"""
    r"""|\[\s*f?["']SLURMK8S_[A-Z0-9_]*["']\s*\](?!\s*=[^=])"""
    r"""|getenv\(\s*f?["']SLURMK8S_"""
    r"""|["']SLURMK8S_[A-Z0-9_]*["']\s+(not\s+)?in\s+[\w.]*env)""")
KEY_CONSTANTS = {name for name, value in vars(settings).items() if isinstance(value, str) and value in KEYS}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _imported_keys(tree: ast.AST) -> set[str]:
    """The names a module gives keys: the registry's constants it imports (`from ..settings import SPEC
    as S`), and its own constants holding one (`SKIP = "SLURMK8S_SKIP_IMAGE_CHECK"`, `SKIP = settings.X`)."""
    names = {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "settings"
             for alias in node.names if alias.name in KEY_CONSTANTS}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _names_a_key(node.value, names):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _names_a_key(node: ast.AST, imported: set[str]) -> bool:
    """A literal key, or one of the registry's constants (settings.SPEC, SPEC imported from it)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith("SLURMK8S_")
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return isinstance(first, ast.Constant) and str(first.value).startswith("SLURMK8S_")
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "settings" and node.attr in KEY_CONSTANTS
    return isinstance(node, ast.Name) and node.id in imported


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a mapping is asked for a key: .get / .pop / .setdefault / getenv(key), m[key] (loaded),
    key in m."""
    found = []
    imported = _imported_keys(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _names_a_key(node.args[0], imported):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("get", "getenv", "pop", "setdefault"):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _names_a_key(node.slice, imported):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare) and _names_a_key(node.left, imported) and \
                any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reads_a_key_but_through_settings():
    literal, parsed = [], []
    for path in SOURCES:
        if _rel(path) in OWN_READERS:
            continue
        text = path.read_text()
        literal += [f"{_rel(path)}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
                    if LITERAL_READ.search(line)]
        parsed += [f"{_rel(path)}:{line}: {code}" for line, code in _reads(ast.parse(text))]
    assert not literal, "read through provisioner.settings (a process's settings object):\n" + "\n".join(literal)
    assert not parsed, "read through provisioner.settings (a process's settings object):\n" + "\n".join(parsed)


@pytest.mark.parametrize("line", [
    'x = os.environ.get("SLURMK8S_SPEC", "/etc")', 'env["SLURMK8S_SITE"]', 'os.getenv("SLURMK8S_LOG")',
    'if "SLURMK8S_BUDGET" in self.env:', "env.get('SLURMK8S_X') or 1", 'environ.setdefault("SLURMK8S_Y", "1")',
])
def test_the_scan_sees_a_read(line: str):
    assert LITERAL_READ.search(line), line
    assert _reads(ast.parse(line + " pass" if line.endswith(":") else line))


@pytest.mark.parametrize("line", [
    'env["SLURMK8S_GPU_TYPE"] = self.gpu_type', '{"name": "SLURMK8S_POOL", "value": pool.name}',
    'raise KeyError("SLURMK8S_NAMESPACE is not set")',
])
def test_the_scan_lets_a_write_or_a_message_be(line: str):
    assert not LITERAL_READ.search(line), line
    assert not _reads(ast.parse(line))


def test_the_scan_sees_a_read_by_constant():
    assert _reads(ast.parse("env.get(settings.SPEC)"))
    assert _reads(ast.parse("from .settings import SPEC\nos.environ[SPEC]"))
    assert _reads(ast.parse("SKIP = 'SLURMK8S_SKIP_IMAGE_CHECK'\nif env.get(SKIP): pass"))
    assert _reads(ast.parse("SKIP = settings.SKIP_IMAGE_CHECK\nenv[SKIP]"))
    assert not _reads(ast.parse("ENV_FILE = 'elastic.env'\ngot[ENV_FILE]"))  # a name of its own
    assert not _reads(ast.parse("env[settings.GPUS] = '1'"))


# ---------------------------------------------------------------- the registry and the docs


def _docs_section() -> str:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert "## Process settings (SLURMK8S_* environment)" in text
    return text.split("## Process settings (SLURMK8S_* environment)", 1)[1].split("\n## ", 1)[0]


def test_the_docs_table_lists_every_key():
    section = _docs_section()
    documented = set(re.findall(r"^\| `(SLURMK8S_[A-Z0-9_]+)` \|", section, re.M))
    assert not set(KEYS) - documented, f"missing from docs/configuration.md: {sorted(set(KEYS) - documented)}"
    assert not documented - set(KEYS), f"not in provisioner/settings.py: {sorted(documented - set(KEYS))}"
    assert settings.table() in section, (
        "docs/configuration.md's table is stale: run "
        "python -c 'from provisioner import settings; print(settings.table(), end=\"\")' and paste it")


def test_every_key_is_whole():
    for key in KEYS.values():
        assert key.name.startswith("SLURMK8S_") and key.kind in settings.KINDS and key.readers and key.doc, key
        assert key.default is not None or key.default_doc or key.required, f"{key.name}: say what happens without it"
        if key.default is not None:
            key.parse(key.default)  # the default parses as its kind


def test_every_python_key_has_a_reader():
    """A key the package reads is read by a settings class (or by health.py); one it only sets is read by none."""
    source = (PKG / "settings.py").read_text()
    read = set(re.findall(r"_(?:get|given)\(env, ([A-Z_]+)\)", source))
    by_settings = {getattr(settings, c) for c in read}
    health_source = (PKG / "health.py").read_text()
    by_health = {k for k in KEYS if k in health_source} | {f"SLURMK8S_HEALTH_{f.name.upper()}"
                                                           for f in dataclasses.fields(health.Config)}
    for key in KEYS.values():
        if key.python:
            assert key.name in by_settings | by_health, f"{key.name}: no settings class reads it"
        else:
            assert key.name not in by_settings, f"{key.name} is read: python=True"


def test_health_defaults_agree():
    """health.py reads its keys itself (standalone in the slurmd image): the same defaults as the registry."""
    overrides = {k for k in KEYS if k.startswith("SLURMK8S_HEALTH_")} - {settings.HEALTH_BOOT_MPI, settings.HEALTH_LOG}
    config = health.Config()
    assert overrides == {f"SLURMK8S_HEALTH_{f.name.upper()}" for f in dataclasses.fields(health.Config)}
    for f in dataclasses.fields(health.Config):
        assert settings.default(f"SLURMK8S_HEALTH_{f.name.upper()}") == getattr(config, f.name), f.name
    assert settings.default(settings.HEALTH_BOOT_MPI) == health.BOOT_MPI
    assert settings.default(settings.HEALTH_LOG) == health.DEFAULT_LOG


def test_the_old_names_are_the_registry_defaults():
    from provisioner.elastic import context, events, k8s_backend, ledger, warmcall
    from provisioner.livenodes import cache
    from provisioner.localk8s import kueue
    from provisioner.reconcile import idle, usage

    assert (context.DEFAULT_ENV_FILE, context.DEFAULT_LOG, context.DEFAULT_INVENTORY, context.DEFAULT_PARALLEL) == (
        "/etc/slurmk8s/elastic.env", "/var/log/slurmk8s/elastic.log", "/etc/slurm/inventory.json", 8)
    assert events.DEFAULT_EVENTS == "/var/log/slurmk8s/events.jsonl"
    assert ledger.DEFAULT_LEDGER == "/var/spool/slurmctld/slurmk8s/ledger.json"
    assert warmcall.DEFAULT_SOCKET == "/run/slurmk8s/programs/programs.sock"
    assert (k8s_backend.DEFAULT_SPEC, k8s_backend.DEFAULT_SITE) == (
        "/etc/slurmk8s/spec/spec.json", "/etc/slurmk8s/spec/site.json")
    assert usage.DEFAULT_USAGE == "/var/spool/slurmctld/slurmk8s/usage.json"
    assert idle.DEFAULT_TIER_LOG == "/var/spool/slurmctld/slurmk8s/control-tier.log"
    assert cache.RENDER_ID == "/opt/slurmk8s/render-id"
    assert kueue.BASE_IMAGE == "debian:trixie-slim"
    # an unparsable SLURMK8S_BUDGET is the per-wave budget, fixed
    assert float(KEYS[settings.BUDGET].invalid or "") == context.DEFAULT_BUDGET
    p = ledger.Policy()
    assert (p.backoff_failures, p.backoff_window, p.backoff_cooloff) == (3, 600.0, 300.0)


def test_import_is_light():
    """The prolog imports it for every job: standard library and provisioner.names only."""
    code = ("import sys; import provisioner.settings; "
            "print(sorted(m for m in sys.modules if m.startswith(('provisioner', 'pydantic', 'yaml', 'kubernetes', "
            "'jinja2', 'json'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert eval(out) == ["provisioner", "provisioner.accounts", "provisioner.names", "provisioner.settings"]


# ---------------------------------------------------------------- parsing and defaults


def test_programs_defaults():
    s = Programs.from_env({})
    assert s == Programs(env_file="/etc/slurmk8s/elastic.env", log="/var/log/slurmk8s/elastic.log",
                         inventory="/etc/slurm/inventory.json", backend="docker", budget=None, parallel=8,
                         events=None, ledger=None, program_socket="/run/slurmk8s/programs/programs.sock",
                         prolog_timeout=0.0, head_start=True)
    with pytest.raises(AttributeError):
        s.log = "x"  # type: ignore[misc]


@pytest.mark.parametrize("raw, budget, parallel", [
    ("12.5", 12.5, 12), ("bogus", 20.0, 8), ("0", 0.0, 1), ("-3", -3.0, 1), ("nan", None, 8), ("inf", None, 8),
])
def test_programs_numbers(raw: str, budget: float | None, parallel: int):
    s = Programs.from_env({settings.BUDGET: raw, settings.PARALLEL: raw})
    assert s.parallel == parallel
    if budget is not None:
        assert s.budget == budget
    assert Programs.from_env({settings.PROLOG_TIMEOUT: "x"}).prolog_timeout == 0.0


def test_flags_change_only_on_the_other_value():
    assert [Programs.from_env({settings.HEAD_START: v}).head_start for v in ("0", "1", "", "no", "false")] == [
        False, True, True, True, True]
    assert [Cli.from_env({settings.SKIP_IMAGE_CHECK: v}).skip_image_check for v in ("1", "0", "", "yes")] == [
        True, False, False, False]


def test_empty_values():
    """An empty value is a value, where the readers allow that (an off switch), else the default."""
    s = Programs.from_env({settings.LOG: "", settings.EVENTS: "", settings.LEDGER: "", settings.PROGRAM_SOCKET: ""})
    assert (s.log, s.events, s.ledger, s.program_socket) == ("", "", "", "")
    c = Cli.from_env({settings.TOOLCHAIN_DIR: "", settings.PULUMI: "", settings.STATE_DIR: "", settings.PYTHON: "",
                      settings.BIN: "", settings.REPO: "", settings.BASE_IMAGE: ""})
    assert c == Cli.from_env({})
    assert c.python == sys.executable and c.repo == str(ROOT) and c.pulumi is None and c.bin is None
    assert c.state_dir == "~/.slurmk8s/state" and c.toolchain_dir == "/var/cache/slurmk8s/toolchain"


def test_program_env_merges_under_the_process_environment(tmp_path: Path):
    from provisioner.elastic.context import program_env

    env_file = tmp_path / "elastic.env"
    env_file.write_text("SLURMK8S_BACKEND=kubernetes\nSLURMK8S_LOG=/from/file\n")
    env = program_env({settings.ENV_FILE: str(env_file), settings.LOG: "/from/process"})
    s = Programs.from_env(env)
    assert (s.backend, s.log) == ("kubernetes", "/from/process")


def test_reconcile_defaults():
    assert Reconcile.from_env({}) == Reconcile(
        backend="docker", inventory="/etc/slurm/inventory.json", ledger="/var/spool/slurmctld/slurmk8s/ledger.json",
        events="/var/log/slurmk8s/events.jsonl", usage="/var/spool/slurmctld/slurmk8s/usage.json",
        log="/var/log/slurmk8s/reconcile.log", tier_log="/var/spool/slurmctld/slurmk8s/control-tier.log",
        config_cache="/var/spool/slurmctld/slurmk8s/config", render_id="/opt/slurmk8s/render-id")
    # reconcile.log beside SLURMK8S_LOG, unless SLURMK8S_RECONCILE_LOG (empty: beside)
    assert Reconcile.from_env({settings.LOG: "/x/elastic.log"}).log == "/x/reconcile.log"
    assert Reconcile.from_env({settings.LOG: "/x/e.log", settings.RECONCILE_LOG: ""}).log == "/x/reconcile.log"
    assert Reconcile.from_env({settings.RECONCILE_LOG: "/y/r.log"}).log == "/y/r.log"
    # the loop's events and ledger default where the programs' are off when unset
    assert Reconcile.from_env({settings.EVENTS: ""}).events == ""


def test_backoff():
    assert Backoff.from_env({}) == Backoff(3, 600.0, 300.0)
    assert Backoff.from_env({settings.BACKOFF_FAILURES: "5.9", settings.BACKOFF_WINDOW: "x",
                             settings.BACKOFF_COOLOFF: "12"}) == Backoff(5, 600.0, 12.0)


def test_cluster_files():
    f = ClusterFiles.from_env({})
    assert (f.spec, f.site, f.namespace, f.site_path) == (
        "/etc/slurmk8s/spec/spec.json", None, None, "/etc/slurmk8s/spec/site.json")
    assert ClusterFiles.from_env({settings.SITE: ""}).site_path == ""
    assert ClusterFiles.from_env({settings.NAMESPACE: ""}).require_namespace() == ""
    with pytest.raises(KeyError) as err:
        f.require_namespace()
    assert isinstance(err.value, MissingSetting) and str(err.value) == "SLURMK8S_NAMESPACE is not set"


def test_slurmctld_start():
    assert SlurmctldStart.from_env({}) == SlurmctldStart(pod_files="", inventory="/etc/slurm/inventory.json")


def test_docker():
    env = {settings.DOCKER_CLUSTER: "c", settings.DOCKER_NETWORK: "n", settings.CONTROLLER: "h:1"}
    d = Docker.from_env(env)
    assert (d.image, d.mounts, d.env, d.security, d.socket, d.overrides) == (
        "slurmk8s/slurmd:dev", [], {}, {}, "/var/run/docker.sock", None)
    assert settings.missing({**env, settings.DOCKER_NETWORK: ""}, settings.DOCKER_CLUSTER, settings.DOCKER_NETWORK) == [
        settings.DOCKER_NETWORK]
    with pytest.raises(MissingSetting, match="SLURMK8S_DOCKER_CLUSTER is not set"):
        Docker.from_env({settings.DOCKER_NETWORK: "n", settings.CONTROLLER: "h:1"})
    with pytest.raises(ValueError):
        Docker.from_env({**env, settings.DOCKER_MOUNTS: "[nope"})


def test_docker_backend_errors_name_the_keys():
    from provisioner.elastic.backend import BackendError
    from provisioner.elastic.docker_backend import DockerConfig

    with pytest.raises(BackendError, match="SLURMK8S_DOCKER_CLUSTER, SLURMK8S_CONTROLLER not set"):
        DockerConfig.from_env({settings.DOCKER_NETWORK: "n"})
    with pytest.raises(BackendError, match="bad SLURMK8S_DOCKER_MOUNTS"):
        DockerConfig.from_env({settings.DOCKER_CLUSTER: "c", settings.DOCKER_NETWORK: "n", settings.CONTROLLER: "h",
                               settings.DOCKER_ENV: "{"})


def test_the_helm_hook_names_a_missing_namespace(tmp_path: Path, monkeypatch, capsys):
    from provisioner import helmhooks

    spec = tmp_path / "spec.json"
    spec.write_text('{"name": "demo"}')
    monkeypatch.setenv(settings.SPEC, str(spec))
    monkeypatch.delenv(settings.NAMESPACE, raising=False)
    assert helmhooks.delete_workers_main() == 1
    assert "SLURMK8S_NAMESPACE is not set" in capsys.readouterr().err
