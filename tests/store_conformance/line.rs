//! The line: joins, standing, presence, leaving, admission passes and
//! the admission turn ([`waitroom::store::LineStore`]).

use super::*;

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
conformance!(reenter_keeps_the_place);

/// An entry time a caller holds stands only for the entry it came with:
/// one sent with another entry (an old ticket's, a forged pairing) is
/// never answered; the store's own time is.
async fn a_known_entry_time_stands_only_for_its_entry(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "k", 2).await;
    let own = store.status(&q(), &users[1], false).await.unwrap();
    let (entry, at) = (own.entry.unwrap(), own.entered_at_ms.unwrap());
    for wrong in [entry - 1, entry + 1, 0] {
        let known = KnownEntry {
            entry: wrong,
            entered_at_ms: 42,
        };
        let s = store
            .status_known(&q(), &users[1], None, Some(known))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.entry, s.entered_at_ms),
            (Some(entry), Some(at)),
            "{wrong}"
        );
    }
    let right = KnownEntry {
        entry,
        entered_at_ms: at,
    };
    let s = store
        .status_known(&q(), &users[1], None, Some(right))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (s.entry, s.entered_at_ms, rank(&s)),
        (Some(entry), Some(at), Some(1))
    );

    // Admitted: the token keeps the entry, and the same holds.
    let fast = Policy {
        interval_ms: 50,
        ..slow(2)
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &fast, &tokens(2)).await.unwrap();
    assert!(pass.admitted.iter().any(|a| a.user == users[1]), "{pass:?}");
    for (sent, wrong) in [(entry - 1, true), (entry + 1, true), (entry, false)] {
        let known = KnownEntry {
            entry: sent,
            entered_at_ms: if wrong { 42 } else { at },
        };
        let s = store
            .status_known(&q(), &users[1], None, Some(known))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
        assert_eq!(
            (s.entry, s.entered_at_ms),
            (Some(entry), Some(at)),
            "{sent}"
        );
    }
}
conformance!(a_known_entry_time_stands_only_for_its_entry);

/// A join again with an entry time the caller holds: the time stands only
/// for the entry it came with while the buyer still waits with it; a wrong
/// or stale one (another entry, a place given up since) changes nothing
/// of the answer, a new place included.
async fn a_join_again_with_a_known_entry_time_keeps_the_stores(store: SharedStore) {
    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "j", 2).await;
    let own = store.status(&q(), &users[1], false).await.unwrap();
    let (entry, at) = (own.entry.unwrap(), own.entered_at_ms.unwrap());
    let join = |known: KnownEntry| {
        let (store, p, user) = (store.clone(), p.clone(), users[1].clone());
        async move {
            store
                .enter_known(
                    &q(),
                    &user,
                    &p,
                    &EntryToken::generate(),
                    &JoinLimits::default(),
                    Some(known),
                )
                .await
                .unwrap()
                .unwrap()
        }
    };
    for (sent, time) in [(entry - 1, 42), (entry + 1, 42), (0, 42), (entry, at)] {
        let again = join(KnownEntry {
            entry: sent,
            entered_at_ms: time,
        })
        .await;
        assert!(!again.created, "{sent}");
        let s = &again.snapshot;
        assert_eq!(
            (s.entry, s.entered_at_ms, rank(s)),
            (Some(entry), Some(at), Some(1)),
            "{sent}"
        );
    }
    // The place given up, the old entry's time is stale: the join makes a
    // new place with its own time.
    assert!(store.leave(&q(), &users[1], entry).await.unwrap());
    tokio::time::sleep(Duration::from_millis(5)).await;
    let new = join(KnownEntry {
        entry,
        entered_at_ms: 42,
    })
    .await;
    assert!(new.created);
    let s = &new.snapshot;
    assert!(s.entry > Some(entry), "{s:?}");
    assert!(s.entered_at_ms > Some(at), "{s:?}");
    assert_eq!(rank(s), Some(1));
}
conformance!(a_join_again_with_a_known_entry_time_keeps_the_stores);

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
conformance!(a_hold_is_read_with_every_standing);

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
conformance!(concurrent_enters_get_distinct_ranks);

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
conformance!(concurrent_enters_of_one_user_make_one_entry);

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
conformance!(admission_issues_at_most_batch_tokens_once_each);

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
conformance!(tokens_expire_after_the_ttl);

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
conformance!(admission_is_fifo);

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
conformance!(max_active_bounds_holders);

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
conformance!(expired_tokens_free_their_slot);

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
conformance!(fast_track_only_with_room);

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
conformance!(leave_moves_those_behind);

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
conformance!(absent_users_are_dropped_before_admission);

