//! Claims: an order's lease on a token, its renewal, consume and release
//! ([`waitroom::store::ClaimStore`]).

use super::*;

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
conformance!(claim_consume_release);

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
conformance!(a_live_token_names_its_holder);

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
conformance!(a_lapsed_claim_returns_to_ready);

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
conformance!(renewing_a_claim_extends_its_lease_and_the_tokens_life);

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
conformance!(renewing_does_nothing_for_a_claim_that_no_longer_holds);

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
conformance!(a_late_consume_deletes_unless_claimed_anew);
