//! What a transaction needs to know besides the data: the schema, and
//! which index databases exist and which of them are complete.
//!
//! The catalog is immutable and swapped whole (`Inner::catalog`) when the
//! schema changes or an index is added, finishes building or is dropped.
//! A write batch takes the current one when it begins, a read transaction
//! when it begins (see [`for_snapshot`]).
//!
//! An index is *ready* when it holds the keys of every entry: only then may
//! the planner use it. A building index is kept up to date by every write
//! (like a ready one) while [`crate::index_build`] fills in the entries
//! written before it existed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use pando_model::schema::NameHash;
use pando_model::Schema;

use crate::index::{self, IndexKind};
use crate::Db;

/// One index database.
#[derive(Clone, Copy)]
pub(crate) struct IndexDb {
    pub(crate) kind: IndexKind,
    pub(crate) db: Db,
    /// Holds the keys of every entry (see the module comment).
    pub(crate) ready: bool,
}

/// Indexes by lowercase attribute name: names the administrator defines,
/// looked up on every search's plan.
pub(crate) type IndexMap = HashMap<String, Vec<IndexDb>, NameHash>;

pub struct Catalog {
    pub schema: Arc<Schema>,
    /// Lowercase names of attributes that have subtypes: an assertion on them
    /// also matches subtype values, which their own index does not hold.
    pub(crate) has_subtypes: HashSet<String, NameHash>,
    /// Every index the writer keeps, by lowercase attribute name.
    pub(crate) indexes: IndexMap,
    /// Every (attribute, kind) of `indexes` in a fixed order: the slot
    /// numbers of bulk loads' packed keys (see [`crate::bulk`]).
    pub(crate) slots: Vec<(String, IndexKind)>,
}

impl Catalog {
    pub(crate) fn new(schema: Arc<Schema>, indexes: IndexMap) -> Catalog {
        Catalog {
            has_subtypes: subtype_parents(&schema),
            schema,
            slots: slots_of(&indexes),
            indexes,
        }
    }

    /// The same schema with other indexes.
    pub(crate) fn with_indexes(&self, indexes: IndexMap) -> Catalog {
        Catalog {
            schema: self.schema.clone(),
            has_subtypes: self.has_subtypes.clone(),
            slots: slots_of(&indexes),
            indexes,
        }
    }

    /// The index (attribute, kind) whether ready or building.
    pub(crate) fn index(&self, attr_lower: &str, kind: IndexKind) -> Option<&IndexDb> {
        self.indexes
            .get(attr_lower)?
            .iter()
            .find(|i| i.kind == kind)
    }

    /// The database of index (attribute, kind) if the planner may use it.
    pub(crate) fn ready_db(&self, attr_lower: &str, kind: IndexKind) -> Option<&Db> {
        self.index(attr_lower, kind)
            .filter(|i| i.ready)
            .map(|i| &i.db)
    }

    /// Every ready index as (attribute, index), in no particular order.
    pub(crate) fn ready(&self) -> impl Iterator<Item = (&str, &IndexDb)> {
        self.indexes
            .iter()
            .flat_map(|(a, dbs)| dbs.iter().map(move |d| (a.as_str(), d)))
            .filter(|(_, d)| d.ready)
    }

    /// Every index being built, as (attribute, kind, database), sorted.
    pub(crate) fn building(&self) -> Vec<(String, IndexKind, Db)> {
        let mut v: Vec<(String, IndexKind, Db)> = self
            .indexes
            .iter()
            .flat_map(|(a, dbs)| dbs.iter().map(move |d| (a, d)))
            .filter(|(_, d)| !d.ready)
            .map(|(a, d)| (a.clone(), d.kind, d.db))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        v
    }

    /// These indexes with `names` (database names) marked ready.
    pub(crate) fn with_ready(&self, names: &[String]) -> Catalog {
        let mut indexes = self.indexes.clone();
        for (attr, dbs) in indexes.iter_mut() {
            for d in dbs.iter_mut() {
                if names.contains(&index::db_name(attr, d.kind)) {
                    d.ready = true;
                }
            }
        }
        self.with_indexes(indexes)
    }

    /// `newer`, with an index ready only where it is ready in `older` too.
    /// See [`for_snapshot`].
    fn common(older: &Catalog, newer: &Catalog) -> Catalog {
        let mut indexes = newer.indexes.clone();
        for (attr, dbs) in indexes.iter_mut() {
            for d in dbs.iter_mut() {
                d.ready &= older.index(attr, d.kind).is_some_and(|o| o.ready);
            }
        }
        newer.with_indexes(indexes)
    }
}

/// The catalog for a read snapshot, given the catalog current just before
/// the snapshot was taken (`before`) and just after (`after`).
///
/// An index may be used only if the snapshot holds all of it. Marking an
/// index ready is done after the commit that completes it, and an index
/// is emptied only by a commit after it was taken out of the catalog. So
/// an index ready in `before` was complete before the snapshot, and an
/// index ready in `after` had not been emptied yet when it was taken:
/// ready in both is safe. Usually nothing changed in between and `before`
/// is returned as it is.
pub(crate) fn for_snapshot(before: Arc<Catalog>, after: &Arc<Catalog>) -> Arc<Catalog> {
    if Arc::ptr_eq(&before, after) {
        before
    } else {
        Arc::new(Catalog::common(&before, after))
    }
}

fn slots_of(indexes: &IndexMap) -> Vec<(String, IndexKind)> {
    let mut slots: Vec<(String, IndexKind)> = indexes
        .iter()
        .flat_map(|(a, dbs)| dbs.iter().map(move |d| (a.clone(), d.kind)))
        .collect();
    slots.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.as_str().cmp(b.1.as_str())));
    slots
}

fn subtype_parents(schema: &Schema) -> HashSet<String, NameHash> {
    let mut out = HashSet::default();
    for at in schema.attributes() {
        if let Some(sup_at) = at.sup.as_deref().and_then(|s| schema.attribute(s)) {
            out.insert(sup_at.name().to_ascii_lowercase());
        }
    }
    out
}
