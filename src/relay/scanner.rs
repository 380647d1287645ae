//! The scanner thread: claims due rows in batches (`claim.strategy`, or by key runs with
//! `ordering = per-biz-no`) while capacity and the circuit breaker allow, walks a draining
//! backlog from where its last full round ended, and splits each round into chunks of one topic
//! (ordered: one queue) for the workers. Woken at once by `Relay::notify` (the fast
//! path) and by workers that free capacity; otherwise it scans every `scan.interval.ms`, or
//! sooner when a row not yet due (a scheduled event, a backoff) becomes due first.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::round::HeldRound;
use super::shared::{finish, release_chunk_unsent, wait, wait_or_capacity, Chunk, Inner, Lease};
use crate::breaker::Permit;
use crate::config::{ClaimStrategy, Config};
use crate::control::PauseCheck;
use crate::event::OutboundEvent;
use crate::stats::{Counters, OrderedRound};
use crate::store::{ClaimRound, Claimed, ScanPosition};

pub(super) fn scanner_loop(
    inner: &Inner,
    chunk_tx: Sender<Chunk>,
    wake: Receiver<()>,
    capacity: Receiver<()>,
    shutdown: Receiver<()>,
) {
    let cfg = &inner.config;
    let ordered = cfg.ordering == crate::config::Ordering::PerBizNo;
    // A key's run travels in one publish call.
    let run_max = call_max(cfg);
    // While a backlog drains, each round starts where the last full one ended (see
    // `ScanPosition`). A round from the head of the index runs after any short round and at
    // least every scan interval, and finds rows that became due behind the position (commits
    // that took long, rows a failed claim left behind).
    let mut position: Option<ScanPosition> = None;
    let mut last_head_scan = Instant::now();
    let mut last_recent_scan = Instant::now();
    // Where the last recent round ended: the next one goes on from there (within its window), so
    // the entries of rows it already claimed are not read again.
    let mut recent_from: Option<ScanPosition> = None;
    let mut next_due = NextDue::default();
    let never = crossbeam_channel::never::<()>();
    // The last round from the head found nothing: the next one first asks whether anything is
    // due (one unlocked read) before it opens a claim round (a transaction of three statements).
    let mut idle = false;
    while !inner.stopping.load(SeqCst) {
        // A paused table (an operator's control) is not claimed from; what is in flight
        // finishes. Read at most once a second before a claim.
        // An idle relay that is not paused reads the flag less often (it reads it again before
        // it claims); a paused one looks every second for the resume.
        let pause_age = if idle && inner.pause.last().is_none() {
            PauseCheck::IDLE_EVERY
        } else {
            PauseCheck::EVERY
        };
        if inner.pause.paused_within(inner.store.pool(), pause_age).is_some() {
            position = None;
            wait(&wake, &shutdown, PauseCheck::EVERY);
            continue;
        }
        let in_flight = inner.counters.in_flight.load(SeqCst) as usize;
        let free = cfg.max_in_flight.saturating_sub(in_flight);
        // Backpressure: claim only when a whole batch fits, so a draining backlog is claimed in
        // full batches rather than in the slivers that finishing chunks free (each round costs
        // the same statements whatever its size). Workers wake the scanner as they finish.
        // Each held round holds a connection: at most one per worker, plus the one being claimed.
        let rounds_full = inner.held_rounds.load(SeqCst) > cfg.workers;
        if free < cfg.batch_size.min(cfg.max_in_flight) || rounds_full {
            wait(&capacity, &shutdown, cfg.scan_interval);
            continue;
        }
        let permit = inner.breaker.lock().permit(Instant::now());
        let limit = match permit {
            Permit::Claim => cfg.batch_size.min(free),
            Permit::Probe => 1,
            Permit::WaitUntil(until) => {
                wait(&wake, &shutdown, until.saturating_duration_since(Instant::now()));
                continue;
            }
            Permit::WaitForProbe => {
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
        };
        let probe_first = idle
            && position.is_none()
            && permit == Permit::Claim
            && !ordered
            && cfg.claim_strategy != ClaimStrategy::PerRow;
        if probe_first {
            match inner.store.first_wait_in() {
                // Nothing waits: the next commit's notify or the interval wakes the scanner. The
                // look counts as a claim round that found nothing (`since_last_claim`).
                Ok(None) => {
                    inner.counters.claims.succeeded();
                    wait(&wake, &shutdown, cfg.scan_interval);
                    continue;
                }
                // The first row is due later (2 ms past `NOW(3)`'s millisecond), or the interval.
                Ok(Some(us)) if us > 0 => {
                    inner.counters.claims.succeeded();
                    let until = Duration::from_micros(us as u64) + Duration::from_millis(2);
                    wait(&wake, &shutdown, until.min(cfg.scan_interval));
                    continue;
                }
                // Due now, or the read failed (the claim round says why): claim, unless the
                // table was paused since the idle scanner last looked.
                _ if inner.pause.paused(inner.store.pool()).is_some() => {
                    wait(&wake, &shutdown, PauseCheck::EVERY);
                    continue;
                }
                _ => {}
            }
        }
        let lease_start = Instant::now();
        if lease_start.duration_since(last_head_scan) >= cfg.scan_interval {
            position = None;
        }
        let from_head = position.is_none();
        if from_head {
            last_head_scan = lease_start;
        }
        // While a backlog drains from a position, rows that just became due (a scheduled event at
        // its time, fresh commits) sort after every row due before them: every RECENT_EVERY a
        // round takes the end of the due range first, and the walk resumes after it.
        let recent_round = !ordered
            && !from_head
            && cfg.claim_strategy != ClaimStrategy::PerRow
            && lease_start.duration_since(last_recent_scan) >= RECENT_EVERY.min(cfg.scan_interval);
        let after = if recent_round {
            last_recent_scan = lease_start;
            let window = cfg.scan_interval.max(RECENT_WINDOW_MIN);
            Some(match &recent_from {
                Some(p) => p.clone().within(window),
                None => ScanPosition::recent(window),
            })
        } else {
            position.clone()
        };
        let mut held = None;
        let result = catch_unwind(AssertUnwindSafe(|| match cfg.claim_strategy {
            // Per-key order: runs of keys whose oldest pending event is due, under a lease.
            _ if ordered => inner.store.claim_ordered_after(limit, run_max, after.as_ref()),
            ClaimStrategy::Held => inner.store.claim_held(limit, after.as_ref()).map(|(round, claim)| {
                held = claim;
                round
            }),
            ClaimStrategy::SkipLocked => inner.store.claim_skip_locked_after(limit, after.as_ref()),
            // The seed's algorithm, as the seed runs it: always from the head.
            ClaimStrategy::PerRow => inner.store.claim_per_row(limit),
        }));
        let round = match result {
            Ok(Ok(round)) => {
                inner.counters.claims.succeeded();
                round
            }
            Ok(Err(e)) => {
                position = None;
                Counters::add(&inner.counters.db_errors, 1);
                // WARN at first, then ERROR at a bounded rate; a stall for /healthz and the stats.
                inner.counters.claims.failed(&e);
                if permit == Permit::Probe {
                    inner.breaker.lock().probe_not_sent();
                }
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
            Err(_) => {
                position = None;
                log::error!("claim round panicked; the scanner goes on");
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
        };
        let n = round.claimed.len();
        let conflicts = round.conflicts as usize;
        idle = from_head && n == 0 && conflicts == 0 && !recent_round;
        let blocked = round.blocked;
        let ordered_next = ordered.then(|| OrderedNext::after(&round, limit));
        if ordered {
            inner.counters.blocked.round(&OrderedRound {
                claimed: n as u64,
                blocked,
                stuck: round.stuck,
                stuck_keys: round.stuck_keys,
                dead_heads: round.dead_heads,
                in_flight: in_flight as u64,
                from_head,
            });
        }
        if recent_round && round.last.is_some() {
            recent_from = round.last.clone();
        }
        position = match ordered_next {
            // The walk goes on where it was.
            None if recent_round => position,
            // Walk past a window of keys that stay blocked for a while.
            Some(OrderedNext::SkipAhead) if cfg.scan_drain => round.last.clone(),
            // Same start: claimed rows left the window, or it waits on runs in flight.
            Some(OrderedNext::Again | OrderedNext::WaitForRuns) if cfg.scan_drain => position,
            Some(_) => None,
            None if n + conflicts >= limit && cfg.claim_strategy != ClaimStrategy::PerRow && cfg.scan_drain => {
                round.last.clone()
            }
            None => None,
        };
        Counters::add(&inner.counters.claim_rounds, 1);
        Counters::add(&inner.counters.claimed, n as u64);
        Counters::add(&inner.counters.claim_conflicts, round.conflicts);
        Counters::add(&inner.counters.claim_blocked, blocked);
        if permit == Permit::Probe && n == 0 {
            inner.breaker.lock().probe_not_sent();
        }
        let held = held.map(|claim| {
            inner.held_rounds.fetch_add(1, SeqCst);
            Arc::new(HeldRound::new(claim, lease_start))
        });
        if n > 0 {
            inner.counters.in_flight.fetch_add(n as u64, SeqCst);
            dispatch(
                inner,
                &chunk_tx,
                round,
                lease_start,
                permit == Permit::Probe,
                held.as_ref(),
            );
        }
        if let Some(round) = held {
            round.dispatched(inner);
        }
        if let Some(next) = ordered_next.filter(|_| cfg.scan_drain && permit == Permit::Claim) {
            match next {
                OrderedNext::Again | OrderedNext::SkipAhead => continue,
                // A short round after a position ends the walk: the head round follows at once.
                OrderedNext::Idle if !from_head => continue,
                // Ours wake the scanner as they end; another instance's are seen at the interval.
                OrderedNext::WaitForRuns => wait_or_capacity(&wake, &capacity, &shutdown, cfg.scan_interval),
                OrderedNext::Idle => wait(&wake, &shutdown, next_due.idle(inner, cfg.scan_interval)),
            }
            continue;
        }
        // A full round of candidates means a backlog is waiting: scan again at once. Candidates
        // another instance took count too (per-row), or racing instances would idle a whole
        // interval after every lost race. A short round that started at a position only ends
        // the range after it: the head round follows at once.
        if (n + conflicts >= limit || !from_head) && cfg.scan_drain && permit == Permit::Claim {
            continue;
        }
        wait(&wake, &shutdown, next_due.idle(inner, cfg.scan_interval));
        // Woken by a commit soon after this short round began: the next round waits until
        // `scan.coalesce.ms` after it, and takes the commits of that span together (every round
        // costs the database the same few statements, whatever its size).
        let since = lease_start.elapsed();
        if since < cfg.scan_coalesce {
            wait(&never, &shutdown, cfg.scan_coalesce - since);
        }
    }
}

/// How often a draining scanner takes the rows that just became due ahead of the backlog.
const RECENT_EVERY: Duration = Duration::from_millis(100);

/// The least window of "just became due" (the scan interval when longer): many times
/// `RECENT_EVERY`, so a row is still in it at the next recent round even when rounds are slow
/// or a head round comes between.
const RECENT_WINDOW_MIN: Duration = Duration::from_secs(1);

/// When the next row not yet due becomes due (one indexed read), read again once that time has
/// passed or a scan interval after the last read, so an idle scanner wakes for a scheduled
/// event or a backoff's end at its time rather than up to a scan interval later: at most one
/// read per interval and per due time passed. A row scheduled after the read, sooner than the
/// one it found, is seen at the interval, as before.
#[derive(Default)]
struct NextDue {
    at: Option<Instant>,
    read_at: Option<Instant>,
}

impl NextDue {
    /// How long an idle scanner waits: until the next due time (and 2 ms, past `NOW(3)`'s
    /// millisecond), at most `interval`.
    fn idle(&mut self, inner: &Inner, interval: Duration) -> Duration {
        let now = Instant::now();
        let stale = self.read_at.is_none_or(|r| now.duration_since(r) >= interval);
        if stale || self.at.is_some_and(|at| at <= now) {
            self.read_at = Some(now);
            self.at = match inner.store.next_due_in() {
                Ok(d) => d.map(|d| now + d + Duration::from_millis(2)),
                Err(e) => {
                    log::debug!("reading the next due time failed ({e}); scanning at the interval");
                    None
                }
            };
        }
        match self.at {
            Some(at) if at > now => (at - now).min(interval),
            _ => interval,
        }
    }
}

/// What the scanner does after an ordered round (see docs/ordering.md, "The window").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OrderedNext {
    /// Runs were claimed, so they left the window: scan again from the same start.
    Again,
    /// A full window, nothing claimable, mostly keys that stay blocked a while (backoff, park,
    /// dead head): scan on after it, or they would hide every key behind them.
    SkipAhead,
    /// Nothing claimable, mostly keys with a run in flight: wait until a run ends.
    WaitForRuns,
    /// The due rows ended: wait for a commit or the interval.
    Idle,
}

impl OrderedNext {
    fn after(round: &ClaimRound, limit: usize) -> OrderedNext {
        let n = round.claimed.len() as u64;
        let busy = round.blocked - round.stuck;
        if n > 0 {
            OrderedNext::Again
        } else if n + round.blocked >= limit as u64 && round.stuck >= busy {
            OrderedNext::SkipAhead
        } else if busy > 0 {
            OrderedNext::WaitForRuns
        } else {
            OrderedNext::Idle
        }
    }
}

/// The most events one publish call takes: `publish.batch.max`, within `max.in.flight`.
fn call_max(cfg: &Config) -> usize {
    cfg.publish_batch_max.min(cfg.max_in_flight).max(1)
}

/// The size of each of as few chunks of at most `most` as hold `n` events, about even.
fn even_chunk(n: usize, most: usize) -> usize {
    n.div_ceil(n.div_ceil(most).max(1)).max(1)
}

/// Splits a claim round into chunks of one topic, spread over the workers, and queues them.
fn dispatch(
    inner: &Inner,
    chunk_tx: &Sender<Chunk>,
    round: ClaimRound,
    lease_start: Instant,
    probe: bool,
    held: Option<&Arc<HeldRound>>,
) {
    if !round.runs.is_empty() {
        return dispatch_runs(inner, chunk_tx, round, lease_start, probe);
    }
    // As few publish calls as `publish.batch.max` allows, of even sizes: every call costs a
    // broker round trip and an ack statement whatever its size. Workers run in parallel on the
    // chunks of consecutive rounds while the scanner claims the next.
    let per_chunk = even_chunk(round.claimed.len(), call_max(&inner.config));
    // (claim token, topic, events with their age at the claim)
    type Group = (u64, String, Vec<(OutboundEvent, Duration)>);
    let mut by_topic: Vec<Group> = Vec::new();
    for Claimed { event, token, age } in round.claimed {
        match by_topic
            .iter_mut()
            .find(|(t, topic, _)| *t == token && *topic == event.topic)
        {
            Some((_, _, v)) => v.push((event, age)),
            None => by_topic.push((token, event.topic.clone(), vec![(event, age)])),
        }
    }
    for (token, _, events) in by_topic {
        let mut events = events.into_iter().peekable();
        while events.peek().is_some() {
            let (part, ages): (Vec<OutboundEvent>, Vec<Duration>) = events.by_ref().take(per_chunk).unzip();
            queue_chunk(inner, chunk_tx, token, part, ages, lease_start, probe, held);
        }
    }
}

/// Ordered dispatch: every key's run (per topic) stays whole in one chunk, in id order, so it is
/// sent in order by one worker. Runs bound for one broker queue (as the publisher's
/// [`Publisher::queue_hint`] tells) share chunks, as few as `publish.batch.max` allows, of about
/// even sizes: a chunk is then one broker request, acked as soon as its queue answers, and a
/// queue in two chunks would only be sent to twice. Without hints, runs are packed per topic and
/// the publisher sends a chunk's queues at once.
fn dispatch_runs(inner: &Inner, chunk_tx: &Sender<Chunk>, round: ClaimRound, lease_start: Instant, probe: bool) {
    let most = call_max(&inner.config);
    // Where a part goes: (claim token, topic, queue hint).
    type Lane = (u64, String, Option<u64>);
    // A key's run, split by topic (each part keeps its id order): events with their ages.
    type Part = (Vec<OutboundEvent>, Vec<Duration>);
    let mut lanes: Vec<(Lane, Vec<Part>)> = Vec::new();
    let mut claimed = round.claimed.into_iter();
    for len in round.runs {
        let mut parts: Vec<(u64, String, Part)> = Vec::new();
        for Claimed { event, token, age } in claimed.by_ref().take(len) {
            match parts.iter_mut().find(|p| p.0 == token && p.1 == event.topic) {
                Some((_, _, (events, ages))) => {
                    events.push(event);
                    ages.push(age);
                }
                None => parts.push((token, event.topic.clone(), (vec![event], vec![age]))),
            }
        }
        for (token, topic, part) in parts {
            // One key, one topic: one queue. Only a hint: a publisher panicking on it costs the
            // packing, never the claimed rows.
            let hint = catch_unwind(AssertUnwindSafe(|| inner.publisher.queue_hint(&part.0[0]))).unwrap_or(None);
            let lane = (token, topic, hint);
            match lanes.iter_mut().find(|(l, _)| *l == lane) {
                Some((_, v)) => v.push(part),
                None => lanes.push((lane, vec![part])),
            }
        }
    }
    for ((token, _, _), parts) in lanes {
        let n: usize = parts.iter().map(|p| p.0.len()).sum();
        let max = even_chunk(n, most);
        let (mut events, mut ages) = (Vec::new(), Vec::new());
        for (part, part_ages) in parts {
            if !events.is_empty() && events.len() + part.len() > max {
                queue_chunk(
                    inner,
                    chunk_tx,
                    token,
                    std::mem::take(&mut events),
                    std::mem::take(&mut ages),
                    lease_start,
                    probe,
                    None,
                );
            }
            events.extend(part);
            ages.extend(part_ages);
        }
        if !events.is_empty() {
            queue_chunk(inner, chunk_tx, token, events, ages, lease_start, probe, None);
        }
    }
}

/// Registers the lease of one chunk and hands it to the workers.
#[allow(clippy::too_many_arguments)]
fn queue_chunk(
    inner: &Inner,
    chunk_tx: &Sender<Chunk>,
    token: u64,
    events: Vec<OutboundEvent>,
    ages: Vec<Duration>,
    lease_start: Instant,
    probe: bool,
    held: Option<&Arc<HeldRound>>,
) {
    if let Some(round) = held {
        round.chunk_queued();
    }
    let seq = inner.chunk_seq.fetch_add(1, Relaxed);
    inner.leases.lock().insert(
        seq,
        Lease {
            token,
            ids: events.iter().map(|e| e.id).collect(),
            expires: lease_start + inner.config.lease,
            renewed_at: lease_start,
            held: held.is_some(),
        },
    );
    let chunk = Chunk {
        seq,
        token,
        events,
        ages,
        claimed: lease_start,
        probe,
        round: held.cloned(),
    };
    // Never blocks: the channel holds max.in.flight chunks and at most that many events are in
    // flight. Fails only if every worker has died; then release the rows.
    if let Err(e) = chunk_tx.try_send(chunk) {
        let chunk = e.into_inner();
        log::error!(
            "no worker to take {} claimed events; releasing them",
            chunk.events.len()
        );
        release_chunk_unsent(inner, &chunk, "no worker available");
        finish(inner, &chunk);
    }
}
