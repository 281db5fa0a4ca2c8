//! Push: the instance's one subscription to queue events, fanned out to
//! this instance's open streams.
//!
//! Every admission pass, whichever instance ran it, arrives here once
//! (Redis pub/sub, or an in-process channel for the memory store) and is
//! applied to every local stream in one sweep. Around that, a refresh loop
//! re-reads exact standings in batches on a jittered, rank-dependent
//! schedule, and a presence loop marks users as seen with one write per
//! queue: those streaming, and those whose polls found them in line since
//! the last write ([`Hub::note_seen`]), so a poll's store call writes no
//! presence of its own.

mod admissions;
mod mailbox;
mod registry;
mod session;
mod sources;
mod view;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::{Forecast, Policy, QueueName, Queues, RateEstimator, Snapshot, UserId};
use crate::store::{QueueEvent, SharedStore, StoreEvent};

/// How long an instance's streams report (its open streams, for the
/// console of any instance) lasts in the store: a few missed reports.
pub const STREAMS_REPORT_TTL: Duration = Duration::from_secs(10);
pub use admissions::{AdmissionPath, AdmissionWindow};
pub use registry::view_of;
use registry::{QueueWatchers, Watcher, refresh_period};
pub use session::{Render, StreamSession, shed_frame};
pub use sources::{Eviction, Sources, StreamSlot};
pub use view::{EventId, GoneReason, Update, View};

/// How far back the observed admission rate looks.
const RATE_WINDOW_MS: u64 = 30_000;
/// How often due refreshes are collected.
const REFRESH_TICK: Duration = Duration::from_millis(200);
/// Most users re-read in one store call.
const REFRESH_BATCH: usize = 2_000;
/// Most users marked as seen in one store call.
const TOUCH_BATCH: usize = 5_000;
/// How often the presence loop looks for queues due a presence write
/// (each queue is written at its own abandonment window's pace).
const PRESENCE_TICK: Duration = Duration::from_millis(100);
/// The abandonment window a queue without one is touched for: presence
/// is kept all the same, so an operator who turns abandonment on mid-sale
/// drops nobody who is there.
const DEFAULT_WINDOW_MS: u64 = 40_000;
/// Most polling users per queue held for the next presence write; past it
/// a poll's caller marks its user seen itself ([`Hub::note_seen`]).
const NOTED_MAX: usize = 500_000;

/// Per-instance push state: the streams and the observed admission rates.
/// Shared as an `Arc<Hub>`: the state, the push loop and every open
/// stream's guard hold it.
pub struct Hub {
    /// The queues served, for the subscription; they change as queues are
    /// opened and deleted ([`Hub::set_queues`]).
    names: RwLock<Vec<QueueName>>,
    queues: RwLock<HashMap<QueueName, Arc<QueueHub>>>,
    next_conn: AtomicU64,
    open: AtomicUsize,
    resyncs: AtomicU64,
    interruptions: AtomicU64,
    sources: Arc<Sources>,
    /// Set at shutdown: every stream is told, and a stream registered
    /// after is told at once.
    closing: AtomicBool,
}

struct QueueHub {
    watchers: Mutex<QueueWatchers>,
    rate: Mutex<RateEstimator>,
    /// Events applied so far; lets a new stream notice one applied while
    /// it was reading its initial state.
    events_seen: AtomicU64,
    /// Admissions heard of (every instance's), by path.
    admitted: Mutex<AdmissionWindow>,
    /// The last pass heard of ran while an operator held admission.
    held: AtomicBool,
    /// Users found in line by a request of theirs (a poll) since the last
    /// presence write: the presence loop writes them with the streams.
    noted: Mutex<HashSet<UserId>>,
}

impl QueueHub {
    fn new() -> Self {
        Self {
            watchers: Mutex::new(QueueWatchers::default()),
            rate: Mutex::new(RateEstimator::new(RATE_WINDOW_MS)),
            events_seen: AtomicU64::new(0),
            admitted: Mutex::new(AdmissionWindow::new(
                Duration::from_millis(RATE_WINDOW_MS),
                std::time::Instant::now(),
            )),
            held: AtomicBool::new(false),
            noted: Mutex::new(HashSet::new()),
        }
    }
}

