//! Authentication policy: which identities hold the administrator role, the
//! break-glass identity, and the mapping of SASL EXTERNAL identities
//! (RFC 4422 appendix A, RFC 4513 5.2.3) to directory entries.
//!
//! Compiled once from `[auth]`; binds consult it.

use pando_model::{Dn, Schema};
use regex::Regex;

use crate::{PeerCred, Session};
use pando_config::{AuthConfig, ExternalMap, LDAPI_OWNER};

/// The authorization DN of an ldapi peer, as OpenLDAP forms it.
pub fn peercred_dn(c: PeerCred) -> String {
    format!(
        "gidNumber={}+uidNumber={},cn=peercred,cn=external,cn=auth",
        c.gid, c.uid
    )
}

/// Is `norm` the ldapi owner's own EXTERNAL identity? The peer must run as
/// the server's Unix user or root, and the bound identity must be that
/// peer's credentials themselves: a simple bind as some entry over the same
/// socket is that entry, not the owner.
fn is_ldapi_owner(norm: &str, session: &Session) -> bool {
    // Asked on every bind: the system call only for ldapi peers.
    session.peer_cred.is_some_and(|c| {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        (c.uid == me || c.uid == 0) && norm.eq_ignore_ascii_case(&peercred_dn(c))
    })
}

/// An identity named in `[auth]`: a normalised DN or the ldapi owner.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Named {
    LdapiOwner,
    Dn(String),
}

impl Named {
    fn parse(s: &str, schema: &Schema) -> Result<Named, String> {
        if s == LDAPI_OWNER {
            return Ok(Named::LdapiOwner);
        }
        let dn = Dn::parse(s).map_err(|e| format!("'{s}': {e}"))?;
        Ok(Named::Dn(schema.normalize_dn(&dn)?))
    }

    fn matches(&self, norm: &str, session: &Session) -> bool {
        match self {
            Named::LdapiOwner => is_ldapi_owner(norm, session),
            Named::Dn(d) => d == norm,
        }
    }
}

/// Where a mapped EXTERNAL identity points.
#[derive(Debug)]
pub enum MapTarget {
    /// A DN template (`$1`… replaced).
    Dn(String),
    /// The single entry under `base` matching the filter template.
    Search { base: String, filter: String },
}

#[derive(Debug)]
pub struct CompiledMap {
    pattern: Regex,
    pub target: MapTarget,
}

impl CompiledMap {
    /// The target with the pattern's groups substituted, if `authz` matches.
    /// Substituted values are escaped for the place they land in.
    pub fn apply(&self, authz_norm: &str) -> Option<MapTarget> {
        let caps = self.pattern.captures(authz_norm)?;
        let subst = |tmpl: &str, escape: fn(&str) -> String| {
            let mut out = String::new();
            let mut chars = tmpl.chars().peekable();
            while let Some(c) = chars.next() {
                if c == '$' {
                    if let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                        chars.next();
                        if let Some(m) = caps.get(d as usize) {
                            out.push_str(&escape(m.as_str()));
                        }
                        continue;
                    }
                }
                out.push(c);
            }
            out
        };
        Some(match &self.target {
            MapTarget::Dn(t) => MapTarget::Dn(subst(t, escape_dn_value)),
            MapTarget::Search { base, filter } => MapTarget::Search {
                base: base.clone(),
                filter: subst(filter, escape_filter_value),
            },
        })
    }
}

/// A value for a DN, escaped as the DN parser reads it back (RFC 4514: a
/// trailing space and control bytes too, so a name cannot map to another
/// entry by losing them).
fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    pando_model::dn::escape_value(v.as_bytes(), &mut out);
    out
}

fn escape_filter_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '*' => out.push_str("\\2a"),
            '(' => out.push_str("\\28"),
            ')' => out.push_str("\\29"),
            '\\' => out.push_str("\\5c"),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
    out
}

/// Check one `[[auth.external_map]]` rule; the error says what is wrong.
pub fn compile_map(m: &ExternalMap) -> Result<CompiledMap, String> {
    let pattern = Regex::new(&format!("^(?i:{})$", m.pattern))
        .map_err(|e| format!("pattern '{}' is not a regular expression: {e}", m.pattern))?;
    let target = match (&m.dn, &m.base, &m.filter) {
        (Some(dn), None, None) => MapTarget::Dn(dn.clone()),
        (None, Some(base), Some(filter)) => {
            Dn::parse(base).map_err(|e| format!("base '{base}' is not a DN: {e}"))?;
            // The template must parse once a sample value is substituted.
            let sample = filter.replace('$', "x");
            pando_proto::Filter::parse(&sample)
                .map_err(|e| format!("filter '{filter}' is not a filter: {e}"))?;
            MapTarget::Search {
                base: base.clone(),
                filter: filter.clone(),
            }
        }
        _ => return Err("give either dn, or base and filter".to_string()),
    };
    Ok(CompiledMap { pattern, target })
}

/// The compiled `[auth]` section.
#[derive(Debug)]
pub struct AuthPolicy {
    pub require_secure_binds: bool,
    admins: Vec<Named>,
    break_glass: Option<Named>,
    pub maps: Vec<CompiledMap>,
}

