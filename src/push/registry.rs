//! The registry of this instance's open streams, one per (queue, user),
//! and how queue events change what each stream shows.
//!
//! Ranks move with the events alone: every removal from the line (admitted,
//! abandoned, left) is published with its arrival sequence, so a stream
//! behind it moves up by exactly one. Exact re-reads from the store (see
//! `refresh`) only heal what an interruption lost.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::view::{EventId, GoneReason, Update, View};
use crate::queue::{Snapshot, Standing, UserId};
use crate::store::{Pass, QueueEvent};

/// One open stream.
pub(super) struct Watcher {
    pub conn: u64,
    pub tx: watch::Sender<Update>,
    /// Arrival sequence while waiting (orders removals before/after us).
    pub seq: u64,
    /// Best known rank while waiting.
    pub rank: u64,
    pub total: u64,
    pub id: EventId,
    pub next_refresh: Instant,
}

impl Watcher {
    fn view(&self) -> View {
        self.tx.borrow().view.clone()
    }

    pub fn is_gone(&self) -> bool {
        matches!(self.tx.borrow().view, View::Gone(_))
    }

    pub fn is_waiting(&self) -> bool {
        matches!(self.tx.borrow().view, View::Waiting { .. })
    }

    /// Shows `view` as of `pass` if it differs from what is shown.
    pub fn show(&mut self, pass: u64, view: View) {
        if self.view() == view {
            return;
        }
        self.id = self.id.next(pass);
        let _ = self.tx.send_replace(Update { id: self.id, view });
    }

    fn waiting_view(&self, rate: f64) -> View {
        View::Waiting {
            rank: self.rank,
            total: self.total.max(self.rank + 1),
            eta: crate::queue::estimated_wait_secs(self.rank, rate),
        }
    }
}

/// How long until a stream's exact rank is re-read: about a second near
/// the front, growing to three minutes far back, with ±25 % jitter so
/// refreshes spread evenly instead of arriving in waves. Events keep ranks
/// exact between re-reads; these only heal what an interruption lost, so
/// far back, where a rank moves slowly, they can be rare.
pub fn refresh_period(rank: u64) -> Duration {
    let base_ms = match rank {
        0..=99 => 1_000,
        100..=999 => 15_000,
        _ => (60_000 + rank * 10).min(180_000),
    };
    let jitter = rand::random_range(0.75..1.25);
    Duration::from_millis((base_ms as f64 * jitter) as u64)
}

/// The initial view for a snapshot (`None`: nothing to stream).
pub fn view_of(snapshot: &Snapshot, rate: f64) -> Option<View> {
    match &snapshot.standing {
        Standing::Waiting { rank, .. } => Some(View::Waiting {
            rank: *rank,
            total: snapshot.total_waiting,
            eta: crate::queue::estimated_wait_secs(*rank, rate),
        }),
        Standing::Ready {
            token,
            expires_in_ms,
        } => Some(View::Ready {
            token: token.as_str().to_owned(),
            expires_at: Instant::now() + Duration::from_millis(*expires_in_ms),
            admitted_at: None,
        }),
        Standing::NotEntered => None,
    }
}

/// The streams of one queue.
#[derive(Default)]
pub(super) struct QueueWatchers {
    pub by_user: HashMap<UserId, Watcher>,
}

impl QueueWatchers {
    /// Applies a queue event to every stream it concerns.
    pub fn apply(&mut self, event: &QueueEvent, rate: f64) {
        match event {
            QueueEvent::Pass(pass) => self.apply_pass(pass, rate),
            QueueEvent::Left { user, seq } => {
                for (u, w) in self.by_user.iter_mut() {
                    if w.is_gone() {
                        continue;
                    }
                    if u.as_str() == user {
                        w.show(w.id.pass, View::Gone(GoneReason::Left));
                    } else if let (Some(seq), true) = (seq, w.is_waiting()) {
                        if w.seq > *seq {
                            w.rank = w.rank.saturating_sub(1);
                        }
                        w.total = w.total.saturating_sub(1);
                        let view = w.waiting_view(rate);
                        w.show(w.id.pass, view);
                    }
                }
            }
            QueueEvent::Consumed { user } => {
                if let Some(w) = UserId::parse(user)
                    .ok()
                    .and_then(|u| self.by_user.get_mut(&u))
                {
                    w.show(w.id.pass, View::Gone(GoneReason::Consumed));
                }
            }
        }
    }

