//! Stock-aware admission (`waitroom::queue::stock`) on every store.
//! ([`waitroom::store::StockStore`])

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

async fn stock_bounds_the_fast_track_and_passes(store: SharedStore) {
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
conformance!(stock_bounds_the_fast_track_and_passes);

async fn a_used_token_counts_until_the_next_report(store: SharedStore) {
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
conformance!(a_used_token_counts_until_the_next_report);

async fn sold_out_is_published_once_and_read_everywhere(store: SharedStore) {
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
conformance!(sold_out_is_published_once_and_read_everywhere);

async fn absent_buyers_are_kept_while_sold_out(store: SharedStore) {
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
conformance!(absent_buyers_are_kept_while_sold_out);
