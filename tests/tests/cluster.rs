//! Redis Cluster (`redis+cluster://`), on a real 3-master, 3-replica cluster per test: keys on
//! every master, a slot migrated while its locks are held and waited for, and a master killed
//! with its replica promoted — the lock kept when its write was replicated (`DLOCK_REDIS_WAIT`),
//! lost otherwise (documented), with fences that still refuse the old holder.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use dlock_runtime::{LockError, LockOptions, Locker};
use dlock_tests::resp::{self, Value};
use dlock_tests::{
    acquire_and_release,
    cluster::RedisCluster,
    engines::{
        Engine, acl_rule_without, error_within_the_wait, extend_once_reachable, failover_locker,
        hand_offs_logged, refused_within, slow_poller, taken_over_and_fenced,
    },
    racy_increment, unique_key,
};

fn locker(cluster: &RedisCluster, replicas: u32) -> Locker {
    failover_locker(&cluster.url(), replicas)
}

/// A fresh key (without the prefix) whose lock key lives on the master `port`.
fn key_on(cluster: &RedisCluster, port: u16, name: &str) -> String {
    loop {
        let key = unique_key(name);
        if cluster.master_of_slot(cluster.slot_of(&format!("dlock:{key}"))) == port {
            return key;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_master_exclude_and_fence() {
    let cluster = RedisCluster::start();
    let (a, b) = (locker(&cluster, 0), locker(&cluster, 0));
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for master in masters {
        let key = key_on(&cluster, master, "every-master");
        let first = a.acquire(&key, LockOptions::new()).await.unwrap();
        assert!(cluster.node(master).exists(&format!("dlock:{key}")));
        assert!(
            b.try_acquire(&key, Duration::from_secs(5))
                .await
                .unwrap()
                .is_none()
        );
        let fence = first.fencing_token();
        first.release().await.unwrap();
        let second = b.acquire(&key, LockOptions::new().fair()).await.unwrap();
        assert!(second.fencing_token() > fence);
        second.release().await.unwrap();
    }
}

/// The slot of a held lock moves to another master while four clients wait for it: nobody
/// overlaps (a non-atomic counter), every waiter gets through, fences keep increasing, and the
/// holder's release reaches the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_while_held_and_waited_for() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let (source, target) = (masters[0], masters[1]);
    let key = key_on(&cluster, source, "migrating");
    let lock_key = format!("dlock:{key}");
    let slot = cluster.slot_of(&lock_key);
    let holder = locker(&cluster, 0);
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let counter = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(vec![held.fencing_token()]));
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (locker, key) = (locker(&cluster, 0), key.clone());
            let (counter, fences) = (counter.clone(), fences.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    let guard = locker.acquire(&key, LockOptions::new()).await?;
                    fences.lock().unwrap().push(guard.fencing_token());
                    racy_increment(&counter).await;
                    guard.release().await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.begin_migration(slot, target);
    assert!(cluster.move_keys(slot, target) >= 1, "the lock key moved");
    // Half-migrated: the lock lives on the target, the source redirects with ASK.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.finish_migration(slot, target);
    assert_eq!(cluster.master_of_slot(slot), target);
    assert_eq!(
        counter.load(Ordering::SeqCst),
        0,
        "a waiter got in while held"
    );
    held.release()
        .await
        .expect("the release reaches the new owner");
    for waiter in waiters {
        waiter.await.unwrap().expect("every waiter gets through");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 12, "holders overlapped");
    let fences = fences.lock().unwrap().clone();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences went back: {fences:?}"
    );
    assert!(!cluster.node(target).exists(&lock_key));
}

/// With `DLOCK_REDIS_WAIT=1` (each master has one replica) the lock is on the replica before
/// the acquisition returns; the master is killed, the replica promoted, and the lock kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_survives_the_loss_of_its_master() {
    let mut cluster = RedisCluster::start();
    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    let key = key_on(&cluster, master, "replicated");
    let holder = locker(&cluster, 1);
    let guard = holder.acquire(&key, LockOptions::new()).await.unwrap();
    cluster.kill(master);
    assert!(
        cluster.wait_until_master(replica, Duration::from_secs(15)),
        "the replica was promoted"
    );
    let started = Instant::now();
    extend_once_reachable(&guard)
        .await
        .expect("the holder still holds its lock on the promoted replica");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the client followed within 10s"
    );
    let other = locker(&cluster, 0);
    let refused = other
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert!(refused.is_timeout(), "{refused:?}");
    guard.release().await.unwrap();
    acquire_and_release(&other, &key).await;
}

