//! The configuration: flags, environment variables and a TOML file,
//! validated at start-up.
//!
//! Every flag can also be set through the environment variable named in
//! `--help` and through a key of the file given with `--config` (the table
//! in `keys.rs`); names and defaults are the public contract
//! (docs/configuration.md, generated from this module). Precedence:
//! defaults < file < environment < flags (`load.rs`).

mod check;
mod doc;
pub mod features;
mod file;
mod front;
mod init;
pub mod keys;
mod load;
mod pass;
mod queues;
mod sessions;
mod validate;
mod values;

pub use doc::markdown as configuration_doc;
pub use init::template as init_template;
pub use load::{LoadError, Loaded, Source, Sources, load};
pub use queues::{AdaptiveOverrides, QueueOverrides};

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::queue::QueueName;

/// What `waitroom --version` says after the name: the version, the commit
/// it was built from and the Cargo features it was built with (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WAITROOM_COMMIT"),
    ", features: ",
    env!("WAITROOM_FEATURES"),
    ")"
);

/// waitroom: a virtual waiting room in front of an order API.
#[derive(Debug, Clone, Parser)]
#[command(name = "waitroom", version = VERSION, about, args_override_self = true)]
pub struct Config {
    /// A TOML configuration file (`waitroom init` prints one). Its values
    /// stand in for the defaults; the environment and the flags still win.
    #[arg(short = 'c', long = "config", env = "WAITROOM_CONFIG")]
    pub config_file: Option<PathBuf>,

    /// Address to listen on (buyers: the queue, the page, the demo orders).
    #[arg(long, env = "WAITROOM_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,

    /// Address of the operator listener: `/metrics`, `/api/admin/*` and
    /// `/api/tokens/*` (and the probes). Unset: 127.0.0.1:9090, or a free
    /// loopback port (logged) when that one is taken, so several instances
    /// on one host start with the defaults. Set: it must bind, or the
    /// process does not start.
    #[arg(long, env = "WAITROOM_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,

    /// Address of the gateway listener: the gateway check alone
    /// (`/api/gate/check`, no base path) for nginx `auth_request`, Caddy
    /// `forward_auth`, Traefik `ForwardAuth` or HAProxy, on a port of its
    /// own: the same answer as on --addr at a fraction of the cost per
    /// request, and only the total connections capped (a gateway is one
    /// address holding many). Unset: no such listener (the check is still
    /// served on --addr).
    #[arg(long, env = "WAITROOM_GATE_ADDR")]
    pub gate_addr: Option<SocketAddr>,

    /// Connections the kernel may hold for `--addr` before they are
    /// accepted (the listen backlog). A sale opens with thousands of
    /// connects in the same millisecond; past the backlog the kernel drops
    /// a SYN and that buyer's browser retries one second later (then 3 s,
    /// 7 s). Linux caps it at `net.core.somaxconn` (4096 on kernels since
    /// 5.4); a larger value is logged at start-up. 1-65535.
    #[arg(long, env = "WAITROOM_LISTEN_BACKLOG", default_value_t = DEFAULT_LISTEN_BACKLOG)]
    pub listen_backlog: u32,

    /// Redis URL (redis://host:port/db). Unset: the embedded in-memory store
    /// (one process only). With --redis-cluster: comma-separated seed nodes
    /// of the cluster (redis://host:port,redis://host:port,...). A master
    /// with replicas behind Redis Sentinel:
    /// `redis+sentinel://[[user]:password@]host:port,host:port,.../master-name[/db]`
    /// (the sentinels, default port 26379; the credentials and db are the
    /// Redis nodes').
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// --redis-url names the seed nodes of a Redis Cluster: commands follow
    /// slot moves and failovers, events use sharded pub/sub (Redis 7+).
    /// Needs the `redis-cluster` cargo feature (a default one).
    #[arg(long, env = "WAITROOM_REDIS_CLUSTER")]
    pub redis_cluster: bool,

    /// Replicas that must acknowledge a join, an admission pass, a claim
    /// and its consume (Redis `WAIT`) before it is answered or published,
    /// so a master that dies right after cannot take them along. Behind
    /// Sentinel, set it to the
    /// number of replicas: Sentinel may promote any of them, and a write
    /// fewer acknowledged can be lost (a warning at start says so). 0: no
    /// wait (asynchronous replication, as Redis does by default).
    #[arg(long, env = "WAITROOM_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,

    /// Group commit of joins (Redis only): how long, in microseconds, an
    /// instance waits after a group's first join for more joins to send in
    /// the same script call, while other groups of the queue are in flight
    /// (with none in flight a group is sent at once). 0: only the joins
    /// already waiting are taken. At most 2000. Each join keeps its own
    /// answer and its place in order.
    #[arg(long, env = "WAITROOM_JOIN_BATCH_WINDOW_US", default_value_t = crate::store::redis::DEFAULT_JOIN_BATCH_WINDOW_US)]
    pub join_batch_window_us: u64,

    /// Group commit of joins (Redis only): the most joins of one queue in
    /// one script call; 1 turns grouping off (one call per join). 1-1000.
    #[arg(long, env = "WAITROOM_JOIN_BATCH_MAX", default_value_t = crate::store::redis::DEFAULT_JOIN_BATCH_MAX)]
    pub join_batch_max: usize,

