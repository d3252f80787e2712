//! The wait: one acquisition, from its first attempt to a guard or an error, as named steps.
//!
//! 1. [`join_line_first`](Wait::join_line_first): fair waiters, waiters on an engine with a
//!    line of its own, and waiters of a key this process already waits for queue in the
//!    in-process line before asking the engine.
//! 2. Each round: [`take_answer`](Wait::take_answer) (the offer to take the lock from a holder
//!    of this locker is withdrawn, or its answer awaited), then [`attempt`](Wait::attempt)
//!    (one request, unless nothing can have changed), then, refused,
//!    [`refused`](Wait::refused) (join the line, arm the wake-up) and
//!    [`pause`](Wait::pause) (until a wake-up, a pass, the deadline or closing).
//! 3. [`holding`](Wait::holding) makes the guard; [`give_up`](Wait::give_up) removes what the
//!    wait put in the engine and says why it failed.

use std::{pin::Pin, time::Duration};

use tokio::{
    sync::{Notify, futures::Notified},
    time::Instant,
};

use super::{
    Locker,
    line::{Passed, Turn},
    release::OrphanCleanup,
};
use crate::{
    LockError, LockGuard, LockOptions,
    backend::{Attempt, FairOrder, Queued, Request, Token, WakeUp, Watch},
    error::BackendError,
    guard::Hold,
    lease::{Grant, Lease, far_future},
};

/// The fallback pause of a waiter whose wake-up is a watch on its predecessor in line.
const RELIABLE_WATCH_PAUSE: Duration = Duration::from_secs(1);

/// The fallback pause (at least `DLOCK_RETRY`'s) of a waiter with the wake-up of an engine
/// whose releases name the place they wake (Redis, RedLock, PostgreSQL): a waiting process asks
/// a few times a second rather than 20-100 times, whatever the holder's hold. What it covers:
/// a place first in line whose process is gone (releases name it until it lapses) and the
/// requests that refresh the waiter's own place; a holder that goes without releasing bounds
/// the pause by its lease, and a lost notification connection wakes every waiter, which then
/// ask at `DLOCK_RETRY` until it is back or they have another wake-up that hears (on RedLock,
/// while a key's first master is down, the other masters' announcements). After an attempt
/// that failed (no answer, an error) the pause is `DLOCK_RETRY` too, backing off over failures
/// in a row (see `after_errors`).
const NAMED_WATCH_PAUSE: (Duration, Duration) =
    (Duration::from_millis(250), Duration::from_millis(500));

/// How often a waiter whose release wake-up could not be armed, or no longer hears, asks for
/// one again (in a task that goes on across its pauses, while it polls): a subscription or
/// `LISTEN` slower than the request timeout, or a notification connection that was down, still
/// wakes the rest of a long wait.
const REWATCH_EVERY: Duration = Duration::from_secs(1);

/// The turn and its line's place, when the wait uses one (`uses`: see `Wait::queue_engine`)
/// and the line has one.
fn line_place<'t>(turn: Option<&'t Turn<'_>>, uses: bool) -> Option<(&'t Turn<'t>, &'t Token)> {
    let turn = turn.filter(|_| uses)?;
    Some((turn, turn.line.place.as_ref()?))
}

/// One acquisition's wait, between its steps.
pub(super) struct Wait<'a> {
    locker: &'a Locker,
    options: &'a LockOptions,
    lease: Lease,
    timeout: Duration,
    started: Instant,
    deadline: Instant,
    /// The key and token, and what must be removed should the wait end without the lock.
    /// Before `turn`: a dropped wait withdraws its offer to take the lock while it is still
    /// first in line, so the next waiter never finds one there.
    orphan: OrphanCleanup<'a>,
    /// First in the key's in-process line.
    turn: Option<Turn<'a>>,
    /// The release wake-up: armed before the first attempt when the wait starts in line, else
    /// after the first refusal. An uncontended acquisition asks for none, nor does a single
    /// attempt.
    watch: Option<Watch>,
    watch_asked: bool,
    /// When to ask again for the wake-up, asked for and not had (see [`REWATCH_EVERY`]); a
    /// wake-up that no longer hears asks at once.
    rewatch_at: Option<Instant>,
    /// The request for another wake-up, under way across pauses while the waiter has none
    /// that hears (aborted when dropped).
    rewatching: Option<Rewatch>,
    /// The wake-up the waiter had when it stopped hearing, kept while another stands in: it is
    /// taken back once it hears again (on RedLock, the place's channel on the key's first
    /// master, back after an outage; the other masters' announcements wake every waiting
    /// process at each release). Its registration keeps its connection being made again.
    spare: Option<Watch>,
    /// A holder's answer to this waiter's offer to take the lock, once it came.
    passed: Option<Passed>,
    /// The waiter before this one took the lock, having heard this many release wake-ups:
    /// nothing to ask until another comes.
    handed_on: Option<u64>,
    attempts: u32,
    last_error: Option<BackendError>,
    /// Attempts in a row that failed (reset by any answer).
    errors_in_a_row: u32,
    /// An error that ends the wait at once (the OS random generator failed).
    fatal: Option<LockError>,
}

