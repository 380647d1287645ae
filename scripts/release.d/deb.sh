# outboxd as a Debian package (cargo deb, [package.metadata.deb] in Cargo.toml; the unit, the
# maintainer scripts and README.Debian in packaging/deb/):
#
#   /usr/bin/outboxd                          --features rocketmq,daemon (and otlp when it exists),
#                                             the dist profile (fat LTO: Cargo.toml)
#   /etc/outbox/outboxd.toml                  conffile, root:outbox 0640 (a statoverride), every
#                                             key commented out at its default
#   /usr/lib/systemd/system/outboxd.service   as the user outbox, hardened; not enabled or started
#   /usr/share/doc/outboxd/README.Debian      configure, check, migrate (a separate step), start
#   /usr/share/doc/outboxd/copyright, NOTICE  the licence (LICENSE), the crates linked in (scripts/notice)
#
# The system user and group outbox are created by postinst and removed on purge.
#
# check_deb installs it on this machine with dpkg, runs outboxd as its users would (version,
# config check on the file as shipped and with db.url set, migrate and a short run as the outbox
# user against a database of its own), verifies the unit with systemd-analyze, then purges the
# package and verifies that nothing of it is left.

deb_version() { sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1; }

# rocketmq,daemon plus otlp once Cargo.toml has that feature (the OTLP span exporter).
deb_features() {
    local f=rocketmq,daemon
    grep -q '^otlp *=' Cargo.toml && f="$f,otlp"
    echo "$f"
}

deb_file() { echo "$ARTIFACTS/outboxd_$(deb_version)-1_amd64.deb"; }

release_deb() {
    local features built conf target
    features=$(deb_features)
    # A target directory of its own: the C tarball's dist build of the library has other
    # features, and sharing one would rebuild the crate with fat LTO on every alternate run.
    target="$OUTBOX_RELEASE_TARGET/deb"
    if ! command -v cargo-deb >/dev/null 2>&1; then
        say "cargo install cargo-deb --locked"
        cargo install cargo-deb --locked
    fi
    apt_install dpkg-dev
    release_cargo "$target" --profile dist --bin outboxd --features "$features"
    built="$target/$RELEASE_TRIPLE/dist"

    # The conffile: the binary's own example (every key, its default and meaning), each setting
    # commented out, under a header saying what to set and how to check it. A fresh install then
    # gets a clear answer from `outboxd config check`: db.url is required.
    conf="$built/outboxd.toml"
    {
        cat packaging/deb/outboxd.toml.head
        "$built/outboxd" config example | sed '1,/^$/d' | sed -E 's/^("[^"]+" = )/# \1/'
    } >"$conf"
    if grep -v '^#' "$conf" | grep -q .; then
        say "release_deb: a setting was left uncommented in the shipped outboxd.toml:"
        grep -v '^#' "$conf" | grep . >&2
        return 1
    fi
    if ! grep -q '^# "db.url" = ' "$conf"; then
        say "release_deb: the shipped outboxd.toml has no commented db.url"
        return 1
    fi

    rm -f "$(deb_file)"
    # --profile dist --target: the assets' target/release/ paths are read from
    # target/$RELEASE_TRIPLE/dist/.
    say "cargo deb --no-build --profile dist --target $RELEASE_TRIPLE"
    CARGO_TARGET_DIR="$target" cargo deb --no-build --profile dist --target "$RELEASE_TRIPLE" --output "$(deb_file)"
    [ -f "$(deb_file)" ] || { say "release_deb: cargo deb wrote no $(deb_file)"; return 1; }
    echo "$(basename "$(deb_file)") $(stat -c %s "$(deb_file)")" >>"$ARTIFACTS/sizes.txt"
    echo "outboxd(installed) $(dpkg-deb --fsys-tarfile "$(deb_file)" | tar -xO ./usr/bin/outboxd | wc -c)" >>"$ARTIFACTS/sizes.txt"
}

