//! The Redis backend: one multiplexed, self-reconnecting connection per locker, and Lua scripts
//! (the `.lua` files beside this one) sent by EVALSHA (reloaded on NOSCRIPT after a restart or `SCRIPT FLUSH`).

use std::{fmt, sync::OnceLock, time::Duration};

use redis::{
    Script,
    aio::{ConnectionManager, ConnectionManagerConfig},
};

use super::api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, EngineOption, Request, Token, WakeUp, Watch,
    lease_millis, option,
};
use notify::Notifier;

mod notify;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
#[cfg(test)]
pub(crate) mod test_server;
use crate::{
    LockError, LockInfo, LockKind,
    config::Settings,
    error::BackendError,
    holder::{self, Identity},
    url::{EngineUrl, query_params, tls_needs_feature},
};

/// What follows the key prefix in the names of the fencing counters (`dlock:__fence:{tag}`):
/// dlock's reserved namespace (`__word:`), which lock keys may not start with.
const FENCE_PREFIX: &str = "__fence:";
/// What follows the key prefix in the names of fair mode's queue keys.
const FAIR_PREFIX: &str = "__fair:";

/// `wait=N` (alias `DLOCK_REDIS_WAIT`): an acquisition counts only once `N` replicas
/// acknowledged it (`WAIT`); 0, the default, is off.
const WAIT: EngineOption = EngineOption {
    name: "wait",
    var: "DLOCK_REDIS_WAIT",
    example: "2",
    check: check_wait,
};

/// One Redis server: `redis://`, `rediss://`, `redis+unix://`, `unix://`.
pub(super) const SINGLE: Built = Built {
    check: check_single,
    build,
    options: &[WAIT],
};

/// A Redis Cluster: `redis+cluster://h1:p1,h2:p2`.
#[cfg(feature = "redis-cluster")]
pub(super) const CLUSTER: Built = Built {
    check: check_cluster,
    build,
    options: &[WAIT],
};

/// Redis with Sentinel failover: `redis+sentinel://s1:p1,s2:p2/<master>`.
#[cfg(feature = "redis-sentinel")]
pub(super) const SENTINEL: Built = Built {
    check: check_sentinel,
    build,
    options: &[WAIT],
};

fn check_wait(value: &str) -> Result<(), String> {
    value.parse::<u32>().map(drop).map_err(|_| {
        "expected how many replicas must acknowledge an acquisition, a whole number like `1` \
         (0 turns it off)"
            .to_owned()
    })
}

/// The `wait` option in the URL's query, and the TLS scheme's feature.
fn check_common(var: &str, url: &str) -> Result<(), LockError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    tls_needs_feature(var, scheme, scheme.starts_with("rediss"))?;
    if let Some((_, value)) = query_params(url).find(|(name, _)| *name == "wait") {
        check_wait(value).map_err(|why| LockError::config(format!("{var}: `wait`: {why}")))?;
    }
    Ok(())
}

fn check_single(var: &str, url: &str) -> Result<(), LockError> {
    check_common(var, url)?;
    redis::Client::open(url).map(drop).map_err(|_| {
        LockError::config(format!(
            "{var}: expected a URL like `redis://[user:password@]host:port[/db]`"
        ))
    })
}

#[cfg(feature = "redis-cluster")]
fn check_cluster(var: &str, url: &str) -> Result<(), LockError> {
    check_common(var, url)?;
    crate::url::HostList::parse(var, url, CLUSTER_FORM).map(drop)
}

#[cfg(feature = "redis-sentinel")]
fn check_sentinel(var: &str, url: &str) -> Result<(), LockError> {
    check_common(var, url)?;
    sentinel::check(var, url)
}

fn build(url: &EngineUrl, settings: &Settings) -> Result<std::sync::Arc<dyn Backend>, LockError> {
    Ok(std::sync::Arc::new(RedisBackend::from_url(url, settings)?))
}

#[cfg(feature = "redis-cluster")]
const CLUSTER_FORM: &str = "redis+cluster://[user:password@]h1:p1,h2:p2";

static ACQUIRE: OnceLock<Script> = OnceLock::new();
static ACQUIRE_FAIR: OnceLock<Script> = OnceLock::new();
static PASS: OnceLock<Script> = OnceLock::new();
/// release.lua as one server, a Sentinel's master and a Cluster send it (announcing with
/// `PUBLISH`, or `SPUBLISH`), and as RedLock's masters do (see [`release_script`]).
static RELEASE: [OnceLock<Script>; 3] = [const { OnceLock::new() }; 3];
static LEAVE: OnceLock<Script> = OnceLock::new();
static EXTEND: OnceLock<Script> = OnceLock::new();
static INSPECT: OnceLock<Script> = OnceLock::new();
static FORCE: OnceLock<Script> = OnceLock::new();
static ACQUIRE_SHARED: OnceLock<Script> = OnceLock::new();
static RELEASE_SHARED: OnceLock<Script> = OnceLock::new();
static EXTEND_SHARED: OnceLock<Script> = OnceLock::new();
static LAPSE_SHARED: OnceLock<Script> = OnceLock::new();

fn acquire_script() -> &'static Script {
    ACQUIRE.get_or_init(|| {
        Script::new(concat!(
            include_str!("acquire.lua"),
            include_str!("lock.lua"),
            include_str!("acquire_held.lua")
        ))
    })
}
fn acquire_queued_script() -> &'static Script {
    ACQUIRE_FAIR.get_or_init(|| {
        Script::new(concat!(
            include_str!("lock.lua"),
            include_str!("queue.lua"),
            include_str!("acquire_queued.lua")
        ))
    })
}
fn pass_script() -> &'static Script {
    PASS.get_or_init(|| Script::new(concat!(include_str!("lock.lua"), include_str!("pass.lua"))))
}
/// How a mutex's release announces itself: release.lua's `announce`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "redlock"),
    allow(dead_code, reason = "only RedLock's masters announce always or never")
)]
enum Announce {
    /// `0`: only when a place waits in the key's queue, on that place's channel (one server, a
    /// Sentinel's master, a Cluster).
    WhenWaited,
    /// `1`: every deletion, on the key's channel, for waiters that could not listen on the
    /// key's first master (RedLock's masters but that one; they keep no queue).
    Always,
    /// `-`: nothing; the reply says whether a place waits in the queue (RedLock's first master,
    /// whose places the releasing client wakes, and undoings, which wake nobody).
    Never,
}

/// The script (release.lua with the line before it that sets how it announces) and the number
/// of keys of a mutex's release announced as `announce` says, with `publish`. Every release of
/// one server, a Sentinel's master or a Cluster announces only when a place waits, with
/// `PUBLISH`, or `SPUBLISH` on a Cluster: written into the script rather than sent with every
/// release, two arguments fewer cost the server about 3.9k instructions less per release (82.6k
/// → 78.7k a cycle of acquire and release, counted under cachegrind). RedLock's releases and
/// undoings (its masters are single servers: `PUBLISH`) tell their way to announce by the
/// number of keys: the queue's name as a second key for `Never` (the key's first master, and
/// undoings), the lock key alone for `Always` (the other masters, whose release looks at no
/// queue). One script for both, so that every master has it loaded by whichever of its
/// releases, first-master releases and undoings came first (a script a master meets first
/// while it is stopped answers `NOSCRIPT` after the client gave up, and its release would never
/// run). With the `LINDEX` the other masters no longer run, this cut a master's cycle 87.6k →
/// 82.1k instructions (the first master's 88.3k → 85.3k; cachegrind).
fn release_script(announce: Announce, publish: &str) -> (&'static Script, usize) {
    let (slot, line, keys) = match (announce, publish) {
        (Announce::Always, _) => (0, REDLOCK_RELEASE, 1),
        (Announce::Never, _) => (0, REDLOCK_RELEASE, 2),
        (Announce::WhenWaited, "SPUBLISH") => (1, "local publish, announce = 'SPUBLISH', '0'", 2),
        (Announce::WhenWaited, _) => (2, "local publish, announce = 'PUBLISH', '0'", 2),
    };
    let script = RELEASE[slot]
        .get_or_init(|| Script::new(&format!("{line}\n{}", include_str!("release.lua"))));
    (script, keys)
}

/// RedLock's line before release.lua: `-` with the queue's name as a second key, `1` without.
const REDLOCK_RELEASE: &str = "local publish, announce = 'PUBLISH', #KEYS == 2 and '-' or '1'";
fn leave_script() -> &'static Script {
    LEAVE.get_or_init(|| {
        Script::new(concat!(
            include_str!("wake_head.lua"),
            include_str!("leave.lua")
        ))
    })
}
fn extend_script() -> &'static Script {
    EXTEND.get_or_init(|| Script::new(include_str!("extend.lua")))
}
fn inspect_script() -> &'static Script {
    INSPECT.get_or_init(|| {
        Script::new(concat!(
            include_str!("shared.lua"),
            include_str!("inspect.lua")
        ))
    })
}
fn force_script() -> &'static Script {
    FORCE.get_or_init(|| {
        Script::new(concat!(
            include_str!("lock.lua"),
            include_str!("shared.lua"),
            include_str!("wake_head.lua"),
            include_str!("force.lua")
        ))
    })
}
fn acquire_shared_script() -> &'static Script {
    ACQUIRE_SHARED.get_or_init(|| {
        Script::new(concat!(
            include_str!("lock.lua"),
            include_str!("shared.lua"),
            include_str!("acquire_shared.lua")
        ))
    })
}
fn release_shared_script() -> &'static Script {
    RELEASE_SHARED.get_or_init(|| {
        Script::new(concat!(
            include_str!("shared.lua"),
            include_str!("release_shared.lua")
        ))
    })
}
fn lapse_shared_script() -> &'static Script {
    LAPSE_SHARED.get_or_init(|| {
        Script::new(concat!(
            include_str!("shared.lua"),
            include_str!("lapse_shared.lua")
        ))
    })
}
fn extend_shared_script() -> &'static Script {
    EXTEND_SHARED.get_or_init(|| {
        Script::new(concat!(
            include_str!("shared.lua"),
            include_str!("extend_shared.lua")
        ))
    })
}

