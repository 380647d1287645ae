# The Go module github.com/outbox-rs/outbox/bindings/go, released as bindings/go/vX.Y.Z (X.Y.Z
# the crate's version) with the static library for linux/amd64 inside, so that `go get` and
# `go build` need no Rust toolchain (as wasmtime-go ships its library).
#
# release_go: builds liboutbox.a (release, --features rocketmq) into $OUTBOX_RELEASE_TARGET,
#   strips its debug info, lays out the module with it ($ARTIFACTS/go/module: bindings/go, its
#   LICENSE and NOTICE included, plus the library in three parts, lib/linux-amd64/liboutbox-N.a,
#   each under 100 MB: the tree the tag's commit holds) and writes the module as a
#   module proxy serves it: $ARTIFACTS/goproxy/github.com/outbox-rs/outbox/bindings/go/@v/
#   {list,vX.Y.Z.info,vX.Y.Z.mod,vX.Y.Z.zip}. The zip is made by golang.org/x/mod/zip (the go
#   command's own rules: nested modules such as tests/ left out, no vendor/, no symlinks, the
#   size limits) and checked with zip.CheckZip.
# check_go: a user's new module, offline, with no Rust toolchain on PATH and no CGO_* or
#   OUTBOX_* variables: go mod init, go get the module from that proxy (the MySQL driver from a
#   second file proxy made of Debian's golang-github-go-sql-driver-mysql-dev), go build a program
#   that migrates a database of its own, enqueues events in a database/sql transaction and
#   relays them to the broker until every row is sent (deleted, or SUCCESS); also built from a vendor directory.
#
# Sourced by scripts/release (repository root as the working directory, scripts/lib.sh loaded).

GO_MODULE=github.com/outbox-rs/outbox/bindings/go
GO_DRIVER_MODULE=github.com/go-sql-driver/mysql
GO_DRIVER_DIR=/usr/share/gocode/src/github.com/go-sql-driver/mysql
# The library goes into the module in this many parts (link_prebuilt.go names each), every file
# of the module under GO_FILE_LIMIT bytes (the public git hosts refuse files of 100 MB or more).
GO_LIB_PARTS=3
GO_FILE_LIMIT=100000000

# v<the crate's version>: the module's version; its tag is bindings/go/v<version>.
_go_version() {
    local v
    v=$(awk -F'"' '/^\[/ { p = ($0 == "[package]") } p && /^version *=/ { print $2; exit }' Cargo.toml)
    [ -n "$v" ] || { echo "release go: no [package] version in Cargo.toml" >&2; return 1; }
    echo "v$v"
}

# Go, golang.org/x/mod (the module zip), the MySQL driver (check_go's program), libz (linking).
_go_tools() {
    apt_install golang-go golang-golang-x-mod-dev golang-github-go-sql-driver-mysql-dev zlib1g-dev
}

# _go_proxy_add PROXY_DIR MODULE VERSION SOURCE_DIR TIME: writes MODULE's VERSION into the file
# module proxy PROXY_DIR (<escaped module>/@v/list, .info, .mod, .zip) from SOURCE_DIR, with
# golang.org/x/mod/zip; prints what it left out (stderr) and the zip's h1: hash (stdout).
_go_proxy_add() {
    local tool="$ARTIFACTS/go/tools/modproxy"
    mkdir -p "$tool"
    cat >"$tool/main.go" <<'GO'
// modproxy PROXY_DIR MODULE VERSION SOURCE_DIR TIME writes a module version as a module proxy
// serves it: the zip by golang.org/x/mod/zip.CreateFromDir, checked by zip.CheckZip.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "modproxy: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 6 {
		fail("usage: modproxy PROXY_DIR MODULE VERSION SOURCE_DIR TIME")
	}
	proxy, path, version, dir, when := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	mv := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		fail("%v", err)
	}
	ep, err := module.EscapePath(path)
	if err != nil {
		fail("%v", err)
	}
	ev, err := module.EscapeVersion(version)
	if err != nil {
		fail("%v", err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		fail("%v", err)
	}
	if got := modfile.ModulePath(gomod); got != path {
		fail("%s/go.mod declares module %q, not %q", dir, got, path)
	}
	checked, err := zip.CheckDir(dir)
	if err != nil {
		fail("%s: %v", dir, err)
	}
	for _, f := range checked.Omitted {
		fmt.Fprintf(os.Stderr, "modproxy: %s@%s: left out %s (%v)\n", path, version, f.Path, f.Err)
	}
	at := filepath.Join(proxy, filepath.FromSlash(ep), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		fail("%v", err)
	}
	zipPath := filepath.Join(at, ev+".zip")
	tmp := zipPath + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		fail("%v", err)
	}
	if err := zip.CreateFromDir(out, mv, dir); err != nil {
		fail("zip of %s: %v", dir, err)
	}
	if err := out.Close(); err != nil {
		fail("%v", err)
	}
	if _, err := zip.CheckZip(mv, tmp); err != nil {
		fail("the zip does not pass zip.CheckZip: %v", err)
	}
	if err := os.Rename(tmp, zipPath); err != nil {
		fail("%v", err)
	}
	if err := os.WriteFile(filepath.Join(at, ev+".mod"), gomod, 0o644); err != nil {
		fail("%v", err)
	}
	info, _ := json.Marshal(struct{ Version, Time string }{version, when})
	if err := os.WriteFile(filepath.Join(at, ev+".info"), append(info, '\n'), 0o644); err != nil {
		fail("%v", err)
	}
	versions := map[string]bool{version: true}
	if old, err := os.ReadFile(filepath.Join(at, "list")); err == nil {
		for _, v := range strings.Fields(string(old)) {
			versions[v] = true
		}
	}
	var list []string
	for v := range versions {
		list = append(list, v)
	}
	sort.Slice(list, func(i, j int) bool { return semver.Compare(list[i], list[j]) < 0 })
	if err := os.WriteFile(filepath.Join(at, "list"), []byte(strings.Join(list, "\n")+"\n"), 0o644); err != nil {
		fail("%v", err)
	}
	h1, err := dirhash.HashZip(zipPath, dirhash.DefaultHash)
	if err != nil {
		fail("%v", err)
	}
	fmt.Println(h1)
}
GO
    (cd "$tool" && GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE="$OUTBOX_CACHE/go-build" \
        go build -o modproxy .) || { echo "release go: building the module proxy tool failed" >&2; return 1; }
    "$tool/modproxy" "$@"
}


