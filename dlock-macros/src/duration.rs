//! Durations (`"250ms"`, `"5s"`, `"1m30s"`), parsed with `humantime` when the macro expands, so
//! a typo is a compile error rather than a runtime surprise.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::LitStr;

/// Parses the duration in `lit`, the value of argument `name`.
pub(crate) fn parse(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    parse_str(&lit.value()).map_err(|reason| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid `{name}` duration `{}`: {reason}; write a duration like \
                 `\"250ms\"`, `\"5s\"`, `\"1m30s\"` or `\"2h\"`",
                lit.value()
            ),
        )
    })
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
    let duration = humantime::parse_duration(text).map_err(|error| error.to_string())?;
    if duration.as_secs() > MAX_SECS {
        return Err("that is longer than a lock can sensibly be held or waited for".to_owned());
    }
    Ok(duration)
}

/// About 31 years; rules out overflow when the runtime adds the duration to an `Instant`.
const MAX_SECS: u64 = 1 << 30;

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
    }

    #[test]
    fn rejected() {
        for text in [
            "",
            " ",
            "5",
            "five seconds",
            "5 parsecs",
            "-5s",
            "5s!",
            "100000y",
        ] {
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
