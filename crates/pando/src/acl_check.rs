//! `pando migrate --verify-against`: the access-rule equivalence check.
//! The same reads, searches, compares and writes are made as each identity
//! (and anonymously) against slapd with its original configuration and
//! Pando with the migrated one, holding the same data; every difference in
//! what was allowed is reported. Writes carry the No-Op control (critical),
//! so both servers decide them, access rules included, and change nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use pando_proto::{
    AddRequest, Ava, Change, CompareRequest, Control, DerefAliases, Filter, ModOp, ModifyRequest,
    PartialAttribute, ProtocolOp, Scope, SearchRequest,
};

use crate::ldap_client::Ldap;

/// The No-Op control under the OID slapd 2.5 knows it by (Pando takes both).
const NO_OP: &str = "1.3.6.1.4.1.4203.666.5.2";
/// slapd's and Pando's answer to a no-op write that would have succeeded.
const X_NO_OPERATION: u32 = 16654;
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

fn search(l: &mut Ldap, base: &str, filter: &str, attrs: &[&str]) -> Result<(u32, View), String> {
    let filter = Filter::parse(filter).map_err(|e| e.to_string())?;
    let (code, entries) = l.request(
        ProtocolOp::SearchRequest(SearchRequest {
            base: base.into(),
            scope: Scope::Sub,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter,
            attrs: attrs.iter().map(|a| a.to_string()).collect(),
        }),
        Vec::new(),
    )?;
    let mut view = View::new();
    for e in entries {
        let attrs = view.entry(norm_dn(&e.dn)).or_default();
        for a in e.attrs {
            attrs
                .entry(a.name.to_ascii_lowercase())
                .or_default()
                .extend(
                    a.values
                        .iter()
                        .map(|v| String::from_utf8_lossy(v).into_owned()),
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
    who: &'a str,
}

impl Probe<'_> {
    fn same(&mut self, what: &str, slapd: &str, pando: &str) {
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
    let mut out = String::new();
    let mut total = 0;
    let mut checks = 0usize;
    let mut whos: Vec<Option<&Identity>> = vec![None];
    whos.extend(identities.iter().map(Some));
    // Everything any identity sees on slapd: the entries and values to
    // probe with.
    let mut all = View::new();
    for who in &whos {
        let (mut l, code) = open(slapd, *who)?;
        if code != 0 {
            continue;
        }
        for s in suffixes {
            let (_, v) = search(&mut l, s, "(objectClass=*)", &["*"])?;
            for (dn, attrs) in v {
                let e = all.entry(dn).or_default();
                for (a, vals) in attrs {
                    e.entry(a).or_default().extend(vals);
                }
            }
        }
    }
    let mut filter_attrs: BTreeSet<String> = BTreeSet::new();
    for attrs in all.values() {
        filter_attrs.extend(attrs.keys().cloned());
    }
    let filter_attrs: Vec<String> = filter_attrs.into_iter().take(MAX_FILTER_ATTRS).collect();
    for who in &whos {
        let name = who.map(|i| i.dn.as_str()).unwrap_or("anonymous");
        let mut p = Probe {
            out: String::new(),
            differences: 0,
            who: name,
        };
        let (mut ls, bs) = open(slapd, *who)?;
        let (mut lp, bp) = open(pando, *who)?;
        checks += 1;
        p.same("bind", &class(bs), &class(bp));
        // Reads: entries and values returned.
        for s in suffixes {
            let (cs, vs) = search(&mut ls, s, "(objectClass=*)", &["*"])?;
            let (cp, vp) = search(&mut lp, s, "(objectClass=*)", &["*"])?;
            checks += 1;
            p.same(&format!("search of {s}"), &class(cs), &class(cp));
            for dn in vs.keys().chain(vp.keys()).collect::<BTreeSet<_>>() {
                checks += 1;
                match (vs.get(dn), vp.get(dn)) {
                    (Some(a), Some(b)) => {
                        for at in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
                            let show = |v: Option<&BTreeSet<String>>| match v {
                                None => "not returned".to_string(),
                                Some(v) if at == "userpassword" => format!("{} value(s)", v.len()),
                                Some(v) => format!("{:?}", v),
                            };
                            p.same(
                                &format!("read {at} of {dn}"),
                                &show(a.get(at)),
                                &show(b.get(at)),
                            );
                        }
                    }
                    (a, b) => p.same(
                        &format!("read {dn}"),
                        if a.is_some() {
                            "returned"
                        } else {
                            "not returned"
                        },
                        if b.is_some() {
                            "returned"
                        } else {
                            "not returned"
                        },
                    ),
                }
            }
            // Searches: which entries each attribute finds in a filter.
            for at in &filter_attrs {
                let f = format!("({at}=*)");
                let (cs, vs) = search(&mut ls, s, &f, &["1.1"])?;
                let (cp, vp) = search(&mut lp, s, &f, &["1.1"])?;
                checks += 1;
                let names = |c: u32, v: &View| format!("{} ({} entries)", class(c), v.len());
                if vs.keys().ne(vp.keys()) || class(cs) != class(cp) {
                    p.same(
                        &format!("search {f} under {s}"),
                        &names(cs, &vs),
                        &names(cp, &vp),
                    );
                }
            }
        }
        // Compares and no-op writes on each entry.
        for (dn, attrs) in all.iter().take(max_entries) {
            for (at, vals) in attrs.iter().take(MAX_ATTRS_PER_ENTRY) {
                let Some(v) = vals.iter().next() else {
                    continue;
                };
                let cmp = |l: &mut Ldap| -> Result<u32, String> {
                    l.request(
                        ProtocolOp::CompareRequest(CompareRequest {
                            dn: dn.clone(),
                            ava: Ava {
                                attr: at.clone(),
                                value: v.as_bytes().to_vec(),
                            },
                        }),
                        Vec::new(),
                    )
                    .map(|r| r.0)
                };
                checks += 1;
                let (a, b) = (cmp(&mut ls)?, cmp(&mut lp)?);
                p.same(&format!("compare {at} of {dn}"), &class(a), &class(b));
                if at == "objectclass" {
                    continue;
                }
                let modify = |l: &mut Ldap| -> Result<u32, String> {
                    l.request(
                        ProtocolOp::ModifyRequest(ModifyRequest {
                            dn: dn.clone(),
                            changes: vec![Change {
                                op: ModOp::Replace,
                                attr: PartialAttribute {
                                    name: at.clone(),
                                    values: vals.iter().map(|v| v.as_bytes().to_vec()).collect(),
                                },
                            }],
                        }),
                        no_op(),
                    )
                    .map(|r| r.0)
                };
                checks += 1;
                let (a, b) = (modify(&mut ls)?, modify(&mut lp)?);
                p.same(
                    &format!("modify (no-op) {at} of {dn}"),
                    &class(a),
                    &class(b),
                );
            }
            let add = |l: &mut Ldap| -> Result<u32, String> {
                l.request(
                    ProtocolOp::AddRequest(AddRequest {
                        dn: format!("cn=pando-migrate-probe,{dn}"),
                        attrs: vec![
                            PartialAttribute {
                                name: "objectClass".into(),
                                values: vec![b"organizationalRole".to_vec()],
                            },
                            PartialAttribute {
                                name: "cn".into(),
                                values: vec![b"pando-migrate-probe".to_vec()],
                            },
                        ],
                    }),
                    no_op(),
                )
                .map(|r| r.0)
            };
            checks += 1;
            let (a, b) = (add(&mut ls)?, add(&mut lp)?);
            p.same(&format!("add (no-op) below {dn}"), &class(a), &class(b));
            let del = |l: &mut Ldap| -> Result<u32, String> {
                l.request(ProtocolOp::DelRequest(dn.clone()), no_op())
                    .map(|r| r.0)
            };
            checks += 1;
            let (a, b) = (del(&mut ls)?, del(&mut lp)?);
            p.same(&format!("delete (no-op) {dn}"), &class(a), &class(b));
        }
        let _ = writeln!(
            out,
            "as {name}: {}",
            if p.differences == 0 {
                "no difference".to_string()
            } else {
                format!("{} difference(s)", p.differences)
            }
        );
        out.push_str(&p.out);
        total += p.differences;
    }
    let _ = writeln!(
        out,
        "{checks} checks as {} identities over {} entries: {total} difference(s)",
        whos.len(),
        all.len().min(max_entries)
    );
    Ok(Found {
        text: out,
        differences: total,
    })
}

fn no_op() -> Vec<Control> {
    vec![Control {
        oid: NO_OP.into(),
        critical: true,
        value: None,
    }]
}
