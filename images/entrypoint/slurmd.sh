#!/bin/bash
# slurmk8s slurmd entrypoint (PID 1 is tini). Contract: images/README.md.
#   SLURMK8S_CONTROLLER   host[:port] of slurmctld (default port 6817); configless
#   SLURMK8S_NODENAME     Slurm node name (default: hostname)
#   SLURMK8S_SLURMD_CONF  optional: passed as `slurmd --conf` (e.g. "CPUs=4 RealMemory=8000")
#   arguments             appended to the slurmd command line (e.g. -vvv)
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh

NODENAME="${SLURMK8S_NODENAME:-$(hostname)}"
log "starting slurmd node '$NODENAME'"
if [ -n "${SLURMK8S_CONTROLLER:-}" ]; then
    parse_controller
elif [ ! -r /etc/slurm/slurm.conf ]; then
    die "set SLURMK8S_CONTROLLER (configless) or mount slurm.conf at /etc/slurm"
fi

start_munge
sync_users

mkdir -p /var/spool/slurmd /run/slurm /var/log/slurm
chmod 0755 /var/spool/slurmd
rm -f /run/slurmd.pid

# Memlock: MPI / RDMA want it unlimited. Best effort: without CAP_SYS_RESOURCE the hard limit
# (set by the runtime) cannot be raised, only the soft one up to it.
if ulimit -l unlimited 2>/dev/null; then
    log "memlock: unlimited"
else
    ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
    log "memlock: cannot raise to unlimited (hard limit $(ulimit -H -l) KiB); continuing"
fi

args=(-D -b -N "$NODENAME")
if [ -n "${SLURMK8S_CONTROLLER:-}" ]; then
    wait_for_controller
    args+=(--conf-server "$CONTROLLER_HOST:$CONTROLLER_PORT")
elif [ -r /etc/slurm/slurm.conf ]; then
    log "SLURMK8S_CONTROLLER unset: using the mounted /etc/slurm/slurm.conf"
else
    die "set SLURMK8S_CONTROLLER (configless) or mount slurm.conf at /etc/slurm"
fi
if [ -n "${SLURMK8S_SLURMD_CONF:-}" ]; then
    args+=(--conf "$SLURMK8S_SLURMD_CONF")
fi

log "exec slurmd ${args[*]} $*"
exec slurmd "${args[@]}" "$@"