    fn apply_pass(&mut self, pass: &Pass, rate: f64) {
        let mut removed: Vec<u64> = pass
            .admitted
            .iter()
            .map(|a| a.seq)
            .chain(pass.abandoned.iter().map(|a| a.seq))
            .collect();
        removed.sort_unstable();
        for a in &pass.admitted {
            if let Some(w) = UserId::parse(&a.user)
                .ok()
                .and_then(|u| self.by_user.get_mut(&u))
            {
                let view = View::Ready {
                    token: a.token.clone(),
                    expires_at: Instant::now() + Duration::from_millis(a.ttl_ms),
                    admitted_at: Some(pass.at),
                };
                w.next_refresh =
                    Instant::now() + Duration::from_millis(a.ttl_ms) + Duration::from_millis(250);
                w.show(pass.pass, view);
            }
        }
        for a in &pass.abandoned {
            if let Some(w) = UserId::parse(&a.user)
                .ok()
                .and_then(|u| self.by_user.get_mut(&u))
            {
                w.show(pass.pass, View::Gone(GoneReason::Abandoned));
            }
        }
        for w in self.by_user.values_mut() {
            if !w.is_waiting() {
                continue;
            }
            let ahead_removed = removed.partition_point(|&s| s < w.seq) as u64;
            w.rank = w.rank.saturating_sub(ahead_removed);
            w.total = pass.waiting;
            let view = w.waiting_view(rate);
            w.show(pass.pass, view);
        }
    }

    /// Applies an exact re-read of one user's standing.
    pub fn apply_snapshot(&mut self, user: &UserId, snapshot: &Snapshot, rate: f64) {
        let Some(w) = self.by_user.get_mut(user) else {
            return;
        };
        if w.is_gone() {
            return;
        }
        // A pass applied after this read was taken is newer than the read.
        if snapshot.pass < w.id.pass {
            w.next_refresh = Instant::now();
            return;
        }
        match &snapshot.standing {
            Standing::Waiting { rank, seq } => {
                w.seq = *seq;
                // Never show the rank going up; an optimistic estimate
                // catches up as the line moves.
                w.rank = if w.is_waiting() {
                    (*rank).min(w.rank)
                } else {
                    *rank
                };
                w.total = snapshot.total_waiting;
                w.next_refresh = Instant::now() + refresh_period(w.rank);
                let view = w.waiting_view(rate);
                w.show(snapshot.pass, view);
            }
            Standing::Ready { .. } => {
                if let Some(view) = view_of(snapshot, rate) {
                    if let View::Ready { expires_at, .. } = &view {
                        w.next_refresh = *expires_at + Duration::from_millis(250);
                    }
                    let keep_admitted_at = match (&w.view(), &view) {
                        (View::Ready { token: a, .. }, View::Ready { token: b, .. }) => a == b,
                        _ => false,
                    };
                    if !keep_admitted_at {
                        w.show(snapshot.pass, view);
                    }
                }
            }
            Standing::NotEntered => {
                let reason = match w.view() {
                    View::Ready { expires_at, .. }
                        if expires_at <= Instant::now() + Duration::from_secs(1) =>
                    {
                        GoneReason::Expired
                    }
                    View::Ready { .. } => GoneReason::Consumed,
                    _ => GoneReason::NotEntered,
                };
                w.show(snapshot.pass, View::Gone(reason));
            }
        }
    }
}