/// What an attempt came to.
enum Attempted {
    Acquired(Grant),
    /// Try again at once (the wait just joined its line, or armed its wake-up).
    Again,
    /// Refused: pause, no longer than the holder's remaining lease when it is known.
    Refused(Option<Duration>),
    GiveUp,
}

impl<'a> Wait<'a> {
    fn new(
        locker: &'a Locker,
        key: String,
        timeout: Duration,
        lease: Lease,
        options: &'a LockOptions,
    ) -> Result<Self, LockError> {
        let started = Instant::now();
        Ok(Self {
            locker,
            options,
            lease,
            timeout,
            started,
            deadline: started.checked_add(timeout).unwrap_or_else(far_future),
            orphan: OrphanCleanup {
                runtime: tokio::runtime::Handle::try_current().ok(),
                locker,
                key,
                kind: options.kind,
                token: Token::generate()?,
                armed: false,
                baton: None,
            },
            turn: None,
            watch: None,
            watch_asked: !locker.inner.settings.notify || timeout.is_zero(),
            rewatch_at: None,
            rewatching: None,
            spare: None,
            passed: None,
            handed_on: None,
            attempts: 0,
            last_error: None,
            errors_in_a_row: 0,
            fatal: None,
        })
    }

    /// The whole wait, from the wait's making. Made here, not by the caller: an `async fn`
    /// keeps each argument twice in its future (the argument and its binding), and a `Wait`
    /// is large; the future is moved whole at each layer above.
    pub(super) async fn run(
        locker: &'a Locker,
        key: String,
        timeout: Duration,
        lease: Lease,
        options: &'a LockOptions,
    ) -> Result<LockGuard, LockError> {
        let mut wait = Self::new(locker, key, timeout, lease, options)?;
        if !wait.join_line_first().await? {
            return Err(wait.orphan.timed_out(wait.started, wait.options.name));
        }
        loop {
            match wait.take_answer().await {
                Ok(Some(grant)) => return Ok(wait.holding(grant)),
                Ok(None) if !wait.locker.is_closing() => {}
                // Late, or closing.
                Ok(None) | Err(()) => break,
            }
            wait.take_back_spare();
            // Armed before the request, so a release published while it is in flight still
            // wakes this waiter.
            let notify = wait.watch.as_ref().map(Watch::notify);
            let mut notified = std::pin::pin!(notify.as_deref().map(Notify::notified));
            if let Some(notified) = notified.as_mut().as_pin_mut() {
                notified.enable();
            }
            let holder_ttl = match wait.attempt().await {
                Attempted::Acquired(grant) => return Ok(wait.holding(grant)),
                Attempted::Again => continue,
                Attempted::Refused(ttl) => ttl,
                Attempted::GiveUp => break,
            };
            if Instant::now() >= wait.deadline {
                break;
            }
            wait.passed = wait
                .pause(
                    holder_ttl,
                    notified.as_mut().as_pin_mut(),
                    notify.as_deref(),
                )
                .await;
        }
        wait.give_up().await
    }

    /// A mutex on an engine with a queue of places ([`FairOrder::Queue`]): the wait takes its
    /// line's place there, releases name the place first in it, and a waiter that saw the lock
    /// handed on in this process asks nothing until a release. Semaphores and read/write
    /// locks have several holders at once: their waiters hold no place, every release may be
    /// for any of them.
    fn queue_engine(&self) -> bool {
        let capabilities = &self.locker.inner.capabilities;
        // RedLock's places serve only wake-ups: none with notifications off.
        let places = capabilities.places && self.locker.inner.settings.notify;
        (capabilities.fair == FairOrder::Queue || places) && self.options.kind.is_mutex()
    }