/// A lock's value: its acquisition's token, a space, and its holder's record with the time now
/// (the scripts add `fence=N`), written straight into the command.
fn lock_value<'a>(token: &'a Token, identity: &'a Identity) -> impl redis::ToRedisArgs + 'a {
    lock_value_since(token, identity, holder::Since::now())
}

/// [`lock_value`] stamped `since`: the same value on every master of a RedLock pass and in each
/// of its rounds.
fn lock_value_since<'a>(
    token: &'a Token,
    identity: &'a Identity,
    since: holder::Since,
) -> impl redis::ToRedisArgs + 'a {
    Stamped([token.as_str(), " ", identity.as_str()], since)
}

/// The holder's record with the time now, for a hold of a semaphore or read/write lock (its
/// token is the hash field; see shared.lua).
fn record_value(identity: &Identity) -> impl redis::ToRedisArgs + '_ {
    Stamped([identity.as_str()], holder::Since::now())
}

/// What a hold of a semaphore or read/write lock (a hash field's value: `<end ms> <mode>
/// <fence> <record>`) tells: whether it is a writer's, its fence, its holder.
fn read_shared_hold(value: &str) -> (bool, Option<u64>, Option<crate::Holder>) {
    let mut parts = value.splitn(4, ' ');
    let _ends = parts.next();
    let write = parts.next() == Some("w");
    let fence = parts.next().and_then(|f| f.parse().ok());
    (write, fence, holder::parse(parts.next().unwrap_or("")))
}

/// What a semaphore or read/write lock's holds (see [`read_shared_hold`]) tell an operator.
fn read_shared(key: &str, kind: &str, holds: &[String]) -> Option<LockInfo> {
    let mut read: Vec<_> = holds.iter().map(|v| read_shared_hold(v)).collect();
    // The oldest hold first: the lowest fence.
    read.sort_by_key(|(_, fence, _)| *fence);
    let (write, _, oldest) = read.first()?.clone();
    let mut info = LockInfo::new(key.to_owned());
    info.kind = match kind.strip_prefix("permits=").and_then(|n| n.parse().ok()) {
        Some(permits) => crate::LockKind::Semaphore { permits },
        None if write => crate::LockKind::Write,
        None => crate::LockKind::Read,
    };
    info.holders = read.len();
    info.holder = oldest;
    info.fence = read.iter().filter_map(|(_, fence, _)| *fence).max();
    Some(info)
}

/// What a lock's value (see [`lock_value`]) tells: the holder and the fence; never the token.
pub(crate) fn read_value(key: &str, value: &str) -> LockInfo {
    let mut info = LockInfo::new(key.to_owned());
    let record = value.get(33..).unwrap_or("");
    let (record, fence) = match record.rsplit_once(" fence=") {
        Some((record, fence)) => (record, fence.parse().ok()),
        None => (record, None),
    };
    info.holder = holder::parse(record);
    info.fence = fence;
    info
}

/// How the backend reaches Redis: one server, a Cluster, or the master the sentinels name.
#[allow(
    clippy::large_enum_variant,
    reason = "one per locker, made once: boxing would only add an indirection"
)]
enum Link {
    Single(redis::Client),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster::ClusterClient),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(sentinel::Master),
}

/// A live multiplexed connection of either kind; both reconnect by themselves.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn invoke<T: redis::FromRedisValue>(&mut self, call: &Call) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => call.invoke(c).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => call.invoke(c).await,
        }
    }

    /// [`Call::invoke_identified`] on this connection: on a Cluster, both go to the key's
    /// master in one pipeline (redis-rs routes it by the script's first key, and a redirect or a
    /// reconnection sends the whole pipeline again, together).
    async fn invoke_identified<T: redis::FromRedisValue>(
        &mut self,
        call: &Call,
    ) -> redis::RedisResult<(T, Option<ClientIdentity>)> {
        match self {
            Self::Single(c) => call.invoke_identified(c).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => call.invoke_identified(c).await,
        }
    }

    /// `cmd` as it is: on a Cluster, where redis-rs routes it (a key's master, or any node).
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// Whether a request that finds its connection dropped is sent again (see
/// [`RedisBackend::request`]).
#[derive(Clone, Copy)]
enum Repeat {
    /// Once more: the request is safe to repeat with the same token. An acquisition that finds
    /// its own hold takes it again with a new fence (lock.lua's `already_mine`; a RedLock
    /// master answers the repeated proposal `Behind`, and the round is asked again above it); a
    /// pass that finds the very value it sets (its first sending's) sets it again (pass.lua); an
    /// extension, a wake-up, leaving the queue and a look do the same again; a release sent
    /// again that finds the hold gone is unsettled (see [`Released::deleted`]).
    Once,
    /// Never: a forced release, whose first sending may have freed the key before its reply
    /// was lost: sent again it would free the next holder's.
    Never,
}

/// A request's reply, whether it came from a second sending (the first may have run, its reply
/// lost with its connection), and the serial of the connection it came on.
struct Sent<T> {
    reply: T,
    sent_again: bool,
    on: u64,
}

/// A release's reply (release.lua, release_shared.lua: bit 0 deleted), and whether it came
/// from a second sending.
pub(crate) struct Released {
    reply: i64,
    sent_again: bool,
}

impl Released {
    /// Whether the release deleted the hold. A release sent again after its connection dropped
    /// that finds the hold gone cannot tell whether its first sending deleted it (the reply lost
    /// with the connection) or the hold was gone before (a restart without persistence, a
    /// failover, an eviction): unsettled, and not settled by the lease (PostgreSQL's is, as
    /// nothing but a release deletes its rows; a Redis key can vanish). The guard says `Lost`
    /// when the lease had run out as it was sent, an error otherwise.
    pub(crate) fn deleted(&self) -> Result<bool, BackendError> {
        match (self.reply & 1 == 1, self.sent_again) {
            (false, true) => Err(BackendError::new(
                "Redis release: the connection dropped before the reply, and sent again the \
                 release found the hold gone (deleted by the first sending, or lost before it)",
            )
            .unsettled()
            .may_vanish()),
            (deleted, _) => Ok(deleted),
        }
    }

    /// RedLock's first master: whether a place waits in its queue of the key (release.lua's
    /// bit 2, with [`Announce::Never`]).
    #[cfg(feature = "redlock")]
    pub(crate) fn place_waits(&self) -> bool {
        self.reply & 4 != 0
    }
}

/// One script call, written once into the `EVALSHA` command it is sent as: redis-rs's
/// `ScriptInvocation` keeps every key and argument in a `Vec` of its own and copies them into a
/// new command at each call (about 7 allocations per call more, measured by the benchmark's W1).
/// A `NOSCRIPT` reply (a restarted server, `SCRIPT FLUSH`) loads the script and sends it again.
struct Call {
    script: &'static Script,
    cmd: redis::Cmd,
}

impl Call {
    /// A call of `script`; its `keys` keys must be the first arguments given.
    fn new(script: &'static Script, keys: usize) -> Self {
        let mut cmd = redis::Cmd::with_capacity(12, 192);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self { script, cmd }
    }

    fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self.cmd.query_async(connection).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(connection).await?;
                self.cmd.query_async(connection).await
            }
            reply => reply,
        }
    }

    /// The call followed by `CLIENT INFO` in one pipeline: its reply and which connection of
    /// which server ran it (`None` when `CLIENT INFO` was refused: an ACL without
    /// `+client|info`, a server before 6.2). Both travel in one write on one connection, so the
    /// identity is the script's own connection's, whatever reconnection happens before or
    /// after (`DLOCK_REDIS_WAIT`'s `WAIT` must go on that very connection).
    async fn invoke_identified<T: redis::FromRedisValue>(
        &self,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<(T, Option<ClientIdentity>)> {
        let mut pipe = redis::pipe();
        pipe.add_command(self.cmd.clone())
            .cmd("CLIENT")
            .arg("INFO")
            .ignore_errors();
        let mut loaded = false;
        loop {
            let (reply, info): (redis::Value, redis::Value) = pipe.query_async(connection).await?;
            match reply {
                redis::Value::ServerError(e)
                    if !loaded && e.kind() == Some(redis::ServerErrorKind::NoScript) =>
                {
                    self.script.load_async(connection).await?;
                    loaded = true;
                }
                redis::Value::ServerError(e) => return Err(e.into()),
                reply => {
                    let identity = redis::from_redis_value::<String>(info)
                        .ok()
                        .and_then(|info| ClientIdentity::of(&info));
                    return Ok((redis::from_redis_value(reply)?, identity));
                }
            }
        }
    }
}

/// `DLOCK_REDIS_WAIT` without the connection's identity: `CLIENT INFO` was refused (or
/// answered without its fields), so no `WAIT` can be told to be the acquisition's.
fn client_info_refused() -> BackendError {
    BackendError::new(
        "Redis CLIENT INFO was refused or incomplete: DLOCK_REDIS_WAIT needs Redis 6.2 or later \
         and, with an ACL, +client|info (see dlock's docs/redis.md)",
    )
    .refused()
}

/// Which connection of which server a command ran on: the `id`, `addr` (the client's end) and
/// `laddr` (the server's end, Redis 6.2 and later) fields of `CLIENT INFO`. A client id alone
/// is not enough: ids count from 1 on every server, and a Cluster's or a Sentinel's connection
/// can move to another.
#[derive(Debug, PartialEq, Eq)]
struct ClientIdentity(String);

impl ClientIdentity {
    /// `None` without all three fields.
    fn of(info: &str) -> Option<Self> {
        let fields: Vec<&str> = info
            .split_ascii_whitespace()
            .filter(|field| {
                field.starts_with("id=")
                    || field.starts_with("addr=")
                    || field.starts_with("laddr=")
            })
            .collect();
        (fields.len() == 3).then(|| Self(fields.join(" ")))
    }
}

