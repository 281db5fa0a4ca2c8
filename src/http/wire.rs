//! A buyer's state on the wire: one JSON object, [`QueueStatus`], answered
//! by a join and a position poll and carried by every `waiting` and `ready`
//! event of the stream, with the same field names and the same `status`
//! values; `gone` says `NOT_ENTERED` and why.
//!
//! It lives at the HTTP edge because the names are the API's: `queue`
//! keeps the rules (ranks, polling tiers, estimates) and `push` the views a
//! stream shows, and neither knows JSON.

use serde::Serialize;
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::push::View;
use crate::queue::{Forecast, Snapshot, Standing, WaitRange, polling_interval_secs};

/// The statuses of the public API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// In line.
    Waiting,
    /// Holds an entry token.
    Ready,
    /// Neither: the place has ended (a stream's `gone` says why).
    NotEntered,
    /// In line for a queue whose stock is sold out: nobody will be
    /// admitted unless it is restocked, when the place counts again in its
    /// order (poll now and then to see: `WAITING` again).
    SoldOut,
    /// In the pre-queue of a scheduled opening: no place yet; at
    /// `lottery.opensAt` the draw places every pre-queue entry in line
    /// (then `WAITING`).
    PreQueue,
}

/// How often a buyer in line for a sold-out queue may look for a restock.
pub const SOLD_OUT_POLL_SECS: u64 = 30;

/// A buyer's state: the body of a position poll (and of a join, with the
/// ticket), and the data of the stream's `waiting` and `ready` events. Its
/// shape is stable: a field that does not apply is `null`, never missing.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    pub status: Status,
    /// Buyers ahead (0-based); `null` unless waiting (or `SOLD_OUT`).
    pub rank: Option<u64>,
    /// `rank + 1`; `null` unless waiting (or `SOLD_OUT`).
    pub position: Option<u64>,
    /// How many wait in the whole queue.
    pub total_waiting: u64,
    /// From the observed admission rate, rounded up; `null` unless waiting
    /// or while nothing is admitted.
    pub estimated_wait_seconds: Option<u64>,
    /// The wait's 80 % range, from the observed admission rate and its
    /// spread (pass sizes, departures); `null` unless waiting, while
    /// nothing is admitted, or until admissions have been observed.
    pub estimated_wait_range: Option<WaitRangeBody>,
    /// How often to poll when no stream is open; `null` unless waiting (or
    /// `SOLD_OUT`: how often to look for a restock).
    pub polling_interval_seconds: Option<u64>,
    /// When the buyer joined (RFC 3339, UTC); `null` when not entered.
    pub entered_at: Option<String>,
    /// The entry token; `null` unless ready.
    pub entry_token: Option<String>,
    /// Seconds the token has left, rounded up; `null` unless ready.
    pub token_expires_in_seconds: Option<u64>,
    /// `true` while waiting in a queue whose admission an operator holds
    /// (the estimates are then `null`: nobody is admitted until they
    /// resume). Left out otherwise, like `lottery`, so every other frame
    /// keeps the shape it had.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// The buyer's lottery entry: only with `PRE_QUEUE`, the one field
    /// that is left out rather than `null` (every other status keeps the
    /// shape it had, byte for byte, in polls and stream frames alike).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lottery: Option<PreQueueBody>,
}

/// A buyer's entry in the lottery of a scheduled opening.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreQueueBody {
    /// When the draw places the pre-queue in line, ms since the epoch.
    pub opens_at: u64,
    /// Seconds until then, rounded up (0 once due: the draw is imminent).
    pub seconds_to_open: u64,
    /// `hex(SHA-256(seed))`, published before the draw.
    pub commitment: String,
    /// This entry's random text: `fingerprint` is
    /// `hex(SHA-256("waitroom-lottery-v1\n" + queue + "\n" + nonce))`.
    pub nonce: String,
    /// What the published list shows for this entry.
    pub fingerprint: String,
}

impl QueueStatus {
    /// The status of a buyer in the pre-queue (`total` waiting in line).
    pub fn pre_queue(total: u64, lottery: PreQueueBody) -> Self {
        Self {
            status: Status::PreQueue,
            polling_interval_seconds: Some(polling_interval_secs(u64::MAX)),
            lottery: Some(lottery),
            ..Self::not_entered(total)
        }
    }
}

