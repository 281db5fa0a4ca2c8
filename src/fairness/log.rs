//! Writing the public admission log from the audit log, signing its
//! heads, and reading its proofs.
//!
//! [`advance`] reads the audit entries after the log's cursor and appends
//! the ones about order (admissions, fast tracks, abandonments, leaves) as
//! leaves, conditional on the size it read ([`FairnessLogStore`]): every
//! instance may run it, one append wins. What a pass admitted is in the
//! audit log in the same step as the admission, so the log can lag the
//! line by a tick, never miss or reorder it.

use crate::clock::now_ms;
use crate::queue::QueueName;
use crate::queue::audit::{AuditEntry, AuditKind, AuditQuery, MAX_AUDIT_PAGE};
use crate::queue::fairness::{
    Hash, Leaf, LeafKind, append_nodes, consistency_ranges, fold_range, inclusion_ranges,
    leaf_hash, range_nodes, root_nodes,
};
use crate::store::{AuditStore, FairnessLogStore, LogAppend, StoreResult};

use super::{Fairness, Head};

/// What the log needs of the store.
pub trait LogStore: AuditStore + FairnessLogStore {}
impl<T: AuditStore + FairnessLogStore + ?Sized> LogStore for T {}

/// The leaf an audit entry makes, if it is about order.
fn leaf_of(fairness: &Fairness, queue: &QueueName, entry: &AuditEntry) -> Option<Leaf> {
    let kind = match (entry.kind, entry.pass) {
        (AuditKind::Admitted, Some(_)) => LeafKind::Admitted,
        (AuditKind::Admitted, None) => LeafKind::FastTrack,
        (AuditKind::Abandoned, _) => LeafKind::Abandoned,
        (AuditKind::Left, _) => LeafKind::Left,
        _ => return None,
    };
    Some(Leaf {
        kind,
        seq: entry.entry?,
        fp: fairness.fingerprint(queue.as_str(), entry.user.as_deref()?),
        pass: entry.pass,
        at: entry.at,
        audit: entry.id.to_string(),
    })
}

/// Appends the audit entries after the log's cursor, a page at a time, at
/// most `pages` pages. Returns the log's size after.
pub async fn advance<S: LogStore + ?Sized>(
    store: &S,
    fairness: &Fairness,
    queue: &QueueName,
    pages: usize,
) -> StoreResult<u64> {
    let mut state = store.log_state(queue).await?;
    for _ in 0..pages {
        let page = store
            .audit_page(
                queue,
                AuditQuery {
                    after: state.cursor,
                    limit: MAX_AUDIT_PAGE,
                    kind: None,
                },
            )
            .await?;
        let Some(last) = page.entries.last() else {
            break;
        };
        let leaves: Vec<String> = page
            .entries
            .iter()
            .filter_map(|e| leaf_of(fairness, queue, e))
            .map(|l| l.encode())
            .collect();
        let hashes: Vec<Hash> = leaves.iter().map(|l| leaf_hash(l.as_bytes())).collect();
        let edge = store.log_nodes(queue, &root_nodes(state.size)).await?;
        let append = LogAppend {
            from_size: state.size,
            cursor: last.id,
            nodes: append_nodes(state.size, &edge, &hashes),
            leaves,
        };
        if !store.log_append(queue, &append).await? {
            // Another instance appended first: go on from where it got.
            state = store.log_state(queue).await?;
            continue;
        }
        state.size += append.leaves.len() as u64;
        state.cursor = Some(append.cursor);
        if page.next.is_none() {
            break;
        }
    }
    Ok(state.size)
}

/// The hash of leaves `[start, end)` from the stored nodes.
async fn range_hash<S: FairnessLogStore + ?Sized>(
    store: &S,
    queue: &QueueName,
    (start, end): (u64, u64),
) -> StoreResult<Hash> {
    Ok(fold_range(
        &store.log_nodes(queue, &range_nodes(start, end)).await?,
    ))
}

/// Signs and stores a head of the log at `size` leaves.
pub async fn publish_head<S: FairnessLogStore + ?Sized>(
    store: &S,
    fairness: &Fairness,
    queue: &QueueName,
    size: u64,
) -> StoreResult<String> {
    let root = range_hash(store, queue, (0, size)).await?;
    let head = fairness.sign_head(&Head {
        queue: queue.to_string(),
        size,
        root: hex::encode(root),
        at: now_ms(),
        iat: now_ms() / 1000,
    });
    store.log_put_head(queue, size, &head).await?;
    Ok(head)
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves.
pub async fn inclusion_proof<S: FairnessLogStore + ?Sized>(
    store: &S,
    queue: &QueueName,
    index: u64,
    size: u64,
) -> StoreResult<Vec<Hash>> {
    proof(store, queue, inclusion_ranges(index, size)).await
}

/// The consistency proof from the tree of `first` leaves to `second`.
pub async fn consistency_proof<S: FairnessLogStore + ?Sized>(
    store: &S,
    queue: &QueueName,
    first: u64,
    second: u64,
) -> StoreResult<Vec<Hash>> {
    proof(store, queue, consistency_ranges(first, second)).await
}

/// The hashes of `ranges`, all nodes read in one store call.
async fn proof<S: FairnessLogStore + ?Sized>(
    store: &S,
    queue: &QueueName,
    ranges: Vec<(u64, u64)>,
) -> StoreResult<Vec<Hash>> {
    let per_range: Vec<_> = ranges.iter().map(|&(a, b)| range_nodes(a, b)).collect();
    let all: Vec<_> = per_range.iter().flatten().copied().collect();
    let hashes = store.log_nodes(queue, &all).await?;
    let mut at = 0;
    Ok(per_range
        .iter()
        .map(|nodes| {
            let folded = fold_range(&hashes[at..at + nodes.len()]);
            at += nodes.len();
            folded
        })
        .collect())
}
