//! Sharing a fleet's shards among several relays (`shard.coordination.url`, `docs/fleet.md`,
//! "Several relays over one fleet").
//!
//! The relays configured with the same shards meet in two tables of a database the operator
//! names: `outbox_fleet_member` (each relay's heartbeat) and `outbox_fleet_shard` (each shard's
//! holder and lease). Every third of `shard.lease.ms` a relay renews its heartbeat, reads the
//! live relays of its view (those configured with the same shards), computes the same split of
//! the shards as every other of them ([`assign`]: rendezvous hashing with bounded loads, at most
//! ⌈shards / relays⌉ each), claims or renews its part with one conditional UPDATE (a shard whose
//! holder is itself or whose lease ran out), stops the relays of what it no longer holds and
//! releases it, and starts relays for what it holds. A dead relay's heartbeat and leases run
//! out within `shard.lease.ms`; the next tick of the others takes its shards over.
//!
//! A hold only spreads the work and bounds the connections: the rows themselves are still
//! claimed one by one with fencing and leases, so two relays that both serve a shard for a
//! while (one cut off from the coordination database, its lease taken over) send nothing
//! twice that one relay alone would not. A relay that cannot reach the coordination database
//! keeps serving what it held (nobody else can take it over without reaching it) and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Pool, Value};
use parking_lot::Mutex;

use super::problem::Problem;
use crate::config::{Config, ShardSpec};
use crate::error::Result;

/// Longest shard key the table stores.
const KEY_MAX: usize = 255;

const CREATE_MEMBER: &str = "CREATE TABLE IF NOT EXISTS outbox_fleet_member (
    instance VARCHAR(128) NOT NULL PRIMARY KEY,
    view CHAR(16) NOT NULL,
    expires_at DATETIME(3) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

const CREATE_SHARD: &str = "CREATE TABLE IF NOT EXISTS outbox_fleet_shard (
    shard VARCHAR(255) NOT NULL PRIMARY KEY,
    owner VARCHAR(128) NOT NULL DEFAULT '',
    lease_until DATETIME(3) NOT NULL,
    takes BIGINT UNSIGNED NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// The key of a shard in `outbox_fleet_shard`: its server, database and table, the same for
/// every relay whatever the shard's name or credentials.
pub(super) fn shard_key(spec: &ShardSpec) -> String {
    let key = match mysql::Opts::from_url(&spec.url) {
        Ok(o) => format!(
            "{}:{}/{}.{}",
            o.get_ip_or_hostname(),
            o.get_tcp_port(),
            o.get_db_name().unwrap_or_default(),
            spec.table
        ),
        Err(_) => format!("{}.{}", spec.name, spec.table),
    };
    if key.chars().count() <= KEY_MAX {
        return key;
    }
    let head: String = key.chars().take(KEY_MAX - 17).collect();
    format!("{head}~{:016x}", fnv(key.as_bytes()))
}

/// FNV-1a, then a finalizer: a hash every relay computes alike whatever its build.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The view of a set of shard keys: relays with the same view split those shards.
pub(super) fn view_of(keys: &BTreeSet<String>) -> String {
    let joined: Vec<&str> = keys.iter().map(String::as_str).collect();
    format!("{:016x}", fnv(joined.join("\n").as_bytes()))
}

/// Which member serves each shard: shards in order, each to the member that ranks it highest
/// (rendezvous hashing) among those holding fewer than ⌈shards / members⌉. Every relay with the
/// same keys and members computes the same split, and a member joining or leaving moves few
/// shards besides its own.
pub(super) fn assign<'a>(keys: &'a BTreeSet<String>, members: &'a BTreeSet<String>) -> BTreeMap<&'a str, &'a str> {
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    let cap = keys.len().div_ceil(members.len());
    let mut load: BTreeMap<&str, usize> = members.iter().map(|m| (m.as_str(), 0)).collect();
    for key in keys {
        let mut ranked: Vec<&str> = members.iter().map(String::as_str).collect();
        ranked.sort_by_key(|m| std::cmp::Reverse(fnv(format!("{key}\n{m}").as_bytes())));
        if let Some(m) = ranked.into_iter().find(|m| load[m] < cap) {
            *load.get_mut(m).expect("a member") += 1;
            out.insert(key.as_str(), m);
        }
    }
    out
}

