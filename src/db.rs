//! The library's own connections: how a pool is opened from `db.url`.

use std::time::Duration;

use mysql::Pool;

use crate::config::Config;
use crate::error::{Error, Result};

/// Opens a pool for the relay's own statements: a few connections, READ COMMITTED sessions (no
/// gap locks taken by the claim, so business INSERTs never wait on it), no per-return reset.
pub fn connect(config: &Config) -> Result<Pool> {
    open(config, config.db_pool_max.max(1), Vec::new())
}

/// A pool of one connection to `url`, another database than `db.url` (a fleet's coordination or
/// catalog database, a server its watch reads), with the sessions of [`connect`]; a URL the driver
/// refuses is named under `key`.
pub fn connect_one(config: &Config, key: &str, url: &str) -> Result<Pool> {
    let mut c = config.clone();
    c.db_url = url.to_string();
    c.db_pool_max = 1;
    connect(&c).map_err(|e| match e {
        Error::Config(crate::error::ConfigError::InvalidValue { key: k, reason, .. }) if k == "db.url" => {
            crate::error::ConfigError::invalid(key, crate::config::redact_url(url), reason).into()
        }
        other => other,
    })
}

/// Opens the pool of held claim rounds (`claim.strategy = held`): one connection per worker and
/// one for the round being claimed, READ COMMITTED, each session's `wait_timeout` the lease, so
/// a round whose relay stalls mid-send loses its locks when the server drops the connection.
pub fn connect_held(config: &Config) -> Result<Pool> {
    let timeout = held_wait_timeout(config.lease);
    open(
        config,
        config.workers.max(1) + 1,
        vec![format!("SET SESSION wait_timeout = {timeout}")],
    )
}

fn open(config: &Config, max: usize, mut init: Vec<String>) -> Result<Pool> {
    let opts = mysql::Opts::from_url(&config.db_url).map_err(|e| {
        Error::Config(crate::error::ConfigError::invalid(
            "db.url",
            crate::config::redact_url(&config.db_url),
            e.to_string(),
        ))
    })?;
    let constraints = mysql::PoolConstraints::new(1, max).expect("1 <= max");
    let builder = mysql::OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .pool_opts(
            mysql::PoolOpts::default()
                .with_constraints(constraints)
                .with_reset_connection(false),
        )
        .tcp_connect_timeout(Some(Duration::from_secs(5)))
        .read_timeout(Some(Duration::from_secs(30)))
        .write_timeout(Some(Duration::from_secs(30)))
        .init({
            init.insert(0, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".into());
            init
        });
    Ok(Pool::new(builder)?)
}

/// `wait_timeout` for a held connection: `lease` in whole seconds, rounded up, at least 1.
pub fn held_wait_timeout(lease: Duration) -> u64 {
    lease.as_millis().div_ceil(1000).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_timeout_covers_the_lease() {
        assert_eq!(held_wait_timeout(Duration::from_millis(100)), 1);
        assert_eq!(held_wait_timeout(Duration::from_millis(120_000)), 120);
        assert_eq!(held_wait_timeout(Duration::from_millis(120_001)), 121);
    }
}