/// One key or argument written in pieces straight into the command's buffer: no `String` of
/// its own, and no formatting machinery (redis-rs formats a `Display` argument through
/// `io::Write`, a call per piece).
struct Pieces<'a, const N: usize>([&'a str; N]);

impl<const N: usize> redis::ToRedisArgs for Pieces<'_, N> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        write_pieces(out, self.0);
    }
}

/// [`Pieces`] followed by a holder record's time: one argument.
struct Stamped<'a, const N: usize>([&'a str; N], holder::Since);

impl<const N: usize> redis::ToRedisArgs for Stamped<'_, N> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        write_pieces(out, self.0.iter().copied().chain([self.1.as_str()]));
    }
}

fn write_pieces<'a, W: ?Sized + redis::RedisWrite>(
    out: &mut W,
    pieces: impl IntoIterator<Item = &'a str>,
) {
    use std::io::Write as _;
    let mut arg = out.writer_for_next_arg();
    for piece in pieces {
        // Into the command's `Vec`: it cannot fail.
        let _ = arg.write_all(piece.as_bytes());
    }
}

/// The connection and a task that never ends on the runtime it was made on: once that task is
/// finished, the runtime is gone and so is the connection's own task.
struct Connection {
    manager: Conn,
    runtime: tokio::task::JoinHandle<()>,
    /// Sentinel: the failover count when its master was found; 0 otherwise.
    generation: u64,
    /// Which of this backend's connections it is (the count of those made before): a request
    /// that failed on it forgets this one only, not one made since by another request.
    serial: u64,
}

impl Connection {
    fn alive(&self) -> bool {
        !self.runtime.is_finished()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.runtime.abort();
    }
}

pub(crate) struct RedisBackend {
    link: Link,
    connection: std::sync::Mutex<Option<Connection>>,
    /// Connections made so far (the next one's serial).
    made: std::sync::atomic::AtomicU64,
    /// Held while a connection is made.
    making: tokio::sync::Mutex<()>,
    request_timeout: Duration,
    fence_prefix: String,
    fair_prefix: String,
    /// Release notifications; `None` when turned off (`DLOCK_NOTIFY=off`).
    notifier: Option<Notifier>,
    /// A release's PUBLISH was refused once already (reported once per locker).
    publish_denied: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How a release of a mutex announces itself: when a place in the key's queue waits for it,
    /// or always, a RedLock master's (RedLock's waiters keep a place on the key's first master
    /// only, when they can; see [`announcing_every_release`](Self::announcing_every_release)).
    announce: Announce,
    /// `DLOCK_REDIS_WAIT`: replicas that must acknowledge an acquisition; 0 = off.
    wait_replicas: u32,
    /// Who this locker is, recorded in each lock's value.
    identity: Identity,
    /// The key prefix: dlock's reserved namespace after it (`__word:`) is left out of listings.
    key_prefix: String,
}

