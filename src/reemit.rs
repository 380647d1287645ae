//! Re-emitting sent events by filter (`docs/scheduling.md#re-emit`): a new consumer group, or a
//! read model rebuilt after a bug, gets past events again after the broker has dropped them.
//!
//! A re-emit reads only what the table kept: SUCCESS rows (`sent.rows = keep`, until retention
//! deletes them), selected by event type, topic, business key and the time they were written.
//! [`preview`] counts them first and says how far back the table reaches. A job
//! ([`create`], then [`run`]) copies them back into the table as new rows due now, in id order,
//! a batch per transaction at a bounded rate: each copy keeps the event's key (so an inbox takes
//! it for the event it already handled) and carries [`wire::REEMIT_OF`] (the original's id) and
//! [`wire::REEMIT_JOB`]; the relay then sends the copies like any event. The job's position is
//! written in the same transaction as each batch of copies, so a job stopped ([`stop`], a signal)
//! or killed resumes where it was, never copying an event twice or skipping one. One runner at a
//! time holds a job (its heartbeat; a runner silent for [`STALE_AFTER`] can be replaced).
//! A re-emit never selects the copies of an earlier one.
//!
//! A consumer group that wants to handle the events again forgets them first ([`forget`]: the
//! same selection, the group's inbox marks of those event keys deleted). Starting a job, its
//! stop, its end and every forget are audited in `outbox_audit`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Pool, TxOpts};

use crate::admin::{audit, Pace, TimeBound};
use crate::config::table_name;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::sql::{id_list, lit, opt_lit};
use crate::wire;

/// The rate a job keeps by default, events per second.
pub const DEFAULT_RATE: u32 = 1000;
/// The highest rate a job may keep, events per second.
pub const MAX_RATE: u32 = 100_000;
/// A runner that wrote no heartbeat for this long has died: another may take its job.
pub const STALE_AFTER: Duration = Duration::from_secs(30);
/// Most ids one batch looks at when walking the table by id (a selection without `biz_no`): a
/// sparse filter moves on by this many ids per transaction instead of reading the table in one.
const WINDOW_IDS: u64 = 20_000;
/// How much earlier than its id says a row may have been written: a row's `create_time` is taken
/// when its INSERT statement starts and its id during it, so ids follow the time written to
/// within the length of one statement. A selection by time starts this much before the first id
/// written at its start.
const WRITE_SKEW: Duration = Duration::from_secs(60);

/// Which sent events to re-emit. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReemitFilter {
    pub event_type: Option<String>,
    /// The event's topic: the row's own, or the default topic for a row that set none.
    pub topic: Option<String>,
    pub biz_no: Option<String>,
    /// Written at or after.
    pub since: Option<TimeBound>,
    /// Written before.
    pub until: Option<TimeBound>,
}

/// A filter resolved against the table: absolute times (the database's clock) and the ids it
/// covers, `(first_id, last_id]` (from the first match to the last when it was counted): events
/// written after it was resolved are not part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub table: String,
    pub event_type: Option<String>,
    pub topic: Option<String>,
    /// The topic of rows that set none, when the selection was made (`topic`).
    pub default_topic: Option<String>,
    pub biz_no: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub first_id: EventId,
    pub last_id: EventId,
}

/// What a re-emit with a filter would take, before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub selection: Selection,
    /// Sent events matching the filter (copies of earlier re-emits not counted).
    pub matched: u64,
    /// How far back the table reaches: the oldest sent event it keeps, `(id, written at)`;
    /// `None` when it keeps none (`sent.rows = delete`, or retention deleted them all).
    pub oldest_kept: Option<(EventId, String)>,
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// A runner holds it (or held it and died: its heartbeat says).
    Running,
    /// Created or stopped, not running: `run` resumes it.
    Stopped,
    /// Every selected id was walked.
    Done,
}

impl JobState {
    pub fn sql(self) -> &'static str {
        match self {
            JobState::Running => "RUNNING",
            JobState::Stopped => "STOPPED",
            JobState::Done => "DONE",
        }
    }

    fn parse(s: &str) -> JobState {
        match s {
            "RUNNING" => JobState::Running,
            "DONE" => JobState::Done,
            _ => JobState::Stopped,
        }
    }
}

