//! Waiting done right: release notifications wake waiters at once, and fair mode serves waiters
//! first come, first served across processes. Against real `redis-server`s (and the memory
//! backend where it applies).

use std::{
    process::{Child, Command},
    time::Duration,
};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::resp::Value;
use dlock_tests::{RedisServer, spawn_waiter, unique_key};
use redis::Commands as _;
use tokio::time::Instant;

/// A locker whose polling pause is long, so a quick wake-up can only come from a notification.
fn slow_poller(url: Option<&str>, notify: bool) -> Locker {
    let builder = Locker::builder()
        .retry(Duration::from_secs(3), Duration::from_secs(3))
        .notify(notify);
    match url {
        Some(url) => builder.redis_url(url).build().unwrap(),
        None => builder.memory().build().unwrap(),
    }
}

/// How long a waiter took to get the lock after the holder released it.
async fn wake_up_time(holder: &Locker, waiter: &Locker, key: &str) -> Duration {
    let held = holder.acquire(key, LockOptions::new()).await.unwrap();
    let waiting = spawn_waiter(waiter, key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    waiting.await.unwrap() - released_at
}

#[tokio::test]
async fn a_release_wakes_a_redis_waiter_at_once() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), slow_poller(Some(&server.url()), true));
    let woke = wake_up_time(&holder, &waiter, &unique_key("notify")).await;
    assert!(
        woke < Duration::from_secs(1),
        "woken after {woke:?}: the 3s poll, not a notification"
    );
}

/// A release is heard by the waiting process it names, not by every waiting process: a
/// process's waiters of a key listen on the channel of their place in the key's queue (the
/// queue's name, `:`, 8 hex digits), which no other process subscribes to, and nobody listens
/// on the key's own channel. Four processes (lockers, each with its own pub/sub connection)
/// wait while a fifth holds; each then gets the lock from a wake-up (the poll is 3s), in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_heard_by_the_process_it_names_alone() {
    let server = RedisServer::start();
    let key = unique_key("addressed");
    let holder = server.locker();
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let waiters: Vec<Locker> = (0..4)
        .map(|_| slow_poller(Some(&server.url()), true))
        .collect();
    let tasks: Vec<_> = waiters.iter().map(|w| spawn_waiter(w, &key)).collect();
    let mut redis = server.client().get_connection().unwrap();
    let queue = dlock_tests::queue_of(&key);
    let deadline = Instant::now() + Duration::from_secs(5);
    let channels = loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("dlock:*")
            .query(&mut redis)
            .unwrap();
        let queued: usize = redis.llen(&queue).unwrap();
        if (channels.len() >= 4 && queued == 4) || Instant::now() > deadline {
            break channels;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !channels.contains(&format!("dlock:{key}")),
        "waiters listen on the key's own channel: every release reaches every waiting process"
    );
    assert_eq!(
        channels.len(),
        4,
        "one channel per waiting process: {channels:?}"
    );
    for channel in &channels {
        assert!(
            channel.starts_with(&format!("{queue}:")) && channel.len() == queue.len() + 9,
            "not a place's channel: {channel}"
        );
        let listeners = dlock_tests::subscribers(&mut redis, channel);
        assert_eq!(listeners, 1, "{channel} is heard by {listeners} processes");
    }
    let released_at = Instant::now();
    held.release().await.unwrap();
    dlock_tests::woken_in_turn(tasks, released_at).await;
}

/// A forced release wakes the waiting process first in line on its place's channel, as a
/// release does: with a 3s poll, the waiter gets the lock well within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_wakes_the_waiter_first_in_line() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), slow_poller(Some(&server.url()), true));
    let key = unique_key("forced");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = spawn_waiter(&waiter, &key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forced_at = Instant::now();
    assert!(holder.force_release(&key).await.unwrap().is_some());
    let woke = waiting.await.unwrap() - forced_at;
    assert!(
        woke < Duration::from_secs(1),
        "woken {woke:?} after the forced release: the 3s poll, not a wake-up"
    );
    drop(held);
}

