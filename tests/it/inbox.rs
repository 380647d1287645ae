//! The consumer inbox: claim-first marks in the consumer's own transaction, concurrent copies,
//! rollbacks, retention.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Barrier;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Pool, TxOpts};

use crate::support::{wait_until, TestDb};
use outbox::inbox::{self, Inbox, MessageMeta, Outcome};

const GROUP: &str = "points-service";

/// How long a test waits for another connection to reach a lock wait before it fails.
const BLOCK_DEADLINE: Duration = Duration::from_secs(20);

fn points_table(db: &TestDb) {
    db.conn()
        .query_drop("CREATE TABLE points (user_id VARCHAR(32) PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0)")
        .unwrap();
}

fn credit(tx: &mut mysql::Transaction<'_>, user: &str, amount: i64) -> outbox::Result<()> {
    tx.exec_drop(
        "INSERT INTO points (user_id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)",
        (user, amount),
    )?;
    Ok(())
}

fn balance(db: &TestDb, user: &str) -> i64 {
    db.conn()
        .exec_first("SELECT balance FROM points WHERE user_id = ?", (user,))
        .unwrap()
        .unwrap_or(0)
}

fn marks(db: &TestDb, table: &str) -> u64 {
    db.conn()
        .query_first(format!("SELECT COUNT(*) FROM {table}"))
        .unwrap()
        .unwrap_or(0)
}

/// Waits until every one of these connections is waiting for a row lock, up to
/// [`BLOCK_DEADLINE`]; returns whether they all were. Read from the TRANSACTIONS section of
/// `SHOW ENGINE INNODB STATUS` (a transaction block with a `LOCK WAIT` line and the connection's
/// thread id), which is live. `information_schema.INNODB_TRX` is not reliable for this: InnoDB
/// refreshes what it shows only once nobody has read it for 100 ms, so while anyone polls it (this
/// test, a test running beside it) it can keep showing a snapshot taken before the wait began.
fn wait_for_lock_waits(pool: &Pool, connection_ids: &[u32]) -> bool {
    let mut conn = pool.get_conn().unwrap();
    wait_until(BLOCK_DEADLINE, || {
        let status: mysql::Row = conn.query_first("SHOW ENGINE INNODB STATUS").unwrap().unwrap();
        let text: String = status.get("Status").unwrap();
        let waiting: Vec<&str> = text
            .split("\n---TRANSACTION ")
            .filter(|trx| trx.contains("\nLOCK WAIT "))
            .collect();
        connection_ids
            .iter()
            .all(|id| waiting.iter().any(|trx| trx.contains(&format!(" thread id {id},"))))
    })
}

/// The server's open transactions, for a failure message.
fn transactions(pool: &Pool) -> String {
    let rows: Vec<(u64, String, Option<String>)> = pool
        .get_conn()
        .unwrap()
        .query("SELECT trx_mysql_thread_id, trx_state, trx_query FROM information_schema.INNODB_TRX")
        .unwrap();
    let threads: Vec<(u64, String, Option<String>, Option<String>)> = pool
        .get_conn()
        .unwrap()
        .query("SELECT ID, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST WHERE DB = DATABASE()")
        .unwrap();
    format!("{rows:?}; connections: {threads:?}")
}

