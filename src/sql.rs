//! SQL text the library builds itself: values as literals that nothing can escape.
//!
//! Statements that carry library-generated or caller-given values (ids, tokens, keys, error
//! text) use the text protocol with integers inlined and strings as hex literals: one round trip,
//! nothing interpolated unchecked, and no prepared-statement cache churn from `IN (...)` lists of
//! varying length. Both halves build their statements with these: the relay's in
//! `store.rs`, the consumer's in `inbox.rs` and `consumer/dead_letter.rs`.

use std::fmt::Write as _;

use crate::event::EventId;

/// A string as a SQL hex literal: safe whatever it contains, one round trip, no escaping rules.
pub fn lit(s: &str) -> String {
    format!("CONVERT({} USING utf8mb4)", bytes_lit(s.as_bytes()))
}

/// Bytes as a SQL hex literal (a binary string): safe whatever they contain.
pub fn bytes_lit(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 2 + 3);
    out.push_str("X'");
    for byte in b {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('\'');
    out
}

pub fn opt_lit(s: Option<&str>) -> String {
    s.map(lit).unwrap_or_else(|| "NULL".into())
}

/// Ids as a comma-separated list, for `IN (...)`.
pub fn id_list(ids: impl Iterator<Item = EventId>) -> String {
    let mut s = String::new();
    for id in ids {
        if !s.is_empty() {
            s.push(',');
        }
        let _ = write!(s, "{id}");
    }
    s
}

/// A database or table name as an identifier: in backticks, a backtick inside doubled.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_so_nothing_can_escape() {
        assert_eq!(ident("orders_7"), "`orders_7`");
        assert_eq!(ident("we`ird"), "`we``ird`");
    }

    #[test]
    fn string_literals_are_hex_so_nothing_can_escape() {
        assert_eq!(lit("a'b"), "CONVERT(X'612762' USING utf8mb4)");
        assert_eq!(lit(""), "CONVERT(X'' USING utf8mb4)");
    }
}
