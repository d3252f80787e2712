//! PostgreSQL's semaphores and read/write locks: one row per hold (and per waiting writer) in
//! `dlock_shared`, and the key's row in `dlock_locks`, whose `token` names the kind
//! (`permits=N` or `rw`) instead of a mutex holder's token. That row is where a mutex and a
//! shared lock of one key meet: a mutex finds it held (and is told the kind), and every
//! acquisition of a shared key locks it first, so holds are counted one acquisition at a time
//! (a single statement could not count safely: under READ COMMITTED a statement that waited for
//! a row lock keeps its old snapshot for the rest of its work).

use std::time::Duration;

use tokio_postgres::{Client, Row, Statement};

use crate::{LockInfo, LockKind, holder};

/// The table and functions of the shared kinds, as `docs/postgres.md` gives them; created with
/// the rest of the schema, or (for tables made before dlock had them) at the first shared
/// acquisition.
pub(crate) const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS dlock_shared (
    key         text        NOT NULL,
    token       text        NOT NULL,
    mode        text        NOT NULL,
    fence       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    owner       text,
    acquired_at timestamptz,
    PRIMARY KEY (key, token)
);
CREATE OR REPLACE FUNCTION dlock_acquire_shared(
    p_key text, p_token text, p_mode text, p_kind text, p_permits integer,
    p_lease_ms bigint, p_live_ms bigint, p_owner text,
    OUT fence bigint, OUT ttl_ms bigint, OUT conflict text)
LANGUAGE plpgsql AS $$
DECLARE
    held_as text;
    live boolean;
    holds integer;
    writer boolean;
    soonest timestamptz;
    first_writer text;
    ends timestamptz := clock_timestamp() + p_lease_ms * interval '1 millisecond';
BEGIN
    -- The key's turn, as a mutex's acquisition takes it, before the key's row and the fence.
    PERFORM pg_advisory_xact_lock(1684824939, hashtext(p_key));
    INSERT INTO dlock_locks AS l (key, token, fence, expires_at, contended)
    VALUES (p_key, p_kind, 0, clock_timestamp(), false)
    ON CONFLICT (key) DO UPDATE SET token = l.token
    RETURNING l.token, l.expires_at > clock_timestamp() INTO held_as, live;
    IF held_as ~ '^[0-9a-f]{32}$' THEN
        IF live THEN
            conflict := 'it is held as a mutex';
            RETURN;
        END IF;
        UPDATE dlock_locks SET token = p_kind, contended = false WHERE key = p_key;
        held_as := p_kind;
    END IF;
    DELETE FROM dlock_shared WHERE key = p_key AND expires_at <= clock_timestamp();
    IF held_as <> p_kind THEN
        IF EXISTS (SELECT 1 FROM dlock_shared WHERE key = p_key) THEN
            conflict := 'it is held as ' || CASE WHEN held_as = 'rw' THEN 'a read/write lock'
                ELSE 'a semaphore of ' || substr(held_as, 9) || ' permits' END;
            RETURN;
        END IF;
        UPDATE dlock_locks SET token = p_kind WHERE key = p_key;
    END IF;
    SELECT count(*) FILTER (WHERE mode <> 'W'), coalesce(bool_or(mode = 'w'), false),
           min(expires_at) FILTER (WHERE mode <> 'W' AND (p_mode <> 'r' OR mode = 'w'))
      INTO holds, writer, soonest
      FROM dlock_shared WHERE key = p_key;
    SELECT token INTO first_writer FROM dlock_shared
     WHERE key = p_key AND mode = 'W' ORDER BY dlock_shared.fence LIMIT 1;
    IF EXISTS (SELECT 1 FROM dlock_shared WHERE key = p_key AND token = p_token AND mode <> 'W')
       OR (p_mode = 'p' AND holds < p_permits)
       OR (p_mode = 'w' AND holds = 0 AND (first_writer IS NULL OR first_writer = p_token))
       OR (p_mode = 'r' AND NOT writer AND first_writer IS NULL) THEN
        fence := nextval('dlock_fence');
        INSERT INTO dlock_shared AS s (key, token, mode, fence, expires_at, owner, acquired_at)
        VALUES (p_key, p_token, p_mode, fence, ends, p_owner, clock_timestamp())
        ON CONFLICT (key, token) DO UPDATE
            SET mode = EXCLUDED.mode, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at,
                owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at;
        UPDATE dlock_locks SET expires_at = greatest(expires_at, ends) WHERE key = p_key;
        RETURN;
    END IF;
    IF p_mode = 'w' THEN
        ends := clock_timestamp() + p_live_ms * interval '1 millisecond';
        INSERT INTO dlock_shared AS s (key, token, mode, fence, expires_at)
        VALUES (p_key, p_token, 'W', nextval('dlock_fence'), ends)
        ON CONFLICT (key, token) DO UPDATE SET expires_at = EXCLUDED.expires_at;
        UPDATE dlock_locks SET expires_at = greatest(expires_at, ends) WHERE key = p_key;
    END IF;
    UPDATE dlock_locks SET contended = true WHERE key = p_key AND NOT contended;
    IF soonest IS NOT NULL THEN
        ttl_ms := greatest(0, ceil(extract(epoch FROM soonest - clock_timestamp()) * 1000))::bigint;
    END IF;
