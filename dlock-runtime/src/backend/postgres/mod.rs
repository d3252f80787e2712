//! The PostgreSQL backend: one row per held lock in the table `dlock_locks`, a lease by the
//! server's clock (`expires_at`, compared with `clock_timestamp()`), fences from the sequence
//! `dlock_fence`, release wake-ups by `LISTEN`/`NOTIFY`, and fair mode's line of waiters in the
//! table `dlock_waiters`.
//!
//! Every request is one statement in its own (implicit) transaction: nothing holds a row lock
//! across an await, so no statement ever waits on a holder, only (for microseconds) on another
//! statement touching the same row. Requests are pipelined on one shared connection (tokio-postgres
//! multiplexes concurrent requests), made again when the server closed it (a restart,
//! `pg_terminate_backend`), and each is bounded by the request timeout.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client, NoTls, Statement, config::SslMode, error::SqlState};

use super::{
    api::{
        Attempt, Backend, BoxFuture, Built, Capabilities, Hearing, Queued, Request, Token, WakeUp,
        Watch,
    },
    watchers::Watchers,
};

mod grant;
mod shared;
#[cfg(feature = "tls")]
mod tls;
use crate::{
    LockError, LockInfo, LockKind,
    config::Settings,
    error::BackendError,
    holder::{self, Identity},
    url::EngineUrl,
};

/// PostgreSQL: `postgres://`, `postgresql://` (libpq's URL form).
pub(super) const BUILT: Built = Built {
    check: check_url,
    build: |url, settings| Ok(Arc::new(PostgresBackend::from_url(url, settings)?)),
    options: &[],
};

/// The table and the sequence, as `docs/postgres.md` gives them to operators who create them
/// themselves; run on first use when the table is missing.
pub(crate) const SCHEMA: &str = "\
CREATE SEQUENCE IF NOT EXISTS dlock_fence;
CREATE TABLE IF NOT EXISTS dlock_locks (
    key        text        PRIMARY KEY,
    token      text        NOT NULL,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    contended  boolean     NOT NULL DEFAULT false,
    owner      text,
    acquired_at timestamptz
);
ALTER TABLE dlock_locks ADD COLUMN IF NOT EXISTS owner text,
                        ADD COLUMN IF NOT EXISTS acquired_at timestamptz;
CREATE TABLE IF NOT EXISTS dlock_waiters (
    key        text        NOT NULL,
    token      text        NOT NULL,
    place      bigint      NOT NULL,
    gone_at    timestamptz NOT NULL,
    claim      text,
    claim_ms   bigint,
    PRIMARY KEY (key, token)
);
ALTER TABLE dlock_waiters ADD COLUMN IF NOT EXISTS claim text,
                          ADD COLUMN IF NOT EXISTS claim_ms bigint;";

/// The function [`RELEASE`] calls when the hold it ends was marked `contended`, as
/// `docs/postgres.md` gives it (made with [`SCHEMA`], or on its own for tables made before dlock
/// had it): it announces the release, naming the live place first in the key's queue.
///
/// When that place has a claim (a fair waiter's token and lease, written by its refused
/// attempt: see [`ACQUIRE_QUEUED`]) and the key's turn is free, the release grants it the key
/// at once: a hold for the claim's token with the next fence, for the claim's lease but no
/// longer than the place lives (so a head whose process died holds the key no longer than its
/// place would have held the line), announced as `+<place><claim><fence>:<key>` (a `+` first,
/// which no other payload starts with; `<claim>` the last 8 hex digits of the claim's token,
/// so that the process gives the grant to that waiter alone). The waiter takes it up without
/// a statement of its own (see [`ADOPT`]). The turn is only tried: an attempt that
/// holds it waits for this release's row, so the release does not wait for the turn (a
/// deadlock); it then grants nothing.
///
/// Otherwise, when a place waits, it leaves the key's row behind as a tombstone (token
/// `000…0`, not live: the next acquisition takes it over) so that the mark outlives the hold.
/// The hold after it is then marked too, whoever takes it, and its release wakes the line in
/// turn: a waiter asleep until a release names it makes no attempt that could mark that hold
/// itself. When no live place waits, the row goes, and with it the mark.
const WAKE_LINE: &str = "\
CREATE OR REPLACE FUNCTION dlock_wake_line(p_key text, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    woke boolean;
BEGIN
    WITH head AS MATERIALIZED (
        SELECT left(w.token, 8) AS next, w.token, w.claim, w.claim_ms, w.gone_at
          FROM dlock_waiters w
         WHERE w.key = p_key AND w.gone_at > clock_timestamp() ORDER BY w.place LIMIT 1
    ), decided AS MATERIALIZED (
        SELECT h.token, h.claim, h.claim_ms, h.gone_at,
               CASE WHEN h.claim IS NOT NULL AND h.claim_ms > 0
                    THEN pg_try_advisory_xact_lock(1684824939, hashtext(p_key))
                    ELSE false END AS grants
          FROM head h
    ), kept AS (
        INSERT INTO dlock_locks (key, token, fence, expires_at, contended)
        SELECT p_key,
               CASE WHEN d.grants THEN d.claim ELSE '00000000000000000000000000000000' END,
               CASE WHEN d.grants THEN nextval('dlock_fence') ELSE p_fence END,
               CASE WHEN d.grants
                    THEN least(clock_timestamp() + d.claim_ms * interval '1 millisecond',
                               d.gone_at)
                    ELSE to_timestamp(0) END,
               NOT d.grants OR EXISTS (SELECT 1 FROM dlock_waiters w
                                        WHERE w.key = p_key AND w.token <> d.token
                                          AND w.gone_at > clock_timestamp())
          FROM decided d
        ON CONFLICT (key) DO NOTHING
        RETURNING CASE WHEN token <> '00000000000000000000000000000000'
                       THEN right(token, 8) || fence END AS granted
    )
    SELECT true INTO woke
      FROM pg_notify(coalesce('dlock_wake_' || (SELECT next FROM head), 'dlock_release'),
               coalesce('+' || (SELECT next FROM head) || (SELECT granted FROM kept) || ':',
                        (SELECT next FROM head), '--------') ||
               CASE WHEN octet_length(p_key) < 7900 THEN p_key ELSE '' END);
    RETURN woke;
END $$;";

/// [`WAKE_LINE`] for a `dlock_waiters` without the claim's columns (made by an owner before
/// dlock had them, for a user who may not add them): dlock's function before it had grants. It
/// names the place first in line and leaves the tombstone, as [`WAKE_LINE`] does when it
/// grants nothing.
const WAKE_LINE_UNCLAIMED: &str = "\
CREATE OR REPLACE FUNCTION dlock_wake_line(p_key text, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    woke boolean;
BEGIN
    WITH next AS (
        SELECT left(w.token, 8) AS next FROM dlock_waiters w
         WHERE w.key = p_key AND w.gone_at > clock_timestamp() ORDER BY w.place LIMIT 1
    ), kept AS (
        INSERT INTO dlock_locks (key, token, fence, expires_at, contended)
        SELECT p_key, '00000000000000000000000000000000', p_fence, to_timestamp(0), true
          FROM next
        ON CONFLICT (key) DO NOTHING
    )
    SELECT true INTO woke
      FROM pg_notify(coalesce('dlock_wake_' || (SELECT next FROM next), 'dlock_release'),
               coalesce((SELECT next FROM next), '--------') ||
               CASE WHEN octet_length(p_key) < 7900 THEN p_key ELSE '' END);
    RETURN woke;
END $$;";

/// The channel a contended release is announced on when no place waits in the key's queue (and
/// a semaphore's or read/write lock's release always); the payload is the first 8 hex digits of
/// the place first in the key's queue (never a whole token), or `--------`, then the lock key,
/// which is left out for a key too long for a payload (then every waiter looks).
const CHANNEL: &str = "dlock_release";

/// A release that names a place is announced on that place's channel, this and the place's
/// first 8 hex digits (which a locker's places share): only the process of that place listens
/// there, so the others' connections are not sent it. The payload is as on [`CHANNEL`].
const WAKE_CHANNEL: &str = "dlock_wake_";

/// An arbitrary constant for `pg_advisory_xact_lock`: lockers creating the schema at the same
/// moment take turns (concurrent `CREATE TABLE IF NOT EXISTS` can fail on the catalog's unique
/// index).
const SCHEMA_LOCK: i64 = 0x646c_6f63_6b00;

/// The first key of the advisory locks that an acquisition of a key takes for its
/// transaction (the second is the key's `hashtext`), so that its fence is drawn after every
/// acquisition of that key before it committed: `nextval` in the row to insert runs before
/// PostgreSQL looks for a conflicting row, and without the turn, another client's whole hold
/// (insert, fence, release) could fit between an acquisition's `nextval` and its insert, which
/// then began later with the lower fence. 'dlck'; the two-key advisory locks are apart from
/// the one-key ones ([`SCHEMA_LOCK`], a user's). Written out in the statements and in
/// `dlock_acquire_shared` (the setup's probe looks for it there, a test in the statements).
const FENCE_TURN: &str = "1684824939";

/// Insert the row, or take over one whose lease ran out by the server's clock (a tombstone
/// among them), or that this token holds already (a retry after a lost reply gets a new fence);
/// the next fence in the same statement, drawn in the key's turn (`FENCE_TURN`). The
/// `contended` mark of a row taken over stays (a tombstone's is what tells this hold's release
/// to wake the line). No row when the key is held: then [`REFUSED`] follows. One upsert, as a
/// lease row written by hand is, and the turn.
const ACQUIRE: &str = "\
WITH turn AS MATERIALIZED (SELECT pg_advisory_xact_lock(1684824939, hashtext($1)))
INSERT INTO dlock_locks AS l (key, token, fence, expires_at, contended, owner, acquired_at)
SELECT $1, $2, nextval('dlock_fence'),
       clock_timestamp() + $3::bigint * interval '1 millisecond', false, $4, clock_timestamp()
  FROM turn
ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at,
        owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at
    WHERE l.expires_at <= clock_timestamp() OR l.token = EXCLUDED.token
RETURNING fence";

/// The token of a key's row that no hold has (a tombstone): left by a release that woke a line
/// (see [`WAKE_LINE`]), or by a refusal that came to mark the key's row and found none left (see
/// [`ACQUIRE_QUEUED`]; fence 0), with a lease that ended in 1970. 32 hex digits, as a mutex holder's
/// token (a random token is never all zeros), so that everything that reads the row takes it
/// for a lapsed mutex hold. Written out in the statements; here for the test that checks them.
#[cfg(test)]
const TOMBSTONE: &str = "00000000000000000000000000000000";

