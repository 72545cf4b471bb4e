//! 389 Directory Server access control instructions (`aci` values) as
//! Pando rules, for the forms that map.
//!
//! 389-DS decides differently from Pando: every ACI on the entry and its
//! ancestors whose target covers the request applies at once; any
//! matching `deny` refuses the rights it names, else any matching `allow`
//! grants. Pando takes the first covering rule and its first matching
//! clause. So each ACI's target becomes Pando rules, one per attribute it
//! names (merged again where their clauses agree), holding, in order: for
//! the subjects of every deny ACI that may touch that target (denies
//! applied where they may not apply only refuse more), each allow's rights
//! less the denied ones and then `none`; then the allow clauses of every
//! ACI whose target contains it, the broadest rights first (a requester
//! matching several gets one of them, never more than the union). More
//! specific targets come first. What does not map is left
//! out (an allow) or widened into a `none` for everyone (a deny), and
//! reported. Binds are not subject to ACIs in 389-DS: every rule that
//! covers userPassword lets everyone `auth`.

use pando_config::{AccessBy, OneOrMany};

use crate::acl::{DnSel, Translated};

/// One parsed ACI and where it is.
#[derive(Clone, Debug)]
pub struct Aci {
    /// The region it covers.
    pub dn: String,
    pub scope: &'static str,
    /// None: every attribute.
    pub attrs: Option<Vec<String>>,
    pub filter: Option<String>,
    pub deny: bool,
    pub rights: Vec<&'static str>,
    /// Alternatives, each a list of subjects that must all hold.
    pub subjects: Vec<Vec<String>>,
    pub name: String,
    /// Where it was read (for the comments over each rule).
    pub origin: String,
}

/// Parse `text`, an `aci` value held by the entry `at`. Err: why it does
/// not map (the caller reports it and decides what to do).
pub fn parse(at: &str, text: &str, anonymous: bool) -> Result<Aci, String> {
    let mut p = Parser { s: text.trim() };
    let mut aci = Aci {
        dn: at.to_string(),
        scope: "sub",
        attrs: None,
        filter: None,
        deny: false,
        rights: Vec::new(),
        subjects: Vec::new(),
        name: String::new(),
        origin: String::new(),
    };
    // Targets: (keyword op "value") until "(version".
    loop {
        p.skip_ws();
        if p.s.starts_with("(version") || p.s.is_empty() {
            break;
        }
        let (keyword, op, value) = p.target()?;
        apply_target(&mut aci, &keyword, &op, value)?;
    }
    let (name, one) = version_part(p.s)?;
    aci.name = name;
    let (kind, tail) = one.split_once('(').ok_or("no rights list")?;
    aci.deny = match kind.trim() {
        "allow" => false,
        "deny" => true,
        k => return Err(format!("permission '{k}'")),
    };
    let (rights, bind) = tail
        .split_once(')')
        .ok_or("the rights list is not closed")?;
    aci.rights = rights_list(rights)?;
    aci.subjects = bind_rule(bind.trim(), anonymous)?;
    Ok(aci)
}

/// Set on `aci` what one target (`keyword op "value"`) narrows it to.
fn apply_target(aci: &mut Aci, keyword: &str, op: &str, value: String) -> Result<(), String> {
    match (keyword, op) {
        ("target", "=") => {
            let dn = value
                .strip_prefix("ldap:///")
                .ok_or("target is not an ldap:/// URL")?;
            if dn.contains('*') {
                return Err("a target with wildcards".into());
            }
            aci.dn = dn.to_string();
        }
        ("targetattr", "=") => {
            let names: Vec<String> = value
                .split("||")
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect();
            if !names.iter().any(|a| a == "*") {
                aci.attrs = Some(names);
            }
        }
        ("targetfilter", "=") => aci.filter = Some(value),
        ("targetscope", "=") => {
            aci.scope = match value.as_str() {
                "base" => "base",
                "onelevel" => "one",
                "subtree" => "sub",
                other => return Err(format!("targetscope {other}")),
            }
        }
        (k, o) => return Err(format!("target '{k} {o}'")),
    }
    Ok(())
}

