//! What a relay tells its host as it goes: each dead-lettered event, and each acked event's
//! delivery times.

use std::sync::Arc;
use std::time::Duration;

use crate::store::DeadLetter;

/// Called once per dead-lettered event, for alerting. Runs on a relay thread; keep it short.
pub type DeadLetterHook = Arc<dyn Fn(&DeadLetter) + Send + Sync>;

/// Called once per acked event with its [`Delivery`] times. Runs on a worker thread; keep it short.
pub type LatencyHook = Arc<dyn Fn(&Delivery) + Send + Sync>;

/// How long an acked event took, from its commit: measured from the row's `create_time` (DB
/// clock; the INSERT, a little before the commit, so the figures err on the long side) to the
/// claim, plus this instance's own clock from the claim on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Commit to the broker's acknowledgement of the send.
    pub to_broker: Duration,
    /// Commit to the row marked SUCCESS.
    pub to_success: Duration,
    /// How long this instance held the row SENDING (claim to SUCCESS).
    pub held: Duration,
    /// The trace id of the event's stored trace context, if it has one: an exemplar for a
    /// latency histogram.
    pub trace_id: Option<[u8; 16]>,
}
