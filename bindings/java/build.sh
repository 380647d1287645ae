#!/usr/bin/env bash
# Builds bindings/java/build/outbox.jar with javac and jar (no Maven, no network).
#
#   bindings/java/build.sh
#
# The jar holds the io.outbox classes (Java 11 bytecode) and their sources; the native library
# (liboutbox.so, `cargo build --release --features jni`) is loaded at run time from
# java.library.path or -Doutbox.library.path. `java -jar outbox.jar` prints what it loaded.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/build"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../../Cargo.toml" | head -n 1)"

command -v javac >/dev/null || { echo "build.sh: javac not found (install a JDK 11+, e.g. apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }

rm -rf "$out/classes"
mkdir -p "$out/classes"
mapfile -t sources < <(find "$here/src/main/java" -name '*.java' | sort)
javac --release 11 -encoding UTF-8 -Xlint:all -Werror -d "$out/classes" "${sources[@]}"

manifest="$out/MANIFEST.MF"
cat >"$manifest" <<MF
Main-Class: io.outbox.Outbox
Automatic-Module-Name: io.outbox
Implementation-Title: outbox
Implementation-Version: ${version}
MF
cp -r "$here/src/main/java/io" "$out/classes/" 2>/dev/null || true # sources beside the classes
jar --create --file "$out/outbox.jar" --manifest "$manifest" -C "$out/classes" .
echo "built $out/outbox.jar (outbox ${version})"
