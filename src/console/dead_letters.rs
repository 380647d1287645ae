//! The relay's dead letters (FAIL rows): a filtered list; replay or discard the selected rows or
//! every row matching the filter, after a page showing how many rows the action takes. The
//! action runs as `outboxd dead-letters replay|discard` does (batched, only rows still FAIL,
//! each row audited with the operator's name), plus one audit row saying who did what with which
//! filter to how many rows.

use crate::admin::{self, BatchOptions, DeadLetterAction, DeadLetterCount, DeadLetterFilter};

use super::auth::{check_action, Viewer};
use super::data;
use super::events::{filter, filter_form, next_link, row_cells, ROW_HEADERS};
use super::html::{csrf_field, esc, frame, notice, table, thousands};
use super::http::{BadParam, Params, Request, Response};
use super::state::{Console, Page};

const LIST: &[&str] = &[
    "topic",
    "event_type",
    "biz_no",
    "since",
    "until",
    "error",
    "page",
    "after",
];
const FILTER_FIELDS: &[&str] = &["topic", "event_type", "biz_no", "since", "until", "error"];
const ACTION: &[&str] = &[
    "topic",
    "event_type",
    "biz_no",
    "since",
    "until",
    "error",
    "page",
    "after",
    "csrf",
    "action",
    "scope",
    "id",
    "expected",
];

pub(super) fn list(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let p = req.query();
    let mut f = filter(&p, LIST, Some("FAIL"))?;
    f.by_update = true;
    let found = data::events(&mut c.conn()?, &c.config.table, &f)?;
    let admin = viewer.role == super::auth::Role::Admin;
    let rows: Vec<Vec<String>> = found
        .rows
        .iter()
        .map(|r| {
            let mut cells = row_cells(r);
            if admin {
                cells.insert(0, format!("<input type=\"checkbox\" name=\"id\" value=\"{}\">", r.id));
            }
            cells
        })
        .collect();
    let mut headers: Vec<&str> = ROW_HEADERS.to_vec();
    if admin {
        headers.insert(0, "");
    }
    let listing = format!(
        "<p><a href=\"/dead-letters/groups\">Grouped by error, topic and type →</a></p>{}",
        table("events dead", &headers, &rows)
    );
    let body = if admin {
        format!(
            "{}<form method=\"post\" action=\"/dead-letters/preview\">{}{}{listing}\
             <div class=\"actions\">\
             <button name=\"action\" value=\"replay\" data-scope=\"selected\">Replay selected</button>\
             <button name=\"action\" value=\"discard\" data-scope=\"selected\">Discard selected</button>\
             <label><input type=\"checkbox\" name=\"scope\" value=\"matching\"> every dead letter matching the filter, \
             not only the selected ones</label></div></form>{}",
            filter_form("/dead-letters", &p, true),
            csrf_field(viewer),
            hidden_filter(&p),
            next_link("/dead-letters", &p, &found)
        )
    } else {
        format!(
            "{}{listing}{}{}",
            filter_form("/dead-letters", &p, true),
            next_link("/dead-letters", &p, &found),
            notice("info", "Log in with the admin token to replay or discard.")
        )
    };
    Ok(Response::html(
        200,
        frame("Dead letters", &c.config.table, viewer, "/dead-letters", &body),
    ))
}

