"""The cluster spec: typed, validated models for one slurmk8s cluster.

A spec is written by a platform engineer (YAML file or Pulumi config) and validated here, at the
edge; the rest of the code only ever sees a valid, frozen :class:`ClusterSpec`.
Load with :func:`load_spec` / :func:`parse_spec`; export the JSON schema with :func:`json_schema`.
"""

from __future__ import annotations

import functools
import re
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import Issue, SpecError
from .accounts import IMAGE_GROUPS, IMAGE_USERS, RESERVED_IDS, reserved_ids_named

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
SLURM_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?\s*$")
_QUANTITY_FACTOR = {
    None: 1, "m": 0.001, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}

# slurm.conf keys that slurmk8s manages itself; `slurm.extra_conf` may not override them.
MANAGED_SLURM_KEYS = frozenset(
    k.lower()
    for k in (
        "ClusterName", "SlurmctldHost", "SlurmUser", "AuthType", "CredType", "SlurmctldPort",
        "SlurmdPort", "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldParameters", "ProctrackType",
        "TaskPlugin", "SelectType", "MpiDefault", "ReturnToService", "SlurmdParameters",
        "TopologyPlugin", "ResumeProgram", "SuspendProgram", "ResumeFailProgram", "ResumeTimeout",
        "SuspendTimeout", "SuspendTime", "ResumeRate", "SuspendRate", "PrologSlurmctld",
        "NodeName", "PartitionName", "DownNodes", "GresTypes", "MailProg", "JobAcctGatherType", "ReconfigFlags", "TreeWidth",
        "CommunicationParameters", "TopologyParam",
        "HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState",
        "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort", "AccountingStoragePass",
        "AccountingStorageUser", "PriorityType", "JobCompType", "AuthAltTypes", "AuthAltParameters",
    )
)


def parse_duration(value: Any) -> int:
    """'90s', '30m', '2h', '1d' or an integer number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 300, '90s', '30m' or '2h'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    raise ValueError(f"{value!r} is not a duration; use seconds (300) or '90s', '30m', '2h', '1d'")


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity ('3920m', '16Gi', '1000000Ki', 8) -> a plain number."""
    if isinstance(value, bool):
        raise ValueError("expected a Kubernetes quantity such as '16Gi' or '500m'")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        number = _quantity_text(value)
        if number is not None:
            return number
    raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. '16Gi', '512Mi', '500m', 4)")


@functools.lru_cache(maxsize=4096)
def _quantity_text(value: str) -> float | None:
    """parse_quantity of a string, kept: a fleet's nodes repeat the same few quantities."""
    m = _QUANTITY.match(value)
    return float(m.group(1)) * _QUANTITY_FACTOR[m.group(2)] if m else None


