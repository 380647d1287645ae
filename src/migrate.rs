//! Schema migrations: the SQL files of `migrations/`, applied in version order and recorded in
//! `outbox_schema_history`, one history per outbox table.

use mysql::prelude::Queryable;
use mysql::Pool;

use crate::error::{Error, Result};

/// One migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: u32,
    pub description: &'static str,
    /// The SQL as written for the default table name `t_event_record`.
    pub sql: &'static str,
}

/// Every migration, in order. The files are plain SQL, also usable by hand (or by Flyway).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "create t_event_record",
        sql: include_str!("../migrations/V1__create_t_event_record.sql"),
    },
    Migration {
        version: 2,
        description: "add fencing and delivery columns",
        sql: include_str!("../migrations/V2__add_fencing_and_delivery_columns.sql"),
    },
    Migration {
        version: 3,
        description: "add biz_no index",
        sql: include_str!("../migrations/V3__add_biz_no_index.sql"),
    },
    Migration {
        version: 4,
        description: "create outbox_audit",
        sql: include_str!("../migrations/V4__create_outbox_audit.sql"),
    },
    Migration {
        version: 5,
        description: "biz_no index without status",
        sql: include_str!("../migrations/V5__biz_no_index_without_status.sql"),
    },
    Migration {
        version: 6,
        description: "ordered claim index and queue book",
        sql: include_str!("../migrations/V6__ordered_claim_index_and_queue_book.sql"),
    },
    Migration {
        version: 7,
        description: "seed-era table to the fresh shape",
        sql: include_str!("../migrations/V7__seed_table_to_fresh_shape.sql"),
    },
    Migration {
        version: 8,
        description: "create outbox_inbox",
        sql: include_str!("../migrations/V8__create_outbox_inbox.sql"),
    },
    Migration {
        version: 9,
        description: "add event_key",
        sql: include_str!("../migrations/V9__add_event_key.sql"),
    },
    Migration {
        version: 10,
        description: "create outbox_inbox_dead_letter",
        sql: include_str!("../migrations/V10__create_outbox_inbox_dead_letter.sql"),
    },
    Migration {
        version: 11,
        description: "dead letters by group and key",
        sql: include_str!("../migrations/V11__dead_letter_group_key_index.sql"),
    },
    Migration {
        version: 12,
        description: "create outbox_control",
        sql: include_str!("../migrations/V12__create_outbox_control.sql"),
    },
    Migration {
        version: 13,
        description: "create outbox_claim",
        sql: include_str!("../migrations/V13__create_outbox_claim.sql"),
    },
    Migration {
        version: 14,
        description: "drop idx_status_claimed_at",
        sql: include_str!("../migrations/V14__drop_lease_index.sql"),
    },
    Migration {
        version: 15,
        description: "create outbox_reemit",
        sql: include_str!("../migrations/V15__create_outbox_reemit.sql"),
    },
];

/// What each migration costs a live table, on MariaDB 10.11 (checked with explicit `ALGORITHM`
/// clauses; the same holds for MySQL 8). "Instant" changes only metadata: no copy, writers do
/// not wait (beyond the brief metadata lock every ALTER takes). "Copy" rebuilds the table: reads
/// go on, writes wait until it ends.
pub fn lock_cost(version: u32) -> &'static str {
    match version {
        1 => "CREATE TABLE IF NOT EXISTS: instant; nothing if the table exists",
        2 => "ADD COLUMN of nullable columns, ALGORITHM=INSTANT: instant on any table",
        3 => "CREATE INDEX: in place, LOCK=NONE (writes go on while the index builds)",
        4 => "CREATE TABLE IF NOT EXISTS outbox_audit: instant",
        5 => "DROP + ADD INDEX, ALGORITHM=INPLACE, LOCK=NONE: writes go on while the index builds",
        6 => {
            "DROP + ADD INDEX, ALGORITHM=INPLACE, LOCK=NONE: writes go on while the index builds; \
              CREATE TABLE IF NOT EXISTS outbox_topic_queue: instant"
        }
        7 => {
            "table created by V1: nothing changes, instant. Seed-era table (payload TEXT, signed \
              id/retry_count, DATETIME(0)): claim_owner widening instant, then ONE table copy \
              (ALGORITHM=COPY, LOCK=SHARED) for the type changes: reads go on, writes wait for the \
              copy (about 3 s per 300 000 rows measured)"
        }
        8 => "CREATE TABLE IF NOT EXISTS outbox_inbox: instant; nothing if the table exists",
        9 => "ADD COLUMN event_key (nullable, last), ALGORITHM=INSTANT: instant on any table",
        10 => "CREATE TABLE IF NOT EXISTS outbox_inbox_dead_letter: instant; nothing if the table exists",
        11 => "ADD INDEX IF NOT EXISTS on outbox_inbox_dead_letter, ALGORITHM=INPLACE, LOCK=NONE: writes go on",
        12 => "CREATE TABLE IF NOT EXISTS outbox_control: instant; nothing if the table exists",
        13 => "CREATE TABLE IF NOT EXISTS outbox_claim: instant; nothing if the table exists",
        14 => "DROP INDEX IF EXISTS, ALGORITHM=INPLACE, LOCK=NONE: metadata only, writers go on",
        15 => "CREATE TABLE IF NOT EXISTS outbox_reemit: instant; nothing if the table exists",
        _ => "not documented",
    }
}

