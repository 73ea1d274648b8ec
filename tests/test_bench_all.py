"""bench/all.py: the one table of the benchmarks, from JSON documents shaped as each bench writes
them (built with the benches' own parsing where they have one), and the runner with small stand-in
bench scripts (exit codes, missing JSON, a timeout that must let the bench clean up)."""

from __future__ import annotations

import io
import os
import json
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from provisioner.status import ControllerState, Status, Usage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import all as bench_all  # noqa: E402
import all_rows  # noqa: E402
import bursty_day  # noqa: E402
import mpi_p6  # noqa: E402
import p1_phases as p1  # noqa: E402
from all import Bench, Outcome  # noqa: E402
from all_rows import Check  # noqa: E402

# ---------------------------------------------------------------- documents as the benches write them


def render_doc(nodes: int = 10_000, median: float = 0.64, best: float = 0.60) -> dict[str, Any]:
    """bench/render_scale.py --json."""
    return {"python": "3.11.7", "machine": "x86_64", "k8s_nodes": nodes, "slurm_nodes": nodes, "switches": 261,
            "repeat": 5, "times": [best, median, 0.7, 0.65, 0.62], "best": best, "median": median,
            "traced_peak_mib": 38.1, "peak_rss_mib": 143.2,
            "file_sizes": {"inventory.json": 232892, "slurm.conf": 3992, "topology.conf": 16604}}


def p1_doc(zero: list[float], idle: list[float], bare: list[float], *, new_keys: bool = True,
           login: float | None = 44.6, from_nothing: bool = True) -> dict[str, Any]:
    """bench/k8s_submit_latency.py --json: runs parsed from the login loop's lines and phased by
    bench/p1_phases.py (no other source here), the document built as the bench builds it."""
    t0 = 1796156010.0

    def lines(seconds: list[float], first_job: int) -> str:
        return "\n".join(f"run {i + 1} job {first_job + i} t0 {int((t0 + 60 * i) * 1e9)} "
                         f"sbatch {int((t0 + 60 * i + 0.02) * 1e9)} running {int((t0 + 60 * i + s) * 1e9)} "
                         f"start {int(t0 + 60 * i + s)} nodes c-{i}" for i, s in enumerate(seconds))
    zero_runs, idle_runs = p1.parse_runs(lines(zero, 10)), p1.parse_runs(lines(idle, 100))
    sources = p1.Sources(calls=p1.resume_calls([]), prolog=p1.prolog_waits([]), ctld=p1.slurmctld_events(""),
                         pods=p1.pod_times([]), scheduled=p1.scheduled_events({}))
    zero_phases = [p1.phases(r, sources) for r in zero_runs]
    doc = {  # as in k8s_submit_latency.main
        "kubernetes": "v1.35.0", "slurm": "slurm 24.11.5", "up_seconds": 41.3,
        "runs": len(zero),
        "phases": [{"key": k, "label": label, "resolution": res} for k, label, res in p1.PHASES],
        "zero": [{**p, "seconds": round(r.seconds, 6)} for r, p in zip(zero_runs, zero_phases)],
        "idle": [{"job": r.job, "node": r.nodes, "t0": r.t0, "seconds": round(r.seconds, 6),
                  "sbatch_returned": round(r.sbatch - r.t0, 6), "start_time": r.start_time} for r in idle_runs],
        "bare_pod_start": [round(b, 6) for b in bare],
    }
    if login is not None:  # P5 (written since the bench times it)
        doc.update(login_ssh_seconds=login, from_nothing=from_nothing)
    if not new_keys:  # as written before bench/all.py: no `slurm`, no `up_seconds`
        del doc["slurm"], doc["up_seconds"]
    return json.loads(json.dumps(doc))


def p4b_doc(running: float, nodes: int = 500, exit_code: int = 0, down: int = 0) -> dict[str, Any]:
    """bench/resume_500.py --json."""
    return {"kubernetes": "v1.35.0", "nodes": nodes, "parallel": 32, "kwok_nodes": 5,
            "hostlist": f"sim-p4b-[0-{nodes - 1}]", "resume_exit": exit_code, "set_down": down,
            "created_s": 2.38, "running_s": running, "deleted_s": 1.7}


def p7_doc(seen: list[float], login_sleeps: bool = False, plain: list[float] | None = None) -> dict[str, Any]:
    """bench/wake_submit.py --json."""
    plain = [2.5] * len(seen) if plain is None else plain
    return {"kubernetes": "v1.35.0", "runs": len(seen), "login_sleeps": login_sleeps,
            "jobs": [str(i + 1) for i in range(len(seen) + len(plain))], "to_job_id": [3.0] * len(seen),
            "to_start_time": [round(s) for s in seen], "to_seen_running": seen,
            "plain_to_job_id": plain, "plain_to_seen_running": [p + 1.5 for p in plain]}


