//! Log levels by number, as the hosts pass them: 0 off, 1 error, 2 warn, 3 info, 4 debug,
//! 5 trace (the C ABI's `outbox_log_level`, Java's `Native.setLogLevel` and `Native.log`).

use log::{Level, LevelFilter};

use super::error::{HostError, HostResult};
use super::log_sink::install;

/// The threshold of number `n`, or `InvalidArgument` naming the numbers there are.
pub(crate) fn filter_of(n: i32) -> HostResult<LevelFilter> {
    LevelFilter::iter()
        .find(|f| *f as i32 == n)
        .ok_or_else(|| HostError::InvalidArgument(format!("unknown log level {n} (0 = off ... 5 = trace)")))
}

/// The number of a record's level (1 error ... 5 trace).
pub(crate) fn number_of(level: Level) -> i32 {
    level as i32
}

/// Sets the process-wide threshold to level number `n` (installing the library's logger first).
pub(crate) fn set_max_level(n: i32) -> HostResult<()> {
    let filter = filter_of(n)?;
    install();
    log::set_max_level(filter);
    Ok(())
}

/// The number of the process-wide threshold now in force.
pub(crate) fn max_level() -> i32 {
    log::max_level() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_their_numbers_match_both_ways() {
        let filters = [
            LevelFilter::Off,
            LevelFilter::Error,
            LevelFilter::Warn,
            LevelFilter::Info,
            LevelFilter::Debug,
            LevelFilter::Trace,
        ];
        for (n, f) in filters.into_iter().enumerate() {
            assert_eq!(filter_of(n as i32).unwrap(), f);
        }
        assert!(filter_of(6).is_err() && filter_of(-1).is_err());
        assert_eq!(number_of(Level::Error), 1);
        assert_eq!(number_of(Level::Trace), 5);
    }
}
