#!/bin/bash
# slurmk8s slurmctld entrypoint (PID 1 is tini). Contract: images/README.md.
#   /etc/slurm/               rendered config dir (slurm.conf, topology.conf, ...), mounted; or made
#                             here by $SLURMK8S_CONFIG_INIT (slurmk8s-config-init) when that is set
#   /var/spool/slurmctld      StateSaveLocation (a volume); made owned by SlurmUser
#   /etc/slurmk8s/jwt/jwt_hs256.key  the JWT key, when slurm.conf sets AuthAltParameters=jwt_key=
#   /etc/slurmk8s/{spec,users,secret,jwt}/, elastic.env  mounted; or read from the API here when
#                             $SLURMK8S_POD_FILES is set (slurmk8s-pod-files)
#   arguments                 appended to the slurmctld command line (e.g. -vvv)
# slurmctld runs in the foreground as SlurmUser (which must be set and must not be root).
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh
. /usr/local/lib/slurmk8s/jwt.sh

CONF_DIR="${SLURMK8S_SLURM_CONF_DIR:-/etc/slurm}"
CONF="$CONF_DIR/slurm.conf"
log "starting slurmctld"

# SLURMK8S_POD_FILES (set by the pod spec): the spec, the users and the keys are read from the API
# into $SLURMK8S_DIR (an in-memory emptyDir), once per pod, with the pod's ServiceAccount token
# (slurmk8s-pod-files, provisioner/podfiles.py). Mounted as Secret and ConfigMap volumes, the kubelet
# would fetch them as the node, which the node authorizer refuses for about a second when it asks
# before the authorizer has seen the new pod. Without it (Docker, tests) the files are mounted.
if [ -n "${SLURMK8S_POD_FILES:-}" ] && [ ! -e "$SLURMK8S_DIR/.fetched" ]; then
    /opt/slurmk8s/bin/slurmk8s-pod-files --out "$SLURMK8S_DIR" \
        || die "cannot read the pod's files from the Kubernetes API into $SLURMK8S_DIR (why: above)"
fi

# SLURMK8S_CONFIG_INIT (set by the pod spec): the Slurm configuration directory is an emptyDir of the
# pod, filled here once per pod before slurmctld starts (images/entrypoint/config-init.sh: the copy
# kept on the state volume, or a render from the spec and the Kubernetes nodes). A restarted
# container finds it made (DIR/.ready), maybe kept current since by the reconcile loop, and leaves it.
# Run as slurm, the user of the reconcile loop that rewrites these files. (Not an init container:
# the kubelet sees an init container's end at its next relist of the containers, each second, and
# only then starts the pod's containers.)
if [ -n "${SLURMK8S_CONFIG_INIT:-}" ] && [ ! -e "$CONF_DIR/.ready" ]; then
    setpriv --reuid slurm --regid slurm --init-groups -- "$SLURMK8S_CONFIG_INIT" --out "$CONF_DIR" \
        || die "$SLURMK8S_CONFIG_INIT could not make the Slurm configuration in $CONF_DIR (why: above)"
fi

[ -e "$CONF" ] || die "$CONF not found: mount the rendered config directory at $CONF_DIR"

SLURM_USER="$(slurm_conf_get "$CONF" SlurmUser)"
[ -n "$SLURM_USER" ] || die "$CONF does not set SlurmUser (must be SlurmUser=slurm; slurmctld must not run as root)"
[ "$SLURM_USER" != root ] || die "$CONF sets SlurmUser=root: refusing, use SlurmUser=slurm"

start_munge
sync_users
id "$SLURM_USER" >/dev/null 2>&1 || die "SlurmUser '$SLURM_USER' does not exist in this container"

# slurm.conf (and its includes) must be readable by SlurmUser. Mounted ConfigMaps/Secrets can
# come with a restrictive mode or owner: then serve a readable copy from /run/slurmk8s/conf.
extra=()
if ! as_user "$SLURM_USER" test -r "$CONF"; then
    copy=/run/slurmk8s/conf
    log "config: $CONF not readable by $SLURM_USER: copying $CONF_DIR to $copy"
    rm -rf "$copy"; mkdir -p "$copy"
    cp -rL "$CONF_DIR"/. "$copy"/ || die "cannot copy $CONF_DIR to $copy"
    rm -rf "$copy"/..?* 2>/dev/null || true      # Kubernetes ..data / ..timestamp entries
    chown -R "root:$SLURM_USER" "$copy"
    find "$copy" -type d -exec chmod 0750 {} +
    find "$copy" -type f -exec chmod 0640 {} +
    CONF="$copy/slurm.conf"
    extra=(-f "$CONF")
    export SLURM_CONF="$CONF"
fi
as_user "$SLURM_USER" test -r "$CONF" || die "$CONF still not readable by $SLURM_USER"
log "config: $CONF (readable by $SLURM_USER)"

install_jwt_key "$CONF" "$SLURM_USER"

