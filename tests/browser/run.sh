#!/usr/bin/env bash
# The operator console in headless Chromium (tests/browser/console_test.py): installs chromium,
# chromium-driver and python3-selenium when missing (Debian's packages), then drives a real
# outboxd (console on a free port, its own database, the broker on 127.0.0.1:9876) through
# logging in, filtering, replaying, discarding, pausing and what must be refused.
#
#   tests/browser/run.sh                    the suite
#   OUTBOX_SCREENSHOTS=docs/console tests/browser/run.sh   also refresh docs/console.md's images
#
# Environment: OUTBOXD (default $CARGO_TARGET_DIR/debug/outboxd, built with
# --features rocketmq,daemon), OUTBOX_TEST_MYSQL, OUTBOX_TEST_NAMESRV, OUTBOX_KEEP=1 to keep the
# database and outboxd's log of a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

apt_install chromium chromium-driver python3-selenium
export OUTBOXD="${OUTBOXD:-$CARGO_TARGET_DIR/debug/outboxd}"
[ -x "$OUTBOXD" ] || { echo "tests/browser: $OUTBOXD is missing (cargo build --features rocketmq,daemon --bins)" >&2; exit 1; }
# Debian's python3 (with its selenium), whatever python3 comes first on PATH.
exec /usr/bin/python3 tests/browser/console_test.py "$@"
