//! The typed configuration: [`Config`] and the enums of its values, built from the declared
//! defaults (`settings.rs`), the seed-compatible profile, and the checks of values against each
//! other.

use std::time::Duration;

use super::parse::{table_name, topic};
use crate::error::ConfigError;

/// How a scanner takes ownership of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStrategy {
    /// A transaction that holds its rows' locks through the send: `SELECT ... FOR UPDATE SKIP
    /// LOCKED LIMIT n`, send, record every outcome, one COMMIT. No claim is written; a round's
    /// ids are journaled in `outbox_claim` so a round lost with its connection is counted
    /// (docs/guarantees.md, "The claim strategies").
    Held,
    /// One short transaction: `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, one UPDATE of the
    /// batch to SENDING, commit. Instances never wait on each other's rows.
    SkipLocked,
    /// The seed's way: a lock-free candidate SELECT, then one conditional UPDATE per row; the
    /// affected-row count decides who owns the row.
    PerRow,
}

/// What becomes of a row once its event is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentRows {
    /// Deleted in the statement that records the send, when it was sent at its first attempt
    /// (rows with a history of failures are kept as SUCCESS, for the console and retention).
    Delete,
    /// Kept as SUCCESS (the console, `dead-letters`, replay), until retention deletes them.
    Keep,
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

/// The keys given a value with [`Config::set`], which a profile leaves as they are. Bookkeeping
/// only: two configurations with the same values are equal whichever keys were set.
#[derive(Debug, Clone, Default)]
pub struct ExplicitKeys(pub(crate) std::collections::BTreeSet<&'static str>);

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
    /// `shards`: the databases a fleet serves instead of `db_url` (`None`: one database).
    pub shards: Option<String>,
    /// `shard.workers`, `shard.db.pool.max`: each shard relay's senders and pool.
    pub shard_workers: usize,
    pub shard_db_pool_max: usize,
    /// `shard.watch.ms`: how often the fleet's watch reads every shard's first due row (zero: no
    /// watch); `shard.scan.interval.ms`: each shard relay's own scan interval while it watches.
    pub shard_watch: Duration,
    pub shard_scan_interval: Duration,
    /// `shard.catalog.url`, `shard.catalog.query`, `shard.catalog.reload.ms`: a database listing
    /// shards, the statement that lists them, and how often it is read again.
    pub shard_catalog_url: Option<String>,
    pub shard_catalog_query: String,
    pub shard_catalog_reload: Duration,
    /// `shard.coordination.url`: where the relays of one fleet split its shards (`None`: this
    /// relay serves them all); `shard.lease.ms`: how long a hold on a shard lasts unrenewed.
    pub shard_coordination_url: Option<String>,
    pub shard_lease: Duration,
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
    pub sent_rows: SentRows,
    /// Most rows claimed by one scan round.
    pub batch_size: usize,
    /// Delay between scan rounds (fixed delay; rounds never overlap).
    pub scan_interval: Duration,
    /// Scan again at once when a round claimed a full batch (a backlog is waiting).
    pub scan_drain: bool,
    /// `scan.coalesce.ms`: least time between the starts of two rounds woken by commits.
    pub scan_coalesce: Duration,
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
    /// Where `outboxd` exports spans (`otel.*`).
    pub otel: super::OtelConfig,
    /// Keys set with [`Config::set`] (a profile applied later keeps their values).
    pub explicit: ExplicitKeys,
    /// Process-wide log threshold applied when a relay opens (`log.level`); `None` leaves it.
    pub log_level: Option<log::LevelFilter>,
    /// How long `outbox_tx_begin` (and the bindings' `begin`) waits for a free pool connection
    /// (`db.pool.wait.ms`); `None` waits as long as it takes.
    pub db_pool_wait: Option<Duration>,
    /// The consumer runtime's settings (`consumer.*`, `inbox.*`), for the hosts that start a
    /// consumer from this configuration (the C ABI, Java, Go); the group is given at its start.
    pub consumer: super::ConsumerConfig,
    /// The operator console (`console.*`), served by `outboxd`.
    pub console: super::ConsoleConfig,
}

/// The declared defaults (`settings.rs`), built once.
static DEFAULTS: std::sync::LazyLock<Config> = std::sync::LazyLock::new(|| {
    let mut c = Config::blank();
    for s in super::KEYS.iter().filter(|s| !s.default.is_empty()) {
        (s.set)(&mut c, s.default).unwrap_or_else(|e| panic!("the declared default of {}: {e}", s.key));
    }
    c
});

