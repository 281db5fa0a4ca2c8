//! The opening burst: a sale's first connects arrive in the same
//! millisecond, before the server has accepted any of them. Each one the
//! kernel cannot queue is a dropped SYN and a buyer who waits out the
//! client's one-second retry. `--listen-backlog` (default 4096) sizes that
//! queue; tokio's and std's plain `bind` leave it at 128.

#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use futures::future::join_all;
use tokio::net::TcpStream;

/// Under the one second after which a client resends a dropped SYN: a
/// connect that takes longer was dropped once.
const NO_RETRY: Duration = Duration::from_millis(800);

fn config(extra: &[&str]) -> waitroom::Config {
    let mut args = vec![
        "waitroom",
        "--addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    waitroom::Config::try_parse_from(args).unwrap()
}

/// Opens `n` connections to `addr` at once, each given [`NO_RETRY`];
/// returns how many connected in time (the sockets stay open until all
/// are counted, as a burst's would).
async fn connect_at_once(addr: SocketAddr, n: usize) -> usize {
    let attempts = (0..n).map(|_| tokio::time::timeout(NO_RETRY, TcpStream::connect(addr)));
    let results = join_all(attempts).await;
    results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count()
}

fn somaxconn() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(128)
}

/// With the defaults, 600 connects that nobody has accepted yet all
/// complete at once (the kernel queues them), none waits for a retry.
/// With a backlog of 128 (what `TcpListener::bind` gives) most of these
/// would be dropped and this would count ~129.
#[tokio::test]
async fn an_opening_burst_is_queued_not_dropped() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    // The kernel caps any backlog at somaxconn; a machine set lower than
    // the burst can only be tested up to its cap.
    let burst = 600.min(somaxconn());
    let listeners = waitroom::Listeners::bind(&config(&[])).await.unwrap();
    let addr = listeners.public.local_addr().unwrap();
    let connected = connect_at_once(addr, burst).await;
    assert_eq!(
        connected,
        burst,
        "{} of {burst} connects waited for a SYN retry",
        burst - connected
    );
}

/// The flag is what sizes the queue: with `--listen-backlog 16`, a burst of
/// 100 unaccepted connects mostly waits for a retry (the kernel queues the
/// backlog plus one), which the default above does not.
#[tokio::test]
async fn the_backlog_is_the_configured_one() {
    let listeners = waitroom::Listeners::bind(&config(&["--listen-backlog", "16"]))
        .await
        .unwrap();
    let addr = listeners.public.local_addr().unwrap();
    let connected = connect_at_once(addr, 100).await;
    assert!(
        (16..=20).contains(&connected),
        "backlog 16 let {connected} of 100 connect without a retry"
    );
}

/// A backlog out of range stops the start with a clear message, before
/// any port is taken.
#[tokio::test]
async fn an_out_of_range_backlog_is_refused_at_start() {
    for bad in ["0", "65536"] {
        let err = match waitroom::Listeners::bind(&config(&["--listen-backlog", bad])).await {
            Ok(_) => panic!("--listen-backlog {bad} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("--listen-backlog must be 1-65535"),
            "{bad}: {err}"
        );
    }
    assert!(waitroom::Config::try_parse_from(["waitroom", "--listen-backlog", "-1"]).is_err());
}
