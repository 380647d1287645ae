//! The consumer inbox: effectively-once processing on the consuming side (docs/inbox.md).
//!
//! Delivery from the relay is at least once, so a consumer sees some events twice. The inbox
//! records, in the consumer's own database transaction, that a consumer group has processed an
//! event key, and runs the consumer's handler only for keys it has not seen:
//!
//! ```no_run
//! # fn credit(tx: &mut mysql::Transaction<'_>, order: &str) -> outbox::Result<()> { Ok(()) }
//! use outbox::inbox::{Inbox, MessageMeta, Outcome};
//! # fn main() -> outbox::Result<()> {
//! # let pool = mysql::Pool::new("mysql://root@127.0.0.1/shop")?;
//! let inbox = Inbox::new("outbox_inbox")?;
//! let mut conn = pool.get_conn()?;
//! let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
//! let outcome = inbox.process(&mut tx, "points-service", "orders:ORD-42", &MessageMeta::default(), |tx| {
//!     credit(tx, "ORD-42")
//! })?;
//! tx.commit()?; // the mark and the credit commit together (or neither does)
//! if outcome.is_duplicate() { /* already credited: acknowledge the message and move on */ }
//! # Ok(())
//! # }
//! ```
//!
//! **Claim first.** The `(group, key)` row is inserted *before* the handler runs, inside the same
//! transaction. A second copy of the event handled at the same time by another connection waits
//! on the row's primary key until the first transaction ends: if it commits, the second gets a
//! duplicate-key error, which [`Inbox::process`] turns into [`Outcome::Duplicate`] (the statement
//! fails, the transaction stays usable); if it rolls back, the second inserts the row and runs
//! the handler. A rollback of the handler's transaction un-does the mark, so the event can be
//! processed again.

use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{IsolationLevel, Pool, Transaction, TxOpts};

use crate::error::{Error, Result};

/// The inbox table's default name (the one `migrations/V8__create_outbox_inbox.sql` creates).
pub const DEFAULT_TABLE: &str = crate::config::DEFAULT_INBOX_TABLE;

/// How long a processed key is kept by default: 7 days. A key must outlive every way the same
/// event can come back: RocketMQ redelivers a message a consumer did not acknowledge for hours
/// (by default 16 retries from 10 s to 2 h apart, almost 5 h in all) before moving it to the
/// group's dead-letter queue; the relay itself may send an event twice (at-least-once, and a
/// send that outlives its lease is repeated); and the relay's own dead letters (`outboxd dead-letters replay`) or a replayed RocketMQ
/// dead-letter queue can send an event again days later. A key deleted before its last copy
/// arrives lets that copy run the handler a second time.
pub const DEFAULT_RETENTION: Duration = crate::config::DEFAULT_INBOX_RETENTION;

/// Rows deleted per statement by [`purge_processed`] by default: each batch is its own short
/// transaction.
pub const DEFAULT_PURGE_BATCH: usize = 500;

/// The longest one [`purge_processed`] call runs by default before it returns (the next call
/// goes on where it stopped).
pub const DEFAULT_PURGE_TIME_LIMIT: Duration = Duration::from_secs(2);

/// The longest consumer group name, in bytes (RocketMQ's limit; the column is `VARCHAR(255)`).
pub const MAX_GROUP_BYTES: usize = 255;

/// The longest event key, in bytes (the column is `VARBINARY(255)`).
pub const MAX_KEY_BYTES: usize = 255;

/// The longest message id stored with a mark, in characters.
pub const MAX_MSG_ID_CHARS: usize = 128;

/// MySQL/MariaDB "duplicate entry for key": only the failing statement is rolled back.
const ER_DUP_ENTRY: u16 = 1062;

/// Where a message came from, stored with its mark so operators can trace a processed key back to
/// the broker. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageMeta {
    pub topic: Option<String>,
    pub queue_id: Option<u32>,
    pub queue_offset: Option<u64>,
    /// The broker's message id.
    pub msg_id: Option<String>,
}

/// What [`Inbox::process`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The key was new: it is marked in the transaction and the handler ran, returning this.
    Processed(T),
    /// The group had already processed the key (a committed mark exists): the handler did not run.
    Duplicate,
}

impl<T> Outcome<T> {
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// The handler's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(v) => Some(v),
            Outcome::Duplicate => None,
        }
    }
}

/// The inbox table of one database: marks keys as processed in the consumer's transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    table: String,
}

