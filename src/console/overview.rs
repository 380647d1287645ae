//! The overview: the backlog by status, the oldest due row, who holds what, the relay's rates,
//! latency, breaker and stalls. Its live part refreshes every two seconds while the tab is
//! visible (`/partials/overview`).

use super::auth::Viewer;
use super::data::{self, Backlog, COUNT_BOUND};
use super::html::{bars, count, duration, esc, frame, notice, sparkline, table, thousands};
use super::http::Response;
use super::live::Rates;
use super::state::{Console, Page};

pub(super) fn page(c: &Console, viewer: &Viewer) -> Page {
    let live = live_html(c)?;
    let html = frame(
        "Overview",
        &c.config.table,
        viewer,
        "/",
        &format!(
            "<div id=\"live\" data-refresh=\"/partials/overview\" data-every=\"2000\">{live}</div>\
             <p class=\"hint\">Refreshes every 2 s while this tab is visible. Counts stop at {} \
             (shown as {}); the sent rows are the server's estimate.</p>",
            thousands(COUNT_BOUND),
            count(COUNT_BOUND, Some(COUNT_BOUND))
        ),
    );
    Ok(Response::html(200, html))
}

/// The overview's live part alone, for the refresh.
pub(super) fn live(c: &Console, _viewer: &Viewer) -> Page {
    Ok(Response::html(200, live_html(c)?))
}

/// The facts of the overview as JSON (for scripts; the same reads).
pub(super) fn json(c: &Console) -> Page {
    let mut conn = c.conn()?;
    let b = data::backlog(&mut conn, &c.config.table)?;
    let paused = crate::control::state(&mut conn, &c.config.table)?;
    let relay = c.live.relay().map(|r| r.counters().to_json());
    let brokers: Vec<serde_json::Value> = data::brokers(&mut conn, &c.config.table)?
        .into_iter()
        .map(|b| serde_json::json!({"broker": b.broker, "queues": b.queues, "parked": b.parked}))
        .collect();
    Ok(Response::json(
        serde_json::json!({
            "table": c.config.table,
            "wait_due": b.wait_due, "wait_later": b.wait_later, "scheduled": b.scheduled, "sending": b.sending, "fail": b.fail,
            "sent_estimate": b.done_estimate, "count_bound": COUNT_BOUND,
            "oldest_due_ms": b.oldest_due.map(|d| d.as_millis() as u64),
            "paused": paused.map(|p| p.to_string()),
            "brokers": brokers,
            "relay": relay.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok()),
        })
        .to_string(),
    ))
}

fn live_html(c: &Console) -> Result<String, super::state::Failure> {
    let mut conn = c.conn()?;
    let table_name = &c.config.table;
    let b = data::backlog(&mut conn, table_name)?;
    let holders = data::holders(&mut conn, table_name)?;
    let paused = crate::control::state(&mut conn, table_name)?;
    let mut out = String::new();
    if let Some(p) = &paused {
        out.push_str(&notice(
            "warn",
            &format!("Claiming is {p}. Resume it on the Controls page."),
        ));
    }
    out.push_str(&backlog_cards(&b));
    out.push_str("<div class=\"grid\">");
    out.push_str(&format!(
        "<section><h2>Instances holding rows</h2>{}</section>",
        table(
            "holders",
            &["instance (claim_owner)", "SENDING", "oldest held for"],
            &holders
                .iter()
                .map(|h| vec![esc(&h.owner), thousands(h.rows), duration(h.oldest)])
                .collect::<Vec<_>>(),
        )
    ));
    let brokers = data::brokers(&mut conn, table_name)?;
    if !brokers.is_empty() {
        out.push_str(&format!(
            "<section><h2>Brokers</h2>{}<p class=\"hint\">A broker down while others are up parks only the \
             keys of its queues (ordered mode); the relay's breaker (below) is for the broker side as a \
             whole.</p></section>",
            table(
                "brokers",
                &["broker", "queues (ordered topics)", "rows parked, waiting for it"],
                &brokers
                    .iter()
                    .map(|b| {
                        vec![
                            esc(&b.broker),
                            thousands(b.queues),
                            if b.parked > 0 {
                                format!("<strong>{}</strong>", count(b.parked, Some(COUNT_BOUND)))
                            } else {
                                "0: up".into()
                            },
                        ]
                    })
                    .collect::<Vec<_>>(),
            )
        ));
    }
    match c.live.relay() {
        Some(relay) => out.push_str(&relay_section(c, &relay)),
        None => out.push_str(
            "<section><h2>This relay</h2><p class=\"hint\">No relay runs in this process: rates and \
             latency show where the console runs beside one (outboxd run).</p></section>",
        ),
    }
    out.push_str("</div>");
    Ok(out)
}