    /// Group commit of joins (Redis only): the most groups of one queue in
    /// flight at once, pipelined on the connection in order. 1-64.
    #[arg(long, env = "WAITROOM_JOIN_BATCH_DEPTH", default_value_t = crate::store::redis::DEFAULT_JOIN_BATCH_DEPTH)]
    pub join_batch_depth: usize,

    /// Prefix of every Redis key, so several deployments can share a Redis.
    #[arg(long, env = "WAITROOM_KEY_PREFIX", default_value = "waitroom")]
    pub key_prefix: String,

    /// Queue names (comma-separated), each `[a-z0-9_-]{1,64}`. Seeded in
    /// the store with the admission flags below (and the file's
    /// `[queues.<name>]` overrides) when the store does not know them; from
    /// then on their settings are changed live through the admin API, and
    /// more queues can be opened there.
    #[arg(
        long,
        env = "WAITROOM_QUEUES",
        default_value = "default",
        value_delimiter = ','
    )]
    pub queues: Vec<String>,

    /// Milliseconds between admission passes.
    #[arg(long, env = "WAITROOM_ADMISSION_INTERVAL_MS", default_value_t = 1000)]
    pub admission_interval_ms: u64,

    /// Users admitted per interval, across all instances together.
    #[arg(long, env = "WAITROOM_ADMISSION_BATCH", default_value_t = 50)]
    pub admission_batch: u32,

    /// Seconds an entry token stays valid.
    #[arg(long, env = "WAITROOM_TOKEN_TTL_SECS", default_value_t = 300)]
    pub token_ttl_secs: u64,

    /// Most users holding a token at once, per queue. Unset: unlimited.
    #[arg(long, env = "WAITROOM_MAX_ACTIVE")]
    pub max_active: Option<u64>,

    /// Drop waiting users with no open stream and no poll for this many
    /// seconds. 0: never drop.
    #[arg(long, env = "WAITROOM_ABANDON_AFTER_SECS", default_value_t = 120)]
    pub abandon_after_secs: u64,

    /// Secret (at least 16 bytes) signing queue tickets. Unset: with Redis,
    /// one secret shared by all instances through Redis; in memory, random.
    #[arg(long, env = "WAITROOM_TICKET_SECRET", hide_env_values = true)]
    pub ticket_secret: Option<String>,

    /// Seconds a queue ticket is accepted after it was issued (and the
    /// ticket cookie's Max-Age). A repeat join issues a fresh one; a ticket
    /// also ends with its place in line, whichever comes first.
    #[arg(long, env = "WAITROOM_TICKET_TTL_SECS", default_value_t = 86_400)]
    pub ticket_ttl_secs: u64,

    /// Admission follows the order service (seeds the queues' `adaptive`
    /// settings, on): the rate rises by a step per healthy window and is
    /// cut by a factor when the p95 claim-to-commit time is over the target
    /// or too many orders roll back, between --adaptive-floor and
    /// --adaptive-ceiling (admissions per second).
    #[arg(long, env = "WAITROOM_ADAPTIVE")]
    pub adaptive: bool,

    /// Lowest admission rate adaptive admission cuts to, per second.
    #[arg(long, env = "WAITROOM_ADAPTIVE_FLOOR", default_value_t = 1.0)]
    pub adaptive_floor: f64,

    /// Highest admission rate adaptive admission climbs to, per second.
    #[arg(long, env = "WAITROOM_ADAPTIVE_CEILING", default_value_t = 100.0)]
    pub adaptive_ceiling: f64,

    /// The p95 claim-to-commit time adaptive admission keeps under, ms.
    #[arg(long, env = "WAITROOM_ADAPTIVE_TARGET_P95_MS", default_value_t = 1000)]
    pub adaptive_target_p95_ms: u64,

    /// One window of adaptive admission (one decision each), ms.
    #[arg(long, env = "WAITROOM_ADAPTIVE_WINDOW_MS", default_value_t = 5000)]
    pub adaptive_window_ms: u64,

    /// Seconds a claimed token stays claimed if the order service never
    /// commits nor releases it.
    #[arg(long, env = "WAITROOM_CLAIM_LEASE_SECS", default_value_t = 30)]
    pub claim_lease_secs: u64,

    /// Most open event streams on this instance. Unset: from the open-file
    /// limit, with headroom for other sockets and files.
    #[arg(long, env = "WAITROOM_MAX_STREAMS")]
    pub max_streams: Option<usize>,

    /// Most open connections on this instance, event streams included; a
    /// connection over the cap gets `503 server_busy` (with `Retry-After`)
    /// and is closed. Unset: from the open-file limit, above --max-streams.
    #[arg(long, env = "WAITROOM_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Most open connections from one client address (IPv6: one /64) on
    /// each listener, so one address cannot take every connection (idle
    /// sockets included); one over it is answered `429
    /// address_connections_limited` (with `Retry-After`) and closed. The
    /// socket's peer is what is counted, so connections from
    /// --trusted-proxies are not (a proxy holds them for all its clients:
    /// cap those at the proxy). Unset: half of --max-connections, at most
    /// 4096. The operator listener takes at most 32 (half its ordinary
    /// slots) from one address. 0: off.
    #[arg(long, env = "WAITROOM_CONNECTIONS_PER_ADDRESS")]
    pub connections_per_address: Option<usize>,

    /// Seconds a new connection has to send its first byte: one that sends
    /// nothing is closed unanswered, so sockets that connect and never
    /// speak hold a connection no longer than this (or
    /// --idle-timeout-secs when that is shorter). 1-60.
    #[arg(long, env = "WAITROOM_FIRST_BYTE_TIMEOUT_SECS", default_value_t = 5)]
    pub first_byte_timeout_secs: u64,

    /// Connections the operator listener keeps beyond its 64 for requests
    /// that carry the admin or the service token: a connection over the 64
    /// is served only if its requests carry one (any other request is
    /// answered `503 server_busy` and the connection closed), so idle or
    /// unauthenticated sockets cannot lock operators and order services
    /// out. 0: none (over the 64, `503`). 0-1024.
    #[arg(
        long,
        env = "WAITROOM_ADMIN_RESERVED_CONNECTIONS",
        default_value_t = 16
    )]
    pub admin_reserved_connections: usize,

    /// Host names the operator listener answers besides `localhost` and IP
    /// literals (comma-separated; the names Prometheus or operators use to
    /// reach it): a request with any other `Host` gets `421
    /// misdirected_request`, so a web page whose DNS name was rebound to
    /// this address cannot read the operator listener through an
    /// operator's browser.
    #[arg(long, env = "WAITROOM_ADMIN_HOSTS", value_delimiter = ',')]
    pub admin_hosts: Vec<String>,

    /// Seconds a client has to send a whole request body once its head has
    /// arrived; slower ones get `408 request_timeout`. Must be shorter than
    /// --claim-lease-secs. Unset: 10, or half the claim lease if shorter.
    #[arg(long, env = "WAITROOM_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<u64>,

    /// Seconds over which open streams are closed on shutdown, so clients
    /// do not all reconnect at once.
    #[arg(long, env = "WAITROOM_DRAIN_SECS", default_value_t = 5)]
    pub drain_secs: u64,

    /// Longest silence on an idle event stream, in seconds: its keep-alive
    /// comment comes at a random moment in the second half of this period
    /// after its last frame (so streams one pass wrote do not all send
    /// theirs together).
    #[arg(long, env = "WAITROOM_KEEP_ALIVE_SECS", default_value_t = 15)]
    pub keep_alive_secs: u64,

    /// Bearer token of the admin API (never accepted by the token API).
    /// Unset: random, printed once on stderr at start.
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Bearer token order services in other languages use for the token
    /// API (claim / consume / release); give every instance the same one.
    /// Unset: the token API is off (its routes answer `404
    /// token_api_disabled`). Never the admin token.
    #[arg(long, env = "WAITROOM_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<String>,

    /// The demo order service: `on` serves /api/orders and /api/products,
    /// `off` where the real order service lives elsewhere.
    #[arg(long, env = "WAITROOM_ORDERS", value_enum, default_value_t = OrdersMode::DEFAULT)]
    pub orders: OrdersMode,

    /// The demo order service's database: a SQLite file (created and
    /// seeded on first start; `:memory:` for none), or a `postgres://` URL
    /// that every instance shares.
    #[arg(long, env = "WAITROOM_ORDERS_DB", default_value = "waitroom-orders.db")]
    pub orders_db: String,

    /// Where a READY buyer is sent to buy when the order service lives
    /// elsewhere (`--orders off`): an absolute https:// URL whose `{token}`
    /// and `{queue}` the page fills in, URL-encoded. Put the token in the
    /// fragment (`https://shop.example/buy#token={token}`): browsers send a
    /// fragment to no server and in no `Referer`. A queue's `shopUrl`
    /// setting overrides it.
    #[arg(long, env = "WAITROOM_SHOP_URL")]
    pub shop_url: Option<String>,

    /// Links every queue to the demo order service's stock: the units its
    /// products have left (and their largest `maxPerOrder`) are reported
    /// at start, after every order and after every restock, so admission
    /// admits no more buyers than can still buy and a sold-out line is
    /// told so at once. Off: only what an operator or an order service
    /// reports (`PUT /api/admin/queues/{queue}/stock`, `POST
    /// /api/tokens/stock`) links a queue.
    #[arg(long, env = "WAITROOM_STOCK_FROM_ORDERS", default_value_t = false)]
    pub stock_from_orders: bool,

    /// Who a request is for: `visitor` (a signed cookie waitroom mints;
    /// `X-User-Id` ignored), `header` (`X-User-Id` from a trusted gateway
    /// that strips client-sent values) or `signed` (a JWT from the site's
    /// login).
    #[arg(long, env = "WAITROOM_IDENTITY", value_enum, default_value_t = IdentityMode::Visitor)]
    pub identity: IdentityMode,

    /// Signed mode, HS256: the shared secret (at least 32 bytes).
    #[arg(long, env = "WAITROOM_IDENTITY_SECRET", hide_env_values = true)]
    pub identity_secret: Option<String>,

    /// Signed mode, RS256 or EdDSA: the PEM file of the public key.
    #[arg(long, env = "WAITROOM_IDENTITY_PUBLIC_KEY")]
    pub identity_public_key: Option<PathBuf>,

    /// Signed mode: the `iss` a token must carry.
    #[arg(long, env = "WAITROOM_IDENTITY_ISSUER")]
    pub identity_issuer: Option<String>,

    /// Signed mode: the `aud` a token must carry.
    #[arg(long, env = "WAITROOM_IDENTITY_AUDIENCE")]
    pub identity_audience: Option<String>,

    /// Signed mode: a cookie to read the token from when no
    /// `Authorization: Bearer` header carries one.
    #[arg(long, env = "WAITROOM_IDENTITY_COOKIE")]
    pub identity_cookie: Option<String>,

    /// Signed mode: the longest life a token may have, `exp - iat`, in
    /// seconds (1-31536000); a longer one is refused, and so is one
    /// without `iat`. Unset: no maximum (`iat`, when present, must still
    /// not be in the future).
    #[arg(long, env = "WAITROOM_IDENTITY_MAX_LIFETIME_SECS")]
    pub identity_max_lifetime_secs: Option<u64>,

    /// Seconds an idle keep-alive connection stays open. Keep it longer
    /// than the keep-alive of whatever stands in front (nginx `keepalive_timeout`
    /// upstream and AWS ALB idle timeout: 60 s), so the proxy always closes
    /// first and never reuses a connection this side is closing.
    #[arg(long, env = "WAITROOM_IDLE_TIMEOUT_SECS", default_value_t = 75)]
    pub idle_timeout_secs: u64,

    /// The path prefix the service is reached under (`/shop`), forwarded
    /// unchanged by the proxy; empty: the root. Routes, cookie paths and
    /// the API document's server follow it.
    #[arg(long, env = "WAITROOM_BASE_PATH", default_value = "")]
    pub base_path: String,

    /// Origins (`https://shop.example`) besides the request's own `Host`
    /// whose pages may call the buyer endpoints with the browser's
    /// credentials (comma-separated). Behind a proxy that rewrites `Host`,
    /// name the public origin here.
    #[arg(long, env = "WAITROOM_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Also accept the queue ticket as `?ticket=` (off by default: a query
    /// string lands in every proxy's access log, and with it the ticket).
    #[arg(long, env = "WAITROOM_TICKET_IN_QUERY", default_value_t = false)]
    pub ticket_in_query: bool,
    /// Proxies (comma-separated CIDRs or addresses) whose forwarding header
    /// names the client: the client is the rightmost hop that is not one of
    /// them. Unset: none, the socket's peer is the client and forwarding
    /// headers are ignored.
    #[arg(long, env = "WAITROOM_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<String>,

    /// The forwarding header the trusted proxies set (only that one is
    /// read): `x-forwarded-for` (with `X-Forwarded-Proto`) or `forwarded`
    /// (RFC 7239, `for=` and `proto=`).
    #[arg(long, env = "WAITROOM_CLIENT_ADDRESS_HEADER", value_enum, default_value_t = ForwardedHeader::XForwardedFor)]
    pub client_address_header: ForwardedHeader,

    /// `Secure` on the cookies: `auto` when a trusted proxy says the client
    /// spoke HTTPS, `always`, or `never`. Secure cookies are named
    /// `__Host-waitroom_visitor` and `__Secure-waitroom_ticket`.
    #[arg(long, env = "WAITROOM_COOKIE_SECURE", value_enum, default_value_t = CookieSecure::Auto)]
    pub cookie_secure: CookieSecure,

    /// New places per client address (IPv6: per /64) per queue and minute,
    /// all instances together: that many at once, then evenly over the
    /// minute. A repeat join is never counted here. 0: off.
    #[arg(
        long,
        env = "WAITROOM_JOINS_PER_ADDRESS_PER_MINUTE",
        default_value_t = 600
    )]
    pub joins_per_address_per_minute: u32,

    /// Places one client address (IPv6: one /64) may hold at once per
    /// queue, waiting or READY, all instances together. 0: off.
    #[arg(long, env = "WAITROOM_PLACES_PER_ADDRESS", default_value_t = 2000)]
    pub places_per_address: u32,

    /// New visitor ids minted per client address (IPv6: per /64) per
    /// minute (visitor mode), all instances together. 0: off.
    #[arg(
        long,
        env = "WAITROOM_VISITORS_PER_ADDRESS_PER_MINUTE",
        default_value_t = 600
    )]
    pub visitors_per_address_per_minute: u32,

    /// Most open event streams per client address (IPv6: per /64) on this
    /// instance; over it a stream is shed to polling. At --max-streams the
    /// heaviest address is shed first. 0: off (the heaviest is still shed
    /// first).
    #[arg(long, env = "WAITROOM_STREAMS_PER_ADDRESS", default_value_t = 1000)]
    pub streams_per_address: u32,

    /// Proof of work at the door: `off` (joins need no challenge), `always`
    /// (every join sends a solved ALTCHA challenge) or `auto` (only while a
    /// queue's joins per second exceed --join-challenge-threshold).
    #[arg(long, env = "WAITROOM_JOIN_CHALLENGE", value_enum, default_value_t = JoinChallenge::Off)]
    pub join_challenge: JoinChallenge,

    /// Challenge difficulty: the ALTCHA `maxnumber` (1000-1000000). A
    /// client hashes about half of it on average per join.
    #[arg(
        long,
        env = "WAITROOM_JOIN_CHALLENGE_DIFFICULTY",
        default_value_t = 100_000
    )]
    pub join_challenge_difficulty: u64,

    /// Seconds a challenge may be solved and used in.
    #[arg(long, env = "WAITROOM_JOIN_CHALLENGE_TTL_SECS", default_value_t = 300)]
    pub join_challenge_ttl_secs: u64,

    /// `auto`: joins per second on one queue (all instances together) above
    /// which joins need a challenge.
    #[arg(long, env = "WAITROOM_JOIN_CHALLENGE_THRESHOLD", default_value_t = 200)]
    pub join_challenge_threshold: u64,

    /// `auto`: seconds the challenge stays on after the rate was last over
    /// the threshold.
    #[arg(long, env = "WAITROOM_JOIN_CHALLENGE_HOLD_SECS", default_value_t = 60)]
    pub join_challenge_hold_secs: u64,

    /// The site to put waitroom in front of (`http://127.0.0.1:3000`, or
    /// `https://…` with the `https-webhooks` cargo feature):
    /// the public listener then proxies every path but waitroom's own
    /// (below `--base-path`, `/_waitroom` unless set) to it, for visitors
    /// holding a pass of the first queue of `--queues`, and shows everyone
    /// else the waiting page at the URL they asked for. Several sites or
    /// rooms: `[[rooms]]` in the configuration file.
    #[arg(long, env = "WAITROOM_ORIGIN")]
    pub origin: Option<String>,

    /// Send `--origin` the visitor's own `Host` rather than the origin's
    /// `host:port` (for a site that answers by name).
    #[arg(long, env = "WAITROOM_ORIGIN_PRESERVE_HOST", default_value_t = false)]
    pub origin_preserve_host: bool,

    /// Seconds the built-in proxy waits for an origin's response head
    /// (`504 origin_timeout` after); the body then streams as long as it
    /// takes.
    #[arg(long, env = "WAITROOM_ORIGIN_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub origin_timeout_secs: u64,

    /// Milliseconds the built-in proxy waits for a connection to an
    /// origin (`502 origin_unreachable` after).
    #[arg(long, env = "WAITROOM_ORIGIN_CONNECT_TIMEOUT_MS", default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub origin_connect_timeout_ms: u64,

    /// A PEM file of CA certificates trusted for `https://` origins (an
    /// origin behind a private CA), on top of the built-in Mozilla roots.
    /// Needs the `https-webhooks` cargo feature (the TLS crates).
    #[arg(long, env = "WAITROOM_ORIGIN_CA")]
    pub origin_ca: Option<PathBuf>,

    /// Rooms of the built-in proxy: the file's `[[rooms]]` tables (no
    /// flag), each checked when the file is loaded.
    #[arg(skip)]
    pub rooms: Vec<crate::front::RoomSpec>,

    /// A directory whose files override the embedded page's (same paths:
    /// `styles.css`, `i18n/ko.json`, a logo), read as they are asked for,
    /// and whose `queues/<queue>.json` brand a queue's page (name, logo,
    /// colours, texts per language; checked at start-up).
    #[arg(long, env = "WAITROOM_PAGE_DIR")]
    pub page_dir: Option<PathBuf>,

    /// Pre-queue entries a lottery draw stages per store call: each call
    /// holds Redis (or the memory store's queue) for one chunk only.
    #[arg(long, env = "WAITROOM_LOTTERY_DRAW_CHUNK", default_value_t = crate::store::DRAW_CHUNK as u64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub lottery_draw_chunk: u64,

    /// Records kept in each queue's audit log (about: Redis trims whole
    /// stream nodes), the oldest dropped first: an entry is a record, but
    /// Redis keeps an admission pass's buyers as one (each buyer's entry id
    /// and user id in one text). 0: no audit log, and no webhooks.
    #[arg(long, env = "WAITROOM_AUDIT_MAX_LEN", default_value_t = crate::queue::audit::DEFAULT_AUDIT_MAX_LEN)]
    pub audit_max_len: u64,

    /// The admission pass's signing key: a PEM file holding an Ed25519
    /// private key (`openssl genpkey -algorithm ed25519`). Give every
    /// instance the same one. Unset: a key generated at start, good for
    /// this process only (warned at start; every pass is refused after a
    /// restart and by any other instance).
    #[arg(long, env = "WAITROOM_PASS_KEY")]
    pub pass_key: Option<PathBuf>,

    /// Earlier pass keys (PEM files, private or public, comma-separated),
    /// still accepted for the passes they signed before this start, until
    /// those have expired (the longest session: --session-max-secs, or a
    /// queue's own if longer); listed in
    /// `/.well-known/jwks.json` as long.
    #[arg(long, env = "WAITROOM_PASS_PREVIOUS_KEYS", value_delimiter = ',')]
    pub pass_previous_keys: Vec<PathBuf>,

    /// The pass cookie's name.
    #[arg(long, env = "WAITROOM_PASS_COOKIE", default_value = crate::pass::request::DEFAULT_PASS_COOKIE)]
    pub pass_cookie: String,

    /// The pass cookie's `Domain` (the protected site's domain, when
    /// waitroom runs on a sibling host). Unset: the host that set it.
    #[arg(long, env = "WAITROOM_PASS_COOKIE_DOMAIN")]
    pub pass_cookie_domain: Option<String>,

    /// The pass cookie's `Path`.
    #[arg(long, env = "WAITROOM_PASS_COOKIE_PATH", default_value = "/")]
    pub pass_cookie_path: String,

    /// Seconds a protected site's session lasts without activity: then it
    /// ends, its pass is refused and its slot (under the queue's
    /// `maxActive`) goes to the next in line. 1-86400. A room
    /// (`[[rooms]]`) or a queue (`[queues.<name>]`) may set its own.
    #[arg(long, env = "WAITROOM_SESSION_IDLE_SECS", default_value_t = 300)]
    pub session_idle_secs: u64,

    /// The longest a session lasts, however active: the pass's `exp`.
    /// At least --session-idle-secs, at most 86400. A room or a queue
    /// may set its own.
    #[arg(long, env = "WAITROOM_SESSION_MAX_SECS", default_value_t = 3600)]
    pub session_max_secs: u64,

    /// Origins of the protected sites (`https://shop.example`,
    /// comma-separated): a return URL after the waiting room may point
    /// there (any other site is refused: no open redirect), and the
    /// gateway check sends a visitor back to the URL they asked for only
    /// on one of them.
    #[arg(long, env = "WAITROOM_PROTECTED_ORIGINS", value_delimiter = ',')]
    pub protected_origins: Vec<String>,

    /// Where the gateway check sends a visitor without a pass: the
    /// waiting page's URL (`https://shop.example/waitroom/`), to which
    /// `?queue=…&return=…` is added. Unset: `--base-path` + `/` on the
    /// gateway's own host.
    #[arg(long, env = "WAITROOM_PASS_PAGE_URL")]
    pub pass_page_url: Option<String>,

    /// The public admission log (docs/fairness.md): signed arrival
    /// receipts on joins, the log of admissions, fast tracks, abandonments
    /// and leaves built from the audit log, its signed heads and proofs on
    /// the public listener. Needs the audit log (--audit-max-len not 0).
    #[arg(long, env = "WAITROOM_FAIRNESS_LOG", default_value_t = false)]
    pub fairness_log: bool,

    /// Webhooks: the file's `[[webhooks]]` tables (no flag), each checked
    /// and its `ca` file read when the file is loaded.
    #[arg(skip)]
    pub webhooks: Vec<crate::webhook::WebhookSpec>,

    /// Per-queue overrides of the admission settings: the file's
    /// `[queues.<name>]` tables (no flag), applied when a queue is seeded.
    #[arg(skip)]
    pub queue_overrides: Vec<(QueueName, QueueOverrides)>,

    /// How long a webhook entry may sit unacknowledged with an instance
    /// that stopped holding it (it died) before another instance takes it
    /// over, ms (1000-3600000).
    #[arg(long, env = "WAITROOM_WEBHOOK_CLAIM_MS", default_value_t = 60_000)]
    pub webhook_claim_ms: u64,
}

