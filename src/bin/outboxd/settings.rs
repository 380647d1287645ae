//! Effective configuration: defaults, then the TOML file, then `OUTBOX_*` environment
//! variables, then `--set key=value` flags. Every error is collected, each naming the key, the
//! value and where it came from.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use outbox::{Config, ConfigError, KEYS};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(String),
    Env(String),
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {p}"),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Flag => write!(f, "flag --set"),
        }
    }
}

/// One problem with the configuration.
#[derive(Debug, Clone)]
pub struct Problem {
    pub source: Source,
    pub error: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.error, self.source)
    }
}

/// The environment variable of a key: `scan.interval.ms` → `OUTBOX_SCAN_INTERVAL_MS`.
pub fn env_name(key: &str) -> String {
    format!("OUTBOX_{}", key.to_ascii_uppercase().replace(['.', '-'], "_"))
}

pub struct Effective {
    pub config: Config,
    pub sources: BTreeMap<&'static str, Source>,
}

/// Loads the effective configuration, or every problem found.
pub fn load(
    file: Option<&Path>,
    sets: &[String],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Effective, Vec<Problem>> {
    let mut config = Config::default();
    let mut sources: BTreeMap<&'static str, Source> = KEYS.iter().map(|k| (k.key, Source::Default)).collect();
    let mut problems = Vec::new();
    // Keys whose value was refused: checks across keys that involve them are not reported on
    // top (they would judge the default standing in for the refused value).
    let mut refused: Vec<String> = Vec::new();
    let mut apply =
        |config: &mut Config, key: &str, value: &str, source: Source, problems: &mut Vec<Problem>| match config
            .set(key, value)
        {
            Ok(()) => {
                if let Some(k) = KEYS.iter().find(|k| k.key == key) {
                    sources.insert(k.key, source);
                }
            }
            Err(e) => {
                refused.push(key.to_string());
                problems.push(Problem {
                    source,
                    error: redact_error(key, e),
                })
            }
        };

    // Every key and value with its source, in order of precedence (file, env, flags). The
    // profile is applied first whatever its place, so that every other key overrides it.
    let mut entries: Vec<(String, String, Source)> = Vec::new();
    if let Some(path) = file {
        let shown = path.display().to_string();
        match std::fs::read_to_string(path) {
            Err(e) => problems.push(Problem {
                source: Source::File(shown.clone()),
                error: format!("cannot read the config file: {e}"),
            }),
            Ok(text) => match text.parse::<toml::Table>() {
                Err(e) => problems.push(Problem {
                    source: Source::File(shown.clone()),
                    error: format!("not valid TOML: {e}"),
                }),
                Ok(table) => {
                    let mut flat = Vec::new();
                    flatten("", &table, &mut flat);
                    for (key, value) in flat {
                        match value {
                            Ok(v) => entries.push((key, v, Source::File(shown.clone()))),
                            Err(kind) => problems.push(Problem {
                                source: Source::File(shown.clone()),
                                error: format!(
                                    "{key}: a {kind} is not a valid value (use a string, number or boolean)"
                                ),
                            }),
                        }
                    }
                }
            },
        }
    }
    for k in KEYS {
        let var = env_name(k.key);
        if let Some(v) = env(&var) {
            entries.push((k.key.to_string(), v, Source::Env(var)));
        }
    }
    for s in sets {
        match s.split_once('=') {
            Some((k, v)) => entries.push((k.trim().to_string(), v.to_string(), Source::Flag)),
            None => problems.push(Problem {
                source: Source::Flag,
                error: format!("--set {s:?} is not key=value"),
            }),
        }
    }
    if let Some((key, value, source)) = entries.iter().rev().find(|(k, _, _)| k == "profile") {
        apply(&mut config, key, value, source.clone(), &mut problems);
    }
    for (key, value, source) in entries.into_iter().filter(|(k, _, _)| k != "profile") {
        apply(&mut config, &key, &value, source, &mut problems);
    }
    // The checks across keys, all of them, with the source of the keys involved.
    for e in config.problems() {
        let keys: Vec<&str> = match &e {
            ConfigError::UnknownKey { key } | ConfigError::InvalidValue { key, .. } => vec![key.as_str()],
            ConfigError::Inconsistent { keys, .. } => keys.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        if keys.iter().any(|k| refused.iter().any(|r| r == k)) {
            continue;
        }
        let source = keys
            .iter()
            .filter_map(|k| sources.get(k).cloned())
            .find(|s| !matches!(s, Source::Default))
            .unwrap_or(Source::Default);
        problems.push(Problem {
            source,
            error: e.to_string(),
        });
    }
    if problems.is_empty() {
        Ok(Effective { config, sources })
    } else {
        Err(problems)
    }
}

/// Errors name the value, but never a secret or a password in a URL.
fn redact_error(key: &str, e: ConfigError) -> String {
    if outbox::config::setting(key).is_some_and(|s| s.is_secret()) {
        if let ConfigError::InvalidValue { key, reason, .. } = e {
            return format!("invalid value \"***\" for {key}: {reason}");
        }
    }
    e.to_string()
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, Result<String, &'static str>)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            toml::Value::String(s) => out.push((key, Ok(s.clone()))),
            toml::Value::Integer(i) => out.push((key, Ok(i.to_string()))),
            toml::Value::Float(f) => out.push((key, Ok(f.to_string()))),
            toml::Value::Boolean(b) => out.push((key, Ok(b.to_string()))),
            toml::Value::Array(_) => out.push((key, Err("list"))),
            toml::Value::Datetime(_) => out.push((key, Err("date"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// A directory of the test's own under the temp dir, removed when the test ends, passed or not.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let dir = TempDir::new("outboxd-test");
        let f = dir.0.join("o.toml");
        std::fs::write(
            &f,
            "db.url = \"mysql://root@127.0.0.1/x\"\n[scan]\ninterval.ms = 200\n[batch]\nsize = 7\n",
        )
        .unwrap();
        let env = |v: &str| (v == "OUTBOX_SCAN_INTERVAL_MS").then(|| "300".to_string());
        let e = load(Some(&f), &["batch.size=9".into()], env).unwrap();
        assert_eq!(e.config.scan_interval.as_millis(), 300);
        assert_eq!(e.config.batch_size, 9);
        assert_eq!(
            e.sources["scan.interval.ms"],
            Source::Env("OUTBOX_SCAN_INTERVAL_MS".into())
        );
        assert_eq!(e.sources["batch.size"], Source::Flag);
    }

    #[test]
    fn every_error_is_reported_with_key_value_and_source() {
        let e = load(
            None,
            &[
                "batch.size=lots".into(),
                "no.such=1".into(),
                "db.url=mysql://root@h/x".into(),
            ],
            no_env,
        )
        .err()
        .unwrap();
        assert_eq!(e.len(), 2);
        let all = e.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n");
        assert!(
            all.contains("batch.size") && all.contains("lots") && all.contains("flag --set"),
            "{all}"
        );
        assert!(all.contains("no.such"), "{all}");
    }

    #[test]
    fn the_seed_profile_is_applied_first_and_later_keys_override_it() {
        let dir = TempDir::new("outboxd-profile");
        let f = dir.0.join("o.toml");
        // Sorted, "batch.size" comes before "profile" in the file: it still overrides the profile.
        std::fs::write(
            &f,
            "db.url = \"mysql://root@127.0.0.1/x\"\nbatch.size = 7\nprofile = \"seed\"\n",
        )
        .unwrap();
        let e = load(Some(&f), &["max.retry=9".into()], no_env).unwrap();
        let seed = Config::seed_compatible("mysql://root@127.0.0.1/x");
        assert_eq!(e.config.profile, outbox::config::Profile::Seed);
        assert_eq!(e.config.batch_size, 7, "the file's key overrides the profile");
        assert_eq!(e.config.max_retry, 9, "the flag overrides the profile");
        assert_eq!(e.config.lease, seed.lease);
        assert_eq!(e.config.scan_interval, seed.scan_interval);
        assert_eq!(e.config.claim_strategy, seed.claim_strategy);
        assert_eq!(e.sources["profile"], Source::File(f.display().to_string()));
        let bad = load(
            None,
            &["profile=seeds".into(), "db.url=mysql://root@h/x".into()],
            no_env,
        )
        .err()
        .unwrap();
        let all = bad.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n");
        assert!(
            all.contains("profile") && all.contains("\"seeds\"") && all.contains("default, seed"),
            "{all}"
        );
    }

    #[test]
    fn env_names_follow_the_keys() {
        assert_eq!(env_name("scan.interval.ms"), "OUTBOX_SCAN_INTERVAL_MS");
    }
}
