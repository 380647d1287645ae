//! The fleet's watch (`shard.watch.ms`): instead of every idle shard reading its own table each
//! scan interval, one statement per database server reads the first WAIT row of every running
//! shard on it (`UNION ALL` of one index-head read each) and wakes the relays of the shards whose
//! row is due. The shards' own scans then run only every `shard.scan.interval.ms`, as a
//! fallback; a fresh event waits at most about one watch period instead of a scan interval.
//!
//! A server whose statement fails (a shard's table dropped, the server down) is said by
//! [`Watch::problems`] and logged at most once a minute per server; its shards are left to
//! their own scans until the statement succeeds again. Each server has a thread of its own: one
//! that stalls holds up no other server's wake-ups.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use mysql::prelude::Queryable;
use mysql::Pool;
use parking_lot::Mutex;

use super::problem::Problem;
use crate::config::Config;
use crate::relay::Relay;
use crate::sql::ident;
use crate::store::first_wait_in_sql;

/// A running shard as the watch sees it.
#[derive(Clone)]
pub(super) struct Watched {
    pub url: String,
    pub table: String,
    pub relay: Arc<Relay>,
}

/// What the watch knows between ticks: a pool per server and each server's last failure.
#[derive(Default)]
pub(super) struct Watch {
    pools: Mutex<BTreeMap<String, Pool>>,
    problems: Mutex<BTreeMap<String, Problem>>,
}

impl Watch {
    /// Each server whose statement failed at the last tick (`host:port`) and why.
    pub fn problems(&self) -> Vec<(String, String)> {
        self.problems
            .lock()
            .iter()
            .filter_map(|(server, p)| Some((server.clone(), p.why()?.to_string())))
            .collect()
    }

    /// Ticks every `every` until `stop` disconnects; `shards` gives the running shards each tick.
    /// Each database server is read by a thread of its own, so one that stalls (its statement
    /// waiting on a dead connection up to the read timeout) delays no other server's wake-ups.
    pub fn run(&self, base: &Config, every: Duration, stop: Receiver<()>, shards: impl Fn() -> Vec<Watched>) {
        std::thread::scope(|s| {
            let mut workers: BTreeMap<Server, Worker<'_>> = BTreeMap::new();
            loop {
                let mut by_server: BTreeMap<Server, Vec<Watched>> = BTreeMap::new();
                for w in shards() {
                    if let Some(server) = server_of(&w.url) {
                        by_server.entry(server).or_default().push(w);
                    }
                }
                self.problems
                    .lock()
                    .retain(|server, _| by_server.keys().any(|(_, shown)| shown == server));
                // A server no longer watched: its thread sees an empty group and ends.
                for (server, (group, _)) in &workers {
                    if !by_server.contains_key(server) {
                        group.lock().clear();
                    }
                }
                workers.retain(|server, (_, handle)| by_server.contains_key(server) || !handle.is_finished());
                for (server, group) in by_server {
                    match workers.get(&server) {
                        Some((slot, handle)) if !handle.is_finished() => *slot.lock() = group,
                        _ => {
                            let slot = Arc::new(Mutex::new(group));
                            let (mine, stop, key) = (slot.clone(), stop.clone(), server.clone());
                            let handle = s.spawn(move || loop {
                                let group: Vec<Watched> = mine.lock().clone();
                                if group.is_empty() {
                                    return;
                                }
                                self.tick(base, &key, &group);
                                if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = stop.recv_timeout(every)
                                {
                                    return;
                                }
                            });
                            workers.insert(server, (slot, handle));
                        }
                    }
                }
                if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = stop.recv_timeout(every) {
                    for (group, _) in workers.values() {
                        group.lock().clear();
                    }
                    return;
                }
            }
        });
    }

    /// One server's read: wakes its due shards, or records why it failed.
    fn tick(&self, base: &Config, (credentials, shown): &Server, group: &[Watched]) {
        match self.read(base, credentials, group) {
            Ok(due) => {
                for i in due {
                    group[i].relay.notify();
                }
                if self.problems.lock().remove(shown).is_some() {
                    log::info!("fleet watch: server {shown} answers again");
                }
            }
            Err(e) => {
                // The next tick opens a new pool, from the server's first running shard then
                // (the database this one was opened on may be gone).
                self.pools.lock().remove(credentials);
                let why = format!("cannot read the shards' first due rows: {e}");
                if self.problems.lock().entry(shown.clone()).or_default().fail(why.clone()) {
                    log::warn!(
                        "fleet watch: server {shown}: {why}; its {} shards scan every shard.scan.interval.ms meanwhile",
                        group.len()
                    );
                }
            }
        }
    }

    /// The indexes in `group` of the shards whose first WAIT row is due.
    fn read(&self, base: &Config, credentials: &str, group: &[Watched]) -> crate::error::Result<Vec<usize>> {
        // Not connected under the lock: a server that does not answer holds up no other's thread.
        let known = self.pools.lock().get(credentials).cloned();
        let pool = match known {
            Some(p) => p,
            None => {
                let p = crate::db::connect_one(base, "shards", &group[0].url)?;
                self.pools.lock().insert(credentials.to_string(), p.clone());
                p
            }
        };
        let sql = group
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let db = mysql::Opts::from_url(&w.url).ok()?.get_db_name()?.to_string();
                let table = format!("{}.{}", ident(&db), ident(&w.table));
                Some(format!("SELECT {i}, {}", first_wait_in_sql(&table)))
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        // Prepared once per connection and membership (the driver's statement cache): parsing the
        // UNION of hundreds of reads cost about as much as running it.
        let rows: Vec<(usize, Option<i64>)> = pool.get_conn()?.exec(sql, ())?;
        Ok(rows
            .into_iter()
            .filter(|(i, us)| *i < group.len() && us.is_some_and(|us| us <= 0))
            .map(|(i, _)| i)
            .collect())
    }
}

/// A server's thread: the shards it reads (emptied to end it) and its handle.
type Worker<'scope> = (Arc<Mutex<Vec<Watched>>>, std::thread::ScopedJoinHandle<'scope, ()>);

/// A database server as the watch tells them apart: credentials and address (what a pool is
/// shared by, never shown), and `host:port` (what is shown).
type Server = (String, String);

/// The server of a shard's URL.
fn server_of(url: &str) -> Option<Server> {
    let o = mysql::Opts::from_url(url).ok()?;
    let shown = format!("{}:{}", o.get_ip_or_hostname(), o.get_tcp_port());
    let credentials = format!(
        "{}\u{0}{}\u{0}{shown}",
        o.get_user().unwrap_or_default(),
        o.get_pass().unwrap_or_default()
    );
    Some((credentials, shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_told_apart_by_credentials() {
        let (a, shown) = server_of("mysql://u:p1@db1:3306/orders_1").unwrap();
        let (b, _) = server_of("mysql://u:p1@db1:3306/orders_2").unwrap();
        let (c, _) = server_of("mysql://v:p2@db1:3306/orders_3").unwrap();
        assert_eq!(shown, "db1:3306");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
