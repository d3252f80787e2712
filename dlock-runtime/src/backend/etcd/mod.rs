//! etcd v3, with etcd's own lock recipe (Go's `concurrency.Mutex`, `etcdctl lock`), so dlock and
//! those tools exclude each other on the same name.
//!
//! - **Layout**: the lock `<prefix><key>` is the *line* `<prefix><key>/` (with `/` and `%` in
//!   the key written `%2F` and `%25`, so `a` and `a/b` never share a line). Each holder or
//!   waiter puts `<line><its lease id in hex>` with its own lease; the key with the lowest create
//!   revision holds, the others wait in create-revision order.
//! - **Lease**: one per acquisition, granted for the lock's `expire` rounded up to whole seconds
//!   (the server may raise it to its minimum, `1.5 × election timeout`, rounded up: the granted
//!   TTL is what the guard's clock counts). A waiter's lease is kept alive while it waits; a
//!   holder's only by renewal (`expire = "auto"`), so a fixed `expire` ends on the server.
//! - **Fence**: the revision of the write that made the holder first: its create revision when
//!   the lock was free, or the revision of the re-put with which a waiter (or a retry that finds
//!   its own key) takes over. Successive holders are separated by the deletion of the previous
//!   holder's key, so fences strictly increase per key.
//! - **Waiting**: a waiter watches the deletion of the last key created before its own (its
//!   predecessor) and is woken only when no earlier key is left.
//! - **Loss**: a watch on the holder's key; its deletion (lease expired, revoked, deleted by an
//!   operator) marks the hold lost at once. A renewal that finds the lease gone does too.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::{sync::Notify, task::JoinHandle};

use super::api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, FairOrder, NextInLine, Request, Token, Watch,
};
use crate::lease::LossSignal;
use crate::{
    LockError,
    config::Settings,
    error::BackendError,
    url::{EngineUrl, HostList, tls_needs_feature},
};

/// etcd v3: `etcd://h1:p1,h2:p2`, `etcds://` with TLS.
pub(super) const BUILT: Built = Built {
    check,
    build: |url, settings| Ok(Arc::new(EtcdBackend::from_url(url, settings)?)),
    options: &[],
};

const FORM: &str = "etcd://[user:password@]h1:p1,h2:p2";

fn check(var: &str, url: &str) -> Result<(), LockError> {
    tls_needs_feature(var, "etcds", url.starts_with("etcds://"))?;
    let hosts = HostList::parse(var, url, FORM)?;
    if hosts.query.is_some() {
        return Err(LockError::config(format!(
            "{var}: `etcd://` takes no query; expected `{FORM}`"
        )));
    }
    Ok(())
}

/// How a lease is rounded: whole seconds, at least one.
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

/// One acquisition's presence in etcd: its lease and its key in the line.
#[derive(Debug)]
struct Entry {
    lease: i64,
    /// The TTL the server granted, in seconds.
    ttl: i64,
    line: String,
    own_key: String,
    /// The create revision of `own_key`, once a reply told it.
    rev: Option<i64>,
    /// Keeps a waiter's lease alive while it waits (aborted when dropped).
    keeper: Option<AbortOnDrop>,
}

/// A task aborted when this is dropped.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The connection: the endpoints, one client at a time on one of them, and the request bound.
struct Conn {
    endpoints: Vec<String>,
    options: ConnectOptions,
    request_timeout: Duration,
    /// The client in use, on `endpoints[current.1]`, and how many times the endpoint changed
    /// (so that concurrent failures move on once).
    current: Mutex<(Option<Client>, usize, u64)>,
    connecting: tokio::sync::Mutex<()>,
}

/// Entries by token.
type Entries = Arc<Mutex<HashMap<String, Entry>>>;

/// The etcd engine.
pub(crate) struct EtcdBackend {
    conn: Arc<Conn>,
    entries: Entries,
    prefix_len: usize,
    key_prefix: String,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.conn.endpoints)
            .field("request_timeout", &self.conn.request_timeout)
            .finish_non_exhaustive()
    }
}

