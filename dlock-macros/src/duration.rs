//! Durations (`"250ms"`, `"5s"`, `"1m30s"`), parsed with `humantime` when the macro expands, so
//! a typo is a compile error rather than a runtime surprise.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::LitStr;

/// Parses the duration in `lit`, the value of argument `name`.
pub(crate) fn parse(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    let duration = parse_str(&lit.value()).map_err(|reason| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid `{name}` duration `{}`: {reason}; write a duration like \
                 `\"250ms\"`, `\"5s\"`, `\"1m30s\"` or `\"2h\"`",
                lit.value()
            ),
        )
    })?;
    Ok(duration)
}

/// Like [`parse`], and refuses zero with `why_not_zero` as the explanation.
pub(crate) fn parse_positive(
    lit: &LitStr,
    name: &str,
    why_not_zero: &str,
) -> syn::Result<Duration> {
    let duration = parse(lit, name)?;
    if duration.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be positive; {why_not_zero}"),
        ));
    }
    Ok(duration)
}

/// The parser itself, separate from spans so it can be unit-tested.
fn parse_str(text: &str) -> Result<Duration, String> {
    if text.trim().is_empty() {
        return Err("the duration is empty".to_owned());
    }
    humantime::parse_duration(text).map_err(|error| error.to_string())
}

/// The longest lease: the runtime's `dlock_runtime::MAX_LEASE` (365 days). The runtime limits
/// leases only (a wait or a renewal ceiling of any length is accepted), so the attribute does too.
/// A proc-macro crate cannot depend on the runtime: the `ui/pass/limits.rs` and
/// `ui/fail/duration-limits.rs` cases hold the two copies to the same numbers.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest lease: the runtime's `dlock_runtime::MIN_LEASE` (Redis keeps leases in whole
/// milliseconds).
const MIN_LEASE: Duration = Duration::from_millis(1);

/// Like [`parse_positive`], for a lease: refuses one outside [`MIN_LEASE`]..=[`MAX_LEASE`], as
/// the runtime would at every call.
pub(crate) fn parse_lease(lit: &LitStr, why_not_zero: &str) -> syn::Result<Duration> {
    let lease = parse_positive(lit, "expire", why_not_zero)?;
    if lease < MIN_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            "`expire` must be at least 1ms: leases are kept in whole milliseconds",
        ));
    }
    if lease > MAX_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`expire` = `{}` is longer than 365 days, the longest lease dlock accepts; give \
                 at most `\"365days\"`, or `\"auto\"` for a lease renewed while the body runs",
                lit.value()
            ),
        ));
    }
    Ok(lease)
}

// Input:  Duration of 1.5 s
// Output: ::core::time::Duration::new(1u64, 500000000u32)
/// The expression that rebuilds `duration` at run time (a `const fn`, no parsing left).
pub(crate) fn to_tokens(duration: Duration) -> TokenStream {
    let secs = duration.as_secs();
    let nanos = duration.subsec_nanos();
    quote!(::core::time::Duration::new(#secs, #nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted() {
        assert_eq!(parse_str("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_str("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_str("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_str("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_str("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_str("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_str("1500us"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_str("365days"), Ok(MAX_LEASE));
        assert!(
            parse_str("1y").unwrap() > MAX_LEASE,
            "a calendar year is refused"
        );
    }

    #[test]
    fn rejected() {
        for text in ["", " ", "5", "five seconds", "5 parsecs", "-5s", "5s!"] {
            assert!(parse_str(text).is_err(), "{text:?} should be rejected");
        }
    }

    #[test]
    fn tokens_rebuild_the_duration() {
        let tokens = to_tokens(Duration::from_millis(1500)).to_string();
        assert_eq!(
            tokens,
            ":: core :: time :: Duration :: new (1u64 , 500000000u32)"
        );
    }
}
