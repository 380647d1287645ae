//! Consumers: the groups the inbox and dead-letter tables know (in `console.consumer.db.url`, or
//! the outbox's database), their marks, and each group's dead letters with replay and discard,
//! as `outboxd dead-letters ... --consumer-group G` does them (batched, audited).

use crate::admin::{self, BatchOptions, DeadLetterAction};
use crate::consumer::dead_letter::{self, InboxDeadLetter, Selection};
use crate::wire::QueueRef;

use super::auth::{check_action, Role, Viewer};
use super::data::{self, COUNT_BOUND};
use super::html::{count, csrf_field, esc, frame, notice, table, thousands};
use super::http::{encode, BadParam, Request, Response};
use super::state::{Console, Page};

pub(super) fn list(c: &Console, viewer: &Viewer) -> Page {
    let cc = &c.config.consumer;
    let groups = data::consumer_groups(&mut c.consumer_pool.get_conn()?, &cc.inbox_table, &cc.dead_letter_table)?;
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                format!("<a href=\"/consumers/{}\">{}</a>", encode(&g.group), esc(&g.group)),
                count(g.marks, Some(COUNT_BOUND)),
                thousands(g.dead),
                thousands(g.replay),
            ]
        })
        .collect();
    let body = format!(
        "<p class=\"hint\">Inbox {} and dead letters {} in {}. Marks are counted up to {}.</p>{}",
        esc(&cc.inbox_table),
        esc(&cc.dead_letter_table),
        esc(&crate::config::redact_url(
            c.config.console.consumer_db_url.as_deref().unwrap_or(&c.config.db_url)
        )),
        thousands(COUNT_BOUND),
        table(
            "groups",
            &["group", "keys processed (marks)", "DEAD", "REPLAY asked"],
            &rows
        )
    );
    Ok(Response::html(
        200,
        frame("Consumers", &c.config.table, viewer, "/consumers", &body),
    ))
}

/// `/consumers/G`: a group's dead letters.
pub(super) fn group(c: &Console, viewer: &Viewer, req: &Request, rest: &str) -> Page {
    let group = group_name(rest)?;
    let p = req.query();
    p.only(&["status", "limit", "before"])?;
    let status = p.choice("status", &["DEAD", "REPLAY"])?;
    let limit = p.number("limit", PAGE as u64, 1, 1000)? as usize;
    let before = match p.get("before") {
        None => None,
        Some(_) => Some(p.number("before", 0, 1, u64::MAX)?),
    };
    let table_name = &c.config.consumer.dead_letter_table;
    let letters = dead_letter::page(&c.consumer_pool, table_name, &group, status, before, limit)?;
    let total = data::group_dead_letters(&mut c.consumer_pool.get_conn()?, table_name, &group, status)?;
    let admin = viewer.role == Role::Admin;
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|d| {
            let mut cells = vec![
                d.id.to_string(),
                esc(&d.status),
                esc(&d.key),
                esc(&format!(
                    "{}:{}",
                    QueueRef::name(
                        &d.topic,
                        d.broker.as_deref().unwrap_or("?"),
                        d.queue_id.map(|q| q.to_string()).unwrap_or_default()
                    ),
                    d.queue_offset.map(|o| o.to_string()).unwrap_or_default()
                )),
                d.attempts.to_string(),
                esc(&d.created_at),
                esc(&d.last_error),
            ];
            if admin {
                cells.insert(0, format!("<input type=\"checkbox\" name=\"id\" value=\"{}\">", d.id));
            }
            cells
        })
        .collect();
    let mut headers = vec![
        "id",
        "status",
        "event key",
        "from",
        "attempts",
        "parked at",
        "last error",
    ];
    if admin {
        headers.insert(0, "");
    }
    let path = format!("/consumers/{}", encode(&group));
    let listing = format!(
        "{}{}{}",
        page_summary(total, &letters, before.is_some()),
        table("consumer-dead", &headers, &rows),
        page_links(&path, status, limit, before, &letters)
    );
    let body = if admin {
        format!(
            "<form method=\"post\" action=\"{path}/preview\">{}{listing}<div class=\"actions\">\
             <button name=\"action\" value=\"replay\">Replay selected</button>\
             <button name=\"action\" value=\"discard\">Discard selected</button>\
             <label><input type=\"checkbox\" name=\"scope\" value=\"all\"> every dead letter of the group</label>\
             </div></form><p class=\"hint\">A replay marks rows REPLAY; the group's running consumers handle them \
             again. A discard deletes them.</p>",
            csrf_field(viewer)
        )
    } else {
        format!(
            "{listing}{}",
            notice("info", "Log in with the admin token to replay or discard.")
        )
    };
    Ok(Response::html(
        200,
        frame(
            &format!("Consumer group {group}"),
            &c.config.table,
            viewer,
            "/consumers",
            &body,
        ),
    ))
}

/// A group's dead letters on a page, unless `?limit=` says otherwise.
const PAGE: usize = 100;

/// "N dead letters (of this status); ids A to B shown, newest first".
fn page_summary(total: u64, letters: &[InboxDeadLetter], older: bool) -> String {
    let total = count(total, Some(COUNT_BOUND));
    match (letters.first(), letters.last()) {
        (Some(first), Some(last)) => format!(
            "<p class=\"hint\">{total} dead letters; ids {} to {} shown, newest first{}.</p>",
            first.id,
            last.id,
            if older { ", older than the first page" } else { "" }
        ),
        _ => format!("<p class=\"hint\">{total} dead letters; none on this page.</p>"),
    }
}

