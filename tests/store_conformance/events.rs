//! Events every instance hears (passes, leaves, consumes) and the stream
//! reports shared through the store ([`waitroom::store::EventStore`]).

use super::*;

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
conformance!(passes_and_changes_are_published);

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
conformance!(stream_reports_are_shared_until_they_lapse);
