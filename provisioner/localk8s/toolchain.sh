#!/usr/bin/env bash
# slurmk8s toolchain: builds, from the Go module proxy only, the tools that cannot be installed
# from PyPI or Debian (air-gapped sites have exactly those mirrors).
#
#   toolchain.sh build [TOOL...]   build what is missing (all tools by default), print the bin dir
#   toolchain.sh path              print the stable bin dir (PATH entry)
#   toolchain.sh env               print `export PATH=... PULUMI_HOME=...` lines
#   toolchain.sh check             exit 0 when every tool is present, else list what is missing
#   toolchain.sh versions          print the pinned versions and cache keys
#
# Layout (outside the repository, shared by every checkout):
#   $SLURMK8S_TOOLCHAIN_DIR (default /var/cache/slurmk8s/toolchain)
#     <tool>-<version>/bin/...   one directory per tool and version (the cache key): changing
#                                a version rebuilds only that tool
#     <tool>-<version>/share/... data that belongs to a tool (kwok stage files, Kueue's config/
#                                manifests: rendered at run time with kubectl, no Go needed)
#     logs/<tool>-<version>.log  full build log of each tool
#     bin/                       stable symlink farm: put it on PATH
#     share/                     stable links to tool data (share/kwok-stages, share/kueue-config)
#     pulumi-home/               PULUMI_HOME with the kubernetes provider plugin installed
#     go/                        Go module and build caches (large: ~17 GB)
# A tool already on PATH at the pinned version is linked instead of built.
set -uo pipefail

# ---- pinned versions (override through the environment) ----------------------------------------
K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
# the version the Kueue probe verified (../shared notes); the proxy also serves v0.19.1 and v0.19.2
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
PULUMI_VERSION=${PULUMI_VERSION:-v3.274.1}
PULUMI_K8S_VERSION=${PULUMI_K8S_VERSION:-v4.25.0}
# provider/v4 has no tags on the proxy: the pseudo-version of the v4.25.0 release commit
PULUMI_K8S_REV=${PULUMI_K8S_REV:-v4.0.0-20260115033456-f47bc2d6f199}
PROTOBUF_VERSION=${PROTOBUF_VERSION:-v1.36.12}
CLIPBOARD_FORK=${CLIPBOARD_FORK:-github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e}
JOBS=${TOOLCHAIN_JOBS:-2}

CACHE=${SLURMK8S_TOOLCHAIN_DIR:-/var/cache/slurmk8s/toolchain}
BIN=$CACHE/bin
SHARE=$CACHE/share
LOGS=$CACHE/logs
PULUMI_HOME_DIR=$CACHE/pulumi-home

ALL_TOOLS=(etcd kubernetes coredns kwok kueue helm pulumi pulumi-kubernetes)
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

say() { printf '[toolchain %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[toolchain] error: %s\n' "$*" >&2; exit 1; }

key_of() {  # cache key of a tool: name and every version that goes into it
  case $1 in
    etcd) echo "etcd-$ETCD_VERSION" ;;
    kubernetes) echo "kubernetes-$K8S_VERSION" ;;
    coredns) echo "coredns-$COREDNS_VERSION" ;;
    kwok) echo "kwok-$KWOK_VERSION" ;;
    kueue) echo "kueue-$KUEUE_VERSION" ;;
    helm) echo "helm-$HELM_VERSION" ;;
    pulumi) echo "pulumi-$PULUMI_VERSION" ;;
    pulumi-kubernetes) echo "pulumi-kubernetes-$PULUMI_K8S_VERSION" ;;
    *) return 1 ;;
  esac
}
share_of() {  # the data directory a tool ships under share/ (none for most)
  case $1 in
    kwok) echo kwok-stages ;;
    kueue) echo kueue-config ;;
  esac
}
bins_of() {
  case $1 in
    kubernetes) echo "${K8S_BINS[*]}" ;;
    pulumi-kubernetes) echo "pulumi-resource-kubernetes" ;;
    *) echo "$1" ;;
  esac
}
version_of() {
  case $1 in
    etcd) echo "$ETCD_VERSION" ;; kubernetes) echo "$K8S_VERSION" ;; coredns) echo "$COREDNS_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;; kueue) echo "$KUEUE_VERSION" ;; helm) echo "$HELM_VERSION" ;; pulumi) echo "$PULUMI_VERSION" ;;
    pulumi-kubernetes) echo "$PULUMI_K8S_VERSION" ;;
  esac
}

