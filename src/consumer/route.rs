//! Which handler thread a message goes to, and the order a batch is handled in
//! (`consumer.route`, [`Route`]).
//!
//! Messages with the same route value go to the same thread, in arrival order, so one value's
//! messages never run in two transactions at once in this consumer: a handler that updates rows
//! named by the value (a user's balance routed by `property:userId`) does not wait on, or
//! deadlock with, its own consumer's other threads. A batch is handled in the order of its route
//! values (stable: one value's messages keep their order), so transactions of consumers in other
//! processes take those rows in the same order, and wait instead of deadlocking.
//!
//! Routed by `queue` (the default) or `biz_no`, an ordered key's events keep their order: the
//! relay sends one key to one queue, in order, and the queue (or the key) goes to one thread.
//! Routed by a property, a key's events keep their order if the property is the same on all of
//! them (a user id on every event of that user's order).
//!
//! The default is the queue because it is the faster of the two that know nothing of the
//! handler's rows (benches/README.md, "points"): routed by business key, every thread's batches
//! hold every user, in a random order, and meet each other's locks.

use std::hash::{Hash, Hasher};

use super::message::Message;
use crate::config::Route;
use crate::wire::QueueRef;

/// The value a message is routed and sorted by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum RouteValue<'a> {
    /// A business key or a property's value.
    Value(&'a str),
    /// No value: the queue.
    Queue(&'a QueueRef),
}

/// What `route` routes `msg` by.
pub(super) fn route_value<'a>(route: &Route, msg: &'a Message) -> RouteValue<'a> {
    let by_key = || msg.biz_no().map(RouteValue::Value);
    let by_queue = || RouteValue::Queue(&msg.queue);
    match route {
        Route::BizNo => by_key().unwrap_or_else(by_queue),
        Route::Queue => by_queue(),
        Route::Property(name) => msg
            .property(name)
            .map(RouteValue::Value)
            .or_else(by_key)
            .unwrap_or_else(by_queue),
    }
}

/// The handler thread (of `threads`) that `msg` goes to.
pub(super) fn thread_of(route: &Route, msg: &Message, threads: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    route_value(route, msg).hash(&mut h);
    (h.finish() % threads.max(1) as u64) as usize
}

/// Orders a batch by route value, keeping each value's messages in their order.
pub(super) fn sort_batch(route: &Route, batch: &mut [Message]) {
    batch.sort_by(|a, b| route_value(route, a).cmp(&route_value(route, b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(queue: u32, offset: u64, props: &[(&str, &str)]) -> Message {
        Message::new(
            QueueRef {
                topic: "T".into(),
                broker: "b".into(),
                queue_id: queue,
            },
            offset,
            None,
            None,
            props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            Vec::new(),
        )
    }

    #[test]
    fn a_route_value_picks_the_named_source_and_falls_back_when_it_is_missing() {
        let m = msg(3, 7, &[("bizNo", "ORD-1"), ("userId", "u9")]);
        assert_eq!(route_value(&Route::BizNo, &m), RouteValue::Value("ORD-1"));
        assert_eq!(route_value(&Route::Queue, &m), RouteValue::Queue(&m.queue));
        assert_eq!(
            route_value(&Route::Property("userId".into()), &m),
            RouteValue::Value("u9")
        );
        let no_user = msg(3, 8, &[("bizNo", "ORD-2")]);
        assert_eq!(
            route_value(&Route::Property("userId".into()), &no_user),
            RouteValue::Value("ORD-2")
        );
        let bare = msg(4, 1, &[]);
        assert_eq!(route_value(&Route::BizNo, &bare), RouteValue::Queue(&bare.queue));
    }

    #[test]
    fn one_value_always_goes_to_one_thread_and_values_spread() {
        let route = Route::Property("userId".into());
        let mut used = std::collections::HashSet::new();
        for u in 0..64 {
            let user = format!("u{u}");
            let threads: std::collections::HashSet<usize> = (0..8)
                .map(|q| thread_of(&route, &msg(q, u, &[("userId", &user)]), 4))
                .collect();
            assert_eq!(threads.len(), 1, "user {user} in threads {threads:?}");
            used.extend(threads);
        }
        assert_eq!(used.len(), 4, "64 users over 4 threads use them all");
    }

    #[test]
    fn a_sorted_batch_keeps_each_value_s_messages_in_their_order() {
        let mut batch = vec![
            msg(0, 1, &[("bizNo", "B")]),
            msg(0, 2, &[("bizNo", "A")]),
            msg(1, 1, &[("bizNo", "B")]),
            msg(1, 2, &[("bizNo", "A")]),
        ];
        sort_batch(&Route::BizNo, &mut batch);
        let order: Vec<(&str, u32, u64)> = batch
            .iter()
            .map(|m| (m.biz_no().unwrap(), m.queue.queue_id, m.offset))
            .collect();
        assert_eq!(order, [("A", 0, 2), ("A", 1, 2), ("B", 0, 1), ("B", 1, 1)]);
    }
}
