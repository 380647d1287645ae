//! Configuration: one typed [`Config`] with defaults, the seed-compatible profile, and string
//! key/value setting shared by the C ABI, JNI and the daemon.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;

/// How a scanner takes ownership of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStrategy {
    /// One short transaction: `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, one UPDATE of the
    /// batch to SENDING, commit. Instances never wait on each other's rows.
    SkipLocked,
    /// The seed's way: a lock-free candidate SELECT, then one conditional UPDATE per row; the
    /// affected-row count decides who owns the row.
    PerRow,
}

/// How the delay before a retry grows with the attempt number `n` (1 for the first retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffPolicy {
    /// `base`
    Fixed,
    /// `n² · base` (the seed: 5 s, 20 s, 45 s)
    Quadratic,
    /// `2^(n-1) · base`
    Exponential,
}

/// Retry delay: policy, base, cap and jitter. Computed by the database from the row's own
/// `retry_count`, so it follows the DB clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub policy: BackoffPolicy,
    pub base: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Fraction in `[0, 1]`: each delay is reduced by a random share of up to this much.
    pub jitter: f64,
}

impl Backoff {
    /// The delay before attempt `n + 1`, given that `n >= 1` attempts have failed, without jitter.
    /// (The relay computes the same thing in SQL; this is for logs, docs and tests.)
    pub fn delay(&self, n: u32) -> Duration {
        let n = n.max(1) as u64;
        let base = self.base.as_millis() as u64;
        let ms = match self.policy {
            BackoffPolicy::Fixed => base,
            BackoffPolicy::Quadratic => base.saturating_mul(n * n),
            BackoffPolicy::Exponential => base.saturating_mul(1u64.checked_shl((n - 1) as u32).unwrap_or(u64::MAX)),
        };
        Duration::from_millis(ms.min(self.max.as_millis() as u64))
    }
}

/// Delivery order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// No order between events; maximum parallelism.
    None,
    /// Events of one `biz_no` go to one queue, one at a time, in commit order.
    PerBizNo,
}

/// What `ordering = per-biz-no` does when the head event of a key is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadHeadPolicy {
    /// Later events of the key go on (the dead letter is replayed by hand, out of order).
    Skip,
    /// Later events of the key wait until the dead letter is replayed or discarded.
    Block,
}

/// A named starting point for the settings; keys set after it override its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The project's defaults ([`Config::default`]).
    Default,
    /// The seed's settings ([`Config::seed_compatible`]).
    Seed,
}

/// The keys a [`Profile`] sets.
const PROFILE_KEYS: &[&str] = &[
    "claim.strategy",
    "batch.size",
    "scan.interval.ms",
    "scan.drain",
    "reclaim.interval.ms",
    "lease.ms",
    "lease.renew.fraction",
    "max.retry",
    "backoff.policy",
    "backoff.base.ms",
    "backoff.max.ms",
    "backoff.jitter",
    "workers",
    "publish.batch.max",
    "max.in.flight",
    "topic",
];

/// The keys given a value with [`Config::set`], which a profile leaves as they are. Bookkeeping
/// only: two configurations with the same values are equal whichever keys were set.
#[derive(Debug, Clone, Default)]
pub struct ExplicitKeys(std::collections::BTreeSet<&'static str>);

impl PartialEq for ExplicitKeys {
    fn eq(&self, _: &ExplicitKeys) -> bool {
        true
    }
}

/// Length of the `claim_owner` column of a table created (or upgraded) by the migrations: the
/// longest instance id the relay can store.
pub const CLAIM_OWNER_MAX_CHARS: usize = 128;

/// Which broker the relay publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublisherKind {
    /// Apache RocketMQ (feature `rocketmq`).
    RocketMq,
    /// No relaying in this process: enqueue only (another instance or `outboxd` relays).
    None,
}

/// Settings of the RocketMQ publisher (feature `rocketmq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocketMqConfig {
    /// Name server address(es), `host:port;host:port`.
    pub namesrv: String,
    pub producer_group: String,
    /// Retries inside the client for one send (all within the send timeout).
    pub retries: u32,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    /// Where the message tag comes from when the row has none.
    pub tag_source: TagSource,
}

/// Where a message's tag comes from when the row sets none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagSource {
    /// The row's event type.
    EventType,
    /// No tag.
    None,
}

