#!/usr/bin/env bash
# Compares outboxd builds by what a user runs: each binary drains N events seeded into a table of
# its own through this machine's MariaDB and broker (`outboxd run`, its defaults), in R rounds
# taking turns; prints events/s per round and the median per binary.
#
#   benches/outboxd-drain.sh [-n EVENTS] [-r ROUNDS] OUTBOXD...
#
# The rate counts from the start of `outboxd run` to the table's last row gone (sent rows are
# deleted by default), start-up included. Needs MariaDB on 127.0.0.1:3306 and a name server on
# $OUTBOX_TEST_NAMESRV (default 127.0.0.1:9876; `scripts/rocketmq start`).
set -euo pipefail

events=100000
rounds=3
while getopts "n:r:" opt; do
    case $opt in
        n) events=$OPTARG ;;
        r) rounds=$OPTARG ;;
        *) sed -n '2,10p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
namesrv=${OUTBOX_TEST_NAMESRV:-127.0.0.1:9876}
sql() { mariadb -h 127.0.0.1 -P 3306 -u root -N -e "$1"; }

# drain BIN ROUND: prints the events/s of one run.
drain() {
    local bin=$1 db="outbox_drain_$$_$2" url pid start left end
    url="mysql://root@127.0.0.1:3306/$db"
    sql "CREATE DATABASE $db"
    "$bin" --set "db.url=$url" migrate >/dev/null 2>&1
    # The library's INSERT, for seq_1_to_N of MariaDB's Sequence engine.
    mariadb -h 127.0.0.1 -P 3306 -u root -D "$db" -e \
        "INSERT INTO t_event_record (biz_no, event_type, payload, topic, tag, headers, status, retry_count, next_retry_time, event_key)
         SELECT CONCAT('ORD-', seq), 'ORDER_CREATED', CONCAT('{\"n\":', seq, '}'), NULL, NULL, NULL, 'WAIT', 0, NOW(3), UUID()
         FROM seq_1_to_$events"
    [ "$(sql "SELECT COUNT(*) FROM $db.t_event_record")" = "$events" ] || { echo "seeding $db failed" >&2; exit 1; }
    start=$(date +%s.%N)
    "$bin" --set "db.url=$url" --set "rocketmq.namesrv=$namesrv" --set "topic=DRAIN_BENCH_$$" run \
        >"/tmp/outboxd-drain-$$.log" 2>&1 &
    pid=$!
    while :; do
        left=$(sql "SELECT COUNT(*) FROM $db.t_event_record")
        [ "$left" = 0 ] && break
        kill -0 "$pid" 2>/dev/null || { echo "$bin exited; its log:" >&2; cat "/tmp/outboxd-drain-$$.log" >&2; exit 1; }
        sleep 0.05
    done
    end=$(date +%s.%N)
    kill "$pid"
    wait "$pid" || true
    sql "DROP DATABASE $db"
    echo "$events / ($end - $start)" | bc -l | xargs printf '%.0f\n'
}

declare -A rates
for round in $(seq 1 "$rounds"); do
    i=0
    for bin in "$@"; do
        i=$((i + 1))
        r=$(drain "$bin" "${round}_$i")
        rates[$i]="${rates[$i]:-} $r"
        printf 'round %d  %-70s %8d events/s\n' "$round" "$bin" "$r"
    done
done
i=0
for bin in "$@"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    median=$(printf '%s\n' ${rates[$i]} | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    printf 'median  %-70s %8d events/s  (rounds:%s)\n' "$bin" "$median" "${rates[$i]}"
done
