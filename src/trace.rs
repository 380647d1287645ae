//! W3C trace context carried through the outbox (docs/tracing.md): an event's `traceparent` and
//! `tracestate` are two of its headers, checked when the event is written, stored with the row,
//! sent unchanged as message properties of the same names (the names OpenTelemetry's RocketMQ
//! instrumentation uses), and read back by the consumer runtime. This module is the format; the
//! spans are in `telemetry` (cargo feature `otel`).

use std::collections::BTreeMap;

use crate::error::Error;

/// The header (and message property) names, from the wire contract.
pub use crate::wire::{TRACEPARENT, TRACESTATE};
/// Longest `tracestate` accepted (the W3C limit vendors must propagate).
pub const MAX_TRACESTATE_CHARS: usize = 512;
/// Most list members of a `tracestate` (W3C).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A parsed `traceparent`: `version-traceid-parentid-flags`, lowercase hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub version: u8,
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` by the W3C rules: version `00` is exactly
    /// `00-<32 hex>-<16 hex>-<2 hex>`; a later version may carry more after a `-`; `ff` is
    /// invalid; ids of all zeros are invalid; hex is lowercase. `Err` says what is wrong.
    pub fn parse(s: &str) -> Result<TraceParent, String> {
        let b = s.as_bytes();
        if b.len() < 55 {
            return Err(format!("is {} characters, a traceparent has 55", b.len()));
        }
        let version = hex_byte(&b[0..2]).ok_or("the version is not two lowercase hex digits")?;
        if version == 0xff {
            return Err("version ff is invalid".into());
        }
        if version == 0 && b.len() != 55 {
            return Err(format!("is {} characters, a version 00 traceparent has 55", b.len()));
        }
        if version != 0 && b.len() > 55 && b[55] != b'-' {
            return Err("has characters after the flags not separated by '-'".into());
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err("is not version-traceid-parentid-flags separated by '-'".into());
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i]).ok_or("the trace id is not 32 lowercase hex digits")?;
        }
        let mut parent_id = [0u8; 8];
        for (i, out) in parent_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i]).ok_or("the parent id is not 16 lowercase hex digits")?;
        }
        let flags = hex_byte(&b[53..55]).ok_or("the flags are not two lowercase hex digits")?;
        if trace_id == [0; 16] {
            return Err("the trace id is all zeros".into());
        }
        if parent_id == [0; 8] {
            return Err("the parent id is all zeros".into());
        }
        Ok(TraceParent {
            version,
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// As a version 00 `traceparent`.
    pub fn to_header(&self) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.parent_id), self.flags)
    }
}

/// Checks a `tracestate` by the W3C rules: at most 512 characters and 32 list members, each
/// `key=value` with a key of `[a-z0-9_*/@-]` starting with a letter or digit and a value of
/// printable ASCII without `,` or `=`, not ending in a space. `Err` says what is wrong.
pub fn check_tracestate(s: &str) -> Result<(), String> {
    let n = s.chars().count();
    if n > MAX_TRACESTATE_CHARS {
        return Err(format!("is {n} characters, more than {MAX_TRACESTATE_CHARS}"));
    }
    let members: Vec<&str> = s
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    if members.len() > MAX_TRACESTATE_MEMBERS {
        return Err(format!(
            "has {} list members, more than {MAX_TRACESTATE_MEMBERS}",
            members.len()
        ));
    }
    for m in members {
        let Some((key, value)) = m.split_once('=') else {
            return Err(format!("member {m:?} is not key=value"));
        };
        let key_ok = !key.is_empty()
            && key.len() <= 256
            && key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-*/@".contains(c));
        if !key_ok {
            return Err(format!("member {m:?} has an invalid key"));
        }
        let value_ok = !value.is_empty()
            && value.len() <= 256
            && !value.ends_with(' ')
            && value.chars().all(|c| (' '..='~').contains(&c) && c != ',' && c != '=');
        if !value_ok {
            return Err(format!("member {m:?} has an invalid value"));
        }
    }
    Ok(())
}

/// Checks the trace headers among an event's headers: a `traceparent` must parse, a
/// `tracestate` must be valid and comes only with a `traceparent`. The error names the header
/// and shows the value.
pub(crate) fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), Error> {
    if let Some(tp) = headers.get(TRACEPARENT) {
        TraceParent::parse(tp).map_err(|why| invalid(TRACEPARENT, format!("{tp:?} {why}")))?;
    }
    if let Some(ts) = headers.get(TRACESTATE) {
        if !headers.contains_key(TRACEPARENT) {
            return Err(invalid(TRACESTATE, format!("{ts:?} is given without a traceparent")));
        }
        check_tracestate(ts).map_err(|why| invalid(TRACESTATE, format!("{ts:?} {why}")))?;
    }
    Ok(())
}

/// The trace context in `headers` (or message properties), if there is a valid one.
pub fn context_of(headers: &BTreeMap<String, String>) -> Option<(TraceParent, Option<&str>)> {
    let tp = TraceParent::parse(headers.get(TRACEPARENT)?).ok()?;
    Some((tp, headers.get(TRACESTATE).map(String::as_str)))
}

fn hex_byte(b: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(b[0])? << 4 | d(b[1])?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::InvalidEvent { field, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_prints_back() {
        let tp = TraceParent::parse(GOOD).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(tp.sampled());
        assert_eq!(tp.to_header(), GOOD);
        // A later version may carry more fields after its flags.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra";
        assert_eq!(TraceParent::parse(future).unwrap().version, 1);
    }

    #[test]
    fn malformed_traceparents_are_refused_saying_why() {
        for (bad, why) in [
            ("", "55"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "version 00",
            ),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ff"),
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "trace id"),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "all zeros"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "all zeros"),
            ("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "separated"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz", "flags"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                "after the flags",
            ),
        ] {
            let e = TraceParent::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tracestate_follows_the_w3c_limits() {
        check_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE").unwrap();
        check_tracestate("vendor@tenant=x, other=y ").unwrap();
        assert!(check_tracestate(&format!("a={}", "x".repeat(600)))
            .unwrap_err()
            .contains("512"));
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(check_tracestate(&many.join(","))
            .unwrap_err()
            .contains("33 list members"));
        assert!(check_tracestate("novalue").unwrap_err().contains("key=value"));
        assert!(check_tracestate("Upper=x").unwrap_err().contains("key"));
        assert!(check_tracestate("k=a=b").unwrap_err().contains("value"));
    }

    #[test]
    fn a_tracestate_without_a_traceparent_is_refused_showing_its_value() {
        let mut h = BTreeMap::new();
        h.insert(TRACESTATE.to_string(), "rojo=00f067aa0ba902b7".to_string());
        match check_headers(&h).unwrap_err() {
            Error::InvalidEvent { field, reason } => {
                assert_eq!(field, TRACESTATE);
                assert_eq!(reason, "\"rojo=00f067aa0ba902b7\" is given without a traceparent");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_headers_are_checked_together() {
        let mut h = BTreeMap::new();
        h.insert(TRACESTATE.to_string(), "k=v".to_string());
        let e = check_headers(&h).unwrap_err().to_string();
        assert!(e.contains("tracestate") && e.contains("without a traceparent"), "{e}");
        h.insert(TRACEPARENT.to_string(), GOOD.to_string());
        check_headers(&h).unwrap();
        h.insert(TRACEPARENT.to_string(), "00-bad".to_string());
        let e = check_headers(&h).unwrap_err().to_string();
        assert!(e.contains("traceparent") && e.contains("00-bad"), "{e}");
        assert!(context_of(&h).is_none());
    }
}
