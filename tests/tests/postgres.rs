//! The PostgreSQL engine beyond the shared semantic suite: hostile keys, the schema (created on
//! first use, or by the README's DDL for a user without DDL rights), a Unix socket, fair mode's
//! line, four processes on a non-atomic counter, and faults: a server restart while held, connections
//! terminated mid-hold, a frozen server, a frozen holder. Tests that freeze or restart a server
//! start their own; the others share one cluster per binary, each in its own keys or database.

use std::{process::Command, time::Duration};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{PostgresServer, pg, unique_key};
use tokio::time::Instant;

fn locker(url: &str) -> Locker {
    Locker::builder()
        .url(url)
        .timeout(Duration::from_secs(5))
        .expire(Duration::from_secs(10))
        .build()
        .expect("a valid URL")
}

/// A locker whose connections carry `name` as their `application_name`, so a test can
/// terminate exactly them.
fn named_locker(server: &PostgresServer, name: &str, expire: Duration) -> Locker {
    Locker::builder()
        .url(format!("{}?application_name={name}", server.url()))
        .timeout(Duration::from_secs(20))
        .expire(expire)
        .request_timeout(Duration::from_millis(300))
        .build()
        .expect("a valid URL")
}

/// A locker like [`named_locker`]'s that polls every 3s: a quicker hand-off is a wake-up.
fn named_slow_poller(server: &PostgresServer, name: &str, request_timeout: Duration) -> Locker {
    Locker::builder()
        .url(format!("{}?application_name={name}", server.url()))
        .timeout(Duration::from_secs(20))
        .retry(Duration::from_secs(3), Duration::from_secs(3))
        .request_timeout(request_timeout)
        .build()
        .expect("a valid URL")
}

