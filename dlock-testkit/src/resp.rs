//! One command over a fresh plain connection, through redis-rs's synchronous client: enough for
//! the deployments and the tests to ask their servers and sentinels about themselves, with no
//! connection state to go stale across the faults the tests inject.

use std::time::Duration;

pub use redis::{RedisResult, Value};

/// Sends one command to the server (or sentinel) on 127.0.0.1:`port` over a fresh plain
/// connection (connect, read and write each bounded by a second) and returns its reply; an
/// error reply (`MOVED …`, `NOAUTH …`) or a connection that fails is the `Err`.
///
/// # Errors
/// The server's error reply, or the connection's failure.
pub fn command_at(port: u16, args: &[&str]) -> RedisResult<Value> {
    let second = Duration::from_secs(1);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut connection = client.get_connection_with_timeout(second)?;
    connection.set_read_timeout(Some(second))?;
    connection.set_write_timeout(Some(second))?;
    let Some((name, rest)) = args.split_first() else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "an empty command",
        )));
    };
    redis::cmd(name).arg(rest).query(&mut connection)
}

/// The text of a status, `OK` or bulk reply.
#[must_use]
pub fn text(reply: &Value) -> Option<String> {
    match reply {
        Value::Okay => Some("OK".to_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

/// The items of an array reply.
#[must_use]
pub fn items(reply: &Value) -> Option<&[Value]> {
    match reply {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

/// The value of `field` in an `INFO`-style text (`field:value` lines).
#[must_use]
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim_end)
}
