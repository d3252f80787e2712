//! The `dlock` command end to end, on every engine that serves several processes (all but the
//! embedded table): `show`, `ls`, `ping` and `wait` tell what the library holds; `dlock run`
//! processes never overlap and hand their commands increasing fences; a forced release lets
//! the next holder in, whose fence makes the resource refuse the old holder's late write, while
//! the old holder's guard reports the loss; a `dlock run` whose lock is freed by force stops
//! its command. `dlock run --permits/--read/--write` admits as the kinds do; `--hold-at-least`
//! keeps the key taken after the command ended.

use std::{path::PathBuf, process::Stdio, time::Duration};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{Engine, store::Store, unique_key};
use tokio::{process::Command, time::Instant};

dlock_tests::engine_suite!(
    @engines [redis, redis_acl, redis_cluster, redis_sentinel, redlock, postgres, etcd, etcd_cluster, zookeeper, zookeeper_ensemble]
    [
        show_ls_ping_and_wait_tell_what_is_held,
        runs_never_overlap_and_get_increasing_fences,
        forced_release_fences_out_the_old_holder,
        run_stops_its_command_when_the_lock_is_lost,
        run_forwards_signals_and_exits_with_the_command_status,
        run_takes_permits_and_read_write_holds,
        run_keeps_a_job_lock_for_its_minimum
    ]
);

/// Every test of this file runs at once, on 2 cores beside the engines' servers: a request
/// may take longer than the default bound.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// `dlock` with `args`, on `env`'s engine and nothing else of this environment's `DLOCK_*`.
fn dlock(env: &Engine, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") {
            command.env_remove(name);
        }
    }
    command
        .env("DLOCK_URL", env.url().expect("a served engine"))
        // Sixteen of these tests run at once on 2 cores, beside the engines' servers.
        .env("DLOCK_REQUEST_TIMEOUT", "2s")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `dlock args` to its end: exit code, stdout, stderr.
async fn output(env: &Engine, args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), dlock(env, args).output())
        .await
        .unwrap_or_else(|_| panic!("dlock {args:?} did not end within a minute"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("dlock-cli-{}", unique_key(name).replace(':', "-")));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn show_ls_ping_and_wait_tell_what_is_held(env: Engine) {
    let (code, out, err) = output(&env, &["ping"]).await;
    assert_eq!(code, 0, "ping: {out}{err}");
    assert!(out.starts_with("ok"), "{out}");

    let owner = Locker::builder()
        .url(env.url().unwrap())
        .request_timeout(REQUEST_TIMEOUT)
        .owner("cli test")
        .build()
        .unwrap();
    let key = unique_key("cli-show");
    let (code, out, _) = output(&env, &["show", &key]).await;
    assert_eq!((code, out.trim()), (0, format!("{key} is free").as_str()));

    let guard = owner.acquire(&key, LockOptions::new()).await.unwrap();
    let (code, out, err) = output(&env, &["--json", "show", &key]).await;
    assert_eq!(code, 0, "{err}");
    let shown = json(&out);
    assert_eq!(shown["held"], true);
    assert_eq!(shown["holder"]["owner"], "cli test");
    assert_eq!(shown["holder"]["pid"], std::process::id());
    if !shown["fence"].is_null() {
        assert_eq!(shown["fence"], guard.fencing_token());
    }
    let (code, out, _) = output(&env, &["show", &key]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("held by cli test on ")
            && out.contains(&format!("(pid {})", std::process::id())),
        "{out}"
    );

    let under = key.rsplit_once(':').unwrap().0;
    let (code, out, err) = output(&env, &["--json", "ls", under]).await;
    assert_eq!(code, 0, "{err}");
    let listed = json(&out);
    let listed = listed.as_array().expect("an array");
    assert!(
        listed
            .iter()
            .any(|l| l["key"] == key.as_str() && l["holder"]["owner"] == "cli test"),
        "{out}"
    );
    let (code, out, _) = output(&env, &["ls", under]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("KEY") && out.contains(&key), "{out}");

    let (code, _, err) = output(&env, &["wait", &key, "--timeout", "300ms"]).await;
    assert_eq!(code, 75, "wait gives up while it is held: {err}");
    assert!(err.contains("cli test"), "says who holds it: {err}");
    let waiting = dlock(&env, &["wait", &key, "--timeout", "20s"]).output();
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        guard.release().await.unwrap();
    };
    let (waited, ()) = tokio::join!(waiting, release);
    assert_eq!(
        waited.unwrap().status.code(),
        Some(0),
        "wait returns once it is free"
    );

    // A semaphore and a read lock show their kind and holders (RedLock holds neither).
    if !env.url().unwrap().starts_with("redis+redlock") {
        let key = unique_key("cli-permits");
        let p1 = owner
            .acquire_permit(&key, 3, LockOptions::new())
            .await
            .unwrap();
        let p2 = owner
            .acquire_permit(&key, 3, LockOptions::new())
            .await
            .unwrap();
        let (code, out, err) = output(&env, &["--json", "show", &key]).await;
        assert_eq!(code, 0, "{err}");
        let shown = json(&out);
        assert_eq!(
            (&shown["kind"], &shown["permits"], &shown["holders"]),
            (&json("\"semaphore\""), &json("3"), &json("2")),
            "{out}"
        );
        let (_, out, _) = output(&env, &["show", &key]).await;
        assert!(out.contains("semaphore of 3 permits, 2 taken"), "{out}");
        let under = key.rsplit_once(':').unwrap().0;
        let (_, out, _) = output(&env, &["ls", under]).await;
        assert!(out.contains("sem 2/3"), "{out}");
        p1.release().await.unwrap();
        p2.release().await.unwrap();
        let key = unique_key("cli-read");
        let reader = owner.acquire_read(&key, LockOptions::new()).await.unwrap();
        let (_, out, _) = output(&env, &["--json", "show", &key]).await;
        assert_eq!(json(&out)["kind"], "read", "{out}");
        reader.release().await.unwrap();
    }

    let (code, _, err) = output(&env, &["show", ""]).await;
    assert_eq!(code, 65, "an empty key: {err}");
    let password_free = err.to_lowercase();
    assert!(!password_free.contains("secret"), "{err}");
}

