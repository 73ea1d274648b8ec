#!/bin/bash
# slurmk8s slurmdbd entrypoint (PID 1 is tini). Contract: images/README.md.
#   /etc/slurmk8s/slurmdbd/slurmdbd.conf  slurmdbd.conf without StoragePass (mounted Secret)
#   /etc/slurmk8s/db/password             the database password (mounted Secret; SLURMK8S_DB_PASSWORD_FILE)
#   /etc/slurmk8s/jwt/jwt_hs256.key       the JWT key, when slurmdbd.conf sets AuthAltParameters=jwt_key=
#   SLURMK8S_DB_WAIT                      seconds to wait for the database (default 300)
#   arguments                             appended to the slurmdbd command line (e.g. -vvv)
# Writes /etc/slurm/slurmdbd.conf (SlurmUser, 0600: slurmdbd refuses anything looser), waits until
# the database answers a real query with these credentials, then runs slurmdbd -D as SlurmUser.
#
#   slurmk8s-entrypoint check-db
# only tests the database named by SLURMK8S_DB_HOST, _PORT, _USER, _NAME and the password file,
# prints one line "ok: ..." or "error <kind>: ..." and exits 0 / 1 (used by `slurmk8s up`).
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh
. /usr/local/lib/slurmk8s/jwt.sh

CONF_SRC="${SLURMK8S_SLURMDBD_CONF:-$SLURMK8S_DIR/slurmdbd/slurmdbd.conf}"
PW_FILE="${SLURMK8S_DB_PASSWORD_FILE:-$SLURMK8S_DIR/db/password}"
CONF=/etc/slurm/slurmdbd.conf

read_password() {
    [ -r "$PW_FILE" ] || { echo "error secret: database password file $PW_FILE is missing or unreadable"; return 1; }
    DB_PASSWORD="$(cat "$PW_FILE")"
    [ -n "$DB_PASSWORD" ] || { echo "error secret: database password in $PW_FILE is empty"; return 1; }
    # slurmdbd.conf has no quoting for these: refuse what its parser would cut or misread
    case "$DB_PASSWORD" in
        *[[:space:]\#\"\'\\]*) echo "error secret: the database password contains whitespace, '#', a quote or a backslash, which slurmdbd.conf cannot hold; use another password"; return 1 ;;
    esac
}

# query HOST PORT USER DB -> prints "ok" or "error <kind>: <mariadb's message>"; status 0 / 1
query_db() {
    local host="$1" port="$2" user="$3" db="$4" out rc
    set +e
    out="$(MYSQL_PWD="$DB_PASSWORD" timeout 20 mariadb --connect-timeout=5 --protocol=TCP -h "$host" -P "$port" \
        -u "$user" --batch --skip-column-names -e 'SELECT 1' "$db" 2>&1)"
    rc=$?
    set -e
    if [ "$rc" = 0 ]; then echo ok; return 0; fi
    out="$(printf '%s\n' "$out" | grep -v '^WARNING' | tr '\n' ' ')"; out="${out% }"
    case "$out" in
        *"ERROR 1045"*) echo "error credentials: $out" ;;
        *"ERROR 1044"*|*"ERROR 1049"*) echo "error database: $out" ;;
        *"ERROR 2005"*|*"Unknown server host"*|*"Name or service not known"*) echo "error host: $out" ;;
        *"ERROR 2002"*|*"ERROR 2003"*|*"ERROR 2013"*|*"ERROR 2026"*) echo "error unreachable: $out" ;;
        "") echo "error unreachable: no answer within 20s" ;;
        *) echo "error other: $out" ;;
    esac
    return 1
}

if [ "${1:-}" = check-db ]; then
    read_password || exit 1
    result="$(query_db "${SLURMK8S_DB_HOST:?}" "${SLURMK8S_DB_PORT:-3306}" "${SLURMK8S_DB_USER:?}" "${SLURMK8S_DB_NAME:?}")" \
        && { echo "ok: $SLURMK8S_DB_USER@$SLURMK8S_DB_HOST:${SLURMK8S_DB_PORT:-3306}/$SLURMK8S_DB_NAME answers"; exit 0; }
    echo "$result"
    exit 1
fi

log "starting slurmdbd"
[ -r "$CONF_SRC" ] || die "$CONF_SRC not found: mount the cluster's slurmdbd Secret (key slurmdbd.conf) at $(dirname "$CONF_SRC")"
read_password >/tmp/password-check || die "$(cat /tmp/password-check)"
start_munge

SLURM_USER="$(slurm_conf_get "$CONF_SRC" SlurmUser)"
[ -n "$SLURM_USER" ] && [ "$SLURM_USER" != root ] || die "$CONF_SRC must set SlurmUser (not root)"
host="$(slurm_conf_get "$CONF_SRC" StorageHost)"
port="$(slurm_conf_get "$CONF_SRC" StoragePort)"
user="$(slurm_conf_get "$CONF_SRC" StorageUser)"
db="$(slurm_conf_get "$CONF_SRC" StorageLoc)"
[ -n "$host" ] && [ -n "$user" ] && [ -n "$db" ] || die "$CONF_SRC must set StorageHost, StorageUser and StorageLoc"
port="${port:-3306}"

umask 077
install -d -m 0755 /etc/slurm
tmp="$(mktemp /etc/slurm/.slurmdbd.conf.XXXXXX)"
{ grep -v -i '^[[:space:]]*StoragePass[[:space:]]*=' "$CONF_SRC"; printf 'StoragePass=%s\n' "$DB_PASSWORD"; } >"$tmp"
chown "$SLURM_USER:$SLURM_USER" "$tmp"
chmod 0600 "$tmp"
mv -f "$tmp" "$CONF"
umask 022
install_jwt_key "$CONF" "$SLURM_USER"
log "config: $CONF ($SLURM_USER, 0600; StoragePass from $PW_FILE)"

# slurmdbd exits fatally when the database accepts connections but is not fully up
# ("_check_mysql_concat_is_sane: null result"): wait for a real query first.
limit="${SLURMK8S_DB_WAIT:-300}"
start="$(date +%s)"; next_log=0
log "waiting for the database $user@$host:$port/$db (up to ${limit}s)"
until result="$(query_db "$host" "$port" "$user" "$db")"; do
    case "$result" in
        "error credentials"*|"error database"*) die "the database refuses slurmdbd: $result. Fix the password Secret or the database grants" ;;
    esac
    now="$(date +%s)"
    [ $((now - start)) -lt "$limit" ] || die "database $host:$port not usable after ${limit}s: $result"
    if [ "$now" -ge "$next_log" ]; then log "database not ready yet ($((now - start))s): $result"; next_log=$((now + 10)); fi
    sleep 2
done
log "database answers after $(( $(date +%s) - start ))s"

own_dir /var/log/slurm "$SLURM_USER" 0755
own_dir /run/slurmdbd "$SLURM_USER" 0755
pidfile="$(slurm_conf_get "$CONF" PidFile)"
if [ -n "$pidfile" ]; then
    mkdir -p "$(dirname "$pidfile")"; rm -f "$pidfile"; echo 0 >"$pidfile"; chown "$SLURM_USER:$SLURM_USER" "$pidfile"
fi
log "exec (as $SLURM_USER) slurmdbd -D $*"
exec setpriv --reuid "$SLURM_USER" --regid "$SLURM_USER" --init-groups -- slurmdbd -D "$@"
