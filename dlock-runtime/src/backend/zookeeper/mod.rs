//! ZooKeeper, with Curator's lock recipes: `InterProcessMutex` (an ephemeral sequential node per
//! holder or waiter, the lowest one holds, each waiter watches only its predecessor),
//! `InterProcessSemaphoreV2` for semaphores and `InterProcessReadWriteLock` for read/write locks
//! (`shared.rs`; the node names in `layout.rs`).
//!
//! - **Layout**: the lock `<prefix><key>` is the node `/<prefix>/<key>` (under the URL's chroot),
//!   a container node the server removes once its last child is gone. The prefix is the path
//!   of the locks' parent node (`dlock:` gives `/dlock:/<key>`; `DLOCK_KEY_PREFIX=locks/` gives
//!   `/locks/<key>`, as a Curator user would write it; parents are containers too), so that the
//!   servers keep one set of per-namespace metrics, not one per key ever locked (see
//!   [`path_of`]); in the key, `%`, `/`, and the characters ZooKeeper refuses in
//!   a path (NUL, control characters, …) are written `%XX` (their UTF-8 bytes), and a last
//!   segment that would read `.` or `..` has its dots written `%2E`, so a key is always exactly
//!   one node: `a` and `a/b` are two independent locks. Its children are Curator's protected
//!   nodes, `_c_<uuid>-lock-<sequence>`, so Curator (and `zookeeper-client`'s `LockClient` with
//!   `LockPrefix::new_curator(dir, "lock-")`) and dlock exclude each other on the same path.
//! - **Semaphore** (`InterProcessSemaphoreV2`): the lock node has two children, `locks` (an
//!   internal mutex of `_c_<uuid>-lock-<sequence>` nodes) and `leases` (one
//!   `_c_<uuid>-lease-<sequence>` node per permit held). A permit's acquisition takes its place
//!   in `locks`; first there, it reads the leases and, when fewer than the permits are held,
//!   makes its lease and deletes its node in `locks` in one transaction, or else keeps its place
//!   and sets a children-watch on `leases`. dlock records `permits=N` as the data of `leases`
//!   (Curator leaves it empty: nothing to check then) and refuses another count while a lease is
//!   held.
//! - **Read/write lock** (`InterProcessReadWriteLock`): readers `_c_<uuid>-__READ__<sequence>`
//!   and writers `_c_<uuid>-__WRIT__<sequence>` directly under the lock node, in one order by
//!   sequence. A writer holds when its node is first of all, a reader when no writer's is ahead
//!   of it; a waiter watches the node ahead of it (a reader, the last writer ahead). A waiting
//!   writer keeps every later reader out, and the line is first come first served.
//! - **Kinds do not mix**: the first look at the line after an acquisition's node is made
//!   refuses it (`Attempt::Conflict`, its node deleted) when the key holds another kind: mutex
//!   nodes ahead of a reader's or writer's, or readers' and writers' ahead of a mutex's (of two
//!   made at once, the later refuses); nodes in a semaphore's `locks` or `leases`; for a
//!   permit, any mutex, reader or writer node. Empty `locks` and `leases` containers (a
//!   semaphore's leftovers, removed by the server later) are no conflict. A mutex's look sends
//!   nothing more unless such containers are there.
//! - **Holder**: each node's data is its holder's record (`owner=… host=… pid=…`; the time is
//!   the node's `ctime`, when it joined the line); Curator writes its client's address there.
//! - **Protected create**: the uuid is chosen before the create and kept for the acquisition;
//!   a create whose reply was lost is found again by its uuid among the children (and used, or
//!   deleted when the wait gives up), so a retry never leaves a second node in line.
//! - **Lease**: the session is the server-side lease: a holder's node goes when its session
//!   expires (a crashed or paused process). `expire` also bounds the hold on the client: when it
//!   runs out, the node is deleted and the hold is lost; a renewal (`expire = "auto"`) pushes
//!   that deadline on while the node is still this session's. A connection lost and found again
//!   within the session timeout loses nothing (Curator's SUSPENDED); the session's expiry makes
//!   every hold of it lost at once (Curator's LOST), and the next request opens a new session. A
//!   connection still lost 0.45 of the session timeout after it was found lost counts as
//!   expired (before the ensemble can have expired it).
//! - **Fence**: the parent's `pzxid` (the zxid of the last change to the line) read in the same
//!   reply that shows the holder's node first. The next holder is first only after this one's
//!   node is deleted, a later change, so fences strictly increase per key (concurrent readers
//!   may share one; a writer's is above every reader's before it). A permit's is the zxid of
//!   the transaction that made its lease (its `czxid`): permits are granted one at a time, in
//!   the internal line's order, so theirs strictly increase too. A retry of an acquisition
//!   already granted re-writes its node (its lease) and takes that write's zxid instead.
//! - **Waiting**: a waiter sets an exists-watch on the node just before its own (its
//!   predecessor, as its attempt's look at the line found it) and is woken when that node goes:
//!   no herd, first come first served by sequence. The attempt it then makes looks at the line
//!   again and, still behind (the predecessor was a waiter that left), watches the new one. A
//!   permit's acquisition first in its internal line watches the leases instead. Nodes deleted
//!   by hand are noticed at the next renewal or release of their holder.
//! - **Give-up**: a wait that gives up (or is dropped) deletes its node in line, or its lease,
//!   and what a create (or a grant's transaction) whose reply was lost made, found by its uuid.

mod layout;
mod shared;

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

use self::layout::{LEASE_NAME, LEASES, LOCK_NAME, LOCKS, Mark, READ_NAME, WRITE_NAME};

use super::api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, EngineOption, FairOrder, NextInLine, Request,
    Token, WakeUp, Watch, option,
};
use super::deadlines::{Deadlines, Due, Scheduled, take_due};
use crate::lease::{LossAlarm, fire_held, loss_signal};
use crate::{
    LockError, LockInfo, LockKind,
    config::Settings,
    error::BackendError,
    holder::{self, Identity},
    url::EngineUrl,
};

/// ZooKeeper: `zk://h1:p1,h2:p2[/chroot]`.
pub(super) const BUILT: Built = Built {
    check: |var, url| connect_string(var, url).map(drop),
    build: |url, settings| Ok(Arc::new(ZooKeeperBackend::from_url(url, settings)?)),
    options: &[SESSION_TIMEOUT],
};

/// `session_timeout=10s` (alias `DLOCK_ZK_SESSION_TIMEOUT`): the session timeout asked of
/// ZooKeeper, how long a crashed or paused holder keeps its lock at most, and how long a lost
/// connection may last without losing anything.
const SESSION_TIMEOUT: EngineOption = EngineOption {
    name: "session_timeout",
    var: "DLOCK_ZK_SESSION_TIMEOUT",
    example: "6s",
    check: |value| parse_session_timeout(value).map(drop),
};