END $$;
CREATE OR REPLACE FUNCTION dlock_release_shared(p_key text, p_token text, OUT live boolean)
LANGUAGE plpgsql AS $$
DECLARE
    waking boolean;
    removed integer;
BEGIN
    SELECT contended INTO waking FROM dlock_locks
     WHERE key = p_key AND token !~ '^[0-9a-f]{32}$' FOR UPDATE;
    DELETE FROM dlock_shared WHERE key = p_key AND token = p_token
    RETURNING expires_at > clock_timestamp() AND mode <> 'W' INTO live;
    GET DIAGNOSTICS removed = ROW_COUNT;
    live := coalesce(live, false);
    IF NOT EXISTS (SELECT 1 FROM dlock_shared WHERE key = p_key AND expires_at > clock_timestamp())
    THEN
        DELETE FROM dlock_shared WHERE key = p_key;
        DELETE FROM dlock_locks WHERE key = p_key AND token !~ '^[0-9a-f]{32}$';
    END IF;
    IF removed > 0 AND waking THEN
        PERFORM pg_notify('dlock_release', '--------' ||
            CASE WHEN octet_length(p_key) < 7900 THEN p_key ELSE '' END);
    END IF;
END $$;
CREATE OR REPLACE FUNCTION dlock_extend_shared(p_key text, p_token text, p_lease_ms bigint,
    OUT extended boolean)
LANGUAGE plpgsql AS $$
DECLARE
    ends timestamptz;
BEGIN
    PERFORM 1 FROM dlock_locks WHERE key = p_key AND token !~ '^[0-9a-f]{32}$' FOR UPDATE;
    IF NOT FOUND THEN
        extended := false;
        RETURN;
    END IF;
    ends := clock_timestamp() + p_lease_ms * interval '1 millisecond';
    UPDATE dlock_shared SET expires_at = ends
     WHERE key = p_key AND token = p_token AND mode <> 'W' AND expires_at > clock_timestamp();
    extended := FOUND;
    IF extended THEN
        UPDATE dlock_locks SET expires_at = greatest(expires_at, ends) WHERE key = p_key;
    END IF;
END $$;";

/// The acquisition function's signature, for `to_regprocedure`.
pub(super) const ACQUIRE_SIGNATURE: &str =
    "dlock_acquire_shared(text,text,text,text,integer,bigint,bigint,text)";

/// Whether the shared kinds' table and functions exist.
pub(super) const PROBE: &str = "\
SELECT to_regclass('dlock_shared') IS NOT NULL
   AND to_regprocedure('dlock_acquire_shared(text,text,text,text,integer,bigint,bigint,text)') IS NOT NULL
   AND to_regprocedure('dlock_release_shared(text,text)') IS NOT NULL
   AND to_regprocedure('dlock_extend_shared(text,text,bigint)') IS NOT NULL";

