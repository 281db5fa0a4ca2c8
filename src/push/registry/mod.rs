//! The registry of this instance's open streams, one per (queue, user),
//! and how queue events change what each stream shows.
//!
//! Ranks move with the events alone: every removal from the line (admitted,
//! abandoned, left) is published with its arrival sequence, so a stream
//! behind it moves up by exactly one. Exact re-reads from the store
//! ([`QueueWatchers::apply_snapshot`], scheduled by [`refresh_period`] and
//! run by the refresh loop in `push`) only heal what an interruption lost.
//!
//! A leave costs O(log L), L the leaves since the last pass, however many
//! streams are open: its sequence goes into an order-statistic set, and a
//! stream's rank is its stored rank less the leavers ahead of it in that
//! set (one `rank` query). The next pass, which walks every stream anyway to
//! show the new ranks, folds the set into the stored ranks and empties it.
//! Leaves are shown with that pass in any case: in a busy sale people leave
//! all the time, and a frame to every stream per leave would swamp them. If
//! no pass comes for a long time, the set is folded once it holds
//! [`FOLD_AT`] leaves, one walk per that many leaves.

#[cfg(test)]
mod tests;
mod watcher;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::view::{GoneReason, View};
use crate::queue::{Forecast, Snapshot, Standing, UserId};
use crate::store::{Pass, QueueEvent};

pub(super) use watcher::Watcher;
pub use watcher::{pre_queue_refresh, refresh_period, view_of};

/// Pending leaves that make the registry fold them into every stream's
/// stored rank without waiting for a pass (which comes every admission
/// interval while anyone waits, so this is for long intervals and holds).
pub const FOLD_AT: usize = 16_384;

/// The streams of one queue.
pub(super) struct QueueWatchers {
    pub by_user: HashMap<UserId, Watcher>,
    /// Arrival sequences of those who left since the last pass or fold, not
    /// yet taken off the stored ranks.
    left: indexset::BTreeSet<u64>,
    fold_at: usize,
    /// A lottery draw of this queue was heard: a pre-queue stream whose
    /// buyer is not in line after it has left the pre-queue.
    drawn: bool,
}

impl Default for QueueWatchers {
    fn default() -> Self {
        Self {
            by_user: HashMap::new(),
            left: indexset::BTreeSet::new(),
            fold_at: FOLD_AT,
            drawn: false,
        }
    }
}

/// Pending leavers ahead of arrival sequence `seq`.
fn leaves_ahead(left: &indexset::BTreeSet<u64>, seq: u64) -> u64 {
    if left.is_empty() {
        0
    } else {
        left.rank(&seq) as u64
    }
}

impl QueueWatchers {
    /// The rank `w` has now: its stored rank less the pending leaves ahead.
    #[cfg(test)]
    pub fn rank_of(&self, w: &Watcher) -> u64 {
        w.rank.saturating_sub(leaves_ahead(&self.left, w.seq))
    }

    /// Adds a stream whose rank was read with every pending leave already
    /// gone from the line (they were counted here before the read); a
    /// previous stream of the same user is returned.
    pub fn insert(&mut self, user: UserId, mut watcher: Watcher) -> Option<Watcher> {
        watcher.rank += leaves_ahead(&self.left, watcher.seq);
        self.by_user.insert(user, watcher)
    }

    /// Takes the pending leaves off every waiting stream's stored rank.
    fn fold(&mut self) {
        let left = std::mem::take(&mut self.left);
        for w in self.by_user.values_mut() {
            if w.is_waiting() {
                w.rank = w.rank.saturating_sub(leaves_ahead(&left, w.seq));
            }
        }
    }

    /// Applies a queue event to every stream it concerns. Rank changes from
    /// leaves are shown with the next pass, which every queue with someone
    /// waiting publishes each interval.
    pub fn apply(&mut self, event: &QueueEvent, forecast: Forecast) {
        match event {
            QueueEvent::Pass(pass) => {
                self.apply_admissions(pass);
                self.apply_ranks(pass, forecast);
            }
            QueueEvent::Left { user, seq } => {
                if let Some(w) = self.by_user.get_mut(user)
                    && !w.is_gone()
                {
                    w.show(w.id.pass, View::Gone(GoneReason::Left));
                }
                if let Some(seq) = seq {
                    self.left.insert(*seq);
                    if self.left.len() >= self.fold_at {
                        self.fold();
                    }
                }
            }
            // Nobody waiting is concerned: the hub counts it.
            QueueEvent::FastTracked { .. } => {}
            QueueEvent::Consumed { user } => {
                if let Some(w) = self.by_user.get_mut(user) {
                    w.show(w.id.pass, View::Gone(GoneReason::Consumed));
                }
            }
            QueueEvent::SoldOut => {
                // Everyone still in line; token holders keep their tokens.
                for w in self.by_user.values_mut() {
                    if w.is_waiting() {
                        w.show(w.id.pass, View::Gone(GoneReason::SoldOut));
                    }
                }
            }
            QueueEvent::Rescheduled { opens_at } => {
                for w in self.by_user.values_mut() {
                    let status = w.tx.with(|u| match &u.view {
                        View::PreQueue { status, .. } => Some(status.clone()),
                        _ => None,
                    });
                    if let Some(status) = status {
                        let view = View::PreQueue {
                            status,
                            opens_at: *opens_at,
                        };
                        w.show(w.id.pass, view);
                    }
                }
            }
            QueueEvent::Drawn => {
                // The event says only that the line holds the draw: each
                // pre-queue stream reads its own place at the next refresh
                // tick (one batched read, within a fifth of a second).
                self.drawn = true;
                let now = Instant::now();
                for w in self.by_user.values_mut() {
                    if w.is_pre_queue() {
                        w.next_refresh = now;
                    }
                }
            }
        }
    }