/// The whole configuration of one relay instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The profile the settings started from (the values it sets may have been overridden since).
    pub profile: Profile,
    /// `mysql://user:pass@host:port/db`. Required.
    pub db_url: String,
    /// How long `outboxd run` keeps retrying a database it cannot reach at start (0 = fail at once).
    pub startup_db_wait: Duration,
    /// Largest number of connections the relay opens.
    pub db_pool_max: usize,
    /// The outbox table (identifier characters only).
    pub table: String,
    /// Instance id stored in `claim_owner`; `None` derives `<service>-<port or pid>-<random6>`.
    pub instance_id: Option<String>,
    pub service_name: String,
    pub service_port: Option<u16>,
    pub claim_strategy: ClaimStrategy,
    /// Most rows claimed by one scan round.
    pub batch_size: usize,
    /// Delay between scan rounds (fixed delay; rounds never overlap).
    pub scan_interval: Duration,
    /// Scan again at once when a round claimed a full batch (a backlog is waiting).
    pub scan_drain: bool,
    pub reclaim_interval: Duration,
    /// How long a claim is valid without renewal.
    pub lease: Duration,
    /// Renew the lease of a send in flight longer than this fraction of the lease (0 = never).
    pub lease_renew_fraction: f64,
    /// Attempts after the first before a row is dead-lettered (the seed: 3).
    pub max_retry: u32,
    pub backoff: Backoff,
    pub workers: usize,
    /// Most events handed to one `Publisher::publish` call.
    pub publish_batch_max: usize,
    /// Most claimed events held by this instance at once (backpressure on the scanner).
    pub max_in_flight: usize,
    /// Budget of one publish call. Must be well below the lease.
    pub send_timeout: Duration,
    pub payload_max_bytes: usize,
    /// Topic of rows whose `topic` column is NULL.
    pub topic: String,
    /// Consecutive broker-wide failures (or timeouts) that open the circuit breaker.
    pub breaker_failure_threshold: u32,
    /// How long the breaker stays open before one probe event is tried.
    pub breaker_open: Duration,
    pub ordering: Ordering,
    pub ordering_dead_head: DeadHeadPolicy,
    pub publisher: PublisherKind,
    pub rocketmq: RocketMqConfig,
    /// Delete SUCCESS (and DISCARDED) rows older than this; `None` keeps them.
    pub retention_age: Option<Duration>,
    /// Rows deleted per statement by the retention job.
    pub retention_batch: usize,
    pub retention_interval: Duration,
    /// Longest a retention round may run before it yields until the next interval.
    pub retention_round_max: Duration,
    /// `host:port` of the daemon's metrics endpoint; `None` = off.
    pub metrics_listen: Option<String>,
    /// Keys set with [`Config::set`] (a profile applied later keeps their values).
    pub explicit: ExplicitKeys,
    /// Process-wide log threshold applied when a relay opens (`log.level`); `None` leaves it.
    pub log_level: Option<log::LevelFilter>,
    /// How long `outbox_tx_begin` (and the bindings' `begin`) waits for a free pool connection
    /// (`db.pool.wait.ms`); `None` waits as long as it takes.
    pub db_pool_wait: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profile: Profile::Default,
            db_url: String::new(),
            startup_db_wait: Duration::from_secs(300),
            db_pool_max: 8,
            table: "t_event_record".into(),
            instance_id: None,
            service_name: "outbox".into(),
            service_port: None,
            claim_strategy: ClaimStrategy::SkipLocked,
            batch_size: 500,
            scan_interval: Duration::from_millis(1000),
            scan_drain: true,
            reclaim_interval: Duration::from_secs(10),
            lease: Duration::from_secs(120),
            lease_renew_fraction: 0.5,
            max_retry: 5,
            backoff: Backoff {
                policy: BackoffPolicy::Quadratic,
                base: Duration::from_secs(5),
                max: Duration::from_secs(600),
                jitter: 0.0,
            },
            workers: 4,
            publish_batch_max: 128,
            max_in_flight: 1000,
            send_timeout: Duration::from_secs(3),
            payload_max_bytes: 4 * 1024 * 1024,
            topic: "ORDER_EVENT_TOPIC".into(),
            breaker_failure_threshold: 5,
            breaker_open: Duration::from_secs(5),
            ordering: Ordering::None,
            ordering_dead_head: DeadHeadPolicy::Skip,
            publisher: PublisherKind::RocketMq,
            rocketmq: RocketMqConfig {
                namesrv: "127.0.0.1:9876".into(),
                producer_group: "outbox_producer".into(),
                retries: 0,
                access_key: None,
                secret_key: None,
                tag_source: TagSource::EventType,
            },
            retention_age: None,
            retention_batch: 500,
            retention_interval: Duration::from_secs(60),
            retention_round_max: Duration::from_secs(2),
            metrics_listen: None,
            explicit: ExplicitKeys::default(),
            log_level: None,
            db_pool_wait: Some(Duration::from_secs(30)),
        }
    }
}

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
}

