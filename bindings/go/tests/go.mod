// The binding's tests against MariaDB, in a module of their own so that the MySQL driver they
// use never becomes a requirement of the binding's users. No module proxy is reachable here: the
// driver comes from Debian's golang-github-go-sql-driver-mysql-dev (run-tests.sh runs with
// GOFLAGS=-mod=mod GOPROXY=off).
module github.com/outbox-rs/outbox/bindings/go/tests

go 1.19

require (
	github.com/go-sql-driver/mysql v1.5.0
	github.com/outbox-rs/outbox/bindings/go v0.0.0
)

replace (
	github.com/go-sql-driver/mysql => /usr/share/gocode/src/github.com/go-sql-driver/mysql
	github.com/outbox-rs/outbox/bindings/go => ../
)
