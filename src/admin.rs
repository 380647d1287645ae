//! Operator actions on an outbox table: status, dead letters (list, replay, discard) and
//! retention. Used by `outboxd`; each is a plain function over a pool.
//!
//! What a batch action on dead letters shares with the consumer's (`consumer::dead_letter`):
//! its options ([`BatchOptions`]), its pacing (`Pace`) and its `outbox_audit` rows (`audit`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Pool, Value};

use crate::config::table_name;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::sql::{id_list, lit, opt_lit};

/// A point in time for a filter: so long ago (DB clock), or an absolute `YYYY-MM-DD[ HH:MM:SS]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeBound {
    Ago(Duration),
    At(String),
}

impl TimeBound {
    /// Parses `30s`, `15m`, `24h`, `7d`, or `2026-12-01` / `2026-12-01 08:00:00` / `2026-12-01T08:00:00`.
    pub fn parse(s: &str) -> std::result::Result<TimeBound, String> {
        let s = s.trim();
        if let Some(d) = parse_duration(s) {
            return Ok(TimeBound::Ago(d));
        }
        let t = s.replace('T', " ");
        let ok = t.len() >= 10
            && t.len() <= 23
            && t.bytes().all(|b| b.is_ascii_digit() || b" -:.".contains(&b))
            && t.as_bytes()[4] == b'-'
            && t.as_bytes()[7] == b'-';
        if ok {
            Ok(TimeBound::At(t))
        } else {
            Err(format!(
                "{s:?} is neither a duration (30s, 15m, 24h, 7d) nor a time (2026-12-01 08:00:00)"
            ))
        }
    }

    pub(crate) fn sql(&self, params: &mut Vec<Value>) -> String {
        match self {
            TimeBound::Ago(d) => format!("NOW(3) - INTERVAL {} MICROSECOND", d.as_micros()),
            TimeBound::At(t) => {
                params.push(Value::from(t.as_str()));
                "CAST(? AS DATETIME(3))".into()
            }
        }
    }
}

/// Parses `500ms`, `30s`, `15m`, `24h`, `7d`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).map(Duration::from_millis)
}

/// Which dead letters an action applies to. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    pub ids: Vec<EventId>,
    pub event_type: Option<String>,
    pub biz_no: Option<String>,
    /// Dead-lettered (last updated) at or after this.
    pub since: Option<TimeBound>,
    /// Dead-lettered before this.
    pub until: Option<TimeBound>,
    /// Rows of this topic (the row's own `topic` column).
    pub topic: Option<String>,
    /// Rows whose `last_error` holds this text.
    pub error_contains: Option<String>,
}

impl DeadLetterFilter {
    fn where_sql(&self, params: &mut Vec<Value>) -> String {
        let mut w = String::from("status = 'FAIL'");
        if !self.ids.is_empty() {
            let ids: Vec<String> = self.ids.iter().map(|i| i.to_string()).collect();
            let _ = write!(w, " AND id IN ({})", ids.join(","));
        }
        if let Some(t) = &self.event_type {
            w.push_str(" AND event_type = ?");
            params.push(Value::from(t.as_str()));
        }
        if let Some(b) = &self.biz_no {
            w.push_str(" AND biz_no = ?");
            params.push(Value::from(b.as_str()));
        }
        if let Some(s) = &self.since {
            let e = s.sql(params);
            let _ = write!(w, " AND update_time >= {e}");
        }
        if let Some(u) = &self.until {
            let e = u.sql(params);
            let _ = write!(w, " AND update_time < {e}");
        }
        if let Some(t) = &self.topic {
            w.push_str(" AND topic = ?");
            params.push(Value::from(t.as_str()));
        }
        if let Some(e) = &self.error_contains {
            w.push_str(" AND INSTR(last_error, ?) > 0");
            params.push(Value::from(e.as_str()));
        }
        w
    }
}

/// One dead-lettered row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow {
    pub id: EventId,
    pub biz_no: String,
    pub event_type: String,
    pub retry_count: u32,
    pub last_error: Option<String>,
    pub claim_owner: Option<String>,
    /// When it was dead-lettered (`update_time`), as the DB prints it.
    pub failed_at: String,
}

