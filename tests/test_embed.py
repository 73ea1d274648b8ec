"""The public component, SlurmCluster, embedded in a program of one's own (examples/pulumi-embed)
under Pulumi's mocks: the program's provider carries every object, the keys are a resource of the
stack (their dynamic provider's create runs, as the engine would run it), and the objects are those
`slurmk8s up` declares for the same spec."""

from __future__ import annotations

import runpy
from pathlib import Path

import pulumi
import pytest

from factories import node
from provisioner.config import load_spec
from provisioner.deploy import SlurmCluster
from provisioner.deploy import program as prog
from provisioner.deploy.keys import DB_PASSWORD, HOST_KEYS, JWT_KEY, MUNGE_KEY, SECRET_KEYS, generate, public_key
from provisioner.deploy.stackkeys import KeysProvider

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pulumi-embed"
KEYS_TYPE = "pulumi-python:dynamic/slurmk8s:ClusterKeys"


def _example(pulumi_run, spec: Path = EXAMPLE / "cluster.yaml"):
    return pulumi_run.run(lambda: runpy.run_path(str(EXAMPLE / "__main__.py")),
                          {"research-platform:spec": str(spec)}, project="research-platform")


def test_the_example_puts_every_object_on_its_own_provider(pulumi_run):
    run = _example(pulumi_run)
    providers = [r for r in run.resources if r.type == "pulumi:providers:kubernetes"]
    assert [p.name for p in providers] == ["k8s"], "the component must not make a provider of its own"
    objs = run.kubernetes()
    assert objs and all(r.provider.split("::")[-2] == "k8s" for r in objs if not r.type.startswith("pulumi-python"))
    keys = run.of_type("dynamic/slurmk8s:ClusterKeys")
    assert [(k.name, k.parent.rsplit("::", 1)[-1]) for k in keys] == [("research-keys", "research")]


def test_the_same_objects_as_slurmk8s_up_for_the_same_spec(pulumi_run):
    """The component is the one `up` runs: its Kubernetes objects, named and parented alike."""
    def objects(run):
        return sorted((r.type, r.name, r.parent.rsplit("::", 1)[-1]) for r in run.kubernetes()
                      if r.type != KEYS_TYPE)

    embedded = objects(_example(pulumi_run))
    cfg = {f"slurmk8s:{k}": v for k, v in generate().items()}
    up = objects(pulumi_run.run(prog.inline_program(load_spec(EXAMPLE / "cluster.yaml"), []), cfg, list(cfg)))
    assert embedded == up


def test_keys_are_made_once_as_stack_secrets_and_reach_the_pods(pulumi_run):
    run = _example(pulumi_run)
    keys = run.of_type("dynamic/slurmk8s:ClusterKeys")[0]
    auth = next(r for r in run.of_type(":Secret") if r.name == "research-slurm-auth")
    assert "data" in auth.secret_paths, "the munge key must travel as a Pulumi secret"
    assert next(iter(auth.inputs["data"].values())), auth.inputs
    hosts = next(r for r in run.of_type(":Secret") if r.name == "research-ssh-host-keys")
    assert "stringData" in hosts.secret_paths or "data" in hosts.secret_paths, hosts.secret_paths
    published = run.outputs["ssh_host_public_keys"]
    assert [k.split()[0] for k in published] == ["ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"], published
    assert keys.inputs.get(MUNGE_KEY) is None, "the keys are outputs of the resource, never its inputs"


def test_outputs_say_where_to_log_in(pulumi_run):
    run = _example(pulumi_run)
    assert run.outputs["namespace"] == "slurm-research"
    assert run.outputs["login_address"] == "login.slurm-research.svc.cluster.local:22"
    assert run.outputs["rest_url"] is None