impl Inbox {
    /// An inbox on `table`, validated like the outbox table's name (1 to 64 letters, digits or
    /// underscores, not starting with a digit). Nothing is read from the database.
    pub fn new(table: &str) -> Result<Inbox> {
        Ok(Inbox {
            table: crate::config::table_name("inbox.table", table)?,
        })
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Marks `key` as processed by `group` inside `tx` (claim-first), without running anything.
    /// `Ok(true)`: the key is new and now marked (the mark commits or rolls back with `tx`).
    /// `Ok(false)`: a committed mark exists, the key is a duplicate; `tx` stays usable.
    ///
    /// If another transaction holds an uncommitted mark of the same key, this waits for it to end
    /// (up to `innodb_lock_wait_timeout`, then a retriable error 1205): a commit makes this a
    /// duplicate, a rollback lets this mark the key.
    pub fn mark(&self, tx: &mut Transaction<'_>, group: &str, key: &str, meta: &MessageMeta) -> Result<bool> {
        let params = mark_params(group, key, meta)?;
        match tx.exec_drop(self.mark_statement(1, false, false), params) {
            Ok(()) => Ok(true),
            Err(mysql::Error::MySqlError(e)) if e.code == ER_DUP_ENTRY => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs `handler` in `tx` once per `(group, key)`: marks the key first (see [`Inbox::mark`]),
    /// then runs the handler only if the key was new. Commit `tx` afterwards: the mark and the
    /// handler's writes commit together.
    ///
    /// If the handler returns an error, the error is returned and the mark stays in `tx`: roll
    /// the transaction back (dropping it does) so that a later copy can process the event.
    pub fn process<T, E, F>(
        &self,
        tx: &mut Transaction<'_>,
        group: &str,
        key: &str,
        meta: &MessageMeta,
        handler: F,
    ) -> std::result::Result<Outcome<T>, E>
    where
        F: FnOnce(&mut Transaction<'_>) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        if !self.mark(tx, group, key, meta)? {
            log::debug!("inbox {}: {group} already processed {key:?}", self.table);
            return Ok(Outcome::Duplicate);
        }
        handler(tx).map(Outcome::Processed)
    }

    /// Whether `group` has a mark of `key` visible to `q` (a pre-check only: two copies can both
    /// see "no"; [`Inbox::process`] is what decides).
    pub fn is_processed<Q: Queryable>(&self, q: &mut Q, group: &str, key: &str) -> Result<bool> {
        check_group(group)?;
        check_key(key)?;
        let found: Option<u8> = q.exec_first(
            format!(
                "SELECT 1 FROM {} WHERE consumer_group = ? AND event_key = ?",
                self.table
            ),
            (group, key.as_bytes()),
        )?;
        Ok(found.is_some())
    }

    /// Deletes this inbox's marks older than `older_than` ([`purge_processed`]).
    pub fn purge(&self, pool: &Pool, older_than: Duration, batch: usize, time_limit: Duration) -> Result<u64> {
        purge_processed(pool, &self.table, older_than, batch, time_limit)
    }

    /// Marks the keys of `items` (key and metadata, in queue order) as processed by `group` inside
    /// `tx`, in one statement: what [`Inbox::mark`] does for one key, for a whole batch. Returns,
    /// per item, whether it is the first item of a key that was new (now marked); a later item
    /// with the same key, or a key the group had already processed, is `false`. Keys are marked
    /// in byte order, so two batches sharing keys take their locks in the same order and never
    /// deadlock on each other's marks.
    ///
    /// `returning`: the server has `INSERT ... RETURNING` (MariaDB 10.5 and later), which names
    /// the keys it inserted. Without it the statement only says how many it inserted: when that
    /// is fewer than the distinct keys, which ones existed is unknown and the result is `None`
    /// (roll `tx` back and mark one key at a time). Values are checked before anything is sent,
    /// as [`Inbox::mark`] does, so `INSERT IGNORE` only ever skips existing keys.
    pub fn mark_many(
        &self,
        tx: &mut Transaction<'_>,
        group: &str,
        items: &[(&str, MessageMeta)],
        returning: bool,
    ) -> Result<Option<Vec<bool>>> {
        // The first item of each key, in key order.
        let mut first: Vec<usize> = Vec::with_capacity(items.len());
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        for (i, (key, _)) in items.iter().enumerate() {
            if seen.insert(*key) {
                first.push(i);
            }
        }
        first.sort_by(|a, b| items[*a].0.as_bytes().cmp(items[*b].0.as_bytes()));
        let mut params = Vec::with_capacity(first.len() * MARK_PARAMS);
        for &i in &first {
            params.extend(mark_params(group, items[i].0, &items[i].1)?);
        }
        let sql = self.mark_statement(first.len(), true, returning);
        let new: std::collections::HashSet<Vec<u8>> = if returning {
            tx.exec::<Vec<u8>, _, _>(sql, params)?.into_iter().collect()
        } else {
            tx.exec_drop(sql, params)?;
            if tx.affected_rows() != first.len() as u64 {
                return Ok(None);
            }
            first.iter().map(|&i| items[i].0.as_bytes().to_vec()).collect()
        };
        let mut out = vec![false; items.len()];
        for &i in &first {
            out[i] = new.contains(items[i].0.as_bytes());
        }
        Ok(Some(out))
    }

    /// The INSERT of `rows` marks, every value a parameter ([`mark_params`]): a prepared
    /// statement, which the connection keeps (the mysql crate caches them per connection, by
    /// text), so a batch size seen before is sent as values alone, not as SQL to parse again.
    /// Measured in benches/README.md ("The consuming half").
    fn mark_statement(&self, rows: usize, ignore: bool, returning: bool) -> String {
        let mut sql = format!(
            "INSERT {}INTO {} {MARK_COLUMNS} VALUES ",
            if ignore { "IGNORE " } else { "" },
            self.table
        );
        for i in 0..rows {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(MARK_ROW);
        }
        if returning {
            sql.push_str(" RETURNING event_key");
        }
        sql
    }
}

/// One mark's values, in the order of [`MARK_COLUMNS`], after checking each one (the bad value
/// named in the error, nothing sent).
fn mark_params(group: &str, key: &str, meta: &MessageMeta) -> Result<Vec<mysql::Value>> {
    check_group(group)?;
    check_key(key)?;
    if let Some(topic) = &meta.topic {
        if topic.chars().count() > crate::event::MAX_TOPIC_CHARS {
            return Err(invalid(
                "topic",
                format!(
                    "{:?} is {} characters, longer than the {} a topic can be",
                    shorten(topic),
                    topic.chars().count(),
                    crate::event::MAX_TOPIC_CHARS
                ),
            ));
        }
    }
    if let Some(id) = &meta.msg_id {
        if id.chars().count() > MAX_MSG_ID_CHARS {
            return Err(invalid(
                "msg_id",
                format!(
                    "{:?} is {} characters, longer than the {MAX_MSG_ID_CHARS} the inbox keeps",
                    shorten(id),
                    id.chars().count()
                ),
            ));
        }
    }
    Ok(vec![
        group.into(),
        key.as_bytes().into(),
        meta.topic.as_deref().into(),
        meta.queue_id.into(),
        meta.queue_offset.into(),
        meta.msg_id.as_deref().into(),
    ])
}

/// The columns a mark sets: the values of [`mark_params`], then the database's clock.
const MARK_COLUMNS: &str = "(consumer_group, event_key, topic, queue_id, queue_offset, msg_id, processed_at)";
/// One mark's row of placeholders in [`Inbox::mark_statement`].
const MARK_ROW: &str = "(?, ?, ?, ?, ?, ?, NOW(3))";
/// The parameters of one mark.
const MARK_PARAMS: usize = 6;

/// Whether the server behind `conn` has `INSERT ... RETURNING` (MariaDB 10.5 and later; MySQL
/// has none): what [`Inbox::mark_many`] learns new keys by.
pub fn has_insert_returning<Q: Queryable>(conn: &mut Q) -> Result<bool> {
    let version: Option<String> = conn.query_first("SELECT VERSION()")?;
    Ok(version.as_deref().is_some_and(|v| {
        let mut parts = v
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        v.contains("MariaDB") && (major, minor) >= (10, 5)
    }))
}

impl Default for Inbox {
    fn default() -> Inbox {
        Inbox {
            table: DEFAULT_TABLE.into(),
        }
    }
}

/// Creates the inbox table `table` if it does not exist (the DDL of migration V8 with the name
/// replaced; `table` is validated). [`crate::migrate()`] creates the default `outbox_inbox`; call
/// this for another name. Safe to call again and from several instances at once.
pub fn migrate_inbox(pool: &Pool, table: &str) -> Result<()> {
    let table = crate::config::table_name("inbox.table", table)?;
    let ddl = inbox_ddl(&table);
    pool.get_conn()?.query_drop(&ddl).map_err(|e| Error::Migration {
        version: 8,
        description: format!("create inbox table {table}"),
        reason: crate::error::describe_db(&e),
    })
}

/// The `CREATE TABLE IF NOT EXISTS` of migration V8 for `table` (already validated).
fn inbox_ddl(table: &str) -> String {
    crate::migrate::create_table_ddl(8, DEFAULT_TABLE, table)
}

/// Deletes the marks of `table` processed more than `older_than` ago, oldest first, `batch` rows
/// per statement, for at most `time_limit`; returns the rows deleted. Each batch is its own short
/// READ COMMITTED transaction walking `idx_inbox_processed_at`, so it locks only the rows it
/// deletes (no gap locks that would stop consumers inserting marks) and never for long. A call
/// that reaches `time_limit` returns early; the next call goes on.
///
/// `older_than` shorter than the broker's redelivery window lets duplicates through: see
/// [`DEFAULT_RETENTION`].
pub fn purge_processed(
    pool: &Pool,
    table: &str,
    older_than: Duration,
    batch: usize,
    time_limit: Duration,
) -> Result<u64> {
    let sql = purge_statement(table, older_than, batch)?;
    let t = table;
    let mut conn = pool.get_conn()?;
    let started = Instant::now();
    let mut deleted = 0u64;
    loop {
        let mut tx =
            conn.start_transaction(TxOpts::default().set_isolation_level(Some(IsolationLevel::ReadCommitted)))?;
        tx.query_drop(&sql)?;
        let n = tx.affected_rows();
        tx.commit()?;
        deleted += n;
        if (n as usize) < batch || started.elapsed() >= time_limit {
            break;
        }
    }
    if deleted > 0 {
        log::info!(
            "inbox {t}: deleted {deleted} marks older than {} s",
            older_than.as_secs()
        );
    }
    Ok(deleted)
}

/// Forgets that `group` processed the events `keys` (`outboxd inbox forget`, through
/// `crate::reemit::forget`): deletes their marks in `table`, so the group's consumers handle the
/// next copy of each as new. With `dry_run`, counts the marks that would go and deletes nothing.
/// Returns the number of marks deleted (or found). One statement, in the caller's connection's
/// own transaction.
pub fn forget_keys<Q: Queryable>(
    conn: &mut Q,
    table: &str,
    group: &str,
    keys: &[String],
    dry_run: bool,
) -> Result<u64> {
    let t = crate::config::table_name("inbox.table", table)?;
    check_group(group)?;
    if keys.is_empty() {
        return Ok(0);
    }
    let list = keys
        .iter()
        .map(|k| crate::sql::bytes_lit(k.as_bytes()))
        .collect::<Vec<_>>()
        .join(",");
    let whr = format!(
        "consumer_group = {} AND event_key IN ({list})",
        crate::sql::bytes_lit(group.as_bytes())
    );
    if dry_run {
        let n: Option<u64> = conn.query_first(format!("SELECT COUNT(*) FROM {t} WHERE {whr}"))?;
        return Ok(n.unwrap_or(0));
    }
    Ok(conn.query_iter(format!("DELETE FROM {t} WHERE {whr}"))?.affected_rows())
}

/// The DELETE of one retention batch ([`purge_processed`] runs it until a batch comes back short).
/// It walks `idx_inbox_processed_at` from the oldest mark as long as `batch` is small next to the
/// table (MariaDB 10.11 scans the table only when one batch would take most of it, which is then
/// small).
pub fn purge_statement(table: &str, older_than: Duration, batch: usize) -> Result<String> {
    let t = crate::config::table_name("inbox.table", table)?;
    if batch == 0 {
        return Err(crate::error::ConfigError::invalid("inbox.retention.batch", 0, "must be at least 1").into());
    }
    Ok(format!(
        "DELETE FROM {t} WHERE processed_at < NOW(3) - INTERVAL {us} MICROSECOND ORDER BY processed_at LIMIT {batch}",
        us = older_than.as_micros(),
    ))
}

pub(crate) fn check_group(group: &str) -> Result<()> {
    let ok = !group.is_empty()
        && group.len() <= MAX_GROUP_BYTES
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%' | b'|'));
    if ok {
        Ok(())
    } else if group.is_empty() {
        Err(invalid("consumer_group", "must not be empty".into()))
    } else {
        Err(invalid(
            "consumer_group",
            format!(
                "{:?} must be 1 to {MAX_GROUP_BYTES} characters of [A-Za-z0-9_%|-] (a RocketMQ consumer group)",
                shorten(group)
            ),
        ))
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid("event_key", "must not be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid(
            "event_key",
            format!(
                "{:?} is {} bytes, longer than the {MAX_KEY_BYTES} the inbox holds",
                shorten(key),
                key.len()
            ),
        ));
    }
    Ok(())
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::InvalidEvent { field, reason }
}

/// A value cut to a readable length for an error message.
fn shorten(s: &str) -> String {
    const SHOWN: usize = 40;
    if s.chars().count() <= SHOWN {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(SHOWN).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated_and_named_in_the_error() {
        assert!(Inbox::new("points_inbox").is_ok());
        let e = Inbox::new("inbox; DROP TABLE x").unwrap_err().to_string();
        assert!(e.contains("inbox.table") && e.contains("inbox; DROP TABLE x"), "{e}");
        assert!(Inbox::new("").is_err());
        assert!(Inbox::new("1inbox").is_err());
    }

    #[test]
    fn bad_groups_and_keys_are_refused_with_their_value() {
        let m = MessageMeta::default();
        let e = mark_params("", "k", &m).unwrap_err().to_string();
        assert!(e.contains("consumer_group") && e.contains("empty"), "{e}");
        let e = mark_params("points group", "k", &m).unwrap_err().to_string();
        assert!(e.contains("consumer_group") && e.contains("\"points group\""), "{e}");
        let e = mark_params(&"g".repeat(256), "k", &m).unwrap_err().to_string();
        assert!(e.contains("consumer_group"), "{e}");
        let e = mark_params("points", "", &m).unwrap_err().to_string();
        assert!(e.contains("event_key") && e.contains("empty"), "{e}");
        let e = mark_params("points", &"k".repeat(256), &m).unwrap_err().to_string();
        assert!(
            e.contains("event_key") && e.contains("256 bytes") && e.contains("255"),
            "{e}"
        );
        assert!(mark_params("points", &"k".repeat(255), &m).is_ok());
        let long_topic = MessageMeta {
            topic: Some("t".repeat(128)),
            ..MessageMeta::default()
        };
        let e = mark_params("points", "k", &long_topic).unwrap_err().to_string();
        assert!(e.contains("topic") && e.contains("128 characters"), "{e}");
        let long_id = MessageMeta {
            msg_id: Some("m".repeat(129)),
            ..MessageMeta::default()
        };
        let e = mark_params("points", "k", &long_id).unwrap_err().to_string();
        assert!(e.contains("msg_id"), "{e}");
    }

    #[test]
    fn values_are_parameters_so_nothing_can_escape() {
        let inbox = Inbox::default();
        let meta = MessageMeta {
            topic: Some("T'; DROP TABLE x; --".into()),
            queue_id: Some(3),
            queue_offset: Some(42),
            msg_id: None,
        };
        let params = mark_params("g", "k' OR 1=1 --", &meta).unwrap();
        assert_eq!(params[1], mysql::Value::Bytes(b"k' OR 1=1 --".to_vec()));
        assert_eq!(params[2], mysql::Value::Bytes(b"T'; DROP TABLE x; --".to_vec()));
        assert_eq!(params[5], mysql::Value::NULL);
        assert_eq!(params.len(), MARK_PARAMS);
        assert_eq!(
            inbox.mark_statement(2, true, true),
            "INSERT IGNORE INTO outbox_inbox (consumer_group, event_key, topic, queue_id, queue_offset, msg_id, processed_at) \
             VALUES (?, ?, ?, ?, ?, ?, NOW(3)), (?, ?, ?, ?, ?, ?, NOW(3)) RETURNING event_key"
        );
        assert_eq!(inbox.mark_statement(1, false, false).matches('?').count(), MARK_PARAMS);
    }

    #[test]
    fn the_inbox_ddl_takes_the_configured_name_only() {
        let ddl = inbox_ddl("points_inbox");
        assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS points_inbox ("), "{ddl}");
        assert!(
            !ddl.contains("outbox_inbox") && !ddl.contains("--") && !ddl.ends_with(';'),
            "{ddl}"
        );
        assert!(ddl.contains("KEY idx_inbox_processed_at (processed_at)"), "{ddl}");
    }

    #[test]
    fn default_retention_is_a_week() {
        assert_eq!(DEFAULT_RETENTION, Duration::from_secs(604_800));
    }
}
