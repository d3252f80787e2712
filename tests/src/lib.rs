//! Test harness for dlock: starts real `redis-server` processes on free loopback ports and stops
//! them when dropped, with the faults the fault tests need (kill, restart on the same port,
//! SIGSTOP/SIGCONT), and the Cluster and Sentinel deployments of the engine suite.
//!
//! The deployments live in [`dlock_examples::throwaway`], where the examples run on them too;
//! they are re-exported here under the names the tests use ([`RedisServer`], [`cluster`],
//! [`sentinel`], [`free_port`], [`INSTALL_REDIS`]). A missing `redis-server` binary fails the
//! test with the command that installs it.
#![warn(unreachable_pub, missing_debug_implementations)]

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use dlock_runtime::Locker;

pub mod engines;
pub use dlock_examples::throwaway::{
    INSTALL_REDIS, RedisServer, cluster, etcd, free_port, sentinel,
};
pub use engines::Engine;

/// Takes `key` with default options and releases it at once, panicking on any error: a warm-up
/// (connection made, scripts loaded) or a check that the key is free.
///
/// # Panics
/// When the lock cannot be taken or released.
pub async fn acquire_and_release(locker: &Locker, key: &str) {
    let guard = locker
        .acquire(key, dlock_runtime::LockOptions::new())
        .await
        .unwrap_or_else(|e| panic!("acquire `{key}`: {e}"));
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("release `{key}`: {e}"));
}

/// A key no other test in this process uses.
#[must_use]
pub fn unique_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A non-atomic increment with an `.await` between the read and the write: callers that are not
/// excluded from each other lose updates (each writes back what it read, plus one).
pub async fn racy_increment(counter: &AtomicU64) {
    let seen = counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    counter.store(seen + 1, Ordering::SeqCst);
}

/// A `tracing` writer that keeps what is written, for tests that read the events dlock emitted.
#[derive(Clone, Debug, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far.
    ///
    /// # Panics
    /// When a writer panicked while holding the buffer.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
