//! One suite of lock semantics, run against every engine of `dlock_tests::engines::ENGINES`: real
//! servers started by the harness (Redis as the default user, as the README's ACL user, and as
//! that user without channel permissions) and the embedded memory backend.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker};
use dlock_tests::{Engine as Env, unique_key};
use tokio::time::Instant;

dlock_tests::engine_suite!(
    acquire_then_release,
    busy_lock_is_not_granted,
    mutual_exclusion_under_contention,
    timeout_is_bounded,
    try_once_makes_one_attempt_and_returns,
    stale_release_is_lost_and_deletes_nothing,
    release_on_drop_frees_the_lock,
    release_after_panic_frees_the_lock,
    cancelled_waiter_leaves_nothing,
    fencing_tokens_increase,
    extend_keeps_and_never_resurrects,
    renewed_lease_outlives_its_length,
    fixed_lease_is_reported_lost,
    oversized_and_empty_keys_are_refused,
    waiter_gets_the_lock_after_release,
    same_task_reenters_and_the_outermost_releases,
    another_task_does_not_reenter,
    a_retry_that_finds_its_own_lock_gets_a_new_fence,
    any_key_is_data,
    ping_answers_until_closed,
    operator_sees_who_holds_and_frees_it,
    job_lock_stays_taken_for_its_minimum_hold,
);

const SHORT: Duration = Duration::from_millis(300);

/// Every engine of the runtime's table runs this suite: an engine added to the runtime without
/// a deployment here fails this test.
#[test]
fn the_suite_covers_every_engine_of_the_runtime() {
    use dlock_tests::engines::{COVERS, ENGINES};
    for engine in dlock_runtime::__private::engines() {
        assert!(
            COVERS.iter().any(|(_, e)| *e == engine),
            "no deployment of the suite runs the `{engine}` engine"
        );
    }
    let suite: Vec<&str> = COVERS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        suite, ENGINES,
        "COVERS and ENGINES name different deployments"
    );
}

async fn acquire_then_release(env: Env) {
    let locker = env.locker();
    let key = unique_key("basic");
    let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
    assert_eq!(guard.key(), format!("dlock:{key}"));
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let again = locker.try_acquire(&key, SHORT).await.unwrap();
    assert!(again.is_some(), "a released lock is free");
}

async fn busy_lock_is_not_granted(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("busy");
    let _held = a.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(b.try_acquire(&key, SHORT).await.unwrap().is_none());
    assert!(
        a.try_acquire(&key, SHORT).await.unwrap().is_none(),
        "not reentrant across acquisitions"
    );
    let other = b.try_acquire(&unique_key("other"), SHORT).await.unwrap();
    assert!(other.is_some(), "another key is independent");
}

async fn mutual_exclusion_under_contention(env: Env) {
    const LOCKERS: usize = 8;
    const ROUNDS: u64 = 40;
    let key = unique_key("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..LOCKERS {
        let (locker, key, counter, inside) =
            (env.locker(), key.clone(), counter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locker
                    .acquire(&key, LockOptions::new().timeout(Duration::from_secs(60)))
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                // Non-atomic read-modify-write across an await: loses updates on overlap.
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(100)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), LOCKERS as u64 * ROUNDS);
}

async fn timeout_is_bounded(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("timeout");
    let _held = a.acquire(&key, LockOptions::new()).await.unwrap();
    let started = Instant::now();
    let err = b
        .acquire(&key, LockOptions::new().timeout(SHORT))
        .await
        .unwrap_err();
    let took = started.elapsed();
    let LockError::Timeout { key: k, waited, .. } = &err else {
        panic!("expected a timeout, got {err:?}");
    };
    assert_eq!(k, &format!("dlock:{key}"));
    assert!(err.is_timeout());
    assert!(*waited >= SHORT, "gave up early: {waited:?}");
    assert!(
        took < SHORT + Duration::from_secs(2),
        "gave up late: {took:?}"
    );
}

