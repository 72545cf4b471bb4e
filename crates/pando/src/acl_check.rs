//! `pando migrate --verify-against`: the access-rule equivalence check.
//! The same reads, searches, compares and writes are made as each identity
//! (and anonymously) against slapd with its original configuration and
//! Pando with the migrated one, holding the same data; every difference in
//! what was allowed is reported. Writes carry the No-Op control (critical),
//! so both servers decide them, access rules included, and change nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use pando_proto::{
    AddRequest, Ava, Change, CompareRequest, Control, ModOp, ModifyRequest, PartialAttribute,
    ProtocolOp, Scope,
};

use crate::ldap_client::Ldap;

/// The No-Op control under the OID slapd 2.5 knows it by (Pando takes both).
const NO_OP: &str = "1.3.6.1.4.1.4203.666.5.2";
/// slapd's and Pando's answer to a no-op write that would have succeeded.
const X_NO_OPERATION: u32 = 16654;
/// The answer of a server without the No-Op control (389-DS) to a write
/// carrying it: nothing was decided, so nothing to compare.
const UNAVAILABLE_CRITICAL_EXTENSION: u32 = 12;
/// 389-DS's access control (`aci` values) is stored in the entries and
/// shown to its root DN; it is what the rules were translated from, not
/// data Pando holds: left out of every comparison.
const OLD_ACCESS_CONTROL: &[&str] = &["aci"];
/// Attributes probed with filters, per identity.
const MAX_FILTER_ATTRS: usize = 40;
/// Attributes probed with compares and modifies, per entry.
const MAX_ATTRS_PER_ENTRY: usize = 8;

pub struct Identity {
    pub dn: String,
    password: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", self.dn)
    }
}

/// `DN<TAB>password` lines; `#` comments and blank lines skipped.
pub fn read_identities(path: &std::path::Path) -> Result<Vec<Identity>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (dn, pw) = line
            .split_once('\t')
            .ok_or_else(|| format!("{}:{}: expected DN<TAB>password", path.display(), i + 1))?;
        out.push(Identity {
            dn: dn.trim().to_string(),
            password: pw.to_string(),
        });
    }
    Ok(out)
}

pub struct Found {
    pub text: String,
    pub differences: usize,
}

/// What one server answered to one probe, in classes that mean the same
/// on both (a refusal is 50 on one and 32 on the other when the entry is
/// hidden as well).
fn class(code: u32) -> String {
    match code {
        0 | X_NO_OPERATION => "allowed".into(),
        6 => "compareTrue".into(),
        5 => "compareFalse".into(),
        50 | 32 | 8 | 123 | 49 => "refused".into(),
        c => format!("result {c}"),
    }
}

type View = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn norm_dn(dn: &str) -> String {
    dn.split(',')
        .map(|r| r.trim().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

fn search(
    l: &mut Ldap,
    base: &str,
    scope: Scope,
    filter: &str,
    attrs: &[&str],
) -> Result<(u32, View), String> {
    let req = crate::ldap_client::search_request(base, scope, filter, attrs)?;
    let (code, entries) = l.request(ProtocolOp::SearchRequest(req), Vec::new())?;
    let mut view = View::new();
    for e in entries {
        let attrs = view.entry(norm_dn(&e.dn)).or_default();
        for a in e.attrs {
            let name = a.name.to_ascii_lowercase();
            if OLD_ACCESS_CONTROL.contains(&name.as_str()) {
                continue;
            }
            // Class names match ignoring case: slapcat keeps them as
            // stored, the other side may write them as defined.
            let fold = name == "objectclass";
            attrs.entry(name).or_default().extend(
                a.values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .map(|v| if fold { v.to_ascii_lowercase() } else { v }),
            );
        }
    }
    Ok((code, view))
}

fn open(url: &str, who: Option<&Identity>) -> Result<(Ldap, u32), String> {
    let mut l = Ldap::connect_only(url)?;
    let code = match who {
        Some(i) => l.simple_bind(&i.dn, &i.password)?,
        None => 0,
    };
    Ok((l, code))
}

struct Probe<'a> {
    out: String,
    differences: usize,
    checks: usize,
    who: &'a str,
}

impl Probe<'_> {
    /// One check: the two answers must be the same.
    fn same(&mut self, what: &str, slapd: &str, pando: &str) {
        self.checks += 1;
        if slapd != pando {
            self.differences += 1;
            let _ = writeln!(
                self.out,
                "  as {}: {what}: slapd {slapd}, Pando {pando}",
                self.who
            );
        }
    }
}