/// After a refused [`ACQUIRE`]: marks the row `contended` (written once per hold, by the first
/// refused attempt), so that its release announces itself (a release nobody waits for sends no
/// notification: `NOTIFY` takes a lock that serialises the commits of every notifying
/// transaction), and returns the holder's remaining lease in ms (no row when it is gone), and
/// its token: a semaphore's or read/write lock's row names its kind there instead.
const REFUSED: &str = "\
WITH marked AS (
    UPDATE dlock_locks SET contended = true WHERE key = $1 AND NOT contended
)
SELECT greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint,
       token
  FROM dlock_locks WHERE key = $1";

/// Delete the row if this token holds it (a lapsed row of ours is cleaned up too, but reported
/// as not held), and when a refused attempt marked it `contended` meanwhile, or the hold before
/// it was (the mark carries over, see [`WAKE_LINE`]), announce the release and keep the mark for
/// the next hold while a place waits. An unmarked release touches nothing but the row: no
/// subquery on the queue, whose opening and probing cost a cycle 7% (W1) to 11% (W2).
const RELEASE: &str = "\
DELETE FROM dlock_locks AS l WHERE l.key = $1 AND l.token = $2
RETURNING l.expires_at > clock_timestamp() AS live,
    CASE WHEN l.contended THEN dlock_wake_line(l.key, l.fence) END";

/// [`RELEASE`] where the function [`WAKE_LINE`] is missing and this user may not make it
/// (tables made by an owner before dlock had it): the same announcement, decided by a look at
/// the key's queue in every release.
const RELEASE_LOOKING: &str = "\
DELETE FROM dlock_locks AS l WHERE l.key = $1 AND l.token = $2
RETURNING l.expires_at > clock_timestamp() AS live,
    (SELECT CASE WHEN l.contended OR n.next IS NOT NULL THEN
                pg_notify(coalesce('dlock_wake_' || n.next, 'dlock_release'),
                    coalesce(n.next, '--------') ||
                    CASE WHEN octet_length(l.key) < 7900 THEN l.key ELSE '' END)
            END
       FROM (SELECT (SELECT left(w.token, 8) FROM dlock_waiters w
                      WHERE w.key = l.key AND w.gone_at > clock_timestamp()
                      ORDER BY w.place LIMIT 1) AS next) n)";

/// What the first 8 characters of a payload are when a release names no fair waiter; otherwise
/// they are the first 8 hex digits of the token first in line (never a whole token).
const NO_ONE: &str = "--------";

/// An attempt from a place in the key's queue (`dlock_waiters`: one place per waiting process
/// and key, ordered by `place`, a number from the fence sequence). `$4`: how long a place lives
/// without another attempt (ms); `$5` the place; `$6` on success keep the place, moved to the
/// back of the queue (more waiters of this process wait behind); `$7` strict (fair mode): take
/// the lock only when no live place is ahead of this one, else whenever it is free; `$9` join
/// the queue or refresh the place when refused (false: the place is there, refreshed lately,
/// and a refusal writes no row of `dlock_waiters`); `$10` fair mode's claim, the lease in ms a
/// release may grant this waiter (NULL: none).
///
/// A refusal that writes the place writes the claim with it: this token and `$10`, which the
/// release that finds the place first in line grants the key to (see [`WAKE_LINE`]); a place
/// taken or refreshed without a claim has none. A place's attempt takes over a hold granted to
/// its claim: the claim's waiter left before taking it up, and the next waiter of that process
/// asks.
///
/// Taken: the place leaves the queue (or moves to its back), lapsed places are dropped, and the
/// hold is marked `contended` when another live place waits (or a tombstone's mark carries
/// over). Refused: the place joins the queue or is refreshed (with `$9`), and the key's row is
/// marked `contended` (written once per hold), which is what makes its release, whoever makes
/// it, wake the next (see [`RELEASE`]). The mark is an upsert, so it reaches the key's row as it
/// is now, not as this statement's snapshot saw it: a hold taken meanwhile by a taker that did
/// not see this place yet is marked all the same, and where no row is left (the hold ended
/// meanwhile, its release looking at the queue before the place was in it) the mark is a
/// tombstone, which the next holder takes over with the mark. A refusal that finds the key
/// free by now (the mark inserted its row, or marked a lapsed one), or the row it saw unmarked
/// changed, answers that the holder has 0ms left: the waiter asks again at once (once: the
/// next refusal finds the row marked) instead of sleeping through a release that announced
/// nothing. A lapsed hold refuses only a strict waiter with a place ahead (a waiter that may
/// take it does): that answer is no holder, so the waiter sleeps its pause while the place
/// ahead takes the key or lapses, rather than asking every millisecond. (With the snapshot's mark alone, a strict
/// waiter refused for a place ahead while that place's hold was being taken, and a waiter
/// refused while one hold ended and the next began, each slept until its poll: 7% of fair
/// hand-offs between two lockers waited 10-50ms.) The holder's remaining lease
/// and token are read from a live hold's row only: a tombstone is no holder.
const ACQUIRE_QUEUED: &str = "\
WITH mine AS (
    SELECT place, claim FROM dlock_waiters WHERE key = $1 AND token = $5
), ahead AS (
    SELECT $7::boolean AND EXISTS (
        SELECT 1 FROM dlock_waiters
         WHERE key = $1 AND token <> $5 AND gone_at > clock_timestamp()
           AND place < coalesce((SELECT place FROM mine), 9223372036854775807)
    ) AND NOT EXISTS (
        SELECT 1 FROM dlock_locks WHERE key = $1 AND token = $2
    ) AS yes
), turn AS MATERIALIZED (
    -- The key's turn for its fence (see FENCE_TURN), when this attempt may take the key.
    SELECT pg_advisory_xact_lock(1684824939, hashtext($1)) WHERE NOT (SELECT yes FROM ahead)
), taken AS (
    INSERT INTO dlock_locks AS l (key, token, fence, expires_at, contended, owner, acquired_at)
    SELECT $1, $2, nextval('dlock_fence'),
           clock_timestamp() + $3::bigint * interval '1 millisecond',
           $6::boolean OR EXISTS (SELECT 1 FROM dlock_waiters
                                   WHERE key = $1 AND token <> $5 AND gone_at > clock_timestamp()),
           $8, clock_timestamp()
      FROM turn
    ON CONFLICT (key) DO UPDATE
        SET token = EXCLUDED.token, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at,
            contended = EXCLUDED.contended OR l.contended,
            owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at
        WHERE l.expires_at <= clock_timestamp() OR l.token = EXCLUDED.token
              OR CASE WHEN $7::boolean THEN l.token = (SELECT claim FROM mine) END
    RETURNING fence
), left_line AS (
    DELETE FROM dlock_waiters
     WHERE key = $1 AND EXISTS (SELECT 1 FROM taken)
       AND ((token = $5 AND NOT $6::boolean)
            OR (token <> $5 AND gone_at <= clock_timestamp()))
), placed AS (
    INSERT INTO dlock_waiters AS w (key, token, place, gone_at, claim, claim_ms)
    SELECT $1, $5, nextval('dlock_fence'),
           clock_timestamp() + $4::bigint * interval '1 millisecond',
           CASE WHEN NOT EXISTS (SELECT 1 FROM taken) AND $10::bigint > 0 THEN $2 END, $10::bigint
     WHERE CASE WHEN EXISTS (SELECT 1 FROM taken) THEN $6::boolean ELSE $9::boolean END
    ON CONFLICT (key, token) DO UPDATE
        SET gone_at = EXCLUDED.gone_at,
            place = CASE WHEN EXISTS (SELECT 1 FROM taken) THEN EXCLUDED.place ELSE w.place END,
            claim = EXCLUDED.claim, claim_ms = EXCLUDED.claim_ms
), marked AS (
    -- Only when `taken` returned nothing: a row this statement inserted or updated there is
    -- one it may not touch again.
    INSERT INTO dlock_locks AS l (key, token, fence, expires_at, contended)
    SELECT $1, '00000000000000000000000000000000', 0, to_timestamp(0), true
     WHERE NOT EXISTS (SELECT 1 FROM taken)
    ON CONFLICT (key) DO UPDATE SET contended = true WHERE NOT l.contended
    RETURNING l.xmax = 0 OR l.expires_at <= clock_timestamp() AS free
), held AS (
    SELECT greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
               AS ttl_ms,
           token, contended
      FROM dlock_locks WHERE key = $1 AND token <> '00000000000000000000000000000000'
)
SELECT t.fence,
       CASE WHEN t.fence IS NULL THEN
           CASE WHEN EXISTS (SELECT 1 FROM marked WHERE free) THEN 0
                WHEN h.token IS NULL OR h.ttl_ms = 0 THEN NULL
                WHEN h.contended OR EXISTS (SELECT 1 FROM marked) THEN h.ttl_ms
                ELSE 0 END
       END,
       CASE WHEN t.fence IS NULL THEN h.token END
  FROM (SELECT (SELECT fence FROM taken) AS fence) t LEFT JOIN held h ON true";

/// What `Locker::inspect` reads of a live lock: holder, since, fence, remaining ms, live places
/// in its queue (processes waiting).
const INSPECT: &str = "\
SELECT owner, acquired_at, fence,
       greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint,
       (SELECT count(*) FROM dlock_waiters w WHERE w.key = $1 AND w.gone_at > clock_timestamp()),
       token
  FROM dlock_locks WHERE key = $1 AND expires_at > clock_timestamp()";

/// The stored keys of the live locks under a stored prefix.
const LIST: &str = "\
SELECT key FROM dlock_locks WHERE starts_with(key, $1) AND expires_at > clock_timestamp()";

/// A forced release: the row goes whoever holds it (a tombstone too), and the release is
/// announced always (a forced release is rare), naming the live place first in line. It leaves
/// no tombstone: the waiter it wakes either takes the key or is refused by whoever did, which
/// marks that hold. `live` says whether it held anything.
const FORCE: &str = "\
DELETE FROM dlock_locks AS l WHERE l.key = $1
RETURNING l.expires_at > clock_timestamp() AS live, l.owner, l.acquired_at, l.fence,
    greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint,
    (SELECT pg_notify(coalesce('dlock_wake_' || n.next, 'dlock_release'),
                coalesce(n.next, '--------') ||
                    CASE WHEN octet_length(l.key) < 7900 THEN l.key ELSE '' END)
       FROM (SELECT (SELECT left(w.token, 8) FROM dlock_waiters w
                      WHERE w.key = l.key AND w.gone_at > clock_timestamp()
                      ORDER BY w.place LIMIT 1) AS next) n)";

