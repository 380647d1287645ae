//! What the console reads, and how it keeps every read cheap on a table of tens of millions of
//! rows: each statement walks an index range (`idx_status_next_retry`,
//! `idx_biz_no`, the primary key) and is bounded, by a `LIMIT` or by a window of ids. No
//! `COUNT(*)` runs over the SUCCESS rows: their number is the server's estimate, shown as such;
//! other counts stop at [`COUNT_BOUND`] and show as `100 000+`.

use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{PooledConn, Row, Value};

use crate::admin::TimeBound;
use crate::error::Result;
use crate::sql::{bytes_lit, lit};

/// Counts stop here.
pub const COUNT_BOUND: u64 = 100_000;

/// Rows of the primary key a search without a selective index looks at per page: a page that
/// finds fewer matches says which ids it searched and offers the next window.
pub const SEARCH_WINDOW: u64 = 20_000;

/// Rows of a status's range (WAIT, SENDING, FAIL) a page filtering on more than the status looks
/// at: each is a lookup by primary key, so the window bounds a page's cost when few rows match
/// (a page that finds fewer says so and offers the next window).
pub const STATUS_WINDOW: u64 = 1_000;

/// The rows of the table by status.
#[derive(Debug, Clone, Default)]
pub struct Backlog {
    pub wait_due: u64,
    /// WAIT rows not yet due after a failed attempt or a park (backing off).
    pub wait_later: u64,
    /// WAIT rows waiting for the time they were scheduled at (`docs/scheduling.md`).
    pub scheduled: u64,
    pub sending: u64,
    pub fail: u64,
    /// The server's estimate of the table's rows minus the counts above: the sent (and
    /// discarded) rows, roughly.
    pub done_estimate: Option<u64>,
    /// How long the most overdue due WAIT row has been due.
    pub oldest_due: Option<Duration>,
}

fn bounded_count(conn: &mut PooledConn, table: &str, index: &str, cond: &str) -> Result<u64> {
    let n: Option<u64> = conn.query_first(format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM {table} FORCE INDEX ({index}) WHERE {cond} LIMIT {COUNT_BOUND}) x"
    ))?;
    Ok(n.unwrap_or(0))
}

pub fn backlog(conn: &mut PooledConn, table: &str) -> Result<Backlog> {
    let ix = "idx_status_next_retry";
    let wait_due = bounded_count(conn, table, ix, "status = 'WAIT' AND next_retry_time <= NOW(3)")?;
    let not_due = bounded_count(conn, table, ix, "status = 'WAIT' AND next_retry_time > NOW(3)")?;
    let scheduled = bounded_count(conn, table, ix, crate::protocol::SCHEDULED_SQL)?;
    let wait_later = not_due.saturating_sub(scheduled);
    let sending = bounded_count(conn, table, ix, "status = 'SENDING'")?;
    let fail = bounded_count(conn, table, ix, "status = 'FAIL'")?;
    let rows: Option<Option<u64>> = conn.exec_first(
        "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        (table,),
    )?;
    let oldest: Option<i64> = conn.query_first(format!(
        "SELECT TIMESTAMPDIFF(MICROSECOND, next_retry_time, NOW(3)) FROM {table} FORCE INDEX ({ix}) \
         WHERE status = 'WAIT' AND next_retry_time <= NOW(3) ORDER BY next_retry_time, id LIMIT 1"
    ))?;
    Ok(Backlog {
        wait_due,
        wait_later,
        scheduled,
        sending,
        fail,
        done_estimate: rows
            .flatten()
            .map(|r| r.saturating_sub(wait_due + not_due + sending + fail)),
        oldest_due: oldest.map(|us| Duration::from_micros(us.max(0) as u64)),
    })
}

/// An instance holding rows SENDING: its claims now and how long its oldest has been held.
#[derive(Debug, Clone)]
pub struct Holder {
    pub owner: String,
    pub rows: u64,
    pub oldest: Duration,
}

