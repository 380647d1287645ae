//! What a configuration key is ([`Setting`]) and the `settings!` macro that turns the one
//! declaration of each key (`settings.rs`) into its entry of [`KEYS`]: the setter, the getter and
//! the check of its field, what it accepts, its redaction. [`Config::set`], [`Config::get`] and
//! [`Config::get_redacted`] go through that entry.

use std::sync::LazyLock;

use super::kinds::Redaction;
use super::parse::redact_url;
use super::typed::Config;
use crate::error::ConfigError;

pub use super::settings::KEYS;

/// The part of the system that reads a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Everything that opens the database: the relay, the consumer, `outboxd`, the console.
    All,
    /// The producing half: enqueue, the relay's threads, the publisher.
    Relay,
    /// The transactions the library owns for a host (`outbox_tx_begin`, Java's and Go's `begin`).
    Transactions,
    /// The consuming half: the consumer runtime and its inbox.
    Consumer,
    /// The daemon only.
    Outboxd,
    /// The operator console, served by `outboxd`.
    Console,
}

impl Reader {
    /// Its name in `outboxd config example` and the README.
    pub fn name(self) -> &'static str {
        match self {
            Reader::All => "every part",
            Reader::Relay => "relay",
            Reader::Transactions => "library transactions",
            Reader::Consumer => "consumer",
            Reader::Outboxd => "outboxd",
            Reader::Console => "console",
        }
    }
}

/// One configuration key, everything about it, from its declaration in `settings.rs`.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub key: &'static str,
    /// What it means, in one line.
    pub doc: &'static str,
    /// Its value in [`Config::default`], in the form [`Config::set`] takes ("" is none).
    pub default: &'static str,
    /// The `seed` profile's value, for the keys a profile sets.
    pub seed: Option<&'static str>,
    /// What `outboxd config example` writes instead of the default (a key that must be given).
    pub example: Option<&'static str>,
    pub read_by: Reader,
    pub redaction: Redaction,
    pub(super) accepts: fn() -> String,
    pub(super) set: fn(&mut Config, &str) -> Result<(), ConfigError>,
    pub(super) get: fn(&Config) -> String,
    pub(super) check: fn(&Config) -> Result<(), ConfigError>,
}

/// The former name of [`Setting`].
pub type KeyInfo = Setting;

impl Setting {
    /// What the key accepts, in a few words (`1 to 3600000 ms`, `skip-locked or per-row`).
    pub fn accepts(&self) -> String {
        (self.accepts)()
    }

    /// Whether the value is a secret: never logged, shown or repeated in an error.
    pub fn is_secret(&self) -> bool {
        self.redaction == Redaction::Hidden
    }

    /// `value` as it may be shown: a secret as `***`, a URL without its password.
    pub fn redact(&self, value: &str) -> String {
        match self.redaction {
            Redaction::Hidden if !value.is_empty() => "***".into(),
            Redaction::UrlPassword => redact_url(value),
            Redaction::UrlListPasswords => super::shards::redact_shards(value),
            _ => value.to_string(),
        }
    }

    /// Checks that the field of `config` holds a value this key accepts (for fields written
    /// directly, past [`Config::set`]).
    pub fn check(&self, config: &Config) -> Result<(), ConfigError> {
        (self.check)(config)
    }
}

/// The setting of `key`, if it is one.
pub fn setting(key: &str) -> Option<&'static Setting> {
    KEYS.iter().find(|s| s.key == key)
}

/// Keys whose values are secrets: shown as `***` by [`Config::get_redacted`].
pub static SECRET_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| KEYS.iter().filter(|s| s.is_secret()).map(|s| s.key).collect());

