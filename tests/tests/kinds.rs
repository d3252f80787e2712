//! Semaphores and read/write locks, the same suite on every engine of
//! `dlock_tests::engines::ENGINES`: real servers started by the harness, several lockers (each
//! its own connection) contending, invariants that break on overlap. RedLock refuses both kinds
//! with a `Config` error, which its cases pin.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, LockKind, LockOptions, Locker, dlock};
use dlock_tests::{Engine as Env, unique_key};

dlock_tests::engine_suite!(
    semaphore_admits_at_most_its_permits,
    readers_share_and_writers_are_alone,
    a_waiting_writer_stops_new_readers,
    a_writer_is_not_starved_by_a_stream_of_readers,
    upgrade_is_refused_and_a_writer_reads,
    kinds_do_not_mix_on_one_key,
    given_up_and_cancelled_waiters_leave_nothing,
    a_lapsed_permit_returns,
    renewed_and_extended_shared_holds,
    the_attribute_takes_permits_read_and_write,
    operator_sees_shared_holds,
    a_lapsed_shared_lock_is_free_for_any_kind,
    a_lapsed_mutex_is_lost_where_a_semaphore_now_is,
    a_shared_body_stops_when_its_lease_runs_out,
);

const NOW: Duration = Duration::ZERO;

fn redlock(env: &Env) -> bool {
    env.url().is_some_and(|u| u.starts_with("redis+redlock"))
}

/// RedLock refuses the shared kinds with a `Config` error saying why: `true` when `env` is
/// RedLock (the case has checked that and ends).
async fn refused_on_redlock(env: &Env) -> bool {
    if !redlock(env) {
        return false;
    }
    let locker = env.locker();
    for options in [
        LockOptions::new().permits(2),
        LockOptions::new().read(),
        LockOptions::new().write(),
    ] {
        let error = locker
            .acquire(&unique_key("redlock"), options)
            .await
            .unwrap_err();
        assert!(error.is_config(), "{error}");
        assert!(error.to_string().contains("majorit"), "{error}");
    }
    true
}

/// A client of its own, as another process would be: on the embedded engine a locker of its
/// own (its own in-process line) over the process's table, elsewhere `env.locker()`.
fn separate(env: &Env) -> Locker {
    if env.url().is_some() {
        return env.locker();
    }
    Locker::builder()
        .url("memory://")
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a memory locker")
}

fn wait(options: LockOptions) -> LockOptions {
    options.timeout(Duration::from_secs(30))
}

async fn semaphore_admits_at_most_its_permits(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    const PERMITS: u32 = 3;
    const LOCKERS: usize = 8;
    const ROUNDS: usize = 6;
    let key = unique_key("permits");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // The highest fence of the holds released so far: a permit granted after a release must
    // have a higher one (fences increase in the order permits are granted).
    let released = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..LOCKERS {
        let locker = separate(&env);
        let (key, inside, most, released, fences) = (
            key.clone(),
            inside.clone(),
            most.clone(),
            released.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let before = released.load(Ordering::SeqCst);
                let permit = locker
                    .acquire_permit(&key, PERMITS, wait(LockOptions::new()))
                    .await
                    .unwrap();
                assert_eq!(permit.kind(), LockKind::semaphore(PERMITS));
                let fence = permit.fencing_token();
                assert!(
                    fence > before,
                    "fence {fence} not above a released {before}"
                );
                fences.lock().unwrap().push(fence);
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    now <= PERMITS as usize,
                    "{now} holders of {PERMITS} permits"
                );
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                released.fetch_max(fence, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most > 1,
        "{LOCKERS} lockers never held two of {PERMITS} permits at once"
    );
    let mut fences = fences.lock().unwrap().clone();
    let all = fences.len();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), all, "two permits had the same fence");
    assert_eq!(all, LOCKERS * ROUNDS);
}

