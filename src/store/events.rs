//! What happens in a queue, as every instance hears of it: queue events
//! through a subscription, plus the liveness probe and the per-instance
//! stream reports that travel through the store for the same reason (the
//! instances share nothing else).

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use super::{Pass, StoreResult};
use crate::queue::{QueueName, UserId};

/// A change that streams on any instance may need to hear about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum QueueEvent {
    /// An admission pass ran.
    Pass(Pass),
    /// A user left the line or gave up their token (`seq` when they waited).
    Left { user: UserId, seq: Option<u64> },
    /// A join into an empty line took the fast track: READY at once, with
    /// no pass (`at`: store clock, ms). Published so every instance counts
    /// every admission, not only those of passes.
    FastTracked { at: u64 },
    /// A user's token was used for an order.
    Consumed { user: UserId },
    /// The queue's stock ran out: every waiting stream ends `sold_out`
    /// (published once, by the report that found it gone).
    SoldOut,
    /// A lottery's draw placed its pre-queue in line: pre-queue streams
    /// re-read their standing and show their drawn place.
    Drawn,
    /// A lottery was scheduled or its opening moved: pre-queue streams
    /// show the new time.
    Rescheduled {
        #[serde(rename = "opensAt")]
        opens_at: u64,
    },
}

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// An event in `queue`.
    Queue { queue: QueueName, event: QueueEvent },
    /// The subscription was lost (a reset, or a ping left unanswered):
    /// events are missed until the `Resync` that follows its return.
    Interrupted,
    /// The subscription was interrupted and is back: events may have been
    /// lost, so every listener must re-read state from the store.
    Resync,
}

/// Events of every instance, reachability, and stream counts per instance.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Answers when the store is reachable.
    async fn ping(&self) -> StoreResult<()>;

    /// Every queue event of `queues`, from every instance, plus `Resync`
    /// after an interruption. The stream ends only when the store is dropped.
    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent>;

    /// Records that `instance` (an id of 1-100 printable ASCII characters)
    /// holds `streams` open streams, for `ttl_ms`, and answers every
    /// instance's last live report (its own included), by id: what the
    /// operator console shows as streams per instance. An instance that
    /// stopped reporting drops out once its report is older than its TTL.
    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_from_lua_json_with_empty_tables() {
        let raw = r#"{"kind":"pass","pass":3,"at":17,"admitted":{},"abandoned":{},"waiting":0,"busy":false}"#;
        let ev: QueueEvent = serde_json::from_str(raw).unwrap();
        match ev {
            QueueEvent::Pass(p) => {
                assert_eq!(p.pass, 3);
                assert!(p.admitted.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let raw = r#"{"kind":"left","user":"a","seq":null}"#;
        let ev: QueueEvent = serde_json::from_str(raw).unwrap();
        assert_eq!(
            ev,
            QueueEvent::Left {
                user: UserId::parse("a").unwrap(),
                seq: None
            }
        );
        // The fast track's event, as join.lua formats it.
        let raw = r#"{"kind":"fastTracked","at":1700000000000}"#;
        let ev: QueueEvent = serde_json::from_str(raw).unwrap();
        assert_eq!(ev, QueueEvent::FastTracked { at: 1700000000000 });
        // A user id that is not one makes the event unreadable rather than
        // reaching a stream as text.
        let raw = r#"{"kind":"consumed","user":"no such user!"}"#;
        assert!(serde_json::from_str::<QueueEvent>(raw).is_err());
    }
}
