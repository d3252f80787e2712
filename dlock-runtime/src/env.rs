//! The `DLOCK_*` environment: the engine's URL (or the older variables), the older variables of
//! engine options (read through the table of engines), and the settings every engine shares.

use crate::{
    LockError,
    backend::{ENGINES, parse_url},
    config::{DEFAULT_REDIS_URL, Settings, parse_duration, parse_retry},
    url::EngineUrl,
};

/// Reads the `DLOCK_*` variables through `var` (the process environment in production).
pub(crate) fn settings(var: impl Fn(&str) -> Option<String>) -> Result<Settings, LockError> {
    let mut settings = Settings::default();
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    // The one URL that names any engine wins: the older variables are then not read at all
    // (a platform's unrelated `REDIS_URL` cannot break a `DLOCK_URL=postgres://…`).
    settings.url = Some(match get("DLOCK_URL") {
        Some(url) => parse_url("DLOCK_URL", &url)?,
        None => older_engine_variables(&get)?,
    });
    // The older variables of engine options (`DLOCK_REDIS_WAIT`, …), whatever the engine.
    for option in ENGINES
        .iter()
        .filter_map(|e| e.built)
        .flat_map(|b| b.options)
    {
        let seen = settings
            .engine_options
            .iter()
            .any(|(_, _, v)| *v == option.var);
        if !seen && let Some(value) = get(option.var) {
            (option.check)(value.trim())
                .map_err(|why| LockError::config(format!("{}: {why}", option.var)))?;
            settings
                .engine_options
                .push((option.name, value.trim().to_owned(), option.var));
        }
    }
    if let Some(prefix) = var("DLOCK_KEY_PREFIX") {
        settings.key_prefix = prefix;
    }
    if let Some(owner) = get("DLOCK_OWNER") {
        settings.identity = crate::holder::Identity::new(Some(owner.trim()));
    }
    if let Some(v) = get("DLOCK_TIMEOUT") {
        settings.timeout = parse_duration("DLOCK_TIMEOUT", &v, true)?;
    }
    if let Some(v) = get("DLOCK_EXPIRE") {
        settings.expire = parse_duration("DLOCK_EXPIRE", &v, false)?;
    }
    if let Some(v) = get("DLOCK_RETRY") {
        settings.retry = parse_retry(&v)?;
    }
    if let Some(v) = get("DLOCK_MAX_KEY_LEN") {
        settings.max_key_len = match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(LockError::config(
                    "DLOCK_MAX_KEY_LEN: expected a positive whole number of bytes, like `1024`",
                ));
            }
        };
    }
    if let Some(v) = get("DLOCK_REQUEST_TIMEOUT") {
        settings.request_timeout = parse_duration("DLOCK_REQUEST_TIMEOUT", &v, false)?;
    }
    if let Some(v) = get("DLOCK_NOTIFY") {
        settings.notify = match v.trim() {
            "on" | "true" | "1" => true,
            "off" | "false" | "0" => false,
            _ => return Err(LockError::config("DLOCK_NOTIFY: expected `on` or `off`")),
        };
    }
    settings.validate()?;
    Ok(settings)
}

