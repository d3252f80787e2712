//! A local Redis Cluster for the `redis+cluster://` engine: six `redis-server` processes in
//! cluster mode (3 masters, 3 replicas) on free loopback ports, with the faults the tests need
//! (a master killed and its replica promoted, a slot migrated while locks live in it).

use std::{
    fs::File,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use super::{
    INSTALL_REDIS, RedisServer, free_port,
    resp::{self, RedisResult, Value, command_at, info_field},
};

/// How to install `redis-cli` (Debian ships it with `redis-server`), printed when it is missing.
const INSTALL_REDIS_CLI: &str = "redis-cli not found on PATH: install it with `sudo apt-get install -y redis-server` (or run .ci/run, which does)";

/// How long [`RedisCluster::start`] may take before it gives up.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How long [`RedisCluster::finish_migration`] waits for every node to learn the slot's owner.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);

/// The pause between two polls of the cluster's state.
const POLL: Duration = Duration::from_millis(50);

/// The number of hash slots of a Redis Cluster.
const SLOTS: u32 = 16384;

/// What one node's `CLUSTER NODES` says, comparable with another's: per node, sorted, its
/// port, its master's port (for a replica), whether it is flagged failing, and its slots.
type Topology = Vec<(u16, Option<u16>, bool, Vec<(u16, u16)>)>;

/// A Redis Cluster of 3 masters and 3 replicas owned by this program (a test, an example),
/// stopped on drop.
///
/// # Behavior
/// - **Start**: six `redis-server --cluster-enabled yes` (no persistence, `cluster-node-timeout`
///   1s, replicas always allowed to fail over), joined by `redis-cli --cluster create
///   --cluster-replicas 1`; [`start`](Self::start) returns once every node reports
///   `cluster_state:ok`, knows the six nodes and all 16384 slots, and every replica's link to its
///   master is up.
/// - **Kill**: [`kill`](Self::kill) SIGKILLs a node. A killed master is marked failing after
///   about 1s and its replica promoted a second or two later ([`wait_until_master`],
///   [`wait_ok`]). Killed nodes stay dead.
/// - **Drop**: every node is killed and its directory removed, also when [`start`](Self::start)
///   panics half-way.
///
/// [`wait_until_master`]: Self::wait_until_master
/// [`wait_ok`]: Self::wait_ok
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The masters at start, in slot order: the seeds of [`url`](Self::url).
    seeds: Vec<u16>,
    killed: Vec<u16>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Node {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The id of its master, for a replica.
    master: Option<String>,
    /// Slot ranges it serves (inclusive); migration markers (`[slot->-id]`) left out.
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
    }
}

impl RedisCluster {
    /// `true` when `redis-server` and `redis-cli` (which joins the nodes) are on `PATH`.
    #[must_use]
    pub fn available() -> bool {
        super::installed("redis-server") && super::installed("redis-cli")
    }

    /// Starts six nodes, makes them a cluster of 3 masters with one replica each, and waits
    /// (up to 30s in all) until it is healthy.
    ///
    /// # Panics
    /// When `redis-server` or `redis-cli` is not installed (with the install command), or the
    /// cluster is not healthy in time (with what was still wrong).
    #[must_use]
    pub fn start() -> Self {
        let deadline = Instant::now() + START_WITHIN;
        let mut cluster = Self {
            nodes: Vec::with_capacity(6),
            seeds: Vec::new(),
            killed: Vec::new(),
        };
        // Filled one by one: a panic below drops `cluster`, which stops what was started.
        for _ in 0..6 {
            cluster.nodes.push(start_node());
        }
        cluster.create(deadline);
        while let Err(e) = cluster.health() {
            assert!(
                Instant::now() < deadline,
                "Redis Cluster not healthy within {START_WITHIN:?}: {e}"
            );
            sleep(POLL);
        }
        let mut masters: Vec<Node> = cluster
            .view()
            .into_iter()
            .filter(|n| n.is_master() && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.slots[0].0);
        cluster.seeds = masters.iter().map(|n| n.port).collect();
        cluster
    }

