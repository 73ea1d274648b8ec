"""Worker health checks: Slurm's HealthCheckProgram for slurmk8s worker pods.

Each check is a pure function of what was measured (``/proc/meminfo`` text, ``statvfs`` numbers,
command results, the node's Slurm record) and returns a :class:`Result` with a reason. The runner
(:func:`main`, console script ``slurmk8s-healthcheck``) measures, runs every check, logs one line
per check and, when one fails, drains the node::

    scontrol update nodename=<node> state=DRAIN reason="health: <check>: <detail>"

then exits 1 (0 when all passed or were skipped). slurmd runs it as root at its start, before it
registers (so a resumed node is drained before it takes a job), and every HealthCheckInterval.
Thresholds come from one comment line the renderer writes into slurm.conf (configless slurmd
fetches it), ``#slurmk8s-health min_disk_free_mb=1024 min_shm_mb=64 ...``; ``SLURMK8S_HEALTH_<KEY>``
environment variables override single values (tests, debugging).

It runs inside the slurmd image under its ``python3``: standard library only, and only what
``python3-minimal`` has too (no ``shutil``, ``shlex``), no import of the rest of the package,
nothing at import time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence

OK, FAIL, SKIP = "ok", "fail", "skip"
MIB = 2**20
CONF_MARKER = "#slurmk8s-health"
CONF_PATHS = ("/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf", "/etc/slurm/slurm.conf")
MPI_PROBE = "/usr/local/lib/slurmk8s/mpi-loopback"
BOOT_MPI = "/run/slurmk8s/health-boot-mpi.json"  # the entrypoint's MPI run (--mpi-boot), for slurmd's first check
DEFAULT_LOG = "/var/log/slurm/healthcheck.log"
REASON_MAX = 200


@dataclass(frozen=True)
class Result:
    check: str
    status: str  # ok | fail | skip
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Config:
    min_disk_free_mb: int = 1024
    min_shm_mb: int = 64
    min_memory_fraction: float = 0.9
    mpi_loopback: bool = True
    gpu: bool = True
    disk_paths: tuple[str, ...] = ("/", "/tmp", "/var/spool/slurmd")
    mpi_timeout: float = 10.0


@dataclass(frozen=True)
class FsStat:
    """What a check needs of ``os.statvfs``: sizes in bytes and the file system's identity."""

    total: int
    free: int  # available to unprivileged users (f_bavail)
    fsid: int = 0


@dataclass(frozen=True)
class SlurmNode:
    """The node's record in slurmctld (``scontrol show node --json``), as far as the checks use it."""

    name: str
    real_memory_mb: int
    alloc_memory_mb: int
    gpus: int
    state: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Proc:
    returncode: int
    stdout: str
    stderr: str = ""


# ---------------------------------------------------------------- configuration


