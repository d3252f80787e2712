//! Who holds a lock: the record every engine stores with a hold (its owner's name, host and
//! process, and since when), and what [`Locker::inspect`](crate::Locker::inspect) and
//! [`Locker::list`](crate::Locker::list) read back.
//!
//! The record is one line of `name=value` words, each value percent-encoded where it holds a
//! space, `=`, `%` or a control character, so that the engine's own tools show it as is:
//! `owner=billing host=web-3 pid=4242 since=2026-11-25T08:00:00.123Z`.

use std::{
    fmt::{self, Write as _},
    time::{Duration, SystemTime},
};

/// Who holds a lock, as recorded by the holder when it took it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's name: `DLOCK_OWNER`, [`LockerBuilder::owner`](crate::LockerBuilder::owner),
    /// or its host name.
    pub owner: String,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When it took the lock. On etcd, when it joined the key's line (it may have waited, up to
    /// its timeout, before it held); by the server's clock on ZooKeeper and PostgreSQL, by the
    /// holder's elsewhere. `None` when the engine's record does not say.
    pub since: Option<SystemTime>,
}

/// What [`Locker::inspect`](crate::Locker::inspect) and [`Locker::list`](crate::Locker::list)
/// tell about one held lock. A field the engine cannot tell is `None`; the engine pages say
/// which.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's key, without the locker's prefix (as given to
    /// [`Locker::acquire`](crate::Locker::acquire)).
    pub key: String,
    /// What kind of lock it is: a mutex, a semaphore, or a read/write lock held for reading
    /// ([`LockKind::Read`](crate::LockKind::Read)) or writing.
    pub kind: crate::LockKind,
    /// How many hold it: 1 for a mutex or a writer, the permits taken of a semaphore, the
    /// readers of a read lock.
    pub holders: usize,
    /// Who holds it (of several holders, the one that has held it longest); `None` when the
    /// lock was taken by something that records no holder (an older dlock, `etcdctl lock`, a
    /// Curator client).
    pub holder: Option<Holder>,
    /// The fencing token of the current hold: on the Redis engines, PostgreSQL and the embedded
    /// table (on RedLock the highest of the majority's). `None` on etcd and ZooKeeper, whose
    /// fence is the revision at which the holder came first in line, which they do not keep.
    pub fence: Option<u64>,
    /// The holder's remaining lease. On etcd, the TTL of the holder's session lease (renewed
    /// while its process lives; its own `expire` ends the hold on its side); `None` on
    /// ZooKeeper, where the session is the lease.
    pub remaining: Option<Duration>,
    /// How many wait for it: acquisitions in line on etcd and ZooKeeper; processes in line on
    /// Redis, PostgreSQL and the embedded table (a process keeps one place per key for all its
    /// waiters); `None` on RedLock.
    pub waiters: Option<usize>,
}

impl LockInfo {
    pub(crate) fn new(key: String) -> Self {
        Self {
            key,
            kind: crate::LockKind::Mutex,
            holders: 1,
            holder: None,
            fence: None,
            remaining: None,
            waiters: None,
        }
    }
}

/// This process's identity as a holder record without the time: what a locker stores with
/// each of its holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity(String);

impl Identity {
    /// `owner=… host=… pid=…` for `owner` (the host name when `None`).
    pub(crate) fn new(owner: Option<&str>) -> Self {
        let host = host_name();
        let owner = owner.unwrap_or(&host);
        let mut record = String::with_capacity(64);
        record.push_str("owner=");
        encode_into(&mut record, owner);
        record.push_str(" host=");
        encode_into(&mut record, &host);
        let _ = write!(record, " pid={}", std::process::id());
        Self(record)
    }

    /// The record without a time (ZooKeeper and PostgreSQL keep the time themselves).
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "zookeeper")),
        allow(dead_code, reason = "for the engines over the network")
    )]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The record with `since` (by this process's clock; left out when the clock is outside
    /// years 1970 to 9999).
    pub(crate) fn since(&self, since: SystemTime) -> String {
        let since = Since::at(since);
        let mut record = String::with_capacity(self.0.len() + since.as_str().len());
        record.push_str(&self.0);
        record.push_str(since.as_str());
        record
    }
}

impl Default for Identity {
    fn default() -> Self {
        Self::new(None)
    }
}

/// A record's time part: ` since=` and the time in RFC 3339 to the millisecond
/// (`2026-11-25T08:00:00.123Z`), or nothing when the time lies outside years 1970 to 9999
/// (humantime's formatter panics before 1970 and fails after 9999). Made at every acquisition:
/// the date and the second are formatted once a second on each thread, and the milliseconds
/// written into them.
#[derive(Clone, Copy)]
pub(crate) struct Since(Option<[u8; Self::LEN]>);

impl Since {
    const LEN: usize = " since=2026-11-25T08:00:00.123Z".len();

    /// The time now.
    #[cfg(feature = "redis")]
    pub(crate) fn now() -> Self {
        Self::at(SystemTime::now())
    }

