//! The consumer's dead-letter table (migration V10): messages whose handler failed on every
//! attempt, kept with their body and properties so an operator can look at them and replay them
//! (`outboxd dead-letters list|replay|discard --consumer-group G`). An operator's replay or
//! discard ([`act_on_dead_letters`]) runs like one on the relay's table: in batches, rate-limited,
//! each row changed audited in `outbox_audit`.
//!
//! A row is `DEAD` until an operator asks for a replay (`REPLAY`); the group's running consumers
//! then take `REPLAY` rows one at a time (`FOR UPDATE SKIP LOCKED`, so two instances never take
//! the same row), and handle each like a message: inbox mark, handler, and the row's DELETE in
//! one transaction. A replay that fails again puts the row back to `DEAD` with one more attempt.

use std::collections::BTreeMap;

use mysql::prelude::Queryable;
use mysql::{Pool, Row, Transaction};

use super::message::Message;
use crate::admin::{self, BatchOptions, DeadLetterAction, Pace};
use crate::error::{Error, Result};
use crate::sql::{bytes_lit, id_list, lit, opt_lit};
use crate::wire::{KeySource, QueueRef};

/// The default table name (the one `migrations/V10__create_outbox_inbox_dead_letter.sql` creates).
pub use crate::config::DEFAULT_DEAD_LETTER_TABLE as DEFAULT_TABLE;

/// Status of a parked message.
pub const DEAD: &str = "DEAD";
/// Status of a message an operator asked to replay.
pub const REPLAY: &str = "REPLAY";

/// Longest `last_error` kept (the column is `VARCHAR(1024)`).
const MAX_ERROR_CHARS: usize = 1000;

/// One parked message, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxDeadLetter {
    pub id: u64,
    pub group: String,
    pub key: String,
    pub topic: String,
    pub broker: Option<String>,
    pub queue_id: Option<u32>,
    pub queue_offset: Option<u64>,
    pub msg_id: Option<String>,
    pub attempts: u32,
    pub last_error: String,
    pub status: String,
    /// When it was parked (database clock, `YYYY-MM-DD hh:mm:ss.fff`).
    pub created_at: String,
}

/// Creates the dead-letter table `table` if it does not exist (V10's DDL with the name replaced).
pub fn migrate_dead_letter(pool: &Pool, table: &str) -> Result<()> {
    let table = crate::config::table_name("inbox.dead_letter.table", table)?;
    let mut conn = pool.get_conn()?;
    let create = crate::migrate::create_table_ddl(10, DEFAULT_TABLE, &table);
    let index = crate::migrate::table_ddl(11, DEFAULT_TABLE, &table);
    for (version, ddl) in std::iter::once((10, create)).chain(index.into_iter().map(|s| (11, s))) {
        conn.query_drop(&ddl).map_err(|e| Error::Migration {
            version,
            description: format!("consumer dead-letter table {table}"),
            reason: crate::error::describe_db(&e),
        })?;
    }
    Ok(())
}

/// What [`park`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parked {
    /// A new dead letter, with this id.
    New(u64),
    /// The key already had a DEAD row (this id): the copy was added to it (attempts and the last
    /// error), not parked twice.
    Copy(u64),
}

/// The DEAD row of `group`'s `key`, if the key is parked: a copy of it that fails is added to
/// that row rather than parked again ([`park`]).
pub(crate) fn parked_id<Q: Queryable>(q: &mut Q, table: &str, group: &str, key: &str) -> Result<Option<u64>> {
    Ok(q.query_first(parked_sql(table, group, key, ""))?)
}

fn parked_sql(table: &str, group: &str, key: &str, lock: &str) -> String {
    format!(
        "SELECT id FROM {table} FORCE INDEX (idx_dead_letter_group_key) \
         WHERE consumer_group = {} AND event_key = {} AND status = '{DEAD}' ORDER BY id LIMIT 1{lock}",
        bytes_lit(group.as_bytes()),
        bytes_lit(cut_bytes(key, crate::inbox::MAX_KEY_BYTES).as_bytes()),
    )
}

/// Parks `msg` in `table` for `group` after `attempts` failed attempts, in one transaction: when
/// the key already has a DEAD row (an earlier copy parked), this copy's attempts and error are
/// added to it; otherwise a new row holds the message. The locking read makes two consumers
/// parking copies of one key at once wait on each other, so the key gets one row.
pub(crate) fn park(
    conn: &mut mysql::PooledConn,
    table: &str,
    group: &str,
    msg: &Message,
    attempts: u32,
    error: &str,
) -> Result<Parked> {
    let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
    let existing: Option<u64> = tx.query_first(parked_sql(table, group, &msg.key, " FOR UPDATE"))?;
    let parked = match existing {
        Some(id) => {
            tx.query_drop(format!(
                "UPDATE {table} SET attempts = attempts + {attempts}, last_error = {} WHERE id = {id}",
                lit(&cut_chars(
                    &format!("{error} (a later copy, at {}:{})", msg.queue, msg.offset),
                    MAX_ERROR_CHARS
                ))
            ))?;
            Parked::Copy(id)
        }
        None => {
            insert(&mut tx, table, group, msg, attempts, error)?;
            Parked::New(tx.last_insert_id().unwrap_or(0))
        }
    };
    tx.commit()?;
    Ok(parked)
}

