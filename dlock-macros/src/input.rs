//! The function under `#[dlock]`: a plain `async fn`, or a method `#[async_trait]` has already
//! rewritten (an impl-level attribute expands before the attributes of the items inside it).

use proc_macro2::Span;
use syn::spanned::Spanned as _;
use syn::{Block, Expr, ItemFn, Pat, ReturnType, Stmt, Type};

use crate::names;

/// A function `#[dlock]` can lock.
pub(crate) struct Input {
    /// The function as written (or as `#[async_trait]` left it).
    pub(crate) item: ItemFn,
    /// Which of the two shapes it has.
    pub(crate) form: Form,
    /// The names the key may use, in declaration order.
    pub(crate) names: Vec<String>,
}

/// The two shapes of function `#[dlock]` accepts.
pub(crate) enum Form {
    /// `async fn f(..) -> R { body }`.
    Async,
    /// What `#[async_trait]` makes of an `async fn`:
    ///
    /// ```text
    /// fn f<'life0, 'async_trait>(&'life0 self, ..) -> Pin<Box<dyn Future<Output = R> + ..>> {
    ///     Box::pin(async move {
    ///         if let Some(__ret) = None::<R> { return __ret; }
    ///         let __self = self;             // and one `let` per by-value parameter
    ///         let __ret: R = { body };       // `let _: () = { body };` when R is `()`
    ///         __ret
    ///     })
    /// }
    /// ```
    ///
    /// The lock goes around `{ body }`, after the `let`s, so every parameter name is bound again
    /// and `self` is spelled `__self`.
    AsyncTrait {
        /// `R`, the output of the boxed future.
        output: Box<Type>,
    },
}

impl Input {
    /// Recognizes the function, or explains why `#[dlock]` cannot lock it.
    pub(crate) fn from_syn(mut item: ItemFn) -> syn::Result<Self> {
        let sig = &item.sig;
        if let Some(constness) = &sig.constness {
            return Err(syn::Error::new(
                constness.span,
                "`#[dlock]` cannot lock a `const fn`: acquiring a lock is awaited at run time; \
                 remove `const` and make it an `async fn`",
            ));
        }
        if sig.asyncness.is_some() {
            let names = names::bound_by(sig);
            return Ok(Input {
                item,
                form: Form::Async,
                names,
            });
        }
        let fn_span = sig.fn_token.span;
        let mut names = names::bound_by(&item.sig);
        let Some(slot) = async_trait_slot(&mut item.block) else {
            return Err(syn::Error::new(
                fn_span,
                "`#[dlock]` applies to an `async fn`: acquiring the lock is awaited; \
                 make this function `async`",
            ));
        };
        for stmt in slot.prefix {
            if let Stmt::Local(local) = stmt {
                names::pattern(&local.pat, &mut names);
            }
        }
        let output = Box::new(slot.output.clone());
        Ok(Input {
            item,
            form: Form::AsyncTrait { output },
            names,
        })
    }

    /// The span errors about the return type go to: the type, or the name when there is none.
    pub(crate) fn return_span(&self) -> Span {
        match (&self.form, &self.item.sig.output) {
            (Form::Async, ReturnType::Type(_, ty)) => ty.span(),
            (Form::AsyncTrait { output }, _) if !is_unit(output) => output.span(),
            _ => self.item.sig.ident.span(),
        }
    }
}

/// `()`, however it is spelled.
pub(crate) fn is_unit(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(paren) => is_unit(&paren.elem),
        Type::Group(group) => is_unit(&group.elem),
        _ => false,
    }
}

/// Where the lock goes in an `#[async_trait]` method: the statements before `let __ret: R = ..`
/// (which rebind the parameters), `R`, and the body expression itself.
pub(crate) struct AsyncTraitSlot<'a> {
    pub(crate) prefix: &'a [Stmt],
    pub(crate) output: &'a Type,
    pub(crate) body: &'a mut Expr,
}

/// Finds the body inside `Box::pin(async move { .. let __ret: R = { body }; .. })`.
pub(crate) fn async_trait_slot(block: &mut Block) -> Option<AsyncTraitSlot<'_>> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_mut_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    let Some(Expr::Async(async_block)) = call.args.first_mut() else {
        return None;
    };
    async_block.capture?;
    let stmts = async_block.block.stmts.as_mut_slice();
    let index = stmts.iter().position(|stmt| {
        let Stmt::Local(local) = stmt else {
            return false;
        };
        let Pat::Type(typed) = &local.pat else {
            return false;
        };
        let named = match &*typed.pat {
            Pat::Ident(ident) => ident.ident == "__ret",
            Pat::Wild(_) => is_unit(&typed.ty),
            _ => false,
        };
        named
            && local
                .init
                .as_ref()
                .is_some_and(|init| init.diverge.is_none() && matches!(*init.expr, Expr::Block(_)))
    })?;
    let (prefix, rest) = stmts.split_at_mut(index);
    let Stmt::Local(local) = &mut rest[0] else {
        return None;
    };
    let Pat::Type(typed) = &local.pat else {
        return None;
    };
    let init = local.init.as_mut()?;
    Some(AsyncTraitSlot {
        prefix,
        output: &typed.ty,
        body: &mut init.expr,
    })
}