#[test]
fn the_handler_runs_once_for_a_key_processed_twice() {
    let db = TestDb::new("inbox_twice");
    points_table(&db);
    let inbox = Inbox::default();
    let runs = AtomicUsize::new(0);
    let meta = MessageMeta {
        topic: Some("ORDER_EVENT_TOPIC".into()),
        queue_id: Some(3),
        queue_offset: Some(1234),
        msg_id: Some("7F0000010001".into()),
    };
    let mut conn = db.conn();
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        let out = inbox
            .process(&mut tx, GROUP, "orders:ORD-1", &meta, |tx| {
                runs.fetch_add(1, SeqCst);
                credit(tx, "alice", 10)
            })
            .unwrap();
        // A duplicate leaves the transaction usable: later statements run and commit.
        tx.query_drop(
            "INSERT INTO points (user_id, balance) VALUES ('after', 1) ON DUPLICATE KEY UPDATE balance = balance + 1",
        )
        .unwrap();
        tx.commit().unwrap();
        outcomes.push(out);
    }
    assert_eq!(outcomes, vec![Outcome::Processed(()), Outcome::Duplicate]);
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(balance(&db, "alice"), 10);
    assert_eq!(balance(&db, "after"), 2, "the statement after the duplicate committed");
    assert!(inbox.is_processed(&mut db.conn(), GROUP, "orders:ORD-1").unwrap());

    // The mark keeps where the message came from, stamped by the database clock.
    let row: (Option<String>, Option<u32>, Option<u64>, Option<String>, i64) = db
        .conn()
        .query_first(
            "SELECT topic, queue_id, queue_offset, msg_id, TIMESTAMPDIFF(SECOND, processed_at, NOW(3)) \
             FROM outbox_inbox",
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.0, row.1, row.2, row.3),
        (
            meta.topic.clone(),
            meta.queue_id,
            meta.queue_offset,
            meta.msg_id.clone()
        )
    );
    assert!((0..60).contains(&row.4), "processed_at is {} s ago", row.4);

    // Keys are per consumer group, and compared exactly (case and trailing spaces count).
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    for (group, key) in [
        ("sms-service", "orders:ORD-1"),
        (GROUP, "ORDERS:ORD-1"),
        (GROUP, "orders:ORD-1 "),
    ] {
        let out = inbox
            .process(&mut tx, group, key, &MessageMeta::default(), |_| {
                Ok::<_, outbox::Error>(())
            })
            .unwrap();
        assert_eq!(out, Outcome::Processed(()), "{group} {key:?}");
    }
    tx.commit().unwrap();
    assert_eq!(marks(&db, "outbox_inbox"), 4);
}

/// Two connections handle copies of one event at the same time. The first marks the key and
/// keeps its transaction open until the second is seen waiting on the mark's lock; then it
/// commits. The second learns it is a duplicate: the handler ran once, no error, no deadlock.
fn two_copies_at_once(first_commits: bool) -> (Vec<Outcome<u32>>, usize, i64) {
    let db = TestDb::new(if first_commits { "inbox_conc" } else { "inbox_conc_rb" });
    points_table(&db);
    let inbox = Inbox::default();
    let runs = AtomicUsize::new(0);
    let marked = Barrier::new(2);
    let (id_tx, id_rx) = std::sync::mpsc::channel::<u32>();
    let (db, inbox, runs, marked) = (&db, &inbox, &runs, &marked);
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(move || {
            let mut conn = db.pool.get_conn().unwrap();
            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
            let out = inbox
                .process(&mut tx, GROUP, "orders:ORD-7", &MessageMeta::default(), |tx| {
                    runs.fetch_add(1, SeqCst);
                    credit(tx, "bob", 5).map(|_| 1u32)
                })
                .unwrap();
            marked.wait();
            let second_conn = id_rx.recv().unwrap();
            let blocked = wait_for_lock_waits(&db.pool, &[second_conn]);
            if first_commits {
                tx.commit().unwrap();
            } else {
                tx.rollback().unwrap();
            }
            (out, blocked)
        });
        let second = s.spawn(move || {
            let mut conn = db.pool.get_conn().unwrap();
            id_tx.send(conn.connection_id()).unwrap();
            marked.wait();
            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
            let out = inbox.process(&mut tx, GROUP, "orders:ORD-7", &MessageMeta::default(), |tx| {
                runs.fetch_add(1, SeqCst);
                credit(tx, "bob", 5).map(|_| 2u32)
            });
            let out = out.expect("the second copy gets an outcome, not an error");
            tx.commit().unwrap();
            out
        });
        (first.join().unwrap(), second.join().unwrap())
    });
    let (first_out, blocked) = first;
    assert!(blocked, "the second copy never waited on the first one's mark");
    (vec![first_out, second], runs.load(SeqCst), balance(db, "bob"))
}