/// A re-emit job as `outbox_reemit` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub selection: Selection,
    /// Ids up to this one are done.
    pub position: EventId,
    /// Events matching when the job was created.
    pub matched: u64,
    /// Copies written so far.
    pub emitted: u64,
    pub rate: u32,
    pub state: JobState,
    pub runner: Option<String>,
    /// Milliseconds since the runner's last heartbeat.
    pub heartbeat_age_ms: Option<u64>,
    pub created_by: String,
    pub created_at: String,
}

impl Job {
    /// `job 3: emitted 1200 of 5000 (RUNNING by outboxd@host:42)`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "job {}: emitted {} of {} ({}",
            self.id,
            self.emitted,
            self.matched,
            self.state.sql()
        );
        if let (JobState::Running, Some(r)) = (self.state, &self.runner) {
            let _ = write!(s, " by {r}");
        }
        s.push(')');
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        let sel = &self.selection;
        serde_json::json!({
            "id": self.id,
            "table": sel.table,
            "filter": {
                "event_type": sel.event_type, "topic": sel.topic, "biz_no": sel.biz_no,
                "since": sel.since, "until": sel.until,
            },
            "ids": [sel.first_id, sel.last_id],
            "position": self.position,
            "matched": self.matched,
            "emitted": self.emitted,
            "rate": self.rate,
            "state": self.state.sql(),
            "runner": self.runner,
            "heartbeat_age_ms": self.heartbeat_age_ms,
            "created_by": self.created_by,
            "created_at": self.created_at,
        })
    }
}

impl Selection {
    /// The condition a row must meet, every value a literal.
    fn where_sql(&self) -> String {
        let mut w = String::from("status = 'SUCCESS' AND (headers IS NULL OR INSTR(headers, '\"reemitOf\"') = 0)");
        if let Some(b) = &self.biz_no {
            let _ = write!(w, " AND biz_no = {}", lit(b));
        }
        if let Some(t) = &self.event_type {
            let _ = write!(w, " AND event_type = {}", lit(t));
        }
        if let Some(t) = &self.topic {
            let _ = write!(
                w,
                " AND COALESCE(topic, {}) = {}",
                opt_lit(self.default_topic.as_deref()),
                lit(t)
            );
        }
        if let Some(s) = &self.since {
            let _ = write!(w, " AND create_time >= CAST({} AS DATETIME(3))", lit(s));
        }
        if let Some(u) = &self.until {
            let _ = write!(w, " AND create_time < CAST({} AS DATETIME(3))", lit(u));
        }
        w
    }

    /// `type ORDER_PAID, topic T, written since 2026-12-01 00:00:00.000, ids 1..=500`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = &self.event_type {
            parts.push(format!("type {t}"));
        }
        if let Some(t) = &self.topic {
            parts.push(format!("topic {t}"));
        }
        if let Some(b) = &self.biz_no {
            parts.push(format!("biz_no {b}"));
        }
        if let Some(s) = &self.since {
            parts.push(format!("written since {s}"));
        }
        if let Some(u) = &self.until {
            parts.push(format!("written before {u}"));
        }
        parts.push(format!("ids {}..={}", self.first_id + 1, self.last_id));
        parts.join(", ")
    }

    /// The next batch after `position`: up to `limit` ids of matching rows, and where the walk
    /// stands once they are taken.
    fn next_batch<Q: Queryable>(&self, q: &mut Q, position: EventId, limit: usize) -> Result<(Vec<EventId>, EventId)> {
        let t = &self.table;
        // With a business key the walk is a range of `idx_biz_no (biz_no, status, id)`; without,
        // a window of the primary key, so a sparse filter reads a bounded stretch per batch.
        let end = if self.biz_no.is_some() {
            self.last_id
        } else {
            position.saturating_add(WINDOW_IDS).min(self.last_id)
        };
        let ids: Vec<EventId> = q.query(format!(
            "SELECT id FROM {t} WHERE id > {position} AND id <= {end} AND {} ORDER BY id LIMIT {limit}",
            self.where_sql()
        ))?;
        let reached = if ids.len() == limit {
            *ids.last().expect("a full batch has a last id")
        } else {
            end
        };
        Ok((ids, reached))
    }
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::InvalidEvent { field, reason }
}

fn check_text(field: &'static str, v: &Option<String>, max: usize) -> Result<()> {
    if let Some(v) = v {
        if v.trim().is_empty() || v.chars().count() > max {
            return Err(invalid(
                field,
                format!("{v:?} must be 1 to {max} characters (or left out to match every event)"),
            ));
        }
    }
    Ok(())
}