/// A release's `PUBLISH` was refused by the server's ACL: said once per connection's backend
/// (`denied`), as a warning while notifications are on (waiters of other lockers poll instead
/// of being woken).
fn warn_publish_denied(denied: &std::sync::atomic::AtomicBool, notifying: bool, key: &str) {
    if denied.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if notifying {
        tracing::warn!(
            key = %key,
            "the Redis user may not PUBLISH release notifications (its ACL rule lacks the \
             command, `+publish`, on a Cluster `+spublish`, or the channel permission \
             `&<prefix>*`: the channels are the lock keys' and \
             `<prefix>__fair:{{<key>}}:queue:<8 hex>`; or a Cluster before Redis 7, which has \
             no SPUBLISH): waiters of other lockers poll instead of being woken"
        );
    } else {
        tracing::debug!(key = %key, "release notification refused by the server's ACL");
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field(
                "connected",
                &self
                    .connection
                    .lock()
                    .is_ok_and(|c| c.as_ref().is_some_and(Connection::alive)),
            )
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// The backend of the Redis engine `url` names (one server, a Cluster or the master of a
    /// Sentinel deployment), configured from it and `settings`; makes no connection.
    pub(crate) fn from_url(url: &EngineUrl, settings: &Settings) -> Result<Self, LockError> {
        let timeout = settings.request_timeout;
        // dlock's own options stay out of what redis-rs reads.
        let client_url = url.without_params(&[WAIT.name]);
        install_tls_provider(&client_url);
        let (link, notifier) = match url.engine() {
            "redis" => {
                let client = redis::Client::open(client_url.as_str()).map_err(|_| {
                    LockError::config(
                        "DLOCK_URL: expected a URL like `redis://[user:password@]host:port[/db]`",
                    )
                })?;
                let notifier = settings
                    .notify
                    .then(|| Notifier::new(Some(client.clone()), timeout));
                (Link::Single(client), notifier)
            }
            #[cfg(feature = "redis-cluster")]
            "redis-cluster" => Self::cluster(&client_url, settings)?,
            #[cfg(feature = "redis-sentinel")]
            "redis-sentinel" => {
                let master = sentinel::Master::new(&client_url, timeout)?;
                let notifier = settings.notify.then(|| Notifier::new(None, timeout));
                (Link::Sentinel(master), notifier)
            }
            _ => return Err(LockError::config("not a Redis engine")),
        };
        let wait_replicas = match option(url, settings, WAIT.name) {
            Some((value, from)) => value
                .parse()
                .map_err(|_| LockError::config(format!("{from}: expected a whole number")))?,
            None => 0,
        };
        Ok(Self {
            link,
            notifier,
            connection: std::sync::Mutex::new(None),
            made: std::sync::atomic::AtomicU64::new(0),
            making: tokio::sync::Mutex::new(()),
            request_timeout: timeout,
            fence_prefix: format!("{}{FENCE_PREFIX}", settings.key_prefix),
            fair_prefix: format!("{}{FAIR_PREFIX}", settings.key_prefix),
            publish_denied: std::sync::Arc::default(),
            announce: Announce::WhenWaited,
            wait_replicas,
            identity: settings.identity.clone(),
            key_prefix: settings.key_prefix.clone(),
        })
    }

    /// The link and notifier of a `redis+cluster://` URL's seed nodes. Release notifications go
    /// over shard channels (`SPUBLISH`/`SSUBSCRIBE`, Redis 7).
    #[cfg(feature = "redis-cluster")]
    fn cluster(url: &str, settings: &Settings) -> Result<(Link, Option<Notifier>), LockError> {
        // The first `{…}` of a key decides its slot. A prefix with braces must hold a whole
        // non-empty tag (then every key shares it); otherwise (`a{}b:`, `app{`) the prefix would
        // decide, or spoil, how dlock's companion keys are tagged, and scripts would cross slots.
        let prefix = &settings.key_prefix;
        if prefix.contains(['{', '}']) && hash_tag(prefix.as_bytes()).is_none() {
            return Err(LockError::config(
                "DLOCK_KEY_PREFIX: on a Redis Cluster a prefix with braces must hold a whole \
                 hash tag, like `{app}:` (every key then lives in that tag's slot); `{}` or an \
                 unclosed `{` would split a lock from its fencing counter across slots",
            ));
        }
        let hosts = crate::url::HostList::parse("DLOCK_URL", url, CLUSTER_FORM)?;
        let client = redis::cluster::ClusterClient::builder(hosts.node_urls(""))
            .connection_timeout(settings.request_timeout)
            .retries(2)
            .build()
            .map_err(|_| LockError::config(format!("DLOCK_URL: expected `{CLUSTER_FORM}`")))?;
        let notifier = settings
            .notify
            .then(|| Notifier::cluster(hosts.node_urls(""), settings.request_timeout));
        Ok((Link::Cluster(client), notifier))
    }

    /// This backend as one of RedLock's masters: every deletion by a release is announced on
    /// the key's channel, for waiters that listen on every master but the key's first (the first
    /// master's own release is made with [`release_first`](Self::release_first), and its queue's
    /// places are woken by the releasing client).
    #[cfg(feature = "redlock")]
    pub(crate) fn announcing_every_release(mut self) -> Self {
        self.announce = Announce::Always;
        self
    }

    /// How release.lua announces a release: on a Cluster a shard channel (`SPUBLISH`, heard
    /// only by the nodes of the key's slot), else a plain channel.
    fn publish_command(&self) -> &'static str {
        match self.link {
            #[cfg(feature = "redis-cluster")]
            Link::Cluster(_) => "SPUBLISH",
            _ => "PUBLISH",
        }
    }

    /// The server refused a release notification (the user has no permission on the channel:
    /// the key's, or a waiting place's `<prefix>__fair:{<key>}:queue:<8 hex>`): the release
    /// itself stood. Reported once per locker; waiters elsewhere poll.
    fn publish_denied(&self, key: &str) {
        warn_publish_denied(&self.publish_denied, self.notifier.is_some(), key);
    }

    /// The shared connection, made lazily on first use; it reconnects by itself afterwards. It
    /// is made again when the runtime it was made on has shut down (its tasks died with it), as
    /// when one locker serves several `#[tokio::test]`s in turn, and (Sentinel) when it was
    /// dropped after an error because the master may have moved. With its serial, for
    /// [`forget_connection_after`](Self::forget_connection_after).
    async fn connection(&self) -> Result<(Conn, u64), BackendError> {
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        // One request makes it (on Sentinel asking the sentinels); those that find none
        // meanwhile wait for it and share it.
        let _making = self.making.lock().await;
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        // Boxed: asking the sentinels for the master is a future of over 3 KiB, which inline
        // would size every request's future, moved and allocated at each request.
        Box::pin(self.open_connection()).await
    }

    /// A new connection, once no live one is left: to the one server, the Cluster, or the
    /// master the sentinels name now.
    async fn open_connection(&self) -> Result<(Conn, u64), BackendError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            BackendError::new("the Redis backend runs on a tokio runtime; none is running")
        })?;
        // Read before the master is asked for: a failover announced meanwhile makes this
        // connection stale at once.
        let generation = self.generation();
        let client = match &self.link {
            Link::Single(client) => client.clone(),
            #[cfg(feature = "redis-cluster")]
            Link::Cluster(client) => {
                // No response timeout here: `call` bounds each request.
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(self.request_timeout);
                let manager =
                    Conn::Cluster(client.get_pending_async_connection_with_config(config));
                return Ok(self.store(manager, &runtime, 0));
            }
            #[cfg(feature = "redis-sentinel")]
            Link::Sentinel(master) => {
                let client = master.resolve().await?;
                if let Some(notifier) = &self.notifier {
                    notifier.follow(client.clone());
                }
                client
            }
        };
        // No response timeout here: `call` bounds each request (one timer per request, not
        // two), including the wait for a connection being re-established.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.request_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| BackendError::with_source("could not set up the Redis connection", e))?;
        Ok(self.store(Conn::Single(manager), &runtime, generation))
    }

    fn live_connection(&self) -> Option<(Conn, u64)> {
        let generation = self.generation();
        self.connection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|c| c.alive() && c.generation == generation)
            .map(|c| (c.manager.clone(), c.serial))
    }

    /// Sentinel: failovers announced so far; a connection from before the last is stale.
    fn generation(&self) -> u64 {
        match &self.link {
            #[cfg(feature = "redis-sentinel")]
            Link::Sentinel(master) => master.generation(),
            _ => 0,
        }
    }

    fn store(
        &self,
        manager: Conn,
        runtime: &tokio::runtime::Handle,
        generation: u64,
    ) -> (Conn, u64) {
        // Made under `making`, after no live connection was found: nothing live is replaced.
        let serial = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self
            .connection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Connection {
            manager: manager.clone(),
            runtime: runtime.spawn(std::future::pending()),
            generation,
            serial,
        });
        (manager, serial)
    }

    /// `DLOCK_REDIS_WAIT`: waits (within the request timeout) until `wait_replicas` replicas
    /// acknowledged the acquisition just made on `key`'s master; otherwise undoes it by token
    /// and fails the attempt. `WAIT` counts the writes of the connection it is sent on, so it
    /// goes on the same multiplexed connection (for a Cluster, the one to `key`'s master).
    ///
    /// Boxed: its future (over 1.5 KiB) would otherwise size every acquisition's, though
    /// only `DLOCK_REDIS_WAIT` runs it.
    fn replicated<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
        on: Option<ClientIdentity>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.wait_for_replicas(key, kind, token, on))
    }

    /// See [`replicated`](Self::replicated): `on` is the connection that ran the acquisition
    /// ([`Call::invoke_identified`]). `WAIT` goes in one pipeline after `CLIENT INFO`: when
    /// the connection it finds is another (redis-rs made it again meanwhile, Sentinel's
    /// connection was replaced, a Cluster's slot moved), that `WAIT` counts none of the
    /// acquisition's writes and would answer at once, so its count is not taken and the
    /// acquisition is undone as not acknowledged.
    async fn wait_for_replicas(
        &self,
        key: &str,
        kind: LockKind,
        token: &Token,
        on: Option<ClientIdentity>,
    ) -> Result<(), BackendError> {
        let timeout_ms = u64::try_from(self.request_timeout.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT")
            .arg("INFO")
            .cmd("WAIT")
            .arg(self.wait_replicas)
            .arg(timeout_ms);
        // The connection `WAIT` went on, for Sentinel's forgetting after an error.
        let mut used = None;
        let acked = tokio::time::timeout(self.request_timeout * 2, async {
            let Some(on) = on else {
                return Err(client_info_refused());
            };
            let Some((connection, serial)) = self.live_connection() else {
                return Err(BackendError::new(
                    "Redis WAIT: the connection the acquisition was sent on was dropped since",
                ));
            };
            used = Some(serial);
            let replies = match connection {
                Conn::Single(mut c) => pipe.query_async::<(String, i64)>(&mut c).await,
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(mut c) => {
                    use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                    let route = Route::new(slot(key.as_bytes()), SlotAddr::Master);
                    c.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::SpecificNode(route))
                        .await
                        .and_then(|values| {
                            // A server's refusal (`NOPERM`) as a one server's pipeline
                            // reports it, not as a reply of the wrong type.
                            let value = redis::Value::Array(values).extract_error()?;
                            redis::from_redis_value::<(String, i64)>(value)
                                .map_err(redis::RedisError::from)
                        })
                }
            };
            match replies {
                Ok((info, _)) if ClientIdentity::of(&info).as_ref() != Some(&on) => {
                    // The connection found is a live one: nothing to forget.
                    used = None;
                    Err(BackendError::new(
                        "Redis WAIT: it found another connection than the acquisition's (made \
                         again since, or to another node)",
                    ))
                }
                Ok((_, acked)) => Ok(acked),
                Err(e) => Err(classify("WAIT", e)),
            }
        })
        .await
        .unwrap_or_else(|_| Err(BackendError::new("Redis WAIT got no reply")));
        if let Err(error) = &acked {
            self.forget_connection_after(error, used);
        }
        match acked {
            Ok(n) if n >= i64::from(self.wait_replicas) => Ok(()),
            outcome => {
                // Not known to survive a failover: undo it, then report.
                let undone = match self.release(key, kind, token).await {
                    Ok(_) => "it was undone",
                    Err(_) => "undoing it failed too: its lease ends it",
                };
                Err(match outcome {
                    Ok(n) => BackendError::new(format!(
                        "the lock was acknowledged by {n} of the {} replicas DLOCK_REDIS_WAIT asks \
                         for within {:?}; {undone}",
                        self.wait_replicas, self.request_timeout
                    )),
                    Err(e) if e.is_refused() => {
                        BackendError::new(format!("{e}; {undone}")).refused()
                    }
                    Err(e) => BackendError::new(format!("{e}; {undone}")),
                })
            }
        }
    }

    /// Sentinel: after an error on the connection `serial` that may mean the master moved (a
    /// replica's `READONLY`, a connection lost or silent), the next request asks the sentinels
    /// again. A connection made since (another request failed too, and made one) is kept: each
    /// of many requests failing together would otherwise ask the sentinels once more. `None`:
    /// no connection was had (the sentinels did not answer), none is forgotten.
    #[cfg(feature = "redis-sentinel")]
    fn forget_connection_after(&self, error: &BackendError, serial: Option<u64>) {
        if matches!(self.link, Link::Sentinel(_)) && !error.is_refused() {
            let mut slot = self
                .connection
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.as_ref().map(|c| c.serial) == serial {
                *slot = None;
            }
        }
    }

    /// Without Sentinel a connection follows its server by itself.
    #[cfg(not(feature = "redis-sentinel"))]
    fn forget_connection_after(&self, _error: &BackendError, _serial: Option<u64>) {}

    /// Runs one script call, bounded by the request timeout even while the connection is being
    /// re-established; sent once more when it finds its connection dropped (see
    /// [`request`](Self::request)).
    async fn call<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        call: Call,
    ) -> Result<T, BackendError> {
        self.request(what, &call, Repeat::Once)
            .await
            .map(|sent| sent.reply)
    }

    /// Runs one script call, bounded by twice the request timeout (a NOSCRIPT answer costs a
    /// SCRIPT LOAD and a second EVALSHA; a Sentinel is asked for the master first), even while
    /// the connection is being re-established; with [`Repeat::Once`], sent once more when it
    /// finds its connection dropped (see [`sent`](Self::sent)). With the reply: whether it is
    /// from a second sending (the first may have run, its reply lost with the connection), and
    /// the connection it came on (a scan starts over when its pages came on several).
    async fn request<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        call: &Call,
        repeat: Repeat,
    ) -> Result<Sent<T>, BackendError> {
        self.sent(what, repeat, |mut connection| async move {
            connection.invoke(call).await
        })
        .await
    }

    /// An acquisition's or a pass's script, as [`request`](Self::request) sends it; with
    /// `DLOCK_REDIS_WAIT`, followed by `CLIENT INFO` in one pipeline: the connection that
    /// wrote the hold, on which [`replicated`](Self::replicated)'s `WAIT` must go. Without
    /// that identity nothing can be confirmed: a reply that `granted` nothing is refused here at
    /// once (a granted one is undone by `replicated`, which refuses it too).
    async fn acquisition<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        call: &Call,
        granted: impl FnOnce(&T) -> bool,
    ) -> Result<(T, Option<ClientIdentity>), BackendError> {
        if self.wait_replicas == 0 {
            return self
                .request(what, call, Repeat::Once)
                .await
                .map(|sent| (sent.reply, None));
        }
        let (reply, on) = self
            .sent(what, Repeat::Once, |mut connection| async move {
                connection.invoke_identified(call).await
            })
            .await?
            .reply;
        if on.is_none() && !granted(&reply) {
            return Err(client_info_refused());
        }
        Ok((reply, on))
    }

    /// Sends `send` on the connection, bounded by twice the request timeout. With
    /// [`Repeat::Once`], a request that finds its connection dropped is sent once more, on the
    /// connection made again: redis-rs notices a connection closed while it was idle (a server
    /// restarted, a server's `timeout` or a proxy closing idle clients) only when a request
    /// fails on it, and then makes another. Without it the first request after such a close
    /// failed: a `try_acquire`, a readiness `ping`, a release (its key left for its lease), a
    /// pass. A Cluster connection re-sends such requests itself, unseen here.
    async fn sent<T, F, Fut>(
        &self,
        what: &'static str,
        repeat: Repeat,
        mut send: F,
    ) -> Result<Sent<T>, BackendError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let bound = self.request_timeout * 2;
        let mut sent_again = false;
        // The connection of the last sending (`None` while none was had).
        let mut used = None;
        // Pinned where it is made, not moved into the timeout: a request's future is large (the
        // script call's inside), and every move copied it whole.
        let result = tokio::time::timeout(bound, std::pin::pin!(async {
            loop {
                let (connection, serial) = self.connection().await?;
                used = Some(serial);
                match send(connection).await {
                    Ok(reply) => {
                        return Ok(Sent {
                            reply,
                            sent_again,
                            on: serial,
                        });
                    }
                    Err(e)
                        if e.is_connection_dropped()
                            && !sent_again
                            && matches!(repeat, Repeat::Once) =>
                    {
                        tracing::debug!(error_kind = ?e.kind(), "Redis {what}: the connection was dropped; sent once more on a new one");
                        self.forget_connection_after(&classify(what, e), used);
                        sent_again = true;
                    }
                    Err(e) => return Err(classify(what, e)),
                }
            }
        }))
        .await
        .unwrap_or_else(|_| {
            Err(BackendError::new(format!(
                "Redis {what} got no reply within {bound:?}"
            )))
        });
        if let Err(error) = &result {
            self.forget_connection_after(error, used);
        }
        result
    }

    /// RedLock's acquire on this node: `script` (the RedLock folder's) with the lock key, its
    /// fencing counter, the token, the lease and the proposed fence, and from the request's
    /// place in this node's queue when it has one (the key's first master); its reply as it
    /// came.
    #[cfg(feature = "redlock")]
    pub(crate) async fn acquire_proposed(
        &self,
        script: &'static Script,
        request: &Request<'_>,
        proposed: u64,
    ) -> Result<redis::Value, BackendError> {
        let queue = request.queue.as_ref();
        let mut call = Call::new(script, if queue.is_some() { 4 } else { 2 });
        call.arg(request.key).arg(self.fence_key(request.key));
        if queue.is_some() {
            call.arg(companion(&self.fair_prefix, request.key, "queue"))
                .arg(companion(&self.fair_prefix, request.key, "waiters"));
        }
        call.arg(lock_value(request.token, &self.identity))
            .arg(lease_millis(request.lease))
            .arg(proposed);
        if let Some(queued) = queue {
            call.arg(lease_millis(queued.liveness))
                .arg(queued.place.as_str())
                .arg(if queued.keep { "1" } else { "0" })
                .arg(if queued.refresh { "1" } else { "0" });
        }
        self.call("acquire", call).await
    }

    /// RedLock's pass on this node: `script` (the RedLock folder's) with the lock key, its
    /// fencing counter, the holder's token, the next holder's value stamped `since` (one stamp
    /// per pass: the script knows a pass asked again by its very value), its lease and the
    /// proposed fence; its reply as it came.
    #[cfg(feature = "redlock")]
    pub(crate) async fn pass_proposed(
        &self,
        script: &'static Script,
        key: &str,
        (from, to, since): (&Token, &Token, holder::Since),
        lease: Duration,
        proposed: u64,
    ) -> Result<redis::Value, BackendError> {
        let mut call = Call::new(script, 2);
        call.arg(key)
            .arg(self.fence_key(key))
            .arg(from.as_str())
            .arg(lock_value_since(to, &self.identity, since))
            .arg(lease_millis(lease))
            .arg(proposed);
        self.call("pass", call).await
    }

    /// A mutex's release (release.lua) announced as `announce` says: its reply (bit 0 deleted,
    /// bit 2 a place waits, with [`Announce::Never`]).
    async fn release_mutex(
        &self,
        key: &str,
        token: &Token,
        announce: Announce,
    ) -> Result<Released, BackendError> {
        let (script, keys) = release_script(announce, self.publish_command());
        let mut call = Call::new(script, keys);
        call.arg(key);
        if keys == 2 {
            // The queue, to name the place first in line in the wake-up.
            call.arg(companion(&self.fair_prefix, key, "queue"));
        }
        call.arg(token.as_str());
        // release.lua: bit 0 deleted, bit 1 the notification was refused (no channel
        // permission); the release stands either way.
        let Sent {
            reply, sent_again, ..
        } = self.request::<i64>("release", &call, Repeat::Once).await?;
        if reply & 2 != 0 {
            self.publish_denied(key);
        }
        Ok(Released { reply, sent_again })
    }

    /// RedLock's undoing of an attempt on this master: the compare-and-delete of a release,
    /// announced to nobody (nothing was held: waking a waiter now would only send it to be
    /// refused by the majority that holds the lock).
    #[cfg(feature = "redlock")]
    pub(crate) async fn undo(&self, key: &str, token: &Token) -> Result<bool, BackendError> {
        Ok(self.release_mutex(key, token, Announce::Never).await?.reply & 1 == 1)
    }

    /// RedLock's release on the key's first master: the compare-and-delete, announced to
    /// nobody yet; whether it deleted ([`Released::deleted`]), and whether a place waits in this
    /// master's queue ([`Released::place_waits`]: then the client wakes it once its release
    /// round has answered, see [`Self::wake_first`]).
    #[cfg(feature = "redlock")]
    pub(crate) async fn release_first(
        &self,
        key: &str,
        token: &Token,
    ) -> Result<Released, BackendError> {
        self.release_mutex(key, token, Announce::Never).await
    }

    /// The call of RedLock's wake.lua (`script`) for the queue of `key` on this master.
    #[cfg(feature = "redlock")]
    fn wake_call(&self, script: &'static Script, key: &str) -> Call {
        let mut call = Call::new(script, 1);
        call.arg(companion(&self.fair_prefix, key, "queue"))
            .arg(self.publish_command());
        call
    }

    /// RedLock: wakes the place first in this master's queue of `key` (`script`, the RedLock
    /// folder's wake.lua), on its channel.
    #[cfg(feature = "redlock")]
    pub(crate) async fn wake_first(
        &self,
        script: &'static Script,
        key: &str,
    ) -> Result<(), BackendError> {
        let reply: i64 = self.call("wake", self.wake_call(script, key)).await?;
        if reply == 2 {
            self.publish_denied(key);
        }
        Ok(())
    }

    /// [`wake_first`](Self::wake_first) as a future that owns what it needs, for the caller to
    /// spawn (a RedLock release, whose round has answered, need not wait for the reply: the
    /// releasing client's next acquisition does not wait one more round trip behind each
    /// contended release). `None` when there is no live connection to send it on (then the
    /// caller sends it itself). A refused `PUBLISH` is reported as `wake_first` reports it.
    #[cfg(feature = "redlock")]
    pub(crate) fn wake_first_task(
        &self,
        script: &'static Script,
        key: &str,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let (mut connection, _) = self.live_connection()?;
        let call = self.wake_call(script, key);
        let (bound, denied, notifying) = (
            self.request_timeout,
            self.publish_denied.clone(),
            self.notifier.is_some(),
        );
        let key = key.to_owned();
        Some(async move {
            match tokio::time::timeout(bound, connection.invoke::<i64>(&call)).await {
                Ok(Ok(2)) => warn_publish_denied(&denied, notifying, &key),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(key = %key, error = %e, "RedLock: the first waiting process could not be woken; it polls")
                }
                Err(_) => {
                    tracing::debug!(key = %key, "RedLock: the first waiting process could not be woken in time; it polls")
                }
            }
        })
    }

    /// RedLock: `place` out of this master's queue of `key` (`script`, the RedLock folder's
    /// place.lua), announced to nobody.
    #[cfg(feature = "redlock")]
    pub(crate) async fn leave_quietly(
        &self,
        script: &'static Script,
        key: &str,
        place: &Token,
    ) -> Result<(), BackendError> {
        let mut call = Call::new(script, 2);
        call.arg(companion(&self.fair_prefix, key, "queue"))
            .arg(companion(&self.fair_prefix, key, "waiters"))
            .arg(place.as_str());
        let _: i64 = self.call("leave the queue", call).await?;
        Ok(())
    }

    /// The channel on which releases of `key` wake `place` (release.lua and wake_head.lua, which
    /// leave.lua, force.lua and RedLock's wake.lua run, name it so): the key's queue, `:` and the place's first 8 hex digits, which a
    /// locker's places share. One waiting process hears the releases that name its place, and
    /// no other's; the same cluster slot as the key.
    fn wake_channel(&self, key: &str, place: &Token) -> String {
        let queue = companion(&self.fair_prefix, key, "queue").to_string();
        format!("{queue}:{}", &place.as_str()[..8])
    }

    /// The fencing counter in the same cluster slot as `key`: one counter per slot, so storage
    /// stays bounded (at most 16384 counters) however many lock names come and go.
    fn fence_key(&self, key: &str) -> impl redis::ToRedisArgs + '_ {
        Pieces([&self.fence_prefix, "{", slot_tag(slot(key.as_bytes())), "}"])
    }
}

