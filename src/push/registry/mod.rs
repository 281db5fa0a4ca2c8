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

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::mailbox;
use super::view::{EventId, GoneReason, Update, View};
use crate::queue::{Forecast, Snapshot, Standing, UserId};
use crate::store::{Pass, QueueEvent};

/// One open stream.
pub(super) struct Watcher {
    pub conn: u64,
    pub tx: mailbox::Sender,
    /// Arrival sequence while waiting (orders removals before/after us).
    pub seq: u64,
    /// Best known rank while waiting, before the pending leaves ahead of it
    /// are taken off ([`QueueWatchers::rank_of`] gives the rank itself).
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
        self.tx.view()
    }

    pub fn is_gone(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::Gone(_)))
    }

    pub fn is_waiting(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::Waiting { .. }))
    }

    pub fn is_pre_queue(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::PreQueue { .. }))
    }

    /// Shows `view` as of `pass` if it differs from what is shown.
    pub fn show(&mut self, pass: u64, view: View) {
        let id = &mut self.id;
        self.tx.send_if(|shown| {
            if shown.view == view {
                return None;
            }
            *id = id.next(pass);
            Some(Update { id: *id, view })
        });
    }

    /// What a waiting stream at `rank` shows.
    fn waiting_view(&self, rank: u64, forecast: Forecast) -> View {
        View::Waiting {
            rank,
            total: self.total.max(rank + 1),
            eta: forecast.wait_secs(rank),
            range: forecast.wait_range(rank),
            held: forecast.is_held(),
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

/// The initial view for a snapshot (`None`: nothing to stream); a buyer in
/// line for a sold-out queue is told so at once.
pub fn view_of(snapshot: &Snapshot, forecast: Forecast) -> Option<View> {
    match &snapshot.standing {
        Standing::Waiting { .. } if snapshot.sold_out => Some(View::Gone(GoneReason::SoldOut)),
        Standing::Waiting { rank, .. } => {
            let forecast = forecast.with_held(snapshot.paused);
            Some(View::Waiting {
                rank: *rank,
                total: snapshot.total_waiting,
                eta: forecast.wait_secs(*rank),
                range: forecast.wait_range(*rank),
                held: forecast.is_held(),
            })
        }
        Standing::Ready {
            token,
            expires_in_ms,
        } => Some(View::Ready {
            token: token.as_str().to_owned(),
            expires_at: Instant::now() + Duration::from_millis(*expires_in_ms),
            total: snapshot.total_waiting,
            admitted_at: None,
        }),
        Standing::NotEntered => None,
    }
}

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

/// How long until a pre-queue stream is re-read without a draw event: only
/// a safety net for an event lost in an interruption (the resync re-reads
/// every stream anyway), so rare, and jittered so a large pre-queue does
/// not come due in one wave.
pub fn pre_queue_refresh() -> Duration {
    Duration::from_millis(rand::random_range(20_000..40_000))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rate: f64) -> Forecast {
        Forecast::at_rate(rate)
    }
    use crate::queue::EntryToken;
    use crate::store::{Abandoned, Admitted};

    fn watcher(seq: u64, rank: u64) -> (Watcher, mailbox::Receiver) {
        let view = View::Waiting {
            rank,
            total: 10,
            eta: None,
            range: None,
            held: false,
        };
        let (tx, rx) = mailbox::channel(Update {
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
                .map(|(user, seq, t)| Admitted {
                    user: u(user),
                    seq,
                    token: t.into(),
                    ttl_ms: 60_000,
                })
                .collect(),
            abandoned: abandoned
                .into_iter()
                .map(|(user, seq)| Abandoned { user: u(user), seq })
                .collect(),
            waiting,
            busy: true,
            held: false,
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
            at(1.0),
        );
        assert!(rx.has_changed().unwrap());
        let update = rx.borrow_and_update().clone();
        assert_eq!(
            update.view,
            View::Waiting {
                rank: 2,
                total: 6,
                eta: Some(2),
                range: None,
                held: false,
            }
        );
        assert_eq!(update.id.to_string(), "2");
        q.apply(
            &QueueEvent::Left {
                user: u("x"),
                seq: Some(11),
            },
            at(1.0),
        );
        q.apply(
            &QueueEvent::Left {
                user: u("y"),
                seq: Some(9),
            },
            at(1.0),
        );
        assert!(
            !rx.has_changed().unwrap(),
            "leaves are shown with the next pass"
        );
        q.apply(&pass(3, vec![], vec![], 4), at(1.0));
        let update = rx.borrow_and_update().clone();
        assert_eq!(
            update.view,
            View::Waiting {
                rank: 1,
                total: 4,
                eta: Some(1),
                range: None,
                held: false,
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
            sold_out: false,
            paused: false,
        };
        q.apply_snapshot(&u("me"), &snapshot, at(1.0));
        assert!(matches!(rx.borrow_and_update().view, View::Ready { .. }));
        q.apply(
            &pass(2, vec![("me", 3, token.as_str())], vec![], 0),
            at(1.0),
        );
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
            sold_out: false,
            paused: false,
        };
        q.apply_snapshot(&u("me"), &fresh, at(1.0));
        q.apply(
            &pass(2, vec![("a", 1, "t1"), ("b", 2, "t2")], vec![], 8),
            at(1.0),
        );
        assert_eq!(q.by_user[&u("me")].rank, 3);
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 3, .. }
        ));
        q.apply(&pass(3, vec![("c", 4, "t3")], vec![], 7), at(1.0));
        assert_eq!(q.by_user[&u("me")].rank, 2);
    }

    #[test]
    fn a_stale_refresh_is_not_applied() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(10, 5);
        q.by_user.insert(u("me"), w);
        q.apply(&pass(3, vec![("a", 1, "t")], vec![], 9), at(1.0));
        rx.borrow_and_update();
        let stale = Snapshot {
            standing: Standing::Waiting { rank: 5, seq: 10 },
            total_waiting: 10,
            entered_at_ms: None,
            pass: 2,
            entry: Some(10),
            sold_out: false,
            paused: false,
        };
        q.apply_snapshot(&u("me"), &stale, at(1.0));
        assert!(!rx.has_changed().unwrap());
        assert_eq!(q.by_user[&u("me")].rank, 4);
    }

    fn left(user: &str, seq: u64) -> QueueEvent {
        QueueEvent::Left {
            user: u(user),
            seq: Some(seq),
        }
    }

    #[test]
    fn leaves_touch_no_other_stream() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(5_000, 4_000);
        q.insert(u("me"), w);
        let (w, mut behind_rx) = watcher(9_000, 7_000);
        q.insert(u("behind"), w);
        // 3,000 leave: 1,000 ahead of both, 2,000 between the two.
        for seq in (1_000..2_000).chain(6_000..8_000) {
            q.apply(&left(&format!("x{seq}"), seq), at(1.0));
        }
        assert_eq!(q.by_user[&u("me")].rank, 4_000, "stored rank untouched");
        assert_eq!(q.by_user[&u("behind")].rank, 7_000, "stored rank untouched");
        assert!(!rx.has_changed().unwrap() && !behind_rx.has_changed().unwrap());
        assert_eq!(q.rank_of(&q.by_user[&u("me")]), 3_000);
        assert_eq!(q.rank_of(&q.by_user[&u("behind")]), 4_000);
        q.apply(&pass(2, vec![], vec![], 4_500), at(1.0));
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 3_000, .. }
        ));
        assert!(matches!(
            behind_rx.borrow_and_update().view,
            View::Waiting { rank: 4_000, .. }
        ));
        assert!(q.left.is_empty(), "a pass folds the leaves");
    }

    #[test]
    fn a_leaver_is_told_and_its_leave_counts_for_those_behind() {
        let mut q = QueueWatchers::default();
        let (w, mut gone_rx) = watcher(3, 2);
        q.insert(u("leaver"), w);
        let (w, _rx) = watcher(7, 5);
        q.insert(u("me"), w);
        q.apply(&left("leaver", 3), at(1.0));
        assert_eq!(
            gone_rx.borrow_and_update().view,
            View::Gone(GoneReason::Left)
        );
        assert_eq!(q.rank_of(&q.by_user[&u("me")]), 4);
    }

    #[test]
    fn a_stream_opened_or_refreshed_between_leaves_and_the_pass_counts_them_once() {
        let mut q = QueueWatchers::default();
        q.apply(&left("a", 1), at(1.0));
        q.apply(&left("b", 2), at(1.0));
        // Read after both leaves: rank 3 already leaves them out.
        let (w, mut rx) = watcher(10, 3);
        q.insert(u("new"), w);
        let (w, _) = watcher(20, 12);
        q.insert(u("old"), w);
        // "old" was stored as rank 12 with both leaves counted; a re-read
        // after them says 10, i.e. the same.
        q.apply(&left("c", 15), at(1.0));
        let fresh = Snapshot {
            standing: Standing::Waiting { rank: 9, seq: 20 },
            total_waiting: 30,
            entered_at_ms: None,
            entry: Some(20),
            sold_out: false,
            paused: false,
            pass: 1,
        };
        q.apply_snapshot(&u("old"), &fresh, at(1.0));
        assert_eq!(q.rank_of(&q.by_user[&u("old")]), 9);
        q.apply(&left("d", 5), at(1.0));
        q.apply(&pass(2, vec![], vec![], 20), at(1.0));
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 2, .. }
        ));
        assert_eq!(q.by_user[&u("old")].rank, 8);
    }

    /// A line of users, some streaming, run through random leaves, passes
    /// (admissions and abandonments), re-reads and new streams: after every
    /// pass each stream shows exactly its place in the line.
    #[test]
    fn ranks_stay_exact_through_mixed_leaves_and_passes() {
        for fold_at in [3, FOLD_AT] {
            let mut q = QueueWatchers {
                fold_at,
                ..QueueWatchers::default()
            };
            let mut line: Vec<(u64, String)> = Vec::new();
            let mut next_seq = 1;
            let mut pass_no = 1;
            let mut rxs = HashMap::new();
            let join = |line: &mut Vec<(u64, String)>, next_seq: &mut u64| {
                let user = format!("u{next_seq}");
                line.push((*next_seq, user.clone()));
                *next_seq += 1;
            };
            for _ in 0..300 {
                join(&mut line, &mut next_seq);
            }
            let rank_in = |line: &Vec<(u64, String)>, user: &str| {
                line.iter().position(|(_, u)| u == user).map(|r| r as u64)
            };
            for step in 0..3_000 {
                match rand::random_range(0..100) {
                    // A leave anywhere in the line.
                    0..=49 if !line.is_empty() => {
                        let (seq, user) = line.remove(rand::random_range(0..line.len()));
                        rxs.remove(&user);
                        q.apply(&left(&user, seq), at(1.0));
                    }
                    50..=59 => join(&mut line, &mut next_seq),
                    // A new stream for someone in line, read now.
                    60..=74 if !line.is_empty() => {
                        let r = rand::random_range(0..line.len());
                        let (seq, user) = line[r].clone();
                        if !q.by_user.contains_key(&u(&user)) {
                            let (mut w, rx) = watcher(seq, r as u64);
                            w.synced_pass = pass_no;
                            q.insert(u(&user), w);
                            rxs.insert(user, rx);
                        }
                    }
                    // An exact re-read of a stream.
                    75..=89 => {
                        let users: Vec<UserId> = q
                            .by_user
                            .iter()
                            .filter(|(_, w)| w.is_waiting())
                            .map(|(u, _)| u.clone())
                            .collect();
                        if !users.is_empty() {
                            let user = &users[rand::random_range(0..users.len())];
                            let rank = rank_in(&line, user.as_str()).unwrap();
                            let seq = line[rank as usize].0;
                            let snapshot = Snapshot {
                                standing: Standing::Waiting { rank, seq },
                                total_waiting: line.len() as u64,
                                entered_at_ms: None,
                                entry: Some(seq),
                                sold_out: false,
                                paused: false,
                                pass: pass_no,
                            };
                            q.apply_snapshot(user, &snapshot, at(1.0));
                        }
                    }
                    // A pass: admit the head, drop someone absent.
                    _ => {
                        pass_no += 1;
                        let admit = rand::random_range(0..3).min(line.len());
                        let admitted: Vec<(u64, String)> = line.drain(..admit).collect();
                        let mut abandoned = Vec::new();
                        if !line.is_empty() && rand::random_bool(0.3) {
                            abandoned.push(line.remove(rand::random_range(0..line.len())));
                        }
                        for (_, user) in admitted.iter().chain(&abandoned) {
                            rxs.remove(user);
                            q.by_user.remove(&u(user));
                        }
                        q.apply(
                            &pass(
                                pass_no,
                                admitted
                                    .iter()
                                    .map(|(s, u)| (u.as_str(), *s, "t"))
                                    .collect(),
                                abandoned.iter().map(|(s, u)| (u.as_str(), *s)).collect(),
                                line.len() as u64,
                            ),
                            at(1.0),
                        );
                        for (user, rx) in &rxs {
                            let want = rank_in(&line, user).unwrap();
                            match &rx.current().view {
                                View::Waiting { rank, .. } => assert_eq!(
                                    *rank, want,
                                    "{user} after pass {pass_no} (step {step}, fold at {fold_at})"
                                ),
                                other => panic!("{user} shows {other:?}"),
                            }
                        }
                    }
                }
            }
        }
    }

    fn waiting_snapshot(rank: u64, seq: u64, total: u64, pass: u64) -> Snapshot {
        Snapshot {
            standing: Standing::Waiting { rank, seq },
            total_waiting: total,
            entered_at_ms: None,
            pass,
            entry: Some(seq),
            sold_out: false,
            paused: false,
        }
    }

    fn ready_snapshot(token: &EntryToken, expires_in_ms: u64, pass: u64) -> Snapshot {
        Snapshot {
            standing: Standing::Ready {
                token: token.clone(),
                expires_in_ms,
            },
            total_waiting: 0,
            entered_at_ms: None,
            pass,
            entry: Some(1),
            sold_out: false,
            paused: false,
        }
    }

    fn not_entered(pass: u64) -> Snapshot {
        Snapshot {
            standing: Standing::NotEntered,
            total_waiting: 0,
            entered_at_ms: None,
            pass,
            entry: None,
            sold_out: false,
            paused: false,
        }
    }

    /// Samples `refresh_period(rank)` and checks it against `base` ±25 %,
    /// spread over that range rather than bunched at one point.
    fn assert_period_around(rank: u64, base: Duration) {
        // Whole milliseconds: the low end may round down by one.
        let (low, high) = (
            base.mul_f64(0.75) - Duration::from_millis(1),
            base.mul_f64(1.25),
        );
        let (mut below, mut above) = (false, false);
        for _ in 0..400 {
            let p = refresh_period(rank);
            assert!(
                low <= p && p <= high,
                "rank {rank}: {p:?} outside {low:?}..={high:?}"
            );
            below |= p < base.mul_f64(0.9);
            above |= p > base.mul_f64(1.1);
        }
        assert!(below && above, "rank {rank}: no jitter around {base:?}");
    }

    #[test]
    fn refresh_periods_keep_their_documented_bounds() {
        // About a second in front (under 100 ahead).
        for rank in [0, 1, 50, 99] {
            assert_period_around(rank, Duration::from_secs(1));
        }
        // Fifteen seconds under 1,000 ahead.
        for rank in [100, 500, 999] {
            assert_period_around(rank, Duration::from_secs(15));
        }
        // From a minute at 1,000 ahead, 10 ms more per place, up to three
        // minutes.
        for rank in [1_000, 5_000, 11_999] {
            assert_period_around(rank, Duration::from_millis(60_000 + 10 * rank));
        }
        for rank in [12_000, 50_000, 10_000_000] {
            assert_period_around(rank, Duration::from_secs(180));
        }
    }

    #[test]
    fn the_initial_view_is_the_snapshot() {
        let waiting = waiting_snapshot(1_500, 9_000, 4_000, 3);
        assert_eq!(
            view_of(&waiting, at(50.0)),
            Some(View::Waiting {
                rank: 1_500,
                total: 4_000,
                eta: Some(30),
                range: None,
                held: false,
            })
        );
        assert_eq!(
            view_of(&waiting, at(0.0)),
            Some(View::Waiting {
                rank: 1_500,
                total: 4_000,
                eta: None,
                range: None,
                held: false,
            })
        );
        let token = EntryToken::generate();
        let before = Instant::now();
        let view = view_of(&ready_snapshot(&token, 60_000, 3), at(50.0));
        let after = Instant::now();
        let Some(View::Ready {
            token: shown,
            expires_at,
            admitted_at,
            ..
        }) = view
        else {
            panic!("{view:?}");
        };
        assert_eq!(shown, token.as_str());
        assert!(before + Duration::from_secs(60) <= expires_at);
        assert!(expires_at <= after + Duration::from_secs(60));
        assert_eq!(admitted_at, None);
        assert_eq!(view_of(&not_entered(3), at(50.0)), None);
    }

    /// The issue this guards: far back no re-read is due for a minute or
    /// more, so only the pass's own event can move the rank.
    #[test]
    fn a_far_back_stream_moves_by_exactly_the_admitted_ahead_within_one_pass() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(20_000, 9_999);
        q.insert(u("me"), w);
        q.apply_snapshot(
            &u("me"),
            &waiting_snapshot(5_000, 20_000, 8_000, 1),
            at(50.0),
        );
        rx.borrow_and_update();
        let due = q.by_user[&u("me")].next_refresh;
        assert!(
            due >= Instant::now() + Duration::from_secs(60),
            "no re-read due"
        );
        // 50 admitted ahead; one dropped ahead, two behind.
        let admitted: Vec<(String, u64)> = (0..50).map(|i| (format!("a{i}"), 15_000 + i)).collect();
        q.apply(
            &pass(
                2,
                admitted
                    .iter()
                    .map(|(u, s)| (u.as_str(), *s, "t"))
                    .collect(),
                vec![("x", 19_999), ("y", 20_001), ("z", 25_000)],
                7_947,
            ),
            at(50.0),
        );
        let update = rx.borrow_and_update().clone();
        assert_eq!(
            update.view,
            View::Waiting {
                rank: 4_949,
                total: 7_947,
                eta: Some(99),
                range: None,
                held: false,
            }
        );
        assert_eq!(update.id, EventId { pass: 2, n: 0 });
        assert_eq!(
            q.by_user[&u("me")].next_refresh,
            due,
            "moved by the event alone"
        );
        q.apply(&pass(3, vec![("b", 19_000, "t")], vec![], 7_946), at(50.0));
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 4_948, .. }
        ));
    }

    #[test]
    fn a_pass_shows_ready_to_the_admitted_and_gone_to_the_dropped_first() {
        let mut q = QueueWatchers::default();
        let (w, mut admitted_rx) = watcher(3, 0);
        q.insert(u("in"), w);
        let (w, mut dropped_rx) = watcher(4, 1);
        q.insert(u("out"), w);
        let (w, mut behind_rx) = watcher(5, 2);
        q.insert(u("behind"), w);
        let QueueEvent::Pass(p) = pass(2, vec![("in", 3, "tok")], vec![("out", 4)], 1) else {
            unreachable!()
        };
        let before = Instant::now();
        q.apply_admissions(&p);
        let after = Instant::now();
        let update = admitted_rx.borrow_and_update().clone();
        let View::Ready {
            token,
            expires_at,
            admitted_at,
            ..
        } = update.view
        else {
            panic!("{:?}", update.view);
        };
        assert_eq!((token.as_str(), admitted_at), ("tok", Some(1_000)));
        assert!(before + Duration::from_secs(60) <= expires_at);
        assert!(expires_at <= after + Duration::from_secs(60));
        assert_eq!(update.id, EventId { pass: 2, n: 0 });
        // Re-read once the token has expired, to tell the buyer.
        let refresh = q.by_user[&u("in")].next_refresh;
        assert!(expires_at < refresh && refresh <= expires_at + Duration::from_secs(1));
        assert_eq!(
            dropped_rx.borrow_and_update().view,
            View::Gone(GoneReason::Abandoned)
        );
        assert!(
            !behind_rx.has_changed().unwrap(),
            "ranks move in the second half"
        );
        q.apply_ranks(&p, at(1.0));
        assert_eq!(
            behind_rx.borrow_and_update().view,
            View::Waiting {
                rank: 0,
                total: 1,
                eta: Some(0),
                range: None,
                held: false,
            }
        );
        assert!(!admitted_rx.has_changed().unwrap() && !dropped_rx.has_changed().unwrap());
    }

    #[test]
    fn the_total_shown_is_never_below_the_position() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(10, 6);
        q.insert(u("me"), w);
        // The pass's count lags what this stream knows of the line.
        q.apply(&pass(2, vec![], vec![], 2), at(1.0));
        assert_eq!(
            rx.borrow_and_update().view,
            View::Waiting {
                rank: 6,
                total: 7,
                eta: Some(6),
                range: None,
                held: false,
            }
        );
    }

    #[test]
    fn a_stream_that_ended_stays_ended() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(3, 2);
        q.insert(u("me"), w);
        q.apply(&QueueEvent::Consumed { user: u("me") }, at(1.0));
        assert_eq!(
            rx.borrow_and_update().view,
            View::Gone(GoneReason::Consumed)
        );
        // Nothing changes what it showed last: not a leave, a re-read, a
        // pass or a late ready.
        q.apply(&left("me", 3), at(1.0));
        q.apply_snapshot(&u("me"), &waiting_snapshot(1, 3, 5, 2), at(1.0));
        q.apply_snapshot(&u("me"), &not_entered(2), at(1.0));
        q.apply(&pass(3, vec![], vec![("c", 1)], 4), at(1.0));
        assert!(!rx.has_changed().unwrap());
        assert_eq!(rx.current().view, View::Gone(GoneReason::Consumed));
    }

    #[test]
    fn a_re_read_of_the_pass_already_counted_heals_the_rank() {
        let mut q = QueueWatchers::default();
        // Shows 40 though the line says 30 (something was lost).
        let (w, mut rx) = watcher(100, 40);
        q.insert(u("me"), w);
        let before = Instant::now();
        q.apply_snapshot(&u("me"), &waiting_snapshot(30, 100, 90, 1), at(1.0));
        assert_eq!(
            rx.borrow_and_update().view,
            View::Waiting {
                rank: 30,
                total: 90,
                eta: Some(30),
                range: None,
                held: false,
            }
        );
        let next = q.by_user[&u("me")].next_refresh;
        assert!(before + Duration::from_millis(750) <= next);
        assert!(next <= Instant::now() + Duration::from_millis(1_250));
        // Far back, the next re-read is minutes away.
        let before = Instant::now();
        q.apply_snapshot(&u("me"), &waiting_snapshot(20, 100, 90, 1), at(1.0));
        let (w, _rx) = watcher(9_000, 2_500);
        q.insert(u("far"), w);
        q.apply_snapshot(&u("far"), &waiting_snapshot(2_000, 9_000, 90, 1), at(1.0));
        let next = q.by_user[&u("far")].next_refresh;
        assert!(before + Duration::from_millis(60_000) <= next, "{next:?}");
        assert!(next <= Instant::now() + Duration::from_millis(100_000));
    }

    #[test]
    fn a_re_read_older_than_the_last_pass_is_due_again_at_once() {
        let mut q = QueueWatchers::default();
        let (mut w, rx) = watcher(100, 40);
        w.synced_pass = 5;
        w.next_refresh = Instant::now() + Duration::from_secs(60);
        q.insert(u("me"), w);
        q.apply_snapshot(&u("me"), &waiting_snapshot(30, 100, 90, 4), at(1.0));
        assert!(!rx.has_changed().unwrap());
        assert!(q.by_user[&u("me")].next_refresh <= Instant::now());
    }

    #[test]
    fn a_re_read_ready_token_is_shown_once_and_its_end_told_apart() {
        let mut q = QueueWatchers::default();
        let (w, mut rx) = watcher(3, 0);
        q.insert(u("me"), w);
        let token = EntryToken::generate();
        let before = Instant::now();
        q.apply_snapshot(&u("me"), &ready_snapshot(&token, 500, 2), at(1.0));
        let after = Instant::now();
        let View::Ready { expires_at, .. } = rx.borrow_and_update().view.clone() else {
            panic!("not ready");
        };
        assert!(before + Duration::from_millis(500) <= expires_at);
        assert!(expires_at <= after + Duration::from_millis(500));
        let refresh = q.by_user[&u("me")].next_refresh;
        assert!(expires_at < refresh && refresh <= expires_at + Duration::from_secs(1));
        // A claim extended the token's life: the same token, nothing new.
        q.apply_snapshot(&u("me"), &ready_snapshot(&token, 90_000, 2), at(1.0));
        assert!(!rx.has_changed().unwrap());
        // Gone within a second of the expiry shown: it expired.
        q.apply_snapshot(&u("me"), &not_entered(2), at(1.0));
        assert_eq!(rx.borrow_and_update().view, View::Gone(GoneReason::Expired));

        // Gone with a minute left: it was used for an order.
        let (w, mut rx) = watcher(4, 0);
        q.insert(u("buyer"), w);
        q.apply_snapshot(&u("buyer"), &ready_snapshot(&token, 60_000, 2), at(1.0));
        q.apply_snapshot(&u("buyer"), &not_entered(2), at(1.0));
        assert_eq!(
            rx.borrow_and_update().view,
            View::Gone(GoneReason::Consumed)
        );

        // Gone while still in line: dropped.
        let (w, mut rx) = watcher(5, 1);
        q.insert(u("waiter"), w);
        q.apply_snapshot(&u("waiter"), &not_entered(2), at(1.0));
        assert_eq!(
            rx.borrow_and_update().view,
            View::Gone(GoneReason::NotEntered)
        );
    }

    #[test]
    fn leaves_fold_into_the_stored_ranks_once_fold_at_pile_up() {
        let mut q = QueueWatchers {
            fold_at: 4,
            ..QueueWatchers::default()
        };
        let (w, mut rx) = watcher(100, 50);
        q.insert(u("me"), w);
        for seq in [10, 20, 30] {
            q.apply(&left(&format!("x{seq}"), seq), at(1.0));
        }
        assert_eq!((q.left.len(), q.by_user[&u("me")].rank), (3, 50));
        q.apply(&left("x200", 200), at(1.0));
        assert!(q.left.is_empty(), "folded at fold_at");
        assert_eq!(q.by_user[&u("me")].rank, 47);
        assert!(!rx.has_changed().unwrap(), "still shown with the next pass");
        q.apply(&pass(2, vec![], vec![], 60), at(1.0));
        assert!(matches!(
            rx.borrow_and_update().view,
            View::Waiting { rank: 47, .. }
        ));
    }
}