/// An 80 % range of the wait: at least `low` and at most `high` seconds
/// for four buyers in five.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = WaitRange)]
pub struct WaitRangeBody {
    /// Seconds, rounded down.
    pub low: u64,
    /// Seconds, rounded up; never below `low`.
    pub high: u64,
}

impl From<WaitRange> for WaitRangeBody {
    fn from(r: WaitRange) -> Self {
        Self {
            low: r.low,
            high: r.high,
        }
    }
}

impl QueueStatus {
    /// The status for a store snapshot, with the wait estimated by
    /// `forecast`.
    pub fn new(snapshot: &Snapshot, forecast: Forecast) -> Self {
        let total = snapshot.total_waiting;
        match &snapshot.standing {
            Standing::Waiting { rank, .. } if snapshot.sold_out => Self {
                status: Status::SoldOut,
                estimated_wait_seconds: None,
                estimated_wait_range: None,
                polling_interval_seconds: Some(SOLD_OUT_POLL_SECS),
                ..Self::waiting(
                    *rank,
                    total,
                    (None, None),
                    entered_at(snapshot.entered_at_ms),
                )
            },
            Standing::Waiting { rank, .. } => {
                let forecast = forecast.with_held(snapshot.paused);
                Self {
                    held: forecast.is_held(),
                    ..Self::waiting(
                        *rank,
                        total,
                        (forecast.wait_secs(*rank), forecast.wait_range(*rank)),
                        entered_at(snapshot.entered_at_ms),
                    )
                }
            }
            Standing::Ready {
                token,
                expires_in_ms,
            } => Self::ready(
                token.as_str(),
                expires_in_ms.div_ceil(1000),
                total,
                entered_at(snapshot.entered_at_ms),
            ),
            Standing::NotEntered => Self::not_entered(total),
        }
    }

    fn waiting(
        rank: u64,
        total: u64,
        (eta, range): (Option<u64>, Option<WaitRange>),
        entered_at: Option<String>,
    ) -> Self {
        Self {
            status: Status::Waiting,
            rank: Some(rank),
            position: Some(rank + 1),
            total_waiting: total,
            estimated_wait_seconds: eta,
            estimated_wait_range: range.map(Into::into),
            polling_interval_seconds: Some(polling_interval_secs(rank)),
            entered_at,
            entry_token: None,
            token_expires_in_seconds: None,
            held: false,
            lottery: None,
        }
    }

    fn ready(token: &str, expires_in_secs: u64, total: u64, entered_at: Option<String>) -> Self {
        Self {
            status: Status::Ready,
            rank: None,
            position: None,
            total_waiting: total,
            estimated_wait_seconds: None,
            estimated_wait_range: None,
            polling_interval_seconds: None,
            entered_at,
            entry_token: Some(token.to_owned()),
            token_expires_in_seconds: Some(expires_in_secs),
            held: false,
            lottery: None,
        }
    }

    fn not_entered(total: u64) -> Self {
        Self {
            status: Status::NotEntered,
            rank: None,
            position: None,
            total_waiting: total,
            estimated_wait_seconds: None,
            estimated_wait_range: None,
            polling_interval_seconds: None,
            entered_at: None,
            entry_token: None,
            token_expires_in_seconds: None,
            held: false,
            lottery: None,
        }
    }
}

/// The data of a `ready` event: the buyer's [`QueueStatus`] and when the
/// pass that admitted them ran.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadyEvent {
    #[serde(flatten)]
    pub status: QueueStatus,
    /// Store clock, ms since the epoch, of the admitting pass; `null` when
    /// the stream found the buyer already admitted.
    pub admitted_at: Option<u64>,
}

/// The data of a `gone` event, the stream's last: the place has ended.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GoneEvent {
    /// Always `NOT_ENTERED`.
    pub status: Status,
    /// Why the place ended.
    #[schema(value_type = GoneReasonName)]
    pub reason: &'static str,
}

/// The reasons a `gone` event gives (documentation of
/// `push::GoneReason::as_str`, which writes them).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = GoneReason)]
#[serde(rename_all = "snake_case")]
pub enum GoneReasonName {
    /// The buyer left.
    Left,
    /// The entry token expired unused.
    Expired,
    /// The entry token bought an order.
    Consumed,
    /// Dropped as absent (not seen for `--abandon-after-secs`).
    Abandoned,
    /// A newer entry of the same buyer took over.
    Replaced,
    /// Neither waiting nor holding a token.
    NotEntered,
    /// The queue's stock ran out while the buyer waited; the place is kept
    /// for a restock (a poll answers `SOLD_OUT` until then).
    SoldOut,
}