/// Declares the settings: `"key" { field, [apply,] kind, default, [seed,] [example,] read_by,
/// doc }` each, into `pub static KEYS: &[Setting]`. `field` is the path of the field in
/// [`Config`] the key sets; `apply` (optional) names the `Config` method that takes the parsed
/// value instead of an assignment; `kind` a value of `kinds.rs` parsing the key into the field's
/// type. A missing `default` or `doc` does not compile.
macro_rules! settings {
    (@option) => { None };
    (@option $value:expr) => { Some($value) };
    (@assign $config:ident, $value:ident, $($field:ident).+) => { $config.$($field).+ = $value; };
    (@assign $config:ident, $value:ident, $($field:ident).+, $apply:ident) => { $config.$apply($value); };
    ($(
        $key:literal {
            field: $($field:ident).+,
            $(apply: $apply:ident,)?
            kind: $kind:expr,
            default: $default:expr,
            $(seed: $seed:expr,)?
            $(example: $example:expr,)?
            read_by: $reader:ident,
            doc: $doc:literal $(,)?
        }
    )*) => {
        /// Every configuration key, in documentation order.
        pub static KEYS: &[Setting] = &[$(
            Setting {
                key: $key,
                doc: $doc,
                default: $default,
                seed: settings!(@option $($seed)?),
                example: settings!(@option $($example)?),
                read_by: Reader::$reader,
                redaction: redaction_of(&$kind),
                accepts: || Kind::describe(&$kind),
                set: |config, raw| {
                    let value = parse(&$kind, $key, raw)?;
                    settings!(@assign config, value, $($field).+ $(, $apply)?);
                    Ok(())
                },
                get: |config| Kind::print(&$kind, &config.$($field).+),
                check: |config| Kind::check(&$kind, $key, &config.$($field).+),
            },
        )*];
    };
}
pub(super) use settings;

