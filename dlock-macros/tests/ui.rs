//! Compile-time behaviour of `#[dlock]`: the shapes that must compile (`ui/pass`) and the
//! misuses that must fail with a message on the offending token (`ui/fail`, with `.stderr`).
//!
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test -p dlock-macros --test ui`
//! and read the diff. The cases live here, beside the attribute, rather than in the `tests`
//! crate: trybuild builds its cases against the dependencies of the crate they belong to, and
//! this crate's are the runtime and tokio, where the `tests` crate's are every engine's client
//! and the examples (a cold build of those took 6 of CI's 30 minutes).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
