//! What is generated from the declared settings for people to read: `outboxd config example`
//! (every key with its default, as a TOML file) and the README's table of keys (checked against
//! the README by `tests/settings.rs`).

use super::keys::{Setting, KEYS};

/// Every key with its meaning, reader, what it accepts and its default, as a commented TOML file
/// that loads as it stands (what `outboxd config example` prints).
pub fn example_toml() -> String {
    let mut out = String::from(
        "# outbox.toml: every key with its default. Each key can also be set by an\n\
         # environment variable (scan.interval.ms -> OUTBOX_SCAN_INTERVAL_MS) or by --set key=value.\n\n",
    );
    for k in KEYS {
        out.push_str(&format!("# {}\n", k.doc));
        let seed = k.seed.map(|s| format!("; seed profile: {s}")).unwrap_or_default();
        out.push_str(&format!(
            "# read by {}; accepts {}{seed}\n",
            k.read_by.name(),
            k.accepts()
        ));
        let v = k.example.unwrap_or(k.default);
        if v.parse::<f64>().is_ok() || v == "true" || v == "false" {
            out.push_str(&format!("\"{}\" = {v}\n\n", k.key));
        } else {
            out.push_str(&format!(
                "\"{}\" = \"{}\"\n\n",
                k.key,
                v.replace('\\', "\\\\").replace('"', "\\\"")
            ));
        }
    }
    out
}

/// The README's table of keys, in Markdown.
pub fn reference_table() -> String {
    let mut out = String::from("| Key | Default | Accepts | Read by | Meaning |\n|---|---|---|---|---|\n");
    for k in KEYS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            k.key,
            default_cell(k),
            cell(&k.accepts()),
            k.read_by.name(),
            cell(k.doc)
        ));
    }
    out
}

fn default_cell(k: &Setting) -> String {
    let shown = match (k.default, k.example) {
        ("", Some(e)) => format!("required, e.g. `{}`", code(e)),
        ("", None) => "empty".into(),
        (d, _) => format!("`{}`", code(d)),
    };
    match k.seed {
        Some(s) => format!("{shown} (seed: `{}`)", code(s)),
        None => shown,
    }
}

/// Text that stays inside its cell and shows as written.
fn cell(s: &str) -> String {
    code(s).replace('<', "&lt;").replace('>', "&gt;")
}

/// The same inside a code span (where entities are not read).
fn code(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_names_every_key_once_with_its_doc() {
        let example = example_toml();
        for k in KEYS {
            assert_eq!(
                example.matches(&format!("\n\"{}\" = ", k.key)).count(),
                1,
                "{} in the example",
                k.key
            );
            assert!(example.contains(&format!("# {}\n", k.doc)), "{}", k.key);
        }
    }

    #[test]
    fn the_table_has_a_row_per_key() {
        let table = reference_table();
        assert_eq!(table.lines().count(), KEYS.len() + 2);
        assert!(
            table.contains("| `batch.size` | `500` (seed: `20`) | 1 to 10000 | relay |"),
            "{table}"
        );
        assert!(
            table.contains("| `db.url` | required, e.g. `mysql://root@127.0.0.1:3306/test` |"),
            "{table}"
        );
        assert!(table.contains("1 to 127 of A-Z a-z 0-9 _ % \\| -"), "{table}");
    }
}
