//! One trace from order to credit (docs/tracing.md): the producer's W3C trace context, set at
//! enqueue (or captured from the current span), is stored with the row, sent unchanged, and is
//! the parent of every `outbox.publish` attempt and of the consumer's `outbox.process`, across a
//! refused first attempt, a reclaim and a dead-letter replay. Spans are collected by a span
//! processor of the test's own on OpenTelemetry's global provider; each test looks only at the
//! traces it made.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mysql::prelude::Queryable;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
use parking_lot::Mutex;

use crate::consumer::{config, credit, order_message, points_table, MemSource};
use crate::support::{wait_until, Fault, Recorder, TestDb};
use outbox::admin::{self, BatchOptions, DeadLetterAction, DeadLetterFilter};
use outbox::consumer::{Consumer, HandlerError, Message};
use outbox::trace::TraceParent;
use outbox::{NewEvent, Relay, SendError};

const LONG: Duration = Duration::from_secs(30);

/// Every span ended in this process.
#[derive(Debug, Default)]
struct Collect(Mutex<Vec<SpanData>>);

impl SpanProcessor for Collect {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}
    fn on_end(&self, span: SpanData) {
        self.0.lock().push(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The collected spans (installed once, for the whole test binary).
fn spans() -> &'static Arc<Collect> {
    static SPANS: OnceLock<Arc<Collect>> = OnceLock::new();
    SPANS.get_or_init(|| {
        let collect = Arc::new(Collect::default());
        struct Shared(Arc<Collect>);
        impl std::fmt::Debug for Shared {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Shared")
            }
        }
        impl SpanProcessor for Shared {
            fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
                self.0.on_start(span, cx)
            }
            fn on_end(&self, span: SpanData) {
                self.0.on_end(span)
            }
            fn force_flush(&self) -> OTelSdkResult {
                Ok(())
            }
            fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
                Ok(())
            }
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Shared(collect.clone()))
            .build();
        global::set_tracer_provider(provider);
        collect
    })
}

/// A fresh sampled `traceparent` of the test's own.
fn new_traceparent() -> TraceParent {
    TraceParent {
        version: 0,
        trace_id: rand::random(),
        parent_id: rand::random(),
        flags: 1,
    }
}

/// The spans named `name` of the trace of `tp`, in the order they ended.
fn spans_of(tp: &TraceParent, name: &str) -> Vec<SpanData> {
    spans()
        .0
        .lock()
        .iter()
        .filter(|s| s.span_context.trace_id().to_bytes() == tp.trace_id && s.name == name)
        .cloned()
        .collect()
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The span is a child of the producer's context (same trace, its parent the producer's span).
fn assert_child_of(span: &SpanData, tp: &TraceParent) {
    assert_eq!(span.span_context.trace_id().to_bytes(), tp.trace_id, "{span:?}");
    assert_eq!(span.parent_span_id.to_bytes(), tp.parent_id, "{span:?}");
    assert!(
        span.parent_span_is_remote,
        "the parent is the producer's, from the row: {span:?}"
    );
}

