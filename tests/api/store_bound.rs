//! Every Redis store call is bounded as a whole, not only per command: a
//! call that waits for a reconnection to a Redis that accepts connections
//! but never answers (SIGSTOP) fails closed within the call timeout, so no
//! request, background task or shutdown hangs on it.

use std::time::{Duration, Instant};

use waitroom::store::redis::{CALL_TIMEOUT, RedisStore};
use waitroom::store::{EventStore, StoreError};

use crate::common::RedisProcess;

#[tokio::test]
async fn a_call_waiting_on_a_reconnection_to_a_frozen_redis_fails_within_the_call_timeout() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = RedisStore::connect(&redis.url(), "bound").await.unwrap();
    store.ping().await.unwrap();
    // Redis goes away: the connection drops and the store starts
    // reconnecting; calls fail until its attempts run out.
    redis.kill();
    let mut failures = 0;
    while failures < 3 {
        assert!(store.ping().await.is_err(), "Redis is down");
        failures += 1;
    }
    // It comes back frozen: connections are accepted, nothing is answered,
    // so the next reconnection hangs in its handshake.
    redis.restart();
    redis.freeze();
    let limit = CALL_TIMEOUT + Duration::from_millis(500);
    for call in 0..2 {
        let started = Instant::now();
        let result = store.ping().await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "call {call}: {result:?}"
        );
        assert!(took <= limit, "call {call} took {took:?} (bound {limit:?})");
    }
    redis.thaw();
    // And the store recovers once Redis answers again.
    crate::common::eventually(
        Duration::from_secs(20),
        "the store answers again",
        || async { store.ping().await.ok() },
    )
    .await;
}
