#!/bin/sh
# slurmk8s-config-init --out DIR: run once per slurmctld pod by the slurmctld container's entrypoint
# (images/entrypoint/slurmctld.sh) before slurmctld starts. Fills DIR with slurm.conf and the rest: a copy of the configuration slurmctld last ran with, when the reconcile loop kept one on
# the state volume for exactly this spec, site and renderer (provisioner/livenodes/cache.py); else
# renders it (slurmk8s-render-config: the spec and the Kubernetes nodes, a Python start). The copy
# saves that start on every wake of an asleep tier. The loop keeps one only for a spec without a
# pinned pool (whose Slurm nodes do not follow the Kubernetes nodes), and every file must match
# the sha256 sums in `complete`, written last. DIR/.ready, written last, tells the pod's other
# containers (the reconcile loop, accounting: provisioner/livenodes/ready.py) that DIR is whole.
#   SLURMK8S_CONFIG_CACHE  the kept copy (default /var/spool/slurmctld/slurmk8s/config)
#   SLURMK8S_SPEC          the spec the pod runs (default /etc/slurmk8s/spec/spec.json; site.json beside it)
#   SLURMK8S_RENDER_ID     the image's renderer id (default /opt/slurmk8s/render-id)
#   SLURMK8S_RENDER_CONFIG the renderer (default /opt/slurmk8s/bin/slurmk8s-render-config)
set -eu

[ "${1:-}" = --out ] && [ -n "${2:-}" ] || { echo "usage: slurmk8s-config-init --out DIR" >&2; exit 2; }
out=$2
cache=${SLURMK8S_CONFIG_CACHE:-/var/spool/slurmctld/slurmk8s/config}
spec=${SLURMK8S_SPEC:-/etc/slurmk8s/spec/spec.json}
site=$(dirname "$spec")/site.json
render_id=${SLURMK8S_RENDER_ID:-/opt/slurmk8s/render-id}

log() { echo "slurmk8s-config-init: $*" >&2; }

# both absent, or both there and equal
same() {
    if [ -e "$1" ]; then cmp -s "$1" "$2"; else [ ! -e "$2" ]; fi
}

# the spec files this configuration is made from, for the loop's copy (provisioner/livenodes/cache.py)
inputs() {
    mkdir -p "$out/.inputs" && rm -f "$out/.inputs"/* && cp "$spec" "$out/.inputs/spec.json" \
        && { [ ! -e "$site" ] || cp "$site" "$out/.inputs/site.json"; }
}

# nothing of an earlier run of this container or of a copy that failed half-way
clean() {
    mkdir -p "$out" && rm -f "$out/.ready" "$out"/* "$out"/.*.tmp 2>/dev/null
}

# DIR is whole: the pod's other containers may read it (and the reconcile loop keep it current)
ready() {
    : >"$out/.ready" || { log "cannot write $out/.ready"; exit 1; }
}

render() {
    log "$1: rendering"
    clean || true
    inputs || log "cannot note the spec files in $out/.inputs: the next start renders again"
    "${SLURMK8S_RENDER_CONFIG:-/opt/slurmk8s/bin/slurmk8s-render-config}" --out "$out" || exit
    ready
    exit 0
}

# the files `complete` lists (sha256sum lines, checked before), the spec files and the id excepted
copy() {
    clean
    while read -r _sum name; do
        case $name in
            render-id|spec.json|site.json) ;;
            *) cp "$cache/$name" "$out/.$name.tmp" && mv "$out/.$name.tmp" "$out/$name" || return 1 ;;
        esac
    done <"$cache/complete"
    inputs
}

[ -f "$cache/complete" ] || render "no kept configuration in $cache"
[ -f "$render_id" ] || render "no renderer id at $render_id"
same "$spec" "$cache/spec.json" || render "the spec differs from the kept configuration's"
same "$site" "$cache/site.json" || render "the site differs from the kept configuration's"
same "$render_id" "$cache/render-id" || render "the image's renderer differs from the kept configuration's"
(cd "$cache" && sha256sum --check --status complete) || render "the kept configuration is not whole (sha256sum)"
[ -f "$cache/slurm.conf" ] || render "the kept configuration has no slurm.conf"
copy || render "cannot copy the kept configuration from $cache"
ready
log "reused the configuration kept in $cache: $(cd "$out" && echo *)"
