"""Unit tests for provisioner.localk8s: fake-node manifests and the shipped scripts (no cluster)."""

from __future__ import annotations

import subprocess

import pytest

from provisioner.localk8s.kwok import (
    KWOK_ANNOTATION,
    KwokNodeError,
    KwokNodeSpec,
    kwok_node_list,
    kwok_node_manifest,
    node_names,
    parse_key_values,
)
from provisioner.localk8s.scripts import CLUSTER_SCRIPT, TOOLCHAIN_SCRIPT, script_argv, script_path


def test_manifest_is_selected_by_the_kwok_controller_and_tainted():
    node = kwok_node_manifest(KwokNodeSpec(name="fake-0"))
    assert node["kind"] == "Node"
    assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "fake-0"
    assert node["spec"]["taints"] == [{"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}]


def test_manifest_labels_and_capacity_override_defaults():
    spec = KwokNodeSpec(
        name="gpu-1",
        labels={"topology.kubernetes.io/zone": "z1", "type": "gpu"},
        capacity={"cpu": "64", "nvidia.com/gpu": "8"},
        taint=False,
    )
    node = kwok_node_manifest(spec)
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "z1"
    assert node["metadata"]["labels"]["type"] == "gpu"
    assert node["status"]["capacity"] == {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"}
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert "taints" not in node["spec"]


@pytest.mark.parametrize(
    "spec, match",
    [
        (KwokNodeSpec(name="n", labels={"bad key!": "x"}), "label key"),
        (KwokNodeSpec(name="n", labels={"ok": "-bad"}), "label value"),
        (KwokNodeSpec(name="n", capacity={"cpu": "lots"}), "quantity"),
        (KwokNodeSpec(name="Upper_Case"), "node name"),
    ],
)
def test_manifest_rejects_invalid_input(spec, match):
    with pytest.raises(KwokNodeError, match=match):
        kwok_node_manifest(spec)


def test_node_names():
    assert node_names("fake", 1) == ["fake"]
    assert node_names("fake", 3) == ["fake-0", "fake-1", "fake-2"]
    with pytest.raises(KwokNodeError):
        node_names("fake", 0)


def test_parse_key_values():
    assert parse_key_values(["a=b", "c=", "d=e=f"], "label") == {"a": "b", "c": "", "d": "e=f"}
    with pytest.raises(KwokNodeError, match="not KEY=VALUE"):
        parse_key_values(["novalue"], "label")


def test_node_list_wraps_items():
    lst = kwok_node_list([KwokNodeSpec(name="a"), KwokNodeSpec(name="b")])
    assert lst["kind"] == "List"
    assert [i["metadata"]["name"] for i in lst["items"]] == ["a", "b"]


@pytest.mark.parametrize("name", [TOOLCHAIN_SCRIPT, CLUSTER_SCRIPT])
def test_scripts_are_shipped_and_parse(name):
    path = script_path(name)
    assert script_argv(name, ["x"]) == ["bash", str(path), "x"]
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_toolchain_cache_keys_follow_versions(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path), "ETCD_VERSION": "v9.9.9"}
    out = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["versions"]), env=env, capture_output=True, text=True, check=True)
    keys = {line.split()[0]: line.split()[2] for line in out.stdout.splitlines()}
    assert keys["etcd"] == f"{tmp_path}/etcd-v9.9.9"
    assert keys["kubernetes"] == f"{tmp_path}/kubernetes-v1.34.4"
    path = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["path"]), env=env, capture_output=True, text=True, check=True)
    assert path.stdout.strip() == f"{tmp_path}/bin"


def test_toolchain_check_names_missing_tools(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path)}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["check"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "kube-apiserver" in done.stderr and "toolchain build" in done.stderr


def test_cluster_up_without_toolchain_says_to_build_it(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_BIN": str(tmp_path / "bin"), "LOCALK8S_ROOT": str(tmp_path / "state")}
    done = subprocess.run(script_argv(CLUSTER_SCRIPT, ["up"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "toolchain build" in done.stderr


def test_cluster_restart_names_what_it_can_restart(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURMK8S_BIN": str(tmp_path / "bin"), "LOCALK8S_ROOT": str(tmp_path / "state")}
    done = subprocess.run(script_argv(CLUSTER_SCRIPT, ["restart", "etcd"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "restart kube-apiserver|kubelet|kube-controller-manager|kube-scheduler" in done.stderr
    done = subprocess.run(script_argv(CLUSTER_SCRIPT, ["restart", "kubelet", "--down-for", "x"]), env=env,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "whole seconds" in done.stderr
    # not running here (empty state dir): says so instead of starting a second kubelet
    done = subprocess.run(script_argv(CLUSTER_SCRIPT, ["restart", "kubelet"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "kubelet is not running" in done.stderr, done.stderr


def _fake_tool(directory, name, output):
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


def test_toolchain_uses_an_installed_tool_at_the_pinned_version(tmp_path):
    onpath = tmp_path / "onpath"
    onpath.mkdir()
    fake = _fake_tool(onpath, "helm", "v3.22.0")
    env = {"PATH": f"{onpath}:/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path / "cache")}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["build", "helm"]), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"using installed {fake}" in done.stdout
    assert (tmp_path / "cache" / "bin" / "helm").resolve() == fake


def test_toolchain_does_not_use_an_installed_tool_at_another_version(tmp_path):
    onpath = tmp_path / "onpath"
    onpath.mkdir()
    _fake_tool(onpath, "helm", "v3.1.0")
    env = {"PATH": f"{onpath}:/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path / "cache")}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["build", "helm"]), env=env, capture_output=True, text=True)
    # no Go on this PATH: it would build, and says what it needs
    assert done.returncode == 1
    assert "go not found" in done.stderr and "helm" in done.stderr


def test_toolchain_failure_names_the_tool_and_its_log(tmp_path):
    onpath = tmp_path / "onpath"
    onpath.mkdir()
    (onpath / "go").write_text("#!/bin/sh\necho 'go: simulated failure' >&2\nexit 1\n")
    (onpath / "go").chmod(0o755)
    cache = tmp_path / "cache"
    env = {"PATH": f"{onpath}:/usr/bin:/bin", "SLURMK8S_TOOLCHAIN_DIR": str(cache), "ETCD_VERSION": "v0.0.1"}
    done = subprocess.run(script_argv(TOOLCHAIN_SCRIPT, ["build", "etcd"]), env=env, capture_output=True, text=True)
    assert done.returncode == 1
    log = cache / "logs" / "etcd-v0.0.1.log"
    assert "etcd v0.0.1: FAILED" in done.stdout and str(log) in done.stdout
    assert "simulated failure" in log.read_text()
    assert not (cache / "bin" / "etcd").exists()
