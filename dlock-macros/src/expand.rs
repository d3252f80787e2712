//! Code generation: parse the arguments and the function, validate them together, and wrap the
//! body in calls to `#krate::__private`. No lock semantics live here.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, ExprPath, Ident, ItemFn, LitStr, ReturnType, Stmt, Type};

use crate::args::{Args, Checked, Expire, Kind, OnLost};
use crate::duration;
use crate::input::{self, Form, Input};
use crate::key::{self, Field, Part, Placeholder};
use crate::names;

/// The whole attribute: on success the locked function; on error the function unchanged plus
/// one `compile_error!`, so the rest of the crate still sees the function.
pub(crate) fn dlock(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_dlock(args, &item) {
        Ok(tokens) => tokens,
        Err(error) => {
            let mut tokens = error.into_compile_error();
            tokens.extend(item);
            tokens
        }
    }
}

/// Parse, then validate, then expand.
fn try_dlock(args: TokenStream, item: &TokenStream) -> syn::Result<TokenStream> {
    let args = syn::parse2::<Args>(args)?.validate(Span::call_site())?;
    let item: ItemFn = syn::parse2(item.clone()).map_err(|error| not_a_function(item, &error))?;
    let input = Input::from_syn(item)?;
    let plan = Plan::validate(args, &input)?;
    plan.expand(input)
}

/// Explains why `item` is not something `#[dlock]` can lock.
fn not_a_function(item: &TokenStream, error: &syn::Error) -> syn::Error {
    if let Ok(declaration) = syn::parse2::<syn::TraitItemFn>(item.clone())
        && let Some(semi) = declaration.semi_token
    {
        return syn::Error::new(
            semi.span,
            "`#[dlock]` needs the function's body: put it on the method in each `impl` \
             (or on a default body in the trait), not on a declaration",
        );
    }
    syn::Error::new(
        error.span(),
        format!("`#[dlock]` applies to an `async fn` ({error})"),
    )
}

/// Everything the expansion needs, checked against the function.
struct Plan {
    /// `::dlock_runtime` or the `crate = "..."` path.
    krate: TokenStream,
    key: LitStr,
    parts: Vec<Part>,
    /// How `self` is spelled where the key is built: `self`, or `__self` after `#[async_trait]`.
    self_ident: Ident,
    args: Checked,
    /// The function's return type with `impl Trait` erased to `_`; `None` for `()`.
    output: Option<Type>,
    /// Where a "return type cannot take a lock error" diagnostic goes.
    output_span: Span,
    /// `mut` by-value parameters the body's block must capture whole (see
    /// [`names::mut_by_value`]); empty after `#[async_trait]`, which rebinds them itself.
    capture_whole: Vec<TokenStream>,
}

impl Plan {
    /// Checks the key's placeholders against the parameters and the return type against
    /// `on_fail`.
    fn validate(args: Checked, input: &Input) -> syn::Result<Self> {
        let key = args.key.clone();
        let parts =
            key::parse(&key.value()).map_err(|message| syn::Error::new(key.span(), message))?;
        for part in &parts {
            if let Part::Placeholder(placeholder) = part
                && !input.names.contains(&placeholder.root)
            {
                return Err(syn::Error::new(
                    key.span(),
                    unknown_name(placeholder, &input.names),
                ));
            }
        }

        let output = match &input.form {
            Form::Async => match &input.item.sig.output {
                ReturnType::Default => None,
                ReturnType::Type(_, ty) => Some((**ty).clone()),
            },
            Form::AsyncTrait { output } => {
                Some((**output).clone()).filter(|ty| !input::is_unit(ty))
            }
        };
        if args.on_fail.is_none()
            && let Some(what) = not_a_result(output.as_ref())
        {
            return Err(syn::Error::new(
                input.return_span(),
                format!(
                    "`{}` returns {what}; a lock failure needs somewhere to go: return \
                     `Result<T, E>` with `E: From<dlock_runtime::LockError>`, or pass \
                     `on_fail = handler` with a `fn handler(dlock_runtime::LockError)` that \
                     returns what `{0}` returns",
                    input.item.sig.ident,
                ),
            ));
        }

        let krate = args
            .krate
            .as_ref()
            .map_or_else(|| quote!(::dlock_runtime), ToTokens::to_token_stream);
        let self_ident = match input.form {
            Form::Async => Ident::new("self", key.span()),
            Form::AsyncTrait { .. } => Ident::new("__self", key.span()),
        };
        Ok(Plan {
            krate,
            key,
            parts,
            self_ident,
            args,
            output: output.map(erase_impl_trait),
            output_span: input.return_span(),
            capture_whole: match input.form {
                Form::Async => names::mut_by_value(&input.item.sig),
                Form::AsyncTrait { .. } => Vec::new(),
            },
        })
    }