# ---- tools already installed --------------------------------------------------------------------
# PATH without our own bin dir, so a link in the farm never counts as "installed".
foreign_path() { local IFS=:; local out=() d; for d in $PATH; do [ "$d" = "$BIN" ] || out+=("$d"); done; echo "${out[*]}"; }
find_foreign() { PATH=$(foreign_path) command -v "$1" 2>/dev/null; }
# Prints the version a binary reports, normalised to vX.Y.Z, or nothing.
reported_version() {
  local name=$1 path=$2 out
  case $name in
    kubectl) out=$(timeout 10 "$path" version --client 2>/dev/null | sed -n 's/^Client Version: //p') ;;
    kube-*|kubelet) out=$(timeout 10 "$path" --version 2>/dev/null | sed -n 's/^Kubernetes //p') ;;
    etcd) out=v$(timeout 10 "$path" --version 2>/dev/null | sed -n 's/^etcd Version: //p') ;;
    coredns) out=v$(timeout 10 "$path" -version 2>/dev/null | sed -n 's/^CoreDNS-//p') ;;
    helm) out=$(timeout 10 "$path" version --template '{{.Version}}' 2>/dev/null) ;;
    pulumi) out=$(timeout 20 env PULUMI_SKIP_UPDATE_CHECK=true "$path" version 2>/dev/null) ;;
    kwok) out=$(timeout 10 "$path" --version 2>/dev/null | grep -o 'v[0-9][0-9.]*' | head -1) ;;
    *) out= ;;
  esac
  echo "$out" | head -1 | tr -d '[:space:]'
}
# Use an installed binary only when it reports exactly the pinned version.
foreign_ok() {
  local name=$1 want=$2 path
  path=$(find_foreign "$name") || return 1
  [ "$(reported_version "$name" "$path")" = "$want" ] || return 1
  echo "$path"
}

link() { mkdir -p "$BIN"; ln -sfn "$2" "$BIN/$1.tmp.$$" && mv -fT "$BIN/$1.tmp.$$" "$BIN/$1"; }

# ---- Go environment -----------------------------------------------------------------------------
go_env() {
  export GOPATH=$CACHE/go/path GOMODCACHE=$CACHE/go/path/pkg/mod GOCACHE=$CACHE/go/cache
  export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
wrapper_module() {  # fresh wrapper module in $SRC/$1, cwd set to it
  local d=$CACHE/src/$1
  rm -rf "$d" && mkdir -p "$d" && cd "$d" && go mod init "local.build/$1"
}

# ---- recipes: each builds into $OUTBIN (and $OUTSHARE), stdout/stderr go to the tool's log --------
build_etcd() {
  wrapper_module "$KEY" || return 1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" || return 1
  go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$OUTBIN/etcd" go.etcd.io/etcd/server/v3 || return 1
  "$OUTBIN/etcd" --version
}

build_coredns() {
  wrapper_module "$KEY" || return 1
  go get "github.com/coredns/coredns@$COREDNS_VERSION" || return 1
  go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$OUTBIN/coredns" github.com/coredns/coredns || return 1
  "$OUTBIN/coredns" -version
}

build_kubernetes() {
  # k8s.io/kubernetes is not meant to be required as a module: its go.mod replaces the staging
  # modules with ./staging paths. A wrapper module points each at its published v0.X.Y tag.
  wrapper_module "$KEY" || return 1
  local minor patch gomod hash date ldf p c
  minor=$(echo "$K8S_VERSION" | cut -d. -f2); patch=$(echo "$K8S_VERSION" | cut -d. -f3)
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | json 'd["GoMod"]') || return 1
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION" || return 1
  go mod edit -json "$gomod" | STAGING="v0.$minor.$patch" python3 -c '
import json, os, sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]
    if new["Path"].startswith("./staging/"):
        print("-replace=%s=%s@%s" % (old, old, os.environ["STAGING"]))
    elif new.get("Version"):
        print("-replace=%s=%s@%s" % (old, new["Path"], new["Version"]))' | xargs -r go mod edit || return 1
  grep '^godebug' "$gomod" >> go.mod || true
  go get "google.golang.org/protobuf@$PROTOBUF_VERSION" || return 1
  # without the version stamp the apiserver reports v0.0.0 and the Pulumi provider refuses it
  hash=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | json '(d.get("Origin") or {}).get("Hash", "0" * 40)')
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ); ldf="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitCommit=$hash"
    ldf+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  for c in $BUILD_BINS; do
    local t0=$SECONDS
    go build -p "$JOBS" -trimpath -ldflags "$ldf" -o "$OUTBIN/$c" "k8s.io/kubernetes/cmd/$c" || return 1
    echo "built $c in $((SECONDS - t0))s"
  done
  [ -x "$OUTBIN/kube-apiserver" ] && "$OUTBIN/kube-apiserver" --version
  return 0
}

