#!/bin/bash
# slurmk8s slurmd entrypoint (PID 1 is tini). Contract: images/README.md.
#   SLURMK8S_CONTROLLER   host[:port] of slurmctld (default port 6817); configless
#   SLURMK8S_NODENAME     Slurm node name (default: hostname)
#   SLURMK8S_SLURMD_CONF  optional: passed as `slurmd --conf` (e.g. "CPUs=4 RealMemory=8000")
#   SLURMK8S_JOB_ENV      optional: the pool's job environment ("export NAME=value" lines), written
#                         to /run/slurmk8s/job-env for Slurm's TaskProlog
#   SLURMK8S_MEMLOCK_UNLIMITED  1 (default) / 0: pools[].network.memlock_unlimited (set_memlock, lib.sh)
#   SLURMK8S_GPUS, SLURMK8S_GPU_TYPE  GPU nodes: the node's Gres count and type in slurm.conf;
#                         /run/slurmk8s/node-gres.conf gets the node's gres.conf line from /dev/nvidia<N>
#   SLURMK8S_CONTAINERS   1: pools[].containers (oci.conf runs rootless crun): /run/user/<uid> per user
#   arguments             appended to the slurmd command line (e.g. -vvv)
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh

NODENAME="${SLURMK8S_NODENAME:-$(hostname)}"
log "starting slurmd node '$NODENAME'"

# slurmd runs its HealthCheckProgram before it registers; its slowest part, a 2-rank MPI run (about
# 0.4 s), starts now, beside the rest of this start, and that first check takes its result
# (provisioner/health.py, --mpi-boot). Double fork: re-parented to tini, which reaps it.
if [ -x /usr/local/bin/slurmk8s-healthcheck ] && [ -x /usr/local/lib/slurmk8s/mpi-loopback ]; then
    install -d -m 0755 /run/slurmk8s
    : >/run/slurmk8s/health-boot-mpi.json.pending
    ( ( /usr/local/bin/slurmk8s-healthcheck --mpi-boot >/dev/null 2>&1 || rm -f /run/slurmk8s/health-boot-mpi.json.pending ) & )
fi
if [ -n "${SLURMK8S_CONTROLLER:-}" ]; then
    parse_controller
elif [ ! -r /etc/slurm/slurm.conf ]; then
    die "set SLURMK8S_CONTROLLER (configless) or mount slurm.conf at /etc/slurm"
fi

start_munge
sync_users
write_env_cache /var/spool/slurmctld/env_cache  # slurm.conf's StateSaveLocation (a test keeps them equal)

mkdir -p /var/spool/slurmd /run/slurm /var/log/slurm
chmod 0755 /var/spool/slurmd
rm -f /run/slurmd.pid

# Jobs do not inherit slurmd's environment: the pool's job environment reaches every task through
# Slurm's TaskProlog (/usr/local/lib/slurmk8s/task-prolog), which prints this file.
install -d -m 0755 /run/slurmk8s
printf '%s' "${SLURMK8S_JOB_ENV:-}" >/run/slurmk8s/job-env.new
chmod 0644 /run/slurmk8s/job-env.new
mv -f /run/slurmk8s/job-env.new /run/slurmk8s/job-env
log "job environment: $(grep -c '^export ' /run/slurmk8s/job-env || true) variable(s) for every task"

# The node's gres.conf line, from the GPU device files this pod really has (the rendered gres.conf
# includes the file; it must exist, even empty, on every worker of a cluster with GPUs).
/usr/local/lib/slurmk8s/node-gres "$NODENAME" "${SLURMK8S_GPUS:-0}" "${SLURMK8S_GPU_TYPE:-}" \
    >/run/slurmk8s/node-gres.conf.new || die "cannot write the node's gres.conf line (node-gres failed)"
chmod 0644 /run/slurmk8s/node-gres.conf.new
mv -f /run/slurmk8s/node-gres.conf.new /run/slurmk8s/node-gres.conf
if [ "${SLURMK8S_GPUS:-0}" != 0 ]; then
    log "gres: $(grep -v '^#' /run/slurmk8s/node-gres.conf || echo "no GPU device file (slurm.conf: $SLURMK8S_GPUS)")"
fi

# Container jobs (srun --container): crun's per-user state directories; crun must be in the image.
if [ "${SLURMK8S_CONTAINERS:-0}" = 1 ]; then
    make_runtime_dirs
    if command -v crun >/dev/null 2>&1; then
        log "containers: $(crun --version | head -n 1)"
    else
        log "WARNING: containers enabled but this image has no crun: srun --container will fail here"
    fi
fi

# Locked memory (RDMA): raised to unlimited only when the pool asks (set_memlock in lib.sh).
set_memlock

args=(-D -b -N "$NODENAME")
if [ -n "${SLURMK8S_CONTROLLER:-}" ]; then
    wait_for_controller
    args+=(--conf-server "$CONTROLLER_HOST:$CONTROLLER_PORT")
    # Last before slurmd starts (lib.sh): a pod made ahead of Slurm's resume call waits for it here.
    ask_boot_gate "$CONTROLLER_HOST" 9412 "$NODENAME"  # 9412 = bootgate.DEFAULT_PORT (a test)
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
