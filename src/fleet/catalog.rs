//! The fleet's catalog (`shard.catalog.url`, `docs/fleet.md`): a table the operator keeps, one
//! row per shard, read by `shard.catalog.query` at start and every `shard.catalog.reload.ms`.
//! A row is a URL as `shards` takes them (`{A..B}` ranges, `#table`), or a URL and its table.
//! The fleet serves the shards of `shards` and of the catalog together; a catalog that cannot be
//! read leaves the shards as they are and is reported ([`Catalog::problem`]).

use mysql::prelude::Queryable;
use parking_lot::Mutex;

use super::problem::Problem;
use crate::config::{expand_shards, Config, ShardSpec};
use crate::error::{ConfigError, Result};

/// Every shard `config` names: its `shards`, then the rows of its catalog when it has one.
pub fn fleet_shards(config: &Config) -> Result<Vec<ShardSpec>> {
    let Some(url) = &config.shard_catalog_url else {
        return Ok(config.shard_specs()?);
    };
    let rows = read(config, url)?;
    // Each list alone first, so that an error names the key whose list has it.
    config.shard_specs()?;
    if !rows.trim().is_empty() {
        expand_shards("shard.catalog.query", &rows, &config.table)?;
    }
    let both = match &config.shards {
        Some(list) => format!("{list} {rows}"),
        None => rows,
    };
    if both.trim().is_empty() {
        return Ok(Vec::new());
    }
    expand_shards("shards", &both, &config.table).map_err(|e| {
        ConfigError::Inconsistent {
            keys: vec!["shards".into(), "shard.catalog.query".into()],
            reason: format!("together: {e}"),
        }
        .into()
    })
}

/// The catalog's rows as one list of entries (`url` or `url#table`, separated by spaces).
fn read(config: &Config, url: &str) -> Result<String> {
    let pool = crate::db::connect_one(config, "shard.catalog.url", url)?;
    let rows: Vec<mysql::Row> = pool.get_conn()?.query(&config.shard_catalog_query)?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in rows {
        let text = |i: usize| -> Option<String> {
            row.as_ref(i).and_then(|v| match v {
                mysql::Value::Bytes(b) => Some(String::from_utf8_lossy(b).trim().to_string()),
                _ => None,
            })
        };
        let Some(url) = text(0).filter(|u| !u.is_empty()) else {
            continue;
        };
        match text(1).filter(|t| !t.is_empty()) {
            Some(table) => entries.push(format!("{url}#{table}")),
            None => entries.push(url),
        }
    }
    Ok(entries.join(" "))
}

/// The last failure to read the catalog.
#[derive(Default)]
pub(super) struct Catalog {
    problem: Mutex<Problem>,
}

impl Catalog {
    /// Why the last read failed, when it did.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().why().map(str::to_string)
    }

    /// Records the outcome of a read: a failure is logged at most once a minute.
    pub fn record<T>(&self, result: &Result<T>) {
        let mut problem = self.problem.lock();
        match result {
            Ok(_) => {
                if problem.clear() {
                    log::info!("fleet catalog: read again; the shards follow it");
                }
            }
            Err(e) => {
                let why = format!("cannot read the shard catalog: {e}");
                if problem.fail(why.clone()) {
                    log::warn!("fleet catalog: {why}; the shards stay as they are");
                }
            }
        }
    }
}
