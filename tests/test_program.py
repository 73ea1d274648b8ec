"""The Pulumi program under Pulumi's mocks: the resource graph, its options, and what leaves it."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from factories import aws_fleet, node, node_list
from provisioner.config import load_spec
from provisioner.deploy import program as prog
from provisioner.deploy.keys import DB_PASSWORD, HOST_KEYS, JWT_KEY, MUNGE_KEY, generate

ROOT = Path(__file__).resolve().parents[1]
LINUX = {"kubernetes.io/os": "linux"}


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return generate()


def _config(keys: dict[str, str], **extra: str) -> tuple[dict[str, str], list[str]]:
    cfg = {f"slurmk8s:{k}": v.rstrip("\n") for k, v in keys.items()}  # as `pulumi config set` stores them
    cfg.update({f"slurmk8s:{k}": v for k, v in extra.items()})
    return cfg, [f"slurmk8s:{k}" for k in keys]


def _local_nodes() -> list[dict]:
    return [node("localk8s", LINUX, cpu="2", memory="23Gi"),
            node("kwok-0", LINUX, taints=[{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}])]


def test_components_parent_their_resources(pulumi_run, keys):
    spec = load_spec(ROOT / "examples/local.yaml")
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)

    components = {r.name: r.type for r in run.resources if not r.custom}
    assert components == {
        "local": "slurmk8s:index:Cluster", "local-storage": "slurmk8s:index:Storage",
        "local-controller": "slurmk8s:index:Controller", "local-login": "slurmk8s:index:Login",
        "local-workers": "slurmk8s:index:WorkerPools", "local-network": "slurmk8s:index:NetworkPolicy",
        "local-accounting": "slurmk8s:index:Accounting",
    }
    by_parent: dict[str, set[str]] = {}
    for r in run.resources:
        if r.custom:
            by_parent.setdefault(r.parent.rsplit("::", 1)[-1], set()).add(r.type.split(":")[-1] + "/" + r.name)
    assert by_parent["local"] == {"Namespace/local-namespace", "kubernetes/local-k8s"}
    assert by_parent["local-storage"] == {"PersistentVolumeClaim/local-home"}
    assert by_parent["local-controller"] == {
        "Secret/local-slurm-auth", "ConfigMap/local-slurm-config", "ConfigMap/local-slurm-users",
        "ConfigMap/local-slurmk8s-spec", "ServiceAccount/local-slurmctld", "Role/local-slurmk8s-worker-pods",
        "RoleBinding/local-slurmk8s-worker-pods", "PersistentVolumeClaim/local-slurmctld-state",
        "Service/local-slurmctld", "StatefulSet/local-slurmctld",
        # cluster-scoped, named after the namespace; not retained: `down` deletes them
        "ValidatingAdmissionPolicy/local-slurmk8s-slurm-local-worker-pods",
        "ValidatingAdmissionPolicyBinding/local-slurmk8s-slurm-local-worker-pods",
        # its pinned pool: the pod renders from the nodes and follows them
        "ClusterRole/local-slurmk8s-slurm-local-read-nodes", "ClusterRoleBinding/local-slurmk8s-slurm-local-read-nodes"}
    assert by_parent["local-login"] == {"Secret/local-ssh-host-keys", "Secret/local-authorized-keys",
                                        "Deployment/local-login", "Service/local-login"}
    assert by_parent["local-workers"] == {"ConfigMap/local-worker-template-cpu", "Service/local-workers",
                                          "PodDisruptionBudget/local-workers"}
    assert by_parent["local-network"] == {"NetworkPolicy/local-intra-cluster", "NetworkPolicy/local-login-ssh",
                                          "NetworkPolicy/local-controller-metrics",
                                          "NetworkPolicy/local-slurmctld-from-cluster",
                                          "NetworkPolicy/local-login-from-cluster",
                                          "NetworkPolicy/local-database-from-slurmdbd"}
    assert by_parent["local-accounting"] == {
        "Secret/local-accounting-db", "PersistentVolumeClaim/local-accounting-db", "Service/local-mariadb",
        "StatefulSet/local-mariadb", "Secret/local-slurmdbd-conf", "Service/local-slurmdbd",
        "Deployment/local-slurmdbd"}
    assert not run.of_type(":Pod"), "no worker pods at rest"

    # every Kubernetes object waits for the namespace; PVCs and the namespace survive `down`
    ns_urn = next(r for r in run.resources if r.type.endswith(":Namespace"))
    (provider,) = [r for r in run.resources if r.type == "pulumi:providers:kubernetes"]
    assert provider.inputs["enableConfigMapMutable"] == "true" and provider.inputs["enableSecretMutable"] == "true"
    for r in run.kubernetes():
        assert "$pulumi:providers:kubernetes::local-k8s::" in r.provider, r.name  # never the default provider
        if not r.type.endswith(":Namespace"):
            assert any(d.endswith("::local-namespace") for d in r.dependencies), r.name
            assert r.delete_before_replace, r.name
    retained = sorted(r.name for r in run.resources if r.retain_on_delete)
    assert retained == ["local-accounting-db", "local-home", "local-namespace", "local-slurmctld-state"]
    assert run.outputs["kept_volumes"] == ["home", "slurmctld-state", "accounting-db"]
    conf = next(r for r in run.resources if r.name == "local-slurm-config").inputs["data"]["slurm.conf"]
    assert "AccountingStorageHost=slurmdbd.slurm-local.svc.cluster.local\n" in conf
    assert run.outputs["slurmdbd"] == "slurmdbd.slurm-local.svc.cluster.local:6819"
    assert ns_urn.retain_on_delete
    # slurmctld starts only once the policy that holds its pods to the templates is bound
    sts = next(r for r in run.resources if r.name == "local-slurmctld" and r.type.endswith("StatefulSet"))
    assert {"local-slurmk8s-slurm-local-worker-pods"} <= {d.rsplit("::", 1)[-1] for d in sts.dependencies}
    assert sum(d.rsplit("::", 1)[-1] == "local-slurmk8s-slurm-local-worker-pods" for d in sts.dependencies) == 2


def test_login_waits_for_storage_and_controller(pulumi_run, keys):
    spec = load_spec(ROOT / "examples/local.yaml")
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    login = next(r for r in run.resources if r.name == "local-login" and r.type.endswith("Deployment"))
    deps = {d.rsplit("::", 1)[-1] for d in login.dependencies}
    # a dependency on a component is a dependency on each of its children
    assert {"local-home", "local-slurm-auth", "local-slurm-users", "local-slurmctld", "local-namespace"} <= deps


def test_secrets_travel_as_pulumi_secrets_and_never_leave_in_plain_text(pulumi_run, keys):
    spec = load_spec(ROOT / "examples/local.yaml")
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)

    auth = next(r for r in run.resources if r.name == "local-slurm-auth")
    assert auth.secret_paths == ("data",) and auth.inputs["data"]["munge.key"] == keys[MUNGE_KEY]
    host = next(r for r in run.resources if r.name == "local-ssh-host-keys")
    assert host.secret_paths == ("stringData",)
    assert host.inputs["stringData"]["ssh_host_ed25519_key"] == keys[HOST_KEYS["ed25519"]]

    db = next(r for r in run.resources if r.name == "local-accounting-db" and r.type.endswith(":Secret"))
    assert db.secret_paths == ("stringData",) and db.inputs["stringData"]["password"] == keys[DB_PASSWORD]
    dbd_conf = next(r for r in run.resources if r.name == "local-slurmdbd-conf")
    assert "StoragePass=" not in json.dumps(dbd_conf.inputs)  # added in the slurmdbd pod from the password Secret
    needles = [keys[MUNGE_KEY], keys[MUNGE_KEY][:40], keys[DB_PASSWORD], keys[JWT_KEY][:40]] + [
        v.splitlines()[1] for k, v in keys.items() if k not in (MUNGE_KEY, DB_PASSWORD, JWT_KEY)]
    for cm in run.of_type(":ConfigMap") + [dbd_conf] + [r for r in run.kubernetes()
                                                        if r.type.split(":")[-1] in ("StatefulSet", "Deployment")]:
        text = json.dumps(cm.inputs)
        assert "PRIVATE KEY" not in text and not any(n in text for n in needles), cm.name
    exported = json.dumps(run.outputs, default=str)
    assert "PRIVATE KEY" not in exported and not any(n in exported for n in needles)
    # what is exported: names, addresses and public host keys
    assert run.outputs["namespace"] == "slurm-local"
    assert run.outputs["slurm_nodes"] == ["cpu-localk8s"]
    assert run.outputs["controller"] == "slurmctld-0.slurmctld.slurm-local.svc.cluster.local:6817"
    assert [k.split()[0] for k in run.outputs["ssh_host_public_keys"]] == [
        "ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"]
    assert run.outputs["excluded_k8s_nodes"] == ["kwok-0 (cpu): taint kwok.x-k8s.io/node=fake:NoSchedule is not tolerated"]


def test_stack_main_and_automation_program_build_the_same_graph(pulumi_run, keys, tmp_path, monkeypatch):
    """stacks/__main__.py (Pulumi CLI) and the inline program of `slurmk8s up` are one program."""
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps(node_list(_local_nodes())))
    spec_path = ROOT / "examples/local.yaml"

    cfg, secret = _config(keys, spec="../examples/local.yaml", nodes=str(nodes_file))
    monkeypatch.chdir(ROOT / "stacks")  # the Pulumi CLI runs the program in the project directory
    via_cli = pulumi_run.run(lambda: runpy.run_path(str(ROOT / "stacks/__main__.py"), run_name="__main__"),
                             cfg, secret)
    cli_graph = [(r.type, r.name, r.parent, json.dumps(r.inputs, sort_keys=True)) for r in via_cli.resources]
    cli_outputs = dict(via_cli.outputs)

    cfg, secret = _config(keys)
    via_auto = pulumi_run.run(prog.inline_program(load_spec(spec_path), _local_nodes()), cfg, secret)
    auto_graph = [(r.type, r.name, r.parent, json.dumps(r.inputs, sort_keys=True)) for r in via_auto.resources]
    assert len(cli_graph) == 44 and len(via_cli.kubernetes()) == 36  # with the admission policy, the node reader
    assert sorted(cli_graph) == sorted(auto_graph)
    assert cli_outputs == via_auto.outputs


def test_missing_keys_say_how_to_make_them(pulumi_run):
    import pulumi

    spec = load_spec(ROOT / "examples/local.yaml")
    with pytest.raises(pulumi.RunError, match="slurmk8s stack-secrets"):
        pulumi_run.run(prog.inline_program(spec, _local_nodes()), {}, [])


def test_no_wait_skips_await_on_everything(pulumi_run, keys):
    spec = load_spec(ROOT / "examples/local.yaml")
    cfg, secret = _config(keys, wait="false")
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    for r in run.kubernetes():
        assert r.inputs["metadata"]["annotations"][prog.SKIP_AWAIT] == "true", r.name
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    for r in run.kubernetes():
        skipped = prog.SKIP_AWAIT in (r.inputs["metadata"].get("annotations") or {})
        assert skipped == r.type.endswith(":PersistentVolumeClaim"), r.name  # claims are never awaited


def test_gpu_stack_pins_pods_and_exports_partitions(pulumi_run, keys):
    spec = load_spec(ROOT / "examples/aws-gpu.yaml")
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, aws_fleet(1, 2, 2)), cfg, secret)
    assert run.outputs["partitions"] == {"h100": [f"h100-ip-10-0-0-{i}" for i in range(4)]}
    template = next(r for r in run.resources if r.name == "research-worker-template-h100")
    pod = json.loads(template.inputs["data"]["pod.json"])
    assert pod["spec"]["containers"][0]["env"][2:] == [
        {"name": "SLURMK8S_MEMLOCK_UNLIMITED", "value": "1"},
        {"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "SLURMK8S_JOB_ENV", "value": "export NCCL_DEBUG=WARN\nexport NCCL_SOCKET_IFNAME=eth0\n"}]
    assert "resources" not in pod["spec"]["containers"][0]  # sizes are per node, filled in at resume
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}


# ---------------------------------------------------------------- the Automation API driver (no CLI needed)


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho v3.274.1\n")
    path.chmod(0o755)
    return path


def test_missing_cli_and_plugin_say_how_to_get_them(tmp_path):
    from provisioner.deploy import automation as a

    env = {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "empty"), "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path / "tc")}
    with pytest.raises(a.DeployError) as err:
        a.find_toolchain(env)
    text = str(err.value)
    assert "slurmk8s toolchain build pulumi pulumi-kubernetes" in text and "3.274.1" in text
    assert a.provider_version() in text

    _exe(tmp_path / "tc/bin/pulumi")
    with pytest.raises(a.DeployError) as err:
        a.find_toolchain(env)
    text = str(err.value)
    assert f"resource-kubernetes-v{a.provider_version()}" in text and "slurmk8s toolchain build pulumi-kubernetes" in text

    plugin = _exe(tmp_path / f"tc/pulumi-home/plugins/resource-kubernetes-v{a.provider_version()}/pulumi-resource-kubernetes")
    tool = a.find_toolchain(env)
    assert tool.pulumi == (tmp_path / "tc/bin/pulumi").resolve() and tool.plugin == plugin
    assert tool.pulumi_home == tmp_path / "tc/pulumi-home" and not tool.plugin_ambient
    # an operator's PULUMI_HOME and SLURMK8S_PULUMI win
    other = _exe(tmp_path / "elsewhere/bin/pulumi")
    home = tmp_path / "ph"
    _exe(home / f"plugins/resource-kubernetes-v{a.provider_version()}/pulumi-resource-kubernetes")
    tool = a.find_toolchain({**env, "SLURMK8S_PULUMI": str(other), "PULUMI_HOME": str(home)})
    assert tool.pulumi == other.resolve() and tool.pulumi_home == home and tool.root == str(other.resolve().parent.parent)


def test_engine_env_and_passphrase_file(tmp_path):
    from provisioner.deploy import automation as a

    state = a.state_dir(tmp_path / "state")
    assert (state / "backend").is_dir() and (state / "workspace").is_dir()
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    tool = a.Toolchain(tmp_path / "bin/pulumi", tmp_path / "ph", tmp_path / "plug/pulumi-resource-kubernetes", False)
    env = a.engine_env(tool, state, {"PATH": "/usr/bin"})
    assert env["PULUMI_SKIP_UPDATE_CHECK"] == "true" and env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == "true"
    assert env["PULUMI_HOME"] == str(tmp_path / "ph")
    pfile = Path(env["PULUMI_CONFIG_PASSPHRASE_FILE"])
    assert pfile == state / "passphrase" and oct(pfile.stat().st_mode & 0o777) == "0o600"
    secret = pfile.read_text()
    assert len(secret.strip()) >= 40 and secret not in json.dumps(env)
    assert a.engine_env(tool, state, {})["PULUMI_CONFIG_PASSPHRASE_FILE"] == str(pfile)
    assert pfile.read_text() == secret  # generated once
    # an operator's passphrase wins and no file is used
    assert "PULUMI_CONFIG_PASSPHRASE_FILE" not in a.engine_env(tool, state, {"PULUMI_CONFIG_PASSPHRASE": "x"})
    pfile.chmod(0o644)
    with pytest.raises(a.DeployError, match="chmod 600"):
        a.engine_env(tool, state, {})


def test_kubeconfig_resolution(tmp_path):
    from provisioner.deploy import automation as a

    kc = tmp_path / "kc"
    kc.write_text("x")

    class Saved:
        value = "/saved/kubeconfig"

    assert a.resolve_kubeconfig(str(kc), {a.KUBECONFIG_KEY: Saved()}, {}) == str(kc.resolve())
    assert a.resolve_kubeconfig(None, {a.KUBECONFIG_KEY: Saved()}, {"KUBECONFIG": str(kc)}) == "/saved/kubeconfig"
    assert a.resolve_kubeconfig(None, {}, {"KUBECONFIG": f"{kc}:/other"}) == str(kc.resolve())
    assert a.resolve_kubeconfig(None, {}, {"HOME": str(tmp_path)}) is None
    with pytest.raises(a.DeployError, match="no such file"):
        a.resolve_kubeconfig(str(tmp_path / "missing"), {}, {})


@pytest.mark.parametrize("stderr,needle", [
    ("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end or delete "
     "the lock file with `pulumi cancel`.", "--repair"),
    ("warning: Attempting to deploy or update resources with 2 pending operations from previous deployment.\n"
     "error: the current deployment has 2 resource(s) with pending operations", "pending operations"),
    ("error: could not load plugin for kubernetes provider: no resource plugin 'pulumi-resource-kubernetes' found",
     "slurmk8s toolchain build pulumi-kubernetes"),
    ("error: constructing secrets manager of type \"passphrase\": incorrect passphrase", "passphrase"),
])
def test_engine_errors_are_explained(tmp_path, stderr, needle):
    from provisioner.deploy import automation as a

    err = a._explain_command_error(Exception(stderr), "local", tmp_path)
    assert needle in str(err)


def test_toolchain_plugin_is_linked_into_the_state_home(tmp_path):
    from provisioner.deploy import automation as a

    env = {"HOME": str(tmp_path / "home"), "PATH": "", "SLURMK8S_TOOLCHAIN_DIR": str(tmp_path / "tc")}
    _exe(tmp_path / "tc/bin/pulumi")
    plugin = _exe(tmp_path / f"tc/pulumi-home/plugins/resource-kubernetes-v{a.provider_version()}/pulumi-resource-kubernetes")
    tool = a.find_toolchain(env)
    state = a.state_dir(tmp_path / "state")
    home = Path(a.engine_env(tool, state, env)["PULUMI_HOME"])
    assert home == state / "pulumi-home"
    linked = home / "plugins" / plugin.parent.name / plugin.name
    assert linked.is_file() and linked.resolve() == plugin.resolve()
    assert a.engine_env(tool, state, env)["PULUMI_HOME"] == str(home)  # idempotent
    # an operator's PULUMI_HOME is used as is
    assert a.engine_env(tool, state, {**env, "PULUMI_HOME": str(tmp_path / "tc/pulumi-home")})["PULUMI_HOME"] == \
        str(tmp_path / "tc/pulumi-home")


def test_idle_teardown_adds_the_tier_rbac_and_the_login_agent_account_first(pulumi_run, keys):
    from provisioner.config import parse_spec

    doc = load_spec(ROOT / "examples/local.yaml").model_dump(mode="json")
    doc["elasticity"]["idle_teardown"] = "30m"
    spec = parse_spec(doc)
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    by_parent: dict[str, set[str]] = {}
    for r in run.resources:
        if r.custom:
            by_parent.setdefault(r.parent.rsplit("::", 1)[-1], set()).add(r.type.split(":")[-1] + "/" + r.name)
    assert {"Role/local-slurmk8s-control-tier", "RoleBinding/local-slurmk8s-control-tier"} <= by_parent["local-controller"]
    assert {"ServiceAccount/local-login-agent", "Role/local-login-agent",
            "RoleBinding/local-login-agent"} <= by_parent["local-login"]
    login = next(r for r in run.resources if r.name == "local-login" and r.type.endswith("Deployment"))
    deps = {d.rsplit("::", 1)[-1] for d in login.dependencies}
    assert {"local-login-agent"} <= deps  # its pod names the account: created after it


def _rest_spec():
    from provisioner.config import parse_spec

    data = load_spec(ROOT / "examples/local.yaml").model_dump(mode="json", exclude_defaults=True)
    data["rest"] = {"enabled": True, "service_type": "NodePort"}
    return parse_spec(data)


def test_rest_objects_with_the_jwt_key_as_a_pulumi_secret(pulumi_run, keys):
    spec = _rest_spec()
    cfg, secret = _config(keys)
    run = pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    by_parent: dict[str, set[str]] = {}
    for r in run.kubernetes():
        by_parent.setdefault(r.parent.rsplit("::", 1)[-1], set()).add(f"{r.type.split(':')[-1]}/{r.name}")
    assert by_parent["local-rest"] == {"ConfigMap/local-slurmrestd-config", "Service/local-slurmrestd",
                                       "Deployment/local-slurmrestd"}
    # the key is the controller's: slurmctld mounts it, and slurmdbd waits for it (no deadlock on
    # the Rest component, which waits for slurmctld)
    assert "Secret/local-slurm-jwt" in by_parent["local-controller"]
    dbd = next(r for r in run.resources if r.name == "local-slurmdbd" and r.type.endswith("Deployment"))
    assert "local-slurm-jwt" in {d.rsplit("::", 1)[-1] for d in dbd.dependencies}
    jwt = next(r for r in run.resources if r.name == "local-slurm-jwt")
    assert jwt.secret_paths == ("data",) and jwt.inputs["data"]["jwt_hs256.key"] == keys[JWT_KEY]
    rest = next(r for r in run.resources if r.name == "local-slurmrestd" and r.type.endswith("Deployment"))
    assert "local-slurmctld" in {d.rsplit("::", 1)[-1] for d in rest.dependencies}  # the key is in place first
    for r in run.of_type(":ConfigMap") + [r for r in run.kubernetes()
                                          if r.type.split(":")[-1] in ("StatefulSet", "Deployment")]:
        assert keys[JWT_KEY][:40] not in json.dumps(r.inputs), r.name
    assert run.outputs["rest_url"] == "http://slurmrestd.slurm-local.svc.cluster.local:6820"
    assert "<rest_node_port>" in run.outputs["rest_hint"]
    assert keys[JWT_KEY][:40] not in json.dumps(run.outputs, default=str)


def test_rest_without_a_jwt_key_in_the_stack_says_how_to_make_it(pulumi_run, keys):
    spec = _rest_spec()
    cfg, secret = _config({k: v for k, v in keys.items() if k != JWT_KEY})
    with pytest.raises(Exception, match="stack-secrets"):
        pulumi_run.run(prog.inline_program(spec, _local_nodes()), cfg, secret)
    plain = load_spec(ROOT / "examples/local.yaml")  # without rest, an old stack needs no JWT key
    pulumi_run.run(prog.inline_program(plain, _local_nodes()), cfg, secret)  # no error


def test_a_host_network_slots_pool_admits_the_nodes_its_pods_may_land_on():
    """A slots pool has no Kubernetes node per Slurm node: its host-network pods may run on any node
    its node_selector (and domains) allow, so the NetworkPolicy admits those nodes' addresses
    (found by the P6 benchmark's spec: it admitted none, cutting such workers off where the CNI
    enforces NetworkPolicy)."""
    from provisioner.config import parse_spec
    from provisioner.generate import generate_for_kubernetes

    def with_ip(obj, ip):
        obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip}]
        return obj

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 a"
    spec = parse_spec({"name": "hn", "users": [{"name": "alice", "uid": 2001, "ssh_keys": [key]}], "pools": [
        {"name": "hostnet", "mode": "slots", "cpus": 1, "memory": "1Gi", "network": {"host_network": True},
         "node_selector": {"role": "mpi"}, "domain_label": "zone", "domains": [{"name": "z1", "count": 2}]}]})
    nodes = [with_ip(node("a", {"role": "mpi", "zone": "z1"}), "10.0.0.1"),
             with_ip(node("b", {"role": "mpi", "zone": "z2"}), "10.0.0.2"),  # outside the pool's domains
             with_ip(node("c", {"zone": "z1"}), "10.0.0.3")]  # outside its node_selector
    gen = generate_for_kubernetes(spec, nodes)
    assert prog.host_network_sources(spec, gen, nodes) == ("10.0.0.1/32",)


def test_pulumi_yaml_declares_every_config_key_the_program_reads():
    """stacks/Pulumi.yaml's `config:` block names each slurmk8s: key the program reads (the Pulumi
    CLI then refuses a stack that lacks one without a default, a plain value for a secret, a wrong
    type: e2e/test_e2e_stack_config.py runs it); jwtKey alone is left out (a secret has no default)."""
    import yaml

    from provisioner.deploy import keys
    from provisioner.deploy.owner import DESCRIPTION_CONFIG, OWNER_CONFIG

    declared = yaml.safe_load((ROOT / "stacks/Pulumi.yaml").read_text())["config"]
    ns = keys.CONFIG_NAMESPACE
    secret = {keys.MUNGE_KEY, keys.DB_PASSWORD, *keys.HOST_KEYS.values()}
    plain = {"spec", "wait", "clusterDomain", "nodes", OWNER_CONFIG, DESCRIPTION_CONFIG}
    assert set(declared) == {f"{ns}:{k}" for k in secret | plain}
    assert {k for k, d in declared.items() if d.get("secret")} == {f"{ns}:{k}" for k in secret}
    assert {k for k, d in declared.items() if "default" not in d} == {f"{ns}:{k}" for k in secret | {"spec"}}
    assert all(d.get("description") and d.get("type") in ("string", "boolean") for d in declared.values())