/// A new DEAD row holding `msg` (its own statement; the caller commits).
fn insert<Q: Queryable>(q: &mut Q, table: &str, group: &str, msg: &Message, attempts: u32, error: &str) -> Result<()> {
    let props = serde_json::to_string(&msg.properties).expect("a map of strings serialises");
    let key = cut_bytes(&msg.key, crate::inbox::MAX_KEY_BYTES);
    q.query_drop(format!(
        "INSERT INTO {table} (consumer_group, event_key, topic, broker, queue_id, queue_offset, msg_id, tag, \
         properties, body, attempts, last_error, status) VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {attempts}, {}, '{DEAD}')",
        bytes_lit(group.as_bytes()),
        bytes_lit(key.as_bytes()),
        lit(&cut_chars(&msg.queue.topic, crate::event::MAX_TOPIC_CHARS)),
        opt_lit(Some(cut_chars(&msg.queue.broker, 128).as_str()).filter(|b| !b.is_empty())),
        msg.queue.queue_id,
        msg.offset,
        opt_lit(msg.msg_id.as_deref().map(|m| cut_chars(m, 128)).as_deref()),
        opt_lit(msg.tag.as_deref().map(|t| cut_chars(t, 128)).as_deref()),
        lit(&props),
        bytes_lit(&msg.body),
        lit(&cut_chars(error, MAX_ERROR_CHARS)),
    ))?;
    Ok(())
}

/// Lists `table`'s rows, oldest first: those of `group` if given, of `status` if given (`DEAD`
/// or `REPLAY`), at most `limit`.
pub fn list(
    pool: &Pool,
    table: &str,
    group: Option<&str>,
    status: Option<&str>,
    limit: usize,
) -> Result<Vec<InboxDeadLetter>> {
    let table = crate::config::table_name("inbox.dead_letter.table", table)?;
    let mut conds = Vec::new();
    if let Some(g) = group {
        conds.push(format!("consumer_group = {}", bytes_lit(g.as_bytes())));
    }
    if let Some(s) = status {
        conds.push(format!("status = {}", lit(s)));
    }
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let rows: Vec<Row> = pool.get_conn()?.query(format!(
        "SELECT {COLUMNS} FROM {table}{filter} ORDER BY id LIMIT {limit}"
    ))?;
    Ok(rows.into_iter().map(from_row).collect())
}

/// A page of `group`'s dead letters, newest first, those with an id below `before` when given
/// (the next page starts below the last id of this one), of `status` if given, at most `limit`:
/// one range of `idx_dead_letter_group_status` per status, whatever the group holds.
pub fn page(
    pool: &Pool,
    table: &str,
    group: &str,
    status: Option<&str>,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<InboxDeadLetter>> {
    let table = crate::config::table_name("inbox.dead_letter.table", table)?;
    let below = before.map(|b| format!(" AND id < {b}")).unwrap_or_default();
    let ranges: Vec<String> = status
        .map_or(vec![DEAD, REPLAY], |s| vec![s])
        .into_iter()
        .map(|s| {
            format!(
                "(SELECT {COLUMNS} FROM {table} FORCE INDEX (idx_dead_letter_group_status) WHERE consumer_group = {} \
                 AND status = {}{below} ORDER BY id DESC LIMIT {limit})",
                bytes_lit(group.as_bytes()),
                lit(s)
            )
        })
        .collect();
    let rows: Vec<Row> = pool
        .get_conn()?
        .query(format!("{} ORDER BY id DESC LIMIT {limit}", ranges.join(" UNION ALL ")))?;
    Ok(rows.into_iter().map(from_row).collect())
}

/// The columns [`from_row`] reads, in its order.
const COLUMNS: &str = "id, consumer_group, event_key, topic, broker, queue_id, queue_offset, msg_id, attempts, \
     last_error, status, DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f')";

fn from_row(mut r: Row) -> InboxDeadLetter {
    let created: String = r.take(11).unwrap_or_default();
    InboxDeadLetter {
        id: r.take(0).unwrap_or_default(),
        group: r.take(1).unwrap_or_default(),
        key: String::from_utf8_lossy(&r.take::<Vec<u8>, _>(2).unwrap_or_default()).into_owned(),
        topic: r.take(3).unwrap_or_default(),
        broker: r.take(4).unwrap_or_default(),
        queue_id: r.take(5).unwrap_or_default(),
        queue_offset: r.take(6).unwrap_or_default(),
        msg_id: r.take(7).unwrap_or_default(),
        attempts: r.take(8).unwrap_or_default(),
        last_error: r.take(9).unwrap_or_default(),
        status: r.take(10).unwrap_or_default(),
        created_at: created.get(..23).unwrap_or(&created).to_string(),
    }
}

/// Checks a consumer group's name as the functions here do (1 to 255 characters of
/// `[A-Za-z0-9_%|-]`): an error naming the field and the value.
pub fn check_group(group: &str) -> Result<()> {
    crate::inbox::check_group(group)
}

/// Checks a dead-letter table's name as the functions here do: an error naming the key
/// (`inbox.dead_letter.table`) and the value.
pub fn check_table(table: &str) -> Result<()> {
    crate::config::table_name("inbox.dead_letter.table", table)?;
    Ok(())
}

/// Which parked rows an operator acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These ids (of the group).
    Ids(Vec<u64>),
    /// Every row of the group.
    All,
}

