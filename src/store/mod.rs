//! Every statement the relay runs against the outbox table (the producing half's SQL; values go
//! in as literals built by `crate::sql`). The caller-facing INSERT is a constant prepared
//! statement.

mod held;
mod lease;

pub use held::{decode_ids, encode_ids, HeldClaim, Outcomes, Recovered, Settled, JOURNAL_GRACE};

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Pool, PooledConn, Row, TxOpts};

use crate::config::{Backoff, BackoffPolicy, Config, SentRows};
use crate::error::Result;
use crate::event::{parse_headers, EventId, NewEvent, OutboundEvent};
use crate::protocol::{self, Guard, GuardContext, Transition};
use crate::sql::{id_list, lit, opt_lit};

/// Status values, as stored.
pub mod status {
    pub const WAIT: &str = "WAIT";
    pub const SENDING: &str = "SENDING";
    pub const SUCCESS: &str = "SUCCESS";
    pub const FAIL: &str = "FAIL";
}

/// Longest `last_error` stored (the column is `VARCHAR(1024)`).
const MAX_ERROR_CHARS: usize = 1000;

/// The INSERT of one event into `table`, due at once, with its parameters in this order:
/// `biz_no, event_type, payload, topic, tag, headers` (all but the first three may be NULL;
/// headers is a JSON object of strings): [`INSERT_PARAMS`]. Its times come from the table's
/// defaults (`next_retry_time` is `CURRENT_TIMESTAMP(3)`: due now, by the database's clock) and
/// the event key from `UUID()` (every copy of the event carries it, and a held round sends the
/// row without writing to it). A scheduled event takes [`insert_scheduled_statement`] instead:
/// the due time's expression is a measurable share of the server's work for the INSERT
/// (benches/README.md, "What we cost the order database"), so an event due now does not
/// evaluate it. The table name is checked like the `table` key, since it goes
/// into the SQL text.
pub fn insert_statement(table: &str) -> std::result::Result<String, crate::error::ConfigError> {
    let table = crate::config::table_name("table", table)?;
    Ok(format!(
        "INSERT INTO {table} (biz_no, event_type, payload, topic, tag, headers, status, retry_count, event_key) \
         VALUES (?, ?, ?, ?, ?, ?, 'WAIT', 0, UUID())"
    ))
}

/// The INSERT of one scheduled event into `table`: the parameters of [`insert_statement`] and
/// then `deliver_at_ms, delay_ms` ([`INSERT_SCHEDULED_PARAMS`]): a time in milliseconds since the
/// Unix epoch, or a delay from the INSERT, one of them set ([`crate::Schedule::params`]). The
/// database's clock decides when the event is due (`next_retry_time`; a time already past is
/// now).
pub fn insert_scheduled_statement(table: &str) -> std::result::Result<String, crate::error::ConfigError> {
    let table = crate::config::table_name("table", table)?;
    Ok(format!(
        "INSERT INTO {table} (biz_no, event_type, payload, topic, tag, headers, status, retry_count, event_key, next_retry_time) \
         VALUES (?, ?, ?, ?, ?, ?, 'WAIT', 0, UUID(), {SCHEDULED_DUE})"
    ))
}

/// The due time of a new row from the `deliver_at_ms` and `delay_ms` parameters.
const SCHEDULED_DUE: &str =
    "GREATEST(NOW(3), COALESCE(FROM_UNIXTIME(? / 1000), NOW(3) + INTERVAL IFNULL(?, 0) * 1000 MICROSECOND))";

/// The parameter names of [`insert_statement`], in order.
pub const INSERT_PARAMS: &[&str] = &["biz_no", "event_type", "payload", "topic", "tag", "headers"];

/// The parameter names of [`insert_scheduled_statement`], in order: those of
/// [`insert_statement`], then the schedule's two.
pub const INSERT_SCHEDULED_PARAMS: &[&str] = &[
    "biz_no",
    "event_type",
    "payload",
    "topic",
    "tag",
    "headers",
    "deliver_at_ms",
    "delay_ms",
];

/// The expression of [`Store::first_wait_in`] over `table` (a name, or `db`.`table` quoted with
/// `sql::ident`): microseconds from now until its first WAIT row is due, NULL when none
/// waits. The fleet's watch reads many shards' at once with it.
pub fn first_wait_in_sql(table: &str) -> String {
    format!(
        "TIMESTAMPDIFF(MICROSECOND, NOW(3), (SELECT next_retry_time FROM {table} FORCE INDEX (idx_status_next_retry) \
         WHERE status = 'WAIT' ORDER BY next_retry_time LIMIT 1))"
    )
}

/// One claimed row and the claim that owns it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub event: OutboundEvent,
    pub token: u64,
    /// How long the row had existed when it was claimed (DB clock): the start of its
    /// commit-to-ack latency.
    pub age: Duration,
}

