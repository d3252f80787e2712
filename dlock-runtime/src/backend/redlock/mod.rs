//! RedLock: one lock over N independent Redis masters (an odd N ≥ 3), held while a majority
//! holds it. Each master is reached the way the single-server engine reaches its server (one
//! self-reconnecting connection, the same Lua scripts, release notifications on its own pub/sub
//! connection); every request goes to all masters at once, each bounded by the request timeout.
//!
//! - **Acquire**: one round: the acquire script (`acquire.lua`, with the TTL recheck) on every
//!   master at once. Held when a majority granted and time is left of the lease after the
//!   elapsed time and the clock-drift allowance (1% + 2ms), counted from before the first
//!   request; the guard's lease clock counts from that same instant, so it ends when this
//!   validity does. Otherwise the attempt is undone on every master (compare-and-delete by
//!   token).
//! - **Fencing**: the client proposes the fence (its clock in µs, or one more than the highest
//!   fence it has seen) and a master grants only a proposal above its counter, which then holds
//!   it: the fence lands on every master of the granting majority, every later majority shares a
//!   master with it, and that master refuses any proposal not above it. So fences strictly
//!   increase across majorities, in the same round as the lock. A master whose counter is ahead
//!   of the proposal (a client whose clock lags) answers with its counter, and the attempt is made
//!   once more, above it and at the clock of now. Behind still (other contenders took the key
//!   and let it go between the two rounds), the attempt lost a race: it is refused, and asked
//!   again at once from the line.
//! - **Waiters do not race for votes**: an acquisition refused once asks the key's first master
//!   (by slot) alone before the others, so of the waiters a release wakes, one goes on to the
//!   other masters and the rest wait again, instead of all of them splitting the votes.
//! - **A release wakes one waiting process**: a waiting process keeps a place in the queue of
//!   the key's first master (joined by its attempts there, as on one Redis), until a majority
//!   granted it the lock. Once its release round has answered, the releasing client wakes the
//!   place first in that queue, on the place's own channel, which only that process subscribes
//!   to (woken by the first master's own release, a waiter could ask before the others had let
//!   the key go). The release is woken for even when the holder's majority did not include the
//!   first master. An attempt's undoing announces nothing. A waiter that the first master granted
//!   but no majority followed asks again after 2, 4, 8… ms (a release still under way on the
//!   others), then waits to be woken. The other masters announce every release on the key's
//!   channel, for the waiters that could not subscribe on the first (it is down, or went down
//!   during the wait: its connection's loss leaves the waiter's wake-up deaf, and it asks for
//!   another): those wake when enough masters announced it, and take their place's channel
//!   back once the first master's connection is made again.
//! - **Passing on a hot key**: a release with a waiter of the same locker offering to take the
//!   lock (see the locker's line) is one round instead: `pass.lua` on every master sets the key
//!   to the waiter's token where it is still the holder's, with a fence proposed as an
//!   acquisition's is (so fences still strictly increase across majorities), and the key is
//!   never free. Passed when a majority did in time; otherwise neither hold is left (the
//!   waiter's undone, the holder's released, which wakes the line as any release does).
//! - **Release** and **extend** on every master; a majority decides. Fewer definite answers
//!   than that (masters unreachable) is a backend error.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::future::join_all;
use tokio::{sync::Notify, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    api::{
        Attempt, Backend, BoxFuture, Built, Capabilities, FairOrder, Hearing, NextInLine, Request,
        Token, WakeUp, Watch,
    },
    redis::{RedisBackend, now_micros, slot},
};
use crate::{
    LockError, LockInfo, LockKind,
    config::Settings,
    error::BackendError,
    holder,
    url::{EngineUrl, HostList, tls_needs_feature},
};

/// RedLock over independent Redis masters: `redis+redlock://h1:p1,h2:p2,h3:p3`.
pub(super) const BUILT: Built = Built {
    check,
    build: |url, settings| Ok(Arc::new(RedLockBackend::from_url(url, settings)?)),
    options: &[],
};

const FORM: &str = "redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3";

fn check(var: &str, url: &str) -> Result<(), LockError> {
    tls_needs_feature(var, "rediss+redlock", url.starts_with("rediss"))?;
    let hosts = HostList::parse(var, url, FORM)?;
    redlock_nodes(&hosts, var).map(drop)
}

