//! The kinds of values a setting takes. A kind parses a key's string into the typed field, prints
//! the field back in the form it parses, says what it accepts (for `outboxd config example` and
//! the README) and whether the value is hidden. Every check of a single value lives in its kind,
//! the special ones too (the inbox retention's minimum, a URL's password kept out of errors, a
//! token never repeated).

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use super::parse::{boolean, choice, fraction, int, millis, namesrv, printable, redact_url, table_name, topic};
use crate::error::ConfigError;

/// How a setting's value is shown in logs, `outboxd config check` and `Config::get_redacted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redaction {
    /// As it is.
    Shown,
    /// `***` when set (a secret: its errors never repeat it either).
    Hidden,
    /// A URL with its password replaced by `***`.
    UrlPassword,
    /// A list of URLs, each with its password replaced by `***`.
    UrlListPasswords,
}

/// A kind of value: the type of the field it sets, its bounds and its string form.
pub(super) trait Kind {
    /// The type of the field.
    type Value;
    /// Whether the value is trimmed of surrounding whitespace before it is parsed.
    const TRIM: bool = true;
    const REDACTION: Redaction = Redaction::Shown;
    /// The value of `v` (already trimmed when [`Kind::TRIM`]); an error names `key` and `v`.
    fn parse(&self, key: &str, v: &str) -> Result<Self::Value, ConfigError>;
    /// The string form of a value, which [`Kind::parse`] gives back.
    fn print(&self, value: &Self::Value) -> String;
    /// What it accepts, in a few words.
    fn describe(&self) -> String;
    /// Whether a field written directly (past `Config::set`) holds a value the key accepts.
    fn check(&self, key: &str, value: &Self::Value) -> Result<(), ConfigError> {
        parse(self, key, &self.print(value)).map(|_| ())
    }
}

/// Parses the raw string of `key` with `kind`, trimmed when the kind says so.
pub(super) fn parse<K: Kind + ?Sized>(kind: &K, key: &str, raw: &str) -> Result<K::Value, ConfigError> {
    kind.parse(key, if K::TRIM { raw.trim() } else { raw })
}

/// The redaction of a kind, for the declarations (a constant).
pub(super) const fn redaction_of<K: Kind>(_: &K) -> Redaction {
    K::REDACTION
}

/// A whole number from `.0` to `.1`.
pub(super) struct Int<T>(pub T, pub T);

impl<T: FromStr + PartialOrd + Display + Copy> Kind for Int<T> {
    type Value = T;
    fn parse(&self, key: &str, v: &str) -> Result<T, ConfigError> {
        int(key, v, self.0, self.1)
    }
    fn print(&self, value: &T) -> String {
        value.to_string()
    }
    fn describe(&self) -> String {
        format!("{} to {}", self.0, self.1)
    }
}

/// A duration in whole milliseconds, from `.0` to `.1`.
pub(super) struct Millis(pub u64, pub u64);

impl Kind for Millis {
    type Value = Duration;
    fn parse(&self, key: &str, v: &str) -> Result<Duration, ConfigError> {
        millis(key, v, self.0, self.1)
    }
    fn print(&self, value: &Duration) -> String {
        value.as_millis().to_string()
    }
    fn describe(&self) -> String {
        format!("{} to {} ms", self.0, self.1)
    }
}

/// A duration in whole milliseconds up to `.0`, where 0 means none.
pub(super) struct OptMillis(pub u64);

impl Kind for OptMillis {
    type Value = Option<Duration>;
    fn parse(&self, key: &str, v: &str) -> Result<Option<Duration>, ConfigError> {
        let ms: u64 = int(key, v, 0, self.0)?;
        Ok((ms > 0).then(|| Duration::from_millis(ms)))
    }
    fn print(&self, value: &Option<Duration>) -> String {
        value.map(|d| d.as_millis()).unwrap_or(0).to_string()
    }
    fn describe(&self) -> String {
        format!("0 to {} ms", self.0)
    }
}

/// How long the inbox keeps its marks, in milliseconds: 0 (keep them) or from `.0` to `.1`; a
/// shorter one is refused, saying why (the broker redelivers for hours).
pub(super) struct InboxRetention(pub Duration, pub u64);

/// Why a retention under the minimum is refused.
pub(super) const RETENTION_TOO_SHORT: &str =
    "must be 0 (keep marks) or at least 3600000 (1 h): RocketMQ redelivers an \
     unacknowledged message for hours, and a copy arriving after its mark is deleted is handled again";

