//! Redis ACL users: an acquisition the server refuses for good (a missing command, script load,
//! key type or credential) fails at once with a `Backend` error saying what is missing; a user
//! without channel permissions still releases, with one warning, and its waiters poll.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker};
use dlock_tests::resp::Value;
use dlock_tests::{
    Captured, RedisServer,
    engines::{acl_rule_without, refused_within, slow_poller},
    unique_key,
};

/// Creates `dlock-app` with the README's rule, minus the words `without`, and returns a locker
/// logged in as it that would wait 10s.
fn user_without(server: &RedisServer, without: &[&str]) -> Locker {
    let (rule, password) = acl_rule_without(without);
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.command(&args).ok(), Some(Value::Okay));
    Locker::builder()
        .redis_url(format!(
            "redis://dlock-app:{password}@127.0.0.1:{}",
            server.port()
        ))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Acquires with a 10s wait and returns the error, checking it came at once.
async fn refused_at_once(locker: &Locker, key: &str) -> LockError {
    refused_within(locker, key, Duration::from_secs(3)).await
}

#[tokio::test]
async fn a_user_without_evalsha_fails_at_once() {
    let server = RedisServer::start();
    let locker = user_without(&server, &["+evalsha"]);
    let err = refused_at_once(&locker, &unique_key("no-evalsha")).await;
    assert!(err.to_string().contains("ACL rule"), "{err}");
}

#[tokio::test]
async fn a_user_who_may_not_load_scripts_fails_at_once() {
    let server = RedisServer::start();
    let locker = user_without(&server, &["+script|load"]);
    let err = refused_at_once(&locker, &unique_key("no-load")).await;
    assert!(err.to_string().contains("ACL rule"), "{err}");
}

/// The script's own `GETSET` (for the fencing token) is denied after its `SET` ran: the error
/// says so at once, and the half-set lock is removed by token rather than left to its lease.
#[tokio::test]
async fn a_command_denied_inside_the_script_fails_at_once_and_leaves_no_lock() {
    let server = RedisServer::start();
    let locker = user_without(&server, &["+getset"]);
    let key = unique_key("no-getset");
    let err = refused_at_once(&locker, &key).await;
    assert!(err.to_string().contains("ACL rule"), "{err}");
    assert!(
        server
            .gone_within(&format!("dlock:{key}"), Duration::from_secs(2))
            .await,
        "the half-set lock was left behind"
    );
}

#[tokio::test]
async fn a_key_outside_the_users_pattern_fails_at_once() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .redis_url({
            let _ = user_without(&server, &[]);
            format!("redis://dlock-app:acl-test-pw@127.0.0.1:{}", server.port())
        })
        .key_prefix("other:")
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let err = refused_at_once(&locker, &unique_key("outside")).await;
    assert!(err.to_string().contains("ACL rule"), "{err}");
}

#[tokio::test]
async fn a_lock_key_of_another_type_fails_at_once() {
    let server = RedisServer::start();
    let key = unique_key("list");
    assert!(
        server
            .command(&["RPUSH", &format!("dlock:{key}"), "x"])
            .is_ok_and(|reply| matches!(reply, Value::Int(_)))
    );
    let locker = Locker::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let err = refused_at_once(&locker, &key).await;
    assert!(err.to_string().contains("another type"), "{err}");
}

#[tokio::test]
async fn refused_credentials_fail_at_once() {
    let server = RedisServer::start();
    let _ = user_without(&server, &[]);
    let locker = Locker::builder()
        .redis_url(format!(
            "redis://dlock-app:wrong-pw@127.0.0.1:{}",
            server.port()
        ))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let err = refused_at_once(&locker, &unique_key("creds")).await;
    assert!(err.to_string().contains("credentials"), "{err}");
    assert!(!format!("{err:?}").contains("wrong-pw"), "{err:?}");
}

/// Without channel permissions: releases succeed (the key is gone), the refused PUBLISH and
/// SUBSCRIBE are each reported once as a `warn` naming the channel permission, and a waiter
/// still gets the lock by polling. (A release publishes only while a waiter's place is in the
/// key's queue: the holder's releases with a waiter are refused twice, and said once.)
#[test]
fn a_user_without_channels_releases_warns_once_and_polls() {
    let server = RedisServer::start();
    let captured = Captured::default();
    captured.block_on(tracing::Level::WARN, async {
        let holder = user_without(&server, &["&dlock:*"]);
        let waiter = Locker::builder()
            .redis_url(format!(
                "redis://dlock-app:acl-test-pw@127.0.0.1:{}",
                server.port()
            ))
            .build()
            .unwrap();
        let key = unique_key("no-channels");
        for _ in 0..3 {
            let guard = holder.acquire(&key, LockOptions::new()).await.unwrap();
            guard.release().await.expect("a release that deleted is Ok");
            assert!(!server.exists(&format!("dlock:{key}")));
        }
        for _ in 0..2 {
            let guard = holder.acquire(&key, LockOptions::new()).await.unwrap();
            let waiting = tokio::spawn({
                let (waiter, key) = (waiter.clone(), key.clone());
                async move {
                    waiter
                        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(5)))
                        .await
                }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.release().await.unwrap();
            let second = waiting
                .await
                .unwrap()
                .expect("the waiter polled its way in");
            second.release().await.unwrap();
        }
    });
    let log = captured.text();
    // Once per locker: the holder's two releases a waiter waited for were refused; nobody
    // waited for the others (nothing to publish).
    assert_eq!(
        log.matches("may not PUBLISH").count(),
        1,
        "one warning per locker for the refused notifications:\n{log}"
    );
    assert_eq!(
        log.matches("may not SUBSCRIBE").count(),
        1,
        "one warning for the refused subscription:\n{log}"
    );
    assert!(log.contains("&<prefix>*"), "{log}");
    assert!(
        log.contains("lacks the channel permission `&<prefix>*`"),
        "the refused subscription blames the channel pattern, not the command:\n{log}"
    );
    assert!(!log.contains("acl-test-pw"), "{log}");
}