/// RedLock's masters: an odd number, at least 3. A majority of 2 nodes is both, so losing
/// either stops every lock; an even count adds a node without adding a failure the
/// deployment survives (4 nodes need 3, like 5 do, and survive one loss, like 3 do).
fn redlock_nodes(hosts: &HostList<'_>, var: &str) -> Result<usize, LockError> {
    let n = hosts.hosts.len();
    if n < 3 {
        return Err(LockError::config(format!(
            "{var}: RedLock needs at least 3 independent masters, got {n}: with fewer, a \
             majority is every node and losing any one of them stops every lock"
        )));
    }
    if n.is_multiple_of(2) {
        return Err(LockError::config(format!(
            "{var}: RedLock needs an odd number of masters, got {n}: a majority of {n} is \
             {}, as of {}, so the extra node survives no further failure; use {} or {}",
            n / 2 + 1,
            n + 1,
            n - 1,
            n + 1
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some((host, port)) = hosts.hosts.iter().find(|h| !seen.insert(**h)) {
        return Err(LockError::config(format!(
            "{var}: RedLock lists {host}:{port} twice: every master must be a different \
             server, or one server would count as two votes"
        )));
    }
    Ok(n)
}

/// The request timeout may be at most this fraction of the configured lease: an acquisition is
/// up to two rounds of requests (a refused waiter asks one master first; a lagging clock asks
/// again), each up to a request timeout, and only what is left of the lease after them is the
/// lock's validity.
const LEASE_PER_REQUEST_TIMEOUT: u32 = 5;

/// A release some masters did not answer is sent to them again this many times at most, the
/// first after [`RELEASE_AGAIN_AFTER`], each pause twice the one before (about 6s in all, plus
/// the requests): what is still left then lapses with its lease.
const RELEASE_AGAIN_TRIES: u32 = 6;
/// The pause before a release's first try again.
const RELEASE_AGAIN_AFTER: Duration = Duration::from_millis(100);
/// Releases sent again at once per locker, at most: with masters down, every release misses
/// them, and the re-sends beyond this are not made (their leases end what they leave).
const RELEASE_AGAIN_AT_ONCE: usize = 32;

/// One master: where it is (for errors; never with credentials) and its connection.
struct Node {
    addr: String,
    redis: RedisBackend,
}

pub(crate) struct RedLockBackend {
    /// Shared with the releases sent again in the background.
    nodes: Arc<[Node]>,
    /// A majority: `nodes.len() / 2 + 1`.
    quorum: usize,
    request_timeout: Duration,
    /// The highest fence this client has seen granted or refused: proposals go above it.
    seen: AtomicU64,
    /// What this client remembers of its acquisitions under way, by token (one map, so that a
    /// release or a grant forgets a token under one lock).
    memos: Mutex<HashMap<String, Memo>>,
    /// The wake-ups that releases sent without waiting for their reply (each bounded by the
    /// request timeout), and the releases sent again to masters that missed them:
    /// [`Backend::close`] waits for them.
    wakes: TaskTracker,
    /// Cancelled by [`Backend::close`]: the releases sent again stop trying (their leases end
    /// what they leave). Not by a drop: a locker's last release is often made as its last
    /// handle goes (a guard released after the `Locker` was dropped), and what it missed would
    /// refuse the key's waiters until its lease ended; the re-sends end on their own within
    /// [`RELEASE_AGAIN_TRIES`].
    closing: CancellationToken,
    /// One permit per release sent again now (see [`RELEASE_AGAIN_AT_ONCE`]).
    releasing_again: Arc<tokio::sync::Semaphore>,
}

/// The index of `key`'s first master among `masters`: the one whose queue keeps the key's
/// waiting places, which a refused acquisition asks first (its slot, modulo the masters).
pub(crate) fn first_master(key: &str, masters: usize) -> usize {
    usize::from(slot(key.as_bytes())) % masters
}

static ACQUIRE: OnceLock<redis::Script> = OnceLock::new();
static PLACE: OnceLock<redis::Script> = OnceLock::new();
static WAKE: OnceLock<redis::Script> = OnceLock::new();
static PASS: OnceLock<redis::Script> = OnceLock::new();

/// The pass script: the shared lock functions of the Redis engine, then RedLock's grant and pass.
fn pass_script() -> &'static redis::Script {
    PASS.get_or_init(|| {
        redis::Script::new(concat!(
            include_str!("../redis/lock.lua"),
            include_str!("grant.lua"),
            include_str!("pass.lua")
        ))
    })
}

/// The script that wakes the place first in the first master's queue.
fn wake_script() -> &'static redis::Script {
    WAKE.get_or_init(|| {
        redis::Script::new(concat!(
            include_str!("../redis/wake_head.lua"),
            include_str!("wake.lua")
        ))
    })
}

/// The script that takes a place out of the first master's queue.
fn place_script() -> &'static redis::Script {
    PLACE.get_or_init(|| redis::Script::new(include_str!("place.lua")))
}

/// The acquire script: a first attempt's grant of a free key, then the shared lock functions of
/// the Redis engine and RedLock's own.
fn acquire_script() -> &'static redis::Script {
    ACQUIRE.get_or_init(|| {
        redis::Script::new(concat!(
            include_str!("acquire_free.lua"),
            include_str!("../redis/lock.lua"),
            include_str!("../redis/queue.lua"),
            include_str!("grant.lua"),
            include_str!("acquire.lua")
        ))
    })
}

/// One master's answer to an acquire.
#[derive(Clone, Copy, Debug)]
enum Vote {
    /// Granted, with the proposed fence.
    Granted,
    /// Held for another, for this long when known (to a pass: the key is not the holder's).
    Held(Option<Duration>),
    /// Free, but its counter is at or above the proposal.
    Behind(u64),
}

impl Vote {
    fn from_reply(reply: &redis::Value) -> Result<Self, BackendError> {
        match reply {
            redis::Value::Int(n) if *n > 0 => Ok(Self::Granted),
            redis::Value::Int(n) => Ok(Self::Held(Some(Duration::from_millis(
                n.unsigned_abs().saturating_sub(1),
            )))),
            redis::Value::Array(counter) => {
                let counter = counter.first().and_then(|c| match c {
                    redis::Value::BulkString(bytes) => {
                        std::str::from_utf8(bytes).ok()?.parse().ok()
                    }
                    redis::Value::Int(n) => u64::try_from(*n).ok(),
                    _ => None,
                });
                counter
                    .map(Self::Behind)
                    .ok_or_else(|| BackendError::new("RedLock: an unexpected reply to a grant"))
            }
            _ => Err(BackendError::new("RedLock: an unexpected reply to a grant")),
        }
    }
}

/// How many masters answered that the key is free but their counter is at or above the proposal.
fn behind(votes: &[Result<Vote, BackendError>]) -> usize {
    votes
        .iter()
        .filter(|v| matches!(v, Ok(Vote::Behind(_))))
        .count()
}

/// What a client remembers of one acquisition under way (see [`RedLockBackend::memos`]).
#[derive(Debug, Default)]
struct Memo {
    /// Refused before, since then: its next attempt asks the key's first master alone before
    /// the others.
    refused: Option<Instant>,
    /// The first master's grants to its place with no majority following, in a row: see
    /// [`RedLockBackend::soon`].
    in_flight: u32,
}

/// Memos of waits that ended without a word (a timeout, a dropped wait) go, looked at now and
/// then (at 64, 128, 256… entries): those refused over a minute ago, and those with no refusal
/// (a wait then only loses its count of quick retries).
fn prune(map: &mut HashMap<String, Memo>) {
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, m| {
            m.refused
                .is_some_and(|since| since.elapsed() < Duration::from_secs(60))
        });
    }
}

impl fmt::Debug for RedLockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLockBackend")
            .field("masters", &self.nodes.len())
            .field("quorum", &self.quorum)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What one round of requests to every master brought back.
struct Round<T> {
    replies: Vec<Result<T, BackendError>>,
}

impl<T> Round<T> {
    fn count(&self, f: impl Fn(&T) -> bool) -> usize {
        self.replies
            .iter()
            .filter(|r| r.as_ref().is_ok_and(&f))
            .count()
    }

    fn failed(&self) -> usize {
        self.replies.iter().filter(|r| r.is_err()).count()
    }
}

impl Round<bool> {
    /// Which masters granted, of a round of votes (an acquisition's or a pass's).
    fn granted(votes: Vec<Result<Vote, BackendError>>) -> Self {
        Self {
            replies: votes
                .into_iter()
                .map(|v| v.map(|v| matches!(v, Vote::Granted)))
                .collect(),
        }
    }
}