/// Every instance holding rows of `table` now (from the rows themselves: every instance of the
/// table, wherever it runs).
pub fn holders(conn: &mut PooledConn, table: &str) -> Result<Vec<Holder>> {
    let rows: Vec<(Option<String>, u64, Option<i64>)> = conn.query(format!(
        "SELECT claim_owner, COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), NOW(3)) FROM \
         (SELECT claim_owner, claimed_at FROM {table} FORCE INDEX (idx_status_next_retry) WHERE status = 'SENDING' \
          LIMIT {COUNT_BOUND}) s GROUP BY claim_owner ORDER BY claim_owner"
    ))?;
    Ok(rows
        .into_iter()
        .map(|(owner, rows, us)| Holder {
            owner: owner.unwrap_or_else(|| "(none)".into()),
            rows,
            oldest: Duration::from_micros(us.unwrap_or(0).max(0) as u64),
        })
        .collect())
}

/// One broker of the table's topics, as the rows see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerView {
    pub broker: String,
    /// Queues of ordered topics on it (the stable queue set, `outbox_topic_queue`).
    pub queues: u64,
    /// Rows waiting because this broker was down when their send came (parked keys, ordered
    /// mode), counted up to [`COUNT_BOUND`] among the rows backing off.
    pub parked: u64,
}

/// The brokers known to the table: those of ordered topics' queue sets, and those rows are
/// parked on (the relay's breaker covers the broker side as a whole; a broker down while others
/// are up parks only its own keys). Bounded: the queue book is small, the parked rows are read
/// from the backing-off WAIT range of `idx_status_next_retry`, at most [`COUNT_BOUND`].
pub fn brokers(conn: &mut PooledConn, table: &str) -> Result<Vec<BrokerView>> {
    let mut by: std::collections::BTreeMap<String, BrokerView> = std::collections::BTreeMap::new();
    let queues: std::result::Result<Vec<(String, u64)>, mysql::Error> =
        conn.query("SELECT broker_name, COUNT(*) FROM outbox_topic_queue GROUP BY broker_name LIMIT 1000");
    for (broker, n) in queues.unwrap_or_default() {
        by.entry(broker.clone())
            .or_insert(BrokerView {
                broker,
                queues: 0,
                parked: 0,
            })
            .queues = n;
    }
    let parked: Vec<(Option<String>, u64)> = conn.query(format!(
        "SELECT SUBSTRING_INDEX(SUBSTRING(last_error, {start}), ' ', 1), COUNT(*) FROM \
         (SELECT last_error FROM {table} FORCE INDEX (idx_status_next_retry) WHERE status = 'WAIT' \
          AND next_retry_time > NOW(3) LIMIT {COUNT_BOUND}) w \
         WHERE last_error LIKE 'parked: broker %' GROUP BY 1",
        start = "parked: broker ".len() + 1
    ))?;
    for (broker, n) in parked {
        let broker = broker.unwrap_or_default();
        by.entry(broker.clone())
            .or_insert(BrokerView {
                broker,
                queues: 0,
                parked: 0,
            })
            .parked = n;
    }
    Ok(by.into_values().collect())
}

/// What the events page filters on.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub status: Option<&'static str>,
    pub topic: Option<String>,
    pub event_type: Option<String>,
    pub biz_no: Option<String>,
    /// Created at or after / before (`create_time`).
    pub since: Option<TimeBound>,
    pub until: Option<TimeBound>,
    /// A piece of `last_error`.
    pub error: Option<String>,
    /// `since`/`until` apply to `update_time` (when a dead letter failed) instead of
    /// `create_time`.
    pub by_update: bool,
    pub page: usize,
    /// Where the previous page ended.
    pub after: Option<Cursor>,
}

/// Where a page of events ends: an id (by the primary key) or a due time and id (by the status
/// index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    Id(u64),
    Due(String, u64),
}

impl Cursor {
    pub fn encode(&self) -> String {
        match self {
            Cursor::Id(id) => format!("i{id}"),
            Cursor::Due(t, id) => format!("d{t},{id}"),
        }
    }

    /// A cursor as [`Cursor::encode`] wrote it; anything else is `None`.
    pub fn decode(s: &str) -> Option<Cursor> {
        if let Some(id) = s.strip_prefix('i') {
            return id.parse().ok().map(Cursor::Id);
        }
        let (t, id) = s.strip_prefix('d')?.split_once(',')?;
        let plain = !t.is_empty() && t.len() <= 26 && t.bytes().all(|b| b.is_ascii_digit() || b" -:.".contains(&b));
        if !plain {
            return None;
        }
        id.parse().ok().map(|id| Cursor::Due(t.to_string(), id))
    }
}

