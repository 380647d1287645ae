//go:build cgo

package outbox

import (
	"net/url"
	"strings"
)

// The library takes a URL (mysql://user:password@host:port/database) and the Go MySQL driver a
// DSN (user:password@tcp(host:port)/database). Either spelling works as the "db.url" setting (a
// DSN is converted with URLFromDSN); DSNFromURL gives the driver's spelling of the library's URL,
// so a service keeps one setting for both.

// DSNFromURL converts a library URL to a go-sql-driver/mysql DSN for sql.Open("mysql", dsn).
// URL query parameters (the library's) are not carried over.
func DSNFromURL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || u.Scheme != "mysql" || u.Host == "" {
		return "", goError(CodeInvalidValue, "%q is not a mysql://user:password@host:port/database URL", redactURL(dbURL))
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	var b strings.Builder
	if u.User != nil {
		b.WriteString(u.User.Username())
		if p, ok := u.User.Password(); ok {
			b.WriteString(":" + p)
		}
		b.WriteString("@")
	}
	b.WriteString("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/"))
	return b.String(), nil
}

// URLFromDSN converts a go-sql-driver/mysql DSN ([user[:password]@][tcp[(host:port)]]/database,
// with optional ?params, which are the driver's and are dropped) to the library's URL.
func URLFromDSN(dsn string) (string, error) {
	bad := func() (string, error) {
		return "", goError(CodeInvalidValue, "%q is not a DSN of the form user:password@tcp(host:port)/database", redactDSN(dsn))
	}
	slash := strings.LastIndex(dsn, "/")
	if slash < 0 {
		return bad()
	}
	head, db := dsn[:slash], dsn[slash+1:]
	if q := strings.IndexByte(db, '?'); q >= 0 {
		db = db[:q]
	}
	user, pass, hasPass, addr := "", "", false, ""
	if at := strings.LastIndex(head, "@"); at >= 0 {
		cred := head[:at]
		head = head[at+1:]
		if colon := strings.IndexByte(cred, ':'); colon >= 0 {
			user, pass, hasPass = cred[:colon], cred[colon+1:], true
		} else {
			user = cred
		}
	}
	switch {
	case head == "" || head == "tcp":
		addr = "127.0.0.1:3306"
	case strings.HasPrefix(head, "tcp(") && strings.HasSuffix(head, ")"):
		addr = head[len("tcp(") : len(head)-1]
		if !strings.Contains(addr, ":") {
			addr += ":3306"
		}
	default:
		return bad() // unix sockets and other networks: use a mysql:// URL
	}
	u := url.URL{Scheme: "mysql", Host: addr, Path: "/" + db}
	if user != "" {
		if hasPass {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.User(user)
		}
	}
	return u.String(), nil
}

func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "***")
			return u.String()
		}
	}
	return s
}

func redactDSN(s string) string {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	if colon := strings.IndexByte(s[:at], ':'); colon >= 0 {
		return s[:colon] + ":***" + s[at:]
	}
	return s
}
