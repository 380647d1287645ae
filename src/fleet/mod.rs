//! A fleet: one relay over many shard databases (`shards`, `docs/fleet.md`).
//!
//! Each shard gets a relay of its own ([`Relay`], with the shard's URL and table,
//! `shard.workers` senders and a pool of `shard.db.pool.max`), so each has its own scanner,
//! breaker, backoff, leases and dead letters, and a shard that is slow or down holds up nothing
//! but itself. They share the publisher (one producer for the fleet), which only the fleet shuts
//! down. A shard whose database cannot be opened (down, access denied, table missing) is started
//! again and again in the background with backoff, reported by name meanwhile
//! ([`ShardState::Starting`] with the last error), while the others relay. Shards are added and
//! removed while the others run ([`Fleet::add`], [`Fleet::remove`], [`Fleet::reload`]); a removed
//! shard's relay stops like any relay: sends in flight finish, claimed-but-unsent rows go back to
//! WAIT, nothing is lost or sent twice because of the removal.
//!
//! With `shard.coordination.url`, several relays configured with the same shards split them
//! among themselves (`share.rs`): each serves only the shards it holds ([`ShardState::Elsewhere`]
//! for the others) and takes over a dead relay's shards when their holds run out.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;

use crate::config::{Config, ShardSpec};
use crate::error::{ConfigError, Error, Result};
use crate::publisher::{OutboundEvent, Publisher, SendOutcome};
use crate::relay::{Delivery, Relay, StopReport};
use crate::store::DeadLetter;

mod catalog;
mod problem;
mod share;
mod watch;
pub use catalog::fleet_shards;
use catalog::Catalog;
use share::{shard_key, Share};
use watch::{Watch, Watched};

/// First and longest wait between two starts of a shard that cannot be opened.
const RESTART_FIRST: Duration = Duration::from_millis(500);
const RESTART_MAX: Duration = Duration::from_secs(30);

/// Called with the shard's name.
type ShardLatencyHook = Arc<dyn Fn(&str, &Delivery) + Send + Sync>;
type ShardDeadLetterHook = Arc<dyn Fn(&str, &DeadLetter) + Send + Sync>;

/// Builds a [`Fleet`].
pub struct FleetBuilder {
    config: Config,
    publisher: Arc<dyn Publisher>,
    latency: Option<ShardLatencyHook>,
    dead_letter: Option<ShardDeadLetterHook>,
}

impl FleetBuilder {
    /// Called per acked event with its shard's name and its [`Delivery`] times.
    pub fn latency_hook(mut self, f: impl Fn(&str, &Delivery) + Send + Sync + 'static) -> Self {
        self.latency = Some(Arc::new(f));
        self
    }

    /// Called once per event that ends FAIL, with its shard's name.
    pub fn dead_letter_hook(mut self, f: impl Fn(&str, &DeadLetter) + Send + Sync + 'static) -> Self {
        self.dead_letter = Some(Arc::new(f));
        self
    }