/// The statements of migration `version` (written for `default_table`), with their comments
/// removed, for `table` (already validated): how a table of another name gets the same DDL (the
/// inbox, the consumer's dead letters).
pub(crate) fn table_ddl(version: u32, default_table: &str, table: &str) -> Vec<String> {
    let m = MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .expect("a migration of this version exists");
    statements(m.sql)
        .into_iter()
        .map(|s| {
            debug_assert!(s.contains(default_table));
            s.replace(&format!(" {default_table} "), &format!(" {table} "))
        })
        .collect()
}

/// The `CREATE TABLE IF NOT EXISTS` of migration `version` (which creates `default_table`), with
/// its comments removed, for `table` (already validated).
pub(crate) fn create_table_ddl(version: u32, default_table: &str, table: &str) -> String {
    let m = MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .expect("a migration of this version exists");
    let sql: String = m
        .sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let prefix = format!("CREATE TABLE IF NOT EXISTS {default_table} (");
    debug_assert!(sql.contains(&prefix));
    sql.trim()
        .trim_end_matches(';')
        .replacen(&prefix, &format!("CREATE TABLE IF NOT EXISTS {table} ("), 1)
}

/// Checksums of earlier texts of a migration, accepted as applied without a warning. V2 once
/// also widened the time columns (a table copy on a seed-era table); that moved to V7 so such a
/// table is copied once.
const EARLIER_CHECKSUMS: &[(u32, u64)] = &[(2, 6_927_330_175_883_555_706)];

const DEFAULT_TABLE: &str = "t_event_record";

/// The migrations of the consuming half: the inbox (V8), the consumer dead letters (V10) and
/// their index by group and key (V11). A consumer's database needs these alone
/// ([`migrate_consumer`]); each is idempotent, so a database that later gets every migration
/// (an order service that also consumes) runs them again harmlessly.
pub const CONSUMER_MIGRATIONS: &[u32] = &[8, 10, 11];

/// The name the consumer's migrations are recorded under in `outbox_schema_history` (its
/// `table_name` column; the relay's are recorded under their outbox table).
pub const CONSUMER_HISTORY: &str = "outbox_inbox";

/// Which migrations a call applies, and under which name they are recorded.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Every migration, for the outbox table named.
    Table(&'a str),
    /// The consumer's alone ([`CONSUMER_MIGRATIONS`]), recorded under [`CONSUMER_HISTORY`].
    Consumer,
}

impl Scope<'_> {
    fn history(&self) -> &str {
        match self {
            Scope::Table(t) => t,
            Scope::Consumer => CONSUMER_HISTORY,
        }
    }

    fn migrations(&self) -> impl Iterator<Item = &'static Migration> + '_ {
        MIGRATIONS
            .iter()
            .filter(move |m| matches!(self, Scope::Table(_)) || CONSUMER_MIGRATIONS.contains(&m.version))
    }

    /// The migration's statements for this scope (the relay's table name in them).
    fn sql(&self, m: &Migration) -> String {
        match self {
            Scope::Table(t) => m.sql.replace(DEFAULT_TABLE, t),
            Scope::Consumer => m.sql.to_string(),
        }
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this call, in order.
    pub applied: Vec<u32>,
    /// The schema version after the call.
    pub current: u32,
}

/// Applies the pending migrations to the default table `t_event_record`.
pub fn migrate(pool: &Pool) -> Result<MigrationReport> {
    migrate_table(pool, DEFAULT_TABLE)
}

/// Applies the pending migrations to `table` (validated like the `table` key). Safe to call from
/// several instances at once: they serialise on a named lock, and applied versions are skipped.
pub fn migrate_table(pool: &Pool, table: &str) -> Result<MigrationReport> {
    let table = crate::config::table_name("table", table)?;
    migrate_scope(pool, Scope::Table(&table))
}

/// Applies the consuming half's pending migrations alone ([`CONSUMER_MIGRATIONS`]: the inbox and
/// the consumer dead-letter tables), for a database that only consumes: none of the relay's
/// tables is created. Recorded under [`CONSUMER_HISTORY`]; safe from several instances at once.
pub fn migrate_consumer(pool: &Pool) -> Result<MigrationReport> {
    migrate_scope(pool, Scope::Consumer)
}

