//! OpenLDAP access rules (`access to … by …`, slapd.access(5)) translated
//! to Pando's `[[access]]` rules (docs/access-control.md).
//!
//! Both evaluate the first rule whose target covers the entry and
//! attribute, then its first clause whose subject holds, and deny when
//! none does, so most rules translate one to one. What Pando cannot say
//! is translated to something that grants *less* and reported: a clause
//! whose subject has no Pando form gets `none` for a superset of its
//! subjects (so no one falls through it to a later, wider clause); a rule
//! whose target has no Pando form gives `none` to everyone on a superset
//! of its target. `break` to the following rules is expanded in
//! the translation (`translate.rs`), which sees the rules that follow.

use pando_config::{AccessBy, AccessRule, OneOrMany};

use crate::report::Severity;

/// What a rule covers, in OpenLDAP's terms.
#[derive(Clone, Debug, PartialEq)]
pub enum DnSel {
    Any,
    /// `base`, `one`, `sub`, `children` and a DN.
    Scoped(&'static str, String),
    Regex(String),
}

/// One translated rule.
#[derive(Clone, Debug)]
pub struct Translated {
    pub dn: DnSel,
    pub filter: Option<String>,
    /// None = every attribute and the entry.
    pub attrs: Option<Vec<String>>,
    pub by: Vec<AccessBy>,
    /// The rule ends with `by * break`: requesters no clause above it
    /// matched go on to the following rules.
    pub falls_through: bool,
    /// It covers slapd's `children` pseudo-attribute (who may add and
    /// delete below an entry), which Pando has no form of.
    pub children: bool,
    pub notes: Vec<(Severity, String)>,
}

impl Translated {
    /// A rule over `dn`, `filter` and `attrs` (None: everything) with
    /// clauses `by`: no `break`, `children` covered as slapd would.
    pub fn new(
        dn: DnSel,
        filter: Option<String>,
        attrs: Option<Vec<String>>,
        by: Vec<AccessBy>,
    ) -> Translated {
        Translated {
            dn,
            filter,
            attrs,
            by,
            falls_through: false,
            children: true,
            notes: Vec::new(),
        }
    }

    pub fn to_rule(&self) -> AccessRule {
        let (dn, scope, dn_regex) = match &self.dn {
            DnSel::Any => (None, None, None),
            DnSel::Scoped(s, d) => (Some(d.clone()), Some(s.to_string()), None),
            DnSel::Regex(r) => (None, None, Some(r.clone())),
        };
        AccessRule {
            dn,
            scope: scope.filter(|s| s != "sub"),
            dn_regex,
            filter: self.filter.clone(),
            attrs: self.attrs.clone(),
            by: self.by.clone(),
        }
    }
}

/// One way a clause's subject holds: all of `subjects`; `deny` = gets
/// `none` whatever the clause grants (a stricter stand-in).
#[derive(Clone, Debug)]
struct Alt {
    subjects: Vec<String>,
    deny: bool,
}

fn alt(s: &str) -> Vec<Alt> {
    vec![Alt {
        subjects: vec![s.to_string()],
        deny: false,
    }]
}

fn deny(s: &str) -> Vec<Alt> {
    vec![Alt {
        subjects: vec![s.to_string()],
        deny: true,
    }]
}

/// Both must hold: every pairing, in order (see the module docs).
fn and(a: Vec<Alt>, b: Vec<Alt>) -> Vec<Alt> {
    let mut out = Vec::new();
    for x in &a {
        for y in &b {
            let mut subjects = x.subjects.clone();
            for s in &y.subjects {
                if s != "*" && !subjects.contains(s) {
                    subjects.push(s.clone());
                }
            }
            if subjects.len() > 1 {
                subjects.retain(|s| s != "*");
            }
            out.push(Alt {
                subjects,
                deny: x.deny || y.deny,
            });
        }
    }
    out
}

/// `dn.<style>=` → (style, value); no style is `base` (slapd.access(5)).
fn styled<'a>(word: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    let rest = word.strip_prefix(name)?;
    let (style, value) = rest.split_once('=')?;
    let style = match style {
        "" => "base",
        s => s.strip_prefix('.')?,
    };
    Some((style, value))
}

