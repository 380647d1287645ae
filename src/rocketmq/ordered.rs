//! Ordered publishing (`ordering = per-biz-no`): a call holds whole runs of keys; each key goes to
//! its queue of the topic's stable queue set ([`crate::queues`]), in id order, and stops at its
//! first failure (its later events are held back). The queues of a call are sent at once, as
//! futures of one `block_on`; a key whose queue's broker is down while another broker of the
//! topic is up is parked.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;

use super::classify::{to_send_error, NO_ROUTE};
use super::message::{batch_outcomes, build_message, single_outcome};
use super::producer::{budget_spent, Live, RocketMqPublisher, MIN_SEND_BUDGET};
use super::runtime::{bounded, millis};
use crate::event::OutboundEvent;
use crate::publisher::{FailureKind, SendError, SendOutcome};
use crate::queues::{queue_index, queue_key, QueueBook};
use crate::wire::QueueRef;

impl RocketMqPublisher {
    /// Sends the events of `events` (whole runs of keys, each in id order) to their keys' queues:
    /// per queue, in order, as batches. A key's events after one that failed are not sent
    /// ([`FailureKind::HeldBack`]); keys whose queue's broker is down while another broker of the
    /// topic is up are [`FailureKind::Parked`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish_ordered(
        &self,
        live: &Live,
        book: &QueueBook,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        sizes: &[(usize, usize)],
        outcomes: &mut [Option<SendOutcome>],
        deadline: Instant,
    ) {
        let size_of: HashMap<usize, usize> = sizes.iter().copied().collect();
        let mut topics: Vec<&str> = Vec::new();
        for e in events {
            if !topics.contains(&e.topic.as_str()) {
                topics.push(e.topic.as_str());
            }
        }
        for topic in topics {
            let members: Vec<usize> = (0..events.len()).filter(|&i| events[i].topic == topic).collect();
            let looked_up = self.live_queues(live, topic, deadline).and_then(|live_qs| {
                let stable = book
                    .queues(topic, &live_qs)
                    .map_err(|e| SendError::unavailable(format!("the queue book could not be read: {e}")))?;
                if stable.is_empty() {
                    return Err(SendError::unavailable(format!("{NO_ROUTE}: {topic} has no queue")));
                }
                Ok((live_qs, stable))
            });
            let (live_qs, stable) = match looked_up {
                Ok(v) => v,
                Err(e) => {
                    for &i in &members {
                        outcomes[i].get_or_insert_with(|| SendOutcome::Failed(e.clone()));
                    }
                    continue;
                }
            };
            let live_brokers: HashSet<&str> = live_qs.iter().map(|q| q.broker.as_str()).collect();
            // Per queue of the stable set, the events in the call's order.
            let mut by_queue: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &i in &members {
                by_queue
                    .entry(queue_index(&events[i].biz_no, stable.len()))
                    .or_default()
                    .push(i);
            }
            // Each queue's events on their own: what one queue holds goes out in order, the
            // queues go out at once (a small call of many keys would otherwise pay one round
            // trip per queue in a row).
            let mut work = Vec::new();
            for (qi, idx) in by_queue {
                let q = &stable[qi];
                if !live_brokers.contains(q.broker.as_str()) {
                    let e = SendError::parked(format!(
                        "queue {} of the key: broker {} is not in the route of {topic}",
                        q.in_topic(),
                        q.broker
                    ));
                    for &i in &idx {
                        outcomes[i].get_or_insert_with(|| SendOutcome::Failed(e.clone()));
                    }
                    continue;
                }
                let others_up = live_brokers.iter().any(|b| *b != q.broker.as_str());
                // The queue's own copy of the call's state: its messages and outcomes so far.
                let mut own_built: Vec<Option<Message>> = (0..events.len()).map(|_| None).collect();
                let mut own_outcomes: Vec<Option<SendOutcome>> = vec![None; events.len()];
                for &i in &idx {
                    own_built[i] = built[i].take();
                    own_outcomes[i] = outcomes[i].take();
                }
                work.push((q, others_up, idx, own_built, own_outcomes));
            }
            // The queues' sends as futures of one `block_on`: they run at once on the client's
            // runtime, with no thread per queue.
            let size_of = &size_of;
            let sends = work.into_iter().map(|(q, others_up, idx, mut b, mut o)| async move {
                self.send_queue(
                    live, topic, q, others_up, events, &mut b, size_of, &idx, &mut o, deadline,
                )
                .await;
                (idx, o)
            });
            let done: Vec<(Vec<usize>, Vec<Option<SendOutcome>>)> =
                live.owner.block_on(futures_util::future::join_all(sends));
            for (idx, mut o) in done {
                for i in idx {
                    outcomes[i] = o[i].take();
                }
            }
        }
    }

    /// Sends the events `idx` (in order) to queue `q`, batch after batch, stopping each key at its
    /// first failure.
    #[allow(clippy::too_many_arguments)]
    async fn send_queue(
        &self,
        live: &Live,
        topic: &str,
        q: &QueueRef,
        others_up: bool,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        size_of: &HashMap<usize, usize>,
        idx: &[usize],
        outcomes: &mut [Option<SendOutcome>],
        deadline: Instant,
    ) {
        let mq = MessageQueue::from_parts(topic, q.broker.as_str(), q.queue_id as i32);
        let mut failed: HashSet<String> = HashSet::new();
        let held = || SendOutcome::Failed(SendError::held_back("an earlier event of the key failed"));
        // Consecutive batches, in order, each at most batch_max_bytes.
        let mut batch: Vec<usize> = Vec::new();
        let mut bytes = 0;
        let mut pending = idx.iter().copied().peekable();
        loop {
            let next = pending.peek().copied();
            let full = next.is_some_and(|i| {
                !batch.is_empty() && bytes + size_of.get(&i).copied().unwrap_or(0) > self.batch_max_bytes
            });
            if next.is_none() || full {
                if batch.is_empty() {
                    break;
                }
                // Keys that failed in an earlier batch of this call go no further.
                let (go, stop): (Vec<usize>, Vec<usize>) = batch
                    .drain(..)
                    .partition(|&i| !failed.contains(&queue_key(&events[i].biz_no)));
                for i in stop {
                    outcomes[i] = Some(held());
                }
                let results = self
                    .send_to_queue(live, &mq, others_up, events, built, &go, deadline)
                    .await;
                for (&i, r) in go.iter().zip(results) {
                    if matches!(r, SendOutcome::Failed(_)) {
                        failed.insert(queue_key(&events[i].biz_no));
                    }
                    outcomes[i] = Some(r);
                }
                bytes = 0;
                continue;
            }
            let i = pending.next().expect("peeked");
            if outcomes[i].is_some() || built[i].is_none() {
                // Could not be built (already failed): the key's later events wait.
                failed.insert(queue_key(&events[i].biz_no));
                continue;
            }
            if failed.contains(&queue_key(&events[i].biz_no)) {
                outcomes[i] = Some(held());
                continue;
            }
            bytes += size_of.get(&i).copied().unwrap_or(0);
            batch.push(i);
        }
    }

    /// One batch (or one message) to `mq`. A batch refused for its content is sent one by one,
    /// each key stopping at its first failure. A broker that cannot be reached parks the events
    /// when another broker of the topic is up.
    #[allow(clippy::too_many_arguments)]
    async fn send_to_queue(
        &self,
        live: &Live,
        mq: &MessageQueue,
        others_up: bool,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        go: &[usize],
        deadline: Instant,
    ) -> Vec<SendOutcome> {
        if go.is_empty() {
            return Vec::new();
        }
        let messages: Vec<Message> = go.iter().filter_map(|&i| built[i].take()).collect();
        let result = self.request_to_queue(live, mq, messages, deadline).await;
        let parked = |e: SendError| {
            // This broker is gone (or going) while others serve the topic: park its keys.
            self.routes.lock().remove(mq.topic_str());
            SendError::parked(format!("broker {} unreachable: {}", mq.broker_name(), e.message))
        };
        match result {
            Ok(v) => v,
            Err(e) if e.kind == FailureKind::Rejected && go.len() > 1 => {
                log::debug!(
                    "ordered batch of {} refused ({}); sending one by one",
                    go.len(),
                    e.message
                );
                let mut failed: HashSet<String> = HashSet::new();
                let mut out = Vec::with_capacity(go.len());
                for &i in go {
                    let key = queue_key(&events[i].biz_no);
                    if failed.contains(&key) {
                        out.push(SendOutcome::Failed(SendError::held_back(
                            "an earlier event of the key failed",
                        )));
                        continue;
                    }
                    let r = match build_message(&events[i], self.tag_source) {
                        Ok(m) => match self.request_to_queue(live, mq, vec![m], deadline).await {
                            Ok(mut v) => v.pop().unwrap_or_else(|| SendOutcome::Failed(budget_spent())),
                            Err(e) if e.kind == FailureKind::Unavailable && others_up => SendOutcome::Failed(parked(e)),
                            Err(e) => SendOutcome::Failed(e),
                        },
                        Err(err) => SendOutcome::Failed(err),
                    };
                    if matches!(r, SendOutcome::Failed(_)) {
                        failed.insert(key);
                    }
                    out.push(r);
                }
                out
            }
            Err(e) if e.kind == FailureKind::Unavailable && others_up => {
                vec![SendOutcome::Failed(parked(e)); go.len()]
            }
            Err(e) => vec![SendOutcome::Failed(e); go.len()],
        }
    }

    /// One request to `mq`: the message alone, or the messages as one batch; one outcome each.
    async fn request_to_queue(
        &self,
        live: &Live,
        mq: &MessageQueue,
        mut messages: Vec<Message>,
        deadline: Instant,
    ) -> std::result::Result<Vec<SendOutcome>, SendError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        if budget < MIN_SEND_BUDGET {
            return Ok(vec![SendOutcome::Failed(budget_spent()); messages.len()]);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let n = messages.len();
        if n == 1 {
            let m = messages.pop().expect("one message");
            let sent = live.producer.send_to_queue_with_timeout(m, mq.clone(), millis(budget));
            match bounded(budget, sent).await? {
                Ok(Some(r)) => Ok(vec![single_outcome(&r)]),
                Ok(None) => Err(SendError::timeout("the client returned no send result")),
                Err(e) => Err(to_send_error(&e)),
            }
        } else {
            let sent = live
                .producer
                .send_batch_to_queue_with_timeout(messages, mq.clone(), millis(budget));
            match bounded(budget, sent).await? {
                Ok(r) => Ok(batch_outcomes(&r, n)),
                Err(e) => Err(to_send_error(&e)),
            }
        }
    }
}
