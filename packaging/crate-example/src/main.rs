//! A service's use of the `outbox` crate: migrate, then write a business row and its event in one
//! transaction; with the feature `rocketmq` and a name server, relay it and wait for the ack.
//!
//!   outbox-crate-example                          prints the version and the INSERT statement
//!   outbox-crate-example DB_URL                   migrates and enqueues (publisher = none)
//!   outbox-crate-example DB_URL NAMESRV TOPIC     also relays it (feature rocketmq)

use std::time::{Duration, Instant};

use mysql::prelude::Queryable;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("outbox {}", outbox::VERSION);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db_url, broker) = match args.as_slice() {
        [] => {
            println!("{}", outbox::insert_statement("t_event_record")?);
            return Ok(());
        }
        [db_url] => (db_url, None),
        [db_url, namesrv, topic] => (db_url, Some((namesrv, topic))),
        _ => return Err("usage: outbox-crate-example [DB_URL [NAMESRV TOPIC]]".into()),
    };

    let mut config = outbox::Config::new(db_url.as_str());
    match broker {
        Some((namesrv, topic)) => {
            config.set("rocketmq.namesrv", namesrv)?;
            config.set("topic", topic)?;
        }
        None => config.set("publisher", "none")?,
    }
    outbox::migrate(&outbox::connect(&config)?)?;
    let relay = outbox::open(config, None)?;

    let mut conn = relay.pool().get_conn()?;
    let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
    tx.query_drop("CREATE TABLE IF NOT EXISTS points (member VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL)")?;
    tx.exec_drop(
        "INSERT INTO points (member, points) VALUES (?, ?) ON DUPLICATE KEY UPDATE points = points + VALUES(points)",
        ("M-1", 42),
    )?;
    let event = outbox::NewEvent::new("M-1", "POINTS_CREDITED", br#"{"member":"M-1","points":42}"#.to_vec());
    let id = relay.enqueue_in_tx(&mut tx, &event)?;
    relay.commit(tx)?; // commit, then wake the relay
    println!("enqueued event {id}");

    // Sent: the row deleted (`sent.rows = delete`, the default) or SUCCESS; not sent: WAIT.
    let want = if broker.is_some() { "sent" } else { "WAIT" };
    let deadline = Instant::now() + Duration::from_secs(60); // a new topic's first send creates its route
    loop {
        let done = if broker.is_some() {
            let unsent: Option<u64> = conn.exec_first(
                "SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status <> 'SUCCESS'",
                (id,),
            )?;
            unsent == Some(0)
        } else {
            let waiting: Option<u64> = conn.exec_first(
                "SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status = 'WAIT'",
                (id,),
            )?;
            waiting == Some(1)
        };
        if done {
            break;
        }
        if broker.is_none() || Instant::now() > deadline {
            return Err(format!("event {id} is not {want}; stats {:?}", relay.stats()).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    match broker {
        Some((namesrv, topic)) => println!("relayed event {id} to {topic} on {namesrv}"),
        None => println!("event {id} waits for a relay"),
    }
    relay.stop(Duration::from_secs(10));
    Ok(())
}
