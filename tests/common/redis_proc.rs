//! What the tests' multi-process Redis set-ups (cluster.rs, sentinel.rs)
//! share: starting a `redis-server` child and knowing it is *ours* that
//! answers on its port, short blocking queries to one node, waiting for a
//! condition with a deadline, and stopping a child for good.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::die_with_the_test;

/// How long one node may take to answer after it was spawned.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Spawns `cmd` (a `redis-server` told to listen on `port`), dying with the
/// test, and waits until the server answering on `port` is this process:
/// another test may have taken the port between choosing it and the bind.
/// None (and nothing left running) if it exited or did not answer in time:
/// the caller tries another port.
pub fn spawn_on(mut cmd: Command, port: u16) -> Option<Child> {
    die_with_the_test(&mut cmd);
    let mut child = cmd.spawn().expect("redis-server must be installed");
    let pid = format!("process_id:{}", child.id());
    let started = Instant::now();
    while started.elapsed() < ANSWER_WITHIN {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if query::<String>(port, redis::cmd("INFO").arg("server"))
            .is_some_and(|i| i.lines().any(|l| l.trim() == pid))
        {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    stop(&mut child);
    None
}

/// SIGKILL and reap: no shutdown, no final write, no zombie.
pub fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Polls `done` every 100 ms; fails the test with `what` once `deadline`
/// passes (`within`: the budget it came from, for the message).
pub fn wait_until(deadline: Instant, within: Duration, what: &str, done: impl Fn() -> bool) {
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `cmd` against the node on `port`, on a fresh connection with short
/// timeouts: None when it is down, frozen or answers an error.
pub fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    cmd.query(&mut conn).ok()
}