    /// The in-process line before the first attempt (see `Lines`): for a fair waiter (even a
    /// single attempt asks from the line's place, so it never passes the queue), and for any
    /// waiter on an engine with its own line or of a key that has waiters here already;
    /// otherwise a waiter joins after its first refusal, so an uncontended acquisition pays one
    /// atomic read for it. `false` when the deadline (or closing) came first.
    async fn join_line_first(&mut self) -> Result<bool, LockError> {
        let native_line = self.locker.inner.capabilities.fair == FairOrder::Native;
        let lines = &self.locker.inner.lines;
        let key = &self.orphan.key;
        if !(self.options.fair || (!self.timeout.is_zero() && (native_line || lines.busy(key)))) {
            return Ok(true);
        }
        let Some(first) = lines.turn(key, self.deadline).await? else {
            return Ok(false);
        };
        self.handed_on = first.handed_on().filter(|_| self.queue_engine());
        self.turn = Some(first);
        self.arm_from_line();
        Ok(true)
    }

    /// The waiters ahead in this process subscribed, most likely: the wake-up is armed from
    /// that, with no I/O.
    fn arm_from_line(&mut self) {
        if !self.watch_asked {
            let watch = (self.locker.backend()).watching(
                &self.orphan.key,
                &self.orphan.token,
                self.place(),
            );
            self.watch_asked = watch.is_some();
            self.watch = watch;
        }
    }

    /// Arms the release wake-up (a subscription already up, or a new one).
    async fn arm_wake_up(&mut self) {
        self.watch_asked = true;
        let (backend, key, token) = (self.locker.backend(), &self.orphan.key, &self.orphan.token);
        let place = self.place();
        let watch = match backend.watching(key, token, place) {
            Some(watch) => Some(watch),
            None => backend.watch(key, token, place).await,
        };
        self.rewatch_at = watch.is_none().then(|| Instant::now() + REWATCH_EVERY);
        self.watch = watch;
    }

    /// The place in the engine's queue this waiter waits from (its line's), if it has one: the
    /// releases that name it are the ones to hear.
    fn place(&self) -> Option<&Token> {
        line_place(self.turn.as_ref(), self.queue_engine()).map(|(_, place)| place)
    }

