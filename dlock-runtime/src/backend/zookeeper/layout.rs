//! The names of Curator's lock nodes: what a child of a lock node is, its place in line, the
//! protected prefixes dlock creates, and the permit count a semaphore's `leases` records.

use super::super::api::push_random_hex;
use crate::{LockKind, error::BackendError};

/// The name Curator's `InterProcessMutex` gives its nodes after the protected prefix (also the
/// internal mutex of a semaphore, under `locks`).
pub(super) const LOCK_NAME: &str = "lock-";
/// `InterProcessReadWriteLock`'s readers and writers, beside each other under the lock node.
pub(super) const READ_NAME: &str = "__READ__";
pub(super) const WRITE_NAME: &str = "__WRIT__";
/// `InterProcessSemaphoreV2`'s leases, under `leases`.
pub(super) const LEASE_NAME: &str = "lease-";
/// A semaphore's two children of the lock node: its internal mutex and its leases.
pub(super) const LOCKS: &str = "locks";
pub(super) const LEASES: &str = "leases";

/// What a child of a lock node is, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mark {
    /// A mutex's node (`…lock-<seq>`).
    Lock,
    /// A read/write lock's reader (`…__READ__<seq>`).
    Read,
    /// A read/write lock's writer (`…__WRIT__<seq>`).
    Write,
}

impl Mark {
    /// The mark of the nodes an acquisition of `kind` creates in the lock node (a semaphore's
    /// go under `locks`, as a mutex's).
    pub(super) fn of(kind: LockKind) -> Self {
        match kind {
            LockKind::Read => Self::Read,
            LockKind::Write => Self::Write,
            _ => Self::Lock,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Lock => LOCK_NAME,
            Self::Read => READ_NAME,
            Self::Write => WRITE_NAME,
        }
    }

    /// Whether the node is a read/write lock's.
    pub(super) fn is_rw(self) -> bool {
        self != Self::Lock
    }
}

/// The sequence number after `name` at the end of `child`, as ZooKeeper appends it. The digits
/// at the end, then `name` just before them (no name ends with a digit): a look back, not a
/// substring search (`rsplit_once` made a searcher per child and mark, most of a line's
/// reading, counted under callgrind).
fn sequence_after(child: &str, name: &str) -> Option<i64> {
    let before = child.trim_end_matches(|c: char| c.is_ascii_digit());
    let seq = &child[before.len()..];
    if seq.is_empty() || !before.ends_with(name) {
        return None;
    }
    seq.parse().ok()
}

/// The mark and sequence of a child named like Curator's lock nodes; `None` for other children
/// (a semaphore's `locks` and `leases`, anything else).
pub(super) fn parse(child: &str) -> Option<(Mark, i64)> {
    [Mark::Lock, Mark::Read, Mark::Write]
        .into_iter()
        .find_map(|mark| Some((mark, sequence_after(child, mark.name())?)))
}

/// The sequence of a semaphore's lease (`…lease-<seq>`).
pub(super) fn lease_sequence(child: &str) -> Option<i64> {
    sequence_after(child, LEASE_NAME)
}

/// One node in line: its name, its mark, its sequence.
pub(super) type InLine<'a> = (&'a str, Mark, i64);

/// The children with a mark `keep` accepts, in line order (by sequence: the lock node's
/// sequence counter is shared by all its children, so readers, writers and mutex nodes are in
/// one order).
pub(super) fn line_of(children: &[String], keep: impl Fn(Mark) -> bool) -> Vec<InLine<'_>> {
    let mut line: Vec<_> = children
        .iter()
        .filter_map(|c| {
            let (mark, seq) = parse(c)?;
            keep(mark).then_some((c.as_str(), mark, seq))
        })
        .collect();
    line.sort_by_key(|(_, _, seq)| *seq);
    line
}

/// `_c_<uuid>-<name>`: Curator's protected prefix, the uuid fresh from the OS generator.
pub(super) fn protected_prefix(name: &str) -> Result<String, BackendError> {
    const START: usize = "_c_".len();
    let mut prefix = String::with_capacity(START + 36 + 1 + name.len());
    prefix.push_str("_c_");
    push_random_hex(&mut prefix)?;
    // The uuid's dashes, from the last (the digits after each insertion move).
    for at in [20, 16, 12, 8] {
        prefix.insert(START + at, '-');
    }
    prefix.push('-');
    prefix.push_str(name);
    Ok(prefix)
}