/// One event in a list.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub id: u64,
    pub biz_no: String,
    pub event_type: String,
    pub status: String,
    pub retry_count: u32,
    pub topic: Option<String>,
    pub created: String,
    pub due: String,
    pub last_error: Option<String>,
}

/// A page of events.
#[derive(Debug, Clone, Default)]
pub struct EventPage {
    pub rows: Vec<EventRow>,
    /// Where the next page starts, if there may be one.
    pub next: Option<Cursor>,
    /// For a page that looked at a window of rows: which ones.
    pub searched: Option<Searched>,
}

/// The window of rows a page looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Searched {
    /// Ids `lo..=hi` of the primary key.
    Ids { lo: u64, hi: u64 },
    /// `rows` rows of a status's range, down to the due time `due`.
    Status {
        status: &'static str,
        rows: usize,
        due: String,
    },
}

const LIST_COLUMNS: &str = "id, biz_no, event_type, status, retry_count, topic, \
    DATE_FORMAT(create_time, '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(next_retry_time, '%Y-%m-%d %H:%i:%s.%f'), \
    LEFT(last_error, 200)";

fn event_row(mut r: Row) -> EventRow {
    let mut t = |i: usize| -> String {
        let s: Option<String> = r.take(i).flatten();
        let s = s.unwrap_or_default();
        s.get(..23).unwrap_or(&s).to_string()
    };
    let (created, due) = (t(6), t(7));
    EventRow {
        id: r.take(0).unwrap_or_default(),
        biz_no: r.take(1).unwrap_or_default(),
        event_type: r.take(2).unwrap_or_default(),
        status: r.take(3).unwrap_or_default(),
        retry_count: r.take(4).unwrap_or_default(),
        topic: r.take(5).unwrap_or_default(),
        created,
        due,
        last_error: r.take(8).unwrap_or_default(),
    }
}

/// The filters other than the one the chosen index serves, as conditions with parameters.
fn conditions(f: &EventFilter, params: &mut Vec<Value>, skip_status: bool, skip_biz: bool) -> String {
    let mut w = String::new();
    if let (Some(s), false) = (f.status, skip_status) {
        w.push_str(&format!(" AND status = '{s}'"));
    }
    if let (Some(b), false) = (&f.biz_no, skip_biz) {
        w.push_str(" AND biz_no = ?");
        params.push(b.as_str().into());
    }
    if let Some(t) = &f.topic {
        w.push_str(" AND topic = ?");
        params.push(t.as_str().into());
    }
    if let Some(t) = &f.event_type {
        w.push_str(" AND event_type = ?");
        params.push(t.as_str().into());
    }
    let column = if f.by_update { "update_time" } else { "create_time" };
    if let Some(s) = &f.since {
        let e = s.sql(params);
        w.push_str(&format!(" AND {column} >= {e}"));
    }
    if let Some(u) = &f.until {
        let e = u.sql(params);
        w.push_str(&format!(" AND {column} < {e}"));
    }
    if let Some(e) = &f.error {
        w.push_str(" AND INSTR(last_error, ?) > 0");
        params.push(e.as_str().into());
    }
    w
}