impl Kind for InboxRetention {
    type Value = Option<Duration>;
    fn parse(&self, key: &str, v: &str) -> Result<Option<Duration>, ConfigError> {
        let keep = millis(key, v, 0, self.1)?;
        if !keep.is_zero() && keep < self.0 {
            return Err(ConfigError::invalid(key, v, RETENTION_TOO_SHORT));
        }
        Ok((!keep.is_zero()).then_some(keep))
    }
    fn print(&self, value: &Option<Duration>) -> String {
        OptMillis(self.1).print(value)
    }
    fn describe(&self) -> String {
        format!("0, or {} to {} ms", self.0.as_millis(), self.1)
    }
    fn check(&self, key: &str, value: &Option<Duration>) -> Result<(), ConfigError> {
        match value {
            // Shorter than a millisecond prints as 0 (keep): refused here, not read as keep.
            Some(keep) if *keep < self.0 => Err(ConfigError::invalid(key, keep.as_millis(), RETENTION_TOO_SHORT)),
            _ => parse(self, key, &self.print(value)).map(|_| ()),
        }
    }
}

/// A number from `.0` to `.1`.
pub(super) struct Fraction(pub f64, pub f64);

impl Kind for Fraction {
    type Value = f64;
    fn parse(&self, key: &str, v: &str) -> Result<f64, ConfigError> {
        fraction(key, v, self.0, self.1)
    }
    fn print(&self, value: &f64) -> String {
        value.to_string()
    }
    fn describe(&self) -> String {
        format!("{} to {}", self.0, self.1)
    }
}

/// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`, in any case).
pub(super) struct Bool;

impl Kind for Bool {
    type Value = bool;
    fn parse(&self, key: &str, v: &str) -> Result<bool, ConfigError> {
        boolean(key, v)
    }
    fn print(&self, value: &bool) -> String {
        value.to_string()
    }
    fn describe(&self) -> String {
        "true or false".into()
    }
}

/// One of the names, each standing for a value.
pub(super) struct Choice<T: 'static>(pub &'static [(&'static str, T)]);

impl<T: Copy + PartialEq> Kind for Choice<T> {
    type Value = T;
    fn parse(&self, key: &str, v: &str) -> Result<T, ConfigError> {
        choice(key, v, self.0)
    }
    fn print(&self, value: &T) -> String {
        let name = self.0.iter().find(|(_, t)| t == value).map(|(n, _)| *n);
        name.expect("every value of a choice has a name").to_string()
    }
    fn describe(&self) -> String {
        let names: Vec<&str> = self.0.iter().map(|(n, _)| *n).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

/// The inner kind, in any case (the value is lower-cased first).
pub(super) struct AnyCase<K>(pub K);

impl<K: Kind> Kind for AnyCase<K> {
    type Value = K::Value;
    fn parse(&self, key: &str, v: &str) -> Result<K::Value, ConfigError> {
        self.0.parse(key, &v.to_ascii_lowercase())
    }
    fn print(&self, value: &K::Value) -> String {
        self.0.print(value)
    }
    fn describe(&self) -> String {
        format!("{} (any case)", self.0.describe())
    }
}

/// The inner kind, or empty for none.
pub(super) struct Optional<K>(pub K);

impl<K: Kind> Kind for Optional<K> {
    type Value = Option<K::Value>;
    const TRIM: bool = K::TRIM;
    const REDACTION: Redaction = K::REDACTION;
    fn parse(&self, key: &str, v: &str) -> Result<Option<K::Value>, ConfigError> {
        if v.is_empty() {
            return Ok(None);
        }
        self.0.parse(key, v).map(Some)
    }
    fn print(&self, value: &Option<K::Value>) -> String {
        value.as_ref().map(|v| self.0.print(v)).unwrap_or_default()
    }
    fn describe(&self) -> String {
        format!("{}, or empty", self.0.describe())
    }
}

/// Up to `.0` characters, none of them a space or a control character.
pub(super) struct Text(pub usize);

impl Kind for Text {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        printable(key, v, self.0)
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        format!("1 to {} characters, no spaces", self.0)
    }
}

/// 1 to `.0` characters, none of them a control character (spaces allowed).
pub(super) struct Name(pub usize);

impl Kind for Name {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        if v.is_empty() || v.chars().count() > self.0 || v.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                key,
                v,
                format!("must be 1 to {} characters without control characters", self.0),
            ));
        }
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        format!("1 to {} characters", self.0)
    }
}

/// `consumer.route`: `biz_no`, `queue` or `property:NAME`.
pub(super) struct RouteKind;

