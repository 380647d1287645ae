#!/usr/bin/env bash
# The consumer with the inbox from C, Go and Java, one run: the same points handler (a credit
# INSERT and an upsert of the user's row, per message, in the consumer's transaction), the
# consumer's defaults, the release library, N events over 200 users relayed onto a topic of each
# program's own and read twice per program (a group of its own each time). The programs take
# turns for ROUNDS rounds; each rate is the first message processed to the last.
#
#   benches/by-language.sh [N] [ROUNDS]        (default 20000 events, 2 rounds; ~5 minutes)
#
# C: benches/by-language/consume.c. Go: BenchmarkConsumerCrossings
# (bindings/go/tests/bench_test.go; its StartConsumer lines). Java: io.outbox.ConsumerBench
# (bindings/java/src/test/java; its `start` lines). The batch handlers those two also run are
# printed, not compared. Needs MariaDB and the broker (scripts/rocketmq start).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

N=${1:-20000}
ROUNDS=${2:-2}
ensure_build_tools
ensure_mariadb
ensure_rocketmq
root=$(pwd)
say "building the release library (features rocketmq,jni) into $CARGO_TARGET_DIR"
cargo build --release --lib --features rocketmq,jni
LIB=$CARGO_TARGET_DIR/release
work=$(mktemp -d)
dbs=()
cleanup() {
    for db in "${dbs[@]}"; do mariadb -e "DROP DATABASE IF EXISTS $db" || true; done
    rm -rf "$work"
}
trap cleanup EXIT

gcc -std=c11 -D_DEFAULT_SOURCE -O2 -Wall -Wextra -Werror -Iinclude -o "$work/consume" benches/by-language/consume.c \
    -L"$LIB" -Wl,-rpath,"$LIB" -loutbox -lpthread
# The Java classes (the suite's build) and the Go test binary, built once.
OUTBOX_LIB_DIR=$LIB bindings/java/run-tests.sh ConfigTest >/dev/null
jars=/usr/share/java
(
    cd bindings/go/tests
    export CGO_ENABLED=1 CGO_LDFLAGS="-L$LIB -Wl,-rpath,$LIB" GOFLAGS='-mod=mod -tags=outbox_dynamic' GOPROXY=off \
        GOSUMDB=off GOTOOLCHAIN=local GOCACHE=${GOCACHE:-$HOME/.cache/outbox/go-build} \
        GOPATH=${GOPATH:-$HOME/.cache/outbox/gopath}
    go test -c -o "$work/gobench" .
)

run_c() {
    local db="outbox_bylang_c_$RANDOM$RANDOM"
    dbs+=("$db")
    mariadb -e "CREATE DATABASE $db"
    OUTBOX_TEST_DB_URL="mysql://root@127.0.0.1:3306/$db" RUST_LOG=warn "$work/consume" "$N" | awk '/msg\/s/ {print $2}'
}
run_go() {
    (cd bindings/go/tests && OUTBOX_BENCH_EVENTS=$N RUST_LOG=warn "$work/gobench" -test.run '^$' -test.bench ConsumerCrossings \
        -test.benchtime 1x) | awk '$1 == "StartConsumer" {print $2}'
}
run_java() {
    RUST_LOG=warn java -Djava.library.path="$LIB" -cp "bindings/java/build/outbox.jar:bindings/java/build/test-classes:$jars/mariadb-java-client.jar" \
        -Doutbox.bench.events="$N" io.outbox.ConsumerBench | awk '$1 == "start" {print $2}'
}

declare -A rates
for r in $(seq 1 "$ROUNDS"); do
    for lang in c go java; do
        say "round $r: $lang"
        got=$("run_$lang")
        [ -n "$got" ] || { echo "benches/by-language: no rate from $lang" >&2; exit 1; }
        echo "$got" | sed 's/^/    /'
        rates[$lang]="${rates[$lang]:-} $got"
    done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
c=$(echo "${rates[c]}" | median)
echo
echo "| consumer, the points handler per message ($N events, defaults) | median msg/s | of C | rates |"
echo "|---|---:|---:|---|"
for lang in c go java; do
    m=$(echo "${rates[$lang]}" | median)
    printf '| %s | %.0f | %.0f %% | %s |\n' "$lang" "$m" "$(echo "$m $c" | awk '{print 100 * $1 / $2}')" \
        "$(echo "${rates[$lang]}" | xargs | sed 's/ /, /g')"
done