async fn try_once_makes_one_attempt_and_returns(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("try");
    let _held = a.acquire(&key, LockOptions::new()).await.unwrap();
    let started = Instant::now();
    let err = b
        .acquire(&key, LockOptions::new().timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // No pause was slept: well under the smallest retry pause of a generous bound.
    assert!(started.elapsed() < Duration::from_secs(1));
}

async fn stale_release_is_lost_and_deletes_nothing(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("stale");
    let old = a
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(100)))
        .await
        .unwrap();
    // The lease the engine granted may be longer (etcd: whole seconds, at least its minimum).
    lease_ran_out(&old).await;
    let new = b.acquire(&key, LockOptions::new()).await.unwrap();
    let err = old.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(new.is_held());
    assert!(
        env.locker()
            .try_acquire(&key, SHORT)
            .await
            .unwrap()
            .is_none(),
        "the new holder's lock survived the stale release"
    );
    new.release().await.unwrap();
}

async fn release_on_drop_frees_the_lock(env: Env) {
    let locker = env.locker();
    let key = unique_key("drop");
    drop(locker.acquire(&key, LockOptions::new()).await.unwrap());
    // The release runs on the runtime; the 10s lease is far longer than this wait.
    let guard = env
        .locker()
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(guard.is_ok(), "dropped guard was not released: {guard:?}");
}

async fn release_after_panic_frees_the_lock(env: Env) {
    let locker = env.locker();
    let key = unique_key("panic");
    let task = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            let _guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
            panic!("body failed");
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    let guard = env
        .locker()
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(
        guard.is_ok(),
        "panicked holder's lock was not released: {guard:?}"
    );
}

async fn cancelled_waiter_leaves_nothing(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("cancel");
    let held = a.acquire(&key, LockOptions::new()).await.unwrap();
    let waiting = b.acquire(&key, LockOptions::new().timeout(Duration::from_secs(30)));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), waiting)
            .await
            .is_err()
    );
    held.release().await.unwrap();
    // The cancelled waiter's cleanup is handed to the runtime (an engine with a line, etcd,
    // removes its place there): give it a moment, far less than the 10s lease it would leave.
    let next = env
        .locker()
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(
        next.is_ok(),
        "the cancelled waiter left a lock behind: {next:?}"
    );
}

async fn fencing_tokens_increase(env: Env) {
    let locker = env.locker();
    let key = unique_key("fence");
    let mut last = 0;
    for i in 0..5 {
        let other = locker
            .acquire(&format!("{key}:other{i}"), LockOptions::new())
            .await
            .unwrap();
        let guard = locker.acquire(&key, LockOptions::new()).await.unwrap();
        assert!(guard.fencing_token() > last, "fence went backwards");
        last = guard.fencing_token();
        guard.release().await.unwrap();
        other.release().await.unwrap();
    }
}

async fn extend_keeps_and_never_resurrects(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("extend");
    let guard = a
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(1)))
        .await
        .unwrap();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(guard.is_held(), "extend did not move the client's deadline");
    assert!(
        b.try_acquire(&key, SHORT).await.unwrap().is_none(),
        "extend did not reach the server"
    );
    guard.release().await.unwrap();

    let old = a
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(100)))
        .await
        .unwrap();
    lease_ran_out(&old).await;
    // Until the server has let it go too: another holder gets in, and leaves.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(other) = b.try_acquire(&key, SHORT).await.unwrap() {
            other.release().await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expired lease was never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = old.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_lost());
    assert!(!old.is_held());
    assert!(
        b.try_acquire(&key, SHORT).await.unwrap().is_some(),
        "a failed extend re-created the key"
    );

    // The engine's side: a hold whose key was freed under it (its lease still running on the
    // client's clock, so the extend is sent) finds the key gone and does not re-create it.
    let key = unique_key("extend-freed");
    let freed = a
        .acquire(&key, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(b.force_release(&key).await.unwrap().is_some());
    let err = freed.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(!freed.is_held());
    assert!(
        b.inspect(&key).await.unwrap().is_none(),
        "an extend of a freed key re-created it"
    );
}