    /// A pass's first half: `ready` to the admitted, `gone` to the dropped.
    /// The hub sends these before the rank updates, which go to everyone.
    pub fn apply_admissions(&mut self, pass: &Pass) {
        for a in &pass.admitted {
            if let Some(w) = self.by_user.get_mut(&a.user) {
                // A refresh may have shown this token already, between the
                // pass committing and its event arriving: send it once.
                if matches!(&w.view(), View::Ready { token, .. } if *token == a.token) {
                    continue;
                }
                let view = View::Ready {
                    token: a.token.clone(),
                    expires_at: Instant::now() + Duration::from_millis(a.ttl_ms),
                    total: pass.waiting,
                    admitted_at: Some(pass.at),
                };
                w.next_refresh =
                    Instant::now() + Duration::from_millis(a.ttl_ms) + Duration::from_millis(250);
                w.show(pass.pass, view);
            }
        }
        for a in &pass.abandoned {
            if let Some(w) = self.by_user.get_mut(&a.user) {
                w.show(pass.pass, View::Gone(GoneReason::Abandoned));
            }
        }
    }

    /// A pass's second half: every waiting stream moves up by the removals
    /// ahead of it, the pass's and the leaves' since the last one.
    pub fn apply_ranks(&mut self, pass: &Pass, forecast: Forecast) {
        let mut removed: Vec<u64> = pass
            .admitted
            .iter()
            .map(|a| a.seq)
            .chain(pass.abandoned.iter().map(|a| a.seq))
            .collect();
        removed.sort_unstable();
        let left = std::mem::take(&mut self.left);
        // Front of the line first: those about to be admitted watch their
        // place most closely, and the streams woken first write first.
        let mut waiting: Vec<&mut Watcher> = self
            .by_user
            .values_mut()
            .filter(|w| w.is_waiting())
            .collect();
        waiting.sort_unstable_by_key(|w| w.rank);
        for w in waiting {
            // Leaves are not tied to a pass: whatever a re-read saw of them
            // was already taken into the stored rank (`apply_snapshot`).
            w.rank = w.rank.saturating_sub(leaves_ahead(&left, w.seq));
            if w.synced_pass < pass.pass {
                let ahead_removed = removed.partition_point(|&s| s < w.seq) as u64;
                w.rank = w.rank.saturating_sub(ahead_removed);
                w.synced_pass = pass.pass;
            }
            w.total = pass.waiting;
            let view = w.waiting_view(w.rank, forecast);
            w.show(pass.pass, view);
        }
    }

    /// Applies an exact re-read of one user's standing.
    pub fn apply_snapshot(&mut self, user: &UserId, snapshot: &Snapshot, forecast: Forecast) {
        let Some(w) = self.by_user.get_mut(user) else {
            return;
        };
        if w.is_gone() {
            return;
        }
        // A pass applied after this read was taken is newer than the read.
        if snapshot.pass < w.synced_pass {
            w.next_refresh = Instant::now();
            return;
        }
        match &snapshot.standing {
            // A re-read is how a stream that missed the event learns it.
            Standing::Waiting { .. } if snapshot.sold_out => {
                w.show(snapshot.pass, View::Gone(GoneReason::SoldOut));
            }
            Standing::Waiting { rank, seq } => {
                let current = w.rank.saturating_sub(leaves_ahead(&self.left, w.seq));
                // Never show the rank going up; an optimistic estimate
                // catches up as the line moves.
                let rank = if w.is_waiting() {
                    (*rank).min(current)
                } else {
                    *rank
                };
                w.seq = *seq;
                w.synced_pass = snapshot.pass;
                // Stored with the pending leaves ahead added back: the next
                // pass takes them all off again.
                w.rank = rank + leaves_ahead(&self.left, w.seq);
                w.total = snapshot.total_waiting;
                w.next_refresh = Instant::now() + refresh_period(rank);
                // The re-read says whether admission is held now.
                let view = w.waiting_view(rank, forecast.with_held(snapshot.paused));
                w.show(snapshot.pass, view);
            }
            Standing::Ready {
                token,
                expires_in_ms,
            } => {
                let expires_at = Instant::now() + Duration::from_millis(*expires_in_ms);
                w.next_refresh = expires_at + Duration::from_millis(250);
                // The same token is already shown (a claim may have extended
                // its life): nothing new for the buyer.
                let shown =
                    matches!(&w.view(), View::Ready { token: t, .. } if t == token.as_str());
                if !shown {
                    let view = View::Ready {
                        token: token.as_str().to_owned(),
                        expires_at,
                        total: snapshot.total_waiting,
                        admitted_at: None,
                    };
                    w.show(snapshot.pass, view);
                }
            }
            // Not drawn yet: still in the pre-queue (the line knows nothing
            // of it). After the draw, one not in line has left it.
            Standing::NotEntered if w.is_pre_queue() && !self.drawn => {
                w.next_refresh = Instant::now() + pre_queue_refresh();
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