/// The default session timeout: 10s rides out a leader election (a few seconds) and sits inside
/// the servers' default bounds (4s to 40s with the default `tickTime` of 2s); Curator's 60s
/// keeps a dead holder's lock six times as long.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

const FORM: &str = "zk://h1:p1,h2:p2[/chroot][?session_timeout=10s]";

fn parse_session_timeout(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err("expected a positive duration like `10s`".to_owned()),
    }
}

/// The node path of the full lock key `key` whose first `prefix_len` bytes are the prefix: `/`,
/// the prefix (the parent node of every lock: a `/` follows it unless it ends with one), then
/// the key with `%`, `/` and the characters ZooKeeper refuses encoded. An empty prefix puts the
/// lock at the root.
///
/// Every lock under one parent matters to the servers: ZooKeeper (≥ 3.6) keeps read and write
/// metrics per top-level node (`read_per_namespace`, `write_per_namespace`) and never drops
/// them, so locks at the root would cost every server memory for each key ever locked.
pub(crate) fn path_of(prefix_len: usize, key: &str) -> String {
    let mut path = encoded(prefix_len, key);
    let last = path.rfind('/').map_or(0, |i| i + 1);
    if matches!(&path[last..], "." | "..") {
        let dots = path.len() - last;
        path.truncate(last);
        path.push_str(&"%2E".repeat(dots));
    }
    path
}

/// [`path_of`] without its rule for a last segment of dots: the start of the paths of the keys
/// that begin with `key` (a listing's, where `.` may begin `.x`).
fn encoded(prefix_len: usize, key: &str) -> String {
    let split = prefix_len.min(key.len());
    let (prefix, name) = key.split_at(if key.is_char_boundary(split) {
        split
    } else {
        0
    });
    let mut path = String::with_capacity(key.len() + 8);
    path.push('/');
    path.push_str(prefix);
    path.push_str(after_prefix(prefix));
    let mut buf = [0u8; 4];
    for c in name.chars() {
        if c == '%' || c == '/' || refused_char(c) {
            for b in c.encode_utf8(&mut buf).bytes() {
                path.push_str(&format!("%{b:02X}"));
            }
        } else {
            path.push(c);
        }
    }
    path
}

/// Where the lock nodes of the keys beginning with `prefix` (a full key's beginning) are: the
/// path of the node to list (`""` for the root, so that `{parent}/{child}` is a child's path)
/// and what their names begin with.
fn list_target(prefix_len: usize, prefix: &str) -> (String, String) {
    let path = encoded(prefix_len, prefix);
    let (parent, start) = path.rsplit_once('/').unwrap_or(("", &path));
    (parent.to_owned(), start.to_owned())
}

/// The requests `mkdir` may make for `dir`: one per level.
fn levels(dir: &str) -> u32 {
    u32::try_from(dir.matches('/').count()).unwrap_or(u32::MAX)
}

/// The full lock key of the node path `path` (see [`path_of`]): its name decoded.
fn key_of_path(prefix_len: usize, path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let (prefix, name) = rest.split_at_checked(prefix_len)?;
    let name = name.strip_prefix(after_prefix(prefix))?;
    Some(format!("{prefix}{}", holder::decode(name)?))
}

/// What separates the prefix from the key's name in a node path: `/` (the prefix is the locks'
/// parent node), nothing when the prefix is empty or ends with `/` already.
fn after_prefix(prefix: &str) -> &'static str {
    if prefix.is_empty() || prefix.ends_with('/') {
        ""
    } else {
        "/"
    }
}

/// The holder a node's data records, with its creation time (ms since the epoch).
fn read_holder(data: &[u8], ctime: i64) -> Option<crate::Holder> {
    let mut holder = holder::parse(std::str::from_utf8(data).ok()?)?;
    holder.since = u64::try_from(ctime)
        .ok()
        .map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms));
    Some(holder)
}

/// The characters ZooKeeper refuses anywhere in a path. Its paths are Java strings: a
/// character beyond U+FFFF is a surrogate pair there, and surrogates are refused.
fn refused_char(c: char) -> bool {
    matches!(u32::from(c), 0x0000..=0x001f | 0x007f..=0x009f | 0xd800..=0xf8ff | 0xfff0..)
}

/// Why `prefix` cannot name the parent node of the locks: empty, `.` or `..` segments, refused
/// characters, or ZooKeeper's own `/zookeeper` subtree. An empty prefix is allowed (locks at
/// the root).
fn prefix_error(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return None;
    }
    let parent = prefix.strip_suffix('/').unwrap_or(prefix);
    let segments: Vec<&str> = parent.split('/').collect();
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Some(
            "the prefix is the path of the locks' parent node, whose segments may not be \
             empty, `.` or `..` (write `locks/`, not `/locks/` or `locks//`)"
                .to_owned(),
        );
    }
    if prefix.chars().any(refused_char) {
        return Some("the prefix holds a character ZooKeeper refuses in a path".to_owned());
    }
    if segments[0] == "zookeeper" {
        return Some("`/zookeeper` is ZooKeeper's own subtree".to_owned());
    }
    None
}

/// A task aborted when this is dropped.
#[derive(Debug)]
struct AbortOnDrop(Option<JoinHandle<()>>);

