//! What a consumer counts ([`ConsumerStats`], also as Prometheus text), and the counters its
//! threads add to.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Counters of a running consumer (totals since start), and its lag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages taken from the source.
    pub received: u64,
    /// Handled: the handler ran and its transaction committed.
    pub processed: u64,
    /// Copies whose key the group had already processed: acknowledged without running the handler.
    pub duplicates: u64,
    /// Handler attempts that failed (each retried or, the last, parked).
    pub failed_attempts: u64,
    /// Messages parked in the dead-letter table.
    pub dead_lettered: u64,
    /// Later copies of a parked key (a resend, a redelivery): added to its dead letter (one more
    /// attempt, the new error) instead of being parked again, after one attempt of their own.
    pub parked_copies: u64,
    /// Dead letters handled again after a replay request.
    pub replayed: u64,
    /// Database failures retried without using an attempt.
    pub db_errors: u64,
    /// Messages whose dedup key is not the `eventKey` property ([`super::KeySource`]).
    pub fallback_keys: u64,
    /// Handler transactions committed (one per batch, or per message when batching is off or a
    /// batch fell back): `(processed + duplicates) / transactions` is the mean batch.
    pub transactions: u64,
    /// Batches rolled back and handled again one message per transaction (a handler failure, a
    /// database failure, or, on servers without `INSERT ... RETURNING`, a key already marked).
    pub batch_fallbacks: u64,
    /// Batches rolled back by a lock conflict (a deadlock or a lock wait timeout, also inside the
    /// handler) and run again as a batch: each is counted, none used an attempt.
    pub batch_retries: u64,
    /// Messages handed to handler threads and not yet done.
    pub in_flight: u64,
    /// Messages on the assigned queues not yet committed (`None` until known: no queue assigned
    /// yet, or the broker not answering).
    pub lag: Option<u64>,
    /// Why the consumer cannot take messages now (the name server or the broker unreachable, no
    /// queue of the topic assigned, taking messages failing), or `None` while it can.
    pub unhealthy: Option<String>,
    /// Commit → credited: from the event's row written (its `eventCreatedAt`, the outbox
    /// database's clock) to the handler's commit (this host's clock), for every message processed
    /// that carries it.
    pub credited: CreditedLatency,
}

/// A histogram of commit → credited times: bucket `i` counts times under `2^i` ms, the last one
/// everything longer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreditedLatency {
    pub count: u64,
    pub sum_ms: u64,
    /// Per bucket: its upper bound in ms and how many fell in it.
    pub buckets: Vec<(u64, u64)>,
}

impl CreditedLatency {
    /// The upper bound (ms) of the bucket holding quantile `q` (0 < q ≤ 1); 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> u64 {
        let want = (self.count as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (le, n) in &self.buckets {
            seen += n;
            if seen >= want && want > 0 {
                return *le;
            }
        }
        0
    }
}

/// Buckets of [`CreditedLatency`]: up to 2^23 ms (2.3 h) and one more for longer.
const CREDITED_BUCKETS: usize = 24;

impl ConsumerStats {
    /// Whether the consumer can take messages now (see [`ConsumerStats::unhealthy`]).
    pub fn healthy(&self) -> bool {
        self.unhealthy.is_none()
    }

    /// The counters as one JSON object (what the C, Java and Go stats return); `stopped` says
    /// they are the final counts of a consumer that was stopped.
    pub fn to_json(&self, stopped: bool) -> String {
        serde_json::json!({
            "received": self.received, "processed": self.processed, "duplicates": self.duplicates,
            "failed_attempts": self.failed_attempts, "dead_lettered": self.dead_lettered,
            "parked_copies": self.parked_copies, "replayed": self.replayed, "db_errors": self.db_errors,
            "fallback_keys": self.fallback_keys, "transactions": self.transactions,
            "batch_fallbacks": self.batch_fallbacks, "batch_retries": self.batch_retries, "in_flight": self.in_flight, "lag": self.lag,
            "healthy": self.healthy(), "unhealthy": self.unhealthy, "stopped": stopped,
            "credited": {
                "count": self.credited.count, "sum_ms": self.credited.sum_ms,
                "p50_ms": self.credited.quantile_ms(0.5), "p99_ms": self.credited.quantile_ms(0.99),
            },
        })
        .to_string()
    }