def _parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "yes", "true", "on"):
        return True
    if v in ("0", "no", "false", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _coerce(name: str, value: str) -> Any:  # the type of Config's field `name`: bool, int, float or tuple[str, ...]
    kind = {f.name: f.type for f in fields(Config)}[name]
    if kind == "bool":
        return _parse_bool(value)
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    return tuple(p for p in value.split(",") if p)


def parse_conf_line(text: str) -> dict[str, str]:
    """The key=value pairs of the ``#slurmk8s-health`` line of a slurm.conf ({} if there is none)."""
    for line in text.splitlines():
        if line.startswith(CONF_MARKER + " ") or line.strip() == CONF_MARKER:
            return dict(tok.split("=", 1) for tok in line[len(CONF_MARKER):].split() if "=" in tok)
    return {}


def load_config(conf_text: str | None, env: Mapping[str, str]) -> tuple[Config, list[str]]:
    """Config from the slurm.conf line, then ``SLURMK8S_HEALTH_<KEY>`` overrides -> (config, warnings).

    Unknown keys and bad values are warnings (the default stays): a typo must not drain a cluster.
    """
    values: dict[str, str] = parse_conf_line(conf_text or "")
    for f in fields(Config):
        key = f"SLURMK8S_HEALTH_{f.name.upper()}"
        if key in env:
            values[f.name] = env[key]
    known = {f.name for f in fields(Config)}
    warnings: list[str] = []
    cfg = Config()
    for name, raw in sorted(values.items()):
        if name not in known:
            warnings.append(f"unknown setting {name}={raw} ignored")
            continue
        try:
            cfg = replace(cfg, **{name: _coerce(name, raw)})
        except ValueError as err:
            warnings.append(f"bad value {name}={raw} ignored ({err})")
    return cfg, warnings


# ---------------------------------------------------------------- pure checks


def _mib(n: float) -> str:
    return f"{n / MIB:.0f}MiB"


def check_disk(stats: Mapping[str, FsStat | None], min_free_mb: int) -> Result:
    """Free space on each path (one file system counted once) at least `min_free_mb`."""
    seen: set[int] = set()
    checked: list[str] = []
    for path, st in stats.items():
        if st is None:
            continue  # a path that does not exist on this node is not a problem of this node
        if st.fsid and st.fsid in seen:
            continue
        seen.add(st.fsid)
        if st.free < min_free_mb * MIB:
            return Result("disk", FAIL, f"{path} has {_mib(st.free)} free, below {min_free_mb}MiB")
        checked.append(f"{path} {_mib(st.free)}")
    if not checked:
        return Result("disk", SKIP, "none of the paths exists")
    return Result("disk", OK, "free: " + ", ".join(checked))


def check_shm(st: FsStat | None, min_shm_mb: int) -> Result:
    """The pod's /dev/shm (memory-backed; MPI and NCCL use it) is at least `min_shm_mb` in size."""
    if st is None:
        return Result("shm", FAIL, "/dev/shm is missing")
    if st.total < min_shm_mb * MIB:
        return Result("shm", FAIL, f"/dev/shm is {_mib(st.total)}, below {min_shm_mb}MiB")
    return Result("shm", OK, f"/dev/shm {_mib(st.total)} ({_mib(st.free)} free)")


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {field: bytes}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    return out


def check_memory(meminfo: Mapping[str, int], cgroup_limit: int | None, cgroup_usage: int | None,
                 node: SlurmNode | None, min_fraction: float) -> Result:
    """Memory headroom: what the pod may still use plus what Slurm has given to jobs here must cover
    `min_fraction` of the node's RealMemory. /proc/meminfo is the host's; the pod's cgroup limit
    bounds it."""
    if node is None:
        return Result("memory", SKIP, "node record unavailable (slurmctld not answering?)")
    if "MemAvailable" not in meminfo:
        return Result("memory", FAIL, "no MemAvailable in /proc/meminfo")
    available = meminfo["MemAvailable"]
    where = "host MemAvailable"
    if cgroup_limit is not None and cgroup_usage is not None:
        pod_left = max(0, cgroup_limit - cgroup_usage)
        if pod_left < available:
            available, where = pod_left, "pod cgroup limit - usage"
    headroom = available + node.alloc_memory_mb * MIB
    need = node.real_memory_mb * MIB * min_fraction
    detail = (f"{_mib(available)} available ({where}) + {node.alloc_memory_mb}MiB allocated to jobs"
              f" vs RealMemory {node.real_memory_mb}MiB x {min_fraction:g}")
    return Result("memory", OK if headroom >= need else FAIL, detail)


def _mpi_message(proc: Proc) -> str:
    """The most telling line of a failed run: the probe's own message, else the last line with words
    (mpirun frames its help texts with lines of dashes)."""
    lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if re.search(r"[A-Za-z]", ln)]
    own = [ln for ln in lines if ln.startswith("mpi-loopback:")]
    return (own or lines or ["no output"])[-1]