impl AbortOnDrop {
    fn new(task: JoinHandle<()>) -> Self {
        Self(Some(task))
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// One session: the client, a number telling it from the sessions before it, and whether it
/// has ended (expired, closed, or refused).
#[derive(Clone)]
struct Session {
    /// Shared: a `Client`'s clone copies its session's password.
    client: Arc<Client>,
    epoch: u64,
    ended: watch::Receiver<bool>,
}

impl Session {
    fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Resolves when the session has ended.
    async fn end(mut self) {
        let _ = self.ended.wait_for(|ended| *ended).await;
    }
}

/// The connection string, one session at a time, and the bounds.
struct Conn {
    /// `h1:p1,h2:p2[/chroot]`, as `zookeeper-client` reads it.
    connect: String,
    session_timeout: Duration,
    request_timeout: Duration,
    current: Mutex<Option<Session>>,
    connecting: tokio::sync::Mutex<u64>,
    /// The engine's acquisitions: the holds of a session that ends are lost.
    entries: std::sync::Weak<Mutex<HashMap<String, Entry>>>,
}

impl Conn {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live session, opened on first use and again after one ended.
    async fn session(self: &Arc<Self>) -> Result<Session, BackendError> {
        if let Some(session) = self.current().as_ref().filter(|s| !s.is_ended()) {
            return Ok(session.clone());
        }
        // Boxed: inline, the connection's future made every request's future 2.3 KiB, too
        // large for the allocator's per-thread cache, where a request with a session is one
        // lookup.
        Box::pin(self.open_session()).await
    }

    /// A new session, unless another request opened one meanwhile.
    async fn open_session(self: &Arc<Self>) -> Result<Session, BackendError> {
        let mut epochs = self.connecting.lock().await;
        if let Some(session) = self.current().as_ref().filter(|s| !s.is_ended()) {
            return Ok(session.clone());
        }
        let connect = Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_fail_eagerly()
            .connect(&self.connect);
        // Connecting is a request like the others: bounded by the request timeout, but never
        // less than a second (a session handshake against a busy ensemble).
        let bound = self.request_timeout.max(Duration::from_secs(1));
        let client = match tokio::time::timeout(bound, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(error("open a session", &e)),
            Err(_) => {
                return Err(BackendError::new(format!(
                    "zookeeper: no session within {bound:?} (every server down or unreachable?)"
                )));
            }
        };
        *epochs += 1;
        let (ended_tx, ended) = watch::channel(false);
        // Curator's LOST: the ensemble expires a session it has not heard from for the session
        // timeout. A connection is found lost at most 0.45 of it after the last reply
        // (`zookeeper-client`'s connection timeout, 2/5 of it, checked every 1/20), so one
        // still lost 0.45 of it later counts as expired, before the servers can have expired
        // it (0.9 of it at most since the last reply). The client would wait 7/5 of it.
        let grace = client.session_timeout().mul_f64(0.45);
        tokio::spawn(watch_session(
            client.state_watcher(),
            grace,
            ended_tx,
            Arc::downgrade(self),
            *epochs,
            self.entries.clone(),
        ));
        let session = Session {
            client: Arc::new(client),
            epoch: *epochs,
            ended,
        };
        *self.current() = Some(session.clone());
        Ok(session)
    }

    /// One request, bounded by the request timeout.
    async fn call<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, Failure> {
        self.call_n(what, 1, request).await
    }

    /// A call that makes up to `requests` requests in turn (`mkdir`: one per level), bounded
    /// by as many request timeouts.
    async fn call_n<T>(
        &self,
        what: &str,
        requests: u32,
        request: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.request_timeout * requests.max(1), request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(Failure::Zk(e, what.to_owned())),
            Err(_) => Err(Failure::Timeout(what.to_owned())),
        }
    }

    fn timeout_error(&self, what: &str) -> BackendError {
        BackendError::new(format!(
            "zookeeper: no reply within the request timeout ({:?}) to {what}",
            self.request_timeout
        ))
    }
}

/// A failed request: the server's answer, or none in time.
enum Failure {
    Zk(zookeeper_client::Error, String),
    Timeout(String),
}

impl Failure {
    fn zk(&self) -> Option<&zookeeper_client::Error> {
        match self {
            Self::Zk(e, _) => Some(e),
            Self::Timeout(_) => None,
        }
    }

    fn into_error(self, conn: &Conn) -> BackendError {
        match self {
            Self::Zk(e, what) => error(&what, &e),
            Self::Timeout(what) => conn.timeout_error(&what),
        }
    }
}

/// A backend error for a failed `what`; permissions are refusals.
fn error(what: &str, e: &zookeeper_client::Error) -> BackendError {
    use zookeeper_client::Error as E;
    let error = BackendError::new(format!("zookeeper: could not {what}: {e}"));
    if matches!(e, E::NoAuth | E::AuthFailed | E::InvalidAcl) {
        error.refused()
    } else {
        error
    }
}

/// One acquisition's presence in ZooKeeper.
#[derive(Debug)]
struct Entry {
    /// The lock node.
    root: Arc<str>,
    /// The line its node is in: the lock node, or a semaphore's `locks` (its internal mutex).
    dir: Arc<str>,
    /// `_c_<uuid>-lock-` (`-__READ__`, `-__WRIT__`): the protected prefix of its node.
    protected: Arc<str>,
    /// Its node's name in the line, once a reply (or a search by uuid) told it. A permit's
    /// node goes with its grant.
    node: Option<String>,
    /// A semaphore's lease.
    lease: Option<LeaseNode>,
    /// The session that created it.
    epoch: u64,
    /// An attempt returned it as held.
    granted: bool,
    /// A look at the line found its node and no lock of another kind on the key.
    checked: bool,
    /// While held: the client-side end of the hold in the engine's clock (moved on by
    /// renewals), when the node is deleted.
    expiry: Option<Scheduled<String>>,
    /// While held: fired when the hold is lost (its session ended, or its `expire` ran out).
    alarm: Option<LossAlarm>,
    /// While it waits: what it waits for, as the last look at the line found it.
    waits_on: Option<WaitOn>,
    /// While it waits with a wake-up ([`Backend::watch`]): the wake-up, and the watch that
    /// rings it.
    waiting: Option<Waiting>,
}

impl Entry {
    /// The node that holds, once known: a semaphore's lease, else its node in line.
    fn held_path(&self) -> Option<String> {
        match &self.lease {
            Some(lease) => Some(format!("{}/{LEASES}/{}", self.root, lease.node.as_ref()?)),
            None => Some(format!("{}/{}", self.dir, self.node.as_ref()?)),
        }
    }
}

/// A semaphore acquisition's lease, `_c_<uuid>-lease-<sequence>` in `leases`.
#[derive(Debug)]
struct LeaseNode {
    /// Its protected prefix, `_c_<uuid>-lease-`.
    protected: String,
    /// Its name, once the grant's reply (or a search by uuid) told it.
    node: Option<String>,
    /// The transaction that creates it was sent and its reply lost: it may exist.
    sent: bool,
}

/// What a waiter waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WaitOn {
    /// The deletion of this node, the one ahead of its own (an exists-watch).
    Node(String),
    /// Fewer than `permits` leases under `path`: a semaphore's first in its internal line (a
    /// children-watch).
    Leases { path: String, permits: usize },
}

/// A waiter's wake-up: a watch on what it waits for, and what it found.
#[derive(Debug)]
struct Waiting {
    notify: Arc<Notify>,
    /// What the watch is on (none yet: a placeholder while it is being armed).
    on: Option<WaitOn>,
    /// The watch fired (what it is on changed), failed, or the session ended: the next
    /// attempt must look at the line.
    rang: Arc<std::sync::atomic::AtomicBool>,
    /// The next attempt may answer from the watch alone (once per watch: the attempt the
    /// waiting loop makes right after arming it).
    quiet: bool,
    _task: AbortOnDrop,
}

type Entries = Arc<Mutex<HashMap<String, Entry>>>;