    /// Starts a relay for every shard of `shards` and returns at once: shards that cannot be
    /// opened yet keep being started in the background. Fails only on the configuration (no
    /// `shards`, or a value the relay refuses).
    pub fn start(self) -> Result<Fleet> {
        let catalog = Catalog::default();
        let specs = match &self.config.shard_catalog_url {
            None => self.config.shard_specs()?,
            Some(_) => {
                let read = fleet_shards(&self.config);
                catalog.record(&read);
                match read {
                    Ok(specs) => specs,
                    // A list with an error is refused at start, as `shards` is.
                    Err(e @ Error::Config(_)) => return Err(e),
                    // A catalog that cannot be read yet: the `shards` list meanwhile.
                    Err(_) => self.config.shard_specs()?,
                }
            }
        };
        if specs.is_empty() && self.config.shard_catalog_url.is_none() {
            return Err(ConfigError::invalid("shards", "", "is empty: a fleet needs at least one shard").into());
        }
        let probe = specs.first().cloned().unwrap_or_else(|| ShardSpec {
            name: "catalog".into(),
            url: self.config.shard_catalog_url.clone().unwrap_or_default(),
            table: self.config.table.clone(),
        });
        self.config.for_shard(&probe).validate()?;
        let share = self.config.shard_coordination_url.clone().map(|url| {
            let me = self
                .config
                .instance_id
                .clone()
                .unwrap_or_else(|| crate::relay::default_instance_id(&self.config));
            Share::new(&self.config, url, me)
        });
        let fleet = Fleet {
            owner: true,
            inner: Arc::new(FleetInner {
                base: self.config,
                publisher: self.publisher,
                latency: self.latency,
                dead_letter: self.dead_letter,
                slots: Mutex::new(Vec::new()),
                stopped: AtomicBool::new(false),
                watch: Watch::default(),
                watcher: Mutex::new(None),
                share,
                sharer: Mutex::new(None),
                change: Mutex::new(()),
                catalog,
                cataloger: Mutex::new(None),
            }),
        };
        for spec in specs {
            fleet.add(spec)?;
        }
        if fleet.inner.base.shard_catalog_url.is_some() {
            let (stop_tx, stop_rx) = bounded::<()>(0);
            let inner = fleet.inner.clone();
            let handle = std::thread::Builder::new()
                .name("outbox-fleet-catalog".into())
                .spawn(move || inner.catalog_loop(&stop_rx))
                .map_err(|source| Error::Thread {
                    name: "outbox-fleet-catalog".into(),
                    source,
                })?;
            *fleet.inner.cataloger.lock() = Some((stop_tx, handle));
        }
        if fleet.inner.share.is_some() {
            let (stop_tx, stop_rx) = bounded::<()>(0);
            let (kick_tx, kick_rx) = bounded::<()>(1);
            let inner = fleet.inner.clone();
            let handle = std::thread::Builder::new()
                .name("outbox-fleet-share".into())
                .spawn(move || inner.share_loop(&stop_rx, &kick_rx))
                .map_err(|source| Error::Thread {
                    name: "outbox-fleet-share".into(),
                    source,
                })?;
            *fleet.inner.sharer.lock() = Some((stop_tx, kick_tx, handle));
        }
        let every = fleet.inner.base.shard_watch;
        if !every.is_zero() {
            let (stop_tx, stop_rx) = bounded::<()>(0);
            let inner = fleet.inner.clone();
            let handle = std::thread::Builder::new()
                .name("outbox-fleet-watch".into())
                .spawn(move || inner.watch.run(&inner.base, every, stop_rx, || inner.running()))
                .map_err(|source| Error::Thread {
                    name: "outbox-fleet-watch".into(),
                    source,
                })?;
            *fleet.inner.watcher.lock() = Some((stop_tx, handle));
        }
        Ok(fleet)
    }
}

/// Where one shard is.
#[derive(Debug, Clone)]
pub enum ShardState {
    /// Not relaying yet: its relay could not be started (`last_error`, after `attempts` tries);
    /// it is tried again with backoff.
    Starting {
        attempts: u32,
        last_error: Option<String>,
        since: Instant,
    },
    /// Its relay runs.
    Running(Arc<Relay>),
    /// Served by another relay of the fleet (`shard.coordination.url`): `owner`, or nobody
    /// while its hold is free (the next tick of the relay it falls to takes it).
    Elsewhere { owner: Option<String> },
}

/// One shard of a fleet as [`Fleet::shards`] shows it.
#[derive(Debug, Clone)]
pub struct ShardView {
    pub spec: ShardSpec,
    pub state: ShardState,
}

impl ShardView {
    /// The shard's relay, when it runs.
    pub fn relay(&self) -> Option<&Arc<Relay>> {
        match &self.state {
            ShardState::Running(r) => Some(r),
            ShardState::Starting { .. } | ShardState::Elsewhere { .. } => None,
        }
    }

