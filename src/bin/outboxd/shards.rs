//! `outboxd` over a fleet (`shards`, docs/fleet.md): `run` relays every shard with one publisher
//! and re-reads `shards` on SIGHUP; `migrate` and `status` go over every shard; any other command
//! acts on the shard `--shard` names.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use outbox::config::ShardSpec;
use outbox::fleet::fleet_shards;
use outbox::{admin, Config, Fleet};

use crate::signals::Signal;
use crate::{metrics, telemetry, RunFailure};

/// The configuration a command acts on: the shard `name` (`Some`), or, without a name, the
/// whole fleet for `run`, `migrate` and `status` (`None`). Any other command needs a name.
pub fn pick(config: &Config, name: Option<&str>, fleet_wide: bool) -> Result<Option<Config>, String> {
    if name.is_none() && fleet_wide {
        return Ok(None);
    }
    let specs = fleet_shards(config).map_err(|e| e.to_string())?;
    let names = || {
        let mut n: Vec<&str> = specs.iter().take(8).map(|s| s.name.as_str()).collect();
        if specs.len() > 8 {
            n.push("...");
        }
        n.join(", ")
    };
    match name {
        Some(name) => match specs.iter().find(|s| s.name == name) {
            Some(spec) => Ok(Some(config.for_shard(spec))),
            None => Err(format!("--shard {name:?} is not one of the shards ({})", names())),
        },
        None if fleet_wide => Ok(None),
        None => Err(format!(
            "shards is set: name the shard this command acts on with --shard NAME ({})",
            names()
        )),
    }
}

/// `outboxd run` over the fleet, until a stop signal; SIGHUP re-reads `shards`.
pub fn run(
    config: Config,
    drain: Duration,
    signals: Receiver<Signal>,
    reload: crate::Reload,
) -> Result<(), RunFailure> {
    if config.console.enabled {
        return Err(RunFailure::Startup(
            "console.enabled is not available with shards yet: serve a shard's console with \
             `outboxd --shard NAME run` in a process of its own, or turn it off"
                .into(),
        ));
    }
    // The catalog, when it cannot be read, is said by the fleet itself as it starts.
    let specs = fleet_shards(&config).or_else(|_| config.shard_specs().map_err(outbox::Error::from))?;
    log::info!(
        "outboxd {} over {} shards (table {} unless a shard names its own; publisher {})",
        outbox::VERSION,
        specs.len(),
        config.table,
        config.get("publisher").unwrap_or_default()
    );
    let Some(publisher) = outbox::publisher_for(&config)? else {
        return Err(RunFailure::Startup(
            "shards need a publisher: set publisher (rocketmq) to relay them".into(),
        ));
    };
    let _spans = telemetry::export(&config)?;
    let latency = metrics::Latency::new();
    let target = metrics::Target::new();
    if let Some(addr) = &config.metrics_listen {
        metrics::serve(addr, target.clone(), latency.clone())
            .map_err(|e| RunFailure::Startup(format!("cannot serve the metrics: {e}")))?;
    }
    let l2 = latency.clone();
    let fleet = Arc::new(
        Fleet::builder(config.clone(), publisher)
            .dead_letter_hook(|shard, d| {
                log::error!(
                    "dead letter: shard {shard} event {} biz_no {} type {}: {}",
                    d.id,
                    d.biz_no,
                    d.event_type,
                    d.last_error
                )
            })
            .latency_hook(move |_, d| l2.observe(d.to_success, d.held, d.trace_id))
            .start()?,
    );
    target.set_fleet(fleet.clone());
    // Until a stop signal (or the signal thread's end).
    while let Ok(Signal::Reload) = signals.recv() {
        reload_shards(&fleet, reload, drain);
    }
    let reports = fleet.stop(drain);
    let released: u64 = reports.iter().map(|(_, r)| r.released).sum();
    let late: Vec<&str> = reports
        .iter()
        .filter(|(_, r)| r.timed_out)
        .map(|(n, _)| n.as_str())
        .collect();
    log::info!(
        "stopped {} shards; released {released} on shutdown{}",
        reports.len(),
        if late.is_empty() {
            String::new()
        } else {
            format!("; still sending at the deadline: {}", late.join(", "))
        }
    );
    Ok(())
}

