//! The events dlock emits, captured from a real subscriber: each one named in the docs is there,
//! at its level, and no token or password appears in any of them.

use std::time::Duration;

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::resp::Value;
use dlock_tests::{Captured, RedisServer, unique_key};
use redis::Commands as _;

#[test]
fn events_are_emitted_without_secrets() {
    let server = RedisServer::start();
    assert_eq!(
        server
            .command(&["CONFIG", "SET", "requirepass", "pw-secret-1"])
            .ok(),
        Some(Value::Okay)
    );
    let captured = Captured::default();
    let url = format!("redis://:pw-secret-1@127.0.0.1:{}", server.port());
    let key = unique_key("traced");
    let mut tokens = Vec::new();
    captured.block_on(tracing::Level::DEBUG, async {
        let locker = Locker::builder().redis_url(&url).build().unwrap();
        let mut redis = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
        let value: String = redis.get(format!("dlock:{key}")).unwrap();
        tokens.push(value);
        // timed out
        assert!(
            locker
                .acquire(&key, LockOptions::new().timeout(Duration::from_millis(50)))
                .await
                .is_err()
        );
        guard.release().await.unwrap();
        // lost: the lease runs out under the holder
        let guard = locker
            .acquire(&key, LockOptions::new().expire(Duration::from_millis(100)))
            .await
            .unwrap();
        let value: String = redis.get(format!("dlock:{key}")).unwrap();
        tokens.push(value);
        guard.lost().await;
        // backend error: wrong password
        let bad = Locker::builder()
            .redis_url(format!("redis://:pw-wrong-2@127.0.0.1:{}", server.port()))
            .build()
            .unwrap();
        assert!(
            bad.acquire("x", LockOptions::new().timeout(Duration::from_millis(50)))
                .await
                .is_err()
        );
    });
    let log = captured.text();
    for (level, message) in [
        ("DEBUG", "lock acquired"),
        ("INFO", "lock wait timed out"),
        ("DEBUG", "lock released"),
        ("WARN", "lock lost while held"),
        ("ERROR", "lock backend"),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(level) && l.contains(message)),
            "no {level} `{message}` event in:\n{log}"
        );
    }
    assert!(log.contains("dlock.acquire"), "no acquisition span:\n{log}");
    assert!(
        log.contains("fencing_token="),
        "acquired event lacks the fence:\n{log}"
    );
    for secret in tokens
        .iter()
        .map(String::as_str)
        .chain(["pw-secret-1", "pw-wrong-2"])
    {
        assert!(
            !log.contains(secret),
            "`{secret}` leaked into the log:\n{log}"
        );
    }
}

/// At INFO, with the acquisition span (DEBUG) off: the timeout, the loss and the backend error
/// each name the key and the attribute's key template themselves, and an engine that is down
/// costs one line per failed acquisition, not one per attempt.
#[test]
fn failures_name_their_lock_at_info() {
    use dlock_runtime::{LockError, dlock};

    #[dlock(key = "report:<id>", client = locker, timeout = "50ms")]
    async fn report(locker: &Locker, id: u32) -> Result<(), LockError> {
        let _ = id;
        Ok(())
    }

    #[dlock(key = "short:<id>", client = locker, expire = "100ms", on_lost = "continue")]
    async fn overrun(locker: &Locker, id: u32) -> Result<(), LockError> {
        let _ = id;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(())
    }

    let server = RedisServer::start();
    let captured = Captured::default();
    let id = std::process::id() % 100_000;
    captured.block_on(tracing::Level::INFO, async {
        let locker = Locker::builder().url(server.url()).build().unwrap();
        let held = locker
            .acquire(&format!("report:{id}"), LockOptions::new())
            .await
            .unwrap();
        assert!(report(&locker, id).await.unwrap_err().is_timeout());
        held.release().await.unwrap();
        // `continue`: the body finishes; the loss is only reported.
        overrun(&locker, id).await.unwrap();
        // Nothing listens on this port: every attempt of the second fails.
        let down = Locker::builder()
            .url(format!("redis://127.0.0.1:{}", dlock_tests::free_port()))
            .timeout(Duration::from_millis(600))
            .request_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        assert!(report(&down, id + 1).await.unwrap_err().is_backend());
    });
    let log = captured.text();
    for (level, message, key) in [
        ("INFO", "lock wait timed out", format!("dlock:report:{id}")),
        ("WARN", "lock lost while held", format!("dlock:short:{id}")),
        ("ERROR", "lock backend", format!("dlock:report:{}", id + 1)),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(level) && l.contains(message))
            .unwrap_or_else(|| panic!("no {level} `{message}` event in:\n{log}"));
        let template = key.trim_start_matches("dlock:").split(':').next().unwrap();
        assert!(
            line.contains(&format!("key={key}")) && line.contains(&format!("{template}:<id>")),
            "`{message}` does not name its key and template: {line}"
        );
    }
    let outage = format!("dlock:report:{}", id + 1);
    let lines = log.lines().filter(|l| l.contains(&outage)).count();
    assert_eq!(lines, 1, "the outage was said {lines} times:\n{log}");
}
