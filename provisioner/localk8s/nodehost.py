"""Extra real nodes of the local cluster: the host side (certificates, daemons, cgroups, iptables,
images, the Node object). Layout and rendering are pure, in :mod:`provisioner.localk8s.nodes`.

Needs root and a running control plane (``slurmk8s cluster up``). Node 1 (``cluster.sh``) is never
touched, except one shared nat rule (``POD_TO_POD_RULE``) added with the first extra node and
removed with the last.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import SlurmK8sError
from . import nodes as N

Say = Callable[[str], None]


class NodeHostError(SlurmK8sError):
    """A host action on an extra node failed (the message says what and where its log is)."""


@dataclass(frozen=True)
class Host:
    root: Path                # cluster state dir (LOCALK8S_ROOT)
    bin_dir: Path             # toolchain bin (kubelet, kubectl)
    main_node: str = "localk8s"
    main_socket: Path = Path("/run/slurmk8s-containerd/containerd.sock")
    cni_bin: str = "/usr/lib/cni"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    def tool(self, name: str) -> str:
        path = self.bin_dir / name
        return str(path) if path.exists() else name


def host_from_env(bin_dir: Path) -> Host:
    return Host(root=Path(os.environ.get("LOCALK8S_ROOT", "/var/lib/slurmk8s/localk8s")), bin_dir=bin_dir,
                main_node=os.environ.get("LOCALK8S_NODE", "localk8s"),
                cni_bin=os.environ.get("LOCALK8S_CNI_BIN", "/usr/lib/cni"))


# ---- registry of nodes (node.json per node dir) --------------------------------------------------
def known_nodes(host: Host) -> list[tuple[N.NodeLayout, N.NodeSpec]]:
    out: list[tuple[N.NodeLayout, N.NodeSpec]] = []
    if not host.nodes_dir.is_dir():
        return out
    for path in sorted(host.nodes_dir.glob("*/node.json")):
        data = json.loads(path.read_text())
        out.append((N.layout(data["name"], data["slot"], host.root), N.NodeSpec.from_json(data)))
    return out


def find_node(host: Host, name: str) -> tuple[N.NodeLayout, N.NodeSpec]:
    for lay, spec in known_nodes(host):
        if lay.name == name:
            return lay, spec
    names = ", ".join(lay.name for lay, _ in known_nodes(host)) or "none"
    raise NodeHostError(f"no extra node {name!r} (extra nodes: {names}); add it with `slurmk8s cluster node add {name}`")


def save_spec(lay: N.NodeLayout, spec: N.NodeSpec) -> None:
    lay.dir.mkdir(parents=True, exist_ok=True)
    (lay.dir / "node.json").write_text(json.dumps({**spec.to_json(), "slot": lay.slot}, indent=1) + "\n")


# ---- small host helpers ----------------------------------------------------------------------------
def run(argv: Sequence[str], *, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, input=input, check=False)
    if check and done.returncode != 0:
        raise NodeHostError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()}")
    return done


def pid_of(lay: N.NodeLayout, daemon: str) -> int | None:
    """Pid of a daemon we started for this node, only if it still runs that binary."""
    try:
        pid = int((lay.run_dir / f"{daemon}.pid").read_text())
        exe = os.readlink(f"/proc/{pid}/exe")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError):
        return None
    return pid if Path(exe.removesuffix(" (deleted)")).name == daemon and state != "Z" else None


def start_daemon(lay: N.NodeLayout, daemon: str, argv: Sequence[str]) -> int:
    lay.run_dir.mkdir(parents=True, exist_ok=True)
    lay.log_dir.mkdir(parents=True, exist_ok=True)
    with open(lay.log_dir / f"{daemon}.log", "ab") as log:
        log.write(f"\n==== {dt.datetime.now().isoformat(timespec='seconds')} start: {' '.join(argv)}\n".encode())
        log.flush()
        # own session: a Ctrl-C of the caller must not reach the daemon, which outlives this process
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    (lay.run_dir / f"{daemon}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_daemon(lay: N.NodeLayout, daemon: str, say: Say, timeout: float = 20.0) -> None:
    pid = pid_of(lay, daemon)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            say(f"{lay.name}: {daemon} killed (did not stop in {timeout:.0f} s)")
        else:
            say(f"{lay.name}: {daemon} stopped")
    (lay.run_dir / f"{daemon}.pid").unlink(missing_ok=True)


def shim_pids(socket: Path) -> list[int]:
    """containerd-shim processes started by the containerd of ``socket`` (matched by exact argv)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-address" and argv[i + 1] == str(socket).encode():
                pids.append(int(proc.name))
                break
    return pids


def cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def make_cgroup_root(root: str) -> None:
    """The kubelet exits unless its cgroupRoot exists in every hierarchy (cgroup v1: cpuset needs
    cpus/mems copied from the parent)."""
    base = Path("/sys/fs/cgroup")
    if not cgroup_v1():
        (base / root.lstrip("/")).mkdir(exist_ok=True)
        return
    for hier in sorted(base.iterdir()):
        if hier.name == "unified" or hier.is_symlink() or not hier.is_dir():
            continue
        (hier / root.lstrip("/")).mkdir(exist_ok=True)
    cpuset = base / "cpuset"
    if cpuset.is_dir():
        for f in ("cpuset.cpus", "cpuset.mems"):
            target = cpuset / root.lstrip("/") / f
            if not target.read_text().strip():
                target.write_text((cpuset / f).read_text())


def remove_cgroup_root(root: str) -> None:
    for hier in Path("/sys/fs/cgroup").iterdir():
        top = hier / root.lstrip("/")
        if hier.is_symlink() or not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def ensure_rule(table: str, chain: str, args: list[str], position: int | None = None) -> None:
    if run(["iptables", "-t", table, "-C", chain, *args], check=False).returncode == 0:
        return
    if position is None:
        op = ["-A", chain] if table == "nat" else ["-I", chain, "1"]
    else:
        op = ["-I", chain, str(position)]
    run(["iptables", "-t", table, *op, *args])


def delete_rule(table: str, chain: str, args: list[str]) -> None:
    while run(["iptables", "-t", table, "-D", chain, *args], check=False).returncode == 0:
        pass


def unmount_under(*dirs: Path) -> None:
    prefixes = tuple(f"{d}/" for d in dirs)
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mnt in sorted((m for m in mounts if m.startswith(prefixes)), reverse=True):
        run(["umount", "-l", mnt], check=False)


# ---- the API ---------------------------------------------------------------------------------------------
def core_api(host: Host):
    from kubernetes import client

    from ..kubeapi import api_client

    return client.CoreV1Api(api_client(str(host.kubeconfig)))


def api_server(host: Host) -> str:
    cfg = yaml.safe_load(host.kubeconfig.read_text())
    return cfg["clusters"][0]["cluster"]["server"]


def node_ip_of(server: str) -> str:
    """cluster.sh points every kubeconfig at https://<node IP>:<port>: the IP every node shares."""
    return server.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")


def ready_since(node, since: float) -> bool:
    for cond in (node.status.conditions or []) if node and node.status else []:
        if cond.type == "Ready":
            beat = cond.last_heartbeat_time
            return cond.status == "True" and beat is not None and beat.timestamp() >= int(since)
    return False


