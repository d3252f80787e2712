//! A service struct whose `&self` methods are locked: keys built from a field and an argument
//! (`ledger:<self.tenant>:<account>`), a try-lock with `on_fail` for a return type that is not a
//! `Result`, and the programmatic API (`Locker::acquire`) beside the attribute for a transfer
//! that needs two locks.
//!
//! ```text
//! cargo run --example service                                  # embedded table (Locker::memory())
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run --example service  # any engine's URL
//! ```
//!
//! By default the process-wide locker (the one `#[dlock]` uses without `client = …`) is installed
//! with `set_global(Locker::memory())`; when `DLOCK_URL` (or the older `DLOCK_BACKEND`) is set it
//! comes from the environment instead (`Locker::from_env()`), on whatever engine the URL names.
//! The program prints each step, closes the locker, and exits non-zero if a check fails.

use std::{
    collections::HashMap,
    fmt,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};

/// Balances of one tenant's accounts. The balances are read and written in separate steps with
/// an await between them, as with any remote store: only the lock keeps updates from being lost.
struct Ledger {
    tenant: String,
    balances: Mutex<HashMap<String, i64>>,
}

#[derive(Debug)]
enum LedgerError {
    Lock(LockError),
    InsufficientFunds { account: String, balance: i64 },
}

impl From<LockError> for LedgerError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "{e}"),
            Self::InsufficientFunds { account, balance } => {
                write!(f, "insufficient funds in `{account}` (balance {balance})")
            }
        }
    }
}

/// What [`Ledger::statement`] returns: not a `Result`, so a busy lock goes through `on_fail`.
#[derive(Debug, PartialEq, Eq)]
enum Statement {
    Ready { balance: i64, fencing_token: u64 },
    Busy,
}

impl Statement {
    /// The `on_fail` handler: the lock was busy (or unreachable); say so instead of waiting.
    fn busy(error: LockError) -> Self {
        println!("    statement: lock not free ({error}); answering `Busy`");
        Self::Busy
    }
}

impl Ledger {
    fn new(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            balances: Mutex::new(HashMap::new()),
        }
    }

    fn read(&self, account: &str) -> i64 {
        let balances = self.balances.lock().expect("balances lock poisoned");
        balances.get(account).copied().unwrap_or(0)
    }

    fn write(&self, account: &str, balance: i64) {
        let mut balances = self.balances.lock().expect("balances lock poisoned");
        balances.insert(account.to_owned(), balance);
    }

    /// Adds `amount`: read, a slow store round trip, write. Calls for the same tenant and account
    /// run one at a time (in every process sharing the lock service); others run beside them.
    #[dlock(key = "ledger:<self.tenant>:<account>", timeout = "5s", expire = "10s")]
    async fn deposit(&self, account: &str, amount: i64) -> Result<i64, LedgerError> {
        let balance = self.read(account);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.write(account, balance + amount);
        Ok(balance + amount)
    }

    /// A consistent read, or `Busy` at once when someone is changing the account
    /// (`timeout = "0s"` is a single attempt).
    #[dlock(key = "ledger:<self.tenant>:<account>", timeout = "0s", on_fail = Statement::busy)]
    async fn statement(&self, account: &str) -> Statement {
        Statement::Ready {
            balance: self.read(account),
            fencing_token: dlock_runtime::fencing_token().unwrap_or_default(),
        }
    }

    /// Moves `amount` between two accounts with the programmatic API: two locks, always taken
    /// in the same (sorted) order so two opposite transfers cannot deadlock. The same keys as
    /// `#[dlock]` on `deposit`, so transfers and deposits exclude each other.
    async fn transfer(&self, from: &str, to: &str, amount: i64) -> Result<(), LedgerError> {
        let locker = dlock_runtime::global()?;
        let mut keys = [self.key(from), self.key(to)];
        keys.sort();
        let options = LockOptions::new()
            .timeout(Duration::from_secs(5))
            .expire(Duration::from_secs(10));
        let first = locker.acquire(&keys[0], options.clone()).await?;
        let second = locker.acquire(&keys[1], options).await?;
        println!(
            "    transfer: holding `{}` (fencing token {}) and `{}` (fencing token {})",
            first.key(),
            first.fencing_token(),
            second.key(),
            second.fencing_token()
        );
        let balance = self.read(from);
        if balance < amount {
            // Both guards are dropped here and release their locks.
            return Err(LedgerError::InsufficientFunds {
                account: from.to_owned(),
                balance,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.write(from, balance - amount);
        self.write(to, self.read(to) + amount);
        second.release().await?;
        first.release().await?;
        Ok(())
    }

    fn key(&self, account: &str) -> String {
        format!("ledger:{}:{account}", self.tenant)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let configured = ["DLOCK_URL", "DLOCK_BACKEND"]
        .iter()
        .any(|var| std::env::var_os(var).is_some());
    let locker = if configured {
        match Locker::from_env() {
            Ok(locker) => locker,
            Err(e) => {
                eprintln!("service: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        Locker::memory()
    };
    println!("lock backend: {locker:?}");
    dlock_runtime::set_global(locker).expect("the first and only set_global");

    match run().await {
        Ok(()) => {
            println!("\nall checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nservice: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let acme = Arc::new(Ledger::new("acme"));
    let globex = Ledger::new("globex");

    println!("\n1. 20 concurrent deposits of 5 into acme/alice (read, 2ms round trip, write)");
    let mut deposits = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let acme = acme.clone();
        deposits.spawn(async move { acme.deposit("alice", 5).await });
    }
    let failed = deposits
        .join_all()
        .await
        .iter()
        .filter(|r| r.is_err())
        .count();
    let alice = acme.read("alice");
    println!("    balance {alice} (expected 100), {failed} failed");
    check(alice == 100 && failed == 0, "deposits lost an update")?;

    println!("\n2. the same account name in another tenant is another key: no waiting on acme");
    let started = tokio::time::Instant::now();
    let (a, b) = tokio::join!(acme.deposit("bob", 10), globex.deposit("bob", 10));
    println!(
        "    acme/bob = {}, globex/bob = {}, both in {:?}",
        a.map_err(|e| e.to_string())?,
        b.map_err(|e| e.to_string())?,
        started.elapsed()
    );

    println!("\n3. a statement while a transfer holds the account: on_fail answers at once");
    let (transfer, statement) = tokio::join!(acme.transfer("alice", "bob", 30), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        acme.statement("alice").await
    });
    transfer.map_err(|e| e.to_string())?;
    check(
        statement == Statement::Busy,
        "the statement should have found the lock busy",
    )?;
    let after = acme.statement("alice").await;
    println!("    after the transfer: {after:?}");
    check(
        matches!(after, Statement::Ready { balance: 70, .. }),
        "alice should have 70 after the transfer",
    )?;
    println!("    acme/bob = {}", acme.read("bob"));

    println!("\n4. an overdraft: the transfer returns early, its guards release on drop");
    match acme.transfer("bob", "alice", 1_000).await {
        Err(e @ LedgerError::InsufficientFunds { .. }) => println!("    refused: {e}"),
        other => return Err(format!("expected insufficient funds, got {other:?}")),
    }
    let next = acme.deposit("bob", 1).await.map_err(|e| e.to_string())?;
    println!("    the locks are free again: acme/bob = {next}");

    // Before the program ends: whatever the guards handed to the background is done, and
    // nothing of this process stays in the engine.
    dlock_runtime::global()
        .map_err(|e| e.to_string())?
        .close()
        .await
        .map_err(|e| e.to_string())
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}"))
    }
}
