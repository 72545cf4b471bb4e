//! The retro change log (`type = "retrochangelog"`): the change log
//! (`pando_store`'s, which every committed write feeds in its own
//! transaction) shown below `cn=changelog` as draft-good-ldap-changelog,
//! DSEE and 389-DS show theirs: one `changeLogEntry` per changed entry,
//! named `changenumber=N,cn=changelog`, numbered in the order this server
//! committed them, with `firstChangeNumber`/`lastChangeNumber` and
//! `changelog` in the root DSE. Sync tools (LSC and the Sun/389 family's
//! clients) read it by change number.
//!
//! Nothing here writes: the numbers are given by the store when a change
//! is logged, and the log is trimmed by the change log's own retention
//! (`replication.changelog_days`, `changelog_max_changes`). Trimming never
//! renumbers, so a reader resumes at the number after the last it read;
//! one that fell behind the trimming sees `firstChangeNumber` past it.
//!
//! Reading it is for administrators and those an access rule naming
//! `cn=changelog` lets read (as cn=accesslog): it shows every value
//! written, password hashes included, unless `exclude_attributes` hides
//! them.

use std::collections::HashSet;

use pando_model::{Attribute, Dn, Entry, Schema, Ternary};
use pando_proto::{Filter, Scope};
use pando_store::{LoggedChange, LoggedKind, ModOp};

use pando_access::Identity;
use pando_config::overlay::RetroChangelogConfig;
use pando_ops::state::Server;

/// The tree's root, normalised (and as shown).
pub const SUFFIX: &str = "cn=changelog";

pub struct RetroChangelog {
    /// OIDs of the attributes left out of `changes`.
    exclude: HashSet<String>,
}

impl RetroChangelog {
    pub fn new(cfg: &RetroChangelogConfig, schema: &Schema) -> RetroChangelog {
        RetroChangelog {
            exclude: cfg
                .exclude_attributes
                .iter()
                .filter_map(|a| schema.attribute(a).map(|t| t.oid.clone()))
                .collect(),
        }
    }

    fn shows(&self, schema: &Schema, desc: &str) -> bool {
        let base = pando_model::desc::base(desc);
        schema
            .attribute(base)
            .is_none_or(|t| !self.exclude.contains(&t.oid))
    }
}

/// Whether `who` may read cn=changelog: administrators, and those an
/// access rule naming cn=changelog lets read (rules covering every entry
/// do not open it).
pub fn may_read(server: &Server, who: &Identity) -> bool {
    pando_ops::config_tree::may_see(who)
        || pando_access::acl::Access::new(&server.acl, who)
            .named_allows(SUFFIX, pando_access::acl::READ)
}

fn attr(name: &str, value: impl Into<Vec<u8>>) -> Attribute {
    Attribute {
        desc: name.into(),
        values: vec![value.into()],
    }
}

/// The root DSE's attributes naming the log and its range (0 and 0 when
/// it is empty, as 389-DS shows an empty log), when the overlay is on.
pub fn root_dse_attrs(server: &Server) -> Vec<Attribute> {
    let range = server
        .rt
        .store
        .read()
        .ok()
        .and_then(|r| r.view().change_number_range().ok().flatten());
    let (first, last) = range.unwrap_or((0, 0));
    vec![
        attr("changelog", SUFFIX),
        attr("firstChangeNumber", first.to_string()),
        attr("lastChangeNumber", last.to_string()),
    ]
}

/// The tree's root.
fn container() -> Entry {
    let mut e = Entry::new(Dn::parse(SUFFIX).unwrap_or(Dn { rdns: Vec::new() }));
    e.add_values(
        "objectClass",
        vec![b"top".to_vec(), b"applicationProcess".to_vec()],
    );
    e.add_values("cn", vec![b"changelog".to_vec()]);
    e
}

/// `changes` of an add (the attributes, one LDIF line per value) or a
/// modify (LDIF modifications, each ended by `-`).
fn changes_text(
    log: &RetroChangelog,
    schema: &Schema,
    kind: LoggedKind,
    shape: &super::change_shape::Shape<'_>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    for m in shape.mods.iter().filter(|m| log.shows(schema, &m.desc)) {
        let desc = m.desc.as_bytes();
        if kind == LoggedKind::Add {
            for v in &m.values {
                pando_ldif::append_line(&mut out, &mut scratch, desc, v, None);
            }
            continue;
        }
        let op: &[u8] = match m.op {
            ModOp::Add => b"add",
            ModOp::Delete => b"delete",
            ModOp::Replace => b"replace",
        };
        pando_ldif::append_line(&mut out, &mut scratch, op, desc, None);
        for v in &m.values {
            pando_ldif::append_line(&mut out, &mut scratch, desc, v, None);
        }
        out.extend_from_slice(b"-\n");
    }
    out
}