    /// Whether this relay serves the shard (false while another relay of the fleet holds it).
    pub fn is_here(&self) -> bool {
        !matches!(self.state, ShardState::Elsewhere { .. })
    }
}

/// How the relays of a fleet split its shards (`shard.coordination.url`), as this one sees it.
#[derive(Debug, Clone)]
pub struct Coordination {
    /// This relay's id in `outbox_fleet_member`.
    pub instance: String,
    /// Live relays configured with the same shards, this one included, and shards nobody
    /// holds, as of the last tick that reached the coordination database.
    pub members: Option<usize>,
    pub unowned: Option<usize>,
    /// Why the last tick failed, when it did: the shards held go on being relayed meanwhile.
    pub problem: Option<String>,
}

/// What [`Fleet::reload`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetChange {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Shards whose URL or table changed: stopped, then started again with the new one.
    pub replaced: Vec<String>,
}

/// Many shard databases relayed by one process. Stop it with [`Fleet::stop`]; dropping it
/// stops it too.
pub struct Fleet {
    inner: Arc<FleetInner>,
    /// False for the handle the catalog thread works through: only the user's stops the fleet
    /// when dropped.
    owner: bool,
}

struct FleetInner {
    base: Config,
    publisher: Arc<dyn Publisher>,
    latency: Option<ShardLatencyHook>,
    dead_letter: Option<ShardDeadLetterHook>,
    /// In the order they were added.
    slots: Mutex<Vec<Arc<Slot>>>,
    stopped: AtomicBool,
    watch: Watch,
    /// The watch's thread and what stops it (dropping the sender), with `shard.watch.ms`.
    watcher: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    /// With `shard.coordination.url`: this relay's side of the split, and its thread (stopped by
    /// dropping the first sender, ticked at once by the second).
    share: Option<Share>,
    sharer: Mutex<Option<Sharer>>,
    /// Held by whatever changes which shards run here (add, remove, reload, a share tick).
    change: Mutex<()>,
    /// With `shard.catalog.url`: the last read's failure, and the thread that reads it again.
    catalog: Catalog,
    cataloger: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl FleetInner {
    /// The shards whose relay runs, for the watch.
    fn running(&self) -> Vec<Watched> {
        self.slots
            .lock()
            .iter()
            .filter_map(|s| match &*s.state.lock() {
                ShardState::Running(r) => Some(Watched {
                    url: s.spec.url.clone(),
                    table: s.spec.table.clone(),
                    relay: r.clone(),
                }),
                ShardState::Starting { .. } | ShardState::Elsewhere { .. } => None,
            })
            .collect()
    }

    /// The share thread: a tick at once, then every third of the lease or when kicked, until
    /// `stop` disconnects.
    fn share_loop(self: &Arc<Self>, stop: &Receiver<()>, kick: &Receiver<()>) {
        let Some(share) = &self.share else { return };
        loop {
            self.share_tick(share);
            crossbeam_channel::select! {
                recv(stop) -> _ => return,
                recv(kick) -> _ => {}
                default(share.every()) => {}
            }
        }
    }

    /// One tick of the split: hands over what this relay should no longer serve (its relays
    /// stopped before the holds are given up), then starts what it holds and stops what another
    /// relay holds now.
    fn share_tick(self: &Arc<Self>, share: &Share) {
        let _change = self.change.lock();
        if self.stopped.load(SeqCst) {
            return;
        }
        let slots: Vec<Arc<Slot>> = self.slots.lock().clone();
        let keys: BTreeSet<String> = slots.iter().map(|s| s.key.clone()).collect();
        let drain = self.base.send_timeout + Duration::from_secs(1);
        let result = share.tick(&self.base, &keys, |going| {
            let leaving: Vec<&Arc<Slot>> = slots.iter().filter(|s| going.contains(&s.key)).collect();
            let_go_all(&leaving, drain);
        });
        let Ok(holding) = result else { return };
        let mut lost = Vec::new();
        for slot in &slots {
            let here = !matches!(*slot.state.lock(), ShardState::Elsewhere { .. });
            if holding.mine.contains(&slot.key) {
                if !here {
                    log::info!("shard {}: held by this relay, starting it", slot.spec.name);
                    if let Err(e) = spawn_starter(self, slot) {
                        log::error!("shard {}: {e}", slot.spec.name);
                    }
                }
            } else if here {
                lost.push(slot);
            }
        }
        if !lost.is_empty() {
            log::warn!(
                "fleet coordination: {} shard(s) held by another relay now; stopping them here",
                lost.len()
            );
            let_go_all(&lost, drain);
        }
        for slot in &slots {
            let mut state = slot.state.lock();
            if let ShardState::Elsewhere { owner } = &mut *state {
                *owner = holding.owners.get(&slot.key).cloned();
            }
        }
    }

    /// The catalog thread: reads the catalog every `shard.catalog.reload.ms` and makes the fleet
    /// serve what it lists (with `shards`), until `stop` disconnects. A read that fails changes
    /// nothing.
    fn catalog_loop(self: &Arc<Self>, stop: &Receiver<()>) {
        let fleet = Fleet {
            inner: self.clone(),
            owner: false,
        };
        let drain = self.base.send_timeout + Duration::from_secs(1);
        while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stop.recv_timeout(self.base.shard_catalog_reload)
        {
            let read = fleet_shards(&self.base);
            self.catalog.record(&read);
            if let Ok(specs) = read {
                // Compared whatever the order: the fleet keeps its shards in the order they came,
                // the catalog lists them in its own.
                let by_name = |mut v: Vec<ShardSpec>| {
                    v.sort_by(|a, b| a.name.cmp(&b.name));
                    v
                };
                let now = by_name(fleet.shards().into_iter().map(|v| v.spec).collect());
                if by_name(specs.clone()) != now {
                    if let Err(e) = fleet.reload(specs, drain) {
                        log::error!("fleet catalog: {e}");
                    }
                }
            }
        }
    }

    /// Ticks the share thread now (after the shards changed).
    fn kick_share(&self) {
        if let Some((_, kick, _)) = &*self.sharer.lock() {
            let _ = kick.try_send(());
        }
    }
}

/// The share thread, what stops it (dropped) and what ticks it at once.
type Sharer = (Sender<()>, Sender<()>, JoinHandle<()>);

/// One shard: its state and the thread that starts its relay.
struct Slot {
    spec: ShardSpec,
    /// The shard's key in `outbox_fleet_shard` (its server, database and table).
    key: String,
    state: Mutex<ShardState>,
    /// Set when the shard is removed or the fleet stops; the starter then starts nothing more.
    removed: AtomicBool,
    /// Dropped on removal: wakes a starter waiting out its backoff.
    wake: Mutex<Option<Sender<()>>>,
    starter: Mutex<Option<JoinHandle<()>>>,
}

impl Fleet {
    /// A fleet over the `shards` of `config`, sending through `publisher`.
    pub fn builder(config: Config, publisher: Arc<dyn Publisher>) -> FleetBuilder {
        FleetBuilder {
            config,
            publisher,
            latency: None,
            dead_letter: None,
        }
    }

