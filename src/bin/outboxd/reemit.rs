//! `outboxd events re-emit`, `outboxd events re-emits` and `outboxd inbox forget`: sent events
//! back to the broker by filter, and a consumer group that forgets them first
//! (`outbox::reemit`, docs/scheduling.md#re-emit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{ArgGroup, Args};
use indicatif::{ProgressBar, ProgressStyle};

use outbox::admin::TimeBound;
use outbox::reemit::{self, Job, Preview, ReemitFilter, RunEnd};
use outbox::{Config, SentRows};

use crate::{default_actor, pool, time_bound};

/// Which sent events: every filter given must match.
#[derive(Args, Clone, Default)]
pub struct EventFilter {
    /// Events of this type.
    #[arg(long)]
    pub event_type: Option<String>,
    /// Events sent to this topic (the row's own, or `topic` for rows that set none).
    #[arg(long)]
    pub topic: Option<String>,
    /// Events of this business key.
    #[arg(long)]
    pub biz_no: Option<String>,
    /// Written at or after: 24h, 7d, or 2026-12-01 08:00:00 (the database's clock).
    #[arg(long, value_parser = time_bound)]
    pub since: Option<TimeBound>,
    /// Written before.
    #[arg(long, value_parser = time_bound)]
    pub until: Option<TimeBound>,
}

impl EventFilter {
    fn to_filter(&self) -> ReemitFilter {
        ReemitFilter {
            event_type: self.event_type.clone(),
            topic: self.topic.clone(),
            biz_no: self.biz_no.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
        }
    }
}

#[derive(Args)]
#[command(group(ArgGroup::new("job").args(["resume", "stop"])))]
pub struct ReemitArgs {
    #[command(flatten)]
    pub filter: EventFilter,
    /// Create the job and run it; without --yes, only count what the filter matches.
    #[arg(long, conflicts_with_all = ["resume", "stop"])]
    pub yes: bool,
    /// Events per second (1 to 100000), for the job's life: a resumed job keeps its own.
    #[arg(long, default_value_t = reemit::DEFAULT_RATE, conflicts_with_all = ["resume", "stop"])]
    pub rate: u32,
    /// Run job ID again from where it stopped (one a stop, a signal or a crash left).
    #[arg(long, value_name = "ID", conflicts_with_all = ["event_type", "topic", "biz_no", "since", "until"])]
    pub resume: Option<u64>,
    /// Stop job ID, wherever it runs (its runner ends after the batch it is writing).
    #[arg(long, value_name = "ID", conflicts_with_all = ["event_type", "topic", "biz_no", "since", "until"])]
    pub stop: Option<u64>,
    /// Who is acting, written to outbox_audit; defaults to $USER@hostname.
    #[arg(long, value_parser = crate::actor)]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true)
    .args(["event_type", "topic", "biz_no", "since", "until", "job", "all"])))]
pub struct ForgetArgs {
    /// The consumer group whose inbox marks go.
    #[arg(long)]
    pub group: String,
    #[command(flatten)]
    pub filter: EventFilter,
    /// The events of re-emit job ID (its filter and id range).
    #[arg(long, value_name = "ID", conflicts_with_all = ["event_type", "topic", "biz_no", "since", "until"])]
    pub job: Option<u64>,
    /// Every sent event the table keeps.
    #[arg(long)]
    pub all: bool,
    /// Count the marks that would go; delete nothing, audit nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_parser = crate::actor)]
    pub actor: Option<String>,
}

fn what_is_kept(config: &Config, p: &Preview) -> String {
    let mut s = match &p.oldest_kept {
        Some((id, at)) => format!("{} keeps sent events back to {at} (event {id})", config.table),
        None => format!("{} keeps no sent event", config.table),
    };
    match config.retention_age {
        Some(age) => s.push_str(&format!("; retention deletes them after {} s", age.as_secs())),
        None => s.push_str("; retention is off"),
    }
    if config.sent_rows == SentRows::Delete {
        s.push_str(
            "; with sent.rows = delete an event sent at its first attempt is deleted as it is sent, \
             so only events that needed a retry are kept (set sent.rows = keep to re-emit the others)",
        );
    }
    s
}