/// `(version 3.0; acl "name"; allow|deny (rights) bindrule;)`: the acl
/// name and the single permission clause that follows it.
fn version_part(s: &str) -> Result<(String, &str), String> {
    let body = s
        .strip_prefix("(version")
        .ok_or("no (version 3.0; …) part")?;
    let body = body
        .trim_end()
        .strip_suffix(')')
        .ok_or("the ACI does not end with ')'")?;
    let mut parts = body.splitn(2, ';');
    let _version = parts.next();
    let rest = parts.next().ok_or("nothing after the version")?.trim();
    let rest = rest.strip_prefix("acl").ok_or("no acl name")?.trim_start();
    let (name, rest) = quoted(rest).ok_or("the acl name is not quoted")?;
    let rest = rest
        .trim_start()
        .strip_prefix(';')
        .ok_or("no ';' after the acl name")?
        .trim();
    let permissions: Vec<&str> = rest
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let [one] = permissions.as_slice() else {
        return Err("several permissions in one ACI".into());
    };
    Ok((name, *one))
}

/// The comma-separated rights of a permission as Pando rights, each once,
/// in the order first named.
fn rights_list(rights: &str) -> Result<Vec<&'static str>, String> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in rights.split(',').map(|r| r.trim().to_ascii_lowercase()) {
        let add: &[&str] = match r.as_str() {
            "read" => &["read"],
            "search" => &["search"],
            "compare" => &["compare"],
            "write" => &["write"],
            "add" => &["add"],
            "delete" => &["delete"],
            "proxy" => &["proxy"],
            "all" => &["compare", "search", "read", "write", "add", "delete"],
            "selfwrite" => {
                return Err("selfwrite (adding or removing one's own DN) has no Pando form".into())
            }
            other => return Err(format!("right '{other}'")),
        };
        for x in add {
            if !out.contains(x) {
                out.push(x);
            }
        }
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a str,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        self.s = self.s.trim_start();
    }

    /// `(keyword op "value")`.
    fn target(&mut self) -> Result<(String, String, String), String> {
        let rest = self
            .s
            .strip_prefix('(')
            .ok_or("expected '(' of a target")?
            .trim_start();
        let end = rest.find(['=', '!']).ok_or("a target without '='")?;
        let keyword = rest[..end].trim().to_ascii_lowercase();
        let (op, rest) = if rest[end..].starts_with("!=") {
            ("!=", &rest[end + 2..])
        } else {
            ("=", &rest[end + 1..])
        };
        let (value, rest) = quoted(rest.trim_start()).ok_or("a target value is not quoted")?;
        let rest = rest
            .trim_start()
            .strip_prefix(')')
            .ok_or("a target is not closed")?;
        self.s = rest;
        Ok((keyword, op.to_string(), value))
    }
}

/// `"…"` at the start of `s`: the value and what follows.
fn quoted(s: &str) -> Option<(String, &str)> {
    let rest = s.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some((rest[..end].to_string(), &rest[end + 1..]))
}

/// `userdn = "ldap:///anyone"`, `groupdn = "ldap:///cn=…"`, `authmethod =
/// "ssl"`, joined all by `and` or all by `or`, in optional parentheses.
fn bind_rule(text: &str, anonymous: bool) -> Result<Vec<Vec<String>>, String> {
    let t = text.trim();
    let t = t
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .unwrap_or(t)
        .trim();
    let has = |w: &str| t.split_whitespace().any(|x| x.eq_ignore_ascii_case(w));
    if has("not") {
        return Err("'not' in a bind rule".into());
    }
    let (terms, all): (Vec<&str>, bool) = if has("and") && has("or") {
        return Err("'and' and 'or' mixed in a bind rule".into());
    } else if has("and") {
        (split_word(t, "and"), true)
    } else {
        (split_word(t, "or"), false)
    };
    let mut alternatives: Vec<Vec<String>> = if all { vec![Vec::new()] } else { Vec::new() };
    for term in terms {
        let term = term
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim();
        let (k, v) = term
            .split_once('=')
            .ok_or_else(|| format!("bind rule '{term}'"))?;
        if k.ends_with('!') || k.ends_with('>') || k.ends_with('<') {
            return Err(format!("bind rule '{term}'"));
        }
        let (v, _) =
            quoted(v.trim()).ok_or_else(|| format!("bind rule '{term}': value not quoted"))?;
        let subjects: Vec<String> = match k.trim().to_ascii_lowercase().as_str() {
            "userdn" => v
                .split("||")
                .map(|u| user(u.trim(), anonymous))
                .collect::<Result<_, _>>()?,
            "groupdn" => v
                .split("||")
                .map(|g| {
                    g.trim()
                        .strip_prefix("ldap:///")
                        .map(|d| format!("group:{d}"))
                        .ok_or("groupdn is not an ldap:/// URL")
                })
                .collect::<Result<_, _>>()?,
            "authmethod" if v.eq_ignore_ascii_case("ssl") => vec!["tls".to_string()],
            other => return Err(format!("bind rule keyword '{other}'")),
        };
        if all {
            // and: each alternative so far takes one more subject; several
            // values (||) in one term would multiply them.
            let [s] = subjects.as_slice() else {
                return Err("'||' inside an 'and' bind rule".into());
            };
            for a in alternatives.iter_mut() {
                a.push(s.clone());
            }
        } else {
            alternatives.extend(subjects.into_iter().map(|s| vec![s]));
        }
    }
    Ok(alternatives)
}

