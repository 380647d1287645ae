//! Events: a filtered list (status, topic, event type, business key, creation time, error text),
//! page by page, one event's detail, and cancelling an event that has not left yet.

use crate::admin::TimeBound;
use crate::config::TagSource;
use crate::wire;

use super::auth::{check_action, Role, Viewer};
use super::data::{
    self, Cursor, EventFilter, EventPage, EventRow, Searched, PAYLOAD_PREVIEW, SEARCH_WINDOW, STATUS_WINDOW,
};
use super::html::{csrf_field, esc, frame, notice, table, thousands};
use super::http::{encode, BadParam, Params, Request, Response};
use super::state::{Console, Page};

pub(super) const STATUSES: &[&str] = &["WAIT", "SENDING", "SUCCESS", "FAIL", "DISCARDED"];
const FILTERS: &[&str] = &[
    "status",
    "topic",
    "event_type",
    "biz_no",
    "since",
    "until",
    "error",
    "page",
    "after",
];
/// Most rows per page.
pub(super) const MAX_PAGE: u64 = 200;

/// The filter of a query string (`only` are the parameters the page knows); a bad value is a 400
/// naming its parameter.
pub(super) fn filter(p: &Params, only: &[&str], status: Option<&'static str>) -> Result<EventFilter, BadParam> {
    p.only(only)?;
    let time = |name: &str| -> Result<Option<TimeBound>, BadParam> {
        p.text(name, 40)?
            .map(|v| TimeBound::parse(v).map_err(|e| BadParam::new(name, e)))
            .transpose()
    };
    let key = |name: &str, max: usize| -> Result<Option<String>, BadParam> { Ok(p.text(name, max)?.map(String::from)) };
    Ok(EventFilter {
        status: match status {
            Some(s) => Some(s),
            None => p.choice("status", STATUSES)?,
        },
        topic: key("topic", 127)?,
        event_type: key("event_type", 64)?,
        biz_no: key("biz_no", 64)?,
        since: time("since")?,
        until: time("until")?,
        error: key("error", 200)?,
        by_update: false,
        page: p.number("page", 50, 1, MAX_PAGE)? as usize,
        after: p
            .get("after")
            .map(|a| Cursor::decode(a).ok_or_else(|| BadParam::new("after", "is not a cursor of this list")))
            .transpose()?,
    })
}

/// The filter's fields as a form (`fixed_status` hides the status choice).
pub(super) fn filter_form(action: &str, p: &Params, fixed_status: bool) -> String {
    let v = |name: &str| esc(p.get(name).unwrap_or(""));
    let mut status = String::from("<option value=\"\">any</option>");
    for s in STATUSES {
        let sel = if p.get("status") == Some(*s) { " selected" } else { "" };
        status.push_str(&format!("<option{sel}>{s}</option>"));
    }
    let status_field = if fixed_status {
        String::new()
    } else {
        format!("<label>status <select name=\"status\">{status}</select></label>")
    };
    format!(
        "<form method=\"get\" action=\"{action}\" class=\"filters\">{status_field}\
         <label>biz_no <input name=\"biz_no\" value=\"{}\" maxlength=\"64\"></label>\
         <label>event type <input name=\"event_type\" value=\"{}\" maxlength=\"64\"></label>\
         <label>topic <input name=\"topic\" value=\"{}\" maxlength=\"127\"></label>\
         <label>since <input name=\"since\" value=\"{}\" placeholder=\"1h, 2026-12-05 08:00\"></label>\
         <label>until <input name=\"until\" value=\"{}\"></label>\
         <label>error contains <input name=\"error\" value=\"{}\" maxlength=\"200\"></label>\
         <label>per page <input name=\"page\" value=\"{}\" size=\"4\"></label>\
         <button type=\"submit\">Filter</button></form>",
        v("biz_no"),
        v("event_type"),
        v("topic"),
        v("since"),
        v("until"),
        v("error"),
        esc(p.get("page").unwrap_or("50")),
    )
}

