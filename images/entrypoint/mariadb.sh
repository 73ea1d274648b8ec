#!/bin/bash
# slurmk8s accounting database entrypoint (PID 1 is tini): Debian's MariaDB for slurmdbd.
# Contract: images/README.md.
#   /var/lib/mysql                          data directory (a volume); made owned by mysql (64031)
#   /etc/slurmk8s/db/password               password of the slurmdbd account (mounted Secret;
#                                           SLURMK8S_DB_PASSWORD_FILE); applied at every start
#   SLURMK8S_DB_NAME (slurm_acct_db), SLURMK8S_DB_USER (slurm)   database and account to ensure
#   SLURMK8S_DB_BUFFER_POOL (256M)          innodb_buffer_pool_size
#   arguments                               appended to the mariadbd command line
# A new volume is initialised with mariadb-install-db. The database, the account and its grants
# are ensured by an --init-file on every start (idempotent; a changed password takes effect).
set -euo pipefail
. /usr/local/lib/slurmk8s/lib.sh

DATA=/var/lib/mysql
PW_FILE="${SLURMK8S_DB_PASSWORD_FILE:-$SLURMK8S_DIR/db/password}"
DB_NAME="${SLURMK8S_DB_NAME:-slurm_acct_db}"
DB_USER="${SLURMK8S_DB_USER:-slurm}"
log "starting mariadb"

[ -r "$PW_FILE" ] || die "database password not found at $PW_FILE: mount the cluster's database Secret (key 'password')"
pw="$(cat "$PW_FILE")"
[ -n "$pw" ] || die "database password at $PW_FILE is empty"
case "$pw" in *[!A-Za-z0-9._~+=/-]*) die "database password at $PW_FILE has characters other than letters, digits and ._~+=/-" ;; esac
case "$DB_NAME$DB_USER" in *[!A-Za-z0-9_]*) die "SLURMK8S_DB_NAME / SLURMK8S_DB_USER may hold only letters, digits and '_'" ;; esac

own_dir "$DATA" mysql 0750
install -d -o mysql -g mysql -m 0755 /run/mysqld
if [ ! -d "$DATA/mysql" ]; then
    log "initialising a new database directory in $DATA"
    as_user mysql mariadb-install-db --datadir="$DATA" --auth-root-authentication-method=socket \
        --skip-test-db >/tmp/install-db.log 2>&1 || { cat /tmp/install-db.log >&2; die "mariadb-install-db failed"; }
fi

init=/run/mysqld/slurmk8s-init.sql
( umask 077
  cat >"$init" <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'%' IDENTIFIED BY '$pw';
ALTER USER '$DB_USER'@'%' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON \`$DB_NAME\`.* TO '$DB_USER'@'%';
SQL
)
chown mysql:mysql "$init"
# the init file holds the password: remove it once the server is up (double fork, reaped by tini)
( ( for _ in $(seq 1 600); do
        if mariadb-admin --protocol=socket -u root status >/dev/null 2>&1; then break; fi
        sleep 1
    done; rm -f "$init" ) & )

buffer="${SLURMK8S_DB_BUFFER_POOL:-256M}"
log "exec (as mysql) mariadbd: database $DB_NAME, account $DB_USER, innodb_buffer_pool_size=$buffer"
exec setpriv --reuid mysql --regid mysql --init-groups -- mariadbd --datadir="$DATA" --init-file="$init" \
    --bind-address=0.0.0.0 --port=3306 --skip-name-resolve --innodb-buffer-pool-size="$buffer" \
    --innodb-lock-wait-timeout=900 --max-allowed-packet=64M "$@"
