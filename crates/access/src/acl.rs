//! Access control: ordered rules compiled once, evaluated per operation,
//! entry and attribute.
//!
//! A rule covers entries (by subtree or DN pattern, optionally a filter) and
//! attributes (optionally a list; `entry` is the entry itself). For a check —
//! may this requester exercise this right on this attribute of this entry —
//! the first rule covering the entry and attribute is used, and in it the
//! first `by` clause whose subjects all hold decides. Nothing matching means
//! no access. The user guide is docs/access-control.md.
//!
//! Cost model: everything about the requester alone (anonymous, admin, DN,
//! address, TLS, ldapi) is settled once per operation in [`Access::new`];
//! group membership once per operation on first use (one index lookup per
//! nesting level); per entry, the rules covering it are found once
//! ([`Access::entry`]) and each attribute check walks only those.

use std::collections::HashMap;
use std::net::IpAddr;

use pando_model::{AttributeType, CompiledFilter, Dn, Entry, Schema, Ternary};
use pando_proto::{Ava, Filter};
use pando_store::{Candidates, EntryId, Lookup, View};
use regex::Regex;
use roaring::RoaringTreemap;

use crate::Identity;
use pando_config::{AccessBy, AccessRule, OneOrMany};

/// A set of rights, one bit each.
pub type Rights = u8;
pub const AUTH: Rights = 1;
pub const COMPARE: Rights = 2;
pub const SEARCH: Rights = 4;
pub const READ: Rights = 8;
pub const WRITE: Rights = 16;
pub const ADD: Rights = 32;
pub const DELETE: Rights = 64;
/// Act as the entry's identity with the proxied authorization control
/// (RFC 4370). Only ever granted by name: no level includes it.
pub const PROXY: Rights = 128;

/// Most rules (rule indices are kept as u16).
const MAX_RULES: usize = 4096;
/// Deepest group nesting followed for `group:` subjects.
const MAX_GROUP_NESTING: usize = 4;
/// Most groups collected for one requester.
const MAX_GROUPS: u64 = 10_000;

/// The name of a single right, for messages.
pub fn right_name(r: Rights) -> &'static str {
    match r {
        AUTH => "auth",
        COMPARE => "compare",
        SEARCH => "search",
        READ => "read",
        WRITE => "write",
        ADD => "add",
        DELETE => "delete",
        PROXY => "proxy",
        _ => "sufficient",
    }
}

fn level(name: &str) -> Option<Rights> {
    Some(match name {
        "none" => 0,
        "auth" => AUTH,
        "compare" => AUTH | COMPARE,
        "search" => AUTH | COMPARE | SEARCH,
        "read" => AUTH | COMPARE | SEARCH | READ,
        "write" | "all" => AUTH | COMPARE | SEARCH | READ | WRITE | ADD | DELETE,
        _ => return None,
    })
}

