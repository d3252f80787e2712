//! Faults injected into a real `redis-server` and processes (a frozen holder on every engine is
//! in `processes.rs`): a killed and restarted
//! server, a stalled server, killed connections, cancellation at random points, panics and
//! runtime shutdown. Each test is bounded (well under 60s).

use std::time::Duration;

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::resp::Value;
use dlock_tests::{RedisServer, unique_key};
use redis::Commands as _;
use tokio::time::Instant;

fn locker_with(server: &RedisServer, expire: Duration) -> Locker {
    Locker::builder()
        .redis_url(server.url())
        .expire(expire)
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap()
}

/// A 1s lease renewed for 10s keeps a prober out; after release the key is gone and no renewal
/// is sent any more.
#[tokio::test]
async fn renewal_keeps_a_short_lease_for_long_then_stops() {
    let server = RedisServer::start();
    let holder = locker_with(&server, Duration::from_secs(1));
    let prober = server.locker();
    let key = unique_key("renewal");
    let guard = holder
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert!(
            prober
                .try_acquire(&key, Duration::from_secs(1))
                .await
                .unwrap()
                .is_none(),
            "the prober got in"
        );
        assert!(guard.is_held());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    guard.release().await.unwrap();
    let mut redis = server.client().get_connection().unwrap();
    assert!(!redis.exists::<_, bool>(format!("dlock:{key}")).unwrap());
    let after_release = server.calls("evalsha");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        server.calls("evalsha"),
        after_release,
        "renewal went on after release"
    );
}

/// `max_hold` stops renewal; the hold is then lost when the last lease runs out.
#[tokio::test]
async fn max_hold_ends_renewal() {
    let server = RedisServer::start();
    let locker = locker_with(&server, Duration::from_millis(600));
    let key = unique_key("maxhold");
    let guard = locker
        .acquire(
            &key,
            LockOptions::new()
                .expire_auto()
                .max_hold(Duration::from_millis(900)),
        )
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the hold ends");
    let held_for = started.elapsed();
    assert!(
        held_for >= Duration::from_millis(900),
        "lost before max_hold: {held_for:?}"
    );
    let next = server
        .locker()
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(next.is_ok(), "the key outlived max_hold: {next:?}");
}

/// The server dies and comes back empty while a renewed lease is held: the holder learns it
/// lost, never silently re-acquires, and the locker reconnects for new acquisitions.
#[tokio::test]
async fn server_restart_while_held_is_reported_as_loss() {
    let mut server = RedisServer::start();
    // A 6s lease renewed every 2s: the first renewal after the restart finds the key gone and
    // reports the loss then, long before the lease would run out on the client's clock.
    let locker = locker_with(&server, Duration::from_secs(6));
    let key = unique_key("restart");
    let guard = locker
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let restarted = Instant::now();
    server.restart();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder learns of the loss");
    let noticed = restarted.elapsed();
    assert!(
        noticed < Duration::from_millis(4500),
        "the loss was noticed only after {noticed:?}: renewal did not report the missing key"
    );
    assert!(!guard.is_held());
    let mut redis = server.client().get_connection().unwrap();
    assert!(
        !redis.exists::<_, bool>(format!("dlock:{key}")).unwrap(),
        "the key was re-acquired silently"
    );
    assert!(guard.release().await.unwrap_err().is_lost());
    let again = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(5)))
        .await;
    assert!(again.is_ok(), "the locker did not reconnect: {again:?}");
}

/// A frozen server: every call returns within its timeout, and at most one holder believes it
/// holds the lock.
#[tokio::test]
async fn stalled_server_never_gives_two_valid_holders() {
    let server = RedisServer::start();
    let (a, b) = (
        locker_with(&server, Duration::from_millis(800)),
        locker_with(&server, Duration::from_millis(800)),
    );
    let key = unique_key("stall");
    let held = a.acquire(&key, LockOptions::new()).await.unwrap();
    server.pause();
    let started = Instant::now();
    let attempt = b
        .acquire(&key, LockOptions::new().timeout(Duration::from_millis(500)))
        .await;
    assert!(attempt.is_err(), "a second holder during the stall");
    assert!(started.elapsed() < Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !held.is_held(),
        "the first holder still trusts a lease that has run out"
    );
    server.resume();
    let next = b
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(3)))
        .await
        .unwrap();
    assert!(next.is_held() && !held.is_held());
}

