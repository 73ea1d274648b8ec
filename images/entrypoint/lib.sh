# shellcheck shell=bash
# Shared by the slurmk8s entrypoints (sourced). The contract these functions implement is
# documented in images/README.md; keep the two in step.

SLURMK8S_ROLE="${SLURMK8S_ROLE:-container}"
SLURMK8S_DIR="${SLURMK8S_DIR:-/etc/slurmk8s}"
SLURMK8S_MUNGE_KEY="${SLURMK8S_MUNGE_KEY:-$SLURMK8S_DIR/secret/munge.key}"
SLURMK8S_USERS_DIR="${SLURMK8S_USERS_DIR:-$SLURMK8S_DIR/users}"

# `slurmk8s up` checks pool (and login) images by running them with SLURMK8S_IDENTIFY=1: answer
# before anything else (sourced, so "$@" is the entrypoint's arguments, the image's CMD).
if [ "${SLURMK8S_IDENTIFY:-}" = 1 ]; then
    exec /usr/local/sbin/slurmk8s-identify "$@"
fi

log() { printf '%s [slurmk8s-%s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SLURMK8S_ROLE" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

# Run a command as another user without a login shell or PAM (util-linux setpriv).
as_user() {
    local user="$1"; shift
    setpriv --reuid "$user" --regid "$user" --init-groups -- "$@"
}

# --- locked memory ----------------------------------------------------------------------------
# SLURMK8S_MEMLOCK_UNLIMITED (pools[].network.memlock_unlimited; unset = 1, as before the setting
# reached the pod): 1 raises the memlock limit to unlimited (RDMA: NCCL, UCX, MPI register memory);
# slurmd's jobs keep it (PropagateResourceLimitsExcept=MEMLOCK). Without CAP_SYS_RESOURCE, which
# slurmk8s does not grant (Pod Security baseline refuses it), only the soft limit can go up, to the
# hard limit the container runtime sets: when that is below unlimited this warns and carries on
# (the node still runs jobs that do not register memory). 0 leaves the runtime's limits as they are.
set_memlock() {
    local want="${SLURMK8S_MEMLOCK_UNLIMITED:-1}" hard
    case "$want" in
        0) log "memlock: left at the runtime's limits (soft $(ulimit -S -l), hard $(ulimit -H -l) KiB):" \
               "pools[].network.memlock_unlimited is false"
           return 0 ;;
        1) ;;
        *) die "SLURMK8S_MEMLOCK_UNLIMITED must be 1 or 0, not '$want'" ;;
    esac
    if ulimit -l unlimited 2>/dev/null; then
        log "memlock: unlimited"
        return 0
    fi
    hard="$(ulimit -H -l)"
    ulimit -S -l "$hard" 2>/dev/null || true
    log "WARNING: memlock: pools[].network.memlock_unlimited asks for unlimited locked memory, but the" \
        "container's hard limit is $hard KiB and cannot be raised without CAP_SYS_RESOURCE (not granted);" \
        "the soft limit is now $hard KiB. RDMA memory registration (NCCL/UCX/MPI over InfiniBand, RoCE," \
        "EFA) may fail: give the node's container runtime an unlimited memlock limit (e.g. containerd's" \
        "LimitMEMLOCK=infinity), or set memlock_unlimited: false for this pool"
}

# --- munge ----------------------------------------------------------------------------------
# Copy the mounted key to /etc/munge/munge.key (munge:munge 0400) and start munged as munge.
start_munge() {
    local src="$SLURMK8S_MUNGE_KEY" i
    [ -e "$src" ] || die "munge key not found at $src: mount the cluster's auth Secret (key 'munge.key') at $(dirname "$src")"
    [ -r "$src" ] || die "munge key at $src is not readable by root"
    [ -s "$src" ] || die "munge key at $src is empty"
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    # `install` reads through symlinks (Kubernetes mounts Secret files as symlinks).
    install -o munge -g munge -m 0400 "$src" /etc/munge/munge.key \
        || die "cannot copy $src to /etc/munge/munge.key"
    log "munge: key installed at /etc/munge/munge.key (munge:munge 0400), starting munged"
    as_user munge munged || {
        tail -n 20 /var/log/munge/munged.log >&2 2>/dev/null || true
        die "munged failed to start (see above)"
    }
    for i in $(seq 1 50); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            log "munge: munged answers"
            return 0
        fi
        sleep 0.2
    done
    tail -n 20 /var/log/munge/munged.log >&2 2>/dev/null || true
    die "munged started but does not answer after 10s"
}

