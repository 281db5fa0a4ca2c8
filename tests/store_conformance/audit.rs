//! The audit log (`waitroom::queue::audit`): written by the action's own
//! atomic step, paged by id, and taken by webhook groups.
//! ([`waitroom::store::AuditStore`])

use super::*;

use waitroom::queue::StockReport;

use waitroom::queue::audit::{AuditEntry, AuditId, AuditKind, AuditQuery, TakenEntry};

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
    let taken = |v: &[TakenEntry]| v.iter().map(|t| t.entry.id).collect::<Vec<_>>();
    // A leave is a record of its own in every store.
    let records = |v: &[TakenEntry]| {
        assert!(v.iter().all(|t| t.record == t.entry.id), "{v:?}");
        v.iter().map(|t| t.record).collect::<Vec<_>>()
    };
    let zero = AuditId::default();
    let a = store
        .audit_take(&q(), "hook", zero, "A", 60_000, 3)
        .await
        .unwrap();
    assert_eq!(taken(&a), ids(&log[..3]));
    let b = store
        .audit_take(&q(), "hook", zero, "B", 60_000, 3)
        .await
        .unwrap();
    assert_eq!(
        taken(&b),
        ids(&log[3..]),
        "B gets only what A was not given"
    );
    assert!(
        store
            .audit_take(&q(), "hook", zero, "A", 60_000, 3)
            .await
            .unwrap()
            .is_empty()
    );
    store.audit_ack(&q(), "hook", &records(&a)).await.unwrap();
    // B stops holding its two; once idle past the timeout, A claims them.
    tokio::time::sleep(Duration::from_millis(80)).await;
    let claimed = store
        .audit_take(&q(), "hook", zero, "A", 50, 10)
        .await
        .unwrap();
    assert_eq!(taken(&claimed), ids(&log[3..]));
    // A holds them: B cannot claim them back within the timeout.
    store
        .audit_hold(&q(), "hook", "A", &records(&claimed))
        .await
        .unwrap();
    assert!(
        store
            .audit_take(&q(), "hook", zero, "B", 5_000, 10)
            .await
            .unwrap()
            .is_empty()
    );
    store
        .audit_ack(&q(), "hook", &records(&claimed))
        .await
        .unwrap();
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
    assert_eq!(taken(&late), ids(&log[3..]));
}
conformance!(groups_hand_each_entry_to_one_consumer);

async fn a_pass_logs_each_buyer_paged_anywhere_and_taken_whole(store: SharedStore) {
    let hold = Policy {
        max_active: Some(0),
        ..slow(40)
    };
    let users = fill(&store, &hold, "m", 30).await;
    // One leave before the passes, then passes of 1, 20 and 9 with a leave
    // between: each buyer of a pass an entry of its own, in line order.
    assert!(leave_current(&store, &users[29]).await);
    let open = Policy {
        max_active: None,
        interval_ms: 1,
        ..slow(40)
    };
    for (n, leaver) in [(1, 28usize), (20, 27), (5, 26)] {
        let pass = Policy { batch: n, ..open };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let admitted = store.admit(&q(), &pass, &tokens(n as usize)).await.unwrap();
        assert_eq!(admitted.admitted.len(), n as usize);
        assert!(leave_current(&store, &users[leaver]).await);
    }
    let whole = store.audit_page(&q(), all(None, 1000)).await.unwrap();
    assert_eq!(whole.next, None);
    let admitted: Vec<&AuditEntry> = whole
        .entries
        .iter()
        .filter(|e| e.kind == AuditKind::Admitted)
        .collect();
    let names: Vec<String> = admitted.iter().map(|e| e.user.clone().unwrap()).collect();
    let expected: Vec<String> = users[..26].iter().map(|u| u.to_string()).collect();
    assert_eq!(names, expected, "every buyer once, in line order");
    for e in &admitted {
        let user = u(e.user.as_deref().unwrap());
        let s = store.status(&q(), &user, false).await.unwrap();
        assert_eq!(
            e.entry, s.entry,
            "{user}: the entry their token was issued to"
        );
        assert!(e.pass.is_some());
    }
    let passes: Vec<u64> = admitted.iter().map(|e| e.pass.unwrap()).collect();
    assert!(passes.windows(2).all(|w| w[0] <= w[1]), "{passes:?}");
    assert_eq!(whole.entries.len(), 26 + 4, "26 admitted, 4 left");
    assert!(
        whole.entries.windows(2).all(|w| w[0].id < w[1].id),
        "ids only grow: {:?}",
        whole.entries.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    // Pages of any size, ending anywhere inside a pass, give the same.
    for limit in [1, 2, 3, 7, 19, 30] {
        assert_eq!(
            read_all(&store, limit, None).await,
            whole.entries,
            "limit {limit}"
        );
    }
    let lefts: Vec<AuditEntry> = whole
        .entries
        .iter()
        .filter(|e| e.kind == AuditKind::Left)
        .cloned()
        .collect();
    assert_eq!(read_all(&store, 2, Some(AuditKind::Left)).await, lefts);
    // After any id, from the next one on.
    for i in [0, 1, 5, 12, 21, 28] {
        let page = store
            .audit_page(&q(), all(Some(whole.entries[i].id), 3))
            .await
            .unwrap();
        assert_eq!(
            page.entries,
            whole.entries[i + 1..(i + 4).min(30)],
            "after {i}"
        );
    }

    // Taken by a group: every entry once, its record with it; a record
    // acknowledged is gone for good, whichever of its entries were wanted.
    let zero = AuditId::default();
    let mut got: Vec<TakenEntry> = Vec::new();
    for _ in 0..100 {
        let more = store
            .audit_take(&q(), "hook", zero, "A", 60_000, 2)
            .await
            .unwrap();
        if more.is_empty() {
            break;
        }
        got.extend(more);
    }
    let ids: Vec<AuditId> = got.iter().map(|t| t.entry.id).collect();
    let want: Vec<AuditId> = whole.entries.iter().map(|e| e.id).collect();
    assert_eq!(ids, want, "each entry handed out once, in order");
    let mut records: Vec<AuditId> = got.iter().map(|t| t.record).collect();
    records.dedup();
    for t in &got {
        assert!(
            t.record >= t.entry.id,
            "a record is at or after its entries"
        );
    }
    store.audit_ack(&q(), "hook", &records).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store
            .audit_take(&q(), "hook", zero, "B", 1, 100)
            .await
            .unwrap()
            .is_empty(),
        "acknowledged records are not handed out again"
    );
}
conformance!(a_pass_logs_each_buyer_paged_anywhere_and_taken_whole);
