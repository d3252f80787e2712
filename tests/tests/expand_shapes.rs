//! Every passing UI shape, compiled as part of the ordinary test build: a shape that stops
//! compiling shows up here with rustc's full output, not only as a trybuild mismatch.
#![allow(dead_code, unreachable_pub, clippy::all, clippy::pedantic)]

#[path = "../ui/pass/async_trait.rs"]
mod async_trait_impls;
#[path = "../ui/pass/client.rs"]
mod client;
#[path = "../ui/pass/crate_path.rs"]
mod crate_path;
#[path = "../ui/pass/free_fns.rs"]
mod free_fns;
#[path = "../ui/pass/generics.rs"]
mod generics;
#[path = "../ui/pass/methods.rs"]
mod methods;
#[path = "../ui/pass/on_fail.rs"]
mod on_fail;
#[path = "../ui/pass/patterns.rs"]
mod patterns;
#[path = "../ui/pass/send.rs"]
mod send;
#[path = "../ui/pass/shadowing.rs"]
mod shadowing;
#[path = "../ui/pass/trait_impls.rs"]
mod trait_impls;

#[test]
fn shapes_compile() {}
