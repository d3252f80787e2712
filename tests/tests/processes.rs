//! Several processes, on every engine: `dlock-worker` processes, each with its own connections,
//! exclude each other (a non-atomic counter kept on the same engine loses no update, and the
//! fences of the holds increase), and a holder frozen past its lease is fenced off (the stale
//! release); semaphores admit at most their permits and read/write locks keep writers alone,
//! across processes, and a killed holder's permit returns when its lease ends. The embedded
//! engine has no second process; its table's exclusion is the semantic suite's.

use std::{process::Command, time::Duration};

use dlock_runtime::LockOptions;
use dlock_tests::{Engine, FrozenHolder, store::Store, unique_key};

dlock_tests::engine_suite!(
    processes_exclude_each_other,
    a_frozen_holder_is_fenced_off,
    processes_share_a_semaphore,
    processes_read_together_and_write_alone,
    a_killed_holders_permit_returns,
);

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

/// The holds a worker printed (`hold <start µs> <end µs> <fence>`): spans inside its holds,
/// by the clock the processes share.
#[derive(Clone, Copy, Debug)]
struct Hold {
    start: u128,
    end: u128,
    fence: u64,
    write: bool,
}

/// Runs the workers (`mode`, `arg`) together on `key` and gathers their holds.
async fn holds_of(engine: &Engine, key: &str, workers: &[(&str, &str)]) -> Vec<Hold> {
    let children: Vec<_> = workers
        .iter()
        .map(|(mode, arg)| {
            let child = worker(engine, key, arg, mode)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start dlock-worker");
            (*mode == "write", child)
        })
        .collect();
    let mut holds = Vec::new();
    for (write, child) in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "a worker failed: {out:?}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if let ["hold", start, end, fence] = fields[..] {
                holds.push(Hold {
                    start: start.parse().unwrap(),
                    end: end.parse().unwrap(),
                    fence: fence.parse().unwrap(),
                    write,
                });
            }
        }
    }
    holds
}

/// The most holds whose spans overlap at one instant.
fn most_at_once(holds: &[Hold]) -> usize {
    let mut edges: Vec<(u128, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end, -1)])
        .collect();
    // Ends before starts at the same instant: touching spans do not overlap.
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

fn shares(engine: &Engine) -> bool {
    engine
        .url()
        .is_some_and(|url| !url.starts_with("redis+redlock"))
}

/// 4 processes take permits of one 2-permit semaphore 15 times each: never more than 2 hold at
/// once, and every permit has a fence of its own.
async fn processes_share_a_semaphore(engine: Engine) {
    if !shares(&engine) {
        return;
    }
    let key = unique_key("procs-permits");
    let holds = holds_of(&engine, &key, &[("permits", "2:15"); 4]).await;
    assert_eq!(holds.len(), 60);
    let most = most_at_once(&holds);
    assert!(most <= 2, "{most} processes held 2 permits at once");
    let mut fences: Vec<u64> = holds.iter().map(|h| h.fence).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), holds.len(), "two permits had one fence");
}

/// 2 writer and 3 reader processes on one read/write lock: a writer's span overlaps no other
/// hold, and writers' fences increase in the order they held.
async fn processes_read_together_and_write_alone(engine: Engine) {
    if !shares(&engine) {
        return;
    }
    let key = unique_key("procs-rw");
    let workers = [
        ("write", "8"),
        ("read", "10"),
        ("read", "10"),
        ("write", "8"),
        ("read", "10"),
    ];
    let mut holds = holds_of(&engine, &key, &workers).await;
    assert_eq!(holds.len(), 46);
    for w in holds.iter().filter(|h| h.write) {
        let beside = holds
            .iter()
            .filter(|h| !std::ptr::eq(*h, w) && h.start < w.end && w.start < h.end)
            .count();
        assert_eq!(beside, 0, "a writer held beside another hold: {w:?}");
    }
    holds.retain(|h| h.write);
    holds.sort_by_key(|h| h.start);
    assert!(
        holds.windows(2).all(|w| w[0].fence < w[1].fence),
        "writers' fences out of order: {holds:?}"
    );
}

/// A process holding the only permit is killed (no release): the permit returns when its lease
/// (on etcd and ZooKeeper its session) ends, with a higher fence.
async fn a_killed_holders_permit_returns(engine: Engine) {
    if !shares(&engine) {
        return;
    }
    let key = unique_key("procs-killed");
    let mut holder = worker(&engine, &key, "1500", "kill-holder")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start dlock-worker");
    let stdout = holder.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let fence: u64 = line
        .trim()
        .strip_prefix("acquired ")
        .unwrap_or_else(|| panic!("the holder said {line:?}"))
        .parse()
        .unwrap();
    holder.kill().unwrap();
    let _ = holder.wait();
    let killed = std::time::Instant::now();
    let locker = engine.locker();
    let busy = locker
        .acquire_permit(&key, 1, LockOptions::new().timeout(Duration::ZERO))
        .await;
    assert!(
        busy.is_err_and(|e| e.is_timeout()),
        "a killed holder's permit was free at once"
    );
    let next = locker
        .acquire_permit(&key, 1, LockOptions::new().timeout(Duration::from_secs(30)))
        .await
        .expect("the permit returns when the killed holder's lease ends");
    assert!(next.fencing_token() > fence);
    assert!(killed.elapsed() < Duration::from_secs(30));
    next.release().await.unwrap();
}
