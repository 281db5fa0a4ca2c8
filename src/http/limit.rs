//! Per-buyer limits on position polls, so a misbehaving client (or a page
//! stuck in a reload loop) cannot turn its own polling into load on the
//! store. Honest clients stay far below: the fastest polling tier is one
//! request a second. Joins are idempotent and stay unlimited here (a rate
//! per client address belongs to the gateway in front).

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::error::ApiError;
use crate::queue::{QueueName, UserId};

/// Sustained requests per second per buyer and queue.
const PER_SECOND: NonZeroU32 = NonZeroU32::new(2).expect("non-zero");
/// Polls a buyer may send at once (reloads, several tabs, retries).
const BURST: NonZeroU32 = NonZeroU32::new(10).expect("non-zero");

/// The limiter of one instance (limits are per instance, like the load a
/// client can put on it).
pub struct RequestLimits {
    limiter: DefaultKeyedRateLimiter<(QueueName, UserId)>,
    clock: DefaultClock,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(PER_SECOND).allow_burst(BURST),
            ),
            clock: DefaultClock::default(),
        }
    }
}

impl RequestLimits {
    /// Counts one request of `user` in `queue`; `429` with the wait when over.
    pub fn check(&self, queue: &QueueName, user: &UserId) -> Result<(), ApiError> {
        match self.limiter.check_key(&(queue.clone(), user.clone())) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                metrics::counter!("waitroom_rate_limited_total").increment(1);
                Err(ApiError::TooManyRequests {
                    message: "too many requests; follow pollingIntervalSeconds".into(),
                    retry_after_secs: wait.as_secs().max(1),
                })
            }
        }
    }

    /// Forgets buyers whose limit has fully recovered, so the table does not
    /// grow with every buyer ever seen.
    pub fn forget_idle(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}
