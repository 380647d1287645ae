//! Re-emit: sent events back to the broker by filter (`crate::reemit`). The page counts what a
//! filter selects and how far back the table keeps sent events; an admin starts a job from the
//! count (CSRF, audited), which runs in this process at its rate; the job list shows every job's
//! progress, with stop and resume.

use std::sync::atomic::AtomicBool;

use super::auth::{check_action, Role, Viewer};
use super::html::{csrf_field, duration, esc, frame, notice, table, thousands};
use super::http::{BadParam, Params, Request, Response};
use super::state::{Console, Failure, Page};
use crate::admin::TimeBound;
use crate::error::Error;
use crate::reemit::{self, Job, JobState, ReemitFilter};

const FILTER_FIELDS: [&str; 5] = ["event_type", "topic", "biz_no", "since", "until"];

/// A library error about a value as a 400 naming it; anything else as it is.
fn bad(e: Error) -> Failure {
    match e {
        Error::InvalidEvent { field, reason } => Failure::Bad(BadParam::new(field, reason)),
        e => Failure::Db(e),
    }
}

fn filter_of(p: &Params) -> Result<ReemitFilter, BadParam> {
    let time = |name: &str| -> Result<Option<TimeBound>, BadParam> {
        p.text(name, 40)?
            .map(|v| TimeBound::parse(v).map_err(|e| BadParam::new(name, e)))
            .transpose()
    };
    Ok(ReemitFilter {
        event_type: p.text("event_type", 64)?.map(String::from),
        topic: p.text("topic", 127)?.map(String::from),
        biz_no: p.text("biz_no", 64)?.map(String::from),
        since: time("since")?,
        until: time("until")?,
    })
}

fn filter_form(p: &Params) -> String {
    let field = |name: &str, label: &str, hint: &str| {
        format!(
            "<label>{label} <input name=\"{name}\" value=\"{}\" placeholder=\"{hint}\"></label>",
            esc(p.get(name).unwrap_or(""))
        )
    };
    format!(
        "<form method=\"get\" action=\"/re-emit\" class=\"filters\">{}{}{}{}{}<input type=\"hidden\" name=\"count\" value=\"1\">\
         <button type=\"submit\">Count</button></form>",
        field("event_type", "Type", "any"),
        field("topic", "Topic", "any"),
        field("biz_no", "Business key", "any"),
        field("since", "Written since", "24h, 7d or 2026-12-01 08:00"),
        field("until", "before", "now"),
    )
}

fn jobs_table(c: &Console, viewer: &Viewer) -> Result<String, Failure> {
    let jobs = reemit::jobs(&c.pool, &c.config.table, 20).map_err(bad)?;
    if jobs.is_empty() {
        return Ok("<p class=\"hint\">No re-emit job yet.</p>".into());
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let silent = j.state == JobState::Running
                && j.heartbeat_age_ms.unwrap_or(0) >= reemit::STALE_AFTER.as_millis() as u64;
            let state = match (j.state, silent) {
                (JobState::Running, true) => format!(
                    "RUNNING, runner silent for {}",
                    duration(std::time::Duration::from_millis(j.heartbeat_age_ms.unwrap_or(0)))
                ),
                (JobState::Running, false) => format!("RUNNING by {}", esc(j.runner.as_deref().unwrap_or("?"))),
                (s, _) => s.sql().to_string(),
            };
            let action = match (viewer.role, j.state, silent) {
                (Role::Admin, JobState::Running, false) => action_button(viewer, j, "stop", "Stop"),
                (Role::Admin, JobState::Stopped, _) | (Role::Admin, JobState::Running, true) => {
                    action_button(viewer, j, "resume", "Resume")
                }
                _ => String::new(),
            };
            vec![
                j.id.to_string(),
                state,
                format!("{} of {}", thousands(j.emitted), thousands(j.matched)),
                esc(&j.selection.describe()),
                format!("{}/s", thousands(u64::from(j.rate))),
                format!("{} by {}", esc(&j.created_at), esc(&j.created_by)),
                action,
            ]
        })
        .collect();
    Ok(table(
        "reemit-jobs",
        &["job", "state", "emitted", "selection", "rate", "created", ""],
        &rows,
    ))
}

fn action_button(viewer: &Viewer, j: &Job, what: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/re-emit/{}/{what}\" class=\"inline\">{}<button type=\"submit\">{label}</button></form>",
        j.id,
        csrf_field(viewer)
    )
}