check_deb() (
    set -euo pipefail
    # Not local: the EXIT trap reads db and pid (the subshell keeps them from leaking).
    local deb version server unit out rc
    deb=$(deb_file)
    version=$(deb_version)
    [ -f "$deb" ] || { say "check_deb: no $deb (scripts/release deb builds it)"; exit 1; }
    [ "$(id -u)" = 0 ] || { say "check_deb: installs the package: run as root"; exit 1; }
    apt_install systemd adduser
    ensure_mariadb
    if dpkg -s outboxd >/dev/null 2>&1; then
        say "check_deb: outboxd is installed already: purging it first"
        dpkg --purge outboxd >/dev/null
    fi
    getent passwd outbox >/dev/null && { say "check_deb: a user outbox exists already (not from the package)"; exit 1; }

    db="outbox_rel_deb_$$_$RANDOM"
    server="${OUTBOX_TEST_MYSQL:-mysql://root@127.0.0.1:3306}"
    TMPDIR_DEB=$(mktemp -d)
    # Every step may fail (the daemon has exited already, nothing was installed): under set -e
    # a failing one would be the subshell's exit status, after the check had passed.
    cleanup() {
        if [ -n "${pid:-}" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
        dpkg --purge outboxd >/dev/null 2>&1 || true
        rm -rf "$TMPDIR_DEB"
        mariadb -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
    }
    trap cleanup EXIT
    fail() { say "check_deb: $*"; exit 1; }

    dpkg-deb --info "$deb" >/dev/null
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >/dev/null

    out=$(outboxd --version)
    [ "$out" = "outboxd $version" ] || fail "outboxd --version printed '$out'"
    [ "$(command -v outboxd)" = /usr/bin/outboxd ] || fail "outboxd is not /usr/bin/outboxd"
    check_glibc check_deb /usr/bin/outboxd

    # The system user, and the conffile readable by it alone.
    getent passwd outbox | awk -F: '$3 < 1000 && $7 ~ /nologin|false/ { ok = 1 } END { exit !ok }' \
        || fail "outbox is not a system user without a shell: $(getent passwd outbox)"
    [ "$(stat -c '%a %U:%G' /etc/outbox/outboxd.toml)" = "640 root:outbox" ] \
        || fail "/etc/outbox/outboxd.toml is $(stat -c '%a %U:%G' /etc/outbox/outboxd.toml), not 640 root:outbox"
    dpkg-query -W -f='${Conffiles}\n' outboxd | grep -q '^ /etc/outbox/outboxd.toml ' \
        || fail "/etc/outbox/outboxd.toml is not a conffile"

    # As shipped: every key commented out, so config check names the one required key ...
    rc=0
    out=$(outboxd -c /etc/outbox/outboxd.toml config check 2>&1) || rc=$?
    [ "$rc" = 2 ] || fail "config check on the shipped file exited $rc, not 2: $out"
    echo "$out" | grep -q 'db.url.*required' || fail "config check on the shipped file does not say db.url is required: $out"
    # ... and with db.url given, the rest of the file is accepted (as the service's user too).
    out=$(runuser -u outbox -- outboxd -c /etc/outbox/outboxd.toml --set "db.url=$server/$db" config check) \
        || fail "config check with db.url set failed: $out"
    echo "$out" | grep -q '^configuration OK$' || fail "config check with db.url set did not say OK: $out"

    # The unit: installed where systemd looks, and valid.
    unit=$(dpkg -L outboxd | grep '/systemd/system/outboxd.service$') || fail "no outboxd.service in the package"
    out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $out"
    [ -z "$out" ] || fail "systemd-analyze verify $unit warned: $out"
    grep -q '^ExecStart=/usr/bin/outboxd -c /etc/outbox/outboxd.toml run$' "$unit" || fail "unexpected ExecStart in $unit"
    grep -q '^User=outbox$' "$unit" || fail "$unit does not run as outbox"
    [ -f /usr/share/doc/outboxd/README.Debian ] || fail "no README.Debian"
    cmp -s /usr/share/doc/outboxd/NOTICE NOTICE || fail "no NOTICE, or another one than the repository's"
    grep -q "Apache License" /usr/share/doc/outboxd/copyright || fail "the copyright file does not carry the licence text"

    # The documented steps: migrate (separately, with a URL allowed to run DDL), then run as the
    # service's user (what ExecStart runs) until SIGTERM, which drains and exits 0; with a name
    # server answering, an event committed meanwhile is sent.
    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE $db"
    outboxd -c /etc/outbox/outboxd.toml --set "db.url=$server/$db" migrate >"$TMPDIR_DEB/migrate.log" 2>&1 \
        || fail "outboxd migrate failed: $(cat "$TMPDIR_DEB/migrate.log")"
    local namesrv="${OUTBOX_TEST_NAMESRV:-127.0.0.1:9876}" publish=0 sent=0
    (exec 3<>"/dev/tcp/${namesrv%:*}/${namesrv#*:}") 2>/dev/null && publish=1
    mariadb -h 127.0.0.1 -P 3306 -u root "$db" -e "INSERT INTO t_event_record
        (biz_no, event_type, payload, status, retry_count, next_retry_time) VALUES ('DEB-1', 'PACKAGE_CHECKED', '{}', 'WAIT', 0, NOW(3))"
    # As the unit runs it: user and group outbox, no new privileges, HOME=/nonexistent (setpriv
    # execs, so the signal reaches outboxd itself).
    setpriv --reuid=outbox --regid=outbox --init-groups --no-new-privs env HOME=/nonexistent USER=outbox \
        outboxd -c /etc/outbox/outboxd.toml --set "db.url=$server/$db" --set "rocketmq.namesrv=$namesrv" \
        --set "topic=outbox_rel_deb_$$" run >"$TMPDIR_DEB/run.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 60); do
        sleep 0.5
        kill -0 "$pid" 2>/dev/null || break
        if [ "$publish" = 1 ]; then
            # Sent: deleted (sent.rows = delete, the default) or SUCCESS.
            unsent=$(mariadb -h 127.0.0.1 -P 3306 -u root -N "$db" -e "SELECT COUNT(*) FROM t_event_record WHERE status <> 'SUCCESS'")
            [ "$unsent" = 0 ] && { sent=1; break; }
        elif grep -q 'outboxd .* on ' "$TMPDIR_DEB/run.log"; then
            break
        fi
    done
    kill -TERM "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 0 ] || fail "outboxd run as outbox exited $rc after SIGTERM: $(cat "$TMPDIR_DEB/run.log")"
    if [ "$publish" = 1 ]; then
        [ "$sent" = 1 ] || fail "outboxd run as outbox did not send the event within 30 s: $(cat "$TMPDIR_DEB/run.log")"
    else
        say "check_deb: no name server on $namesrv (scripts/rocketmq start): sending not checked, only running and draining"
    fi

    # Purge: nothing of the package is left.
    dpkg --purge outboxd >/dev/null
    local left=()
    [ -e /usr/bin/outboxd ] && left+=(/usr/bin/outboxd)
    [ -e /etc/outbox ] && left+=(/etc/outbox)
    [ -e "$unit" ] && left+=("$unit")
    [ -e /usr/share/doc/outboxd ] && left+=(/usr/share/doc/outboxd)
    getent passwd outbox >/dev/null && left+=("user outbox")
    getent group outbox >/dev/null && left+=("group outbox")
    dpkg-statoverride --list /etc/outbox/outboxd.toml >/dev/null 2>&1 && left+=("statoverride of /etc/outbox/outboxd.toml")
    find /etc/systemd /var/lib/systemd -name 'outboxd*' 2>/dev/null | grep -q . && left+=("$(find /etc/systemd /var/lib/systemd -name 'outboxd*')")
    dpkg -s outboxd >/dev/null 2>&1 && left+=("the package's dpkg status")
    [ ${#left[@]} -eq 0 ] || fail "left after dpkg --purge: ${left[*]}"
    say "check_deb: $(basename "$deb"): installed, configured, migrated, ran as outbox, purged clean"
)