/// A place that leaves the queue (its process gave up waiting) wakes the place then first, on
/// that one's channel: in fair mode only the first in line may take a free key, so without the
/// wake-up the next process would sleep out its 5s poll. The key is freed by hand (a `DEL`
/// publishes nothing), then the first waiter gives up; the second gets the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_that_leaves_wakes_the_next_in_line() {
    let server = RedisServer::start();
    let key = unique_key("left");
    let holder = server.locker();
    let held = holder
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let slow = || {
        Locker::builder()
            .redis_url(server.url())
            .retry(Duration::from_secs(5), Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let (first, second) = (slow(), slow());
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(20));
    let giving_up = tokio::spawn({
        let (first, key, fair) = (first.clone(), key.clone(), fair.clone());
        async move { first.acquire(&key, fair).await }
    });
    let mut redis = server.client().get_connection().unwrap();
    wait_for_queue(&mut redis, &key, 1).await;
    let waiting = tokio::spawn({
        let (second, key) = (second.clone(), key.clone());
        async move {
            let guard = second.acquire(&key, fair).await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    wait_for_queue(&mut redis, &key, 2).await;
    let _: i64 = redis.del(format!("dlock:{key}")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left_at = Instant::now();
    giving_up.abort();
    let got = waiting.await.unwrap() - left_at;
    assert!(
        got < Duration::from_secs(2),
        "the next in line got the lock {got:?} after the first left: its 5s poll, not a wake-up"
    );
    drop(held);
}

#[tokio::test]
async fn without_notifications_the_waiter_polls() {
    // The control for the test above: the same setup with DLOCK_NOTIFY=off waits for its poll.
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), slow_poller(Some(&server.url()), false));
    let woke = wake_up_time(&holder, &waiter, &unique_key("polling")).await;
    assert!(
        woke >= Duration::from_secs(1),
        "woken after {woke:?} with notifications off"
    );
}

#[tokio::test]
async fn a_release_wakes_a_memory_waiter_at_once() {
    let locker = slow_poller(None, true);
    let woke = wake_up_time(&locker, &locker, &unique_key("notify-memory")).await;
    assert!(woke < Duration::from_secs(1), "woken after {woke:?}");
}

/// A Redis release announces only while a place waits in the key's queue (on RedLock, the
/// releasing client wakes the place first in the first master's queue after its round):
/// waiters asleep in line are still woken by every release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_releases_keep_waking_the_line() {
    let server = RedisServer::start();
    dlock_tests::releases_keep_waking_the_line(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_releases_keep_waking_the_line() {
    let masters = dlock_tests::redlock::RedLockServers::start();
    dlock_tests::releases_keep_waking_the_line(&masters.url()).await;
}

/// The pub/sub connection is killed: waiting degrades to polling, and notifications come back.
#[tokio::test]
async fn lost_subscription_degrades_and_recovers() {
    let server = RedisServer::start();
    let holder = server.locker();
    let waiter = slow_poller(Some(&server.url()), true);
    let key = unique_key("resubscribe");
    let woke = wake_up_time(&holder, &waiter, &key).await;
    assert!(woke < Duration::from_secs(1), "first wake-up took {woke:?}");

    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
                .await
                .map(drop)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]).ok();
    assert_eq!(
        killed,
        Some(Value::Int(1)),
        "expected one pub/sub connection"
    );
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert!(
        matches!(got, Ok(Ok(Ok(())))),
        "the waiter did not get the lock by polling: {got:?}"
    );

    // Recovered: a later wait is woken by a notification again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woke = wake_up_time(&holder, &waiter, &key).await;
    assert!(
        woke < Duration::from_secs(1),
        "notifications did not come back: {woke:?}"
    );
}

fn subscribers(server: &RedisServer, channel: &str) -> usize {
    dlock_tests::subscribers(&mut server.client().get_connection().unwrap(), channel)
}

/// After its last waiter leaves, a process's channel for a key (its place's) stays subscribed
/// for a moment (a contended key is likely contended again), then it is unsubscribed.
#[tokio::test]
async fn a_channel_lingers_after_its_last_waiter_then_goes() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), slow_poller(Some(&server.url()), true));
    let key = unique_key("linger");
    let woke = wake_up_time(&holder, &waiter, &key).await;
    assert!(woke < Duration::from_secs(1), "woken after {woke:?}");
    // The waiting process's channel: its place's in the key's queue.
    let mut redis = server.client().get_connection().unwrap();
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{}:*", dlock_tests::queue_of(&key)))
        .query(&mut redis)
        .unwrap();
    let [channel] = channels.as_slice() else {
        panic!("expected the waiter's one channel, found {channels:?}");
    };
    assert_eq!(subscribers(&server, channel), 1, "unsubscribed at once");
    let deadline = Instant::now() + Duration::from_secs(10);
    while subscribers(&server, channel) != 0 {
        assert!(
            Instant::now() < deadline,
            "still subscribed 10s after the last waiter"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A waiter that finds its process's channel for the key still subscribed (a new wait has a new
/// place, with the locker's first 8 hex digits: the same channel) arms from it: no SUBSCRIBE, and after
/// the refusal only the attempt that puts its place in the key's queue (so that the release
/// names it, and covering a release before the wake-up was armed), until the release wakes it.
#[tokio::test]
async fn a_lingering_subscription_covers_the_next_waiter() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), slow_poller(Some(&server.url()), true));
    let key = unique_key("covered");
    wake_up_time(&holder, &waiter, &key).await;
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let (subscribes, attempts) = (server.calls("subscribe"), server.calls("evalsha"));
    let waiting = spawn_waiter(&waiter, &key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.calls("subscribe") - subscribes,
        0,
        "subscribed again"
    );
    assert_eq!(server.calls("evalsha") - attempts, 2, "attempts while held");
    let released_at = Instant::now();
    held.release().await.unwrap();
    let woke = waiting.await.unwrap() - released_at;
    assert!(woke < Duration::from_secs(1), "woken after {woke:?}");
}