#[test]
fn every_publish_attempt_is_a_child_of_the_stored_context_across_a_refusal_a_reclaim_and_a_replay() {
    spans();
    let db = TestDb::new("trace_publish");
    let (refused, reclaimed, replayed) = (new_traceparent(), new_traceparent(), new_traceparent());
    let mut ids = Vec::new();
    {
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        for (i, tp) in [&refused, &reclaimed, &replayed].iter().enumerate() {
            let e = NewEvent::new(format!("ORD-{i}"), "ORDER_PAID", "{}")
                .with_trace_context(tp.to_header(), Some("vendor=opaque".into()));
            ids.push(outbox::enqueue_in_tx(&mut tx, &e).unwrap());
        }
        tx.commit().unwrap();
    }
    // The second row was claimed by an instance that died: its lease ran out an hour ago.
    db.conn()
        .exec_drop(
            "UPDATE t_event_record SET status = 'SENDING', claim_owner = 'dead-instance', claim_token = 7, \
             claimed_at = NOW(3) - INTERVAL 1 HOUR WHERE id = ?",
            (ids[1],),
        )
        .unwrap();
    let rec = Recorder::with_faults(vec![
        Fault::Fail {
            id: ids[0],
            error: SendError::rejected("broker refused: try again"),
            times: 1,
        },
        Fault::Fail {
            id: ids[2],
            error: SendError::rejected("broker refused for good"),
            times: 2,
        },
    ]);
    let mut cfg = db.config();
    cfg.max_retry = 1;
    cfg.set("backoff.policy", "fixed").unwrap();
    cfg.set("backoff.base.ms", "50").unwrap();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    assert!(wait_until(LONG, || rec.sends_of(ids[0]) == 1 && rec.sends_of(ids[1]) == 1));
    assert!(wait_until(LONG, || db.count("FAIL") == 1), "{:?}", db.rows());
    admin::act_on_dead_letters(
        &db.pool,
        "t_event_record",
        &DeadLetterFilter {
            ids: vec![ids[2]],
            ..DeadLetterFilter::default()
        },
        DeadLetterAction::Replay,
        &BatchOptions {
            dry_run: false,
            batch: 10,
            rate_per_sec: 0,
            actor: "alice".into(),
        },
        |_, _| {},
    )
    .unwrap();
    assert!(wait_until(LONG, || rec.sends_of(ids[2]) == 1));
    relay.stop(Duration::from_secs(5));

    // The refused first attempt and the second: siblings, both children of the stored context.
    let attempts = spans_of(&refused, "outbox.publish");
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    for s in &attempts {
        assert_child_of(s, &refused);
        assert_eq!(s.span_kind, SpanKind::Producer);
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("rocketmq"));
        assert_eq!(attr(s, "messaging.operation.type").as_deref(), Some("send"));
        assert_eq!(attr(s, "outbox.event.id"), Some(ids[0].to_string()));
    }
    assert!(
        matches!(attempts[0].status, Status::Error { .. }),
        "{:?}",
        attempts[0].status
    );
    assert_eq!(attempts[1].status, Status::Ok);
    assert_eq!(
        (
            attr(&attempts[0], "outbox.attempt"),
            attr(&attempts[1], "outbox.attempt")
        ),
        (Some("1".into()), Some("2".into()))
    );
    // The reclaimed row: its one send, still under the producer's context.
    let after_reclaim = spans_of(&reclaimed, "outbox.publish");
    assert_eq!(after_reclaim.len(), 1, "{after_reclaim:#?}");
    assert_child_of(&after_reclaim[0], &reclaimed);
    // The dead letter: two failed attempts, then the replayed send, all under the same parent.
    let replay = spans_of(&replayed, "outbox.publish");
    assert_eq!(replay.len(), 3, "{replay:#?}");
    replay.iter().for_each(|s| assert_child_of(s, &replayed));
    assert_eq!(replay[2].status, Status::Ok);
    // And the context left unchanged on every message.
    for (id, tp) in ids.iter().zip([&refused, &reclaimed, &replayed]) {
        let sent = rec.sent_events.lock();
        let e = sent.iter().find(|e| e.id == *id).unwrap();
        assert_eq!(e.headers.get("traceparent"), Some(&tp.to_header()));
        assert_eq!(e.headers.get("tracestate").map(String::as_str), Some("vendor=opaque"));
    }
}