async fn renewed_lease_outlives_its_length(env: Env) {
    // A 1s lease, probed over three times its length; the prober is a second acquisition
    // through the same client. (A 300ms lease renewed every 100ms lapsed now and then when
    // nextest ran every test binary at once on 2 cores: a renewal late by a lease's length is
    // a loss, and the lock reported it; that is load, not what this test is about.)
    let locker = env.locker_with_expire(Duration::from_secs(1));
    let key = unique_key("renew");
    let guard = locker
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            locker.try_acquire(&key, SHORT).await.unwrap().is_none(),
            "renewal let the lease lapse"
        );
        assert!(guard.is_held());
    }
    guard.release().await.unwrap();
    assert!(locker.try_acquire(&key, SHORT).await.unwrap().is_some());
}

async fn fixed_lease_is_reported_lost(env: Env) {
    let locker = env.locker();
    let key = unique_key("lost");
    let guard = locker
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(200)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() resolves when the lease runs out");
    assert!(!guard.is_held());
}

async fn oversized_and_empty_keys_are_refused(env: Env) {
    let locker = env.locker();
    let err = locker
        .acquire(&"k".repeat(2000), LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    assert!(err.to_string().contains("DLOCK_MAX_KEY_LEN"), "{err}");
    let err = locker.acquire("", LockOptions::new()).await.unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    // At the limit exactly it is accepted: the prefix counts.
    let fits = "k".repeat(1024 - "dlock:".len());
    let _guard = locker.acquire(&fits, LockOptions::new()).await.unwrap();
}

/// Pieces of random keys: what engines store specially (`/` and `.` segments, `%` escapes, the
/// prefix, Cluster hash tags, NUL and control characters, the ranges ZooKeeper refuses,
/// characters beyond U+FFFF, glob and quote characters) and plain text.
const KEY_PIECES: &[&str] = &[
    "/",
    "//",
    ".",
    "..",
    "%",
    "%2F",
    "%25",
    "%00",
    "dlock:",
    "{",
    "}",
    "{t}",
    "\0",
    "\u{1}",
    "\u{1f}",
    "\u{7f}",
    "\u{85}",
    "\u{9f}",
    "\u{d7ff}",
    "\u{e000}",
    "\u{f8ff}",
    "\u{fff0}",
    "\u{ffff}",
    "🔒",
    "\u{10ffff}",
    "ключ",
    "鍵",
    "a",
    "B",
    " ",
    "\n",
    "*",
    "?",
    "[",
    "\\",
    "'",
    "\"",
    ":",
];

/// A random key: 1 to 6 pieces of [`KEY_PIECES`] or random characters.
fn random_key(rng: &mut fastrand::Rng) -> String {
    loop {
        let key: String = (0..rng.usize(1..=6))
            .map(|_| {
                if rng.bool() {
                    KEY_PIECES[rng.usize(..KEY_PIECES.len())].to_owned()
                } else {
                    rng.char(..).to_string()
                }
            })
            .collect();
        // dlock's own bookkeeping names (refused with InvalidKey on every engine alike).
        if !key.starts_with("__fence:") && !key.starts_with("__fair:") {
            return key;
        }
    }
}

/// Keys that an engine's escaping could confuse with `key` (`/` and `%2F`, NUL and `%00`, a
/// character and its UTF-8 escape, a trailing dot): each must be a lock of its own.
fn look_alikes(key: &str) -> Vec<String> {
    let mut escaped = String::new();
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            escaped.push(c);
        } else {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                escaped.push_str(&format!("%{b:02X}"));
            }
        }
    }
    [
        escaped,
        format!("{key}/"),
        format!("{key}."),
        format!("{key}\0"),
        format!("%{key}"),
    ]
    .into_iter()
    .filter(|k| k != key)
    .collect()
}