/// A place leaves the key's queue (its process has no more waiters), announced, naming the
/// place then first in line, when it was there; the last live place to leave takes the key's
/// tombstone with it. A hold a release granted to the place's claim, which its waiter never
/// took up (it left meanwhile), goes with the place: a tombstone when another place waits (the
/// mark carries over), no row otherwise.
const LEAVE: &str = "\
WITH left_line AS (
    DELETE FROM dlock_waiters WHERE key = $1 AND token = $2 RETURNING place, claim
), next AS (
    SELECT left(token, 8) AS next FROM dlock_waiters
     WHERE key = $1 AND token <> $2 AND gone_at > clock_timestamp()
     ORDER BY place LIMIT 1
), handed_on AS (
    UPDATE dlock_locks
       SET token = '00000000000000000000000000000000', expires_at = to_timestamp(0),
           contended = true
     WHERE key = $1 AND token = (SELECT claim FROM left_line)
       AND EXISTS (SELECT 1 FROM next)
), swept AS (
    DELETE FROM dlock_locks
     WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM next)
       AND (token = '00000000000000000000000000000000'
            OR token = (SELECT claim FROM left_line))
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM left_line) THEN
           pg_notify(coalesce('dlock_wake_' || (SELECT next FROM next), 'dlock_release'),
               coalesce((SELECT next FROM next), '--------') ||
               CASE WHEN octet_length($1::text) < 7900 THEN $1::text ELSE '' END)
       END";

/// A fair waiter takes up the hold a release granted its claim (see [`WAKE_LINE`]), sent in the
/// background once the waiter has it: the hold's lease becomes the one asked for (`$3` ms) if
/// the grant has not run out, its holder is recorded (`$7`), and the place is kept (`$5`, moved
/// to the back of the queue with a fresh deadline of `$6` ms, its claim gone) or leaves, as a
/// taking attempt from the place would have done; lapsed places are dropped. `true` when the
/// hold was there to take up; otherwise the place is left as it is (a place that was to leave
/// then leaves by [`LEAVE`], which wakes the place after it).
const ADOPT: &str = "\
WITH held AS (
    UPDATE dlock_locks
       SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond',
           contended = contended OR $5::boolean, owner = $7, acquired_at = clock_timestamp()
     WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()
    RETURNING 1
), moved AS (
    UPDATE dlock_waiters
       SET place = nextval('dlock_fence'), claim = NULL,
           gone_at = clock_timestamp() + $6::bigint * interval '1 millisecond'
     WHERE key = $1 AND token = $4 AND $5::boolean AND EXISTS (SELECT 1 FROM held)
), left_line AS (
    DELETE FROM dlock_waiters
     WHERE key = $1 AND ((token = $4 AND NOT $5::boolean AND EXISTS (SELECT 1 FROM held))
                         OR (token <> $4 AND gone_at <= clock_timestamp()))
)
SELECT EXISTS (SELECT 1 FROM held)";

/// What [`ACQUIRE_QUEUED`] and [`LEAVE`] become on a `dlock_waiters` without the claim's
/// columns (made by an owner before dlock had them, for a user who may not add them): no claim
/// is written or read, and releases grant nothing.
const UNCLAIMED: [(&str, &str); 5] = [
    ("place, claim FROM", "place, NULL::text AS claim FROM"),
    (
        "RETURNING place, claim",
        "RETURNING place, NULL::text AS claim",
    ),
    ("gone_at, claim, claim_ms)", "gone_at)"),
    (
        ",\n           CASE WHEN NOT EXISTS (SELECT 1 FROM taken) AND $10::bigint > 0 THEN $2 END, $10::bigint",
        "",
    ),
    (
        ",\n            claim = EXCLUDED.claim, claim_ms = EXCLUDED.claim_ms",
        "",
    ),
];

/// `statement` for a `dlock_waiters` without the claim's columns (see [`UNCLAIMED`]).
fn unclaimed(statement: &str) -> String {
    UNCLAIMED
        .iter()
        .fold(statement.to_owned(), |s, (with, without)| {
            s.replace(with, without)
        })
}

/// Reset the lease only while this token holds it and it has not run out.
const EXTEND: &str = "\
UPDATE dlock_locks SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
 WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()";

/// In the setup's `DO` block: the connection's statements use generic plans
/// (`plan_cache_mode`; dlock's statements need PostgreSQL 12 anyway, for `AS MATERIALIZED`).
/// The prepared statements (and those inside dlock's functions) are then planned once per
/// connection; those prepared at each call (an operator's inspect, list and forced release) are
/// planned at each call either way. Every statement finds its rows by key (the primary keys),
/// so the generic plan is the plan, but for [`LIST`]: with a C collation a custom plan could
/// range over the index for its prefix, a generic one scans the table's rows (the locks held
/// now). Left to choose, the server kept custom plans for `ACQUIRE_QUEUED` (a waiter's attempt;
/// they fold its flags away) and planned it at every call: 0.6ms of planning against 0.3ms of
/// running (`pg_stat_statements` with `track_planning`, 8 lockers on one key), the server's
/// time per critical section 1.3-1.7 times what it is with generic plans in that scratch
/// program, 1.06-1.22 times in the benchmark's W3.
const PLAN_ONCE: &str = "PERFORM set_config('plan_cache_mode', 'force_generic_plan', false);";

/// The longest key accepted: a btree index entry holds at most 2704 bytes.
const MAX_KEY_BYTES: usize = 2600;

/// Checks an engine URL as the driver reads it; no password in any error.
fn check_url(var: &str, url: &str) -> Result<(), LockError> {
    let config = parse(var, url)?;
    if config.get_hosts().is_empty() {
        // libpq falls back to a local socket; say where instead of guessing.
        return Err(LockError::config(format!(
            "{var}: the PostgreSQL URL names no host; expected `postgres://user@host[:port]/dbname` \
             (a Unix socket: `postgres://user@%2Fvar%2Frun%2Fpostgresql/dbname` or `?host=/dir`)"
        )));
    }
    if config.get_ssl_mode() == SslMode::Require && !cfg!(feature = "tls") {
        return Err(LockError::config(format!(
            "{var}: `sslmode=require` (TLS) needs dlock-runtime's `tls` feature; enable it, or use \
             `sslmode=disable` or `prefer` (plain connections)"
        )));
    }
    Ok(())
}

fn parse(var: &str, url: &str) -> Result<tokio_postgres::Config, LockError> {
    let form = "postgres://[user[:password]@]host[:port][/dbname][?param=value&…]";
    url.parse::<tokio_postgres::Config>().map_err(|e| {
        // The driver names options, never their values; kept only if it says nothing of the URL.
        let why = e.to_string();
        let password = url
            .split_once("://")
            .and_then(|(_, rest)| rest.rsplit_once('@'))
            .and_then(|(userinfo, _)| userinfo.split_once(':'))
            .map(|(_, password)| password)
            .filter(|p| !p.is_empty());
        let why = match password {
            Some(p) if why.contains(p) => String::new(),
            _ if why.contains("password") => String::new(),
            _ => format!(" ({why})"),
        };
        LockError::config(format!(
            "{var}: not a PostgreSQL URL{why}; expected `{form}`"
        ))
    })
}

/// The prepared statements of one connection.
struct Statements {
    acquire: Statement,
    refused: Statement,
    acquire_queued: Statement,
    release: Statement,
    leave: Statement,
    extend: Statement,
    /// [`ADOPT`], when `dlock_waiters` has the claim's columns (else fair waiters write no
    /// claim, and no release grants one).
    adopt: Option<Statement>,
}

/// The shared connection and the task that drives it.
struct Connection {
    client: Client,
    statements: Statements,
    /// The shared kinds' statements, when their table and functions exist.
    shared: Option<shared::Statements>,
    driver: tokio::task::JoinHandle<()>,
}

