//! A TCP proxy in front of MariaDB that stalls or drops connections on demand: fault injection
//! for one shard of a fleet (the fleet tests and `--bench fleet -- --isolation`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwards both ways.
    Pass = 0,
    /// Accepts and reads, forwards nothing until the mode changes: statements hang.
    Stall = 1,
    /// Closes every connection, and each new one as soon as it is accepted.
    Drop = 2,
}

pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (m, o, upstream) = (mode.clone(), open.clone(), upstream.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if m.load(SeqCst) == Mode::Drop as u8 {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let mut open = o.lock().unwrap();
                open.retain(|s| s.peer_addr().is_ok());
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                drop(open);
                pump(client.try_clone().unwrap(), server.try_clone().unwrap(), m.clone());
                pump(server, client, m.clone());
            }
        });
        Proxy { port, mode, open }
    }

    /// The URL of database `db` through the proxy.
    pub fn url(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, SeqCst);
        if mode == Mode::Drop {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Copies `from` to `to` on a thread of its own, holding what it read while the mode is Stall.
fn pump(mut from: TcpStream, mut to: TcpStream, mode: Arc<AtomicU8>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            while mode.load(SeqCst) == Mode::Stall as u8 {
                std::thread::sleep(Duration::from_millis(10));
            }
            if mode.load(SeqCst) == Mode::Drop as u8 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
