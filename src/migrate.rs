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
];

const DEFAULT_TABLE: &str = "t_event_record";

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
            description: "lock".into(),
            reason: format!("could not take the migration lock {lock:?} within 60 s"),
        });
    }
    let result = apply_pending(&mut conn, &table);
    let _: Option<i64> = conn.exec_first("SELECT RELEASE_LOCK(?)", (&lock,))?;
    result
}

fn apply_pending(conn: &mut mysql::PooledConn, table: &str) -> Result<MigrationReport> {
    let done: Vec<(u32, u64)> = conn.exec(
        "SELECT version, checksum FROM outbox_schema_history WHERE table_name = ? ORDER BY version",
        (table,),
    )?;
    let mut applied = Vec::new();
    for m in MIGRATIONS {
        let sql = m.sql.replace(DEFAULT_TABLE, table);
        let sum = checksum(m.sql);
        if let Some((_, recorded)) = done.iter().find(|(v, _)| *v == m.version) {
            if *recorded != sum {
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
        current: MIGRATIONS.last().map(|m| m.version).unwrap_or(0),
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
}
