# shellcheck shell=bash
# The JWT key (spec rest.enabled), for the slurmctld and slurmdbd entrypoints (sourced after lib.sh;
# only those two images have it: no other pod gets the key). Contract: images/README.md.

# install_jwt_key CONF USER: when CONF (slurm.conf or slurmdbd.conf) sets
# AuthAltParameters=jwt_key=PATH, copy the mounted key ($SLURMK8S_DIR/jwt/jwt_hs256.key, or
# SLURMK8S_JWT_KEY) to PATH, owned by USER (SlurmUser), mode 0400, its directory 0700. Without
# jwt_key= it does nothing. Never prints the key.
install_jwt_key() {
    local conf="$1" user="$2" src="${SLURMK8S_JWT_KEY:-$SLURMK8S_DIR/jwt/jwt_hs256.key}" dst
    dst="$(slurm_conf_get "$conf" AuthAltParameters | tr ',' '\n' | sed -n 's/^jwt_key=//p' | head -n 1)"
    [ -n "$dst" ] || return 0
    [ -e "$src" ] || die "$conf sets AuthAltParameters=jwt_key=$dst but no JWT key is mounted at $src: mount the cluster's Secret slurm-jwt (key jwt_hs256.key) at $(dirname "$src")"
    [ -r "$src" ] || die "the JWT key at $src is not readable by root"
    [ -s "$src" ] || die "the JWT key at $src is empty"
    install -d -o "$user" -g "$user" -m 0700 "$(dirname "$dst")" || die "cannot create $(dirname "$dst")"
    # `install` reads through symlinks (Kubernetes mounts Secret files as symlinks)
    install -o "$user" -g "$user" -m 0400 "$src" "$dst" || die "cannot copy $src to $dst"
    log "jwt: key installed at $dst ($user, 0400)"
}