    /// Puts the lock around the body, wherever the form keeps it.
    fn expand(&self, input: Input) -> syn::Result<TokenStream> {
        let mut item = input.item;
        match input.form {
            Form::Async => {
                let body = std::mem::take(&mut item.block.stmts);
                let body = Block {
                    brace_token: item.block.brace_token,
                    stmts: body,
                };
                let locked = self.locked(&body.to_token_stream(), None);
                item.block.stmts = vec![Stmt::Expr(Expr::Verbatim(locked), None)];
            }
            Form::AsyncTrait { .. } => {
                let Some(slot) = input::async_trait_slot(&mut item.block) else {
                    return Err(syn::Error::new(
                        item.sig.ident.span(),
                        "internal: lost the body",
                    ));
                };
                let body = slot.body.to_token_stream();
                let locked = self.locked(&body, Some(self.self_ident.clone()));
                *slot.body = Expr::Verbatim(quote!({ #locked }));
            }
        }
        Ok(item.into_token_stream())
    }

    // Input:
    //     #[dlock(key = "order:<id>", timeout = "5s")]
    //     async fn create(id: u64) -> Result<Order, AppError> { body }
    //
    // Output (the statements of the new body; signature and attributes are unchanged):
    //     let __dlock_key = { /* see `key` */ };
    //     let __dlock_acquired = ::dlock_runtime::__private::acquire(
    //         ::dlock_runtime::__private::global(),
    //         __dlock_key,
    //         ::dlock_runtime::__private::options("order:<id>")
    //             .timeout(::core::time::Duration::new(5u64, 0u32)),
    //     ).await;
    //     let __dlock_result = match __dlock_acquired {
    //         ::core::result::Result::Ok(__dlock_guard) => {
    //             ::dlock_runtime::__private::run(__dlock_guard, ::dlock_runtime::__private::OnLost::Abort, async move {
    //                 if let Some(__dlock_ret) = None::<Result<Order, AppError>> { return __dlock_ret; }
    //                 let _ = &param;   // for each `mut` by-value parameter, see `names::mut_by_value`
    //                 body
    //             }).await
    //         }
    //         ::core::result::Result::Err(__dlock_error) => ::core::result::Result::Err(__dlock_error),
    //     };
    //     match __dlock_result {
    //         ::core::result::Result::Ok(__dlock_value) => __dlock_value,
    //         ::core::result::Result::Err(__dlock_error) => {
    //             <_ as ::dlock_runtime::__private::FailInto>::from_lock_error(__dlock_error)
    //         }
    //     }
    //
    // One place turns a `LockError` into the return value, so a wrong `on_fail` is one error.
    // The acquisition is its own statement: a `client = &state.locks` borrow ends there, before
    // the body's `async move` takes `state`.
    //
    // After `#[async_trait]` the same statements replace `{ body }` in `let __ret: R = { body };`,
    // and a `self` in `client` is spelled `__self` like the rest of the rewritten method.
    /// The locked body: the key, the acquisition, then the original body run under the guard.
    fn locked(&self, body: &TokenStream, self_rename: Option<Ident>) -> TokenStream {
        let krate = &self.krate;
        let private = quote!(#krate::__private);
        let key_var = Ident::new("__dlock_key", Span::mixed_site());
        let acquired_var = Ident::new("__dlock_acquired", Span::mixed_site());
        let guard_var = Ident::new("__dlock_guard", Span::mixed_site());
        let result_var = Ident::new("__dlock_result", Span::mixed_site());
        let error_var = Ident::new("__dlock_error", Span::mixed_site());
        let value_var = Ident::new("__dlock_value", Span::mixed_site());

        let key = self.key();
        let client = match &self.args.client {
            None => quote!(#private::global()),
            Some(expr) => {
                let mut expr = expr.clone();
                if let Some(to) = self_rename {
                    RenameSelf { to }.visit_expr_mut(&mut expr);
                }
                quote!(#private::client(#expr))
            }
        };
        let options = self.options();
        let fail = self.fail(&error_var);
        let on_lost = match self.args.on_lost {
            OnLost::Abort => quote!(#private::OnLost::Abort),
            OnLost::Continue => quote!(#private::OnLost::Continue),
        };
        let fake_return = self.fake_return();
        let capture_whole = &self.capture_whole;
        quote! {
            #[allow(unknown_lints, clippy::all, clippy::pedantic)]
            let #key_var = #key;
            #[allow(unknown_lints, clippy::all, clippy::pedantic)]
            let #acquired_var = #private::acquire(#client, #key_var, #options).await;
            #[allow(unknown_lints, clippy::all, clippy::pedantic)]
            let #result_var = match #acquired_var {
                ::core::result::Result::Ok(#guard_var) => {
                    #private::run(#guard_var, #on_lost, async move {
                        #fake_return
                        #(
                            #[allow(unknown_lints, clippy::all, clippy::pedantic)]
                            let _ = &#capture_whole;
                        )*
                        #body
                    }).await
                }
                ::core::result::Result::Err(#error_var) => ::core::result::Result::Err(#error_var),
            };
            match #result_var {
                ::core::result::Result::Ok(#value_var) => #value_var,
                ::core::result::Result::Err(#error_var) => #fail,
            }
        }
    }

    // Input:  key = "order:<id>:<req.user.0>"
    // Output:
    //     {
    //         #[diagnostic::on_unimplemented(message = "the `#[dlock]` key placeholder `<id>` must implement `Display`", ..)]
    //         trait __DlockKey0 { fn __dlock_display(&self) -> &dyn ::core::fmt::Display; }
    //         impl<T: ::core::fmt::Display> __DlockKey0 for T { fn __dlock_display(&self) -> &dyn ::core::fmt::Display { self } }
    //         /* the same for `<req.user.0>` as __DlockKey1 */
    //         ::dlock_runtime::__private::key(::core::format_args!(
    //             "order:{}:{}",
    //             __DlockKey0::__dlock_display(&id),
    //             __DlockKey1::__dlock_display(&req.user.0),
    //         ))
    //     }
    // All placeholder tokens carry the key literal's span, so a placeholder that is not
    // `Display` is reported on the key, naming the placeholder.
    /// The expression that builds the key from borrowed arguments.
    fn key(&self) -> TokenStream {
        let krate = &self.krate;
        let span = self.key.span();
        let mut format = String::new();
        let mut checks = TokenStream::new();
        let mut values = Vec::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => format.push_str(&key::escape_format(text)),
                Part::Placeholder(placeholder) => {
                    format.push_str("{}");
                    let check = format_ident!("__DlockKey{}", values.len(), span = span);
                    checks.extend(display_check(&check, placeholder, span));
                    let value = self.placeholder_expr(placeholder);
                    values.push(quote_spanned!(span=> #check::__dlock_display(&#value)));
                }
            }
        }
        let format = LitStr::new(&format, span);
        quote! {
            {
                #checks
                #krate::__private::key(::core::format_args!(#format #(, #values)*))
            }
        }
    }

    // Input:  <self.tenant.0>
    // Output: self.tenant.0      (`__self.tenant.0` after `#[async_trait]`)
    /// The place a placeholder names, spanned at the key literal.
    fn placeholder_expr(&self, placeholder: &Placeholder) -> TokenStream {
        let span = self.key.span();
        let mut tokens = if placeholder.root == "self" {
            self.self_ident.to_token_stream()
        } else if let Some(raw) = placeholder.root.strip_prefix("r#") {
            Ident::new_raw(raw, span).to_token_stream()
        } else {
            Ident::new(&placeholder.root, span).to_token_stream()
        };
        for field in &placeholder.fields {
            match field {
                Field::Named(name) => {
                    let name = match name.strip_prefix("r#") {
                        Some(raw) => Ident::new_raw(raw, span),
                        None => Ident::new(name, span),
                    };
                    tokens.extend(quote_spanned!(span=> .#name));
                }
                Field::Index(index) => {
                    let index = syn::Index {
                        index: *index,
                        span,
                    };
                    tokens.extend(quote_spanned!(span=> .#index));
                }
            }
        }
        tokens
    }

    // Input:  key = "order:<id>", timeout = "5s", expire = "auto", max_hold = "10m", fair = true,
    //         hold_at_least = "5m"                       | permits = 3      | read    | write
    // Output: ::dlock_runtime::__private::options("order:<id>")
    //             .timeout(::core::time::Duration::new(5u64, 0u32))
    //             .expire_auto()
    //             .max_hold(::core::time::Duration::new(600u64, 0u32))
    //             .fair()
    //             .hold_at_least(::core::time::Duration::new(300u64, 0u32))
    //                                                    | .permits(3u32)   | .read() | .write()
    /// The `LockOptions` the arguments ask for; what is not given comes from the locker.
    fn options(&self) -> TokenStream {
        let krate = &self.krate;
        // The template names the lock in logs and metrics (the full key has unbounded values).
        let template = &self.args.key;
        let mut options = quote!(#krate::__private::options(#template));
        if let Some(timeout) = self.args.timeout {
            let timeout = duration::to_tokens(timeout);
            options.extend(quote!(.timeout(#timeout)));
        }
        match self.args.expire {
            Some(Expire::Fixed(expire)) => {
                let expire = duration::to_tokens(expire);
                options.extend(quote!(.expire(#expire)));
            }
            Some(Expire::Auto) => options.extend(quote!(.expire_auto())),
            None => {}
        }
        if let Some(max_hold) = self.args.max_hold {
            let max_hold = duration::to_tokens(max_hold);
            options.extend(quote!(.max_hold(#max_hold)));
        }
        if self.args.fair {
            options.extend(quote!(.fair()));
        }
        if let Some(minimum) = self.args.hold_at_least {
            let minimum = duration::to_tokens(minimum);
            options.extend(quote!(.hold_at_least(#minimum)));
        }
        match self.args.kind {
            Some(Kind::Permits(permits)) => options.extend(quote!(.permits(#permits))),
            Some(Kind::Read) => options.extend(quote!(.read())),
            Some(Kind::Write) => options.extend(quote!(.write())),
            None => {}
        }
        options
    }

    // Input:  on_fail = busy          | no on_fail
    // Output: busy(__dlock_error)     | <_ as ::dlock_runtime::__private::FailInto>::from_lock_error(__dlock_error)
    // The `FailInto` path is spanned at the return type, where its "not a `Result<T, E>` with
    // `E: From<LockError>`" diagnostic belongs.
    /// Turns the `LockError` in `error` into the function's return value.
    fn fail(&self, error: &Ident) -> TokenStream {
        if let Some(handler) = &self.args.on_fail {
            // The call takes the handler's span, so a handler returning the wrong type is
            // reported on the handler.
            let span = syn::spanned::Spanned::span(handler);
            return quote_spanned!(span=> #handler(#error));
        }
        let krate = &self.krate;
        let convert = quote_spanned!(self.output_span=>
            <_ as #krate::__private::FailInto>::from_lock_error
        );
        quote!(#convert(#error))
    }

    // Input:  -> Result<impl Display, E>
    // Output: #[allow(..)] if let ::core::option::Option::Some(__dlock_ret) =
    //             ::core::option::Option::None::<Result<_, E>> { return __dlock_ret; }
    // Gives the `async move` block its output type, so `?` in the body knows what to convert
    // into (tracing's fake return, in async-trait's spelling: no unreachable code).
    /// The inference edge for the body's `async move` block; nothing for `()`.
    fn fake_return(&self) -> TokenStream {
        let Some(output) = &self.output else {
            return TokenStream::new();
        };
        let ret = Ident::new("__dlock_ret", Span::mixed_site());
        quote! {
            #[allow(unknown_lints, unreachable_code, clippy::all, clippy::pedantic)]
            if let ::core::option::Option::Some(#ret) = ::core::option::Option::None::<#output> {
                return #ret;
            }
        }
    }
}

// Input:  __DlockKey0, <id>
// Output:
//     #[diagnostic::on_unimplemented(message = "..`<id>`..", label = "..", note = "..")]
//     trait __DlockKey0 { fn __dlock_display(&self) -> &dyn ::core::fmt::Display; }
//     impl<T: ::core::fmt::Display> __DlockKey0 for T { .. { self } }
/// A trait that holds exactly for `Display` types and whose error names the placeholder.
fn display_check(name: &Ident, placeholder: &Placeholder, span: Span) -> TokenStream {
    let source = placeholder.source();
    let message = LitStr::new(
        &format!("the `#[dlock]` key placeholder `{source}` must implement `Display`"),
        span,
    );
    let label = LitStr::new(
        &format!("`{source}` has type `{{Self}}`, which does not implement `Display`"),
        span,
    );
    let note = LitStr::new(
        "the key is formatted with `Display`; name a field that implements it, \
         or implement `Display` for `{Self}`",
        span,
    );
    quote_spanned! {span=>
        #[allow(unknown_lints, non_camel_case_types, unreachable_pub, clippy::all, clippy::pedantic)]
        #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
        trait #name {
            fn __dlock_display(&self) -> &dyn ::core::fmt::Display;
        }
        #[allow(unknown_lints, clippy::all, clippy::pedantic)]
        impl<T: ::core::fmt::Display> #name for T {
            fn __dlock_display(&self) -> &dyn ::core::fmt::Display {
                self
            }
        }
    }
}

/// "no parameter named `idd`; parameters: `id`, `qty`".
fn unknown_name(placeholder: &Placeholder, names: &[String]) -> String {
    let root = &placeholder.root;
    // After `#[async_trait]`, `__self` and `__argN` are its names, not the user's; each name
    // is listed once although the rewritten method binds it twice.
    let mut visible: Vec<String> = Vec::new();
    for name in names.iter().filter(|name| !name.starts_with("__")) {
        let name = format!("`{name}`");
        if !visible.contains(&name) {
            visible.push(name);
        }
    }
    if root == "self" {
        let listed = if visible.is_empty() {
            "none".to_owned()
        } else {
            visible.join(", ")
        };
        format!(
            "the key placeholder `{}` needs a method receiver, but this function has no `self` \
             parameter; parameters: {listed}",
            placeholder.source()
        )
    } else if visible.is_empty() {
        format!(
            "no parameter named `{root}` for the key placeholder `{}`; this function has no \
             parameters, so the key can only be text",
            placeholder.source()
        )
    } else {
        format!(
            "no parameter named `{root}` for the key placeholder `{}`; parameters: {}",
            placeholder.source(),
            visible.join(", ")
        )
    }
}

/// Why `output` can never be a `Result`, judged by its syntax alone; `None` when it is, or may
/// be (a type alias), which the runtime's `FailInto` then decides.
fn not_a_result(output: Option<&Type>) -> Option<String> {
    let Some(ty) = output else {
        return Some("`()`".to_owned());
    };
    match ty {
        Type::Paren(paren) => not_a_result(Some(&paren.elem)),
        Type::Group(group) => not_a_result(Some(&group.elem)),
        Type::Tuple(tuple) if tuple.elems.is_empty() => Some("`()`".to_owned()),
        Type::Tuple(_) => Some("a tuple".to_owned()),
        Type::ImplTrait(_) => Some("`impl Trait`".to_owned()),
        Type::Reference(_) => Some("a reference".to_owned()),
        Type::Never(_) => Some("`!`".to_owned()),
        Type::Array(_) | Type::Slice(_) => Some("an array".to_owned()),
        Type::Ptr(_) => Some("a raw pointer".to_owned()),
        Type::FnPtr(_) => Some("a function pointer".to_owned()),
        Type::TraitObject(_) => Some("a trait object".to_owned()),
        _ => None,
    }
}

/// Replaces `impl Trait` with `_` in a type that generated code must spell (tracing's
/// `erase_impl_trait`).
fn erase_impl_trait(mut ty: Type) -> Type {
    struct Erase;
    impl VisitMut for Erase {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(impl_trait) = ty {
                let span = syn::spanned::Spanned::span(&*impl_trait);
                *ty = Type::Infer(syn::TypeInfer {
                    attrs: Vec::new(),
                    underscore_token: syn::Token![_](span),
                });
            } else {
                visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    Erase.visit_type_mut(&mut ty);
    ty
}

/// Spells `self` as `__self` in a `client` expression, as `#[async_trait]` did in the body.
struct RenameSelf {
    to: Ident,
}

impl VisitMut for RenameSelf {
    fn visit_expr_path_mut(&mut self, path: &mut ExprPath) {
        if path.qself.is_none() && path.path.is_ident("self") {
            let span = path.path.segments[0].ident.span();
            let mut to = self.to.clone();
            to.set_span(span);
            path.path = to.into();
        }
        visit_mut::visit_expr_path_mut(self, path);
    }
}