const ACQUIRE: &str =
    "SELECT fence, ttl_ms, conflict FROM dlock_acquire_shared($1, $2, $3, $4, $5, $6, $7, $8)";

const RELEASE: &str = "SELECT live FROM dlock_release_shared($1, $2)";

/// Reset a hold's lease while it lasts, and keep the key's row at least as long (the key's row
/// locked first, as acquisitions lock it).
const EXTEND: &str = "SELECT extended FROM dlock_extend_shared($1, $2, $3)";

/// Drops what lapsed of a shared key whose row a mutex found, and the row with it when nothing
/// is live any more (then [`KEY_ROW`] finds none, or a mutex's).
pub(super) const LAPSE: &str = "SELECT live FROM dlock_release_shared($1, '')";

/// The token of a key's row: a mutex holder's, or a shared key's kind.
pub(super) const KEY_ROW: &str = "SELECT token FROM dlock_locks WHERE key = $1";

/// The live holds of a shared key, oldest first, with the key's kind and its waiting writers.
pub(super) const INSPECT: &str = "\
SELECT l.token, s.mode, s.owner, s.acquired_at, s.fence,
       greatest(0, ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000))::bigint,
       (SELECT count(*) FROM dlock_shared w
         WHERE w.key = $1 AND w.mode = 'W' AND w.expires_at > clock_timestamp())
  FROM dlock_shared s JOIN dlock_locks l ON l.key = s.key
 WHERE s.key = $1 AND s.mode <> 'W' AND s.expires_at > clock_timestamp()
 ORDER BY s.fence";

/// A forced release of a shared key: every hold goes (a waiting writer keeps its place).
pub(super) const FORCE: &str = "\
DELETE FROM dlock_shared s WHERE s.key = $1 AND s.mode <> 'W'
RETURNING (SELECT token FROM dlock_locks WHERE key = $1), s.mode, s.owner, s.acquired_at, s.fence,
          greatest(0, ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000))::bigint,
          s.expires_at > clock_timestamp()";

/// After [`FORCE`]: the key's row goes unless a writer waits, and waiters are woken.
pub(super) const FORCED: &str = "\
WITH key_row AS (
    DELETE FROM dlock_locks WHERE key = $1 AND token !~ '^[0-9a-f]{32}$'
       AND NOT EXISTS (SELECT 1 FROM dlock_shared
                        WHERE key = $1 AND expires_at > clock_timestamp())
)
SELECT pg_notify('dlock_release', '--------' ||
    CASE WHEN octet_length($1::text) < 7900 THEN $1::text ELSE '' END)";

/// The prepared statements of the shared kinds.
pub(super) struct Statements {
    acquire: Statement,
    release: Statement,
    extend: Statement,
}

impl Statements {
    pub(super) async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let (acquire, release, extend) = tokio::join!(
            client.prepare(ACQUIRE),
            client.prepare(RELEASE),
            client.prepare(EXTEND)
        );
        Ok(Self {
            acquire: acquire?,
            release: release?,
            extend: extend?,
        })
    }
}

/// What an acquisition of a shared kind sends.
#[derive(Clone, Copy)]
pub(super) struct Ask<'a> {
    pub(super) key: &'a str,
    pub(super) token: &'a str,
    pub(super) kind: LockKind,
    pub(super) lease_ms: i64,
    pub(super) live_ms: i64,
    pub(super) owner: &'a str,
}

/// A shared acquisition's answer: granted with a fence, refused (a hold ends within the ms
/// when known), or a conflict.
pub(super) enum Answer {
    Granted(i64),
    Refused(Option<i64>),
    Conflict(String),
}

/// The kind's name in the key's row, and the mode of the hold.
fn kind_and_mode(kind: LockKind) -> (String, &'static str, i32) {
    match kind {
        LockKind::Semaphore { permits } => (
            format!("permits={permits}"),
            "p",
            i32::try_from(permits).unwrap_or(i32::MAX),
        ),
        LockKind::Write => ("rw".to_owned(), "w", 0),
        _ => ("rw".to_owned(), "r", 0),
    }
}