fn scope_of(style: &str) -> Option<&'static str> {
    Some(match style {
        "base" | "baseobject" | "exact" => "base",
        "one" | "onelevel" => "one",
        "sub" | "subtree" => "sub",
        "children" => "children",
        _ => return None,
    })
}

/// A regular expression with no special character is a literal DN.
fn literal(re: &str) -> Option<String> {
    // slapd searches for a match anywhere in the DN: only a pattern
    // anchored at both ends names exactly one DN.
    let body = re.strip_prefix('^')?;
    let body = body.strip_suffix('$').filter(|b| !b.ends_with('\\'))?;
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '.' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => {
                return None
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// The literal DN a regular expression ends with (`…,ou=people,dc=x$`),
/// the subtree every DN it matches is in.
fn literal_tail(re: &str) -> Option<String> {
    let body = re.strip_suffix('$')?;
    let cut = body.rfind(|c: char| "^.*+?()[]{}|\\$".contains(c))?;
    let tail = &body[cut + 1..];
    let tail = tail.strip_prefix(',')?;
    (!tail.is_empty() && tail.contains('=')).then(|| tail.to_string())
}

/// One `who` word → subjects, and notes.
fn who_word(w: &str, notes: &mut Notes) -> Vec<Alt> {
    let lw = w.to_ascii_lowercase();
    match lw.as_str() {
        "*" => return alt("*"),
        "anonymous" | "realanonymous" => return alt("anonymous"),
        "users" | "realusers" => return alt("users"),
        "self" | "realself" => return alt("self"),
        _ => {}
    }
    if let Some((style, value)) = styled(w, "dn").or_else(|| styled(w, "realdn")) {
        return dn_subject(w, style, value, notes);
    }
    if lw.starts_with("group") {
        return group_subject(w, notes);
    }
    if let Some((style, value)) = styled(w, "peername") {
        return peer_subject(w, style, value, notes);
    }
    if let Some((_, value)) = styled(w, "sockurl") {
        return sockurl_subject(w, value, notes);
    }
    if let Some(v) = ssf_subject(w, &lw, notes) {
        return v;
    }
    let dnattr = lw.starts_with("dnattr");
    notes.push((
        Severity::Stricter,
        format!(
            "who {w}: no Pando form (dnattr, set, aci, domain, sasl_ssf … are not supported); {} get none here",
            if dnattr { "users" } else { "all identities" }
        ),
    ));
    deny(if dnattr { "users" } else { "*" })
}

/// `dn[.style]=…`, `realdn…`.
fn dn_subject(w: &str, style: &str, value: &str, notes: &mut Notes) -> Vec<Alt> {
    if style == "regex" {
        if let Some(dn) = literal(value) {
            return alt(&format!("dn:{dn}"));
        }
        // As slapd reads them: any DN at all is everyone, a non-empty
        // one every authenticated user.
        let bare = value.trim_start_matches('^').trim_end_matches('$');
        match bare {
            ".*" => return alt("*"),
            ".+" => return alt("users"),
            _ => {}
        }
        let sup = literal_tail(value);
        notes.push((
            Severity::Stricter,
            format!(
                "who dn.regex={value}: Pando has no regular expression subjects; {} get none here",
                sup.as_deref()
                    .map(|s| format!("identities below {s}"))
                    .unwrap_or_else(|| "all identities".into())
            ),
        ));
        return match sup {
            Some(s) => deny(&format!("subtree:{s}")),
            None => deny("*"),
        };
    }
    match scope_of(style) {
        Some("base") => alt(&format!("dn:{value}")),
        Some("sub") => alt(&format!("subtree:{value}")),
        Some("children") => {
            notes.push((
                Severity::Stricter,
                format!("who dn.children={value}: {value} itself gets none here (Pando's subtree: includes it)"),
            ));
            let mut v = deny(&format!("dn:{value}"));
            v.extend(alt(&format!("subtree:{value}")));
            v
        }
        Some(_) => {
            notes.push((
                Severity::Stricter,
                format!("who dn.{style}={value}: Pando has no one-level subject; the whole subtree gets none here"),
            ));
            deny(&format!("subtree:{value}"))
        }
        None => {
            notes.push((
                Severity::Stricter,
                format!("who {w}: unknown style; everyone gets none here"),
            ));
            deny("*")
        }
    }
}

/// `group[/objectClass[/attribute]][.style]=DN`.
fn group_subject(w: &str, notes: &mut Notes) -> Vec<Alt> {
    let (head, value) = w.split_once('=').unwrap_or((w, ""));
    let (head, style) = match head.split_once('.') {
        Some((h, s)) => (h, s),
        None => (head, "exact"),
    };
    let mut parts = head.split('/').skip(1);
    let oc = parts.next().unwrap_or("groupOfNames").to_ascii_lowercase();
    let attr = parts.next().unwrap_or("member").to_ascii_lowercase();
    let known = matches!(
        (oc.as_str(), attr.as_str()),
        ("groupofnames", "member") | ("groupofuniquenames", "uniquemember")
    );
    if style == "exact" || style == "base" {
        if known {
            notes.push((
                Severity::Differs,
                format!("who group={value}: Pando also counts members of groups nested in it (up to 4 levels); slapd counts direct members only"),
            ));
            return alt(&format!("group:{value}"));
        }
        notes.push((
            Severity::Stricter,
            format!("who {w}: Pando's group subject reads member/uniqueMember; members by {attr} get none here"),
        ));
        return deny("users");
    }
    notes.push((
        Severity::Stricter,
        format!("who {w}: group patterns have no Pando form; users get none here"),
    ));
    deny("users")
}

/// `peername[.style]=…`: an address (IPv4 with `%netmask`, IPv6) or the
/// ldapi socket's path.
fn peer_subject(w: &str, style: &str, value: &str, notes: &mut Notes) -> Vec<Alt> {
    let addr = value
        .strip_prefix("IP=")
        .or_else(|| value.strip_prefix("IPv6="))
        .unwrap_or(value);
    if style == "ip" || style == "ipv6" || (style == "base" && value.starts_with("IP=")) {
        // a.b.c.d[%mask][{port}]
        let (addr, port) = match addr.split_once('{') {
            Some((a, p)) => (a, Some(p.trim_end_matches('}'))),
            None => (addr, None),
        };
        let net = match addr.split_once('%') {
            Some((a, mask)) => match mask_bits(mask) {
                Some(bits) => format!("{a}/{bits}"),
                None => {
                    notes.push((
                        Severity::Stricter,
                        format!("who {w}: netmask not contiguous; everyone gets none here"),
                    ));
                    return deny("*");
                }
            },
            None => addr.to_string(),
        };
        if let Some(port) = port {
            notes.push((
                Severity::Stricter,
                format!("who {w}: Pando does not tell clients apart by port; clients from {net} get none here (not only from port {port})"),
            ));
            return deny(&format!("ip:{net}"));
        }
        return alt(&format!("ip:{net}"));
    }
    if style == "path" {
        notes.push((
            Severity::Note,
            format!("who {w}: any client on Pando's own ldapi socket"),
        ));
        return alt("ldapi");
    }
    notes.push((
        Severity::Stricter,
        format!("who {w}: only peername.ip/ipv6/path translate; everyone gets none here"),
    ));
    deny("*")
}

/// `sockurl…=`: the listener the client came through.
fn sockurl_subject(w: &str, value: &str, notes: &mut Notes) -> Vec<Alt> {
    if value.starts_with("ldapi") {
        return alt("ldapi");
    }
    if value.starts_with("ldaps") {
        notes.push((
            Severity::Note,
            format!("who {w}: any TLS connection (LDAPS or StartTLS)"),
        ));
        return alt("tls");
    }
    notes.push((Severity::Stricter, format!("who {w}: listener URLs other than ldapi/ldaps have no Pando form; everyone gets none here")));
    deny("*")
}

/// `ssf=`, `transport_ssf=`, `tls_ssf=`: slapd gives TLS its cipher
/// strength (128 or 256) and ldapi 71.
fn ssf_subject(w: &str, lw: &str, notes: &mut Notes) -> Option<Vec<Alt>> {
    for ssf in ["ssf", "transport_ssf", "tls_ssf"] {
        if let Some(v) = lw.strip_prefix(ssf).and_then(|r| r.strip_prefix('=')) {
            let n: u32 = v.parse().unwrap_or(u32::MAX);
            // slapd gives TLS its cipher strength (128 or 256 here) and
            // ldapi 71.
            if n > 128 {
                notes.push((
                    Severity::Stricter,
                    format!(
                        "who {w}: Pando has no cipher strength subject; everyone gets none here"
                    ),
                ));
                return Some(deny("*"));
            }
            notes.push((
                Severity::Note,
                format!(
                    "who {w}: TLS connections{}",
                    if n <= 71 && ssf != "tls_ssf" {
                        " and ldapi"
                    } else {
                        ""
                    }
                ),
            ));
            let mut v = alt("tls");
            if n <= 71 && ssf != "tls_ssf" {
                v.extend(alt("ldapi"));
            }
            return Some(v);
        }
    }
    None
}

fn mask_bits(mask: &str) -> Option<u8> {
    let ip: std::net::Ipv4Addr = mask.parse().ok()?;
    let m = u32::from(ip);
    let bits = m.leading_ones();
    (m.checked_shl(bits).unwrap_or(0) == 0).then_some(bits as u8)
}

/// Access field → Pando rights (a level name or a list), and a note.
fn rights_of(access: &str, notes: &mut Vec<(Severity, String)>) -> Option<OneOrMany> {
    let one = |s: &str| Some(OneOrMany::One(s.into()));
    let list = |v: &[&str]| Some(OneOrMany::Many(v.iter().map(|s| s.to_string()).collect()));
    let a = access.to_ascii_lowercase();
    let (self_only, level) = match a
        .strip_prefix("realself")
        .or_else(|| a.strip_prefix("self"))
    {
        Some(rest) => (true, rest.to_string()),
        None => (false, a.clone()),
    };
    if self_only {
        notes.push((
            Severity::Stricter,
            format!("access '{access}': Pando has no self-only writes (adding or removing one's own DN); translated without the write"),
        ));
        return rights_of(
            if level.contains("write") || level == "add" || level == "delete" || level == "manage" {
                "read"
            } else {
                &level
            },
            notes,
        );
    }
    match level.as_str() {
        "none" => one("none"),
        "disclose" => {
            notes.push((Severity::Note, "access 'disclose': Pando never discloses an entry through error codes; translated as none".into()));
            one("none")
        }
        "auth" | "compare" | "search" | "read" | "write" => one(&level),
        "add" | "wadd" => {
            notes.push((Severity::Stricter, format!("access '{access}': Pando's add right is for entries; adding values to attributes needs write, not given here")));
            list(&["auth", "compare", "search", "read", "add"])
        }
        "delete" | "wdel" => {
            notes.push((Severity::Stricter, format!("access '{access}': Pando's delete right is for entries; removing values needs write, not given here")));
            list(&["auth", "compare", "search", "read", "delete"])
        }
        "manage" => {
            notes.push((Severity::Note, "access 'manage': Pando's 'all' (the relax rules control stays with administrators)".into()));
            one("all")
        }
        p if p.starts_with(['=', '+', '-']) => {
            if p.starts_with('-') {
                notes.push((Severity::Stricter, format!("access '{access}': privileges taken away from an accumulated set have no Pando form; translated as none")));
                return one("none");
            }
            let mut out: Vec<&str> = Vec::new();
            for c in p[1..].chars() {
                let add: &[&str] = match c {
                    'x' => &["auth"],
                    'c' => &["compare"],
                    's' => &["search"],
                    'r' => &["read"],
                    'w' => &["write", "add", "delete"],
                    'a' => &["add"],
                    'z' => &["delete"],
                    'm' => &[
                        "auth", "compare", "search", "read", "write", "add", "delete",
                    ],
                    'd' | '0' => &[],
                    _ => {
                        notes.push((
                            Severity::Stricter,
                            format!(
                                "access '{access}': unknown privilege '{c}'; translated as none"
                            ),
                        ));
                        return one("none");
                    }
                };
                for r in add {
                    if !out.contains(r) {
                        out.push(r);
                    }
                }
            }
            if out.is_empty() {
                return one("none");
            }
            list(&out)
        }
        _ => None,
    }
}

fn is_access_word(w: &str) -> bool {
    let l = w.to_ascii_lowercase();
    let l = l
        .strip_prefix("realself")
        .or_else(|| l.strip_prefix("self"))
        .unwrap_or(&l)
        .to_string();
    matches!(
        l.as_str(),
        "none"
            | "disclose"
            | "auth"
            | "compare"
            | "search"
            | "read"
            | "write"
            | "add"
            | "delete"
            | "wadd"
            | "wdel"
            | "manage"
    ) || (l.starts_with(['=', '+', '-']) && l.len() > 1)
}

/// Parse and translate one rule: the words after `access` (`to …`).
/// Err: the rule cannot be read at all.
pub fn translate(words: &[String]) -> Result<Translated, String> {
    match words.first() {
        Some(w) if w.eq_ignore_ascii_case("to") => {}
        _ => return Err("a rule starts with 'to'".into()),
    }
    let by_at = words
        .iter()
        .position(|w| w.eq_ignore_ascii_case("by"))
        .ok_or("a rule needs at least one 'by' clause")?;
    let mut notes = Vec::new();
    let (mut t, target_wider) = target(&words[1..by_at], &mut notes)?;
    let clauses = clauses(&words[by_at..], &mut notes)?;
    for (alts, rights) in controls(clauses, &mut t, &mut notes) {
        for a in alts {
            let r = if a.deny || target_wider {
                OneOrMany::One("none".into())
            } else {
                rights.clone()
            };
            let who = match a.subjects.as_slice() {
                [one] => OneOrMany::One(one.clone()),
                _ => OneOrMany::Many(a.subjects.clone()),
            };
            t.by.push(AccessBy { who, rights: r });
        }
    }
    t.notes = notes;
    Ok(t)
}

type Notes = Vec<(Severity, String)>;

/// `<what>`: the rule's target, and whether it had to be widened (then
/// every clause grants none).
fn target(words: &[String], notes: &mut Notes) -> Result<(Translated, bool), String> {
    let mut t = Translated::new(DnSel::Any, None, None, Vec::new());
    let mut wider = false;
    for w in words {
        if w == "*" {
            continue;
        }
        if let Some((style, value)) = styled(w, "dn") {
            t.dn = target_dn(w, style, value, notes)?;
        } else if let Some(f) = w.strip_prefix("filter=") {
            t.filter = Some(f.to_string());
        } else if let Some(list) = w.strip_prefix("attrs=").or_else(|| w.strip_prefix("attr=")) {
            let mut names = Vec::new();
            t.children = false;
            for a in list.split(',').map(str::trim) {
                if a.eq_ignore_ascii_case("children") {
                    t.children = true;
                    notes.push((Severity::Note, "attrs children: Pando judges adds and deletes on the entry added or deleted (add/delete rights), not on its parent".into()));
                } else if a.starts_with('!') {
                    t.children = true; // the widened target covers it too
                    notes.push((Severity::Stricter, format!("attrs {a}: attributes outside a class have no Pando form; the rule covers every attribute and grants none")));
                    wider = true;
                } else {
                    if a.starts_with('@') {
                        notes.push((Severity::Note, format!("attrs {a}: listed as the class's attributes (resolved against the schema)")));
                    }
                    names.push(a.to_string());
                }
            }
            // Only `children` leaves an empty list: it covers nothing
            // Pando has. A widened target covers every attribute.
            if !wider {
                t.attrs = Some(names);
            }
        } else if w.starts_with("val") {
            notes.push((Severity::Stricter, format!("{w}: value-specific rules have no Pando form; the rule covers every value and grants none")));
            wider = true;
        } else {
            return Err(format!("'{w}' is not a target (dn…=, filter=, attrs=)"));
        }
    }
    Ok((t, wider))
}

fn target_dn(w: &str, style: &str, value: &str, notes: &mut Notes) -> Result<DnSel, String> {
    if style != "regex" {
        return match scope_of(style) {
            Some(s) => Ok(DnSel::Scoped(s, value.to_string())),
            None => Err(format!("'{w}': unknown DN style '{style}'")),
        };
    }
    Ok(match literal(value) {
        Some(dn) => DnSel::Scoped("base", dn),
        None if value == ".*" || value == "^.*$" => DnSel::Any,
        None => {
            if value.matches('$').count() > 1 {
                notes.push((Severity::Stricter, format!("to dn.regex={value}: substitutions ($1) in clauses are not supported; clauses using them get none")));
            }
            DnSel::Regex(anchored(value))
        }
    })
}

/// slapd's target pattern `re` as a Pando `dn_regex` covering the same
/// DNs. slapd matches it ignoring case and anywhere in the normalised DN
/// (regexec, unanchored); Pando anchors a `dn_regex` at both ends. So an
/// end the pattern does not anchor gets `.*`: `ou=people,dc=x` covers
/// `uid=a,ou=people,dc=x` in both, never only the one DN (covering less
/// would let the entries left out fall through to later, wider rules).
/// A pattern with alternatives keeps its own anchors inside the wrapper.
fn anchored(re: &str) -> String {
    let start = re.starts_with('^');
    let end = re.ends_with('$') && !re.ends_with("\\$");
    if re.contains('|') {
        return format!("(?is).*(?:{re}).*");
    }
    let body = re.strip_prefix('^').unwrap_or(re);
    let body = if end { &body[..body.len() - 1] } else { body };
    match (start, end) {
        (true, true) => format!("(?i){body}"),
        (true, false) => format!("(?is){body}.*"),
        (false, true) => format!("(?is).*{body}"),
        (false, false) => format!("(?is).*{body}.*"),
    }
}

/// One `by` clause: who, rights, control (stop, continue, break), and
/// whether its rights add to those before (`+…`) rather than replace them.
type Clause = (Vec<Alt>, OneOrMany, String, bool);

fn is_control(w: &str) -> bool {
    matches!(
        w.to_ascii_lowercase().as_str(),
        "stop" | "continue" | "break"
    )
}

/// `by <who…> [access] [control]`…
fn clauses(words: &[String], notes: &mut Notes) -> Result<Vec<Clause>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if !words[i].eq_ignore_ascii_case("by") {
            return Err(format!("expected 'by', found '{}'", words[i]));
        }
        i += 1;
        let mut who: Option<Vec<Alt>> = None;
        while i < words.len()
            && !words[i].eq_ignore_ascii_case("by")
            && !is_access_word(&words[i])
            && !is_control(&words[i])
        {
            let part = who_word(&words[i], notes);
            who = Some(match who {
                None => part,
                Some(prev) => and(prev, part),
            });
            i += 1;
        }
        let who = who.ok_or("a 'by' clause names no one")?;
        // No access given: +0 (nothing).
        let mut rights = OneOrMany::One("none".into());
        let additive = i < words.len() && words[i].starts_with('+');
        if i < words.len() && is_access_word(&words[i]) {
            rights = rights_of(&words[i], notes)
                .ok_or_else(|| format!("'{}' is not an access level", words[i]))?;
            i += 1;
        }
        let mut control = "stop".to_string();
        if i < words.len() && is_control(&words[i]) {
            control = words[i].to_ascii_lowercase();
            i += 1;
        }
        out.push((who, rights, control, additive));
    }
    Ok(out)
}