/// Keys are data on every engine: any key (up to the length limit) is one lock of its own,
/// excluding its holders and nobody else, and comes back as given in the guard.
async fn any_key_is_data(env: Env) {
    let seed = std::env::var("DLOCK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let (a, b) = (env.locker(), env.locker());
    let run = unique_key("any");
    for i in 0..20 {
        // A unique start keeps runs apart; the random part decides the rest.
        let key = format!("{run}:{i}:{}", random_key(&mut rng));
        let at = |what: &str| format!("seed {seed} (DLOCK_TEST_SEED), key {key:?}: {what}");
        let held = a
            .acquire(&key, LockOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{}", at(&e.to_string())));
        assert_eq!(
            held.key(),
            format!("dlock:{key}"),
            "{}",
            at("the guard's key")
        );
        let busy = b.try_acquire(&key, SHORT).await;
        assert!(
            busy.as_ref().is_ok_and(Option::is_none),
            "{}",
            at(&format!("another locker got it: {busy:?}"))
        );
        for other in look_alikes(&key) {
            let free = b
                .try_acquire(&other, SHORT)
                .await
                .unwrap_or_else(|e| panic!("{}", at(&format!("{other:?}: {e}"))));
            let free =
                free.unwrap_or_else(|| panic!("{}", at(&format!("{other:?} is the same lock"))));
            free.release().await.unwrap();
        }
        held.release().await.unwrap();
        let again = b
            .try_acquire(&key, SHORT)
            .await
            .unwrap_or_else(|e| panic!("{}", at(&e.to_string())));
        assert!(again.is_some(), "{}", at("not free after its release"));
    }
}

/// A readiness check answers on a live engine, and says `Closed` once the locker is closed.
async fn ping_answers_until_closed(env: Env) {
    let locker = env.locker_with_expire(Duration::from_secs(9));
    let round_trip = locker.ping().await.unwrap();
    assert!(round_trip < Duration::from_secs(5), "{round_trip:?}");
    locker.close().await.unwrap();
    assert!(locker.ping().await.unwrap_err().is_closed());
}

async fn waiter_gets_the_lock_after_release(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("handoff");
    let held = a.acquire(&key, LockOptions::new()).await.unwrap();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            b.acquire(&key, LockOptions::new())
                .await
                .map(|g| g.fencing_token())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.fencing_token();
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first);
}

async fn same_task_reenters_and_the_outermost_releases(env: Env) {
    // Re-entry happens inside the holder's scope (`LockGuard::scope`, or a `#[dlock]` body).
    let (locker, other) = (env.locker(), env.locker());
    let key = unique_key("reenter");
    let outer = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let inner = outer
        .scope(async {
            locker
                .acquire(&key, LockOptions::new().timeout(Duration::ZERO))
                .await
                .expect("the holder re-enters at once")
        })
        .await;
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    inner.release().await.unwrap();
    assert!(outer.is_held());
    assert!(
        !free_for_another_task(&other, &key).await,
        "an inner release freed the key"
    );
    // Outside the scope there is no re-entry: the same task waits like anyone else.
    let outside = locker
        .acquire(&key, LockOptions::new().timeout(Duration::ZERO))
        .await;
    assert!(
        outside.unwrap_err().is_timeout(),
        "re-entered outside the holder's scope"
    );
    // Dropped in the other order: the key stays held until the last guard goes.
    let inner = outer
        .scope(locker.acquire(&key, LockOptions::new().timeout(Duration::ZERO)))
        .await
        .unwrap();
    drop(outer);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !free_for_another_task(&other, &key).await,
        "the outer drop freed a key still held"
    );
    inner.release().await.unwrap();
    assert!(
        free_for_another_task(&other, &key).await,
        "the last holder did not release"
    );
}

async fn another_task_does_not_reenter(env: Env) {
    let locker = env.locker();
    let key = unique_key("reenter-other");
    let held = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let other_task = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(&key, LockOptions::new().timeout(SHORT))
                .await
        })
    };
    let err = other_task.await.unwrap().unwrap_err();
    assert!(
        err.is_timeout(),
        "another task of the same process got in: {err:?}"
    );
    held.release().await.unwrap();
}