impl RedLockBackend {
    /// The masters of a `redis+redlock://` URL, configured from `settings`; makes no connection.
    pub(crate) fn from_url(url: &EngineUrl, settings: &Settings) -> Result<Self, LockError> {
        let hosts = HostList::parse("DLOCK_URL", url.as_str(), FORM)?;
        let n = redlock_nodes(&hosts, "DLOCK_URL")?;
        let timeout = settings.request_timeout;
        if timeout * LEASE_PER_REQUEST_TIMEOUT > settings.expire {
            return Err(LockError::config(format!(
                "RedLock: the request timeout ({timeout:?}, DLOCK_REQUEST_TIMEOUT) must be at most \
                 a {}th of the lease ({:?}, DLOCK_EXPIRE): an acquisition takes two rounds of \
                 requests, each up to the request timeout, and the lock is valid only for what \
                 is left of the lease after them",
                LEASE_PER_REQUEST_TIMEOUT, settings.expire
            )));
        }
        let path = if hosts.path.is_empty() {
            String::new()
        } else {
            format!("/{}", hosts.path)
        };
        let nodes = hosts
            .node_urls(&path)
            .into_iter()
            .zip(&hosts.hosts)
            .map(|(node_url, (host, port))| {
                // Made from a checked list of hosts: every node is a `redis://` server.
                let node_url = EngineUrl::checked(&node_url, "redis");
                Ok(Node {
                    addr: format!("{host}:{port}"),
                    redis: RedisBackend::from_url(&node_url, settings)?.announcing_every_release(),
                })
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(Self {
            nodes: nodes.into(),
            quorum: n / 2 + 1,
            request_timeout: timeout,
            seen: AtomicU64::new(0),
            memos: Mutex::default(),
            wakes: TaskTracker::new(),
            closing: CancellationToken::new(),
            releasing_again: Arc::new(tokio::sync::Semaphore::new(RELEASE_AGAIN_AT_ONCE)),
        })
    }

    /// Sends `request` to every master at once and waits for every answer, each bounded by the
    /// request timeout.
    async fn round<'a, T, F>(&'a self, request: F) -> Round<T>
    where
        F: Fn(&'a RedisBackend) -> BoxFuture<'a, Result<T, BackendError>>,
    {
        let replies = join_all(self.nodes.iter().map(|node| {
            let reply = request(&node.redis);
            async move {
                tokio::time::timeout(self.request_timeout, reply)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BackendError::new(format!(
                            "no reply within {:?}",
                            self.request_timeout
                        )))
                    })
            }
        }))
        .await;
        Round { replies }
    }

    /// Compare-and-delete by token on every master, for an attempt that did not get the lock.
    /// `false` when some master did not answer (what it may hold lapses with its lease).
    async fn undo(&self, key: &str, token: &Token) -> bool {
        let round = self.round(|node| Box::pin(node.undo(key, token))).await;
        if round.failed() > 0 {
            tracing::debug!(
                key = %key,
                unreachable = round.failed(),
                "RedLock: an attempt could not be undone on every master; their leases will end it"
            );
        }
        round.failed() == 0
    }

    /// Sends a release's compare-and-delete again, in the background, to the masters that did
    /// not answer it (`missed`, by index), until each has (see [`RELEASE_AGAIN_TRIES`]) or the
    /// locker closes. What it leaves would otherwise stay until its lease ends: on the key's
    /// first master, it refuses every waiter that was refused once (they ask that master
    /// alone). The first master then wakes the place first in its queue. At most
    /// [`RELEASE_AGAIN_AT_ONCE`] at a time, and none once the locker is closed (a dropped locker's go
    /// on to their end).
    fn release_again(&self, key: &str, token: &Token, mut missed: Vec<usize>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(permit) = self.releasing_again.clone().try_acquire_owned() else {
            tracing::debug!(key = %key, "RedLock: a release that missed masters is not sent again (too many are); their leases will end it");
            return;
        };
        let (nodes, closing, bound) = (
            self.nodes.clone(),
            self.closing.clone(),
            self.request_timeout,
        );
        let first = self.leader(key);
        let (key, token) = (key.to_owned(), token.clone());
        let again = async move {
            let _permit = permit;
            let mut pause = RELEASE_AGAIN_AFTER;
            for _ in 0..RELEASE_AGAIN_TRIES {
                tokio::select! {
                    () = closing.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                let (key, token) = (key.as_str(), &token);
                let sent = join_all(missed.iter().map(|&i| {
                    let redis = &nodes[i].redis;
                    async move {
                        let answered = tokio::time::timeout(bound, async {
                            if i != first {
                                return redis.release(key, LockKind::Mutex, token).await.map(drop);
                            }
                            if redis.release_first(key, token).await?.place_waits() {
                                redis.wake_first(wake_script(), key).await?;
                            }
                            Ok(())
                        })
                        .await;
                        (i, matches!(answered, Ok(Ok(()))))
                    }
                }))
                .await;
                missed = sent
                    .into_iter()
                    .filter_map(|(i, answered)| (!answered).then_some(i))
                    .collect();
                if missed.is_empty() {
                    tracing::debug!(key = %key, "RedLock: a release was sent again to the masters that missed it");
                    return;
                }
                pause *= 2;
            }
            tracing::debug!(key = %key, unreachable = missed.len(), "RedLock: a release did not reach every master; their leases will end it");
        };
        self.wakes.spawn_on(again, &runtime);
    }

    /// What a majority of masters answered to `what` (a release or an extension of our lock):
    /// `true` when a majority did (`did` says what, for the error), `false` when more than a
    /// minority did not (then no majority can have), and an error when the masters that did not
    /// answer could still tip it either way.
    fn majority(&self, what: &str, did: &str, round: Round<bool>) -> Result<bool, BackendError> {
        let yes = round.count(|done| *done);
        let no = round.count(|done| !*done);
        if yes >= self.quorum {
            Ok(true)
        } else if no > self.nodes.len() - self.quorum {
            Ok(false)
        } else {
            Err(self.no_majority(what, round, &format!("{yes} {did}, {no} did not")))
        }
    }

    /// The error of a round without a majority either way: how the masters answered, with the
    /// first master's error as the source. Refused when every failure is a refusal (an ACL, a
    /// key of another type): asking again cannot cure it.
    fn no_majority<T>(&self, what: &str, round: Round<T>, outcome: &str) -> BackendError {
        let failed = round.failed();
        let all_refused = round
            .replies
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(BackendError::is_refused);
        let first = round
            .replies
            .into_iter()
            .zip(self.nodes.iter())
            .find_map(|(r, node)| r.err().map(|e| (node.addr.as_str(), e)));
        let message = format!(
            "RedLock {what}: no majority ({} of {} masters) answered: {outcome}, {failed} failed",
            self.quorum,
            self.nodes.len(),
        );
        match first {
            Some((addr, error)) => {
                let error = BackendError::with_source(
                    format!("{message} (first: master {addr}: {error})"),
                    error,
                );
                if all_refused { error.refused() } else { error }
            }
            None => BackendError::new(message),
        }
    }
}

