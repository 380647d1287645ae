//! `outboxd run` against a database that may not be reachable yet: what went wrong, in plain
//! words, and whether waiting can help.

use std::io::ErrorKind;

use outbox::{Config, Error};

/// A start-up failure, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Waiting can help (the database is down, restarting, unreachable, overloaded).
    Transient(String),
    /// Waiting cannot help (wrong password, unknown database, a table not migrated, a
    /// configuration error): fail at once.
    Fatal(String),
}

/// `host:port` of `db.url`.
pub fn address(config: &Config) -> String {
    match mysql::Opts::from_url(&config.db_url) {
        Ok(o) => format!("{}:{}", o.get_ip_or_hostname(), o.get_tcp_port()),
        Err(_) => outbox::config::redact_url(&config.db_url),
    }
}

/// The first I/O error kind in the error's chain of causes.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

fn kind_words(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ConnectionRefused => "connection refused",
        ErrorKind::TimedOut | ErrorKind::WouldBlock => "no answer, timed out",
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => "connection reset",
        ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => "the server closed the connection",
        ErrorKind::NotFound => "host not found",
        ErrorKind::AddrNotAvailable | ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
            "no route to the host"
        }
        _ => "network error",
    }
}

/// Judges a failed start and says what is wrong without the driver's debug text.
pub fn judge(e: &Error, config: &Config) -> Verdict {
    let addr = address(config);
    let opts = mysql::Opts::from_url(&config.db_url).ok();
    let user = opts
        .as_ref()
        .and_then(|o| o.get_user().map(str::to_string))
        .unwrap_or_default();
    let db = opts
        .as_ref()
        .and_then(|o| o.get_db_name().map(str::to_string))
        .unwrap_or_default();
    let Error::Db(me) = e else {
        return Verdict::Fatal(e.to_string());
    };
    match me {
        mysql::Error::MySqlError(s) => match s.code {
            1045 => Verdict::Fatal(format!(
                "the database at {addr} refused the login of user {user:?} (access denied, error 1045): \
                 check the user and password in db.url"
            )),
            1044 => Verdict::Fatal(format!(
                "user {user:?} may not use database {db:?} at {addr} (access denied, error 1044): \
                 grant it access or change db.url"
            )),
            1049 => Verdict::Fatal(format!(
                "there is no database {db:?} at {addr} (unknown database, error 1049): check db.url, \
                 or create the database"
            )),
            1146 => Verdict::Fatal(format!(
                "the table {} does not exist in {db:?} at {addr} (error 1146): run `outboxd migrate`",
                config.table
            )),
            code => Verdict::Transient(format!("the database at {addr} answered error {code}: {}", s.message)),
        },
        mysql::Error::DriverError(mysql::DriverError::ConnectTimeout) => {
            Verdict::Transient(format!("cannot reach the database at {addr} (connect timed out)"))
        }
        mysql::Error::DriverError(mysql::DriverError::CouldNotConnect(Some((_, _, kind)))) => {
            Verdict::Transient(format!("cannot reach the database at {addr} ({})", kind_words(*kind)))
        }
        mysql::Error::UrlError(u) => Verdict::Fatal(format!("db.url is not a valid database URL: {u}")),
        mysql::Error::IoError(io) => Verdict::Transient(format!(
            "cannot reach the database at {addr} ({})",
            kind_words(io.kind())
        )),
        // The driver implements only the old `cause`: look into the codec error itself.
        mysql::Error::CodecError(c) => match io_kind(c) {
            Some(kind) => Verdict::Transient(format!("cannot reach the database at {addr} ({})", kind_words(kind))),
            None => Verdict::Transient(format!("the database at {addr} failed: {c}")),
        },
        other => match io_kind(other) {
            Some(kind) => Verdict::Transient(format!("cannot reach the database at {addr} ({})", kind_words(kind))),
            None => Verdict::Transient(format!("the database at {addr} failed: {other}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::new("mysql://app:pw@db.example:3307/orders")
    }

    #[test]
    fn refused_and_timed_out_connections_are_transient_in_plain_words() {
        let refused = Error::Db(mysql::Error::DriverError(mysql::DriverError::CouldNotConnect(Some((
            "db.example:3307".into(),
            "Connection refused (os error 111)".into(),
            ErrorKind::ConnectionRefused,
        )))));
        assert_eq!(
            judge(&refused, &cfg()),
            Verdict::Transient("cannot reach the database at db.example:3307 (connection refused)".into())
        );
        let eagain = Error::Db(mysql::Error::IoError(std::io::Error::from(ErrorKind::WouldBlock)));
        assert_eq!(
            judge(&eagain, &cfg()),
            Verdict::Transient("cannot reach the database at db.example:3307 (no answer, timed out)".into())
        );
        // "CodecError { IO error: Resource temporarily unavailable (os error 11) }", as in the field.
        let codec = Error::Db(mysql::Error::CodecError(
            std::io::Error::from(ErrorKind::WouldBlock).into(),
        ));
        assert!(matches!(judge(&codec, &cfg()), Verdict::Transient(m) if m.contains("timed out")));
        let gone = Error::Db(mysql::Error::server_disconnected());
        assert!(matches!(judge(&gone, &cfg()), Verdict::Transient(m) if m.contains("closed the connection")));
    }
}
