//! The `timeout` argument against a key another connection holds, with a real `redis-server`:
//! `"0s"` tries once and fails at once, a positive timeout waits that long and no less, and a
//! release within the timeout lets the call in.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::RedisServer;
use tokio::time::Instant;

#[dlock(key = "busy", client = locker, timeout = "0s")]
async fn try_once(locker: &Locker, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[dlock(key = "busy", client = locker, timeout = "300ms")]
async fn short_wait(locker: &Locker, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[dlock(key = "busy", client = locker, timeout = "5s")]
async fn long_wait(locker: &Locker, server: &dlock_tests::RedisServer) -> Result<bool, LockError> {
    Ok(server.exists("dlock:busy"))
}

#[tokio::test]
async fn zero_timeout_fails_at_once_on_a_held_key() {
    let server = RedisServer::start();
    let _held = server
        .locker()
        .acquire("busy", LockOptions::new())
        .await
        .unwrap();
    let locker = server.locker();
    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let result = try_once(&locker, &ran).await;
    assert!(
        matches!(&result, Err(LockError::Timeout { key, .. }) if key == "dlock:busy"),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "no waiting");
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test]
async fn timeout_waits_at_least_that_long() {
    let server = RedisServer::start();
    let _held = server
        .locker()
        .acquire("busy", LockOptions::new())
        .await
        .unwrap();
    let locker = server.locker();
    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let result = short_wait(&locker, &ran).await;
    let elapsed = started.elapsed();
    let Err(LockError::Timeout { waited, .. }) = result else {
        panic!("{result:?}");
    };
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_release_within_the_timeout_lets_the_call_in() {
    let server = RedisServer::start();
    let held = server
        .locker()
        .acquire("busy", LockOptions::new())
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.release().await.unwrap();
    });
    assert!(long_wait(&server.locker(), &server).await.unwrap());
    release.await.unwrap();
    assert!(!server.exists("dlock:busy"));
}