/// The engine from `DLOCK_BACKEND` and `DLOCK_REDIS_URL` (or `REDIS_URL`), when `DLOCK_URL`
/// is not set (kept for compatibility).
fn older_engine_variables(get: &impl Fn(&str) -> Option<String>) -> Result<EngineUrl, LockError> {
    // Checked whatever the backend, as it always was: a bad value is reported, not ignored.
    let redis = |var: &str, url: &str| {
        let parsed = parse_url(var, url)?;
        if parsed.engine() == "redis" {
            Ok(parsed)
        } else {
            Err(LockError::config(format!(
                "{var}: expected a URL like `redis://[user:password@]host:port[/db]` \
                     (other engines go in DLOCK_URL)"
            )))
        }
    };
    let url = match (get("DLOCK_REDIS_URL"), get("REDIS_URL")) {
        (Some(url), _) => Some(redis("DLOCK_REDIS_URL", &url)?),
        (None, Some(url)) => Some(redis("REDIS_URL", &url)?),
        (None, None) => None,
    };
    match get("DLOCK_BACKEND").as_deref().map(str::trim) {
        None | Some("redis") => match url {
            Some(url) => Ok(url),
            None => parse_url("DLOCK_BACKEND", DEFAULT_REDIS_URL),
        },
        Some("memory") => parse_url("DLOCK_BACKEND", "memory://"),
        Some(_) => Err(LockError::config(
            "DLOCK_BACKEND: expected `redis` or `memory` (or name any engine in DLOCK_URL)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{DEFAULT_EXPIRE, DEFAULT_TIMEOUT};

    fn env(pairs: &[(&str, &str)]) -> Result<Settings, LockError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    fn engine(s: &Settings) -> (&'static str, String) {
        let url = s.url.as_ref().unwrap();
        (url.engine(), url.as_str().to_owned())
    }

    #[test]
    fn defaults() {
        let s = env(&[]).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.expire, DEFAULT_EXPIRE);
        assert_eq!(s.key_prefix, "dlock:");
        assert_eq!(s.max_key_len, 1024);
        if cfg!(feature = "redis") {
            assert_eq!(engine(&s), ("redis", DEFAULT_REDIS_URL.to_owned()));
        }
    }

    #[test]
    fn every_variable_is_read() {
        let s = env(&[
            ("DLOCK_BACKEND", "memory"),
            ("DLOCK_KEY_PREFIX", "app:"),
            ("DLOCK_TIMEOUT", "0s"),
            ("DLOCK_EXPIRE", "1m30s"),
            ("DLOCK_RETRY", "5ms..7ms"),
            ("DLOCK_MAX_KEY_LEN", "64"),
            ("DLOCK_REQUEST_TIMEOUT", "2s"),
            ("DLOCK_NOTIFY", "off"),
        ])
        .unwrap();
        assert_eq!(engine(&s).0, "memory");
        assert_eq!(s.key_prefix, "app:");
        assert_eq!(s.timeout, Duration::ZERO);
        assert_eq!(s.expire, Duration::from_secs(90));
        assert_eq!(
            s.retry,
            (Duration::from_millis(5), Duration::from_millis(7))
        );
        assert_eq!(s.max_key_len, 64);
        assert_eq!(s.request_timeout, Duration::from_secs(2));
        assert!(!s.notify);
    }

    /// The options of the engines compiled in, from the table.
    fn options() -> impl Iterator<Item = &'static crate::backend::api::EngineOption> {
        ENGINES
            .iter()
            .filter_map(|e| e.built)
            .flat_map(|b| b.options)
    }

    /// The variables of engine options are read as aliases of the URL's query.
    #[test]
    fn engine_option_variables_are_aliases() {
        let mut expected = Vec::new();
        let mut vars = Vec::new();
        // Several engines share an option (the Redis engines' `wait`): read once.
        for option in options() {
            if !vars.contains(&(option.var, option.example)) {
                vars.push((option.var, option.example));
                expected.push((option.name, option.example.to_owned(), option.var));
            }
        }
        vars.push(("DLOCK_URL", "memory://"));
        assert_eq!(env(&vars).unwrap().engine_options, expected);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_url_falls_back_to_redis_url() {
        let s = env(&[("REDIS_URL", "redis://h:1")]).unwrap();
        assert_eq!(engine(&s), ("redis", "redis://h:1".to_owned()));
        let s = env(&[
            ("REDIS_URL", "redis://h:1"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(engine(&s), ("redis", "redis://d:2".to_owned()));
    }

    #[test]
    fn dlock_url_wins_over_the_older_variables() {
        let s = env(&[
            ("DLOCK_URL", "memory://"),
            ("DLOCK_BACKEND", "redis"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(engine(&s).0, "memory");
        let err = env(&[
            ("DLOCK_URL", "nosuch://e:2181"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("DLOCK_URL"), "{err}");
    }

    /// A hosting platform's `REDIS_URL` (TLS, or no URL at all) beside `DLOCK_URL` is not read.
    #[test]
    fn with_dlock_url_the_older_variables_are_not_read() {
        for broken in ["rediss://default:pw@cache:6380", "not a url"] {
            let s = env(&[
                ("DLOCK_URL", "memory://"),
                ("REDIS_URL", broken),
                ("DLOCK_REDIS_URL", broken),
                ("DLOCK_BACKEND", "etcd"),
            ])
            .unwrap_or_else(|e| panic!("{broken}: {e}"));
            assert_eq!(engine(&s).0, "memory");
        }
        // Without DLOCK_URL the same values are still errors.
        assert!(env(&[("REDIS_URL", "not a url")]).is_err());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let mut cases = vec![
            ("DLOCK_BACKEND", "etcd"),
            ("DLOCK_REDIS_URL", "http://x"),
            ("DLOCK_TIMEOUT", "soon"),
            ("DLOCK_EXPIRE", "0s"),
            ("DLOCK_EXPIRE", "-3s"),
            ("DLOCK_RETRY", "50ms"),
            ("DLOCK_RETRY", "50ms..10ms"),
            ("DLOCK_MAX_KEY_LEN", "0"),
            ("DLOCK_MAX_KEY_LEN", "big"),
            ("DLOCK_NOTIFY", "maybe"),
            ("DLOCK_URL", "ftp://x"),
        ];
        // An engine of a list of hosts, given none.
        let empty: Vec<String> = ENGINES
            .iter()
            .filter(|e| e.built.is_some() && e.form.contains("h1:p1"))
            .map(|e| format!("{}://", e.schemes[0]))
            .collect();
        cases.extend(empty.iter().map(|url| ("DLOCK_URL", url.as_str())));
        for option in options() {
            cases.extend([(option.var, "-1"), (option.var, "all")]);
        }
        for (var, value) in cases {
            let err = env(&[(var, value)]).unwrap_err();
            assert!(err.is_config(), "{var}={value}: {err:?}");
            assert!(err.to_string().contains(var), "{var}={value}: {err}");
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn password_is_redacted() {
        let s = env(&[("DLOCK_URL", "redis://user:s3cret@host:6379/2")]).unwrap();
        let url = s.url.as_ref().unwrap();
        assert_eq!(url.to_string(), "redis://***@host:6379/2");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
