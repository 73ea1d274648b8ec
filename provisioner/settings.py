"""Every ``SLURMK8S_*`` environment key of the package: the one registry, and the settings each
process builds from its environment.

The registry (:data:`KEYS`) names each key with its default (the one place it is spelled), how
its value is read, who reads it and what it means; docs/configuration.md's table of process
settings is :func:`table`'s output (tests/test_settings.py checks it). It also holds the keys the
package only sets, for an image's entrypoint or a job to read (``python=False``): the manifests
name them by the constants below.

A process reads its keys through one immutable settings object, built once from its environment
with ``from_env(env)``: :class:`Programs` (slurmctld's power-saving programs and PrologSlurmctld),
:class:`Backoff` (their pool backoff, and the reconcile loop's), :class:`ClusterFiles` (the spec,
site and namespace of the pods that run against the cluster), :class:`Reconcile` (the reconcile
loop), :class:`SlurmctldStart` (the slurmctld container's first steps), :class:`Docker` (the test
bed's node backend) and :class:`Cli` (the laptop's commands). No module reads a key on its own
(tests/test_settings.py), but for provisioner/health.py: it is copied alone into the slurmd image
and imports nothing of the package, so it reads its keys itself, with the defaults listed here
(the test checks they agree).

Standard library and the light :mod:`provisioner.names` only, nothing parsed at import time: the
programs Slurm starts import this (the prolog for every job). Hence NamedTuples, not frozen
dataclasses: defining these eight as dataclasses took about 5 ms more, on every job's prolog.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, NamedTuple

from . import names

# Who reads a key: the process, as the docs' table says it.
PROGRAMS = "programs"  # slurmctld's Resume/Suspend/ResumeFailProgram and PrologSlurmctld (elastic/)
RECONCILE = "reconcile loop"  # the slurmctld pod's reconcile container (reconcile/), and the programs it serves warm
SLURMCTLD_START = "slurmctld start"  # the slurmctld container's entrypoint: pod files, render config, sync nodes
ACCOUNTING = "accounting"  # the slurmctld pod's accounting container (its wait for the configuration)
HOOK = "Helm hook"  # slurmk8s-delete-workers (pre-delete)
AGENT = "login agent"  # the login pod's wake agent, and the REST API's waking front (controltier/)
HEALTH = "worker health check"  # provisioner/health.py, slurmd's HealthCheckProgram
DOCKER = "Docker test bed"  # the slurmctld container of the integration tests (elastic/docker_backend.py)
CLI = "CLI"  # the `slurmk8s` commands on the operator's machine
# read by no Python of the package: set by it for an image's entrypoint (shell), a job or a tool
SLURMD_ENTRYPOINT = "slurmd entrypoint"
SLURMCTLD_ENTRYPOINT = "slurmctld entrypoint"
LOGIN_ENTRYPOINT = "login entrypoint"
DB_ENTRYPOINTS = "database entrypoints"  # mariadb.sh, slurmdbd.sh's check-db
ANY_ENTRYPOINT = "every entrypoint"  # images/entrypoint/lib.sh
PULUMI_PROVIDER = "Pulumi's dynamic provider"  # the script the CLI writes (deploy/automation.py)

KINDS = ("str", "path", "int", "float", "flag", "bool", "json", "list")


class Key(NamedTuple):
    """One environment key. `default`: the value used when the key is unset, spelled as the
    environment would spell it (None: no fixed one; `default_doc` says what happens then).
    `empty_is_unset`: an empty value means the default (else it is a value: an empty path turns
    the file off where the reader allows that). `invalid`: what an unparsable number reads as
    (default: the default). kind: str | path (text) | int | float (unparsable: `invalid`) | flag
    ("0"/"1": the value other than the default must be spelled exactly) | bool (health.py's: 1/yes/
    true/on or 0/no/false/off) | json | list (commas)."""

    name: str
    default: str | None
    kind: str
    readers: tuple[str, ...]
    doc: str
    empty_is_unset: bool = False
    default_doc: str = ""
    invalid: str | None = None
    python: bool = True  # read by the package's Python (else only set by it)
    required: bool = False  # a reader that needs it says so when it is unset (MissingSetting)

    def parse(self, raw: str) -> Any:
        if self.kind in ("str", "path"):
            return raw
        if self.kind in ("float", "int"):
            fallback = self.default if self.invalid is None else self.invalid
            try:
                # an int's value as a float first (SLURMK8S_PARALLEL=8.0 is 8), so nan and inf are unparsable too
                return int(float(raw)) if self.kind == "int" else float(raw)
            except (ValueError, OverflowError):
                return None if fallback is None else self.parse(fallback)
        if self.kind == "flag":
            return raw != "0" if self.default == "1" else raw == "1"
        if self.kind == "bool":  # health.py's own parse of its overrides
            return raw.strip().lower() in ("1", "yes", "true", "on")
        if self.kind == "json":
            import json

            return json.loads(raw)
        return tuple(p for p in raw.split(",") if p)  # list

    def read(self, env: Mapping[str, str]) -> Any:
        """The parsed value in `env`, else the parsed default (None without one)."""
        raw = self.given(env)
        if raw is None:
            raw = self.default
        if raw is None:
            if self.required:
                raise MissingSetting(self.name)
            return None
        return self.parse(raw)

    def given(self, env: Mapping[str, str]) -> str | None:
        """The raw value set in `env`; None when unset (or empty, where empty means unset)."""
        raw = env.get(self.name)
        return None if raw is None or (raw == "" and self.empty_is_unset) else raw


class MissingSetting(KeyError):
    """A required key is unset. A KeyError (what a reader raised before), that names the key."""

    def __init__(self, name: str, where: str = "") -> None:
        super().__init__(name)
        self.name, self.where = name, where

    def __str__(self) -> str:
        return f"{self.name} is not set" + (f" {self.where}" if self.where else "")


KEYS: dict[str, Key] = {}


def _key(name: str, default: str | None, kind: str, readers: tuple[str, ...], doc: str, **more: Any) -> str:
    assert name.startswith("SLURMK8S_") and name not in KEYS and kind in KINDS, name
    KEYS[name] = Key(name, default, kind, readers, doc, **more)
    return name


def default(name: str) -> Any:
    """The parsed default of a key (None without a fixed one)."""
    key = KEYS[name]
    return None if key.default is None else key.parse(key.default)


def _get(env: Mapping[str, str], name: str) -> Any:
    return KEYS[name].read(env)


def _given(env: Mapping[str, str], name: str) -> Any:
    """The parsed value set in `env`, None when unset: where the reader's fallback is no fixed default."""
    key = KEYS[name]
    raw = key.given(env)
    return None if raw is None else key.parse(raw)