def mib(value: Any) -> int:
    """A memory quantity -> whole MiB (rounded down)."""
    return int(parse_quantity(value) // 2**20)


# What the JSON schema (and so a Helm chart's values.schema.json) admits: the inputs the
# validators accept, not only what they produce.
_DURATION_INPUT = Union[Annotated[int, Field(ge=0)], Annotated[str, StringConstraints(pattern=_DURATION.pattern)]]
_QUANTITY_INPUT = Union[float, Annotated[str, StringConstraints(pattern=_QUANTITY.pattern)]]

Duration = Annotated[int, BeforeValidator(parse_duration, json_schema_input_type=_DURATION_INPUT)]


def _quantity_str(value: Any) -> str:
    parse_quantity(value)
    return str(value)


Quantity = Annotated[str, BeforeValidator(_quantity_str, json_schema_input_type=_QUANTITY_INPUT)]


class Model(BaseModel):
    """Base for every spec model: unknown keys are errors (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---------------------------------------------------------------- users


def _not_reserved(v: int, field: str) -> int:
    if v in RESERVED_IDS:
        raise ValueError(f"{field} {v} belongs to a system account of the images ({reserved_ids_named()}); "
                         "pick another")
    return v


class Group(Model):
    name: str = Field(description="POSIX group name.")
    gid: int = Field(ge=1000, le=2**31 - 2, description="Group id, identical on every pod.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not POSIX_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid group name; use lowercase letters, digits, '_' or '-'")
        if v in IMAGE_GROUPS or v in IMAGE_USERS:
            raise ValueError(f"{v!r} is a system account of the images (its members would join it); pick another name")
        return v

    @field_validator("gid")
    @classmethod
    def _gid(cls, v: int) -> int:
        return _not_reserved(v, "gid")


class User(Model):
    """A researcher account, identical (name, uid, gid) on the login pod and every worker."""

    name: str = Field(description="POSIX user name (lowercase, starts with a letter or '_').")
    uid: int = Field(ge=1000, le=2**31 - 2, description="User id; >= 1000, unique in the cluster.")
    gid: int | None = Field(
        default=None, ge=1000, le=2**31 - 2,
        description="Primary group id (a group named like the user); defaults to uid.",
    )
    ssh_keys: tuple[str, ...] = Field(
        default=(), description="OpenSSH public keys allowed to log in as this user (no passwords)."
    )
    shell: str = Field(default="/bin/bash", description="Login shell.")
    groups: tuple[str, ...] = Field(default=(), description="Extra groups (names from `groups`).")
    account: str | None = Field(
        default=None,
        description="Slurm account (a name from `accounting.accounts`) the user's jobs are charged to; "
        "defaults to `accounting.default_account`.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not POSIX_NAME.match(v):
            raise ValueError(
                f"{v!r} is not a valid user name; use lowercase letters, digits, '_' or '-', "
                "starting with a letter, at most 32 characters"
            )
        if v in IMAGE_USERS or v in IMAGE_GROUPS:  # a user's primary group is named like the user
            raise ValueError(f"{v!r} is a system account in the images; pick another name")
        return v

    @field_validator("uid", "gid")
    @classmethod
    def _ids(cls, v: int | None, info: Any) -> int | None:
        return v if v is None else _not_reserved(v, info.field_name)

    @field_validator("ssh_keys")
    @classmethod
    def _keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for i, key in enumerate(keys):
            parts = key.strip().split()
            if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
                raise ValueError(
                    f"ssh_keys[{i}] is not an OpenSSH public key; paste one line of a '.pub' file "
                    f"(it starts with one of {', '.join(SSH_KEY_TYPES[:3])}, ...)"
                )
            if "PRIVATE KEY" in key:
                raise ValueError(f"ssh_keys[{i}] looks like a private key; give the public key (.pub)")
            if any(c in key.strip() for c in "\r\n\0"):
                raise ValueError(
                    f"ssh_keys[{i}] holds a line break: it would become several authorized_keys lines; "
                    "give each key as its own list item, one line each"
                )
        return tuple(k.strip() for k in keys)

    @field_validator("shell")
    @classmethod
    def _shell(cls, v: str) -> str:
        if not v.startswith("/") or ":" in v:
            raise ValueError(f"{v!r} is not an absolute path to a shell; use e.g. /bin/bash")
        return v

    @property
    def primary_gid(self) -> int:
        return self.gid if self.gid is not None else self.uid


# ---------------------------------------------------------------- images, storage, login


class Images(Model):
    controller: str = Field(default="slurmk8s/slurmctld:dev", description="slurmctld image.")
    worker: str = Field(default="slurmk8s/slurmd:dev", description="slurmd image for worker pods.")
    login: str = Field(default="slurmk8s/login:dev", description="Login image (sshd + Slurm clients).")
    slurmdbd: str = Field(default="slurmk8s/slurmdbd:dev", description="slurmdbd image (accounting).")
    database: str = Field(default="slurmk8s/mariadb:dev", description="Internal accounting database image (MariaDB).")
    rest: str = Field(default="slurmk8s/slurmrestd:dev", description="slurmrestd image (the REST API, `rest`).")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="imagePullPolicy of every pod."
    )


class Volume(Model):
    size: Quantity = Field(description="Requested size, e.g. '10Gi'.")
    storage_class: str | None = Field(default=None, description="StorageClass; cluster default if unset.")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        default="ReadWriteOnce", description="PVC access mode."
    )


def _home_default() -> Volume:
    return Volume(size="10Gi", access_mode="ReadWriteMany")


# Below these a volume cannot hold what goes on it (an empty MariaDB data directory alone is ~200 MB).
MIN_VOLUME_SIZE = {"home": "100Mi", "controller_state": "64Mi", "database": "512Mi"}


class Storage(Model):
    """Persistent volumes. `slurmk8s down` keeps them (and says so); `slurmk8s down --purge` deletes them."""

    home: Volume = Field(
        default_factory=_home_default,
        description="Shared /home for login and workers: ReadWriteMany where the storage class offers it; "
        "ReadWriteOnce is the single-node fallback (every worker then runs on the login pod's node).",
    )
    controller_state: Volume = Field(
        default_factory=lambda: Volume(size="1Gi"), description="slurmctld StateSaveLocation."
    )
    database: Volume = Field(
        default_factory=lambda: Volume(size="2Gi"),
        description="Data of the internal accounting database (MariaDB); unused with an external database.",
    )

    @model_validator(mode="after")
    def _sizes(self) -> "Storage":
        issues = []
        for name, least in MIN_VOLUME_SIZE.items():
            vol = getattr(self, name)
            if parse_quantity(vol.size) < parse_quantity(least):
                issues.append((f"storage.{name}.size",
                               f"{vol.size} is too small for {name.replace('_', ' ')} (at least {least}); "
                               f"set storage.{name}.size to {least} or more"))
        if self.home.access_mode == "ReadWriteOncePod":
            issues.append(("storage.home.access_mode", "ReadWriteOncePod lets only one pod mount /home, but login and "
                           "every worker mount it; use ReadWriteMany (or ReadWriteOnce on a single node)"))
        if issues:
            raise ValueError("; ".join(f"@{f}@ {m}" for f, m in issues))
        return self


class Login(Model):
    enabled: bool = Field(default=True, description="Deploy the login pod.")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="How SSH to the login pod is exposed."
    )
    node_port: int | None = Field(default=None, ge=30000, le=32767, description="Fixed NodePort.")
    sleeps_with_control_tier: bool = Field(
        default=False, description="Let idle teardown scale the login pod to zero too."
    )

    @model_validator(mode="after")
    def _node_port(self) -> "Login":
        if self.node_port is not None and self.service_type != "NodePort":
            raise ValueError("node_port is set but service_type is not 'NodePort'; set service_type: NodePort")
        return self


class Rest(Model):
    """Slurm's REST API (slurmrestd) for programs: each request carries a user's JWT (`scontrol token`
    on the login pod, or `slurmk8s token --user NAME`); slurmctld and slurmdbd check it."""

    enabled: bool = Field(
        default=False,
        description="Run slurmrestd (and turn on JWT auth: AuthAltTypes=auth/jwt with a generated key).",
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="How the REST API (port 6820, plain HTTP) is exposed."
    )
    node_port: int | None = Field(default=None, ge=30000, le=32767, description="Fixed NodePort.")
    max_token_lifespan: Duration = Field(
        default=86400, gt=0,
        description="The longest a JWT may live: slurm.conf's AuthAltParameters=max_token_lifespan= (slurmctld "
        "refuses a longer `scontrol token lifespan=` from any user but SlurmUser), and the most `slurmk8s token "
        "--lifetime` asks for.",
    )

    @model_validator(mode="after")
    def _node_port(self) -> "Rest":
        if self.node_port is not None and self.service_type != "NodePort":
            raise ValueError("node_port is set but service_type is not 'NodePort'; set service_type: NodePort")
        return self


# ---------------------------------------------------------------- elasticity and Slurm


# Taints that announce the node's end: Karpenter v1's disruption taint (consolidation, drift,
# expiry, spot interruption) and its v0 name, AWS Node Termination Handler's (spot interruption,
# scheduled maintenance, an ASG's termination), GKE's for a Spot VM's preemption, and
# cluster-autoscaler's scale-down taint.
INTERRUPTION_TAINTS = (
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "cloud.google.com/impending-node-termination",
    "ToBeDeletedByClusterAutoscaler",
)


class Elasticity(Model):
    suspend_time: Duration = Field(
        default=300, description="Idle time after which Slurm suspends a node (its pod is deleted)."
    )
    resume_timeout: Duration = Field(
        default=300, description="A resumed node must register within this, else DOWN and its job requeued."
    )
    suspend_timeout: Duration = Field(
        default=15,
        description="Time allowed for a node to power down (its pod deleted). The suspend program ends a "
        "node's power-down as soon as its pod is gone; a pod still there at this bound is left to Slurm, "
        "and a job that needs the node waits until then. The default is the worker pods' grace period.",
    )
    idle_teardown: Duration | None = Field(
        default=None,
        description="Scale the control tier to zero after this long with no jobs, workers or sessions.",
    )
    fast_start: bool = Field(
        default=True,
        description="Start jobs on resumed nodes in ~2 s instead of ~30 s: a PrologSlurmctld that releases a job "
        "as soon as its nodes booted, a 1 s power-save scan (power_save_interval=1), scheduling at submit "
        "(batch_sched_delay=0) and a backfill pass each second (bf_interval=1, bf_max_time=30: also for a job "
        "submitted to a controller that just started or woke), and a no-op Epilog so that a job's end frees its nodes "
        "for the next job at once, not on slurmctld's next whole second; false keeps Slurm's defaults.",
    )
    interruption_taints: list[str] = Field(
        default_factory=lambda: list(INTERRUPTION_TAINTS),
        description="Taint keys that announce a Kubernetes node is about to go (spot reclaim, "
        "consolidation, maintenance). At the next reconcile pass the Slurm node of a worker on such a node "
        "is set DOWN with a reason naming the notice: its jobs get SIGTERM and KillWait and are requeued "
        "at once, and start again elsewhere; an idle worker's node is powered down. A pinned pool's node "
        "with such a taint stays in Slurm, drained. [] (and no interruption_conditions) turns this off, "
        "and with no pinned pool the slurmctld account then needs no read access to the nodes.",
    )
    interruption_conditions: list[str] = Field(
        default_factory=list,
        description="Node condition types whose status True announces the same (e.g. a node problem "
        "detector's scheduled-event condition); none by default.",
    )

    @property
    def follows_notices(self) -> bool:
        """The reconcile loop reads the nodes' interruption notices (so it may list the nodes)."""
        return bool(self.interruption_taints or self.interruption_conditions)

    @model_validator(mode="after")
    def _bounds(self) -> "Elasticity":
        if self.suspend_time < 1:
            raise ValueError("suspend_time must be at least 1s (0 would disable power saving); use e.g. 300")
        if self.resume_timeout < 30:
            raise ValueError("resume_timeout below 30s leaves no time for a pod to start; use >= 60s")
        if self.idle_teardown is not None and self.idle_teardown < self.suspend_time:
            raise ValueError("idle_teardown is shorter than suspend_time (workers go first, then the control tier); raise idle_teardown or lower suspend_time")
        return self


class Health(Model):
    """Slurm's HealthCheckProgram on every worker (slurmk8s-healthcheck in the slurmd image): a node
    that fails a check is drained with the reason 'health: <check>: <detail>'."""

    enabled: bool = Field(default=True, description="Run the health checks (at slurmd start and every interval).")
    interval: Duration = Field(
        default=300, description="HealthCheckInterval: seconds between checks on a node (slurmd also checks at start)."
    )
    min_disk_free: Quantity = Field(
        default="1Gi", description="Least free space on /, /tmp and /var/spool/slurmd (each file system once)."
    )
    min_shm: Quantity = Field(default="64Mi", description="Least size of the pod's /dev/shm.")
    min_memory_fraction: float = Field(
        default=0.9, gt=0, le=1,
        description="Memory the pod can still use plus memory allocated to jobs must reach this share of RealMemory.",
    )
    mpi_loopback: bool = Field(default=True, description="Run a 2-rank MPI allreduce on the node itself (~0.5 s).")
    gpu: bool = Field(
        default=True, description="GPU pools: nvidia-smi -L must list the Gres count and nvidia-smi must succeed."
    )

    @model_validator(mode="after")
    def _bounds(self) -> "Health":
        if self.enabled and self.interval < 10:
            raise ValueError("health.interval below 10s keeps workers busy checking; use e.g. 300")
        return self

    def conf_line(self) -> str:
        """The thresholds for the check program, as the comment line it reads from slurm.conf."""
        return (f"#slurmk8s-health min_disk_free_mb={mib(self.min_disk_free)} min_shm_mb={mib(self.min_shm)} "
                f"min_memory_fraction={self.min_memory_fraction:g} mpi_loopback={int(self.mpi_loopback)} "
                f"gpu={int(self.gpu)}")


class Slurm(Model):
    cluster_name: str | None = Field(default=None, description="Slurm ClusterName; defaults to the cluster name.")
    default_partition: str | None = Field(
        default=None, description="Default partition; defaults to the first pool's partition."
    )
    max_time: str = Field(default="UNLIMITED", description="Partition MaxTime (Slurm time format).")
    extra_conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra slurm.conf settings (Key: Value); keys slurmk8s manages are refused; an empty value "
        "leaves the key out (Slurm's default), e.g. LaunchParameters: \"\" keeps salloc's shell on the login pod.",
    )

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[a-z][a-z0-9_]{0,39}$", v):
            raise ValueError(f"{v!r} is not a valid Slurm ClusterName; use lowercase letters, digits and '_'")
        return v

    @field_validator("extra_conf")
    @classmethod
    def _extra(cls, conf: dict[str, str]) -> dict[str, str]:
        for key, value in conf.items():
            if not re.match(r"^[A-Za-z][A-Za-z0-9]*$", key):
                raise ValueError(f"extra_conf key {key!r} is not a slurm.conf parameter name; use the exact name, e.g. SchedulerParameters")
            if key.lower() in MANAGED_SLURM_KEYS:
                raise ValueError(
                    f"extra_conf may not set {key}: slurmk8s manages it; use the matching spec field instead"
                )
            if "\n" in str(value):
                raise ValueError(f"extra_conf {key} value contains a newline; put the value on one line")
        return conf


