//! The reclaimer thread: every `reclaim.interval.ms` it returns SENDING rows whose lease expired
//! to WAIT (an attempt: a row that keeps killing its sender ends FAIL), and, with
//! `lease.renew.fraction`, it renews the lease of every chunk held that long, under its token.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::shared::{dead_lettered, wait, Inner};
use crate::error::panic_message;
use crate::event::EventId;
use crate::stats::Counters;
use crate::store::JOURNAL_GRACE;

/// Rows reclaimed per statement by the reclaimer.
const RECLAIM_LIMIT: usize = 500;

pub(super) fn reclaimer_loop(inner: &Inner, shutdown: Receiver<()>) {
    let cfg = &inner.config;
    let renew_after = cfg.lease.mul_f64(cfg.lease_renew_fraction);
    let tick = if cfg.lease_renew_fraction > 0.0 {
        cfg.reclaim_interval
            .min((renew_after / 4).max(Duration::from_millis(10)))
    } else {
        cfg.reclaim_interval
    };
    let mut next_reclaim = Instant::now();
    let never = crossbeam_channel::never::<()>();
    while !inner.stopping.load(SeqCst) {
        let now = Instant::now();
        if cfg.lease_renew_fraction > 0.0 {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| renew_due(inner, renew_after))) {
                log::error!("lease renewal panicked: {}", panic_message(&*p));
            }
        }
        if now >= next_reclaim {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| reclaim_round(inner))) {
                log::error!("reclaim panicked: {}", panic_message(&*p));
            }
            next_reclaim = Instant::now() + cfg.reclaim_interval;
        }
        wait(
            &never,
            &shutdown,
            tick.min(next_reclaim.saturating_duration_since(Instant::now())),
        );
    }
}

/// Renews the lease of every chunk held longer than `renew_after` since its claim or last renewal.
fn renew_due(inner: &Inner, renew_after: Duration) {
    let now = Instant::now();
    let due: Vec<(u64, u64, Vec<EventId>)> = inner
        .leases
        .lock()
        .iter()
        .filter(|(_, l)| !l.held && now.duration_since(l.renewed_at) >= renew_after)
        .map(|(seq, l)| (*seq, l.token, l.ids.clone()))
        .collect();
    for (seq, token, ids) in due {
        let started = Instant::now();
        match inner.store.renew(token, &ids) {
            Ok(n) => {
                inner.counters.writes.succeeded();
                Counters::add(&inner.counters.renewed, n);
                if let Some(l) = inner.leases.lock().get_mut(&seq) {
                    l.renewed_at = started;
                    if n > 0 {
                        l.expires = started + inner.config.lease;
                    }
                }
                if n < ids.len() as u64 {
                    log::warn!(
                        "lease renewal: {} of {} events were no longer ours",
                        ids.len() as u64 - n,
                        ids.len()
                    );
                }
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                inner.counters.writes.failed(&format_args!("lease renewal: {e}"));
            }
        }
    }
}

/// Journal rows of held rounds taken per statement.
const RECOVER_LIMIT: usize = 50;

fn reclaim_round(inner: &Inner) {
    if inner.config.claim_strategy == crate::config::ClaimStrategy::Held {
        recover_round(inner);
    }
    loop {
        match inner.store.reclaim_expired(RECLAIM_LIMIT) {
            Ok(r) => {
                let total = r.returned + r.dead.len() as u64;
                if total > 0 {
                    Counters::add(&inner.counters.reclaimed, total);
                    log::warn!(
                        "reclaimed {total} events whose lease expired ({} back to WAIT, {} dead-lettered): an instance died or stalled",
                        r.returned,
                        r.dead.len()
                    );
                    dead_lettered(inner, &r.dead);
                }
                if (total as usize) < RECLAIM_LIMIT || inner.stopping.load(SeqCst) {
                    return;
                }
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                log::warn!("reclaim failed: {e}");
                return;
            }
        }
    }
}

/// Held rounds that ended without settling (their connection died): their events are counted
/// an attempt and audited as claim-lost.
fn recover_round(inner: &Inner) {
    loop {
        match inner.store.recover_lost_claims(JOURNAL_GRACE, RECOVER_LIMIT) {
            Ok(r) => {
                if r.rounds > 0 {
                    Counters::add(&inner.counters.reclaimed, r.events);
                    log::warn!(
                        "recovered {} held rounds that ended without recording their sends: {} events audited as \
                         claim-lost (they may arrive twice), {} counted an attempt, {} dead-lettered; a relay died, \
                         stalled past its lease, or lost its connection",
                        r.rounds,
                        r.events,
                        r.returned,
                        r.dead.len()
                    );
                    dead_lettered(inner, &r.dead);
                }
                if (r.rounds as usize) < RECOVER_LIMIT || inner.stopping.load(SeqCst) {
                    return;
                }
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                log::warn!("recovering lost held rounds failed: {e}");
                return;
            }
        }
    }
}