fn migrate_scope(pool: &Pool, scope: Scope<'_>) -> Result<MigrationReport> {
    let table = scope.history();
    let mut conn = pool.get_conn()?;
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS outbox_schema_history (
           table_name   VARCHAR(64)  NOT NULL,
           version      INT UNSIGNED NOT NULL,
           description  VARCHAR(200) NOT NULL,
           checksum     BIGINT UNSIGNED NOT NULL,
           installed_on DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
           PRIMARY KEY (table_name, version)
         ) ENGINE = InnoDB",
    )?;
    let lock = format!("outbox_migrate_{table}");
    let got: Option<i64> = conn.exec_first("SELECT GET_LOCK(?, 60)", (&lock,))?;
    if got != Some(1) {
        return Err(Error::Migration {
            version: 0,
            description: "migrate".into(),
            reason: format!("could not take the migration lock {lock:?} within 60 s"),
        });
    }
    let result = apply_pending(&mut conn, scope);
    let _: Option<i64> = conn.exec_first("SELECT RELEASE_LOCK(?)", (&lock,))?;
    result
}

/// Checks that the live table's columns can hold what this relay writes: `claim_owner` long
/// enough for `owner` (when `relaying`), `payload` binary and large enough for
/// `payload.max.bytes`. A table created by the seed's DDL and not migrated fails this.
pub fn check_table_shape(pool: &Pool, config: &crate::config::Config, owner: &str, relaying: bool) -> Result<()> {
    let table = crate::config::table_name("table", &config.table)?;
    let mut conn = pool.get_conn()?;
    // (name, COLUMN_TYPE, DATA_TYPE, length in characters, length in bytes)
    type Column = (String, String, String, Option<u64>, Option<u64>);
    let cols: Vec<Column> = conn.exec(
        "SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, CHARACTER_OCTET_LENGTH \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
         AND COLUMN_NAME IN ('claim_owner', 'payload', 'event_key')",
        (&table,),
    )?;
    let col = |name: &str| cols.iter().find(|c| c.0.eq_ignore_ascii_case(name));
    let problem = |column: &str, found: String, required: String| Error::Migration {
        version: 0,
        description: format!("table {table} is not migrated"),
        reason: format!(
            "column {column} is {found}, but must be {required}; run the migrations (`outboxd migrate`, \
             or outbox::migrate_table) to bring the table to the current schema"
        ),
    };
    let need = config.payload_max_bytes as u64;
    match col("payload") {
        None => return Err(problem("payload", "missing".into(), "MEDIUMBLOB NOT NULL".into())),
        Some((_, ty, data_type, _, octets)) => {
            let binary = matches!(
                data_type.to_ascii_lowercase().as_str(),
                "tinyblob" | "blob" | "mediumblob" | "longblob" | "varbinary"
            );
            if !binary || octets.unwrap_or(0) < need {
                return Err(problem(
                    "payload",
                    format!(
                        "{} (holds {} bytes{})",
                        ty.to_ascii_uppercase(),
                        octets.unwrap_or(0),
                        if binary {
                            ""
                        } else {
                            " of text: binary payloads fail with error 1366"
                        }
                    ),
                    format!("a binary column holding payload.max.bytes = {need} bytes (MEDIUMBLOB)"),
                ));
            }
        }
    }
    if relaying {
        let chars = owner.chars().count() as u64;
        match col("claim_owner") {
            None => {
                return Err(problem(
                    "claim_owner",
                    "missing".into(),
                    format!("VARCHAR({})", crate::config::CLAIM_OWNER_MAX_CHARS),
                ))
            }
            Some((_, ty, _, len, _)) if len.unwrap_or(0) < chars => {
                return Err(problem(
                    "claim_owner",
                    ty.to_ascii_uppercase(),
                    format!(
                        "at least VARCHAR({chars}) to hold this instance's id {owner:?} ({chars} characters; \
                         the migrations make it VARCHAR({}))",
                        crate::config::CLAIM_OWNER_MAX_CHARS
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    // Relaying stores keys; enqueueing writes one (the library's INSERT).
    if col("event_key").is_none() {
        return Err(problem(
            "event_key",
            "missing".into(),
            "CHAR(36) NULL (migration V9: an instant ADD COLUMN)".into(),
        ));
    }
    let held = config.claim_strategy == crate::config::ClaimStrategy::Held
        && config.ordering != crate::config::Ordering::PerBizNo;
    if relaying && held {
        let journal: Option<String> = conn.query_first(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'outbox_claim'",
        )?;
        if journal.is_none() {
            return Err(Error::Migration {
                version: 13,
                description: "create outbox_claim".into(),
                reason: "claim.strategy = held journals its rounds in outbox_claim, which is missing; run the \
                         migrations (`outboxd migrate`, or outbox::migrate_table), or set claim.strategy = skip-locked"
                    .into(),
            });
        }
    }
    Ok(())
}

/// One migration [`migrate_table`] would apply, with the statements it would run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMigration {
    pub version: u32,
    pub description: &'static str,
    /// The statements, for the table they would run on.
    pub statements: Vec<String>,
    /// What the migration costs a live table ([`lock_cost`]).
    pub lock_cost: &'static str,
}

/// The migrations [`migrate_table`] would apply to `table`, in order, without changing anything
/// (not even creating the history table).
pub fn plan(pool: &Pool, table: &str) -> Result<Vec<PlannedMigration>> {
    let table = crate::config::table_name("table", table)?;
    plan_scope(pool, Scope::Table(&table))
}

/// The migrations [`migrate_consumer`] would apply, without changing anything.
pub fn plan_consumer(pool: &Pool) -> Result<Vec<PlannedMigration>> {
    plan_scope(pool, Scope::Consumer)
}

fn plan_scope(pool: &Pool, scope: Scope<'_>) -> Result<Vec<PlannedMigration>> {
    let table = scope.history();
    let mut conn = pool.get_conn()?;
    let history: Option<String> = conn.query_first(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
         AND TABLE_NAME = 'outbox_schema_history'",
    )?;
    let done: Vec<u32> = if history.is_some() {
        conn.exec(
            "SELECT version FROM outbox_schema_history WHERE table_name = ?",
            (table,),
        )?
    } else {
        Vec::new()
    };
    Ok(scope
        .migrations()
        .filter(|m| !done.contains(&m.version))
        .map(|m| PlannedMigration {
            version: m.version,
            description: m.description,
            statements: statements(&scope.sql(m)),
            lock_cost: lock_cost(m.version),
        })
        .collect())
}

fn apply_pending(conn: &mut mysql::PooledConn, scope: Scope<'_>) -> Result<MigrationReport> {
    let table = scope.history();
    let done: Vec<(u32, u64)> = conn.exec(
        "SELECT version, checksum FROM outbox_schema_history WHERE table_name = ? ORDER BY version",
        (table,),
    )?;
    let mut applied = Vec::new();
    for m in scope.migrations() {
        let sql = scope.sql(m);
        let sum = checksum(m.sql);
        if let Some((_, recorded)) = done.iter().find(|(v, _)| *v == m.version) {
            if *recorded != sum && !EARLIER_CHECKSUMS.contains(&(m.version, *recorded)) {
                log::warn!(
                    "migration V{} of table {table} changed since it was applied (checksum {recorded} != {sum})",
                    m.version
                );
            }
            continue;
        }
        for stmt in statements(&sql) {
            conn.query_drop(stmt).map_err(|e| Error::Migration {
                version: m.version,
                description: m.description.into(),
                reason: crate::error::describe_db(&e),
            })?;
        }
        conn.exec_drop(
            "INSERT INTO outbox_schema_history (table_name, version, description, checksum) VALUES (?, ?, ?, ?)",
            (table, m.version, m.description, sum),
        )?;
        log::info!("applied migration V{} ({}) to {table}", m.version, m.description);
        applied.push(m.version);
    }
    Ok(MigrationReport {
        applied,
        current: scope.migrations().last().map(|m| m.version).unwrap_or(0),
    })
}

/// Splits a migration file into statements: `;` at the end of a line ends one; `--` lines are
/// comments.
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in sql.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
        if trimmed.ends_with(';') {
            let stmt = cur.trim().trim_end_matches(';').to_string();
            out.push(stmt);
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// FNV-1a of the file text: detects a migration edited after it was applied.
fn checksum(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_split_into_statements_without_comments() {
        let stmts = statements(MIGRATIONS[0].sql);
        assert_eq!(stmts.len(), 1);
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS t_event_record"));
        assert!(!stmts[0].contains("-- the scan"));
        assert_eq!(statements(MIGRATIONS[1].sql).len(), 1);
    }

    #[test]
    fn every_migration_documents_its_lock_cost() {
        for m in MIGRATIONS {
            assert_ne!(lock_cost(m.version), "not documented", "V{}", m.version);
        }
    }

    #[test]
    fn a_created_table_gets_another_name_without_comments() {
        let ddl = create_table_ddl(10, "outbox_inbox_dead_letter", "points_dead");
        assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS points_dead ("), "{ddl}");
        assert!(!ddl.contains("outbox_inbox_dead_letter") && !ddl.contains("--") && !ddl.ends_with(';'));
        assert!(
            ddl.contains("KEY idx_dead_letter_group_status (consumer_group, status, id)"),
            "{ddl}"
        );
    }
}
