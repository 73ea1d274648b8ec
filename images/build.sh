#!/usr/bin/env bash
# Build the slurmk8s images: slurmk8s/slurmd, slurmk8s/login, slurmk8s/slurmctld, slurmk8s/slurmdbd,
# slurmk8s/mariadb, slurmk8s/slurmrestd.
#
#   images/build.sh [--force] [--no-cache] [--list] [--tags] [IMAGE ...]
#
# Steps: ensure a Docker engine (ensure-docker.sh), provide the base image (base/build-base.sh:
# local, pulled, or bootstrapped offline), then build each image from images/Dockerfile with the
# repo root as context. Each image is tagged <prefix>/<name>:<hash> and <prefix>/<name>:dev, where
# <hash> is a content hash of that image's inputs; an image whose hash tag exists is skipped.
#
#   --force     rebuild even if the hash-tagged image exists (docker's layer cache still applies)
#   --no-cache  rebuild every layer (implies --force; only the first docker build of the run gets
#               --no-cache, the later ones reuse the fresh layers it made)
#   --list      print each image's hash tag, whether it is built and its size; build nothing
#   --tags      print "name=image:hash" lines (machine-readable); build nothing
#
# Env: SLURMK8S_IMAGE_PREFIX (default slurmk8s), SLURMK8S_BASE_IMAGE (default debian:trixie-slim),
#      SLURMK8S_WITH_ROCM=1 (keep Debian's ROCm runtime for UCX; bigger images).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PREFIX="${SLURMK8S_IMAGE_PREFIX:-slurmk8s}"
BASE_IMAGE="${SLURMK8S_BASE_IMAGE:-debian:trixie-slim}"
WITH_ROCM="${SLURMK8S_WITH_ROCM:-0}"
ALL_IMAGES=(slurmd login slurmctld slurmdbd mariadb slurmrestd)

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

FORCE=0; NO_CACHE=(); MODE=build; WANT=()
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1 ;;
        --no-cache) FORCE=1; NO_CACHE=(--no-cache) ;;
        --list) MODE=list ;;
        --tags) MODE=tags ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) WANT+=("$1") ;;
    esac
    shift
done
[ "${#WANT[@]}" -gt 0 ] || WANT=("${ALL_IMAGES[@]}")
for w in "${WANT[@]}"; do
    case " ${ALL_IMAGES[*]} " in *" $w "*) ;; *) die "unknown image '$w' (known: ${ALL_IMAGES[*]})" ;; esac
done

# Inputs of each image, relative to the repo root (files or directories).
inputs() {
    local common=(images/Dockerfile images/common images/entrypoint/lib.sh images/entrypoint/identify.sh .dockerignore)
    case "$1" in
        slurmd) printf '%s\n' "${common[@]}" images/entrypoint/slurmd.sh images/health images/slurmd images/userenv provisioner/health.py ;;
        login) printf '%s\n' "${common[@]}" images/entrypoint/login.sh images/login images/userenv ;;
        slurmctld) printf '%s\n' "${common[@]}" images/entrypoint/slurmctld.sh images/entrypoint/config-init.sh images/entrypoint/jwt.sh pyproject.toml provisioner ;;
        slurmdbd) printf '%s\n' "${common[@]}" images/entrypoint/slurmdbd.sh images/entrypoint/jwt.sh ;;
        slurmrestd) printf '%s\n' "${common[@]}" images/entrypoint/slurmrestd.sh ;;
        mariadb) printf '%s\n' "${common[@]}" images/entrypoint/mariadb.sh ;;
    esac
}

# Content hash: path, mode (executable bit) and content of every input file, plus build args.
image_hash() {
    local name="$1"
    (
        cd "$ROOT"
        printf 'target=%s base=%s with_rocm=%s\n' "$name" "$BASE_IMAGE" "$WITH_ROCM"
        inputs "$name" | while read -r p; do
            [ -e "$p" ] || die "input $p of $name is missing"
            find "$p" -type f ! -path '*/__pycache__/*' ! -name '*.pyc'
        done | LC_ALL=C sort | while read -r f; do
            printf '%s %s %s\n' "$f" "$( [ -x "$f" ] && echo x || echo -)" "$(sha256sum <"$f" | cut -c1-64)"
        done
    ) | sha256sum | cut -c1-12
}

image_size() { docker image inspect -f '{{.Size}}' "$1" 2>/dev/null | awk '{printf "%.0f MB", $1/1e6}'; }

if [ "$MODE" = tags ]; then
    for name in "${WANT[@]}"; do echo "$name=$PREFIX/$name:$(image_hash "$name")"; done
    exit 0
fi