def check_mpi(enabled: bool, probe_exists: bool, proc: Proc | None, seconds: float) -> Result:
    """A 2-rank MPI run on the node itself (shared-memory transport) prints 'mpi-loopback ok 2'."""
    if not enabled:
        return Result("mpi", SKIP, "mpi_loopback disabled")
    if not probe_exists:
        return Result("mpi", SKIP, f"{MPI_PROBE} not installed in this image")
    if proc is None:
        return Result("mpi", FAIL, "mpirun not found or timed out")
    if proc.returncode != 0 or "mpi-loopback ok 2" not in proc.stdout:
        return Result("mpi", FAIL, f"2-rank loopback exit {proc.returncode}: {_mpi_message(proc)[:120]}")
    return Result("mpi", OK, f"2 ranks in {seconds:.2f}s")


def parse_gres_gpus(gres: str) -> int:
    """GPU count of a Slurm Gres string: 'gpu:h100:8(S:0-1),rdma:1' -> 8, 'gpu:2' -> 2, '' -> 0."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def expand_hostlist(expr: str) -> list[str]:
    """A Slurm hostlist -> its names, in order: 'gpu-[0-2,5]' -> gpu-0 gpu-1 gpu-2 gpu-5;
    '/dev/nvidia4,/dev/nvidia5' -> both. Raises ValueError on a malformed expression."""
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item:
            out += _expand_one(item)
    return out


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1:end], item[end + 1:]
    tails = _expand_one(rest)
    out = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        for n in range(int(lo), int(hi or lo) + 1):
            out += [f"{prefix}{n:0{len(lo)}d}{tail}" for tail in tails]
    return out


def parse_gres_conf(text: str, read: Callable[[str], str | None], base_dir: str = "/",
                    depth: int = 0) -> list[dict[str, str]]:
    """gres.conf text -> its records ({lowercased key: value}), with `Include`d files read in place
    (relative paths from `base_dir`, as Slurm resolves them from slurm.conf's directory)."""
    records: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("include") and line[7:8].isspace():
            path = line[7:].strip()
            path = path if path.startswith("/") else os.path.join(base_dir, path)
            included = read(path) if depth < 4 else None
            if included is not None:
                records += parse_gres_conf(included, read, base_dir, depth + 1)
            continue
        records.append({k.lower(): v for k, _, v in (tok.partition("=") for tok in line.split())})
    return records


def gpu_device_files(records: Sequence[Mapping[str, str]], node: str) -> list[str]:
    """The device files gres.conf gives `node` for Name=gpu (lines for all nodes or naming it)."""
    files: list[str] = []
    for rec in records:
        if rec.get("name") != "gpu" or not rec.get("file"):
            continue
        try:
            if rec.get("nodename") and node not in expand_hostlist(rec["nodename"]):
                continue
            files += expand_hostlist(rec["file"])
        except ValueError:
            continue  # slurmd refuses such a file; nothing to check here
    return files


def check_gpu(enabled: bool, node: SlurmNode | None, smi_list: Proc | None, smi: Proc | None,
              files: Mapping[str, bool] | None = None) -> Result:
    """GPU pools: each GPU device file gres.conf names for the node exists, and as many as the node's
    Gres; `nvidia-smi -L` lists as many GPUs; `nvidia-smi` succeeds. `files`: {path: exists}, in
    gres.conf order (None: not checked)."""
    if not enabled:
        return Result("gpu", SKIP, "gpu checks disabled")
    if node is None:
        return Result("gpu", SKIP, "node record unavailable (slurmctld not answering?)")
    if node.gpus == 0:
        return Result("gpu", SKIP, "no GPU expected (the node's Gres has none)")
    if files is not None:
        missing = [path for path, exists in files.items() if not exists]
        if not files:
            return Result("gpu", FAIL, f"gres.conf names no GPU device file for this node, Gres expects {node.gpus}")
        if missing:
            return Result("gpu", FAIL, f"{len(missing)} of the {len(files)} GPU device files in gres.conf missing: "
                                       + ", ".join(missing))
        if len(files) != node.gpus:
            return Result("gpu", FAIL, f"gres.conf names {len(files)} GPU device files, Gres expects {node.gpus}")
    if smi_list is None:
        return Result("gpu", FAIL, f"{node.gpus} GPUs expected but nvidia-smi is missing or hung")
    if smi_list.returncode != 0:
        return Result("gpu", FAIL, f"nvidia-smi -L exit {smi_list.returncode}: {smi_list.stderr.strip()[:120]}")
    found = sum(1 for line in smi_list.stdout.splitlines() if line.startswith("GPU "))
    if found != node.gpus:
        return Result("gpu", FAIL, f"nvidia-smi -L lists {found} GPUs, Gres expects {node.gpus}")
    if smi is None or smi.returncode != 0:
        code = "hung" if smi is None else f"exit {smi.returncode}"
        text = "" if smi is None else (smi.stderr.strip() or smi.stdout.strip())[:120]
        return Result("gpu", FAIL, f"nvidia-smi {code} {text}".strip())
    present = f", device files {','.join(os.path.basename(p) for p in files)} present" if files else ""
    return Result("gpu", OK, f"{found} GPUs, nvidia-smi healthy{present}")


def parse_node_json(text: str, name: str) -> SlurmNode | None:
    """`scontrol show node NAME --json` (data_parser v0.0.40+) -> SlurmNode."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    for n in data.get("nodes") or []:
        if n.get("name") == name:
            return SlurmNode(
                name=name,
                real_memory_mb=int(n.get("real_memory") or 0),
                alloc_memory_mb=int(n.get("alloc_memory") or 0),
                gpus=parse_gres_gpus(n.get("gres") or ""),
                state=tuple(n.get("state") or ()),
                reason=n.get("reason") or "",
            )
    return None


def drain_reason(failed: Sequence[Result]) -> str:
    first = failed[0]
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    reason = f"health: {first.check}: {first.detail}{more}"
    return reason[:REASON_MAX].replace('"', "'")


# Slurm's flags of a node being suspended or suspended: its worker is going away
LEAVING = ("POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN")


def why_not_drain(node: SlurmNode | None) -> str | None:
    """Why this check's failure drains nothing, or None to drain. An operator's drain (or an
    earlier health drain) keeps its reason. A node on its way down is left alone: suspending
    it cleared its DRAIN (SlurmctldParameters=idle_on_node_suspend) so that its next resume
    gets a fresh worker, checked at its start; draining it again in the grace before this
    worker is gone would leave it drained while powered down."""
    if node is None:
        return None
    if "DRAIN" in node.state:
        return f"already drained ({node.reason}); not overwriting the reason"
    leaving = [flag for flag in LEAVING if flag in node.state]
    return f"not draining: the node is {leaving[0]} (its next worker is checked at its start)" if leaving else None


def drain_argv(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=DRAIN", f"reason={reason}"]


# ---------------------------------------------------------------- measuring (I/O)


def statvfs(path: str) -> FsStat | None:
    try:
        st = os.statvfs(path)
        dev = os.stat(path).st_dev
    except OSError:
        return None
    return FsStat(total=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize, fsid=dev)


def read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cgroup_memory(root: str = "/sys/fs/cgroup") -> tuple[int | None, int | None]:
    """(limit, working set) in bytes of this container's memory cgroup, v2 or v1; None where
    unlimited/unknown. Working set = usage - inactive page cache (as the kubelet counts it): files
    that jobs wrote fill the page cache up to the limit, which is reclaimable, not missing memory."""
    for limit_file, usage_file, stat_file, inactive_key in (
            ("memory.max", "memory.current", "memory.stat", "inactive_file"),
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
             "total_inactive_file")):
        limit = read_text(os.path.join(root, limit_file))
        usage = read_text(os.path.join(root, usage_file))
        if limit is None or usage is None:
            continue
        limit = limit.strip()
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None, None
        inactive = 0
        for line in (read_text(os.path.join(root, stat_file)) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key and value.strip().isdigit():
                inactive = int(value)
        return int(limit), max(0, int(usage.strip()) - inactive)
    return None, None


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Proc | None:
    """Run argv; None when it cannot start or times out."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Proc(p.returncode, p.stdout, p.stderr)


def mpi_env(env: Mapping[str, str]) -> dict[str, str]:
    """No Slurm variables (mpirun must not think it is inside an allocation); root allowed. slurmd
    starts the check with almost no environment, and OpenMPI fails ("Failed initializing opal")
    without HOME: give it HOME and PATH."""
    out = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SLURMD_", "PMIX_", "OMPI_"))}
    out.setdefault("HOME", "/root")
    out.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    out.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return out


MPI_ARGV = ("mpirun", "--oversubscribe", "-n", "2", "--mca", "pml", "ob1", "--mca", "btl", "self,sm", MPI_PROBE)


def find_conf_path(env: Mapping[str, str]) -> str | None:
    """The slurm.conf slurmd uses (configless: its cached copy)."""
    for path in ((env["SLURM_CONF"],) if env.get("SLURM_CONF") else ()) + CONF_PATHS:
        if read_text(path) is not None:
            return path
    return None


def find_conf(env: Mapping[str, str]) -> str | None:
    path = find_conf_path(env)
    return read_text(path) if path else None


def configured_gpu_files(env: Mapping[str, str], node_name: str) -> list[str]:
    """The GPU device files of this node in the gres.conf beside slurm.conf, includes followed (the
    rendered one includes the file the worker's entrypoint wrote from the pod's /dev/nvidia<N>)."""
    conf = find_conf_path(env)
    if conf is None:
        return []
    conf_dir = os.path.dirname(conf)
    text = read_text(os.path.join(conf_dir, "gres.conf"))
    return gpu_device_files(parse_gres_conf(text or "", read_text, conf_dir), node_name)


def run_boot_mpi(path: str, env: Mapping[str, str], timeout: float, runner: Callable[..., Proc | None] = run) -> None:
    """The entrypoint's MPI run for slurmd's first check: its result to `path` (whole, by rename;
    returncode None: could not start or timed out), then `path`.pending removed."""
    start = time.monotonic()
    p = runner(list(MPI_ARGV), timeout, mpi_env(env))
    doc = {"returncode": p and p.returncode, "stdout": p and p.stdout or "", "stderr": p and p.stderr or "",
           "seconds": time.monotonic() - start}
    with open(path + ".new", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".new", path)
    _remove(path + ".pending")


def take_boot_mpi(path: str, timeout: float, poll: float = 0.02) -> tuple[Proc | None, float] | None:
    """That result (waited for while pending, at most `timeout`), removed: only slurmd's first check
    uses it; None when there is none. One that never came counts as timed out."""
    deadline = time.monotonic() + timeout
    if not (os.path.exists(path) or os.path.exists(path + ".pending")):
        return None
    while not os.path.exists(path) and os.path.exists(path + ".pending") and time.monotonic() < deadline:
        time.sleep(poll)
    try:
        doc = json.load(open(path))  # noqa: SIM115 -- read once, closed when collected
        code, seconds = doc["returncode"], float(doc["seconds"])
        proc = None if code is None else Proc(int(code), str(doc["stdout"]), str(doc["stderr"]))
    except (OSError, ValueError, TypeError, KeyError):
        proc, seconds = None, float(timeout)
    _remove(path, path + ".pending")
    return proc, seconds


def _remove(*paths: str) -> None:
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)


