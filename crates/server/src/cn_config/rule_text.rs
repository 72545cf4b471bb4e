//! Access rules as one line of text, the form `olcAccess` values take under
//! cn=config. It follows OpenLDAP's `access to … by …` grammar so simple
//! OpenLDAP rules read the same here:
//!
//! ```text
//! to <what> by <who> <rights> [by <who> <rights>]…
//! what   := * | [dn.<scope>="<dn>" | dn.regex="<re>"] [filter=<filter>] [attrs=<a>,<b>…]
//! scope  := base | exact | one | onelevel | sub | subtree | children
//! who    := one or more subjects, all of which must hold:
//!           * | anonymous | users | self | admins | tls | ldapi
//!           | dn.exact="<dn>" | dn.subtree="<dn>" | group="<dn>" | ip=<addr>[/<prefix>]
//! rights := none | auth | compare | search | read | write | all | manage
//!           | a comma list of auth, compare, search, read, write, add, delete, proxy
//! ```
//!
//! Values holding spaces or quotes are written in double quotes (`\"` and
//! `\\` inside). [`format`] writes what [`parse`] reads back unchanged.

use pando_config::{AccessBy, AccessRule, OneOrMany};

/// Words that are a rights level on their own.
const LEVELS: &[&str] = &[
    "none", "auth", "compare", "search", "read", "write", "all", "manage",
];
/// Words that may appear in a comma list of single rights.
const RIGHTS: &[&str] = &[
    "auth", "compare", "search", "read", "write", "add", "delete", "proxy", "all", "none",
];

/// Split `text` at whitespace outside double quotes; quotes are removed and
/// `\"`, `\\` inside them unescaped.
fn tokens(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_token = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => cur.push(e),
                            None => return Err("a quoted value ends with a lone '\\'".into()),
                        },
                        Some(ch) => cur.push(ch),
                        None => return Err("a quoted value has no closing '\"'".into()),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_token {
                    out.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            c => {
                in_token = true;
                cur.push(c);
            }
        }
    }
    if in_token {
        out.push(cur);
    }
    Ok(out)
}

/// `value` quoted when it holds whitespace, quotes or backslashes (or is empty).
fn quote(value: &str) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        return value.to_string();
    }
    let mut s = String::from("\"");
    for c in value.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

fn is_rights(token: &str) -> bool {
    LEVELS.contains(&token)
        || (token.contains(',') && token.split(',').all(|r| RIGHTS.contains(&r)))
}

/// One `who` token as the subject string access rules use.
fn subject(token: &str) -> Result<String, String> {
    if matches!(
        token,
        "*" | "anyone" | "anonymous" | "users" | "self" | "admins" | "tls" | "ldapi"
    ) {
        return Ok(if token == "anyone" { "*" } else { token }.to_string());
    }
    let (key, value) = token
        .split_once('=')
        .ok_or_else(|| format!("'{token}' is not a subject (*, anonymous, users, self, admins, tls, ldapi, dn.exact=, dn.subtree=, group=, ip=)"))?;
    let kind = match key {
        "dn" | "dn.exact" | "dn.base" => "dn",
        "dn.subtree" | "dn.sub" => "subtree",
        "group" | "group.exact" => "group",
        "ip" | "peername.ip" => "ip",
        other => {
            return Err(format!(
                "'{other}=' is not a subject kind (dn.exact, dn.subtree, group, ip)"
            ))
        }
    };
    Ok(format!("{kind}:{value}"))
}

/// A rule from its text form.
pub fn parse(text: &str) -> Result<AccessRule, String> {
    let toks = tokens(text)?;
    let mut it = toks.iter().map(String::as_str).peekable();
    if it.next() != Some("to") {
        return Err("a rule begins with 'to' (to <what> by <who> <rights>…)".into());
    }
    let mut rule = AccessRule {
        dn: None,
        scope: None,
        dn_regex: None,
        filter: None,
        attrs: None,
        by: Vec::new(),
    };
    let mut what = 0;
    while let Some(&t) = it.peek() {
        if t == "by" {
            break;
        }
        it.next();
        what += 1;
        if t == "*" {
            continue;
        }
        let (key, value) = t.split_once('=').ok_or_else(|| {
            format!("'{t}' is not part of a target (dn.<scope>=, dn.regex=, filter=, attrs=)")
        })?;
        match key {
            "filter" => rule.filter = Some(value.to_string()),
            "attrs" | "attr" => {
                rule.attrs = Some(
                    value
                        .split(',')
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect(),
                )
            }
            "dn.regex" => rule.dn_regex = Some(value.to_string()),
            _ => {
                let scope = match key {
                    "dn" | "dn.base" | "dn.exact" => "base",
                    "dn.one" | "dn.onelevel" => "one",
                    "dn.sub" | "dn.subtree" => "sub",
                    "dn.children" => "children",
                    other => {
                        return Err(format!(
                            "'{other}=' is not part of a target (dn.base=, dn.one=, dn.subtree=, dn.children=, dn.regex=, filter=, attrs=)"
                        ))
                    }
                };
                rule.dn = Some(value.to_string());
                rule.scope = Some(scope.to_string());
            }
        }
    }
    if what == 0 {
        return Err("'to' needs a target ('*' for every entry)".into());
    }
    while let Some(t) = it.next() {
        if t != "by" {
            return Err(format!("expected 'by', found '{t}'"));
        }
        let mut who = Vec::new();
        let rights = loop {
            match it.next() {
                None if who.is_empty() => return Err("'by' needs a subject and rights".into()),
                None => return Err(format!("'by {}' needs rights (e.g. read)", who.join(" "))),
                Some(t) if !who.is_empty() && is_rights(t) => break t,
                Some(t) => who.push(subject(t)?),
            }
        };
        let rights = if rights.contains(',') {
            OneOrMany::Many(rights.split(',').map(str::to_string).collect())
        } else if rights == "manage" {
            OneOrMany::One("all".into())
        } else {
            OneOrMany::One(rights.to_string())
        };
        let who = if who.len() == 1 {
            OneOrMany::One(who.remove(0))
        } else {
            OneOrMany::Many(who)
        };
        rule.by.push(AccessBy { who, rights });
    }
    if rule.by.is_empty() {
        return Err("a rule needs at least one 'by <who> <rights>' clause".into());
    }
    Ok(rule)
}