impl QueueHub {
    /// The pass window's forecast, held while the last pass heard of was.
    fn forecast(&self, fallback: f64) -> Forecast {
        lock(&self.rate)
            .forecast(fallback)
            .with_held(self.held.load(Ordering::Relaxed))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A registered stream: its updates, and a guard that unregisters it when
/// dropped (the client went away, or the stream ended).
pub struct Subscription {
    pub updates: mailbox::Receiver,
    pub guard: StreamGuard,
}

/// Unregisters its stream on drop, so nothing a stream owns outlives it.
pub struct StreamGuard {
    hub: Arc<Hub>,
    queue: QueueName,
    user: UserId,
    conn: u64,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let hub = &self.hub;
        hub.open.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("waitroom_streams_open").decrement(1.0);
        if let Some(q) = hub.queue(&self.queue) {
            let mut watchers = lock(&q.watchers);
            if watchers
                .by_user
                .get(&self.user)
                .is_some_and(|w| w.conn == self.conn)
            {
                watchers.by_user.remove(&self.user);
            }
        }
    }
}

impl Hub {
    /// A hub for `queues`.
    pub fn new(queues: &[QueueName]) -> Self {
        Self {
            names: RwLock::new(queues.to_vec()),
            queues: RwLock::new(
                queues
                    .iter()
                    .map(|q| (q.clone(), Arc::new(QueueHub::new())))
                    .collect(),
            ),
            next_conn: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            resyncs: AtomicU64::new(0),
            interruptions: AtomicU64::new(0),
            sources: Arc::new(Sources::default()),
            closing: AtomicBool::new(false),
        }
    }

    /// A stream slot for a client from `source` (an address bucket), or
    /// `None` when the stream must be shed: over `per_source`, or at
    /// `max_total` unless a heavier source gives one up (see `sources.rs`).
    pub fn admit_stream(
        &self,
        source: std::net::IpAddr,
        max_total: usize,
        per_source: Option<usize>,
    ) -> Option<StreamSlot> {
        self.sources.admit(source, max_total, per_source)
    }

    /// Streams `source` holds on this instance.
    pub fn streams_of(&self, source: std::net::IpAddr) -> usize {
        self.sources.count(source)
    }