# ---------------------------------------------------------------- topology

# Topograph before 1.0 (its first label scheme): datacenter > spine > block (the leaf switch), and
# the NVLink domain. Topograph 1.0 replaced them; an upgrade leaves them on the nodes, stale.
TOPOGRAPH_OLD_LEVELS = (
    "network.topology.nvidia.com/datacenter",
    "network.topology.nvidia.com/spine",
    "network.topology.nvidia.com/block",
)
TOPOGRAPH_OLD_ACCELERATOR = "network.topology.nvidia.com/accelerator"
# Topograph 1.0: fabric tiers of any depth, tier-0 the switch nearest the node ("closest-first",
# docs/reference/node-labels.md of NVIDIA/topograph v1.0.0), and the accelerator (NVLink) domain.
# accelerator.topograph.run/sub-domain (a locality inside the domain, written by few providers) is
# not used: BlockSizes joins consecutive base blocks, so sub-domains as base blocks could be joined
# across two domains, which NVLink does not span; the domain is the unit a job must not leave.
TOPOGRAPH_TIER_PREFIX = "fabric.topograph.run/tier-"
TOPOGRAPH_ACCELERATOR = "accelerator.topograph.run/domain"

TOPOLOGY_PRESETS: dict[str, dict[str, Any]] = {
    # Topograph, whichever labels a node carries: the 1.0 tiers, else the older levels.
    "topograph": {"plugin": "tree", "tier_prefix": TOPOGRAPH_TIER_PREFIX, "levels": TOPOGRAPH_OLD_LEVELS},
    "topograph-fabric": {"plugin": "tree", "tier_prefix": TOPOGRAPH_TIER_PREFIX},
    "topograph-legacy": {"plugin": "tree", "levels": TOPOGRAPH_OLD_LEVELS},
    # AWS EC2 instance topology: layer-1 is the top of the network, layer-3 the node's own switch.
    "aws": {
        "plugin": "tree",
        "levels": (
            "topology.k8s.aws/network-node-layer-1",
            "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/network-node-layer-3",
        ),
    },
    # GKE compact placement topology: block > subblock > host.
    "gke": {
        "plugin": "tree",
        "levels": (
            "cloud.google.com/gce-topology-block",
            "cloud.google.com/gce-topology-subblock",
            "cloud.google.com/gce-topology-host",
        ),
    },
    # Generic zone / rack labels; rack names often repeat across zones, so names are path-qualified.
    "zone-rack": {
        "plugin": "tree",
        "levels": ("topology.kubernetes.io/zone", "topology.kubernetes.io/rack"),
        "switch_names": "path",
    },
    # NVLink domains (GB200 NVL72 and similar) as Slurm blocks.
    "nvlink": {"plugin": "block", "block_label": "nvidia.com/gpu.clique"},
    "topograph-nvlink": {"plugin": "block", "block_label": TOPOGRAPH_ACCELERATOR,
                         "fallback_block_label": TOPOGRAPH_OLD_ACCELERATOR},
    "topograph-accelerator": {"plugin": "block", "block_label": TOPOGRAPH_ACCELERATOR},
    "topograph-legacy-nvlink": {"plugin": "block", "block_label": TOPOGRAPH_OLD_ACCELERATOR},
}

