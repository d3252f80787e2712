//! The ZooKeeper engine beyond the shared suites: the node layout (Curator's, checked with a raw
//! client and against `zookeeper-client`'s own Curator-compatible lock; Curator's semaphore and
//! read/write nodes made by hand), keys as data, cancelled waiters, a create (and a permit's
//! grant) whose reply was lost, 4 OS processes, and faults: the leader killed, a holder frozen
//! past its session, a holder cut off past it, a restart, every server down.
//!
//! One standalone server is shared by the tests that do not break it; each fault test starts the
//! deployment it breaks.

use std::{
    sync::{Mutex, Weak},
    time::Duration,
};

use dlock_runtime::{LockKind, LockOptions, Locker};
use dlock_tests::{proxy::Proxy, unique_key, zookeeper::ZkEnsemble};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

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
    match zk.list_children(&format!("/dlock:/{key}")).await {
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
        .check_stat(&format!("/dlock:/{key}/{node}"))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(stat.ephemeral_owner, 0, "not ephemeral");
    // The lock node is a container: it goes once its line is empty.
    let parent = client
        .check_stat(&format!("/dlock:/{key}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.ephemeral_owner, 0);
    // Every lock is a child of the prefix's node: ZooKeeper keeps metrics per top-level node
    // and never drops them, so a key must not make one.
    let top = client.list_children("/").await.unwrap();
    assert!(top.iter().any(|n| n == "dlock:"), "{top:?}");
    assert!(
        !top.iter().any(|n| n.starts_with("dlock:") && n != "dlock:"),
        "a lock node at the root: {top:?}"
    );

    // The client's own Curator-compatible recipe waits behind dlock's holder…
    let dir = format!("/dlock:/{key}");
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
        .list_children(&format!("{app}/dlock:/{key}"))
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

/// The client counts its session over before the server can have expired it: with the
/// connection silently cut (packets held, TCP still up), once the server has expired the session
/// (the holder's node gone, the lock free for another client), the hold already says it is lost.
/// (The request timeout plays no part on ZooKeeper: the session's state is watched on its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_hold_is_lost_before_the_server_expires_its_session() {
    let zk = server();
    let client = raw(&zk).await;
    let proxy = Proxy::start(zk.port(0));
    let through = Locker::builder()
        .url(format!(
            "zk://127.0.0.1:{}?session_timeout=3s",
            proxy.port()
        ))
        .request_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let key = unique_key("session-under-request-timeout");
    let guard = through
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(120)))
        .await
        .unwrap();
    assert_eq!(line(&client, &key).await.len(), 1, "the holder's node");
    proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !line(&client, &key).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the server never expired the cut-off session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !guard.is_held(),
        "the server expired the session (another client could take the lock) while the hold \
         still counted itself held"
    );
    proxy.heal();
    drop(guard);
}