/// Three shells each run `dlock run` three times on one key around a racy read-modify-write of
/// a file, and append their `DLOCK_FENCE`: the counter is exact and the fences increase in the
/// order the holds happened.
async fn runs_never_overlap_and_get_increasing_fences(env: Engine) {
    let dir = temp_dir("overlap");
    let (counter, fences) = (dir.join("counter"), dir.join("fences"));
    std::fs::write(&counter, "0").unwrap();
    let key = unique_key("cli-run");
    let body = format!(
        "n=$(cat '{c}'); sleep 0.03; echo $((n + 1)) > '{c}'; echo \"$DLOCK_FENCE\" >> '{f}'",
        c = counter.display(),
        f = fences.display()
    );
    let shells: Vec<_> = (0..3)
        .map(|_| {
            let mut shell = Command::new("sh");
            shell
                .arg("-c")
                .arg(format!(
                    "for i in 1 2 3; do \"$DLOCK\" run '{key}' --timeout 30s -- sh -c \"$BODY\" || exit $?; done"
                ))
                .env("DLOCK", env!("CARGO_BIN_EXE_dlock"))
                .env("DLOCK_URL", env.url().unwrap())
                .env("DLOCK_REQUEST_TIMEOUT", "2s")
                .env("BODY", &body)
                .kill_on_drop(true);
            shell.spawn().unwrap()
        })
        .collect();
    for mut shell in shells {
        let status = tokio::time::timeout(Duration::from_secs(120), shell.wait())
            .await
            .expect("the shells end")
            .unwrap();
        assert!(status.success(), "a shell failed: {status}");
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "9");
    let fences: Vec<u64> = std::fs::read_to_string(&fences)
        .unwrap()
        .lines()
        .map(|l| l.parse().expect("a fence"))
        .collect();
    assert_eq!(fences.len(), 9);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences in hold order: {fences:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A holder that is "gone" (alive here, but an operator frees its lock): `dlock release
/// --force` says who held it; the next holder's fence is higher, so the fenced resource takes
/// its write and refuses the old holder's late one; the old holder's renewal finds it lost.
async fn forced_release_fences_out_the_old_holder(env: Engine) {
    let store = Store::open(&env.data_url().unwrap()).await.unwrap();
    let old = Locker::builder()
        .url(env.url().unwrap())
        .request_timeout(REQUEST_TIMEOUT)
        .owner("stuck worker")
        .expire(Duration::from_secs(10))
        .build()
        .unwrap();
    let key = unique_key("cli-force");
    let guard = old
        .acquire(&key, LockOptions::new().expire_auto())
        .await
        .unwrap();
    assert!(
        store
            .fenced_write(&key, guard.fencing_token(), "old")
            .await
            .unwrap()
    );

    let (code, out, err) = output(&env, &["release", &key]).await;
    assert_eq!(code, 2, "--force is required: {err}");
    let (code, out2, err) = output(&env, &["release", &key, "--force"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out2.contains("stuck worker"), "says whom it freed: {out2}");
    assert!(
        err.contains("audit") && err.contains("by force") && err.contains(&key),
        "the audit line: {err}"
    );

    let next = Locker::builder()
        .url(env.url().unwrap())
        .request_timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let new = next
        .acquire(&key, LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .expect("the freed lock is free");
    assert!(new.fencing_token() > guard.fencing_token());
    assert!(
        store
            .fenced_write(&key, new.fencing_token(), "new")
            .await
            .unwrap()
    );
    assert!(
        !store
            .fenced_write(&key, guard.fencing_token(), "late")
            .await
            .unwrap(),
        "the old holder's late write is refused"
    );
    assert_eq!(store.resource(&key).await.unwrap().as_deref(), Some("new"));
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder learns it lost the lock at its next renewal");
    new.release().await.unwrap();
    let (code, out, _) = output(&env, &["release", &key, "--force"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("was free"), "{out}");
}

/// A `dlock run` whose lock is freed by force stops its command's whole process group (the
/// shell and the `sleep` it started) and exits 76.
async fn run_stops_its_command_when_the_lock_is_lost(env: Engine) {
    let key = unique_key("cli-lost");
    let dir = temp_dir("lost");
    let pid_file = dir.join("pid");
    let script = format!("sleep 60 & echo $! > '{}'; wait", pid_file.display());
    let mut run = dlock(
        &env,
        &[
            "run", &key, "--expire", "10s", "--grace", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let watcher = Locker::builder()
        .url(env.url().unwrap())
        .request_timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while watcher.inspect(&key).await.unwrap().is_none() {
        if let Some(status) = run.try_wait().unwrap() {
            let mut err = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut run.stderr.take().unwrap(), &mut err)
                .await
                .unwrap();
            panic!("dlock run ended before it took the lock: {status}: {err}");
        }
        assert!(Instant::now() < deadline, "dlock run never took the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, _, err) = output(&env, &["release", &key, "--force"]).await;
    assert_eq!(code, 0, "{err}");
    let status = tokio::time::timeout(Duration::from_secs(15), run.wait())
        .await
        .expect("dlock run stops its command once the lock is lost")
        .unwrap();
    assert_eq!(status.code(), Some(76), "the lost lock's exit status");
    let grandchild: i32 = std::fs::read_to_string(&pid_file)
        .expect("the shell started its sleep")
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(grandchild) {
        assert!(
            Instant::now() < deadline,
            "the command's child {grandchild} outlived the lost lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether process `pid` runs (a zombie waiting for its reaper does not).
fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            // The state follows the parenthesised command name.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
}

/// `dlock run` exits with its command's status and releases the lock; a SIGTERM sent to `dlock`
/// reaches the command (whose trap decides the status); a command that cannot start is 127.
async fn run_forwards_signals_and_exits_with_the_command_status(env: Engine) {
    let key = unique_key("cli-status");
    let (code, _, err) = output(&env, &["run", &key, "--", "sh", "-c", "exit 3"]).await;
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = output(&env, &["run", &key, "--", "/nonexistent/command"]).await;
    assert_eq!(code, 127, "{err}");

    let run = running(
        &env,
        &["run", &key],
        "trap 'exit 42' TERM; echo ready; sleep 30 & wait",
    )
    .await;
    let status = stop(run).await;
    assert_eq!(
        status.code(),
        Some(42),
        "the command's trap decided the status"
    );
    let watcher = Locker::builder()
        .url(env.url().unwrap())
        .request_timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    assert_eq!(watcher.inspect(&key).await.unwrap(), None, "released");
}

/// A command that says it is ready, then sleeps.
const READY: &str = "echo ready; exec sleep 60";

/// `dlock ARGS… -- sh -c SCRIPT`, once SCRIPT has printed `ready` under the lock.
async fn running(env: &Engine, args: &[&str], script: &str) -> tokio::process::Child {
    let mut all = args.to_vec();
    all.extend(["--", "sh", "-c", script]);
    let mut run = dlock(env, &all).stdout(Stdio::piped()).spawn().unwrap();
    let mut ready = String::new();
    let mut stdout = tokio::io::BufReader::new(run.stdout.take().unwrap());
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut ready),
    )
    .await
    .unwrap_or_else(|_| panic!("dlock {args:?}: the command starts under the lock"))
    .unwrap();
    assert_eq!(ready.trim(), "ready", "dlock {args:?}");
    run
}

/// Sends SIGTERM to a `dlock run` (it reaches the command); its exit status once it ended.
async fn stop(mut run: tokio::process::Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(15), run.wait())
        .await
        .expect("dlock run ends with its command")
        .unwrap()
}

/// Two `dlock run --permits 2` run at once and a third finds no permit (75); another permit
/// count or the mutex is a conflict (79), as the library's. Two readers run together; a writer
/// waits for them; a mutex on a read/write key is a conflict. RedLock refuses the kinds (78).
async fn run_takes_permits_and_read_write_holds(env: Engine) {
    let key = unique_key("cli-permits");
    if env.url().is_some_and(|u| u.starts_with("redis+redlock")) {
        let (code, _, err) = output(&env, &["run", &key, "--permits", "2", "--", "true"]).await;
        assert_eq!(code, 78, "RedLock cannot count holders: {err}");
        assert!(err.contains("permits"), "{err}");
        return;
    }
    let first = running(&env, &["run", &key, "--permits", "2"], READY).await;
    let second = running(&env, &["run", &key, "--permits", "2"], READY).await;
    let (code, _, err) = output(
        &env,
        &[
            "run",
            &key,
            "--permits",
            "2",
            "--timeout",
            "300ms",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code, 75, "no third permit: {err}");
    let (code, _, err) = output(
        &env,
        &[
            "run",
            &key,
            "--permits",
            "3",
            "--timeout",
            "5s",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code, 79, "another permit count: {err}");
    let (code, _, err) = output(&env, &["run", &key, "--timeout", "5s", "--", "true"]).await;
    assert_eq!(code, 79, "a mutex on a semaphore: {err}");
    stop(first).await;
    let (code, _, err) = output(&env, &["run", &key, "--permits", "2", "--", "true"]).await;
    assert_eq!(code, 0, "a permit came back: {err}");
    stop(second).await;

    let key = unique_key("cli-rw");
    let readers = [
        running(&env, &["run", &key, "--read"], READY).await,
        running(&env, &["run", &key, "--read"], READY).await,
    ];
    let (code, _, err) = output(
        &env,
        &["run", &key, "--write", "--timeout", "300ms", "--", "true"],
    )
    .await;
    assert_eq!(code, 75, "a writer waits for the readers: {err}");
    let (code, _, err) = output(&env, &["run", &key, "--timeout", "5s", "--", "true"]).await;
    assert_eq!(code, 79, "a mutex on a read/write lock: {err}");
    for reader in readers {
        stop(reader).await;
    }
    let (code, _, err) = output(&env, &["run", &key, "--write", "--", "true"]).await;
    assert_eq!(code, 0, "the writer once the readers left: {err}");
    let (code, _, err) = output(&env, &["run", &key, "--read", "--write", "--", "true"]).await;
    assert_eq!(code, 2, "one kind: {err}");
}

/// `dlock run --hold-at-least 3s -- true` ends at once and leaves the key taken: a run of the
/// same job with `--timeout 0s` skips (75); `dlock wait` sees it free after the minimum.
/// ZooKeeper cannot keep a hold past its session (78).
async fn run_keeps_a_job_lock_for_its_minimum(env: Engine) {
    let key = unique_key("cli-job");
    let started = Instant::now();
    let (code, _, err) = output(&env, &["run", &key, "--hold-at-least", "3s", "--", "true"]).await;
    if env.url().is_some_and(|u| u.starts_with("zk")) {
        assert_eq!(code, 78, "ZooKeeper's holds end with their session: {err}");
        return;
    }
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = output(&env, &["run", &key, "--timeout", "0s", "--", "true"]).await;
    if started.elapsed() < Duration::from_millis(2500) {
        assert_eq!(code, 75, "the job ran again within its minimum: {err}");
    }
    let (code, _, err) = output(&env, &["wait", &key, "--timeout", "30s"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "free before the minimum: {:?}",
        started.elapsed()
    );
    let (code, _, err) = output(
        &env,
        &[
            "run",
            &key,
            "--hold-at-least",
            "3s",
            "--permits",
            "2",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code, 2, "a job lock is a mutex: {err}");
}