    /// Every shard and where it is, in the order they were added.
    pub fn shards(&self) -> Vec<ShardView> {
        self.inner
            .slots
            .lock()
            .iter()
            .map(|s| ShardView {
                spec: s.spec.clone(),
                state: s.state.lock().clone(),
            })
            .collect()
    }

    /// The relay of the shard `name`, when it runs.
    pub fn relay(&self, name: &str) -> Option<Arc<Relay>> {
        let slots = self.inner.slots.lock();
        let slot = slots.iter().find(|s| s.spec.name == name)?;
        let state = slot.state.lock();
        match &*state {
            ShardState::Running(r) => Some(r.clone()),
            ShardState::Starting { .. } | ShardState::Elsewhere { .. } => None,
        }
    }

    /// Why the catalog (`shard.catalog.url`) could not be read at its last read, when it could
    /// not: the fleet serves the shards it had meanwhile.
    pub fn catalog_problem(&self) -> Option<String> {
        self.inner.catalog.problem()
    }

    /// How this relay and the others split the shards, with `shard.coordination.url`.
    pub fn coordination(&self) -> Option<Coordination> {
        let share = self.inner.share.as_ref()?;
        let last = share.last_seen();
        Some(Coordination {
            instance: share.me.clone(),
            members: last.map(|l| l.0),
            unowned: last.map(|l| l.1),
            problem: share.problem(),
        })
    }

