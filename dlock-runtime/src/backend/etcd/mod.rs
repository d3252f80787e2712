//! etcd v3, with etcd's own lock recipe (Go's `concurrency.Mutex`, `etcdctl lock`), so dlock and
//! those tools exclude each other on the same name.
//!
//! - **Layout**: the lock `<prefix><key>` is the *line* `<prefix><key>/` (with `/` and `%` in
//!   the key written `%2F` and `%25`, so `a` and `a/b` never share a line). Each holder or
//!   waiter puts `<line><session lease id in hex>-<n>` on its locker's session lease; the key
//!   with the lowest create revision holds, the others wait in create-revision order.
//! - **Session**: one lease per locker, kept alive while it lives ([`session`]): the server-side
//!   lease of every key it puts. A crashed or frozen process loses its holds and places when
//!   its session's TTL (`?session_ttl=10s`) runs out; a client that cannot renew it counts its
//!   holds lost before etcd can have expired it. `expire` bounds a hold on the client: when it
//!   runs out the key is deleted and the hold is lost; a renewal (`expire = "auto"`) pushes that
//!   deadline on while the key is still the hold's.
//! - **Fence**: a revision at which the holder's key was first in line: the revision of the
//!   write that joined a free lock, or of the read that found a waiter first (its wake-up's, or
//!   its attempt's). Successive holders are separated by the deletion of the previous holder's
//!   key, a later revision, so fences strictly increase per key. A retry of an acquisition
//!   already granted, or whose reply was lost, re-writes its key and takes that write's revision.
//! - **Waiting**: a waiter watches the deletion of the last key created before its own (its
//!   predecessor) and is woken only when no earlier key is left; the read that finds it first
//!   gives it its fence, so the attempt that follows asks nothing.
//! - **Holder**: each key's value is its holder's record (`owner=… host=… pid=… since=…`,
//!   the time it joined the line); `etcdctl lock` leaves it empty.
//! - **Loss**: the session's end; and, for a hold that lasts more than a second, a watch on its
//!   key from the revision after its fence, whose deletion by hand marks the hold lost. Every
//!   watch of a locker shares one watch stream ([`watches`]).

mod conn;
mod kinds;
mod session;
mod watches;

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use etcd_client::{
    Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, GetResponse, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use self::{
    conn::{Conn, lease_gone, tls_options},
    kinds::Shape,
    session::{Session, Sessions},
    watches::{Fired, WatchHub},
};
use super::api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, EngineOption, FairOrder, NextInLine, Request,
    Token, WakeUp, Watch, option,
};
use super::deadlines::{Deadlines, Due, Scheduled, take_due};
use crate::{
    LockError, LockInfo, LockKind,
    config::Settings,
    error::BackendError,
    holder::{self, Identity},
    lease::{LossAlarm, fire_held, loss_signal},
    url::{EngineUrl, HostList, query_params, tls_needs_feature},
};

/// etcd v3: `etcd://h1:p1,h2:p2`, `etcds://` with TLS.
pub(super) const BUILT: Built = Built {
    check,
    build: |url, settings| Ok(Arc::new(EtcdBackend::from_url(url, settings)?)),
    options: &[SESSION_TTL],
};

/// `session_ttl=10s` (alias `DLOCK_ETCD_SESSION_TTL`): the TTL of a locker's session lease, how
/// long a crashed or frozen holder keeps its lock at most, and how long the client may go
/// without a keep-alive answered before it counts its holds lost. Whole seconds (rounded up).
const SESSION_TTL: EngineOption = EngineOption {
    name: "session_ttl",
    var: "DLOCK_ETCD_SESSION_TTL",
    example: "6s",
    check: |value| parse_session_ttl(value).map(drop),
};

/// The default session TTL, `etcdctl lock`'s: it rides out a leader election (about a second
/// with the default election timeout) and frees a dead holder's locks within 10s.
const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(10);

const FORM: &str = "etcd://[user:password@]h1:p1,h2:p2[?session_ttl=10s]";

fn parse_session_ttl(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value.trim()) {
        Ok(d) if !d.is_zero() => Ok(Duration::from_secs(
            u64::try_from(lease_seconds(d)).unwrap_or(u64::MAX),
        )),
        _ => Err("expected a positive duration like `10s`".to_owned()),
    }
}

fn check(var: &str, url: &str) -> Result<(), LockError> {
    tls_needs_feature(var, "etcds", url.starts_with("etcds://"))?;
    HostList::parse(var, url, FORM)?;
    for (name, value) in query_params(url) {
        if name != SESSION_TTL.name {
            return Err(LockError::config(format!(
                "{var}: `etcd://` takes no `{name}` option; expected `{FORM}`"
            )));
        }
        parse_session_ttl(value)
            .map_err(|why| LockError::config(format!("{var}: `{name}`: {why}")))?;
    }
    Ok(())
}