/// Quotes, `;`, comments, backslashes, LIKE wildcards, placeholders and Unicode are data: each
/// key locks exactly itself (the row holds it byte for byte, `%` written `%25`), look-alikes
/// stay free, and the table survives.
#[tokio::test]
async fn hostile_keys_lock_exactly_that_key() {
    let server = pg::shared_server();
    let (a, b) = (locker(&server.url()), locker(&server.url()));
    let db = pg::client(&server.url()).await;
    let base = unique_key("hostile");
    let keys = [
        format!("{base}:'; DROP TABLE dlock_locks; --"),
        format!("{base}:\"quoted\" 'single' ''double''"),
        format!("{base}:back\\slash\\\\ and \\x00 text"),
        format!("{base}:a%"),
        format!("{base}:a_"),
        format!("{base}:$1 $2 ?"),
        format!("{base}:ключ 🔒 鍵 é"),
        format!("{base}:line\nbreak\ttab"),
        format!("{base}:-- comment /* block */"),
    ];
    let mut guards = Vec::new();
    for key in &keys {
        let guard = a
            .acquire(key, LockOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        let stored: Vec<String> = db
            .query(
                "SELECT key FROM dlock_locks WHERE key = $1",
                &[&format!("dlock:{}", key.replace('%', "%25"))],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            stored,
            vec![format!("dlock:{}", key.replace('%', "%25"))],
            "{key:?}"
        );
        assert!(
            b.try_acquire(key, Duration::from_secs(1))
                .await
                .unwrap()
                .is_none(),
            "{key:?} was not excluded"
        );
        guards.push(guard);
    }
    // Look-alikes of the wildcard keys are other keys.
    for other in [
        format!("{base}:ab"),
        format!("{base}:a"),
        format!("{base}:"),
    ] {
        let guard = b.try_acquire(&other, Duration::from_secs(1)).await.unwrap();
        let guard = guard.unwrap_or_else(|| panic!("{other:?} was taken for a wildcard key"));
        // Released before the rows are counted (a dropped guard releases in the background).
        guard.release().await.unwrap();
    }
    let held: i64 = db
        .query_one(
            "SELECT count(*) FROM dlock_locks WHERE key LIKE $1 || '%'",
            &[&format!("dlock:{base}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, i64::try_from(keys.len()).unwrap());
    for guard in guards {
        guard.release().await.unwrap();
    }
    for key in &keys {
        assert!(
            b.try_acquire(key, Duration::from_secs(1))
                .await
                .unwrap()
                .is_some(),
            "{key:?} was not released"
        );
    }
}

/// `text` cannot hold a NUL byte, yet keys are data on every engine: a NUL is stored `%00` (and
/// `%` itself `%25`, so `a\0` and `a%00` stay two locks). A prefix, which is configuration, with
/// a NUL is refused when the locker is built.
#[tokio::test]
async fn a_nul_byte_is_stored_escaped() {
    let server = pg::shared_server();
    let (a, b) = (locker(&server.url()), locker(&server.url()));
    let db = pg::client(&server.url()).await;
    let base = unique_key("nul");
    for (key, stored) in [
        (
            format!("{base}:nul\0byte"),
            format!("dlock:{base}:nul%00byte"),
        ),
        (format!("{base}:\0"), format!("dlock:{base}:%00")),
        (format!("{base}:\0%00"), format!("dlock:{base}:%00%2500")),
    ] {
        let guard = a.acquire(&key, LockOptions::new()).await.unwrap();
        let rows = db
            .query("SELECT 1 FROM dlock_locks WHERE key = $1", &[&stored])
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{key:?} is not stored as {stored:?}");
        let look_alike = b
            .try_acquire(&key.replace('\0', "%00"), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(
            look_alike.is_some(),
            "{key:?} and its `%00` look-alike are one lock"
        );
        guard.release().await.unwrap();
    }
    let err = Locker::builder()
        .url(server.url())
        .key_prefix("app\0:")
        .build()
        .unwrap_err();
    assert!(
        err.is_config() && err.to_string().contains("NUL"),
        "{err:?}"
    );
}

fn fair_waiter(server: &PostgresServer, key: &str, name: &str) -> std::process::Child {
    fair_waiter_with(server, key, name, "on")
}

/// A `fair-waiter` process with `DLOCK_NOTIFY` set to `notify`.
fn fair_waiter_with(
    server: &PostgresServer,
    key: &str,
    name: &str,
    notify: &str,
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
        .args([&server.url(), key, name, "fair-waiter"])
        .env("DLOCK_NOTIFY", notify)
        .spawn()
        .unwrap()
}

/// The live places in `key`'s line.
async fn line_len(db: &tokio_postgres::Client, key: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND gone_at > clock_timestamp()",
        &[&format!("dlock:{key}")],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_for_line(db: &tokio_postgres::Client, key: &str, len: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while line_len(db, key).await != len {
        assert!(Instant::now() < deadline, "the line never reached {len}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to `within`) until `count`, a query of one count whose `$1` is `key` as stored,
/// reads `want`; `what` names it in the failure.
async fn wait_for_count(
    db: &tokio_postgres::Client,
    count: &str,
    key: &str,
    want: i64,
    within: Duration,
    what: &str,
) {
    let deadline = Instant::now() + within;
    loop {
        let now: i64 = db
            .query_one(count, &[&format!("dlock:{key}")])
            .await
            .unwrap()
            .get(0);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now}, never {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server of the test's own with `pg_stat_statements` (counting plans too), and a client of
/// it. No autovacuum: an `ANALYZE` of a table makes every connection plan its statements on it
/// again, at a moment no test chooses.
async fn statements_server() -> (PostgresServer, tokio_postgres::Client) {
    let server = tokio::task::block_in_place(|| {
        PostgresServer::try_start_with(&[
            "shared_preload_libraries=pg_stat_statements",
            "pg_stat_statements.track_planning=on",
            "autovacuum=off",
        ])
    })
    .unwrap();
    let db = pg::client(&server.url()).await;
    db.batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .unwrap();
    (server, db)
}

/// The statements the server has run so far, every client's (the asking included).
async fn statements(db: &tokio_postgres::Client) -> i64 {
    db.query_one("SELECT sum(calls)::bigint FROM pg_stat_statements", &[])
        .await
        .unwrap()
        .get(0)
}

async fn served(db: &tokio_postgres::Client, key: &str) -> Vec<String> {
    db.query(
        "SELECT name FROM dlock_test_order WHERE key = $1 ORDER BY seq",
        &[&key],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A hold taken by a process that released and asked again at once is one no sleeping waiter
/// was refused by; its release must still wake the place first in line (it did not: the key
/// sat free for up to a poll while every waiter slept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_line_after_a_hold_nobody_was_refused_by() {
    dlock_tests::releases_keep_waking_the_line(&pg::shared_server().url()).await;
}

/// A locker's listening connection closes once nobody has waited for a few seconds (every
/// listening backend costs the server at each notifying commit in the database, whoever it is
/// for), and the next waiter opens it again: its wake-up still comes from the release (with a
/// 3s poll, it gets the lock well within a second). Before, a locker that had waited once kept
/// its listening connection for good. The linger counts from the end of a long wait too: after
/// a wait of 10.5s the connection is still open 3s after it ends (counted from the wait's
/// start alone, it closed at the first 3s check after the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_listening_connection_closes_and_comes_back() {
    let server = pg::shared_server();
    let name = format!("idle_listener_{}", std::process::id());
    let holder = locker(&server.url());
    // Time for the listening connection to be made on a busy machine: a waiter that does not
    // have it within the request timeout polls.
    let waiter = named_slow_poller(&server, &name, Duration::from_secs(2));
    let connections = || {
        let sql =
            format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'");
        tokio::task::block_in_place(|| server.sql(&sql))
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    let key = unique_key("idle-listener");
    for (round, wait) in [Duration::from_millis(500), Duration::from_millis(10_500)]
        .into_iter()
        .enumerate()
    {
        let held = holder
            .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
            .await
            .unwrap();
        let waiting = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(&key, LockOptions::new()).await.unwrap();
                let at = Instant::now();
                guard.release().await.unwrap();
                at
            })
        };
        // The listening connection's checks count from when it is made.
        let listening_since = Instant::now();
        while connections() != 2 {
            assert!(
                listening_since.elapsed() < Duration::from_secs(5),
                "round {round}: the waiter's locker never had its connection and a listening one"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep_until(Instant::now() + wait).await;
        let released_at = Instant::now();
        held.release().await.unwrap();
        let woke = waiting.await.unwrap() - released_at;
        assert!(
            woke < Duration::from_secs(1),
            "round {round}: the lock came {woke:?} after the release: the 3s poll, not a wake-up"
        );
        let idle_since = Instant::now();
        if round == 1 {
            // The checks at 3, 6 and 9s saw the wait; the one at 12s sees nobody, 3s after.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(
                connections(),
                2,
                "the listening connection closed within 3s of the end of a 10.5s wait"
            );
        }
        // Closed within the linger (5s) and a check (3s).
        while connections() != 1 {
            assert!(
                idle_since.elapsed() < Duration::from_secs(15),
                "round {round}: the listening connection stayed open with nobody waiting"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let closed_after = idle_since.elapsed();
        assert!(
            closed_after >= Duration::from_secs(3),
            "round {round}: the listening connection closed {closed_after:?} after the last wait, \
             within its linger"
        );
    }
}

/// A waiter whose `LISTEN` is not confirmed within the request timeout (a proxy holds the reply
/// back until after it) polls, and asks for the wake-up again a second later, during its
/// pause: the release after that wakes it, long before its 8s poll. Before, the wait polled to
/// its end (the lock came about 5.5s after the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_not_had_at_first_is_asked_for_again() {
    let server = pg::shared_server();
    let proxy = dlock_tests::proxy::Proxy::start(server.port());
    let through_proxy = pg::url_through(&server, &proxy);
    let holder = locker(&server.url());
    let waiter = Locker::builder()
        .url(through_proxy)
        .timeout(Duration::from_secs(20))
        .retry(Duration::from_secs(8), Duration::from_secs(8))
        .request_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let key = unique_key("rewatch");
    // The waiter's own connection, made before the cut.
    dlock_tests::acquire_and_release(&waiter, &key).await;
    let held = holder
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    proxy.cut_replies_on(b"LISTEN");
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let guard = waiter.acquire(&key, LockOptions::new()).await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !proxy.replies_cut() {
        assert!(Instant::now() < deadline, "the waiter never sent LISTEN");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past the request timeout: the wait goes on without its wake-up.
    tokio::time::sleep(Duration::from_millis(450)).await;
    proxy.heal();
    // The waiter asks again a second after it went without.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let woke = waiting.await.unwrap() - released_at;
    assert!(
        woke < Duration::from_secs(1),
        "the lock came {woke:?} after the release: the 8s poll, not a wake-up"
    );
    waiter.close().await.unwrap();
}

/// A child process killed when dropped: a test that fails leaves no stopped worker behind.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A fair waiter behind a live place, refused by a hold that lapsed (nobody released it), is
/// told there is no holder and sleeps its pause while the place ahead takes the key or lapses:
/// at most one attempt per pause (`pg_stat_statements`; 250-500ms with its wake-up, 10-50ms
/// without), not one every millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_behind_a_place_does_not_spin_on_a_lapsed_hold() {
    let (server, db) = statements_server().await;
    db.batch_execute(pg::ORDER_TABLE).await.unwrap();
    let key = unique_key("lapsed-fair");
    // Kept 5s from now, then lapsing: its release announces nothing.
    let kept = locker(&server.url())
        .acquire(
            &key,
            LockOptions::new().hold_at_least(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    kept.release().await.unwrap();
    // First in line, then frozen: its place lives 10s after its last attempt (4 × 500ms + 4 × 2s).
    let mut ahead = Reaped(
        Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
            .args([&server.url(), &key, "ahead", "fair-waiter"])
            .env("DLOCK_REQUEST_TIMEOUT", "2s")
            .spawn()
            .unwrap(),
    );
    wait_for_line(&db, &key, 1).await;
    dlock_tests::signal(&ahead.0, "-STOP");
    let behind = {
        let (locker, key) = (locker(&server.url()), key.clone());
        tokio::spawn(async move {
            let options = LockOptions::new().fair().timeout(Duration::from_secs(30));
            let guard = locker.acquire(&key, options).await.unwrap();
            guard.release().await.unwrap();
        })
    };
    wait_for_line(&db, &key, 2).await;
    wait_for_count(
        &db,
        "SELECT count(*) FROM dlock_locks WHERE key = $1 AND expires_at <= clock_timestamp()",
        &key,
        1,
        Duration::from_secs(10),
        "lapsed holds",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = statements(&db).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = statements(&db).await - before - 1;
    assert!(!behind.is_finished(), "the waiter passed the place ahead");
    assert_eq!(
        line_len(&db, &key).await,
        2,
        "the frozen place lapsed early"
    );
    assert!(
        asked <= 120,
        "{asked} statements in a second behind a place, on a lapsed hold: the waiter spins"
    );
    eprintln!("{asked} statements in a second");
    // Thawed, the place ahead takes the key, then the waiter does.
    dlock_tests::signal(&ahead.0, "-CONT");
    assert!(ahead.0.wait().unwrap().success());
    behind.await.unwrap();
    assert_eq!(served(&db, &key).await, ["ahead"]);
}

/// Two lockers taking turns on one key, hundreds of hand-offs, with a 3s polling pause: every
/// release that leaves a waiter wakes it, so no acquisition waits for the poll (each is bounded
/// by 2s). A refusal's mark reaches the key's row as it is by then: a waiter refused while the
/// place ahead was taking the key (fair), or while one hold ended and the next began, was
/// marked on no hold and slept until its poll (7% of fair hand-offs between two lockers, 10 to
/// 50ms each with the default pause). Fair mode failed here 2 times in 2 without the upsert;
/// the default half passed without it too (3 runs), and guards it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hand_off_waits_for_the_poll() {
    let server = pg::shared_server();
    let url = server.url();
    for (mode, options) in [
        ("fair", LockOptions::new().fair()),
        ("default", LockOptions::new()),
    ] {
        let key = unique_key("turns");
        let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let locker = Locker::builder()
                    .url(url.clone())
                    .retry(Duration::from_secs(3), Duration::from_secs(3))
                    .build()
                    .unwrap();
                let (key, counter, options) = (key.clone(), counter.clone(), options.clone());
                tokio::spawn(async move {
                    for _ in 0..500 {
                        let guard = locker
                            .acquire(&key, options.clone().timeout(Duration::from_secs(2)))
                            .await
                            .unwrap_or_else(|e| panic!("{mode}: {e}"));
                        // A short hold (a yield between the read and the write): the race is
                        // between a release and the next acquisitions.
                        let seen = counter.load(std::sync::atomic::Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(seen + 1, std::sync::atomic::Ordering::SeqCst);
                        guard.release().await.unwrap();
                    }
                    locker.close().await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            counter.load(std::sync::atomic::Ordering::SeqCst),
            1000,
            "{mode}: holders overlapped"
        );
    }
}

#[tokio::test]
async fn fair_mode_serves_processes_in_arrival_order() {
    served_in_arrival_order("on").await;
}

/// The same without notifications: every waiter polls every 10–50ms, so only the line decides.
#[tokio::test]
async fn fair_mode_serves_polling_processes_in_arrival_order() {
    served_in_arrival_order("off").await;
}

async fn served_in_arrival_order(notify: &str) {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("fair");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let mut children = Vec::new();
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        children.push(fair_waiter_with(&server, &key, name, notify));
        wait_for_line(&db, &key, i64::try_from(i).unwrap() + 1).await;
    }
    held.release().await.unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(served(&db, &key).await, ["a", "b", "c", "d", "e"]);
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM dlock_waiters WHERE key = $1",
            &[&format!("dlock:{key}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the line outlived its waiters");
}

/// A waiter that times out, one that is cancelled and one whose process is killed do not block
/// the waiter behind them.
#[tokio::test]
async fn fair_waiters_that_leave_do_not_block_the_line() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("fair-leave");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new().fair())
        .await
        .unwrap();
    let impatient = {
        let (locker, key) = (locker(&server.url()), key.clone());
        tokio::spawn(async move {
            let options = LockOptions::new()
                .fair()
                .timeout(Duration::from_millis(400));
            locker.acquire(&key, options).await
        })
    };
    wait_for_line(&db, &key, 1).await;
    let cancelled = {
        let (locker, key) = (locker(&server.url()), key.clone());
        tokio::spawn(async move {
            let options = LockOptions::new().fair().timeout(Duration::from_secs(30));
            locker.acquire(&key, options).await
        })
    };
    wait_for_line(&db, &key, 2).await;
    let mut killed = fair_waiter(&server, &key, "killed");
    wait_for_line(&db, &key, 3).await;
    killed.kill().unwrap();
    killed.wait().unwrap();
    let mut patient = fair_waiter(&server, &key, "patient");
    wait_for_line(&db, &key, 4).await;

    assert!(impatient.await.unwrap().unwrap_err().is_timeout());
    cancelled.abort();
    let _ = cancelled.await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while line_len(&db, &key).await > 2 {
        assert!(
            Instant::now() < deadline,
            "the cancelled and timed-out waiters kept their places"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let started = Instant::now();
    assert!(patient.wait().unwrap().success());
    // The killed waiter's place lapses after its liveness (well under this bound).
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the line was blocked for {:?}",
        started.elapsed()
    );
    assert_eq!(served(&db, &key).await, ["patient"]);
}

/// A fresh database: the first acquisition creates the table and the sequence, and a second
/// locker (the schema there already) uses them.
#[tokio::test]
async fn the_schema_is_created_on_first_use() {
    let server = pg::shared_server();
    let url = pg::database(&server, "first_use");
    let db = pg::client(&url).await;
    let exists =
        "SELECT to_regclass('dlock_locks') IS NOT NULL AND to_regclass('dlock_fence') IS NOT NULL";
    assert!(!db.query_one(exists, &[]).await.unwrap().get::<_, bool>(0));
    // Several lockers at once: they take turns creating it.
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let guard = locker(&url)
                    .acquire(&format!("first:{i}"), LockOptions::new())
                    .await
                    .unwrap();
                guard.fencing_token()
            })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap() > 0);
    }
    assert!(db.query_one(exists, &[]).await.unwrap().get::<_, bool>(0));
}

/// The README's DDL, run by an operator, is what the engine expects; a user with only the
/// README's grants then locks, and without the table (and without DDL rights) the error says
/// what to do, at once rather than at the deadline.
#[tokio::test]
async fn the_readme_ddl_and_grants_are_enough_and_a_missing_table_is_a_clear_error() {
    let server = pg::shared_server();
    let readme = include_str!("../../docs/postgres.md");
    let start = readme
        .find("```sql\nCREATE SEQUENCE IF NOT EXISTS dlock_fence;")
        .expect("docs/postgres.md gives the PostgreSQL DDL")
        + "```sql\n".len();
    let ddl = &readme[start..start + readme[start..].find("```").unwrap()];
    assert!(
        ddl.contains("GRANT"),
        "the README's DDL grants the app role"
    );
    server.sql("CREATE ROLE dlock_app LOGIN").unwrap();
    let _ = pg::database(&server, "granted");
    let _ = pg::database(&server, "bare");
    let url_as_app = |db: &str| {
        format!(
            "postgres://dlock_app@127.0.0.1:{}/{db}?sslmode=disable",
            server.port()
        )
    };

    // Without the table: the app role may not create it (PostgreSQL 15: no CREATE on public).
    let bare = Locker::builder()
        .url(url_as_app("bare"))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = bare
        .acquire(&unique_key("bare"), LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("dlock_locks") && text.contains("docs/postgres.md"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refusal waited for the deadline"
    );

    // With the README's DDL and grants, run by the owner.
    let owner = pg::client(&format!(
        "postgres://dlock@127.0.0.1:{}/granted",
        server.port()
    ))
    .await;
    owner.batch_execute(ddl).await.unwrap();
    let app = locker(&url_as_app("granted"));
    let key = unique_key("granted");
    let guard = app.acquire(&key, LockOptions::new()).await.unwrap();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    guard.release().await.unwrap();
    let again = app.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(again.fencing_token() > 1);
    // The semaphores and read/write locks too.
    let permit = app
        .acquire_permit(&unique_key("granted"), 2, LockOptions::new())
        .await
        .unwrap();
    permit.extend(Duration::from_secs(20)).await.unwrap();
    permit.release().await.unwrap();
    let key = unique_key("granted");
    let reader = app.acquire_read(&key, LockOptions::new()).await.unwrap();
    reader.release().await.unwrap();
    let writer = app.acquire_write(&key, LockOptions::new()).await.unwrap();
    writer.release().await.unwrap();
}

/// The tables as an earlier dlock made them (no `dlock_shared`), with `functions` (DDL) made
/// by the same owner, and a new role `role` granted what the README grants the app.
async fn earlier_tables(db: &tokio_postgres::Client, functions: &str, role: &str) {
    db.batch_execute(&format!(
        "CREATE SEQUENCE dlock_fence;
         CREATE TABLE dlock_locks (key text PRIMARY KEY, token text NOT NULL,
             fence bigint NOT NULL, expires_at timestamptz NOT NULL,
             contended boolean NOT NULL DEFAULT false, owner text, acquired_at timestamptz);
         CREATE TABLE dlock_waiters (key text NOT NULL, token text NOT NULL,
             place bigint NOT NULL, gone_at timestamptz NOT NULL, PRIMARY KEY (key, token));
         {functions}
         CREATE ROLE {role} LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_locks, dlock_waiters TO {role};
         GRANT USAGE ON SEQUENCE dlock_fence TO {role};"
    ))
    .await
    .unwrap();
}

/// Tables made before dlock had semaphores and read/write locks: the mutex goes on as before
/// for a user without DDL rights, and the first shared acquisition says how to add what they
/// need; with the rights, it adds it itself.
#[tokio::test]
async fn tables_from_before_the_shared_kinds_get_them_on_first_use() {
    let server = pg::shared_server();
    let url = pg::database(&server, "before_shared");
    earlier_tables(&pg::client(&url).await, "", "dlock_old").await;
    let as_old = locker(&format!(
        "postgres://dlock_old@127.0.0.1:{}/before_shared?sslmode=disable",
        server.port()
    ));
    let guard = as_old
        .acquire(&unique_key("old"), LockOptions::new())
        .await
        .unwrap();
    guard.release().await.unwrap();
    let started = Instant::now();
    let err = as_old
        .acquire_permit(&unique_key("old"), 2, LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        err.to_string().contains("dlock_shared") && err.to_string().contains("docs/postgres.md"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "a refusal waited"
    );

    // The owner's locker makes them; then the old role needs only its grant.
    let owner = locker(&url);
    let permit = owner
        .acquire_permit(&unique_key("old"), 2, LockOptions::new())
        .await
        .unwrap();
    permit.release().await.unwrap();
    pg::client(&url)
        .await
        .batch_execute("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_shared TO dlock_old")
        .await
        .unwrap();
    let reader = as_old
        .acquire_read(&unique_key("old"), LockOptions::new())
        .await
        .unwrap();
    reader.release().await.unwrap();
}

/// `dlock_wake_line` as dlock made it before releases named a place's own channel: every
/// release announced on `dlock_release`.
const EARLIER_WAKE_LINE: &str = "\
CREATE OR REPLACE FUNCTION dlock_wake_line(p_key text, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    woke boolean;
BEGIN
    WITH next AS (
        SELECT left(w.token, 8) AS next FROM dlock_waiters w
         WHERE w.key = p_key AND w.gone_at > clock_timestamp() ORDER BY w.place LIMIT 1
    ), kept AS (
        INSERT INTO dlock_locks (key, token, fence, expires_at, contended)
        SELECT p_key, '00000000000000000000000000000000', p_fence, to_timestamp(0), true
          FROM next
        ON CONFLICT (key) DO NOTHING
    )
    SELECT true INTO woke
      FROM pg_notify('dlock_release', coalesce((SELECT next FROM next), '--------') ||
               CASE WHEN octet_length(p_key) < 7900 THEN p_key ELSE '' END);
    RETURN woke;
END $$;";

/// Three waiters of `url` (each its own locker, polling every 3s) queue for a key `holder`
/// holds, and each gets it from a release's wake-up, in turn.
async fn waiters_woken_in_turn(url: &str, holder: &Locker, db: &tokio_postgres::Client) {
    let key = unique_key("earlier");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let waiter = Locker::builder()
                .url(url)
                .retry(Duration::from_secs(3), Duration::from_secs(3))
                .build()
                .unwrap();
            dlock_tests::spawn_waiter(&waiter, &key)
        })
        .collect();
    wait_for_line(db, &key, 3).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    dlock_tests::woken_in_turn(tasks, released_at).await;
}

/// Tables made by an earlier dlock, whose `dlock_wake_line` announced every release on
/// `dlock_release`: a user who may not replace the function goes on with it, its waiters still
/// woken by each release (they listen there too); the function's owner replaces it at its first
/// acquisition with the one that names the place's own channel.
#[tokio::test]
async fn an_earlier_wake_function_is_replaced_where_the_user_may() {
    let server = pg::shared_server();
    let url = pg::database(&server, "earlier_wake");
    let db = pg::client(&url).await;
    earlier_tables(&db, EARLIER_WAKE_LINE, "dlock_earlier").await;
    let names_places = "SELECT prosrc LIKE '%dlock_wake_%' FROM pg_proc \
                        WHERE oid = to_regprocedure('dlock_wake_line(text,bigint)')::oid";

    let as_user = format!(
        "postgres://dlock_earlier@127.0.0.1:{}/earlier_wake?sslmode=disable",
        server.port()
    );
    waiters_woken_in_turn(&as_user, &locker(&as_user), &db).await;
    assert!(
        !db.query_one(names_places, &[])
            .await
            .unwrap()
            .get::<_, bool>(0),
        "a user without the right replaced the function"
    );

    waiters_woken_in_turn(&url, &locker(&url), &db).await;
    assert!(
        db.query_one(names_places, &[])
            .await
            .unwrap()
            .get::<_, bool>(0),
        "the owner's locker left the earlier function"
    );
}

/// The server's Unix socket, named as libpq does (`%2F`-encoded host).
#[tokio::test]
async fn a_unix_socket_url_works() {
    let server = pg::shared_server();
    let locker = locker(&server.socket_url());
    let key = unique_key("socket");
    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let tcp = self::locker(&server.url());
    assert!(
        tcp.try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "the socket and TCP lockers saw different tables"
    );
    guard.release().await.unwrap();
}

/// Nothing of the URL's password shows in the locker's `Debug` nor in a connection error.
#[tokio::test]
async fn the_password_never_shows() {
    let url = format!(
        "postgres://app:s3cret-pw@127.0.0.1:{}/db",
        dlock_tests::free_port()
    );
    let locker = Locker::builder()
        .url(url.as_str())
        .timeout(Duration::from_millis(300))
        .request_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    assert!(!format!("{locker:?}").contains("s3cret"));
    let err = locker.acquire("k", LockOptions::new()).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// The server restarts while a renewed lease is held: the row survives, so the holder keeps
/// the lock (no false loss), excludes others, renews again, and releases it; a waiter that
/// waited through the restart gets it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_while_held_keeps_the_lock() {
    let mut server = PostgresServer::start();
    let holder = named_locker(&server, "restart_holder", Duration::from_secs(3));
    let waiter = named_locker(&server, "restart_waiter", Duration::from_secs(10));
    let key = unique_key("restart");
    let guard = holder
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let first = guard.fencing_token();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, LockOptions::new()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::task::block_in_place(|| server.restart());
    // Renewals (every second) go through again on a new connection.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(guard.is_held(), "the restart was taken for a loss");
    assert!(
        !waiting.is_finished(),
        "the waiter got in while it was held"
    );
    assert!(
        holder
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock after the release")
        .unwrap()
        .expect("the wait survived the restart");
    assert!(next.fencing_token() > first, "the fence went back");
}

/// `pg_terminate_backend` on every connection of the holder's and the waiter's lockers, over
/// and over during a renewed hold: no false loss, the wait goes on, the release works, and the
/// waiter is woken by it (its own pause is 3s: the listening connection came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_cause_no_false_loss() {
    let server = pg::shared_server();
    let name = format!("terminated_{}", std::process::id());
    let holder = named_locker(&server, &name, Duration::from_millis(900));
    let waiter = named_slow_poller(&server, &name, Duration::from_millis(300));
    let key = unique_key("terminated");
    let guard = holder
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, LockOptions::new()).await })
    };
    let terminate = format!(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = '{name}') t"
    );
    let mut terminated = 0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        terminated += tokio::task::block_in_place(|| server.sql(&terminate))
            .unwrap()
            .parse::<u32>()
            .unwrap();
        assert!(
            guard.is_held(),
            "a terminated connection was taken for a lost lock"
        );
    }
    assert!(terminated >= 4, "nothing was terminated");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        guard.is_held(),
        "renewal did not survive the terminated connections"
    );
    assert!(
        !waiting.is_finished(),
        "the waiter got in while the lock was held"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_ok(), "the wait did not survive: {got:?}");
    assert!(
        released.elapsed() < Duration::from_millis(2500),
        "the waiter was not woken by the release (it waited {:?}: its 3s pause)",
        released.elapsed()
    );
}

/// A frozen server (SIGSTOP to every process of the cluster): an acquisition gives `Backend`
/// within its wait's bound, the holder's lease runs out on its clock, and after the thaw the
/// engine works again.
#[tokio::test]
async fn a_frozen_server_gives_backend_within_the_wait() {
    let server = PostgresServer::start();
    let holder = Locker::builder()
        .url(server.url())
        .expire(Duration::from_millis(800))
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let key = unique_key("frozen");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    server.pause();
    let err = dlock_tests::engines::error_within_the_wait(&server.url()).await;
    assert!(err.is_backend(), "{err:?}");
    let other = Locker::builder()
        .url(server.url())
        .timeout(Duration::from_millis(500))
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let started = Instant::now();
    let attempt = other.acquire(&key, LockOptions::new()).await;
    assert!(attempt.unwrap_err().is_backend());
    assert!(started.elapsed() < Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !held.is_held(),
        "the holder still trusts a lease that ran out"
    );
    server.resume();
    let next = Locker::builder()
        .url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    assert!(next.fencing_token() > held.fencing_token());
}

/// A release notifies (`pg_notify('dlock_release', '--------' || key)`) only when an acquisition
/// was refused during the hold: an uncontended release sends nothing, a contended one names its
/// key.
#[tokio::test]
async fn a_release_notifies_only_when_someone_waited() {
    let server = pg::shared_server();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (listener, mut connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message
                && n.channel() == "dlock_release"
            {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute("LISTEN dlock_release")
        .await
        .unwrap();
    let (a, b) = (locker(&server.url()), locker(&server.url()));
    let quiet = unique_key("quiet");
    a.acquire(&quiet, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let contended = unique_key("contended");
    let guard = a.acquire(&contended, LockOptions::new()).await.unwrap();
    assert!(
        b.try_acquire(&contended, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    // Notifications arrive in commit order: the quiet release came first and sent nothing.
    // (Other tests on this server may notify meanwhile: only our two keys count.)
    // The payload: who is next in fair mode's line (`--------`: no one), then the key.
    let ours = [
        format!("--------dlock:{quiet}"),
        format!("--------dlock:{contended}"),
    ];
    let payload = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let payload = heard.recv().await.expect("the listener is up");
            if ours.contains(&payload) {
                return payload;
            }
        }
    })
    .await
    .expect("the contended release notified");
    assert_eq!(payload, ours[1]);
}

/// A release that names a waiting process's place is sent on that place's channel
/// (`dlock_wake_<8 hex>`, which only that process's listening connection listens on), never on
/// `dlock_release`, which every listening process is sent. Three processes (lockers, a 3s poll)
/// wait while a fourth holds; each gets the lock from a wake-up, in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_sent_to_the_process_it_names_alone() {
    let server = pg::shared_server();
    let key = unique_key("addressed");
    let stored = format!("dlock:{key}");
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (listener, mut connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute("LISTEN dlock_release")
        .await
        .unwrap();
    let holder = locker(&server.url());
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let waiter = Locker::builder()
                .url(server.url())
                .retry(Duration::from_secs(3), Duration::from_secs(3))
                .build()
                .unwrap();
            dlock_tests::spawn_waiter(&waiter, &key)
        })
        .collect();
    let db = pg::client(&server.url()).await;
    wait_for_count(
        &db,
        "SELECT count(*) FROM dlock_waiters WHERE key = $1",
        &key,
        3,
        Duration::from_secs(10),
        "places in the queue",
    )
    .await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    dlock_tests::woken_in_turn(tasks, released_at).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(payload) = heard.try_recv() {
        assert!(
            !payload.ends_with(&stored) || payload.starts_with("--------"),
            "a release naming a place went to every listening process: {payload}"
        );
    }
}

/// Each statement dlock prepares is planned once per connection (`pg_stat_statements` with
/// `track_planning`): left to choose, the server planned a waiter's attempt (the statement
/// that keeps its place in the key's queue) anew at every call, judging its custom plans
/// cheaper than the generic one, and the planning cost it twice the running; and it plans
/// every statement's first five calls on a connection. Four lockers, each its own connection,
/// take turns on one key, so that their waiters' attempts come by the dozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_statement_is_planned_once_per_connection() {
    const LOCKERS: i64 = 4;
    let (server, db) = statements_server().await;
    let key = unique_key("planned-once");
    let tasks: Vec<_> = (0..LOCKERS)
        .map(|_| {
            let (locker, key) = (locker(&server.url()), key.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rows = db
        .query(
            "SELECT calls, plans, query FROM pg_stat_statements \
              WHERE query LIKE '%dlock_locks%' AND calls >= 20",
            &[],
        )
        .await
        .unwrap();
    let (waiters_attempts, planned): (i64, i64) = rows
        .iter()
        .filter(|r| r.get::<_, String>(2).contains("INSERT INTO dlock_waiters"))
        .fold((0, 0), |(calls, plans), r| {
            (calls + r.get::<_, i64>(0), plans + r.get::<_, i64>(1))
        });
    assert!(
        waiters_attempts >= 20,
        "the waiters made {waiters_attempts} attempts from a place: too few to tell"
    );
    assert!(planned >= 1, "no plans counted: is `track_planning` on?");
    for row in &rows {
        let (calls, plans, query): (i64, i64, String) = (row.get(0), row.get(1), row.get(2));
        // Once per locker's connection, and again after a change to a table's statistics.
        assert!(
            plans <= 2 * LOCKERS,
            "planned {plans} times in {calls} calls: {query}"
        );
    }
}

/// A hot key: 64 tasks of one locker contend for one key (default and fair mode), each
/// incrementing a non-atomic counter. No update is lost, and since the waiters of one process
/// queue in-process behind one place, a release wakes one of them: a few statements per
/// acquisition (`pg_stat_statements`), not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_wakes_one_waiter_per_release() {
    const WAITERS: u64 = 64;
    let (server, db) = statements_server().await;
    let locker = Locker::builder()
        .url(server.url())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for (mode, options) in [
        ("default", LockOptions::new()),
        ("fair", LockOptions::new().fair()),
    ] {
        let key = unique_key("hot");
        dlock_tests::acquire_and_release(&locker, &key).await;
        let before = statements(&db).await;
        assert_eq!(
            dlock_tests::contend(&locker, &key, &options, WAITERS).await,
            WAITERS,
            "{mode}: holders overlapped"
        );
        #[allow(clippy::cast_precision_loss)]
        let per_acquisition = (statements(&db).await - before - 1) as f64 / WAITERS as f64;
        assert!(
            per_acquisition <= 6.0,
            "{mode}: {per_acquisition:.1} statements per acquisition: releases woke the herd"
        );
        eprintln!("{mode}: {per_acquisition:.1} statements per acquisition");
        // The place leaves in the background when the last waiter of the line goes.
        wait_for_count(
            &db,
            "SELECT count(*) FROM dlock_waiters WHERE key = $1",
            &key,
            0,
            Duration::from_secs(5),
            &format!("{mode}: places left behind by their waiters"),
        )
        .await;
    }
}

/// Tables made by hand without a column dlock needs: a clear error at once, not a retry loop.
#[tokio::test]
async fn a_table_without_a_needed_column_is_a_clear_error() {
    let server = pg::shared_server();
    let url = pg::database(&server, "old_schema");
    pg::client(&url)
        .await
        .batch_execute(
            "CREATE SEQUENCE dlock_fence;
             CREATE TABLE dlock_locks (key text PRIMARY KEY, token text NOT NULL,
                                       fence bigint NOT NULL, expires_at timestamptz NOT NULL);
             CREATE TABLE dlock_waiters (key text, token text, place bigint, gone_at timestamptz,
                                         PRIMARY KEY (key, token));",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let err = locker(&url)
        .acquire(&unique_key("old"), LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("lacks a column"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "a refusal waited for the deadline"
    );
}

/// Fences follow the order holds begin even when an acquisition's backend stalls between
/// drawing its fence and writing its row: a `BEFORE INSERT` trigger (which runs after the row
/// to insert, fence and all, is made, and before PostgreSQL looks for a conflicting row) sleeps
/// 2s for one locker's rows. Another locker asks for the key meanwhile and releases at once.
/// Whichever hold began later must have the higher fence. (Before the key's turn was taken
/// first, the other locker's whole hold fitted in the stall, with the higher fence, and the
/// stalled acquisition then inserted its row with the lower one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_acquisition_gets_a_fence_above_a_hold_that_began_before_it() {
    fence_after_a_stall("fence_stall", LockOptions::new()).await;
}

/// The same with a semaphore's permit taken meanwhile: the shared kinds take the key's turn
/// too (their function draws its fence after the key's row is locked, but the stalled mutex
/// had no row yet). The permit is refused as a conflict while the mutex holds, or comes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_mutex_gets_a_fence_above_a_permit_that_began_before_it() {
    fence_after_a_stall("fence_stall_permit", LockOptions::new().permits(2)).await;
}

/// The same through the statement of an acquisition from a place in the key's queue (fair
/// mode's): it takes the key's turn too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_fair_acquisition_gets_a_fence_above_a_hold_that_began_before_it() {
    fence_after_a_stall_of(
        "fence_stall_fair",
        LockOptions::new().fair(),
        LockOptions::new(),
    )
    .await;
}

async fn fence_after_a_stall(database: &str, quick_options: LockOptions) {
    fence_after_a_stall_of(database, LockOptions::new(), quick_options).await;
}

/// A hold that began while another acquisition (`stalled_options`) was stalled in the insert
/// of its row (a trigger sleeps 2s) has the lower fence only if it began first.
async fn fence_after_a_stall_of(
    database: &str,
    stalled_options: LockOptions,
    quick_options: LockOptions,
) {
    let server = pg::shared_server();
    let url = pg::database(&server, database);
    let locker_owned_by = |owner: &str| {
        Locker::builder()
            .url(url.as_str())
            .owner(owner)
            .timeout(Duration::from_secs(20))
            .expire(Duration::from_secs(10))
            .request_timeout(Duration::from_secs(5))
            .build()
            .expect("a valid URL")
    };
    let (stalled, quick) = (locker_owned_by("stalled"), locker_owned_by("quick"));
    // The schema, made by a first acquisition.
    dlock_tests::acquire_and_release(&quick, &unique_key("schema")).await;
    let db = pg::client(&url).await;
    pg::before_each_lock_insert(
        &db,
        "stall",
        "IF NEW.owner LIKE '%stalled%' THEN PERFORM pg_sleep(2); END IF; RETURN NEW;",
    )
    .await;
    let key = unique_key("fence-stall");
    let hold = |locker: Locker, key: String, options: LockOptions| {
        tokio::spawn(async move {
            let guard = locker.acquire(&key, options).await?;
            let began = Instant::now();
            let fence = guard.fencing_token();
            guard.release().await?;
            Ok::<_, dlock_runtime::LockError>((began, fence))
        })
    };
    let first = hold(stalled, key.clone(), stalled_options);
    // The stalled acquisition has drawn its fence and sleeps in the trigger.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = hold(quick, key, quick_options);
    let (stalled_began, stalled_fence) = first.await.unwrap().unwrap();
    let (quick_began, quick_fence) = match second.await.unwrap() {
        Ok(hold) => hold,
        // A permit while the mutex held: no second hold to order.
        Err(error) if error.is_conflict() => return,
        Err(error) => panic!("{error:?}"),
    };
    let (earlier, later) = if stalled_began < quick_began {
        (("stalled", stalled_fence), ("quick", quick_fence))
    } else {
        (("quick", quick_fence), ("stalled", stalled_fence))
    };
    assert!(
        later.1 > earlier.1,
        "the {} hold began after the {} one with a lower fence: {} after {}",
        later.0,
        earlier.0,
        later.1,
        earlier.1
    );
}

/// Terminates the listening connection of the waiter logged in as `role` (waiting for it to
/// listen first), and refuses its reconnections: the role may have one connection, its
/// statement connection, until `ALTER ROLE <role> CONNECTION LIMIT -1`.
async fn cut_listening(server: &PostgresServer, db: &tokio_postgres::Client, role: &str) {
    let listening = format!(
        "SELECT pid FROM pg_stat_activity WHERE usename = '{role}' AND query LIKE 'LISTEN%'"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.query(&listening, &[]).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the waiter never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server
        .sql(&format!("ALTER ROLE {role} CONNECTION LIMIT 1"))
        .unwrap();
    let terminated = db
        .execute(
            &format!("SELECT pg_terminate_backend(pid) FROM ({listening}) l"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(terminated, 1, "the listening connection was not terminated");
}

/// A role `name` that owns a database `name`, and a URL of that database for `user`.
fn role_with_database(server: &PostgresServer, name: &str) -> impl Fn(&str) -> String {
    server.sql(&format!("CREATE ROLE {name} LOGIN")).unwrap();
    server
        .sql(&format!("CREATE DATABASE {name} OWNER {name}"))
        .unwrap();
    let (port, name) = (server.port(), name.to_owned());
    move |user: &str| format!("postgres://{user}@127.0.0.1:{port}/{name}")
}

/// A waiter logged in as `role` (a new role with its own database; `retry`, or the default)
/// waiting behind a 60s hold of the superuser's, with its listening connection cut
/// ([`cut_listening`]): the waiter, the hold and the wait.
async fn waiting_without_listening(
    server: &PostgresServer,
    db: &tokio_postgres::Client,
    role: &str,
    retry: Option<Duration>,
) -> (
    Locker,
    dlock_runtime::LockGuard,
    tokio::task::JoinHandle<Instant>,
) {
    let url_as = role_with_database(server, role);
    let mut waiter = Locker::builder()
        .url(url_as(role))
        .timeout(Duration::from_secs(30))
        .request_timeout(Duration::from_millis(300));
    if let Some(retry) = retry {
        waiter = waiter.retry(retry, retry);
    }
    let waiter = waiter.build().unwrap();
    let holder = locker(&url_as(dlock_tests::postgres::SUPERUSER));
    let key = unique_key(role);
    // The schema, the waiter's, and its statement connection.
    dlock_tests::acquire_and_release(&waiter, &key).await;
    let held = holder
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiting = dlock_tests::spawn_waiter(&waiter, &key);
    cut_listening(server, db, role).await;
    (waiter, held, waiting)
}

/// Releases while the listening connection is down and cannot be made again are looked for
/// once it is back: the waiter (a 6s poll) asks again as soon as it listens again, not at its
/// next poll. The waiter's role may have one connection while its listening one is terminated
/// (its reconnections refused), the holder releases meanwhile, then the limit goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_in_a_gap_of_the_listening_connection_are_looked_for_after_it() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let (waiter, held, waiting) =
        waiting_without_listening(&server, &db, "listen_gap", Some(Duration::from_secs(6))).await;
    // The waiter looked once when its listening connection went, and was refused.
    tokio::time::sleep(Duration::from_millis(400)).await;
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server
        .sql("ALTER ROLE listen_gap CONNECTION LIMIT -1")
        .unwrap();
    // Not the 6s poll.
    dlock_tests::woken_since(Instant::now(), waiting, Duration::from_secs(3)).await;
    waiter.close().await.unwrap();
}

/// A waiter whose listening connection is down (terminated, its reconnections refused) hears no
/// release, so it asks at `DLOCK_RETRY` (10-50ms by default), not after the 250-500ms pause of a
/// waiter a release will wake: at least 20 statements of its role in 1.5s
/// (`pg_stat_statements`; 3-6 attempts at the pause). Once its connection can be made again, it
/// gets the lock after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_listening_connection_is_down_asks_at_the_retry_pause() {
    let (server, db) = statements_server().await;
    let (waiter, held, waiting) = waiting_without_listening(&server, &db, "deaf", None).await;
    let asked = || async {
        let calls: Option<i64> = db
            .query_one(
                "SELECT sum(calls)::bigint FROM pg_stat_statements WHERE userid = 'deaf'::regrole",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        calls.unwrap_or(0)
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = asked().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let statements = asked().await - before;
    assert!(
        statements >= 20,
        "{statements} statements in 1.5s of a waiter that cannot hear releases"
    );
    server.sql("ALTER ROLE deaf CONNECTION LIMIT -1").unwrap();
    let released_at = Instant::now();
    held.release().await.unwrap();
    dlock_tests::woken_since(released_at, waiting, Duration::from_secs(3)).await;
    waiter.close().await.unwrap();
}

/// The shared kinds' acquisition function of an earlier dlock (which drew fences outside the
/// key's turn) is replaced by the first locker that sets up on its tables, and a semaphore
/// works on it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_shared_acquisition_function_is_replaced() {
    let server = pg::shared_server();
    let url = pg::database(&server, "earlier_shared");
    let db = pg::client(&url).await;
    // This dlock's schema, then its function as an earlier dlock had it: without the turn.
    dlock_tests::acquire_and_release(&locker(&url), &unique_key("schema")).await;
    let function = "to_regprocedure(\
                    'dlock_acquire_shared(text,text,text,text,integer,bigint,bigint,text)')::oid";
    let definition: String = db
        .query_one(&format!("SELECT pg_get_functiondef({function})"), &[])
        .await
        .unwrap()
        .get(0);
    let turn = "PERFORM pg_advisory_xact_lock(1684824939, hashtext(p_key));";
    assert!(definition.contains(turn), "{definition}");
    db.batch_execute(&definition.replace(turn, ""))
        .await
        .unwrap();
    let takes_turn =
        format!("SELECT prosrc LIKE '%1684824939%' FROM pg_proc WHERE oid = {function}");
    assert!(
        !db.query_one(&takes_turn, &[])
            .await
            .unwrap()
            .get::<_, bool>(0)
    );
    // A new locker's setup replaces it.
    let fresh = locker(&url);
    let permit = fresh
        .acquire(&unique_key("permit"), LockOptions::new().permits(2))
        .await
        .unwrap();
    permit.release().await.unwrap();
    assert!(
        db.query_one(&takes_turn, &[])
            .await
            .unwrap()
            .get::<_, bool>(0),
        "the earlier function was left"
    );
}

/// dlock's sessions commit durably though the server's `synchronous_commit` is `off` (the
/// test servers run so): a grant is reported once its commit is flushed, so a server crash
/// cannot lose it, nor the fence sequence's advance. A trigger records the setting that each
/// acquisition's insert runs under.
#[tokio::test]
async fn grants_are_committed_durably_when_the_server_commits_asynchronously() {
    let server = pg::shared_server();
    let url = pg::database(&server, "durable_commit");
    let db = pg::client(&url).await;
    let server_default = db
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .unwrap()
        .get::<_, String>(0);
    assert_eq!(
        server_default, "off",
        "the test server commits asynchronously"
    );
    let locker = Locker::builder().url(url.as_str()).build().unwrap();
    // The schema, made by a first acquisition.
    dlock_tests::acquire_and_release(&locker, &unique_key("schema")).await;
    db.batch_execute("CREATE TABLE seen (setting text)")
        .await
        .unwrap();
    pg::before_each_lock_insert(
        &db,
        "record_commit_level",
        "INSERT INTO seen VALUES (current_setting('synchronous_commit')); RETURN NEW;",
    )
    .await;
    dlock_tests::acquire_and_release(&locker, &unique_key("durable")).await;
    let seen: Vec<String> = db
        .query("SELECT setting FROM seen", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(seen, ["on"], "the acquisitions' commit levels");
}

/// A release (a mutex's, a permit's) whose `DELETE` committed and whose reply was lost with
/// the connection (a proxy holds the reply back, then closes the connection) is sent again on a
/// new connection and finds no row. Within the lease that is a release (before, it said
/// `Lost` for a lock it had released, and a `#[dlock]` call returned `Lost` after its body ran
/// whole); after the lease ran out on the client's clock it stays `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_with_its_connection_is_settled_by_the_lease() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let proxy = dlock_tests::proxy::Proxy::start(server.port());
    let through_proxy = pg::url_through(&server, &proxy);
    let locker = Locker::builder()
        .url(through_proxy)
        .request_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for case in dlock_tests::lost_reply_cases() {
        let lapsed = case.2;
        let key = unique_key("resent-release");
        let gone = || async {
            let rows: i64 = db
                .query_one(
                    "SELECT (SELECT count(*) FROM dlock_locks WHERE key LIKE '%' || $1)
                          + (SELECT count(*) FROM dlock_shared WHERE key LIKE '%' || $1)",
                    &[&key],
                )
                .await
                .unwrap()
                .get(0);
            rows == 0
        };
        let released =
            dlock_tests::release_with_its_reply_lost(&locker, &proxy, &key, case, gone).await;
        if lapsed {
            assert!(
                matches!(released, Err(dlock_runtime::LockError::Lost { .. })),
                "a release after the lease ran out: {released:?}"
            );
        } else {
            assert!(released.is_ok(), "a release within the lease: {released:?}");
        }
    }
}

/// A waiter with the release wake-up asks the server a few times a second while the lock is
/// held (every 250-500ms), not at `DLOCK_RETRY`'s 10-50ms: at most 12 statements in 2s behind a
/// hold (`pg_stat_statements`; 40-200 at 10-50ms), and the release still wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_the_wake_up_asks_a_few_times_a_second() {
    let (server, db) = statements_server().await;
    let (holder, waiter) = (locker(&server.url()), locker(&server.url()));
    let key = unique_key("few");
    let db = &db;
    // Each reading of the count is a statement too.
    dlock_tests::asks_a_few_times_a_second(
        (&holder, &waiter),
        &key,
        wait_for_line(db, &key, 1),
        || async move { u64::try_from(statements(db).await).unwrap() },
        (1, "statements"),
    )
    .await;
}

/// Transactions rolled back in the database so far (each failed attempt is one), once every
/// backend that ran them has reported them.
async fn rollbacks(db: &tokio_postgres::Client) -> i64 {
    db.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    db.query_one(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A waiter whose attempts fail fast backs off over failures in a row, as on Redis: with the
/// server made read-only (`default_transaction_read_only`, what a standby answers a primary's
/// clients after a failover), each attempt fails at once. It asked every 10-50ms, 60-100
/// attempts in 3s (each a transaction rolled back); now `DLOCK_RETRY` doubled after each
/// failure up to 250-500ms, about 12. Once the server takes writes again it gets the lock
/// within that pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_backs_off_over_errors_in_a_row() {
    let server = tokio::task::block_in_place(PostgresServer::start);
    let db = pg::client(&server.url()).await;
    // The test's own session keeps writing.
    db.batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let waiter = locker(&server.url());
    dlock_tests::acquire_and_release(&waiter, &unique_key("warm")).await;
    let before = rollbacks(&db).await;
    db.batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    db.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    // The postmaster reloads, then signals every backend (a new session shows it done).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = pg::client(&server.url()).await;
        let shown: String = fresh
            .query_one("SHOW default_transaction_read_only", &[])
            .await
            .unwrap()
            .get(0);
        if shown == "on" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never became read-only"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = dlock_tests::spawn_waiter(&waiter, &unique_key("read-only"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    db.batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await
        .unwrap();
    db.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let writable = Instant::now();
    let after = dlock_tests::got_lock_since(writable, waiting).await;
    // Its connections close: their backends exit and report what they counted (a session
    // reports at most once a second while it runs).
    drop(waiter);
    let mut failed = rollbacks(&db).await - before;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = rollbacks(&db).await - before;
        if now == failed || Instant::now() > deadline {
            break;
        }
        failed = now;
    }
    eprintln!("{failed} failed attempts in 3s of read-only; the lock {after:?} after");
    assert!(
        failed >= 3,
        "{failed} failed attempts: the server was not read-only"
    );
    assert!(
        failed <= 30,
        "{failed} failed attempts in 3s of read-only: the waiter did not back off"
    );
    assert!(
        after < Duration::from_secs(2),
        "the lock {after:?} after the server took writes"
    );
}

/// A connection of its own that hears `channel`: each notification's payload comes on the
/// receiver.
async fn hear(url: &str, channel: &str) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (listener, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (listening, listened) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    let channel = channel.to_owned();
    tokio::spawn(async move {
        listener
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .unwrap();
        let _ = listening.send(());
        // The client lives as long as the test: its connection hears until then.
        std::future::pending::<()>().await;
    });
    listened.await.unwrap();
    heard
}

/// Waits until a place in `key`'s queue has a claim (a fair waiter was refused), and returns
/// the place's first 8 hex digits (its channel's) and the claim's token.
async fn claimed(db: &tokio_postgres::Client, key: &str) -> (String, String) {
    wait_for_count(
        db,
        "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND claim IS NOT NULL",
        key,
        1,
        Duration::from_secs(10),
        "claims in the queue",
    )
    .await;
    db.query_one(
        "SELECT left(token, 8), claim FROM dlock_waiters WHERE key = $1 AND claim IS NOT NULL",
        &[&format!("dlock:{key}")],
    )
    .await
    .map(|row| (row.get(0), row.get(1)))
    .unwrap()
}

/// Waits until a connection of `database` named `application` listens on a place's channel (a
/// waiter's wake-up is armed), then a little more: the waiter's attempt right after arming it
/// has been answered, so the release that follows finds it asleep.
async fn wait_until_asleep(db: &tokio_postgres::Client, database: &str, application: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                  AND application_name = $2 AND query LIKE '%LISTEN dlock_wake_%'",
                &[&database, &application],
            )
            .await
            .unwrap()
            .get(0);
        if listening > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never listened on its place's channel"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Fair mode's grant: the release that finds a fair waiter's place first in line makes the key
/// that waiter's (`+<place><claim><fence>:<key>` on the place's channel), and the waiter takes it up
/// without asking (a locker that polls every 3s has it well within a second): the fence is the
/// grant's, and the take-up then gives the hold the lease asked for and the holder's record, and
/// the place leaves the queue. Its release frees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_key_to_the_fair_waiter_first_in_line() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("grant");
    let stored = format!("dlock:{key}");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let waiting = {
        let (waiter, key) = (
            named_slow_poller(&server, "granted", Duration::from_secs(1)),
            key.clone(),
        );
        tokio::spawn(async move {
            let options = LockOptions::new().fair().expire(Duration::from_secs(60));
            let guard = waiter.acquire(&key, options).await.unwrap();
            (guard, Instant::now(), waiter)
        })
    };
    let (place, claim) = claimed(&db, &key).await;
    let mut heard = hear(&server.url(), &format!("dlock_wake_{place}")).await;
    wait_until_asleep(&db, "postgres", "granted").await;
    let held_fence = held.fencing_token();
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (guard, acquired_at, _waiter) = waiting.await.unwrap();
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "got the lock {:?} after the release: it polled",
        acquired_at - released_at
    );
    let payload = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > held_fence);
    assert_eq!(
        payload,
        format!("+{place}{}{}:{stored}", &claim[24..], guard.fencing_token()),
        "the release did not grant the key"
    );
    wait_for_count(
        &db,
        "SELECT count(*) FROM dlock_locks WHERE key = $1 AND owner IS NOT NULL \
         AND expires_at > clock_timestamp() + interval '30 seconds'",
        &key,
        1,
        Duration::from_secs(5),
        "holds taken up with the lease asked for",
    )
    .await;
    assert_eq!(
        line_len(&db, &key).await,
        0,
        "the place stayed in the queue"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    wait_for_count(
        &db,
        "SELECT count(*) FROM dlock_locks WHERE key = $1",
        &key,
        0,
        Duration::from_secs(5),
        "rows left",
    )
    .await;
}

/// A grant whose waiter left before taking it up, while another waiter of its process waits
/// behind it: that waiter's attempt (woken by the grant's notification) takes the granted hold
/// over with a fence of its own, within a second of the release (it polls every 3s). The claim
/// stays the first waiter's (the place was refreshed lately), which the test checks, so this is
/// the path it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_waiter_left_goes_to_the_next_waiter_of_its_process() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("grant-left");
    let stored = format!("dlock:{key}");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let waiter = named_slow_poller(&server, "grant-left", Duration::from_secs(1));
    let wait = |key: String| {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let guard = waiter.acquire(&key, LockOptions::new().fair()).await?;
            Ok::<_, dlock_runtime::LockError>((guard, Instant::now()))
        })
    };
    let first = wait(key.clone());
    let (place, first_claim) = claimed(&db, &key).await;
    let claim = "SELECT claim FROM dlock_waiters WHERE key = $1";
    let second = wait(key.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The second waiter's turn has begun (its attempt refused: the key is held).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claim_now: String = db.query_one(claim, &[&stored]).await.unwrap().get(0);
    assert_eq!(
        claim_now, first_claim,
        "the claim changed: not the path under test"
    );
    let mut heard = hear(&server.url(), &format!("dlock_wake_{place}")).await;
    let released_at = Instant::now();
    let held_fence = held.fencing_token();
    held.release().await.unwrap();
    let (guard, acquired_at) = second.await.unwrap().unwrap();
    let payload = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        payload.starts_with(&format!("+{place}{}", &first_claim[24..])),
        "the release granted the first waiter nothing: {payload}"
    );
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "got the lock {:?} after the release: it polled",
        acquired_at - released_at
    );
    assert!(guard.fencing_token() > held_fence);
    let holder: String = db
        .query_one("SELECT token FROM dlock_locks WHERE key = $1", &[&stored])
        .await
        .unwrap()
        .get(0);
    assert_ne!(holder, first_claim, "the granted hold was not taken over");
    guard.release().await.unwrap();
}

