//! The benchmark: dlock against each engine's own lock (its **floor**), and the other libraries
//! people use on it, measured side by side in one run.
//!
//! ```sh
//! cargo run --release --example bench                      # one Redis server
//! cargo run --release --example bench -- --quick           # tiny counts: a correctness smoke test
//! cargo run --release --example bench -- --engine zookeeper
//! cargo run --release --features etcd --example bench -- --engine all --json bench.jsonl
//! ```
//!
//! Each engine's floor is its own lock primitive, or the same algorithm written by hand with
//! the same round trips: `SET NX PX` + a compare-and-delete script on Redis (one server,
//! Cluster, Sentinel); RedLock by hand over the masters; etcd's own `Lock`/`Unlock` under a
//! session lease; an ephemeral sequential node by hand on ZooKeeper; a lease row written by hand
//! (an upsert and a delete) on PostgreSQL. The others: the Redis floors with a fence (the floor's
//! `SET NX PX` and a fence counter in one script; on RedLock the fence grant on each master),
//! which prices the fence by itself, `rslock` on RedLock, etcd's lock with a lease per cycle,
//! `zookeeper-client`'s recipe, PostgreSQL's advisory locks. Every figure of a workload is also
//! a ratio to its floor.
//!
//! - **W1**: one client, a fresh key per cycle: cycles/s, latency p50/p99, requests the engine
//!   served per acquisition, heap allocations of this program per cycle.
//! - **W2**: 16 clients with their own connections, distinct keys: cycles/s, and the CPU time
//!   per cycle of the servers and of this program (on a Cluster also with keys over 3 masters).
//! - **W3**: 8 clients (`--w3-clients`) with their own connections on ONE key; the body reads
//!   and writes back a counter on the engine's own data (not atomic): critical sections/s,
//!   whether the counter is exact, wait p50/p99/max, hand-off p50/p99 (release by one client
//!   to acquisition by another), the share of hand-offs to another client; dlock in the
//!   default mode, fair mode (where the engine has it) and with notifications off.
//! - **W4** (Redis engines): 4 processes × 1 to 256 waiters on ONE key, default and fair.
//! - **W5** (every engine but RedLock): the kinds of lock beside the mutex: one client on fresh
//!   keys as a mutex, a permit, a read and a write hold; W3's 8 clients on one key as a mutex, a
//!   semaphore of 4, a read/write lock with 1 writer in 4 (× against the mutex's row).
//!
//! Every variant runs `--rounds` times (5 by default) taking turns with the others, so that a
//! drift of the machine hits them alike; each figure is the median round. All loops are bounded
//! by count and by time. A progress line says what runs and the time left. The exit code is
//! non-zero when a counter is wrong.

use std::time::Duration;

use clap::builder::PossibleValue;
use dlock_testkit::deployment::Engine;
use indicatif::{ProgressBar, ProgressStyle};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

mod engines;
mod harness;
mod kinds;
mod report;
mod w4;
mod workloads;

use harness::{Contender, Error, Setup};
use report::{Rounds, Row, median};

/// Counts this program's heap allocations (W1's allocations per cycle).
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// How much each workload does.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    w1_cycles: usize,
    w2_clients: usize,
    w2_cycles: usize,
    w3_clients: usize,
    w3_sections: usize,
    w4_sections: usize,
    w4_waiters: &'static [usize],
    time_cap: Duration,
}

impl Sizes {
    fn full() -> Self {
        Self {
            w1_cycles: 5000,
            w2_clients: 16,
            w2_cycles: 2000,
            w3_clients: 8,
            w3_sections: 2000,
            w4_sections: 2048,
            w4_waiters: &[1, 16, 64, 256],
            time_cap: Duration::from_secs(20),
        }
    }

    fn quick() -> Self {
        Self {
            w1_cycles: 100,
            w2_clients: 4,
            w2_cycles: 50,
            w3_clients: 4,
            w3_sections: 80,
            w4_sections: 64,
            w4_waiters: &[8],
            time_cap: Duration::from_secs(10),
        }
    }
}

