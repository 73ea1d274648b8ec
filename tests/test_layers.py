"""The package's import graph, checked against its layers (docs/architecture.md).

Every import of a provisioner module, at the top of a file or inside a function (the elasticity
programs import lazily, for speed), must
- resolve: the module exists and has the imported name (a moved module leaves no dangling import
  on a path that only the cluster runs);
- point down: a module imports only from lower layers, or from its own package;
- not form a cycle (through top-level imports).
And the fakes the unit tests use live under tests/, so they never ship in the product's images.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "provisioner"

# Layers, lowest first. A module may import from a lower layer, or from its own package
# (e.g. provisioner.reconcile.act from provisioner.reconcile.classify); nothing else.
LAYERS: list[tuple[str, ...]] = [
    # accounts: the images' own; kueue: Kueue's names and the pod groups of a resume (the programs' hot path)
    ("provisioner", "provisioner.accounts", "provisioner.errors", "provisioner.kueue", "provisioner.logs"),
    ("provisioner.config",),
    # object names, labels, ports: the builders' and the runtime's (the CLI's wake) shared constants, light
    ("provisioner.names",),
    # every SLURMK8S_* key and each process's settings (standard library and names only: the programs' hot path)
    ("provisioner.settings",),
    # the slurmctld pod's first step, standard library only (but for names and settings)
    ("provisioner.podfiles",),
    ("provisioner.inventory",),
    ("provisioner.topology",),
    ("provisioner.render",),
    ("provisioner.manifests", "provisioner.specdoc"),
    ("provisioner.generate",),  # the pipeline assembled once; the pure core ends here
    ("provisioner.kubeapi", "provisioner.slurm"),  # the seams to Kubernetes and Slurm
    ("provisioner.volumes",),  # static volumes left Released by a deleted claim (deploy and the local cluster)
    ("provisioner.elastic",),  # resume / suspend programs and their backends
    ("provisioner.controltier",),  # sleep / wake of the control tier, the login agent
    ("provisioner.livenodes",),  # the Slurm configuration follows the Kubernetes nodes (render, apply, drain)
    ("provisioner.reconcile", "provisioner.accounting", "provisioner.health", "provisioner.nodesync",
     "provisioner.chart", "provisioner.helmhooks"),  # in-cluster daemons and hooks
    ("provisioner.chartdefaults",),  # generates the chart's defaults from the spec (a developer's tool)
    ("provisioner.deploy", "provisioner.status", "provisioner.usercli", "provisioner.images",
     "provisioner.localk8s"),  # the laptop's commands
    ("provisioner.cli",),
]

# Modules no other provisioner module may import: the daemons' entry points.
ENTRY_POINTS = ("provisioner.reconcile.main", "provisioner.controltier.agent")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the layer entry that matched: the module's 'package' for the sibling rule)."""
    best: tuple[int, str] | None = None
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            inside = module == entry or (entry != "provisioner" and module.startswith(entry + "."))
            if inside and (best is None or len(entry) > len(best[1])):
                best = (i, entry)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it where it belongs")
    return best


def imports(path: Path) -> list[tuple[int, str, str | None, bool]]:
    """(line, imported module, imported name or None, typing only?) for every provisioner import,
    at the top level or inside a function (those run too, later); typing only: under
    `if TYPE_CHECKING:`, never run."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "provisioner" or target.startswith("provisioner."):
                for alias in node.names:
                    out.append((node.lineno, target, alias.name, id(node) in typing_only))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("provisioner"):
                    out.append((node.lineno, alias.name, None, id(node) in typing_only))
    return out


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def resolved(target: str, name: str | None) -> str:
    """The module an import names: `from provisioner import config` imports a module."""
    if name and is_module(f"{target}.{name}"):
        return f"{target}.{name}"
    return target


SOURCES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_is_in_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_resolve_and_point_down(path: Path):
    module = module_name(path)
    mine, mine_pkg = layer_of(module)
    problems = []
    for line, target, name, _ in imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        try:
            mod = importlib.import_module(target)
        except ImportError as err:
            problems.append(f"{where}: `{target}` does not import: {err}")
            continue
        if name and name != "*" and not hasattr(mod, name) and not is_module(f"{target}.{name}"):
            problems.append(f"{where}: `{target}` has no `{name}`")
            continue
        dest = resolved(target, name)
        if dest in ENTRY_POINTS and not module.startswith(dest.rpartition(".")[0]):
            problems.append(f"{where}: imports the entry point {dest}")
        theirs, their_pkg = layer_of(dest)
        same_package = their_pkg == mine_pkg and mine_pkg != "provisioner"
        if theirs > mine or (theirs == mine and not same_package and dest != "provisioner"):
            problems.append(f"{where}: {module} (layer {mine}) imports {dest} (layer {theirs}): upward or sideways")
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        module = module_name(path)
        # every import that runs, in a function too: a circle of lazy imports is a circle all the same
        graph[module] = {resolved(t, n) for _, t, n, typing in imports(path) if not typing} - {module}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_fakes_in_the_product():
    """Test doubles live in tests/fakes, which no image installs."""
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and (node.name.startswith(("Fake", "Mock", "Memory"))):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not found, found


# Modules that must stay one file, by name and why; every other module splits by concern past 600
# lines (never trimmed to fit).
ONE_FILE = {
    "provisioner/config.py": "the spec's schema: one pydantic model tree, the JSON schema and the chart's values come from it",
    "provisioner/health.py": "copied alone into the slurmd image (standard library only) and run by its health check",
}


def test_modules_stay_small():
    """One concern per module: over 600 lines is a sign of two (ONE_FILE: the exceptions, each with why)."""
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p in SOURCES
           if (n := len(p.read_text().splitlines())) > 600 and str(p.relative_to(ROOT)) not in ONE_FILE]
    assert not big, big
    assert all((ROOT / path).is_file() for path in ONE_FILE), "an exception names a file that is gone"


def test_one_kubernetes_seam():
    """Credentials are loaded in one place (provisioner.kubeapi.api_client): in-cluster, a
    kubeconfig path or its content; nobody else builds a client of their own."""
    loaders = ("new_client_from_config", "load_incluster_config", "load_kube_config", "InClusterConfigLoader",
               "client.ApiClient(")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in SOURCES if p.name != "kubeapi.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if any(w in line for w in loaders)]
    assert not found, found