TopologyPreset = Literal[
    "topograph", "topograph-fabric", "topograph-legacy", "aws", "gke", "zone-rack", "nvlink",
    "topograph-nvlink", "topograph-accelerator", "topograph-legacy-nvlink",
]

_TIER_NUMBER = re.compile(r"^(0|[1-9][0-9]*)$")


class Topology(Model):
    """Where each node sits in the network, from its Kubernetes labels, so Slurm places a job's
    nodes close together: topology/tree (switches) or topology/block (e.g. NVLink domains). The
    presets read the label schemes in use today:

    - `topograph`: tree from NVIDIA Topograph's labels: a node's `fabric.topograph.run/tier-N`
      (Topograph 1.0 on; any depth, `tier-0` the switch nearest the node, the highest tier its top),
      else its older `network.topology.nvidia.com/{datacenter,spine,block}`. A node carrying both
      is placed by the tiers (the older labels stay, stale, after an upgrade) and a notice names it.
    - `topograph-fabric`: tree from `fabric.topograph.run/tier-N` only (Topograph 1.0 on).
    - `topograph-legacy`: tree from `network.topology.nvidia.com/{datacenter,spine,block}` only
      (Topograph before 1.0).
    - `aws`: tree from `topology.k8s.aws/network-node-layer-{1,2,3}`.
    - `gke`: tree from `cloud.google.com/gce-topology-{block,subblock,host}`.
    - `zone-rack`: tree from `topology.kubernetes.io/{zone,rack}`, rack switches named by zone and rack.
    - `nvlink`: blocks from `nvidia.com/gpu.clique`.
    - `topograph-nvlink`: blocks from a node's `accelerator.topograph.run/domain` (Topograph 1.0 on),
      else its older `network.topology.nvidia.com/accelerator`; a node carrying both is placed by
      the domain and a notice names it. `accelerator.topograph.run/sub-domain` is not used: Slurm
      joins neighbouring base blocks (BlockSizes) into bigger ones, which with sub-domains as base
      blocks could span two domains, which NVLink does not.
    - `topograph-accelerator`: blocks from `accelerator.topograph.run/domain` only (Topograph 1.0 on).
    - `topograph-legacy-nvlink`: blocks from `network.topology.nvidia.com/accelerator` only
      (Topograph before 1.0).
    """

    preset: TopologyPreset | None = Field(
        default=None, description="A label scheme in use today (see above); sets plugin and its label fields."
    )
    plugin: Literal["tree", "block", "flat"] = Field(
        default="flat", description="topology/tree (switches), topology/block, or flat (no topology.conf)."
    )
    tier_prefix: str | None = Field(
        default=None,
        description="tree: the stem of numbered node labels naming a node's switch per tier, `<stem>0` the "
        "switch nearest the node and each higher number the next one up (Topograph 1.0: "
        "`fabric.topograph.run/tier-`); nodes may carry different numbers of tiers, but no gap below their "
        "highest. With `levels` too, a node without a complete set of tiers is placed by `levels`.",
    )
    levels: tuple[str, ...] = Field(
        default=(),
        description="tree: node label keys from the top of the network down to the leaf switch (with "
        "`tier_prefix`: for the nodes without tier labels).",
    )
    switch_names: Literal["global", "path"] = Field(
        default="global",
        description="global: a label value names one switch everywhere; path: qualified by its parents.",
    )
    block_label: str | None = Field(default=None, description="block: node label key naming the block.")
    fallback_block_label: str | None = Field(
        default=None,
        description="block: the label naming the block of a node without `block_label` (an older scheme, "
        "e.g. Topograph's before 1.0); a node carrying both is placed by `block_label`.",
    )
    block_sizes: tuple[int, ...] = Field(
        default=(), description="block: BlockSizes (base, then power-of-two multiples of it)."
    )
    unlabeled: Literal["group", "error"] = Field(
        default="group",
        description="Nodes lacking topology labels: 'group' puts them under an 'unlabeled' switch/block "
        "(usable, a node outside topology.conf gets no jobs at all); 'error' refuses them.",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset"):
            preset = TOPOLOGY_PRESETS.get(data["preset"])
            if preset is not None:
                merged = dict(preset)
                merged.update({k: v for k, v in data.items() if v is not None})
                return merged
        return data

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels: tuple[str, ...]) -> tuple[str, ...]:
        for key in levels:
            if not LABEL_KEY.match(key):
                raise ValueError(f"{key!r} is not a Kubernetes label key; use 'prefix/name' or 'name'")
        if len(set(levels)) != len(levels):
            raise ValueError("a label key appears twice in levels; each level needs its own label")
        return levels

    @field_validator("tier_prefix")
    @classmethod
    def _tier_prefix(cls, prefix: str | None) -> str | None:
        if prefix is not None and not LABEL_KEY.match(prefix + "0"):
            raise ValueError(f"{prefix!r} followed by a number is not a Kubernetes label key; "
                             "use e.g. 'fabric.topograph.run/tier-'")
        return prefix

    @model_validator(mode="after")
    def _consistent(self) -> "Topology":
        if self.plugin == "tree" and not self.levels and not self.tier_prefix:
            raise ValueError("plugin 'tree' has no levels; set levels (label keys, top first) or a preset such as 'aws'")
        if self.plugin != "tree" and self.tier_prefix:
            raise ValueError("tier_prefix only applies to plugin 'tree'; remove tier_prefix or set plugin: tree")
        if self.plugin == "block":
            if not self.block_label:
                raise ValueError("plugin 'block' has no block_label; set block_label (e.g. nvidia.com/gpu.clique) or preset 'nvlink'")
            for name, key in (("block_label", self.block_label), ("fallback_block_label", self.fallback_block_label)):
                if key is not None and not LABEL_KEY.match(key):
                    raise ValueError(f"{name} {key!r} is not a Kubernetes label key; use 'prefix/name'")
            if self.fallback_block_label == self.block_label:
                raise ValueError("fallback_block_label is block_label; remove fallback_block_label")
            check_block_sizes(self.block_sizes)
        else:
            if self.block_sizes:
                raise ValueError("block_sizes only applies to plugin 'block'; remove block_sizes or set plugin: block")
            if self.fallback_block_label:
                raise ValueError("fallback_block_label only applies to plugin 'block'; remove it or set plugin: block")
        return self

    def tier_number(self, key: str) -> int | None:
        """The tier a label key names under `tier_prefix` (``<prefix>0`` -> 0), else None. Strict
        digits: ``tier-01`` is no tier, so one switch cannot be named by two keys."""
        if not self.tier_prefix or not key.startswith(self.tier_prefix):
            return None
        rest = key[len(self.tier_prefix):]
        return int(rest) if _TIER_NUMBER.match(rest) else None

    def uses_label(self, key: str) -> bool:
        """Whether the topology reads the node label `key` (the inventory keeps only those)."""
        return (key in self.levels or key in (self.block_label, self.fallback_block_label)
                or self.tier_number(key) is not None)


