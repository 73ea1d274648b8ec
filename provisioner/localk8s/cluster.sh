#!/usr/bin/env bash
# slurmk8s local cluster: a single-node Kubernetes made of host processes, from the binaries that
# toolchain.sh builds plus Debian's containerd, runc and CNI plugins. No registry: images come
# from the local Docker engine.
#
#   cluster.sh up [--kwok]          start (idempotent; prints the kubeconfig path)
#   cluster.sh down [--purge]       stop everything, also after an interrupted up (--purge: drop state)
#   cluster.sh status               what runs (exit 0 running, 3 stopped, 4 partly running)
#   cluster.sh restart NAME [--down-for S]  stop one daemon (kube-apiserver, kubelet, kube-controller-manager,
#                                   kube-scheduler), keep it down S seconds, start it again; pods keep running
#   cluster.sh load-image IMAGE...  copy images from Docker into the cluster's containerd
#   cluster.sh kwok up|down|status  the kwok controller for fake nodes (annotation kwok.x-k8s.io/node=fake);
#                                   once up it is restarted by every `up` until `kwok down`
#   cluster.sh kubeconfig           print the kubeconfig path
#
# State (kept across down/up): $LOCALK8S_ROOT, default /var/lib/slurmk8s/localk8s.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${LOCALK8S_ROOT:-/var/lib/slurmk8s/localk8s}
BIN=${SLURMK8S_BIN:-$("$HERE/toolchain.sh" path)}
SHARE=$(dirname "$BIN")/share
RUN=$ROOT/run; PKI=$ROOT/pki; LOG=$ROOT/log
KUBECONFIG_PATH=$ROOT/kubeconfig
NODE=${LOCALK8S_NODE:-localk8s}
API_PORT=${LOCALK8S_API_PORT:-6443}
POD_CIDR=${LOCALK8S_POD_CIDR:-198.18.0.0/24}        # real pods on this node (host-local IPAM)
KWOK_CIDR=${LOCALK8S_KWOK_CIDR:-198.18.64.0/18}     # fake pod IPs handed out by kwok
CLUSTER_CIDR=${LOCALK8S_CLUSTER_CIDR:-198.18.0.0/16}
SVC_CIDR=${LOCALK8S_SVC_CIDR:-198.19.0.0/16}
DNS_IP=${LOCALK8S_DNS_IP:-169.254.20.10}
# the scheduler's API rate: its default (50 requests/s, burst 100) binds at most 50 pods a second,
# which alone made a 500-pod resume take 9 s to Running here (4,096 pods: 86 s); a cluster built for
# bursts of many pods raises it the same way (KubeSchedulerConfiguration clientConnection.qps/burst)
SCHED_QPS=${LOCALK8S_SCHEDULER_QPS:-500}
# how many pods kwok moves to Running at once (kwok's default: 4); a real cluster has one kubelet per
# node, each starting its own pods, so a few kwok nodes standing in for hundreds of nodes need more
KWOK_POD_PARALLELISM=${LOCALK8S_KWOK_POD_PARALLELISM:-32}
CTRD_STATE=/run/slurmk8s-containerd
CTRD_SOCK=$CTRD_STATE/containerd.sock
PAUSE_IMAGE=registry.k8s.io/pause:3.10
CNI_BIN=${LOCALK8S_CNI_BIN:-/usr/lib/cni}
ME=${LOCALK8S_CMD:-$0}   # how to call this again, for messages (the Python CLI sets "slurmk8s cluster")
CORE=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns)
export PATH=$BIN:$PATH

