//! The `shards` key: the databases one relay serves, as a list of URLs with ranges.
//!
//! Entries are separated by whitespace or commas (a comma inside a password is written `%2C`).
//! Each is a database URL, optionally followed by `#TABLE` for a shard whose outbox table is not
//! `table`. A range `{A..B}` anywhere in an entry stands for one entry per number from A to B;
//! written with leading zeros (`{00..63}`) the numbers keep that width. Several ranges in one
//! entry give every combination. A shard is named by its database (`orders_7`); when two shards
//! of the list have the same database name, every shard is named `host:port/database`.

use super::parse::{redact_url, table_name};
use crate::error::ConfigError;

/// The most shards one list may name.
pub const MAX_SHARDS: usize = 4096;

/// One database of a fleet: its name (the `shard` of metrics, logs, status), URL and table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    pub name: String,
    pub url: String,
    pub table: String,
}

/// The shards of `list`, in the order written, with `default_table` where an entry names none.
/// An error names the key, the entry (its password hidden) and what is wrong with it.
pub fn expand_shards(key: &str, list: &str, default_table: &str) -> Result<Vec<ShardSpec>, ConfigError> {
    let mut out: Vec<(String, String, String, String)> = Vec::new(); // (url, table, db, host:port/db)
    for entry in list
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|e| !e.is_empty())
    {
        let shown = redact_url(entry);
        let (url_part, table) = match entry.rsplit_once('#') {
            Some((u, t)) => (
                u,
                table_name(key, t).map_err(|e| ConfigError::invalid(key, &shown, e.to_string()))?,
            ),
            None => (entry, default_table.to_string()),
        };
        for url in expand_ranges(key, url_part, &shown)? {
            let opts = mysql::Opts::from_url(&url)
                .map_err(|e| ConfigError::invalid(key, redact_url(&url), crate::error::describe_url_error(&e)))?;
            let Some(db) = opts.get_db_name().map(str::to_string).filter(|d| !d.is_empty()) else {
                return Err(ConfigError::invalid(
                    key,
                    redact_url(&url),
                    "names no database: each shard is mysql://user:pass@host:port/database",
                ));
            };
            let long = format!("{}:{}/{db}", opts.get_ip_or_hostname(), opts.get_tcp_port());
            if out.len() == MAX_SHARDS {
                return Err(ConfigError::invalid(
                    key,
                    &shown,
                    format!("names more than {MAX_SHARDS} shards"),
                ));
            }
            out.push((url, table.clone(), db, long));
        }
    }
    if out.is_empty() {
        return Err(ConfigError::invalid(key, list, "names no database"));
    }
    let mut dbs: Vec<&str> = out.iter().map(|s| s.2.as_str()).collect();
    dbs.sort_unstable();
    let short = dbs.windows(2).all(|w| w[0] != w[1]);
    let specs: Vec<ShardSpec> = out
        .iter()
        .map(|(url, table, db, long)| ShardSpec {
            name: if short { db.clone() } else { long.clone() },
            url: url.clone(),
            table: table.clone(),
        })
        .collect();
    let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::invalid(
            key,
            list_shown(list),
            format!("names the database {} twice", w[0]),
        ));
    }
    Ok(specs)
}

fn list_shown(list: &str) -> String {
    list.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|e| !e.is_empty())
        .map(redact_url)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every string `s` stands for, its `{A..B}` ranges expanded, first range outermost.
