#!/usr/bin/env bash
# Provide the base image the Dockerfiles build FROM (default debian:trixie-slim).
#
#   - present locally            -> nothing to do
#   - `docker pull` succeeds     -> use the registry's image (the Dockerfiles build unchanged)
#   - otherwise (offline)        -> debootstrap --variant=minbase from the Debian mirror,
#                                   trim it like the official -slim image, `docker import` it.
#
# Env:
#   SLURMK8S_BASE_IMAGE   tag to provide                 (default debian:trixie-slim)
#   SLURMK8S_BASE_SUITE   Debian suite to bootstrap       (default trixie)
#   SLURMK8S_DEBIAN_MIRROR                                (default http://deb.debian.org/debian)
#   SLURMK8S_DEBIAN_SECURITY_MIRROR                       (default http://deb.debian.org/debian-security)
#   SLURMK8S_BASE_FORCE=1 rebuild from debootstrap even if the image exists
#   SLURMK8S_BASE_NO_PULL=1 do not try the registry
set -euo pipefail

log() { printf '[build-base] %s\n' "$*" >&2; }
die() { printf '[build-base] ERROR: %s\n' "$*" >&2; exit 1; }

IMAGE="${SLURMK8S_BASE_IMAGE:-debian:trixie-slim}"
SUITE="${SLURMK8S_BASE_SUITE:-trixie}"
MIRROR="${SLURMK8S_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SEC_MIRROR="${SLURMK8S_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
FORCE="${SLURMK8S_BASE_FORCE:-0}"
NO_PULL="${SLURMK8S_BASE_NO_PULL:-0}"

command -v docker >/dev/null 2>&1 || die "docker CLI not found (run images/ensure-docker.sh)"
docker info >/dev/null 2>&1 || die "Docker engine not answering (run images/ensure-docker.sh)"

if [ "$FORCE" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE present locally"
    exit 0
fi

if [ "$FORCE" != 1 ] && [ "$NO_PULL" != 1 ]; then
    log "trying: docker pull $IMAGE"
    if timeout 120 docker pull "$IMAGE" >&2; then
        log "pulled $IMAGE from the registry"
        exit 0
    fi
    log "cannot pull $IMAGE: building it offline with debootstrap from $MIRROR"
fi

[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2 \
        || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2; } \
        || die "could not install debootstrap"
fi
[ -e "/usr/share/debootstrap/scripts/$SUITE" ] \
    || die "this debootstrap ($(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)) does not know suite '$SUITE'"

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
KEYRING_ARGS=()
if [ -r "/usr/share/keyrings/debian-archive-$SUITE-stable.gpg" ] || [ -r "/usr/share/keyrings/debian-archive-$SUITE-automatic.gpg" ]; then
    KEYRING_ARGS=(--keyring="$KEYRING")
else
    log "WARNING: no archive key for $SUITE in $KEYRING: upgrade debian-archive-keyring; debootstrap will likely refuse"
fi

WORK="$(mktemp -d /var/tmp/slurmk8s-base.XXXXXX)"
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT
ROOTFS="$WORK/rootfs"

t0=$(date +%s)
log "debootstrap --variant=minbase $SUITE -> $ROOTFS"
debootstrap --variant=minbase "${KEYRING_ARGS[@]}" "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 40 "$WORK/debootstrap.log" >&2
    [ -f "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 40 "$ROOTFS/debootstrap/debootstrap.log" >&2
    die "debootstrap failed"
}
log "debootstrap done in $(( $(date +%s) - t0 ))s"

# --- trim and configure like the official -slim image -------------------------------------
# apt sources in deb822 form: main, updates, security.
rm -f "$ROOTFS/etc/apt/sources.list"
mkdir -p "$ROOTFS/etc/apt/sources.list.d"
cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SEC_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

# Keep later `apt-get install`s in derived images slim: no docs, man pages, locales.
mkdir -p "$ROOTFS/etc/dpkg/dpkg.cfg.d" "$ROOTFS/etc/apt/apt.conf.d"
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages" <<'EOF'
Acquire::Languages "none";
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-gzip-indexes" <<'EOF'
Acquire::GzipIndexes "true";
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-autoremove-suggests" <<'EOF'
Apt::AutoRemove::SuggestsImportant "false";
EOF

# Drop what the -slim image drops (docs, man pages, locales, caches, logs, host-specific ids).
find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$ROOTFS/usr/share/man/"* "$ROOTFS/usr/share/info/"* "$ROOTFS/usr/share/groff/"* \
       "$ROOTFS/usr/share/lintian/"* "$ROOTFS/usr/share/linda/"*
find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
rm -rf "$ROOTFS/var/lib/apt/lists/"* "$ROOTFS/var/cache/apt/"*.bin "$ROOTFS/var/cache/apt/archives/"*.deb \
       "$ROOTFS/var/cache/ldconfig/aux-cache" "$ROOTFS/debootstrap" "$ROOTFS/tmp/"* "$ROOTFS/var/tmp/"*
find "$ROOTFS/var/log" -type f -delete
: >"$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/var/lib/dbus/machine-id"
# The host's resolv.conf/hostname leak in via debootstrap; Docker provides its own at run time.
: >"$ROOTFS/etc/resolv.conf"
echo localhost >"$ROOTFS/etc/hostname"

log "importing rootfs as $IMAGE ($(du -sh --apparent-size "$ROOTFS" | cut -f1))"
tar --numeric-owner --xattrs -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "slurmk8s offline base: debootstrap --variant=minbase $SUITE from $MIRROR" \
    - "$IMAGE" >&2 || die "docker import failed"

docker run --rm "$IMAGE" sh -c '. /etc/os-release && echo "$PRETTY_NAME"' >&2 \
    || die "imported $IMAGE does not run"
log "built $IMAGE offline in $(( $(date +%s) - t0 ))s, size $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
