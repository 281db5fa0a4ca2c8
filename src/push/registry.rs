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
    /// The pass whose removals `rank` already counts (from the snapshot the
    /// stream started with, an exact re-read, or an applied pass), so a pass
    /// event arriving after a read that saw it is not counted twice.
    pub synced_pass: u64,
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
    /// Applies a queue event to every stream it concerns. Rank changes from
    /// leaves are shown with the next pass, which every queue with someone
    /// waiting publishes each interval.
    pub fn apply(&mut self, event: &QueueEvent, rate: f64) {
        match event {
            QueueEvent::Pass(pass) => {
                self.apply_admissions(pass);
                self.apply_ranks(pass, rate);
            }
            QueueEvent::Left { user, seq } => {
                for (u, w) in self.by_user.iter_mut() {
                    if w.is_gone() {
                        continue;
                    }
                    if u.as_str() == user {
                        w.show(w.id.pass, View::Gone(GoneReason::Left));
                    } else if let (Some(seq), true) = (seq, w.is_waiting()) {
                        // Counted now, shown with the next pass: in a busy
                        // sale people leave all the time, and a frame to
                        // every stream per leave would swamp the streams.
                        if w.seq > *seq {
                            w.rank = w.rank.saturating_sub(1);
                        }
                        w.total = w.total.saturating_sub(1);
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

    /// A pass's first half: `ready` to the admitted, `gone` to the dropped.
    /// The hub sends these before the rank updates, which go to everyone.
    pub fn apply_admissions(&mut self, pass: &Pass) {
        for a in &pass.admitted {
            if let Some(w) = UserId::parse(&a.user)
                .ok()
                .and_then(|u| self.by_user.get_mut(&u))
            {
                // A refresh may have shown this token already, between the
                // pass committing and its event arriving: send it once.
                if matches!(&w.view(), View::Ready { token, .. } if *token == a.token) {
                    continue;
                }
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
    }

    /// A pass's second half: every waiting stream moves up by the removals
    /// ahead of it.
    pub fn apply_ranks(&mut self, pass: &Pass, rate: f64) {
        let mut removed: Vec<u64> = pass
            .admitted
            .iter()
            .map(|a| a.seq)
            .chain(pass.abandoned.iter().map(|a| a.seq))
            .collect();
        removed.sort_unstable();
        for w in self.by_user.values_mut() {
            if !w.is_waiting() {
                continue;
            }
            if w.synced_pass < pass.pass {
                let ahead_removed = removed.partition_point(|&s| s < w.seq) as u64;
                w.rank = w.rank.saturating_sub(ahead_removed);
                w.synced_pass = pass.pass;
            }
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
        if snapshot.pass < w.synced_pass {
            w.next_refresh = Instant::now();
            return;
        }
        match &snapshot.standing {
            Standing::Waiting { rank, seq } => {
                w.seq = *seq;
                w.synced_pass = snapshot.pass;
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
                        admitted_at: None,
                    };
                    w.show(snapshot.pass, view);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::EntryToken;
    use crate::store::{Abandoned, Admitted};

    fn watcher(seq: u64, rank: u64) -> (Watcher, watch::Receiver<Update>) {
        let view = View::Waiting {
            rank,
            total: 10,
            eta: None,
        };
        let (tx, rx) = watch::channel(Update {
            id: EventId { pass: 1, n: 0 },
            view,
        });
        let w = Watcher {
            conn: 1,
            tx,
            seq,
            rank,
            total: 10,
            id: EventId { pass: 1, n: 0 },
            synced_pass: 1,
            next_refresh: Instant::now(),
        };
        (w, rx)
    }

    fn pass(
        n: u64,
        admitted: Vec<(&str, u64, &str)>,
        abandoned: Vec<(&str, u64)>,
        waiting: u64,
    ) -> QueueEvent {
        QueueEvent::Pass(Pass {
            pass: n,
            at: 1_000,
            admitted: admitted
                .into_iter()
                .map(|(u, seq, t)| Admitted {
                    user: u.into(),
                    seq,
                    token: t.into(),
                    ttl_ms: 60_000,
                })
                .collect(),
            abandoned: abandoned
                .into_iter()
                .map(|(u, seq)| Abandoned {
                    user: u.into(),
                    seq,
                })
                .collect(),
            waiting,
            busy: true,
        })
    }

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn removals_ahead_move_a_stream_up_exactly() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(10, 5);
        q.by_user.insert(u("me"), w);
        // Two admitted ahead, one abandoned ahead, one abandoned behind.
        q.apply(
            &pass(
                2,
                vec![("a", 3, "t1"), ("b", 4, "t2")],
                vec![("c", 7), ("d", 12)],
                6,
            ),
            1.0,
        );
        assert!(rx.has_changed().unwrap());
        let update = rx.borrow_and_update().clone();
        assert_eq!(
            update.view,
            View::Waiting {
                rank: 2,
                total: 6,
                eta: Some(2)
            }
        );
        assert_eq!(update.id.to_string(), "2");
        q.apply(
            &QueueEvent::Left {
                user: "x".into(),
                seq: Some(11),
            },
            1.0,
        );
        q.apply(
            &QueueEvent::Left {
                user: "y".into(),
                seq: Some(9),
            },
            1.0,
        );
        assert!(
            !rx.has_changed().unwrap(),
            "leaves are shown with the next pass"
        );
        q.apply(&pass(3, vec![], vec![], 4), 1.0);
        let update = rx.borrow_and_update().clone();
        assert_eq!(
            update.view,
            View::Waiting {
                rank: 1,
                total: 4,
                eta: Some(1)
            }
        );
        assert_eq!(update.id.to_string(), "3");
    }

    #[test]
    fn a_token_shown_by_a_refresh_is_not_sent_again_by_its_pass() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(3, 0);
        q.by_user.insert(u("me"), w);
        let token = EntryToken::generate();
        let snapshot = Snapshot {
            standing: Standing::Ready {
                token: token.clone(),
                expires_in_ms: 60_000,
            },
            total_waiting: 0,
            entered_at_ms: None,
            pass: 2,
            entry: Some(3),
        };
        q.apply_snapshot(&u("me"), &snapshot, 1.0);
        assert!(matches!(rx.borrow_and_update().view, View::Ready { .. }));
        q.apply(&pass(2, vec![("me", 3, token.as_str())], vec![], 0), 1.0);
        assert!(!rx.has_changed().unwrap(), "ready sent twice");
    }

    #[test]
    fn a_pass_already_seen_by_a_refresh_is_not_counted_twice() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(10, 5);
        q.by_user.insert(u("me"), w);
        // The re-read ran after pass 2 committed (rank 3), before its event.
        let fresh = Snapshot {
            standing: Standing::Waiting { rank: 3, seq: 10 },
            total_waiting: 8,
            entered_at_ms: None,
            pass: 2,
            entry: Some(10),
        };
        q.apply_snapshot(&u("me"), &fresh, 1.0);
        q.apply(
            &pass(2, vec![("a", 1, "t1"), ("b", 2, "t2")], vec![], 8),
            1.0,
        );
        assert_eq!(q.by_user[&u("me")].rank, 3);
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 3, .. }
        ));
        q.apply(&pass(3, vec![("c", 4, "t3")], vec![], 7), 1.0);
        assert_eq!(q.by_user[&u("me")].rank, 2);
    }

    #[test]
    fn a_stale_refresh_is_not_applied() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(10, 5);
        q.by_user.insert(u("me"), w);
        q.apply(&pass(3, vec![("a", 1, "t")], vec![], 9), 1.0);
        rx.borrow_and_update();
        let stale = Snapshot {
            standing: Standing::Waiting { rank: 5, seq: 10 },
            total_waiting: 10,
            entered_at_ms: None,
            pass: 2,
            entry: Some(10),
        };
        q.apply_snapshot(&u("me"), &stale, 1.0);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(q.by_user[&u("me")].rank, 4);
    }
}
