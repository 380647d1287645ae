//! Every configuration key, declared once: the field of [`Config`] it sets, the kind of its value
//! (type and bounds, `kinds.rs`), its default (and the `seed` profile's value, for the keys the
//! profile sets), the part of the system that reads it, and what it means. Everything else is
//! derived from here: `Config::set`, `Config::get`, the redaction, `Config::default`, the seed
//! profile, `outboxd config example` and the README's table of keys (`reference.rs`).
//!
//! Adding a setting is one entry here (and its field in `typed.rs`); `docs/architecture.md`,
//! "Adding a setting", shows one.

use super::console::{DEFAULT_CONSOLE_LISTEN, MIN_TOKEN_CHARS};
use super::consumer::{StartFrom, DEFAULT_DEAD_LETTER_TABLE, DEFAULT_INBOX_TABLE, MAX_BATCH_MAX, MIN_INBOX_RETENTION};
use super::keys::{settings, Reader, Setting};
use super::kinds::{
    parse, redaction_of, AnyCase, Bool, Choice, DbUrl, Fraction, InboxRetention, Int, Kind, Listen, Millis, Name,
    Namesrv, OptMillis, Optional, OtlpEndpoint, RouteKind, Secret, ShardList, TableName, Text, Token, Topic,
};
use super::otel::DEFAULT_OTEL_SERVICE_NAME;
use super::typed::{
    BackoffPolicy, ClaimStrategy, DeadHeadPolicy, Ordering, Profile, PublisherKind, SentRows, TagSource,
};

/// A day in milliseconds, and ten years: the bounds of the long durations.
const DAY: u64 = 86_400_000;
const TEN_YEARS: u64 = 10 * 365 * DAY;

