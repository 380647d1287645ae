#!/usr/bin/env bash
# Builds the C ABI tests (tests/c/*.c) with gcc against the committed include/outbox.h and the
# built cdylib, and runs each one twice against real MariaDB: plainly, then under
#   valgrind --leak-check=full --error-exitcode=1
# (zero leaks and zero errors required). Every run gets its own database outbox_c_<random>,
# migrated by the library (outbox_migrate) and dropped at the end.
#
#   tests/c/run.sh [TEST_NAME_FILTER]
#
# Environment:
#   OUTBOX_LIB_DIR       directory holding liboutbox.so (default: $CARGO_TARGET_DIR/debug, or
#                        $HOME/.cache/outbox/target-ffi/debug when CARGO_TARGET_DIR is unset);
#                        build it with `cargo build` (add `--features rocketmq` for the
#                        publishing check, which also needs a name server on 127.0.0.1:9876)
#   OUTBOX_TEST_MYSQL    server URL without a database (default mysql://root@127.0.0.1:3306)
#   OUTBOX_C_VALGRIND    0 to skip the valgrind pass (default 1)
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -n "${OUTBOX_LIB_DIR:-}" ]; then
    LIB_DIR=$OUTBOX_LIB_DIR
elif [ -n "${CARGO_TARGET_DIR:-}" ]; then
    LIB_DIR=$CARGO_TARGET_DIR/debug
else
    LIB_DIR=$HOME/.cache/outbox/target-ffi/debug
fi
LIB_DIR=$(cd "$LIB_DIR" 2>/dev/null && pwd) || { echo "tests/c: library dir ${LIB_DIR} does not exist (cargo build first)" >&2; exit 1; }
[ -f "$LIB_DIR/liboutbox.so" ] || { echo "tests/c: $LIB_DIR/liboutbox.so is missing (cargo build first)" >&2; exit 1; }
FILTER=${1:-}
VALGRIND=${OUTBOX_C_VALGRIND:-1}

# mysql://user[:password]@host[:port]
SERVER=${OUTBOX_TEST_MYSQL:-mysql://root@127.0.0.1:3306}
if [[ ! $SERVER =~ ^mysql://([^:@/]+)(:([^@/]*))?@([^:/]+)(:([0-9]+))?/?$ ]]; then
    echo "tests/c: cannot parse OUTBOX_TEST_MYSQL=$SERVER (want mysql://user[:password]@host[:port])" >&2
    exit 1
fi
DB_USER=${BASH_REMATCH[1]} DB_PASS=${BASH_REMATCH[3]} DB_HOST=${BASH_REMATCH[4]} DB_PORT=${BASH_REMATCH[6]:-3306}
CLIENT=$(command -v mariadb || command -v mysql) || { echo "tests/c: the mariadb client is needed to create the test databases" >&2; exit 1; }
sql() { MYSQL_PWD=$DB_PASS "$CLIENT" -h "$DB_HOST" -P "$DB_PORT" -u "$DB_USER" -e "$1"; }

BUILD=$(mktemp -d)
DATABASES=()
cleanup() {
    for db in "${DATABASES[@]}"; do sql "DROP DATABASE IF EXISTS $db" || true; done
    rm -rf "$BUILD"
}
trap cleanup EXIT

CFLAGS=(-std=c11 -D_DEFAULT_SOURCE -g -O0 -Wall -Wextra -Werror -pedantic -Iinclude)
echo "tests/c: library $LIB_DIR/liboutbox.so"

# The header alone must compile as C99 and as C++.
printf '#include "outbox.h"\nint main(void) { return outbox_version() == 0; }\n' >"$BUILD/h.c"
gcc -std=c99 -pedantic -Wall -Wextra -Werror -Iinclude -fsyntax-only "$BUILD/h.c"
if command -v g++ >/dev/null 2>&1; then
    g++ -std=c++11 -Wall -Wextra -Werror -Iinclude -fsyntax-only -x c++ "$BUILD/h.c"
fi

tests=()
for src in tests/c/test_*.c; do
    name=$(basename "$src" .c)
    gcc "${CFLAGS[@]}" -o "$BUILD/$name" "$src" -L"$LIB_DIR" -Wl,-rpath,"$LIB_DIR" -loutbox -lpthread
    tests+=("$name")
done

passed=0
failed=0
run_one() { # label, command...
    local label=$1
    shift
    local db
    db=outbox_c_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
    sql "CREATE DATABASE $db"
    DATABASES+=("$db")
    echo "--- $label (database $db)"
    if OUTBOX_TEST_DB_URL="mysql://${DB_USER}${DB_PASS:+:$DB_PASS}@${DB_HOST}:${DB_PORT}/$db" "$@"; then
        passed=$((passed + 1))
    else
        echo "--- $label FAILED"
        failed=$((failed + 1))
    fi
    sql "DROP DATABASE IF EXISTS $db" || true
}

for t in "${tests[@]}"; do
    run_one "$t" "$BUILD/$t" $FILTER
done

if [ "$VALGRIND" != 0 ]; then
    command -v valgrind >/dev/null 2>&1 || { echo "tests/c: valgrind is not installed (apt-get install valgrind, or OUTBOX_C_VALGRIND=0)" >&2; exit 1; }
    for t in "${tests[@]}"; do
        run_one "$t under valgrind" valgrind -q --num-callers=40 --leak-check=full --show-leak-kinds=definite,indirect,possible \
            --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=1 \
            --suppressions=tests/c/valgrind.supp --gen-suppressions=all "$BUILD/$t" $FILTER
    done
fi

echo "c: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
