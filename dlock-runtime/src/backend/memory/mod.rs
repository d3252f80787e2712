//! The embedded backend: one in-process table, the same semantics as Redis.

mod shared;

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    api::{Attempt, Backend, BoxFuture, Built, Capabilities, Request, Token, Watch},
    watchers::Watchers,
};
use crate::{
    LockInfo, LockKind,
    error::BackendError,
    holder::{self, Identity},
};

/// The embedded engine: `memory://`, the process's shared table.
pub(super) const BUILT: Built = Built {
    check: |_, _| Ok(()),
    build: |_, settings| Ok(Arc::new(MemoryBackend::shared(&settings.identity))),
    options: &[],
};

#[derive(Debug)]
struct Entry {
    token: Token,
    expires_at: Instant,
    /// Its holder's record, with the time it was taken.
    record: String,
    fence: u64,
}

#[derive(Debug, Default)]
struct Table {
    held: HashMap<String, Entry>,
    /// Fair-mode waiters per key, first come first served, each with the instant it counts as
    /// gone unless it tries again.
    queues: HashMap<String, VecDeque<(Token, Instant)>>,
    /// One counter for every key: strictly increasing per key as a consequence.
    fence: u64,
    /// The semaphores and read/write locks held or waited for.
    shared: HashMap<String, shared::Shared>,
}

/// A lock table. Clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct MemoryBackend {
    table: Arc<Mutex<Table>>,
    /// Release wake-ups per key. In-process wake-ups are cheap: they name no one and every
    /// waiter looks.
    watchers: Arc<Watchers>,
    /// Who this backend's locker is, recorded with its holds.
    identity: Identity,
}

impl MemoryBackend {
    /// The process-wide table used by lockers built from the environment (`DLOCK_BACKEND=memory`),
    /// so that every such locker in one process excludes the others, as they would on one server.
    pub(crate) fn shared(identity: &Identity) -> Self {
        static SHARED: OnceLock<MemoryBackend> = OnceLock::new();
        Self {
            identity: identity.clone(),
            ..SHARED.get_or_init(Self::default).clone()
        }
    }

    /// A private table, whose holds record `identity`.
    pub(crate) fn private(identity: &Identity) -> Self {
        Self {
            identity: identity.clone(),
            ..Self::default()
        }
    }

    fn with_table<T>(&self, f: impl FnOnce(&mut Table, Instant) -> T) -> T {
        // Every update is a handful of inserts and removes that cannot panic half-way, so a
        // poisoned lock is still consistent.
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut table, Instant::now())
    }
}

impl Table {
    /// The live entry for `key`, dropping it when its lease has run out.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.held.get(key).is_some_and(|e| e.expires_at <= now) {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }

    /// Drops expired entries and dead registrations now and then, so the table stays bounded.
    fn sweep(&mut self, now: Instant) {
        if self.held.len() >= 1024 && self.held.len().is_power_of_two() {
            self.held.retain(|_, e| e.expires_at > now);
        }
    }

    /// Drops queued waiters that stopped trying from the head of `key`'s queue; returns the head.
    fn queue_head(&mut self, key: &str, now: Instant) -> Option<&Token> {
        let queue = self.queues.get_mut(key)?;
        while queue.front().is_some_and(|(_, gone_at)| *gone_at <= now) {
            queue.pop_front();
        }
        if queue.is_empty() {
            self.queues.remove(key);
            return None;
        }
        self.queues.get(key).and_then(|q| q.front()).map(|(t, _)| t)
    }

    /// Joins the queue, or refreshes this waiter's place in it.
    fn wait_in_line(&mut self, key: &str, token: &Token, gone_at: Instant) {
        let queue = self.queues.entry(key.to_owned()).or_default();
        match queue.iter_mut().find(|(t, _)| t == token) {
            Some(place) => place.1 = gone_at,
            None => queue.push_back((token.clone(), gone_at)),
        }
    }

    fn leave_queue(&mut self, key: &str, token: &Token) -> bool {
        let Some(queue) = self.queues.get_mut(key) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|(t, _)| t != token);
        let left = queue.len() < before;
        if queue.is_empty() {
            self.queues.remove(key);
        }
        left
    }
}

