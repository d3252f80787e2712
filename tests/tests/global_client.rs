//! The default client: without `client = ...` a locked function uses the process-wide locker
//! (`dlock_runtime::global()`), here installed with `set_global` on a real `redis-server`. The
//! global locker is per process, so this binary holds exactly one test.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use dlock_runtime::{LockError, dlock};
use dlock_tests::{RedisServer, racy_increment};

/// Documented, public, on the global locker.
#[dlock(key = "global:<id>", timeout = "5s", expire = "30s")]
pub async fn locked(
    server: Arc<RedisServer>,
    counter: Arc<AtomicU64>,
    id: u64,
) -> Result<bool, LockError> {
    let held = server.exists(&format!("dlock:global:{id}"));
    racy_increment(&counter).await;
    Ok(held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_client_is_the_global_locker() {
    let server = Arc::new(RedisServer::start());
    dlock_runtime::set_global(server.locker()).expect("the only test in this binary");
    let counter = Arc::new(AtomicU64::new(0));
    // The global locker is one connection shared by all tasks; each task is still its own
    // holder, so they exclude each other.
    let tasks: Vec<_> = (0..8)
        .map(|_| tokio::spawn(locked(server.clone(), counter.clone(), 1)))
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap(), "the key existed in the body");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8);
    assert!(!server.exists("dlock:global:1"));
}
