//! The public admission log's rules: what a leaf says, how the Merkle tree
//! over the leaves hashes (RFC 9162, the tree of Certificate Transparency
//! 2.0), and which subtrees an inclusion or consistency proof is made of.
//! No store, no HTTP, no keys: the store keeps leaves and node hashes, the
//! `fairness` module signs, and `tools/verify-queue` restates the hashing
//! on its own (it shares no code with the server, so a bug here cannot
//! hide itself there).
//!
//! The tree is kept as its perfect subtrees: node `(level, index)` is the
//! hash of leaves `[index << level, (index + 1) << level)`, written once,
//! when its last leaf arrives (two nodes per leaf on average). Every range
//! an RFC 9162 proof names starts at a multiple of a power of two at least
//! its length, so it is the fold of at most `log2 n` such nodes: a proof
//! reads `O(log² n)` node hashes and never a leaf.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A node or leaf hash.
pub type Hash = [u8; 32];

/// The most leaves one page of the log answers.
pub const MAX_LOG_PAGE: u64 = 1_000;

/// What a leaf records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LeafKind {
    /// An admission pass gave the buyer a token, head of the line first.
    Admitted,
    /// A join into an empty line got a token at once (the fast track).
    FastTrack,
    /// A pass dropped the buyer, unseen for `abandonAfter`.
    Abandoned,
    /// The buyer left the line (or gave up their token).
    Left,
}

/// One leaf of a queue's log. Written as compact JSON in this field order;
/// the leaf hash is over exactly the bytes served, so a reader never
/// re-encodes a leaf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaf {
    /// What happened.
    pub kind: LeafKind,
    /// The buyer's entry sequence (the arrival order, from their receipt).
    pub seq: u64,
    /// The buyer's fingerprint (as in their receipt).
    pub fp: String,
    /// The admission pass (admitted, abandoned), else absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<u64>,
    /// When, store clock, ms since the epoch.
    pub at: u64,
    /// The audit log entry it was taken from (`<ms>-<seq>`).
    pub audit: String,
}

impl Leaf {
    /// The leaf's bytes as stored and served.
    pub fn encode(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// `SHA-256(0x00 || leaf)`.
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(leaf);
    h.finalize().into()
}

/// `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: `SHA-256("")`.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// A stored node: the perfect subtree of `2^level` leaves starting at leaf
/// `index << level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub level: u8,
    pub index: u64,
}

/// The largest power of two below `n` (`n > 1`).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// The stored nodes whose fold is the hash of leaves `[start, end)`, left
/// to right (largest first). `start` must be a multiple of a power of two
/// at least `end - start`, as every range of the RFC's recursion is.
pub fn range_nodes(start: u64, end: u64) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut at = start;
    while at < end {
        let room = end - at;
        let mut level = 63 - room.leading_zeros();
        while at & ((1u64 << level) - 1) != 0 {
            level -= 1;
        }
        nodes.push(Node {
            level: level as u8,
            index: at >> level,
        });
        at += 1 << level;
    }
    nodes
}

/// The hash of a range from its nodes' hashes (as [`range_nodes`] lists
/// them): the RFC's split, the largest subtree first, folded from the right.
pub fn fold_range(hashes: &[Hash]) -> Hash {
    let mut iter = hashes.iter().rev();
    let Some(last) = iter.next() else {
        return empty_root();
    };
    iter.fold(*last, |acc, left| node_hash(left, &acc))
}

/// The nodes of the tree of `size` leaves' root ([`fold_range`] them).
pub fn root_nodes(size: u64) -> Vec<Node> {
    range_nodes(0, size)
}

/// The ranges whose hashes make the inclusion proof of leaf `index` in the
/// tree of `size` leaves, leaf side first (RFC 9162 2.1.3.1, `PATH`).
pub fn inclusion_ranges(index: u64, size: u64) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    path(index, 0, size, &mut ranges);
    ranges
}

