"""The pipeline is assembled once (provisioner.generate.generate_for_kubernetes): `slurmk8s render`,
the Pulumi program (`up` / `preview`), the chart's in-cluster render and the check before Pulumi must
produce the same Slurm files for the same spec and nodes.

Found by this test's first version: `slurmk8s render` wrote `AccountingStorageHost=slurmdbd` while
`up` deployed slurmdbd's full Service name.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from test_chart import CASES, _ints
from typer.testing import CliRunner

from provisioner import manifests as m
from provisioner.livenodes.render import render_files
from provisioner.cli import app
from provisioner.config import load_spec
from provisioner.deploy import program as prog
from provisioner.deploy.keys import generate as generate_keys
from provisioner.generate import generate_for_kubernetes

CASE_NAMES = [name for name in CASES if name != "minimal"]


def cli_render(tmp_path: Path, spec_path: Path, nodes: list[dict], domain: str) -> dict[str, str]:
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps({"items": nodes}))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["render", "--spec", str(spec_path), "--nodes", str(nodes_file),
                                      "--out", str(out), "--cluster-domain", domain])
    assert result.exit_code == 0, result.output
    return {p.name: p.read_text() for p in out.iterdir()}


def pulumi_config_map(pulumi_run, spec_path: Path, nodes: list[dict], domain: str) -> dict[str, str]:
    spec = load_spec(spec_path)
    cfg = {f"slurmk8s:{k}": v for k, v in generate_keys().items()}
    cfg["slurmk8s:clusterDomain"] = domain
    run = pulumi_run.run(prog.inline_program(spec, nodes), cfg, list(cfg))
    [cm] = [_ints(copy.deepcopy(r.inputs)) for r in run.kubernetes()
            if r.inputs.get("kind") == "ConfigMap" and r.inputs["metadata"]["name"] == "slurm-config"]
    return m.config_map_files(cm)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_render_up_chart_and_precheck_write_the_same_files(case, tmp_path, pulumi_run):
    spec_path, nodes_fn, domain = CASES[case]
    nodes = nodes_fn()
    spec = load_spec(spec_path)

    up = pulumi_config_map(pulumi_run, spec_path, nodes, domain)
    chart, _ = render_files(spec, nodes, domain)
    precheck = generate_for_kubernetes(spec, nodes, domain).files
    rendered = cli_render(tmp_path, spec_path, nodes, domain)

    assert set(up) <= set(rendered), f"`slurmk8s render` lacks {sorted(set(up) - set(rendered))}"
    for name, text in up.items():
        assert chart[name] == text, f"{case}: the chart's in-cluster render differs from up in {name}"
        assert precheck[name] == text, f"{case}: the check before Pulumi differs from up in {name}"
        assert rendered[name] == text, f"{case}: `slurmk8s render` differs from up in {name}"
    if spec.accounting.enabled:
        assert f"AccountingStorageHost=slurmdbd.{spec.namespace_name}.svc.{domain}" in rendered["slurm.conf"] or \
            spec.accounting.external_database is not None
