# Rust users: the crate as crates.io would get it, $ARTIFACTS/outbox-<version>.crate.
#
# release_crate: `cargo package` (which builds the packaged crate on its own, default features;
# offline when the local index cache has what it needs) and `cargo publish --dry-run`
# (everything but the upload; skipped, saying so, when crates.io cannot be reached). Both with
# --allow-dirty: this checkout is shared and often has work in progress; a real release runs
# them on a clean tag.
# What goes in is Cargo.toml's `include` (src/, migrations/, include/outbox.h, README.md,
# outbox.example.toml): nothing of tests/, benches/, bindings/, docs/ or scripts/.
#
# check_crate: the documentation as docs.rs builds it ([package.metadata.docs.rs] features and
# rustdoc-args) from the packaged sources, with rustdoc warnings denied; then
# packaging/crate-example (a crate outside this workspace depending on `outbox = "0.1"`) built
# and run against the unpacked .crate, patched in for crates.io's, with default features
# (migrate and enqueue) and with rocketmq (relayed through the broker when a name server answers),
# in a database of its own, dropped afterwards. The example is built in a copy under
# $CRATE_TARGET/crate-example so that its dependencies stay warm; nothing is written to the
# repository.
#
# Everything here builds in CRATE_TARGET, a target dir of its own: the package's verification
# and the example build the packaged crate with default features, and in the shared dev target
# that replaced target/debug/liboutbox.so (the library the C, Go and Java suites load) with one
# without their features.

CRATE_TARGET="$OUTBOX_RELEASE_TARGET/crate"

crate_version() { sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1; }

release_crate() (
    set -euo pipefail
    export CARGO_TARGET_DIR="$CRATE_TARGET"
    local version crate
    version=$(crate_version)
    crate="$CARGO_TARGET_DIR/package/outbox-$version.crate"
    say "cargo package --allow-dirty"
    cargo package --allow-dirty --offline 2>/dev/null || cargo package --allow-dirty
    # The dry run asks crates.io's index; without it (an offline run of scripts/test) it is said
    # and skipped, never silently.
    if curl -sfI --max-time 10 https://index.crates.io/config.json >/dev/null 2>&1; then
        say "cargo publish --dry-run --allow-dirty"
        cargo publish --dry-run --allow-dirty
    else
        say "release_crate: crates.io's index is unreachable: cargo publish --dry-run NOT run"
    fi
    [ -f "$crate" ] || { say "release_crate: no $crate"; return 1; }
    cp "$crate" "$ARTIFACTS/"
    touch "$ARTIFACTS/sizes.txt"
    sed -i -E '/^outbox-[^ ]*\.crate /d' "$ARTIFACTS/sizes.txt"
    echo "outbox-$version.crate $(stat -c %s "$ARTIFACTS/outbox-$version.crate")" >>"$ARTIFACTS/sizes.txt"
)

check_crate() (
    export CARGO_TARGET_DIR="$CRATE_TARGET"
    set -euo pipefail
    local version crate unpacked features rustdoc_args example server namesrv
    version=$(crate_version)
    crate="$ARTIFACTS/outbox-$version.crate"
    [ -f "$crate" ] || { say "check_crate: no $crate (scripts/release crate builds it)"; exit 1; }
    ensure_mariadb
    fail() { say "check_crate: $*"; exit 1; }
    # Not local: the EXIT trap reads it (the subshell keeps it from leaking).
    db="outbox_rel_crate_$$_$RANDOM"
    cleanup() { mariadb -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; }
    trap cleanup EXIT

    # What is in it: what the build needs and users read, nothing else.
    tar -tzf "$crate" >"$ARTIFACTS/crate.list"
    local prefix="outbox-$version"
    for f in Cargo.toml Cargo.toml.orig Cargo.lock README.md LICENSE NOTICE src/lib.rs src/bin/outboxd/main.rs \
        migrations/V1__create_t_event_record.sql include/outbox.h src/console/assets/console.css; do
        grep -qx "$prefix/$f" "$ARTIFACTS/crate.list" || fail "$f missing from the crate"
    done
    if grep -E "^$prefix/(tests|benches|bindings|docs|scripts|deploy|examples|packaging)/" "$ARTIFACTS/crate.list"; then
        fail "the crate carries the files above"
    fi
    rm -f "$ARTIFACTS/crate.list"

    # The crate unpacked, as cargo publish --dry-run left it (a stable path: warm builds).
    unpacked="$CARGO_TARGET_DIR/package/outbox-$version"
    rm -rf "$unpacked"
    tar -xzf "$crate" -C "$CARGO_TARGET_DIR/package"

    # docs.rs: its features and rustdoc args, read from the packaged manifest; warnings denied.
    read -r features rustdoc_args < <(cd "$unpacked" && cargo metadata --no-deps --format-version 1 --offline 2>/dev/null \
        | python3 -c 'import json,sys; d=json.load(sys.stdin)["packages"][0]["metadata"]["docs"]["rs"]; print(",".join(d["features"]), " ".join(d.get("rustdoc-args", [])))') \
        || fail "no [package.metadata.docs.rs] in the packaged Cargo.toml"
    say "check_crate: cargo doc --no-deps --features $features (RUSTDOCFLAGS=\"$rustdoc_args -D warnings\")"
    (cd "$unpacked" && RUSTDOCFLAGS="$rustdoc_args -D warnings" cargo doc --no-deps --features "$features") \
        || fail "cargo doc of the packaged crate warned or failed"

    # A user's crate, outside the workspace, on the packaged crate.
    example="$CARGO_TARGET_DIR/crate-example"
    rm -rf "$example/src"
    mkdir -p "$example"
    cp packaging/crate-example/Cargo.toml "$example/"
    cp -r packaging/crate-example/src "$example/"
    local patch="patch.crates-io.outbox.path=\"$unpacked\""
    local bin="$CARGO_TARGET_DIR/debug/outbox-crate-example"
    server="${OUTBOX_TEST_MYSQL:-mysql://root@127.0.0.1:3306}"
    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE $db"

    say "check_crate: packaging/crate-example (default features) on outbox-$version.crate"
    (cd "$example" && cargo build --config "$patch") || fail "the example does not build on the packaged crate"
    local out
    out=$("$bin") || fail "the example failed: $out"
    echo "$out" | grep -qx "outbox $version" || fail "the example printed: $out"
    "$bin" "$server/$db" || fail "the example did not migrate and enqueue"

    say "check_crate: packaging/crate-example --features rocketmq on outbox-$version.crate"
    (cd "$example" && cargo build --config "$patch" --features rocketmq) || fail "the example does not build with rocketmq"
    namesrv="${OUTBOX_TEST_NAMESRV:-127.0.0.1:9876}"
    if (exec 3<>"/dev/tcp/${namesrv%:*}/${namesrv#*:}") 2>/dev/null; then
        "$bin" "$server/$db" "$namesrv" "outbox_rel_crate_$$" || fail "the example did not relay through $namesrv"
    else
        say "check_crate: no name server on $namesrv (scripts/rocketmq start): relaying not checked"
    fi
    say "check_crate: outbox-$version.crate: documented like docs.rs would, used by a crate outside the workspace"
)
