//! Several processes, on every engine: `dlock-worker` processes, each with its own connections,
//! exclude each other (a non-atomic counter kept on the same engine loses no update, and the
//! fences of the holds increase), and a holder frozen past its lease is fenced off (the stale
//! release). The embedded engine has no second process; its table's exclusion is the
//! semantic suite's.

use std::{process::Command, time::Duration};

use dlock_runtime::LockOptions;
use dlock_tests::{Engine, FrozenHolder, store::Store, unique_key};

dlock_tests::engine_suite!(processes_exclude_each_other, a_frozen_holder_is_fenced_off);

/// A `dlock-worker` locking on `engine`'s URL and keeping its data at its data URL, with none of
/// this process's `DLOCK_*` variables.
fn worker(engine: &Engine, key: &str, arg: &str, mode: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock-worker"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") || name == "REDIS_URL" {
            command.env_remove(name);
        }
    }
    let url = engine.url().expect("an engine of its own processes");
    let data = engine.data_url().expect("an engine with data");
    command
        .env("DLOCK_WORKER_DATA_URL", data)
        .args([url, key, arg, mode]);
    command
}

/// The engine's data, as the workers keep it.
async fn store(engine: &Engine) -> Store {
    let data = engine.data_url().expect("an engine with data");
    Store::open(&data).await.expect("the engine's data")
}

/// 4 processes, 2 through the API and 2 through the attribute, each increment one counter 25
/// times non-atomically (read, pause, write) under one lock: the counter ends at 100 (an
/// overlap loses an update), and the fences of the holds recorded by the API processes, in
/// the order of the values they wrote, strictly increase.
async fn processes_exclude_each_other(engine: Engine) {
    const ITERATIONS: u64 = 25;
    if engine.url().is_none() {
        return;
    }
    let key = unique_key("procs");
    let children: Vec<_> = ["api", "attr", "api", "attr"]
        .into_iter()
        .map(|mode| {
            worker(&engine, &key, &ITERATIONS.to_string(), mode)
                .spawn()
                .expect("start dlock-worker")
        })
        .collect();
    for mut child in children {
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "a worker failed: {status}");
    }
    let store = store(&engine).await;
    assert_eq!(
        store.counter(&key).await.unwrap(),
        4 * ITERATIONS,
        "updates were lost: the lock let processes overlap"
    );
    let fences = store.holds(&key).await.unwrap();
    assert_eq!(fences.len(), 2 * usize::try_from(ITERATIONS).unwrap());
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "a later value was written under a fence not above the one before it: {fences:?}"
    );
}

/// A holder process takes the lock with a 1s lease (on ZooKeeper a 1s session) and is frozen
/// past it; the next client gets the lock with a higher fence and writes the fenced resource.
/// On resume the frozen holder learns it lost, the resource refuses its write, and its release
/// deletes nothing: the lock is still the new holder's.
async fn a_frozen_holder_is_fenced_off(engine: Engine) {
    if engine.url().is_none() {
        return;
    }
    let key = unique_key("frozen");
    let mut command = worker(&engine, &key, "1000", "pause-holder");
    let frozen = tokio::task::spawn_blocking(move || FrozenHolder::spawn(&mut command))
        .await
        .unwrap();
    let first = frozen.fence;

    let locker = engine.locker();
    // The server ends the lease (or the session) about a second after the freeze; etcd
    // grants at least its minimum TTL, ZooKeeper at least two ticks.
    let second = locker
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
        .await
        .expect("the next holder gets the lock once the frozen one's lease ends");
    assert!(second.fencing_token() > first);
    let store = store(&engine).await;
    assert!(
        store
            .fenced_write(&key, second.fencing_token(), "written by the new holder")
            .await
            .unwrap(),
        "the new holder's fenced write was refused"
    );

    let report = tokio::task::spawn_blocking(move || frozen.resume())
        .await
        .unwrap();
    assert_eq!(
        report, "held=false lost_resolved=true write_accepted=false release=lost",
        "the frozen holder's view"
    );
    assert_eq!(
        store.resource(&key).await.unwrap().as_deref(),
        Some("written by the new holder")
    );
    assert!(second.is_held());
    assert!(
        locker
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "the stale release deleted the new lock"
    );
    second.release().await.unwrap();
}