def gather(cfg: Config, node_name: str, env: Mapping[str, str],
           runner: Callable[..., Proc | None] = run) -> tuple[list[Result], SlurmNode | None]:
    """Measure and run every check on this node."""
    proc = runner(["scontrol", "show", "node", node_name, "--json"], 15)
    node = parse_node_json(proc.stdout, node_name) if proc is not None and proc.returncode == 0 else None
    results = [check_disk({p: statvfs(p) for p in cfg.disk_paths}, cfg.min_disk_free_mb),
               check_shm(statvfs("/dev/shm"), cfg.min_shm_mb)]
    limit, usage = cgroup_memory()
    results.append(check_memory(parse_meminfo(read_text("/proc/meminfo") or ""), limit, usage, node,
                                cfg.min_memory_fraction))
    probe = os.access(MPI_PROBE, os.X_OK)
    mpi_proc, seconds = None, 0.0
    boot = take_boot_mpi(env.get("SLURMK8S_HEALTH_BOOT_MPI", BOOT_MPI), cfg.mpi_timeout)
    if cfg.mpi_loopback and probe and boot is not None:  # slurmd's first check: the entrypoint's run
        mpi_proc, seconds = boot
    elif cfg.mpi_loopback and probe:
        start = time.monotonic()
        mpi_proc = runner(list(MPI_ARGV), cfg.mpi_timeout, mpi_env(env))
        seconds = time.monotonic() - start
    results.append(check_mpi(cfg.mpi_loopback, probe, mpi_proc, seconds))
    smi_list = smi = files = None
    if cfg.gpu and node is not None and node.gpus:
        files = {path: os.path.exists(path) for path in configured_gpu_files(env, node_name)}
        smi_list = runner(["nvidia-smi", "-L"], 20)
        smi = runner(["nvidia-smi"], 20) if smi_list is not None and smi_list.returncode == 0 else None
    results.append(check_gpu(cfg.gpu, node, smi_list, smi, files))
    return results, node