/// `%XX` sequences decoded (URL user info); invalid ones are kept as they are.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
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
        let endpoints = hosts
            .hosts
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        Ok(Self {
            conn: Arc::new(Conn {
                endpoints,
                options,
                request_timeout: settings.request_timeout,
                current: Mutex::new((None, 0, 0)),
                connecting: tokio::sync::Mutex::new(()),
            }),
            entries: Arc::default(),
            prefix_len: settings.key_prefix.len(),
            key_prefix: settings.key_prefix.clone(),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lease for a new entry of `token` in `key`'s line.
    async fn join(&self, key: &str, token: &Token, lease: Duration) -> Result<(), BackendError> {
        let ttl = lease_seconds(lease);
        let granted = self
            .conn
            .call("grant a lease", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        let line = line_of(self.prefix_len, key);
        let own_key = format!("{line}{:x}", granted.id());
        self.entries().insert(
            token.0.clone(),
            Entry {
                lease: granted.id(),
                ttl: granted.ttl(),
                line,
                own_key,
                rev: None,
                keeper: None,
            },
        );
        Ok(())
    }

    /// Puts the entry's key in the line (unless an earlier attempt whose reply was lost did):
    /// `Some(fence)` when that made it first, `None` when it waits (or its key was there before:
    /// then [`take_over`](Self::take_over) decides).
    async fn enter(
        &self,
        token: &Token,
        own_key: String,
        line: String,
        lease: i64,
    ) -> Result<Entered, BackendError> {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(
                own_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    own_key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(line.as_str(), Some(first.clone())),
            ])
            .or_else([
                TxnOp::get(own_key.as_str(), None),
                TxnOp::get(line.as_str(), Some(first)),
            ]);
        let resp = match self
            .conn
            .call(
                "join the lock's line",
                |mut c| async move { c.txn(txn).await },
            )
            .await
        {
            Err(e) if e.to_string().contains("lease not found") => {
                // The lease ran out before the key was put: start again with a new one.
                self.entries().remove(&token.0);
                return Ok(Entered::Again);
            }
            other => other?,
        };
        let revision = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let responses = resp.op_responses();
        let create_of = |r: Option<&TxnOpResponse>| match r {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        let my_rev = if resp.succeeded() {
            revision
        } else {
            create_of(responses.first()).ok_or_else(|| {
                BackendError::new("etcd: the lock key vanished inside a transaction")
            })?
        };
        if let Some(entry) = self.entries().get_mut(&token.0) {
            entry.rev = Some(my_rev);
        }
        let owner = create_of(responses.get(1));
        Ok(match (owner == Some(my_rev), resp.succeeded()) {
            (true, true) => Entered::Holds(my_rev),
            (true, false) => Entered::TakeOver,
            (false, _) => Entered::Waits,
        })
    }

    /// A key already in the line: if it is first, re-put it (its revision is the new fence) and
    /// refresh its lease; otherwise it keeps waiting. `None` when the key is gone.
    async fn take_over(
        &self,
        own_key: String,
        line: String,
        lease: i64,
        rev: i64,
    ) -> Result<Option<Result<i64, ()>>, BackendError> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(own_key.as_str(), CompareOp::Equal, rev),
                // Every key of the line, this one included, was created at `rev` or later.
                Compare::create_revision(line.as_str(), CompareOp::Greater, rev - 1).with_prefix(),
            ])
            .and_then([TxnOp::put(
                own_key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(own_key.as_str(), None)]);
        let take = self
            .conn
            .call("take the lock", |mut c| async move { c.txn(txn).await });
        // Sent with the take-over so the lease counts from after the attempt began: a waiter's
        // lease was last refreshed earlier.
        let refresh = self.conn.keep_alive(lease);
        let (taken, refreshed) = tokio::join!(take, refresh);
        let taken = match taken {
            Err(e) if e.to_string().contains("lease not found") => return Ok(None),
            other => other?,
        };
        if taken.succeeded() {
            if !refreshed? {
                return Ok(None);
            }
            let fence = taken
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            return Ok(Some(Ok(fence)));
        }
        let exists = matches!(taken.op_responses().first(),
            Some(TxnOpResponse::Get(get)) if !get.kvs().is_empty());
        Ok(exists.then_some(Err(())))
    }

    /// Keeps `lease` alive while its owner waits in line: a keep-alive at a third of its TTL.
    fn keep_waiting(&self, token: &Token) {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return;
        };
        if entry.keeper.is_some() {
            return;
        }
        let (conn, lease) = (self.conn.clone(), entry.lease);
        let period = Duration::from_secs(u64::try_from(entry.ttl.max(1)).unwrap_or(1)) / 3;
        entry.keeper = Some(AbortOnDrop(tokio::spawn(async move {
            let mut next = period;
            loop {
                tokio::time::sleep(next).await;
                next = match conn.keep_alive(lease).await {
                    Ok(true) => period,
                    // Gone: the next attempt finds its key missing and joins again.
                    Ok(false) => return,
                    Err(_) => period / 4,
                };
            }
        })));
    }

    fn acquired(&self, token: &Token, fence: i64, request: &Request<'_>) -> Attempt {
        let (own_key, ttl) = {
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(&token.0) else {
                return Attempt::Held {
                    ttl: None,
                    queued: false,
                };
            };
            // A holder's fixed lease must end on the server: no more keep-alive.
            entry.keeper = None;
            (entry.own_key.clone(), entry.ttl)
        };
        let granted = Duration::from_secs(u64::try_from(ttl).unwrap_or(1));
        Attempt::Acquired {
            fence: u64::try_from(fence).unwrap_or(0),
            granted: (granted != request.lease).then_some(granted),
            lost: Some(self.loss_signal(token, own_key, fence)),
        }
    }

    /// Resolves when `own_key` is deleted after revision `fence` while `token` still has it
    /// (a release removes the entry first, so its own deletion is not a loss).
    fn loss_signal(&self, token: &Token, own_key: String, fence: i64) -> LossSignal {
        let (conn, entries, token) = (self.conn.clone(), self.entries.clone(), token.0.clone());
        LossSignal(Box::pin(async move {
            let mut start = fence + 1;
            loop {
                match conn.deletion(&own_key, start).await {
                    Ok(Deletion::Deleted) => {
                        let ours = entries
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .contains_key(&token);
                        if ours {
                            return;
                        }
                        std::future::pending::<()>().await;
                    }
                    Ok(Deletion::Compacted(rev)) => {
                        // The history was compacted past `start`: look at the key itself.
                        let key = own_key.clone();
                        match conn
                            .call("check the lock key", |mut c| async move {
                                c.get(key, None).await
                            })
                            .await
                        {
                            Ok(got) => {
                                let alive = got
                                    .kvs()
                                    .first()
                                    .is_some_and(|kv| kv.mod_revision() >= fence);
                                if !alive {
                                    return;
                                }
                                start = rev.max(start);
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }))
    }
}

enum Entered {
    /// First in line with this fence.
    Holds(i64),
    /// Its key was there already and is first: re-put it for a new fence.
    TakeOver,
    Waits,
    /// The lease was gone: join again.
    Again,
}

enum Deletion {
    Deleted,
    /// The watch could not start: history before this revision is compacted.
    Compacted(i64),
}

impl Conn {
    /// The client in use, made (without I/O unless the URL has credentials) on first use.
    async fn client(&self) -> Result<(Client, u64), BackendError> {
        if let (Some(client), _, epoch) =
            &*self.current.lock().unwrap_or_else(PoisonError::into_inner)
        {
            return Ok((client.clone(), *epoch));
        }
        let _one = self.connecting.lock().await;
        let (index, epoch) = {
            let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(client) = &current.0 {
                return Ok((client.clone(), current.2));
            }
            (current.1, current.2)
        };
        let endpoint = self.endpoints[index % self.endpoints.len()].clone();
        let connect = Client::connect([endpoint], Some(self.options.clone()));
        let client = match tokio::time::timeout(self.request_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                self.next_endpoint(epoch);
                return Err(error("connect", &e));
            }
            Err(_) => {
                self.next_endpoint(epoch);
                return Err(BackendError::new(
                    "etcd: could not connect within the request timeout",
                ));
            }
        };
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.0 = Some(client.clone());
        Ok((client, current.2))
    }

    /// Drops the client and moves to the next endpoint, once per failure of `epoch`.
    fn next_endpoint(&self, epoch: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.2 == epoch {
            current.0 = None;
            current.1 = (current.1 + 1) % self.endpoints.len();
            current.2 += 1;
        }
    }

    /// One request, bounded by the request timeout; a transport failure moves to the next
    /// endpoint for the following requests.
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let (client, epoch) = self.client().await?;
        match tokio::time::timeout(self.request_timeout, f(client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if is_transport(&e) {
                    self.next_endpoint(epoch);
                }
                Err(error(what, &e))
            }
            Err(_) => {
                self.next_endpoint(epoch);
                Err(BackendError::new(format!(
                    "etcd: no reply within the request timeout ({:?}) to {what}",
                    self.request_timeout
                )))
            }
        }
    }

    /// One keep-alive of `lease`: `false` when the lease is gone.
    async fn keep_alive(&self, lease: i64) -> Result<bool, BackendError> {
        let outcome = self
            .call("renew the lease", |mut c| async move {
                c.lease_keep_alive(lease).await.map(drop)
            })
            .await;
        match outcome {
            Ok(()) => Ok(true),
            Err(e) if e.to_string().contains("lease not found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn revoke(&self, lease: i64) -> Result<bool, BackendError> {
        match self
            .call("revoke the lease", |mut c| async move {
                c.lease_revoke(lease).await
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.to_string().contains("lease not found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits for the deletion of `key` at revision `start` or later.
    async fn deletion(&self, key: &str, start: i64) -> Result<Deletion, BackendError> {
        let options = WatchOptions::new()
            .with_start_revision(start)
            .with_filters([WatchFilterType::NoPut]);
        let key = key.to_owned();
        let mut stream = self
            .call("watch a lock key", |mut c| async move {
                c.watch(key, Some(options)).await
            })
            .await?;
        loop {
            let Some(resp) = stream
                .message()
                .await
                .map_err(|e| error("watch a lock key", &e))?
            else {
                return Err(BackendError::new("etcd: the watch stream ended"));
            };
            if resp.compact_revision() > 0 {
                return Ok(Deletion::Compacted(resp.compact_revision()));
            }
            if resp.canceled() {
                return Err(BackendError::new(format!(
                    "etcd: the watch was cancelled: {}",
                    resp.cancel_reason()
                )));
            }
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                return Ok(Deletion::Deleted);
            }
        }
    }

    /// Waits until no key created before `rev` is left in `line` (etcd's `waitDeletes`), then
    /// notifies; each wake-up is the deletion of the waiter's predecessor.
    async fn wait_turn(self: Arc<Self>, line: String, rev: i64, notify: Arc<Notify>) {
        loop {
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(rev - 1)
                .with_limit(1);
            let key = line.clone();
            let found = self
                .call("find the waiter ahead", |mut c| async move {
                    c.get(key, Some(options)).await
                })
                .await;
            let ahead = match found {
                Ok(got) => got.kvs().first().map(|kv| {
                    (
                        kv.key().to_vec(),
                        got.header()
                            .map_or(0, etcd_client::ResponseHeader::revision),
                    )
                }),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Some((key, revision)) = ahead else {
                notify.notify_waiters();
                return;
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            if self.deletion(&key, revision + 1).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Whether the error is the link's rather than the server's answer.
fn is_transport(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            // Unknown, deadline exceeded, unavailable, cancelled, aborted.
            matches!(status.code() as i32, 1 | 2 | 4 | 10 | 14)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// A backend error for a failed `what`; permissions and credentials are refusals.
fn error(what: &str, e: &etcd_client::Error) -> BackendError {
    let refused = matches!(e, etcd_client::Error::GRpcStatus(s)
        if matches!(s.code() as i32, 7 | 16));
    let message = match e {
        etcd_client::Error::GRpcStatus(s) => format!("etcd: could not {what}: {}", s.message()),
        other => format!("etcd: could not {what}: {other}"),
    };
    let error = BackendError::new(message);
    if refused { error.refused() } else { error }
}

#[cfg(feature = "tls")]
fn tls_options(options: ConnectOptions) -> Result<ConnectOptions, LockError> {
    let mut tls = etcd_client::TlsOptions::new();
    match std::env::var_os("SSL_CERT_FILE") {
        Some(file) => {
            let pem = std::fs::read(&file).map_err(|e| {
                LockError::config(format!("SSL_CERT_FILE: could not read the CA file: {e}"))
            })?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls_options(_: ConnectOptions) -> Result<ConnectOptions, LockError> {
    Err(LockError::config(
        "DLOCK_URL: `etcds://` (TLS) needs dlock-runtime's `tls` feature; use `etcd://` or enable it",
    ))
}

impl Backend for EtcdBackend {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            let token = request.token;
            // Joining again after a lease ran out is the only repetition; bounded all the same.
            for _ in 0..3 {
                let known = self
                    .entries()
                    .get(&token.0)
                    .map(|e| (e.own_key.clone(), e.line.clone(), e.lease, e.rev));
                let Some((own_key, line, lease, rev)) = known else {
                    self.join(request.key, token, request.lease).await?;
                    continue;
                };
                let rev = match rev {
                    Some(rev) => rev,
                    None => match self
                        .enter(token, own_key.clone(), line.clone(), lease)
                        .await?
                    {
                        Entered::Holds(fence) => return Ok(self.acquired(token, fence, &request)),
                        Entered::Waits => {
                            self.keep_waiting(token);
                            return Ok(Attempt::Held {
                                ttl: None,
                                queued: true,
                            });
                        }
                        Entered::Again => continue,
                        Entered::TakeOver => match self.entries().get(&token.0).and_then(|e| e.rev)
                        {
                            Some(rev) => rev,
                            None => continue,
                        },
                    },
                };
                match self.take_over(own_key, line, lease, rev).await? {
                    Some(Ok(fence)) => return Ok(self.acquired(token, fence, &request)),
                    Some(Err(())) => {
                        self.keep_waiting(token);
                        return Ok(Attempt::Held {
                            ttl: None,
                            queued: true,
                        });
                    }
                    None => {
                        // Its key or lease is gone (it waited past a lease nobody renewed):
                        // join the line again, at its end.
                        let gone = self.entries().remove(&token.0);
                        if let Some(entry) = gone {
                            let _ = self.conn.revoke(entry.lease).await;
                        }
                    }
                }
            }
            Err(BackendError::new(
                "etcd: the lease kept running out before the key could be put",
            ))
        })
    }

    fn release<'a>(
        &'a self,
        _key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let Some(entry) = self.entries().remove(&token.0) else {
                return Ok(false);
            };
            let waiting = entry.keeper.is_some();
            drop(entry.keeper);
            let Some(rev) = entry.rev.filter(|_| !waiting) else {
                // A waiter, or a put whose reply was lost (or never came): revoking the lease
                // deletes its key in line, if the put happened, in one request. It held nothing
                // it knew of.
                self.conn.revoke(entry.lease).await?;
                return Ok(false);
            };
            let key = entry.own_key.clone();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let deleted = self
                .conn
                .call(
                    "delete the lock key",
                    |mut c| async move { c.txn(txn).await },
                )
                .await;
            // The lease is of no use any more; revoked before the release returns, so a
            // program that exits right after it leaves nothing (a lease without keys would
            // still count against the server's leases until its TTL). After the delete:
            // revoking first would delete the key and make the release look lost.
            match (deleted, self.conn.revoke(entry.lease).await) {
                (Ok(deleted), revoked) => {
                    if let Err(error) = revoked {
                        tracing::debug!(error = %error, "etcd: revoking a released lock's lease failed; it lapses with its TTL");
                    }
                    Ok(deleted.succeeded())
                }
                // The revoke deleted the key with its lease, if the lease was still there.
                (Err(_), Ok(live)) => Ok(live),
                (Err(error), Err(_)) => Err(error),
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

    fn lapses_within(&self, lease: Duration) -> Duration {
        Duration::from_secs(u64::try_from(lease_seconds(lease)).unwrap_or(u64::MAX))
    }

    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            // Every hold was released and every cleanup done: what is left is an entry whose
            // removal failed. Its lease goes, and its key with it.
            let left: Vec<Entry> = self.entries().drain().map(|(_, entry)| entry).collect();
            let mut failed = None;
            for entry in left {
                if let Err(error) = self.conn.revoke(entry.lease).await {
                    failed = Some(error);
                }
            }
            failed.map_or(Ok(()), Err)
        })
    }

    fn watch<'a>(&'a self, _key: &'a str, token: &'a Token) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let (line, rev) = {
                let entries = self.entries();
                let entry = entries.get(&token.0)?;
                (entry.line.clone(), entry.rev?)
            };
            let notify = Arc::new(Notify::new());
            let task = tokio::spawn(self.conn.clone().wait_turn(line, rev, notify.clone()));
            Some(Watch::new(notify, NextInLine::default(), AbortOnDrop(task)))
        })
    }

    fn extend<'a>(
        &'a self,
        _key: &'a str,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let Some((old, ttl, own_key, rev)) = self
                .entries()
                .get(&token.0)
                .map(|e| (e.lease, e.ttl, e.own_key.clone(), e.rev))
            else {
                return Ok(false);
            };
            let Some(rev) = rev else { return Ok(false) };
            let want = lease_seconds(lease);
            if want <= ttl {
                return self.conn.keep_alive(old).await;
            }
            // A longer lease than the one granted: move the key to a new lease of that length
            // (a lease's TTL is fixed when granted), then revoke the old one.
            let granted = self
                .conn
                .call("grant a lease", |mut c| async move {
                    c.lease_grant(want, None).await
                })
                .await?;
            let new = granted.id();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(own_key.as_str(), CompareOp::Equal, rev),
                    Compare::lease(own_key.as_str(), CompareOp::Equal, old),
                ])
                .and_then([TxnOp::put(
                    own_key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(new)),
                )]);
            let moved = self
                .conn
                .call("move the lock to a longer lease", |mut c| async move {
                    c.txn(txn).await
                })
                .await;
            let moved = match moved {
                Ok(r) => r.succeeded(),
                Err(e) => {
                    let _ = self.conn.revoke(new).await;
                    return Err(e);
                }
            };
            if !moved {
                let _ = self.conn.revoke(new).await;
                return Ok(false);
            }
            if let Some(entry) = self.entries().get_mut(&token.0) {
                entry.lease = new;
                entry.ttl = granted.ttl();
            }
            let _ = self.conn.revoke(old).await;
            Ok(true)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: FairOrder::Native,
            passes: false,
            reliable_wake_up: true,
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