/// A dead-lettered event, as handed to the dead-letter callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: EventId,
    pub biz_no: String,
    pub event_type: String,
    /// Attempts made, counting the last one.
    pub retry_count: u32,
    pub last_error: String,
}

/// A row returned to WAIT (or FAIL) by the reclaimer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub returned: u64,
    pub dead: Vec<DeadLetter>,
}

/// Result of one claim round.
#[derive(Debug, Default)]
pub struct ClaimRound {
    pub claimed: Vec<Claimed>,
    /// Candidates another instance took first (per-row strategy only).
    pub conflicts: u64,
    /// Where the round's scan ended in `idx_status_next_retry` order (the last candidate).
    pub last: Option<ScanPosition>,
    /// Ordered claims: the lengths of the key runs `claimed` is made of, in order (one key's
    /// events in id order per run). Empty for unordered claims.
    pub runs: Vec<usize>,
    /// Ordered claims: candidates left WAIT because an earlier event of their key is pending.
    pub blocked: u64,
    /// Ordered claims: of the blocked candidates, those whose key's oldest pending event is not
    /// in flight (waiting out a backoff or a park, or dead-lettered with the block policy): they
    /// stay blocked for a while, unlike the keys of runs in flight.
    pub stuck: u64,
    /// Ordered claims: the distinct keys of the stuck candidates.
    pub stuck_keys: u64,
    /// Ordered claims: of those keys, the ones whose oldest pending event is dead-lettered (FAIL,
    /// with `ordering.dead.head = block`): they wait until it is replayed or resolved by hand.
    pub dead_heads: u64,
}

/// A place in the scan order `(next_retry_time, id)`. A round that starts after it skips the
/// index entries of the rows claimed before it: entries their claims delete-marked, which the
/// scan would otherwise walk over (and look up) until the server purges them, round after round
/// of a long drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPosition {
    /// `next_retry_time` as the server printed it (`YYYY-MM-DD hh:mm:ss.fff`); empty for
    /// [`ScanPosition::recent`].
    due: String,
    id: EventId,
    /// [`ScanPosition::recent`]: rows that became due within this many microseconds.
    recent_us: Option<u128>,
}

impl ScanPosition {
    /// Checks the text is a plain DATETIME literal before it ever reaches SQL.
    fn new(due: String, id: EventId) -> Option<ScanPosition> {
        let plain = !due.is_empty()
            && due.len() <= 26
            && due
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b':' | b' ' | b'.'));
        plain.then_some(ScanPosition {
            due,
            id,
            recent_us: None,
        })
    }

    /// The rows that became due within `window` (by the database's clock): a scan starting here
    /// reads the end of the due range only, where scheduled events that just came due and fresh
    /// commits are, ahead of an older backlog.
    pub fn recent(window: Duration) -> ScanPosition {
        ScanPosition {
            due: String::new(),
            id: 0,
            recent_us: Some(window.as_micros()),
        }
    }

    /// This position, limited to the rows that became due within `window`: a recent round that
    /// goes on from where the last one ended, reading no entry twice.
    pub fn within(mut self, window: Duration) -> ScanPosition {
        self.recent_us = Some(window.as_micros());
        self
    }

    /// The scan condition "strictly after this position", in a form the range optimizer turns
    /// into two ranges of `idx_status_next_retry` (its columns plus the primary key).
    fn sql(&self) -> String {
        let recent = self
            .recent_us
            .map(|us| format!(" AND next_retry_time > NOW(3) - INTERVAL {us} MICROSECOND"))
            .unwrap_or_default();
        if self.due.is_empty() {
            return recent;
        }
        recent
            + &format!(
                " AND (next_retry_time > TIMESTAMP'{due}' OR (next_retry_time = TIMESTAMP'{due}' AND id > {id}))",
                due = self.due,
                id = self.id
            )
    }
}

/// Database gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gauges {
    pub wait: u64,
    pub sending: u64,
    pub fail: u64,
    /// How long the most overdue due WAIT row has been due (0 when none is due).
    pub oldest_wait_age: Duration,
}

/// The outbox table as the relay sees it.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    table: String,
    owner: String,
    default_topic: String,
    max_retry: u32,
    backoff_sql: String,
    /// `ordering = per-biz-no`: the statuses that hold back a key's later events (per the
    /// dead-head policy).
    blocking: &'static str,
    /// Ordered claims: keys' oldest pending rows (heads) found not yet due, and when they are:
    /// not read again before then (see [`crate::ordering`], "Heads behind the window").
    heads_not_due: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<EventId, std::time::Instant>>>,
    /// Held rounds' connections (`claim.strategy = held`): sessions whose `wait_timeout` is the
    /// lease. `None`: from `pool`, the timeout set per round.
    held_pool: Option<Pool>,
    lease: Duration,
    sent_rows: SentRows,
    /// The server refused a DELETE of sent rows (no privilege): they are kept from then on.
    delete_refused: Arc<AtomicBool>,
}

