//! Distributed locks around async functions.
//!
//! ```
//! use dlock_runtime::{dlock, LockError};
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self {
//!         Self::Lock(e)
//!     }
//! }
//!
//! /// Two instances of the service never run this at the same time for the same `id`.
//! #[dlock(key = "order:<id>", timeout = "5s", expire = "30s")]
//! async fn create_order(id: u64, qty: u32) -> Result<u64, AppError> {
//!     Ok(id * u64::from(qty))
//! }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # dlock_runtime::set_global(dlock_runtime::Locker::memory()).unwrap();
//! # assert_eq!(create_order(42, 2).await.unwrap(), 84);
//! # }
//! ```
//!
//! The attribute builds the key (`dlock:order:42`), waits up to `timeout` for the lock, runs the
//! body with a lease of `expire`, and releases the lock on every path: return, `?`, panic and
//! cancellation. The [`Locker`] is the programmatic API beneath it.
//!
//! # Lock kinds
//!
//! Beside the mutex: a counting semaphore (`#[dlock(permits = 3)]`, [`Locker::acquire_permit`])
//! and a read/write lock (`#[dlock(read)]` / `#[dlock(write)]`, [`Locker::acquire_read`] /
//! [`Locker::acquire_write`]), each hold with its own lease and fence, on every engine but
//! RedLock; and the job lock's minimum hold (`hold_at_least`). See [`LockKind`].
//!
//! ```
//! # use dlock_runtime::{dlock, LockError};
//! #[dlock(key = "export:<tenant>", permits = 3)]
//! async fn export(tenant: &str) -> Result<(), LockError> { Ok(()) }
//!
//! #[dlock(key = "doc:<id>", read)]
//! async fn show(id: u64) -> Result<(), LockError> { Ok(()) }
//!
//! #[dlock(key = "doc:<id>", write)]
//! async fn edit(id: u64) -> Result<(), LockError> { Ok(()) }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # dlock_runtime::set_global(dlock_runtime::Locker::memory()).unwrap();
//! # export("acme").await.unwrap(); show(7).await.unwrap(); edit(7).await.unwrap();
//! # }
//! ```
//!
//! # Engines
//!
//! The scheme of one URL (`DLOCK_URL`, or [`LockerBuilder::url`]) picks the engine; each is a
//! cargo feature, so a build has only the clients it uses.
//!
//! | URL | engine | feature |
//! | --- | --- | --- |
//! | `redis://[user[:password]@]host[:port][/db]`, `rediss://…` | one Redis server | `redis` (default) |
//! | `redis+cluster://[user:password@]h1:p1,h2:p2` | Redis Cluster | `redis-cluster` |
//! | `redis+sentinel://[user:password@]s1:p1,s2:p2/<master>` | Redis with Sentinel failover | `redis-sentinel` |
//! | `redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3` | RedLock over independent masters | `redlock` |
//! | `etcd://[user:password@]h1:p1,h2:p2`, `etcds://…` | etcd v3 | `etcd` |
//! | `zk://h1:p1,h2:p2[/chroot]` | ZooKeeper | `zookeeper` |
//! | `postgres://[user[:password]@]host[:port]/dbname`, `postgresql://…` | PostgreSQL | `postgres` |
//! | `memory://` | the embedded table of this process | always |
//!
//! TLS forms (`rediss`, `rediss+cluster`, …, `etcds`, PostgreSQL's `sslmode=require`) need the
//! `tls` feature. Engine options ride in the URL's query: `?wait=N` on the Redis engines (an
//! acquisition counts once `N` replicas acknowledged it), `?session_timeout=10s` on ZooKeeper.
//!
//! # Configuration
//!
//! [`Locker::from_env`] and [`global`] read:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `DLOCK_URL` | the engine and its address (see *Engines*); when set, the next three are not read | — |
//! | `DLOCK_BACKEND` | `redis` or `memory` (kept for compatibility) | `redis` |
//! | `DLOCK_REDIS_URL` | a `redis://` URL; `REDIS_URL` when unset (kept for compatibility) | `redis://127.0.0.1:6379` |
//! | `DLOCK_KEY_PREFIX` | prefix of every lock key (on ZooKeeper the path of the locks' parent node: `/dlock:/order:42`) | `dlock:` |
//! | `DLOCK_OWNER` | the holder's name recorded with every lock, beside host and process id | host name |
//! | `DLOCK_TIMEOUT` | default wait | `5s` |
//! | `DLOCK_EXPIRE` | default lease, and the renewed lease of `expire = "auto"` | `30s` |
//! | `DLOCK_RETRY` | jittered pause between attempts, `min..max` (a waiter woken by releases pauses at least 250ms..500ms, 1s on etcd and ZooKeeper; on Redis, RedLock and PostgreSQL, after failed attempts in a row with notifications on, it doubles up to those 250ms..500ms) | `10ms..50ms` |
//! | `DLOCK_MAX_KEY_LEN` | longest key accepted, prefix included (bytes) | `1024` |
//! | `DLOCK_REQUEST_TIMEOUT` | bound on one request to the server | `500ms` |
//! | `DLOCK_NOTIFY` | wake waiters by release notifications, `on` or `off` | `on` |
//! | `DLOCK_REDIS_WAIT` | the Redis engines' `wait` option, when the URL does not give it | `0` |
//! | `DLOCK_ZK_SESSION_TIMEOUT` | ZooKeeper's `session_timeout` option, when the URL does not give it | `10s` |
//!
//! A bad value is a [`LockError::Config`] naming the variable, reported on first use.
//!
//! # Features
//!
//! One feature per engine, so a build has only the clients it uses; the URL's scheme then picks
//! among them at run time.
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

#[doc(hidden)]
pub mod __private;
#[cfg(feature = "axum")]
mod axum;
mod backend;
mod config;
mod env;
mod error;
mod guard;
mod holder;
mod lease;
mod locker;
mod options;
mod stats;
mod url;

pub use config::{
    DEFAULT_EXPIRE, DEFAULT_KEY_PREFIX, DEFAULT_MAX_KEY_LEN, DEFAULT_REDIS_URL,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRY, DEFAULT_TIMEOUT,
};
pub use error::{BackendError, LockError};
pub use guard::{LockGuard, fencing_token};
pub use holder::{Holder, LockInfo};
pub use lease::{MAX_LEASE, MIN_LEASE};
pub use locker::{
    Locker,
    builder::{LockerBuilder, global, set_global},
};
pub use options::{LockKind, LockOptions};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use stats::describe_metrics;
pub use url::EngineUrl;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use dlock_macros::dlock;
