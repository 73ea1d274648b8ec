#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
#   1. `docker info` already works            -> nothing to do.
#   2. dockerd is not installed               -> apt-get install Debian's docker.io (needs root).
#   3. dockerd is installed but not answering -> start it in the background, log to
#      /var/log/dockerd.log (override: SLURMK8S_DOCKERD_LOG), wait until `docker info` works
#      (bounded: SLURMK8S_DOCKERD_WAIT seconds, default 60).
#
# Idempotent and safe to run concurrently (serialised with a lock file). Exits non-zero with a
# message saying what went wrong.
set -euo pipefail

log() { printf '[ensure-docker] %s\n' "$*" >&2; }
die() { printf '[ensure-docker] ERROR: %s\n' "$*" >&2; exit 1; }

DOCKERD_LOG="${SLURMK8S_DOCKERD_LOG:-/var/log/dockerd.log}"
WAIT_S="${SLURMK8S_DOCKERD_WAIT:-60}"
LOCK="${SLURMK8S_DOCKERD_LOCK:-/tmp/slurmk8s-ensure-docker.lock}"

engine_answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
    log "Docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    exit 0
fi

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
    else die "need root to run: $* (no sudo available)"
    fi
}

# Serialise installs and starts between concurrent callers.
exec 9>"$LOCK" || die "cannot open lock file $LOCK"
if command -v flock >/dev/null 2>&1; then
    flock -w 600 9 || die "timed out waiting for lock $LOCK (another ensure-docker.sh running?)"
fi

# Someone else may have finished the job while we waited for the lock.
if command -v docker >/dev/null 2>&1 && engine_answers; then
    log "Docker engine answers (started by a concurrent caller)"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "dockerd missing and no apt-get: install Docker by hand"
    log "dockerd not installed: apt-get install docker.io"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q || die "apt-get update failed (is the Debian mirror reachable?)"
    as_root apt-get install -y -q --no-install-recommends docker.io iptables ca-certificates \
        || die "apt-get install docker.io failed"
    command -v dockerd >/dev/null 2>&1 || die "docker.io installed but dockerd still not on PATH"
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is running (pid $(pgrep -x dockerd | tr '\n' ' ')) but not answering yet: waiting"
else
    log "starting dockerd in the background (log: $DOCKERD_LOG)"
    as_root mkdir -p "$(dirname "$DOCKERD_LOG")"
    # setsid + nohup: dockerd must survive the shell (and CI step) that started it.
    as_root sh -c "setsid nohup dockerd >>'$DOCKERD_LOG' 2>&1 </dev/null &" \
        || die "could not start dockerd"
fi

deadline=$(( $(date +%s) + WAIT_S ))
until engine_answers; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        log "last lines of $DOCKERD_LOG:"
        tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
        die "dockerd did not answer within ${WAIT_S}s (see $DOCKERD_LOG)"
    fi
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        log "last lines of $DOCKERD_LOG:"
        tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
        die "dockerd exited during start-up (see $DOCKERD_LOG)"
    fi
    sleep 1
done
log "Docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
