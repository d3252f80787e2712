//! The engines, and the table that lists them. A backend knows nothing of waiting, leases on
//! the client's clock or guards: it answers single requests, each atomic on the server (see
//! [`api`]). Each engine is a folder here that [`ENGINES`] names once; URL parsing, the
//! unknown-scheme error, the builder and the docs' checks read the table.

use crate::{LockError, url::EngineUrl};

pub(crate) mod api;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
mod deadlines;
#[cfg(feature = "etcd")]
mod etcd;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redlock")]
mod redlock;
mod watchers;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub(crate) use api::{
    Attempt, Backend, BoxFuture, Built, Capabilities, FairOrder, Queued, Request, Token, WakeUp,
    Watch,
};
pub(crate) use memory::MemoryBackend;
#[cfg(feature = "redlock")]
pub(crate) use redlock::first_master as redlock_first_master;

/// `Some(&path)` when the cargo feature `$feature` is on, else `None`.
macro_rules! built {
    ($feature:literal, $built:path) => {
        match () {
            #[cfg(feature = $feature)]
            () => Some(&$built),
            #[cfg(not(feature = $feature))]
            () => None,
        }
    };
}

/// Every engine, one line each: its name, URL schemes, cargo feature, URL form, and what it
/// does when compiled in.
pub(crate) const ENGINES: &[Engine] = &[
    Engine::new(
        "redis",
        &["redis", "rediss", "redis+unix", "unix"],
        "redis",
        "redis://[user[:password]@]host[:port][/db][?wait=N]",
        built!("redis", redis::SINGLE),
    ),
    Engine::new(
        "redis-cluster",
        &["redis+cluster", "rediss+cluster"],
        "redis-cluster",
        "redis+cluster://[user:password@]h1:p1,h2:p2[?wait=N]",
        built!("redis-cluster", redis::CLUSTER),
    ),
    Engine::new(
        "redis-sentinel",
        &["redis+sentinel", "rediss+sentinel"],
        "redis-sentinel",
        "redis+sentinel://[user:password@]s1:p1,s2:p2/<master>[?wait=N]",
        built!("redis-sentinel", redis::SENTINEL),
    ),
    Engine::new(
        "redlock",
        &["redis+redlock", "rediss+redlock"],
        "redlock",
        "redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3",
        built!("redlock", redlock::BUILT),
    ),
    Engine::new(
        "etcd",
        &["etcd", "etcds"],
        "etcd",
        "etcd://[user:password@]h1:p1,h2:p2",
        built!("etcd", etcd::BUILT),
    ),
    Engine::new(
        "zookeeper",
        &["zk"],
        "zookeeper",
        "zk://h1:p1,h2:p2[/chroot][?session_timeout=10s]",
        built!("zookeeper", zookeeper::BUILT),
    ),
    Engine::new(
        "postgres",
        &["postgres", "postgresql"],
        "postgres",
        "postgres://[user[:password]@]host[:port]/dbname",
        built!("postgres", postgres::BUILT),
    ),
    Engine::new("memory", &["memory"], "", "memory://", Some(&memory::BUILT)),
];

/// One line of [`ENGINES`].
pub(crate) struct Engine {
    /// What [`EngineUrl::engine`] says: `redis`, `redis-cluster`, `zookeeper`, …
    pub(crate) name: &'static str,
    /// The URL schemes that pick it (TLS forms included).
    pub(crate) schemes: &'static [&'static str],
    /// The cargo feature that compiles it in (none for the embedded engine).
    pub(crate) feature: &'static str,
    /// Its URL's form, for errors and docs.
    pub(crate) form: &'static str,
    /// What it does, when its feature is on.
    pub(crate) built: Option<&'static Built>,
}

impl Engine {
    const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        feature: &'static str,
        form: &'static str,
        built: Option<&'static Built>,
    ) -> Self {
        Self {
            name,
            schemes,
            feature,
            form,
            built,
        }
    }
}

/// The names of the engines compiled in.
pub(crate) fn compiled_engines() -> Vec<&'static str> {
    ENGINES
        .iter()
        .filter(|e| e.built.is_some())
        .map(|e| e.name)
        .collect()
}

/// The engine `name` names (as [`EngineUrl::engine`] says it).
pub(crate) fn engine_named(name: &str) -> Option<&'static Engine> {
    ENGINES.iter().find(|e| e.name == name)
}