/// Most heads [`Store`] remembers as not due; beyond it the memory is dropped (they are read
/// again, which is only a statement).
const MAX_HEADS_NOT_DUE: usize = 100_000;

/// Longest a head found not due is left unread (its `next_retry_time` may be changed by hand).
const HEAD_RECHECK: Duration = Duration::from_secs(30);

impl Store {
    pub fn new(pool: Pool, config: &Config, owner: String) -> Store {
        Store {
            pool,
            table: config.table.clone(),
            owner,
            default_topic: config.topic.clone(),
            max_retry: config.max_retry,
            backoff_sql: backoff_sql(&config.backoff),
            blocking: crate::ordering::blocking_statuses(config.ordering_dead_head),
            heads_not_due: Default::default(),
            held_pool: None,
            lease: config.lease,
            sent_rows: config.sent_rows,
            delete_refused: Default::default(),
        }
    }

    /// Held rounds take their connections from `pool` (see [`crate::db::connect_held`]).
    pub fn with_held_pool(mut self, pool: Pool) -> Store {
        self.held_pool = Some(pool);
        self
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    fn conn(&self) -> Result<PooledConn> {
        Ok(self.pool.get_conn()?)
    }

    /// How many columns [`Store::columns`] lists.
    const COLUMNS: usize = 12;

    fn columns() -> &'static str {
        "id, biz_no, event_type, payload, topic, tag, headers, retry_count, \
         GREATEST(0, TIMESTAMPDIFF(MICROSECOND, create_time, NOW(3))) AS age_us, next_retry_time, event_key, \
         CAST(UNIX_TIMESTAMP(create_time) * 1000 AS UNSIGNED) AS created_ms"
    }

    /// Decodes the scan's rows; also returns the scan position of the last one, and the rows
    /// that had no event key (each given a new one here, stored by the claim: [`key_assignments`]).
    fn events_from_rows(&self, rows: Vec<Row>) -> Scanned {
        let mut last = None;
        let mut new_keys = HashSet::new();
        let events = rows
            .into_iter()
            .map(|row| {
                let (event, age, due, new_key) = self.event_from_row(row);
                last = due.map(|d| (d, event.id));
                if new_key {
                    new_keys.insert(event.id);
                }
                (event, age)
            })
            .collect();
        Scanned {
            events,
            last: last.and_then(|(due, id)| ScanPosition::new(due, id)),
            new_keys,
        }
    }