fn split_word<'a>(t: &'a str, word: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut start = 0;
    let lower = t.to_ascii_lowercase();
    let pat = format!(" {word} ");
    while let Some(i) = lower[start..].find(&pat) {
        out.push(&t[start..start + i]);
        start += i + pat.len();
    }
    out.push(&t[start..]);
    out
}

fn user(url: &str, anonymous: bool) -> Result<String, String> {
    let dn = url
        .strip_prefix("ldap:///")
        .ok_or("userdn is not an ldap:/// URL")?;
    Ok(match dn.to_ascii_lowercase().as_str() {
        // Anonymous access turned off: anyone is any bound user.
        "anyone" if anonymous => "*".into(),
        "anyone" | "all" => "users".into(),
        "self" => "self".into(),
        "parent" => return Err("userdn ldap:///parent".into()),
        _ if dn.contains('*') || dn.contains('?') => return Err(format!("userdn pattern {dn}")),
        _ => format!("dn:{dn}"),
    })
}

/// Depth of a DN (for ordering: deeper first).
fn depth(dn: &str) -> usize {
    if dn.is_empty() {
        0
    } else {
        dn.split(',').count()
    }
}

fn lower(dn: &str) -> String {
    dn.split(',')
        .map(|r| r.trim().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

/// Does region `a` hold all of region `b`?
fn contains(a: &Aci, b: &Aci) -> bool {
    let attrs_ok = match (&a.attrs, &b.attrs) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(x), Some(y)) => y
            .iter()
            .all(|n| x.iter().any(|m| m.eq_ignore_ascii_case(n))),
    };
    contains_entries(a, b) && attrs_ok
}

/// May regions `a` and `b` share an entry and attribute?
fn may_meet(a: &Aci, b: &Aci) -> bool {
    let (da, db) = (lower(&a.dn), lower(&b.dn));
    let nested = da == db || da.ends_with(&format!(",{db}")) || db.ends_with(&format!(",{da}"));
    let attrs = match (&a.attrs, &b.attrs) {
        (Some(x), Some(y)) => x
            .iter()
            .any(|n| y.iter().any(|m| m.eq_ignore_ascii_case(n))),
        _ => true,
    };
    nested && attrs
}

/// The Pando rules for `acis` (all in one suffix), each with the ACIs it
/// is made of (`acl "name"` and where): first who may see, search from,
/// add and delete entries, then who may do what with their attributes.
pub fn rules(acis: &[Aci]) -> Vec<(Translated, Vec<String>)> {
    let mut out = entry_rules(acis);
    out.extend(attribute_rules(acis));
    out
}

/// How narrow an ACI's target is, narrowest least: deeper entries, then
/// attribute lists, filters and narrower scopes before broader ones.
fn specificity(a: &Aci) -> (std::cmp::Reverse<usize>, bool, bool, u8) {
    (
        std::cmp::Reverse(depth(&a.dn)),
        a.attrs.is_none(),
        a.filter.is_none(),
        match a.scope {
            "base" => 0,
            "one" => 1,
            _ => 2,
        },
    )
}

/// Deeper targets first; attribute lists, filters and narrower scopes
/// before broader ones.
fn by_specificity(acis: &[Aci]) -> Vec<&Aci> {
    let mut order: Vec<&Aci> = acis.iter().collect();
    order.sort_by_key(|a| specificity(a));
    order
}