/// A time bound as the database's `DATETIME(3)` text; a time it cannot read is an error naming
/// it.
fn resolve_time<Q: Queryable>(q: &mut Q, field: &'static str, b: &Option<TimeBound>) -> Result<Option<String>> {
    let Some(b) = b else { return Ok(None) };
    let mut params = Vec::new();
    let e = b.sql(&mut params);
    let v: Option<Option<String>> = q.exec_first(format!("SELECT CAST(CAST({e} AS DATETIME(3)) AS CHAR)"), params)?;
    match v.flatten() {
        Some(v) => Ok(Some(v)),
        None => Err(invalid(field, format!("{b:?} is not a time the database can read"))),
    }
}

/// The first id at or after `from` and its time written, or `None` past the end.
fn row_at<Q: Queryable>(q: &mut Q, t: &str, from: EventId) -> Result<Option<(EventId, String)>> {
    Ok(q.query_first(format!(
        "SELECT id, CAST(create_time AS CHAR) FROM {t} WHERE id >= {from} ORDER BY id LIMIT 1"
    ))?)
}

/// The last id written before `at` (less [`WRITE_SKEW`]) in `(lo, hi]`, by bisection on the
/// primary key: every row after it was written at `at - WRITE_SKEW` or later.
fn last_id_before<Q: Queryable>(q: &mut Q, t: &str, at: &str, lo: EventId, hi: EventId) -> Result<EventId> {
    let cut: Option<String> = q.exec_first(
        format!(
            "SELECT CAST(CAST(? AS DATETIME(3)) - INTERVAL {} SECOND AS CHAR)",
            WRITE_SKEW.as_secs()
        ),
        (at,),
    )?;
    let cut = cut.unwrap_or_else(|| at.to_string());
    let (mut lo, mut hi) = (lo, hi);
    // Invariant: rows at or below `lo` were written before `cut`; the answer is in [lo, hi].
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match row_at(q, t, mid)? {
            Some((id, written)) if id <= hi && written < cut => lo = id,
            _ => hi = mid - 1,
        }
    }
    Ok(lo)
}

/// Checks `filter`, resolves it against `table` (`default_topic`: the relay's `topic`, for rows
/// that set none) and counts the sent events it matches.
pub fn preview(pool: &Pool, table: &str, default_topic: &str, filter: &ReemitFilter) -> Result<Preview> {
    let t = table_name("table", table)?;
    check_text("event_type", &filter.event_type, 64)?;
    check_text("topic", &filter.topic, 127)?;
    check_text("biz_no", &filter.biz_no, 64)?;
    let mut c = pool.get_conn()?;
    let since = resolve_time(&mut c, "since", &filter.since)?;
    let until = resolve_time(&mut c, "until", &filter.until)?;
    if let (Some(s), Some(u)) = (&since, &until) {
        if s >= u {
            return Err(invalid(
                "until",
                format!("{u} is not after since ({s}): the time range is empty"),
            ));
        }
    }
    let max: Option<Option<EventId>> = c.query_first(format!("SELECT MAX(id) FROM {t}"))?;
    let last_id = max.flatten().unwrap_or(0);
    let first_id = match &since {
        Some(s) if filter.biz_no.is_none() => last_id_before(&mut c, &t, s, 0, last_id)?,
        _ => 0,
    };
    let selection = Selection {
        table: t.clone(),
        event_type: filter.event_type.clone(),
        topic: filter.topic.clone(),
        default_topic: Some(default_topic.to_string()),
        biz_no: filter.biz_no.clone(),
        since,
        until,
        first_id,
        last_id,
    };
    // The count, and the ids the matches span: a job walks only those.
    let (matched, lo, hi): (u64, Option<EventId>, Option<EventId>) = c
        .query_first(format!(
            "SELECT COUNT(*), MIN(id), MAX(id) FROM {t} WHERE id > {first_id} AND id <= {last_id} AND {}",
            selection.where_sql()
        ))?
        .unwrap_or((0, None, None));
    let mut selection = selection;
    if let (Some(lo), Some(hi)) = (lo, hi) {
        selection.first_id = lo - 1;
        selection.last_id = hi;
    } else {
        selection.first_id = selection.last_id;
    }
    // The oldest sent row: first in `idx_status_next_retry` (sent rows keep the due time they
    // were sent at).
    let oldest_kept: Option<(EventId, String)> = c.query_first(format!(
        "SELECT id, CAST(create_time AS CHAR) FROM {t} FORCE INDEX (idx_status_next_retry) \
         WHERE status = 'SUCCESS' ORDER BY next_retry_time, id LIMIT 1"
    ))?;
    Ok(Preview {
        selection,
        matched,
        oldest_kept,
    })
}