/// rustls needs a process-wide crypto provider; install ring's unless the program already
/// installed one (then ours is refused, and theirs is used).
fn install_tls_provider(url: &str) {
    #[cfg(feature = "tls")]
    if url.starts_with("rediss") {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let _ = url;
}

/// A driver error as a [`BackendError`], marked refused when asking again cannot cure it: the
/// server's ACL denies a command, key or channel (`NOPERM`; inside a script Redis says `ERR The
/// user executing the script can't …`), it does not accept the credentials, a script cannot be
/// loaded (`NOSCRIPT` after the reload), or the lock key holds another type (`WRONGTYPE`).
fn classify(what: &'static str, error: redis::RedisError) -> BackendError {
    let script_denied = error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|d| d.starts_with("The user executing the script can't"));
    let why = match error.code() {
        _ if script_denied => Some(
            "the Redis user may not run a command or use a key the lock script needs \
             (grant the ACL rule in dlock's docs/redis.md)",
        ),
        Some("NOPERM") => Some(
            "the Redis user lacks a permission the lock needs (grant the ACL rule in dlock's docs/redis.md)",
        ),
        Some("NOSCRIPT") => Some("the lock script could not be loaded on the server"),
        Some("WRONGTYPE") => Some(
            "the lock key holds a value of another type: it is not a dlock lock (choose another key \
             or prefix)",
        ),
        _ if error.kind() == redis::ErrorKind::AuthenticationFailed => {
            Some("the server did not accept the credentials")
        }
        _ => None,
    };
    match why {
        Some(why) => {
            BackendError::with_source(format!("Redis {what} refused: {why}"), error).refused()
        }
        None => BackendError::with_source(format!("Redis {what} failed"), error),
    }
}