# --- users ----------------------------------------------------------------------------------
# _merge_db FRAGMENT TARGET FIELDS KIND: append lines of FRAGMENT (passwd/group format) whose
# name is not yet in TARGET. Idempotent. Conflicts (same name with another id, or the same id
# under another name) are fatal: they would give a user different identities on different pods.
_merge_db() {
    local frag="$1" target="$2" nfields="$3" kind="$4"
    local line name id cur_line cur_id other added=0 n=0
    while IFS= read -r line || [ -n "$line" ]; do
        line="${line%$'\r'}"
        case "$line" in ''|'#'*) continue ;; esac
        n=$((n + 1))
        [ "$(awk -F: '{print NF}' <<<"$line")" -eq "$nfields" ] \
            || die "$frag line $n: expected $nfields ':'-separated fields ($kind format): $line"
        name="${line%%:*}"
        id="$(cut -d: -f3 <<<"$line")"
        case "$name" in ''|*[!a-z0-9_.-]*|[-.]*) die "$frag line $n: bad $kind name '$name'" ;; esac
        case "$id" in ''|*[!0-9]*) die "$frag line $n: bad id '$id' for $name" ;; esac
        cur_line="$(awk -F: -v n="$name" '$1 == n { print; exit }' "$target")"
        if [ -n "$cur_line" ]; then
            cur_id="$(cut -d: -f3 <<<"$cur_line")"
            [ "$cur_id" = "$id" ] \
                || die "$kind '$name' is $cur_id in this image but $id in $frag: pick another id"
            if [ "$kind" = group ] && [ "$cur_line" != "$line" ]; then
                _merge_group_members "$target" "$name" "$(cut -d: -f4 <<<"$line")"
            fi
            continue
        fi
        other="$(awk -F: -v i="$id" '$3 == i { print $1; exit }' "$target")"
        [ -z "$other" ] || die "$kind id $id of '$name' ($frag) is already used by '$other' in this image"
        printf '%s\n' "$line" >>"$target"
        added=$((added + 1))
    done <"$frag"
    log "users: $added new $kind entries from $frag"
}

# Add MEMBERS (comma list) to the member list of GROUP in TARGET (union, order kept).
_merge_group_members() {
    local target="$1" group="$2" members="$3" tmp
    [ -n "$members" ] || return 0
    tmp="$(mktemp "$target.XXXXXX")"
    awk -F: -v OFS=: -v g="$group" -v add="$members" '
        $1 == g {
            n = split($4, cur, ","); seen[""] = 1
            for (i = 1; i <= n; i++) seen[cur[i]] = 1
            m = split(add, extra, ",")
            for (i = 1; i <= m; i++) if (!(extra[i] in seen)) { $4 = ($4 == "" ? extra[i] : $4 "," extra[i]); seen[extra[i]] = 1 }
        }
        { print }' "$target" >"$tmp" && cat "$tmp" >"$target"
    rm -f "$tmp"
}

# Groups first, so that primary groups exist when users are added.
sync_users() {
    local dir="$SLURMK8S_USERS_DIR"
    if [ ! -e "$dir/passwd" ] && [ ! -e "$dir/group" ]; then
        log "users: no $dir/passwd or $dir/group mounted: only the image's users exist"
        return 0
    fi
    [ ! -e "$dir/group" ] || _merge_db "$dir/group" /etc/group 4 group
    [ ! -e "$dir/passwd" ] || _merge_db "$dir/passwd" /etc/passwd 7 passwd
}