    /// Runs `redis-cli --cluster create` over the six nodes, killing it at `deadline`.
    fn create(&self, deadline: Instant) {
        let log_path = std::env::temp_dir().join(format!(
            "dlock-cluster-create-{}-{}.log",
            std::process::id(),
            self.nodes[0].port()
        ));
        let log = File::create(&log_path).expect("create the redis-cli log file");
        let spawned = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file"))
            .stderr(log)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_file(&log_path);
                if e.kind() == std::io::ErrorKind::NotFound {
                    panic!("{INSTALL_REDIS_CLI}");
                }
                panic!("could not run redis-cli: {e}");
            }
        };
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            sleep(POLL);
        };
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        let _ = std::fs::remove_file(&log_path);
        match status {
            Some(status) if status.success() => {}
            Some(status) => panic!("redis-cli --cluster create failed ({status}):\n{output}"),
            None => panic!(
                "redis-cli --cluster create did not finish within {START_WITHIN:?}:\n{output}"
            ),
        }
    }

    /// `Ok` when the cluster is what [`start`](Self::start) promises, else what is not.
    fn health(&self) -> Result<(), String> {
        let mut masters = 0;
        for node in &self.nodes {
            let port = node.port();
            let info = text(port, &["CLUSTER", "INFO"])
                .ok_or_else(|| format!("node {port} did not answer CLUSTER INFO"))?;
            let slots = SLOTS.to_string();
            for (field, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", &slots),
                ("cluster_slots_ok", &slots),
                ("cluster_known_nodes", "6"),
            ] {
                let got = info_field(&info, field);
                if got != Some(want) {
                    return Err(format!("node {port}: {field} is {got:?}, not {want}"));
                }
            }
            let replication = text(port, &["INFO", "replication"])
                .ok_or_else(|| format!("node {port} did not answer INFO"))?;
            match info_field(&replication, "role") {
                Some("master") => masters += 1,
                Some("slave") => {
                    let link = info_field(&replication, "master_link_status");
                    if link != Some("up") {
                        return Err(format!("replica {port}: master_link_status is {link:?}"));
                    }
                }
                other => return Err(format!("node {port}: role {other:?}")),
            }
        }
        if masters != 3 {
            return Err(format!("{masters} masters, not 3"));
        }
        let view = self.agreed_view()?;
        let serving = view
            .iter()
            .filter(|n| n.is_master() && !n.slots.is_empty())
            .count();
        let replicas = view.iter().filter(|n| n.master.is_some()).count();
        if serving != 3 || replicas != 3 || view.iter().any(Node::is_failing) {
            return Err(format!(
                "CLUSTER NODES shows {serving} masters with slots and {replicas} replicas"
            ));
        }
        Ok(())
    }

    /// The `CLUSTER NODES` of the live nodes when they all say the same of every node (role,
    /// master, failing or not, slots), else which two differ.
    fn agreed_view(&self) -> Result<Vec<Node>, String> {
        let mut first: Option<(u16, Vec<Node>, Topology)> = None;
        for port in self.live() {
            let view = nodes_of(port).ok_or_else(|| format!("node {port}: no CLUSTER NODES"))?;
            let topology = topology(&view);
            match &first {
                None => first = Some((port, view, topology)),
                Some((other, _, seen)) if *seen != topology => {
                    return Err(format!(
                        "nodes {other} and {port} disagree on the cluster: {seen:?} != {topology:?}"
                    ));
                }
                Some(_) => {}
            }
        }
        first
            .map(|(_, view, _)| view)
            .ok_or_else(|| "no live node".to_owned())
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`: the three masters at start.
    #[must_use]
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .seeds
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The six nodes, killed ones included, in start order (not by role).
    #[must_use]
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node on `port`.
    ///
    /// # Panics
    /// When no node of this cluster listens on `port`.
    #[must_use]
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// The ports of the nodes not killed.
    #[must_use]
    pub fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(RedisServer::port)
            .filter(|p| !self.killed.contains(p))
            .collect()
    }

    /// The current masters (sorted ports) as `CLUSTER NODES` of a live node names them, less
    /// those it flags failing (`fail` or `fail?`). A master killed less than about a second ago
    /// is not flagged yet.
    #[must_use]
    pub fn masters(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .view()
            .iter()
            .filter(|n| n.is_master() && !n.is_failing())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The master that serves `slot`, as a live node's `CLUSTER NODES` says (during a migration:
    /// the source, until [`finish_migration`](Self::finish_migration)).
    ///
    /// # Panics
    /// When no master serves `slot`.
    #[must_use]
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.view()
            .iter()
            .find(|n| n.is_master() && n.serves(slot))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked from a live node).
    ///
    /// # Panics
    /// When no live node answers.
    #[must_use]
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.any_live();
        match command_at(port, &["CLUSTER", "KEYSLOT", key]) {
            Ok(Value::Int(slot)) => u16::try_from(slot).expect("a slot fits u16"),
            other => panic!("CLUSTER KEYSLOT {key} on {port}: {other:?}"),
        }
    }

    /// A replica of the master on `master_port` (one not flagged failing when there is one).
    ///
    /// # Panics
    /// When that node is not a master or has no replica.
    #[must_use]
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let view = self.view();
        let master = view
            .iter()
            .find(|n| n.port == master_port && n.is_master())
            .unwrap_or_else(|| panic!("node {master_port} is not a master"));
        let mut replicas: Vec<&Node> = view
            .iter()
            .filter(|n| n.master.as_deref() == Some(master.id.as_str()))
            .collect();
        replicas.sort_by_key(|n| n.is_failing());
        replicas
            .first()
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("master {master_port} has no replica"))
    }

    /// Kills the node on `port` (SIGKILL) and waits for it to exit. It stays dead.
    ///
    /// # Panics
    /// When no node of this cluster listens on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"));
        node.kill();
        if !self.killed.contains(&port) {
            self.killed.push(port);
        }
    }

    /// Waits until the node on `port` reports `role:master` (a replica promoted after its
    /// master was killed), polling for up to `within`; `false` if it has not by then.
    #[must_use]
    pub fn wait_until_master(&self, port: u16, within: Duration) -> bool {
        poll_until(within, || {
            text(port, &["INFO", "replication"])
                .is_some_and(|info| info_field(&info, "role") == Some("master"))
        })
    }

    /// Waits until every live node reports `cluster_state:ok` and they all say the same of every
    /// node (role, master, failing or not, slots), polling for up to `within`; `false` if not by
    /// then.
    #[must_use]
    pub fn wait_ok(&self, within: Duration) -> bool {
        poll_until(within, || {
            self.live().into_iter().all(|port| {
                text(port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| info_field(&info, "cluster_state") == Some("ok"))
            }) && self.agreed_view().is_ok()
        })
    }

    /// Moves `slot` with its keys to the master on `to_master_port`, online, the way
    /// `redis-cli --cluster reshard` does: [`begin_migration`](Self::begin_migration), then
    /// [`finish_migration`](Self::finish_migration).
    ///
    /// # Panics
    /// When a step fails, or `to_master_port` already serves `slot`.
    pub fn migrate_slot(&self, slot: u16, to_master_port: u16) {
        self.begin_migration(slot, to_master_port);
        self.finish_migration(slot, to_master_port);
    }

    /// Marks `slot` importing on `to_master_port` and migrating on the master that serves it,
    /// and moves no key. Until [`finish_migration`](Self::finish_migration), the source answers
    /// for the keys it still holds and `-ASK`-redirects commands on the others to the target;
    /// [`move_keys`](Self::move_keys) moves what it holds.
    ///
    /// # Panics
    /// When a command fails, or `to_master_port` already serves `slot` or is not a master.
    pub fn begin_migration(&self, slot: u16, to_master_port: u16) {
        let view = self.view();
        let (source, target) = source_and_target(&view, slot, to_master_port);
        let slot = slot.to_string();
        expect_ok(
            target.port,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source.id],
        );
        expect_ok(
            source.port,
            &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target.id],
        );
    }

    /// Moves the keys of `slot` that the source still holds to `to_master_port` (`CLUSTER
    /// GETKEYSINSLOT`, then `MIGRATE … KEYS` in batches of 100) and returns how many it moved.
    /// Meant for a slot between [`begin_migration`](Self::begin_migration) and
    /// [`finish_migration`](Self::finish_migration).
    ///
    /// # Panics
    /// When a command fails.
    pub fn move_keys(&self, slot: u16, to_master_port: u16) -> usize {
        let view = self.view();
        let (source, target) = source_and_target(&view, slot, to_master_port);
        let slot = slot.to_string();
        let mut moved = 0;
        loop {
            let reply = command_at(source.port, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<String> = match reply.as_ref().ok().and_then(resp::items) {
                Some(items) => items.iter().filter_map(resp::text).collect(),
                None => panic!("CLUSTER GETKEYSINSLOT {slot} on {}: {reply:?}", source.port),
            };
            if keys.is_empty() {
                return moved;
            }
            let port = target.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            match command_at(source.port, &args) {
                Ok(Value::Okay) => moved += keys.len(),
                Ok(Value::SimpleString(s)) if s == "NOKEY" => moved += keys.len(),
                other => panic!("MIGRATE of slot {slot} to {port}: {other:?}"),
            }
        }
    }

    /// Ends the migration of `slot` to `to_master_port`: moves the keys left on the source,
    /// assigns the slot to the target with `CLUSTER SETSLOT <slot> NODE <id>` on the target, the
    /// source and the other live masters, and waits (up to 10s) until every live node agrees.
    ///
    /// # Panics
    /// When a command fails or the nodes do not agree in time.
    pub fn finish_migration(&self, slot: u16, to_master_port: u16) {
        self.move_keys(slot, to_master_port);
        let view = self.view();
        let (source, target) = source_and_target(&view, slot, to_master_port);
        let slot_arg = slot.to_string();
        let assign = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target.id];
        expect_ok(target.port, &assign);
        expect_ok(source.port, &assign);
        let live = self.live();
        for other in &view {
            let is_other_master = other.is_master() && other.port != source.port;
            if is_other_master && other.port != target.port && live.contains(&other.port) {
                expect_ok(other.port, &assign);
            }
        }
        let settled = poll_until(SETTLE_WITHIN, || {
            self.live().into_iter().all(|port| {
                nodes_of(port).is_some_and(|view| {
                    view.iter()
                        .any(|n| n.port == to_master_port && n.is_master() && n.serves(slot))
                })
            })
        });
        assert!(
            settled,
            "the nodes did not all learn within {SETTLE_WITHIN:?} that {to_master_port} serves slot {slot}"
        );
    }

    /// Sends one command to the node on `port` over a fresh connection (see
    /// [`RedisServer::command`]).
    ///
    /// # Errors
    /// The node's error reply (`MOVED …`, `ASK …`), or the connection's failure.
    pub fn command(&self, port: u16, args: &[&str]) -> RedisResult<Value> {
        command_at(port, args)
    }

    /// `CLUSTER NODES` of the first live node that answers.
    fn view(&self) -> Vec<Node> {
        self.live()
            .into_iter()
            .find_map(nodes_of)
            .expect("a live cluster node answers CLUSTER NODES")
    }

    fn any_live(&self) -> u16 {
        *self.live().first().expect("a live cluster node")
    }
}

