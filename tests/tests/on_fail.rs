//! `on_fail = handler` for functions that do not return `Result<T, E: From<LockError>>`: the
//! handler gets the `LockError` when the lock cannot be had and its value is returned, the body
//! not having run; when the lock is free the body's value is returned. Against a real
//! `redis-server`.

use std::sync::atomic::{AtomicBool, Ordering};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_tests::RedisServer;

mod handlers {
    use dlock_runtime::LockError;

    pub(crate) fn busy(_: LockError) -> &'static str {
        "busy"
    }

    /// Which failure it was, and on which key.
    pub(crate) fn describe(error: LockError) -> String {
        match error {
            LockError::Timeout { key, .. } => format!("timeout on {key}"),
            LockError::Lost { key, .. } => format!("lost {key}"),
            other => format!("other: {other}"),
        }
    }
}

#[derive(Debug, PartialEq)]
struct AppError(&'static str);

fn to_app_error(error: LockError) -> Result<u32, AppError> {
    assert!(matches!(error, LockError::Timeout { .. }), "{error:?}");
    Err(AppError("locked"))
}

fn nothing(_: LockError) -> Option<u32> {
    None
}

#[dlock(key = "greet", client = locker, timeout = "0s", on_fail = handlers::busy)]
async fn greet(locker: &Locker, server: &RedisServer, ran: &AtomicBool) -> &'static str {
    ran.store(true, Ordering::SeqCst);
    if server.exists("dlock:greet") {
        "hello"
    } else {
        "hello, unlocked"
    }
}

#[dlock(key = "name:<id>", client = locker, timeout = "0s", on_fail = handlers::describe)]
async fn name(locker: &Locker, server: &RedisServer, id: u32, ran: &AtomicBool) -> String {
    ran.store(true, Ordering::SeqCst);
    format!("{id} held={}", server.exists(&format!("dlock:name:{id}")))
}

/// A `Result` whose error type has no `From<LockError>`.
#[dlock(key = "app", client = locker, timeout = "0s", on_fail = to_app_error)]
async fn app(locker: &Locker, server: &RedisServer) -> Result<u32, AppError> {
    if !server.exists("dlock:app") {
        return Err(AppError("unlocked"));
    }
    Ok(1)
}

/// An `Option`, with `?` on an `Option` in the body.
#[dlock(key = "parse:<text>", client = locker, timeout = "0s", on_fail = nothing)]
async fn parse(locker: &Locker, server: &RedisServer, text: &str) -> Option<u32> {
    let n: u32 = text.parse().ok()?;
    server.exists(&format!("dlock:parse:{text}")).then_some(n)
}

/// Runs `call` with `key` free, then with `key` held by another connection.
async fn free_then_held<T>(
    server: &RedisServer,
    key: &str,
    mut call: impl AsyncFnMut(&Locker, &AtomicBool) -> T,
) -> ((T, bool), (T, bool)) {
    let locker = server.locker();
    let ran = AtomicBool::new(false);
    let free = call(&locker, &ran).await;
    let free = (free, ran.swap(false, Ordering::SeqCst));
    assert!(!server.exists(&format!("dlock:{key}")), "released");
    let holder = server.locker();
    let guard = holder.acquire(key, LockOptions::new()).await.unwrap();
    let held = call(&locker, &ran).await;
    let held = (held, ran.load(Ordering::SeqCst));
    guard.release().await.unwrap();
    (free, held)
}

#[tokio::test]
async fn static_str_return() {
    let server = RedisServer::start();
    let (free, held) = free_then_held(&server, "greet", async |locker, ran| {
        greet(locker, &server, ran).await
    })
    .await;
    assert_eq!(free, ("hello", true));
    assert_eq!(
        held,
        ("busy", false),
        "the handler answered; the body never ran"
    );
}

#[tokio::test]
async fn string_return_gets_the_error() {
    let server = RedisServer::start();
    let (free, held) = free_then_held(&server, "name:5", async |locker, ran| {
        name(locker, &server, 5, ran).await
    })
    .await;
    assert_eq!(free, ("5 held=true".to_owned(), true));
    assert_eq!(held, ("timeout on dlock:name:5".to_owned(), false));
}

#[tokio::test]
async fn result_without_from_lock_error() {
    let server = RedisServer::start();
    let (free, held) =
        free_then_held(&server, "app", async |locker, _| app(locker, &server).await).await;
    assert_eq!(free.0, Ok(1));
    assert_eq!(held.0, Err(AppError("locked")));
}

#[tokio::test]
async fn option_return_with_question_mark() {
    let server = RedisServer::start();
    let (free, held) = free_then_held(&server, "parse:7", async |locker, _| {
        parse(locker, &server, "7").await
    })
    .await;
    assert_eq!(free.0, Some(7));
    assert_eq!(held.0, None);
    let locker = server.locker();
    assert_eq!(parse(&locker, &server, "x").await, None, "`?` on None");
    assert!(!server.exists("dlock:parse:x"));
}
