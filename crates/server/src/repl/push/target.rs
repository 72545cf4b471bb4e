//! The target's side of a push: each change as ordinary LDAP writes, the
//! answers sorted into done, refused for its content (logged, counted,
//! passed) and cannot-take-it-now (the session ends and is retried), and
//! a subtree of the target made equal to this server's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pando_client::{Client, Endpoint};
use pando_model::{Attribute, Dn, Schema};
use pando_proto::{
    Change, Control, DerefAliases, LdapResult, ModOp, ModifyDnRequest, ModifyRequest,
    PartialAttribute, ProtocolOp, ResultCode, Scope, SearchRequest,
};
use pando_store::LoggedMod;

use super::{Failed, Pusher};
use crate::state::Server;

/// RFC-less but widely supported (Active Directory, OpenLDAP): a modify
/// adding a value already there or deleting one already gone succeeds.
const PERMISSIVE_MODIFY: &str = "1.2.840.113556.1.4.1413";

/// Entries read from the target per page.
const PAGE: i32 = 500;

/// What the target is asked to do for one logged change.
pub(crate) enum Item {
    Add {
        dn: String,
        attrs: Vec<PartialAttribute>,
    },
    Delete {
        dn: String,
    },
    Modify {
        dn: String,
        mods: Vec<Change>,
    },
    Rename {
        old: String,
        dn: String,
        request: ModifyDnRequest,
        mods: Vec<Change>,
    },
    /// Make the target's subtree at `dn` equal to `entries` (parents
    /// first; none: the subtree goes).
    Subtree {
        dn: String,
        entries: Vec<(String, Vec<PartialAttribute>)>,
    },
}

/// Which attributes are pushed: user attributes, less the push's
/// `exattrs`.
pub(crate) struct Pushed<'a> {
    schema: &'a Schema,
    exattrs: &'a [String],
}

impl<'a> Pushed<'a> {
    pub(crate) fn new(schema: &'a Schema, exattrs: &'a [String]) -> Pushed<'a> {
        Pushed { schema, exattrs }
    }

    fn keeps(&self, desc: &str) -> bool {
        let base = pando_model::desc::base(desc);
        if self.exattrs.iter().any(|x| x.eq_ignore_ascii_case(base)) {
            return false;
        }
        match self.schema.attribute(base) {
            Some(at) => !at.is_operational() && !at.no_user_modification,
            None => true,
        }
    }

    /// An attribute description as compared: the type's first name (an
    /// alias and the OID name the same type) and the options, lowercase.
    fn key(&self, desc: &str) -> String {
        let base = pando_model::desc::base(desc);
        let name = self
            .schema
            .attribute(base)
            .and_then(|at| at.names.first())
            .map_or(base, String::as_str);
        format!("{name}{}", &desc[base.len()..]).to_ascii_lowercase()
    }

    /// An add's attributes, from its record.
    pub(crate) fn added(&self, mods: &[LoggedMod]) -> Vec<PartialAttribute> {
        mods.iter()
            .filter(|m| self.keeps(&m.desc) && !m.values.is_empty())
            .map(|m| PartialAttribute {
                name: m.desc.clone(),
                values: m.values.clone(),
            })
            .collect()
    }

    /// A modify's modifications, from its record.
    pub(crate) fn mods(&self, mods: &[LoggedMod]) -> Vec<Change> {
        mods.iter()
            .filter(|m| self.keeps(&m.desc))
            .map(|m| Change {
                op: match m.op {
                    pando_store::ModOp::Add => ModOp::Add,
                    pando_store::ModOp::Delete => ModOp::Delete,
                    pando_store::ModOp::Replace => ModOp::Replace,
                },
                attr: PartialAttribute {
                    name: m.desc.clone(),
                    values: m.values.clone(),
                },
            })
            .collect()
    }

    /// A stored entry's attributes.
    pub(crate) fn entry(&self, attrs: &[Attribute]) -> Vec<PartialAttribute> {
        attrs
            .iter()
            .filter(|a| self.keeps(&a.desc) && !a.values.is_empty())
            .map(|a| PartialAttribute {
                name: a.desc.clone(),
                values: a.values.clone(),
            })
            .collect()
    }

    /// The modifications that make `there` (the target's entry) hold
    /// `here` (this server's): each attribute whose values differ
    /// replaced, each the target has beyond them removed.
    fn differences(&self, here: &[PartialAttribute], there: &[PartialAttribute]) -> Vec<Change> {
        let set = |attrs: &[PartialAttribute]| -> BTreeMap<String, BTreeSet<Vec<u8>>> {
            attrs
                .iter()
                .filter(|a| self.keeps(&a.name))
                .map(|a| (self.key(&a.name), a.values.iter().cloned().collect()))
                .collect()
        };
        let (h, t) = (set(here), set(there));
        let replace = |name: &str, values: Vec<Vec<u8>>| Change {
            op: ModOp::Replace,
            attr: PartialAttribute {
                name: name.to_string(),
                values,
            },
        };
        let mut out: Vec<Change> = h
            .iter()
            .filter(|(k, v)| t.get(*k) != Some(v))
            .map(|(k, v)| replace(k, v.iter().cloned().collect()))
            .collect();
        out.extend(
            t.keys()
                .filter(|k| !h.contains_key(*k))
                .map(|k| replace(k, Vec::new())),
        );
        out
    }
}