/// A cluster-enabled node on a free port with its own free bus port, retried when either port
/// was taken before the server bound it.
fn start_node() -> RedisServer {
    let mut last = String::new();
    for _ in 0..3 {
        let bus = free_port().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "1000",
            // Any replica may fail over, however long ago it last heard from its master.
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-allow-replica-migration",
            "no",
            "--cluster-allow-reads-when-down",
            "no",
            "--cluster-require-full-coverage",
            "yes",
            // Full syncs start at once instead of waiting 5s for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ];
        match RedisServer::start_once(&args) {
            Ok(server) => return server,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{e}"),
            Err(e) => last = e.to_string(),
        }
    }
    panic!("{last}\n({INSTALL_REDIS})");
}

/// The source (current owner) and target nodes of moving `slot` to `to`.
fn source_and_target(view: &[Node], slot: u16, to: u16) -> (&Node, &Node) {
    let source = view
        .iter()
        .find(|n| n.is_master() && n.serves(slot))
        .unwrap_or_else(|| panic!("no master serves slot {slot}"));
    let target = view
        .iter()
        .find(|n| n.port == to && n.is_master())
        .unwrap_or_else(|| panic!("node {to} is not a master"));
    assert_ne!(source.port, to, "node {to} already serves slot {slot}");
    (source, target)
}

