//! The operator console (cargo feature `console`; docs/console.md): see and act on an outbox
//! table, and on the consumers' dead letters, in a browser. Server-rendered HTML, no build step
//! and no third-party script: one stylesheet and one small script of its own refresh the
//! overview while its tab is visible.
//!
//! [`Console::handle`] answers one [`Request`] with one [`Response`]; `outboxd` serves it on
//! `console.listen` (`console.enabled = true`), and a Rust service can route requests to it from
//! its own HTTP server. One file per concern:
//!
//! - `mod.rs` (this file): routing a request to its page;
//! - `state.rs`: the console itself (configuration, pools, live figures, sessions);
//! - `http.rs`: requests, responses, parameters (a bad one is a 400 naming it);
//! - `auth.rs`: tokens, sessions, CSRF, the same-origin check;
//! - `html.rs`: escaping, the page frame, tables, charts;
//! - `data.rs`: the reads, each an index range scan or bounded;
//! - `live.rs`: the relay's rates and latency for the overview;
//! - `overview.rs`, `events.rs`, `dead_letters.rs`, `ordered.rs`, `consumers.rs`,
//!   `reemit.rs` (re-emit by filter and its jobs), `controls.rs` (pause, resume, the audit),
//!   `login.rs`: the pages and their actions.

mod auth;
mod consumers;
mod controls;
mod data;
mod dead_letter_groups;
mod dead_letters;
mod events;
mod html;
mod http;
mod live;
mod login;
mod ordered;
mod overview;
mod reemit;
mod state;

pub use http::{Request, Response};
pub use state::Console;

use state::Failure;

impl Console {
    /// Answers one request. Behind a proxy that serves the console over TLS (it says so with
    /// `X-Forwarded-Proto: https` or `Forwarded: proto=https`), every cookie set is `Secure`.
    pub fn handle(&self, req: &Request) -> Response {
        let mut r = self.route(req);
        if req.via_https() {
            r.secure_cookies();
        }
        r
    }

    fn route(&self, req: &Request) -> Response {
        let viewer = self.sessions.viewer(&self.config.console, req);
        let path = req.path();
        let method = req.method.as_str();
        match (method, path) {
            (_, "/static/console.css") => return Response::asset("text/css", include_str!("assets/console.css")),
            (_, "/static/console.js") => return Response::asset("text/javascript", include_str!("assets/console.js")),
            // Browsers ask for the icon on their own: never a reason to go to the login.
            (_, "/favicon.ico" | "/static/icon.svg") => {
                return Response::asset("image/svg+xml", include_str!("assets/icon.svg"))
            }
            ("GET", "/login") => return login::form(self, req, &viewer, None),
            ("POST", "/login") => return login::submit(self, req),
            ("POST", "/logout") => {
                if let Err(why) = auth::check_action_any(&viewer, req, req.form().get("csrf")) {
                    return self.refused(&viewer, req, "log out", &why);
                }
                return self.sessions.logout(&viewer);
            }
            _ => {}
        }
        if !viewer.can_read() {
            // A browser's page goes to the login; a script, or anything but a GET, is refused.
            return if req.header("authorization").is_some() || path.starts_with("/api/") || method != "GET" {
                Response::text(401, "log in: a read or admin token is needed (console.read.token)\n")
            } else {
                Response::redirect("/login")
            };
        }
        let result = match (method, path) {
            ("GET", "/") => overview::page(self, &viewer),
            ("GET", "/partials/overview") => overview::live(self, &viewer),
            ("GET", "/api/overview.json") => overview::json(self),
            ("GET", "/events") => events::list(self, &viewer, req),
            ("GET", p) if p.starts_with("/events/") => events::detail(self, &viewer, &p["/events/".len()..]),
            ("POST", p) if p.starts_with("/events/") && p.ends_with("/cancel") => {
                events::cancel(self, &viewer, req, &p["/events/".len()..p.len() - "/cancel".len()])
            }
            ("GET", "/dead-letters") => dead_letters::list(self, &viewer, req),
            ("GET", "/dead-letters/groups") => dead_letter_groups::page(self, &viewer, req),
            ("POST", "/dead-letters/preview") => dead_letters::preview(self, &viewer, req),
            ("POST", "/dead-letters/apply") => dead_letters::apply(self, &viewer, req),
            ("GET", "/ordered") => ordered::page(self, &viewer),
            ("GET", "/consumers") => consumers::list(self, &viewer),
            ("GET", p) if p.starts_with("/consumers/") => {
                consumers::group(self, &viewer, req, &p["/consumers/".len()..])
            }
            ("POST", p) if p.starts_with("/consumers/") => {
                consumers::act(self, &viewer, req, &p["/consumers/".len()..])
            }
            ("GET", "/re-emit") => reemit::page(self, &viewer, req),
            ("POST", "/re-emit/start") => reemit::start(self, &viewer, req),
            ("POST", p) if p.starts_with("/re-emit/") => reemit::act(self, &viewer, req, &p["/re-emit/".len()..]),
            ("GET", "/controls") => controls::page(self, &viewer, None),
            ("POST", "/controls/pause") => controls::set(self, &viewer, req, true),
            ("POST", "/controls/resume") => controls::set(self, &viewer, req, false),
            ("GET", "/audit") => controls::audit(self, &viewer, req),
            ("GET", _) => {
                return Response::html(
                    404,
                    html::frame(
                        "Not found",
                        &self.config.table,
                        &viewer,
                        "",
                        &html::notice("error", &format!("no page at {path}")),
                    ),
                )
            }
            _ => {
                return Response::text(
                    405,
                    format!("{method} {path}: pages are GET, actions are POST from the console's own forms\n"),
                )
            }
        };
        match result {
            Ok(r) => r,
            Err(Failure::Bad(b)) => Response::html(
                400,
                html::frame(
                    "Bad request",
                    &self.config.table,
                    &viewer,
                    "",
                    &html::notice("error", &b.to_string()),
                ),
            ),
            Err(Failure::Db(e)) => {
                log::warn!("console: {method} {path} failed: {e}");
                Response::html(
                    500,
                    html::frame(
                        "The database refused",
                        &self.config.table,
                        &viewer,
                        "",
                        &html::notice("error", &e.to_string()),
                    ),
                )
            }
        }
    }
}