/// The target's request for a logged rename of `old` to `dn`: its new
/// RDN and superior, whether the old RDN's values went (they are gone
/// from the entry's record), and the other modifications it logged.
pub(crate) fn rename(old: &str, dn: &str, mods: &[LoggedMod], pushed: &Pushed<'_>) -> Item {
    let (o, n) = (Dn::parse(old).ok(), Dn::parse(dn).ok());
    let norm = |d: Option<Dn>| d.and_then(|d| pushed.schema.normalize_dn(&d).ok());
    let new_parent = n.as_ref().and_then(Dn::parent);
    let moved = norm(o.as_ref().and_then(Dn::parent)) != norm(new_parent.clone());
    let gone = |attr: &str, value: &[u8]| {
        mods.iter().any(|m| {
            let same_attr = pushed.key(&m.desc) == pushed.key(attr);
            let has = m.values.iter().any(|v| v.eq_ignore_ascii_case(value));
            same_attr
                && match m.op {
                    pando_store::ModOp::Delete => m.values.is_empty() || has,
                    pando_store::ModOp::Replace => !has,
                    pando_store::ModOp::Add => false,
                }
        })
    };
    let delete_old_rdn = o
        .as_ref()
        .and_then(Dn::rdn)
        .is_some_and(|r| r.avas.iter().any(|a| gone(&a.attr, &a.value)));
    Item::Rename {
        old: old.to_string(),
        dn: dn.to_string(),
        request: ModifyDnRequest {
            dn: old.to_string(),
            new_rdn: n
                .as_ref()
                .and_then(Dn::rdn)
                .map(|r| r.to_string())
                .unwrap_or_default(),
            delete_old_rdn,
            new_superior: match moved {
                true => new_parent.map(|p| p.to_string()),
                false => None,
            },
        },
        mods: pushed.mods(mods),
    }
}

/// How the target answered.
enum Answer {
    Done,
    /// Refused for the change's content (schema, naming, the entry's
    /// state there).
    Refused(LdapResult),
}

/// Result codes that say the target cannot take writes now, or not from
/// this identity: the session ends and is retried from the same place.
fn not_now(code: ResultCode) -> bool {
    matches!(
        code.0,
        1 | 2 | 3 | 8 | 10 | 11 | 13 | 48 | 49 | 50 | 51 | 52 | 53 | 54 | 80
    )
}

/// A connection to a push's target.
pub(crate) struct Target<'a> {
    client: Client,
    server: &'a Arc<Server>,
    p: &'a Pusher,
}