/// How a TTL is rounded: whole seconds, at least one.
pub(crate) fn lease_seconds(lease: Duration) -> i64 {
    let secs = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The line of `key` (prefix included): the prefix as is, then the key with `%` and `/` escaped,
/// then `/`.
pub(crate) fn line_of(prefix_len: usize, key: &str) -> String {
    let (prefix, name) = key.split_at(prefix_len.min(key.len()));
    let mut line = String::with_capacity(key.len() + 8);
    line.push_str(prefix);
    for c in name.chars() {
        match c {
            '%' => line.push_str("%25"),
            '/' => line.push_str("%2F"),
            c => line.push(c),
        }
    }
    line.push('/');
    line
}

/// The key a line (see [`line_of`]) is the line of: its name unescaped.
fn key_of_line(prefix_len: usize, line: &str) -> String {
    let (prefix, name) = line.split_at(prefix_len.min(line.len()));
    let name = name.strip_suffix('/').unwrap_or(name);
    format!("{prefix}{}", name.replace("%2F", "/").replace("%25", "%"))
}

/// A task aborted when this is dropped.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One acquisition's presence in etcd: its key in the line, on a session.
#[derive(Debug)]
struct Entry {
    line: String,
    own_key: String,
    /// The kind of lock its key is (its name says it too).
    shape: Shape,
    /// The revision of the last look at the line (a semaphore's waiter watches deletions
    /// from the next one).
    seen: i64,
    /// The session its key lives on.
    epoch: u64,
    /// The create revision of `own_key`, once a reply told it.
    rev: Option<i64>,
    /// An attempt returned it as held.
    granted: bool,
    /// Its wake-up found it first in line at this revision: the next attempt's fence.
    first_at: Option<i64>,
    /// While held: its fence.
    fence: i64,
    /// While held: the client-side end of the hold in the engine's clock (moved on by
    /// renewals), when the key is deleted.
    expiry: Option<Scheduled<Timed>>,
    /// While held: when its loss watch starts, in the engine's clock (a hold that lasts
    /// [`LOSS_WATCH_AFTER`]).
    loss_watch: Option<Scheduled<Timed>>,
    /// While held, from then: the watch of its key's deletion.
    watching: Option<AbortOnDrop>,
    /// While held: fired when the hold is lost (its session ended, its key was deleted, or
    /// its `expire` ran out).
    alarm: Option<LossAlarm>,
}

impl Entry {
    /// Stops what its hold has running on the client: the end of its `expire`, its loss watch.
    fn stop_clocks(&mut self) {
        self.expiry = None;
        self.loss_watch = None;
        self.watching = None;
    }
}

/// What the engine's clock holds for an acquisition (by token).
#[derive(Debug)]
enum Timed {
    /// The hold's `expire` runs out.
    Expire(String),
    /// The hold lasted [`LOSS_WATCH_AFTER`]: its key's deletion is watched from now on.
    WatchLoss(String),
}

/// Entries by token.
type Entries = Arc<Mutex<HashMap<String, Entry>>>;

/// The etcd engine.
pub(crate) struct EtcdBackend {
    conn: Arc<Conn>,
    sessions: Arc<Sessions>,
    watches: Arc<WatchHub>,
    entries: Entries,
    /// The holds' `expire` on the client, and when their loss watches start.
    deadlines: Deadlines<Timed>,
    /// Numbers the keys a session puts.
    next_key: AtomicU64,
    prefix_len: usize,
    key_prefix: String,
    session_ttl: Duration,
    /// Who this locker is: each key's value.
    identity: Identity,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.conn.endpoints)
            .field("request_timeout", &self.conn.request_timeout)
            .field("session_ttl", &self.session_ttl)
            .finish_non_exhaustive()
    }
}

/// `%XX` sequences decoded (URL user info); invalid ones are kept as they are.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// What one look at the line found.
enum Place {
    /// First, with this fence.
    First(i64),
    /// Behind an earlier key.
    Behind,
    /// The key is not in the line any more (its session ended, or it was deleted).
    Gone,
    /// The line is of another kind of lock: why.
    Conflict(String),
}

