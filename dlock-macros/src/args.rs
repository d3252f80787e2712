//! The arguments of `#[dlock(...)]`: parsed with one `custom_keyword` per key, one `Option` per
//! key, each set once.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::duration;

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(timeout);
    syn::custom_keyword!(expire);
    syn::custom_keyword!(client);
    syn::custom_keyword!(on_fail);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(max_hold);
    syn::custom_keyword!(fair);
    syn::custom_keyword!(hold_at_least);
    syn::custom_keyword!(permits);
    syn::custom_keyword!(read);
    syn::custom_keyword!(write);
}

/// Every key `#[dlock]` accepts, in the order the docs present them.
const KEYS: &str = "`key`, `timeout`, `expire`, `client`, `on_fail`, `crate`, `on_lost`, \
                    `max_hold`, `fair`, `hold_at_least`, `permits`, `read`, `write`";

/// The lease requested with `expire = ...`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expire {
    /// `expire = "30s"`: a fixed lease.
    Fixed(Duration),
    /// `expire = "auto"`: a lease the runtime renews while the body runs.
    Auto,
}

/// The kind of lock asked for, when not the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `permits = N`: a permit of a counting semaphore.
    Permits(u32),
    /// `read`: a read hold of a read/write lock.
    Read,
    /// `write`: the write hold of a read/write lock.
    Write,
}

impl Kind {
    fn argument(self) -> &'static str {
        match self {
            Self::Permits(_) => "permits",
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// What `on_lost = ...` asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OnLost {
    /// Drop the body and return `LockError::Lost`.
    Abort,
    /// Let the body finish; only report the loss.
    Continue,
}

/// A value together with the span of the key that set it, for errors about the pair.
pub(crate) struct Spanned<T> {
    /// The span of the argument's name (`timeout` in `timeout = "5s"`).
    pub(crate) key: Span,
    /// The parsed value.
    pub(crate) value: T,
}

/// The parsed and checked arguments of one `#[dlock(...)]`.
// No `Debug`: syn's `Debug` impls need its `extra-traits` feature, a cost for no use here.
#[derive(Default)]
pub(crate) struct Args {
    /// `key = "order:<id>"`; required, checked by [`Args::validate`].
    pub(crate) key: Option<Spanned<LitStr>>,
    pub(crate) timeout: Option<Spanned<Duration>>,
    pub(crate) expire: Option<Spanned<Expire>>,
    pub(crate) client: Option<Spanned<Expr>>,
    pub(crate) on_fail: Option<Spanned<Path>>,
    pub(crate) krate: Option<Spanned<Path>>,
    pub(crate) on_lost: Option<Spanned<OnLost>>,
    pub(crate) max_hold: Option<Spanned<Duration>>,
    pub(crate) fair: Option<Spanned<bool>>,
    pub(crate) hold_at_least: Option<Spanned<Duration>>,
    /// `permits = N`, `read` or `write`: one of them at most.
    pub(crate) kind: Option<Spanned<Kind>>,
}

/// Stores the kind of lock, refusing a second one.
fn set_kind(slot: &mut Option<Spanned<Kind>>, key: Span, kind: Kind) -> syn::Result<()> {
    if let Some(first) = slot {
        let (first, second) = (first.value.argument(), kind.argument());
        let message = if first == second {
            format!("duplicate argument `{second}`; give each argument once")
        } else {
            format!(
                "`{second}` and `{first}` ask for two kinds of lock; give one of `permits = N` \
                 (a semaphore), `read` or `write` (a read/write lock), or none (a mutex)"
            )
        };
        return Err(syn::Error::new(key, message));
    }
    *slot = Some(Spanned { key, value: kind });
    Ok(())
}

/// A bare flag (`read`, `write`): a value after it is an error that shows the form.
fn no_value(input: ParseStream<'_>, name: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        let eq: Token![=] = input.parse()?;
        return Err(syn::Error::new(
            eq.span,
            format!(
                "`{name}` takes no value; write `{name}` alone, like `#[dlock(key = \"doc:<id>\", {name})]`"
            ),
        ));
    }
    Ok(())
}

/// Stores `value` in `slot`, refusing a second value for the same key.
fn set<T>(slot: &mut Option<Spanned<T>>, name: &str, key: Span, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            key,
            format!("duplicate argument `{name}`; give each argument once"),
        ));
    }
    *slot = Some(Spanned { key, value });
    Ok(())
}