/// The link to the next page: the same filter, `after` the cursor.
pub(super) fn next_link(path: &str, p: &Params, page: &EventPage) -> String {
    let mut out = String::new();
    match &page.searched {
        Some(Searched::Ids { lo, hi }) => out.push_str(&format!(
            "<p class=\"hint\">Searched ids {}–{} (at most {} per page, newest first).</p>",
            thousands(*lo),
            thousands(*hi),
            thousands(SEARCH_WINDOW)
        )),
        Some(Searched::Status { status, rows, due }) => out.push_str(&format!(
            "<p class=\"hint\">Searched {} {status} rows, due back to {} (at most {} per page when filtering \
             on more than the status).</p>",
            thousands(*rows as u64),
            esc(due),
            thousands(STATUS_WINDOW)
        )),
        None => {}
    }
    if let Some(next) = &page.next {
        let mut q: Vec<String> =
            p.0.iter()
                .filter(|(k, v)| k != "after" && !v.trim().is_empty())
                .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
                .collect();
        q.push(format!("after={}", encode(&next.encode())));
        out.push_str(&format!(
            "<p><a class=\"next\" href=\"{path}?{}\">Older →</a></p>",
            esc(&q.join("&"))
        ));
    }
    out
}

pub(super) fn row_cells(r: &EventRow) -> Vec<String> {
    vec![
        format!("<a href=\"/events/{}\">{}</a>", r.id, r.id),
        esc(&r.status),
        esc(&r.biz_no),
        esc(&r.event_type),
        esc(r.topic.as_deref().unwrap_or("(default)")),
        r.retry_count.to_string(),
        esc(&r.created),
        esc(&r.due),
        esc(r.last_error.as_deref().unwrap_or("")),
    ]
}

pub(super) const ROW_HEADERS: &[&str] = &[
    "id",
    "status",
    "biz_no",
    "type",
    "topic",
    "tries",
    "created",
    "due",
    "last error",
];

pub(super) fn list(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let p = req.query();
    let f = filter(&p, FILTERS, None)?;
    let page_rows = data::events(&mut c.conn()?, &c.config.table, &f)?;
    let rows: Vec<Vec<String>> = page_rows.rows.iter().map(row_cells).collect();
    let body = format!(
        "{}{}{}",
        filter_form("/events", &p, false),
        table("events", ROW_HEADERS, &rows),
        next_link("/events", &p, &page_rows)
    );
    Ok(Response::html(
        200,
        frame("Events", &c.config.table, viewer, "/events", &body),
    ))
}

