//! `GET /dead-letters/groups`: the dead letters grouped by the start of their error, their topic
//! and their event type, with counts, each group linking to the dead-letter list filtered to it
//! (where it is replayed or discarded).

use super::auth::Viewer;
use super::data::{self, ERROR_PREFIX, MAX_GROUPS, STATUS_WINDOW};
use super::html::{count, esc, frame, notice, table, thousands};
use super::http::{encode, Request, Response};
use super::state::{Console, Page};

/// The most dead letters `?examine=` may ask to look at.
const EXAMINE_MAX: u64 = 100_000;

pub(super) fn page(c: &Console, viewer: &Viewer, req: &Request) -> Page {
    let p = req.query();
    p.only(&["examine"])?;
    // Each dead letter looked at is a lookup by primary key: by default as many as a filtered
    // page looks at, so the page stays cheap on a large table; more on request.
    let examine = p.number("examine", STATUS_WINDOW, 1, EXAMINE_MAX)?;
    let (groups, examined) = data::dead_letter_groups(&mut c.conn()?, &c.config.table, examine)?;
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let mut q = vec![format!("event_type={}", encode(&g.event_type))];
            if let Some(t) = &g.topic {
                q.push(format!("topic={}", encode(t)));
            }
            if !g.error.is_empty() {
                q.push(format!("error={}", encode(&g.error)));
            }
            vec![
                format!(
                    "<a href=\"/dead-letters?{}\">{}</a>",
                    esc(&q.join("&")),
                    thousands(g.rows)
                ),
                esc(&g.error),
                esc(g.topic.as_deref().unwrap_or("(default topic)")),
                esc(&g.event_type),
            ]
        })
        .collect();
    let scope = if examined >= examine {
        let more = (examine * 10).min(EXAMINE_MAX);
        format!(
            "Among the first {} dead letters by due time (there are more{}); ",
            thousands(examine),
            if more > examine {
                format!(
                    ": <a href=\"/dead-letters/groups?examine={more}\">look at {}</a>",
                    thousands(more)
                )
            } else {
                String::new()
            }
        )
    } else {
        format!("{} dead letters; ", count(examined, None))
    };
    let body = format!(
        "<p class=\"hint\">{scope}errors told apart by their first {ERROR_PREFIX} characters; the {MAX_GROUPS} largest \
         groups. A count opens the dead letters of its group, to replay or discard them.</p>{}{}",
        table(
            "dead-groups",
            &["dead letters", "error starts with", "topic", "event type"],
            &rows
        ),
        if groups.is_empty() {
            notice("info", "No dead letters.")
        } else {
            String::new()
        }
    );
    Ok(Response::html(
        200,
        frame("Dead letters by error", &c.config.table, viewer, "/dead-letters", &body),
    ))
}