impl Connection {
    fn alive(&self) -> bool {
        !self.client.is_closed() && !self.driver.is_finished()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

pub(crate) struct PostgresBackend {
    config: tokio_postgres::Config,
    request_timeout: Duration,
    /// The shared connection (also where a grant handed back is released).
    connection: Arc<Mutex<Option<Arc<Connection>>>>,
    /// One connection attempt at a time; the others wait for it and share it.
    connecting: tokio::sync::Mutex<()>,
    /// Release notifications; `None` when turned off (`DLOCK_NOTIFY=off`).
    notifier: Option<Notifier>,
    /// The length of the key prefix, which [`stored_key`] leaves as it is.
    prefix_len: usize,
    /// Who this locker is: each row's `owner` (the time is `acquired_at`, the server's).
    identity: Identity,
    /// Fair mode's claims and the grants heard for them (shared with the listening task).
    claims: Arc<grant::Claims>,
}

/// The full lock key `key` (its first `prefix_len` bytes the prefix) as the table stores it: the
/// prefix as is, then the key with NUL, which a `text` value cannot hold, written `%00`, and
/// `%` written `%25` so that no two keys share a row. A key with neither is stored as it is.
fn stored_key(prefix_len: usize, key: &str) -> std::borrow::Cow<'_, str> {
    let split = if key.is_char_boundary(prefix_len) {
        prefix_len
    } else {
        0
    };
    let (prefix, name) = key.split_at(split.min(key.len()));
    // Both are ASCII, so a byte is one of them only where the character is: a byte scan, not
    // a character pattern's decoding, and without an early exit, so that it runs over many
    // bytes at once (the key is short, and seldom has either; a few hundred instructions a
    // cycle, counted).
    if !name
        .bytes()
        .fold(false, |found, b| found | (b == b'%') | (b == 0))
    {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut stored = String::with_capacity(key.len() + 8);
    stored.push_str(prefix);
    for c in name.chars() {
        match c {
            '%' => stored.push_str("%25"),
            '\0' => stored.push_str("%00"),
            c => stored.push(c),
        }
    }
    std::borrow::Cow::Owned(stored)
}

impl PostgresBackend {
    /// What `op` (inspect, or a forced release) of the row of the full key `key` tells, named
    /// by the full key.
    async fn lock_info(
        &self,
        key: &str,
        op: fn(&str) -> Op<'_>,
    ) -> Result<Option<LockInfo>, BackendError> {
        let stored = stored_key(self.prefix_len, key);
        let op = op(&stored);
        match self.call(op).await? {
            Reply::Info(info) => Ok(info.map(|mut info| {
                key.clone_into(&mut info.key);
                info
            })),
            _ => Err(BackendError::new(format!(
                "PostgreSQL {}: unexpected reply",
                op.name()
            ))),
        }
    }
}

/// The full key a stored key (see [`stored_key`]) stands for.
fn unstored_key(prefix_len: usize, stored: &str) -> String {
    let split = if stored.is_char_boundary(prefix_len) {
        prefix_len
    } else {
        0
    };
    let (prefix, name) = stored.split_at(split.min(stored.len()));
    if !name.contains('%') {
        return stored.to_owned();
    }
    let mut key = String::with_capacity(stored.len());
    key.push_str(prefix);
    let mut rest = name;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("%25") => key.push('%'),
            Some("%00") => key.push('\0'),
            _ => {
                key.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        }
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    key
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("connected", &self.live_connection().is_some())
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// The connection in `slot` while it is alive.
fn live(slot: &Mutex<Option<Arc<Connection>>>) -> Option<Arc<Connection>> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .filter(|c| c.alive())
        .cloned()
}

/// Releases in the background, on the locker's connection when it is alive, the hold a release
/// granted to the claim `token` of a place that left meanwhile: the release wakes (or grants
/// to) the place then first in line. Without a connection the grant lapses by its lease.
fn hand_back(slot: &std::sync::Weak<Mutex<Option<Arc<Connection>>>>, key: String, token: String) {
    let Some(connection) = slot.upgrade().as_deref().and_then(live) else {
        return;
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    tokio::spawn(async move {
        let released = connection
            .client
            .query_opt(&connection.statements.release, &[&key, &token])
            .await;
        if let Err(e) = released {
            tracing::debug!(key = %key, error = %classify("release", e), "a grant could not be handed back; it lapses");
        }
    });
}

/// A reply of one of the statements.
enum Reply {
    Acquire {
        fence: Option<i64>,
        ttl_ms: Option<i64>,
    },
    /// The key is held as another kind of lock.
    Conflict(String),
    /// The shared kinds' table and functions are not there (tables made before dlock had
    /// them): made by the caller, who sends the request again.
    SharedMissing,
    Done(bool),
    /// A release found no hold (or place) of its token.
    NoRow,
    /// What a lock row tells (inspect, force).
    Info(Option<LockInfo>),
    Keys(Vec<String>),
}

#[derive(Clone, Copy)]
enum Op<'a> {
    /// Key, token, lease in ms, the place in the key's queue, the holder's record, and fair
    /// mode's claim (the lease in ms a release may grant this waiter: see [`ACQUIRE_QUEUED`]).
    Acquire(
        &'a str,
        &'a Token,
        i64,
        Option<Queued<'a>>,
        &'a str,
        Option<i64>,
    ),
    /// Key, token (a hold's, or a place's), and whether it may be a place in the queue.
    Release(&'a str, &'a Token),
    Leave(&'a str, &'a Token),
    Extend(&'a str, &'a Token, i64),
    /// A permit, a read or a write hold.
    AcquireShared(shared::Ask<'a>),
    ReleaseShared(&'a str, &'a Token),
    ExtendShared(&'a str, &'a Token, i64),
    Inspect(&'a str),
    List(&'a str),
    Force(&'a str),
    Ping,
}

impl Op<'_> {
    fn name(self) -> &'static str {
        match self {
            Self::Acquire(..) => "acquire",
            Self::Release(..) => "release",
            Self::Leave(..) => "leave the queue",
            Self::Extend(..) | Self::ExtendShared(..) => "extend",
            Self::AcquireShared(..) => "acquire",
            Self::ReleaseShared(..) => "release",
            Self::Inspect(..) => "inspect",
            Self::List(..) => "list",
            Self::Force(..) => "force release",
            Self::Ping => "ping",
        }
    }
}

impl PostgresBackend {
    /// The backend of a `postgres://` URL; makes no connection.
    pub(crate) fn from_url(url: &EngineUrl, settings: &Settings) -> Result<Self, LockError> {
        if settings.key_prefix.contains('\0') {
            return Err(LockError::config(
                "DLOCK_KEY_PREFIX: on PostgreSQL the prefix cannot hold a NUL byte (a `text` \
                 value cannot)",
            ));
        }
        let mut config = parse("DLOCK_URL", url.as_str())?;
        config.connect_timeout(settings.request_timeout);
        if config.get_tcp_user_timeout().is_none() {
            // A request left unacknowledged this long (a dead peer, a cut network) closes the
            // connection, so the next request makes a new one instead of waiting on TCP's
            // retransmissions for minutes. A frozen server still acknowledges: its requests
            // time out one by one and are answered once it runs again.
            config.tcp_user_timeout((settings.request_timeout * 4).max(Duration::from_secs(5)));
        }
        if config.get_application_name().is_none() {
            config.application_name("dlock");
        }
        let connection: Arc<Mutex<Option<Arc<Connection>>>> = Arc::default();
        let claims = Arc::new(grant::Claims::new({
            let connection = Arc::downgrade(&connection);
            move |key, token| hand_back(&connection, key, token)
        }));
        let notifier = settings
            .notify
            .then(|| Notifier::new(config.clone(), settings.request_timeout, claims.clone()));
        Ok(Self {
            config,
            request_timeout: settings.request_timeout,
            connection,
            connecting: tokio::sync::Mutex::new(()),
            notifier,
            prefix_len: settings.key_prefix.len(),
            identity: settings.identity.clone(),
            claims,
        })
    }

    fn live_connection(&self) -> Option<Arc<Connection>> {
        live(&self.connection)
    }

    /// The shared connection, made on first use and again after the server closed it (or the
    /// runtime it was made on shut down).
    async fn connection(&self) -> Result<Arc<Connection>, BackendError> {
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        // Boxed: opening a connection (connecting, checking the schema, preparing every
        // statement) is a future of over 6 KiB, which inline would size every request's future,
        // moved and allocated at each request.
        Box::pin(self.open_connection()).await
    }

    /// A new connection, set up, once no live one is left (one opening at a time).
    async fn open_connection(&self) -> Result<Arc<Connection>, BackendError> {
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        let (client, driver) = connect(&self.config, None).await?;
        let statements = setup(&client, self.request_timeout).await;
        let (statements, shared) = match statements {
            Ok(statements) => statements,
            Err(e) => {
                driver.abort();
                return Err(e);
            }
        };
        let connection = Arc::new(Connection {
            client,
            statements,
            shared,
            driver,
        });
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(connection.clone());
        Ok(connection)
    }

    fn forget(&self, connection: &Arc<Connection>) {
        let mut slot = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            *slot = None;
        }
    }

    /// Takes up the grant heard for this waiter's claim on `key`, if any (see [`WAKE_LINE`]):
    /// the key is the waiter's now, with the grant's fence. The take-up ([`ADOPT`]: the lease
    /// asked for, the holder's record, the place kept or left as `queue` says) is sent in the
    /// background; requests on the key wait for its answer, and the hold's loss is signalled
    /// if it does not take the hold up before the grant's lease runs out on the client's clock
    /// (counted from the claim's sending). `None`: no grant to take up (then the waiter's
    /// attempt takes over a hold granted to its place, with a new fence).
    async fn take_up(
        &self,
        key: &str,
        request: &Request<'_>,
        queue: Queued<'_>,
    ) -> Option<Attempt> {
        // The take-up has a request timeout to answer in, at least.
        let granted = self
            .claims
            .granted_to(key, request.token.as_str(), self.request_timeout)?;
        let connection = self.live_connection()?;
        let adopt = connection.statements.adopt.clone()?;
        let gate = self.claims.taking_up_begins(key).await;
        let (alarm, lost) = crate::lease::loss_signal();
        let key = key.to_owned();
        let params = (
            request.token.as_str().to_owned(),
            lease_ms(request.lease),
            queue.place.as_str().to_owned(),
            queue.keep,
            lease_ms(queue.liveness),
            self.identity.as_str().to_owned(),
        );
        let bound = self.request_timeout * 2;
        tokio::spawn(async move {
            let (token, lease_ms, place, keep, liveness_ms, owner) = &params;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&key, token, lease_ms, place, keep, liveness_ms, owner];
            let reply = connection.client.query_one(&adopt, &params);
            let mut reply = std::pin::pin!(reply);
            let taken = match tokio::time::timeout_at(granted.valid_until, &mut reply).await {
                Ok(Ok(row)) => row
                    .try_get::<_, bool>(0)
                    .map_err(|e| classify("take-up", e)),
                Ok(Err(e)) => Err(classify("take-up", e)),
                Err(_) => {
                    // Too late to count on, whatever the answer: lost now (the grant may lapse
                    // any moment), and the answer waited for, so that the key's next request
                    // follows it.
                    alarm.fire();
                    let _ = tokio::time::timeout(bound, reply).await;
                    Err(BackendError::new(
                        "PostgreSQL take-up: no answer within the granted lease",
                    ))
                }
            };
            let failed = match taken {
                Ok(true) => return,
                Ok(false) => BackendError::new("PostgreSQL take-up: the granted hold was gone"),
                Err(e) => e,
            };
            tracing::debug!(key = %key, error = %failed, "a granted hold was not taken up: lost");
            alarm.fire();
            if !*keep {
                // The place was to leave with the take-up: it leaves now (its claim would be
                // granted again, with nobody of this process to take it up).
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, place];
                let left = connection
                    .client
                    .execute(&connection.statements.leave, &params);
                match tokio::time::timeout(bound, left).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(key = %key, error = %classify("leave the queue", e), "a place could not leave the queue; it lapses");
                    }
                    Err(_) => {
                        tracing::debug!(key = %key, "a place's leaving got no answer; it lapses");
                    }
                }
            }
            drop(gate);
        });
        Some(Attempt::Acquired {
            fence: granted.fence,
            granted: None,
            lost: Some(lost),
            counted_from: None,
        })
    }

    /// Runs one statement, bounded by twice the request timeout (a connection may have to be
    /// made first). A request that finds the connection closed by the server is sent once more
    /// on a new one: every statement is safe to repeat with the same token. A release sent
    /// again that finds no row is unsettled (see [`BackendError::is_unsettled`]): the first
    /// may have deleted it, its reply lost with the connection.
    async fn call(&self, op: Op<'_>) -> Result<Reply, BackendError> {
        let unsettled = || {
            BackendError::new(
                "PostgreSQL release: the connection closed before the reply, and sent again the \
                 release found the hold gone (deleted by the first, or gone before it)",
            )
            .unsettled()
        };
        let bound = self.request_timeout * 2;
        // Pinned here, not moved into the timeout: a statement's future is large, and every
        // move copies it whole (a W1 cycle: 36.0k -> 34.4k client instructions).
        let sent = std::pin::pin!(async {
            let mut tries = 0;
            let mut sent_before = false;
            loop {
                tries += 1;
                let connection = self.connection().await?;
                match run(&connection, op).await {
                    Ok(Reply::SharedMissing) => {
                        // Tables made before dlock had the shared kinds: their table and
                        // functions are made now (or the error says how), then the
                        // connection is set up again to prepare their statements.
                        Box::pin(create_shared_schema(&connection.client)).await?;
                        self.forget(&connection);
                        if tries < 2 {
                            continue;
                        }
                        return Err(BackendError::new(
                            "PostgreSQL: the table `dlock_shared` is there, but its statements \
                             could not be prepared",
                        ));
                    }
                    // A release sent again that finds no hold of its token (a shared
                    // kind's says `false` for a lapsed hold too: the first sending may still be
                    // running, its hold's row deleted and not yet committed, when the second's
                    // look at it is made).
                    Ok(Reply::NoRow) if sent_before => return Err(unsettled()),
                    Ok(Reply::Done(false))
                        if sent_before && matches!(op, Op::ReleaseShared(..)) =>
                    {
                        return Err(unsettled());
                    }
                    Ok(reply) => return Ok(reply),
                    Err(e) => {
                        let closed = e.is_closed() || !connection.alive();
                        sent_before |=
                            closed && matches!(op, Op::Release(..) | Op::ReleaseShared(..));
                        let schema_gone = e.code() == Some(&SqlState::UNDEFINED_TABLE)
                            || e.code() == Some(&SqlState::UNDEFINED_OBJECT);
                        if closed || schema_gone {
                            // Made again (with the schema checked) by the next request.
                            self.forget(&connection);
                        }
                        if (closed || schema_gone) && tries < 2 {
                            continue;
                        }
                        return Err(classify(op.name(), e));
                    }
                }
            }
        });
        tokio::time::timeout(bound, sent).await.unwrap_or_else(|_| {
            Err(BackendError::new(format!(
                "PostgreSQL {} got no reply within {bound:?}",
                op.name()
            )))
        })
    }
}

