//! A held round in flight (`claim.strategy = held`): its open transaction, the chunks it was
//! split into, and what their sends came to. The last chunk to finish settles the round: every
//! outcome in one COMMIT (`Store::settle_held`), then the counters and the hooks.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::hooks::Delivery;
use super::shared::{dead_lettered, Inner};
use crate::stats::{Counters, Loud};
use crate::store::{DeadLetter, HeldClaim, Outcomes};

pub(super) struct HeldRound {
    claim: Mutex<Option<HeldClaim>>,
    gathered: Mutex<Gathered>,
    /// Chunks not yet finished, plus one while the round is being dispatched.
    open: AtomicUsize,
    claimed: Instant,
}

/// What the round's chunks reported so far.
#[derive(Default)]
pub(super) struct Gathered {
    pub(super) outcomes: Outcomes,
    /// The dead letters the settle writes, for the hook once it committed.
    pub(super) letters: Vec<DeadLetter>,
    /// Sent events: age at the claim, claim to broker ack, trace id (for the latency hook).
    pub(super) deliveries: Vec<(Duration, Duration, Option<[u8; 16]>)>,
}

impl HeldRound {
    /// A round being dispatched: [`HeldRound::dispatched`] ends that.
    pub(super) fn new(claim: HeldClaim, claimed: Instant) -> HeldRound {
        HeldRound {
            claim: Mutex::new(Some(claim)),
            gathered: Mutex::new(Gathered::default()),
            open: AtomicUsize::new(1),
            claimed,
        }
    }

    /// One more chunk of this round is queued.
    pub(super) fn chunk_queued(&self) {
        self.open.fetch_add(1, SeqCst);
    }

    /// Adds what a chunk's sends came to.
    pub(super) fn gather(&self, f: impl FnOnce(&mut Gathered)) {
        f(&mut self.gathered.lock());
    }

    /// Every chunk is queued; settles at once if they have all finished already.
    pub(super) fn dispatched(&self, inner: &Inner) {
        self.release(inner);
    }

    /// A chunk of this round finished (sent, released or dropped by a panic).
    pub(super) fn chunk_finished(&self, inner: &Inner) {
        self.release(inner);
    }

    fn release(&self, inner: &Inner) {
        if self.open.fetch_sub(1, SeqCst) == 1 {
            self.settle(inner);
        }
    }

    /// Records every outcome in one COMMIT. A failure leaves nothing written: the rows are
    /// claimable again, the sends among them may arrive twice (counted), and the round's journal
    /// row is recovered as a lost round (each event audited, an attempt counted).
    fn settle(&self, inner: &Inner) {
        let Some(claim) = self.claim.lock().take() else {
            return;
        };
        self.record(inner, claim);
        // The round's connection is back in its pool: the scanner may open another round.
        inner.held_rounds.fetch_sub(1, SeqCst);
        let _ = inner.capacity_tx.try_send(());
    }

    fn record(&self, inner: &Inner, claim: HeldClaim) {
        let token = claim.token();
        let g = std::mem::take(&mut *self.gathered.lock());
        let settled = inner.store.settle_held(claim, &g.outcomes).or_else(|e| {
            // The connection may have dropped after the server applied the COMMIT.
            match inner.store.held_round_committed(token) {
                Ok(true) => {
                    log::info!(
                        "held round {token}: recording its sends reported an error ({e}), but the round committed"
                    );
                    Ok(g.outcomes.as_settled())
                }
                _ => Err(e),
            }
        });
        match settled {
            Ok(done) => {
                inner.counters.writes.succeeded();
                Counters::add(&inner.counters.sent, done.deleted + done.succeeded);
                Counters::add(&inner.counters.retried, done.retried);
                Counters::add(&inner.counters.parked, done.parked);
                let want = g.outcomes.sent.len() as u64;
                if done.deleted + done.succeeded < want {
                    Counters::add(&inner.counters.stale_acks, want - done.deleted - done.succeeded);
                    log::warn!(
                        "held round {token}: {} of {want} sent rows were no longer pending when the round settled",
                        want - done.deleted - done.succeeded
                    );
                }
                if done.failed == g.letters.len() as u64 {
                    dead_lettered(inner, &g.letters);
                } else {
                    Counters::add(&inner.counters.dead_lettered, done.failed);
                }
                if let Some(hook) = &inner.latency {
                    let held = self.claimed.elapsed();
                    for (age, to_ack, trace_id) in g.deliveries {
                        hook(&Delivery {
                            to_broker: age + to_ack,
                            to_success: age + held,
                            held,
                            trace_id,
                        });
                    }
                }
            }
            Err(e) => {
                let sent = g.outcomes.sent.len() as u64;
                Counters::add(&inner.counters.db_errors, 1);
                Counters::add(&inner.counters.possible_duplicates, sent);
                // The streak's first line would say "retrying": the round is not (its rows are
                // claimable again); the WARN below says what happens. Repeats go on as ERRORs.
                match inner
                    .counters
                    .writes
                    .failed_at(Instant::now(), &format_args!("settling held round {token}: {e}"))
                {
                    Loud::Warn(_) => {}
                    loud => loud.log(),
                }
                log::warn!(
                    "held round {token} could not record its sends ({e}): its rows are claimable again and \
                     the {sent} sent among them will be sent again (counted as possible duplicates, audited as claim-lost)"
                );
            }
        }
    }
}