/// The data dlock gives a semaphore's `leases`: its permit count.
pub(super) fn permits_data(permits: u32) -> String {
    format!("permits={permits}")
}

/// The permit count a semaphore's `leases` records; `None` when it records none (Curator
/// leaves it empty).
pub(super) fn permits_of(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix("permits=")?
        .parse()
        .ok()
}

/// What a key held as a semaphore is called in a conflict: with its count when known.
pub(super) fn semaphore(permits: Option<u32>) -> String {
    match permits {
        Some(permits) => LockKind::Semaphore { permits }.to_string(),
        None => "semaphore".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_read_by_their_names() {
        assert_eq!(parse("_c_a-lock-0000000010"), Some((Mark::Lock, 10)));
        assert_eq!(parse("_c_a-__READ__0000000002"), Some((Mark::Read, 2)));
        assert_eq!(parse("_c_a-__WRIT__0000000003"), Some((Mark::Write, 3)));
        for other in ["locks", "leases", "x-lock-", "lock-1a", "__READ__"] {
            assert_eq!(parse(other), None, "{other}");
        }
        assert_eq!(lease_sequence("_c_a-lease-0000000004"), Some(4));
        assert_eq!(lease_sequence("lease-"), None);
        // The name just before the digits counts, wherever else it appears.
        assert_eq!(parse("lock-12lock-0000000034"), Some((Mark::Lock, 34)));
        assert_eq!(parse("lock-1a2"), None);
        assert_eq!(parse("__READ__0000000001lock-"), None);
        // What reading the digits first relies on.
        for name in [LOCK_NAME, READ_NAME, WRITE_NAME, LEASE_NAME] {
            assert!(!name.ends_with(|c: char| c.is_ascii_digit()), "{name}");
        }
    }

    #[test]
    fn the_line_is_in_sequence_order() {
        let children: Vec<String> = [
            "_c_b-lock-0000000010",
            "other",
            "_c_a-lock-0000000002",
            "x-lock-",
            "_c_c-lock-0000000003",
        ]
        .map(str::to_owned)
        .into();
        let line: Vec<_> = line_of(&children, |m| m == Mark::Lock)
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
        assert_eq!(
            line,
            [
                "_c_a-lock-0000000002",
                "_c_c-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
        let children: Vec<String> = [
            "_c_b-__WRIT__0000000004",
            "_c_a-__READ__0000000001",
            "locks",
            "_c_c-lock-0000000002",
        ]
        .map(str::to_owned)
        .into();
        let marks: Vec<_> = line_of(&children, Mark::is_rw)
            .into_iter()
            .map(|(_, mark, seq)| (mark, seq))
            .collect();
        assert_eq!(marks, [(Mark::Read, 1), (Mark::Write, 4)]);
    }

    #[test]
    fn protected_prefixes_look_like_curators() {
        let p = protected_prefix(LOCK_NAME).unwrap();
        assert!(p.starts_with("_c_") && p.ends_with("-lock-"), "{p}");
        assert_eq!(p.len(), "_c_".len() + 36 + "-lock-".len());
        // A uuid's shape, 8-4-4-4-12 hex digits.
        let groups: Vec<_> = p[3..39].split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{p}");
        assert!(
            p[3..39].bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()),
            "{p}"
        );
        assert_ne!(p, protected_prefix(LOCK_NAME).unwrap());
        assert!(protected_prefix(READ_NAME).unwrap().ends_with("-__READ__"));
    }

    #[test]
    fn leases_record_their_permits() {
        assert_eq!(permits_of(permits_data(3).as_bytes()), Some(3));
        assert_eq!(permits_of(b""), None);
        assert_eq!(permits_of(b"10.0.0.1"), None);
        assert_eq!(semaphore(Some(2)), "semaphore of 2 permits");
        assert_eq!(semaphore(None), "semaphore");
    }
}