/// A SENDING row, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendingRow {
    pub id: EventId,
    pub owner: Option<String>,
    pub age: Duration,
}

/// What `outboxd status` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusReport {
    pub counts: BTreeMap<String, u64>,
    /// Of the WAIT rows, those waiting for the time they were scheduled at (not backing off).
    pub scheduled: u64,
    /// When the next scheduled row is due, from now (`None`: none scheduled).
    pub next_scheduled_in: Option<Duration>,
    /// Age of the most overdue due WAIT row.
    pub oldest_wait_age: Option<Duration>,
    /// The oldest SENDING rows (at most 20), oldest first.
    pub sending: Vec<SendingRow>,
    pub dead_last_day: u64,
    /// Oldest due WAIT age per topic (`None` topic = the default topic).
    pub oldest_wait_by_topic: Vec<(Option<String>, Duration)>,
}

impl StatusReport {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "counts": self.counts,
            "scheduled": self.scheduled,
            "next_scheduled_in_ms": self.next_scheduled_in.map(|d| d.as_millis() as u64),
            "oldest_wait_age_ms": self.oldest_wait_age.map(|d| d.as_millis() as u64),
            "sending": self.sending.iter().map(|s| serde_json::json!({
                "id": s.id, "owner": s.owner, "age_ms": s.age.as_millis() as u64,
            })).collect::<Vec<_>>(),
            "dead_last_day": self.dead_last_day,
            "oldest_wait_by_topic": self.oldest_wait_by_topic.iter().map(|(t, d)| serde_json::json!({
                "topic": t, "age_ms": d.as_millis() as u64,
            })).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

fn checked(table: &str) -> Result<String> {
    Ok(table_name("table", table)?)
}

/// Counts by status, the oldest due WAIT age, SENDING rows with owner and age, dead letters of
/// the last day.
pub fn status(pool: &Pool, table: &str) -> Result<StatusReport> {
    let t = checked(table)?;
    let mut c = pool.get_conn()?;
    let counts: Vec<(String, u64)> = c.query(format!("SELECT status, COUNT(*) FROM {t} GROUP BY status"))?;
    let sending: Vec<(u64, Option<String>, Option<i64>)> = c.query(format!(
        "SELECT id, claim_owner, TIMESTAMPDIFF(MICROSECOND, claimed_at, NOW(3)) FROM {t} WHERE status = 'SENDING' \
         ORDER BY claimed_at, id LIMIT 20"
    ))?;
    let dead: Option<u64> = c.query_first(format!(
        "SELECT COUNT(*) FROM {t} WHERE status = 'FAIL' AND update_time >= NOW(3) - INTERVAL 1 DAY"
    ))?;
    let scheduled: (Option<u64>, Option<i64>) = c
        .query_first(format!(
            "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, NOW(3), MIN(next_retry_time)) FROM {t} \
             FORCE INDEX (idx_status_next_retry) WHERE {}",
            crate::protocol::SCHEDULED_SQL
        ))?
        .unwrap_or((None, None));
    // Every due row (an operator's command, not a scrape); the oldest of all is the oldest of
    // the per-topic ones.
    let by_topic = oldest_wait_by_topic(pool, &t, usize::MAX)?;
    let us = |v: i64| Duration::from_micros(v.max(0) as u64);
    Ok(StatusReport {
        counts: counts.into_iter().collect(),
        scheduled: scheduled.0.unwrap_or(0),
        next_scheduled_in: scheduled.1.map(|us| Duration::from_micros(us.max(0) as u64)),
        oldest_wait_age: by_topic.iter().map(|(_, age)| *age).max(),
        sending: sending
            .into_iter()
            .map(|(id, owner, age)| SendingRow {
                id,
                owner,
                age: us(age.unwrap_or(0)),
            })
            .collect(),
        dead_last_day: dead.unwrap_or(0),
        oldest_wait_by_topic: by_topic,
    })
}

/// How long the most overdue due WAIT row of each topic (NULL: the default topic) has been due,
/// judged over the first `sample` due rows in scan order: a range scan of
/// `idx_status_next_retry` whose cost stays bounded however large the backlog, for metrics
/// scraped every few seconds. A topic whose oldest due row lies beyond the sample is younger
/// than the last row of it, and is not listed.
pub fn oldest_wait_by_topic(pool: &Pool, table: &str, sample: usize) -> Result<Vec<(Option<String>, Duration)>> {
    let t = checked(table)?;
    let rows: Vec<(Option<String>, i64)> = pool.get_conn()?.query(format!(
        "SELECT topic, TIMESTAMPDIFF(MICROSECOND, MIN(next_retry_time), NOW(3)) FROM \
         (SELECT topic, next_retry_time FROM {t} FORCE INDEX (idx_status_next_retry) \
          WHERE status = 'WAIT' AND next_retry_time <= NOW(3) ORDER BY next_retry_time, id LIMIT {sample}) due \
         GROUP BY topic"
    ))?;
    Ok(rows
        .into_iter()
        .map(|(t, us)| (t, Duration::from_micros(us.max(0) as u64)))
        .collect())
}

/// Dead letters matching `filter`, newest first, at most `limit`.
pub fn list_dead_letters(
    pool: &Pool,
    table: &str,
    filter: &DeadLetterFilter,
    limit: usize,
) -> Result<Vec<DeadLetterRow>> {
    let t = checked(table)?;
    let mut params = Vec::new();
    let w = filter.where_sql(&mut params);
    type Raw = (u64, String, String, u32, Option<String>, Option<String>, String);
    let rows: Vec<Raw> = pool.get_conn()?.exec(
        format!(
            "SELECT id, biz_no, event_type, retry_count, last_error, claim_owner, CAST(update_time AS CHAR) \
             FROM {t} WHERE {w} ORDER BY update_time DESC, id DESC LIMIT {limit}"
        ),
        params,
    )?;
    Ok(rows
        .into_iter()
        .map(
            |(id, biz_no, event_type, retry_count, last_error, claim_owner, failed_at)| DeadLetterRow {
                id,
                biz_no,
                event_type,
                retry_count,
                last_error,
                claim_owner,
                failed_at,
            },
        )
        .collect())
}

/// What to do with matching dead letters: of the relay's table ([`act_on_dead_letters`]) or of
/// a consumer group's (`consumer::dead_letter::act_on_dead_letters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterAction {
    /// Relay: FAIL rows back to WAIT, due now, with the retry count reset. Consumer group: DEAD
    /// rows marked REPLAY, for the group's running consumers to handle again.
    Replay,
    /// Relay: FAIL rows marked DISCARDED, never sent, kept for the record (and for retention).
    /// Consumer group: DEAD and REPLAY rows deleted, the messages dropped for good.
    Discard,
}

