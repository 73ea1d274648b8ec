"""Unit tests for the elasticity programs: plans, input parsing, execution with fakes (no Docker)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurm

from provisioner.elastic import programs, prolog
from provisioner.elastic.backend import BACKENDS, BackendError, Worker, backend_from_env
from provisioner.elastic.docker_backend import DockerConfig, container_spec
from provisioner.elastic.plan import (
    Action,
    InputError,
    Reason,
    parse_hostlists,
    parse_resume_file,
    plan_resume,
    plan_resume_fail,
    plan_suspend,
)
from provisioner.elastic.programs import (
    Context,
    Log,
    run_resume,
    run_resume_fail,
    run_suspend,
)
from provisioner.elastic.prolog import wait_for_boot
from provisioner.inventory import Inventory, SlurmNode
from provisioner.slurm.commands import NODE_ADDR_GONE, down_argv, power_down_argv, resume_argv

RESUME_FILE = json.dumps({
    "all_nodes_resume": "cpu-[0-2]",
    "jobs": [
        {"job_id": 11, "nodes_resume": "cpu-[0-1]", "nodes_alloc": "cpu-[0-1]", "partition": "cpu",
         "features": "", "oversubscribe": "NO", "reservation": "", "extra": None},
        {"job_id": 12, "nodes_resume": "cpu-2", "nodes_alloc": "cpu-[2-3]", "partition": "cpu"},
    ],
})


def inventory(n: int = 4, unavailable: dict[str, str] | None = None) -> Inventory:
    unavailable = unavailable or {}
    return Inventory(tuple(
        SlurmNode(f"cpu-{i}", "cpu", "cpu", 2, 1024, unavailable=unavailable.get(f"cpu-{i}")) for i in range(n)))


def ctx(backend=None, slurm=None, inv=None, **env) -> Context:
    return Context({"SLURMK8S_BUDGET": "5", **env}, Log("test"), backend=backend or FakeBackend(),
                   slurm=slurm or FakeSlurm(), inventory=inv or inventory())


# ---------------------------------------------------------------- parsing


def test_hostlists_expand_dedupe_and_keep_order():
    assert parse_hostlists(["cpu-[2-3],cpu-0", "cpu-2"]) == ["cpu-2", "cpu-3", "cpu-0"]
    assert parse_hostlists([""]) == []


def test_bad_hostlist_is_an_input_error():
    with pytest.raises(InputError, match="bad hostlist"):
        parse_hostlists(["cpu-[0-"])


def test_resume_file_24_11_shape():
    req = parse_resume_file(RESUME_FILE)
    assert req.all_nodes == ("cpu-0", "cpu-1", "cpu-2")
    assert [j.job_id for j in req.jobs] == [11, 12]
    assert req.jobs[1].nodes_alloc == ("cpu-2", "cpu-3")
    assert req.jobs_of("cpu-1") == (11,)
    assert req.jobs_of("cpu-3") == (12,)  # allocated to job 12 (resumed by an earlier call)
    assert req.jobs_of("cpu-9") == ()


@pytest.mark.parametrize("text, match", [
    ("not json", "not JSON"),
    ("[1]", "not a JSON object"),
    ('{"jobs": [{"nodes_resume": "a"}]}', "job_id"),
])
def test_bad_resume_file(text, match):
    with pytest.raises(InputError, match=match):
        parse_resume_file(text)


# ---------------------------------------------------------------- plans


def test_plan_resume_classifies_every_node():
    workers = {
        "cpu-1": Worker("cpu-1", "Running"),
        "cpu-2": Worker("cpu-2", "Failed", reason="Exited (1) 3 seconds ago"),
        "cpu-3": Worker("cpu-3", "Pending"),
    }
    inv = inventory(5, unavailable={"cpu-4": "kubernetes node k4 is cordoned"})
    decisions = plan_resume(["cpu-0", "cpu-1", "cpu-2", "cpu-3", "cpu-4", "gpu-0"], inv, workers,
                            parse_resume_file(RESUME_FILE))
    got = {d.node: (d.action, d.reason) for d in decisions}
    assert got == {
        "cpu-0": (Action.CREATE, Reason.RESUME),
        "cpu-1": (Action.ADOPT, Reason.ALREADY_RUNNING),
        "cpu-2": (Action.REPLACE, Reason.WORKER_DEAD),
        "cpu-3": (Action.ADOPT, Reason.ALREADY_RUNNING),
        "cpu-4": (Action.FAIL, Reason.UNAVAILABLE),
        "gpu-0": (Action.FAIL, Reason.UNKNOWN_NODE),
    }
    by = {d.node: d for d in decisions}
    assert by["cpu-0"].slurm_node == inv["cpu-0"] and by["cpu-0"].jobs == (11,)
    assert "Exited (1)" in by["cpu-2"].detail
    assert by["cpu-4"].detail == "kubernetes node k4 is cordoned"
    assert "cpu-0 create (resume) jobs=11" in by["cpu-0"].describe()


def test_plan_suspend_and_resume_fail_are_idempotent():
    workers = {"cpu-0": Worker("cpu-0", "Running"), "old-9": Worker("old-9", "Running")}
    s = {d.node: (d.action, d.reason) for d in plan_suspend(["cpu-0", "cpu-1", "old-9"], workers)}
    assert s == {"cpu-0": (Action.DELETE, Reason.SUSPEND), "cpu-1": (Action.NOTHING, Reason.ALREADY_GONE),
                 "old-9": (Action.DELETE, Reason.SUSPEND)}  # not in the inventory: its worker still goes
    f = {d.node: (d.action, d.reason) for d in plan_resume_fail(["cpu-0", "cpu-1"], workers)}
    assert f == {"cpu-0": (Action.DELETE, Reason.RESUME_FAILED), "cpu-1": (Action.NOTHING, Reason.ALREADY_GONE)}


# ---------------------------------------------------------------- programs with fakes


def test_resume_creates_workers_and_a_second_call_does_nothing():
    backend = FakeBackend()
    slurm = FakeSlurm()
    result = run_resume(["cpu-[0-1]"], ctx(backend, slurm), RESUME_FILE)
    assert result.code == 0 and not slurm.down
    assert set(backend.workers) == {"cpu-0", "cpu-1"}
    again = run_resume(["cpu-[0-1]"], ctx(backend, slurm), RESUME_FILE)
    assert again.code == 0
    assert [c for c in backend.calls if c[0] == "create"] == [("create", "cpu-0"), ("create", "cpu-1")]


def test_resume_failure_sets_down_with_reason_others_still_created():
    backend = FakeBackend(fail={"cpu-1": "image slurmk8s/nope:1 not found on the Docker host"})
    slurm = FakeSlurm()
    c = ctx(backend, slurm)
    result = run_resume(["cpu-[0-2]", "ghost-1"], c, None)
    assert result.code == 1
    assert set(backend.workers) == {"cpu-0", "cpu-2"}
    assert slurm.down["cpu-1"] == "slurmk8s resume: image slurmk8s/nope:1 not found on the Docker host"
    assert slurm.down["ghost-1"].startswith("slurmk8s unknown-node: not in the slurmk8s inventory")
    assert set(slurm.down) == {"cpu-1", "ghost-1"}
    assert any("cpu-1 create FAILED" in line for line in c.log.lines)


def test_resume_replaces_a_dead_worker():
    backend = FakeBackend(workers={"cpu-0": Worker("cpu-0", "Failed", reason="Exited (137)")})
    run_resume(["cpu-0"], ctx(backend), None)
    assert backend.calls == [("delete", "cpu-0"), ("create", "cpu-0")]
    assert backend.workers["cpu-0"].phase == "Running"


def test_resume_with_unreadable_inventory_sets_all_down(tmp_path: Path):
    slurm = FakeSlurm()
    c = Context({"SLURMK8S_INVENTORY": str(tmp_path / "missing.json")}, Log("test"), backend=FakeBackend(),
                slurm=slurm)
    result = run_resume(["cpu-[0-1]"], c, None)
    assert result.code == 1
    assert set(slurm.down) == {"cpu-0", "cpu-1"}
    assert "missing.json" in slurm.down["cpu-0"]


def test_resume_reads_inventory_json_as_render_writes_it(tmp_path: Path):
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory(2).to_json()))
    backend = FakeBackend()
    c = Context({"SLURMK8S_INVENTORY": str(path)}, Log("test"), backend=backend, slurm=FakeSlurm())
    assert run_resume(["cpu-1"], c, None).code == 0
    assert list(backend.workers) == ["cpu-1"]


def test_bad_hostlist_does_nothing():
    backend = FakeBackend()
    assert run_resume(["cpu-[0-"], ctx(backend), None).code == 2
    assert backend.calls == []


class SlowBackend(FakeBackend):
    def __init__(self, delay: float, slow: set[str]) -> None:
        super().__init__()
        self.delay = delay
        self.slow = slow
        self.release = threading.Event()

    def create(self, node: SlurmNode, group=None) -> None:
        if node.name in self.slow:
            self.release.wait(self.delay)
        super().create(node)


def test_resume_runs_creates_in_parallel_and_respects_the_budget():
    backend = SlowBackend(delay=30, slow={"cpu-2"})
    slurm = FakeSlurm()
    c = ctx(backend, slurm, SLURMK8S_BUDGET="0.5", SLURMK8S_PARALLEL="4")
    start = time.monotonic()
    result = run_resume(["cpu-[0-3]"], c, None)
    took = time.monotonic() - start
    backend.release.set()
    assert took < 2, f"resume took {took:.1f}s with a 0.5s budget"
    assert result.abandoned
    assert set(backend.workers) == {"cpu-0", "cpu-1", "cpu-3"}
    assert "did not answer within" in slurm.down["cpu-2"]


def test_parallelism_is_bounded():
    class Counting(FakeBackend):
        def __init__(self) -> None:
            super().__init__()
            self.now = self.peak = 0
            self.lock = threading.Lock()

        def create(self, node: SlurmNode, group=None) -> None:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            super().create(node)

    backend = Counting()
    run_resume(["cpu-[0-9]"], ctx(backend, inv=inventory(10), SLURMK8S_PARALLEL="3"), None)
    assert len(backend.workers) == 10
    assert 1 < backend.peak <= 3


def test_suspend_deletes_and_a_failed_delete_sets_down():
    class FailingDelete(FakeBackend):
        def delete(self, name: str, uid: str | None = None, force: bool = False,
                   version: str | None = None) -> None:
            if name == "cpu-1":
                raise BackendError(name, "container removal failed (500): device busy")
            super().delete(name)

    backend = FailingDelete(workers={n: Worker(n, "Running") for n in ("cpu-0", "cpu-1")})
    slurm = FakeSlurm()
    result = run_suspend(["cpu-[0-2]"], ctx(backend, slurm))
    assert result.code == 1
    assert set(backend.workers) == {"cpu-1"}
    assert slurm.down == {"cpu-1": "slurmk8s suspend: worker not removed: container removal failed (500): device busy"}


def test_resume_fail_removes_the_worker_and_returns_the_node():
    backend = FakeBackend(workers={"cpu-0": Worker("cpu-0", "Pending")})
    slurm = FakeSlurm()
    result = run_resume_fail(["cpu-[0-1]"], ctx(backend, slurm))
    assert result.code == 0 and backend.workers == {}
    assert slurm.returned == ["cpu-0", "cpu-1"] and not slurm.down


def test_resume_fail_keeps_a_node_down_while_its_worker_remains():
    class Stuck(FakeBackend):
        def delete(self, name: str, uid: str | None = None, force: bool = False,
                   version: str | None = None) -> None:
            raise BackendError(name, "container removal failed (500): busy")

    slurm = FakeSlurm()
    result = run_resume_fail(["cpu-[0-1]"], ctx(Stuck(workers={"cpu-0": Worker("cpu-0", "Running")}), slurm))
    assert result.code == 1
    assert slurm.returned == ["cpu-1"]
    assert "worker not removed after failed resume" in slurm.down["cpu-0"]


def test_set_down_failure_is_logged_not_raised():
    c = ctx(FakeBackend(fail={"cpu-0": "boom"}), FakeSlurm(fail=True))
    result = run_resume(["cpu-0"], c, None)
    assert result.code == 1
    assert any("could not set DOWN cpu-0" in line for line in c.log.lines)


def test_down_argv_is_a_list_with_a_hostlist():
    assert down_argv(["cpu-1", "cpu-0"], 'slurmk8s resume: no "quotes"') == [
        "scontrol", "update", "nodename=cpu-[0-1]", "state=DOWN", 'reason=slurmk8s resume: no "quotes"']
    assert resume_argv(["cpu-0"]) == ["scontrol", "update", "nodename=cpu-0", "state=RESUME"]


def test_power_down_argv_gives_every_node_the_address_that_fails_at_once():
    # slurmctld wants one address per node (update_node: "nodecount mismatch" otherwise); a name
    # that no longer resolves would cost it 10 s under a lock (tests/integration/test_reconcile_testbed.py)
    assert power_down_argv(["cpu-1", "gpu-0"]) == [
        "scontrol", "update", "nodename=cpu-1,gpu-0", "state=POWER_DOWN_FORCE", "nodeaddr=127.0.0.1,127.0.0.1"]
    assert NODE_ADDR_GONE == "127.0.0.1"


def test_log_file_lines_are_timestamped(tmp_path: Path):
    path = tmp_path / "sub" / "elastic.log"
    log = Log("resume", str(path))
    log.write("hello")
    log.close()
    line = path.read_text().strip()
    assert line.endswith("hello") and "resume[" in line
    assert line[:4].isdigit() and line[10] == "T" and line.split()[0].endswith("Z")


def test_unwritable_log_falls_back_to_stderr(capsys):
    log = Log("resume", "/proc/nonexistent/elastic.log")
    log.write("still here")
    assert "still here" in capsys.readouterr().err


# ---------------------------------------------------------------- backend registry and docker spec


def test_backend_registry():
    assert {"docker", "kubernetes"} <= set(BACKENDS)
    for target in BACKENDS.values():  # every entry names a module:function that exists
        import importlib

        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), target
    with pytest.raises(BackendError, match="unknown SLURMK8S_BACKEND='nope'"):
        backend_from_env({"SLURMK8S_BACKEND": "nope"})
    with pytest.raises(BackendError, match="SLURMK8S_DOCKER_CLUSTER"):
        backend_from_env({"SLURMK8S_BACKEND": "docker"})


def test_docker_container_spec():
    config = DockerConfig.from_env({
        "SLURMK8S_DOCKER_CLUSTER": "c1", "SLURMK8S_DOCKER_NETWORK": "net1", "SLURMK8S_CONTROLLER": "ctld:6817",
        "SLURMK8S_DOCKER_MOUNTS": json.dumps([{"type": "volume", "source": "home1", "target": "/home"},
                                              {"type": "bind", "source": "/k", "target": "/etc/k", "read_only": True}]),
        "SLURMK8S_DOCKER_ENV": json.dumps({"X": "1"}),
    })
    spec = container_spec(config, SlurmNode("cpu-0", "cpu", "cpu", 2, 1024), "img:1")
    assert spec["Image"] == "img:1" and spec["Hostname"] == "cpu-0"
    assert "SLURMK8S_NODENAME=cpu-0" in spec["Env"] and "SLURMK8S_CONTROLLER=ctld:6817" in spec["Env"]
    assert "X=1" in spec["Env"]
    assert spec["Labels"]["org.slurmk8s.cluster"] == "c1"
    assert spec["HostConfig"]["NetworkMode"] == "net1"
    assert spec["HostConfig"]["ShmSize"] == 512 * 2**20
    assert {"Type": "bind", "Source": "/k", "Target": "/etc/k", "ReadOnly": True} in spec["HostConfig"]["Mounts"]


# ---------------------------------------------------------------- prolog


def states_sequence(*seq):
    it = iter(seq)
    last = [None]

    def states_of(nodelist: str):
        last[0] = next(it, last[0])
        return last[0]

    return states_of


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_prolog_waits_until_no_power_suffix():
    clock = FakeClock()
    outcome, waited, polls, states = wait_for_boot(
        "cpu-[0-1]", 60, states_sequence(["allocated~", "allocated~"], None, ["allocated#", "allocated"],
                                         ["allocated", "mixed"]), clock, clock.sleep)
    assert outcome == "booted" and polls == 4 and states == ["allocated", "mixed"]
    assert waited == pytest.approx(0.3)


def test_prolog_returns_at_once_on_booted_nodes_and_times_out_otherwise():
    clock = FakeClock()
    assert wait_for_boot("cpu-0", 60, states_sequence(["idle"]), clock, clock.sleep)[:3] == ("booted", 0.0, 1)
    clock = FakeClock()
    outcome, waited, _, _ = wait_for_boot("cpu-0", 5, states_sequence(["allocated#"]), clock, clock.sleep)
    assert outcome == "timeout" and 5 <= waited < 5.2


def test_prolog_stops_waiting_when_a_node_went_down():
    clock = FakeClock()
    outcome, *_ = wait_for_boot("cpu-[0-1]", 60, states_sequence(["allocated#", "down~"]), clock, clock.sleep)
    assert outcome == "gave-up"
    # a node refused for backoff is DOWN and pending power-down: no boot suffix, yet not booted
    outcome, *_ = wait_for_boot("cpu-0", 60, states_sequence(["down!"]), clock, clock.sleep)
    assert outcome == "gave-up"


def test_prolog_main_never_fails(monkeypatch, tmp_path: Path):
    log = tmp_path / "elastic.log"
    monkeypatch.setenv("SLURMK8S_LOG", str(log))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-0")
    monkeypatch.setenv("SLURMK8S_PROLOG_TIMEOUT", "0.3")
    monkeypatch.setattr(prolog, "node_states", lambda nodelist: None)  # sinfo failing
    assert prolog.prolog_main() == 0
    assert "job 7 nodes cpu-0: timeout" in log.read_text()

    def boom(nodelist):
        raise RuntimeError("bug")

    monkeypatch.setattr(prolog, "node_states", boom)
    assert prolog.prolog_main() == 0
    assert "internal error, job released anyway: RuntimeError: bug" in log.read_text()


def test_resume_timeout_from_conf(tmp_path: Path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# c\nResumeTimeout=60\nSuspendTime=10 # x\n")
    assert prolog.resume_timeout_from_conf(str(conf)) == 60
    assert prolog.resume_timeout_from_conf(str(tmp_path / "none")) is None


def test_prolog_module_stays_light():
    import subprocess
    import sys

    code = ("import sys, provisioner.elastic.programs; "
            "heavy = [m for m in ('pydantic', 'yaml', 'jinja2', 'concurrent.futures', 'hostlist') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_env_file_under_process_env(tmp_path: Path):
    f = tmp_path / "elastic.env"
    f.write_text("# test bed\nSLURMK8S_BACKEND=docker\nSLURMK8S_DOCKER_MOUNTS=[{\"a\": 1}]\nnot a line\nSLURMK8S_LOG=/x\n")
    env = programs.program_env({"SLURMK8S_ENV_FILE": str(f), "SLURMK8S_LOG": "/y"})
    assert env["SLURMK8S_BACKEND"] == "docker"
    assert env["SLURMK8S_DOCKER_MOUNTS"] == '[{"a": 1}]'
    assert env["SLURMK8S_LOG"] == "/y"
    assert programs.program_env({"SLURMK8S_ENV_FILE": str(tmp_path / "absent")}) == {
        "SLURMK8S_ENV_FILE": str(tmp_path / "absent")}


# ---------------------------------------------------------------- fast_start in the rendered slurm.conf


def _conf(fast_start: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from factories import node

    from provisioner.config import parse_spec
    from provisioner.generate import generate
    from provisioner.inventory import nodes_from_api
    from provisioner.render import parse_conf_lines

    spec = parse_spec({"name": "fs", "pools": [{"name": "cpu"}], "slurm": {"extra_conf": extra or {}},
                       "elasticity": {"fast_start": fast_start}})
    text = generate(spec, nodes_from_api([node("n0")])).files["slurm.conf"]
    return {pairs[0][0]: pairs[0][1] for pairs in parse_conf_lines(text) if pairs[0][0] not in ("NodeName", "PartitionName")}


def test_fast_start_settings_are_rendered_and_off_means_slurm_defaults():
    on = _conf(True)
    assert on["PrologSlurmctld"] == "/opt/slurmk8s/bin/slurmk8s-prolog-slurmctld"
    assert "power_save_interval=1" in on["SlurmctldParameters"].split(",")
    assert on["SchedulerParameters"] == "batch_sched_delay=0,bf_interval=1,bf_max_time=30"
    off = _conf(False)
    assert "PrologSlurmctld" not in off and "SchedulerParameters" not in off
    assert "power_save_interval" not in off["SlurmctldParameters"]


def test_the_workers_epilog_ends_what_a_job_left_behind_in_both_modes():
    """Always the worker image's epilog: it kills a job's daemonised processes, and slurmd then
    reports each job's end, on which slurmctld schedules at once."""
    assert _conf(True)["Epilog"] == _conf(False)["Epilog"] == "/usr/local/lib/slurmk8s/epilog"


