//! Who is asking, and what they may do. An operator logs in with a token (`console.read.token`
//! or `console.admin.token`) and a name (written to the audit with each action); the console
//! keeps the session on its side and gives the browser only a random id, in an `HttpOnly`,
//! `SameSite=Strict` cookie. Every action is a POST carrying the session's CSRF token, from a
//! page of the console itself (`Origin`, when sent, must be the console's). Reading without any
//! token happens only with `console.read.open`; acting always needs the admin token.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::http::{Request, Response};
use crate::config::ConsoleConfig;

/// What a viewer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Nobody logged in, and reading is not open: only the login page.
    Nobody,
    /// Pages, no actions.
    Reader,
    /// Pages and actions.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Nobody => "not logged in",
            Role::Reader => "read-only",
            Role::Admin => "admin",
        }
    }
}

/// A logged-in operator's session.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub csrf: String,
    role: Role,
    name: String,
    last_seen: Instant,
}

/// The viewer of one request.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    /// Who, as they said at login (or `anonymous` / `bearer`).
    pub name: String,
    session: Option<Session>,
}

impl Viewer {
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    pub fn can_read(&self) -> bool {
        self.role != Role::Nobody
    }

    /// The actor written to `outbox_audit`: the name given at login, the role and the address.
    pub fn actor(&self, remote: &str) -> String {
        let a = format!("{} (console {}, {remote})", self.name, self.role.as_str());
        a.chars().take(128).collect()
    }
}

/// Idle sessions end after this.
const SESSION_IDLE: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept; the longest idle goes first.
const MAX_SESSIONS: usize = 1000;
/// Failed logins in a row after which logins wait this long.
const FAILED_LOGINS: u32 = 5;
const LOGIN_COOLDOWN: Duration = Duration::from_secs(2);

pub const SESSION_COOKIE: &str = "outbox_session";
/// The login form's own CSRF token (double submit: cookie and field must match).
pub const LOGIN_COOKIE: &str = "outbox_login";

#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    failures: Mutex<(u32, Option<Instant>)>,
}

impl Sessions {
    /// The viewer of `req`: its session, or a bearer token (for scripts reading pages), or an
    /// anonymous reader when reading is open, or nobody.
    pub fn viewer(&self, config: &ConsoleConfig, req: &Request) -> Viewer {
        if let Some(id) = req.cookie(SESSION_COOKIE) {
            let mut map = self.map.lock();
            if let Some(s) = map.get_mut(&id) {
                if s.last_seen.elapsed() < SESSION_IDLE {
                    s.last_seen = Instant::now();
                    return Viewer {
                        role: s.role,
                        name: s.name.clone(),
                        session: Some(s.clone()),
                    };
                }
                map.remove(&id);
            }
        }
        if let Some(token) = req.header("authorization").and_then(|h| h.strip_prefix("Bearer ")) {
            // Reading only: a bearer request carries no CSRF token, so it never acts.
            if role_of(config, token.trim()) != Role::Nobody {
                return Viewer {
                    role: Role::Reader,
                    name: "bearer".into(),
                    session: None,
                };
            }
        }
        Viewer {
            role: if config.read_open { Role::Reader } else { Role::Nobody },
            name: "anonymous".into(),
            session: None,
        }
    }