impl DeadLetterAction {
    /// The name `outbox_audit.action` records: `replay` or `discard`.
    pub fn name(self) -> &'static str {
        match self {
            DeadLetterAction::Replay => "replay",
            DeadLetterAction::Discard => "discard",
        }
    }
}

/// Longest actor `outbox_audit.actor` holds (`VARCHAR(128)`).
pub const MAX_ACTOR_CHARS: usize = 128;

/// How a batch action on dead letters runs, on the relay's table and on a consumer group's alike.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    /// Count the rows that would change; change nothing, audit nothing.
    pub dry_run: bool,
    /// Rows per transaction (at least 1): each batch locks its rows still in the expected state,
    /// changes them, audits them and commits.
    pub batch: usize,
    /// Most rows per second (0 = unlimited).
    pub rate_per_sec: u64,
    /// Who is acting, written to `outbox_audit` with each row changed (1 to 128 characters).
    pub actor: String,
}

impl BatchOptions {
    /// The first field that is wrong, named with its value: an empty or overlong actor, a batch
    /// of 0 rows.
    pub fn check(&self) -> Result<()> {
        if self.actor.trim().is_empty() {
            return Err(Error::InvalidEvent {
                field: "actor",
                reason: "must not be empty".into(),
            });
        }
        let chars = self.actor.chars().count();
        if chars > MAX_ACTOR_CHARS {
            return Err(Error::InvalidEvent {
                field: "actor",
                reason: format!(
                    "{:?} is {chars} characters, longer than the {MAX_ACTOR_CHARS} outbox_audit keeps",
                    self.actor.chars().take(40).collect::<String>() + "..."
                ),
            });
        }
        if self.batch == 0 {
            return Err(Error::InvalidEvent {
                field: "batch",
                reason: "0 must be at least 1 row per transaction".into(),
            });
        }
        Ok(())
    }
}