fn check_rate(rate: u32) -> Result<()> {
    if rate == 0 || rate > MAX_RATE {
        return Err(invalid(
            "rate",
            format!("{rate} must be 1 to {MAX_RATE} events per second"),
        ));
    }
    Ok(())
}

fn check_actor(actor: &str) -> Result<()> {
    crate::admin::BatchOptions {
        dry_run: true,
        batch: 1,
        rate_per_sec: 0,
        actor: actor.to_string(),
    }
    .check()
}

fn missing_table(e: mysql::Error) -> Error {
    match &e {
        mysql::Error::MySqlError(me) if me.code == 1146 => Error::Migration {
            version: 0,
            description: "table outbox_reemit".into(),
            reason: "does not exist; re-emit jobs are kept there: create it with `outboxd migrate` or \
                     outbox::migrate (migration V15)"
                .into(),
        },
        _ => Error::Db(e),
    }
}

/// Creates a job for `preview`'s selection, to run at `rate` events per second; audited as
/// started by `actor`. The job is STOPPED until [`run`] takes it.
pub fn create(pool: &Pool, preview: &Preview, rate: u32, actor: &str) -> Result<Job> {
    check_rate(rate)?;
    check_actor(actor)?;
    let s = &preview.selection;
    let mut c = pool.get_conn()?;
    let mut tx = c.start_transaction(TxOpts::default())?;
    tx.query_drop(format!(
        "INSERT INTO outbox_reemit (table_name, event_type, topic, default_topic, biz_no, written_since, written_until, \
         first_id, last_id, position, matched, rate, state, created_by) VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 'STOPPED', {})",
        lit(&s.table),
        opt_lit(s.event_type.as_deref()),
        opt_lit(s.topic.as_deref()),
        opt_lit(s.default_topic.as_deref()),
        opt_lit(s.biz_no.as_deref()),
        opt_lit(s.since.as_deref()),
        opt_lit(s.until.as_deref()),
        s.first_id,
        s.last_id,
        s.first_id,
        preview.matched,
        rate,
        lit(actor),
    ))
    .map_err(missing_table)?;
    let id = tx.last_insert_id().unwrap_or(0);
    let detail = format!(
        "re-emit job {id}: {} events ({}) at {rate}/s",
        preview.matched,
        s.describe()
    );
    audit(&mut tx, &s.table, "reemit", actor, &[(0, Some(detail))])?;
    tx.commit()?;
    job(pool, id)?.ok_or_else(|| invalid("re-emit job", format!("{id} vanished as it was created")))
}

const JOB_COLUMNS: &str = "id, table_name, event_type, topic, default_topic, biz_no, CAST(written_since AS CHAR), \
     CAST(written_until AS CHAR), first_id, last_id, position, matched, emitted, rate, state, runner, \
     TIMESTAMPDIFF(MICROSECOND, heartbeat, NOW(3)) DIV 1000, created_by, CAST(created_at AS CHAR)";

fn job_of(mut r: mysql::Row) -> Job {
    fn get<T: mysql::prelude::FromValue>(r: &mut mysql::Row, i: usize) -> T {
        r.take(i).expect("a column of JOB_COLUMNS")
    }
    let heartbeat: Option<i64> = get(&mut r, 16);
    Job {
        id: get(&mut r, 0),
        selection: Selection {
            table: get(&mut r, 1),
            event_type: get(&mut r, 2),
            topic: get(&mut r, 3),
            default_topic: get(&mut r, 4),
            biz_no: get(&mut r, 5),
            since: get(&mut r, 6),
            until: get(&mut r, 7),
            first_id: get(&mut r, 8),
            last_id: get(&mut r, 9),
        },
        position: get(&mut r, 10),
        matched: get(&mut r, 11),
        emitted: get(&mut r, 12),
        rate: get(&mut r, 13),
        state: JobState::parse(&get::<String>(&mut r, 14)),
        runner: get(&mut r, 15),
        heartbeat_age_ms: heartbeat.map(|h| h.max(0) as u64),
        created_by: get(&mut r, 17),
        created_at: get(&mut r, 18),
    }
}

