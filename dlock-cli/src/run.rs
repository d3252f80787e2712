//! `dlock run KEY -- CMD ARGS…`: a command under a lock, as `flock`, `etcdctl lock` and
//! `consul lock` run one, with a renewed lease, the fencing token in `DLOCK_FENCE`, and the
//! command stopped when the lock is lost.

use std::{ffi::OsString, process::ExitCode, time::Duration};

use dlock_runtime::{LockOptions, Locker};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::signal::unix::{SignalKind, signal};

use crate::{exit, fail, output};

/// Takes the lock as `options` say (a renewed lease; a mutex, a permit, a read or a write
/// hold), runs the command in its own process group
/// with `DLOCK_FENCE` and `DLOCK_KEY`, forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
/// SIGUSR2 to that group, and exits with the command's status; releases the lock when it ends.
/// When the lock is lost, the group gets SIGTERM, then SIGKILL after `grace`, and `dlock` exits
/// with [`exit::LOST`].
pub(crate) async fn run(
    locker: &Locker,
    key: &str,
    options: LockOptions,
    grace: Duration,
    command: &[OsString],
    _out: output::Output,
) -> ExitCode {
    let guard = match locker.acquire(key, options).await {
        Ok(guard) => guard,
        Err(e) => {
            if e.is_timeout()
                && let Ok(Some(info)) = locker.inspect(key).await
            {
                eprintln!("dlock: {key} is held by {}", output::holder_text(&info));
            }
            return fail(&e);
        }
    };
    // Listening before the command starts: a signal sent once it runs reaches it, never the
    // default action on `dlock` itself.
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("dlock: could not listen for signals: {e}");
            let _ = guard.release().await;
            return ExitCode::FAILURE;
        }
    };
    let (program, args) = command.split_first().expect("clap requires a command");
    // Its own process group: a lost lock stops everything the command started (a pipeline, a
    // script's children), and a terminal's Ctrl-C reaches it once, through `dlock`.
    let child = tokio::process::Command::new(program)
        .args(args)
        .env("DLOCK_FENCE", guard.fencing_token().to_string())
        .env("DLOCK_KEY", key)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("dlock: could not run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return ExitCode::from(exit::NOT_STARTED);
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let forward = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = nix::sys::signal::killpg(pid, sig);
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => status_code(status),
                    Err(e) => {
                        eprintln!("dlock: lost track of the command: {e}");
                        1
                    }
                };
                return match guard.release().await {
                    Ok(()) => ExitCode::from(code),
                    Err(e) if e.is_lost() => {
                        eprintln!(
                            "dlock: {key} was lost before the command ended (it ran without \
                             the lock for a while); the command exited with {code}"
                        );
                        ExitCode::from(exit::LOST)
                    }
                    // The release did not reach the engine: the lease frees the key.
                    Err(e) => {
                        eprintln!("dlock: {e}");
                        ExitCode::from(code)
                    }
                };
            }
            () = guard.lost() => {
                eprintln!("dlock: {key} was lost; stopping the command (SIGTERM, SIGKILL after {})",
                    humantime::format_duration(grace));
                forward(Signal::SIGTERM);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    forward(Signal::SIGKILL);
                    let _ = child.kill().await;
                }
                return ExitCode::from(exit::LOST);
            }
            sig = signals.next() => forward(sig),
        }
    }
}

/// The command's exit code, or 128 + the signal that ended it (as shells report it).
fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    }
}

/// The signals `dlock run` forwards to its command.
struct Signals {
    streams: Vec<(tokio::signal::unix::Signal, Signal)>,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        let kinds = [
            (SignalKind::interrupt(), Signal::SIGINT),
            (SignalKind::terminate(), Signal::SIGTERM),
            (SignalKind::hangup(), Signal::SIGHUP),
            (SignalKind::quit(), Signal::SIGQUIT),
            (SignalKind::user_defined1(), Signal::SIGUSR1),
            (SignalKind::user_defined2(), Signal::SIGUSR2),
        ];
        let streams = kinds
            .into_iter()
            .map(|(kind, sig)| signal(kind).map(|stream| (stream, sig)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { streams })
    }

    /// The next signal received.
    async fn next(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (stream, sig) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signals")
    }
}
