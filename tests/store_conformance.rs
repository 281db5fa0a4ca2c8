//! The store conformance suite: every behaviour of the store port, written
//! once and run against every store: memory, Redis on 127.0.0.1:6379, and
//! a 3-master Redis Cluster the suite starts (one for the whole suite),
//! each with a fresh key prefix per test.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use waitroom::queue::{EntryToken, Policy, QueueName, QueueSettings, Snapshot, Standing, UserId};
use waitroom::store::{
    AddressLimits, BuyerBudget, ClaimOutcome, JoinLimits, LimitKind, QueueEvent, Rate, SharedStore,
    StoreEvent,
};

fn q() -> QueueName {
    QueueName::parse("default").unwrap()
}

fn u(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// A policy whose budget never refills during a test: admissions come
/// only from the initial `batch`.
fn slow(batch: u32) -> Policy {
    Policy {
        batch,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
    }
}

fn tokens(n: usize) -> Vec<EntryToken> {
    (0..n).map(|_| EntryToken::generate()).collect()
}

fn rank(s: &Snapshot) -> Option<u64> {
    match s.standing {
        Standing::Waiting { rank, .. } => Some(rank),
        _ => None,
    }
}

fn token_of(s: &Snapshot) -> Option<String> {
    match &s.standing {
        Standing::Ready { token, .. } => Some(token.as_str().to_owned()),
        _ => None,
    }
}

/// The user's current entry id (they must have one).
async fn entry_of(store: &SharedStore, user: &UserId) -> u64 {
    let s = store.status(&q(), user, false).await.unwrap();
    s.entry
        .unwrap_or_else(|| panic!("{user} has no entry: {s:?}"))
}

/// Leaves with the user's current entry, as a fresh ticket would.
async fn leave_current(store: &SharedStore, user: &UserId) -> bool {
    let entry = entry_of(store, user).await;
    store.leave(&q(), user, entry).await.unwrap()
}

/// Puts `n` users `prefix0..` in line behind a first user who takes the
/// fast track (so the rest wait), with a budget of `batch`.
async fn fill(store: &SharedStore, policy: &Policy, prefix: &str, n: usize) -> Vec<UserId> {
    let mut users = Vec::new();
    for i in 0..n {
        let user = u(&format!("{prefix}{i:04}"));
        store
            .enter(&q(), &user, policy, &EntryToken::generate())
            .await
            .unwrap();
        users.push(user);
    }
    users
}

/// A subscription to `q()` that is known to be live: Redis subscribes in
/// the background, so probe events on another queue are sent until one
/// arrives (a fixed pause would only guess).
async fn subscribed(store: &SharedStore) -> futures::stream::BoxStream<'static, StoreEvent> {
    let probe = QueueName::parse("probe").unwrap();
    let mut events = store.subscribe(&[q(), probe.clone()]);
    let nobody_admitted = Policy {
        max_active: Some(0),
        ..slow(1)
    };
    for i in 0..100 {
        let user = u(&format!("probe{i}"));
        let entered = store
            .enter(&probe, &user, &nobody_admitted, &EntryToken::generate())
            .await
            .unwrap();
        let entry = entered.snapshot.entry.expect("a waiting user has an entry");
        store.leave(&probe, &user, entry).await.unwrap();
        if let Ok(Some(StoreEvent::Queue { queue, .. })) =
            tokio::time::timeout(Duration::from_millis(100), events.next()).await
        {
            assert_eq!(queue, probe, "nothing else happened yet");
            // Later probes' events may still be in flight: drop them.
            while let Ok(Some(ev)) =
                tokio::time::timeout(Duration::from_millis(50), events.next()).await
            {
                assert!(matches!(ev, StoreEvent::Queue { queue, .. } if queue == probe));
            }
            return events;
        }
    }
    panic!("the subscription never delivered an event");
}

/// Drains the initial budget so later enters wait instead of taking the
/// fast track.
async fn drain_budget(store: &SharedStore, policy: &Policy) {
    for i in 0..policy.batch {
        store
            .enter(
                &q(),
                &u(&format!("early{i}")),
                policy,
                &EntryToken::generate(),
            )
            .await
            .unwrap();
    }
}

async fn reenter_keeps_the_place(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "r", 5).await;
    let first = store
        .enter(&q(), &users[3], &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(!first.created);
    assert_eq!(rank(&first.snapshot), Some(3));
    let again = store.status(&q(), &users[3], false).await.unwrap();
    assert_eq!(rank(&again), Some(3));
    assert_eq!(again.total_waiting, 5);
    assert!(again.entered_at_ms.is_some());
}

async fn concurrent_enters_get_distinct_ranks(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let joins = (0..200).map(|i| {
        let store = store.clone();
        let p = p.clone();
        tokio::spawn(async move {
            store
                .enter(&q(), &u(&format!("c{i}")), &p, &EntryToken::generate())
                .await
                .unwrap()
        })
    });
    let outcomes = futures::future::join_all(joins).await;
    let ranks: HashSet<u64> = outcomes
        .iter()
        .map(|o| rank(&o.as_ref().unwrap().snapshot).expect("waiting"))
        .collect();
    assert_eq!(ranks.len(), 200);
    assert_eq!(ranks, (0..200).collect());
}

async fn concurrent_enters_of_one_user_make_one_entry(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let joins = (0..50).map(|_| {
        let store = store.clone();
        let p = p.clone();
        tokio::spawn(async move {
            store
                .enter(&q(), &u("same"), &p, &EntryToken::generate())
                .await
                .unwrap()
        })
    });
    let outcomes: Vec<_> = futures::future::join_all(joins)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outcomes.iter().filter(|o| o.created).count(), 1);
    assert!(outcomes.iter().all(|o| rank(&o.snapshot) == Some(0)));
    assert_eq!(
        store
            .status(&q(), &u("same"), false)
            .await
            .unwrap()
            .total_waiting,
        1
    );
}

async fn admission_issues_at_most_batch_tokens_once_each(store: SharedStore) {
    let p = slow(5);
    drain_budget(&store, &p).await; // spends the initial budget of 5
    let users = fill(&store, &p, "a", 20).await;
    let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
    assert!(
        pass.admitted.is_empty(),
        "the budget was spent by the fast track"
    );

    let p2 = Policy {
        interval_ms: 200,
        ..slow(5)
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    let pass = store.admit(&q(), &p2, &tokens(5)).await.unwrap();
    assert_eq!(pass.admitted.len(), 5);
    let pass2 = store.admit(&q(), &p2, &tokens(5)).await.unwrap();
    assert!(
        pass2.admitted.len() <= 1,
        "an immediate second pass has (almost) no budget"
    );

    let mut seen_users = HashSet::new();
    let mut seen_tokens = HashSet::new();
    for a in pass.admitted.iter().chain(&pass2.admitted) {
        assert!(seen_users.insert(a.user.clone()), "a user admitted twice");
        assert!(seen_tokens.insert(a.token.clone()), "a token issued twice");
    }
    for a in &pass.admitted {
        let s = store.status(&q(), &a.user, false).await.unwrap();
        assert_eq!(token_of(&s).as_deref(), Some(a.token.as_str()));
    }
    assert_eq!(
        store
            .status(&q(), &users[19], false)
            .await
            .unwrap()
            .total_waiting,
        20 - (pass.admitted.len() + pass2.admitted.len()) as u64
    );
}

async fn tokens_expire_after_the_ttl(store: SharedStore) {
    let p = Policy {
        token_ttl_ms: 400,
        ..slow(1)
    };
    let user = u("short");
    let e = store
        .enter(&q(), &user, &p, &EntryToken::generate())
        .await
        .unwrap();
    let Standing::Ready { expires_in_ms, .. } = e.snapshot.standing else {
        panic!("fast track expected: {e:?}");
    };
    assert!(expires_in_ms <= 400 && expires_in_ms > 200);
    tokio::time::sleep(Duration::from_millis(550)).await;
    let s = store.status(&q(), &user, false).await.unwrap();
    assert_eq!(s.standing, Standing::NotEntered);
    assert_eq!(s.entry, None, "an expired token ends its entry");
}

async fn admission_is_fifo(store: SharedStore) {
    let p = slow(3);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "f", 12).await;
    let fast = Policy {
        interval_ms: 50,
        ..slow(3)
    };
    let mut order = Vec::new();
    // Bounded: a store that stopped admitting fails here instead of hanging.
    for _ in 0..100 {
        if order.len() >= 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        let pass = store.admit(&q(), &fast, &tokens(3)).await.unwrap();
        order.extend(pass.admitted.into_iter().map(|a| a.user));
    }
    assert_eq!(order, users);
}

async fn max_active_bounds_holders(store: SharedStore) {
    let p = Policy {
        max_active: Some(3),
        interval_ms: 50,
        batch: 10,
        ..slow(10)
    };
    // Fast track fills the three slots, then everyone waits.
    let users = fill(&store, &p, "m", 8).await;
    let ready = |s: &Snapshot| matches!(s.standing, Standing::Ready { .. });
    let mut holders = 0;
    for user in &users {
        if ready(&store.status(&q(), user, false).await.unwrap()) {
            holders += 1;
        }
    }
    assert_eq!(holders, 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
    assert!(pass.admitted.is_empty(), "no room while three hold tokens");
    // A holder leaves: exactly one slot frees.
    assert!(leave_current(&store, &users[0]).await);
    let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1);
    assert_eq!(pass.admitted[0].user, users[3]);
}

async fn expired_tokens_free_their_slot(store: SharedStore) {
    let p = Policy {
        max_active: Some(1),
        interval_ms: 50,
        token_ttl_ms: 300,
        ..slow(5)
    };
    let users = fill(&store, &p, "x", 2).await;
    assert!(token_of(&store.status(&q(), &users[0], false).await.unwrap()).is_some());
    assert!(rank(&store.status(&q(), &users[1], false).await.unwrap()).is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1, "the expired token no longer counts");
}