/// `CLIENT KILL` of the locker's connection during a renewed hold and during a wait: no false
/// loss while the key still holds our token, and the wait goes on and succeeds.
#[tokio::test]
async fn killed_connections_cause_no_false_loss() {
    let server = RedisServer::start();
    let holder = locker_with(&server, Duration::from_millis(900));
    let waiter = server.locker();
    let key = unique_key("clientkill");
    let guard = holder
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        })
    };
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let killed = server.command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(matches!(killed, Ok(Value::Int(_))), "{killed:?}");
        assert!(
            guard.is_held(),
            "a killed connection was taken for a lost lock"
        );
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        guard.is_held(),
        "renewal did not survive the killed connections"
    );
    assert!(
        !waiting.is_finished(),
        "the waiter got in while the lock was held"
    );
    guard.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        got.is_ok(),
        "the wait did not survive the killed connections: {got:?}"
    );
}

/// Acquisitions cancelled at random points leave nothing behind: after the holder releases, the
/// lock is free at once, replies stay in step, and no task is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_nothing_behind() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("cancel");
    // Warm up: the connection, and the notification task a first wait starts (both live as
    // long as the locker).
    let warm = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let waited = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_millis(50)))
        .await;
    assert!(waited.unwrap_err().is_timeout());
    warm.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    for trial in 0..60u64 {
        let holder = locker.acquire(&key, LockOptions::new()).await.unwrap();
        // Cancel a waiter after 0..3ms: before, during or after its first request.
        let cancel_after = Duration::from_micros((trial * 7919) % 3000);
        let waiting = locker.acquire(&key, LockOptions::new().timeout(Duration::from_secs(5)));
        assert!(tokio::time::timeout(cancel_after, waiting).await.is_err());
        // And one whose lock is free, cancelled while its request may be in flight.
        let free_key = format!("{key}:free:{trial}");
        let _ =
            tokio::time::timeout(cancel_after, locker.acquire(&free_key, LockOptions::new())).await;
        holder.release().await.unwrap();
        let next = locker
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            next.is_some(),
            "trial {trial}: the lock was not free after release"
        );
        next.unwrap().release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut redis = server.client().get_connection().unwrap();
    let left: Vec<String> = redis.keys(format!("dlock:{key}*")).unwrap();
    assert!(left.is_empty(), "locks left behind: {left:?}");
    assert!(
        metrics.num_alive_tasks() <= baseline,
        "tasks left: {} > {baseline}",
        metrics.num_alive_tasks()
    );
}

/// A panic in a locked body, and a runtime shut down while a renewed lock is held: no blocking,
/// no double panic, the lock is freed (by the lease when no runtime is left to release it).
#[test]
fn panic_and_runtime_shutdown_free_the_lock() {
    let server = RedisServer::start();
    let key = unique_key("shutdown");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let guard = runtime.block_on(async {
        let locker = locker_with(&server, Duration::from_millis(600));
        locker
            .acquire(&key, LockOptions::new().expire_auto())
            .await
            .unwrap()
    });
    let started = std::time::Instant::now();
    runtime.shutdown_timeout(Duration::from_secs(1));
    drop(guard); // no runtime: nothing to spawn onto, nothing blocks
    assert!(started.elapsed() < Duration::from_secs(2));

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let locker = server.locker();
        let started = Instant::now();
        let next = locker
            .acquire(&key, LockOptions::new().timeout(Duration::from_secs(3)))
            .await;
        assert!(next.is_ok(), "the lease did not free the key: {next:?}");
        assert!(started.elapsed() < Duration::from_secs(2));

        let panicking = {
            let locker = locker.clone();
            let key = format!("{key}:panic");
            tokio::spawn(async move {
                let _guard = locker
                    .acquire(&key, LockOptions::new().expire_auto())
                    .await
                    .unwrap();
                panic!("the body failed");
            })
        };
        assert!(panicking.await.unwrap_err().is_panic());
        let free = locker
            .acquire(
                &format!("{key}:panic"),
                LockOptions::new().timeout(Duration::from_secs(2)),
            )
            .await;
        assert!(free.is_ok(), "{free:?}");
    });
}