def check_block_sizes(sizes: tuple[int, ...]) -> None:
    """BlockSizes: a positive base, each next one a power-of-two multiple of the previous."""
    if not sizes:
        return
    if sizes[0] < 1:
        raise ValueError("block_sizes must start with a positive base size, e.g. [4, 8, 16]")
    for prev, cur in zip(sizes, sizes[1:]):
        ratio, rem = divmod(cur, prev)
        if rem or ratio < 2 or ratio & (ratio - 1):
            raise ValueError(
                f"block_sizes {list(sizes)}: {cur} is not a power-of-two multiple (2x, 4x, ...) of {prev}; "
                f"e.g. [{sizes[0]}, {sizes[0] * 2}, {sizes[0] * 4}]"
            )


# ---------------------------------------------------------------- pools and networking


class Network(Model):
    host_network: bool = Field(
        default=False,
        description="Run worker pods on the host network (faster MPI/NCCL; gives up pod network isolation).",
    )
    multus_networks: tuple[str, ...] = Field(
        default=(), description="Multus NetworkAttachmentDefinitions ('ns/name' or 'name') for secondary NICs."
    )
    nccl_env: dict[str, str] = Field(
        default_factory=dict, description="NCCL_* (and UCX_*) environment for every job step on the pool."
    )
    memlock_unlimited: bool = Field(
        default=True,
        description="Raise the worker's locked-memory limit to unlimited (RDMA). No capability is added: "
        "the container runtime's hard limit must be unlimited; where it is not, the soft limit goes up "
        "to it and the worker logs a WARNING, then starts anyway. false: keep the runtime's limits.",
    )

    @field_validator("nccl_env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not re.match(r"^(NCCL|UCX|OMPI|PMIX|FI|UCC|NVSHMEM|CUDA)_[A-Z0-9_]+$", key):
                raise ValueError(
                    f"nccl_env key {key!r} is not a NCCL/UCX/OMPI/PMIX/FI/UCC/NVSHMEM/CUDA variable"
                )
        for key, value in env.items():
            # Slurm's TaskProlog protocol is one `export NAME=value` line per variable
            if any(c in value for c in "\n\r\0"):
                raise ValueError(f"nccl_env {key}: a value may not hold a line break or NUL; put it on one line")
        return env


class SlotDomain(Model):
    name: str = Field(description="Value of the pool's domain label (e.g. a zone or block name).")
    count: int = Field(ge=1, le=4096, description="Slurm nodes (slots) in this domain.")


class ContainerJobs(Model):
    """Job steps in OCI containers on a pool (``srun --container=BUNDLE``): Slurm 24.11 runs the
    step through rootless crun as the job's user (oci.conf). docs/containers.md."""

    enabled: bool = Field(
        default=False,
        description="Run job steps in OCI containers (srun --container) on this pool: rootless crun as the "
        "job's user. Needs a seccomp profile that lets an unprivileged process create user namespaces "
        "(RuntimeDefault forbids it): see seccomp. false: --container fails on this pool's nodes.",
    )
    seccomp: Literal["Unconfined", "Localhost"] = Field(
        default="Unconfined",
        description="The worker pod's seccomp profile when enabled. Unconfined: the namespace's Pod Security "
        "level becomes 'privileged' (baseline forbids Unconfined). Localhost: the profile at "
        "localhost_profile on every node of the pool (under the kubelet's seccomp directory), which must "
        "allow unshare/clone with namespace flags, mount, pivot_root, setns and keyctl; keeps 'baseline'.",
    )
    localhost_profile: str | None = Field(
        default=None,
        description="seccomp Localhost only: the profile's path relative to the kubelet's seccomp "
        "directory, e.g. 'profiles/slurmk8s-containers.json'.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `containers: true` is `containers: {enabled: true}`
        return {"enabled": data} if isinstance(data, bool) else data

    @model_validator(mode="after")
    def _profile(self) -> "ContainerJobs":
        if self.seccomp == "Localhost" and not self.localhost_profile:
            raise ValueError("seccomp Localhost needs localhost_profile (the profile's path under the kubelet's "
                             "seccomp directory, e.g. profiles/slurmk8s-containers.json)")
        if self.seccomp != "Localhost" and self.localhost_profile:
            raise ValueError("localhost_profile applies to seccomp Localhost only; remove it or set seccomp: Localhost")
        if self.localhost_profile and (self.localhost_profile.startswith("/") or ".." in self.localhost_profile.split("/")):
            raise ValueError(f"localhost_profile {self.localhost_profile!r} must be a relative path without '..'")
        return self

    def seccomp_profile(self) -> dict[str, str]:
        """The worker pod's seccompProfile (RuntimeDefault when not enabled)."""
        if not self.enabled:
            return {"type": "RuntimeDefault"}
        if self.seccomp == "Localhost":
            assert self.localhost_profile is not None
            return {"type": "Localhost", "localhostProfile": self.localhost_profile}
        return {"type": "Unconfined"}


class PoolKueue(Model):
    """The pool's worker pods under a Kueue LocalQueue of the cluster's namespace (docs/kueue.md).
    The pods one power-up creates for one job are one Kueue pod group: admitted together or not at
    all, within the ClusterQueue's quota."""

    queue: str = Field(description="The LocalQueue (in the cluster's namespace) the pods are submitted to.")
    priority_class: str | None = Field(
        default=None, description="A Kueue WorkloadPriorityClass for the pods' workloads (preemption order "
        "within the ClusterQueue and its cohort); default: Kueue's default priority.")

    @field_validator("queue", "priority_class")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        if v is not None and (not K8S_NAME.match(v) or len(v) > 63):
            raise ValueError(f"{v!r} is not a Kubernetes object name; use lowercase letters, digits, '-' and '.' "
                             "(at most 63)")
        return v


class Pool(Model):
    """A set of Slurm nodes of one shape, backed by worker pods created on demand."""

    name: str = Field(description="Pool name (DNS label); prefixes its Slurm node names.")
    mode: Literal["pinned", "slots"] = Field(
        default="pinned",
        description="pinned: one Slurm node per matching Kubernetes node; slots: named slots for "
        "autoscaled node groups, grouped by a domain label.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Kubernetes node labels a node must have to belong to the pool."
    )
    tolerations: tuple[dict[str, Any], ...] = Field(
        default=(), description="Pod tolerations (also decide which tainted nodes count)."
    )
    name_from: Literal["short", "full"] = Field(
        default="short",
        description="pinned: Slurm node name from the Kubernetes node name's first DNS label (short) or all of it.",
    )
    name_prefix: str | None = Field(
        default=None, description="Prefix of Slurm node names; defaults to '<pool>-'."
    )
    max_nodes: int | None = Field(default=None, ge=1, description="pinned: at most this many nodes.")
    # slots only
    domain_label: str | None = Field(default=None, description="slots: node label that groups slots.")
    domains: tuple[SlotDomain, ...] = Field(default=(), description="slots: domains and slot counts.")
    cpus: int | None = Field(default=None, ge=1, description="slots: CPUs per node.")
    memory: Quantity | None = Field(default=None, description="slots: memory per node, e.g. '64Gi'.")
    gpus: int = Field(default=0, ge=0, description="slots: GPUs per node.")
    gpu_type: str | None = Field(default=None, description="slots: GPU type for GRES (e.g. 'h100').")
    # both
    reserve_cpu: Quantity = Field(default="500m", description="CPU kept back from allocatable for Kubernetes.")
    reserve_memory: Quantity = Field(default="1Gi", description="Memory kept back from allocatable.")
    min_cpus: int = Field(default=1, ge=1, description="Nodes with fewer usable CPUs are left out.")
    min_memory: Quantity = Field(default="512Mi", description="Nodes with less usable memory are left out.")
    features: tuple[str, ...] = Field(default=(), description="Static Slurm features of every node.")
    feature_labels: tuple[str, ...] = Field(
        default=(), description="Node label keys whose values become Slurm features."
    )
    gpu_resource: str = Field(default="nvidia.com/gpu", description="Extended resource counted as GPUs.")
    gpu_type_label: str = Field(default="nvidia.com/gpu.product", description="Label naming the GPU model.")
    extra_resources: dict[str, int] = Field(
        default_factory=dict, description="Extra pod resource requests, e.g. {'rdma/ib': 1}."
    )
    partition: str | None = Field(default=None, description="Slurm partition; defaults to the pool name.")
    pod_cpu_request: Quantity | None = Field(
        default=None,
        description="Worker pod CPU request; defaults to the Slurm node's CPUs (Guaranteed QoS). Lower it only "
        "to overcommit on purpose (development, load tests); the limit stays the node's CPUs.",
    )
    pod_memory_request: Quantity | None = Field(
        default=None, description="Worker pod memory request; defaults to the node's RealMemory (see pod_cpu_request)."
    )
    shm_size: Quantity | None = Field(
        default=None, description="Size of the memory-backed /dev/shm; defaults to half the node's memory."
    )
    weight: int = Field(default=1, ge=1, description="Slurm node Weight (lower is used first).")
    image: str | None = Field(default=None, description="Worker image for this pool (defaults to images.worker).")
    network: Network = Field(default_factory=Network, description="Fabric settings for the pool's pods.")
    containers: ContainerJobs = Field(
        default_factory=ContainerJobs,
        description="Job steps in OCI containers (srun --container); off by default. `containers: true` "
        "enables them with seccomp Unconfined (Pod Security 'privileged'). docs/containers.md.",
    )
    kueue: PoolKueue | None = Field(
        default=None, description="Submit the worker pods to a Kueue LocalQueue (quota, all-or-nothing per "
        "job, preemption); default: the pods are created outside any queue. docs/kueue.md.")
    priority_class: str | None = Field(
        default=None, description="A Kubernetes PriorityClass for the worker pods (priorityClassName): their "
        "rank against other tenants' pods when the scheduler preempts and when a kubelet evicts under "
        "pressure. Default: the cluster's default priority (0 unless a PriorityClass is globalDefault). Not "
        "Kueue's WorkloadPriorityClass (kueue.priority_class).")
    node_start_timeout: Duration | None = Field(
        default=None, description="How long a new Kubernetes node may take to come for a worker pod of this pool "
        "(a cluster autoscaler, Karpenter or node auto-provisioning adding it, e.g. '10m'). A worker that cannot be "
        "scheduled waits this long instead of 3 minutes, with the reason in its job's comment; Slurm's "
        "ResumeTimeout for the pool's partition becomes elasticity.resume_timeout plus this (a partition shared "
        "by pools takes the longest). A node that never comes is then set DOWN, naming the pod's scheduling "
        "message, and its job requeued. Default: capacity is there or comes within 3 minutes.")

    @field_validator("node_start_timeout")
    @classmethod
    def _node_start(cls, v: int | None) -> int | None:
        if v is not None and v < 30:
            raise ValueError("node_start_timeout below 30s is shorter than a node takes to start; use e.g. '10m'")
        return v

    @field_validator("priority_class")
    @classmethod
    def _priority_class(cls, v: str | None) -> str | None:
        if v is not None and (not K8S_NAME.match(v) or len(v) > 253):
            raise ValueError(f"{v!r} is not a PriorityClass name; use lowercase letters, digits, '-' and '.'")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DNS_LABEL.match(v) or len(v) > 20:
            raise ValueError(
                f"{v!r} is not a valid pool name; use at most 20 lowercase letters, digits or '-' "
                "(e.g. 'gpu-h100')"
            )
        return v

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is not None and v and not re.match(r"^[a-z0-9][-a-z0-9]*$", v):
            raise ValueError(f"name_prefix {v!r} may hold only lowercase letters, digits and '-'; rename it")
        return v

    @field_validator("features")
    @classmethod
    def _features(cls, feats: tuple[str, ...]) -> tuple[str, ...]:
        for f in feats:
            if not SLURM_WORD.match(f):
                raise ValueError(f"feature {f!r} may hold only letters, digits, '_', '.' and '-'; rename it")
        return feats

    @field_validator("feature_labels", "node_selector")
    @classmethod
    def _label_keys(cls, keys: Any) -> Any:
        for key in keys:
            if not LABEL_KEY.match(key):
                raise ValueError(f"{key!r} is not a Kubernetes label key; use 'prefix/name' or 'name'")
        return keys

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$", v):
            raise ValueError(f"partition {v!r} may hold only letters, digits, '_' and '-'; rename it")
        return v

    @model_validator(mode="after")
    def _mode(self) -> "Pool":
        if self.mode == "pinned":
            slot_fields = [f for f in ("domain_label", "cpus", "memory", "gpu_type") if getattr(self, f)]
            if slot_fields or self.domains or self.gpus:
                raise ValueError(
                    f"{', '.join(slot_fields + (['domains'] if self.domains else []) + (['gpus'] if self.gpus else []))} "
                    "only apply to mode 'slots' (pinned pools read CPUs, memory and GPUs from the nodes)"
                )
        else:
            missing = [f for f in ("cpus", "memory") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"mode 'slots' needs {' and '.join(missing)} (the size of each slot's pod); add them")
            if not self.domains:
                raise ValueError("mode 'slots' has no domains; add e.g. domains: [{name: zone-a, count: 8}]")
            names = [d.name for d in self.domains]
            if len(set(names)) != len(names):
                raise ValueError("a domain name appears twice in domains; merge them into one entry")
            if len(self.domains) > 1 and not self.domain_label:
                raise ValueError("several domains but no domain_label; set domain_label to the node label that tells them apart")
            if self.gpu_type and not self.gpus:
                raise ValueError("gpu_type is set but gpus is 0; set gpus or remove gpu_type")
            if self.max_nodes is not None:
                raise ValueError("max_nodes applies to pinned pools only; set each domain's count instead")
        return self

    @property
    def partition_name(self) -> str:
        return self.partition or self.name

    @property
    def job_env(self) -> dict[str, str]:
        """The environment every job step on the pool's nodes gets (Slurm's TaskProlog exports it):
        today ``network.nccl_env``."""
        return dict(sorted(self.network.nccl_env.items()))

    def selects(self, labels: Mapping[str, str]) -> bool:
        """A Kubernetes node with these labels is one the pool's pods may run on: its node_selector
        matches and, for slots with a domain_label, the node is in one of the pool's domains."""
        if not all(labels.get(k) == v for k, v in self.node_selector.items()):
            return False
        return self.mode == "pinned" or self.domain_label is None or \
            labels.get(self.domain_label) in {d.name for d in self.domains}

    @property
    def node_prefix(self) -> str:
        return self.name_prefix if self.name_prefix is not None else f"{self.name}-"


# ---------------------------------------------------------------- accounting

SLURM_ACCOUNT = re.compile(r"^[a-z0-9_][a-z0-9_.-]{0,63}$")
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Account(Model):
    """A Slurm account; its fairshare is its share of the cluster against its sibling accounts."""

    name: str = Field(description="Account name (lowercase; Slurm lowercases account names).")
    fairshare: int = Field(default=1, ge=1, le=2**31 - 1, description="Fairshare (shares) of the account under root.")
    description: str | None = Field(default=None, description="Free text shown by sacctmgr.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SLURM_ACCOUNT.match(v) or v == "root":
            raise ValueError(f"{v!r} is not a valid account name; use lowercase letters, digits, '_', '.' or '-' "
                             "(and not 'root', Slurm's own)")
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c in v for c in "'\"\n=|")):
            raise ValueError("description may not be empty or hold quotes, '=', '|' or newlines; shorten it")
        return v


class SecretRef(Model):
    name: str = Field(description="Secret in the cluster's namespace (create it before `slurmk8s up`).")
    key: str = Field(default="password", description="Key of the Secret holding the password.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not K8S_NAME.match(v) or len(v) > 253:
            raise ValueError(f"{v!r} is not a Kubernetes Secret name (lowercase letters, digits, '-' and '.')")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not re.match(r"^[-._a-zA-Z0-9]+$", v):
            raise ValueError(f"{v!r} is not a Secret key; use letters, digits, '-', '_' or '.'")
        return v


class ExternalDatabase(Model):
    """An existing MySQL / MariaDB for slurmdbd instead of the internal one."""

    host: str = Field(description="Host name or address, as the slurmdbd pod reaches it.")
    port: int = Field(default=3306, ge=1, le=65535, description="TCP port.")
    database: str = Field(default="slurm_acct_db", description="Database (StorageLoc); the user needs all privileges on it.")
    user: str = Field(default="slurm", description="Database user (StorageUser).")
    password_secret: SecretRef = Field(description="Secret holding the user's password.")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$", v):
            raise ValueError(f"{v!r} is not a host name or address")
        return v

    @field_validator("database", "user")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_]{1,64}$", v):
            raise ValueError(f"{v!r} may hold only letters, digits and '_'")
        return v


class Accounting(Model):
    """Job accounting (slurmdbd) and fair-share scheduling. The cluster, accounts and users are kept in
    the database to match the spec: a user dropped from the spec loses the association, not the history."""

    enabled: bool = Field(default=True, description="Run slurmdbd (sacct, sshare, fair share); false: no accounting.")
    external_database: ExternalDatabase | None = Field(
        default=None, description="Use this MySQL/MariaDB; unset: an internal MariaDB on `storage.database`."
    )
    accounts: tuple[Account, ...] = Field(
        default=(Account(name="default"),), description="Slurm accounts under root, with their fairshare."
    )
    default_account: str | None = Field(default=None, description="Account of users without one; defaults to the first.")
    database_buffer_pool: Quantity = Field(
        default="256Mi", description="Internal database: innodb_buffer_pool_size (SchedMD suggests 1Gi+ for big sites)."
    )

    @model_validator(mode="after")
    def _accounts(self) -> "Accounting":
        names = [a.name for a in self.accounts]
        if self.enabled and not names:
            raise ValueError("accounting.accounts is empty; add at least one account (e.g. {name: default})")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"account {dupes[0]!r} is defined twice in accounting.accounts; merge the entries")
        if self.default_account is not None and self.default_account not in names:
            raise ValueError(f"default_account {self.default_account!r} is not in accounting.accounts; add it there")
        if parse_quantity(self.database_buffer_pool) < 2**27:
            raise ValueError("database_buffer_pool below 128Mi starves MariaDB; use e.g. 256Mi")
        return self

    @property
    def default(self) -> str:
        return self.default_account or self.accounts[0].name