    /// Each database server (`host:port`) whose watch statement failed at its last tick, and
    /// why: its shards are relayed meanwhile at their own `shard.scan.interval.ms`.
    pub fn watch_problems(&self) -> Vec<(String, String)> {
        self.inner.watch.problems()
    }

    /// Which relay holds each of `specs` (the shards of `config`, [`fleet_shards`]) by shard
    /// name, read from its `shard.coordination.url` (`None` when it has none): what `outboxd
    /// status` shows. A shard nobody holds now is absent.
    pub fn holders(config: &Config, specs: &[ShardSpec]) -> Result<Option<std::collections::BTreeMap<String, String>>> {
        let Some(url) = &config.shard_coordination_url else {
            return Ok(None);
        };
        let keys: Vec<String> = specs.iter().map(shard_key).collect();
        let by_key = share::holders(config, url, &keys)?;
        Ok(Some(
            specs
                .iter()
                .zip(&keys)
                .filter_map(|(s, k)| by_key.get(k).map(|o| (s.name.clone(), o.clone())))
                .collect(),
        ))
    }

    /// The configuration every shard's relay is made from.
    pub fn config(&self) -> &Config {
        &self.inner.base
    }

    /// Starts relaying `shard` (in the background: see [`ShardState`]). Refused when the fleet
    /// has stopped or already serves a shard of that name.
    pub fn add(&self, shard: ShardSpec) -> Result<()> {
        let _change = self.inner.change.lock();
        self.add_unlocked(shard)?;
        self.inner.kick_share();
        Ok(())
    }

    fn add_unlocked(&self, shard: ShardSpec) -> Result<()> {
        if self.inner.stopped.load(SeqCst) {
            return Err(Error::Stopped);
        }
        let mut slots = self.inner.slots.lock();
        if slots.iter().any(|s| s.spec.name == shard.name) {
            return Err(ConfigError::invalid("shards", &shard.name, "is already served by this fleet").into());
        }
        crate::config::table_name("shards", &shard.table)?;
        let slot = Arc::new(Slot {
            key: shard_key(&shard),
            spec: shard,
            state: Mutex::new(ShardState::Elsewhere { owner: None }),
            removed: AtomicBool::new(false),
            wake: Mutex::new(None),
            starter: Mutex::new(None),
        });
        if self.inner.share.is_none() {
            spawn_starter(&self.inner, &slot)?;
        }
        slots.push(slot);
        Ok(())
    }

    /// Stops relaying the shard `name` (its sends in flight finish within `drain`; what it
    /// claimed and did not send goes back to WAIT). `None` when the fleet has no such shard.
    pub fn remove(&self, name: &str, drain: Duration) -> Option<StopReport> {
        let _change = self.inner.change.lock();
        let report = self.remove_unlocked(name, drain);
        self.inner.kick_share();
        report
    }

    fn remove_unlocked(&self, name: &str, drain: Duration) -> Option<StopReport> {
        let slot = {
            let mut slots = self.inner.slots.lock();
            let i = slots.iter().position(|s| s.spec.name == name)?;
            slots.remove(i)
        };
        Some(retire(&slot, drain))
    }