/// Every command dlock's Lua scripts call (`redis.call('NAME'` or `redis.pcall('NAME'`, in the
/// Redis and the RedLock engines' scripts; a command passed in as an argument is the
/// notification's, `PUBLISH` or `SPUBLISH`) is one docs/redis.md's rule grants: a script that
/// called one it lacks failed only where that command ran (leave.lua's `EXISTS`, reached when a
/// place leaves while the key is free: the error was logged at `debug` and the next waiter polled
/// instead of being woken). Checked to fail with `EXISTS` back in leave.lua.
#[test]
fn every_command_the_scripts_call_is_in_the_rule() {
    let rule = dlock_tests::engines::readme_acl_rule();
    let backend = concat!(env!("CARGO_MANIFEST_DIR"), "/../dlock-runtime/src/backend");
    let mut called = Vec::new();
    for dir in ["redis", "redlock"] {
        let entries = std::fs::read_dir(format!("{backend}/{dir}")).expect("the engine's sources");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_none_or(|e| e != "lua") {
                continue;
            }
            let script = std::fs::read_to_string(&path).expect("a script");
            for call in ["redis.call(", "redis.pcall("] {
                for (at, _) in script.match_indices(call) {
                    let rest = &script[at + call.len()..];
                    let name = match rest.chars().next() {
                        Some(quote @ ('\'' | '"')) => {
                            let rest = &rest[1..];
                            rest[..rest.find(quote).expect("a quoted command")].to_owned()
                        }
                        // A command passed in (`ARGV[n]`, or a local `publish` holding it):
                        // only the notification's, `PUBLISH` or (on a Cluster) `SPUBLISH`, as
                        // the engine's `publish_command` sends it.
                        _ if rest.starts_with("ARGV[") || rest.starts_with("publish,") => {
                            for passed in ["publish", "spublish"] {
                                called.push((passed.to_owned(), path.clone()));
                            }
                            continue;
                        }
                        _ => panic!(
                            "{}: a command neither literal nor passed in",
                            path.display()
                        ),
                    };
                    called.push((name.to_ascii_lowercase(), path.clone()));
                }
            }
        }
    }
    assert!(called.len() > 20, "found the scripts' calls: {called:?}");
    let missing: Vec<_> = called
        .iter()
        .filter(|(name, _)| !rule.contains(&format!("+{name}")))
        .collect();
    assert!(
        missing.is_empty(),
        "commands the scripts call that docs/redis.md's rule does not grant: {missing:?}"
    );
}

/// As the rule's user: when the key is free (deleted by hand here, so no release announced it)
/// and the process whose place is first in line stops waiting, its place leaves and the place
/// then first is woken, on its channel. Lockers that retry only every 3s: the other waiter gets
/// the lock within a second of the first one's cancellation. Checked to fail with leave.lua's
/// `EXISTS` back (not in the rule: the leave failed, and the waiter slept until its poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_leaving_a_free_key_wakes_the_next_place() {
    let server = RedisServer::start();
    let (rule, password) = acl_rule_without(&[]);
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.command(&args).ok(), Some(Value::Okay));
    let url = format!("redis://dlock-app:{password}@127.0.0.1:{}", server.port());
    let locker = || {
        slow_poller(&url)
            .expire(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (holder, first, second) = (locker(), locker(), locker());
    let key = unique_key("leaving");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let wait = |locker: Locker| {
        let key = key.clone();
        tokio::spawn(async move { locker.acquire(&key, LockOptions::new()).await })
    };
    let first = wait(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = wait(second);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished() && !second.is_finished(), "both wait");
    let deleted = server.command(&["DEL", &format!("dlock:{key}")]);
    assert_eq!(deleted.ok(), Some(Value::Int(1)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancelled = tokio::time::Instant::now();
    first.abort();
    let next = second
        .await
        .unwrap()
        .expect("the second waiter got the lock");
    assert!(
        cancelled.elapsed() < Duration::from_secs(1),
        "the second waiter got the lock {:?} after the first one stopped waiting: it polled",
        cancelled.elapsed()
    );
    next.release().await.unwrap();
    drop(held);
}