async fn readers_share_and_writers_are_alone(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let key = unique_key("rw");
    // Two readers at once, in two lockers.
    let (a, b) = (env.locker(), env.locker());
    let r1 = a
        .acquire_read(&key, LockOptions::new().timeout(NOW))
        .await
        .unwrap();
    let r2 = b
        .acquire_read(&key, LockOptions::new().timeout(NOW))
        .await
        .unwrap();
    assert_eq!(r1.kind(), LockKind::Read);
    let w = env
        .locker()
        .acquire_write(&key, LockOptions::new().timeout(NOW))
        .await;
    assert!(
        w.as_ref().is_err_and(LockError::is_timeout),
        "a writer beside readers: {w:?}"
    );
    r1.release().await.unwrap();
    r2.release().await.unwrap();

    // Contention: readers and writers in many lockers; a writer finds nobody inside, and its
    // non-atomic counter loses nothing.
    const WRITERS: usize = 3;
    const READERS: usize = 5;
    const ROUNDS: u64 = 6;
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writer_in = Arc::new(AtomicBool::new(false));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicU64::new(0));
    let last_writer_fence = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..WRITERS + READERS {
        let locker = separate(&env);
        let (key, readers_in, writer_in, most_readers, counter, last_writer_fence) = (
            key.clone(),
            readers_in.clone(),
            writer_in.clone(),
            most_readers.clone(),
            counter.clone(),
            last_writer_fence.clone(),
        );
        let writer = i < WRITERS;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                if writer {
                    let guard = locker
                        .acquire_write(&key, wait(LockOptions::new()))
                        .await
                        .unwrap();
                    let fence = guard.fencing_token();
                    let last = last_writer_fence.swap(fence, Ordering::SeqCst);
                    assert!(fence > last, "writer fence {fence} after {last}");
                    assert!(!writer_in.swap(true, Ordering::SeqCst), "two writers");
                    assert_eq!(
                        readers_in.load(Ordering::SeqCst),
                        0,
                        "a writer with readers"
                    );
                    dlock_tests::racy_increment(&counter).await;
                    assert_eq!(readers_in.load(Ordering::SeqCst), 0, "a reader came in");
                    writer_in.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                } else {
                    let guard = locker
                        .acquire_read(&key, wait(LockOptions::new()))
                        .await
                        .unwrap();
                    let now = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(now, Ordering::SeqCst);
                    assert!(!writer_in.load(Ordering::SeqCst), "a reader with a writer");
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    assert!(!writer_in.load(Ordering::SeqCst), "a writer came in");
                    readers_in.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), WRITERS as u64 * ROUNDS);
    assert!(most_readers.load(Ordering::SeqCst) >= 1);
}

async fn a_waiting_writer_stops_new_readers(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let key = unique_key("writer-first");
    let reader = env
        .locker()
        .acquire_read(&key, LockOptions::new())
        .await
        .unwrap();
    let writer_locker = env.locker();
    let writer = tokio::spawn({
        let key = key.clone();
        async move {
            writer_locker
                .acquire_write(&key, wait(LockOptions::new()))
                .await
                .map(|guard| (guard, writer_locker))
        }
    });
    // Until the writer is in line, a new reader may still pass: ask until one is refused.
    let late = env.locker();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match late
            .acquire_read(&key, LockOptions::new().timeout(NOW))
            .await
        {
            Err(e) if e.is_timeout() => break,
            Ok(guard) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "readers kept passing a waiting writer"
                );
                guard.release().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    reader.release().await.unwrap();
    let (guard, _writer_locker) = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gets the lock once the reader leaves")
        .unwrap()
        .unwrap();
    assert_eq!(guard.kind(), LockKind::Write);
    guard.release().await.unwrap();
    let again = late
        .acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(
        again.is_ok(),
        "readers come back after the writer: {again:?}"
    );
}

