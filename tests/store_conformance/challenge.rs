//! Join challenges: a solution spent once, and the shared join counter
//! behind the challenge switch ([`waitroom::store::ChallengeStore`]).

use super::*;

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
conformance!(spend_once_is_true_once_per_key_until_it_expires);

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
conformance!(joins_noted_by_every_caller_share_one_switch);
