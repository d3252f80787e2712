//! The session: one etcd lease per locker, granted on first use and kept alive on one
//! keep-alive stream while the locker lives, as etcd's `concurrency.Session` (and so `etcdctl
//! lock`) does. Every key the locker puts in a line lives on it, so a crashed or frozen process
//! leaves nothing for longer than the session's TTL, and an acquisition costs no lease of its own.
//!
//! The client counts the session on its own clock: each keep-alive answered (with the TTL
//! left) moves the session's end to the TTL after the keep-alive was sent, less the lease
//! clock's drift allowance. When that end passes with no answer (a partition, a frozen process),
//! or etcd says the lease is gone, the session is over on the client before etcd can have
//! expired it: every hold of it is lost, and the next acquisition opens a new session.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::{sync::watch, time::Instant};

use super::{
    AbortOnDrop,
    conn::{Conn, error},
};
use crate::{error::BackendError, lease::valid_until};

/// One session: its lease, which session of the locker it is, and whether it has ended.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) lease: i64,
    pub(super) epoch: u64,
    ended: Arc<watch::Sender<bool>>,
    _keeper: Arc<AbortOnDrop>,
}

impl Session {
    pub(super) fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Ends the session on the client: a request found its lease gone.
    pub(super) fn lapsed(&self) {
        self.ended.send_replace(true);
    }
}

/// A locker's sessions, one at a time.
pub(super) struct Sessions {
    conn: Arc<Conn>,
    /// The TTL asked of etcd, in whole seconds.
    ttl: i64,
    current: Mutex<Option<Session>>,
    /// How many sessions there have been (taken while one opens).
    opening: tokio::sync::Mutex<u64>,
    /// Told each session's number when it ends (its holds are lost then).
    on_end: Arc<dyn Fn(u64) + Send + Sync>,
}

impl Sessions {
    pub(super) fn new(
        conn: Arc<Conn>,
        ttl: Duration,
        on_end: Box<dyn Fn(u64) + Send + Sync>,
    ) -> Self {
        Self {
            conn,
            ttl: i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX),
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(0),
            on_end: Arc::from(on_end),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live session, if there is one (no I/O).
    pub(super) fn live(&self) -> Option<Session> {
        self.current().clone().filter(|s| !s.is_ended())
    }

    /// The live session, opened on first use and again after one ended (one lease grant).
    pub(super) async fn session(&self) -> Result<Session, BackendError> {
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let mut epochs = self.opening.lock().await;
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let ttl = self.ttl;
        let sent_at = Instant::now();
        let granted = self
            .conn
            .call("grant the session lease", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        *epochs += 1;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let ended = Arc::new(watch::Sender::new(false));
        let keeper = tokio::spawn(keep_alive(
            self.conn.clone(),
            granted.id(),
            ttl,
            valid_until(sent_at, ttl),
            ended.clone(),
        ));
        // However it ends (the keep-alives, a request that found the lease gone, closing),
        // or when the locker is gone.
        let (mut end, on_end, epoch) = (ended.subscribe(), self.on_end.clone(), *epochs);
        tokio::spawn(async move {
            let _ = end.wait_for(|ended| *ended).await;
            on_end(epoch);
        });
        let session = Session {
            lease: granted.id(),
            epoch: *epochs,
            ended,
            _keeper: Arc::new(AbortOnDrop(keeper)),
        };
        *self.current() = Some(session.clone());
        Ok(session)
    }

    /// Ends the live session and revokes its lease, which deletes every key still on it
    /// ([`Locker::close`](crate::Locker::close)).
    pub(super) async fn close(&self) -> Result<(), BackendError> {
        let Some(session) = self.current().take() else {
            return Ok(());
        };
        session.lapsed();
        if session.lease == 0 {
            return Ok(());
        }
        let lease = session.lease;
        match self
            .conn
            .call("revoke the session lease", |mut c| async move {
                c.lease_revoke(lease).await
            })
            .await
        {
            Err(e) if !super::conn::lease_gone(&e) => Err(e),
            _ => Ok(()),
        }
    }
}

/// Keeps `lease` alive at a third of its TTL until it is gone, or no keep-alive was answered
/// before the client's end of it (`valid`, moved on by each answer; watched while a keep-alive
/// waits too); then ends the session.
async fn keep_alive(
    conn: Arc<Conn>,
    lease: i64,
    ttl: Duration,
    mut valid: Instant,
    ended: Arc<watch::Sender<bool>>,
) {
    let period = ttl / 3;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut next = Instant::now() + period;
    loop {
        // The next keep-alive and its answer, raced as a whole against the client's end of the
        // session: a keep-alive waiting for its answer must not hold that end back (by up to the
        // request timeout), while etcd may have expired the lease and another client taken
        // the lock.
        let cycle = async {
            tokio::time::sleep_until(next).await;
            let sent_at = Instant::now();
            let answer =
                tokio::time::timeout(conn.request_timeout, once(&conn, lease, ttl, &mut stream));
            (sent_at, answer.await)
        };
        let (sent_at, answer) = tokio::select! {
            // The end first: a task that runs late and finds both past sends no keep-alive
            // after it (which could keep the dead session's keys, and its locks, for a TTL).
            biased;
            () = tokio::time::sleep_until(valid) => {
                tracing::warn!(lease_ttl = ?ttl, "etcd session: no keep-alive answered within its TTL: its holds are lost");
                break;
            }
            cycle = cycle => cycle,
        };
        match answer {
            Ok(Ok(Some(left))) => {
                valid = valid.max(valid_until(sent_at, left));
                next = sent_at + period;
            }
            Ok(Ok(None)) => {
                tracing::warn!(
                    "etcd session: its lease is gone (expired or revoked): its holds are lost"
                );
                break;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "etcd session: keep-alive failed; trying again");
                stream = None;
                next = Instant::now() + Duration::from_millis(200).min(period);
            }
            Err(_) => {
                stream = None;
                next = Instant::now();
            }
        }
    }
    ended.send_replace(true);
}

/// One keep-alive on the stream (opened first when there is none): the TTL etcd says is left,
/// `None` when the lease is gone.
async fn once(
    conn: &Conn,
    lease: i64,
    ttl: Duration,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<Option<Duration>, BackendError> {
    let what = "keep the session alive";
    let Some((keeper, answers)) = stream else {
        // Opening the stream sends the first keep-alive and reads its answer.
        let (mut client, _) = conn.client().await?;
        return match client.lease_keep_alive(lease).await {
            Ok(opened) => {
                *stream = Some(opened);
                // The opening keep-alive renewed it to its whole TTL.
                Ok(Some(ttl))
            }
            Err(etcd_client::Error::LeaseKeepAliveError(why)) if why.contains("not found") => {
                Ok(None)
            }
            Err(e) => Err(error(what, &e)),
        };
    };
    keeper.keep_alive().await.map_err(|e| error(what, &e))?;
    match answers.message().await.map_err(|e| error(what, &e))? {
        Some(answer) if answer.ttl() > 0 => Ok(Some(Duration::from_secs(
            u64::try_from(answer.ttl()).unwrap_or(0),
        ))),
        Some(_) => Ok(None),
        None => Err(BackendError::new(
            "etcd: the session's keep-alive stream ended",
        )),
    }
}