impl RedLockBackend {
    /// What a majority of masters agree on about a lock: held by one holder (the fence the
    /// highest of theirs, the remaining lease the shortest), or free; an error when too few
    /// answered to tell.
    fn agreed(
        &self,
        what: &str,
        round: Round<Option<LockInfo>>,
    ) -> Result<Option<LockInfo>, BackendError> {
        let answered: Vec<&Option<LockInfo>> = round
            .replies
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .collect();
        let same = |a: &LockInfo, b: &LockInfo| match (&a.holder, &b.holder) {
            (Some(a), Some(b)) => (&a.owner, &a.host, a.pid) == (&b.owner, &b.host, b.pid),
            (None, None) => true,
            _ => false,
        };
        for info in answered.iter().copied().flatten() {
            let group: Vec<&LockInfo> = answered
                .iter()
                .copied()
                .flatten()
                .filter(|other| same(info, other))
                .collect();
            if group.len() >= self.quorum {
                let mut agreed = info.clone();
                agreed.fence = group.iter().filter_map(|i| i.fence).max();
                agreed.remaining = group.iter().filter_map(|i| i.remaining).min();
                agreed.waiters = None;
                return Ok(Some(agreed));
            }
        }
        if answered.len() >= self.quorum {
            return Ok(None);
        }
        Err(self.no_majority(what, round, "too few masters"))
    }

    /// The next fence to propose: the clock in µs, or above the highest fence seen.
    fn proposal(&self) -> u64 {
        now_micros().max(self.seen.load(Ordering::Relaxed) + 1)
    }

    /// The master a refused acquisition asks first: the same for every client of `key`.
    fn leader(&self, key: &str) -> usize {
        first_master(key, self.nodes.len())
    }