    /// A login: the token decides the role; a new session and its cookie. `Err` says why not
    /// (without ever repeating the token).
    pub fn login(&self, config: &ConsoleConfig, token: &str, name: &str) -> Result<(Session, String), String> {
        {
            let f = self.failures.lock();
            if f.0 >= FAILED_LOGINS && f.1.is_some_and(|t| t.elapsed() < LOGIN_COOLDOWN) {
                return Err("too many failed logins: wait a moment".into());
            }
        }
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
            return Err("say who you are (1 to 64 characters): it goes into the audit with each action".into());
        }
        let role = role_of(config, token);
        if role == Role::Nobody {
            let mut f = self.failures.lock();
            f.0 += 1;
            f.1 = Some(Instant::now());
            return Err("wrong token".into());
        }
        *self.failures.lock() = (0, None);
        let session = Session {
            id: random_hex(),
            csrf: random_hex(),
            role,
            name: name.to_string(),
            last_seen: Instant::now(),
        };
        let mut map = self.map.lock();
        map.retain(|_, s| s.last_seen.elapsed() < SESSION_IDLE);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, s)| s.last_seen).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        map.insert(session.id.clone(), session.clone());
        let cookie = format!(
            "{SESSION_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
            session.id,
            SESSION_IDLE.as_secs()
        );
        Ok((session, cookie))
    }

    pub fn logout(&self, viewer: &Viewer) -> Response {
        if let Some(s) = viewer.session() {
            self.map.lock().remove(&s.id);
        }
        Response::redirect("/login").with_cookie(format!(
            "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        ))
    }
}

/// The role a token gives (compared in constant time).
fn role_of(config: &ConsoleConfig, token: &str) -> Role {
    if config.admin_token.as_deref().is_some_and(|t| same(t, token)) {
        Role::Admin
    } else if config.read_token.as_deref().is_some_and(|t| same(t, token)) {
        Role::Reader
    } else {
        Role::Nobody
    }
}

/// Equality of two secrets in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// 32 random bytes as hex.
pub fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why an action is refused, if it is: not an admin, no session, a missing or wrong CSRF token,
/// or a request from another origin.
pub fn check_action(viewer: &Viewer, req: &Request, csrf: Option<&str>) -> Result<(), String> {
    if viewer.role != Role::Admin {
        return Err(format!(
            "this action needs the admin token (you are {}): log in with console.admin.token",
            viewer.role.as_str()
        ));
    }
    let Some(session) = viewer.session() else {
        return Err("actions need a session: log in".into());
    };
    if !csrf.is_some_and(|c| same(c, &session.csrf)) {
        return Err("missing or wrong CSRF token: reload the page and try again".into());
    }
    same_origin(req)
}

/// A session's own action (logging out): its CSRF token and the origin, whatever its role.
pub fn check_action_any(viewer: &Viewer, req: &Request, csrf: Option<&str>) -> Result<(), String> {
    let Some(session) = viewer.session() else {
        return Err("not logged in".into());
    };
    if !csrf.is_some_and(|c| same(c, &session.csrf)) {
        return Err("missing or wrong CSRF token: reload the page and try again".into());
    }
    same_origin(req)
}

/// A request's `Origin` (when the browser sends one) must be this console's host.
pub fn same_origin(req: &Request) -> Result<(), String> {
    let (Some(origin), Some(host)) = (req.header("origin"), req.header("host")) else {
        return Ok(());
    };
    let origin_host = origin.split("://").nth(1).unwrap_or(origin);
    if origin_host == host {
        Ok(())
    } else {
        Err(format!("a request from another origin ({origin}) is refused"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConsoleConfig {
        ConsoleConfig {
            admin_token: Some("admin-token-0123456789".into()),
            read_token: Some("read-token-0123456789".into()),
            ..ConsoleConfig::default()
        }
    }

    fn with_cookie(id: &str) -> Request {
        let mut r = Request::default();
        r.headers.insert("cookie".into(), format!("{SESSION_COOKIE}={id}"));
        r
    }

    #[test]
    fn tokens_give_roles_and_actions_need_the_admin_s_session_and_csrf() {
        let s = Sessions::default();
        let c = config();
        assert_eq!(s.viewer(&c, &Request::default()).role, Role::Nobody);
        assert_eq!(s.login(&c, "nope-nope-nope-nope", "eve").unwrap_err(), "wrong token");
        assert!(
            s.login(&c, "admin-token-0123456789", " ").is_err(),
            "a name is required"
        );
        let (reader, _) = s.login(&c, "read-token-0123456789", "rita").unwrap();
        let v = s.viewer(&c, &with_cookie(&reader.id));
        assert_eq!((v.role, v.name.as_str()), (Role::Reader, "rita"));
        assert!(check_action(&v, &Request::default(), Some(&reader.csrf)).is_err());
        let (admin, cookie) = s.login(&c, "admin-token-0123456789", "alice").unwrap();
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        let req = with_cookie(&admin.id);
        let v = s.viewer(&c, &req);
        assert_eq!(v.role, Role::Admin);
        assert!(check_action(&v, &req, Some(&admin.csrf)).is_ok());
        assert!(check_action(&v, &req, None).unwrap_err().contains("CSRF"));
        assert!(check_action(&v, &req, Some("forged")).unwrap_err().contains("CSRF"));
        let mut cross = req.clone();
        cross.headers.insert("origin".into(), "http://evil.example".into());
        cross.headers.insert("host".into(), "127.0.0.1:9470".into());
        assert!(check_action(&v, &cross, Some(&admin.csrf))
            .unwrap_err()
            .contains("origin"));
        // A bearer token reads, never acts.
        let mut bearer = Request::default();
        bearer
            .headers
            .insert("authorization".into(), "Bearer admin-token-0123456789".into());
        let v = s.viewer(&c, &bearer);
        assert_eq!(v.role, Role::Reader);
        assert!(check_action(&v, &bearer, Some("x")).is_err());
        // Open reading.
        let open = ConsoleConfig {
            read_open: true,
            ..config()
        };
        assert_eq!(s.viewer(&open, &Request::default()).role, Role::Reader);
    }

    #[test]
    fn failed_logins_in_a_row_cool_down() {
        let s = Sessions::default();
        let c = config();
        for _ in 0..FAILED_LOGINS {
            assert_eq!(s.login(&c, "wrong-wrong-wrong-wrong", "x").unwrap_err(), "wrong token");
        }
        assert!(s
            .login(&c, "admin-token-0123456789", "alice")
            .unwrap_err()
            .contains("too many"));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd") && !same("abc", "ab") && !same("", "a"));
    }
}