fn page_with(c: &Console, viewer: &Viewer, p: &Params, top: &str) -> Page {
    let mut body = String::from(top);
    body.push_str(
        "<p class=\"hint\">Sends sent events again: each becomes a new row due now, keeping its event key (a \
         consumer's inbox takes it for the event it already handled, unless its group forgot it: \
         <code>outboxd inbox forget</code>) and carrying the properties <code>reemitOf</code> and \
         <code>reemitJob</code>. Only what the table keeps can be re-emitted.</p>",
    );
    body.push_str(&filter_form(p));
    if p.get("count").is_some() {
        let filter = filter_of(p)?;
        let preview = reemit::preview(&c.pool, &c.config.table, &c.config.topic, &filter).map_err(bad)?;
        let kept = match &preview.oldest_kept {
            Some((id, at)) => format!("The table keeps sent events back to {} (event {id}).", esc(at)),
            None => "The table keeps no sent event.".into(),
        };
        let deleted = if c.config.sent_rows == crate::config::SentRows::Delete {
            " With <code>sent.rows = delete</code>, an event sent at its first attempt is deleted as it is sent."
        } else {
            ""
        };
        body.push_str(&notice(
            "info",
            &format!(
                "{} sent events match ({}).",
                thousands(preview.matched),
                preview.selection.describe()
            ),
        ));
        body.push_str(&format!("<p class=\"hint\">{kept}{deleted}</p>"));
        if viewer.role == Role::Admin && preview.matched > 0 {
            let hidden: String = FILTER_FIELDS
                .iter()
                .filter_map(|f| p.get(f).map(|v| (f, v)))
                .map(|(f, v)| format!("<input type=\"hidden\" name=\"{f}\" value=\"{}\">", esc(v)))
                .collect();
            body.push_str(&format!(
                "<form method=\"post\" action=\"/re-emit/start\">{}{hidden}<label>Rate <input name=\"rate\" value=\"{}\" \
                 size=\"7\"> events/s</label><button type=\"submit\" class=\"danger\">Re-emit {} events</button></form>",
                csrf_field(viewer),
                reemit::DEFAULT_RATE,
                thousands(preview.matched)
            ));
        } else if preview.matched > 0 {
            body.push_str(&notice("info", "Log in with the admin token to re-emit them."));
        }
    }
    body.push_str("<h2>Jobs</h2>");
    body.push_str(&jobs_table(c, viewer)?);
    Ok(Response::html(
        200,
        frame("Re-emit", &c.config.table, viewer, "/re-emit", &body),
    ))
}

/// `GET /re-emit`: the filter, its count when asked (`count=1`), and the jobs.
pub(super) fn page(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let p = req.query();
    let mut known = FILTER_FIELDS.to_vec();
    known.push("count");
    p.only(&known)?;
    page_with(c, viewer, &p, "")
}

/// Takes job `id` for a run of this process (a refusal is a 400 naming the job), then runs it
/// on a thread of its own until it is done or stopped.
fn spawn(c: &Console, id: u64) -> Result<(), Failure> {
    let runner = runner_name(c);
    let job = reemit::take(&c.pool, &c.config.table, id, &runner).map_err(bad)?;
    let pool = c.pool.clone();
    std::thread::Builder::new()
        .name(format!("outbox-reemit-{id}"))
        .spawn(move || {
            if let Err(e) = reemit::run_taken(&pool, job, &runner, &AtomicBool::new(false), |_| {}) {
                log::warn!("re-emit job {id}: stopped by an error: {e}; resume it from the console or `outboxd events re-emit --resume {id}`");
            }
        })
        .map(|_| ())
        .map_err(|source| {
            Failure::Db(Error::Thread {
                name: format!("outbox-reemit-{id}"),
                source,
            })
        })
}

/// A name of its own for each run the console starts: `console@<service>:<pid>#<n>`.
fn runner_name(c: &Console) -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    format!("console@{}:{}#{n}", c.config.service_name, std::process::id())
}

/// `POST /re-emit/start`: counts the filter again, creates the job (audited) and runs it here.
pub(super) fn start(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let form = req.form();
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "re-emit", &why));
    }
    let mut known = FILTER_FIELDS.to_vec();
    known.extend(["csrf", "rate"]);
    form.only(&known)?;
    let rate = form.number("rate", u64::from(reemit::DEFAULT_RATE), 1, u64::from(reemit::MAX_RATE))? as u32;
    let filter = filter_of(&form)?;
    let preview = reemit::preview(&c.pool, &c.config.table, &c.config.topic, &filter).map_err(bad)?;
    let job = reemit::create(&c.pool, &preview, rate, &viewer.actor(&req.remote)).map_err(bad)?;
    spawn(c, job.id)?;
    let mut back = Params::default();
    for f in FILTER_FIELDS {
        if let Some(v) = form.get(f) {
            back.0.push((f.to_string(), v.to_string()));
        }
    }
    page_with(
        c,
        viewer,
        &back,
        &notice(
            "info",
            &format!(
                "Re-emit job {} started: {} events at {}/s (audited).",
                job.id,
                thousands(job.matched),
                thousands(u64::from(rate))
            ),
        ),
    )
}

/// `POST /re-emit/{id}/stop` and `/resume`.
pub(super) fn act(c: &Console, viewer: &Viewer, req: &Request, rest: &str) -> Page {
    let form = req.form();
    let (id, what) = rest.split_once('/').unwrap_or((rest, ""));
    if let Err(why) = check_action(viewer, req, form.get("csrf")) {
        return Ok(c.refused(viewer, req, "re-emit", &why));
    }
    form.only(&["csrf"])?;
    let id: u64 = id
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| BadParam::new("job", format!("{:?} is not a job id", super::http::shorten(id))))?;
    let text = match what {
        "stop" => {
            let j = reemit::stop(&c.pool, &c.config.table, id, &viewer.actor(&req.remote)).map_err(bad)?;
            format!(
                "Job {id} stopped at {} of {} (audited).",
                thousands(j.emitted),
                thousands(j.matched)
            )
        }
        "resume" => {
            spawn(c, id)?;
            format!("Job {id} resumed.")
        }
        other => {
            return Err(BadParam::new(
                "action",
                format!("{:?} is not stop or resume", super::http::shorten(other)),
            )
            .into())
        }
    };
    page_with(c, viewer, &Params::default(), &notice("info", &text))
}
