//! Redis behind Sentinel (`redis+sentinel://`), with real failovers: a master, two replicas and
//! three `redis-sentinel` processes per test. The client follows a forced and a killed failover;
//! with `DLOCK_REDIS_WAIT` a lock survives the loss of its master; without it, a failover that
//! loses the lock's write lets a second holder in — the documented limitation — and the fencing
//! token still lets the resource refuse the first holder.

use std::time::{Duration, Instant};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::resp::{self, Value};
use dlock_tests::{
    acquire_and_release,
    engines::{
        Engine, acl_rule_without, error_within_the_wait, extend_once_reachable, failover_locker,
        hand_offs_logged, taken_over_and_fenced,
    },
    sentinel::RedisSentinels,
    unique_key,
};

fn locker(sentinels: &RedisSentinels, replicas: u32) -> Locker {
    failover_locker(&sentinels.url(), replicas)
}

fn exists(sentinels: &RedisSentinels, port: u16, key: &str) -> bool {
    matches!(sentinels.command(port, &["EXISTS", key]), Ok(Value::Int(1)))
}

/// Waits until the server on `port` reports itself a replica (the sentinels demoted it).
async fn demoted(sentinels: &RedisSentinels, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if sentinels
            .command(port, &["ROLE"])
            .ok()
            .as_ref()
            .and_then(resp::items)
            .and_then(|role| resp::text(role.first()?))
            .is_some_and(|role| role == "slave")
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A user created on the master and the replicas with exactly docs/redis.md's ACL rule (the
/// page says it covers every Redis engine) takes and releases a lock behind Sentinel with
/// `DLOCK_REDIS_WAIT=1`: the master's `ROLE` check, the scripts, `CLIENT INFO` and `WAIT`
/// (uncontended: no waiter, no `PUBLISH`). Checked by hand to fail without `+role`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_rule_serves_sentinel() {
    let sentinels = RedisSentinels::start();
    let (rule, password) = acl_rule_without(&[]);
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    for port in std::iter::once(sentinels.master_port()).chain(sentinels.replica_ports()) {
        assert_eq!(sentinels.command(port, &args).ok(), Some(Value::Okay));
    }
    let url = sentinels.url().replacen(
        "redis+sentinel://",
        &format!("redis+sentinel://dlock-app:{password}@"),
        1,
    );
    let user = failover_locker(&url, 1);
    let key = unique_key("with-the-rule");
    let held = user.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(exists(
        &sentinels,
        sentinels.master_port(),
        &format!("dlock:{key}")
    ));
    held.release().await.unwrap();
    assert!(!exists(
        &sentinels,
        sentinels.master_port(),
        &format!("dlock:{key}")
    ));
}

/// The suite's Sentinel deployment, whose lockers log in with exactly docs/redis.md's rule on every
/// data node: twice a release wakes its waiter through its place's channel (lockers that would
/// retry only every 3s get the lock within a second of the release), with neither `PUBLISH` nor
/// `SUBSCRIBE` refused (a refusal is logged as a `warn`, and the waiter polls). Checked to fail
/// without `+publish` or `+subscribe` in the page's rule.
#[test]
fn the_acl_rule_lets_a_release_wake_a_sentinel_waiter() {
    let engine = Engine::start("redis_sentinel");
    let log = hand_offs_logged(engine.url().expect("a Sentinel URL"));
    assert!(!log.contains("may not"), "{log}");
}

/// Once a forced failover has settled (the old master demoted to a replica), the client that
/// was connected to the old master finds the new one: it never keeps writing to the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_a_forced_failover() {
    let sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let locker = locker(&sentinels, 0);
    acquire_and_release(&locker, &unique_key("warm")).await;
    sentinels.failover();
    let new = sentinels
        .wait_new_master(old, Duration::from_secs(20))
        .expect("a new master");
    assert!(demoted(&sentinels, old).await, "the old master was demoted");
    let started = Instant::now();
    let key = unique_key("after-failover");
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("locks work again within 10s");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(exists(&sentinels, new, &format!("dlock:{key}")));
    guard.release().await.unwrap();
}

/// Right after a promotion the old master still takes writes until the sentinels demote it (and
/// loses them when it resynchronises): Sentinel's own split-brain window. With
/// `DLOCK_REDIS_WAIT` set to every replica, an acquisition that lands there is not acknowledged
/// (the promoted replica has left it) and is undone; the retry reaches the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_keeps_locks_off_a_master_about_to_be_demoted() {
    let sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let locker = locker(&sentinels, 2);
    acquire_and_release(&locker, &unique_key("warm")).await;
    sentinels.failover();
    let new = sentinels
        .wait_new_master(old, Duration::from_secs(20))
        .expect("a new master");
    let key = unique_key("in-the-window");
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(15)))
        .await
        .expect("the acquisition reaches the new master");
    assert!(demoted(&sentinels, old).await, "the old master was demoted");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        exists(&sentinels, new, &format!("dlock:{key}")),
        "the lock was written where the failover lost it"
    );
    extend_once_reachable(&guard).await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_a_killed_master() {
    let mut sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let locker = locker(&sentinels, 0);
    acquire_and_release(&locker, &unique_key("warm")).await;
    sentinels.kill(old);
    let new = sentinels
        .wait_new_master(old, Duration::from_secs(20))
        .expect("the sentinels promote a replica");
    let started = Instant::now();
    let key = unique_key("after-kill");
    let guard = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("locks work again within 10s of the promotion");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(exists(&sentinels, new, &format!("dlock:{key}")));
    guard.release().await.unwrap();
}

