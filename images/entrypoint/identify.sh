#!/bin/bash
# slurmk8s-identify: say which slurmk8s image this is, and whether it still has what its role needs.
#
# `slurmk8s up` runs every pool image (and images.login) once in a short-lived pod, the way the
# worker (login) pod runs it: the image's own ENTRYPOINT and CMD, plus SLURMK8S_IDENTIFY=1. The
# entrypoints' shared lib.sh then execs this script before doing anything else (no munge key, no
# controller needed); provisioner/deploy/imagecheck.py reads its lines. An image that is not a
# slurmk8s image does not print them, and is refused before anything is applied.
#
# Output: `slurmk8s-identify: KEY=VALUE` lines on stdout, ending with `slurmk8s-identify: end`:
#   image      the image's role (SLURMK8S_ROLE: slurmd, login, slurmctld, ...)
#   interface  the version of the contract between the provisioner and the entrypoints
#              (images/README.md); the provisioner refuses an image that speaks another one
#   version    the slurmk8s version the image was built from
#   slurm      the Slurm version of the role's daemon or clients
#   args       arguments the container was given (the image's CMD): the entrypoint appends them
#              to slurmd's / sshd's command line, so a derived image must not set CMD
#   missing    what the role needs and the image no longer has (files, the slurm user's id)
# Exit status 0 (what it found is for the caller to judge).
set -uo pipefail

INTERFACE=4   # keep in step with provisioner/names.py IMAGE_INTERFACE
ROLE="${SLURMK8S_ROLE:-}"
VERSION="$(sed -n 's/^version=//p' /usr/local/share/slurmk8s/identity 2>/dev/null || true)"

say() { printf 'slurmk8s-identify: %s=%s\n' "$1" "$2"; }

missing=()
need() { local p; for p in "$@"; do [ -e "$p" ] || missing+=("$p"); done; }
need /usr/bin/tini /usr/local/bin/slurmk8s-entrypoint /usr/local/lib/slurmk8s/lib.sh /usr/sbin/munged \
    /usr/bin/setpriv
[ "$(id -u slurm 2>/dev/null)" = 64030 ] || missing+=("user slurm with uid 64030")

# Slurm's version: the daemon's own answer where it gives one without a config, else the package's
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null | sed 's/-[^-]*$//'; }
slurm=""
case "$ROLE" in
    slurmd)
        need /usr/sbin/slurmd /usr/bin/python3 /usr/local/bin/slurmk8s-healthcheck \
            /usr/local/lib/slurmk8s/health.py /usr/local/lib/slurmk8s/mpi-loopback \
            /usr/local/lib/slurmk8s/task-prolog /usr/local/lib/slurmk8s/node-gres /usr/local/lib/slurmk8s/epilog
        slurm="$(/usr/sbin/slurmd -V 2>/dev/null | awk '{print $2}')" ;;
    login)
        need /usr/sbin/sshd /usr/sbin/sackd /usr/bin/python3 /usr/local/lib/slurmk8s/slurm-command \
            /usr/local/lib/slurmk8s/slurmk8s-wake /usr/local/bin/sbatch /etc/ssh/sshd_config
        slurm="$(pkg_version slurm-client)" ;;
    slurmctld|slurmdbd|slurmrestd) slurm="$(pkg_version "$ROLE")" ;;
esac

say image "$ROLE"
say interface "$INTERFACE"
say version "$VERSION"
say slurm "$slurm"
say args "$*"
say missing "$(IFS=,; printf '%s' "${missing[*]}")"
echo "slurmk8s-identify: end"
