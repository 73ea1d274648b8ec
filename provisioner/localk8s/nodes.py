"""Extra real nodes of the local cluster: pure layout, parsing and config rendering, no I/O.

Each extra node is one kubelet plus one containerd on this same host, joined to the one control
plane of ``cluster.sh``. Everything that two kubelets or two containerds would otherwise share is
made separate here, keyed by the node's *slot* (1..63; slot 0 is the node of ``cluster up``):

- containerd: config, ``root``, ``state`` (/run/slurmk8s-containerd-<slot>), socket, CNI conf dir
  and the runc ``Root`` (the default /run/containerd/runc is shared by every containerd on the
  host, Docker's included);
- CNI: network ``slurmk8s-<slot>``, bridge ``cni<slot>``, pods 198.18.<slot>.0/24 (slot <= 63:
  kwok's fake pod IPs start at 198.18.64.0), its own host-local IPAM dir, ``ipMasq: false`` (a
  per-node masquerade rule covers traffic that leaves the pod network, so pod-to-pod traffic
  between nodes keeps its source IP, as on a real cluster);
- kubelet: root dir, ``cgroupRoot`` /slurmk8s-node-<slot> (node 1 uses /kubepods: the kubelets
  never touch each other's cgroups), ports 10350+2*slot (API) and 10351+2*slot (healthz), pod log
  dir, and a certificate of its own (CN system:node:<name>, O system:nodes).

The I/O side (certificates, processes, iptables, the API) is in :mod:`provisioner.localk8s.nodehost`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .kwok import KwokNodeError, node_names, parse_key_values, validate_capacity, validate_labels

MAX_SLOT = 63                 # 198.18.64.0/18 belongs to kwok's fake pods
POD_NET_PREFIX = "198.18"     # the cluster CIDR is 198.18.0.0/16 (cluster.sh)
CLUSTER_CIDR = "198.18.0.0/16"
KUBELET_PORT_BASE = 10350     # 10247-10259 are node 1's and the control plane's
STATE_PREFIX = "/run/slurmk8s-containerd-"
CGROUP_PREFIX = "/slurmk8s-node-"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# every extra node carries this label: `cluster up` deletes such Node objects whose state is gone
EXTRA_NODE_LABEL = "slurmk8s.io/localk8s-node"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# what the kubelet may set on its own Node at registration (k8s.io/kubelet well_known_labels.go);
# it refuses to start with any other kubernetes.io / k8s.io label in --node-labels
_KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
_KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
_RESERVED_NAMESPACES = ("kubernetes.io", "k8s.io")


class NodeError(KwokNodeError):
    """Invalid extra-node request (the message says which part and how to fix it)."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class NodeSpec:
    """What a node is asked to be: kept in its node.json and re-applied at every start."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "labels": dict(sorted(self.labels.items())),
                "resources": dict(sorted(self.resources.items())), "taints": [str(t) for t in self.taints]}

    @classmethod
    def from_json(cls, data: Mapping) -> NodeSpec:
        return make_spec(data["name"], data.get("labels", {}), data.get("resources", {}),
                         [parse_taint(t) for t in data.get("taints", [])])


@dataclass(frozen=True)
class NodeLayout:
    """Where one extra node keeps its things, and its network identity."""

    name: str
    slot: int
    dir: Path                 # <cluster state>/nodes/<name>

    @property
    def state_dir(self) -> Path:
        return Path(f"{STATE_PREFIX}{self.slot}")

    @property
    def socket(self) -> Path:
        return self.state_dir / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"cni{self.slot}"

    @property
    def pod_cidr(self) -> str:
        return f"{POD_NET_PREFIX}.{self.slot}.0/24"

    @property
    def kubelet_port(self) -> int:
        return KUBELET_PORT_BASE + 2 * self.slot

    @property
    def healthz_port(self) -> int:
        return KUBELET_PORT_BASE + 2 * self.slot + 1

    @property
    def cgroup_root(self) -> str:
        return f"{CGROUP_PREFIX}{self.slot}"

    @property
    def cni_network(self) -> str:
        return f"slurmk8s-{self.slot}"

    # files and dirs under the node dir
    @property
    def run_dir(self) -> Path:
        return self.dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def pki_dir(self) -> Path:
        return self.dir / "pki"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.pki_dir / "kubelet.kubeconfig"


def layout(name: str, slot: int, cluster_root: Path) -> NodeLayout:
    if not 1 <= slot <= MAX_SLOT:
        raise NodeError(f"slot {slot} is outside 1..{MAX_SLOT}")
    return NodeLayout(name=name, slot=slot, dir=Path(cluster_root) / "nodes" / name)


def allocate_slot(used: Iterable[int]) -> int:
    """The smallest free slot: a removed node's slot (and so its CIDR and ports) is reused."""
    taken = set(used)
    for slot in range(1, MAX_SLOT + 1):
        if slot not in taken:
            return slot
    raise NodeError(f"all {MAX_SLOT} extra-node slots are in use: remove a node first (slurmk8s cluster node remove NAME)")


