#!/usr/bin/env bash
# Checks the alerting rules and the dashboard that ship in deploy/.
#
#   deploy/check.sh                      promtool check rules + promtool test rules
#   deploy/check.sh SCRAPE [SCRAPE...]   also: the dashboard JSON parses, and every metric name in
#                                        the dashboard's and the rule file's PromQL is in one of
#                                        the saved /metrics scrapes (Prometheus or OpenMetrics
#                                        text, e.g. `curl -s http://outboxd:9464/metrics > a.txt`;
#                                        give a consumer service's scrape too for outbox_consumer_*)
#
# Installs the Debian package `prometheus` (for /usr/bin/promtool) when promtool is missing.
# Prints one line per failure and exits non-zero if there is any.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rules="$here/prometheus/outbox-rules.yml"
tests="$here/prometheus/outbox-rules.test.yml"
dashboard="$here/grafana/outbox-dashboard.json"

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

for scrape in "$@"; do
    [[ -r "$scrape" ]] || { echo "FAIL: cannot read scrape file $scrape" >&2; exit 2; }
done

if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found: installing the Debian package prometheus" >&2
    sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then sudo=(sudo); fi
    install() {
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    }
    if ! install 2>/dev/null; then
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        install
    fi
    # Only promtool is wanted: a Prometheus server the package may have started is stopped.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
        "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    command -v promtool >/dev/null 2>&1 || { echo "FAIL: promtool still missing after installing prometheus" >&2; exit 2; }
fi

echo "== promtool check rules ${rules#"$here/"}"
promtool check rules "$rules" || fail "promtool check rules $rules"
echo "== promtool test rules ${tests#"$here/"}"
promtool test rules "$tests" || fail "promtool test rules $tests"

if [[ $# -eq 0 ]]; then
    echo "(no scrape file given: the metric names of the dashboard and the rules are not checked)"
else
    echo "== metric names against $*"
    python3 - "$rules" "$dashboard" "$@" <<'PY' || failures=$((failures + 1))
import json
import re
import sys

rules_path, dashboard_path, scrapes = sys.argv[1], sys.argv[2], sys.argv[3:]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


# ---- names a scrape exposes, as Prometheus stores them
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SUFFIXES = {
    "counter": ["_total", "_created"],
    "histogram": ["_bucket", "_sum", "_count", "_created"],
    "gaugehistogram": ["_bucket", "_gsum", "_gcount"],
    "summary": ["", "_sum", "_count", "_created"],
    "info": ["_info"],
}
exposed = set()
for path in scrapes:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            m = re.match(r"#\s*TYPE\s+(" + NAME + r")\s+(\w+)", line)
            if m:
                name, kind = m.group(1), m.group(2).lower()
                if kind == "counter" and name.endswith("_total"):
                    exposed.add(name)  # Prometheus text format: TYPE foo_total counter
                    exposed.add(name[: -len("_total")] + "_created")
                    continue
                for suffix in SUFFIXES.get(kind, [""]):
                    exposed.add(name + suffix)
                continue
            if not line or line.startswith("#"):
                continue
            m = re.match(r"(" + NAME + r")\s*[{\s]", line + " ")
            if m:
                exposed.add(m.group(1))
if not exposed:
    fail("no metric names found in " + " ".join(scrapes))

# ---- metric names used by a PromQL expression
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan", "start", "end", "atan2",
}
NOT_METRICS = {"up", "ALERTS", "ALERTS_FOR_STATE"}


def metric_names(expr):
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', " ", expr)    # strings
    s = re.sub(r"#[^\n]*", " ", s)                                                # comments
    s = re.sub(r"\{[^{}]*\}", " ", s)                                             # label matchers
    s = re.sub(r"\[[^\[\]]*\]", " ", s)                                           # ranges, subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?[\w$]+", " ", s)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)                                      # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.:$])(" + NAME + r")(?![\w:])(\s*\()?", s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS or name in NOT_METRICS:
            continue  # functions, aggregations, keywords
        names.add(name)
    return names


# ---- the rule file: `expr:` (inline or block scalar) and `record:` values, without a YAML library
def rule_exprs(path):
    exprs, records = [], set()
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:-\s+)?(expr|record):\s*(.*?)\s*$", lines[i])
        i += 1
        if not m:
            continue
        start = i
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        if value[:1] in (">", "|"):
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            value = " ".join(block)
        else:
            value = re.sub(r"\s+#.*$", "", value)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
        if key == "record":
            records.add(value)
        else:
            exprs.append((start, value))
    return exprs, records


exprs, records = rule_exprs(rules_path)
if not exprs:
    fail(f"{rules_path}: no expr found")
checked = set()
for line, expr in exprs:
    for name in sorted(metric_names(expr) - records):
        checked.add(name)
        if name not in exposed:
            fail(f"{rules_path}: metric {name} (expr on line {line}) is not in the scrape")


# ---- the dashboard: every "expr", and the queries of template variables
try:
    with open(dashboard_path, encoding="utf-8") as f:
        dashboard = json.load(f)
except (OSError, ValueError) as e:
    fail(f"{dashboard_path}: does not parse as JSON: {e}")
    dashboard = {}


def walk(node, where):
    if isinstance(node, dict):
        title = node.get("title") or node.get("name") or where
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield title, value
            elif key == "query" and isinstance(value, (str, dict)) and node.get("type") == "query":
                q = value if isinstance(value, str) else value.get("query", "")
                m = re.match(r"\s*label_values\((.*),\s*\w+\s*\)\s*$", q)
                if m:
                    yield f"variable {title}", m.group(1)
            else:
                yield from walk(value, title)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, where)


seen = 0
for title, expr in walk(dashboard, "dashboard"):
    seen += 1
    for name in sorted(metric_names(expr) - records):
        checked.add(name)
        if name not in exposed:
            fail(f"{dashboard_path}: metric {name} (panel \"{title}\") is not in the scrape")
if dashboard and not seen:
    fail(f"{dashboard_path}: no expr found")

print(f"{len(checked)} metric names checked against {len(exposed)} in the scrape; {failures} failure(s)",
      file=sys.stderr if failures else sys.stdout)
sys.exit(1 if failures else 0)
PY
fi

if [[ $failures -ne 0 ]]; then
    echo "deploy/check.sh: FAILED (see the FAIL lines above)" >&2
    exit 1
fi
echo "deploy/check.sh: all checks passed"
