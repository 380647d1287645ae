//! Controls: pause and resume claiming on the table for every relay of it (through the
//! database: `outbox_control`, read by each relay at most once a second), and the audit of
//! every action taken by hand.

use super::auth::{check_action, Role, Viewer};
use super::data;
use super::html::{csrf_field, esc, frame, notice, table};
use super::http::{Request, Response};
use super::state::{Console, Page};

pub(super) fn page(c: &Console, viewer: &Viewer, done: Option<&str>) -> Page {
    let state = crate::control::state(&mut c.conn()?, &c.config.table)?;
    let mut body = String::new();
    if let Some(d) = done {
        body.push_str(&notice("info", d));
    }
    match &state {
        Some(p) => body.push_str(&notice(
            "warn",
            &format!("Claiming on table {} is {p}.", c.config.table),
        )),
        None => body.push_str(&notice(
            "info",
            &format!("Every relay of table {} claims as usual.", c.config.table),
        )),
    }
    body.push_str(
        "<p class=\"hint\">A pause stops every relay of this table from claiming within a second; what \
         they hold in flight finishes, so nothing is lost or sent twice. The resume lets them claim again. \
         Both are audited.</p>",
    );
    if viewer.role == Role::Admin {
        body.push_str(&if state.is_some() {
            format!(
                "<form method=\"post\" action=\"/controls/resume\">{}<button type=\"submit\">Resume claiming</button></form>",
                csrf_field(viewer)
            )
        } else {
            format!(
                "<form method=\"post\" action=\"/controls/pause\">{}<label>Why <input name=\"reason\" maxlength=\"512\" \
                 placeholder=\"shown to other operators and in the relays' logs\"></label>\
                 <button type=\"submit\" class=\"danger\">Pause claiming</button></form>",
                csrf_field(viewer)
            )
        });
    } else {
        body.push_str(&notice("info", "Log in with the admin token to pause or resume."));
    }
    Ok(Response::html(
        200,
        frame("Controls", &c.config.table, viewer, "/controls", &body),
    ))
}

pub(super) fn set(c: &Console, viewer: &Viewer, req: &Request, paused: bool) -> Page {
    let form = req.form();
    let what = if paused { "pause" } else { "resume" };
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, what, &why));
    }
    form.only(&["csrf", "reason"])?;
    let reason = form.text("reason", 512)?;
    let actor = viewer.actor(&req.remote);
    let changed = crate::control::set_paused(&c.pool, &c.config.table, paused, &actor, reason)?;
    let done = match (changed, paused) {
        (true, true) => "Paused: every relay of the table stops claiming within a second.",
        (true, false) => "Resumed: the relays claim again within a second.",
        (false, true) => "It was already paused: nothing changed.",
        (false, false) => "It was not paused: nothing changed.",
    };
    page(c, viewer, Some(done))
}

pub(super) fn audit(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let p = req.query();
    p.only(&["before"])?;
    let before = p.number("before", 0, 0, u64::MAX)?;
    let rows = data::audit(&mut c.conn()?, 100, (before > 0).then_some(before))?;
    let next = rows.last().filter(|_| rows.len() == 100).map(|r| r.id);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                esc(&r.at),
                esc(&r.actor),
                esc(&r.action),
                esc(&r.table),
                if r.event_id == 0 {
                    "—".into()
                } else {
                    r.event_id.to_string()
                },
                esc(r.detail.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    let mut body = table("audit", &["when", "who", "what", "table", "row", "detail"], &cells);
    if let Some(n) = next {
        body.push_str(&format!(
            "<p><a class=\"next\" href=\"/audit?before={n}\">Older →</a></p>"
        ));
    }
    Ok(Response::html(
        200,
        frame("Audit", &c.config.table, viewer, "/audit", &body),
    ))
}
