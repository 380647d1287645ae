//! The operator console over a real database, request by request through `Console::handle`:
//! who may read, who may act (admin token, session, CSRF token, same origin), that every page
//! renders what the table holds escaped, that a bad parameter is a 400 naming it, and that each
//! action changes exactly the rows it showed and is audited. The browser suite
//! (`tests/browser/`) drives the same pages through `outboxd` in headless Chromium.

use mysql::prelude::Queryable;

use crate::support::TestDb;
use outbox::console::{Console, Request, Response};
use outbox::Config;
use std::time::Duration;

const ADMIN: &str = "admin-token-0123456789";
const READ: &str = "read-token-0123456789ab";
const XSS: &str = "<script>alert('x')</script>";

fn config(db: &TestDb) -> Config {
    let mut c = db.config();
    c.console.enabled = true;
    c.console.admin_token = Some(ADMIN.into());
    c.console.read_token = Some(READ.into());
    c
}

fn get(url: &str) -> Request {
    Request {
        method: "GET".into(),
        url: url.into(),
        remote: "127.0.0.1:5000".into(),
        ..Request::default()
    }
}

fn post(url: &str, form: &[(&str, &str)]) -> Request {
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{}={}", urlencode(k), urlencode(v)))
        .collect();
    Request {
        method: "POST".into(),
        url: url.into(),
        body: body.join("&").into_bytes(),
        remote: "127.0.0.1:5000".into(),
        ..Request::default()
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Numbers as the console writes them (thin spaces between thousands).
fn thousands(n: u64) -> String {
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

fn body(r: &Response) -> String {
    String::from_utf8(r.body.clone()).unwrap()
}

fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The value of the first `name="csrf" value="..."` in a page.
fn csrf_in(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + "name=\"csrf\" value=\"".len();
    page[at..].split('"').next().unwrap().to_string()
}

/// A browser's session: its cookie and its CSRF token, after logging in with `token` as `name`.
struct Session {
    cookie: String,
    csrf: String,
}

impl Session {
    fn login(console: &Console, token: &str, name: &str) -> Session {
        let form = console.handle(&get("/login"));
        assert_eq!(form.status, 200);
        let login_cookie = header(&form, "set-cookie")
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let mut req = post(
            "/login",
            &[("csrf", &csrf_in(&body(&form))), ("name", name), ("token", token)],
        );
        req.headers.insert("cookie".into(), login_cookie);
        let r = console.handle(&req);
        assert_eq!(r.status, 303, "{}", body(&r));
        let cookie = header(&r, "set-cookie").unwrap().split(';').next().unwrap().to_string();
        let mut s = Session {
            cookie,
            csrf: String::new(),
        };
        let page = console.handle(&s.get("/controls"));
        s.csrf = csrf_in(&body(&page));
        s
    }

    fn get(&self, url: &str) -> Request {
        let mut r = get(url);
        r.headers.insert("cookie".into(), self.cookie.clone());
        r
    }

    /// A form posted from the console's own page (its CSRF token added).
    fn post(&self, url: &str, form: &[(&str, &str)]) -> Request {
        let mut all = vec![("csrf", self.csrf.as_str())];
        all.extend_from_slice(form);
        let mut r = post(url, &all);
        r.headers.insert("cookie".into(), self.cookie.clone());
        r.headers.insert("host".into(), "console.local:9470".into());
        r.headers.insert("origin".into(), "http://console.local:9470".into());
        r
    }
}

/// Three dead letters (one with markup in every text column) and two waiting events.
fn seed_dead_letters(db: &TestDb) -> Vec<u64> {
    db.seed(5);
    let mut conn = db.conn();
    conn.exec_drop(
        "UPDATE t_event_record SET status = 'FAIL', retry_count = 8, last_error = ? WHERE id <= 3",
        (format!("broker said {XSS}"),),
    )
    .unwrap();
    conn.exec_drop(
        "UPDATE t_event_record SET biz_no = ?, event_type = 'ORDER_<b>PAID</b>', payload = ? WHERE id = 1",
        (XSS, XSS),
    )
    .unwrap();
    vec![1, 2, 3]
}

fn status_of(db: &TestDb, id: u64) -> String {
    db.conn()
        .exec_first("SELECT status FROM t_event_record WHERE id = ?", (id,))
        .unwrap()
        .unwrap()
}

fn audit(db: &TestDb) -> Vec<(String, String, u64, Option<String>)> {
    db.conn()
        .query("SELECT action, actor, event_id, detail FROM outbox_audit ORDER BY id")
        .unwrap()
}

const PAGES: &[&str] = &[
    "/",
    "/partials/overview",
    "/events",
    "/events?status=FAIL",
    "/events/1",
    "/dead-letters",
    "/ordered",
    "/consumers",
    "/controls",
    "/audit",
];

#[test]
fn reading_needs_a_token_and_every_page_shows_the_table_escaped() {
    let db = TestDb::new("console_read");
    seed_dead_letters(&db);
    let console = Console::new(&config(&db)).unwrap();

    // Nobody: pages send to the login, the JSON answers 401, nothing of the table shows.
    let r = console.handle(&get("/events"));
    assert_eq!((r.status, header(&r, "location")), (303, Some("/login")));
    assert_eq!(console.handle(&get("/api/overview.json")).status, 401);
    let mut wrong = get("/events");
    wrong
        .headers
        .insert("authorization".into(), "Bearer not-the-token-at-all".into());
    assert_eq!(console.handle(&wrong).status, 401);

    // A reader (bearer token or session) sees every page; markup from the table stays text.
    let reader = Session::login(&console, READ, "rita");
    for page in PAGES {
        let r = console.handle(&reader.get(page));
        let html = body(&r);
        assert_eq!(r.status, 200, "{page}: {html}");
        assert!(!html.contains("<script>alert"), "{page} renders table text as markup");
        assert!(
            header(&r, "content-security-policy").is_some_and(|c| c.contains("script-src 'self'")),
            "{page}"
        );
        assert_eq!(header(&r, "x-frame-options"), Some("DENY"), "{page}");
    }
    let list = body(&console.handle(&reader.get("/events?status=FAIL")));
    assert!(
        list.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
        "{list}"
    );
    assert!(list.contains("ORDER_&lt;b&gt;PAID&lt;/b&gt;"));
    let detail = body(&console.handle(&reader.get("/events/1")));
    assert!(detail.contains("broker said &lt;script&gt;"), "{detail}");
    // The filter finds what it says and only that.
    let waiting = body(&console.handle(&reader.get("/events?status=WAIT")));
    assert!(waiting.contains("ORD-3") && !waiting.contains("ORD-0"), "{waiting}");

    let mut bearer = get("/api/overview.json");
    bearer.headers.insert("authorization".into(), format!("Bearer {READ}"));
    let r = console.handle(&bearer);
    assert_eq!(r.status, 200);
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(json["fail"], 3, "{json}");

    // A reader's page offers no action.
    assert!(!body(&console.handle(&reader.get("/dead-letters"))).contains("/dead-letters/preview"));
}

#[test]
fn a_bad_parameter_is_a_400_naming_it() {
    let db = TestDb::new("console_bad");
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    for (url, names) in [
        ("/events?status=BOGUS", "parameter status: &quot;BOGUS&quot;"),
        ("/events?limit=5", "parameter limit"),
        ("/events?since=yesterday", "parameter since"),
        ("/events?after=-1", "parameter after"),
        ("/events/abc", "parameter id: &quot;abc&quot;"),
        ("/consumers/bad%20group!", "parameter group"),
        ("/audit?before=x", "parameter before"),
    ] {
        let r = console.handle(&reader.get(url));
        let html = body(&r);
        assert_eq!(r.status, 400, "{url}: {html}");
        assert!(html.contains(names), "{url} does not name {names}: {html}");
    }
    assert_eq!(console.handle(&reader.get("/events/999")).status, 404);
    assert_eq!(console.handle(&reader.get("/no/such/page")).status, 404);
    assert_eq!(console.handle(&reader.post("/events", &[])).status, 405);
}

#[test]
fn actions_need_the_admin_s_session_its_csrf_token_and_the_same_origin() {
    let db = TestDb::new("console_refused");
    let ids = seed_dead_letters(&db);
    let console = Console::new(&config(&db)).unwrap();
    const REPLAY: &[(&str, &str)] = &[("action", "replay"), ("id", "1"), ("expected", "1")];

    // A reader's session, with its own valid CSRF token: refused.
    let reader = Session::login(&console, READ, "rita");
    let r = console.handle(&reader.post("/dead-letters/apply", REPLAY));
    assert_eq!(r.status, 403, "{}", body(&r));
    assert!(body(&r).contains("needs the admin token"));

    let admin = Session::login(&console, ADMIN, "alice");
    // No CSRF token, a wrong one, another origin, a bearer token: refused.
    let mut no_csrf = admin.post("/dead-letters/apply", REPLAY);
    no_csrf.body = b"action=replay&id=1&expected=1".to_vec();
    assert_eq!(console.handle(&no_csrf).status, 403);
    let mut wrong = admin.post("/dead-letters/apply", &[]);
    wrong.body = b"csrf=0000&action=replay&id=1&expected=1".to_vec();
    assert_eq!(console.handle(&wrong).status, 403);
    let mut elsewhere = admin.post("/dead-letters/apply", REPLAY);
    elsewhere.headers.insert("origin".into(), "https://evil.example".into());
    let r = console.handle(&elsewhere);
    assert_eq!(r.status, 403);
    assert!(body(&r).contains("another origin"));
    let mut bearer = post("/controls/pause", &[]);
    bearer.headers.insert("authorization".into(), format!("Bearer {ADMIN}"));
    assert_eq!(console.handle(&bearer).status, 403);
    // A wrong login token: refused, and said so.
    let form = console.handle(&get("/login"));
    let mut req = post(
        "/login",
        &[
            ("csrf", &csrf_in(&body(&form))),
            ("name", "mallory"),
            ("token", "guess-guess-guess"),
        ],
    );
    req.headers.insert(
        "cookie".into(),
        header(&form, "set-cookie").unwrap().split(';').next().unwrap().into(),
    );
    let r = console.handle(&req);
    assert_eq!(r.status, 403);
    assert!(body(&r).contains("wrong token"));

    // Nothing changed, nothing audited.
    assert!(ids.iter().all(|id| status_of(&db, *id) == "FAIL"));
    assert!(audit(&db).is_empty(), "{:?}", audit(&db));
    assert!(outbox::control::state(&mut db.conn(), "t_event_record")
        .unwrap()
        .is_none());
}

/// Behind a proxy that serves the console over TLS, every cookie (the login form's, the
/// session's) is `Secure`; served plainly, none is (a browser would drop a
/// `Secure` cookie over HTTP, and nobody could log in).
#[test]
fn cookies_are_secure_when_a_proxy_serves_the_console_over_tls() {
    let db = TestDb::new("console_tls");
    let console = Console::new(&config(&db)).unwrap();
    let log_in = |proxy: &[(&str, &str)]| -> Vec<String> {
        let with = |mut r: Request| {
            for (k, v) in proxy {
                r.headers.insert(k.to_string(), v.to_string());
            }
            r
        };
        let form = console.handle(&with(get("/login")));
        let mut cookies = vec![header(&form, "set-cookie").unwrap().to_string()];
        let mut req = with(post(
            "/login",
            &[("csrf", &csrf_in(&body(&form))), ("name", "tia"), ("token", READ)],
        ));
        req.headers
            .insert("cookie".into(), cookies[0].split(';').next().unwrap().into());
        let r = console.handle(&req);
        assert_eq!(r.status, 303, "{}", body(&r));
        cookies.push(header(&r, "set-cookie").unwrap().to_string());
        cookies
    };
    for proxy in [
        &[("x-forwarded-proto", "https")][..],
        &[("forwarded", "for=192.0.2.60;proto=https;by=203.0.113.43")][..],
    ] {
        let cookies = log_in(proxy);
        assert!(
            cookies.iter().all(|c| c.ends_with("; Secure")),
            "{proxy:?}: {cookies:?}"
        );
    }
    for proxy in [&[][..], &[("x-forwarded-proto", "http")][..]] {
        let cookies = log_in(proxy);
        assert!(cookies.iter().all(|c| !c.contains("Secure")), "{proxy:?}: {cookies:?}");
    }
}

/// A dead letter's own page offers replay and discard to an admin (through the same preview and
/// confirmation as the dead-letter list), a reader only the hint; a sent event neither.
#[test]
fn a_dead_letter_is_replayed_from_its_own_page() {
    let db = TestDb::new("console_evact");
    seed_dead_letters(&db);
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    let page = body(&console.handle(&reader.get("/events/2")));
    assert!(
        !page.contains("/dead-letters/preview") && page.contains("to replay or discard this event"),
        "{page}"
    );
    let admin = Session::login(&console, ADMIN, "alice");
    let page = body(&console.handle(&admin.get("/events/2")));
    assert!(
        page.contains("action=\"/dead-letters/preview\"") && page.contains("name=\"id\" value=\"2\""),
        "{page}"
    );
    // Its business key links to every event of that key.
    let biz: String = db
        .conn()
        .query_first("SELECT biz_no FROM t_event_record WHERE id = 2")
        .unwrap()
        .unwrap();
    let link = format!("/events?biz_no={biz}");
    assert!(page.contains(&format!("href=\"{link}\"")), "{page}");
    let listed = body(&console.handle(&admin.get(&link)));
    assert!(listed.contains("href=\"/events/2\""), "{listed}");
    // The form's fields, as the browser sends them for "Replay this event".
    let r = console.handle(&admin.post("/dead-letters/preview", &[("id", "2"), ("action", "replay")]));
    assert!(body(&r).contains("name=\"expected\" value=\"1\""), "{}", body(&r));
    let r = console.handle(&admin.post(
        "/dead-letters/apply",
        &[("id", "2"), ("action", "replay"), ("expected", "1")],
    ));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!((status_of(&db, 1), status_of(&db, 2)), ("FAIL".into(), "WAIT".into()));
    // A row that is not a dead letter offers neither.
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SUCCESS' WHERE id = 4")
        .unwrap();
    let page = body(&console.handle(&admin.get("/events/4")));
    assert!(!page.contains("/dead-letters/preview"), "{page}");
}

/// Dead letters grouped by the start of their error, their topic and their type, largest first,
/// each count linking to the list filtered to its group; the error text escaped.
#[test]
fn dead_letters_are_grouped_by_error_topic_and_type_with_links_to_each_group() {
    let db = TestDb::new("console_dlgroups");
    db.seed(12);
    let mut c = db.conn();
    // 6 timeouts of ORDER_PAID (their errors differ after the first 80 characters), 3 refusals
    // of ORDER_PAID on topic T2, 2 refusals of REFUND, 1 row still WAIT.
    let long = "x".repeat(90);
    c.exec_drop(
        "UPDATE t_event_record SET status = 'FAIL', event_type = 'ORDER_PAID', \
         last_error = CONCAT('send timed out ', ?, id) WHERE id <= 6",
        (&long,),
    )
    .unwrap();
    c.exec_drop(
        "UPDATE t_event_record SET status = 'FAIL', event_type = 'ORDER_PAID', topic = 'T2', last_error = ? \
         WHERE id BETWEEN 7 AND 9",
        (format!("refused {XSS}"),),
    )
    .unwrap();
    c.query_drop(
        "UPDATE t_event_record SET status = 'FAIL', event_type = 'REFUND', last_error = 'refused' WHERE id IN (10, 11)",
    )
    .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    assert!(body(&console.handle(&reader.get("/dead-letters"))).contains("href=\"/dead-letters/groups\""));
    let page = body(&console.handle(&reader.get("/dead-letters/groups")));
    assert!(
        page.contains("11 dead letters") && !page.contains("<script>alert"),
        "{page}"
    );
    let counts: Vec<u64> = page
        .split("<tr>")
        .skip(2)
        .filter_map(|row| row.split("\">").nth(1)?.split('<').next()?.parse().ok())
        .collect();
    assert_eq!(counts, [6, 3, 2], "{page}");
    // The largest group's link lists its six rows.
    let at = page.find("href=\"/dead-letters?").unwrap() + "href=\"".len();
    let link = page[at..].split('"').next().unwrap().replace("&amp;", "&");
    let listed = body(&console.handle(&reader.get(&link)));
    let ids: Vec<u64> = (1..=12)
        .filter(|i| listed.contains(&format!("href=\"/events/{i}\"")))
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "{link}");
    // Fewer looked at than there are: said, with a link to look at more; a bad bound is a 400.
    let few = body(&console.handle(&reader.get("/dead-letters/groups?examine=5")));
    assert!(
        few.contains("Among the first 5 dead letters") && few.contains("href=\"/dead-letters/groups?examine=50\""),
        "{few}"
    );
    let bad = console.handle(&reader.get("/dead-letters/groups?examine=0"));
    assert_eq!(bad.status, 400);
    assert!(body(&bad).contains("examine"), "{}", body(&bad));
}

#[test]
fn replay_and_discard_change_the_rows_previewed_and_are_audited_with_the_name() {
    let db = TestDb::new("console_act");
    seed_dead_letters(&db);
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");

    // The admin's page offers the actions.
    let page = body(&console.handle(&admin.get("/dead-letters")));
    assert!(page.contains("/dead-letters/preview"), "{page}");

    // Preview: says how many, changes nothing.
    let r = console.handle(&admin.post(
        "/dead-letters/preview",
        &[("action", "replay"), ("id", "1"), ("id", "2")],
    ));
    let html = body(&r);
    assert_eq!(r.status, 200, "{html}");
    assert!(html.contains("name=\"expected\" value=\"2\""), "{html}");
    assert_eq!(status_of(&db, 1), "FAIL");

    // Apply with a count that no longer holds: nothing done.
    let r = console.handle(&admin.post(
        "/dead-letters/apply",
        &[("action", "replay"), ("id", "1"), ("id", "2"), ("expected", "7")],
    ));
    assert!(body(&r).contains("changed"), "{}", body(&r));
    assert_eq!(status_of(&db, 1), "FAIL");

    // Apply: rows 1 and 2 back to WAIT with their retries reset, row 3 untouched.
    let r = console.handle(&admin.post(
        "/dead-letters/apply",
        &[("action", "replay"), ("id", "1"), ("id", "2"), ("expected", "2")],
    ));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!(
        (status_of(&db, 1), status_of(&db, 2), status_of(&db, 3)),
        ("WAIT".into(), "WAIT".into(), "FAIL".into())
    );
    let retries: u32 = db
        .conn()
        .query_first("SELECT retry_count FROM t_event_record WHERE id = 1")
        .unwrap()
        .unwrap();
    assert_eq!(retries, 0);

    // Discard every dead letter matching a filter: only row 3 is left FAIL.
    let r = console.handle(&admin.post(
        "/dead-letters/apply",
        &[
            ("action", "discard"),
            ("scope", "matching"),
            ("error", "broker said"),
            ("expected", "1"),
        ],
    ));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!(status_of(&db, 3), "DISCARDED");

    // Each row changed, and each action, audited with the name given at login.
    let audit = audit(&db);
    let per_row: Vec<u64> = audit.iter().filter(|a| a.2 != 0).map(|a| a.2).collect();
    assert_eq!(per_row, vec![1, 2, 3], "{audit:?}");
    assert!(audit.iter().all(|a| a.1.starts_with("alice")), "{audit:?}");
    let summaries: Vec<&str> = audit.iter().filter(|a| a.2 == 0).map(|a| a.0.as_str()).collect();
    assert_eq!(summaries, vec!["console replay", "console discard"], "{audit:?}");
    // And the audit page shows them, escaped.
    let page = body(&console.handle(&admin.get("/audit")));
    assert!(page.contains("console discard") && page.contains("alice"), "{page}");
}

#[test]
fn pause_and_resume_from_the_console_reach_every_relay_and_are_audited() {
    let db = TestDb::new("console_pause");
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");
    let r = console.handle(&admin.post("/controls/pause", &[("reason", "broker <upgrade>")]));
    assert_eq!(r.status, 200, "{}", body(&r));
    let state = outbox::control::state(&mut db.conn(), "t_event_record")
        .unwrap()
        .unwrap()
        .to_string();
    assert!(state.contains("alice") && state.contains("broker <upgrade>"), "{state}");
    let page = body(&console.handle(&admin.get("/controls")));
    assert!(
        page.contains("broker &lt;upgrade&gt;") && page.contains("/controls/resume"),
        "{page}"
    );
    let overview = body(&console.handle(&admin.get("/")));
    assert!(overview.contains("paused"), "{overview}");
    let r = console.handle(&admin.post("/controls/resume", &[]));
    assert_eq!(r.status, 200);
    assert!(outbox::control::state(&mut db.conn(), "t_event_record")
        .unwrap()
        .is_none());
    let actions: Vec<String> = audit(&db).into_iter().map(|a| a.0).collect();
    assert_eq!(actions, vec!["pause", "resume"]);
}

#[test]
fn a_consumer_group_s_dead_letters_replay_and_discard_from_the_console() {
    let db = TestDb::new("console_consumer");
    let mut conn = db.conn();
    for (i, key) in ["k-1", "k-2", "k-3"].iter().enumerate() {
        conn.exec_drop(
            "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, body, attempts, last_error) \
             VALUES ('points', ?, 'orders', ?, 3, ?)",
            (key, XSS, format!("handler failed {i} {XSS}")),
        )
        .unwrap();
    }
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");
    let list = body(&console.handle(&admin.get("/consumers")));
    assert!(list.contains("/consumers/points"), "{list}");
    let group = body(&console.handle(&admin.get("/consumers/points")));
    assert!(!group.contains("<script>alert") && group.contains("handler failed 0 &lt;script&gt;"));
    let id_of = |key: &str| -> u64 {
        db.conn()
            .exec_first("SELECT id FROM outbox_inbox_dead_letter WHERE event_key = ?", (key,))
            .unwrap()
            .unwrap()
    };
    let first = id_of("k-1").to_string();

    let r = console.handle(&admin.post("/consumers/points/preview", &[("action", "replay"), ("id", &first)]));
    assert!(body(&r).contains("name=\"expected\" value=\"1\""), "{}", body(&r));
    let r = console.handle(&admin.post(
        "/consumers/points/apply",
        &[("action", "replay"), ("id", &first), ("expected", "1")],
    ));
    assert_eq!(r.status, 200, "{}", body(&r));
    let statuses: Vec<(String, String)> = db
        .conn()
        .query("SELECT event_key, status FROM outbox_inbox_dead_letter ORDER BY event_key")
        .unwrap();
    assert_eq!(
        statuses,
        vec![
            ("k-1".into(), "REPLAY".into()),
            ("k-2".into(), "DEAD".into()),
            ("k-3".into(), "DEAD".into())
        ]
    );
    let r = console.handle(&admin.post(
        "/consumers/points/apply",
        &[("action", "discard"), ("scope", "all"), ("expected", "3")],
    ));
    assert_eq!(r.status, 200, "{}", body(&r));
    // A discard takes the group's rows still DEAD or asked to REPLAY: all three.
    let left: Vec<String> = db
        .conn()
        .query("SELECT event_key FROM outbox_inbox_dead_letter ORDER BY event_key")
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    let audit = audit(&db);
    assert!(
        audit
            .iter()
            .any(|a| a.0 == "console discard" && a.1.starts_with("alice")),
        "{audit:?}"
    );
}

/// A group's dead letters page newest first, 100 a page, with their total: the newest are on
/// the first page, "Older" walks down to the oldest, a status keeps to its rows, and a bad
/// `before` is a 400 naming it.
#[test]
fn a_consumer_group_s_dead_letters_page_newest_first_down_to_the_oldest() {
    let db = TestDb::new("console_dlpages");
    db.conn()
        .query_drop(
            "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, body, attempts, last_error, status) \
             SELECT 'points', CONCAT('k-', seq), 'orders', 'x', 3, 'failed', IF(seq % 10 = 0, 'REPLAY', 'DEAD') \
             FROM seq_1_to_250",
        )
        .unwrap();
    // Another group's rows are not on this group's pages.
    db.conn()
        .query_drop(
            "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, body, attempts, last_error) \
             VALUES ('billing', 'b-1', 'orders', 'x', 3, 'failed')",
        )
        .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    let ids_on = |page: &str| -> Vec<u64> {
        page.split("<tr>")
            .skip(2)
            .filter_map(|row| row.split("<td>").nth(1)?.split('<').next()?.parse().ok())
            .collect()
    };
    let older_link = |page: &str| -> Option<String> {
        let at = page.find("class=\"next\" href=\"")? + "class=\"next\" href=\"".len();
        Some(page[at..].split('"').next()?.replace("&amp;", "&"))
    };
    let mut url = "/consumers/points".to_string();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let r = console.handle(&reader.get(&url));
        assert_eq!(r.status, 200, "{url}: {}", body(&r));
        let page = body(&r);
        assert!(page.contains("250 dead letters"), "{page}");
        seen.extend(ids_on(&page));
        pages += 1;
        match older_link(&page) {
            Some(next) => url = next,
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        (1..=250).rev().collect::<Vec<u64>>(),
        "every id once, newest first"
    );
    let replay = body(&console.handle(&reader.get("/consumers/points?status=REPLAY&limit=10")));
    assert!(replay.contains("25 dead letters"), "{replay}");
    assert_eq!(ids_on(&replay), (16..=25).rev().map(|i| i * 10).collect::<Vec<u64>>());
    let bad = console.handle(&reader.get("/consumers/points?before=abc"));
    assert_eq!(bad.status, 400);
    assert!(body(&bad).contains("before"), "{}", body(&bad));
}

#[test]
fn a_filter_on_more_than_the_status_pages_through_the_status_range_a_window_at_a_time() {
    let db = TestDb::new("console_window");
    db.seed(1_100);
    let mut conn = db.conn();
    // 1 100 dead letters, due one second apart; only the one due first is of the rare type.
    conn.query_drop("UPDATE t_event_record SET status = 'FAIL', next_retry_time = '2026-01-01' + INTERVAL id SECOND")
        .unwrap();
    conn.query_drop("UPDATE t_event_record SET event_type = 'RARE' WHERE id = 1")
        .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    let first = body(&console.handle(&reader.get("/events?status=FAIL&event_type=RARE")));
    assert!(
        first.contains(&format!("Searched {} FAIL rows", thousands(1000))),
        "{first}"
    );
    assert!(
        !first.contains("/events/1\""),
        "the oldest-due row is beyond the first window"
    );
    let at = first.find("class=\"next\" href=\"").expect("an Older link") + 19;
    let next = first[at..].split('"').next().unwrap().replace("&amp;", "&");
    let second = body(&console.handle(&reader.get(&next)));
    assert!(second.contains("href=\"/events/1\""), "{second}");
    assert!(!second.contains("class=\"next\""), "the range ends here: {second}");
}

#[test]
fn a_replay_of_more_rows_than_the_preview_counts_takes_every_matching_row() {
    let db = TestDb::new("console_many");
    db.seed(1_100);
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'FAIL', last_error = 'no route to broker-b'")
        .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");
    let form = [("action", "replay"), ("scope", "matching"), ("error", "no route")];
    let preview = body(&console.handle(&admin.post("/dead-letters/preview", &form)));
    assert!(preview.contains("maybe more among the older ones"), "{preview}");
    assert!(preview.contains("name=\"expected\" value=\"1000+\""), "{preview}");
    // A count other than the one shown is not confirmed; one this console never writes is a 400.
    let mut other = form.to_vec();
    other.push(("expected", "1100"));
    let r = body(&console.handle(&admin.post("/dead-letters/apply", &other)));
    assert!(r.contains("confirm again"), "{r}");
    assert_eq!(db.count("FAIL"), 1_100);
    let mut forged = form.to_vec();
    forged.push(("expected", "lots"));
    assert_eq!(console.handle(&admin.post("/dead-letters/apply", &forged)).status, 400);
    let mut confirmed = form.to_vec();
    confirmed.push(("expected", "1000+"));
    let r = console.handle(&admin.post("/dead-letters/apply", &confirmed));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!(db.count("FAIL"), 0);
    assert_eq!(db.count("WAIT"), 1_100);
    let audited: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_audit WHERE action = 'replay' AND actor LIKE 'alice%'")
        .unwrap()
        .unwrap();
    assert_eq!(audited, 1_100);
}

#[test]
fn the_overview_shows_each_broker_and_the_rows_parked_waiting_for_it() {
    let db = TestDb::new("console_brokers");
    db.seed(3);
    let mut conn = db.conn();
    conn.query_drop(
        "INSERT INTO outbox_topic_queue (topic, broker_name, queue_id) VALUES \
         ('orders', 'broker-a', 0), ('orders', 'broker-a', 1), ('orders', 'broker-b', 0), ('orders', 'broker-b', 1)",
    )
    .unwrap();
    conn.query_drop(
        "UPDATE t_event_record SET next_retry_time = NOW(3) + INTERVAL 1 MINUTE, \
         last_error = 'parked: broker broker-b unreachable: connection refused' WHERE id <= 2",
    )
    .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let reader = Session::login(&console, READ, "rita");
    let page = body(&console.handle(&reader.get("/partials/overview")));
    assert!(page.contains("<h2>Brokers</h2>"), "{page}");
    let row_of = |broker: &str| -> String {
        let at = page
            .find(&format!("<td>{broker}</td>"))
            .unwrap_or_else(|| panic!("{broker}: {page}"));
        page[at..].split("</tr>").next().unwrap().to_string()
    };
    assert!(
        row_of("broker-b").contains("<strong>2</strong>"),
        "{}",
        row_of("broker-b")
    );
    assert!(row_of("broker-a").contains("0: up"), "{}", row_of("broker-a"));
    let mut bearer = get("/api/overview.json");
    bearer.headers.insert("authorization".into(), format!("Bearer {READ}"));
    let json: serde_json::Value = serde_json::from_slice(&console.handle(&bearer).body).unwrap();
    assert_eq!(
        json["brokers"][1],
        serde_json::json!({"broker": "broker-b", "queues": 2, "parked": 2})
    );
}

#[test]
fn a_waiting_event_is_cancelled_from_its_page_by_the_admin_audited_and_counted_as_scheduled_before() {
    let db = TestDb::new("console_cancel");
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let later = outbox::NewEvent::new("ORD-<9>", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_secs(3600));
    let id = outbox::enqueue_in_tx(&mut tx, &later).unwrap();
    tx.commit().unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");
    let overview = body(&console.handle(&admin.get("/")));
    assert!(overview.contains("WAIT, scheduled"), "{overview}");
    let page = body(&console.handle(&admin.get(&format!("/events/{id}"))));
    assert!(page.contains(&format!("action=\"/events/{id}/cancel\"")), "{page}");
    assert!(page.contains("ORD-&lt;9&gt;"), "{page}");
    // A reader sees no form; a post without the CSRF token is refused and changes nothing.
    let reader = Session::login(&console, READ, "bob");
    let page = body(&console.handle(&reader.get(&format!("/events/{id}"))));
    assert!(!page.contains("/cancel\""), "{page}");
    let mut forged = admin.post(&format!("/events/{id}/cancel"), &[]);
    forged.body = Vec::new();
    assert_eq!(console.handle(&forged).status, 403);
    assert_eq!(db.rows().len(), 1);
    let r = console.handle(&admin.post(&format!("/events/{id}/cancel"), &[]));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert!(body(&r).contains("cancelled before it was sent"), "{}", body(&r));
    assert!(db.rows().is_empty());
    let a = audit(&db);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].0.as_str(), a[0].2), ("cancel", id));
    assert!(a[0].1.contains("alice"), "{a:?}");
    // Again: nothing left to cancel, and it says so.
    let r = console.handle(&admin.post(&format!("/events/{id}/cancel"), &[]));
    assert!(body(&r).contains("not cancelled: already cancelled"), "{}", body(&r));
}

