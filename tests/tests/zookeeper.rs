//! The ZooKeeper engine beyond the shared suite: the node layout (Curator's, checked with a raw
//! client and against `zookeeper-client`'s own Curator-compatible lock), keys as data, cancelled
//! waiters, a create whose reply was lost, 4 OS processes, and faults: the leader killed, a
//! holder frozen past its session, a restart, every server down.
//!
//! One standalone server is shared by the tests that do not break it; each fault test starts the
//! deployment it breaks.

use std::{
    sync::{Mutex, Weak},
    time::Duration,
};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{proxy::Proxy, unique_key, zookeeper::ZkEnsemble};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, LockPrefix};

/// The standalone server of this binary, shared by the tests running at once.
fn server() -> std::sync::Arc<ZkEnsemble> {
    static SERVER: Mutex<Weak<ZkEnsemble>> = Mutex::new(Weak::new());
    let mut current = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = current.upgrade() {
        return server;
    }
    let server = std::sync::Arc::new(ZkEnsemble::single());
    *current = std::sync::Arc::downgrade(&server);
    server
}

fn locker(url: &str) -> Locker {
    Locker::builder()
        .url(url)
        .timeout(Duration::from_secs(5))
        .expire(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn raw(zk: &ZkEnsemble) -> Client {
    Client::connect(&zk.hosts()).await.unwrap()
}

/// The children of the lock node of `key` (default prefix), none when it does not exist.
async fn line(zk: &Client, key: &str) -> Vec<String> {
    match zk.list_children(&format!("/dlock:{key}")).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list the line of {key}: {e}"),
    }
}

/// Waits (up to 5s) until the line of `key` has `n` nodes; returns them.
async fn line_settles(zk: &Client, key: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let nodes = line(zk, key).await;
        if nodes.len() == n || Instant::now() > deadline {
            return nodes;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_curators_and_exclude_its_recipe() {
    let zk = server();
    let client = raw(&zk).await;
    let key = unique_key("layout");
    let a = locker(&zk.url());
    let guard = a.acquire(&key, LockOptions::new()).await.unwrap();
    let nodes = line(&client, &key).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = &nodes[0];
    // `_c_<uuid>-lock-<10 digits>`, ephemeral, owned by the holder's session.
    let (protected, seq) = node.rsplit_once("-lock-").unwrap();
    assert!(
        protected.starts_with("_c_") && protected.len() == 3 + 36,
        "{node}"
    );
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "{node}"
    );
    let stat = client
        .check_stat(&format!("/dlock:{key}/{node}"))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(stat.ephemeral_owner, 0, "not ephemeral");
    // The lock node is a container: it goes once its line is empty.
    let parent = client
        .check_stat(&format!("/dlock:{key}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.ephemeral_owner, 0);

    // The client's own Curator-compatible recipe waits behind dlock's holder…
    let dir = format!("/dlock:{key}");
    let theirs = {
        let (client, dir) = (client.clone(), dir.clone());
        tokio::spawn(async move {
            let prefix = LockPrefix::new_curator(&dir, "lock-").unwrap();
            let lock = client.lock(prefix, b"", Acls::anyone_all()).await.unwrap();
            let path = lock.lock_path().to_owned();
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(lock);
            path
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !theirs.is_finished(),
        "Curator's recipe got in beside dlock"
    );
    guard.release().await.unwrap();
    let path = theirs.await.unwrap();
    assert!(path.contains("/_c_") && path.contains("-lock-"), "{path}");
    // …and dlock waits behind it (it held 300ms after its grant; it may be gone already).
    let b = locker(&zk.url());
    let next = b.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(next.fencing_token() > 0);
    next.release().await.unwrap();
    assert!(
        line_settles(&client, &key, 0).await.is_empty(),
        "nodes left behind"
    );
    // The empty container is removed by the server (checked every 500ms here).
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.check_stat(&dir).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the empty lock node stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_data_and_never_structure() {
    let zk = server();
    let client = raw(&zk).await;
    let a = locker(&zk.url());
    let base = unique_key("data");
    // `a` and `a/b` are two locks, held at once.
    let parent = a.acquire(&base, LockOptions::new()).await.unwrap();
    let child = a
        .try_acquire(&format!("{base}/b"), Duration::from_secs(30))
        .await
        .unwrap()
        .expect("`a/b` is not part of `a`");
    assert_eq!(
        line(&client, &base).await.len(),
        1,
        "`a/b` went into `a`'s line"
    );
    assert_eq!(line(&client, &format!("{base}%2Fb")).await.len(), 1);
    // An encoded-looking key is a third lock.
    let literal = a
        .try_acquire(&format!("{base}%2Fb"), Duration::from_secs(30))
        .await
        .unwrap()
        .expect("`a%2Fb` is its own lock");
    drop((parent, child, literal));

    // Dots, NUL, control characters and what ZooKeeper refuses: one lock each, one node each.
    let prefixed = Locker::builder()
        .url(zk.url())
        .key_prefix(format!("{}/", unique_key("dir")).replace(':', "-"))
        .build()
        .unwrap();
    let keys = [
        ".",
        "..",
        "../x",
        "a\0b",
        "tab\there",
        "\u{7f}\u{9f}",
        "\u{e000}",
        "/",
        "//x",
    ];
    let mut held = Vec::new();
    for key in keys {
        let guard = prefixed
            .try_acquire(key, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"))
            .unwrap_or_else(|| panic!("{key:?} was busy"));
        let again = prefixed
            .try_acquire(key, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(again.is_none(), "{key:?} did not exclude");
        held.push(guard);
    }
    // While all are held: everything under the prefix's node, one lock node per key (a
    // released key's empty lock node may be removed at any time after, so not then).
    let dir = format!("/{}", prefixed.key_prefix().trim_end_matches('/'));
    let mut nodes = client.list_children(&dir).await.unwrap();
    nodes.sort();
    let mut expected = vec![
        "%2E",
        "%2E%2E",
        "..%2Fx",
        "a%00b",
        "tab%09here",
        "%7F%C2%9F",
        "%EE%80%80",
        "%2F",
        "%2F%2Fx",
    ];
    expected.sort_unstable();
    assert_eq!(nodes, expected);
    for guard in held {
        guard.release().await.unwrap();
    }

    // `/zookeeper` is the server's: a key that would land there is refused, nothing sent.
    let bare = Locker::builder()
        .url(zk.url())
        .key_prefix("")
        .build()
        .unwrap();
    let err = bare
        .acquire("zookeeper", LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    // A prefix that is no path is a configuration error.
    let err = Locker::builder()
        .url(zk.url())
        .key_prefix("/locks/")
        .build()
        .unwrap_err();
    assert!(
        err.is_config() && err.to_string().contains("DLOCK_KEY_PREFIX"),
        "{err}"
    );
}

/// The URL's chroot scopes every lock node; a chroot that does not exist is a `Backend` error
/// at once (asking again cannot create it), naming the chroot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chroot_scopes_the_locks() {
    let zk = server();
    let client = raw(&zk).await;
    let app = format!("/{}", unique_key("app").replace(':', "-"));
    client
        .create(
            &app,
            b"",
            &zookeeper_client::CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let scoped = locker(&format!("{}{app}", zk.url()));
    let key = unique_key("rooted");
    let guard = scoped.acquire(&key, LockOptions::new()).await.unwrap();
    let nodes = client
        .list_children(&format!("{app}/dlock:{key}"))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(
        line(&client, &key).await.is_empty(),
        "a lock outside the chroot"
    );
    // The same key without the chroot is another lock.
    let outside = locker(&zk.url());
    let other = outside
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(other.is_some(), "the chroot did not scope the lock");
    guard.release().await.unwrap();

    let missing = locker(&format!(
        "{}/no-such-chroot-{}",
        zk.url(),
        std::process::id()
    ));
    let started = Instant::now();
    let err = missing.acquire(&key, LockOptions::new()).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("chroot"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_cancelled_waiters_leave_no_node() {
    let zk = server();
    let client = raw(&zk).await;
    let key = unique_key("cancelled");
    let (holder, waiter) = (locker(&zk.url()), locker(&zk.url()));
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    for i in 0..100u64 {
        if i % 2 == 0 {
            // Dropped at a different point of its wait each time (during the create, the line
            // read, the watch, or the pause).
            let wait = waiter.acquire(&key, LockOptions::new().timeout(Duration::from_secs(30)));
            let _ = tokio::time::timeout(Duration::from_millis(i % 13), wait).await;
        } else {
            let err = waiter
                .acquire(
                    &key,
                    LockOptions::new().timeout(Duration::from_millis(i % 7)),
                )
                .await
                .unwrap_err();
            assert!(err.is_timeout(), "{err:?}");
        }
    }
    let nodes = line_settles(&client, &key, 1).await;
    assert_eq!(nodes.len(), 1, "cancelled waiters left nodes: {nodes:?}");
    held.release().await.unwrap();
    assert!(line_settles(&client, &key, 0).await.is_empty());
}

/// The create request is held in a cut proxy past the request timeout and delivered after:
/// the node exists though its creator never heard of it. The retries find it by its uuid and
/// use it: one node in line, never two. A wait that gives up deletes the node its lost create
/// made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_was_lost_is_found_and_used() {
    let zk = server();
    let client = raw(&zk).await;
    let proxy = Proxy::start(zk.port(0));
    let through = Locker::builder()
        .url(format!("zk://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_secs(10))
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    // The session is up before the cut.
    dlock_tests::acquire_and_release(&through, &unique_key("warm")).await;
    let key = unique_key("lost-reply");
    // Held directly, so the lock node exists and the lost create does make a node.
    let holder = locker(&zk.url());
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    proxy.cut();
    let acquiring = {
        let (through, key) = (through.clone(), key.clone());
        tokio::spawn(async move { through.acquire(&key, LockOptions::new()).await })
    };
    // Past the create's request timeout, and a retry's.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        line(&client, &key).await.len(),
        1,
        "the cut let the create through"
    );
    proxy.heal();
    // Delivered now, and retried after: still one node of the waiter's in line.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let nodes = line(&client, &key).await;
    assert_eq!(
        nodes.len(),
        2,
        "a retry put a second node in line: {nodes:?}"
    );
    held.release().await.unwrap();
    let guard = acquiring
        .await
        .unwrap()
        .expect("the retries found their node");
    assert_eq!(line(&client, &key).await.len(), 1);
    guard.release().await.unwrap();
    assert!(line_settles(&client, &key, 0).await.is_empty());

    // A wait that gives up while its create's reply is lost.
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    proxy.cut();
    let err = through
        .acquire(&key, LockOptions::new().timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(err.is_backend() || err.is_timeout(), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    // The create is delivered now; the give-up's cleanup finds the node and deletes it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let nodes = line(&client, &key).await;
    assert_eq!(
        nodes.len(),
        1,
        "the given-up waiter left its node: {nodes:?}"
    );
    held.release().await.unwrap();
}

/// The leader of a 3-server ensemble is killed while a lock is held and waited for: the hold
/// survives (a lost connection inside the session timeout is not loss), the waiter keeps
/// waiting, and gets the lock with a higher fence once it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_and_waited_for() {
    let mut ensemble = ZkEnsemble::start(3);
    let url = ensemble.url();
    let key = unique_key("leader");
    let (a, b) = (locker(&url), locker(&url));
    let held = a.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.acquire(&key, LockOptions::new().timeout(Duration::from_secs(30)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = ensemble.leader().expect("the ensemble has a leader");
    ensemble.kill(leader);
    // A new leader is elected; both sessions live on.
    let deadline = Instant::now() + Duration::from_secs(20);
    while ensemble.leader().is_none() {
        assert!(Instant::now() < deadline, "no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dlock_tests::engines::extend_once_reachable(&held)
        .await
        .expect("the hold survived the failover");
    assert!(held.is_held());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got in beside the holder"
    );
    let fence = held.fencing_token();
    held.release().await.unwrap();
    let second = waiting.await.unwrap().expect("the waiter got the lock");
    assert!(second.fencing_token() > fence);
    second.release().await.unwrap();
    // A new acquisition works on the remaining majority.
    dlock_tests::acquire_and_release(&locker(&url), &key).await;
}

/// A standalone server killed and restarted on its data within the session timeout: the hold
/// survives and still excludes; once every server is down, an acquisition fails with a
/// `Backend` error within its wait, and a hold is lost when its session runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_holds_and_all_down_is_a_backend_error() {
    let mut zk = ZkEnsemble::single();
    let url = zk.url();
    let key = unique_key("restart");
    // The session outlives a restart with room to spare: a connection lost for half of it
    // counts as expired, and a JVM's restart on a loaded machine takes seconds.
    let holder = Locker::builder()
        .url(url.as_str())
        .zk_session_timeout(Duration::from_secs(10))
        .request_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    zk.restart(0);
    dlock_tests::engines::extend_once_reachable(&held)
        .await
        .expect("the hold survived the restart");
    let other = locker(&url);
    assert!(
        other
            .try_acquire(&key, Duration::from_secs(10))
            .await
            .unwrap()
            .is_none(),
        "the restart freed a held lock"
    );
    let fence = held.fencing_token();
    held.release().await.unwrap();
    let next = other.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(next.fencing_token() > fence);

    // Every server down.
    zk.kill_all();
    let err = dlock_tests::engines::error_within_the_wait(&url).await;
    assert!(err.is_backend(), "{err:?}");
    let started = Instant::now();
    let err = holder
        .acquire(
            &unique_key("down"),
            LockOptions::new().timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The holder's session runs out without a server: every hold of it is lost.
    tokio::time::timeout(Duration::from_secs(15), next.lost())
        .await
        .expect("the hold was reported lost once its session could not be kept");
    let err = next.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
}