/// The job `id`, if there is one.
pub fn job(pool: &Pool, id: u64) -> Result<Option<Job>> {
    let mut c = pool.get_conn()?;
    let row: Option<mysql::Row> = c
        .query_first(format!("SELECT {JOB_COLUMNS} FROM outbox_reemit WHERE id = {id}"))
        .map_err(missing_table)?;
    Ok(row.map(job_of))
}

/// The newest `limit` jobs of `table`.
pub fn jobs(pool: &Pool, table: &str, limit: usize) -> Result<Vec<Job>> {
    let t = table_name("table", table)?;
    let mut c = pool.get_conn()?;
    let rows: Vec<mysql::Row> = c
        .query(format!(
            "SELECT {JOB_COLUMNS} FROM outbox_reemit WHERE table_name = {} ORDER BY id DESC LIMIT {limit}",
            lit(&t)
        ))
        .map_err(missing_table)?;
    Ok(rows.into_iter().map(job_of).collect())
}

/// The job `id` of `table`, or an error naming it.
pub fn job_in(pool: &Pool, table: &str, id: u64) -> Result<Job> {
    match job(pool, id)? {
        Some(j) if j.selection.table == table => Ok(j),
        _ => Err(invalid(
            "re-emit job",
            format!("{id} is not a re-emit job of {table} (outboxd events re-emits lists them)"),
        )),
    }
}

/// Stops job `id` of `table` (its runner ends after the batch it is writing); audited. A job
/// not running is left as it is.
pub fn stop(pool: &Pool, table: &str, id: u64, actor: &str) -> Result<Job> {
    check_actor(actor)?;
    let t = table_name("table", table)?;
    job_in(pool, &t, id)?;
    let mut c = pool.get_conn()?;
    let mut tx = c.start_transaction(TxOpts::default())?;
    let n = tx
        .query_iter(format!(
            "UPDATE outbox_reemit SET state = 'STOPPED', runner = NULL WHERE id = {id} AND state = 'RUNNING'"
        ))?
        .affected_rows();
    if n > 0 {
        audit(
            &mut tx,
            &t,
            "reemit-stop",
            actor,
            &[(0, Some(format!("re-emit job {id} stopped")))],
        )?;
    }
    tx.commit()?;
    job_in(pool, &t, id)
}

/// How a [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Every selected id was walked: the job is DONE.
    Done,
    /// `stop` was set: the job is STOPPED where it got to, for a later `run`.
    Stopped,
    /// Someone stopped the job ([`stop`], the console) or another runner took it over.
    TakenAway,
}

/// Takes job `id` of `table` for `runner` (audited `reemit-run`): a STOPPED job, a RUNNING one
/// whose runner has written no heartbeat for [`STALE_AFTER`] (it died), or one already this
/// runner's. A job another live runner holds, or one that is done, is an error saying so. What
/// [`run`] does first; a host that runs the job on another thread takes it here first, so the
/// refusal reaches its caller.
pub fn take(pool: &Pool, table: &str, id: u64, runner: &str) -> Result<Job> {
    let t = table_name("table", table)?;
    check_actor(runner)?;
    let mut c = pool.get_conn()?;
    let taken = c
        .query_iter(format!(
            "UPDATE outbox_reemit SET state = 'RUNNING', runner = {r}, heartbeat = NOW(3) WHERE id = {id} \
             AND table_name = {tl} AND state <> 'DONE' AND (state = 'STOPPED' OR runner IS NULL OR runner = {r} \
             OR heartbeat < NOW(3) - INTERVAL {stale} SECOND)",
            r = lit(runner),
            tl = lit(&t),
            stale = STALE_AFTER.as_secs(),
        ))
        .map_err(missing_table)?
        .affected_rows();
    let job = job_in(pool, &t, id)?;
    if taken == 0 {
        return Err(match job.state {
            JobState::Done => invalid(
                "re-emit job",
                format!("{id} is done: it emitted {} of {} events", job.emitted, job.matched),
            ),
            _ => invalid(
                "re-emit job",
                format!(
                    "{id} is being run by {} (heartbeat {} ms ago); it can be taken over once it has had none for {} s",
                    job.runner.as_deref().unwrap_or("?"),
                    job.heartbeat_age_ms.unwrap_or(0),
                    STALE_AFTER.as_secs()
                ),
            ),
        });
    }
    let detail = format!(
        "re-emit job {id} run by {runner} from id {} ({} of {} emitted)",
        job.position, job.emitted, job.matched
    );
    let mut tx = c.start_transaction(TxOpts::default())?;
    audit(&mut tx, &t, "reemit-run", runner, &[(0, Some(detail))])?;
    tx.commit()?;
    log::info!(
        "re-emit {}: running from id {} ({})",
        job.summary(),
        job.position,
        job.selection.describe()
    );
    Ok(job)
}

