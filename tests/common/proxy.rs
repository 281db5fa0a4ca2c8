//! A TCP proxy of the tests' own in front of one Redis node, to make the
//! connections open now silent while the node lives and new connections
//! work: what a wedged connection looks like from the client, which a
//! killed, frozen or restarted node cannot show (each affects every
//! connection alike).
//!
//! [`SilenceProxy::silence`] holds every byte of the connections open at
//! that moment (they stay open; nothing is forwarded either way);
//! [`SilenceProxy::heal`] forwards again, held bytes first. It counts the
//! connections it accepted and keeps the first bytes each client sent, so
//! a test can tell a RESP3 connection (it opens with `HELLO`) from a RESP2
//! one.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// One proxied connection.
struct Link {
    /// `true` while its bytes are held.
    silenced: watch::Sender<bool>,
    /// The client's first bytes (`None` until it sent any).
    first: Arc<Mutex<Option<Vec<u8>>>>,
}

/// A proxy on 127.0.0.1 to one port; stops (every connection closed) on
/// drop.
pub struct SilenceProxy {
    pub port: u16,
    links: Arc<Mutex<Vec<Link>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SilenceProxy {
    /// Starts a proxy to 127.0.0.1:`target` on a free port.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let links: Arc<Mutex<Vec<Link>>> = Arc::default();
        let task = {
            let links = links.clone();
            tokio::spawn(async move {
                // Owned here: aborting this task drops every pump with it.
                let mut pumps = JoinSet::new();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        continue;
                    };
                    let (silenced, rx) = watch::channel(false);
                    let first = Arc::new(Mutex::new(None));
                    links.lock().unwrap().push(Link {
                        silenced,
                        first: first.clone(),
                    });
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    pumps.spawn(pump(client_read, server_write, rx.clone(), Some(first)));
                    pumps.spawn(pump(server_read, client_write, rx, None));
                    // Reap the pumps that ended.
                    while pumps.try_join_next().is_some() {}
                }
            })
        };
        Self { port, links, task }
    }

    /// Holds every byte of the connections open now, both ways; later
    /// connections are not affected.
    pub fn silence(&self) {
        for link in self.links.lock().unwrap().iter() {
            link.silenced.send_replace(true);
        }
    }

    /// Forwards again on every connection, what was held first.
    pub fn heal(&self) {
        for link in self.links.lock().unwrap().iter() {
            link.silenced.send_replace(false);
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.links.lock().unwrap().len()
    }

    /// Connections accepted so far whose client spoke first, and not with
    /// a RESP3 `HELLO`: redis-rs opens a RESP2 connection with `CLIENT
    /// SETINFO`, a RESP3 one with `HELLO 3`.
    pub fn resp2_accepted(&self) -> usize {
        self.links
            .lock()
            .unwrap()
            .iter()
            .filter(|l| {
                l.first
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|b| !b.windows(5).any(|w| w.eq_ignore_ascii_case(b"HELLO")))
            })
            .count()
    }
}

impl Drop for SilenceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk held while `silenced` says so; the
/// first chunk also goes to `first`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silenced: watch::Receiver<bool>,
    first: Option<Arc<Mutex<Option<Vec<u8>>>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(first) = &first {
            first
                .lock()
                .unwrap()
                .get_or_insert_with(|| buf[..n.min(64)].to_vec());
        }
        if silenced.wait_for(|s| !*s).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