STATE_DIR="$(slurm_conf_get "$CONF" StateSaveLocation)"
STATE_DIR="${STATE_DIR:-/var/spool/slurmctld}"
own_dir "$STATE_DIR" "$SLURM_USER" 0750
log "state: $STATE_DIR owned by $SLURM_USER"

own_dir /var/log/slurm "$SLURM_USER" 0755
# the resume / suspend / prolog programs (run as SlurmUser) log here: Slurm discards their output
own_dir /var/log/slurmk8s "$SLURM_USER" 0755
own_dir /run/slurm "$SLURM_USER" 0755
# gres.conf includes /run/slurmk8s/node-gres.conf, a file of each host: a worker's entrypoint writes
# its node's line there; slurmctld's is the rendered gres-slurmctld.conf (the GPU nodes with their
# counts), linked so that it follows the config directory, which the reconcile loop rewrites when
# GPU nodes come or go (gres.conf and gres-slurmctld.conf are rendered together: without GPU nodes
# neither exists and the link is never read).
install -d -m 0755 /run/slurmk8s
rm -f /run/slurmk8s/node-gres.conf
ln -s "$(dirname "$CONF")/gres-slurmctld.conf" /run/slurmk8s/node-gres.conf
log "gres: /run/slurmk8s/node-gres.conf -> $(dirname "$CONF")/gres-slurmctld.conf"
for key in SlurmctldLogFile SlurmSchedLogFile; do
    f="$(slurm_conf_get "$CONF" "$key")"
    [ -z "$f" ] || own_dir "$(dirname "$f")" "$SLURM_USER" 0755
done
# slurmctld runs as SlurmUser from the start, so it cannot create its PID file in root-owned
# /run: pre-create it owned by SlurmUser. Content "0" = no old daemon (an empty file would be
# reported as a corrupt pidfile).
pidfile="$(slurm_conf_get "$CONF" SlurmctldPidFile)"
pidfile="${pidfile:-/run/slurmctld.pid}"
mkdir -p "$(dirname "$pidfile")"
rm -f "$pidfile"
echo 0 >"$pidfile"
chown "$SLURM_USER:$SLURM_USER" "$pidfile"

case "$(slurm_conf_get "$CONF" SlurmctldParameters)" in
    *enable_configless*) ;;
    *) log "WARNING: SlurmctldParameters lacks enable_configless: slurmd --conf-server will fail" ;;
esac

# Drain the Slurm nodes whose Kubernetes node is cordoned or NotReady (inventory.json) once
# slurmctld answers; runs in the background, reaped by tini.
if [ -x /opt/slurmk8s/bin/slurmk8s-sync-nodes ] && { [ -r "$CONF_DIR/inventory.json" ] || [ -r "$CONF_DIR/inventory.json.gz" ]; }; then
    # Double fork: the job's parent exits at once, so it is re-parented to tini (PID 1), which
    # reaps it; a plain `( ... ) &` would stay a child of the exec'd slurmctld (a zombie).
    ( ( SLURMK8S_INVENTORY="$CONF_DIR/inventory.json" \
        setpriv --reuid "$SLURM_USER" --regid "$SLURM_USER" --init-groups -- \
        /opt/slurmk8s/bin/slurmk8s-sync-nodes --wait 120 2>&1 | sed -u 's/^/[sync-nodes] /' ) & )
fi

# Accounting through slurmdbd: on its very first start slurmctld needs slurmdbd (it exits with "we
# have no TRES from it ... database is down and you don't have any state files"). Later starts
# run from the state files and queue job records while slurmdbd is away, so wait only while the
# state directory has none (bounded by SLURMK8S_DBD_WAIT, default 300 s).
case "$(slurm_conf_get "$CONF" AccountingStorageType)" in
    *slurmdbd*)
        if [ ! -e "$STATE_DIR/last_tres" ] && [ ! -e "$STATE_DIR/assoc_mgr_state" ]; then
            dbd_host="$(slurm_conf_get "$CONF" AccountingStorageHost)"
            dbd_port="$(slurm_conf_get "$CONF" AccountingStoragePort)"
            dbd_port="${dbd_port:-6819}"
            limit="${SLURMK8S_DBD_WAIT:-300}"
            start="$(date +%s)"
            log "accounting: first start (no state files): waiting for slurmdbd at $dbd_host:$dbd_port (up to ${limit}s)"
            until timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$dbd_host" "$dbd_port" 2>/dev/null; do
                if [ $(( $(date +%s) - start )) -ge "$limit" ]; then
                    log "accounting: slurmdbd not reachable after ${limit}s: starting anyway"
                    break
                fi
                sleep 1
            done
            log "accounting: slurmdbd answers after $(( $(date +%s) - start ))s"
        fi
        ;;
esac

log "exec (as $SLURM_USER) slurmctld -D ${extra[*]} $*"
exec setpriv --reuid "$SLURM_USER" --regid "$SLURM_USER" --init-groups -- \
    slurmctld -D "${extra[@]}" "$@"
