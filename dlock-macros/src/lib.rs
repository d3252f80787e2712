//! The `#[dlock]` attribute of [dlock-runtime](https://docs.rs/dlock-runtime).
//!
//! Depend on `dlock-runtime` and write `use dlock_runtime::dlock;`: this crate only parses the
//! attribute and emits calls into the runtime, which holds every lock semantic. Its single item,
//! [`macro@dlock`], carries the documentation.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod args;
mod duration;
mod expand;
mod input;
mod key;
mod names;

/// Runs an `async fn` under a distributed lock.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "order:<id>", timeout = "5s", expire = "30s")]
/// async fn create_order(id: u64, qty: u32) -> Result<u32, LockError> {
///     // Runs in one process at a time for a given `id`, across every instance of the service.
///     Ok(qty)
/// }
/// ```
///
/// Each call builds the key from its arguments, acquires the lock (waiting up to `timeout`),
/// runs the body, and releases the lock when the body ends: on return, on `?`, on panic, and
/// when the caller drops the future. If the lock cannot be had, the function returns the
/// [`LockError`](../dlock_runtime/enum.LockError.html) through its `Result` (or through
/// `on_fail`) and the body does not run.
///
/// # Arguments
///
/// ```text
/// #[dlock(key = "<template>" [, timeout = "<duration>"] [, expire = "<duration>" | "auto"]
///         [, client = <expr>] [, on_fail = <path>] [, crate = "<path>"]
///         [, on_lost = "abort" | "continue"] [, max_hold = "<duration>"] [, fair = <bool>]
///         [, hold_at_least = "<duration>"] [, permits = <N> | read | write])]
/// ```
///
/// | argument | value | default |
/// | --- | --- | --- |
/// | `key` | string template, required | — |
/// | `timeout` | how long to wait for the lock; `"0s"` tries once | the locker's configuration (`DLOCK_TIMEOUT`, `5s`) |
/// | `expire` | the lease; `"auto"` renews it while the body runs | the locker's configuration (`DLOCK_EXPIRE`, `30s`) |
/// | `client` | expression giving a `&Locker` | `dlock_runtime::global()` |
/// | `on_fail` | `fn(LockError) -> R`, `R` the return type | `E::from(error)` in `Result<T, E>` |
/// | `crate` | path of the runtime crate | `::dlock_runtime` |
/// | `on_lost` | `"abort"` or `"continue"` | `"abort"` |
/// | `max_hold` | ceiling on a renewed lease | none |
/// | `fair` | `true`: waiters are served first come, first served across processes | `false` |
/// | `hold_at_least` | a job lock's minimum hold: the lock stays taken this long after it was acquired, even when the body ends sooner | none |
/// | `permits` | a counting semaphore: at most this many bodies run at once for the key | the mutex |
/// | `read`, `write` | a read/write lock: readers run together, a writer alone | the mutex |
///
/// ## `key`
///
/// A string literal. Text is copied as is. `<name>` is replaced by the `Display` of a parameter,
/// `<name.field.0>` by a field of it, `<self.field>` by a field of the receiver. Names bound
/// inside parameter patterns count: `Path(id): Path<u64>` makes `<id>` available. `<<` writes a
/// literal `<`; a `>` outside a placeholder is literal. The key is built from borrowed arguments
/// before the body runs; nothing is moved. The lock's name in the backend is the configured
/// prefix followed by the key (`dlock:order:42`).
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// struct Request { tenant: String, user: (u64, u8) }
///
/// #[dlock(key = "user:<req.tenant>/<req.user.0>")]
/// async fn update(req: &Request) -> Result<(), LockError> { Ok(()) }
///
/// #[dlock(key = "cmp:a<<b")] // the key is `cmp:a<b`
/// async fn compare() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// A placeholder must name a parameter, and its value must implement `Display`:
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "order:<order_id>")] // error: no parameter named `order_id`; parameters: `id`
/// async fn ship(id: u64) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// struct Id(u64); // no `Display`
/// #[dlock(key = "order:<id>")] // error: the `#[dlock]` key placeholder `<id>` must implement `Display`
/// async fn ship(id: Id) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `timeout`
///
/// How long to wait for the lock, as a literal like `"250ms"`, `"5s"`, `"1m30s"` or `"2h"`,
/// checked when the macro expands. `"0s"` makes a single attempt: a try-lock. When the time is
/// up the function returns `LockError::Timeout`.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "report", timeout = "0s")] // skip the run if another instance has it
/// async fn nightly_report() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "report", timeout = "5 seconds!")] // error: invalid `timeout` duration
/// async fn nightly_report() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `expire`
///
/// The lease: how long the lock outlives a holder that stopped answering. A positive duration,
/// or `"auto"` for a lease the runtime renews while the body runs (a watchdog). With a fixed
/// lease that runs out before the body ends, the lock counts as lost (see `on_lost`): the body
/// never knowingly runs without the lock.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "import:<file>", expire = "auto", max_hold = "1h")]
/// async fn import(file: String) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "import", expire = "0s")] // error: `expire` must be positive
/// async fn import() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `client`
///
/// An expression evaluated inside the function, so it may use the arguments, that yields a
/// `&Locker` (a `&Arc<Locker>` works too). The borrow ends once the lock is acquired. Without
/// it the process-wide locker is used ([`global()`](../dlock_runtime/fn.global.html), built
/// from the environment on first use).
///
/// ```
/// use dlock_runtime::{dlock, Locker, LockError};
///
/// struct App { locks: Locker }
///
/// #[dlock(key = "stock:<sku>", client = &app.locks)]
/// async fn reserve(app: App, sku: String) -> Result<App, LockError> { Ok(app) }
/// ```
///
/// ## `on_fail`
///
/// A function called with the `LockError` when the lock cannot be had, returning the
/// function's return type. Without it the function must return `Result<T, E>` with
/// `E: From<LockError>`.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// fn busy(_: LockError) -> &'static str { "busy, try again" }
///
/// #[dlock(key = "greeting", on_fail = busy)]
/// async fn greet() -> &'static str { "hello" }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::dlock;
/// #[dlock(key = "greeting")] // error: `greet` returns `()`; a lock failure needs somewhere to go
/// async fn greet() { println!("hello"); }
/// ```
///
/// ## `crate`
///
/// The path of the runtime crate when it is renamed or re-exported, as in serde and tokio.
///
/// ```
/// use dlock_runtime as locks;
///
/// #[locks::dlock(key = "job", crate = "locks")]
/// async fn job() -> Result<(), locks::LockError> { Ok(()) }
/// ```
///
/// ## `on_lost`
///
/// What happens when the lease is lost while the body runs (the backend was unreachable for
/// longer than the lease, a fixed `expire` ran out): `"abort"` (the default) drops the body's
/// future and returns `LockError::Lost` as a failed acquisition does; `"continue"` lets the body
/// finish and only reports the loss.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "cache:warm", on_lost = "continue")]
/// async fn warm_cache() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `max_hold`
///
/// A ceiling on how long a renewed lease (`expire = "auto"`) may be kept; only allowed with
/// `expire = "auto"`. Reaching it counts as losing the lock.
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "import", max_hold = "1h")] // error: `max_hold` caps a renewed lease and needs `expire = "auto"`
/// async fn import() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `hold_at_least`
///
/// A job lock's minimum hold (ShedLock's `lockAtLeastFor`, `LockOptions::hold_at_least`): the
/// lock stays taken until at least this long after it was acquired, even when the body ends
/// sooner (then nobody renews it, and it lapses). Another instance's run of the same schedule,
/// a little late by its clock, finds it taken and skips instead of running the job twice. With
/// `timeout = "0s"` and an `on_fail` that treats `Timeout` as "another instance ran it", it is
/// a scheduled job that runs once per period across the fleet. At most 365 days; not available
/// on ZooKeeper (a `Config` error at run time: its lock nodes end with their session).
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "report:nightly", timeout = "0s", hold_at_least = "5m", on_fail = skipped)]
/// async fn nightly_report() -> Result<bool, LockError> {
///     // … the report …
///     Ok(true)
/// }
///
/// /// Another instance holds the lock (or held it within the last five minutes): not run.
/// fn skipped(error: LockError) -> Result<bool, LockError> {
///     if error.is_timeout() { Ok(false) } else { Err(error) }
/// }
/// ```
///
/// ## `permits`
///
/// `permits = N` takes one of `N` permits of a counting semaphore instead of the mutex
/// (`Locker::acquire_permit`): at most `N` calls run the body at once for the key, across
/// every process. Each permit has its own lease, renewal and fencing token; a holder that dies
/// frees its permit when its lease ends. Every function that locks the key must give the same
/// `N`: while the key is held, another count fails with `LockError::Conflict`.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// /// At most 3 exports per tenant at once.
/// #[dlock(key = "export:<tenant>", permits = 3, expire = "auto")]
/// async fn export(tenant: &str) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "export", permits = 0)] // error: a semaphore of 0 permits admits nobody
/// async fn export() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `read` and `write`
///
/// A read/write lock instead of the mutex (`Locker::acquire_read`, `Locker::acquire_write`):
/// `read` bodies of a key run together, a `write` body runs alone; a writer waiting for the key
/// keeps new readers out, so writers are not starved. Inside a `read` body, a `write` body of
/// the same key fails with `LockError::Conflict` (a read lock is never upgraded: two readers
/// upgrading would wait for each other forever); inside a `write` body, a `read` body of the
/// key runs at once (the write hold covers it).
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "doc:<id>", read)]
/// async fn show(id: u64) -> Result<String, LockError> { Ok(format!("doc {id}")) }
///
/// #[dlock(key = "doc:<id>", write)]
/// async fn edit(id: u64, text: &str) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "doc", read, write)] // error: `write` and `read` ask for two kinds of lock
/// async fn edit() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ## `fair`
///
/// `fair = true` queues the callers of a key across all processes and serves them first come,
/// first served (`LockOptions::fair`), instead of whoever retries first. Use it on every
/// function that locks the key, or on none.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// #[dlock(key = "ticket:<event>", fair = true)]
/// async fn buy_ticket(event: u32) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "ticket", fair = "yes")] // error: `fair` takes `true` or `false` (no quotes)
/// async fn buy_ticket() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// # Where it applies
///
/// Any `async fn` with a body: free functions, inherent and trait-impl methods (`self`,
/// `&self`, `&mut self`, including native `async fn` in traits), generic functions, `impl Trait`
/// arguments, and parameters that are patterns (`Path(id): Path<u64>`,
/// `Json(Order { sku, .. }): Json<Order>`). Visibility, attributes, docs, generics and where
/// clauses stay as written, and the returned future is `Send` whenever the body's is, as axum
/// handlers need.
///
/// ```
/// use dlock_runtime::{dlock, LockError};
///
/// struct Path<T>(T);
/// struct Account { id: u64, balance: i64 }
///
/// impl Account {
///     #[dlock(key = "account:<self.id>")]
///     async fn withdraw(&mut self, amount: i64) -> Result<i64, LockError> {
///         self.balance -= amount;
///         Ok(self.balance)
///     }
/// }
///
/// #[dlock(key = "order:<id>")]
/// async fn handler(Path(id): Path<u64>) -> Result<String, LockError> {
///     Ok(format!("order {id}"))
/// }
/// ```
///
/// It also works on the methods of an `#[async_trait]` impl or trait. `#[async_trait]`, being on
/// the impl, rewrites the method before `#[dlock]` sees it; `#[dlock]` recognizes the rewritten
/// method and puts the lock inside its boxed future, after the arguments are bound.
///
/// # Errors
///
/// Every misuse is a compile error on the offending token that says what to write instead:
/// a function that is not `async` or is `const`; a missing, duplicate or unknown argument; a
/// `key` that is not a string literal or is empty; an empty (`<>`), unterminated or malformed
/// placeholder; a placeholder naming no parameter (the error lists the names there are); a
/// placeholder whose value is not `Display`; a malformed duration, or a zero `expire` or
/// `max_hold`; `max_hold` without `expire = "auto"`; a `fair` that is not `true` or `false`;
/// `permits` that is not a whole number from 1 up, two kinds of lock (`permits`, `read`,
/// `write`) at once, `read` or `write` with a value, `hold_at_least` on a semaphore or a
/// read/write lock; and, without `on_fail`, a return type that
/// is not a `Result` whose error type converts from `LockError`.
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "a", ttl = "5s")] // error: unknown argument `ttl`; expected one of `key`, `timeout`, …
/// async fn f() -> Result<(), LockError> { Ok(()) }
/// ```
///
/// ```compile_fail
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "a")] // error: `#[dlock]` applies to an `async fn`
/// fn f() -> Result<(), LockError> { Ok(()) }
/// ```
#[proc_macro_attribute]
pub fn dlock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::dlock(args.into(), item.into()).into()
}
