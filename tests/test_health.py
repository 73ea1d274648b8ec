"""Unit tests of the worker health checks (provisioner/health.py): each check passes and fails on
fake measurements; the runner drains with the right argv; thresholds come from slurm.conf."""

from __future__ import annotations

import json

import pytest

from provisioner import health
from provisioner.config import parse_spec
from provisioner.errors import SpecError
from provisioner.health import FAIL, MIB, OK, SKIP, Config, FsStat, Proc, SlurmNode

GIB = 1024 * MIB


def node(real=1024, alloc=0, gpus=0, state=("IDLE",), reason="") -> SlurmNode:
    return SlurmNode("cpu-0", real, alloc, gpus, tuple(state), reason)


# ---------------------------------------------------------------- disk and /dev/shm


def test_disk_passes_with_headroom_and_counts_a_file_system_once():
    stats = {"/": FsStat(100 * GIB, 50 * GIB, fsid=1), "/tmp": FsStat(100 * GIB, 50 * GIB, fsid=1),
             "/var/spool/slurmd": None}
    r = health.check_disk(stats, 1024)
    assert r.status == OK and r.detail == "free: / 51200MiB"


def test_disk_fails_below_threshold_naming_the_path():
    stats = {"/": FsStat(100 * GIB, 50 * GIB, fsid=1), "/tmp": FsStat(GIB, 100 * MIB, fsid=2)}
    r = health.check_disk(stats, 1024)
    assert r.status == FAIL
    assert r.detail == "/tmp has 100MiB free, below 1024MiB"


def test_disk_skips_when_no_path_exists():
    assert health.check_disk({"/nope": None}, 1).status == SKIP


def test_shm_pass_fail_and_missing():
    assert health.check_shm(FsStat(512 * MIB, 500 * MIB), 64).status == OK
    small = health.check_shm(FsStat(64 * MIB, 64 * MIB), 256)
    assert small.status == FAIL and small.detail == "/dev/shm is 64MiB, below 256MiB"
    assert health.check_shm(None, 64).status == FAIL


# ---------------------------------------------------------------- memory

MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:    {avail} kB
HugePages_Total:       0
"""


def test_meminfo_parsing():
    info = health.parse_meminfo(MEMINFO.format(avail=2048 * 1024))
    assert info["MemAvailable"] == 2 * GIB and info["HugePages_Total"] == 0


def test_memory_passes_when_available_covers_real_memory():
    info = health.parse_meminfo(MEMINFO.format(avail=2048 * 1024))
    assert health.check_memory(info, None, None, node(real=1024), 0.9).status == OK


def test_memory_fails_when_host_is_short():
    info = health.parse_meminfo(MEMINFO.format(avail=512 * 1024))
    r = health.check_memory(info, None, None, node(real=1024), 0.9)
    assert r.status == FAIL and "512MiB available (host MemAvailable)" in r.detail


def test_memory_counts_what_jobs_hold_and_the_pod_limit():
    info = health.parse_meminfo(MEMINFO.format(avail=64 * 1024 * 1024))  # host: 64 GiB free
    # pod limit 1 GiB, 900 MiB used: only 124 MiB left for a node that promises 1024 MiB
    r = health.check_memory(info, GIB, 900 * MIB, node(real=1024), 0.9)
    assert r.status == FAIL and "pod cgroup limit" in r.detail
    # ... unless a job holds that memory: then it is in use, not missing
    assert health.check_memory(info, GIB, 900 * MIB, node(real=1024, alloc=900), 0.9).status == OK


def test_memory_skips_without_node_record_and_fails_without_meminfo():
    assert health.check_memory({}, None, None, None, 0.9).status == SKIP
    assert health.check_memory({}, None, None, node(), 0.9).status == FAIL


def test_cgroup_memory_v2_and_unlimited(tmp_path):
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert health.cgroup_memory(str(tmp_path)) == (GIB, 1000)
    # page cache that can be dropped is not counted as used
    (tmp_path / "memory.current").write_text(f"{900 * MIB}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1000\ninactive_file {800 * MIB}\nactive_file 5\n")
    assert health.cgroup_memory(str(tmp_path)) == (GIB, 100 * MIB)
    (tmp_path / "memory.max").write_text("max\n")
    assert health.cgroup_memory(str(tmp_path)) == (None, None)


# ---------------------------------------------------------------- MPI


def test_mpi_results():
    assert health.check_mpi(False, True, None, 0).status == SKIP
    assert health.check_mpi(True, False, None, 0).status == SKIP
    assert health.check_mpi(True, True, Proc(0, "mpi-loopback ok 2\n"), 0.4).status == OK
    bad = health.check_mpi(True, True, Proc(1, "", "prte: no slots\nmpirun: error X\n"), 0.4)
    assert bad.status == FAIL and bad.detail == "2-rank loopback exit 1: mpirun: error X"
    framed = Proc(3, "", "mpi-loopback: broken\n-----\nprterun detected that one or more processes exited\n-----\n")
    assert health.check_mpi(True, True, framed, 0.4).detail == "2-rank loopback exit 3: mpi-loopback: broken"
    assert health.check_mpi(True, True, None, 10).status == FAIL  # timed out
    assert health.check_mpi(True, True, Proc(0, "mpi-loopback ok 1\n"), 0.4).status == FAIL


def test_mpi_env_drops_slurm_and_allows_root():
    env = health.mpi_env({"PATH": "/bin", "SLURM_JOB_ID": "3", "SLURMD_NODENAME": "x", "OMPI_MCA_x": "1"})
    assert env == {"PATH": "/bin", "HOME": "/root", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    # slurmd's nearly empty environment: OpenMPI needs HOME ("Failed initializing opal" without it)
    assert health.mpi_env({})["HOME"] == "/root" and "/usr/bin" in health.mpi_env({})["PATH"]


# ---------------------------------------------------------------- GPU


@pytest.mark.parametrize("gres,count", [("", 0), ("gpu:2", 2), ("gpu:h100:8(S:0-1)", 8),
                                        ("gpu:a100:4(S:0),gpu:t4:1", 5), ("rdma:1", 0), ("gpu", 1)])
def test_gres_gpu_count(gres, count):
    assert health.parse_gres_gpus(gres) == count


SMI_L = "GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n"


def test_gpu_skipped_with_reason_without_gpus_or_when_disabled():
    r = health.check_gpu(True, node(gpus=0), None, None)
    assert r.status == SKIP and r.detail == "no GPU expected (the node's Gres has none)"
    assert health.check_gpu(False, node(gpus=2), None, None).status == SKIP


def test_gpu_passes_and_fails():
    assert health.check_gpu(True, node(gpus=2), Proc(0, SMI_L), Proc(0, "table")).status == OK
    missing = health.check_gpu(True, node(gpus=4), Proc(0, SMI_L), Proc(0, "table"))
    assert missing.status == FAIL and missing.detail == "nvidia-smi -L lists 2 GPUs, Gres expects 4"
    assert health.check_gpu(True, node(gpus=2), None, None).status == FAIL  # no nvidia-smi
    sick = health.check_gpu(True, node(gpus=2), Proc(0, SMI_L), Proc(15, "", "GPU is lost"))
    assert sick.status == FAIL and "GPU is lost" in sick.detail


# ---------------------------------------------------------------- config


def test_thresholds_from_the_slurm_conf_line_and_env():
    conf = "ClusterName=x\n#slurmk8s-health min_disk_free_mb=10 min_shm_mb=7 mpi_loopback=0 gpu=1 bogus=3\n"
    cfg, warnings = health.load_config(conf, {"SLURMK8S_HEALTH_MIN_SHM_MB": "9"})
    assert (cfg.min_disk_free_mb, cfg.min_shm_mb, cfg.mpi_loopback, cfg.gpu) == (10, 9, False, True)
    assert warnings == ["unknown setting bogus=3 ignored"]
    cfg, warnings = health.load_config(None, {"SLURMK8S_HEALTH_MIN_SHM_MB": "lots"})
    assert cfg == Config() and "bad value min_shm_mb=lots" in warnings[0]


def test_rendered_line_is_read_back_by_the_check():
    spec = parse_spec({"name": "c", "pools": [{"name": "cpu"}],
                       "health": {"min_disk_free": "2Gi", "min_shm": "1Gi", "mpi_loopback": False}})
    cfg, warnings = health.load_config(spec.health.conf_line() + "\n", {})
    assert not warnings
    assert (cfg.min_disk_free_mb, cfg.min_shm_mb, cfg.mpi_loopback, cfg.gpu) == (2048, 1024, False, True)


def test_spec_refuses_a_pool_shm_below_min_shm_and_a_tiny_interval():
    with pytest.raises(SpecError, match="below health.min_shm"):
        parse_spec({"name": "c", "pools": [{"name": "cpu", "shm_size": "32Mi"}], "health": {"min_shm": "64Mi"}})
    with pytest.raises(SpecError, match="interval"):
        parse_spec({"name": "c", "pools": [{"name": "cpu"}], "health": {"interval": 2}})


# ---------------------------------------------------------------- the runner


NODE_JSON = json.dumps({"nodes": [{"name": "cpu-0", "real_memory": 1024, "alloc_memory": 0, "gres": "",
                                   "state": ["IDLE"], "reason": ""}]})


class FakeRunner:
    def __init__(self, node_json: str = NODE_JSON, drain_rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.node_json = node_json
        self.drain_rc = drain_rc

    def __call__(self, argv, timeout, env=None):
        self.calls.append(list(argv))
        if argv[:2] == ["scontrol", "show"]:
            return Proc(0, self.node_json)
        if argv[:2] == ["scontrol", "update"]:
            return Proc(self.drain_rc, "", "" if self.drain_rc == 0 else "Invalid user id")
        if argv[0] == "mpirun":
            return Proc(0, "mpi-loopback ok 2\n")
        raise AssertionError(f"unexpected command {argv}")


def test_runner_passes_on_a_healthy_node(monkeypatch):
    monkeypatch.setattr(health, "read_text", lambda p: MEMINFO.format(avail=4 * 1024 * 1024) if p == "/proc/meminfo" else None)
    monkeypatch.setattr(health, "statvfs", lambda p: FsStat(100 * GIB, 50 * GIB, fsid=1))
    run = FakeRunner()
    env = {"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": ""}
    assert health.main([], env=env, runner=run) == 0
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]


def test_runner_drains_with_the_reason_and_exits_1(monkeypatch):
    monkeypatch.setattr(health, "read_text", lambda p: MEMINFO.format(avail=4 * 1024 * 1024) if p == "/proc/meminfo" else None)
    monkeypatch.setattr(health, "statvfs", lambda p: FsStat(32 * MIB, 32 * MIB, fsid=hash(p)))
    run = FakeRunner()
    env = {"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": "", "SLURMK8S_HEALTH_MIN_DISK_FREE_MB": "1"}
    assert health.main([], env=env, runner=run) == 1
    drains = [c for c in run.calls if c[:2] == ["scontrol", "update"]]
    assert drains == [["scontrol", "update", "nodename=cpu-0", "state=DRAIN",
                       "reason=health: shm: /dev/shm is 32MiB, below 64MiB"]]


def test_runner_keeps_an_existing_drain_reason_and_honours_no_drain(monkeypatch):
    monkeypatch.setattr(health, "read_text", lambda p: None)  # no /proc/meminfo: memory fails
    monkeypatch.setattr(health, "statvfs", lambda p: FsStat(100 * GIB, 50 * GIB, fsid=1))
    drained = json.dumps({"nodes": [{"name": "cpu-0", "real_memory": 1024, "state": ["IDLE", "DRAIN"],
                                     "reason": "operator: bad DIMM"}]})
    run = FakeRunner(drained)
    env = {"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": ""}
    assert health.main([], env=env, runner=run) == 1
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]
    run = FakeRunner()
    assert health.main(["--no-drain"], env=env, runner=run) == 1
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]


@pytest.mark.parametrize("flag", ["POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN"])
def test_a_node_on_its_way_down_is_not_drained_again(monkeypatch, flag):
    """Suspending an idle node clears its DRAIN (idle_on_node_suspend) so that its next resume
    gets a fresh worker; a periodic check of the old worker in the grace before it is gone must
    not drain it again, or the node stays drained while powered down (CI stop 49)."""
    monkeypatch.setattr(health, "read_text", lambda p: None)  # no /proc/meminfo: memory fails
    monkeypatch.setattr(health, "statvfs", lambda p: FsStat(100 * GIB, 50 * GIB, fsid=1))
    leaving = json.dumps({"nodes": [{"name": "cpu-0", "real_memory": 1024, "state": ["IDLE", flag],
                                     "reason": ""}]})
    run = FakeRunner(leaving)
    lines: list[str] = []
    monkeypatch.setattr(health.Log, "write", lambda self, message: lines.append(message))
    assert health.main([], env={"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": ""}, runner=run) == 1
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]
    assert any(f"not draining: the node is {flag}" in line for line in lines), lines


def test_drain_reason_is_bounded_and_counts_the_other_failures():
    failed = [health.Result("disk", FAIL, 'x"' * 300), health.Result("shm", FAIL, "small")]
    reason = health.drain_reason(failed)
    assert reason.startswith("health: disk: x'") and len(reason) <= health.REASON_MAX and '"' not in reason


def test_rendered_slurm_conf_sets_the_health_check_only_when_enabled():
    from provisioner.generate import generate
    from provisioner.inventory import nodes_from_api
    from provisioner.render import Site

    from factories import node as k8s_node

    nodes = nodes_from_api([k8s_node("n0", {"pool": "cpu"}, cpu="4", memory="8Gi")])
    base = {"name": "c", "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}}]}
    conf = generate(parse_spec({**base, "health": {"interval": "2m"}}), nodes, Site()).files["slurm.conf"]
    assert "HealthCheckProgram=/usr/local/bin/slurmk8s-healthcheck\n" in conf
    assert "HealthCheckInterval=120\n" in conf and "HealthCheckNodeState=ANY,CYCLE\n" in conf
    assert "\n#slurmk8s-health min_disk_free_mb=1024 " in conf
    off = generate(parse_spec({**base, "health": {"enabled": False}}), nodes, Site()).files["slurm.conf"]
    assert "HealthCheck" not in off and "#slurmk8s-health" not in off


# ---------------------------------------------------------------- the MPI run started with the pod


def _healthy(monkeypatch):
    monkeypatch.setattr(health, "read_text", lambda p: MEMINFO.format(avail=4 * 1024 * 1024) if p == "/proc/meminfo" else None)
    monkeypatch.setattr(health, "statvfs", lambda p: FsStat(100 * GIB, 50 * GIB, fsid=1))
    real_access = health.os.access
    monkeypatch.setattr(health.os, "access", lambda p, mode: p == health.MPI_PROBE or real_access(p, mode))


def test_slurmds_first_check_takes_the_mpi_run_the_entrypoint_started(monkeypatch, tmp_path):
    """The entrypoint runs `--mpi-boot` beside the pod's start; the check slurmd runs before it
    registers uses that result (no second mpirun) and removes it; the next check runs its own."""
    _healthy(monkeypatch)
    boot = str(tmp_path / "boot.json")
    env = {"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": "", "SLURMK8S_HEALTH_BOOT_MPI": boot}
    (tmp_path / "boot.json.pending").write_text("")
    entry = FakeRunner()
    assert health.main(["--mpi-boot"], env=env, runner=entry) == 0
    assert [c[0] for c in entry.calls] == ["mpirun"] and not (tmp_path / "boot.json.pending").exists()
    first = FakeRunner()
    results, _ = health.gather(Config(), "cpu-0", env, first)
    assert "mpirun" not in [c[0] for c in first.calls]
    assert [r.status for r in results if r.check == "mpi"] == [OK] and not (tmp_path / "boot.json").exists()
    later = FakeRunner()
    health.gather(Config(), "cpu-0", env, later)
    assert "mpirun" in [c[0] for c in later.calls]


def test_the_first_check_waits_for_a_boot_run_under_way_and_fails_one_that_never_ends(monkeypatch, tmp_path):
    import threading

    _healthy(monkeypatch)
    boot = str(tmp_path / "boot.json")
    env = {"SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_LOG": "", "SLURMK8S_HEALTH_BOOT_MPI": boot}
    (tmp_path / "boot.json.pending").write_text("")
    failing = lambda argv, timeout, env=None: Proc(1, "", "mpirun: shm too small")  # noqa: E731
    threading.Timer(0.2, health.run_boot_mpi, args=(boot, {}, 5, failing)).start()
    results, _ = health.gather(Config(), "cpu-0", env, FakeRunner())
    (mpi,) = [r for r in results if r.check == "mpi"]
    assert mpi.status == FAIL and "exit 1" in mpi.detail
    (tmp_path / "boot.json.pending").write_text("")  # a boot run that died without a word
    results, _ = health.gather(Config(mpi_timeout=0.3), "cpu-0", env, FakeRunner())
    (mpi,) = [r for r in results if r.check == "mpi"]
    assert mpi.status == FAIL and "timed out" in mpi.detail
    assert not list(tmp_path.iterdir())
