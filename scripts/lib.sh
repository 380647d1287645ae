# Shared helpers of scripts/test and scripts/demo: install and start what is missing, quickly
# when it is already there. Sourced, not run.

OUTBOX_CACHE="${HOME}/.cache/outbox"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$OUTBOX_CACHE/target}"

say() { printf '==> %s\n' "$*" >&2; }

_apt_updated=0
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$_apt_updated" = 0 ]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        _apt_updated=1
    fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

mariadb_tcp_ok() {
    mariadb -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null 2>&1
}

# MariaDB on 127.0.0.1:3306 with root and an empty password, as the tests expect.
ensure_mariadb() {
    command -v mariadb >/dev/null 2>&1 || apt_install mariadb-server mariadb-client
    if mariadb_tcp_ok; then
        return 0
    fi
    if ! mariadb -u root -e 'SELECT 1' >/dev/null 2>&1; then
        say "starting MariaDB"
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql >/dev/null
        for _ in $(seq 1 120); do
            mariadb -u root -e 'SELECT 1' >/dev/null 2>&1 && break
            sleep 0.5
        done
    fi
    if ! mariadb_tcp_ok; then
        # A fresh Debian install lets root in through the unix socket only.
        mariadb -u root -e "ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; FLUSH PRIVILEGES" >/dev/null 2>&1 || true
    fi
    mariadb_tcp_ok || { say "MariaDB is not reachable on 127.0.0.1:3306 as root"; return 1; }
}

ensure_rocketmq() {
    scripts/rocketmq install
    scripts/rocketmq start
}

# The broker's cold build (~11 min here) ends in long single-crate steps that leave a core idle:
# start it in the background, build the project meanwhile, then finish_rocketmq. Instant when
# the broker is already installed. `finish_rocketmq fresh` starts them on an empty store, with
# nothing left running from before (scripts/test).
begin_rocketmq_install() {
    scripts/rocketmq install &
    ROCKETMQ_INSTALL_PID=$!
}

finish_rocketmq() {
    if [ -n "${ROCKETMQ_INSTALL_PID:-}" ]; then
        wait "$ROCKETMQ_INSTALL_PID" || { say "building the RocketMQ name server and broker failed"; return 1; }
        ROCKETMQ_INSTALL_PID=
    fi
    scripts/rocketmq "${1:-start}"
}

ensure_build_tools() {
    command -v gcc >/dev/null 2>&1 || apt_install gcc
    command -v valgrind >/dev/null 2>&1 || apt_install valgrind
    # libz for programs linked statically with liboutbox.a (the Go binding's static build).
    apt_install zlib1g-dev
}