def wait_ready(host: Host, lay: N.NodeLayout, since: float, timeout: float = 120.0) -> float:
    from kubernetes.client.exceptions import ApiException

    core = core_api(host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid_of(lay, "kubelet") is None:
            raise NodeHostError(f"{lay.name}: kubelet exited; last lines of {lay.log_dir / 'kubelet.log'}:\n"
                                + _tail(lay.log_dir / "kubelet.log"))
        try:
            if ready_since(core.read_node(lay.name), since):
                return time.time()
        except ApiException as err:
            if err.status != 404:
                raise
        time.sleep(0.2)
    raise NodeHostError(f"{lay.name}: not Ready after {timeout:.0f} s; see {lay.log_dir / 'kubelet.log'}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join("    | " + ln for ln in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    | (no log)"


def apply_labels_and_resources(host: Host, spec: N.NodeSpec) -> None:
    core = core_api(host)
    core.patch_node(spec.name, N.labels_patch(spec))
    patch = N.status_patch(spec)
    if patch:
        core.patch_node_status(spec.name, patch)


# ---- images ------------------------------------------------------------------------------------------------
def _ctr(socket: Path, *args: str) -> list[str]:
    return ["ctr", "-a", str(socket), "-n", "k8s.io", *args]


def has_image(socket: Path, ref: str) -> bool:
    done = run(_ctr(socket, "images", "ls", "-q"), check=False)
    return done.returncode == 0 and ref in done.stdout.decode().split()


def pipe_import(source: Sequence[str], socket: Path) -> None:
    """``source | ctr import -`` into the containerd of ``socket``."""
    with subprocess.Popen(list(source), stdout=subprocess.PIPE, stderr=subprocess.PIPE) as src:
        assert src.stdout is not None and src.stderr is not None  # both PIPE
        dst = subprocess.run(_ctr(socket, "images", "import", "-"), stdin=src.stdout, capture_output=True, check=False)
        src.stdout.close()
        err = src.stderr.read().decode(errors="replace")
    if src.returncode != 0 or dst.returncode != 0:
        raise NodeHostError(f"{' '.join(source)} | ctr import failed: {err.strip()} {dst.stderr.decode(errors='replace').strip()}")


def copy_from_main(host: Host, lay: N.NodeLayout, ref: str) -> bool:
    """Copy an image from node 1's containerd (no Docker needed); False when already there."""
    if has_image(lay.socket, ref):
        return False
    if not has_image(host.main_socket, ref):
        raise NodeHostError(f"image {ref} is not in node 1's containerd: load it first (slurmk8s cluster load-image IMAGE)")
    pipe_import(_ctr(host.main_socket, "images", "export", "-", ref), lay.socket)
    return True


def load_docker_image(lay: N.NodeLayout, image: str, say: Say) -> None:
    """``docker save | ctr import`` into one node, skipped when that Docker image id is loaded."""
    done = run(["docker", "image", "inspect", "-f", "{{.Id}}", image], check=False)
    if done.returncode != 0:
        raise NodeHostError(f"image {image} is not in the local Docker engine (build or pull it first)")
    image_id = done.stdout.decode().strip()
    ref = N.normalize_image(image)
    record = lay.dir / "images" / N.image_record_name(ref)
    if record.exists() and record.read_text().strip() == image_id and has_image(lay.socket, ref):
        say(f"{lay.name}: {image} already loaded ({image_id[7:19]})")
        return
    t0 = time.monotonic()
    pipe_import(["docker", "save", image], lay.socket)
    if not has_image(lay.socket, ref):
        raise NodeHostError(f"{lay.name}: {image} was imported but containerd has no image named {ref}")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(image_id + "\n")
    say(f"{lay.name}: {image} loaded in {time.monotonic() - t0:.1f} s")


# ---- lifecycle --------------------------------------------------------------------------------------------
def _write_files(host: Host, lay: N.NodeLayout, spec: N.NodeSpec, ip: str) -> None:
    for sub in ("pki", "cni/net.d", "cni/ipam", "containerd", "kubelet", "pod-logs", "log", "run", "images"):
        (lay.dir / sub).mkdir(parents=True, exist_ok=True)
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    (lay.cni_conf_dir / "10-slurmk8s.conflist").write_text(N.render_cni_conflist(lay))
    (lay.dir / "containerd.toml").write_text(N.render_containerd_toml(lay, host.cni_bin))
    (lay.dir / "kubelet.yaml").write_text(N.render_kubelet_config(
        lay, spec, ca_file=str(host.root / "pki" / "ca.crt"), cgroup_v1=cgroup_v1()))
    _issue_cert(host, lay, ip)


def _issue_cert(host: Host, lay: N.NodeLayout, ip: str) -> None:
    """One RSA cert for both ends: client (CN system:node:<name>, O system:nodes, which the Node
    authorizer needs) and kubelet serving (SAN the node name and IP), signed by the cluster CA."""
    pki, ca = lay.pki_dir, host.root / "pki"
    ext = N.cert_extensions(lay.name, ip)
    if not (pki / "kubelet.crt").exists() or (pki / "kubelet.ext").read_text() != ext:
        (pki / "kubelet.ext").write_text(ext)
        run(["openssl", "genrsa", "-out", str(pki / "kubelet.key"), "2048"])
        run(["openssl", "req", "-new", "-key", str(pki / "kubelet.key"), "-subj",
             f"/O=system:nodes/CN=system:node:{lay.name}", "-out", str(pki / "kubelet.csr")])
        run(["openssl", "x509", "-req", "-in", str(pki / "kubelet.csr"), "-CA", str(ca / "ca.crt"),
             "-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-CAserial", str(pki / "ca.srl"), "-days", "3650",
             "-extfile", str(pki / "kubelet.ext"), "-extensions", "ext", "-out", str(pki / "kubelet.crt")])
    lay.kubelet_kubeconfig.write_text(N.render_kubeconfig(
        api_server(host), (ca / "ca.crt").read_bytes(), (pki / "kubelet.crt").read_bytes(),
        (pki / "kubelet.key").read_bytes(), f"system:node:{lay.name}"))
    os.chmod(lay.kubelet_kubeconfig, 0o600)


def _network(lay: N.NodeLayout) -> None:
    for table, chain, args in N.node_rules(lay):
        ensure_rule(table, chain, args)
    table, chain, args = N.POD_TO_POD_RULE
    if run(["iptables", "-t", table, "-C", chain, *args], check=False).returncode != 0:
        listing = run(["iptables", "-t", table, "-S", chain]).stdout.decode()
        ensure_rule(table, chain, args, position=N.pod_to_pod_position(listing))


def _check_ports(lay: N.NodeLayout) -> None:
    for port in (lay.kubelet_port, lay.healthz_port):
        out = run(["ss", "-H", "-ltn", f"sport = :{port}"], check=False).stdout.decode().strip()
        if out:
            raise NodeHostError(f"{lay.name}: port {port}/tcp is already in use ({out.split()[3]}); "
                                "stop what holds it or remove a stale node (slurmk8s cluster node remove NAME)")


def start_node(host: Host, lay: N.NodeLayout, spec: N.NodeSpec, say: Say, images: Sequence[str] = ()) -> dict[str, float]:
    """Start (or restart) one node: configs, cgroups, iptables, containerd, pause image, kubelet;
    wait for Ready; set its labels and extended resources. Returns timings (s)."""
    if os.geteuid() != 0:
        raise NodeHostError("extra nodes run host daemons (containerd, kubelet): run as root")
    t0 = time.time()
    ip = node_ip_of(api_server(host))
    _write_files(host, lay, spec, ip)
    make_cgroup_root(lay.cgroup_root)
    _network(lay)
    times: dict[str, float] = {}
    if pid_of(lay, "containerd") is None:
        start_daemon(lay, "containerd", N.containerd_argv(lay))
        deadline = time.monotonic() + 60
        while run(["ctr", "-a", str(lay.socket), "version"], check=False).returncode != 0:
            if pid_of(lay, "containerd") is None or time.monotonic() > deadline:
                raise NodeHostError(f"{lay.name}: containerd did not start; last lines of its log:\n"
                                    + _tail(lay.log_dir / "containerd.log"))
            time.sleep(0.2)
    times["containerd"] = time.time() - t0
    copy_from_main(host, lay, N.PAUSE_IMAGE)
    for image in images:
        if copy_from_main(host, lay, N.normalize_image(image)):
            say(f"{lay.name}: {image} copied from node 1")
    times["images"] = time.time() - t0
    if pid_of(lay, "kubelet") is None:
        _check_ports(lay)
        kubelet_started = time.time()
        start_daemon(lay, "kubelet", N.kubelet_argv(lay, spec, kubelet=host.tool("kubelet"), node_ip=ip))
    else:
        # already running: its Ready condition is current (a heartbeat since now could take 5 minutes:
        # the kubelet posts an unchanged status only every nodeStatusReportFrequency)
        kubelet_started = 0.0
    wait_ready(host, lay, kubelet_started)
    times["ready"] = time.time() - t0
    times["kubelet_to_ready"] = time.time() - (kubelet_started or t0)
    apply_labels_and_resources(host, spec)
    return times


def add_node(host: Host, spec: N.NodeSpec, say: Say, images: Sequence[str] = ()) -> N.NodeLayout:
    existing = {lay.name: lay for lay, _ in known_nodes(host)}
    if spec.name == host.main_node or spec.name in existing:
        raise NodeHostError(f"node {spec.name} exists already (start it: slurmk8s cluster node start {spec.name}, "
                            f"or remove it first)")
    lay = N.layout(spec.name, N.allocate_slot(lay.slot for lay in existing.values()), host.root)
    save_spec(lay, spec)
    say(f"{lay.name}: slot {lay.slot}, pods {lay.pod_cidr} (bridge {lay.bridge}), kubelet port {lay.kubelet_port}, "
        f"cgroup {lay.cgroup_root}, state {lay.dir}")
    times = start_node(host, lay, spec, say, images)
    say(f"{lay.name}: Ready {times['ready']:.1f} s after the start (containerd {times['containerd']:.1f} s, "
        f"images {times['images']:.1f} s, kubelet start to Ready {times['kubelet_to_ready']:.1f} s)")
    return lay


def stop_node(host: Host, lay: N.NodeLayout, say: Say) -> None:
    """A lost node: kubelet and containerd stop, the pods' containers (shims) keep running."""
    stop_daemon(lay, "kubelet", say)
    stop_daemon(lay, "containerd", say)


def remove_node(host: Host, lay: N.NodeLayout, say: Say, *, delete_object: bool = True) -> None:
    stop_daemon(lay, "kubelet", say)
    if pid_of(lay, "containerd") is not None:
        tasks = run(_ctr(lay.socket, "tasks", "ls", "-q"), check=False).stdout.decode().split()
        for task in tasks:
            run(_ctr(lay.socket, "tasks", "kill", "-s", "KILL", task), check=False)
        if tasks:
            time.sleep(0.5)
        for task in tasks:
            run(_ctr(lay.socket, "tasks", "delete", "-f", task), check=False)
    stop_daemon(lay, "containerd", say)
    for pid in shim_pids(lay.socket):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if delete_object:
        from kubernetes.client.exceptions import ApiException

        try:
            core_api(host).delete_node(lay.name)
        except ApiException as err:
            if err.status != 404:
                raise
    for table, chain, args in N.node_rules(lay):
        delete_rule(table, chain, args)
    run(["ip", "link", "del", lay.bridge], check=False)
    unmount_under(lay.dir, lay.state_dir)
    remove_cgroup_root(lay.cgroup_root)
    shutil.rmtree(lay.dir, ignore_errors=True)
    shutil.rmtree(lay.state_dir, ignore_errors=True)
    if not known_nodes(host):
        delete_rule(*N.POD_TO_POD_RULE)
    say(f"{lay.name}: removed")


def stale_node_objects(host: Host) -> list[str]:
    """Node objects of extra nodes whose state is gone (e.g. removed while the API was down)."""
    core = core_api(host)
    names = {lay.name for lay, _ in known_nodes(host)}
    objs = core.list_node(label_selector=N.EXTRA_NODE_LABEL).items
    return [o.metadata.name for o in objs if o.metadata.name not in names]


def memory_rss_kib(host: Host, lay: N.NodeLayout) -> dict[str, int]:
    """RSS of this node's kubelet, containerd and shims (KiB, from /proc/PID/status VmRSS)."""
    def rss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    out = {d: rss(p) for d in ("kubelet", "containerd") if (p := pid_of(lay, d)) is not None}
    out["shims"] = sum(rss(p) for p in shim_pids(lay.socket))
    return out