/// Keeps a batch action to a rate: after each batch, `Pace::wait` sleeps until the rows done
/// so far are due at `rate_per_sec` rows per second since the start (0 = no limit).
#[derive(Debug)]
pub(crate) struct Pace {
    started: Instant,
    rate_per_sec: u64,
}

impl Pace {
    /// Starts the clock now.
    pub(crate) fn new(rate_per_sec: u64) -> Pace {
        Pace {
            started: Instant::now(),
            rate_per_sec,
        }
    }

    /// Sleeps until `done` rows are due.
    pub(crate) fn wait(&self, done: u64) {
        if let Some(p) = pause(self.rate_per_sec, done, self.started.elapsed()) {
            std::thread::sleep(p);
        }
    }
}

/// How long to wait, `elapsed` after the start with `done` rows done, to keep to `rate_per_sec`
/// (0 = no limit): none when the rows are already due.
fn pause(rate_per_sec: u64, done: u64, elapsed: Duration) -> Option<Duration> {
    if rate_per_sec == 0 {
        return None;
    }
    let due = Duration::from_secs_f64(done as f64 / rate_per_sec as f64);
    due.checked_sub(elapsed).filter(|p| !p.is_zero())
}

/// Records in `outbox_audit` that `actor` did `action` (`replay`, `discard`, `pause`, ...) to
/// these rows of `table`, one audit row each (`(event id, detail)`; 0 for an action on the table
/// as a whole), inside the caller's transaction: one statement, every value a literal. A database
/// without `outbox_audit` is an error saying how to create it.
pub(crate) fn audit<Q: Queryable>(
    q: &mut Q,
    table: &str,
    action: &str,
    actor: &str,
    rows: &[(EventId, Option<String>)],
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let (table, action, actor) = (lit(table), lit(action), lit(actor));
    let mut values = String::new();
    for (id, detail) in rows {
        if !values.is_empty() {
            values.push_str(", ");
        }
        let detail: Option<String> = detail.as_deref().map(|d| d.chars().take(MAX_DETAIL_CHARS).collect());
        let _ = write!(
            values,
            "({table}, {id}, {action}, {actor}, {})",
            opt_lit(detail.as_deref())
        );
    }
    q.query_drop(format!(
        "INSERT INTO outbox_audit (table_name, event_id, action, actor, detail) VALUES {values}"
    ))
    .map_err(|e| match &e {
        mysql::Error::MySqlError(me) if me.code == 1146 => Error::Migration {
            version: 0,
            description: "table outbox_audit".into(),
            reason: "does not exist; operator actions are audited there: create it with `outboxd migrate` \
                     or outbox::migrate (migration V4)"
                .into(),
        },
        _ => Error::Db(e),
    })
}

/// Longest detail `outbox_audit.detail` holds (`VARCHAR(1024)`).
const MAX_DETAIL_CHARS: usize = 1024;

/// How many dead letters match a filter, as [`count_dead_letters`] counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterCount {
    pub matched: u64,
    /// Only the latest `examine` dead letters were looked at (there are more): `matched` is a
    /// lower bound.
    pub partial: bool,
}

