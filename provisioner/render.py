"""Rendering: slurm.conf, topology.conf, gres.conf, oci.conf and the users' passwd/group entries.

Pure: :func:`render_all` returns ``{file name: text}``; nothing is written here (see
:func:`write_files`). Templates use jinja2 with StrictUndefined; output order is deterministic.
Every rendered Slurm file is parsed back and checked against the inventory and topology before it is
returned, so a template bug cannot reach slurmctld.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import hostlist
import jinja2

from . import __version__
from .config import ClusterSpec
from .errors import Issue, RenderError
from .inventory import Inventory, SlurmNode
from .names import JWT_KEY_PATH
from .topology import Block, Switch, Topology, validate_blocks, validate_tree

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("provisioner", "templates"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


@dataclass(frozen=True)
class Site:
    """Where the cluster runs: names that differ between Kubernetes and the container test bed."""

    controller_host: str = "slurmctld-0"
    controller_addr: str | None = None
    bin_dir: str = "/opt/slurmk8s/bin"
    # slurmdbd's Service (resolves in the cluster's namespace from every pod)
    accounting_host: str = "slurmdbd"


SLURMDBD_PORT = 6819

# The worker image's side of the contract (images/README.md, "slurmd"): Slurm's TaskProlog, which
# exports the pool's job environment into every task, and the file where the worker's entrypoint
# writes its node's gres.conf line from the GPU device files the pod really has.
TASK_PROLOG = "/usr/local/lib/slurmk8s/task-prolog"
NODE_GRES_CONF = "/run/slurmk8s/node-gres.conf"
# slurmctld's own lines for that include (its entrypoint links NODE_GRES_CONF to this file of the
# config directory; configless slurmd never fetches it)
GRES_SLURMCTLD_CONF = "gres-slurmctld.conf"
# priority/multifactor weights with fair share first; each can be overridden in slurm.extra_conf
PRIORITY_DEFAULTS = {
    "PriorityWeightFairshare": "10000",
    "PriorityWeightAge": "1000",
    "PriorityWeightJobSize": "0",
    "PriorityWeightPartition": "0",
    "PriorityWeightQOS": "0",
    "PriorityDecayHalfLife": "7-0",
    "PriorityMaxAge": "7-0",
}


# Slurm's defaults (10000 live job records, finished ones included for MinJobAge; arrays of at most
# 1001 tasks) refuse a burst that an ephemeral cluster exists to absorb; bench/load_10k.py measured
# 10,000 jobs queued at once. Each can be overridden in slurm.extra_conf.
THROUGHPUT_DEFAULTS = {
    "MaxJobCount": "50000",
    "MaxArraySize": "10001",
}


# `salloc` without a command starts its shell on the allocation's first node (Slurm's interactive
# step: `srun --interactive --preserve-env --pty $SHELL`), where the job's resources are, instead of
# on the shared login pod. It also makes a race of salloc's own far less likely: salloc forks the
# login shell and only then hands it the terminal, and an interactive bash that looks before the
# hand-over stops itself (SIGTTIN) for good, leaving salloc waiting and the allocation held until
# its time limit: 3 of 125 salloc calls in a row on the 2-core local cluster, none of 240 with the
# interactive step, whose srun touches the terminal only after asking slurmctld for its step
# (docs/researcher-tools.md).
INTERACTIVE_DEFAULTS = {
    "LaunchParameters": "use_interactive_step",
}


# The worker's Epilog (images/slurmd/epilog, the worker image's side of the contract): after each job
# it ends the processes the job left behind, which proctrack/linuxproc loses once they daemonise
# (reparented to the container's init). It also frees the job's nodes for the next job at once:
# without an Epilog, slurmd answers slurmctld's terminate request for a finished job with "already
# complete", and slurmctld only queues a scheduling pass, which its background loop runs at its next
# whole second (or backfill does, each bf_interval): ~1 s of idle node per job end, measured
# 0.86-1.0 s between one job's end and the next one's start on the same nodes. With an Epilog, slurmd
# runs it and sends MESSAGE_EPILOG_COMPLETE, on which slurmctld schedules at once. A site's own
# Epilog (slurm.extra_conf) replaces it.
WORKER_EPILOG = "/usr/local/lib/slurmk8s/epilog"
EPILOG_DEFAULTS = {
    "Epilog": WORKER_EPILOG,
}


def _add_defaults(conf: dict[str, str], defaults: dict[str, str]) -> None:
    """Set each default the user's extra_conf does not set (under any spelling of the key)."""
    for key, value in defaults.items():
        if not any(k.lower() == key.lower() for k in conf):
            conf[key] = value