/// `path` has no children, or is gone: an empty container node may be removed by the server
/// at any time (the harness's servers check every 500ms).
async fn assert_empty_or_gone(client: &zookeeper_client::Client, path: &str) {
    match client.list_children(path).await {
        Ok(children) => assert!(children.is_empty(), "{path}: {children:?}"),
        Err(zookeeper_client::Error::NoNode) => {}
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// Curator's semaphore (`InterProcessSemaphoreV2`) and read/write lock
/// (`InterProcessReadWriteLock`), their nodes made by hand with a raw client as a Curator client
/// makes them: dlock counts Curator's leases, waits behind a Curator acquirer in the
/// semaphore's internal line, and waits for Curator's writers and readers as for its own; its
/// own nodes are named as Curator names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_rw_locks_are_curators() {
    let zk = server();
    let client = raw(&zk).await;
    let acls = Acls::anyone_all();
    let sequential = CreateMode::EphemeralSequential.with_acls(acls);
    let container = CreateMode::Container.with_acls(acls);
    let now = || LockOptions::new().timeout(Duration::ZERO);
    let (a, b) = (locker(&zk.url()), locker(&zk.url()));

    // Two permits of three held by Curator clients: their leases in `leases`, whose data
    // Curator leaves empty.
    let key = unique_key("curator-permits");
    let (leases, locks) = (
        format!("/dlock:/{key}/leases"),
        format!("/dlock:/{key}/locks"),
    );
    client.mkdir(&leases, &container).await.unwrap();
    let mut theirs = Vec::new();
    for uuid in [
        "8e2f0c9a-1b2c-4d5e-8f90-123456789abc",
        "0b6a4e0e-3f0a-4c11-9d2e-abcdefabcdef",
    ] {
        let name = format!("_c_{uuid}-lease-");
        let (_, seq) = client
            .create(&format!("{leases}/{name}"), b"10.0.0.7", &sequential)
            .await
            .unwrap();
        theirs.push(format!("{name}{seq}"));
    }
    // The third permit is dlock's; a fourth waits.
    let mine = a.acquire_permit(&key, 3, now()).await.unwrap();
    let full = b.acquire_permit(&key, 3, now()).await;
    assert!(full.is_err_and(|e| e.is_timeout()), "a fourth of 3 permits");
    let held = client.list_children(&leases).await.unwrap();
    assert_eq!(held.len(), 3, "{held:?}");
    let lease = held.iter().find(|l| !theirs.contains(l)).unwrap();
    // `_c_<uuid>-lease-<10 digits>`, ephemeral, the holder's record its data, its `czxid` the
    // fence; the node in the internal line went with the grant.
    let (protected, seq) = lease.rsplit_once("-lease-").unwrap();
    assert!(
        protected.starts_with("_c_") && protected.len() == 3 + 36,
        "{lease}"
    );
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "{lease}"
    );
    let (data, stat) = client.get_data(&format!("{leases}/{lease}")).await.unwrap();
    assert_ne!(stat.ephemeral_owner, 0, "not ephemeral");
    let record = String::from_utf8(data).unwrap();
    assert!(
        record.contains(&format!("pid={}", std::process::id())),
        "{record}"
    );
    assert_eq!(mine.fencing_token(), u64::try_from(stat.czxid).unwrap());
    assert_empty_or_gone(&client, &locks).await;
    // An operator counts Curator's leases with dlock's; Curator records no count, so the count
    // said is the one held, and its (empty) record stays while its leases are held.
    let info = b.inspect(&key).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::semaphore(3), 3));
    assert!(client.get_data(&leases).await.unwrap().0.is_empty());
    // A mutex on Curator's semaphore is refused.
    let mutex = b.acquire(&key, now()).await;
    assert!(
        mutex.is_err_and(|e| e.is_conflict()),
        "a mutex on a semaphore"
    );

    // A Curator acquirer first in the internal line (it holds the internal mutex while it
    // counts): dlock waits behind it though a permit is free.
    let returned = theirs.pop().unwrap();
    client
        .delete(&format!("{leases}/{returned}"), None)
        .await
        .unwrap();
    let name = "_c_5d1e2f3a-4b5c-4d6e-8f70-0123456789ab-lock-";
    // `locks` is an empty container by now, which the server may remove at any check (CI once
    // found it gone here): made again, and the create tried again, as Curator does.
    let mut made = None;
    for _ in 0..5 {
        let _ = client.mkdir(&locks, &container).await;
        match client
            .create(&format!("{locks}/{name}"), b"", &sequential)
            .await
        {
            Ok(created) => {
                made = Some(created);
                break;
            }
            Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => panic!("create in {locks}: {e}"),
        }
    }
    let (_, seq) = made.expect("a node in the internal line");
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.acquire_permit(&key, 3, LockOptions::new().timeout(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "dlock passed Curator's acquirer in the internal line"
    );
    assert_eq!(client.list_children(&locks).await.unwrap().len(), 2);
    client
        .delete(&format!("{locks}/{name}{seq}"), None)
        .await
        .unwrap();
    let second = waiting
        .await
        .unwrap()
        .expect("the permit after Curator's acquirer");
    assert!(second.fencing_token() > mine.fencing_token());
    second.release().await.unwrap();
    mine.release().await.unwrap();
    assert_eq!(client.list_children(&leases).await.unwrap(), theirs);
    assert_empty_or_gone(&client, &locks).await;
    client
        .delete(&format!("{leases}/{}", theirs[0]), None)
        .await
        .unwrap();

    // Read/write: a Curator writer holds (its `__WRIT__` node first); dlock's readers wait.
    let key = unique_key("curator-rw");
    let dir = format!("/dlock:/{key}");
    client.mkdir(&dir, &container).await.unwrap();
    let writer = "_c_1a2b3c4d-0000-4000-8000-00000000000a-__WRIT__";
    let (_, seq) = client
        .create(&format!("{dir}/{writer}"), b"", &sequential)
        .await
        .unwrap();
    let read = a.acquire_read(&key, now()).await;
    assert!(read.is_err_and(|e| e.is_timeout()), "a read beside a write");
    let reading = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            a.acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reading.is_finished(), "dlock read beside Curator's writer");
    client
        .delete(&format!("{dir}/{writer}{seq}"), None)
        .await
        .unwrap();
    let reader = reading.await.unwrap().expect("the read after the write");
    let nodes = line(&client, &key).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let (protected, seq) = nodes[0].rsplit_once("-__READ__").unwrap();
    assert!(
        protected.starts_with("_c_") && protected.len() == 3 + 36 && seq.len() == 10,
        "{nodes:?}"
    );
    // A Curator reader beside dlock's; a dlock writer waits for both.
    let their_reader = "_c_1a2b3c4d-0000-4000-8000-00000000000b-__READ__";
    let (_, seq) = client
        .create(&format!("{dir}/{their_reader}"), b"", &sequential)
        .await
        .unwrap();
    let write = b.acquire_write(&key, now()).await;
    assert!(write.is_err_and(|e| e.is_timeout()), "a write beside reads");
    reader.release().await.unwrap();
    let write = b.acquire_write(&key, now()).await;
    assert!(
        write.is_err_and(|e| e.is_timeout()),
        "a write beside Curator's read"
    );
    client
        .delete(&format!("{dir}/{their_reader}{seq}"), None)
        .await
        .unwrap();
    let writer = b.acquire_write(&key, now()).await.unwrap();
    let nodes = line(&client, &key).await;
    assert!(
        nodes.len() == 1 && nodes[0].contains("-__WRIT__"),
        "{nodes:?}"
    );
    writer.release().await.unwrap();
    assert!(line_settles(&client, &key, 0).await.is_empty());
}

