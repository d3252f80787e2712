//! The etcd engine beyond the shared suite: interop with `etcdctl lock`, keys as data, what a
//! single attempt and a dropped waiter leave behind, several OS processes on one counter, and the
//! faults of a 3-member cluster (leader killed, holder frozen past its lease, whole cluster
//! restarted, every endpoint down) and of a proxy (replies lost, a holder cut off past its
//! session, a grant whose reply came after its session ended). Servers: Debian's `etcd-server` and `etcd-client` packages.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Stdio},
    sync::{Mutex, Weak, mpsc},
    time::Duration,
};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{
    engines::{error_within_the_wait, extend_once_reachable, shared},
    etcd::EtcdCluster,
    free_port,
    proxy::Proxy,
    signal, unique_key,
};
use etcd_client::{Client, GetOptions, PutOptions};
use tokio::time::Instant;

/// The one-member etcd of this test binary.
fn single() -> std::sync::Arc<EtcdCluster> {
    static SINGLE: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
    shared(&SINGLE, EtcdCluster::single)
}

async fn client(etcd: &EtcdCluster) -> Client {
    Client::connect(etcd.endpoints(), None)
        .await
        .expect("connect to etcd")
}

/// The keys in `name`'s line (`name/…`), oldest first.
async fn line(etcd: &EtcdCluster, name: &str) -> Vec<String> {
    let got = client(etcd)
        .await
        .get(
            format!("{name}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("get the line");
    got.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// The one key in `name`'s line (a holder's, with nobody waiting).
async fn only_key(etcd: &EtcdCluster, name: &str) -> String {
    let mut keys = line(etcd, name).await;
    assert_eq!(keys.len(), 1, "one key in the line: {keys:?}");
    keys.remove(0)
}

/// The session lease a key of the line was put on (`<line><lease in hex>-<n>`).
fn lease_of(key: &str) -> i64 {
    let name = key.rsplit('/').next().unwrap();
    let hex = name.split('-').next().unwrap();
    i64::from_str_radix(hex, 16).unwrap()
}

/// Waits up to `within` for `lease` to be gone (revoked, or expired and revoked: its keys
/// deleted): `false` if it still lives. etcd says -1 then; 0 is under a second left, or expired
/// and not yet revoked, and an error is no answer.
async fn lease_revoked(etcd: &EtcdCluster, lease: i64, within: Duration) -> bool {
    let mut etcd_client = client(etcd).await;
    let deadline = Instant::now() + within;
    while !etcd_client
        .lease_time_to_live(lease, None)
        .await
        .is_ok_and(|ttl| ttl.ttl() < 0)
    {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A TCP proxy to the cluster's first member.
fn proxy_to(etcd: &EtcdCluster) -> Proxy {
    let endpoint = &etcd.endpoints()[0];
    Proxy::start(endpoint.rsplit(':').next().unwrap().parse().unwrap())
}

/// A locker through `proxy` with sessions of `session_ttl` and requests bounded by
/// `request_timeout`.
fn locker_through(proxy: &Proxy, session_ttl: &str, request_timeout: Duration) -> Locker {
    Locker::builder()
        .url(format!(
            "etcd://127.0.0.1:{}?session_ttl={session_ttl}",
            proxy.port()
        ))
        .request_timeout(request_timeout)
        .build()
        .unwrap()
}

/// Waits up to `within` for `name`'s line to have `n` keys.
async fn line_has(etcd: &EtcdCluster, name: &str, n: usize, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let keys = line(etcd, name).await;
        if keys.len() == n || Instant::now() >= deadline {
            return keys;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lines `etcdctl lock` prints, read on a thread.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `etcdctl lock <prefix+key>` and dlock on the key exclude each other, both ways round: etcdctl
/// waits for dlock's holder, and a dlock waiter for etcdctl's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_exclude_each_other() {
    let etcd = single();
    let locker = etcd.locker();
    let key = unique_key("interop");
    let name = format!("dlock:{key}");

    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let mut ctl = etcd
        .etcdctl()
        .args(["lock", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl not found: install it with `sudo apt-get install -y etcd-client`");
    let printed = lines_of(&mut ctl);
    assert!(
        printed.recv_timeout(Duration::from_millis(1500)).is_err(),
        "etcdctl lock got the lock dlock holds"
    );
    assert_eq!(
        line(&etcd, &name).await.len(),
        2,
        "etcdctl waits in dlock's line"
    );
    guard.release().await.unwrap();
    let held = printed
        .recv_timeout(Duration::from_secs(10))
        .expect("etcdctl lock got the lock after dlock released it");
    assert!(held.starts_with(&format!("{name}/")), "{held}");

    assert!(
        locker
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "dlock got the lock etcdctl holds"
    );
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "a dlock waiter got in beside etcdctl"
    );
    // SIGINT: etcdctl unlocks and closes its session.
    signal(&ctl, "-INT");
    let _ = ctl.wait();
    let guard = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after etcdctl");
    guard.release().await.unwrap();
}

/// `etcdctl lock` (which looks at no kinds) waiting behind dlock's readers: a reader that comes
/// after its key is refused with a conflict, never let in beside it once the readers ahead
/// leave (regression: readers looked only for writers ahead of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_joins_an_etcdctl_lock_queued_behind_readers() {
    let etcd = single();
    let locker = etcd.locker();
    let key = unique_key("rw-interop");
    let name = format!("dlock:{key}");
    let reader = locker.acquire_read(&key, LockOptions::new()).await.unwrap();
    let mut ctl = etcd
        .etcdctl()
        .args(["lock", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl not found: install it with `sudo apt-get install -y etcd-client`");
    let printed = lines_of(&mut ctl);
    assert_eq!(
        line_has(&etcd, &name, 2, Duration::from_secs(5))
            .await
            .len(),
        2
    );
    let late = etcd
        .locker()
        .acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(
        late.as_ref()
            .is_err_and(dlock_runtime::LockError::is_conflict),
        "a reader behind etcdctl's key: {late:?}"
    );
    assert!(printed.recv_timeout(Duration::from_millis(300)).is_err());
    reader.release().await.unwrap();
    let held = printed
        .recv_timeout(Duration::from_secs(10))
        .expect("etcdctl lock got the lock after the reader left");
    assert!(held.starts_with(&format!("{name}/")), "{held}");
    signal(&ctl, "-INT");
    let _ = ctl.wait();
}

/// Keys are data: `a` and `a/b` are two locks (the `/` of a key is escaped in the line's name),
/// and each line holds only its own lock's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_and_a_slash_b_are_different_locks() {
    let etcd = single();
    let (a, b) = (etcd.locker(), etcd.locker());
    let key = unique_key("esc");
    let nested = format!("{key}/b");
    let outer = a.try_acquire(&key, Duration::from_secs(5)).await.unwrap();
    let inner = b
        .try_acquire(&nested, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(outer.is_some() && inner.is_some(), "`a/b` waited for `a`");
    assert_eq!(line(&etcd, &format!("dlock:{key}")).await.len(), 1);
    assert_eq!(line(&etcd, &format!("dlock:{key}%2Fb")).await.len(), 1);
    // The other way round too: `a/b` held first, then `a`.
    drop((outer, inner));
    let key = unique_key("esc");
    let inner = b
        .acquire(&format!("{key}/b"), LockOptions::new())
        .await
        .unwrap();
    let outer = a.try_acquire(&key, Duration::from_secs(5)).await.unwrap();
    assert!(outer.is_some(), "`a` waited for `a/b`");
    // A percent sign is escaped too: `a%2Fb` is not `a/b`.
    let lookalike = a
        .try_acquire(&format!("{key}%2Fb"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(lookalike.is_some(), "`a%2Fb` waited for `a/b`");
    inner.release().await.unwrap();
}

/// `timeout = 0` is one attempt that leaves nothing behind; a waiter that gives up or is dropped
/// removes its key from the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_attempts_and_dropped_waiters_leave_nothing() {
    let etcd = single();
    let (a, b) = (etcd.locker(), etcd.locker());
    let key = unique_key("leave");
    let name = format!("dlock:{key}");
    let held = a.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(
        b.try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let keys = line_has(&etcd, &name, 1, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 1, "a single attempt left its key: {keys:?}");

    // A waiter, dropped while it waits.
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let wait = b.acquire(&key, LockOptions::new().timeout(Duration::from_secs(30)));
            tokio::time::timeout(Duration::from_millis(500), wait).await
        })
    };
    let keys = line_has(&etcd, &name, 2, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 2, "the waiter is in line");
    assert!(waiting.await.unwrap().is_err(), "the waiter was dropped");
    let keys = line_has(&etcd, &name, 1, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 1, "the dropped waiter left its key: {keys:?}");

    // A waiter that times out.
    let err = b
        .acquire(&key, LockOptions::new().timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    let keys = line_has(&etcd, &name, 1, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 1, "the timed-out waiter left its key: {keys:?}");
    held.release().await.unwrap();
    assert!(
        line_has(&etcd, &name, 0, Duration::from_secs(2))
            .await
            .is_empty()
    );
}

/// A waiter whose put reached etcd but whose reply was lost (the proxy forwards the put, then
/// holds every reply back for longer than the request timeout): its retries find its key again
/// (the key's name is the acquisition's) instead of queueing a second one, and when it gives up
/// it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_put_reply_was_lost_queues_once_and_leaves_nothing() {
    let etcd = single();
    let key = unique_key("lost-put");
    let name = format!("dlock:{key}");
    let held = etcd
        .locker()
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let proxy = proxy_to(&etcd);
    let waiter = Locker::builder()
        .url(format!("etcd://127.0.0.1:{}", proxy.port()))
        .request_timeout(Duration::from_millis(250))
        .expire(Duration::from_secs(10))
        .build()
        .unwrap();
    // Connected already, so the put is the first request that names the line.
    let warm = waiter
        .try_acquire(&unique_key("lost-put-warm"), Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    warm.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.cut_replies_on(format!("{name}/").as_bytes());
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
                .await
        })
    };
    let keys = line_has(&etcd, &name, 2, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 2, "the waiter's put reached etcd: {keys:?}");
    assert!(proxy.replies_cut(), "the put's reply is held back");
    // Longer than the request timeout: the put's reply is lost, and the attempts after it too.
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.heal();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = line(&etcd, &name).await;
    assert_eq!(
        keys.len(),
        2,
        "after its put's reply was lost the waiter queued once: {keys:?}"
    );
    let err = waiting.await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let keys = line_has(&etcd, &name, 1, Duration::from_secs(2)).await;
    assert_eq!(keys.len(), 1, "the waiter left its key: {keys:?}");
    held.release().await.unwrap();
}

fn failover_locker(etcd: &EtcdCluster) -> Locker {
    Locker::builder()
        .url(etcd.url())
        .timeout(Duration::from_secs(20))
        .expire(Duration::from_secs(30))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// The leader is killed while locks are held and waited for: no waiter gets in beside a holder,
/// the holders keep their locks (their leases survive the election), and once they release
/// every waiter gets through with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_locks_are_held_and_waited_for() {
    let mut etcd = EtcdCluster::start(3);
    let holder = failover_locker(&etcd);
    let keys: Vec<String> = (0..3).map(|_| unique_key("leader")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.acquire(key, LockOptions::new()).await.unwrap());
    }
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| {
            let (locker, key) = (failover_locker(&etcd), key.clone());
            tokio::spawn(async move { locker.acquire(&key, LockOptions::new()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    etcd.wait_for_leader(Duration::from_secs(20));
    for guard in &guards {
        extend_once_reachable(guard)
            .await
            .expect("the holder kept its lock through the election");
        assert!(guard.is_held());
    }
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter got in while its holder held the lock"
    );
    let fences: Vec<u64> = guards
        .iter()
        .map(dlock_runtime::LockGuard::fencing_token)
        .collect();
    for guard in guards {
        guard.release().await.unwrap();
    }
    for (waiter, first) in waiters.into_iter().zip(fences) {
        let guard = waiter.await.unwrap().expect("the waiter got through");
        assert!(guard.fencing_token() > first);
        guard.release().await.unwrap();
    }
}

/// The whole cluster is restarted while a lock is held: its key and lease come back from the
/// members' data, the holder still holds it and releases it, and the next holder's fence is
/// higher. Then every member is killed: an acquisition fails with a `Backend` error within its
/// wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restarted_then_down() {
    let mut etcd = EtcdCluster::start(3);
    let (a, b) = (failover_locker(&etcd), failover_locker(&etcd));
    let key = unique_key("restart");
    let guard = a.acquire(&key, LockOptions::new()).await.unwrap();
    etcd.restart_all();
    extend_once_reachable(&guard)
        .await
        .expect("the lock survived the restart");
    let probe = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match b.try_acquire(&key, Duration::from_secs(5)).await {
                Ok(got) => return got.is_none(),
                Err(e) if e.is_backend() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the cluster answers after the restart");
    assert!(probe, "another client got the lock held across the restart");
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let next = b.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();

    for i in 0..etcd.len() {
        etcd.kill(i);
    }
    let err = error_within_the_wait(&etcd.url()).await;
    assert!(err.is_backend(), "{err:?}");
}

/// Endpoints where nothing listens: a `Backend` error within the wait, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoints_are_a_backend_error_within_the_wait() {
    let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let err = error_within_the_wait(&url).await;
    assert!(err.is_backend(), "{err:?}");
}

/// Regression: tasks of one locker waiting on one key each took a place in etcd's line before
/// queueing in the locker's in-process line, so the first of them there waited (in etcd) for
/// keys of tasks that waited (in-process) for it: every acquisition timed out. Now a waiter
/// joins the in-process line before its first attempt on an engine with a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_locker_on_one_key_do_not_wait_for_each_other() {
    let etcd = single();
    let locker = etcd.locker();
    let key = unique_key("tasks");
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (locker, key, counter) = (locker.clone(), key.clone(), counter.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    let guard = locker
                        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
                        .await
                        .expect("every task gets its turn");
                    dlock_tests::racy_increment(&counter).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(std::sync::atomic::Ordering::SeqCst), 48);
    assert!(line(&etcd, &format!("dlock:{key}")).await.is_empty());
}

/// An operator deletes the holder's key (its 30s lease still running): the watch on the key
/// (set once the hold has lasted a second, from the revision after its fence) reports the hold
/// lost, and a `#[dlock]`-style body would be aborted; the release then says `Lost` and deletes
/// nothing. Deleted both before and after the watch starts, and from a hold whose first lease
/// (500ms) was shorter than the second after which the watch starts, extended to 30s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_holder_key_is_lost_at_once() {
    let etcd = single();
    let locker = etcd.locker();
    for (delay, short) in [
        (Duration::ZERO, false),
        (Duration::from_millis(1500), false),
        (Duration::from_millis(1500), true),
    ] {
        let key = unique_key("deleted");
        let name = format!("dlock:{key}");
        let first = if short { 500 } else { 30_000 };
        let guard = locker
            .acquire(
                &key,
                LockOptions::new().expire(Duration::from_millis(first)),
            )
            .await
            .unwrap();
        if short {
            guard.extend(Duration::from_secs(30)).await.unwrap();
        }
        tokio::time::sleep(delay).await;
        let own_key = only_key(&etcd, &name).await;
        client(&etcd)
            .await
            .delete(own_key.as_str(), None)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the deletion was reported well before the 30s lease ran out");
        assert!(!guard.is_held());
        assert!(guard.release().await.unwrap_err().is_lost());
    }
}

/// A locker cut off from etcd (a proxy that forwards nothing): its session ends on the client's
/// clock once its keep-alives go unanswered for the session's TTL, and every hold of it is then
/// reported lost, well before their own 120s `expire` (nothing of etcd, no deletion, can reach
/// the client to tell it); once healed, the locker opens a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_loses_every_hold_at_once() {
    let etcd = single();
    let proxy = proxy_to(&etcd);
    let locker = locker_through(&proxy, "5s", Duration::from_millis(500));
    let (one, two) = (unique_key("cut-off-1"), unique_key("cut-off-2"));
    let options = LockOptions::new().expire(Duration::from_secs(120));
    let first = locker.acquire(&one, options.clone()).await.unwrap();
    let second = locker.acquire(&two, options.clone()).await.unwrap();
    proxy.cut();
    for guard in [&first, &second] {
        tokio::time::timeout(Duration::from_secs(30), guard.lost())
            .await
            .expect("the session's end was reported well before the 120s lease ran out");
        assert!(!guard.is_held());
    }
    proxy.heal();
    let again = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match locker.try_acquire(&one, Duration::from_secs(5)).await {
                Ok(Some(guard)) => return guard,
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) if e.is_backend() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the old session's keys went with its lease, and a new session took the key");
    again.release().await.unwrap();
}

/// The client counts its session over before etcd can have expired it even when a keep-alive is
/// left waiting for its answer (a partition that silently drops packets) and the request timeout
/// is longer than the session's TTL: once etcd has expired the lease (its keys gone, the lock
/// free for another client), the hold already says it is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_lost_before_etcd_expires_its_session_whatever_the_request_timeout() {
    let etcd = single();
    let proxy = proxy_to(&etcd);
    let locker = locker_through(&proxy, "3s", Duration::from_secs(20));
    let key = unique_key("ttl-under-request-timeout");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(120)))
        .await
        .unwrap();
    let lease = lease_of(&only_key(&etcd, &format!("dlock:{key}")).await);
    proxy.cut();
    assert!(
        lease_revoked(&etcd, lease, Duration::from_secs(60)).await,
        "etcd never expired the session's lease once its keep-alives stopped arriving"
    );
    assert!(
        !guard.is_held(),
        "etcd expired the session's lease (another client could take the lock) while the hold \
         still counted itself held"
    );
    proxy.heal();
    drop(guard);
}