/// `DLOCK_REDIS_WAIT=2` (both replicas): the acquisition returned only once both replicas had
/// it, so whichever is promoted keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acknowledgement_a_lock_survives_the_loss_of_its_master() {
    let mut sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let holder = locker(&sentinels, 2);
    let key = unique_key("acknowledged");
    let guard = holder.acquire(&key, LockOptions::new()).await.unwrap();
    sentinels.kill(old);
    sentinels
        .wait_new_master(old, Duration::from_secs(20))
        .expect("the sentinels promote a replica");
    extend_once_reachable(&guard)
        .await
        .expect("the holder still holds its lock on the new master");
    let other = locker(&sentinels, 0);
    let refused = other
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert!(refused.is_timeout(), "{refused:?}");
    guard.release().await.unwrap();
}

/// Without acknowledgement: the lock is written to a master whose replicas never get it (their
/// links are cut), the master dies, a replica is promoted without the lock and a second client
/// takes it. That is the documented cost of asynchronous replication. The second holder's fence
/// is still higher, so a fenced resource refuses the first holder, and the first holder learns
/// of the loss at its next renewal and release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_acknowledgement_a_failover_can_lose_a_lock_and_fencing_still_holds() {
    let mut sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let replicas = sentinels.replica_ports();
    let holder = locker(&sentinels, 0);
    acquire_and_release(&holder, &unique_key("warm")).await;
    for &replica in &replicas {
        sentinels.server(replica).pause();
    }
    let cut = sentinels.command(old, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(matches!(cut, Ok(Value::Int(_))), "{cut:?}");
    let key = unique_key("unreplicated");
    let first = holder.acquire(&key, LockOptions::new()).await.unwrap();
    sentinels.kill(old);
    for &replica in &replicas {
        sentinels.server(replica).resume();
    }
    sentinels
        .wait_new_master(old, Duration::from_secs(30))
        .expect("the sentinels promote a replica");

    let other = locker(&sentinels, 0);
    let second = taken_over_and_fenced(&other, &key, &first).await;

    let renewal = extend_once_reachable(&first).await.unwrap_err();
    assert!(renewal.is_lost(), "{renewal:?}");
    assert!(first.release().await.unwrap_err().is_lost());
    second.release().await.unwrap();
}

/// Every sentinel down, or sentinels that do not know the master name: a `Backend` error within
/// the wait's bound, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_sentinels_and_unknown_masters_are_errors_within_the_wait() {
    let nobody: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", dlock_tests::free_port()))
        .collect();
    let sentinels = RedisSentinels::start();
    let unknown = sentinels.url().replace("/mymaster", "/no-such-master");
    for url in [
        format!("redis+sentinel://{}/mymaster", nobody.join(",")),
        unknown,
    ] {
        let err = error_within_the_wait(&url).await;
        assert!(err.is_backend(), "{url}: {err:?}");
    }
}

/// Commands the sentinels processed (a client's lookups of the master, and the sentinels' own
/// pings of each other: a few a second).
fn lookups(sentinels: &RedisSentinels) -> u64 {
    sentinels
        .sentinel_ports()
        .into_iter()
        .map(|port| {
            let info = sentinels
                .command(port, &["INFO", "stats"])
                .ok()
                .as_ref()
                .and_then(resp::text)
                .expect("the sentinel's INFO stats");
            info.lines()
                .find_map(|line| line.strip_prefix("total_commands_processed:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .expect("total_commands_processed in INFO stats")
        })
        .sum()
}

/// Requests that fail together on a connection the master dropped (here `CLIENT KILL`) are sent
/// once more on one new connection: the sentinels are asked for the master once, not once per
/// request (6 commands on the sentinels measured, one lookup is 2 or 3 of them and the
/// sentinels' own pings the rest; 63 before). Before, each failing request forgot whatever
/// connection was stored (one made since by another request too), and each request that found
/// none made its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_failing_together_ask_the_sentinels_once() {
    const REQUESTS: usize = 20;
    let sentinels = RedisSentinels::start();
    let locker = locker(&sentinels, 0);
    acquire_and_release(&locker, &unique_key("warm")).await;
    let master = sentinels.master_port();
    for round in 0..3 {
        let before = lookups(&sentinels);
        // The locker's connections: not the sentinels' own (`sentinel-…`).
        let clients = sentinels
            .command(master, &["CLIENT", "LIST", "TYPE", "normal"])
            .ok()
            .as_ref()
            .and_then(resp::text)
            .expect("CLIENT LIST");
        // (Nor the connection that asked for the list, gone since.)
        let ours: Vec<&str> = clients
            .lines()
            .filter(|line| !line.contains(" name=sentinel-") && !line.contains(" cmd=client|list"))
            .filter_map(|line| line.strip_prefix("id=")?.split(' ').next())
            .collect();
        let killed: i64 = ours
            .iter()
            .map(
                |id| match sentinels.command(master, &["CLIENT", "KILL", "ID", id]) {
                    Ok(Value::Int(n)) => n,
                    other => panic!("CLIENT KILL ID {id}: {other:?}"),
                },
            )
            .sum();
        assert!(killed >= 1, "no connection of the locker: {clients}");
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let (locker, key) = (locker.clone(), unique_key(&format!("together-{i}")));
                tokio::spawn(async move {
                    let guard = locker
                        .try_acquire(&key, Duration::from_secs(30))
                        .await
                        .expect("sent once more on a new connection")
                        .expect("a free key");
                    guard.release().await.expect("the release");
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let asked = lookups(&sentinels)
            .checked_sub(before)
            .expect("the sentinels' counts only grow");
        eprintln!(
            "round {round}: {asked} commands on the sentinels for {REQUESTS} failing requests"
        );
        assert!(
            asked <= 30,
            "round {round}: {asked} commands on the sentinels for {REQUESTS} requests failing \
             together (a lookup each is about 60)"
        );
    }
}
