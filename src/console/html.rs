//! HTML of the console: every value that is not a literal of this file goes through [`esc`];
//! the page frame, tables, forms with their CSRF field, and small inline SVG charts.

use std::fmt::Write as _;
use std::time::Duration;

use super::auth::Viewer;

/// `s` escaped for HTML text and attribute values: a payload or an error holding `<script>`
/// shows as text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The navigation: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/events", "Events"),
    ("/dead-letters", "Dead letters"),
    ("/ordered", "Ordered keys"),
    ("/consumers", "Consumers"),
    ("/re-emit", "Re-emit"),
    ("/controls", "Controls"),
    ("/audit", "Audit"),
];

/// A whole page: the frame, the navigation (with `active` marked) and `body`.
pub fn frame(title: &str, table: &str, viewer: &Viewer, active: &str, body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let class = if *path == active { " class=\"active\"" } else { "" };
        let _ = write!(nav, "<a href=\"{path}\"{class}>{label}</a>");
    }
    let who = match viewer.session() {
        Some(_) => format!(
            "<span class=\"who\">{} ({})</span><form method=\"post\" action=\"/logout\" class=\"inline\">{}\
             <button type=\"submit\">Log out</button></form>",
            esc(&viewer.name),
            viewer.role.as_str(),
            csrf_field(viewer)
        ),
        None => format!(
            "<span class=\"who\">{}</span> <a href=\"/login\">Log in</a>",
            viewer.role.as_str()
        ),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · outbox console</title>\
         <link rel=\"icon\" href=\"/static/icon.svg\" type=\"image/svg+xml\"><link rel=\"stylesheet\" href=\"/static/console.css\">\
         <script src=\"/static/console.js\" defer></script></head>\
         <body><header><span class=\"brand\">outbox</span><span class=\"table\">table {table}</span>\
         <nav>{nav}</nav><span class=\"session\">{who}</span></header>\
         <main><h1>{title}</h1>{body}</main></body></html>\n",
        title = esc(title),
        table = esc(table),
    )
}

/// The hidden field every action form carries.
pub fn csrf_field(viewer: &Viewer) -> String {
    match viewer.session() {
        Some(s) => format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", esc(&s.csrf)),
        None => String::new(),
    }
}

/// A table: a header row, then rows of cells that are already HTML.
pub fn table(class: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table class=\"{}\"><thead><tr>", esc(class));
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"empty\">nothing</td></tr>",
            headers.len()
        );
    }
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A notice box: `kind` is `info`, `warn` or `error`; `text` is escaped.
pub fn notice(kind: &str, text: &str) -> String {
    format!("<p class=\"notice {}\">{}</p>", esc(kind), esc(text))
}

/// A duration as people read it: 850 ms, 12.4 s, 3 min, 2 h 5 min, 3 d.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        format!("{} min", ms / 60_000)
    } else if ms < 86_400_000 {
        format!("{} h {} min", ms / 3_600_000, (ms / 60_000) % 60)
    } else {
        format!("{} d", ms / 86_400_000)
    }
}

/// A count that may be a lower bound: `100 000+`.
pub fn count(n: u64, bounded_at: Option<u64>) -> String {
    let s = thousands(n);
    match bounded_at {
        Some(b) if n >= b => format!("{s}+"),
        _ => s,
    }
}

/// `1234567` as `1 234 567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    out
}

/// A small line chart of `values` (oldest first), `w`×`h` pixels, as inline SVG.
pub fn sparkline(values: &[f64], w: u32, h: u32) -> String {
    if values.len() < 2 {
        return format!(
            "<svg class=\"spark\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"no data yet\"></svg>"
        );
    }
    let max = values.iter().cloned().fold(0.0f64, f64::max).max(1.0);
    let step = w as f64 / (values.len() - 1) as f64;
    let mut points = String::new();
    for (i, v) in values.iter().enumerate() {
        let x = i as f64 * step;
        let y = h as f64 - 1.0 - (v / max) * (h as f64 - 2.0);
        let _ = write!(points, "{x:.1},{y:.1} ");
    }
    format!(
        "<svg class=\"spark\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" \
         aria-label=\"last {} samples, peak {max:.0}\"><polyline points=\"{}\"/></svg>",
        values.len(),
        points.trim_end()
    )
}

/// Bars of a histogram: `(label, count)`, as inline SVG with labels under the bars.
pub fn bars(buckets: &[(String, u64)], w: u32, h: u32) -> String {
    let max = buckets.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let bw = w as f64 / buckets.len().max(1) as f64;
    let mut svg = format!(
        "<svg class=\"bars\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\" role=\"img\" aria-label=\"histogram\">",
        h + 14,
        h + 14
    );
    for (i, (label, n)) in buckets.iter().enumerate() {
        let bh = (*n as f64 / max as f64) * (h as f64 - 2.0);
        let x = i as f64 * bw;
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\"><title>{}: {n}</title></rect>\
             <text x=\"{:.1}\" y=\"{}\">{}</text>",
            x + 1.0,
            h as f64 - bh,
            (bw - 2.0).max(1.0),
            esc(label),
            x + bw / 2.0,
            h + 12,
            esc(label)
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_text() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        let t = table("t", &["a<b"], &[vec![esc("<img src=x onerror=alert(1)>")]]);
        assert!(!t.contains("<img") && t.contains("a&lt;b"), "{t}");
    }

    #[test]
    fn numbers_and_durations_read_well() {
        assert_eq!(thousands(1_234_567), "1\u{202f}234\u{202f}567");
        assert_eq!(count(100_000, Some(100_000)), "100\u{202f}000+");
        assert_eq!(count(5, Some(100_000)), "5");
        assert_eq!(duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration(Duration::from_secs(7_500)), "2 h 5 min");
    }
}
