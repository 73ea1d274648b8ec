"""The public Pulumi component applied for real: examples/pulumi-embed/__main__.py, a platform
team's own program (its own Kubernetes provider, SlurmCluster in it), run through the Automation API
against the local cluster. It deploys a Slurm cluster that answers SSH and runs a 2-node job from zero
workers; a second `up` changes nothing and keeps the keys; `destroy` keeps the volumes, as
`slurmk8s down` does.

Own namespace (slurm-embed) and static volumes, so it runs beside the other e2e clusters; everything
it makes is removed at the end. Tests run in file order.
"""

from __future__ import annotations

import json
import runpy
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import asyncssh
import pytest
import yaml

from helpers import (ROOT, Login, apply_storage_class, clear_leftover, kjson, kubeconfig, kubectl, login_in,
                     mark_made_by, side_spec, static_volumes, two_node_job_from_zero_workers)

pytestmark = pytest.mark.e2e

NAME = "embed"
NAMESPACE = f"slurm-{NAME}"
PROJECT = "research-platform"  # examples/pulumi-embed/Pulumi.yaml
EXAMPLE = ROOT / "examples" / "pulumi-embed" / "__main__.py"


@dataclass
class Embedded:
    stack: Any  # pulumi.automation.Stack
    key: asyncssh.SSHKey
    first: dict[str, Any]  # the first up's outputs

    def login(self) -> Login:
        return login_in(NAMESPACE, "alice", self.key)


def _stack(work: Path, spec_path: Path) -> Any:
    from pulumi import automation as auto

    from provisioner.deploy.automation import engine_env, find_toolchain, state_dir

    tool = find_toolchain()
    state = state_dir(work / "state")
    env = engine_env(tool, state)
    project = auto.ProjectSettings(name=PROJECT, runtime="python",
                                   backend=auto.ProjectBackend(url=f"file://{state / 'backend'}"))
    opts = auto.LocalWorkspaceOptions(work_dir=str(state / "workspace"), pulumi_home=env["PULUMI_HOME"], env_vars=env,
                                      secrets_provider="passphrase", project_settings=project,
                                      pulumi_command=auto.PulumiCommand(root=tool.root, skip_version_check=True))
    stack = auto.create_or_select_stack("e2e", project_name=PROJECT,
                                        program=lambda: runpy.run_path(str(EXAMPLE)), opts=opts)
    stack.set_config(f"{PROJECT}:kubeconfig", auto.ConfigValue(kubeconfig()))
    stack.set_config(f"{PROJECT}:spec", auto.ConfigValue(str(spec_path)))
    return stack


def _outputs(result: Any) -> dict[str, Any]:
    return {k: v.value for k, v in result.outputs.items()}


def _clean() -> None:
    clear_leftover(NAMESPACE, "e2e")
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={NAME}", "--ignore-not-found", "--wait=true", timeout=120)
    for kind in ("clusterrole,clusterrolebinding", "validatingadmissionpolicy,validatingadmissionpolicybinding"):
        names = kubectl("get", kind, "-o", "name", check=False).stdout.split()
        mine = [n for n in names if f"-{NAMESPACE}-" in n]
        if mine:
            kubectl("delete", *mine, "--ignore-not-found", check=False)
    shutil.rmtree(f"/var/lib/slurmk8s/volumes/{NAME}", ignore_errors=True)


@pytest.fixture(scope="module")
def embedded(cluster_reachable, tmp_path_factory) -> Iterator[Embedded]:
    work = tmp_path_factory.mktemp(NAME)
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec = side_spec(key.export_public_key().decode().strip() + " e2e-embed", NAME)
    spec["pools"] = [{"name": "cpu", "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m",
                      "pod_memory_request": "128Mi", "domains": [{"name": "local", "count": 2}]}]
    spec_path = work / "cluster.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    _clean()
    apply_storage_class()
    manifest = work / "volumes.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": static_volumes(NAME, NAMESPACE)}))
    kubectl("apply", "-f", str(manifest))
    stack = _stack(work, spec_path)
    log: list[str] = []
    try:
        t0 = time.monotonic()
        try:
            result = stack.up(on_output=log.append)
        finally:
            mark_made_by(NAMESPACE, "e2e")
        print(f"embedded SlurmCluster: pulumi up {time.monotonic() - t0:.1f} s")
        yield Embedded(stack, key, _outputs(result))
    except Exception as err:  # the engine's own words, not only the Automation API's exception
        pods = kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        pytest.fail(f"up of the embedded component failed: {err}\n{''.join(log)[-6000:]}\n--- pods:\n{pods}",
                    pytrace=False)
    finally:
        try:
            stack.destroy(on_output=log.append)
        except Exception as err:  # noqa: BLE001 - the cleanup below runs all the same
            print(f"destroy failed: {err}")
        _clean()


def test_outputs_name_the_namespace_and_where_to_log_in(embedded: Embedded):
    out = embedded.first
    assert out["namespace"] == NAMESPACE
    assert out["login_address"] == f"login.{NAMESPACE}.svc.cluster.local:22"
    assert out.get("rest_url") is None  # the engine leaves out an output that is None
    assert len(out["ssh_host_public_keys"]) == 3


def test_login_answers_ssh_with_the_stacks_host_key(embedded: Embedded):
    login = embedded.login()
    assert login.run("id -un").stdout.strip() == "alice"
    import asyncio

    served = asyncio.run(asyncssh.get_server_host_key(login.host, login.port, server_host_key_algs=["ssh-ed25519"]))
    published = embedded.first["ssh_host_public_keys"][0]
    assert served.export_public_key("openssh").decode().split()[:2] == published.split()[:2]


def test_two_node_job_from_zero_workers(embedded: Embedded):
    login = embedded.login()
    pods = kjson("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=worker")["items"]
    assert pods == [], "worker pods exist before any job"
    two_node_job_from_zero_workers(login, "embedded")


def test_a_second_up_changes_nothing_and_keeps_the_keys(embedded: Embedded):
    t0 = time.monotonic()
    again = embedded.stack.up()
    print(f"embedded: second pulumi up {time.monotonic() - t0:.1f} s")
    changes = {k: v for k, v in (again.summary.resource_changes or {}).items() if k != "same"}
    assert changes == {}, f"a second up with nothing changed changed: {changes}"
    assert _outputs(again)["ssh_host_public_keys"] == embedded.first["ssh_host_public_keys"]


def test_destroy_keeps_the_volumes(embedded: Embedded):
    embedded.stack.destroy()
    claims = {c["metadata"]["name"] for c in kjson("get", "pvc", "-n", NAMESPACE)["items"]}
    assert {"home", "slurmctld-state"} <= claims, claims
    left = [p["metadata"]["name"] for p in kjson("get", "pods", "-n", NAMESPACE)["items"]
            if not p["metadata"].get("deletionTimestamp")]
    assert not [n for n in left if n.startswith(("slurmctld", "login"))], left