/// Reads an engine URL: its scheme picks the engine of [`ENGINES`], which must be compiled in,
/// and the engine checks the rest. `var` names where it came from (`DLOCK_URL`, …) for errors.
pub(crate) fn parse_url(var: &str, url: &str) -> Result<EngineUrl, LockError> {
    let url = url.trim();
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(LockError::config(format!("{var}: expected {}", expected())));
    };
    let engine = ENGINES
        .iter()
        .find(|e| e.schemes.contains(&scheme))
        .ok_or_else(|| {
            LockError::config(format!(
                "{var}: unknown scheme `{scheme}://`; expected {}",
                expected()
            ))
        })?;
    let Some(built) = engine.built else {
        return Err(LockError::config(format!(
            "{var}: `{scheme}://` needs dlock-runtime's `{}` feature; enable it in Cargo.toml",
            engine.feature
        )));
    };
    (built.check)(var, url)?;
    Ok(EngineUrl::checked(url, engine.name))
}

/// What the recognised URL forms are, for error messages: every engine of the table.
fn expected() -> String {
    let forms: Vec<String> = ENGINES.iter().map(|e| format!("`{}`", e.form)).collect();
    format!("one of {}", forms.join(", "))
}

impl std::str::FromStr for EngineUrl {
    type Err = LockError;

    /// Checks the URL as [`Locker`](crate::Locker) would (its scheme, that its engine is
    /// compiled in, and the engine's own form), without any I/O.
    fn from_str(url: &str) -> Result<Self, LockError> {
        parse_url("url", url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(url: &str) -> Result<&'static str, LockError> {
        parse_url("DLOCK_URL", url).map(|u| u.engine())
    }

    /// Every scheme of the table picks its engine when compiled in, and says which feature it
    /// needs otherwise; no error shows a password.
    #[test]
    fn schemes_pick_the_engine() {
        for (url, name, feature) in [
            ("redis://u:pw@h:1", "redis", "redis"),
            (
                "redis+cluster://u:pw@a:1,b:2",
                "redis-cluster",
                "redis-cluster",
            ),
            (
                "redis+sentinel://u:pw@a:1,b:2/mymaster",
                "redis-sentinel",
                "redis-sentinel",
            ),
            ("redis+redlock://u:pw@a:1,b:2,c:3", "redlock", "redlock"),
            ("etcd://u:pw@a:2379,b:2379", "etcd", "etcd"),
            ("zk://a:2181,b:2181/app", "zookeeper", "zookeeper"),
            ("postgres://u:pw@db/app", "postgres", "postgres"),
            ("postgresql://u:pw@db:5433/app", "postgres", "postgres"),
            ("memory://", "memory", ""),
        ] {
            let compiled = engine_named(name).is_some_and(|e| e.built.is_some());
            match engine(url) {
                Ok(got) => assert!(compiled && got == name, "{url}: {got}"),
                Err(e) => {
                    let text = e.to_string();
                    assert!(!compiled, "{url}: {text}");
                    assert!(
                        text.contains(&format!("`{feature}` feature")),
                        "{url}: {text}"
                    );
                    assert!(!text.contains("pw"), "{text}");
                }
            }
        }
        let unknown = engine("nosuch://u:pw@h:1").unwrap_err().to_string();
        for e in ENGINES {
            assert!(
                unknown.contains(e.form),
                "{unknown} does not list {}",
                e.form
            );
        }
    }

    #[test]
    fn malformed_host_lists_name_the_variable_and_hide_the_password() {
        let mut urls = vec!["http://u:s3cret@a:1", "no scheme at all s3cret"];
        if cfg!(feature = "redis-cluster") {
            urls.extend([
                "redis+cluster://",
                "redis+cluster://u:s3cret@",
                "redis+cluster://u:s3cret@a:1,,b:2",
                "redis+cluster://u:s3cret@a:1,b",
                "redis+cluster://u:s3cret@a:1,b:http",
                "redis+cluster://u:s3cret@a:0",
                "redis+cluster://u:s3cret@:6379",
            ]);
        }
        if cfg!(feature = "redis-sentinel") {
            urls.extend([
                "redis+sentinel://u:s3cret@a:1,b:2",
                "redis+sentinel://u:s3cret@a:1,b:2/",
            ]);
        }
        for url in urls {
            let err = parse_url("DLOCK_URL", url).unwrap_err();
            assert!(err.is_config(), "{url}: {err:?}");
            let text = err.to_string();
            assert!(text.contains("DLOCK_URL"), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }

    /// The crate docs and the README name every engine's URL form: they are read from here.
    #[test]
    fn the_docs_list_every_engine() {
        let docs = include_str!("../lib.rs");
        let readme = include_str!("../../../README.md");
        for e in ENGINES {
            let scheme = format!("{}://", e.schemes[0]);
            assert!(
                docs.contains(&scheme),
                "the crate docs do not name `{scheme}`"
            );
            assert!(
                readme.contains(&scheme),
                "the README does not name `{scheme}`"
            );
            if !e.feature.is_empty() {
                let feature = format!("`{}`", e.feature);
                assert!(
                    docs.contains(&feature),
                    "the crate docs do not name feature {feature}"
                );
            }
        }
    }
}