    pub(crate) fn at(time: SystemTime) -> Self {
        const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
        thread_local! {
            /// The last second formatted here, and its `YYYY-MM-DDTHH:MM:SS`.
            static SECOND: std::cell::Cell<(u64, [u8; 19])> =
                const { std::cell::Cell::new((u64::MAX, [0; 19])) };
        }
        let Some(since_epoch) = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .filter(|d| *d < YEAR_10000)
        else {
            return Self(None);
        };
        let second = since_epoch.as_secs();
        let date = SECOND.with(|last| {
            let (at, date) = last.get();
            if at == second {
                return date;
            }
            // `YYYY-MM-DDTHH:MM:SSZ`
            let formatted = humantime::format_rfc3339_seconds(time).to_string();
            let mut date = [0; 19];
            date.copy_from_slice(&formatted.as_bytes()[..19]);
            last.set((second, date));
            date
        });
        let millis = since_epoch.subsec_millis();
        let mut text = [0; Self::LEN];
        text[..7].copy_from_slice(b" since=");
        text[7..26].copy_from_slice(&date);
        text[26] = b'.';
        for (i, digit) in [millis / 100, millis / 10 % 10, millis % 10]
            .into_iter()
            .enumerate()
        {
            // A digit: below 10.
            text[27 + i] = b'0' + u8::try_from(digit).unwrap_or(0);
        }
        text[30] = b'Z';
        Self(Some(text))
    }

    pub(crate) fn as_str(&self) -> &str {
        // ASCII, written above.
        self.0
            .as_ref()
            .map_or("", |text| std::str::from_utf8(text).unwrap_or_default())
    }
}

/// Reads a holder record; `None` when `record` is not one (another program's value).
pub(crate) fn parse(record: &str) -> Option<Holder> {
    let (mut owner, mut host, mut pid, mut since) = (None, None, None, None);
    for word in record.split(' ') {
        let (name, value) = word.split_once('=')?;
        match name {
            "owner" => owner = Some(decode(value)?),
            "host" => host = Some(decode(value)?),
            "pid" => pid = Some(value.parse().ok()?),
            "since" => since = humantime::parse_rfc3339(value).ok(),
            _ => {}
        }
    }
    Some(Holder {
        owner: owner?,
        host: host?,
        pid: pid?,
        since,
    })
}

impl fmt::Display for Holder {
    /// `owner@host pid N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} (pid {})", self.owner, self.host, self.pid)
    }
}

/// The host name: the kernel's (Linux), else `HOSTNAME`/`COMPUTERNAME`, else `unknown`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn encode_into(out: &mut String, value: &str) {
    for c in value.chars() {
        if c == ' ' || c == '=' || c == '%' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

/// A percent-encoded value (a record's, or a ZooKeeper node name's) decoded; `None` unless it
/// decodes to UTF-8.
pub(crate) fn decode(value: &str) -> Option<String> {
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_any_name() {
        for owner in ["billing", "a b=c%d", "naïve\tname\n", "", "日本"] {
            let id = Identity::new(Some(owner));
            assert!(!id.as_str().contains('\n'));
            assert_eq!(id.as_str().split(' ').count(), 3, "{}", id.as_str());
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_057_600_123);
            let holder = parse(&id.since(at)).unwrap();
            assert_eq!(holder.owner, owner);
            assert_eq!(holder.pid, std::process::id());
            assert_eq!(holder.since, Some(at));
            assert_eq!(parse(id.as_str()).unwrap().since, None);
        }
        let before_1970 = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        let after_9999 = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        for odd in [before_1970, after_9999] {
            let record = Identity::default().since(odd);
            assert!(!record.contains("since="), "{record}");
        }
        assert_eq!(Identity::new(None), Identity::default());
        assert_eq!(
            parse(Identity::default().as_str()).unwrap().owner,
            host_name()
        );
    }

    /// The time part, formatted once a second and the milliseconds written in, reads as
    /// humantime formats the whole time, at and around second boundaries, in either order.
    #[test]
    fn the_time_is_written_as_rfc3339_to_the_millisecond() {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut times = vec![at(0), at(999), at(1_000), at(253_402_300_799_999)];
        for second in [1_764_057_600_000, 1_764_057_601_000, 951_782_400_000] {
            for ms in [0, 1, 9, 10, 99, 100, 458, 999] {
                times.push(at(second + ms));
            }
            times.push(at(second - 1));
        }
        times.push(at(1_764_057_600_458) + Duration::from_nanos(999_999));
        for time in times.iter().chain(times.iter().rev()) {
            assert_eq!(
                Since::at(*time).as_str(),
                format!(" since={}", humantime::format_rfc3339_millis(*time)),
            );
        }
        assert_eq!(Since::at(at(253_402_300_800_000)).as_str(), "");
        assert_eq!(
            Since::at(SystemTime::UNIX_EPOCH - Duration::from_nanos(1)).as_str(),
            ""
        );
        assert!(
            Since::at(SystemTime::now())
                .as_str()
                .starts_with(" since=20")
        );
    }

    #[test]
    fn other_values_are_no_record() {
        for value in [
            "",
            "0123abcd",
            "owner=a host=b",
            "owner=a host=b pid=x",
            "a=%zz",
        ] {
            assert_eq!(parse(value), None, "{value}");
        }
    }
}