build_kwok() {
  wrapper_module "$KEY" || return 1
  go get "sigs.k8s.io/kwok@$KWOK_VERSION" || return 1
  go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$OUTBIN/kwok" sigs.k8s.io/kwok/cmd/kwok || return 1
  "$OUTBIN/kwok" --version
}

kwok_stages() {  # the stage files kwok needs (it exits "no stages found" without them)
  local dir s
  dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | json 'd["Dir"]') || return 1
  mkdir -p "$OUTSHARE/kwok-stages"
  for s in node/fast node/heartbeat-with-lease pod/fast; do
    for f in "$dir/kustomize/stage/$s/"*.yaml; do  # Stage objects only, not the kustomization files
      grep -q '^kind: Stage' "$f" && { cp "$f" "$OUTSHARE/kwok-stages/" || return 1; }
    done
  done
  ls "$OUTSHARE/kwok-stages"
}

build_kueue() {
  # all of Kueue's integrations are compiled in (the binary is ~125 MB unstripped); the lab turns on
  # only the plain-Pod one through its configuration
  wrapper_module "$KEY" || return 1
  go get "sigs.k8s.io/kueue@$KUEUE_VERSION" || return 1
  local p=sigs.k8s.io/kueue/pkg/version
  go build -p "$JOBS" -trimpath \
    -ldflags "-s -w -X $p.GitVersion=$KUEUE_VERSION -X $p.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -o "$OUTBIN/kueue" sigs.k8s.io/kueue/cmd/kueue || return 1
  ls -l "$OUTBIN/kueue"
}

kueue_config() {  # the module's kustomize tree (config/): `slurmk8s cluster kueue up` renders it with kubectl
  local dir
  dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | json 'd["Dir"]') || return 1
  [ -f "$dir/config/default/kustomization.yaml" ] || { echo "no config/default in $dir"; return 1; }
  cp -r "$dir/config" "$OUTSHARE/kueue-config" && chmod -R u+w "$OUTSHARE/kueue-config" || return 1
  echo "$KUEUE_VERSION" >"$OUTSHARE/kueue-config/VERSION"
  ls "$OUTSHARE/kueue-config"
}

build_helm() {
  wrapper_module "$KEY" || return 1
  go get "helm.sh/helm/v3@$HELM_VERSION" || return 1
  go build -p "$JOBS" -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    -o "$OUTBIN/helm" helm.sh/helm/v3/cmd/helm || return 1
  "$OUTBIN/helm" version
}

build_pulumi() {
  # Only the CLI: the Python language host module is not served by the proxy, and inline
  # Automation API programs do not need it.
  wrapper_module "$KEY" || return 1
  local m
  go mod edit -replace="github.com/atotto/clipboard=$CLIPBOARD_FORK" || return 1
  for m in pkg/v3 sdk/v3; do  # mirror upstream's non-local replaces
    go mod edit -json "$(go mod download -json "github.com/pulumi/pulumi/$m@$PULUMI_VERSION" | json 'd["GoMod"]')" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"].get("Version"):
        print("-replace=%s=%s@%s" % (r["Old"]["Path"], r["New"]["Path"], r["New"]["Version"]))' | xargs -r go mod edit || return 1
  done
  go get "github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION" "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION" || return 1
  go build -p "$JOBS" -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
    -o "$OUTBIN/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi || return 1
  PULUMI_SKIP_UPDATE_CHECK=true "$OUTBIN/pulumi" version
}