/// The benchmark's arguments (`--help` prints them).
#[derive(Debug, clap::Parser)]
#[command(
    name = "bench",
    about = "dlock against each engine's own lock (the floor), measured side by side in one run.",
    after_help = "Without --engine it runs on the deployment DLOCK_URL names (any engine but \
                  memory://; it writes keys, rows or nodes under `bench`), else (kept for \
                  compatibility) on DLOCK_REDIS_URL / REDIS_URL, else on a throwaway \
                  redis-server. --engine all runs every engine of this build on its throwaway \
                  deployment and ends with one table of ratios."
)]
struct Cli {
    /// Tiny counts and one round: a correctness smoke test.
    #[arg(long)]
    quick: bool,
    /// Rounds of every variant (the figures are the median round).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// The clients contending for one key in W3 and W5 (8; 4 with --quick): more shows what
    /// each waiter costs the engine.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=64))]
    w3_clients: Option<u64>,
    /// Only these workloads.
    #[arg(long, value_delimiter = ',', value_parser = ["w1", "w2", "w3", "w4", "w5"])]
    only: Option<Vec<String>>,
    /// Write every row as a JSON line to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Write W3's wait-time plot (SVG) to this file (one per engine with `--engine all`).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
    /// Run on a throwaway deployment of this engine, or of every engine (`all`).
    #[arg(long, value_parser = engine_names())]
    engine: Option<String>,
}

/// The `--engine` values: every engine but the embedded one (it has no floor), and `all`.
fn engine_names() -> clap::builder::PossibleValuesParser {
    let names = <Engine as clap::ValueEnum>::value_variants()
        .iter()
        .filter(|e| **e != Engine::Memory)
        .map(|e| PossibleValue::new(e.name()))
        .chain([PossibleValue::new("all")]);
    clap::builder::PossibleValuesParser::new(names)
}

/// What one run does.
struct Args {
    sizes: Sizes,
    rounds: usize,
    only: Option<Vec<String>>,
}

impl Args {
    fn runs(&self, workload: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|w| w == workload))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--w4-child") {
        let Some(child) = w4::W4Child::parse(argv) else {
            eprintln!("bench: bad W4 process arguments");
            return std::process::ExitCode::from(2);
        };
        return match w4::w4_child(child).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench: W4 process: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let cli = <Cli as clap::Parser>::parse();
    let mut sizes = if cli.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    if let Some(clients) = cli.w3_clients {
        sizes.w3_clients = usize::try_from(clients).unwrap_or(8);
    }
    let args = Args {
        sizes,
        rounds: cli.rounds.map_or(if cli.quick { 1 } else { 5 }, |r| {
            usize::try_from(r).unwrap_or(usize::MAX)
        }),
        only: cli.only.clone(),
    };
    match run(&cli, &args).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench: a W3 or W4 counter is wrong: the lock let two clients overlap");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Every engine asked for, one after the other; `true` when every counter was exact.
async fn run(cli: &Cli, args: &Args) -> Result<bool, Error> {
    let engines: Vec<Option<Engine>> = match cli.engine.as_deref() {
        Some("all") => [
            Engine::Redis,
            Engine::RedisCluster,
            Engine::RedLock,
            Engine::Etcd,
            Engine::ZooKeeper,
            Engine::Postgres,
        ]
        .into_iter()
        .filter(|e| *e != Engine::Etcd || cfg!(feature = "etcd"))
        .map(Some)
        .collect(),
        Some(name) => vec![Engine::of_url_engine(name).or(Some(Engine::Redis))],
        None => vec![None],
    };
    let mut all = Vec::new();
    let mut json = String::new();
    // With several engines, one that fails is reported and the others still run (a long run
    // keeps what it measured); the run fails at the end.
    let mut failed = Vec::new();
    for engine in &engines {
        let (setup, rows, series) = match measure(*engine, args).await {
            Ok(measured) => measured,
            Err(e) if engines.len() > 1 => {
                let name = engine.map_or_else(|| "DLOCK_URL".to_owned(), |e| e.to_string());
                eprintln!("bench: {name}: {e}; on to the next engine");
                failed.push(name);
                continue;
            }
            Err(e) => return Err(e),
        };
        println!("{}", report::table(&rows));
        let release_errors = harness::RELEASE_ERRORS.swap(0, std::sync::atomic::Ordering::Relaxed);
        if release_errors > 0 {
            println!(
                "dlock releases that returned an error on this engine: {release_errors} (each \
                 key was freed by the release sent again in the background, or by its lease)"
            );
        }
        println!(
            "requests/acq: {} the engine served per acquisition (W3: less the body's 2); client \
             requests/acq (W4): what the lock clients sent.",
            setup.requests_are
        );
        if let Some(path) = &cli.plot {
            let path = if engines.len() > 1 {
                path.replace(".svg", &format!("-{}.svg", setup.engine))
            } else {
                path.clone()
            };
            if !series.is_empty() {
                report::plot(&path, &series)?;
                println!("W3 wait-time plot written to {path}");
            }
        }
        for row in &rows {
            json.push_str(&serde_json::to_string(row)?);
            json.push('\n');
        }
        // Written after every engine, so that a later failure loses nothing measured.
        if let Some(path) = &cli.json {
            std::fs::write(path, &json)?;
        }
        all.extend(rows);
    }
    if let Some(path) = &cli.json {
        println!("JSON lines written to {path}");
    }
    if engines.len() > 1 {
        println!(
            "\n## dlock ÷ floor, every engine\n\n{}",
            report::summary(&all)
        );
    }
    if !failed.is_empty() {
        return Err(format!("these engines failed (see above): {}", failed.join(", ")).into());
    }
    Ok(all.iter().all(|r| r.exact != Some(false)))
}