/// A fair-mode companion of the lock key `key` (`queue` or `waiters`), in dlock's reserved
/// namespace (no lock key can be named so) and in `key`'s Cluster slot:
/// `<prefix>__fair:{<key>}:<suffix>`, or `<prefix>__fair:{<a tag of its slot>}<key>:<suffix>`
/// for a key with braces of its own.
fn companion<'a>(fair_prefix: &'a str, key: &'a str, suffix: &'static str) -> Companion<'a> {
    Companion {
        fair_prefix,
        key,
        suffix,
    }
}

/// A companion key (see [`companion`]), formatted where it is written.
struct Companion<'a> {
    fair_prefix: &'a str,
    key: &'a str,
    suffix: &'static str,
}

impl<'a> Companion<'a> {
    /// `<prefix>{<key>}:<suffix>`, or `<prefix>{<tag>}<key>:<suffix>` for a key with braces.
    fn pieces(&self) -> Pieces<'a, 7> {
        let Self {
            fair_prefix,
            key,
            suffix,
        } = *self;
        let (tagged, after) = if key.contains(['{', '}']) {
            (slot_tag(slot(key.as_bytes())), key)
        } else {
            (key, "")
        };
        Pieces([fair_prefix, "{", tagged, "}", after, ":", suffix])
    }
}

impl fmt::Display for Companion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pieces()
            .0
            .into_iter()
            .try_for_each(|piece| f.write_str(piece))
    }
}

impl redis::ToRedisArgs for Companion<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        self.pieces().write_redis_args(out);
    }
}

/// The part of `key` between the first `{` and the next `}`, when not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

impl RedisBackend {
    /// Whether `key` is dlock's own (`<prefix>__word:…`, the fencing counters and fair
    /// queues), by the rule that reserves such names for lock keys too.
    fn reserved(&self, key: &str) -> bool {
        key.strip_prefix(self.key_prefix.as_str())
            .and_then(|rest| rest.strip_prefix("__"))
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(word, _)| {
                !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase())
            })
    }
}

/// `text` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisBackend {
    /// The keys matching `pattern`, by `SCAN` (on every master of a Cluster), each request
    /// bounded by twice the request timeout; on one server or Sentinel's master each page is
    /// sent as a script call is (once more on a connection found dropped: `SCAN` only reads;
    /// the scan then starts over, as the server may be another, or restarted, whose cursor
    /// would skip keys).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, BackendError> {
        match self.connection().await?.0 {
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => self.scan_cluster(c, pattern).await,
            Conn::Single(_) => {
                scan_pages(pattern, |cmd| async move {
                    self.sent("list", Repeat::Once, |mut connection| {
                        let cmd = &cmd;
                        async move { connection.query(cmd).await }
                    })
                    .await
                })
                .await
            }
        }
    }

    /// [`scan`](Self::scan) on every master of a Cluster, over its connection `c`.
    #[cfg(feature = "redis-cluster")]
    async fn scan_cluster(
        &self,
        mut c: redis::cluster_async::ClusterConnection,
        pattern: &str,
    ) -> Result<Vec<String>, BackendError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let bound = self.request_timeout * 2;
        let nodes: String = tokio::time::timeout(
            bound,
            redis::cmd("CLUSTER").arg("NODES").query_async(&mut c),
        )
        .await
        .map_err(|_| BackendError::new("Redis CLUSTER NODES got no reply"))?
        .map_err(|e| classify("list", e))?;
        let mut keys = Vec::new();
        for (host, port) in cluster_masters(&nodes) {
            let batch = scan_pages(pattern, |cmd| {
                let (mut c, host) = (c.clone(), host.clone());
                async move {
                    let route =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let reply = tokio::time::timeout(bound, c.route_command(cmd, route))
                        .await
                        .map_err(|_| BackendError::new("Redis SCAN got no reply"))?
                        .map_err(|e| classify("list", e))?;
                    // The Cluster connection follows its nodes itself.
                    Ok(Sent {
                        reply,
                        sent_again: false,
                        on: 0,
                    })
                }
            })
            .await?;
            keys.extend(batch);
        }
        Ok(keys)
    }

    /// `PING` on the connection the locks use, bounded as a script call is.
    pub(crate) async fn ping_server(&self) -> Result<(), BackendError> {
        self.sent("ping", Repeat::Once, |mut connection| async move {
            connection.query::<()>(&redis::cmd("PING")).await
        })
        .await
        .map(drop)
    }
}

impl RedisBackend {
    /// A permit, a read or a write hold (acquire_shared.lua).
    async fn acquire_shared(&self, request: Request<'_>) -> Result<Attempt, BackendError> {
        let Request {
            key,
            token,
            lease,
            kind,
            liveness,
            ..
        } = request;
        let (mode, permits) = match kind {
            crate::LockKind::Semaphore { permits } => ("p", permits),
            crate::LockKind::Write => ("w", 0),
            _ => ("r", 0),
        };
        let mut call = Call::new(acquire_shared_script(), 2);
        call.arg(key)
            .arg(self.fence_key(key))
            .arg(token.as_str())
            .arg(record_value(&self.identity))
            .arg(lease_millis(lease))
            .arg(mode);
        if permits > 0 {
            call.arg(format!("permits={permits}"));
        } else {
            call.arg("rw");
        }
        call.arg(permits)
            .arg(lease_millis(liveness))
            .arg(now_micros());
        let (reply, on) = self
            .acquisition("acquire", &call, |reply| {
                matches!(reply, redis::Value::Int(1..))
            })
            .await?;
        let reply = match reply {
            redis::Value::Int(reply) => reply,
            redis::Value::BulkString(why) => {
                return Ok(Attempt::Conflict(format!(
                    "{}, and this acquisition asks for a {kind}",
                    String::from_utf8_lossy(&why)
                )));
            }
            other => {
                return Err(BackendError::new(format!(
                    "Redis acquire answered {other:?}, not a fence"
                )));
            }
        };
        let queued = kind == crate::LockKind::Write;
        Ok(match u64::try_from(reply) {
            Ok(0) => Attempt::Held { ttl: None, queued },
            Ok(fence) => {
                if self.wait_replicas > 0 {
                    self.replicated(key, kind, token, on).await?;
                }
                Attempt::acquired(fence)
            }
            Err(_) => Attempt::Held {
                ttl: Some(Duration::from_millis(reply.unsigned_abs() - 1)),
                queued,
            },
        })
    }

    /// A mutex attempt (acquire.lua, or acquire_queued.lua from a place in the key's queue).
    async fn acquire_mutex(&self, request: Request<'_>) -> Result<Attempt, BackendError> {
        let Request {
            key,
            token,
            lease,
            queue,
            ..
        } = request;
        let mut call = match queue {
            None => Call::new(acquire_script(), 2),
            Some(_) => Call::new(acquire_queued_script(), 4),
        };
        call.arg(key);
        if queue.is_some() {
            call.arg(companion(&self.fair_prefix, key, "queue"))
                .arg(companion(&self.fair_prefix, key, "waiters"));
        }
        call.arg(self.fence_key(key))
            .arg(lock_value(token, &self.identity))
            .arg(lease_millis(lease));
        if let Some(queued) = queue {
            call.arg(lease_millis(queued.liveness))
                .arg(queued.place.as_str())
                .arg(if queued.keep { "1" } else { "0" })
                .arg(if queued.strict { "1" } else { "0" })
                .arg(if queued.refresh { "1" } else { "0" });
        }
        call.arg(now_micros());
        // lock.lua: > 0 ours, with that fence; < 0 held for another (-1 - reply) ms;
        // 0 free, but another fair waiter is first in line.
        let (reply, on) = self
            .acquisition("acquire", &call, |reply: &i64| *reply > 0)
            .await?;
        Ok(match u64::try_from(reply) {
            Ok(0) => Attempt::Held {
                ttl: None,
                queued: true,
            },
            Ok(fence) => {
                if self.wait_replicas > 0 {
                    self.replicated(key, LockKind::Mutex, token, on).await?;
                }
                Attempt::acquired(fence)
            }
            Err(_) => Attempt::Held {
                ttl: Some(Duration::from_millis(reply.unsigned_abs() - 1)),
                queued: queue.is_some(),
            },
        })
    }
}

/// Whether the server refused a request because the key holds another type (a mutex's
/// script meeting a semaphore's or read/write lock's hash).
fn wrong_type(error: &BackendError) -> bool {
    std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<redis::RedisError>())
        .is_some_and(|e| e.code() == Some("WRONGTYPE"))
}

