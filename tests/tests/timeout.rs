//! The `timeout` argument against a key another connection holds, with a real `redis-server`:
//! `"0s"` tries once and fails at once, a positive timeout waits that long and no less, and a
//! release within the timeout lets the call in.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::RedisServer;
use dlock_tests::resp::Value;
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

/// `fair = true`: callers queued behind a holder get the lock in the order they asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_attribute_serves_callers_in_order() {
    use std::sync::{Arc, Mutex};

    #[dlock_runtime::dlock(key = "fair:<name>", client = locker, fair = true, timeout = "20s")]
    async fn take_a_turn(
        locker: &dlock_runtime::Locker,
        name: &str,
        order: &Mutex<Vec<usize>>,
        me: usize,
    ) -> Result<(), dlock_runtime::LockError> {
        order.lock().unwrap().push(me);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        Ok(())
    }

    let server = dlock_tests::RedisServer::start();
    let name = dlock_tests::unique_key("turns");
    let holder = server.locker();
    let held = holder
        .acquire(
            &format!("fair:{name}"),
            dlock_runtime::LockOptions::new().fair(),
        )
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for me in 0..4 {
        let (locker, key, order) = (server.locker(), name.clone(), order.clone());
        callers.push(tokio::spawn(async move {
            take_a_turn(&locker, &key, &order, me).await
        }));
        // Each caller takes its place in the queue before the next one arrives.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while server
            .command(&["LLEN", &dlock_tests::queue_of(&format!("fair:{name}"))])
            .ok()
            != Some(Value::Int(i64::try_from(me + 1).unwrap()))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "caller {me} never queued"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    held.release().await.unwrap();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}