/// What one tick found: the shards (by key) this relay holds, and every known shard's holder.
pub(super) struct Holding {
    pub mine: BTreeSet<String>,
    /// Each shard's holder with a lease still running (absent: nobody holds it).
    pub owners: BTreeMap<String, String>,
    pub members: usize,
}

/// This relay's side of the coordination.
pub(super) struct Share {
    url: String,
    pub me: String,
    lease: Duration,
    pool: Mutex<Option<Pool>>,
    /// The keys whose rows are known to exist.
    ensured: Mutex<BTreeSet<String>>,
    /// The last failure and when it was last logged.
    problem: Mutex<Problem>,
    last: Mutex<Option<(usize, usize)>>,
}

impl Share {
    pub fn new(config: &Config, url: String, me: String) -> Share {
        Share {
            url,
            me,
            lease: config.shard_lease,
            pool: Mutex::new(None),
            ensured: Mutex::new(BTreeSet::new()),
            problem: Mutex::default(),
            last: Mutex::new(None),
        }
    }

    /// How often the relay ticks: a third of the lease.
    pub fn every(&self) -> Duration {
        self.lease / 3
    }

    /// Why the last tick failed, when it did.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().why().map(str::to_string)
    }

    /// Live relays of this view and shards nobody holds, as of the last successful tick.
    pub fn last_seen(&self) -> Option<(usize, usize)> {
        *self.last.lock()
    }

    fn pool(&self, base: &Config) -> Result<Pool> {
        let mut pool = self.pool.lock();
        if let Some(p) = &*pool {
            return Ok(p.clone());
        }
        let p = crate::db::connect_one(base, "shard.coordination.url", &self.url)?;
        let mut conn = p.get_conn()?;
        conn.query_drop(CREATE_MEMBER)?;
        conn.query_drop(CREATE_SHARD)?;
        // The heartbeats of relays gone for an hour (killed, never to leave) go, once per
        // connection: not at every tick, beside the others' heartbeats.
        conn.query_drop("DELETE FROM outbox_fleet_member WHERE expires_at < NOW(3) - INTERVAL 1 HOUR")?;
        *pool = Some(p.clone());
        Ok(p)
    }

    /// One round: heartbeat, split, claim or renew this relay's part, read every holder.
    /// `release` is called with the shards this relay holds and should no longer serve, before
    /// their holds are given up (so their relays stop first).
    pub fn tick(
        &self,
        base: &Config,
        keys: &BTreeSet<String>,
        release: impl FnOnce(&BTreeSet<String>),
    ) -> Result<Holding> {
        match self.round(base, keys, release) {
            Ok(h) => {
                if self.problem.lock().clear() {
                    log::info!(
                        "fleet coordination: {} answers again",
                        crate::config::redact_url(&self.url)
                    );
                }
                let unowned = keys.iter().filter(|k| !h.owners.contains_key(*k)).count();
                *self.last.lock() = Some((h.members, unowned));
                Ok(h)
            }
            Err(e) => {
                *self.pool.lock() = None;
                self.ensured.lock().clear();
                let why = format!(
                    "cannot reach the coordination database {}: {e}",
                    crate::config::redact_url(&self.url)
                );
                if self.problem.lock().fail(why.clone()) {
                    log::warn!("fleet coordination: {why}; the shards held go on being relayed, none is taken over");
                }
                Err(e)
            }
        }
    }

    fn round(
        &self,
        base: &Config,
        keys: &BTreeSet<String>,
        release: impl FnOnce(&BTreeSet<String>),
    ) -> Result<Holding> {
        let pool = self.pool(base)?;
        let mut conn = pool.get_conn()?;
        let lease_us = self.lease.as_micros() as u64;
        let view = view_of(keys);
        conn.exec_drop(
            "INSERT INTO outbox_fleet_member (instance, view, expires_at) VALUES (?, ?, NOW(3) + INTERVAL ? MICROSECOND) \
             ON DUPLICATE KEY UPDATE view = VALUES(view), expires_at = VALUES(expires_at)",
            (&self.me, &view, lease_us),
        )?;
        let mut members: BTreeSet<String> = conn
            .exec::<String, _, _>(
                "SELECT instance FROM outbox_fleet_member WHERE view = ? AND expires_at > NOW(3)",
                (&view,),
            )?
            .into_iter()
            .collect();
        members.insert(self.me.clone());
        let split = assign(keys, &members);
        let wanted: Vec<&str> = split
            .iter()
            .filter(|(_, m)| **m == self.me.as_str())
            .map(|(k, _)| *k)
            .collect();

        let missing: Vec<&String> = {
            let ensured = self.ensured.lock();
            keys.iter().filter(|k| !ensured.contains(*k)).collect()
        };
        if !missing.is_empty() {
            let sql = format!(
                "INSERT IGNORE INTO outbox_fleet_shard (shard, owner, lease_until) VALUES {}",
                vec!["(?, '', NOW(3))"; missing.len()].join(", ")
            );
            conn.exec_drop(sql, missing.iter().map(|k| Value::from(k.as_str())).collect::<Vec<_>>())?;
            self.ensured.lock().extend(missing.into_iter().cloned());
        }

        if !wanted.is_empty() {
            // `takes` first: an UPDATE's later assignments see the earlier ones' new values.
            let sql = format!(
                "UPDATE outbox_fleet_shard SET takes = takes + (owner <> ?), owner = ?, \
                 lease_until = NOW(3) + INTERVAL ? MICROSECOND \
                 WHERE shard IN ({}) AND (owner = ? OR lease_until <= NOW(3))",
                placeholders(wanted.len())
            );
            let mut params: Vec<Value> = vec![self.me.as_str().into(), self.me.as_str().into(), lease_us.into()];
            params.extend(wanted.iter().map(|k| Value::from(*k)));
            params.push(self.me.as_str().into());
            conn.exec_drop(sql, params)?;
        }

        let held: BTreeSet<String> = conn
            .exec::<String, _, _>(
                "SELECT shard FROM outbox_fleet_shard WHERE owner = ? AND lease_until > NOW(3)",
                (&self.me,),
            )?
            .into_iter()
            .collect();
        let wanted: BTreeSet<&str> = wanted.into_iter().collect();
        let letting_go: BTreeSet<String> = held.iter().filter(|k| !wanted.contains(k.as_str())).cloned().collect();
        if !letting_go.is_empty() {
            release(&letting_go);
            let sql = format!(
                "UPDATE outbox_fleet_shard SET owner = '', lease_until = NOW(3) WHERE owner = ? AND shard IN ({})",
                placeholders(letting_go.len())
            );
            let mut params: Vec<Value> = vec![self.me.as_str().into()];
            params.extend(letting_go.iter().map(|k| Value::from(k.as_str())));
            conn.exec_drop(sql, params)?;
            log::info!(
                "fleet coordination: handed over {} shard(s): {letting_go:?}",
                letting_go.len()
            );
        }

        let owners: BTreeMap<String, String> = if keys.is_empty() {
            BTreeMap::new()
        } else {
            let sql = format!(
                "SELECT shard, owner FROM outbox_fleet_shard WHERE owner <> '' AND lease_until > NOW(3) AND shard IN ({})",
                placeholders(keys.len())
            );
            conn.exec::<(String, String), _, _>(sql, keys.iter().map(|k| Value::from(k.as_str())).collect::<Vec<_>>())?
                .into_iter()
                .collect()
        };
        let mine = owners
            .iter()
            .filter(|(_, o)| **o == self.me)
            .map(|(k, _)| k.clone())
            .collect();
        Ok(Holding {
            mine,
            owners,
            members: members.len(),
        })
    }

    /// Gives up every hold of this relay and its heartbeat, so the others take its shards over at
    /// their next tick instead of after the lease. Its relays must have stopped first.
    pub fn leave(&self, base: &Config) {
        let result = self.pool(base).and_then(|pool| {
            let mut conn = pool.get_conn()?;
            conn.exec_drop(
                "UPDATE outbox_fleet_shard SET owner = '', lease_until = NOW(3) WHERE owner = ?",
                (&self.me,),
            )?;
            conn.exec_drop("DELETE FROM outbox_fleet_member WHERE instance = ?", (&self.me,))?;
            Ok(())
        });
        match result {
            Ok(()) => log::info!("fleet coordination: {} left; its shards are free", self.me),
            Err(e) => log::warn!(
                "fleet coordination: {} could not give up its shards ({e}); the others take them over when the lease runs out",
                self.me
            ),
        }
    }
}

