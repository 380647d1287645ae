//! How a consumer runs: [`ConsumerConfig`], checked before anything starts.

use std::time::Duration;

use crate::error::Result;

/// The consumer dead-letter table's default name (the one
/// `migrations/V10__create_outbox_inbox_dead_letter.sql` creates).
pub const DEFAULT_DEAD_LETTER_TABLE: &str = "outbox_inbox_dead_letter";

/// Most messages per handler transaction by default (`docs/inbox.md`, "Batches", has the
/// measurements it comes from).
pub const DEFAULT_BATCH_MAX: usize = 128;

/// The largest `batch_max` accepted: one batch's marks are one statement of about 700 bytes per
/// message, well under the server's packet limit.
pub const MAX_BATCH_MAX: usize = 4096;

/// How a consumer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// The consumer group: the inbox marks keys per group.
    pub group: String,
    pub inbox_table: String,
    pub dead_letter_table: String,
    /// Handler threads (each with its own database connection).
    pub threads: usize,
    /// Handler attempts per message before it is parked in the dead-letter table.
    pub max_attempts: u32,
    /// Wait after a first failure; doubles per attempt up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How often offsets are also stored with the broker (they are committed in memory at once).
    pub persist_interval: Duration,
    /// How often the replayer looks for dead letters to replay.
    pub replay_interval: Duration,
    /// Messages waiting per handler thread before the poller waits.
    pub queue_capacity: usize,
    /// Most messages one handler transaction takes (`consumer.batch.max`): a handler thread
    /// takes the messages waiting for it, up to this many, and handles them with one commit. It
    /// never waits for a batch to fill. 1 handles one message per transaction.
    pub batch_max: usize,
    /// How long marks are kept: the replayer deletes older ones (in small batches, every
    /// `retention_interval`). `None` keeps them (purge them yourself). Default: 7 days
    /// ([`crate::inbox::DEFAULT_RETENTION`]); never shorter than the broker's redelivery span.
    pub retention: Option<Duration>,
    pub retention_interval: Duration,
    /// Mark each key in the inbox before the handler runs (the default). Off, every copy runs
    /// the handler: only for handlers that are idempotent by themselves (and to measure what the
    /// inbox costs).
    pub inbox: bool,
}

impl ConsumerConfig {
    pub fn new(group: &str) -> ConsumerConfig {
        ConsumerConfig {
            group: group.to_string(),
            inbox_table: crate::inbox::DEFAULT_TABLE.into(),
            dead_letter_table: DEFAULT_DEAD_LETTER_TABLE.into(),
            threads: 4,
            max_attempts: 5,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            persist_interval: Duration::from_secs(1),
            replay_interval: Duration::from_secs(2),
            queue_capacity: 256,
            batch_max: DEFAULT_BATCH_MAX,
            retention: Some(crate::inbox::DEFAULT_RETENTION),
            retention_interval: Duration::from_secs(60),
            inbox: true,
        }
    }

    /// Every problem at once is not needed here: the first bad field, named with its value.
    pub fn validate(&self) -> Result<()> {
        crate::inbox::check_group(&self.group)?;
        crate::config::table_name("inbox.table", &self.inbox_table)?;
        crate::config::table_name("inbox.dead_letter.table", &self.dead_letter_table)?;
        let bad = |key: &str, value: String, reason: &str| -> Result<()> {
            Err(crate::error::ConfigError::invalid(key, value, reason).into())
        };
        if self.threads == 0 || self.threads > 256 {
            return bad("consumer.threads", self.threads.to_string(), "must be 1 to 256");
        }
        if self.max_attempts == 0 {
            return bad("consumer.max.attempts", "0".into(), "must be at least 1");
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return bad(
                "consumer.backoff",
                format!("{:?}..{:?}", self.backoff_initial, self.backoff_max),
                "initial must be > 0 and not above max",
            );
        }
        if self.batch_max == 0 || self.batch_max > MAX_BATCH_MAX {
            return bad(
                "consumer.batch.max",
                self.batch_max.to_string(),
                "must be 1 (one message per transaction) to 4096",
            );
        }
        if self.queue_capacity == 0 {
            return bad("consumer.queue.capacity", "0".into(), "must be at least 1");
        }
        if self.retention.is_some_and(|r| r < Duration::from_secs(3600)) {
            return bad(
                "inbox.retention",
                format!("{:?}", self.retention.unwrap_or_default()),
                "must be at least 1 h: RocketMQ redelivers an unacknowledged message for hours, and a copy \
                 arriving after its mark is deleted is handled again",
            );
        }
        if self.persist_interval.is_zero() || self.replay_interval.is_zero() || self.retention_interval.is_zero() {
            return bad(
                "consumer.interval",
                "0".into(),
                "persist and replay intervals must be > 0",
            );
        }
        Ok(())
    }

    pub(super) fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }
}