pub fn run(
    slapd: &str,
    pando: &str,
    identities: &[Identity],
    suffixes: &[String],
    max_entries: usize,
) -> Result<Found, String> {
    let mut whos: Vec<Option<&Identity>> = vec![None];
    whos.extend(identities.iter().map(Some));
    let all = everything_seen(slapd, &whos, suffixes)?;
    let entries: Vec<(&String, &Attrs)> = all.iter().take(max_entries).collect();
    let mut filter_attrs: BTreeSet<String> = BTreeSet::new();
    for attrs in all.values() {
        filter_attrs.extend(attrs.keys().cloned());
    }
    let filter_attrs: Vec<String> = filter_attrs.into_iter().take(MAX_FILTER_ATTRS).collect();
    let (mut out, mut total, mut checks) = (String::new(), 0, 0);
    for who in &whos {
        let name = who.map(|i| i.dn.as_str()).unwrap_or("anonymous");
        let mut p = Probe {
            out: String::new(),
            differences: 0,
            checks: 0,
            who: name,
        };
        let (mut ls, bs) = open(slapd, *who)?;
        let (mut lp, bp) = open(pando, *who)?;
        p.same("bind", &class(bs), &class(bp));
        let mut both = Both {
            slapd: &mut ls,
            pando: &mut lp,
        };
        for s in suffixes {
            reads(&mut p, &mut both, s, &entries)?;
            filters(&mut p, &mut both, s, &filter_attrs, &entries)?;
        }
        let writes_checked = writes(&mut p, &mut both, &entries)?;
        let _ = writeln!(
            out,
            "as {name}: {}",
            match p.differences {
                0 => "no difference".to_string(),
                n => format!("{n} difference(s)"),
            }
        );
        if !writes_checked {
            let _ = writeln!(
                out,
                "  as {name}: writes not checked: {slapd} does not take the No-Op control"
            );
        }
        out.push_str(&p.out);
        total += p.differences;
        checks += p.checks;
    }
    let _ = writeln!(
        out,
        "{checks} checks as {} identities over {} entries: {total} difference(s)",
        whos.len(),
        entries.len()
    );
    Ok(Found {
        text: out,
        differences: total,
    })
}

type Attrs = BTreeMap<String, BTreeSet<String>>;

/// Every entry and value any identity reads on slapd: what to probe with.
fn everything_seen(
    slapd: &str,
    whos: &[Option<&Identity>],
    suffixes: &[String],
) -> Result<View, String> {
    let mut all = View::new();
    for who in whos {
        let (mut l, code) = open(slapd, *who)?;
        if code != 0 {
            continue;
        }
        for s in suffixes {
            let (_, v) = search(&mut l, s, Scope::Sub, "(objectClass=*)", &["*"])?;
            for (dn, attrs) in v {
                let e = all.entry(dn).or_default();
                for (a, vals) in attrs {
                    e.entry(a).or_default().extend(vals);
                }
            }
        }
    }
    Ok(all)
}

/// One identity's connections to both servers.
struct Both<'a> {
    slapd: &'a mut Ldap,
    pando: &'a mut Ldap,
}

impl Both<'_> {
    fn search(
        &mut self,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: &[&str],
    ) -> Result<[(u32, View); 2], String> {
        Ok([
            search(self.slapd, base, scope, filter, attrs)?,
            search(self.pando, base, scope, filter, attrs)?,
        ])
    }

    fn request(&mut self, op: ProtocolOp, controls: Vec<Control>) -> Result<[u32; 2], String> {
        Ok([
            self.slapd.request(op.clone(), controls.clone())?.0,
            self.pando.request(op, controls)?.0,
        ])
    }
}

const SIZE_LIMIT_EXCEEDED: u32 = 4;

/// Entries and values returned: one subtree search when neither server
/// stops it at a size limit, else entry by entry (base searches).
fn reads(
    p: &mut Probe,
    both: &mut Both,
    suffix: &str,
    entries: &[(&String, &Attrs)],
) -> Result<(), String> {
    let [(cs, vs), (cp, vp)] = both.search(suffix, Scope::Sub, "(objectClass=*)", &["*"])?;
    if cs != SIZE_LIMIT_EXCEEDED && cp != SIZE_LIMIT_EXCEEDED {
        p.same(&format!("search of {suffix}"), &class(cs), &class(cp));
        compare_views(p, &vs, &vp);
        return Ok(());
    }
    for (dn, _) in entries.iter().filter(|(dn, _)| within(dn, suffix)) {
        let [(_, vs), (_, vp)] = both.search(dn, Scope::Base, "(objectClass=*)", &["*"])?;
        compare_views(p, &vs, &vp);
    }
    Ok(())
}

fn within(dn: &str, suffix: &str) -> bool {
    let s = norm_dn(suffix);
    dn == s || dn.ends_with(&format!(",{s}"))
}

fn compare_views(p: &mut Probe, vs: &View, vp: &View) {
    for dn in vs.keys().chain(vp.keys()).collect::<BTreeSet<_>>() {
        match (vs.get(dn), vp.get(dn)) {
            (Some(a), Some(b)) => {
                for at in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
                    let show = |v: Option<&BTreeSet<String>>| match v {
                        None => "not returned".to_string(),
                        Some(v) if at == "userpassword" => format!("{} value(s)", v.len()),
                        Some(v) => format!("{v:?}"),
                    };
                    p.same(
                        &format!("read {at} of {dn}"),
                        &show(a.get(at)),
                        &show(b.get(at)),
                    );
                }
            }
            (a, b) => {
                let shown = |x: Option<&Attrs>| {
                    if x.is_some() {
                        "returned"
                    } else {
                        "not returned"
                    }
                };
                p.same(&format!("read {dn}"), shown(a), shown(b));
            }
        }
    }
}