/// A head of the line frozen (SIGSTOP) when the release grants it the key holds it no longer
/// than its place would have held the line: the process behind it gets the lock after the
/// grant lapses (well within 15s; the place's liveness is 4s), and the frozen one, resumed,
/// does not take up the grant it hears late but asks, and gets the lock after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_head_granted_the_key_holds_up_the_line_no_longer_than_its_place() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("grant-frozen");
    let stored = format!("dlock:{key}");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let mut frozen = fair_waiter(&server, &key, "frozen");
    claimed(&db, &key).await;
    let mut patient = fair_waiter(&server, &key, "patient");
    wait_for_line(&db, &key, 2).await;
    let signal = |sig: &str, child: &std::process::Child| {
        let status = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-STOP", &frozen);
    held.release().await.unwrap();
    let granted: i64 = db
        .query_one(
            "SELECT count(*) FROM dlock_locks l JOIN dlock_waiters w \
              ON w.key = l.key AND w.claim = l.token WHERE l.key = $1",
            &[&stored],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        granted, 1,
        "the release did not grant the frozen head the key"
    );
    let started = Instant::now();
    assert!(patient.wait().unwrap().success());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the line was held up for {:?}",
        started.elapsed()
    );
    assert_eq!(served(&db, &key).await, ["patient"]);
    signal("-CONT", &frozen);
    assert!(frozen.wait().unwrap().success());
    assert_eq!(served(&db, &key).await, ["patient", "frozen"]);
}

