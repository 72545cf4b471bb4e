//! Referential integrity: when an entry is deleted, values naming it go
//! from the configured attributes of every entry; when it is renamed (or
//! an ancestor is), they name it by its new DN. Done in the operation's
//! own transaction, so no reader ever sees a dangling reference that the
//! overlay would later repair.

use pando_model::Schema;
use pando_store::View;

use super::related::{self, after_mut, Move};
use pando_config::overlay::RefintConfig;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::seams::WriteHook;
use pando_ops::write::{Change, WriteCtx};

pub struct Refint {
    /// Attribute names as the schema spells them.
    attrs: Vec<String>,
    nothing: Option<(String, String)>,
}

impl Refint {
    pub fn new(cfg: &RefintConfig, schema: &Schema) -> Refint {
        let attrs = cfg
            .attributes
            .iter()
            .map(|a| super::canonical(schema, a))
            .collect();
        let nothing = cfg.nothing.as_ref().and_then(|n| {
            let norm = related::value_norm(schema, n.as_bytes())?;
            Some((n.clone(), norm))
        });
        Refint { attrs, nothing }
    }

    /// Remove the references to the deleted entry `gone` from the entry at
    /// `i`; an attribute left empty gets the `nothing` value, or the
    /// delete is refused when the schema needs the attribute.
    fn unlink(&self, schema: &Schema, changes: &mut [Change], i: usize, gone: &str) {
        let entry = after_mut(changes, i);
        for attr in &self.attrs {
            if related::remove_dn(schema, entry, attr, gone) && entry.get(attr).is_none() {
                if let Some((dn, norm)) = &self.nothing {
                    related::add_dn(schema, entry, attr, dn, norm);
                }
            }
        }
    }

    fn relink(&self, schema: &Schema, changes: &mut [Change], i: usize, m: &Move) {
        let entry = after_mut(changes, i);
        for attr in &self.attrs {
            related::rename_dn(schema, entry, attr, &m.old_norm, &m.new_dn, &m.new_norm);
        }
    }
}

impl WriteHook for Refint {
    fn related(&self, ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
        let schema = &*ctx.server.schema;
        let gone: Vec<String> = changes
            .iter()
            .filter(|c| c.after.is_none())
            .filter_map(|c| c.before.as_ref().map(|b| b.norm.clone()))
            .collect();
        let moved = related::moves(view, changes, ctx.server.cfg.config.limits.max_tree_delete)?;
        for norm in &gone {
            for id in related::referrers(view, &self.attrs, norm)? {
                if let Some(i) = related::edit_index(view, changes, id)? {
                    self.unlink(schema, changes, i, norm);
                }
            }
        }
        for m in &moved {
            for id in related::referrers(view, &self.attrs, &m.old_norm)? {
                if let Some(i) = related::edit_index(view, changes, id)? {
                    self.relink(schema, changes, i, m);
                }
            }
        }
        if self.nothing.is_none() {
            self.check_not_emptied(schema, changes, &gone)?;
        }
        Ok(())
    }
}

impl Refint {
    /// Without a `nothing` value, a reference whose removal empties an
    /// attribute the schema requires (a group's last member) makes the
    /// delete fail, with a message saying what to do.
    fn check_not_emptied(
        &self,
        schema: &Schema,
        changes: &[Change],
        gone: &[String],
    ) -> OpResult<()> {
        for c in changes {
            let (Some(b), Some(a)) = (&c.before, &c.after) else {
                continue;
            };
            for attr in &self.attrs {
                if b.entry.get(attr).is_none() || a.get(attr).is_some() {
                    continue;
                }
                let mut probe = a.clone();
                if schema.check_entry(&mut probe).is_err() {
                    let named = |g: &&String| {
                        b.entry
                            .values(attr)
                            .iter()
                            .any(|v| related::value_norm(schema, v).as_deref() == Some(g.as_str()))
                    };
                    let which = gone.iter().find(named).map(String::as_str);
                    return Err(LdapError::new(
                        pando_proto::ResultCode::OBJECT_CLASS_VIOLATION,
                        format!(
                            "deleting {} would leave {} without {attr}, which its object class requires: remove it from there first, or set the refint overlay's nothing value (olcRefintNothing)",
                            which.unwrap_or("the entry"),
                            a.dn
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