say() { printf '[cluster %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
secs_since() { local d=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((d / 1000)) $(((d % 1000) / 100)); }

# ---- prerequisites -------------------------------------------------------------------------------
need_toolchain() {
  local b missing=()
  for b in "$@"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  die "missing ${missing[*]} in $BIN: build the toolchain first (slurmk8s toolchain build, or $HERE/toolchain.sh build)"
}
need_debian() {
  local pkgs=() 
  command -v containerd >/dev/null || pkgs+=(containerd)
  command -v runc >/dev/null || pkgs+=(runc)
  [ -x "$CNI_BIN/bridge" ] && [ -x "$CNI_BIN/host-local" ] && [ -x "$CNI_BIN/portmap" ] || pkgs+=(containernetworking-plugins)
  command -v iptables >/dev/null || pkgs+=(iptables)
  command -v openssl >/dev/null || pkgs+=(openssl)
  command -v ss >/dev/null || pkgs+=(iproute2)
  command -v gcc >/dev/null || pkgs+=(gcc libc6-dev)
  [ ${#pkgs[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
    || die "missing packages: ${pkgs[*]} (install them: apt-get install -y ${pkgs[*]})"
  say "installing Debian packages: ${pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 "${pkgs[@]}" >"$LOG/apt.log" 2>&1 \
    || { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$LOG/apt.log" 2>&1 && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 "${pkgs[@]}" >>"$LOG/apt.log" 2>&1; } \
    || die "apt-get install ${pkgs[*]} failed; see $LOG/apt.log"
}

# The node IP: first global IPv4 address that is not loopback (the DNS address lives on lo),
# a container bridge or a link-local address. Overridable: LOCALK8S_NODE_IP.
node_ip() {
  if [ -n "${LOCALK8S_NODE_IP:-}" ]; then echo "$LOCALK8S_NODE_IP"; return; fi
  ip -4 -o addr show scope global | awk '$2 !~ /^(lo|docker|cni|br-|veth|virbr|kube)/ && $4 !~ /^169\.254\./ {sub(/\/.*/, "", $4); print $4; exit}'
}
first_ip() { local net=${1%/*}; echo "${net%.*}.$(( ${net##*.} + 1 ))"; }

# ---- daemons -------------------------------------------------------------------------------------
pid_of() {  # pid of a daemon we started, only if it still runs that binary
  local f=$RUN/$1.pid pid exe
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [ -n "$pid" ] && alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$(basename "${exe% (deleted)}")" = "$1" ] || return 1
  echo "$pid"
}
running() { pid_of "$1" >/dev/null; }
# alive PID: exists and is not a zombie (orphaned daemons are reaped by pid 1, sometimes slowly)
alive() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }
start() {
  local name=$1; shift
  mkdir -p "$RUN" "$LOG"
  printf '\n==== %s start: %s\n' "$(date -Is)" "$*" >>"$LOG/$name.log"
  rm -f "$RUN/$name.pid"
  # own session (a Ctrl-C of the caller must not reach the daemons); the daemon writes its own pid
  PIDFILE=$RUN/$name.pid nohup setsid bash -c 'echo $$ >"$PIDFILE"; exec "$@"' "$name" "$@" >>"$LOG/$name.log" 2>&1 </dev/null &
  local i; for i in $(seq 50); do [ -s "$RUN/$name.pid" ] && return 0; sleep 0.02; done
  die "$name did not start; see $LOG/$name.log"
}
# wait_for NAME TIMEOUT_S CMD...: poll CMD until it succeeds; fail early if NAME died
wait_for() {
  local name=$1 timeout=$2; shift 2
  local deadline=$(( $(date +%s) + timeout ))
  while :; do
    "$@" >/dev/null 2>&1 && return 0
    if ! running "$name"; then
      printf '[cluster] error: %s exited; last lines of %s:\n' "$name" "$LOG/$name.log" >&2
      tail -n 25 "$LOG/$name.log" | sed 's/^/    | /' >&2; return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      printf '[cluster] error: %s not ready after %ss; last lines of %s:\n' "$name" "$timeout" "$LOG/$name.log" >&2
      tail -n 25 "$LOG/$name.log" | sed 's/^/    | /' >&2; return 1
    fi
    sleep 0.2
  done
}
stop() {  # stop NAME: TERM, wait up to 20 s, then KILL; always removes the pid file
  local name=$1 pid i
  if pid=$(pid_of "$name"); then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 200); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; say "$name: killed (did not stop in 20 s)"; sleep 0.2
    else say "$name: stopped"; fi
  fi
  rm -f "$RUN/$name.pid"
}

# Who listens on a port (empty if nobody): ss -H -ltnp/-lunp output, process names and pids.
listener() {  # listener tcp|udp PORT [ADDR]: listeners that block binding PORT (on ADDR if given)
  local flag=-ltnp out; [ "$1" = udp ] && flag=-lunp
  out=$(ss -H $flag "sport = :$2" 2>/dev/null || true)
  [ -n "$out" ] || return 0
  awk -v a="${3:-}" '{ split($4, p, ":"); host = substr($4, 1, length($4) - length(p[length(p)]) - 1)
    if (a == "" || host == "*" || host == "0.0.0.0" || host == "[::]" || host == a) print $4, $NF }' <<<"$out" | head -3
}
check_port() {  # check_port tcp|udp PORT WHAT [ADDR]: fail clearly when something else holds the port
  local who; who=$(listener "$1" "$2" "${4:-}")
  [ -z "$who" ] && return 0
  die "port $2/$1 ($3) is already in use: $who. Stop that process (or run: $ME down, if it is a leftover of this cluster)"
}

# ---- PKI -----------------------------------------------------------------------------------------
cert() {  # cert NAME CN O SANS
  local name=$1 cn=$2 org=$3 sans=$4 subj
  [ -f "$PKI/$name.crt" ] && [ "$(cat "$PKI/$name.sans" 2>/dev/null)" = "$sans" ] && return 0
  subj="/CN=$cn"; [ -n "$org" ] && subj="/O=$org$subj"
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  printf '[ext]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n%s\n' \
    "${sans:+subjectAltName=$sans}" >"$PKI/$name.ext"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
    -extfile "$PKI/$name.ext" -extensions ext -out "$PKI/$name.crt" 2>/dev/null
  echo "$sans" >"$PKI/$name.sans"
}
kubeconfig() {  # kubeconfig FILE CERTNAME USER
  local f=$1
  kubectl config set-cluster slurmk8s-local --server="https://$IP:$API_PORT" --certificate-authority="$PKI/ca.crt" --embed-certs --kubeconfig="$f" >/dev/null
  kubectl config set-credentials "$3" --client-certificate="$PKI/$2.crt" --client-key="$PKI/$2.key" --embed-certs --kubeconfig="$f" >/dev/null
  kubectl config set-context slurmk8s-local --cluster=slurmk8s-local --user="$3" --kubeconfig="$f" >/dev/null
  kubectl config use-context slurmk8s-local --kubeconfig="$f" >/dev/null
}
pki() {
  mkdir -p "$PKI"; chmod 700 "$PKI"
  # (output captured first: with pipefail, `grep -q` closing the pipe early fails the pipeline)
  if [ -f "$PKI/ca.crt" ] && [[ "$(openssl x509 -in "$PKI/ca.crt" -noout -text)" != *"Certificate Sign"* ]]; then
    say "re-issuing the cluster CA and certificates (the old CA lacks keyUsage, which strict TLS clients refuse)"
    rm -f "$PKI"/ca.key "$PKI"/ca.srl "$PKI"/*.crt "$PKI"/*.sans
  fi
  if [ ! -f "$PKI/ca.key" ]; then
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    # keyUsage and key identifiers: strict X.509 verifiers (Python >= 3.13's default context) refuse a CA without them
    openssl req -x509 -new -key "$PKI/ca.key" -subj /CN=slurmk8s-local-ca -days 3650 -out "$PKI/ca.crt" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -addext "subjectKeyIdentifier=hash" 2>/dev/null
  fi
  [ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null; openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
  # certificates are re-issued when the SANs change (a new node IP)
  cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$IP,IP:$SVC_IP"
  cert admin admin system:masters ""
  cert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,IP:$IP,IP:127.0.0.1"
  kubeconfig "$PKI/admin.kubeconfig.new" admin admin && mv -f "$PKI/admin.kubeconfig.new" "$PKI/admin.kubeconfig"
  kubeconfig "$PKI/kubelet.kubeconfig.new" kubelet "system:node:$NODE" && mv -f "$PKI/kubelet.kubeconfig.new" "$PKI/kubelet.kubeconfig"
  cp -f "$PKI/admin.kubeconfig" "$KUBECONFIG_PATH.new" && chmod 600 "$KUBECONFIG_PATH.new" && mv -f "$KUBECONFIG_PATH.new" "$KUBECONFIG_PATH"
}

# ---- images --------------------------------------------------------------------------------------
ctr_() { ctr -a "$CTRD_SOCK" -n k8s.io "$@"; }
# Docker's short names as containerd's CRI stores them: nginx -> docker.io/library/nginx:latest
normalize_image() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then ref=docker.io/library/$ref
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then ref=docker.io/$ref; fi
  [[ ${ref##*/} == *:* || $ref == *@* ]] || ref=$ref:latest
  echo "$ref"
}
has_image() { local all; all=$(ctr_ images ls -q 2>/dev/null) || return 1; grep -qxF "$1" <<<"$all"; }