#[test]
fn two_copies_handled_at_once_run_the_handler_once() {
    let (outcomes, runs, bob) = two_copies_at_once(true);
    assert_eq!(outcomes, vec![Outcome::Processed(1), Outcome::Duplicate]);
    assert_eq!(runs, 1);
    assert_eq!(bob, 5);
}

#[test]
fn a_waiting_copy_runs_the_handler_when_the_first_rolls_back() {
    let (outcomes, runs, bob) = two_copies_at_once(false);
    assert_eq!(outcomes, vec![Outcome::Processed(1), Outcome::Processed(2)]);
    assert_eq!(runs, 2, "the first run was rolled back, the second one counts");
    assert_eq!(bob, 5, "credited once: only the second run committed");
}

/// Three copies: the first marks the key, two more wait on it, then the first rolls back. InnoDB
/// may then pick one of the two waiters as a deadlock victim (both hold a shared lock on the freed
/// key and want to insert it): that is a retriable error, its transaction is rolled back, and
/// handling the message again finds a duplicate. Whatever happens, the effect commits once.
#[test]
fn three_copies_with_a_rollback_commit_the_effect_once_and_a_loser_only_retries() {
    let db = TestDb::new("inbox_three");
    points_table(&db);
    let inbox = Inbox::default();
    let runs = AtomicUsize::new(0);
    let marked = Barrier::new(3);
    let (id_tx, id_rx) = std::sync::mpsc::channel::<u32>();
    let (db, inbox, runs, marked) = (&db, &inbox, &runs, &marked);
    let (blocked, waiters) = std::thread::scope(|s| {
        let first = s.spawn(move || {
            let mut conn = db.pool.get_conn().unwrap();
            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
            let out = inbox
                .process(&mut tx, GROUP, "orders:ORD-3", &MessageMeta::default(), |tx| {
                    runs.fetch_add(1, SeqCst);
                    credit(tx, "dave", 5)
                })
                .unwrap();
            assert_eq!(out, Outcome::Processed(()));
            marked.wait();
            let ids = [id_rx.recv().unwrap(), id_rx.recv().unwrap()];
            let blocked = wait_for_lock_waits(&db.pool, &ids);
            let trx = if blocked { String::new() } else { transactions(&db.pool) };
            tx.rollback().unwrap();
            (blocked, format!("waiters {ids:?}; transactions: {trx}"))
        });
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let id_tx = id_tx.clone();
                s.spawn(move || {
                    let mut conn = db.pool.get_conn().unwrap();
                    id_tx.send(conn.connection_id()).unwrap();
                    marked.wait();
                    // (first outcome, retriable error seen before it)
                    let mut retried = None;
                    loop {
                        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
                        match inbox.process(&mut tx, GROUP, "orders:ORD-3", &MessageMeta::default(), |tx| {
                            runs.fetch_add(1, SeqCst);
                            credit(tx, "dave", 5)
                        }) {
                            Ok(out) => {
                                tx.commit().unwrap();
                                return (out, retried);
                            }
                            Err(e) => {
                                assert!(e.is_retriable(), "{e}");
                                assert!(retried.is_none(), "a second retriable error: {e}");
                                retried = Some(e.to_string());
                            }
                        }
                    }
                })
            })
            .collect();
        drop(id_tx);
        let blocked = first.join().unwrap();
        (
            blocked,
            waiters.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(),
        )
    });
    assert!(
        blocked.0,
        "the two copies never both waited on the first one's mark: {}",
        blocked.1
    );
    let processed = waiters.iter().filter(|w| w.0 == Outcome::Processed(())).count();
    let duplicates = waiters.iter().filter(|w| w.0 == Outcome::Duplicate).count();
    assert_eq!((processed, duplicates), (1, 1), "{waiters:?}");
    // A deadlock victim, if any, is retried and then finds the duplicate.
    for (out, retried) in &waiters {
        if let Some(e) = retried {
            assert!(e.contains("1213"), "{e}");
            assert_eq!(*out, Outcome::Duplicate);
        }
    }
    assert_eq!(balance(db, "dave"), 5, "credited once");
    assert_eq!(runs.load(SeqCst), 2, "the rolled-back run and the committed one");
}