/// One engine's run: its throwaway deployment (or the one the environment names), then every
/// workload on it; the deployment is returned with the rows, as it must outlive their report.
async fn measure(
    engine: Option<Engine>,
    args: &Args,
) -> Result<(Setup, Vec<Row>, Vec<(String, Vec<Duration>)>), Error> {
    let setup = match engine {
        Some(engine) => engines::throwaway(engine)
            .await
            .map_err(|e| format!("starting a throwaway {engine}: {e}"))?,
        None => from_environment().await?,
    };
    println!("\n## {}: {}\n", setup.engine, setup.about);
    let (rows, series) = bench(&setup, args).await?;
    Ok((setup, rows, series))
}

/// The deployment the environment names, without `--engine`: `DLOCK_URL` (any engine), or
/// the older `DLOCK_REDIS_URL` / `REDIS_URL`, or a throwaway `redis-server`.
async fn from_environment() -> Result<Setup, Error> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let named = var("DLOCK_URL")
        .map(|url| ("DLOCK_URL", url))
        .or_else(|| var("DLOCK_REDIS_URL").map(|url| ("DLOCK_REDIS_URL", url)))
        .or_else(|| var("REDIS_URL").map(|url| ("REDIS_URL", url)));
    let Some((name, url)) = named else {
        return engines::throwaway(Engine::Redis).await.map_err(|e| {
            format!("needs Redis: set DLOCK_URL, or install redis-server: {e}").into()
        });
    };
    let parsed: dlock_runtime::EngineUrl = url.parse()?;
    let engine = Engine::of_url_engine(parsed.engine())
        .filter(|e| *e != Engine::Memory)
        .ok_or_else(|| {
            format!(
                "{name} names a `{}` engine, which has no floor to measure against",
                parsed.engine()
            )
        })?;
    engines::from_url(engine, &url, format!("{parsed} (from {name})")).await
}