pub use crate::challenge::auto::Mode as JoinChallenge;

pub use crate::identity::Mode as IdentityMode;

pub use crate::http::client::ForwardedHeader;

pub use crate::http::cookies::CookieSecure;

/// Where the operator listener goes when `--admin-addr` is unset.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);

/// The listen backlog of `--addr` when `--listen-backlog` is unset: the
/// default cap of Linux since 5.4, where std's and tokio's 128 would drop
/// the connects of a sale's first millisecond.
pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;

/// The per-address connection cap's ceiling when `--connections-per-address`
/// is unset: room for a large crowd behind one NAT address (above
/// `--streams-per-address`'s default, so an address at its stream cap can
/// still poll), while one address still never holds the instance.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 4096;

/// Whether the demo order service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OrdersMode {
    On,
    Off,
}

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl Config {
    /// `args` as on the command line (without the program name) over the
    /// defaults. Unlike [`Parser::parse`], the environment is not read, so a
    /// `WAITROOM_*` variable in the shell cannot change what a test or an
    /// embedding program asked for. Validation is [`Config::validate`], as
    /// for any other `Config`.
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let command = Self::command().mut_args(|arg| arg.env(None::<&str>));
        let program = std::iter::once(std::ffi::OsString::from("waitroom"));
        let matches =
            command.try_get_matches_from(program.chain(args.into_iter().map(Into::into)))?;
        Self::from_arg_matches(&matches)
    }
}

