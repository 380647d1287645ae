//! What the fleet's background readers (the watch, the coordination, the catalog) say of a read
//! that keeps failing: the last reason, logged the first time and then at most once a minute.

use std::time::{Duration, Instant};

/// How often a failure that goes on is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The last failure of a read the fleet retries, and when it was last logged.
#[derive(Default)]
pub(super) struct Problem(Option<(String, Instant)>);

impl Problem {
    /// Why the last read failed, while it has not succeeded since.
    pub fn why(&self) -> Option<&str> {
        self.0.as_ref().map(|(why, _)| why.as_str())
    }

    /// Records a failure; true when it is to be logged now (the first, then once a minute).
    pub fn fail(&mut self, why: String) -> bool {
        match &mut self.0 {
            Some((last, at)) if at.elapsed() < LOG_EVERY => {
                *last = why;
                false
            }
            slot => {
                *slot = Some((why, Instant::now()));
                true
            }
        }
    }

    /// Records a success; true when a failure was recorded before it.
    pub fn clear(&mut self) -> bool {
        self.0.take().is_some()
    }
}
