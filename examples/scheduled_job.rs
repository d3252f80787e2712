//! A scheduled job that must run once per period across every instance, even though each
//! instance's clock (and so its timer) is a little off: the job lock's minimum hold
//! (`hold_at_least`, ShedLock's `lockAtLeastFor`) with a try-lock (`timeout = "0s"`) whose
//! `on_fail` counts "another instance has it" as a skip.
//!
//! ```text
//! cargo run --example scheduled_job                                  # embedded table
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run --example scheduled_job  # any engine but ZooKeeper
//! ```
//!
//! Three instances tick every second, 0, 150 and 300ms apart (their clocks disagree); the job
//! takes 100ms. With the lock alone, an instance that ticks after the first one's run ended
//! takes the free lock and runs the job again; with `hold_at_least = "800ms"` the lock stays
//! taken past every instance's tick of that period. The program runs both for four periods and
//! exits non-zero unless the job ran exactly once per period with the minimum hold.

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockError, Locker, dlock};

/// One instance of the service: its lock client and the job's run counter (shared by the
/// instances of this demo, to count the runs).
struct Instance {
    locks: Locker,
    runs: Arc<AtomicU32>,
}

impl Instance {
    /// The job with the lock alone: whoever finds the lock free runs it.
    #[dlock(key = "report:lock-only", client = &self.locks, timeout = "0s", on_fail = skipped)]
    async fn report_lock_only(&self) -> Result<bool, LockError> {
        self.job().await
    }

    /// The job with a minimum hold: the lock stays taken until 800ms after it was taken.
    #[dlock(
        key = "report:held",
        client = &self.locks,
        timeout = "0s",
        hold_at_least = "800ms",
        on_fail = skipped
    )]
    async fn report_held(&self) -> Result<bool, LockError> {
        self.job().await
    }

    async fn job(&self) -> Result<bool, LockError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }
}

/// Another instance holds the lock (or held it within its minimum hold): this tick skips.
fn skipped(error: LockError) -> Result<bool, LockError> {
    if error.is_timeout() {
        Ok(false)
    } else {
        Err(error)
    }
}

const PERIODS: u32 = 4;
const INSTANCES: u64 = 3;

/// Runs `PERIODS` ticks of every instance, each instance `150ms × i` late; the job's run count.
async fn schedule(locks: &Locker, held: bool) -> Result<u32, LockError> {
    let runs = Arc::new(AtomicU32::new(0));
    let instances: Vec<_> = (0..INSTANCES)
        .map(|i| {
            let instance = Instance {
                locks: locks.clone(),
                runs: runs.clone(),
            };
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150 * i)).await;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                for _ in 0..PERIODS {
                    tick.tick().await;
                    if held {
                        instance.report_held().await?;
                    } else {
                        instance.report_lock_only().await?;
                    }
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    for instance in instances {
        instance.await.expect("an instance panicked")?;
    }
    Ok(runs.load(Ordering::SeqCst))
}

#[tokio::main]
async fn main() -> ExitCode {
    let from_env = std::env::var_os("DLOCK_URL").is_some();
    let locks = if from_env {
        match Locker::from_env() {
            Ok(locks) => locks,
            Err(e) => {
                eprintln!("scheduled_job: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        Locker::memory()
    };
    println!(
        "{INSTANCES} instances tick every second, 150ms apart; the job takes 100ms; {PERIODS} periods"
    );
    let outcome = async {
        let lock_only = schedule(&locks, false).await?;
        println!("  lock only:                      the job ran {lock_only} times");
        let held = schedule(&locks, true).await?;
        println!("  lock + hold_at_least = \"800ms\": the job ran {held} times");
        Ok::<_, LockError>(held)
    }
    .await;
    let _ = locks.close().await;
    match outcome {
        Ok(held) if held == PERIODS => {
            println!("once per period with the minimum hold — OK");
            ExitCode::SUCCESS
        }
        Ok(held) => {
            eprintln!("scheduled_job: expected {PERIODS} runs with the minimum hold, got {held}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("scheduled_job: {e}");
            ExitCode::FAILURE
        }
    }
}
