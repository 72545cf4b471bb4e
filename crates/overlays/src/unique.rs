//! Attribute uniqueness: no two entries within a subtree share a value of
//! a configured attribute. Checked in the writer's transaction, through
//! the equality index, on the state every earlier write left: two
//! concurrent adds of one value are serialised by the writer, and the
//! second finds the first.

use pando_model::{Entry, Schema};
use pando_proto::{Ava, Filter, ResultCode};
use pando_store::{Candidates, View};

use super::related::within;
use pando_config::overlay::UniqueConfig;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::seams::WriteHook;
use pando_ops::write::{Change, WriteCtx};

pub struct Unique {
    attrs: Vec<String>,
    /// Normalised base; "" = everywhere.
    base: String,
    strict: bool,
}

impl Unique {
    pub fn new(cfg: &UniqueConfig, schema: &Schema) -> Unique {
        let attrs = cfg
            .attributes
            .iter()
            .map(|a| super::canonical(schema, a))
            .collect();
        let base = cfg
            .base
            .as_deref()
            .and_then(|b| pando_model::Dn::parse(b).ok())
            .and_then(|d| schema.normalize_dn(&d).ok())
            .unwrap_or_default();
        Unique {
            attrs,
            base,
            strict: cfg.strict,
        }
    }

    /// The normalised values of `attr` in `entry` that must be unique.
    fn values(&self, schema: &Schema, entry: &Entry, attr: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let Some(at) = schema.attribute(attr) else {
            return Vec::new();
        };
        entry
            .values(attr)
            .iter()
            .filter(|v| self.strict || !v.is_empty())
            .filter_map(|v| Some((v.clone(), schema.normalize(at, v).ok()?)))
            .collect()
    }
}

fn not_unique(attr: &str, value: &[u8]) -> LdapError {
    LdapError::new(
        ResultCode::CONSTRAINT_VIOLATION,
        format!(
            "{attr}: the value '{}' is not unique (another entry has it)",
            String::from_utf8_lossy(value)
        ),
    )
}

impl WriteHook for Unique {
    fn related(&self, ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
        let schema = &*ctx.server.schema;
        for (i, c) in changes.iter().enumerate() {
            let Some(after) = &c.after else { continue };
            if !within(c.norm(), &self.base) {
                continue;
            }
            let before = c.before.as_ref();
            let entered = before.is_none_or(|b| !within(&b.norm, &self.base));
            for attr in &self.attrs {
                let unchanged =
                    !entered && before.is_some_and(|b| b.entry.values(attr) == after.values(attr));
                if unchanged {
                    continue;
                }
                for (raw, norm) in self.values(schema, after, attr) {
                    // Another entry this operation leaves with the value.
                    let twice = changes.iter().enumerate().any(|(j, o)| {
                        j != i
                            && o.after.as_ref().is_some_and(|a| {
                                within(o.norm(), &self.base)
                                    && self.values(schema, a, attr).iter().any(|(_, n)| *n == norm)
                            })
                    });
                    if twice {
                        return Err(not_unique(attr, &raw));
                    }
                    let filter = Filter::Equality(Ava {
                        attr: attr.clone(),
                        value: raw.clone(),
                    });
                    let ids = match view.candidates(&filter)? {
                        Candidates::Ids(ids) => ids,
                        // The index is being built: read every entry.
                        Candidates::All => {
                            let mut all = roaring::RoaringTreemap::new();
                            for root in view.roots()? {
                                if let Some(ids) = view.subtree(root, u64::MAX)? {
                                    all |= ids;
                                }
                            }
                            all
                        }
                    };
                    for id in ids {
                        // Entries the operation changes were looked at above.
                        if changes
                            .iter()
                            .any(|o| o.before.as_ref().is_some_and(|b| b.id == id))
                        {
                            continue;
                        }
                        let Some(other) = view.entry(id)? else {
                            continue;
                        };
                        let (_, other_norm) = view.dn_pair(id)?;
                        if within(&other_norm, &self.base)
                            && self
                                .values(schema, &other, attr)
                                .iter()
                                .any(|(_, n)| *n == norm)
                        {
                            return Err(not_unique(attr, &raw));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
