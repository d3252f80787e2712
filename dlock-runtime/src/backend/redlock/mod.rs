//! RedLock: one lock over N independent Redis masters (an odd N ≥ 3), held while a majority
//! holds it. Each master is reached the way the single-server engine reaches its server (one
//! self-reconnecting connection, the same Lua scripts, release notifications on its own pub/sub
//! connection); every request goes to all masters at once, each bounded by the request timeout.
//!
//! - **Acquire**: the acquire script (with its TTL recheck) on every master. Held when a
//!   majority granted and time is left of the lease after the elapsed time and the clock-drift
//!   allowance (1% + 2ms), counted from before the first request; the guard's lease clock counts
//!   from that same instant, so it ends when this validity does. Otherwise the attempt is undone
//!   on every master (compare-and-delete by token).
//! - **Fencing**: each granting master issues a fence from its own counter; the highest of them is
//!   the lock's, and a second round raises the counter of every granting master below it to it
//!   before the lock counts as held (this round counts in the validity). A majority then holds a
//!   counter at least that high, every later majority shares a master with it, and so every
//!   later fence is higher, whichever majorities granted.
//! - **Release** and **extend** on every master; a majority decides. Fewer definite answers
//!   than that (masters unreachable) is a backend error.

use std::{fmt, sync::Arc, time::Duration};

use futures_util::future::join_all;
use tokio::{sync::Notify, time::Instant};

use super::{
    api::{
        Attempt, Backend, BoxFuture, Built, Capabilities, FairOrder, NextInLine, Request, Token,
        Watch,
    },
    redis::RedisBackend,
};
use crate::{
    LockError,
    config::Settings,
    error::BackendError,
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
/// two rounds of requests, each up to a request timeout, and only what is left of the lease
/// after them is the lock's validity.
const LEASE_PER_REQUEST_TIMEOUT: u32 = 5;

/// One master: where it is (for errors; never with credentials) and its connection.
struct Node {
    addr: String,
    redis: RedisBackend,
}

pub(crate) struct RedLockBackend {
    nodes: Vec<Node>,
    /// A majority: `nodes.len() / 2 + 1`.
    quorum: usize,
    request_timeout: Duration,
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
                    redis: RedisBackend::from_url(&node_url, settings)?,
                })
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(Self {
            nodes,
            quorum: n / 2 + 1,
            request_timeout: timeout,
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
    /// Raises the fence counter of `key` to `fence` on the masters that granted (`fences[i]`
    /// is what master `i` issued, `None` where it refused); masters already there need no
    /// request. Returns how many granting masters now stand at `fence`.
    async fn raise_fences(&self, key: &str, fences: &[Option<u64>], fence: u64) -> usize {
        let raises = join_all(self.nodes.iter().zip(fences).filter_map(|(node, f)| {
            let f = (*f)?;
            Some(async move {
                if f == fence {
                    return true;
                }
                tokio::time::timeout(self.request_timeout, node.redis.raise_fence(key, fence))
                    .await
                    .is_ok_and(|r| r.is_ok())
            })
        }))
        .await;
        raises.iter().filter(|ok| **ok).count()
    }

    async fn undo(&self, key: &str, token: &Token) {
        let round = self.round(|node| node.release(key, token)).await;
        if round.failed() > 0 {
            tracing::debug!(
                key = %key,
                unreachable = round.failed(),
                "RedLock: an attempt could not be undone on every master; their leases will end it"
            );
        }
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
            .zip(&self.nodes)
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

impl Backend for RedLockBackend {
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
            let request = Request {
                queue: None,
                ..request
            };
            let round = self.round(|node| node.acquire(request)).await;
            let fences: Vec<Option<u64>> = round
                .replies
                .iter()
                .map(|r| match r {
                    Ok(Attempt::Acquired { fence, .. }) => Some(*fence),
                    _ => None,
                })
                .collect();
            let granted = fences.iter().flatten().count();
            let mut why = None;
            if granted >= self.quorum {
                // The lock's fence is the highest a granting master issued; the others are raised
                // to it, so that every master of this majority issues only higher ones from now
                // on. Masters already there need no request.
                let fence = fences.iter().flatten().copied().max().unwrap_or(0);
                let raised = self.raise_fences(request.key, &fences, fence).await;
                // The guard's lease clock, which counts from the same instant, ends with this.
                let valid = crate::lease::valid_until(started, request.lease) > Instant::now();
                if valid && raised >= self.quorum {
                    return Ok(Attempt::acquired(fence));
                }
                why = Some(if valid {
                    format!(
                        "a majority granted, but the fence was raised on only {raised} of the \
                         {granted} granting masters; the attempt was undone"
                    )
                } else {
                    format!(
                        "a majority granted, but after {:?} no validity was left of the {:?} \
                         lease; the attempt was undone",
                        started.elapsed(),
                        request.lease
                    )
                });
            }
            self.undo(request.key, request.token).await;
            if let Some(why) = why {
                return Err(BackendError::new(format!("RedLock acquire: {why}")));
            }
            let refused: Vec<Option<Duration>> = round
                .replies
                .iter()
                .filter_map(|r| match r {
                    Ok(Attempt::Held { ttl, .. }) => Some(*ttl),
                    _ => None,
                })
                .collect();
            if refused.len() > self.nodes.len() - self.quorum {
                // Held elsewhere on enough masters that no majority is left: the lock may be free
                // once the first of those holds ends (the wait never sleeps longer than that).
                return Ok(Attempt::Held {
                    ttl: refused.iter().flatten().min().copied(),
                    queued: false,
                });
            }
            Err(self.no_majority(
                "acquire",
                round,
                &format!("{granted} granted, {} refused", refused.len()),
            ))
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let round = self.round(|node| node.release(key, token)).await;
            // Deleted on a minority at most: the lock was lost (what was left of it is deleted
            // all the same).
            self.majority("release", "held our lock", round)
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let round = self.round(|node| node.extend(key, token, lease)).await;
            self.majority("extend", "extended our lock", round)
        })
    }

    fn watching(&self, key: &str, token: &Token) -> Option<Watch> {
        let watches = self
            .nodes
            .iter()
            .filter_map(|node| node.redis.watching(key, token))
            .collect();
        self.combine(watches)
    }

    fn watch<'a>(&'a self, key: &'a str, token: &'a Token) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            let watches = join_all(self.nodes.iter().map(|node| node.redis.watch(key, token)))
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
        Some(Watch::new(
            combined,
            NextInLine::default(),
            Forwarding {
                _watches: watches,
                task,
            },
        ))
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
