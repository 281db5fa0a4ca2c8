//! The `front` section: the built-in reverse proxy's rooms (`--origin`,
//! the file's `[[rooms]]`) and the path waitroom's own routes take when
//! it stands in front of a site (`crate::front`).

use super::{Config, ConfigError};

impl Config {
    /// The built-in proxy's rooms: `--origin` (one room over the whole
    /// site, on the first queue) and the file's `[[rooms]]`; empty when
    /// there is no proxy.
    pub fn front_rooms(&self) -> Result<Vec<crate::front::RoomSpec>, ConfigError> {
        let mut rooms = self.rooms.clone();
        if let Some(origin) = &self.origin {
            let parsed = crate::front::Origin::parse(origin)
                .map_err(|e| ConfigError(format!("--origin: {e}")))?;
            let queue = self.queue_names()?.remove(0);
            rooms.push(crate::front::RoomSpec::whole_site(
                queue,
                parsed,
                self.origin_preserve_host,
            ));
        }
        Ok(rooms)
    }

    /// The path waitroom's own routes live under: `--base-path`, or with
    /// the built-in proxy on and no base path, `/_waitroom` (the rest of
    /// the site is the origin's).
    pub fn effective_base_path(&self) -> String {
        if self.base_path.is_empty() && (self.origin.is_some() || !self.rooms.is_empty()) {
            crate::front::DEFAULT_PREFIX.to_owned()
        } else {
            self.base_path.clone()
        }
    }

    /// The certificates `--origin-ca` trusts for `https://` origins (none
    /// unset).
    pub fn origin_ca_certs(&self) -> Result<Vec<crate::front::OriginCertificate>, ConfigError> {
        match &self.origin_ca {
            None => Ok(Vec::new()),
            Some(path) => crate::front::read_origin_ca(path)
                .map_err(|e| ConfigError(format!("--origin-ca {}: {e}", path.display()))),
        }
    }

    /// Every room names an opened queue, no two rooms answer the same
    /// host and prefix, and `--origin-ca` reads.
    pub(super) fn check_front(&self) -> Result<(), ConfigError> {
        self.origin_ca_certs()?;
        let rooms = self.front_rooms()?;
        let queues = self.queue_names()?;
        for (i, room) in self.rooms.iter().enumerate() {
            if !queues.contains(&room.queue) {
                return Err(ConfigError(format!(
                    "rooms[{i}].queue: `{}` is not opened (add it to --queues / `admission.queues`)",
                    room.queue
                )));
            }
        }
        for (i, room) in rooms.iter().enumerate() {
            if rooms[..i].iter().any(|r| {
                r.host == room.host
                    && r.path_prefix.trim_end_matches('/') == room.path_prefix.trim_end_matches('/')
            }) {
                let what = if i >= self.rooms.len() {
                    "--origin".to_owned()
                } else {
                    format!("rooms[{i}]")
                };
                return Err(ConfigError(format!(
                    "{what}: another room already answers the same match_host and path_prefix"
                )));
            }
        }
        Ok(())
    }
}
