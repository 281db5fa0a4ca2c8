//! Proof of work at the door: ALTCHA challenges a join must solve while
//! `--join-challenge` asks for one.
//!
//! Why: in visitor mode a bot can become a new buyer as often as it drops
//! its cookie, and every new buyer may join. A solved challenge makes each
//! join cost the client CPU time (SHA-256 of `salt + n` for `n` up to
//! `maxnumber`, about half of them on average) while the server checks a
//! solution with two hashes. The protocol is ALTCHA's (`altcha-lib-rs`
//! issues and checks; the page solves in a Web Worker), so any ALTCHA
//! solver works.
//!
//! A challenge here is:
//! - **signed**: HMAC-SHA256 under a key derived from the ticket secret, so
//!   every instance that shares that secret accepts every challenge, and a
//!   challenge MAC can never pass for a ticket's or a visitor cookie's;
//! - **bound to its queue** and **expiring**: the salt carries `q=<queue>`
//!   and `expires=<unix s>`, covered by the signature (the challenge hash is
//!   over the whole salt) and checked on every solution;
//! - **single use**: the first join with a solution spends it in the store
//!   ([`crate::store::ChallengeStore::spend_once`], remembered until it expires on
//!   every instance), so a replayed solution is refused.
//!
//! [`auto::Switch`] decides whether a join needs one right now.

pub mod auto;

use std::time::Duration;

use altcha_lib_rs::algorithm::AltchaAlgorithm;
use altcha_lib_rs::{Challenge, ChallengeOptions, Payload};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::queue::QueueName;
use crate::store::{ChallengeStore, StoreError};

/// The largest `maxnumber` accepted: the ALTCHA library checks solutions up
/// to this number only.
pub const MAX_DIFFICULTY: u64 = altcha_lib_rs::DEFAULT_MAX_NUMBER;

/// The smallest `maxnumber` accepted: below it a challenge costs nothing.
pub const MIN_DIFFICULTY: u64 = 1_000;

/// A spent challenge is remembered this much longer than its expiry, so
/// instances whose clocks run a little behind still refuse a replay.
const SKEW_MARGIN_SECS: u64 = 60;

/// The longest solution accepted (base64 of the ALTCHA JSON payload is
/// about 400 bytes); a longer one is refused before decoding.
const MAX_SOLUTION_LEN: usize = 2048;

/// Why a solution does not open the door.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Not a solution of a challenge issued for this queue by a holder of
    /// the key: malformed, altered, wrong number, another queue.
    #[error("{0}")]
    Invalid(&'static str),
    /// The challenge's `expires` has passed.
    #[error("the challenge has expired; get a new one")]
    Expired,
    /// The solution was already used for a join.
    #[error("this challenge was already used; get a new one")]
    Replayed,
    /// The store could not say whether it was used (fail closed: `503`).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Issues and checks the join challenges of every queue.
pub struct Door {
    /// The HMAC key, hex (the ALTCHA library takes a string key).
    key: String,
    difficulty: u64,
    ttl: Duration,
}

/// The ALTCHA challenge a client solves (the protocol's JSON).
pub type IssuedChallenge = Challenge;

impl Door {
    /// A door whose key is derived from `secret` (the ticket secret), with
    /// challenges of `difficulty` (`maxnumber`) living `ttl`.
    pub fn new(secret: &[u8], difficulty: u64, ttl: Duration) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"waitroom join challenge key v1");
        let key = hex(&mac.finalize().into_bytes());
        Self {
            key,
            difficulty: difficulty.clamp(MIN_DIFFICULTY, MAX_DIFFICULTY),
            ttl,
        }
    }

    /// A new challenge for `queue`, expiring `ttl` from now.
    pub fn issue(&self, queue: &QueueName) -> IssuedChallenge {
        let expires = crate::clock::now_ms() / 1000 + self.ttl.as_secs().max(1);
        let params = [
            ("q".to_owned(), queue.to_string()),
            ("expires".to_owned(), expires.to_string()),
        ]
        .into_iter()
        .collect();
        altcha_lib_rs::create_challenge(ChallengeOptions {
            algorithm: Some(AltchaAlgorithm::Sha256),
            max_number: Some(self.difficulty),
            hmac_key: &self.key,
            params: Some(params),
            ..Default::default()
        })
        // Only a number over max_number fails, and none is given.
        .expect("a challenge with a random number is always made")
    }

    /// Checks `solution` (base64 of the ALTCHA JSON payload) for `queue`
    /// and spends it in `store`: `Ok` the first time a valid, unexpired
    /// solution of this queue's challenge is presented, on any instance.
    pub async fn admit(
        &self,
        store: &dyn ChallengeStore,
        queue: &QueueName,
        solution: &str,
    ) -> Result<(), Refusal> {
        let solved = self.verify(queue, solution, crate::clock::now_ms() / 1000)?;
        let remember_ms = (solved.expires + SKEW_MARGIN_SECS)
            .saturating_sub(crate::clock::now_ms() / 1000)
            * 1000;
        if store
            .spend_once(queue, &solved.challenge, remember_ms)
            .await?
        {
            Ok(())
        } else {
            Err(Refusal::Replayed)
        }
    }

    /// Checks `solution` for `queue` at `now` (unix s) without spending it.
    pub fn verify(&self, queue: &QueueName, solution: &str, now: u64) -> Result<Solved, Refusal> {
        let bad = Refusal::Invalid;
        if solution.len() > MAX_SOLUTION_LEN {
            return Err(bad("the challenge solution is too long"));
        }
        let raw = STANDARD
            .decode(solution.trim())
            .map_err(|_| bad("the challenge solution is not base64"))?;
        let payload: Payload = serde_json::from_slice(&raw)
            .map_err(|_| bad("the challenge solution is not an ALTCHA payload"))?;
        if !matches!(payload.algorithm, AltchaAlgorithm::Sha256) {
            return Err(bad("the challenge solution names another algorithm"));
        }
        if payload.number > MAX_DIFFICULTY {
            return Err(bad("the challenge solution's number is out of range"));
        }
        let params = salt_params(&payload.salt).ok_or(bad("the challenge's salt is malformed"))?;
        // The signature covers the challenge hash, the hash the whole salt
        // with its parameters: a valid signature means we issued this salt.
        if !self.verifies(&payload) {
            return Err(bad("the challenge solution does not verify"));
        }
        if params.queue != queue.as_str() {
            return Err(bad("the challenge was issued for another queue"));
        }
        if params.expires < now {
            return Err(Refusal::Expired);
        }
        Ok(Solved {
            challenge: payload.challenge,
            expires: params.expires,
        })
    }
}