    /// Makes the fleet serve exactly `shards`: adds the new ones, removes the ones no longer
    /// listed (their relays stopped with `drain`, in parallel), and replaces a shard whose URL or
    /// table changed. The shards left alone are not touched.
    pub fn reload(&self, shards: Vec<ShardSpec>, drain: Duration) -> Result<FleetChange> {
        let _change = self.inner.change.lock();
        let result = self.reload_unlocked(shards, drain);
        self.inner.kick_share();
        result
    }

    fn reload_unlocked(&self, shards: Vec<ShardSpec>, drain: Duration) -> Result<FleetChange> {
        let mut change = FleetChange::default();
        let current: Vec<ShardSpec> = self.shards().into_iter().map(|v| v.spec).collect();
        let mut gone = Vec::new();
        for old in &current {
            match shards.iter().find(|s| s.name == old.name) {
                None => {
                    change.removed.push(old.name.clone());
                    gone.push(old.name.clone());
                }
                Some(new) if new != old => {
                    change.replaced.push(old.name.clone());
                    gone.push(old.name.clone());
                }
                Some(_) => {}
            }
        }
        std::thread::scope(|s| {
            for name in &gone {
                s.spawn(move || self.remove_unlocked(name, drain));
            }
        });
        for new in shards {
            let was = current.iter().any(|c| c.name == new.name);
            if !was || change.replaced.contains(&new.name) {
                let name = new.name.clone();
                self.add_unlocked(new)?;
                if !was {
                    change.added.push(name);
                }
            }
        }
        if change != FleetChange::default() {
            log::info!(
                "fleet: added {:?}, removed {:?}, replaced {:?}",
                change.added,
                change.removed,
                change.replaced
            );
        }
        Ok(change)
    }