fn run_job(config: &Config, pool: &mysql::Pool, id: u64, json: bool) -> outbox::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // A signal stops the job after the batch being written; a second one exits at once (the
    // job's position is committed with each batch, so nothing is copied twice on resume).
    if let Ok(signals) = crate::signals::listen() {
        std::thread::spawn(move || {
            while let Ok(s) = signals.recv() {
                if s == crate::signals::Signal::Stop {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        });
    }
    let runner = format!("{}:{}", default_actor(), std::process::id());
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("re-emit [{bar:40}] {pos}/{len} ({per_sec}, {eta})").expect("static template"),
    );
    let (job, end) = reemit::run(pool, &config.table, id, &runner, &stop, |j: &Job| {
        bar.set_length(j.matched);
        bar.set_position(j.emitted);
    })?;
    bar.finish_and_clear();
    if json {
        let mut v = job.to_json();
        v["end"] = format!("{end:?}").to_lowercase().into();
        println!("{v}");
        return Ok(());
    }
    match end {
        RunEnd::Done => println!("{}: done", job.summary()),
        RunEnd::Stopped | RunEnd::TakenAway => println!(
            "{}: stopped at id {} of {}; resume with: outboxd events re-emit --resume {}",
            job.summary(),
            job.position,
            job.selection.last_id,
            job.id
        ),
    }
    Ok(())
}

pub fn reemit_cmd(config: &Config, args: ReemitArgs) -> outbox::Result<()> {
    let pool = pool(config)?;
    let actor = args.actor.clone().unwrap_or_else(default_actor);
    if let Some(id) = args.stop {
        let job = reemit::stop(&pool, &config.table, id, &actor)?;
        if args.json {
            println!("{}", job.to_json());
        } else {
            println!("{}", job.summary());
        }
        return Ok(());
    }
    if let Some(id) = args.resume {
        return run_job(config, &pool, id, args.json);
    }
    let preview = reemit::preview(&pool, &config.table, &config.topic, &args.filter.to_filter())?;
    if !args.yes {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "matched": preview.matched,
                    "selection": preview.selection.describe(),
                    "oldest_kept": preview.oldest_kept.as_ref().map(|(id, at)| serde_json::json!({"id": id, "written_at": at})),
                })
            );
        } else {
            println!(
                "{} sent events match ({})",
                preview.matched,
                preview.selection.describe()
            );
            println!("{}", what_is_kept(config, &preview));
            if preview.matched > 0 {
                println!(
                    "nothing sent yet: add --yes to re-emit them at {}/s (about {} s)",
                    args.rate,
                    preview.matched.div_ceil(u64::from(args.rate.max(1)))
                );
            }
        }
        return Ok(());
    }
    let job = reemit::create(&pool, &preview, args.rate, &actor)?;
    if !args.json {
        println!(
            "re-emit job {}: {} events ({}) at {}/s",
            job.id,
            job.matched,
            job.selection.describe(),
            job.rate
        );
    }
    run_job(config, &pool, job.id, args.json)
}

pub fn list_jobs(config: &Config, json: bool) -> outbox::Result<()> {
    let pool = pool(config)?;
    let jobs = reemit::jobs(&pool, &config.table, 50)?;
    if json {
        println!("{}", serde_json::Value::Array(jobs.iter().map(Job::to_json).collect()));
        return Ok(());
    }
    if jobs.is_empty() {
        println!("no re-emit job on {}", config.table);
    }
    for j in &jobs {
        println!(
            "{}; {}; at {}/s; created {} by {}",
            j.summary(),
            j.selection.describe(),
            j.rate,
            j.created_at,
            j.created_by
        );
    }
    Ok(())
}

pub fn forget_cmd(config: &Config, args: ForgetArgs) -> outbox::Result<()> {
    let pool = pool(config)?;
    let inbox_pool = match &config.console.consumer_db_url {
        Some(url) => outbox::connect(&Config {
            db_url: url.clone(),
            ..config.clone()
        })?,
        None => pool.clone(),
    };
    let selection = match args.job {
        Some(id) => reemit::job_in(&pool, &config.table, id)?.selection,
        None => reemit::preview(&pool, &config.table, &config.topic, &args.filter.to_filter())?.selection,
    };
    let actor = args.actor.clone().unwrap_or_else(default_actor);
    let report = reemit::forget(
        &pool,
        &selection,
        &inbox_pool,
        &config.consumer.inbox_table,
        &args.group,
        &actor,
        args.dry_run,
        |_, _| {},
    )?;
    let verb = if args.dry_run { "would forget" } else { "forgot" };
    println!(
        "group {}: {verb} {} inbox marks in {} of {} sent events ({})",
        args.group,
        report.forgotten,
        config.consumer.inbox_table,
        report.events,
        selection.describe()
    );
    Ok(())
}