def extra_node_names(first: str, count: int) -> list[str]:
    """Names of nodes 2..count of `cluster up --nodes count`: <first>-2, <first>-3, ..."""
    if count < 1:
        raise NodeError(f"--nodes must be >= 1, got {count}")
    return [f"{first}-{i}" for i in range(2, count + 1)]


# ---- parsing ---------------------------------------------------------------------------------------
def parse_taint(text: str) -> Taint:
    """``key=value:Effect`` or ``key:Effect`` (as kubectl taint writes them)."""
    body, sep, effect = text.rpartition(":")
    if not sep or effect not in EFFECTS:
        raise NodeError(f"taint {text!r} is not KEY[=VALUE]:EFFECT with EFFECT one of {', '.join(EFFECTS)}")
    key, _, value = body.partition("=")
    validate_labels({key: value})
    return Taint(key=key, value=value, effect=effect)


def parse_labels_file(text: str, source: str = "labels file") -> dict[str, str]:
    """Labels from a file: a YAML/JSON mapping ``{key: value}``, or ``key=value`` lines (``#`` comments)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        labels = {}
        for key, value in data.items():
            if isinstance(value, (dict, list)):
                raise NodeError(f"{source}: label {key!r} has a {type(value).__name__} value; labels are strings")
            labels[str(key)] = "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
        return labels
    lines = [ln.strip() for ln in text.splitlines()]
    return parse_key_values([ln for ln in lines if ln and not ln.startswith("#")], f"{source}: label")


def make_spec(name: str, labels: Mapping[str, str], resources: Mapping[str, str],
              taints: Sequence[Taint]) -> NodeSpec:
    node_names(name, 1)
    if len(name) > 63:
        raise NodeError(f"node name {name!r}: at most 63 characters (it is also the kubelet's hostname)")
    validate_labels(labels)
    validate_capacity(resources)
    for res in resources:
        if "/" not in res or res.split("/", 1)[0].endswith(("kubernetes.io", "k8s.io")):
            raise NodeError(f"resource {res!r}: an extended resource needs a domain of its own (e.g. example.com/gpu)")
    return NodeSpec(name=name, labels=dict(labels), resources=dict(resources), taints=tuple(taints))


def is_kubelet_label(key: str) -> bool:
    """Whether the kubelet accepts ``key`` in --node-labels (else it refuses to start)."""
    if key in _KUBELET_LABELS:
        return True
    namespace = key.rpartition("/")[0]
    if any(namespace == ns or namespace.endswith("." + ns) for ns in _KUBELET_LABEL_NAMESPACES):
        return True
    return not any(namespace == ns or namespace.endswith("." + ns) for ns in _RESERVED_NAMESPACES)


def registration_labels(spec: NodeSpec) -> dict[str, str]:
    """Labels the kubelet sets when it registers; the others are set through the API right after."""
    labels = {k: v for k, v in spec.labels.items() if is_kubelet_label(k)}
    return {EXTRA_NODE_LABEL: "extra", **dict(sorted(labels.items()))}


def status_patch(spec: NodeSpec) -> dict:
    """Merge patch of the Node status that advertises the extended resources (empty when none)."""
    if not spec.resources:
        return {}
    res = dict(sorted(spec.resources.items()))
    return {"status": {"capacity": res, "allocatable": res}}


def labels_patch(spec: NodeSpec) -> dict:
    return {"metadata": {"labels": {EXTRA_NODE_LABEL: "extra", **dict(sorted(spec.labels.items()))}}}


# ---- rendering -------------------------------------------------------------------------------------
def render_cni_conflist(lay: NodeLayout) -> str:
    conf = {
        "cniVersion": "1.0.0",
        "name": lay.cni_network,
        "plugins": [
            {"type": "bridge", "bridge": lay.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(lay.dir / "cni" / "ipam"),
                      "ranges": [[{"subnet": lay.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }
    return json.dumps(conf, indent=1) + "\n"


def render_containerd_toml(lay: NodeLayout, cni_bin: str = "/usr/lib/cni", pause_image: str = PAUSE_IMAGE) -> str:
    return f"""version = 2
