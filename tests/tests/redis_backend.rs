//! Behaviour specific to the Redis backend, against a real `redis-server` per test.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker};
use dlock_tests::proxy::Proxy;
use dlock_tests::resp::{self, Value};
use dlock_tests::{RedisServer, acquire_and_release, free_port, unique_key};
use redis::Commands as _;
use tokio::time::Instant;

fn short_locker(server: &RedisServer, request_timeout: Duration) -> Locker {
    Locker::builder()
        .redis_url(server.url())
        .request_timeout(request_timeout)
        .build()
        .unwrap()
}

#[tokio::test]
async fn lock_key_is_prefix_plus_key_with_a_lease() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("order");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(7)))
        .await
        .unwrap();
    let mut redis = server.client().get_connection().unwrap();
    let value: String = redis.get(format!("dlock:{key}")).unwrap();
    let ttl: i64 = redis.pttl(format!("dlock:{key}")).unwrap();
    assert!(ttl > 6000 && ttl <= 7000, "ttl {ttl}");
    // The value is the acquisition's token (128 random bits in hex), then the holder's record
    // with the hold's fence.
    let (token, record) = value.split_once(' ').expect("a token and a record");
    assert_eq!(token.len(), 32, "{value}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(
        record.starts_with("owner=")
            && record.contains(&format!(" pid={} since=", std::process::id()))
            && record.ends_with(&format!(" fence={}", guard.fencing_token())),
        "{record}"
    );
    let fence_keys: Vec<String> = redis.keys("dlock:__fence:*").unwrap();
    assert_eq!(fence_keys.len(), 1, "{fence_keys:?}");
    let counter: u64 = redis.get(&fence_keys[0]).unwrap();
    assert_eq!(counter, guard.fencing_token());
    guard.release().await.unwrap();
    assert!(!redis.exists::<_, bool>(format!("dlock:{key}")).unwrap());
}

#[tokio::test]
async fn acquire_and_release_take_one_round_trip_each() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("trips");
    // Warm up: connect and load the scripts.
    acquire_and_release(&locker, &key).await;
    let before = server.calls("evalsha") + server.calls("eval");
    acquire_and_release(&locker, &key).await;
    assert_eq!(server.calls("evalsha") + server.calls("eval") - before, 2);
}