/// A grant whose take-up fails (held in a trigger, then cancelled by the statement timeout,
/// 1s: before the grant's lease, 4s, the place's liveness) is a lost hold: the waiter had the
/// lock at once, and its guard reports the loss when the take-up fails (asserted within 3s),
/// not at the end of the 30s lease asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_not_taken_up_in_time_is_a_lost_hold() {
    let server = pg::shared_server();
    let url = pg::database(&server, "grant_late");
    let build = |owner: &str| {
        Locker::builder()
            .url(url.as_str())
            .owner(owner)
            .timeout(Duration::from_secs(20))
            .expire(Duration::from_secs(30))
            // No poll between the release and its notification: the grant is taken up.
            .retry(Duration::from_secs(3), Duration::from_secs(3))
            .build()
            .expect("a valid URL")
    };
    let (holder, waiter) = (build("holder"), build("late"));
    dlock_tests::acquire_and_release(&holder, &unique_key("schema")).await;
    let db = pg::client(&url).await;
    db.batch_execute(
        "CREATE FUNCTION slow_take_up() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.owner IS NULL AND NEW.owner LIKE '%late%'
                AND OLD.expires_at > clock_timestamp() THEN
                 PERFORM pg_sleep(6);
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER slow_take_up BEFORE UPDATE ON dlock_locks
             FOR EACH ROW EXECUTE FUNCTION slow_take_up();",
    )
    .await
    .unwrap();
    let key = unique_key("grant-late");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move { waiter.acquire(&key, LockOptions::new().fair()).await })
    };
    claimed(&db, &key).await;
    wait_until_asleep(&db, "grant_late", "dlock").await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the grant was not taken up at once")
        .unwrap()
        .unwrap();
    let acquired_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the late take-up was not a loss");
    assert!(
        acquired_at.elapsed() < Duration::from_secs(3),
        "the loss came {:?} after the grant: not the grant's lease",
        acquired_at.elapsed()
    );
    assert!(!guard.is_held());
}

