//! Parsers of configuration values: each error names the key and the value, and says what the
//! key accepts.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;

/// Replaces the password of a `scheme://user:password@host/...` URL with `***`.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.rfind('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!("{}{}:***{}", &url[..scheme_end + 3], &userinfo[..colon], &rest[at..]);
            }
        }
    }
    url.to_string()
}

pub(super) fn int<T>(key: &str, v: &str, min: T, max: T) -> Result<T, ConfigError>
where
    T: FromStr + PartialOrd + Display + Copy,
{
    let n: T = v
        .parse()
        .map_err(|_| ConfigError::invalid(key, v, format!("expected a whole number from {min} to {max}")))?;
    if n < min || n > max {
        return Err(ConfigError::invalid(key, v, format!("must be from {min} to {max}")));
    }
    Ok(n)
}

pub(super) fn millis(key: &str, v: &str, min: u64, max: u64) -> Result<Duration, ConfigError> {
    int(key, v, min, max).map(Duration::from_millis)
}

pub(super) fn fraction(key: &str, v: &str, min: f64, max: f64) -> Result<f64, ConfigError> {
    let x: f64 = v
        .parse()
        .map_err(|_| ConfigError::invalid(key, v, format!("expected a number from {min} to {max}")))?;
    if !(min..=max).contains(&x) {
        return Err(ConfigError::invalid(key, v, format!("must be from {min} to {max}")));
    }
    Ok(x)
}

pub(super) fn boolean(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::invalid(key, v, "expected true or false")),
    }
}

pub(super) fn choice<T: Copy>(key: &str, v: &str, options: &[(&str, T)]) -> Result<T, ConfigError> {
    options
        .iter()
        .find(|(name, _)| *name == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            ConfigError::invalid(key, v, format!("expected one of {}", names.join(", ")))
        })
}

pub(super) fn printable(key: &str, v: &str, max: usize) -> Result<String, ConfigError> {
    if v.is_empty() {
        return Err(ConfigError::invalid(key, v, "must not be empty"));
    }
    if v.chars().count() > max {
        return Err(ConfigError::invalid(key, v, format!("is longer than {max} characters")));
    }
    if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ConfigError::invalid(
            key,
            v,
            "must not contain spaces or control characters",
        ));
    }
    Ok(v.to_string())
}

/// A table name is used inside SQL text, so only identifier characters are allowed.
pub(crate) fn table_name(key: &str, v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !v.as_bytes()[0].is_ascii_digit();
    if !ok {
        return Err(ConfigError::invalid(
            key,
            v,
            "must be 1 to 64 letters, digits or underscores, not starting with a digit",
        ));
    }
    Ok(v.to_string())
}

pub(super) fn topic(key: &str, v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= crate::event::MAX_TOPIC_CHARS
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%' | b'|'));
    if !ok {
        return Err(ConfigError::invalid(
            key,
            v,
            "must be 1 to 127 characters of [A-Za-z0-9_%|-]",
        ));
    }
    Ok(v.to_string())
}

pub(super) fn namesrv(key: &str, v: &str) -> Result<String, ConfigError> {
    if v.is_empty() {
        return Err(ConfigError::invalid(key, v, "must not be empty"));
    }
    for addr in v.split(';') {
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| ConfigError::invalid(key, v, format!("{addr:?} is not host:port")))?;
        if host.is_empty() || port.parse::<u16>().map(|p| p == 0).unwrap_or(true) {
            return Err(ConfigError::invalid(key, v, format!("{addr:?} is not host:port")));
        }
    }
    Ok(v.to_string())
}