/// Parses the value of a key that takes a string literal, with an error that shows the form.
fn string_value(input: ParseStream<'_>, name: &str, example: &str) -> syn::Result<LitStr> {
    let expr: Expr = input.parse()?;
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{name}` must be a string literal, like `{name} = {example}`"),
        )),
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                let token: kw::key = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "key", "\"order:<id>\"")?;
                set(&mut args.key, "key", token.span, lit)?;
            } else if lookahead.peek(kw::timeout) {
                let token: kw::timeout = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "timeout", "\"5s\"")?;
                set(
                    &mut args.timeout,
                    "timeout",
                    token.span,
                    duration::parse(&lit, "timeout")?,
                )?;
            } else if lookahead.peek(kw::expire) {
                let token: kw::expire = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "expire", "\"30s\"")?;
                let expire = if lit.value() == "auto" {
                    Expire::Auto
                } else {
                    Expire::Fixed(duration::parse_lease(&lit, EXPIRE_ZERO)?)
                };
                set(&mut args.expire, "expire", token.span, expire)?;
            } else if lookahead.peek(kw::client) {
                let token: kw::client = input.parse()?;
                input.parse::<Token![=]>()?;
                let expr: Expr = input.parse()?;
                set(&mut args.client, "client", token.span, expr)?;
            } else if lookahead.peek(kw::on_fail) {
                let token: kw::on_fail = input.parse()?;
                input.parse::<Token![=]>()?;
                let expr: Expr = input.parse()?;
                let Expr::Path(path) = expr else {
                    return Err(syn::Error::new(
                        expr.span(),
                        "`on_fail` must be the path of a function, like `on_fail = handler`; \
                         it is called as `handler(error)` with the `LockError`",
                    ));
                };
                set(&mut args.on_fail, "on_fail", token.span, path.path)?;
            } else if lookahead.peek(Token![crate]) {
                let token: Token![crate] = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "crate", "\"::my_dlock\"")?;
                let path = lit.parse::<Path>().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        "`crate` must name a path, like `crate = \"::my_dlock\"` \
                         for `dlock_runtime` renamed to `my_dlock`",
                    )
                })?;
                set(&mut args.krate, "crate", token.span, path)?;
            } else if lookahead.peek(kw::on_lost) {
                let token: kw::on_lost = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "on_lost", "\"abort\"")?;
                let on_lost = match lit.value().as_str() {
                    "abort" => OnLost::Abort,
                    "continue" => OnLost::Continue,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `on_lost` value `{other}`; \
                                 expected `\"abort\"` (the default) or `\"continue\"`"
                            ),
                        ));
                    }
                };
                set(&mut args.on_lost, "on_lost", token.span, on_lost)?;
            } else if lookahead.peek(kw::max_hold) {
                let token: kw::max_hold = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "max_hold", "\"10m\"")?;
                let max_hold = duration::parse_positive(&lit, "max_hold", MAX_HOLD_ZERO)?;
                set(&mut args.max_hold, "max_hold", token.span, max_hold)?;
            } else if lookahead.peek(kw::hold_at_least) {
                let token: kw::hold_at_least = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit = string_value(input, "hold_at_least", "\"5m\"")?;
                let minimum = duration::parse_positive(&lit, "hold_at_least", HOLD_AT_LEAST_ZERO)?;
                if minimum > duration::MAX_LEASE {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!(
                            "`hold_at_least` = `{}` is longer than 365 days, the longest a lock \
                             is kept; give at most `\"365days\"`",
                            lit.value()
                        ),
                    ));
                }
                set(
                    &mut args.hold_at_least,
                    "hold_at_least",
                    token.span,
                    minimum,
                )?;
            } else if lookahead.peek(kw::fair) {
                let token: kw::fair = input.parse()?;
                input.parse::<Token![=]>()?;
                let fair = match input.parse::<Lit>() {
                    Ok(Lit::Bool(b)) => b.value,
                    Ok(other) => {
                        return Err(syn::Error::new(
                            other.span(),
                            "`fair` takes `true` or `false` (no quotes), like `fair = true`",
                        ));
                    }
                    Err(e) => {
                        return Err(syn::Error::new(
                            e.span(),
                            "`fair` takes `true` or `false`, like `fair = true`",
                        ));
                    }
                };
                set(&mut args.fair, "fair", token.span, fair)?;
            } else if lookahead.peek(kw::permits) {
                let token: kw::permits = input.parse()?;
                input.parse::<Token![=]>()?;
                let permits = permits_value(input)?;
                set_kind(&mut args.kind, token.span, Kind::Permits(permits))?;
            } else if lookahead.peek(kw::read) {
                let token: kw::read = input.parse()?;
                no_value(input, "read")?;
                set_kind(&mut args.kind, token.span, Kind::Read)?;
            } else if lookahead.peek(kw::write) {
                let token: kw::write = input.parse()?;
                no_value(input, "write")?;
                set_kind(&mut args.kind, token.span, Kind::Write)?;
            } else if input.peek(Ident::peek_any) {
                let unknown = Ident::parse_any(input)?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!("unknown argument `{unknown}`; expected one of {KEYS}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// The value of `permits = N`: a whole number from 1 to `u32::MAX`.
fn permits_value(input: ParseStream<'_>) -> syn::Result<u32> {
    let expr: Expr = input.parse()?;
    let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = &expr
    else {
        return Err(syn::Error::new(
            expr.span(),
            "`permits` takes a whole number, like `permits = 3`",
        ));
    };
    match int.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            int.span(),
            "a semaphore of 0 permits admits nobody; give at least 1, like `permits = 3`",
        )),
        Ok(permits) => Ok(permits),
        Err(_) => Err(syn::Error::new(
            int.span(),
            format!(
                "`permits` takes a whole number from 1 to {}, like `permits = 3`",
                u32::MAX
            ),
        )),
    }
}

