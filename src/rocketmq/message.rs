//! An event as a RocketMQ message (body, key, tag, user properties, by the wire contract of
//! [`crate::wire`]), checked before it is sent; and a send result as one outcome per event.

use std::collections::BTreeMap;

use rocketmq_client_rust::{ClientResult, SendResult, SendStatus};
use rocketmq_model::common::message::message_single::Message;

use super::classify::to_send_error;
use crate::config::TagSource;
use crate::event::OutboundEvent;
use crate::publisher::{SendError, SendOutcome};
use crate::wire;

/// Most bytes of encoded properties one message may carry (a 16-bit length on the wire).
const MAX_PROPERTIES_BYTES: usize = i16::MAX as usize;

/// Longest message id stored on a row (`broker_msg_id` is `VARCHAR(128)`).
const MAX_MSG_ID_CHARS: usize = 128;

/// The tag of `event`: [`wire::tag`] with `tag_source` (`rocketmq.tag.source`).
fn tag_of(event: &OutboundEvent, tag_source: TagSource) -> Option<&str> {
    wire::tag(
        event.tag.as_deref(),
        &event.event_type,
        tag_source == TagSource::EventType,
    )
}

/// The user properties of `event`: [`wire::RELAY_PROPERTIES`] (`eventId`, `eventKey`,
/// `eventType`, `bizNo`, and `eventCreatedAt` when known), then its headers (among them
/// `traceparent` and `tracestate`, when the event carries a trace context).
pub fn properties_of(event: &OutboundEvent) -> BTreeMap<String, String> {
    let mut p = event.headers.clone();
    p.insert(wire::EVENT_ID.into(), event.id.to_string());
    p.insert(wire::EVENT_KEY.into(), event.key.clone());
    p.insert(wire::EVENT_TYPE.into(), event.event_type.clone());
    p.insert(wire::BIZ_NO.into(), event.biz_no.clone());
    if event.created_ms > 0 {
        p.insert(wire::EVENT_CREATED_AT.into(), event.created_ms.to_string());
    }
    p
}

/// RocketMQ encodes properties as `name\u{1}value\u{2}`: those characters cannot be sent.
fn check_property_text(what: &str, s: &str) -> std::result::Result<(), SendError> {
    if s.contains(['\u{1}', '\u{2}']) {
        return Err(SendError::rejected(format!(
            "{what} {s:?} contains a control character RocketMQ uses as a property separator"
        )));
    }
    Ok(())
}

/// The approximate encoded size of the event's message, after checking that it can be built.
pub(super) fn message_size(event: &OutboundEvent, tag_source: TagSource) -> std::result::Result<usize, SendError> {
    // KEYS, UNIQ_KEY and WAIT, which the client adds.
    let mut props = 64 + event.id.to_string().len();
    for (k, v) in properties_of(event) {
        check_property_text("property name", &k)?;
        check_property_text("property value", &v)?;
        props += k.len() + v.len() + 2;
    }
    if let Some(tag) = tag_of(event, tag_source) {
        check_property_text("tag", tag)?;
        props += tag.len() + 6;
    }
    // The wire format stores the properties' length in 16 bits.
    if props > MAX_PROPERTIES_BYTES {
        return Err(SendError::rejected(format!(
            "the message properties take about {props} bytes, more than RocketMQ's {MAX_PROPERTIES_BYTES}"
        )));
    }
    Ok(24 + event.payload.len() + props)
}

/// Builds the message for `event`.
pub fn build_message(event: &OutboundEvent, tag_source: TagSource) -> std::result::Result<Message, SendError> {
    message_size(event, tag_source)?;
    let mut b = Message::builder()
        .topic(event.topic.as_str())
        .key(wire::message_key(event.id))
        .body(event.payload.clone());
    if let Some(tag) = tag_of(event, tag_source) {
        b = b.tags(tag);
    }
    for (k, v) in properties_of(event) {
        b = b
            .raw_property(k.as_str(), v.as_str())
            .map_err(|e| SendError::rejected(format!("property {k:?} cannot be sent: {e}")))?;
    }
    b.build()
        .map_err(|e| SendError::rejected(format!("message cannot be built: {e}")))
}

fn msg_id_of(r: &SendResult) -> Option<String> {
    r.msg_id
        .as_ref()
        .map(|m| m.to_string())
        .or_else(|| r.offset_msg_id.clone())
        .filter(|m| !m.is_empty())
}

