//! How a search finds its candidates, and what its filter needs.

use pando_model::{AttributeType, Schema};
use pando_proto::{Filter, ResultCode, Scope};
use pando_store::{Candidates, EntryId, View};
use roaring::RoaringTreemap;

use super::emit::{Selection, Wanted};
use crate::error::{LdapError, OpResult};
use crate::COMPUTED;

/// Call `f` with the attribute description of every item of a filter.
pub fn for_each_filter_attr(filter: &Filter, f: &mut dyn FnMut(&str)) {
    match filter {
        Filter::And(v) | Filter::Or(v) => v.iter().for_each(|g| for_each_filter_attr(g, f)),
        Filter::Not(g) => for_each_filter_attr(g, f),
        Filter::Equality(a)
        | Filter::GreaterOrEqual(a)
        | Filter::LessOrEqual(a)
        | Filter::Approx(a) => f(&a.attr),
        Filter::Substrings(s) => f(&s.attr),
        Filter::Present(a) => f(a),
        Filter::Extensible(m) => {
            if let Some(a) = &m.attr {
                f(a)
            }
        }
    }
}

/// Filter attributes that need computed values added before evaluation.
pub(super) fn computed_in_filter(filter: &Filter, out: &mut Vec<&'static str>) {
    for_each_filter_attr(filter, &mut |attr| {
        for c in COMPUTED {
            if attr.eq_ignore_ascii_case(c) && !out.contains(c) {
                out.push(c);
            }
        }
    });
}

pub(super) fn uses_dn_attributes(f: &Filter) -> bool {
    match f {
        Filter::And(v) | Filter::Or(v) => v.iter().any(uses_dn_attributes),
        Filter::Not(g) => uses_dn_attributes(g),
        Filter::Extensible(m) => m.dn_attributes,
        _ => false,
    }
}

/// Attribute types a filter tests, each once.
pub fn types_in_filter<'s>(schema: &'s Schema, filter: &Filter, out: &mut Vec<&'s AttributeType>) {
    for_each_filter_attr(filter, &mut |desc| {
        if let Ok((_, at)) = schema.canonical_desc(desc) {
            if !out.iter().any(|x| std::ptr::eq(*x, at)) {
                out.push(at);
            }
        }
    });
}

/// Candidate IDs within the scope, ascending.
pub fn scope_candidates(
    view: &View<'_>,
    limit: u64,
    base: EntryId,
    scope: Scope,
    cands: Candidates,
) -> OpResult<(RoaringTreemap, Option<Scope>)> {
    if scope == Scope::Base {
        let mut s = RoaringTreemap::new();
        s.insert(base);
        return Ok((s, None));
    }
    let over_limit = || {
        LdapError::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!("unindexed search would examine more than {limit} entries; add an index or narrow the filter"),
        )
    };
    let mut set = match cands {
        // Index candidates: the caller checks each against the scope.
        Candidates::Ids(ids) => return Ok((ids, Some(scope))),
        Candidates::All if scope == Scope::One => {
            let kids: RoaringTreemap = view.children(base)?.into_iter().collect();
            if kids.len() > limit {
                return Err(over_limit());
            }
            kids
        }
        Candidates::All => view.subtree(base, limit)?.ok_or_else(over_limit)?,
    };
    if scope == Scope::Children {
        set.remove(base);
    }
    Ok((set, None))
}

/// How a search over the store runs, decided once before the first
/// candidate: which entries to look at, and which of the fast paths apply.
pub struct Plan<'s> {
    /// Candidate IDs, ascending.
    pub(super) ids: RoaringTreemap,
    /// The scope each candidate must still be checked against (index
    /// candidates); None when `ids` are all in scope.
    pub(super) check_scope: Option<Scope>,
    /// An extensible match with dnAttributes needs the parsed DN.
    pub(super) uses_dn: bool,
    /// Computed attributes the filter tests (added before it is tested).
    pub(super) needed_computed: Vec<&'static str>,
    /// The index candidates are exactly the matches: no filter test
    /// (those whose RDN is not `confirm_rdn`, when set, are tested first).
    pub(super) exact: bool,
    /// A hashed equality key's candidates: one whose normalised RDN is
    /// this matches as is; any other is tested against the filter before
    /// it counts as exact ([`pando_store::Exactness::WhenRdnIs`]).
    pub(super) confirm_rdn: Option<String>,
    /// Nothing is decoded: exact candidates, no attribute goes out.
    pub(super) no_decode: bool,
    /// Attributes go from the stored record to the wire undecoded.
    pub(super) raw: bool,
    /// The attribute types the filter names (masked per entry by access).
    pub(super) filter_types: Vec<&'s AttributeType>,
    /// Only these attributes are decoded, or on the raw path looked at
    /// (None: all).
    pub(super) wanted: Option<Wanted<'s>>,
}

/// What shapes a plan besides the request itself.
pub(super) struct PlanInput<'a, 's> {
    pub(super) schema: &'s Schema,
    pub(super) filter: &'a Filter,
    pub(super) scope: Scope,
    pub(super) base: EntryId,
    /// Most entries an unindexed search may examine.
    pub(super) unindexed_limit: u64,
    /// Access rules look inside entries.
    pub(super) rules_read_entries: bool,
    /// The attributes the caller needs decoded besides the filter's (sort keys).
    pub(super) also_decode: &'a [&'s AttributeType],
    /// Give up (None) when there could be more candidates than this.
    pub(super) inline_max: Option<u64>,
    /// Search hooks take each entry decoded before it is sent.
    pub(super) entry_steps: bool,
}