# ---------------------------------------------------------------- the cluster


class ClusterSpec(Model):
    """One slurmk8s cluster: everything `slurmk8s up` needs besides the Kubernetes nodes."""

    name: str = Field(description="Cluster name (DNS label, at most 30 characters).")
    namespace: str | None = Field(default=None, description="Kubernetes namespace; defaults to 'slurm-<name>'.")
    slurm: Slurm = Field(default_factory=Slurm, description="Slurm settings (cluster name, partitions, extra slurm.conf).")
    pools: tuple[Pool, ...] = Field(min_length=1, description="Worker pools (at least one).")
    users: tuple[User, ...] = Field(default=(), description="Researcher accounts.")
    groups: tuple[Group, ...] = Field(default=(), description="Extra POSIX groups.")
    storage: Storage = Field(default_factory=Storage, description="Persistent volumes: /home and controller state.")
    elasticity: Elasticity = Field(default_factory=Elasticity, description="Power saving: when workers come and go.")
    topology: Topology = Field(default_factory=Topology, description="topology.conf from node labels.")
    images: Images = Field(default_factory=Images, description="Container images.")
    login: Login = Field(default_factory=Login, description="The login pod and how SSH reaches it.")
    health: Health = Field(default_factory=Health, description="Worker health checks that drain bad nodes.")
    rest: Rest = Field(default_factory=Rest, description="Slurm's REST API (slurmrestd) with per-user JWTs.")
    accounting: Accounting = Field(
        default_factory=Accounting, description="Job accounting (slurmdbd + database), accounts and fair share."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DNS_LABEL.match(v) or len(v) > 30:
            raise ValueError(f"{v!r} is not a valid cluster name; use at most 30 lowercase letters, digits or '-'")
        return v

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str | None) -> str | None:
        if v is not None and (not DNS_LABEL.match(v) or len(v) > 63):
            raise ValueError(f"{v!r} is not a valid namespace name (a DNS label)")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "ClusterSpec":
        issues: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for i, pool in enumerate(self.pools):
            if pool.name in seen:
                issues.append((f"pools[{i}].name", f"pool name {pool.name!r} is also used by pools[{seen[pool.name]}]"))
            seen.setdefault(pool.name, i)
        prefixes: dict[str, int] = {}
        for i, pool in enumerate(self.pools):
            other = prefixes.get(pool.node_prefix)
            if other is not None:
                issues.append((f"pools[{i}].name_prefix",
                               f"node name prefix {pool.node_prefix!r} is also used by pools[{other}]; "
                               "give each pool its own name_prefix"))
            prefixes.setdefault(pool.node_prefix, i)
        names: dict[str, int] = {}
        uids: dict[int, int] = {}
        for i, user in enumerate(self.users):
            if user.name in names:
                issues.append((f"users[{i}].name", f"user {user.name!r} is defined twice (also users[{names[user.name]}])"))
            if user.uid in uids:
                issues.append((f"users[{i}].uid",
                               f"uid {user.uid} is already used by users[{uids[user.uid]}] "
                               f"({self.users[uids[user.uid]].name}); every user needs a unique uid"))
            names.setdefault(user.name, i)
            uids.setdefault(user.uid, i)
        group_gids: dict[str, int] = {u.name: u.primary_gid for u in self.users}
        gid_names: dict[int, str] = {}
        for u in self.users:
            gid_names.setdefault(u.primary_gid, u.name)
        for i, group in enumerate(self.groups):
            if group.name in group_gids and group_gids[group.name] != group.gid:
                issues.append((f"groups[{i}].name", f"group {group.name!r} clashes with a user's primary group"))
            owner = gid_names.get(group.gid)
            if owner is not None and owner != group.name:
                issues.append((f"groups[{i}].gid", f"gid {group.gid} is already the group of {owner!r}"))
            group_gids[group.name] = group.gid
            gid_names.setdefault(group.gid, group.name)
        for i, user in enumerate(self.users):
            for g in user.groups:
                if g not in {grp.name for grp in self.groups}:
                    issues.append((f"users[{i}].groups", f"group {g!r} is not defined in groups"))
        accounts = {a.name for a in self.accounting.accounts}
        for i, user in enumerate(self.users):
            if user.account is not None and not self.accounting.enabled:
                issues.append((f"users[{i}].account", "is set but accounting is disabled; "
                               "enable accounting or remove the account"))
            elif user.account is not None and user.account not in accounts:
                issues.append((f"users[{i}].account", f"account {user.account!r} is not in accounting.accounts "
                               f"({', '.join(sorted(accounts))}); add it there or pick one of those"))
        partitions = {p.partition_name for p in self.pools}
        if self.slurm.default_partition and self.slurm.default_partition not in partitions:
            issues.append(("slurm.default_partition",
                           f"partition {self.slurm.default_partition!r} is not any pool's partition "
                           f"({', '.join(sorted(partitions))})"))
        if self.health.enabled:
            for i, p in enumerate(self.pools):
                if p.shm_size is not None and parse_quantity(p.shm_size) < parse_quantity(self.health.min_shm):
                    issues.append((f"pools[{i}].shm_size",
                                   f"shm_size {p.shm_size} is below health.min_shm {self.health.min_shm}, so every "
                                   "node of the pool would be drained; raise shm_size or lower health.min_shm"))
        if self.rest.node_port is not None and self.rest.node_port == self.login.node_port:
            issues.append(("rest.node_port", f"NodePort {self.rest.node_port} is also login.node_port; "
                           "give the REST API another port (30000-32767) or leave it unset"))
        if self.topology.plugin == "block" and any(p.mode == "slots" for p in self.pools):
            for i, p in enumerate(self.pools):
                if p.mode == "slots" and p.domain_label != self.topology.block_label:
                    issues.append((f"pools[{i}].domain_label",
                                   f"topology/block groups nodes by {self.topology.block_label!r}; a slot pool "
                                   "must use the same label as its domain_label"))
        if issues:
            # Raised as ValueError so pydantic reports it; the field path travels in the message.
            raise ValueError("; ".join(f"@{f}@ {m}" for f, m in issues))
        return self

    @property
    def namespace_name(self) -> str:
        return self.namespace or f"slurm-{self.name}"

    @property
    def slurm_cluster_name(self) -> str:
        return self.slurm.cluster_name or self.name.replace("-", "_")

    def user_account(self, user: User) -> str:
        return user.account or self.accounting.default

    @property
    def default_partition(self) -> str:
        return self.slurm.default_partition or self.pools[0].partition_name

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)