/// The workloads on one engine: its rows (medians, with their ratios to the floor) and W3's
/// waits per variant, for the plot.
async fn bench(
    setup: &Setup,
    args: &Args,
) -> Result<(Vec<Row>, Vec<(String, Vec<Duration>)>), Error> {
    let sizes = args.sizes;
    let uncontended_dlock = setup.dlock(setup.prefix, false);
    let contended_dlock = setup.dlock(setup.prefix, true);
    let mut w1_set: Vec<&dyn Contender> = vec![setup.floor.as_ref()];
    w1_set.extend(setup.others.iter().map(AsRef::as_ref));
    w1_set.extend(uncontended_dlock.iter().map(AsRef::as_ref));
    let mut w3_set: Vec<&dyn Contender> = vec![setup.floor.as_ref()];
    w3_set.extend(setup.others.iter().map(AsRef::as_ref));
    w3_set.extend(contended_dlock.iter().map(AsRef::as_ref));
    // W2 on one server (on a Cluster: one master), and once more over the Cluster's masters.
    let spread =
        (setup.spread.as_ref()).map(|(prefix, floor)| (floor.as_ref(), setup.dlock(prefix, false)));
    let mut w2_sets: Vec<(String, Vec<&dyn Contender>)> = vec![(
        if spread.is_some() {
            "W2 16 clients, distinct keys, one master".to_owned()
        } else {
            format!("W2 {} clients, distinct keys", sizes.w2_clients)
        },
        w1_set.clone(),
    )];
    if let Some((floor, spread)) = &spread {
        let mut set: Vec<&dyn Contender> = vec![*floor];
        set.extend(spread.iter().map(AsRef::as_ref));
        w2_sets.push((
            "W2 16 clients, distinct keys over 3 masters".to_owned(),
            set,
        ));
    }
    let w4_runs: Vec<(usize, bool)> = if setup.masters.is_empty() {
        Vec::new()
    } else {
        sizes
            .w4_waiters
            .iter()
            .flat_map(|&w| [(w, false), (w, true)])
            .filter(|&(_, fair)| !fair || setup.engine != Engine::RedLock)
            .collect()
    };
    let w5_runs = setup.engine != Engine::RedLock && args.runs("w5");
    let steps = args.rounds
        * (usize::from(args.runs("w1"))
            + usize::from(w5_runs)
            + usize::from(args.runs("w2")) * w2_sets.iter().map(|(_, s)| s.len()).sum::<usize>()
            + usize::from(args.runs("w3")) * w3_set.len()
            + usize::from(args.runs("w4")) * w4_runs.len());
    let progress = ProgressBar::new(u64::try_from(steps).unwrap_or(0)).with_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed} so far, ~{eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.set_prefix(setup.engine.to_string());
    let mut w1s: Vec<Rounds> = vec![Vec::new(); w1_set.len()];
    let mut w2s: Vec<Vec<Rounds>> = w2_sets
        .iter()
        .map(|(_, s)| vec![Vec::new(); s.len()])
        .collect();
    let mut w3s: Vec<Rounds> = vec![Vec::new(); w3_set.len()];
    let mut w4s: Vec<Rounds> = vec![Vec::new(); w4_runs.len()];
    let mut w5s: Vec<Rounds> = Vec::new();
    for round in 0..args.rounds {
        let step = |what: String| progress.set_message(format!("round {}: {what}", round + 1));
        if args.runs("w1") {
            step("W1".to_owned());
            let rows = workloads::w1(setup, &w1_set, sizes, round).await?;
            for (i, row) in rows.into_iter().enumerate() {
                w1s[i].push((row, Vec::new()));
            }
            progress.inc(1);
        }
        for (set, (workload, contenders)) in w2_sets.iter().enumerate().filter(|_| args.runs("w2"))
        {
            for (i, contender) in contenders.iter().enumerate() {
                step(format!("W2 {}", contender.name()));
                let run = round * 100 + set * 10 + i;
                let row = workloads::w2(setup, workload, *contender, sizes, run).await?;
                w2s[set][i].push((row, Vec::new()));
                progress.inc(1);
            }
        }
        for (i, contender) in w3_set.iter().enumerate().filter(|_| args.runs("w3")) {
            step(format!("W3 {}", contender.name()));
            w3s[i].push(workloads::w3(setup, *contender, sizes, round * 100 + i).await?);
            progress.inc(1);
        }
        if w5_runs {
            step("W5 kinds".to_owned());
            let rows = kinds::w5(setup, sizes, round).await?;
            w5s.resize(rows.len(), Vec::new());
            for (i, row) in rows.into_iter().enumerate() {
                w5s[i].push((row, Vec::new()));
            }
            progress.inc(1);
        }
        for (i, &(waiters, fair)) in w4_runs.iter().enumerate().filter(|_| args.runs("w4")) {
            step(format!(
                "W4 {waiters} waiters{}",
                if fair { " fair" } else { "" }
            ));
            let row = w4::w4(setup, waiters, fair, sizes, round * 100 + i).await?;
            w4s[i].push((row, Vec::new()));
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for group in std::iter::once(w1s).chain(w2s).chain([w3s, w5s]) {
        for rounds in group.into_iter().filter(|r| !r.is_empty()) {
            let (row, waits) = median(rounds);
            if !waits.is_empty() {
                series.push((row.variant.clone(), waits));
            }
            rows.push(row);
        }
    }
    report::ratios(&mut rows);
    // W4 has no floor of its own: its × column is against W3's floor, to compare the hot key
    // with W3's contention.
    let w3_floor = rows
        .iter()
        .find(|r| r.workload.starts_with("W3"))
        .map(|r| r.per_sec);
    for rounds in w4s.into_iter().filter(|r| !r.is_empty()) {
        let (mut row, _) = median(rounds);
        row.ratio_to_floor = w3_floor.map(|f| row.per_sec / f);
        rows.push(row);
    }
    for row in &mut rows {
        row.engine = setup.engine.to_string();
    }
    Ok((rows, series))
}