/// Keys whose values are secrets: shown as `***` by [`Config::get_redacted`].
pub const SECRET_KEYS: &[&str] = &["rocketmq.access.key", "rocketmq.secret.key"];

impl Config {
    /// The project's defaults with a database URL.
    pub fn new(db_url: impl Into<String>) -> Self {
        Config {
            db_url: db_url.into(),
            ..Config::default()
        }
    }

    /// The seed's settings: batch 20, scan every 5 s without draining, reclaim every 60 s,
    /// lease 10 min, max retry 3, `n² · 5 s`, per-row claims, one sequential sender.
    pub fn seed_compatible(db_url: impl Into<String>) -> Self {
        let mut c = Config::new(db_url);
        c.apply_profile(Profile::Seed);
        c
    }

    /// The values of a profile, on top of the defaults.
    fn profile_values(profile: Profile) -> Config {
        let mut c = Config::default();
        if profile == Profile::Seed {
            c.claim_strategy = ClaimStrategy::PerRow;
            c.batch_size = 20;
            c.scan_interval = Duration::from_secs(5);
            c.scan_drain = false;
            c.reclaim_interval = Duration::from_secs(60);
            c.lease = Duration::from_secs(600);
            c.lease_renew_fraction = 0.0;
            c.max_retry = 3;
            c.backoff = Backoff {
                policy: BackoffPolicy::Quadratic,
                base: Duration::from_secs(5),
                max: Duration::from_secs(3600),
                jitter: 0.0,
            };
            c.workers = 1;
            c.publish_batch_max = 1;
            c.max_in_flight = 20;
            c.topic = "ORDER_EVENT_TOPIC".into();
        }
        c
    }

    /// Sets every value a profile defines, except the keys already given a value with
    /// [`Config::set`]: those win whatever order the keys come in (a TOML file, a Go map, Java
    /// properties).
    pub fn apply_profile(&mut self, profile: Profile) {
        let target = Config::profile_values(profile);
        for key in PROFILE_KEYS {
            if !self.explicit.0.contains(key) {
                let v = target.get(key).expect("a profile key");
                self.set_value(key, &v).expect("a profile's values are valid");
            }
        }
        self.profile = profile;
    }

