#!/bin/bash
# slurmk8s slurmrestd entrypoint (PID 1 is tini). Contract: images/README.md.
#   /etc/slurm/slurm.conf     slurmrestd's client slurm.conf (mounted; needs AuthAltTypes=auth/jwt)
#   SLURM_JWT=daemon          talk to slurmctld / slurmdbd with the users' JWTs only (no munge)
#   SLURMRESTD_SECURITY       default disable_unshare_sysv,disable_unshare_files (seccomp refuses unshare)
#   arguments                 slurmrestd's (default: -a rest_auth/jwt 0.0.0.0:6820)
# Runs as the unprivileged user the pod names (the image's slurmrestd, 6820): slurmrestd refuses
# root and SlurmUser. Holds no key: every request brings its user's token.
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh

CONF="${SLURM_CONF:-/etc/slurm/slurm.conf}"
log "starting slurmrestd as $(id -un 2>/dev/null || id -u)"
[ "$(id -u)" != 0 ] || die "running as root: slurmrestd refuses it; run the container as the slurmrestd user (runAsUser: 6820)"
[ "$(id -u)" != "$(id -u slurm)" ] || die "running as SlurmUser: slurmrestd refuses it; run the container as the slurmrestd user (runAsUser: 6820)"
[ -r "$CONF" ] || die "$CONF not found or not readable: mount the cluster's ConfigMap slurmrestd-config at $(dirname "$CONF")"
case "$(slurm_conf_get "$CONF" AuthAltTypes)" in
    *auth/jwt*) ;;
    *) die "$CONF lacks AuthAltTypes=auth/jwt: slurmrestd with rest_auth/jwt cannot pass tokens on" ;;
esac
export SLURM_JWT="${SLURM_JWT:-daemon}"
# slurmrestd unshares its System V IPC and file table at start; the RuntimeDefault seccomp profile
# refuses unshare(2) without CAP_SYS_ADMIN ("fatal: Unable to unshare System V namespace"): skip both
export SLURMRESTD_SECURITY="${SLURMRESTD_SECURITY:-disable_unshare_sysv,disable_unshare_files}"
[ "$#" -gt 0 ] || set -- -a rest_auth/jwt 0.0.0.0:6820
log "exec slurmrestd $*"
exec slurmrestd "$@"