    /// One row of [`Store::columns`] (and whatever follows them): the event, its age, its
    /// `next_retry_time` as text, and whether its key is new (the row had none).
    fn event_from_row(&self, mut row: Row) -> (OutboundEvent, Duration, Option<String>, bool) {
        fn col<T: mysql::prelude::FromValue>(row: &mut Row, i: usize) -> T {
            row.take(i)
                .unwrap_or_else(|| panic!("scan column {i} missing or of another type"))
        }
        let id: u64 = col(&mut row, 0);
        let biz_no: String = col(&mut row, 1);
        let event_type: String = col(&mut row, 2);
        let payload: Vec<u8> = col(&mut row, 3);
        let topic: Option<String> = col(&mut row, 4);
        let tag: Option<String> = col(&mut row, 5);
        let headers: Option<String> = col(&mut row, 6);
        let retry_count: u32 = col(&mut row, 7);
        let age_us: u64 = col(&mut row, 8);
        let due: Option<String> = col(&mut row, 9);
        let stored_key: Option<String> = col(&mut row, 10);
        let created_ms: Option<u64> = col(&mut row, 11);
        let new_key = stored_key.as_deref().is_none_or(str::is_empty);
        let event = OutboundEvent {
            id,
            key: match stored_key {
                Some(k) if !k.is_empty() => k,
                _ => crate::event::new_event_key(),
            },
            biz_no,
            event_type,
            payload,
            topic: topic
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| self.default_topic.clone()),
            tag: tag.filter(|t| !t.is_empty()),
            headers: parse_headers(id, headers.as_deref()),
            attempt: retry_count,
            created_ms: created_ms.unwrap_or(0),
        };
        (event, Duration::from_micros(age_us), due, new_key)
    }

    /// How long until the next WAIT row not yet due becomes due (a scheduled event, a backoff, a
    /// park), by the database's clock: `None` when there is none. One read of the first entry of
    /// `idx_status_next_retry` past `NOW(3)`.
    /// When the first WAIT row is due, from now by the database's clock: `None` when no row
    /// waits, zero or less when one is due now. One read of the head of `idx_status_next_retry`,
    /// no lock and no transaction: what an idle scanner asks before it opens a claim round.
    pub fn first_wait_in(&self) -> Result<Option<i64>> {
        let us: Option<Option<i64>> = self
            .conn()?
            .query_first(format!("SELECT {}", first_wait_in_sql(&self.table)))?;
        Ok(us.flatten())
    }

    pub fn next_due_in(&self) -> Result<Option<Duration>> {
        let us: Option<Option<i64>> = self.conn()?.query_first(format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, NOW(3), next_retry_time) FROM {} \
             WHERE status = 'WAIT' AND next_retry_time > NOW(3) ORDER BY next_retry_time LIMIT 1",
            self.table
        ))?;
        Ok(us.flatten().map(|us| Duration::from_micros(us.max(0) as u64)))
    }

    /// The scan: due WAIT rows in `idx_status_next_retry` order. With `lock`, it takes row locks
    /// and skips rows locked by other claimers. The ORDER BY follows the index exactly (its columns
    /// plus the primary key), or MariaDB would sort and lock every matching row.
    pub fn scan_sql(&self, limit: usize, lock: bool) -> String {
        self.scan_sql_after(limit, lock, None)
    }

    /// [`Store::scan_sql`] starting strictly after `after` (from the head of the index when `None`).
    pub fn scan_sql_after(&self, limit: usize, lock: bool, after: Option<&ScanPosition>) -> String {
        self.scan_sql_with(Self::columns(), limit, lock, after)
    }

    fn scan_sql_with(&self, cols: &str, limit: usize, lock: bool, after: Option<&ScanPosition>) -> String {
        format!(
            "SELECT {cols} FROM {t} FORCE INDEX (idx_status_next_retry) \
             WHERE {due}{after} \
             ORDER BY next_retry_time, id LIMIT {limit}{lock}",
            t = self.table,
            due = self.guard_sql(protocol::SCAN, 0),
            after = after.map(ScanPosition::sql).unwrap_or_default(),
            lock = if lock { " FOR UPDATE SKIP LOCKED" } else { "" },
        )
    }

    /// The ordered claim's reads besides the scan, for plans and tests: the head read for `keys`
    /// and the run read for `(key, head id, last candidate id)` ranges.
    pub fn ordered_sql(&self, keys: &[&str], ranges: &[(&str, EventId, EventId)]) -> (String, String) {
        let statuses = self.blocking;
        let keys: Vec<String> = keys.iter().map(|k| lit(k)).collect();
        let ranges: Vec<(String, EventId, EventId)> = ranges.iter().map(|(k, a, b)| (lit(k), *a, *b)).collect();
        (
            crate::ordering::head_sql(&self.table, statuses, &keys),
            crate::ordering::run_sql(&self.table, statuses, &ranges),
        )
    }

    /// Claims, in one short transaction, the runs of keys whose oldest pending event is among
    /// the first `limit` due rows, each run at most `run_max` long (see [`crate::ordering`]).
    /// At most one run per key is ever in flight: a key whose oldest pending row is SENDING (or
    /// not due, or FAIL with `ordering.dead.head = block`) has none of its rows claimed.
    pub fn claim_ordered(&self, limit: usize, run_max: usize) -> Result<ClaimRound> {
        self.claim_ordered_after(limit, run_max, None)
    }

    /// [`Store::claim_ordered`] with candidates strictly after `after` in scan order (from the
    /// head when `None`): how the scanner walks past keys that stay blocked.
    pub fn claim_ordered_after(
        &self,
        limit: usize,
        run_max: usize,
        after: Option<&ScanPosition>,
    ) -> Result<ClaimRound> {
        use crate::ordering::{claimable_heads, runs, Candidate, KEY_IDENTITY_SQL};
        use std::collections::HashMap;
        let statuses = self.blocking;
        let token = new_token();
        let mut conn = self.conn()?;
        let mut tx = conn.start_transaction(TxOpts::default())?;
        let cols = format!("{}, {KEY_IDENTITY_SQL}", Self::columns());
        let mut rows: Vec<Row> = tx.query(self.scan_sql_with(&cols, limit, true, after))?;
        if rows.is_empty() {
            tx.commit()?;
            return Ok(ClaimRound::default());
        }
        let key_col = Self::COLUMNS;
        let keys: Vec<Vec<u8>> = rows
            .iter_mut()
            .map(|r| r.take::<Vec<u8>, _>(key_col).unwrap_or_default())
            .collect();
        let Scanned {
            mut events,
            last,
            mut new_keys,
        } = self.events_from_rows(rows);
        let mut candidates: Vec<Candidate> = events
            .iter()
            .zip(keys)
            .enumerate()
            .map(|(pos, ((e, _), key))| Candidate { pos, id: e.id, key })
            .collect();
        // The smallest pending id of each candidate key (one literal per distinct key).
        let mut seen = HashSet::new();
        let key_lits: Vec<String> = candidates
            .iter()
            .filter(|c| seen.insert(c.key.clone()))
            .map(|c| lit(&events[c.pos].0.biz_no))
            .collect();
        // Per key: its oldest pending id, and that row's status.
        let mut oldest: HashMap<Vec<u8>, (EventId, String)> = HashMap::new();
        let head_rows: Vec<(Vec<u8>, String, EventId)> =
            tx.query(crate::ordering::head_sql(&self.table, statuses, &key_lits))?;
        for (key, status, min) in head_rows {
            match oldest.get_mut(&key) {
                Some(e) if e.0 <= min => {}
                Some(e) => *e = (min, status),
                None => {
                    oldest.insert(key, (min, status));
                }
            }
        }
        // Heads that are WAIT but not candidates (behind the window, or not due): read them by
        // id; a due one becomes a candidate, one still waiting is not read again until it is due.
        let in_window: HashSet<EventId> = candidates.iter().map(|c| c.id).collect();
        let behind: Vec<EventId> = {
            let now = std::time::Instant::now();
            let mut not_due = self.heads_not_due.lock();
            not_due.retain(|_, until| *until > now);
            let mut ids: Vec<EventId> = oldest
                .values()
                .filter(|(id, st)| st == status::WAIT && !in_window.contains(id) && !not_due.contains_key(id))
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable();
            ids
        };
        if !behind.is_empty() {
            let pulled: Vec<Row> = tx.query(crate::ordering::heads_behind_sql(&self.table, &cols, &behind))?;
            let now = std::time::Instant::now();
            for mut row in pulled {
                let wait_us: u64 = row.take(key_col + 1).unwrap_or(0);
                if wait_us > 0 {
                    let id: EventId = row.get(0).unwrap_or(0);
                    let mut not_due = self.heads_not_due.lock();
                    if not_due.len() >= MAX_HEADS_NOT_DUE {
                        not_due.clear();
                    }
                    // At most HEAD_RECHECK: a head made due by hand is seen within it.
                    not_due.insert(id, now + Duration::from_micros(wait_us).min(HEAD_RECHECK));
                    continue;
                }
                let key = row.take::<Vec<u8>, _>(key_col).unwrap_or_default();
                let head = self.events_from_rows(vec![row]);
                new_keys.extend(head.new_keys);
                for event in head.events {
                    candidates.push(Candidate {
                        pos: events.len(),
                        id: event.0.id,
                        key: key.clone(),
                    });
                    events.push(event);
                }
            }
        }
        let heads: HashMap<Vec<u8>, EventId> = oldest.iter().map(|(k, v)| (k.clone(), v.0)).collect();
        let claimable = claimable_heads(&candidates, &heads);
        // The pending ids between head and last candidate, for keys with more than one candidate.
        let ranges: Vec<(String, EventId, EventId)> = claimable
            .iter()
            .filter(|h| h.positions.len() > 1)
            .map(|h| (lit(&events[h.positions[0]].0.biz_no), h.first, h.last))
            .collect();
        let mut pending: HashMap<Vec<u8>, Vec<EventId>> = HashMap::new();
        if !ranges.is_empty() {
            let run_rows: Vec<(Vec<u8>, EventId)> =
                tx.query(crate::ordering::run_sql(&self.table, statuses, &ranges))?;
            for (key, id) in run_rows {
                pending.entry(key).or_default().push(id);
            }
        }
        let runs = runs(&claimable, &candidates, &pending, run_max);
        let claimed_n: usize = runs.iter().map(Vec::len).sum();
        let blocked = (candidates.len() - claimed_n) as u64;
        let in_run: HashSet<usize> = runs.iter().flatten().copied().collect();
        let stuck_of: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| !in_run.contains(&c.pos) && oldest.get(&c.key).is_none_or(|h| h.1 != status::SENDING))
            .collect();
        let stuck = stuck_of.len() as u64;
        let stuck_key_set: HashSet<&Vec<u8>> = stuck_of.iter().map(|c| &c.key).collect();
        let stuck_keys = stuck_key_set.len() as u64;
        let dead_heads = stuck_key_set
            .iter()
            .filter(|k| oldest.get(**k).is_some_and(|h| h.1 == status::FAIL))
            .count() as u64;
        if claimed_n == 0 {
            tx.commit()?;
            return Ok(ClaimRound {
                last,
                blocked,
                stuck,
                stuck_keys,
                dead_heads,
                ..ClaimRound::default()
            });
        }
        let claimed_ids: HashSet<EventId> = runs.iter().flatten().map(|&pos| events[pos].0.id).collect();
        tx.query_drop(format!(
            "UPDATE {t} SET {claim}{keys} WHERE id IN ({ids})",
            t = self.table,
            claim = self.lease_claim(token),
            keys = key_assignments(events.iter().map(|(e, _)| e), &new_keys, |id| claimed_ids.contains(&id)),
            ids = id_list(runs.iter().flatten().map(|&pos| events[pos].0.id)),
        ))?;
        tx.commit()?;
        let mut slots: Vec<Option<(OutboundEvent, Duration)>> = events.into_iter().map(Some).collect();
        let mut claimed = Vec::with_capacity(claimed_n);
        let mut lengths = Vec::with_capacity(runs.len());
        for run in &runs {
            lengths.push(run.len());
            for &pos in run {
                let (event, age) = slots[pos].take().expect("a row is in one run");
                claimed.push(Claimed { event, token, age });
            }
        }
        Ok(ClaimRound {
            claimed,
            conflicts: 0,
            last,
            runs: lengths,
            blocked,
            stuck,
            stuck_keys,
            dead_heads,
        })
    }

    /// The assignments of a lease claim under `token`. A SENDING row's `next_retry_time` is its
    /// lease's end (renewed with it), so the reclaim walks `idx_status_next_retry` like the scan
    /// and the table needs no index of its own for leases.
    fn lease_claim(&self, token: u64) -> String {
        protocol_set(
            &protocol::LEASE_CLAIM,
            &format!(
                "claim_owner = {owner}, claim_token = {token}, claimed_at = NOW(3), {end}",
                owner = lit(&self.owner),
                end = self.lease_end(),
            ),
        )
    }

    /// `next_retry_time` at the end of a lease taken or renewed now.
    fn lease_end(&self) -> String {
        format!(
            "next_retry_time = NOW(3) + INTERVAL {} MICROSECOND",
            self.lease.as_micros()
        )
    }

    /// The reclaim's candidates: SENDING rows whose lease has expired, along
    /// `idx_status_next_retry` (a SENDING row's `next_retry_time` is its lease's end), stopping at
    /// the first lease still running. `claimed_at` decides: a row claimed by a relay that does not
    /// move `next_retry_time` (the seed's publisher beside this one) is in the range from its claim
    /// on, and is taken only once its lease has expired by `claimed_at`.
    ///
    /// A plain read, no lock: a locking read of this range locks the first index entry past it
    /// too (the oldest due WAIT row, when no lease has expired) until its transaction ends, and a
    /// claim running meanwhile skips that row. [`Store::reclaim_lock_sql`] then locks the
    /// candidates by primary key.
    pub fn reclaim_sql(&self, limit: usize) -> String {
        format!(
            "SELECT id FROM {t} FORCE INDEX (idx_status_next_retry) \
             WHERE {expired} \
             ORDER BY next_retry_time, id LIMIT {limit}",
            t = self.table,
            expired = self.guard_sql(protocol::RECLAIM.guard, 0),
        )
    }

    /// Locks the reclaim's candidates that still hold an expired lease, by primary key (only
    /// those rows), skipping any another transaction holds.
    pub fn reclaim_lock_sql(&self, ids: &[EventId]) -> String {
        format!(
            "SELECT id, biz_no, event_type, retry_count, claim_owner FROM {t} FORCE INDEX (PRIMARY) \
             WHERE id IN ({ids}) AND {expired} ORDER BY id FOR UPDATE SKIP LOCKED",
            t = self.table,
            ids = id_list(ids.iter().copied()),
            expired = self.guard_sql(protocol::RECLAIM.guard, 0),
        )
    }

    /// Claims up to `limit` due rows in one short transaction with `FOR UPDATE SKIP LOCKED`.
    /// The ORDER BY follows `idx_status_next_retry` exactly (`(status, next_retry_time)` plus the
    /// primary key), so only the rows returned are locked, and instances never wait on each other.
    pub fn claim_skip_locked(&self, limit: usize) -> Result<ClaimRound> {
        self.claim_skip_locked_after(limit, None)
    }

    /// [`Store::claim_skip_locked`], scanning strictly after `after`: the next round of a drain.
    /// Rows that become due behind the position are not seen by such a round; a round from the
    /// head (`None`) finds them.
    pub fn claim_skip_locked_after(&self, limit: usize, after: Option<&ScanPosition>) -> Result<ClaimRound> {
        let token = new_token();
        let mut conn = self.conn()?;
        let mut tx = conn.start_transaction(TxOpts::default())?;
        let rows: Vec<Row> = tx.query(self.scan_sql_after(limit, true, after))?;
        if rows.is_empty() {
            tx.commit()?;
            return Ok(ClaimRound::default());
        }
        let Scanned { events, last, new_keys } = self.events_from_rows(rows);
        tx.query_drop(format!(
            "UPDATE {t} SET {claim}{keys} WHERE id IN ({ids})",
            t = self.table,
            claim = self.lease_claim(token),
            keys = key_assignments(events.iter().map(|(e, _)| e), &new_keys, |_| true),
            ids = id_list(events.iter().map(|(e, _)| e.id)),
        ))?;
        tx.commit()?;
        Ok(ClaimRound {
            claimed: events
                .into_iter()
                .map(|(event, age)| Claimed { event, token, age })
                .collect(),
            conflicts: 0,
            last,
            ..ClaimRound::default()
        })
    }

    /// The seed's claim: a lock-free candidate SELECT, then one conditional UPDATE per row.
    /// Ownership is decided by the affected-row count alone. The UPDATE also matches the
    /// candidate's `retry_count`, so the attempt number the relay acts on is never stale.
    pub fn claim_per_row(&self, limit: usize) -> Result<ClaimRound> {
        let token = new_token();
        let mut conn = self.conn()?;
        let rows: Vec<Row> = conn.query(self.scan_sql(limit, false))?;
        let Scanned { events, last, new_keys } = self.events_from_rows(rows);
        let mut round = ClaimRound {
            last,
            ..ClaimRound::default()
        };
        for (event, age) in events {
            // A new key is stored only if the row still has none, so the key sent is the stored one.
            let (set_key, key_unset) = if new_keys.contains(&event.id) {
                (
                    format!(", event_key = {}", lit(&event.key)),
                    " AND (event_key IS NULL OR event_key = '')",
                )
            } else {
                (String::new(), "")
            };
            conn.query_drop(format!(
                "UPDATE {t} SET {claim}{set_key} WHERE id = {id} AND status = 'WAIT' AND retry_count = {rc}{key_unset}",
                t = self.table,
                claim = self.lease_claim(token),
                id = event.id,
                rc = event.attempt,
            ))?;
            if conn.affected_rows() == 1 {
                round.claimed.push(Claimed { event, token, age });
            } else {
                log::debug!("event {} was claimed by another instance; skipped", event.id);
                round.conflicts += 1;
            }
        }
        Ok(round)
    }

    /// Counts by status and the age of the most overdue due WAIT row.
    pub fn gauges(&self) -> Result<Gauges> {
        let mut conn = self.conn()?;
        let count = |conn: &mut PooledConn, st: &str| -> Result<u64> {
            let n: Option<u64> =
                conn.query_first(format!("SELECT COUNT(*) FROM {} WHERE status = '{st}'", self.table))?;
            Ok(n.unwrap_or(0))
        };
        let wait = count(&mut conn, status::WAIT)?;
        let sending = count(&mut conn, status::SENDING)?;
        let fail = count(&mut conn, status::FAIL)?;
        let age_us: Option<Option<i64>> = conn.query_first(format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(next_retry_time), NOW(3)) FROM {} \
             WHERE status = 'WAIT' AND next_retry_time <= NOW(3)",
            self.table
        ))?;
        let age = age_us.flatten().unwrap_or(0).max(0) as u64;
        Ok(Gauges {
            wait,
            sending,
            fail,
            oldest_wait_age: Duration::from_micros(age),
        })
    }
}