fn path(m: u64, start: u64, n: u64, out: &mut Vec<(u64, u64)>) {
    if n <= 1 {
        return;
    }
    let k = split(n);
    if m < k {
        path(m, start, k, out);
        out.push((start + k, start + n));
    } else {
        path(m - k, start + k, n - k, out);
        out.push((start, start + k));
    }
}

/// The ranges whose hashes make the consistency proof from the tree of
/// `first` leaves to the tree of `second` (RFC 9162 2.1.4.1, `PROOF`).
/// Empty when `first` is 0 or equals `second`.
pub fn consistency_ranges(first: u64, second: u64) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    if first > 0 && first < second {
        subproof(first, 0, second, true, &mut ranges);
    }
    ranges
}

fn subproof(m: u64, start: u64, n: u64, whole: bool, out: &mut Vec<(u64, u64)>) {
    if m == n {
        if !whole {
            out.push((start, start + n));
        }
        return;
    }
    let k = split(n);
    if m <= k {
        subproof(m, start, k, whole, out);
        out.push((start + k, start + n));
    } else {
        subproof(m - k, start + k, n - k, false, out);
        out.push((start, start + k));
    }
}

/// Checks an inclusion proof (RFC 9162 2.1.3.2).
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return false;
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    snode == 0 && r == *root
}