impl Backend for RedisBackend {
    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(self.ping_server())
    }

    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            if !request.kind.is_mutex() {
                return self.acquire_shared(request).await;
            }
            match self.acquire_mutex(request).await {
                Err(error) if wrong_type(&error) => {
                    // A semaphore or read/write lock is there: a conflict, unless nothing in it
                    // is live any more (then it goes, and this attempt is made again).
                    let mut call = Call::new(lapse_shared_script(), 1);
                    call.arg(request.key);
                    let gone: i64 = self.call("acquire", call).await?;
                    if gone == 1 {
                        return self.acquire_mutex(request).await;
                    }
                    Ok(Attempt::Conflict(
                        "it is held as a semaphore or a read/write lock, and this acquisition \
                         asks for a mutex"
                            .to_owned(),
                    ))
                }
                attempt => attempt,
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            if !kind.is_mutex() {
                let mut call = Call::new(release_shared_script(), 1);
                call.arg(key)
                    .arg(token.as_str())
                    .arg(self.publish_command());
                let Sent {
                    reply, sent_again, ..
                } = self.request("release", &call, Repeat::Once).await?;
                if reply & 2 != 0 {
                    self.publish_denied(key);
                }
                return Released { reply, sent_again }.deleted();
            }
            self.release_mutex(key, token, self.announce)
                .await?
                .deleted()
        })
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a str,
        place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let mut call = Call::new(leave_script(), 3);
            call.arg(key)
                .arg(companion(&self.fair_prefix, key, "queue"))
                .arg(companion(&self.fair_prefix, key, "waiters"))
                .arg(place.as_str())
                .arg(self.publish_command());
            let reply: i64 = self.call("leave the queue", call).await?;
            if reply & 2 != 0 {
                self.publish_denied(key);
            }
            Ok(())
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let script = if kind.is_mutex() {
                extend_script()
            } else {
                extend_shared_script()
            };
            let mut call = Call::new(script, 1);
            call.arg(key).arg(token.as_str()).arg(lease_millis(lease));
            let extended: i64 = self.call("extend", call).await?;
            Ok(extended == 1)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            passes: true,
            wake_up: WakeUp::Named,
            ..Capabilities::default()
        }
    }

    fn pass<'a>(
        &'a self,
        key: &'a str,
        from: &'a Token,
        to: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        Box::pin(async move {
            let mut call = Call::new(pass_script(), 2);
            call.arg(key)
                .arg(self.fence_key(key))
                .arg(from.as_str())
                .arg(lock_value(to, &self.identity))
                .arg(lease_millis(lease))
                .arg(now_micros());
            // pass.lua: the new hold's fence, or 0 when `from` did not hold the key.
            let (fence, on) = self
                .acquisition("pass", &call, |fence: &u64| *fence > 0)
                .await?;
            if fence == 0 {
                return Ok(None);
            }
            if self.wait_replicas > 0 {
                self.replicated(key, LockKind::Mutex, to, on).await?;
            }
            Ok(Some(fence))
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let mut call = Call::new(inspect_script(), 2);
            call.arg(key)
                .arg(companion(&self.fair_prefix, key, "waiters"));
            let (value, pttl, waiters, kind, holds): (
                Option<String>,
                i64,
                u64,
                Option<String>,
                Option<Vec<String>>,
            ) = self.call("inspect", call).await?;
            let info = match kind {
                Some(kind) => read_shared(key, &kind, &holds.unwrap_or_default()),
                None => value.map(|value| read_value(key, &value)),
            };
            Ok(info.map(|mut info| {
                info.remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
                info.waiters = usize::try_from(waiters).ok();
                info
            }))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let pattern = format!("{}*", glob_escape(prefix));
            let keys = self.scan(&pattern).await?;
            Ok(keys.into_iter().filter(|k| !self.reserved(k)).collect())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let mut call = Call::new(force_script(), 3);
            call.arg(key)
                .arg(self.fence_key(key))
                .arg(companion(&self.fair_prefix, key, "queue"))
                .arg(self.publish_command())
                .arg(now_micros());
            let held: redis::Value = self
                .request("force release", &call, Repeat::Never)
                .await?
                .reply;
            Ok(match held {
                redis::Value::Array(parts) if parts.len() == 2 => {
                    let (kind, holds): (String, Vec<String>) =
                        redis::from_redis_value(redis::Value::Array(parts))
                            .map_err(|e| classify("force release", e.into()))?;
                    read_shared(key, &kind, &holds)
                }
                redis::Value::Nil => None,
                value => {
                    let value: String = redis::from_redis_value(value)
                        .map_err(|e| classify("force release", e.into()))?;
                    Some(read_value(key, &value))
                }
            })
        })
    }

    fn watching(&self, key: &str, _token: &Token, place: Option<&Token>) -> Option<Watch> {
        let notifier = self.notifier.as_ref()?;
        match place {
            Some(place) => notifier.watching(&self.wake_channel(key, place)),
            None => notifier.watching(key),
        }
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        _token: &'a Token,
        place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let notifier = self.notifier.as_ref()?;
            match place {
                Some(place) => notifier.watch(&self.wake_channel(key, place)).await,
                None => notifier.watch(key).await,
            }
        })
    }
}

/// Every `SCAN` page of one server, each request sent (and bounded) by `send`, which says
/// whether it was sent again on a connection made again, and on which connection: when a page
/// after the first was sent again, or came on another connection than the scan's first page
/// (Sentinel's connection replaced meanwhile), the scan starts over (a cursor of another
/// server, or of one restarted, skips keys), at most a few times. (A reconnection inside the
/// same redis-rs connection that no page of the scan saw fail keeps its serial: not seen.)
async fn scan_pages<F, Fut>(pattern: &str, mut send: F) -> Result<Vec<String>, BackendError>
where
    F: FnMut(redis::Cmd) -> Fut,
    Fut: std::future::Future<Output = Result<Sent<redis::Value>, BackendError>>,
{
    const STARTS: u32 = 3;
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    let mut starts = 1;
    // The connection of the scan's first page.
    let mut first_on = None;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let Sent {
            reply,
            sent_again,
            on,
        } = send(cmd).await?;
        if cursor == 0 {
            first_on = Some(on);
        } else if sent_again || first_on != Some(on) {
            if starts == STARTS {
                return Err(BackendError::new(format!(
                    "Redis list: the connection dropped during each of {STARTS} scans"
                )));
            }
            starts += 1;
            keys.clear();
            cursor = 0;
            continue;
        }
        let (next, batch): (u64, Vec<String>) =
            redis::from_redis_value(reply).map_err(|e| classify("list", e.into()))?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(keys);
        }
    }
}

/// The masters of a `CLUSTER NODES` reply that are not failing: `(host, port)`.
#[cfg(feature = "redis-cluster")]
fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let is_master = flags.split(',').any(|f| f == "master");
            let failing = flags.split(',').any(|f| f == "fail" || f == "fail?");
            if !is_master || failing {
                return None;
            }
            let address = address.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// Now, in µs since the Unix epoch: the time part of a hybrid fence, or RedLock's proposal.