impl AuthPolicy {
    /// Compile a validated configuration (validation already reported errors).
    pub fn new(cfg: &AuthConfig, schema: &Schema) -> Result<AuthPolicy, String> {
        Ok(AuthPolicy {
            require_secure_binds: cfg.require_secure_binds,
            admins: cfg
                .admins
                .iter()
                .map(|a| Named::parse(a, schema))
                .collect::<Result<_, _>>()?,
            break_glass: cfg
                .break_glass
                .as_deref()
                .map(|b| Named::parse(b, schema))
                .transpose()?,
            maps: cfg
                .external_map
                .iter()
                .map(compile_map)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Does the identity with normalised DN `norm` hold the administrator role?
    pub fn is_admin(&self, norm: &str, session: &Session) -> bool {
        self.admins.iter().any(|a| a.matches(norm, session))
    }

    /// Break-glass applies only over ldapi.
    pub fn is_break_glass(&self, norm: &str, session: &Session) -> bool {
        session.peer_cred.is_some()
            && self
                .break_glass
                .as_ref()
                .is_some_and(|b| b.matches(norm, session))
    }

    /// The first mapping rule that matches `authz_norm`, substituted.
    pub fn map_external(&self, authz_norm: &str) -> Option<MapTarget> {
        self.maps.iter().find_map(|m| m.apply(authz_norm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(
        pattern: &str,
        dn: Option<&str>,
        base: Option<&str>,
        filter: Option<&str>,
    ) -> ExternalMap {
        ExternalMap {
            pattern: pattern.into(),
            dn: dn.map(Into::into),
            base: base.map(Into::into),
            filter: filter.map(Into::into),
        }
    }

    #[test]
    fn dn_template_substitutes_and_escapes() {
        let m = compile_map(&map(
            r"gidnumber=(\d+)\+uidnumber=(\d+),cn=peercred,cn=external,cn=auth",
            Some("uid=u$2,ou=People,dc=example,dc=com"),
            None,
            None,
        ))
        .unwrap();
        match m.apply("gidnumber=100+uidnumber=1000,cn=peercred,cn=external,cn=auth") {
            Some(MapTarget::Dn(d)) => assert_eq!(d, "uid=u1000,ou=People,dc=example,dc=com"),
            other => panic!("{other:?}"),
        }
        assert!(m.apply("cn=someone else").is_none());
        let m = compile_map(&map("cn=(.*)", Some("cn=$1,dc=x"), None, None)).unwrap();
        match m.apply("cn=a,b") {
            Some(MapTarget::Dn(d)) => assert_eq!(d, "cn=a\\,b,dc=x"),
            other => panic!("{other:?}"),
        }
        // A trailing space or a control byte stays in the value: "bob " does
        // not become bob.
        for (name, value) in [("cn=bob ", "bob "), ("cn=bob\u{1}", "bob\u{1}")] {
            let Some(MapTarget::Dn(d)) = m.apply(name) else {
                panic!("{name:?}")
            };
            let parsed = Dn::parse(&d).unwrap();
            assert_eq!(parsed.rdns[0].avas[0].value, value.as_bytes(), "{d}");
        }
    }

    #[test]
    fn filter_template_escapes() {
        let m = compile_map(&map("cn=(.*)", None, Some("dc=x"), Some("(cn=$1)"))).unwrap();
        match m.apply("cn=a*)(b") {
            Some(MapTarget::Search { filter, .. }) => assert_eq!(filter, "(cn=a\\2a\\29\\28b)"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_rules_are_explained() {
        assert!(compile_map(&map("(", Some("cn=x"), None, None))
            .unwrap_err()
            .contains("regular expression"));
        assert!(compile_map(&map("x", None, None, None))
            .unwrap_err()
            .contains("either dn"));
        assert!(compile_map(&map("x", None, Some("dc=x"), Some("(((")))
            .unwrap_err()
            .contains("not a filter"));
    }

    #[test]
    fn ldapi_owner_and_break_glass_need_ldapi() {
        let schema = Schema::standard();
        let cfg = AuthConfig {
            break_glass: Some(LDAPI_OWNER.into()),
            ..AuthConfig::default()
        };
        let p = AuthPolicy::new(&cfg, &schema).unwrap();
        let me = unsafe { libc::geteuid() };
        let local = Session {
            peer_cred: Some(PeerCred { uid: me, gid: 0 }),
            ..Session::default()
        };
        let tcp = Session::default();
        let own = peercred_dn(PeerCred { uid: me, gid: 0 });
        let own_norm = schema.normalize_dn(&Dn::parse(&own).unwrap()).unwrap();
        assert!(p.is_admin(&own_norm, &local));
        assert!(!p.is_admin(&own_norm, &tcp));
        // Another identity bound over the owner's socket is not the owner.
        assert!(!p.is_admin("uid=bob,ou=people,dc=example,dc=com", &local));
        assert!(p.is_break_glass(&own_norm, &local));
        assert!(!p.is_break_glass(&own_norm, &tcp));
        assert!(!p.is_break_glass("uid=bob,ou=people,dc=example,dc=com", &local));
        let other = Session {
            peer_cred: Some(PeerCred {
                uid: me.wrapping_add(4242),
                gid: 0,
            }),
            ..Session::default()
        };
        let other_dn = peercred_dn(PeerCred {
            uid: me.wrapping_add(4242),
            gid: 0,
        });
        assert_eq!(
            p.is_admin(&other_dn.to_ascii_lowercase(), &other),
            me.wrapping_add(4242) == 0
        );
    }
}