@dataclass
class Log:
    path: str | None
    node: str

    def write(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} slurmk8s-healthcheck[{os.getpid()}] {self.node}: {message}\n"
        sys.stderr.write(line)
        if self.path:
            try:
                with open(self.path, "a") as fh:
                    fh.write(line)
            except OSError as err:
                sys.stderr.write(f"cannot append to {self.path}: {err}\n")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
         runner: Callable[..., Proc | None] = run) -> int:
    parser = argparse.ArgumentParser(prog="slurmk8s-healthcheck",
                                     description="Check this worker; drain it in Slurm when a check fails.")
    parser.add_argument("--node", help="Slurm node name (default: $SLURMD_NODENAME, $SLURMK8S_NODENAME, hostname)")
    parser.add_argument("--no-drain", action="store_true", help="only report (exit 1 on a failure)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--mpi-boot", action="store_true", help="only the MPI run, kept for slurmd's first check")
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    if args.mpi_boot:
        run_boot_mpi(env.get("SLURMK8S_HEALTH_BOOT_MPI", BOOT_MPI), env, Config().mpi_timeout, runner)
        return 0
    node_name = args.node or env.get("SLURMD_NODENAME") or env.get("SLURMK8S_NODENAME") or socket.gethostname()
    log = Log(env.get("SLURMK8S_HEALTH_LOG", DEFAULT_LOG) or None, node_name)
    cfg, warnings = load_config(find_conf(env), env)
    for w in warnings:
        log.write(f"config: {w}")
    results, node = gather(cfg, node_name, env, runner)
    for r in results:
        log.write(f"{r.check}: {r.status}: {r.detail}")
    if args.json:
        print(json.dumps([r.__dict__ for r in results]))
    failed = [r for r in results if r.failed]
    if not failed:
        return 0
    reason = drain_reason(failed)
    if args.no_drain:
        log.write(f"would drain ({reason}); --no-drain")
    elif (why := why_not_drain(node)) is not None:
        log.write(why)
    else:
        proc = runner(drain_argv(node_name, reason), 15)
        if proc is None or proc.returncode != 0:
            log.write(f"DRAIN FAILED: {'' if proc is None else proc.stderr.strip()}")
        else:
            log.write(f"drained: {reason}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