/// `YYYYmmddHHMMSSZ` from a CSN's time.
fn change_time(csn: &str) -> String {
    format!("{}Z", csn.get(..14).unwrap_or("19700101000000"))
}

/// The entry showing change `n`.
fn change_entry(log: &RetroChangelog, schema: &Schema, n: u64, c: &LoggedChange) -> Entry {
    let dn = format!("changenumber={n},{SUFFIX}");
    let mut e = Entry::new(Dn::parse(&dn).unwrap_or(Dn { rdns: Vec::new() }));
    let shape = super::change_shape::of(c);
    let kind = match c.kind {
        LoggedKind::Add => "add",
        LoggedKind::Delete => "delete",
        LoggedKind::Modify => "modify",
        LoggedKind::ModDn => "modrdn",
    };
    let mut attrs = vec![
        Attribute {
            desc: "objectClass".into(),
            values: vec![b"top".to_vec(), b"changeLogEntry".to_vec()],
        },
        attr("changeNumber", n.to_string()),
        attr("targetDN", shape.target),
        attr("changeType", kind),
        attr("changeTime", change_time(&c.csn)),
        attr("targetUniqueId", c.uuid.as_str()),
    ];
    if !c.by.is_empty() {
        attrs.push(attr("changeInitiatorsName", c.by.as_str()));
    }
    let changes = changes_text(log, schema, c.kind, &shape);
    if !changes.is_empty() {
        attrs.push(attr("changes", changes));
    }
    if let Some(r) = &shape.rename {
        attrs.push(attr("newRDN", r.new_rdn.as_str()));
        attrs.push(attr(
            "deleteOldRDN",
            if r.delete_old_rdn { "TRUE" } else { "FALSE" },
        ));
        if let Some(sup) = &r.new_superior {
            attrs.push(attr("newSuperior", sup.as_str()));
        }
    }
    e.attrs = attrs;
    e
}

/// The change number range a filter's top sets (`changeNumber>=`,
/// `changeNumber<=`, `changeNumber=`, alone or in an AND): where reading
/// starts and past which it stops. The filter still decides what matches.
fn bounds(f: &Filter) -> (u64, u64) {
    let num = |attr: &str, v: &[u8]| -> Option<u64> {
        attr.eq_ignore_ascii_case("changeNumber")
            .then(|| std::str::from_utf8(v).ok()?.trim().parse().ok())
            .flatten()
    };
    match f {
        Filter::GreaterOrEqual(a) => (num(&a.attr, &a.value).unwrap_or(0), u64::MAX),
        Filter::LessOrEqual(a) => (0, num(&a.attr, &a.value).unwrap_or(u64::MAX)),
        Filter::Equality(a) => match num(&a.attr, &a.value) {
            Some(n) => (n, n),
            None => (0, u64::MAX),
        },
        Filter::And(items) => items
            .iter()
            .map(bounds)
            .fold((0, u64::MAX), |acc, b| (acc.0.max(b.0), acc.1.min(b.1))),
        _ => (0, u64::MAX),
    }
}

