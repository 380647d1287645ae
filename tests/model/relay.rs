//! The relay's protocol as a state machine: several relays claim rows of one outbox table, send
//! them to a broker and record the outcomes, under a lease or in held rounds, while relays crash
//! and restart, stall past their lease, sends time out or are refused, statements fail, and an
//! operator replays dead letters. Every write to a row goes through a [`Transition`] of
//! `outbox::protocol` (the crate's table, or a mutant of it): its guard decides whether the
//! statement matches the row, exactly as the SQL `store/` renders from the same table does
//! (`tests/it/conformance.rs` checks that agreement on MariaDB).

use outbox::protocol::{self, Claim, RowView, Status, Transition};
use stateright::{Model, Property};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `claim.strategy = skip-locked` (and `per-row`, ordered relays): a claim writes a lease.
    Lease,
    /// `claim.strategy = held` (the default): the round's row locks are the claim.
    Held,
}

/// The transitions the model runs: the crate's by default; a test swaps one for a mutant.
#[derive(Clone, Debug)]
pub struct Table {
    pub lease_claim: Transition,
    pub ack: Transition,
    pub delete_sent: Transition,
    pub retry: Transition,
    pub release: Transition,
    pub fail: Transition,
    pub renew: Transition,
    pub reclaim: Transition,
    pub reclaim_last: Transition,
    pub held_delete_sent: Transition,
    pub held_sent: Transition,
    pub held_retry: Transition,
    pub held_fail: Transition,
    pub held_park: Transition,
    pub lost_round: Transition,
    pub lost_round_last: Transition,
    pub retention: Transition,
    pub cancel: Transition,
}

impl Table {
    pub fn of_the_crate() -> Table {
        Table {
            lease_claim: protocol::LEASE_CLAIM,
            ack: protocol::ACK,
            delete_sent: protocol::DELETE_SENT,
            retry: protocol::RETRY,
            release: protocol::RELEASE,
            fail: protocol::FAIL,
            renew: protocol::RENEW,
            reclaim: protocol::RECLAIM,
            reclaim_last: protocol::RECLAIM_LAST,
            held_delete_sent: protocol::HELD_DELETE_SENT,
            held_sent: protocol::HELD_SENT,
            held_retry: protocol::HELD_RETRY,
            held_fail: protocol::HELD_FAIL,
            held_park: protocol::HELD_PARK,
            lost_round: protocol::LOST_ROUND,
            lost_round_last: protocol::LOST_ROUND_LAST,
            retention: protocol::RETENTION,
            cancel: protocol::CANCEL,
        }
    }

    /// Every transition the model runs, to compare with the crate's list.
    pub fn all(&self) -> Vec<Transition> {
        vec![
            self.lease_claim,
            self.ack,
            self.delete_sent,
            self.retry,
            self.release,
            self.fail,
            self.renew,
            self.reclaim,
            self.reclaim_last,
            self.held_delete_sent,
            self.held_sent,
            self.held_retry,
            self.held_fail,
            self.held_park,
            self.lost_round,
            self.lost_round_last,
            self.retention,
            self.cancel,
        ]
    }
}

/// How much of each fault a run may meet.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub crashes: u8,
    /// Lease: a live relay's lease expires mid-send. Held: the server drops a live round's
    /// connection (`wait_timeout`) while the relay goes on sending.
    pub stalls: u8,
    /// A send that times out (the broker may have it: an attempt) or is refused (it has not).
    pub broker: u8,
    /// A statement recording the outcomes fails.
    pub db: u8,
    /// An operator replays a dead letter.
    pub replays: u8,
    /// An operator pauses the table (`outbox_control`), and later resumes it.
    pub pauses: u8,
    /// Retention runs (`sent.retention`): any row may be offered to its DELETE at any time.
    pub retention: bool,
    /// The order service cancels an event (`crate::cancel`): offered any row no round's
    /// transaction locks (the cancel's locking read waits for a held round to end).
    pub cancels: u8,
}