/// The ZooKeeper engine.
pub(crate) struct ZooKeeperBackend {
    conn: Arc<Conn>,
    entries: Entries,
    /// The holds' `expire` on the client: when it passes, the node is deleted.
    deadlines: Deadlines<String>,
    prefix_len: usize,
    /// Who this locker is: each node's data.
    identity: Identity,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("connect", &self.conn.connect)
            .field("session_timeout", &self.conn.session_timeout)
            .field("request_timeout", &self.conn.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What an acquisition's entry says of its place in line, for its next attempt.
struct Known {
    /// The lock node.
    root: Arc<str>,
    /// The line its node is in (see [`Entry::dir`]).
    dir: Arc<str>,
    /// Its protected prefix, `_c_<uuid>-lock-` (`-__READ__`, `-__WRIT__`).
    protected: Arc<str>,
    /// Its node, once known.
    node: Option<String>,
    /// An attempt granted it.
    granted: bool,
    /// A look found no lock of another kind on the key.
    checked: bool,
    /// The entry was there before this attempt (a create whose reply was lost may have made a
    /// node).
    was_known: bool,
}

/// A node to delete: known by its path, or by its protected prefix under `dir` (a create whose
/// reply was lost).
enum Target {
    Node(String),
    Protected { dir: Arc<str>, protected: Arc<str> },
}

/// What one look at the line found.
enum Place {
    /// First, with this fence.
    First(u64),
    /// Behind: what to wait for.
    Behind(WaitOn),
    /// The node is not in the line any more (its session ended, or it was deleted).
    Gone,
    /// The key is held as another kind of lock: which.
    Conflict(String),
}

impl ZooKeeperBackend {
    pub(crate) fn from_url(url: &EngineUrl, settings: &Settings) -> Result<Self, LockError> {
        let connect = connect_string("DLOCK_URL", url.as_str())?;
        let session_timeout = match option(url, settings, SESSION_TIMEOUT.name) {
            Some((value, from)) => parse_session_timeout(value)
                .map_err(|why| LockError::config(format!("{from}: {why}")))?,
            None => DEFAULT_SESSION_TIMEOUT,
        };
        if let Some(why) = prefix_error(&settings.key_prefix) {
            return Err(LockError::config(format!(
                "DLOCK_KEY_PREFIX: on ZooKeeper, {why}"
            )));
        }
        let entries = Entries::default();
        let conn = Arc::new(Conn {
            connect,
            session_timeout,
            request_timeout: settings.request_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
            entries: Arc::downgrade(&entries),
        });
        let deadlines = Deadlines::new(Box::new({
            let (conn, entries) = (conn.clone(), entries.clone());
            move |due, token: String| expire(&conn, &entries, due, &token)
        }));
        Ok(Self {
            conn,
            entries,
            deadlines,
            prefix_len: settings.key_prefix.len(),
            identity: settings.identity.clone(),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The acquisition's entry, made when it has none: its lock node, its line and protected
    /// prefix (by its kind), its node once known, and whether an attempt granted it. `None`
    /// when its session ended (its node went with it): the entry is dropped, to join again.
    fn entry_for(
        &self,
        session: &Session,
        request: &Request<'_>,
    ) -> Result<Option<Known>, BackendError> {
        let token = request.token;
        let known = self.entries().get(&token.0).map(|e| {
            let known = Known {
                root: e.root.clone(),
                dir: e.dir.clone(),
                protected: e.protected.clone(),
                node: e.node.clone(),
                granted: e.granted,
                checked: e.checked,
                was_known: true,
            };
            (known, e.epoch)
        });
        if let Some((known, epoch)) = known {
            if epoch == session.epoch {
                return Ok(Some(known));
            }
            self.entries().remove(&token.0);
            return Ok(None);
        }
        // Shared by the entry and each attempt's copy of what it knows: a clone is a count.
        let root: Arc<str> = path_of(self.prefix_len, request.key).into();
        let (dir, lease) = match request.kind {
            LockKind::Semaphore { .. } => (
                Arc::from(format!("{root}/{LOCKS}")),
                Some(LeaseNode {
                    protected: layout::protected_prefix(LEASE_NAME)?,
                    node: None,
                    sent: false,
                }),
            ),
            _ => (root.clone(), None),
        };
        let protected: Arc<str> = layout::protected_prefix(match request.kind {
            LockKind::Read => READ_NAME,
            LockKind::Write => WRITE_NAME,
            _ => LOCK_NAME,
        })?
        .into();
        self.entries().insert(
            token.0.clone(),
            Entry {
                root: root.clone(),
                dir: dir.clone(),
                protected: protected.clone(),
                node: None,
                lease,
                epoch: session.epoch,
                granted: false,
                checked: false,
                expiry: None,
                alarm: None,
                waits_on: None,
                waiting: None,
            },
        );
        Ok(Some(Known {
            root,
            dir,
            protected,
            node: None,
            granted: false,
            checked: false,
            was_known: false,
        }))
    }

    /// The acquisition's node in line: the one it has, one a create whose reply was lost made
    /// (found by its uuid, Curator's protected mode), or a new one. `None` when it must start
    /// again (its session ended).
    async fn node_in_line(
        &self,
        session: &Session,
        token: &Token,
        known: &Known,
    ) -> Result<Option<String>, BackendError> {
        if let Some(node) = &known.node {
            return Ok(Some(node.clone()));
        }
        let found = if known.was_known {
            self.find(session, &known.dir, &known.protected).await?
        } else {
            None
        };
        match found {
            Some(node) => {
                if let Some(entry) = self.entries().get_mut(&token.0) {
                    entry.node = Some(node.clone());
                }
                Ok(Some(node))
            }
            None => {
                self.enter(session, token, &known.dir, &known.protected)
                    .await
            }
        }
    }

    /// One look at where the acquisition stands, its node put in line first when it has none:
    /// a permit's in its semaphore's internal line and leases, a mutex's, a reader's or a
    /// writer's in the lock node's line. A grant known already is renewed (a new fence).
    async fn look(
        &self,
        session: &Session,
        request: &Request<'_>,
        known: &Known,
    ) -> Result<Place, BackendError> {
        let token = request.token;
        if known.granted && matches!(request.kind, LockKind::Semaphore { .. }) {
            return self.renew_lease(session, token).await;
        }
        let Some(node) = self.node_in_line(session, token, known).await? else {
            return Ok(Place::Gone);
        };
        match request.kind {
            LockKind::Semaphore { permits } => {
                self.permit_place(session, token, known, &node, permits)
                    .await
            }
            kind => self.place(session, token, known, &node, kind).await,
        }
    }

    /// Creates the entry's node (or finds the one an earlier create with a lost reply made):
    /// its name, or `None` when the session ended meanwhile (start again).
    async fn enter(
        &self,
        session: &Session,
        token: &Token,
        dir: &str,
        protected: &str,
    ) -> Result<Option<String>, BackendError> {
        let client = &session.client;
        let acls = Acls::anyone_all();
        let lock = CreateMode::EphemeralSequential.with_acls(acls);
        let container = CreateMode::Container.with_acls(acls);
        let prefix = format!("{dir}/{protected}");
        // The parent may be missing (first use) or removed as an empty container between our
        // creating it and our child's create: a few rounds, then an error.
        for _ in 0..4 {
            match self
                .conn
                .call(
                    "join the lock's line",
                    client.create(&prefix, self.identity.as_str().as_bytes(), &lock),
                )
                .await
            {
                Ok((_, sequence)) => {
                    let node = format!("{protected}{sequence}");
                    if let Some(entry) = self.entries().get_mut(&token.0) {
                        entry.node = Some(node.clone());
                    }
                    return Ok(Some(node));
                }
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => {
                    match self
                        .conn
                        .call_n(
                            "create the lock node",
                            levels(dir),
                            client.mkdir(dir, &container),
                        )
                        .await
                    {
                        Ok(()) => {}
                        Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => {
                            return Err(BackendError::new(
                                "zookeeper: the chroot of DLOCK_URL does not exist; create it first",
                            )
                            .refused());
                        }
                        Err(e) => return Err(e.into_error(&self.conn)),
                    }
                }
                Err(e) if e.zk().is_some_and(ended) => {
                    self.entries().remove(&token.0);
                    return Ok(None);
                }
                // The reply is lost: the node may exist. The entry stays, uuid and all, so the
                // next attempt (or the give-up) finds it.
                Err(e) => return Err(e.into_error(&self.conn)),
            }
        }
        Err(BackendError::new(
            "zookeeper: the lock node kept vanishing before a node could be put in its line",
        ))
    }

    /// The node an earlier create with a lost reply made, found by its uuid.
    async fn find(
        &self,
        session: &Session,
        dir: &str,
        protected: &str,
    ) -> Result<Option<String>, BackendError> {
        match self
            .conn
            .call(
                "look for a node whose create reply was lost",
                session.client.list_children(dir),
            )
            .await
        {
            Ok(children) => Ok(children.into_iter().find(|c| c.starts_with(protected))),
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => Ok(None),
            Err(e) => Err(e.into_error(&self.conn)),
        }
    }

    /// Where `node` stands in the line of the lock node (a mutex's, a reader's or a writer's):
    /// first (with the fence), behind (what to watch), gone, or refused (a lock of another kind
    /// is on the key).
    async fn place(
        &self,
        session: &Session,
        token: &Token,
        known: &Known,
        node: &str,
        kind: LockKind,
    ) -> Result<Place, BackendError> {
        let dir = &known.dir;
        let (children, parent) = match self
            .conn
            .call("read the lock's line", session.client.get_children(dir))
            .await
        {
            Ok(found) => found,
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(Place::Gone),
            Err(e) if e.zk().is_some_and(ended) => return Ok(Place::Gone),
            Err(e) => return Err(e.into_error(&self.conn)),
        };
        let mark = Mark::of(kind);
        // A mutex's line is its kind's nodes; a read/write lock's, its readers' and writers'.
        let line = layout::line_of(&children, |m| m.is_rw() == mark.is_rw());
        let Some(mine) = line.iter().position(|(c, _, _)| *c == node) else {
            return Ok(Place::Gone);
        };
        if known.granted {
            // Granted before (and the caller never learnt it): a write of its own for a new
            // fence, higher than every one handed out so far.
            return self.renew_node(session, &format!("{dir}/{node}")).await;
        }
        if !known.checked {
            if let Some(held) = self
                .other_kind(session, &known.root, &children, mark, line[mine].2)
                .await?
            {
                return Ok(Place::Conflict(held));
            }
            if let Some(entry) = self.entries().get_mut(&token.0) {
                entry.checked = true;
            }
        }
        let ahead = &line[..mine];
        // A writer (and a mutex) waits for every node before it; a reader, for the writers
        // before it only (Curator's `readLockPredicate`; it watches the last of them).
        let waits_for = match mark {
            Mark::Read => ahead.iter().rev().find(|(_, m, _)| *m == Mark::Write),
            Mark::Lock | Mark::Write => ahead.last(),
        };
        Ok(match waits_for {
            None => Place::First(fence_of(parent.pzxid)),
            Some((ahead, _, _)) => Place::Behind(WaitOn::Node(format!("{dir}/{ahead}"))),
        })
    }

    /// Re-writes a node this acquisition holds for a new fence (that write's zxid, above every
    /// fence handed out before it).
    async fn renew_node(&self, session: &Session, path: &str) -> Result<Place, BackendError> {
        match self
            .conn
            .call(
                "renew the fence",
                session
                    .client
                    .set_data(path, self.identity.as_str().as_bytes(), None),
            )
            .await
        {
            Ok(stat) => Ok(Place::First(fence_of(stat.mzxid))),
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => Ok(Place::Gone),
            Err(e) if e.zk().is_some_and(ended) => Ok(Place::Gone),
            Err(e) => Err(e.into_error(&self.conn)),
        }
    }

    /// The grant: the hold's deadline on the client (the engine's clock deletes the node when
    /// it passes), and the signal of its loss.
    fn acquired(&self, token: &Token, session: &Session, fence: u64, lease: Duration) -> Attempt {
        let granted_at = Instant::now();
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return Attempt::Held {
                ttl: None,
                queued: false,
            };
        };
        entry.granted = true;
        entry.waits_on = None;
        entry.waiting = None;
        entry.expiry = Some(self.deadlines.schedule(granted_at + lease, token.0.clone()));
        let (alarm, lost) = loss_signal();
        entry.alarm = Some(alarm.clone());
        drop(entries);
        // A reply that came after the session ended (its end's look at the entries may have
        // come before this grant): the hold is lost already.
        if session.is_ended() {
            alarm.fire();
        }
        Attempt::Acquired {
            fence,
            granted: None,
            lost: Some(lost),
            counted_from: Some(granted_at),
        }
    }

    /// Sets the watch of `token`'s waiting entry on what it waits for, unless it is on it
    /// already: an exists-watch on the node ahead of its own (Curator's: the waiter watches
    /// that node, and only that one), or a children-watch on a semaphore's leases. The watch
    /// rings the entry's wake-up when that node is deleted (or changes), when the leases change
    /// (or are fewer than the permits already), or when the watch cannot be kept: the next
    /// attempt then looks at the line.
    fn arm(&self, token: &Token, session: &Session) {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return;
        };
        let Some(on) = entry.waits_on.clone() else {
            return;
        };
        let Some(notify) = entry.waiting.as_ref().map(|w| w.notify.clone()) else {
            return;
        };
        if entry.waiting.as_ref().is_some_and(|w| {
            w.on.as_ref() == Some(&on) && !w.rang.load(std::sync::atomic::Ordering::Acquire)
        }) {
            return;
        }
        let rang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let (conn, session, rang, notify, on) = (
                self.conn.clone(),
                session.clone(),
                rang.clone(),
                notify.clone(),
                on.clone(),
            );
            async move {
                let watcher = match &on {
                    WaitOn::Node(path) => conn
                        .call(
                            "watch the waiter ahead",
                            session.client.check_and_watch_stat(path),
                        )
                        .await
                        .ok()
                        .and_then(|(stat, watcher)| stat.map(|_| watcher)),
                    WaitOn::Leases { path, permits } => {
                        conn.call(
                            "watch the semaphore's leases",
                            session.client.list_and_watch_children(path),
                        )
                        .await
                        .ok()
                        .and_then(|(leases, watcher)| (leases.len() >= *permits).then_some(watcher))
                    }
                };
                if let Some(watcher) = watcher {
                    tokio::select! {
                        _ = watcher.changed() => {}
                        () = session.end() => {}
                    }
                }
                rang.store(true, std::sync::atomic::Ordering::Release);
                notify.notify_waiters();
            }
        });
        entry.waiting = Some(Waiting {
            notify,
            on: Some(on),
            rang,
            quiet: true,
            _task: AbortOnDrop::new(task),
        });
    }

    /// A waiter whose watch is set and has not rung: still behind, known without asking (once
    /// per watch).
    fn still_behind(&self, token: &Token) -> bool {
        let mut entries = self.entries();
        let Some(waiting) = entries.get_mut(&token.0).and_then(|e| e.waiting.as_mut()) else {
            return false;
        };
        let quiet = waiting.quiet && !waiting.rang.load(std::sync::atomic::Ordering::Acquire);
        waiting.quiet = false;
        quiet
    }

    /// Deletes what `entry` (out of the table already) has in ZooKeeper: the node that holds,
    /// or its node in line, and what a create whose reply was lost may have made (found by its
    /// uuid). `true` when it deleted anything. A deletion that fails is asked again in the
    /// background until it is done or the session ends: a node left in line would block the
    /// lock for the session's life.
    async fn let_go(&self, entry: Entry) -> Result<bool, BackendError> {
        let live = self.conn.current().clone();
        let Some(session) = live.filter(|s| s.epoch == entry.epoch && !s.is_ended()) else {
            // Its session ended: its nodes went with it.
            return Ok(false);
        };
        let mut targets = Vec::new();
        if let Some(lease) = &entry.lease {
            let dir = format!("{}/{LEASES}", entry.root);
            match &lease.node {
                Some(node) => targets.push(Target::Node(format!("{dir}/{node}"))),
                None if lease.sent => targets.push(Target::Protected {
                    dir: dir.into(),
                    protected: lease.protected.as_str().into(),
                }),
                None => {}
            }
        }
        // A permit's node in its semaphore's internal line went with its lease's making.
        if entry
            .lease
            .as_ref()
            .is_none_or(|lease| lease.node.is_none())
        {
            targets.push(match &entry.node {
                Some(node) => Target::Node(format!("{}/{node}", entry.dir)),
                None => Target::Protected {
                    dir: entry.dir.clone(),
                    protected: entry.protected.clone(),
                },
            });
        }
        let (mut deleted, mut failed) = (false, None);
        for target in targets {
            match self.remove(&session, target).await {
                Ok(gone) => deleted |= gone,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(deleted), Err)
    }

    /// Deletes one node of this session: `true` when it was there.
    async fn remove(&self, session: &Session, target: Target) -> Result<bool, BackendError> {
        let path = match target {
            Target::Node(path) => path,
            // The create's reply was lost: delete what it made, if anything. Asked again in
            // the background until it is known.
            Target::Protected { dir, protected } => {
                match self.find(session, &dir, &protected).await {
                    Ok(Some(node)) => format!("{dir}/{node}"),
                    Ok(None) => return Ok(false),
                    Err(e) => {
                        let (conn, session) = (self.conn.clone(), session.clone());
                        tokio::spawn(async move {
                            find_and_delete(&conn, &session, &dir, &protected).await;
                        });
                        return Err(e);
                    }
                }
            }
        };
        match self
            .conn
            .call("delete the lock node", session.client.delete(&path, None))
            .await
        {
            Ok(()) => Ok(true),
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => Ok(false),
            Err(e) if e.zk().is_some_and(ended) => Ok(false),
            Err(e) => {
                let (conn, session) = (self.conn.clone(), session.clone());
                tokio::spawn(async move {
                    delete_until_gone(&conn, &session.client, &session, &path).await;
                });
                Err(e.into_error(&self.conn))
            }
        }
    }
}

/// Follows a session's states until it ends: closed by this client, expired or otherwise
/// terminated, or disconnected for longer than `grace` (then it counts as expired). Then says so
/// on `ended_tx` and forgets the session (when it is still `conn`'s current one, of `epoch`).
async fn watch_session(
    mut states: zookeeper_client::StateWatcher,
    grace: Duration,
    ended_tx: watch::Sender<bool>,
    conn: std::sync::Weak<Conn>,
    epoch: u64,
    entries: std::sync::Weak<Mutex<HashMap<String, Entry>>>,
) {
    let mut disconnected = false;
    loop {
        let state = if disconnected {
            tokio::select! {
                state = states.changed() => state,
                () = tokio::time::sleep(grace) => {
                    tracing::warn!(?grace, "zookeeper connection lost for 0.45 of the session timeout: the session counts as expired, its holds are lost");
                    break;
                }
            }
        } else {
            states.changed().await
        };
        if state == SessionState::Closed {
            // Closed by this client (`Locker::close`, or its last handle dropped).
            tracing::debug!("zookeeper session closed");
            break;
        }
        if state.is_terminated() {
            tracing::warn!(?state, "zookeeper session ended: its holds are lost");
            break;
        }
        disconnected = state == SessionState::Disconnected;
        if disconnected {
            tracing::debug!("zookeeper connection lost; the session lives on while it reconnects");
        }
    }
    let _ = ended_tx.send(true);
    // Its holds are lost (their nodes went with it, or will once the servers expire it).
    if let Some(entries) = entries.upgrade() {
        fire_held(&entries, |e| {
            e.alarm.as_ref().filter(|_| e.epoch == epoch && e.granted)
        });
    }
    // Its client goes with the last task holding it: a session still open on the
    // servers is closed then, deleting its nodes.
    if let Some(conn) = conn.upgrade() {
        let mut current = conn.current();
        if current.as_ref().is_some_and(|s| s.epoch == epoch) {
            *current = None;
        }
    }
}

/// A hold's `expire` ran out on the client (`due`, its entry in the engine's clock, unless a
/// renewal moved it since): it is forgotten, its loss reported, and its node deleted.
fn expire(conn: &Arc<Conn>, entries: &Entries, due: Due, token: &str) {
    let entry = take_due(entries, token, due, |e: &Entry| e.expiry.as_ref());
    let Some(entry) = entry else { return };
    if let Some(alarm) = &entry.alarm {
        alarm.fire();
    }
    let Some(path) = entry.held_path() else {
        return;
    };
    // Its session ended: its node went with it.
    let live = conn.current().clone();
    let Some(session) = live.filter(|s| s.epoch == entry.epoch && !s.is_ended()) else {
        return;
    };
    let conn = conn.clone();
    tokio::spawn(async move {
        delete_until_gone(&conn, &session.client, &session, &path).await;
    });
}

/// Looks for the node of `session` under `dir` whose name starts with `protected` (a create
/// whose reply was lost made it, or not), and deletes it; asked again until it is known or the
/// session ends.
async fn find_and_delete(conn: &Conn, session: &Session, dir: &str, protected: &str) {
    while !session.is_ended() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let found = conn
            .call(
                "look for a node whose create reply was lost",
                session.client.list_children(dir),
            )
            .await;
        match found {
            Ok(children) => {
                if let Some(node) = children.iter().find(|c| c.starts_with(protected)) {
                    let path = format!("{dir}/{node}");
                    delete_until_gone(conn, &session.client, session, &path).await;
                }
                return;
            }
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return,
            Err(_) => {}
        }
    }
}

/// Deletes `path` (an ephemeral node of `session`), asking again until it is gone or the
/// session ends (which deletes it anyway).
async fn delete_until_gone(conn: &Conn, client: &Client, session: &Session, path: &str) {
    while !session.is_ended() {
        match conn
            .call("delete the lock node", client.delete(path, None))
            .await
        {
            Ok(()) => return,
            Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return,
            Err(e) if e.zk().is_some_and(ended) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Whether the error says the session is over.
fn ended(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as E;
    matches!(e, E::SessionExpired | E::ClientClosed | E::SessionMoved)
}

fn fence_of(zxid: i64) -> u64 {
    u64::try_from(zxid).unwrap_or(0)
}

/// `zk://h1:p1,h2:p2[/chroot]` as `zookeeper-client`'s connection string.
fn connect_string(var: &str, url: &str) -> Result<String, LockError> {
    let form = FORM;
    let hosts = crate::url::HostList::parse(var, url, form)?;
    if hosts.userinfo.is_some() {
        return Err(LockError::config(format!(
            "{var}: `zk://` takes no user or password (ZooKeeper authentication is not \
             supported); expected `{form}`"
        )));
    }
    for (name, value) in crate::url::query_params(url) {
        if name != SESSION_TIMEOUT.name {
            return Err(LockError::config(format!(
                "{var}: `zk://` takes no `{name}` option; expected `{form}`"
            )));
        }
        parse_session_timeout(value)
            .map_err(|why| LockError::config(format!("{var}: `{name}`: {why}")))?;
    }
    let chroot = hosts.path.trim_end_matches('/');
    if !chroot.is_empty()
        && (chroot
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
            || chroot.chars().any(refused_char))
    {
        return Err(LockError::config(format!(
            "{var}: the chroot is not a valid ZooKeeper path; expected `{form}`"
        )));
    }
    let list = hosts
        .hosts
        .iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    Ok(if chroot.is_empty() {
        list
    } else {
        format!("{list}/{chroot}")
    })
}

impl Backend for ZooKeeperBackend {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            let token = request.token;
            // Starting again after the session ended (its node went with it) is the only
            // repetition; bounded all the same.
            for _ in 0..3 {
                let session = self.conn.session().await?;
                if self.still_behind(token) {
                    return Ok(Attempt::Held {
                        ttl: None,
                        queued: true,
                    });
                }
                let Some(known) = self.entry_for(&session, &request)? else {
                    // Its session ended, and its node with it: join again, at the end.
                    continue;
                };
                match self.look(&session, &request, &known).await? {
                    Place::First(fence) => {
                        return Ok(self.acquired(token, &session, fence, request.lease));
                    }
                    Place::Behind(on) => {
                        if let Some(entry) = self.entries().get_mut(&token.0) {
                            entry.waits_on = Some(on);
                        }
                        self.arm(token, &session);
                        return Ok(Attempt::Held {
                            ttl: None,
                            queued: true,
                        });
                    }
                    Place::Gone => {
                        self.entries().remove(&token.0);
                    }
                    Place::Conflict(held) => {
                        // Nothing of this acquisition stays: its node (or nodes) goes now, or
                        // in the background should that fail.
                        let entry = self.entries().remove(&token.0);
                        if let Some(entry) = entry {
                            let _ = self.let_go(entry).await;
                        }
                        return Ok(Attempt::Conflict(format!(
                            "it is held as a {held}, and this acquisition asks for a {}",
                            request.kind
                        )));
                    }
                }
            }
            Err(BackendError::new(
                "zookeeper: the session kept ending before a node could be put in line",
            ))
        })
    }

    fn release<'a>(
        &'a self,
        _key: &'a str,
        _kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let Some(entry) = self.entries().remove(&token.0) else {
                return Ok(false);
            };
            self.let_go(entry).await
        })
    }

    fn watch<'a>(
        &'a self,
        _key: &'a str,
        token: &'a Token,
        _place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let epoch = {
                let mut entries = self.entries();
                let entry = entries.get_mut(&token.0)?;
                entry.waits_on.as_ref()?;
                let notify = Arc::new(Notify::new());
                // Armed below; the placeholder task rings at once, so that nothing is missed
                // should arming fail.
                let rang = Arc::new(std::sync::atomic::AtomicBool::new(true));
                entry.waiting = Some(Waiting {
                    notify,
                    on: None,
                    rang,
                    quiet: false,
                    _task: AbortOnDrop(None),
                });
                entry.epoch
            };
            let session = self
                .conn
                .current()
                .clone()
                .filter(|s| s.epoch == epoch && !s.is_ended())?;
            self.arm(token, &session);
            let notify = self
                .entries()
                .get(&token.0)?
                .waiting
                .as_ref()?
                .notify
                .clone();
            Some(Watch::new(notify, NextInLine::default(), ()))
        })
    }

    fn extend<'a>(
        &'a self,
        _key: &'a str,
        _kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let sent_at = Instant::now();
            let Some((path, epoch)) = (self.entries().get(&token.0))
                .filter(|e| e.granted)
                .and_then(|e| Some((e.held_path()?, e.epoch)))
            else {
                return Ok(false);
            };
            let live = self.conn.current().clone();
            let Some(session) = live.filter(|s| s.epoch == epoch && !s.is_ended()) else {
                return Ok(false);
            };
            let owner = session.client.session_id().0;
            let stat = self
                .conn
                .call("check the lock node", session.client.check_stat(&path))
                .await
                .map_err(|e| e.into_error(&self.conn))?;
            if stat.is_none_or(|s| s.ephemeral_owner != owner) {
                self.entries().remove(&token.0);
                return Ok(false);
            }
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(&token.0).filter(|e| e.expiry.is_some()) else {
                return Ok(false);
            };
            entry.expiry = Some(self.deadlines.schedule(sent_at + lease, token.0.clone()));
            Ok(true)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cannot_share: None,
            fair: FairOrder::Native,
            passes: false,
            wake_up: WakeUp::Predecessor,
            cannot_keep: Some(
                "ZooKeeper's lock nodes are ephemeral: they end with their holder's session, so \
                 no hold can outlive its process; `hold_at_least` is not available on `zk://`",
            ),
            places: false,
        }
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            self.conn
                .call("look at the root node", session.client.check_stat("/"))
                .await
                .map(drop)
                .map_err(|e| e.into_error(&self.conn))
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            let root = path_of(self.prefix_len, key);
            let Some(holding) = self.holding(&session, &root).await? else {
                return Ok(None);
            };
            let mut info = holding.info(key);
            info.waiters = Some(holding.waiters);
            Ok(Some(info))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            let (parent, start) = list_target(self.prefix_len, prefix);
            let node = if parent.is_empty() { "/" } else { &parent };
            let children = match self
                .conn
                .call("list the lock nodes", session.client.list_children(node))
                .await
            {
                Ok(children) => children,
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into_error(&self.conn)),
            };
            Ok(children
                .into_iter()
                .filter(|c| c.starts_with(&start))
                .filter_map(|c| key_of_path(self.prefix_len, &format!("{parent}/{c}")))
                .collect())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            let root = path_of(self.prefix_len, key);
            let Some(holding) = self.holding(&session, &root).await? else {
                return Ok(None);
            };
            // Every hold goes (a semaphore's leases, the readers); waiters stay in line.
            let mut freed = 0;
            for path in &holding.paths {
                match self
                    .conn
                    .call("delete a holder's node", session.client.delete(path, None))
                    .await
                {
                    Ok(()) => freed += 1,
                    // Released meanwhile.
                    Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => {}
                    Err(e) => return Err(e.into_error(&self.conn)),
                }
            }
            if freed == 0 {
                return Ok(None);
            }
            let mut info = holding.info(key);
            info.holders = freed;
            Ok(Some(info))
        })
    }

    fn lapses_within(&self, lease: Duration) -> Duration {
        // A node stays while its session lives, and the session as long as this client;
        // `expire` ends a hold on the client, not a waiter's node.
        lease.max(self.conn.session_timeout)
    }

    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            // Every hold was released and every cleanup done. Ending the session deletes what
            // is left of it (a node whose removal failed): the client closes it once its last
            // handle is gone, and the tasks holding one end (waiters' watches, deletions asked again) end
            // with the session.
            self.entries().clear();
            let Some(session) = self.conn.current().take() else {
                return Ok(());
            };
            let mut states = session.client.state_watcher();
            drop(session);
            let bound = self.conn.request_timeout.max(Duration::from_secs(1));
            let ended = tokio::time::timeout(bound, async {
                while !states.state().is_terminated() {
                    states.changed().await;
                }
            })
            .await;
            ended.map_err(|_| {
                BackendError::new(format!(
                    "zookeeper: the session did not close within {bound:?}; its nodes go when \
                     it expires (within the session timeout, {:?})",
                    self.conn.session_timeout
                ))
            })
        })
    }

    fn key_error(&self, key: &str) -> Option<String> {
        let path = path_of(self.prefix_len, key);
        (path == "/zookeeper" || path.starts_with("/zookeeper/")).then(|| {
            "on ZooKeeper, `/zookeeper` is the server's own subtree: use a key prefix".to_owned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_node_under_the_prefix() {
        assert_eq!(path_of(6, "dlock:a"), "/dlock:/a");
        assert_eq!(path_of(6, "dlock:a/b"), "/dlock:/a%2Fb");
        assert_eq!(path_of(6, "dlock:a%2Fb"), "/dlock:/a%252Fb");
        assert_eq!(path_of(6, "locks/x/../y"), "/locks/x%2F..%2Fy");
        assert_eq!(path_of(6, "locks/."), "/locks/%2E");
        assert_eq!(path_of(6, "locks/.."), "/locks/%2E%2E");
        assert_eq!(path_of(6, "locks/..."), "/locks/...");
        assert_eq!(path_of(5, "locks."), "/locks/%2E");
        assert_eq!(path_of(6, "dlock:a\0b\u{1}\u{7f}"), "/dlock:/a%00b%01%7F");
        assert_eq!(path_of(0, "\u{e000}"), "/%EE%80%80");
        assert_eq!(path_of(0, "a"), "/a");
        assert_eq!(path_of(6, "dlock:訂單"), "/dlock:/訂單");
        assert_eq!(path_of(6, "a/b/c:x"), "/a/b/c:/x");
        // Beyond U+FFFF: a surrogate pair in ZooKeeper's Java strings, which it refuses.
        assert_eq!(
            path_of(6, "dlock:🔒-ключ-鍵"),
            "/dlock:/%F0%9F%94%92-ключ-鍵"
        );
    }

    #[test]
    fn paths_give_their_keys_back() {
        for (prefix_len, key) in [
            (6, "dlock:order:42"),
            (6, "locks/order:42"),
            (0, "order:42"),
            (6, "dlock:a/b%c"),
        ] {
            let path = path_of(prefix_len, key);
            assert_eq!(
                key_of_path(prefix_len, &path).as_deref(),
                Some(key),
                "{path}"
            );
        }
        // Another prefix's node (no `/` after the prefix) is not one of ours.
        assert_eq!(key_of_path(6, "/dlock:order:42"), None);
    }

    #[test]
    fn listings_read_the_prefix_node() {
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(list_target(6, "dlock:"), pair("/dlock:", ""));
        assert_eq!(list_target(6, "dlock:order:"), pair("/dlock:", "order:"));
        // `.` begins `.x`: no `%2E` for a listing's start.
        assert_eq!(list_target(6, "dlock:."), pair("/dlock:", "."));
        assert_eq!(list_target(6, "locks/.."), pair("/locks", ".."));
        assert_eq!(list_target(6, "dlock:a/"), pair("/dlock:", "a%2F"));
        assert_eq!(list_target(0, ""), pair("", ""));
        assert_eq!(list_target(0, "ab"), pair("", "ab"));
        assert_eq!(levels("/dlock:/k"), 2);
    }

    #[test]
    fn bad_prefixes_are_named() {
        assert!(prefix_error("dlock:").is_none());
        assert!(prefix_error("locks/").is_none());
        assert!(prefix_error("a/b/c:").is_none());
        assert!(prefix_error("locks").is_none());
        assert!(prefix_error("").is_none());
        for bad in [
            "/locks/",
            "locks//",
            "/",
            "./x",
            "a/../b",
            "..",
            "zookeeper/",
            "zookeeper",
            "a\0",
        ] {
            assert!(prefix_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn urls_become_connection_strings() {
        assert_eq!(connect_string("X", "zk://a:1,b:2").unwrap(), "a:1,b:2");
        assert_eq!(
            connect_string("X", "zk://a:1,b:2/app/locks/").unwrap(),
            "a:1,b:2/app/locks"
        );
        assert_eq!(
            connect_string("X", "zk://a:1/app?session_timeout=4s").unwrap(),
            "a:1/app"
        );
        for bad in [
            "zk://a",
            "zk://u:pw@a:1",
            "zk://a:1/x//y",
            "zk://a:1?x=1",
            "zk://a:1?session_timeout=0s",
            "zk://a:1/..",
        ] {
            let err = connect_string("DLOCK_URL", bad).unwrap_err().to_string();
            assert!(
                err.contains("DLOCK_URL") && !err.contains("pw"),
                "{bad}: {err}"
            );
        }
    }
}