    /// The offer to take the lock from a holder is withdrawn before anything else; when a holder
    /// took it, its answer is awaited instead (the key may be this waiter's by now). `Ok(Some)`:
    /// the lock was passed; `Err(())`: the answer came after the deadline without the lock,
    /// which ends the wait (no attempt is made after the deadline).
    async fn take_answer(&mut self) -> Result<Option<Grant>, ()> {
        let mut late = false;
        let orphan = &mut self.orphan;
        if self.passed.is_none()
            && let Some((line, answer)) = orphan.baton.as_mut()
            && !line.withdraw(&orphan.token)
        {
            self.passed = Some(answer.await.unwrap_or(Passed::Unknown));
            late = Instant::now() > self.deadline;
        }
        orphan.baton = None;
        match self.passed.take() {
            Some(Passed::Held { fence, sent_at }) => {
                tracing::debug!(attempts = self.attempts, waited = ?self.started.elapsed(), fencing_token = fence, "lock passed by a holder of this locker");
                crate::stats::passed(self.options.name);
                if let Some(t) = &self.turn {
                    t.line
                        .passes
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
                let lease = self.lease;
                return Ok(Some(Grant {
                    fence,
                    sent_at,
                    lease,
                    lost: None,
                }));
            }
            // The holder had lost it; or the pass may have made the key this waiter's, which its
            // next attempt recognises (and giving up removes).
            Some(Passed::Refused) | None => {}
            Some(Passed::Unknown) => orphan.armed = true,
        }
        if late { Err(()) } else { Ok(None) }
    }

    /// One request to the engine, unless the lock was handed on within this process and no
    /// release was heard since (read after the wake-up was armed, so a release from now on
    /// wakes this waiter).
    async fn attempt(&mut self) -> Attempted {
        let quiet = (self.handed_on.take())
            .zip(self.watch.as_ref())
            .is_some_and(|(at, watch)| watch.heard() == Some(at));
        if quiet {
            return Attempted::Refused(None);
        }
        self.attempts += 1;
        let liveness = waiter_liveness(
            &self.locker.inner.settings,
            self.locker.inner.capabilities.wake_up,
        );
        let queue = line_place(self.turn.as_ref(), self.queue_engine()).map(|(t, place)| Queued {
            place,
            liveness,
            keep: t.others_waiting(),
            strict: self.options.fair,
            refresh: !t.line.refreshed_within(liveness / 4),
        });
        if let (Some(t), Some(_)) = (&self.turn, queue) {
            t.line
                .queued
                .store(true, std::sync::atomic::Ordering::Release);
        }
        let (in_queue, gives_up_place) = (queue.is_some(), queue.is_some_and(|q| !q.keep));
        let refreshes = queue.is_some_and(|q| q.refresh);
        let request = Request {
            key: &self.orphan.key,
            token: &self.orphan.token,
            lease: self.lease.length,
            kind: self.options.kind,
            liveness,
            queue,
        };
        let sent_at = Instant::now();
        // Until a definite answer arrives, the request may have set the key.
        let was_armed = self.orphan.armed;
        self.orphan.armed = true;
        match self.locker.backend().acquire(request).await {
            Ok(Attempt::Acquired {
                fence,
                granted,
                lost,
                counted_from,
            }) => {
                tracing::debug!(attempts = self.attempts, waited = ?self.started.elapsed(), fencing_token = fence, "lock acquired");
                if let Some(t) = &self.turn {
                    t.line.passes.store(0, std::sync::atomic::Ordering::Release);
                    if gives_up_place {
                        t.line
                            .queued
                            .store(false, std::sync::atomic::Ordering::Release);
                        t.line.set_refreshed(None);
                    } else if in_queue {
                        // Kept: moved to the back of the queue with a fresh deadline.
                        t.line.set_refreshed(Some(sent_at));
                    }
                }
                let lease = self.lease.granted(granted);
                Attempted::Acquired(Grant {
                    fence,
                    sent_at: counted_from.map_or(sent_at, |from| from.max(sent_at)),
                    lease,
                    lost,
                })
            }
            Ok(Attempt::Held { ttl, queued }) => {
                // A definite "not ours" clears nothing an earlier lost reply may have set; a
                // place in line of this token (an engine with a line) goes with the wait.
                self.orphan.armed = was_armed || (queued && !in_queue);
                self.last_error = None;
                self.errors_in_a_row = 0;
                if in_queue
                    && !queued
                    && let Some(t) = &self.turn
                {
                    // The place may not be in the queue (RedLock: the first master did not
                    // answer from it): the next attempt puts it there.
                    t.line.set_refreshed(None);
                }
                if refreshes
                    && queued
                    && let Some(t) = &self.turn
                {
                    t.line.set_refreshed(Some(sent_at));
                }
                self.refused(ttl).await
            }
            Ok(Attempt::Conflict(reason)) => {
                // Nothing was taken; an earlier ambiguous attempt's leftovers stay armed.
                self.orphan.armed = was_armed;
                tracing::debug!(reason = %reason, "lock refused: the key is in use as another kind");
                self.fatal = Some(LockError::Conflict {
                    key: self.orphan.key.clone(),
                    reason,
                });
                Attempted::GiveUp
            }
            Err(error) => {
                // Said once, when the wait gives up (an outage is one line per failed
                // acquisition, not one per attempt). A refusal that asking again cannot cure
                // (a permission, a key of another type) ends the wait now; the cleanup stays
                // armed: a script refused half-way may have set the key.
                tracing::debug!(error = %error, "lock backend error");
                let refused = error.is_refused();
                self.last_error = Some(error);
                self.errors_in_a_row = self.errors_in_a_row.saturating_add(1);
                if refused {
                    Attempted::GiveUp
                } else {
                    Attempted::Refused(None)
                }
            }
        }
    }

    /// After a refusal: a wait not yet in line waits behind this process's other waiters of
    /// the key, then tries at once (the lock may have changed hands meanwhile); one that has no
    /// wake-up arms it, then tries at once (the release may have come before it was armed).
    async fn refused(&mut self, ttl: Option<Duration>) -> Attempted {
        if self.turn.is_none() && !self.timeout.is_zero() {
            let lines = &self.locker.inner.lines;
            match lines.turn(&self.orphan.key, self.deadline).await {
                Ok(Some(first)) if first.waited => {
                    self.handed_on = first.handed_on().filter(|_| self.queue_engine());
                    self.turn = Some(first);
                    self.arm_from_line();
                    return Attempted::Again;
                }
                Ok(Some(first)) => {
                    self.turn = Some(first);
                    if self.queue_engine() {
                        // Not in the engine's queue yet: arm the wake-up, then join the queue
                        // with the next attempt.
                        if !self.watch_asked {
                            self.arm_wake_up().await;
                        }
                        return Attempted::Again;
                    }
                    // First in line at once: this refusal stands; wait as usual.
                }
                Ok(None) => return Attempted::GiveUp,
                Err(error) => {
                    self.fatal = Some(error);
                    return Attempted::GiveUp;
                }
            }
        }
        if !self.watch_asked && Instant::now() < self.deadline {
            self.arm_wake_up().await;
            if self.watch.is_some() {
                return Attempted::Again;
            }
        }
        Attempted::Refused(ttl)
    }

    /// How long to sleep: a jittered pause within [`pause_bounds`], never past the deadline nor
    /// the holder's remaining lease (an expired lease publishes nothing).
    fn pause_length(&self, holder_ttl: Option<Duration>) -> Duration {
        let (settings, wake_up) = (
            &self.locker.inner.settings,
            self.locker.inner.capabilities.wake_up,
        );
        // Where releases name the place they wake, the longer pause is for a waiter a holder
        // refused; after failed attempts (no answer in time, an error) the waiter asks again
        // at `DLOCK_RETRY`, backing off over errors in a row (see `after_errors`).
        let (min, max) = match &self.last_error {
            Some(error) if wake_up == WakeUp::Named => after_errors(
                settings,
                wake_up,
                self.errors_in_a_row,
                error.is_contended(),
            ),
            _ => pause_bounds(
                settings,
                wake_up,
                self.watch.as_ref().is_some_and(Watch::hears),
            ),
        };
        let mut pause =
            jitter(min, max).min(self.deadline.saturating_duration_since(Instant::now()));
        if let Some(ttl) = holder_ttl {
            pause = pause.min(ttl.max(Duration::from_millis(1)));
        }
        pause
    }

    /// Sleeps until a release wakes this waiter, a holder of this locker answers its offer to
    /// take the lock (made here, when the engine passes), the pause ends, or the locker closes;
    /// the holder's answer, if that came. A waiter without the wake-up it asked for asks again
    /// when due, and once it has it ends the pause (a release may have come before it).
    async fn pause(
        &mut self,
        holder_ttl: Option<Duration>,
        notified: Option<Pin<&mut Notified<'_>>>,
        notify: Option<&Notify>,
    ) -> Option<Passed> {
        let wake_at = Instant::now() + self.pause_length(holder_ttl);
        let offers = !self.options.fair
            && self.locker.inner.capabilities.passes
            && self.options.kind.is_mutex();
        if offers && let Some(t) = &self.turn {
            let offer = t.line.offer(&self.orphan.token, self.lease.length);
            self.orphan.baton = Some((t.line.clone(), offer));
        }
        // Who a release must name for this waiter to look: its line's place in the queue;
        // anyone, on an engine without one.
        // (Not `self.place()`: the offer's answer below borrows `self.orphan` meanwhile.)
        let me = line_place(self.turn.as_ref(), self.queue_engine()).map(|(_, place)| place);
        // A wake-up that no longer hears releases (its notification connection dropped) stays
        // until another is had, asked for at once and then every while (on RedLock, while a
        // key's first master is down, the other masters' announcements), and is taken back
        // once it hears again (see `take_back_spare`).
        let hears = self.watch.as_ref().is_some_and(Watch::hears);
        if hears || (self.watch.is_none() && self.rewatch_at.is_none()) {
            self.rewatching = None;
        } else if self.rewatching.is_none() {
            let at = self.rewatch_at.unwrap_or_else(Instant::now);
            self.rewatching = Some(Rewatch::start(self.locker, &self.orphan, me.cloned(), at));
        }
        let woke = {
            let answer = &mut self.orphan.baton;
            let answer = std::pin::pin!(async move {
                match answer {
                    Some((_, answer)) => answer.await.unwrap_or(Passed::Unknown),
                    None => std::future::pending().await,
                }
            });
            let (rewatching, rewatch_at) = (&mut self.rewatching, &mut self.rewatch_at);
            // Its end is taken once: `Woke::Watch` drops the task's handle, and so does a task
            // that ended without one (its runtime shutting down), for another a while later.
            let rewatch = std::pin::pin!(async move {
                if let Some(Rewatch(task)) = rewatching {
                    if let Ok(watch) = task.await {
                        return watch;
                    }
                    *rewatching = None;
                    *rewatch_at = Some(Instant::now() + REWATCH_EVERY);
                }
                std::future::pending().await
            });
            let sleep = std::pin::pin!(tokio::time::sleep_until(wake_at));
            let closing = std::pin::pin!(self.locker.inner.closing.cancelled());
            let wake_up = match (notified, &self.watch, notify) {
                (Some(first), Some(watch), Some(notify)) => Some((first, watch, notify)),
                _ => None,
            };
            sleep_until_woken(wake_up, me, answer, rewatch, sleep, closing).await
        };
        match woke {
            Woke::Passed(passed) => Some(passed),
            Woke::Watch(watch) => {
                let key = &self.orphan.key;
                tracing::debug!(key = %key, "release wake-up armed late, or again; the wait asks again at once");
                self.rewatch_at = None;
                self.rewatching = None;
                let deaf = self.watch.replace(watch).filter(|old| !old.hears());
                if self.spare.is_none() {
                    self.spare = deaf;
                }
                None
            }
            Woke::Slept => None,
        }
    }

    /// The wake-up that stopped hearing, back in place of the one that stood in once it hears
    /// again (before an attempt: its wake-up is armed before the request).
    fn take_back_spare(&mut self) {
        if self.spare.as_ref().is_some_and(Watch::hears) {
            tracing::debug!(key = %self.orphan.key, "release wake-up heard again; the one that stood in goes");
            self.watch = self.spare.take();
            self.rewatching = None;
        }
    }

    /// The guard of the hold the wait got. The waiter leaves its line holding the lock, having
    /// heard so many release wake-ups: the next waiter there asks nothing until another comes
    /// (or a pass does).
    fn holding(self, grant: Grant) -> LockGuard {
        let heard = self.watch.as_ref().and_then(Watch::heard);
        let Self {
            locker,
            options,
            orphan,
            turn,
            ..
        } = self;
        if let Some(mut t) = turn {
            t.leaving_holder = Some(heard);
        }
        let (key, token) = orphan.disarm();
        let hold = Hold::new(
            locker.clone(),
            key,
            options.kind,
            token,
            &grant,
            options.name,
            options.hold_at_least,
        );
        hold.follow_engine(grant.lost);
        LockGuard::new(hold, grant.lease, options.max_hold)
    }

    /// What the wait put in the engine goes before it returns: a lock an ambiguous attempt may
    /// have set, its place in line, the line's place in the queue when it was the last waiter
    /// here. The offer is withdrawn while the waiter is still first in line. Then one event
    /// per failed acquisition, saying what it left to lapse, if anything.
    ///
    /// Not an `async fn`: the wait is taken apart first, so the future holds only what the
    /// removal needs.
    fn give_up(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'a {
        let Self {
            locker,
            options,
            lease,
            started,
            orphan,
            mut turn,
            attempts,
            last_error,
            fatal,
            watch,
            spare,
            ..
        } = self;
        let (key, token) = orphan.give_up();
        let place = turn.as_mut().and_then(Turn::depart);
        drop(turn);
        async move {
            // Kept until the removal is done: dropping the wake-up may unsubscribe, a request
            // of its own that the removal need not wait behind.
            let _watch = (watch, spare);
            let left = locker
                .remove_leftovers((&key, options.kind), token, place, lease.length)
                .await;
            let left = left.as_deref();
            let waited = started.elapsed();
            let name = options.name;
            if let Some(error) = fatal {
                return Err(error);
            }
            if locker.is_closing() {
                tracing::debug!(key = %key, name, attempts, ?waited, left, "lock wait ended: the locker was closed");
                return Err(LockError::Closed { key });
            }
            match last_error {
                Some(error) if error.is_refused() => {
                    tracing::error!(key = %key, name, attempts, ?waited, error = %error, left, "lock backend refused the acquisition");
                    Err(LockError::Backend(error))
                }
                Some(error) => {
                    tracing::error!(key = %key, name, attempts, ?waited, error = %error, left, "lock backend unreachable until the deadline");
                    Err(LockError::Backend(error))
                }
                None if left.is_some() => {
                    tracing::warn!(key = %key, name, attempts, ?waited, left, "lock wait timed out; what it left in the engine lapses on its own");
                    Err(LockError::Timeout { key, waited })
                }
                None => {
                    tracing::info!(key = %key, name, attempts, ?waited, "lock wait timed out");
                    Err(LockError::Timeout { key, waited })
                }
            }
        }
    }
}

/// A request for the release wake-up that goes on across pauses until it has one, asking at
/// `at` and then every [`REWATCH_EVERY`]: one cut off at the end of a 10-50ms pause would
/// never outlast a slow subscription (RedLock asks a first master that does not answer before
/// the others). Aborted when dropped.
struct Rewatch(tokio::task::JoinHandle<Watch>);

impl Rewatch {
    fn start(locker: &Locker, orphan: &OrphanCleanup<'_>, me: Option<Token>, at: Instant) -> Self {
        let (locker, key, token) = (locker.clone(), orphan.key.clone(), orphan.token.clone());
        Self(tokio::spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at).await;
                if locker.is_closing() {
                    // The wait ends, and aborts this: no subscription after `close`.
                    return std::future::pending().await;
                }
                if let Some(watch) = locker.backend().watch(&key, &token, me.as_ref()).await {
                    return watch;
                }
                at = Instant::now() + REWATCH_EVERY;
            }
        }))
    }
}

