"""charts/slurmk8s deploys what `slurmk8s up` deploys: `helm template` against the Pulumi program.

For each spec below, the chart is rendered with the spec as its values and the Pulumi program runs
under Pulumi's mocks on the same Kubernetes nodes; the two object sets are compared object by
object, field by field. The only differences admitted are listed in ``_expected_differences`` (each
with its reason); anything else fails with the object and the field path. So a change to a builder
in provisioner/manifests/ that the chart does not follow fails here.

The tests marked ``chart`` need the helm binary: on PATH, or the toolchain's (``bin/helm`` under
$SLURMK8S_TOOLCHAIN_DIR, default /var/cache/slurmk8s/toolchain), which .ci/run builds. Without it
they fail, never skip (a skip would let CI pass with the chart untested), saying how to get helm;
a developer without helm leaves them out explicitly: ``pytest -m 'not chart'``. The generated-file
tests (values.schema.json, _defaults.tpl) need no helm and always run.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import yaml
from factories import aws_fleet, node

from provisioner import manifests as m
from provisioner.chart import values_schema_text
from provisioner.livenodes.render import render_files
from provisioner.chartdefaults import admission_text, chart_defaults_text
from provisioner.config import load_spec, parse_spec
from provisioner.deploy import program as prog
from provisioner.deploy.automation import toolchain_dir
from provisioner.deploy.keys import generate
from provisioner.generate import generate_for_kubernetes

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "slurmk8s"
LINUX = {"kubernetes.io/os": "linux"}


def find_helm(env: Mapping[str, str] = os.environ) -> tuple[str | None, Path]:
    """(helm on PATH, else the toolchain's bin/helm if built, else None; the toolchain path looked at)."""
    toolchain_helm = toolchain_dir(env) / "bin" / "helm"
    found = shutil.which("helm", path=env.get("PATH", os.defpath))
    if not found and os.access(toolchain_helm, os.X_OK):
        found = str(toolchain_helm)
    return found, toolchain_helm


def _helm() -> str:
    """The helm binary; a test marked `chart` that cannot have it fails (never skips), saying how to get it."""
    found, toolchain_helm = find_helm()
    if not found:
        pytest.fail(
            f"helm not found on PATH nor at {toolchain_helm}: the chart tests need it and fail without it "
            "(a skip would let CI pass with the chart untested). Get it: `bash provisioner/localk8s/toolchain.sh "
            "build helm` (or `slurmk8s toolchain build helm`: built from the Go module proxy, a few minutes; "
            "needs Go), or put a helm v3 binary on PATH. Or leave these tests out: `pytest -m 'not chart'`.",
            pytrace=False)
    return found


def _with_addresses(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": "x"}]
    return obj


# name -> (spec file, Kubernetes nodes, cluster domain)
CASES: dict[str, tuple[Path, Callable[[], list[dict[str, Any]]], str]] = {
    "local": (ROOT / "examples/local.yaml", lambda: [
        node("localk8s", LINUX, cpu="2", memory="23Gi"),
        node("kwok-0", LINUX, taints=[{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}])],
        "cluster.local"),
    "aws-gpu": (ROOT / "examples/aws-gpu.yaml", lambda: aws_fleet(2, 2, 2), "cluster.local"),
    "mixed-block": (ROOT / "tests/golden/mixed-block.yaml", lambda: [
        node(f"gpu-{i}", {"pool": "gpu", "nvidia.com/gpu.clique": f"clique-{i // 4}"}, cpu="72", memory="480Gi",
             gpus=4) for i in range(8)], "cluster.local"),
    "full": (ROOT / "tests/chart/full.yaml", lambda: [
        _with_addresses(node(f"fab-{i}", {"pool": "fab", **LINUX}, cpu="32", memory="128Gi"), f"10.0.0.{i + 1}")
        for i in range(3)], "hpc.internal"),
    "minimal": (ROOT / "tests/chart/minimal.yaml", lambda: [], "cluster.local"),
}


# ---------------------------------------------------------------- the two renderings


def _ints(value: Any) -> Any:
    """Pulumi's mocks carry every number as a float (6817.0); YAML has ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']} {meta.get('namespace', '-')}/{meta['name']}"


def pulumi_objects(pulumi_run, spec_path: Path, nodes: list[dict[str, Any]], domain: str) -> dict[str, dict]:
    spec = load_spec(spec_path)
    cfg = {f"slurmk8s:{k}": v for k, v in generate().items()}
    cfg["slurmk8s:clusterDomain"] = domain
    run = pulumi_run.run(prog.inline_program(spec, nodes), cfg, list(cfg))
    objs = [_ints(copy.deepcopy(r.inputs)) for r in run.kubernetes()]
    return {_key(o): o for o in objs}


def helm_objects(spec_path: Path, namespace: str, chart_values: dict[str, Any],
                 extra_args: tuple[str, ...] = ()) -> dict[str, dict]:
    values = yaml.safe_load(spec_path.read_text())
    values["chart"] = chart_values
    out = subprocess.run(
        [_helm(), "template", "rel", str(CHART), "--namespace", namespace, "--values", "-", *extra_args],
        input=yaml.safe_dump(values), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"helm template failed for {spec_path.name}:\n{out.stderr}"
    objs = [o for o in yaml.safe_load_all(out.stdout) if o]
    keys = [_key(o) for o in objs]
    assert len(keys) == len(set(keys)), f"the chart renders an object twice: {sorted(keys)}"
    return dict(zip(keys, objs))


def _render(case: str, pulumi_run) -> tuple[Any, dict[str, dict], dict[str, dict], list[dict[str, Any]]]:
    spec_path, nodes_fn, domain = CASES[case]
    spec = load_spec(spec_path)
    nodes = nodes_fn()
    gen = generate_for_kubernetes(spec, nodes, domain)
    sources = list(prog.host_network_sources(spec, gen, nodes))
    pulumi = pulumi_objects(pulumi_run, spec_path, nodes, domain)
    chart = helm_objects(spec_path, spec.namespace_name, {"clusterDomain": domain, "hostNetworkSources": sources})
    return spec, pulumi, chart, nodes


# ---------------------------------------------------------------- the comparison


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Every field where the chart (a) and the Pulumi program (b) differ, as 'path: chart X, pulumi Y'."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else k
            if k not in a:
                out.append(f"{sub}: missing in the chart (pulumi: {json.dumps(b[k])[:200]})")
            elif k not in b:
                out.append(f"{sub}: only in the chart ({json.dumps(a[k])[:200]})")
            else:
                out += diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items in the chart, {len(b)} in pulumi: "
                    f"chart {json.dumps(a)[:300]}, pulumi {json.dumps(b)[:300]}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    if a != b:
        return [f"{path}: chart {json.dumps(a)[:300]}, pulumi {json.dumps(b)[:300]}"]
    return []


def _pop_annotation(obj: dict[str, Any], key: str) -> Any:
    """Remove one annotation (and an emptied annotations map); return its value (None if absent)."""
    meta = obj["metadata"]
    value = meta.get("annotations", {}).pop(key, None)
    if "annotations" in meta and not meta["annotations"]:
        del meta["annotations"]
    return value


def _expected_differences(spec, chart: dict[str, dict], pulumi: dict[str, dict],
                          nodes: list[dict[str, Any]]) -> None:
    """The differences the design calls for, each checked, then removed from both sides in place.
    What remains must be identical."""
    ns = spec.namespace_name

    # 1. Pulumi-only metadata: the provider's await switch on the claims.
    for obj in pulumi.values():
        _pop_annotation(obj, prog.SKIP_AWAIT)

    # 2. The labels every Helm chart carries (object metadata only, never on pod templates).
    for key, obj in chart.items():
        labels = obj["metadata"]["labels"]
        assert labels.pop("helm.sh/chart").startswith("slurmk8s-"), key
        assert labels.pop("app.kubernetes.io/managed-by") == "Helm", key

    # 3. Kept on `helm uninstall` as `slurmk8s down` keeps them: the claims (Pulumi: retainOnDelete)
    #    and the generated keys (Pulumi keeps those in the stack's configuration).
    kept = {f"PersistentVolumeClaim {ns}/home", f"PersistentVolumeClaim {ns}/slurmctld-state",
            f"Secret {ns}/slurm-auth"} | ({f"Secret {ns}/ssh-host-keys"} if spec.login.enabled else set())
    if spec.rest.enabled:
        kept.add(f"Secret {ns}/{m.JWT_SECRET}")
    if spec.accounting.enabled and spec.accounting.external_database is None:  # the internal database
        kept |= {f"PersistentVolumeClaim {ns}/{m.DATABASE_PVC}", f"Secret {ns}/{m.DB_SECRET}"}
    for key, obj in chart.items():
        assert (_pop_annotation(obj, "helm.sh/resource-policy") == "keep") == (key in kept), key

    # 4. The namespace: Helm installs into the release namespace and does not own it.
    ns_obj = pulumi.pop(f"Namespace -/{ns}")
    assert ns_obj["metadata"]["name"] == ns

    # 5. slurm-config: rendered in the slurmctld pod by the slurmctld container's entrypoint
    #    (SLURMK8S_CONFIG_INIT), from the same spec and nodes with the same code: render_files() must
    #    give exactly this data.
    slurm_config = pulumi.pop(f"ConfigMap {ns}/slurm-config")
    domain = json.loads(pulumi[f"ConfigMap {ns}/{m.SPEC_CONFIG}"]["data"]["site.json"])["cluster_domain"]
    files, _ = render_files(parse_spec(spec.model_dump(mode="json")), nodes, domain)
    assert files == m.config_map_files(slurm_config), "the in-cluster render differs from the Pulumi program's slurm-config"
    sts = chart[f"StatefulSet {ns}/slurmctld"]["spec"]["template"]
    assert "initContainers" not in sts["spec"]  # the kubelet would start slurmctld up to 1 s after one
    ctld = next(c for c in sts["spec"]["containers"] if c["name"] == "slurmctld")
    assert {"name": "SLURMK8S_CONFIG_INIT", "value": m.CONFIG_INIT} in ctld["env"]  # which runs render_main
    for c in sts["spec"]["containers"]:  # and every other container waits for it
        assert c["name"] == "slurmctld" or c["command"][-2:] == ["--wait-config", m.SLURM_CONF_DIR], c["name"]
    #    the spec hash covers the values as given (the chart cannot normalise them): both present.
    psts = pulumi[f"StatefulSet {ns}/slurmctld"]["spec"]["template"]
    assert sts["metadata"]["annotations"].pop(m.A_SPEC_HASH) and psts["metadata"]["annotations"].pop(m.A_SPEC_HASH)
    #    read access to the nodes for that render and the reconcile loop (cluster-scoped), only when
    #    a pool is pinned or the loop follows interruption notices: compared with the Pulumi
    #    program's below, like every other object.
    nodes_rbac = [k for k in chart if k.startswith(("ClusterRole ", "ClusterRoleBinding "))]
    name = f"slurmk8s-{ns}-read-nodes"
    assert sorted(nodes_rbac) == ([f"ClusterRole -/{name}", f"ClusterRoleBinding -/{name}"] if m.reads_nodes(spec)
                                  else [])

    #    worker pods are not Helm's: a pre-delete hook deletes those left, as `down` does after destroy.
    hook = chart.pop(f"Job {ns}/slurmk8s-delete-workers")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    (c,) = hook["spec"]["template"]["spec"]["containers"]
    assert c["command"] == [f"{m.BIN_DIR}/slurmk8s-delete-workers"] and c["image"] == spec.images.controller
    assert hook["spec"]["template"]["spec"]["serviceAccountName"] == m.CONTROLLER

    # 6. The spec as the in-cluster programs read it: the chart writes the values as given (plus the
    #    release namespace, always explicit), `up` the normalised spec; both parse to the same spec.
    cspec = chart[f"ConfigMap {ns}/{m.SPEC_CONFIG}"]["data"]
    pspec = pulumi[f"ConfigMap {ns}/{m.SPEC_CONFIG}"]["data"]
    from_chart = parse_spec(json.loads(cspec.pop("spec.json")))
    from_pulumi = parse_spec(json.loads(pspec.pop("spec.json")))
    assert from_chart.namespace_name == from_pulumi.namespace_name == ns
    assert from_chart.model_copy(update={"namespace": ns}) == from_pulumi.model_copy(update={"namespace": ns}), \
        diff(from_chart.model_dump(mode="json"), from_pulumi.model_dump(mode="json"))
    for data in (cspec, pspec):  # same document, JSON indented differently (Go's and Python's)
        data["site.json"] = json.loads(data["site.json"])

    # 7. Worker pod templates: the same JSON document, indented differently.
    for pool in spec.pools:
        for objs in (chart, pulumi):
            data = objs[f"ConfigMap {ns}/{m.TEMPLATE_PREFIX}{pool.name}"]["data"]
            data["pod.json"] = json.loads(data["pod.json"])

    # 8. Secret values: generated by each (Helm at install, `up` into the stack configuration).
    auth_c = chart[f"Secret {ns}/{m.AUTH_SECRET}"]["data"]
    auth_p = pulumi[f"Secret {ns}/{m.AUTH_SECRET}"]["data"]
    assert len(base64.b64decode(auth_c["munge.key"])) == len(base64.b64decode(auth_p["munge.key"])) == 1024
    auth_c["munge.key"] = auth_p["munge.key"] = "<generated>"
    if spec.rest.enabled:  # the JWT key: 64 random bytes
        jwt_c = chart[f"Secret {ns}/{m.JWT_SECRET}"]["data"]
        jwt_p = pulumi[f"Secret {ns}/{m.JWT_SECRET}"]["data"]
        assert len(base64.b64decode(jwt_c[m.JWT_KEY_FILE])) == len(base64.b64decode(jwt_p[m.JWT_KEY_FILE])) == 64
        jwt_c[m.JWT_KEY_FILE] = jwt_p[m.JWT_KEY_FILE] = "<generated>"
    if f"Secret {ns}/{m.DB_SECRET}" in pulumi:  # the internal database's password: 32 letters and digits
        db_c, db_p = chart[f"Secret {ns}/{m.DB_SECRET}"], pulumi[f"Secret {ns}/{m.DB_SECRET}"]
        generated = base64.b64decode(db_c.pop("data")["password"]).decode()
        assert len(generated) == len(db_p["stringData"]["password"]) == 32 and generated.isalnum()
        db_c["stringData"] = {"password": "<generated>"}
        db_p["stringData"] = {"password": "<generated>"}
    if spec.login.enabled:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

        hk_c = chart[f"Secret {ns}/{m.SSH_HOST_KEYS_SECRET}"]
        hk_p = pulumi[f"Secret {ns}/{m.SSH_HOST_KEYS_SECRET}"]
        kinds = {"ed25519": ed25519.Ed25519PrivateKey, "ecdsa": ec.EllipticCurvePrivateKey, "rsa": rsa.RSAPrivateKey}
        data = hk_c.pop("data")  # base64 (the chart may carry keys read back from the cluster)
        assert set(data) == set(hk_p["stringData"]) == {f"ssh_host_{t}_key" for t in kinds}
        for t, cls in kinds.items():
            key = serialization.load_pem_private_key(base64.b64decode(data[f"ssh_host_{t}_key"]), None)
            assert isinstance(key, cls), f"ssh_host_{t}_key is not a {t} key"
        hk_c["stringData"] = {k: "<generated>" for k in data}
        hk_p["stringData"] = {k: "<generated>" for k in hk_p["stringData"]}


def compare(spec, chart: dict[str, dict], pulumi: dict[str, dict], nodes: list[dict[str, Any]]) -> list[str]:
    chart, pulumi = copy.deepcopy(chart), copy.deepcopy(pulumi)
    _expected_differences(spec, chart, pulumi, nodes)
    problems = [f"{k}: only in the Pulumi program (add it to charts/slurmk8s/templates)" for k in sorted(set(pulumi) - set(chart))]
    problems += [f"{k}: only in the chart" for k in sorted(set(chart) - set(pulumi))]
    for key in sorted(set(chart) & set(pulumi)):
        problems += [f"{key}: {d}" for d in diff(chart[key], pulumi[key])]
    return problems


# ---------------------------------------------------------------- tests


@pytest.mark.chart
@pytest.mark.parametrize("case", sorted(CASES))
def test_chart_deploys_what_the_pulumi_program_deploys(case, pulumi_run):
    spec, pulumi, chart, nodes = _render(case, pulumi_run)
    # the admission policy of the worker pods is compared like the rest (cluster-scoped: no namespace)
    admission = {f"ValidatingAdmissionPolicy -/{m.policy_name(spec)}", f"ValidatingAdmissionPolicyBinding -/{m.policy_name(spec)}"}
    assert admission <= set(chart) and admission <= set(pulumi), sorted(set(chart) ^ set(pulumi))
    problems = compare(spec, chart, pulumi, nodes)
    assert not problems, (f"charts/slurmk8s and the Pulumi program differ for {CASES[case][0].name} "
                          "(update the chart's templates to follow provisioner/manifests/):\n  "
                          + "\n  ".join(problems))


@pytest.mark.chart
def test_a_builder_change_the_chart_does_not_follow_fails_naming_object_and_field(pulumi_run, monkeypatch):
    """The comparison can fail: a new env var in the slurmctld container, a changed login port name."""
    real_sts, real_svc = m.controller_statefulset, m.login_service

    def sts(*args, **kwargs):
        obj = real_sts(*args, **kwargs)
        obj["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "NEW", "value": "1"})
        return obj

    def svc(*args, **kwargs):
        obj = real_svc(*args, **kwargs)
        obj["spec"]["ports"][0]["name"] = "sshd"
        return obj

    monkeypatch.setattr(m, "controller_statefulset", sts)
    monkeypatch.setattr(m, "login_service", svc)
    spec, pulumi, chart, nodes = _render("local", pulumi_run)
    problems = compare(spec, chart, pulumi, nodes)
    assert any(p.startswith("StatefulSet slurm-local/slurmctld: spec.template.spec.containers[0].env: 7 items in "
                            "the chart, 8 in pulumi") for p in problems), problems
    assert "Service slurm-local/login: spec.ports[0].name: chart \"ssh\", pulumi \"sshd\"" in problems, problems


@pytest.mark.chart
def test_the_chart_reads_no_node_with_no_pinned_pool_and_interruption_notices_off(tmp_path):
    """The minimal spec (a slots pool) follows the default interruption taints, so its loop may list
    the nodes; with both lists empty the chart, like the Pulumi program, grants nothing cluster-wide."""
    spec_path = tmp_path / "quiet.yaml"
    doc = yaml.safe_load((ROOT / "tests/chart/minimal.yaml").read_text())
    doc["elasticity"] = {**(doc.get("elasticity") or {}), "interruption_taints": [], "interruption_conditions": []}
    spec_path.write_text(yaml.safe_dump(doc))
    spec = load_spec(spec_path)
    assert not m.reads_nodes(spec) and m.reads_nodes(load_spec(ROOT / "tests/chart/minimal.yaml"))
    chart = helm_objects(spec_path, spec.namespace_name, {"clusterDomain": "cluster.local", "hostNetworkSources": []})
    assert not [k for k in chart if k.startswith(("ClusterRole ", "ClusterRoleBinding "))]


def test_values_schema_is_the_spec_schema():
    """charts/slurmk8s/values.schema.json is generated: `slurmk8s spec chart-schema > charts/slurmk8s/values.schema.json`."""
    assert (CHART / "values.schema.json").read_text() == values_schema_text(), \
        "values.schema.json is stale: run `slurmk8s spec chart-schema > charts/slurmk8s/values.schema.json`"


def test_chart_admission_policy_is_the_generated_one():
    """charts/slurmk8s/templates/_admission.tpl is generated from provisioner/manifests/admission.py."""
    assert (CHART / "templates" / "_admission.tpl").read_text() == admission_text(), \
        "_admission.tpl is stale: run `python -m provisioner.chartdefaults admission > charts/slurmk8s/templates/_admission.tpl`"


def test_chart_defaults_are_the_spec_defaults():
    """charts/slurmk8s/templates/_defaults.tpl is generated from provisioner/config.py."""
    assert (CHART / "templates" / "_defaults.tpl").read_text() == chart_defaults_text(), \
        "_defaults.tpl is stale: run `python -m provisioner.chartdefaults > charts/slurmk8s/templates/_defaults.tpl`"


# A default written into a template (`default "ClusterIP"`, `default 3306`, `ternary $x.enabled true
# (hasKey ...)`) instead of taken from "slurmk8s.defaults"; `default dict` / `default list` (a section
# left out) and `default $d.X.y` are fine.
_LITERAL_DEFAULT = re.compile(r"""\bdefault\s+(?:"|'|`|-?\d|true\b|false\b|nil\b)|\bternary\s+\S+\s+(?:"|-?\d|true\b|false\b)[^)]*\(hasKey""")


def test_templates_take_every_default_from_the_generated_defaults():
    found = [f"{p.name}:{n}: {line.strip()}"
             for p in sorted((CHART / "templates").iterdir()) if p.name != "_defaults.tpl"
             for n, line in enumerate(p.read_text().splitlines(), 1) if _LITERAL_DEFAULT.search(line)]
    assert not found, ("defaults written by hand in the chart's templates; take them from "
                       "`$d := include \"slurmk8s.defaults\" . | fromJson` (generated from provisioner/config.py):\n  "
                       + "\n  ".join(found))
    assert _LITERAL_DEFAULT.search('($l.service_type | default "ClusterIP")')
    assert _LITERAL_DEFAULT.search("(int64 ($e.port | default 3306))")
    assert _LITERAL_DEFAULT.search('(ternary $a.enabled true (hasKey $a "enabled"))')
    assert not _LITERAL_DEFAULT.search('(ternary $a.enabled $d.Accounting.enabled (hasKey $a "enabled"))')
    assert not _LITERAL_DEFAULT.search("$v.users | default list")


def test_without_helm_the_chart_tests_fail_saying_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURMK8S_TOOLCHAIN_DIR", str(tmp_path / "toolchain"))
    assert find_helm() == (None, tmp_path / "toolchain" / "bin" / "helm")
    with pytest.raises(pytest.fail.Exception) as failed:
        _helm()
    message = str(failed.value)
    assert f"helm not found on PATH nor at {tmp_path}/toolchain/bin/helm" in message
    assert "toolchain.sh build helm" in message and "pytest -m 'not chart'" in message

    (tmp_path / "toolchain" / "bin").mkdir(parents=True)  # the toolchain's helm, not on PATH: found
    helm = tmp_path / "toolchain" / "bin" / "helm"
    helm.write_text("#!/bin/sh\n")
    helm.chmod(0o755)
    assert _helm() == str(helm)


@pytest.mark.chart
@pytest.mark.parametrize("values", [None, *sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))])
def test_helm_lint_is_clean(values: str | None):
    """`helm lint --strict` with the chart's defaults and with each example spec as its values."""
    extra = [] if values is None else ["-f", str(ROOT / "examples" / values)]
    out = subprocess.run([_helm(), "lint", "--strict", str(CHART), "--namespace", "slurm-lint", *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout + out.stderr


def test_default_values_are_a_valid_spec():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values.pop("chart")
    parse_spec(values)


@pytest.mark.chart
@pytest.mark.parametrize("values, message", [
    ({"namespace": "elsewhere"}, "namespace: the values say \"elsewhere\" but the release namespace is \"slurm-x\""),
    ({"pools": []}, "pools"),
    ({"elasticity": {"suspend_time": "ten minutes"}}, "suspend_time"),
    ({"pools": [{"name": "c", "nodeSelector": {}}]}, "nodeSelector"),
])
def test_bad_values_are_refused_naming_the_field(values, message, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = subprocess.run([_helm(), "template", "rel", str(CHART), "--namespace", "slurm-x", "--values", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and message in out.stderr, out.stderr


@pytest.mark.chart
def test_render_config_entry_point_writes_the_files(tmp_path, monkeypatch):
    """slurmk8s-render-config as the slurmctld container runs it: spec from the chart's spec.json; a
    spec without pinned pools reads no nodes."""
    from provisioner.livenodes.render import main as render_main

    chart = helm_objects(ROOT / "tests/chart/minimal.yaml", "slurm-mini", {})
    spec_json = tmp_path / "spec.json"
    spec_json.write_text(chart["ConfigMap slurm-mini/slurmk8s-spec"]["data"]["spec.json"])
    monkeypatch.setenv("SLURMK8S_SPEC", str(spec_json))
    monkeypatch.setattr("provisioner.livenodes.render.read_nodes", lambda env: pytest.fail("nodes read for a slots-only spec"))
    assert render_main(["--out", str(tmp_path / "etc")]) == 0
    expected, _ = render_files(load_spec(ROOT / "tests/chart/minimal.yaml"), [])
    assert {p.name: p.read_text() for p in (tmp_path / "etc").iterdir()} == expected

    spec_json.write_text(json.dumps({"name": "x", "pools": [{"name": "c", "mode": "slots"}]}))
    assert render_main(["--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_delete_workers_hook_deletes_only_this_clusters_workers(tmp_path, monkeypatch):
    from provisioner import helmhooks

    calls: list[tuple[str, ...]] = []

    class Api:
        def __init__(self, client):
            pass

        def list(self, ns, selector):
            calls.append(("list", ns, selector))
            return [{"metadata": {"name": "cpu-0"}}, {"metadata": {"name": "cpu-1"}}]

        def delete(self, ns, name):
            calls.append(("delete", ns, name))

    spec_json = tmp_path / "spec.json"
    spec_json.write_text(json.dumps({"name": "mini", "pools": []}))
    monkeypatch.setenv("SLURMK8S_SPEC", str(spec_json))
    monkeypatch.setenv("SLURMK8S_NAMESPACE", "slurm-mini")
    monkeypatch.setattr("provisioner.elastic.k8s_backend.ClientPodApi", Api)
    monkeypatch.setattr("provisioner.kubeapi.api_client", lambda *a, **k: None)
    assert helmhooks.delete_workers_main([]) == 0
    assert calls == [("list", "slurm-mini", "slurmk8s.io/cluster=mini,app.kubernetes.io/component=worker"),
                     ("delete", "slurm-mini", "cpu-0"), ("delete", "slurm-mini", "cpu-1")]
