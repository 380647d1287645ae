//! The console's state: its configuration, its pools, the relay's live figures, the sessions;
//! and what a page handler returns.

use std::sync::Arc;

use mysql::Pool;

use super::auth::{Sessions, Viewer};
use super::html;
use super::http::{BadParam, Request, Response};
use super::live::Live;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::relay::{Delivery, Relay};

/// The console of one outbox table.
pub struct Console {
    pub(super) config: Config,
    /// The outbox table's database.
    pub(super) pool: Pool,
    /// The consumers' tables' database (`console.consumer.db.url`, else the same).
    pub(super) consumer_pool: Pool,
    pub(super) live: Live,
    pub(super) sessions: Sessions,
}

/// What a page handler returns: a response, or a bad parameter (400), or a database failure
/// (500, with the database's own message).
pub(super) enum Failure {
    Bad(BadParam),
    Db(Error),
}

impl From<BadParam> for Failure {
    fn from(b: BadParam) -> Failure {
        Failure::Bad(b)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Db(e)
    }
}

impl From<mysql::Error> for Failure {
    fn from(e: mysql::Error) -> Failure {
        Failure::Db(e.into())
    }
}

pub(super) type Page = std::result::Result<Response, Failure>;

impl Console {
    /// A console of `config.table`. Opens its own small pools. [`Console::attach`] the relay the
    /// process runs, if any: its rates, latency, breaker and stalls then show on the overview.
    pub fn new(config: &Config) -> Result<Console> {
        config.validate()?;
        let mut small = config.clone();
        small.db_pool_max = 4;
        let pool = crate::db::connect(&small)?;
        let consumer_pool = match &config.console.consumer_db_url {
            Some(url) => crate::db::connect(&Config {
                db_url: url.clone(),
                ..small.clone()
            })?,
            None => pool.clone(),
        };
        Ok(Console {
            config: config.clone(),
            pool,
            consumer_pool,
            live: Live::new(),
            sessions: Sessions::default(),
        })
    }

    /// The relay this process runs, for the overview.
    pub fn attach(&self, relay: Arc<Relay>) {
        self.live.attach(relay);
    }

    /// Records one delivery for the overview's latency histogram: call it from the relay's
    /// [`crate::RelayBuilder::latency_hook`].
    pub fn record(&self, d: &Delivery) {
        self.live.latency.record(d);
    }

    /// Samples the relay's counters for the overview's rates; call it every second (`outboxd`
    /// does, from a thread of its own).
    pub fn sample(&self) {
        self.live.sample();
    }

    /// An action refused (no admin token, no session, a bad CSRF token, another origin):
    /// logged, answered 403, nothing changed.
    pub(super) fn refused(&self, viewer: &Viewer, req: &Request, action: &str, why: &str) -> Response {
        log::warn!(
            "console: {action} refused for {} from {}: {why}",
            viewer.name,
            req.remote
        );
        Response::html(
            403,
            html::frame(
                "Refused",
                &self.config.table,
                viewer,
                "",
                &html::notice("error", &format!("{action}: {why}. Nothing was changed.")),
            ),
        )
    }

    pub(super) fn conn(&self) -> Result<mysql::PooledConn> {
        Ok(self.pool.get_conn()?)
    }
}