impl Default for Config {
    /// Every key at its declared default (`settings.rs`).
    fn default() -> Self {
        DEFAULTS.clone()
    }
}

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

    /// Sets every value a profile defines (the keys declared with a `seed` value: the seed's, or
    /// the defaults), except the keys already given a value with [`Config::set`]: those win
    /// whatever order the keys come in (a TOML file, a Go map, Java properties).
    pub fn apply_profile(&mut self, profile: Profile) {
        for s in super::KEYS {
            let Some(seed) = s.seed else { continue };
            if !self.explicit.0.contains(s.key) {
                let v = if profile == Profile::Seed { seed } else { s.default };
                (s.set)(self, v).expect("a profile's values are valid");
            }
        }
        self.profile = profile;
    }

    /// Every field at a placeholder of its type, or at none: the start of [`Config::default`],
    /// which sets each key with a non-empty default to it (a key declared with an empty default
    /// keeps the empty or `None` it has here; a test checks that each reads back as declared).
    fn blank() -> Config {
        Config {
            profile: Profile::Default,
            db_url: String::new(),
            shards: None,
            shard_workers: 0,
            shard_db_pool_max: 0,
            shard_watch: Duration::ZERO,
            shard_scan_interval: Duration::ZERO,
            shard_catalog_url: None,
            shard_catalog_query: String::new(),
            shard_catalog_reload: Duration::ZERO,
            shard_coordination_url: None,
            shard_lease: Duration::ZERO,
            startup_db_wait: Duration::ZERO,
            db_pool_max: 0,
            table: String::new(),
            instance_id: None,
            service_name: String::new(),
            service_port: None,
            claim_strategy: ClaimStrategy::Held,
            sent_rows: SentRows::Keep,
            batch_size: 0,
            scan_interval: Duration::ZERO,
            scan_drain: false,
            scan_coalesce: Duration::ZERO,
            reclaim_interval: Duration::ZERO,
            lease: Duration::ZERO,
            lease_renew_fraction: 0.0,
            max_retry: 0,
            backoff: Backoff {
                policy: BackoffPolicy::Fixed,
                base: Duration::ZERO,
                max: Duration::ZERO,
                jitter: 0.0,
            },
            workers: 0,
            publish_batch_max: 0,
            max_in_flight: 0,
            send_timeout: Duration::ZERO,
            payload_max_bytes: 0,
            topic: String::new(),
            breaker_failure_threshold: 0,
            breaker_open: Duration::ZERO,
            ordering: Ordering::None,
            ordering_dead_head: DeadHeadPolicy::Skip,
            publisher: PublisherKind::None,
            rocketmq: RocketMqConfig {
                namesrv: String::new(),
                producer_group: String::new(),
                retries: 0,
                access_key: None,
                secret_key: None,
                tag_source: TagSource::None,
            },
            retention_age: None,
            retention_batch: 0,
            retention_interval: Duration::ZERO,
            retention_round_max: Duration::ZERO,
            metrics_listen: None,
            otel: super::OtelConfig {
                endpoint: None,
                service_name: String::new(),
            },
            explicit: ExplicitKeys::default(),
            log_level: None,
            db_pool_wait: None,
            consumer: super::ConsumerConfig {
                group: String::new(),
                inbox_table: String::new(),
                dead_letter_table: String::new(),
                threads: 0,
                max_attempts: 0,
                backoff_initial: Duration::ZERO,
                backoff_max: Duration::ZERO,
                persist_interval: Duration::ZERO,
                replay_interval: Duration::ZERO,
                queue_capacity: 0,
                batch_max: 0,
                retention: None,
                retention_interval: Duration::ZERO,
                inbox: false,
                start_from: super::StartFrom::First,
                pull_batch: 0,
                route: super::Route::Queue,
            },
            console: super::ConsoleConfig {
                enabled: false,
                listen: String::new(),
                admin_token: None,
                read_token: None,
                read_open: false,
                consumer_db_url: None,
            },
        }
    }

    /// The longest instance id derived from `service.name` and `service.port` can be (the
    /// process id, up to 10 digits, stands in for an unset port).
    pub fn longest_derived_instance_id(&self) -> usize {
        let port = self.service_port.map(|p| p.to_string().len()).unwrap_or(10);
        self.service_name.chars().count() + 1 + port + 1 + 6
    }

    /// The databases of `shards`, each with `table` where its entry names no table of its own
    /// (none when `shards` is unset: the relay serves `db_url`).
    pub fn shard_specs(&self) -> Result<Vec<super::shards::ShardSpec>, ConfigError> {
        match &self.shards {
            None => Ok(Vec::new()),
            Some(list) => super::shards::expand_shards("shards", list, &self.table),
        }
    }

    /// Whether this configuration describes a fleet: `shards` or `shard.catalog.url` set.
    pub fn is_fleet(&self) -> bool {
        self.shards.is_some() || self.shard_catalog_url.is_some()
    }

    /// The configuration of one shard's relay: this one with the shard's URL and table,
    /// `shard.workers` senders, a pool of `shard.db.pool.max`, `shard.scan.interval.ms` while
    /// the fleet watches (`shard.watch.ms`), and no `shards` of its own.
    pub fn for_shard(&self, shard: &super::shards::ShardSpec) -> Config {
        let mut c = self.clone();
        c.db_url = shard.url.clone();
        c.table = shard.table.clone();
        c.workers = self.shard_workers;
        c.db_pool_max = self.shard_db_pool_max;
        if !self.shard_watch.is_zero() {
            c.scan_interval = self.shard_scan_interval;
        }
        c.shards = None;
        c.shard_catalog_url = None;
        c.shard_coordination_url = None;
        c
    }

    /// Checks the values against each other. The relay calls it at start.
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
        if self.db_url.trim().is_empty() && !self.is_fleet() {
            out.push(ConfigError::invalid("db.url", "", "is required (or shards)"));
        }
        if let (Some(url), false) = (&self.shard_coordination_url, self.is_fleet()) {
            out.push(ConfigError::invalid(
                "shard.coordination.url",
                crate::config::redact_url(url),
                "is set without shards: it splits the shards of a fleet among its relays",
            ));
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
        let c = &self.console;
        if c.enabled && c.admin_token.is_none() && c.read_token.is_none() && !c.read_open {
            out.push(ConfigError::Inconsistent {
                keys: vec![
                    "console.enabled".into(),
                    "console.admin.token".into(),
                    "console.read.token".into(),
                    "console.read.open".into(),
                ],
                reason: "the console is on but nobody could use it: set console.admin.token (to act), \
                         console.read.token (to read), or console.read.open = true (read without a token)"
                    .into(),
            });
        }
        if c.admin_token.is_some() && c.admin_token == c.read_token {
            out.push(ConfigError::Inconsistent {
                keys: vec!["console.admin.token".into(), "console.read.token".into()],
                reason: "the read token must differ from the admin token (a reader could act)".into(),
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

#[cfg(test)]
mod tests {
    use super::super::parse::redact_url;
    use super::*;

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