/// Waits (up to 10s) until `guard`'s lease ran out on the client's clock: the lease the engine
/// granted, which may be longer than the one asked for (etcd grants whole seconds).
async fn lease_ran_out(guard: &dlock_runtime::LockGuard) {
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("a fixed lease runs out");
}

/// Whether another task can take `key` right now (it releases at once if so).
async fn free_for_another_task(locker: &Locker, key: &str) -> bool {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move { locker.try_acquire(&key, SHORT).await.unwrap().is_some() })
        .await
        .unwrap()
}

/// An attempt whose reply was lost, tried again with the same token: the retry finds the lock
/// its own and is handed a new fence (nobody learnt the first), higher than every fence issued
/// before; the lock still excludes others and releases normally.
async fn a_retry_that_finds_its_own_lock_gets_a_new_fence(env: Env) {
    let (locker, other) = (env.locker(), env.locker());
    let key = unique_key("retried");
    let before = locker.acquire(&key, LockOptions::new()).await.unwrap();
    let earlier = before.fencing_token();
    before.release().await.unwrap();

    let (first, guard) =
        dlock_runtime::__private::attempt_twice(&locker, &key, Duration::from_secs(10))
            .await
            .unwrap();
    assert!(first > earlier, "{first} after {earlier}");
    assert!(
        guard.fencing_token() > first,
        "the retry was handed {} after the lost reply's {first}",
        guard.fencing_token()
    );
    assert!(other.try_acquire(&key, SHORT).await.unwrap().is_none());
    let retried = guard.fencing_token();
    guard.release().await.unwrap();
    let next = other.acquire(&key, LockOptions::new()).await.unwrap();
    assert!(next.fencing_token() > retried);
}

/// `inspect` and `list` tell who holds a lock (this process), since when, with which fence, for
/// how long and how many wait, where the engine can tell; `force_release` frees it from another
/// locker: the waiter gets it with a higher fence, and the old holder finds its hold lost.
async fn operator_sees_who_holds_and_frees_it(env: Env) {
    let (a, b) = (env.locker(), env.locker());
    let key = unique_key("inspect");
    assert_eq!(b.inspect(&key).await.unwrap(), None, "free at first");
    let before = std::time::SystemTime::now() - Duration::from_secs(2);
    let guard = a.acquire(&key, LockOptions::new()).await.unwrap();
    let info = b.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.key, key);
    let holder = info.holder.clone().expect("the holder is recorded");
    assert_eq!(holder.pid, std::process::id());
    assert!(!holder.owner.is_empty() && !holder.host.is_empty());
    let since = holder.since.expect("since when");
    assert!(
        since > before && since < std::time::SystemTime::now() + Duration::from_secs(2),
        "since {since:?}"
    );
    if let Some(fence) = info.fence {
        assert_eq!(fence, guard.fencing_token(), "the holder's fence");
    }
    if let Some(remaining) = info.remaining {
        assert!(
            remaining > Duration::ZERO && remaining <= Duration::from_secs(11),
            "{remaining:?}"
        );
    }
    assert!(
        format!("{info:?}").len() < 1000,
        "no token in what inspect tells: {info:?}"
    );

    // A waiter in another locker is counted where the engine can tell.
    let waiter = {
        let b = b.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            b.acquire(&key, options).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = b.inspect(&key).await.unwrap().expect("still held");
        match info.waiters {
            None | Some(1..) => break,
            Some(0) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Some(0) => panic!("the waiter is never counted"),
        }
    }

    let under = key.rsplit_once(':').unwrap().0;
    // Listed keys come back as given, whatever the engine had to encode.
    let odd = format!("{key}/a%25b/../é");
    let odd_guard = a.acquire(&odd, LockOptions::new()).await.unwrap();
    let listed = b.list(under).await.unwrap();
    assert!(
        listed.iter().any(|i| i.key == key && i.holder.is_some()),
        "{key} not listed under {under}: {listed:?}"
    );
    assert!(
        listed.iter().any(|i| i.key == odd),
        "{odd} not listed under {under}: {listed:?}"
    );
    odd_guard.release().await.unwrap();
    // A key that merely starts with `__` (not a reserved `__word:`) is a lock like any other.
    let underscored = format!("__X{key}");
    let underscored_guard = a.acquire(&underscored, LockOptions::new()).await.unwrap();
    let listed = b.list(&underscored).await.unwrap();
    assert!(
        listed.iter().any(|i| i.key == underscored),
        "{underscored} not listed: {listed:?}"
    );
    underscored_guard.release().await.unwrap();
    assert!(
        b.list(&format!("{key}:nothing")).await.unwrap().is_empty(),
        "nothing under another prefix"
    );

    let freed = b.force_release(&key).await.unwrap().expect("it was held");
    assert_eq!(freed.holder.map(|h| h.pid), Some(std::process::id()));
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the freed lock")
        .unwrap()
        .unwrap();
    assert!(
        next.fencing_token() > guard.fencing_token(),
        "the next holder's fence is above the freed one's"
    );
    let extended = guard.extend(Duration::from_secs(10)).await;
    assert!(
        extended.as_ref().is_err_and(LockError::is_lost),
        "the freed holder's renewal: {extended:?}"
    );
    assert!(!guard.is_held());
    next.release().await.unwrap();
    assert_eq!(b.inspect(&key).await.unwrap(), None, "free after release");
    assert_eq!(
        b.force_release(&key).await.unwrap(),
        None,
        "nothing to free"
    );
    assert!(b.list(under).await.unwrap().iter().all(|i| i.key != key));
    drop(guard);
}