impl Faults {
    /// A crash, a stall, a broker fault, a failed record and a replay; no pause, no retention.
    pub fn each_once() -> Faults {
        Faults {
            crashes: 1,
            stalls: 1,
            broker: 1,
            db: 1,
            replays: 1,
            pauses: 0,
            retention: false,
            cancels: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RelayModel {
    pub strategy: Strategy,
    pub table: Table,
    pub relays: usize,
    /// Committed events: rows of the table.
    pub events: usize,
    /// Events of rolled-back transactions: never rows (the database never shows them).
    pub rolled_back: usize,
    pub max_retry: u32,
    pub faults: Faults,
    /// A lost held round's events are audited as `claim-lost` (a mutant turns it off).
    pub audit_lost_rounds: bool,
    /// `ordering = per-biz-no` (under a lease, as ordered relays claim): the key of each event,
    /// in commit (id) order; `None`: unordered.
    pub keys: Option<Vec<usize>>,
    /// Ordered: a key is claimed only from its oldest pending row (a mutant turns it off).
    pub run_from_head: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// `None`: deleted (sent and recorded, `sent.rows = delete`).
    pub status: Option<Status>,
    pub retry_count: u32,
    /// The lease claim written in the row: (relay, claim number) stand for token and owner.
    pub claim: Option<(u8, u16)>,
    pub lease_expired: bool,
    /// The held round holding the row's lock.
    pub lock: Option<u8>,
    /// Ghost: the claim that took the row last (lease or held).
    pub epoch: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Unsent,
    Sent,
    /// A timeout or an error from the broker: the row's attempt failed (a copy may exist).
    Failed,
    /// Refused before anything left (broker down, breaker open): no attempt.
    NotSent,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Round {
    pub claim_no: u16,
    /// Each row with its outcome so far and its attempt at the claim (`retry_count` then).
    pub rows: Vec<(usize, Outcome, u32)>,
    /// Held: the server dropped the round's connection; its locks are gone.
    pub conn_lost: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Relay {
    pub alive: bool,
    pub round: Option<Round>,
}

/// A held round's `outbox_claim` row; `held` while its round's transaction locks it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Journal {
    pub claim_no: u16,
    pub relay: u8,
    pub ids: Vec<usize>,
    pub held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub rows: Vec<Row>,
    pub relays: Vec<Relay>,
    pub journal: Vec<Journal>,
    /// Copies the broker holds, per event (committed ones first, then the rolled-back ones).
    pub sends: Vec<u8>,
    /// Ghost: attempts counted per event, never reset (retry_count increments), plus
    /// `claim-lost` audits and operator replays: what a copy can be attributed to.
    pub counted: Vec<u8>,
    pub next_claim: u16,
    pub left: [u8; 7],
    /// The table is paused (`outbox_control`): relays claim nothing.
    pub paused: bool,
    /// Ghost: the first statement that changed a row under a claim that was no longer its own.
    pub stale: Option<&'static str>,
    /// Ghost (ordered): an event's first copy reached the broker before that of an earlier event
    /// of its key that was neither dead-lettered nor replayed.
    pub out_of_order: bool,
    /// Ghost: events an operator replayed (sent again out of order, by choice).
    pub replayed: Vec<bool>,
    /// Ghost: events whose cancel deleted their row (reported cancelled to the caller).
    pub cancelled: Vec<bool>,
    /// Ghost: a cancel deleted a row that a live round's claim still held.
    pub cancel_under_claim: bool,
}

const CRASH: usize = 0;
const STALL: usize = 1;
const BROKER: usize = 2;
const DB: usize = 3;
const REPLAY: usize = 4;
const PAUSE: usize = 5;
const CANCEL: usize = 6;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Claim(u8),
    Send(u8, usize),
    SendTimesOut(u8, usize),
    SendRefused(u8, usize),
    Renew(u8),
    Record(u8),
    RecordFails(u8),
    /// Time passes for a row whose claim no live round holds: its lease expires.
    LeaseExpires(usize),
    /// A live relay stalls past its lease (lease: a row's lease expires; held: the server
    /// drops the round's connection).
    Stall(u8, usize),
    Reclaim(u8, usize),
    Recover(u8, usize),
    Crash(u8),
    Restart(u8),
    Replay(usize),
    Pause,
    Resume,
    /// Retention deletes a sent row kept as SUCCESS once it is old enough.
    Retention(usize),
    /// The order service cancels the event (a no-op unless the guard admits the row).
    Cancel(usize),
}

impl RelayModel {
    pub fn new(strategy: Strategy, relays: usize, events: usize, faults: Faults) -> RelayModel {
        RelayModel {
            strategy,
            table: Table::of_the_crate(),
            relays,
            events,
            rolled_back: 1,
            max_retry: 1,
            faults,
            audit_lost_rounds: true,
            keys: None,
            run_from_head: true,
        }
    }

    fn view(&self, row: &Row, relay: u8, claim_no: u16) -> Option<RowView> {
        Some(RowView {
            status: row.status?,
            mine: row.claim == Some((relay, claim_no)),
            lease_expired: row.lease_expired,
            // Backoffs are not modelled: a WAIT row is due.
            due: true,
        })
    }

    /// Runs `t` on row `e` as relay `relay` under claim `claim_no` would: nothing when its guard
    /// (or its attempts) does not admit the row. `under_claim`: a statement of a claim's holder,
    /// checked against the ghost epoch.
    fn apply(&self, s: &mut State, t: &Transition, e: usize, relay: u8, claim_no: u16, under_claim: bool) -> bool {
        let Some(view) = self.view(&s.rows[e], relay, claim_no) else {
            return false;
        };
        let row = &mut s.rows[e];
        if !t.guard.admits(&view) || !t.attempts.admits(row.retry_count, self.max_retry) {
            return false;
        }
        if under_claim && row.epoch != claim_no && s.stale.is_none() {
            s.stale = Some(t.name);
        }
        row.status = t.to;
        if t.counts_attempt {
            row.retry_count += 1;
            s.counted[e] = s.counted[e].saturating_add(1);
        }
        match t.claim {
            Claim::Keep => {}
            Claim::Take => {
                row.claim = Some((relay, claim_no));
                row.epoch = claim_no;
                row.lease_expired = false;
            }
            Claim::Renew => row.lease_expired = false,
            Claim::Clear => {
                row.claim = None;
                row.lease_expired = false;
            }
        }
        true
    }

    /// The rows a claim takes now: due WAIT rows no round holds; ordered, for each key only the
    /// run of WAIT rows from its oldest pending one (WAIT or SENDING), none while that one is
    /// SENDING (one run per key in flight).
    fn claimable(&self, s: &State) -> Vec<usize> {
        let due = |row: &Row| {
            row.lock.is_none()
                && row.status.is_some_and(|st| {
                    protocol::SCAN.admits(&RowView {
                        status: st,
                        mine: false,
                        lease_expired: row.lease_expired,
                        due: true,
                    })
                })
        };
        let Some(keys) = self.keys.as_ref().filter(|_| self.run_from_head) else {
            return (0..s.rows.len()).filter(|e| due(&s.rows[*e])).collect();
        };
        let mut out = Vec::new();
        for key in keys.iter().copied().collect::<std::collections::BTreeSet<_>>() {
            let pending = (0..s.rows.len())
                .filter(|e| keys[*e] == key && matches!(s.rows[*e].status, Some(Status::Wait | Status::Sending)));
            for e in pending {
                if !due(&s.rows[e]) {
                    break;
                }
                out.push(e);
            }
        }
        out.sort();
        out
    }

    /// Ordered: a row of a round that is not sent because an earlier row of its key in the round
    /// was not (`HeldBack`: back to WAIT with no attempt).
    fn held_back(&self, round: &Round, e: usize) -> bool {
        let Some(keys) = &self.keys else {
            return false;
        };
        round
            .rows
            .iter()
            .any(|(x, o, _)| *x < e && keys[*x] == keys[e] && matches!(o, Outcome::Failed | Outcome::NotSent))
    }

    /// Ordered: whether every earlier row of its key in the round is sent.
    fn turn_of(&self, round: &Round, e: usize) -> bool {
        let Some(keys) = &self.keys else {
            return true;
        };
        round
            .rows
            .iter()
            .all(|(x, o, _)| !(*x < e && keys[*x] == keys[e]) || *o == Outcome::Sent)
    }

    /// Whether the row is final: sent and recorded (deleted or SUCCESS), or FAIL.
    fn is_final(row: &Row) -> bool {
        matches!(row.status, None | Some(Status::Success) | Some(Status::Fail))
    }

    fn held_by_live_round(s: &State, e: usize) -> bool {
        s.relays.iter().any(|r| {
            r.alive
                && r.round
                    .as_ref()
                    .is_some_and(|round| round.rows.iter().any(|(x, ..)| *x == e))
        })
    }

    /// No action is enabled but faults: nothing is left for the relays to do.
    pub fn quiescent(&self, s: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.iter().all(|a| {
            matches!(
                a,
                Action::Crash(_)
                    | Action::Stall(..)
                    | Action::SendTimesOut(..)
                    | Action::SendRefused(..)
                    | Action::RecordFails(_)
                    | Action::Replay(_)
                    | Action::Pause
                    | Action::Retention(_)
                    | Action::Cancel(_)
            )
        })
    }

    fn end_round(s: &mut State, relay: u8) {
        let r = relay as usize;
        if let Some(round) = s.relays[r].round.take() {
            for row in &mut s.rows {
                if row.lock == Some(relay) {
                    row.lock = None;
                }
            }
            for j in &mut s.journal {
                if j.claim_no == round.claim_no {
                    j.held = false;
                }
            }
        }
    }
}

impl Model for RelayModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.events + self.rolled_back;
        vec![State {
            rows: (0..self.events)
                .map(|_| Row {
                    status: Some(Status::Wait),
                    retry_count: 0,
                    claim: None,
                    lease_expired: false,
                    lock: None,
                    epoch: 0,
                })
                .collect(),
            relays: vec![
                Relay {
                    alive: true,
                    round: None
                };
                self.relays
            ],
            journal: Vec::new(),
            sends: vec![0; n],
            counted: vec![0; n],
            next_claim: 1,
            left: [
                self.faults.crashes,
                self.faults.stalls,
                self.faults.broker,
                self.faults.db,
                self.faults.replays,
                self.faults.pauses,
                self.faults.cancels,
            ],
            paused: false,
            stale: None,
            out_of_order: false,
            replayed: vec![false; n],
            cancelled: vec![false; n],
            cancel_under_claim: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for (i, relay) in s.relays.iter().enumerate() {
            let r = i as u8;
            if !relay.alive {
                out.push(Action::Restart(r));
                continue;
            }
            if s.left[CRASH] > 0 {
                out.push(Action::Crash(r));
            }
            match &relay.round {
                None => {
                    if !s.paused && !self.claimable(s).is_empty() {
                        out.push(Action::Claim(r));
                    }
                    for (e, row) in s.rows.iter().enumerate() {
                        if self.strategy == Strategy::Lease && row.status == Some(Status::Sending) && row.lease_expired
                        {
                            out.push(Action::Reclaim(r, e));
                        }
                    }
                    for (j, journal) in s.journal.iter().enumerate() {
                        if !journal.held {
                            out.push(Action::Recover(r, j));
                        }
                    }
                }
                Some(round) => {
                    let mut all_done = true;
                    for (e, outcome, _) in &round.rows {
                        if *outcome == Outcome::Unsent && !self.held_back(round, *e) {
                            all_done = false;
                            if !self.turn_of(round, *e) {
                                continue;
                            }
                            out.push(Action::Send(r, *e));
                            if s.left[BROKER] > 0 {
                                out.push(Action::SendTimesOut(r, *e));
                                out.push(Action::SendRefused(r, *e));
                            }
                            if s.left[STALL] > 0 && self.strategy == Strategy::Lease && !s.rows[*e].lease_expired {
                                out.push(Action::Stall(r, *e));
                            }
                        }
                    }
                    if s.left[STALL] > 0 && self.strategy == Strategy::Held && !round.conn_lost {
                        out.push(Action::Stall(r, 0));
                    }
                    if self.strategy == Strategy::Lease && !all_done {
                        out.push(Action::Renew(r));
                    }
                    if all_done {
                        out.push(Action::Record(r));
                        if s.left[DB] > 0 {
                            out.push(Action::RecordFails(r));
                        }
                    }
                }
            }
        }
        for (e, row) in s.rows.iter().enumerate() {
            if row.status == Some(Status::Sending) && !row.lease_expired && !Self::held_by_live_round(s, e) {
                out.push(Action::LeaseExpires(e));
            }
            if row.status == Some(Status::Fail) && s.left[REPLAY] > 0 {
                out.push(Action::Replay(e));
            }
            // Offered every existing row: the guard decides (a no-op unless it admits the row).
            if self.faults.retention && row.status.is_some() {
                out.push(Action::Retention(e));
            }
            if s.left[CANCEL] > 0 && row.status.is_some() && row.lock.is_none() {
                out.push(Action::Cancel(e));
            }
        }
        if s.paused {
            out.push(Action::Resume);
        } else if s.left[PAUSE] > 0 {
            out.push(Action::Pause);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Claim(r) => {
                let claim_no = s.next_claim;
                s.next_claim += 1;
                let mut rows = Vec::new();
                for e in self.claimable(&s) {
                    match self.strategy {
                        Strategy::Lease => {
                            let attempt = s.rows[e].retry_count;
                            if self.apply(&mut s, &self.table.lease_claim.clone(), e, r, claim_no, false) {
                                rows.push((e, Outcome::Unsent, attempt));
                            }
                        }
                        Strategy::Held => {
                            let row = &mut s.rows[e];
                            if row.status.is_some_and(|st| {
                                protocol::SCAN.admits(&RowView {
                                    status: st,
                                    mine: false,
                                    lease_expired: false,
                                    due: true,
                                })
                            }) {
                                row.lock = Some(r);
                                row.epoch = claim_no;
                                rows.push((e, Outcome::Unsent, row.retry_count));
                            }
                        }
                    }
                }
                if self.strategy == Strategy::Held {
                    s.journal.push(Journal {
                        claim_no,
                        relay: r,
                        ids: rows.iter().map(|(e, ..)| *e).collect(),
                        held: true,
                    });
                }
                s.relays[r as usize].round = Some(Round {
                    claim_no,
                    rows,
                    conn_lost: false,
                });
            }
            Action::Send(r, e) | Action::SendTimesOut(r, e) | Action::SendRefused(r, e) => {
                let outcome = match action {
                    Action::Send(..) => Outcome::Sent,
                    Action::SendTimesOut(..) => Outcome::Failed,
                    _ => Outcome::NotSent,
                };
                if outcome != Outcome::NotSent {
                    if s.sends[e] == 0 {
                        if let Some(keys) = &self.keys {
                            let skipped = |a: usize| s.rows[a].status == Some(Status::Fail) || s.replayed[a];
                            if (0..e).any(|a| keys[a] == keys[e] && s.sends[a] == 0 && !skipped(a)) {
                                s.out_of_order = true;
                            }
                        }
                    }
                    s.sends[e] = s.sends[e].saturating_add(1);
                }
                if outcome != Outcome::Sent {
                    s.left[BROKER] -= 1;
                }
                let round = s.relays[r as usize].round.as_mut()?;
                for (x, o, _) in &mut round.rows {
                    if *x == e {
                        *o = outcome;
                    }
                }
            }
            Action::Renew(r) => {
                let round = s.relays[r as usize].round.clone()?;
                for (e, o, _) in &round.rows {
                    if *o == Outcome::Unsent {
                        self.apply(&mut s, &self.table.renew.clone(), *e, r, round.claim_no, true);
                    }
                }
            }
            Action::Record(r) => {
                let round = s.relays[r as usize].round.clone()?;
                match self.strategy {
                    Strategy::Lease => {
                        for (e, o, attempt) in &round.rows {
                            let t = self.outcome_transition(*attempt, *o);
                            self.apply(&mut s, &t, *e, r, round.claim_no, true);
                        }
                        s.relays[r as usize].round = None;
                    }
                    Strategy::Held => {
                        if !round.conn_lost {
                            // One transaction: every outcome and the journal row's deletion.
                            for (e, o, attempt) in &round.rows {
                                let t = self.outcome_transition(*attempt, *o);
                                self.apply(&mut s, &t, *e, r, round.claim_no, true);
                            }
                            s.journal.retain(|j| j.claim_no != round.claim_no);
                        }
                        // A lost connection: the COMMIT fails, nothing is written.
                        Self::end_round(&mut s, r);
                    }
                }
            }
            Action::RecordFails(r) => {
                s.left[DB] -= 1;
                // Lease: the rows stay SENDING under the lease and come back by the reclaim.
                // Held: the transaction rolls back, the locks go, the journal row stays.
                Self::end_round(&mut s, r);
            }
            Action::LeaseExpires(e) => s.rows[e].lease_expired = true,
            Action::Stall(r, e) => {
                s.left[STALL] -= 1;
                match self.strategy {
                    Strategy::Lease => s.rows[e].lease_expired = true,
                    Strategy::Held => {
                        let round = s.relays[r as usize].round.as_mut()?;
                        round.conn_lost = true;
                        let claim_no = round.claim_no;
                        for row in &mut s.rows {
                            if row.lock == Some(r) {
                                row.lock = None;
                            }
                        }
                        for j in &mut s.journal {
                            if j.claim_no == claim_no {
                                j.held = false;
                            }
                        }
                    }
                }
            }
            Action::Reclaim(r, e) => {
                let (reclaim, last) = (self.table.reclaim, self.table.reclaim_last);
                if !self.apply(&mut s, &reclaim, e, r, 0, false) {
                    self.apply(&mut s, &last, e, r, 0, false);
                }
            }
            Action::Recover(r, j) => {
                let journal = s.journal.remove(j);
                for e in journal.ids {
                    // Rows another round holds now are skipped (SKIP LOCKED); every event is
                    // audited as claim-lost all the same.
                    if s.rows[e].lock.is_none() {
                        let (lost, last) = (self.table.lost_round, self.table.lost_round_last);
                        if !self.apply(&mut s, &lost, e, r, 0, false) {
                            self.apply(&mut s, &last, e, r, 0, false);
                        }
                    }
                    if self.audit_lost_rounds {
                        s.counted[e] = s.counted[e].saturating_add(1);
                    }
                }
            }
            Action::Crash(r) => {
                s.left[CRASH] -= 1;
                Self::end_round(&mut s, r);
                s.relays[r as usize].alive = false;
            }
            Action::Restart(r) => s.relays[r as usize].alive = true,
            Action::Pause => {
                s.left[PAUSE] -= 1;
                s.paused = true;
            }
            Action::Resume => s.paused = false,
            Action::Retention(e) => {
                let t = self.table.retention;
                self.apply(&mut s, &t, e, 0, 0, false);
            }
            Action::Cancel(e) => {
                s.left[CANCEL] -= 1;
                let t = self.table.cancel;
                let claimed = s.relays.iter().enumerate().any(|(r, relay)| {
                    relay.alive
                        && relay.round.as_ref().is_some_and(|round| {
                            !round.conn_lost
                                && round.rows.iter().any(|(x, ..)| *x == e)
                                && s.rows[e].claim == Some((r as u8, round.claim_no))
                                && !s.rows[e].lease_expired
                        })
                });
                if self.apply(&mut s, &t, e, 0, 0, false) {
                    s.cancelled[e] = true;
                    s.cancel_under_claim |= claimed;
                }
            }
            Action::Replay(e) => {
                s.left[REPLAY] -= 1;
                let row = &mut s.rows[e];
                row.status = Some(Status::Wait);
                row.retry_count = 0;
                row.claim = None;
                row.lease_expired = false;
                s.counted[e] = s.counted[e].saturating_add(1);
                s.replayed[e] = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no row changes under a claim that is no longer its own",
                |_, s: &State| s.stale.is_none(),
            ),
            Property::always(
                "every copy sent is attributable to a counted attempt, audit, replay or journal row",
                |_, s: &State| {
                    s.sends.iter().zip(&s.counted).enumerate().all(|(e, (sent, counted))| {
                        // A held round's journal row names its events until a recovery counts
                        // and audits them (or the round records them and deletes it).
                        let journaled = s.journal.iter().filter(|j| j.ids.contains(&e)).count();
                        usize::from(*sent) <= 1 + usize::from(*counted) + journaled
                    })
                },
            ),
            Property::always(
                "no event of a rolled-back transaction is sent",
                |m: &Self, s: &State| s.sends[m.events..].iter().all(|n| *n == 0),
            ),
            Property::always("a row recorded as sent was sent", |_, s: &State| {
                s.rows
                    .iter()
                    .zip(&s.sends)
                    .zip(&s.cancelled)
                    .all(|((row, sent), cancelled)| {
                        !matches!(row.status, None | Some(Status::Success)) || *sent > 0 || *cancelled
                    })
            }),
            Property::always(
                "a cancel never deletes a row that a live claim is sending",
                |_, s: &State| !s.cancel_under_claim,
            ),
            Property::always(
                "when nothing is left to do, every committed event is sent or FAIL",
                |m: &Self, s: &State| !m.quiescent(s) || s.rows.iter().all(Self::is_final),
            ),
            Property::always(
                "a key's events first reach the broker in commit order (but past a dead letter)",
                |_, s: &State| !s.out_of_order,
            ),
            Property::sometimes("an event is sent twice", |_, s: &State| s.sends.iter().any(|n| *n >= 2)),
            Property::sometimes("every event sent and recorded", |_, s: &State| {
                s.rows
                    .iter()
                    .all(|row| matches!(row.status, None | Some(Status::Success)))
            }),
        ]
    }
}

impl RelayModel {
    /// The statement a relay runs for a row's outcome (the worker's choice, `relay/worker.rs`).
    fn outcome_transition(&self, attempt: u32, outcome: Outcome) -> Transition {
        let t = &self.table;
        let (lease, held) = match outcome {
            Outcome::Sent if attempt == 0 => (t.delete_sent, t.held_delete_sent),
            Outcome::Sent => (t.ack, t.held_sent),
            Outcome::Failed if attempt >= self.max_retry => (t.fail, t.held_fail),
            Outcome::Failed => (t.retry, t.held_retry),
            Outcome::Unsent | Outcome::NotSent => (t.release, t.held_park),
        };
        match self.strategy {
            Strategy::Lease => lease,
            Strategy::Held => held,
        }
    }
}