/// Which entries a presence filter on each attribute finds (what `search`
/// rights allow): one subtree search each, entry by entry when a size
/// limit stops one.
fn filters(
    p: &mut Probe,
    both: &mut Both,
    suffix: &str,
    attrs: &[String],
    entries: &[(&String, &Attrs)],
) -> Result<(), String> {
    for at in attrs {
        let f = format!("({at}=*)");
        let [(cs, vs), (cp, vp)] = both.search(suffix, Scope::Sub, &f, &["1.1"])?;
        if cs != SIZE_LIMIT_EXCEEDED && cp != SIZE_LIMIT_EXCEEDED {
            let names = |c: u32, v: &View| format!("{} ({} entries)", class(c), v.len());
            if vs.keys().ne(vp.keys()) {
                p.same(
                    &format!("search {f} under {suffix}"),
                    &names(cs, &vs),
                    &names(cp, &vp),
                );
            } else {
                p.same(
                    &format!("search {f} under {suffix}"),
                    &class(cs),
                    &class(cp),
                );
            }
            continue;
        }
        for (dn, _) in entries.iter().filter(|(dn, _)| within(dn, suffix)) {
            let [(_, vs), (_, vp)] = both.search(dn, Scope::Base, &f, &["1.1"])?;
            let found = |v: &View| if v.is_empty() { "not found" } else { "found" };
            p.same(&format!("search {f} on {dn}"), found(&vs), found(&vp));
        }
    }
    Ok(())
}

/// Compares of a value of each attribute, and no-op writes: a modify
/// replacing each attribute with its own values, an add below the entry,
/// its delete. Ok(false): the other server has no No-Op control (389-DS
/// answers unavailableCriticalExtension), so writes were left out: only
/// compares were checked.
fn writes(p: &mut Probe, both: &mut Both, entries: &[(&String, &Attrs)]) -> Result<bool, String> {
    let mut no_op = true;
    // A write both decided (Some), or None once the other server refused
    // the No-Op control: then no write is sent to either any more.
    let mut write = |p: &mut Probe, both: &mut Both, op: ProtocolOp, what: String| {
        if !no_op {
            return Ok(());
        }
        let [a, b] = both.request(op, no_op_control())?;
        if a == UNAVAILABLE_CRITICAL_EXTENSION {
            no_op = false;
            return Ok(());
        }
        p.same(&what, &class(a), &class(b));
        Ok::<(), String>(())
    };
    for (dn, attrs) in entries {
        for (at, vals) in attrs.iter().take(MAX_ATTRS_PER_ENTRY) {
            let Some(v) = vals.iter().next() else {
                continue;
            };
            let compare = ProtocolOp::CompareRequest(CompareRequest {
                dn: dn.to_string(),
                ava: Ava {
                    attr: at.clone(),
                    value: v.as_bytes().to_vec(),
                },
            });
            let [a, b] = both.request(compare, Vec::new())?;
            // A stored password's text may differ once Pando rewrote it at a
            // bind (upgrade on bind): whether the compare was allowed is
            // what both must agree on, not its outcome.
            let of = |c: u32| match (pando_model::secret::is_secret(at), c) {
                (true, 5 | 6) => "compared".to_string(),
                _ => class(c),
            };
            p.same(&format!("compare {at} of {dn}"), &of(a), &of(b));
            if at == "objectclass" {
                continue;
            }
            let modify = ProtocolOp::ModifyRequest(ModifyRequest {
                dn: dn.to_string(),
                changes: vec![Change {
                    op: ModOp::Replace,
                    attr: PartialAttribute {
                        name: at.clone(),
                        values: vals.iter().map(|v| v.as_bytes().to_vec()).collect(),
                    },
                }],
            });
            write(p, both, modify, format!("modify (no-op) {at} of {dn}"))?;
        }
        let value = |s: &str| vec![s.as_bytes().to_vec()];
        let add = ProtocolOp::AddRequest(AddRequest {
            dn: format!("cn=pando-migrate-probe,{dn}"),
            attrs: vec![
                PartialAttribute {
                    name: "objectClass".into(),
                    values: value("organizationalRole"),
                },
                PartialAttribute {
                    name: "cn".into(),
                    values: value("pando-migrate-probe"),
                },
            ],
        });
        write(p, both, add, format!("add (no-op) below {dn}"))?;
        let delete = ProtocolOp::DelRequest(dn.to_string());
        write(p, both, delete, format!("delete (no-op) {dn}"))?;
    }
    Ok(no_op)
}

fn no_op_control() -> Vec<Control> {
    vec![Control {
        oid: NO_OP.into(),
        critical: true,
        value: None,
    }]
}