def p3_doc(provisioned: float = 7200.0, busy: float = 6000.0, fates: dict[int, list[str]] | None = None, *,
           jobs: int = 1000, sbatch_failed: int = 0, usage: bool = True, always_on: bool = False) -> dict[str, Any]:
    """bench/bursty_day.py --json, built as its run() builds it from its own pure parts: the trace, sacct's
    lines (`fates`: a job's states in order, by its index; else COMPLETED once), `slurmk8s status --json`
    documents as provisioner.status writes them (pool `day`; usage=False: the controller asleep)."""
    t0, pool = 1796156000.0, bursty_day.POOL
    trace = bursty_day.make_trace(jobs, 17)
    ids = [str(100 + i) for i in range(jobs - sbatch_failed)]
    sacct = "\n".join(f"{job}|{state}|{trace[i].nodes}|{t0 + trace[i].offset:.0f}|{t0 + trace[i].offset + 2 + k:.0f}|"
                      f"{t0 + trace[i].offset + 2 + k + trace[i].duration:.0f}|{round(trace[i].duration)}"
                      for i, job in enumerate(ids) for k, state in enumerate((fates or {}).get(i, ["COMPLETED"])))
    result = bursty_day.outcome(bursty_day.parse_sacct(sacct), ids)

    def status(prov: float, busy_: float) -> dict[str, Any]:
        return Status("slurm-bench-day", ControllerState("awake", replicas=1, ready=1),
                      usage=Usage(t0, {"cpu": 50.0, pool: prov}, {"cpu": 40.0, pool: busy_}), at=t0 + 2000).to_json()
    before = status(100.0, 80.0)
    after = status(100.0 + provisioned, 80.0 + busy) if usage else \
        Status("slurm-bench-day", ControllerState("asleep", replicas=0)).to_json()
    delta = bursty_day.usage_delta(before, after, pool)
    sim = bursty_day.simulate_always_on(trace, 8)
    doc = {  # as in bursty_day.run
        "kubernetes": "v1.35.0", "slurm": "slurm 24.11.5", "up_seconds": 40.1, "jobs": len(trace), "seed": 17,
        "nodes": 8, "suspend_time": None if always_on else 20, "time_scale": 1.0, "always_on": always_on,
        "tag": "bursty-1796156000", "trace_span_s": trace[-1].offset, "submitted": len(ids),
        "sbatch_failed": sbatch_failed, "sbatch_errors": ["sbatch: error: x"] * min(sbatch_failed, 5),
        "submit_lag_p95_s": 0.05, "replay_s": 990.0,
        "completed": result.completed, "not_completed": result.not_completed, "interrupted": result.interrupted,
        "waits": {**bursty_day.waits_summary(result.waits), "values": result.waits},
        "always_on_simulated": {**bursty_day.waits_summary(sim), "makespan": bursty_day.makespan(trace, sim)},
        "node_seconds": {"provisioned": delta and delta[0], "busy": delta and delta[1],
                         "ratio": bursty_day.ratio(*delta) if delta else None, "busy_sacct": result.busy_node_seconds,
                         "window": "first job to pool back at zero pods", "at_drain": None,
                         "goal_ratio": bursty_day.GOAL_RATIO},
    }
    return json.loads(json.dumps(doc))


def mpi_output(lat_us: dict[int, float], allreduce_us: dict[int, float], node: str = "-") -> str:
    """bench/mpi_p6.c's stdout."""
    out = ["P6 library Open MPI v5.0.7, package: Debian OpenMPI", f"P6 rank rank=0 host=h0 slurm_node={node}",
           f"P6 rank rank=1 host=h1 slurm_node={node}"]
    for n in mpi_p6.PINGPONG:
        lat = lat_us[n]
        out.append(f"P6 pingpong bytes={n} iters=10 reps=7 lat_us={lat:.3f} lat_us_best={lat:.3f} "
                   f"mb_s={n / lat:.2f} mb_s_best={n / lat:.2f}")
    out += [f"P6 allreduce bytes={n} iters=10 reps=7 us={allreduce_us[n]:.3f} us_best={allreduce_us[n]:.3f}"
            for n in mpi_p6.ALLREDUCE]
    return "\n".join([*out, "P6 done"]) + "\n"


def p6_doc(pod: float | None = 0.7, hostnet: float | None = None, hostnet_failed: str = "") -> dict[str, Any]:
    """bench/mpi_p6.py --json: its own parse() and report(), then its JSON keying. `pod` / `hostnet`:
    each time's fraction of the host's (None: not run)."""
    lat = {n: 20.0 + n / 2000.0 for n in mpi_p6.PINGPONG}
    red = {n: 30.0 + n / 800.0 for n in mpi_p6.ALLREDUCE}
    result: dict[str, Any] = {"host": mpi_p6.parse(mpi_output(lat, red))}
    for variant, frac in (("pod", pod), ("hostnet", hostnet)):
        if frac is not None:
            doc = mpi_p6.parse(mpi_output({n: v / frac for n, v in lat.items()}, {n: v / frac for n, v in red.items()}))
            doc["env"], doc["placement"] = dict(mpi_p6.MPI_ENV), [{"slurm_node": "x", "k8s_node": "p6-a", "pod_ip": "?"}]
            result[variant] = doc
    if hostnet_failed:
        result["hostnet"] = {"failed": hostnet_failed}
    elif hostnet is None:
        result["hostnet_skipped"] = "the nodes share one network namespace"
    result.update(binary_sha256="ab" * 32, kubernetes="v1.35.0", node_ips={"p6-a": "10.0.0.1", "p6-b": "10.0.0.1"},
                  loadavg_1min={"start": 1.0, "end": 1.2})
    with redirect_stdout(io.StringIO()):
        mpi_p6.report(result)

    def keyed(doc: Any) -> Any:  # as mpi_p6.main writes it
        return {str(k): keyed(v) for k, v in doc.items()} if isinstance(doc, dict) else doc
    return json.loads(json.dumps(keyed(result)))


def one(rows: list[bench_all.Row], id: str) -> bench_all.Row:
    [row] = [r for r in rows if r.id == id]
    return row


# ---------------------------------------------------------------- rows from each bench


def test_verdict_combines_the_parts() -> None:
    assert all_rows.verdict([Check("a", True), Check("b", True)]) == ("met", "")
    assert all_rows.verdict([Check("a", False)]) == ("not met", "")
    v, note = all_rows.verdict([Check("a", False), Check("b", None, "no floor")])
    assert v == "not met" and note == "a: not met; b: not measured (no floor)"
    assert all_rows.verdict([Check("a", True), Check("b", None, "why")]) == ("not measured", "b: not measured (why)")


def test_render_rows() -> None:
    [row] = bench_all.render_rows(render_doc())
    assert (row.id, row.verdict, row.floor, row.ratio) == ("render", "met", "—", "—")
    assert row.result == "10,000 nodes: median 0.640 s, best 0.600 s (5 runs); peak RSS 143 MiB"
    assert bench_all.render_rows(render_doc(median=1.2))[0].verdict == "not met"
    small = bench_all.render_rows(render_doc(nodes=500, median=0.1))[0]
    assert small.verdict == "not measured" and "it ran 500 nodes" in small.note


