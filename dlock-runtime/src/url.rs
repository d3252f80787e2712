//! Engine URLs: the scheme of one URL (`DLOCK_URL`, [`LockerBuilder::url`](crate::LockerBuilder::url))
//! picks the engine, and multi-host forms list their hosts with commas the way libpq and MongoDB
//! URLs do. Parsing only: no I/O, and no password in any error.

use crate::{
    LockError,
    config::{BackendKind, PostgresUrl, RedisUrl},
};

/// What the recognised schemes are, for error messages.
const EXPECTED: &str = "a URL like `redis://host:port`, `redis+cluster://h1:p1,h2:p2`, \
    `redis+sentinel://s1:p1,s2:p2/<master>`, `redis+redlock://h1:p1,h2:p2,h3:p3`, \
    `postgres://user@host/db`, `zk://h1:p1,h2:p2[/chroot]` or `memory://`";

/// Reads an engine URL. `var` names where it came from (`DLOCK_URL`, …) for the error.
pub(crate) fn parse(var: &str, url: &str) -> Result<BackendKind, LockError> {
    let url = url.trim();
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(LockError::config(format!("{var}: expected {EXPECTED}")));
    };
    match scheme {
        "redis" | "rediss" | "redis+unix" | "unix" => {
            Ok(BackendKind::Redis(RedisUrl::parse(var, url)?))
        }
        "redis+cluster" | "rediss+cluster" => {
            needs(
                var,
                scheme,
                "redis-cluster",
                cfg!(feature = "redis-cluster"),
            )?;
            tls_needs(var, scheme)?;
            HostList::parse(var, url, "redis+cluster://[user:password@]h1:p1,h2:p2")?;
            Ok(BackendKind::RedisCluster(RedisUrl::trusted(url)))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            needs(
                var,
                scheme,
                "redis-sentinel",
                cfg!(feature = "redis-sentinel"),
            )?;
            tls_needs(var, scheme)?;
            let form = "redis+sentinel://[user:password@]s1:p1,s2:p2/<master name>";
            let hosts = HostList::parse(var, url, form)?;
            hosts.master_name(var, form)?;
            Ok(BackendKind::RedisSentinel(RedisUrl::trusted(url)))
        }
        "memory" => Ok(BackendKind::Memory),
        "redis+redlock" | "rediss+redlock" => {
            needs(var, scheme, "redlock", cfg!(feature = "redlock"))?;
            tls_needs(var, scheme)?;
            let form = "redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3";
            HostList::parse(var, url, form)?.redlock_nodes(var)?;
            Ok(BackendKind::RedLock(RedisUrl::trusted(url)))
        }
        "etcd" | "etcds" => {
            needs(var, scheme, "etcd", cfg!(feature = "etcd"))?;
            needs(
                var,
                scheme,
                "tls",
                scheme == "etcd" || cfg!(feature = "tls"),
            )?;
            HostList::parse(var, url, "etcd://[user:password@]h1:p1,h2:p2")?;
            Ok(BackendKind::Etcd(RedisUrl::trusted(url)))
        }
        "zk" => {
            needs(var, scheme, "zookeeper", cfg!(feature = "zookeeper"))?;
            #[cfg(feature = "zookeeper")]
            crate::backend::zookeeper::connect_string(var, url)?;
            Ok(BackendKind::ZooKeeper(url.to_owned()))
        }
        "postgres" | "postgresql" => {
            needs(var, scheme, "postgres", cfg!(feature = "postgres"))?;
            #[cfg(feature = "postgres")]
            crate::backend::postgres::check_url(var, url)?;
            Ok(BackendKind::Postgres(PostgresUrl::trusted(url)))
        }
        _ => Err(LockError::config(format!(
            "{var}: unknown scheme `{scheme}://`; expected {EXPECTED}"
        ))),
    }
}

/// A scheme whose engine is compiled out.
fn needs(var: &str, scheme: &str, feature: &str, enabled: bool) -> Result<(), LockError> {
    if enabled {
        Ok(())
    } else {
        Err(LockError::config(format!(
            "{var}: `{scheme}://` needs dlock-runtime's `{feature}` feature; enable it in Cargo.toml"
        )))
    }
}

fn tls_needs(var: &str, scheme: &str) -> Result<(), LockError> {
    needs(
        var,
        scheme,
        "tls",
        !scheme.starts_with("rediss") || cfg!(feature = "tls"),
    )
}

/// A multi-host URL taken apart: `scheme://[userinfo@]h1:p1,h2:p2[/path][?query]`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct HostList<'a> {
    pub(crate) tls: bool,
    pub(crate) userinfo: Option<&'a str>,
    pub(crate) hosts: Vec<(&'a str, u16)>,
    /// After the hosts, without the leading `/`; may be empty.
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
}