/// Lets go of job `id` as `runner`, leaving it in `to` (DONE or STOPPED), audited as `action`
/// with `detail`, if the runner still holds it. Whether it did.
fn release(
    c: &mut mysql::PooledConn,
    t: &str,
    id: u64,
    runner: &str,
    to: JobState,
    action: &str,
    detail: String,
) -> Result<bool> {
    let mut tx = c.start_transaction(TxOpts::default())?;
    let n = tx
        .query_iter(format!(
            "UPDATE outbox_reemit SET state = '{}', runner = NULL WHERE id = {id} AND runner = {} AND state = 'RUNNING'",
            to.sql(),
            lit(runner)
        ))?
        .affected_rows();
    if n > 0 {
        audit(&mut tx, t, action, runner, &[(0, Some(detail))])?;
    }
    tx.commit()?;
    Ok(n > 0)
}

/// Runs job `id` of `table` as `runner` until it is done, `stop` is set or the job is stopped
/// from elsewhere: batches of copies, each in one transaction with the job's new position, at
/// the job's rate. Takes the job first ([`take`], whose refusals it returns). `progress` sees the
/// job after each batch.
pub fn run(
    pool: &Pool,
    table: &str,
    id: u64,
    runner: &str,
    stop: &AtomicBool,
    progress: impl FnMut(&Job),
) -> Result<(Job, RunEnd)> {
    let job = take(pool, table, id, runner)?;
    run_taken(pool, job, runner, stop, progress)
}

/// [`run`] for a job `runner` has already taken ([`take`]).
pub fn run_taken(
    pool: &Pool,
    mut job: Job,
    runner: &str,
    stop: &AtomicBool,
    mut progress: impl FnMut(&Job),
) -> Result<(Job, RunEnd)> {
    let (t, id) = (table_name("table", &job.selection.table)?, job.id);
    let mut c = pool.get_conn()?;
    let batch = (job.rate as usize / 50).clamp(1, 200);
    let pace = Pace::new(u64::from(job.rate));
    let mut emitted_here = 0u64;
    let end = loop {
        if job.position >= job.selection.last_id {
            let detail = format!(
                "re-emit job {id} done: {} of {} events emitted",
                job.emitted, job.matched
            );
            break match release(&mut c, &t, id, runner, JobState::Done, "reemit-done", detail)? {
                true => RunEnd::Done,
                false => RunEnd::TakenAway,
            };
        }
        if stop.load(Ordering::Relaxed) {
            let detail = format!(
                "re-emit job {id} stopped at id {}: {} emitted",
                job.position, job.emitted
            );
            release(&mut c, &t, id, runner, JobState::Stopped, "reemit-stop", detail)?;
            break RunEnd::Stopped;
        }
        let mut tx = c.start_transaction(TxOpts::default())?;
        let (ids, reached) = job.selection.next_batch(&mut tx, job.position, batch)?;
        let copied = if ids.is_empty() {
            0
        } else {
            copy_rows(&mut tx, &t, id, &ids)?
        };
        let moved = tx
            .query_iter(format!(
                "UPDATE outbox_reemit SET position = {reached}, emitted = emitted + {copied}, heartbeat = NOW(3) \
                 WHERE id = {id} AND runner = {} AND state = 'RUNNING' AND position = {}",
                lit(runner),
                job.position
            ))?
            .affected_rows();
        // Only from the position this run read: two runs under one name (a resume sent twice)
        // cannot both copy the same batch.
        if moved == 0 {
            tx.rollback()?;
            break RunEnd::TakenAway;
        }
        tx.commit()?;
        job.position = reached;
        job.emitted += copied;
        emitted_here += copied;
        progress(&job);
        pace.wait(emitted_here);
    };
    let job = job_in(pool, &t, id)?;
    log::info!("re-emit {} ({:?})", job.summary(), end);
    Ok((job, end))
}

