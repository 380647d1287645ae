//! `outboxd`: the standalone relay daemon and its admin commands, on the `outbox` core.

mod console;
mod metrics;
mod reemit;
mod settings;
mod shards;
mod signals;
mod startup;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use outbox::admin::{self, BatchOptions, DeadLetterAction, DeadLetterFilter, TimeBound};
use outbox::{Config, Relay, KEYS};

/// Exit code for configuration errors.
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Transactional-outbox relay: MySQL/MariaDB to RocketMQ"
)]
struct Cli {
    /// TOML file with configuration keys (`scan.interval.ms = 200`, or nested tables).
    #[arg(long, short, global = true, env = "OUTBOX_CONFIG")]
    config: Option<PathBuf>,
    /// Set a key, overriding the file and the environment: `--set batch.size=200`. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    sets: Vec<String>,
    /// With `shards` set: the shard a command acts on, by name (`run`, `migrate` and `status`
    /// act on every shard without it).
    #[arg(long, global = true, value_name = "NAME")]
    shard: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay until SIGINT/SIGTERM, then drain and exit 0 (a second signal exits at once); with
    /// `shards`, every shard, re-reading them on SIGHUP.
    Run {
        /// How long to let sends in flight finish on shutdown.
        #[arg(long, default_value = "10s", value_parser = duration)]
        drain: Duration,
    },
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Apply the migrations to the configured table (idempotent).
    Migrate {
        /// Print the plan (pending migrations, their statements and lock cost) and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only the consumer's tables (the inbox and its dead letters), for a database that only
        /// consumes: none of the relay's.
        #[arg(long)]
        consumer: bool,
    },
    /// Counts by status, oldest due WAIT age, SENDING rows with owner and age, recent dead letters.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Dead letters: the relay's (rows in status FAIL) or, with --consumer-group, a consumer
    /// group's parked messages: list, replay, discard.
    ///
    /// Replay and discard run the same way on both tables: the selected rows are changed in
    /// batches of --batch rows per transaction (each locking its rows still in the expected
    /// state, so a row changed meanwhile is left alone), at most --rate rows per second, each
    /// row changed written to outbox_audit with --actor; --dry-run only counts.
    DeadLetters {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// Pause or resume claiming on the configured table, for every relay of it (through the
    /// database, not a lock): while paused, relays claim nothing new and finish what they hold;
    /// each change is audited in outbox_audit.
    Control {
        #[command(subcommand)]
        command: ControlCommand,
    },
    /// Events in time: cancel them before they leave, or re-emit sent ones by filter
    /// (docs/scheduling.md).
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// A consumer group's inbox: forget events it processed, so its consumers handle their next
    /// copy (a re-emit) as new.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
    /// Delete sent rows older than an age, in small batches, once.
    Purge {
        /// Age, e.g. 7d; defaults to retention.age.ms.
        #[arg(long, value_parser = duration)]
        older_than: Option<Duration>,
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (secrets redacted) with each value's source, or every
    /// error; exit 2 on any error.
    Check,
    /// Print every key with its default and meaning, as TOML (a documented outbox.toml).
    Example,
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Cancel events that have not left yet, by --id or by --biz-no (and --event-type), each
    /// audited in outbox_audit with --actor. A cancel racing a relay has one outcome per event,
    /// printed: cancelled, already sent, in flight (it will be sent), dead-lettered, already
    /// cancelled, or gone (sent and deleted, purged, or never committed). An id the table never
    /// issued is an error, and nothing changes.
    #[command(group(ArgGroup::new("which").required(true).args(["ids", "biz_no"])))]
    Cancel {
        /// The event's id (the outbox row's id, the message's eventId). Repeatable.
        #[arg(long = "id")]
        ids: Vec<u64>,
        /// Every pending event of this business key.
        #[arg(long, conflicts_with = "ids")]
        biz_no: Option<String>,
        /// With --biz-no: only events of this type.
        #[arg(long, requires = "biz_no")]
        event_type: Option<String>,
        /// Who is cancelling, written to outbox_audit; defaults to $USER@hostname.
        #[arg(long, value_parser = actor)]
        actor: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Send sent events again, selected by --event-type, --topic, --biz-no, --since and
    /// --until (the time written): first the count and how far back the table keeps sent events;
    /// with --yes a job (audited) copies them back into the table as new rows due now, at most
    /// --rate per second, each keeping its event key (a consumer's inbox takes it for the event
    /// it already handled) and carrying the properties reemitOf (the original's id) and
    /// reemitJob. A signal stops the job after the batch it is writing; --resume ID goes on from
    /// there, never copying an event twice. --stop ID stops a job running elsewhere.
    #[command(name = "re-emit")]
    Reemit(reemit::ReemitArgs),
    /// The table's re-emit jobs, newest first: state, progress, filter, rate.
    #[command(name = "re-emits")]
    Reemits {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum InboxCommand {
    /// Delete group --group's inbox marks of the sent events a filter (or re-emit job --job)
    /// selects, in the consumer's database (console.consumer.db.url, else db.url) and its
    /// inbox.table: the group's consumers then handle the next copy of each event (a re-emit) as
    /// new, while other groups still take it for a duplicate. Run it before the re-emit reaches
    /// the group. Audited in outbox_audit with --actor; --dry-run only counts.
    Forget(reemit::ForgetArgs),
}

#[derive(Subcommand)]
enum ControlCommand {
    /// Stop every relay of the table from claiming, within a second.
    Pause {
        /// Why, shown by status, the console and the relays' logs.
        #[arg(long)]
        reason: Option<String>,
        /// Who, written to outbox_audit; defaults to $USER@hostname.
        #[arg(long, value_parser = actor)]
        actor: Option<String>,
    },
    /// Let the table's relays claim again.
    Resume {
        #[arg(long, value_parser = actor)]
        actor: Option<String>,
    },
    /// Whether the table is paused, since when, by whom and why.
    Status,
}

#[derive(Args, Clone)]
struct Filter {
    /// Relay: the outbox row's id. With --consumer-group: the dead-letter row's id, as `list`
    /// shows it. Repeatable.
    #[arg(long = "id")]
    ids: Vec<u64>,
    /// Relay only: rows of this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Relay only: rows of this business key.
    #[arg(long)]
    biz_no: Option<String>,
    /// Relay only: dead-lettered since: 24h, 7d, or 2026-12-01 08:00:00.
    #[arg(long, value_parser = time_bound)]
    since: Option<TimeBound>,
    /// Relay only: dead-lettered before.
    #[arg(long, value_parser = time_bound)]
    until: Option<TimeBound>,
    /// A consumer group's dead letters (messages its handler kept failing on, in the consumer
    /// dead-letter table) instead of the relay's; select them with --id or --all.
    #[arg(long, value_parser = consumer_group, conflicts_with_all = ["event_type", "biz_no", "since", "until"])]
    consumer_group: Option<String>,
    /// The consumer dead-letter table (with --consumer-group).
    #[arg(long, value_parser = dead_letter_table, default_value = outbox::consumer::dead_letter::DEFAULT_TABLE)]
    dead_letter_table: String,
}

impl Filter {
    fn to_filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            ids: self.ids.clone(),
            event_type: self.event_type.clone(),
            biz_no: self.biz_no.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            topic: None,
            error_contains: None,
        }
    }
}

#[derive(Args)]
#[command(group(
    ArgGroup::new("target")
        .required(true)
        .multiple(true)
        .args(["ids", "event_type", "biz_no", "since", "until", "all"])
))]
struct BatchArgs {
    #[command(flatten)]
    filter: Filter,
    /// Count the rows that would change; change nothing and write no audit row.
    #[arg(long)]
    dry_run: bool,
    /// Rows per transaction (at least 1), on either table: each batch locks its rows still in
    /// the expected state, changes them, writes their audit rows and commits.
    #[arg(long, default_value_t = 100, value_parser = batch_size)]
    batch: usize,
    /// Most rows per second, on either table (0 = no limit).
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Who is acting, written to outbox_audit with each row changed (either table); defaults to
    /// $USER@hostname.
    #[arg(long, value_parser = actor)]
    actor: Option<String>,
    /// Act on every dead letter (of the group, with --consumer-group) when no filter is given.
    #[arg(long)]
    all: bool,
}