    /// Stops every shard's relay (in parallel, each with `drain`), then the publisher. Returns
    /// each shard's report; a second call returns nothing.
    pub fn stop(&self, drain: Duration) -> Vec<(String, StopReport)> {
        if self.inner.stopped.swap(true, SeqCst) {
            return Vec::new();
        }
        if let Some((stop, handle)) = self.inner.watcher.lock().take() {
            drop(stop);
            let _ = handle.join();
        }
        if let Some((stop, handle)) = self.inner.cataloger.lock().take() {
            drop(stop);
            let _ = handle.join();
        }
        if let Some((stop, kick, handle)) = self.inner.sharer.lock().take() {
            drop((stop, kick));
            let _ = handle.join();
        }
        let slots: Vec<Arc<Slot>> = std::mem::take(&mut *self.inner.slots.lock());
        let reports = std::thread::scope(|s| {
            let handles: Vec<_> = slots
                .iter()
                .map(|slot| s.spawn(move || (slot.spec.name.clone(), retire(slot, drain))))
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if let Some(share) = &self.inner.share {
            share.leave(&self.inner.base);
        }
        self.inner.publisher.shutdown();
        reports
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if self.owner {
            let grace = self.inner.base.send_timeout + Duration::from_secs(1);
            self.stop(grace);
        }
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("shards", &self.inner.slots.lock().len())
            .finish()
    }
}

/// Ends a shard taken out of the fleet: no more starts, its relay (if any) stopped.
fn retire(slot: &Slot, drain: Duration) -> StopReport {
    slot.removed.store(true, SeqCst);
    drop(slot.wake.lock().take());
    if let Some(h) = slot.starter.lock().take() {
        let _ = h.join();
    }
    let state = slot.state.lock().clone();
    match state {
        ShardState::Running(relay) => {
            let report = relay.stop(drain);
            log::info!("shard {}: stopped ({report:?})", slot.spec.name);
            report
        }
        ShardState::Starting { .. } | ShardState::Elsewhere { .. } => StopReport::default(),
    }
}

/// Stops the relays of `slots` (in parallel, each with `drain`) and marks them served elsewhere:
/// another relay of the fleet holds them, or will.
fn let_go_all(slots: &[&Arc<Slot>], drain: Duration) {
    std::thread::scope(|s| {
        for slot in slots {
            s.spawn(move || {
                retire(slot, drain);
                *slot.state.lock() = ShardState::Elsewhere { owner: None };
            });
        }
    });
}

/// Starts the starter thread of `slot`: its relay runs once its database can be opened.
fn spawn_starter(inner: &Arc<FleetInner>, slot: &Arc<Slot>) -> Result<()> {
    let (wake_tx, wake_rx) = bounded::<()>(0);
    slot.removed.store(false, SeqCst);
    *slot.state.lock() = ShardState::Starting {
        attempts: 0,
        last_error: None,
        since: Instant::now(),
    };
    *slot.wake.lock() = Some(wake_tx);
    let (inner, s) = (inner.clone(), slot.clone());
    let handle = std::thread::Builder::new()
        .name(format!("outbox-shard-{}", slot.spec.name))
        .spawn(move || start_until_running(&inner, &s, wake_rx))
        .map_err(|source| Error::Thread {
            name: format!("outbox-shard-{}", slot.spec.name),
            source,
        })?;
    *slot.starter.lock() = Some(handle);
    Ok(())
}

/// The starter thread of a shard: starts its relay, again and again with backoff while it
/// cannot, until it runs or the shard is removed.
fn start_until_running(inner: &FleetInner, slot: &Slot, wake: Receiver<()>) {
    let name = &slot.spec.name;
    let mut delay = RESTART_FIRST;
    let mut attempts = 0u32;
    loop {
        if slot.removed.load(SeqCst) {
            return;
        }
        attempts += 1;
        match start_shard(inner, &slot.spec) {
            Ok(relay) => {
                let relay = Arc::new(relay);
                let mut state = slot.state.lock();
                if slot.removed.load(SeqCst) {
                    drop(state);
                    relay.stop(inner.base.send_timeout);
                    return;
                }
                *state = ShardState::Running(relay);
                log::info!("shard {name}: relaying table {}", slot.spec.table);
                return;
            }
            Err(e) => {
                let why = format!("cannot start: {e}");
                // One line per attempt, and attempts back off to one per RESTART_MAX.
                log::warn!(
                    "shard {name}: {why}; trying again in {:.1} s (attempt {attempts})",
                    delay.as_secs_f64()
                );
                let mut state = slot.state.lock();
                let since = match &*state {
                    ShardState::Starting { since, .. } => *since,
                    ShardState::Running(_) | ShardState::Elsewhere { .. } => Instant::now(),
                };
                *state = ShardState::Starting {
                    attempts,
                    last_error: Some(why),
                    since,
                };
            }
        }
        // Woken early (disconnected) only by a removal.
        let _ = wake.recv_timeout(delay);
        delay = (delay * 2).min(RESTART_MAX);
    }
}

fn start_shard(inner: &FleetInner, spec: &ShardSpec) -> Result<Relay> {
    let config = inner.base.for_shard(spec);
    let mut builder = Relay::builder(config).publisher(Arc::new(Shared(inner.publisher.clone())));
    if let Some(hook) = &inner.latency {
        let (hook, name) = (hook.clone(), spec.name.clone());
        builder = builder.latency_hook(move |d| hook(&name, d));
    }
    if let Some(hook) = &inner.dead_letter {
        let (hook, name) = (hook.clone(), spec.name.clone());
        builder = builder.dead_letter_hook(move |d| hook(&name, d));
    }
    builder.start()
}

/// The fleet's publisher as one shard's relay holds it: everything but the shutdown, which is the
/// fleet's when it stops (a shard's relay stopping must not close the others' producer).
struct Shared(Arc<dyn Publisher>);

impl Publisher for Shared {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        self.0.publish(events, timeout)
    }
    fn queue_hint(&self, event: &OutboundEvent) -> Option<u64> {
        self.0.queue_hint(event)
    }
    fn is_healthy(&self) -> bool {
        self.0.is_healthy()
    }
}