impl Backend for MemoryBackend {
    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        let Request {
            key,
            token,
            lease,
            kind,
            liveness,
            queue,
        } = request;
        let attempt = self.with_table(|table, now| {
            if !kind.is_mutex() {
                if table.live(key, now).is_some() {
                    return Attempt::Conflict(format!(
                        "it is held as a mutex, and this acquisition asks for a {kind}"
                    ));
                }
                let ask = shared::Ask {
                    key,
                    token,
                    kind,
                    lease,
                    liveness,
                    record: &|| self.identity.since(std::time::SystemTime::now()),
                };
                let counter = &mut table.fence;
                return shared::acquire(&mut table.shared, &ask, now, &mut || {
                    *counter += 1;
                    *counter
                });
            }
            if let Some(entry) = shared::live(&mut table.shared, key, now) {
                return Attempt::Conflict(format!(
                    "it is held as a {}, and this acquisition asks for a mutex",
                    shared::describe(entry)
                ));
            }
            let next_fence = table.fence + 1;
            let held_ttl = match table.live(key, now) {
                // Ours already (an earlier attempt's reply was lost): a new fence, as on every
                // engine; nobody learnt the first one.
                Some(entry) if entry.token == *token => {
                    entry.expires_at = now + lease;
                    entry.fence = next_fence;
                    table.fence = next_fence;
                    return Attempt::acquired(next_fence);
                }
                Some(entry) => Some(entry.expires_at - now),
                None => None,
            };
            let head_is_other = match queue {
                Some(q) if q.strict => table
                    .queue_head(key, now)
                    .is_some_and(|head| head != q.place),
                _ => false,
            };
            if held_ttl.is_some() || head_is_other {
                if let Some(q) = queue {
                    table.wait_in_line(key, q.place, now + q.liveness);
                }
                return Attempt::Held {
                    ttl: held_ttl,
                    queued: queue.is_some(),
                };
            }
            if let Some(q) = queue {
                table.leave_queue(key, q.place);
                if q.keep {
                    table.wait_in_line(key, q.place, now + q.liveness);
                }
            }
            table.sweep(now);
            table.fence += 1;
            let fence = table.fence;
            table.held.insert(
                key.to_owned(),
                Entry {
                    token: token.clone(),
                    expires_at: now + lease,
                    record: self.identity.since(std::time::SystemTime::now()),
                    fence,
                },
            );
            Attempt::acquired(fence)
        });
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let released = self.with_table(|table, now| {
            if !kind.is_mutex() {
                let (held, changed) = shared::release(&mut table.shared, key, token, now);
                if changed {
                    self.watchers.wake(Some(key), None);
                }
                return held;
            }
            let mine = table.live(key, now).is_some_and(|e| e.token == *token);
            if mine {
                table.held.remove(key);
                self.watchers.wake(Some(key), None);
            }
            mine
        });
        Box::pin(std::future::ready(Ok(released)))
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a str,
        place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.with_table(|table, _| {
            if table.leave_queue(key, place) {
                self.watchers.wake(Some(key), None);
            }
        });
        Box::pin(std::future::ready(Ok(())))
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let extended = self.with_table(|table, now| match table.live(key, now) {
            _ if !kind.is_mutex() => shared::extend(&mut table.shared, key, token, lease, now),
            Some(entry) if entry.token == *token => {
                entry.expires_at = now + lease;
                true
            }
            _ => false,
        });
        Box::pin(std::future::ready(Ok(extended)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            passes: true,
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
        let passed = self.with_table(|table, now| {
            let fence = table.fence + 1;
            let entry = table.live(key, now).filter(|e| e.token == *from)?;
            entry.token = to.clone();
            entry.expires_at = now + lease;
            entry.record = self.identity.since(std::time::SystemTime::now());
            entry.fence = fence;
            table.fence = fence;
            Some(fence)
        });
        Box::pin(std::future::ready(Ok(passed)))
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        let info = self.with_table(|table, now| {
            let waiters = table.queues.get(key).map_or(0, |q| {
                q.iter().filter(|(_, gone_at)| *gone_at > now).count()
            });
            if let Some(entry) = shared::live(&mut table.shared, key, now) {
                return shared::info(entry, key, now);
            }
            let entry = table.live(key, now)?;
            let mut info = LockInfo::new(key.to_owned());
            info.holder = holder::parse(&entry.record);
            info.fence = Some(entry.fence);
            info.remaining = Some(entry.expires_at - now);
            info.waiters = Some(waiters);
            Some(info)
        });
        Box::pin(std::future::ready(Ok(info)))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        let keys = self.with_table(|table, now| {
            table
                .held
                .iter()
                .filter(|(key, entry)| key.starts_with(prefix) && entry.expires_at > now)
                .map(|(key, _)| key.clone())
                .chain(
                    table
                        .shared
                        .keys()
                        .filter(|key| key.starts_with(prefix))
                        .cloned(),
                )
                .collect()
        });
        Box::pin(std::future::ready(Ok(keys)))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        let freed = self.with_table(|table, now| {
            if let Some(entry) = shared::live(&mut table.shared, key, now) {
                // Every hold of it goes; a waiting writer stays in line.
                let info = shared::info(entry, key, now);
                shared::clear_holders(entry);
                self.watchers.wake(Some(key), None);
                return info;
            }
            let entry = table.live(key, now)?;
            let mut info = LockInfo::new(key.to_owned());
            info.holder = holder::parse(&entry.record);
            info.fence = Some(entry.fence);
            info.remaining = Some(entry.expires_at - now);
            table.held.remove(key);
            self.watchers.wake(Some(key), None);
            Some(info)
        });
        Box::pin(std::future::ready(Ok(freed)))
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        _token: &'a Token,
        _place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(std::future::ready(Some(self.watchers.register(key))))
    }
}