    fn memos(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memo>> {
        self.memos.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `token`'s acquisition was refused before (its attempts ask the leader first).
    fn was_refused(&self, token: &Token) -> bool {
        self.memos()
            .get(&token.0)
            .is_some_and(|m| m.refused.is_some())
    }

    /// How soon a wait whose place got the first master's grant, with no majority following,
    /// should ask again: the other masters may still be carrying out the release that freed the
    /// key on the first (their replies to the releasing client, and its wake-up, come after the
    /// waiter saw the key free there, and its wake-up may have looked at the queue before the
    /// place was in it). After 2, 4, 8… ms in a row, about a request timeout in all (a release
    /// round's bound); then `None` (a holder of a majority without the first master: its
    /// release wakes the place). Forgotten at a refusal by the first master, or the end of the wait.
    fn soon(&self, token: &Token) -> Option<Duration> {
        let mut map = self.memos();
        prune(&mut map);
        let memo = map.entry(token.0.clone()).or_default();
        memo.in_flight += 1;
        let pause = Duration::from_millis(1 << memo.in_flight.min(16));
        (pause * 2 <= self.request_timeout.max(Duration::from_millis(8))).then_some(pause)
    }

    /// The first master refused `token`'s place: the next grant with no majority following is a
    /// new case for [`Self::soon`].
    fn settled(&self, token: &Token) {
        let mut map = self.memos();
        if let Some(memo) = map.get_mut(&token.0) {
            memo.in_flight = 0;
            if memo.refused.is_none() {
                map.remove(&token.0);
            }
        }
    }

    /// Remembers that `token`'s acquisition was refused: its next attempt asks the key's first
    /// master alone before the others.
    fn mark_refused(&self, token: &Token) {
        let mut map = self.memos();
        prune(&mut map);
        map.entry(token.0.clone()).or_default().refused = Some(Instant::now());
    }

    /// `token`'s acquisition got the lock, or its hold ended: nothing of it is remembered.
    fn forget(&self, token: &Token) {
        self.memos().remove(&token.0);
    }

    /// Master `i`'s vote on `proposed`, bounded by the request timeout.
    async fn vote(
        &self,
        i: usize,
        request: &Request<'_>,
        proposed: u64,
    ) -> Result<Vote, BackendError> {
        let reply = self.nodes[i]
            .redis
            .acquire_proposed(acquire_script(), request, proposed);
        match tokio::time::timeout(self.request_timeout, reply).await {
            Ok(reply) => Vote::from_reply(&reply?),
            Err(_) => Err(BackendError::new(format!(
                "no reply within {:?}",
                self.request_timeout
            ))),
        }
    }

    /// Every master's vote (the leader's counted as granted when it granted already), at once.
    async fn ask(
        &self,
        request: &Request<'_>,
        proposed: u64,
        granted: Option<usize>,
    ) -> Vec<Result<Vote, BackendError>> {
        join_all((0..self.nodes.len()).map(|i| async move {
            if granted == Some(i) {
                return Ok(Vote::Granted);
            }
            self.vote(i, request, proposed).await
        }))
        .await
    }

    /// When no majority granted but one would have with a higher proposal (masters whose
    /// counters were ahead of it): a proposal above all of them.
    fn retry_above(&self, votes: &[Result<Vote, BackendError>]) -> Option<u64> {
        let granted = votes
            .iter()
            .filter(|v| matches!(v, Ok(Vote::Granted)))
            .count();
        let behind: Vec<u64> = votes
            .iter()
            .filter_map(|v| match v {
                Ok(Vote::Behind(counter)) => Some(*counter),
                _ => None,
            })
            .collect();
        let highest = behind.iter().copied().max()?;
        self.seen.fetch_max(highest, Ordering::Relaxed);
        (granted < self.quorum && granted + behind.len() >= self.quorum).then_some(highest + 1)
    }

    /// The outcome of an attempt's votes: held with the proposed fence when a majority granted
    /// in time; otherwise undone, and refused (the lock is held on enough masters) or failed.
    async fn decide(
        &self,
        request: &Request<'_>,
        started: Instant,
        proposed: u64,
        votes: Vec<Result<Vote, BackendError>>,
    ) -> Result<Attempt, BackendError> {
        let granted = votes
            .iter()
            .filter(|v| matches!(v, Ok(Vote::Granted)))
            .count();
        if granted >= self.quorum {
            self.seen.fetch_max(proposed, Ordering::Relaxed);
            // The guard's lease clock, which counts from the same instant, ends with this.
            if crate::lease::valid_until(started, request.lease) > Instant::now() {
                self.forget(request.token);
                return Ok(Attempt::acquired(proposed));
            }
            let _ = self.undo(request.key, request.token).await;
            return Err(BackendError::new(format!(
                "RedLock acquire: a majority granted, but after {:?} no validity was left of the \
                 {:?} lease; the attempt was undone",
                started.elapsed(),
                request.lease
            )));
        }
        // A master that answered `Behind` may hold our token all the same: the first master,
        // asked alone first, ran the script and its reply timed out, then refused the same
        // proposal when asked again with the others, keeping the key it had set.
        if granted > 0
            || votes
                .iter()
                .any(|v| matches!(v, Err(_) | Ok(Vote::Behind(_))))
        {
            let _ = self.undo(request.key, request.token).await;
        }
        let held: Vec<Option<Duration>> = votes
            .iter()
            .filter_map(|v| match v {
                Ok(Vote::Held(ttl)) => Some(*ttl),
                _ => None,
            })
            .collect();
        if held.len() > self.nodes.len() - self.quorum {
            // Held elsewhere on enough masters that no majority is left: the lock may be free
            // once the first of those holds ends (the wait never sleeps longer than that).
            self.mark_refused(request.token);
            return Ok(Attempt::Held {
                ttl: held.iter().flatten().min().copied(),
                queued: false,
            });
        }
        if granted + behind(&votes) >= self.quorum {
            // Free on a majority, whose counters went past this attempt's proposal, asked again
            // above them: other contenders took the key and let it go between the two (this one
            // lost the race, as to a holder), and it is likely free now. Refused, to be asked
            // again at once from the line, waking on the key's releases meanwhile; as an error,
            // a waiter would sleep its retry pause with the key free and nobody to wake it, and
            // a `try_acquire` would fail where it lost a race.
            self.mark_refused(request.token);
            return Ok(Attempt::Held {
                ttl: Some(Duration::ZERO),
                queued: false,
            });
        }
        let error = self.no_majority(
            "acquire",
            Round::granted(votes),
            &format!("{granted} granted, {} refused", held.len()),
        );
        // Votes split with another contender (it holds some masters, we had others, one failed):
        // each undid its own, and no release may follow; asked again soon, one of them wins (a
        // waiter backs off only after a few of these in a row: the other may be a holder whose
        // bare majority counts a master that went down, and whose release will come).
        Err(if granted > 0 && !held.is_empty() {
            error.contended()
        } else {
            error
        })
    }
}

impl RedLockBackend {
    /// Every master's answer to passing `key` from `from` to `to` (its value stamped `since`)
    /// with the fence `proposed`.
    async fn pass_round(
        &self,
        key: &str,
        (from, to, since): (&Token, &Token, holder::Since),
        lease: Duration,
        proposed: u64,
    ) -> Vec<Result<Vote, BackendError>> {
        self.round(|node| {
            Box::pin(async move {
                let reply = node
                    .pass_proposed(pass_script(), key, (from, to, since), lease, proposed)
                    .await?;
                Vote::from_reply(&reply)
            })
        })
        .await
        .replies
    }
}

impl Backend for RedLockBackend {
    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            // A process that exits once its locker is closed has still woken the waiters of
            // its last releases.
            self.closing.cancel();
            self.wakes.close();
            self.wakes.wait().await;
            Ok(())
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let pings = self.nodes.iter().map(|node| node.redis.ping_server());
            let answers = futures_util::future::join_all(pings).await;
            let up = answers.iter().filter(|a| a.is_ok()).count();
            if up >= self.quorum {
                return Ok(());
            }
            let first = answers.into_iter().find_map(Result::err);
            Err(BackendError::new(format!(
                "RedLock: {up} of {} masters answered, {} needed{}",
                self.nodes.len(),
                self.quorum,
                first.map(|e| format!(" ({e})")).unwrap_or_default()
            )))
        })
    }

    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            let started = Instant::now();
            let mut proposed = self.proposal();
            // The place is kept in the first master's queue only; the others are asked plainly.
            let queued = request.queue.is_some();
            let plain = Request {
                queue: None,
                ..request
            };
            let first =
                (queued || self.was_refused(request.token)).then(|| self.leader(request.key));
            let mut leader_granted = false;
            let mut votes = match first {
                Some(leader) => match self.vote(leader, &request, proposed).await.ok() {
                    // From a place: the first master queued it (or found it fresh).
                    Some(Vote::Held(ttl)) => {
                        self.settled(request.token);
                        return Ok(Attempt::Held { ttl, queued });
                    }
                    // The place stays in the queue until a majority granted: a release meanwhile
                    // (the other masters' holder's) must still find it and wake it.
                    Some(Vote::Granted) => {
                        leader_granted = true;
                        self.ask(&plain, proposed, Some(leader)).await
                    }
                    // Behind, or no answer: every master at once.
                    _ => self.ask(&plain, proposed, None).await,
                },
                None => self.ask(&plain, proposed, None).await,
            };
            if let Some(higher) = self.retry_above(&votes) {
                // A lagging clock, or a proposal made before another contender's (this task
                // waited for a core meanwhile): once more, above every counter that refused it
                // and at the clock of now.
                let _ = self.undo(request.key, request.token).await;
                proposed = self.proposal().max(higher);
                votes = self.ask(&plain, proposed, None).await;
            }
            let decided = self.decide(&plain, started, proposed, votes).await;
            let Some(q) = request.queue else {
                return decided;
            };
            match decided {
                Ok(Attempt::Acquired { .. }) => {
                    if !q.keep {
                        // Held: the place leaves the first master's queue (quietly: the holder
                        // is there to release), or its releases would name it for nobody.
                        // Bounded by one request timeout: the guard's lease clock runs.
                        let leader = self.leader(request.key);
                        let left = tokio::time::timeout(
                            self.request_timeout,
                            self.nodes[leader].redis.leave_quietly(
                                place_script(),
                                request.key,
                                q.place,
                            ),
                        )
                        .await;
                        if !matches!(left, Ok(Ok(()))) {
                            tracing::debug!(
                                "RedLock: the place could not leave the first master's queue; it lapses on its own"
                            );
                        }
                    }
                    decided
                }
                // The first master granted, the others did not: a release still under way there
                // (then ask again soon), or a holder of a majority without the first master
                // (whose release wakes the place).
                Ok(Attempt::Held { ttl, .. }) if leader_granted => Ok(Attempt::Held {
                    ttl: self.soon(request.token).or(ttl),
                    queued: true,
                }),
                // The first master did not answer from the place (its counter was ahead, or it
                // did not answer): the place may not be in its queue; not queued, so that the
                // next attempt joins.
                Ok(Attempt::Held { ttl, .. }) => Ok(Attempt::Held { ttl, queued: false }),
                other => other,
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        _kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            self.forget(token);
            // The first master announces nothing itself: the place first in its queue is woken
            // once the round has answered, when a majority has let the key go (woken by that
            // master alone, a waiter could ask before the others had, be refused, and sleep).
            let first = &self.nodes[self.leader(key)].redis;
            let waits = std::sync::atomic::AtomicBool::new(false);
            let round = self
                .round(|node| {
                    if std::ptr::eq(node, first) {
                        let waits = &waits;
                        Box::pin(async move {
                            let released = node.release_first(key, token).await?;
                            waits.store(released.place_waits(), Ordering::Relaxed);
                            released.deleted()
                        })
                    } else {
                        node.release(key, LockKind::Mutex, token)
                    }
                })
                .await;
            // Sent, not awaited: the releasing client asks again at once more often than not
            // (a hot key), and its next round need not wait behind the wake-up's reply. Tracked:
            // closing the locker waits for it (a process that exits after `close` still wakes
            // the other processes' waiters).
            let detached = waits.load(Ordering::Relaxed)
                && match (
                    first.wake_first_task(wake_script(), key),
                    tokio::runtime::Handle::try_current(),
                ) {
                    (Some(wake), Ok(runtime)) => {
                        self.wakes.spawn_on(wake, &runtime);
                        true
                    }
                    _ => false,
                };
            if waits.load(Ordering::Relaxed) && !detached {
                let woken = tokio::time::timeout(
                    self.request_timeout,
                    first.wake_first(wake_script(), key),
                )
                .await;
                if !matches!(woken, Ok(Ok(()))) {
                    tracing::debug!(key = %key, "RedLock: the first waiting process could not be woken; it polls");
                }
            }
            // A master whose release was sent again and found the key gone (the first sending's
            // reply lost with its connection) answered: nothing to send it again.
            let missed: Vec<usize> = (round.replies.iter().enumerate())
                .filter_map(|(i, reply)| {
                    reply
                        .as_ref()
                        .is_err_and(|e| !e.is_unsettled())
                        .then_some(i)
                })
                .collect();
            if !missed.is_empty() {
                self.release_again(key, token, missed);
            }
            // Those masters most likely deleted it with their first sending: when they make the
            // majority the others did not, whether the release did cannot be told (as one
            // server's unsettled release, and a master can lose a key without one).
            let deleted = round.count(|done| *done);
            let unsettled = || {
                (round.replies.iter())
                    .filter(|reply| reply.as_ref().is_err_and(BackendError::is_unsettled))
                    .count()
            };
            if deleted < self.quorum && deleted + unsettled() >= self.quorum {
                let unsettled = unsettled();
                let not_held = round.count(|done| !*done);
                let outcome = format!(
                    "{deleted} held our lock, {not_held} did not, and of those that failed \
                     {unsettled} found it gone when sent again (the first reply lost with the \
                     connection)"
                );
                return Err(self
                    .no_majority("release", round, &outcome)
                    .unsettled()
                    .may_vanish());
            }
            // Deleted on a minority at most: the lock was lost (what was left of it is deleted
            // all the same).
            self.majority("release", "held our lock", round)
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        _kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let round = self
                .round(|node| node.extend(key, LockKind::Mutex, token, lease))
                .await;
            self.majority("extend", "extended our lock", round)
        })
    }

    fn pass<'a>(
        &'a self,
        key: &'a str,
        from: &'a Token,
        to: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        Box::pin(async move {
            let started = Instant::now();
            // One value for the next holder on every master and in both rounds: pass.lua knows
            // its own pass asked again by it.
            let value = (from, to, holder::Since::now());
            let mut proposed = self.proposal();
            let mut votes = self.pass_round(key, value, lease, proposed).await;
            if let Some(higher) = self.retry_above(&votes) {
                // A lagging clock: once more, above every counter that refused it and at the
                // clock of now (a master that passed already grants again: it holds this
                // pass's very value).
                proposed = self.proposal().max(higher);
                votes = self.pass_round(key, value, lease, proposed).await;
            }
            let count =
                |f: fn(&Vote) -> bool| votes.iter().filter(|v| v.as_ref().is_ok_and(f)).count();
            let granted = count(|v| matches!(v, Vote::Granted));
            if granted >= self.quorum {
                self.seen.fetch_max(proposed, Ordering::Relaxed);
                // The guard's lease clock counts from before this round: it ends before this
                // validity.
                if crate::lease::valid_until(started, lease) > Instant::now() {
                    self.forget(from);
                    self.forget(to);
                    return Ok(Some(proposed));
                }
            }
            // Not passed: neither hold is left (the next holder's undone where masters passed
            // or did not answer, the holder's released where they did not pass), and the
            // release of the holder's wakes the first waiting process as any release does.
            let not_held = count(|v| matches!(v, Vote::Held(_)));
            let undone =
                !(granted > 0 || votes.iter().any(Result::is_err)) || self.undo(key, to).await;
            let released = match self.release(key, LockKind::Mutex, from).await {
                Ok(_) => "the holder's lock was released",
                Err(error) => {
                    tracing::debug!(key = %key, error = %error, "RedLock: after a failed pass, the holder's lock could not be released on every master; its leases will end it");
                    "the holder's lock could not be released on every master"
                }
            };
            let lost = not_held > self.nodes.len() - self.quorum;
            if lost && undone {
                // The holder had lost the lock: nothing was passed, and nothing of the next
                // holder's is left.
                return Ok(None);
            }
            if lost {
                // The next holder's token may be left where the undo went unanswered: an error,
                // so that its waiter removes it (its next attempt takes it over, or its giving
                // up deletes it).
                return Err(BackendError::new(format!(
                    "RedLock pass: the holder had lost the lock, and the next holder's token \
                     could not be removed from every master; {released}"
                )));
            }
            if granted >= self.quorum {
                return Err(BackendError::new(format!(
                    "RedLock pass: a majority passed the lock, but after {:?} no validity was \
                     left of the {lease:?} lease; the next holder's token was undone, and \
                     {released}",
                    started.elapsed()
                )));
            }
            Err(self.no_majority(
                "pass",
                Round::granted(votes),
                &format!("{granted} passed, {not_held} did not hold it; {released}"),
            ))
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let round = self.round(|node| node.inspect(key)).await;
            self.agreed("inspect", round)
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let round = self.round(|node| node.list(prefix)).await;
            if round.failed() > self.nodes.len() - self.quorum {
                return Err(self.no_majority("list", round, "too few masters"));
            }
            // Each is then inspected: only a majority's lock is listed.
            Ok(round.replies.into_iter().flatten().flatten().collect())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(async move {
            let round = self.round(|node| node.force_release(key)).await;
            // The place first in the first master's queue, woken once every master answered
            // (that master's own announcement may come first, or not at all when it held
            // nothing).
            let first = &self.nodes[self.leader(key)].redis;
            let _ =
                tokio::time::timeout(self.request_timeout, first.wake_first(wake_script(), key))
                    .await;
            self.agreed("force release", round)
        })
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a str,
        place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.nodes[self.leader(key)].redis.leave_queue(key, place)
    }

    fn watching(&self, key: &str, token: &Token, place: Option<&Token>) -> Option<Watch> {
        // A waiter from a place hears the first master's releases that name it; otherwise (that
        // master cannot be subscribed to now) enough masters' announcements on the key's channel.
        if place.is_some()
            && let Some(watch) = self.nodes[self.leader(key)]
                .redis
                .watching(key, token, place)
        {
            return Some(watch);
        }
        let leader = self.leader(key);
        // The first master announces no release on the key's channel (its queue's places are
        // woken by the releasing clients): the others' announcements are counted.
        let watches = (self.nodes.iter().enumerate())
            .filter(|(i, _)| *i != leader)
            .filter_map(|(_, node)| node.redis.watching(key, token, None))
            .collect();
        self.combine(watches)
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            if place.is_some()
                && let Some(watch) = self.nodes[self.leader(key)]
                    .redis
                    .watch(key, token, place)
                    .await
            {
                return Some(watch);
            }
            let leader = self.leader(key);
            let watches = join_all(
                (self.nodes.iter().enumerate())
                    .filter(|(i, _)| *i != leader)
                    .map(|(_, node)| node.redis.watch(key, token, None)),
            )
            .await
            .into_iter()
            .flatten()
            .collect();
            self.combine(watches)
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: FairOrder::Unsupported(
                "RedLock's masters keep no common line of waiters, so no order among them can \
                 be promised; `fair` is not available on `redis+redlock://`",
            ),
            cannot_share: Some(
                "not available on `redis+redlock://`: a semaphore or a read/write lock needs one \
                 place that counts its holders, and RedLock's independent masters each count \
                 only their own (a permit granted by a majority may be counted on a different \
                 majority than the next one's, so more holders than permits could pass); use \
                 one Redis server, a Cluster or Sentinel, etcd, ZooKeeper or PostgreSQL",
            ),
            places: true,
            passes: true,
            // The releasing client wakes the place first in the first master's queue once its
            // round has answered, and a release the first master missed is sent to it again,
            // which then wakes that place (see `release_again`); the first master's notification
            // connection, when lost, wakes every waiter.
            wake_up: WakeUp::Named,
            ..Capabilities::default()
        }
    }
}

