//! Where messages come from: the [`Source`] trait (RocketMQ's is `outbox::rocketmq::RocketMqSource`).

use std::time::Duration;

use super::message::Message;
use crate::error::Result;
use crate::wire::QueueRef;

/// Where messages come from. Implementations must be `Send + Sync`: the poller calls `poll` and
/// `commit`, the stats reader `lag`.
pub trait Source: Send + Sync + 'static {
    /// The next messages (any number, possibly none), waiting at most about `timeout`.
    fn poll(&self, timeout: Duration) -> Result<Vec<Message>>;
    /// Records, per queue, the offset of the next message to consume: every message before it
    /// is done. `persist` also stores the offsets with the broker now (otherwise the source may
    /// keep them in memory for a while).
    fn commit(&self, next_offsets: &[(QueueRef, u64)], persist: bool);
    /// Messages on the assigned queues not yet committed, if known (`None` while no queue is
    /// assigned or the broker does not answer).
    fn lag(&self) -> Option<u64> {
        None
    }
    /// Why the source cannot deliver messages now (its name server or broker unreachable, the
    /// topic without a route), or `None` when nothing is known to be wrong. Called by the poller
    /// every few seconds; it may ask the broker side, within a bound of a few seconds.
    fn health(&self) -> Option<String> {
        None
    }
    /// Leaves the group and releases the source's resources.
    fn shutdown(&self);
}