def missing(env: Mapping[str, str], *keys: str) -> list[str]:
    """Those of `keys` unset (or empty) in `env`, in order (a reader that needs them all says which)."""
    return [k for k in keys if not env.get(k)]


# ---------------------------------------------------------------- the registry

_P, _R = (PROGRAMS,), (RECONCILE,)
_PR = (PROGRAMS, RECONCILE)
# slurmctld's programs: read from the env file under the process environment (elastic.context.program_env)
ENV_FILE = _key("SLURMK8S_ENV_FILE", f"{names.POD_FILES_DIR}/{names.ELASTIC_ENV_KEY}", "path", _PR,
                "KEY=VALUE lines read under the process environment (Slurm starts the programs with a minimal one)")
LOG = _key("SLURMK8S_LOG", f"{names.SLURMK8S_LOG_DIR}/elastic.log", "path", _PR,
           "the programs' log file (empty: none); the loop logs to reconcile.log beside it")
INVENTORY = _key("SLURMK8S_INVENTORY", f"{names.SLURM_CONF_DIR}/inventory.json", "path", (PROGRAMS, RECONCILE, SLURMCTLD_START),
                 "inventory.json, written with the Slurm configuration: the Slurm nodes and their pools")
BACKEND = _key("SLURMK8S_BACKEND", "docker", "str", _PR, "the node backend: kubernetes or docker (elastic/backend.py)")
BUDGET = _key("SLURMK8S_BUDGET", None, "float", _P,
              "seconds the resume / suspend / resume-fail backend calls may take", invalid="20",
              default_doc="20 per wave of SLURMK8S_PARALLEL calls, at most Slurm's timeout less a margin")