/// Both clauses' rights together (`+` privileges after `continue`).
fn union(a: &OneOrMany, b: &OneOrMany) -> OneOrMany {
    let mut all = level_rights(a);
    for r in level_rights(b) {
        if !all.contains(&r) {
            all.push(r);
        }
    }
    if all.is_empty() {
        OneOrMany::One("none".into())
    } else {
        OneOrMany::Many(all)
    }
}

/// The single rights of a level or list.
pub(crate) fn level_rights(r: &OneOrMany) -> Vec<String> {
    const ORDER: &[&str] = &[
        "auth", "compare", "search", "read", "write", "add", "delete",
    ];
    match r {
        OneOrMany::One(l) => match l.as_str() {
            "none" => Vec::new(),
            "write" | "all" => ORDER.iter().map(|s| s.to_string()).collect(),
            l => match ORDER.iter().position(|x| *x == l) {
                Some(n) => ORDER[..=n].iter().map(|s| s.to_string()).collect(),
                None => vec![l.to_string()],
            },
        },
        OneOrMany::Many(v) => v.iter().filter(|x| *x != "none").cloned().collect(),
    }
}

/// Clauses in first-match order once `break` and `continue` are settled.
fn controls(
    clauses: Vec<Clause>,
    t: &mut Translated,
    notes: &mut Notes,
) -> Vec<(Vec<Alt>, OneOrMany)> {
    let mut out = Vec::new();
    for (k, (who, rights, control, _)) in clauses.iter().enumerate() {
        let everyone = who.len() == 1 && who[0].subjects == ["*"] && !who[0].deny;
        match control.as_str() {
            "break" if everyone => {
                t.falls_through = true;
                if rights.items() != ["none"] {
                    notes.push((Severity::Stricter, "'by * <access> break': the access given before going on to the next rules is not carried over".into()));
                }
                break;
            }
            "break" => {
                notes.push((Severity::Stricter, "'break' for some subjects only: they get none here instead of going on to the next rules".into()));
                let denied = who
                    .iter()
                    .map(|a| Alt {
                        subjects: a.subjects.clone(),
                        deny: true,
                    })
                    .collect();
                out.push((denied, OneOrMany::One("none".into())));
            }
            "continue" => {
                // Later clauses that also hold replace the access (levels
                // are assigned, not added): try each pairing first.
                notes.push((
                    Severity::Note,
                    "'continue': expanded into the pairings of this clause with the later ones"
                        .into(),
                ));
                for (later, lrights, _, additive) in &clauses[k + 1..] {
                    let r = if *additive {
                        union(rights, lrights)
                    } else {
                        lrights.clone()
                    };
                    out.push((and(who.clone(), later.clone()), r));
                }
                out.push((who.clone(), rights.clone()));
            }
            _ => out.push((who.clone(), rights.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::words;

    fn tr(text: &str) -> Translated {
        translate(&words(text).unwrap()).unwrap()
    }

    fn by(t: &Translated) -> Vec<String> {
        t.by.iter()
            .map(|b| format!("{}={}", b.who.items().join("&"), b.rights.items().join(",")))
            .collect()
    }

    #[test]
    fn debian_default_rules() {
        let t = tr("to attrs=userPassword by self write by anonymous auth by * none");
        assert_eq!(t.attrs, Some(vec!["userPassword".to_string()]));
        assert_eq!(by(&t), ["self=write", "anonymous=auth", "*=none"]);
        assert!(t.notes.is_empty());
        let t = tr("to * by dn.exact=gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth manage by * break");
        assert!(t.falls_through);
        assert_eq!(
            by(&t),
            ["dn:gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth=all"]
        );
        let t = tr(r#"to dn.base="" by * read"#);
        assert_eq!(t.dn, DnSel::Scoped("base", String::new()));
    }

    /// Does the translated target cover `dn` as Pando compiles a `dn_regex`?
    fn covers(t: &Translated, dn: &str) -> bool {
        match &t.dn {
            DnSel::Regex(re) => regex::Regex::new(&format!("^(?:{re})$"))
                .unwrap()
                .is_match(dn),
            DnSel::Scoped("base", d) => d == dn,
            other => panic!("unexpected target {other:?}"),
        }
    }

    #[test]
    fn unanchored_target_regexes_cover_what_slapd_covers() {
        // slapd finds the pattern anywhere in the DN.
        let t = tr(r#"to dn.regex="ou=people,dc=x" by * none"#);
        for dn in [
            "ou=people,dc=x",
            "uid=a,ou=people,dc=x",
            "uid=a,OU=People,dc=x,dc=y",
        ] {
            assert!(covers(&t, dn), "{dn}");
        }
        assert!(!covers(&t, "ou=groups,dc=x"));
        let t = tr(r#"to dn.regex="uid=[^,]+,ou=people,dc=x$" by * none"#);
        assert!(covers(&t, "cn=z,uid=a,ou=people,dc=x"));
        assert!(!covers(&t, "uid=a,ou=people,dc=x,dc=y"));
        let t = tr(r#"to dn.regex="^ou=people" by * none"#);
        assert!(covers(&t, "ou=people,dc=x"));
        assert!(!covers(&t, "uid=a,ou=people,dc=x"));
        // Alternatives keep their own anchors.
        let t = tr(r#"to dn.regex="^cn=a|ou=b,dc=x$" by * none"#);
        assert!(covers(&t, "cn=a,dc=y") && covers(&t, "uid=q,ou=b,dc=x"));
        assert!(!covers(&t, "uid=q,cn=a,dc=y"));
        // Anchored at both ends: the one DN, as before.
        let t = tr(r#"to dn.regex="^ou=people,dc=x$" by * none"#);
        assert_eq!(t.dn, DnSel::Scoped("base", "ou=people,dc=x".into()));
        let t = tr(r#"to dn.regex="^uid=[^,]+,ou=people,dc=x$" by * none"#);
        assert!(covers(&t, "uid=a,ou=people,dc=x"));
        assert!(!covers(&t, "cn=z,uid=a,ou=people,dc=x"));
    }

    #[test]
    fn unanchored_subject_regexes_are_not_one_dn() {
        // `by dn.regex=uid=bad,dc=x none` refuses every identity whose DN
        // holds it; naming only the one DN would let the others through.
        let t = tr(r#"to * by dn.regex="uid=bad,dc=x" none by * read"#);
        assert_eq!(by(&t)[0], "*=none");
        let t = tr(r#"to * by dn.regex="^uid=ok,dc=x$" write by * read"#);
        assert_eq!(by(&t)[0], "dn:uid=ok,dc=x=write");
    }

    #[test]
    fn subjects() {
        let t = tr(
            r#"to dn.subtree="ou=people,dc=x" filter=(objectClass=person) attrs=mail,cn by group.exact="cn=hr,dc=x" write by peername.ip=10.0.0.0%255.0.0.0 read by ssf=128 users read by users search"#,
        );
        assert_eq!(t.dn, DnSel::Scoped("sub", "ou=people,dc=x".into()));
        assert_eq!(t.filter.as_deref(), Some("(objectClass=person)"));
        assert_eq!(
            by(&t),
            [
                "group:cn=hr,dc=x=write",
                "ip:10.0.0.0/8=read",
                "tls&users=read",
                "users=search"
            ]
        );
        assert!(t.notes.iter().any(|(s, _)| *s == Severity::Differs));
    }

    #[test]
    fn what_cannot_be_said_grants_less() {
        let t = tr(
            r#"to * by dn.children="ou=admins,dc=x" write by dn.regex="^uid=[^,]+,ou=ops,dc=x$" read by set="user/x" write by * read"#,
        );
        assert_eq!(
            by(&t),
            [
                "dn:ou=admins,dc=x=none",
                "subtree:ou=admins,dc=x=write",
                "subtree:ou=ops,dc=x=none",
                "*=none",
                "*=read"
            ]
        );
        let t = tr("to attrs=!person by * read");
        assert_eq!(by(&t), ["*=none"]);
        assert!(t.attrs.is_none());
        assert_eq!(by(&tr("to * by dn.regex=.* read")), ["*=read"]);
        assert_eq!(
            by(&tr("to * by peername.ip=10.1.2.3{636} read by * none")),
            ["ip:10.1.2.3=none", "*=none"]
        );
        assert_eq!(
            by(&tr("to * by dn.regex=^.+$ read by * none")),
            ["users=read", "*=none"]
        );
        let t = tr("to * by users selfwrite by * read");
        assert_eq!(by(&t), ["users=read", "*=read"]);
    }

    #[test]
    fn controls() {
        let t = tr("to * by users read continue by group=cn=a,dc=x write by * none");
        assert_eq!(
            by(&t),
            [
                "users&group:cn=a,dc=x=write",
                "users=none",
                "users=read",
                "group:cn=a,dc=x=write",
                "*=none"
            ]
        );
        // `+` privileges after continue add up, as slapd's mask does.
        let t = tr("to * by users =sc continue by group=cn=a,dc=x +rw");
        assert_eq!(
            by(&t)[0],
            "users&group:cn=a,dc=x=search,compare,read,write,add,delete"
        );
        let t = tr("to * by anonymous none break by * read");
        assert_eq!(by(&t), ["anonymous=none", "*=read"]);
        assert!(translate(&words("to * by =xcr").unwrap()).is_err());
        assert!(translate(&words("to * by").unwrap()).is_err());
        assert_eq!(by(&tr("to * by * =xr")), ["*=auth,read"]);
        assert!(translate(&words("from * by * read").unwrap()).is_err());
        assert!(translate(&words("to bogus by * read").unwrap()).is_err());
    }
}