async fn run(connection: &Connection, op: Op<'_>) -> Result<Reply, tokio_postgres::Error> {
    let client = &connection.client;
    let statements = &connection.statements;
    match op {
        Op::Acquire(key, token, lease_ms, None, owner, _) => {
            // Twice at most: a shared key's row whose holds all lapsed goes in between.
            for _ in 0..2 {
                let taken = client
                    .query_opt(
                        &statements.acquire,
                        &[&key, &token.as_str(), &lease_ms, &owner],
                    )
                    .await?;
                if let Some(row) = taken {
                    return Ok(Reply::Acquire {
                        fence: row.try_get(0)?,
                        ttl_ms: None,
                    });
                }
                let Some(held) = client.query_opt(&statements.refused, &[&key]).await? else {
                    return Ok(Reply::Acquire {
                        fence: None,
                        ttl_ms: None,
                    });
                };
                let holder: String = held.try_get(1)?;
                if shared::is_mutex_token(&holder) {
                    return Ok(Reply::Acquire {
                        fence: None,
                        ttl_ms: held.try_get(0)?,
                    });
                }
                if let Some(conflict) = Box::pin(shared::lapse(client, key, &holder)).await? {
                    return Ok(Reply::Conflict(conflict));
                }
            }
            Ok(Reply::Acquire {
                fence: None,
                ttl_ms: None,
            })
        }
        Op::Acquire(key, token, lease_ms, Some(queue), owner, claim_ms) => {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                &key,
                &token.as_str(),
                &lease_ms,
                &self::lease_ms(queue.liveness),
                &queue.place.as_str(),
                &queue.keep,
                &queue.strict,
                &owner,
                &queue.refresh,
                &claim_ms,
            ];
            // Without the claim's columns the statement has no `$10`.
            let params = &params[..if statements.adopt.is_some() { 10 } else { 9 }];
            let row = client.query_one(&statements.acquire_queued, params).await?;
            let fence: Option<i64> = row.try_get(0)?;
            if fence.is_none()
                && let Some(holder) = row.try_get::<_, Option<String>>(2)?
                && !shared::is_mutex_token(&holder)
            {
                // A semaphore or read/write lock: a conflict unless all of it lapsed (then it
                // goes, and the next attempt finds the key free).
                return Ok(match Box::pin(shared::lapse(client, key, &holder)).await? {
                    Some(conflict) => Reply::Conflict(conflict),
                    None => Reply::Acquire {
                        fence: None,
                        ttl_ms: Some(0),
                    },
                });
            }
            Ok(Reply::Acquire {
                fence,
                ttl_ms: row.try_get(1)?,
            })
        }
        Op::Leave(key, place) => {
            client
                .execute(&statements.leave, &[&key, &place.as_str()])
                .await?;
            Ok(Reply::Done(true))
        }
        Op::Release(key, token) => {
            let row = client
                .query_opt(&statements.release, &[&key, &token.as_str()])
                .await?;
            match row {
                Some(row) => Ok(Reply::Done(
                    row.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
                )),
                None => Ok(Reply::NoRow),
            }
        }
        Op::Extend(key, token, lease_ms) => {
            let n = client
                .execute(&statements.extend, &[&key, &token.as_str(), &lease_ms])
                .await?;
            Ok(Reply::Done(n == 1))
        }
        // Semaphores, read/write locks, inspecting, listing, forcing, pinging: boxed, so that
        // their futures (the largest) do not size every mutex request's, copied at each move.
        other => Box::pin(run_other(connection, other)).await,
    }
}

/// [`run`]'s requests but a mutex's acquisition, release, extension and leaving the queue.
async fn run_other(connection: &Connection, op: Op<'_>) -> Result<Reply, tokio_postgres::Error> {
    let client = &connection.client;
    match op {
        Op::AcquireShared(ask) => {
            let Some(statements) = &connection.shared else {
                return Ok(Reply::SharedMissing);
            };
            Ok(match shared::acquire(client, statements, ask).await? {
                shared::Answer::Granted(fence) => Reply::Acquire {
                    fence: Some(fence),
                    ttl_ms: None,
                },
                shared::Answer::Refused(ttl_ms) => Reply::Acquire {
                    fence: None,
                    ttl_ms,
                },
                shared::Answer::Conflict(why) => Reply::Conflict(why),
            })
        }
        Op::ReleaseShared(key, token) => {
            let Some(statements) = &connection.shared else {
                return Ok(Reply::SharedMissing);
            };
            shared::release(client, statements, key, token.as_str())
                .await
                .map(Reply::Done)
        }
        Op::ExtendShared(key, token, lease_ms) => {
            let Some(statements) = &connection.shared else {
                return Ok(Reply::SharedMissing);
            };
            shared::extend(client, statements, key, token.as_str(), lease_ms)
                .await
                .map(Reply::Done)
        }
        Op::Inspect(key) => {
            let row = client.query_opt(INSPECT, &[&key]).await?;
            if let Some(row) = &row
                && !shared::is_mutex_token(&row.try_get::<_, String>(5)?)
            {
                let rows = client.query(shared::INSPECT, &[&key]).await?;
                return shared::info(key, &rows).map(|info| {
                    Reply::Info(info.map(|mut info| {
                        info.waiters = usize::try_from(row.try_get::<_, i64>(4).unwrap_or(0)).ok();
                        info
                    }))
                });
            }
            row.map(|row| {
                let mut info = row_info(key, &row, 0)?;
                info.waiters = usize::try_from(row.try_get::<_, i64>(4)?).ok();
                Ok(info)
            })
            .transpose()
            .map(Reply::Info)
        }
        Op::List(prefix) => {
            let rows = client.query(LIST, &[&prefix]).await?;
            rows.iter()
                .map(|row| row.try_get::<_, String>(0))
                .collect::<Result<_, _>>()
                .map(Reply::Keys)
        }
        Op::Force(key) => {
            let shared_key = client
                .query_opt("SELECT token FROM dlock_locks WHERE key = $1", &[&key])
                .await?
                .map(|row| row.try_get::<_, String>(0))
                .transpose()?
                .is_some_and(|token| !shared::is_mutex_token(&token));
            if shared_key {
                let mut rows = client.query(shared::FORCE, &[&key]).await?;
                rows.retain(|row| row.try_get::<_, bool>(6).unwrap_or(false));
                client.query_one(shared::FORCED, &[&key]).await?;
                return shared::info(key, &rows).map(Reply::Info);
            }
            let Some(row) = client.query_opt(FORCE, &[&key]).await? else {
                return Ok(Reply::Info(None));
            };
            if !row.try_get::<_, bool>(0)? {
                return Ok(Reply::Info(None));
            }
            row_info(key, &row, 1).map(|info| Reply::Info(Some(info)))
        }
        Op::Ping => {
            client.simple_query("SELECT 1").await?;
            Ok(Reply::Done(true))
        }
        Op::Acquire(..) | Op::Release(..) | Op::Extend(..) | Op::Leave(..) => {
            Box::pin(run(connection, op)).await
        }
    }
}

/// A lock row's holder (`owner`, `acquired_at`), fence and remaining ms, from column `at` on.
fn row_info(
    key: &str,
    row: &tokio_postgres::Row,
    at: usize,
) -> Result<LockInfo, tokio_postgres::Error> {
    let mut info = LockInfo::new(key.to_owned());
    let owner: Option<String> = row.try_get(at)?;
    info.holder = owner.as_deref().and_then(holder::parse).map(|mut h| {
        h.since = row
            .try_get::<_, Option<std::time::SystemTime>>(at + 1)
            .ok()
            .flatten();
        h
    });
    info.fence = u64::try_from(row.try_get::<_, i64>(at + 2)?).ok();
    info.remaining = u64::try_from(row.try_get::<_, i64>(at + 3)?)
        .ok()
        .map(Duration::from_millis);
    Ok(info)
}

/// What a listening connection does with a release notification's payload (the key).
type OnNotification = Arc<dyn Fn(&str) + Send + Sync>;

/// A new connection whose notifications go to `on_notification` (dropped when `None`), driven
/// by a task on the current runtime. TLS (verified) with `sslmode=require`, which needs the
/// `tls` feature; plain otherwise (`prefer` does not try TLS).
async fn connect(
    config: &tokio_postgres::Config,
    on_notification: Option<OnNotification>,
) -> Result<(Client, tokio::task::JoinHandle<()>), BackendError> {
    let failed = |e| classify("connection", e);
    #[cfg(feature = "tls")]
    if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = config
            .connect(tls::MakeRustls::new()?)
            .await
            .map_err(failed)?;
        return Ok((client, tokio::spawn(drive(connection, on_notification))));
    }
    let (client, connection) = config.connect(NoTls).await.map_err(failed)?;
    Ok((client, tokio::spawn(drive(connection, on_notification))))
}

/// Polls the connection until it ends, handing notifications to `on_notification`.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    on_notification: Option<OnNotification>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if let Some(f) = &on_notification
                    && (n.channel() == CHANNEL || n.channel().starts_with(WAKE_CHANNEL))
                {
                    f(n.payload());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::debug!(error = %e, "PostgreSQL connection ended");
                return;
            }
            None => return,
        }
    }
}

