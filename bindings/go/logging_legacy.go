//go:build cgo && !go1.21

package outbox

import "log"

// Before Go 1.21 (no log/slog) records go to the standard log package by default.
func defaultLog(r LogRecord) { log.Printf("outbox %-5s %s: %s", r.Level, r.Target, r.Message) }
