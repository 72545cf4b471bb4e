//! Filter → candidate IDs from the indexes.
//!
//! The result is always a superset of the matching entries: AND intersects
//! whatever its indexed parts give, OR unions (and gives up when one part is
//! unindexed), NOT and extensible matches are unindexed. The caller tests
//! every candidate against the full filter, so a superset is always safe.

use std::collections::BTreeSet;

use pando_proto::{Filter, SubstringFilter};
use roaring::RoaringTreemap;

use crate::index::{self, IndexKind, PRESENCE_KEY};
use crate::{StoreError, View};

/// Candidate entries for a filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Candidates {
    /// No usable index: every entry in scope is a candidate.
    All,
    /// These IDs (a superset of the matches).
    Ids(RoaringTreemap),
}

impl Candidates {
    pub fn describe(&self) -> String {
        match self {
            Candidates::All => "unindexed".into(),
            Candidates::Ids(s) => format!("indexed, {} candidates", s.len()),
        }
    }
}

pub(crate) fn candidates(view: &View<'_>, f: &Filter) -> Result<Candidates, StoreError> {
    Ok(match f {
        Filter::And(parts) => {
            let mut sets = Vec::new();
            for p in parts {
                if let Candidates::Ids(s) = candidates(view, p)? {
                    if s.is_empty() {
                        return Ok(Candidates::Ids(s));
                    }
                    sets.push(Ok(s));
                }
            }
            // With no indexed part (or an empty AND, RFC 4526), everything.
            intersect(sets)?.map_or(Candidates::All, Candidates::Ids)
        }
        Filter::Or(parts) => {
            let mut acc = RoaringTreemap::new();
            for p in parts {
                match candidates(view, p)? {
                    Candidates::All => return Ok(Candidates::All),
                    Candidates::Ids(s) => acc |= s,
                }
            }
            Candidates::Ids(acc)
        }
        Filter::Not(_) | Filter::Extensible(_) => Candidates::All,
        Filter::Present(attr) => {
            let Some((name, _)) = resolve(view, attr) else {
                return Ok(Candidates::Ids(RoaringTreemap::new()));
            };
            if name == "objectclass" {
                // Every entry has objectClass.
                return Ok(Candidates::All);
            }
            match usable(view, &name, IndexKind::Pres) {
                Some(db) => Candidates::Ids(view.posting(db, PRESENCE_KEY)?),
                None => Candidates::All,
            }
        }
        Filter::Equality(ava) | Filter::Approx(ava) => {
            let kind = if matches!(f, Filter::Approx(_)) {
                IndexKind::Approx
            } else {
                IndexKind::Eq
            };
            match keyed(view, ava, kind) {
                Keyed::Settled(c) => c,
                Keyed::Key { db, key, .. } => Candidates::Ids(view.posting(db, &key)?),
            }
        }
        Filter::Substrings(sf) => substring_candidates(view, sf)?,
        Filter::GreaterOrEqual(ava) | Filter::LessOrEqual(ava) => {
            let Some((name, at)) = resolve(view, &ava.attr) else {
                return Ok(Candidates::Ids(RoaringTreemap::new()));
            };
            let Some(db) = usable(view, &name, IndexKind::Ord) else {
                return Ok(Candidates::All);
            };
            let Some(key) = view.schema().ordering_key(at, &ava.value) else {
                return Ok(Candidates::Ids(RoaringTreemap::new()));
            };
            let key = index::cut(key);
            let (from, to) = if matches!(f, Filter::GreaterOrEqual(_)) {
                (Some(key.as_slice()), None)
            } else {
                (None, Some(key.as_slice()))
            };
            let acc = crate::postings::read_range(view.txn, db, from, to)?;
            Candidates::Ids(acc)
        }
    })
}

/// Candidates of a substring filter: the entries holding every trigram
/// of its parts (`^` and `$` marking the initial and final ones).
fn substring_candidates(view: &View<'_>, sf: &SubstringFilter) -> Result<Candidates, StoreError> {
    let Some((name, at)) = resolve(view, &sf.attr) else {
        return Ok(Candidates::Ids(RoaringTreemap::new()));
    };
    let Some(db) = usable(view, &name, IndexKind::Sub) else {
        return Ok(Candidates::All);
    };
    let schema = view.schema();
    let mut grams = BTreeSet::new();
    let norm = |p: &[u8]| schema.normalize_substring_part(at, p).ok();
    if let Some(p) = sf.initial.as_deref().and_then(norm) {
        let mut v = vec![b'^'];
        v.extend_from_slice(&p);
        index::grams_of(&v, &mut grams);
    }
    for p in sf.any.iter().filter_map(|p| norm(p)) {
        index::grams_of(&p, &mut grams);
    }
    if let Some(mut p) = sf.final_.as_deref().and_then(norm) {
        p.push(b'$');
        index::grams_of(&p, &mut grams);
    }
    if grams.is_empty() {
        return Ok(Candidates::All);
    }
    Ok(Candidates::Ids(
        intersect(grams.iter().map(|g| view.posting(db, g)))?.unwrap_or_default(),
    ))
}