/// How many dead letters match `filter`, cheaply on a large table: the FAIL rows come from
/// `idx_status_next_retry` alone; with no other condition they are counted from the index (up
/// to 100 000: beyond, `partial`); with one, only the latest `examine` of them (or the selected
/// ids) are looked up and tested, and `partial` says when there were more.
pub fn count_dead_letters(
    pool: &Pool,
    table: &str,
    filter: &DeadLetterFilter,
    examine: u64,
) -> Result<DeadLetterCount> {
    const INDEX_ONLY_BOUND: u64 = 100_000;
    let t = checked(table)?;
    let mut c = pool.get_conn()?;
    let only_status = DeadLetterFilter {
        ids: filter.ids.clone(),
        ..DeadLetterFilter::default()
    };
    if *filter == only_status && filter.ids.is_empty() {
        let n: Option<u64> = c.query_first(format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM {t} FORCE INDEX (idx_status_next_retry) WHERE status = 'FAIL' \
             LIMIT {}) x",
            INDEX_ONLY_BOUND + 1
        ))?;
        let n = n.unwrap_or(0);
        return Ok(DeadLetterCount {
            matched: n.min(INDEX_ONLY_BOUND),
            partial: n > INDEX_ONLY_BOUND,
        });
    }
    let (window, partial): (Vec<u64>, bool) = if filter.ids.is_empty() {
        let w: Vec<u64> = c.query(format!(
            "SELECT id FROM {t} FORCE INDEX (idx_status_next_retry) WHERE status = 'FAIL' \
             ORDER BY next_retry_time DESC, id DESC LIMIT {}",
            examine + 1
        ))?;
        let partial = w.len() as u64 > examine;
        (w.into_iter().take(examine as usize).collect(), partial)
    } else {
        (filter.ids.clone(), false)
    };
    if window.is_empty() {
        return Ok(DeadLetterCount {
            matched: 0,
            partial: false,
        });
    }
    let mut params = Vec::new();
    let w = filter.where_sql(&mut params);
    let n: Option<u64> = c.exec_first(
        format!(
            "SELECT COUNT(*) FROM {t} WHERE id IN ({}) AND {w}",
            id_list(window.iter().copied())
        ),
        params,
    )?;
    Ok(DeadLetterCount {
        matched: n.unwrap_or(0),
        partial,
    })
}

