//! `return`, `?` and `Err` keep their meaning inside a locked body, and the lock is released on
//! every path: `Ok`, `Err`, early return, `?`, a panic in the body, and the caller dropping the
//! future while the body runs. Against a real `redis-server`; each lease is 30s, so a key that
//! goes away was released, not expired.

use std::{
    num::{IntErrorKind, ParseIntError},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::RedisServer;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(ParseIntError),
    TooMany(u32),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl From<ParseIntError> for AppError {
    fn from(error: ParseIntError) -> Self {
        Self::Parse(error)
    }
}

/// What the body saw: whether the key existed, and whether it reached its last line.
#[derive(Default)]
struct Trace {
    held: AtomicBool,
    finished: AtomicBool,
}

const KEY: &str = "dlock:stock:tea";

#[dlock(key = "stock:<sku>", client = locker, expire = "30s", timeout = "200ms")]
async fn reserve(
    locker: &Locker,
    server: &RedisServer,
    trace: &Trace,
    sku: &str,
    qty: &str,
) -> Result<u32, AppError> {
    trace.held.store(server.exists(KEY), Ordering::SeqCst);
    if qty.is_empty() {
        return Ok(0);
    }
    let qty: u32 = qty.parse()?;
    if qty > 10 {
        return Err(AppError::TooMany(qty));
    }
    tokio::task::yield_now().await;
    trace.finished.store(true, Ordering::SeqCst);
    Ok(qty)
}

async fn call(server: &RedisServer, qty: &str) -> (Result<u32, AppError>, Trace) {
    let locker = server.locker();
    let trace = Trace::default();
    let result = reserve(&locker, server, &trace, "tea", qty).await;
    assert!(
        !server.exists(KEY),
        "the key is released when the call returns"
    );
    (result, trace)
}

#[tokio::test]
async fn ok_is_returned_and_released() {
    let server = RedisServer::start();
    let (result, trace) = call(&server, "3").await;
    assert_eq!(result.unwrap(), 3);
    assert!(trace.held.load(Ordering::SeqCst));
    assert!(trace.finished.load(Ordering::SeqCst));
}

#[tokio::test]
async fn early_return_returns_from_the_function() {
    let server = RedisServer::start();
    let (result, trace) = call(&server, "").await;
    assert_eq!(result.unwrap(), 0);
    assert!(trace.held.load(Ordering::SeqCst));
    assert!(
        !trace.finished.load(Ordering::SeqCst),
        "nothing after the `return` ran"
    );
}

#[tokio::test]
async fn question_mark_converts_with_the_functions_error_type() {
    let server = RedisServer::start();
    let (result, trace) = call(&server, "many").await;
    assert!(
        matches!(&result, Err(AppError::Parse(e)) if *e.kind() == IntErrorKind::InvalidDigit),
        "{result:?}"
    );
    assert!(trace.held.load(Ordering::SeqCst));
    assert!(!trace.finished.load(Ordering::SeqCst));
}

#[tokio::test]
async fn err_result_is_the_bodys_own() {
    let server = RedisServer::start();
    let (result, trace) = call(&server, "11").await;
    assert!(matches!(result, Err(AppError::TooMany(11))), "{result:?}");
    assert!(trace.held.load(Ordering::SeqCst));
}

/// A lock failure arrives through `From<LockError>`, and the body does not run.
#[tokio::test]
async fn lock_failure_is_the_lock_variant() {
    let server = RedisServer::start();
    let holder = server.locker();
    let held = holder
        .acquire("stock:tea", LockOptions::new())
        .await
        .unwrap();
    let locker = server.locker();
    let trace = Trace::default();
    let result = reserve(&locker, &server, &trace, "tea", "1").await;
    assert!(
        matches!(&result, Err(AppError::Lock(LockError::Timeout { key, .. })) if key == KEY),
        "{result:?}"
    );
    assert!(!trace.held.load(Ordering::SeqCst), "the body did not run");
    assert!(server.exists(KEY), "the other holder's lock is untouched");
    held.release().await.unwrap();
}

#[dlock(key = "panics", client = &locker, expire = "30s")]
async fn panicking(locker: Locker, server: Arc<RedisServer>) -> Result<(), LockError> {
    assert!(server.exists("dlock:panics"));
    tokio::task::yield_now().await;
    panic!("the body panics while holding the lock");
}

#[tokio::test]
async fn panic_in_the_body_releases() {
    let server = Arc::new(RedisServer::start());
    let error = tokio::spawn(panicking(server.locker(), server.clone()))
        .await
        .unwrap_err();
    assert!(error.is_panic());
    assert!(
        server
            .gone_within("dlock:panics", Duration::from_secs(2))
            .await,
        "released after the panic, long before the 30s lease"
    );
}

#[dlock(key = "slow", client = locker, expire = "30s")]
async fn slow(
    locker: &Locker,
    server: &RedisServer,
    started: &AtomicBool,
) -> Result<(), LockError> {
    started.store(server.exists("dlock:slow"), Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test]
async fn dropping_the_future_mid_body_releases() {
    let server = RedisServer::start();
    let locker = server.locker();
    let started = AtomicBool::new(false);
    let call = slow(&locker, &server, &started);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    assert!(
        started.load(Ordering::SeqCst),
        "the body ran, holding the key"
    );
    assert!(
        server
            .gone_within("dlock:slow", Duration::from_secs(2))
            .await,
        "released after the drop, long before the 30s lease"
    );
    // And the next caller gets it at once.
    let next = locker.try_acquire("slow", Duration::from_secs(1)).await;
    assert!(next.unwrap().is_some());
}