#[tokio::test]
async fn try_once_sends_exactly_one_attempt() {
    let server = RedisServer::start();
    let (a, b) = (server.locker(), server.locker());
    let key = unique_key("once");
    let _held = a.acquire(&key, LockOptions::new()).await.unwrap();
    acquire_and_release(&b, &unique_key("warm")).await;
    let before = server.calls("evalsha");
    assert!(
        b.try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(server.calls("evalsha") - before, 1);
}

#[tokio::test]
async fn ttl_recheck_gives_an_immortal_key_an_expiry() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("immortal");
    let mut redis = server.client().get_connection().unwrap();
    let () = redis
        .set(format!("dlock:{key}"), "left-by-a-crashed-writer")
        .unwrap();
    assert_eq!(redis.pttl::<_, i64>(format!("dlock:{key}")).unwrap(), -1);
    let err = locker
        .acquire(
            &key,
            LockOptions::new()
                .timeout(Duration::ZERO)
                .expire(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    let ttl: i64 = redis.pttl(format!("dlock:{key}")).unwrap();
    assert!(
        ttl > 0 && ttl <= 500,
        "the recheck did not set an expiry: {ttl}"
    );
    // And so the lock becomes available once that expiry passes.
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(3)))
        .await;
    assert!(guard.is_ok(), "{guard:?}");
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush_and_restart() {
    let mut server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("noscript");
    acquire_and_release(&locker, &key).await;
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).ok(), Some(Value::Okay));
    acquire_and_release(&locker, &key).await;
    server.restart();
    // The connection was cut and the script cache is empty: the locker reconnects and reloads.
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_server_is_a_backend_error_within_the_timeout() {
    let port = free_port();
    let locker = Locker::builder()
        .redis_url(format!("redis://127.0.0.1:{port}"))
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = locker
        .acquire(
            "nowhere",
            LockOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn stalled_server_is_a_backend_error_within_the_timeout() {
    let server = RedisServer::start();
    let locker = short_locker(&server, Duration::from_millis(100));
    acquire_and_release(&locker, &unique_key("warm")).await;
    server.pause();
    let started = Instant::now();
    let result = locker
        .acquire(
            &unique_key("stall"),
            LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await;
    let took = started.elapsed();
    server.resume();
    let err = result.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// The first attempt's reply is lost (the server is frozen past the request timeout) but the
/// command runs when the server resumes: the next attempt must recognise its own token.
#[tokio::test]
async fn attempt_with_lost_reply_recognises_its_own_lock() {
    let server = RedisServer::start();
    let locker = short_locker(&server, Duration::from_millis(100));
    let key = unique_key("ambiguous");
    acquire_and_release(&locker, &unique_key("warm")).await;
    server.pause();
    let waiting = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(
                    &key,
                    LockOptions::new()
                        .timeout(Duration::from_secs(4))
                        .expire(Duration::from_secs(30)),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume();
    let guard = waiting.await.unwrap();
    assert!(guard.is_ok(), "its own lock blocked it: {guard:?}");
    // Its fence is the highest issued, whichever attempt's reply it read.
    let mut redis = server.client().get_connection().unwrap();
    let counters: Vec<String> = redis.keys("dlock:__fence:*").unwrap();
    let issued: Vec<u64> = counters.iter().map(|k| redis.get(k).unwrap()).collect();
    assert!(
        issued.contains(&guard.unwrap().fencing_token()),
        "{issued:?}"
    );
}

/// An acquisition dropped while its request is in flight must not leave a lock behind.
#[tokio::test]
async fn dropped_in_flight_acquire_leaves_no_lock() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("inflight");
    acquire_and_release(&locker, &unique_key("warm")).await;
    server.pause();
    let attempt = locker.acquire(&key, LockOptions::new().expire(Duration::from_secs(30)));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), attempt)
            .await
            .is_err()
    );
    server.resume();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut redis = server.client().get_connection().unwrap();
    assert!(
        !redis.exists::<_, bool>(format!("dlock:{key}")).unwrap(),
        "an orphan lock was left by the dropped acquisition"
    );
}

#[tokio::test]
async fn fencing_counters_are_bounded_and_monotonic_over_a_restart() {
    let mut server = RedisServer::start();
    let locker = server.locker();
    let mut last = 0;
    for i in 0..200 {
        let guard = locker
            .acquire(&format!("{}:{i}", unique_key("many")), LockOptions::new())
            .await
            .unwrap();
        last = last.max(guard.fencing_token());
        guard.release().await.unwrap();
    }
    let mut redis = server.client().get_connection().unwrap();
    let keys: Vec<String> = redis.keys("*").unwrap();
    assert!(
        keys.iter().all(|k| k.starts_with("dlock:__fence:")),
        "left behind: {keys:?}"
    );
    assert!(keys.len() <= 200);
    // A restart without persistence loses the counters; fences still go up.
    server.restart();
    let guard = locker
        .acquire(
            "after-restart",
            LockOptions::new().timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert!(
        guard.fencing_token() > last,
        "{} <= {last}",
        guard.fencing_token()
    );
}

/// A fencing counter ahead of the client's clock (another client's clock ahead, or this one
/// stepped back): the fence is the counter plus one, and the lock's value records that fence,
/// not the clock's proposal (`inspect` reads it), on acquisition and on the retry of a lock
/// that is already ours.
#[tokio::test]
async fn a_counter_ahead_of_the_clock_is_the_fence_the_value_records() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("ahead");
    // One acquisition makes the key's slot counter; then it is set far ahead.
    locker
        .acquire(&key, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut redis = server.client().get_connection().unwrap();
    let counters: Vec<String> = redis.keys("dlock:__fence:*").unwrap();
    let ahead: u64 = 8_000_000_000_000_000;
    let () = redis.set(&counters[0], ahead).unwrap();
    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    assert_eq!(guard.fencing_token(), ahead + 1);
    let info = locker.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        info.fence,
        Some(ahead + 1),
        "the value records the fence handed out"
    );
    guard.release().await.unwrap();
    let (first, retried) =
        dlock_runtime::__private::attempt_twice(&locker, &key, Duration::from_secs(5))
            .await
            .unwrap();
    assert_eq!((first, retried.fencing_token()), (ahead + 2, ahead + 3));
    let info = locker.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(ahead + 3));
    retried.release().await.unwrap();
}

