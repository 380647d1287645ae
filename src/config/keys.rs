//! The configuration's string keys: each with its meaning ([`KEYS`], what `outboxd config
//! example` prints), parsed into the typed [`Config`] by [`Config::set`] and printed back by
//! [`Config::get`].

use std::time::Duration;

use super::consumer::RETENTION_TOO_SHORT;
use super::parse::{
    boolean, choice, fraction, int, millis, namesrv, optional, printable, redact_url, table_name, token, topic,
};
use super::typed::*;
use super::{StartFrom, MAX_BATCH_MAX, MIN_INBOX_RETENTION};
use crate::error::ConfigError;

/// One configuration key: its name and what it means. Defaults come from [`Config::default`].
#[derive(Debug, Clone, Copy)]
pub struct KeyInfo {
    pub key: &'static str,
    pub doc: &'static str,
}

macro_rules! keys {
    ($($key:literal => $doc:literal,)*) => {
        /// Every configuration key, in documentation order.
        pub const KEYS: &[KeyInfo] = &[$(KeyInfo { key: $key, doc: $doc },)*];
    };
}

keys! {
    "profile" => "default or seed: the values every other key starts from (seed: the seed publisher's batch 20, scan 5 s, lease 10 min, max retry 3, per-row claims, one sender); keys set anywhere, before or after it, override it",
    "db.url" => "MySQL/MariaDB URL, mysql://user:pass@host:port/db (required)",
    "startup.db.wait.ms" => "outboxd run: how long to keep retrying a database that cannot be reached at start, with backoff, before exiting (0 = fail at once); access denied or an unknown database fail at once",
    "db.pool.max" => "largest number of database connections the relay opens",
    "table" => "outbox table name (letters, digits, underscore)",
    "instance.id" => "claim_owner written by this instance; empty derives <service>-<port or pid>-<random6>",
    "service.name" => "service part of the derived instance id",
    "service.port" => "port part of the derived instance id (empty uses the process id)",
    "claim.strategy" => "skip-locked (batch claim in one short transaction) or per-row (the seed's conditional UPDATE per row)",
    "batch.size" => "most rows claimed by one scan round",
    "scan.interval.ms" => "delay between scan rounds; commits that call notify are relayed at once",
    "scan.drain" => "scan again at once when a round claimed a full batch",
    "reclaim.interval.ms" => "how often expired leases are returned to WAIT",
    "lease.ms" => "how long a claim is valid without renewal",
    "lease.renew.fraction" => "renew a send's lease once it has been in flight this fraction of the lease (0 disables)",
    "max.retry" => "attempts after the first before an event is dead-lettered (FAIL)",
    "backoff.policy" => "fixed, quadratic (n^2 * base) or exponential (2^(n-1) * base)",
    "backoff.base.ms" => "base delay of the backoff",
    "backoff.max.ms" => "cap of any retry delay",
    "backoff.jitter" => "0..1, each delay is shortened by a random share of up to this fraction",
    "workers" => "sender threads",
    "publish.batch.max" => "most events given to one publish call (one broker batch)",
    "max.in.flight" => "most claimed events held by this instance at once (memory: about this many payloads)",
    "send.timeout.ms" => "budget of one publish call; at most a quarter of lease.ms",
    "payload.max.bytes" => "largest payload accepted by enqueue",
    "topic" => "topic of events that set none",
    "breaker.failure.threshold" => "consecutive broker-wide failures or timeouts that open the circuit breaker",
    "breaker.open.ms" => "how long the breaker stays open before a probe",
    "ordering" => "none, or per-biz-no (one event of a biz_no in flight at a time, one queue per biz_no)",
    "ordering.dead.head" => "per-biz-no only: skip (later events go on) or block (later events wait) when a key's head is dead-lettered",
    "publisher" => "rocketmq, or none (this process only enqueues; another instance or outboxd relays)",
    "rocketmq.namesrv" => "RocketMQ name server address(es), host:port;host:port",
    "rocketmq.producer.group" => "producer group",
    "rocketmq.retries" => "client-side resends of one send within send.timeout.ms; each is a duplicate the relay cannot count, so 0 leaves retries to the relay (counted, with backoff)",
    "rocketmq.access.key" => "ACL access key (never logged)",
    "rocketmq.secret.key" => "ACL secret key (never logged)",
    "rocketmq.tag.source" => "event-type (tag = the row's event type when it sets none) or none",
    "retention.age.ms" => "delete SUCCESS and DISCARDED rows older than this (0 keeps them forever)",
    "retention.batch.size" => "rows deleted per statement by the retention job",
    "retention.interval.ms" => "delay between retention rounds",
    "retention.round.max.ms" => "longest a retention round runs before it waits for the next one",
    "log.level" => "off, error, warn, info, debug or trace: the library's log threshold in this process, applied when a relay starts (empty leaves it; the default is info, no line per event)",
    "db.pool.wait.ms" => "how long a library-owned transaction's begin waits for a free pool connection before failing with a pool timeout (0 waits forever)",
    "metrics.listen" => "outboxd only: host:port of the Prometheus /metrics and /healthz endpoint (empty = off)",
    "otel.exporter.otlp.endpoint" => "outboxd only: OTLP/HTTP collector to send spans to (http://collector:4318; empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no export); needs a build with the cargo feature otlp (docs/tracing.md)",
    "otel.service.name" => "outboxd only: service.name of the spans it exports (OTEL_SERVICE_NAME wins when set)",
    "consumer.threads" => "consumer: handler threads, each with its own database connection; a queue always goes to the same thread",
    "consumer.batch.max" => "consumer: most messages one handler transaction takes (the messages waiting, never waiting for more); 1 = one message per transaction",
    "consumer.max.attempts" => "consumer: handler attempts per message before it is parked in the dead-letter table",
    "consumer.backoff.initial.ms" => "consumer: wait after a handler's first failure, doubling per attempt",
    "consumer.backoff.max.ms" => "consumer: longest wait between attempts",
    "consumer.queue.capacity" => "consumer: messages waiting per handler thread before the poller waits",
    "consumer.persist.interval.ms" => "consumer: how often committed offsets are also stored with the broker (and at stop)",
    "consumer.replay.interval.ms" => "consumer: how often the group's dead letters asked for replay are looked for",
    "consumer.inbox" => "consumer: mark each event key in the inbox in the handler's transaction (false: every copy runs the handler; only for handlers idempotent by themselves)",
    "consumer.start.from" => "consumer: where a new group starts in its topic: first (every message the broker has) or last (only messages sent after it subscribed)",
    "consumer.pull.batch" => "consumer: messages per pull request to the broker",
    "inbox.table" => "consumer: the inbox table (letters, digits, underscore)",
    "inbox.dead_letter.table" => "consumer: the consumer's dead-letter table (letters, digits, underscore)",
    "inbox.retention.ms" => "consumer: marks older than this are deleted (0 keeps them; at least 1 h: the broker redelivers for hours)",
    "inbox.retention.interval.ms" => "consumer: delay between retention rounds over the marks",
    "console.enabled" => "outboxd only: serve the operator console (docs/console.md)",
    "console.listen" => "outboxd only: host:port of the console (loopback by default: put a TLS proxy in front to reach it from elsewhere)",
    "console.admin.token" => "console: the token that lets an operator act (replay, discard, pause), at least 16 characters (never logged; empty: the console only reads)",
    "console.read.token" => "console: the token that lets an operator read, at least 16 characters (never logged)",
    "console.read.open" => "console: read without any token (only on a network you trust); actions still need the admin token",
    "console.consumer.db.url" => "console: the database of the consumers' inbox and dead-letter tables (empty: db.url)",
}

