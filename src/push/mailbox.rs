//! One stream's mailbox: the latest [`Update`] the hub has for it, and a
//! wake-up for the one task that writes it.
//!
//! Like a `watch` channel (a slow client skips to the latest view, so its
//! memory stays bounded), but for exactly one sender and one receiver:
//! `tokio::sync::watch` keeps nine `Notify`s per channel for many
//! receivers (over 400 bytes a stream) and locks each of them on every
//! send. Here a send is one uncontended lock and at most one wake, and the
//! whole mailbox is one small allocation; at 15,000 streams a pass makes
//! 15,000 sends in one sweep, so both count.
//!
//! The hub also tells streams of shutdown through their mailboxes, so a
//! stream waits on its own mailbox alone, not on a token every stream
//! shares (whose lock each stream would take twice per frame).

use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use super::view::{Update, View};

struct State {
    update: Update,
    /// Bumped by every send; the receiver remembers the last one it read.
    version: u64,
    /// The receiver's task, while it waits for a change.
    waker: Option<Waker>,
    /// The sender is gone: no update comes after the current one.
    closed: bool,
    /// The instance is shutting down: the stream is to end.
    shut_down: bool,
}

struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The hub's end: replaces the update and wakes the stream.
pub struct Sender {
    shared: Arc<Shared>,
}

/// The stream's end: waits for a change and reads the latest update.
pub struct Receiver {
    shared: Arc<Shared>,
    seen: u64,
}

/// Why no update comes any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The sender is gone (the stream was unregistered).
    Closed,
    /// The instance is shutting down.
    ShutDown,
}

/// A mailbox holding `initial`, seen by the receiver already.
pub fn channel(initial: Update) -> (Sender, Receiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            update: initial,
            version: 0,
            waker: None,
            closed: false,
            shut_down: false,
        }),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared, seen: 0 },
    )
}

impl Sender {
    /// The view the stream shows (or will show once it writes).
    pub fn view(&self) -> View {
        self.shared.lock().update.view.clone()
    }

    /// Runs `f` on the current update; the lock is held meanwhile.
    pub fn with<R>(&self, f: impl FnOnce(&Update) -> R) -> R {
        f(&self.shared.lock().update)
    }

    /// Replaces the update with `make(current)` unless that gives `None`,
    /// and wakes the stream; one lock for the check and the change.
    pub fn send_if(&self, make: impl FnOnce(&Update) -> Option<Update>) -> bool {
        let waker = {
            let mut state = self.shared.lock();
            let Some(update) = make(&state.update) else {
                return false;
            };
            state.update = update;
            state.version += 1;
            state.waker.take()
        };
        // Woken outside the lock, so the stream never waits for it.
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

impl Sender {
    /// Tells the stream the instance is shutting down.
    pub fn shut_down(&self) {
        let waker = {
            let mut state = self.shared.lock();
            state.shut_down = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.shared.lock();
            state.closed = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Receiver {
    /// The current update, marked as seen.
    pub fn borrow_and_update(&mut self) -> Update {
        let state = self.shared.lock();
        self.seen = state.version;
        state.update.clone()
    }

    /// The current update, not marked as seen.
    pub fn current(&self) -> Update {
        self.shared.lock().update.clone()
    }

    /// Whether an update came since the last [`Receiver::borrow_and_update`];
    /// `Err` once the sender is gone and nothing new is left.
    #[cfg(test)]
    pub fn has_changed(&self) -> Result<bool, Ended> {
        let state = self.shared.lock();
        if state.version != self.seen {
            Ok(true)
        } else if state.closed {
            Err(Ended::Closed)
        } else {
            Ok(false)
        }
    }

    /// Waits for an update not seen yet. `Err` at shutdown (before any
    /// update), or once the sender is gone and nothing new is left. Cancel
    /// safe.
    pub async fn changed(&self) -> Result<(), Ended> {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if state.shut_down {
                return Poll::Ready(Err(Ended::ShutDown));
            }
            if state.version != self.seen {
                return Poll::Ready(Ok(()));
            }
            if state.closed {
                return Poll::Ready(Err(Ended::Closed));
            }
            match &mut state.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::view::{EventId, GoneReason};
    use super::*;

    fn update(pass: u64, rank: u64) -> Update {
        Update {
            id: EventId { pass, n: 0 },
            view: View::Waiting {
                rank,
                total: 10,
                eta: None,
                range: None,
                held: false,
            },
        }
    }

    #[tokio::test]
    async fn the_receiver_sees_the_latest_update_once() {
        let (tx, mut rx) = channel(update(1, 5));
        assert_eq!(rx.has_changed(), Ok(false), "the initial update is seen");
        for rank in [4, 3, 2] {
            assert!(tx.send_if(|_| Some(update(2, rank))));
        }
        assert!(!tx.send_if(|_| None), "nothing to send");
        assert_eq!(rx.has_changed(), Ok(true));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update(), update(2, 2), "skips to the latest");
        assert_eq!(rx.has_changed(), Ok(false));
        let waiting = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        assert!(waiting.is_err(), "no change, no wake-up");
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send_and_by_the_close() {
        let (tx, mut rx) = channel(update(1, 5));
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send_if(|_| {
                Some(Update {
                    id: EventId { pass: 2, n: 0 },
                    view: View::Gone(GoneReason::Left),
                })
            });
            // Dropped here: the receiver still gets the last update first.
        });
        rx.changed().await.unwrap();
        sender.await.unwrap();
        assert_eq!(rx.borrow_and_update().view, View::Gone(GoneReason::Left));
        assert_eq!(rx.changed().await, Err(Ended::Closed));
        assert_eq!(rx.has_changed(), Err(Ended::Closed));
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait_before_any_update() {
        let (tx, rx) = channel(update(1, 5));
        let waiting = tokio::spawn(async move { rx.changed().await });
        tokio::task::yield_now().await;
        tx.send_if(|_| Some(update(2, 4)));
        tx.shut_down();
        assert_eq!(waiting.await.unwrap(), Err(Ended::ShutDown));
    }
}