async fn fast_track_only_with_room(store: SharedStore) {
    let p = slow(2);
    let a = store
        .enter(&q(), &u("ft1"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(
        token_of(&a.snapshot).is_some(),
        "empty queue and budget: straight to READY"
    );
    let b = store
        .enter(&q(), &u("ft2"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(token_of(&b.snapshot).is_some());
    let c = store
        .enter(&q(), &u("ft3"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(rank(&c.snapshot), Some(0), "budget spent: waits");

    let full = Policy {
        max_active: Some(2),
        interval_ms: 10,
        ..slow(2)
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(leave_current(&store, &u("ft3")).await);
    let d = store
        .enter(&q(), &u("ft4"), &full, &EntryToken::generate())
        .await
        .unwrap();
    assert!(
        rank(&d.snapshot).is_some(),
        "maxActive reached: waits although the budget refilled"
    );
    // Room in the budget and no maxActive: only the rule that nobody
    // skips a waiting buyer keeps ft5 from the fast track.
    let roomy = Policy {
        interval_ms: 10,
        ..slow(2)
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let e = store
        .enter(&q(), &u("ft5"), &roomy, &EntryToken::generate())
        .await
        .unwrap();
    assert!(
        rank(&e.snapshot).is_some(),
        "someone waits: no overtaking by fast track"
    );
}

async fn leave_moves_those_behind(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "l", 5).await;
    let entry = entry_of(&store, &users[1]).await;
    assert!(store.leave(&q(), &users[1], entry).await.unwrap());
    assert!(
        !store.leave(&q(), &users[1], entry).await.unwrap(),
        "leaving twice changes nothing"
    );
    assert_eq!(
        store.status(&q(), &users[1], false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert_eq!(
        rank(&store.status(&q(), &users[4], false).await.unwrap()),
        Some(3)
    );
    // The holder of a token can leave too, giving it up.
    assert!(leave_current(&store, &u("early0")).await);
    assert_eq!(
        store
            .status(&q(), &u("early0"), false)
            .await
            .unwrap()
            .standing,
        Standing::NotEntered
    );
}

async fn absent_users_are_dropped_before_admission(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(1_000),
        interval_ms: 50,
        ..slow(3)
    };
    // Joins under a budget that does not refill, so nobody in `fill` takes
    // the fast track however slowly the machine runs; the pass then refills
    // at `p`'s rate.
    let joining = slow(3);
    drain_budget(&store, &joining).await;
    let users = fill(&store, &joining, "ab", 3).await;
    // Past the abandon window for everyone; a slow machine only makes the
    // unseen buyer staler. The other two are seen just before the pass.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.status(&q(), &users[1], true).await.unwrap(); // polled
    store.touch(&q(), &[users[2].clone()]).await.unwrap(); // streaming
    let pass = store.admit(&q(), &p, &tokens(3)).await.unwrap();
    let abandoned: Vec<&str> = pass.abandoned.iter().map(|a| a.user.as_str()).collect();
    assert_eq!(abandoned, vec![users[0].as_str()]);
    let admitted: Vec<&str> = pass.admitted.iter().map(|a| a.user.as_str()).collect();
    assert_eq!(admitted, vec![users[1].as_str(), users[2].as_str()]);
    assert_eq!(
        store.status(&q(), &users[0], false).await.unwrap().standing,
        Standing::NotEntered
    );
    // An abandoned user may enter again, at the back.
    let back = store
        .enter(&q(), &users[0], &slow(3), &EntryToken::generate())
        .await
        .unwrap();
    assert!(back.created);
}

/// Users of `pass` dropped as absent, sorted (the stores may drop one
/// pass's absent in different orders).
fn dropped(pass: &waitroom::store::Pass) -> Vec<String> {
    let mut users: Vec<String> = pass.abandoned.iter().map(|a| a.user.to_string()).collect();
    users.sort();
    users
}

/// A buyer never seen since joining counts as seen at their entry time;
/// once seen (a stream's touch, a poll, a repeat join) their last sighting
/// counts. Over two passes, each buyer is judged by the right one of the
/// two, whatever their place in line, and a later joiner is judged too.
async fn presence_counts_from_entry_until_first_seen(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(1_000),
        ..slow(3)
    };
    drain_budget(&store, &slow(3)).await;
    let users = fill(&store, &p, "pe", 6).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.touch(&q(), &[users[0].clone()]).await.unwrap();
    store.touch(&q(), &[users[2].clone()]).await.unwrap();
    store.status(&q(), &users[4], true).await.unwrap();
    // No tokens: nobody is admitted, only the absent are dropped.
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(dropped(&pass), ["pe0001", "pe0003", "pe0005"], "{pass:?}");
    let late = fill(&store, &p, "pf", 1).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    store.touch(&q(), &[users[0].clone()]).await.unwrap();
    // A repeat join counts as a sighting.
    store
        .enter(&q(), &users[2], &p, &EntryToken::generate())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // users[4] was last seen 1.1 s ago, the late joiner entered 1.1 s ago
    // and was never seen; users[0] and users[2] were seen since.
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(dropped(&pass), ["pe0004", late[0].as_str()], "{pass:?}");
    for (user, waiting) in [(&users[0], true), (&users[2], true), (&users[4], false)] {
        let standing = store.status(&q(), user, false).await.unwrap().standing;
        assert_eq!(
            matches!(standing, Standing::Waiting { .. }),
            waiting,
            "{user}: {standing:?}"
        );
    }
}

/// A stream's touch after its buyer left the line does not bring them
/// back: they are not in line, and a later pass drops nobody for them.
async fn a_touch_after_leaving_keeps_nobody(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(800),
        ..slow(2)
    };
    drain_budget(&store, &slow(2)).await;
    let users = fill(&store, &p, "tl", 2).await;
    let entry = entry_of(&store, &users[0]).await;
    assert!(store.leave(&q(), &users[0], entry).await.unwrap());
    store.touch(&q(), &users).await.unwrap();
    assert_eq!(
        store.status(&q(), &users[0], true).await.unwrap().standing,
        Standing::NotEntered
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(dropped(&pass), ["tl0001"], "{pass:?}");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
}

/// More absent buyers than one pass drops: the pass drops its bound, in
/// line order, and the next pass the rest.
async fn many_unseen_are_dropped_over_bounded_passes(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(1_000),
        ..slow(1)
    };
    drain_budget(&store, &slow(1)).await;
    let users = fill(&store, &p, "mu", 620).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let first = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(first.abandoned.len(), 500);
    let second = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(second.abandoned.len(), 120);
    let mut all: Vec<String> = first
        .abandoned
        .iter()
        .chain(&second.abandoned)
        .map(|a| a.user.to_string())
        .collect();
    all.sort();
    let expected: Vec<String> = users.iter().map(|u| u.to_string()).collect();
    assert_eq!(all, expected);
    assert!(first.abandoned.iter().all(|a| a.user.as_str() < "mu0500"));
}

async fn statuses_read_many_at_once(store: SharedStore) {
    let p = slow(1);
    let users = fill(&store, &p, "s", 4).await;
    let mut asked = users.clone();
    asked.push(u("nobody"));
    let all = store.statuses(&q(), &asked).await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(token_of(&all[0]).is_some());
    assert_eq!(
        all.iter().map(rank).collect::<Vec<_>>(),
        vec![None, Some(0), Some(1), Some(2), None]
    );
    assert_eq!(all[4].standing, Standing::NotEntered);
    assert!(
        all[1..4].iter().all(|s| s.entered_at_ms.is_none()),
        "refreshes skip the entry time"
    );
    assert!(all.iter().all(|s| s.total_waiting == 3));
    let seqs: Vec<u64> = all[1..4]
        .iter()
        .map(|s| match s.standing {
            Standing::Waiting { seq, .. } => seq,
            _ => unreachable!(),
        })
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "arrival order: {seqs:?}"
    );
    assert!(store.statuses(&q(), &[]).await.unwrap().is_empty());
}

async fn claim_consume_release(store: SharedStore) {
    let p = Policy {
        max_active: Some(1),
        interval_ms: 50,
        ..slow(5)
    };
    let users = fill(&store, &p, "t", 2).await;
    let token = token_of(&store.status(&q(), &users[0], false).await.unwrap()).unwrap();

    assert_eq!(
        store
            .claim(&q(), &users[0], "made-up", 5_000)
            .await
            .unwrap(),
        ClaimOutcome::Invalid
    );
    assert_eq!(
        store.claim(&q(), &users[1], &token, 5_000).await.unwrap(),
        ClaimOutcome::Invalid
    );
    let ClaimOutcome::Claimed { claim_id } =
        store.claim(&q(), &users[0], &token, 5_000).await.unwrap()
    else {
        panic!("claim expected");
    };
    assert_eq!(
        store.claim(&q(), &users[0], &token, 5_000).await.unwrap(),
        ClaimOutcome::InUse
    );
    assert!(
        !store
            .release(&q(), &users[0], "not-the-claim")
            .await
            .unwrap()
    );
    assert!(store.release(&q(), &users[0], &claim_id).await.unwrap());
    let ClaimOutcome::Claimed { claim_id } =
        store.claim(&q(), &users[0], &token, 5_000).await.unwrap()
    else {
        panic!("claim after release expected");
    };
    assert!(
        !store
            .consume(&q(), &users[0], "not-the-claim")
            .await
            .unwrap()
    );
    assert!(store.consume(&q(), &users[0], &claim_id).await.unwrap());
    assert!(
        !store.consume(&q(), &users[0], &claim_id).await.unwrap(),
        "consumed once"
    );
    assert_eq!(
        store.status(&q(), &users[0], false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert_eq!(
        store.claim(&q(), &users[0], &token, 5_000).await.unwrap(),
        ClaimOutcome::Invalid
    );

    // Consuming freed the only slot: the next pass admits the next user.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1);
    assert_eq!(pass.admitted[0].user, users[1]);
}

/// A live token names its holder (the token API's claim by the token
/// alone), however it was issued (a join's fast track, an admission pass)
/// and while a claim's lease keeps it past its TTL; used, left, expired or
/// asked of another queue, it names nobody.
async fn a_live_token_names_its_holder(store: SharedStore) {
    let p = Policy {
        max_active: Some(1),
        interval_ms: 50,
        token_ttl_ms: 400,
        ..slow(1)
    };
    let holder = |token: String| {
        let store = store.clone();
        async move { store.token_holder(&q(), &token).await.unwrap() }
    };
    let fast = u("fast");
    let e = store
        .enter(&q(), &fast, &p, &EntryToken::generate())
        .await
        .unwrap();
    let fast_token = token_of(&e.snapshot).expect("fast-tracked");
    let waiting = u("waiting");
    store
        .enter(&q(), &waiting, &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(holder(fast_token.clone()).await, Some(fast.clone()));
    assert_eq!(holder("made-up".into()).await, None);
    assert_eq!(holder(String::new()).await, None);
    let other = QueueName::parse("other").unwrap();
    assert_eq!(store.token_holder(&other, &fast_token).await.unwrap(), None);

    // A claim's lease outlives the TTL: the token, and its holder, too.
    let ClaimOutcome::Claimed { claim_id } =
        store.claim(&q(), &fast, &fast_token, 800).await.unwrap()
    else {
        panic!("claim expected");
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holder(fast_token.clone()).await, Some(fast.clone()));
    assert!(store.consume(&q(), &fast, &claim_id).await.unwrap());
    assert_eq!(holder(fast_token).await, None, "used up");

    // Admitted by a pass; then left.
    let pass = store.admit(&q(), &p, &tokens(1)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1);
    let admitted = token_of(&store.status(&q(), &waiting, false).await.unwrap()).unwrap();
    assert_eq!(holder(admitted.clone()).await, Some(waiting.clone()));
    assert!(leave_current(&store, &waiting).await);
    assert_eq!(holder(admitted).await, None, "left");

    // Expired.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let late = u("late");
    let e = store
        .enter(&q(), &late, &p, &EntryToken::generate())
        .await
        .unwrap();
    let late_token = token_of(&e.snapshot).expect("fast-tracked");
    assert_eq!(holder(late_token.clone()).await, Some(late));
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(holder(late_token).await, None, "expired");
}

async fn a_lapsed_claim_returns_to_ready(store: SharedStore) {
    let p = Policy {
        token_ttl_ms: 200,
        ..slow(1)
    };
    let user = u("lease");
    let e = store
        .enter(&q(), &user, &p, &EntryToken::generate())
        .await
        .unwrap();
    let token = token_of(&e.snapshot).unwrap();
    assert!(matches!(
        store.claim(&q(), &user, &token, 500).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // The lease outlives the token's TTL: the token lives until it ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(token_of(&store.status(&q(), &user, false).await.unwrap()).is_some());
    assert_eq!(
        store.claim(&q(), &user, &token, 500).await.unwrap(),
        ClaimOutcome::InUse
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Lease over, and with it the extended life.
    assert_eq!(
        store.claim(&q(), &user, &token, 500).await.unwrap(),
        ClaimOutcome::Invalid
    );

    let p = Policy {
        interval_ms: 10,
        ..slow(1)
    };
    let user = u("lease2");
    let e = store
        .enter(&q(), &user, &p, &EntryToken::generate())
        .await
        .unwrap();
    let token = token_of(&e.snapshot).unwrap();
    assert!(matches!(
        store.claim(&q(), &user, &token, 150).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(matches!(
        store.claim(&q(), &user, &token, 150).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

/// A hold is read with every standing (a buyer is told the queue is
/// paused rather than an estimate) and marks the passes it emptied.
async fn a_hold_is_read_with_every_standing(store: SharedStore) {
    let p = slow(1);
    assert!(store.set_paused(&q(), true).await.unwrap());
    let user = u("held1");
    let e = store
        .enter(&q(), &user, &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(matches!(e.snapshot.standing, Standing::Waiting { .. }));
    assert!(e.snapshot.paused);
    assert!(store.status(&q(), &user, false).await.unwrap().paused);
    let all = store
        .statuses(&q(), std::slice::from_ref(&user))
        .await
        .unwrap();
    assert!(all[0].paused);
    let pass = store.admit(&q(), &p, &tokens(1)).await.unwrap();
    assert!(pass.held && pass.admitted.is_empty(), "{pass:?}");
    assert!(store.set_paused(&q(), false).await.unwrap());
    let pass = store.admit(&q(), &p, &tokens(1)).await.unwrap();
    assert!(!pass.held && pass.admitted.len() == 1, "{pass:?}");
    let s = store.status(&q(), &user, false).await.unwrap();
    assert!(!s.paused && matches!(s.standing, Standing::Ready { .. }));
}

async fn passes_and_changes_are_published(store: SharedStore) {
    let mut events = subscribed(&store).await;
    let p = slow(2);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "e", 3).await;
    let left_entry = entry_of(&store, &users[2]).await;
    assert!(store.leave(&q(), &users[2], left_entry).await.unwrap());
    let fast = Policy {
        interval_ms: 50,
        ..slow(2)
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &fast, &tokens(2)).await.unwrap();
    assert_eq!(pass.admitted.len(), 2);

    // The budget was drained on the fast track: one event for each, so
    // every instance counts those admissions too.
    let mut got = Vec::new();
    let mut fast_tracked = 0;
    while got.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(3), events.next())
            .await
            .expect("an event within 3 s")
            .expect("stream open");
        if let StoreEvent::Queue { queue, event } = ev {
            assert_eq!(queue, q());
            match event {
                QueueEvent::FastTracked { at } => {
                    assert!(at > 0 && got.is_empty(), "{got:?}");
                    fast_tracked += 1;
                }
                event => got.push(event),
            }
        }
    }
    assert_eq!(fast_tracked, p.batch);
    assert_eq!(
        got[0],
        QueueEvent::Left {
            user: users[2].clone(),
            seq: Some(left_entry)
        }
    );
    match &got[1] {
        QueueEvent::Pass(p) => {
            assert_eq!(p, &pass);
            assert!(p.busy);
            assert_eq!(p.waiting, 0);
        }
        other => panic!("{other:?}"),
    }
}

async fn budget_holds_one_global_rate(store: SharedStore) {
    // Two "instances" pass against one budget as fast as they can for
    // 1 s: together they admit no more than the budget allows.
    let p = Policy {
        batch: 5,
        interval_ms: 200,
        ..slow(5)
    };
    let _ = fill(&store, &p, "g", 200).await;
    let started = std::time::Instant::now();
    let mut admitted = 0;
    while started.elapsed() < Duration::from_millis(1000) {
        for _ in 0..2 {
            admitted += store
                .admit(&q(), &p, &tokens(5))
                .await
                .unwrap()
                .admitted
                .len();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let intervals = started.elapsed().as_millis() as f64 / 200.0;
    let bound = 5.0 * intervals + 5.0;
    assert!(admitted as f64 <= bound, "admitted {admitted} > {bound}");
    assert!(
        admitted as f64 >= 5.0 * (intervals - 1.0),
        "admitted only {admitted} in {intervals} intervals"
    );
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $case() { super::$case(crate::common::store("memory", stringify!($case)).await).await })*
        }
        mod redis {
            $(#[tokio::test] async fn $case() { super::$case(crate::common::store("redis", stringify!($case)).await).await })*
        }
        mod cluster {
            $(#[tokio::test] async fn $case() { super::$case(crate::common::store("cluster", stringify!($case)).await).await })*
        }
    };
}

conformance!(
    reenter_keeps_the_place,
    a_hold_is_read_with_every_standing,
    concurrent_enters_get_distinct_ranks,
    concurrent_enters_of_one_user_make_one_entry,
    admission_issues_at_most_batch_tokens_once_each,
    tokens_expire_after_the_ttl,
    admission_is_fifo,
    max_active_bounds_holders,
    expired_tokens_free_their_slot,
    fast_track_only_with_room,
    leave_moves_those_behind,
    absent_users_are_dropped_before_admission,
    presence_counts_from_entry_until_first_seen,
    a_touch_after_leaving_keeps_nobody,
    many_unseen_are_dropped_over_bounded_passes,
    statuses_read_many_at_once,
    claim_consume_release,
    a_live_token_names_its_holder,
    a_lapsed_claim_returns_to_ready,
    passes_and_changes_are_published,
    budget_holds_one_global_rate,
    paused_queues_admit_nobody,
    renewing_a_claim_extends_its_lease_and_the_tokens_life,
    renewing_does_nothing_for_a_claim_that_no_longer_holds,
    rejoining_after_leaving_is_a_new_entry,
    leave_refuses_a_stale_entry,
    fast_track_ready_has_an_entry,
    the_entry_survives_admission_until_the_token_is_used,
    a_late_consume_deletes_unless_claimed_anew,
    a_read_budget_allows_its_burst_then_refuses,
    repeat_joins_spend_the_budget_only_past_the_grace,
    an_address_gets_its_join_rate_and_no_more,
    places_per_address_count_only_live_places,
    spend_buckets_are_shared_and_separate,
    spend_once_is_true_once_per_key_until_it_expires,
    joins_noted_by_every_caller_share_one_switch,
    queue_settings_are_versioned_and_listed,
    a_pass_runs_on_the_stored_settings,
    deleting_a_queue_empties_it_but_keeps_entry_ids_fresh,
    stream_reports_are_shared_until_they_lapse,
    joins_sent_together_keep_their_order,
    entry_times_are_kept_per_entry,
    a_stores_own_admission_turn_is_renewed,
);

/// One store (one instance) always has its queues' admission turn: taken,
/// taken again within the hold, and another queue's alike. (Two Redis
/// stores contending for it: `tests/api/turn.rs`.)
async fn a_stores_own_admission_turn_is_renewed(store: SharedStore) {
    let other = QueueName::parse("other").unwrap();
    assert!(store.take_pass_turn(&q(), 60_000).await.unwrap());
    assert!(store.take_pass_turn(&q(), 60_000).await.unwrap(), "its own");
    assert!(store.take_pass_turn(&other, 60_000).await.unwrap());
    assert!(store.take_pass_turn(&q(), 1).await.unwrap());
}

/// Joins sent together (on Redis: gathered into groups, one script call
/// each) are placed in the order they were sent, each answered with its
/// own place. `join_all` on the one-threaded test runtime starts them in
/// list order.
async fn joins_sent_together_keep_their_order(store: SharedStore) {
    let p = Policy {
        max_active: Some(0),
        ..slow(1)
    };
    let joins = (0..300).map(|i| {
        let (store, p) = (store.clone(), p.clone());
        async move {
            store
                .enter(&q(), &u(&format!("o{i:03}")), &p, &EntryToken::generate())
                .await
                .unwrap()
        }
    });
    let outcomes = futures::future::join_all(joins).await;
    let mut last = None;
    for (i, o) in outcomes.iter().enumerate() {
        assert!(o.created, "join {i}");
        let Standing::Waiting { rank, seq } = o.snapshot.standing else {
            panic!("join {i} waits: {o:?}");
        };
        assert_eq!(rank, i as u64, "join {i} is behind every earlier one");
        assert!(last < Some(seq), "entry ids follow the order");
        last = Some(seq);
    }
}

/// Every waiting entry keeps the time it was made, whoever joined, left
/// or was admitted around it (Redis derives it from the entry id rather
/// than storing it per user), and an admitted user's token keeps it.
async fn entry_times_are_kept_per_entry(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let mut users = Vec::new();
    for round in 0..4 {
        let pair = [u(&format!("t{round}a")), u(&format!("t{round}b"))];
        let joins = pair.iter().map(|user| {
            let (store, p) = (store.clone(), p.clone());
            async move { store.enter(&q(), user, &p, &EntryToken::generate()).await }
        });
        for o in futures::future::join_all(joins).await {
            assert!(o.unwrap().created);
        }
        users.extend(pair);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let times = |snapshots: &[Snapshot]| -> Vec<u64> {
        snapshots
            .iter()
            .map(|s| s.entered_at_ms.expect("an entry has a time"))
            .collect()
    };
    let mut at = Vec::new();
    for user in &users {
        at.push(store.status(&q(), user, false).await.unwrap());
    }
    let at = times(&at);
    for round in 0..3 {
        assert!(at[2 * round] <= at[2 * round + 1], "{at:?}");
        assert!(
            at[2 * round + 1] < at[2 * round + 2],
            "rounds 5 ms apart: {at:?}"
        );
    }
    // A user in the middle leaves, the two at the head are admitted.
    assert!(leave_current(&store, &users[3]).await);
    let fast = Policy {
        interval_ms: 50,
        ..slow(2)
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &fast, &tokens(2)).await.unwrap();
    let admitted: Vec<UserId> = pass.admitted.into_iter().map(|a| a.user).collect();
    assert_eq!(admitted, users[..2]);
    for (i, user) in users.iter().enumerate() {
        let s = store.status(&q(), user, false).await.unwrap();
        if i == 3 {
            assert_eq!(s.standing, Standing::NotEntered);
            continue;
        }
        assert_eq!(s.entered_at_ms, Some(at[i]), "{user} keeps its entry time");
    }
}

/// A rate that does not refill within a test: `burst` and no more.
fn only(burst: u32) -> Rate {
    Rate {
        period_ms: 3_600_000,
        burst,
    }
}

async fn a_read_budget_allows_its_burst_then_refuses(store: SharedStore) {
    let a = u("budget-a");
    store
        .enter(&q(), &a, &slow(0), &EntryToken::generate())
        .await
        .unwrap();
    for i in 0..3 {
        let read = store.status_limited(&q(), &a, true, Some(only(3))).await;
        assert!(read.unwrap().is_ok(), "read {i} of the burst");
    }
    let refused = store
        .status_limited(&q(), &a, true, Some(only(3)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.kind, LimitKind::Buyer);
    assert!(
        (3_500_000..=3_600_000).contains(&refused.retry_after_ms),
        "one period to wait: {refused:?}"
    );
    // Per buyer, per queue; and a read without a budget is never refused.
    let b = u("budget-b");
    assert!(
        store
            .status_limited(&q(), &b, false, Some(only(3)))
            .await
            .unwrap()
            .is_ok()
    );
    let other = QueueName::parse("other").unwrap();
    assert!(
        store
            .status_limited(&other, &a, false, Some(only(3)))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(store.status(&q(), &a, true).await.is_ok());
    // A short period refills.
    let quick = Rate {
        period_ms: 50,
        burst: 1,
    };
    let c = u("budget-c");
    assert!(
        store
            .status_limited(&q(), &c, false, Some(quick))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        store
            .status_limited(&q(), &c, false, Some(quick))
            .await
            .unwrap()
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        store
            .status_limited(&q(), &c, false, Some(quick))
            .await
            .unwrap()
            .is_ok()
    );
}

async fn repeat_joins_spend_the_budget_only_past_the_grace(store: SharedStore) {
    let no_grace = JoinLimits {
        buyer: Some(BuyerBudget {
            rate: only(1),
            grace_ms: 0,
        }),
        address: None,
    };
    let join = |user: UserId, limits: JoinLimits| {
        let store = store.clone();
        async move {
            store
                .enter_limited(&q(), &user, &slow(0), &EntryToken::generate(), &limits)
                .await
                .unwrap()
        }
    };
    let a = u("repeat-a");
    let first = join(a.clone(), no_grace.clone()).await.unwrap();
    assert!(first.created, "a first join is never counted");
    let again = join(a.clone(), no_grace.clone()).await.unwrap();
    assert!(!again.created);
    let refused = join(a.clone(), no_grace.clone()).await.unwrap_err();
    assert_eq!(refused.kind, LimitKind::Buyer);
    // The place is untouched by the refusal.
    assert_eq!(
        store.status(&q(), &a, false).await.unwrap().entry,
        first.snapshot.entry
    );
    // Within the grace, repeats are duplicates of the first: not counted.
    let graced = JoinLimits {
        buyer: Some(BuyerBudget {
            rate: only(1),
            grace_ms: 3_600_000,
        }),
        address: None,
    };
    let b = u("repeat-b");
    for _ in 0..5 {
        assert!(join(b.clone(), graced.clone()).await.is_ok());
    }
    // The join budget is the read budget: one spent by a read is gone.
    let c = u("repeat-c");
    join(c.clone(), no_grace.clone()).await.unwrap();
    store
        .status_limited(&q(), &c, false, Some(only(1)))
        .await
        .unwrap()
        .unwrap();
    assert!(join(c.clone(), no_grace.clone()).await.is_err());
}

fn from(address: &str, joins: Option<Rate>, places: Option<u32>) -> JoinLimits {
    JoinLimits {
        buyer: None,
        address: Some(AddressLimits {
            key: address.into(),
            joins,
            places,
        }),
    }
}

async fn an_address_gets_its_join_rate_and_no_more(store: SharedStore) {
    let limits = from("192.0.2.1", Some(only(3)), None);
    let join = |user: &str, limits: &JoinLimits| {
        let store = store.clone();
        let (user, limits) = (u(user), limits.clone());
        async move {
            store
                .enter_limited(&q(), &user, &slow(1), &EntryToken::generate(), &limits)
                .await
                .unwrap()
        }
    };
    for i in 0..3 {
        assert!(join(&format!("addr-{i}"), &limits).await.unwrap().created);
    }
    let refused = join("addr-3", &limits).await.unwrap_err();
    assert_eq!(refused.kind, LimitKind::AddressJoins);
    assert!(refused.retry_after_ms > 0);
    assert_eq!(
        store
            .status(&q(), &u("addr-3"), false)
            .await
            .unwrap()
            .standing,
        Standing::NotEntered,
        "a refused join changes nothing"
    );
    // A repeat join never counts against the address.
    assert!(!join("addr-0", &limits).await.unwrap().created);
    // Another address, another bucket.
    let other = from("2001:db8::/64", Some(only(3)), None);
    assert!(join("addr-3", &other).await.unwrap().created);
}

async fn places_per_address_count_only_live_places(store: SharedStore) {
    let limits = from("192.0.2.9", None, Some(2));
    let join = |user: &str| {
        let store = store.clone();
        let (user, limits) = (u(user), limits.clone());
        async move {
            store
                .enter_limited(&q(), &user, &slow(1), &EntryToken::generate(), &limits)
                .await
                .unwrap()
        }
    };
    // The first takes the fast track (a READY place counts too).
    assert!(join("held-a").await.unwrap().created);
    assert!(join("held-b").await.unwrap().created);
    let refused = join("held-c").await.unwrap_err();
    assert_eq!(refused.kind, LimitKind::AddressPlaces);
    assert!(refused.retry_after_ms > 0);
    assert!(
        !join("held-a").await.unwrap().created,
        "a repeat join is fine"
    );
    // A place that ends frees its slot: the READY one leaves.
    assert!(leave_current(&store, &u("held-a")).await);
    assert!(join("held-c").await.unwrap().created);
    assert!(join("held-d").await.is_err());
    // A rejoin after leaving is a new place and counts again.
    assert!(leave_current(&store, &u("held-b")).await);
    assert!(join("held-b").await.unwrap().created);
    assert!(join("held-d").await.is_err());
}

async fn spend_buckets_are_shared_and_separate(store: SharedStore) {
    for _ in 0..2 {
        assert!(
            store
                .spend("visitors:192.0.2.1", only(2))
                .await
                .unwrap()
                .is_ok()
        );
    }
    let refused = store
        .spend("visitors:192.0.2.1", only(2))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.kind, LimitKind::Bucket);
    assert!(refused.retry_after_ms > 0);
    assert!(
        store
            .spend("visitors:192.0.2.2", only(2))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        store
            .spend("visitors:2001:db8::/64", only(2))
            .await
            .unwrap()
            .is_ok(),
        "IPv6 bucket names"
    );
}

// --- Proof of work at the door (join challenges) ---

async fn spend_once_is_true_once_per_key_until_it_expires(store: SharedStore) {
    // Thirty concurrent spends of one key: exactly one wins.
    let spends = (0..30).map(|_| {
        let store = store.clone();
        async move { store.spend_once(&q(), "c0ffee", 600).await.unwrap() }
    });
    let won = futures::future::join_all(spends).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    assert!(
        store.spend_once(&q(), "c0ffee2", 600).await.unwrap(),
        "another key"
    );
    let other = QueueName::parse("other").unwrap();
    assert!(
        store.spend_once(&other, "c0ffee", 600).await.unwrap(),
        "keys are per queue"
    );
    assert!(!store.spend_once(&q(), "c0ffee", 600).await.unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        store.spend_once(&q(), "c0ffee", 600).await.unwrap(),
        "forgotten once its time is up"
    );
    assert!(!store.spend_once(&q(), "c0ffee", 600).await.unwrap());
}

async fn joins_noted_by_every_caller_share_one_switch(store: SharedStore) {
    // Two callers (two instances) under a threshold of 10 a second: 6 each
    // within one second tips it. Retried if the store second turns between
    // the two calls (then each second holds only 6, which is not over).
    let other = QueueName::parse("other").unwrap();
    let mut on = 0;
    for _ in 0..3 {
        assert_eq!(
            store.note_joins(&q(), 6, 10, 1_000).await.unwrap(),
            0,
            "6 is not over 10"
        );
        on = store.note_joins(&q(), 6, 10, 1_000).await.unwrap();
        if on > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2_100)).await;
    }
    assert!((1..=1_000).contains(&on), "on for the hold: {on}");
    // A third caller with nothing to add reads the switch; another queue is off.
    let seen = store.note_joins(&q(), 0, 10, 1_000).await.unwrap();
    assert!(seen > 0 && seen <= 1_000, "{seen}");
    assert_eq!(store.note_joins(&other, 0, 10, 1_000).await.unwrap(), 0);
    // Quiet for longer than two seconds and the hold: off for everyone.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(store.note_joins(&q(), 0, 10, 1_000).await.unwrap(), 0);
    assert_eq!(store.note_joins(&q(), 3, 10, 1_000).await.unwrap(), 0);
}

async fn paused_queues_admit_nobody(store: SharedStore) {
    let p = Policy {
        interval_ms: 10,
        ..slow(5)
    };
    assert!(store.set_paused(&q(), true).await.unwrap());
    assert!(!store.set_paused(&q(), true).await.unwrap(), "already held");
    let first = store
        .enter(&q(), &u("held"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(rank(&first.snapshot), Some(0), "no fast track while held");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
    assert!(pass.admitted.is_empty());
    assert!(store.stats(&q()).await.unwrap().paused);
    assert!(store.set_paused(&q(), false).await.unwrap());
    let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1, "resumed");
    let stats = store.stats(&q()).await.unwrap();
    assert_eq!((stats.waiting, stats.active, stats.paused), (0, 1, false));
}

async fn renewing_a_claim_extends_its_lease_and_the_tokens_life(store: SharedStore) {
    let p = Policy {
        token_ttl_ms: 400,
        ..slow(1)
    };
    let user = u("renewed");
    let e = store
        .enter(&q(), &user, &p, &EntryToken::generate())
        .await
        .unwrap();
    let token = token_of(&e.snapshot).unwrap();
    let ClaimOutcome::Claimed { claim_id } = store.claim(&q(), &user, &token, 400).await.unwrap()
    else {
        panic!("claim expected");
    };
    assert!(
        store
            .renew_claim(&q(), &user, &claim_id, 2_000)
            .await
            .unwrap()
    );
    // Past both the first lease and the token's own TTL: the renewal holds.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        token_of(&store.status(&q(), &user, false).await.unwrap()).is_some(),
        "the token lives as long as the renewed lease"
    );
    assert_eq!(
        store.claim(&q(), &user, &token, 400).await.unwrap(),
        ClaimOutcome::InUse
    );
    assert_eq!(store.stats(&q()).await.unwrap().active, 1);
    // After the order commits, a late renewal brings nothing back.
    assert!(store.consume(&q(), &user, &claim_id).await.unwrap());
    assert!(
        !store
            .renew_claim(&q(), &user, &claim_id, 2_000)
            .await
            .unwrap()
    );
    assert_eq!(
        store.status(&q(), &user, false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert_eq!(store.stats(&q()).await.unwrap().active, 0);
    assert_eq!(
        store.claim(&q(), &user, &token, 400).await.unwrap(),
        ClaimOutcome::Invalid
    );
}

async fn renewing_does_nothing_for_a_claim_that_no_longer_holds(store: SharedStore) {
    let user = u("stale");
    let e = store
        .enter(&q(), &user, &slow(1), &EntryToken::generate())
        .await
        .unwrap();
    let token = token_of(&e.snapshot).unwrap();
    let queue = q();
    let claim = |lease| store.claim(&queue, &user, &token, lease);
    let ClaimOutcome::Claimed { claim_id: lapsed } = claim(200).await.unwrap() else {
        panic!("claim expected");
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        matches!(claim(600).await.unwrap(), ClaimOutcome::Claimed { .. }),
        "the lapsed claim gave the token back"
    );
    // The lapsed claim's owner may not extend the newer claim.
    assert!(
        !store
            .renew_claim(&q(), &user, &lapsed, 60_000)
            .await
            .unwrap()
    );
    assert!(
        !store
            .renew_claim(&q(), &user, "made-up", 60_000)
            .await
            .unwrap()
    );
    assert_eq!(claim(600).await.unwrap(), ClaimOutcome::InUse);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let ClaimOutcome::Claimed { claim_id: released } = claim(60_000).await.unwrap() else {
        panic!("the newer claim lapsed on time: the stale renewals extended nothing");
    };
    // After a release, a late renewal does not lock the token again.
    assert!(store.release(&q(), &user, &released).await.unwrap());
    assert!(
        !store
            .renew_claim(&q(), &user, &released, 60_000)
            .await
            .unwrap()
    );
    assert!(matches!(
        claim(60_000).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

async fn rejoining_after_leaving_is_a_new_entry(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "n", 3).await;
    let first = store
        .enter(&q(), &users[1], &p, &EntryToken::generate())
        .await
        .unwrap();
    let entry = first.snapshot.entry.expect("a waiting user has an entry");
    assert!(
        matches!(first.snapshot.standing, Standing::Waiting { seq, .. } if seq == entry),
        "the entry is the arrival sequence: {first:?}"
    );
    let again = store
        .enter(&q(), &users[1], &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(
        again.snapshot.entry,
        Some(entry),
        "a repeat join keeps the entry"
    );
    assert!(store.leave(&q(), &users[1], entry).await.unwrap());
    let gone = store.status(&q(), &users[1], false).await.unwrap();
    assert_eq!(gone.entry, None);
    let back = store
        .enter(&q(), &users[1], &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(back.created);
    let new_entry = back.snapshot.entry.expect("entered again");
    assert_ne!(new_entry, entry, "a new join is a new entry");
    assert_eq!(rank(&back.snapshot), Some(2), "at the back of the line");

    // A token holder who leaves and joins again gets a new entry too.
    let holder = u("early0");
    let held = entry_of(&store, &holder).await;
    assert!(store.leave(&q(), &holder, held).await.unwrap());
    let rejoined = store
        .enter(&q(), &holder, &p, &EntryToken::generate())
        .await
        .unwrap();
    let rejoined = rejoined.snapshot.entry.expect("entered again");
    assert!(rejoined != held && rejoined != new_entry);
}

/// Waits until `events` hears this store's changes (Redis subscribes in the
/// background): a probe user joins and leaves until one leave is heard.
async fn until_subscribed(store: &SharedStore, events: &mut BoxStream<'static, StoreEvent>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = u("probe");
    // No room for token holders: the probe waits, leaving the budget alone.
    let waits = Policy {
        max_active: Some(0),
        ..slow(1)
    };
    loop {
        let entered = store
            .enter(&q(), &probe, &waits, &EntryToken::generate())
            .await
            .unwrap();
        let entry = entered.snapshot.entry.unwrap();
        assert!(store.leave(&q(), &probe, entry).await.unwrap());
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), events.next()).await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the subscription never heard a leave"
        );
    }
}

async fn leave_refuses_a_stale_entry(store: SharedStore) {
    let mut events = store.subscribe(&[q()]);
    until_subscribed(&store, &mut events).await;
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "s", 3).await;
    let old = entry_of(&store, &users[0]).await;
    assert!(store.leave(&q(), &users[0], old).await.unwrap());
    store
        .enter(&q(), &users[0], &p, &EntryToken::generate())
        .await
        .unwrap();
    let before = store.status(&q(), &users[0], false).await.unwrap();
    assert!(
        !store.leave(&q(), &users[0], old).await.unwrap(),
        "an old entry cannot remove the new place"
    );
    let after = store.status(&q(), &users[0], false).await.unwrap();
    assert_eq!(
        (rank(&after), after.entry, after.total_waiting),
        (rank(&before), before.entry, before.total_waiting)
    );
    assert!(!store.leave(&q(), &users[0], old + 1_000_000).await.unwrap());

    // A token holder keeps their token against a stale entry as well.
    let holder = u("early0");
    let token = token_of(&store.status(&q(), &holder, false).await.unwrap()).unwrap();
    let held = entry_of(&store, &holder).await;
    assert!(!store.leave(&q(), &holder, held + 1).await.unwrap());
    assert_eq!(
        token_of(&store.status(&q(), &holder, false).await.unwrap()),
        Some(token)
    );
    // Nobody there at all: nothing to give up.
    assert!(!store.leave(&q(), &u("nobody"), old).await.unwrap());

    // Only the real leaves were published: read up to a last, real one.
    let last = entry_of(&store, &users[2]).await;
    assert!(store.leave(&q(), &users[2], last).await.unwrap());
    let mut lefts = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("the last leave is heard")
            .expect("stream open");
        if let StoreEvent::Queue {
            event: QueueEvent::Left { user, seq },
            ..
        } = ev
        {
            if user == users[2] {
                break;
            }
            if user.as_str() != "probe" {
                lefts.push((user, seq));
            }
        }
    }
    assert_eq!(lefts, vec![(users[0].clone(), Some(old))]);
}

async fn fast_track_ready_has_an_entry(store: SharedStore) {
    let p = slow(2);
    let a = store
        .enter(&q(), &u("fa"), &p, &EntryToken::generate())
        .await
        .unwrap();
    let b = store
        .enter(&q(), &u("fb"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(token_of(&a.snapshot).is_some() && token_of(&b.snapshot).is_some());
    let (ea, eb) = (a.snapshot.entry.unwrap(), b.snapshot.entry.unwrap());
    assert!(
        eb > ea,
        "fast-track entries take the sequence too: {ea} {eb}"
    );
    let c = store
        .enter(&q(), &u("fc"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert!(c.snapshot.entry.unwrap() > eb, "and so do those who wait");
    assert_eq!(entry_of(&store, &u("fa")).await, ea);
    let again = store
        .enter(&q(), &u("fa"), &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(again.snapshot.entry, Some(ea));
    let many = store.statuses(&q(), &[u("fa"), u("fb")]).await.unwrap();
    assert_eq!(
        many.iter().map(|s| s.entry).collect::<Vec<_>>(),
        vec![Some(ea), Some(eb)]
    );
}

async fn the_entry_survives_admission_until_the_token_is_used(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "a", 2).await;
    let entry = entry_of(&store, &users[0]).await;
    let fast = Policy {
        interval_ms: 50,
        ..slow(1)
    };
    tokio::time::sleep(Duration::from_millis(80)).await;
    let pass = store.admit(&q(), &fast, &tokens(1)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1);
    assert_eq!(pass.admitted[0].seq, entry);
    let ready = store.status(&q(), &users[0], false).await.unwrap();
    let token = token_of(&ready).expect("admitted");
    assert_eq!(ready.entry, Some(entry), "the token keeps the entry");
    assert_eq!(
        store.statuses(&q(), &[users[0].clone()]).await.unwrap()[0].entry,
        Some(entry)
    );
    let ClaimOutcome::Claimed { claim_id } =
        store.claim(&q(), &users[0], &token, 5_000).await.unwrap()
    else {
        panic!("claim refused");
    };
    assert_eq!(
        entry_of(&store, &users[0]).await,
        entry,
        "claimed: still the entry"
    );
    assert!(store.consume(&q(), &users[0], &claim_id).await.unwrap());
    let used = store.status(&q(), &users[0], false).await.unwrap();
    assert_eq!(used.entry, None, "a used token ends the entry");
    assert!(!store.leave(&q(), &users[0], entry).await.unwrap());
}

/// What a recorded consume retried long after its order (the reconciler,
/// after a restart) relies on: a claim whose lease lapsed still deletes its
/// token while no newer claim holds it; once a newer claim does, the old
/// one deletes nothing and the new one settles the token; a token already
/// gone is answered `false`, never an error.
async fn a_late_consume_deletes_unless_claimed_anew(store: SharedStore) {
    let p = slow(5);
    let ready = |user: UserId| {
        let store = store.clone();
        let p = p.clone();
        async move {
            let entered = store
                .enter(&q(), &user, &p, &EntryToken::generate())
                .await
                .unwrap();
            token_of(&entered.snapshot).expect("fast track")
        }
    };
    let lease_ms = 100;
    let past_the_lease = Duration::from_millis(3 * lease_ms);

    let a = u("late-a");
    let token = ready(a.clone()).await;
    let ClaimOutcome::Claimed { claim_id: lapsed } =
        store.claim(&q(), &a, &token, lease_ms).await.unwrap()
    else {
        panic!("claim expected");
    };
    tokio::time::sleep(past_the_lease).await;
    assert!(store.consume(&q(), &a, &lapsed).await.unwrap());
    assert_eq!(
        store.status(&q(), &a, false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert!(
        !store.consume(&q(), &a, &lapsed).await.unwrap(),
        "already gone"
    );

    let b = u("late-b");
    let token = ready(b.clone()).await;
    let ClaimOutcome::Claimed { claim_id: old } =
        store.claim(&q(), &b, &token, lease_ms).await.unwrap()
    else {
        panic!("claim expected");
    };
    tokio::time::sleep(past_the_lease).await;
    let ClaimOutcome::Claimed { claim_id: new } =
        store.claim(&q(), &b, &token, 60_000).await.unwrap()
    else {
        panic!("the lapsed claim gives way to a new one");
    };
    assert!(!store.consume(&q(), &b, &old).await.unwrap());
    assert_eq!(
        token_of(&store.status(&q(), &b, false).await.unwrap()),
        Some(token),
        "the newer claim's token is untouched"
    );
    assert!(store.consume(&q(), &b, &new).await.unwrap());

    assert!(
        !store
            .consume(&q(), &u("late-none"), "made-up")
            .await
            .unwrap()
    );
}

/// Stock-aware admission (`waitroom::queue::stock`) on every store.
mod stock {
    use super::*;
    use waitroom::queue::StockReport;

    fn report(remaining: u64, per_buyer: u64) -> StockReport {
        StockReport {
            remaining,
            per_buyer,
        }
    }

    fn is_ready(s: &Snapshot) -> bool {
        matches!(s.standing, Standing::Ready { .. })
    }

    /// Enters `users` in order; how many took the fast track.
    async fn enter_all(store: &SharedStore, policy: &Policy, users: &[UserId]) -> usize {
        let mut ready = 0;
        for user in users {
            let out = store
                .enter(&q(), user, policy, &EntryToken::generate())
                .await
                .unwrap();
            ready += usize::from(is_ready(&out.snapshot));
        }
        ready
    }

    pub(super) async fn stock_bounds_the_fast_track_and_passes(store: SharedStore) {
        assert_eq!(store.stock(&q()).await.unwrap(), None, "not linked yet");
        let p = slow(10);
        let state = store.set_stock(&q(), report(3, 1)).await.unwrap();
        assert_eq!(
            (state.remaining, state.admissible, state.sold_out),
            (3, 3, false)
        );
        let users: Vec<UserId> = (0..6).map(|i| u(&format!("s{i}"))).collect();
        // The budget would let all six in at once: the stock lets three.
        assert_eq!(enter_all(&store, &p, &users).await, 3);
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        assert!(pass.admitted.is_empty(), "{pass:?}");
        let state = store.stock(&q()).await.unwrap().unwrap();
        assert_eq!((state.holders, state.admissible), (3, 0));
        // Two more units: the next two in line, in their order.
        store.set_stock(&q(), report(5, 1)).await.unwrap();
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        let admitted: Vec<&str> = pass.admitted.iter().map(|a| a.user.as_str()).collect();
        assert_eq!(admitted, ["s3", "s4"]);
        assert_eq!(
            rank(&store.status(&q(), &users[5], false).await.unwrap()),
            Some(0)
        );
        // Four a buyer, ten units: three buyers can still buy, five hold.
        let state = store.set_stock(&q(), report(10, 4)).await.unwrap();
        assert_eq!((state.holders, state.admissible), (5, 0));
        let state = store.set_stock(&q(), report(30, 4)).await.unwrap();
        assert_eq!(state.admissible, 3, "ceil(30 / 4) - 5");
    }

    pub(super) async fn a_used_token_counts_until_the_next_report(store: SharedStore) {
        let p = slow(10);
        store.set_stock(&q(), report(2, 1)).await.unwrap();
        let users: Vec<UserId> = (0..3).map(|i| u(&format!("c{i}"))).collect();
        assert_eq!(enter_all(&store, &p, &users).await, 2);
        let token = token_of(&store.status(&q(), &users[0], false).await.unwrap()).unwrap();
        let ClaimOutcome::Claimed { claim_id } =
            store.claim(&q(), &users[0], &token, 60_000).await.unwrap()
        else {
            panic!("claim");
        };
        assert!(store.consume(&q(), &users[0], &claim_id).await.unwrap());
        // The order's unit may not be in the stock yet: its buyer still
        // counts, so the one unit left is not promised twice.
        let state = store.stock(&q()).await.unwrap().unwrap();
        assert_eq!(
            (state.holders, state.consumed_since_report, state.admissible),
            (1, 1, 0)
        );
        assert!(
            store
                .admit(&q(), &p, &tokens(10))
                .await
                .unwrap()
                .admitted
                .is_empty()
        );
        // The report after the order: one unit, held by c1.
        let state = store.set_stock(&q(), report(1, 1)).await.unwrap();
        assert_eq!((state.consumed_since_report, state.admissible), (0, 0));
        // A restock of one: c2 is next.
        store.set_stock(&q(), report(2, 1)).await.unwrap();
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        assert_eq!(pass.admitted.len(), 1);
        assert_eq!(pass.admitted[0].user, users[2]);
    }

    pub(super) async fn sold_out_is_published_once_and_read_everywhere(store: SharedStore) {
        let mut events = subscribed(&store).await;
        let p = slow(10);
        store.set_stock(&q(), report(1, 1)).await.unwrap();
        let users: Vec<UserId> = (0..4).map(|i| u(&format!("o{i}"))).collect();
        assert_eq!(enter_all(&store, &p, &users).await, 1);
        let state = store.set_stock(&q(), report(0, 1)).await.unwrap();
        assert!(state.sold_out);
        store.set_stock(&q(), report(0, 1)).await.unwrap();
        // One event for the two reports: the leave after them comes next.
        let entry = entry_of(&store, &users[3]).await;
        assert!(store.leave(&q(), &users[3], entry).await.unwrap());
        let mut got = Vec::new();
        while got.len() < 2 {
            let ev = tokio::time::timeout(Duration::from_secs(3), events.next())
                .await
                .expect("an event within 3 s")
                .expect("stream open");
            if let StoreEvent::Queue { queue, event } = ev {
                assert_eq!(queue, q());
                // The one admission of the fast track is announced too.
                if !matches!(event, QueueEvent::FastTracked { .. }) {
                    got.push(event);
                }
            }
        }
        assert_eq!(got[0], QueueEvent::SoldOut);
        assert!(
            matches!(&got[1], QueueEvent::Left { user, .. } if *user == users[3]),
            "{got:?}"
        );
        // Every read says so; the holder keeps the token, the line its order.
        let s = store.status(&q(), &users[1], true).await.unwrap();
        assert!(s.sold_out && rank(&s) == Some(0), "{s:?}");
        let all = store.statuses(&q(), &users[..3]).await.unwrap();
        assert!(all.iter().all(|s| s.sold_out), "{all:?}");
        assert!(is_ready(&all[0]));
        assert_eq!(rank(&all[2]), Some(1));
        // A new buyer is told at once, and waits behind the others.
        let out = store
            .enter(&q(), &u("late"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(out.snapshot.sold_out && rank(&out.snapshot) == Some(2));
        assert!(
            store
                .admit(&q(), &p, &tokens(10))
                .await
                .unwrap()
                .admitted
                .is_empty()
        );
        // A restock: the line reopens in its order.
        let state = store.set_stock(&q(), report(2, 1)).await.unwrap();
        assert!(!state.sold_out);
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        assert_eq!(pass.admitted.len(), 1, "two units, one held");
        assert_eq!(pass.admitted[0].user, users[1]);
        assert!(!store.status(&q(), &users[2], false).await.unwrap().sold_out);
    }

    pub(super) async fn absent_buyers_are_kept_while_sold_out(store: SharedStore) {
        let p = Policy {
            abandon_after_ms: Some(1_500),
            ..slow(10)
        };
        store.set_stock(&q(), report(1, 1)).await.unwrap();
        let users: Vec<UserId> = (0..3).map(|i| u(&format!("k{i}"))).collect();
        assert_eq!(enter_all(&store, &p, &users).await, 1);
        store.set_stock(&q(), report(0, 1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_700)).await;
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        assert!(pass.abandoned.is_empty(), "kept while sold out: {pass:?}");
        // Reopened: the unseen get abandonAfter from the reopening.
        store.set_stock(&q(), report(2, 1)).await.unwrap();
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        assert!(pass.abandoned.is_empty(), "{pass:?}");
        assert_eq!(pass.admitted.len(), 1);
        assert_eq!(pass.admitted[0].user, users[1]);
        tokio::time::sleep(Duration::from_millis(1_700)).await;
        let pass = store.admit(&q(), &p, &tokens(10)).await.unwrap();
        let dropped: Vec<&str> = pass.abandoned.iter().map(|a| a.user.as_str()).collect();
        assert_eq!(dropped, ["k2"]);
    }

    conformance!(
        stock_bounds_the_fast_track_and_passes,
        a_used_token_counts_until_the_next_report,
        sold_out_is_published_once_and_read_everywhere,
        absent_buyers_are_kept_while_sold_out,
    );
}
fn settings(batch: u32) -> QueueSettings {
    QueueSettings {
        batch,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
        claim_lease_ms: 30_000,
        texts: Default::default(),
        shop_url: None,
        adaptive: None,
    }
}

async fn queue_settings_are_versioned_and_listed(store: SharedStore) {
    let other = QueueName::parse("other").unwrap();
    assert!(store.list_queues().await.unwrap().is_empty());
    assert_eq!(store.queue_settings(&q()).await.unwrap(), None);
    let mut first = settings(3);
    first.max_active = Some(7);
    first.abandon_after_ms = Some(45_000);
    first
        .texts
        .insert("title".into(), "Drop — édition \"限定\"".into());
    first.adaptive = Some(waitroom::queue::AdaptiveSettings {
        floor_per_sec: 2.5,
        ..waitroom::queue::AdaptiveSettings::recommended()
    });
    let (stored, written) = store.put_queue_settings(&q(), &first, false).await.unwrap();
    assert!(written);
    assert_eq!((stored.version, &stored.settings), (1, &first));
    assert!(stored.updated_at > 0);
    assert_eq!(
        store.queue_settings(&q()).await.unwrap(),
        Some(stored.clone())
    );
    // A seed never overwrites what is there.
    let (kept, written) = store
        .put_queue_settings(&q(), &settings(99), true)
        .await
        .unwrap();
    assert!(!written);
    assert_eq!(kept, stored);
    // Unlimited and never round-trip as such.
    let (second, written) = store
        .put_queue_settings(&q(), &settings(4), false)
        .await
        .unwrap();
    assert!(written);
    assert_eq!((second.version, &second.settings), (2, &settings(4)));
    assert!(second.updated_at >= stored.updated_at);
    store
        .put_queue_settings(&other, &settings(1), true)
        .await
        .unwrap();
    assert_eq!(store.list_queues().await.unwrap(), vec![q(), other.clone()]);
    assert!(store.delete_queue(&other).await.unwrap());
    assert!(!store.delete_queue(&other).await.unwrap(), "already gone");
    assert_eq!(store.list_queues().await.unwrap(), vec![q()]);
    assert_eq!(store.queue_settings(&other).await.unwrap(), None);
}

async fn a_pass_runs_on_the_stored_settings(store: SharedStore) {
    store
        .put_queue_settings(&q(), &settings(2), false)
        .await
        .unwrap();
    // Held while they join, so nobody takes the fast track.
    store.set_paused(&q(), true).await.unwrap();
    for i in 0..8 {
        store
            .enter(
                &q(),
                &u(&format!("s{i}")),
                &slow(5),
                &EntryToken::generate(),
            )
            .await
            .unwrap();
    }
    store.set_paused(&q(), false).await.unwrap();
    // The caller asks for 5 with 5 tokens: the stored batch (2) wins.
    let pass = store.admit(&q(), &slow(5), &tokens(5)).await.unwrap();
    assert_eq!(pass.admitted.len(), 2, "{pass:?}");
    // A stored maxActive of 3 leaves room for one more, whatever is asked.
    let mut capped = settings(50);
    capped.max_active = Some(3);
    capped.interval_ms = 1;
    store
        .put_queue_settings(&q(), &capped, false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass = store.admit(&q(), &slow(50), &tokens(50)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1, "{pass:?}");
    // A stored TTL governs the tokens issued.
    let mut short = capped.clone();
    short.max_active = None;
    short.token_ttl_ms = 1_234;
    store.put_queue_settings(&q(), &short, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass = store.admit(&q(), &slow(50), &tokens(50)).await.unwrap();
    assert_eq!(pass.admitted.len(), 5, "the rest of the line");
    assert!(pass.admitted.iter().all(|a| a.ttl_ms == 1_234), "{pass:?}");
}

async fn deleting_a_queue_empties_it_but_keeps_entry_ids_fresh(store: SharedStore) {
    store
        .put_queue_settings(&q(), &settings(1), false)
        .await
        .unwrap();
    let mut entries = Vec::new();
    for name in ["d0", "d1", "d2"] {
        let e = store
            .enter(&q(), &u(name), &slow(1), &EntryToken::generate())
            .await
            .unwrap();
        entries.push(e.snapshot.entry.unwrap());
    }
    store.set_paused(&q(), true).await.unwrap();
    let (stored, _) = store
        .put_queue_settings(&q(), &settings(1), false)
        .await
        .unwrap();
    let decided = waitroom::store::AdaptiveState {
        window: 7,
        window_ms: 1_000,
        verdict: "hold".into(),
        ..Default::default()
    };
    assert!(
        store
            .adaptive_apply(&q(), &decided, None, stored.version, 1_000)
            .await
            .unwrap()
    );
    assert!(store.delete_queue(&q()).await.unwrap());
    let read = store.adaptive_read(&q(), 1_000).await.unwrap();
    assert_eq!(read.state, None, "a deleted queue's decision goes with it");
    let stats = store.stats(&q()).await.unwrap();
    assert_eq!((stats.waiting, stats.paused), (0, false), "{stats:?}");
    assert_eq!(
        store.status(&q(), &u("d1"), false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert!(store.list_queues().await.unwrap().is_empty());
    let again = store
        .enter(&q(), &u("d1"), &slow(1), &EntryToken::generate())
        .await
        .unwrap();
    let new_entry = again.snapshot.entry.unwrap();
    assert!(
        entries.iter().all(|&e| new_entry > e),
        "entry ids go on: {new_entry} after {entries:?}"
    );
}

async fn stream_reports_are_shared_until_they_lapse(store: SharedStore) {
    let all = store.report_streams("host-a/1", 5, 60_000).await.unwrap();
    assert_eq!(all, vec![("host-a/1".to_owned(), 5)]);
    store.report_streams("host-b/2", 7, 150).await.unwrap();
    let all = store.report_streams("host-a/1", 6, 60_000).await.unwrap();
    assert_eq!(
        all,
        vec![("host-a/1".to_owned(), 6), ("host-b/2".to_owned(), 7)],
        "the latest report of each"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let all = store.report_streams("host-a/1", 6, 60_000).await.unwrap();
    assert_eq!(all, vec![("host-a/1".to_owned(), 6)], "b stopped reporting");
}

/// The audit log (`waitroom::queue::audit`): written by the action's own
/// atomic step, paged by id, and taken by webhook groups.
mod audit {
    use super::*;
    use waitroom::queue::StockReport;
    use waitroom::queue::audit::{AuditEntry, AuditId, AuditKind, AuditQuery};

    fn all(after: Option<AuditId>, limit: usize) -> AuditQuery {
        AuditQuery {
            after,
            limit,
            kind: None,
        }
    }

    /// Every entry, by following `next` from the start with pages of `limit`.
    async fn read_all(
        store: &SharedStore,
        limit: usize,
        kind: Option<AuditKind>,
    ) -> Vec<AuditEntry> {
        let mut out = Vec::new();
        let mut after = None;
        for _ in 0..1000 {
            let page = store
                .audit_page(&q(), AuditQuery { after, limit, kind })
                .await
                .unwrap();
            assert!(page.entries.len() <= limit);
            out.extend(page.entries);
            match page.next {
                Some(next) => after = Some(next),
                None => return out,
            }
        }
        panic!("paging never ended");
    }

    fn summary(entries: &[AuditEntry]) -> Vec<(AuditKind, Option<String>)> {
        entries.iter().map(|e| (e.kind, e.user.clone())).collect()
    }

    async fn every_action_is_logged_once_in_order(store: SharedStore) {
        let p = Policy {
            max_active: Some(1),
            abandon_after_ms: Some(800),
            ..slow(2)
        };
        let users = fill(&store, &p, "a", 4).await; // a0 fast track, a1..a3 wait
        let entries: Vec<u64> = {
            let mut v = Vec::new();
            for user in &users {
                v.push(entry_of(&store, user).await);
            }
            v
        };
        // Refused actions write nothing.
        assert!(
            !store
                .leave(&q(), &users[2], entries[2] + 1000)
                .await
                .unwrap()
        );
        assert!(
            !store
                .consume(&q(), &users[0], "no-such-claim")
                .await
                .unwrap()
        );
        assert!(
            !store
                .release(&q(), &users[0], "no-such-claim")
                .await
                .unwrap()
        );
        assert!(store.leave(&q(), &users[2], entries[2]).await.unwrap());
        let token = token_of(&store.status(&q(), &users[0], false).await.unwrap()).unwrap();
        let ClaimOutcome::Claimed { claim_id } =
            store.claim(&q(), &users[0], &token, 5_000).await.unwrap()
        else {
            panic!("claim expected");
        };
        assert!(store.release(&q(), &users[0], &claim_id).await.unwrap());
        let ClaimOutcome::Claimed { claim_id } =
            store.claim(&q(), &users[0], &token, 5_000).await.unwrap()
        else {
            panic!("claim expected");
        };
        assert!(store.consume(&q(), &users[0], &claim_id).await.unwrap());
        assert!(
            !store.consume(&q(), &users[0], &claim_id).await.unwrap(),
            "a replay logs nothing"
        );
        let first = store.admit(&q(), &p, &tokens(2)).await.unwrap();
        assert_eq!(first.admitted.len(), 1);
        tokio::time::sleep(Duration::from_millis(900)).await;
        let second = store.admit(&q(), &p, &tokens(2)).await.unwrap();
        assert_eq!(second.abandoned.len(), 1, "{second:?}");
        let report = StockReport {
            remaining: 0,
            per_buyer: 1,
        };
        store.set_stock(&q(), report).await.unwrap();
        store.set_stock(&q(), report).await.unwrap(); // still sold out: no second entry

        let log = read_all(&store, 100, None).await;
        let name = |i: usize| Some(users[i].as_str().to_owned());
        assert_eq!(
            summary(&log),
            [
                (AuditKind::Admitted, name(0)),
                (AuditKind::Left, name(2)),
                (AuditKind::Released, name(0)),
                (AuditKind::Consumed, name(0)),
                (AuditKind::Admitted, name(1)),
                (AuditKind::Abandoned, name(3)),
                (AuditKind::SoldOut, None),
            ]
        );
        let entry_ids: Vec<Option<u64>> = log.iter().map(|e| e.entry).collect();
        let e = |i: usize| Some(entries[i]);
        assert_eq!(entry_ids, [e(0), e(2), e(0), e(0), e(1), e(3), None]);
        let passes: Vec<Option<u64>> = log.iter().map(|e| e.pass).collect();
        assert_eq!(
            passes,
            [
                None,
                None,
                None,
                None,
                Some(first.pass),
                Some(second.pass),
                None
            ]
        );
        for pair in log.windows(2) {
            assert!(pair[0].id < pair[1].id, "ids grow: {pair:?}");
            assert!(pair[0].at <= pair[1].at);
        }
    }

    async fn pages_return_everything_once_and_filter_by_kind(store: SharedStore) {
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        for i in 0..12 {
            let user = u(&format!("p{i:02}"));
            store
                .enter(&q(), &user, &p, &EntryToken::generate())
                .await
                .unwrap();
            assert!(leave_current(&store, &user).await);
            if i % 5 == 0 {
                let remaining = if i % 10 == 0 { 0 } else { 3 };
                store
                    .set_stock(
                        &q(),
                        StockReport {
                            remaining,
                            per_buyer: 1,
                        },
                    )
                    .await
                    .unwrap();
            }
        }
        let whole = store.audit_page(&q(), all(None, 1000)).await.unwrap();
        assert_eq!(whole.next, None, "all of it fits in one page");
        assert_eq!(
            whole.entries.len(),
            14,
            "12 leaves, 2 sold outs: {:?}",
            summary(&whole.entries)
        );
        for limit in [1, 3, 7, 14] {
            assert_eq!(
                read_all(&store, limit, None).await,
                whole.entries,
                "limit {limit}"
            );
        }
        let sold: Vec<AuditEntry> = whole
            .entries
            .iter()
            .filter(|e| e.kind == AuditKind::SoldOut)
            .cloned()
            .collect();
        assert_eq!(sold.len(), 2);
        assert_eq!(read_all(&store, 1, Some(AuditKind::SoldOut)).await, sold);
        assert!(
            read_all(&store, 5, Some(AuditKind::Consumed))
                .await
                .is_empty()
        );
        // After the last id: an empty last page.
        let last = whole.entries.last().unwrap().id;
        let after = store.audit_page(&q(), all(Some(last), 10)).await.unwrap();
        assert!(after.entries.is_empty() && after.next.is_none());
        // After an id between two entries: from the next one on.
        let mid = whole.entries[4].id;
        let page = store.audit_page(&q(), all(Some(mid), 2)).await.unwrap();
        assert_eq!(page.entries, whole.entries[5..7]);
        assert_eq!(page.next, Some(whole.entries[6].id));
        // Another queue's log is its own.
        let other = QueueName::parse("other").unwrap();
        let page = store.audit_page(&other, all(None, 10)).await.unwrap();
        assert!(page.entries.is_empty());
    }

    async fn groups_hand_each_entry_to_one_consumer(store: SharedStore) {
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        for i in 0..5 {
            let user = u(&format!("g{i}"));
            store
                .enter(&q(), &user, &p, &EntryToken::generate())
                .await
                .unwrap();
            assert!(leave_current(&store, &user).await);
        }
        let log = store
            .audit_page(&q(), all(None, 100))
            .await
            .unwrap()
            .entries;
        assert_eq!(log.len(), 5);
        let ids = |v: &[AuditEntry]| v.iter().map(|e| e.id).collect::<Vec<_>>();
        let zero = AuditId::default();
        let a = store
            .audit_take(&q(), "hook", zero, "A", 60_000, 3)
            .await
            .unwrap();
        assert_eq!(ids(&a), ids(&log[..3]));
        let b = store
            .audit_take(&q(), "hook", zero, "B", 60_000, 3)
            .await
            .unwrap();
        assert_eq!(ids(&b), ids(&log[3..]), "B gets only what A was not given");
        assert!(
            store
                .audit_take(&q(), "hook", zero, "A", 60_000, 3)
                .await
                .unwrap()
                .is_empty()
        );
        store.audit_ack(&q(), "hook", &ids(&a)).await.unwrap();
        // B stops holding its two; once idle past the timeout, A claims them.
        tokio::time::sleep(Duration::from_millis(80)).await;
        let claimed = store
            .audit_take(&q(), "hook", zero, "A", 50, 10)
            .await
            .unwrap();
        assert_eq!(ids(&claimed), ids(&log[3..]));
        // A holds them: B cannot claim them back within the timeout.
        store
            .audit_hold(&q(), "hook", "A", &ids(&claimed))
            .await
            .unwrap();
        assert!(
            store
                .audit_take(&q(), "hook", zero, "B", 5_000, 10)
                .await
                .unwrap()
                .is_empty()
        );
        store.audit_ack(&q(), "hook", &ids(&claimed)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            store
                .audit_take(&q(), "hook", zero, "B", 1, 10)
                .await
                .unwrap()
                .is_empty(),
            "acknowledged for good"
        );
        // Another group sees every entry again, from its own start.
        let late = store
            .audit_take(&q(), "late", log[2].id, "A", 60_000, 10)
            .await
            .unwrap();
        assert_eq!(ids(&late), ids(&log[3..]));
    }

    conformance!(
        every_action_is_logged_once_in_order,
        pages_return_everything_once_and_filter_by_kind,
        groups_hand_each_entry_to_one_consumer,
    );
}

/// Adaptive admission: order outcomes counted per window of the store
/// clock, and one decision per window however many instances decide.
mod adaptive {
    use super::*;
    use waitroom::store::{AdaptiveState, OrderSignal};

    const WINDOW: u64 = 400;

    /// Sleeps until a fresh window of the store clock has most of its
    /// length left, and answers that window.
    async fn fresh_window(store: &SharedStore) -> u64 {
        loop {
            let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
            let into = read.now_ms % WINDOW;
            if into < WINDOW / 4 {
                return read.window + 1;
            }
            tokio::time::sleep(Duration::from_millis(WINDOW - into + 5)).await;
        }
    }

    fn decision(window: u64, rate: f64) -> AdaptiveState {
        AdaptiveState {
            window,
            window_ms: WINDOW,
            rate_per_sec: rate,
            hold_until: window + 1,
            verdict: "decrease_slow".into(),
            p95_ms: Some(1_000),
            commits: 3,
            failures: 1,
            at: 0,
            evidence_from: window + 1,
        }
    }

    async fn outcomes_are_counted_per_window_and_decided_once(store: SharedStore) {
        let (stored, _) = store
            .put_queue_settings(&q(), &settings(10), false)
            .await
            .unwrap();
        let nothing = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(nothing.samples.commits(), 0);
        assert_eq!(nothing.state, None, "no decision yet");
        let window = fresh_window(&store).await;
        for signal in [
            OrderSignal::Committed { ms: 40 },
            OrderSignal::Committed { ms: 45 },
            OrderSignal::Committed { ms: 900 },
            OrderSignal::RolledBack,
        ] {
            store.record_order(&q(), signal, WINDOW).await.unwrap();
        }
        // Not complete yet: the last complete window is the one before.
        let early = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(early.window, window - 1);
        assert_eq!(early.samples.commits(), 0);
        tokio::time::sleep(Duration::from_millis(WINDOW)).await;
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(read.window, window, "{read:?}");
        assert_eq!(
            (read.samples.commits(), read.samples.failures),
            (3, 1),
            "{read:?}"
        );
        assert_eq!(read.samples.p95_ms(), Some(1_000));

        // The first decision for the window wins and sets the batch.
        let d = decision(window, 3.5);
        assert!(
            store
                .adaptive_apply(&q(), &d, Some(7), stored.version, WINDOW)
                .await
                .unwrap()
        );
        let after = store.queue_settings(&q()).await.unwrap().unwrap();
        assert_eq!(
            (after.settings.batch, after.version),
            (7, stored.version + 1)
        );
        // A second one for the same window is refused, even on fresh settings.
        let again = decision(window, 1.0);
        assert!(
            !store
                .adaptive_apply(&q(), &again, Some(2), after.version, WINDOW)
                .await
                .unwrap()
        );
        // A later window on settings an operator changed meanwhile: refused.
        let later = decision(window + 1, 1.0);
        assert!(
            !store
                .adaptive_apply(&q(), &later, Some(2), stored.version, WINDOW)
                .await
                .unwrap()
        );
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        let state = read.state.expect("the decision is stored");
        assert_eq!((state.window, state.rate_per_sec), (window, 3.5));
        assert_eq!(
            (state.hold_until, state.verdict.as_str()),
            (window + 1, "decrease_slow")
        );
        assert_eq!(
            (state.p95_ms, state.commits, state.failures),
            (Some(1_000), 3, 1)
        );
        assert!(state.at > 0);
        let now = store.queue_settings(&q()).await.unwrap().unwrap();
        assert_eq!((now.settings.batch, now.version), (7, after.version));
        // No batch: the decision is stored, the settings stay as they are.
        let keep = decision(window + 1, 3.6);
        assert!(
            store
                .adaptive_apply(&q(), &keep, None, now.version, WINDOW)
                .await
                .unwrap()
        );
        let kept = store.queue_settings(&q()).await.unwrap().unwrap();
        assert_eq!(kept.version, now.version);
        // Windows made longer: one that ends no later than the last decided
        // is refused (window indexes of two lengths are not comparable).
        let longer = AdaptiveState {
            window: (window + 2) / 4 - 1,
            window_ms: WINDOW * 4,
            ..decision(0, 9.0)
        };
        assert!(
            !store
                .adaptive_apply(&q(), &longer, None, kept.version, WINDOW * 4)
                .await
                .unwrap()
        );
        let next = AdaptiveState {
            window: (window + 2) / 4 + 1,
            ..longer
        };
        assert!(
            store
                .adaptive_apply(&q(), &next, None, kept.version, WINDOW * 4)
                .await
                .unwrap()
        );
    }

    async fn concurrent_decisions_for_one_window_store_one(store: SharedStore) {
        let (stored, _) = store
            .put_queue_settings(&q(), &settings(10), false)
            .await
            .unwrap();
        let tries = (0..8u32).map(|i| {
            let store = store.clone();
            let version = stored.version;
            async move {
                let d = decision(42, f64::from(i) + 1.0);
                store
                    .adaptive_apply(&q(), &d, Some(i + 1), version, WINDOW)
                    .await
                    .unwrap()
            }
        });
        let won: Vec<bool> = futures::future::join_all(tries).await;
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
        let winner = won.iter().position(|w| *w).unwrap() as u32;
        let now = store.queue_settings(&q()).await.unwrap().unwrap();
        assert_eq!(
            (now.settings.batch, now.version),
            (winner + 1, stored.version + 1)
        );
        // A queue without settings takes no decision.
        let other = QueueName::parse("nothing-here").unwrap();
        assert!(
            !store
                .adaptive_apply(&other, &decision(42, 1.0), Some(3), 1, WINDOW)
                .await
                .unwrap()
        );
    }

    /// A window with too few orders leaves them as evidence: the next read
    /// sums them with the next window's, until a decision moves the
    /// evidence on; never more than the longest evidence back.
    async fn too_few_orders_are_gathered_over_windows(store: SharedStore) {
        use waitroom::queue::adaptive::MAX_EVIDENCE_WINDOWS;
        let (stored, _) = store
            .put_queue_settings(&q(), &settings(10), false)
            .await
            .unwrap();
        let first = fresh_window(&store).await;
        for ms in [40, 45] {
            let signal = OrderSignal::Committed { ms };
            store.record_order(&q(), signal, WINDOW).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(WINDOW)).await;
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!((read.window, read.evidence_from), (first, first));
        // Still gathering: the decision keeps its evidence where it began.
        let gathering = AdaptiveState {
            verdict: "too_few_samples".into(),
            evidence_from: first,
            ..decision(first, 3.0)
        };
        assert!(
            store
                .adaptive_apply(&q(), &gathering, None, stored.version, WINDOW)
                .await
                .unwrap()
        );
        store
            .record_order(&q(), OrderSignal::RolledBack, WINDOW)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(WINDOW)).await;
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(read.window, first + 1, "{read:?}");
        assert_eq!(read.evidence_from, first, "{read:?}");
        assert_eq!(
            (read.samples.commits(), read.samples.failures),
            (2, 1),
            "both windows: {read:?}"
        );
        // Decided: the gathered windows are done with.
        let decided = decision(first + 1, 4.0);
        assert!(
            store
                .adaptive_apply(&q(), &decided, None, stored.version, WINDOW)
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(WINDOW)).await;
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(read.evidence_from, first + 2, "{read:?}");
        assert_eq!(read.samples.commits() + read.samples.failures, 0);
        // Evidence said to begin long ago reaches back the longest span only.
        let long_ago = AdaptiveState {
            evidence_from: 1,
            ..decision(read.window, 4.0)
        };
        assert!(
            store
                .adaptive_apply(&q(), &long_ago, None, stored.version, WINDOW)
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(WINDOW)).await;
        let read = store.adaptive_read(&q(), WINDOW).await.unwrap();
        assert_eq!(
            read.evidence_from,
            read.window + 1 - MAX_EVIDENCE_WINDOWS,
            "{read:?}"
        );
        // Another window length: the evidence is the last window alone.
        let other = store.adaptive_read(&q(), WINDOW * 2).await.unwrap();
        assert_eq!(other.evidence_from, other.window, "{other:?}");
    }

    conformance!(
        outcomes_are_counted_per_window_and_decided_once,
        concurrent_decisions_for_one_window_store_one,
        too_few_orders_are_gathered_over_windows,
    );
}

/// A scheduled opening with a lottery (`waitroom::queue::lottery`): the
/// pre-queue, and the draw that places it in line all at once, once.
mod lottery {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use waitroom::queue::lottery::{draw_order, fingerprint, new_seed, published_list};
    use waitroom::store::{
        AddressLimits, DrawOutcome, DrawStep, JoinLimits, LimitKind, LotteryRefusal, PreJoin, Rate,
    };

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// Joins `user` to the pre-queue: their pre-queue entry id.
    async fn pre(store: &SharedStore, user: &UserId) -> u64 {
        match store
            .pre_join(&q(), user, &waitroom::queue::lottery::new_nonce())
            .await
            .unwrap()
        {
            PreJoin::Pre { entry, .. } => entry.pre_entry,
            PreJoin::Open => panic!("{user} was not put in the pre-queue"),
        }
    }

    /// The order the rules give for the current pre-queue, and its version.
    async fn computed(store: &SharedStore, seed: &str) -> (u64, Vec<UserId>, String) {
        let seed = waitroom::queue::lottery::parse_seed(seed).unwrap();
        let (version, entries) = store.pre_queue(&q()).await.unwrap();
        let fps: Vec<String> = entries
            .iter()
            .map(|(_, e)| fingerprint("default", &e.nonce))
            .collect();
        let order = draw_order(&seed, &fps)
            .into_iter()
            .map(|i| entries[i].0.clone())
            .collect();
        (version, order, published_list(fps).join("\n"))
    }

    async fn a_lottery_keeps_its_commitment_and_is_fixed_once_drawn(store: SharedStore) {
        assert!(store.lottery(&q()).await.unwrap().is_none());
        let seed = new_seed();
        let first = store
            .schedule_lottery(&q(), now_ms() + 60_000, &seed)
            .await
            .unwrap()
            .unwrap();
        assert!(!first.drawn);
        assert_eq!(first.seed, seed);
        let expected = waitroom::queue::lottery::commitment(
            &waitroom::queue::lottery::parse_seed(&seed).unwrap(),
        );
        assert_eq!(first.commitment, expected);
        // Moving the time keeps the seed: the commitment already published
        // stays true.
        let opens_at = now_ms() + 150;
        let moved = store
            .schedule_lottery(&q(), opens_at, &new_seed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((moved.opens_at, &moved.seed), (opens_at, &seed));
        assert_eq!(moved.commitment, first.commitment);
        // Not cleared while someone waits for it.
        pre(&store, &u("a")).await;
        assert_eq!(
            store.clear_lottery(&q()).await.unwrap(),
            Err(LotteryRefusal::NotEmpty)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (version, order, list) = computed(&store, &seed).await;
        assert_eq!(
            store.draw(&q(), version, &order, &list).await.unwrap(),
            DrawOutcome::Drawn { placed: 1 }
        );
        assert_eq!(
            store
                .schedule_lottery(&q(), now_ms() + 60_000, &new_seed())
                .await
                .unwrap(),
            Err(LotteryRefusal::Drawn)
        );
        assert_eq!(
            store.clear_lottery(&q()).await.unwrap(),
            Err(LotteryRefusal::Drawn)
        );
        let after = store.lottery(&q()).await.unwrap().unwrap();
        assert!(after.drawn);
        assert_eq!((after.seed, after.entries), (seed, 1));
    }

    async fn the_draw_places_the_whole_pre_queue_in_drawn_order_once(store: SharedStore) {
        let p = slow(5);
        let seed = new_seed();
        store
            .schedule_lottery(&q(), now_ms() + 300, &seed)
            .await
            .unwrap()
            .unwrap();
        let users: Vec<UserId> = (0..30).map(|i| u(&format!("p{i:02}"))).collect();
        let mut pre_entries = Vec::new();
        for user in &users {
            pre_entries.push(pre(&store, user).await);
        }
        // A repeat join keeps the entry (and its nonce).
        let again = store.pre_join(&q(), &users[3], "ffff").await.unwrap();
        match again {
            PreJoin::Pre { entry, created } => {
                assert!(!created);
                assert_eq!(entry.pre_entry, pre_entries[3]);
                assert_ne!(entry.nonce, "ffff");
            }
            PreJoin::Open => panic!("a repeat join left the pre-queue"),
        }
        // Nobody in the pre-queue is admitted before the draw.
        let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
        assert!(pass.admitted.is_empty(), "{pass:?}");
        assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
        let (version, order, list) = computed(&store, &seed).await;
        // Too early on the store clock: nothing happens.
        assert_eq!(
            store.draw(&q(), version, &order, &list).await.unwrap(),
            DrawOutcome::Stale
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
        // A stale version, a missing user, a duplicate: nothing happens.
        assert_eq!(
            store.draw(&q(), version + 1, &order, &list).await.unwrap(),
            DrawOutcome::Stale
        );
        assert_eq!(
            store.draw(&q(), version, &order[1..], &list).await.unwrap(),
            DrawOutcome::Stale
        );
        let mut dup = order.clone();
        dup[1] = dup[0].clone();
        assert_eq!(
            store.draw(&q(), version, &dup, &list).await.unwrap(),
            DrawOutcome::Stale
        );
        assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
        assert_eq!(
            store.draw(&q(), version, &order, &list).await.unwrap(),
            DrawOutcome::Drawn { placed: 30 }
        );
        assert_eq!(
            store.draw(&q(), version, &order, &list).await.unwrap(),
            DrawOutcome::AlreadyDrawn
        );
        for (i, user) in order.iter().enumerate() {
            let s = store.status(&q(), user, false).await.unwrap();
            assert_eq!(rank(&s), Some(i as u64), "{user}");
            let e = store.pre_entry(&q(), user).await.unwrap().unwrap();
            assert_eq!(e.entry, s.entry, "{user}: the record names the place");
        }
        assert_eq!(store.lottery_list(&q()).await.unwrap().unwrap(), list);
        // Later arrivals: an ordinary join, behind everyone drawn.
        let late = u("late");
        assert_eq!(
            store.pre_join(&q(), &late, "00").await.unwrap(),
            PreJoin::Open
        );
        let s = store
            .enter(&q(), &late, &p, &EntryToken::generate())
            .await
            .unwrap();
        assert_eq!(rank(&s.snapshot), Some(30));
        // Admission now takes the drawn head first.
        let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
        let admitted: Vec<&UserId> = pass.admitted.iter().map(|a| &a.user).collect();
        assert_eq!(admitted, order[..5].iter().collect::<Vec<_>>());
    }

    async fn leaving_the_pre_queue_takes_the_entry_out_of_the_draw(store: SharedStore) {
        let seed = new_seed();
        // In line before the lottery was scheduled.
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        store
            .enter(&q(), &u("c"), &p, &EntryToken::generate())
            .await
            .unwrap();
        store
            .schedule_lottery(&q(), now_ms() + 100, &seed)
            .await
            .unwrap()
            .unwrap();
        let a = pre(&store, &u("a")).await;
        pre(&store, &u("b")).await;
        let (v1, _) = store.pre_queue(&q()).await.unwrap();
        assert!(!store.pre_leave(&q(), &u("a"), a + 1000).await.unwrap());
        assert!(store.pre_leave(&q(), &u("a"), a).await.unwrap());
        assert!(!store.pre_leave(&q(), &u("a"), a).await.unwrap());
        let (v2, entries) = store.pre_queue(&q()).await.unwrap();
        assert_ne!(v1, v2, "a leave changes the version");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, u("b"));
        assert!(store.pre_entry(&q(), &u("a")).await.unwrap().is_none());
        // A user already in line is not put in the pre-queue, and their
        // repeat join keeps their place.
        assert_eq!(
            store.pre_join(&q(), &u("c"), "00").await.unwrap(),
            PreJoin::Open
        );
        let again = store
            .enter(&q(), &u("c"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(
            !again.pre_queue && rank(&again.snapshot) == Some(0),
            "{again:?}"
        );
    }

    /// The join step itself sends a join without a place to the pre-queue
    /// while a lottery waits to be drawn (whatever an instance believes),
    /// changing nothing; alone or in a group; after the draw, joins queue
    /// behind the drawn.
    async fn a_join_before_the_draw_is_sent_to_the_pre_queue(store: SharedStore) {
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        store
            .schedule_lottery(&q(), now_ms() + 300, &new_seed())
            .await
            .unwrap()
            .unwrap();
        let out = store
            .enter(&q(), &u("x"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(out.pre_queue && !out.created, "{out:?}");
        assert_eq!(out.snapshot.entry, None);
        let group = futures::future::join_all((0..20).map(|i| {
            let store = store.clone();
            let p = p.clone();
            async move {
                store
                    .enter(&q(), &u(&format!("g{i}")), &p, &EntryToken::generate())
                    .await
                    .unwrap()
            }
        }))
        .await;
        assert!(group.iter().all(|o| o.pre_queue), "{group:?}");
        assert_eq!(store.stats(&q()).await.unwrap().waiting, 0, "nothing added");
        assert_eq!(store.lottery(&q()).await.unwrap().unwrap().entries, 0);
        pre(&store, &u("x")).await;
        // In the pre-queue already: still the pre-queue's.
        let out = store
            .enter(&q(), &u("x"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(out.pre_queue, "{out:?}");
        tokio::time::sleep(Duration::from_millis(350)).await;
        let drawn = waitroom::lottery::draw_if_due(&store, &q()).await.unwrap();
        assert!(
            matches!(drawn, Some(DrawOutcome::Drawn { placed: 1 })),
            "{drawn:?}"
        );
        let out = store
            .enter(&q(), &u("late"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(!out.pre_queue && out.created, "{out:?}");
        assert_eq!(rank(&out.snapshot), Some(1), "behind the drawn");
    }

    /// A new pre-queue entry counts against the address like a new place:
    /// over its places or its join rate it is refused and nothing changes;
    /// a repeat pre-join is not counted; a left entry frees its slot; drawn
    /// entries keep counting as the places they became.
    async fn pre_queue_entries_count_against_the_address(store: SharedStore) {
        let places = AddressLimits {
            key: "198.51.100.7".into(),
            joins: None,
            places: Some(2),
        };
        store
            .schedule_lottery(&q(), now_ms() + 300, &new_seed())
            .await
            .unwrap()
            .unwrap();
        let join = |user: &'static str, address: AddressLimits| {
            let store = store.clone();
            async move {
                store
                    .pre_join_limited(&q(), &u(user), "ab", Some(&address))
                    .await
                    .unwrap()
            }
        };
        let Ok(PreJoin::Pre { entry: first, .. }) = join("a1", places.clone()).await else {
            panic!("a first entry is never refused");
        };
        assert!(matches!(
            join("a2", places.clone()).await,
            Ok(PreJoin::Pre { created: true, .. })
        ));
        let refused = join("a3", places.clone()).await;
        assert!(
            matches!(&refused, Err(l) if l.kind == LimitKind::AddressPlaces),
            "{refused:?}"
        );
        assert!(matches!(
            join("a1", places.clone()).await,
            Ok(PreJoin::Pre { created: false, .. })
        ));
        assert_eq!(store.lottery(&q()).await.unwrap().unwrap().entries, 2);
        assert!(
            store
                .pre_leave(&q(), &u("a1"), first.pre_entry)
                .await
                .unwrap()
        );
        assert!(matches!(
            join("a3", places.clone()).await,
            Ok(PreJoin::Pre { created: true, .. })
        ));
        let rate = AddressLimits {
            key: "198.51.100.8".into(),
            joins: Some(Rate {
                period_ms: 60_000,
                burst: 1,
            }),
            places: None,
        };
        assert!(matches!(
            join("b1", rate.clone()).await,
            Ok(PreJoin::Pre { created: true, .. })
        ));
        let refused = join("b2", rate.clone()).await;
        assert!(
            matches!(&refused, Err(l) if l.kind == LimitKind::AddressJoins && l.retry_after_ms > 0),
            "{refused:?}"
        );
        assert_eq!(store.lottery(&q()).await.unwrap().unwrap().entries, 3);
        // Drawn: a2 and a3 are in line, and still the address's two places.
        tokio::time::sleep(Duration::from_millis(350)).await;
        let drawn = waitroom::lottery::draw_if_due(&store, &q()).await.unwrap();
        assert!(
            matches!(drawn, Some(DrawOutcome::Drawn { placed: 3 })),
            "{drawn:?}"
        );
        let limits = JoinLimits {
            buyer: None,
            address: Some(places),
        };
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        let out = store
            .enter_limited(&q(), &u("a4"), &p, &EntryToken::generate(), &limits)
            .await
            .unwrap();
        assert!(
            matches!(&out, Err(l) if l.kind == LimitKind::AddressPlaces),
            "{out:?}"
        );
    }

    async fn instances_drawing_together_draw_once(store: SharedStore) {
        let mut events = subscribed(&store).await;
        let opens_at = now_ms() + 100;
        store
            .schedule_lottery(&q(), opens_at, &new_seed())
            .await
            .unwrap()
            .unwrap();
        for i in 0..50 {
            pre(&store, &u(&format!("r{i}"))).await;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        let tries = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { waitroom::lottery::draw_if_due(&store, &q()).await })
        });
        let outcomes: Vec<_> = futures::future::join_all(tries)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        let drawn = outcomes
            .iter()
            .filter(|o| matches!(o, Some(DrawOutcome::Drawn { placed: 50 })))
            .count();
        assert_eq!(drawn, 1, "{outcomes:?}");
        assert_eq!(store.stats(&q()).await.unwrap().waiting, 50);
        let seen: HashSet<u64> = futures::future::join_all((0..50).map(|i| {
            let store = store.clone();
            async move { entry_of(&store, &u(&format!("r{i}"))).await }
        }))
        .await
        .into_iter()
        .collect();
        assert_eq!(seen.len(), 50, "every entry placed once");
        // One `Drawn` event for the eight tries (pre-queue streams on every
        // instance move on it); the leave after it bounds the wait.
        let leaver = u("r0");
        let entry = entry_of(&store, &leaver).await;
        assert!(store.leave(&q(), &leaver, entry).await.unwrap());
        let mut got = Vec::new();
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(3), events.next())
                .await
                .expect("an event within 3 s")
                .expect("stream open");
            if let StoreEvent::Queue { queue, event } = ev {
                assert_eq!(queue, q());
                let done = matches!(&event, QueueEvent::Left { user, .. } if *user == leaver);
                got.push(event);
                if done {
                    break;
                }
            }
        }
        assert_eq!(
            got.iter().filter(|e| **e == QueueEvent::Drawn).count(),
            1,
            "{got:?}"
        );
        // The schedule published its time first (pre-queue streams show it).
        assert_eq!(got[0], QueueEvent::Rescheduled { opens_at }, "{got:?}");
        assert_eq!(
            got[1],
            QueueEvent::Drawn,
            "published with the draw: {got:?}"
        );
    }

    /// Schedules an opening `ms` ahead and pre-queues `n` users `{name}NN`;
    /// the seed and the users.
    async fn scheduled_with(
        store: &SharedStore,
        ms: u64,
        name: &str,
        n: usize,
    ) -> (String, Vec<UserId>) {
        let seed = new_seed();
        store
            .schedule_lottery(&q(), now_ms() + ms, &seed)
            .await
            .unwrap()
            .unwrap();
        let users: Vec<UserId> = (0..n).map(|i| u(&format!("{name}{i:02}"))).collect();
        for user in &users {
            pre(store, user).await;
        }
        (seed, users)
    }

    /// Asserts the line is exactly `expected`, front first.
    async fn line_is(store: &SharedStore, expected: &[UserId]) {
        assert_eq!(
            store.stats(&q()).await.unwrap().waiting,
            expected.len() as u64
        );
        for (i, user) in expected.iter().enumerate() {
            let s = store.status(&q(), user, false).await.unwrap();
            assert_eq!(rank(&s), Some(i as u64), "{user}: {s:?}");
        }
    }

    /// A staged draw: chunk by chunk nobody sees it (no place in line, no
    /// admission, the records without a place, the schedule closed), then
    /// one commit puts the whole order in line; a retried chunk changes
    /// nothing; steps out of turn are refused.
    async fn a_staged_draw_is_seen_only_once_committed(store: SharedStore) {
        let mut events = subscribed(&store).await;
        let (seed, _) = scheduled_with(&store, 150, "s", 23).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (version, order, list) = computed(&store, &seed).await;
        let id = "draw-one";
        assert_eq!(
            store
                .draw_begin(&q(), id, version, 23, &list, 60_000)
                .await
                .unwrap(),
            DrawStep::Staged { staged: 0 }
        );
        // Too late to move or clear.
        assert_eq!(
            store
                .schedule_lottery(&q(), now_ms() + 60_000, &seed)
                .await
                .unwrap(),
            Err(LotteryRefusal::Drawn)
        );
        let p = slow(5);
        let mut offset = 0;
        for chunk in order.chunks(5) {
            // Out of turn: refused, nothing changes.
            assert_eq!(
                store.draw_stage(&q(), id, offset + 1, chunk).await.unwrap(),
                DrawStep::Lost
            );
            assert_eq!(
                store.draw_commit(&q(), id).await.unwrap(),
                DrawStep::Lost,
                "not every position staged yet"
            );
            let step = store.draw_stage(&q(), id, offset, chunk).await.unwrap();
            offset += chunk.len() as u64;
            assert_eq!(step, DrawStep::Staged { staged: offset });
            // A retry of the chunk just staged (its answer lost).
            assert_eq!(
                store
                    .draw_stage(&q(), id, offset - chunk.len() as u64, chunk)
                    .await
                    .unwrap(),
                DrawStep::Staged { staged: offset }
            );
            assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
            let pass = store.admit(&q(), &p, &tokens(5)).await.unwrap();
            assert!(pass.admitted.is_empty(), "{pass:?}");
            for user in &chunk[..1] {
                let s = store.status(&q(), user, false).await.unwrap();
                assert_eq!((rank(&s), s.entry), (None, None), "{user} seen placed");
                let e = store.pre_entry(&q(), user).await.unwrap().unwrap();
                assert_eq!(e.entry, None, "{user}'s record shows a place");
            }
            let l = store.lottery(&q()).await.unwrap().unwrap();
            assert!(!l.drawn && l.staging_idle_ms.is_some(), "{l:?}");
        }
        assert!(store.lottery_list(&q()).await.unwrap().is_none());
        assert_eq!(
            store.draw_commit(&q(), "another").await.unwrap(),
            DrawStep::Lost
        );
        assert_eq!(
            store.draw_commit(&q(), id).await.unwrap(),
            DrawStep::Drawn { placed: 23 }
        );
        assert_eq!(
            store.draw_commit(&q(), id).await.unwrap(),
            DrawStep::AlreadyDrawn
        );
        line_is(&store, &order).await;
        for user in &order {
            let e = store.pre_entry(&q(), user).await.unwrap().unwrap();
            assert_eq!(e.entry, Some(entry_of(&store, user).await), "{user}");
        }
        let l = store.lottery(&q()).await.unwrap().unwrap();
        assert!(l.drawn && l.staging_idle_ms.is_none(), "{l:?}");
        assert_eq!(store.lottery_list(&q()).await.unwrap().unwrap(), list);
        // One `Drawn`, at the commit.
        let mut got = Vec::new();
        while let Ok(Some(ev)) =
            tokio::time::timeout(Duration::from_millis(300), events.next()).await
        {
            if let StoreEvent::Queue { event, .. } = ev {
                got.push(event);
            }
        }
        assert_eq!(
            got.iter().filter(|e| **e == QueueEvent::Drawn).count(),
            1,
            "{got:?}"
        );
    }

    /// A stage whose order is not the frozen pre-queue's (a user not in
    /// it, or one named twice) is dropped at that chunk: the lottery is
    /// scheduled again with nothing placed, and a right order draws.
    async fn a_stale_stage_is_dropped(store: SharedStore) {
        let (seed, _) = scheduled_with(&store, 100, "t", 12).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (version, order, list) = computed(&store, &seed).await;
        // A version or a size not the pre-queue's: nothing is staged.
        for (v, n) in [(version + 1, 12), (version, 11)] {
            assert_eq!(
                store
                    .draw_begin(&q(), "d0", v, n, &list, 60_000)
                    .await
                    .unwrap(),
                DrawStep::Stale
            );
            assert_eq!(
                store.lottery(&q()).await.unwrap().unwrap().staging_idle_ms,
                None
            );
        }
        let mut stranger = order.clone();
        stranger[9] = u("stranger");
        let mut twice = order.clone();
        twice[9] = twice[2].clone();
        for (i, bad) in [stranger, twice].iter().enumerate() {
            let id = format!("bad{i}");
            assert_eq!(
                store
                    .draw_begin(&q(), &id, version, 12, &list, 60_000)
                    .await
                    .unwrap(),
                DrawStep::Staged { staged: 0 }
            );
            assert_eq!(
                store.draw_stage(&q(), &id, 0, &bad[..5]).await.unwrap(),
                DrawStep::Staged { staged: 5 }
            );
            assert_eq!(
                store.draw_stage(&q(), &id, 5, &bad[5..10]).await.unwrap(),
                DrawStep::Stale
            );
            assert_eq!(
                store.draw_stage(&q(), &id, 10, &bad[10..]).await.unwrap(),
                DrawStep::Lost,
                "the dropped stage is gone"
            );
            assert_eq!(store.draw_commit(&q(), &id).await.unwrap(), DrawStep::Lost);
            let l = store.lottery(&q()).await.unwrap().unwrap();
            assert!(!l.drawn && l.staging_idle_ms.is_none(), "{l:?}");
            assert_eq!(l.entries, 12);
            assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
        }
        // More positions than the frozen pre-queue: dropped too.
        let mut more = order.clone();
        more.push(u("extra"));
        assert_eq!(
            store
                .draw_begin(&q(), "more", version, 12, &list, 60_000)
                .await
                .unwrap(),
            DrawStep::Staged { staged: 0 }
        );
        assert_eq!(
            store.draw_stage(&q(), "more", 0, &more).await.unwrap(),
            DrawStep::Stale
        );
        assert_eq!(
            store.draw(&q(), version, &order, &list).await.unwrap(),
            DrawOutcome::Drawn { placed: 12 }
        );
        line_is(&store, &order).await;
    }

    /// While a draw is staged, a leave takes the entry out of the draw
    /// (staged already or not: no ghost in line), a join is sent to the
    /// pre-queue and lands behind everyone drawn at the commit, a repeat
    /// join keeps the frozen entry, and a leave and rejoin is a later
    /// arrival.
    async fn leaves_and_joins_during_a_staged_draw(store: SharedStore) {
        let (seed, _) = scheduled_with(&store, 100, "m", 20).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (version, order, list) = computed(&store, &seed).await;
        let id = "draw-live";
        assert_eq!(
            store
                .draw_begin(&q(), id, version, 20, &list, 60_000)
                .await
                .unwrap(),
            DrawStep::Staged { staged: 0 }
        );
        assert_eq!(
            store.draw_stage(&q(), id, 0, &order[..8]).await.unwrap(),
            DrawStep::Staged { staged: 8 }
        );
        let entry = |user: &UserId| {
            let store = store.clone();
            let user = user.clone();
            async move { store.pre_entry(&q(), &user).await.unwrap().unwrap() }
        };
        // Leaves: one staged (order[3]), one not yet (order[12]).
        for gone in [&order[3], &order[12]] {
            let e = entry(gone).await;
            assert!(store.pre_leave(&q(), gone, e.pre_entry).await.unwrap());
        }
        // A join (through the ordinary join step) goes to the pre-queue.
        let p = Policy {
            max_active: Some(0),
            ..slow(1)
        };
        let out = store
            .enter(&q(), &u("late1"), &p, &EntryToken::generate())
            .await
            .unwrap();
        assert!(out.pre_queue, "{out:?}");
        let late1 = pre(&store, &u("late1")).await;
        // order[15] leaves and comes back: a later arrival now.
        let e = entry(&order[15]).await;
        assert!(
            store
                .pre_leave(&q(), &order[15], e.pre_entry)
                .await
                .unwrap()
        );
        let back = pre(&store, &order[15]).await;
        assert!(back > late1);
        // A repeat join of a frozen entry keeps it, out of line.
        match store.pre_join(&q(), &order[0], "ab").await.unwrap() {
            PreJoin::Pre { entry, created } => assert!(!created && entry.entry.is_none()),
            PreJoin::Open => panic!("a frozen entry left the pre-queue"),
        }
        // A later arrival that leaves before the commit is gone too.
        let late2 = pre(&store, &u("late2")).await;
        assert!(store.pre_leave(&q(), &u("late2"), late2).await.unwrap());
        assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
        assert_eq!(
            store.draw_stage(&q(), id, 8, &order[8..]).await.unwrap(),
            DrawStep::Staged { staged: 20 }
        );
        assert_eq!(
            store.draw_commit(&q(), id).await.unwrap(),
            DrawStep::Drawn { placed: 17 }
        );
        let mut expected: Vec<UserId> = order
            .iter()
            .enumerate()
            .filter(|(i, _)| ![3, 12, 15].contains(i))
            .map(|(_, user)| user.clone())
            .collect();
        expected.push(u("late1"));
        expected.push(order[15].clone());
        line_is(&store, &expected).await;
        for gone in [&order[3], &order[12], &u("late2")] {
            let s = store.status(&q(), gone, false).await.unwrap();
            assert_eq!(s.entry, None, "{gone} is a ghost: {s:?}");
            assert!(store.pre_entry(&q(), gone).await.unwrap().is_none());
        }
        // The later arrivals' records name their places (their own ids).
        let e = entry(&u("late1")).await;
        assert_eq!(e.entry, Some(late1));
        assert_eq!(entry_of(&store, &u("late1")).await, late1);
        assert_eq!(store.lottery(&q()).await.unwrap().unwrap().entries, 19);
        // The published list is the frozen pre-queue's: all 20.
        assert_eq!(
            store
                .lottery_list(&q())
                .await
                .unwrap()
                .unwrap()
                .lines()
                .count(),
            20
        );
        // Admission takes the drawn head first.
        let pass = store.admit(&q(), &slow(3), &tokens(3)).await.unwrap();
        let admitted: Vec<&UserId> = pass.admitted.iter().map(|a| &a.user).collect();
        assert_eq!(admitted, expected[..3].iter().collect::<Vec<_>>());
    }

    /// A stage left by a draw that stopped (its instance died) blocks
    /// nothing for long: while it moves on others are told `Busy`; once
    /// idle past the limit the next draw drops it and draws again, and
    /// the old draw's later steps are refused.
    async fn an_abandoned_stage_is_replaced(store: SharedStore) {
        let (seed, _) = scheduled_with(&store, 100, "a", 15).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (version, order, list) = computed(&store, &seed).await;
        assert_eq!(
            store
                .draw_begin(&q(), "dead", version, 15, &list, 60_000)
                .await
                .unwrap(),
            DrawStep::Staged { staged: 0 }
        );
        assert_eq!(
            store
                .draw_stage(&q(), "dead", 0, &order[..6])
                .await
                .unwrap(),
            DrawStep::Staged { staged: 6 }
        );
        // The stage is live: another draw waits, and so does the draw loop.
        assert_eq!(
            store
                .draw_begin(&q(), "next", version, 15, &list, 60_000)
                .await
                .unwrap(),
            DrawStep::Busy
        );
        assert_eq!(
            waitroom::lottery::draw_if_due(&store, &q()).await.unwrap(),
            Some(DrawOutcome::InProgress)
        );
        // A join while the stage is abandoned: pre-queued, and in the
        // draw that replaces it.
        let joined = pre(&store, &u("meanwhile")).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        let idle = store
            .lottery(&q())
            .await
            .unwrap()
            .unwrap()
            .staging_idle_ms
            .unwrap();
        assert!(idle >= 50, "{idle}");
        // The same version and order no longer match (the join changed it).
        assert_eq!(
            store
                .draw_begin(&q(), "next", version, 15, &list, 50)
                .await
                .unwrap(),
            DrawStep::Stale
        );
        let (version, order, list) = computed(&store, &seed).await;
        assert_eq!(order.len(), 16);
        assert!(order.contains(&u("meanwhile")));
        assert_eq!(
            store
                .draw_begin(&q(), "next", version, 16, &list, 50)
                .await
                .unwrap(),
            DrawStep::Staged { staged: 0 }
        );
        assert_eq!(
            store
                .draw_stage(&q(), "dead", 6, &order[6..])
                .await
                .unwrap(),
            DrawStep::Lost
        );
        assert_eq!(
            store.draw_commit(&q(), "dead").await.unwrap(),
            DrawStep::Lost
        );
        let outcome =
            waitroom::store::draw_in_steps(&*store, &q(), "last", version, &order, &list, 4)
                .await
                .unwrap();
        assert_eq!(outcome, DrawOutcome::InProgress, "\"next\" holds the stage");
        for (i, chunk) in order.chunks(4).enumerate() {
            assert_eq!(
                store
                    .draw_stage(&q(), "next", (i * 4) as u64, chunk)
                    .await
                    .unwrap(),
                DrawStep::Staged {
                    staged: (i * 4 + chunk.len()) as u64
                }
            );
        }
        assert_eq!(
            store.draw_commit(&q(), "next").await.unwrap(),
            DrawStep::Drawn { placed: 16 }
        );
        line_is(&store, &order).await;
        let e = store
            .pre_entry(&q(), &u("meanwhile"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.pre_entry, joined);
    }

    /// Eight instances drawing together in small chunks: one draws, the
    /// others find it in progress or drawn; the line is the order once.
    async fn instances_drawing_in_chunks_draw_once(store: SharedStore) {
        let (seed, _) = scheduled_with(&store, 100, "c", 40).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let tries = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { waitroom::lottery::draw_if_due_in(&store, &q(), 3).await })
        });
        let outcomes: Vec<_> = futures::future::join_all(tries)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        let drawn = outcomes
            .iter()
            .filter(|o| matches!(o, Some(DrawOutcome::Drawn { placed: 40 })))
            .count();
        assert_eq!(drawn, 1, "{outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Some(
                    DrawOutcome::Drawn { .. } | DrawOutcome::InProgress | DrawOutcome::AlreadyDrawn
                ) | None
            )),
            "{outcomes:?}"
        );
        let (_, order, _) = computed(&store, &seed).await;
        line_is(&store, &order).await;
    }

    conformance!(
        a_staged_draw_is_seen_only_once_committed,
        a_stale_stage_is_dropped,
        leaves_and_joins_during_a_staged_draw,
        an_abandoned_stage_is_replaced,
        instances_drawing_in_chunks_draw_once,
        a_lottery_keeps_its_commitment_and_is_fixed_once_drawn,
        the_draw_places_the_whole_pre_queue_in_drawn_order_once,
        leaving_the_pre_queue_takes_the_entry_out_of_the_draw,
        instances_drawing_together_draw_once,
        a_join_before_the_draw_is_sent_to_the_pre_queue,
        pre_queue_entries_count_against_the_address,
    );
}
