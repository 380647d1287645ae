//! The library's `log` logger and where its records go: stderr by default, or a host's own
//! delivery (a C callback, the JVM's `System.Logger`, Go's `log/slog` through the C callback).
//! Installed the first time a host entry point needs it; a Rust program that installed a logger
//! of its own keeps it.
//!
//! Default: each record at INFO or above is written to stderr as one line
//! `outbox <LEVEL> <target>: <message>`. INFO carries start/stop and state changes (breaker,
//! database reachable again), never a line per event; per-event lines are DEBUG and TRACE.

use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Once};

use parking_lot::RwLock;

use super::error::{HostError, HostResult};

/// A binding's own delivery of one record: level, target, message.
pub(crate) type HostLogFn = Arc<dyn Fn(log::Level, &str, &str) + Send + Sync>;

/// Where records go.
pub(crate) enum Sink {
    /// One line per record on stderr (the default).
    Stderr,
    /// A host's own delivery.
    Host(HostLogFn),
}

static SINK: RwLock<Sink> = parking_lot::const_rwlock(Sink::Stderr);

thread_local! {
    /// Set while this thread delivers a record: records logged meanwhile are dropped.
    static DELIVERING: Cell<bool> = const { Cell::new(false) };
}

struct HostLogger;

static LOGGER: HostLogger = HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) || DELIVERING.with(Cell::get) {
            return;
        }
        DELIVERING.with(|d| d.set(true));
        // Nothing a host's logger does may unwind into the relay's threads.
        let _ = catch_unwind(AssertUnwindSafe(|| deliver(record)));
        DELIVERING.with(|d| d.set(false));
    }

    fn flush(&self) {}
}

fn deliver(record: &log::Record<'_>) {
    let message = record.args().to_string();
    let sink = SINK.read_recursive();
    match &*sink {
        Sink::Stderr => write_stderr(record.level(), record.target(), &message),
        Sink::Host(f) => f(record.level(), record.target(), &message),
    }
}

/// The default sink, and the fallback of bindings that cannot deliver a record.
pub(crate) fn write_stderr(level: log::Level, target: &str, message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "outbox {level:<5} {target}: {message}");
}

/// Installs the library's logger (once) with the default threshold INFO, unless the process
/// already has a `log` logger.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
    });
}

/// Replaces the sink; waits for records being delivered to the old one. Refused from inside a
/// host's log callback (while this thread delivers a record), changing nothing.
pub(crate) fn set_sink(sink: Sink) -> HostResult<()> {
    if DELIVERING.with(Cell::get) {
        return Err(HostError::InvalidArgument(
            "the log callback cannot be changed from inside a log callback".into(),
        ));
    }
    install();
    *SINK.write() = sink;
    Ok(())
}
