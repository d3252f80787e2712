//! Regressions, each named after what broke (found in review), against a real redis-server.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::resp;
use dlock_tests::{RedisServer, acquire_and_release, unique_key};

/// A task that handed its guard to another task must not re-enter the lock the other task now
/// holds (re-entry used to be keyed by the task that acquired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_moved_to_another_task_does_not_let_the_old_task_reenter() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("moved");
    let dispatcher = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
            let worker = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                guard.release().await.unwrap();
            });
            let again = locker
                .acquire(&key, LockOptions::new().timeout(Duration::from_millis(200)))
                .await;
            worker.await.unwrap();
            again.map(drop)
        })
    };
    let again = dispatcher.await.unwrap();
    assert!(
        again.unwrap_err().is_timeout(),
        "the old task got a lock the worker held"
    );
}

#[dlock(key = "join:<name>", client = locker, timeout = "10s")]
async fn bump(
    locker: &Locker,
    name: &str,
    inside: &AtomicU32,
    most: &AtomicU32,
) -> Result<(), LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Two locked calls joined in one plain task exclude each other (they used to share the task's
/// hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_calls_in_one_task_exclude_each_other() {
    let server = RedisServer::start();
    let locker = server.locker();
    let name = unique_key("join");
    let (inside, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let task = {
        let (locker, name, inside, most) =
            (locker.clone(), name.clone(), inside.clone(), most.clone());
        tokio::spawn(async move {
            let (a, b) = tokio::join!(
                bump(&locker, &name, &inside, &most),
                bump(&locker, &name, &inside, &most)
            );
            a.and(b)
        })
    };
    task.await.unwrap().unwrap();
    assert_eq!(most.load(Ordering::SeqCst), 1, "both bodies ran at once");
}

/// A `release()` dropped before its reply used to leave the key held until its lease ran out.
#[tokio::test]
async fn a_release_dropped_mid_flight_still_releases() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("release-cancel");
    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    // Polled once, then dropped: the request may not even have been written.
    let _ = tokio::time::timeout(Duration::ZERO, guard.release()).await;
    assert!(
        server
            .gone_within(&format!("dlock:{key}"), Duration::from_secs(2))
            .await,
        "the key outlived a cancelled release"
    );
}

/// A guard dropped on a thread without a runtime used to release nothing.
#[tokio::test]
async fn a_guard_dropped_on_a_plain_thread_releases() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("thread-drop");
    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert!(
        server
            .gone_within(&format!("dlock:{key}"), Duration::from_secs(2))
            .await,
        "the key outlived a guard dropped off the runtime"
    );
}

/// A user key naming a fencing counter used to break every acquisition in its slot.
#[tokio::test]
async fn keys_that_name_dlocks_own_keys_are_refused() {
    let server = RedisServer::start();
    let locker = server.locker();
    for key in ["__fence:{0}", "__fence:x", "__fair:{dlock:order:1}:queue"] {
        let err = locker.acquire(key, LockOptions::new()).await.unwrap_err();
        assert!(err.is_invalid_key(), "{key}: {err:?}");
    }
    // A prefix with a hash tag (one slot for every lock) stays allowed.
    let tagged = Locker::builder()
        .redis_url(server.url())
        .key_prefix("{app}:")
        .build()
        .unwrap();
    acquire_and_release(&tagged, "order:1").await;
}

/// Huge durations used to panic (Instant overflow), in the caller or in the watchdog.
#[tokio::test]
async fn huge_durations_neither_panic_nor_stop_renewal() {
    let server = RedisServer::start();
    let key = unique_key("huge");
    let locker = Locker::builder()
        .redis_url(server.url())
        .expire(Duration::from_millis(300))
        .build()
        .unwrap();
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::MAX))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let err = locker
        .acquire(&key, LockOptions::new().expire(Duration::MAX))
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    // A ceiling on renewal of a lease that is not renewed is a mistake, not a no-op.
    let err = locker
        .acquire(&key, LockOptions::new().max_hold(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(
        err.is_config() && err.to_string().contains("max_hold"),
        "{err:?}"
    );
    let renewed = locker
        .acquire(
            &key,
            LockOptions::new().expire_auto().max_hold(Duration::MAX),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        renewed.is_held(),
        "renewal stopped (the watchdog panicked?)"
    );
    renewed.release().await.unwrap();
}

/// `extend` on a hold already counted lost used to answer `Ok`.
#[tokio::test]
async fn extend_after_loss_is_lost() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("extend-lost");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(100)))
        .await
        .unwrap();
    guard.lost().await;
    // The key may still be on the server for the margin; the client has given it up.
    let err = guard.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
}

/// The builder's `Debug` used to print the URL with its password.
#[test]
fn builder_debug_hides_the_password() {
    let builder = Locker::builder().redis_url("redis://app:S3CRET@cache:6379/0");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("S3CRET"), "{shown}");
    let builder = Locker::builder().redis_url("redis+unix:///tmp/r.sock?db=0&pass=S3CRET");
    assert!(!format!("{builder:?}").contains("S3CRET"));
    let locker = builder.build().unwrap();
    assert!(!format!("{locker:?}").contains("S3CRET"));
}

/// A key with a hash tag and a name like a fair queue's (`{user1}:cart:queue`) is an ordinary
/// lock: fair mode's queue of `{user1}:cart` lives in dlock's reserved namespace, so the two
/// never share a Redis key (they did: the queue was `dlock:{user1}:cart:queue`, a list, and the
/// lock failed with WRONGTYPE until its deadline).
#[tokio::test]
async fn a_lock_named_like_a_fair_queue_is_its_own_key() {
    let server = RedisServer::start();
    let locker = server.locker();
    let held = locker
        .acquire("{user1}:cart", LockOptions::new().fair())
        .await
        .unwrap();
    // A fair waiter queues behind the holder.
    let queued = {
        let locker = server.locker();
        tokio::spawn(async move {
            locker
                .acquire(
                    "{user1}:cart",
                    LockOptions::new().fair().timeout(Duration::from_secs(10)),
                )
                .await
                .map(drop)
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server
        .command(&["KEYS", "dlock:__fair:*dlock:{user1}:cart:queue"])
        .ok()
        .as_ref()
        .and_then(resp::items)
        .is_none_or(<[_]>::is_empty)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = locker
        .acquire(
            "{user1}:cart:queue",
            LockOptions::new().timeout(Duration::from_secs(1)),
        )
        .await;
    assert!(other.is_ok(), "{other:?}");
    other.unwrap().release().await.unwrap();
    held.release().await.unwrap();
    assert!(matches!(queued.await, Ok(Ok(()))));
}
