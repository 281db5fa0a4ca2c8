//! A scheduled opening with a lottery (`waitroom::queue::lottery`): the
//! pre-queue, and the draw that places it in line all at once, once.
//! ([`waitroom::store::LotteryStore`])

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
    let expected =
        waitroom::queue::lottery::commitment(&waitroom::queue::lottery::parse_seed(&seed).unwrap());
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
conformance!(a_lottery_keeps_its_commitment_and_is_fixed_once_drawn);

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
conformance!(the_draw_places_the_whole_pre_queue_in_drawn_order_once);

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
conformance!(leaving_the_pre_queue_takes_the_entry_out_of_the_draw);

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
conformance!(a_join_before_the_draw_is_sent_to_the_pre_queue);

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
conformance!(pre_queue_entries_count_against_the_address);

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
conformance!(instances_drawing_together_draw_once);

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
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(300), events.next()).await {
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
conformance!(a_staged_draw_is_seen_only_once_committed);

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
conformance!(a_stale_stage_is_dropped);

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
conformance!(leaves_and_joins_during_a_staged_draw);

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
    let outcome = waitroom::store::draw_in_steps(&*store, &q(), "last", version, &order, &list, 4)
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
conformance!(an_abandoned_stage_is_replaced);

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
            Some(DrawOutcome::Drawn { .. } | DrawOutcome::InProgress | DrawOutcome::AlreadyDrawn)
                | None
        )),
        "{outcomes:?}"
    );
    let (_, order, _) = computed(&store, &seed).await;
    line_is(&store, &order).await;
}
conformance!(instances_drawing_in_chunks_draw_once);