def test_render_rows_read_what_render_scale_writes(tmp_path: Path) -> None:
    """The shape above is the real one: render_scale's --json keys."""
    src = (ROOT / "bench" / "render_scale.py").read_text()
    for key in render_doc():
        assert f'"{key}":' in src, key


def test_p1_rows_ratio_to_the_bare_pod_in_the_same_run() -> None:
    doc = p1_doc(zero=[6.0, 6.1, 6.3, 5.9, 6.07], idle=[0.8, 0.82, 0.81], bare=[1.9, 1.88, 1.85, 2.0, 1.87])
    rows = bench_all.p1_rows(doc)
    p1row = one(rows, "P1")
    assert p1row.result == "p50 6.07 s, p95 6.26 s (5 runs); from idle workers p50 0.81 s"
    assert p1row.floor == "bare pod start p50 1.88 s (5 pods)"
    assert p1row.ratio == "3.23x"
    assert p1row.verdict == "not met"
    assert p1row.note == "p50 <= 2.5 s: not met; <= 2.5x the bare pod start: not met"
    fast = one(bench_all.p1_rows(p1_doc(zero=[2.0, 2.2, 2.1], idle=[], bare=[1.0, 1.0])), "P1")
    assert (fast.verdict, fast.ratio, fast.result) == ("met", "2.10x", "p50 2.10 s, p95 2.19 s (3 runs)")
    half = one(bench_all.p1_rows(p1_doc(zero=[2.0], idle=[], bare=[0.5])), "P1")
    assert half.verdict == "not met" and half.note == "<= 2.5x the bare pod start: not met"


def test_p5_is_the_login_s_first_ssh_answer_after_up_from_nothing() -> None:
    p5 = one(bench_all.p1_rows(p1_doc(zero=[6.0], idle=[0.8], bare=[1.9])), "P5")
    assert p5.verdict == "met"
    assert p5.result == ("login answered SSH 44.6 s after `slurmk8s up` of bench-p1 started from nothing (no "
                         "namespace, volume data or Pulumi state; images cached on the nodes); `up` returned after 41.3 s")
    slow = one(bench_all.p1_rows(p1_doc(zero=[6.0], idle=[0.8], bare=[1.9], login=60.2)), "P5")
    assert slow.verdict == "not met"


def test_p5_is_not_measured_unless_up_started_from_nothing() -> None:
    kept = one(bench_all.p1_rows(p1_doc(zero=[6.0], idle=[0.8], bare=[1.9], from_nothing=False)), "P5")
    assert kept.verdict == "not measured"
    assert kept.result == "`slurmk8s up` of bench-p1 returned after 41.3 s"
    assert "could not be emptied" in kept.note
    before = one(bench_all.p1_rows(p1_doc(zero=[6.0], idle=[0.8], bare=[1.9], login=None)), "P5")
    assert before.verdict == "not measured" and "before the bench timed" in before.note
    old = one(bench_all.p1_rows(p1_doc(zero=[6.0], idle=[0.8], bare=[1.9], new_keys=False, login=None)), "P5")
    assert old.result == "—" and old.verdict == "not measured"


def test_p4b_rows_floor_not_measured() -> None:
    [slow] = bench_all.p4b_rows(p4b_doc(9.58))
    assert slow.verdict == "not met"
    assert slow.result == ("all 500 pods Running 9.58 s (resume program returned 2.38 s, exit 0, 0 nodes DOWN; "
                           "suspend 1.70 s)")
    assert slow.note.startswith("<= 5 s: not met; <= 1.3x the floor: not measured (this resume_500 run did not time")
    [quick] = bench_all.p4b_rows(p4b_doc(4.1))
    assert quick.verdict == "not measured" and quick.floor == "not measured"
    [broken] = bench_all.p4b_rows(p4b_doc(4.1, exit_code=1, down=3))
    assert broken.verdict == "not met" and "every node resumed (exit 0, none DOWN): not met" in broken.note


def test_p4_rows() -> None:
    doc = {"nodes": 4096, "jobs": 32768, "queued": 32768, "sbatch_s": [0.05] * 99 + [0.6], "sbatch_failed": 0,
           "squeue_s": [1.2] * 20, "status_s": [2.1, 1.9], "reconcile_pass_mean_s": 0.8, "reconcile_passes": 3,
           "reconcile_peak_kib": 204800}
    [row] = bench_all.p4_rows(doc)
    assert row.verdict == "met" and "32768 jobs pending on 4096 nodes" in row.result and "200 MiB" in row.result
    [slow] = bench_all.p4_rows({**doc, "sbatch_s": [0.6] * 100, "reconcile_passes": 0})
    assert slow.verdict == "not met" and "sbatch p99 <= 500 ms: not met" in slow.note
    assert "reconcile pass <= 2 s: not measured" in slow.note


def test_p4b_rows_with_the_floor_of_the_same_run() -> None:
    [row] = bench_all.p4b_rows({**p4b_doc(4.2), "floor_created_s": 1.9, "floor_running_s": 3.5})
    assert row.ratio == "1.20x" and row.verdict == "met", row
    assert row.floor.startswith("the same 500 pods created straight through the API: all Running 3.50 s")
    [slow] = bench_all.p4b_rows({**p4b_doc(4.9), "floor_created_s": 1.9, "floor_running_s": 3.5})
    assert slow.verdict == "not met" and "<= 1.3x the floor: not met" in slow.note