/// The filter's fields as hidden inputs, so an action applies to what the list showed.
fn hidden_filter(p: &Params) -> String {
    FILTER_FIELDS
        .iter()
        .filter_map(|k| p.get(k).map(|v| (k, v)))
        .map(|(k, v)| format!("<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(v)))
        .collect()
}

/// What an action form asks: the action, and which rows.
struct Ask {
    action: DeadLetterAction,
    filter: DeadLetterFilter,
    /// Every row matching the filter (else the selected ids).
    matching: bool,
    /// The filter as the operator wrote it, for the confirmation and the audit.
    written: Vec<(&'static str, String)>,
}

impl Ask {
    fn parse(p: &Params) -> Result<Ask, BadParam> {
        p.only(ACTION)?;
        let action = match p.choice("action", &["replay", "discard"])? {
            Some("replay") => DeadLetterAction::Replay,
            Some(_) => DeadLetterAction::Discard,
            None => return Err(BadParam::new("action", "is required: replay or discard")),
        };
        let matching = p.choice("scope", &["selected", "matching"])? == Some("matching");
        let f = filter(p, ACTION, Some("FAIL"))?;
        let ids = p.ids("id")?;
        if !matching && ids.is_empty() {
            return Err(BadParam::new(
                "id",
                "select at least one dead letter (or act on every one matching the filter)",
            ));
        }
        if ids.len() > 1000 {
            return Err(BadParam::new(
                "id",
                "at most 1000 rows can be selected at once; use the filter",
            ));
        }
        Ok(Ask {
            action,
            filter: DeadLetterFilter {
                ids: if matching { Vec::new() } else { ids },
                event_type: f.event_type,
                biz_no: f.biz_no,
                since: f.since,
                until: f.until,
                topic: f.topic,
                error_contains: f.error,
            },
            matching,
            written: FILTER_FIELDS
                .iter()
                .filter_map(|k| p.get(k).map(|v| (*k, v.to_string())))
                .collect(),
        })
    }

    fn describe(&self) -> String {
        if !self.matching {
            return format!("the selected rows (ids {})", ids_text(&self.filter.ids));
        }
        let parts: Vec<String> = self.written.iter().map(|(k, v)| format!("{k} = {v:?}")).collect();
        if parts.is_empty() {
            "every dead letter".into()
        } else {
            format!("every dead letter with {}", parts.join(", "))
        }
    }
}

fn ids_text(ids: &[u64]) -> String {
    let shown: Vec<String> = ids.iter().take(20).map(u64::to_string).collect();
    let more = if ids.len() > 20 {
        format!(" and {} more", ids.len() - 20)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

fn options(dry_run: bool, actor: String) -> BatchOptions {
    BatchOptions {
        dry_run,
        batch: 200,
        rate_per_sec: 0,
        actor,
    }
}

/// How many rows the action takes, and a form to confirm it.
pub(super) fn preview(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let form = req.form();
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "a dead-letter action", &why));
    }
    let ask = Ask::parse(&form)?;
    let n = Count::of(c, &ask)?;
    Ok(Response::html(200, confirm_page(c, viewer, &form, &ask, n, None)))
}

/// Dead letters looked at to count a preview filtering on more than the status: each is a
/// lookup by primary key, so the bound keeps the preview cheap however many there are.
const PREVIEW_EXAMINES: u64 = 1_000;

/// Rows counted before an action ([`admin::count_dead_letters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count(DeadLetterCount);

impl Count {
    fn of(c: &Console, ask: &Ask) -> Result<Count, crate::error::Error> {
        admin::count_dead_letters(&c.pool, &c.config.table, &ask.filter, PREVIEW_EXAMINES).map(Count)
    }

    fn is_zero(self) -> bool {
        self.0.matched == 0 && !self.0.partial
    }

    /// As the form carries it: `37`, or `37+` (a lower bound).
    fn encode(self) -> String {
        format!("{}{}", self.0.matched, if self.0.partial { "+" } else { "" })
    }

    fn decode(s: &str) -> Option<Count> {
        let (n, partial) = match s.strip_suffix('+') {
            Some(n) => (n, true),
            None => (s, false),
        };
        Some(Count(DeadLetterCount {
            matched: n.parse().ok()?,
            partial,
        }))
    }

    fn words(self) -> String {
        if self.0.partial {
            format!(
                "{} row(s) among the latest dead letters looked at, and maybe more among the older ones",
                thousands(self.0.matched)
            )
        } else {
            format!("{} row(s)", thousands(self.0.matched))
        }
    }
}

fn confirm_page(c: &Console, viewer: &Viewer, form: &Params, ask: &Ask, n: Count, note: Option<&str>) -> String {
    let verb = ask.action.name();
    let mut hidden = csrf_field(viewer);
    for (k, v) in &form.0 {
        if k != "csrf" && k != "expected" {
            hidden.push_str(&format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                esc(k),
                esc(v)
            ));
        }
    }
    let what = match ask.action {
        DeadLetterAction::Replay => "back to WAIT, due now, with the retry count reset: the relays send them again",
        DeadLetterAction::Discard => "marked DISCARDED: never sent, kept for the record until retention deletes them",
    };
    let mut body = String::new();
    if let Some(note) = note {
        body.push_str(&notice("warn", note));
    }
    if n.is_zero() {
        body.push_str(&notice(
            "info",
            &format!("No dead letter matches {}: nothing to {verb}.", ask.describe()),
        ));
    } else {
        let all = if n.0.partial {
            " every matching row (in batches of 200)".to_string()
        } else {
            format!(" {} row(s)", thousands(n.0.matched))
        };
        body.push_str(&format!(
            "<p class=\"confirm\"><strong>{}</strong> will be {verb}ed: {}.</p><p>They go {what}. Each row is \
             audited with your name.</p><form method=\"post\" action=\"/dead-letters/apply\">{hidden}\
             <input type=\"hidden\" name=\"expected\" value=\"{}\"><button type=\"submit\" class=\"danger\">\
             {}{all}</button> <a href=\"/dead-letters\">Cancel</a></form>",
            n.words(),
            esc(&ask.describe()),
            n.encode(),
            if verb == "replay" { "Replay" } else { "Discard" },
        ));
    }
    frame(
        &format!("Confirm: {verb}"),
        &c.config.table,
        viewer,
        "/dead-letters",
        &body,
    )
}

/// Runs the action, if the rows it takes are still as many as the operator confirmed.
pub(super) fn apply(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let form = req.form();
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "a dead-letter action", &why));
    }
    let ask = Ask::parse(&form)?;
    let expected = match form.get("expected") {
        None => return Err(BadParam::new("expected", "is required: confirm the count first").into()),
        Some(e) => Count::decode(e).ok_or_else(|| {
            BadParam::new(
                "expected",
                format!("{e:?} is not a count this console wrote: confirm the count first"),
            )
        })?,
    };
    let actor = viewer.actor(&req.remote);
    let now = Count::of(c, &ask)?;
    if now != expected {
        let note = format!(
            "The rows this takes changed from {} to {} since you looked: confirm again.",
            expected.words().to_lowercase(),
            now.words().to_lowercase()
        );
        return Ok(Response::html(
            200,
            confirm_page(c, viewer, &form, &ask, now, Some(&note)),
        ));
    }
    let done = admin::act_on_dead_letters(
        &c.pool,
        &c.config.table,
        &ask.filter,
        ask.action,
        &options(false, actor.clone()),
        |_, _| {},
    )?;
    let verb = ask.action.name();
    let summary = format!("{} via the console: {}; {done} row(s)", verb, ask.describe());
    let mut conn = c.conn()?;
    admin::audit(
        &mut conn,
        &c.config.table,
        &format!("console {verb}"),
        &actor,
        &[(0, Some(summary.clone()))],
    )?;
    log::info!("console: {actor}: {summary}");
    let body = format!(
        "{}<p><a href=\"/dead-letters\">Back to the dead letters</a> · <a href=\"/audit\">the audit</a></p>",
        notice(
            "info",
            &format!("{} row(s) {verb}ed ({}).", thousands(done), ask.describe())
        )
    );
    Ok(Response::html(
        200,
        frame("Done", &c.config.table, viewer, "/dead-letters", &body),
    ))
}
