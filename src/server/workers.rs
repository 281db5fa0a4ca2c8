//! Serving threads: one single-threaded tokio runtime per core, each
//! serving the connections an accept loop hands it, in turn.
//!
//! **Why.** On tokio's work-stealing runtime a small request pays for its
//! wake-ups crossing threads: the socket's readiness, the answer's task
//! and hyper's connection task are picked up wherever a worker is free.
//! A connection whose socket, tasks and timers all live on one thread's
//! runtime is woken on that thread only. Measured with the gateway check
//! (docs/benchmarks/gate-listener-20261202T1900Z.md): 7.5 µs of CPU per
//! request on the work-stealing runtime, 5.3–6.0 µs here.
//!
//! **How.** The accept loop stays on the instance's runtime (the caps and
//! the refusals are decided there) and hands each accepted socket, out of
//! its runtime's reactor, to the next thread, with the future that serves
//! it; the thread registers the socket with its own reactor and spawns the
//! future. Closing the hand-over (dropping [`Workers`] through
//! [`Workers::finish`]) ends each thread's loop: what it still serves gets
//! the drain window, then the thread and its runtime end. What a handler
//! spawns runs on its connection's thread and ends with it at the latest.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

/// Most serving threads (one per core up to this).
const MAX_THREADS: usize = 8;

type Serve = Box<dyn FnOnce(TcpStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The serving threads of one listener.
pub struct Workers {
    hands: Vec<mpsc::UnboundedSender<(std::net::TcpStream, Serve)>>,
    stopped: Vec<oneshot::Receiver<()>>,
    next: usize,
}

impl Workers {
    /// Starts one thread per core (up to [`MAX_THREADS`]), named
    /// `name-N`; each runs `thread_start` first, and gives what it serves
    /// `drain` once the hand-over closes.
    pub fn start(name: &str, drain: Duration, thread_start: Option<fn()>) -> std::io::Result<Self> {
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_THREADS);
        let mut hands = Vec::with_capacity(threads);
        let mut stopped = Vec::with_capacity(threads);
        for n in 0..threads {
            let (hand, incoming) = mpsc::unbounded_channel();
            let (done, finished) = oneshot::channel();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || {
                    if let Some(start) = thread_start {
                        start();
                    }
                    runtime.block_on(work(incoming, drain));
                    let _ = done.send(());
                })?;
            hands.push(hand);
            stopped.push(finished);
        }
        Ok(Self {
            hands,
            stopped,
            next: 0,
        })
    }

    /// Hands `socket` to the next thread, to be served by `serve`. A socket
    /// that cannot leave this runtime's reactor is closed.
    pub fn hand<F>(
        &mut self,
        socket: TcpStream,
        serve: impl FnOnce(TcpStream) -> F + Send + 'static,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(socket) = socket.into_std() else {
            return;
        };
        self.next = (self.next + 1) % self.hands.len();
        let serve: Serve = Box::new(move |socket| Box::pin(serve(socket)));
        // A thread that is gone (it panicked) drops what it is handed.
        let _ = self.hands[self.next].send((socket, serve));
    }

    /// Closes the hand-over and waits for every thread to end (each within
    /// its drain window).
    pub async fn finish(self) -> std::io::Result<()> {
        drop(self.hands);
        for finished in self.stopped {
            finished
                .await
                .map_err(|_| std::io::Error::other("a serving thread panicked"))?;
        }
        Ok(())
    }
}

/// One thread: the sockets it is handed, each served as a task of its
/// runtime, until the hand-over closes; then what is open gets `drain`.
async fn work(
    mut incoming: mpsc::UnboundedReceiver<(std::net::TcpStream, Serve)>,
    drain: Duration,
) {
    let connections = TaskTracker::new();
    while let Some((socket, serve)) = incoming.recv().await {
        if let Ok(socket) = TcpStream::from_std(socket) {
            connections.spawn(serve(socket));
        }
    }
    connections.close();
    if tokio::time::timeout(drain, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain window; closing them");
    }
}