/// A user created on every node with exactly docs/redis.md's ACL rule takes and releases a lock
/// with `DLOCK_REDIS_WAIT=1` (the page says the rule covers every Redis engine; until this test
/// it lacked the `CLUSTER SLOTS` the Cluster client asks first). With the rule less `+wait`,
/// the `WAIT` that follows `CLIENT INFO` in one pipeline routed to the key's master is refused
/// there (`NOPERM`), and that refusal reaches the caller as the server's, at once and naming the
/// ACL rule — not as a reply of the wrong type, retried until the timeout — with the
/// acquisition undone (no lock left on the master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_rule_serves_a_cluster_and_a_refused_wait_fails_at_once() {
    let cluster = RedisCluster::start();
    let set_user = |without: &[&str]| -> (String, &'static str) {
        let (rule, password) = acl_rule_without(without);
        let args: Vec<&str> = rule.iter().map(String::as_str).collect();
        for port in cluster.live() {
            assert_eq!(cluster.command(port, &args).ok(), Some(Value::Okay));
        }
        let url = cluster.url().replacen(
            "redis+cluster://",
            &format!("redis+cluster://dlock-app:{password}@"),
            1,
        );
        (url, password)
    };
    let (url, _) = set_user(&[]);
    acquire_and_release(&failover_locker(&url, 1), &unique_key("with-the-rule")).await;

    let (url, password) = set_user(&["+wait"]);
    let key = unique_key("no-wait");
    let err = refused_within(&failover_locker(&url, 1), &key, Duration::from_secs(5)).await;
    assert!(err.to_string().contains("ACL rule"), "{err}");
    assert!(!format!("{err:?}").contains(password), "{err:?}");
    let master = cluster.master_of_slot(cluster.slot_of(&format!("dlock:{key}")));
    assert!(
        !cluster.node(master).exists(&format!("dlock:{key}")),
        "the acquisition was not undone"
    );
}

/// The suite's Cluster deployment, whose lockers log in with exactly docs/redis.md's rule on every
/// data node: twice a release wakes its waiter through the key's shard channel (lockers that would
/// retry only every 3s get the lock within a second of the release), with neither `SPUBLISH` nor
/// `SSUBSCRIBE` refused (a refusal is logged as a `warn`, and the waiter polls). Checked to fail
/// without `+spublish` or `+ssubscribe` in the page's rule.
#[test]
fn the_acl_rule_lets_a_release_wake_a_cluster_waiter() {
    let engine = Engine::start("redis_cluster");
    let log = hand_offs_logged(engine.url().expect("a Cluster URL"));
    assert!(!log.contains("may not"), "{log}");
}

/// Without acknowledgement, a lock whose write never reached the replica is gone after the
/// failover (the documented limitation): another client takes it with a higher fence, and the
/// first holder's renewal reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplicated_lock_is_lost_in_a_failover_and_fencing_still_holds() {
    let mut cluster = RedisCluster::start();
    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    let key = key_on(&cluster, master, "unreplicated");
    let holder = locker(&cluster, 0);
    acquire_and_release(&holder, &key_on(&cluster, master, "warm")).await;
    cluster.node(replica).pause();
    let cut = cluster.command(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(matches!(cut, Ok(Value::Int(_))), "{cut:?}");
    let first = holder.acquire(&key, LockOptions::new()).await.unwrap();
    cluster.kill(master);
    cluster.node(replica).resume();
    assert!(
        cluster.wait_until_master(replica, Duration::from_secs(20)),
        "the replica was promoted"
    );
    // The fault is over once every live node agrees on the new topology.
    assert!(
        cluster.wait_ok(Duration::from_secs(15)),
        "the cluster healed"
    );
    let other = locker(&cluster, 0);
    let second = taken_over_and_fenced(&other, &key, &first).await;
    let renewal = extend_once_reachable(&first).await.unwrap_err();
    assert!(renewal.is_lost(), "{renewal:?}");
    second.release().await.unwrap();
}