/// The reply to a permit's grant (the transaction that makes its lease) is lost, the
/// transaction carried out: the retries find the lease by its uuid and hold with it, with a
/// new fence, never a second lease. A wait that gives up while that reply is lost leaves
/// neither its lease nor its node in the internal line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_grant_reply_was_lost_is_found_and_used() {
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
    let key = unique_key("lost-grant");
    // `line` reads the children of `/dlock:/<key>`: these are the semaphore's.
    let (leases, locks) = (format!("{key}/leases"), format!("{key}/locks"));
    // The grant's transaction is the request that names the lease.
    proxy.cut_replies_on(b"-lease-");
    let acquiring = {
        let (through, key) = (through.clone(), key.clone());
        tokio::spawn(async move { through.acquire_permit(&key, 2, LockOptions::new()).await })
    };
    // Past the transaction's request timeout, and a retry's.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(proxy.replies_cut(), "the grant was never sent");
    let made = line(&client, &leases).await;
    assert_eq!(made.len(), 1, "{made:?}");
    proxy.heal();
    let permit = acquiring
        .await
        .unwrap()
        .expect("the retries found their lease");
    assert_eq!(line(&client, &leases).await, made, "a second lease");
    assert!(line(&client, &locks).await.is_empty());
    let (_, stat) = client
        .get_data(&format!("/dlock:/{leases}/{}", made[0]))
        .await
        .unwrap();
    assert!(stat.mzxid > stat.czxid, "the lease was not re-written");
    assert_eq!(permit.fencing_token(), u64::try_from(stat.mzxid).unwrap());
    permit.release().await.unwrap();
    assert!(line_settles(&client, &leases, 0).await.is_empty());

    // A wait that gives up while its grant's reply is lost.
    proxy.cut_replies_on(b"-lease-");
    let err = through
        .acquire_permit(
            &key,
            2,
            LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(err.is_backend() || err.is_timeout(), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(line(&client, &leases).await.len(), 1, "no lease was made");
    proxy.heal();
    // The give-up's cleanup finds the lease by its uuid and deletes it.
    assert!(
        line_settles(&client, &leases, 0).await.is_empty(),
        "the given-up permit left its lease"
    );
    assert!(line_settles(&client, &locks, 0).await.is_empty());
}

/// Permit and writer waits given up or dropped at any point of their wait (during the create,
/// the look, the transaction, the watch, the pause) leave no node in the semaphore's internal
/// line, in its leases, nor in the read/write lock's line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_permit_and_writer_waiters_leave_no_node() {
    let zk = server();
    let client = raw(&zk).await;
    let (holder, waiter) = (locker(&zk.url()), locker(&zk.url()));
    let (permits, rw) = (
        unique_key("cancelled-permits"),
        unique_key("cancelled-writers"),
    );
    let permit = holder
        .acquire_permit(&permits, 1, LockOptions::new())
        .await
        .unwrap();
    let reader = holder.acquire_read(&rw, LockOptions::new()).await.unwrap();
    let long = || LockOptions::new().timeout(Duration::from_secs(30));
    for i in 0..40u64 {
        if i % 2 == 0 {
            let wait = waiter.acquire_permit(&permits, 1, long());
            let _ = tokio::time::timeout(Duration::from_millis(i % 13), wait).await;
            let wait = waiter.acquire_write(&rw, long());
            let _ = tokio::time::timeout(Duration::from_millis(i % 13), wait).await;
        } else {
            let short = || LockOptions::new().timeout(Duration::from_millis(i % 7));
            let err = waiter
                .acquire_permit(&permits, 1, short())
                .await
                .unwrap_err();
            assert!(err.is_timeout(), "{err:?}");
            let err = waiter.acquire_write(&rw, short()).await.unwrap_err();
            assert!(err.is_timeout(), "{err:?}");
        }
    }
    let (leases, locks) = (format!("{permits}/leases"), format!("{permits}/locks"));
    let left = line_settles(&client, &locks, 0).await;
    assert!(left.is_empty(), "cancelled permits left nodes: {left:?}");
    assert_eq!(line_settles(&client, &leases, 1).await.len(), 1);
    let left = line_settles(&client, &rw, 1).await;
    assert_eq!(left.len(), 1, "cancelled writers left nodes: {left:?}");
    permit.release().await.unwrap();
    reader.release().await.unwrap();
    assert!(line_settles(&client, &leases, 0).await.is_empty());
    assert!(line_settles(&client, &rw, 0).await.is_empty());
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
    // The session outlives a restart with room to spare: a connection lost for 0.45 of it
    // counts as expired, and a JVM's restart on a loaded machine takes seconds (more than the
    // 4.5s of a 10s session once in CI).
    let holder = Locker::builder()
        .url(url.as_str())
        .zk_session_timeout(Duration::from_secs(20))
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

/// A short hold counts its lease from the grant, after the session opened (here slowly,
/// through a proxy that holds the bytes back): before, the lease counted from before the
/// session and a 1s hold on a fresh locker was born lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_hold_counts_from_the_grant_after_a_slow_session() {
    let zk = server();
    let proxy = Proxy::start(zk.port(0));
    let through = Locker::builder()
        .url(format!("zk://127.0.0.1:{}", proxy.port()))
        .request_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    dlock_tests::engines::short_hold_after_a_slow_session(&through, &proxy).await;
}