pub(super) fn detail(c: &Console, viewer: &Viewer, id: &str) -> Page {
    let id: u64 = id
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| BadParam::new("id", format!("{:?} is not an event id", super::http::shorten(id))))?;
    let Some(e) = data::event(&mut c.conn()?, &c.config.table, id)? else {
        return Ok(Response::html(
            404,
            frame(
                "No such event",
                &c.config.table,
                viewer,
                "/events",
                &notice("error", &format!("no event {id}")),
            ),
        ));
    };
    let text = String::from_utf8(e.payload.clone());
    let preview = match &text {
        Ok(t) => format!("<pre class=\"payload\">{}</pre>", esc(t)),
        Err(_) => format!(
            "<pre class=\"payload\">{}</pre><p class=\"hint\">not UTF-8: shown as hex</p>",
            e.payload.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    };
    let cut = if e.payload_len as usize > PAYLOAD_PREVIEW {
        format!(" (the first {} shown)", thousands(PAYLOAD_PREVIEW as u64))
    } else {
        String::new()
    };
    let o = |v: &Option<String>| esc(v.as_deref().unwrap_or("—"));
    // The tag the message is sent with (wire::tag), not only the row's column.
    let by_event_type = c.config.rocketmq.tag_source == TagSource::EventType;
    let tag = match (
        e.tag.as_deref().filter(|t| !t.is_empty()),
        wire::tag(e.tag.as_deref(), &e.row.event_type, by_event_type),
    ) {
        (Some(own), _) => esc(own),
        (None, Some(sent)) => format!(
            "{} <span class=\"hint\">(its event type: the row sets no tag; rocketmq.tag.source = event-type)</span>",
            esc(sent)
        ),
        (None, None) => "— <span class=\"hint\">(the row sets no tag; rocketmq.tag.source = none)</span>".to_string(),
    };
    let facts = [
        ("status", esc(&e.row.status)),
        (
            "biz_no",
            format!(
                "<a href=\"/events?biz_no={}\">{}</a> <span class=\"hint\">(every event of this key, newest first)</span>",
                esc(&encode(&e.row.biz_no)),
                esc(&e.row.biz_no)
            ),
        ),
        ("event type", esc(&e.row.event_type)),
        ("topic", esc(e.row.topic.as_deref().unwrap_or("(default topic)"))),
        ("tag", tag),
        ("event key", o(&e.event_key)),
        ("attempts", e.row.retry_count.to_string()),
        ("created", esc(&e.row.created)),
        ("next retry / due", esc(&e.row.due)),
        ("claim owner", o(&e.claim_owner)),
        (
            "claim token",
            e.claim_token.map(|t| t.to_string()).unwrap_or_else(|| "—".into()),
        ),
        ("claimed at", o(&e.claimed_at)),
        ("sent at", o(&e.sent_at)),
        ("updated", o(&e.updated)),
        ("broker message id", o(&e.broker_msg_id)),
        ("last error", o(&e.last_error)),
        ("headers", o(&e.headers)),
    ];
    let facts: String = facts.iter().map(|(k, v)| format!("<dt>{k}</dt><dd>{v}</dd>")).collect();
    let action = match (e.row.status.as_str(), viewer.role) {
        ("WAIT", Role::Admin) => format!(
            "<form method=\"post\" action=\"/events/{id}/cancel\">{}<button type=\"submit\" class=\"danger\">Cancel this event</button> \
             <span class=\"hint\">deletes it before it is sent (audited); if a relay is sending it right now, the cancel waits and \
             says it was sent</span></form>",
            csrf_field(viewer)
        ),
        ("WAIT", _) => "<p class=\"hint\">Log in with the admin token to cancel this event.</p>".to_string(),
        // A dead letter: the dead-letter page's replay and discard, for this one row (its count
        // shown and confirmed first, as there).
        ("FAIL", Role::Admin) => format!(
            "<form method=\"post\" action=\"/dead-letters/preview\">{}<input type=\"hidden\" name=\"id\" value=\"{id}\">\
             <button name=\"action\" value=\"replay\">Replay this event</button> \
             <button name=\"action\" value=\"discard\" class=\"danger\">Discard this event</button> \
             <span class=\"hint\">shown for confirmation first; audited</span></form>",
            csrf_field(viewer)
        ),
        ("FAIL", _) => "<p class=\"hint\">Log in with the admin token to replay or discard this event.</p>".to_string(),
        _ => String::new(),
    };
    let body = format!(
        "<dl class=\"facts\">{facts}</dl>{action}<h2>Payload: {} bytes{cut}</h2>{preview}",
        thousands(e.payload_len)
    );
    Ok(Response::html(
        200,
        frame(&format!("Event {id}"), &c.config.table, viewer, "/events", &body),
    ))
}

/// `POST /events/{id}/cancel`: cancels the event if it has not left yet (`crate::cancel`),
/// audited with the operator's name, and says what became of it.
pub(super) fn cancel(c: &Console, viewer: &Viewer, req: &Request, id: &str) -> Page {
    let form = req.form();
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "cancel", &why));
    }
    form.only(&["csrf"])?;
    let id: u64 = id
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| BadParam::new("id", format!("{:?} is not an event id", super::http::shorten(id))))?;
    let actor = viewer.actor(&req.remote);
    let report = crate::cancel::cancel_ids(&c.pool, &c.config.table, &[id], &actor)?;
    let (kind, text) = match report.outcomes.get(&id) {
        Some(crate::cancel::CancelOutcome::Cancelled { .. }) => {
            ("info", format!("Event {id} cancelled before it was sent (audited)."))
        }
        Some(other) => ("warn", format!("Event {id} was not cancelled: {}.", other.name())),
        None => ("warn", format!("Event {id} was not cancelled.")),
    };
    let body = format!(
        "{}<p><a href=\"/events\">Events</a> · <a href=\"/audit\">Audit</a></p>",
        notice(kind, &text)
    );
    Ok(Response::html(
        200,
        frame(&format!("Event {id}"), &c.config.table, viewer, "/events", &body),
    ))
}