impl Config {
    /// Sets one key from its string form; the error names the key and the value (never a
    /// secret), and leaves the configuration as it was.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let s = setting(key).ok_or_else(|| ConfigError::UnknownKey { key: key.to_string() })?;
        (s.set)(self, value)?;
        if s.seed.is_some() {
            self.explicit.0.insert(s.key);
        }
        Ok(())
    }

    /// The current value of a key in the form [`Config::set`] accepts; `None` for unknown keys.
    pub fn get(&self, key: &str) -> Option<String> {
        setting(key).map(|s| (s.get)(self))
    }

    /// Like [`Config::get`], with secrets masked and the password removed from URLs.
    pub fn get_redacted(&self, key: &str) -> Option<String> {
        setting(key).map(|s| s.redact(&(s.get)(self)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_key_round_trips_through_get_and_set() {
        let mut c = Config::new("mysql://root@127.0.0.1:3306/test");
        c.rocketmq.access_key = Some("ak".into());
        c.rocketmq.secret_key = Some("sk".into());
        for k in KEYS {
            let v = c.get(k.key).unwrap_or_else(|| panic!("get({}) is None", k.key));
            let mut d = c.clone();
            d.set(k.key, &v)
                .unwrap_or_else(|e| panic!("set({}, {v:?}): {e}", k.key));
            assert_eq!(d, c, "key {}", k.key);
        }
    }

    /// Every declaration is whole: a key once, a doc line, a default that is the default, and a
    /// default, seed value and example that its kind accepts and gives back.
    #[test]
    fn every_key_is_declared_with_a_doc_line_and_a_default_its_kind_accepts() {
        let defaults = Config::default();
        let mut seen = HashSet::new();
        for k in KEYS {
            assert!(seen.insert(k.key), "{} is declared twice", k.key);
            assert!(!k.doc.trim().is_empty(), "{} is declared without a doc line", k.key);
            assert!(!k.doc.contains('\n'), "the doc of {} is more than one line", k.key);
            assert!(!k.accepts().is_empty(), "{} says nothing of what it accepts", k.key);
            assert_eq!(
                defaults.get(k.key).as_deref(),
                Some(k.default),
                "Config::default() does not hold the declared default of {}",
                k.key
            );
            let mut c = Config::default();
            match c.set(k.key, k.default) {
                Ok(()) => assert_eq!(c, defaults, "setting {} to its default changes something", k.key),
                // A key that must be given has no default its kind accepts: it shows an example.
                Err(e) => assert!(
                    k.default.is_empty() && k.example.is_some(),
                    "the default of {} is refused ({e}) and no example stands in for it",
                    k.key
                ),
            }
            for (what, v) in [("seed value", k.seed), ("example", k.example)] {
                if let Some(v) = v {
                    let mut c = Config::default();
                    c.set(k.key, v)
                        .unwrap_or_else(|e| panic!("the {what} of {} is refused: {e}", k.key));
                    assert_eq!(c.get(k.key).as_deref(), Some(v), "the {what} of {} reads back", k.key);
                }
            }
        }
    }

    /// The defaults other code names as constants are the declared ones (the text ones are used
    /// by the declarations themselves).
    #[test]
    fn the_defaults_named_by_constants_are_the_declared_ones() {
        let d = Config::default();
        assert_eq!(d.consumer.batch_max, super::super::DEFAULT_BATCH_MAX);
        assert_eq!(d.consumer.retention, Some(super::super::DEFAULT_INBOX_RETENTION));
        assert_eq!(d.consumer.inbox_table, super::super::DEFAULT_INBOX_TABLE);
        assert_eq!(d.console.listen, super::super::DEFAULT_CONSOLE_LISTEN);
    }

    #[test]
    fn the_seed_profile_sets_exactly_the_declared_seed_values() {
        let seed = Config::seed_compatible("mysql://root@127.0.0.1/test");
        let default = Config::new("mysql://root@127.0.0.1/test");
        for k in KEYS.iter().filter(|k| k.key != "profile") {
            match k.seed {
                Some(want) => assert_eq!(seed.get(k.key).as_deref(), Some(want), "{}", k.key),
                None => assert_eq!(seed.get(k.key), default.get(k.key), "{}", k.key),
            }
        }
    }

    #[test]
    fn secrets_and_url_passwords_are_redacted() {
        assert_eq!(
            SECRET_KEYS.as_slice(),
            [
                "rocketmq.access.key",
                "rocketmq.secret.key",
                "console.admin.token",
                "console.read.token"
            ]
        );
        let mut c = Config::new("mysql://app:pw@db/x");
        c.set("console.consumer.db.url", "mysql://cons:pw2@db/y").unwrap();
        c.set("console.admin.token", "0123456789abcdef-admin").unwrap();
        assert_eq!(c.get_redacted("db.url").unwrap(), "mysql://app:***@db/x");
        assert_eq!(
            c.get_redacted("console.consumer.db.url").unwrap(),
            "mysql://cons:***@db/y"
        );
        assert_eq!(c.get_redacted("console.admin.token").unwrap(), "***");
        assert_eq!(
            c.get_redacted("console.read.token").unwrap(),
            "",
            "an unset secret shows as empty"
        );
        assert_eq!(c.get_redacted("table").unwrap(), "t_event_record");
        assert_eq!(c.get_redacted("no.such.key"), None);
    }

    #[test]
    fn unknown_key_and_invalid_value_are_distinct_and_named() {
        let mut c = Config::default();
        assert_eq!(
            c.set("scan.intervall.ms", "1"),
            Err(ConfigError::UnknownKey {
                key: "scan.intervall.ms".into()
            })
        );
        let e = c.set("scan.interval.ms", "soon").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("scan.interval.ms") && msg.contains("soon"), "{msg}");
        assert!(matches!(e, ConfigError::InvalidValue { .. }));
    }

    #[test]
    fn table_name_with_sql_is_refused() {
        let mut c = Config::default();
        let e = c.set("table", "t; DROP TABLE x").unwrap_err().to_string();
        assert!(e.contains("table") && e.contains("t; DROP TABLE x"), "{e}");
        assert!(c.set("table", "1abc").is_err());
        assert!(c.set("table", "orders_outbox").is_ok());
    }
}