#[test]
fn a_rollback_undoes_the_mark() {
    let db = TestDb::new("inbox_rb");
    points_table(&db);
    let inbox = Inbox::default();
    let mut conn = db.conn();

    // Rolled back explicitly.
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let out = inbox
        .process(&mut tx, GROUP, "orders:ORD-9", &MessageMeta::default(), |tx| {
            credit(tx, "carol", 3)
        })
        .unwrap();
    assert_eq!(out, Outcome::Processed(()));
    tx.rollback().unwrap();
    assert!(!inbox.is_processed(&mut db.conn(), GROUP, "orders:ORD-9").unwrap());

    // The handler fails: the error comes back and dropping the transaction rolls the mark back.
    {
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        let err = inbox
            .process(&mut tx, GROUP, "orders:ORD-9", &MessageMeta::default(), |tx| {
                credit(tx, "carol", 3)?;
                Err::<(), _>(outbox::Error::InvalidEvent {
                    field: "payload",
                    reason: "the handler refused it".into(),
                })
            })
            .unwrap_err();
        assert!(err.to_string().contains("the handler refused it"), "{err}");
    }
    assert!(!inbox.is_processed(&mut db.conn(), GROUP, "orders:ORD-9").unwrap());
    assert_eq!(balance(&db, "carol"), 0);

    // So the event is processed by the next copy.
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let out = inbox
        .process(&mut tx, GROUP, "orders:ORD-9", &MessageMeta::default(), |tx| {
            credit(tx, "carol", 3)
        })
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(out, Outcome::Processed(()));
    assert_eq!(balance(&db, "carol"), 3);
    assert!(inbox.is_processed(&mut db.conn(), GROUP, "orders:ORD-9").unwrap());
}