def test_fast_start_merges_into_the_users_scheduler_parameters():
    merged = _conf(True, {"SchedulerParameters": "bf_continue,bf_interval=60"})
    assert merged["SchedulerParameters"] == "bf_continue,bf_interval=60,batch_sched_delay=0,bf_max_time=30"
    own = _conf(True, {"SchedulerParameters": "batch_sched_delay=5"})
    assert own["SchedulerParameters"] == "batch_sched_delay=5,bf_interval=1,bf_max_time=30"  # the user's wins


def test_a_sites_own_epilog_replaces_ours_and_an_empty_value_leaves_it_out():
    lower = _conf(True, {"epilog": "/etc/slurm/epilog.sh"})  # any spelling of the key
    assert lower["epilog"] == "/etc/slurm/epilog.sh" and "Epilog" not in lower
    assert _conf(True, {"Epilog": "/etc/slurm/epilog.sh"})["Epilog"] == "/etc/slurm/epilog.sh"
    assert not {"Epilog", "epilog"} & set(_conf(True, {"Epilog": ""}))


def test_burst_sized_job_limits_by_default_and_the_users_own_win():
    conf = _conf(True)
    assert (conf["MaxJobCount"], conf["MaxArraySize"]) == ("50000", "10001")
    own = _conf(True, {"maxjobcount": "200000"})  # any spelling of the key: Slurm's keys are case-insensitive
    assert own["maxjobcount"] == "200000" and "MaxJobCount" not in own and own["MaxArraySize"] == "10001"


def test_salloc_shell_on_the_first_node_by_default_and_an_empty_value_restores_slurms_default():
    assert _conf(True)["LaunchParameters"] == "use_interactive_step"
    own = _conf(True, {"LaunchParameters": "enable_nss_slurm"})
    assert own["LaunchParameters"] == "enable_nss_slurm"  # the user's list replaces ours
    blank = _conf(True, {"LaunchParameters": ""})  # empty: the key is left out, salloc's shell stays local
    assert not any(k.lower() == "launchparameters" for k in blank)
