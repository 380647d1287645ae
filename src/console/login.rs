//! The login page: a token and a name. The form carries its own CSRF token, matched against a
//! cookie set with the form (a login cannot be forced from another site).

use super::auth::{random_hex, same, same_origin, Viewer, LOGIN_COOKIE};
use super::html::{esc, frame, notice};
use super::http::{Request, Response};
use super::state::Console;

pub(super) fn form(c: &Console, req: &Request, viewer: &Viewer, error: Option<&str>) -> Response {
    // The token this browser already holds, if any: a second tab, or a request the browser makes
    // on its own while the form is open, does not invalidate the form already shown.
    let token = req
        .cookie(LOGIN_COOKIE)
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(random_hex);
    let mut body = String::new();
    if let Some(e) = error {
        body.push_str(&notice("error", e));
    }
    if c.config.console.read_open {
        body.push_str(&notice(
            "info",
            "Reading is open (console.read.open): log in only to act, with the admin token.",
        ));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"/login\" class=\"login\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>Your name <input name=\"name\" required maxlength=\"64\" autocomplete=\"username\" \
          placeholder=\"written to the audit with each action\"></label>\
         <label>Token <input name=\"token\" type=\"password\" required autocomplete=\"current-password\" \
          placeholder=\"console.read.token or console.admin.token\"></label>\
         <button type=\"submit\">Log in</button></form>",
        esc(&token)
    ));
    Response::html(
        if error.is_some() { 403 } else { 200 },
        frame("Log in", &c.config.table, viewer, "", &body),
    )
    .with_cookie(format!(
        "{LOGIN_COOKIE}={token}; Path=/login; HttpOnly; SameSite=Strict; Max-Age=3600"
    ))
}

pub(super) fn submit(c: &Console, req: &Request) -> Response {
    let viewer = c.sessions.viewer(&c.config.console, req);
    let form = req.form();
    let csrf_ok = match (form.get("csrf"), req.cookie(LOGIN_COOKIE)) {
        (Some(f), Some(k)) => same(f, &k),
        _ => false,
    };
    if !csrf_ok {
        return form_error(
            c,
            &viewer,
            req,
            "the login form expired or came from elsewhere: try again",
        );
    }
    if let Err(why) = same_origin(req) {
        return form_error(c, &viewer, req, &why);
    }
    let (token, name) = (form.get("token").unwrap_or(""), form.get("name").unwrap_or(""));
    match c.sessions.login(&c.config.console, token, name) {
        Ok((session, cookie)) => {
            log::info!(
                "console: {name} logged in from {} ({})",
                req.remote,
                session_role(c, &session.id)
            );
            Response::redirect("/").with_cookie(cookie)
        }
        Err(why) => form_error(c, &viewer, req, &why),
    }
}

fn session_role(c: &Console, id: &str) -> &'static str {
    let mut r = Request::default();
    r.headers
        .insert("cookie".into(), format!("{}={id}", super::auth::SESSION_COOKIE));
    c.sessions.viewer(&c.config.console, &r).role.as_str()
}

fn form_error(c: &Console, viewer: &Viewer, req: &Request, why: &str) -> Response {
    log::warn!("console: a login from {} was refused: {why}", req.remote);
    form(c, req, viewer, Some(why))
}