    /// Sets one key from its string form; the error names the key and the value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.set_value(key, value)?;
        if let Some(k) = KEYS.iter().find(|k| k.key == key && k.key != "profile") {
            self.explicit.0.insert(k.key);
        }
        Ok(())
    }

    fn set_value(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
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
            "metrics.listen" => {
                self.metrics_listen = if v.is_empty() {
                    None
                } else {
                    v.parse::<std::net::SocketAddr>()
                        .map_err(|_| ConfigError::invalid(key, v, "expected host:port, e.g. 127.0.0.1:9464"))?;
                    Some(v.to_string())
                }
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
            "log.level" => self
                .log_level
                .map(|l| l.as_str().to_ascii_lowercase())
                .unwrap_or_default(),
            "db.pool.wait.ms" => self.db_pool_wait.map(|d| d.as_millis()).unwrap_or(0).to_string(),
            _ => return None,
        })
    }

    /// Like [`Config::get`], with secrets masked and the password removed from `db.url`.
    pub fn get_redacted(&self, key: &str) -> Option<String> {
        let v = self.get(key)?;
        Some(if SECRET_KEYS.contains(&key) && !v.is_empty() {
            "***".into()
        } else if key == "db.url" {
            redact_url(&v)
        } else {
            v
        })
    }

    /// The longest instance id derived from `service.name` and `service.port` can be (the
    /// process id, up to 10 digits, stands in for an unset port).
    pub fn longest_derived_instance_id(&self) -> usize {
        let port = self.service_port.map(|p| p.to_string().len()).unwrap_or(10);
        self.service_name.chars().count() + 1 + port + 1 + 6
    }

    /// Checks the values against each other. [`crate::Relay::start`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every whole-configuration problem [`Config::validate`] checks, all at once (the daemon
    /// reports them together).
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        if self.db_url.trim().is_empty() {
            out.push(ConfigError::invalid("db.url", "", "is required"));
        }
        // The fields are public: check what goes into SQL text even when it was not set by `set`.
        if let Err(e) = table_name("table", &self.table) {
            out.push(e);
        }
        if let Err(e) = topic("topic", &self.topic) {
            out.push(e);
        }
        // The instance id goes into claim_owner (VARCHAR(128)); one that does not fit would make
        // every claim fail.
        match &self.instance_id {
            Some(id) if id.chars().count() > CLAIM_OWNER_MAX_CHARS => out.push(ConfigError::invalid(
                "instance.id",
                id,
                format!(
                    "is {} characters; claim_owner holds at most {CLAIM_OWNER_MAX_CHARS}",
                    id.chars().count()
                ),
            )),
            Some(_) => {}
            None if self.longest_derived_instance_id() > CLAIM_OWNER_MAX_CHARS => out.push(ConfigError::invalid(
                "service.name",
                &self.service_name,
                format!(
                    "is {} characters: the derived instance id <service.name>-<port or pid>-<6 hex> \
                         could be {} characters, and claim_owner holds at most {CLAIM_OWNER_MAX_CHARS}; \
                         use at most {} characters or set instance.id",
                    self.service_name.chars().count(),
                    self.longest_derived_instance_id(),
                    CLAIM_OWNER_MAX_CHARS - (self.longest_derived_instance_id() - self.service_name.chars().count())
                ),
            )),
            None => {}
        }
        if self.send_timeout * 4 > self.lease {
            out.push(ConfigError::Inconsistent {
                keys: vec!["send.timeout.ms".into(), "lease.ms".into()],
                reason: format!(
                    "send.timeout.ms = {} must be at most a quarter of lease.ms = {} so that a send ends long before its lease",
                    self.send_timeout.as_millis(),
                    self.lease.as_millis()
                ),
            });
        }
        if self.backoff.max < self.backoff.base {
            out.push(ConfigError::Inconsistent {
                keys: vec!["backoff.base.ms".into(), "backoff.max.ms".into()],
                reason: format!(
                    "backoff.max.ms = {} is below backoff.base.ms = {}",
                    self.backoff.max.as_millis(),
                    self.backoff.base.as_millis()
                ),
            });
        }
        if self.rocketmq.access_key.is_some() != self.rocketmq.secret_key.is_some() {
            out.push(ConfigError::Inconsistent {
                keys: vec!["rocketmq.access.key".into(), "rocketmq.secret.key".into()],
                reason: "set both or neither".into(),
            });
        }
        out
    }
}

/// Replaces the password of a `scheme://user:password@host/...` URL with `***`.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.rfind('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!("{}{}:***{}", &url[..scheme_end + 3], &userinfo[..colon], &rest[at..]);
            }
        }
    }
    url.to_string()
}

fn int<T>(key: &str, v: &str, min: T, max: T) -> Result<T, ConfigError>
where
    T: FromStr + PartialOrd + Display + Copy,
{
    let n: T = v
        .parse()
        .map_err(|_| ConfigError::invalid(key, v, format!("expected a whole number from {min} to {max}")))?;
    if n < min || n > max {
        return Err(ConfigError::invalid(key, v, format!("must be from {min} to {max}")));
    }
    Ok(n)
}

fn millis(key: &str, v: &str, min: u64, max: u64) -> Result<Duration, ConfigError> {
    int(key, v, min, max).map(Duration::from_millis)
}

fn fraction(key: &str, v: &str, min: f64, max: f64) -> Result<f64, ConfigError> {
    let x: f64 = v
        .parse()
        .map_err(|_| ConfigError::invalid(key, v, format!("expected a number from {min} to {max}")))?;
    if !(min..=max).contains(&x) {
        return Err(ConfigError::invalid(key, v, format!("must be from {min} to {max}")));
    }
    Ok(x)
}

fn boolean(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::invalid(key, v, "expected true or false")),
    }
}

fn choice<T: Copy>(key: &str, v: &str, options: &[(&str, T)]) -> Result<T, ConfigError> {
    options
        .iter()
        .find(|(name, _)| *name == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            ConfigError::invalid(key, v, format!("expected one of {}", names.join(", ")))
        })
}

