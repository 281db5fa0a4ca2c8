//! Live queue settings: versioned writes, the list of queues, passes on
//! the stored settings, and deleting a queue ([`waitroom::store::SettingsStore`]).

use super::*;

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
conformance!(queue_settings_are_versioned_and_listed);

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
conformance!(a_pass_runs_on_the_stored_settings);

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
conformance!(deleting_a_queue_empties_it_but_keeps_entry_ids_fresh);