build_pulumi-kubernetes() {
  # The module zip lacks the generated schema files: copy it out, tidy, run generate.go, build.
  local dir v=${PULUMI_K8S_VERSION#v}
  mkdir -p "$CACHE/src" && cd "$CACHE/src" || return 1
  dir=$(go mod download -json "github.com/pulumi/pulumi-kubernetes/provider/v4@$PULUMI_K8S_REV" | json 'd["Dir"]') || return 1
  rm -rf "$KEY" && cp -r "$dir" "$KEY" && chmod -R u+w "$KEY" && cd "$KEY" || return 1
  go mod edit -dropreplace=github.com/pulumi/pulumi-kubernetes/sdk/v4 \
    -replace="github.com/pulumi/pulumi-kubernetes/sdk/v4=github.com/pulumi/pulumi-kubernetes/sdk/v4@$PULUMI_K8S_VERSION" || return 1
  go mod tidy || return 1
  (cd cmd/pulumi-resource-kubernetes && VERSION=$v go run ./generate.go) || return 1
  go build -p "$JOBS" -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
    -o "$OUTBIN/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes
}

# ---- one tool: link what exists, build what is missing --------------------------------------------
FAILED=()
declare -A WHERE=()
tool() {
  local t=$1 key want b missing=() found log t0 rc
  key=$(key_of "$t") || die "unknown tool '$t' (tools: ${ALL_TOOLS[*]})"
  want=$(version_of "$t")
  local keydir=$CACHE/$key
  for b in $(bins_of "$t"); do
    if [ "$t" != pulumi-kubernetes ] && found=$(foreign_ok "$b" "$want"); then
      WHERE[$b]=$found; say "$b $want: using installed $found"
    elif [ -x "$keydir/bin/$b" ]; then
      WHERE[$b]=$keydir/bin/$b
    else
      missing+=("$b")
    fi
  done
  local share; share=$(share_of "$t")
  if [ -n "$share" ] && [ ! -d "$keydir/share/$share" ]; then
    missing+=("$share")
  fi
  if [ ${#missing[@]} -eq 0 ]; then
    say "$t $want: cached ($keydir)"
  else
    command -v go >/dev/null || die "go not found, needed to build ${missing[*]}: install Go (>= 1.24) from your mirror"
    log=$LOGS/$key.log
    say "$t $want: building ${missing[*]} (log: $log)"
    t0=$SECONDS
    mkdir -p "$LOGS" "$keydir/bin" "$keydir/share"
    local tmp=$CACHE/.build-$key
    rm -rf "$tmp" && mkdir -p "$tmp/bin" "$tmp/share"
    (
      set -o pipefail
      export OUTBIN=$tmp/bin OUTSHARE=$tmp/share KEY=$key BUILD_BINS="${missing[*]/$share/}"
      echo "# $(date -Is) building $t $want: ${missing[*]} (go: $(go version))"
      if [ -n "$share" ]; then  # the binary only where it is missing, then the tool's data
        if [[ " ${missing[*]} " == *" $t "* ]]; then "build_$t" || exit 1; fi
        "${share//-/_}" || exit 1
      else
        "build_$t" || exit 1
      fi
    ) >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      # move results into the cache key atomically per file
      for b in "$tmp"/bin/*; do [ -e "$b" ] && mv -f "$b" "$keydir/bin/"; done
      if [ -n "$share" ] && [ -d "$tmp/share/$share" ]; then
        rm -rf "${keydir:?}/share/$share"; mv "$tmp/share/$share" "$keydir/share/"
      fi
      for b in "${missing[@]}"; do
        [ "$b" = "$share" ] && continue
        [ -x "$keydir/bin/$b" ] || { rc=1; echo "# $b was not produced" >>"$log"; }
        WHERE[$b]=$keydir/bin/$b
      done
    fi
    rm -rf "$tmp"
    if [ $rc -ne 0 ]; then
      say "$t $want: FAILED after $((SECONDS - t0))s; see $log"
      tail -n 15 "$log" | sed 's/^/    | /' >&2
      FAILED+=("$t")
      return 1
    fi
    say "$t $want: ok in $((SECONDS - t0))s"
  fi
  for b in $(bins_of "$t"); do
    # the provider is installed into PULUMI_HOME, not linked: on PATH it would be an "ambient" plugin
    [ "$t" = pulumi-kubernetes ] && continue
    [ -n "${WHERE[$b]:-}" ] && link "$b" "${WHERE[$b]}"
  done
  [ -n "$share" ] && { mkdir -p "$SHARE"; ln -sfn "$keydir/share/$share" "$SHARE/$share"; }
  return 0
}

install_provider_plugin() {
  local v=${PULUMI_K8S_VERSION} key plugdir
  key=$(key_of pulumi-kubernetes)
  plugdir=$PULUMI_HOME_DIR/plugins/resource-kubernetes-$v
  if [ -x "$plugdir/pulumi-resource-kubernetes" ]; then
    say "pulumi plugin kubernetes $v: installed ($plugdir)"; return 0
  fi
  [ -x "$BIN/pulumi" ] || { say "pulumi plugin kubernetes $v: skipped, no pulumi CLI"; return 1; }
  [ -x "$CACHE/$key/bin/pulumi-resource-kubernetes" ] || { say "pulumi plugin kubernetes $v: skipped, provider not built"; return 1; }
  mkdir -p "$PULUMI_HOME_DIR"
  if PULUMI_HOME=$PULUMI_HOME_DIR PULUMI_SKIP_UPDATE_CHECK=true "$BIN/pulumi" plugin install resource kubernetes "$v" \
      --file "$CACHE/$key/bin/pulumi-resource-kubernetes" >>"$LOGS/$key.log" 2>&1; then
    say "pulumi plugin kubernetes $v: installed into PULUMI_HOME=$PULUMI_HOME_DIR"
  else
    say "pulumi plugin kubernetes $v: FAILED; see $LOGS/$key.log"; FAILED+=(pulumi-plugin); return 1
  fi
}

link_optional() {  # tools we never build but link when installed (kind: where Docker allows it)
  local p
  if p=$(find_foreign kind); then link kind "$p"; say "kind: using installed $p"; fi
}

check() {
  local t b missing=()
  for t in "${ALL_TOOLS[@]}"; do
    [ "$t" = pulumi-kubernetes ] && continue
    for b in $(bins_of "$t"); do [ -x "$BIN/$b" ] || missing+=("$b"); done
  done
  for t in "${ALL_TOOLS[@]}"; do
    b=$(share_of "$t"); [ -z "$b" ] || [ -e "$SHARE/$b" ] || missing+=("$b")
  done
  [ -x "$PULUMI_HOME_DIR/plugins/resource-kubernetes-$PULUMI_K8S_VERSION/pulumi-resource-kubernetes" ] \
    || missing+=("pulumi-plugin-kubernetes-$PULUMI_K8S_VERSION")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "missing: ${missing[*]} (run: slurmk8s toolchain build)" >&2; return 1
  fi
  echo "toolchain complete: $BIN"
}

build() {
  local tools=("$@") t t_all=$SECONDS
  [ ${#tools[@]} -gt 0 ] || tools=("${ALL_TOOLS[@]}")
  for t in "${tools[@]}"; do key_of "$t" >/dev/null || die "unknown tool '$t' (tools: ${ALL_TOOLS[*]})"; done
  mkdir -p "$CACHE" "$LOGS" "$BIN" "$SHARE" || die "cannot create $CACHE (run as root or set SLURMK8S_TOOLCHAIN_DIR)"
  exec 9>"$CACHE/.lock"
  if ! flock -n 9; then say "another toolchain build holds $CACHE/.lock; waiting for it"; flock 9; fi
  go_env
  for t in "${tools[@]}"; do tool "$t" || true; done
  if [[ " ${tools[*]} " == *" pulumi-kubernetes "* || " ${tools[*]} " == *" pulumi "* ]]; then
    install_provider_plugin || true
  fi
  link_optional
  if [ ${#FAILED[@]} -gt 0 ]; then
    say "FAILED: ${FAILED[*]} (logs under $LOGS); total $((SECONDS - t_all))s"
    exit 1
  fi
  say "done in $((SECONDS - t_all))s"
  echo "$BIN"
}

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in
  build) shift; build "$@" ;;
  path) echo "$BIN" ;;
  env) printf 'export PATH=%s:$PATH\nexport PULUMI_HOME=%s\n' "$BIN" "$PULUMI_HOME_DIR" ;;
  pulumi-home) echo "$PULUMI_HOME_DIR" ;;
  check) check ;;
  versions)
    for t in "${ALL_TOOLS[@]}"; do printf '%-18s %-10s %s\n' "$t" "$(version_of "$t")" "$CACHE/$(key_of "$t")"; done ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