release_go() {
    _go_tools
    local version lib stage proxy zip h1 when raw
    version=$(_go_version)
    release_cargo "$OUTBOX_RELEASE_TARGET" --release --lib --features rocketmq
    lib="$OUTBOX_RELEASE_TARGET/$RELEASE_TRIPLE/release/liboutbox.a"
    [ -f "$lib" ] || { echo "release go: $lib was not built" >&2; return 1; }
    cmp -s include/outbox.h bindings/go/outbox.h \
        || { echo "release go: bindings/go/outbox.h differs from include/outbox.h" >&2; return 1; }

    # The module's tree at its tag: bindings/go as the repository has it (tracked and new files,
    # not ignored ones), plus the library.
    stage="$ARTIFACTS/go/module"
    rm -rf "$stage"
    mkdir -p "$stage"
    git ls-files -z --cached --others --exclude-standard -- bindings/go | while IFS= read -r -d '' f; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        mkdir -p "$stage/$(dirname "${f#bindings/go/}")"
        cp "$f" "$stage/${f#bindings/go/}"
    done
    [ -f "$stage/go.mod" ] || { echo "release go: no go.mod staged" >&2; return 1; }
    mkdir -p "$stage/lib/linux-amd64"
    # The release profile builds the crate without debug info, but the archive also holds the
    # standard library's objects, which carry theirs, and their LLVM bitcode (.llvmbc, for LTO
    # only; linkers drop it): strip both, symbols stay. With the toolchain's llvm-objcopy: GNU
    # strip rewrites every object's string tables and makes the archive larger, not smaller.
    raw=$(stat -c %s "$lib")
    strip_archive "$lib" "$ARTIFACTS/go/liboutbox.a"
    say "release go: liboutbox.a $raw bytes, $(stat -c %s "$ARTIFACTS/go/liboutbox.a") stripped"
    # In GO_LIB_PARTS archives linked as one group (link_prebuilt.go), so that every file of the
    # module fits the 100 MB a file may have on the public git hosts the module proxy reads.
    python3 scripts/release.d/arsplit.py "$ARTIFACTS/go/liboutbox.a" "$stage/lib/linux-amd64/liboutbox" \
        "$GO_LIB_PARTS" "$GO_FILE_LIMIT"
    local f
    for f in LICENSE NOTICE; do
        [ -f "$stage/$f" ] && cmp -s "$stage/$f" "$f" \
            || { echo "release go: the module has no $f, or another one than the repository's (scripts/notice)" >&2; return 1; }
    done
    while IFS= read -r -d '' f; do
        [ "$(stat -c %s "$f")" -lt "$GO_FILE_LIMIT" ] \
            || { echo "release go: ${f#"$stage"/} is $(stat -c %s "$f") bytes, over the $GO_FILE_LIMIT a git host takes" >&2; return 1; }
    done < <(find "$stage" -type f -print0)

    proxy="$ARTIFACTS/goproxy"
    when=$(date -u -d "@$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)
    h1=$(_go_proxy_add "$proxy" "$GO_MODULE" "$version" "$stage" "$when")
    zip="$proxy/$GO_MODULE/@v/$version.zip"
    say "release go: $zip ($(stat -c %s "$zip") bytes, $h1), tag bindings/go/$version"
    mkdir -p "$ARTIFACTS"
    touch "$ARTIFACTS/sizes.txt"
    sed -i '/^go-module-zip /d; /^go-liboutbox/d' "$ARTIFACTS/sizes.txt"
    echo "go-module-zip $(stat -c %s "$zip")" >>"$ARTIFACTS/sizes.txt"
    for f in "$stage"/lib/linux-amd64/liboutbox-*.a; do
        echo "go-$(basename "$f") $(stat -c %s "$f")" >>"$ARTIFACTS/sizes.txt"
    done
}

check_go() {
    _go_tools
    ensure_mariadb
    scripts/rocketmq start >/dev/null
    local version proxy driver_version work db topic clean_path out
    version=$(_go_version)
    proxy="$ARTIFACTS/goproxy"
    [ -f "$proxy/$GO_MODULE/@v/$version.zip" ] || { echo "check go: no $version in $proxy (release_go first)" >&2; return 1; }
    driver_version=v$(dpkg-query -W -f='${Version}' golang-github-go-sql-driver-mysql-dev | sed 's/-[^-]*$//')

    work=$(mktemp -d)
    db="outbox_go_release_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
    topic="$db"
    # shellcheck disable=SC2064
    trap "chmod -R u+w '$work' 2>/dev/null; rm -rf '$work'; mariadb -h 127.0.0.1 -P 3306 -u root -e 'DROP DATABASE IF EXISTS $db' >/dev/null 2>&1 || true" EXIT

    # What the user's machine has: Go and a C compiler, no Rust toolchain.
    clean_path=/usr/local/bin:/usr/bin:/bin
    if env -i PATH="$clean_path" sh -c 'command -v cargo || command -v rustc' >/dev/null; then
        echo "check go: cargo or rustc is on $clean_path; cannot check without a Rust toolchain" >&2
        return 1
    fi
    # The driver, from the same kind of proxy: a second file proxy made of Debian's source.
    _go_proxy_add "$work/deps" "$GO_DRIVER_MODULE" "$driver_version" "$GO_DRIVER_DIR" 2019-12-05T00:00:00Z >/dev/null
    mkdir -p "$work/home" "$work/points"
    # user CMD...: run as the user would, in a fresh environment (env -i: no CGO_*, OUTBOX_*,
    # CARGO*, RUSTUP*, LD_LIBRARY_PATH), an empty module cache and build cache, offline.
    _go_user() {
        (cd "$work/points" && env -i HOME="$work/home" PATH="$clean_path" LANG=C.UTF-8 TMPDIR="$work" \
            GOPATH="$work/gopath" GOCACHE="$work/gocache" GOTOOLCHAIN=local \
            GOPROXY="file://$proxy,file://$work/deps" GONOSUMDB="github.com/outbox-rs,$GO_DRIVER_MODULE" \
            "$@")
    }
    for f in LICENSE NOTICE; do
        unzip -l "$proxy/$GO_MODULE/@v/$version.zip" | grep -q " $GO_MODULE@$version/$f\$" \
            || { echo "check go: the module zip has no $f at its root" >&2; return 1; }
    done
    say "check go: go get $GO_MODULE@$version from $proxy, offline, no Rust toolchain"
    _go_user go mod init example.com/points
    _go_user go get "$GO_MODULE@$version"
    cat >"$work/points/main.go" <<'GO'
// points: a user's program of the released module. It migrates a database of its own, writes
// orders and their events in one database/sql transaction, relays them to RocketMQ and waits
// until every event row is sent (deleted, or SUCCESS).
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"
	outbox "github.com/outbox-rs/outbox/bindings/go"
)

func main() {
	dbURL := flag.String("db", "", "the database, mysql://user@host:port/name")
	namesrv := flag.String("namesrv", "127.0.0.1:9876", "the RocketMQ name server")
	topic := flag.String("topic", "", "the topic")
	n := flag.Int("n", 20, "orders")
	version := flag.Bool("version", false, "print the library's version and exit")
	flag.Parse()
	log.SetFlags(0)
	if *version {
		fmt.Println(outbox.Version())
		return
	}
	if err := run(*dbURL, *namesrv, *topic, *n); err != nil {
		log.Fatalf("points: %v", err)
	}
}

func run(dbURL, namesrv, topic string, n int) error {
	cfg := outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "rocketmq", "rocketmq.namesrv": namesrv,
		"topic": topic, "scan.interval.ms": "100", "send.timeout.ms": "10000",
	}}
	if err := outbox.Migrate(cfg); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	dsn, err := outbox.DSNFromURL(dbURL)
	if err != nil {
		return err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t_order (order_no VARCHAR(64) PRIMARY KEY)"); err != nil {
		return err
	}
	relay, err := outbox.Start(cfg)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer relay.Close()

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i := 0; i < n; i++ {
		no := fmt.Sprintf("ORD-%d", i)
		if _, err := tx.ExecContext(ctx, "INSERT INTO t_order (order_no) VALUES (?)", no); err != nil {
			return err
		}
		ev := outbox.Event{BizNo: no, EventType: "ORDER_CREATED", Payload: []byte(`{"order":"` + no + `"}`)}
		if _, err := outbox.EnqueueTx(ctx, tx, relay, ev); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if err := relay.Notify(); err != nil {
		return err
	}

	deadline := time.Now().Add(90 * time.Second)
	for {
		// Sent rows are deleted (sent.rows = delete, the default) or SUCCESS.
		var unsent, orders int
		if err := db.QueryRow("SELECT COUNT(*) FROM t_event_record WHERE status <> 'SUCCESS'").Scan(&unsent); err != nil {
			return err
		}
		if err := db.QueryRow("SELECT COUNT(*) FROM t_order").Scan(&orders); err != nil {
			return err
		}
		if unsent == 0 && orders == n {
			break
		}
		if time.Now().After(deadline) {
			s, _ := relay.Stats()
			return fmt.Errorf("%d of %d events not sent after 90 s; stats %s", unsent, n, s.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s, err := relay.Stats()
	if err != nil {
		return err
	}
	stop, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := relay.Stop(stop); err != nil {
		return err
	}
	fmt.Printf("points: liboutbox %s relayed %d events to %s (sent %d)\n", outbox.Version(), n, topic, s.Sent)
	return nil
}
GO
    _go_user go get "$GO_DRIVER_MODULE@$driver_version"
    _go_user go build -o points .
    grep -q "^require.*$GO_MODULE $version\|^	$GO_MODULE $version" "$work/points/go.mod" && ! grep -q replace "$work/points/go.mod" \
        || { echo "check go: go.mod does not require $GO_MODULE $version alone:" >&2; cat "$work/points/go.mod" >&2; return 1; }
    if ldd "$work/points/points" | grep -q liboutbox; then
        echo "check go: the program loads liboutbox.so; the module's library should be linked in" >&2
        return 1
    fi
    say "check go: built $(stat -c %s "$work/points/points") bytes, needs $(ldd "$work/points/points" | awk '{print $1}' | tr '\n' ' ')"
    # Linked here, the program takes this machine's glibc symbols; linked by zig cc against the
    # baseline's (as on a system of the baseline), it needs nothing newer.
    _go_user env CC="$(baseline_cc)" go build -o points-baseline .
    check_glibc "check go" "$work/points/points-baseline"
    [ "v$(_go_user ./points-baseline -version)" = "$version" ] \
        || { echo "check go: the baseline build's library is $(_go_user ./points-baseline -version), not ${version#v}" >&2; return 1; }
    [ "v$(_go_user ./points -version)" = "$version" ] \
        || { echo "check go: the program's library is $(_go_user ./points -version), not ${version#v}" >&2; return 1; }

    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE $db"
    out=$(_go_user ./points -db "mysql://root@127.0.0.1:3306/$db" -namesrv 127.0.0.1:9876 -topic "$topic" -n 20) \
        || { echo "check go: the program failed: $out" >&2; return 1; }
    echo "$out"
    [ "$(mariadb -h 127.0.0.1 -P 3306 -u root -N -e "SELECT COUNT(*) FROM $db.t_order")" = 20 ] \
        && [ "$(mariadb -h 127.0.0.1 -P 3306 -u root -N -e "SELECT COUNT(*) FROM $db.t_event_record WHERE status <> 'SUCCESS'")" = 0 ] \
        || { echo "check go: not every event was sent (an event row is left that is not SUCCESS)" >&2; return 1; }

    # Vendored: go mod vendor copies lib/linux-amd64 (vendor_lib.go), and the build links it.
    _go_user go mod vendor
    for f in $(seq 1 "$GO_LIB_PARTS"); do
        [ -f "$work/points/vendor/$GO_MODULE/lib/linux-amd64/liboutbox-$f.a" ] \
            || { echo "check go: go mod vendor did not copy lib/linux-amd64/liboutbox-$f.a" >&2; return 1; }
    done
    _go_user go build -mod=vendor -o points-vendored .
    [ "v$(_go_user ./points-vendored -version)" = "$version" ] && ! ldd "$work/points/points-vendored" | grep -q liboutbox \
        || { echo "check go: the vendored build does not link the module's library" >&2; return 1; }
    say "check go: vendored build ok"

    chmod -R u+w "$work" 2>/dev/null
    rm -rf "$work"
    mariadb -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS $db"
    trap - EXIT
    say "check go: ok ($GO_MODULE@$version, module zip $(stat -c %s "$proxy/$GO_MODULE/@v/$version.zip") bytes)"
}