/// Rights on the entry itself. In 389-DS reading any attribute shows the
/// entry, and any entry may be a search base; in Pando the entry needs
/// `read` to be returned and `search` to be a base, and `add`/`delete`
/// are rights on the entry.
fn entry_rules(acis: &[Aci]) -> Vec<(Translated, Vec<String>)> {
    let entry_rights = |a: &Aci| -> Vec<&'static str> {
        let mut r = Vec::new();
        for x in &a.rights {
            let add: &[&'static str] = match *x {
                "read" => &["read", "search"],
                "search" => &["search"],
                "compare" => &["compare"],
                "add" => &["add"],
                "delete" => &["delete"],
                "proxy" => &["proxy"],
                _ => &[],
            };
            for y in add {
                if !r.contains(y) {
                    r.push(*y);
                }
            }
        }
        r
    };
    let mut out = Vec::new();
    let mut seen: Vec<(String, &'static str, Option<String>)> = Vec::new();
    for region in by_specificity(acis) {
        let key = (lower(&region.dn), region.scope, region.filter.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let (mut by, mut used) = (Vec::new(), Vec::new());
        // Only a deny of every attribute touches the entry, and only for
        // the entry rights it names (a deny of write alone hides nothing).
        let denies: Vec<(&Aci, Vec<&'static str>)> = acis
            .iter()
            .filter(|d| d.deny && d.attrs.is_none() && may_meet(d, region))
            .map(|d| (d, entry_rights(d)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        let mut allows: Vec<(&Aci, Vec<&'static str>)> = acis
            .iter()
            .filter(|a| !a.deny && contains_entries(a, region))
            .map(|a| (a, entry_rights(a)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        allows.sort_by_key(|(_, r)| std::cmp::Reverse(r.len()));
        for (d, _) in &denies {
            used.push(format!("deny \"{}\" ({})", d.name, d.origin));
        }
        by.extend(deny_clauses(&denies, &allows));
        for (a, rights) in allows {
            used.push(format!("allow \"{}\" ({})", a.name, a.origin));
            for s in &a.subjects {
                by.push(clause(s, rights.clone()));
            }
        }
        by.push(clause(&["*".to_string()], vec!["search"]));
        out.push((
            Translated::new(
                DnSel::Scoped(region.scope, region.dn.clone()),
                region.filter.clone(),
                Some(vec!["entry".into()]),
                by,
            ),
            used,
        ));
    }
    // Every other entry of the suffix: a search base for anyone.
    out.push((
        Translated::new(
            DnSel::Any,
            None,
            Some(vec!["entry".into()]),
            vec![clause(&["*".to_string()], vec!["search"])],
        ),
        vec!["389-DS: any entry may be a search base".into()],
    ));
    out
}

/// What makes two ACI targets the same rule: DN, scope, attributes, filter.
type RegionKey = (String, &'static str, Option<Vec<String>>, Option<String>);

/// The regions rules are made for: each ACI's target, one attribute at a
/// time (a rule holds the allows of every ACI naming that attribute, so
/// ACIs whose attribute lists only overlap each keep what they grant).
fn attribute_regions(acis: &[Aci]) -> Vec<Aci> {
    let mut out: Vec<Aci> = Vec::new();
    for a in acis {
        let one = |attrs: Option<Vec<String>>| Aci { attrs, ..a.clone() };
        let split: Vec<Aci> = match &a.attrs {
            None => vec![one(None)],
            Some(list) => list.iter().map(|x| one(Some(vec![x.clone()]))).collect(),
        };
        for r in split {
            let key = region_key(&r);
            if !out.iter().any(|o| region_key(o) == key) {
                out.push(r);
            }
        }
    }
    // Deeper targets first, then attribute lists, filters and narrower
    // scopes; ties kept together by target, so rules that end up alike can
    // be merged.
    out.sort_by_key(|a| (specificity(a), lower(&a.dn), a.filter.clone()));
    out
}

fn region_key(a: &Aci) -> RegionKey {
    (
        lower(&a.dn),
        a.scope,
        a.attrs
            .as_ref()
            .map(|l| l.iter().map(|x| x.to_ascii_lowercase()).collect()),
        a.filter.clone(),
    )
}

fn attribute_rules(acis: &[Aci]) -> Vec<(Translated, Vec<String>)> {
    let mut out: Vec<(Translated, Vec<String>)> = Vec::new();
    let mut seen: Vec<RegionKey> = Vec::new();
    for region in attribute_regions(acis) {
        let region = &region;
        // A deny whose own rules came earlier is there already: every
        // request in its target is answered by those rules or ones before.
        let answered = |d: &Aci| match (&d.attrs, &region.attrs) {
            (None, _) => seen.contains(&region_key(d)),
            (Some(list), here) => list
                .iter()
                .filter(|x| {
                    here.as_ref()
                        .is_none_or(|h| h.iter().any(|y| y.eq_ignore_ascii_case(x)))
                })
                .all(|x| {
                    seen.contains(&region_key(&Aci {
                        attrs: Some(vec![x.clone()]),
                        ..(*d).clone()
                    }))
                }),
        };
        let (mut by, mut used) = (Vec::new(), Vec::new());
        let denies: Vec<(&Aci, Vec<&'static str>)> = acis
            .iter()
            .filter(|d| d.deny && may_meet(d, region) && !answered(d))
            .map(|d| (d, d.rights.clone()))
            .collect();
        seen.push(region_key(region));
        let mut allows: Vec<(&Aci, Vec<&'static str>)> = acis
            .iter()
            .filter(|a| !a.deny && contains(a, region))
            .map(|a| (a, a.rights.clone()))
            .collect();
        allows.sort_by_key(|(a, _)| std::cmp::Reverse(a.rights.len()));
        for (d, _) in &denies {
            used.push(format!("deny \"{}\" ({})", d.name, d.origin));
        }
        by.extend(deny_clauses(&denies, &allows));
        for (a, rights) in allows {
            used.push(format!("allow \"{}\" ({})", a.name, a.origin));
            for s in &a.subjects {
                by.push(clause(s, rights.clone()));
            }
        }
        let mut t = Translated::new(
            DnSel::Scoped(region.scope, region.dn.clone()),
            region.filter.clone(),
            region.attrs.clone(),
            by,
        );
        let covers_password = t
            .attrs
            .as_ref()
            .is_none_or(|l| l.iter().any(|a| a.eq_ignore_ascii_case("userPassword")));
        if covers_password {
            with_auth(&mut t);
        }
        // The same target and clauses as the rule before (another
        // attribute of the same ACIs): one rule for both.
        if let Some((prev, prev_used)) = out.last_mut() {
            let same = prev.dn == t.dn
                && prev.filter == t.filter
                && prev.by == t.by
                && prev.attrs.is_some()
                && t.attrs.is_some();
            if same {
                if let (Some(p), Some(n)) = (prev.attrs.as_mut(), t.attrs) {
                    p.extend(n);
                }
                for u in used {
                    if !prev_used.contains(&u) {
                        prev_used.push(u);
                    }
                }
                continue;
            }
        }
        out.push((t, used));
    }
    out
}

/// The clauses for the subjects of `denies`, ahead of the allows: with
/// each allow's subjects, what that allow grants less every right the
/// denies refuse; then nothing (so they never reach an allow further
/// down). 389-DS refuses only the rights a deny names: a deny of write
/// leaves its subjects reading what they read.
fn deny_clauses(
    denies: &[(&Aci, Vec<&'static str>)],
    allows: &[(&Aci, Vec<&'static str>)],
) -> Vec<AccessBy> {
    let refused: Vec<&str> = denies.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    let mut out = Vec::new();
    for (d, _) in denies {
        for s in &d.subjects {
            for (a, rights) in allows {
                let left: Vec<&str> = rights
                    .iter()
                    .copied()
                    .filter(|r| !refused.contains(r))
                    .collect();
                if left.is_empty() {
                    continue;
                }
                for t in &a.subjects {
                    let mut both: Vec<String> = s.clone();
                    for x in t {
                        if x != "*" && !both.contains(x) {
                            both.push(x.clone());
                        }
                    }
                    out.push(clause(&both, left.clone()));
                }
            }
            out.push(clause(s, vec!["none"]));
        }
    }
    out
}

/// Does `a` apply to every entry of `b`'s target (attributes aside)?
fn contains_entries(a: &Aci, b: &Aci) -> bool {
    let (da, db) = (lower(&a.dn), lower(&b.dn));
    let dn_ok = match a.scope {
        "sub" => db == da || db.ends_with(&format!(",{da}")),
        "base" => b.scope == "base" && db == da,
        _ => db == da && b.scope == "one",
    };
    dn_ok && (a.filter.is_none() || a.filter == b.filter)
}

fn clause(subjects: &[String], rights: Vec<&str>) -> AccessBy {
    AccessBy {
        who: match subjects {
            [one] => OneOrMany::One(one.clone()),
            many => OneOrMany::Many(many.to_vec()),
        },
        rights: OneOrMany::Many(rights.iter().map(|r| r.to_string()).collect()),
    }
}

/// Binds are not subject to ACIs: every clause lets its subjects bind, and
/// a last one lets everyone.
fn with_auth(t: &mut Translated) {
    for b in &mut t.by {
        let mut items: Vec<String> = b
            .rights
            .items()
            .iter()
            .filter(|r| **r != "none")
            .map(|r| r.to_string())
            .collect();
        if !items.iter().any(|r| r == "auth") {
            items.insert(0, "auth".into());
        }
        b.rights = OneOrMany::Many(items);
    }
    t.by.push(AccessBy {
        who: OneOrMany::One("*".into()),
        rights: OneOrMany::Many(vec!["auth".into()]),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "dc=example,dc=com";

    fn by(t: &Translated) -> Vec<String> {
        t.by.iter()
            .map(|b| format!("{}={}", b.who.items().join("&"), b.rights.items().join(",")))
            .collect()
    }

    #[test]
    fn the_forms_that_map() {
        let a = parse(BASE, r#"(targetattr="cn || sn || uid")(targetfilter="(objectClass=person)")(version 3.0; acl "read names"; allow (read, search, compare)(userdn="ldap:///anyone");)"#, true).unwrap();
        assert_eq!(a.attrs, Some(vec!["cn".into(), "sn".into(), "uid".into()]));
        assert_eq!(a.filter.as_deref(), Some("(objectClass=person)"));
        assert_eq!(
            (a.deny, a.rights.clone(), a.subjects.clone()),
            (
                false,
                vec!["read", "search", "compare"],
                vec![vec!["*".to_string()]]
            )
        );
        let a = parse(BASE, r#"(target = "ldap:///ou=People,dc=example,dc=com")(targetattr = "*")(version 3.0;acl "self";allow (write) userdn = "ldap:///self";)"#, true).unwrap();
        assert_eq!(
            (a.dn.as_str(), a.attrs.clone()),
            ("ou=People,dc=example,dc=com", None)
        );
        let a = parse(BASE, r#"(targetattr="*")(version 3.0; acl "admins"; allow (all) groupdn="ldap:///cn=admins,dc=example,dc=com" and authmethod = "ssl";)"#, true).unwrap();
        assert_eq!(
            a.subjects,
            vec![vec![
                "group:cn=admins,dc=example,dc=com".to_string(),
                "tls".to_string()
            ]]
        );
        let a = parse(BASE, r#"(targetattr="*")(version 3.0; acl "two"; allow (read) userdn="ldap:///uid=a,dc=example,dc=com || ldap:///uid=b,dc=example,dc=com";)"#, false).unwrap();
        assert_eq!(a.subjects.len(), 2);
        // Anonymous access off: anyone means any bound user.
        let a = parse(
            BASE,
            r#"(targetattr="*")(version 3.0; acl "x"; allow (read) userdn="ldap:///anyone";)"#,
            false,
        )
        .unwrap();
        assert_eq!(a.subjects, vec![vec!["users".to_string()]]);
    }

    #[test]
    fn what_does_not_map_is_an_error_to_report() {
        for text in [
            r#"(targetattr != "userPassword")(version 3.0; acl "x"; allow (read) userdn="ldap:///anyone";)"#,
            r#"(target="ldap:///uid=*,dc=example,dc=com")(version 3.0; acl "x"; allow (read) userdn="ldap:///anyone";)"#,
            r#"(targetattr="*")(version 3.0; acl "x"; allow (selfwrite) userdn="ldap:///all";)"#,
            r#"(targetattr="*")(version 3.0; acl "x"; allow (read) userdn != "ldap:///anyone";)"#,
            r#"(targetattr="*")(version 3.0; acl "x"; allow (read) ip = "10.0.0.1";)"#,
            r#"(targetattr="*")(version 3.0; acl "x"; allow (read) userdn="ldap:///uid=*,dc=x";)"#,
            "garbage",
        ] {
            assert!(parse(BASE, text, true).is_err(), "{text}");
        }
    }

    /// Found against a real 389-DS (tests/integration/test_migrate_389ds.py):
    /// ACIs whose attribute lists only overlap each keep what they grant on
    /// the shared attribute, and a deny of write leaves reading alone.
    #[test]
    fn overlapping_attribute_lists_and_a_deny_of_one_right() {
        let people = "ou=People,dc=example,dc=com";
        let acis = [
            parse(people, r#"(targetattr="telephoneNumber || description")(version 3.0; acl "self"; allow (read, search, compare, write)(userdn="ldap:///self");)"#, true).unwrap(),
            parse(people, r#"(targetattr="description || mail")(version 3.0; acl "helpdesk"; allow (read, search, write)(groupdn="ldap:///cn=helpdesk,dc=example,dc=com");)"#, true).unwrap(),
            parse(people, r#"(targetattr="description")(version 3.0; acl "not dave"; deny (write)(userdn="ldap:///uid=dave,ou=People,dc=example,dc=com");)"#, true).unwrap(),
        ];
        let r: Vec<Translated> = rules(&acis).into_iter().map(|(t, _)| t).collect();
        let rule = |attr: &str| {
            r.iter()
                .find(|t| {
                    t.attrs
                        .as_ref()
                        .is_some_and(|l| l.iter().any(|a| a == attr))
                })
                .unwrap_or_else(|| panic!("no rule for {attr}: {r:#?}"))
        };
        let dave = "dn:uid=dave,ou=People,dc=example,dc=com";
        let group = "group:cn=helpdesk,dc=example,dc=com";
        // description: both allows; dave keeps what they give but write.
        assert_eq!(
            by(rule("description")),
            [
                format!("{dave}&self=read,search,compare"),
                format!("{dave}&{group}=read,search"),
                format!("{dave}=none"),
                "self=read,search,compare,write".to_string(),
                format!("{group}=read,search,write"),
            ]
        );
        // The other attributes: their own ACI only, no deny.
        assert_eq!(
            by(rule("telephoneNumber")),
            ["self=read,search,compare,write"]
        );
        assert_eq!(by(rule("mail")), [format!("{group}=read,search,write")]);
        // A deny of write on attributes hides no entry.
        assert!(r
            .iter()
            .filter(|t| t.attrs == Some(vec!["entry".to_string()]))
            .all(|t| !by(t).iter().any(|c| c.contains("dave"))));
    }

    #[test]
    fn union_and_deny_precedence_in_first_match_rules() {
        let acis = [
            parse(BASE, r#"(targetattr="*")(version 3.0; acl "users read"; allow (read, search, compare) userdn="ldap:///all";)"#, true).unwrap(),
            parse("ou=People,dc=example,dc=com", r#"(targetattr="telephoneNumber")(version 3.0; acl "self phone"; allow (write) userdn="ldap:///self";)"#, true).unwrap(),
            parse(BASE, r#"(targetattr="userPassword")(version 3.0; acl "no pw"; deny (read, search, compare) userdn="ldap:///all";)"#, true).unwrap(),
        ];
        let r: Vec<Translated> = rules(&acis).into_iter().map(|(t, _)| t).collect();
        // Entries first: ou=People's ACI region (self may use it as a base,
        // the phone ACI does not show the entry to others), then the
        // suffix's (users read, so they see entries), then any entry as a base.
        assert!(r[..3]
            .iter()
            .all(|t| t.attrs == Some(vec!["entry".to_string()])));
        assert_eq!(by(&r[0]), ["users=read,search,compare", "*=search"]);
        assert_eq!(by(&r[1]), ["users=read,search,compare", "*=search"]);
        assert_eq!(r[2].dn, DnSel::Any);
        // Then attributes, deepest first: the phone rule holds its own
        // allow and the broader read.
        assert_eq!(r[3].attrs, Some(vec!["telephoneNumber".to_string()]));
        assert_eq!(by(&r[3]), ["users=read,search,compare", "self=write"]);
        // userPassword: the deny first, binds for everyone.
        assert_eq!(r[4].attrs, Some(vec!["userPassword".to_string()]));
        assert_eq!(
            by(&r[4]),
            ["users=auth", "users=auth,read,search,compare", "*=auth"]
        );
        // Everything else: userPassword was answered by the rule before.
        assert_eq!(r[5].attrs, None);
        assert_eq!(by(&r[5]), ["users=auth,read,search,compare", "*=auth"]);
        assert_eq!(r.len(), 6);
    }
}
