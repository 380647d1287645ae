# C users: outbox-<version>-linux-x86_64.tar.gz, a prefix to unpack anywhere (or into /usr/local):
#
#   include/outbox.h
#   lib/liboutbox.so -> liboutbox.so.<soversion> -> liboutbox.so.<version>   (stripped, soname set,
#                                                          the dist profile: fat LTO, Cargo.toml)
#   lib/liboutbox.a                                  (the release profile, stripped of debug info)
#   lib/pkgconfig/outbox.pc          -loutbox; --static adds the system libraries liboutbox.a needs
#   lib/pkgconfig/outbox-static.pc   liboutbox.a and those system libraries: no liboutbox at run time
#   share/doc/outbox/LICENSE, NOTICE                  the licence, and the crates linked in (scripts/notice)
#
# The .pc files find the prefix from their own place (${pcfiledir}), so the tree works wherever it
# is unpacked: PKG_CONFIG_PATH=<prefix>/lib/pkgconfig. Built with --features rocketmq. The soname
# follows Cargo's compatibility rule: liboutbox.so.0.<minor> before 1.0, liboutbox.so.<major> after.
#
# check_c unpacks it into a temporary prefix and builds packaging/c-example/points.c with nothing
# but pkg-config, linked to the shared library and statically, and runs both against MariaDB (in a
# database of its own, dropped afterwards) and, when a name server answers, relays through it.

c_version() { sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1; }

# liboutbox.so.0.<minor> for 0.x (a minor release may break the ABI), liboutbox.so.<major> after.
c_soversion() {
    local v=$1 major minor
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    if [ "$major" = 0 ]; then echo "0.$minor"; else echo "$major"; fi
}

# The system libraries a program linked with liboutbox.a needs (rustc --print native-static-libs
# for the standard library, plus libz: the RocketMQ client compresses large bodies).
C_STATIC_LIBS="-lz -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

release_c() {
    local version soversion name stage root built
    version=$(c_version)
    soversion=$(c_soversion "$version")
    name="outbox-$version-linux-x86_64"
    apt_install patchelf binutils
    # The static archive with the release profile (the Go module's build, shared), the shared
    # library alone with the dist profile (fat LTO: a third smaller; LTO would grow the archive).
    # Both for the glibc baseline (release_cargo, scripts/release).
    release_cargo "$OUTBOX_RELEASE_TARGET" --release --lib --features rocketmq
    built="$OUTBOX_RELEASE_TARGET/$RELEASE_TRIPLE/release"
    release_cargo "$OUTBOX_RELEASE_TARGET" rustc --profile dist --lib --crate-type cdylib --features rocketmq

    stage=$(mktemp -d)
    root="$stage/$name"
    mkdir -p "$root/include" "$root/lib/pkgconfig" "$root/share/doc/outbox"
    cp include/outbox.h "$root/include/"
    # Copied at once: the uplifted files are replaced by any later build in the same target dir.
    strip --strip-unneeded -o "$root/lib/liboutbox.so.$version" "$OUTBOX_RELEASE_TARGET/$RELEASE_TRIPLE/dist/liboutbox.so"
    # The archive without debug info (the C objects zig compiles carry theirs: 40 MB) and LLVM
    # bitcode, as the Go module's.
    strip_archive "$built/liboutbox.a" "$root/lib/liboutbox.a"
    patchelf --set-soname "liboutbox.so.$soversion" "$root/lib/liboutbox.so.$version"
    ln -s "liboutbox.so.$version" "$root/lib/liboutbox.so.$soversion"
    ln -s "liboutbox.so.$soversion" "$root/lib/liboutbox.so"
    cp LICENSE NOTICE "$root/share/doc/outbox/"

    local description="Transactional-outbox relay: MySQL/MariaDB event table to Apache RocketMQ"
    cat >"$root/lib/pkgconfig/outbox.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: outbox
Description: $description (shared library)
URL: https://github.com/outbox-rs/outbox
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -loutbox
Libs.private: $C_STATIC_LIBS
PC
    cat >"$root/lib/pkgconfig/outbox-static.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: outbox-static
Description: $description (static library: nothing of outbox needed at run time)
URL: https://github.com/outbox-rs/outbox
Version: $version
Cflags: -I\${includedir}
Libs: \${libdir}/liboutbox.a $C_STATIC_LIBS
PC

    # Reproducible: fixed owner, order and times (the commit's).
    local mtime
    mtime=$(git log -1 --format=%cI 2>/dev/null || date -u +%FT%TZ)
    tar --create --gzip --file "$ARTIFACTS/$name.tar.gz" --directory "$stage" \
        --owner=0 --group=0 --numeric-owner --sort=name --mtime="$mtime" "$name"
    rm -rf "$stage"
    say "built $ARTIFACTS/$name.tar.gz"

    # This artifact's lines of an earlier run give way to this run's.
    touch "$ARTIFACTS/sizes.txt"
    sed -i -E '/^(outbox-[^ ]*-linux-x86_64\.tar\.gz|liboutbox\.(so|a)\((rocketmq|core)\)) /d' "$ARTIFACTS/sizes.txt"
    {
        echo "$name.tar.gz $(stat -c %s "$ARTIFACTS/$name.tar.gz")"
        echo "liboutbox.so(rocketmq) $(tar -xzOf "$ARTIFACTS/$name.tar.gz" "$name/lib/liboutbox.so.$version" | wc -c)"
        echo "liboutbox.a(rocketmq) $(tar -xzOf "$ARTIFACTS/$name.tar.gz" "$name/lib/liboutbox.a" | wc -c)"
    } >>"$ARTIFACTS/sizes.txt"
    c_core_sizes
}