/// A pass's `waiting` is the line it leaves behind, however many it
/// dropped as absent and admitted (the Redis store counts it from the
/// line's length at the pass's start, rather than reading it again).
async fn a_pass_counts_the_line_it_leaves(store: SharedStore) {
    let joining = slow(3);
    drain_budget(&store, &joining).await;
    let users = fill(&store, &joining, "wl", 7).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // wl0000 and wl0003 unseen since they joined; the rest seen now.
    let seen: Vec<UserId> = users
        .iter()
        .enumerate()
        .filter(|(i, _)| ![0, 3].contains(i))
        .map(|(_, u)| u.clone())
        .collect();
    store.touch(&q(), &seen).await.unwrap();
    let p = Policy {
        abandon_after_ms: Some(1_000),
        interval_ms: 50,
        ..slow(3)
    };
    let pass = store.admit(&q(), &p, &tokens(3)).await.unwrap();
    assert_eq!(dropped(&pass), ["wl0000", "wl0003"], "{pass:?}");
    let admitted: Vec<&str> = pass.admitted.iter().map(|a| a.user.as_str()).collect();
    assert_eq!(admitted, ["wl0001", "wl0002", "wl0004"]);
    assert_eq!(pass.waiting, 2, "{pass:?}");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 2);
    // The next pass takes the rest: nobody is left.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &p, &tokens(3)).await.unwrap();
    assert_eq!(pass.admitted.len(), 2, "{pass:?}");
    assert_eq!(pass.waiting, 0, "{pass:?}");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 0);
}
conformance!(a_pass_counts_the_line_it_leaves);

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
conformance!(presence_counts_from_entry_until_first_seen);

/// The absence walk that stops at a buyer who entered too recently to be
/// judged resumes at them: the next pass, once they are stale, drops them,
/// while the present buyer walked past before them stays.
async fn a_walk_stopped_at_a_recent_buyer_resumes_at_them(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(1_000),
        ..slow(2)
    };
    drain_budget(&store, &slow(2)).await;
    let users = fill(&store, &p, "wr", 2).await;
    store.touch(&q(), &[users[0].clone()]).await.unwrap();
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    assert!(dropped(&pass).is_empty(), "{pass:?}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.touch(&q(), &[users[0].clone()]).await.unwrap();
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    assert_eq!(dropped(&pass), ["wr0001"], "{pass:?}");
    assert!(matches!(
        store.status(&q(), &users[0], false).await.unwrap().standing,
        Standing::Waiting { .. }
    ));
}
conformance!(a_walk_stopped_at_a_recent_buyer_resumes_at_them);

/// A walk over a long line where nearly everyone is present (every page
/// open) passes the present buyers and drops exactly the absent ones
/// scattered through it, across the walk's pages (the last of them more
/// than a small set holds) and however many each page drops; the next
/// pass, with nobody left to drop, drops nobody and keeps the line whole.
async fn a_long_walk_drops_exactly_the_absent(store: SharedStore) {
    let p = Policy {
        abandon_after_ms: Some(1_000),
        ..slow(2)
    };
    drain_budget(&store, &slow(2)).await;
    let users = fill(&store, &p, "lw", 300).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Absent: the very first, runs of neighbours, one in each later
    // stretch, and the very last.
    let absent = |i: usize| i == 0 || i == 299 || (3..=6).contains(&i) || i % 37 == 11;
    let present: Vec<UserId> = (0..300)
        .filter(|&i| !absent(i))
        .map(|i| users[i].clone())
        .collect();
    store.touch(&q(), &present).await.unwrap();
    let pass = store.admit(&q(), &p, &[]).await.unwrap();
    let mut expected: Vec<String> = (0..300)
        .filter(|&i| absent(i))
        .map(|i| users[i].to_string())
        .collect();
    expected.sort();
    assert_eq!(dropped(&pass), expected, "{pass:?}");
    assert_eq!(pass.waiting, present.len() as u64, "{pass:?}");
    let again = store.admit(&q(), &p, &[]).await.unwrap();
    assert!(dropped(&again).is_empty(), "{again:?}");
    assert_eq!(again.waiting, present.len() as u64, "{again:?}");
    for (rank, user) in present.iter().enumerate() {
        let standing = store.status(&q(), user, false).await.unwrap().standing;
        assert!(
            matches!(standing, Standing::Waiting { rank: r, .. } if r == rank as u64),
            "{user}: {standing:?}"
        );
    }
}
conformance!(a_long_walk_drops_exactly_the_absent);

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
conformance!(a_touch_after_leaving_keeps_nobody);

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
conformance!(many_unseen_are_dropped_over_bounded_passes);

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
conformance!(statuses_read_many_at_once);

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
conformance!(budget_holds_one_global_rate);

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
conformance!(a_stores_own_admission_turn_is_renewed);

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
conformance!(joins_sent_together_keep_their_order);

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
conformance!(entry_times_are_kept_per_entry);

