#!/usr/bin/env bash
# Runs the Go binding's tests (go test, then go test -race; they live in the module tests/, so
# that the MySQL driver they need is never required by the binding's users) against real MariaDB
# and the built library, then builds a program using the binding as its users would: from a
# vendor directory, from the module cache (through a file:// module proxy made here), and linked
# statically with liboutbox.a (-tags outbox_static) when the library directory has it. The
# released module, with its prebuilt library and no Rust toolchain, is checked by
# scripts/release go.
#
#   bindings/go/run-tests.sh [go test args...]
#
# Environment:
#   OUTBOX_LIB_DIR     directory holding liboutbox.so (default: $CARGO_TARGET_DIR/debug, or
#                      $HOME/.cache/outbox/target-ffi/debug when CARGO_TARGET_DIR is unset)
#   OUTBOX_TEST_MYSQL  server URL without a database (default mysql://root@127.0.0.1:3306)
#   OUTBOX_GO_RACE     0 to skip the -race pass (default 1)
#
# Linking: a checkout has no prebuilt library (lib/linux-amd64/liboutbox.a comes with a release),
# so everything here builds with -tags outbox_dynamic (cgo links -loutbox); CGO_LDFLAGS adds -L
# and an rpath to $OUTBOX_LIB_DIR, so the test binary finds liboutbox.so without LD_LIBRARY_PATH.
# Go and the MySQL driver come from Debian (installed here when missing); no module proxy is used
# (GOPROXY=off, the driver through the replace directive in go.mod).
set -euo pipefail
cd "$(dirname "$0")"

if [ -n "${OUTBOX_LIB_DIR:-}" ]; then
    LIB_DIR=$OUTBOX_LIB_DIR
elif [ -n "${CARGO_TARGET_DIR:-}" ]; then
    LIB_DIR=$CARGO_TARGET_DIR/debug
else
    LIB_DIR=$HOME/.cache/outbox/target-ffi/debug
fi
LIB_DIR=$(cd "$LIB_DIR" 2>/dev/null && pwd) || { echo "bindings/go: library dir ${LIB_DIR} does not exist (cargo build first)" >&2; exit 1; }
[ -f "$LIB_DIR/liboutbox.so" ] || { echo "bindings/go: $LIB_DIR/liboutbox.so is missing (cargo build first)" >&2; exit 1; }

DRIVER=/usr/share/gocode/src/github.com/go-sql-driver/mysql
if ! command -v go >/dev/null 2>&1 || [ ! -d "$DRIVER" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bindings/go: installing golang-go and golang-github-go-sql-driver-mysql-dev" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go golang-github-go-sql-driver-mysql-dev >/dev/null
    else
        echo "bindings/go: needs Go and $DRIVER (apt-get install golang-go golang-github-go-sql-driver-mysql-dev)" >&2
        exit 1
    fi
fi

export CGO_ENABLED=1
export CGO_LDFLAGS="-L$LIB_DIR -Wl,-rpath,$LIB_DIR ${CGO_LDFLAGS:-}"
export GOFLAGS='-mod=mod -tags=outbox_dynamic' GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$HOME/.cache/outbox/go-build}
export GOPATH=${GOPATH:-$HOME/.cache/outbox/gopath}

echo "bindings/go: $(go version), library $LIB_DIR/liboutbox.so"
cmp -s outbox.h ../../include/outbox.h || { echo "bindings/go: outbox.h differs from include/outbox.h (OUTBOX_BLESS_HEADER=1 cargo test --test header)" >&2; exit 1; }
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "bindings/go: not gofmt-clean: $unformatted" >&2; exit 1; }
go vet ./...
# Without cgo the build fails with one message that says what it needs (nocgo.go).
nocgo=$(CGO_ENABLED=0 go build ./... 2>&1) && { echo "bindings/go: built without cgo" >&2; exit 1; }
case "$nocgo" in
    *outbox_needs_cgo__build_with_CGO_ENABLED_1_and_a_C_compiler*) ;;
    *) echo "bindings/go: CGO_ENABLED=0 does not say that cgo is needed: $nocgo" >&2; exit 1 ;;
