//! One open stream ([`Watcher`]), the view a store snapshot starts it
//! with ([`view_of`]), and when it is re-read exactly ([`refresh_period`],
//! [`pre_queue_refresh`]); the registry (the module's root) moves it with
//! the queue's events in between.

use std::time::Duration;

use tokio::time::Instant;

use crate::push::mailbox;
use crate::push::view::{EventId, GoneReason, Update, View};
use crate::queue::{Forecast, Snapshot, Standing};

/// One open stream.
pub(in crate::push) struct Watcher {
    pub conn: u64,
    pub tx: mailbox::Sender,
    /// Arrival sequence while waiting (orders removals before/after us).
    pub seq: u64,
    /// Best known rank while waiting, before the pending leaves ahead of it
    /// are taken off ([`QueueWatchers::rank_of`] gives the rank itself).
    pub rank: u64,
    pub total: u64,
    pub id: EventId,
    /// The pass whose removals `rank` already counts (from the snapshot the
    /// stream started with, an exact re-read, or an applied pass), so a pass
    /// event arriving after a read that saw it is not counted twice.
    pub synced_pass: u64,
    pub next_refresh: Instant,
}

impl Watcher {
    pub(super) fn view(&self) -> View {
        self.tx.view()
    }

    pub fn is_gone(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::Gone(_)))
    }

    pub fn is_waiting(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::Waiting { .. }))
    }

    pub fn is_pre_queue(&self) -> bool {
        self.tx.with(|u| matches!(u.view, View::PreQueue { .. }))
    }

    /// Shows `view` as of `pass` if it differs from what is shown.
    pub fn show(&mut self, pass: u64, view: View) {
        let id = &mut self.id;
        self.tx.send_if(|shown| {
            if shown.view == view {
                return None;
            }
            *id = id.next(pass);
            Some(Update { id: *id, view })
        });
    }

    /// What a waiting stream at `rank` shows.
    pub(super) fn waiting_view(&self, rank: u64, forecast: Forecast) -> View {
        View::Waiting {
            rank,
            total: self.total.max(rank + 1),
            eta: forecast.wait_secs(rank),
            range: forecast.wait_range(rank),
            held: forecast.is_held(),
        }
    }
}

/// How long until a stream's exact rank is re-read: about a second near
/// the front, growing to three minutes far back, with ±25 % jitter so
/// refreshes spread evenly instead of arriving in waves. Events keep ranks
/// exact between re-reads; these only heal what an interruption lost, so
/// far back, where a rank moves slowly, they can be rare.
pub fn refresh_period(rank: u64) -> Duration {
    let base_ms = match rank {
        0..=99 => 1_000,
        100..=999 => 15_000,
        _ => (60_000 + rank * 10).min(180_000),
    };
    let jitter = rand::random_range(0.75..1.25);
    Duration::from_millis((base_ms as f64 * jitter) as u64)
}

/// The initial view for a snapshot (`None`: nothing to stream); a buyer in
/// line for a sold-out queue is told so at once.
pub fn view_of(snapshot: &Snapshot, forecast: Forecast) -> Option<View> {
    match &snapshot.standing {
        Standing::Waiting { .. } if snapshot.sold_out => Some(View::Gone(GoneReason::SoldOut)),
        Standing::Waiting { rank, .. } => {
            let forecast = forecast.with_held(snapshot.paused);
            Some(View::Waiting {
                rank: *rank,
                total: snapshot.total_waiting,
                eta: forecast.wait_secs(*rank),
                range: forecast.wait_range(*rank),
                held: forecast.is_held(),
            })
        }
        Standing::Ready {
            token,
            expires_in_ms,
        } => Some(View::Ready {
            token: token.as_str().to_owned(),
            expires_at: Instant::now() + Duration::from_millis(*expires_in_ms),
            total: snapshot.total_waiting,
            admitted_at: None,
        }),
        Standing::NotEntered => None,
    }
}

/// How long until a pre-queue stream is re-read without a draw event: only
/// a safety net for an event lost in an interruption (the resync re-reads
/// every stream anyway), so rare, and jittered so a large pre-queue does
/// not come due in one wave.
pub fn pre_queue_refresh() -> Duration {
    Duration::from_millis(rand::random_range(20_000..40_000))
}