def test_a_spec_as_a_dict_and_nodes_given(pulumi_run):
    import yaml

    data = yaml.safe_load((EXAMPLE / "cluster.yaml").read_text())
    data["pools"].append({"name": "pin", "node_selector": {"kubernetes.io/os": "linux"}, "partition": "pinned"})
    box = {}

    def program():
        box["c"] = SlurmCluster("r", data, nodes=[node("n1", {"kubernetes.io/os": "linux"}, cpu="8", memory="32Gi")],
                                opts=pulumi.ResourceOptions(provider=pulumi.ProviderResource("kubernetes", "p")))
        pulumi.export("nodes", box["c"].node_names)
        pulumi.export("partitions", box["c"].partitions)

    run = pulumi_run.run(program)
    assert "pin-n1" in run.outputs["nodes"] and run.outputs["partitions"]["pinned"] == ["pin-n1"], run.outputs


def test_host_network_pools_without_nodes_say_what_to_pass(pulumi_run, tmp_path):
    import yaml

    data = yaml.safe_load((EXAMPLE / "cluster.yaml").read_text())
    data["pools"][0]["network"] = {"host_network": True}
    spec = tmp_path / "hn.yaml"
    spec.write_text(yaml.safe_dump(data))
    with pytest.raises(Exception, match=r"pools cpu use network.host_network.*pass nodes="):
        _example(pulumi_run, spec)


def test_the_keys_provider_keeps_what_it_made_and_makes_what_is_missing():
    p = KeysProvider()
    made = p.create({}).outs
    assert set(made) == set(SECRET_KEYS)
    public_key(made[HOST_KEYS["ed25519"]])  # a real OpenSSH private key
    assert p.diff("id", dict(made), {}).changes is False
    old = {k: v for k, v in made.items() if k != JWT_KEY}  # a state from before a key existed
    assert p.diff("id", old, {}).changes is True
    outs = p.update("id", old, {}).outs
    assert {k: outs[k] for k in old} == old and outs[JWT_KEY] and outs[DB_PASSWORD] == made[DB_PASSWORD]


def test_the_engine_finds_pythons_dynamic_provider(tmp_path):
    """A CLI built from source lacks Pulumi's `pulumi-resource-pulumi-python`: the engine's PATH gets one
    that runs this Python; a CLI that ships its own (or one on PATH) is left alone."""
    import os
    import subprocess
    import sys

    from provisioner.deploy import automation as a

    state = a.state_dir(tmp_path / "state")
    tool = a.Toolchain(tmp_path / "bin/pulumi", tmp_path / "ph", tmp_path / "plug/pulumi-resource-kubernetes", False)
    env = a.engine_env(tool, state, {"PATH": "/usr/bin"})
    script = state / "bin" / a.DYNAMIC_PROVIDER
    assert env["PATH"].split(os.pathsep)[1] == str(script.parent) and os.access(script, os.X_OK)
    assert env["SLURMK8S_PYTHON"] == sys.executable
    # it starts Python's dynamic provider, which serves the engine on the port it prints first
    proc = subprocess.Popen([str(script)], env={**env, "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip().isdigit()
    finally:
        proc.kill()
        proc.wait(timeout=10)

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / a.DYNAMIC_PROVIDER).write_text("#!/bin/sh\n")
    assert str(script.parent) not in a.engine_env(tool, state, {"PATH": "/usr/bin"})["PATH"].split(os.pathsep)


def test_a_provider_inherited_from_the_parent_component_is_used(pulumi_run):
    """A platform program's own component holds the Kubernetes provider; SlurmCluster as its child
    must use it, not make one from the default kubeconfig (another cluster, silently)."""
    box = {}

    def program():
        provider = pulumi.ProviderResource("kubernetes", "platform-k8s")
        platform = pulumi.ComponentResource("acme:index:Platform", "platform", None,
                                            pulumi.ResourceOptions(providers={"kubernetes": provider}))
        box["c"] = SlurmCluster("research", EXAMPLE / "cluster.yaml", opts=pulumi.ResourceOptions(parent=platform))

    run = pulumi_run.run(program)
    assert [p.name for p in run.resources if p.type == "pulumi:providers:kubernetes"] == ["platform-k8s"]
    ns = next(r for r in run.of_type(":Namespace"))
    assert ns.provider.split("::")[-2] == "platform-k8s", ns.provider