def test_p4b_rows_at_4096_nodes_judge_creation_and_the_reconcile_pass() -> None:
    doc = {**p4b_doc(60.0, nodes=4096), "created_s": 18.0, "floor_created_s": 50.0, "floor_running_s": 58.0,
           "reconcile_pass_s": [0.4, 0.6], "reconcile_watch_sync_s": 2.7, "reconcile_listed_pass_s": 2.9}
    [row] = bench_all.p4b_rows(doc)
    assert ("reconcile pass at 4096 pods mean 0.50 s (2 passes; the pod watch's first list 2.70 s, a pass "
            "listing every pod 2.90 s)") in row.result
    assert row.note == "<= 5 s for 500 nodes: not measured (it ran 4096)", row  # the met checks are not noted
    [slow] = bench_all.p4b_rows({**doc, "reconcile_pass_s": [2.5]})
    assert "reconcile pass <= 2 s (4,096 pods): not met" in slow.note, slow
    [old] = bench_all.p4b_rows(p4b_doc(4.2))  # written before the reconcile figures: none shown
    assert "reconcile" not in old.result


def test_p6_rows_host_network_not_run_on_the_local_cluster() -> None:
    doc = p6_doc(pod=0.7)
    assert doc["goal"] == {"met": None, "reason": "the nodes share one network namespace"}  # mpi_p6's own verdict
    [row] = bench_all.p6_rows(doc)
    assert row.verdict == "not measured"
    assert row.note == ">= 0.9x host: not measured (host_network: the nodes share one network namespace)"
    assert row.result == "host_network not run; pod network worst 0.70x host"
    assert row.ratio == "pod 0.70x"
    big = doc["host"]["pingpong"]["16777216"]["mb_s"]
    assert row.floor.startswith(f"host processes, 16 MiB: ping-pong {big:.0f} MB/s, allreduce ")


def test_p6_rows_host_network_measured() -> None:
    [met] = bench_all.p6_rows(p6_doc(pod=0.7, hostnet=0.95))
    assert met.verdict == "met" and met.ratio == "host_network 0.95x; pod 0.70x"
    assert met.result == "host_network worst 0.95x host; pod network worst 0.70x host"
    doc = p6_doc(pod=0.7, hostnet=0.8)
    assert doc["goal"]["met"] is False
    assert bench_all.p6_rows(doc)[0].verdict == "not met"
    [failed] = bench_all.p6_rows(p6_doc(pod=None, hostnet_failed="exit 1: srun: error"))
    assert failed.verdict == "not measured" and failed.result == "host_network failed; pod network not run"
    assert "exit 1: srun: error" in failed.note and failed.ratio == "—"


def test_p7_rows() -> None:
    [row] = bench_all.p7_rows(p7_doc([8.5, 6.4]))
    assert row.verdict == "not met" and row.note == "submit -> RUNNING <= 6 s: not met"
    assert row.result == ("RUNNING seen: median 7.5 s, max 8.5 s (2 runs); Slurm start_time median 7 s; "
                          "job id median 3.0 s. Plain sbatch: job id median 2.5 s, max 2.5 s (2 runs), "
                          "RUNNING seen median 4.0 s")
    [row] = bench_all.p7_rows(p7_doc([5.2], login_sleeps=True))
    assert row.verdict == "met" and "(1 runs, login asleep too)" in row.result
    [row] = bench_all.p7_rows(p7_doc([5.2], plain=[3.4]))
    assert row.verdict == "not met" and row.note == "plain sbatch -> job id <= 3 s: not met"
    [row] = bench_all.p7_rows(p7_doc([5.2], plain=[]))  # --no-plain, or a JSON from before it was timed
    assert row.verdict == "not measured" and "did not time it" in row.note


def test_the_benches_write_the_keys_the_rows_read() -> None:
    """Every key a row function reads is one its bench writes (k8s_submit_latency and mpi_p6 are
    built from their own code above; these three are read from their source)."""
    day = p3_doc()
    for script, keys in (("resume_500.py", p4b_doc(1.0)), ("wake_submit.py", p7_doc([1.0])),
                         ("bursty_day.py", [*day, *day["node_seconds"], "always_on_simulated", "median"])):
        src = (ROOT / "bench" / script).read_text()
        for key in keys:
            assert f'"{key}":' in src, (script, key)


def test_p3_rows_node_seconds_over_busy_jobs_and_waits() -> None:
    doc = p3_doc(7200.0, 6000.0)
    [row] = bench_all.p3_rows(doc)
    sim = doc["always_on_simulated"]["median"]
    assert (row.verdict, row.ratio, row.note) == ("met", "1.20x", "")
    assert row.result == (f"1,000 jobs on 8 nodes: 1,000 COMPLETED, 0 not COMPLETED; wait median 2.0 s (always-on, "
                          f"simulated: {sim:.1f} s); provisioned 7,200 node-s")
    busy_sacct = sum(j.nodes * round(j.duration) for j in bursty_day.make_trace(1000, 17))
    assert row.floor == (f"busy 6,000 node-s (the product's metrics, first job to pool back at zero pods; by sacct "
                         f"{busy_sacct:,})")
    assert row.goal == bench_all.GOAL["P3"] and "1.3x busy" in row.goal
    [high] = bench_all.p3_rows(p3_doc(7900.0, 6000.0))
    assert (high.verdict, high.ratio, high.note) == ("not met", "1.32x", "provisioned <= 1.3x busy: not met")


def test_p3_rows_every_job_completed_and_none_interrupted() -> None:
    [lost] = bench_all.p3_rows(p3_doc(fates={0: ["CANCELLED"], 5: ["NODE_FAIL", "PENDING"]}, sbatch_failed=2))
    assert lost.verdict == "not met" and lost.ratio == "1.20x"
    assert ("1,000 jobs on 8 nodes: 996 COMPLETED, 4 not COMPLETED (CANCELLED 1, PENDING 1, sbatch failed 2), "
            "1 interrupted and requeued;") in lost.result
    assert lost.note == "every job COMPLETED: not met; none interrupted: not met"
    [requeued] = bench_all.p3_rows(p3_doc(fates={3: ["NODE_FAIL", "COMPLETED"]}))
    assert "1,000 COMPLETED, 0 not COMPLETED, 1 interrupted and requeued;" in requeued.result
    assert (requeued.verdict, requeued.note) == ("not met", "none interrupted: not met")


