//! The names a function's parameters bind, which are what key placeholders may name.
//!
//! Patterns are walked recursively, the way tracing's `param_names` does: `Path(id): Path<u64>`
//! binds `id`, `Json(Order { sku, .. })` binds `sku`, `&mut self` binds `self`.

use proc_macro2::TokenStream;
use quote::ToTokens as _;
use syn::{FnArg, Pat, ReceiverKind, Signature};

/// The names bound by `sig`'s parameters, in order, `self` included.
pub(crate) fn bound_by(sig: &Signature) -> Vec<String> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(typed) => pattern(&typed.pat, &mut names),
        }
    }
    names
}

/// The `mut` by-value bindings of `sig` (`mut self`, `mut order`), as the tokens that bind them.
///
/// The body's `async move` block mentions each as a whole, so it captures the whole variable as
/// the original `async fn` did, rather than the fields the body touches: with field captures,
/// `self.total = 0; Ok(self.total)` draws rustc's false "value captured by `self.total` is never
/// read".
pub(crate) fn mut_by_value(sig: &Signature) -> Vec<TokenStream> {
    let mut found = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                if receiver.mutability.is_some()
                    && !matches!(receiver.kind, ReceiverKind::Reference(..))
                {
                    found.push(receiver.self_token.to_token_stream());
                }
            }
            FnArg::Typed(typed) => mut_bindings(&typed.pat, &mut found),
        }
    }
    found
}

fn mut_bindings(pat: &Pat, found: &mut Vec<TokenStream>) {
    match pat {
        Pat::Ident(ident) => {
            if ident.mutability.is_some() && ident.by_ref.is_none() {
                found.push(ident.ident.to_token_stream());
            }
            if let Some((_, sub)) = &ident.subpat {
                mut_bindings(sub, found);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| mut_bindings(p, found)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| mut_bindings(p, found)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| mut_bindings(p, found)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|f| mut_bindings(&f.pat, found)),
        Pat::Reference(reference) => mut_bindings(&reference.pat, found),
        Pat::Paren(paren) => mut_bindings(&paren.pat, found),
        Pat::Type(typed) => mut_bindings(&typed.pat, found),
        _ => {}
    }
}

/// Adds the names `pat` binds to `names`.
pub(crate) fn pattern(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                pattern(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| pattern(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| pattern(p, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| pattern(p, names)),
        Pat::Struct(strukt) => strukt.fields.iter().for_each(|f| pattern(&f.pat, names)),
        Pat::Reference(reference) => pattern(&reference.pat, names),
        Pat::Paren(paren) => pattern(&paren.pat, names),
        Pat::Type(typed) => pattern(&typed.pat, names),
        Pat::Guard(guard) => pattern(&guard.pat, names),
        // Every alternative binds the same names; the first one tells them.
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                pattern(first, names);
            }
        }
        // Literals, ranges, paths, `_`, `..`, macros and anything newer bind nothing we can see;
        // a placeholder naming something inside them is reported as unknown.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sig: &str) -> Vec<String> {
        bound_by(&syn::parse_str::<Signature>(sig).unwrap())
    }

    #[test]
    fn plain_and_receivers() {
        assert_eq!(names("fn f(id: u64, mut qty: u32)"), ["id", "qty"]);
        assert_eq!(names("fn f(&self, id: u64)"), ["self", "id"]);
        assert_eq!(names("fn f(&mut self)"), ["self"]);
        assert_eq!(names("fn f(mut self: Box<Self>)"), ["self"]);
        assert!(names("fn f()").is_empty());
    }

    #[test]
    fn patterns() {
        assert_eq!(
            names("fn f(Path(id): Path<u64>, State(app): State<App>)"),
            ["id", "app"]
        );
        assert_eq!(
            names("fn f(Json(CreateOrder { sku, qty: q, .. }): Json<CreateOrder>)"),
            ["sku", "q"]
        );
        assert_eq!(
            names("fn f((a, (b, _)): (u8, (u8, u8)), &c: &u8)"),
            ["a", "b", "c"]
        );
        assert_eq!(
            names("fn f([x, .., y]: [u8; 4], all @ (m, n): (u8, u8))"),
            ["x", "y", "all", "m", "n"]
        );
        assert_eq!(
            names("fn f(Wrapper { 0: inner }: Wrapper, _: u8)"),
            ["inner"]
        );
    }
}
