//! Normalised DNs as text (RDNs joined by unescaped commas, as
//! `View::normalize_rdns` makes them): scope tests for entries held in
//! memory (changes, virtual trees, a consumer's subtree), where there is no
//! stored parent chain to walk.

use pando_proto::Scope;

/// Whether the entry named `norm` is within `scope` of `base` (both
/// normalised DNs, RDNs joined by unescaped commas): for entries held in
/// memory (changes, virtual trees), where there is no stored parent chain.
pub fn in_scope(base: &str, scope: Scope, norm: &str) -> bool {
    match scope {
        Scope::Base => norm == base,
        Scope::One => parent_of(norm) == Some(base),
        Scope::Sub => norm == base || is_below(norm, base),
        Scope::Children => is_below(norm, base),
    }
}

/// The DN after the first unescaped comma (None for a one-RDN DN).
pub fn parent_of(norm: &str) -> Option<&str> {
    let bytes = norm.as_bytes();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\\' if !escaped => escaped = true,
            b',' if !escaped => return Some(&norm[i + 1..]),
            _ => escaped = false,
        }
    }
    None
}

/// Whether `norm` names an entry strictly below `base`.
fn is_below(norm: &str, base: &str) -> bool {
    let mut rest = norm;
    while let Some(parent) = parent_of(rest) {
        if parent == base {
            return true;
        }
        rest = parent;
    }
    // Every entry is below the root (the empty DN).
    base.is_empty() && !norm.is_empty()
}

/// The RDNs of a normalised DN (split at unescaped commas), as
/// `View::lookup_norm` takes them.
pub fn split_rdns(norm: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = norm;
    while let Some(parent) = parent_of(rest) {
        out.push(rest[..rest.len() - parent.len() - 1].to_string());
        rest = parent;
    }
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_unescaped_commas() {
        let base = "dc=example,dc=com";
        let child = "ou=people,dc=example,dc=com";
        let grandchild = "uid=a,ou=people,dc=example,dc=com";
        // One RDN whose value holds an escaped comma and the base's text.
        let lookalike = "cn=x\\,dc=example,dc=com";
        assert!(in_scope(base, Scope::Base, base));
        assert!(!in_scope(base, Scope::Base, child));
        assert!(in_scope(base, Scope::One, child));
        assert!(!in_scope(base, Scope::One, grandchild));
        assert!(!in_scope(base, Scope::One, base));
        assert!(in_scope(base, Scope::Sub, base));
        assert!(in_scope(base, Scope::Sub, grandchild));
        assert!(!in_scope(base, Scope::Children, base));
        assert!(in_scope(base, Scope::Children, grandchild));
        assert!(!in_scope(base, Scope::Sub, lookalike));
        assert!(in_scope("dc=com", Scope::One, lookalike));
        assert!(!in_scope(base, Scope::Sub, "dc=other,dc=com"));
        assert!(in_scope("", Scope::Sub, base));
        assert_eq!(parent_of("cn=a\\\\,dc=com"), Some("dc=com"));
    }

    #[test]
    fn rdns_split_at_unescaped_commas() {
        assert_eq!(split_rdns("cn=a\\,b,dc=com"), ["cn=a\\,b", "dc=com"]);
        assert_eq!(split_rdns("dc=com"), ["dc=com"]);
        assert!(split_rdns("").is_empty());
    }
}