def test_p3_rows_not_measured() -> None:
    [asleep] = bench_all.p3_rows(p3_doc(usage=False))
    assert (asleep.verdict, asleep.ratio, asleep.floor) == ("not measured", "—", "not measured")
    assert asleep.result.endswith("; node-seconds not measured")
    assert asleep.note.startswith("provisioned <= 1.3x busy: not measured (no node-seconds: `slurmk8s status --json`")
    [small] = bench_all.p3_rows(p3_doc(jobs=200))
    assert small.verdict == "not measured" and "for 1,000 jobs: not measured (it ran 200 jobs)" in small.note
    [always] = bench_all.p3_rows(p3_doc(always_on=True))
    assert always.verdict == "not measured" and "an --always-on run" in always.note


# ---------------------------------------------------------------- failures, skips, the whole table


def bench(name: str = "resume_500", ids: tuple[str, ...] = ("P4b",), rows=bench_all.p4b_rows, **kw: Any) -> Bench:
    return Bench(name, ids, kw.pop("args", ()), kw.pop("timeout", 60), kw.pop("needs", ()), rows, **kw)


def test_a_failed_bench_is_a_failed_row_with_its_output() -> None:
    b = bench("k8s_submit_latency", ("P1", "P5"), bench_all.p1_rows)
    out = Outcome(b.name, "failed", 1, 12.0, tail=["Traceback ...", "RuntimeError: boom"], log="/tmp/x.log")
    rows = bench_all.rows_for(b, out)
    assert [r.id for r in rows] == ["P1", "P5"]
    assert all(r.verdict == "failed" and r.result == "failed (exit 1)" for r in rows)
    assert rows[0].note == "k8s_submit_latency exit 1; last lines of its output (/tmp/x.log):"
    assert rows[0].tail == ["Traceback ...", "RuntimeError: boom"]
    timeout = bench_all.rows_for(b, Outcome(b.name, "timeout", -2, 1800.0, tail=["waiting"], log="l"))
    assert timeout[0].result == "timed out after 1800 s" and timeout[0].verdict == "failed"
    assert timeout[0].note.startswith("k8s_submit_latency timed out after 1800 s (exit -2)")


def test_a_bench_whose_json_is_not_as_expected_fails() -> None:
    b = bench()
    [row] = bench_all.rows_for(b, Outcome(b.name, "ok", 0, doc={"nodes": 500}, log="l"))
    assert row.verdict == "failed" and "its JSON could not be read (KeyError: 'running_s')" in row.note
    [row] = bench_all.rows_for(b, Outcome(b.name, "failed", 0, reason="no readable JSON at /x.json", log="l"))
    assert row.verdict == "failed" and row.note.startswith("resume_500 exit 0: no readable JSON at /x.json")


def test_skipped_and_left_out_benches_are_not_measured_rows() -> None:
    b = bench()
    [row] = bench_all.rows_for(b, Outcome(b.name, "skipped", reason="no kwok in /x"))
    assert (row.verdict, row.note, row.goal) == ("not measured", "resume_500 not run: no kwok in /x",
                                                 bench_all.GOAL["P4b"])
    [row] = bench_all.rows_for(b, None)
    assert row.verdict == "not measured" and "left out by --only / --skip" in row.note


def test_table_rows_every_id_in_order() -> None:
    outcomes = {"render_scale": Outcome("render_scale", "ok", 0, doc=render_doc()),
                "mpi_p6": Outcome("mpi_p6", "ok", 0, doc=p6_doc()),
                "wake_submit": Outcome("wake_submit", "failed", 2, tail=["cannot run"])}
    rows = bench_all.table_rows(outcomes)
    assert [r.id for r in rows] == ["P1", "P3", "P4", "P4b", "P5", "P6", "P7", "render"]
    assert [r.verdict for r in rows] == ["not measured", "not measured", "not measured", "not measured",
                                         "not measured", "not measured", "failed", "met"]
    p3 = one(rows, "P3")
    assert p3.note == ("bursty_day not run: slow (run it with --only bursty_day or --slow, or give the JSON of a run "
                       "of its own with --use bursty_day=FILE)")


def test_text_and_markdown_tables() -> None:
    b = bench("k8s_submit_latency", ("P1", "P5"), bench_all.p1_rows)
    rows = bench_all.rows_for(b, Outcome(b.name, "failed", 1, tail=["a | b", "```x"], log="/l")) + \
        bench_all.render_rows(render_doc())
    text = bench_all.text_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["id", "what", "result", "floor", "(same", "run)", "ratio", "goal", "verdict"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].startswith("P1 ") and lines[2].endswith("failed (1)")
    assert lines[3].startswith("P5 ") and lines[3].endswith("failed (1)")  # the same note once
    assert lines[4].startswith("render ") and lines[4].endswith("met")
    assert lines[5:] == ["(1) k8s_submit_latency exit 1; last lines of its output (/l):", "      a | b", "      ```x"]
    md = bench_all.markdown(rows, "Measured 2026-12-01 10:00 UTC on 2 CPUs; `python bench/all.py`.")
    mlines = md.splitlines()
    assert mlines[0].startswith("<!-- generated by bench/all.py")
    assert mlines[2] == "Measured 2026-12-01 10:00 UTC on 2 CPUs; `python bench/all.py`."
    assert mlines[4] == "| id | what | result | floor (same run) | ratio | goal | verdict |"
    assert mlines[5] == "|---|---|---|---|---|---|---|"
    assert mlines[6].startswith("| P1 | `sbatch` -> job RUNNING") and mlines[6].endswith("| failed (1) |")
    assert "| render | " in mlines[8] and "\\|" not in mlines[8]
    assert mlines[10:] == ["(1) k8s_submit_latency exit 1; last lines of its output (/l):", "", "```", "a | b",
                           "'''x", "```"]
    piped = bench_all.Row("P7", "w", "a | b", "—", "—", "g", "met")
    assert "| a \\| b |" in bench_all.markdown([piped], "h")