/// Intersection of the sets, stopping early once it is empty; None when
/// there are no sets at all.
fn intersect(
    sets: impl IntoIterator<Item = Result<RoaringTreemap, StoreError>>,
) -> Result<Option<RoaringTreemap>, StoreError> {
    let mut acc: Option<RoaringTreemap> = None;
    for s in sets {
        let next = match acc {
            None => s?,
            Some(a) => a & s?,
        };
        if next.is_empty() {
            return Ok(Some(next));
        }
        acc = Some(next);
    }
    Ok(acc)
}

/// How far the candidates of a filter are its matches (see [`exact`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exactness {
    /// Candidates must be tested against the filter.
    Test,
    /// Every candidate matches: testing would change nothing.
    Exact,
    /// A candidate whose normalised RDN is this one matches (its RDN
    /// holds the asserted value, so the entry does); any other must be
    /// tested. An equality on the RDN's attribute (`uid=...` under
    /// `uid=...,ou=People`) under a hashed key: confirmed without
    /// decoding the entry.
    WhenRdnIs(String),
}

/// The candidates of `f` ([`candidates`]) and how far they are exactly its
/// matches: exact for a single equality on an attribute with an equality
/// index, written without options, with no subtypes, other than objectClass
/// (whose keys include superclasses); [`Exactness::Exact`] when its key is
/// literal (a value of at most 3 bytes), [`Exactness::WhenRdnIs`] when it
/// is hashed (values sharing a hash share a posting list).
pub(crate) fn candidates_exact(
    view: &View<'_>,
    f: &Filter,
) -> Result<(Candidates, Exactness), StoreError> {
    let Filter::Equality(ava) = f else {
        return Ok((candidates(view, f)?, Exactness::Test));
    };
    // The key computed once, for the candidates and for their exactness.
    let (name, at, db, key) = match keyed(view, ava, IndexKind::Eq) {
        Keyed::Settled(c) => return Ok((c, Exactness::Test)),
        Keyed::Key { name, at, db, key } => (name, at, db, key),
    };
    let ids = view.posting(db, &key)?;
    if name == "objectclass" || pando_model::AttrDesc::new(&ava.attr).has_options() {
        return Ok((Candidates::Ids(ids), Exactness::Test));
    }
    if index::is_literal(&key) {
        return Ok((Candidates::Ids(ids), Exactness::Exact));
    }
    let rdn = pando_model::Rdn {
        avas: vec![pando_model::RdnAva {
            attr: at.name().to_string(),
            value: ava.value.clone(),
        }],
    };
    let exactness = view
        .schema()
        .normalize_rdn(&rdn)
        .map_or(Exactness::Test, Exactness::WhenRdnIs);
    Ok((Candidates::Ids(ids), exactness))
}

/// An equality or approximate assertion's index key, or its candidates
/// when there is no key to read.
enum Keyed<'t> {
    Settled(Candidates),
    Key {
        /// The type's name in lowercase (the indexes' key).
        name: std::borrow::Cow<'t, str>,
        at: &'t pando_model::AttributeType,
        db: &'t crate::Db,
        key: Vec<u8>,
    },
}

fn keyed<'t>(view: &View<'t>, ava: &pando_proto::Ava, kind: IndexKind) -> Keyed<'t> {
    let Some((name, at)) = resolve(view, &ava.attr) else {
        // No such type: nothing matches.
        return Keyed::Settled(Candidates::Ids(RoaringTreemap::new()));
    };
    let Some(db) = usable(view, &name, kind) else {
        // Approximate match falls back to equality candidates only when
        // there is no approx index: it is not a superset, so don't.
        return Keyed::Settled(Candidates::All);
    };
    match index::assertion_key(view.schema(), at, kind, &ava.value) {
        Some(key) => Keyed::Key { name, at, db, key },
        // The assertion value is invalid for the syntax: it matches nothing.
        None => Keyed::Settled(Candidates::Ids(RoaringTreemap::new())),
    }
}

/// The type `desc` names, with its name in lowercase (the indexes' key;
/// borrowed when the name already is).
fn resolve<'t>(
    view: &View<'t>,
    desc: &str,
) -> Option<(std::borrow::Cow<'t, str>, &'t pando_model::AttributeType)> {
    let base = pando_model::desc::base(desc);
    let at = view.schema().attribute(base)?;
    let name = at.name();
    Some(match name.bytes().any(|b| b.is_ascii_uppercase()) {
        true => (name.to_ascii_lowercase().into(), at),
        false => (name.into(), at),
    })
}

/// The index for (attr, kind), if there is one and it covers the assertion:
/// an attribute with subtypes is matched through its subtypes' values, which
/// its own index does not hold.
fn usable<'t>(view: &View<'t>, name: &str, kind: IndexKind) -> Option<&'t crate::Db> {
    if view.catalog.has_subtypes.contains(name) {
        return None;
    }
    view.index_db(name, kind)
}