/// Inserts one event through any connection or transaction; returns its id. An event without a
/// trace context gets the caller's current one, when there is one (cargo feature `otel`).
pub(crate) fn insert<Q: Queryable>(q: &mut Q, table: &str, event: &NewEvent) -> Result<EventId> {
    let captured;
    let event = match crate::telemetry::current_trace_context() {
        Some((tp, ts)) if !event.headers.contains_key(crate::trace::TRACEPARENT) => {
            captured = event.clone().with_trace_context(tp, ts);
            &captured
        }
        _ => event,
    };
    let (biz_no, event_type, payload) = (&event.biz_no, &event.event_type, &event.payload);
    let (topic, tag, headers) = (&event.topic, &event.tag, event.headers_json());
    let result = match &event.schedule {
        None => q.exec_iter(
            insert_statement(table)?,
            (biz_no, event_type, payload, topic, tag, headers),
        )?,
        Some(schedule) => {
            let (at_ms, delay_ms) = crate::event::Schedule::params(Some(schedule));
            q.exec_iter(
                insert_scheduled_statement(table)?,
                (biz_no, event_type, payload, topic, tag, headers, at_ms, delay_ms),
            )?
        }
    };
    Ok(result.last_insert_id().unwrap_or(0))
}

/// The backoff in microseconds as a SQL expression of the row's `retry_count` before the
/// increment (so `retry_count + 1` is the attempt that just failed).
/// What a claim scan read: the events with their ages, the scan position of the last row, and the
/// ids of the rows that had no event key (their events carry a new one, for the claim to store).
struct Scanned {
    events: Vec<(OutboundEvent, Duration)>,
    last: Option<ScanPosition>,
    new_keys: HashSet<EventId>,
}

