//! The public admission log's storage (`waitroom::queue::fairness`):
//! appends conditional on the size, paged leaves, stored Merkle nodes that
//! give the RFC 9162 root and proofs, heads that never go back.
//! ([`waitroom::store::FairnessLogStore`])

use super::*;

use waitroom::queue::audit::AuditId;
use waitroom::queue::fairness::{
    Hash, append_nodes, consistency_ranges, fold_range, inclusion_ranges, leaf_hash, range_nodes,
    root_nodes, verify_consistency, verify_inclusion,
};
use waitroom::store::{LogAppend, LogState};

fn leaf(i: u64) -> String {
    format!(r#"{{"kind":"admitted","seq":{i},"fp":"f{i}","at":{i},"audit":"{i}-0"}}"#)
}

/// Appends leaves `[from, to)` as the fairness task does: the edge's
/// nodes read, the new nodes computed, the append conditional on `from`.
async fn append(store: &SharedStore, from: u64, to: u64) -> bool {
    let edge = store.log_nodes(&q(), &root_nodes(from)).await.unwrap();
    let leaves: Vec<String> = (from..to).map(leaf).collect();
    let hashes: Vec<Hash> = leaves.iter().map(|l| leaf_hash(l.as_bytes())).collect();
    let append = LogAppend {
        from_size: from,
        cursor: AuditId { ms: to, seq: 0 },
        nodes: append_nodes(from, &edge, &hashes),
        leaves,
    };
    store.log_append(&q(), &append).await.unwrap()
}

async fn range_hash(store: &SharedStore, (a, b): (u64, u64)) -> Hash {
    fold_range(&store.log_nodes(&q(), &range_nodes(a, b)).await.unwrap())
}

async fn appends_build_a_tree_whose_proofs_verify(store: SharedStore) {
    assert_eq!(store.log_state(&q()).await.unwrap(), LogState::default());
    assert!(store.log_head(&q()).await.unwrap().is_none());
    let mut size = 0;
    let mut roots = Vec::new();
    for step in [1u64, 2, 5, 1, 13, 3] {
        assert!(append(&store, size, size + step).await);
        size += step;
        roots.push((size, range_hash(&store, (0, size)).await));
    }
    let state = store.log_state(&q()).await.unwrap();
    assert_eq!(state.size, 25);
    assert_eq!(state.cursor, Some(AuditId { ms: 25, seq: 0 }));
    // Pages of leaves, and nothing past the end.
    let page = store.log_leaves(&q(), 20, 10).await.unwrap();
    assert_eq!(page, (20..25).map(leaf).collect::<Vec<_>>());
    assert!(store.log_leaves(&q(), 25, 10).await.unwrap().is_empty());
    assert!(
        store
            .log_leaves(&q(), u64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Every leaf's inclusion, every earlier root's consistency.
    let (_, root) = *roots.last().unwrap();
    for index in 0..size {
        let mut proof = Vec::new();
        for range in inclusion_ranges(index, size) {
            proof.push(range_hash(&store, range).await);
        }
        let hash = leaf_hash(leaf(index).as_bytes());
        assert!(
            verify_inclusion(index, size, &hash, &proof, &root),
            "{index}"
        );
    }
    for (first, first_root) in &roots {
        let mut proof = Vec::new();
        for range in consistency_ranges(*first, size) {
            proof.push(range_hash(&store, range).await);
        }
        assert!(verify_consistency(*first, size, first_root, &root, &proof));
    }
    // A node the log has not reached is an error, never a made-up hash.
    assert!(store.log_nodes(&q(), &root_nodes(64)).await.is_err());
}
conformance!(appends_build_a_tree_whose_proofs_verify);

async fn a_stale_append_changes_nothing(store: SharedStore) {
    assert!(append(&store, 0, 4).await);
    let before = store.log_state(&q()).await.unwrap();
    let root = range_hash(&store, (0, 4)).await;
    // Another appender read size 0 (or 2) and lost the race.
    assert!(!append(&store, 0, 3).await);
    assert!(!append(&store, 2, 6).await);
    assert_eq!(store.log_state(&q()).await.unwrap(), before);
    assert_eq!(store.log_leaves(&q(), 0, 100).await.unwrap().len(), 4);
    assert_eq!(range_hash(&store, (0, 4)).await, root);
    // The way back: an append at the right size goes through.
    assert!(append(&store, 4, 6).await);
    assert_eq!(store.log_state(&q()).await.unwrap().size, 6);
}
conformance!(a_stale_append_changes_nothing);

async fn heads_never_go_back(store: SharedStore) {
    assert!(store.log_put_head(&q(), 5, "head-5").await.unwrap());
    assert!(!store.log_put_head(&q(), 4, "head-4").await.unwrap());
    assert_eq!(
        store.log_head(&q()).await.unwrap().as_deref(),
        Some("head-5")
    );
    // The same size again (re-signed later) and a larger one are stored.
    assert!(store.log_put_head(&q(), 5, "head-5b").await.unwrap());
    assert!(store.log_put_head(&q(), 9, "head-9").await.unwrap());
    assert_eq!(
        store.log_head(&q()).await.unwrap().as_deref(),
        Some("head-9")
    );
    // Another queue's log is its own.
    let other = QueueName::parse("other").unwrap();
    assert!(store.log_head(&other).await.unwrap().is_none());
    assert_eq!(store.log_state(&other).await.unwrap(), LogState::default());
}
conformance!(heads_never_go_back);