/// SIGHUP: the configuration read again; the fleet made to serve its `shards`. A configuration
/// with errors changes nothing (each error logged).
fn reload_shards(fleet: &Fleet, reload: crate::Reload, drain: Duration) {
    let config = match reload() {
        Ok(c) => c,
        Err(problems) => {
            for p in &problems {
                log::error!("SIGHUP: configuration error, shards unchanged: {p}");
            }
            return;
        }
    };
    let specs = match fleet_shards(&config) {
        Ok(s) if !s.is_empty() || config.shard_catalog_url.is_some() => s,
        Ok(_) => {
            log::error!("SIGHUP: shards is no longer set; a fleet keeps its shards (stop it to serve db.url)");
            return;
        }
        Err(e) => {
            log::error!("SIGHUP: shards unchanged: {e}");
            return;
        }
    };
    match fleet.reload(specs, drain) {
        Ok(c) => log::info!(
            "SIGHUP: shards re-read: {} added, {} removed, {} replaced; serving {}",
            c.added.len(),
            c.removed.len(),
            c.replaced.len(),
            fleet.shards().len()
        ),
        Err(e) => log::error!("SIGHUP: {e}"),
    }
}

/// `outboxd migrate` over every shard, one after the other: a shard that fails is reported and
/// the others still migrated; the command fails if any did. Running it again resumes (each
/// shard's applied migrations are recorded in its own database).
pub fn migrate(config: &Config, dry_run: bool, consumer: bool) -> FleetResult {
    let specs = fleet_shards(config).map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        println!("== shard {} ({}/{})", spec.name, i + 1, specs.len());
        if let Err(e) = crate::migrate(&config.for_shard(spec), dry_run, consumer) {
            println!("shard {}: FAILED: {e}", spec.name);
            failed.push(spec.name.clone());
        }
    }
    summary("migrated", &specs, &failed)
}

/// What a command over the fleet ends with: `Err` names the shards that failed.
pub type FleetResult = Result<(), String>;

fn summary(verb: &str, specs: &[ShardSpec], failed: &[String]) -> FleetResult {
    if failed.is_empty() {
        println!("{verb} {} shards", specs.len());
        return Ok(());
    }
    Err(format!(
        "{} of {} shards failed: {} (the others are {verb}; run again to resume)",
        failed.len(),
        specs.len(),
        failed.join(", ")
    ))
}

/// `outboxd status` over every shard: a line per shard (its backlog by status, the oldest due
/// WAIT, dead letters of the last day), or why it could not be read; `--json`, an array.
pub fn status(config: &Config, json: bool) -> FleetResult {
    let specs = fleet_shards(config).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut failed = Vec::new();
    // With shard.coordination.url: which relay holds each shard (a database that cannot be read
    // is said, the shards still listed).
    let holders = match Fleet::holders(config, &specs) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cannot read who relays which shard: {e}");
            None
        }
    };
    let holder = |name: &str| -> Option<String> {
        let h = holders.as_ref()?;
        Some(h.get(name).cloned().unwrap_or_else(|| "(nobody)".into()))
    };
    if !json {
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>14} {:>10}{}",
            "shard",
            "WAIT",
            "SENDING",
            "FAIL",
            "oldest due",
            "dead/day",
            if holders.is_some() { "  relayed by" } else { "" }
        );
    }
    for spec in &specs {
        let c = config.for_shard(spec);
        let status = outbox::connect(&c).and_then(|pool| admin::status(&pool, &c.table));
        match status {
            Ok(s) => {
                let count = |st: &str| s.counts.get(st).copied().unwrap_or(0);
                if json {
                    let mut v: serde_json::Value =
                        serde_json::from_str(&s.to_json()).expect("status JSON is an object");
                    v["shard"] = spec.name.clone().into();
                    if let Some(h) = holder(&spec.name) {
                        v["relayed_by"] = h.into();
                    }
                    out.push(v);
                } else {
                    println!(
                        "{:<24} {:>10} {:>10} {:>10} {:>14} {:>10}{}",
                        spec.name,
                        count("WAIT"),
                        count("SENDING"),
                        count("FAIL"),
                        s.oldest_wait_age
                            .map_or("none due".into(), |a| format!("{:.1} s", a.as_secs_f64())),
                        s.dead_last_day,
                        holder(&spec.name).map_or(String::new(), |h| format!("  {h}"))
                    );
                }
            }
            Err(e) => {
                if json {
                    out.push(serde_json::json!({"shard": spec.name, "error": e.to_string()}));
                } else {
                    println!("{:<24} cannot read: {e}", spec.name);
                }
                failed.push(spec.name.clone());
            }
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(out));
    }
    summary("read", &specs, &failed)
}