/// `dlock_wake_line` as dlock made it before fair waiters had claims: a release names the
/// place first in line on its own channel and grants nothing.
const WAKE_LINE_BEFORE_CLAIMS: &str = "\
CREATE OR REPLACE FUNCTION dlock_wake_line(p_key text, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    woke boolean;
BEGIN
    WITH next AS (
        SELECT left(w.token, 8) AS next FROM dlock_waiters w
         WHERE w.key = p_key AND w.gone_at > clock_timestamp() ORDER BY w.place LIMIT 1
    ), kept AS (
        INSERT INTO dlock_locks (key, token, fence, expires_at, contended)
        SELECT p_key, '00000000000000000000000000000000', p_fence, to_timestamp(0), true
          FROM next
        ON CONFLICT (key) DO NOTHING
    )
    SELECT true INTO woke
      FROM pg_notify(coalesce('dlock_wake_' || (SELECT next FROM next), 'dlock_release'),
               coalesce((SELECT next FROM next), '--------') ||
               CASE WHEN octet_length(p_key) < 7900 THEN p_key ELSE '' END);
    RETURN woke;
END $$;";

/// Two fair waiters of `url` (each its own locker, polling every 3s, the first queued first)
/// wait for a key `holder` holds; each gets it from a wake-up, in arrival order. Returns
/// whether a place of the key had a claim while they waited.
async fn fair_waiters_served_in_turn(
    url: &str,
    holder: &Locker,
    db: &tokio_postgres::Client,
) -> bool {
    let key = unique_key("claims");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let mut tasks = Vec::new();
    for len in 1..=2 {
        let waiter = Locker::builder()
            .url(url)
            .retry(Duration::from_secs(3), Duration::from_secs(3))
            .build()
            .unwrap();
        let mine = key.clone();
        tasks.push(tokio::spawn(async move {
            let guard = waiter
                .acquire(&mine, LockOptions::new().fair())
                .await
                .unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }));
        wait_for_line(db, &key, len).await;
    }
    // Read through the row as JSON: without the column, no claim (and no error).
    let claimed: i64 = db
        .query_one(
            "SELECT count(*) FROM dlock_waiters w \
              WHERE key = $1 AND to_jsonb(w) ->> 'claim' IS NOT NULL",
            &[&format!("dlock:{key}")],
        )
        .await
        .unwrap()
        .get(0);
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (first, second) = (
        tasks.remove(0).await.unwrap(),
        tasks.remove(0).await.unwrap(),
    );
    assert!(first < second, "fair waiters served out of order");
    assert!(
        second - released_at < Duration::from_secs(2),
        "a fair waiter polled: {:?}",
        second - released_at
    );
    claimed > 0
}