/// The actor `outbox_audit` records for [`request_replay`] and [`discard`]: a program calling
/// the library, not an operator at `outboxd` (whose `--actor` goes to [`act_on_dead_letters`]).
pub const LIBRARY_ACTOR: &str = "outbox::consumer::dead_letter";

/// Rows per transaction for [`request_replay`] and [`discard`] (`outboxd`'s `--batch` default).
const LIBRARY_BATCH: usize = 100;

fn library_options(dry_run: bool) -> BatchOptions {
    BatchOptions {
        dry_run,
        batch: LIBRARY_BATCH,
        rate_per_sec: 0,
        actor: LIBRARY_ACTOR.into(),
    }
}

/// Asks the group's consumers to handle these `DEAD` rows again (status `REPLAY`); returns how
/// many rows changed. With `dry_run`, counts them without changing anything. Audited with
/// [`LIBRARY_ACTOR`]; [`act_on_dead_letters`] takes the batch, rate and actor.
pub fn request_replay(pool: &Pool, table: &str, group: &str, which: &Selection, dry_run: bool) -> Result<u64> {
    let opts = library_options(dry_run);
    act_on_dead_letters(pool, table, group, which, DeadLetterAction::Replay, &opts, |_, _| {})
}

/// Deletes these rows of the group (DEAD or REPLAY): the messages are dropped for good. Audited
/// with [`LIBRARY_ACTOR`]; [`act_on_dead_letters`] takes the batch, rate and actor.
pub fn discard(pool: &Pool, table: &str, group: &str, which: &Selection, dry_run: bool) -> Result<u64> {
    let opts = library_options(dry_run);
    act_on_dead_letters(pool, table, group, which, DeadLetterAction::Discard, &opts, |_, _| {})
}

/// The statement `action` runs on the rows `ids` (locked, still in the expected state).
fn statement(action: DeadLetterAction, table: &str, ids: &str) -> String {
    match action {
        DeadLetterAction::Replay => format!("UPDATE {table} SET status = '{REPLAY}' WHERE id IN ({ids})"),
        DeadLetterAction::Discard => format!("DELETE FROM {table} WHERE id IN ({ids})"),
    }
}

/// The rows an action takes: a replay those still `DEAD`, a discard `DEAD` and `REPLAY` ones.
fn states(action: DeadLetterAction) -> String {
    match action {
        DeadLetterAction::Replay => format!("'{DEAD}'"),
        DeadLetterAction::Discard => format!("'{DEAD}', '{REPLAY}'"),
    }
}

/// What `outbox_audit.detail` says about one row, so an operator can find the message.
fn audit_detail(group: &str, key: &[u8]) -> String {
    format!("consumer group {group}, event key {}", String::from_utf8_lossy(key))
}

