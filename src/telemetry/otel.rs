//! The spans, on OpenTelemetry's global tracer provider (cargo feature `otel`).

use std::collections::BTreeMap;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::{global, Context, ContextGuard, KeyValue};

use super::Handled;
use crate::config::TagSource;
use crate::event::OutboundEvent;
use crate::publisher::SendOutcome;
use crate::trace::{context_of, TraceParent};
use crate::wire;

/// The instrumentation scope of every span.
const SCOPE: &str = "outbox";

/// The caller's current trace context as a `traceparent` (and `tracestate`), when the current
/// OpenTelemetry context has a valid span: captured at enqueue when the event has none.
pub fn current_trace_context() -> Option<(String, Option<String>)> {
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let tp = TraceParent {
        version: 0,
        trace_id: sc.trace_id().to_bytes(),
        parent_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    };
    let state = sc.trace_state().header();
    Some((tp.to_header(), (!state.is_empty()).then_some(state)))
}

/// The producer's stored context as the remote parent of a span.
fn parent(tp: &TraceParent, tracestate: Option<&str>) -> Context {
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.parent_id),
        TraceFlags::new(tp.flags),
        true,
        state,
    );
    Context::new().with_remote_span_context(sc)
}

/// One `outbox.publish` span per event of a publish call that carries a trace context.
pub(crate) struct PublishSpans(Vec<Option<Context>>);

impl PublishSpans {
    /// `tag_source`: the relay's `rocketmq.tag.source`, with which the span names the tag the
    /// message is sent with ([`wire::tag`]), whether the row sets one or not.
    pub(crate) fn start(events: &[OutboundEvent], tag_source: TagSource) -> PublishSpans {
        if !events.iter().any(|e| e.headers.contains_key(wire::TRACEPARENT)) {
            return PublishSpans(Vec::new());
        }
        let tracer = global::tracer(SCOPE);
        let n = events.len() as i64;
        PublishSpans(
            events
                .iter()
                .map(|e| {
                    let (tp, ts) = context_of(&e.headers)?;
                    let cx = parent(&tp, ts);
                    let mut attributes = vec![
                        KeyValue::new("messaging.system", "rocketmq"),
                        KeyValue::new("messaging.operation.type", "send"),
                        KeyValue::new("messaging.operation.name", "publish"),
                        KeyValue::new("messaging.destination.name", e.topic.clone()),
                        KeyValue::new("messaging.batch.message_count", n),
                        KeyValue::new("outbox.event.id", e.id as i64),
                        KeyValue::new("outbox.event.key", e.key.clone()),
                        KeyValue::new("outbox.attempt", i64::from(e.attempt) + 1),
                    ];
                    let by_event_type = tag_source == TagSource::EventType;
                    if let Some(tag) = wire::tag(e.tag.as_deref(), &e.event_type, by_event_type) {
                        attributes.push(KeyValue::new("messaging.rocketmq.message.tag", tag.to_string()));
                    }
                    let span = tracer
                        .span_builder("outbox.publish")
                        .with_kind(SpanKind::Producer)
                        .with_attributes(attributes)
                        .start_with_context(&tracer, &cx);
                    Some(cx.with_span(span))
                })
                .collect(),
        )
    }

    /// Ends each span with its event's outcome.
    pub(crate) fn end(self, outcomes: &[SendOutcome]) {
        for (cx, outcome) in self.0.into_iter().zip(outcomes) {
            let Some(cx) = cx else { continue };
            let span = cx.span();
            match outcome {
                SendOutcome::Sent { msg_id } => {
                    if let Some(id) = msg_id {
                        span.set_attribute(KeyValue::new("messaging.message.id", id.clone()));
                    }
                    span.set_status(Status::Ok);
                }
                SendOutcome::Failed(e) => {
                    span.set_attribute(KeyValue::new("outbox.failure", format!("{:?}", e.kind)));
                    span.set_status(Status::error(e.message.clone()));
                }
            }
            span.end();
        }
    }
}

/// One `outbox.process` span per message of a handling attempt that carries a trace context.
pub(crate) struct ProcessSpans(Vec<Option<Context>>);

impl ProcessSpans {
    /// `messages`: each message's properties and topic, in order.
    pub(crate) fn start<'a>(
        messages: impl Iterator<Item = (&'a BTreeMap<String, String>, &'a str)>,
        group: &str,
    ) -> ProcessSpans {
        let messages: Vec<_> = messages.collect();
        if !messages.iter().any(|(p, _)| p.contains_key(wire::TRACEPARENT)) {
            return ProcessSpans(Vec::new());
        }
        let tracer = global::tracer(SCOPE);
        let n = messages.len() as i64;
        ProcessSpans(
            messages
                .into_iter()
                .map(|(props, topic)| {
                    let (tp, ts) = context_of(props)?;
                    let cx = parent(&tp, ts);
                    let mut attributes = vec![
                        KeyValue::new("messaging.system", "rocketmq"),
                        KeyValue::new("messaging.operation.type", "process"),
                        KeyValue::new("messaging.destination.name", topic.to_string()),
                        KeyValue::new("messaging.consumer.group.name", group.to_string()),
                        KeyValue::new("messaging.batch.message_count", n),
                    ];
                    if let Some(key) = props.get(wire::EVENT_KEY) {
                        attributes.push(KeyValue::new("outbox.event.key", key.clone()));
                    }
                    let span = tracer
                        .span_builder("outbox.process")
                        .with_kind(SpanKind::Consumer)
                        .with_attributes(attributes)
                        .start_with_context(&tracer, &cx);
                    Some(cx.with_span(span))
                })
                .collect(),
        )
    }

    /// The inbox's answer for message `i`: a new key (the handler runs) or a duplicate.
    pub(crate) fn inbox(&self, i: usize, new: bool) {
        if let Some(Some(cx)) = self.0.get(i) {
            cx.span().set_attribute(KeyValue::new(
                "outbox.inbox.outcome",
                if new { "new" } else { "duplicate" },
            ));
        }
    }

    /// Makes message `i`'s span the current context while its handler runs (the handler's own
    /// spans become its children).
    pub(crate) fn enter(&self, i: usize) -> Option<ContextGuard> {
        self.0.get(i)?.as_ref().map(|cx| cx.clone().attach())
    }

    /// Ends every span with how the attempt ended.
    pub(crate) fn end(self, how: Handled<'_>) {
        for cx in self.0.into_iter().flatten() {
            let span = cx.span();
            let (result, status) = match how {
                Handled::Committed => ("committed", Status::Ok),
                Handled::Transient(e) => ("transient", Status::error(e.to_string())),
                Handled::Failed(e) => ("failed", Status::error(e.to_string())),
                Handled::BatchRetried(e) => ("batch handled again one at a time", Status::error(e.to_string())),
            };
            span.set_attribute(KeyValue::new("outbox.handler.result", result));
            span.set_status(status);
            span.end();
        }
    }
}
