//! Topic routes: the ordered topics' queues as last fetched (refreshed in the background), topics
//! created where brokers create them on first use, and what a send that found no route means
//! (the broker's absence, no attempt; or a topic that does not exist, an attempt).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rocketmq_model::common::message::message_queue::MessageQueue;

use super::classify::{describe, NO_ROUTE};
use super::producer::{budget_spent, publisher_error, Live, RocketMqPublisher, MIN_SEND_BUDGET};
use crate::error::Result;
use crate::event::OutboundEvent;
use crate::publisher::{FailureKind, SendError, SendOutcome};
use crate::wire::QueueRef;

/// The topic every broker that creates topics on first use registers (`TBW102`): a route for it
/// or for the default topic shows a live broker.
const AUTO_CREATE_TOPIC: &str = "TBW102";

/// How long the route of an ordered topic is reused before the name server is asked again, in
/// the background (a broker that dies meanwhile is found by its refused connections; one that
/// returns waits about this long).
const ROUTE_TTL: Duration = Duration::from_secs(3);

/// Queues per broker of an ordered topic the publisher creates itself (only where the brokers
/// create topics on first use, as a first send would): the client's own default for a topic a
/// first send creates. An ordered call costs one broker request per queue it reaches, so more
/// queues buy consumer parallelism with more requests per event at low load (docs/ordering.md).
const ORDERED_TOPIC_QUEUES: i32 = 4;

impl RocketMqPublisher {
    /// The queues of `topic`'s route now (cached for [`ROUTE_TTL`]). A topic without a route is
    /// created on the brokers that create topics on first use, as a first send would.
    pub(super) fn live_queues(
        &self,
        live: &Live,
        topic: &str,
        deadline: Instant,
    ) -> std::result::Result<Vec<QueueRef>, SendError> {
        if let Some((at, qs)) = self.routes.lock().get(topic) {
            if at.elapsed() >= ROUTE_TTL {
                self.refresh_route_in_background(live, topic);
            }
            return Ok(qs.clone());
        }
        let fetch = |topic: &str| -> std::result::Result<Vec<QueueRef>, SendError> {
            let budget = deadline.saturating_duration_since(Instant::now());
            if budget < MIN_SEND_BUDGET {
                return Err(budget_spent());
            }
            match route_queues(live, topic, budget) {
                Some(Ok(qs)) => Ok(queue_refs(topic, &qs)),
                Some(Err(e)) => Err(SendError::unavailable(format!("{NO_ROUTE}: {}", describe(&e)))),
                // Nothing was sent: the broker side is not answering.
                None => Err(SendError::unavailable("the route lookup timed out")),
            }
        };
        let mut found = fetch(topic);
        let missing = found.as_ref().map_or(true, |v| v.is_empty());
        if missing
            && self.created.lock().insert(topic.to_string())
            && fetch(AUTO_CREATE_TOPIC).is_ok_and(|v| !v.is_empty())
        {
            let mut producer = live.producer.clone();
            let created = live.owner.block_on(async {
                producer
                    .create_topic(AUTO_CREATE_TOPIC, topic, ORDERED_TOPIC_QUEUES, HashMap::new())
                    .await
            });
            match created {
                Ok(()) => log::info!("created ordered topic {topic} ({ORDERED_TOPIC_QUEUES} queues per broker)"),
                Err(e) => log::warn!("could not create ordered topic {topic}: {}", describe(&e)),
            }
            found = fetch(topic);
        }
        let qs = found?;
        self.routes
            .lock()
            .insert(topic.to_string(), (Instant::now(), qs.clone()));
        Ok(qs)
    }

    /// Looks `topic`'s route up again on the publisher's runtime, without waiting for it: the
    /// caller goes on with the cached route. One lookup per topic at a time; a lookup that fails
    /// or finds no queue leaves the cached route as it was (a dead broker is noticed by its
    /// refused connections, which drop the route).
    fn refresh_route_in_background(&self, live: &Live, topic: &str) {
        if !self.refreshing.lock().insert(topic.to_string()) {
            return;
        }
        let (routes, refreshing) = (self.routes.clone(), self.refreshing.clone());
        let mut producer = live.producer.clone();
        let topic = topic.to_string();
        live.owner.block_on(async move {
            tokio::spawn(async move {
                let found = tokio::time::timeout(ROUTE_TTL, producer.fetch_publish_message_queues(&topic)).await;
                if let Ok(Ok(qs)) = found {
                    let qs = queue_refs(&topic, &qs);
                    if !qs.is_empty() {
                        routes.lock().insert(topic.clone(), (Instant::now(), qs));
                    }
                }
                refreshing.lock().remove(&topic);
            });
        });
    }