#[test]
fn an_event_written_inside_a_span_carries_that_span_s_context() {
    spans();
    let db = TestDb::new("trace_capture");
    let tracer = global::tracer("order-service");
    let span = tracer.start("POST /orders");
    let expected = span.span_context().clone();
    let cx = Context::current_with_span(span);
    let id = {
        let _current = cx.clone().attach();
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let id = outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_PAID", "{}")).unwrap();
        tx.commit().unwrap();
        id
    };
    cx.span().end();
    let headers: String = db
        .conn()
        .exec_first("SELECT headers FROM t_event_record WHERE id = ?", (id,))
        .unwrap()
        .unwrap();
    let headers: BTreeMap<String, String> = serde_json::from_str(&headers).unwrap();
    let tp = TraceParent::parse(&headers["traceparent"]).unwrap();
    assert_eq!(tp.trace_id, expected.trace_id().to_bytes());
    assert_eq!(tp.parent_id, expected.span_id().to_bytes());
    // An explicit context wins over the current one.
    let given = new_traceparent();
    let _current = cx.attach();
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let e = NewEvent::new("ORD-2", "ORDER_PAID", "{}").with_trace_context(given.to_header(), None);
    let id = outbox::enqueue_in_tx(&mut tx, &e).unwrap();
    tx.commit().unwrap();
    let stored: String = db
        .conn()
        .exec_first("SELECT headers FROM t_event_record WHERE id = ?", (id,))
        .unwrap()
        .unwrap();
    assert!(stored.contains(&given.to_header()), "{stored}");
}

/// Writes `events` in one transaction; their ids.
fn enqueue(db: &TestDb, events: &[NewEvent]) -> Vec<u64> {
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let ids = events
        .iter()
        .map(|e| outbox::enqueue_in_tx(&mut tx, e).unwrap())
        .collect();
    tx.commit().unwrap();
    ids
}

#[test]
fn the_publish_span_carries_the_tag_the_message_is_sent_with() {
    spans();
    let db = TestDb::new("trace_tag");
    let (untagged, tagged, untagged_none) = (new_traceparent(), new_traceparent(), new_traceparent());
    let ids = enqueue(
        &db,
        &[
            NewEvent::new("ORD-1", "ORDER_PAID", "{}").with_trace_context(untagged.to_header(), None),
            NewEvent::new("ORD-2", "ORDER_PAID", "{}")
                .with_tag("VIP")
                .with_trace_context(tagged.to_header(), None),
        ],
    );
    // rocketmq.tag.source = event-type (the default): an untagged event is sent tagged with its
    // event type, and its span says so; a row's own tag wins.
    let rec = Recorder::new();
    let relay = Relay::start(db.config(), rec.clone()).unwrap();
    assert!(wait_until(LONG, || ids.iter().all(|id| rec.sends_of(*id) == 1)));
    relay.stop(Duration::from_secs(5));
    let tag = |tp: &TraceParent| {
        let publish = spans_of(tp, "outbox.publish");
        assert_eq!(publish.len(), 1, "{publish:#?}");
        attr(&publish[0], "messaging.rocketmq.message.tag")
    };
    assert_eq!(tag(&untagged).as_deref(), Some("ORDER_PAID"));
    assert_eq!(tag(&tagged).as_deref(), Some("VIP"));

    // rocketmq.tag.source = none: an untagged event is sent without a tag, and its span has none.
    let id = enqueue(
        &db,
        &[NewEvent::new("ORD-3", "ORDER_PAID", "{}").with_trace_context(untagged_none.to_header(), None)],
    )[0];
    let mut cfg = db.config();
    cfg.set("rocketmq.tag.source", "none").unwrap();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    assert!(wait_until(LONG, || rec.sends_of(id) == 1));
    relay.stop(Duration::from_secs(5));
    assert_eq!(tag(&untagged_none), None);
}

#[test]
fn an_unsampled_context_gets_no_recorded_span_and_travels_unchanged() {
    spans();
    let db = TestDb::new("trace_unsampled");
    points_table(&db);
    let unsampled = TraceParent {
        flags: 0,
        ..new_traceparent()
    };
    let id = enqueue(
        &db,
        &[NewEvent::new("ORD-1", "ORDER_PAID", "{}").with_trace_context(unsampled.to_header(), None)],
    )[0];
    let rec = Recorder::new();
    let relay = Relay::start(db.config(), rec.clone()).unwrap();
    assert!(wait_until(LONG, || rec.sends_of(id) == 1));
    relay.stop(Duration::from_secs(5));
    // Sent with the context as stored, flags 00 included.
    let sent = rec.sent_events.lock().iter().find(|e| e.id == id).cloned().unwrap();
    assert_eq!(sent.headers.get("traceparent"), Some(&unsampled.to_header()));
    assert!(unsampled.to_header().ends_with("-00"));

    // The consumer sees it, and handles the message without a recorded span either.
    let source = MemSource::with(vec![traced(0, 1, "k-1", "ORD-1", &unsampled)]);
    let consumer = Consumer::start(config("points"), db.pool.clone(), source, Arc::new(credit)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 1));
    consumer.stop();

    // OpenTelemetry's default sampler follows the parent: an unsampled parent, no span recorded
    // (docs/tracing.md, "Unsampled contexts get no exported span").
    assert!(spans_of(&unsampled, "outbox.publish").is_empty());
    assert!(spans_of(&unsampled, "outbox.process").is_empty());
}