/// The claim UPDATE's `, event_key = CASE id ... END` for the rows of `new_keys` it claims
/// (`claims(id)`), or nothing. The rows are locked by the claim's scan, so nothing else sets a
/// key between the read and this write.
fn key_assignments<'a>(
    events: impl Iterator<Item = &'a OutboundEvent>,
    new_keys: &HashSet<EventId>,
    claims: impl Fn(EventId) -> bool,
) -> String {
    if new_keys.is_empty() {
        return String::new();
    }
    let mut sql = String::new();
    for e in events.filter(|e| claims(e.id) && new_keys.contains(&e.id)) {
        let _ = write!(sql, " WHEN {} THEN {}", e.id, lit(&e.key));
    }
    if sql.is_empty() {
        return sql;
    }
    format!(", event_key = CASE id{sql} ELSE event_key END")
}

impl Store {
    /// The assignments of a failed attempt, under either claim: `retry_count + 1` in SQL, the
    /// next try after the configured backoff on the DB clock, the error.
    /// (The attempt itself is the transition's: [`protocol::RETRY`], [`protocol::HELD_RETRY`].)
    fn retry_assignments(&self, error: &str) -> String {
        format!(
            "next_retry_time = NOW(3) + INTERVAL {backoff} MICROSECOND, last_error = {err}",
            backoff = self.backoff_sql,
            err = lit(&truncate(error)),
        )
    }