# ---------------------------------------------------------------- loading


_CROSS = re.compile(r"@([^@]+)@ ([^@]+?)(?=; @|$)")


def _issue(field: str, message: str) -> Issue:
    """Our messages say what is wrong, then '; ' and how to fix it: split them."""
    what, sep, fix = message.partition("; ")
    return Issue(field, what.strip(), fix.strip() if sep else "correct the value (see `slurmk8s spec schema`)")


def _issues_from(err: ValidationError) -> list[Issue]:
    issues: list[Issue] = []
    errors = err.errors(include_url=False)
    deeper = {e["loc"][:n] for e in errors for n in range(1, len(e["loc"]))}
    for e in errors:
        if e.get("type") == "too_short" and e["loc"] in deeper:
            continue  # "pools: at least 1 item" only because every item failed: the items say why
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        kind = e.get("type", "")
        if _CROSS.search(msg):
            issues += [_issue(field, text) for field, text in _CROSS.findall(msg)]
        elif kind == "extra_forbidden":
            issues.append(Issue(loc or "(top)", "unknown field",
                                "remove it or check its spelling against `slurmk8s spec schema`"))
        elif kind == "missing":
            issues.append(Issue(loc, "is required", "add it (see `slurmk8s spec schema`)"))
        else:
            issues.append(_issue(loc or "(top)", msg))
    return issues


def parse_spec(data: Any, *, source: str = "spec") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError.one("(top)", f"{source} must be a mapping with at least 'name' and 'pools'",
                            "see examples/ and `slurmk8s spec schema`", title=f"invalid {source}")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_issues_from(err), title=f"invalid {source}") from None


def load_spec(path: str | PathLike[str]) -> ClusterSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError.one("(file)", f"cannot read {path}: {err.strerror}", "give the path of a spec YAML file",
                            title="invalid spec") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError.one("(file)", f"{path} is not valid YAML: {err}", "fix the YAML syntax",
                            title="invalid spec") from None
    return parse_spec(data, source=str(path))


def json_schema() -> dict[str, Any]:
    schema = ClusterSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "slurmk8s cluster spec"
    return schema