/// A page of the events matching `f`, newest first, by the cheapest index the filter allows:
/// a business key's rows by `idx_biz_no`; the WAIT, SENDING or FAIL rows by their range of
/// `idx_status_next_retry` (latest due first); anything else along the primary key, at most
/// [`SEARCH_WINDOW`] ids per page.
pub fn events(conn: &mut PooledConn, table: &str, f: &EventFilter) -> Result<EventPage> {
    let n = f.page.max(1);
    let mut params = Vec::new();
    if let Some(biz) = &f.biz_no {
        let mut w = format!("biz_no = {}", lit(biz));
        if let Some(s) = f.status {
            w.push_str(&format!(" AND status = '{s}'"));
        }
        if let Some(Cursor::Id(id)) = &f.after {
            w.push_str(&format!(" AND id < {id}"));
        }
        let cond = conditions(f, &mut params, true, true);
        let rows: Vec<Row> = conn.exec(
            format!(
                "SELECT {LIST_COLUMNS} FROM {table} FORCE INDEX (idx_biz_no) WHERE {w}{cond} ORDER BY id DESC LIMIT {}",
                n + 1
            ),
            params,
        )?;
        let mut rows: Vec<EventRow> = rows.into_iter().map(event_row).collect();
        let next = (rows.len() > n).then(|| Cursor::Id(rows[n - 1].id));
        rows.truncate(n);
        return Ok(EventPage {
            rows,
            next,
            searched: None,
        });
    }
    if let Some(s @ ("WAIT" | "SENDING" | "FAIL")) = f.status {
        let mut w = format!("status = '{s}'");
        if let Some(Cursor::Due(t, id)) = &f.after {
            w.push_str(&format!(
                " AND (next_retry_time < TIMESTAMP'{t}' OR (next_retry_time = TIMESTAMP'{t}' AND id < {id}))"
            ));
        }
        let cond = conditions(f, &mut params, true, false);
        if cond.is_empty() {
            // Every row of the range matches: the page reads n + 1 of them.
            let rows: Vec<Row> = conn.query(format!(
                "SELECT {LIST_COLUMNS} FROM {table} FORCE INDEX (idx_status_next_retry) WHERE {w} \
                 ORDER BY next_retry_time DESC, id DESC LIMIT {}",
                n + 1
            ))?;
            let mut rows: Vec<EventRow> = rows.into_iter().map(event_row).collect();
            let next = (rows.len() > n).then(|| Cursor::Due(rows[n - 1].due.clone(), rows[n - 1].id));
            rows.truncate(n);
            return Ok(EventPage {
                rows,
                next,
                searched: None,
            });
        }
        // More filters: the next STATUS_WINDOW rows of the range from the index alone, then only
        // those rows looked up and filtered.
        let window: Vec<(u64, String)> = conn.query(format!(
            "SELECT id, DATE_FORMAT(next_retry_time, '%Y-%m-%d %H:%i:%s.%f') FROM {table} \
             FORCE INDEX (idx_status_next_retry) WHERE {w} ORDER BY next_retry_time DESC, id DESC \
             LIMIT {STATUS_WINDOW}"
        ))?;
        let Some((last_id, last_due)) = window.last().cloned() else {
            return Ok(EventPage::default());
        };
        let ids: Vec<String> = window.iter().map(|(id, _)| id.to_string()).collect();
        let rows: Vec<Row> = conn.exec(
            format!(
                "SELECT {LIST_COLUMNS} FROM {table} WHERE id IN ({}){cond} \
                 ORDER BY next_retry_time DESC, id DESC LIMIT {}",
                ids.join(","),
                n + 1
            ),
            params,
        )?;
        let mut rows: Vec<EventRow> = rows.into_iter().map(event_row).collect();
        let (next, searched) = if rows.len() > n {
            (Some(Cursor::Due(rows[n - 1].due.clone(), rows[n - 1].id)), None)
        } else {
            let more = window.len() as u64 == STATUS_WINDOW;
            let due = last_due.get(..23).unwrap_or(&last_due).to_string();
            (
                more.then(|| Cursor::Due(due.clone(), last_id)),
                Some(Searched::Status {
                    status: s,
                    rows: window.len(),
                    due,
                }),
            )
        };
        rows.truncate(n);
        return Ok(EventPage { rows, next, searched });
    }
    // Along the primary key, one window of ids at a time.
    let (lo_id, hi_id): (Option<u64>, Option<u64>) = conn
        .query_first(format!("SELECT MIN(id), MAX(id) FROM {table}"))?
        .unwrap_or((None, None));
    let (Some(lo_id), Some(hi_id)) = (lo_id, hi_id) else {
        return Ok(EventPage::default());
    };
    let mut hi = match &f.after {
        Some(Cursor::Id(id)) => id.saturating_sub(1),
        _ => hi_id,
    };
    let mut lo_bound = lo_id;
    if let Some(TimeBound::At(t)) = &f.until {
        hi = hi.min(first_id_at(conn, table, t, lo_id, hi_id)?.unwrap_or(hi_id));
    }
    if let Some(since) = &f.since {
        let t = match since {
            TimeBound::At(t) => Some(t.clone()),
            TimeBound::Ago(d) => conn.query_first(format!(
                "SELECT CAST(NOW(3) - INTERVAL {} MICROSECOND AS CHAR)",
                d.as_micros()
            ))?,
        };
        if let Some(t) = t {
            lo_bound = first_id_at(conn, table, &t, lo_id, hi_id)?.unwrap_or(hi_id + 1);
        }
    }
    if hi < lo_bound {
        return Ok(EventPage::default());
    }
    let lo = hi.saturating_sub(SEARCH_WINDOW - 1).max(lo_bound);
    let cond = conditions(f, &mut params, false, true);
    let rows: Vec<Row> = conn.exec(
        format!(
            "SELECT {LIST_COLUMNS} FROM {table} WHERE id BETWEEN {lo} AND {hi}{cond} ORDER BY id DESC LIMIT {}",
            n + 1
        ),
        params,
    )?;
    let mut rows: Vec<EventRow> = rows.into_iter().map(event_row).collect();
    let (next, from) = if rows.len() > n {
        let last = rows[n - 1].id;
        (Some(Cursor::Id(last)), last)
    } else if lo > lo_bound {
        (Some(Cursor::Id(lo)), lo)
    } else {
        (None, lo)
    };
    let searched = Some(Searched::Ids { lo: from, hi });
    rows.truncate(n);
    Ok(EventPage { rows, next, searched })
}