/// A waiter refused while its place in the key's queue is fresh asks by reading the lock alone:
/// one that tries every 10-20ms for 2s (without the wake-up, whose waiters ask every 250-500ms)
/// refreshes its place (a ZADD) only about every quarter of its liveness, not at every attempt,
/// and the place stays live throughout, for its liveness without notifications.
#[tokio::test]
async fn a_waiter_refreshes_its_place_not_at_every_attempt() {
    let server = RedisServer::start();
    let holder = server.locker();
    // Liveness (notifications off): 4 × 20ms + 4 × 300ms = 1.28s; refreshed when older than
    // 320ms.
    let waiter = Locker::builder()
        .redis_url(server.url())
        .retry(Duration::from_millis(10), Duration::from_millis(20))
        .request_timeout(Duration::from_millis(300))
        .notify(false)
        .build()
        .unwrap();
    let key = unique_key("light");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let (zadds, attempts) = (server.calls("zadd"), server.calls("evalsha"));
    let waiting = spawn_waiter(&waiter, &key);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (zadds, attempts) = (
        server.calls("zadd") - zadds,
        server.calls("evalsha") - attempts,
    );
    assert!(attempts >= 20, "the waiter tried {attempts} times in 2s");
    assert!(
        zadds >= 1 && zadds * 3 <= attempts,
        "{zadds} place refreshes for {attempts} attempts"
    );
    let mut redis = server.client().get_connection().unwrap();
    let places: Vec<(String, f64)> = redis
        .zrange_withscores(format!("dlock:__fair:{{dlock:{key}}}:waiters"), 0, -1)
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis).unwrap();
    #[allow(clippy::cast_precision_loss)]
    let now_ms = (secs * 1000 + micros / 1000) as f64;
    assert!(
        places.len() == 1 && places[0].1 > now_ms,
        "the waiter's place is live: {places:?} at {now_ms}"
    );
    // With notifications off the place lives its 1.28s, not the 3.2s of a waiter that could
    // pause 500ms.
    assert!(
        places[0].1 <= now_ms + 1300.0,
        "the place lives past its liveness: {places:?} at {now_ms}"
    );
    let released_at = Instant::now();
    held.release().await.unwrap();
    let woke = waiting.await.unwrap() - released_at;
    assert!(woke < Duration::from_secs(1), "woken after {woke:?}");
}

