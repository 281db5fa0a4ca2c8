//! Adaptive admission: order outcomes counted per window of the store
//! clock, and one decision per window however many instances decide.
//! ([`waitroom::store::AdaptiveStore`])

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
conformance!(outcomes_are_counted_per_window_and_decided_once);

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
conformance!(concurrent_decisions_for_one_window_store_one);

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
conformance!(too_few_orders_are_gathered_over_windows);