/// The smallest id whose `create_time` is at or after `t` (ids grow with time), found by
/// halving the id range: about 25 primary-key lookups on a table of ten million rows.
fn first_id_at(conn: &mut PooledConn, table: &str, t: &str, lo: u64, hi: u64) -> Result<Option<u64>> {
    let (mut lo, mut hi) = (lo, hi + 1);
    let at = lit(t);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let row: Option<(u64, u8)> = conn.query_first(format!(
            "SELECT id, create_time >= CAST({at} AS DATETIME(3)) FROM {table} WHERE id >= {mid} ORDER BY id LIMIT 1"
        ))?;
        match row {
            Some((_, 1)) => hi = mid,
            Some((id, _)) => lo = id + 1,
            None => hi = mid,
        }
    }
    let any: Option<u64> = conn.query_first(format!("SELECT id FROM {table} WHERE id >= {lo} ORDER BY id LIMIT 1"))?;
    Ok(any)
}

/// Everything about one event.
#[derive(Debug, Clone)]
pub struct EventDetail {
    pub row: EventRow,
    pub payload: Vec<u8>,
    pub payload_len: u64,
    pub tag: Option<String>,
    pub headers: Option<String>,
    pub event_key: Option<String>,
    pub claim_owner: Option<String>,
    pub claim_token: Option<u64>,
    pub claimed_at: Option<String>,
    pub sent_at: Option<String>,
    pub updated: Option<String>,
    pub broker_msg_id: Option<String>,
    pub last_error: Option<String>,
}

/// Bytes of payload shown.
pub const PAYLOAD_PREVIEW: usize = 4096;

pub fn event(conn: &mut PooledConn, table: &str, id: u64) -> Result<Option<EventDetail>> {
    let row: Option<Row> = conn.query_first(format!(
        "SELECT {LIST_COLUMNS}, LEFT(payload, {PAYLOAD_PREVIEW}), LENGTH(payload), tag, headers, event_key, claim_owner, \
         claim_token, CAST(claimed_at AS CHAR), CAST(sent_at AS CHAR), CAST(update_time AS CHAR), broker_msg_id, last_error \
         FROM {table} WHERE id = {id}"
    ))?;
    Ok(row.map(|mut r| {
        let payload: Vec<u8> = r.take(9).flatten().unwrap_or_default();
        let payload_len: u64 = r.take(10).flatten().unwrap_or(0);
        let tag = r.take(11).flatten();
        let headers = r.take(12).flatten();
        let event_key = r.take(13).flatten();
        let claim_owner = r.take(14).flatten();
        let claim_token = r.take(15).flatten();
        let claimed_at = r.take(16).flatten();
        let sent_at = r.take(17).flatten();
        let updated = r.take(18).flatten();
        let broker_msg_id = r.take(19).flatten();
        let last_error = r.take(20).flatten();
        EventDetail {
            row: event_row(r),
            payload,
            payload_len,
            tag,
            headers,
            event_key,
            claim_owner,
            claim_token,
            claimed_at,
            sent_at,
            updated,
            broker_msg_id,
            last_error,
        }
    }))
}

