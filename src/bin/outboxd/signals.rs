//! The signals `outboxd` answers: SIGINT and SIGTERM stop what runs (a relay drains, a re-emit
//! ends after its batch); a second one exits at once. SIGHUP re-reads the configuration file
//! (`outboxd run`: the `shards` of a fleet).

use crossbeam_channel::{unbounded, Receiver};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT or SIGTERM, the first time.
    Stop,
    /// SIGHUP.
    Reload,
}

/// Starts listening; each signal arrives on the receiver. A second stop signal exits with 130.
pub fn listen() -> Result<Receiver<Signal>, String> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("cannot install the signal handlers: {e}"))?;
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name("outboxd-signals".into())
        .spawn(move || {
            let mut stops = 0;
            for sig in signals.forever() {
                if sig == SIGHUP {
                    let _ = tx.send(Signal::Reload);
                    continue;
                }
                stops += 1;
                if stops > 1 {
                    log::warn!("second signal: exiting now; rows still SENDING return when their lease expires");
                    std::process::exit(130);
                }
                log::info!("signal received: draining (a second signal exits at once)");
                let _ = tx.send(Signal::Stop);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(rx)
}