/// Entries enough, joined and gone, that the entries before and after
/// them lie apart in any store's grouping of entry ids (Redis keeps entry
/// times in spans of 16).
async fn leave_a_gap(store: &SharedStore, policy: &Policy, prefix: &str) {
    for user in fill(store, policy, prefix, 40).await {
        assert!(leave_current(store, &user).await);
    }
}

/// An admitted buyer's answers keep their entry time as long as their
/// token lives: after the line empties, after the tokens admitted with
/// theirs expire and later passes run, and past the token's first life
/// when an order's claim lengthens it (Redis keeps an admitted entry's
/// marks only while a token may first live, and a claim that lengthens
/// one writes the time into it).
async fn a_holder_keeps_the_entry_time_while_the_token_lives(store: SharedStore) {
    let life = 600;
    let p = Policy {
        token_ttl_ms: life,
        ..slow(2)
    };
    drain_budget(&store, &p).await;
    let (a, b, c) = (u("kept-a"), u("kept-b"), u("kept-c"));
    let mut at = Vec::new();
    for (i, user) in [&a, &b].into_iter().enumerate() {
        let joined = store.enter(&q(), user, &p, &EntryToken::generate()).await;
        assert!(joined.unwrap().created);
        at.push(store.status(&q(), user, false).await.unwrap());
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    leave_a_gap(&store, &p, "kept-gap").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .enter(&q(), &c, &p, &EntryToken::generate())
        .await
        .unwrap();
    at.push(store.status(&q(), &c, false).await.unwrap());
    let at: Vec<u64> = at
        .iter()
        .map(|s| s.entered_at_ms.expect("an entry has a time"))
        .collect();
    assert!(at[0] < at[1] && at[1] < at[2], "{at:?}");

    let fast = Policy {
        interval_ms: 50,
        ..p.clone()
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &fast, &tokens(2)).await.unwrap();
    let first: Vec<UserId> = pass.admitted.iter().map(|x| x.user.clone()).collect();
    assert_eq!(first, [a.clone(), b.clone()]);
    let b_token = pass.admitted[1].token.clone();
    let claimed = store
        .claim(&q(), &b, b_token.as_str(), 20 * life)
        .await
        .unwrap();
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let pass = store.admit(&q(), &fast, &tokens(2)).await.unwrap();
    assert_eq!(pass.admitted.len(), 1, "{pass:?}");
    assert_eq!(pass.waiting, 0, "the line is empty");
    for (user, at) in [(&a, at[0]), (&b, at[1]), (&c, at[2])] {
        let s = store.status(&q(), user, false).await.unwrap();
        assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
        assert_eq!(s.entered_at_ms, Some(at), "{user}'s token");
    }

    // The unclaimed tokens expire; passes run after each life.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(life + 100)).await;
        store.admit(&q(), &fast, &[]).await.unwrap();
    }
    for user in [&a, &c] {
        let s = store.status(&q(), user, false).await.unwrap();
        assert_eq!(s.standing, Standing::NotEntered, "{user}: {s:?}");
    }
    let s = store.status(&q(), &b, false).await.unwrap();
    assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
    assert_eq!(s.entered_at_ms, Some(at[1]), "the claimed token keeps it");
    let again = store.enter(&q(), &b, &p, &EntryToken::generate()).await;
    let again = again.unwrap().snapshot;
    assert!(
        matches!(again.standing, Standing::Ready { .. }),
        "{again:?}"
    );
    assert_eq!(
        again.entered_at_ms,
        Some(at[1]),
        "a repeat join shows it too"
    );
}
conformance!(a_holder_keeps_the_entry_time_while_the_token_lives);

/// A token issued with a longer life than the passes around it keeps its
/// entry time for all of that life: how long Redis keeps an admitted
/// entry's marks follows the longest token life a pass issued, not the
/// last pass's.
async fn a_longer_token_life_keeps_the_entry_time_as_long(store: SharedStore) {
    let short = Policy {
        token_ttl_ms: 100,
        interval_ms: 1,
        ..slow(1)
    };
    let long = Policy {
        token_ttl_ms: 4_000,
        ..short.clone()
    };
    drain_budget(&store, &slow(1)).await;
    let (x, a, b) = (u("life-x"), u("life-a"), u("life-b"));
    for user in [&x, &a] {
        store
            .enter(&q(), user, &slow(1), &EntryToken::generate())
            .await
            .unwrap();
    }
    leave_a_gap(&store, &slow(1), "life-gap").await;
    store
        .enter(&q(), &b, &slow(1), &EntryToken::generate())
        .await
        .unwrap();
    let at_a = store.status(&q(), &a, false).await.unwrap().entered_at_ms;
    assert!(at_a.is_some());

    // x with a short life, a with a long one, then passes of short lives
    // (admitting nobody: b waits) for well past the short ones; each
    // admitting pass a few ms after the last, its budget of one refilled.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pass = store.admit(&q(), &short, &tokens(1)).await.unwrap();
    assert_eq!(pass.admitted.first().map(|p| &p.user), Some(&x), "{pass:?}");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pass = store.admit(&q(), &long, &tokens(1)).await.unwrap();
    assert_eq!(pass.admitted.first().map(|p| &p.user), Some(&a), "{pass:?}");
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1_200) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.admit(&q(), &short, &[]).await.unwrap();
    }
    let s = store.status(&q(), &a, false).await.unwrap();
    assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
    assert_eq!(s.entered_at_ms, at_a, "a's token keeps its entry time");
    assert!(rank(&store.status(&q(), &b, false).await.unwrap()) == Some(0));
}
conformance!(a_longer_token_life_keeps_the_entry_time_as_long);

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
conformance!(paused_queues_admit_nobody);

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
conformance!(rejoining_after_leaving_is_a_new_entry);

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
conformance!(leave_refuses_a_stale_entry);

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
conformance!(fast_track_ready_has_an_entry);

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
conformance!(the_entry_survives_admission_until_the_token_is_used);

