//! Pausing a table: every relay of it stops claiming within a second and finishes what it holds;
//! resuming lets it claim again; nothing is lost or sent twice, and each change is audited.

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::support::{wait_until, Fault, Recorder, TestDb};
use outbox::Relay;

const LONG: Duration = Duration::from_secs(30);

#[test]
fn a_paused_table_is_not_claimed_from_until_resumed_and_every_event_is_sent_once() {
    let db = TestDb::new("control_pause");
    let first = db.seed(5);
    // The first event's send takes a while: the pause comes while it is in flight.
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id: first[0],
        by: Duration::from_millis(700),
        times: 1,
    }]);
    let relay = Relay::start(db.config(), rec.clone()).unwrap();
    assert!(wait_until(LONG, || rec.calls.load(std::sync::atomic::Ordering::SeqCst) >= 1));
    assert!(
        outbox::control::set_paused(&db.pool, "t_event_record", true, "alice@ops", Some("broker upgrade")).unwrap()
    );
    assert!(
        !outbox::control::set_paused(&db.pool, "t_event_record", true, "alice@ops", None).unwrap(),
        "pausing a paused table changes nothing"
    );
    // The relay reads the flag at most once a second: once it says it is paused, it claims
    // nothing new.
    assert!(
        wait_until(LONG, || relay.counters().paused.is_some()),
        "the relay never saw the pause"
    );
    let later = db.seed(10);
    let paused = relay.counters().paused.unwrap();
    assert!(
        paused.contains("alice@ops") && paused.contains("broker upgrade"),
        "{paused}"
    );
    // What was in flight finishes; nothing new is claimed while paused (a relay scanning every
    // 50 ms would have claimed them many times over in this window).
    assert!(wait_until(LONG, || first.iter().all(|id| rec.sends_of(*id) == 1)));
    assert!(
        !wait_until(Duration::from_secs(2), || db.count("WAIT") < 10),
        "events were claimed while the table was paused: {:?}",
        db.rows()
    );
    assert!(later.iter().all(|id| rec.sends_of(*id) == 0));
    assert!(outbox::control::set_paused(&db.pool, "t_event_record", false, "bob@ops", None).unwrap());
    assert!(wait_until(LONG, || later.iter().all(|id| rec.sends_of(*id) == 1)));
    assert!(wait_until(LONG, || relay.counters().paused.is_none()));
    relay.stop(Duration::from_secs(5));
    assert!(
        first.iter().chain(&later).all(|id| rec.sends_of(*id) == 1),
        "each event sent once"
    );
    assert_eq!(db.count("SUCCESS"), 15);
    let audit: Vec<(String, String, Option<String>)> = db
        .conn()
        .query("SELECT action, actor, detail FROM outbox_audit WHERE table_name = 't_event_record' ORDER BY id")
        .unwrap();
    assert_eq!(
        audit,
        [
            (
                "pause".to_string(),
                "alice@ops".to_string(),
                Some("broker upgrade".to_string())
            ),
            ("resume".to_string(), "bob@ops".to_string(), None),
        ]
    );
    let e = outbox::control::set_paused(&db.pool, "t_event_record", true, "  ", None).unwrap_err();
    assert!(e.to_string().contains("actor"), "{e}");
}