#[test]
fn sent_events_are_counted_then_re_emitted_by_the_admin_from_the_console_and_the_job_is_audited() {
    let db = TestDb::new("console_reemit");
    let events: Vec<outbox::NewEvent> = (0..30)
        .map(|i| outbox::NewEvent::new(format!("ORD-<{i}>"), if i % 3 == 0 { "PAID" } else { "CREATED" }, "x"))
        .collect();
    db.enqueue(&events);
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SUCCESS', event_key = UUID()")
        .unwrap();
    let console = Console::new(&config(&db)).unwrap();
    let admin = Session::login(&console, ADMIN, "alice");
    let page = body(&console.handle(&admin.get("/re-emit?count=1&event_type=PAID")));
    assert!(page.contains("10 sent events match (type PAID"), "{page}");
    assert!(page.contains("action=\"/re-emit/start\""), "{page}");
    // The filter comes back into the form escaped.
    let page = body(&console.handle(&admin.get(&format!("/re-emit?count=1&biz_no={}", urlencode(XSS)))));
    assert!(!page.contains(XSS) && page.contains("&lt;script&gt;"), "{page}");
    // A reader counts but cannot start; a bad time is a 400 naming it.
    let reader = Session::login(&console, READ, "bob");
    let page = body(&console.handle(&reader.get("/re-emit?count=1&event_type=PAID")));
    assert!(
        page.contains("10 sent events match") && !page.contains("/re-emit/start"),
        "{page}"
    );
    let r = console.handle(&admin.get("/re-emit?count=1&since=yesterday"));
    assert_eq!(r.status, 400);
    assert!(body(&r).contains("parameter since"), "{}", body(&r));
    // Without the CSRF token: refused, nothing created.
    let mut forged = admin.post("/re-emit/start", &[("event_type", "PAID")]);
    forged.body = b"event_type=PAID".to_vec();
    assert_eq!(console.handle(&forged).status, 403);
    let jobs = || -> u64 {
        db.conn()
            .query_first("SELECT COUNT(*) FROM outbox_reemit")
            .unwrap()
            .unwrap()
    };
    assert_eq!(jobs(), 0);
    let r = console.handle(&admin.post("/re-emit/start", &[("event_type", "PAID"), ("rate", "0")]));
    assert_eq!(r.status, 400, "{}", body(&r));
    assert_eq!(jobs(), 0);
    let r = console.handle(&admin.post("/re-emit/start", &[("event_type", "PAID"), ("rate", "500")]));
    assert_eq!(r.status, 200, "{}", body(&r));
    assert!(
        body(&r).contains("Re-emit job 1 started: 10 events at 500/s"),
        "{}",
        body(&r)
    );
    // The job runs in the console's process to its end.
    assert!(crate::support::wait_until(Duration::from_secs(30), || {
        outbox::reemit::job(&db.pool, 1).unwrap().unwrap().state == outbox::reemit::JobState::Done
    }));
    let copies: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT' AND event_type = 'PAID' AND headers LIKE '%reemitOf%'")
        .unwrap()
        .unwrap();
    assert_eq!(copies, 10);
    let page = body(&console.handle(&admin.get("/re-emit")));
    assert!(page.contains("10 of 10") && page.contains("DONE"), "{page}");
    let actions: Vec<(String, String)> = audit(&db).into_iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(actions.len(), 3, "{actions:?}");
    assert_eq!(actions[0].0, "reemit");
    assert!(actions[0].1.contains("alice"), "{actions:?}");
    assert_eq!(
        (actions[1].0.as_str(), actions[2].0.as_str()),
        ("reemit-run", "reemit-done")
    );
    // Resuming a job that is done is refused, naming it.
    let r = console.handle(&admin.post("/re-emit/1/resume", &[]));
    assert_eq!(r.status, 400);
    assert!(body(&r).contains("1 is done"), "{}", body(&r));
}
