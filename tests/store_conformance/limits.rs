//! Limits kept in the store: the buyer's budget, the address's joins and
//! places, checked in the join's own step, and named buckets
//! ([`waitroom::store::LimitStore`]).

use super::*;

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
conformance!(a_read_budget_allows_its_burst_then_refuses);

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
conformance!(repeat_joins_spend_the_budget_only_past_the_grace);

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
conformance!(an_address_gets_its_join_rate_and_no_more);

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
conformance!(places_per_address_count_only_live_places);

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
conformance!(spend_buckets_are_shared_and_separate);