impl Kind for RouteKind {
    type Value = super::consumer::Route;
    fn parse(&self, key: &str, v: &str) -> Result<Self::Value, ConfigError> {
        use super::consumer::{Route, MAX_ROUTE_PROPERTY_CHARS};
        match v {
            "biz_no" => Ok(Route::BizNo),
            "queue" => Ok(Route::Queue),
            _ => match v.strip_prefix("property:") {
                Some(name) if printable(key, name, MAX_ROUTE_PROPERTY_CHARS).is_ok() => {
                    Ok(Route::Property(name.into()))
                }
                _ => Err(ConfigError::invalid(
                    key,
                    v,
                    format!(
                        "must be {} (NAME: 1 to {MAX_ROUTE_PROPERTY_CHARS} characters, no spaces)",
                        self.describe()
                    ),
                )),
            },
        }
    }
    fn print(&self, value: &Self::Value) -> String {
        use super::consumer::Route;
        match value {
            Route::BizNo => "biz_no".into(),
            Route::Queue => "queue".into(),
            Route::Property(name) => format!("property:{name}"),
        }
    }
    fn describe(&self) -> String {
        "biz_no, queue or property:NAME".into()
    }
}

/// A table name: it goes into SQL text, so identifier characters only.
pub(super) struct TableName;

impl Kind for TableName {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        table_name(key, v)
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "1 to 64 letters, digits or _, not starting with a digit".into()
    }
}

/// A RocketMQ topic name.
pub(super) struct Topic;

impl Kind for Topic {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        topic(key, v)
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "1 to 127 of A-Z a-z 0-9 _ % | -".into()
    }
}

/// RocketMQ name server addresses, `host:port;host:port`.
pub(super) struct Namesrv;

impl Kind for Namesrv {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        namesrv(key, v)
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "host:port, or several separated by ;".into()
    }
}

/// A MySQL/MariaDB URL the driver accepts. Its password never reaches an error or a log.
pub(super) struct DbUrl;

impl Kind for DbUrl {
    type Value = String;
    const REDACTION: Redaction = Redaction::UrlPassword;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        if v.is_empty() {
            return Err(ConfigError::invalid(key, v, "must not be empty"));
        }
        mysql::Opts::from_url(v)
            .map_err(|e| ConfigError::invalid(key, redact_url(v), crate::error::describe_url_error(&e)))?;
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "mysql://user:pass@host:port/db".into()
    }
}

/// A list of shard databases (`shards.rs`): kept as written, checked by expanding it.
pub(super) struct ShardList;

impl Kind for ShardList {
    type Value = String;
    const REDACTION: Redaction = Redaction::UrlListPasswords;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        super::shards::expand_shards(key, v, "t_event_record")?;
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "database URLs separated by spaces or commas, each with {A..B} ranges and an optional #table".into()
    }
}

/// A socket address to listen on, `host:port` (`.0` is an example for the error).
pub(super) struct Listen(pub &'static str);

impl Kind for Listen {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        v.parse::<std::net::SocketAddr>()
            .map_err(|_| ConfigError::invalid(key, v, format!("expected host:port, e.g. {}", self.0)))?;
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "ip:port".into()
    }
}

/// An OTLP/HTTP collector, `http://host:port` or `https://host:port`.
pub(super) struct OtlpEndpoint;

impl Kind for OtlpEndpoint {
    type Value = String;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        let expected = || ConfigError::invalid(key, v, "expected http://host:port or https://host:port");
        let rest = v
            .strip_prefix("http://")
            .or_else(|| v.strip_prefix("https://"))
            .ok_or_else(expected)?;
        if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
            return Err(expected());
        }
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "http(s)://host:port".into()
    }
}

/// An opaque secret: any text, hidden wherever it is shown.
pub(super) struct Secret;

impl Kind for Secret {
    type Value = String;
    const REDACTION: Redaction = Redaction::Hidden;
    fn parse(&self, _key: &str, v: &str) -> Result<String, ConfigError> {
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        "any text (secret)".into()
    }
}

/// A secret token of at least `.0` printable ASCII characters, taken as given (not trimmed).
/// The error never repeats the value.
pub(super) struct Token(pub usize);

impl Kind for Token {
    type Value = String;
    const TRIM: bool = false;
    const REDACTION: Redaction = Redaction::Hidden;
    fn parse(&self, key: &str, v: &str) -> Result<String, ConfigError> {
        let n = v.chars().count();
        if n < self.0 || !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::invalid(
                key,
                "***",
                format!(
                    "must be at least {} printable ASCII characters without spaces (it has {n})",
                    self.0
                ),
            ));
        }
        Ok(v.to_string())
    }
    fn print(&self, value: &String) -> String {
        value.clone()
    }
    fn describe(&self) -> String {
        format!("{}+ printable ASCII characters (secret)", self.0)
    }
}
