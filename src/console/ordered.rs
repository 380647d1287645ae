//! Ordered keys (`ordering = per-biz-no`): the keys whose oldest pending event holds the rest
//! back, with that head event and why (a dead head, a head backing off after a failure, a head
//! parked on a broker that is down).

use super::auth::Viewer;
use super::data;
use super::html::{esc, frame, notice, table};
use super::http::Response;
use super::state::{Console, Page};

/// Heads read per kind.
const HEADS: usize = 200;

pub(super) fn page(c: &Console, viewer: &Viewer) -> Page {
    let keys = data::held_keys(&mut c.conn()?, &c.config.table, HEADS)?;
    let mut body = String::new();
    if c.config.ordering != crate::config::Ordering::PerBizNo {
        body.push_str(&notice(
            "info",
            "This relay runs with ordering = none: a key's events do not wait for each other. The keys \
             below would hold back only under ordering = per-biz-no.",
        ));
    }
    let dead_head = match c.config.ordering_dead_head {
        crate::config::DeadHeadPolicy::Block => {
            "block: a dead head holds its key's later events until it is replayed or discarded"
        }
        crate::config::DeadHeadPolicy::Skip => "skip: a dead head does not hold its key's later events",
    };
    body.push_str(&format!(
        "<p class=\"hint\">ordering.dead.head = {}. At most {HEADS} heads of each kind are read.</p>",
        esc(dead_head)
    ));
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            vec![
                esc(&k.biz_no),
                esc(k.why),
                format!("<a href=\"/events/{}\">{}</a>", k.head.id, k.head.id),
                esc(&k.head.event_type),
                k.head.retry_count.to_string(),
                esc(&k.head.due),
                esc(k.head.last_error.as_deref().unwrap_or("")),
                k.next_pending
                    .map(|id| format!("<a href=\"/events/{id}\">{id}</a>"))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    body.push_str(&table(
        "held",
        &[
            "biz_no",
            "why",
            "head event",
            "type",
            "tries",
            "due",
            "last error",
            "next waiting",
        ],
        &rows,
    ));
    Ok(Response::html(
        200,
        frame("Ordered keys", &c.config.table, viewer, "/ordered", &body),
    ))
}