impl EtcdBackend {
    pub(crate) fn from_url(url: &EngineUrl, settings: &Settings) -> Result<Self, LockError> {
        let hosts = HostList::parse("DLOCK_URL", url.as_str(), FORM)?;
        let tls = url.as_str().starts_with("etcds://");
        let mut options = ConnectOptions::new().with_connect_timeout(settings.request_timeout);
        if let Some(userinfo) = hosts.userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            options = options.with_user(percent_decode(user), percent_decode(password));
        }
        if tls {
            options = tls_options(options)?;
        }
        let session_ttl = match option(url, settings, SESSION_TTL.name) {
            Some((value, from)) => parse_session_ttl(value)
                .map_err(|why| LockError::config(format!("{from}: {why}")))?,
            None => DEFAULT_SESSION_TTL,
        };
        let endpoints = hosts
            .hosts
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        let conn = Arc::new(Conn::new(endpoints, options, settings.request_timeout));
        let entries = Entries::default();
        let sessions = Arc::new(Sessions::new(
            conn.clone(),
            session_ttl,
            Box::new({
                let entries = Arc::downgrade(&entries);
                move |epoch| session_ended(&entries, epoch)
            }),
        ));
        let watches = Arc::new(WatchHub::new(conn.clone()));
        let deadlines = Deadlines::new(Box::new({
            let (conn, watches, entries) = (conn.clone(), watches.clone(), entries.clone());
            let sessions = Arc::downgrade(&sessions);
            move |due, timed| match timed {
                Timed::Expire(token) => expire(&conn, &sessions, &entries, due, &token),
                Timed::WatchLoss(token) => watch_loss(&conn, &watches, &entries, due, &token),
            }
        }));
        Ok(Self {
            sessions,
            watches,
            conn,
            entries,
            deadlines,
            next_key: AtomicU64::new(0),
            prefix_len: settings.key_prefix.len(),
            key_prefix: settings.key_prefix.clone(),
            session_ttl,
            identity: settings.identity.clone(),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new entry for `token` in `key`'s line, on `session`, its key of `shape` (no I/O).
    fn join(&self, key: &str, token: &Token, session: &Session, shape: Shape) {
        let line = line_of(self.prefix_len, key);
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        let own_key = format!("{line}{}{:x}-{n:x}", shape.sub_prefix(), session.lease);
        self.entries().insert(
            token.0.clone(),
            Entry {
                line,
                own_key,
                shape,
                seen: 0,
                epoch: session.epoch,
                rev: None,
                granted: false,
                first_at: None,
                fence: 0,
                expiry: None,
                loss_watch: None,
                watching: None,
                alarm: None,
            },
        );
    }

    /// Puts the entry's key in the line on the session's lease (unless an earlier attempt
    /// whose reply was lost did), and looks at who is ahead, in one transaction.
    async fn enter(
        &self,
        token: &Token,
        (own_key, line, shape): (&str, &str, Shape),
        session: &Session,
    ) -> Result<Place, BackendError> {
        let reads = shape_reads(line, shape);
        let txn = Txn::new()
            .when([Compare::create_revision(own_key, CompareOp::Equal, 0)])
            .and_then(
                std::iter::once(TxnOp::put(
                    own_key,
                    self.identity.since(std::time::SystemTime::now()),
                    Some(PutOptions::new().with_lease(session.lease)),
                ))
                .chain(reads.clone())
                .collect::<Vec<_>>(),
            )
            .or_else(
                std::iter::once(TxnOp::get(own_key, None))
                    .chain(reads)
                    .collect::<Vec<_>>(),
            );
        let resp = match self
            .conn
            .call(
                "join the lock's line",
                |mut c| async move { c.txn(txn).await },
            )
            .await
        {
            Err(e) if lease_gone(&e) => {
                // The session's lease ran out before the key was put: a new session.
                session.lapsed();
                return Ok(Place::Gone);
            }
            other => other?,
        };
        let revision = header_revision(resp.header());
        let responses = resp.op_responses();
        let (my_rev, fresh) = if resp.succeeded() {
            (revision, true)
        } else {
            match first_kv(responses.first()).map(|kv| kv.create_revision()) {
                Some(rev) => (rev, false),
                None => return Ok(Place::Gone),
            }
        };
        if let Some(entry) = self.entries().get_mut(&token.0) {
            entry.rev = Some(my_rev);
            entry.seen = revision;
        }
        let reads = responses.get(1..).unwrap_or_default();
        if let Some(conflict) = conflict_ahead(line, shape, reads.first()) {
            return Ok(Place::Conflict(conflict));
        }
        if !fresh && shape != Shape::Mutex {
            // A put whose reply was lost: looked at again, with its key's revision known.
            return self
                .look(token, (own_key, line, shape), my_rev, session)
                .await;
        }
        let first = first_kv(reads.first()).map(|kv| kv.create_revision());
        match shape {
            Shape::Mutex | Shape::Write => match first {
                // First by the write that put it: that write's revision.
                Some(first) if first == my_rev && fresh => Ok(Place::First(my_rev)),
                // Its key was there already (a reply was lost): a write for a new fence.
                Some(first) if first == my_rev => self.rewrite(own_key, my_rev, session).await,
                Some(_) => Ok(Place::Behind),
                None => Ok(Place::Gone),
            },
            // Nothing but readers was in line when the reader's key was put.
            Shape::Read => match newest(reads.get(1), reads.get(2)) {
                None => Ok(Place::First(my_rev)),
                Some(kv) => Ok(
                    match Shape::Read
                        .conflict(Shape::of_key(line, kv.key_str().unwrap_or_default()))
                    {
                        Some(conflict) => Place::Conflict(conflict),
                        None => Place::Behind,
                    },
                ),
            },
            Shape::Permits(_) => {
                let within = kvs(reads.first())
                    .iter()
                    .any(|kv| kv.create_revision() == my_rev);
                Ok(if within {
                    Place::First(my_rev)
                } else {
                    Place::Behind
                })
            }
        }
    }

    /// A waiter's later look at the line: first (at this read's revision, or a new write's
    /// where holds share the key), still behind, gone, or of another kind. One request: no key
    /// older than its own can appear, so the oldest keys say it all.
    async fn look(
        &self,
        token: &Token,
        (own_key, line, shape): (&str, &str, Shape),
        rev: i64,
        session: &Session,
    ) -> Result<Place, BackendError> {
        if matches!(shape, Shape::Mutex | Shape::Write) {
            let line_owned = line.to_owned();
            let got = self
                .conn
                .call("look at the lock's line", |mut c| async move {
                    c.get(line_owned, Some(first_in_line())).await
                })
                .await?;
            let first = got.kvs().first();
            if let Some(kv) = first
                && let Some(conflict) =
                    shape.conflict(Shape::of_key(line, kv.key_str().unwrap_or_default()))
            {
                return Ok(Place::Conflict(conflict));
            }
            return Ok(match first.map(|kv| kv.create_revision()) {
                Some(first) if first == rev => Place::First(header_revision(got.header())),
                Some(first) if first < rev => Place::Behind,
                _ => Place::Gone,
            });
        }
        let mut ops = vec![
            TxnOp::get(own_key, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(line, Some(first_in_line())),
        ];
        match shape {
            Shape::Permits(permits) => ops.push(TxnOp::get(
                line,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_max_create_revision(rev)
                        .with_limit(i64::from(permits))
                        .with_keys_only(),
                ),
            )),
            _ => ops.extend(non_readers_before(line, Some(rev))),
        }
        let txn = Txn::new().and_then(ops);
        let got = self
            .conn
            .call("look at the lock's line", |mut c| async move {
                c.txn(txn).await
            })
            .await?;
        let revision = header_revision(got.header());
        let responses = got.op_responses();
        if first_kv(responses.first()).is_none_or(|kv| kv.create_revision() != rev) {
            return Ok(Place::Gone);
        }
        if let Some(entry) = self.entries().get_mut(&token.0) {
            entry.seen = revision;
        }
        let checked = if matches!(shape, Shape::Permits(_)) {
            responses.get(2)
        } else {
            responses.get(1)
        };
        if let Some(conflict) = conflict_ahead(line, shape, checked) {
            return Ok(Place::Conflict(conflict));
        }
        match shape {
            Shape::Permits(_) => {
                let within = kvs(responses.get(2))
                    .iter()
                    .any(|kv| kv.create_revision() == rev);
                if within {
                    // Several hold at once: a write of its own for a fence no other has.
                    self.rewrite(own_key, rev, session).await
                } else {
                    Ok(Place::Behind)
                }
            }
            _ => match newest(responses.get(2), responses.get(3)) {
                None => Ok(Place::First(revision)),
                Some(kv) => Ok(
                    match shape.conflict(Shape::of_key(line, kv.key_str().unwrap_or_default())) {
                        Some(conflict) => Place::Conflict(conflict),
                        None => Place::Behind,
                    },
                ),
            },
        }
    }

    /// Re-writes a key that is first in line (same create revision) for a new fence, the
    /// write's revision: a retry must not reuse a fence an earlier attempt may have handed out.
    async fn rewrite(
        &self,
        own_key: &str,
        rev: i64,
        session: &Session,
    ) -> Result<Place, BackendError> {
        let txn = Txn::new()
            .when([Compare::create_revision(own_key, CompareOp::Equal, rev)])
            .and_then([TxnOp::put(
                own_key,
                self.identity.since(std::time::SystemTime::now()),
                Some(PutOptions::new().with_lease(session.lease)),
            )]);
        let resp = match self
            .conn
            .call("take a new fence", |mut c| async move { c.txn(txn).await })
            .await
        {
            Err(e) if lease_gone(&e) => {
                session.lapsed();
                return Ok(Place::Gone);
            }
            other => other?,
        };
        Ok(if resp.succeeded() {
            Place::First(header_revision(resp.header()))
        } else {
            Place::Gone
        })
    }

    /// One attempt on a live session: joins the line or looks at it again.
    async fn attempt(&self, token: &Token, session: &Session) -> Result<Place, BackendError> {
        let known = self.entries().get_mut(&token.0).map(|e| {
            let first_at = if e.granted { None } else { e.first_at.take() };
            (
                e.own_key.clone(),
                e.line.clone(),
                e.shape,
                e.rev,
                e.granted,
                first_at,
            )
        });
        let Some((own_key, line, shape, rev, granted, first_at)) = known else {
            return Ok(Place::Gone);
        };
        let key = (own_key.as_str(), line.as_str(), shape);
        match (rev, first_at) {
            // Its wake-up found it first: that read's revision.
            (Some(_), Some(revision)) => Ok(Place::First(revision)),
            (Some(rev), None) if granted => self.rewrite(&own_key, rev, session).await,
            (Some(rev), None) => self.look(token, key, rev, session).await,
            (None, _) => self.enter(token, key, session).await,
        }
    }

    /// The grant: the hold's deadline on the client (the engine's clock deletes the key when it
    /// passes, and starts its loss watch should it last), and the signal of its loss.
    fn acquired(&self, token: &Token, session: &Session, fence: i64, lease: Duration) -> Attempt {
        let granted_at = Instant::now();
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return Attempt::Held {
                ttl: None,
                queued: false,
            };
        };
        entry.granted = true;
        entry.first_at = None;
        entry.fence = fence;
        entry.stop_clocks();
        let ends_at = granted_at + lease;
        entry.expiry = Some(
            self.deadlines
                .schedule(ends_at, Timed::Expire(token.0.clone())),
        );
        // Even when the lease is shorter: an extension may keep the hold past it.
        entry.loss_watch = Some(self.deadlines.schedule(
            granted_at + LOSS_WATCH_AFTER,
            Timed::WatchLoss(token.0.clone()),
        ));
        let (alarm, lost) = loss_signal();
        entry.alarm = Some(alarm.clone());
        drop(entries);
        // A reply that came after the session ended (its end's look at the entries may have
        // come before this grant): the hold is lost already.
        if session.is_ended() {
            alarm.fire();
        }
        Attempt::Acquired {
            fence: u64::try_from(fence).unwrap_or(0),
            granted: None,
            lost: Some(lost),
            counted_from: Some(granted_at),
        }
    }

    /// Puts `own_key` (created at `rev`) on a new lease of `rest`, kept alive by nobody;
    /// `false` when the key was gone.
    async fn move_to_own_lease(
        &self,
        own_key: &str,
        rev: i64,
        rest: Duration,
    ) -> Result<bool, BackendError> {
        let ttl = lease_seconds(rest);
        let lease = self
            .conn
            .call("grant the kept hold's lease", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?
            .id();
        let txn = Txn::new()
            .when([Compare::create_revision(own_key, CompareOp::Equal, rev)])
            .and_then([TxnOp::put(
                own_key,
                "",
                Some(PutOptions::new().with_lease(lease).with_ignore_value()),
            )]);
        let moved = self
            .conn
            .call("keep the hold", |mut c| async move { c.txn(txn).await })
            .await?
            .succeeded();
        if !moved {
            // The key was gone: the new lease holds nothing.
            let _ = self
                .conn
                .call("revoke an unused lease", |mut c| async move {
                    c.lease_revoke(lease).await
                })
                .await;
        }
        Ok(moved)
    }

    /// Deletes `own_key` (a waiter's, or one whose hold is over) in the background until it is
    /// gone or its session ends (which deletes it anyway): a key left in line would hold the
    /// lock up for the session's life.
    fn delete_later(&self, own_key: String, epoch: u64) {
        let Some(session) = self.sessions.live().filter(|s| s.epoch == epoch) else {
            return;
        };
        let conn = self.conn.clone();
        tokio::spawn(async move { delete_until_gone(&conn, &session, own_key, None).await });
    }
}

/// The keys of a line (read oldest first) that hold it: the first (a mutex, a writer), the
/// readers before the first writer, a semaphore's first `permits`.
fn holding<'a>(line: &str, kvs: &'a [etcd_client::KeyValue]) -> &'a [etcd_client::KeyValue] {
    let Some(first) = kvs.first() else {
        return kvs;
    };
    let n = match Shape::of_key(line, first.key_str().unwrap_or_default()) {
        Shape::Mutex | Shape::Write => 1,
        Shape::Permits(permits) => usize::try_from(permits).unwrap_or(usize::MAX),
        Shape::Read => kvs
            .iter()
            .take_while(|kv| Shape::of_key(line, kv.key_str().unwrap_or_default()) == Shape::Read)
            .count(),
    };
    &kvs[..n.min(kvs.len())]
}

