#!/usr/bin/env bash
# Builds the Java binding's jar with javac and jar (no Maven, no network).
#
#   bindings/java/build.sh [--native LIB] [--out DIR]
#
#   --native LIB  put LIB (a liboutbox.so built with `cargo build --release --features jni`) into
#                 the jar for this platform, io/outbox/native/linux-x86_64/liboutbox.so, with its
#                 SHA-256 beside it: the one-artifact jar. At run time the jar extracts it once
#                 (checked by hash) and loads it when no -Doutbox.library.path is given. A library
#                 with debug info is stripped into the jar (the original is left as it is).
#   --out DIR     where to write (default bindings/java/build); may be outside the source tree.
#
# Without --native the jar holds only the classes and loads the library from
# -Doutbox.library.path, $OUTBOX_LIBRARY_PATH or java.library.path. `java -jar outbox.jar`
# prints what it loaded and from where.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/build"
native=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --native) native="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "build.sh: unknown argument $1 (want --native LIB, --out DIR)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../../Cargo.toml" | head -n 1)"

command -v javac >/dev/null || { echo "build.sh: javac not found (install a JDK 11+, e.g. apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }

classes="$out/classes"
rm -rf "$classes"
mkdir -p "$classes"
mapfile -t sources < <(find "$here/src/main/java" -name '*.java' | sort)
javac --release 11 -encoding UTF-8 -Xlint:all -Werror -d "$classes" "${sources[@]}"

manifest="$out/MANIFEST.MF"
cat >"$manifest" <<MF
Main-Class: io.outbox.Outbox
Automatic-Module-Name: io.outbox
Implementation-Title: outbox
Implementation-Version: ${version}
MF
cp -r "$here/src/main/java/io" "$classes/" 2>/dev/null || true # sources beside the classes

if [ -n "$native" ]; then
    [ -f "$native" ] || { echo "build.sh: --native $native: no such file" >&2; exit 1; }
    case "$(uname -s)-$(uname -m)" in
        Linux-x86_64) platform=linux-x86_64 ;;
        Linux-aarch64) platform=linux-aarch64 ;;
        *) echo "build.sh: no bundle layout for $(uname -s)-$(uname -m)" >&2; exit 1 ;;
    esac
    dest="$classes/io/outbox/native/$platform"
    mkdir -p "$dest"
    if command -v strip >/dev/null 2>&1; then
        strip --strip-debug -o "$dest/liboutbox.so" "$native"
    else
        cp "$native" "$dest/liboutbox.so"
    fi
    (cd "$dest" && sha256sum liboutbox.so >liboutbox.so.sha256)
    echo "build.sh: bundled $native as io/outbox/native/$platform/liboutbox.so ($(du -h "$dest/liboutbox.so" | cut -f1))"
fi
# The licence, and (for a jar with the library) what the library links in.
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$classes/META-INF"
cp "$root/LICENSE" "$classes/META-INF/LICENSE"
[ -z "$native" ] || cp "$root/NOTICE" "$classes/META-INF/NOTICE"
jar --create --file "$out/outbox.jar" --manifest "$manifest" -C "$classes" .
echo "built $out/outbox.jar (outbox ${version}$([ -n "$native" ] && echo ", with the native library"))"
