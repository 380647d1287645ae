//! Shard databases for the fleet benches (`#[path]` module of fleet and fleet_share): each
//! made by copying one migrated database's tables (`CREATE TABLE … LIKE`, the migration history
//! with them), all dropped at the end.

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};
use outbox::NewEvent;

pub const SERVER: &str = "mysql://root@127.0.0.1:3306";

pub fn server() -> Pool {
    Pool::new(Opts::from_url(SERVER).unwrap()).unwrap()
}

/// `n` databases `<prefix>_<tag>_<i>` with the outbox's tables, made from one migrated database.
pub struct Dbs {
    pub names: Vec<String>,
}

impl Dbs {
    pub fn new(prefix: &str, tag: &str, n: usize) -> Dbs {
        let mut c = server().get_conn().unwrap();
        let names: Vec<String> = (0..n).map(|i| format!("{prefix}_{tag}_{i}")).collect();
        for name in &names {
            c.query_drop(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        }
        let first = &names[0];
        c.query_drop(format!("CREATE DATABASE {first}")).unwrap();
        outbox::migrate(&Pool::new(Opts::from_url(&format!("{SERVER}/{first}")).unwrap()).unwrap()).unwrap();
        let tables: Vec<String> = c
            .query(format!(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = '{first}'"
            ))
            .unwrap();
        for name in &names[1..] {
            c.query_drop(format!("CREATE DATABASE {name}")).unwrap();
            for t in &tables {
                c.query_drop(format!("CREATE TABLE {name}.{t} LIKE {first}.{t}"))
                    .unwrap();
                c.query_drop(format!("INSERT INTO {name}.{t} SELECT * FROM {first}.{t}"))
                    .unwrap();
            }
        }
        Dbs { names }
    }

    pub fn url(&self, i: usize) -> String {
        format!("{SERVER}/{}", self.names[i])
    }

    pub fn shards(&self, range: std::ops::Range<usize>) -> String {
        range.map(|i| self.url(i)).collect::<Vec<_>>().join(" ")
    }

    /// `n` events in every shard, by two writers (the even shards and the odd ones).
    pub fn fill_all(&self, n: usize) {
        std::thread::scope(|s| {
            for w in 0..2 {
                s.spawn(move || {
                    for i in (w..self.names.len()).step_by(2) {
                        self.fill(i, n);
                    }
                });
            }
        });
    }

    /// `n` events committed in shard `i`, 500 per transaction.
    pub fn fill(&self, i: usize, n: usize) {
        let pool = Pool::new(Opts::from_url(&self.url(i)).unwrap()).unwrap();
        let mut conn = pool.get_conn().unwrap();
        let payload = format!("{{\"note\":\"{}\"}}", "x".repeat(180));
        for start in (0..n).step_by(500) {
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            for k in start..(start + 500).min(n) {
                let e = NewEvent::new(format!("ORD-{i}-{k}"), "ORDER_CREATED", payload.clone());
                outbox::enqueue_in_tx(&mut tx, &e).unwrap();
            }
            tx.commit().unwrap();
        }
    }
}

impl Drop for Dbs {
    fn drop(&mut self) {
        let mut c = server().get_conn().unwrap();
        for name in &self.names {
            let _ = c.query_drop(format!("DROP DATABASE IF EXISTS {name}"));
        }
    }
}
