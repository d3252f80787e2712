//! What `dlock` prints: aligned text for people, or one JSON document (`--json`).

use std::time::{Duration, SystemTime};

use dlock_runtime::{LockInfo, LockKind};
use serde_json::{Value, json};

/// Text or JSON.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Output {
    pub(crate) json: bool,
}

impl Output {
    pub(crate) fn ping(self, round_trip: Duration) {
        if self.json {
            print_json(&json!({ "ok": true, "round_trip_ms": millis(round_trip) }));
        } else {
            println!("ok: the engine answered in {}", short(round_trip));
        }
    }

    pub(crate) fn list(self, held: &[LockInfo]) {
        if self.json {
            print_json(&Value::Array(held.iter().map(info_json).collect()));
            return;
        }
        let header = [
            "KEY",
            "KIND",
            "OWNER",
            "HOST",
            "PID",
            "SINCE",
            "FENCE",
            "REMAINING",
            "WAITERS",
        ];
        let rows: Vec<[String; 9]> = held
            .iter()
            .map(|info| {
                let holder = info.holder.as_ref();
                [
                    shown(&info.key),
                    kind_short(info),
                    holder.map_or_else(dash, |h| shown(&h.owner)),
                    holder.map_or_else(dash, |h| shown(&h.host)),
                    holder.map_or_else(dash, |h| h.pid.to_string()),
                    holder.and_then(|h| h.since).map_or_else(dash, ago),
                    info.fence.map_or_else(dash, |f| f.to_string()),
                    info.remaining.map_or_else(dash, short),
                    info.waiters.map_or_else(dash, |w| w.to_string()),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            println!("{}", padded.join("  ").trim_end());
        };
        line(&header.map(str::to_owned));
        for row in &rows {
            line(row);
        }
    }

    pub(crate) fn show(self, key: &str, info: Option<&LockInfo>) {
        match (self.json, info) {
            (true, Some(info)) => print_json(&info_json(info)),
            (true, None) => print_json(&json!({ "key": key, "held": false })),
            (false, None) => println!("{key} is free"),
            (false, Some(info)) => {
                println!("{key} is held by {}", holder_text(info));
                if !info.kind.is_mutex() {
                    println!("  kind       {}", kind_long(info));
                }
                if let Some(fence) = info.fence {
                    println!("  fence      {fence}");
                }
                if let Some(remaining) = info.remaining {
                    println!("  remaining  {}", short(remaining));
                }
                if let Some(waiters) = info.waiters {
                    println!("  waiters    {waiters}");
                }
            }
        }
    }

    pub(crate) fn free(self, key: &str) {
        if self.json {
            print_json(&json!({ "key": key, "held": false }));
        } else {
            println!("{key} is free");
        }
    }

    pub(crate) fn released(self, key: &str, freed: Option<&LockInfo>) {
        match (self.json, freed) {
            (true, Some(info)) => {
                let mut value = info_json(info);
                value["released"] = Value::Bool(true);
                print_json(&value);
            }
            (true, None) => print_json(&json!({ "key": key, "held": false, "released": false })),
            (false, None) => println!("{key} was free: nothing released"),
            (false, Some(info)) => {
                println!("released {key}, held by {}", holder_text(info));
                if let Some(fence) = info.fence {
                    println!("every later holder's fence is above {fence}");
                }
            }
        }
    }
}

/// A lock's kind in the listing: `mutex`, `sem 2/3` (permits taken of the count), `read x2`
/// (readers), `write`.
fn kind_short(info: &LockInfo) -> String {
    match info.kind {
        LockKind::Semaphore { permits, .. } => format!("sem {}/{permits}", info.holders),
        LockKind::Read => format!("read x{}", info.holders),
        LockKind::Write => "write".to_owned(),
        _ => "mutex".to_owned(),
    }
}

/// A shared lock's kind in words, with how many hold it.
fn kind_long(info: &LockInfo) -> String {
    match info.kind {
        LockKind::Semaphore { permits, .. } => {
            format!("semaphore of {permits} permits, {} taken", info.holders)
        }
        LockKind::Read => format!("read/write lock, held by {} readers", info.holders),
        LockKind::Write => "read/write lock, held by a writer".to_owned(),
        kind => kind.to_string(),
    }
}

/// The kind's name in JSON: `mutex`, `semaphore`, `read`, `write`.
fn kind_name(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Semaphore { .. } => "semaphore",
        LockKind::Read => "read",
        LockKind::Write => "write",
        _ => "mutex",
    }
}

/// `billing on web-3 (pid 4242) since 2026-11-25T08:00:00.123Z (12s ago)`, or what is known.
pub(crate) fn holder_text(info: &LockInfo) -> String {
    match &info.holder {
        None => "a holder that recorded no name (another tool, or an older dlock)".to_owned(),
        Some(holder) => {
            let who = format!(
                "{} on {} (pid {})",
                shown(&holder.owner),
                shown(&holder.host),
                holder.pid
            );
            match holder
                .since
                .and_then(|since| Some((rfc3339(since)?, ago(since))))
            {
                Some((at, ago)) => format!("{who} since {at} ({ago})"),
                None => who,
            }
        }
    }
}

/// Who runs this command, for the audit line: `user@host (pid N)`.
pub(crate) fn me() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "someone".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("{user}@{host} (pid {})", std::process::id())
}

fn info_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "held": true,
        "kind": kind_name(info.kind),
        "permits": match info.kind {
            LockKind::Semaphore { permits, .. } => Some(permits),
            _ => None,
        },
        "holders": info.holders,
        "holder": info.holder.as_ref().map(|h| json!({
            "owner": h.owner,
            "host": h.host,
            "pid": h.pid,
            "since": h.since.and_then(rfc3339),
        })),
        "fence": info.fence,
        "remaining_ms": info.remaining.map(millis),
        "waiters": info.waiters,
    })
}

/// A name as recorded, with control characters escaped: a record is anyone's text, and must
/// not drive the operator's terminal.
fn shown(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// RFC 3339 to the millisecond, for a time in years 1970 to 9999 (humantime's formatter
/// panics before 1970 and fails after 9999); `None` otherwise.
fn rfc3339(time: SystemTime) -> Option<String> {
    const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
    let since_epoch = time.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    (since_epoch < YEAR_10000).then(|| humantime::format_rfc3339_millis(time).to_string())
}

/// Now, for the audit line (RFC 3339, or `?` for a clock outside years 1970 to 9999).
pub(crate) fn now() -> String {
    rfc3339(SystemTime::now()).unwrap_or_else(|| "?".to_owned())
}

fn print_json(value: &Value) {
    println!("{value}");
}

fn dash() -> String {
    "-".to_owned()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `12s ago`, `3m ago` (to the second).
fn ago(since: SystemTime) -> String {
    match SystemTime::now().duration_since(since) {
        Ok(d) => format!(
            "{} ago",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ),
        Err(_) => "just now".to_owned(),
    }
}

/// A duration to the millisecond: `27s 912ms`, `0.4ms` below a millisecond.
fn short(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        return format!("{:.1}ms", d.as_secs_f64() * 1000.0);
    }
    humantime::format_duration(Duration::from_millis(millis(d))).to_string()
}