def test_machine_line() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n\nprocessor\t: 1\n"
    line = bench_all.machine_line(
        date="2026-12-01 10:00 UTC", cpus=2, cpuinfo=cpuinfo, meminfo="MemTotal:        8152200 kB\nMemFree: 1 kB\n",
        kernel="6.1.0-28-amd64", python="3.11.7", kubernetes=["v1.35.0"], slurm=["slurm 24.11.5"], load=(1.5, 2.25),
        command="python bench/all.py --markdown docs/benchmarks-table.md")
    assert line == ("Measured 2026-12-01 10:00 UTC on 2 CPUs (Intel(R) Xeon(R) CPU @ 2.20GHz), 7.8 GiB memory, "
                    "Linux 6.1.0-28-amd64, Python 3.11.7, Kubernetes v1.35.0, Slurm 24.11.5, load average (1 min) "
                    "1.50 at the start, 2.25 at the end; `python bench/all.py --markdown docs/benchmarks-table.md`.")
    assembled = bench_all.machine_line(
        date="2026-12-01 10:00 UTC", cpus=2, cpuinfo=cpuinfo, meminfo="", kernel="k", python="p", kubernetes=[],
        slurm=[], load=(1.5, 2.25), command="c", ran=False)
    assert assembled.startswith("Assembled 2026-12-01 10:00 UTC, running no bench") and "load average" not in assembled
    bare = bench_all.machine_line(date="d", cpus=None, cpuinfo="", meminfo="", kernel="k", python="p", kubernetes=[],
                                  slurm=[], load=(0, 0), command="c")
    assert "? CPUs (model unknown), memory unknown" in bare and "Kubernetes not reported, Slurm not reported" in bare
    docs = [p1_doc([6.0], [0.8], [1.9]), p6_doc(), {"kubernetes": "?"}, {"kubernetes": "v1.34.1"}, render_doc()]
    assert bench_all.versions(docs, "kubernetes") == ["v1.35.0", "v1.34.1"]
    assert bench_all.versions(docs, "slurm") == ["slurm 24.11.5"]


def test_select_and_timeouts() -> None:
    names = [b.name for b in bench_all.select(bench_all.BENCHES)]
    assert names == ["render_scale", "resume_500", "queue_32k", "k8s_submit_latency", "wake_submit", "mpi_p6"]
    assert [b.name for b in bench_all.select(bench_all.BENCHES, ["render", "p1"])] == ["render_scale",
                                                                                      "k8s_submit_latency"]
    assert [b.name for b in bench_all.select(bench_all.BENCHES, ["P5"])] == ["k8s_submit_latency"]
    assert [b.name for b in bench_all.select(bench_all.BENCHES, [], ["mpi_p6", "P4b", "P4", ""])] == [
        "render_scale", "k8s_submit_latency", "wake_submit"]
    with pytest.raises(ValueError, match="unknown bench 'p9'"):
        bench_all.select(bench_all.BENCHES, ["p9"])
    # the slow one: only when named, or with --slow
    assert [b.name for b in bench_all.select(bench_all.BENCHES, ["p3"])] == ["bursty_day"]
    assert [b.name for b in bench_all.select(bench_all.BENCHES, ["render", "bursty_day"])] == ["render_scale",
                                                                                              "bursty_day"]
    assert [b.name for b in bench_all.select(bench_all.BENCHES, slow=True)][-1] == "bursty_day"
    assert "bursty_day" not in [b.name for b in bench_all.select(bench_all.BENCHES, [], ["P3"], slow=True)]
    limits = bench_all.timeouts(bench_all.BENCHES, ["900", "P6=2400"])
    assert limits["mpi_p6"] == 2400 and limits["render_scale"] == 900
    assert bench_all.timeouts(bench_all.BENCHES, [])["render_scale"] == 300
    with pytest.raises(ValueError):
        bench_all.timeouts(bench_all.BENCHES, ["p1=-1"])


# ---------------------------------------------------------------- running benches (stand-in scripts)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text("import json, sys, time\nout = sys.argv[sys.argv.index('--json') + 1]\n" + textwrap.dedent(body))
    return path


def test_run_bench_ok_failed_and_without_json(tmp_path: Path) -> None:
    doc = render_doc()
    ok = bench("render_scale", ("render",), bench_all.render_rows, args=("--nodes", "10000"),
               script=script(tmp_path, "ok", f"""
                   assert sys.argv[1:3] == ['--nodes', '10000'], sys.argv
                   print('pipeline time: fine')
                   open(out, 'w').write(json.dumps({doc!r}))
               """))
    got = bench_all.run_bench(ok, tmp_path, 30, echo=False)
    assert (got.status, got.code, got.doc) == ("ok", 0, doc)
    log = Path(got.log).read_text().splitlines()
    assert log[0].startswith("$ ") and "--json" in log[0] and log[1] == "pipeline time: fine"

    bad = bench(script=script(tmp_path, "bad", """
        for i in range(40):
            print(f'line {i}')
        sys.exit('cannot run: not ours')
    """))
    got = bench_all.run_bench(bad, tmp_path, 30, echo=False)
    assert (got.status, got.code) == ("failed", 1)
    assert len(got.tail) == bench_all.TAIL and got.tail[-1] == "cannot run: not ours" and got.tail[0] == "line 11"

    silent = bench(script=script(tmp_path, "silent", "print('done')\n"))
    got = bench_all.run_bench(silent, tmp_path, 30, echo=False)
    assert got.status == "failed" and got.code == 0 and got.reason.startswith("no readable JSON at ")