/// A grant whose reply comes after the session ended on the client (the proxy carries the
/// requests, keep-alives included, and holds every reply back until the session's end has
/// passed) is a hold lost already: the session's end made its holds lost before this one was
/// granted, and no keep-alive will be sent for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_came_after_the_session_ended_is_lost() {
    let etcd = single();
    let proxy = proxy_to(&etcd);
    let locker = locker_through(&proxy, "3s", Duration::from_secs(20));
    let long = LockOptions::new().expire(Duration::from_secs(120));
    // On the session too: its loss says when the session ended on the client.
    let canary = locker
        .acquire(&unique_key("late-grant-canary"), long.clone())
        .await
        .unwrap();
    let key = unique_key("late-grant");
    let name = format!("dlock:{key}");
    proxy.cut_replies();
    let acquiring = {
        let (locker, key, options) = (locker.clone(), key.clone(), long.clone());
        tokio::spawn(async move { locker.acquire(&key, options).await })
    };
    let keys = line_has(&etcd, &name, 1, Duration::from_secs(10)).await;
    assert_eq!(
        keys.len(),
        1,
        "the acquisition's put reached etcd: {keys:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), canary.lost())
        .await
        .expect("the session ended on the client with its keep-alives unanswered");
    proxy.heal();
    // Granted: the put's reply was held for a few seconds, far inside its request timeout.
    let guard = acquiring
        .await
        .unwrap()
        .expect("the put's reply came after the heal, within its request timeout");
    assert!(
        !guard.is_held(),
        "a grant whose reply came after its session ended counted itself held"
    );
}