impl Door {
    /// The ALTCHA check: `SHA-256(salt + number)` is the challenge, and
    /// the signature is our HMAC of it (`verify_slice`: constant time).
    ///
    /// Done here rather than with `altcha_lib_rs::verify_solution`, which
    /// rebuilds the salt from a `HashMap` of its parameters: with two
    /// parameters (queue and expiry) it puts them back in either order and
    /// refuses about half of the valid solutions.
    fn verifies(&self, payload: &Payload) -> bool {
        use sha2::Digest;
        let hash = Sha256::new()
            .chain_update(payload.salt.as_bytes())
            .chain_update(payload.number.to_string().as_bytes())
            .finalize();
        // Public values: no need for a constant-time compare here.
        if hex(&hash) != payload.challenge {
            return false;
        }
        let Some(signature) = decode_hex(&payload.signature) else {
            return false;
        };
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.key.as_bytes()).expect("HMAC takes any key length");
        mac.update(payload.challenge.as_bytes());
        mac.verify_slice(&signature).is_ok()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A solution that verified: what to spend, and until when.
#[derive(Debug)]
pub struct Solved {
    /// The challenge hash (64 hex digits): one per issued challenge.
    pub challenge: String,
    /// Its expiry, unix s.
    pub expires: u64,
}

struct SaltParams {
    queue: String,
    expires: u64,
}

/// The `q` and `expires` of a salt `<random>?k=v&k=v&`, the ALTCHA form.
/// Stricter than the library's reading: every pair must end with `&`, and
/// a repeated or unknown name makes the salt malformed, so no salt reads
/// one way here and another in the library.
fn salt_params(salt: &str) -> Option<SaltParams> {
    let (_, query) = salt.split_once('?')?;
    let query = query.strip_suffix('&')?;
    let (mut queue, mut expires) = (None, None);
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=')?;
        let slot = match name {
            "q" => &mut queue,
            "expires" => &mut expires,
            _ => return None,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    let expires = expires?;
    if expires.is_empty() || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(SaltParams {
        queue: queue?.to_owned(),
        expires: expires.parse().ok()?,
    })
}

/// Solves `challenge` the way a client does (the page's worker, a bot):
/// SHA-256 of `salt + n` for n = 0, 1, … until it matches. The answer is
/// the base64 payload a join sends as `X-Altcha`; `None` past `maxnumber`.
/// For tests and benchmarks: it reuses the hash state of the salt, as a
/// bot that cares about speed would.
pub fn solve(challenge: &IssuedChallenge) -> Option<String> {
    use sha2::Digest;
    let target = decode_hex(&challenge.challenge)?;
    let prefix = Sha256::new_with_prefix(challenge.salt.as_bytes());
    let mut digits = itoa_buf();
    for n in 0..=challenge.maxnumber {
        let text = digits.format(n);
        let hash = prefix.clone().chain_update(text).finalize();
        if hash.as_slice() == target.as_slice() {
            let payload = serde_json::json!({
                "algorithm": "SHA-256",
                "challenge": challenge.challenge,
                "number": n,
                "salt": challenge.salt,
                "signature": challenge.signature,
            });
            return Some(STANDARD.encode(payload.to_string()));
        }
    }
    None
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

/// Decimal digits of a number without allocating per try.
struct Digits([u8; 20]);

fn itoa_buf() -> Digits {
    Digits([0; 20])
}

impl Digits {
    fn format(&mut self, mut n: u64) -> &[u8] {
        let mut i = self.0.len();
        loop {
            i -= 1;
            self.0[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        &self.0[i..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    fn door() -> Door {
        Door::new(
            b"0123456789abcdef0123456789abcdef",
            2_000,
            Duration::from_secs(60),
        )
    }

    fn payload(solution: &str) -> serde_json::Value {
        serde_json::from_slice(&STANDARD.decode(solution).unwrap()).unwrap()
    }

    fn encode(v: &serde_json::Value) -> String {
        STANDARD.encode(v.to_string())
    }

    #[test]
    fn a_solved_challenge_verifies_for_its_queue_only_until_it_expires() {
        let door = door();
        let challenge = door.issue(&q("default"));
        assert_eq!(challenge.maxnumber, 2_000);
        assert!(challenge.salt.contains("q=default&"), "{}", challenge.salt);
        let solution = solve(&challenge).unwrap();
        let solved = door
            .verify(&q("default"), &solution, crate::clock::now_ms() / 1000)
            .unwrap();
        assert_eq!(solved.challenge, challenge.challenge);
        assert!(matches!(
            door.verify(&q("other"), &solution, crate::clock::now_ms() / 1000),
            Err(Refusal::Invalid(m)) if m.contains("another queue")
        ));
        assert!(matches!(
            door.verify(&q("default"), &solution, solved.expires + 1),
            Err(Refusal::Expired)
        ));
        // Another secret's door refuses it: the key comes from the secret.
        let other = Door::new(
            b"another secret, sixteen+ bytes..",
            2_000,
            Duration::from_secs(60),
        );
        assert!(matches!(
            other.verify(&q("default"), &solution, crate::clock::now_ms() / 1000),
            Err(Refusal::Invalid(_))
        ));
    }

    #[test]
    fn altered_solutions_are_refused() {
        let door = door();
        let challenge = door.issue(&q("default"));
        let good = payload(&solve(&challenge).unwrap());
        let n = good["number"].as_u64().unwrap();
        let mut cases: Vec<serde_json::Value> = Vec::new();
        let mut wrong_number = good.clone();
        wrong_number["number"] = (if n == 0 { 1 } else { n - 1 }).into();
        cases.push(wrong_number);
        // Another queue or a later expiry in the salt: the hash no longer matches.
        let mut moved = good.clone();
        moved["salt"] = challenge.salt.replace("q=default", "q=other").into();
        cases.push(moved);
        let mut later = good.clone();
        later["salt"] = challenge.salt.replace("expires=", "expires=9").into();
        cases.push(later);
        let mut algo = good.clone();
        algo["algorithm"] = "SHA-512".into();
        cases.push(algo);
        let mut sig = good.clone();
        sig["signature"] = "00".repeat(32).into();
        cases.push(sig);
        let mut huge = good.clone();
        huge["number"] = (MAX_DIFFICULTY + 1).into();
        cases.push(huge);
        for case in cases {
            assert!(
                matches!(
                    door.verify(&q("default"), &encode(&case), crate::clock::now_ms() / 1000),
                    Err(Refusal::Invalid(_))
                ),
                "{case}"
            );
        }
        for garbage in ["", "!!!", "e30=", &"A".repeat(MAX_SOLUTION_LEN + 4)] {
            assert!(matches!(
                door.verify(&q("default"), garbage, crate::clock::now_ms() / 1000),
                Err(Refusal::Invalid(_))
            ));
        }
    }

    #[test]
    fn salts_are_read_strictly() {
        let ok = salt_params("abc?q=default&expires=17&").unwrap();
        assert_eq!((ok.queue.as_str(), ok.expires), ("default", 17));
        for bad in [
            "abc",
            "abc?q=default&expires=17",
            "abc?q=default&",
            "abc?expires=17&",
            "abc?q=a&q=b&expires=17&",
            "abc?q=default&expires=17&x=1&",
            "abc?q=default&expires=-1&",
            "abc?q=default&expires=&",
        ] {
            assert!(salt_params(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn every_issued_challenge_verifies_once_solved() {
        let door = door();
        for _ in 0..20 {
            let challenge = door.issue(&q("default"));
            let solution = solve(&challenge).unwrap();
            door.verify(&q("default"), &solution, crate::clock::now_ms() / 1000)
                .unwrap();
        }
    }

    #[test]
    fn difficulty_is_kept_in_range() {
        let d = Door::new(b"k", 1, Duration::from_secs(1));
        assert_eq!(d.issue(&q("a")).maxnumber, MIN_DIFFICULTY);
        let d = Door::new(b"k", u64::MAX, Duration::from_secs(1));
        assert_eq!(d.issue(&q("a")).maxnumber, MAX_DIFFICULTY);
    }
}
