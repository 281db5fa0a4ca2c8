//! The registry's tests: ranks moved by events alone stay exact through
//! passes, leaves, folds and re-reads, and each stream is told its change
//! once.

use super::*;
use crate::push::mailbox;
use crate::push::view::{EventId, Update};
use crate::queue::EntryToken;
use crate::store::{Abandoned, Admitted};

fn at(rate: f64) -> Forecast {
    Forecast::at_rate(rate)
}

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
        entries_issued: None,
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
        entries_issued: None,
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
        entries_issued: None,
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
        entries_issued: None,
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
                            entries_issued: None,
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
        entries_issued: None,
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
        entries_issued: None,
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
        entries_issued: None,
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