    /// The Prometheus text exposition of these counters, labelled with the group.
    pub fn prometheus(&self, group: &str) -> String {
        let g = group.replace('\\', "\\\\").replace('"', "\\\"");
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{group=\"{g}\"}} {v}\n"
            ));
        };
        metric(
            "outbox_consumer_received_total",
            "counter",
            "Messages taken from the broker.",
            self.received,
        );
        metric(
            "outbox_consumer_processed_total",
            "counter",
            "Messages handled and committed.",
            self.processed,
        );
        metric(
            "outbox_consumer_duplicates_total",
            "counter",
            "Copies already processed by the group (handler not run).",
            self.duplicates,
        );
        metric(
            "outbox_consumer_failed_attempts_total",
            "counter",
            "Handler attempts that failed.",
            self.failed_attempts,
        );
        metric(
            "outbox_consumer_dead_lettered_total",
            "counter",
            "Messages parked in the dead-letter table.",
            self.dead_lettered,
        );
        metric(
            "outbox_consumer_parked_copies_total",
            "counter",
            "Later copies of a parked key, added to its dead letter.",
            self.parked_copies,
        );
        metric(
            "outbox_consumer_replayed_total",
            "counter",
            "Dead letters handled again.",
            self.replayed,
        );
        metric(
            "outbox_consumer_db_errors_total",
            "counter",
            "Database failures retried without an attempt.",
            self.db_errors,
        );
        metric(
            "outbox_consumer_fallback_keys_total",
            "counter",
            "Messages without an eventKey property.",
            self.fallback_keys,
        );
        metric(
            "outbox_consumer_in_flight",
            "gauge",
            "Messages taken and not yet done.",
            self.in_flight,
        );
        metric(
            "outbox_consumer_transactions_total",
            "counter",
            "Handler transactions committed (one per batch).",
            self.transactions,
        );
        metric(
            "outbox_consumer_batch_fallbacks_total",
            "counter",
            "Batches rolled back and handled again one message per transaction.",
            self.batch_fallbacks,
        );
        metric(
            "outbox_consumer_batch_retries_total",
            "counter",
            "Batches rolled back by a deadlock or a lock wait timeout and run again as a batch.",
            self.batch_retries,
        );
        metric(
            "outbox_consumer_healthy",
            "gauge",
            "1 while the consumer can take messages (0: the broker side cannot be reached).",
            u64::from(self.healthy()),
        );
        if let Some(lag) = self.lag {
            metric(
                "outbox_consumer_lag_messages",
                "gauge",
                "Messages on the assigned queues not yet committed.",
                lag,
            );
        }
        let name = "outbox_consumer_commit_to_credited_seconds";
        out.push_str(&format!(
            "# HELP {name} From the event's row written to the handler's commit (processed messages carrying \
             eventCreatedAt).\n# TYPE {name} histogram\n"
        ));
        let mut cumulative = 0;
        for (le_ms, n) in &self.credited.buckets {
            cumulative += n;
            if *le_ms >= 1 << (CREDITED_BUCKETS - 1) {
                break;
            }
            out.push_str(&format!(
                "{name}_bucket{{group=\"{g}\",le=\"{}\"}} {cumulative}\n",
                *le_ms as f64 / 1000.0
            ));
        }
        out.push_str(&format!(
            "{name}_bucket{{group=\"{g}\",le=\"+Inf\"}} {}\n{name}_sum{{group=\"{g}\"}} {}\n\
             {name}_count{{group=\"{g}\"}} {}\n",
            self.credited.count,
            self.credited.sum_ms as f64 / 1000.0,
            self.credited.count
        ));
        out
    }
}

/// The running histogram behind [`CreditedLatency`].
#[derive(Default)]
pub(super) struct Credited {
    count: AtomicU64,
    sum_ms: AtomicU64,
    buckets: [AtomicU64; CREDITED_BUCKETS],
}

impl Credited {
    /// Records a message processed now whose row was written at `created_ms` (epoch ms).
    pub(super) fn record(&self, created_ms: u64, now_ms: u64) {
        let ms = now_ms.saturating_sub(created_ms);
        self.count.fetch_add(1, Relaxed);
        self.sum_ms.fetch_add(ms, Relaxed);
        let bucket = if ms == 0 { 0 } else { (64 - ms.leading_zeros()) as usize };
        self.buckets[bucket.min(CREDITED_BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> CreditedLatency {
        CreditedLatency {
            count: self.count.load(Relaxed),
            sum_ms: self.sum_ms.load(Relaxed),
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, b)| (1u64 << i, b.load(Relaxed)))
                .collect(),
        }
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) processed: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) failed_attempts: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    pub(super) parked_copies: AtomicU64,
    pub(super) replayed: AtomicU64,
    pub(super) db_errors: AtomicU64,
    pub(super) fallback_keys: AtomicU64,
    pub(super) transactions: AtomicU64,
    pub(super) batch_fallbacks: AtomicU64,
    pub(super) batch_retries: AtomicU64,
    pub(super) done: AtomicU64,
    /// -1: unknown.
    pub(super) lag: AtomicI64,
    pub(super) credited: Credited,
}

impl Counters {
    /// The counters as [`ConsumerStats`] (lag as last read from the source).
    pub(super) fn snapshot(&self, unhealthy: Option<String>) -> ConsumerStats {
        let received = self.received.load(Relaxed);
        let lag = self.lag.load(Relaxed);
        ConsumerStats {
            received,
            processed: self.processed.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            failed_attempts: self.failed_attempts.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            parked_copies: self.parked_copies.load(Relaxed),
            replayed: self.replayed.load(Relaxed),
            db_errors: self.db_errors.load(Relaxed),
            fallback_keys: self.fallback_keys.load(Relaxed),
            transactions: self.transactions.load(Relaxed),
            batch_fallbacks: self.batch_fallbacks.load(Relaxed),
            batch_retries: self.batch_retries.load(Relaxed),
            in_flight: received.saturating_sub(self.done.load(Relaxed)),
            lag: u64::try_from(lag).ok(),
            unhealthy,
            credited: self.credited.snapshot(),
        }
    }
}
