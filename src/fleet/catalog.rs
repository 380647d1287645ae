//! The fleet's catalog (`shard.catalog.url`, `docs/fleet.md`): a table the operator keeps, one
//! row per shard, read by `shard.catalog.query` at start and every `shard.catalog.reload.ms`.
//! A row is a URL as `shards` takes them (`{A..B}` ranges, `#table`), or a URL and its table.
//! The fleet serves the shards of `shards` and of the catalog together; a catalog that cannot be
//! read leaves the shards as they are and is reported ([`Catalog::problem`]).

use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use parking_lot::Mutex;

use crate::config::{expand_shards, Config, ShardSpec};
use crate::error::{ConfigError, Result};

/// How often a catalog that cannot be read is logged.
const LOG_EVERY: Duration = Duration::from_secs(60);

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
    let mut c = config.clone();
    c.db_url = url.to_string();
    c.db_pool_max = 1;
    let pool = crate::db::connect(&c).map_err(|e| match e {
        crate::error::Error::Config(ConfigError::InvalidValue { key, reason, .. }) if key == "db.url" => {
            ConfigError::invalid("shard.catalog.url", crate::config::redact_url(url), reason).into()
        }
        other => other,
    })?;
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

/// The last failure to read the catalog, and when it was logged.
#[derive(Default)]
pub(super) struct Catalog {
    problem: Mutex<Option<(String, Instant)>>,
}

impl Catalog {
    /// Why the last read failed, when it did.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().as_ref().map(|(why, _)| why.clone())
    }

    /// Records the outcome of a read: a failure is logged at most once a minute.
    pub fn record<T>(&self, result: &Result<T>) {
        let mut problem = self.problem.lock();
        match result {
            Ok(_) => {
                if problem.take().is_some() {
                    log::info!("fleet catalog: read again; the shards follow it");
                }
            }
            Err(e) => {
                let why = format!("cannot read the shard catalog: {e}");
                if problem.as_ref().is_none_or(|(_, at)| at.elapsed() >= LOG_EVERY) {
                    log::warn!("fleet catalog: {why}; the shards stay as they are");
                    *problem = Some((why, Instant::now()));
                } else if let Some(p) = problem.as_mut() {
                    p.0 = why;
                }
            }
        }
    }
}
