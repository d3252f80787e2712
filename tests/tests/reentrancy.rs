//! Task-scoped reentrancy through the attribute, against a real `redis-server`: a locked
//! function calling another locked function on the same key through the same `client` enters
//! at once (it would otherwise wait for itself until its timeout), the key stays held until the
//! outermost body ends, and any other task, even one spawned by the holder on the same `Locker`,
//! still waits.

use std::time::Duration;

use dlock_runtime::{LockError, Locker, dlock, fencing_token};
use dlock_tests::RedisServer;
use tokio::time::Instant;

const KEY: &str = "dlock:account:1";

/// Would deadlock against its caller without reentrancy: it waits up to 1s for a key the caller
/// holds until it returns.
#[dlock(key = "account:<id>", client = locker, timeout = "1s")]
async fn inner(locker: &Locker, id: u64) -> Result<Option<u64>, LockError> {
    Ok(fencing_token())
}

#[dlock(key = "account:<id>", client = locker, timeout = "1s")]
async fn middle(locker: &Locker, server: &RedisServer, id: u64) -> Result<(u64, bool), LockError> {
    let token = inner(locker, id).await?.expect("inside");
    Ok((token, server.exists(KEY)))
}

#[derive(Debug)]
struct Seen {
    outer: u64,
    inner: u64,
    middle: (u64, bool),
    held_after_inner: bool,
    waited: Duration,
}

#[dlock(key = "account:<id>", client = locker, timeout = "1s")]
async fn outer(locker: &Locker, server: &RedisServer, id: u64) -> Result<Seen, LockError> {
    let started = Instant::now();
    let inner = inner(locker, id).await?.expect("inside");
    let held_after_inner = server.exists(KEY);
    let middle = middle(locker, server, id).await?;
    Ok(Seen {
        outer: fencing_token().expect("inside"),
        inner,
        middle,
        held_after_inner,
        waited: started.elapsed(),
    })
}

#[tokio::test]
async fn nested_calls_on_the_same_key_enter_at_once() {
    let server = RedisServer::start();
    let locker = server.locker();
    let seen = outer(&locker, &server, 1).await.unwrap();
    assert_eq!(seen.inner, seen.outer, "one hold, one fencing token");
    assert_eq!(seen.middle.0, seen.outer);
    assert!(seen.held_after_inner, "the inner return did not release");
    assert!(seen.middle.1, "still held two levels down");
    assert!(
        seen.waited < Duration::from_millis(900),
        "no waiting for our own lock: {seen:?}"
    );
    assert!(!server.exists(KEY), "released when the outermost ends");
}

#[dlock(key = "account:<id>", client = locker, timeout = "200ms")]
async fn other(locker: &Locker, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// While the outer body holds the key, a task it spawns on the same `Locker`, and a task on
/// another connection, both time out.
#[dlock(key = "account:<id>", client = locker, timeout = "1s")]
async fn holder(
    locker: &Locker,
    server: &RedisServer,
    id: u64,
) -> Result<[Result<(), LockError>; 2], LockError> {
    let same_locker = {
        let locker = locker.clone();
        tokio::spawn(async move { other(&locker, id).await })
    };
    let other_locker = {
        let locker = server.locker();
        tokio::spawn(async move { other(&locker, id).await })
    };
    let results = [same_locker.await.unwrap(), other_locker.await.unwrap()];
    // And the nested call still enters.
    inner(locker, id).await?;
    Ok(results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tasks_still_wait() {
    let server = RedisServer::start();
    let locker = server.locker();
    for result in holder(&locker, &server, 1).await.unwrap() {
        assert!(
            matches!(result, Err(LockError::Timeout { .. })),
            "{result:?}"
        );
    }
    assert!(!server.exists(KEY));
    // Once released, the same calls get in.
    other(&locker, 1).await.unwrap();
    other(&server.locker(), 1).await.unwrap();
}

/// Same key text through another `Locker` is another client: no reentry, the nested call waits
/// and times out.
#[dlock(key = "account:<id>", client = locker, timeout = "1s")]
async fn through_another_locker(
    locker: &Locker,
    second: &Locker,
    id: u64,
) -> Result<Result<(), LockError>, LockError> {
    Ok(other(second, id).await)
}

#[tokio::test]
async fn reentry_is_per_client() {
    let server = RedisServer::start();
    let result = through_another_locker(&server.locker(), &server.locker(), 1)
        .await
        .unwrap();
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(!server.exists(KEY));
}