# Homes under /home for the users of the passwd fragment. /home is a volume whose root a provisioner
# may leave world-writable (NFS-subdir, EFS access points, local-path): before anyone logs in, a user
# (or a job on a worker) could make another user's home there and fill it with dotfiles that the
# victim's login shell then runs. So /home itself becomes root:root 0755 first (nobody but root can
# add, rename or remove homes after that), then for each user:
#   missing                        created from /etc/skel, owned by the user, mode 0700
#   the user's own directory       kept as found (contents and mode)
#   root's, writable by no other   finished like a new one (an earlier start's mkdir; only root wrote in it)
#   a symbolic link                removed (it holds no data), then created as missing
#   anything else (another uid's, root's but writable by others, not a directory)
#                                  REFUSED: locked root:root 0700 with its contents kept, never handed
#                                  to the user; that user has no usable home (sshd starts their session
#                                  in /) until an operator fixes it; the login pod starts for the others.
make_homes() {
    local frag="$SLURMK8S_USERS_DIR/passwd" name uid gid home made=0 was refused=0 owner mode why
    [ -e "$frag" ] || return 0
    mkdir -p /home || die "cannot create /home"
    was="$(stat -c 'uid %u gid %g mode %04a' /home)"
    if [ "$was" != "uid 0 gid 0 mode 0755" ]; then
        chown root:root /home && chmod 0755 /home \
            || die "cannot make /home root:root 0755 (it is $was): the volume must let root chown its root" \
                   "(NFS: no_root_squash, or give the export's directory to root:root 0755 on the server)"
        if mountpoint -q /home; then was="(a mounted volume) was $was"; else was="was $was"; fi
        log "users: /home $was: now root:root 0755, so that no user can create or rename homes"
    fi
    while IFS=: read -r name _ uid gid _ home _ || [ -n "$name" ]; do
        case "$name" in ''|'#'*) continue ;; esac
        case "$home" in /home/?*) ;; *) continue ;; esac
        case "$home" in */../*|*/..) log "users: skipping home '$home' of $name (contains ..)"; continue ;; esac
        if [ -L "$home" ]; then
            log "users: removed the symbolic link $home (to $(readlink "$home")) that stood for $name's home"
            rm -f "$home" || die "cannot remove the symbolic link $home"
        fi
        if [ -e "$home" ]; then
            owner="$(stat -c %u "$home")"; mode="$(stat -c %a "$home")"
            if [ -d "$home" ] && [ "$owner" = "$uid" ]; then
                continue
            fi
            why=""
            if [ ! -d "$home" ]; then
                why="it is not a directory"
            elif [ "$owner" != 0 ]; then
                why="it is owned by uid $owner, not $name"
            elif [ $(( 8#$mode & 8#022 )) -ne 0 ]; then
                why="it is owned by root but writable by others (mode $mode), so anyone may have put files in it"
            fi
            if [ -n "$why" ]; then
                chown -h root:root "$home" && chmod 0700 "$home" || die "cannot lock the refused home $home"
                log "users: REFUSED home $home of $name (uid $uid): $why; locked it (root:root 0700, contents" \
                    "kept) and $name has no usable home until it is fixed: if the contents are $name's (say" \
                    "the uid changed), chown -R $uid:$gid $home and chmod 0700 $home; else move it away and" \
                    "restart the login pod, which then creates a fresh one"
                refused=$((refused + 1))
                continue
            fi
        else
            mkdir -p "$home" || die "cannot create home $home for $name"
            cp -a /etc/skel/. "$home"/ 2>/dev/null || true     # (this also copies skel's own mode)
        fi
        chown -R "$uid:$gid" "$home"
        chmod 0700 "$home"
        made=$((made + 1))
    done <"$frag"
    if [ "$refused" -gt 0 ]; then refused="; REFUSED $refused (see above)"; else refused=""; fi
    log "users: created $made missing home directories under /home$refused"
}

# Container jobs (pools[].containers, SLURMK8S_CONTAINERS=1): oci.conf runs rootless crun with
# --root=/run/user/<uid>/crun, so each user of the passwd fragment gets /run/user/<uid>, owned by
# them, mode 0700 (no user can make or see another's; /run/user itself stays root's, 0755).
make_runtime_dirs() {
    local frag="$SLURMK8S_USERS_DIR/passwd" name uid gid made=0
    [ -e "$frag" ] || return 0
    install -d -m 0755 /run/user
    while IFS=: read -r name _ uid gid _ || [ -n "$name" ]; do
        case "$name" in ''|'#'*) continue ;; esac
        case "$uid" in ''|*[!0-9]*) continue ;; esac
        install -d -o "$uid" -g "$gid" -m 0700 "/run/user/$uid" || die "cannot create /run/user/$uid for $name"
        made=$((made + 1))
    done <"$frag"
    log "containers: /run/user/<uid> for $made users (crun's state)"
}

