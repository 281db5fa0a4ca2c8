//! How long a protected site's sessions last, per queue: a room's
//! `session_idle_secs` / `session_max_secs` (`[[rooms]]`), else its
//! queue's (`[queues.<name>]`), else the global `pass.session_idle_secs` /
//! `pass.session_max_secs`.
//!
//! A pass (and its session) belongs to a queue, not to a room: the pass
//! endpoint starts the session of a queue, the gateway check and the
//! proxy accept it for that queue. So a room's times are its queue's, and
//! two sources that give one queue different times are refused rather
//! than one silently winning. These are not stored settings: like the
//! pass keys they are the configuration's, read at every start, the same
//! on every instance.

use std::collections::HashMap;

use super::{Config, ConfigError};
use crate::queue::QueueName;
use crate::store::{SessionLimits, SessionPolicy};

/// Session lengths accepted, seconds.
pub(super) const SESSION_SECS: (u64, u64) = (1, 86_400);

/// A value set for a queue and the key that set it (`rooms[1].session_idle_secs`).
struct Set {
    secs: u64,
    key: String,
}

/// What one queue's sources set.
#[derive(Default)]
struct QueueTimes {
    idle: Option<Set>,
    max: Option<Set>,
}

/// Takes `secs` (set by `key`) for `slot`, unless another key set a
/// different value for the same queue.
fn take(
    slot: &mut Option<Set>,
    secs: Option<u64>,
    key: String,
    queue: &QueueName,
) -> Result<(), ConfigError> {
    let Some(secs) = secs else {
        return Ok(());
    };
    match slot {
        Some(earlier) if earlier.secs != secs => Err(ConfigError(format!(
            "{key}: {secs} differs from {} ({}) for the same queue `{queue}`: a queue's \
             sessions have one length (set it once, or on the queue's [queues.{queue}] table)",
            earlier.key, earlier.secs
        ))),
        Some(_) => Ok(()),
        None => {
            *slot = Some(Set { secs, key });
            Ok(())
        }
    }
}

/// `queue`'s entry in `set`, added empty if missing (a few queues: a
/// list is enough).
fn times_of<'a>(
    set: &'a mut Vec<(QueueName, QueueTimes)>,
    queue: &QueueName,
) -> &'a mut QueueTimes {
    let at = match set.iter().position(|(q, _)| q == queue) {
        Some(at) => at,
        None => {
            set.push((queue.clone(), QueueTimes::default()));
            set.len() - 1
        }
    };
    &mut set[at].1
}

impl Config {
    /// Each queue's session limits, checked: `Err` names the key at
    /// fault (`rooms[i].…`, `queues.<name>: …`, or the global flag).
    pub(super) fn check_sessions(&self) -> Result<SessionPolicy, ConfigError> {
        let (low, high) = SESSION_SECS;
        let mut set: Vec<(QueueName, QueueTimes)> = Vec::new();
        for (name, overrides) in &self.queue_overrides {
            let times = times_of(&mut set, name);
            let key = |k: &str| format!("queues.{name}: {k}");
            take(
                &mut times.idle,
                overrides.session_idle_secs,
                key("session_idle_secs"),
                name,
            )?;
            take(
                &mut times.max,
                overrides.session_max_secs,
                key("session_max_secs"),
                name,
            )?;
        }
        for (r, room) in self.rooms.iter().enumerate() {
            let queue = &room.queue;
            let times = times_of(&mut set, queue);
            let key = |k: &str| format!("rooms[{r}].{k}");
            take(
                &mut times.idle,
                room.sessions.idle_secs,
                key("session_idle_secs"),
                queue,
            )?;
            take(
                &mut times.max,
                room.sessions.max_secs,
                key("session_max_secs"),
                queue,
            )?;
        }
        let mut by_queue = HashMap::new();
        for (queue, times) in set {
            if times.idle.is_none() && times.max.is_none() {
                continue;
            }
            let idle = times
                .idle
                .as_ref()
                .map_or(self.session_idle_secs, |s| s.secs);
            let max = times.max.as_ref().map_or(self.session_max_secs, |s| s.secs);
            if let Some(s) = &times.idle
                && !(low..=high).contains(&s.secs)
            {
                return Err(ConfigError(format!("{}: must be {low}-{high}", s.key)));
            }
            if let Some(s) = &times.max
                && !(low..=high).contains(&s.secs)
            {
                return Err(ConfigError(format!("{}: must be {low}-{high}", s.key)));
            }
            if max < idle {
                // Name the queue's own key, and the global one it meets.
                let message = match (&times.idle, &times.max) {
                    (Some(i), Some(m)) => format!(
                        "{}: {} is below {} ({}): a session lasts at least its idle time",
                        m.key, m.secs, i.key, i.secs
                    ),
                    (Some(i), None) => format!(
                        "{}: {} is above the longest session of queue `{queue}` ({max}, \
                         --session-max-secs): set session_max_secs beside it",
                        i.key, i.secs
                    ),
                    (None, Some(m)) => format!(
                        "{}: {} is below the session idle time of queue `{queue}` ({idle}, \
                         --session-idle-secs): set session_idle_secs beside it",
                        m.key, m.secs
                    ),
                    (None, None) => unreachable!("skipped above"),
                };
                return Err(ConfigError(message));
            }
            by_queue.insert(
                queue,
                SessionLimits {
                    idle_ms: idle * 1000,
                    max_ms: max * 1000,
                },
            );
        }
        Ok(SessionPolicy {
            default: self.session_limits(),
            by_queue,
        })
    }

