//! One open stream's frames: the current state first (with a per-stream
//! jittered `retry:`), then each change, keep-alive comments while idle,
//! until `gone`, the client leaves, or shutdown.
//!
//! The session produces SSE text; the two transports (the lean writer, and
//! a hyper body where a connection cannot be handed over: see
//! `crate::server`) only move bytes. What an event is called and what its
//! JSON says is the HTTP edge's business ([`Render`], given by the events
//! endpoint), so a buyer's state has one wire form for polling and streams.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::mailbox::Ended;
use super::sources::StreamSlot;
use super::view::{Update, View};
use super::{StreamGuard, Subscription};

/// The comment sent on idle streams so proxies and browsers keep them open.
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// How a view goes on the wire: the event's name and its JSON data.
pub trait Render: Send {
    /// The event's name for `view`.
    fn name(&self, view: &View) -> &'static str;
    /// Appends `view`'s JSON data to `out`.
    fn data(&self, view: &View, out: &mut String);
}

/// The frames of one stream.
pub struct StreamSession {
    render: Box<dyn Render>,
    updates: super::mailbox::Receiver,
    _guard: StreamGuard,
    first: Option<Bytes>,
    last_sent: View,
    finished: bool,
    keep_alive: Interval,
    /// When the last frame was made (keep-alives not counted).
    last_frame: Instant,
    drain: Duration,
    /// The stream's slot among its source's, when it holds one.
    slot: Option<StreamSlot>,
}

