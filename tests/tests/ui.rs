//! Compile-time behaviour of `#[dlock]`: the shapes that must compile (`ui/pass`) and the
//! misuses that must fail with a message on the offending token (`ui/fail`, with `.stderr`).
//!
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test -p dlock-tests --test ui`
//! and read the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/pass/*.rs");
    cases.compile_fail("ui/fail/*.rs");
}
