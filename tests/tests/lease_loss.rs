//! Losing the lease while the body runs, against a real `redis-server`: a fixed `expire` that
//! runs out aborts the body (`LockError::Lost`, through `on_fail` when given) unless
//! `on_lost = "continue"`; `expire = "auto"` keeps the lock for a long body, up to `max_hold`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::resp::Value;
use dlock_tests::{RedisServer, acquire_and_release, proxy::Proxy, unique_key};

/// Sleeps `for_ms`, then records that it got past the sleep.
async fn work(for_ms: u64, finished: &AtomicBool) {
    tokio::time::sleep(Duration::from_millis(for_ms)).await;
    finished.store(true, Ordering::SeqCst);
}

#[dlock(key = "fixed", client = locker, expire = "300ms")]
async fn fixed(locker: &Locker, finished: &AtomicBool) -> Result<(), LockError> {
    work(1000, finished).await;
    Ok(())
}

#[tokio::test]
async fn fixed_lease_running_out_aborts_the_body() {
    let server = RedisServer::start();
    let locker = server.locker();
    let finished = AtomicBool::new(false);
    let result = fixed(&locker, &finished).await;
    assert!(
        matches!(&result, Err(LockError::Lost { key, .. }) if key == "dlock:fixed"),
        "{result:?}"
    );
    // Nothing of the body is left running to finish later.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !finished.load(Ordering::SeqCst),
        "the code after the sleep never ran"
    );
    assert!(!server.exists("dlock:fixed"));
}

/// The key is set with the attribute's lease.
#[dlock(key = "ttl", client = locker, expire = "300ms")]
async fn ttl(locker: &Locker, server: &RedisServer) -> Result<i64, LockError> {
    match server.command(&["PTTL", "dlock:ttl"]) {
        Ok(Value::Int(ms)) => Ok(ms),
        other => panic!("PTTL: {other:?}"),
    }
}

#[tokio::test]
async fn fixed_lease_is_the_keys_ttl() {
    let server = RedisServer::start();
    let pttl = ttl(&server.locker(), &server).await.unwrap();
    assert!((1..=300).contains(&pttl), "PTTL {pttl}");
}

fn lost_or_not(error: LockError) -> &'static str {
    match error {
        LockError::Lost { .. } => "lost",
        _ => "other",
    }
}

#[dlock(key = "fixed:on-fail", client = locker, expire = "300ms", on_fail = lost_or_not)]
async fn fixed_on_fail(locker: &Locker, finished: &AtomicBool) -> &'static str {
    work(1000, finished).await;
    "done"
}

#[tokio::test]
async fn on_fail_receives_lost() {
    let server = RedisServer::start();
    let finished = AtomicBool::new(false);
    assert_eq!(fixed_on_fail(&server.locker(), &finished).await, "lost");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!finished.load(Ordering::SeqCst));
}

#[dlock(key = "fixed:continue", client = locker, expire = "300ms", on_lost = "continue")]
async fn fixed_continue(locker: &Locker, finished: &AtomicBool) -> Result<u8, LockError> {
    work(1000, finished).await;
    Ok(7)
}

#[tokio::test]
async fn on_lost_continue_lets_the_body_finish() {
    let server = RedisServer::start();
    let finished = AtomicBool::new(false);
    assert_eq!(
        fixed_continue(&server.locker(), &finished).await.unwrap(),
        7
    );
    assert!(finished.load(Ordering::SeqCst));
    assert!(!server.exists("dlock:fixed:continue"));
}

#[dlock(key = "renewed", client = locker, expire = "auto")]
async fn renewed(locker: &Locker, finished: &AtomicBool) -> Result<(), LockError> {
    work(2000, finished).await;
    Ok(())
}