/// "Newest" when this is an older page, "Older →" when the page is full.
fn page_links(
    path: &str,
    status: Option<&str>,
    limit: usize,
    before: Option<u64>,
    letters: &[InboxDeadLetter],
) -> String {
    let mut q = Vec::new();
    if let Some(s) = status {
        q.push(format!("status={}", encode(s)));
    }
    if limit != PAGE {
        q.push(format!("limit={limit}"));
    }
    let href = |extra: Option<String>| {
        let all: Vec<String> = q.iter().cloned().chain(extra).collect();
        if all.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", all.join("&"))
        }
    };
    let mut out = String::new();
    if before.is_some() {
        out.push_str(&format!(
            "<a class=\"newest\" href=\"{}\">← Newest</a> ",
            esc(&href(None))
        ));
    }
    if letters.len() == limit {
        if let Some(last) = letters.last() {
            out.push_str(&format!(
                "<a class=\"next\" href=\"{}\">Older →</a>",
                esc(&href(Some(format!("before={}", last.id))))
            ));
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("<p>{out}</p>")
    }
}

/// `POST /consumers/G/preview` and `/consumers/G/apply`.
pub(super) fn act(c: &Console, viewer: &Viewer, req: &Request, rest: &str) -> Page {
    let (name, step) = rest.rsplit_once('/').unwrap_or((rest, ""));
    let group = group_name(name)?;
    let form = req.form();
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "a consumer dead-letter action", &why));
    }
    form.only(&["csrf", "action", "scope", "id", "expected"])?;
    let action = match form.choice("action", &["replay", "discard"])? {
        Some("replay") => DeadLetterAction::Replay,
        Some(_) => DeadLetterAction::Discard,
        None => return Err(BadParam::new("action", "is required: replay or discard").into()),
    };
    let which = if form.choice("scope", &["selected", "all"])? == Some("all") {
        Selection::All
    } else {
        let ids = form.ids("id")?;
        if ids.is_empty() {
            return Err(BadParam::new("id", "select at least one dead letter (or every one of the group)").into());
        }
        Selection::Ids(ids)
    };
    let actor = viewer.actor(&req.remote);
    let table_name = &c.config.consumer.dead_letter_table;
    let run = |dry_run| {
        dead_letter::act_on_dead_letters(
            &c.consumer_pool,
            table_name,
            &group,
            &which,
            action,
            &BatchOptions {
                dry_run,
                batch: 200,
                rate_per_sec: 0,
                actor: actor.clone(),
            },
            |_, _| {},
        )
    };
    let n = run(true)?;
    let what = match &which {
        Selection::All => format!("every dead letter of group {group}"),
        Selection::Ids(ids) => format!("{} selected dead letter(s) of group {group}", ids.len()),
    };
    let verb = action.name();
    let path = format!("/consumers/{}", encode(&group));
    match step {
        "preview" => {
            let mut hidden = csrf_field(viewer);
            for (k, v) in &form.0 {
                if k != "csrf" {
                    hidden.push_str(&format!(
                        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                        esc(k),
                        esc(v)
                    ));
                }
            }
            let body = if n == 0 {
                notice(
                    "info",
                    &format!("Nothing to {verb}: no row of {what} is in a state it applies to."),
                )
            } else {
                format!(
                    "<p class=\"confirm\"><strong>{} row(s)</strong> will be {verb}ed: {}.</p>\
                     <form method=\"post\" action=\"{path}/apply\">{hidden}<input type=\"hidden\" name=\"expected\" \
                     value=\"{n}\"><button type=\"submit\" class=\"danger\">{verb} {} row(s)</button> \
                     <a href=\"{path}\">Cancel</a></form>",
                    thousands(n),
                    esc(&what),
                    thousands(n)
                )
            };
            Ok(Response::html(
                200,
                frame(
                    &format!("Confirm: {verb}"),
                    &c.config.table,
                    viewer,
                    "/consumers",
                    &body,
                ),
            ))
        }
        "apply" => {
            let expected = form.number("expected", u64::MAX, 0, u64::MAX - 1)?;
            if expected != n {
                let body = notice(
                    "warn",
                    &format!(
                        "The rows this takes changed from {expected} to {n} since you looked: nothing was done; \
                         look again."
                    ),
                );
                return Ok(Response::html(
                    409,
                    frame("Changed", &c.config.table, viewer, "/consumers", &body),
                ));
            }
            let done = run(false)?;
            let summary = format!("{verb} via the console: {what}; {done} row(s)");
            admin::audit(
                &mut c.consumer_pool.get_conn()?,
                table_name,
                &format!("console {verb}"),
                &actor,
                &[(0, Some(summary.clone()))],
            )?;
            log::info!("console: {actor}: {summary}");
            let body = format!(
                "{}<p><a href=\"{path}\">Back to the group</a></p>",
                notice("info", &format!("{} row(s) {verb}ed ({what}).", thousands(done)))
            );
            Ok(Response::html(
                200,
                frame("Done", &c.config.table, viewer, "/consumers", &body),
            ))
        }
        _ => Err(BadParam::new("path", format!("no action {step:?}: preview or apply")).into()),
    }
}

fn group_name(raw: &str) -> Result<String, BadParam> {
    let name = super::http::Params::parse(&format!("g={raw}"))
        .get("g")
        .unwrap_or("")
        .to_string();
    dead_letter::check_group(&name).map_err(|e| BadParam::new("group", e.to_string()))?;
    Ok(name)
}