/// A stream's wire form: each view as an event, its name and JSON data.
/// Holds when the stream's entry joined, as [`entered_at`] formats it: no
/// view carries it since it never changes for a stream (a new entry ends
/// the stream as `replaced`), so the stream formats it once.
pub struct StreamWire {
    entered_at: Option<String>,
}

impl StreamWire {
    /// The wire form of a stream whose entry joined at `entered_at`.
    pub fn new(entered_at: Option<String>) -> Self {
        Self { entered_at }
    }
}

impl crate::push::Render for StreamWire {
    fn name(&self, view: &View) -> &'static str {
        match view {
            View::Waiting { .. } => "waiting",
            View::Ready { .. } => "ready",
            View::Gone(_) => "gone",
            View::PreQueue { .. } => "prequeue",
        }
    }

    fn data(&self, view: &View, out: &mut String) {
        let entered_at = self.entered_at.as_deref();
        match view {
            View::Waiting {
                rank,
                total,
                eta,
                range,
                held,
            } => waiting_data(*rank, *total, (*eta, *range), *held, entered_at, out),
            View::Ready {
                token,
                expires_at,
                total,
                admitted_at,
            } => {
                let left = expires_at.saturating_duration_since(Instant::now());
                let secs = left.as_millis().div_ceil(1000) as u64;
                let event = ReadyEvent {
                    status: QueueStatus::ready(token, secs, *total, entered_at.map(str::to_owned)),
                    admitted_at: *admitted_at,
                };
                out.push_str(&serde_json::to_string(&event).expect("plain data serializes"));
            }
            View::PreQueue { status, opens_at } => pre_queue_data(status, *opens_at, out),
            View::Gone(reason) => {
                let event = GoneEvent {
                    status: Status::NotEntered,
                    reason: reason.as_str(),
                };
                out.push_str(&serde_json::to_string(&event).expect("plain data serializes"));
            }
        }
    }
}

/// A `prequeue` event's data: the status rendered at connect, with the
/// opening time it is to show now (an operator may have moved it since) and
/// the seconds left to it. Rare (a connect, a move), so parsed and written
/// again rather than kept in parts.
fn pre_queue_data(status: &str, opens_at: u64, out: &mut String) {
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(status) else {
        out.push_str(status);
        return;
    };
    if let Some(lottery) = value.get_mut("lottery").and_then(|l| l.as_object_mut()) {
        let now = crate::clock::now_ms();
        lottery.insert("opensAt".into(), opens_at.into());
        lottery.insert(
            "secondsToOpen".into(),
            opens_at.saturating_sub(now).div_ceil(1000).into(),
        );
    }
    out.push_str(&serde_json::to_string(&value).unwrap_or_else(|_| status.to_owned()));
}

/// A `waiting` event's data, byte for byte what serde writes for
/// [`QueueStatus`] (a test holds it to that), written straight: a pass
/// sends one to every stream, and this is most of what a frame costs
/// besides its write.
fn waiting_data(
    rank: u64,
    total: u64,
    (eta, range): (Option<u64>, Option<WaitRange>),
    held: bool,
    entered_at: Option<&str>,
    out: &mut String,
) {
    // RFC 3339 needs no JSON escape; anything else goes through serde.
    let plain = |s: &str| s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
    if entered_at.is_some_and(|s| !plain(s)) {
        let status = QueueStatus {
            held,
            ..QueueStatus::waiting(rank, total, (eta, range), entered_at.map(str::to_owned))
        };
        out.push_str(&serde_json::to_string(&status).expect("plain data serializes"));
        return;
    }
    out.push_str("{\"status\":\"WAITING\",\"rank\":");
    push_decimal(out, rank);
    out.push_str(",\"position\":");
    push_decimal(out, rank + 1);
    out.push_str(",\"totalWaiting\":");
    push_decimal(out, total);
    out.push_str(",\"estimatedWaitSeconds\":");
    match eta {
        Some(eta) => push_decimal(out, eta),
        None => out.push_str("null"),
    }
    out.push_str(",\"estimatedWaitRange\":");
    match range {
        Some(range) => {
            out.push_str("{\"low\":");
            push_decimal(out, range.low);
            out.push_str(",\"high\":");
            push_decimal(out, range.high);
            out.push('}');
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"pollingIntervalSeconds\":");
    push_decimal(out, polling_interval_secs(rank));
    out.push_str(",\"enteredAt\":");
    match entered_at {
        Some(at) => {
            out.push('"');
            out.push_str(at);
            out.push('"');
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"entryToken\":null,\"tokenExpiresInSeconds\":null");
    if held {
        out.push_str(",\"held\":true");
    }
    out.push('}');
}

/// Appends `n` in decimal, without the formatting machinery (`write!`
/// costs more than the rest of a `waiting` data put together).
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(d as char);
    }
}

