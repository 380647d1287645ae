//! The library's own connections: how a pool is opened from `db.url`.

use std::time::Duration;

use mysql::Pool;

use crate::config::Config;
use crate::error::{Error, Result};

/// Opens a pool for the relay's own statements: a few connections, READ COMMITTED sessions (no
/// gap locks taken by the claim, so business INSERTs never wait on it), no per-return reset.
pub fn connect(config: &Config) -> Result<Pool> {
    let opts = mysql::Opts::from_url(&config.db_url).map_err(|e| {
        Error::Config(crate::error::ConfigError::invalid(
            "db.url",
            crate::config::redact_url(&config.db_url),
            e.to_string(),
        ))
    })?;
    let constraints = mysql::PoolConstraints::new(1, config.db_pool_max.max(1)).expect("1 <= max");
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
        .init(vec!["SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"]);
    Ok(Pool::new(builder)?)
}