/// Bounds the server's side of every statement, creates the schema when it is missing, and
/// prepares the statements (pipelined: one round trip).
async fn setup(
    client: &Client,
    request_timeout: Duration,
) -> Result<(Statements, Option<shared::Statements>), BackendError> {
    // A statement stuck on the server (a row locked by someone's open transaction) is
    // cancelled there too, not only given up on here.
    let statement_ms = u64::try_from(request_timeout.as_millis() * 2)
        .unwrap_or(u64::MAX)
        .max(1);
    // A grant is reported once its commit is durable: with `synchronous_commit = off` (the
    // server's or the role's setting) a server crash could lose a reported grant, and the
    // sequence's advance with it (a later fence equal to or below one handed out). Only `off`
    // is raised; `local` and the `remote_*` levels are the user's (each waits for the local
    // flush at least).
    // The prepared statements are planned once per connection (see `PLAN_ONCE`).
    let probe = format!(
        "SET statement_timeout = {statement_ms}; \
         DO $$ BEGIN IF current_setting('synchronous_commit') = 'off' THEN \
             PERFORM set_config('synchronous_commit', 'on', false); END IF; \
             {PLAN_ONCE} END $$; \
         SELECT to_regclass('dlock_locks') IS NOT NULL AND to_regclass('dlock_fence') IS NOT NULL \
         AND to_regclass('dlock_waiters') IS NOT NULL \
         AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('dlock_locks') \
                     AND attname = 'acquired_at' AND NOT attisdropped), ({}), \
         to_regprocedure('dlock_wake_line(text,bigint)') IS NOT NULL, \
         EXISTS (SELECT 1 FROM pg_proc \
                  WHERE oid = to_regprocedure('dlock_wake_line(text,bigint)')::oid \
                    AND prosrc LIKE '%{WAKE_CHANNEL}%'), \
         EXISTS (SELECT 1 FROM pg_proc \
                  WHERE oid = to_regprocedure('{}')::oid \
                    AND prosrc LIKE '%pg_advisory_xact_lock({FENCE_TURN},%'), \
         EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('dlock_waiters') \
                     AND attname = 'claim_ms' AND NOT attisdropped), \
         EXISTS (SELECT 1 FROM pg_proc \
                  WHERE oid = to_regprocedure('dlock_wake_line(text,bigint)')::oid \
                    AND prosrc LIKE '%claim_ms%')",
        shared::PROBE,
        shared::ACQUIRE_SIGNATURE,
    );
    let messages = client
        .simple_query(&probe)
        .await
        .map_err(|e| classify("setup", e))?;
    let probed = |column| {
        messages.iter().any(|m| {
            matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(column) == Some("t"))
        })
    };
    let (exists, mut shared_exists, mut wakes) = (probed(0), probed(1), probed(2));
    let (mut claims, mut grants) = (probed(5), probed(6));
    // Made by an earlier dlock, which announced every release on `dlock_release`.
    let mut outdated = wakes && !probed(3);
    // Made by an earlier dlock, whose shared acquisitions drew fences outside the key's turn.
    let shared_outdated = shared_exists && !probed(4);
    if !exists {
        // One implicit transaction: the advisory lock makes concurrent creators take turns.
        let create = format!(
            "SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {SCHEMA} {WAKE_LINE} {}",
            shared::SCHEMA
        );
        if let Err(e) = client.batch_execute(&create).await {
            let denied = e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
            if denied {
                return Err(BackendError::with_source(
                    "PostgreSQL refused: the table `dlock_locks` (or `dlock_waiters`, or the \
                     sequence `dlock_fence`) does not exist, or lacks the holder's columns \
                     `owner` and `acquired_at` (tables made before dlock recorded holders), and this user may not create \
                     or alter it; run the DDL in dlock's docs/postgres.md as an owner, and grant this user SELECT, INSERT, \
                     UPDATE, DELETE on dlock_locks and dlock_waiters and USAGE on dlock_fence",
                    e,
                )
                .refused());
            }
            return Err(classify("schema creation", e));
        }
        tracing::info!(
            "created the PostgreSQL lock table `dlock_locks` and sequence `dlock_fence`"
        );
        (shared_exists, wakes, claims, grants) = (true, true, true, true);
    } else if !claims && add_claims(client).await? {
        // With the function that grants.
        (claims, wakes, grants, outdated) = (true, true, true, false);
    }
    // Without the claim's columns, the function that grants nothing.
    let wake_line = if claims {
        WAKE_LINE
    } else {
        WAKE_LINE_UNCLAIMED
    };
    if !wakes {
        wakes = create_wake_line(client, wake_line).await?;
    } else if outdated || (claims && !grants) {
        // Its releases announced every release on `dlock_release`, heard by every listening
        // process, or granted no claim; this one's announce on the channel of the place they
        // name, and (with the claim's columns) grant the key to a fair waiter first in line.
        replace_earlier(
            client,
            wake_line,
            "replaced the PostgreSQL function `dlock_wake_line` of an earlier dlock",
            "the PostgreSQL function `dlock_wake_line` is an earlier dlock's and this user may \
             not replace it: releases grant fair waiters nothing, and may wake waiters on the \
             channel every listening process hears (run the function's DDL in docs/postgres.md \
             as its owner)",
            false,
        )
        .await?;
    }
    if exists && shared_outdated {
        replace_earlier(
            client,
            shared::SCHEMA,
            "replaced the PostgreSQL functions of the shared kinds of an earlier dlock",
            "the PostgreSQL function `dlock_acquire_shared` is an earlier dlock's and this user \
             may not replace it: a semaphore's or read/write lock's fence may fall below a \
             mutex's on the same key (run its DDL in docs/postgres.md as its owner)",
            true,
        )
        .await?;
    }
    let (acquire_queued, leave) = if claims {
        (ACQUIRE_QUEUED.into(), LEAVE.into())
    } else {
        (unclaimed(ACQUIRE_QUEUED), unclaimed(LEAVE))
    };
    let (acquire, refused, acquire_queued, release, leave, extend, adopt) = tokio::join!(
        client.prepare(ACQUIRE),
        client.prepare(REFUSED),
        client.prepare(&acquire_queued),
        client.prepare(if wakes { RELEASE } else { RELEASE_LOOKING }),
        client.prepare(&leave),
        client.prepare(EXTEND),
        async {
            if claims {
                client.prepare(ADOPT).await.map(Some)
            } else {
                Ok(None)
            }
        }
    );
    let shared = if shared_exists {
        Some(shared::Statements::prepare(client).await)
    } else {
        None
    };
    let prepared = (|| {
        Ok::<_, tokio_postgres::Error>((
            Statements {
                acquire: acquire?,
                refused: refused?,
                acquire_queued: acquire_queued?,
                release: release?,
                leave: leave?,
                extend: extend?,
                adopt: adopt?,
            },
            shared.transpose()?,
        ))
    })();
    prepared.map_err(|e| {
        if e.code() == Some(&SqlState::UNDEFINED_COLUMN) {
            // Tables made by hand, or by another version, without a column dlock needs.
            BackendError::with_source(
                "PostgreSQL refused: `dlock_locks` or `dlock_waiters` lacks a column dlock needs; \
                 compare the tables with the DDL in dlock's docs/postgres.md",
                e,
            )
            .refused()
        } else {
            classify("prepare", e)
        }
    })
}

/// The claim's columns of `dlock_waiters` and the function [`WAKE_LINE`] that grants claims,
/// added to tables made before dlock had them: `false` when this user may not (then fair
/// waiters write no claim, and take the key by an attempt of their own after the release that
/// wakes them).
async fn add_claims(client: &Client) -> Result<bool, BackendError> {
    let add = format!(
        "SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); \
         ALTER TABLE dlock_waiters ADD COLUMN IF NOT EXISTS claim text, \
                                   ADD COLUMN IF NOT EXISTS claim_ms bigint; {WAKE_LINE}"
    );
    match client.batch_execute(&add).await {
        Ok(()) => {
            tracing::info!(
                "added the fair waiters' claim to the PostgreSQL table `dlock_waiters` and \
                 replaced the function `dlock_wake_line`"
            );
            Ok(true)
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            tracing::info!(
                "the PostgreSQL table `dlock_waiters` lacks the columns `claim` and `claim_ms` \
                 and this user may not add them: a fair hand-off waits for the woken waiter's \
                 own attempt (run the DDL in docs/postgres.md as the table's owner)"
            );
            Ok(false)
        }
        Err(e) => Err(classify("schema creation", e)),
    }
}

/// The function `dlock_wake_line` ([`WAKE_LINE`], or [`WAKE_LINE_UNCLAIMED`] without the
/// claim's columns), made for tables made before dlock had it: `false` when this user may not
/// make it (then releases look at the queue themselves, see [`RELEASE_LOOKING`]).
async fn create_wake_line(client: &Client, wake_line: &str) -> Result<bool, BackendError> {
    let create = format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {wake_line}");
    match client.batch_execute(&create).await {
        Ok(()) => {
            tracing::info!("created the PostgreSQL function `dlock_wake_line`");
            Ok(true)
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            tracing::info!(
                "the PostgreSQL function `dlock_wake_line` is missing and this user may not \
                 create it: every release looks at the queue (see docs/postgres.md)"
            );
            Ok(false)
        }
        Err(e) => Err(classify("schema creation", e)),
    }
}

/// Runs `ddl` (under the schema's advisory lock) in place of a function an earlier dlock made:
/// `replaced` is logged when it is done; where this user may not, the earlier one stays and
/// `kept` says what that means (at `warn` when it costs a guarantee).
async fn replace_earlier(
    client: &Client,
    ddl: &str,
    replaced: &str,
    kept: &str,
    costs_a_guarantee: bool,
) -> Result<(), BackendError> {
    let create = format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {ddl}");
    match client.batch_execute(&create).await {
        Ok(()) => {
            tracing::info!("{replaced}");
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            if costs_a_guarantee {
                tracing::warn!("{kept}");
            } else {
                tracing::info!("{kept}");
            }
            Ok(())
        }
        Err(e) => Err(classify("schema creation", e)),
    }
}

/// The shared kinds' table and functions, made at the first shared acquisition on tables made
/// before dlock had them; a user who may not make them is told how.
async fn create_shared_schema(client: &Client) -> Result<(), BackendError> {
    // Made meanwhile (by an owner, or another locker): this connection only prepares them.
    let made = client
        .query_one(shared::PROBE, &[])
        .await
        .map_err(|e| classify("setup", e))?;
    if made.try_get::<_, Option<bool>>(0).ok().flatten() == Some(true) {
        return Ok(());
    }
    let create = format!(
        "SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {}",
        shared::SCHEMA
    );
    match client.batch_execute(&create).await {
        Ok(()) => {
            tracing::info!("created the PostgreSQL table `dlock_shared` and its functions");
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            Err(BackendError::with_source(
                "PostgreSQL refused: semaphores and read/write locks need the table \
                 `dlock_shared` and the functions `dlock_acquire_shared` and \
                 `dlock_release_shared`, which do not exist, and this user may not create \
                 them; run the DDL in dlock's docs/postgres.md as an owner, and grant this user \
                 SELECT, INSERT, UPDATE, DELETE on dlock_shared",
                e,
            )
            .refused())
        }
        Err(e) => Err(classify("schema creation", e)),
    }
}

/// A driver error as a [`BackendError`], marked refused when asking again cannot cure it: a
/// privilege the server denies, credentials it does not accept, a key it cannot store.
fn classify(what: &str, error: tokio_postgres::Error) -> BackendError {
    let why = match error.code() {
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => Some(
            "the PostgreSQL user lacks a privilege on `dlock_locks`, `dlock_waiters` or \
             `dlock_fence` (grant SELECT, INSERT, UPDATE, DELETE on the tables and USAGE on the \
             sequence)",
        ),
        Some(c)
            if *c == SqlState::INVALID_PASSWORD
                || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            Some("the server did not accept the credentials")
        }
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => Some("the database does not exist"),
        Some(c)
            if *c == SqlState::UNTRANSLATABLE_CHARACTER
                || *c == SqlState::CHARACTER_NOT_IN_REPERTOIRE =>
        {
            Some("the lock key cannot be stored in the database's encoding")
        }
        Some(c) if *c == SqlState::PROGRAM_LIMIT_EXCEEDED => {
            Some("the lock key is too long for the table's index")
        }
        _ => None,
    };
    match why {
        Some(why) => {
            BackendError::with_source(format!("PostgreSQL {what} refused: {why}"), error).refused()
        }
        None => BackendError::with_source(format!("PostgreSQL {what} failed"), error),
    }
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(super::api::lease_millis(lease)).unwrap_or(i64::MAX)
}

