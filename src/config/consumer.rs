//! How a consumer runs: [`ConsumerConfig`] (the consumer runtime's settings, also reachable as
//! the `consumer.*` and `inbox.*` keys of [`super::Config`]), checked before anything starts.

use std::time::Duration;

use crate::error::{ConfigError, Result};

/// The inbox table's default name (the one `migrations/V8__create_outbox_inbox.sql` creates).
pub const DEFAULT_INBOX_TABLE: &str = "outbox_inbox";

/// How long a processed key is kept by default: 7 days (see `crate::inbox::DEFAULT_RETENTION`,
/// which is this value, for why).
pub const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shortest retention accepted: RocketMQ redelivers an unacknowledged message for hours.
pub const MIN_INBOX_RETENTION: Duration = Duration::from_secs(3600);

/// Where a new consumer group starts in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Every message the broker still has (nothing committed before the group existed is missed).
    First,
    /// Only messages sent after the group first subscribed.
    Last,
}

/// The consumer dead-letter table's default name (the one
/// `migrations/V10__create_outbox_inbox_dead_letter.sql` creates).
pub const DEFAULT_DEAD_LETTER_TABLE: &str = "outbox_inbox_dead_letter";

/// Most messages per handler transaction by default (`docs/inbox.md`, "Batches", has the
/// measurements it comes from).
pub const DEFAULT_BATCH_MAX: usize = 128;

/// The largest `batch_max` accepted: one batch's marks are one statement of about 700 bytes per
/// message, well under the server's packet limit.
pub const MAX_BATCH_MAX: usize = 4096;

/// Which handler thread a message goes to (`consumer.route`): messages with the same route
/// value always go to the same thread, in the order they arrived, and a batch is handled in the
/// order of its route values. A handler that updates rows named by the route value (a user's
/// balance routed by `property:userId`) never has two of its transactions wait on each other's
/// rows in one consumer, and transactions of consumers in other processes take those rows in
/// the same order (no deadlock between them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The event's business key (the `bizNo` property); a message without one goes by its queue.
    BizNo,
    /// The broker queue it came from (every message of a queue in one thread).
    Queue,
    /// A property the producer sets (a header of the event); a message without it goes by its
    /// business key.
    Property(String),
}

/// The longest property name `consumer.route` takes.
pub const MAX_ROUTE_PROPERTY_CHARS: usize = 64;

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
    /// ([`DEFAULT_INBOX_RETENTION`]); never shorter than the broker's redelivery span.
    pub retention: Option<Duration>,
    pub retention_interval: Duration,
    /// Mark each key in the inbox before the handler runs (the default). Off, every copy runs
    /// the handler: only for handlers that are idempotent by themselves (and to measure what the
    /// inbox costs).
    pub inbox: bool,
    /// Where a new group starts in its topic (`consumer.start.from`).
    pub start_from: StartFrom,
    /// Messages per pull request to the broker (`consumer.pull.batch`).
    pub pull_batch: u32,
    /// Which handler thread a message goes to (`consumer.route`).
    pub route: Route,
}

impl ConsumerConfig {
    /// The declared defaults (the `consumer.*` and `inbox.*` keys of `settings.rs`) for `group`.
    pub fn new(group: &str) -> ConsumerConfig {
        ConsumerConfig {
            group: group.to_string(),
            ..super::Config::default().consumer
        }
    }

    /// The first bad field, named with its key and value: each is checked by its key's kind,
    /// as `Config::set` checks it (the group is checked where it is used: the inbox and the
    /// source check it with RocketMQ's rules).
    pub fn validate(&self) -> Result<()> {
        let config = super::Config {
            consumer: self.clone(),
            ..super::Config::default()
        };
        for s in super::KEYS.iter().filter(|s| s.read_by == super::Reader::Consumer) {
            s.check(&config)?;
        }
        if self.backoff_max < self.backoff_initial {
            return Err(ConfigError::invalid(
                "consumer.backoff.max.ms",
                self.backoff_max.as_millis(),
                format!(
                    "must not be below consumer.backoff.initial.ms ({})",
                    self.backoff_initial.as_millis()
                ),
            )
            .into());
        }
        Ok(())
    }

    /// The wait before `attempt` + 1 after `attempt` failures: `backoff_initial` doubling up to
    /// `backoff_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }
}

impl Default for ConsumerConfig {
    /// The defaults, with no group (the consumer's start names it).
    fn default() -> ConsumerConfig {
        ConsumerConfig::new("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields written directly are checked by their keys' kinds, as `Config::set` checks them.
    #[test]
    fn fields_written_directly_are_checked_as_their_keys_are() {
        ConsumerConfig::new("g").validate().unwrap();
        let refused = |c: ConsumerConfig, key: &str, value: &str| {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(&format!("{value:?}")), "{e}");
        };
        let mut c = ConsumerConfig::new("g");
        c.threads = 257;
        refused(c, "consumer.threads", "257");
        let mut c = ConsumerConfig::new("g");
        c.batch_max = MAX_BATCH_MAX + 1;
        refused(c, "consumer.batch.max", "4097");
        let mut c = ConsumerConfig::new("g");
        c.inbox_table = "in box".into();
        refused(c, "inbox.table", "in box");
        // Shorter than the minimum, even shorter than a millisecond: never read as "keep".
        for short in [Duration::ZERO, Duration::from_micros(500), Duration::from_secs(60)] {
            let mut c = ConsumerConfig::new("g");
            c.retention = Some(short);
            refused(c, "inbox.retention.ms", &short.as_millis().to_string());
        }
        let mut c = ConsumerConfig::new("g");
        c.retention = None;
        c.validate().unwrap();
        c.backoff_max = c.backoff_initial / 2;
        refused(c, "consumer.backoff.max.ms", "100");
        let mut c = ConsumerConfig::new("g");
        c.route = Route::Property("user id".into());
        refused(c, "consumer.route", "property:user id");
    }

    #[test]
    fn a_route_is_a_business_key_a_queue_or_a_named_property() {
        let mut c = super::super::Config::default();
        assert_eq!(c.consumer.route, Route::Queue);
        for (text, route) in [
            ("biz_no", Route::BizNo),
            ("property:userId", Route::Property("userId".into())),
            ("queue", Route::Queue),
        ] {
            c.set("consumer.route", text).unwrap();
            assert_eq!(c.consumer.route, route);
            assert_eq!(c.get("consumer.route").unwrap(), text);
        }
        for bad in ["user", "property:", "property:a b", "QUEUE"] {
            let e = c.set("consumer.route", bad).unwrap_err().to_string();
            assert!(e.contains("consumer.route") && e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("biz_no, queue or property:NAME"), "{e}");
        }
    }
}