fn traced(q: u32, offset: u64, key: &str, order: &str, tp: &TraceParent) -> Message {
    let mut m = order_message(q, offset, key, order, 10);
    m.properties.insert("traceparent".into(), tp.to_header());
    m.properties.insert("eventCreatedAt".into(), "1764900000000".into());
    m
}

#[test]
fn the_consumer_s_process_span_is_a_child_of_the_message_s_context_with_the_inbox_outcome() {
    spans();
    let db = TestDb::new("trace_process");
    points_table(&db);
    let (first, copy_of_first, failing) = (new_traceparent(), new_traceparent(), new_traceparent());
    // A message, a copy of it (same key: a duplicate, with a context of its own), and a message
    // whose handler fails once. On one queue, in this order.
    let source = MemSource::with(vec![
        traced(0, 1, "k-1", "ORD-1", &first),
        traced(0, 2, "k-1", "ORD-1", &copy_of_first),
        traced(0, 3, "k-3", "ORD-3", &failing),
    ]);
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = failed_once.clone();
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        // The handler's own span is a child of the current outbox.process span.
        let tracer = global::tracer("points-service");
        let mut span = tracer.start("credit points");
        span.set_attribute(KeyValue::new("order", m.biz_no().unwrap_or_default().to_string()));
        span.end();
        if m.key == "k-3" && !f.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err("the loyalty service is down".into());
        }
        credit(tx, m)
    };
    let mut c = config("points");
    c.batch_max = 1;
    let consumer = Consumer::start(c, db.pool.clone(), source, Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 2
        && consumer.stats().duplicates == 1));
    let stats = consumer.stop();
    assert_eq!(stats.credited.count, 2, "commit -> credited of each processed message");

    let process = spans_of(&first, "outbox.process");
    assert_eq!(process.len(), 1, "{process:#?}");
    assert_child_of(&process[0], &first);
    assert_eq!(process[0].span_kind, SpanKind::Consumer);
    assert_eq!(attr(&process[0], "outbox.inbox.outcome").as_deref(), Some("new"));
    assert_eq!(
        attr(&process[0], "messaging.consumer.group.name").as_deref(),
        Some("points")
    );
    assert_eq!(
        attr(&process[0], "messaging.operation.type").as_deref(),
        Some("process")
    );
    let inner = spans_of(&first, "credit points");
    assert_eq!(inner.len(), 1);
    assert_eq!(inner[0].parent_span_id, process[0].span_context.span_id());

    let dup = spans_of(&copy_of_first, "outbox.process");
    assert_eq!(dup.len(), 1);
    assert_eq!(attr(&dup[0], "outbox.inbox.outcome").as_deref(), Some("duplicate"));
    assert!(
        spans_of(&copy_of_first, "credit points").is_empty(),
        "a duplicate runs no handler"
    );

    // The failing message: a failed attempt, then the committed one, siblings under its context.
    let attempts = spans_of(&failing, "outbox.process");
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    attempts.iter().for_each(|s| assert_child_of(s, &failing));
    assert!(matches!(attempts[0].status, Status::Error { .. }));
    assert_eq!(attr(&attempts[0], "outbox.handler.result").as_deref(), Some("failed"));
    assert_eq!(attempts[1].status, Status::Ok);
}