/// Copies the rows `ids` of `t` (those still SUCCESS in this transaction's view) as new rows due
/// now, for job `job`: the same event key, the headers with [`wire::REEMIT_OF`] and
/// [`wire::REEMIT_JOB`] added. Read, then written as one multi-row INSERT of literals: an
/// `INSERT … SELECT` would hold the table's AUTO-INC lock for the whole statement
/// (`innodb_autoinc_lock_mode = 1`, MariaDB's default), making every live INSERT of the order
/// service wait behind it. Returns the rows written.
fn copy_rows<Q: Queryable>(q: &mut Q, t: &str, job: u64, ids: &[EventId]) -> Result<u64> {
    type Row = (
        EventId,
        String,
        String,
        Vec<u8>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = q.query(format!(
        "SELECT id, biz_no, event_type, payload, topic, tag, headers, event_key FROM {t} \
         WHERE id IN ({}) AND status = 'SUCCESS' ORDER BY id",
        id_list(ids.iter().copied())
    ))?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut values = String::new();
    for (id, biz_no, event_type, payload, topic, tag, headers, key) in &rows {
        let mut h = crate::event::parse_headers(*id, headers.as_deref());
        h.insert(wire::REEMIT_OF.into(), id.to_string());
        h.insert(wire::REEMIT_JOB.into(), job.to_string());
        let h = serde_json::to_string(&h).expect("a string map always serialises");
        if !values.is_empty() {
            values.push(',');
        }
        let _ = write!(
            values,
            "({}, {}, {}, {}, {}, {}, 'WAIT', 0, NOW(3), {})",
            lit(biz_no),
            lit(event_type),
            crate::sql::bytes_lit(payload),
            opt_lit(topic.as_deref()),
            opt_lit(tag.as_deref()),
            lit(&h),
            opt_lit(key.as_deref())
        );
    }
    Ok(q.query_iter(format!(
        "INSERT INTO {t} (biz_no, event_type, payload, topic, tag, headers, status, retry_count, next_retry_time, event_key) \
         VALUES {values}"
    ))?
    .affected_rows())
}

/// What [`forget`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForgetReport {
    /// Sent events the selection matched.
    pub events: u64,
    /// Inbox marks of the group deleted (with `dry_run`: found).
    pub forgotten: u64,
}

/// Makes consumer group `group` forget the events of `selection` (the table's sent events it
/// matches, copies included): deletes the group's marks of their event keys from `inbox_table`
/// in the consumer's database (`inbox`), so its consumers handle the next copy of each (a
/// re-emit) as new. Batches of 1 000 keys; audited in the outbox database's `outbox_audit`,
/// unless `dry_run` (then the marks are only counted). `progress(events, forgotten)` after each
/// batch.
#[allow(clippy::too_many_arguments)]
pub fn forget(
    outbox: &Pool,
    selection: &Selection,
    inbox: &Pool,
    inbox_table: &str,
    group: &str,
    actor: &str,
    dry_run: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<ForgetReport> {
    check_actor(actor)?;
    table_name("inbox.table", inbox_table)?;
    crate::inbox::check_group(group)?;
    let t = table_name("table", &selection.table)?;
    let sel = selection;
    let mut oc = outbox.get_conn()?;
    let mut ic = inbox.get_conn()?;
    let mut report = ForgetReport::default();
    let mut position = sel.first_id;
    while position < sel.last_id {
        let (ids, reached) = sel.next_batch(&mut oc, position, 1000)?;
        position = reached;
        if ids.is_empty() {
            continue;
        }
        let keys: Vec<String> = oc.query(format!(
            "SELECT event_key FROM {t} WHERE id IN ({}) AND event_key IS NOT NULL AND event_key <> ''",
            id_list(ids.iter().copied())
        ))?;
        report.events += ids.len() as u64;
        report.forgotten += crate::inbox::forget_keys(&mut ic, inbox_table, group, &keys, dry_run)?;
        progress(report.events, report.forgotten);
    }
    if !dry_run {
        let detail = format!(
            "group {group} forgot {} of {} events in {inbox_table} ({})",
            report.forgotten,
            report.events,
            sel.describe()
        );
        let mut tx = oc.start_transaction(TxOpts::default())?;
        audit(&mut tx, &t, "inbox-forget", actor, &[(0, Some(detail))])?;
        tx.commit()?;
    }
    Ok(report)
}