/// Each of `keys`' holder with a hold still running, read from the coordination database at
/// `url` (for `outboxd status`; no table yet: nobody holds anything).
pub(super) fn holders(config: &Config, url: &str, keys: &[String]) -> Result<BTreeMap<String, String>> {
    let pool = crate::db::connect_one(config, "shard.coordination.url", url)?;
    let mut conn = pool.get_conn()?;
    let exists: Option<u8> = conn.query_first(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'outbox_fleet_shard'",
    )?;
    if exists.is_none() || keys.is_empty() {
        return Ok(BTreeMap::new());
    }
    let sql = format!(
        "SELECT shard, owner FROM outbox_fleet_shard WHERE owner <> '' AND lease_until > NOW(3) AND shard IN ({})",
        placeholders(keys.len())
    );
    Ok(conn
        .exec::<(String, String), _, _>(sql, keys.iter().map(|k| Value::from(k.as_str())).collect::<Vec<_>>())?
        .into_iter()
        .collect())
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: impl IntoIterator<Item = String>) -> BTreeSet<String> {
        items.into_iter().collect()
    }

    #[test]
    fn every_shard_goes_to_one_member_within_the_bound() {
        let keys = set((0..64).map(|i| format!("db:3306/orders_{i:02}.t_event_record")));
        let members = set(["a-1-x".into(), "b-2-y".into(), "c-3-z".into()]);
        let split = assign(&keys, &members);
        assert_eq!(split.len(), 64);
        for m in &members {
            let n = split.values().filter(|v| **v == m.as_str()).count();
            // At most ⌈64 / 3⌉; the last to fill gets what is left.
            assert!((20..=22).contains(&n), "{m} got {n}");
        }
    }

    #[test]
    fn a_member_leaving_moves_its_own_shards_and_few_others() {
        let keys = set((0..64).map(|i| format!("db:3306/orders_{i:02}.t")));
        let three = set(["a".into(), "b".into(), "c".into()]);
        let two = set(["a".into(), "b".into()]);
        let before = assign(&keys, &three);
        let after = assign(&keys, &two);
        let moved = keys
            .iter()
            .filter(|k| before[k.as_str()] != "c" && before[k.as_str()] != after[k.as_str()])
            .count();
        assert!(moved <= 8, "{moved} shards of the staying members moved");
        assert!(after.values().all(|m| *m != "c"));
    }

    #[test]
    fn the_split_is_the_same_whatever_the_order_given() {
        let keys = set((0..10).map(|i| format!("k{i}")));
        let m1 = set(["x".into(), "y".into()]);
        let m2 = set(["y".into(), "x".into()]);
        assert_eq!(assign(&keys, &m1), assign(&keys, &m2));
        assert_eq!(view_of(&keys), view_of(&keys.clone()));
    }

    #[test]
    fn long_keys_are_cut_and_told_apart() {
        let spec = |db: &str| ShardSpec {
            name: db.into(),
            url: format!("mysql://u@h:3306/{db}"),
            table: "t".repeat(64),
        };
        let a = shard_key(&spec(&"a".repeat(250)));
        let b = shard_key(&spec(&format!("{}b", "a".repeat(249))));
        assert!(a.chars().count() <= KEY_MAX);
        assert_ne!(a, b);
        assert_eq!(
            shard_key(&spec("orders_1")),
            format!("h:3306/orders_1.{}", "t".repeat(64))
        );
    }
}