/// Keys whose values are secrets: shown as `***` by [`Config::get_redacted`].
pub const SECRET_KEYS: &[&str] = &[
    "rocketmq.access.key",
    "rocketmq.secret.key",
    "console.admin.token",
    "console.read.token",
];

impl Config {
    /// Sets one key from its string form; the error names the key and the value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.set_value(key, value)?;
        if let Some(k) = KEYS.iter().find(|k| k.key == key && k.key != "profile") {
            self.explicit.0.insert(k.key);
        }
        Ok(())
    }

    pub(super) fn set_value(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let v = value.trim();
        match key {
            "profile" => self.apply_profile(choice(
                key,
                v,
                &[("default", Profile::Default), ("seed", Profile::Seed)],
            )?),
            "startup.db.wait.ms" => self.startup_db_wait = millis(key, v, 0, 86_400_000)?,
            "db.url" => {
                if v.is_empty() {
                    return Err(ConfigError::invalid(key, value, "must not be empty"));
                }
                mysql::Opts::from_url(v)
                    .map_err(|e| ConfigError::invalid(key, redact_url(v), crate::error::describe_url_error(&e)))?;
                self.db_url = v.to_string();
            }
            "db.pool.max" => self.db_pool_max = int(key, v, 1, 1024)?,
            "table" => self.table = table_name(key, v)?,
            "instance.id" => {
                self.instance_id = if v.is_empty() {
                    None
                } else {
                    Some(printable(key, v, 128)?)
                }
            }
            "service.name" => self.service_name = printable(key, v, 64)?,
            "service.port" => {
                self.service_port = if v.is_empty() {
                    None
                } else {
                    Some(int(key, v, 1, 65535)?)
                }
            }
            "claim.strategy" => {
                self.claim_strategy = choice(
                    key,
                    v,
                    &[
                        ("skip-locked", ClaimStrategy::SkipLocked),
                        ("per-row", ClaimStrategy::PerRow),
                    ],
                )?
            }
            "batch.size" => self.batch_size = int(key, v, 1, 10_000)?,
            "scan.interval.ms" => self.scan_interval = millis(key, v, 1, 3_600_000)?,
            "scan.drain" => self.scan_drain = boolean(key, v)?,
            "reclaim.interval.ms" => self.reclaim_interval = millis(key, v, 10, 3_600_000)?,
            "lease.ms" => self.lease = millis(key, v, 100, 86_400_000)?,
            "lease.renew.fraction" => self.lease_renew_fraction = fraction(key, v, 0.0, 0.9)?,
            "max.retry" => self.max_retry = int(key, v, 0, 1000)?,
            "backoff.policy" => {
                self.backoff.policy = choice(
                    key,
                    v,
                    &[
                        ("fixed", BackoffPolicy::Fixed),
                        ("quadratic", BackoffPolicy::Quadratic),
                        ("exponential", BackoffPolicy::Exponential),
                    ],
                )?
            }
            "backoff.base.ms" => self.backoff.base = millis(key, v, 0, 86_400_000)?,
            "backoff.max.ms" => self.backoff.max = millis(key, v, 0, 7 * 86_400_000)?,
            "backoff.jitter" => self.backoff.jitter = fraction(key, v, 0.0, 1.0)?,
            "workers" => self.workers = int(key, v, 1, 256)?,
            "publish.batch.max" => self.publish_batch_max = int(key, v, 1, 1000)?,
            "max.in.flight" => self.max_in_flight = int(key, v, 1, 1_000_000)?,
            "send.timeout.ms" => self.send_timeout = millis(key, v, 10, 600_000)?,
            "payload.max.bytes" => self.payload_max_bytes = int(key, v, 1, 16 * 1024 * 1024 - 1)?,
            "topic" => self.topic = topic(key, v)?,
            "breaker.failure.threshold" => self.breaker_failure_threshold = int(key, v, 1, 1_000_000)?,
            "breaker.open.ms" => self.breaker_open = millis(key, v, 10, 3_600_000)?,
            "ordering" => {
                self.ordering = choice(key, v, &[("none", Ordering::None), ("per-biz-no", Ordering::PerBizNo)])?
            }
            "ordering.dead.head" => {
                self.ordering_dead_head = choice(
                    key,
                    v,
                    &[("skip", DeadHeadPolicy::Skip), ("block", DeadHeadPolicy::Block)],
                )?
            }
            "publisher" => {
                self.publisher = choice(
                    key,
                    v,
                    &[("rocketmq", PublisherKind::RocketMq), ("none", PublisherKind::None)],
                )?
            }
            "rocketmq.namesrv" => self.rocketmq.namesrv = namesrv(key, v)?,
            "rocketmq.producer.group" => self.rocketmq.producer_group = printable(key, v, 255)?,
            "rocketmq.retries" => self.rocketmq.retries = int(key, v, 0, 16)?,
            "rocketmq.access.key" => self.rocketmq.access_key = optional(v),
            "rocketmq.secret.key" => self.rocketmq.secret_key = optional(v),
            "rocketmq.tag.source" => {
                self.rocketmq.tag_source = choice(
                    key,
                    v,
                    &[("event-type", TagSource::EventType), ("none", TagSource::None)],
                )?
            }
            "retention.age.ms" => {
                let ms: u64 = int(key, v, 0, 10 * 365 * 86_400_000)?;
                self.retention_age = (ms > 0).then(|| Duration::from_millis(ms));
            }
            "retention.batch.size" => self.retention_batch = int(key, v, 1, 100_000)?,
            "retention.interval.ms" => self.retention_interval = millis(key, v, 10, 86_400_000)?,
            "retention.round.max.ms" => self.retention_round_max = millis(key, v, 10, 3_600_000)?,
            "log.level" => {
                self.log_level = if v.is_empty() {
                    None
                } else {
                    Some(choice(
                        key,
                        &v.to_ascii_lowercase(),
                        &[
                            ("off", log::LevelFilter::Off),
                            ("error", log::LevelFilter::Error),
                            ("warn", log::LevelFilter::Warn),
                            ("info", log::LevelFilter::Info),
                            ("debug", log::LevelFilter::Debug),
                            ("trace", log::LevelFilter::Trace),
                        ],
                    )?)
                }
            }
            "db.pool.wait.ms" => {
                let ms: u64 = int(key, v, 0, 86_400_000)?;
                self.db_pool_wait = (ms > 0).then(|| Duration::from_millis(ms));
            }
            "consumer.threads" => self.consumer.threads = int(key, v, 1, 256)?,
            "consumer.batch.max" => self.consumer.batch_max = int(key, v, 1, MAX_BATCH_MAX)?,
            "consumer.max.attempts" => self.consumer.max_attempts = int(key, v, 1, 1000)?,
            "consumer.backoff.initial.ms" => self.consumer.backoff_initial = millis(key, v, 1, 3_600_000)?,
            "consumer.backoff.max.ms" => self.consumer.backoff_max = millis(key, v, 1, 86_400_000)?,
            "consumer.queue.capacity" => self.consumer.queue_capacity = int(key, v, 1, 100_000)?,
            "consumer.persist.interval.ms" => self.consumer.persist_interval = millis(key, v, 1, 3_600_000)?,
            "consumer.replay.interval.ms" => self.consumer.replay_interval = millis(key, v, 1, 3_600_000)?,
            "consumer.inbox" => self.consumer.inbox = boolean(key, v)?,
            "consumer.start.from" => {
                self.consumer.start_from = choice(key, v, &[("first", StartFrom::First), ("last", StartFrom::Last)])?
            }
            "consumer.pull.batch" => self.consumer.pull_batch = int(key, v, 1, 1024)?,
            "inbox.table" => self.consumer.inbox_table = table_name(key, v)?,
            "inbox.dead_letter.table" => self.consumer.dead_letter_table = table_name(key, v)?,
            "inbox.retention.ms" => {
                let keep = millis(key, v, 0, 10 * 365 * 86_400_000)?;
                if !keep.is_zero() && keep < MIN_INBOX_RETENTION {
                    return Err(ConfigError::invalid(key, v, RETENTION_TOO_SHORT));
                }
                self.consumer.retention = (!keep.is_zero()).then_some(keep);
            }
            "inbox.retention.interval.ms" => self.consumer.retention_interval = millis(key, v, 1, 86_400_000)?,
            "console.enabled" => self.console.enabled = boolean(key, v)?,
            "console.listen" => {
                v.parse::<std::net::SocketAddr>()
                    .map_err(|_| ConfigError::invalid(key, v, "expected host:port, e.g. 127.0.0.1:9470"))?;
                self.console.listen = v.to_string();
            }
            "console.admin.token" => self.console.admin_token = token(key, value)?,
            "console.read.token" => self.console.read_token = token(key, value)?,
            "console.read.open" => self.console.read_open = boolean(key, v)?,
            "console.consumer.db.url" => {
                self.console.consumer_db_url = if v.is_empty() {
                    None
                } else {
                    mysql::Opts::from_url(v)
                        .map_err(|e| ConfigError::invalid(key, redact_url(v), crate::error::describe_url_error(&e)))?;
                    Some(v.to_string())
                }
            }
            "metrics.listen" => {
                self.metrics_listen = if v.is_empty() {
                    None
                } else {
                    v.parse::<std::net::SocketAddr>()
                        .map_err(|_| ConfigError::invalid(key, v, "expected host:port, e.g. 127.0.0.1:9464"))?;
                    Some(v.to_string())
                }
            }
            "otel.exporter.otlp.endpoint" => {
                self.otel.endpoint = if v.is_empty() {
                    None
                } else {
                    let rest = v
                        .strip_prefix("http://")
                        .or_else(|| v.strip_prefix("https://"))
                        .ok_or_else(|| {
                            ConfigError::invalid(key, v, "expected http://host:port or https://host:port")
                        })?;
                    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
                        return Err(ConfigError::invalid(
                            key,
                            v,
                            "expected http://host:port or https://host:port",
                        ));
                    }
                    Some(v.to_string())
                }
            }
            "otel.service.name" => {
                if v.is_empty() || v.chars().count() > 128 || v.chars().any(char::is_control) {
                    return Err(ConfigError::invalid(
                        key,
                        v,
                        "must be 1 to 128 characters without control characters",
                    ));
                }
                self.otel.service_name = v.to_string();
            }
            _ => return Err(ConfigError::UnknownKey { key: key.to_string() }),
        }
        Ok(())
    }

    /// The current value of a key in the form [`Config::set`] accepts; `None` for unknown keys.
    pub fn get(&self, key: &str) -> Option<String> {
        let ms = |d: &Duration| d.as_millis().to_string();
        Some(match key {
            "profile" => match self.profile {
                Profile::Default => "default",
                Profile::Seed => "seed",
            }
            .into(),
            "startup.db.wait.ms" => ms(&self.startup_db_wait),
            "db.url" => self.db_url.clone(),
            "db.pool.max" => self.db_pool_max.to_string(),
            "table" => self.table.clone(),
            "instance.id" => self.instance_id.clone().unwrap_or_default(),
            "service.name" => self.service_name.clone(),
            "service.port" => self.service_port.map(|p| p.to_string()).unwrap_or_default(),
            "claim.strategy" => match self.claim_strategy {
                ClaimStrategy::SkipLocked => "skip-locked",
                ClaimStrategy::PerRow => "per-row",
            }
            .into(),
            "batch.size" => self.batch_size.to_string(),
            "scan.interval.ms" => ms(&self.scan_interval),
            "scan.drain" => self.scan_drain.to_string(),
            "reclaim.interval.ms" => ms(&self.reclaim_interval),
            "lease.ms" => ms(&self.lease),
            "lease.renew.fraction" => self.lease_renew_fraction.to_string(),
            "max.retry" => self.max_retry.to_string(),
            "backoff.policy" => match self.backoff.policy {
                BackoffPolicy::Fixed => "fixed",
                BackoffPolicy::Quadratic => "quadratic",
                BackoffPolicy::Exponential => "exponential",
            }
            .into(),
            "backoff.base.ms" => ms(&self.backoff.base),
            "backoff.max.ms" => ms(&self.backoff.max),
            "backoff.jitter" => self.backoff.jitter.to_string(),
            "workers" => self.workers.to_string(),
            "publish.batch.max" => self.publish_batch_max.to_string(),
            "max.in.flight" => self.max_in_flight.to_string(),
            "send.timeout.ms" => ms(&self.send_timeout),
            "payload.max.bytes" => self.payload_max_bytes.to_string(),
            "topic" => self.topic.clone(),
            "breaker.failure.threshold" => self.breaker_failure_threshold.to_string(),
            "breaker.open.ms" => ms(&self.breaker_open),
            "ordering" => match self.ordering {
                Ordering::None => "none",
                Ordering::PerBizNo => "per-biz-no",
            }
            .into(),
            "ordering.dead.head" => match self.ordering_dead_head {
                DeadHeadPolicy::Skip => "skip",
                DeadHeadPolicy::Block => "block",
            }
            .into(),
            "publisher" => match self.publisher {
                PublisherKind::RocketMq => "rocketmq",
                PublisherKind::None => "none",
            }
            .into(),
            "rocketmq.namesrv" => self.rocketmq.namesrv.clone(),
            "rocketmq.producer.group" => self.rocketmq.producer_group.clone(),
            "rocketmq.retries" => self.rocketmq.retries.to_string(),
            "rocketmq.access.key" => self.rocketmq.access_key.clone().unwrap_or_default(),
            "rocketmq.secret.key" => self.rocketmq.secret_key.clone().unwrap_or_default(),
            "rocketmq.tag.source" => match self.rocketmq.tag_source {
                TagSource::EventType => "event-type",
                TagSource::None => "none",
            }
            .into(),
            "retention.age.ms" => self.retention_age.map(|d| d.as_millis()).unwrap_or(0).to_string(),
            "retention.batch.size" => self.retention_batch.to_string(),
            "retention.interval.ms" => ms(&self.retention_interval),
            "retention.round.max.ms" => ms(&self.retention_round_max),
            "metrics.listen" => self.metrics_listen.clone().unwrap_or_default(),
            "otel.exporter.otlp.endpoint" => self.otel.endpoint.clone().unwrap_or_default(),
            "otel.service.name" => self.otel.service_name.clone(),
            "log.level" => self
                .log_level
                .map(|l| l.as_str().to_ascii_lowercase())
                .unwrap_or_default(),
            "db.pool.wait.ms" => self.db_pool_wait.map(|d| d.as_millis()).unwrap_or(0).to_string(),
            "consumer.threads" => self.consumer.threads.to_string(),
            "consumer.batch.max" => self.consumer.batch_max.to_string(),
            "consumer.max.attempts" => self.consumer.max_attempts.to_string(),
            "consumer.backoff.initial.ms" => ms(&self.consumer.backoff_initial),
            "consumer.backoff.max.ms" => ms(&self.consumer.backoff_max),
            "consumer.queue.capacity" => self.consumer.queue_capacity.to_string(),
            "consumer.persist.interval.ms" => ms(&self.consumer.persist_interval),
            "consumer.replay.interval.ms" => ms(&self.consumer.replay_interval),
            "consumer.inbox" => self.consumer.inbox.to_string(),
            "consumer.start.from" => match self.consumer.start_from {
                StartFrom::First => "first",
                StartFrom::Last => "last",
            }
            .into(),
            "consumer.pull.batch" => self.consumer.pull_batch.to_string(),
            "inbox.table" => self.consumer.inbox_table.clone(),
            "inbox.dead_letter.table" => self.consumer.dead_letter_table.clone(),
            "inbox.retention.ms" => self.consumer.retention.map(|d| d.as_millis()).unwrap_or(0).to_string(),
            "inbox.retention.interval.ms" => ms(&self.consumer.retention_interval),
            "console.enabled" => self.console.enabled.to_string(),
            "console.listen" => self.console.listen.clone(),
            "console.admin.token" => self.console.admin_token.clone().unwrap_or_default(),
            "console.read.token" => self.console.read_token.clone().unwrap_or_default(),
            "console.read.open" => self.console.read_open.to_string(),
            "console.consumer.db.url" => self.console.consumer_db_url.clone().unwrap_or_default(),
            _ => return None,
        })
    }

    /// Like [`Config::get`], with secrets masked and the password removed from `db.url`.
    pub fn get_redacted(&self, key: &str) -> Option<String> {
        let v = self.get(key)?;
        Some(if SECRET_KEYS.contains(&key) && !v.is_empty() {
            "***".into()
        } else if key == "db.url" || key == "console.consumer.db.url" {
            redact_url(&v)
        } else {
            v
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_round_trips_through_get_and_set() {
        let mut c = Config::new("mysql://root@127.0.0.1:3306/test");
        c.rocketmq.access_key = Some("ak".into());
        c.rocketmq.secret_key = Some("sk".into());
        for k in KEYS {
            let v = c.get(k.key).unwrap_or_else(|| panic!("get({}) is None", k.key));
            let mut d = c.clone();
            d.set(k.key, &v)
                .unwrap_or_else(|e| panic!("set({}, {v:?}): {e}", k.key));
            assert_eq!(d, c, "key {}", k.key);
        }
    }

    #[test]
    fn unknown_key_and_invalid_value_are_distinct_and_named() {
        let mut c = Config::default();
        assert_eq!(
            c.set("scan.intervall.ms", "1"),
            Err(ConfigError::UnknownKey {
                key: "scan.intervall.ms".into()
            })
        );
        let e = c.set("scan.interval.ms", "soon").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("scan.interval.ms") && msg.contains("soon"), "{msg}");
        assert!(matches!(e, ConfigError::InvalidValue { .. }));
    }

    #[test]
    fn table_name_with_sql_is_refused() {
        let mut c = Config::default();
        let e = c.set("table", "t; DROP TABLE x").unwrap_err().to_string();
        assert!(e.contains("table") && e.contains("t; DROP TABLE x"), "{e}");
        assert!(c.set("table", "1abc").is_err());
        assert!(c.set("table", "orders_outbox").is_ok());
    }
}