pub(super) async fn acquire(
    client: &Client,
    statements: &Statements,
    ask: Ask<'_>,
) -> Result<Answer, tokio_postgres::Error> {
    let (kind, mode, permits) = kind_and_mode(ask.kind);
    let row = client
        .query_one(
            &statements.acquire,
            &[
                &ask.key,
                &ask.token,
                &mode,
                &kind,
                &permits,
                &ask.lease_ms,
                &ask.live_ms,
                &ask.owner,
            ],
        )
        .await?;
    if let Some(conflict) = row.try_get::<_, Option<String>>(2)? {
        return Ok(Answer::Conflict(conflict));
    }
    Ok(match row.try_get::<_, Option<i64>>(0)? {
        Some(fence) => Answer::Granted(fence),
        None => Answer::Refused(row.try_get(1)?),
    })
}

pub(super) async fn release(
    client: &Client,
    statements: &Statements,
    key: &str,
    token: &str,
) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_one(&statements.release, &[&key, &token])
        .await?;
    Ok(row.try_get::<_, Option<bool>>(0)?.unwrap_or(false))
}

pub(super) async fn extend(
    client: &Client,
    statements: &Statements,
    key: &str,
    token: &str,
    lease_ms: i64,
) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_one(&statements.extend, &[&key, &token, &lease_ms])
        .await?;
    row.try_get(0)
}

/// What the rows of [`INSPECT`] or [`FORCE`] (kind, mode, owner, since, fence, ms left) tell
/// an operator; `None` for no rows.
pub(super) fn info(key: &str, rows: &[Row]) -> Result<Option<LockInfo>, tokio_postgres::Error> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let kind: Option<String> = first.try_get(0)?;
    let mode: String = first.try_get(1)?;
    let mut info = LockInfo::new(key.to_owned());
    info.kind = match kind
        .as_deref()
        .and_then(|k| k.strip_prefix("permits="))
        .and_then(|n| n.parse().ok())
    {
        Some(permits) => LockKind::Semaphore { permits },
        None if mode == "w" => LockKind::Write,
        None => LockKind::Read,
    };
    info.holders = rows.len();
    let owner: Option<String> = first.try_get(2)?;
    info.holder = owner.as_deref().and_then(holder::parse).map(|mut h| {
        h.since = first
            .try_get::<_, Option<std::time::SystemTime>>(3)
            .ok()
            .flatten();
        h
    });
    let mut fence = None;
    let mut remaining = None;
    for row in rows {
        fence = fence.max(u64::try_from(row.try_get::<_, i64>(4)?).ok());
        remaining = remaining.max(
            u64::try_from(row.try_get::<_, i64>(5)?)
                .ok()
                .map(Duration::from_millis),
        );
    }
    info.fence = fence;
    info.remaining = remaining;
    Ok(Some(info))
}

/// A mutex acquisition refused by a shared key's row (`kind`, its token): what lapsed in it
/// goes, with the row when nothing is live; `None` when the key may be free now (ask again),
/// else the conflict.
pub(super) async fn lapse(
    client: &Client,
    key: &str,
    kind: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    client.query_one(LAPSE, &[&key]).await?;
    let row = client.query_opt(KEY_ROW, &[&key]).await?;
    let token = row.map(|row| row.try_get::<_, String>(0)).transpose()?;
    Ok(token.filter(|t| !is_mutex_token(t)).map(|_| {
        format!(
            "it is held as {}, and this acquisition asks for a mutex",
            if kind == "rw" {
                "a read/write lock".to_owned()
            } else {
                format!(
                    "a semaphore of {} permits",
                    kind.strip_prefix("permits=").unwrap_or("?")
                )
            }
        )
    }))
}

/// Whether a `dlock_locks` token is a mutex holder's (32 hex digits) rather than a shared
/// key's kind.
pub(super) fn is_mutex_token(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())
}
