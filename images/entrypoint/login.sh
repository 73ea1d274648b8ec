#!/bin/bash
# slurmk8s login entrypoint (PID 1 is tini): sshd in the foreground + the Slurm clients.
# Contract: images/README.md.
#   /etc/slurmk8s/authorized_keys/<user>   public keys, installed to /etc/ssh/authorized_keys/<user>
#   /etc/slurmk8s/ssh-host-keys/ssh_host_*_key  host keys (generated at start when absent)
#   /etc/slurm/slurm.conf                  client config, if mounted; else
#   SLURMK8S_CONTROLLER                    host[:port]: sackd fetches the config (configless)
#   arguments                              appended to the sshd command line
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh

KEYS_SRC="${SLURMK8S_AUTHORIZED_KEYS_DIR:-$SLURMK8S_DIR/authorized_keys}"
HOSTKEYS_SRC="${SLURMK8S_SSH_HOST_KEYS_DIR:-$SLURMK8S_DIR/ssh-host-keys}"
KEYS_DST=/etc/ssh/authorized_keys
ACTIVITY_DIR="${SLURMK8S_ACTIVITY_DIR:-/run/slurmk8s/activity}"   # mounted only with idle teardown
WAKE_SOCKET="${SLURMK8S_WAKE_SOCKET:-/run/slurmk8s/wake/wake.sock}"  # the wake agent's (idle teardown)
log "starting login node"

start_munge
sync_users
make_homes

# --- authorized keys: root-owned copies, so users cannot add keys themselves ----------------
install -d -o root -g root -m 0755 "$KEYS_DST"
find "$KEYS_DST" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
n=0
if [ -d "$KEYS_SRC" ]; then
    for f in "$KEYS_SRC"/*; do
        [ -f "$f" ] || continue                 # skips Kubernetes' ..data dirs, dangling links
        user="$(basename "$f")"
        case "$user" in .*|*[!a-z0-9_.-]*) log "ssh: skipping key file '$user' (not a user name)"; continue ;; esac
        id "$user" >/dev/null 2>&1 || log "ssh: WARNING: keys for unknown user '$user' installed anyway"
        install -o root -g root -m 0644 "$f" "$KEYS_DST/$user" || die "cannot install keys for $user"
        n=$((n + 1))
    done
fi
log "ssh: installed authorized keys for $n users into $KEYS_DST"
[ "$n" -gt 0 ] || log "ssh: WARNING: no authorized keys under $KEYS_SRC: nobody can log in"

# --- host keys ---------------------------------------------------------------------------------
rm -f /etc/ssh/ssh_host_*
hostkeys=()
if [ -d "$HOSTKEYS_SRC" ]; then
    for f in "$HOSTKEYS_SRC"/ssh_host_*_key; do
        [ -f "$f" ] || continue
        dst="/etc/ssh/$(basename "$f")"
        install -o root -g root -m 0600 "$f" "$dst" || die "cannot install host key $f"
        if [ -f "$f.pub" ]; then
            install -o root -g root -m 0644 "$f.pub" "$dst.pub"
        else
            ssh-keygen -y -f "$dst" >"$dst.pub" || die "host key $f is not a valid private key"
        fi
        hostkeys+=(-h "$dst")
    done
fi
if [ "${#hostkeys[@]}" -gt 0 ]; then
    log "ssh: using $(( ${#hostkeys[@]} / 2 )) host keys from $HOSTKEYS_SRC"
else
    log "ssh: no host keys mounted at $HOSTKEYS_SRC: GENERATING new ones (fingerprints change on every start)"
    ssh-keygen -A >/dev/null || die "ssh-keygen -A failed"
    for f in /etc/ssh/ssh_host_*_key; do hostkeys+=(-h "$f"); done
fi
for f in /etc/ssh/ssh_host_*_key.pub; do log "ssh: host key $(ssh-keygen -l -f "$f")"; done

# --- Slurm client configuration ----------------------------------------------------------------
install -d -m 0755 /run/slurm
if [ -r /etc/slurm/slurm.conf ]; then
    log "slurm: clients use the mounted /etc/slurm/slurm.conf"
elif [ -n "${SLURMK8S_CONTROLLER:-}" ]; then
    parse_controller
    # idle teardown: the controller may be asleep; the wake agent (a sidecar) wakes it. Its socket
    # lives on an emptyDir mounted read-only here; wait until it exists and accepts a connection.
    if [ -d "${WAKE_SOCKET%/*}" ]; then
        for _ in $(seq 1 15); do
            if [ -S "$WAKE_SOCKET" ] && /usr/local/bin/slurmk8s-wake --probe; then
                /usr/local/bin/slurmk8s-wake login-pod-start || log "slurm: wake request failed (see above)"
                break
            fi
            sleep 1
        done
    fi
    wait_for_controller
    log "slurm: starting sackd --conf-server $CONTROLLER_HOST:$CONTROLLER_PORT (configless clients)"
    sackd --conf-server "$CONTROLLER_HOST:$CONTROLLER_PORT" || die "sackd failed to start"
    for _ in $(seq 1 50); do
        [ -r /run/slurm/conf/slurm.conf ] && break
        sleep 0.2
    done
    [ -r /run/slurm/conf/slurm.conf ] || die "sackd did not fetch slurm.conf into /run/slurm/conf within 10s"
    log "slurm: sackd fetched the config into /run/slurm/conf"
else
    log "slurm: WARNING: no /etc/slurm/slurm.conf and no SLURMK8S_CONTROLLER: Slurm commands will not work"
fi

# --- SSH session count for the idle teardown (read by the wake agent) -------------------------
if [ -d "$ACTIVITY_DIR" ]; then
    # users must not write here: a fake count could put the controller to sleep or keep it awake
    chown root:root "$ACTIVITY_DIR" && chmod 0755 "$ACTIVITY_DIR" || die "cannot secure $ACTIVITY_DIR"
    ( ( exec /usr/local/lib/slurmk8s/session-count "$ACTIVITY_DIR/sessions" ) & )
    log "idle teardown: counting SSH sessions into $ACTIVITY_DIR/sessions"
fi

# --- sshd -------------------------------------------------------------------------------------
install -d -m 0755 /run/sshd
rm -f /run/sshd.pid
/usr/sbin/sshd -t "${hostkeys[@]}" || die "sshd configuration test failed"
log "exec sshd -D -e ${hostkeys[*]} $*"
exec /usr/sbin/sshd -D -e "${hostkeys[@]}" "$@"
