//! The worker threads: each takes a chunk, sends it through the publisher within what is left of
//! its lease, and records every outcome: acks, retries with backoff, dead letters, releases
//! without an attempt (broker unavailable, parked, held back), in one statement per outcome per
//! chunk, each guarded by the claim token. The circuit breaker hears about every call.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::hooks::Delivery;
use super::shared::{dead_lettered, finish, ids_of, lease_end, release_chunk_unsent, with_db_retry, Chunk, Inner};
use crate::breaker::Transition;
use crate::error::panic_message;
use crate::event::{EventId, OutboundEvent};
use crate::publisher::{FailureKind, SendError, SendOutcome};
use crate::stats::Counters;
use crate::store::DeadLetter;
use crate::telemetry::PublishSpans;

/// A send is not started with less lease than this left; the events are released instead.
const MIN_SEND_BUDGET: Duration = Duration::from_millis(20);
/// Margin kept between the end of a send and the end of its lease.
const LEASE_MARGIN_FRACTION: u32 = 10;

pub(super) fn worker_loop(inner: &Inner, chunks: Receiver<Chunk>) {
    for chunk in chunks.iter() {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if inner.stopping.load(SeqCst) {
                release_chunk_unsent(inner, &chunk, "relay stopping before the send");
            } else {
                process(inner, &chunk);
            }
        }));
        if outcome.is_err() {
            log::error!(
                "worker panicked while handling events {:?}; they stay claimed until their lease expires",
                ids_of(&chunk.events)
            );
        }
        finish(inner, &chunk);
    }
}

fn process(inner: &Inner, chunk: &Chunk) {
    let cfg = &inner.config;
    if !chunk.probe && !inner.breaker.lock().allows_send() {
        release_chunk_unsent(inner, chunk, "broker unavailable (circuit breaker open)");
        return;
    }
    let Some(expires) = inner.leases.lock().get(&chunk.seq).map(|l| l.expires) else {
        return;
    };
    // The send must end before the lease does, with a margin.
    let margin = cfg.lease / LEASE_MARGIN_FRACTION;
    let budget = expires.saturating_duration_since(Instant::now()).saturating_sub(margin);
    let timeout = cfg.send_timeout.min(budget);
    if timeout < MIN_SEND_BUDGET {
        release_chunk_unsent(inner, chunk, "lease nearly expired before the send");
        return;
    }
    Counters::add(&inner.counters.publish_calls, 1);
    let spans = PublishSpans::start(&chunk.events, cfg.rocketmq.tag_source);
    let outcomes = match catch_unwind(AssertUnwindSafe(|| inner.publisher.publish(&chunk.events, timeout))) {
        Ok(v) if v.len() == chunk.events.len() => v,
        Ok(v) => {
            let msg = format!(
                "publisher returned {} outcomes for {} events",
                v.len(),
                chunk.events.len()
            );
            log::error!("{msg}");
            vec![SendOutcome::Failed(SendError::rejected(msg)); chunk.events.len()]
        }
        Err(panic) => {
            Counters::add(&inner.counters.publish_panics, 1);
            let msg = format!("publisher panicked: {}", panic_message(&*panic));
            log::error!("{msg} (events {:?})", ids_of(&chunk.events));
            vec![SendOutcome::Failed(SendError::rejected(msg)); chunk.events.len()]
        }
    };
    let broker_acked = chunk.claimed.elapsed();
    spans.end(&outcomes);
    record_outcomes(inner, chunk, outcomes, broker_acked);
}

