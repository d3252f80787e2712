//! Semaphores and read/write locks in Curator's layouts: a permit's place in its semaphore's
//! internal line and its lease (`InterProcessSemaphoreV2`), the check that a key is not held as
//! another kind, and what holds a key, for an operator. A reader's and a writer's place in line
//! (`InterProcessReadWriteLock`) is the mutex's look at the line ([`ZooKeeperBackend::place`]).

use zookeeper_client::{
    Acls, CreateMode, MultiReadResult, MultiWriteError, MultiWriteResult, Stat,
};

use super::{
    Failure, Known, Place, Session, WaitOn, ZooKeeperBackend, ended, error, fence_of,
    layout::{self, LEASES, LOCKS, Mark},
    read_holder,
};
use crate::{LockInfo, LockKind, backend::api::Token, error::BackendError};

/// One read of a multi-read.
enum Read<'a> {
    Children(&'a str),
    Data(&'a str),
}

/// The children one read of a multi-read found; `None` when the node does not exist.
fn children_of(result: Option<MultiReadResult>) -> Result<Option<Vec<String>>, BackendError> {
    match result {
        Some(MultiReadResult::Children { children }) => Ok(Some(children)),
        Some(MultiReadResult::Error {
            err: zookeeper_client::Error::NoNode,
        }) => Ok(None),
        Some(MultiReadResult::Error { err }) => Err(error("read a node's children", &err)),
        _ => Err(BackendError::new(
            "zookeeper: a multi-read answered something other than children",
        )),
    }
}

/// The data and stat one read of a multi-read found; `None` when the node does not exist.
fn data_of(result: Option<MultiReadResult>) -> Result<Option<(Vec<u8>, Stat)>, BackendError> {
    match result {
        Some(MultiReadResult::Data { data, stat }) => Ok(Some((data, stat))),
        Some(MultiReadResult::Error {
            err: zookeeper_client::Error::NoNode,
        }) => Ok(None),
        Some(MultiReadResult::Error { err }) => Err(error("read a node", &err)),
        _ => Err(BackendError::new(
            "zookeeper: a multi-read answered something other than data",
        )),
    }
}

/// What the grant's transaction does to the leases' record of the permit count.
#[derive(Clone, Copy)]
enum Record {
    /// There is no `leases` yet: made, with the count.
    Create,
    /// It records another count (or none) and no lease is held: the count is set (at the
    /// version read).
    Set(i32),
    /// It records this count, or none while leases are held (Curator's).
    Keep,
}

/// The name of another kind whose nodes are in a lock node, for a conflict.
fn held_as(mark: Mark) -> String {
    if mark.is_rw() {
        "read/write lock".to_owned()
    } else {
        LockKind::Mutex.to_string()
    }
}

/// What holds a key, for an operator.
pub(super) struct Holding {
    kind: LockKind,
    /// The nodes that hold it, the longest-held first.
    pub(super) paths: Vec<String>,
    /// The first one's data and stat.
    data: Vec<u8>,
    stat: Stat,
    /// The nodes waiting in line.
    pub(super) waiters: usize,
}

impl Holding {
    /// Its kind, how many hold it, and the record of the longest-held.
    pub(super) fn info(&self, key: &str) -> LockInfo {
        let mut info = LockInfo::new(key.to_owned());
        info.kind = self.kind;
        info.holders = self.paths.len();
        info.holder = read_holder(&self.data, self.stat.ctime);
        info
    }
}

impl ZooKeeperBackend {
    /// Several reads in one request, seen at one state of the tree (ZooKeeper ≥ 3.6).
    async fn read_many(
        &self,
        session: &Session,
        what: &str,
        reads: &[Read<'_>],
    ) -> Result<std::vec::IntoIter<MultiReadResult>, Failure> {
        let mut reader = session.client.new_multi_reader();
        for read in reads {
            let added = match read {
                Read::Children(path) => reader.add_get_children(path),
                Read::Data(path) => reader.add_get_data(path),
            };
            added.map_err(|e| Failure::Zk(e, what.to_owned()))?;
        }
        self.conn
            .call(what, reader.commit())
            .await
            .map(Vec::into_iter)
    }

    /// Where a permit's acquisition (`node` in its semaphore's internal line, `known.dir`)
    /// stands, from one read of that line, the lock node's children and the leases. Curator's
    /// `InterProcessSemaphoreV2`: only the first in the internal line adds a lease, once fewer
    /// than `permits` are held; until then it keeps its place there, watching the leases. The
    /// lease is made and the node in line deleted in one transaction, whose zxid is the fence:
    /// grants are made one at a time, in line order, so fences increase with them.
    pub(super) async fn permit_place(
        &self,
        session: &Session,
        token: &Token,
        known: &Known,
        node: &str,
        permits: u32,
    ) -> Result<Place, BackendError> {
        let leases = format!("{}/{LEASES}", known.root);
        let mut checked = known.checked;
        // The leases' container may be removed (empty) or made by another between the read
        // and the transaction: a few rounds, then an error.
        for _ in 0..4 {
            let reads = [
                Read::Children(&known.dir),
                Read::Children(&known.root),
                Read::Data(&leases),
                Read::Children(&leases),
            ];
            let mut read = match self.read_many(session, "read the semaphore", &reads).await {
                Ok(read) => read,
                Err(e) if e.zk().is_some_and(ended) => return Ok(Place::Gone),
                Err(e) => return Err(e.into_error(&self.conn)),
            };
            let line = children_of(read.next())?;
            let root = children_of(read.next())?.unwrap_or_default();
            let record = data_of(read.next())?;
            let held = children_of(read.next())?.unwrap_or_default();
            if self.lease_was_made(token, &held) {
                return self.renew_lease(session, token).await;
            }
            let line = line.unwrap_or_default();
            let line = layout::line_of(&line, |m| m == Mark::Lock);
            let Some(mine) = line.iter().position(|(c, _, _)| *c == node) else {
                return Ok(Place::Gone);
            };
            if !checked {
                // The first look after its node was made: a mutex or read/write lock there
                // refuses it (and one made later finds this node in `locks`, and refuses).
                if let Some((mark, _)) = root.iter().find_map(|c| layout::parse(c)) {
                    return Ok(Place::Conflict(held_as(mark)));
                }
                if let Some(entry) = self.entries().get_mut(&token.0) {
                    entry.checked = true;
                }
                checked = true;
            }
            if let Some((ahead, _, _)) = mine.checked_sub(1).map(|i| line[i]) {
                return Ok(Place::Behind(WaitOn::Node(format!(
                    "{}/{ahead}",
                    known.dir
                ))));
            }
            // First in the internal line: no other acquisition adds a lease meanwhile.
            let record = match &record {
                None => Record::Create,
                Some((data, _)) if layout::permits_of(data) == Some(permits) => Record::Keep,
                Some((_, stat)) if held.is_empty() => Record::Set(stat.version),
                Some((data, _)) => match layout::permits_of(data) {
                    Some(other) => return Ok(Place::Conflict(layout::semaphore(Some(other)))),
                    None => Record::Keep,
                },
            };
            let most = usize::try_from(permits).unwrap_or(usize::MAX);
            if held.len() >= most {
                return Ok(Place::Behind(WaitOn::Leases {
                    path: leases,
                    permits: most,
                }));
            }
            if let Some(place) = self
                .take_lease(session, token, known, node, &leases, (record, permits))
                .await?
            {
                return Ok(place);
            }
        }
        Err(BackendError::new(
            "zookeeper: the semaphore's leases kept changing while a permit was taken",
        ))
    }

    /// Whether the grant's transaction, sent by an earlier attempt whose reply was lost, made
    /// the lease (found by its uuid among `held`); settles what the entry knows either way (the
    /// read came after the transaction on the same session, so it shows its outcome). Made:
    /// the lease is the entry's, and its node in line went with it.
    fn lease_was_made(&self, token: &Token, held: &[String]) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return false;
        };
        let Some(lease) = entry.lease.as_mut().filter(|l| l.sent && l.node.is_none()) else {
            return false;
        };
        lease.sent = false;
        let Some(found) = held.iter().find(|c| c.starts_with(&lease.protected)) else {
            return false;
        };
        lease.node = Some(found.clone());
        entry.node = None;
        true
    }

    /// A permit whose grant the caller never learnt: its lease re-written for a new fence.
    pub(super) async fn renew_lease(
        &self,
        session: &Session,
        token: &Token,
    ) -> Result<Place, BackendError> {
        let path = self
            .entries()
            .get(&token.0)
            .and_then(super::Entry::held_path);
        match path {
            Some(path) => self.renew_node(session, &path).await,
            None => Ok(Place::Gone),
        }
    }

    /// The grant's transaction: the leases' record of the permit count when it needs one, the
    /// lease, and the node in the internal line re-written (its zxid, the transaction's, is the
    /// fence) and deleted. `None` when the leases changed since they were read: look again.
    async fn take_lease(
        &self,
        session: &Session,
        token: &Token,
        known: &Known,
        node: &str,
        leases: &str,
        (record, permits): (Record, u32),
    ) -> Result<Option<Place>, BackendError> {
        const WHAT: &str = "take a permit";
        let protected = {
            let mut entries = self.entries();
            let Some(lease) = entries.get_mut(&token.0).and_then(|e| e.lease.as_mut()) else {
                return Ok(Some(Place::Gone));
            };
            // Until a definite answer, the lease may exist.
            lease.sent = true;
            lease.protected.clone()
        };
        let acls = Acls::anyone_all();
        let identity = self.identity.as_str().as_bytes();
        let count = layout::permits_data(permits);
        let lock = format!("{}/{node}", known.dir);
        let mut txn = session.client.new_multi_writer();
        let built = (|| {
            match record {
                Record::Create => txn.add_create(
                    leases,
                    count.as_bytes(),
                    &CreateMode::Container.with_acls(acls),
                )?,
                Record::Set(version) => {
                    txn.add_set_data(leases, count.as_bytes(), Some(version))?
                }
                Record::Keep => {}
            }
            txn.add_create(
                &format!("{leases}/{protected}"),
                identity,
                &CreateMode::EphemeralSequential.with_acls(acls),
            )?;
            txn.add_set_data(&lock, identity, None)?;
            txn.add_delete(&lock, None)
        })();
        if let Err(e) = built {
            self.settle_lease(token, None);
            return Err(error(WHAT, &e));
        }
        let outcome = tokio::time::timeout(self.conn.request_timeout, txn.commit()).await;
        match outcome {
            Ok(Ok(results)) => {
                let mut lease = None;
                let mut zxid = None;
                for result in &results {
                    match result {
                        // The lease (not `leases`, when the transaction made it too).
                        MultiWriteResult::Create { path, .. } => {
                            if let Some(name) =
                                path.strip_prefix(leases).and_then(|p| p.strip_prefix('/'))
                            {
                                lease = Some(name.to_owned());
                            }
                        }
                        MultiWriteResult::SetData { stat } => zxid = Some(stat.mzxid),
                        _ => {}
                    }
                }
                let (Some(lease), Some(zxid)) = (lease, zxid) else {
                    return Err(BackendError::new(
                        "zookeeper: the grant's transaction answered without its lease",
                    ));
                };
                self.settle_lease(token, Some(lease));
                Ok(Some(Place::First(fence_of(zxid))))
            }
            // Refused as a whole: nothing was written.
            Ok(Err(MultiWriteError::OperationFailed { source, .. })) => {
                self.settle_lease(token, None);
                match source {
                    zookeeper_client::Error::NoNode
                    | zookeeper_client::Error::NodeExists
                    | zookeeper_client::Error::BadVersion => Ok(None),
                    e if ended(&e) => Ok(Some(Place::Gone)),
                    e => Err(error(WHAT, &e)),
                }
            }
            // With its session, the lease would be gone too.
            Ok(Err(MultiWriteError::RequestFailed { source })) if ended(&source) => {
                Ok(Some(Place::Gone))
            }
            // The reply is lost: the lease may exist. The next attempt (or the give-up) looks
            // for it by its uuid.
            Ok(Err(MultiWriteError::RequestFailed { source })) => Err(error(WHAT, &source)),
            Err(_) => Err(self.conn.timeout_error(WHAT)),
        }
    }

    /// The grant's transaction answered: it made `lease` (and deleted the node in line), or
    /// nothing.
    fn settle_lease(&self, token: &Token, made: Option<String>) {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&token.0) else {
            return;
        };
        if made.is_some() {
            entry.node = None;
        }
        if let Some(lease) = entry.lease.as_mut() {
            lease.sent = false;
            lease.node = made;
        }
    }

    /// Why the key whose lock node is `root` cannot be taken as `mark`'s kind, at the first
    /// look after the acquisition's node (sequence `mine`) was made: nodes of the other kind
    /// of the lock node's line ahead of it (a mutex's, or a reader's or writer's: one made
    /// after it refuses itself instead), or a semaphore's nodes in `locks` or `leases`. No
    /// request is made unless a semaphore's containers are there.
    pub(super) async fn other_kind(
        &self,
        session: &Session,
        root: &str,
        children: &[String],
        mark: Mark,
        mine: i64,
    ) -> Result<Option<String>, BackendError> {
        let ahead = children
            .iter()
            .filter_map(|c| layout::parse(c))
            .find(|(m, seq)| m.is_rw() != mark.is_rw() && *seq < mine);
        if let Some((other, _)) = ahead {
            return Ok(Some(held_as(other)));
        }
        if !children.iter().any(|c| c == LOCKS || c == LEASES) {
            return Ok(None);
        }
        let (locks, leases) = (format!("{root}/{LOCKS}"), format!("{root}/{LEASES}"));
        let reads = [
            Read::Children(&locks),
            Read::Children(&leases),
            Read::Data(&leases),
        ];
        let mut read = (self
            .read_many(session, "look for a semaphore", &reads)
            .await)
            .map_err(|e| e.into_error(&self.conn))?;
        let waiting = children_of(read.next())?.unwrap_or_default();
        let held = children_of(read.next())?.unwrap_or_default();
        let record = data_of(read.next())?;
        // Empty containers are what a semaphore left; the server removes them.
        Ok((!waiting.is_empty() || !held.is_empty())
            .then(|| layout::semaphore(record.and_then(|(data, _)| layout::permits_of(&data)))))
    }

    /// What holds the key whose lock node is `root`: a mutex's first node, a read/write lock's
    /// writer first in line or its readers before any writer, a semaphore's leases; `None` when
    /// nothing holds it.
    pub(super) async fn holding(
        &self,
        session: &Session,
        root: &str,
    ) -> Result<Option<Holding>, BackendError> {
        // A holder that leaves between the listing and the read: look again.
        for _ in 0..3 {
            let children = match self
                .conn
                .call("read the lock's line", session.client.list_children(root))
                .await
            {
                Ok(children) => children,
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => return Ok(None),
                Err(e) => return Err(e.into_error(&self.conn)),
            };
            let Some((kind, paths, waiters)) = self.holds(session, root, &children).await? else {
                return Ok(None);
            };
            match self
                .conn
                .call("read the holder's node", session.client.get_data(&paths[0]))
                .await
            {
                Ok((data, stat)) => {
                    return Ok(Some(Holding {
                        kind,
                        paths,
                        data,
                        stat,
                        waiters,
                    }));
                }
                Err(Failure::Zk(zookeeper_client::Error::NoNode, _)) => {}
                Err(e) => return Err(e.into_error(&self.conn)),
            }
        }
        Err(BackendError::new(
            "zookeeper: the lock's holder kept changing while it was read",
        ))
    }

    /// The kind, the holding nodes (none: `None`) and the waiters of the lock node `root`
    /// with `children`.
    async fn holds(
        &self,
        session: &Session,
        root: &str,
        children: &[String],
    ) -> Result<Option<(LockKind, Vec<String>, usize)>, BackendError> {
        let path = |c: &str| format!("{root}/{c}");
        let mutex = layout::line_of(children, |m| m == Mark::Lock);
        if let Some((first, _, _)) = mutex.first() {
            return Ok(Some((LockKind::Mutex, vec![path(first)], mutex.len() - 1)));
        }
        let rw = layout::line_of(children, Mark::is_rw);
        if let Some((_, first, _)) = rw.first() {
            let (kind, n) = if *first == Mark::Write {
                (LockKind::Write, 1)
            } else {
                let readers = rw.iter().take_while(|(_, m, _)| *m == Mark::Read).count();
                (LockKind::Read, readers)
            };
            let paths = rw[..n].iter().map(|(c, _, _)| path(c)).collect();
            return Ok(Some((kind, paths, rw.len() - n)));
        }
        if !children.iter().any(|c| c == LOCKS || c == LEASES) {
            return Ok(None);
        }
        let (locks, leases) = (path(LOCKS), path(LEASES));
        let reads = [
            Read::Data(&leases),
            Read::Children(&leases),
            Read::Children(&locks),
        ];
        let mut read = (self.read_many(session, "read the semaphore", &reads).await)
            .map_err(|e| e.into_error(&self.conn))?;
        let record = data_of(read.next())?;
        let mut held = children_of(read.next())?.unwrap_or_default();
        let waiters = children_of(read.next())?.map_or(0, |c| c.len());
        if held.is_empty() {
            return Ok(None);
        }
        held.sort_by_key(|c| layout::lease_sequence(c).unwrap_or(i64::MAX));
        // A semaphore Curator made records no count: at least as many permits as are held.
        let permits = (record.and_then(|(data, _)| layout::permits_of(&data)))
            .unwrap_or_else(|| u32::try_from(held.len()).unwrap_or(u32::MAX));
        let paths = held.iter().map(|c| format!("{leases}/{c}")).collect();
        Ok(Some((LockKind::Semaphore { permits }, paths, waiters)))
    }
}