PARALLEL = _key("SLURMK8S_PARALLEL", "8", "int", _P, "backend calls in flight at once (at least 1)")
EVENTS = _key("SLURMK8S_EVENTS", f"{names.SLURMK8S_LOG_DIR}/events.jsonl", "path", _PR,
              "JSON lines, one per decision and its outcome, which the loop tails for its metrics (empty: none)")
LEDGER = _key("SLURMK8S_LEDGER", f"{names.STATE_DIR}/slurmk8s/ledger.json", "path", _PR,
              "the per-pool resume failure history the programs and the loop share (programs: empty: none)")
PROGRAM_SOCKET = _key("SLURMK8S_PROGRAM_SOCKET", f"{names.PROGRAM_SOCKET_DIR}/programs.sock", "path", _PR,
                      "where the loop serves the programs warm (elastic/warm.py); empty: each runs in its own process")
PROLOG_TIMEOUT = _key("SLURMK8S_PROLOG_TIMEOUT", "0", "float", _P,
                      "seconds PrologSlurmctld waits for the job's nodes; 0: slurm.conf's ResumeTimeout")
HEAD_START = _key("SLURMK8S_HEAD_START", "1", "flag", _P,
                  "0: the prolog asks the loop for no head start (pods made before Slurm's resume call)")
BACKOFF_FAILURES = _key("SLURMK8S_BACKOFF_FAILURES", "3", "int", _PR,
                        "consecutive resume failures of a pool that start its backoff")
BACKOFF_WINDOW = _key("SLURMK8S_BACKOFF_WINDOW", "600", "float", _PR,
                      "seconds within which those failures count")
BACKOFF_COOLOFF = _key("SLURMK8S_BACKOFF_COOLOFF", "300", "float", _PR,
                       "seconds a backed-off pool's resumes are refused after its last failure, then one trial")
# the files of the cluster, in its pods
SPEC = _key("SLURMK8S_SPEC", f"{names.SPEC_DIR}/spec.json", "path", (PROGRAMS, RECONCILE, SLURMCTLD_START, HOOK),
            "the cluster spec (JSON) the in-cluster programs render and build worker pods from")
SITE = _key("SLURMK8S_SITE", f"{names.SPEC_DIR}/site.json", "path", (PROGRAMS, RECONCILE, SLURMCTLD_START),
            "the site: the Kubernetes cluster's DNS domain, hostNetwork sources (missing: cluster.local)")
NAMESPACE = _key("SLURMK8S_NAMESPACE", None, "str", (PROGRAMS, RECONCILE, ACCOUNTING, HOOK, AGENT),
                 "the cluster's namespace (the Helm hook needs it)",
                 default_doc="the ServiceAccount's namespace, else the spec's")
# the reconcile loop
RECONCILE_LOG = _key("SLURMK8S_RECONCILE_LOG", None, "path", _R, "the loop's log file", empty_is_unset=True,
                     default_doc="reconcile.log beside SLURMK8S_LOG")
USAGE = _key("SLURMK8S_USAGE", f"{names.STATE_DIR}/slurmk8s/usage.json", "path", _R,
             "node-seconds since `up`, kept across restarts and sleeps")
TIER_LOG = _key("SLURMK8S_TIER_LOG", f"{names.STATE_DIR}/slurmk8s/control-tier.log", "path", _R,
                "the control tier's sleeps and wakes, on the state volume")
