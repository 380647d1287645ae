//! Re-emitting sent events by filter (`outbox::reemit`): each filter selects its events, copies
//! keep the event key and say they are re-emits, a job stopped in the middle resumes without
//! copying an event twice, one runner at a time, and bad input refused naming the value.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mysql::prelude::Queryable;

use crate::support::{start_relay, wait_until, Recorder, TestDb};
use outbox::admin::TimeBound;
use outbox::reemit::{self, JobState, ReemitFilter, RunEnd};
use outbox::NewEvent;

const LONG: Duration = Duration::from_secs(60);

/// `n` sent events (SUCCESS, with an event key) of `biz_no` `B-<i % keys>`, type `T<i % 2>`,
/// topic `TOPIC_A` for even `i` and none (the default topic) for odd `i`; returns their ids.
fn sent(db: &TestDb, n: usize, keys: usize) -> Vec<u64> {
    let events: Vec<NewEvent> = (0..n)
        .map(|i| {
            let e = NewEvent::new(
                format!("B-{}", i % keys),
                format!("T{}", i % 2),
                format!("{{\"i\":{i}}}"),
            );
            if i % 2 == 0 {
                e.with_topic("TOPIC_A")
            } else {
                e
            }
        })
        .collect();
    let ids = db.enqueue(&events);
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SUCCESS', event_key = UUID(), sent_at = NOW(3)")
        .unwrap();
    ids
}

fn filter() -> ReemitFilter {
    ReemitFilter::default()
}

fn preview(db: &TestDb, f: &ReemitFilter) -> reemit::Preview {
    reemit::preview(&db.pool, "t_event_record", "ORDER_EVENT_TOPIC", f).unwrap()
}

fn matched(db: &TestDb, f: &ReemitFilter) -> u64 {
    preview(db, f).matched
}

/// Runs job `id` of the test table as `runner` to its end (no stop flag, no progress).
fn run_to_end(db: &TestDb, id: u64, runner: &str) -> outbox::Result<(reemit::Job, RunEnd)> {
    reemit::run(&db.pool, "t_event_record", id, runner, &AtomicBool::new(false), |_| {})
}

/// Copies in the table: original id → (copies, all keys equal to the original's).
fn copies(db: &TestDb) -> HashMap<u64, (usize, bool)> {
    let rows: Vec<(u64, String, String)> = db
        .conn()
        .query(
            "SELECT CAST(JSON_VALUE(c.headers, '$.reemitOf') AS UNSIGNED), c.event_key, o.event_key FROM t_event_record c \
             JOIN t_event_record o ON o.id = JSON_VALUE(c.headers, '$.reemitOf') WHERE c.headers LIKE '%reemitOf%'",
        )
        .unwrap();
    let mut m: HashMap<u64, (usize, bool)> = HashMap::new();
    for (of, ck, ok) in rows {
        let e = m.entry(of).or_insert((0, true));
        e.0 += 1;
        e.1 &= ck == ok;
    }
    m
}

