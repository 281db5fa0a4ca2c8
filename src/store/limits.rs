//! Request limits kept in the store, so every instance shares them: GCRA
//! buckets ([`Rate`]), the buyer's budget and the client address's limits
//! that joins are checked against (in the join's own atomic step, see
//! [`super::LineStore::enter_limited`]), and free-standing named buckets.

use async_trait::async_trait;

use super::StoreResult;

/// A request rate kept as a GCRA ("generic cell rate") bucket: `burst`
/// requests at once, then one every `period_ms`. A refused request costs
/// nothing and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Milliseconds one request takes to earn back (at least 1).
    pub period_ms: u64,
    /// Requests allowed at once (at least 1).
    pub burst: u32,
}

impl Rate {
    /// `n` per minute, all at once if need be; `None` for 0 (off).
    pub fn per_minute(n: u32) -> Option<Self> {
        (n > 0).then(|| Self {
            period_ms: (60_000 / u64::from(n)).max(1),
            burst: n,
        })
    }

    /// How far ahead of now a full bucket may run.
    pub fn window_ms(&self) -> u64 {
        self.period_ms.max(1) * u64::from(self.burst.max(1))
    }

    /// One request at `now_ms` against a bucket whose "theoretical arrival
    /// time" is `tat` (ms, 0 for a new bucket): `Ok(new tat)` to store,
    /// or `Err(ms to wait)`. The same arithmetic as `gcra.lua`.
    pub fn spend(&self, tat: u64, now_ms: u64) -> Result<u64, u64> {
        let next = tat.max(now_ms) + self.period_ms.max(1);
        let ahead = next - now_ms;
        let window = self.window_ms();
        if ahead > window {
            Err(ahead - window)
        } else {
            Ok(next)
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The buyer's request budget (polls, stream opens, repeat joins).
    Buyer,
    /// New places per client address per minute.
    AddressJoins,
    /// Places one client address holds at once.
    AddressPlaces,
    /// A bucket of [`LimitStore::spend`] (new visitors per address).
    Bucket,
}

/// A request refused by a limit kept in the store; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// The limit.
    pub kind: LimitKind,
    /// How long until the request would be allowed (a guess for
    /// [`LimitKind::AddressPlaces`]: places end when their buyers do).
    pub retry_after_ms: u64,
}

/// How long a refusal for places held tells the client to wait.
pub const PLACES_RETRY_MS: u64 = 10_000;

/// The per-buyer request budget as the store applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuyerBudget {
    /// The budget.
    pub rate: Rate,
    /// A repeat join within this long of its entry's creation (store
    /// clock) is a duplicate of the first and not counted.
    pub grace_ms: u64,
}

/// The limits of one client address a new place counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressLimits {
    /// The address's bucket name (an IPv4 address or an IPv6 /64), at most
    /// 64 characters of `[0-9a-fA-F.:/]`.
    pub key: String,
    /// New places per minute, if limited.
    pub joins: Option<Rate>,
    /// Places held at once (waiting or with a live token), if limited.
    pub places: Option<u32>,
}

/// The limits a join is checked against, in the same atomic step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinLimits {
    /// The buyer's budget, spent by a repeat join past its grace.
    pub buyer: Option<BuyerBudget>,
    /// The client address's limits, counted by a join that creates a place.
    pub address: Option<AddressLimits>,
}

/// Named rate buckets shared by every instance.
#[async_trait]
pub trait LimitStore: Send + Sync + 'static {
    /// Spends one from the shared bucket `bucket` (a name of
    /// `[A-Za-z0-9:./_-]`, at most 100 characters) at `rate`: `Ok` if it
    /// had room, else refused with [`LimitKind::Bucket`]. Every instance
    /// sharing the store shares the bucket.
    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_allows_its_burst_then_one_a_period() {
        let r = Rate::per_minute(3).unwrap();
        assert_eq!((r.period_ms, r.burst, r.window_ms()), (20_000, 3, 60_000));
        let now = 1_000_000;
        let mut tat = 0;
        for _ in 0..3 {
            tat = r.spend(tat, now).unwrap();
        }
        assert_eq!(r.spend(tat, now), Err(20_000));
        assert_eq!(r.spend(tat, now + 19_999), Err(1));
        assert!(r.spend(tat, now + 20_000).is_ok());
        assert!(Rate::per_minute(0).is_none());
        assert_eq!(Rate::per_minute(120_000).unwrap().period_ms, 1);
    }
}
