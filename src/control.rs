//! Operator controls of an outbox table (migration V12, `outbox_control`): paused or not. While a
//! table is paused every relay of it stops claiming (what is in flight finishes; nothing is lost
//! or sent twice); relays read the flag at most once a second (`PauseCheck`). Pausing and
//! resuming are audited in `outbox_audit`.

use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Pool, TxOpts};

use crate::error::{Error, Result};
use crate::sql::{lit, opt_lit};

/// Why and since when a table is paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    pub reason: Option<String>,
    pub by: Option<String>,
    /// When it was paused (database clock, `YYYY-MM-DD hh:mm:ss.fff`).
    pub since: String,
}

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "paused since {}", self.since)?;
        if let Some(by) = &self.by {
            write!(f, " by {by}")?;
        }
        if let Some(reason) = &self.reason {
            write!(f, ": {reason}")?;
        }
        Ok(())
    }
}

/// MariaDB's "table does not exist".
const ER_NO_SUCH_TABLE: u16 = 1146;

/// Whether `table` is paused: `Ok(None)` when it is not, or when `outbox_control` does not exist
/// (a database migrated before V12 cannot be paused).
pub fn state<Q: Queryable>(q: &mut Q, table: &str) -> Result<Option<Paused>> {
    // reason, changed_by, changed_at
    type Row = (Option<String>, Option<String>, String);
    let row: std::result::Result<Option<Row>, mysql::Error> = q.query_first(format!(
        "SELECT reason, changed_by, DATE_FORMAT(changed_at, '%Y-%m-%d %H:%i:%s.%f') FROM outbox_control \
         WHERE table_name = {} AND paused = 1",
        lit(table)
    ));
    match row {
        Ok(r) => Ok(r.map(|(reason, by, since)| Paused {
            reason,
            by,
            since: since.get(..23).unwrap_or(&since).to_string(),
        })),
        Err(mysql::Error::MySqlError(e)) if e.code == ER_NO_SUCH_TABLE => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Pauses (`paused = true`) or resumes every relay of `table`, as `actor`, with an optional
/// `reason`; one `outbox_audit` row (`pause` or `resume`, event id 0). Returns whether the state
/// changed (pausing a paused table changes nothing and audits nothing).
pub fn set_paused(pool: &Pool, table: &str, paused: bool, actor: &str, reason: Option<&str>) -> Result<bool> {
    let table = crate::config::table_name("table", table)?;
    let actor = actor.trim();
    if actor.is_empty() || actor.chars().count() > 128 {
        return Err(Error::InvalidEvent {
            field: "actor",
            reason: format!("{actor:?} must be 1 to 128 characters"),
        });
    }
    let reason: Option<String> = reason
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| r.chars().take(512).collect());
    let mut conn = pool.get_conn()?;
    let mut tx = conn.start_transaction(TxOpts::default())?;
    let now: Option<u8> = tx
        .query_first(format!(
            "SELECT paused FROM outbox_control WHERE table_name = {} FOR UPDATE",
            lit(&table)
        ))
        .map_err(|e| missing_table(e, "outbox_control", 12))?;
    if now.unwrap_or(0) == u8::from(paused) {
        tx.commit()?;
        return Ok(false);
    }
    tx.query_drop(format!(
        "INSERT INTO outbox_control (table_name, paused, reason, changed_by, changed_at) VALUES ({t}, {p}, {r}, {a}, NOW(3)) \
         ON DUPLICATE KEY UPDATE paused = VALUES(paused), reason = VALUES(reason), changed_by = VALUES(changed_by), \
         changed_at = VALUES(changed_at)",
        t = lit(&table),
        p = u8::from(paused),
        r = opt_lit(reason.as_deref()),
        a = lit(actor),
    ))?;
    let action = if paused { "pause" } else { "resume" };
    crate::admin::audit(&mut tx, &table, action, actor, &[(0, reason.clone())])?;
    tx.commit()?;
    if paused {
        log::warn!(
            "table {table} paused by {actor}{}: relays stop claiming",
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        );
    } else {
        log::info!("table {table} resumed by {actor}: relays claim again");
    }
    Ok(true)
}

fn missing_table(e: mysql::Error, table: &str, version: u32) -> Error {
    match &e {
        mysql::Error::MySqlError(me) if me.code == ER_NO_SUCH_TABLE => Error::Migration {
            version: 0,
            description: format!("table {table}"),
            reason: format!(
                "does not exist: create it with `outboxd migrate` or outbox::migrate (migration V{version})"
            ),
        },
        _ => Error::Db(e),
    }
}

/// What a relay knows of its table's pause, read at most every [`PauseCheck::EVERY`].
#[derive(Debug)]
pub(crate) struct PauseCheck {
    table: String,
    state: parking_lot::Mutex<(Option<Instant>, Option<Paused>)>,
}

impl PauseCheck {
    /// How often a relay reads the flag: a pause or a resume takes effect within this.
    pub(crate) const EVERY: Duration = Duration::from_secs(1);

    pub(crate) fn new(table: &str) -> PauseCheck {
        PauseCheck {
            table: table.to_string(),
            state: parking_lot::Mutex::new((None, None)),
        }
    }

    /// Whether the table is paused now (read from the database when the last read is older
    /// than [`PauseCheck::EVERY`]; a failed read keeps the last answer). Logs the changes.
    pub(crate) fn paused(&self, pool: &Pool) -> Option<Paused> {
        self.paused_within(pool, Self::EVERY)
    }

    /// How often an idle relay (nothing due at its last look) reads the flag: it reads it again
    /// within [`PauseCheck::EVERY`] before it claims anything, so a pause still stops every claim
    /// within a second; only the state it reports may be this old.
    pub(crate) const IDLE_EVERY: Duration = Duration::from_secs(10);

    /// [`PauseCheck::paused`], reading the database only when the last read is older than `age`.
    pub(crate) fn paused_within(&self, pool: &Pool, age: Duration) -> Option<Paused> {
        let mut s = self.state.lock();
        if s.0.is_some_and(|t| t.elapsed() < age) {
            return s.1.clone();
        }
        s.0 = Some(Instant::now());
        match pool
            .get_conn()
            .map_err(Error::from)
            .and_then(|mut c| state(&mut c, &self.table))
        {
            Ok(now) => {
                match (&s.1, &now) {
                    (None, Some(p)) => log::warn!("table {} is {p}: this relay stops claiming", self.table),
                    (Some(_), None) => log::info!("table {} resumed: this relay claims again", self.table),
                    _ => {}
                }
                s.1 = now;
            }
            Err(e) => log::debug!("could not read whether table {} is paused: {e}", self.table),
        }
        s.1.clone()
    }

    /// The last answer, without reading the database.
    pub(crate) fn last(&self) -> Option<Paused> {
        self.state.lock().1.clone()
    }
}