#[derive(Subcommand)]
enum DeadCommand {
    /// List dead letters: the relay's newest first, or with --consumer-group the group's (DEAD
    /// and REPLAY) oldest first.
    List {
        #[command(flatten)]
        filter: Filter,
        /// Most rows listed.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Relay: FAIL rows back to WAIT, due now, retry count reset. With --consumer-group: DEAD
    /// rows marked REPLAY, for the group's running consumers to handle again.
    ///
    /// On the relay's table, the selected FAIL rows go back to WAIT, due now, with the retry
    /// count reset, and the relay sends them again.
    ///
    /// With --consumer-group G, the selected rows of G still DEAD are marked REPLAY; the group's
    /// running consumers then handle each again (inbox mark, handler, row deleted, in one
    /// transaction), and one that fails again goes back to DEAD with one more attempt. Nothing
    /// is handled until a consumer of G runs.
    ///
    /// Either way: --batch rows per transaction, at most --rate rows per second, each row
    /// changed audited in outbox_audit with --actor; --dry-run only counts.
    Replay(BatchArgs),
    /// Relay: FAIL rows marked DISCARDED, never sent. With --consumer-group: DEAD and REPLAY
    /// rows deleted, the messages dropped.
    ///
    /// On the relay's table, the selected FAIL rows are marked DISCARDED: never sent, kept for
    /// the record until purge deletes them.
    ///
    /// With --consumer-group G, the selected rows of G (DEAD, or REPLAY not yet handled) are
    /// deleted: the messages are dropped for good (the outbox_audit rows keep their group and
    /// event key).
    ///
    /// Either way: --batch rows per transaction, at most --rate rows per second, each row
    /// changed audited in outbox_audit with --actor; --dry-run only counts.
    Discard(BatchArgs),
}

fn duration(s: &str) -> Result<Duration, String> {
    admin::parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration like 500ms, 30s, 15m, 24h, 7d"))
}

fn time_bound(s: &str) -> Result<TimeBound, String> {
    TimeBound::parse(s)
}

fn batch_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 row per transaction".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a number of rows: {e}")),
    }
}