/// A key held back in ordered mode, with its head event and why.
#[derive(Debug, Clone)]
pub struct HeldKey {
    pub biz_no: String,
    pub head: EventRow,
    /// `dead head`, `backing off`, `parked`.
    pub why: &'static str,
    /// The key's next pending event after the head (it waits for the head).
    pub next_pending: Option<u64>,
}

/// Keys whose oldest pending event holds the rest back: dead heads (FAIL, which hold only with
/// `ordering.dead.head = block`), heads backing off after a failure, heads parked on a broker
/// that is down. At most `limit` of each kind, read from their ranges of
/// `idx_status_next_retry`, then one loose index scan of `idx_biz_no` for the keys' next
/// pending events.
pub fn held_keys(conn: &mut PooledConn, table: &str, limit: usize) -> Result<Vec<HeldKey>> {
    let mut heads: Vec<(EventRow, &'static str)> = Vec::new();
    let dead: Vec<Row> = conn.query(format!(
        "SELECT {LIST_COLUMNS} FROM {table} FORCE INDEX (idx_status_next_retry) WHERE status = 'FAIL' \
         ORDER BY next_retry_time DESC, id DESC LIMIT {limit}"
    ))?;
    heads.extend(dead.into_iter().map(|r| (event_row(r), "dead head")));
    let later: Vec<Row> = conn.query(format!(
        "SELECT {LIST_COLUMNS} FROM {table} FORCE INDEX (idx_status_next_retry) WHERE status = 'WAIT' \
         AND next_retry_time > NOW(3) ORDER BY next_retry_time, id LIMIT {limit}"
    ))?;
    for r in later.into_iter().map(event_row) {
        let why = if r.last_error.as_deref().is_some_and(|e| e.starts_with("parked")) {
            "parked"
        } else if r.retry_count > 0 {
            "backing off"
        } else {
            continue;
        };
        heads.push((r, why));
    }
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys: Vec<String> = heads.iter().map(|(r, _)| lit(&r.biz_no)).collect();
    keys.sort();
    keys.dedup();
    // Per key, the smallest pending id by status.
    let pending: Vec<(String, String, u64)> = conn.query(format!(
        "SELECT biz_no, status, MIN(id) FROM {table} FORCE INDEX (idx_biz_no) WHERE biz_no IN ({}) \
         AND status IN ('WAIT', 'SENDING') GROUP BY biz_no, status",
        keys.join(", ")
    ))?;
    let mut out = Vec::new();
    for (head, why) in heads {
        // The key's pending events after the head, if any: only then is something held back.
        let next = pending
            .iter()
            .filter(|(k, _, id)| k.eq_ignore_ascii_case(&head.biz_no) && *id > head.id)
            .map(|(_, _, id)| *id)
            .min();
        let smaller_pending = pending
            .iter()
            .any(|(k, _, id)| k.eq_ignore_ascii_case(&head.biz_no) && *id < head.id);
        if next.is_some() && !smaller_pending {
            out.push(HeldKey {
                biz_no: head.biz_no.clone(),
                head,
                why,
                next_pending: next,
            });
        }
    }
    Ok(out)
}

/// A consumer group, as its tables show it.
#[derive(Debug, Clone, Default)]
pub struct GroupRow {
    pub group: String,
    /// Marks (keys processed), up to [`COUNT_BOUND`].
    pub marks: u64,
    pub dead: u64,
    pub replay: u64,
}

/// The groups with marks or dead letters: the inbox's groups by a loose scan of its primary key,
/// each one's marks counted up to [`COUNT_BOUND`]; dead letters by their group index.
pub fn consumer_groups(conn: &mut PooledConn, inbox: &str, dead_letters: &str) -> Result<Vec<GroupRow>> {
    let mut groups: Vec<String> = conn.query(format!("SELECT DISTINCT consumer_group FROM {inbox} LIMIT 200"))?;
    let dl: Vec<(String, String, u64)> = conn.query(format!(
        "SELECT consumer_group, status, COUNT(*) FROM (SELECT consumer_group, status FROM {dead_letters} \
         FORCE INDEX (idx_dead_letter_group_status) LIMIT {COUNT_BOUND}) d GROUP BY consumer_group, status"
    ))?;
    groups.extend(dl.iter().map(|(g, _, _)| g.clone()));
    groups.sort();
    groups.dedup();
    let mut out = Vec::new();
    for g in groups {
        let marks: Option<u64> = conn.query_first(format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM {inbox} WHERE consumer_group = {} LIMIT {COUNT_BOUND}) m",
            bytes_lit(g.as_bytes())
        ))?;
        let of = |st: &str| {
            dl.iter()
                .filter(|(gg, s, _)| *gg == g && s == st)
                .map(|(_, _, n)| *n)
                .sum()
        };
        out.push(GroupRow {
            marks: marks.unwrap_or(0),
            dead: of("DEAD"),
            replay: of("REPLAY"),
            group: g,
        });
    }
    Ok(out)
}