/// The entries of `cn=changelog` a search with `base_norm`, `scope` and
/// `filter` may return, in change number order: the root and the changes
/// matching the filter, at most `limit` changes (0: no limit), reading at
/// most `scan`.
pub fn entries(
    log: &RetroChangelog,
    server: &Server,
    base_norm: &str,
    scope: Scope,
    filter: &Filter,
    limit: u64,
    scan: u64,
) -> Vec<(String, Entry)> {
    let schema: &Schema = &server.schema;
    let mut out = vec![(SUFFIX.to_string(), container())];
    if scope == Scope::Base && base_norm == SUFFIX {
        return out;
    }
    // A base naming one change reads that one.
    let only = base_norm
        .strip_suffix(&format!(",{SUFFIX}"))
        .and_then(|r| r.strip_prefix("changenumber="))
        .map(|n| n.parse::<u64>().unwrap_or(u64::MAX));
    let (from, until) = match only {
        Some(n) => (n, n),
        None => bounds(filter),
    };
    let Ok(rtxn) = server.rt.store.read() else {
        return out;
    };
    let view = rtxn.view();
    let Ok(changes) = view.changes_from_number(from) else {
        return out;
    };
    let compiled = schema.compile_filter(filter);
    let (mut found, mut read) = (0u64, 0u64);
    for item in changes {
        let Ok((n, c)) = item else { break };
        if n > until || (scan > 0 && read >= scan) {
            break;
        }
        read += 1;
        let e = change_entry(log, schema, n, &c);
        if only.is_some() || compiled.matches(schema, &e) == Ternary::True {
            out.push((format!("changenumber={n},{SUFFIX}"), e));
            found += 1;
            if limit > 0 && found > limit {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::Ava;
    use pando_store::LoggedMod;

    fn change(kind: LoggedKind, dn: &str, old: Option<&str>, mods: Vec<LoggedMod>) -> LoggedChange {
        LoggedChange {
            csn: "20261128072501.000001Z#000000#001#000000".into(),
            seq: 0,
            kind,
            uuid: "u-1".into(),
            dn: dn.into(),
            old_dn: old.map(str::to_string),
            mods,
            by: "cn=admin,dc=example,dc=com".into(),
        }
    }

    fn m(op: ModOp, desc: &str, values: &[&str]) -> LoggedMod {
        LoggedMod {
            op,
            desc: desc.into(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    fn get(e: &Entry, name: &str) -> Option<String> {
        e.attrs
            .iter()
            .find(|a| a.desc.eq_ignore_ascii_case(name))
            .map(|a| String::from_utf8_lossy(&a.values[0]).into_owned())
    }

    #[test]
    fn entries_show_each_kind_as_the_draft_does() {
        let schema = Schema::standard();
        let log = RetroChangelog::new(
            &RetroChangelogConfig {
                exclude_attributes: vec!["userPassword".into()],
            },
            &schema,
        );
        let add = change(
            LoggedKind::Add,
            "uid=a,dc=example,dc=com",
            None,
            vec![
                m(ModOp::Add, "uid", &["a"]),
                m(ModOp::Add, "userPassword", &["{SSHA}x"]),
                m(ModOp::Add, "description", &[" leading space"]),
            ],
        );
        let e = change_entry(&log, &schema, 7, &add);
        assert_eq!(e.dn.to_string(), "changenumber=7,cn=changelog");
        assert_eq!(get(&e, "changeType").as_deref(), Some("add"));
        assert_eq!(get(&e, "changeTime").as_deref(), Some("20261128072501Z"));
        assert_eq!(
            get(&e, "changes").as_deref(),
            Some("uid: a\ndescription:: IGxlYWRpbmcgc3BhY2U=\n"),
            "LDIF lines, base64 where LDIF needs it, excluded attributes left out"
        );
        let modify = change(
            LoggedKind::Modify,
            "uid=a,dc=example,dc=com",
            None,
            vec![
                m(ModOp::Replace, "sn", &["B"]),
                m(ModOp::Delete, "mail", &[]),
            ],
        );
        let e = change_entry(&log, &schema, 8, &modify);
        assert_eq!(
            get(&e, "changes").as_deref(),
            Some("replace: sn\nsn: B\n-\ndelete: mail\n-\n")
        );
        let rename = change(
            LoggedKind::ModDn,
            "uid=b,ou=new,dc=example,dc=com",
            Some("uid=a,dc=example,dc=com"),
            vec![
                m(ModOp::Add, "uid", &["b"]),
                m(ModOp::Delete, "uid", &["a"]),
            ],
        );
        let e = change_entry(&log, &schema, 9, &rename);
        assert_eq!(
            get(&e, "targetDN").as_deref(),
            Some("uid=a,dc=example,dc=com")
        );
        assert_eq!(get(&e, "newRDN").as_deref(), Some("uid=b"));
        assert_eq!(get(&e, "deleteOldRDN").as_deref(), Some("TRUE"));
        assert_eq!(
            get(&e, "newSuperior").as_deref(),
            Some("ou=new,dc=example,dc=com")
        );
        assert_eq!(get(&e, "changes"), None);
        let delete = change(
            LoggedKind::Delete,
            "uid=b,ou=new,dc=example,dc=com",
            None,
            vec![],
        );
        let e = change_entry(&log, &schema, 10, &delete);
        assert_eq!(get(&e, "changeType").as_deref(), Some("delete"));
        assert_eq!(get(&e, "changes"), None);
        assert_eq!(
            get(&e, "changeInitiatorsName").as_deref(),
            Some("cn=admin,dc=example,dc=com")
        );
    }

    #[test]
    fn a_filter_bounds_where_reading_starts_and_stops() {
        let ava = |a: &str, v: &str| Ava {
            attr: a.into(),
            value: v.as_bytes().to_vec(),
        };
        let f = Filter::And(vec![
            Filter::GreaterOrEqual(ava("changeNumber", "100")),
            Filter::LessOrEqual(ava("changenumber", "200")),
            Filter::Present("objectClass".into()),
        ]);
        assert_eq!(bounds(&f), (100, 200));
        assert_eq!(bounds(&Filter::Equality(ava("changeNumber", "5"))), (5, 5));
        assert_eq!(
            bounds(&Filter::Present("changeNumber".into())),
            (0, u64::MAX)
        );
        assert_eq!(
            bounds(&Filter::GreaterOrEqual(ava("changeNumber", "x"))),
            (0, u64::MAX)
        );
    }
}
