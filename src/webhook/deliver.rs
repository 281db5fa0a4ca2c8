//! The delivery task: one per instance, taking each hook's entries from
//! each queue's log through the hook's consumer group and POSTing them.
//!
//! An entry taken is held by this instance until it is acknowledged: after
//! a 2xx, or when it is given up (too many attempts, or too old: a
//! dead letter, counted and logged). While it retries with backoff the
//! instance re-claims it every third of the claim timeout, so no other
//! instance takes it over; if the instance dies, its entries fall idle and
//! another instance's next take claims them. A failing store only delays
//! delivery: the task logs, counts and tries again on its next tick.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::connect::describe;
use super::tls::HookClient;
use super::{MAX_BACKOFF_MS, SIGNATURE_HEADER, WebhookSpec};
use crate::clock::now_ms;
use crate::queue::audit::{AuditEntry, AuditId, TakenEntry};
use crate::queue::{QueueName, Queues};
use crate::store::AuditStore;

/// How the task runs.
#[derive(Debug, Clone)]
pub struct DeliveryOptions {
    /// This instance's consumer name in every group.
    pub consumer: String,
    /// How long an entry may sit unacknowledged with a consumer that stopped
    /// holding it before another instance takes it over, ms.
    pub claim_ms: u64,
    /// How often the logs are looked at.
    pub tick: Duration,
}

/// Entries taken per group and tick at most.
const TAKE: usize = 100;

/// Entries one hook may have in flight per queue; beyond, it takes no more
/// until some are settled (a dead receiver must not fill the memory).
const MAX_IN_FLIGHT: usize = 1_000;

/// Requests in flight at once, all hooks together.
const CONCURRENCY: usize = 32;

/// How far before the task's start a hook's group starts, when the task is
/// the first to create it: room for the instance's clock running ahead of
/// the store's.
const START_MARGIN_MS: u64 = 5_000;

/// The JSON body of a delivery: the entry, its queue, and its
/// idempotency key.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    queue: &'a str,
    /// The `Idempotency-Key` header's value, inside the signed body: what a
    /// receiver de-duplicates on must be signed, or a captured delivery
    /// replayed under another header key would be taken twice.
    idempotency_key: String,
    #[serde(flatten)]
    entry: &'a AuditEntry,
}

/// The key a receiver de-duplicates an entry's deliveries on: the same on
/// every attempt, and on every instance.
fn idempotency_key(queue: &QueueName, id: AuditId) -> String {
    format!("{queue}:{id}")
}

struct InFlight {
    entry: AuditEntry,
    /// The store's record holding it ([`TakenEntry::record`]): held and
    /// acknowledged once all of its entries are settled.
    record: AuditId,
    body: Arc<Vec<u8>>,
    attempts: u32,
    next_at: Instant,
    held_at: Instant,
    /// Settled (delivered or given up): only the acknowledgement is left.
    settled: bool,
}

type Key = (usize, QueueName, AuditId);

/// Delivers `hooks` for the live queues (`live`, the instance's catalog)
/// until `shutdown`. Entries still in flight then stay pending in the
/// store, for another instance (or this one's next start) to take.
pub async fn run(
    store: Arc<dyn AuditStore>,
    hooks: Vec<WebhookSpec>,
    live: watch::Receiver<Arc<Queues>>,
    options: DeliveryOptions,
    shutdown: CancellationToken,
) {
    if hooks.is_empty() {
        return;
    }
    let mut ticker = tokio::time::interval(options.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut delivery = Delivery::new(store, hooks, options);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let queues = live.borrow().clone();
        delivery.take(&queues, &shutdown).await;
        let now = Instant::now();
        delivery.hold(now).await;
        let attempts = delivery.attempt(now);
        // A shutdown drops the requests under way: their entries stay
        // pending, for the next taker (at least once).
        let results = tokio::select! {
            _ = shutdown.cancelled() => break,
            results = attempts => results,
        };
        delivery.settle(results);
        delivery.acknowledge().await;
    }
}

/// The task's state between ticks: the hooks, their clients and consumer
/// groups, and the entries in flight.
struct Delivery {
    store: Arc<dyn AuditStore>,
    hooks: Vec<WebhookSpec>,
    clients: Vec<HookClient>,
    groups: Vec<String>,
    options: DeliveryOptions,
    /// Where a hook's group starts when this task creates it.
    start: AuditId,
    /// How often an entry being retried is re-claimed.
    hold_every: Duration,
    flights: HashMap<Key, InFlight>,
}