/// `broker_acked`: time from the claim to the publisher's answer.
fn record_outcomes(inner: &Inner, chunk: &Chunk, outcomes: Vec<SendOutcome>, broker_acked: Duration) {
    let cfg = &inner.config;
    let mut acks = Vec::new();
    let mut acked_ages = Vec::new();
    let mut unavailable = Vec::new();
    let mut parked: Vec<(EventId, SendError)> = Vec::new();
    let mut held_back: Vec<EventId> = Vec::new();
    let mut retry: Vec<(&OutboundEvent, SendError)> = Vec::new();
    let mut dead: Vec<(&OutboundEvent, SendError)> = Vec::new();
    let mut timeouts = 0usize;
    for ((event, outcome), age) in chunk.events.iter().zip(outcomes).zip(&chunk.ages) {
        match outcome {
            SendOutcome::Sent { msg_id } => {
                acks.push((event.id, msg_id));
                acked_ages.push((*age, event));
            }
            SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable => unavailable.push((event.id, e)),
            SendOutcome::Failed(e) if e.kind == FailureKind::Parked => parked.push((event.id, e)),
            SendOutcome::Failed(e) if e.kind == FailureKind::HeldBack => held_back.push(event.id),
            SendOutcome::Failed(e) => {
                if e.kind == FailureKind::Timeout {
                    timeouts += 1;
                }
                // `attempt` is the row's retry_count at the claim; the claim token guarantees no
                // one changed it since. This attempt is number attempt + 1.
                if event.attempt >= cfg.max_retry {
                    dead.push((event, e));
                } else {
                    retry.push((event, e));
                }
            }
        }
    }
    // The breaker hears about the call as a whole, parked events left out (their broker is
    // down, not the broker as a whole).
    let transition = {
        let mut b = inner.breaker.lock();
        let n = chunk.events.len() - parked.len() - held_back.len();
        if n == 0 {
            if chunk.probe {
                b.probe_not_sent();
            }
            None
        } else if !acks.is_empty() {
            b.on_success()
        } else if unavailable.len() == n || timeouts == n {
            b.on_failure(Instant::now())
        } else {
            b.on_message_failure()
        }
    };
    if let Some(t) = transition {
        log_breaker(inner, t, unavailable.first().map(|(_, e)| e.message.as_str()));
    }
    // An unknown outcome may have been stored by the broker: each such row may arrive twice,
    // and each also used an attempt (retry or dead letter below).
    if timeouts > 0 {
        Counters::add(&inner.counters.possible_duplicates, timeouts as u64);
    }
    if let Some(round) = &chunk.round {
        round.gather(|g| {
            let o = &mut g.outcomes;
            for ((id, msg_id), (age, event)) in acks.into_iter().zip(acked_ages) {
                o.sent.push((id, msg_id, event.attempt));
                let trace_id = crate::trace::context_of(&event.headers).map(|(tp, _)| tp.trace_id);
                g.deliveries.push((age, broker_acked, trace_id));
            }
            if let Some((_, e)) = retry.first() {
                if o.retry.is_empty() {
                    o.retry_error = e.to_string();
                }
            }
            o.retry.extend(retry.iter().map(|(ev, _)| ev.id));
            if let Some((_, e)) = dead.first() {
                if o.fail.is_empty() {
                    o.fail_error = e.to_string();
                }
            }
            o.fail.extend(dead.iter().map(|(ev, _)| ev.id));
            g.letters.extend(dead.iter().map(|(ev, e)| dead_letter(ev, e)));
            if let Some((_, e)) = parked.first() {
                if o.parked.is_empty() {
                    o.parked_reason = format!("parked: {}", e.message);
                    o.parked_delay = cfg.breaker_open;
                }
            }
            o.parked.extend(parked.iter().map(|(id, _)| *id));
        });
        // Unavailable and held-back events are left as they were: due again at once.
        Counters::add(
            &inner.counters.released_unsent,
            (unavailable.len() + held_back.len()) as u64,
        );
        return;
    }
    let lease_end = lease_end(inner, chunk);
    let token = chunk.token;
    if !acks.is_empty() {
        let want = acks.len() as u64;
        // `sent.rows = delete`: first attempts are deleted, the others kept as SUCCESS.
        let (gone, kept): (Vec<_>, Vec<_>) = acks
            .iter()
            .cloned()
            .zip(&acked_ages)
            .partition(|(_, (_, ev))| inner.store.deletes_sent(ev.attempt));
        let gone: Vec<_> = gone.into_iter().map(|(a, _)| a).collect();
        let kept: Vec<_> = kept.into_iter().map(|(a, _)| a).collect();
        let record = || -> crate::error::Result<u64> {
            Ok(inner.store.delete_sent(token, &gone)? + inner.store.ack(token, &kept)?)
        };
        if let Some(got) = with_db_retry(inner, lease_end, "ack", record) {
            Counters::add(&inner.counters.sent, got);
            if let Some(hook) = &inner.latency {
                let held = chunk.claimed.elapsed();
                for (age, event) in &acked_ages {
                    hook(&Delivery {
                        to_broker: *age + broker_acked,
                        to_success: *age + held,
                        held,
                        trace_id: crate::trace::context_of(&event.headers).map(|(tp, _)| tp.trace_id),
                    });
                }
            }
            if got < want {
                Counters::add(&inner.counters.stale_acks, want - got);
                log::warn!(
                    "{} of {want} acks matched no row: their lease was lost before the ack (events are resent under the newer claim)",
                    want - got
                );
            }
        }
    }
    if !unavailable.is_empty() {
        let ids: Vec<EventId> = unavailable.iter().map(|(id, _)| *id).collect();
        let reason = format!("broker unavailable: {}", unavailable[0].1.message);
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_unsent(token, &ids, &reason)
        }) {
            Counters::add(&inner.counters.released_unsent, n);
        }
    }
    if !parked.is_empty() {
        let ids: Vec<EventId> = parked.iter().map(|(id, _)| *id).collect();
        let reason = format!("parked: {}", parked[0].1.message);
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_parked(token, &ids, &reason, cfg.breaker_open)
        }) {
            Counters::add(&inner.counters.parked, n);
        }
    }
    if !held_back.is_empty() {
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner
                .store
                .release_unsent(token, &held_back, "held back: an earlier event of the key failed")
        }) {
            Counters::add(&inner.counters.released_unsent, n);
        }
    }
    for (event, e) in &retry {
        log::debug!(
            "event {} attempt {} failed, will retry: {e}",
            event.id,
            event.attempt + 1
        );
    }
    // Rows sharing an outcome share one statement; the error text of the first stands for all.
    if !retry.is_empty() {
        let ids: Vec<EventId> = retry.iter().map(|(e, _)| e.id).collect();
        let reason = retry[0].1.to_string();
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_for_retry(token, &ids, &reason)
        }) {
            Counters::add(&inner.counters.retried, n);
        }
    }
    if !dead.is_empty() {
        let ids: Vec<EventId> = dead.iter().map(|(e, _)| e.id).collect();
        let reason = dead[0].1.to_string();
        if let Some(n) = with_db_retry(inner, lease_end, "fail", || inner.store.fail(token, &ids, &reason)) {
            // Only when every row was still ours do we know exactly which ones ended FAIL.
            if n == ids.len() as u64 {
                let letters: Vec<DeadLetter> = dead.iter().map(|(ev, e)| dead_letter(ev, e)).collect();
                dead_lettered(inner, &letters);
            } else {
                log::warn!(
                    "{} of {} dead letters had lost their lease; another claim owns them",
                    ids.len() as u64 - n,
                    ids.len()
                );
                Counters::add(&inner.counters.dead_lettered, n);
            }
        }
    }
}

/// The dead letter of an event whose last allowed attempt (its `attempt` + 1) failed with `e`.
fn dead_letter(ev: &OutboundEvent, e: &SendError) -> DeadLetter {
    DeadLetter {
        id: ev.id,
        biz_no: ev.biz_no.clone(),
        event_type: ev.event_type.clone(),
        retry_count: ev.attempt + 1,
        last_error: e.to_string(),
    }
}

fn log_breaker(inner: &Inner, t: Transition, reason: Option<&str>) {
    match t {
        Transition::Opened { failures } => {
            Counters::add(&inner.counters.breaker_opened, 1);
            log::warn!(
                "circuit breaker opened after {failures} consecutive broker-wide failures ({}); claiming paused, probing every {} ms",
                reason.unwrap_or("timeouts"),
                inner.config.breaker_open.as_millis()
            );
        }
        Transition::Reopened => log::debug!("circuit breaker probe failed; staying open"),
        Transition::Closed => {
            Counters::add(&inner.counters.breaker_closed, 1);
            log::info!("circuit breaker closed: the broker accepts messages again");
        }
    }
}