    /// Sends that found no route to their topic are the broker's absence (no attempt used) when
    /// no topic has a route, and a topic that does not exist (an attempt, so the row ends FAIL)
    /// when the name server has a route for the default topic or the auto-create topic while
    /// theirs has none. A missing route for the default topic itself always counts as the
    /// broker's absence: the relay cannot tell, and waiting loses nothing.
    pub(super) fn judge_missing_routes(
        &self,
        live: &Live,
        events: &[OutboundEvent],
        outcomes: &mut [SendOutcome],
        deadline: Instant,
    ) {
        let missing: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(i, o)| {
                matches!(o, SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable && e.message.starts_with(NO_ROUTE))
                    && events[*i].topic != self.default_topic
            })
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() || !self.some_topic_has_a_route(live, deadline) {
            return;
        }
        for i in missing {
            if let SendOutcome::Failed(e) = &mut outcomes[i] {
                *e = SendError::rejected(format!(
                    "topic {} does not exist on the broker (the name server has routes for other topics): {}",
                    events[i].topic, e.message
                ));
            }
        }
    }

    /// Whether the name server has a route for the default topic or the auto-create topic (a
    /// live broker is registered), asked within `timeout`. What a send that finds no route for
    /// its own topic is judged by.
    pub fn has_routes(&self, timeout: Duration) -> bool {
        let guard = self.live.read();
        guard
            .as_ref()
            .is_some_and(|live| self.some_topic_has_a_route(live, Instant::now() + timeout))
    }

    /// Creates `topic` with `queues` queues on every broker that holds the auto-create topic
    /// (`TBW102`), as an operator would before relaying an ordered topic.
    pub fn create_topic(&self, topic: &str, queues: i32) -> Result<()> {
        let guard = self.live.read();
        let live = guard
            .as_ref()
            .ok_or_else(|| publisher_error("create topic", "the publisher is shut down"))?;
        let mut producer = live.producer.clone();
        live.owner
            .block_on(async {
                producer
                    .create_topic(AUTO_CREATE_TOPIC, topic, queues, HashMap::new())
                    .await
            })
            .map_err(|e| publisher_error("create topic", describe(&e)))
    }

    /// The brokers that `topic`'s route lists now, as the name server answers within `timeout`.
    pub fn topic_brokers(&self, topic: &str, timeout: Duration) -> Vec<String> {
        let guard = self.live.read();
        let Some(live) = guard.as_ref() else { return Vec::new() };
        let mut brokers: Vec<String> = match route_queues(live, topic, timeout) {
            Some(Ok(qs)) => qs.iter().map(|q| q.broker_name().to_string()).collect(),
            _ => Vec::new(),
        };
        brokers.sort();
        brokers.dedup();
        brokers
    }

    /// [`RocketMqPublisher::has_routes`], within what is left of a send's budget (no answer: no).
    fn some_topic_has_a_route(&self, live: &Live, deadline: Instant) -> bool {
        for topic in [self.default_topic.as_str(), AUTO_CREATE_TOPIC] {
            let budget = deadline.saturating_duration_since(Instant::now());
            if budget < MIN_SEND_BUDGET {
                return false;
            }
            if matches!(route_queues(live, topic, budget), Some(Ok(queues)) if !queues.is_empty()) {
                return true;
            }
        }
        false
    }
}

/// The queues of `topic`'s route as the ordering code names them, sorted.
fn queue_refs(topic: &str, qs: &[MessageQueue]) -> Vec<QueueRef> {
    let mut refs: Vec<QueueRef> = qs
        .iter()
        .map(|q| QueueRef {
            topic: topic.to_string(),
            broker: q.broker_name().to_string(),
            queue_id: q.queue_id().max(0) as u32,
        })
        .collect();
    refs.sort();
    refs
}

/// The queues `topic`'s route lists, as the name server answers within `budget` (`None`: no
/// answer in time).
fn route_queues(
    live: &Live,
    topic: &str,
    budget: Duration,
) -> Option<rocketmq_client_rust::ClientResult<Vec<MessageQueue>>> {
    let mut producer = live.producer.clone();
    live.owner
        .block_on(async { tokio::time::timeout(budget, producer.fetch_publish_message_queues(topic)).await })
        .ok()
}
