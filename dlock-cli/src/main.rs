//! `dlock`: the operator's command for dlock's locks, over `DLOCK_URL` on every engine.
//!
//! ```text
//! dlock ping                     does the engine answer, with these credentials
//! dlock ls [PREFIX]              the held locks: holder, since, fence, remaining lease, waiters
//! dlock show KEY                 who holds KEY
//! dlock run KEY -- CMD ARGS…     runs CMD under the lock (renewed lease, DLOCK_FENCE, stopped
//!                                when the lock is lost), exits with its status; with
//!                                --permits N, --read or --write under a semaphore's permit or a
//!                                read/write lock, with --hold-at-least D as a job lock
//! dlock wait KEY                 returns once KEY is free
//! dlock release KEY --force      frees KEY whoever holds it, and says who did
//! ```
//!
//! Configured as the library is, by the `DLOCK_*` variables (`DLOCK_URL`, `DLOCK_KEY_PREFIX`,
//! `DLOCK_OWNER`, …). `--json` prints one JSON document instead of text.

use std::{process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use dlock_runtime::{LockError, LockOptions, Locker, LockerBuilder};

mod output;
mod run;

/// What `dlock` exits with, besides 0 and (for `run`) the command's own status.
mod exit {
    /// The key is not valid (empty, too long, reserved).
    pub(crate) const INVALID_KEY: u8 = 65;
    /// The engine did not answer, or refused (credentials, permissions).
    pub(crate) const ENGINE: u8 = 69;
    /// The lock was not acquired (`run`), or not free (`wait`), within `--timeout`.
    pub(crate) const TIMEOUT: u8 = 75;
    /// `run`: the lock was lost while the command ran; the command was stopped.
    pub(crate) const LOST: u8 = 76;
    /// The configuration (`DLOCK_*`, or `run`'s kind on an engine that cannot hold it) is
    /// invalid.
    pub(crate) const CONFIG: u8 = 78;
    /// `run`: the key is held as another kind of lock (a mutex, a semaphore of another permit
    /// count, a read/write lock).
    pub(crate) const CONFLICT: u8 = 79;
    /// `run`: the command could not be started.
    pub(crate) const NOT_STARTED: u8 = 127;
}

#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    about = "List, inspect and free dlock's distributed locks, and run a command under one",
    long_about = "List, inspect and free dlock's distributed locks, and run a command under one.\n\n\
        The engine is DLOCK_URL's (redis://, redis+cluster://, redis+sentinel://, \
        redis+redlock://, etcd://, zk://, postgres://); DLOCK_KEY_PREFIX, DLOCK_OWNER and the \
        other DLOCK_* variables are read as the library reads them.",
    after_help = "Exit status: 0 on success (`run`: the command's own status, 128+N when a \
        signal N ended it); 65 invalid key; 69 the engine did not answer or refused; 75 not \
        acquired (run) or not free (wait) within --timeout; 76 the lock was lost while the \
        command ran (it was stopped); 78 invalid configuration; 79 the key is held as another \
        kind of lock (run); 127 the command could not be started; 2 usage."
)]
struct Cli {
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that the engine answers, with these credentials.
    Ping,
    /// List the held locks whose key (without DLOCK_KEY_PREFIX) starts with PREFIX.
    Ls {
        /// Only keys starting with this (default: every lock under the prefix).
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Show who holds KEY, since when, its fence, its remaining lease and its waiters.
    Show {
        /// The lock's key, without DLOCK_KEY_PREFIX (as the code names it: `order:42`).
        key: String,
    },
    /// Run a command under the lock KEY, with a renewed lease; its fencing token is in
    /// DLOCK_FENCE. It runs in its own process group, to which signals are forwarded; when the
    /// lock is lost the group is stopped (SIGTERM, then SIGKILL after --grace).
    Run {
        /// The lock's key.
        key: String,
        /// How long to wait for the lock (default: DLOCK_TIMEOUT, 5s).
        #[arg(long, value_parser = duration)]
        timeout: Option<Duration>,
        /// The lease, renewed while the command runs (default: DLOCK_EXPIRE, 30s): how long a
        /// frozen or cut-off `dlock run` keeps the lock at most.
        #[arg(long, value_parser = duration)]
        expire: Option<Duration>,
        /// How long a command stopped by a lost lock has between SIGTERM and SIGKILL.
        #[arg(long, value_parser = duration, default_value = "10s")]
        grace: Duration,
        /// Take one of N permits of the counting semaphore KEY instead of the mutex: at most N
        /// commands run at once (every holder must give the same N).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), group = "kind")]
        permits: Option<u32>,
        /// Take KEY for reading: readers run together, never beside a writer.
        #[arg(long, group = "kind")]
        read: bool,
        /// Take KEY for writing: alone, with no reader; a waiting writer holds back new readers.
        #[arg(long, group = "kind")]
        write: bool,
        /// A job lock: KEY stays taken until at least this long after it was acquired, even
        /// when the command ends sooner (another instance's run of the same schedule finds it
        /// held and, with `--timeout 0s`, skips). For the mutex only.
        #[arg(long, value_parser = duration, value_name = "D", conflicts_with = "kind")]
        hold_at_least: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// Return once KEY is free (it is not taken).
    Wait {
        /// The lock's key.
        key: String,
        /// Give up after this long (default: wait as long as it takes).
        #[arg(long, value_parser = duration)]
        timeout: Option<Duration>,
    },
    /// Free KEY whoever holds it, for a holder that is gone: prints who held it. Every later
    /// hold's fence is above the freed one's; the old holder finds its hold lost at its next
    /// renewal.
    Release {
        /// The lock's key.
        key: String,
        /// Required: this breaks the lock's promise for its current holder.
        #[arg(long, required = true)]
        force: bool,
    },
}

/// A duration like `250ms`, `5s`, `1m30s`.
fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|_| format!("expected a duration like `250ms`, `5s` or `1m30s`, got `{value}`"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dlock: could not start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(cli.run())
}

impl Cli {
    async fn run(self) -> ExitCode {
        let out = output::Output { json: self.json };
        let expire = match &self.command {
            Command::Run { expire, .. } => *expire,
            _ => None,
        };
        let locker = match locker(expire) {
            Ok(locker) => locker,
            Err(e) => return fail(&e),
        };
        let code = match self.command {
            Command::Ping => ping(&locker, out).await,
            Command::Ls { prefix } => ls(&locker, &prefix, out).await,
            Command::Show { key } => show(&locker, &key, out).await,
            Command::Run {
                key,
                timeout,
                grace,
                permits,
                read,
                write,
                hold_at_least,
                command,
                ..
            } => {
                let mut options = LockOptions::new().expire_auto();
                if let Some(timeout) = timeout {
                    options = options.timeout(timeout);
                }
                if let Some(permits) = permits {
                    options = options.permits(permits);
                } else if read {
                    options = options.read();
                } else if write {
                    options = options.write();
                }
                if let Some(minimum) = hold_at_least {
                    options = options.hold_at_least(minimum);
                }
                run::run(&locker, &key, options, grace, &command, out).await
            }
            Command::Wait { key, timeout } => wait(&locker, &key, timeout, out).await,
            Command::Release { key, force } => {
                debug_assert!(force, "clap requires --force");
                release(&locker, &key, out).await
            }
        };
        // Waiters' places and sessions (etcd, ZooKeeper) end now rather than at their TTL.
        let _ = locker.close().await;
        code
    }
}

/// The locker of the `DLOCK_*` environment; `expire` overrides `DLOCK_EXPIRE`.
fn locker(expire: Option<Duration>) -> Result<Locker, LockError> {
    let mut builder = LockerBuilder::from_env()?;
    if let Some(expire) = expire {
        builder = builder.expire(expire);
    }
    builder.build()
}

/// Says what went wrong on stderr; the exit status for it.
fn fail(error: &LockError) -> ExitCode {
    eprintln!("dlock: {error}");
    ExitCode::from(exit_code(error))
}

fn exit_code(error: &LockError) -> u8 {
    if error.is_config() {
        exit::CONFIG
    } else if error.is_invalid_key() {
        exit::INVALID_KEY
    } else if error.is_timeout() {
        exit::TIMEOUT
    } else if error.is_lost() {
        exit::LOST
    } else if error.is_conflict() {
        exit::CONFLICT
    } else {
        exit::ENGINE
    }
}

async fn ping(locker: &Locker, out: output::Output) -> ExitCode {
    match locker.ping().await {
        Ok(round_trip) => {
            out.ping(round_trip);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

async fn ls(locker: &Locker, prefix: &str, out: output::Output) -> ExitCode {
    match locker.list(prefix).await {
        Ok(held) => {
            out.list(&held);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

async fn show(locker: &Locker, key: &str, out: output::Output) -> ExitCode {
    match locker.inspect(key).await {
        Ok(info) => {
            out.show(key, info.as_ref());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// Polls `inspect` (20ms, doubling up to 500ms) until the key is free.
async fn wait(
    locker: &Locker,
    key: &str,
    timeout: Option<Duration>,
    out: output::Output,
) -> ExitCode {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut pause = Duration::from_millis(20);
    loop {
        match locker.inspect(key).await {
            Ok(None) => {
                out.free(key);
                return ExitCode::SUCCESS;
            }
            Ok(Some(info)) => {
                if deadline.is_some_and(|d| tokio::time::Instant::now() + pause > d) {
                    eprintln!("dlock: {key} is still held: {}", output::holder_text(&info));
                    return ExitCode::from(exit::TIMEOUT);
                }
            }
            Err(e) => return fail(&e),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

async fn release(locker: &Locker, key: &str, out: output::Output) -> ExitCode {
    match locker.force_release(key).await {
        Ok(freed) => {
            if let Some(info) = &freed {
                // The audit line: who freed which lock, from whom.
                eprintln!(
                    "dlock: audit: {} released {key} by force at {}; it was held by {}",
                    output::me(),
                    output::now(),
                    output::holder_text(info),
                );
            }
            out.released(key, freed.as_ref());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