# The sandbox ("pause") image, built here without a registry or Docker: a static binary that
# sleeps until signalled, packed as a docker-archive tarball FROM scratch and imported.
pause_image() {
  has_image "$PAUSE_IMAGE" && return 0
  local d arch diff cfg t0; t0=$(now_ms); d=$(mktemp -d)
  case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
  printf '#include <signal.h>\n#include <unistd.h>\nstatic void done(int s) { (void)s; _exit(0); }\nint main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }\n' >"$d/pause.c"
  mkdir -p "$d/rootfs"
  gcc -static -Os -s -o "$d/rootfs/pause" "$d/pause.c" || die "cannot compile the pause binary (gcc -static needs libc6-dev)"
  tar -C "$d/rootfs" --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$d/layer.tar" pause
  diff=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
  printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$diff" >"$d/config.json"
  cfg=$(sha256sum "$d/config.json" | cut -d' ' -f1); mv "$d/config.json" "$d/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfg" "$PAUSE_IMAGE" >"$d/manifest.json"
  tar -C "$d" -cf "$d/image.tar" manifest.json "$cfg.json" layer.tar
  ctr_ images import "$d/image.tar" >/dev/null || { rm -rf "$d"; die "importing the pause image failed"; }
  rm -rf "$d"
  say "pause image $PAUSE_IMAGE built and imported ($(secs_since "$t0"))"
}

