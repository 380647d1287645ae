package outbox

/*
#include <stdint.h>
#include "outbox.h"

// Declared in logging.go (//export).
extern void outboxGoLog(int level, char *target, char *message);

static void outbox_go_log_trampoline(outbox_log_level level, const char *target, const char *message, void *user_data) {
	(void)user_data;
	outboxGoLog((int)level, (char *)target, (char *)message);
}

static enum outbox_result outbox_go_install_logger(void) {
	return outbox_set_log_callback(outbox_go_log_trampoline, NULL);
}
*/
import "C"

import (
	"fmt"
	"sync/atomic"
)

// LogLevel is the severity of one of the library's log records, and the threshold of
// SetLogLevel. The values are those of outbox_log_level.
type LogLevel int

// The levels, most severe first. LogOff is only a threshold.
const (
	LogOff   LogLevel = C.OUTBOX_LOG_OFF
	LogError LogLevel = C.OUTBOX_LOG_ERROR
	LogWarn  LogLevel = C.OUTBOX_LOG_WARN
	LogInfo  LogLevel = C.OUTBOX_LOG_INFO
	LogDebug LogLevel = C.OUTBOX_LOG_DEBUG
	LogTrace LogLevel = C.OUTBOX_LOG_TRACE
)

func (l LogLevel) String() string {
	switch l {
	case LogOff:
		return "OFF"
	case LogError:
		return "ERROR"
	case LogWarn:
		return "WARN"
	case LogInfo:
		return "INFO"
	case LogDebug:
		return "DEBUG"
	case LogTrace:
		return "TRACE"
	}
	return fmt.Sprintf("LogLevel(%d)", int(l))
}

// LogRecord is one record of the library's log: its level, the module that logged it
// ("outbox::relay", "outbox::store", "mysql::conn::pool", ...) and the text.
type LogRecord struct {
	Level   LogLevel
	Target  string
	Message string
}

type logFunc struct{ f func(LogRecord) }

var logSink atomic.Value // logFunc

func init() {
	logSink.Store(logFunc{})
	// From now on the library logs through this package (by default to log/slog, or to the
	// standard log package before Go 1.21), not to stderr.
	C.outbox_go_install_logger()
}

// SetLogFunc routes the library's log records to f, called on the thread that logged (a relay
// thread or the goroutine of a call), possibly from several at once; it must be safe for
// concurrent use and quick, and must not call this package. nil restores the default (log/slog's
// default logger from Go 1.21 on, the standard log package before). Which records arrive is
// decided by SetLogLevel or the "log.level" setting (default LogInfo: start, stop, state changes,
// no line per event).
func SetLogFunc(f func(LogRecord)) {
	logSink.Store(logFunc{f})
}

// SetLogLevel sets the library's process-wide threshold: records less severe than level are not
// even formatted. LogOff silences it. The "log.level" setting does the same at Start.
func SetLogLevel(level LogLevel) error {
	return call(func() C.enum_outbox_result { return C.outbox_set_log_level(C.int(level)) })
}

// GetLogLevel returns the threshold in force.
func GetLogLevel() LogLevel {
	return LogLevel(C.outbox_get_log_level())
}

//export outboxGoLog
func outboxGoLog(level C.int, target *C.char, message *C.char) {
	// A panicking handler must not unwind into the library's frames.
	defer func() { _ = recover() }()
	deliver(LogRecord{Level: LogLevel(level), Target: C.GoString(target), Message: C.GoString(message)})
}

// deliver hands a record to the log function, or to the default.
func deliver(r LogRecord) {
	if f := logSink.Load().(logFunc).f; f != nil {
		f(r)
		return
	}
	defaultLog(r)
}

// logFromGo logs a record of this package's own (target "outbox::go::..."), where the library's
// records go and under the same threshold. A panicking log function is contained.
func logFromGo(level LogLevel, target, message string) {
	if level == LogOff || level > GetLogLevel() {
		return
	}
	defer func() { _ = recover() }()
	deliver(LogRecord{Level: level, Target: target, Message: message})
}
