//! ZooKeeper, with Curator's lock recipe (`InterProcessMutex`): an ephemeral sequential node per
//! holder or waiter, the lowest one holds, each waiter watches only its predecessor.
//!
//! - **Layout**: the lock `<prefix><key>` is the node `/<prefix><key>` (under the URL's chroot),
//!   a container node the server removes once its last child is gone. The prefix is written as
//!   is (a `/` in it makes parent nodes: `DLOCK_KEY_PREFIX=locks/` gives `/locks/<key>`, as a
//!   Curator user would write it); in the key, `%`, `/`, and the characters ZooKeeper refuses in
//!   a path (NUL, control characters, …) are written `%XX` (their UTF-8 bytes), and a last
//!   segment that would read `.` or `..` has its dots written `%2E`, so a key is always exactly
//!   one node: `a` and `a/b` are two independent locks. Its children are Curator's protected
//!   nodes, `_c_<uuid>-lock-<sequence>`, so Curator (and `zookeeper-client`'s `LockClient` with
//!   `LockPrefix::new_curator(dir, "lock-")`) and dlock exclude each other on the same path.
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
//!   connection still lost half the session timeout after it was found lost counts as expired
//!   (before the ensemble can have expired it).
//! - **Fence**: the parent's `pzxid` (the zxid of the last change to the line) read in the same
//!   reply that shows the holder's node first. The next holder is first only after this one's
//!   node is deleted, a later change, so fences strictly increase per key. A retry of an
//!   acquisition already granted re-writes its node and takes that write's zxid instead.
//! - **Waiting**: a waiter sets an exists-watch on the node just before its own (its
//!   predecessor, as its attempt's look at the line found it) and is woken when that node goes:
//!   no herd, first come first served by sequence. The attempt it then makes looks at the line
//!   again and, still behind (the predecessor was a waiter that left), watches the new one.
//!   Nodes deleted by hand are noticed at the next renewal or release of their holder.

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

use super::api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, EngineOption, FairOrder, NextInLine, Request,
    Token, Watch, option,
};
use crate::lease::LossSignal;
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

/// The name Curator's `InterProcessMutex` gives its nodes after the protected prefix.
const LOCK_NAME: &str = "lock-";

/// The node path of the full lock key `key` whose first `prefix_len` bytes are the prefix: `/`,
/// the prefix as is, then the key with `%`, `/` and the characters ZooKeeper refuses encoded.
pub(crate) fn path_of(prefix_len: usize, key: &str) -> String {
    let split = prefix_len.min(key.len());
    let (prefix, name) = key.split_at(if key.is_char_boundary(split) {
        split
    } else {
        0
    });
    let mut path = String::with_capacity(key.len() + 8);
    path.push('/');
    path.push_str(prefix);
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
    let last = path.rfind('/').map_or(0, |i| i + 1);
    if matches!(&path[last..], "." | "..") {
        let dots = path.len() - last;
        path.truncate(last);
        path.push_str(&"%2E".repeat(dots));
    }
    path
}

/// The full lock key of the node path `path` (see [`path_of`]): its name decoded.
fn key_of_path(prefix_len: usize, path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let (prefix, name) = rest.split_at_checked(prefix_len)?;
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(name.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(format!("{prefix}{}", String::from_utf8(out).ok()?))
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

/// Why `prefix` cannot start a node path: empty, `.` or `..` segments, refused characters, or
/// ZooKeeper's own `/zookeeper` subtree.
fn prefix_error(prefix: &str) -> Option<String> {
    let segments: Vec<&str> = prefix.split('/').collect();
    // The last part is joined with the key; the ones before it are parent nodes.
    let parents = &segments[..segments.len() - 1];
    if parents
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Some(
            "a `/` in the prefix makes parent nodes, which may not be empty, `.` or `..` (write \
             `locks/`, not `/locks/` or `locks//`)"
                .to_owned(),
        );
    }
    if prefix.chars().any(refused_char) {
        return Some("the prefix holds a character ZooKeeper refuses in a path".to_owned());
    }
    if segments.len() > 1 && segments[0] == "zookeeper" {
        return Some("`/zookeeper` is ZooKeeper's own subtree".to_owned());
    }
    None
}

/// The sequence number of a child named like Curator's lock nodes, `None` for other children.
fn sequence_of(child: &str) -> Option<i64> {
    let (_, seq) = child.rsplit_once(LOCK_NAME)?;
    (!seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()))
        .then(|| seq.parse().ok())
        .flatten()
}