#[test]
fn points_service_credits_each_order_once_from_two_threads() {
    let db = TestDb::new("inbox_points");
    points_table(&db);
    // The accounts exist already, so a credit locks only its own row.
    db.conn()
        .query_drop("INSERT INTO points (user_id) VALUES ('u0'), ('u1'), ('u2'), ('u3'), ('u4')")
        .unwrap();
    let inbox = Inbox::default();
    const ORDERS: u64 = 300;
    let users = ["u0", "u1", "u2", "u3", "u4"];
    let order = |i: u64| (format!("orders:ORD-{i}"), users[(i % 5) as usize], (i + 1) as i64);
    // Every order once, every third one three times (redeliveries). Each copy goes to one of the
    // two consumers, and both walk the orders in the same order, so the copies of one order often
    // reach the two consumers at about the same time (the test above makes that certain for one
    // key; this one checks the totals under a stream of them).
    let mut halves: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
    let mut deliveries = Vec::new();
    for i in 0..ORDERS {
        let copies = if i % 3 == 0 { 3 } else { 1 };
        for c in 0..copies {
            halves[((i + c) % 2) as usize].push(i);
            deliveries.push(i);
        }
    }
    let total_deliveries = deliveries.len();
    let start = Barrier::new(2);
    let runs = AtomicUsize::new(0);
    let results: Vec<(usize, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = halves
            .iter()
            .map(|mine| {
                let (db, inbox, start, runs) = (&db, &inbox, &start, &runs);
                s.spawn(move || {
                    let mut conn = db.pool.get_conn().unwrap();
                    let (mut processed, mut duplicates, mut retries) = (0, 0, 0);
                    start.wait();
                    for &i in mine {
                        let (key, user, amount) = order(i);
                        let meta = MessageMeta {
                            topic: Some("ORDER_EVENT_TOPIC".into()),
                            queue_offset: Some(i),
                            ..MessageMeta::default()
                        };
                        loop {
                            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
                            let out = inbox.process(&mut tx, GROUP, &key, &meta, |tx| {
                                runs.fetch_add(1, SeqCst);
                                credit(tx, user, amount)
                            });
                            match out.and_then(|o| tx.commit().map(|_| o).map_err(Into::into)) {
                                Ok(Outcome::Processed(())) => processed += 1,
                                Ok(Outcome::Duplicate) => duplicates += 1,
                                Err(e) if e.is_retriable() => {
                                    retries += 1;
                                    continue;
                                }
                                Err(e) => panic!("order {i}: {e}"),
                            }
                            break;
                        }
                    }
                    (processed, duplicates, retries)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let processed: usize = results.iter().map(|r| r.0).sum();
    let duplicates: usize = results.iter().map(|r| r.1).sum();
    let retries: usize = results.iter().map(|r| r.2).sum();
    assert_eq!(retries, 0, "no deadlock or lock wait timeout between the two consumers");
    assert_eq!(processed, ORDERS as usize);
    assert_eq!(duplicates, total_deliveries - ORDERS as usize);
    assert_eq!(runs.load(SeqCst), ORDERS as usize, "each order's handler ran once");
    let mut expected: HashMap<&str, i64> = HashMap::new();
    for i in 0..ORDERS {
        let (_, user, amount) = order(i);
        *expected.entry(user).or_default() += amount;
    }
    for user in users {
        assert_eq!(balance(&db, user), expected[user], "{user}");
    }
    let sum: i64 = db
        .conn()
        .query_first("SELECT CAST(SUM(balance) AS SIGNED) FROM points")
        .unwrap()
        .unwrap();
    assert_eq!(sum, (1..=ORDERS as i64).sum::<i64>());
    assert_eq!(marks(&db, "outbox_inbox"), ORDERS);

    // A replay of the whole topic later (a dead-letter replay, a consumer reset to an old offset):
    // every copy is a duplicate, nothing is credited again.
    let mut conn = db.conn();
    for i in 0..ORDERS {
        let (key, user, amount) = order(i);
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        let out = inbox
            .process(&mut tx, GROUP, &key, &MessageMeta::default(), |tx| {
                credit(tx, user, amount)
            })
            .unwrap();
        tx.commit().unwrap();
        assert_eq!(out, Outcome::Duplicate, "order {i}");
    }
    let after: i64 = db
        .conn()
        .query_first("SELECT CAST(SUM(balance) AS SIGNED) FROM points")
        .unwrap()
        .unwrap();
    assert_eq!(after, sum);
}

#[test]
fn retention_deletes_only_old_marks_oldest_first_in_batches() {
    let db = TestDb::new("inbox_ret");
    // A configured table name: created by migrate_inbox (twice: it is idempotent).
    inbox::migrate_inbox(&db.pool, "points_inbox").unwrap();
    inbox::migrate_inbox(&db.pool, "points_inbox").unwrap();
    let e = inbox::migrate_inbox(&db.pool, "points-inbox").unwrap_err().to_string();
    assert!(e.contains("inbox.table") && e.contains("points-inbox"), "{e}");
    let inbox = Inbox::new("points_inbox").unwrap();
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    for i in 0..28 {
        let out = inbox
            .process(&mut tx, GROUP, &format!("k{i:02}"), &MessageMeta::default(), |_| {
                Ok::<_, outbox::Error>(())
            })
            .unwrap();
        assert_eq!(out, Outcome::Processed(()));
    }
    tx.commit().unwrap();
    // k00..k22 were processed more than 7 days ago (k22 the longest ago); k23..k27 just now,
    // and k23 one minute short of the retention.
    conn.query_drop(
        "UPDATE points_inbox SET processed_at = NOW(3) - INTERVAL 8 DAY - INTERVAL CAST(SUBSTR(event_key, 2) AS UNSIGNED) MINUTE \
         WHERE event_key < 'k23'",
    )
    .unwrap();
    conn.query_drop(
        "UPDATE points_inbox SET processed_at = NOW(3) - INTERVAL 7 DAY + INTERVAL 1 MINUTE WHERE event_key = 'k23'",
    )
    .unwrap();
    let left = |db: &TestDb| -> Vec<String> {
        db.conn()
            .query_map("SELECT event_key FROM points_inbox ORDER BY event_key", |k: Vec<u8>| {
                String::from_utf8(k).unwrap()
            })
            .unwrap()
    };

    // No time for more than one batch per call: each call deletes one batch, oldest first.
    let batch = 10;
    let first = inbox
        .purge(&db.pool, inbox::DEFAULT_RETENTION, batch, Duration::ZERO)
        .unwrap();
    assert_eq!(first, 10);
    let after_first = left(&db);
    assert_eq!(after_first.len(), 18);
    assert!(
        (13..=22).all(|i| !after_first.contains(&format!("k{i:02}"))),
        "the oldest went first: {after_first:?}"
    );
    assert_eq!(
        inbox
            .purge(&db.pool, inbox::DEFAULT_RETENTION, batch, Duration::ZERO)
            .unwrap(),
        10
    );
    // The last old ones (fewer than a batch), then nothing left to delete.
    assert_eq!(
        inbox::purge_processed(
            &db.pool,
            "points_inbox",
            inbox::DEFAULT_RETENTION,
            batch,
            Duration::from_secs(60)
        )
        .unwrap(),
        3
    );
    assert_eq!(
        inbox
            .purge(&db.pool, inbox::DEFAULT_RETENTION, batch, Duration::from_secs(60))
            .unwrap(),
        0
    );
    assert_eq!(left(&db), vec!["k23", "k24", "k25", "k26", "k27"]);

    // With time for it, one call goes on batch after batch.
    conn.query_drop("UPDATE points_inbox SET processed_at = NOW(3) - INTERVAL 30 DAY")
        .unwrap();
    assert_eq!(
        inbox
            .purge(&db.pool, inbox::DEFAULT_RETENTION, 2, Duration::from_secs(60))
            .unwrap(),
        5
    );
    assert!(left(&db).is_empty());

    // The DELETE is a range read of the processed_at index from the oldest mark, not a table
    // scan, with a batch small next to the table; here two thirds of the marks are old.
    conn.query_drop(
        "INSERT INTO points_inbox (consumer_group, event_key, processed_at) \
         WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
         SELECT 'g', CONCAT('x', i), NOW(3) - INTERVAL i HOUR FROM n",
    )
    .unwrap();
    conn.query_drop("ANALYZE TABLE points_inbox").unwrap();
    let delete = inbox::purge_statement("points_inbox", inbox::DEFAULT_RETENTION, 50).unwrap();
    let plan: mysql::Row = conn.query_first(format!("EXPLAIN {delete}")).unwrap().unwrap();
    let key: Option<String> = plan.get("key").unwrap();
    let access: Option<String> = plan.get("type").unwrap();
    assert_eq!(key.as_deref(), Some("idx_inbox_processed_at"), "{plan:?}");
    assert_eq!(access.as_deref(), Some("range"), "{plan:?}");
    let extra: Option<String> = plan.get("Extra").unwrap();
    assert!(!extra.unwrap_or_default().contains("filesort"), "{plan:?}");
    assert!(inbox::purge_statement("points_inbox", inbox::DEFAULT_RETENTION, 0).is_err());
}

#[test]
fn bad_values_are_refused_before_the_database_and_the_transaction_stays_usable() {
    let db = TestDb::new("inbox_bad");
    let inbox = Inbox::default();
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let ran = AtomicUsize::new(0);
    let long_key = "k".repeat(inbox::MAX_KEY_BYTES + 1);
    for (group, key, names) in [
        ("", "k", "consumer_group"),
        ("a b", "k", "\"a b\""),
        (GROUP, "", "event_key"),
        (GROUP, long_key.as_str(), "256 bytes"),
    ] {
        let e = inbox
            .process(&mut tx, group, key, &MessageMeta::default(), |_| {
                ran.fetch_add(1, SeqCst);
                Ok::<_, outbox::Error>(())
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains(names), "{e}");
    }
    assert_eq!(ran.load(SeqCst), 0);
    let out = inbox
        .process(&mut tx, GROUP, "ok", &MessageMeta::default(), |_| {
            Ok::<_, outbox::Error>(())
        })
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(out, Outcome::Processed(()));
    assert_eq!(marks(&db, "outbox_inbox"), 1);
}

/// The marks of a batch (what the consumer runtime's batches use), with and without
/// `INSERT ... RETURNING`.
fn mark_batch(db: &TestDb, keys: &[&str], returning: bool) -> (Option<Vec<bool>>, u64) {
    let inbox = Inbox::default();
    let mut conn = db.pool.get_conn().unwrap();
    let inserts = |c: &mut mysql::PooledConn| -> u64 {
        let (_, n): (String, u64) = c.query_first("SHOW SESSION STATUS LIKE 'Com_insert'").unwrap().unwrap();
        n
    };
    let before = inserts(&mut conn);
    let items: Vec<(&str, MessageMeta)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                *k,
                MessageMeta {
                    topic: Some("orders".into()),
                    queue_id: Some(1),
                    queue_offset: Some(i as u64),
                    msg_id: None,
                },
            )
        })
        .collect();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let out = inbox.mark_many(&mut tx, GROUP, &items, returning).unwrap();
    tx.commit().unwrap();
    (out, inserts(&mut conn) - before)
}

#[test]
fn a_batch_of_marks_learns_which_keys_are_new_in_one_statement() {
    let db = TestDb::new("inbox_many");
    let mut conn = db.conn();
    assert!(
        inbox::has_insert_returning(&mut conn).unwrap(),
        "MariaDB 10.11 has RETURNING"
    );
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    assert!(Inbox::default()
        .mark(&mut tx, GROUP, "old", &MessageMeta::default())
        .unwrap());
    tx.commit().unwrap();

    // RETURNING: a key seen before is false, a key twice in the batch is new only the first time.
    let (out, statements) = mark_batch(&db, &["b", "a", "old", "b", "c"], true);
    assert_eq!(out, Some(vec![true, true, false, false, true]));
    assert_eq!(statements, 1, "one INSERT for the whole batch");
    assert_eq!(marks(&db, "outbox_inbox"), 4);
    // The mark keeps the first copy's place in the queue.
    let offset: Option<u64> = db
        .conn()
        .query_first("SELECT queue_offset FROM outbox_inbox WHERE event_key = 'b'")
        .unwrap();
    assert_eq!(offset, Some(0));

    // Without RETURNING (MySQL): all new is known from the count; a key already marked makes the
    // batch unknown, and the caller rolls back.
    let (out, statements) = mark_batch(&db, &["d", "e", "d"], false);
    assert_eq!(out, Some(vec![true, true, false]));
    assert_eq!(statements, 1);
    let inbox = Inbox::default();
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let items = [("f", MessageMeta::default()), ("a", MessageMeta::default())];
    assert_eq!(inbox.mark_many(&mut tx, GROUP, &items, false).unwrap(), None);
    tx.rollback().unwrap();
    assert_eq!(
        marks(&db, "outbox_inbox"),
        6,
        "old, a, b, c, d, e: the unknown batch left nothing"
    );

    // Bad values are refused before anything is sent, naming the field.
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let long = "k".repeat(256);
    let items = [("g", MessageMeta::default()), (long.as_str(), MessageMeta::default())];
    let e = inbox.mark_many(&mut tx, GROUP, &items, true).unwrap_err().to_string();
    assert!(e.contains("event_key") && e.contains("256 bytes"), "{e}");
    tx.commit().unwrap();
    assert_eq!(marks(&db, "outbox_inbox"), 6);
}

#[test]
fn marks_keep_every_value_byte_for_byte_whatever_it_holds() {
    let db = TestDb::new("inbox_bytes");
    let inbox = Inbox::default();
    let keys = [
        "it's",
        "back\\slash",
        "tab\tkey",
        "points 🎉",
        "nul\0byte",
        "' OR 1=1 --",
    ];
    let meta = |i: usize| MessageMeta {
        topic: Some(format!("T'{i}\\")),
        queue_id: Some(i as u32),
        queue_offset: Some(u64::MAX - i as u64),
        msg_id: Some(format!("m\"{i}")),
    };
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    // One through the single mark, the rest through a batch.
    assert!(inbox.mark(&mut tx, GROUP, keys[0], &meta(0)).unwrap());
    let items: Vec<(&str, MessageMeta)> = keys.iter().enumerate().map(|(i, k)| (*k, meta(i))).collect();
    let out = inbox.mark_many(&mut tx, GROUP, &items, true).unwrap().unwrap();
    assert_eq!(out, vec![false, true, true, true, true, true]);
    tx.commit().unwrap();
    type Row = (Vec<u8>, String, u32, u64, String);
    let rows: Vec<Row> = conn
        .query("SELECT event_key, topic, queue_id, queue_offset, msg_id FROM outbox_inbox ORDER BY queue_id")
        .unwrap();
    assert_eq!(rows.len(), keys.len());
    for (i, (key, topic, queue, offset, msg_id)) in rows.into_iter().enumerate() {
        let m = meta(i);
        assert_eq!(key, keys[i].as_bytes(), "key {i}");
        assert_eq!(Some(topic), m.topic);
        assert_eq!((Some(queue), Some(offset)), (m.queue_id, m.queue_offset));
        assert_eq!(Some(msg_id), m.msg_id);
        assert!(inbox.is_processed(&mut conn, GROUP, keys[i]).unwrap(), "key {i}");
    }
    assert!(!inbox.is_processed(&mut conn, GROUP, "it'S").unwrap());
    assert_eq!(marks(&db, "outbox_inbox"), keys.len() as u64);
}

/// A batch holding a key another transaction marked but has not committed waits for it, then
/// counts the key new or not by that transaction's outcome, like one mark does.
fn a_batch_and_a_copy_at_once(first_commits: bool) -> Vec<bool> {
    let db = TestDb::new(if first_commits {
        "inbox_many_conc"
    } else {
        "inbox_many_rb"
    });
    let inbox = Inbox::default();
    let marked = Barrier::new(2);
    let (id_tx, id_rx) = std::sync::mpsc::channel::<u32>();
    let (db, inbox, marked) = (&db, &inbox, &marked);
    let (blocked, out) = std::thread::scope(|s| {
        let first = s.spawn(move || {
            let mut conn = db.pool.get_conn().unwrap();
            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
            assert!(inbox.mark(&mut tx, GROUP, "k2", &MessageMeta::default()).unwrap());
            marked.wait();
            let blocked = wait_for_lock_waits(&db.pool, &[id_rx.recv().unwrap()]);
            if first_commits {
                tx.commit().unwrap();
            } else {
                tx.rollback().unwrap();
            }
            blocked
        });
        let second = s.spawn(move || {
            let mut conn = db.pool.get_conn().unwrap();
            id_tx.send(conn.connection_id()).unwrap();
            marked.wait();
            let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
            let items = [
                ("k1", MessageMeta::default()),
                ("k2", MessageMeta::default()),
                ("k3", MessageMeta::default()),
            ];
            let out = inbox.mark_many(&mut tx, GROUP, &items, true).unwrap().unwrap();
            tx.commit().unwrap();
            out
        });
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(blocked, "the batch never waited on the other transaction's mark");
    assert_eq!(marks(db, "outbox_inbox"), 3);
    out
}

#[test]
fn a_batch_waits_on_a_key_marked_elsewhere_and_counts_it_by_that_outcome() {
    assert_eq!(a_batch_and_a_copy_at_once(true), vec![true, false, true]);
    assert_eq!(
        a_batch_and_a_copy_at_once(false),
        vec![true, true, true],
        "rolled back elsewhere: the batch marks it"
    );
}