/// Keys with braces of their own, in the key or in the prefix, keep every script on one slot:
/// no CROSSSLOT, in default and fair mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_braces_never_cross_slots() {
    let cluster = RedisCluster::start();
    for bad in ["a{}b:", "app{", "}:"] {
        let err = Locker::builder()
            .url(cluster.url())
            .key_prefix(bad)
            .build()
            .unwrap_err();
        assert!(
            err.is_config() && err.to_string().contains("hash tag"),
            "{bad}: {err}"
        );
    }
    for prefix in ["dlock:", "{app}:", "x{app}y:", "}{x}:"] {
        let locker = Locker::builder()
            .url(cluster.url())
            .key_prefix(prefix)
            .build()
            .unwrap();
        for key in ["{a}x", "{}", "x{}y", "{user1}:cart", "}{", "{{a}}"] {
            for options in [LockOptions::new(), LockOptions::new().fair()] {
                let guard = locker
                    .acquire(key, options)
                    .await
                    .unwrap_or_else(|e| panic!("{prefix}{key}: {e:?}"));
                guard.release().await.unwrap();
            }
        }
    }
}

/// Every seed node down, or a cluster URL naming a server without cluster mode: an error within
/// the wait's bound, not a hang.
#[tokio::test]
async fn dead_seeds_and_servers_without_cluster_mode_are_errors_within_the_wait() {
    let ports: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", dlock_tests::free_port()))
        .collect();
    let err = error_within_the_wait(&format!("redis+cluster://{}", ports.join(","))).await;
    assert!(err.is_backend(), "{err:?}");
    let server = dlock_tests::RedisServer::start();
    let err = error_within_the_wait(&format!("redis+cluster://127.0.0.1:{}", server.port())).await;
    assert!(err.is_backend() || err.is_config(), "{err:?}");
}

/// A release wakes a waiter through a shard channel of the key's slot (`SPUBLISH`/`SSUBSCRIBE`
/// on the node serving it; the channel of the waiting process's place in the key's queue), not by
/// polling: with a 3s retry pause, the waiter still gets the lock
/// well within a second of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_through_a_shard_channel() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let locker = || slow_poller(&url).build().unwrap();
    let (holder, waiter) = (locker(), locker());
    let key = unique_key("woken");
    let lock_key = format!("dlock:{key}");
    let master = cluster.master_of_slot(cluster.slot_of(&lock_key));
    let guard = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move { waiter.acquire(&key, LockOptions::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The waiting process's place's channel, in the key's slot: `<queue>:<8 hex>`.
    let pattern = format!("dlock:__fair:{{{lock_key}}}:queue:*");
    let channels = cluster
        .command(master, &["PUBSUB", "SHARDCHANNELS", &pattern])
        .ok();
    let channel = match channels.as_ref().and_then(resp::items) {
        Some([Value::BulkString(channel)]) => String::from_utf8(channel.clone()).unwrap(),
        _ => panic!("expected the waiter's one shard channel: {channels:?}"),
    };
    let subscribers = cluster
        .command(master, &["PUBSUB", "SHARDNUMSUB", &channel])
        .ok();
    assert!(
        subscribers
            .as_ref()
            .and_then(resp::items)
            .is_some_and(|pair| pair.get(1) == Some(&Value::Int(1))),
        "{subscribers:?}"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "woken {:?} after the release: it polled",
        released.elapsed()
    );
    second.release().await.unwrap();
}