/// The lock nodes among `children`, in line order.
fn line_of(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence_of(c).is_some());
    children.sort_by_key(|c| sequence_of(c));
    children
}

/// A task aborted when this is dropped (unless detached first).
#[derive(Debug)]
struct AbortOnDrop(Option<JoinHandle<()>>);

impl AbortOnDrop {
    fn new(task: JoinHandle<()>) -> Self {
        Self(Some(task))
    }

    /// Lets the task run on when this is dropped.
    fn detach(mut self) {
        self.0 = None;
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
    client: Client,
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
        // timeout. A connection is found lost at most 2/5 of it after the last reply
        // (`zookeeper-client`'s connection timeout), so one still lost half the session
        // timeout later counts as expired, before the servers can have expired it (0.9 of it
        // at most since the last reply). The client would wait 7/5 of it.
        let grace = client.session_timeout() / 2;
        tokio::spawn(watch_session(
            client.state_watcher(),
            grace,
            ended_tx,
            Arc::downgrade(self),
            *epochs,
        ));
        let session = Session {
            client,
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
        match tokio::time::timeout(self.request_timeout, request).await {
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
    /// The lock node (the line's parent).
    dir: String,
    /// `_c_<uuid>-lock-`: the protected prefix of its node.
    protected: String,
    /// Its node's name in the line, once a reply (or a search by uuid) told it.
    node: Option<String>,
    /// The session that created it.
    epoch: u64,
    /// An attempt returned it as held.
    granted: bool,
    /// While held: the client-side end of the hold (moved on by renewals).
    deadline: Option<watch::Sender<Instant>>,
    /// While held: deletes the node when the deadline passes.
    timer: Option<AbortOnDrop>,
    /// Sent `true` when the engine let the hold go (its `expire` ran out).
    gone: watch::Sender<bool>,
    /// While it waits: the node just before its own, as the last look at the line found it.
    predecessor: Option<String>,
    /// While it waits with a wake-up ([`Backend::watch`]): the wake-up, and the exists-watch on
    /// the predecessor that rings it.
    waiting: Option<Waiting>,
}

/// A waiter's wake-up: an exists-watch on its predecessor, and what it found.
#[derive(Debug)]
struct Waiting {
    notify: Arc<Notify>,
    /// The predecessor the watch is on.
    on: String,
    /// The watch fired (the predecessor is gone or changed), failed, or the session ended: the
    /// next attempt must look at the line.
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
    /// The lock node (the line).
    dir: String,
    /// Its protected prefix, `_c_<uuid>-lock-`.
    protected: String,
    /// Its node, once known.
    node: Option<String>,
    /// An attempt granted it.
    granted: bool,
    /// The entry was there before this attempt (a create whose reply was lost may have made a
    /// node).
    was_known: bool,
}

/// What one look at the line found.
enum Place {
    /// First, with this fence.
    First(u64),
    /// Behind another node: the one just before it.
    Behind(String),
    /// The node is not in the line any more (its session ended, or it was deleted).
    Gone,
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
        Ok(Self {
            conn: Arc::new(Conn {
                connect,
                session_timeout,
                request_timeout: settings.request_timeout,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(0),
            }),
            entries: Arc::default(),
            prefix_len: settings.key_prefix.len(),
            identity: settings.identity.clone(),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The acquisition's entry, made when it has none: its lock node (the line), its protected
    /// prefix, its node once known, and whether an attempt granted it. `None` when its session
    /// ended (its node went with it): the entry is dropped, to join again.
    fn entry_for(
        &self,
        session: &Session,
        request: &Request<'_>,
    ) -> Result<Option<Known>, BackendError> {
        let token = request.token;
        let known = self.entries().get(&token.0).map(|e| {
            let known = Known {
                dir: e.dir.clone(),
                protected: e.protected.clone(),
                node: e.node.clone(),
                granted: e.granted,
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
        let dir = path_of(self.prefix_len, request.key);
        let protected = protected_prefix()?;
        self.entries().insert(
            token.0.clone(),
            Entry {
                dir: dir.clone(),
                protected: protected.clone(),
                node: None,
                epoch: session.epoch,
                granted: false,
                deadline: None,
                timer: None,
                gone: watch::channel(false).0,
                predecessor: None,
                waiting: None,
            },
        );
        Ok(Some(Known {
            dir,
            protected,
            node: None,
            granted: false,
            was_known: false,
        }))
    }

    /// The acquisition's node in line: the one it has, one a create whose reply was lost made
    /// (found by its uuid, Curator's protected mode), or a new one. `None` when it must start
    /// again (its session ended).
    async fn node_in_line(
        &self,
        session: &Session,
        request: &Request<'_>,
    ) -> Result<Option<(String, String, bool)>, BackendError> {
        let Some(Known {
            dir,
            protected,
            node,
            granted,
            was_known,
        }) = self.entry_for(session, request)?
        else {
            return Ok(None);
        };
        if let Some(node) = node {
            return Ok(Some((dir, node, granted)));
        }
        let found = if was_known {
            self.find(session, &dir, &protected).await?
        } else {
            None
        };
        let node = match found {
            Some(node) => {
                if let Some(entry) = self.entries().get_mut(&request.token.0) {
                    entry.node = Some(node.clone());
                }
                node
            }
            None => match self.enter(session, request.token, &dir, &protected).await? {
                Some(node) => node,
                None => return Ok(None),
            },
        };
        Ok(Some((dir, node, granted)))
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
                        .call("create the lock node", client.mkdir(dir, &container))
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

    /// The node first in the line of `dir`, its data and stat, and how many wait behind it;
    /// `None` when the line is empty.
    async fn holder_node(
        &self,
        session: &Session,
        dir: &str,
    ) -> Result<Option<(String, Vec<u8>, zookeeper_client::Stat, usize)>, BackendError> {
        // A holder that leaves between the listing and the read: look again.
        for _ in 0..3 {
            let children = match self
                .conn
                .call("read the lock's line", session.client.list_children(dir))
                .await
            {
                Ok(children) => children,
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(None),
                Err(e) => return Err(e.into_error(&self.conn)),
            };
            let line = line_of(children);
            let Some(first) = line.first() else {
                return Ok(None);
            };
            let path = format!("{dir}/{first}");
            match self
                .conn
                .call("read the holder's node", session.client.get_data(&path))
                .await
            {
                Ok((data, stat)) => {
                    return Ok(Some((first.clone(), data, stat, line.len() - 1)));
                }
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => {}
                Err(e) => return Err(e.into_error(&self.conn)),
            }
        }
        Err(BackendError::new(
            "zookeeper: the lock's holder kept changing while it was read",
        ))
    }

    /// Where `node` stands in the line of `dir`.
    async fn place(
        &self,
        session: &Session,
        dir: &str,
        node: &str,
        regrant: bool,
    ) -> Result<Place, BackendError> {
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
        let line = line_of(children);
        match line.iter().position(|c| c == node) {
            None => Ok(Place::Gone),
            Some(0) if regrant => {
                // Granted before (and the caller never learnt it): a write of its own for a new
                // fence, higher than every one handed out so far.
                let path = format!("{dir}/{node}");
                match self
                    .conn
                    .call(
                        "renew the fence",
                        session
                            .client
                            .set_data(&path, self.identity.as_str().as_bytes(), None),
                    )
                    .await
                {
                    Ok(stat) => Ok(Place::First(fence_of(stat.mzxid))),
                    Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => Ok(Place::Gone),
                    Err(e) => Err(e.into_error(&self.conn)),
                }
            }
            Some(0) => Ok(Place::First(fence_of(parent.pzxid))),
            Some(i) => Ok(Place::Behind(line[i - 1].clone())),
        }
    }

    /// The grant: the hold's deadline on the client, the task that deletes the node when it
    /// passes, and the signal of its loss.
    fn acquired(&self, token: &Token, session: &Session, fence: u64, lease: Duration) -> Attempt {
        let sent_at = Instant::now();
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return Attempt::Held {
                ttl: None,
                queued: false,
            };
        };
        entry.granted = true;
        entry.predecessor = None;
        entry.waiting = None;
        let (deadline, until) = watch::channel(sent_at + lease);
        entry.deadline = Some(deadline);
        let gone = entry.gone.subscribe();
        let path = entry
            .node
            .as_ref()
            .map(|node| format!("{}/{node}", entry.dir))
            .unwrap_or_default();
        entry.timer = Some(AbortOnDrop::new(tokio::spawn(expire_at_deadline(
            until,
            session.clone(),
            self.conn.clone(),
            self.entries.clone(),
            token.0.clone(),
            path,
        ))));
        drop(entries);
        Attempt::Acquired {
            fence,
            granted: None,
            lost: Some(loss_signal(
                session.clone(),
                self.entries.clone(),
                token.0.clone(),
                gone,
            )),
        }
    }

    /// Sets the exists-watch of `token`'s waiting entry on its predecessor (Curator's: the
    /// waiter watches the node just before its own, and only that one), unless it is on it
    /// already. The watch rings the entry's wake-up when the predecessor is deleted (or changes,
    /// or the watch cannot be kept): the next attempt then looks at the line.
    fn watch_predecessor(&self, token: &Token, session: &Session) {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return;
        };
        let Some(predecessor) = entry.predecessor.clone() else {
            return;
        };
        let Some(notify) = entry.waiting.as_ref().map(|w| w.notify.clone()) else {
            return;
        };
        if entry.waiting.as_ref().is_some_and(|w| {
            w.on == predecessor && !w.rang.load(std::sync::atomic::Ordering::Acquire)
        }) {
            return;
        }
        let rang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = format!("{}/{predecessor}", entry.dir);
        let task = tokio::spawn({
            let (conn, session, rang, notify) = (
                self.conn.clone(),
                session.clone(),
                rang.clone(),
                notify.clone(),
            );
            async move {
                let watched = conn
                    .call(
                        "watch the waiter ahead",
                        session.client.check_and_watch_stat(&path),
                    )
                    .await;
                if let Ok((Some(_), watcher)) = watched {
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
            on: predecessor,
            rang,
            quiet: true,
            _task: AbortOnDrop::new(task),
        });
    }

    /// A waiter whose watch on its predecessor is set and has not rung: still behind, known
    /// without asking (once per watch).
    fn still_behind(&self, token: &Token) -> bool {
        let mut entries = self.entries();
        let Some(waiting) = entries.get_mut(&token.0).and_then(|e| e.waiting.as_mut()) else {
            return false;
        };
        let quiet = waiting.quiet && !waiting.rang.load(std::sync::atomic::Ordering::Acquire);
        waiting.quiet = false;
        quiet
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
) {
    let mut disconnected = false;
    loop {
        let state = if disconnected {
            tokio::select! {
                state = states.changed() => state,
                () = tokio::time::sleep(grace) => {
                    tracing::warn!(?grace, "zookeeper connection lost for half the session timeout: the session counts as expired, its holds are lost");
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
    // Its client goes with the last task holding it: a session still open on the
    // servers is closed then, deleting its nodes.
    if let Some(conn) = conn.upgrade() {
        let mut current = conn.current();
        if current.as_ref().is_some_and(|s| s.epoch == epoch) {
            *current = None;
        }
    }
}

/// A grant's `expire` clock: sleeps until the deadline on `until` (moved by each renewal), then
/// forgets the hold (`key` in `all`), tells its loss signal and deletes its node at `path`. Ends
/// at once when the session ends (the node goes with it).
async fn expire_at_deadline(
    mut until: watch::Receiver<Instant>,
    live: Session,
    conn: Arc<Conn>,
    all: Entries,
    key: String,
    path: String,
) {
    loop {
        let at = *until.borrow_and_update();
        tokio::select! {
            // The node went with the session (and the hold is lost through it).
            () = live.clone().end() => return,
            () = tokio::time::sleep_until(at) => {
                if *until.borrow() == at {
                    break;
                }
            }
            changed = until.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
    // The hold's `expire` ran out: it is let go on the server too.
    let entry = all
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&key);
    let Some(mut entry) = entry else { return };
    let _ = entry.gone.send(true);
    // This very task: not aborted by dropping the entry.
    if let Some(timer) = entry.timer.take() {
        timer.detach();
    }
    delete_until_gone(&conn, &live.client, &live, &path).await;
}

/// The loss signal of a grant: fires when the session ends while the hold (`key` in `all`, of
/// this session) is still there; never after a release (which drops the entry and so closes
/// `gone`).
fn loss_signal(
    session: Session,
    all: Entries,
    key: String,
    mut gone: watch::Receiver<bool>,
) -> LossSignal {
    LossSignal(Box::pin(async move {
        let epoch = session.epoch;
        tokio::select! {
            () = session.end() => {
                // Released before its session ended: nothing was lost.
                let held = all
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                    .is_some_and(|e| e.epoch == epoch);
                if !held {
                    std::future::pending::<()>().await;
                }
            }
            dropped = async { gone.wait_for(|g| *g).await.is_err() } => {
                // The entry was dropped (a release): nothing was lost.
                if dropped {
                    std::future::pending::<()>().await;
                }
            }
        }
    }))
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

/// `_c_<uuid>-lock-`, the uuid fresh from the OS generator.
fn protected_prefix() -> Result<String, BackendError> {
    let hex = Token::generate()?.0;
    Ok(format!(
        "_c_{}-{}-{}-{}-{}-{LOCK_NAME}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
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
                let Some((dir, node, granted)) = self.node_in_line(&session, &request).await?
                else {
                    // Its session ended, and its node with it: join again, at the end.
                    continue;
                };
                match self.place(&session, &dir, &node, granted).await? {
                    Place::First(fence) => {
                        return Ok(self.acquired(token, &session, fence, request.lease));
                    }
                    Place::Behind(predecessor) => {
                        if let Some(entry) = self.entries().get_mut(&token.0) {
                            entry.predecessor = Some(predecessor);
                        }
                        self.watch_predecessor(token, &session);
                        return Ok(Attempt::Held {
                            ttl: None,
                            queued: true,
                        });
                    }
                    Place::Gone => {
                        self.entries().remove(&token.0);
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
            let live = self.conn.current().clone();
            let Some(session) = live.filter(|s| s.epoch == entry.epoch && !s.is_ended()) else {
                // Its session ended: the node went with it.
                return Ok(false);
            };
            let node = match entry.node {
                Some(node) => node,
                // The create's reply was lost: delete what it made, if anything. Asked again in
                // the background until it is known (a node left in line would block the lock
                // for the session's life).
                None => match self.find(&session, &entry.dir, &entry.protected).await {
                    Ok(Some(node)) => node,
                    Ok(None) => return Ok(false),
                    Err(e) => {
                        let conn = self.conn.clone();
                        tokio::spawn(async move {
                            while !session.is_ended() {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                let found = conn
                                    .call(
                                        "look for a node whose create reply was lost",
                                        session.client.list_children(&entry.dir),
                                    )
                                    .await;
                                match found {
                                    Ok(children) => {
                                        if let Some(node) = children
                                            .iter()
                                            .find(|c| c.starts_with(&entry.protected))
                                        {
                                            let path = format!("{}/{node}", entry.dir);
                                            let client = session.client.clone();
                                            delete_until_gone(&conn, &client, &session, &path)
                                                .await;
                                        }
                                        return;
                                    }
                                    Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return,
                                    Err(_) => {}
                                }
                            }
                        });
                        return Err(e);
                    }
                },
            };
            let path = format!("{}/{node}", entry.dir);
            match self
                .conn
                .call("delete the lock node", session.client.delete(&path, None))
                .await
            {
                Ok(()) => Ok(true),
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => Ok(false),
                Err(e) if e.zk().is_some_and(ended) => Ok(false),
                Err(e) => {
                    // Asked again in the background: a node left in line would block the lock
                    // until the session ends.
                    let (conn, client) = (self.conn.clone(), session.client.clone());
                    tokio::spawn(async move {
                        delete_until_gone(&conn, &client, &session, &path).await;
                    });
                    Err(e.into_error(&self.conn))
                }
            }
        })
    }

    fn watch<'a>(&'a self, _key: &'a str, token: &'a Token) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let epoch = {
                let mut entries = self.entries();
                let entry = entries.get_mut(&token.0)?;
                entry.predecessor.as_ref()?;
                let notify = Arc::new(Notify::new());
                // Armed below; the placeholder task rings at once, so that nothing is missed
                // should arming fail.
                let rang = Arc::new(std::sync::atomic::AtomicBool::new(true));
                entry.waiting = Some(Waiting {
                    notify,
                    on: String::new(),
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
            self.watch_predecessor(token, &session);
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
            let Some((path, epoch)) = self.entries().get(&token.0).and_then(|e| {
                let node = e.node.as_ref().filter(|_| e.granted)?;
                Some((format!("{}/{node}", e.dir), e.epoch))
            }) else {
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
            let entries = self.entries();
            let Some(deadline) = entries.get(&token.0).and_then(|e| e.deadline.as_ref()) else {
                return Ok(false);
            };
            deadline.send_replace(sent_at + lease);
            Ok(true)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cannot_share: Some("not yet"),
            fair: FairOrder::Native,
            passes: false,
            reliable_wake_up: true,
            cannot_keep: Some(
                "ZooKeeper's lock nodes are ephemeral: they end with their holder's session, so \
                 no hold can outlive its process; `hold_at_least` is not available on `zk://`",
            ),
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
            let dir = path_of(self.prefix_len, key);
            let Some((_, data, stat, waiters)) = self.holder_node(&session, &dir).await? else {
                return Ok(None);
            };
            let mut info = LockInfo::new(key.to_owned());
            info.holder = read_holder(&data, stat.ctime);
            info.waiters = Some(waiters);
            Ok(Some(info))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            let path = path_of(self.prefix_len, prefix);
            let (parent, start) = path.rsplit_once('/').unwrap_or(("", &path));
            let parent = if parent.is_empty() { "/" } else { parent };
            let children = match self
                .conn
                .call("list the lock nodes", session.client.list_children(parent))
                .await
            {
                Ok(children) => children,
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into_error(&self.conn)),
            };
            let base = if parent == "/" { "" } else { parent };
            Ok(children
                .into_iter()
                .filter(|c| c.starts_with(start))
                .filter_map(|c| key_of_path(self.prefix_len, &format!("{base}/{c}")))
                .collect())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let session = self.conn.session().await?;
            let dir = path_of(self.prefix_len, key);
            let Some((node, data, stat, _)) = self.holder_node(&session, &dir).await? else {
                return Ok(None);
            };
            let path = format!("{dir}/{node}");
            match self
                .conn
                .call(
                    "delete the holder's node",
                    session.client.delete(&path, None),
                )
                .await
            {
                Ok(()) => {}
                // Released meanwhile.
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(None),
                Err(e) => return Err(e.into_error(&self.conn)),
            }
            let mut info = LockInfo::new(key.to_owned());
            info.holder = read_holder(&data, stat.ctime);
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
            // handle is gone, and the tasks holding one end with the entries.
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
    fn keys_are_one_node_after_the_prefix() {
        assert_eq!(path_of(6, "dlock:a"), "/dlock:a");
        assert_eq!(path_of(6, "dlock:a/b"), "/dlock:a%2Fb");
        assert_eq!(path_of(6, "dlock:a%2Fb"), "/dlock:a%252Fb");
        assert_eq!(path_of(6, "locks/x/../y"), "/locks/x%2F..%2Fy");
        assert_eq!(path_of(6, "locks/."), "/locks/%2E");
        assert_eq!(path_of(6, "locks/.."), "/locks/%2E%2E");
        assert_eq!(path_of(6, "locks/..."), "/locks/...");
        assert_eq!(path_of(6, "dlock:a\0b\u{1}\u{7f}"), "/dlock:a%00b%01%7F");
        assert_eq!(path_of(0, "\u{e000}"), "/%EE%80%80");
        assert_eq!(path_of(6, "dlock:訂單"), "/dlock:訂單");
        // Beyond U+FFFF: a surrogate pair in ZooKeeper's Java strings, which it refuses.
        assert_eq!(
            path_of(6, "dlock:🔒-ключ-鍵"),
            "/dlock:%F0%9F%94%92-ключ-鍵"
        );
    }

    #[test]
    fn bad_prefixes_are_named() {
        assert!(prefix_error("dlock:").is_none());
        assert!(prefix_error("locks/").is_none());
        assert!(prefix_error("a/b/c:").is_none());
        for bad in ["/locks/", "locks//", "./x", "a/../b", "zookeeper/", "a\0"] {
            assert!(prefix_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn the_line_is_in_sequence_order() {
        let line = line_of(vec![
            "_c_b-lock-0000000010".into(),
            "other".into(),
            "_c_a-lock-0000000002".into(),
            "x-lock-".into(),
            "_c_c-lock-0000000003".into(),
        ]);
        assert_eq!(
            line,
            [
                "_c_a-lock-0000000002",
                "_c_c-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
    }

    #[test]
    fn protected_prefixes_look_like_curators() {
        let p = protected_prefix().unwrap();
        assert!(p.starts_with("_c_") && p.ends_with("-lock-"), "{p}");
        assert_eq!(p.len(), "_c_".len() + 36 + "-lock-".len());
        assert_ne!(p, protected_prefix().unwrap());
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
