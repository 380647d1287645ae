# Java users: what Maven Central takes, in $ARTIFACTS/java/ (built with javac, jar and javadoc from
# the JDK; no Maven, no network):
#
#   outbox-<version>.jar           the classes and the native library for linux-x86_64
#                                  (io/outbox/native/linux-x86_64/liboutbox.so, --features
#                                  jni,rocketmq, the dist profile (fat LTO: Cargo.toml), stripped,
#                                  with its SHA-256), extracted and loaded
#                                  at run time (bindings/java/build.sh --native)
#   outbox-<version>-sources.jar   bindings/java/src/main/java
#   outbox-<version>-javadoc.jar   javadoc -Xdoclint:all -Werror: not one warning
#   outbox-<version>.pom           bindings/java/pom.xml (its version must be Cargo.toml's)
#   *.md5, *.sha1                  the checksums Central asks for (signing with a key is the
#                                  publisher's step, not this script's)
#
# The native library is built into its own target dir ($OUTBOX_RELEASE_TARGET/jni): with the
# features jni,rocketmq in the shared one it would rebuild the crate every time the C tarball's
# library (rocketmq alone, the same profile) and this one alternate.
#
# check_java: the four files hold what they should, the pom is well-formed XML naming this
# version, the javadoc of the sources jar as published has no warning, and
# packaging/java-example/Points.java runs with the jar alone on the class path (no library path,
# no JDBC driver): it loads the library the jar carries, migrates a database of its own (dropped
# afterwards), enqueues and, when a name server answers, relays through RocketMQ.

java_version() { sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1; }

java_need_jdk() {
    command -v javac >/dev/null 2>&1 && command -v javadoc >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
}

release_java() {
    local version out stage target lib f
    version=$(java_version)
    out="$ARTIFACTS/java"
    target="$OUTBOX_RELEASE_TARGET/jni"
    java_need_jdk
    apt_install binutils
    # The shared library alone (no static archive to LTO as well), with the dist profile, for the
    # glibc baseline.
    release_cargo "$target" rustc --profile dist --lib --crate-type cdylib --features jni,rocketmq
    lib="$target/$RELEASE_TRIPLE/dist/liboutbox.so"

    rm -rf "$out"
    mkdir -p "$out"
    stage=$(mktemp -d)
    # The jar with the library inside (build.sh strips it and writes its hash).
    bindings/java/build.sh --native "$lib" --out "$stage/jar" >/dev/null
    cp "$stage/jar/outbox.jar" "$out/outbox-$version.jar"
    # The sources as they are, with a manifest.
    jar --create --file "$out/outbox-$version-sources.jar" -C bindings/java/src/main/java .
    # The javadoc, refused on any warning (missing comments, @param, @return, broken links, HTML).
    mapfile -t sources < <(find bindings/java/src/main/java -name '*.java' | sort)
    if ! javadoc -Xdoclint:all -Werror -quiet --release 11 -encoding UTF-8 -docencoding UTF-8 -charset UTF-8 \
        -windowtitle "outbox $version" -doctitle "outbox $version: the Java binding" \
        -d "$stage/javadoc" "${sources[@]}" >"$stage/javadoc.log" 2>&1; then
        say "release_java: javadoc warned or failed:"
        cat "$stage/javadoc.log" >&2
        rm -rf "$stage"
        return 1
    fi
    if grep -q . "$stage/javadoc.log"; then
        say "release_java: javadoc said something (want nothing):"
        cat "$stage/javadoc.log" >&2
        rm -rf "$stage"
        return 1
    fi
    jar --create --file "$out/outbox-$version-javadoc.jar" -C "$stage/javadoc" .
    cp bindings/java/pom.xml "$out/outbox-$version.pom"
    rm -rf "$stage"
    for f in "$out"/outbox-"$version"*; do
        md5sum "$f" | cut -d' ' -f1 >"$f.md5"
        sha1sum "$f" | cut -d' ' -f1 >"$f.sha1"
    done
    say "built $out: $(cd "$out" && ls outbox-"$version"*.jar outbox-"$version".pom | tr '\n' ' ')"

    touch "$ARTIFACTS/sizes.txt"
    sed -i -E '/^outbox-[^ ]*(-sources|-javadoc)?\.jar /d' "$ARTIFACTS/sizes.txt"
    for f in "outbox-$version.jar" "outbox-$version-sources.jar" "outbox-$version-javadoc.jar"; do
        echo "$f $(stat -c %s "$out/$f")" >>"$ARTIFACTS/sizes.txt"
    done
}

