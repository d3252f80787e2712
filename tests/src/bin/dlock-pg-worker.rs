//! A worker process for the PostgreSQL multi-process tests, with its own connections.
//!
//! `dlock-pg-worker <url> <key> <iterations> count`: `iterations` times, under the lock on
//! `key`, reads the counter row of `key` in `dlock_test_counter`, pauses, writes it back plus one
//! (non-atomic: loses updates unless the lock excludes the other processes), and records the new
//! value with the holder's fence in `dlock_test_history` (the tables of `dlock_tests::pg::TABLES`).
//!
//! `dlock-pg-worker <url> <key> <name> fair-waiter`: waits for the lock in fair mode, then
//! records its name in `dlock_test_order` (`dlock_tests::pg::ORDER_TABLE`), holds 20ms and
//! releases.
//!
//! `dlock-pg-worker <url> <key> 1 pause-holder`: the paused-holder test's child. It takes the
//! lock with a 1s lease, prints `acquired <fence>`, waits for a line on stdin (the test freezes
//! it meanwhile), then tries a fenced write to `dlock_test_resource` and a release, and prints
//! what happened.

use std::time::Duration;

use dlock_runtime::{LockOptions, Locker, LockerBuilder};

use dlock_tests::pg::FENCED_WRITE;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("dlock-pg-worker: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, iterations, mode] = args.as_slice() else {
        eprintln!(
            "usage: dlock-pg-worker <url> <key> <iterations|name> <count|pause-holder|fair-waiter>"
        );
        std::process::exit(2);
    };
    // The environment's settings (`DLOCK_NOTIFY`, …) with this URL.
    let locker = LockerBuilder::from_env()?.url(url.as_str()).build()?;
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    match mode.as_str() {
        "count" => {
            for _ in 0..iterations.parse::<u32>()? {
                let guard = locker
                    .acquire(key, LockOptions::new().timeout(Duration::from_secs(60)))
                    .await?;
                let n: i64 = db
                    .query_opt("SELECT n FROM dlock_test_counter WHERE key = $1", &[key])
                    .await?
                    .map_or(0, |row| row.get(0));
                tokio::time::sleep(Duration::from_micros(300)).await;
                db.execute(
                    "INSERT INTO dlock_test_counter (key, n) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET n = EXCLUDED.n",
                    &[key, &(n + 1)],
                )
                .await?;
                let fence = i64::try_from(guard.fencing_token())?;
                db.execute(
                    "INSERT INTO dlock_test_history (key, n, fence) VALUES ($1, $2, $3)",
                    &[key, &(n + 1), &fence],
                )
                .await?;
                guard.release().await?;
            }
            Ok(())
        }
        "pause-holder" => pause_holder(&locker, key, &db).await,
        "fair-waiter" => {
            // `iterations` is this waiter's name here.
            let guard = locker
                .acquire(
                    key,
                    LockOptions::new().fair().timeout(Duration::from_secs(30)),
                )
                .await?;
            db.execute(
                "INSERT INTO dlock_test_order (key, name) VALUES ($1, $2)",
                &[key, iterations],
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
            Ok(())
        }
        other => Err(format!("unknown mode `{other}`").into()),
    }
}

async fn pause_holder(
    locker: &Locker,
    key: &str,
    db: &tokio_postgres::Client,
) -> Result<(), Error> {
    let guard = locker
        .acquire(key, LockOptions::new().expire(Duration::from_secs(1)))
        .await?;
    println!("acquired {}", guard.fencing_token());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let held = guard.is_held();
    let lost_resolved = tokio::time::timeout(Duration::from_millis(100), guard.lost())
        .await
        .is_ok();
    let fence = i64::try_from(guard.fencing_token())?;
    let accepted = db
        .execute(
            FENCED_WRITE,
            &[&key, &fence, &"written by the paused holder"],
        )
        .await?;
    let release = match guard.release().await {
        Ok(()) => "released".to_owned(),
        Err(e) if e.is_lost() => "lost".to_owned(),
        Err(e) => format!("error {e}"),
    };
    println!(
        "held={held} lost_resolved={lost_resolved} write_accepted={} release={release}",
        accepted == 1
    );
    Ok(())
}
