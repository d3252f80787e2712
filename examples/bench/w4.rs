//! W4 "hot key", on the Redis engines: processes × waiters on ONE key, where dlock's in-process
//! line, its queue of places and passing show. Each process is this program, re-run as
//! `--w4-child`.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use dlock_runtime::{LockOptions, Locker};
use dlock_testkit::deployment::Connection;
use redis::AsyncCommands as _;

use crate::{
    Sizes,
    harness::{Error, Setup, wall_us},
    report::{Row, contended_row},
    workloads::Section,
};

/// W4 "hot key": `W4_PROCESSES` OS processes (this program, re-run as `--w4-child`), each with
/// one `Locker` and `waiters` tasks, all on ONE key; the body is W3's non-atomic increment. The
/// row with 1 waiter per process is the baseline of a hand-off between processes: W3's clients
/// share one process, so its hand-offs never cross one.
pub(crate) const W4_PROCESSES: usize = 4;

/// How a W4 child is told what to do, on its command line.
pub(crate) struct W4Child {
    url: String,
    prefix: String,
    key: String,
    counter: String,
    waiters: usize,
    sections: usize,
    fair: bool,
}

impl W4Child {
    fn args(&self) -> Vec<String> {
        vec![
            "--w4-child".to_owned(),
            self.url.clone(),
            self.prefix.clone(),
            self.key.clone(),
            self.counter.clone(),
            self.waiters.to_string(),
            self.sections.to_string(),
            u8::from(self.fair).to_string(),
        ]
    }

    pub(crate) fn parse(mut it: impl Iterator<Item = String>) -> Option<Self> {
        Some(Self {
            url: it.next()?,
            prefix: it.next()?,
            key: it.next()?,
            counter: it.next()?,
            waiters: it.next()?.parse().ok()?,
            sections: it.next()?.parse().ok()?,
            fair: it.next()? == "1",
        })
    }
}