/// The text form of `rule`.
pub fn format(rule: &AccessRule) -> String {
    let mut s = String::from("to");
    let mut what = false;
    if let Some(re) = &rule.dn_regex {
        s.push_str(&format!(" dn.regex={}", quote(re)));
        what = true;
    } else if let Some(dn) = &rule.dn {
        let scope = match rule.scope.as_deref().unwrap_or("sub") {
            "sub" => "subtree",
            other => other,
        };
        s.push_str(&format!(" dn.{scope}={}", quote(dn)));
        what = true;
    }
    if let Some(f) = &rule.filter {
        s.push_str(&format!(" filter={}", quote(f)));
        what = true;
    }
    if let Some(a) = &rule.attrs {
        s.push_str(&format!(" attrs={}", quote(&a.join(","))));
        what = true;
    }
    if !what {
        s.push_str(" *");
    }
    for by in &rule.by {
        s.push_str(" by");
        for w in by.who.items() {
            let token = match w.split_once(':') {
                Some(("dn", v)) => format!("dn.exact={}", quote(v)),
                Some(("subtree", v)) => format!("dn.subtree={}", quote(v)),
                Some(("group", v)) => format!("group={}", quote(v)),
                Some(("ip", v)) => format!("ip={}", quote(v)),
                _ => quote(w),
            };
            s.push(' ');
            s.push_str(&token);
        }
        s.push(' ');
        s.push_str(&by.rights.items().join(","));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openldap_rules_read_as_written() {
        let r = parse("to attrs=userPassword by self write by anonymous auth by * none").unwrap();
        assert_eq!(r.attrs, Some(vec!["userPassword".to_string()]));
        assert_eq!(r.by.len(), 3);
        assert_eq!(r.by[0].who, OneOrMany::One("self".into()));
        assert_eq!(r.by[0].rights, OneOrMany::One("write".into()));
        let r = parse(r#"to dn.subtree="ou=People,dc=example,dc=com" by group.exact="cn=admins,ou=Groups,dc=example,dc=com" manage by users read"#).unwrap();
        assert_eq!(r.dn.as_deref(), Some("ou=People,dc=example,dc=com"));
        assert_eq!(r.scope.as_deref(), Some("sub"));
        assert_eq!(
            r.by[0].who,
            OneOrMany::One("group:cn=admins,ou=Groups,dc=example,dc=com".into())
        );
        assert_eq!(r.by[0].rights, OneOrMany::One("all".into()));
        // OpenLDAP's bare dn= is the entry itself.
        assert_eq!(
            parse("to dn=\"dc=x\" by * read").unwrap().scope.as_deref(),
            Some("base")
        );
    }

    #[test]
    fn text_round_trips() {
        for text in [
            "to * by admins all by * read",
            "to dn.subtree=\"ou=a b,dc=x\" filter=\"(&(objectClass=person)(cn=a b))\" attrs=cn,sn by self auth,write by users ip=10.0.0.0/8 read",
            "to dn.regex=^uid=([^,]+),ou=people,dc=x$ by dn.exact=\"cn=q \\\"x\\\",dc=x\" search by * none",
            "to dn.children=dc=x by tls ldapi compare",
        ] {
            let r = parse(text).unwrap();
            assert_eq!(format(&r), text, "{text}");
            assert_eq!(parse(&format(&r)).unwrap(), r);
        }
    }

    #[test]
    fn mistakes_are_named() {
        for (text, says) in [
            ("by * read", "begins with 'to'"),
            ("to by * read", "needs a target"),
            ("to * by", "needs a subject"),
            ("to * by users", "needs rights"),
            ("to * by nobody read", "not a subject"),
            ("to * by sasl=x read", "not a subject kind"),
            ("to dn.fuzzy=x by * read", "not part of a target"),
            ("to *", "at least one"),
            ("to * by * read extra", "expected 'by'"),
            ("to dn=\"x by * read", "no closing"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