impl Delivery {
    fn new(store: Arc<dyn AuditStore>, hooks: Vec<WebhookSpec>, options: DeliveryOptions) -> Self {
        Self {
            clients: hooks.iter().map(super::tls::client).collect(),
            groups: hooks.iter().map(WebhookSpec::group).collect(),
            start: AuditId {
                ms: now_ms().saturating_sub(START_MARGIN_MS),
                seq: 0,
            },
            hold_every: Duration::from_millis((options.claim_ms / 3).max(1)),
            flights: HashMap::new(),
            store,
            hooks,
            options,
        }
    }

    /// 1. Takes what is new, and what dead instances left behind, for
    ///    every hook following a live queue.
    async fn take(&mut self, queues: &Queues, shutdown: &CancellationToken) {
        for queue in queues.keys() {
            for h in 0..self.hooks.len() {
                // Store calls are bounded, but many of them against a dead
                // store would outlast the shutdown window.
                if !self.hooks[h].follows(queue) || shutdown.is_cancelled() {
                    continue;
                }
                let held = self
                    .flights
                    .keys()
                    .filter(|k| k.0 == h && &k.1 == queue)
                    .count();
                if held < MAX_IN_FLIGHT {
                    self.take_one(h, queue).await;
                }
            }
        }
    }

    /// Takes hook `h`'s entries of `queue`: the ones it wants go in
    /// flight, the others are acknowledged at once.
    async fn take_one(&mut self, h: usize, queue: &QueueName) {
        let hook = &self.hooks[h];
        let taken = self
            .store
            .audit_take(
                queue,
                &self.groups[h],
                self.start,
                &self.options.consumer,
                self.options.claim_ms,
                TAKE,
            )
            .await;
        let entries = match taken {
            Ok(entries) => entries,
            Err(e) => return store_error(hook, queue, "take", &e),
        };
        let now = Instant::now();
        for TakenEntry { entry, record } in entries {
            let key = (h, queue.clone(), entry.id);
            if self.flights.contains_key(&key) {
                continue; // our own, re-claimed: already retrying
            }
            // An entry the hook does not want is settled at once: its
            // record is acknowledged with the rest of it (step 4).
            let wanted = hook.wants(entry.kind);
            let body = if wanted {
                serde_json::to_vec(&Body {
                    queue: queue.as_str(),
                    idempotency_key: idempotency_key(queue, entry.id),
                    entry: &entry,
                })
                .unwrap_or_default()
            } else {
                Vec::new()
            };
            self.flights.insert(
                key,
                InFlight {
                    entry,
                    record,
                    body: Arc::new(body),
                    attempts: 0,
                    next_at: now,
                    held_at: now,
                    settled: !wanted,
                },
            );
        }
    }

    /// 2. Keeps what is still being retried: re-claims it for this
    ///    instance every [`Delivery::hold_every`].
    async fn hold(&mut self, now: Instant) {
        let mut to_hold: HashMap<(usize, QueueName), Vec<AuditId>> = HashMap::new();
        for ((h, q, _), f) in self.flights.iter() {
            if !f.settled && now.duration_since(f.held_at) >= self.hold_every {
                let records = to_hold.entry((*h, q.clone())).or_default();
                if !records.contains(&f.record) {
                    records.push(f.record);
                }
            }
        }
        for ((h, queue), records) in to_hold {
            match self
                .store
                .audit_hold(&queue, &self.groups[h], &self.options.consumer, &records)
                .await
            {
                Ok(()) => {
                    for ((fh, fq, _), f) in self.flights.iter_mut() {
                        if *fh == h && *fq == queue && records.contains(&f.record) {
                            f.held_at = now;
                        }
                    }
                }
                Err(e) => store_error(&self.hooks[h], &queue, "hold", &e),
            }
        }
    }