/// The oldest key of a line.
fn first_in_line() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only()
}

/// The reads that follow the put of a key of `shape` in `line`: the first key of the line
/// (whose kind says the line's), and what decides: a semaphore's first `permits` keys, a
/// reader's last writer (all are older than a key being put).
fn shape_reads(line: &str, shape: Shape) -> Vec<TxnOp> {
    match shape {
        Shape::Mutex | Shape::Write => vec![TxnOp::get(line, Some(first_in_line()))],
        Shape::Read => {
            let [below, above] = non_readers_before(line, None);
            vec![TxnOp::get(line, Some(first_in_line())), below, above]
        }
        Shape::Permits(permits) => vec![TxnOp::get(
            line,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(i64::from(permits))
                    .with_keys_only(),
            ),
        )],
    }
}

/// The newest key of `line` that is not a reader's (a writer's, or one of another kind:
/// `etcdctl lock`'s or an older dlock's, which look at no kinds), created before revision
/// `before` (all of them, when `None`): a reader waits for it. Two ranges, the keys of the line
/// below `read/` and above it, newest first.
fn non_readers_before(line: &str, before: Option<i64>) -> [TxnOp; 2] {
    let options = |end: String| {
        let options = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        match before {
            Some(rev) => options.with_max_create_revision(rev - 1),
            None => options,
        }
    };
    let readers = format!("{line}{}", Shape::Read.sub_prefix());
    // Just past every `read/…` key, and just past the line (its `/` plus one).
    let after_readers = format!("{}0", &readers[..readers.len() - 1]);
    let after_line = format!("{}0", &line[..line.len() - 1]);
    [
        TxnOp::get(line, Some(options(readers))),
        TxnOp::get(after_readers.as_str(), Some(options(after_line))),
    ]
}