#[test]
fn each_filter_selects_its_sent_events_and_the_copies_keep_the_key_and_say_they_are_reemits() {
    let db = TestDb::new("reemit_filters");
    let ids = sent(&db, 40, 4);
    // Ten of them were written two days ago; one row is still pending (never selected).
    db.conn()
        .query_drop(format!(
            "UPDATE t_event_record SET create_time = NOW(3) - INTERVAL 2 DAY WHERE id <= {}",
            ids[9]
        ))
        .unwrap();
    db.enqueue(&[NewEvent::new("B-0", "T0", "pending")]);
    assert_eq!(matched(&db, &filter()), 40);
    let by_type = ReemitFilter {
        event_type: Some("T1".into()),
        ..filter()
    };
    assert_eq!(matched(&db, &by_type), 20);
    let default_topic = ReemitFilter {
        topic: Some("ORDER_EVENT_TOPIC".into()),
        ..filter()
    };
    assert_eq!(
        matched(&db, &default_topic),
        20,
        "rows without a topic go to the default one"
    );
    let topic_a = ReemitFilter {
        topic: Some("TOPIC_A".into()),
        ..filter()
    };
    assert_eq!(matched(&db, &topic_a), 20);
    let by_key = ReemitFilter {
        biz_no: Some("B-1".into()),
        ..filter()
    };
    assert_eq!(matched(&db, &by_key), 10);
    let recent = ReemitFilter {
        since: Some(TimeBound::Ago(Duration::from_secs(86_400))),
        ..filter()
    };
    assert_eq!(matched(&db, &recent), 30);
    let old = ReemitFilter {
        until: Some(TimeBound::Ago(Duration::from_secs(86_400))),
        ..filter()
    };
    assert_eq!(matched(&db, &old), 10);
    let combined = ReemitFilter {
        event_type: Some("T0".into()),
        biz_no: Some("B-2".into()),
        since: Some(TimeBound::Ago(Duration::from_secs(86_400))),
        ..filter()
    };
    let p = preview(&db, &combined);
    // B-2 is i = 2, 6, 10, ... (all T0); i < 10 were written two days ago: 10, 14, ..., 38.
    assert_eq!(p.matched, 8);
    assert_eq!(p.oldest_kept.as_ref().map(|k| k.0), Some(ids[0]));

    // Re-emit type T1, then send the copies with a relay.
    let job = reemit::create(&db.pool, &preview(&db, &by_type), 1000, "tester").unwrap();
    assert_eq!((job.state, job.matched, job.emitted), (JobState::Stopped, 20, 0));
    let (job, end) = run_to_end(&db, job.id, "runner-1").unwrap();
    assert_eq!((end, job.state, job.emitted), (RunEnd::Done, JobState::Done, 20));
    let c = copies(&db);
    assert_eq!(c.len(), 20);
    assert!(c.values().all(|(n, same_key)| *n == 1 && *same_key));
    let rec = Recorder::new();
    let relay = start_relay(&db.config(), "reemit-1-000001", &rec);
    assert!(wait_until(LONG, || db.pending() == 0));
    relay.stop(Duration::from_secs(10));
    let reemits: Vec<_> = rec
        .sent_events
        .lock()
        .iter()
        .filter(|e| e.headers.contains_key(outbox::wire::REEMIT_OF))
        .cloned()
        .collect();
    assert_eq!(reemits.len(), 20);
    for e in &reemits {
        assert_eq!(e.event_type, "T1");
        assert_eq!(e.headers[outbox::wire::REEMIT_JOB], job.id.to_string());
        let of: u64 = e.headers[outbox::wire::REEMIT_OF].parse().unwrap();
        assert!(ids.contains(&of) && of != e.id, "a copy names its original");
        let key: String = db
            .conn()
            .query_first(format!("SELECT event_key FROM t_event_record WHERE id = {of}"))
            .unwrap()
            .unwrap();
        assert_eq!(e.key, key, "the copy goes out under the original's event key");
    }
    // The copies are sent now too, but a re-emit never selects a copy.
    assert_eq!(matched(&db, &by_type), 20);
    // Started and ended, audited.
    let audits: Vec<(String, String)> = db
        .conn()
        .query("SELECT action, actor FROM outbox_audit ORDER BY id")
        .unwrap();
    assert_eq!(
        audits,
        vec![
            ("reemit".to_string(), "tester".to_string()),
            ("reemit-run".to_string(), "runner-1".to_string()),
            ("reemit-done".to_string(), "runner-1".to_string())
        ]
    );
}

#[test]
fn a_job_stopped_in_the_middle_resumes_where_it_stopped_and_copies_each_event_once() {
    let db = TestDb::new("reemit_resume");
    let ids = sent(&db, 3000, 50);
    let p = preview(&db, &filter());
    let job = reemit::create(&db.pool, &p, 20_000, "tester").unwrap();
    // Stopped by its runner's flag once 1000 are out (a signal in `outboxd`).
    let stop = AtomicBool::new(false);
    let (j, end) = reemit::run(&db.pool, "t_event_record", job.id, "runner-a", &stop, |j| {
        if j.emitted >= 1000 {
            stop.store(true, Ordering::SeqCst);
        }
    })
    .unwrap();
    assert_eq!((end, j.state), (RunEnd::Stopped, JobState::Stopped));
    assert!(j.emitted >= 1000 && j.emitted < 3000, "{}", j.emitted);
    assert_eq!(
        copies(&db).len() as u64,
        j.emitted,
        "the position is committed with its copies"
    );
    // Stopped from elsewhere while it runs: the runner ends after its batch.
    let (j, end) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            reemit::run(
                &db.pool,
                "t_event_record",
                job.id,
                "runner-b",
                &AtomicBool::new(false),
                |j| {
                    if j.emitted >= 2000 {
                        // Once past 2000: stop it the way the console and `--stop` do, then go on
                        // writing until the runner notices.
                        let _ = reemit::stop(&db.pool, "t_event_record", j.id, "operator");
                    }
                },
            )
            .unwrap()
        });
        h.join().unwrap()
    });
    assert_eq!((end, j.state), (RunEnd::TakenAway, JobState::Stopped));
    assert_eq!(copies(&db).len() as u64, j.emitted);
    // A runner that died holding it: another takes it over once its heartbeat is stale, not
    // before.
    db.conn()
        .query_drop(format!(
            "UPDATE outbox_reemit SET state = 'RUNNING', runner = 'dead-runner', heartbeat = NOW(3) WHERE id = {}",
            job.id
        ))
        .unwrap();
    let err = run_to_end(&db, job.id, "runner-c").unwrap_err();
    assert!(err.to_string().contains("is being run by dead-runner"), "{err}");
    db.conn()
        .query_drop(format!(
            "UPDATE outbox_reemit SET heartbeat = NOW(3) - INTERVAL 31 SECOND WHERE id = {}",
            job.id
        ))
        .unwrap();
    let (j, end) = run_to_end(&db, job.id, "runner-c").unwrap();
    assert_eq!((end, j.state, j.emitted), (RunEnd::Done, JobState::Done, 3000));
    let c = copies(&db);
    assert_eq!(c.len(), ids.len(), "every event re-emitted");
    assert!(c.values().all(|(n, same)| *n == 1 && *same), "none twice");
    let err = run_to_end(&db, job.id, "runner-d").unwrap_err();
    assert!(err.to_string().contains("is done: it emitted 3000 of 3000"), "{err}");
}