docker_ready() {
  command -v docker >/dev/null && docker info >/dev/null 2>&1 && return 0
  local ensure=$HERE/../../images/ensure-docker.sh
  if [ -x "$ensure" ]; then say "Docker engine not answering; running $ensure"; "$ensure" && return 0; fi
  die "the Docker engine does not answer (docker info): install/start it (apt-get install -y docker.io; dockerd &)"
}

load_image() {
  [ $# -gt 0 ] || die "usage: $ME load-image IMAGE..."
  running containerd || die "the cluster is not running: run '$ME up' first"
  docker_ready
  mkdir -p "$ROOT/images"
  local img id ref rec t0 size
  for img in "$@"; do
    id=$(docker image inspect -f '{{.Id}}' "$img" 2>/dev/null) || die "image $img is not in the local Docker engine (build or pull it first)"
    ref=$(normalize_image "$img")
    rec=$ROOT/images/$(echo "$ref" | tr '/:@' '___').id
    if [ "$(cat "$rec" 2>/dev/null)" = "$id" ] && has_image "$ref"; then
      say "$img: already loaded (${id:7:12})"; continue
    fi
    size=$(docker image inspect -f '{{.Size}}' "$img")
    t0=$(now_ms)
    say "$img: loading $((size / 1048576)) MiB into containerd as $ref"
    docker save "$img" | ctr_ images import - >"$LOG/load-image.log" 2>&1 \
      || { cat "$LOG/load-image.log" >&2; die "importing $img failed"; }
    has_image "$ref" || die "$img was imported but containerd has no image named $ref"
    echo "$id" >"$rec"
    say "$img: loaded in $(secs_since "$t0")"
  done
}

# ---- up ------------------------------------------------------------------------------------------
write_configs() {
  mkdir -p "$ROOT/cni/net.d" "$ROOT/cni/ipam" "$CTRD_STATE"
  cat >"$ROOT/cni/net.d/10-slurmk8s.conflist" <<JSON
{"cniVersion":"1.0.0","name":"slurmk8s","plugins":[
 {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"hairpinMode":true,
  "ipam":{"type":"host-local","dataDir":"$ROOT/cni/ipam","ranges":[[{"subnet":"$POD_CIDR"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true}},
 {"type":"loopback"}]}
JSON
  cat >"$ROOT/containerd.toml" <<TOML
version = 2
root = "$ROOT/containerd"
state = "$CTRD_STATE"
[grpc]
  address = "$CTRD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root cannot lower oom_score_adj on this kind of host
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$ROOT/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
TOML
  local cgv1=false
  [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || cgv1=true
  cat >"$ROOT/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {x509: {clientCAFile: $PKI/ca.crt}, webhook: {enabled: true}, anonymous: {enabled: false}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: unix://$CTRD_SOCK
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
failSwapOn: false
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
# no registry: images that were loaded must never be garbage-collected
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
resolvConf: /etc/resolv.conf
healthzBindAddress: 127.0.0.1
YAML
  [ "$cgv1" = true ] || sed -i '/^failCgroupV1/d' "$ROOT/kubelet.yaml"
  cat >"$ROOT/Corefile" <<EOF
.:53 {
  bind $DNS_IP
  errors
  ready $DNS_IP:8181
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $KUBECONFIG_PATH
    pods insecure
    fallthrough in-addr.arpa ip6.arpa
  }
  forward . /etc/resolv.conf
  cache 5
}
EOF
}

# The control-plane daemons and the kubelet, as `up` and `restart` start them (IP set by the caller).
start_kube-apiserver() {
  start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 --service-cluster-ip-range="$SVC_CIDR" \
    --secure-port="$API_PORT" --advertise-address="$IP" --bind-address=0.0.0.0 \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" --authorization-mode=Node,RBAC --allow-privileged=true \
    --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname
}
start_kube-controller-manager() {
  start kube-controller-manager kube-controller-manager --kubeconfig="$KUBECONFIG_PATH" \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" --use-service-account-credentials \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" --leader-elect=false \
    --bind-address=127.0.0.1
}
start_kube-scheduler() {
  start kube-scheduler kube-scheduler --kubeconfig="$KUBECONFIG_PATH" --leader-elect=false --bind-address=127.0.0.1 \
    --kube-api-qps="$SCHED_QPS" --kube-api-burst="$((SCHED_QPS * 2))"
}
start_kubelet() {
  start kubelet kubelet --config="$ROOT/kubelet.yaml" --kubeconfig="$PKI/kubelet.kubeconfig" --root-dir="$ROOT/kubelet" \
    --hostname-override="$NODE" --node-ip="$IP"
}

# Ready, as reported by the kubelet started now (after a down/up the Node object still holds the
# previous run's Ready condition for a while: only a heartbeat since KUBELET_STARTED counts)
node_ready() {
  local out
  out=$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  set -- $out
  [ "${1:-}" = True ] && [ -n "${2:-}" ] && [ "$(date -d "$2" +%s)" -ge "${KUBELET_STARTED:-0}" ]
}
api_ready() { kubectl get --raw /readyz >/dev/null 2>&1; }

up() {
  local with_kwok=false a
  for a in "$@"; do case $a in --kwok) with_kwok=true ;; *) die "unknown option for up: $a" ;; esac; done
  # kwok stays enabled across down/up once started (cluster.sh kwok down disables it)
  [ -f "$ROOT/kwok.enabled" ] && with_kwok=true
  need_toolchain etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns
  [ "$with_kwok" = false ] || need_toolchain kwok
  [ "$(id -u)" -eq 0 ] || die "the local cluster runs host daemons (containerd, kubelet): run as root"
  mkdir -p "$RUN" "$LOG" "$ROOT/etcd"
  export KUBECONFIG=$KUBECONFIG_PATH

  local n=0 d
  for d in "${CORE[@]}"; do running "$d" && n=$((n + 1)); done
  if [ "$n" -eq "${#CORE[@]}" ] && api_ready; then
    say "already running (node $NODE); kubeconfig: $KUBECONFIG_PATH"
    [ "$with_kwok" = false ] || kwok_up
    echo "export KUBECONFIG=$KUBECONFIG_PATH"; return 0
  fi
  if [ "$n" -gt 0 ]; then say "partly running ($n of ${#CORE[@]} daemons): stopping it first"; down; fi

  need_debian
  IP=$(node_ip); [ -n "$IP" ] || die "no IPv4 address for the node (set LOCALK8S_NODE_IP)"
  SVC_IP=$(first_ip "$SVC_CIDR")
  check_port tcp 2379 etcd; check_port tcp 2380 etcd-peer; check_port tcp "$API_PORT" "kube-apiserver (LOCALK8S_API_PORT)"
  check_port tcp 10257 kube-controller-manager; check_port tcp 10259 kube-scheduler
  check_port tcp 10250 kubelet; check_port tcp 10248 kubelet-healthz
  check_port tcp 10249 kube-proxy-metrics; check_port tcp 10256 kube-proxy-healthz
  check_port udp 53 "cluster DNS" "$DNS_IP"; check_port tcp 53 "cluster DNS" "$DNS_IP"
  check_port tcp 8181 coredns-ready "$DNS_IP"

  trap 'printf "\n[cluster] up interrupted: run \"%s down\" to clean up what was started\n" "$ME" >&2; exit 130' INT TERM
  local t_all t0; t_all=$(now_ms)
  say "node $NODE, IP $IP, pods $POD_CIDR, services $SVC_CIDR, DNS $DNS_IP, state $ROOT"
  t0=$(now_ms); pki; write_configs; say "certificates and configs ready ($(secs_since "$t0"))"

  t0=$(now_ms)
  start etcd etcd --name localk8s --data-dir "$ROOT/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster localk8s=http://127.0.0.1:2380 --unsafe-no-fsync
  wait_for etcd 60 curl -sf http://127.0.0.1:2379/health || fail_up
  say "etcd ready ($(secs_since "$t0"))"

  t0=$(now_ms)
  start_kube-apiserver
  wait_for kube-apiserver 120 api_ready || fail_up
  say "kube-apiserver ready ($(secs_since "$t0"))"

  start_kube-controller-manager
  start_kube-scheduler

  # Docker sets the FORWARD policy to DROP and br_netfilter is on: accept what crosses the pod bridge
  iptables -C FORWARD -i cni0 -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 -i cni0 -j ACCEPT
  iptables -C FORWARD -o cni0 -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 -o cni0 -j ACCEPT

  t0=$(now_ms)
  start containerd containerd --config "$ROOT/containerd.toml"
  wait_for containerd 60 ctr -a "$CTRD_SOCK" version || fail_up
  say "containerd ready ($(secs_since "$t0"))"
  pause_image

  KUBELET_STARTED=$(date +%s)
  start_kubelet
  start kube-proxy kube-proxy --kubeconfig="$KUBECONFIG_PATH" --cluster-cidr="$CLUSTER_CIDR" --proxy-mode=iptables \
    --hostname-override="$NODE" --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256
  # no dummy links on these kernels: the DNS address lives on lo
  # (not `ip ... | grep -q`: with pipefail, grep closing the pipe early fails the pipeline, and the
  # add then fails with "Address already assigned" where a previous run left the address)
  [[ "$(ip addr show dev lo)" == *" $DNS_IP/"* ]] || ip addr add "$DNS_IP/32" dev lo
  start coredns coredns -conf "$ROOT/Corefile"

  t0=$(now_ms)
  wait_for kubelet 120 node_ready || fail_up
  say "node $NODE Ready ($(secs_since "$t0") after kubelet start, $(secs_since "$t_all") in all)"
  wait_for coredns 30 curl -sf "http://$DNS_IP:8181/ready" || fail_up
  wait_for kube-controller-manager 60 kubectl get serviceaccount default -n default || fail_up
  wait_for kube-proxy 30 curl -sf http://127.0.0.1:10256/healthz || fail_up
  [ "$with_kwok" = false ] || kwok_up
  trap - INT TERM
  say "up in $(secs_since "$t_all"); kubeconfig: $KUBECONFIG_PATH"
  echo "export KUBECONFIG=$KUBECONFIG_PATH"
}
fail_up() { printf '[cluster] up failed: logs under %s; run "%s down" to clean up\n' "$LOG" "$ME" >&2; exit 1; }

# ---- down ----------------------------------------------------------------------------------------
down() {
  local purge=false a any=false d
  for a in "$@"; do case $a in --purge) purge=true ;; *) die "unknown option for down: $a" ;; esac; done
  for d in kwok "${CORE[@]}"; do running "$d" && any=true; done
  [ "$any" = true ] || say "not running"
  stop kwok
  stop coredns; stop kube-proxy; stop kubelet
  # kill pod containers through our own containerd first: their shims outlive containerd otherwise
  if running containerd && [ -S "$CTRD_SOCK" ]; then
    local tasks t; tasks=$(ctr_ tasks ls -q 2>/dev/null || true)
    if [ -n "$tasks" ]; then
      for t in $tasks; do ctr_ tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
      sleep 0.5
      for t in $tasks; do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
      say "pod containers: killed $(echo "$tasks" | wc -w)"
    fi
  fi
  stop containerd
  # shims of this containerd that survived (matched by our socket path, never by name alone)
  local shims; shims=$(pgrep -f -- "-address $CTRD_SOCK" || true)
  if [ -n "$shims" ]; then kill -9 $shims 2>/dev/null || true; say "leftover shims killed: $shims"; fi
  stop kube-scheduler; stop kube-controller-manager; stop kube-apiserver; stop etcd
  ip addr del "$DNS_IP/32" dev lo 2>/dev/null || true
  if [ "$purge" = true ]; then
    # unmount what the kubelet and containerd left mounted under the state dir, then delete it
    { grep -o " $ROOT/[^ ]*\| $CTRD_STATE/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$ROOT" "$CTRD_STATE"; say "state purged ($ROOT)"
  fi
  say "down"
}

# ---- restart (fault tests: an outage of one daemon, its pods and state untouched) ------------------
RESTARTABLE=(kube-apiserver kubelet kube-controller-manager kube-scheduler)
restart() {
  local name=${1:-} down_for=0 t0
  [ $# -gt 0 ] && shift
  [[ " ${RESTARTABLE[*]} " == *" $name "* ]] || die "usage: $ME restart $(IFS='|'; echo "${RESTARTABLE[*]}") [--down-for SECONDS]"
  while [ $# -gt 0 ]; do
    case $1 in
      --down-for) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--down-for needs whole seconds"; down_for=$2; shift 2 ;;
      *) die "unknown option for restart: $1" ;;
    esac
  done
  [ "$(id -u)" -eq 0 ] || die "the local cluster runs host daemons: run as root"
  running "$name" || die "$name is not running (cluster status: $ME status); start the cluster with '$ME up'"
  export KUBECONFIG=$KUBECONFIG_PATH
  IP=$(node_ip); [ -n "$IP" ] || die "no IPv4 address for the node (set LOCALK8S_NODE_IP)"
  t0=$(now_ms)
  stop "$name"
  [ "$down_for" -eq 0 ] || { say "$name: kept down for ${down_for}s"; sleep "$down_for"; }
  case $name in
    kube-apiserver) start_kube-apiserver; wait_for kube-apiserver 120 api_ready || exit 1 ;;
    kubelet) KUBELET_STARTED=$(date +%s); start_kubelet; wait_for kubelet 120 node_ready || exit 1 ;;
    *) "start_$name"; wait_for "$name" 30 running "$name" || exit 1 ;;
  esac
  say "$name restarted and ready ($(secs_since "$t0") from stop)"
}