/// Checks a consistency proof (RFC 9162 2.1.4.2).
pub fn verify_consistency(
    first: u64,
    second: u64,
    first_root: &Hash,
    second_root: &Hash,
    proof: &[Hash],
) -> bool {
    if first > second {
        return false;
    }
    if first == second {
        return proof.is_empty() && first_root == second_root;
    }
    if first == 0 {
        return proof.is_empty();
    }
    let mut path: Vec<Hash> = proof.to_vec();
    if first.is_power_of_two() {
        path.insert(0, *first_root);
    }
    let (mut fnode, mut snode) = (first - 1, second - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let Some((first_hash, rest)) = path.split_first() else {
        return false;
    };
    let (mut fr, mut sr) = (*first_hash, *first_hash);
    for c in rest {
        if snode == 0 {
            return false;
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    snode == 0 && fr == *first_root && sr == *second_root
}

/// The nodes an append of `count` leaves to a tree of `size` writes, per
/// level, in order: computed from the tree's perfect subtrees at its right
/// edge (`edge`, the hashes of [`root_nodes`]`(size)`) and the new leaves'
/// hashes. Returns the nodes of each level (level 0 first).
pub fn append_nodes(size: u64, edge: &[Hash], leaves: &[Hash]) -> Vec<Vec<Hash>> {
    // The stack of perfect subtrees covering [0, size), largest first.
    let mut stack: Vec<(u8, Hash)> = root_nodes(size)
        .into_iter()
        .zip(edge.iter().copied())
        .map(|(node, hash)| (node.level, hash))
        .collect();
    let mut levels: Vec<Vec<Hash>> = Vec::new();
    let push = |levels: &mut Vec<Vec<Hash>>, level: u8, hash: Hash| {
        let level = usize::from(level);
        if levels.len() <= level {
            levels.resize(level + 1, Vec::new());
        }
        levels[level].push(hash);
    };
    for leaf in leaves {
        let mut node = (0u8, *leaf);
        push(&mut levels, 0, *leaf);
        while let Some(&(level, left)) = stack.last() {
            if level != node.0 {
                break;
            }
            stack.pop();
            node = (level + 1, node_hash(&left, &node.1));
            push(&mut levels, node.0, node.1);
        }
        stack.push(node);
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9162's `MTH`, straight from the definition.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaves[0],
            n => {
                let k = split(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn leaves(n: u64) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(i.to_string().as_bytes()))
            .collect()
    }

    /// Every stored node, built by appends of varying sizes.
    fn build(all: &[Hash], chunks: &[usize]) -> Vec<Vec<Hash>> {
        let mut levels: Vec<Vec<Hash>> = Vec::new();
        let (mut size, mut chunk) = (0usize, 0usize);
        while size < all.len() {
            let take = chunks[chunk % chunks.len()].min(all.len() - size);
            chunk += 1;
            let edge: Vec<Hash> = root_nodes(size as u64)
                .iter()
                .map(|n| levels[usize::from(n.level)][n.index as usize])
                .collect();
            for (level, nodes) in append_nodes(size as u64, &edge, &all[size..size + take])
                .into_iter()
                .enumerate()
            {
                if levels.len() <= level {
                    levels.resize(level + 1, Vec::new());
                }
                levels[level].extend(nodes);
            }
            size += take;
        }
        levels
    }

    fn range_hash(levels: &[Vec<Hash>], start: u64, end: u64) -> Hash {
        let hashes: Vec<Hash> = range_nodes(start, end)
            .iter()
            .map(|n| levels[usize::from(n.level)][n.index as usize])
            .collect();
        fold_range(&hashes)
    }

    #[test]
    fn stored_nodes_give_the_rfc_root_at_every_size() {
        let all = leaves(67);
        let levels = build(&all, &[1, 3, 7, 2, 16]);
        for n in 0..=67u64 {
            assert_eq!(range_hash(&levels, 0, n), mth(&all[..n as usize]), "{n}");
        }
        // Two nodes per leaf at most.
        assert!(levels.iter().map(Vec::len).sum::<usize>() < 2 * 67);
    }

    #[test]
    fn inclusion_proofs_verify_and_fail_when_changed() {
        let all = leaves(37);
        let levels = build(&all, &[5]);
        for size in 1..=37u64 {
            let root = mth(&all[..size as usize]);
            for index in 0..size {
                let proof: Vec<Hash> = inclusion_ranges(index, size)
                    .iter()
                    .map(|&(a, b)| range_hash(&levels, a, b))
                    .collect();
                assert!(proof.len() <= 64 - (size.leading_zeros() as usize));
                let leaf = all[index as usize];
                assert!(verify_inclusion(index, size, &leaf, &proof, &root));
                let wrong = leaf_hash(b"not in the log");
                assert!(!verify_inclusion(index, size, &wrong, &proof, &root));
                if index + 1 < size {
                    assert!(!verify_inclusion(index + 1, size, &leaf, &proof, &root));
                }
            }
        }
    }

    #[test]
    fn consistency_proofs_verify_and_fail_when_rewritten() {
        let all = leaves(40);
        let levels = build(&all, &[3]);
        let mut other = all.clone();
        other[2] = leaf_hash(b"rewritten");
        for second in 1..=40u64 {
            for first in 1..=second {
                let proof: Vec<Hash> = consistency_ranges(first, second)
                    .iter()
                    .map(|&(a, b)| range_hash(&levels, a, b))
                    .collect();
                let (r1, r2) = (mth(&all[..first as usize]), mth(&all[..second as usize]));
                assert!(
                    verify_consistency(first, second, &r1, &r2, &proof),
                    "{first} {second}"
                );
                if first > 2 {
                    // An earlier head of a different history.
                    let forged = mth(&other[..first as usize]);
                    assert!(!verify_consistency(first, second, &forged, &r2, &proof));
                }
            }
        }
    }

    #[test]
    fn leaves_encode_in_a_fixed_order() {
        let leaf = Leaf {
            kind: LeafKind::FastTrack,
            seq: 12,
            fp: "ab".into(),
            pass: None,
            at: 5,
            audit: "5-0".into(),
        };
        assert_eq!(
            leaf.encode(),
            r#"{"kind":"fastTrack","seq":12,"fp":"ab","at":5,"audit":"5-0"}"#
        );
        // Known answers (Python: hashlib.sha256(b"\x00abc").hexdigest(), and
        // the node over the leaves "a" and "b").
        assert_eq!(
            hex::encode(leaf_hash(b"abc")),
            "609f6e36d2405585188d5cfd761f407c7cc46a7d3f314c88270469dde315fcd1"
        );
        assert_eq!(
            hex::encode(node_hash(&leaf_hash(b"a"), &leaf_hash(b"b"))),
            "b137985ff484fb600db93107c77b0365c80d78f5b429ded0fd97361d077999eb"
        );
    }
}
