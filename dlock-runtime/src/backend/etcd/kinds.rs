//! The kinds of lock in one line of keys, told apart by the name after the line: a mutex's key
//! is the lease and a number (`<lease>-<n>`, or `etcdctl lock`'s `<lease>`), a semaphore's
//! `sem/<permits>/<lease>-<n>`, a read/write lock's `read/<lease>-<n>` and `write/<lease>-<n>`
//! (the layout of etcd's own `recipe.RWMutex`, under the same line).
//!
//! A key of one kind only ever stays in a line behind keys of its own kind: every acquisition
//! looks at the first key(s) of the line when it joins and leaves with a conflict when they are
//! of another kind. So a line's first key says what the lock is.

use crate::LockKind;

/// The shape of an acquisition's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    Mutex,
    Permits(u32),
    Read,
    Write,
}

impl Shape {
    pub(super) fn of(kind: LockKind) -> Self {
        match kind {
            LockKind::Semaphore { permits } => Self::Permits(permits),
            LockKind::Read => Self::Read,
            LockKind::Write => Self::Write,
            _ => Self::Mutex,
        }
    }

    /// What follows the line before the key's own name.
    pub(super) fn sub_prefix(self) -> String {
        match self {
            Self::Mutex => String::new(),
            Self::Permits(permits) => format!("sem/{permits}/"),
            Self::Read => "read/".to_owned(),
            Self::Write => "write/".to_owned(),
        }
    }

    /// The shape of a key in `line`, by its name.
    pub(super) fn of_key(line: &str, key: &str) -> Self {
        let name = key.strip_prefix(line).unwrap_or(key);
        if let Some(rest) = name.strip_prefix("sem/")
            && let Some((permits, _)) = rest.split_once('/')
        {
            return Self::Permits(permits.parse().unwrap_or(0));
        }
        if name.starts_with("read/") {
            Self::Read
        } else if name.starts_with("write/") {
            Self::Write
        } else {
            Self::Mutex
        }
    }

    /// A lock held with keys of this shape, in words.
    pub(super) fn held_as(self) -> String {
        match self {
            Self::Mutex => "a mutex".to_owned(),
            Self::Permits(permits) => format!("a semaphore of {permits} permits"),
            Self::Read | Self::Write => "a read/write lock".to_owned(),
        }
    }

    /// Whether a key of shape `other` may be in line with keys of this shape.
    pub(super) fn mixes_with(self, other: Self) -> bool {
        match self {
            Self::Mutex => other == Self::Mutex,
            Self::Permits(_) => other == self,
            Self::Read | Self::Write => matches!(other, Self::Read | Self::Write),
        }
    }

    /// The conflict of an acquisition of this shape with a line whose keys include `other`
    /// (ahead of it): why, or `None` when they mix.
    pub(super) fn conflict(self, other: Self) -> Option<String> {
        (!self.mixes_with(other)).then(|| {
            format!(
                "it is held as {}, and this acquisition asks for {}",
                other.held_as(),
                match self {
                    Self::Read => "a read lock".to_owned(),
                    Self::Write => "a write lock".to_owned(),
                    shape => shape.held_as(),
                }
            )
        })
    }

    /// What an operator is told the lock is, from its first key.
    pub(super) fn kind(self) -> LockKind {
        match self {
            Self::Mutex => LockKind::Mutex,
            Self::Permits(permits) => LockKind::Semaphore { permits },
            Self::Read => LockKind::Read,
            Self::Write => LockKind::Write,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_told_by_name() {
        let line = "dlock:k/";
        assert_eq!(Shape::of_key(line, "dlock:k/694d-1"), Shape::Mutex);
        assert_eq!(Shape::of_key(line, "dlock:k/694d"), Shape::Mutex);
        assert_eq!(
            Shape::of_key(line, "dlock:k/sem/3/694d-1"),
            Shape::Permits(3)
        );
        assert_eq!(Shape::of_key(line, "dlock:k/read/694d-1"), Shape::Read);
        assert_eq!(Shape::of_key(line, "dlock:k/write/694d-1"), Shape::Write);
        for shape in [Shape::Mutex, Shape::Permits(2), Shape::Read, Shape::Write] {
            let key = format!("{line}{}694d-1", shape.sub_prefix());
            assert_eq!(Shape::of_key(line, &key), shape);
        }
        assert!(Shape::Read.mixes_with(Shape::Write));
        assert!(!Shape::Permits(2).mixes_with(Shape::Permits(3)));
        assert!(Shape::Mutex.conflict(Shape::Read).is_some());
        assert!(Shape::Permits(2).conflict(Shape::Permits(2)).is_none());
    }
}