/// A hold's key deleted by hand and then put again under the same name on the same lease (what a
/// first attempt that timed out, applied late, does): the release says `Lost` (the key there is
/// not the hold's) and deletes it all the same (it is the token's, and would hold the line up
/// for the session's life).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_put_again_under_the_holds_name_is_lost_and_deleted() {
    let etcd = single();
    let locker = etcd.locker();
    let key = unique_key("put-again");
    let name = format!("dlock:{key}");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    let own_key = only_key(&etcd, &name).await;
    let mut etcd_client = client(&etcd).await;
    etcd_client.delete(own_key.as_str(), None).await.unwrap();
    let put = PutOptions::new().with_lease(lease_of(&own_key));
    etcd_client
        .put(own_key.as_str(), "", Some(put))
        .await
        .unwrap();
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_eq!(line(&etcd, &name).await, Vec::<String>::new());
}

/// A locker's keys all live on one session lease, granted once: two holds and a waiter of one
/// locker share it. Closing the locker revokes it, and the keys of anything it still had go
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_lease_per_locker_revoked_by_close() {
    let etcd = single();
    let (locker, other) = (etcd.locker(), etcd.locker());
    let (a, b, c) = (
        unique_key("session"),
        unique_key("session"),
        unique_key("session"),
    );
    let first = locker.acquire(&a, LockOptions::new()).await.unwrap();
    let second = locker.acquire(&b, LockOptions::new()).await.unwrap();
    let theirs = other.acquire(&c, LockOptions::new()).await.unwrap();
    let (key_a, key_b) = (
        line(&etcd, &format!("dlock:{a}")).await,
        line(&etcd, &format!("dlock:{b}")).await,
    );
    let lease = lease_of(&key_a[0]);
    assert_eq!(lease, lease_of(&key_b[0]), "two holds, two leases");
    let other_lease = lease_of(&line(&etcd, &format!("dlock:{c}")).await[0]);
    assert_ne!(lease, other_lease, "two lockers share a session");
    // A waiter of `other` on `a` joins the line on its locker's session.
    let waiter = {
        let (other, a) = (other.clone(), a.clone());
        tokio::spawn(async move {
            other
                .acquire(&a, LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        })
    };
    let keys = line_has(&etcd, &format!("dlock:{a}"), 2, Duration::from_secs(2)).await;
    assert_eq!(lease_of(&keys[1]), other_lease);
    drop(second);
    first.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    assert!(
        !lease_revoked(&etcd, lease, Duration::from_millis(300)).await,
        "the session lease went with the holds"
    );
    locker.close().await.unwrap();
    assert!(
        lease_revoked(&etcd, lease, Duration::from_secs(2)).await,
        "close left the session lease"
    );
    drop(theirs);
    other.close().await.unwrap();
    assert!(lease_revoked(&etcd, other_lease, Duration::from_secs(2)).await);
}

/// A short hold counts its lease from the grant, after the session lease was granted (here
/// slowly, through a proxy that holds the bytes back): before, the lease counted from before
/// the session and a 1s hold on a fresh locker was born lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_hold_counts_from_the_grant_after_a_slow_session() {
    let etcd = single();
    let proxy = proxy_to(&etcd);
    let through = locker_through(&proxy, "10s", Duration::from_secs(3));
    dlock_tests::engines::short_hold_after_a_slow_session(&through, &proxy).await;
}