def compress(names: Iterable[str]) -> str:
    """Node names -> a Slurm hostlist expression (sorted, e.g. 'gpu-[0-7],login')."""
    return hostlist.collect_hostlist(list(names))


def expand(expr: str) -> list[str]:
    return hostlist.expand_hostlist(expr) if expr else []


def _group(nodes: Iterable[SlurmNode], key) -> list[tuple[Any, list[str]]]:
    groups: dict[Any, list[str]] = {}
    for node in nodes:
        groups.setdefault(key(node), []).append(node.name)
    return list(groups.items())


def _add_scheduler_parameter(conf: dict[str, str], name: str, value: str) -> None:
    """Add name=value to SchedulerParameters (kept in `conf` under the user's spelling of the key),
    unless the user's extra_conf already sets that parameter."""
    key = next((k for k in conf if k.lower() == "schedulerparameters"), "SchedulerParameters")
    params = [p for p in conf.get(key, "").split(",") if p.strip()]
    if not any(p.split("=", 1)[0].strip().lower() == name for p in params):
        params.append(f"{name}={value}")
    conf[key] = ",".join(params)


def render_slurm_conf(spec: ClusterSpec, inventory: Inventory, topology: Topology, site: Site) -> str:
    node_lines = [
        {"names": compress(names), "cpus": k[0], "real_memory": k[1], "gres": k[2], "features": k[3], "weight": k[4]}
        for k, names in _group(inventory.nodes, lambda n: (n.cpus, n.real_memory, n.gres, n.features, n.weight))
    ]
    partitions: dict[str, list[str]] = defaultdict(list)
    # a pool whose Kubernetes nodes an autoscaler adds on demand: its partition's nodes get that long
    # more to register (Slurm gives a node the longest ResumeTimeout of its partitions)
    node_start: dict[str, int] = {}
    for pool in spec.pools:
        partitions.setdefault(pool.partition_name, [])
        if pool.node_start_timeout is not None:
            node_start[pool.partition_name] = max(node_start.get(pool.partition_name, 0), pool.node_start_timeout)
    for node in inventory.nodes:
        partitions[node.partition].append(node.name)
    ctld_params = ["enable_configless", "idle_on_node_suspend"]
    extra_conf = dict(spec.slurm.extra_conf)
    _add_defaults(extra_conf, THROUGHPUT_DEFAULTS)
    _add_defaults(extra_conf, INTERACTIVE_DEFAULTS)
    _add_defaults(extra_conf, EPILOG_DEFAULTS)
    if spec.elasticity.fast_start:
        # look for nodes to resume every second instead of every 10 s (with PrologSlurmctld below)
        ctld_params += ["power_save_interval=1", "power_save_min_interval=0"]
        # schedule a batch job at submit time instead of up to 3 s later (idle nodes: ~0.8 s, not ~2.9 s)
        _add_scheduler_parameter(extra_conf, "batch_sched_delay", "0")
        # Slurm reads batch_sched_delay only in its first scheduling pass, which its compiled default
        # (3 s) puts 3 s after slurmctld's start: a job submitted to a woken controller waited for it.
        # The backfill pass reads its settings at start; each second (not 30) it starts such a job, and
        # any that fits beside a blocked one. A cycle may still take Slurm's default 30 s (bf_max_time
        # follows bf_interval unless set), releasing its locks as usual, so a long queue is walked whole.
        _add_scheduler_parameter(extra_conf, "bf_interval", "1")
        _add_scheduler_parameter(extra_conf, "bf_max_time", "30")
    # the pools' job environment reaches every task through the TaskProlog; a TaskProlog of the
    # user's own (slurm.extra_conf) replaces it (it may run ours first)
    task_prolog = None
    if any(p.job_env for p in spec.pools) and not any(k.lower() == "taskprolog" for k in extra_conf):
        task_prolog = TASK_PROLOG
    accounting = None
    if spec.accounting.enabled:
        accounting = {"host": site.accounting_host, "port": SLURMDBD_PORT}
        _add_defaults(extra_conf, PRIORITY_DEFAULTS)
    return _ENV.get_template("slurm.conf.j2").render(
        version=__version__,
        accounting=accounting,
        cluster=spec.slurm_cluster_name,
        controller_host=site.controller_host,
        controller_addr=site.controller_addr,
        jwt_key=JWT_KEY_PATH if spec.rest.enabled else None,
        max_token_lifespan=spec.rest.max_token_lifespan,
        bin_dir=site.bin_dir,
        ctld_params=ctld_params,
        topology_plugin=None if topology.plugin == "flat" else topology.slurm_plugin,
        gres_types=["gpu"] if any(n.gpus for n in inventory.nodes) else [],
        resume_timeout=spec.elasticity.resume_timeout,
        suspend_timeout=spec.elasticity.suspend_timeout,
        suspend_time=spec.elasticity.suspend_time,
        fast_start=spec.elasticity.fast_start,
        task_prolog=task_prolog,
        # an empty value leaves the key out (Slurm's own default), e.g. LaunchParameters: ""
        extra_conf=sorted((k, v) for k, v in extra_conf.items() if str(v).strip()),
        health=spec.health if spec.health.enabled else None,
        node_lines=node_lines,
        max_time=spec.slurm.max_time,
        partitions=[
            {"name": name, "nodes": compress(nodes), "default": name == spec.default_partition,
             "resume_timeout": spec.elasticity.resume_timeout + node_start[name] if name in node_start else None}
            for name, nodes in partitions.items() if nodes
        ],
    )


