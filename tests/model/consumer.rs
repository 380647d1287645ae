//! The consuming half with the inbox as a state machine: the consumers of one group pull batches
//! from a queue that holds copies (relay resends, broker redeliveries), mark each event's key in
//! the inbox and run the handler in one database transaction, and commit the queue's offset after
//! that transaction commits (`consumer/offsets.rs`). Consumers crash and restart, the queue moves
//! from one to the other while a batch is in flight (a rebalance), and a poison event fails its
//! handler until it is parked as a dead letter, which an operator replays once the handler is
//! fixed (`consumer/dead_letter.rs`, `consumer/replay.rs`). A batch rolled back by a lock
//! conflict is handled again one message at a time (`consumer/handle.rs`). Events of one key are
//! in one queue in commit order (ordered mode); the queue is handled in order by one thread.

use stateright::{Model, Property};

#[derive(Clone, Debug)]
pub struct ConsumerModel {
    pub consumers: usize,
    /// The queue: the event of each message, copies included.
    pub queue: Vec<usize>,
    pub events: usize,
    /// The key (`biz_no`) of each event.
    pub keys: Vec<usize>,
    pub batch: usize,
    /// An event whose handler fails until an operator fixes it.
    pub poison: Option<usize>,
    /// Handler failures of one message before it is parked.
    pub max_attempts: u8,
    /// A mutant: the offset committed before the database transaction.
    pub offset_before_commit: bool,
    pub crashes: u8,
    pub rebalances: u8,
    /// Batches rolled back by a lock conflict.
    pub conflicts: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Batch {
    pub from: usize,
    pub to: usize,
    pub db_committed: bool,
    pub offset_committed: bool,
    /// After a conflict: the next message to handle alone.
    pub one_by_one: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Consumer {
    pub alive: bool,
    /// The next offset this consumer pulls (from the committed offset when it takes the queue).
    pub pos: usize,
    pub batch: Option<Batch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub consumers: Vec<Consumer>,
    /// The consumer the broker gives the queue to.
    pub owner: usize,
    pub committed_offset: usize,
    /// The inbox: the event's key is marked for the group.
    pub inbox: Vec<bool>,
    /// The handler's effect (the points credited), per event.
    pub credits: Vec<u8>,
    /// Ghost: per message, its transaction committed (handled or parked).
    pub done: Vec<bool>,
    pub handler_failures: u8,
    /// Dead letters, per event.
    pub parked: Vec<bool>,
    pub fixed: bool,
    pub crashes_left: u8,
    pub rebalances_left: u8,
    pub conflicts_left: u8,
    /// Ghost: copies the inbox absorbed.
    pub absorbed: u8,
    /// Ghost: events in the order they were credited.
    pub credited: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Pull(usize),
    /// The batch's transaction: inbox marks, handler, commit (a poison message parked in it once
    /// its attempts are used up).
    Commit(usize),
    /// The handler fails on a poison message: the transaction rolls back.
    HandlerFails(usize),
    /// The batch's transaction is rolled back by a lock conflict: its messages go one by one.
    Conflict(usize),
    CommitOffset(usize),
    Crash(usize),
    Restart(usize),
    Rebalance,
    /// An operator fixes the handler and replays the group's dead letters.
    FixAndReplay,
    /// A consumer handles a replayed dead letter.
    HandleReplay(usize, usize),
}

impl ConsumerModel {
    pub fn new() -> ConsumerModel {
        ConsumerModel {
            consumers: 2,
            queue: vec![0, 1, 2, 0],
            events: 3,
            keys: vec![0, 1, 0],
            batch: 2,
            poison: Some(1),
            max_attempts: 1,
            offset_before_commit: false,
            crashes: 1,
            rebalances: 1,
            conflicts: 1,
        }
    }

    /// The messages the batch's next transaction handles: all of them, or the next one alone.
    fn pending(b: &Batch) -> std::ops::Range<usize> {
        match b.one_by_one {
            Some(next) => next..next + 1,
            None => b.from..b.to,
        }
    }

    fn poisoned(&self, s: &State, b: &Batch) -> bool {
        !s.fixed && Self::pending(b).any(|i| Some(self.queue[i]) == self.poison)
    }

    pub fn quiescent(&self, s: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions
            .iter()
            .all(|a| matches!(a, Action::Crash(_) | Action::Rebalance))
    }
}

impl Model for ConsumerModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            consumers: vec![
                Consumer {
                    alive: true,
                    pos: 0,
                    batch: None
                };
                self.consumers
            ],
            owner: 0,
            committed_offset: 0,
            inbox: vec![false; self.events],
            credits: vec![0; self.events],
            done: vec![false; self.queue.len()],
            handler_failures: 0,
            parked: vec![false; self.events],
            fixed: false,
            crashes_left: self.crashes,
            rebalances_left: self.rebalances,
            conflicts_left: self.conflicts,
            absorbed: 0,
            credited: Vec::new(),
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for (c, consumer) in s.consumers.iter().enumerate() {
            if !consumer.alive {
                out.push(Action::Restart(c));
                continue;
            }
            if s.crashes_left > 0 {
                out.push(Action::Crash(c));
            }
            match &consumer.batch {
                None => {
                    if s.owner == c && consumer.pos < self.queue.len() {
                        out.push(Action::Pull(c));
                    }
                }
                Some(b) => {
                    let may_commit = !b.db_committed && (!self.offset_before_commit || b.offset_committed);
                    if may_commit {
                        if self.poisoned(s, b) && s.handler_failures < self.max_attempts {
                            out.push(Action::HandlerFails(c));
                        } else {
                            out.push(Action::Commit(c));
                        }
                        if s.conflicts_left > 0 && b.one_by_one.is_none() && b.to - b.from > 1 {
                            out.push(Action::Conflict(c));
                        }
                    }
                    let may_commit_offset = !b.offset_committed && (b.db_committed || self.offset_before_commit);
                    if may_commit_offset {
                        out.push(Action::CommitOffset(c));
                    }
                }
            }
            for e in 0..self.events {
                if s.parked[e] && s.fixed {
                    out.push(Action::HandleReplay(c, e));
                }
            }
        }
        if s.rebalances_left > 0 {
            out.push(Action::Rebalance);
        }
        if !s.fixed && s.parked.iter().any(|p| *p) {
            out.push(Action::FixAndReplay);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Pull(c) => {
                let from = s.consumers[c].pos;
                let to = (from + self.batch).min(self.queue.len());
                s.consumers[c].pos = to;
                s.consumers[c].batch = Some(Batch {
                    from,
                    to,
                    db_committed: false,
                    offset_committed: false,
                    one_by_one: None,
                });
            }
            Action::HandlerFails(_) => s.handler_failures += 1,
            Action::Conflict(c) => {
                s.conflicts_left -= 1;
                let b = s.consumers[c].batch.as_mut()?;
                b.one_by_one = Some(b.from);
            }
            Action::Commit(c) => {
                let b = s.consumers[c].batch.clone()?;
                let poisoned = self.poisoned(&s, &b);
                for i in Self::pending(&b) {
                    let e = self.queue[i];
                    if poisoned && Some(e) == self.poison {
                        // Its attempts used up: parked in the same transaction, the rest commits.
                        if !s.inbox[e] {
                            s.parked[e] = true;
                        }
                    } else if s.inbox[e] {
                        s.absorbed += 1;
                    } else {
                        s.inbox[e] = true;
                        s.credits[e] += 1;
                        s.credited.push(e);
                    }
                    s.done[i] = true;
                }
                let b = s.consumers[c].batch.as_mut()?;
                match b.one_by_one {
                    Some(next) if next + 1 < b.to => b.one_by_one = Some(next + 1),
                    _ => b.db_committed = true,
                }
                // (Only a mutant commits the offset first; its batch ends here.)
                if b.db_committed && b.offset_committed {
                    s.consumers[c].batch = None;
                }
            }
            Action::CommitOffset(c) => {
                let b = s.consumers[c].batch.as_mut()?;
                b.offset_committed = true;
                let to = b.to;
                if b.db_committed {
                    s.consumers[c].batch = None;
                }
                // The broker keeps the largest offset committed (an old owner's commit after a
                // rebalance does not move it back).
                s.committed_offset = s.committed_offset.max(to);
            }
            Action::Crash(c) => {
                s.crashes_left -= 1;
                s.consumers[c].alive = false;
                s.consumers[c].batch = None;
            }
            Action::Restart(c) => {
                s.consumers[c].alive = true;
                s.consumers[c].pos = s.committed_offset;
            }
            Action::Rebalance => {
                s.rebalances_left -= 1;
                s.owner = (s.owner + 1) % self.consumers;
                let owner = s.owner;
                s.consumers[owner].pos = s.committed_offset;
            }
            Action::FixAndReplay => s.fixed = true,
            Action::HandleReplay(_, e) => {
                // The dead letter's own transaction: the inbox decides, the row is done.
                if !s.inbox[e] {
                    s.inbox[e] = true;
                    s.credits[e] += 1;
                    s.credited.push(e);
                }
                s.parked[e] = false;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no order is credited twice", |_, s: &State| {
                s.credits.iter().all(|c| *c <= 1)
            }),
            Property::always(
                "the offset never passes a message whose transaction has not committed",
                |_, s: &State| s.done[..s.committed_offset].iter().all(|d| *d),
            ),
            Property::always(
                "when nothing is left to do, every order is credited exactly once",
                |m: &Self, s: &State| !m.quiescent(s) || s.credits.iter().all(|c| *c == 1),
            ),
            Property::always(
                "the events of a key are credited in commit order",
                |m: &Self, s: &State| {
                    // Events are numbered in commit order, the queue holds them in it.
                    s.credited.iter().enumerate().all(|(i, e)| {
                        s.credited[i + 1..]
                            .iter()
                            .all(|later| m.keys[*later] != m.keys[*e] || later > e)
                    })
                },
            ),
            Property::sometimes(
                "a batch is handled one message at a time after a conflict",
                |_, s: &State| {
                    s.consumers.iter().any(|c| {
                        c.batch
                            .as_ref()
                            .is_some_and(|b| b.one_by_one.is_some() && b.db_committed)
                    })
                },
            ),
            Property::sometimes("a copy is absorbed by the inbox", |_, s: &State| s.absorbed > 0),
            Property::sometimes("a parked order is credited after its replay", |m: &Self, s: &State| {
                m.poison.is_some_and(|p| s.fixed && s.credits[p] == 1)
            }),
        ]
    }
}