    /// `guard` as SQL for a statement under `token` (this instance as the owner). Guards that
    /// read no claim (the scan's, the reclaim's, a held round's: its row locks are its claim)
    /// ignore the token; callers without one pass 0.
    fn guard_sql(&self, guard: Guard, token: u64) -> String {
        guard.sql(&GuardContext {
            token,
            owner_literal: &lit(&self.owner),
            lease_us: self.lease.as_micros(),
        })
    }
}

/// A statement's SET: `rest`, then the transition's status and attempt
/// ([`Transition::set_sql`]). In that order: MariaDB assigns left to right, and a retry's backoff
/// reads `retry_count` before this attempt counts.
fn protocol_set(transition: &Transition, rest: &str) -> String {
    match (transition.set_sql(), rest) {
        (table, "") => table,
        (table, rest) if table.is_empty() => rest.to_string(),
        (table, rest) => format!("{rest}, {table}"),
    }
}

/// The assignments of rows parked without an attempt, due again after `delay`.
fn parked_assignments(reason: &str, delay: Duration) -> String {
    format!(
        "next_retry_time = NOW(3) + INTERVAL {us} MICROSECOND, last_error = {err}",
        us = delay.as_micros(),
        err = lit(&truncate(reason))
    )
}

/// The broker message id of each row: one literal when all share it, else `CASE id ... END`.
fn msg_id_sql(acks: &[(EventId, Option<String>)]) -> String {
    let first = &acks[0].1;
    if acks.iter().all(|(_, m)| m == first) {
        return opt_lit(first.as_deref());
    }
    let mut s = String::from("CASE id");
    for (id, m) in acks {
        let _ = write!(s, " WHEN {id} THEN {}", opt_lit(m.as_deref()));
    }
    s.push_str(" END");
    s
}