# The login environment slurmd gives a job that asks for it (sbatch --export=NONE or NAME=value
# without ALL, --get-user-env). slurm.conf's GetEnvTimeout=0 makes slurmd read it from
# <StateSaveLocation>/env_cache/<user> instead of running `su - user` in a new pid namespace,
# which an unprivileged container may not create (slurmd 24.11 dies: "fatal: clone: Operation not
# permitted"). The environment is the system's login one (/etc/profile and profile.d, as a user
# without dotfiles sees it) with each user's HOME, USER, LOGNAME and SHELL; users' own dotfiles
# still run where the job script is a login shell (#!/bin/bash -l).
write_env_cache() {
    local dir="$1" frag="$SLURMK8S_USERS_DIR/passwd" base name home shell made=0
    [ -e "$frag" ] || return 0
    base=$(setpriv --reuid=65534 --regid=65534 --clear-groups \
        env -i HOME=/nonexistent USER=nobody LOGNAME=nobody SHELL=/bin/bash \
        timeout 10 bash -l -c 'env -u PWD -u SHLVL -u _ -u OLDPWD' 2>/dev/null) \
        || { log "env cache: cannot read the login environment; jobs asking for it get only theirs"; return 0; }
    base=$(printf '%s\n' "$base" | grep -v -E '^(HOME|USER|LOGNAME|SHELL|MAIL)=' || true)  # each user's own below
    install -d -m 0700 "$dir"
    while IFS=: read -r name _ _ _ _ home shell || [ -n "$name" ]; do
        case "$name" in ''|'#'*|*/*|.*) continue ;; esac
        {
            [ -z "$base" ] || printf '%s\n' "$base"
            printf 'HOME=%s\nUSER=%s\nLOGNAME=%s\nSHELL=%s\n' "$home" "$name" "$name" "${shell:-/bin/bash}"
        } >"$dir/.$name.new"
        chmod 0600 "$dir/.$name.new"
        mv -f "$dir/.$name.new" "$dir/$name"
        made=$((made + 1))
    done <"$frag"
    log "env cache: the login environment for $made user(s) in $dir (sbatch --export=NONE, --get-user-env)"
}

# --- Slurm ----------------------------------------------------------------------------------
# Value of KEY in a slurm.conf (case-insensitive key, first match; empty if unset).
slurm_conf_get() {
    local conf="$1" key="$2"
    awk -v k="$(tr '[:upper:]' '[:lower:]' <<<"$key")" '
        { sub(/#.*/, "") }
        {
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (tolower(kv[1]) == k) { v = substr($i, length(kv[1]) + 2); print v; exit }
            }
        }' "$conf"
}

# SLURMK8S_CONTROLLER=host[:port] -> CONTROLLER_HOST, CONTROLLER_PORT (default 6817).
parse_controller() {
    local c="${SLURMK8S_CONTROLLER:-}"
    [ -n "$c" ] || die "SLURMK8S_CONTROLLER is not set (host[:port] of slurmctld)"
    case "$c" in
        *:*) CONTROLLER_HOST="${c%:*}"; CONTROLLER_PORT="${c##*:}" ;;
        *) CONTROLLER_HOST="$c"; CONTROLLER_PORT=6817 ;;
    esac
    case "$CONTROLLER_PORT" in ''|*[!0-9]*) die "SLURMK8S_CONTROLLER='$c': port must be a number" ;; esac
    [ -n "$CONTROLLER_HOST" ] || die "SLURMK8S_CONTROLLER='$c': empty host"
}