esac
[ "$(printf '%s\n' "$nocgo" | grep -c 'undefined:')" = 1 ] \
    || { echo "bindings/go: CGO_ENABLED=0 reports more than the missing cgo: $nocgo" >&2; exit 1; }
(
    cd tests
    go vet ./...
    go test -count=1 -v "$@" ./...
    if [ "${OUTBOX_GO_RACE:-1}" != 0 ]; then
        go test -count=1 -race "$@" ./...
    fi
)

# A user's program, built from a vendor directory, from the module cache, and statically.
here=$(pwd)
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/app"
cat >"$work/app/main.go" <<'GO'
package main

import (
	"fmt"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

func main() { fmt.Println("outbox", outbox.Version(), outbox.InsertParams()) }
GO
module=github.com/outbox-rs/outbox/bindings/go
printf 'module example.com/app\n\ngo 1.19\n\nrequire %s v0.1.0\n\nreplace %s => %s\n' "$module" "$module" "$here" >"$work/app/go.mod"
(cd "$work/app" && go mod vendor && [ -f "vendor/$module/outbox.h" ] && [ -f "vendor/$module/lib/linux-amd64/doc.go" ] \
    && GOFLAGS='-mod=vendor -tags=outbox_dynamic' go build -o app-vendored . && ./app-vendored) \
    || { echo "bindings/go: building from a vendor directory failed" >&2; exit 1; }
echo "bindings/go: vendored build ok"

# The module as a proxy serves it (zip of the module's files, without tests/, a module of its
# own), then built from the module cache.
proxy="$work/proxy/$module/@v"
mkdir -p "$proxy"
cp go.mod "$proxy/v0.1.0.mod"
echo '{"Version":"v0.1.0"}' >"$proxy/v0.1.0.info"
echo v0.1.0 >"$proxy/list"
python3 - "$here" "$proxy/v0.1.0.zip" "$module@v0.1.0/" <<'PY'
import os, sys, zipfile
root, dest, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(dest, "w") as z:
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not os.path.exists(os.path.join(d, x, "go.mod")))
        for name in sorted(files):
            path = os.path.join(d, name)
            if os.path.isfile(path) and not os.path.islink(path) and not name.endswith((".sh", ".test")):
                z.write(path, prefix + os.path.relpath(path, root))
PY
mkdir -p "$work/cached"
cp "$work/app/main.go" "$work/cached/"
printf 'module example.com/cached\n\ngo 1.19\n\nrequire %s v0.1.0\n' "$module" >"$work/cached/go.mod"
(cd "$work/cached" && GOPATH="$work/gopath" GOPROXY="file://$work/proxy" GONOSUMDB=github.com/outbox-rs \
    go build -o app-cached . && ./app-cached && GOPATH="$work/gopath" go list -m -f '{{.Dir}}' "$module" | grep -q "$work/gopath/pkg/mod") \
    || { echo "bindings/go: building from the module cache failed" >&2; exit 1; }
echo "bindings/go: module-cache build ok"

if [ -f "$LIB_DIR/liboutbox.a" ]; then
    (cd "$work/app" && CGO_LDFLAGS="-L$LIB_DIR" GOFLAGS=-mod=vendor go build -tags outbox_static -ldflags=-s -o app-static . \
        && ! ldd app-static | grep -q liboutbox && env -u LD_LIBRARY_PATH ./app-static \
        && echo "bindings/go: static build ok ($(du -h app-static | cut -f1), needs: $(ldd app-static | awk '{print $1}' | tr '\n' ' '))") \
        || { echo "bindings/go: static build failed" >&2; exit 1; }
else
    echo "bindings/go: no $LIB_DIR/liboutbox.a; static build not checked"
fi