/// `view` in a form two nodes' views can be compared in.
fn topology(view: &[Node]) -> Topology {
    let port_of = |id: &str| view.iter().find(|n| n.id == id).map_or(0, |n| n.port);
    let mut topology: Topology = view
        .iter()
        .map(|n| {
            let master = n.master.as_deref().map(port_of);
            (n.port, master, n.is_failing(), n.slots.clone())
        })
        .collect();
    topology.sort_unstable();
    topology
}

/// Parses `CLUSTER NODES` of the node on `port`.
fn nodes_of(port: u16) -> Option<Vec<Node>> {
    let text = text(port, &["CLUSTER", "NODES"])?;
    text.lines().map(parse_node).collect()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`
fn parse_node(line: &str) -> Option<Node> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_owned();
    let address = fields.next()?;
    let port = address
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let flags = fields.next()?.split(',').map(str::to_owned).collect();
    let master = Some(fields.next()?)
        .filter(|&m| m != "-")
        .map(str::to_owned);
    let slots = fields
        .skip(4)
        .filter(|s| !s.starts_with('['))
        .map(|s| match s.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => s.parse().ok().map(|one| (one, one)),
        })
        .collect::<Option<_>>()?;
    Some(Node {
        id,
        port,
        flags,
        master,
        slots,
    })
}

/// The text of a status or bulk reply of the node on `port`.
fn text(port: u16, args: &[&str]) -> Option<String> {
    resp::text(&command_at(port, args).ok()?)
}

fn expect_ok(port: u16, args: &[&str]) {
    let reply = command_at(port, args);
    assert!(
        matches!(reply, Ok(Value::Okay)),
        "{args:?} on {port}: {reply:?}"
    );
}

/// Calls `ready` every [`POLL`] until it is `true` or `within` has passed.
fn poll_until(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_migrates_and_fails_over() {
        let started = Instant::now();
        let mut cluster = RedisCluster::start();
        eprintln!("cluster started in {:?}", started.elapsed());

        let masters = cluster.masters();
        assert_eq!(masters.len(), 3, "{masters:?}");
        let url = cluster.url();
        let hosts = url.strip_prefix("redis+cluster://").unwrap();
        let mut seeds: Vec<u16> = hosts
            .split(',')
            .map(|h| h.strip_prefix("127.0.0.1:").unwrap().parse().unwrap())
            .collect();
        seeds.sort_unstable();
        assert_eq!(seeds, masters, "{url}");
        let slots: u32 = cluster
            .view()
            .iter()
            .flat_map(|n| n.slots.iter().map(|&(lo, hi)| u32::from(hi - lo) + 1))
            .sum();
        assert_eq!(slots, SLOTS);
        for &master in &masters {
            let replica = cluster.replica_of(master);
            assert!(!masters.contains(&replica));
        }

        // A slot moved online: ASK while half-migrated, MOVED once done, the key kept.
        let slot = cluster.slot_of("t");
        let source = cluster.master_of_slot(slot);
        let target = *masters.iter().find(|&&m| m != source).unwrap();
        assert_eq!(
            cluster.command(source, &["SET", "{t}present", "v"]).ok(),
            Some(Value::Okay)
        );
        let started = Instant::now();
        cluster.begin_migration(slot, target);
        assert_eq!(
            cluster.command(source, &["GET", "{t}present"]).ok(),
            Some(Value::BulkString(b"v".to_vec()))
        );
        let ask = cluster.command(source, &["GET", "{t}absent"]).unwrap_err();
        assert_eq!(ask.code(), Some("ASK"));
        assert_eq!(
            ask.redirect_node(),
            Some((&*format!("127.0.0.1:{target}"), slot))
        );
        cluster.finish_migration(slot, target);
        eprintln!("slot migrated in {:?}", started.elapsed());
        assert_eq!(cluster.master_of_slot(slot), target);
        assert_eq!(
            cluster.command(target, &["GET", "{t}present"]).ok(),
            Some(Value::BulkString(b"v".to_vec()))
        );
        let moved = cluster.command(source, &["GET", "{t}present"]).unwrap_err();
        assert_eq!(moved.code(), Some("MOVED"));
        assert_eq!(
            moved.redirect_node(),
            Some((&*format!("127.0.0.1:{target}"), slot))
        );

        // A master killed: its replica takes over.
        let victim = cluster.master_of_slot(0);
        let heir = cluster.replica_of(victim);
        let started = Instant::now();
        cluster.kill(victim);
        assert!(
            cluster.wait_until_master(heir, Duration::from_secs(10)),
            "replica {heir} not promoted within 10s"
        );
        eprintln!("replica promoted in {:?}", started.elapsed());
        assert!(
            cluster.wait_ok(Duration::from_secs(10)),
            "cluster not ok within 10s"
        );
        eprintln!("cluster ok again in {:?}", started.elapsed());
        assert_eq!(cluster.master_of_slot(0), heir);
        let masters = cluster.masters();
        assert!(
            masters.contains(&heir) && !masters.contains(&victim),
            "{masters:?}"
        );
        let ports: Vec<u16> = cluster.nodes().iter().map(RedisServer::port).collect();
        drop(cluster);
        assert!(ports.iter().all(|&p| !crate::ping(p)));
    }
}
