//! Attribute descriptions (RFC 4512 2.5): a type (name or OID) and
//! options (`cn;lang-en;binary`). The one place that splits them: every
//! crate asks here for a description's base type or options.

/// An attribute description as written: its type (a name or an OID) and
/// its options. Splitting is done once, here; the schema gives its
/// canonical form (`Schema::canonical_desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrDesc<'a> {
    text: &'a str,
    /// Where the type ends (the first `;`, or the text's end).
    end: usize,
}

impl<'a> AttrDesc<'a> {
    pub fn new(text: &'a str) -> AttrDesc<'a> {
        // A plain byte scan: descriptions are short, and `;` is ASCII, so
        // its index is a character boundary.
        let end = text.bytes().position(|b| b == b';').unwrap_or(text.len());
        AttrDesc { text, end }
    }

    /// The description as written.
    pub fn as_str(&self) -> &'a str {
        self.text
    }

    /// The type part (`cn;lang-en` → `cn`), as written.
    pub fn base(&self) -> &'a str {
        &self.text[..self.end]
    }

    /// The options, as written, in order (empty ones, as in `cn;;x`, are
    /// kept for the caller to refuse).
    pub fn options(&self) -> impl Iterator<Item = &'a str> {
        let rest = &self.text[self.end..];
        rest.split(';').skip(1)
    }

    /// Whether it has options at all.
    pub fn has_options(&self) -> bool {
        self.end < self.text.len()
    }

    /// Whether it has `option` (options compare without case).
    pub fn has_option(&self, option: &str) -> bool {
        self.options().any(|o| o.eq_ignore_ascii_case(option))
    }
}

/// The type part of a description (`cn;lang-en` → `cn`), as written.
pub fn base(desc: &str) -> &str {
    AttrDesc::new(desc).base()
}

/// Whether `desc` has `option` (options compare without case).
pub fn has_option(desc: &str, option: &str) -> bool {
    AttrDesc::new(desc).has_option(option)
}

/// `desc` is userPassword, with or without options.
pub fn is_password(desc: &str) -> bool {
    base(desc).eq_ignore_ascii_case("userPassword")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_options() {
        assert_eq!(base("cn;lang-en;binary"), "cn");
        assert_eq!(base("cn"), "cn");
        assert_eq!(base(""), "");
        assert_eq!(
            AttrDesc::new("cn;lang-en;binary")
                .options()
                .collect::<Vec<_>>(),
            ["lang-en", "binary"]
        );
        assert_eq!(AttrDesc::new("cn").options().count(), 0);
        assert!(!AttrDesc::new("cn").has_options());
        assert!(AttrDesc::new("cn;x").has_options());
        assert!(has_option("userCertificate;BINARY", "binary"));
        assert!(!has_option("cn", "binary"));
    }
}