fn backoff_sql(b: &Backoff) -> String {
    let base = b.base.as_millis() as u64;
    let max = b.max.as_millis() as u64;
    let n = "(retry_count + 1)";
    let ms = match b.policy {
        BackoffPolicy::Fixed => format!("{base}"),
        BackoffPolicy::Quadratic => format!("{base} * {n} * {n}"),
        BackoffPolicy::Exponential => format!("{base} * POW(2, LEAST(retry_count, 62))"),
    };
    let jitter = if b.jitter > 0.0 {
        format!(" * (1 - {:.6} * RAND())", b.jitter)
    } else {
        String::new()
    };
    format!("CAST(LEAST({max}, {ms}){jitter} * 1000 AS UNSIGNED)")
}

fn new_token() -> u64 {
    // Random, non-zero, fits BIGINT UNSIGNED. A fresh token per claim fences every earlier claim.
    rand::random::<u64>() | 1
}

fn truncate(s: &str) -> String {
    s.chars().take(MAX_ERROR_CHARS).collect()
}

fn dedup_join(items: &[&str]) -> String {
    let mut v: Vec<&str> = items.to_vec();
    v.sort_unstable();
    v.dedup();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_sql_follows_the_policy() {
        let b = Backoff {
            policy: BackoffPolicy::Quadratic,
            base: Duration::from_secs(5),
            max: Duration::from_secs(600),
            jitter: 0.0,
        };
        assert_eq!(
            backoff_sql(&b),
            "CAST(LEAST(600000, 5000 * (retry_count + 1) * (retry_count + 1)) * 1000 AS UNSIGNED)"
        );
    }
}