/// A view as an event, its name and JSON data, as a stream whose entry
/// joined at `entered_at` writes it.
#[cfg(test)]
fn event(view: &View, entered_at: Option<&str>) -> (&'static str, String) {
    use crate::push::Render as _;
    let wire = StreamWire::new(entered_at.map(str::to_owned));
    let mut data = String::new();
    wire.data(view, &mut data);
    (wire.name(view), data)
}

/// An entry time as the wire shows it (RFC 3339, milliseconds). A stream
/// formats it once when it opens and repeats it in every frame.
pub fn entered_at(ms: Option<u64>) -> Option<String> {
    ms.and_then(rfc3339_from_ms)
}

fn rfc3339_from_ms(ms: u64) -> Option<String> {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::push::GoneReason;
    use crate::queue::{EntryToken, RateEstimator};

    fn snap(standing: Standing) -> Snapshot {
        Snapshot {
            standing,
            total_waiting: 500,
            entered_at_ms: Some(1_700_000_000_123),
            pass: 7,
            entry: Some(9),
            sold_out: false,
            paused: false,
            entries_issued: None,
        }
    }

    const FIELDS: [&str; 10] = [
        "status",
        "rank",
        "position",
        "totalWaiting",
        "estimatedWaitSeconds",
        "estimatedWaitRange",
        "pollingIntervalSeconds",
        "enteredAt",
        "entryToken",
        "tokenExpiresInSeconds",
    ];

    #[test]
    fn waiting_status() {
        let s = QueueStatus::new(
            &snap(Standing::Waiting { rank: 120, seq: 9 }),
            Forecast::at_rate(50.0),
        );
        assert_eq!(s.status, Status::Waiting);
        assert_eq!((s.rank, s.position), (Some(120), Some(121)));
        assert_eq!(s.polling_interval_seconds, Some(3));
        assert_eq!(s.estimated_wait_seconds, Some(3));
        assert_eq!(s.entered_at.as_deref(), Some("2023-11-14T22:13:20.123Z"));
        assert_eq!(s.entry_token, None);
    }

    #[test]
    fn ready_status_and_stable_shape() {
        let token = EntryToken::generate();
        let s = QueueStatus::new(
            &snap(Standing::Ready {
                token: token.clone(),
                expires_in_ms: 299_001,
            }),
            Forecast::at_rate(50.0),
        );
        assert_eq!(s.status, Status::Ready);
        assert_eq!(s.entry_token.as_deref(), Some(token.as_str()));
        assert_eq!(s.token_expires_in_seconds, Some(300));
        let json = serde_json::to_value(&s).unwrap();
        for field in FIELDS {
            assert!(json.get(field).is_some(), "{field} missing");
        }
        assert_eq!(json["status"], "READY");
        assert!(json["rank"].is_null());
    }

    #[test]
    fn not_entered_has_no_entry_time() {
        let s = QueueStatus::new(&snap(Standing::NotEntered), Forecast::at_rate(50.0));
        assert_eq!(s.status, Status::NotEntered);
        assert_eq!(s.entered_at, None);
        assert_eq!(serde_json::to_value(&s).unwrap()["status"], "NOT_ENTERED");
    }

    /// A stream's `waiting` and `ready` data are the object a poll answers
    /// for the same state, field for field.
    #[test]
    fn stream_events_carry_the_polled_status() {
        let snapshot = snap(Standing::Waiting { rank: 120, seq: 9 });
        let polled =
            serde_json::to_value(QueueStatus::new(&snapshot, Forecast::at_rate(50.0))).unwrap();
        let view = View::Waiting {
            rank: 120,
            total: 500,
            eta: Forecast::at_rate(50.0).wait_secs(120),
            range: None,
            held: false,
        };
        let (name, data) = event(&view, entered_at(snapshot.entered_at_ms).as_deref());
        assert_eq!(name, "waiting");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&data).unwrap(),
            polled
        );

        let token = EntryToken::generate();
        let snapshot = snap(Standing::Ready {
            token: token.clone(),
            expires_in_ms: 300_000,
        });
        let polled =
            serde_json::to_value(QueueStatus::new(&snapshot, Forecast::at_rate(50.0))).unwrap();
        let view = View::Ready {
            token: token.as_str().to_owned(),
            expires_at: Instant::now() + Duration::from_millis(300_000),
            total: 500,
            admitted_at: Some(1_700_000_001_000),
        };
        let (name, data) = event(&view, entered_at(snapshot.entered_at_ms).as_deref());
        assert_eq!(name, "ready");
        let mut data: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(data["admittedAt"], 1_700_000_001_000u64);
        data.as_object_mut().unwrap().remove("admittedAt");
        assert_eq!(data, polled);

        for (reason, name) in [
            (GoneReason::Left, GoneReasonName::Left),
            (GoneReason::Expired, GoneReasonName::Expired),
            (GoneReason::Consumed, GoneReasonName::Consumed),
            (GoneReason::Abandoned, GoneReasonName::Abandoned),
            (GoneReason::Replaced, GoneReasonName::Replaced),
            (GoneReason::NotEntered, GoneReasonName::NotEntered),
            (GoneReason::SoldOut, GoneReasonName::SoldOut),
        ] {
            assert_eq!(serde_json::to_value(name).unwrap(), reason.as_str());
        }
        let (name, data) = event(&View::Gone(GoneReason::Left), None);
        assert_eq!(name, "gone");
        assert_eq!(data, r#"{"status":"NOT_ENTERED","reason":"left"}"#);
    }

    /// The range is on the wire once passes have been observed, in a poll
    /// and in a stream's frame alike.
    #[test]
    fn the_wait_range_follows_the_observed_passes() {
        let mut e = RateEstimator::new(30_000);
        for i in 0..10u64 {
            e.record(i * 1_000, if i % 2 == 0 { 40 } else { 60 }, 0, 1_000);
        }
        let forecast = e.forecast(1.0);
        let snapshot = snap(Standing::Waiting { rank: 120, seq: 9 });
        let polled = serde_json::to_value(QueueStatus::new(&snapshot, forecast)).unwrap();
        let range = forecast.wait_range(120).unwrap();
        assert_eq!(polled["estimatedWaitRange"]["low"], range.low);
        assert_eq!(polled["estimatedWaitRange"]["high"], range.high);
        assert!(range.low <= 3 && range.high >= 3, "{range:?}");
        let view = View::Waiting {
            rank: 120,
            total: 500,
            eta: forecast.wait_secs(120),
            range: Some(range),
            held: false,
        };
        let (_, data) = event(&view, entered_at(snapshot.entered_at_ms).as_deref());
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&data).unwrap(),
            polled
        );
        let fallback = QueueStatus::new(&snapshot, Forecast::at_rate(50.0));
        assert_eq!(fallback.estimated_wait_range, None);
    }

    proptest::proptest! {
        /// The hand-written `waiting` data is serde's, byte for byte.
        #[test]
        fn waiting_data_is_what_serde_writes(
            rank in proptest::prop_oneof![0u64..2_000, 0u64..u64::MAX - 1],
            total in proptest::num::u64::ANY,
            eta in proptest::option::of(proptest::num::u64::ANY),
            range in proptest::option::of((proptest::num::u64::ANY, proptest::num::u64::ANY)),
            entered_ms in proptest::option::of(0u64..4_102_444_800_000),
            odd in proptest::option::of("[ -~\u{1}-\u{1f}é]{0,12}"),
            held in proptest::bool::ANY,
        ) {
            let at = odd.or_else(|| entered_at(entered_ms));
            let range = range.map(|(a, b)| WaitRange { low: a.min(b), high: a.max(b) });
            let view = View::Waiting { rank, total, eta, range, held };
            let (name, data) = event(&view, at.as_deref());
            let serde = serde_json::to_string(&QueueStatus {
                held,
                ..QueueStatus::waiting(rank, total, (eta, range), at)
            })
            .unwrap();
            proptest::prop_assert_eq!(name, "waiting");
            proptest::prop_assert_eq!(data, serde);
        }
    }
}
