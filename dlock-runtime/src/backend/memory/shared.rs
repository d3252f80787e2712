//! The embedded table's semaphores and read/write locks: per key, its holders in the order
//! they were granted, and (a read/write lock) the writers waiting, in the order they came.

use std::time::Duration;

use tokio::time::Instant;

use super::super::api::{Attempt, Token};
use crate::{LockInfo, LockKind, holder};

/// What a key shared by several holders is: it keeps its shape while anyone holds or waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Permits(u32),
    ReadWrite,
}

impl Shape {
    fn of(kind: LockKind) -> Option<Self> {
        match kind {
            LockKind::Semaphore { permits } => Some(Self::Permits(permits)),
            LockKind::Read | LockKind::Write => Some(Self::ReadWrite),
            _ => None,
        }
    }

    fn describe(self) -> String {
        match self {
            Self::Permits(permits) => LockKind::Semaphore { permits }.to_string(),
            Self::ReadWrite => "read/write lock".to_owned(),
        }
    }
}

#[derive(Debug)]
struct Holding {
    token: Token,
    write: bool,
    expires_at: Instant,
    record: String,
    fence: u64,
}

/// One key's holders and waiting writers.
#[derive(Debug)]
pub(super) struct Shared {
    shape: Shape,
    holders: Vec<Holding>,
    /// Writers waiting, first come first: while one waits, no new reader is let in.
    writers: Vec<(Token, Instant)>,
}

impl Shared {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
        self.writers.retain(|(_, gone_at)| *gone_at > now);
    }

    fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.writers.is_empty()
    }

    /// The soonest a hold ends: when a refused acquisition may look again at the latest.
    fn soonest_end(&self, now: Instant, writers_only: bool) -> Option<Duration> {
        self.holders
            .iter()
            .filter(|h| h.write || !writers_only)
            .map(|h| h.expires_at - now)
            .min()
    }
}

/// The live shared entry of `key`, with what lapsed dropped (the entry too, once empty).
pub(super) fn live<'a>(
    shared: &'a mut std::collections::HashMap<String, Shared>,
    key: &str,
    now: Instant,
) -> Option<&'a mut Shared> {
    let entry = shared.get_mut(key)?;
    entry.purge(now);
    if entry.is_empty() {
        shared.remove(key);
        return None;
    }
    shared.get_mut(key)
}

/// An acquisition of `kind` (a permit, a read or a write hold) by `token`; `fence` issues the
/// next fence. `mutex_held`: the key is held as a mutex.
pub(super) struct Ask<'a> {
    pub(super) key: &'a str,
    pub(super) token: &'a Token,
    pub(super) kind: LockKind,
    pub(super) lease: Duration,
    pub(super) liveness: Duration,
    pub(super) record: &'a dyn Fn() -> String,
}

pub(super) fn acquire(
    shared: &mut std::collections::HashMap<String, Shared>,
    ask: &Ask<'_>,
    now: Instant,
    fence: &mut dyn FnMut() -> u64,
) -> Attempt {
    let Some(shape) = Shape::of(ask.kind) else {
        return Attempt::Conflict("not a shared kind".to_owned());
    };
    let write = ask.kind == LockKind::Write;
    let entry = match live(shared, ask.key, now) {
        Some(entry) => entry,
        None => shared.entry(ask.key.to_owned()).or_insert(Shared {
            shape,
            holders: Vec::new(),
            writers: Vec::new(),
        }),
    };
    if entry.shape != shape {
        return Attempt::Conflict(format!(
            "it is held as a {}, and this acquisition asks for a {}",
            entry.shape.describe(),
            shape.describe()
        ));
    }
    if let Some(mine) = entry.holders.iter_mut().find(|h| h.token == *ask.token) {
        // Ours already (a reply was lost): a new fence, as on every engine.
        mine.expires_at = now + ask.lease;
        mine.fence = fence();
        return Attempt::acquired(mine.fence);
    }
    let first_writer = entry.writers.first().map(|(t, _)| t);
    let free = match shape {
        Shape::Permits(permits) => entry.holders.len() < usize::try_from(permits).unwrap_or(0),
        Shape::ReadWrite if write => {
            entry.holders.is_empty() && first_writer.is_none_or(|t| t == ask.token)
        }
        Shape::ReadWrite => !entry.holders.iter().any(|h| h.write) && first_writer.is_none(),
    };
    if !free {
        let ttl = entry.soonest_end(now, !write && shape == Shape::ReadWrite);
        if write {
            let gone_at = now + ask.liveness;
            match entry.writers.iter_mut().find(|(t, _)| t == ask.token) {
                Some(place) => place.1 = gone_at,
                None => entry.writers.push((ask.token.clone(), gone_at)),
            }
        }
        return Attempt::Held { ttl, queued: write };
    }
    entry.writers.retain(|(t, _)| t != ask.token);
    let fence = fence();
    entry.holders.push(Holding {
        token: ask.token.clone(),
        write,
        expires_at: now + ask.lease,
        record: (ask.record)(),
        fence,
    });
    Attempt::acquired(fence)
}

/// Gives up `token`'s hold or wait; `(held, woke)`: whether it held the key, and whether
/// waiters may now go.
pub(super) fn release(
    shared: &mut std::collections::HashMap<String, Shared>,
    key: &str,
    token: &Token,
    now: Instant,
) -> (bool, bool) {
    let Some(entry) = shared.get_mut(key) else {
        return (false, false);
    };
    let before = (entry.holders.len(), entry.writers.len());
    let held = entry
        .holders
        .iter()
        .any(|h| h.token == *token && h.expires_at > now);
    entry.holders.retain(|h| h.token != *token);
    entry.writers.retain(|(t, _)| t != token);
    let changed = before != (entry.holders.len(), entry.writers.len());
    if entry.is_empty() {
        shared.remove(key);
    }
    (held, changed)
}

pub(super) fn extend(
    shared: &mut std::collections::HashMap<String, Shared>,
    key: &str,
    token: &Token,
    lease: Duration,
    now: Instant,
) -> bool {
    let Some(entry) = live(shared, key, now) else {
        return false;
    };
    match entry.holders.iter_mut().find(|h| h.token == *token) {
        Some(mine) => {
            mine.expires_at = now + lease;
            true
        }
        None => false,
    }
}

/// What an operator sees of a shared key: its kind, holders, the longest-held holder, the
/// newest fence, the longest remaining lease, the writers waiting.
pub(super) fn info(entry: &Shared, key: &str, now: Instant) -> Option<LockInfo> {
    let oldest = entry.holders.first()?;
    let mut info = LockInfo::new(key.to_owned());
    info.kind = match entry.shape {
        Shape::Permits(permits) => LockKind::Semaphore { permits },
        Shape::ReadWrite if oldest.write => LockKind::Write,
        Shape::ReadWrite => LockKind::Read,
    };
    info.holders = entry.holders.len();
    info.holder = holder::parse(&oldest.record);
    info.fence = entry.holders.iter().map(|h| h.fence).max();
    info.remaining = entry.holders.iter().map(|h| h.expires_at - now).max();
    info.waiters = (entry.shape == Shape::ReadWrite).then_some(entry.writers.len());
    Some(info)
}

/// The kind a shared key is held as, for a mutex acquisition that must refuse it.
pub(super) fn describe(entry: &Shared) -> String {
    entry.shape.describe()
}

/// Frees every hold of the key (an operator's forced release); waiting writers stay in line.
pub(super) fn clear_holders(entry: &mut Shared) {
    entry.holders.clear();
}