CONFIG_CACHE = _key("SLURMK8S_CONFIG_CACHE", f"{names.STATE_DIR}/slurmk8s/config", "path", _R,
                    "the loop's copy of the Slurm configuration, for a start without Python (livenodes/cache.py)")
RENDER_ID = _key("SLURMK8S_RENDER_ID", "/opt/slurmk8s/render-id", "path", _R,
                 "the file naming the image's renderer, which that copy is made by")
# the slurmctld container's start
POD_FILES = _key("SLURMK8S_POD_FILES", "", "str", (SLURMCTLD_START,),
                 "what slurmk8s-pod-files reads from the API: kind/name:dir entries separated by spaces")
CONFIG_INIT = _key("SLURMK8S_CONFIG_INIT", None, "path", (SLURMCTLD_ENTRYPOINT,),
                   "the program that fills the slurm-config emptyDir before slurmctld starts", python=False,
                   default_doc="none: the mounted configuration")
# the Docker test bed (its slurmctld container's environment, set by the test fixture)
DOCKER_CLUSTER = _key("SLURMK8S_DOCKER_CLUSTER", None, "str", (DOCKER,),
                      "the label value identifying the cluster's containers", required=True, empty_is_unset=True)
DOCKER_NETWORK = _key("SLURMK8S_DOCKER_NETWORK", None, "str", (DOCKER,), "the Docker network the workers join",
                      required=True, empty_is_unset=True)
CONTROLLER = _key("SLURMK8S_CONTROLLER", None, "str", (DOCKER, SLURMD_ENTRYPOINT, LOGIN_ENTRYPOINT),
                  "host:port of slurmctld, as workers and login are told (set by the manifests)",
                  required=True, empty_is_unset=True, default_doc="required by the Docker test bed")
DOCKER_IMAGE = _key("SLURMK8S_DOCKER_IMAGE", "slurmk8s/slurmd:dev", "str", (DOCKER,), "the workers' slurmd image",
                    empty_is_unset=True)
DOCKER_MOUNTS = _key("SLURMK8S_DOCKER_MOUNTS", "[]", "json", (DOCKER,),
                     'the workers\' mounts: a list of {"type": "bind"|"volume", "source", "target", "read_only"}',
                     empty_is_unset=True)
DOCKER_ENV = _key("SLURMK8S_DOCKER_ENV", "{}", "json", (DOCKER,), "extra environment of the workers (an object)",
                  empty_is_unset=True)
DOCKER_SECURITY = _key("SLURMK8S_DOCKER_SECURITY", "{}", "json", (DOCKER,),
                       "the worker pod's securityContext as Docker HostConfig keys (CapDrop, CapAdd, SecurityOpt)",
                       empty_is_unset=True)
DOCKER_SOCKET = _key("SLURMK8S_DOCKER_SOCKET", "/var/run/docker.sock", "path", (DOCKER,), "the engine's socket",
                     empty_is_unset=True)
DOCKER_OVERRIDES = _key("SLURMK8S_DOCKER_OVERRIDES", None, "path", (DOCKER,),
                        'a JSON file read on every call, for tests: {"images": {node: image}, "fail": {node: reason}}',
                        empty_is_unset=True, default_doc="none")
# the CLI
TOOLCHAIN_DIR = _key("SLURMK8S_TOOLCHAIN_DIR", "/var/cache/slurmk8s/toolchain", "path", (CLI,),
                     "where `slurmk8s toolchain build` puts the Pulumi CLI and provider", empty_is_unset=True)
PULUMI = _key("SLURMK8S_PULUMI", None, "path", (CLI,), "the Pulumi CLI to use, before the toolchain's and PATH's",
              empty_is_unset=True, default_doc="none")
STATE_DIR = _key("SLURMK8S_STATE_DIR", "~/.slurmk8s/state", "path", (CLI,),
                     "the Pulumi state (local backend) and workspace; --state-dir wins", empty_is_unset=True)