# Wait (bounded by SLURMK8S_CONTROLLER_WAIT seconds, default 300) until the controller's
# port accepts TCP connections. A configless daemon exits at once if slurmctld is not up.
wait_for_controller() {
    local limit="${SLURMK8S_CONTROLLER_WAIT:-300}" start now next_log
    start="$(date +%s)"; next_log=0
    log "waiting for slurmctld at $CONTROLLER_HOST:$CONTROLLER_PORT (up to ${limit}s)"
    until timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$CONTROLLER_HOST" "$CONTROLLER_PORT" 2>/dev/null; do
        now="$(date +%s)"
        [ $((now - start)) -lt "$limit" ] \
            || die "slurmctld at $CONTROLLER_HOST:$CONTROLLER_PORT not reachable after ${limit}s"
        if [ "$now" -ge "$next_log" ]; then
            [ "$next_log" -eq 0 ] || log "still waiting for $CONTROLLER_HOST:$CONTROLLER_PORT ($((now - start))s)"
            next_log=$((now + 10))
        fi
        sleep 1
    done
    log "slurmctld port $CONTROLLER_HOST:$CONTROLLER_PORT answers after $(( $(date +%s) - start ))s"
}

# The boot gate (provisioner/elastic/bootgate.py, served by the reconcile loop beside slurmctld):
# ask whether slurmd may start yet, before it starts. A pod created ahead of Slurm's resume call
# waits here until that call: Slurm 24.11 takes a POWERING_UP node as booted only when its slurmd
# started (-b: its boot time) no earlier than the power-save pass that resumed it, so the wait has
# to come before slurmd's start, not its registration. Any answer but "held" (a refused connection:
# no gate served) means go on; at most SLURMK8S_BOOT_GATE_MAX seconds (default 50) in all.
ask_boot_gate() {
    local host="$1" port="$2" node="$3" max="${SLURMK8S_BOOT_GATE_MAX:-50}" reply=held left start end waited
    local LC_ALL=C  # $EPOCHREALTIME and awk with a decimal point, whatever the image's locale
    case "$max" in ''|*[!0-9]*) max=50 ;; esac
    max=$((10#$max))
    start="$EPOCHREALTIME"; end=$((SECONDS + max))
    while [ "$reply" = held ] && left=$((end - SECONDS)) && [ "$left" -gt 0 ]; do
        reply="$(timeout "$((left < 25 ? left : 25))" bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "%s\n" "$3" >&3 \
                 && read -r line <&3 && printf "%s" "$line"' _ "$host" "$port" "$node" 2>/dev/null)" || reply=""
    done
    # "open T": T is slurmctld's clock at the answer, after Slurm's boot request for this node. slurmd
    # starts no earlier by this clock either, so a clock a little behind slurmctld's costs that
    # difference, never the node (a whole second behind would; then at most 2 s more, and a warning).
    local behind=0
    case "$reply" in
        "open "*) behind="$(awk -v t="${reply#open }" -v now="$EPOCHREALTIME" \
                            'BEGIN { d = t - now; printf "%.3f", (d > 0 ? (d > 2 ? 2 : d) : 0) }' 2>/dev/null || echo 0)"
                  [ "$behind" = 0.000 ] || sleep "$behind"
                  reply=open ;;
    esac
    waited="$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')"
    log "boot gate $host:$port: ${reply:-not served} after ${waited}s"
    if [ "$behind" = 2.000 ]; then
        log "WARNING: this node's clock is 2 s or more behind slurmctld's: Slurm may not take this node as booted (run NTP)"
    fi
}

# Make a directory owned by USER (re-owning its content when it was not, e.g. a fresh volume).
own_dir() {
    local dir="$1" user="$2" mode="$3"
    mkdir -p "$dir" || die "cannot create $dir"
    if [ "$(stat -c %U "$dir")" != "$user" ]; then
        chown -R "$user:$user" "$dir" || die "cannot chown $dir to $user"
    fi
    chmod "$mode" "$dir"
}