/// Tables made before fair waiters had claims (`dlock_waiters` without `claim`, `claim_ms`,
/// the function that grants nothing): a user who may not add them keeps fair mode as it was,
/// in order and woken by each release, its places writing no claim, the tables and function
/// untouched; the owner's locker adds the columns and replaces the function at its first
/// acquisition, and a new locker of the user then writes claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_from_before_the_claims_get_them_from_their_owner() {
    let server = pg::shared_server();
    let url = pg::database(&server, "before_claims");
    let db = pg::client(&url).await;
    earlier_tables(&db, WAKE_LINE_BEFORE_CLAIMS, "dlock_unclaimed").await;
    let grants = "SELECT prosrc LIKE '%claim_ms%' FROM pg_proc \
                  WHERE oid = to_regprocedure('dlock_wake_line(text,bigint)')::oid";
    let as_user = format!(
        "postgres://dlock_unclaimed@127.0.0.1:{}/before_claims?sslmode=disable",
        server.port()
    );
    assert!(!fair_waiters_served_in_turn(&as_user, &locker(&as_user), &db).await);
    assert!(!db.query_one(grants, &[]).await.unwrap().get::<_, bool>(0));

    dlock_tests::acquire_and_release(&locker(&url), &unique_key("owner")).await;
    assert!(
        db.query_one(grants, &[]).await.unwrap().get::<_, bool>(0),
        "the owner's locker left the function that grants nothing"
    );
    assert!(fair_waiters_served_in_turn(&as_user, &locker(&as_user), &db).await);
}