async fn a_writer_is_not_starved_by_a_stream_of_readers(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let key = unique_key("stream");
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    // Eight readers in turn, each holding 150ms and coming straight back: the key is never
    // without a reader (each is out only while it releases and asks again, and they are 20ms
    // apart), so a writer waits for ever unless it stops new ones.
    for _ in 0..8 {
        let (locker, key, stop) = (separate(&env), key.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let guard = locker
                    .acquire_read(&key, wait(LockOptions::new()))
                    .await
                    .unwrap();
                reads += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
                guard.release().await.unwrap();
            }
            reads
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let writer = separate(&env)
        .acquire_write(&key, LockOptions::new().timeout(Duration::from_secs(10)))
        .await;
    stop.store(true, Ordering::SeqCst);
    let guard = writer.expect("a writer gets in among a stream of readers");
    guard.release().await.unwrap();
    let mut reads = 0;
    for reader in readers {
        reads += reader.await.unwrap();
    }
    assert!(reads >= 8, "the readers ran: {reads}");
}

async fn upgrade_is_refused_and_a_writer_reads(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let locker = env.locker();
    let key = unique_key("upgrade");
    let reader = locker.acquire_read(&key, LockOptions::new()).await.unwrap();
    let upgrade = reader
        .scope(locker.acquire_write(&key, LockOptions::new()))
        .await;
    let error = upgrade.unwrap_err();
    assert!(error.is_conflict(), "{error}");
    assert!(error.to_string().contains("not upgraded"), "{error}");
    // Another read in the scope re-enters.
    let again = reader
        .scope(locker.acquire_read(&key, LockOptions::new().timeout(NOW)))
        .await
        .unwrap();
    assert_eq!(again.fencing_token(), reader.fencing_token());
    drop(again);
    reader.release().await.unwrap();

    let writer = locker
        .acquire_write(&key, LockOptions::new())
        .await
        .unwrap();
    let read = writer
        .scope(locker.acquire_read(&key, LockOptions::new().timeout(NOW)))
        .await
        .expect("a writer reads what it holds");
    assert_eq!(read.fencing_token(), writer.fencing_token());
    drop(read);
    assert!(writer.is_held());
    writer.release().await.unwrap();
}

async fn kinds_do_not_mix_on_one_key(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let (a, b) = (env.locker(), env.locker());
    let conflict = |result: Result<dlock_runtime::LockGuard, LockError>, what: &str| {
        let error = result.expect_err(what);
        assert!(error.is_conflict(), "{what}: {error}");
        assert!(!error.to_string().is_empty());
    };
    let key = unique_key("mixed");
    let permit = a.acquire_permit(&key, 3, LockOptions::new()).await.unwrap();
    conflict(
        b.acquire_permit(&key, 5, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "another permit count",
    );
    conflict(
        b.acquire(&key, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a mutex on a semaphore",
    );
    conflict(
        b.acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a read lock on a semaphore",
    );
    // A fair mutex (which waits in the engine's queue) is told so too.
    conflict(
        b.acquire(
            &key,
            LockOptions::new().fair().timeout(Duration::from_secs(1)),
        )
        .await,
        "a fair mutex on a semaphore",
    );
    // The same count is one more permit.
    let second = b
        .acquire_permit(&key, 3, LockOptions::new().timeout(NOW))
        .await
        .unwrap();
    second.release().await.unwrap();
    permit.release().await.unwrap();

    let key = unique_key("mixed");
    let mutex = a.acquire(&key, LockOptions::new()).await.unwrap();
    conflict(
        b.acquire_permit(&key, 2, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a semaphore on a mutex",
    );
    conflict(
        b.acquire_write(&key, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a write lock on a mutex",
    );
    mutex.release().await.unwrap();

    let key = unique_key("mixed");
    let reader = a.acquire_read(&key, LockOptions::new()).await.unwrap();
    conflict(
        b.acquire(&key, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a mutex on a read lock",
    );
    conflict(
        b.acquire_permit(&key, 1, LockOptions::new().timeout(Duration::from_secs(1)))
            .await,
        "a semaphore on a read lock",
    );
    reader.release().await.unwrap();
    // Once free, the key may be taken as another kind.
    let later = b
        .acquire_permit(&key, 2, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(later.is_ok(), "a free key is any kind: {later:?}");
    let zero = b
        .acquire_permit(&unique_key("zero"), 0, LockOptions::new())
        .await;
    assert!(zero.is_err_and(|e| e.is_config()));
}

async fn given_up_and_cancelled_waiters_leave_nothing(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let (a, b) = (env.locker(), env.locker());
    // A writer that times out behind a reader leaves no claim: readers pass at once after.
    let key = unique_key("ghost-writer");
    let reader = a.acquire_read(&key, LockOptions::new()).await.unwrap();
    let gave_up = b
        .acquire_write(&key, LockOptions::new().timeout(Duration::from_millis(300)))
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    let next_reader = env
        .locker()
        .acquire_read(&key, LockOptions::new().timeout(NOW))
        .await;
    assert!(
        next_reader.is_ok(),
        "a writer that gave up still keeps readers out: {next_reader:?}"
    );
    drop(next_reader);

    // A writer whose wait is dropped: its cleanup runs in the background.
    let waiting = b.acquire_write(&key, wait(LockOptions::new()));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err()
    );
    let next_reader = env
        .locker()
        .acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(
        next_reader.is_ok(),
        "a dropped writer still keeps readers out: {next_reader:?}"
    );
    drop(next_reader);
    reader.release().await.unwrap();
    let rw_key = key;

    // A permit waiter that times out, and one dropped, take no permit.
    let key = unique_key("ghost-permit");
    let permit = a.acquire_permit(&key, 1, LockOptions::new()).await.unwrap();
    let gave_up = b
        .acquire_permit(
            &key,
            1,
            LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    let dropped = b.acquire_permit(&key, 1, wait(LockOptions::new()));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), dropped)
            .await
            .is_err()
    );
    permit.release().await.unwrap();
    let next = env
        .locker()
        .acquire_permit(&key, 1, LockOptions::new().timeout(Duration::from_secs(2)))
        .await
        .expect("the only permit is free");
    next.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in [rw_key, key] {
        let left = env.leftovers(&format!("dlock:{key}")).await;
        assert!(left.is_empty(), "left in the engine for {key}: {left:?}");
    }
}

async fn a_lapsed_permit_returns(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let key = unique_key("lapse");
    let holder = env.locker();
    let first = holder
        .acquire_permit(
            &key,
            1,
            LockOptions::new().expire(Duration::from_millis(800)),
        )
        .await
        .unwrap();
    let fence = first.fencing_token();
    // Never released: its lease ends it.
    std::mem::forget(first);
    let other = env.locker();
    let started = tokio::time::Instant::now();
    let next = other
        .acquire_permit(&key, 1, LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("the permit returns when its lease ends");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(next.fencing_token() > fence);
    next.release().await.unwrap();

    let key = unique_key("lapse-writer");
    let writer = holder
        .acquire_write(&key, LockOptions::new().expire(Duration::from_millis(800)))
        .await
        .unwrap();
    let fence = writer.fencing_token();
    std::mem::forget(writer);
    let reader = other
        .acquire_read(&key, LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("a lapsed writer lets readers in");
    assert!(reader.fencing_token() > fence);
    reader.release().await.unwrap();
}

async fn renewed_and_extended_shared_holds(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let locker = env.locker_with_expire(Duration::from_millis(900));
    let key = unique_key("renewed");
    let permit = locker
        .acquire_permit(&key, 2, LockOptions::new().expire_auto())
        .await
        .unwrap();
    let reader = locker
        .acquire_read(&unique_key("renewed-r"), LockOptions::new().expire_auto())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(permit.is_held() && reader.is_held(), "renewal keeps them");
    // The same locker (the embedded engine's locker with its own lease has a table of its
    // own): each acquisition is a holder of its own.
    let other = &locker;
    let second = other
        .acquire_permit(&key, 2, LockOptions::new().timeout(NOW))
        .await
        .expect("one permit left");
    let third = other
        .acquire_permit(&key, 2, LockOptions::new().timeout(NOW))
        .await;
    assert!(
        third.is_err_and(|e| e.is_timeout()),
        "both permits are held"
    );
    second.extend(Duration::from_secs(5)).await.unwrap();
    second.release().await.unwrap();
    permit.release().await.unwrap();
    reader.release().await.unwrap();

    // A lapsed permit is not re-created by an extension.
    let short = other
        .acquire_permit(
            &key,
            2,
            LockOptions::new().expire(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let late = short.extend(Duration::from_secs(5)).await;
    assert!(
        late.is_err_and(|e| e.is_lost()),
        "a lapsed permit came back"
    );
    let info = other.inspect(&key).await.unwrap();
    assert!(info.is_none(), "{info:?}");

    // Nor one freed under it while its lease runs on the client's clock (the extend is sent).
    let freed = other
        .acquire_permit(&key, 2, LockOptions::new().expire(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(other.force_release(&key).await.unwrap().is_some());
    let late = freed.extend(Duration::from_secs(5)).await;
    assert!(
        late.is_err_and(|e| e.is_lost()),
        "a freed permit was extended"
    );
    let info = other.inspect(&key).await.unwrap();
    assert!(info.is_none(), "{info:?}");
}

async fn the_attribute_takes_permits_read_and_write(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    #[dlock(key = "attr-permits:<run>", permits = 2, client = locker, timeout = "30s")]
    async fn export(
        locker: &Locker,
        run: &str,
        inside: &AtomicUsize,
        most: &AtomicUsize,
    ) -> Result<u64, LockError> {
        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        assert!(now <= 2, "{now} bodies of a 2-permit function");
        tokio::time::sleep(Duration::from_millis(30)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        Ok(dlock_runtime::fencing_token().unwrap())
    }

    #[dlock(key = "attr-doc:<run>", read, client = locker, timeout = "30s")]
    async fn show(locker: &Locker, run: &str, writing: &AtomicBool) -> Result<(), LockError> {
        assert!(!writing.load(Ordering::SeqCst), "a read beside a write");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!writing.load(Ordering::SeqCst), "a write came in");
        Ok(())
    }

    #[dlock(key = "attr-doc:<run>", write, client = locker, timeout = "30s")]
    async fn edit(locker: &Locker, run: &str, writing: &AtomicBool) -> Result<(), LockError> {
        assert!(!writing.swap(true, Ordering::SeqCst), "two writes");
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Reading under the write lock re-enters.
        show(locker, run, &AtomicBool::new(false)).await?;
        writing.store(false, Ordering::SeqCst);
        Ok(())
    }

    let run = unique_key("run");
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (locker, run, inside, most) = (env.locker(), run.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            export(&locker, &run, &inside, &most).await.unwrap()
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "two permits used together");

    let writing = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (locker, run, writing) = (env.locker(), run.clone(), writing.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                if i % 3 == 0 {
                    edit(&locker, &run, &writing).await.unwrap();
                } else {
                    show(&locker, &run, &writing).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

async fn operator_sees_shared_holds(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let (a, b, operator) = (env.locker(), env.locker(), env.locker());
    let key = unique_key("inspect-permits");
    let p1 = a.acquire_permit(&key, 3, LockOptions::new()).await.unwrap();
    let p2 = b.acquire_permit(&key, 3, LockOptions::new()).await.unwrap();
    let info = operator.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.kind, LockKind::semaphore(3));
    assert_eq!(info.holders, 2);
    let holder = info.holder.expect("recorded");
    assert_eq!(holder.pid, std::process::id());
    if let Some(fence) = info.fence {
        assert!(
            fence == p1.fencing_token() || fence == p2.fencing_token(),
            "{fence}"
        );
    }
    let listed = operator.list(&key).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].kind, LockKind::semaphore(3));

    let freed = operator.force_release(&key).await.unwrap().expect("freed");
    assert_eq!(freed.holders, 2);
    assert_eq!(operator.inspect(&key).await.unwrap(), None);
    assert!(
        p1.extend(Duration::from_secs(5))
            .await
            .unwrap_err()
            .is_lost()
    );
    assert!(
        p2.extend(Duration::from_secs(5))
            .await
            .unwrap_err()
            .is_lost()
    );
    let after = operator
        .acquire_permit(&key, 3, LockOptions::new().timeout(NOW))
        .await
        .unwrap();
    assert!(after.fencing_token() > p1.fencing_token().max(p2.fencing_token()));
    after.release().await.unwrap();

    let key = unique_key("inspect-rw");
    let r = a.acquire_read(&key, LockOptions::new()).await.unwrap();
    let info = operator.inspect(&key).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::Read, 1));
    r.release().await.unwrap();
    let w = a.acquire_write(&key, LockOptions::new()).await.unwrap();
    let info = operator.inspect(&key).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::Write, 1));
    w.release().await.unwrap();
    assert_eq!(operator.inspect(&key).await.unwrap(), None);
}

/// A reader with a long lease takes and releases the key, one with a short lease is never
/// released and lapses: nothing is live, though the engine may keep the lock's container until
/// the longest lease it had (a Redis hash's expiry, PostgreSQL's key row): a mutex, a semaphore
/// and a writer take the key at once (regression: the mutex was refused with a conflict).
async fn a_lapsed_shared_lock_is_free_for_any_kind(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    // The three at once: each waits out a lapse.
    let cases = [
        LockOptions::new(),
        LockOptions::new().permits(2),
        LockOptions::new().write(),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, next)| {
        let (locker, other) = (env.locker(), env.locker());
        async move {
            let key = unique_key(&format!("lapsed-{i}"));
            let long = locker
                .acquire_read(&key, LockOptions::new().expire(Duration::from_secs(60)))
                .await
                .unwrap();
            let short = locker
                .acquire_read(&key, LockOptions::new().expire(Duration::from_millis(400)))
                .await
                .unwrap();
            long.release().await.unwrap();
            std::mem::forget(short);
            tokio::time::sleep(Duration::from_millis(900)).await;
            let taken = other
                .acquire(&key, next.clone().timeout(Duration::from_secs(2)))
                .await;
            assert!(
                taken.is_ok(),
                "{next:?} after a lapsed read lock: {taken:?}"
            );
        }
    });
    futures_join_all(cases).await;
}

/// Runs `futures` together on this task.
async fn futures_join_all<F: std::future::Future<Output = ()>>(
    futures: impl IntoIterator<Item = F>,
) {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        pending.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// A mutex hold lapses and the key is taken as a semaphore meanwhile: the old holder's renewal
/// and release say `Lost` (regression: Redis answered with a backend error).
async fn a_lapsed_mutex_is_lost_where_a_semaphore_now_is(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    let key = unique_key("lapsed-mutex");
    let old = env
        .locker()
        .acquire(&key, LockOptions::new().expire(Duration::from_millis(300)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let permit = env
        .locker()
        .acquire_permit(&key, 2, LockOptions::new().timeout(Duration::from_secs(2)))
        .await
        .expect("the lapsed mutex's key is free");
    let extended = old.extend(Duration::from_secs(5)).await;
    assert!(
        extended.is_err_and(|e| e.is_lost()),
        "renewal of a lapsed mutex"
    );
    permit.release().await.unwrap();
}

/// A permit's and a reader's body whose fixed lease runs out is stopped and the call returns
/// `Lost`, as a mutex's is; the permit is free again after.
async fn a_shared_body_stops_when_its_lease_runs_out(env: Env) {
    if refused_on_redlock(&env).await {
        return;
    }
    #[dlock(key = "<key>", permits = 2, expire = "400ms", client = locker)]
    async fn export(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<(), LockError> {
        tokio::time::sleep(Duration::from_secs(3)).await;
        ran.store(true, Ordering::SeqCst);
        Ok(())
    }
    #[dlock(key = "<key>", read, expire = "400ms", client = locker)]
    async fn show(locker: &Locker, key: &str, ran: &AtomicBool) -> Result<(), LockError> {
        tokio::time::sleep(Duration::from_secs(3)).await;
        ran.store(true, Ordering::SeqCst);
        Ok(())
    }
    let locker = env.locker();
    let (key, ran) = (unique_key("stopped-permit"), AtomicBool::new(false));
    let started = tokio::time::Instant::now();
    let error = export(&locker, &key, &ran).await.unwrap_err();
    assert!(error.is_lost(), "{error}");
    assert!(!ran.load(Ordering::SeqCst), "the body ran past its lease");
    assert!(started.elapsed() < Duration::from_secs(2));
    let key = unique_key("stopped-read");
    let error = show(&locker, &key, &ran).await.unwrap_err();
    assert!(error.is_lost(), "{error}");
    assert!(!ran.load(Ordering::SeqCst), "the body ran past its lease");
    let writer = locker
        .acquire_write(&key, LockOptions::new().timeout(Duration::from_secs(2)))
        .await;
    assert!(writer.is_ok(), "the stopped reader let go: {writer:?}");
}