impl Drop for Rewatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a pause ended.
enum Woke {
    /// It ran out, a release woke the waiter, or the locker closes.
    Slept,
    /// A holder of this locker answered the waiter's offer to take the lock.
    Passed(Passed),
    /// The release wake-up, asked for again and had (the waiter had none, or one that no
    /// longer hears).
    Watch(Watch),
}

/// The pause itself: until `sleep` ends, the wake-up rings (for this waiter's place `me`, on an
/// engine whose releases name one: the others keep waiting instead of all asking at once), a
/// holder answers (`answer`), the locker closes, or, without a wake-up that hears, asking for one
/// (`rewatch`) has it.
async fn sleep_until_woken(
    wake_up: Option<(Pin<&mut Notified<'_>>, &Watch, &Notify)>,
    me: Option<&Token>,
    mut answer: Pin<&mut impl std::future::Future<Output = Passed>>,
    mut rewatch: Pin<&mut impl std::future::Future<Output = Watch>>,
    mut sleep: Pin<&mut tokio::time::Sleep>,
    mut closing: Pin<&mut impl std::future::Future<Output = ()>>,
) -> Woke {
    let Some((first, watch, notify)) = wake_up else {
        return tokio::select! {
            () = &mut sleep => Woke::Slept,
            answer = &mut answer => Woke::Passed(answer),
            watch = rewatch => Woke::Watch(watch),
            () = &mut closing => Woke::Slept,
        };
    };
    let mut woken = tokio::select! {
        () = &mut sleep => false,
        () = first => true,
        answer = &mut answer => return Woke::Passed(answer),
        watch = &mut rewatch => return Woke::Watch(watch),
        () = &mut closing => return Woke::Slept,
    };
    while woken
        && let Some(me) = me
        && !watch.may_be_for(me)
    {
        let mut again = std::pin::pin!(notify.notified());
        again.as_mut().enable();
        if watch.may_be_for(me) {
            break;
        }
        woken = tokio::select! {
            () = &mut sleep => false,
            () = again => true,
            answer = &mut answer => return Woke::Passed(answer),
            watch = &mut rewatch => return Woke::Watch(watch),
            () = &mut closing => return Woke::Slept,
        };
    }
    Woke::Slept
}

/// The bounds of a waiter's pause: `DLOCK_RETRY`, or, while it has a wake-up that hears
/// releases (`watching`), what the engine's wake-up leaves to it (see [`WakeUp`]).
fn pause_bounds(
    settings: &crate::config::Settings,
    wake_up: WakeUp,
    watching: bool,
) -> (Duration, Duration) {
    let retry = settings.retry;
    match wake_up {
        _ if !watching => retry,
        WakeUp::Partial => retry,
        WakeUp::Named => (
            retry.0.max(NAMED_WATCH_PAUSE.0),
            retry.1.max(NAMED_WATCH_PAUSE.1),
        ),
        WakeUp::Predecessor => (RELIABLE_WATCH_PAUSE, RELIABLE_WATCH_PAUSE),
    }
}

/// Failed attempts in a row whose last one was a split between contenders (RedLock: see
/// `after_errors`) that are asked again at `DLOCK_RETRY` before the pause backs off.
const SPLITS_AT_ONCE: u32 = 3;

/// The pause after `errors` failed attempts in a row, where releases name the place they wake
/// (no release may follow a failure: a holder's key that a failed attempt could not see, or
/// RedLock's votes split between two contenders that each undid theirs): `DLOCK_RETRY` after the
/// first, doubled after each next one up to the pause of a waiter whose wake-up hears
/// (`NAMED_WATCH_PAUSE`, with notifications on), so a waiting process asks an engine that
/// answers errors fast (`LOADING`, `READONLY`, `CLUSTERDOWN`, `TRYAGAIN` in a failover, a refused
/// connection) a few times a second, not 20 to 100; errors that take a request timeout each
/// space themselves. After a split (`contended`: two contenders each had part of the votes) the
/// first [`SPLITS_AT_ONCE`] more are asked at `DLOCK_RETRY`, as a jittered retry settles a
/// race between live contenders; a split that goes on (the other "contender" a holder whose
/// bare majority counts a master that went down, or keys that lapse on their own) backs off
/// as any error does.
fn after_errors(
    settings: &crate::config::Settings,
    wake_up: WakeUp,
    errors: u32,
    contended: bool,
) -> (Duration, Duration) {
    let retry = settings.retry;
    let errors = if contended {
        errors.saturating_sub(SPLITS_AT_ONCE)
    } else {
        errors
    };
    let most = pause_bounds(settings, wake_up, settings.notify);
    let factor = 1u32 << errors.saturating_sub(1).min(16);
    (
        retry.0.saturating_mul(factor).min(most.0).max(retry.0),
        retry.1.saturating_mul(factor).min(most.1).max(retry.1),
    )
}

/// How long a waiter keeps its place in the queue without trying again: several of its
/// longest pauses (with notifications on, a waiter's once it has the wake-up) plus the longest
/// a slow attempt and subscription can take (four request timeouts), so only a waiter that is
/// gone loses its place.
fn waiter_liveness(settings: &crate::config::Settings, wake_up: WakeUp) -> Duration {
    let longest = pause_bounds(settings, wake_up, settings.notify).1;
    (longest * 4 + settings.request_timeout * 4).max(Duration::from_millis(250))
}

/// A uniformly random pause in `min..=max`.
fn jitter(min: Duration, max: Duration) -> Duration {
    let span = u64::try_from((max - min).as_micros()).unwrap_or(u64::MAX);
    let r = getrandom::u64().unwrap_or(0);
    min + Duration::from_micros(if span == 0 { 0 } else { r % (span + 1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Errors in a row double `DLOCK_RETRY` up to the pause of a waiter that hears; a split
    /// between contenders starts doubling three errors later; with notifications off (every waiter polls at
    /// `DLOCK_RETRY`) nothing backs off; a `DLOCK_RETRY` above the cap is kept.
    #[test]
    fn errors_in_a_row_back_off_to_a_hearing_waiters_pause() {
        let settings = crate::config::Settings {
            retry: (ms(10), ms(50)),
            ..crate::config::Settings::default()
        };
        let named = |errors, contended| after_errors(&settings, WakeUp::Named, errors, contended);
        assert_eq!(named(1, false), (ms(10), ms(50)));
        assert_eq!(named(2, false), (ms(20), ms(100)));
        assert_eq!(named(4, false), (ms(80), ms(400)));
        assert_eq!(named(5, false), (ms(160), ms(500)));
        assert_eq!(named(6, false), NAMED_WATCH_PAUSE);
        assert_eq!(named(1000, false), NAMED_WATCH_PAUSE);
        // Splits: three more at `DLOCK_RETRY`, then the same doubling.
        for errors in 1..=4 {
            assert_eq!(named(errors, true), (ms(10), ms(50)), "{errors} splits");
        }
        assert_eq!(named(5, true), (ms(20), ms(100)));
        assert_eq!(named(1000, true), NAMED_WATCH_PAUSE);
        let off = crate::config::Settings {
            notify: false,
            ..settings.clone()
        };
        assert_eq!(
            after_errors(&off, WakeUp::Named, 9, false),
            (ms(10), ms(50))
        );
        let slow = crate::config::Settings {
            retry: (ms(800), ms(900)),
            ..settings
        };
        assert_eq!(
            after_errors(&slow, WakeUp::Named, 9, false),
            (ms(800), ms(900))
        );
    }
}
