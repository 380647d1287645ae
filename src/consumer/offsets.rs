//! How far each queue may be committed ([`Offsets`]): a queue's messages go to several handler
//! threads (by route value, see `route.rs`) and finish in any order, so a queue's offset moves
//! only past messages that are all done: the lowest offset still in hand, or past the highest
//! one taken when none is. A message a stopping consumer leaves undone holds its queue's offset
//! below it: the broker delivers it again (and the inbox turns a copy into a duplicate).

use std::collections::{BTreeMap, HashMap};

use crate::wire::QueueRef;

#[derive(Debug, Default)]
struct Queue {
    /// Offsets taken and not done yet (a count each: a queue handed back and forth by a
    /// rebalance can deliver an offset twice).
    in_hand: BTreeMap<u64, u32>,
    /// One past the highest offset taken.
    high: u64,
    /// The offset last handed to the source to commit.
    reported: Option<u64>,
}

impl Queue {
    fn next(&self) -> u64 {
        self.in_hand.keys().next().copied().unwrap_or(self.high)
    }
}

/// Per queue, the offsets in hand and the next offset to commit.
#[derive(Debug, Default)]
pub(super) struct Offsets {
    queues: HashMap<QueueRef, Queue>,
}

impl Offsets {
    /// The poller handed message `offset` of `queue` to a handler thread.
    pub(super) fn taken(&mut self, queue: &QueueRef, offset: u64) {
        let q = match self.queues.get_mut(queue) {
            Some(q) => q,
            None => self.queues.entry(queue.clone()).or_default(),
        };
        *q.in_hand.entry(offset).or_insert(0) += 1;
        q.high = q.high.max(offset + 1);
    }

    /// A handler thread is done with message `offset` of `queue` (processed, a duplicate, or
    /// parked).
    pub(super) fn done(&mut self, queue: &QueueRef, offset: u64) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        if let Some(n) = q.in_hand.get_mut(&offset) {
            *n -= 1;
            if *n == 0 {
                q.in_hand.remove(&offset);
            }
        }
    }

    /// The queues whose next offset to commit moved since the last call, with that offset.
    pub(super) fn moved(&mut self) -> Vec<(QueueRef, u64)> {
        let mut out = Vec::new();
        for (queue, q) in &mut self.queues {
            let next = q.next();
            if q.reported != Some(next) {
                q.reported = Some(next);
                out.push((queue.clone(), next));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: u32) -> QueueRef {
        QueueRef {
            topic: "T".into(),
            broker: "b".into(),
            queue_id: id,
        }
    }

    #[test]
    fn a_queue_moves_only_past_messages_that_are_all_done() {
        let mut o = Offsets::default();
        for off in 10..14 {
            o.taken(&q(0), off);
        }
        // 11 and 13 finish first (other threads): nothing before 10 is committed past.
        o.done(&q(0), 11);
        o.done(&q(0), 13);
        assert_eq!(o.moved(), [(q(0), 10)]);
        assert_eq!(o.moved(), [], "unchanged: not reported again");
        o.done(&q(0), 10);
        assert_eq!(o.moved(), [(q(0), 12)]);
        o.done(&q(0), 12);
        assert_eq!(o.moved(), [(q(0), 14)]);
    }

    #[test]
    fn queues_are_independent_and_an_offset_delivered_twice_is_held_until_both_copies_are_done() {
        let mut o = Offsets::default();
        o.taken(&q(0), 5);
        o.taken(&q(1), 7);
        o.taken(&q(0), 5);
        o.done(&q(1), 7);
        o.done(&q(0), 5);
        let mut moved = o.moved();
        moved.sort();
        assert_eq!(moved, [(q(0), 5), (q(1), 8)]);
        o.done(&q(0), 5);
        assert_eq!(o.moved(), [(q(0), 6)]);
        // Done for a queue never taken (after a rebalance): ignored.
        o.done(&q(9), 1);
        assert_eq!(o.moved(), []);
    }
}