/// A grant heard for the claim of a place that left (a release that raced the leaving, which
/// LEAVE's snapshot could not see) is handed back by the waiter's locker: it releases the
/// granted hold, and the release wakes the place then first in line. The race is staged: the
/// holder's row is made the departed claim's, and the grant announced on the place's channel,
/// by hand. Without the hand-back the row would stay for its 30s; the waiter behind (a 3s poll)
/// has the lock within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_for_a_place_that_left_is_handed_back() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("grant-back");
    let stored = format!("dlock:{key}");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let gone = named_slow_poller(&server, "grant-back", Duration::from_secs(1));
    let impatient = {
        let (gone, key) = (gone.clone(), key.clone());
        tokio::spawn(async move {
            let options = LockOptions::new().fair().timeout(Duration::from_secs(3));
            gone.acquire(&key, options).await
        })
    };
    let (place, claim) = claimed(&db, &key).await;
    let behind = {
        let (waiter, key) = (
            named_slow_poller(&server, "grant-behind", Duration::from_secs(1)),
            key.clone(),
        );
        tokio::spawn(async move {
            let guard = waiter.acquire(&key, LockOptions::new().fair()).await?;
            Ok::<_, dlock_runtime::LockError>((guard, Instant::now()))
        })
    };
    wait_for_line(&db, &key, 2).await;
    assert!(impatient.await.unwrap().unwrap_err().is_timeout());
    wait_for_line(&db, &key, 1).await;
    // The staged grant: the holder's row becomes the departed claim's (its fence kept), and
    // the release's announcement of it.
    let fence: i64 = db
        .query_one(
            "UPDATE dlock_locks SET token = $2, owner = NULL, contended = true, \
                 expires_at = clock_timestamp() + interval '30 seconds' \
              WHERE key = $1 RETURNING fence",
            &[&stored, &claim],
        )
        .await
        .unwrap()
        .get(0);
    drop(held);
    let announced_at = Instant::now();
    db.batch_execute(&format!(
        "NOTIFY dlock_wake_{place}, '+{place}{}{fence}:{stored}'",
        &claim[24..]
    ))
    .await
    .unwrap();
    let (guard, acquired_at) = behind.await.unwrap().unwrap();
    assert!(
        acquired_at - announced_at < Duration::from_secs(1),
        "the grant was not handed back: the waiter behind had the lock {:?} after",
        acquired_at - announced_at
    );
    assert!(guard.fencing_token() > u64::try_from(fence).unwrap());
    guard.release().await.unwrap();
}

