//! A process that takes or tries one lock through `DLOCK_URL` (and the other `DLOCK_*`
//! variables) and exits at once, the way a cron job or a command-line tool does: what its
//! acquisition leaves in the engine is then only what dlock removed before returning.
//!
//! - `dlock-probe try <key> [fair]`: one attempt (`try_acquire`); prints `acquired` or `busy`
//!   and exits, without closing the locker.
//! - `dlock-probe wait <key> <ms> [fair]`: waits up to `ms`; prints `acquired` or `timeout` and
//!   exits, without closing the locker.
//! - `dlock-probe close <key> [fair]`: takes the lock, starts a second acquisition of it that
//!   waits in line, prints `ready`, waits for a line on stdin, then closes the locker, prints
//!   `closed <what the waiter got>` and exits.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(&args).await {
        Ok(said) => println!("{said}"),
        Err(e) => {
            eprintln!("dlock-probe: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(args: &[&str]) -> Result<String, LockError> {
    let locker = Locker::from_env()?;
    let options = |rest: &[&str]| {
        if rest.contains(&"fair") {
            LockOptions::new().fair()
        } else {
            LockOptions::new()
        }
    };
    match args {
        ["try", key, rest @ ..] => {
            let options = options(rest).timeout(Duration::ZERO);
            said(locker.acquire(key, options).await, "busy")
        }
        ["wait", key, ms, rest @ ..] => {
            let ms = ms.parse().expect("a wait in milliseconds");
            let options = options(rest).timeout(Duration::from_millis(ms));
            said(locker.acquire(key, options).await, "timeout")
        }
        ["close", key, rest @ ..] => {
            let held = locker.acquire(key, options(rest)).await?;
            let waiter = tokio::spawn({
                let (locker, key) = (locker.clone(), (*key).to_owned());
                let options = options(rest).timeout(Duration::from_secs(60));
                async move { locker.acquire(&key, options).await.map(drop) }
            });
            // Long enough for the waiter to be in line in the engine.
            tokio::time::sleep(Duration::from_millis(500)).await;
            println!("ready");
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .expect("a line on stdin");
            locker.close().await?;
            let waited = match waiter.await.expect("the waiter task") {
                Ok(()) => "acquired".to_owned(),
                Err(e) if e.is_closed() => "closed".to_owned(),
                Err(e) => format!("error: {e}"),
            };
            // Released by the close already: this sends nothing.
            drop(held);
            Ok(format!("closed {waited}"))
        }
        _ => panic!("usage: dlock-probe try|wait|close <key> [ms] [fair]"),
    }
}

/// `acquired`, or `busy` (what a timeout is called), or the error.
fn said<T>(result: Result<T, LockError>, busy: &str) -> Result<String, LockError> {
    match result {
        Ok(_) => Ok("acquired".to_owned()),
        Err(e) if e.is_timeout() => Ok(busy.to_owned()),
        Err(e) => Err(e),
    }
}
