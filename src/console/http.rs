//! The console's view of HTTP: a request as the server gives it (method, path, query, headers,
//! body) and the response it returns, independent of the server (`outboxd` serves it with
//! `tiny_http`; a Rust service can mount it behind its own). Query strings and forms are
//! `application/x-www-form-urlencoded`; every parameter is checked by name, and a bad one is a
//! 400 naming it.

use std::collections::BTreeMap;

/// One request.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `GET`, `POST`, ... as sent.
    pub method: String,
    /// The path and query, as sent (`/events?status=FAIL`).
    pub url: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// The peer's address, for the audit and the log.
    pub remote: String,
}

impl Request {
    pub fn path(&self) -> &str {
        self.url.split('?').next().unwrap_or("/")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    /// Whether the proxy in front reached by the browser serves the console over TLS, as it says
    /// in `X-Forwarded-Proto` or `Forwarded` (the first hop, the browser's). A client that forges
    /// it over plain HTTP only gets cookies its browser will not send back over HTTP.
    pub fn via_https(&self) -> bool {
        let first = |v: &str| v.split(',').next().unwrap_or("").trim().to_ascii_lowercase();
        if let Some(p) = self.header("x-forwarded-proto") {
            return first(p) == "https";
        }
        self.header("forwarded").is_some_and(|f| {
            first(f)
                .split(';')
                .any(|part| part.trim().trim_matches('"') == "proto=https")
        })
    }

    /// The query string's parameters.
    pub fn query(&self) -> Params {
        Params::parse(self.url.split_once('?').map(|(_, q)| q).unwrap_or(""))
    }

    /// The form's parameters (a POST body `application/x-www-form-urlencoded`).
    pub fn form(&self) -> Params {
        Params::parse(&String::from_utf8_lossy(&self.body))
    }

    /// The value of cookie `name`.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.header("cookie")?.split(';').find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == name).then(|| v.to_string())
        })
    }
}

/// One response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// An HTML page, with the headers every page carries (no framing, no sniffing, no caching of
    /// data, a strict content security policy: scripts and styles only from the console itself).
    pub fn html(status: u16, body: String) -> Response {
        Response {
            status,
            headers: secure_headers("text/html; charset=utf-8"),
            body: body.into_bytes(),
        }
    }

    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: secure_headers("text/plain; charset=utf-8"),
            body: body.into().into_bytes(),
        }
    }

    pub fn json(body: String) -> Response {
        Response {
            status: 200,
            headers: secure_headers("application/json"),
            body: body.into_bytes(),
        }
    }

    /// A static asset (the stylesheet, the script): cacheable.
    pub fn asset(content_type: &str, body: &'static str) -> Response {
        let mut headers = secure_headers(content_type);
        headers.retain(|(k, _)| k != "Cache-Control");
        headers.push(("Cache-Control".into(), "max-age=3600".into()));
        Response {
            status: 200,
            headers,
            body: body.as_bytes().to_vec(),
        }
    }

    /// See Other: where a form's POST lands (so a reload does not repeat the action).
    pub fn redirect(to: &str) -> Response {
        let mut r = Response::text(303, format!("see {to}\n"));
        r.headers.push(("Location".into(), to.to_string()));
        r
    }

    pub fn with_cookie(mut self, cookie: String) -> Response {
        self.headers.push(("Set-Cookie".into(), cookie));
        self
    }

    /// Marks every cookie this response sets `Secure`.
    pub fn secure_cookies(&mut self) {
        for (name, value) in &mut self.headers {
            if name.eq_ignore_ascii_case("set-cookie") && !value.contains("; Secure") {
                value.push_str("; Secure");
            }
        }
    }
}

fn secure_headers(content_type: &str) -> Vec<(String, String)> {
    [
        ("Content-Type", content_type),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "same-origin"),
        ("Cache-Control", "no-store"),
        (
            "Content-Security-Policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A bad parameter: answered 400, naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParam {
    pub name: String,
    pub reason: String,
}

impl BadParam {
    pub fn new(name: &str, reason: impl Into<String>) -> BadParam {
        BadParam {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for BadParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "parameter {}: {}", self.name, self.reason)
    }
}

/// Decoded `name=value` pairs, in order (a name may repeat: `id=1&id=2`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn parse(s: &str) -> Params {
        Params(
            s.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    /// Refuses any parameter not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), BadParam> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            Some((k, _)) => Err(BadParam::new(
                k,
                format!("is not a parameter of this page (known: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// The last value of `name`, trimmed, `None` when absent or empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// `name` as a number in `min..=max` (`default` when absent).
    pub fn number(&self, name: &str, default: u64, min: u64, max: u64) -> Result<u64, BadParam> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                Ok(n) => Err(BadParam::new(name, format!("{n} is out of range {min}..={max}"))),
                Err(_) => Err(BadParam::new(name, format!("{:?} is not a whole number", shorten(v)))),
            },
        }
    }

    /// Every value of `name` as an id (a positive whole number).
    pub fn ids(&self, name: &str) -> Result<Vec<u64>, BadParam> {
        self.all(name)
            .into_iter()
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| BadParam::new(name, format!("{:?} is not an id", shorten(v))))
            })
            .collect()
    }

    /// `name` as one of `choices` (`None` when absent).
    pub fn choice<'a>(&self, name: &str, choices: &[&'a str]) -> Result<Option<&'a str>, BadParam> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                choices.iter().find(|c| **c == v).copied().map(Some).ok_or_else(|| {
                    BadParam::new(name, format!("{:?} is not one of {}", shorten(v), choices.join(", ")))
                })
            }
        }
    }

    /// `name` as text of at most `max` characters (`None` when absent).
    pub fn text(&self, name: &str, max: usize) -> Result<Option<&str>, BadParam> {
        match self.get(name) {
            Some(v) if v.chars().count() > max => Err(BadParam::new(
                name,
                format!("is {} characters, more than {max}", v.chars().count()),
            )),
            v => Ok(v),
        }
    }
}

/// A value cut for an error message.
pub(super) fn shorten(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// Percent-decoding of a form or query component (`+` is a space); invalid sequences stay as
/// they are, invalid UTF-8 is replaced.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encoding of a query component.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_and_bad_values_name_the_parameter() {
        let p = Params::parse("status=FAIL&biz_no=ORD%2D1+x&id=3&id=4&page=9999&bad=%zz&tail=%4");
        assert_eq!(p.get("biz_no"), Some("ORD-1 x"));
        assert_eq!(p.ids("id").unwrap(), vec![3, 4]);
        assert_eq!(p.get("bad"), Some("%zz"));
        assert_eq!(p.get("tail"), Some("%4"));
        let e = p.number("page", 50, 1, 500).unwrap_err();
        assert_eq!(e.name, "page");
        assert!(e.reason.contains("9999"), "{e}");
        let e = p.choice("status", &["WAIT", "SENDING"]).unwrap_err();
        assert!(
            e.to_string().contains("status") && e.to_string().contains("FAIL"),
            "{e}"
        );
        let e = Params::parse("id=12x").ids("id").unwrap_err();
        assert!(e.to_string().contains("12x"), "{e}");
        let e = p.only(&["status", "biz_no", "id", "page"]).unwrap_err();
        assert_eq!(e.name, "bad");
        assert_eq!(encode("a b&c<"), "a%20b%26c%3C");
    }

    #[test]
    fn cookies_are_read_by_name() {
        let mut r = Request::default();
        r.headers.insert("cookie".into(), "a=1; outbox_session=abc; b=2".into());
        assert_eq!(r.cookie("outbox_session").as_deref(), Some("abc"));
        assert_eq!(r.cookie("c"), None);
    }
}