impl<'a> HostList<'a> {
    /// Takes `url` apart; `form` is the expected form, for the error. Errors never show the
    /// URL (it may hold a password).
    pub(crate) fn parse(var: &str, url: &'a str, form: &str) -> Result<Self, LockError> {
        let bad = |why: &str| LockError::config(format!("{var}: {why}; expected `{form}`"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        // The password may hold `/` or `@`: the host list starts after the last `@`.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        if hosts.is_empty() {
            return Err(bad("no host"));
        }
        let hosts = hosts
            .split(',')
            .map(|host| {
                let (name, port) = host
                    .rsplit_once(':')
                    .ok_or_else(|| bad("every host needs a port (`host:port`)"))?;
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("a port is not a number from 1 to 65535"))?;
                if name.is_empty() {
                    return Err(bad("a host name is empty"));
                }
                Ok((name, port))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            tls: scheme.starts_with("rediss"),
            userinfo,
            hosts,
            path,
            query,
        })
    }

    /// The Sentinel master's name: the first path segment, not empty.
    pub(crate) fn master_name(&self, var: &str, form: &str) -> Result<&'a str, LockError> {
        let name = self.path.split('/').next().unwrap_or("");
        if name.is_empty() {
            return Err(LockError::config(format!(
                "{var}: the master name is missing; expected `{form}`"
            )));
        }
        Ok(name)
    }

    /// RedLock's masters: an odd number, at least 3. A majority of 2 nodes is both, so losing
    /// either stops every lock; an even count adds a node without adding a failure the
    /// deployment survives (4 nodes need 3, like 5 do, and survive one loss, like 3 do).
    pub(crate) fn redlock_nodes(&self, var: &str) -> Result<usize, LockError> {
        let n = self.hosts.len();
        if n < 3 {
            return Err(LockError::config(format!(
                "{var}: RedLock needs at least 3 independent masters, got {n}: with fewer, a \
                 majority is every node and losing any one of them stops every lock"
            )));
        }
        if n.is_multiple_of(2) {
            return Err(LockError::config(format!(
                "{var}: RedLock needs an odd number of masters, got {n}: a majority of {n} is \
                 {}, as of {}, so the extra node survives no further failure; use {} or {}",
                n / 2 + 1,
                n + 1,
                n - 1,
                n + 1
            )));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some((host, port)) = self.hosts.iter().find(|h| !seen.insert(**h)) {
            return Err(LockError::config(format!(
                "{var}: RedLock lists {host}:{port} twice: every master must be a different \
                 server, or one server would count as two votes"
            )));
        }
        Ok(n)
    }

    /// `redis://[userinfo@]host:port` (or `rediss://`) for each host, with `path` after it and
    /// the URL's query (`?protocol=resp3`, …), which every node's connection then reads.
    #[cfg(any(
        feature = "redis-cluster",
        feature = "redis-sentinel",
        feature = "redlock"
    ))]
    pub(crate) fn node_urls(&self, path: &str) -> Vec<String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = self.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let query = self.query.map(|q| format!("?{q}")).unwrap_or_default();
        self.hosts
            .iter()
            .map(|(host, port)| format!("{scheme}://{userinfo}{host}:{port}{path}{query}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_the_engine() {
        assert!(matches!(
            parse("DLOCK_URL", "redis://h:1"),
            Ok(BackendKind::Redis(_))
        ));
        assert!(matches!(
            parse("DLOCK_URL", "memory://"),
            Ok(BackendKind::Memory)
        ));
        let cluster = parse("DLOCK_URL", "redis+cluster://a:1,b:2");
        let sentinel = parse("DLOCK_URL", "redis+sentinel://a:1,b:2/mymaster");
        if cfg!(feature = "redis-cluster") {
            assert!(matches!(cluster, Ok(BackendKind::RedisCluster(_))));
        } else {
            assert!(
                cluster
                    .unwrap_err()
                    .to_string()
                    .contains("`redis-cluster` feature")
            );
        }
        if cfg!(feature = "redis-sentinel") {
            assert!(matches!(sentinel, Ok(BackendKind::RedisSentinel(_))));
        } else {
            assert!(
                sentinel
                    .unwrap_err()
                    .to_string()
                    .contains("`redis-sentinel` feature")
            );
        }
        let redlock = parse("DLOCK_URL", "redis+redlock://a:1,b:2,c:3");
        if cfg!(feature = "redlock") {
            assert!(matches!(redlock, Ok(BackendKind::RedLock(_))));
        } else {
            assert!(
                redlock
                    .unwrap_err()
                    .to_string()
                    .contains("`redlock` feature")
            );
        }
        let etcd = parse("DLOCK_URL", "etcd://u:pw@a:2379,b:2379");
        if cfg!(feature = "etcd") {
            assert!(matches!(etcd, Ok(BackendKind::Etcd(_))));
            assert!(!format!("{:?}", etcd.unwrap()).contains("pw"));
            let bad = parse("DLOCK_URL", "etcd://u:pw@a").unwrap_err().to_string();
            assert!(bad.contains("host:port") && !bad.contains("pw"), "{bad}");
        } else {
            assert!(etcd.unwrap_err().to_string().contains("`etcd` feature"));
        }
        let zk = parse("DLOCK_URL", "zk://a:2181,b:2181/app");
        if cfg!(feature = "zookeeper") {
            assert!(matches!(zk, Ok(BackendKind::ZooKeeper(_))));
        } else {
            assert!(zk.unwrap_err().to_string().contains("`zookeeper` feature"));
        }
    }

    #[test]
    fn zookeeper_urls_need_their_feature() {
        let zk = parse("DLOCK_URL", "zk://a:2181,b:2182/app");
        if cfg!(feature = "zookeeper") {
            assert!(matches!(zk, Ok(BackendKind::ZooKeeper(_))));
            let bad = parse("DLOCK_URL", "zk://u:pw@a:2181")
                .unwrap_err()
                .to_string();
            assert!(bad.contains("DLOCK_URL") && !bad.contains("pw"), "{bad}");
        } else {
            assert!(zk.unwrap_err().to_string().contains("`zookeeper` feature"));
        }
    }

    #[test]
    fn postgres_urls_need_their_feature() {
        for url in ["postgres://u:pw@db/app", "postgresql://u:pw@db:5433/app"] {
            let parsed = parse("DLOCK_URL", url);
            if cfg!(feature = "postgres") {
                assert!(matches!(parsed, Ok(BackendKind::Postgres(_))), "{url}");
            } else {
                let err = parsed.unwrap_err().to_string();
                assert!(err.contains("`postgres` feature"), "{url}: {err}");
                assert!(!err.contains("pw"), "{err}");
            }
        }
    }

    #[test]
    fn malformed_host_lists_name_the_variable_and_hide_the_password() {
        for url in [
            "redis+cluster://",
            "redis+cluster://u:s3cret@",
            "redis+cluster://u:s3cret@a:1,,b:2",
            "redis+cluster://u:s3cret@a:1,b",
            "redis+cluster://u:s3cret@a:1,b:http",
            "redis+cluster://u:s3cret@a:0",
            "redis+cluster://u:s3cret@:6379",
            "redis+sentinel://u:s3cret@a:1,b:2",
            "redis+sentinel://u:s3cret@a:1,b:2/",
            "http://u:s3cret@a:1",
            "no scheme at all s3cret",
        ] {
            let err = parse("DLOCK_URL", url).unwrap_err();
            assert!(err.is_config(), "{url}: {err:?}");
            let text = err.to_string();
            assert!(text.contains("DLOCK_URL"), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
        let err = parse("DLOCK_URL", "redis+sentinel://a:1/").unwrap_err();
        if cfg!(feature = "redis-sentinel") {
            assert!(err.to_string().contains("master name"), "{err}");
        }
    }

    #[cfg(feature = "redlock")]
    #[test]
    fn redlock_needs_an_odd_number_of_distinct_masters() {
        for (url, why) in [
            ("redis+redlock://u:s3cret@a:1", "at least 3"),
            ("redis+redlock://u:s3cret@a:1,b:2", "at least 3"),
            ("redis+redlock://u:s3cret@a:1,b:2,c:3,d:4", "odd number"),
            (
                "redis+redlock://u:s3cret@a:1,b:2,c:3,d:4,e:5,f:6",
                "odd number",
            ),
            ("redis+redlock://u:s3cret@a:1,b:2,a:1", "twice"),
            ("redis+redlock://u:s3cret@a:1,b:2,", "needs a port"),
            ("redis+redlock://u:s3cret@a:1,b:2,:3", "host name is empty"),
            ("redis+redlock://u:s3cret@", "no host"),
        ] {
            let err = parse("DLOCK_URL", url).unwrap_err();
            assert!(err.is_config(), "{url}: {err:?}");
            let text = err.to_string();
            assert!(
                text.contains(why) && text.contains("DLOCK_URL"),
                "{url}: {text}"
            );
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
        for url in [
            "redis+redlock://a:1,b:2,c:3",
            "redis+redlock://u:pw@a:1,b:2,c:3,d:4,e:5",
        ] {
            assert!(
                matches!(parse("X", url), Ok(BackendKind::RedLock(_))),
                "{url}"
            );
        }
        let tls = parse("X", "rediss+redlock://a:1,b:2,c:3");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls"), "{tls:?}");
    }

    #[test]
    fn host_lists_keep_passwords_with_separators() {
        let url = "rediss+cluster://app:p@ss/w,rd@h1:7000,h2:7001/?x=1";
        let hosts = HostList::parse("X", url, "").unwrap();
        assert!(hosts.tls);
        assert_eq!(hosts.userinfo, Some("app:p@ss/w,rd"));
        assert_eq!(hosts.hosts, vec![("h1", 7000), ("h2", 7001)]);
        assert_eq!(hosts.query, Some("x=1"));
        #[cfg(feature = "redis-cluster")]
        assert!(
            hosts
                .node_urls("/0")
                .iter()
                .all(|node| node.ends_with("/0?x=1")),
            "the query reaches every node: {:?}",
            hosts.node_urls("/0")
        );
        let sentinel = HostList::parse("X", "redis+sentinel://s1:1,s2:2/mymaster/2", "").unwrap();
        assert_eq!(sentinel.master_name("X", "").unwrap(), "mymaster");
    }
}
