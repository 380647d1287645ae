#!/usr/bin/env bash
# Java binding tests: JUnit 4 and MariaDB Connector/J from Debian, against real MariaDB.
#
#   bindings/java/run-tests.sh [TestClass ...]
#
# Native library: $OUTBOX_LIB_DIR/liboutbox.so when OUTBOX_LIB_DIR is set (used as is);
# otherwise `cargo build --features jni` (plus $OUTBOX_CARGO_FEATURES, e.g. "rocketmq") into
# ${CARGO_TARGET_DIR:-$HOME/.cache/outbox/target-jni} and its debug/ directory.
# Database: $OUTBOX_TEST_MYSQL (default mysql://root@127.0.0.1:3306); each test class creates
# and drops its own database outbox_j_<random>. Publish and consumer tests need the library built
# with rocketmq and a name server on $OUTBOX_TEST_NAMESRV (default 127.0.0.1:9876); else skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
jars=/usr/share/java
out="$here/build"

need_apt=()
command -v javac >/dev/null || need_apt+=(openjdk-17-jdk-headless)
[ -f "$jars/junit4.jar" ] || need_apt+=(junit4)
[ -f "$jars/hamcrest-core.jar" ] || need_apt+=(libhamcrest-java)
[ -f "$jars/mariadb-java-client.jar" ] || need_apt+=(libmariadb-java)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "run-tests.sh: installing ${need_apt[*]}"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
fi

if [ -n "${OUTBOX_LIB_DIR:-}" ]; then
    lib_dir="$OUTBOX_LIB_DIR"
else
    target="${CARGO_TARGET_DIR:-$HOME/.cache/outbox/target-jni}"
    features="jni${OUTBOX_CARGO_FEATURES:+,${OUTBOX_CARGO_FEATURES// /,}}"
    echo "run-tests.sh: cargo build --features $features (target $target)"
    (cd "$root" && CARGO_TARGET_DIR="$target" cargo build --lib --features "$features")
    lib_dir="$target/debug"
fi
lib="$lib_dir/liboutbox.so"
if [ ! -f "$lib" ]; then
    echo "run-tests.sh: no $lib; build it with: cargo build --features jni (or unset OUTBOX_LIB_DIR)" >&2
    exit 1
fi

"$here/build.sh"
# The one-artifact jar (the library inside), for BundledLibraryTest.
"$here/build.sh" --native "$lib" --out "$out/bundled" >/dev/null

cp_libs="$jars/junit4.jar:$jars/hamcrest-core.jar:$jars/mariadb-java-client.jar"
rm -rf "$out/test-classes"
mkdir -p "$out/test-classes"
mapfile -t tests < <(find "$here/src/test/java" -name '*.java' | sort)
javac --release 11 -encoding UTF-8 -Xlint:all,-processing -d "$out/test-classes" -cp "$out/outbox.jar:$cp_libs" "${tests[@]}"

if [ "$#" -gt 0 ]; then
    classes=()
    for c in "$@"; do classes+=("io.outbox.${c#io.outbox.}"); done
else
    mapfile -t classes < <(cd "$here/src/test/java" && find . -name '*Test.java' | sed 's|^\./||; s|\.java$||; s|/|.|g' | sort)
fi

echo "run-tests.sh: library $lib"
exec java -Xcheck:jni -Djava.library.path="$lib_dir" -Doutbox.test.bundled.jar="$out/bundled/outbox.jar" -cp "$out/outbox.jar:$out/test-classes:$cp_libs" \
    io.outbox.RunAll "${classes[@]}"