PYTHON = _key("SLURMK8S_PYTHON", None, "path", (CLI, PULUMI_PROVIDER),
              "the Python that runs Pulumi's dynamic provider (set for the engine)", empty_is_unset=True,
              default_doc="the Python running slurmk8s")
SKIP_IMAGE_CHECK = _key("SLURMK8S_SKIP_IMAGE_CHECK", "0", "flag", (CLI,), "1: `up` skips its check of the images")
IDENTIFY = _key("SLURMK8S_IDENTIFY", "0", "flag", (ANY_ENTRYPOINT,),
                "1: the image only prints who it is (the CLI's image check sets it)", python=False)
REPO = _key("SLURMK8S_REPO", None, "path", (CLI,), "the source checkout `slurmk8s images` builds from",
            empty_is_unset=True, default_doc="the checkout holding the package")
BIN = _key("SLURMK8S_BIN", None, "path", (CLI,), "the local cluster's tool binaries (`slurmk8s local`)",
           empty_is_unset=True, default_doc="`toolchain.sh path`")
BASE_IMAGE = _key("SLURMK8S_BASE_IMAGE", "debian:trixie-slim", "str", (CLI,),
                  "the base image of the local cluster's Kueue image (images/build.sh's too)", empty_is_unset=True)
# the worker pods (slurmd), set by the manifests (and the Docker test bed)
NODENAME = _key("SLURMK8S_NODENAME", None, "str", (HEALTH, SLURMD_ENTRYPOINT), "the worker's Slurm node name",
                empty_is_unset=True, default_doc="$SLURMD_NODENAME, else the hostname")
POOL = _key("SLURMK8S_POOL", None, "str", (SLURMD_ENTRYPOINT,), "the worker's pool", python=False,
            default_doc="set by the manifests")
GPUS = _key("SLURMK8S_GPUS", "0", "int", (SLURMD_ENTRYPOINT,), "the node's GPU count, for its gres.conf line",
            python=False)
GPU_TYPE = _key("SLURMK8S_GPU_TYPE", "", "str", (SLURMD_ENTRYPOINT,), "the node's GPU type, for its gres.conf line",
                python=False)
MEMLOCK_UNLIMITED = _key("SLURMK8S_MEMLOCK_UNLIMITED", "1", "flag", (SLURMD_ENTRYPOINT,),
                         "1: raise the locked-memory limit (pools[].network.memlock_unlimited)", python=False)
CONTAINERS = _key("SLURMK8S_CONTAINERS", "0", "flag", (SLURMD_ENTRYPOINT,),
                  "1: make each user's crun state directory (pools[].containers)", python=False)
JOB_ENV = _key("SLURMK8S_JOB_ENV", "", "str", (SLURMD_ENTRYPOINT,),
               "the pool's `export NAME=value` lines for the TaskProlog (pools[].network.nccl_env)", python=False)
# the worker health check (provisioner/health.py reads these itself: it imports nothing of the package)
HEALTH_BOOT_MPI = _key("SLURMK8S_HEALTH_BOOT_MPI", "/run/slurmk8s/health-boot-mpi.json", "path", (HEALTH,),
                       "the entrypoint's MPI run (--mpi-boot), kept for slurmd's first check")
HEALTH_LOG = _key("SLURMK8S_HEALTH_LOG", "/var/log/slurm/healthcheck.log", "path", (HEALTH,),
                  "the health check's log file (empty: stderr only)")
_CONF = "; overrides slurm.conf's #slurmk8s-health value"
HEALTH_MIN_DISK_FREE_MB = _key("SLURMK8S_HEALTH_MIN_DISK_FREE_MB", "1024", "int", (HEALTH,),
                               "MiB each checked file system must have free" + _CONF)