if [ "$MODE" = list ]; then
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || die "no Docker engine answers (run images/ensure-docker.sh)"
    printf '%-12s %-34s %-8s %s\n' IMAGE TAG BUILT SIZE
    for name in "${WANT[@]}"; do
        tag="$PREFIX/$name:$(image_hash "$name")"
        if docker image inspect "$tag" >/dev/null 2>&1; then
            dev="$(docker image inspect -f '{{.Id}}' "$PREFIX/$name:dev" 2>/dev/null || true)"
            id="$(docker image inspect -f '{{.Id}}' "$tag")"
            printf '%-12s %-34s %-8s %s%s\n' "$name" "$tag" yes "$(image_size "$tag")" \
                "$([ "$dev" = "$id" ] && echo ' (= :dev)' || echo ' (:dev differs)')"
        else
            printf '%-12s %-34s %-8s %s\n' "$name" "$tag" no -
        fi
    done
    exit 0
fi

T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

log "step 1/3: Docker engine"
"$HERE/ensure-docker.sh"

log "step 2/3: base image $BASE_IMAGE"
t=$(date +%s)
SLURMK8S_BASE_IMAGE="$BASE_IMAGE" "$HERE/base/build-base.sh"
log "base ready ($(elapsed "$t"))"

# BuildKit when the CLI has buildx; otherwise the classic builder (Debian's docker.io has no
# buildx, and a newer CLI without it refuses DOCKER_BUILDKIT=1).
BUILD_ENV=(); PROGRESS=()
if docker buildx version >/dev/null 2>&1; then
    PROGRESS=(--progress=plain)
else
    BUILD_ENV=(DOCKER_BUILDKIT=0)
fi

# A TLS-intercepting proxy in front of PyPI: hand the host's extra CAs (Debian's place for
# site CAs, or SLURMK8S_EXTRA_CA_FILE) to the venv builder stage; no final image keeps them.
CA_ARGS=()
ca_files=()
if [ -n "${SLURMK8S_EXTRA_CA_FILE:-}" ]; then
    [ -r "$SLURMK8S_EXTRA_CA_FILE" ] || die "SLURMK8S_EXTRA_CA_FILE=$SLURMK8S_EXTRA_CA_FILE is not readable"
    ca_files=("$SLURMK8S_EXTRA_CA_FILE")
else
    for f in /usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt; do
        [ -r "$f" ] && ca_files+=("$f")
    done
fi
if [ "${#ca_files[@]}" -gt 0 ]; then
    log "passing ${#ca_files[@]} extra CA certificate file(s) to the venv build stage: ${ca_files[*]}"
    CA_ARGS=(--build-arg "EXTRA_CA_CERTS=$(cat "${ca_files[@]}")")
fi

log "step 3/3: images ${WANT[*]}"
declare -A RESULT TAG
i=0
for name in "${WANT[@]}"; do
    i=$((i + 1))
    hash="$(image_hash "$name")"
    tag="$PREFIX/$name:$hash"
    TAG[$name]="$tag"
    if [ "$FORCE" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
        docker tag "$tag" "$PREFIX/$name:dev"
        log "($i/${#WANT[@]}) $name: $tag already built: skipped"
        RESULT[$name]="skipped"
        continue
    fi
    log "($i/${#WANT[@]}) $name: building $tag"
    t=$(date +%s)
    env "${BUILD_ENV[@]}" docker build "${PROGRESS[@]}" "${NO_CACHE[@]}" \
        -f "$ROOT/images/Dockerfile" --target "$name" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "WITH_ROCM=$WITH_ROCM" "${CA_ARGS[@]}" \
        --label "org.slurmk8s.image=$name" --label "org.slurmk8s.inputs-hash=$hash" \
        -t "$tag" -t "$PREFIX/$name:dev" "$ROOT" \
        || die "building $name failed (see the docker build output above)"
    # The classic builder re-runs every earlier stage of the Dockerfile: with --no-cache that would
    # rebuild common (and the cheaper targets) once per image. The first build already made them
    # fresh, so later builds of this run reuse its layers.
    NO_CACHE=()
    RESULT[$name]="built in $(elapsed "$t")"
    log "($i/${#WANT[@]}) $name: built $tag in $(elapsed "$t")"
done

log "done in $(elapsed "$T0"):"
for name in "${WANT[@]}"; do
    printf '[images]   %-34s %-8s %s (also :dev)\n' "${TAG[$name]}" "$(image_size "${TAG[$name]}")" "${RESULT[$name]}" >&2
    if [ "$(image_hash "$name")" != "${TAG[$name]##*:}" ]; then
        log "WARNING: inputs of $name changed during the build: run images/build.sh again"
    fi
done