/// The newer of two single-key reads' keys.
fn newest<'a>(
    a: Option<&'a TxnOpResponse>,
    b: Option<&'a TxnOpResponse>,
) -> Option<&'a etcd_client::KeyValue> {
    match (first_kv(a), first_kv(b)) {
        (Some(a), Some(b)) => Some(if a.create_revision() > b.create_revision() {
            a
        } else {
            b
        }),
        (a, b) => a.or(b),
    }
}

/// The keys a read in a transaction found.
fn kvs(response: Option<&TxnOpResponse>) -> &[etcd_client::KeyValue] {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    }
}

fn first_kv(response: Option<&TxnOpResponse>) -> Option<&etcd_client::KeyValue> {
    kvs(response).first()
}

/// The conflict of a key of `shape` with the first keys of its line (`read`): one of another
/// kind is ahead.
fn conflict_ahead(line: &str, shape: Shape, read: Option<&TxnOpResponse>) -> Option<String> {
    kvs(read).iter().find_map(|kv| {
        let key = kv.key_str().ok()?;
        shape.conflict(Shape::of_key(line, key))
    })
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, etcd_client::ResponseHeader::revision)
}

/// A hold's `expire` ran out on the client (`due`, its entry in the engine's clock, unless a
/// renewal moved it since): it is forgotten, its loss reported, and its key deleted.
fn expire(
    conn: &Arc<Conn>,
    sessions: &std::sync::Weak<Sessions>,
    entries: &Entries,
    due: Due,
    token: &str,
) {
    let entry = take_due(entries, token, due, |e: &Entry| e.expiry.as_ref());
    let Some(mut entry) = entry else { return };
    entry.stop_clocks();
    if let Some(alarm) = &entry.alarm {
        alarm.fire();
    }
    // Its session ended: its key went with it.
    let live = sessions.upgrade().and_then(|s| s.live());
    let Some(session) = live.filter(|s| s.epoch == entry.epoch) else {
        return;
    };
    let conn = conn.clone();
    let (own_key, rev) = (entry.own_key, entry.rev);
    tokio::spawn(async move { delete_until_gone(&conn, &session, own_key, rev).await });
}

/// A hold lasted [`LOSS_WATCH_AFTER`] (`due`, its entry in the engine's clock): from now on,
/// its key's deletion (by hand) is watched, and reported as its loss.
fn watch_loss(conn: &Arc<Conn>, hub: &Arc<WatchHub>, entries: &Entries, due: Due, token: &str) {
    let mut all = entries.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(entry) = all.get_mut(token).filter(|e| {
        e.loss_watch
            .as_ref()
            .is_some_and(|watch| watch.due() == due)
    }) else {
        return;
    };
    entry.loss_watch = None;
    let (Some(rev), Some(alarm)) = (entry.rev, entry.alarm.clone()) else {
        return;
    };
    let deletion = KeyDeletion {
        conn: conn.clone(),
        hub: hub.clone(),
        own_key: entry.own_key.clone(),
        rev,
        fence: entry.fence,
    };
    let (weak, token, epoch) = (Arc::downgrade(entries), token.to_owned(), entry.epoch);
    entry.watching = Some(AbortOnDrop(tokio::spawn(async move {
        deletion.deleted().await;
        if weak.upgrade().is_some_and(|all| {
            (all.lock().unwrap_or_else(PoisonError::into_inner))
                .get(&token)
                .is_some_and(|e| e.epoch == epoch && e.granted)
        }) {
            alarm.fire();
        }
    })));
}

