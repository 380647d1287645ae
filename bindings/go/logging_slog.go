//go:build cgo && go1.21

package outbox

import (
	"context"
	"log/slog"
	"time"
)

// SlogLevel maps a library level to log/slog's (TRACE is below slog.LevelDebug).
func SlogLevel(l LogLevel) slog.Level {
	switch l {
	case LogError:
		return slog.LevelError
	case LogWarn:
		return slog.LevelWarn
	case LogInfo:
		return slog.LevelInfo
	case LogDebug:
		return slog.LevelDebug
	}
	return slog.LevelDebug - 4
}

// SetLogHandler routes the library's log records to h, the service's own slog.Handler, with
// the record's target as the attribute "target". nil restores the default, slog.Default().
func SetLogHandler(h slog.Handler) {
	if h == nil {
		SetLogFunc(nil)
		return
	}
	SetLogFunc(func(r LogRecord) { toSlog(h, r) })
}

func toSlog(h slog.Handler, r LogRecord) {
	ctx := context.Background()
	level := SlogLevel(r.Level)
	if !h.Enabled(ctx, level) {
		return
	}
	rec := slog.NewRecord(time.Now(), level, r.Message, 0)
	rec.AddAttrs(slog.String("target", r.Target))
	_ = h.Handle(ctx, rec)
}

func defaultLog(r LogRecord) { toSlog(slog.Default().Handler(), r) }