check_java() (
    set -euo pipefail
    local version out jar server namesrv
    version=$(java_version)
    out="$ARTIFACTS/java"
    jar="$out/outbox-$version.jar"
    java_need_jdk
    ensure_mariadb
    # Not local: the EXIT trap reads them (the subshell keeps them from leaking).
    tmp=$(mktemp -d)
    db="outbox_rel_java_$$_$RANDOM"
    cleanup() {
        mariadb -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
        rm -rf "$tmp"
    }
    trap cleanup EXIT
    fail() { say "check_java: $*"; exit 1; }

    local f
    for f in "outbox-$version.jar" "outbox-$version-sources.jar" "outbox-$version-javadoc.jar" "outbox-$version.pom"; do
        [ -f "$out/$f" ] || fail "no $out/$f (scripts/release java builds it)"
        [ "$(sha1sum "$out/$f" | cut -d' ' -f1)" = "$(cat "$out/$f.sha1")" ] || fail "$f.sha1 does not match"
        [ "$(md5sum "$out/$f" | cut -d' ' -f1)" = "$(cat "$out/$f.md5")" ] || fail "$f.md5 does not match"
    done
    jar --list --file "$jar" >"$tmp/main.list"
    for f in META-INF/LICENSE META-INF/NOTICE io/outbox/Outbox.class io/outbox/native/linux-x86_64/liboutbox.so io/outbox/native/linux-x86_64/liboutbox.so.sha256; do
        grep -qx "$f" "$tmp/main.list" || fail "$f missing from outbox-$version.jar"
    done
    jar --list --file "$out/outbox-$version-sources.jar" | grep -qx io/outbox/Outbox.java || fail "no io/outbox/Outbox.java in the sources jar"
    jar --list --file "$out/outbox-$version-javadoc.jar" >"$tmp/doc.list"
    grep -qx index.html "$tmp/doc.list" && grep -qx io/outbox/Outbox.html "$tmp/doc.list" || fail "the javadoc jar has no index.html or io/outbox/Outbox.html"

    # The pom: well-formed (Maven refuses, for one, two dashes inside a comment), this version.
    python3 - "$out/outbox-$version.pom" "$version" <<'PY' || fail "outbox-$version.pom: see above"
import sys, xml.etree.ElementTree as ET
ns = {"m": "http://maven.apache.org/POM/4.0.0"}
root = ET.parse(sys.argv[1]).getroot()
want = {"groupId": "io.outbox", "artifactId": "outbox", "version": sys.argv[2]}
for tag, value in want.items():
    got = root.findtext("m:" + tag, namespaces=ns)
    if got != value:
        sys.exit(f"pom {tag} is {got!r}, not {value!r}")
for tag in ("name", "description", "url", "licenses", "developers", "scm"):
    if root.find("m:" + tag, ns) is None:
        sys.exit(f"pom has no <{tag}> (Maven Central requires it)")
PY

    # The javadoc of the sources as published: not one warning.
    mkdir -p "$tmp/src"
    (cd "$tmp/src" && jar --extract --file "$out/outbox-$version-sources.jar")
    mapfile -t sources < <(find "$tmp/src" -name '*.java' | sort)
    javadoc -Xdoclint:all -Werror -quiet --release 11 -encoding UTF-8 -d "$tmp/javadoc" "${sources[@]}" >"$tmp/javadoc.log" 2>&1 \
        || fail "javadoc on the sources jar: $(cat "$tmp/javadoc.log")"
    grep -q . "$tmp/javadoc.log" && fail "javadoc on the sources jar said: $(cat "$tmp/javadoc.log")"

    mkdir -p "$tmp/native"
    (cd "$tmp/native" && jar --extract --file "$jar" io/outbox/native/linux-x86_64/liboutbox.so)
    check_glibc check_java "$tmp/native/io/outbox/native/linux-x86_64/liboutbox.so"

    # The jar alone: it loads the library it carries (extracted under a temporary directory).
    local java=(java -Djava.io.tmpdir="$tmp" -cp "$jar")
    local line
    line=$(env -u OUTBOX_LIBRARY_PATH -u LD_LIBRARY_PATH java -Djava.io.tmpdir="$tmp" -jar "$jar")
    case "$line" in
        "outbox $version [jni, rocketmq] loaded from $tmp/"*"(extracted from /io/outbox/native/linux-x86_64/liboutbox.so)") ;;
        *) fail "java -jar outbox-$version.jar printed: $line" ;;
    esac
    server="${OUTBOX_TEST_MYSQL:-mysql://root@127.0.0.1:3306}"
    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE $db"
    namesrv="${OUTBOX_TEST_NAMESRV:-127.0.0.1:9876}"
    if (exec 3<>"/dev/tcp/${namesrv%:*}/${namesrv#*:}") 2>/dev/null; then
        env -u OUTBOX_LIBRARY_PATH -u LD_LIBRARY_PATH "${java[@]}" packaging/java-example/Points.java \
            "$server/$db" "$namesrv" "outbox_rel_java_$$"
    else
        say "check_java: no name server on $namesrv (scripts/rocketmq start): relaying not checked, only enqueueing"
        env -u OUTBOX_LIBRARY_PATH -u LD_LIBRARY_PATH "${java[@]}" packaging/java-example/Points.java "$server/$db"
    fi
    say "check_java: outbox-$version.jar (+ sources, javadoc, pom): loads its own library, javadoc without a warning"
)