impl Backend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            wake_up: WakeUp::Named,
            ..Capabilities::default()
        }
    }

    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>> {
        Box::pin(async move {
            let queue = request.queue;
            let key = stored_key(self.prefix_len, request.key);
            self.claims.settled(&key).await;
            // Fair mode, with notifications: the refusal that writes the place writes a claim
            // (this waiter's token and lease, no longer than the place's liveness) which a
            // release may grant; a grant heard for it is taken up here.
            let fair =
                queue.filter(|q| q.strict && request.kind.is_mutex() && self.notifier.is_some());
            if let Some(q) = fair
                && let Some(taken) = Box::pin(self.take_up(&key, &request, q)).await
            {
                return Ok(taken);
            }
            let claim_ms = fair.filter(|q| q.refresh).map(|q| {
                let ms = lease_ms(request.lease.min(q.liveness));
                self.claims
                    .claimed(&key, request.token.as_str(), u64::try_from(ms).unwrap_or(0));
                ms
            });
            let op = if request.kind.is_mutex() {
                Op::Acquire(
                    &key,
                    request.token,
                    lease_ms(request.lease),
                    queue,
                    self.identity.as_str(),
                    claim_ms,
                )
            } else {
                Op::AcquireShared(shared::Ask {
                    key: &key,
                    token: request.token.as_str(),
                    kind: request.kind,
                    lease_ms: lease_ms(request.lease),
                    live_ms: lease_ms(request.liveness),
                    owner: self.identity.as_str(),
                })
            };
            let reply = self.call(op).await;
            if claim_ms.is_some() && reply.is_err() {
                self.claims.unsure(&key);
            }
            match reply? {
                Reply::Conflict(why) => Ok(Attempt::Conflict(why)),
                Reply::Acquire {
                    fence: Some(fence), ..
                } => {
                    if fair.is_some() {
                        self.claims.forget(&key);
                    }
                    Ok(Attempt::acquired(u64::try_from(fence).unwrap_or(0)))
                }
                Reply::Acquire {
                    fence: None,
                    ttl_ms,
                } => Ok(Attempt::Held {
                    ttl: ttl_ms
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(Duration::from_millis),
                    queued: queue.is_some() || request.kind == LockKind::Write,
                }),
                _ => Err(BackendError::new("PostgreSQL acquire: unexpected reply")),
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let key = stored_key(self.prefix_len, key);
            self.claims.settled(&key).await;
            let op = if kind.is_mutex() {
                Op::Release(&key, token)
            } else {
                Op::ReleaseShared(&key, token)
            };
            match self.call(op).await? {
                Reply::Done(live) => Ok(live),
                Reply::NoRow => Ok(false),
                _ => Err(BackendError::new("PostgreSQL release: unexpected reply")),
            }
        })
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a str,
        place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let key = stored_key(self.prefix_len, key);
            self.claims.settled(&key).await;
            self.claims.left(&key);
            self.call(Op::Leave(&key, place)).await?;
            Ok(())
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let key = stored_key(self.prefix_len, key);
            self.claims.settled(&key).await;
            let op = if kind.is_mutex() {
                Op::Extend(&key, token, lease_ms(lease))
            } else {
                Op::ExtendShared(&key, token, lease_ms(lease))
            };
            match self.call(op).await? {
                Reply::Done(extended) => Ok(extended),
                _ => Err(BackendError::new("PostgreSQL extend: unexpected reply")),
            }
        })
    }

    fn watching(&self, key: &str, _token: &Token, place: Option<&Token>) -> Option<Watch> {
        // Release notifications name the key as the table stores it.
        self.notifier
            .as_ref()?
            .watching(&stored_key(self.prefix_len, key), place)
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        _token: &'a Token,
        place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>> {
        Box::pin(async move {
            match &self.notifier {
                Some(notifier) => {
                    notifier
                        .watch(&stored_key(self.prefix_len, key), place)
                        .await
                }
                None => None,
            }
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move { self.call(Op::Ping).await.map(drop) })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(self.lock_info(key, |k| Op::Inspect(k)))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let stored = stored_key(self.prefix_len, prefix);
            match self.call(Op::List(&stored)).await? {
                Reply::Keys(keys) => Ok(keys
                    .iter()
                    .map(|k| unstored_key(self.prefix_len, k))
                    .collect()),
                _ => Err(BackendError::new("PostgreSQL list: unexpected reply")),
            }
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>> {
        Box::pin(self.lock_info(key, |k| Op::Force(k)))
    }

    fn key_error(&self, key: &str) -> Option<String> {
        let stored = stored_key(self.prefix_len, key).len();
        (stored > MAX_KEY_BYTES).then(|| {
            format!(
                "the key is {stored} bytes as stored (prefix included, `%` and NUL written \
                 `%25` and `%00`); PostgreSQL's index on `dlock_locks` holds keys of at most \
                 {MAX_KEY_BYTES}"
            )
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Release notifications.
// ---------------------------------------------------------------------------------------------

/// `LISTEN dlock_release` on a dedicated connection per locker, shared by all its waiters, and
/// `LISTEN dlock_wake_<8 hex>`, the channel of the locker's places, from its first waiter with
/// a place in a queue on.
///
/// One task owns the connection: it connects, listens, checks the connection every few
/// seconds, and when it drops wakes every waiter (they poll meanwhile) and connects again while
/// anyone waits. Started by the first waiter (and again by the next one after it stopped);
/// stopped with the locker, and once nobody has waited for [`LINGER`]: every listening backend
/// costs the server at each notifying commit in the database, whoever it is for.
struct Notifier {
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Shared {
    config: tokio_postgres::Config,
    request_timeout: Duration,
    /// Wake-ups per key, alive while a waiter holds its watch.
    watchers: Watchers,
    /// What `LISTEN`s are confirmed on a live connection.
    listening: tokio::sync::watch::Sender<Listening>,
    /// The first 8 hex digits of the locker's places, once a waiter waits from one: its
    /// channel is `dlock_wake_` and these.
    tag: std::sync::OnceLock<String>,
    /// Rung when `tag` is set, for a connection that listens already.
    tag_set: tokio::sync::Notify,
    /// Where a grant heard is recorded for the waiter whose claim it is.
    claims: Arc<grant::Claims>,
    /// When a waiter last asked for a wake-up, and whether the task has stopped for good: the
    /// task decides to stop under this lock, after a waiter registers its wake-up and before
    /// it looks here, so a waiter either keeps the task going or sees it stopped and starts
    /// another.
    run: Mutex<Run>,
}

/// See [`Shared::run`].
struct Run {
    last_wait: Instant,
    stopped: bool,
}

/// The listening connection's state.
#[derive(Clone, Copy, Default)]
struct Listening {
    /// `LISTEN dlock_release` confirmed.
    up: bool,
    /// `LISTEN dlock_wake_<tag>` confirmed too.
    tag: bool,
}

impl Listening {
    /// Whether a waiter is covered: with a place, on its place's channel too.
    fn covers(self, place: bool) -> bool {
        self.up && (self.tag || !place)
    }
}

/// How often the listening connection is checked: a connection that died silently (a frozen
/// server, a cut network) is noticed within this, plus the request timeout.
const HEARTBEAT: Duration = Duration::from_secs(3);

/// How long the listening connection stays open with nobody waiting (it closes at the first
/// check after; a wait counts from when it began, and from each check that finds it still
/// waiting): a key contended now is likely contended again soon, and a new connection and its
/// `LISTEN` cost a few milliseconds.
const LINGER: Duration = Duration::from_secs(5);

impl Shared {
    /// A release's payload: who is next in line ([`NO_ONE`], or 8 hex digits of a token) and
    /// the key (empty: every key), or a grant to a place of this process (see [`WAKE_LINE`]),
    /// recorded for its waiter. Anything else on the channel wakes that key's waiters.
    fn wake(&self, payload: &str) {
        if let Some((next, claim, fence, key)) = grant::parse(payload) {
            if !key.is_empty() {
                self.claims.heard(key, claim, fence);
            }
            self.watchers
                .wake(Some(key).filter(|k| !k.is_empty()), Some(next));
            return;
        }
        let (next, key) = match payload.get(..NO_ONE.len()) {
            Some(NO_ONE) => (None, &payload[NO_ONE.len()..]),
            Some(next) if next.bytes().all(|b| b.is_ascii_hexdigit()) => {
                (Some(next), &payload[NO_ONE.len()..])
            }
            _ => (None, payload),
        };
        self.watchers
            .wake(Some(key).filter(|k| !k.is_empty()), next);
    }

    fn anyone_waits(&self) -> bool {
        self.watchers.anyone_waits()
    }

    fn register(&self, key: &str) -> Watch {
        self.watchers.register(key)
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the task for good unless someone waits (and, with `linger`, unless a wait began
    /// or was seen here within [`LINGER`]): `true` when stopped. Waiters poll from now on, and
    /// the next one starts another task.
    fn stop_unless_waited(&self, linger: bool) -> bool {
        let mut run = self.run();
        if self.anyone_waits() {
            // The linger counts from the end of a long wait too, as seen at these checks.
            run.last_wait = Instant::now();
            return false;
        }
        if linger && run.last_wait.elapsed() < LINGER {
            return false;
        }
        run.stopped = true;
        self.listening.send_replace(Listening::default());
        true
    }
}

impl Notifier {
    fn new(
        config: tokio_postgres::Config,
        request_timeout: Duration,
        claims: Arc<grant::Claims>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                request_timeout,
                watchers: Watchers::default(),
                listening: tokio::sync::watch::Sender::new(Listening::default()),
                tag: std::sync::OnceLock::new(),
                tag_set: tokio::sync::Notify::new(),
                claims,
                run: Mutex::new(Run {
                    last_wait: Instant::now(),
                    stopped: false,
                }),
            }),
            task: Mutex::new(None),
        }
    }

    /// Starts the listening task on the current runtime unless it runs: at first use, again
    /// after it stopped (nobody waited), and when the runtime it ran on has shut down.
    fn ensure_running(&self) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if self.running(task.as_ref()) {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if let Some(stopped) = task.take() {
            // Ends on its own at once; it holds no connection after deciding to stop.
            stopped.abort();
        }
        self.shared.run().stopped = false;
        self.shared.listening.send_replace(Listening::default());
        *task = Some(tokio::spawn(listen(self.shared.clone())));
    }

    /// Whether `task` runs and has not decided to stop.
    fn running(&self, task: Option<&tokio::task::JoinHandle<()>>) -> bool {
        task.is_some_and(|t| !t.is_finished()) && !self.shared.run().stopped
    }

    /// Notes that a waiter asked for a wake-up now (after registering it): the connection
    /// lingers from here.
    fn waited(&self) {
        self.shared.run().last_wait = Instant::now();
    }

    /// Records the tag of the locker's places from `place` (the same for all of them).
    fn learn_tag(&self, place: Option<&Token>) {
        if let Some(place) = place
            && self.shared.tag.set(place.as_str()[..8].to_owned()).is_ok()
        {
            self.shared.tag_set.notify_one();
        }
    }

    /// A wake-up for `key` when `LISTEN` is in place now (for a waiter from a `place`, on its
    /// channel too); no I/O, and nothing started (an uncontended locker never opens the
    /// listening connection).
    fn watching(&self, key: &str, place: Option<&Token>) -> Option<Watch> {
        // Registered before the task is looked at: a task deciding to stop sees this waiter.
        let watch = self.shared.register(key);
        self.waited();
        let running = self.running(
            self.task
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref(),
        );
        self.learn_tag(place);
        // A task gone with its runtime may have left `listening` set.
        (running && self.shared.listening.borrow().covers(place.is_some()))
            .then(|| watch.hearing(self.hearing(place.is_some())))
    }

    /// A wake-up for `key`, once `LISTEN` is in place (for a waiter from a `place`, on its
    /// channel too; waiting at most the request timeout for it); `None` when notifications
    /// cannot be had now.
    async fn watch(&self, key: &str, place: Option<&Token>) -> Option<Watch> {
        // Registered first: the task keeps trying to listen while someone waits.
        let watch = self.shared.register(key);
        self.waited();
        self.learn_tag(place);
        self.ensure_running();
        let mut listening = self.shared.listening.subscribe();
        let with_place = place.is_some();
        let up = tokio::time::timeout(
            self.shared.request_timeout,
            listening.wait_for(|l| l.covers(with_place)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        up.then(|| watch.hearing(self.hearing(with_place)))
    }

    /// Whether `LISTEN` is in place on a live connection (with a place, on its channel too):
    /// from a drop until the connection is back, its waiters hear no release.
    fn hearing(&self, with_place: bool) -> Hearing {
        let shared = self.shared.clone();
        Arc::new(move || shared.listening.borrow().covers(with_place))
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// The listening task: connect, `LISTEN`, check now and then; on loss wake everyone, pause
/// (50ms doubling to 2s) and start again; stop when nobody waits (after [`LINGER`] on a live
/// connection).
async fn listen(shared: Arc<Shared>) {
    let mut pause = Duration::from_millis(50);
    // A connection was lost, or could not be made: releases may have come meanwhile, which no
    // waiter heard (each looked once when it was lost, and sleeps its pause since).
    let mut missed = false;
    loop {
        let on_notification: OnNotification = {
            let shared = Arc::downgrade(&shared);
            Arc::new(move |key: &str| {
                if let Some(shared) = shared.upgrade() {
                    shared.wake(key);
                }
            })
        };
        let connected = tokio::time::timeout(shared.request_timeout * 2, async {
            let (client, driver) = connect(&shared.config, Some(on_notification)).await?;
            let tag = shared.tag.get();
            let mut listen = format!("LISTEN {CHANNEL};");
            if let Some(tag) = tag {
                listen.push_str(&format!(" LISTEN {WAKE_CHANNEL}{tag};"));
            }
            if let Err(e) = client.batch_execute(&listen).await {
                driver.abort();
                return Err(classify("LISTEN", e));
            }
            Ok((client, driver, tag.is_some()))
        })
        .await;
        match connected {
            Ok(Ok((client, mut driver, mut tagged))) => {
                shared.listening.send_replace(Listening {
                    up: true,
                    tag: tagged,
                });
                pause = Duration::from_millis(50);
                if std::mem::take(&mut missed) {
                    // Listening again: everyone looks once more for what came in the gap.
                    shared.wake("");
                }
                loop {
                    tokio::select! {
                        _ = &mut driver => break,
                        () = shared.tag_set.notified(), if !tagged => {
                            let Some(tag) = shared.tag.get() else { continue };
                            let listened = tokio::time::timeout(
                                shared.request_timeout,
                                client.batch_execute(&format!("LISTEN {WAKE_CHANNEL}{tag}")),
                            )
                            .await
                            .is_ok_and(|r| r.is_ok());
                            if !listened {
                                break;
                            }
                            tagged = true;
                            shared.listening.send_modify(|l| l.tag = true);
                        }
                        () = tokio::time::sleep(HEARTBEAT) => {
                            if shared.stop_unless_waited(true) {
                                driver.abort();
                                tracing::debug!("PostgreSQL notification connection closed: nobody waits");
                                return;
                            }
                            let alive = tokio::time::timeout(
                                shared.request_timeout,
                                client.check_connection(),
                            )
                            .await
                            .is_ok_and(|r| r.is_ok());
                            if !alive {
                                break;
                            }
                        }
                    }
                }
                driver.abort();
                shared.listening.send_replace(Listening::default());
                tracing::debug!("PostgreSQL notification connection lost; waiters poll meanwhile");
                // A release may have been missed: everyone looks again.
                shared.wake("");
                missed = true;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "PostgreSQL LISTEN failed; retrying");
                missed = true;
            }
            Err(_) => {
                tracing::debug!("PostgreSQL LISTEN timed out; retrying");
                missed = true;
            }
        }
        if shared.stop_unless_waited(false) {
            // Nobody to wake: the next waiter starts the task again.
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DDL docs/postgres.md gives operators is the schema the engine creates.
    #[test]
    fn the_docs_give_the_schema() {
        let docs = include_str!("../../../../docs/postgres.md");
        assert!(
            docs.contains(SCHEMA),
            "docs/postgres.md: the mutex's tables"
        );
        assert!(
            docs.contains(shared::SCHEMA),
            "docs/postgres.md: the shared kinds' table"
        );
        assert!(
            docs.contains(WAKE_LINE),
            "docs/postgres.md: the function that wakes a line"
        );
    }

    /// The acquisitions take the key's turn under [`FENCE_TURN`] ('dlck') before drawing a
    /// fence, the shared kinds' function first of all.
    #[test]
    fn the_acquisitions_draw_the_fence_in_the_keys_turn() {
        assert_eq!(FENCE_TURN, i32::from_be_bytes(*b"dlck").to_string());
        let turn = format!("pg_advisory_xact_lock({FENCE_TURN}, hashtext($1))");
        for (name, text) in [("ACQUIRE", ACQUIRE), ("ACQUIRE_QUEUED", ACQUIRE_QUEUED)] {
            assert!(text.contains(&turn), "{name}");
            assert!(text.contains("FROM turn"), "{name}");
        }
        let function = &shared::SCHEMA[shared::SCHEMA.find("dlock_acquire_shared(").unwrap()..];
        let shared_turn = format!("PERFORM pg_advisory_xact_lock({FENCE_TURN}, hashtext(p_key));");
        let turn_at = function
            .find(&shared_turn)
            .expect("dlock_acquire_shared takes the turn");
        assert!(turn_at < function.find("INSERT INTO dlock_locks").unwrap());
        // A release's grant draws its fence only when it got the turn (tried, not waited for).
        let tried = format!("pg_try_advisory_xact_lock({FENCE_TURN}, hashtext(p_key))");
        assert!(WAKE_LINE.contains(&format!("THEN {tried}")));
        assert!(WAKE_LINE.contains("CASE WHEN d.grants THEN nextval('dlock_fence')"));
        assert_eq!(WAKE_LINE.matches("nextval").count(), 1);
    }

    /// Without the claim's columns the statements name neither column nor `$10`: each
    /// replacement of [`UNCLAIMED`] finds its text.
    #[test]
    fn the_unclaimed_statements_leave_the_claim_out() {
        for (with, _) in UNCLAIMED {
            assert!(
                ACQUIRE_QUEUED.contains(with) || LEAVE.contains(with),
                "not in the statements: {with}"
            );
        }
        for statement in [unclaimed(ACQUIRE_QUEUED), unclaimed(LEAVE)] {
            assert!(!statement.contains("claim_ms") && !statement.contains("$10"));
            assert!(!statement.contains(", claim") || statement.contains("NULL::text AS claim"));
        }
        assert!(ACQUIRE_QUEUED.contains("$10") && LEAVE.contains("RETURNING place, claim"));
    }

    /// The tombstone reads as a lapsed mutex hold everywhere, and the statements that look for
    /// it spell it the same.
    #[test]
    fn the_tombstone_is_a_lapsed_mutex_token() {
        assert!(shared::is_mutex_token(TOMBSTONE));
        for (name, text) in [
            ("WAKE_LINE", WAKE_LINE),
            ("ACQUIRE_QUEUED", ACQUIRE_QUEUED),
            ("LEAVE", LEAVE),
        ] {
            assert!(text.contains(&format!("'{TOMBSTONE}'")), "{name}");
        }
    }

    #[test]
    fn url_forms() {
        for url in [
            "postgres://u:pw@db/app",
            "postgresql://u@db:5433/app?sslmode=disable",
            "postgres://u@%2Fvar%2Frun%2Fpostgresql/app",
            "postgres:///app?host=/tmp&user=u",
            "postgresql://u@h1:5432,h2:5433/app?target_session_attrs=read-write",
        ] {
            check_url("X", url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        let require = check_url("DLOCK_URL", "postgres://u:s3cret@db/app?sslmode=require");
        if cfg!(feature = "tls") {
            require.unwrap();
        } else {
            let text = require.unwrap_err().to_string();
            assert!(
                text.contains("`tls` feature") && !text.contains("s3cret"),
                "{text}"
            );
        }
        for url in [
            "postgres://u:s3cret@db/app?sslmode=verify-full",
            "postgres://u:s3cret@db/app?bogus=1",
            "postgres://u:s3cret@db:notaport/app",
            "postgres://u:s3cret@/app",
        ] {
            let err = check_url("DLOCK_URL", url).unwrap_err();
            let text = err.to_string();
            assert!(err.is_config(), "{url}: {text}");
            assert!(text.contains("DLOCK_URL"), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }

    #[test]
    fn stored_keys_write_nul_and_percent_after_the_prefix() {
        assert!(matches!(
            stored_key(6, "dlock:order:42"),
            std::borrow::Cow::Borrowed("dlock:order:42")
        ));
        assert_eq!(stored_key(6, "dlock:a\0b"), "dlock:a%00b");
        assert_eq!(stored_key(6, "dlock:a%00b"), "dlock:a%2500b");
        assert_eq!(stored_key(2, "%:a%"), "%:a%25");
        assert_eq!(stored_key(6, "dlock:\0"), "dlock:%00");
    }
}