/// One W4 process: warms up, says `ready`, waits for `go` on stdin, runs its waiters (each
/// `sections` critical sections), and prints one `asked acquired released` line (µs) per section.
pub(crate) async fn w4_child(child: W4Child) -> Result<(), Error> {
    use std::io::{BufRead as _, Write as _};
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let locker = Locker::builder()
        .url(child.url.as_str())
        .key_prefix(child.prefix.as_str())
        .timeout(Duration::from_secs(60))
        .build()?;
    let mut redis = Connection::open(&child.url).await?;
    locker
        .acquire(
            &format!("{}:warm:{}", child.key, std::process::id()),
            LockOptions::new(),
        )
        .await?
        .release()
        .await?;
    let _: Option<u64> = redis.get(&child.counter).await?;
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let options = if child.fair {
        LockOptions::new().fair()
    } else {
        LockOptions::new()
    };
    let tasks: Vec<_> = (0..child.waiters)
        .map(|_| {
            let (locker, mut redis, options) = (locker.clone(), redis.clone(), options.clone());
            let (key, counter, sections) =
                (child.key.clone(), child.counter.clone(), child.sections);
            tokio::spawn(async move {
                let mut log = Vec::with_capacity(sections);
                for _ in 0..sections {
                    let asked = wall_us();
                    let guard = locker.acquire(&key, options.clone()).await?;
                    let acquired = wall_us();
                    let n: Option<u64> = redis.get(&counter).await?;
                    let () = redis.set(&counter, n.unwrap_or(0) + 1).await?;
                    let released = wall_us();
                    guard.release().await?;
                    log.push([asked, acquired, released]);
                }
                Ok::<_, Error>(log)
            })
        })
        .collect();
    let mut out = String::new();
    for task in tasks {
        for [asked, acquired, released] in task.await?? {
            let _ = writeln!(out, "{asked} {acquired} {released}");
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// Commands the masters ran that a lock client sends itself (scripts, subscriptions), rather
/// than those scripts run inside.
async fn requests_so_far(masters: &[String]) -> Result<u64, Error> {
    const REQUESTS: &[&str] = &[
        "evalsha",
        "evalsha_ro",
        "eval",
        "eval_ro",
        "script",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "psubscribe",
        "punsubscribe",
    ];
    let mut sum = 0;
    for url in masters {
        let mut redis = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut redis)
            .await?;
        sum += info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                if !REQUESTS.contains(&name) {
                    return None;
                }
                rest.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    Ok(sum)
}

/// W4: `W4_PROCESSES` processes × `waiters` tasks on one key, in default or fair mode.
pub(crate) async fn w4(
    setup: &Setup,
    waiters: usize,
    fair: bool,
    sizes: Sizes,
    run: usize,
) -> Result<Row, Error> {
    use std::io::BufRead as _;
    let prefix = setup.prefix;
    let key = format!("w4:{run}");
    let counter = format!("{prefix}w4:{run}:counter");
    let sections = (sizes.w4_sections / (W4_PROCESSES * waiters)).max(1);
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..W4_PROCESSES {
        let args = W4Child {
            url: setup.url.clone(),
            prefix: prefix.to_owned(),
            key: key.clone(),
            counter: counter.clone(),
            waiters,
            sections,
            fair,
        }
        .args();
        let mut child = std::process::Command::new(&exe)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut ready = String::new();
        stdout.read_line(&mut ready)?;
        children.push((child, Some(ready.trim_end().to_owned()), stdout));
    }
    // Every process is connected and warm before any starts.
    let (commands_before, requests_before) = (
        setup.stats.requests().await,
        requests_so_far(&setup.masters).await?,
    );
    for (child, ready, _) in &mut children {
        if ready.as_deref() != Some("ready") {
            let _ = child.kill();
            return Err("a W4 process did not start".into());
        }
    }
    for (child, _, _) in &mut children {
        stdin_go(child.stdin.as_mut().ok_or("no stdin")?)?;
    }
    let mut sections_log: Vec<(usize, [u64; 3])> = Vec::new();
    let readers: Vec<_> = children
        .into_iter()
        .map(|(mut child, _, stdout)| {
            tokio::task::spawn_blocking(move || {
                let lines: Vec<String> = stdout.lines().collect::<Result<_, _>>()?;
                let status = child.wait()?;
                Ok::<_, std::io::Error>((lines, status))
            })
        })
        .collect();
    for (p, reader) in readers.into_iter().enumerate() {
        let (lines, status) = reader.await??;
        if !status.success() {
            return Err(format!("a W4 process failed: {status}").into());
        }
        for line in lines {
            let v: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [a, b, c] = v[..] {
                sections_log.push((p, [a, b, c]));
            }
        }
    }
    let commands = setup
        .stats
        .requests()
        .await
        .zip(commands_before)
        .map(|(a, b)| a - b);
    let requests = requests_so_far(&setup.masters).await? - requests_before;
    let mut redis = Connection::open(&setup.url).await?;
    let counted: u64 = redis.get(&counter).await?;
    // The processes share the system clock: their µs become instants after one base.
    let first = sections_log.iter().map(|(_, s)| s[0]).min().unwrap_or(0);
    let last = sections_log
        .iter()
        .map(|(_, s)| s[2])
        .max()
        .unwrap_or(first);
    let base = Instant::now();
    let at = |us: u64| base + Duration::from_micros(us.saturating_sub(first));
    let sections: Vec<Section> = sections_log
        .iter()
        .map(|&(client, [asked, acquired, released])| Section {
            client,
            asked: at(asked),
            acquired: at(acquired),
            released: at(released),
        })
        .collect();
    let n = sections.len();
    let workload = match waiters {
        1 => "W4 4 processes × 1 waiter, one key",
        8 => "W4 4 processes × 8 waiters, one key",
        16 => "W4 4 processes × 16 waiters, one key",
        64 => "W4 4 processes × 64 waiters, one key",
        256 => "W4 4 processes × 256 waiters, one key",
        _ => "W4 4 processes, one key",
    };
    let variant = if fair { "dlock fair" } else { "dlock default" };
    let (mut row, _) = contended_row(
        workload,
        variant,
        sections,
        Duration::from_micros(last - first),
        counted == n as u64,
    );
    // The body's GET and SET are not the lock's: 2 per section.
    #[allow(clippy::cast_precision_loss)]
    {
        row.requests_per_acquire = commands.map(|c| (c as f64 / n.max(1) as f64 - 2.0).max(0.0));
        row.client_requests_per_acquire = Some(requests as f64 / n.max(1) as f64);
    }
    Ok(row)
}

/// Tells a W4 process to start.
fn stdin_go(stdin: &mut std::process::ChildStdin) -> std::io::Result<()> {
    use std::io::Write as _;
    stdin.write_all(b"go\n")?;
    stdin.flush()
}