def test_run_bench_timeout_lets_the_bench_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    slow = bench(script=script(tmp_path, "slow", f"""
        try:
            print('deploying', flush=True)
            time.sleep(60)
        finally:
            open({str(marker)!r}, 'w').write('yes')
            print('removed the cluster', flush=True)
    """))
    got = bench_all.run_bench(slow, tmp_path, 1.0, grace=20, echo=False)
    assert got.status == "timeout" and got.code != 0 and got.seconds == 1.0
    assert marker.read_text() == "yes"
    assert got.tail[:2] == ["deploying", "removed the cluster"]  # then Python's KeyboardInterrupt traceback

    stubborn = bench(script=script(tmp_path, "stubborn", """
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print('ignoring SIGINT', flush=True)
        time.sleep(60)
    """))
    got = bench_all.run_bench(stubborn, tmp_path, 1.0, grace=1.0, echo=False)
    assert got.status == "timeout" and got.code == -9


def test_main_prints_one_table_writes_markdown_and_fails_on_a_failure(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    benches = (
        bench("render_scale", ("render",), bench_all.render_rows,
              script=script(tmp_path, "r", f"open(out, 'w').write(json.dumps({render_doc()!r}))\n")),
        bench("wake_submit", ("P7",), bench_all.p7_rows, script=script(tmp_path, "w", "sys.exit(2)\n")),
        bench("mpi_p6", ("P6",), bench_all.p6_rows, script=script(tmp_path, "m", "sys.exit(3)\n")),
    )
    md = tmp_path / "table.md"
    code = bench_all.main(["--skip", "mpi_p6", "--markdown", str(md), "--out", str(tmp_path / "out")], benches)
    assert code == 1
    out = capsys.readouterr().out
    assert "[all] wake_submit: failed (exit 2)" in out and "[all] mpi_p6" not in out
    table = md.read_text()
    assert "`python bench/all.py --skip mpi_p6 --markdown " in table
    assert "| P6 | " in table and "mpi_p6 not run (left out by --only / --skip)" in table
    assert "| P7 | " in table and "wake_submit exit 2" in table
    assert "| render | " in table and table.count("| met |") == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["id"] for r in results["rows"]] == ["P6", "P7", "render"]
    assert bench_all.main(["--only", "render", "--out", str(tmp_path / "out2")], benches) == 0


def test_a_bench_that_exits_1_after_its_json_for_a_missed_goal(tmp_path: Path) -> None:
    """bursty_day writes its JSON, then exits 1 when a job was not COMPLETED: a "not met" row, not a
    failed one. The same exit beside a JSON that misses no goal (its clean-up failed) is a failure."""
    def day(name: str, doc: dict[str, Any]) -> Bench:
        return bench("bursty_day", ("P3",), bench_all.p3_rows, json_on_miss=True, script=script(tmp_path, name, f"""
            open(out, 'w').write(json.dumps({doc!r}))
            sys.exit('not every job was submitted and COMPLETED without interruption: see above')
        """))
    missed = day("missed", p3_doc(fates={0: ["CANCELLED"]}))
    got = bench_all.run_bench(missed, tmp_path, 30, echo=False)
    assert (got.status, got.code) == ("ok", 1)
    [row] = bench_all.rows_for(missed, got)
    assert row.verdict == "not met"
    assert row.note == f"every job COMPLETED: not met; bursty_day exit 1 after writing its JSON ({got.log})"
    met = day("met", p3_doc())
    [row] = bench_all.rows_for(met, bench_all.run_bench(met, tmp_path, 30, echo=False))
    assert row.verdict == "failed" and row.result == "failed (exit 1)"
    assert row.note.startswith("bursty_day exit 1: it wrote its JSON, and the JSON shows no goal missed; last lines")
    no_json = bench("bursty_day", ("P3",), bench_all.p3_rows, json_on_miss=True,
                    script=script(tmp_path, "crash", "sys.exit('boom')\n"))
    got = bench_all.run_bench(no_json, tmp_path, 30, echo=False)
    assert (got.status, got.code, got.doc) == ("failed", 1, None)


def test_use_takes_a_bench_s_rows_from_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ran = tmp_path / "ran"
    benches = (
        bench("render_scale", ("render",), bench_all.render_rows,
              script=script(tmp_path, "r", f"open(out, 'w').write(json.dumps({render_doc()!r}))\n")),
        bench("wake_submit", ("P7",), bench_all.p7_rows,
              script=script(tmp_path, "w", f"open({str(ran)!r}, 'w').write('ran')\n")),
        bench("bursty_day", ("P3",), bench_all.p3_rows, slow=True, json_on_miss=True,
              script=script(tmp_path, "d", f"open({str(ran)!r}, 'w').write('ran')\n")),
    )
    day, wake = tmp_path / "p3.json", tmp_path / "p7.json"
    day.write_text(json.dumps(p3_doc(7900.0, 6000.0)))
    wake.write_text(json.dumps(p7_doc([5.0])))
    stamp = 1796116320  # 2026-12-01 09:12 UTC
    os.utime(day, (stamp, stamp))
    os.utime(wake, (stamp + 3600, stamp + 3600))
    md = tmp_path / "table.md"
    code = bench_all.main(["--use", f"P3={day}", "--use", f"wake_submit={wake}", "--markdown", str(md),
                           "--out", str(tmp_path / "out")], benches)
    assert code == 0 and not ran.exists()  # neither bursty_day nor wake_submit ran
    out = capsys.readouterr().out
    assert f"[all] bursty_day: not run: its rows from `{day.name}` (written 2026-12-01 09:12 UTC)" in out
    assert f"† P3: not run by this command; from `{day.name}` (written 2026-12-01 09:12 UTC), given with --use" in out
    table = md.read_text()
    assert str(day) not in table and str(wake) not in table  # published: the --use files by name, not path
    assert "--out" not in table
    assert "| P3 † | a bursty day" in table and "| 1.32x |" in table and "| not met (1) |" in table
    assert "| P7 † | " in table and "| render | " in table
    for id, file, hour in (("P3", day, "09"), ("P7", wake, "10")):
        assert f"\n\n† {id}: not run by this command; from `{file.name}` (written 2026-12-01 {hour}:12 UTC), given with " \
               "--use\n" in table
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["id"] for r in results["rows"]] == ["P3", "P7", "render"]
    assert one([bench_all.Row(**r) for r in results["rows"]], "P3").source.startswith(f"`{day.name}`")
    assert results["outcomes"]["bursty_day"]["source"] == f"`{day.name}` (written 2026-12-01 09:12 UTC)"
    assert bench_all.main(["--list", "--use", f"P3={day}"], benches) == 0
    assert f"(from `{day.name}` (written" in capsys.readouterr().out