    /// How long sessions last in each queue (checked by `validate`).
    pub fn session_policy(&self) -> SessionPolicy {
        self.check_sessions()
            .unwrap_or_else(|_| SessionPolicy::uniform(self.session_limits()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, flags: &[&str]) -> Result<Config, String> {
        let path = std::env::temp_dir().join(format!(
            "waitroom-sessions-{}-{:x}.toml",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, text).unwrap();
        let mut args = vec!["--config".to_owned(), path.display().to_string()];
        args.extend(flags.iter().map(|f| f.to_string()));
        let loaded = super::super::load(args, false)
            .map(|l| l.config)
            .map_err(|e| e.to_string());
        let _ = std::fs::remove_file(path);
        loaded
    }

    fn limits(idle_secs: u64, max_secs: u64) -> SessionLimits {
        SessionLimits {
            idle_ms: idle_secs * 1000,
            max_ms: max_secs * 1000,
        }
    }

    #[test]
    fn a_room_then_its_queue_then_the_global_times_hold() {
        let config = load(
            "[admission]\nqueues = [\"drops\", \"tickets\", \"plain\"]\n\n\
             [queues.tickets]\nsession_max_secs = 600\n\n\
             [[rooms]]\nqueue = \"drops\"\norigin = \"http://127.0.0.1:3000\"\npath_prefix = \"/d\"\nsession_idle_secs = 60\n\n\
             [[rooms]]\nqueue = \"drops\"\norigin = \"http://127.0.0.1:3000\"\npath_prefix = \"/e\"\n",
            &["--session-idle-secs", "120", "--session-max-secs", "1800"],
        )
        .unwrap();
        let policy = config.session_policy();
        let q = |name: &str| QueueName::parse(name).unwrap();
        assert_eq!(policy.for_queue(&q("drops")), limits(60, 1800));
        assert_eq!(policy.for_queue(&q("tickets")), limits(120, 600));
        assert_eq!(policy.for_queue(&q("plain")), limits(120, 1800));
        assert_eq!(policy.default, limits(120, 1800));
        assert_eq!(policy.longest_ms(), 1_800_000);
        // A queue's longer session keeps a retired key accepted longer.
        let config = load(
            "[queues.default]\nsession_max_secs = 7200\n",
            &["--session-max-secs", "600"],
        )
        .unwrap();
        assert_eq!(config.session_policy().longest_ms(), 7_200_000);
    }

    #[test]
    fn disagreeing_or_out_of_range_times_name_their_key() {
        let room = |extra: &str| {
            format!("[[rooms]]\nqueue = \"default\"\norigin = \"http://127.0.0.1:3000\"\n{extra}")
        };
        let e = load(&room("session_idle_secs = 0\n"), &[]).unwrap_err();
        assert!(
            e.contains("rooms[0].session_idle_secs: must be 1-86400"),
            "{e}"
        );
        let e = load(&room("session_max_secs = 10\n"), &[]).unwrap_err();
        assert!(
            e.contains("rooms[0].session_max_secs: 10 is below the session idle time")
                && e.contains("pass.session_idle_secs (source: default)"),
            "{e}"
        );
        let e = load(
            &room("session_idle_secs = 100\nsession_max_secs = 50\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains("rooms[0].session_max_secs: 50 is below rooms[0].session_idle_secs (100)"),
            "{e}"
        );
        // The global flag meets the room's: the room is named, and the flag.
        let e = load(
            &room("session_idle_secs = 900\n"),
            &["--session-max-secs", "600"],
        )
        .unwrap_err();
        assert!(
            e.contains("rooms[0].session_idle_secs: 900 is above")
                && e.contains("pass.session_max_secs (source: flag --session-max-secs)"),
            "{e}"
        );
        let e = load(
            "[queues.default]\nsession_idle_secs = 30\nsession_max_secs = 20\n",
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains("queues.default: session_max_secs: 20 is below"),
            "{e}"
        );
    }
}