#[tokio::test]
async fn secrets_never_appear_in_errors() {
    let server = RedisServer::start();
    assert_eq!(
        server
            .command(&["CONFIG", "SET", "requirepass", "pw-right"])
            .ok(),
        Some(Value::Okay)
    );
    let locker = Locker::builder()
        .redis_url(format!(
            "redis://:hunter2-secret@127.0.0.1:{}",
            server.port()
        ))
        .request_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(!format!("{locker:?}").contains("hunter2"));
    let err = locker
        .acquire("k", LockOptions::new().timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    let mut texts = vec![err.to_string(), format!("{err:?}")];
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        texts.push(s.to_string());
        source = s.source();
    }
    for t in &texts {
        assert!(!t.contains("hunter2"), "password leaked: {t}");
    }

    // Tokens: the value stored in Redis never shows in an error or a guard's Debug.
    let locker = Locker::builder()
        .redis_url(format!("redis://:pw-right@127.0.0.1:{}", server.port()))
        .build()
        .unwrap();
    let key = unique_key("token");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(100)))
        .await
        .unwrap();
    let mut redis = redis::Client::open(format!("redis://:pw-right@127.0.0.1:{}", server.port()))
        .unwrap()
        .get_connection()
        .unwrap();
    let value: String = redis.get(format!("dlock:{key}")).unwrap();
    let token = value;
    assert!(!format!("{guard:?}").contains(&token));
    assert!(!format!("{locker:?}").contains("pw-right"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = guard.release().await.unwrap_err();
    assert!(!err.to_string().contains(&token) && !format!("{err:?}").contains(&token));
}

/// One locker used on several runtimes in turn (a global locker shared by `#[tokio::test]`s, each
/// with its own runtime): the connection that died with the previous runtime is replaced, so
/// the one attempt `try_acquire` makes on the next runtime works.
#[test]
fn a_locker_works_on_the_next_runtime_after_its_first_one_ended() {
    let server = RedisServer::start();
    let locker = server.locker();
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = runtime.block_on(async {
            match locker
                .try_acquire(&unique_key("runtimes"), Duration::from_secs(5))
                .await
            {
                Ok(Some(guard)) => guard.release().await.map(|()| true),
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            }
        });
        assert!(matches!(got, Ok(true)), "round {round}: {got:?}");
    }
}