/// Replays or discards every dead letter matching `filter`, `opts.batch` rows per transaction
/// (only rows still FAIL change), rate-limited; each row changed gets an `outbox_audit` entry
/// with the actor. `progress(done, total)` is called after each batch. Returns the number of
/// rows changed (or, with `dry_run`, that would be).
pub fn act_on_dead_letters(
    pool: &Pool,
    table: &str,
    filter: &DeadLetterFilter,
    action: DeadLetterAction,
    opts: &BatchOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64> {
    let t = checked(table)?;
    opts.check()?;
    let mut params = Vec::new();
    let w = filter.where_sql(&mut params);
    let mut c = pool.get_conn()?;
    let ids: Vec<u64> = c.exec(format!("SELECT id FROM {t} WHERE {w} ORDER BY id"), params)?;
    let total = ids.len() as u64;
    if opts.dry_run || ids.is_empty() {
        progress(total, total);
        return Ok(total);
    }
    let set = match action {
        DeadLetterAction::Replay => {
            "status = 'WAIT', retry_count = 0, next_retry_time = NOW(3), claim_owner = NULL, claim_token = NULL, \
             claimed_at = NULL, last_error = CONCAT('replayed by ', ?, '; was: ', COALESCE(last_error, ''))"
        }
        DeadLetterAction::Discard => {
            "status = 'DISCARDED', last_error = CONCAT('discarded by ', ?, '; was: ', COALESCE(last_error, ''))"
        }
    };
    let pace = Pace::new(opts.rate_per_sec);
    let mut done = 0u64;
    for chunk in ids.chunks(opts.batch) {
        let list = id_list(chunk.iter().copied());
        let mut tx = c.start_transaction(mysql::TxOpts::default())?;
        // Only rows still FAIL change: a row replayed meanwhile by someone else is left alone.
        let changed: Vec<u64> = tx.query(format!(
            "SELECT id FROM {t} WHERE id IN ({list}) AND status = 'FAIL' FOR UPDATE"
        ))?;
        if !changed.is_empty() {
            tx.exec_drop(
                format!(
                    "UPDATE {t} SET {set} WHERE id IN ({})",
                    id_list(changed.iter().copied())
                ),
                (&opts.actor,),
            )?;
            let rows: Vec<(EventId, Option<String>)> = changed.iter().map(|id| (*id, None)).collect();
            audit(&mut tx, &t, action.name(), &opts.actor, &rows)?;
        }
        tx.commit()?;
        done += changed.len() as u64;
        progress(done, total);
        pace.wait(done);
    }
    log::info!("{} of {total} dead letters {}ed by {}", done, action.name(), opts.actor);
    Ok(done)
}

/// Deletes SUCCESS and DISCARDED rows sent (or discarded) more than `age` ago, `batch` rows per
/// statement, for at most `max_time`. The DELETE walks `idx_status_next_retry` (a row's
/// `next_retry_time` is never later than its sending), so it stays a range scan however large the
/// table. `progress(deleted)` is called after each batch. Returns the rows deleted; a round that
/// hits `max_time` stops early and the next round goes on.
pub fn purge(
    pool: &Pool,
    table: &str,
    age: Duration,
    batch: usize,
    max_time: Duration,
    mut progress: impl FnMut(u64),
) -> Result<u64> {
    let t = checked(table)?;
    let mut c = pool.get_conn()?;
    let started = Instant::now();
    let mut deleted = 0u64;
    // Sent rows by the protocol's retention guard; discarded dead letters (an operator's) too.
    let sent = crate::protocol::RETENTION
        .guard
        .sql(&crate::protocol::GuardContext::UNCLAIMED);
    for guard in [sent.as_str(), "status = 'DISCARDED'"] {
        loop {
            c.query_drop(format!(
                "DELETE FROM {t} WHERE {guard} AND next_retry_time < NOW(3) - INTERVAL {us} MICROSECOND \
                 AND update_time < NOW(3) - INTERVAL {us} MICROSECOND ORDER BY next_retry_time LIMIT {batch}",
                us = age.as_micros(),
            ))?;
            let n = c.affected_rows();
            deleted += n;
            progress(deleted);
            if (n as usize) < batch {
                break;
            }
            if started.elapsed() >= max_time {
                return Ok(deleted);
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times_parse() {
        assert_eq!(parse_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("7x"), None);
        assert_eq!(
            TimeBound::parse("2026-12-01T08:00:00"),
            Ok(TimeBound::At("2026-12-01 08:00:00".into()))
        );
        assert!(TimeBound::parse("yesterday'; DROP").is_err());
    }

    #[test]
    fn the_pace_waits_until_the_rows_done_are_due() {
        let ms = Duration::from_millis;
        // No limit: never a wait.
        assert_eq!(pause(0, 1_000_000, Duration::ZERO), None);
        // 4 rows/s: 2 rows are due at 500 ms, 4 at 1 s.
        assert_eq!(pause(4, 2, ms(100)), Some(ms(400)));
        assert_eq!(pause(4, 4, ms(100)), Some(ms(900)));
        // Behind the rate (a slow batch): no wait, and no catching up beyond it.
        assert_eq!(pause(4, 2, ms(600)), None);
        assert_eq!(pause(4, 2, ms(500)), None);
        // 500 rows/s (the CLI's default) in batches of 100: 200 ms per batch.
        assert_eq!(pause(500, 100, Duration::ZERO), Some(ms(200)));
        assert_eq!(pause(500, 0, Duration::ZERO), None);
    }

    #[test]
    fn batch_options_name_the_wrong_field() {
        let ok = BatchOptions {
            dry_run: false,
            batch: 1,
            rate_per_sec: 0,
            actor: "alice@ops".into(),
        };
        assert!(ok.check().is_ok());
        let err = |o: BatchOptions| o.check().unwrap_err().to_string();
        let e = err(BatchOptions {
            actor: "  ".into(),
            ..ok.clone()
        });
        assert!(e.contains("actor") && e.contains("empty"), "{e}");
        let e = err(BatchOptions {
            actor: "a".repeat(129),
            ..ok.clone()
        });
        assert!(e.contains("actor") && e.contains("129 characters"), "{e}");
        assert!(BatchOptions {
            actor: "a".repeat(128),
            ..ok.clone()
        }
        .check()
        .is_ok());
        let e = err(BatchOptions { batch: 0, ..ok });
        assert!(e.contains("batch") && e.contains('0'), "{e}");
    }
}