fn truncated(mut s: String) -> String {
    if s.len() > MAX_MSG_ID_CHARS {
        let mut end = MAX_MSG_ID_CHARS;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn status_error(status: SendStatus) -> SendError {
    // The master stored the message but could not confirm durability or replication: the outcome
    // is as good as unknown, so it is retried (and may be delivered twice).
    SendError::timeout(format!("broker stored the message without confirmation: {status:?}"))
}

pub(super) fn single_outcome(r: &SendResult) -> SendOutcome {
    if r.send_status != SendStatus::SendOk {
        return SendOutcome::Failed(status_error(r.send_status));
    }
    SendOutcome::Sent {
        msg_id: msg_id_of(r).map(truncated),
    }
}

/// One outcome per message of a batch. The client reports the message ids of a batch joined by
/// commas, in order; when that does not match, every event gets the batch's id.
pub(super) fn batch_outcomes(r: &SendResult, n: usize) -> Vec<SendOutcome> {
    if r.send_status != SendStatus::SendOk {
        return vec![SendOutcome::Failed(status_error(r.send_status)); n];
    }
    let id = msg_id_of(r);
    let parts: Vec<&str> = id.as_deref().map(|s| s.split(',').collect()).unwrap_or_default();
    if parts.len() == n {
        parts
            .into_iter()
            .map(|p| SendOutcome::Sent {
                msg_id: Some(truncated(p.to_string())),
            })
            .collect()
    } else {
        let shared = id.map(truncated);
        vec![SendOutcome::Sent { msg_id: shared }; n]
    }
}

pub(super) fn single_result(result: std::result::Result<ClientResult<Option<SendResult>>, SendError>) -> SendOutcome {
    match result {
        Ok(Ok(Some(r))) => single_outcome(&r),
        Ok(Ok(None)) => SendOutcome::Failed(SendError::timeout("the client returned no send result")),
        Ok(Err(e)) => SendOutcome::Failed(to_send_error(&e)),
        Err(hung) => SendOutcome::Failed(hung),
    }
}

#[cfg(test)]
mod tests {
    use cheetah_string::CheetahString;

    use super::*;
    use crate::publisher::FailureKind;

    fn event(id: u64) -> OutboundEvent {
        OutboundEvent {
            id,
            key: format!("key-{id}"),
            biz_no: format!("ORD-{id}"),
            event_type: "ORDER_CREATED".into(),
            payload: b"{}".to_vec(),
            topic: "T".into(),
            tag: None,
            headers: BTreeMap::new(),
            attempt: 0,
            created_ms: 0,
        }
    }

    #[test]
    fn message_carries_key_tag_and_properties() {
        use rocketmq_model::common::message::MessageTrait;
        let mut e = event(42).clone();
        e.headers.insert("traceId".into(), "t-1".into());
        let m = build_message(&e, TagSource::EventType).unwrap();
        assert_eq!(m.get_keys().unwrap().as_str(), "42");
        assert_eq!(m.get_tags().unwrap().as_str(), "ORDER_CREATED");
        let p = |k: &'static str| m.property(&CheetahString::from_static_str(k)).map(|v| v.to_string());
        assert_eq!(p("eventId").as_deref(), Some("42"));
        assert_eq!(p("eventKey").as_deref(), Some("key-42"));
        assert_eq!(p("eventType").as_deref(), Some("ORDER_CREATED"));
        assert_eq!(p("bizNo").as_deref(), Some("ORD-42"));
        assert_eq!(p("traceId").as_deref(), Some("t-1"));
        e.tag = Some("VIP".into());
        assert_eq!(
            build_message(&e, TagSource::None).unwrap().get_tags().unwrap().as_str(),
            "VIP"
        );
        e.tag = None;
        assert!(build_message(&e, TagSource::None).unwrap().get_tags().is_none());
    }

    #[test]
    fn the_relay_sets_exactly_the_contract_s_properties_and_they_are_reserved() {
        let mut e = event(7);
        e.created_ms = 1_764_900_000_000;
        let names: Vec<String> = properties_of(&e).into_keys().collect();
        let mut contract: Vec<String> = wire::RELAY_PROPERTIES.iter().map(|n| n.to_string()).collect();
        contract.sort();
        assert_eq!(names, contract);
        assert!(names.iter().all(|n| wire::is_reserved(n)));
        e.created_ms = 0;
        assert!(
            !properties_of(&e).contains_key(wire::EVENT_CREATED_AT),
            "only when known"
        );
    }

    #[test]
    fn unsendable_properties_are_rejected_not_sent() {
        let mut e = event(1);
        e.headers.insert("UNIQ_KEY".into(), "x".into());
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
        let mut e = event(2);
        e.biz_no = "A\u{1}B".into();
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
        let mut e = event(3);
        e.headers.insert("big".into(), "x".repeat(40_000));
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
    }

    #[test]
    fn batch_ids_are_split_per_message() {
        let r = SendResult {
            msg_id: Some(CheetahString::from_string("A,B,C".into())),
            ..Default::default()
        };
        let ids: Vec<_> = batch_outcomes(&r, 3)
            .into_iter()
            .map(|o| match o {
                SendOutcome::Sent { msg_id } => msg_id.unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec!["A", "B", "C"]);
        let shared = batch_outcomes(&r, 2);
        assert_eq!(
            shared[0],
            SendOutcome::Sent {
                msg_id: Some("A,B,C".into())
            }
        );
        let not_ok = SendResult {
            send_status: SendStatus::FlushDiskTimeout,
            ..Default::default()
        };
        assert!(matches!(&batch_outcomes(&not_ok, 1)[0], SendOutcome::Failed(e) if e.kind == FailureKind::Timeout));
    }
}