def render_topology_conf(spec: ClusterSpec, topology: Topology) -> str | None:
    if topology.plugin == "flat":
        return None
    switches = [
        {"name": sw.name,
         "children": f"Nodes={compress(sw.nodes)}" if sw.nodes else f"Switches={','.join(sw.switches)}"}
        for sw in topology.switches
    ]
    blocks = [{"name": b.name, "nodes": compress(b.nodes)} for b in topology.blocks]
    return _ENV.get_template("topology.conf.j2").render(
        version=__version__, cluster=spec.slurm_cluster_name, plugin=topology.plugin,
        switches=switches, blocks=blocks, block_sizes=topology.block_sizes,
    )


def render_gres_conf(spec: ClusterSpec, inventory: Inventory) -> tuple[str, str] | None:
    """(gres.conf, gres-slurmctld.conf), or None without GPU nodes.

    Which device files a pod gets is known only once it runs (a pod given GPUs 4-7 of a node has
    /dev/nvidia4 ... /dev/nvidia7), so gres.conf holds no node line, only an Include of
    NODE_GRES_CONF, a file of each host: on a worker, its entrypoint writes the node's line there
    from the pod's /dev/nvidia<N> (images/slurmd/node-gres); on slurmctld, it is
    gres-slurmctld.conf, a line per group of GPU nodes with their count and type. slurmctld loads
    those before the nodes register (CLOUD nodes) and tracks GPUs by index: the file names there
    stand for "N devices" (it never opens them), and a worker registering the same count with its
    own files keeps that state; with no line at all slurmctld would count 0 and set a node INVAL
    when it registers 4 under a job that already holds some (found by the test bed)."""
    gpu_nodes = [n for n in inventory.nodes if n.gpus]
    if not gpu_nodes:
        return None
    groups = _group(gpu_nodes, lambda n: (n.gpus, n.gpu_type))
    lines = [{"names": compress(names), "type": gtype, "count": count,
              "files": "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"}
             for (count, gtype), names in groups]
    args = {"version": __version__, "cluster": spec.slurm_cluster_name, "lines": lines, "node_conf": NODE_GRES_CONF,
            "slurmctld_conf": GRES_SLURMCTLD_CONF}
    return (_ENV.get_template("gres.conf.j2").render(**args),
            _ENV.get_template("gres-slurmctld.conf.j2").render(**args))