fn backlog_cards(b: &Backlog) -> String {
    let card = |label: &str, value: String, class: &str| {
        format!(
            "<div class=\"card {class}\"><div class=\"value\">{value}</div><div class=\"label\">{label}</div></div>"
        )
    };
    let bound = Some(COUNT_BOUND);
    let age = b.oldest_due.map(duration).unwrap_or_else(|| "none due".into());
    let age_class = match b.oldest_due {
        Some(d) if d.as_secs() >= 300 => "bad",
        Some(d) if d.as_secs() >= 30 => "warn",
        _ => "",
    };
    format!(
        "<div class=\"cards\">{}{}{}{}{}{}{}</div>",
        card("WAIT, due", count(b.wait_due, bound), ""),
        card("WAIT, backing off", count(b.wait_later, bound), ""),
        card("WAIT, scheduled", count(b.scheduled, bound), ""),
        card("SENDING", count(b.sending, bound), ""),
        card(
            "FAIL (dead letters)",
            count(b.fail, bound),
            if b.fail > 0 { "warn" } else { "" }
        ),
        card(
            "sent (estimate)",
            b.done_estimate
                .map(|n| format!("≈ {}", thousands(n)))
                .unwrap_or_else(|| "?".into()),
            ""
        ),
        card("oldest due WAIT", age, age_class),
    )
}

fn relay_section(c: &Console, relay: &crate::relay::Relay) -> String {
    let s = relay.counters();
    let rates = c.live.rates();
    let (db, broker) = (s.stalled.is_none(), relay.health().1);
    let mut facts = vec![
        ("instance", esc(&s.instance_id)),
        ("breaker", esc(s.breaker_state.as_str())),
        (
            "broker reachable",
            if broker {
                "yes".into()
            } else {
                "<strong>no</strong>".into()
            },
        ),
        ("in flight", thousands(s.in_flight)),
    ];
    if let Some(why) = &s.stalled {
        facts.push(("stalled", format!("<strong>{}</strong>", esc(why))));
    }
    if !db {
        facts.push(("database", "<strong>claims or writes failing</strong>".into()));
    }
    if let Some(d) = s.ordered_blocked {
        facts.push(("ordered keys blocked for", duration(d)));
    }
    facts.push(("possible duplicates", thousands(s.possible_duplicates + s.stale_acks)));
    let facts: String = facts
        .into_iter()
        .map(|(k, v)| format!("<dt>{k}</dt><dd>{v}</dd>"))
        .collect();
    let rate_row = |label: &str, series: &[f64]| {
        format!(
            "<tr><th>{label}</th><td class=\"num\">{:.0}/s</td><td>{}</td></tr>",
            Rates::recent(series, 10),
            sparkline(series, 240, 28)
        )
    };
    let buckets: Vec<(String, u64)> = c
        .live
        .latency
        .buckets()
        .into_iter()
        .take(14)
        .map(|(ms, n)| {
            (
                if ms >= 1024 {
                    format!("{}s", ms / 1024)
                } else {
                    format!("{ms}")
                },
                n,
            )
        })
        .collect();
    let lat = c.live.latency.snapshot();
    format!(
        "<section><h2>This relay</h2><dl class=\"facts\">{facts}</dl></section>\
         <section><h2>Rates (last 10 s, and 10 min)</h2><table class=\"rates\">{}{}{}{}</table></section>\
         <section><h2>Commit → broker ack (ms)</h2>{}<p class=\"hint\">{} events, p50 ≤ {} ms, p99 ≤ {} ms, max {:.1} ms</p></section>",
        rate_row("claimed", &rates.claimed),
        rate_row("sent", &rates.sent),
        rate_row("retried", &rates.retried),
        rate_row("dead-lettered", &rates.dead_lettered),
        bars(&buckets, 420, 60),
        thousands(lat.count),
        lat.p50_ms,
        lat.p99_ms,
        lat.max_ms
    )
}