fn actor(s: &str) -> Result<String, String> {
    let probe = BatchOptions {
        dry_run: true,
        batch: 1,
        rate_per_sec: 0,
        actor: s.to_string(),
    };
    probe.check().map(|()| s.to_string()).map_err(reason)
}

fn consumer_group(s: &str) -> Result<String, String> {
    outbox::consumer::dead_letter::check_group(s)
        .map(|()| s.to_string())
        .map_err(reason)
}

fn dead_letter_table(s: &str) -> Result<String, String> {
    outbox::consumer::dead_letter::check_table(s)
        .map(|()| s.to_string())
        .map_err(reason)
}

/// What is wrong with a value, without the library's own name for it (clap names the option).
fn reason(e: outbox::Error) -> String {
    match e {
        outbox::Error::InvalidEvent { reason, .. } => reason,
        outbox::Error::Config(outbox::ConfigError::InvalidValue { reason, .. }) => reason,
        e => e.to_string(),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    if let Command::Config {
        command: ConfigCommand::Example,
    } = cli.command
    {
        print!("{}", outbox::config::example_toml());
        return ExitCode::SUCCESS;
    }
    let effective = match settings::load(cli.config.as_deref(), &cli.sets, |v| std::env::var(v).ok()) {
        Ok(e) => e,
        Err(problems) => {
            eprintln!("outboxd: {} configuration error(s):", problems.len());
            for p in &problems {
                eprintln!("  - {p}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // With shards: a command acts on one shard (--shard), or run/migrate/status on all of them
    // (and `config` checks the configuration as a whole).
    let fleet_wide = matches!(
        cli.command,
        Command::Run { .. } | Command::Migrate { .. } | Command::Status { .. } | Command::Config { .. }
    );
    let mut config = effective.config.clone();
    if config.is_fleet() {
        match shards::pick(&config, cli.shard.as_deref(), fleet_wide) {
            Ok(Some(one)) => config = one,
            Ok(None) => {}
            Err(msg) => {
                eprintln!("outboxd: {msg}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    } else if let Some(name) = &cli.shard {
        eprintln!("outboxd: --shard {name:?} needs the shards key set (this configuration serves db.url)");
        return ExitCode::from(EXIT_CONFIG);
    }
    let reload = || settings::load(cli.config.as_deref(), &cli.sets, |v| std::env::var(v).ok()).map(|e| e.config);
    let result = match cli.command {
        Command::Config {
            command: ConfigCommand::Check,
        } => {
            for k in KEYS {
                println!(
                    "{:<28} = {:<40} ({})",
                    k.key,
                    effective.config.get_redacted(k.key).unwrap_or_default(),
                    effective.sources[k.key]
                );
            }
            println!("configuration OK");
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Example,
        } => unreachable!("handled before loading"),
        Command::Run { drain } => match run(config, drain, &reload) {
            Err(RunFailure::Startup(msg)) => {
                eprintln!("outboxd: {msg}");
                return ExitCode::FAILURE;
            }
            Err(RunFailure::Error(e)) => Err(e),
            Ok(()) => Ok(()),
        },
        Command::Migrate { dry_run, consumer } if config.is_fleet() => {
            return fleet_exit(shards::migrate(&config, dry_run, consumer))
        }
        Command::Migrate { dry_run, consumer } => migrate(&config, dry_run, consumer),
        Command::Status { json } if config.is_fleet() => return fleet_exit(shards::status(&config, json)),
        Command::Status { json } => status(&config, json),
        Command::DeadLetters { command } => dead_letters(&config, command),
        Command::Control { command } => control(&config, command),
        Command::Events { command } => events(&config, command),
        Command::Inbox {
            command: InboxCommand::Forget(args),
        } => reemit::forget_cmd(&config, args),
        Command::Purge { older_than, batch } => purge(&config, older_than, batch),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outboxd: {e}");
            if matches!(e, outbox::Error::Config(_)) {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The exit of a command over every shard: failure when one shard failed (named).
fn fleet_exit(r: shards::FleetResult) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("outboxd: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn pool(config: &Config) -> outbox::Result<mysql::Pool> {
    outbox::connect(config)
}

pub(crate) fn migrate(config: &Config, dry_run: bool, consumer: bool) -> outbox::Result<()> {
    // What the migrations are for: the relay's table, or the consumer's tables alone.
    let (what, is) = if consumer {
        ("the consumer's tables".to_string(), "are")
    } else {
        (format!("table {}", config.table), "is")
    };
    if dry_run {
        let plan = if consumer {
            outbox::migrate::plan_consumer(&pool(config)?)?
        } else {
            outbox::migrate::plan(&pool(config)?, &config.table)?
        };
        if plan.is_empty() {
            println!("{what} {is} up to date: nothing would run");
            return Ok(());
        }
        println!(
            "dry run: {} migration(s) would run on {what}, in this order (nothing was changed):",
            plan.len(),
        );
        for p in &plan {
            println!("\nV{} {}", p.version, p.description);
            println!("  lock cost: {}", p.lock_cost);
            for stmt in &p.statements {
                println!("  {};", stmt.replace('\n', "\n  "));
            }
        }
        return Ok(());
    }
    let r = if consumer {
        outbox::migrate_consumer(&pool(config)?)?
    } else {
        outbox::migrate_table(&pool(config)?, &config.table)?
    };
    if r.applied.is_empty() {
        println!("{what} {is} up to date (schema version {})", r.current);
    } else {
        println!("applied {:?} to {what}; schema version {}", r.applied, r.current);
    }
    Ok(())
}

/// Why `run` ended in failure.
pub(crate) enum RunFailure {
    Error(outbox::Error),
    /// The relay, or what the daemon runs beside it (the signal handler, the metrics and console
    /// listeners), could not start, in plain words.
    Startup(String),
}

impl From<outbox::Error> for RunFailure {
    fn from(e: outbox::Error) -> Self {
        RunFailure::Error(e)
    }
}

/// Longest pause between two start attempts.
pub(crate) const START_RETRY_MAX: Duration = Duration::from_secs(30);

/// Re-reads the configuration (the file, the environment, `--set`) for SIGHUP.
pub(crate) type Reload<'a> = &'a dyn Fn() -> Result<Config, Vec<settings::Problem>>;

fn run(config: Config, drain: Duration, reload: Reload) -> Result<(), RunFailure> {
    let rx = signals::listen().map_err(RunFailure::Startup)?;
    if config.is_fleet() {
        return shards::run(config, drain, rx, reload);
    }
    log::info!(
        "outboxd {} on {} table {} (publisher {})",
        outbox::VERSION,
        outbox::config::redact_url(&config.db_url),
        config.table,
        config.get("publisher").unwrap_or_default()
    );
    let latency = metrics::Latency::new();
    let publisher = outbox::publisher_for(&config)?;
    // Spans go out over OTLP when configured; flushed when this guard drops at the end of run.
    let _spans = telemetry::export(&config)?;
    let target = metrics::Target::new();
    if let Some(addr) = &config.metrics_listen {
        metrics::serve(addr, target.clone(), latency.clone())
            .map_err(|e| RunFailure::Startup(format!("cannot serve the metrics: {e}")))?;
    }
    // The operator console, once the relay runs (it shows the relay's rates and latency).
    let console: Arc<std::sync::OnceLock<Arc<outbox::console::Console>>> = Arc::default();
    let start = || {
        let mut builder = Relay::builder(config.clone()).dead_letter_hook(|d| {
            log::error!(
                "dead letter: event {} biz_no {} type {}: {}",
                d.id,
                d.biz_no,
                d.event_type,
                d.last_error
            )
        });
        if let Some(p) = &publisher {
            builder = builder.publisher(p.clone());
        }
        let (l2, c2) = (latency.clone(), console.clone());
        builder
            .latency_hook(move |d| {
                l2.observe(d.to_success, d.held, d.trace_id);
                if let Some(c) = c2.get() {
                    c.record(d);
                }
            })
            .start()
    };
    // A database that cannot be reached yet (restarting, failing over, the network not up) is
    // waited for, with backoff, up to startup.db.wait.ms; /healthz says why meanwhile. What
    // waiting cannot fix (wrong password, unknown database, configuration) fails at once.
    let began = std::time::Instant::now();
    let mut delay = Duration::from_millis(500);
    let relay = loop {
        let e = match start() {
            Ok(r) => break Arc::new(r),
            Err(e) => e,
        };
        let msg = match startup::judge(&e, &config) {
            startup::Verdict::Fatal(msg) => return Err(RunFailure::Startup(msg)),
            startup::Verdict::Transient(msg) => msg,
        };
        let waited = began.elapsed();
        let left = config.startup_db_wait.saturating_sub(waited);
        if left.is_zero() {
            return Err(RunFailure::Startup(if config.startup_db_wait.is_zero() {
                format!("{msg} (startup.db.wait.ms = 0: not retrying)")
            } else {
                format!(
                    "{msg}; gave up after {:.1} s (startup.db.wait.ms = {})",
                    waited.as_secs_f64(),
                    config.startup_db_wait.as_millis()
                )
            }));
        }
        let pause = delay.min(left);
        log::warn!(
            "{msg}; retrying in {:.1} s (giving up {:.0} s from now)",
            pause.as_secs_f64(),
            left.as_secs_f64()
        );
        target.set_starting(format!("{msg}; retrying"));
        // A stop signal while waiting ends the wait: nothing was claimed, nothing to drain.
        if rx.recv_timeout(pause) == Ok(signals::Signal::Stop) {
            log::info!("signal received while waiting for the database: exiting");
            return Ok(());
        }
        delay = (delay * 2).min(START_RETRY_MAX);
    };
    target.set_relay(relay.clone());
    if config.console.enabled {
        let c = Arc::new(outbox::console::Console::new(&config)?);
        c.attach(relay.clone());
        console::serve(&config.console.listen, c.clone())
            .map_err(|e| RunFailure::Startup(format!("cannot serve the console: {e}")))?;
        let _ = console.set(c);
    }
    while let Ok(signals::Signal::Reload) = rx.recv() {
        log::info!("SIGHUP: outboxd re-reads only `shards`, and this configuration serves db.url: nothing to do");
    }
    let report = relay.stop(drain);
    let s = relay.counters();
    log::info!(
        "stopped: sent {} retried {} dead-lettered {} reclaimed {}; released {} on shutdown{}",
        s.sent,
        s.retried,
        s.dead_lettered,
        s.reclaimed,
        report.released,
        if report.timed_out {
            format!(", {} still in flight at the deadline", report.in_flight_at_deadline)
        } else {
            String::new()
        }
    );
    Ok(())
}

fn status(config: &Config, json: bool) -> outbox::Result<()> {
    let s = admin::status(&pool(config)?, &config.table)?;
    if json {
        println!("{}", s.to_json());
        return Ok(());
    }
    println!("table {}", config.table);
    for (st, n) in &s.counts {
        println!("  {st:<10} {n}");
    }
    if s.scheduled > 0 {
        // Part of WAIT: rows waiting for the time they were scheduled at, not backing off.
        let next = s
            .next_scheduled_in
            .map(|d| format!(", the next in {:.1} s", d.as_secs_f64()));
        println!(
            "  of WAIT, scheduled for later: {}{}",
            s.scheduled,
            next.unwrap_or_default()
        );
    }
    match s.oldest_wait_age {
        Some(a) => println!("oldest due WAIT: {:.1} s", a.as_secs_f64()),
        None => println!("oldest due WAIT: none due"),
    }
    println!("dead letters in the last day: {}", s.dead_last_day);
    if !s.sending.is_empty() {
        println!("SENDING (oldest first):");
        for r in &s.sending {
            println!(
                "  id {:<10} owner {:<32} for {:.1} s",
                r.id,
                r.owner.as_deref().unwrap_or("-"),
                r.age.as_secs_f64()
            );
        }
    }
    Ok(())
}

fn control(config: &Config, command: ControlCommand) -> outbox::Result<()> {
    let pool = pool(config)?;
    let table = &config.table;
    match command {
        ControlCommand::Pause { reason, actor } => {
            let actor = actor.unwrap_or_else(default_actor);
            if outbox::control::set_paused(&pool, table, true, &actor, reason.as_deref())? {
                println!("table {table} paused by {actor}: its relays stop claiming within a second");
            } else {
                println!("table {table} was already paused: nothing changed");
            }
        }
        ControlCommand::Resume { actor } => {
            let actor = actor.unwrap_or_else(default_actor);
            if outbox::control::set_paused(&pool, table, false, &actor, None)? {
                println!("table {table} resumed by {actor}: its relays claim again within a second");
            } else {
                println!("table {table} was not paused: nothing changed");
            }
        }
        ControlCommand::Status => match outbox::control::state(&mut pool.get_conn()?, table)? {
            Some(p) => println!("table {table}: {p}"),
            None => println!("table {table}: claiming (not paused)"),
        },
    }
    Ok(())
}

fn events(config: &Config, command: EventsCommand) -> outbox::Result<()> {
    let (ids, biz_no, event_type, actor, json) = match command {
        EventsCommand::Cancel {
            ids,
            biz_no,
            event_type,
            actor,
            json,
        } => (ids, biz_no, event_type, actor, json),
        EventsCommand::Reemit(args) => return reemit::reemit_cmd(config, args),
        EventsCommand::Reemits { json } => return reemit::list_jobs(config, json),
    };
    let pool = pool(config)?;
    let actor = actor.unwrap_or_else(default_actor);
    let report = match &biz_no {
        Some(b) => outbox::cancel::cancel_by_biz_no(&pool, &config.table, b, event_type.as_deref(), &actor)?,
        None => outbox::cancel::cancel_ids(&pool, &config.table, &ids, &actor)?,
    };
    if json {
        println!("{}", report.to_json());
        return Ok(());
    }
    for (id, outcome) in &report.outcomes {
        match outcome {
            outbox::CancelOutcome::Cancelled { attempts } if *attempts > 0 => {
                println!("event {id}: cancelled (after {attempts} failed attempt(s); a timed-out one may have reached the broker)")
            }
            o => println!("event {id}: {}", o.name()),
        }
    }
    println!("{} in {}: {}", report.outcomes.len(), config.table, report.summary());
    Ok(())
}

fn default_actor() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}")
}

fn batch_options(args: &BatchArgs) -> BatchOptions {
    BatchOptions {
        dry_run: args.dry_run,
        batch: args.batch,
        rate_per_sec: args.rate,
        actor: args.actor.clone().unwrap_or_else(default_actor),
    }
}

/// The bar a batch action on dead letters shows while it runs (on a terminal).
fn progress_bar(dry_run: bool) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec})").expect("static template"));
    bar.set_message(if dry_run { "dry run" } else { "dead letters" });
    bar
}

fn dead_letters(config: &Config, command: DeadCommand) -> outbox::Result<()> {
    let pool = pool(config)?;
    if let Some(group) = match &command {
        DeadCommand::List { filter, .. } => filter.consumer_group.clone(),
        DeadCommand::Replay(a) | DeadCommand::Discard(a) => a.filter.consumer_group.clone(),
    } {
        return consumer_dead_letters(&pool, &group, command);
    }
    let (args, action) = match command {
        DeadCommand::List { filter, limit, json } => {
            let rows = admin::list_dead_letters(&pool, &config.table, &filter.to_filter(), limit)?;
            if json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|d| {
                        serde_json::json!({"id": d.id, "biz_no": d.biz_no, "event_type": d.event_type,
                        "retry_count": d.retry_count, "last_error": d.last_error, "claim_owner": d.claim_owner,
                        "failed_at": d.failed_at})
                    })
                    .collect();
                println!("{}", serde_json::Value::from(v));
            } else {
                for d in &rows {
                    println!(
                        "{:<10} {:<24} {:<20} {:<24} attempts {:<3} {}",
                        d.id,
                        d.failed_at,
                        d.event_type,
                        d.biz_no,
                        d.retry_count,
                        d.last_error.as_deref().unwrap_or("")
                    );
                }
                println!("{} dead letter(s)", rows.len());
            }
            return Ok(());
        }
        DeadCommand::Replay(a) => (a, DeadLetterAction::Replay),
        DeadCommand::Discard(a) => (a, DeadLetterAction::Discard),
    };
    let opts = batch_options(&args);
    let bar = progress_bar(opts.dry_run);
    let n = admin::act_on_dead_letters(
        &pool,
        &config.table,
        &args.filter.to_filter(),
        action,
        &opts,
        |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    bar.finish_and_clear();
    let verb = match action {
        DeadLetterAction::Replay => "replayed",
        DeadLetterAction::Discard => "discarded",
    };
    if opts.dry_run {
        println!("dry run: {n} dead letter(s) would be {verb}");
    } else {
        println!("{n} dead letter(s) {verb} by {}", opts.actor);
    }
    Ok(())
}

/// `dead-letters ... --consumer-group G`: the consumer's parked messages. A replay hands them
/// back to the group's running consumers (status REPLAY), which handle each once more; a discard
/// deletes them.
fn consumer_dead_letters(pool: &mysql::Pool, group: &str, command: DeadCommand) -> outbox::Result<()> {
    use outbox::consumer::dead_letter as dl;
    match command {
        DeadCommand::List { filter, limit, json } => {
            let table = &filter.dead_letter_table;
            let ids: std::collections::HashSet<u64> = filter.ids.iter().copied().collect();
            let rows: Vec<_> = dl::list(pool, table, Some(group), None, limit)?
                .into_iter()
                .filter(|d| ids.is_empty() || ids.contains(&d.id))
                .collect();
            if json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|d| {
                        serde_json::json!({"id": d.id, "consumer_group": d.group, "event_key": d.key,
                        "topic": d.topic, "broker": d.broker, "queue_id": d.queue_id, "queue_offset": d.queue_offset,
                        "msg_id": d.msg_id, "attempts": d.attempts, "last_error": d.last_error,
                        "status": d.status, "created_at": d.created_at})
                    })
                    .collect();
                println!("{}", serde_json::Value::from(v));
            } else {
                for d in &rows {
                    println!(
                        "{:<10} {:<24} {:<7} {:<40} {}#{}:{} attempts {:<3} {}",
                        d.id,
                        d.created_at,
                        d.status,
                        d.key,
                        d.topic,
                        d.queue_id.map(|q| q.to_string()).unwrap_or_default(),
                        d.queue_offset.map(|o| o.to_string()).unwrap_or_default(),
                        d.attempts,
                        d.last_error
                    );
                }
                println!("{} dead letter(s) of consumer group {group}", rows.len());
            }
            Ok(())
        }
        DeadCommand::Replay(a) => act_on_consumer_dead_letters(pool, group, &a, DeadLetterAction::Replay),
        DeadCommand::Discard(a) => act_on_consumer_dead_letters(pool, group, &a, DeadLetterAction::Discard),
    }
}

/// `dead-letters replay|discard --consumer-group G`: batched, rate-limited and audited like the
/// relay's, with the same progress bar; the summary says how many rows changed.
fn act_on_consumer_dead_letters(
    pool: &mysql::Pool,
    group: &str,
    args: &BatchArgs,
    action: DeadLetterAction,
) -> outbox::Result<()> {
    use outbox::consumer::dead_letter::{self as dl, Selection};
    let which = if args.filter.ids.is_empty() {
        Selection::All
    } else {
        Selection::Ids(args.filter.ids.clone())
    };
    let opts = batch_options(args);
    let bar = progress_bar(opts.dry_run);
    let mut selected = 0;
    let n = dl::act_on_dead_letters(
        pool,
        &args.filter.dead_letter_table,
        group,
        &which,
        action,
        &opts,
        |done, total| {
            selected = total;
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    bar.finish_and_clear();
    let (verb, then) = match action {
        DeadLetterAction::Replay => ("marked REPLAY", ": the group's running consumers handle them again"),
        DeadLetterAction::Discard => ("discarded", ""),
    };
    if opts.dry_run {
        println!("dry run: {n} dead letter(s) of consumer group {group} would be {verb} (nothing changed)");
        return Ok(());
    }
    let left = if n < selected {
        format!(
            " ({} of the {selected} selected changed meanwhile and were left alone)",
            selected - n
        )
    } else {
        String::new()
    };
    println!(
        "{n} dead letter(s) of consumer group {group} {verb} by {}{then}{left}",
        opts.actor
    );
    Ok(())
}

fn purge(config: &Config, older_than: Option<Duration>, batch: usize) -> outbox::Result<()> {
    let age = older_than.or(config.retention_age).ok_or_else(|| {
        outbox::Error::Config(outbox::ConfigError::InvalidValue {
            key: "retention.age.ms".into(),
            value: "0".into(),
            reason: "purge needs an age: pass --older-than or set retention.age.ms".into(),
        })
    })?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} deleted {pos} rows ({per_sec})").expect("static template"));
    let n = admin::purge(&pool(config)?, &config.table, age, batch, Duration::MAX, |d| {
        bar.set_position(d)
    })?;
    bar.finish_and_clear();
    println!(
        "purged {n} row(s) sent more than {} s ago from {}",
        age.as_secs(),
        config.table
    );
    Ok(())
}