/// Every flag at its documented default, the environment not read. Set
/// fields on it directly (they are public) and let [`Config::validate`]
/// (which the application state runs) check the result:
/// `Config { admission_batch: 2, ..Config::default() }`.
impl Default for Config {
    fn default() -> Self {
        Self::from_args(std::iter::empty::<&str>()).expect("the defaults are valid arguments")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.addr.to_string(), "127.0.0.1:8080");
        let p = c.policy();
        assert_eq!(
            (p.batch, p.interval_ms, p.token_ttl_ms),
            (50, 1000, 300_000)
        );
        assert_eq!(p.max_active, None);
        assert_eq!(p.abandon_after_ms, Some(120_000));
        assert_eq!(c.ticket_ttl_secs, 86_400);
        assert_eq!(c.queue_names().unwrap()[0].as_str(), "default");
        assert_eq!(c.body_timeout(), Duration::from_secs(10));
        assert!(c.trusted_proxies.is_empty(), "no proxy trusted by default");
        assert_eq!(c.cookie_secure, CookieSecure::Auto);
        assert_eq!(c.client_address_header, ForwardedHeader::XForwardedFor);
        assert_eq!(
            c.idle_timeout(),
            Duration::from_secs(75),
            "longer than 60 s proxies"
        );
        assert!(!c.ticket_in_query, "tickets stay out of access logs");
        assert_eq!(c.first_byte_timeout(), Duration::from_secs(5));
        assert_eq!(c.connections_per_address(40), Some(20), "half the cap");
        assert_eq!(c.connections_per_address(1), Some(1));
        assert_eq!(c.connections_per_address(1 << 20), Some(4096));
        let off = Config::from_args(["--connections-per-address", "0"]).unwrap();
        assert_eq!(off.connections_per_address(40), None);
        assert_eq!(c.admin_reserved_connections, 16);
        assert!(
            c.admin_hosts.is_empty(),
            "loopback names and IP literals only"
        );
        assert_eq!(
            c.identity,
            IdentityMode::Visitor,
            "anonymous visitors by default"
        );
        let short = Config::parse_from(["waitroom", "--claim-lease-secs", "1"]);
        assert!(
            short.body_timeout() < Duration::from_secs(1),
            "below the lease"
        );
    }

    #[test]
    fn adaptive_flags_whose_floor_never_decides_are_refused() {
        // 1/s over 100-ms windows: 0.8 orders in the longest evidence, far
        // from the 10 a decision needs.
        let trap = Config::from_args([
            "--adaptive",
            "--adaptive-window-ms",
            "100",
            "--admission-interval-ms",
            "1000",
        ]);
        let message = trap.unwrap().validate().unwrap_err().to_string();
        assert!(message.contains("adaptive.minSamples"), "{message}");
        let fine = Config::from_args(["--adaptive", "--admission-interval-ms", "1000"]);
        fine.unwrap().validate().unwrap();
    }

    #[test]
    fn joins_are_grouped_unless_the_group_is_one() {
        let on = Config::default().join_batch().expect("grouped by default");
        assert!(on.window <= Duration::from_millis(2) && on.max > 1);
        let off = Config::from_args(["--join-batch-max", "1"]).unwrap();
        assert_eq!(off.join_batch(), None);
        let wide = Config::from_args(["--join-batch-window-us", "2000", "--join-batch-max", "8"]);
        let wide = wide.unwrap().join_batch().unwrap();
        assert_eq!((wide.window, wide.max), (Duration::from_millis(2), 8));
        assert_eq!(on.depth, 1, "one group of a queue in flight by default");
        let deep = Config::from_args(["--join-batch-depth", "4"]).unwrap();
        assert_eq!(deep.join_batch().unwrap().depth, 4);
    }

    #[test]
    fn typed_configs_are_checked_like_flags() {
        let two = Config {
            admission_batch: 2,
            ..Config::default()
        };
        assert_eq!(two.policy().batch, 2);
        two.validate().unwrap();
        let zero = Config {
            admission_batch: 0,
            ..Config::default()
        };
        assert!(zero.validate().is_err(), "the rule of --admission-batch");
        let parsed = Config::from_args(["--admission-batch", "2"]).unwrap();
        assert_eq!(parsed.admission_batch, 2);
        assert!(Config::from_args(["--no-such-flag"]).is_err());
    }

    #[test]
    fn refuses_bad_values() {
        let parse = |args: &[&str]| {
            let mut v = vec!["waitroom"];
            v.extend_from_slice(args);
            Config::try_parse_from(v).map(|c| c.validate())
        };
        assert!(parse(&["--queues", "ok,Bad"]).unwrap().is_err());
        assert!(parse(&["--join-batch-window-us", "2001"]).unwrap().is_err());
        assert!(parse(&["--join-batch-max", "0"]).unwrap().is_err());
        assert!(parse(&["--join-batch-max", "1001"]).unwrap().is_err());
        assert!(parse(&["--join-batch-depth", "0"]).unwrap().is_err());
        assert!(parse(&["--join-batch-depth", "65"]).unwrap().is_err());
        assert!(parse(&["--lottery-draw-chunk", "0"]).is_err());
        assert!(parse(&["--lottery-draw-chunk", "100001"]).is_err());
        assert!(parse(&["--lottery-draw-chunk", "-5"]).is_err());
        assert!(parse(&["--lottery-draw-chunk", "100000"]).unwrap().is_ok());
        assert!(parse(&["--admission-batch", "0"]).unwrap().is_err());
        assert!(parse(&["--ticket-secret", "short"]).unwrap().is_err());
        assert!(parse(&["--admission-interval-ms", "-1"]).is_err());
        assert!(parse(&["--abandon-after-secs", "0"]).unwrap().is_ok());
        assert!(parse(&["--max-connections", "0"]).unwrap().is_err());
        assert!(
            parse(&["--max-streams", "10", "--max-connections", "9"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--max-streams", "10", "--max-connections", "10"])
                .unwrap()
                .is_ok()
        );
        assert!(parse(&["--body-timeout-secs", "0"]).unwrap().is_err());
        assert!(
            parse(&["--body-timeout-secs", "30"]).unwrap().is_err(),
            "not shorter than the 30 s lease"
        );
        assert!(
            parse(&["--body-timeout-secs", "5", "--claim-lease-secs", "5"])
                .unwrap()
                .is_err()
        );
        assert!(parse(&["--body-timeout-secs", "29"]).unwrap().is_ok());
        assert!(parse(&["--ticket-ttl-secs", "0"]).unwrap().is_err());
        assert!(parse(&["--ticket-ttl-secs", "2592001"]).unwrap().is_err());
        assert!(parse(&["--ticket-ttl-secs", "2"]).unwrap().is_ok());
        assert!(parse(&["--identity", "signed"]).unwrap().is_err(), "no key");
        let secret = "s".repeat(32);
        // Valid, and refused only by a build without signed mode.
        assert_eq!(
            parse(&["--identity", "signed", "--identity-secret", &secret])
                .unwrap()
                .is_ok(),
            cfg!(feature = "signed-identity")
        );
        assert!(
            parse(&["--identity", "signed", "--identity-secret", "short"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--identity-secret", &secret]).unwrap().is_err(),
            "a secret without signed mode"
        );
        assert!(
            parse(&["--identity", "header", "--identity-issuer", "x"])
                .unwrap()
                .is_err()
        );
        assert!(parse(&["--identity", "nobody"]).is_err());
        let same = "same-token-for-both-scopes";
        assert!(
            parse(&["--admin-token", same, "--service-token", same])
                .unwrap()
                .is_err(),
            "one token for both scopes"
        );
        assert!(
            parse(&["--addr", "127.0.0.1:7000", "--admin-addr", "127.0.0.1:7000"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
                .unwrap()
                .is_ok()
        );
        assert!(parse(&["--first-byte-timeout-secs", "0"]).unwrap().is_err());
        assert!(
            parse(&["--first-byte-timeout-secs", "61"])
                .unwrap()
                .is_err()
        );
        assert!(parse(&["--first-byte-timeout-secs", "60"]).unwrap().is_ok());
        assert!(parse(&["--connections-per-address", "-1"]).is_err());
        assert!(parse(&["--connections-per-address", "0"]).unwrap().is_ok());
        assert!(
            parse(&["--connections-per-address", "11", "--max-connections", "10"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--connections-per-address", "10", "--max-connections", "10"])
                .unwrap()
                .is_ok()
        );
        assert!(
            parse(&["--admin-reserved-connections", "0"])
                .unwrap()
                .is_ok()
        );
        assert!(
            parse(&["--admin-reserved-connections", "1025"])
                .unwrap()
                .is_err()
        );
        for good in [
            "ops.internal",
            "Waitroom-0.Example.COM.",
            "a,b.c,",
            "10.0.0.1",
        ] {
            assert!(parse(&["--admin-hosts", good]).unwrap().is_ok(), "{good}");
        }
        for bad in [
            "ops.internal:9090",
            "https://ops.internal",
            "ops.internal/metrics",
            "a..b",
            "a-.b",
            "[::1]",
            "*.example",
            ".",
        ] {
            let refused = parse(&["--admin-hosts", bad]).unwrap().unwrap_err();
            assert!(
                refused.to_string().contains("--admin-hosts"),
                "{bad}: {refused}"
            );
        }
        assert!(
            parse(&["--identity-max-lifetime-secs", "3600"])
                .unwrap()
                .is_err(),
            "needs signed mode"
        );
        for (lifetime, ok) in [("0", false), ("31536001", false), ("3600", true)] {
            assert_eq!(
                parse(&[
                    "--identity",
                    "signed",
                    "--identity-secret",
                    &secret,
                    "--identity-max-lifetime-secs",
                    lifetime
                ])
                .unwrap()
                .is_ok(),
                ok && cfg!(feature = "signed-identity"),
                "{lifetime}"
            );
        }
        assert!(parse(&["--idle-timeout-secs", "0"]).unwrap().is_err());
        assert!(parse(&["--idle-timeout-secs", "1"]).unwrap().is_ok());
        for good in ["", "/shop", "/a/b-c_d.e~"] {
            assert!(parse(&["--base-path", good]).unwrap().is_ok(), "{good}");
        }
        for bad in [
            "shop", "/shop/", "/", "/a//b", "/a/../b", "/a b", "/a;b", "/%2e",
        ] {
            assert!(parse(&["--base-path", bad]).unwrap().is_err(), "{bad}");
        }
        assert!(
            parse(&[
                "--allowed-origins",
                "https://shop.example,http://localhost:3000"
            ])
            .unwrap()
            .is_ok()
        );
        for bad in [
            "shop.example",
            "https://shop.example/",
            "ftp://x",
            "https://",
        ] {
            assert!(
                parse(&["--allowed-origins", bad]).unwrap().is_err(),
                "{bad}"
            );
        }
        assert!(
            parse(&["--trusted-proxies", "10.0.0.0/8,192.0.2.1, 2001:db8::/32"])
                .unwrap()
                .is_ok()
        );
        assert!(
            parse(&["--trusted-proxies", "10.0.0.0/33"])
                .unwrap()
                .is_err()
        );
        assert!(parse(&["--trusted-proxies", "garbage"]).unwrap().is_err());
        assert!(parse(&["--trusted-proxies", "0.0.0.0/0"]).unwrap().is_err());
        assert!(parse(&["--trusted-proxies", "::/0"]).unwrap().is_err());
        assert!(parse(&["--cookie-secure", "sometimes"]).is_err());
        assert!(
            parse(&["--client-address-header", "forwarded"])
                .unwrap()
                .is_ok()
        );
        assert!(parse(&["--joins-per-address-per-minute", "-1"]).is_err());
        assert_eq!(Config::default().join_challenge, JoinChallenge::Off);
        assert!(parse(&["--join-challenge", "auto"]).unwrap().is_ok());
        assert!(parse(&["--join-challenge", "sometimes"]).is_err());
        assert!(
            parse(&["--join-challenge-difficulty", "999"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--join-challenge-difficulty", "1000001"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--join-challenge-difficulty", "1000"])
                .unwrap()
                .is_ok()
        );
        assert!(parse(&["--join-challenge-ttl-secs", "0"]).unwrap().is_err());
        assert!(
            parse(&["--join-challenge-threshold", "0"])
                .unwrap()
                .is_err()
        );
        assert!(
            parse(&["--join-challenge-hold-secs", "0"])
                .unwrap()
                .is_err()
        );
        let c = Config::try_parse_from(["waitroom", "--queues", "a, b,a"]).unwrap();
        assert_eq!(c.queue_names().unwrap().len(), 2);
    }
}
