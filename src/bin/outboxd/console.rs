//! Serves the operator console (`console.enabled`) on `console.listen` with `tiny_http`: a few
//! threads taking requests, each turned into an `outbox::console::Request` and answered by the
//! console; a thread samples the relay's counters every second for the overview.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use outbox::console::{Console, Request};

/// Threads answering requests: a slow page does not hold the others.
const THREADS: usize = 4;
/// Largest request body read (forms are small).
const MAX_BODY: u64 = 1 << 20;

pub fn serve(addr: &str, console: Arc<Console>) -> std::io::Result<()> {
    let server = Arc::new(
        tiny_http::Server::http(addr).map_err(|e| std::io::Error::other(format!("console.listen = {addr}: {e}")))?,
    );
    for i in 0..THREADS {
        let (server, console) = (server.clone(), console.clone());
        std::thread::Builder::new()
            .name(format!("outbox-console-{i}"))
            .spawn(move || {
                while let Ok(mut req) = server.recv() {
                    let request = to_request(&mut req);
                    let response = console.handle(&request);
                    let mut out = tiny_http::Response::from_data(response.body).with_status_code(response.status);
                    for (k, v) in &response.headers {
                        if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
                            out = out.with_header(h);
                        }
                    }
                    let _ = req.respond(out);
                }
            })?;
    }
    std::thread::Builder::new()
        .name("outbox-console-sample".into())
        .spawn(move || loop {
            console.sample();
            std::thread::sleep(Duration::from_secs(1));
        })?;
    log::info!("console on http://{addr}/");
    Ok(())
}

fn to_request(req: &mut tiny_http::Request) -> Request {
    let mut r = Request {
        method: req.method().as_str().to_string(),
        url: req.url().to_string(),
        remote: req.remote_addr().map(|a| a.to_string()).unwrap_or_default(),
        ..Request::default()
    };
    for h in req.headers() {
        r.headers.insert(
            h.field.as_str().as_str().to_ascii_lowercase(),
            h.value.as_str().to_string(),
        );
    }
    let _ = req.as_reader().take(MAX_BODY).read_to_end(&mut r.body);
    r
}