fn single(name: &str) -> Option<Rights> {
    Some(match name {
        "auth" => AUTH,
        "compare" => COMPARE,
        "search" => SEARCH,
        "read" => READ,
        "write" => WRITE,
        "add" => ADD,
        "delete" => DELETE,
        "proxy" => PROXY,
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Base,
    One,
    Sub,
    Children,
}

#[derive(Debug)]
enum Target {
    All,
    Dn { base: String, scope: Scope },
    Regex(Regex),
}

#[derive(Debug)]
enum Subject {
    Anyone,
    Anonymous,
    Users,
    SelfDn,
    Admins,
    Dn(String),
    Subtree(String),
    Group(Dn),
    Net(IpAddr, u8),
    Tls,
    Ldapi,
}

#[derive(Debug)]
struct By {
    subjects: Vec<Subject>,
    rights: Rights,
}

struct Rule {
    target: Target,
    filter: Option<CompiledFilter>,
    /// None: every attribute and the entry itself.
    attrs: Option<AttrSel>,
    /// Index of this rule's first clause in the flattened clause list.
    first_by: usize,
    by: Vec<By>,
}

struct AttrSel {
    entry: bool,
    oids: Vec<String>,
}

/// The compiled rule list.
pub struct Acl {
    rules: Vec<Rule>,
    clauses: usize,
}

/// The rules used when none are configured.
pub fn default_rules() -> Vec<AccessRule> {
    // One right name is a level (cumulative); a list is exactly those rights.
    let by = |who: &str, rights: &[&str]| pando_config::AccessBy {
        who: OneOrMany::One(who.to_string()),
        rights: match rights {
            [level] => OneOrMany::One(level.to_string()),
            list => OneOrMany::Many(list.iter().map(|r| r.to_string()).collect()),
        },
    };
    vec![
        AccessRule {
            dn: None,
            scope: None,
            dn_regex: None,
            filter: None,
            attrs: Some(vec!["userPassword".into()]),
            by: vec![
                by("admins", &["all"]),
                by("self", &["auth", "write"]),
                by("*", &["auth"]),
            ],
        },
        AccessRule {
            dn: None,
            scope: None,
            dn_regex: None,
            filter: None,
            attrs: None,
            by: vec![by("admins", &["all"]), by("users", &["read"])],
        },
    ]
}

type CompileError = (usize, &'static str, String);

impl Acl {
    /// Do any rules look at entry contents (a filter)? If not, callers may
    /// pass an entry without attributes to [`Access::entry`].
    pub fn reads_entries(&self) -> bool {
        self.rules.iter().any(|r| r.filter.is_some())
    }

    /// The configured rules, or the defaults when there are none.
    pub fn from_config(rules: &[AccessRule], schema: &Schema) -> Result<Acl, CompileError> {
        if rules.is_empty() {
            Acl::compile(&default_rules(), schema)
        } else {
            Acl::compile(rules, schema)
        }
    }

    /// Compile rules; an error names the rule index, the key and the problem.
    pub fn compile(rules: &[AccessRule], schema: &Schema) -> Result<Acl, CompileError> {
        if rules.len() > MAX_RULES {
            return Err((MAX_RULES, "", format!("more than {MAX_RULES} rules")));
        }
        let mut out = Vec::with_capacity(rules.len());
        let mut clauses = 0;
        for (i, r) in rules.iter().enumerate() {
            let e = |key: &'static str, msg: String| (i, key, msg);
            let target = compile_target(i, r, schema)?;
            let filter = match &r.filter {
                None => None,
                Some(f) => {
                    let parsed = Filter::parse(f)
                        .map_err(|x| e("filter", format!("'{f}' is not a filter: {x}")))?;
                    Some(schema.compile_filter(&parsed))
                }
            };
            let attrs = match &r.attrs {
                None => None,
                Some(list) => Some(compile_attrs(list, schema).map_err(|m| e("attrs", m))?),
            };
            if r.by.is_empty() {
                return Err(e("by", "at least one clause is needed".into()));
            }
            let by =
                r.by.iter()
                    .map(|b| compile_by(i, b, schema))
                    .collect::<Result<Vec<By>, CompileError>>()?;
            let first_by = clauses;
            clauses += by.len();
            out.push(Rule {
                target,
                filter,
                attrs,
                first_by,
                by,
            });
        }
        Ok(Acl {
            rules: out,
            clauses,
        })
    }
}

/// Rule `i`'s target: every entry, a subtree (or base, one level,
/// children) of a DN, or the DNs a regular expression matches whole.
fn compile_target(i: usize, r: &AccessRule, schema: &Schema) -> Result<Target, CompileError> {
    let e = |key: &'static str, msg: String| (i, key, msg);
    let (dn, scope) = match (&r.dn, &r.scope, &r.dn_regex) {
        (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            return Err(e(
                "dn_regex",
                "give either dn_regex, or dn and scope".into(),
            ));
        }
        (None, None, Some(re)) => {
            return Ok(Target::Regex(Regex::new(&format!("^(?:{re})$")).map_err(
                |x| e("dn_regex", format!("not a regular expression: {x}")),
            )?))
        }
        (dn, scope, None) => (dn, scope),
    };
    let scope = match scope.as_deref().unwrap_or("sub") {
        "base" => Scope::Base,
        "one" => Scope::One,
        "sub" => Scope::Sub,
        "children" => Scope::Children,
        other => {
            return Err(e(
                "scope",
                format!("'{other}' is not one of base, one, sub, children"),
            ))
        }
    };
    Ok(match dn.as_deref() {
        None | Some("") if scope == Scope::Sub => Target::All,
        None | Some("") => Target::Dn {
            base: String::new(),
            scope,
        },
        Some(d) => {
            let dn = Dn::parse(d).map_err(|x| e("dn", format!("'{d}' is not a DN: {x}")))?;
            Target::Dn {
                base: schema.normalize_dn(&dn).map_err(|x| e("dn", x))?,
                scope,
            }
        }
    })
}

/// A rule's `attrs`: `entry` and attribute types the schema knows.
fn compile_attrs(list: &[String], schema: &Schema) -> Result<AttrSel, String> {
    let mut sel = AttrSel {
        entry: false,
        oids: Vec::new(),
    };
    for a in list {
        if a.eq_ignore_ascii_case("entry") {
            sel.entry = true;
        } else {
            let at = schema
                .attribute(a)
                .ok_or_else(|| format!("unknown attribute type '{a}'"))?;
            sel.oids.push(at.oid.clone());
        }
    }
    Ok(sel)
}

/// One `by` clause of rule `i`: its subjects and the rights they get (a
/// level, or a list of single rights).
fn compile_by(i: usize, b: &AccessBy, schema: &Schema) -> Result<By, CompileError> {
    let e = |key: &'static str, msg: String| (i, key, msg);
    let mut subjects = Vec::new();
    for w in b.who.items() {
        subjects.push(parse_subject(w, schema).map_err(|m| e("by.who", m))?);
    }
    if subjects.is_empty() {
        return Err(e("by.who", "no subject given".into()));
    }
    let items = b.rights.items();
    let rights = match (&b.rights, items.as_slice()) {
        (OneOrMany::One(l), _) => level(l).ok_or_else(|| {
            e(
                "by.rights",
                format!("'{l}' is not one of none, auth, compare, search, read, write, all"),
            )
        })?,
        (OneOrMany::Many(_), list) => {
            let mut r = 0;
            for x in list {
                r |= single(x).or_else(|| (*x == "all" || *x == "none").then(|| level(x).unwrap_or(0))).ok_or_else(|| {
                    e("by.rights", format!("'{x}' is not one of auth, compare, search, read, write, add, delete, proxy, all, none"))
                })?;
            }
            r
        }
    };
    Ok(By { subjects, rights })
}

/// One subject of a `who` list (see docs/access-control.md).
fn parse_subject(w: &str, schema: &Schema) -> Result<Subject, String> {
    let dn_arg = |arg: &str| -> Result<Dn, String> {
        let dn = Dn::parse(arg).map_err(|x| format!("'{arg}' is not a DN: {x}"))?;
        schema.normalize_dn(&dn)?;
        Ok(dn)
    };
    let norm = |arg: &str| -> Result<String, String> { schema.normalize_dn(&dn_arg(arg)?) };
    Ok(match w {
        "*" | "anyone" => Subject::Anyone,
        "anonymous" => Subject::Anonymous,
        "users" => Subject::Users,
        "self" => Subject::SelfDn,
        "admins" => Subject::Admins,
        "tls" => Subject::Tls,
        "ldapi" => Subject::Ldapi,
        _ => {
            let unknown = || format!("'{w}' is not a subject (see docs/access-control.md)");
            let (kind, arg) = w.split_once(':').ok_or_else(unknown)?;
            match kind {
                "dn" => Subject::Dn(norm(arg)?),
                "subtree" => Subject::Subtree(norm(arg)?),
                "group" => Subject::Group(dn_arg(arg)?),
                "ip" => {
                    let (addr, bits) = parse_net(arg)
                        .ok_or_else(|| format!("'{arg}' is not an address or address/prefix"))?;
                    Subject::Net(addr, bits)
                }
                _ => return Err(unknown()),
            }
        }
    })
}

/// A list of subjects that must all hold, for settings chosen per
/// requester (limits). `self` has no meaning there and is refused.
#[derive(Debug)]
pub struct Who {
    subjects: Vec<Subject>,
}

impl Who {
    pub fn parse(items: &[&str], schema: &Schema) -> Result<Who, String> {
        let mut subjects = Vec::new();
        for w in items {
            let s = parse_subject(w, schema)?;
            if matches!(s, Subject::SelfDn) {
                return Err("'self' needs a target entry and cannot be used here".into());
            }
            subjects.push(s);
        }
        if subjects.is_empty() {
            return Err("no subject given".into());
        }
        Ok(Who { subjects })
    }

    /// Does the requester match? Group subjects look into the store.
    pub fn holds(&self, who: &Identity, view: &View<'_>) -> bool {
        match settle_subjects(&self.subjects, who) {
            Settled::No => false,
            Settled::Yes => true,
            Settled::Depends => {
                let mut groups = None;
                self.subjects.iter().all(|s| match s {
                    Subject::Group(dn) => in_group(view, who.dn(), dn, &mut groups),
                    _ => true,
                })
            }
        }
    }
}

fn parse_net(s: &str) -> Option<(IpAddr, u8)> {
    let (a, bits) = match s.rsplit_once('/') {
        Some((a, b)) => (a, Some(b.parse::<u8>().ok()?)),
        None => (s, None),
    };
    let addr: IpAddr = a.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((addr, bits))
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    // An IPv4 client may arrive as an IPv4-mapped IPv6 address.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Is `dn` strictly below `base` (both normalised)? A comma only counts
/// as a separator when it is not escaped.
pub fn is_below(dn: &str, base: &str) -> bool {
    if base.is_empty() {
        return !dn.is_empty();
    }
    let Some(head) = dn.strip_suffix(base) else {
        return false;
    };
    let Some(head) = head.strip_suffix(',') else {
        return false;
    };
    !head.is_empty() && !ends_escaped(head)
}

/// Does `s` end in an odd run of backslashes (so a following char is escaped)?
fn ends_escaped(s: &str) -> bool {
    s.bytes().rev().take_while(|&b| b == b'\\').count() % 2 == 1
}

/// Does the head (the part of a DN before its parent) hold exactly one RDN?
fn single_rdn(head: &str) -> bool {
    let b = head.as_bytes();
    !b.iter()
        .enumerate()
        .any(|(i, &c)| c == b',' && !ends_escaped(&head[..i]))
}

impl Target {
    fn covers(&self, dn: &str) -> bool {
        match self {
            Target::All => true,
            Target::Regex(r) => r.is_match(dn),
            Target::Dn { base, scope } => match scope {
                Scope::Base => dn == base,
                Scope::Sub => dn == base || is_below(dn, base),
                Scope::Children => is_below(dn, base),
                Scope::One => {
                    if !is_below(dn, base) {
                        return false;
                    }
                    let head_len = if base.is_empty() {
                        dn.len()
                    } else {
                        dn.len() - base.len() - 1
                    };
                    single_rdn(&dn[..head_len])
                }
            },
        }
    }
}

/// A clause's subjects, settled for one requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    No,
    Yes,
    /// Holds if the target is the requester's own entry and/or the
    /// requester is in the listed groups: decided per check.
    Depends,
}

/// Decisions for one operation by one requester.
pub struct Access<'a> {
    acl: &'a Acl,
    who: &'a Identity,
    bypass: bool,
    settled: Vec<Settled>,
    /// Group subject (by address in the compiled rules) → is the
    /// requester a member?
    member_of: HashMap<usize, bool>,
    /// IDs of every group the requester belongs to, directly or nested.
    groups_of_requester: Option<RoaringTreemap>,
    /// [`Access::reads_every_entry`], settled on first use.
    reads_every_entry: Option<bool>,
}

/// The rules that cover one entry (indices), found once per entry.
#[derive(Default)]
pub struct EntryRules {
    rules: Vec<u16>,
}

impl<'a> Access<'a> {
    pub fn new(acl: &'a Acl, who: &'a Identity) -> Access<'a> {
        let bypass = who.is_break_glass();
        let mut settled = Vec::with_capacity(acl.clauses);
        if !bypass {
            for r in &acl.rules {
                for b in &r.by {
                    settled.push(settle(b, who));
                }
            }
        }
        Access {
            acl,
            who,
            bypass,
            settled,
            member_of: HashMap::new(),
            groups_of_requester: None,
            reads_every_entry: None,
        }
    }

    /// Do the rules pass content to callers that decide per entry (a
    /// filter)? If not, [`Access::entry`] may be given no attributes.
    pub fn reads_entries(&self) -> bool {
        self.acl.reads_entries()
    }

    /// Is the requester sure to have read access to every entry itself,
    /// whatever its DN and content? Then counts of visible entries need no
    /// per-entry check. Conservative: false whenever it depends on the entry.
    ///
    /// For an entry-level check the first rule covering the entry decides,
    /// and in it the first clause that holds. So it is sure when every rule
    /// that may cover entries, up to one that covers all of them without a
    /// filter, grants read whichever of its clauses holds for the
    /// requester: clauses that cannot hold are skipped, clauses that depend
    /// on the entry (self, groups) must grant read too, and one must
    /// surely hold.
    pub fn reads_every_entry(&mut self) -> bool {
        if self.bypass {
            return true;
        }
        if let Some(r) = self.reads_every_entry {
            return r;
        }
        let mut answer = false;
        for r in &self.acl.rules {
            if r.attrs.as_ref().is_some_and(|sel| !sel.entry) {
                continue;
            }
            let mut grants = false;
            for (j, b) in r.by.iter().enumerate() {
                let reads = b.rights & READ == READ;
                match self.settled[r.first_by + j] {
                    Settled::No => continue,
                    Settled::Depends if reads => continue,
                    Settled::Depends => break,
                    Settled::Yes => {
                        grants = reads;
                        break;
                    }
                }
            }
            if !grants {
                break;
            }
            if matches!(r.target, Target::All) && r.filter.is_none() {
                answer = true;
                break;
            }
        }
        self.reads_every_entry = Some(answer);
        answer
    }

    /// Does this requester bypass every rule (break-glass)?
    pub fn unrestricted(&self) -> bool {
        self.bypass
    }

    /// Rules covering the entry `norm_dn` with these attributes.
    pub fn entry(&self, schema: &Schema, norm_dn: &str, entry: &Entry) -> EntryRules {
        let mut out = EntryRules::default();
        self.entry_into(schema, norm_dn, entry, &mut out);
        out
    }

    /// [`Access::entry`] into a reused buffer (searches do this per entry).
    pub fn entry_into(&self, schema: &Schema, norm_dn: &str, entry: &Entry, out: &mut EntryRules) {
        out.rules.clear();
        if self.bypass {
            return;
        }
        let rules = &mut out.rules;
        for (i, r) in self.acl.rules.iter().enumerate() {
            if !r.target.covers(norm_dn) {
                continue;
            }
            if let Some(f) = &r.filter {
                if f.matches(schema, entry) != Ternary::True {
                    continue;
                }
            }
            rules.push(i as u16);
        }
    }

    /// [`Access::entry`] with only the rules that name the entry by DN or
    /// DN pattern (rules covering every entry left out): for trees outside
    /// the data, such as cn=Monitor, where a catch-all rule must not open
    /// what no rule names. Empty when no rule names it.
    pub fn named_entry(&self, schema: &Schema, norm_dn: &str, entry: &Entry) -> EntryRules {
        let mut out = self.entry(schema, norm_dn, entry);
        out.rules
            .retain(|&i| !matches!(self.acl.rules[i as usize].target, Target::All));
        out
    }

    /// Is the set of rules empty (no rule covers the entry)?
    pub fn is_empty(rules: &EntryRules) -> bool {
        rules.rules.is_empty()
    }

    /// Does a rule that names the entry `norm_dn` by its DN (rules covering
    /// every entry do not count, nor those with a filter) grant the
    /// requester `right` on it? For trees outside the data, such as
    /// cn=accesslog, which the catch-all rules must not open.
    pub fn named_allows(&mut self, norm_dn: &str, right: Rights) -> bool {
        if self.bypass {
            return true;
        }
        let rules = EntryRules {
            rules: (self.acl.rules.iter().enumerate())
                .filter(|(_, r)| {
                    !matches!(r.target, Target::All)
                        && r.filter.is_none()
                        && r.target.covers(norm_dn)
                })
                .map(|(i, _)| i as u16)
                .collect(),
        };
        self.allows(None, &rules, norm_dn, None, right)
    }

    /// May the requester exercise all of `right` on `attr` (None = the
    /// entry itself) of the entry these rules were found for?
    pub fn allows(
        &mut self,
        view: Option<&View<'_>>,
        rules: &EntryRules,
        norm_dn: &str,
        attr: Option<&AttributeType>,
        right: Rights,
    ) -> bool {
        if self.bypass {
            return true;
        }
        for &i in &rules.rules {
            let r = &self.acl.rules[i as usize];
            let covered = match (&r.attrs, attr) {
                (None, _) => true,
                (Some(sel), None) => sel.entry,
                (Some(sel), Some(at)) => sel.oids.contains(&at.oid),
            };
            if !covered {
                continue;
            }
            for (j, b) in r.by.iter().enumerate() {
                let holds = match self.settled[r.first_by + j] {
                    Settled::No => false,
                    Settled::Yes => true,
                    Settled::Depends => self.depends_hold(view, b, norm_dn),
                };
                if holds {
                    return b.rights & right == right;
                }
            }
            return false;
        }
        false
    }

    /// The rights the requester holds on `attr` of this entry.
    pub fn rights(
        &mut self,
        view: Option<&View<'_>>,
        rules: &EntryRules,
        norm_dn: &str,
        attr: Option<&AttributeType>,
    ) -> Rights {
        let mut r = 0;
        for bit in [AUTH, COMPARE, SEARCH, READ, WRITE, ADD, DELETE] {
            if self.allows(view, rules, norm_dn, attr, bit) {
                r |= bit;
            }
        }
        r
    }

    fn depends_hold(&mut self, view: Option<&View<'_>>, b: &By, norm_dn: &str) -> bool {
        for s in &b.subjects {
            let ok = match s {
                Subject::SelfDn => !self.who.is_anonymous() && self.who.norm() == norm_dn,
                Subject::Group(dn) => match view {
                    Some(v) => self.is_member(v, dn),
                    None => false,
                },
                // Settled ones already held, or the clause would be `No`.
                _ => true,
            };
            if !ok {
                return false;
            }
        }
        true
    }

    fn is_member(&mut self, view: &View<'_>, group: &Dn) -> bool {
        let idx = group as *const Dn as usize;
        if let Some(&m) = self.member_of.get(&idx) {
            return m;
        }
        let m = in_group(view, self.who.dn(), group, &mut self.groups_of_requester);
        self.member_of.insert(idx, m);
        m
    }
}

/// Is `dn` (the requester; empty = anonymous) a member of `group`, directly
/// or nested? `groups` keeps the requester's groups between calls.
fn in_group(view: &View<'_>, dn: &str, group: &Dn, groups: &mut Option<RoaringTreemap>) -> bool {
    if dn.is_empty() {
        return false;
    }
    let Ok(Ok(Lookup::Found(gid))) = view.lookup(group) else {
        return false;
    };
    groups
        .get_or_insert_with(|| groups_containing(view, dn).unwrap_or_default())
        .contains(gid)
}

/// Every group whose member/uniqueMember holds `dn`, directly or through
/// nested groups (up to MAX_GROUP_NESTING levels), found through the
/// equality indexes of member and uniqueMember.
fn groups_containing(view: &View<'_>, dn: &str) -> Option<RoaringTreemap> {
    let mut all = RoaringTreemap::new();
    let mut frontier = vec![dn.to_string()];
    for _ in 0..MAX_GROUP_NESTING {
        let mut next = Vec::new();
        for d in &frontier {
            for attr in ["member", "uniqueMember"] {
                let f = Filter::Equality(Ava {
                    attr: attr.into(),
                    value: d.as_bytes().to_vec(),
                });
                let ids = match view.candidates(&f).ok()? {
                    Candidates::Ids(ids) => ids,
                    // Unindexed membership is not followed: add an eq index
                    // on member/uniqueMember (they are indexed by default).
                    Candidates::All => continue,
                };
                // Index keys are truncated (pando_store::index::MAX_KEY): a long DN
                // may share a key with another, so confirm those.
                let confirm = d.len() >= pando_store::index::MAX_KEY / 2;
                for id in ids.iter() {
                    if all.contains(id) || (confirm && !has_member(view, id, attr, d)) {
                        continue;
                    }
                    all.insert(id);
                    next.push(id);
                }
            }
        }
        if next.is_empty() || all.len() > MAX_GROUPS {
            break;
        }
        frontier = next
            .into_iter()
            .filter_map(|id: EntryId| view.dn_string(id).ok())
            .collect();
    }
    Some(all)
}

/// Does group `id` hold `dn` in `attr` (compared as normalised DNs)?
fn has_member(view: &View<'_>, id: EntryId, attr: &str, dn: &str) -> bool {
    let schema = view.schema();
    let Some(at) = schema.attribute(attr) else {
        return false;
    };
    let Ok(want) = schema.normalize(at, dn.as_bytes()) else {
        return false;
    };
    let Ok(Some(attrs)) = view.attrs(id) else {
        return false;
    };
    attrs
        .iter()
        .filter(|a| a.desc.eq_ignore_ascii_case(attr))
        .flat_map(|a| &a.values)
        .any(|v| schema.normalize(at, v).is_ok_and(|n| n == want))
}

fn settle(b: &By, who: &Identity) -> Settled {
    settle_subjects(&b.subjects, who)
}

fn settle_subjects(subjects: &[Subject], who: &Identity) -> Settled {
    let s = &who.session;
    let mut depends = false;
    for subj in subjects {
        let ok = match subj {
            Subject::Anyone => true,
            Subject::Anonymous => who.is_anonymous(),
            Subject::Users => !who.is_anonymous(),
            Subject::Admins => who.is_admin(),
            Subject::Dn(d) => !who.is_anonymous() && who.norm() == d,
            Subject::Subtree(d) => {
                !who.is_anonymous() && (who.norm() == d || is_below(who.norm(), d))
            }
            Subject::Net(net, bits) => s.peer_ip.is_some_and(|ip| in_net(ip, *net, *bits)),
            Subject::Tls => s.tls,
            Subject::Ldapi => s.peer_cred.is_some(),
            Subject::SelfDn | Subject::Group(_) => {
                if who.is_anonymous() {
                    false
                } else {
                    depends = true;
                    true
                }
            }
        };
        if !ok {
            return Settled::No;
        }
    }
    if depends {
        Settled::Depends
    } else {
        Settled::Yes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PeerCred, Session};
    use pando_config::{AccessBy, Config};
    use std::path::Path;
    use std::sync::Arc;

    fn rules(toml: &str) -> Vec<AccessRule> {
        Config::from_toml(toml, Path::new("t.toml")).unwrap().access
    }

    fn who(dn: &str, session: Session) -> Identity {
        let schema = Schema::standard();
        let norm = schema.normalize_dn(&Dn::parse(dn).unwrap()).unwrap();
        Identity::authenticated(dn, norm, Arc::new(session))
    }

    fn entry() -> Entry {
        Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: vec![pando_model::Attribute {
                desc: "objectClass".into(),
                values: vec![b"person".to_vec()],
            }],
        }
    }

    #[test]
    fn dn_scopes() {
        assert!(is_below("uid=a,dc=x", "dc=x"));
        assert!(!is_below("dc=x", "dc=x"));
        assert!(!is_below("uid=a\\,dc=x", "dc=x"));
        assert!(is_below("uid=a\\\\,dc=x", "dc=x"));
        assert!(!is_below("xdc=x", "dc=x"));
        let one = Target::Dn {
            base: "dc=x".into(),
            scope: Scope::One,
        };
        assert!(one.covers("uid=a,dc=x"));
        assert!(one.covers("uid=a\\,b,dc=x"));
        assert!(!one.covers("uid=a,ou=p,dc=x"));
        assert!(!one.covers("dc=x"));
    }

    #[test]
    fn first_rule_then_first_clause_default_deny() {
        let schema = Schema::standard();
        let acl = Acl::compile(
            &rules(
                r#"
[[access]]
dn = "ou=people,dc=example,dc=com"
attrs = ["mail"]
by = [{ who = "self", rights = "write" }, { who = "users", rights = "read" }]
[[access]]
dn = "ou=people,dc=example,dc=com"
by = [{ who = ["users", "tls"], rights = "read" }, { who = "ip:10.0.0.0/8", rights = "search" }]
"#,
            ),
            &schema,
        )
        .unwrap();
        let mail = schema.attribute("mail").unwrap();
        let cn = schema.attribute("cn").unwrap();
        let target = "uid=a,ou=people,dc=example,dc=com";
        let e = entry();
        let me = who("uid=a,ou=People,dc=example,dc=com", Session::default());
        let mut a = Access::new(&acl, &me);
        let r = a.entry(&schema, target, &e);
        assert!(a.allows(None, &r, target, Some(mail), WRITE));
        // cn falls to the second rule: users only with TLS.
        assert!(!a.allows(None, &r, target, Some(cn), READ));
        let tls = who(
            "uid=b,ou=People,dc=example,dc=com",
            Session {
                tls: true,
                ..Session::default()
            },
        );
        let mut a = Access::new(&acl, &tls);
        let r = a.entry(&schema, target, &e);
        assert!(a.allows(None, &r, target, Some(cn), READ));
        assert!(!a.allows(None, &r, target, Some(mail), WRITE));
        assert!(a.allows(None, &r, target, Some(mail), READ));
        // Address subject; outside every rule nothing is allowed.
        let net = Identity::anonymous(Arc::new(Session {
            peer_ip: Some("10.1.2.3".parse().unwrap()),
            ..Session::default()
        }));
        let mut a = Access::new(&acl, &net);
        let r = a.entry(&schema, target, &e);
        assert!(a.allows(None, &r, target, Some(cn), SEARCH));
        assert!(!a.allows(None, &r, target, Some(cn), READ));
        let r = a.entry(&schema, "dc=example,dc=com", &e);
        assert!(!a.allows(None, &r, "dc=example,dc=com", None, SEARCH));
    }

    #[test]
    fn only_rules_naming_a_tree_open_it() {
        let schema = Schema::standard();
        let acl = Acl::compile(
            &rules(
                r#"
[[access]]
dn = "cn=accesslog"
by = [{ who = "dn:cn=replicator,dc=example,dc=com", rights = "read" }]
[[access]]
by = [{ who = "users", rights = "read" }]
"#,
            ),
            &schema,
        )
        .unwrap();
        let repl = who("cn=replicator,dc=example,dc=com", Session::default());
        let user = who("uid=a,dc=example,dc=com", Session::default());
        let record = "reqstart=20261127000000.000000000z,cn=accesslog";
        assert!(Access::new(&acl, &repl).named_allows("cn=accesslog", READ));
        assert!(Access::new(&acl, &repl).named_allows(record, READ));
        assert!(!Access::new(&acl, &repl).named_allows(record, WRITE));
        // The catch-all rule lets users read the data, not the log.
        assert!(!Access::new(&acl, &user).named_allows("cn=accesslog", READ));
        let defaults = Acl::from_config(&[], &schema).unwrap();
        assert!(!Access::new(&defaults, &repl).named_allows("cn=accesslog", READ));
    }

    #[test]
    fn a_rule_naming_one_monitor_entry_opens_no_other() {
        let schema = Schema::standard();
        let acl = Acl::compile(
            &rules(
                r#"
[[access]]
dn = "cn=connections,cn=monitor"
scope = "base"
by = [{ who = "users", rights = "read" }]
[[access]]
by = [{ who = "users", rights = "read" }]
"#,
            ),
            &schema,
        )
        .unwrap();
        let user = who("uid=a,dc=example,dc=com", Session::default());
        let mut a = Access::new(&acl, &user);
        let named = a.named_entry(&schema, "cn=connections,cn=monitor", &entry());
        assert!(a.allows(None, &named, "cn=connections,cn=monitor", None, READ));
        let conflicts = "cn=conflicts,cn=replication,cn=monitor";
        let other = a.named_entry(&schema, conflicts, &entry());
        assert!(Access::is_empty(&other));
        assert!(!a.allows(None, &other, conflicts, None, READ));
    }

    #[test]
    fn defaults_protect_passwords() {
        let schema = Schema::standard();
        let acl = Acl::from_config(&[], &schema).unwrap();
        let pw = schema.attribute("userPassword").unwrap();
        let cn = schema.attribute("cn").unwrap();
        let t = "uid=a,dc=example,dc=com";
        let e = entry();
        let anon = Identity::anonymous(Arc::default());
        let mut a = Access::new(&acl, &anon);
        let r = a.entry(&schema, t, &e);
        assert_eq!(a.rights(None, &r, t, Some(pw)), AUTH);
        assert_eq!(a.rights(None, &r, t, Some(cn)), 0);
        let me = who("uid=a,dc=example,dc=com", Session::default());
        let mut a = Access::new(&acl, &me);
        assert_eq!(a.rights(None, &r, t, Some(pw)), AUTH | WRITE);
        assert_eq!(
            a.rights(None, &r, t, Some(cn)),
            AUTH | COMPARE | SEARCH | READ
        );
        let admin = who("cn=admin,dc=example,dc=com", Session::default()).with_roles(true, false);
        let mut a = Access::new(&acl, &admin);
        assert!(a.allows(None, &r, t, Some(pw), READ | WRITE));
        let glass = Identity::anonymous(Arc::new(Session {
            peer_cred: Some(PeerCred { uid: 0, gid: 0 }),
            ..Session::default()
        }))
        .with_roles(false, true);
        let a = Access::new(&acl, &glass);
        assert!(a.unrestricted());
    }

    #[test]
    fn reads_every_entry_only_when_no_rule_can_refuse() {
        let schema = Schema::standard();
        let acl = Acl::from_config(&[], &schema).unwrap();
        let me = who("uid=a,dc=example,dc=com", Session::default());
        let admin = me.clone().with_roles(true, false);
        // Defaults: the userPassword rule does not cover entries.
        assert!(Access::new(&acl, &me).reads_every_entry());
        assert!(Access::new(&acl, &admin).reads_every_entry());
        assert!(!Access::new(&acl, &Identity::anonymous(Arc::default())).reads_every_entry());
        let acl = Acl::compile(
            &rules(
                r#"
[[access]]
dn = "ou=vault,dc=example,dc=com"
scope = "children"
by = [{ who = "admins", rights = "all" }, { who = "self", rights = "read" }]
[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"#,
            ),
            &schema,
        )
        .unwrap();
        assert!(Access::new(&acl, &admin).reads_every_entry());
        // Self holds only on the user's own entry: the vault can refuse.
        assert!(!Access::new(&acl, &me).reads_every_entry());
        let filtered = Acl::compile(
            &rules(
                r#"
[[access]]
filter = "(objectClass=person)"
by = [{ who = "users", rights = "read" }]
"#,
            ),
            &schema,
        )
        .unwrap();
        assert!(!Access::new(&filtered, &me).reads_every_entry());
    }

    #[test]
    fn compile_errors_name_rule_and_key() {
        let schema = Schema::standard();
        let bad = |t: &str| Acl::compile(&rules(t), &schema).err().unwrap();
        let e = bad("[[access]]\nscope = \"deep\"\nby = [{ who = \"*\", rights = \"read\" }]\n");
        assert_eq!((e.0, e.1), (0, "scope"));
        let e = bad("[[access]]\nby = [{ who = \"*\", rights = \"read\" }]\n[[access]]\nby = [{ who = \"nobody\", rights = \"read\" }]\n");
        assert_eq!((e.0, e.1), (1, "by.who"));
        let e = bad("[[access]]\nby = [{ who = \"*\", rights = \"peek\" }]\n");
        assert_eq!(e.1, "by.rights");
        let e = bad("[[access]]\nattrs = [\"nope\"]\nby = [{ who = \"*\", rights = \"read\" }]\n");
        assert_eq!(e.1, "attrs");
        let e = bad("[[access]]\nfilter = \"(((\"\nby = [{ who = \"*\", rights = \"read\" }]\n");
        assert_eq!(e.1, "filter");
        let e = bad("[[access]]\ndn_regex = \"(\"\nby = [{ who = \"*\", rights = \"read\" }]\n");
        assert_eq!(e.1, "dn_regex");
        let _ = AccessBy {
            who: OneOrMany::One("*".into()),
            rights: OneOrMany::One("read".into()),
        };
    }

    #[test]
    fn networks() {
        assert!(in_net(
            "10.1.2.3".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            8
        ));
        assert!(!in_net(
            "11.1.2.3".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            8
        ));
        assert!(in_net(
            "::ffff:10.1.2.3".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            8
        ));
        assert!(in_net("::1".parse().unwrap(), "::1".parse().unwrap(), 128));
        assert!(parse_net("10.0.0.0/33").is_none());
        assert_eq!(parse_net("::1"), Some(("::1".parse().unwrap(), 128)));
    }
}