/// Replays (`DEAD` rows marked `REPLAY`, which the group's running consumers then handle again)
/// or discards (`DEAD` and `REPLAY` rows deleted) the group's dead letters in `which`, like the
/// relay's [`admin::act_on_dead_letters`]: `opts.batch` rows per transaction, each locking its
/// rows still in the expected state (a row a consumer replayed or someone else changed meanwhile
/// is left alone), changing them and writing one `outbox_audit` row each (`table_name` the table,
/// `event_id` the row's id, the action, `opts.actor`, `detail` the group and event key); at most
/// `opts.rate_per_sec` rows per second. `progress(done, total)` is called after each batch.
/// Returns the rows changed (or, with `opts.dry_run`, that would be, with nothing changed or
/// audited). A bad table or group name, or bad options, are errors naming the field, before
/// anything changes.
pub fn act_on_dead_letters(
    pool: &Pool,
    table: &str,
    group: &str,
    which: &Selection,
    action: DeadLetterAction,
    opts: &BatchOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64> {
    let table = crate::config::table_name("inbox.dead_letter.table", table)?;
    crate::inbox::check_group(group)?;
    opts.check()?;
    let expected = format!(
        "consumer_group = {} AND status IN ({})",
        bytes_lit(group.as_bytes()),
        states(action)
    );
    let selected = match which {
        Selection::All => String::new(),
        Selection::Ids(ids) if ids.is_empty() => {
            progress(0, 0);
            return Ok(0);
        }
        Selection::Ids(ids) => format!(" AND id IN ({})", id_list(ids.iter().copied())),
    };
    let mut conn = pool.get_conn()?;
    let ids: Vec<u64> = conn.query(format!("SELECT id FROM {table} WHERE {expected}{selected} ORDER BY id"))?;
    let total = ids.len() as u64;
    if opts.dry_run || ids.is_empty() {
        progress(total, total);
        return Ok(total);
    }
    let pace = Pace::new(opts.rate_per_sec);
    let mut done = 0u64;
    for chunk in ids.chunks(opts.batch) {
        let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
        // Only rows still in the expected state change: one a consumer is replaying (locked
        // until it commits, then gone) or someone else changed meanwhile is left alone.
        let locked: Vec<(u64, Vec<u8>)> = tx.query(format!(
            "SELECT id, event_key FROM {table} WHERE id IN ({}) AND {expected} ORDER BY id FOR UPDATE",
            id_list(chunk.iter().copied())
        ))?;
        if !locked.is_empty() {
            tx.query_drop(statement(action, &table, &id_list(locked.iter().map(|(id, _)| *id))))?;
            let rows: Vec<(u64, Option<String>)> = locked
                .iter()
                .map(|(id, key)| (*id, Some(audit_detail(group, key))))
                .collect();
            admin::audit(&mut tx, &table, action.name(), &opts.actor, &rows)?;
        }
        tx.commit()?;
        done += locked.len() as u64;
        progress(done, total);
        pace.wait(done);
    }
    log::info!(
        "{done} of {total} dead letters of consumer group {group} in {table} {}ed by {}",
        action.name(),
        opts.actor
    );
    Ok(done)
}

/// Takes the oldest `REPLAY` row of `group` in `tx` (locked, skipping rows other consumers
/// hold): its id, its message and its attempts so far.
pub(crate) fn take_replay(tx: &mut Transaction<'_>, table: &str, group: &str) -> Result<Option<(u64, Message, u32)>> {
    let row: Option<Row> = tx.query_first(format!(
        "SELECT id, event_key, topic, broker, queue_id, queue_offset, msg_id, tag, properties, body, attempts \
         FROM {table} FORCE INDEX (idx_dead_letter_group_status) \
         WHERE consumer_group = {} AND status = '{REPLAY}' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        bytes_lit(group.as_bytes())
    ))?;
    let Some(mut r) = row else { return Ok(None) };
    let id: u64 = r.take(0).unwrap_or_default();
    let key: Vec<u8> = r.take(1).unwrap_or_default();
    let props: Option<String> = r.take(8).unwrap_or_default();
    let properties: BTreeMap<String, String> = props
        .as_deref()
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_default();
    let msg = Message {
        queue: QueueRef {
            topic: r.take(2).unwrap_or_default(),
            broker: r.take::<Option<String>, _>(3).flatten().unwrap_or_default(),
            queue_id: r.take::<Option<u32>, _>(4).flatten().unwrap_or_default(),
        },
        offset: r.take::<Option<u64>, _>(5).flatten().unwrap_or_default(),
        msg_id: r.take(6).unwrap_or_default(),
        key: String::from_utf8_lossy(&key).into_owned(),
        key_source: KeySource::EventKey,
        tag: r.take(7).unwrap_or_default(),
        properties,
        body: r.take(9).unwrap_or_default(),
    };
    let attempts: u32 = r.take(10).unwrap_or_default();
    Ok(Some((id, msg, attempts)))
}

/// Deletes a replayed row inside the transaction that handled it.
pub(crate) fn delete(tx: &mut Transaction<'_>, table: &str, id: u64) -> Result<()> {
    tx.query_drop(format!("DELETE FROM {table} WHERE id = {id}"))?;
    Ok(())
}

/// A replay that failed again: back to `DEAD`, one more attempt, the new error.
pub(crate) fn failed_again(pool: &Pool, table: &str, id: u64, error: &str) -> Result<()> {
    pool.get_conn()?.query_drop(format!(
        "UPDATE {table} SET status = '{DEAD}', attempts = attempts + 1, last_error = {} WHERE id = {id}",
        lit(&cut_chars(error, MAX_ERROR_CHARS))
    ))?;
    Ok(())
}

fn cut_chars(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// `s` cut to at most `n` bytes on a character boundary.
fn cut_bytes(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
