// Package tests holds the Go binding's tests against MariaDB (go test in this directory);
// run-tests.sh runs them, plus the vendored and static-link build checks.
package tests