# ---- status --------------------------------------------------------------------------------------
status() {
  local d n=0 pid
  for d in "${CORE[@]}" kwok; do
    if pid=$(pid_of "$d"); then
      printf '  %-24s running (pid %s)\n' "$d" "$pid"; [ "$d" = kwok ] || n=$((n + 1))
    elif [ "$d" != kwok ]; then printf '  %-24s stopped\n' "$d"
    fi
  done
  if [ "$n" -eq 0 ]; then echo "cluster: stopped (state: $ROOT)"; return 3; fi
  if [ "$n" -lt "${#CORE[@]}" ]; then echo "cluster: partly running ($n of ${#CORE[@]}): run '$ME down' then '$ME up'"; return 4; fi
  export KUBECONFIG=$KUBECONFIG_PATH
  echo "cluster: running; kubeconfig: $KUBECONFIG_PATH"
  kubectl get nodes -o wide 2>&1 | sed 's/^/  /' || true
  return 0
}

# ---- kwok ----------------------------------------------------------------------------------------
kwok_up() {
  need_toolchain kwok
  running kube-apiserver || die "the cluster is not running: run '$ME up' first"
  if running kwok; then say "kwok already running"; return 0; fi
  local stages=$SHARE/kwok-stages cfg=() f
  [ -d "$stages" ] || die "kwok stage files missing ($stages): run the toolchain build"
  for f in "$stages"/*.yaml; do grep -q '^kind: Stage' "$f" && cfg+=(--config "$f"); done
  case $KWOK_POD_PARALLELISM in
    ''|*[!0-9]*|0*) die "LOCALK8S_KWOK_POD_PARALLELISM must be a whole number above 0, without leading zeros (it is '$KWOK_POD_PARALLELISM')" ;;
  esac
  touch "$ROOT/kwok.enabled"
  # kwok applies none of its defaults to a KwokConfiguration read from a file (a worker count left
  # out is 0, and kwok refuses to start), so the file names the options that kwok v0.8.0 defaults,
  # at its defaults but the one changed
  cat > "$ROOT/kwok-config.yaml" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: $KWOK_POD_PARALLELISM
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: true
  enableProfilingHandler: true
  enableContentionProfiling: false
  manageAllNodes: false
EOF
  cfg+=(--config "$ROOT/kwok-config.yaml")
  check_port tcp 10247 kwok
  start kwok kwok --kubeconfig="$KUBECONFIG_PATH" "${cfg[@]}" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip="$(node_ip)" --cidr="$KWOK_CIDR" --node-lease-duration-seconds=40 \
    --server-address=127.0.0.1:10247
  wait_for kwok 30 curl -sf http://127.0.0.1:10247/healthz || exit 1
  say "kwok ready: it manages nodes annotated kwok.x-k8s.io/node=fake"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  status) status ;;
  restart) shift; restart "$@" ;;
  load-image) shift; load_image "$@" ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  kwok)
    shift
    case "${1:-up}" in
      up) export KUBECONFIG=$KUBECONFIG_PATH; kwok_up ;;
      down) rm -f "$ROOT/kwok.enabled"; stop kwok ;;
      status) if pid=$(pid_of kwok); then echo "kwok: running (pid $pid)"; else echo "kwok: stopped"; exit 3; fi ;;
      *) die "usage: $ME kwok up|down|status" ;;
    esac ;;
  -h|--help|help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