/// A grant taken up by a waiter with another waiter of its process behind it keeps the place,
/// moved to the back of the queue with its claim gone, and marks the hold contended (as a
/// taking attempt from the place does): the release after it wakes that waiter (a 3s poller)
/// within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_taken_up_with_a_waiter_behind_keeps_the_place() {
    let server = pg::shared_server();
    let db = pg::client(&server.url()).await;
    let key = unique_key("grant-keep");
    let held = locker(&server.url())
        .acquire(&key, LockOptions::new())
        .await
        .unwrap();
    let waiter = named_slow_poller(&server, "grant-keep", Duration::from_secs(1));
    let wait = |key: String| {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let guard = waiter.acquire(&key, LockOptions::new().fair()).await?;
            Ok::<_, dlock_runtime::LockError>((guard, Instant::now()))
        })
    };
    let first = wait(key.clone());
    claimed(&db, &key).await;
    wait_until_asleep(&db, "postgres", "grant-keep").await;
    let second = wait(key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let (guard, _) = first.await.unwrap().unwrap();
    wait_for_count(
        &db,
        "SELECT count(*) FROM dlock_waiters w JOIN dlock_locks l ON l.key = w.key \
          WHERE w.key = $1 AND w.claim IS NULL AND l.contended AND l.owner IS NOT NULL",
        &key,
        1,
        Duration::from_secs(5),
        "places kept behind a taken-up grant",
    )
    .await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (guard, acquired_at) = second.await.unwrap().unwrap();
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "the waiter behind got the lock {:?} after the release: it polled",
        acquired_at - released_at
    );
    guard.release().await.unwrap();
}

/// A take-up that finds the granted hold gone (a trigger skips its update) is a loss, and the
/// place that was to leave with it leaves then, waking the place behind it (another locker, a
/// 3s poller), which has the lock within a second; the granted row goes as it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_up_that_finds_the_hold_gone_is_a_loss_and_the_line_goes_on() {
    let server = pg::shared_server();
    let url = pg::database(&server, "grant_gone");
    let build = |owner: &str| {
        Locker::builder()
            .url(url.as_str())
            .owner(owner)
            .timeout(Duration::from_secs(20))
            .expire(Duration::from_secs(30))
            .retry(Duration::from_secs(3), Duration::from_secs(3))
            .build()
            .expect("a valid URL")
    };
    let (holder, first, behind) = (build("holder"), build("gone"), build("behind"));
    dlock_tests::acquire_and_release(&holder, &unique_key("schema")).await;
    let db = pg::client(&url).await;
    db.batch_execute(
        "CREATE FUNCTION skip_take_up() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.owner IS NULL AND NEW.owner LIKE '%gone%' THEN RETURN NULL; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER skip_take_up BEFORE UPDATE ON dlock_locks
             FOR EACH ROW EXECUTE FUNCTION skip_take_up();",
    )
    .await
    .unwrap();
    let key = unique_key("grant-gone");
    let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let spawn = |locker: Locker, key: String| {
        tokio::spawn(async move {
            let guard = locker.acquire(&key, LockOptions::new().fair()).await?;
            Ok::<_, dlock_runtime::LockError>((guard, Instant::now()))
        })
    };
    let granted = spawn(first, key.clone());
    claimed(&db, &key).await;
    wait_until_asleep(&db, "grant_gone", "dlock").await;
    let waiting = spawn(behind, key.clone());
    wait_for_line(&db, &key, 2).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (guard, _) = granted.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("a take-up that found the hold gone was not a loss");
    let (next, acquired_at) = waiting.await.unwrap().unwrap();
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "the place behind got the lock {:?} after the release: it polled",
        acquired_at - released_at
    );
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
}