impl RedLockBackend {
    /// One wake-up from the masters' release notifications, when enough of them are subscribed
    /// that every release is heard: a release that counts deleted the key, and published, on a
    /// majority, and any `N - majority + 1` masters include one of them. With fewer, `None`:
    /// waiters poll.
    ///
    /// A release is announced by each master it ran on, moments apart: waiters are woken once
    /// per release, when as many masters as surely announce it (of those watched, all but the
    /// `N - majority` that may have missed it) have: by then a majority has let the key go, so
    /// the woken attempt is not refused by masters the release has yet to reach.
    fn combine(&self, watches: Vec<Watch>) -> Option<Watch> {
        let minority = self.nodes.len() - self.quorum;
        if watches.len() <= minority {
            return None;
        }
        let needed = watches.len() - minority;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let combined = Arc::new(Notify::new());
        let sources: Vec<Arc<Notify>> = watches.iter().map(Watch::notify).collect();
        // Counting is only right while every master's watch hears: one that lost its
        // connection makes the waiter ask at `DLOCK_RETRY` and for a combination of the others.
        let hearing: Vec<Hearing> = watches.iter().filter_map(Watch::hearing_of).collect();
        let forward = combined.clone();
        let task = runtime.spawn(async move {
            let mut heard = vec![false; sources.len()];
            loop {
                // Futures made before a `notify_waiters` are woken by it even if not yet polled:
                // only an announcement in the instant between two turns of this loop can be
                // missed, and the other masters of its majority announce the same release.
                let (listening, next): (Vec<usize>, Vec<_>) = sources
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !heard[*i])
                    .map(|(i, n)| (i, Box::pin(n.notified())))
                    .unzip();
                let (_, which, _) = futures_util::future::select_all(next).await;
                heard[listening[which]] = true;
                if heard.iter().filter(|h| **h).count() >= needed {
                    heard.fill(false);
                    forward.notify_waiters();
                }
            }
        });
        // Each combination is its own: a waiter behind one that took the lock in this process
        // has nothing to compare its count with, and asks.
        let watch = Watch::new(
            combined,
            NextInLine::default(),
            Forwarding {
                _watches: watches,
                task,
            },
        );
        let hearing = Arc::new(move || hearing.iter().all(|hears| hears()));
        Some(watch.hearing(hearing).counted_alone())
    }
}

