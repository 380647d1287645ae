module outbox.local/outbox

go 1.19

// Only the tests use the driver (EnqueueTx needs nothing but database/sql). No module proxy is
// reachable here: the driver comes from Debian's golang-github-go-sql-driver-mysql-dev, run with
// GOFLAGS=-mod=mod GOPROXY=off (run-tests.sh does).
require github.com/go-sql-driver/mysql v1.5.0

replace github.com/go-sql-driver/mysql => /usr/share/gocode/src/github.com/go-sql-driver/mysql