/// A session ended: every hold of it is lost (its keys went with it, or will once etcd
/// expires its lease).
fn session_ended(entries: &std::sync::Weak<Mutex<HashMap<String, Entry>>>, epoch: u64) {
    let Some(entries) = entries.upgrade() else {
        return;
    };
    fire_held(&entries, |e| {
        e.alarm.as_ref().filter(|_| e.epoch == epoch && e.granted)
    });
}

/// Deletes `own_key` (only while its create revision is `rev`, when given), asking again until
/// it is gone or the session ends.
async fn delete_until_gone(conn: &Conn, session: &Session, own_key: String, rev: Option<i64>) {
    while !session.is_ended() {
        let key = own_key.clone();
        let deleted = conn
            .call("delete the lock key", |mut c| async move {
                match rev {
                    Some(rev) => c.txn(owner_delete(&key, rev)).await.map(drop),
                    None => c.delete(key, None).await.map(drop),
                }
            })
            .await;
        if deleted.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes `own_key` only while its create revision is `rev` (the hold's own key).
fn owner_delete(own_key: &str, rev: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(own_key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(own_key, None)])
}

/// Holds shorter than this never watch their key: a lock deleted by hand is one that stays, and
/// a watch for every hold would cost etcd a watcher (a create and a cancel) per acquisition.
const LOSS_WATCH_AFTER: Duration = Duration::from_secs(1);

/// A holder's key, and where to watch its deletion.
struct KeyDeletion {
    conn: Arc<Conn>,
    hub: Arc<WatchHub>,
    own_key: String,
    /// Its create revision.
    rev: i64,
    fence: i64,
}

impl KeyDeletion {
    /// Resolves when the key is deleted (or re-created: another acquisition's) after the fence.
    /// Watched from the revision after the fence (started once the hold has lasted
    /// [`LOSS_WATCH_AFTER`]), so nothing in between is missed; a watch the stream cannot keep
    /// (a compacted history) is followed by a look at the key and a new watch from there.
    async fn deleted(self) {
        let mut start = self.fence + 1;
        loop {
            let mut watch = self.hub.deletion(self.own_key.clone(), Some(start));
            if watch.fired().await == Fired::Deleted {
                return;
            }
            drop(watch);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let key = self.own_key.clone();
            let got = self
                .conn
                .call("check the lock key", |mut c| async move {
                    c.get(key, Some(GetOptions::new().with_keys_only())).await
                })
                .await;
            if let Ok(got) = got {
                if got
                    .kvs()
                    .first()
                    .is_none_or(|kv| kv.create_revision() != self.rev)
                {
                    return;
                }
                start = header_revision(got.header()) + 1;
            }
        }
    }
}

/// Waits until no key created before `rev` is left in `line` (etcd's `waitDeletes`), then
/// records the revision of the read that found its key first (the fence of the attempt that
/// follows) and notifies; each wake-up is the deletion of the waiter's predecessor.
async fn wait_turn(
    conn: Arc<Conn>,
    hub: Arc<WatchHub>,
    entries: Entries,
    token: String,
    (line, rev): (String, i64),
    notify: Arc<Notify>,
) {
    loop {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(rev)
            .with_limit(2)
            .with_keys_only();
        let key = line.clone();
        let found = conn
            .call("find the waiter ahead", |mut c| async move {
                c.get(key, Some(options)).await
            })
            .await;
        let Ok(got) = found else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let (own, ahead) = own_and_ahead(&got, rev);
        if own
            && ahead.is_none()
            && let Some(entry) = entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(&token)
                .filter(|e| !e.granted)
        {
            entry.first_at = Some(header_revision(got.header()));
        }
        let Some(ahead) = ahead.filter(|_| own) else {
            // First, or its key is gone: the attempt tells.
            notify.notify_waiters();
            return;
        };
        let start = header_revision(got.header()) + 1;
        if hub.deletion(ahead, Some(start)).fired().await == Fired::Broken {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A reader's wake-up: waits until no key but readers' created before `rev` is left in `line`
/// (etcd's `recipe.RWMutex`, which waits for writers; here keys of other kinds count too),
/// watching the newest one's deletion, then notifies.
async fn wait_for_writers(
    conn: Arc<Conn>,
    hub: Arc<WatchHub>,
    (line, rev): (String, i64),
    notify: Arc<Notify>,
) {
    loop {
        let txn = Txn::new().and_then(non_readers_before(&line, Some(rev)));
        let found = conn
            .call(
                "find the writer ahead",
                |mut c| async move { c.txn(txn).await },
            )
            .await;
        let Ok(got) = found else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let responses = got.op_responses();
        let Some(ahead) = newest(responses.first(), responses.get(1)) else {
            notify.notify_waiters();
            return;
        };
        let ahead = String::from_utf8_lossy(ahead.key()).into_owned();
        let start = header_revision(got.header()) + 1;
        if hub.deletion(ahead, Some(start)).fired().await == Fired::Broken {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A semaphore waiter's wake-up: any key of its line deleted after revision `seen` (the last
/// look's) may let it in; each one notifies, and the attempt that follows counts again.
async fn wait_for_deletions(hub: Arc<WatchHub>, line: String, seen: i64, notify: Arc<Notify>) {
    let mut start = Some(seen + 1);
    loop {
        let mut watch = hub.deletion_under(line.clone(), start);
        match watch.fired().await {
            Fired::Deleted => start = Some(watch.at() + 1),
            Fired::Broken => {
                // From now on (the history may be compacted): the attempt this wakes reads
                // the line, and the waiting loop's fallback pause covers the gap.
                tokio::time::sleep(Duration::from_millis(200)).await;
                start = None;
            }
        }
        notify.notify_waiters();
    }
}

/// Of a read of a line's keys created at `rev` or before, newest first: whether the newest is
/// the waiter's own key (created at `rev`), and the key just before it.
fn own_and_ahead(got: &GetResponse, rev: i64) -> (bool, Option<String>) {
    let kvs = got.kvs();
    let own = kvs.first().is_some_and(|kv| kv.create_revision() == rev);
    let ahead = kvs
        .get(1)
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
    (own, ahead)
}

impl Backend for EtcdBackend {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            let token = request.token;
            // Joining again after the session ended (its key went with it) is the only
            // repetition; bounded all the same.
            for _ in 0..3 {
                let session = self.sessions.session().await?;
                let epoch = self.entries().get(&token.0).map(|e| e.epoch);
                match epoch {
                    None => self.join(request.key, token, &session, Shape::of(request.kind)),
                    Some(epoch) if epoch != session.epoch => {
                        // Its session ended, and its key with it: join again, at the end.
                        self.entries().remove(&token.0);
                        continue;
                    }
                    Some(_) => {}
                }
                match self.attempt(token, &session).await? {
                    Place::First(fence) => {
                        return Ok(self.acquired(token, &session, fence, request.lease));
                    }
                    Place::Behind => {
                        return Ok(Attempt::Held {
                            ttl: None,
                            queued: true,
                        });
                    }
                    Place::Gone => {
                        self.entries().remove(&token.0);
                    }
                    Place::Conflict(why) => {
                        // Its key leaves the line before the refusal is told.
                        let _ = self.release(request.key, request.kind, token).await;
                        return Ok(Attempt::Conflict(why));
                    }
                }
            }
            Err(BackendError::new(
                "etcd: the session kept ending before a key could be put in line",
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
            let Some(mut entry) = self.entries().remove(&token.0) else {
                return Ok(false);
            };
            entry.stop_clocks();
            let live = self.sessions.live().is_some_and(|s| s.epoch == entry.epoch);
            let (own_key, epoch) = (entry.own_key.clone(), entry.epoch);
            // A waiter, a put whose reply was lost (or never came), or a hold whose session
            // ended held nothing it knew of: its key goes, if it is still there.
            let held = entry.rev.filter(|_| entry.granted && live);
            let key = own_key.clone();
            // A plain delete, not a transaction comparing the key's create revision first (on
            // etcd 3.4 the transaction cost the servers more CPU per cycle: docs/benchmark.md).
            // Every key of this name is this token's: it carries the session's lease ID and a
            // number this locker gives once. Yet one may be another put of this token's than
            // the hold's (a first attempt that timed out, applied late after the hold's key was
            // deleted by hand): it goes too, and the hold was still there only if the key
            // deleted has the hold's create revision.
            let deleted = self
                .conn
                .call("delete the lock key", |mut c| async move {
                    let options = DeleteOptions::new().with_prev_key();
                    c.delete(key, Some(options)).await.map(|r| {
                        held.is_some_and(|rev| {
                            r.prev_kvs().iter().any(|kv| kv.create_revision() == rev)
                        })
                    })
                })
                .await;
            match deleted {
                Ok(deleted) => Ok(deleted),
                Err(error) => {
                    self.delete_later(own_key, epoch);
                    Err(error)
                }
            }
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            // A read where the locks live (a user limited to the lock prefix may read it).
            let prefix = self.key_prefix.clone();
            self.conn
                .call("read the lock prefix", |mut c| async move {
                    let options = GetOptions::new()
                        .with_prefix()
                        .with_count_only()
                        .with_serializable();
                    c.get(prefix, Some(options)).await
                })
                .await
                .map(drop)
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let line = line_of(self.prefix_len, key);
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            let got = self
                .conn
                .call("read the lock's line", |mut c| async move {
                    c.get(line, Some(options)).await
                })
                .await?;
            let holders = holding(&line_of(self.prefix_len, key), got.kvs());
            let Some(first) = holders.first() else {
                return Ok(None);
            };
            let mut info = LockInfo::new(key.to_owned());
            info.kind = Shape::of_key(
                &line_of(self.prefix_len, key),
                first.key_str().unwrap_or_default(),
            )
            .kind();
            info.holders = holders.len();
            info.holder = first.value_str().ok().and_then(holder::parse);
            info.waiters = Some(got.kvs().len() - holders.len());
            let lease = first.lease();
            if lease != 0 {
                let ttl = self
                    .conn
                    .call("read the holder's lease", |mut c| async move {
                        c.lease_time_to_live(lease, None).await
                    })
                    .await?;
                info.remaining = u64::try_from(ttl.ttl()).ok().map(Duration::from_secs);
            }
            Ok(Some(info))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let mut escaped = line_of(self.prefix_len, prefix);
            escaped.pop();
            let options = GetOptions::new().with_prefix().with_keys_only();
            let got = self
                .conn
                .call("list the lock lines", |mut c| async move {
                    c.get(escaped, Some(options)).await
                })
                .await?;
            Ok(got
                .kvs()
                .iter()
                .filter_map(|kv| {
                    // The line ends at the first `/` after the prefix (a key's own are escaped).
                    let own_key = kv.key_str().ok()?;
                    let end = self.prefix_len + own_key.get(self.prefix_len..)?.find('/')?;
                    Some(key_of_line(self.prefix_len, &own_key[..=end]))
                })
                .collect())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let line = line_of(self.prefix_len, key);
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            let read = line.clone();
            let got = self
                .conn
                .call("read the lock's line", |mut c| async move {
                    c.get(read, Some(options)).await
                })
                .await?;
            let holders = holding(&line, got.kvs());
            let Some(first) = holders.first() else {
                return Ok(None);
            };
            let mut info = LockInfo::new(key.to_owned());
            info.kind = Shape::of_key(&line, first.key_str().unwrap_or_default()).kind();
            info.holder = first.value_str().ok().and_then(holder::parse);
            info.holders = 0;
            for kv in holders {
                let own_key = kv.key_str().map_err(|_| {
                    BackendError::new("etcd: a key in the lock's line is not UTF-8")
                })?;
                let delete = owner_delete(own_key, kv.create_revision());
                let deleted = self
                    .conn
                    .call("delete the holder's key", |mut c| async move {
                        c.txn(delete).await
                    })
                    .await?;
                // Not deleted: the holder released it meanwhile (the next holder is not
                // touched).
                if deleted.succeeded() {
                    info.holders += 1;
                }
            }
            Ok((info.holders > 0).then_some(info))
        })
    }

    /// Moves the holder's key from the session's lease to a lease of its own, `rest` long
    /// (rounded up to whole seconds) and kept alive by nobody: etcd deletes it then, whether or
    /// not this process lives (the session's end no longer touches it).
    fn keep<'a>(
        &'a self,
        _key: &'a str,
        token: &'a Token,
        rest: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let Some(mut entry) = self.entries().remove(&token.0) else {
                return Ok(false);
            };
            entry.stop_clocks();
            let Some(session) = self.sessions.live().filter(|s| s.epoch == entry.epoch) else {
                return Ok(false);
            };
            let (Some(rev), true) = (entry.rev, entry.granted) else {
                return Ok(false);
            };
            let own_key = entry.own_key;
            match self.move_to_own_lease(&own_key, rev, rest).await {
                Ok(moved) => Ok(moved),
                Err(error) => {
                    // Still on the session's lease, which this locker renews: deleted once the
                    // rest has passed (or with the session), as it would have lapsed.
                    let conn = self.conn.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(rest).await;
                        delete_until_gone(&conn, &session, own_key, Some(rev)).await;
                    });
                    Err(error)
                }
            }
        })
    }

    fn lapses_within(&self, lease: Duration) -> Duration {
        // A key stays while its session lives, and the session as long as this client; a
        // removal that failed is asked again in the background meanwhile.
        lease.max(self.session_ttl)
    }

    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            // Every hold was released and every cleanup done: what is left is an entry whose
            // removal failed. Revoking the session's lease deletes its key.
            self.entries().clear();
            self.sessions.close().await
        })
    }

    fn watch<'a>(
        &'a self,
        _key: &'a str,
        token: &'a Token,
        _place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let (line, rev, shape, seen) = {
                let entries = self.entries();
                let entry = entries.get(&token.0)?;
                (entry.line.clone(), entry.rev?, entry.shape, entry.seen)
            };
            let notify = Arc::new(Notify::new());
            let (conn, hub) = (self.conn.clone(), self.watches.clone());
            let task = match shape {
                Shape::Mutex | Shape::Write => tokio::spawn(wait_turn(
                    conn,
                    hub,
                    self.entries.clone(),
                    token.0.clone(),
                    (line, rev),
                    notify.clone(),
                )),
                Shape::Read => {
                    tokio::spawn(wait_for_writers(conn, hub, (line, rev), notify.clone()))
                }
                Shape::Permits(_) => {
                    tokio::spawn(wait_for_deletions(hub, line, seen, notify.clone()))
                }
            };
            Some(Watch::new(notify, NextInLine::default(), AbortOnDrop(task)))
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
            let Some((own_key, rev, epoch)) = self.entries().get(&token.0).and_then(|e| {
                let rev = e.rev.filter(|_| e.granted)?;
                Some((e.own_key.clone(), rev, e.epoch))
            }) else {
                return Ok(false);
            };
            if self.sessions.live().is_none_or(|s| s.epoch != epoch) {
                return Ok(false);
            }
            let key = own_key.clone();
            let got = self
                .conn
                .call("check the lock key", |mut c| async move {
                    c.get(key, Some(GetOptions::new().with_keys_only())).await
                })
                .await?;
            if got
                .kvs()
                .first()
                .is_none_or(|kv| kv.create_revision() != rev)
            {
                self.entries().remove(&token.0);
                return Ok(false);
            }
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(&token.0).filter(|e| e.expiry.is_some()) else {
                return Ok(false);
            };
            entry.expiry = Some(
                self.deadlines
                    .schedule(sent_at + lease, Timed::Expire(token.0.clone())),
            );
            Ok(true)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: FairOrder::Native,
            passes: false,
            wake_up: WakeUp::Predecessor,
            cannot_keep: None,
            cannot_share: None,
            places: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn session_ttls_are_whole_seconds() {
        assert_eq!(parse_session_ttl("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_session_ttl("1500ms"), Ok(Duration::from_secs(2)));
        assert!(parse_session_ttl("0s").is_err());
        assert!(parse_session_ttl("soon").is_err());
        assert!(check("X", "etcd://a:1?session_ttl=5s").is_ok());
        assert!(check("X", "etcd://a:1?session_ttl=0s").is_err());
        assert!(check("X", "etcd://a:1?wait=1").is_err());
    }

    #[test]
    fn lines_escape_slashes_and_percents_after_the_prefix() {
        assert_eq!(line_of(6, "dlock:a"), "dlock:a/");
        assert_eq!(line_of(6, "dlock:a/b"), "dlock:a%2Fb/");
        assert_eq!(line_of(6, "dlock:a%2Fb"), "dlock:a%252Fb/");
        assert_eq!(line_of(4, "app/x/y"), "app/x%2Fy/");
        assert!(!line_of(6, "dlock:a/b").starts_with(&line_of(6, "dlock:a")));
    }

    #[test]
    fn user_info_is_percent_decoded() {
        assert_eq!(percent_decode("p%40ss%2Fw"), "p@ss/w");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