/// The masters' watches behind a combined one, and the task that forwards their wake-ups;
/// dropped with it.
struct Forwarding {
    _watches: Vec<Watch>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(
        url: &str,
        expire: Duration,
        request_timeout: Duration,
    ) -> Result<RedLockBackend, LockError> {
        check("DLOCK_URL", url)?;
        let url = EngineUrl::checked(url, "redlock");
        let settings = Settings {
            expire,
            request_timeout,
            ..Settings::default()
        };
        RedLockBackend::from_url(&url, &settings)
    }

    #[test]
    fn redlock_needs_an_odd_number_of_distinct_masters() {
        for (url, why) in [
            ("redis+redlock://u:s3cret@a:1", "at least 3"),
            ("redis+redlock://u:s3cret@a:1,b:2", "at least 3"),
            ("redis+redlock://u:s3cret@a:1,b:2,c:3,d:4", "odd number"),
            (
                "redis+redlock://u:s3cret@a:1,b:2,c:3,d:4,e:5,f:6",
                "odd number",
            ),
            ("redis+redlock://u:s3cret@a:1,b:2,a:1", "twice"),
            ("redis+redlock://u:s3cret@a:1,b:2,", "needs a port"),
            ("redis+redlock://u:s3cret@a:1,b:2,:3", "host name is empty"),
            ("redis+redlock://u:s3cret@", "no host"),
        ] {
            let err = check("DLOCK_URL", url).unwrap_err();
            assert!(err.is_config(), "{url}: {err:?}");
            let text = err.to_string();
            assert!(
                text.contains(why) && text.contains("DLOCK_URL"),
                "{url}: {text}"
            );
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
        for url in [
            "redis+redlock://a:1,b:2,c:3",
            "redis+redlock://u:pw@a:1,b:2,c:3,d:4,e:5",
        ] {
            check("X", url).unwrap();
        }
        let tls = check("X", "rediss+redlock://a:1,b:2,c:3");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls"), "{tls:?}");
    }

    #[test]
    fn majorities() {
        for (url, quorum) in [
            ("redis+redlock://a:1,b:2,c:3", 2),
            ("redis+redlock://a:1,b:2,c:3,d:4,e:5", 3),
            ("redis+redlock://a:1,b:2,c:3,d:4,e:5,f:6,g:7", 4),
        ] {
            let backend = from(url, Duration::from_secs(30), Duration::from_millis(500)).unwrap();
            assert_eq!(backend.quorum, quorum, "{url}");
        }
    }

    /// The memos of waits that ended without a word (timed out, dropped) do not pile up: at 64
    /// entries those refused over a minute ago and those with no refusal go; recent refusals stay.
    #[test]
    fn memos_of_waits_that_ended_without_a_word_are_pruned() {
        let backend = from(
            "redis+redlock://a:1,b:2,c:3",
            Duration::from_secs(30),
            Duration::from_millis(500),
        )
        .unwrap();
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(61))
            .expect("the monotonic clock is over a minute old");
        let tokens: Vec<Token> = (0..63).map(|_| Token::generate().unwrap()).collect();
        for (i, token) in tokens.iter().enumerate() {
            match i % 3 {
                0 => backend.mark_refused(token),
                1 => {
                    backend.mark_refused(token);
                    backend.memos().get_mut(&token.0).unwrap().refused = Some(long_ago);
                }
                _ => drop(backend.soon(token)),
            }
        }
        let last = Token::generate().unwrap();
        backend.mark_refused(&last);
        assert_eq!(backend.memos().len(), 64, "nothing goes below 64 entries");
        let next = Token::generate().unwrap();
        assert!(backend.soon(&next).is_some());
        // 21 recent refusals and `last` stay, and `next` is added.
        assert_eq!(backend.memos().len(), 23);
        for (i, token) in tokens.iter().enumerate() {
            assert_eq!(backend.was_refused(token), i % 3 == 0, "memo {i}");
            assert_eq!(
                backend.memos().contains_key(&token.0),
                i % 3 == 0,
                "memo {i}"
            );
        }
        assert!(backend.was_refused(&last));
        // A wait the first master refused keeps its memo until it ends; one never refused loses
        // its count of quick retries there.
        backend.settled(&last);
        backend.settled(&next);
        assert!(backend.was_refused(&last));
        assert!(!backend.memos().contains_key(&next.0));
        backend.forget(&last);
        assert_eq!(backend.memos().len(), 21);
    }

