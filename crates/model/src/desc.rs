//! Attribute descriptions (RFC 4512 2.5): a type (name or OID) and
//! options (`cn;lang-en;binary`). The one place that splits them: every
//! crate asks here for a description's base type or options.

use crate::Schema;

/// The type part of a description (`cn;lang-en` → `cn`), as written.
pub fn base(desc: &str) -> &str {
    match desc.find(';') {
        Some(i) => &desc[..i],
        None => desc,
    }
}

/// The options of a description, as written, in order (empty ones, as in
/// `cn;;x`, are kept for the caller to refuse).
pub fn options(desc: &str) -> impl Iterator<Item = &str> {
    desc.split(';').skip(1)
}

/// Whether `desc` has `option` (options compare without case).
pub fn has_option(desc: &str, option: &str) -> bool {
    options(desc).any(|o| o.eq_ignore_ascii_case(option))
}

/// Whether `desc`'s type is the one named `name` in `schema` (by any of
/// its names or its OID); a type the schema lacks compares by text.
pub fn is_type(schema: &Schema, desc: &str, name: &str) -> bool {
    let b = base(desc);
    match (schema.attribute(b), schema.attribute(name)) {
        (Some(x), Some(y)) => x.oid == y.oid,
        _ => b.eq_ignore_ascii_case(name),
    }
}

/// `desc` is userPassword, with or without options.
pub fn is_password(desc: &str) -> bool {
    base(desc).eq_ignore_ascii_case("userPassword")
}

/// Whether a description a client sent names userPassword, by any of its
/// names or its OID (`2.5.4.35;x` too). Stored descriptions are canonical,
/// so [`is_password`] serves for them.
pub fn names_password(schema: &Schema, desc: &str) -> bool {
    let base = base(desc);
    schema
        .attribute(base)
        .is_some_and(|at| at.oid == USER_PASSWORD_OID)
}

const USER_PASSWORD_OID: &str = "2.5.4.35";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_options() {
        assert_eq!(base("cn;lang-en;binary"), "cn");
        assert_eq!(base("cn"), "cn");
        assert_eq!(base(""), "");
        assert_eq!(
            options("cn;lang-en;binary").collect::<Vec<_>>(),
            ["lang-en", "binary"]
        );
        assert_eq!(options("cn").count(), 0);
        assert!(has_option("userCertificate;BINARY", "binary"));
        assert!(!has_option("cn", "binary"));
        let schema = Schema::standard();
        assert!(is_type(&schema, "2.5.4.3;x", "commonName"));
        assert!(is_type(&schema, "CN", "cn"));
        assert!(!is_type(&schema, "sn", "cn"));
        assert!(is_type(&schema, "unknownType;x", "UNKNOWNTYPE"));
    }
}