impl StreamSession {
    /// A session over `sub`, writing views with `render`, asking the client
    /// to wait `retry` before reconnecting and closing within `drain` of
    /// shutdown (the hub tells every stream).
    pub fn new(
        sub: Subscription,
        render: Box<dyn Render>,
        retry: Duration,
        keep_alive: Duration,
        drain: Duration,
    ) -> Self {
        let current = sub.updates.current();
        // A random phase, so streams opened together do not all send their
        // keep-alives in the same instant.
        let phase = keep_alive.mul_f64(rand::random_range(0.1..1.0));
        let mut ticker = tokio::time::interval_at(Instant::now() + phase, keep_alive);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            first: Some(encode(&*render, &current, Some(retry))),
            render,
            finished: matches!(current.view, View::Gone(_)),
            last_sent: current.view,
            updates: sub.updates,
            _guard: sub.guard,
            keep_alive: ticker,
            // The first frame does not hold back the first keep-alive,
            // which keeps its random phase.
            last_frame: Instant::now()
                .checked_sub(keep_alive)
                .unwrap_or_else(Instant::now),
            drain,
            slot: None,
        }
    }

    /// The session holding `slot`: it ends (with a long `retry:`, like a
    /// shed stream) if the slot is taken for a lighter source.
    pub fn holding(mut self, slot: StreamSlot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// The next frame to write, or `None` when the stream is over. Cancel
    /// safe: a transport may race it against reading from the client.
    pub async fn next_frame(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.finished {
            return None;
        }
        let slot = &self.slot;
        let evicted = async move {
            match slot {
                Some(slot) => slot.evicted.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(evicted);
        loop {
            tokio::select! {
                _ = &mut evicted => {
                    self.finished = true;
                    let retry = Duration::from_millis(rand::random_range(20_000..40_000));
                    return Some(shed_frame(retry));
                }
                changed = self.updates.changed() => {
                    match changed {
                        Ok(()) => {}
                        Err(Ended::Closed) => return None,
                        Err(Ended::ShutDown) => {
                            self.finished = true;
                            // Spread closes over the drain window so clients
                            // do not all reconnect to the remaining instances
                            // at once. Boxed: only a shutdown needs its room.
                            let share = rand::random_range(0.0..1.0);
                            Box::pin(tokio::time::sleep(self.drain.mul_f64(share))).await;
                            return None;
                        }
                    }
                    let update = self.updates.borrow_and_update();
                    if update.view == self.last_sent {
                        continue;
                    }
                    self.finished = matches!(update.view, View::Gone(_));
                    let frame = encode(&*self.render, &update, None);
                    self.last_sent = update.view;
                    self.last_frame = Instant::now();
                    return Some(frame);
                }
                _ = self.keep_alive.tick() => {
                    // Only while idle: a frame since moves the next
                    // keep-alive to after it. Checked here, once a period,
                    // rather than re-arming the timer with every frame (a
                    // pass sends thousands of frames at once, and every
                    // re-arm takes the runtime's timer lock).
                    let next = keep_alive_after(self.last_frame, self.keep_alive.period());
                    if next > Instant::now() {
                        self.keep_alive.reset_at(next);
                        continue;
                    }
                    return Some(Bytes::from_static(KEEP_ALIVE));
                }
            }
        }
    }
}

/// When a stream whose last frame went out at `last_frame` next checks for
/// a keep-alive: a random moment in the second half of the `period` after
/// it, so a stream is never silent for longer than `period`.
///
/// Not the end of the period for all: a pass writes to every stream within
/// a fraction of a second, and passes come on a fixed interval, so a
/// keep-alive exactly one period after each stream's last frame would land
/// the whole crowd's keep-alives on a later pass's fan-out (the first pass
/// after admission stood still for a period: as many keep-alives as rank
/// updates to write at once). Spread over half a period, a pass meets a
/// few of them. A later check draws again, never past the period's end.
fn keep_alive_after(last_frame: Instant, period: Duration) -> Instant {
    last_frame + period.mul_f64(rand::random_range(0.5..=1.0))
}

/// A frame that tells the client to come back after `retry`, and nothing
/// else: how an over-capacity instance sheds a stream.
pub fn shed_frame(retry: Duration) -> Bytes {
    Bytes::from(format!(
        "retry: {}\n: over capacity, retry later\n\n",
        retry.as_millis()
    ))
}

/// The SSE text of one update.
pub fn encode(render: &dyn Render, update: &Update, retry: Option<Duration>) -> Bytes {
    thread_local! {
        /// Where frames are written before they are copied out: a pass
        /// encodes a frame for every stream at once, and one exact-sized
        /// copy is one allocation where a growable `String` turned into
        /// `Bytes` is two (the text, and the shared header `Bytes` puts
        /// beside a buffer with room to spare).
        static SCRATCH: std::cell::RefCell<String> = std::cell::RefCell::new(String::with_capacity(512));
    }
    SCRATCH.with_borrow_mut(|text| {
        text.clear();
        if let Some(retry) = retry {
            let _ = writeln!(text, "retry: {}", retry.as_millis());
        }
        let name = render.name(&update.view);
        let _ = write!(text, "event: {name}\nid: {}\ndata: ", update.id);
        render.data(&update.view, text);
        text.push_str("\n\n");
        let frame = Bytes::copy_from_slice(text.as_bytes());
        // A rare huge frame does not keep its room on the thread.
        if text.capacity() > 4096 {
            *text = String::with_capacity(512);
        }
        frame
    })
}

#[cfg(test)]
mod tests {
    use super::super::view::{EventId, GoneReason};
    use super::*;

    /// Stands in for the HTTP edge's wire form.
    struct Wire;

    impl Render for Wire {
        fn name(&self, view: &View) -> &'static str {
            match view {
                View::Waiting { .. } => "waiting",
                View::Ready { .. } => "ready",
                View::Gone(_) => "gone",
                View::PreQueue { .. } => "prequeue",
            }
        }

        fn data(&self, view: &View, out: &mut String) {
            let _ = match view {
                View::Waiting { rank, .. } => write!(out, "{{\"rank\":{rank}}}"),
                View::Ready { .. } => write!(out, "{{}}"),
                View::Gone(reason) => write!(out, "{{\"reason\":\"{}\"}}", reason.as_str()),
                View::PreQueue { status, .. } => write!(out, "{status}"),
            };
        }
    }

    #[test]
    fn frames_are_sse() {
        let update = Update {
            id: EventId { pass: 4, n: 2 },
            view: View::Waiting {
                rank: 9,
                total: 30,
                eta: Some(1),
                range: None,
                held: false,
            },
        };
        let text = encode(&Wire, &update, Some(Duration::from_millis(2500)));
        assert_eq!(
            text,
            "retry: 2500\nevent: waiting\nid: 4.2\ndata: {\"rank\":9}\n\n"
        );
        let gone = encode(
            &Wire,
            &Update {
                id: EventId { pass: 5, n: 0 },
                view: View::Gone(GoneReason::Left),
            },
            None,
        );
        assert_eq!(gone, "event: gone\nid: 5\ndata: {\"reason\":\"left\"}\n\n");
        assert!(shed_frame(Duration::from_secs(30)).starts_with(b"retry: 30000\n:"));
    }

    /// Streams that got one pass's frame at the same moment send their next
    /// keep-alives spread over the second half of the period after it, none
    /// later than the period: not all together on a later pass's fan-out.
    /// Real time, a one-second period (the shortest allowed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alives_after_a_pass_spread_over_half_a_period() {
        use std::sync::{Arc, Mutex};

        use crate::queue::{Forecast, QueueName, Snapshot, Standing, UserId};
        use crate::store::{Pass, QueueEvent, StoreEvent};

        const STREAMS: u64 = 200;
        let period = Duration::from_secs(1);
        let queue = QueueName::parse("q").unwrap();
        let hub = Arc::new(super::super::Hub::new(std::slice::from_ref(&queue)));
        /// (when, keep-alive or not) of every frame, per stream.
        type Frames = Vec<Vec<(Instant, bool)>>;
        let seen: Arc<Mutex<Frames>> = Arc::new(Mutex::new(vec![Vec::new(); STREAMS as usize]));
        for i in 0..STREAMS {
            let snapshot = Snapshot {
                standing: Standing::Waiting {
                    rank: i,
                    seq: i + 1,
                },
                total_waiting: STREAMS,
                entered_at_ms: None,
                pass: 1,
                entry: Some(i + 1),
                sold_out: false,
                paused: false,
                entries_issued: None,
            };
            let view = super::super::view_of(&snapshot, Forecast::at_rate(1.0)).unwrap();
            let user = UserId::parse(&format!("u{i}")).unwrap();
            let seen_before = hub.events_seen(&queue);
            let sub = hub.register(&queue, &user, &snapshot, view, seen_before, None);
            let mut session =
                StreamSession::new(sub, Box::new(Wire), Duration::from_secs(1), period, period);
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(frame) = session.next_frame().await {
                    let keep_alive = &frame[..] == KEEP_ALIVE;
                    seen.lock().unwrap()[i as usize].push((Instant::now(), keep_alive));
                }
            });
        }
        // Past every stream's first keep-alive (a random phase in a period).
        tokio::time::sleep(period + Duration::from_millis(200)).await;
        let pass = Pass {
            pass: 2,
            at: 0,
            admitted: Vec::new(),
            abandoned: Vec::new(),
            waiting: STREAMS + 1,
            busy: true,
            held: false,
        };
        let event = StoreEvent::Queue {
            queue: queue.clone(),
            event: QueueEvent::Pass(pass),
        };
        hub.on_event(event, 1.0).await;
        // Room for a loaded machine's late timers past the period.
        tokio::time::sleep(period * 5 / 2).await;

        let seen = seen.lock().unwrap();
        let mut per_tenth = std::collections::BTreeMap::new();
        for (i, frames) in seen.iter().enumerate() {
            // The stream's first state, then the pass's frame.
            let mut updates = frames.iter().enumerate().filter(|(_, (_, ka))| !ka);
            let (at, (passed, _)) = updates.nth(1).expect("the pass's frame");
            let &(next, keep_alive) = frames.get(at + 1).expect("a frame after the pass's");
            assert!(keep_alive, "stream {i}: nothing else changed");
            let silent = next - *passed;
            assert!(
                silent >= period / 2 - Duration::from_millis(50)
                    && silent <= period + Duration::from_millis(500),
                "stream {i}: silent {silent:?} after the pass"
            );
            *per_tenth.entry(silent.as_millis() / 100).or_insert(0) += 1;
        }
        // Spread: at exactly one period after the pass, all of them would
        // fall in one tenth of a second. A loaded machine's late timers
        // pile some into the last tenths (half of them in one was seen in
        // CI), so the bound is three quarters, over at least three tenths.
        let busiest = per_tenth.values().max().copied().unwrap_or(0);
        assert!(
            busiest <= STREAMS as usize * 3 / 4 && per_tenth.len() >= 3,
            "keep-alives bunched (tenths of a second: streams): {per_tenth:?}"
        );
    }
}