pub(crate) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// CRC16-XMODEM of every byte value, built at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        #[allow(clippy::cast_possible_truncation)]
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A short hash tag that lands in `slot`: the first base-36 number, counting up, whose CRC16
/// falls in it. The table is built once, at a process's first acquisition (about 170 000 CRCs of
/// 1–4 bytes, written into fixed buffers: building a `String` per candidate made the first
/// acquisition cost 60 million instructions, about 20ms).
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<([u8; 4], u8)>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![([0u8; 4], 0u8); 16384];
        let mut missing = tags.len();
        let mut n: u32 = 0;
        while missing > 0 {
            let (digits, len) = base36(n);
            let s = usize::from(crc16(&digits[..usize::from(len)]) % 16384);
            if tags[s].1 == 0 {
                tags[s] = (digits, len);
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    let (digits, len) = &tags[usize::from(slot)];
    // Base-36 digits are ASCII.
    std::str::from_utf8(&digits[..usize::from(*len)]).unwrap_or("0")
}

/// `n` (below 36⁴) in base 36, lower case: its digits and how many there are.
fn base36(mut n: u32) -> ([u8; 4], u8) {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut reversed = [0u8; 4];
    let mut len = 0;
    loop {
        reversed[len] = DIGITS[(n % 36) as usize];
        len += 1;
        n /= 36;
        if n == 0 || len == 4 {
            break;
        }
    }
    let mut digits = [0u8; 4];
    for (i, d) in reversed[..len].iter().rev().enumerate() {
        digits[i] = *d;
    }
    (digits, u8::try_from(len).unwrap_or(4))
}

/// The Redis engines hand their URL to redis-rs without dlock's own options.
impl EngineUrl {
    /// The URL without the query parameters `names` (dlock's own options, which the engine's
    /// client must not see).
    pub(crate) fn without_params(&self, names: &[&str]) -> String {
        let url = self.as_str();
        let Some((base, query)) = url.split_once('?') else {
            return url.to_owned();
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| !names.contains(&pair.split_once('=').map_or(*pair, |(n, _)| n)))
            .collect();
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    }
}

/// The Redis engines with several servers build one node URL per host of their URL.
#[cfg(any(
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "redlock"
))]
impl crate::url::HostList<'_> {
    /// `redis://[userinfo@]host:port` (or `rediss://`) for each host, with `path` after it and
    /// the URL's query (`?protocol=resp3`, …), which every node's connection then reads.
    pub(crate) fn node_urls(&self, path: &str) -> Vec<String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = self.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let query = self.query.map(|q| format!("?{q}")).unwrap_or_default();
        self.hosts
            .iter()
            .map(|(host, port)| format!("{scheme}://{userinfo}{host}:{port}{path}{query}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// A scan page's reply: the next cursor and the keys.
    fn page(next: u64, keys: &[&str]) -> redis::Value {
        redis::Value::Array(vec![
            redis::Value::BulkString(next.to_string().into_bytes()),
            redis::Value::Array(
                keys.iter()
                    .map(|k| redis::Value::BulkString(k.as_bytes().to_vec()))
                    .collect(),
            ),
        ])
    }

    /// A scan starts over when a page after the first was sent again or came on another
    /// connection (its cursor may be another server's), keeping no key twice; it gives up
    /// after three starts. Pages: cursor 0 gives `a`, `b` and cursor 7; cursor 7 gives `c`.
    #[tokio::test]
    async fn a_scan_starts_over_when_its_connection_changed() {
        use super::{Sent, scan_pages};
        use std::sync::Mutex;
        // (sent again, connection) of each page, in turn; then (false, 1).
        let scan = |turns: Vec<(bool, u64)>| async move {
            let turns = Mutex::new(turns.into_iter());
            let sent = Mutex::new(0);
            let keys = scan_pages("*", |cmd| {
                *sent.lock().unwrap() += 1;
                let (sent_again, on) = turns.lock().unwrap().next().unwrap_or((false, 1));
                let first = matches!(cmd.args_iter().nth(1), Some(redis::Arg::Simple(b"0")));
                let reply = if first {
                    page(7, &["a", "b"])
                } else {
                    page(0, &["c"])
                };
                async move {
                    Ok(Sent {
                        reply,
                        sent_again,
                        on,
                    })
                }
            })
            .await;
            (keys.map_err(|e| e.to_string()), sent.into_inner().unwrap())
        };
        let all = Ok(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        assert_eq!(scan(vec![]).await, (all.clone(), 2));
        // The first page sent again: nothing to start over.
        assert_eq!(scan(vec![(true, 1)]).await, (all.clone(), 2));
        // The second page sent again, or on another connection: started over.
        assert_eq!(scan(vec![(false, 1), (true, 2)]).await, (all.clone(), 4));
        assert_eq!(
            scan(vec![(false, 1), (false, 2), (false, 2), (false, 2)]).await,
            (all, 4)
        );
        let (keys, sent) = scan([(false, 1), (true, 1)].repeat(3)).await;
        assert_eq!(sent, 6);
        assert!(keys.unwrap_err().contains("each of 3 scans"));
    }

    /// `DLOCK_REDIS_WAIT`: a `WAIT` that finds the locker's connection made again by redis-rs
    /// since the acquisition (another request failed on the dropped one and reconnected the
    /// same `ConnectionManager`) counts none of the acquisition's writes and answers at once
    /// with every replica it has: the acquisition is undone, not confirmed. The replica is
    /// stopped (`SIGSTOP`), so a `WAIT` on the acquisition's own connection answers 0 (checked
    /// first). Before, `WAIT` went on whatever connection the manager had (its serial
    /// unchanged): on Redis 7.2 and later it answered 1 there; on 7.0 (this machine's), where
    /// any command moves a connection's write offset to the master's, it answered 0, so here
    /// the test tells the identity check by its error alone.
    #[tokio::test]
    async fn a_wait_on_a_connection_made_again_since_the_acquisition_confirms_nothing() {
        use test_server::Server;
        static SET: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new("redis.call('SET', KEYS[1], ARGV[1], 'PX', 30000) return 1")
        });
        let (master, replica) = (Server::start(), Server::start());
        let admin = |port: u16| {
            redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
                .unwrap()
        };
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.1)
            .exec(&mut admin(replica.1))
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Online for the master, and done loading the sync on the replica (until then it
            // acknowledges nothing).
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut admin(master.1))
                .unwrap();
            let replica_info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut admin(replica.1))
                .unwrap();
            if info.contains("state=online")
                && replica_info.contains("master_link_status:up")
                && replica_info.contains("master_sync_in_progress:0")
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no replica online: {info}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let url = EngineUrl::checked(&format!("redis://127.0.0.1:{}?wait=1", master.1), "redis");
        let settings = Settings {
            // Loaded CI machines: a live replica's acknowledgement must come within it.
            request_timeout: Duration::from_secs(2),
            ..Settings::default()
        };
        let backend = RedisBackend::from_url(&url, &settings).unwrap();
        let (key, token) = ("dlock:wait-on-another", Token::generate().unwrap());
        let mut call = Call::new(&SET, 1);
        call.arg(key).arg(token.as_str());
        let write = || backend.acquisition("acquire", &call, |written: &i64| *written > 0);
        let (_, on) = write().await.unwrap();
        let waited = backend
            .wait_for_replicas(key, LockKind::Mutex, &token, on)
            .await;
        assert!(waited.is_ok(), "the replica acknowledges: {waited:?}");

        let signal = |signal: &str| {
            let sent = std::process::Command::new("kill")
                .args([signal, &replica.0.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
        };
        signal("-STOP");
        let (_, on) = write().await.unwrap();
        let waited = backend
            .wait_for_replicas(key, LockKind::Mutex, &token, on)
            .await;
        let error = waited
            .expect_err("a stopped replica acknowledges nothing")
            .to_string();
        assert!(error.contains("acknowledged by 0"), "{error}");

        let (_, on) = write().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut admin(master.1))
            .unwrap();
        assert!(killed >= 1, "the locker's connection is killed");
        // Fails on the dropped connection, and redis-rs makes it again.
        backend.ping_server().await.unwrap();
        let waited = backend
            .wait_for_replicas(key, LockKind::Mutex, &token, on)
            .await;
        signal("-CONT");
        let error = waited
            .expect_err("a WAIT on another connection confirms nothing")
            .to_string();
        assert!(error.contains("another connection"), "{error}");
        let left: Option<String> = redis::cmd("GET")
            .arg(key)
            .query(&mut admin(master.1))
            .unwrap();
        assert_eq!(left, None, "the acquisition is undone");

        // A user who may not ask `CLIENT INFO`: refused at once, saying what to grant, and
        // the lock undone.
        redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "no-info",
                "on",
                ">pw",
                "~*",
                "&*",
                "+@all",
                "-client|info",
            ])
            .exec(&mut admin(master.1))
            .unwrap();
        let url = format!("redis://no-info:pw@127.0.0.1:{}?wait=1", master.1);
        let backend =
            RedisBackend::from_url(&EngineUrl::checked(&url, "redis"), &settings).unwrap();
        let key = "dlock:wait-no-info";
        let attempt = || {
            backend.acquire(Request {
                key,
                token: &token,
                lease: Duration::from_secs(30),
                kind: LockKind::Mutex,
                liveness: Duration::from_secs(1),
                queue: None,
            })
        };
        // Held by another, and free: refused either way, not left to wait for the key.
        redis::cmd("SET")
            .arg(&[key, "another-holder", "PX", "30000"])
            .exec(&mut admin(master.1))
            .unwrap();
        let error = attempt().await.expect_err("refused while held");
        assert!(error.is_refused(), "{error:?}");
        redis::cmd("DEL")
            .arg(key)
            .exec(&mut admin(master.1))
            .unwrap();
        let error = attempt().await.expect_err("refused");
        assert!(error.is_refused(), "{error:?}");
        assert!(error.to_string().contains("+client|info"), "{error}");
        assert!(!error.to_string().contains("pw"), "{error}");
        let left: Option<String> = redis::cmd("GET")
            .arg(key)
            .query(&mut admin(master.1))
            .unwrap();
        assert_eq!(left, None, "the acquisition is undone");
    }

    #[test]
    fn options_can_be_left_out_of_the_url() {
        let url = EngineUrl::checked("redis://h:1?a=1&wait=2&b", "redis");
        assert_eq!(url.without_params(&["wait"]), "redis://h:1?a=1&b");
        assert_eq!(url.without_params(&["a", "wait", "b"]), "redis://h:1");
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn every_node_url_keeps_the_path_and_the_query() {
        let url = "rediss+cluster://app:p@ss/w,rd@h1:7000,h2:7001/?x=1";
        let hosts = crate::url::HostList::parse("X", url, "").unwrap();
        let nodes = hosts.node_urls("/0");
        assert!(
            nodes.iter().all(|node| node.ends_with("/0?x=1")),
            "the query reaches every node: {nodes:?}"
        );
    }

    use super::*;

    /// RedLock's releases (the masters but the key's first), first-master releases and
    /// undoings send one script, whichever came first loads it on every master: a script a
    /// master meets first while it is stopped answers `NOSCRIPT` after the client gave up, and
    /// what it carried never runs. They differ by their number of keys alone.
    #[test]
    fn redlock_releases_and_undoings_share_one_script() {
        let (all, one_key) = release_script(Announce::Always, "PUBLISH");
        let (first, two_keys) = release_script(Announce::Never, "PUBLISH");
        assert!(std::ptr::eq(all, first));
        assert_eq!(all.get_hash(), first.get_hash());
        assert_eq!((one_key, two_keys), (1, 2));
        // One server's and a Cluster's releases have their way written in: other scripts.
        let (single, _) = release_script(Announce::WhenWaited, "PUBLISH");
        let (cluster, _) = release_script(Announce::WhenWaited, "SPUBLISH");
        assert_ne!(single.get_hash(), all.get_hash());
        assert_ne!(single.get_hash(), cluster.get_hash());
    }

    #[test]
    fn slots_match_redis_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"{}x"), crc16(b"{}x") % 16384);
    }

    #[test]
    fn companions_share_the_lock_key_slot() {
        for (prefix, key) in [
            ("dlock:", "dlock:order:42"),
            ("dlock:", "dlock:{user1}:cart"),
            ("dlock:", "dlock:{}:x"),
            ("", "a{b"),
            ("{app}:", "{app}:order:1"),
        ] {
            let queue = companion(&format!("{prefix}{FAIR_PREFIX}"), key, "queue").to_string();
            assert_eq!(slot(queue.as_bytes()), slot(key.as_bytes()), "{key}");
        }
        assert_eq!(
            companion("dlock:__fair:", "dlock:order:42", "queue").to_string(),
            "dlock:__fair:{dlock:order:42}:queue"
        );
    }

    #[test]
    fn base36_counts_as_before() {
        let of = |n| {
            let (digits, len) = base36(n);
            String::from_utf8(digits[..usize::from(len)].to_vec()).unwrap()
        };
        assert_eq!(of(0), "0");
        assert_eq!(of(35), "z");
        assert_eq!(of(36), "10");
        assert_eq!(of(36 * 36 * 36 * 36 - 1), "zzzz");
        // The tags name the fencing counters (`dlock:__fence:{tag}`): the table is the one the
        // former `String` per candidate built.
        let mut former = vec![String::new(); 16384];
        let (mut n, mut missing): (u32, usize) = (0, 16384);
        while missing > 0 {
            // The former `to_base36`, as it was.
            let tag = {
                let (mut rest, mut digits) = (n, Vec::new());
                loop {
                    digits.push(char::from_digit(rest % 36, 36).unwrap());
                    rest /= 36;
                    if rest == 0 {
                        break;
                    }
                }
                digits.iter().rev().collect::<String>()
            };
            let s = usize::from(crc16(tag.as_bytes()) % 16384);
            if former[s].is_empty() {
                former[s] = tag;
                missing -= 1;
            }
            n += 1;
        }
        for (slot, tag) in former.iter().enumerate() {
            assert_eq!(slot_tag(u16::try_from(slot).unwrap()), tag);
        }
    }

    #[test]
    fn every_slot_has_a_tag_in_it() {
        for s in [0u16, 1, 5000, 12182, 16383] {
            let tag = slot_tag(s);
            assert_eq!(slot(format!("x{{{tag}}}").as_bytes()), s);
        }
    }
}