HEALTH_MIN_SHM_MB = _key("SLURMK8S_HEALTH_MIN_SHM_MB", "64", "int", (HEALTH,), "MiB /dev/shm must have" + _CONF)
HEALTH_MIN_MEMORY_FRACTION = _key("SLURMK8S_HEALTH_MIN_MEMORY_FRACTION", "0.9", "float", (HEALTH,),
                                  "the share of RealMemory the pod must have" + _CONF)
HEALTH_MPI_LOOPBACK = _key("SLURMK8S_HEALTH_MPI_LOOPBACK", "1", "bool", (HEALTH,), "run the MPI loopback check" + _CONF)
HEALTH_GPU = _key("SLURMK8S_HEALTH_GPU", "1", "bool", (HEALTH,), "run the GPU check" + _CONF)
HEALTH_DISK_PATHS = _key("SLURMK8S_HEALTH_DISK_PATHS", "/,/tmp,/var/spool/slurmd", "list", (HEALTH,),
                         "the file systems the disk check measures" + _CONF)
HEALTH_MPI_TIMEOUT = _key("SLURMK8S_HEALTH_MPI_TIMEOUT", "10", "float", (HEALTH,),
                          "seconds the MPI loopback run may take" + _CONF)
# the accounting database's pods
DB_NAME = _key("SLURMK8S_DB_NAME", "slurm_acct_db", "str", (DB_ENTRYPOINTS,), "the accounting database",
               python=False)
DB_USER = _key("SLURMK8S_DB_USER", "slurm", "str", (DB_ENTRYPOINTS,), "slurmdbd's database account", python=False)
DB_BUFFER_POOL = _key("SLURMK8S_DB_BUFFER_POOL", "256M", "str", (DB_ENTRYPOINTS,),
                      "MariaDB's InnoDB buffer pool (accounting.database_buffer_pool)", python=False)
DB_HOST = _key("SLURMK8S_DB_HOST", None, "str", (DB_ENTRYPOINTS,), "the database's host, for check-db", python=False,
               default_doc="required by check-db")
DB_PORT = _key("SLURMK8S_DB_PORT", "3306", "int", (DB_ENTRYPOINTS,), "the database's port, for check-db", python=False)


# ---------------------------------------------------------------- each process's settings


class Programs(NamedTuple):
    """slurmctld's power-saving programs and PrologSlurmctld (elastic/), from the env file under the
    process environment (elastic.context.program_env). `events` / `ledger`: None when unset; the
    programs' entry points set the registry's defaults (elastic.programs.with_program_defaults),
    so a Context a test builds without them writes neither. `budget`: None when unset (per wave)."""

    env_file: str
    log: str
    inventory: str
    backend: str
    budget: float | None
    parallel: int
    events: str | None
    ledger: str | None
    program_socket: str
    prolog_timeout: float
    head_start: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Programs":
        return cls(env_file=_get(env, ENV_FILE), log=_get(env, LOG), inventory=_get(env, INVENTORY),
                   backend=_get(env, BACKEND), budget=_given(env, BUDGET), parallel=max(1, _get(env, PARALLEL)),
                   events=_given(env, EVENTS), ledger=_given(env, LEDGER),
                   program_socket=_get(env, PROGRAM_SOCKET), prolog_timeout=_get(env, PROLOG_TIMEOUT),
                   head_start=_get(env, HEAD_START))


class Backoff(NamedTuple):
    """The pool backoff rule (elastic.ledger.Policy): the programs' and the reconcile loop's."""

    failures: int
    window: float
    cooloff: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Backoff":
        return cls(_get(env, BACKOFF_FAILURES), _get(env, BACKOFF_WINDOW), _get(env, BACKOFF_COOLOFF))