root = "{lay.dir / 'containerd'}"
state = "{lay.state_dir}"
[grpc]
  address = "{lay.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{lay.cni_conf_dir}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "{lay.state_dir / 'runc'}"
"""


def render_kubelet_config(lay: NodeLayout, spec: NodeSpec, *, ca_file: str, dns_ip: str = "169.254.20.10",
                          cgroup_v1: bool = True) -> str:
    cfg: dict = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {"x509": {"clientCAFile": ca_file}, "webhook": {"enabled": True},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": lay.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{lay.socket}",
        "clusterDNS": [dns_ip],
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        "tlsCertFile": str(lay.pki_dir / "kubelet.crt"),
        "tlsPrivateKeyFile": str(lay.pki_dir / "kubelet.key"),
        # no registry: loaded images must never be garbage-collected
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "port": lay.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": lay.healthz_port,
        "healthzBindAddress": "127.0.0.1",
        "podLogsDir": str(lay.dir / "pod-logs"),
    }
    if cgroup_v1:
        cfg["failCgroupV1"] = False
    if spec.taints:
        cfg["registerWithTaints"] = [t.as_dict() for t in spec.taints]
    return yaml.safe_dump(cfg, sort_keys=False)


def kubelet_argv(lay: NodeLayout, spec: NodeSpec, *, kubelet: str, node_ip: str) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in registration_labels(spec).items())
    return [kubelet, f"--config={lay.dir / 'kubelet.yaml'}", f"--kubeconfig={lay.kubelet_kubeconfig}",
            f"--root-dir={lay.dir / 'kubelet'}", f"--hostname-override={lay.name}", f"--node-ip={node_ip}",
            f"--node-labels={labels}"]


def containerd_argv(lay: NodeLayout, containerd: str = "containerd") -> list[str]:
    return [containerd, "--config", str(lay.dir / "containerd.toml")]


def render_kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "slurmk8s-local", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": "default", "context": {"cluster": "slurmk8s-local", "user": user}}],
        "current-context": "default",
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def cert_extensions(name: str, ip: str) -> str:
    """openssl x509 -extfile text: one cert that serves the kubelet API and authenticates the node."""
    return ("[ext]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
            f"subjectAltName=DNS:{name},IP:{ip},IP:127.0.0.1\n")


# ---- iptables ----------------------------------------------------------------------------------------
# Each rule: (table, chain, rule args). Added with -C/-I (or -A), removed with -D.
def node_rules(lay: NodeLayout) -> list[tuple[str, str, list[str]]]:
    """FORWARD accepts this bridge (Docker sets the policy to DROP); traffic from its pods that leaves
    the pod network is masqueraded (the CNI bridge's ipMasq is off)."""
    return [
        ("filter", "FORWARD", ["-i", lay.bridge, "-j", "ACCEPT"]),
        ("filter", "FORWARD", ["-o", lay.bridge, "-j", "ACCEPT"]),
        ("nat", "POSTROUTING", ["-s", lay.pod_cidr, "!", "-d", CLUSTER_CIDR, "-j", "MASQUERADE"]),
    ]


# Node 1's bridge has ipMasq on: its per-pod CNI-* chains would masquerade traffic to other nodes'
# pods (198.18.0.1 as the source). This rule, placed right after kube-proxy's KUBE-POSTROUTING jump
# (which keeps the hairpin masquerade of Services), returns pod-to-pod traffic before them.
POD_TO_POD_RULE: tuple[str, str, list[str]] = (
    "nat", "POSTROUTING", ["-s", CLUSTER_CIDR, "-d", CLUSTER_CIDR, "-j", "RETURN"])


def pod_to_pod_position(postrouting_rules: str) -> int:
    """1-based insert position for POD_TO_POD_RULE in `iptables -t nat -S POSTROUTING` output."""
    rules = [ln for ln in postrouting_rules.splitlines() if ln.startswith("-A POSTROUTING")]
    for i, line in enumerate(rules, start=1):
        if "-j KUBE-POSTROUTING" in line:
            return i + 1
    return 1


# ---- images --------------------------------------------------------------------------------------------
_DOMAIN = re.compile(r"[.:]|^localhost$")


def normalize_image(ref: str) -> str:
    """Docker's short names as containerd's CRI stores them: nginx -> docker.io/library/nginx:latest."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        ref = f"docker.io/library/{ref}"
    elif not _DOMAIN.search(first):
        ref = f"docker.io/{ref}"
    last = ref.rsplit("/", 1)[1]
    if ":" not in last and "@" not in ref:
        ref += ":latest"
    return ref


def image_record_name(ref: str) -> str:
    return re.sub(r"[/:@]", "_", ref) + ".id"
