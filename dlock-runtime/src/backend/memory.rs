//! The embedded backend: one in-process table, the same semantics as Redis.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use tokio::time::Instant;

use super::{Attempt, Backend, BoxFuture, Token};
use crate::error::BackendError;

#[derive(Debug)]
struct Entry {
    token: Token,
    fence: u64,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct Table {
    held: HashMap<String, Entry>,
    /// One counter for every key: strictly increasing per key as a consequence.
    fence: u64,
}

/// A lock table. Clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct MemoryBackend {
    table: Arc<Mutex<Table>>,
}

impl MemoryBackend {
    /// The process-wide table used by lockers built from the environment (`DLOCK_BACKEND=memory`),
    /// so that every such locker in one process excludes the others, as they would on one server.
    pub(crate) fn shared() -> Self {
        static SHARED: OnceLock<MemoryBackend> = OnceLock::new();
        SHARED.get_or_init(Self::default).clone()
    }

    fn with_table<T>(&self, f: impl FnOnce(&mut Table, Instant) -> T) -> T {
        // A panic while the table is locked cannot leave it half-written (every update is one
        // insert or remove), so a poisoned lock is still usable.
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

    fn sweep(&mut self, now: Instant) {
        if self.held.len() >= 1024 && self.held.len().is_power_of_two() {
            self.held.retain(|_, e| e.expires_at > now);
        }
    }
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        let attempt = self.with_table(|table, now| {
            match table.live(key, now) {
                Some(entry) if entry.token == *token => {
                    entry.expires_at = now + lease;
                    return Attempt::Acquired { fence: entry.fence };
                }
                Some(entry) => {
                    return Attempt::Held {
                        ttl: Some(entry.expires_at - now),
                    };
                }
                None => {}
            }
            table.sweep(now);
            table.fence += 1;
            let fence = table.fence;
            table.held.insert(
                key.to_owned(),
                Entry {
                    token: token.clone(),
                    fence,
                    expires_at: now + lease,
                },
            );
            Attempt::Acquired { fence }
        });
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let released = self.with_table(|table, now| {
            let mine = table.live(key, now).is_some_and(|e| e.token == *token);
            if mine {
                table.held.remove(key);
            }
            mine
        });
        Box::pin(std::future::ready(Ok(released)))
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let extended = self.with_table(|table, now| match table.live(key, now) {
            Some(entry) if entry.token == *token => {
                entry.expires_at = now + lease;
                true
            }
            _ => false,
        });
        Box::pin(std::future::ready(Ok(extended)))
    }
}
