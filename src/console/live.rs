//! What the overview charts: the relay's counters sampled every second (the last ten minutes),
//! as rates per second, and its commit → ack latency histogram.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::latency::LatencyStats;
use crate::relay::Relay;

/// Samples kept: ten minutes at one a second.
const KEEP: usize = 600;

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    claimed: u64,
    sent: u64,
    retried: u64,
    dead_lettered: u64,
}

/// Rates per second between consecutive samples, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Rates {
    pub claimed: Vec<f64>,
    pub sent: Vec<f64>,
    pub retried: Vec<f64>,
    pub dead_lettered: Vec<f64>,
}

impl Rates {
    /// The mean of the last `n` rates of `series`.
    pub fn recent(series: &[f64], n: usize) -> f64 {
        let tail = &series[series.len().saturating_sub(n)..];
        if tail.is_empty() {
            0.0
        } else {
            tail.iter().sum::<f64>() / tail.len() as f64
        }
    }
}

/// The relay the console runs beside (outboxd's, once it started), its samples and its latency.
pub struct Live {
    relay: parking_lot::RwLock<Option<Arc<Relay>>>,
    samples: Mutex<VecDeque<Sample>>,
    pub latency: Arc<LatencyStats>,
}

impl Live {
    pub fn new() -> Live {
        Live {
            relay: parking_lot::RwLock::new(None),
            samples: Mutex::new(VecDeque::with_capacity(KEEP)),
            latency: LatencyStats::new(),
        }
    }

    pub fn attach(&self, relay: Arc<Relay>) {
        *self.relay.write() = Some(relay);
    }

    pub fn relay(&self) -> Option<Arc<Relay>> {
        self.relay.read().clone()
    }

    /// Takes one sample of the relay's counters (no database access).
    pub fn sample(&self) {
        let Some(r) = self.relay() else { return };
        let s = r.counters();
        let mut q = self.samples.lock();
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(Sample {
            at: Instant::now(),
            claimed: s.claimed,
            sent: s.sent,
            retried: s.retried,
            dead_lettered: s.dead_lettered,
        });
    }

    pub fn rates(&self) -> Rates {
        let q = self.samples.lock();
        let mut out = Rates::default();
        for (a, b) in q.iter().zip(q.iter().skip(1)) {
            let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
            let r = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
            out.claimed.push(r(a.claimed, b.claimed));
            out.sent.push(r(a.sent, b.sent));
            out.retried.push(r(a.retried, b.retried));
            out.dead_lettered.push(r(a.dead_lettered, b.dead_lettered));
        }
        out
    }
}