# oci.conf's runtime: rootless crun, its state per user under /run/user/<uid> (made by the worker's
# entrypoint for each user when SLURMK8S_CONTAINERS=1), no cgroup of its own (Slurm's confines it)
OCI_RUNTIME = "crun --rootless=true --cgroup-manager=disabled --root=/run/user/%U/crun"


def render_oci_conf(spec: ClusterSpec) -> str | None:
    """oci.conf (Slurm's container jobs, ``srun --container``), or None when no pool enables
    ``containers``. One file for every node (configless slurmd fetches it from slurmctld)."""
    pools = [p.name for p in spec.pools if p.containers.enabled]
    if not pools:
        return None
    return _ENV.get_template("oci.conf.j2").render(version=__version__, cluster=spec.slurm_cluster_name,
                                                   pools=pools, crun=OCI_RUNTIME)


def render_passwd(spec: ClusterSpec) -> str:
    return "".join(f"{u.name}:x:{u.uid}:{u.primary_gid}:{u.name}:/home/{u.name}:{u.shell}\n" for u in spec.users)


def render_group(spec: ClusterSpec) -> str:
    lines = [f"{u.name}:x:{u.primary_gid}:\n" for u in spec.users]
    for g in spec.groups:
        members = ",".join(u.name for u in spec.users if g.name in u.groups)
        lines.append(f"{g.name}:x:{g.gid}:{members}\n")
    return "".join(lines)


def inventory_json(inventory: Inventory) -> str:
    """The inventory for the in-cluster programs: JSON, one node per line (diffable, and fast to write)."""
    data = inventory.to_json()
    encode = json.JSONEncoder(sort_keys=True).encode  # one encoder for every line (json.dumps makes one per call)
    parts = []
    for key in sorted(data):
        items = ",\n  ".join(encode(item) for item in data[key])
        parts.append(f"{json.dumps(key)}: [\n  {items}\n]" if items else f"{json.dumps(key)}: []")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def render_all(spec: ClusterSpec, inventory: Inventory, topology: Topology, site: Site = Site()) -> dict[str, str]:
    """Every generated file, validated. Raises :class:`RenderError` and returns nothing on a problem."""
    files = {"slurm.conf": render_slurm_conf(spec, inventory, topology, site)}
    topo = render_topology_conf(spec, topology)
    if topo is not None:
        files["topology.conf"] = topo
    gres = render_gres_conf(spec, inventory)
    if gres is not None:
        files["gres.conf"], files[GRES_SLURMCTLD_CONF] = gres
    oci = render_oci_conf(spec)
    if oci is not None:
        files["oci.conf"] = oci
    files["passwd"] = render_passwd(spec)
    files["group"] = render_group(spec)
    files["inventory.json"] = inventory_json(inventory)
    issues = validate_rendered(files, inventory, topology)
    if issues:
        raise RenderError(issues, title="a generated file failed validation (a slurmk8s bug; please report it)")
    return files


# ---------------------------------------------------------------- parsing back, validation


def parse_conf_lines(text: str) -> list[list[tuple[str, str]]]:
    """slurm.conf-style text -> lines of (key, value) pairs; comments and blank lines dropped."""
    lines = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = []
        token = ""
        quoted = False
        for ch in line + " ":
            if ch == '"':
                quoted = not quoted
            if ch.isspace() and not quoted:
                if token:
                    key, _, value = token.partition("=")
                    pairs.append((key, value.strip('"')))
                token = ""
            else:
                token += ch
        lines.append(pairs)
    return lines


def parse_topology_conf(text: str) -> tuple[list[Switch], list[Block], tuple[int, ...]]:
    switches: list[Switch] = []
    blocks: list[Block] = []
    sizes: tuple[int, ...] = ()
    for pairs in parse_conf_lines(text):
        d = dict((k.lower(), v) for k, v in pairs)
        if "switchname" in d:
            switches.append(Switch(d["switchname"], 0, nodes=tuple(expand(d.get("nodes", ""))),
                                   switches=tuple(expand(d.get("switches", "")))))
        elif "blockname" in d:
            blocks.append(Block(d["blockname"], tuple(expand(d.get("nodes", "")))))
        elif "blocksizes" in d:
            sizes = tuple(int(x) for x in d["blocksizes"].split(","))
    return switches, blocks, sizes