fn expand_ranges(key: &str, s: &str, shown: &str) -> Result<Vec<String>, ConfigError> {
    let Some(open) = s.find('{') else {
        if s.contains('}') {
            return Err(ConfigError::invalid(key, shown, "has a } without its {"));
        }
        return Ok(vec![s.to_string()]);
    };
    let close = s[open..]
        .find('}')
        .map(|i| open + i)
        .ok_or_else(|| ConfigError::invalid(key, shown, "has a { without its }"))?;
    let inner = &s[open + 1..close];
    let bad = || {
        ConfigError::invalid(
            key,
            shown,
            format!("{{{inner}}} is not a range: write {{A..B}}, e.g. {{0..63}}"),
        )
    };
    let (a, b) = inner.split_once("..").ok_or_else(bad)?;
    if a.is_empty() || b.is_empty() || !a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let (lo, hi): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if lo > hi {
        return Err(ConfigError::invalid(
            key,
            shown,
            format!("{{{inner}}} runs backwards: {lo} is above {hi}"),
        ));
    }
    if hi - lo >= MAX_SHARDS as u64 {
        return Err(ConfigError::invalid(
            key,
            shown,
            format!("{{{inner}}} names more than {MAX_SHARDS} shards"),
        ));
    }
    let width = if a.len() > 1 && a.starts_with('0') { a.len() } else { 0 };
    let rest = expand_ranges(key, &s[close + 1..], shown)?;
    let mut out = Vec::new();
    for n in lo..=hi {
        for tail in &rest {
            out.push(format!("{}{n:0width$}{tail}", &s[..open]));
        }
    }
    Ok(out)
}

/// Each URL of a shard list with its password hidden (the redaction of the `shards` key).
pub fn redact_shards(list: &str) -> String {
    let mut out = String::with_capacity(list.len());
    let mut token = String::new();
    for c in list.chars() {
        if c.is_whitespace() || c == ',' {
            out.push_str(&redact_url(&token));
            token.clear();
            out.push(c);
        } else {
            token.push(c);
        }
    }
    out.push_str(&redact_url(&token));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand_shards("shards", list, "t_event_record")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    #[test]
    fn ranges_lists_and_tables_expand_in_order() {
        assert_eq!(
            names("mysql://u@h:3306/orders_{0..2}"),
            ["orders_0", "orders_1", "orders_2"]
        );
        assert_eq!(names("mysql://u@h/o_{08..10}"), ["o_08", "o_09", "o_10"]);
        assert_eq!(
            names("mysql://u@h/a_{0..1}_{0..1}"),
            ["a_0_0", "a_0_1", "a_1_0", "a_1_1"]
        );
        let s = expand_shards("shards", "mysql://u:pw@h/a, mysql://u@h/b#outbox_b\n", "t_event_record").unwrap();
        assert_eq!(
            s,
            [
                ShardSpec {
                    name: "a".into(),
                    url: "mysql://u:pw@h/a".into(),
                    table: "t_event_record".into()
                },
                ShardSpec {
                    name: "b".into(),
                    url: "mysql://u@h/b".into(),
                    table: "outbox_b".into()
                },
            ]
        );
        // One database name on two servers: every shard gets host:port/database.
        assert_eq!(
            names("mysql://u@h1:3306/orders mysql://u@h2:3307/orders mysql://u@h2:3307/x"),
            ["h1:3306/orders", "h2:3307/orders", "h2:3307/x"]
        );
    }

    #[test]
    fn bad_lists_are_refused_naming_the_entry_without_its_password() {
        let err = |list: &str| expand_shards("shards", list, "t").unwrap_err().to_string();
        for (list, says) in [
            ("", "names no database"),
            (" , ", "names no database"),
            ("mysql://u:secret@h/o_{3..1}", "runs backwards"),
            ("mysql://u:secret@h/o_{a..b}", "is not a range"),
            ("mysql://u:secret@h/o_{1..", "without its }"),
            ("mysql://u:secret@h/o_1}", "without its {"),
            ("mysql://u:secret@h/o_{0..9999}", "more than 4096"),
            ("mysql://u:secret@h/", "names no database"),
            ("mysql://u:secret@h/a#bad-table", "letters, digits or underscores"),
            ("http://u:secret@h/a", "shards"),
            (
                "mysql://u:secret@h/a mysql://u:secret@h/a",
                "names the database h:3306/a twice",
            ),
        ] {
            let e = err(list);
            assert!(e.contains(says), "{list:?}: {e}");
            assert!(e.contains("shards"), "{list:?}: {e}");
            assert!(!e.contains("secret"), "{list:?} leaks the password: {e}");
        }
    }

    #[test]
    fn every_password_of_a_list_is_hidden() {
        assert_eq!(
            redact_shards("mysql://a:p1@h/x, mysql://b:p2@h/y\nmysql://c@h/z"),
            "mysql://a:***@h/x, mysql://b:***@h/y\nmysql://c@h/z"
        );
    }
}