const EXPIRE_ZERO: &str = "a zero lease would be gone before the body starts: \
                           give a positive duration like `expire = \"30s\"`, \
                           or `expire = \"auto\"` for a lease renewed while the body runs";
const MAX_HOLD_ZERO: &str = "a zero ceiling would end the lease at once: \
                             give a positive duration like `max_hold = \"10m\"`, \
                             or remove `max_hold`";

const HOLD_AT_LEAST_ZERO: &str = "a zero minimum hold changes nothing: give a positive duration \
                                  like `hold_at_least = \"5m\"`, or remove `hold_at_least`";

/// The checked arguments: what [`Args::validate`] guarantees.
pub(crate) struct Checked {
    pub(crate) key: LitStr,
    pub(crate) timeout: Option<Duration>,
    pub(crate) expire: Option<Expire>,
    pub(crate) client: Option<Expr>,
    pub(crate) on_fail: Option<Path>,
    pub(crate) krate: Option<Path>,
    pub(crate) on_lost: OnLost,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) kind: Option<Kind>,
}

impl Args {
    /// Checks what a single argument cannot check alone: `key` is present and not empty,
    /// `max_hold` comes with `expire = "auto"`.
    ///
    /// `attr_span` is where a missing `key` is reported: the attribute's arguments, or the
    /// attribute itself when it has none.
    pub(crate) fn validate(self, attr_span: Span) -> syn::Result<Checked> {
        let Some(key) = self.key else {
            return Err(syn::Error::new(
                attr_span,
                "missing `key`; name the resource to lock, like \
                 `#[dlock(key = \"order:<id>\")]` where `<id>` is a parameter",
            ));
        };
        let key = key.value;
        if key.value().is_empty() {
            return Err(syn::Error::new(
                key.span(),
                "`key` is empty; name the resource to lock, like `key = \"order:<id>\"`",
            ));
        }
        if let Some(max_hold) = &self.max_hold
            && !matches!(
                self.expire,
                Some(Spanned {
                    value: Expire::Auto,
                    ..
                })
            )
        {
            return Err(syn::Error::new(
                max_hold.key,
                "`max_hold` caps a renewed lease and needs `expire = \"auto\"`; \
                 add `expire = \"auto\"` or remove `max_hold` (a fixed `expire` already \
                 bounds the hold)",
            ));
        }
        if let (Some(minimum), Some(kind)) = (&self.hold_at_least, &self.kind) {
            return Err(syn::Error::new(
                minimum.key,
                format!(
                    "`hold_at_least` is a job lock's minimum hold, for a mutex; remove it, or \
                     remove `{}`",
                    kind.value.argument()
                ),
            ));
        }
        Ok(Checked {
            key,
            timeout: self.timeout.map(|t| t.value),
            expire: self.expire.map(|e| e.value),
            client: self.client.map(|c| c.value),
            on_fail: self.on_fail.map(|f| f.value),
            krate: self.krate.map(|k| k.value),
            on_lost: self.on_lost.map_or(OnLost::Abort, |o| o.value),
            max_hold: self.max_hold.map(|m| m.value),
            fair: self.fair.is_some_and(|f| f.value),
            hold_at_least: self.hold_at_least.map(|h| h.value),
            kind: self.kind.map(|k| k.value),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(tokens: &str) -> syn::Result<Checked> {
        syn::parse_str::<Args>(tokens)?.validate(Span::call_site())
    }

    fn error(tokens: &str) -> String {
        match parse(tokens) {
            Ok(_) => panic!("`{tokens}` should be rejected"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn all_arguments() {
        let args = parse(
            r#"key = "a:<id>", timeout = "0s", expire = "auto", client = &state.locks,
               on_fail = handlers::busy, crate = "::renamed", on_lost = "continue",
               max_hold = "10m", fair = true, hold_at_least = "5m","#,
        )
        .unwrap();
        assert!(args.fair);
        assert_eq!(args.key.value(), "a:<id>");
        assert_eq!(args.timeout, Some(Duration::ZERO));
        assert!(matches!(args.expire, Some(Expire::Auto)));
        assert!(matches!(args.on_lost, OnLost::Continue));
        assert_eq!(args.max_hold, Some(Duration::from_secs(600)));
        assert_eq!(args.hold_at_least, Some(Duration::from_secs(300)));
    }

    #[test]
    fn unknown_lists_the_valid_keys() {
        assert_eq!(
            error(r#"key = "a", ttl = "5s""#),
            "unknown argument `ttl`; expected one of `key`, `timeout`, `expire`, `client`, \
             `on_fail`, `crate`, `on_lost`, `max_hold`, `fair`, `hold_at_least`, `permits`, \
             `read`, `write`"
        );
        assert!(error(r#"key = "a", type = 1"#).starts_with("unknown argument `type`"));
    }

    #[test]
    fn rejections() {
        assert!(error(r#"key = "a", key = "b""#).starts_with("duplicate argument `key`"));
        assert!(error(r#"timeout = "5s""#).starts_with("missing `key`"));
        assert!(error("").starts_with("missing `key`"));
        assert!(error(r#"key = """#).starts_with("`key` is empty"));
        assert!(error("key = id").starts_with("`key` must be a string literal"));
        assert!(error(r#"key = "a", expire = "0s""#).contains("zero lease"));
        assert!(error(r#"key = "a", max_hold = "5s""#).starts_with("`max_hold` caps"));
        assert!(error(r#"key = "a", expire = "5s", max_hold = "5s""#).starts_with("`max_hold`"));
        assert!(error(r#"key = "a", on_lost = "retry""#).starts_with("unknown `on_lost`"));
        assert!(error(r#"key = "a", fair = "yes""#).starts_with("`fair` takes `true` or `false`"));
        assert!(
            error(r#"key = "a", fair = true, fair = false"#)
                .starts_with("duplicate argument `fair`")
        );
        assert!(error(r#"key = "a", on_fail = |e| e"#).starts_with("`on_fail` must be"));
        assert!(error(r#"key = "a", timeout = "5 parsecs""#).starts_with("invalid `timeout`"));
        assert!(error(r#"key = "a", hold_at_least = "0s""#).contains("zero minimum hold"));
        assert!(error(r#"key = "a", hold_at_least = "400days""#).contains("longer than 365 days"));
        assert!(error(r#"key = "a", permits = 0"#).contains("0 permits admits nobody"));
        assert!(error(r#"key = "a", permits = "3""#).starts_with("`permits` takes a whole number"));
        assert!(error(r#"key = "a", permits = 5000000000"#).contains("from 1 to 4294967295"));
        assert!(error(r#"key = "a", read, write"#).starts_with("`write` and `read` ask for two"));
        assert!(error(r#"key = "a", permits = 2, read"#).starts_with("`read` and `permits`"));
        assert!(error(r#"key = "a", read, read"#).starts_with("duplicate argument `read`"));
        assert!(error(r#"key = "a", read = true"#).starts_with("`read` takes no value"));
        assert!(
            error(r#"key = "a", write, hold_at_least = "5m""#)
                .starts_with("`hold_at_least` is a job lock's minimum hold")
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(
            parse(r#"key = "a", permits = 3"#).unwrap().kind,
            Some(Kind::Permits(3))
        );
        assert_eq!(parse(r#"key = "a", read"#).unwrap().kind, Some(Kind::Read));
        assert_eq!(
            parse(r#"write, key = "a""#).unwrap().kind,
            Some(Kind::Write)
        );
        assert_eq!(parse(r#"key = "a""#).unwrap().kind, None);
    }
}