/// A locker whose default lease, and so the renewed lease of `expire = "auto"`, is 600ms.
fn short_lease(server: &RedisServer) -> Locker {
    Locker::builder()
        .redis_url(server.url())
        .expire(Duration::from_millis(600))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_lease_is_renewed_for_a_long_body() {
    let server = RedisServer::start();
    let locker = short_lease(&server);
    let finished = Arc::new(AtomicBool::new(false));
    let body = {
        let (locker, finished) = (locker.clone(), finished.clone());
        tokio::spawn(async move { renewed(&locker, &finished).await })
    };
    // Another client keeps trying for the whole 2s body (more than three leases) and never gets in.
    let other = server.locker();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut attempts = 0;
    while !body.is_finished() {
        let got = other
            .try_acquire("renewed", Duration::from_secs(5))
            .await
            .unwrap();
        if got.is_some() {
            // Between the body's release and the task's end the lock is free: fine once the
            // body is over.
            assert!(
                finished.load(Ordering::SeqCst),
                "another client got in while the body ran"
            );
            break;
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    body.await.unwrap().unwrap();
    assert!(finished.load(Ordering::SeqCst));
    assert!(attempts >= 10, "probed throughout the body ({attempts})");
    assert!(!server.exists("dlock:renewed"));
}

#[dlock(key = "capped", client = locker, expire = "auto", max_hold = "700ms")]
async fn capped(locker: &Locker, finished: &AtomicBool) -> Result<(), LockError> {
    work(3000, finished).await;
    Ok(())
}

#[tokio::test]
async fn max_hold_ends_the_renewals() {
    let server = RedisServer::start();
    let locker = short_lease(&server);
    let finished = AtomicBool::new(false);
    let result = capped(&locker, &finished).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(!finished.load(Ordering::SeqCst));
    assert!(!server.exists("dlock:capped"));
}

/// Microseconds since the Unix epoch: comparable across processes on this machine.
fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// A body whose thread is blocked past its 1s lease (a synchronous call) and that then reaches
/// an `.await`. Records when each of its lines ran; `other` is started inside it and takes the
/// lock from another process as soon as the lease lets it.
#[dlock(key = "<key>", client = locker, expire = "1s")]
async fn starved(
    locker: &Locker,
    key: &str,
    server: &RedisServer,
    lines: &std::sync::Mutex<Vec<(&'static str, u128)>>,
    other: &std::sync::Mutex<Option<std::process::Child>>,
) -> Result<(), LockError> {
    lines.lock().unwrap().push(("start", unix_micros()));
    *other.lock().unwrap() = Some(
        std::process::Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
            .args([&server.url(), key, "10000", "take"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    tokio::task::yield_now().await;
    lines
        .lock()
        .unwrap()
        .push(("after the await", unix_micros()));
    Ok(())
}

/// Regression: the body was polled before the loss was looked at, so the code after the
/// `.await` ran while another process held the lock, and the call returned `Ok`.
#[tokio::test]
async fn a_body_starved_past_its_lease_never_runs_after_its_next_await() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = dlock_tests::unique_key("starved");
    acquire_and_release(&locker, &key).await;
    let lines = std::sync::Mutex::new(Vec::new());
    let other = std::sync::Mutex::new(None);
    let result = starved(&locker, &key, &server, &lines, &other).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");

    let child = other.lock().unwrap().take().unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the other process failed");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let taken: u128 = stdout
        .trim()
        .strip_prefix("acquired ")
        .unwrap_or_else(|| panic!("unexpected output {stdout:?}"))
        .parse()
        .unwrap();
    let lines = lines.into_inner().unwrap();
    let started = lines[0].1;
    assert!(
        taken >= started + 900_000,
        "the other process got in {}µs into a 1s lease",
        taken - started
    );
    for (line, at) in &lines[1..] {
        assert!(
            *at < taken,
            "`{line}` ran {}µs after another process took the lock",
            at - taken
        );
    }
    assert_eq!(lines.len(), 1, "no line after the await ran: {lines:?}");
}

/// Blocks past its 300ms lease and completes without ever yielding.
#[dlock(key = "<key>", client = locker, expire = "300ms")]
async fn completes_late(locker: &Locker, key: &str) -> Result<u8, LockError> {
    std::thread::sleep(Duration::from_millis(400));
    Ok(7)
}

#[tokio::test]
async fn a_body_that_completes_after_its_lease_ran_out_returns_lost() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = dlock_tests::unique_key("late");
    let result = completes_late(&locker, &key).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    // The memory backend keeps the same promise.
    let result = completes_late(&Locker::memory(), &key).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
}

#[dlock(key = "<key>", client = locker, expire = "1s", on_lost = "continue")]
async fn starved_continue(
    locker: &Locker,
    key: &str,
    finished: &AtomicBool,
) -> Result<u8, LockError> {
    std::thread::sleep(Duration::from_millis(1500));
    tokio::task::yield_now().await;
    finished.store(true, Ordering::SeqCst);
    Ok(7)
}

#[tokio::test]
async fn on_lost_continue_finishes_a_starved_body_and_returns_its_output() {
    let server = RedisServer::start();
    let finished = AtomicBool::new(false);
    let key = dlock_tests::unique_key("starved:continue");
    let result = starved_continue(&server.locker(), &key, &finished).await;
    assert_eq!(result.unwrap(), 7);
    assert!(finished.load(Ordering::SeqCst));
}

/// Deletes its own lock key (an operator's `DEL`, a failover that lost it) and completes well
/// within its lease.
#[dlock(key = "<key>", client = locker, expire = "10s")]
async fn key_deleted_underneath(
    locker: &Locker,
    key: &str,
    server: &RedisServer,
) -> Result<u8, LockError> {
    assert_eq!(
        server.command(&["DEL", &format!("dlock:{key}")]).ok(),
        Some(Value::Int(1))
    );
    Ok(7)
}

/// Regression: the `Lost` that the release reported was discarded and the call returned `Ok`.
#[tokio::test]
async fn a_release_that_finds_the_key_gone_makes_the_call_lost() {
    let server = RedisServer::start();
    let key = dlock_tests::unique_key("deleted");
    let result = key_deleted_underneath(&server.locker(), &key, &server).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
}

/// An `extend` to a shorter lease whose reply never comes: the server ran it, and the hold
/// counts itself lost by the time the server lets another client take the key (before, it kept
/// its old 30s end on the client's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortening_extend_whose_reply_is_lost_ends_the_hold_as_soon() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = Locker::builder()
        .redis_url(format!("redis://127.0.0.1:{}", proxy.port()))
        .expire(Duration::from_secs(30))
        .request_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let key = unique_key("shorten");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    // Once with its reply: the server has the extend script (a first `EVALSHA` would be
    // refused with NOSCRIPT, and its reply held back, the script never loaded).
    guard.extend(Duration::from_secs(30)).await.unwrap();
    proxy.cut_replies();
    let error = guard.extend(Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(error, LockError::Backend(_)), "{error:?}");
    // The request reached the server: the key ends a second after it ran.
    let other = server.locker();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let _taken = loop {
        if let Some(taken) = other
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
        {
            break taken;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never ended the shortened lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !guard.is_held(),
        "another client holds the key while this hold counts itself held"
    );
    proxy.heal();
}

/// A locker on `server` whose requests may wait for a paused server.
fn patient(server: &RedisServer) -> Locker {
    Locker::builder()
        .redis_url(server.url())
        .request_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The key's remaining time to live on the server, in milliseconds.
fn pttl(server: &RedisServer, key: &str) -> i64 {
    match server.command(&["PTTL", key]) {
        Ok(Value::Int(ms)) => ms,
        other => panic!("PTTL: {other:?}"),
    }
}

/// Loss is final: a hold whose lease ran out on the client's clock is not extended, though
/// the key is still there (the test keeps it on the server for a minute). Before, the extend
/// was sent, succeeded, and `is_held` turned `true` again after having said `false`.
#[tokio::test]
async fn an_extend_after_the_lease_ran_out_on_the_clients_clock_sends_nothing() {
    let server = RedisServer::start();
    let locker = patient(&server);
    let key = unique_key("lapsed-extend");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(1)))
        .await
        .unwrap();
    let full = guard.key().to_owned();
    assert_eq!(
        server.command(&["PEXPIRE", &full, "60000"]).unwrap(),
        Value::Int(1),
        "the key is kept before its lease ends"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!guard.is_held(), "the lease ran out on the client's clock");
    let error = guard.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error:?}");
    assert!(!guard.is_held(), "a lost hold was made held again");
    let left = pttl(&server, &full);
    assert!(left > 30_000, "the extend was sent: PTTL {left}ms");
}

/// Loss is final: an extension the server ran, answered after the hold's lease ran out on the
/// client's clock, leaves the hold lost. The server is paused for writes (3s) through the
/// hold's end (a 1.5s lease; its key kept there for a minute); the extend waits for it, then
/// succeeds on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_answered_after_the_lease_ran_out_leaves_the_hold_lost() {
    let server = RedisServer::start();
    let locker = patient(&server);
    let key = unique_key("late-extend");
    let guard = locker
        .acquire(
            &key,
            LockOptions::new().expire(Duration::from_millis(1_500)),
        )
        .await
        .unwrap();
    let full = guard.key().to_owned();
    // Once answered at once: the server has the extend script before the pause.
    guard.extend(Duration::from_millis(1_500)).await.unwrap();
    server.command(&["PEXPIRE", &full, "60000"]).unwrap();
    server
        .command(&["CLIENT", "PAUSE", "3000", "WRITE"])
        .unwrap();
    assert!(guard.is_held(), "held when the late extend is sent");
    let error = guard.extend(Duration::from_secs(20)).await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error:?}");
    let left = pttl(&server, &full);
    assert!(
        (1..=20_000).contains(&left),
        "the server did not run the late extend: PTTL {left}ms"
    );
    assert!(!guard.is_held(), "a late extension made a lost hold held");
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() tells the loss");
}
