//! memberOf: every member of a group (an entry of a configured group
//! class) lists the group's DN in its memberOf attribute. Kept in the
//! operation's own transaction across adds, deletes and renames of groups
//! and of members, and changes of member values:
//!
//! 1. A member deleted or renamed (itself or by an ancestor) leaves, or is
//!    renamed in, the groups its memberOf lists.
//! 2. Every group the operation leaves changed (including by step 1 or by
//!    refint) has its member values compared before and after: members
//!    gone lose the group's old DN, members there afterwards gain its new
//!    DN (a renamed group: all of them).
//!
//! Names are resolved as the operation leaves them (`related::resolve`),
//! so a member renamed in the same operation keeps its memberOf.

use pando_model::{Entry, Schema};
use pando_proto::ResultCode;
use pando_store::View;

use super::related::{self, after_mut};
use pando_config::overlay::MemberOfConfig;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::seams::WriteHook;
use pando_ops::write::{Change, WriteCtx};

#[derive(Debug, Clone)]
pub struct MemberOf {
    classes: Vec<String>,
    members: Vec<String>,
    memberof: String,
    dangling_error: bool,
}

/// A group on one side of the operation.
struct Group {
    norm: String,
    /// The DN as written.
    dn: String,
    /// (normalised, as written) DNs of its members.
    members: Vec<(String, String)>,
}

/// One group's membership before and after the operation (None: not a
/// group on that side).
struct GroupDiff {
    old: Option<Group>,
    new: Option<Group>,
}

impl MemberOf {
    pub fn new(cfg: &MemberOfConfig, schema: &Schema) -> MemberOf {
        let name = |a: &String| super::canonical(schema, a);
        MemberOf {
            classes: cfg.group_classes.clone(),
            members: cfg.member_attributes.iter().map(name).collect(),
            memberof: name(&cfg.memberof_attribute),
            dangling_error: cfg.dangling == "error",
        }
    }

    pub fn is_group(&self, entry: &Entry) -> bool {
        entry.values("objectClass").iter().any(|v| {
            self.classes
                .iter()
                .any(|c| c.as_bytes().eq_ignore_ascii_case(v))
        })
    }

    /// (normalised, as written) DNs of the members of `group`.
    pub fn members_of(&self, schema: &Schema, group: &Entry) -> Vec<(String, String)> {
        related::dn_values(schema, group, &self.members)
    }

    pub fn memberof_attr(&self) -> &str {
        &self.memberof
    }