fn optional(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_string())
}

fn printable(key: &str, v: &str, max: usize) -> Result<String, ConfigError> {
    if v.is_empty() {
        return Err(ConfigError::invalid(key, v, "must not be empty"));
    }
    if v.chars().count() > max {
        return Err(ConfigError::invalid(key, v, format!("is longer than {max} characters")));
    }
    if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ConfigError::invalid(
            key,
            v,
            "must not contain spaces or control characters",
        ));
    }
    Ok(v.to_string())
}

/// A table name is used inside SQL text, so only identifier characters are allowed.
pub(crate) fn table_name(key: &str, v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !v.as_bytes()[0].is_ascii_digit();
    if !ok {
        return Err(ConfigError::invalid(
            key,
            v,
            "must be 1 to 64 letters, digits or underscores, not starting with a digit",
        ));
    }
    Ok(v.to_string())
}

fn topic(key: &str, v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= crate::event::MAX_TOPIC_CHARS
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%' | b'|'));
    if !ok {
        return Err(ConfigError::invalid(
            key,
            v,
            "must be 1 to 127 characters of [A-Za-z0-9_%|-]",
        ));
    }
    Ok(v.to_string())
}

fn namesrv(key: &str, v: &str) -> Result<String, ConfigError> {
    if v.is_empty() {
        return Err(ConfigError::invalid(key, v, "must not be empty"));
    }
    for addr in v.split(';') {
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| ConfigError::invalid(key, v, format!("{addr:?} is not host:port")))?;
        if host.is_empty() || port.parse::<u16>().map(|p| p == 0).unwrap_or(true) {
            return Err(ConfigError::invalid(key, v, format!("{addr:?} is not host:port")));
        }
    }
    Ok(v.to_string())
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

    #[test]
    fn send_timeout_must_be_well_under_the_lease() {
        let mut c = Config::new("mysql://root@127.0.0.1/test");
        c.set("lease.ms", "1000").unwrap();
        c.set("send.timeout.ms", "500").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("send.timeout.ms") && e.contains("lease.ms"), "{e}");
        c.set("send.timeout.ms", "250").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn seed_profile_has_the_seed_values() {
        let c = Config::seed_compatible("mysql://root@127.0.0.1/test");
        assert_eq!(c.batch_size, 20);
        assert_eq!(c.scan_interval, Duration::from_secs(5));
        assert_eq!(c.reclaim_interval, Duration::from_secs(60));
        assert_eq!(c.lease, Duration::from_secs(600));
        assert_eq!(c.max_retry, 3);
        assert_eq!(c.claim_strategy, ClaimStrategy::PerRow);
        let delays: Vec<u64> = (1..=3).map(|n| c.backoff.delay(n).as_secs()).collect();
        assert_eq!(delays, vec![5, 20, 45]);
        c.validate().unwrap();
    }

    #[test]
    fn a_profile_keeps_keys_set_before_it_so_order_does_not_matter() {
        let mut before = Config::new("mysql://root@127.0.0.1/test");
        before.set("batch.size", "7").unwrap();
        before.set("profile", "seed").unwrap();
        let mut after = Config::new("mysql://root@127.0.0.1/test");
        after.set("profile", "seed").unwrap();
        after.set("batch.size", "7").unwrap();
        assert_eq!(before, after);
        assert_eq!(before.batch_size, 7);
        assert_eq!(before.lease, Duration::from_secs(600));
        assert_eq!(before.profile, Profile::Seed);
        // Back to the defaults, the explicit key still kept.
        before.set("profile", "default").unwrap();
        assert_eq!(before.batch_size, 7);
        assert_eq!(before.lease, Config::default().lease);
        let seed = Config::seed_compatible("mysql://root@127.0.0.1/test");
        assert_eq!(seed.get("profile").as_deref(), Some("seed"));
        assert_eq!(seed.batch_size, 20);
    }

    #[test]
    fn redaction_hides_passwords_and_secrets() {
        assert_eq!(redact_url("mysql://app:s3cret@db:3306/x"), "mysql://app:***@db:3306/x");
        assert_eq!(redact_url("mysql://root@db/x"), "mysql://root@db/x");
        let mut c = Config::default();
        c.set("rocketmq.secret.key", "hush").unwrap();
        assert_eq!(c.get_redacted("rocketmq.secret.key").unwrap(), "***");
    }
}