/// `hold_at_least`: a release (or a drop, or the locker's close) before the minimum hold leaves
/// the key taken until then, on the engine's clock; then it lapses and the next holder gets a
/// higher fence. ZooKeeper, whose nodes end with their session, refuses it as a configuration
/// error.
async fn job_lock_stays_taken_for_its_minimum_hold(env: Env) {
    const MINIMUM: Duration = Duration::from_millis(1500);
    let (a, b) = (env.locker(), env.locker());
    let once = || {
        LockOptions::new()
            .timeout(Duration::ZERO)
            .hold_at_least(MINIMUM)
    };
    let key = unique_key("job");
    let first = a.acquire(&key, once()).await;
    if env.url().is_some_and(|u| u.starts_with("zk://")) {
        let err = first.expect_err("ZooKeeper cannot keep a hold past its session");
        assert!(
            err.is_config() && err.to_string().contains("hold_at_least"),
            "{err}"
        );
        return;
    }
    let guard = first.unwrap();
    let taken_at = Instant::now();
    let fence = guard.fencing_token();
    guard.release().await.expect("a kept release succeeds");
    assert!(
        b.try_acquire(&key, SHORT).await.unwrap().is_none(),
        "released within its minimum hold, the key stays taken"
    );
    // Dropped, and its locker closed: still kept (a separate locker; the embedded engine's is
    // shared by this binary's tests, so it is not closed).
    let dropped_key = unique_key("job-dropped");
    let closing = env.locker();
    drop(closing.acquire(&dropped_key, once()).await.unwrap());
    if env.url().is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        closing.close().await.unwrap();
    }
    assert!(
        b.try_acquire(&dropped_key, SHORT).await.unwrap().is_none(),
        "dropped (and its locker closed) within its minimum hold, the key stays taken"
    );
    let next = b
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("the key lapses after its minimum hold");
    let after = taken_at.elapsed();
    assert!(
        after >= MINIMUM - Duration::from_millis(200),
        "taken again {after:?} after the first hold began"
    );
    assert!(next.fencing_token() > fence);
    next.release().await.unwrap();
    let again = b
        .acquire(
            &dropped_key,
            LockOptions::new().timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the dropped hold lapses too");
    again.release().await.unwrap();
    // After the minimum, a release frees the key at once.
    let late = a
        .acquire(
            &key,
            LockOptions::new().hold_at_least(Duration::from_millis(1)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    late.release().await.unwrap();
    assert!(b.try_acquire(&key, SHORT).await.unwrap().is_some());
}