@pytest.mark.parametrize(("given", "says"), [
    ("p9={json}", "--use p9={json}: unknown bench 'p9' (known: "),
    ("bursty_day", "--use bursty_day: give NAME=JSON"),
    ("P3={missing}", ("--use P3={missing}: cannot read {missing} (No such file or directory): give the file "
                      "`bursty_day.py --json FILE` wrote")),
    ("P3={garbage}", "--use P3={garbage}: {garbage} is not JSON (Expecting value"),
    ("P3={json}", ("--use P3={json}: {json} is not what bursty_day.py writes (KeyError: 'completed'): give the file "
                   "`bursty_day.py --json FILE` wrote")),
    ("P3={array}", ("--use P3={array}: {array} is not what bursty_day.py writes (TypeError: a JSON list, not an "
                    "object)")),
])
def test_use_errors_name_the_flag_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str,
                                              says: str) -> None:
    files = {"json": tmp_path / "p7.json", "missing": tmp_path / "nothing.json", "garbage": tmp_path / "g.json",
             "array": tmp_path / "a.json"}
    files["json"].write_text(json.dumps(p7_doc([5.0])))  # another bench's JSON
    files["garbage"].write_text("not json")
    files["array"].write_text("[1, 2]")
    with pytest.raises(SystemExit) as exit_:
        bench_all.main(["--use", given.format(**files), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert says.format(**files) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_use_twice_for_one_bench_is_an_error(tmp_path: Path) -> None:
    day = tmp_path / "p3.json"
    day.write_text(json.dumps(p3_doc()))
    assert set(bench_all.use_outcomes(bench_all.BENCHES, [f"bursty_day={day}"])) == {"bursty_day"}
    with pytest.raises(ValueError, match="bursty_day given twice"):
        bench_all.use_outcomes(bench_all.BENCHES, [f"bursty_day={day}", f"p3={day}"])


def test_p4_rows_without_timings_say_not_measured() -> None:
    """A queue_32k run whose sbatch / squeue / status calls all failed to time (empty lists) is a row
    saying what was not measured, not a crash that shows the whole row as failed."""
    doc = {"nodes": 4096, "jobs": 32768, "queued": 0, "sbatch_s": [], "sbatch_failed": 32768,
           "squeue_s": [], "status_s": [], "reconcile_pass_mean_s": 0.0, "reconcile_passes": 0}
    [row] = bench_all.p4_rows(doc)
    assert row.verdict == "not met", row  # nothing queued
    assert "sbatch p99 <= 500 ms: not met" in row.note  # every sbatch failed
    assert "squeue p99 <= 2 s: not measured (no squeue call timed)" in row.note
    assert "status <= 3 s: not measured (no status call timed)" in row.note
    assert "squeue p99 —" in row.result and "status max —" in row.result


def test_p4b_rows_at_4096_nodes_check_the_20_s_creation_goal() -> None:
    [row] = bench_all.p4b_rows({**p4b_doc(109.3, nodes=4096), "created_s": 54.7,
                                "floor_created_s": 60.2, "floor_running_s": 125.3})
    assert "every pod created <= 20 s (4,096 nodes): not met" in row.note, row
    [fast] = bench_all.p4b_rows({**p4b_doc(40.0, nodes=4096), "created_s": 18.0,
                                 "floor_created_s": 30.0, "floor_running_s": 40.0})
    assert "every pod created <= 20 s (4,096 nodes)" not in fast.note and fast.verdict == "not measured", fast
    [small] = bench_all.p4b_rows(p4b_doc(4.1))
    assert "4,096" not in small.note


def test_markdown_goes_between_the_markers_of_a_file_that_has_them(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Benchmarks\n\n{bench_all.BEGIN}\nold table\n{bench_all.END}\n\n## Next\n")
    bench_all.write_markdown(readme, "| new |\n")
    assert readme.read_text() == f"# x\n\n## Benchmarks\n\n{bench_all.BEGIN}\n| new |\n{bench_all.END}\n\n## Next\n"
    bench_all.write_markdown(readme, "| newer |\n")  # again: replaced, not added
    assert readme.read_text().count("| new") == 1 and "| newer |" in readme.read_text()
    plain = tmp_path / "table.md"
    plain.write_text(f"{bench_all.GENERATED}\nan older table\n")
    bench_all.write_markdown(plain, "| t |\n")
    assert plain.read_text() == "| t |\n"
    bench_all.write_markdown(tmp_path / "new.md", "| t |\n")  # a new file
    assert (tmp_path / "new.md").read_text() == "| t |\n"
    lost = tmp_path / "OTHER.md"
    lost.write_text("# a document whose markers were lost\n")
    with pytest.raises(SystemExit, match="has text of its own"):
        bench_all.write_markdown(lost, "| t |\n")
    assert lost.read_text() == "# a document whose markers were lost\n"


def test_the_published_command_names_files_not_paths() -> None:
    assert bench_all.public_args(["--use", "P3=/tmp/x/p3.json", "--out", "/tmp/o", "--markdown", "README.md",
                                  "--use=wake_submit=/tmp/w.json", "--out=/tmp/p"]) == [
        "--use", "P3=p3.json", "--markdown", "README.md", "--use=wake_submit=w.json"]