    /// Step 1: members deleted or renamed leave, or are renamed in, the
    /// groups their memberOf lists.
    fn follow_members(
        &self,
        schema: &Schema,
        view: &View<'_>,
        changes: &mut Vec<Change>,
        moved: &[related::Move],
    ) -> OpResult<()> {
        let mut gone: Vec<(String, Vec<String>)> = Vec::new();
        for c in changes.iter().filter(|c| c.after.is_none()) {
            if let Some(b) = &c.before {
                let groups =
                    related::dn_values(schema, &b.entry, std::slice::from_ref(&self.memberof));
                if !groups.is_empty() {
                    gone.push((b.norm.clone(), groups.into_iter().map(|g| g.0).collect()));
                }
            }
        }
        for (member, groups) in gone {
            for g in groups {
                if let Some(i) = related::resolve(view, changes, moved, &g)? {
                    let entry = after_mut(changes, i);
                    for attr in &self.members {
                        related::remove_dn(schema, entry, attr, &member);
                    }
                }
            }
        }
        for m in moved {
            let groups = match changes
                .iter()
                .find(|c| c.before.as_ref().is_some_and(|b| b.id == m.id))
            {
                Some(c) => c.before.as_ref().map(|b| b.entry.clone()),
                None => view.entry(m.id)?,
            }
            .map(|e| related::dn_values(schema, &e, std::slice::from_ref(&self.memberof)))
            .unwrap_or_default();
            for (g, _) in groups {
                if let Some(i) = related::resolve(view, changes, moved, &g)? {
                    let entry = after_mut(changes, i);
                    for attr in &self.members {
                        related::rename_dn(
                            schema,
                            entry,
                            attr,
                            &m.old_norm,
                            &m.new_dn,
                            &m.new_norm,
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The membership changes of every group the operation touches, and of
    /// groups below a renamed entry.
    fn diffs(
        &self,
        schema: &Schema,
        view: &View<'_>,
        changes: &[Change],
        moved: &[related::Move],
    ) -> OpResult<Vec<GroupDiff>> {
        let mut out = Vec::new();
        for c in changes {
            let old = c
                .before
                .as_ref()
                .filter(|b| self.is_group(&b.entry))
                .map(|b| Group {
                    norm: b.norm.clone(),
                    dn: b.entry.dn.to_string(),
                    members: self.members_of(schema, &b.entry),
                });
            let new = c
                .after
                .as_ref()
                .filter(|a| self.is_group(a))
                .map(|a| Group {
                    norm: c.norm().to_string(),
                    dn: a.dn.to_string(),
                    members: self.members_of(schema, a),
                });
            if old.is_some() || new.is_some() {
                out.push(GroupDiff { old, new });
            }
        }
        for m in moved.iter().filter(|m| !m.in_changes) {
            if changes
                .iter()
                .any(|c| c.before.as_ref().is_some_and(|b| b.id == m.id))
            {
                continue;
            }
            let Some(entry) = view.entry(m.id)? else {
                continue;
            };
            if self.is_group(&entry) {
                let members = self.members_of(schema, &entry);
                out.push(GroupDiff {
                    old: Some(Group {
                        norm: m.old_norm.clone(),
                        dn: entry.dn.to_string(),
                        members: members.clone(),
                    }),
                    new: Some(Group {
                        norm: m.new_norm.clone(),
                        dn: m.new_dn.clone(),
                        members,
                    }),
                });
            }
        }
        Ok(out)
    }
}

impl WriteHook for MemberOf {
    fn related(&self, ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
        let schema = &*ctx.server.schema;
        let moved = related::moves(view, changes, ctx.server.cfg.config.limits.max_tree_delete)?;
        self.follow_members(schema, view, changes, &moved)?;
        let diffs = self.diffs(schema, view, changes, &moved)?;
        // Removals first: a group renamed loses its old DN everywhere
        // before its new one is added.
        for d in &diffs {
            let Some(old) = &d.old else { continue };
            let renamed = d.new.as_ref().is_none_or(|n| n.norm != old.norm);
            for (member, _) in &old.members {
                let stays = !renamed
                    && d.new
                        .as_ref()
                        .is_some_and(|n| n.members.iter().any(|(m, _)| m == member));
                if stays {
                    continue;
                }
                if let Some(i) = related::resolve(view, changes, &moved, member)? {
                    related::remove_dn(schema, after_mut(changes, i), &self.memberof, &old.norm);
                }
            }
        }
        for d in &diffs {
            let Some(new) = &d.new else { continue };
            for (member, written) in &new.members {
                match related::resolve(view, changes, &moved, member)? {
                    Some(i) => {
                        related::add_dn(
                            schema,
                            after_mut(changes, i),
                            &self.memberof,
                            &new.dn,
                            &new.norm,
                        );
                    }
                    None if self.dangling_error && !is_kept(d, member) => {
                        return Err(LdapError::new(
                            ResultCode::CONSTRAINT_VIOLATION,
                            format!(
                                "member '{written}' of {} names no entry (the memberof overlay's dangling is error)",
                                new.dn
                            ),
                        ));
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }
}

/// Whether `member` was in the group before the operation too (a
/// dangling member already there is not the operation's doing).
fn is_kept(d: &GroupDiff, member: &str) -> bool {
    d.old
        .as_ref()
        .is_some_and(|o| o.members.iter().any(|(n, _)| n == member))
}

/// An entry whose memberOf disagrees with the groups.
#[derive(Debug)]
pub struct Disagreement {
    pub dn: String,
    /// Groups memberOf lists that do not list the entry (normalised).
    pub extra: Vec<String>,
    /// Groups listing the entry that memberOf lacks (as written).
    pub missing: Vec<String>,
    /// What memberOf should hold, as written.
    pub expected: Vec<String>,
}

impl MemberOf {
    /// The attribute that lists an entry's groups (memberOf).
    pub fn attribute(&self) -> &str {
        &self.memberof
    }

    /// Every entry whose memberOf is not exactly the groups listing it
    /// (members naming no entry are not counted). Reads every entry.
    pub fn disagreements(
        &self,
        schema: &Schema,
        view: &View<'_>,
    ) -> Result<Vec<Disagreement>, pando_store::StoreError> {
        use std::collections::BTreeMap;
        let mut ids = roaring::RoaringTreemap::new();
        for root in view.roots()? {
            if let Some(sub) = view.subtree(root, u64::MAX)? {
                ids |= sub;
            }
        }
        // Member (normalised) → groups listing it (normalised, as written).
        let mut listed: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        // Entry (normalised) → (DN, memberOf held, normalised).
        let mut held: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for id in ids {
            let Some(entry) = view.entry(id)? else {
                continue;
            };
            let (dn, norm) = view.dn_pair(id)?;
            if self.is_group(&entry) {
                for (m, _) in self.members_of(schema, &entry) {
                    listed
                        .entry(m)
                        .or_default()
                        .push((norm.clone(), dn.clone()));
                }
            }
            let mine = related::dn_values(schema, &entry, std::slice::from_ref(&self.memberof));
            held.insert(norm, (dn, mine.into_iter().map(|(n, _)| n).collect()));
        }
        let mut out = Vec::new();
        for (norm, (dn, has)) in &held {
            let want = listed.get(norm).cloned().unwrap_or_default();
            let extra: Vec<String> = has
                .iter()
                .filter(|g| !want.iter().any(|(w, _)| w == *g))
                .cloned()
                .collect();
            let missing: Vec<String> = want
                .iter()
                .filter(|(w, _)| !has.contains(w))
                .map(|(_, d)| d.clone())
                .collect();
            if !extra.is_empty() || !missing.is_empty() {
                out.push(Disagreement {
                    dn: dn.clone(),
                    extra,
                    missing,
                    expected: want.into_iter().map(|(_, d)| d).collect(),
                });
            }
        }
        Ok(out)
    }
}

/// The configured memberOf overlay, if any.
pub fn configured(server: &pando_ops::state::Server) -> Option<MemberOf> {
    server.cfg.config.overlay.iter().find_map(|o| match o {
        super::OverlayConfig::Memberof(m) => Some(MemberOf::new(m, &server.schema)),
        _ => None,
    })
}

/// Set memberOf of every entry that disagrees with the groups to what
/// they say, each as an administrator's modify under the relax rules
/// control through the write pipeline (so it is logged and replicated).
/// Returns how many entries changed.
pub async fn rebuild(
    server: &std::sync::Arc<pando_ops::state::Server>,
    who: &pando_access::Identity,
) -> OpResult<usize> {
    let Some(m) = configured(server) else {
        return Err(LdapError::unwilling("no memberof overlay is configured"));
    };
    let todo = {
        let rtxn = server.rt.store.read()?;
        m.disagreements(&server.schema, &rtxn.view())?
    };
    for d in &todo {
        let controls = pando_ops::controls::Requested {
            relax: true,
            ..Default::default()
        };
        let ctx = pando_ops::write::WriteCtx::new(server, who, controls);
        let req = pando_proto::ModifyRequest {
            dn: d.dn.clone(),
            changes: vec![pando_proto::Change {
                op: pando_proto::ModOp::Replace,
                attr: pando_proto::PartialAttribute {
                    name: m.memberof.clone(),
                    values: d.expected.iter().map(|v| v.as_bytes().to_vec()).collect(),
                },
            }],
        };
        pando_ops::write::modify(ctx, req).await?;
    }
    Ok(todo.len())
}
