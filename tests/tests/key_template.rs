//! The key template at run time, against a real `redis-server`: the lock's name in Redis is
//! exactly `dlock:` followed by the template with its placeholders filled in; that key exists
//! while the body runs and is gone when the call returns. Free functions keep their visibility,
//! docs and attributes.

use std::{
    fmt,
    sync::{Arc, atomic::AtomicU64},
};

use dlock_runtime::{LockError, Locker, dlock};
use dlock_tests::{RedisServer, racy_increment};

/// Whether `key` exists while the body runs, with the body's own value.
type Seen<T> = Result<(bool, T), LockError>;

/// Public, documented, with a `#[must_use]` that must survive the expansion.
#[must_use = "the order is only created when awaited"]
#[dlock(key = "order:<id>:<qty>", client = locker)]
pub async fn create_order(locker: &Locker, server: &RedisServer, id: u64, qty: u32) -> Seen<u64> {
    Ok((
        server.exists(&format!("dlock:order:{id}:{qty}")),
        id * u64::from(qty),
    ))
}

/// `pub(crate)`, and a `cfg` that keeps exactly one of two definitions: were the attribute to
/// drop it, the function would be defined twice.
#[cfg(not(any()))]
#[dlock(key = "ship:<id>", client = locker)]
pub(crate) async fn ship(locker: &Locker, server: &RedisServer, id: String) -> Seen<String> {
    // `id` was borrowed to build the key: the body still owns it.
    Ok((server.exists(&format!("dlock:ship:{id}")), id))
}

#[cfg(any())]
pub(crate) async fn ship(locker: &Locker, server: &RedisServer, id: String) -> Seen<String> {
    unreachable!()
}

struct Request {
    tenant: String,
    user: (u64, u8),
}

#[dlock(key = "user:<req.tenant>/<req.user.0>", client = locker)]
async fn fields(locker: &Locker, server: &RedisServer, req: &Request) -> Seen<u8> {
    Ok((server.exists("dlock:user:acme/7"), req.user.1))
}

/// `<<` is a literal `<`, a lone `>` and braces are text.
#[dlock(key = "cmp:a<<b>c{<name>}", client = locker)]
async fn escapes(locker: &Locker, server: &RedisServer, name: &str) -> Seen<()> {
    Ok((server.exists(&format!("dlock:cmp:a<b>c{{{name}}}")), ()))
}

struct Sku(&'static str);

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SKU-{}", self.0.to_uppercase())
    }
}

/// A placeholder is formatted with its `Display`, and a raw identifier names its parameter.
#[dlock(key = "stock:<sku>:<r#type>:ü", client = locker)]
async fn display(locker: &Locker, server: &RedisServer, sku: Sku, r#type: u8) -> Seen<()> {
    let _ = sku;
    Ok((server.exists(&format!("dlock:stock:SKU-AB:{type}:ü")), ()))
}

/// Text only.
#[dlock(key = "nightly-report", client = locker)]
async fn text_only(locker: &Locker, server: &RedisServer) -> Seen<()> {
    Ok((server.exists("dlock:nightly-report"), ()))
}

#[tokio::test]
async fn placeholders_are_filled_from_the_arguments() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(
        create_order(&locker, &server, 42, 3).await.unwrap(),
        (true, 126)
    );
    assert!(
        !server.exists("dlock:order:42:3"),
        "released after the call"
    );
}

#[tokio::test]
async fn arguments_are_borrowed_not_moved() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(
        ship(&locker, &server, "A-17".to_owned()).await.unwrap(),
        (true, "A-17".to_owned())
    );
    assert!(!server.exists("dlock:ship:A-17"));
}

#[tokio::test]
async fn field_and_tuple_index_placeholders() {
    let server = RedisServer::start();
    let locker = server.locker();
    let req = Request {
        tenant: "acme".to_owned(),
        user: (7, 9),
    };
    assert_eq!(fields(&locker, &server, &req).await.unwrap(), (true, 9));
    assert!(!server.exists("dlock:user:acme/7"));
}

#[tokio::test]
async fn escaped_angle_brackets_and_braces_are_literal() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert!(escapes(&locker, &server, "n").await.unwrap().0);
    assert!(!server.exists("dlock:cmp:a<b>c{n}"));
}

#[tokio::test]
async fn display_and_raw_identifiers() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert!(display(&locker, &server, Sku("ab"), 5).await.unwrap().0);
    assert!(!server.exists("dlock:stock:SKU-AB:5:ü"));
    assert!(text_only(&locker, &server).await.unwrap().0);
    assert!(!server.exists("dlock:nightly-report"));
}

#[dlock(key = "counter:<id>", client = &locker)]
async fn bump(locker: Locker, counter: Arc<AtomicU64>, id: u64) -> Result<(), LockError> {
    racy_increment(&counter).await;
    Ok(())
}

/// Eight tasks, each with its own connection, increment a shared counter non-atomically under
/// the same key: none loses an update. A second key is never blocked by the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_excludes_across_connections() {
    let server = RedisServer::start();
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| tokio::spawn(bump(server.locker(), counter.clone(), 1)))
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(counter.load(std::sync::atomic::Ordering::SeqCst), 8);
    assert!(!server.exists("dlock:counter:1"));
}

/// Different keys do not exclude each other: a call on `order:2` runs while `order:1` is held.
#[tokio::test]
async fn different_keys_run_beside_each_other() {
    let server = RedisServer::start();
    let holder = server.locker();
    let _held = holder
        .acquire("order:1:1", dlock_runtime::LockOptions::new())
        .await
        .unwrap();
    let locker = server.locker();
    assert_eq!(
        create_order(&locker, &server, 2, 1).await.unwrap(),
        (true, 2)
    );
}
