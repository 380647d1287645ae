//! Commit-to-broker-ack latency, aggregated from the relay's [`crate::Delivery`] times for the
//! hosts' stats (C `outbox_stats`, Java `OutboxStats.latency()`, Go `Stats.Latency`): lock-free
//! counters and a power-of-two histogram, a few atomic adds per delivered event.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::relay::{Delivery, LatencyHook};

/// Bucket `i` counts deliveries under `2^i` ms; the last one everything longer.
const BUCKETS: usize = 24;

/// Running totals of commit → broker-ack times.
#[derive(Default)]
pub struct LatencyStats {
    count: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// A snapshot of [`LatencyStats`], in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatencySnapshot {
    /// Deliveries measured.
    pub count: u64,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// Upper bounds (powers of two, in ms) of the bucket holding the median and the 99th
    /// percentile; 0 when nothing was measured.
    pub p50_ms: u64,
    pub p99_ms: u64,
}

impl LatencyStats {
    pub fn new() -> Arc<LatencyStats> {
        Arc::new(LatencyStats::default())
    }

    /// A hook for [`crate::RelayBuilder::latency_hook`] that records into `stats`.
    pub fn hook(stats: &Arc<LatencyStats>) -> LatencyHook {
        let stats = stats.clone();
        Arc::new(move |d: &Delivery| stats.record(d))
    }

    pub fn record(&self, d: &Delivery) {
        let us = u64::try_from(d.to_broker.as_micros()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
        let ms = us / 1000;
        let bucket = if ms == 0 { 0 } else { (64 - ms.leading_zeros()) as usize };
        self.buckets[bucket.min(BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    /// The histogram: per power-of-two bucket, its upper bound in ms and its count (the last
    /// bucket counts everything longer).
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| (1u64 << i, b.load(Relaxed)))
            .collect()
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let count = self.count.load(Relaxed);
        if count == 0 {
            return LatencySnapshot::default();
        }
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| -> u64 {
            let want = ((total as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return 1u64 << i;
                }
            }
            1u64 << (BUCKETS - 1)
        };
        LatencySnapshot {
            count,
            mean_ms: self.sum_us.load(Relaxed) as f64 / count as f64 / 1000.0,
            max_ms: self.max_us.load(Relaxed) as f64 / 1000.0,
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
        }
    }
}

impl LatencySnapshot {
    /// `{"count":..,"mean_ms":..,"max_ms":..,"p50_ms":..,"p99_ms":..}`
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "count": self.count,
            "mean_ms": self.mean_ms,
            "max_ms": self.max_ms,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
        })
        .to_string()
    }
}

/// `stats_json` (a JSON object) with a `"latency"` member added.
pub fn with_latency(stats_json: &str, latency: &LatencySnapshot) -> String {
    match serde_json::from_str::<serde_json::Value>(stats_json) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert(
                "latency".into(),
                serde_json::from_str(&latency.to_json()).unwrap_or(serde_json::Value::Null),
            );
            serde_json::Value::Object(m).to_string()
        }
        _ => stats_json.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn delivery(ms: u64) -> Delivery {
        Delivery {
            to_broker: Duration::from_millis(ms),
            to_success: Duration::from_millis(ms + 1),
            held: Duration::from_millis(1),
            trace_id: None,
        }
    }

    #[test]
    fn empty_snapshot_is_zero() {
        assert_eq!(LatencyStats::new().snapshot(), LatencySnapshot::default());
    }

    #[test]
    fn snapshot_counts_means_and_bounds_quantiles() {
        let s = LatencyStats::new();
        for _ in 0..98 {
            s.record(&delivery(3));
        }
        s.record(&delivery(100));
        s.record(&delivery(700));
        let snap = s.snapshot();
        assert_eq!(snap.count, 100);
        assert_eq!(snap.p50_ms, 4);
        assert_eq!(snap.p99_ms, 128);
        assert!((snap.max_ms - 700.0).abs() < 1e-9);
        assert!((snap.mean_ms - (98.0 * 3.0 + 800.0) / 100.0).abs() < 1e-9);
        let json = with_latency(r#"{"sent":1}"#, &snap);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["sent"], 1);
        assert_eq!(v["latency"]["count"], 100);
    }
}