    /// The queues this hub serves.
    pub fn queue_names(&self) -> Vec<QueueName> {
        self.names.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn queue(&self, queue: &QueueName) -> Option<Arc<QueueHub>> {
        self.queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned()
    }

    /// Serves exactly `names` from now on: a new queue gets its streams'
    /// state, and the streams of a queue that is gone (deleted by an
    /// operator) are told `gone: notEntered` (their place no longer
    /// exists). True if anything changed (the subscription must follow).
    pub fn set_queues(&self, names: &[QueueName]) -> bool {
        let mut current = self.names.write().unwrap_or_else(|e| e.into_inner());
        if current.as_slice() == names {
            return false;
        }
        let mut queues = self.queues.write().unwrap_or_else(|e| e.into_inner());
        queues.retain(|name, q| {
            let keep = names.contains(name);
            if !keep {
                for w in lock(&q.watchers).by_user.values_mut() {
                    let pass = w.id.pass;
                    w.show(pass, View::Gone(GoneReason::NotEntered));
                }
            }
            keep
        });
        for name in names {
            queues
                .entry(name.clone())
                .or_insert_with(|| Arc::new(QueueHub::new()));
        }
        *current = names.to_vec();
        true
    }

    /// The wait forecast of `queue` from its observed passes, or a point
    /// estimate at `fallback` admissions a second without data.
    pub fn forecast(&self, queue: &QueueName, fallback: f64) -> Forecast {
        self.queue(queue)
            .map_or(Forecast::at_rate(fallback), |q| q.forecast(fallback))
    }

    /// The observed admission rate of `queue`, or `fallback` without data.
    pub fn rate(&self, queue: &QueueName, fallback: f64) -> f64 {
        self.queue(queue)
            .map(|q| lock(&q.rate).rate(fallback))
            .unwrap_or(fallback)
    }

    /// Streams open on this instance.
    pub fn open_streams(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// How often the event subscription was interrupted and every stream
    /// re-read since start.
    pub fn resyncs(&self) -> u64 {
        self.resyncs.load(Ordering::Relaxed)
    }

    /// How often the event subscription was lost since start (each loss is
    /// followed by a resync once it is back).
    pub fn interruptions(&self) -> u64 {
        self.interruptions.load(Ordering::Relaxed)
    }

    /// Streams registered for `queue` (for tests and metrics).
    pub fn registered(&self, queue: &QueueName) -> usize {
        self.queue(queue)
            .map_or(0, |q| lock(&q.watchers).by_user.len())
    }

    /// Users admitted in `queue` that this instance heard of since start,
    /// (by passes, on the fast track): every instance's admissions (the
    /// operator console charts admissions per minute from them).
    pub fn admitted_seen(&self, queue: &QueueName) -> (u64, u64) {
        self.queue(queue)
            .map_or((0, 0), |q| lock(&q.admitted).totals())
    }

    /// Admissions per second in `queue` over the last half minute, on
    /// either path, as observed: 0 when nobody was admitted (never the
    /// configured rate standing in).
    pub fn observed_rate(&self, queue: &QueueName) -> f64 {
        self.queue(queue)
            .map_or(0.0, |q| lock(&q.admitted).rate(std::time::Instant::now()))
    }

    /// Events applied to `queue`'s streams so far; read it before reading a
    /// new stream's initial state and hand it to [`Hub::register`].
    pub fn events_seen(&self, queue: &QueueName) -> u64 {
        self.queue(queue)
            .map_or(0, |q| q.events_seen.load(Ordering::Acquire))
    }

    /// Registers a stream for `user` showing `view` (from `snapshot`, read
    /// after [`Hub::events_seen`] returned `seen_before`); a previous stream
    /// of the same user is told `gone: replaced`. The stream's ids start
    /// after `floor`, the last id its client saw (see [`EventId::first`]).
    pub fn register(
        self: &Arc<Self>,
        queue: &QueueName,
        user: &UserId,
        snapshot: &Snapshot,
        view: View,
        seen_before: u64,
        floor: Option<EventId>,
    ) -> Subscription {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let id = EventId::first(snapshot.pass, floor);
        let (tx, updates) = mailbox::channel(Update {
            id,
            view: view.clone(),
        });
        let (seq, rank) = match snapshot.standing {
            crate::queue::Standing::Waiting { rank, seq } => (seq, rank),
            _ => (0, 0),
        };
        let next_refresh = match &view {
            View::Ready { expires_at, .. } => *expires_at + Duration::from_millis(250),
            View::PreQueue { .. } => Instant::now() + registry::pre_queue_refresh(),
            _ => Instant::now() + refresh_period(rank),
        };
        let watcher = Watcher {
            conn,
            tx,
            seq,
            rank,
            total: snapshot.total_waiting,
            id,
            synced_pass: snapshot.pass,
            next_refresh,
        };
        if let Some(q) = self.queue(queue) {
            let mut watchers = lock(&q.watchers);
            let mut watcher = watcher;
            // An event applied while the snapshot was read may be missing
            // from it: re-read at once rather than at the next period.
            if q.events_seen.load(Ordering::Acquire) != seen_before {
                watcher.next_refresh = Instant::now();
            }
            // Read under the lock `shut_down_streams` takes: a stream is
            // either in the map it walks or sees the flag here.
            if self.closing.load(Ordering::Acquire) {
                watcher.tx.shut_down();
            }
            if let Some(mut old) = watchers.insert(user.clone(), watcher) {
                let pass = old.id.pass;
                old.show(pass, View::Gone(GoneReason::Replaced));
            }
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("waitroom_streams_open").increment(1.0);
        Subscription {
            updates,
            guard: StreamGuard {
                hub: Arc::clone(self),
                queue: queue.clone(),
                user: user.clone(),
                conn,
            },
        }
    }

    /// Tells every stream, open or opening, that the instance is shutting
    /// down: each ends within the drain window.
    fn shut_down_streams(&self) {
        self.closing.store(true, Ordering::Release);
        let queues = self.queues.read().unwrap_or_else(|e| e.into_inner());
        for q in queues.values() {
            for w in lock(&q.watchers).by_user.values() {
                w.tx.shut_down();
            }
        }
    }

    async fn on_event(&self, event: StoreEvent, fallback_rate: f64) {
        match event {
            StoreEvent::Queue {
                queue,
                event: QueueEvent::Pass(pass),
            } => {
                let Some(q) = self.queue(&queue) else {
                    return;
                };
                q.held.store(pass.held, Ordering::Relaxed);
                if pass.held {
                    lock(&q.rate).note_held(pass.at);
                } else if pass.busy {
                    lock(&q.rate).record(
                        pass.at,
                        pass.admitted.len() as u64,
                        pass.abandoned.len() as u64,
                        pass.waiting,
                    );
                }
                lock(&q.admitted).record(
                    std::time::Instant::now(),
                    AdmissionPath::Pass,
                    pass.admitted.len() as u64,
                );
                let forecast = q.forecast(fallback_rate);
                lock(&q.watchers).apply_admissions(&pass);
                // Counted before the yield too: a stream that registers in
                // it, from a read taken before this pass, missed its own
                // admission and must be re-read at once, not in a second.
                q.events_seen.fetch_add(1, Ordering::Release);
                // Let the admitted buyers' streams write their `ready`
                // before thousands of rank updates queue up behind them.
                tokio::task::yield_now().await;
                lock(&q.watchers).apply_ranks(&pass, forecast);
                q.events_seen.fetch_add(1, Ordering::Release);
            }
            StoreEvent::Queue { queue, event } => {
                let Some(q) = self.queue(&queue) else {
                    return;
                };
                match event {
                    QueueEvent::Left { seq: Some(_), .. } => lock(&q.rate).note_leave(),
                    QueueEvent::FastTracked { .. } => lock(&q.admitted).record(
                        std::time::Instant::now(),
                        AdmissionPath::FastTrack,
                        1,
                    ),
                    _ => {}
                }
                let forecast = q.forecast(fallback_rate);
                lock(&q.watchers).apply(&event, forecast);
                q.events_seen.fetch_add(1, Ordering::Release);
            }
            StoreEvent::Interrupted => {
                self.interruptions.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("event subscription lost: streams wait for the resync");
                metrics::counter!("waitroom_event_interruptions_total").increment(1);
            }
            StoreEvent::Resync => {
                tracing::info!("event subscription resumed: re-reading every stream");
                self.resyncs.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("waitroom_event_resyncs_total").increment(1);
                let now = Instant::now();
                let queues: Vec<Arc<QueueHub>> = self
                    .queues
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .cloned()
                    .collect();
                for q in queues {
                    for w in lock(&q.watchers).by_user.values_mut() {
                        w.next_refresh = now;
                    }
                }
            }
        }
    }

    /// Users of `queue` due for an exact re-read; they are rescheduled so a
    /// slow store call does not make them due twice.
    fn due(&self, queue: &QueueName) -> Vec<UserId> {
        let Some(q) = self.queue(queue) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut watchers = lock(&q.watchers);
        let mut due = Vec::new();
        for (user, w) in watchers.by_user.iter_mut() {
            if due.len() >= REFRESH_BATCH {
                break;
            }
            // The time first: it is a field, while what a stream shows is
            // behind its mailbox's lock (this walks every stream 5 times a
            // second).
            if w.next_refresh <= now && !w.is_gone() {
                w.next_refresh = now + Duration::from_secs(5);
                due.push(user.clone());
            }
        }
        due
    }

    /// Notes that a request of `user` (a poll) found them in line in
    /// `queue`: the presence loop marks them seen with the queue's next
    /// presence write, within a quarter of its abandonment window. False
    /// when it cannot (an unknown queue, or `NOTED_MAX` users already
    /// noted): the caller then marks them seen itself.
    pub fn note_seen(&self, queue: &QueueName, user: &UserId) -> bool {
        let Some(q) = self.queue(queue) else {
            return false;
        };
        let mut noted = lock(&q.noted);
        noted.len() < NOTED_MAX && {
            noted.insert(user.clone());
            true
        }
    }

    /// The users of `queue` a presence write marks seen: those whose
    /// streams show them waiting, and those noted since the last write
    /// ([`Hub::note_seen`], taken here).
    fn present_users(&self, queue: &QueueName) -> Vec<UserId> {
        let Some(q) = self.queue(queue) else {
            return Vec::new();
        };
        let mut users = std::mem::take(&mut *lock(&q.noted));
        users.extend(
            lock(&q.watchers)
                .by_user
                .iter()
                .filter(|(_, w)| w.is_waiting())
                .map(|(u, _)| u.clone()),
        );
        users.into_iter().collect()
    }
}

/// Runs the subscription, the refresh loop and the presence loop of
/// `hub`'s queues until `shutdown`.
///
/// `queues` is the live catalog: when queues are opened or deleted, the
/// hub follows and the subscription is renewed for the new set (streams
/// are re-read, as after any gap).
pub async fn run(
    hub: Arc<Hub>,
    store: SharedStore,
    policy: Policy,
    mut queues: watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    let names: Vec<QueueName> = queues.borrow_and_update().keys().cloned().collect();
    hub.set_queues(&names);
    let mut events = store.subscribe(&hub.queue_names());
    let mut refresh = tokio::time::interval(REFRESH_TICK);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut presence = tokio::time::interval(PRESENCE_TICK);
    presence.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut touched = HashMap::new();
    let fallback = policy.configured_rate();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = events.next() => match event {
                Some(event) => hub.on_event(event, fallback).await,
                None => break,
            },
            changed = queues.changed() => {
                if changed.is_err() {
                    break;
                }
                let names: Vec<QueueName> = queues.borrow_and_update().keys().cloned().collect();
                if hub.set_queues(&names) {
                    events = store.subscribe(&names);
                    hub.on_event(StoreEvent::Resync, fallback).await;
                }
            }
            _ = refresh.tick() => refresh_due(&hub, &store, fallback).await,
            _ = presence.tick() => {
                let catalog = queues.borrow().clone();
                touch_due(&hub, &store, &catalog, &mut touched).await;
            }
        }
    }
    // Streams end at shutdown even if the subscription ended first.
    shutdown.cancelled().await;
    hub.shut_down_streams();
}

/// Presence writes often enough that a present user is never taken for
/// absent: four times per abandonment window (`window_ms`, none: the
/// default one), at most every 10 s.
fn touch_interval(window_ms: Option<u64>) -> Duration {
    let window = window_ms.unwrap_or(DEFAULT_WINDOW_MS);
    Duration::from_millis((window / 4).clamp(100, 10_000))
}

async fn refresh_due(hub: &Hub, store: &SharedStore, fallback_rate: f64) {
    for queue in &hub.queue_names() {
        let due = hub.due(queue);
        if due.is_empty() {
            continue;
        }
        match store.statuses(queue, &due).await {
            Ok(snapshots) => {
                let Some(q) = hub.queue(queue) else {
                    continue;
                };
                let forecast = q.forecast(fallback_rate);
                let mut watchers = lock(&q.watchers);
                for (user, snapshot) in due.iter().zip(&snapshots) {
                    watchers.apply_snapshot(user, snapshot, forecast);
                }
                metrics::counter!("waitroom_stream_refreshes_total").increment(due.len() as u64);
            }
            // Streams stay open on what they show; they are re-read once
            // the store answers (their next refresh is already scheduled).
            Err(e) => tracing::debug!(error = %e, "stream refresh failed"),
        }
    }
}

/// Marks the present users of every queue due a presence write as seen
/// (`touched`: when each queue was last written). Each queue is due at
/// its own pace, from its settings in `catalog` as they are now, so a
/// window an operator shortens mid-sale is kept from the next tick.
async fn touch_due(
    hub: &Hub,
    store: &SharedStore,
    catalog: &Queues,
    touched: &mut HashMap<QueueName, Instant>,
) {
    let now = Instant::now();
    touched.retain(|queue, _| catalog.contains_key(queue));
    for queue in &hub.queue_names() {
        let window = catalog.get(queue).and_then(|s| s.settings.abandon_after_ms);
        if touched
            .get(queue)
            .is_some_and(|at| now.duration_since(*at) < touch_interval(window))
        {
            continue;
        }
        touched.insert(queue.clone(), now);
        let users = hub.present_users(queue);
        for (i, chunk) in users.chunks(TOUCH_BATCH).enumerate() {
            if let Err(e) = store.touch(queue, chunk).await {
                tracing::debug!(error = %e, "presence write failed");
                // Tried again at the next tick, the polls not written
                // still noted: an outage must not cost anyone present
                // their presence once the store is back.
                touched.remove(queue);
                for user in &users[i * TOUCH_BATCH..] {
                    hub.note_seen(queue, user);
                }
                break;
            }
        }
    }
}