    /// Three real Redis masters (stopped when the first item drops), their `host:port`s, and a
    /// backend over them (30s leases, 500ms request timeout).
    fn three_masters() -> (
        Vec<crate::backend::redis::test_server::Server>,
        Vec<String>,
        RedLockBackend,
    ) {
        let servers: Vec<_> = (0..3)
            .map(|_| crate::backend::redis::test_server::Server::start())
            .collect();
        let hosts: Vec<String> = servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.1))
            .collect();
        let url = format!("redis+redlock://{}", hosts.join(","));
        let backend = from(&url, Duration::from_secs(30), Duration::from_millis(500)).unwrap();
        (servers, hosts, backend)
    }

    /// A pass hands the lock over from its holder only, or again to this very pass's value: on
    /// three real masters, a key holding the next holder's token with another record and fence
    /// (what its own attempt answered late, or an earlier pass to it, leaves) is not the
    /// holder's, and the pass says the holder had lost it (`None`), leaving the key as it was.
    /// Before, pass.lua took the token alone for its own pass asked again, granted, and the
    /// holder was told it had passed a lock it had lost. The holder's own hold passes.
    #[tokio::test]
    async fn a_pass_finding_the_next_holders_token_alone_passes_nothing() {
        let (_servers, hosts, backend) = three_masters();
        let (holder, next) = (Token::generate().unwrap(), Token::generate().unwrap());
        let key = "dlock:pass-token-alone";
        // The key's value on every master, by one command each (`SET … PX`, or `GET`).
        let on_all = |args: &[&str]| -> Vec<Option<String>> {
            hosts
                .iter()
                .map(|host| {
                    let client = redis::Client::open(format!("redis://{host}")).unwrap();
                    let mut c = client.get_connection().unwrap();
                    redis::cmd(args[0])
                        .arg(key)
                        .arg(&args[1..])
                        .query(&mut c)
                        .unwrap()
                })
                .collect()
        };
        let set_all = |value: &str| drop(on_all(&["SET", value, "PX", "30000"]));
        let get_all = || on_all(&["GET"]);
        let elsewhere = format!(
            "{} pid=1@elsewhere since=2026-11-29T00:00:00.000Z fence=7",
            next.as_str()
        );
        set_all(&elsewhere);
        let passed = backend
            .pass(key, &holder, &next, Duration::from_secs(30))
            .await;
        assert!(matches!(passed, Ok(None)), "{passed:?}");
        assert_eq!(get_all(), vec![Some(elsewhere); 3]);

        let held = format!(
            "{} pid=1@here since=2026-11-29T00:00:00.000Z fence=8",
            holder.as_str()
        );
        set_all(&held);
        let passed = backend
            .pass(key, &holder, &next, Duration::from_secs(30))
            .await;
        assert!(matches!(passed, Ok(Some(_))), "{passed:?}");
        for value in get_all() {
            assert!(
                value.as_ref().is_some_and(|v| v.starts_with(next.as_str())),
                "{value:?}"
            );
        }
    }

    /// An attempt whose second round a majority still answered `Behind` (free there, counters
    /// past its proposal: contenders took the key and let it go between its rounds) lost a
    /// race: refused, to be asked again at once (no pause) from the first master first. Before,
    /// it was a backend error: its waiter slept its retry pause with the key free and no
    /// wake-up armed (`waiting::redlock_releases_keep_waking_the_line` failed under CPU load,
    /// the key free for 0.85–1s), and a `try_acquire` failed with "no majority answered".
    #[tokio::test]
    async fn a_majority_still_behind_after_the_second_round_is_a_lost_race() {
        let (_servers, _, backend) = three_masters();
        let token = Token::generate().unwrap();
        let request = Request {
            key: "dlock:behind-twice",
            token: &token,
            lease: Duration::from_secs(30),
            kind: LockKind::Mutex,
            liveness: Duration::from_secs(4),
            queue: None,
        };
        let proposed = backend.proposal();
        let ahead = proposed + 1_000;
        for votes in [
            (0..3).map(|_| Ok(Vote::Behind(ahead))).collect(),
            vec![
                Ok(Vote::Behind(ahead)),
                Ok(Vote::Granted),
                Err(BackendError::new("no reply")),
            ],
        ] {
            let decided = backend
                .decide(&request, Instant::now(), proposed, votes)
                .await;
            assert!(
                matches!(decided, Ok(Attempt::Held { ttl: Some(ttl), queued: false }) if ttl.is_zero()),
                "{decided:?}"
            );
            assert!(backend.was_refused(&token), "asks the first master first");
            backend.forget(&token);
        }
        // Behind on a minority only, the others down: still an error.
        let decided = backend
            .decide(
                &request,
                Instant::now(),
                proposed,
                vec![
                    Ok(Vote::Behind(ahead)),
                    Err(BackendError::new("no reply")),
                    Err(BackendError::new("no reply")),
                ],
            )
            .await;
        assert!(decided.is_err(), "{decided:?}");
    }

    #[test]
    fn a_request_timeout_near_the_lease_is_refused() {
        let url = "redis+redlock://u:s3cret@a:1,b:2,c:3";
        let err = from(url, Duration::from_secs(2), Duration::from_millis(500)).unwrap_err();
        assert!(err.is_config(), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("DLOCK_REQUEST_TIMEOUT") && text.contains("DLOCK_EXPIRE"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        assert!(from(url, Duration::from_millis(2500), Duration::from_millis(500)).is_ok());
    }
}