impl<'a> Target<'a> {
    pub(crate) async fn connect(
        server: &'a Arc<Server>,
        p: &'a Pusher,
    ) -> Result<Target<'a>, Failed> {
        let endpoint = Endpoint::from(p.cfg.link());
        let mut client = Client::connect(&endpoint, server.cfg.config.limits.max_pdu_bytes).await?;
        client.bind(&endpoint).await?;
        Ok(Target { client, server, p })
    }

    fn pushed(&self) -> Pushed<'_> {
        Pushed::new(&self.server.schema, &self.p.cfg.exattrs)
    }

    /// Send `op`; its answer sorted.
    async fn ask(
        &mut self,
        what: &str,
        dn: &str,
        op: ProtocolOp,
        controls: Vec<Control>,
    ) -> Result<Answer, Failed> {
        let r = self.client.request(op, controls).await?;
        match r.code {
            ResultCode::SUCCESS => Ok(Answer::Done),
            c if not_now(c) => Err(Failed(format!(
                "{} answered the {what} of {dn} with {} ({}) {}",
                self.p.cfg.target,
                c.0,
                c.name(),
                r.message
            ))),
            _ => Ok(Answer::Refused(r)),
        }
    }

    /// A change the target refused for its content: logged, counted and
    /// passed.
    fn refused(&self, what: &str, dn: &str, r: &LdapResult) -> Result<(), Failed> {
        tracing::warn!(
            rid = self.p.rid,
            target = %self.p.cfg.target,
            "the target refused the {what} of {dn}: {} ({}) {}; passed",
            r.code.0,
            r.code.name(),
            r.message
        );
        self.p.set(|s| s.refused += 1);
        Ok(())
    }

    /// Push one change. One that meets a state it does not expect (an
    /// entry already there, or missing) makes the entries it names equal
    /// to this server's, as they are now ([`Target::repair`]): pushed
    /// again after a restart, a change meets the target as later changes
    /// left it, and those changes follow.
    pub(crate) async fn push(&mut self, item: Item) -> Result<(), Failed> {
        match item {
            Item::Add { dn, attrs } => {
                let op = ProtocolOp::AddRequest(pando_proto::AddRequest {
                    dn: dn.clone(),
                    attrs,
                });
                match self.ask("add", &dn, op, Vec::new()).await? {
                    Answer::Done => Ok(()),
                    Answer::Refused(r) if r.code == ResultCode::ENTRY_ALREADY_EXISTS => {
                        self.repair(&dn, &r).await
                    }
                    Answer::Refused(r) => self.refused("add", &dn, &r),
                }
            }
            Item::Delete { dn } => {
                let op = ProtocolOp::DelRequest(dn.clone());
                match self.ask("delete", &dn, op, Vec::new()).await? {
                    Answer::Done => Ok(()),
                    Answer::Refused(r) if r.code == ResultCode::NO_SUCH_OBJECT => Ok(()),
                    Answer::Refused(r) if r.code == ResultCode::NOT_ALLOWED_ON_NON_LEAF => {
                        self.repair(&dn, &r).await
                    }
                    Answer::Refused(r) => self.refused("delete", &dn, &r),
                }
            }
            Item::Modify { dn, mods } => self.modify(&dn, mods).await,
            Item::Rename {
                old,
                dn,
                request,
                mods,
            } => {
                let op = ProtocolOp::ModifyDnRequest(request);
                match self.ask("rename", &old, op, Vec::new()).await? {
                    Answer::Done => self.modify(&dn, mods).await,
                    Answer::Refused(r)
                        if matches!(
                            r.code,
                            ResultCode::NO_SUCH_OBJECT | ResultCode::ENTRY_ALREADY_EXISTS
                        ) =>
                    {
                        self.repair(&old, &r).await?;
                        self.repair(&dn, &r).await
                    }
                    Answer::Refused(r) => self.refused("rename", &old, &r),
                }
            }
            Item::Subtree { dn, entries } => self.converge(&dn, entries).await,
        }
    }

    /// A logged modify, permissive: values already there (or already
    /// gone) are no error. A target without the permissive control is
    /// given each value alone, passing those it already has.
    async fn modify(&mut self, dn: &str, mods: Vec<Change>) -> Result<(), Failed> {
        if mods.is_empty() {
            return Ok(());
        }
        let permissive = Control {
            oid: PERMISSIVE_MODIFY.into(),
            critical: false,
            value: None,
        };
        let op = ProtocolOp::ModifyRequest(ModifyRequest {
            dn: dn.to_string(),
            changes: mods.clone(),
        });
        let r = match self.ask("modify", dn, op, vec![permissive]).await? {
            Answer::Done => return Ok(()),
            Answer::Refused(r) => r,
        };
        match r.code {
            ResultCode::NO_SUCH_ATTRIBUTE | ResultCode::ATTRIBUTE_OR_VALUE_EXISTS => {
                self.modify_value_by_value(dn, mods).await
            }
            ResultCode::NO_SUCH_OBJECT => self.repair(dn, &r).await,
            _ => self.refused("modify", dn, &r),
        }
    }

    async fn modify_value_by_value(&mut self, dn: &str, mods: Vec<Change>) -> Result<(), Failed> {
        for m in mods {
            let singles: Vec<Change> = match (m.op, m.attr.values.len()) {
                (ModOp::Add | ModOp::Delete, n) if n > 1 => m
                    .attr
                    .values
                    .iter()
                    .map(|v| Change {
                        op: m.op,
                        attr: PartialAttribute {
                            name: m.attr.name.clone(),
                            values: vec![v.clone()],
                        },
                    })
                    .collect(),
                _ => vec![m],
            };
            for one in singles {
                let op = ProtocolOp::ModifyRequest(ModifyRequest {
                    dn: dn.to_string(),
                    changes: vec![one],
                });
                match self.ask("modify", dn, op, Vec::new()).await? {
                    Answer::Refused(r)
                        if !matches!(
                            r.code,
                            ResultCode::NO_SUCH_ATTRIBUTE | ResultCode::ATTRIBUTE_OR_VALUE_EXISTS
                        ) =>
                    {
                        return self.refused("modify", dn, &r);
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The target's subtree at `dn` made equal to this server's as it
    /// is now (`r`: the answer that showed it was not what the change
    /// expected).
    async fn repair(&mut self, dn: &str, r: &LdapResult) -> Result<(), Failed> {
        let (s, exattrs, base) = (
            self.server.clone(),
            self.p.cfg.exattrs.clone(),
            dn.to_string(),
        );
        let here = tokio::task::spawn_blocking(move || -> Result<_, Failed> {
            let rtxn = s.rt.store.read()?;
            let pushed = Pushed::new(&s.schema, &exattrs);
            super::local_subtree(&rtxn.view(), &base, &pushed)
        })
        .await
        .map_err(|_| Failed("reading this server's entry failed".into()))??;
        tracing::info!(
            rid = self.p.rid,
            target = %self.p.cfg.target,
            "the target's {dn} is not as the change expects ({}); made as this server holds it now ({} entries)",
            r.code.name(),
            here.len()
        );
        self.converge(dn, here).await
    }

    async fn plain_modify(&mut self, dn: &str, mods: Vec<Change>) -> Result<(), Failed> {
        if mods.is_empty() {
            return Ok(());
        }
        let op = ProtocolOp::ModifyRequest(ModifyRequest {
            dn: dn.to_string(),
            changes: mods,
        });
        match self.ask("modify", dn, op, Vec::new()).await? {
            Answer::Done => Ok(()),
            Answer::Refused(r) => self.refused("modify", dn, &r),
        }
    }

    /// The target's entries at `dn` (its user attributes); none when it
    /// has no such entry.
    async fn read(
        &mut self,
        dn: &str,
        scope: Scope,
    ) -> Result<Vec<(String, Vec<PartialAttribute>)>, Failed> {
        let req = SearchRequest {
            base: dn.to_string(),
            scope,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter: pando_proto::Filter::Present("objectClass".into()),
            attrs: vec!["*".into()],
        };
        let (entries, done) = self.client.search_all(req, PAGE).await?;
        match done.code {
            ResultCode::SUCCESS => Ok(entries.into_iter().map(|e| (e.dn, e.attrs)).collect()),
            ResultCode::NO_SUCH_OBJECT => Ok(Vec::new()),
            c => Err(Failed(format!(
                "{} answered the search of {dn} with {} ({}) {}",
                self.p.cfg.target,
                c.0,
                c.name(),
                done.message
            ))),
        }
    }

    /// Make the target's subtree at `dn` hold `entries` (parents first):
    /// what it lacks added, what differs replaced, what it has beyond
    /// them deleted (children first).
    pub(crate) async fn converge(
        &mut self,
        dn: &str,
        entries: Vec<(String, Vec<PartialAttribute>)>,
    ) -> Result<(), Failed> {
        let schema = self.server.schema.clone();
        let norm = |d: &str| {
            Dn::parse(d)
                .ok()
                .and_then(|d| schema.normalize_dn(&d).ok())
                .unwrap_or_else(|| d.to_ascii_lowercase())
        };
        let mut there: BTreeMap<String, (String, Vec<PartialAttribute>)> = self
            .read(dn, Scope::Sub)
            .await?
            .into_iter()
            .map(|(d, a)| (norm(&d), (d, a)))
            .collect();
        for (edn, attrs) in entries {
            match there.remove(&norm(&edn)) {
                Some((tdn, t)) => {
                    let mods = self.pushed().differences(&attrs, &t);
                    self.plain_modify(&tdn, mods).await?;
                }
                None => {
                    let op = ProtocolOp::AddRequest(pando_proto::AddRequest {
                        dn: edn.clone(),
                        attrs,
                    });
                    if let Answer::Refused(r) = self.ask("add", &edn, op, Vec::new()).await? {
                        self.refused("add", &edn, &r)?;
                    }
                }
            }
        }
        let mut extra: Vec<String> = there.into_values().map(|(d, _)| d).collect();
        extra.sort_by_key(|d| std::cmp::Reverse(d.matches(',').count()));
        for d in extra {
            let op = ProtocolOp::DelRequest(d.clone());
            match self.ask("delete", &d, op, Vec::new()).await? {
                Answer::Done => {}
                Answer::Refused(r) if r.code == ResultCode::NO_SUCH_OBJECT => {}
                Answer::Refused(r) => self.refused("delete", &d, &r)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_store::ModOp as Logged;

    fn logged(op: Logged, desc: &str, values: &[&str]) -> LoggedMod {
        LoggedMod {
            op,
            desc: desc.into(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    fn attr(name: &str, values: &[&str]) -> PartialAttribute {
        PartialAttribute {
            name: name.into(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn operational_and_excluded_attributes_are_never_pushed() {
        let schema = Schema::standard();
        let ex = vec!["Description".to_string()];
        let pushed = Pushed::new(&schema, &ex);
        let add = [
            logged(Logged::Add, "objectClass", &["person"]),
            logged(Logged::Add, "cn", &["a"]),
            logged(Logged::Add, "description", &["x"]),
            logged(Logged::Add, "entryUUID", &["u"]),
            logged(Logged::Add, "entryCSN", &["c"]),
            logged(Logged::Add, "createTimestamp", &["t"]),
            logged(Logged::Add, "structuralObjectClass", &["person"]),
            logged(Logged::Add, "cn;lang-de", &["b"]),
        ];
        let names: Vec<String> = pushed.added(&add).into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["objectClass", "cn", "cn;lang-de"]);
        let mods = pushed.mods(&[
            logged(Logged::Replace, "modifyTimestamp", &["t"]),
            logged(Logged::Delete, "sn", &[]),
        ]);
        assert_eq!(mods.len(), 1);
        assert_eq!(
            (mods[0].op, mods[0].attr.name.as_str()),
            (ModOp::Delete, "sn")
        );
    }

    #[test]
    fn differences_replace_what_differs_and_remove_what_the_target_has_beyond() {
        let schema = Schema::standard();
        let pushed = Pushed::new(&schema, &[]);
        let here = [
            attr("objectClass", &["top", "person"]),
            attr("commonName", &["a"]),
            attr("sn", &["S"]),
            attr("telephoneNumber", &["1", "2"]),
        ];
        let there = [
            attr("objectClass", &["person", "top"]),
            attr("cn", &["a"]),
            attr("sn", &["T"]),
            attr("telephoneNumber", &["2", "1"]),
            attr("description", &["only there"]),
        ];
        let d = pushed.differences(&here, &there);
        let shown: Vec<(ModOp, &str, usize)> = d
            .iter()
            .map(|c| (c.op, c.attr.name.as_str(), c.attr.values.len()))
            .collect();
        assert_eq!(
            shown,
            [
                (ModOp::Replace, "sn", 1),
                (ModOp::Replace, "description", 0)
            ]
        );
        assert!(pushed.differences(&here, &here).is_empty());
    }

    fn request(item: Item) -> (ModifyDnRequest, usize) {
        match item {
            Item::Rename { request, mods, .. } => (request, mods.len()),
            _ => panic!("not a rename"),
        }
    }

    #[test]
    fn a_logged_rename_becomes_the_request_that_made_it() {
        let schema = Schema::standard();
        let pushed = Pushed::new(&schema, &[]);
        // The old RDN's value gone, in place.
        let mods = [
            logged(Logged::Delete, "uid", &["a"]),
            logged(Logged::Add, "uid", &["b"]),
            logged(Logged::Replace, "modifyTimestamp", &["t"]),
        ];
        let (r, n) = request(rename("uid=a,ou=P,dc=x", "uid=b,ou=P,dc=x", &mods, &pushed));
        assert_eq!(r.dn, "uid=a,ou=P,dc=x");
        assert_eq!(r.new_rdn, "uid=b");
        assert!(r.delete_old_rdn && r.new_superior.is_none());
        assert_eq!(n, 2);
        // The old value kept, moved elsewhere (a superior differing only
        // in case is no move).
        let kept = [logged(Logged::Add, "uid", &["b"])];
        let (r, _) = request(rename("uid=a,ou=P,dc=x", "uid=b,ou=Q,dc=x", &kept, &pushed));
        assert!(!r.delete_old_rdn);
        assert_eq!(r.new_superior.as_deref(), Some("ou=Q,dc=x"));
        let (r, _) = request(rename("uid=a,ou=P,dc=x", "uid=a,OU=p,dc=x", &[], &pushed));
        assert!(r.new_superior.is_none());
        // A value replaced away counts as deleted; a whole delete too.
        for m in [
            logged(Logged::Replace, "UID", &["b"]),
            logged(Logged::Delete, "userid", &[]),
        ] {
            let (r, _) = request(rename("uid=A,dc=x", "uid=b,dc=x", &[m], &pushed));
            assert!(r.delete_old_rdn);
        }
    }
}
