//! The audit log (`waitroom::queue::audit`): written by the action's own
//! atomic step, paged by id, and taken by webhook groups.
//! ([`waitroom::store::AuditStore`])

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
async fn read_all(store: &SharedStore, limit: usize, kind: Option<AuditKind>) -> Vec<AuditEntry> {
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
conformance!(every_action_is_logged_once_in_order);

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
conformance!(pages_return_everything_once_and_filter_by_kind);

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
conformance!(groups_hand_each_entry_to_one_consumer);