fn fair_waiter(server: &RedisServer, key: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
        .args([&server.url(), key, name, "fair-waiter"])
        .spawn()
        .unwrap()
}

fn queue_len(redis: &mut redis::Connection, key: &str) -> usize {
    redis.llen(dlock_tests::queue_of(key)).unwrap()
}

async fn wait_for_queue(redis: &mut redis::Connection, key: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue_len(redis, key) != len {
        assert!(Instant::now() < deadline, "the queue never reached {len}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Five processes queue one after another behind a holder; they get the lock in that order.
#[tokio::test]
async fn fair_mode_serves_processes_in_arrival_order() {
    let server = RedisServer::start();
    let mut redis = server.client().get_connection().unwrap();
    let key = unique_key("fair");
    let holder = server.locker();
    let held = holder
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let mut children = Vec::new();
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        children.push(fair_waiter(&server, &key, name));
        wait_for_queue(&mut redis, &key, i + 1).await;
    }
    held.release().await.unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let order: Vec<String> = redis.lrange(format!("{key}:order"), 0, -1).unwrap();
    assert_eq!(order, ["a", "b", "c", "d", "e"]);
    let left: Vec<String> = redis.keys("*{dlock:*").unwrap();
    assert!(left.is_empty(), "the queue outlived its waiters: {left:?}");
}

/// A waiter that times out, one that is cancelled and one whose process is killed do not block
/// the waiters behind them.
#[tokio::test]
async fn fair_waiters_that_leave_do_not_block_the_queue() {
    let server = RedisServer::start();
    let mut redis = server.client().get_connection().unwrap();
    let key = unique_key("fair-leave");
    let locker = server.locker();
    let held = locker
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();

    // 1. Times out while queued.
    let impatient = {
        let (locker, key) = (server.locker(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(
                    &key,
                    LockOptions::new()
                        .fair()
                        .timeout(Duration::from_millis(400)),
                )
                .await
        })
    };
    wait_for_queue(&mut redis, &key, 1).await;
    // 2. Cancelled while queued.
    let cancelled = {
        let (locker, key) = (server.locker(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(
                    &key,
                    LockOptions::new().fair().timeout(Duration::from_secs(30)),
                )
                .await
        })
    };
    wait_for_queue(&mut redis, &key, 2).await;
    // 3. A process killed while queued.
    let mut killed = fair_waiter(&server, &key, "killed");
    wait_for_queue(&mut redis, &key, 3).await;
    killed.kill().unwrap();
    killed.wait().unwrap();
    // 4. The patient one, last in line.
    let patient = fair_waiter(&server, &key, "patient");
    wait_for_queue(&mut redis, &key, 4).await;

    assert!(impatient.await.unwrap().unwrap_err().is_timeout());
    cancelled.abort();
    let _ = cancelled.await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while queue_len(&mut redis, &key) > 2 {
        assert!(
            Instant::now() < deadline,
            "the cancelled and timed-out waiters kept their places"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let started = Instant::now();
    let mut patient = patient;
    assert!(patient.wait().unwrap().success());
    // The killed waiter's place lapses after its liveness (4 × 500ms, the longest pause of a
    // waiter with the wake-up, + 4 × the 500ms request timeout = 4s since its last attempt).
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the queue was blocked for {:?}",
        started.elapsed()
    );
    let order: Vec<String> = redis.lrange(format!("{key}:order"), 0, -1).unwrap();
    assert_eq!(order, ["patient"]);
}

/// Fair mode on the memory backend: tasks are served in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_tasks_in_arrival_order_in_memory() {
    let locker = Locker::memory();
    let key = unique_key("fair-memory");
    let held = locker
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (locker, key, order) = (locker.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locker
                .acquire(
                    &key,
                    LockOptions::new().fair().timeout(Duration::from_secs(20)),
                )
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.release().await.unwrap();
        }));
        // Let it take its place in line before the next one arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    held.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

/// A release message names the next fair waiter by a token prefix, never by the whole token
/// (the token is what release and extend check): anyone subscribed could otherwise steal it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_release_messages_never_carry_a_whole_token() {
    let server = RedisServer::start();
    let key = unique_key("fair-messages");
    let channel = format!("dlock:{key}");
    let listener = {
        let client = server.client();
        let (ready, subscribed) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut connection = client.get_connection().unwrap();
            let mut pubsub = connection.as_pubsub();
            // Every channel of the test's server: the key's, and its places' (`…:queue:<8 hex>`).
            pubsub.psubscribe("dlock:*").unwrap();
            pubsub
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            ready.send(()).unwrap();
            let mut payloads = Vec::new();
            // Until the test's own end mark (or 5s of silence).
            while let Ok(message) = pubsub.get_message() {
                let payload = message.get_payload::<String>().unwrap();
                if payload == "end" {
                    break;
                }
                payloads.push((message.get_channel_name().to_owned(), payload));
            }
            payloads
        });
        subscribed.recv().unwrap();
        thread
    };
    let holder = server.locker();
    let held = holder
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let mut redis = server.client().get_connection().unwrap();
    let mut waiters = Vec::new();
    for i in 0..2 {
        let (locker, name) = (server.locker(), key.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker
                .acquire(
                    &name,
                    LockOptions::new().fair().timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap();
            guard.release().await.unwrap();
        }));
        wait_for_queue(&mut redis, &key, i + 1).await;
    }
    let tokens: Vec<String> = redis
        .lrange(format!("dlock:__fair:{{{channel}}}:queue"), 0, -1)
        .unwrap();
    assert_eq!(tokens.len(), 2);
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let _: i64 = redis.publish(&channel, "end").unwrap();
    let payloads = tokio::task::spawn_blocking(move || listener.join().unwrap())
        .await
        .unwrap();
    // The first two releases name the waiter next in line, on that waiter's place's channel;
    // the last, with nobody in line, announces nothing.
    let queue = format!("dlock:__fair:{{{channel}}}:queue");
    let expected: Vec<(String, String)> = tokens
        .iter()
        .map(|t| (format!("{queue}:{}", &t[..8]), t[..8].to_owned()))
        .collect();
    assert_eq!(
        payloads, expected,
        "one message per release a waiter waited for"
    );
}

