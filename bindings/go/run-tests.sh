#!/usr/bin/env bash
# Runs the Go binding's tests (go test, then go test -race) against real MariaDB and the built
# library.
#
#   bindings/go/run-tests.sh [go test args...]
#
# Environment:
#   OUTBOX_LIB_DIR     directory holding liboutbox.so (default: $CARGO_TARGET_DIR/debug, or
#                      $HOME/.cache/outbox/target-ffi/debug when CARGO_TARGET_DIR is unset)
#   OUTBOX_TEST_MYSQL  server URL without a database (default mysql://root@127.0.0.1:3306)
#   OUTBOX_GO_RACE     0 to skip the -race pass (default 1)
#
# Linking: cgo links -loutbox; CGO_LDFLAGS adds -L and an rpath to $OUTBOX_LIB_DIR, so the test
# binary finds liboutbox.so without LD_LIBRARY_PATH. Go and the MySQL driver come from Debian
# (installed here when missing); no module proxy is used (GOPROXY=off, the driver through the
# replace directive in go.mod).
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
export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$HOME/.cache/outbox/go-build}
export GOPATH=${GOPATH:-$HOME/.cache/outbox/gopath}

echo "bindings/go: $(go version), library $LIB_DIR/liboutbox.so"
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "bindings/go: not gofmt-clean: $unformatted" >&2; exit 1; }
go vet ./...
go test -count=1 -v "$@" ./...
if [ "${OUTBOX_GO_RACE:-1}" != 0 ]; then
    go test -count=1 -race "$@" ./...
fi