settings! {
    "profile" {
        field: profile,
        apply: apply_profile,
        kind: Choice(&[("default", Profile::Default), ("seed", Profile::Seed)]),
        default: "default",
        read_by: Relay,
        doc: "the values every other key starts from (seed: the seed publisher's batch 20, scan 5 s, lease 10 min, max retry 3, per-row claims, one sender); keys set anywhere, before or after it, override it",
    }
    "db.url" {
        field: db_url,
        kind: DbUrl,
        default: "",
        example: "mysql://root@127.0.0.1:3306/test",
        read_by: All,
        doc: "MySQL/MariaDB URL, mysql://user:pass@host:port/db (required)",
    }
    "shards" {
        field: shards,
        kind: Optional(ShardList),
        default: "",
        read_by: Relay,
        doc: "databases one relay serves instead of db.url, a relay per shard (docs/fleet.md): URLs separated by spaces or commas, {0..63} for a range, #table after a URL whose table is not `table`; outboxd re-reads it on SIGHUP",
    }
    "shard.workers" {
        field: shard_workers,
        kind: Int(1, 256),
        default: "1",
        read_by: Relay,
        doc: "sender threads of each shard's relay when `shards` is set (in place of workers)",
    }
    "shard.db.pool.max" {
        field: shard_db_pool_max,
        kind: Int(1, 1024),
        default: "2",
        read_by: Relay,
        doc: "connections of each shard's pool when `shards` is set (in place of db.pool.max); a shard opens at most this plus shard.workers + 1 for its held rounds",
    }
    "shard.watch.ms" {
        field: shard_watch,
        kind: Millis(0, 60_000),
        default: "500",
        read_by: Relay,
        doc: "with `shards`: how often one statement per database server reads every shard's first due row and wakes the shards that have one (0 = off: each shard scans at scan.interval.ms)",
    }
    "shard.catalog.url" {
        field: shard_catalog_url,
        kind: Optional(DbUrl),
        default: "",
        read_by: Relay,
        doc: "a database listing the shards (docs/fleet.md): each row of shard.catalog.query is a shard, read at start and every shard.catalog.reload.ms; with `shards` too, both lists together",
    }
    "shard.catalog.query" {
        field: shard_catalog_query,
        kind: Name(4096),
        default: "SELECT url FROM outbox_shards",
        read_by: Relay,
        doc: "with shard.catalog.url: the statement listing the shards, a row each: a URL as in `shards` ({A..B}, #table), or a URL and its table",
    }
    "shard.catalog.reload.ms" {
        field: shard_catalog_reload,
        kind: Millis(1_000, DAY),
        default: "30000",
        read_by: Relay,
        doc: "with shard.catalog.url: how often the fleet reads the catalog again and adds or removes the shards that changed",
    }
    "shard.coordination.url" {
        field: shard_coordination_url,
        kind: Optional(DbUrl),
        default: "",
        read_by: Relay,
        doc: "with `shards`: a database where the relays configured with the same shards split them among themselves (tables outbox_fleet_member and outbox_fleet_shard, created when missing; docs/fleet.md); empty: this relay serves every shard",
    }
    "shard.lease.ms" {
        field: shard_lease,
        kind: Millis(1_000, 600_000),
        default: "15000",
        read_by: Relay,
        doc: "with shard.coordination.url: how long a relay's hold on a shard lasts unrenewed (renewed every third of it); a dead relay's shards are taken over within this and a third",
    }
    "shard.scan.interval.ms" {
        field: shard_scan_interval,
        kind: Millis(1, 3_600_000),
        default: "10000",
        read_by: Relay,
        doc: "with `shards` and shard.watch.ms on: each shard relay's own scan interval (in place of scan.interval.ms; the watch wakes it for what becomes due)",
    }
    "startup.db.wait.ms" {
        field: startup_db_wait,
        kind: Millis(0, DAY),
        default: "300000",
        read_by: Outboxd,
        doc: "how long `outboxd run` keeps retrying a database that cannot be reached at start, with backoff, before exiting (0 = fail at once); access denied or an unknown database fail at once",
    }
    "db.pool.max" {
        field: db_pool_max,
        kind: Int(1, 1024),
        default: "8",
        read_by: Relay,
        doc: "largest number of database connections the relay opens",
    }
    "table" {
        field: table,
        kind: TableName,
        default: "t_event_record",
        read_by: Relay,
        doc: "outbox table name (letters, digits, underscore)",
    }
    "instance.id" {
        field: instance_id,
        kind: Optional(Text(128)),
        default: "",
        read_by: Relay,
        doc: "claim_owner written by this instance; empty derives <service>-<port or pid>-<random6>",
    }
    "service.name" {
        field: service_name,
        kind: Text(64),
        default: "outbox",
        read_by: Relay,
        doc: "service part of the derived instance id",
    }
    "service.port" {
        field: service_port,
        kind: Optional(Int(1, 65535)),
        default: "",
        read_by: Relay,
        doc: "port part of the derived instance id (empty uses the process id)",
    }
    "claim.strategy" {
        field: claim_strategy,
        kind: Choice(&[
            ("held", ClaimStrategy::Held),
            ("skip-locked", ClaimStrategy::SkipLocked),
            ("per-row", ClaimStrategy::PerRow),
        ]),
        default: "held",
        seed: "per-row",
        read_by: Relay,
        doc: "held (rows locked by one transaction through the send, no claim written), skip-locked (batch claim under a lease in one short transaction) or per-row (the seed's conditional UPDATE per row); ordered relays claim under a lease",
    }
    "sent.rows" {
        field: sent_rows,
        kind: Choice(&[("delete", SentRows::Delete), ("keep", SentRows::Keep)]),
        default: "delete",
        seed: "keep",
        read_by: Relay,
        doc: "delete (a row sent at its first attempt is deleted as its send is recorded) or keep (sent rows stay SUCCESS until retention)",
    }
    "batch.size" {
        field: batch_size,
        kind: Int(1, 10_000),
        default: "500",
        seed: "20",
        read_by: Relay,
        doc: "most rows claimed by one scan round",
    }
    "scan.interval.ms" {
        field: scan_interval,
        kind: Millis(1, 3_600_000),
        default: "1000",
        seed: "5000",
        read_by: Relay,
        doc: "delay between scan rounds; commits that call notify are relayed at once",
    }
    "scan.drain" {
        field: scan_drain,
        kind: Bool,
        default: "true",
        seed: "false",
        read_by: Relay,
        doc: "scan again at once when a round claimed a full batch",
    }
    "scan.coalesce.ms" {
        field: scan_coalesce,
        kind: Millis(0, 1000),
        default: "0",
        read_by: Relay,
        doc: "least time between the starts of two claim rounds woken by commits, so that each round takes the commits of that span together (0: a round per wake-up; at 1 000 orders/s, 10 ms saved the database nothing measurable)",
    }
    "reclaim.interval.ms" {
        field: reclaim_interval,
        kind: Millis(10, 3_600_000),
        default: "10000",
        seed: "60000",
        read_by: Relay,
        doc: "how often expired leases are returned to WAIT",
    }
    "lease.ms" {
        field: lease,
        kind: Millis(100, DAY),
        default: "120000",
        seed: "600000",
        read_by: Relay,
        doc: "how long a claim is valid without renewal",
    }
    "lease.renew.fraction" {
        field: lease_renew_fraction,
        kind: Fraction(0.0, 0.9),
        default: "0.5",
        seed: "0",
        read_by: Relay,
        doc: "renew a send's lease once it has been in flight this fraction of the lease (0 disables)",
    }
    "max.retry" {
        field: max_retry,
        kind: Int(0, 1000),
        default: "5",
        seed: "3",
        read_by: Relay,
        doc: "attempts after the first before an event is dead-lettered (FAIL)",
    }
    "backoff.policy" {
        field: backoff.policy,
        kind: Choice(&[
            ("fixed", BackoffPolicy::Fixed),
            ("quadratic", BackoffPolicy::Quadratic),
            ("exponential", BackoffPolicy::Exponential),
        ]),
        default: "quadratic",
        seed: "quadratic",
        read_by: Relay,
        doc: "fixed, quadratic (n^2 * base) or exponential (2^(n-1) * base)",
    }
    "backoff.base.ms" {
        field: backoff.base,
        kind: Millis(0, DAY),
        default: "5000",
        seed: "5000",
        read_by: Relay,
        doc: "base delay of the backoff",
    }
    "backoff.max.ms" {
        field: backoff.max,
        kind: Millis(0, 7 * DAY),
        default: "600000",
        seed: "3600000",
        read_by: Relay,
        doc: "cap of any retry delay",
    }
    "backoff.jitter" {
        field: backoff.jitter,
        kind: Fraction(0.0, 1.0),
        default: "0",
        seed: "0",
        read_by: Relay,
        doc: "0..1, each delay is shortened by a random share of up to this fraction",
    }
    "workers" {
        field: workers,
        kind: Int(1, 256),
        default: "4",
        seed: "1",
        read_by: Relay,
        doc: "sender threads",
    }
    "publish.batch.max" {
        field: publish_batch_max,
        kind: Int(1, 1000),
        default: "128",
        seed: "1",
        read_by: Relay,
        doc: "most events given to one publish call (one broker batch)",
    }
    "max.in.flight" {
        field: max_in_flight,
        kind: Int(1, 1_000_000),
        default: "1000",
        seed: "20",
        read_by: Relay,
        doc: "most claimed events held by this instance at once (memory: about this many payloads)",
    }
    "send.timeout.ms" {
        field: send_timeout,
        kind: Millis(10, 600_000),
        default: "3000",
        read_by: Relay,
        doc: "budget of one publish call; at most a quarter of lease.ms",
    }
    "payload.max.bytes" {
        field: payload_max_bytes,
        kind: Int(1, 16 * 1024 * 1024 - 1),
        default: "4194304",
        read_by: Relay,
        doc: "largest payload accepted by enqueue",
    }
    "topic" {
        field: topic,
        kind: Topic,
        default: "ORDER_EVENT_TOPIC",
        seed: "ORDER_EVENT_TOPIC",
        read_by: Relay,
        doc: "topic of events that set none",
    }
    "breaker.failure.threshold" {
        field: breaker_failure_threshold,
        kind: Int(1, 1_000_000),
        default: "5",
        read_by: Relay,
        doc: "consecutive broker-wide failures or timeouts that open the circuit breaker",
    }
    "breaker.open.ms" {
        field: breaker_open,
        kind: Millis(10, 3_600_000),
        default: "5000",
        read_by: Relay,
        doc: "how long the breaker stays open before a probe",
    }
    "ordering" {
        field: ordering,
        kind: Choice(&[("none", Ordering::None), ("per-biz-no", Ordering::PerBizNo)]),
        default: "none",
        read_by: Relay,
        doc: "none, or per-biz-no (one event of a biz_no in flight at a time, one queue per biz_no)",
    }
    "ordering.dead.head" {
        field: ordering_dead_head,
        kind: Choice(&[("skip", DeadHeadPolicy::Skip), ("block", DeadHeadPolicy::Block)]),
        default: "skip",
        read_by: Relay,
        doc: "per-biz-no only: skip (later events go on) or block (later events wait) when a key's head is dead-lettered",
    }
    "publisher" {
        field: publisher,
        kind: Choice(&[("rocketmq", PublisherKind::RocketMq), ("none", PublisherKind::None)]),
        default: "rocketmq",
        read_by: Relay,
        doc: "rocketmq, or none (this process only enqueues; another instance or outboxd relays)",
    }
    "rocketmq.namesrv" {
        field: rocketmq.namesrv,
        kind: Namesrv,
        default: "127.0.0.1:9876",
        read_by: Relay,
        doc: "RocketMQ name server address(es), host:port;host:port",
    }
    "rocketmq.producer.group" {
        field: rocketmq.producer_group,
        kind: Text(255),
        default: "outbox_producer",
        read_by: Relay,
        doc: "producer group",
    }
    "rocketmq.retries" {
        field: rocketmq.retries,
        kind: Int(0, 16),
        default: "0",
        read_by: Relay,
        doc: "client-side resends of one send within send.timeout.ms; each is a duplicate the relay cannot count, so 0 leaves retries to the relay (counted, with backoff)",
    }
    "rocketmq.access.key" {
        field: rocketmq.access_key,
        kind: Optional(Secret),
        default: "",
        read_by: Relay,
        doc: "ACL access key (never logged)",
    }
    "rocketmq.secret.key" {
        field: rocketmq.secret_key,
        kind: Optional(Secret),
        default: "",
        read_by: Relay,
        doc: "ACL secret key (never logged)",
    }
    "rocketmq.tag.source" {
        field: rocketmq.tag_source,
        kind: Choice(&[("event-type", TagSource::EventType), ("none", TagSource::None)]),
        default: "event-type",
        read_by: Relay,
        doc: "event-type (tag = the row's event type when it sets none) or none",
    }
    "retention.age.ms" {
        field: retention_age,
        kind: OptMillis(TEN_YEARS),
        default: "0",
        read_by: Relay,
        doc: "delete SUCCESS and DISCARDED rows older than this (0 keeps them forever)",
    }
    "retention.batch.size" {
        field: retention_batch,
        kind: Int(1, 100_000),
        default: "500",
        read_by: Relay,
        doc: "rows deleted per statement by the retention job",
    }
    "retention.interval.ms" {
        field: retention_interval,
        kind: Millis(10, DAY),
        default: "60000",
        read_by: Relay,
        doc: "delay between retention rounds",
    }
    "retention.round.max.ms" {
        field: retention_round_max,
        kind: Millis(10, 3_600_000),
        default: "2000",
        read_by: Relay,
        doc: "longest a retention round runs before it waits for the next one",
    }
    "log.level" {
        field: log_level,
        kind: Optional(AnyCase(Choice(&[
            ("off", log::LevelFilter::Off),
            ("error", log::LevelFilter::Error),
            ("warn", log::LevelFilter::Warn),
            ("info", log::LevelFilter::Info),
            ("debug", log::LevelFilter::Debug),
            ("trace", log::LevelFilter::Trace),
        ]))),
        default: "",
        read_by: Relay,
        doc: "the library's log threshold in this process, applied when a relay starts (empty leaves it; the default is info, no line per event)",
    }
    "db.pool.wait.ms" {
        field: db_pool_wait,
        kind: OptMillis(DAY),
        default: "30000",
        read_by: Transactions,
        doc: "how long a library-owned transaction's begin waits for a free pool connection before failing with a pool timeout (0 waits forever)",
    }
    "metrics.listen" {
        field: metrics_listen,
        kind: Optional(Listen("127.0.0.1:9464")),
        default: "",
        read_by: Outboxd,
        doc: "host:port of the Prometheus /metrics and /healthz endpoint (empty = off)",
    }
    "otel.exporter.otlp.endpoint" {
        field: otel.endpoint,
        kind: Optional(OtlpEndpoint),
        default: "",
        read_by: Outboxd,
        doc: "OTLP/HTTP collector to send spans to (http://collector:4318; empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no export); needs a build with the cargo feature otlp (docs/tracing.md)",
    }
    "otel.service.name" {
        field: otel.service_name,
        kind: Name(128),
        default: DEFAULT_OTEL_SERVICE_NAME,
        read_by: Outboxd,
        doc: "service.name of the spans it exports (OTEL_SERVICE_NAME wins when set)",
    }
    "consumer.threads" {
        field: consumer.threads,
        kind: Int(1, 256),
        default: "4",
        read_by: Consumer,
        doc: "handler threads, each with its own database connection; a message goes to the one its consumer.route names",
    }
    "consumer.route" {
        field: consumer.route,
        kind: RouteKind,
        default: "queue",
        read_by: Consumer,
        doc: "which handler thread a message goes to: queue (every message of a broker queue in one thread), biz_no (the event's business key), or property:NAME (a property the producer sets): a handler that updates shared rows (a user's balance) routes by what names them, e.g. property:userId; docs/inbox.md",
    }
    "consumer.batch.max" {
        field: consumer.batch_max,
        kind: Int(1, MAX_BATCH_MAX),
        default: "128",
        read_by: Consumer,
        doc: "most messages one handler transaction takes (the messages waiting, never waiting for more); 1 = one message per transaction",
    }
    "consumer.max.attempts" {
        field: consumer.max_attempts,
        kind: Int(1, 1000),
        default: "5",
        read_by: Consumer,
        doc: "handler attempts per message before it is parked in the dead-letter table",
    }
    "consumer.backoff.initial.ms" {
        field: consumer.backoff_initial,
        kind: Millis(1, 3_600_000),
        default: "200",
        read_by: Consumer,
        doc: "wait after a handler's first failure, doubling per attempt",
    }
    "consumer.backoff.max.ms" {
        field: consumer.backoff_max,
        kind: Millis(1, DAY),
        default: "10000",
        read_by: Consumer,
        doc: "longest wait between attempts",
    }
    "consumer.queue.capacity" {
        field: consumer.queue_capacity,
        kind: Int(1, 100_000),
        default: "256",
        read_by: Consumer,
        doc: "messages waiting per handler thread before the poller waits",
    }
    "consumer.persist.interval.ms" {
        field: consumer.persist_interval,
        kind: Millis(1, 3_600_000),
        default: "1000",
        read_by: Consumer,
        doc: "how often committed offsets are also stored with the broker (and at stop)",
    }
    "consumer.replay.interval.ms" {
        field: consumer.replay_interval,
        kind: Millis(1, 3_600_000),
        default: "2000",
        read_by: Consumer,
        doc: "how often the group's dead letters asked for replay are looked for",
    }
    "consumer.inbox" {
        field: consumer.inbox,
        kind: Bool,
        default: "true",
        read_by: Consumer,
        doc: "mark each event key in the inbox in the handler's transaction (false: every copy runs the handler; only for handlers idempotent by themselves)",
    }
    "consumer.start.from" {
        field: consumer.start_from,
        kind: Choice(&[("first", StartFrom::First), ("last", StartFrom::Last)]),
        default: "first",
        read_by: Consumer,
        doc: "where a new group starts in its topic: first (every message the broker has) or last (only messages sent after it subscribed)",
    }
    "consumer.pull.batch" {
        field: consumer.pull_batch,
        kind: Int(1, 1024),
        default: "32",
        read_by: Consumer,
        doc: "messages per pull request to the broker",
    }
    "inbox.table" {
        field: consumer.inbox_table,
        kind: TableName,
        default: DEFAULT_INBOX_TABLE,
        read_by: Consumer,
        doc: "the inbox table (letters, digits, underscore)",
    }
    "inbox.dead_letter.table" {
        field: consumer.dead_letter_table,
        kind: TableName,
        default: DEFAULT_DEAD_LETTER_TABLE,
        read_by: Consumer,
        doc: "the consumer's dead-letter table (letters, digits, underscore)",
    }
    "inbox.retention.ms" {
        field: consumer.retention,
        kind: InboxRetention(MIN_INBOX_RETENTION, TEN_YEARS),
        default: "604800000",
        read_by: Consumer,
        doc: "marks older than this are deleted (0 keeps them; at least 1 h: the broker redelivers for hours)",
    }
    "inbox.retention.interval.ms" {
        field: consumer.retention_interval,
        kind: Millis(1, DAY),
        default: "60000",
        read_by: Consumer,
        doc: "delay between retention rounds over the marks",
    }
    "console.enabled" {
        field: console.enabled,
        kind: Bool,
        default: "false",
        read_by: Console,
        doc: "serve the operator console (docs/console.md)",
    }
    "console.listen" {
        field: console.listen,
        kind: Listen(DEFAULT_CONSOLE_LISTEN),
        default: DEFAULT_CONSOLE_LISTEN,
        read_by: Console,
        doc: "host:port of the console (loopback by default: put a TLS proxy in front to reach it from elsewhere)",
    }
    "console.admin.token" {
        field: console.admin_token,
        kind: Optional(Token(MIN_TOKEN_CHARS)),
        default: "",
        read_by: Console,
        doc: "the token that lets an operator act (replay, discard, pause), at least 16 characters (never logged; empty: the console only reads)",
    }
    "console.read.token" {
        field: console.read_token,
        kind: Optional(Token(MIN_TOKEN_CHARS)),
        default: "",
        read_by: Console,
        doc: "the token that lets an operator read, at least 16 characters (never logged)",
    }
    "console.read.open" {
        field: console.read_open,
        kind: Bool,
        default: "false",
        read_by: Console,
        doc: "read without any token (only on a network you trust); actions still need the admin token",
    }
    "console.consumer.db.url" {
        field: console.consumer_db_url,
        kind: Optional(DbUrl),
        default: "",
        read_by: Console,
        doc: "the database of the consumers' inbox and dead-letter tables (empty: db.url)",
    }
}
