//! The lottery of a scheduled opening: the rules anyone can recompute.
//!
//! A queue with `opensAt` gathers arrivals in a pre-queue; at `opensAt`
//! the whole pre-queue is placed in line in an order drawn from a secret
//! seed. So that nobody has to trust the operator, the rules are public
//! and deterministic, and this module holds all of them (no store, no
//! HTTP), shared by the server, the tests and, restated in Python, by
//! `scripts/lottery-verify`:
//!
//! - seed: 32 random bytes, kept secret until the draw;
//! - commitment: `hex(SHA-256(seed))`, published before the draw, so the
//!   seed cannot be chosen after seeing who entered;
//! - fingerprint of an entry: `hex(SHA-256("waitroom-lottery-v1\n" ||
//!   queue || "\n" || nonce))`, where `nonce` is the random text the buyer
//!   got when joining: the buyer can recompute it, nobody else learns who
//!   it stands for;
//! - the published list: every fingerprint, sorted (byte order of the hex
//!   text), one per line;
//! - the order: fingerprints sorted by `SHA-256(seed || fingerprint)`
//!   (seed as its 32 bytes, fingerprint as its 64 ASCII hex characters),
//!   ties by fingerprint. Hex is lower case everywhere.

use sha2::{Digest, Sha256};

/// The seed's length in bytes.
pub const SEED_BYTES: usize = 32;

/// Domain separation of fingerprints, so a fingerprint can never be a
/// hash some other part of the system computes.
const FINGERPRINT_DOMAIN: &str = "waitroom-lottery-v1";

/// A fresh random seed, as lower-case hex (what the store keeps).
pub fn new_seed() -> String {
    let bytes: [u8; SEED_BYTES] = rand::random();
    hex::encode(bytes)
}

/// A fresh random per-entry nonce (16 bytes, hex): what the buyer is told.
pub fn new_nonce() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

/// Parses a seed given as hex; `None` unless exactly [`SEED_BYTES`].
pub fn parse_seed(seed_hex: &str) -> Option<[u8; SEED_BYTES]> {
    let bytes = hex::decode(seed_hex).ok()?;
    bytes.try_into().ok()
}

/// The commitment published before the draw: `hex(SHA-256(seed))`.
pub fn commitment(seed: &[u8; SEED_BYTES]) -> String {
    hex::encode(Sha256::digest(seed))
}

/// The fingerprint of the entry with `nonce` in `queue`.
pub fn fingerprint(queue: &str, nonce: &str) -> String {
    let mut h = Sha256::new();
    h.update(FINGERPRINT_DOMAIN.as_bytes());
    h.update(b"\n");
    h.update(queue.as_bytes());
    h.update(b"\n");
    h.update(nonce.as_bytes());
    hex::encode(h.finalize())
}

/// The sort key of one fingerprint under `seed`.
fn draw_key(seed: &[u8; SEED_BYTES], fingerprint: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed);
    h.update(fingerprint.as_bytes());
    h.finalize().into()
}

/// The published list: `fingerprints` sorted, duplicates kept (there are
/// none: one entry per buyer, each with its own random nonce).
pub fn published_list(mut fingerprints: Vec<String>) -> Vec<String> {
    fingerprints.sort_unstable();
    fingerprints
}

/// Indexes into `fingerprints` in drawn order: the first goes first in
/// line. Independent of the order `fingerprints` is given in.
pub fn draw_order(seed: &[u8; SEED_BYTES], fingerprints: &[String]) -> Vec<usize> {
    let mut keyed: Vec<([u8; 32], &str, usize)> = fingerprints
        .iter()
        .enumerate()
        .map(|(i, f)| (draw_key(seed, f), f.as_str(), i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(byte: u8) -> [u8; SEED_BYTES] {
        [byte; SEED_BYTES]
    }

    // Known answers, computed independently with Python's hashlib:
    //   hashlib.sha256(bytes(32)).hexdigest()
    //   hashlib.sha256(b"waitroom-lottery-v1\nshoes\nabc").hexdigest()
    #[test]
    fn known_answers() {
        assert_eq!(
            commitment(&seed(0)),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert_eq!(
            fingerprint("shoes", "abc"),
            "51501f2afcb852937c7d540f65fdde3034f7a063f14119a05fcc29ee76c8d80b"
        );
    }

    #[test]
    fn known_order() {
        // Python: sorted(fps, key=lambda f: (sha256(bytes([7])*32 + f.encode()).digest(), f))
        let fps: Vec<String> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| fingerprint("shoes", n))
            .collect();
        let order = draw_order(&seed(7), &fps);
        let names: String = order
            .iter()
            .map(|&i| ["a", "b", "c", "d", "e"][i])
            .collect();
        assert_eq!(names, "bdeac");
    }

    #[test]
    fn the_order_depends_on_the_seed_and_not_on_the_input_order() {
        let fps: Vec<String> = (0..200).map(|i| fingerprint("q", &i.to_string())).collect();
        let drawn = |s: &[u8; 32], list: &[String]| -> Vec<String> {
            draw_order(s, list)
                .into_iter()
                .map(|i| list[i].clone())
                .collect()
        };
        let a = drawn(&seed(1), &fps);
        let mut reversed = fps.clone();
        reversed.reverse();
        assert_eq!(a, drawn(&seed(1), &reversed));
        assert_ne!(a, drawn(&seed(2), &fps));
        // A permutation: every entry exactly once.
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, published_list(fps));
    }

    #[test]
    fn seeds_parse_only_at_their_length() {
        let s = new_seed();
        assert_eq!(s.len(), 64);
        assert!(parse_seed(&s).is_some());
        assert!(parse_seed(&s[2..]).is_none());
        assert!(parse_seed("zz").is_none());
        assert_ne!(new_nonce(), new_nonce());
    }
}