#[test]
fn a_malformed_trace_context_is_refused_naming_the_header_and_nothing_is_stored() {
    let db = TestDb::new("trace_bad");
    let good = new_traceparent().to_header();
    for (e, field, shows) in [
        (
            NewEvent::new("ORD-1", "T", "{}").with_trace_context("00-abc-def-01", None),
            "traceparent",
            "00-abc-def-01",
        ),
        (
            NewEvent::new("ORD-1", "T", "{}").with_trace_context(good.to_uppercase(), None),
            "traceparent",
            "trace id",
        ),
        (
            NewEvent::new("ORD-1", "T", "{}").with_trace_context(good.clone(), Some(format!("k={}", "v".repeat(600)))),
            "tracestate",
            "512",
        ),
        (
            NewEvent::new("ORD-1", "T", "{}").with_header("tracestate", "k=v"),
            "tracestate",
            "\"k=v\" is given without a traceparent",
        ),
        (
            NewEvent::new("ORD-1", "T", "{}").with_header("eventCreatedAt", "0"),
            "headers",
            "reserved",
        ),
    ] {
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let err = outbox::enqueue_in_tx(&mut tx, &e).unwrap_err();
        match &err {
            outbox::Error::InvalidEvent { field: f, reason } => {
                assert_eq!(*f, field, "{err}");
                assert!(reason.contains(shows), "{err}");
            }
            other => panic!("{other:?}"),
        }
        tx.commit().unwrap();
    }
    assert_eq!(db.rows().len(), 0, "nothing stored");
}

/// Relay → broker → consumer: the consumer's span is a child of the context the order service
/// set at enqueue.
#[cfg(feature = "rocketmq")]
#[test]
fn through_the_broker_the_consumer_continues_the_order_service_s_trace() {
    use outbox::consumer::ConsumerConfig;
    use outbox::rocketmq::{RocketMqPublisher, RocketMqSource, SourceConfig};

    spans();
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let db = TestDb::new("trace_e2e");
    points_table(&db);
    let topic = crate::rocketmq_e2e::unique("TRACE");
    let mut cfg = db.config();
    cfg.topic = topic.clone();
    cfg.rocketmq.namesrv = "127.0.0.1:9876".into();
    let tp = new_traceparent();
    {
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let e = NewEvent::new("ORD-1", "ORDER_PAID", "{\"order\":\"ORD-1\",\"amount\":5}")
            .with_trace_context(tp.to_header(), None);
        outbox::enqueue_in_tx(&mut tx, &e).unwrap();
        tx.commit().unwrap();
    }
    let relay = Relay::start(cfg.clone(), Arc::new(RocketMqPublisher::start(&cfg).unwrap())).unwrap();
    let group = crate::rocketmq_e2e::unique("trace_points");
    let src = RocketMqSource::start(&SourceConfig::new("127.0.0.1:9876", &topic, &group)).unwrap();
    let tag: Arc<Mutex<Option<String>>> = Arc::default();
    let seen = tag.clone();
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        *seen.lock() = m.tag.clone();
        credit(tx, m)
    };
    let consumer = Consumer::start(
        ConsumerConfig::new(&group),
        db.pool.clone(),
        Arc::new(src),
        Arc::new(handler),
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(120), || consumer.stats().processed == 1));
    let stats = consumer.stop();
    relay.stop(Duration::from_secs(5));
    assert_eq!(stats.credited.count, 1, "the message carried eventCreatedAt");
    let publish = spans_of(&tp, "outbox.publish");
    let process = spans_of(&tp, "outbox.process");
    assert_eq!((publish.len(), process.len()), (1, 1), "{publish:#?} {process:#?}");
    assert_child_of(&publish[0], &tp);
    assert_child_of(&process[0], &tp);
    assert_eq!(attr(&process[0], "messaging.destination.name"), Some(topic));
    assert!(attr(&publish[0], "messaging.message.id").is_some());
    // The span names the tag the message went out with (the event type: the row sets none).
    assert_eq!(
        attr(&publish[0], "messaging.rocketmq.message.tag"),
        tag.lock().clone(),
        "the tag the consumer received"
    );
    assert_eq!(tag.lock().as_deref(), Some("ORDER_PAID"));
}
