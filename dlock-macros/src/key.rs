//! The key template: `"order:<id>"`, `"tenant:<self.tenant>:<req.user.0>"`, `"a<<b"`.
//!
//! Text is copied as is; `<path>` is a placeholder; `<<` is a literal `<`; a `>` outside a
//! placeholder is literal text.

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// Text copied into the key unchanged.
    Text(String),
    /// `<root.field.0>`: a name bound by a parameter (or `self`) and field accesses.
    Placeholder(Placeholder),
}

/// `<root.field.0>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// The first name: a parameter-bound name or `self`.
    pub(crate) root: String,
    /// The accesses after it, in order.
    pub(crate) fields: Vec<Field>,
}

/// One `.name` or `.0` after a placeholder's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Field {
    /// `.user_id`
    Named(String),
    /// `.0`
    Index(u32),
}

impl Placeholder {
    /// The placeholder as the user wrote it, for messages: `<req.user.0>`.
    pub(crate) fn source(&self) -> String {
        let mut text = format!("<{}", self.root);
        for field in &self.fields {
            text.push('.');
            match field {
                Field::Named(name) => text.push_str(name),
                Field::Index(index) => text.push_str(&index.to_string()),
            }
        }
        text.push('>');
        text
    }
}

const LITERAL_LT: &str = "(write `<<` for a literal `<`)";

/// Splits `template` into text and placeholders. The error is a message; the caller puts it
/// on the key literal.
pub(crate) fn parse(template: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        if let Some(after_escape) = after.strip_prefix('<') {
            text.push('<');
            rest = after_escape;
            continue;
        }
        let Some(close) = after.find('>') else {
            return Err(format!(
                "unterminated placeholder `<{after}` in `key`; close it with `>` {LITERAL_LT}"
            ));
        };
        let inside = &after[..close];
        if inside.contains('<') {
            let unclosed = &inside[..inside.find('<').unwrap_or(inside.len())];
            return Err(format!(
                "unterminated placeholder `<{unclosed}` in `key`; close it with `>` {LITERAL_LT}"
            ));
        }
        let placeholder = parse_placeholder(inside)?;
        if !text.is_empty() {
            parts.push(Part::Text(std::mem::take(&mut text)));
        }
        parts.push(Part::Placeholder(placeholder));
        rest = &after[close + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// Parses the inside of `<...>`.
fn parse_placeholder(inside: &str) -> Result<Placeholder, String> {
    if inside.trim().is_empty() {
        return Err(format!(
            "empty placeholder `<{inside}>` in `key`; name a parameter inside it, like `<id>` \
             {LITERAL_LT}"
        ));
    }
    let invalid = || {
        format!(
            "invalid placeholder `<{inside}>` in `key`; a placeholder is a parameter name \
             followed by field accesses, like `<id>`, `<req.user_id>` or `<self.0>` {LITERAL_LT}"
        )
    };
    let mut segments = inside.split('.');
    let root = segments.next().unwrap_or_default();
    if !is_identifier(root) {
        return Err(invalid());
    }
    let mut fields = Vec::new();
    for segment in segments {
        if is_identifier(segment) {
            fields.push(Field::Named(segment.to_owned()));
        } else if is_index(segment) {
            fields.push(Field::Index(segment.parse().map_err(|_| invalid())?));
        } else {
            return Err(invalid());
        }
    }
    Ok(Placeholder {
        root: root.to_owned(),
        fields,
    })
}

/// `name`, `_name`, `r#type`: what can follow a `.` or start a placeholder.
fn is_identifier(text: &str) -> bool {
    let text = text.strip_prefix("r#").unwrap_or(text);
    let mut chars = text.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first == '_' || first.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && text != "_"
}

/// `0`, `12`: a tuple field; no sign, no leading zero, as rustc writes them.
fn is_index(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// Escapes `text` for a `format_args!` string: braces are doubled.
pub(crate) fn escape_format(text: &str) -> String {
    text.replace('{', "{{").replace('}', "}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Part {
        Part::Text(s.to_owned())
    }

    fn ph(root: &str, fields: &[Field]) -> Part {
        Part::Placeholder(Placeholder {
            root: root.to_owned(),
            fields: fields.to_vec(),
        })
    }

    #[test]
    fn text_only() {
        assert_eq!(parse("orders").unwrap(), vec![text("orders")]);
        assert_eq!(parse("a>b").unwrap(), vec![text("a>b")]);
        assert_eq!(parse("{x}").unwrap(), vec![text("{x}")]);
    }

    #[test]
    fn placeholders() {
        assert_eq!(
            parse("order:<id>").unwrap(),
            vec![text("order:"), ph("id", &[])]
        );
        assert_eq!(
            parse("<self.tenant>:<req.user.0>!").unwrap(),
            vec![
                ph("self", &[Field::Named("tenant".into())]),
                text(":"),
                ph("req", &[Field::Named("user".into()), Field::Index(0)]),
                text("!"),
            ]
        );
        assert_eq!(parse("<a><b>").unwrap(), vec![ph("a", &[]), ph("b", &[])]);
        assert_eq!(parse("<_x>").unwrap(), vec![ph("_x", &[])]);
        assert_eq!(parse("<r#type>").unwrap(), vec![ph("r#type", &[])]);
        assert_eq!(parse("<größe>").unwrap(), vec![ph("größe", &[])]);
    }

    #[test]
    fn escapes() {
        assert_eq!(parse("a<<b").unwrap(), vec![text("a<b")]);
        assert_eq!(
            parse("<<<id>>").unwrap(),
            vec![text("<"), ph("id", &[]), text(">")]
        );
        assert_eq!(parse("<<>").unwrap(), vec![text("<>")]);
    }

    #[test]
    fn errors() {
        assert!(
            parse("a<>")
                .unwrap_err()
                .starts_with("empty placeholder `<>`")
        );
        assert!(
            parse("a< >")
                .unwrap_err()
                .starts_with("empty placeholder `< >`")
        );
        assert!(
            parse("order:<id")
                .unwrap_err()
                .starts_with("unterminated placeholder `<id`")
        );
        assert!(
            parse("<a<b>")
                .unwrap_err()
                .starts_with("unterminated placeholder `<a`")
        );
        for bad in [
            "<a b>", "<a.>", "<.a>", "<a..b>", "<1>", "<a+1>", "<a.01>", "<_>", "<a()>",
        ] {
            assert!(
                parse(bad).unwrap_err().starts_with("invalid placeholder"),
                "{bad}"
            );
        }
    }

    #[test]
    fn source_round_trips() {
        let Part::Placeholder(p) = &parse("<req.user.0>").unwrap()[0] else {
            panic!()
        };
        assert_eq!(p.source(), "<req.user.0>");
    }

    #[test]
    fn format_escaping() {
        assert_eq!(escape_format("{a}:}"), "{{a}}:}}");
    }
}