def validate_rendered(files: Mapping[str, str], inventory: Inventory, topology: Topology) -> list[Issue]:
    issues: list[Issue] = []
    repeatable = {"nodename", "partitionname"}
    seen: set[str] = set()
    declared: list[str] = []
    in_partitions: set[str] = set()
    defaults = 0
    for pairs in parse_conf_lines(files["slurm.conf"]):
        key, value = pairs[0]
        k = key.lower()
        if k not in repeatable:
            if k in seen:
                issues.append(Issue(f"slurm.conf:{key}", "set twice", "remove the duplicate"))
            seen.add(k)
        if k == "nodename":
            declared += expand(value)
        elif k == "partitionname":
            attrs = dict((a.lower(), b) for a, b in pairs[1:])
            in_partitions.update(expand(attrs.get("nodes", "")))
            defaults += attrs.get("default") == "YES"
    required = {"clustername", "slurmctldhost", "slurmuser", "authtype", "selecttype", "resumeprogram",
                "suspendprogram", "suspendtime", "resumetimeout", "slurmctldparameters", "returntoservice"}
    for key in sorted(required - seen):
        issues.append(Issue(f"slurm.conf:{key}", "missing", "regenerate"))
    for pairs in parse_conf_lines(files["slurm.conf"]):
        if pairs[0][0].lower() not in repeatable and len(pairs) > 1:
            issues.append(Issue(f"slurm.conf:{pairs[0][0]}", "two settings on one line", "fix the template"))
    if sorted(declared) != sorted(inventory.names) or len(declared) != len(set(declared)):
        issues.append(Issue("slurm.conf:NodeName", "declared nodes differ from the inventory", "regenerate"))
    if in_partitions != set(inventory.names):
        issues.append(Issue("slurm.conf:PartitionName", "some nodes are in no partition", "regenerate"))
    if inventory.nodes and defaults != 1:
        issues.append(Issue("slurm.conf:PartitionName", f"{defaults} default partitions", "exactly one is default"))
    if topology.plugin != "flat":
        if "topology.conf" not in files:
            issues.append(Issue("topology.conf", "missing", "regenerate"))
        else:
            switches, blocks, sizes = parse_topology_conf(files["topology.conf"])
            if topology.plugin == "tree":
                issues += validate_tree(switches, inventory.names)
            else:
                issues += validate_blocks(blocks, sizes, inventory.names)
    gpu_nodes = {n.name for n in inventory.nodes if n.gpus}
    if "gres.conf" in files:
        # only the Include of each host's own file: a node line here would add to the pod's line
        lines = [[k for k, _ in pairs] for pairs in parse_conf_lines(files["gres.conf"])]
        if lines != [["Include", NODE_GRES_CONF]]:
            issues.append(Issue("gres.conf", f"must hold only 'Include {NODE_GRES_CONF}'", "regenerate"))
    if GRES_SLURMCTLD_CONF in files:
        gres_nodes: list[str] = []
        for pairs in parse_conf_lines(files[GRES_SLURMCTLD_CONF]):
            gres_nodes += expand(pairs[0][1])
        if sorted(gres_nodes) != sorted(gpu_nodes):
            issues.append(Issue(GRES_SLURMCTLD_CONF, "GPU nodes differ from the inventory", "regenerate"))
    if not (bool(gpu_nodes) == ("gres.conf" in files) == (GRES_SLURMCTLD_CONF in files)):
        issues.append(Issue("gres.conf", "present without GPU nodes, or missing with them", "regenerate"))
    return issues


def write_files(files: Mapping[str, str], out_dir: str | Path) -> list[Path]:
    """Write all files or none: each goes to a temporary file first, then all are renamed in."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[str, Path]] = []
    try:
        for name, text in sorted(files.items()):
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=out)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(tmp_name, 0o644)
            staged.append((name, Path(tmp_name)))
    except BaseException:
        for _, tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    written = []
    for name, tmp in staged:
        os.replace(tmp, out / name)
        written.append(out / name)
    return written