/// A locker that outlives the runtime its notification task ran on (a shared locker across
/// `#[tokio::test]`s, say) starts the task again on the next runtime.
#[test]
fn notifications_survive_the_end_of_the_runtime_they_started_on() {
    let server = RedisServer::start();
    let waiter = slow_poller(Some(&server.url()), true);
    for round in 0..2 {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let woke = runtime.block_on(async {
            dlock_tests::acquire_and_release(&waiter, &unique_key("warm")).await;
            let holder = server.locker();
            wake_up_time(&holder, &waiter, &unique_key("runtimes")).await
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
        assert!(
            woke < Duration::from_secs(1),
            "round {round}: woken after {woke:?}, by the 3s poll rather than a notification"
        );
    }
}

/// A fair single attempt (`timeout` zero) asks from a place in line too: with another process's
/// place first in the queue it does not take the free lock, and it takes its own place out of
/// the queue again. A non-fair attempt may pass the queue.
#[tokio::test]
async fn a_fair_single_attempt_does_not_pass_the_queue() {
    let server = RedisServer::start();
    let locker = server.locker();
    let key = unique_key("fair-try");
    let mut redis = server.client().get_connection().unwrap();
    // Another process's place, alive for 10s by the server's clock, first in line.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis).unwrap();
    let other = "f".repeat(32);
    let () = redis.rpush(dlock_tests::queue_of(&key), &other).unwrap();
    let () = redis
        .zadd(
            format!("dlock:__fair:{{dlock:{key}}}:waiters"),
            &other,
            secs * 1000 + micros / 1000 + 10_000,
        )
        .unwrap();
    let tried = locker
        .acquire(&key, LockOptions::new().fair().timeout(Duration::ZERO))
        .await;
    assert!(
        matches!(tried, Err(dlock_runtime::LockError::Timeout { .. })),
        "{tried:?}"
    );
    assert!(!server.exists(&format!("dlock:{key}")), "took the lock");
    wait_for_queue(&mut redis, &key, 1).await;
    let passed = locker
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(passed.is_some(), "a non-fair attempt waits for the queue");
}

/// Fair mode serves processes in turn, each process's waiters in their order: p1 and p2 of one
/// locker and q1 of another (two lockers on one embedded table stand for two processes), arriving
/// in that order behind a holder, get the lock as p1, q1, p2.
#[tokio::test]
async fn fair_mode_serves_processes_in_turn() {
    let p = Locker::builder().url("memory://").build().unwrap();
    let q = Locker::builder().url("memory://").build().unwrap();
    let key = unique_key("turns");
    let holder = p.acquire(&key, LockOptions::new().fair()).await.unwrap();
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (name, locker) in [("p1", &p), ("p2", &p), ("q1", &q)] {
        let (locker, key, served) = (locker.clone(), key.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker
                .acquire(
                    &key,
                    LockOptions::new().fair().timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap();
            served.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        // Each waits (in its line, its process's place in the queue) before the next comes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), ["p1", "q1", "p2"]);
}

/// A waiter with the release wake-up asks the server a few times a second while the lock is
/// held (every 250-500ms), not at `DLOCK_RETRY`'s 10-50ms: what a waiting process costs the
/// server per acquisition no longer grows with the hold. One waiter of default settings behind
/// a hold: at most 12 attempts in 2s (4-8 expected; 40-200 at 10-50ms), and the release still
/// wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_the_wake_up_asks_a_few_times_a_second() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.locker(), server.locker());
    let key = unique_key("few");
    let mut redis = server.client().get_connection().unwrap();
    dlock_tests::asks_a_few_times_a_second(
        (&holder, &waiter),
        &key,
        wait_for_queue(&mut redis, &key, 1),
        || std::future::ready(server.calls("evalsha")),
        (0, "attempts"),
    )
    .await;
}

/// A waiting process first in line that is gone (frozen here) keeps its place until the place
/// lapses (4s after its last attempt with these settings), and releases name it meanwhile: a
/// waiter behind it is not woken, and gets the lock at its next fallback pause (250-500ms),
/// not when the place lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_gone_place_gets_the_lock_at_its_pause() {
    let server = RedisServer::start();
    let holder = server.locker();
    let key = unique_key("gone-first");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let mut redis = server.client().get_connection().unwrap();
    let mut first = Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
        .args([&server.url(), &key, "60000", "take"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_queue(&mut redis, &key, 1).await;
    dlock_tests::signal(&first, "-STOP");
    let waiter = server.locker();
    let waiting = spawn_waiter(&waiter, &key);
    wait_for_queue(&mut redis, &key, 2).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let got = waiting.await.unwrap() - released_at;
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        got < Duration::from_millis(1500),
        "the waiter behind a gone place got the lock {got:?} after the release"
    );
}