impl<'s> Plan<'s> {
    /// The plan, or None when the search is too big for `inline_max`.
    pub(super) fn make(
        view: &View<'_>,
        input: PlanInput<'_, 's>,
        sel: &Selection,
    ) -> OpResult<Option<Plan<'s>>> {
        let PlanInput {
            schema,
            filter,
            scope,
            ..
        } = input;
        // Inline runs must stay small: give up before any scope walk when
        // the index candidates (or an unindexed scope) could be large.
        let (cands, exactness) = if scope == Scope::Base {
            (Candidates::All, pando_store::Exactness::Test)
        } else {
            view.candidates_exact(filter)?
        };
        if let (Some(max), false) = (input.inline_max, scope == Scope::Base) {
            if !matches!(&cands, Candidates::Ids(ids) if ids.len() <= max) {
                return Ok(None);
            }
        }
        let (ids, check_scope) =
            scope_candidates(view, input.unindexed_limit, input.base, scope, cands)?;
        if input.inline_max.is_some_and(|m| ids.len() > m) {
            return Ok(None);
        }
        let uses_dn = uses_dn_attributes(filter);
        let mut needed_computed = Vec::new();
        computed_in_filter(filter, &mut needed_computed);
        let exact = exactness != pando_store::Exactness::Test;
        let confirm_rdn = match exactness {
            pando_store::Exactness::WhenRdnIs(rdn) => Some(rdn),
            _ => None,
        };
        // Then, when no access rule looks inside entries, no computed
        // attribute is tested and nothing else needs decoding, only the
        // emitter reads the attributes: a search returning none ("1.1", as
        // an authentication's lookup) decodes no entry at all, any other
        // sends them from the store to the wire without decoding them.
        let emitter_only = exact
            && !input.rules_read_entries
            && needed_computed.is_empty()
            && !uses_dn
            && input.also_decode.is_empty();
        let no_decode = emitter_only && sel.wants_nothing();
        // The hooks' steps take decoded entries.
        let raw = emitter_only && !no_decode && !input.entry_steps;
        let mut filter_types: Vec<&AttributeType> = Vec::new();
        types_in_filter(schema, filter, &mut filter_types);
        // When entries are decoded: access rules with filters look at whole
        // entries; otherwise only what goes out or is tested is decoded.
        let wanted = if raw {
            // Borrowed from the store: only what goes out is looked at.
            Wanted::new(schema, sel, &[])
        } else if emitter_only || input.rules_read_entries {
            None
        } else {
            let mut tested: Vec<&AttributeType> = input.also_decode.to_vec();
            if !exact {
                tested.extend(filter_types.iter().copied());
            }
            Wanted::new(schema, sel, &tested)
        };
        Ok(Some(Plan {
            ids,
            check_scope,
            uses_dn,
            needed_computed,
            exact,
            confirm_rdn,
            no_decode,
            raw,
            filter_types,
            wanted,
        }))
    }
}

impl<'s> Plan<'s> {
    /// The plan for testing entries held in memory (a persistent search's
    /// changes): no candidates, every entry decoded and tested.
    pub fn for_held_entries(schema: &'s Schema, filter: &Filter) -> Plan<'s> {
        let mut needed_computed = Vec::new();
        computed_in_filter(filter, &mut needed_computed);
        let mut filter_types = Vec::new();
        types_in_filter(schema, filter, &mut filter_types);
        Plan {
            ids: RoaringTreemap::new(),
            check_scope: None,
            uses_dn: uses_dn_attributes(filter),
            needed_computed,
            exact: false,
            confirm_rdn: None,
            no_decode: false,
            raw: false,
            filter_types,
            wanted: None,
        }
    }
}

impl Plan<'_> {
    /// RFC 3672: with the subentries control TRUE only subentries are
    /// candidates, with FALSE only ordinary entries; without it, subentries
    /// are seen only by a base-scope search naming one. Subentries are
    /// found through the objectClass equality index (one lookup, usually
    /// of a missing key); without that index they are not told apart.
    pub(super) fn show_subentries(
        &mut self,
        view: &View<'_>,
        known: &crate::Subentries,
        control: Option<bool>,
        scope: Scope,
    ) -> OpResult<()> {
        if control.is_none() && scope == Scope::Base {
            return Ok(());
        }
        let is_subentry = Filter::Equality(pando_proto::Ava {
            attr: "objectClass".into(),
            value: b"subentry".to_vec(),
        });
        let lookup = || match view.candidates(&is_subentry) {
            Ok(Candidates::Ids(ids)) => !ids.is_empty(),
            _ => true,
        };
        if control != Some(true) && !known.maybe(lookup) {
            return Ok(());
        }
        let Candidates::Ids(subentries) = view.candidates(&is_subentry)? else {
            return Ok(());
        };
        if control == Some(true) {
            self.ids &= subentries;
        } else {
            self.ids -= subentries;
        }
        Ok(())
    }
}