# The library without the RocketMQ publisher (the core: enqueue, migrations, the inbox), measured
# for the sizes table only. Its own target dir, so that it never replaces the uplifted
# liboutbox.so/.a of the release builds sharing $OUTBOX_RELEASE_TARGET.
c_core_sizes() {
    local target="$OUTBOX_RELEASE_TARGET/core" tmp
    say "cargo build --release / rustc --profile dist --lib (no features, into $target): sizes only"
    CARGO_TARGET_DIR="$target" cargo build --release --lib
    CARGO_TARGET_DIR="$target" cargo rustc --profile dist --lib --crate-type cdylib
    tmp=$(mktemp -d)
    strip --strip-unneeded -o "$tmp/liboutbox.so" "$target/dist/liboutbox.so"
    strip_archive "$target/release/liboutbox.a" "$tmp/liboutbox.a"
    {
        echo "liboutbox.so(core) $(stat -c %s "$tmp/liboutbox.so")"
        echo "liboutbox.a(core) $(stat -c %s "$tmp/liboutbox.a")"
    } >>"$ARTIFACTS/sizes.txt"
    rm -rf "$tmp"
}

check_c() (
    set -euo pipefail
    # Not local: the EXIT trap reads db and tmp (the subshell keeps them from leaking).
    local version soversion name tarball prefix server namesrv
    version=$(c_version)
    soversion=$(c_soversion "$version")
    name="outbox-$version-linux-x86_64"
    tarball="$ARTIFACTS/$name.tar.gz"
    [ -f "$tarball" ] || { say "check_c: no $tarball (scripts/release c builds it)"; exit 1; }
    apt_install gcc pkgconf zlib1g-dev binutils
    ensure_mariadb

    tmp=$(mktemp -d)
    db="outbox_rel_c_$$_$RANDOM"
    server="${OUTBOX_TEST_MYSQL:-mysql://root@127.0.0.1:3306}"
    cleanup() {
        mariadb -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
        rm -rf "$tmp"
    }
    trap cleanup EXIT

    tar -xzf "$tarball" -C "$tmp"
    prefix="$tmp/$name"
    for f in include/outbox.h lib/liboutbox.so "lib/liboutbox.so.$soversion" "lib/liboutbox.so.$version" lib/liboutbox.a \
        lib/pkgconfig/outbox.pc lib/pkgconfig/outbox-static.pc share/doc/outbox/LICENSE share/doc/outbox/NOTICE; do
        [ -e "$prefix/$f" ] || { say "check_c: $f missing from $tarball"; exit 1; }
    done
    check_glibc check_c "$prefix/lib/liboutbox.so.$version"
    readelf -d "$prefix/lib/liboutbox.so.$version" | grep -q "SONAME.*\[liboutbox.so.$soversion\]" \
        || { say "check_c: liboutbox.so has no soname liboutbox.so.$soversion"; exit 1; }
    if readelf -S "$prefix/lib/liboutbox.so.$version" | grep -q '\.debug_\|\.symtab'; then
        say "check_c: liboutbox.so is not stripped"
        exit 1
    fi

    # As a user would: nothing but pkg-config, from wherever the tree was unpacked.
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
    [ "$(pkg-config --modversion outbox)" = "$version" ] || { say "check_c: pkg-config --modversion outbox is not $version"; exit 1; }
    local cflags=(-std=c11 -Wall -Wextra -Werror -pedantic -O2)
    # shellcheck disable=SC2046
    gcc "${cflags[@]}" -o "$tmp/points" packaging/c-example/points.c $(pkg-config --cflags --libs outbox)
    readelf -d "$tmp/points" | grep -q "NEEDED.*\[liboutbox.so.$soversion\]" \
        || { say "check_c: points does not need liboutbox.so.$soversion"; exit 1; }
    # shellcheck disable=SC2046
    gcc "${cflags[@]}" -o "$tmp/points-static" packaging/c-example/points.c $(pkg-config --static --cflags --libs outbox-static)
    if readelf -d "$tmp/points-static" | grep -q 'NEEDED.*liboutbox'; then
        say "check_c: points-static still needs liboutbox.so"
        exit 1
    fi
    # The archive links on a system of the glibc baseline: the same program linked by zig cc
    # against that glibc's symbols (this machine's own link above takes its newer ones).
    local cc
    read -r -a cc <<<"$(baseline_cc)"
    # shellcheck disable=SC2046
    "${cc[@]}" "${cflags[@]}" -o "$tmp/points-baseline" packaging/c-example/points.c $(pkg-config --static --cflags --libs outbox-static)
    check_glibc check_c "$tmp/points-baseline"
    # And the shared .pc with --static against a tree holding only the archive (as a
    # static-only install has it).
    mkdir -p "$tmp/static-only/lib/pkgconfig" "$tmp/static-only/include"
    cp "$prefix/lib/liboutbox.a" "$tmp/static-only/lib/"
    cp "$prefix/lib/pkgconfig/outbox.pc" "$tmp/static-only/lib/pkgconfig/"
    cp "$prefix/include/outbox.h" "$tmp/static-only/include/"
    # shellcheck disable=SC2046
    gcc "${cflags[@]}" -o "$tmp/points-static2" packaging/c-example/points.c \
        $(PKG_CONFIG_PATH="$tmp/static-only/lib/pkgconfig" pkg-config --static --cflags --libs outbox)

    local out
    out=$(LD_LIBRARY_PATH="$prefix/lib" "$tmp/points")
    [ "$out" = "liboutbox $version" ] || { say "check_c: points printed '$out'"; exit 1; }
    out=$(env -u LD_LIBRARY_PATH "$tmp/points-static2")
    [ "$out" = "liboutbox $version" ] || { say "check_c: points-static2 printed '$out'"; exit 1; }
    out=$(env -u LD_LIBRARY_PATH "$tmp/points-baseline")
    [ "$out" = "liboutbox $version" ] || { say "check_c: points-baseline printed '$out'"; exit 1; }

    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE $db"
    # The static program migrates and enqueues (publisher=none) ...
    env -u LD_LIBRARY_PATH "$tmp/points-static" "$server/$db"
    # ... and the shared one relays through RocketMQ when a name server answers.
    namesrv="${OUTBOX_TEST_NAMESRV:-127.0.0.1:9876}"
    if (exec 3<>"/dev/tcp/${namesrv%:*}/${namesrv#*:}") 2>/dev/null; then
        LD_LIBRARY_PATH="$prefix/lib" "$tmp/points" "$server/$db" "$namesrv" "outbox_rel_c_$$"
    else
        say "check_c: no name server on $namesrv (scripts/rocketmq start): relaying not checked, only enqueueing"
        LD_LIBRARY_PATH="$prefix/lib" "$tmp/points" "$server/$db"
    fi
    say "check_c: $name.tar.gz: pkg-config builds, shared and static programs run"
)