/// A status read for a user who holds no place carries the answering
/// store's entry counter, so a ticket for an entry the store never issued
/// (above the counter: a node lagging behind the one that issued it) is
/// stale, not ended; a ticket for an entry the store issued and the buyer
/// gave up is ended, and so is one far above (a counter started anew).
async fn a_ticket_above_the_entry_counter_is_stale_not_ended(store: SharedStore) {
    // A queue that never had an entry has no counter: nothing to lag behind.
    let fresh = QueueName::parse("fresh").unwrap();
    let none = store.status(&fresh, &u("a"), false).await.unwrap();
    assert_eq!(none.entries_issued, None);
    assert!(none.ends_ticket(1));

    let p = slow(1);
    drain_budget(&store, &p).await;
    let users = fill(&store, &p, "c", 2).await;
    let (gone, stays) = (&users[0], &users[1]);
    let left = entry_of(&store, gone).await;
    let last = entry_of(&store, stays).await;
    assert!(store.leave(&q(), gone, left).await.unwrap());

    let s = store.status(&q(), gone, true).await.unwrap();
    assert_eq!((s.entry, s.entries_issued), (None, Some(last)));
    assert!(s.ends_ticket(left), "an issued entry that was left is over");
    assert!(s.ends_ticket(last), "at the counter: issued, not held");
    assert!(!s.ends_ticket(last + 1), "above the counter: stale");
    assert!(!s.ends_ticket(last + STALE_ENTRY_LAG_MAX));
    assert!(
        s.ends_ticket(last + STALE_ENTRY_LAG_MAX + 1),
        "far above: another counter's ticket, over"
    );
    // Somebody who never joined reads the counter as well.
    let stranger = store.status(&q(), &u("stranger"), false).await.unwrap();
    assert_eq!(stranger.entries_issued, Some(last));
    assert!(!stranger.ends_ticket(last + 1));

    // A held place is read on the common path: no counter. A ticket for an
    // earlier entry is over (the user joined again since); one for a later
    // entry was issued by a store that has seen the user join again, which
    // this one has not: stale, not over (a lagging node that still holds
    // the user's old place).
    let held = store.status(&q(), stays, false).await.unwrap();
    assert_eq!((held.entry, held.entries_issued), (Some(last), None));
    assert!(!held.ends_ticket(last));
    assert!(
        held.ends_ticket(left),
        "an earlier entry than the one held is over"
    );
    assert!(
        !held.ends_ticket(last + 1),
        "a later entry than the one held: stale"
    );
    assert!(!held.ends_ticket(last + STALE_ENTRY_LAG_MAX));
    assert!(
        held.ends_ticket(last + STALE_ENTRY_LAG_MAX + 1),
        "far above the held entry: another counter's ticket, over"
    );

    // A token holder who gives the token up reads the counter too.
    let holder = u("early0");
    let token_entry = entry_of(&store, &holder).await;
    assert!(store.leave(&q(), &holder, token_entry).await.unwrap());
    let after = store.status(&q(), &holder, false).await.unwrap();
    assert_eq!((after.entry, after.entries_issued), (None, Some(last)));
    assert!(after.ends_ticket(token_entry));

    // The way back: once the store issues the entry the stale ticket named,
    // that ticket is held again.
    let rejoin = store
        .enter(&q(), gone, &p, &EntryToken::generate())
        .await
        .unwrap();
    assert_eq!(rejoin.snapshot.entry, Some(last + 1));
    let now = store.status(&q(), gone, false).await.unwrap();
    assert!(!now.ends_ticket(last + 1));
    assert!(now.ends_ticket(left));
}
conformance!(a_ticket_above_the_entry_counter_is_stale_not_ended);