#[test]
fn a_job_keeps_to_its_rate() {
    let db = TestDb::new("reemit_rate");
    sent(&db, 600, 10);
    let p = preview(&db, &filter());
    let job = reemit::create(&db.pool, &p, 1000, "tester").unwrap();
    let started = std::time::Instant::now();
    let (j, _) = run_to_end(&db, job.id, "r").unwrap();
    assert_eq!(j.emitted, 600);
    // 600 events at 1000/s: the last batch of 100 may leave at once, the ones before it not
    // before their time.
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn bad_input_is_refused_naming_the_value_and_changes_nothing() {
    let db = TestDb::new("reemit_bad");
    sent(&db, 10, 2);
    let err = |f: ReemitFilter| {
        reemit::preview(&db.pool, "t_event_record", "ORDER_EVENT_TOPIC", &f)
            .unwrap_err()
            .to_string()
    };
    let e = err(ReemitFilter {
        since: Some(TimeBound::Ago(Duration::from_secs(60))),
        until: Some(TimeBound::Ago(Duration::from_secs(3600))),
        ..filter()
    });
    assert!(e.contains("until") && e.contains("is not after since"), "{e}");
    let e = err(ReemitFilter {
        since: Some(TimeBound::At("2026-13-45 99:00:00".into())),
        ..filter()
    });
    assert!(e.contains("since") && e.contains("2026-13-45 99:00:00"), "{e}");
    let e = err(ReemitFilter {
        event_type: Some(" ".into()),
        ..filter()
    });
    assert!(e.contains("event_type"), "{e}");
    let p = preview(&db, &filter());
    for rate in [0, reemit::MAX_RATE + 1] {
        let e = reemit::create(&db.pool, &p, rate, "tester").unwrap_err().to_string();
        assert!(e.contains("rate") && e.contains(&rate.to_string()), "{e}");
    }
    let e = run_to_end(&db, 4242, "r").unwrap_err().to_string();
    assert!(e.contains("4242 is not a re-emit job of t_event_record"), "{e}");
    let e = reemit::stop(&db.pool, "t_event_record", 4242, "r")
        .unwrap_err()
        .to_string();
    assert!(e.contains("4242"), "{e}");
    let e = reemit::forget(
        &db.pool,
        &p.selection,
        &db.pool,
        "outbox_inbox",
        "bad group!",
        "r",
        false,
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("consumer_group") && e.contains("bad group!"), "{e}");
    let n: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM t_event_record")
        .unwrap()
        .unwrap();
    assert_eq!(n, 10, "nothing written");
    let jobs: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_reemit")
        .unwrap()
        .unwrap();
    assert_eq!(jobs, 0);
}

/// Against the broker: a consumer group's inbox takes the re-emitted events for the ones it
/// already credited, until `forget` deletes the group's marks; then the next re-emit is credited
/// once more, and every copy said it was a re-emit.
#[cfg(feature = "rocketmq")]
#[test]
fn an_inbox_takes_a_re_emit_for_a_duplicate_until_the_group_forgets_the_events() {
    use std::sync::Arc;

    use crate::rocketmq_e2e::{ensure_broker, unique, BROKER_LOCK};
    use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message};
    use outbox::rocketmq::{RocketMqPublisher, RocketMqSource, SourceConfig};
    use outbox::Relay;

    const NAMESRV: &str = "127.0.0.1:9876";
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("reemit_inbox");
    db.conn()
        .query_drop("CREATE TABLE credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64), event_key VARCHAR(64), reemit_of VARCHAR(32) NULL)")
        .unwrap();
    let topic = unique("outbox_reemit");
    let group = unique("points");
    let mut cfg = db.config();
    cfg.topic = topic.clone();
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.rocketmq.producer_group = unique("outbox_reemit_p");
    let n = 20u64;
    let events: Vec<NewEvent> = (0..n)
        .map(|i| NewEvent::new(format!("ORD-{i}"), "ORDER_PAID", "{}"))
        .collect();
    db.enqueue(&events);
    let relay = Relay::builder(cfg.clone())
        .publisher(Arc::new(RocketMqPublisher::start(&cfg).unwrap()))
        .start()
        .unwrap();
    let credit = |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        tx.exec_drop(
            "INSERT INTO credits (biz_no, event_key, reemit_of) VALUES (?, ?, ?)",
            (
                m.biz_no().unwrap_or_default(),
                &m.key,
                m.properties.get(outbox::wire::REEMIT_OF),
            ),
        )?;
        Ok(())
    };
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, &topic, &group)).unwrap();
    let consumer = Consumer::start(
        ConsumerConfig::new(&group),
        db.pool.clone(),
        Arc::new(src),
        Arc::new(credit),
    )
    .unwrap();
    let count = |sql: &str| -> u64 { db.conn().query_first(sql).unwrap().unwrap() };
    assert!(wait_until(LONG, || count("SELECT COUNT(*) FROM credits") == n));

    let reemit_all = || {
        let p = reemit::preview(&db.pool, "t_event_record", &topic, &filter()).unwrap();
        assert_eq!(p.matched, n, "the originals, never the copies");
        let job = reemit::create(&db.pool, &p, 1000, "tester").unwrap();
        let (j, end) = run_to_end(&db, job.id, "runner").unwrap();
        assert_eq!((end, j.emitted), (RunEnd::Done, n));
        job.id
    };
    // Re-emitted: sent and consumed, each a duplicate for the group's inbox.
    let first = reemit_all();
    assert!(wait_until(LONG, || db.pending() == 0));
    assert!(
        wait_until(LONG, || consumer.stats().duplicates == n),
        "{:?}",
        consumer.stats()
    );
    assert_eq!(count("SELECT COUNT(*) FROM credits"), n, "no second credit");

    // The group forgets them (dry run first: counts, changes nothing), and the next re-emit is
    // credited again: once per event.
    let p = reemit::preview(&db.pool, "t_event_record", &topic, &filter()).unwrap();
    let dry = reemit::forget(
        &db.pool,
        &p.selection,
        &db.pool,
        "outbox_inbox",
        &group,
        "tester",
        true,
        |_, _| {},
    )
    .unwrap();
    assert_eq!((dry.events, dry.forgotten), (n, n));
    assert_eq!(count("SELECT COUNT(*) FROM outbox_inbox"), n);
    let job = reemit::job(&db.pool, first).unwrap().unwrap();
    let done = reemit::forget(
        &db.pool,
        &job.selection,
        &db.pool,
        "outbox_inbox",
        &group,
        "tester",
        false,
        |_, _| {},
    )
    .unwrap();
    assert_eq!((done.events, done.forgotten), (n, n));
    assert_eq!(count("SELECT COUNT(*) FROM outbox_inbox"), 0);
    let second = reemit_all();
    assert!(wait_until(LONG, || count("SELECT COUNT(*) FROM credits") == 2 * n));
    relay.stop(Duration::from_secs(10));
    let stats = consumer.stop();
    assert_eq!(stats.processed, 2 * n);
    assert_eq!(
        count("SELECT COUNT(DISTINCT event_key) FROM credits"),
        n,
        "the same events, by key"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM credits WHERE reemit_of IS NOT NULL"),
        n,
        "the second credit of each came from a re-emit"
    );
    let audited: Vec<String> = db
        .conn()
        .query("SELECT action FROM outbox_audit WHERE action = 'inbox-forget'")
        .unwrap();
    assert_eq!(audited.len(), 1, "the forget is audited, the dry run is not");
    assert!(second > first);
}

#[test]
fn two_runs_of_one_job_under_one_name_copy_each_event_once() {
    // A resume sent twice (a double click) starts two runs that share a runner's name: each
    // batch moves the job on only from the position its run read, so no batch is copied twice.
    let db = TestDb::new("reemit_twice");
    let ids = sent(&db, 2000, 20);
    let p = preview(&db, &filter());
    let job = reemit::create(&db.pool, &p, 5_000, "tester").unwrap();
    let ends: Vec<RunEnd> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| run_to_end(&db, job.id, "same-runner").map(|(_, end)| end)))
            .collect();
        runs.into_iter().filter_map(|h| h.join().unwrap().ok()).collect()
    });
    assert!(ends.contains(&RunEnd::Done), "{ends:?}");
    let c = copies(&db);
    assert_eq!(c.len(), ids.len());
    assert!(c.values().all(|(n, _)| *n == 1), "an event copied twice");
    let j = reemit::job(&db.pool, job.id).unwrap().unwrap();
    assert_eq!((j.state, j.emitted), (JobState::Done, 2000));
}