    /// 3. Attempts what is due at `now`, [`CONCURRENCY`] at a time.
    fn attempt(&self, now: Instant) -> impl Future<Output = Vec<(Key, Result<(), String>)>> + '_ {
        let due: Vec<(Key, Arc<Vec<u8>>, u32)> = self
            .flights
            .iter()
            .filter(|(_, f)| !f.settled && f.next_at <= now)
            .map(|(k, f)| (k.clone(), f.body.clone(), f.attempts + 1))
            .collect();
        futures::stream::iter(due)
            .map(|(key, body, attempt)| {
                let hook = &self.hooks[key.0];
                let client = &self.clients[key.0];
                async move {
                    let result = attempt_once(client, hook, &key.1, key.2, body, attempt).await;
                    (key, result)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
    }

    /// Counts the attempts' `results`: a delivered entry is settled, a
    /// failed one retried after a backoff or, out of attempts or too old,
    /// given up (a dead letter, settled too).
    fn settle(&mut self, results: Vec<(Key, Result<(), String>)>) {
        for (key, result) in results {
            let hook = &self.hooks[key.0];
            let Some(f) = self.flights.get_mut(&key) else {
                continue;
            };
            f.attempts += 1;
            let labels = |outcome: &'static str| {
                [("hook", hook.name.clone()), ("outcome", outcome.to_owned())]
            };
            match result {
                Ok(()) => {
                    f.settled = true;
                    metrics::counter!("waitroom_webhook_deliveries_total", &labels("ok"))
                        .increment(1);
                }
                Err(why) => {
                    let age = now_ms().saturating_sub(f.entry.id.ms);
                    if f.attempts >= hook.attempts || age >= hook.max_age_ms {
                        f.settled = true;
                        metrics::counter!("waitroom_webhook_deliveries_total", &labels("failed"))
                            .increment(1);
                        tracing::error!(
                            hook = %hook.name, queue = %key.1, id = %key.2, attempts = f.attempts,
                            error = %why, "webhook: given up on an entry (dead letter)"
                        );
                    } else {
                        metrics::counter!("waitroom_webhook_deliveries_total", &labels("retried"))
                            .increment(1);
                        tracing::debug!(hook = %hook.name, id = %key.2, error = %why, "webhook: will retry");
                        f.next_at = Instant::now() + backoff(hook.backoff_ms, f.attempts);
                    }
                }
            }
        }
    }

    /// 4. Acknowledges the records whose entries are all settled; keeps
    ///    what could not be (its acknowledgement is retried, never its
    ///    delivery). A record with an entry still being retried waits for
    ///    it: acknowledged early, a dead instance's retry would be lost.
    async fn acknowledge(&mut self) {
        let mut open: HashMap<(usize, QueueName), Vec<AuditId>> = HashMap::new();
        for ((h, q, _), f) in self.flights.iter() {
            if !f.settled {
                open.entry((*h, q.clone())).or_default().push(f.record);
            }
        }
        let mut to_ack: HashMap<(usize, QueueName), Vec<AuditId>> = HashMap::new();
        for ((h, q, _), f) in self.flights.iter() {
            let group = (*h, q.clone());
            if f.settled && !open.get(&group).is_some_and(|o| o.contains(&f.record)) {
                let records = to_ack.entry(group).or_default();
                if !records.contains(&f.record) {
                    records.push(f.record);
                }
            }
        }
        for ((h, queue), records) in to_ack {
            match self
                .store
                .audit_ack(&queue, &self.groups[h], &records)
                .await
            {
                Ok(()) => self.flights.retain(|(fh, fq, _), f| {
                    !(*fh == h && *fq == queue && records.contains(&f.record))
                }),
                Err(e) => store_error(&self.hooks[h], &queue, "ack", &e),
            }
        }
    }
}

/// The wait before attempt `attempts + 1`: `base`, doubled per failed
/// attempt, at most [`MAX_BACKOFF_MS`], plus up to half of it at random so
/// instances retrying a recovered receiver do not all come back at once.
fn backoff(base_ms: u64, attempts: u32) -> Duration {
    let exp = base_ms
        .saturating_mul(1u64 << attempts.saturating_sub(1).min(20))
        .min(MAX_BACKOFF_MS);
    Duration::from_millis(exp + rand::random_range(0..=exp / 2))
}

/// One POST of one entry; `Ok` on a 2xx.
async fn attempt_once(
    client: &HookClient,
    hook: &WebhookSpec,
    queue: &QueueName,
    id: AuditId,
    body: Arc<Vec<u8>>,
    attempt: u32,
) -> Result<(), String> {
    let unix = now_ms() / 1000;
    let request = hyper::Request::post(hook.url.as_str())
        .header("content-type", "application/json")
        .header("idempotency-key", idempotency_key(queue, id))
        .header(SIGNATURE_HEADER, hook.signature(unix, &body))
        .header("waitroom-attempt", attempt.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from(
            (*body).clone(),
        )))
        .map_err(|e| format!("request: {e}"))?;
    // The whole attempt, connect and TLS included, within the hook's timeout.
    let response = tokio::time::timeout(
        Duration::from_millis(hook.timeout_ms),
        client.request(request),
    )
    .await
    .map_err(|_| format!("no answer within {} ms", hook.timeout_ms))?
    .map_err(|e| describe(&e))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

fn store_error(hook: &WebhookSpec, queue: &QueueName, what: &str, e: &crate::store::StoreError) {
    metrics::counter!("waitroom_webhook_store_errors_total", "hook" => hook.name.clone())
        .increment(1);
    tracing::warn!(hook = %hook.name, %queue, error = %e, "webhook: cannot {what} entries");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_a_cap() {
        for attempts in 1..=30 {
            let d = backoff(100, attempts).as_millis() as u64;
            let exp = (100u64 << (attempts - 1).min(20)).min(MAX_BACKOFF_MS);
            assert!((exp..=exp + exp / 2).contains(&d), "{attempts}: {d}");
        }
    }
}