/// `DLOCK_REDIS_WAIT` on one server: with no replica to acknowledge, every attempt is undone
/// and the wait ends in a `Backend` error saying how many acknowledged; with a replica, the
/// lock is granted and is on the replica when the acquisition returns.
#[tokio::test]
async fn replica_acknowledgement_on_a_single_server() {
    let server = RedisServer::start();
    let alone = Locker::builder()
        .redis_url(server.url())
        .redis_wait(1)
        .timeout(Duration::from_secs(2))
        // WAIT blocks this long on the server, and its reply gets as long again: 100ms left
        // too little room on a loaded 2-core CI machine ("WAIT got no reply").
        .request_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let key = unique_key("unacknowledged");
    let err = alone.acquire(&key, LockOptions::new()).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        err.to_string().contains("acknowledged by 0 of the 1"),
        "{err}"
    );
    assert!(
        !server.exists(&format!("dlock:{key}")),
        "an unacknowledged lock was left"
    );

    let port = server.port().to_string();
    // A full sync would otherwise wait 5s for more replicas to join it.
    let _ = server.command(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replica
        .command(&["INFO", "replication"])
        .ok()
        .as_ref()
        .and_then(resp::text)
        .is_some_and(|i| i.contains("master_link_status:up"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica did not sync"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let acknowledged = Locker::builder()
        .redis_url(server.url())
        .redis_wait(1)
        .build()
        .unwrap();
    let guard = acknowledged
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    assert!(replica.exists(&format!("dlock:{key}")));
    guard.release().await.unwrap();
}

/// A locker's settings through `proxy`, with a 2s request timeout.
fn through(proxy: &Proxy) -> dlock_runtime::LockerBuilder {
    Locker::builder()
        .redis_url(format!("redis://127.0.0.1:{}", proxy.port()))
        .request_timeout(Duration::from_secs(2))
}

/// The number of normal clients (not subscribers) the server closed with `CLIENT KILL`, as the
/// server's `timeout` or a proxy closes idle clients; the test's own connection is spared.
fn close_idle_clients(server: &RedisServer) -> i64 {
    match server.command(&["CLIENT", "KILL", "TYPE", "normal"]) {
        Ok(Value::Int(closed)) => closed,
        other => panic!("CLIENT KILL: {other:?}"),
    }
}

/// A connection the server closed while it was idle (its `timeout`, a proxy, a restart: redis-rs
/// learns of it only when a request fails on it) costs no request: a release, a `try_acquire`,
/// an extension, a listing (`SCAN`), a readiness `ping` and a pass made next are sent once more
/// on a new connection. Before, each failed with a broken pipe (the release left its key for
/// its 30s lease).
#[tokio::test]
async fn requests_on_a_connection_closed_while_idle_are_sent_again() {
    let server = RedisServer::start();
    // The waiter of the last step pauses 5s with its offer standing: the release falls within
    // it, and the waiter sends nothing meanwhile that would find the dropped connection first.
    let locker = Locker::builder()
        .redis_url(server.url())
        .retry(Duration::from_secs(5), Duration::from_secs(5))
        .build()
        .unwrap();
    let key = unique_key("idle");
    let lease = LockOptions::new().expire(Duration::from_secs(30));
    let guard = locker.acquire(&key, lease.clone()).await.unwrap();
    assert!(close_idle_clients(&server) >= 1);
    // Long enough for the client to read the close.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = guard.release().await;
    assert!(released.is_ok(), "release: {released:?}");
    assert!(!server.exists(&format!("dlock:{key}")), "the key stayed");

    assert!(close_idle_clients(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tried = locker.try_acquire(&key, Duration::from_secs(30)).await;
    let guard = match tried {
        Ok(Some(guard)) => guard,
        other => panic!("try_acquire: {other:?}"),
    };

    assert!(close_idle_clients(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let extended = guard.extend(Duration::from_secs(20)).await;
    assert!(extended.is_ok(), "extend: {extended:?}");

    assert!(close_idle_clients(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listed = locker.list(&key).await;
    assert!(
        listed.as_ref().is_ok_and(|locks| locks.len() == 1),
        "list: {listed:?}"
    );

    assert!(close_idle_clients(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pinged = locker.ping().await;
    assert!(pinged.is_ok(), "ping: {pinged:?}");

    // A waiter of the same locker takes the lock from the holder's release (a pass).
    let waiting = dlock_tests::spawn_waiter(&locker, &key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(close_idle_clients(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let passed = guard.release().await;
    assert!(passed.is_ok(), "a release that passes: {passed:?}");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap();
}

/// A pass whose reply was lost with its connection (the server ran it) is sent again, finds
/// the very value its first sending wrote and sets it again with a new fence: the holder's release is `Ok`
/// and the waiter holds the lock. Before, the pass sent again found the key no longer the
/// holder's and said so: the release said `Lost` for a lock it had handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_sent_again_after_a_lost_reply_hands_the_lock_over() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // A waiter pauses 5s with its offer standing: the release falls within it.
    let locker = through(&proxy)
        .timeout(Duration::from_secs(20))
        .expire(Duration::from_secs(30))
        .retry(Duration::from_secs(5), Duration::from_secs(5))
        .build()
        .unwrap();
    let hand_over = |key: String| {
        let locker = locker.clone();
        async move {
            let held = locker.acquire(&key, LockOptions::new()).await.unwrap();
            let waiting = dlock_tests::spawn_waiter(&locker, &key);
            // The waiter offers to take the lock.
            tokio::time::sleep(Duration::from_millis(300)).await;
            (held, waiting)
        }
    };
    // The pass script loaded.
    let (held, waiting) = hand_over(unique_key("warm")).await;
    held.release().await.unwrap();
    waiting.await.unwrap();

    let key = unique_key("resent-pass");
    let stored = format!("dlock:{key}");
    let (held, waiting) = hand_over(key.clone()).await;
    let holders_token =
        |value: Option<String>| value.map(|v| v.chars().take(32).collect::<String>());
    let mut redis = server.client().get_connection().unwrap();
    let holder = holders_token(redis.get(&stored).unwrap()).expect("held");
    // The pass names the holder's token; the waiter's attempts do not.
    proxy.cut_replies_on(holder.as_bytes());
    let releasing = tokio::spawn(held.release());
    let deadline = Instant::now() + Duration::from_secs(5);
    while holders_token(redis.get(&stored).unwrap()).as_ref() == Some(&holder)
        || !proxy.replies_cut()
    {
        assert!(Instant::now() < deadline, "the pass never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.reset();
    let released = releasing.await.unwrap();
    assert!(released.is_ok(), "the holder's release: {released:?}");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap();
}

/// A release sent again after its connection dropped that finds the hold gone cannot tell
/// whether its first sending deleted it or the hold was gone before: within the lease it says
/// so with a `Backend` error, never `Ok` nor `Lost`; after the lease ran out on the client's
/// clock, `Lost`. (1) The connection closed after the server ran the release (a proxy drops it
/// with the reply), for a mutex and a semaphore's permit, within the lease and after it; (2)
/// the server restarted without persistence under a 30s hold (no renewal in between): the key
/// was lost, and another client could have taken it, so the release must not say `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_that_finds_the_hold_gone_is_an_error() {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = through(&proxy).build().unwrap();
    let check = |released: Result<(), dlock_runtime::LockError>, lapsed: bool| match released {
        Err(e) if lapsed && e.is_lost() => {}
        Err(dlock_runtime::LockError::Backend(e))
            if !lapsed && e.to_string().contains("found the hold gone") => {}
        other => {
            panic!("a release sent again that found the hold gone (lapsed: {lapsed}): {other:?}")
        }
    };
    for case in dlock_tests::lost_reply_cases() {
        let (options, lapsed) = (case.0.clone(), case.2);
        // The release script loaded: its first sending is not answered NOSCRIPT.
        let warm = locker.acquire(&unique_key("warm"), options).await;
        warm.unwrap().release().await.unwrap();
        let key = unique_key("resent-release");
        let gone = || std::future::ready(!server.exists(&format!("dlock:{key}")));
        let released =
            dlock_tests::release_with_its_reply_lost(&locker, &proxy, &key, case, gone).await;
        check(released, lapsed);
    }
    let key = unique_key("restarted");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    server.restart();
    assert!(!server.exists(&format!("dlock:{key}")));
    check(guard.release().await, false);
}

/// What an unsettled release (sent again after its reply was lost, it found the hold gone) says:
/// a guard's `release` within the lease warns that it cannot tell whether it released, naming
/// the key and not the token; a dropped guard's release in the background takes it as done (its
/// first sending most likely deleted the key; nobody waits on the answer) and logs no failure.
#[test]
fn an_unsettled_release_warns_and_a_dropped_guards_takes_it_as_done() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let captured = dlock_tests::Captured::default();
    // A token is 32 hex digits; nothing else dlock logs here has such a run.
    let no_token = |text: &str| {
        let longest = text
            .split(|c: char| !c.is_ascii_hexdigit())
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert!(longest < 32, "a token was logged:\n{text}");
    };
    let gone = |key: &str| {
        let (server, key) = (&server, format!("dlock:{key}"));
        move || std::future::ready(!server.exists(&key))
    };
    captured.block_on(tracing::Level::DEBUG, async {
        let locker = through(&proxy).build().unwrap();
        acquire_and_release(&locker, &unique_key("warm")).await;

        // A release within the lease.
        let released = unique_key("unsettled-release");
        let within = dlock_tests::lost_reply_cases()[0].clone();
        let is_gone = gone(&released);
        let outcome =
            dlock_tests::release_with_its_reply_lost(&locker, &proxy, &released, within, is_gone)
                .await;
        let Err(LockError::Backend(error)) = &outcome else {
            panic!("an unsettled release within the lease: {outcome:?}");
        };
        assert!(error.to_string().contains("found the hold gone"), "{error}");
        let text = captured.text();
        let warning = text
            .lines()
            .find(|line| line.contains(" WARN ") && line.contains(&released))
            .unwrap_or_else(|| panic!("no warning naming {released}:\n{text}"));
        assert!(warning.contains("cannot be told"), "{warning}");
        no_token(&text);

        // A dropped guard's release in the background, its reply lost the same way.
        let dropped = unique_key("unsettled-drop");
        let guard = locker.acquire(&dropped, LockOptions::new()).await.unwrap();
        dlock_tests::lose_the_release_reply(&proxy, &dropped, gone(&dropped), || drop(guard)).await;
        captured
            .wait_for_line(
                Duration::from_secs(5),
                |line| line.contains(&dropped) && line.contains("the key was gone when sent again"),
                "the release after drop was not sent again, or not taken as done",
            )
            .await;
        let text = captured.text();
        assert!(
            !text.lines().any(|line| line.contains(&dropped)
                && (line.contains(" ERROR ") || line.contains(" WARN "))),
            "{text}"
        );
        no_token(&text);
    });
}

/// A waiter whose attempts fail fast backs off over errors in a row: here the server is made a
/// replica of nobody, so every acquisition answers `READONLY` at once (a master being demoted in
/// a failover answers so, a Cluster `CLUSTERDOWN` or `TRYAGAIN`, a server loading its data
/// `LOADING`). With the default `DLOCK_RETRY` (10–50ms) it asked every 10–50ms, 60–100 scripts
/// in 3s; doubling the pause after each failed attempt up to a hearing waiter's 250–500ms, about
/// 10. Once the server takes writes again the waiter gets the lock within the longest pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_backs_off_over_errors_in_a_row() {
    let server = RedisServer::start();
    let locker = server.locker();
    acquire_and_release(&locker, &unique_key("warm")).await;
    let nobody = free_port().to_string();
    server
        .command(&["REPLICAOF", "127.0.0.1", &nobody])
        .expect("REPLICAOF");
    let before = server.calls("evalsha");
    let waiting = dlock_tests::spawn_waiter(&locker, &unique_key("readonly"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let scripts = server.calls("evalsha") - before;
    server
        .command(&["REPLICAOF", "NO", "ONE"])
        .expect("REPLICAOF NO ONE");
    let writable = Instant::now();
    let after = dlock_tests::got_lock_since(writable, waiting).await;
    eprintln!("{scripts} scripts in 3s of errors; the lock {after:?} after the server took writes");
    assert!(
        scripts <= 25,
        "{scripts} scripts in 3s of errors: the waiter did not back off"
    );
    assert!(
        after < Duration::from_secs(2),
        "the lock {after:?} after the server took writes"
    );
}

/// A forced release is the one request not sent again on a connection found dropped: its first
/// sending may have freed the key before its reply was lost, and sent again it would free the
/// next holder's. After the server closed the idle connection it fails with a `Backend` error
/// and leaves the hold; asked again, it frees it.
#[tokio::test]
async fn a_forced_release_is_not_sent_again_on_a_dropped_connection() {
    let server = RedisServer::start();
    let holders = server.locker();
    let operator = server.locker();
    let key = unique_key("force-dropped");
    let guard = holders.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(operator.inspect(&key).await.unwrap().is_some());
    assert!(close_idle_clients(&server) >= 2);
    // Long enough for the clients to read the close.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let forced = operator.force_release(&key).await;
    assert!(
        forced.as_ref().is_err_and(LockError::is_backend),
        "a forced release on a dropped connection: {forced:?}"
    );
    assert!(server.exists(&format!("dlock:{key}")), "the hold went");
    let forced = operator.force_release(&key).await;
    assert!(
        forced.as_ref().is_ok_and(Option::is_some),
        "asked again: {forced:?}"
    );
    assert!(!server.exists(&format!("dlock:{key}")), "the hold stayed");
    // Its connection was closed too: its release, sent again, finds the hold gone and cannot
    // tell whether it released.
    assert!(guard.release().await.is_err());
}