class ClusterFiles(NamedTuple):
    """The cluster's files and namespace as the pods that run against it read them (the Kubernetes
    backend, the loop, the in-cluster render, the Helm hook, the login agent). `site`, `namespace`:
    None when unset (the readers' fallbacks differ: see `site_path`, elastic.k8s_backend.from_env)."""

    spec: str
    site: str | None
    namespace: str | None

    @property
    def site_path(self) -> str:
        """SLURMK8S_SITE where set (even empty), else its default."""
        return self.site if self.site is not None else default(SITE)

    def require_namespace(self, where: str = "") -> str:
        if self.namespace is None:
            raise MissingSetting(NAMESPACE, where)
        return self.namespace

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ClusterFiles":
        return cls(spec=_get(env, SPEC), site=_given(env, SITE), namespace=_given(env, NAMESPACE))


class Reconcile(NamedTuple):
    """The reconcile loop's own files and its backend (the programs' settings too: it serves them)."""

    backend: str
    inventory: str
    ledger: str
    events: str
    usage: str
    log: str
    tier_log: str
    config_cache: str
    render_id: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Reconcile":
        log = _given(env, RECONCILE_LOG) or os.path.join(os.path.dirname(_get(env, LOG)), "reconcile.log")
        return cls(backend=_get(env, BACKEND), inventory=_get(env, INVENTORY), ledger=_get(env, LEDGER),
                   events=_get(env, EVENTS), usage=_get(env, USAGE), log=log, tier_log=_get(env, TIER_LOG),
                   config_cache=_get(env, CONFIG_CACHE), render_id=_get(env, RENDER_ID))


class SlurmctldStart(NamedTuple):
    """What the slurmctld container's first steps read: slurmk8s-pod-files, slurmk8s-sync-nodes."""

    pod_files: str
    inventory: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SlurmctldStart":
        return cls(pod_files=_get(env, POD_FILES), inventory=_get(env, INVENTORY))


class Docker(NamedTuple):
    """The Docker test bed's node backend. Raises MissingSetting for a required key unset, and
    ValueError (json.JSONDecodeError) for a JSON value that does not parse."""

    cluster: str
    network: str
    controller: str
    image: str
    mounts: Any  # JSON: a list of mounts
    env: Any  # JSON: an object
    security: Any  # JSON: an object
    socket: str
    overrides: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Docker":
        return cls(cluster=_get(env, DOCKER_CLUSTER), network=_get(env, DOCKER_NETWORK),
                   controller=_get(env, CONTROLLER), image=_get(env, DOCKER_IMAGE), mounts=_get(env, DOCKER_MOUNTS),
                   env=_get(env, DOCKER_ENV), security=_get(env, DOCKER_SECURITY), socket=_get(env, DOCKER_SOCKET),
                   overrides=_get(env, DOCKER_OVERRIDES))


class Cli(NamedTuple):
    """The laptop's commands. Paths as text, unexpanded (`state_dir` keeps its ``~``); None: no
    fixed default (the command finds one: `bin` from toolchain.sh)."""

    toolchain_dir: str
    pulumi: str | None
    state_dir: str
    python: str
    skip_image_check: bool
    repo: str
    bin: str | None
    base_image: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Cli":
        checkout = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
        return cls(toolchain_dir=_get(env, TOOLCHAIN_DIR), pulumi=_get(env, PULUMI), state_dir=_get(env, STATE_DIR),
                   python=_get(env, PYTHON) or sys.executable, skip_image_check=_get(env, SKIP_IMAGE_CHECK),
                   repo=_get(env, REPO) or checkout, bin=_get(env, BIN), base_image=_get(env, BASE_IMAGE))


# ---------------------------------------------------------------- the docs' table


def table() -> str:
    """docs/configuration.md's table of every key (tests/test_settings.py checks the docs hold it)."""
    rows = ["| Key | Default | Type | Read by | Meaning |", "|---|---|---|---|---|"]
    for key in sorted(KEYS.values(), key=lambda k: k.name):
        shown = key.default_doc or ("required" if key.required else "(empty)" if key.default == "" else f"`{key.default}`")
        meaning = key.doc.replace("|", "\\|")
        rows.append(f"| `{key.name}` | {shown} | {key.kind} | {', '.join(key.readers)} | {meaning} |")
    return "\n".join(rows) + "\n"