/// How many dead letters consumer group `group` has in `table` (of `status` if given), counted
/// up to [`COUNT_BOUND`] along `idx_dead_letter_group_status`.
pub fn group_dead_letters(conn: &mut PooledConn, table: &str, group: &str, status: Option<&str>) -> Result<u64> {
    let of_status = status.map(|s| format!(" AND status = {}", lit(s))).unwrap_or_default();
    let cond = format!("consumer_group = {}{of_status}", bytes_lit(group.as_bytes()));
    bounded_count(conn, table, "idx_dead_letter_group_status", &cond)
}

/// One audited action.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub id: u64,
    pub at: String,
    pub table: String,
    pub event_id: u64,
    pub action: String,
    pub actor: String,
    pub detail: Option<String>,
}

/// The latest audited actions, newest first, before `before` (an audit id) when given.
pub fn audit(conn: &mut PooledConn, limit: usize, before: Option<u64>) -> Result<Vec<AuditRow>> {
    let w = before.map(|b| format!(" WHERE id < {b}")).unwrap_or_default();
    // id, at, table, event id, action, actor, detail
    type Raw = (u64, String, String, u64, String, String, Option<String>);
    let rows: Vec<Raw> = conn.query(format!(
        "SELECT id, CAST(at AS CHAR), table_name, event_id, action, actor, detail FROM outbox_audit{w} \
         ORDER BY id DESC LIMIT {limit}"
    ))?;
    Ok(rows
        .into_iter()
        .map(|(id, at, table, event_id, action, actor, detail)| AuditRow {
            id,
            at,
            table,
            event_id,
            action,
            actor,
            detail,
        })
        .collect())
}

/// Dead letters sharing an error, a topic and an event type.
#[derive(Debug, Clone)]
pub struct DeadLetterGroup {
    /// The start of the last error ([`ERROR_PREFIX`] characters).
    pub error: String,
    /// `None`: the table's default topic.
    pub topic: Option<String>,
    pub event_type: String,
    pub rows: u64,
}

/// Groups shown, the largest.
pub const MAX_GROUPS: usize = 100;

/// Characters of `last_error` a group is told apart by (the text after it varies: ids, times).
pub const ERROR_PREFIX: usize = 80;

/// Dead letters (FAIL rows) grouped by the start of their error, their topic and their event
/// type, the largest groups first, among the first `examine` of the FAIL range of
/// `idx_status_next_retry` (each a lookup by primary key): the groups, and how many rows were
/// looked at (`examine` means there may be more).
pub fn dead_letter_groups(conn: &mut PooledConn, table: &str, examine: u64) -> Result<(Vec<DeadLetterGroup>, u64)> {
    let rows: Vec<(String, Option<String>, String, u64)> = conn.query(format!(
        "SELECT LEFT(COALESCE(last_error, ''), {ERROR_PREFIX}) AS e, topic, event_type, COUNT(*) AS n FROM \
         (SELECT last_error, topic, event_type FROM {table} FORCE INDEX (idx_status_next_retry) \
          WHERE status = 'FAIL' LIMIT {examine}) AS f GROUP BY e, topic, event_type ORDER BY n DESC, e"
    ))?;
    let examined = rows.iter().map(|r| r.3).sum::<u64>();
    let groups = rows
        .into_iter()
        .take(MAX_GROUPS)
        .map(|(error, topic, event_type, rows)| DeadLetterGroup {
            error,
            topic,
            event_type,
            rows,
        })
        .collect();
    Ok((groups, examined))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        for c in [Cursor::Id(42), Cursor::Due("2026-12-05 01:02:03.456".into(), 7)] {
            assert_eq!(Cursor::decode(&c.encode()), Some(c));
        }
        for bad in ["", "x1", "i", "i-1", "d2026-12-05'; DROP,1", "d,1", "dabc,1"] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
