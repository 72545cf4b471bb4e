//! One candidate of a stored search: in scope? visible to the requester?
//! matching the filter as the requester may see it? Then emitted.

use std::collections::HashMap;

use pando_model::{AttributeType, CompiledFilter, Dn, Entry, Schema, Ternary};
use pando_proto::{Filter, Scope};
use pando_store::{EntryId, View};

use super::emit::{computed_value, Emitter, Guard};
use super::plan::Plan;
use crate::error::OpResult;
use pando_access::acl::{self, Access, EntryRules};

/// A candidate that matched: its DN (as stored and normalised) and what
/// was decoded of it (nothing on the `no_decode` and `raw` paths).
pub(super) struct Hit<'t> {
    pub(super) id: EntryId,
    pub(super) dn: String,
    pub(super) norm: String,
    pub(super) entry: Entry,
    /// The entry's stored record, read once for its place and attributes.
    record: &'t [u8],
}

pub struct Matcher<'a, 's> {
    pub(super) schema: &'s Schema,
    pub(super) view: &'a View<'a>,
    pub(super) plan: &'a Plan<'s>,
    pub(super) base: EntryId,
    /// The request's filter, compiled as is and, per mask of attributes
    /// the requester may not search, with those hidden.
    pub(super) filter: &'a Filter,
    pub(super) compiled: CompiledFilter,
    pub(super) masked: HashMap<u64, CompiledFilter>,
    pub(super) access: Access<'a>,
    /// The access rules covering the last hit (used when it is emitted).
    pub(super) rules: EntryRules,
}

impl<'a, 's> Matcher<'a, 's> {
    /// A matcher for `job`'s filter and requester over `view`, testing
    /// entries `plan` (for entries held in memory, or a refresh's own
    /// candidates) decides how; `base`: the search base's ID (0 when
    /// scopes are checked on DNs).
    pub fn for_job(
        job: &'a super::SearchJob,
        view: &'a View<'a>,
        plan: &'a Plan<'s>,
        base: EntryId,
    ) -> Self
    where
        'a: 's,
    {
        let schema = &*job.server.schema;
        Matcher {
            schema,
            view,
            plan,
            base,
            filter: &job.req.filter,
            compiled: schema.compile_filter(&job.req.filter),
            masked: HashMap::new(),
            access: Access::new(&job.server.acl, &job.who),
            rules: EntryRules::default(),
        }
    }

    /// The candidate `id` as a hit, or None when it is out of scope,
    /// invisible to the requester or not matching.
    pub(super) fn test(&mut self, id: EntryId) -> OpResult<Option<Hit<'a>>> {
        let (view, plan) = (self.view, self.plan);
        let Some(record) = view.entry_bytes(id)? else {
            return Ok(None);
        };
        let place = view.placement_in(id, record)?;
        let in_scope = match plan.check_scope {
            None => true,
            Some(Scope::One) => place.parent == self.base,
            Some(s) => {
                (s != Scope::Children && id == self.base)
                    || (id != self.base
                        && place.parent != 0
                        && view.is_within(place.parent, self.base)?)
            }
        };
        if !in_scope {
            return Ok(None);
        }
        let unconfirmed = plan
            .confirm_rdn
            .as_ref()
            .is_some_and(|rdn| *rdn != place.norm_rdn);
        if unconfirmed && !self.holds_asserted_value(id, record)? {
            return Ok(None);
        }
        let attrs = if plan.no_decode || plan.raw {
            Vec::new()
        } else {
            let keep = |desc: &str| plan.wanted.as_ref().is_none_or(|w| w.keep(desc));
            view.attrs_where_in(id, record, &keep)?
        };
        let (dn, norm) = view.dn_pair_of(&place)?;
        // The parsed DN is only consulted by extensible matches with dnAttributes.
        let parsed = if plan.uses_dn {
            Dn::parse(&dn).unwrap_or(Dn { rdns: Vec::new() })
        } else {
            Dn { rdns: Vec::new() }
        };
        let mut entry = Entry { dn: parsed, attrs };
        self.add_computed(id, &dn, &mut entry)?;
        if self.matches(&norm, &entry) != Ternary::True {
            return Ok(None);
        }
        Ok(Some(Hit {
            id,
            dn,
            norm,
            entry,
            record,
        }))
    }

    /// Whether the stored entry holds what the filter (one equality under
    /// a hashed key, see [`Plan::confirm_rdn`]) asserts: the test an
    /// exact plan skips, on the filter's attribute alone, before access
    /// is considered (the plan then applies it as for exact candidates).
    fn holds_asserted_value(&self, id: EntryId, record: &[u8]) -> OpResult<bool> {
        let types = &self.plan.filter_types;
        let keep = |desc: &str| {
            let base = pando_model::desc::base(desc);
            types.iter().any(|at| at.has_name(base))
        };
        let attrs = self.view.attrs_where_in(id, record, &keep)?;
        let entry = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs,
        };
        Ok(self.compiled.matches(self.schema, &entry) == Ternary::True)
    }

    /// The computed attributes the filter tests, added to `entry` (stored
    /// as `id`) before it is tested; left out (so tests of them are
    /// Undefined) when not given.
    fn add_computed(&mut self, id: EntryId, dn: &str, entry: &mut Entry) -> OpResult<()> {
        for name in &self.plan.needed_computed {
            let restricted = (!self.access.unrestricted()).then_some(&mut self.access);
            if let Some(vs) = computed_value(self.schema, self.view, restricted, id, dn, name)? {
                entry.attrs.push(pando_model::Attribute {
                    desc: name.to_string(),
                    values: vs.into_iter().map(String::into_bytes).collect(),
                });
            }
        }
        Ok(())
    }

    /// An entry held in memory as a change left it (a persistent search's):
    /// visible to the requester and matching the filter as it may see it?
    /// `id`: where it is stored now, if it still is (computed attributes
    /// are taken from there). The caller has checked the scope.
    pub fn test_held(
        &mut self,
        id: Option<EntryId>,
        norm: &str,
        mut entry: Entry,
    ) -> OpResult<Option<Entry>> {
        if let Some(id) = id {
            let dn = entry.dn.to_string();
            self.add_computed(id, &dn, &mut entry)?;
        }
        Ok((self.matches(norm, &entry) == Ternary::True).then_some(entry))
    }

    /// Whether the requester may read the entry `norm` (its rules are then
    /// the ones an emit of it uses).
    pub fn may_read_entry(&mut self, norm: &str, entry: &Entry) -> bool {
        if self.access.unrestricted() {
            return true;
        }
        self.access
            .entry_into(self.schema, norm, entry, &mut self.rules);
        self.access
            .allows(Some(self.view), &self.rules, norm, None, acl::READ)
    }

    /// Encode an entry [`Matcher::test_held`] (or [`Matcher::may_read_entry`]) passed, its message carrying
    /// `controls`.
    pub fn emit_held(
        &mut self,
        emitter: &Emitter<'_>,
        id: Option<EntryId>,
        norm: &str,
        entry: &Entry,
        controls: &[pando_proto::Control],
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let guard = (!self.access.unrestricted()).then_some(Guard {
            access: &mut self.access,
            rules: &self.rules,
            norm,
        });
        let dn = entry.dn.to_string();
        emitter.emit(Some(self.view), id, &dn, entry, guard, controls, buf)
    }

    /// The filter's value for the entry as the requester sees it: false
    /// unless it may read the entry; items on attributes it may not search
    /// are Undefined. An exact filter is one equality the index answered:
    /// it holds unless its attribute is masked. On the `no_decode` and
    /// `raw` paths the entry has no attributes and is not tested.
    fn matches(&mut self, norm: &str, entry: &Entry) -> Ternary {
        let (plan, schema) = (self.plan, self.schema);
        if self.access.unrestricted() {
            return if plan.exact {
                Ternary::True
            } else {
                self.compiled.matches(schema, entry)
            };
        }
        self.access.entry_into(schema, norm, entry, &mut self.rules);
        if !self
            .access
            .allows(Some(self.view), &self.rules, norm, None, acl::READ)
        {
            return Ternary::False;
        }
        let mut mask = 0u64;
        for (i, at) in plan.filter_types.iter().enumerate() {
            if !self
                .access
                .allows(Some(self.view), &self.rules, norm, Some(at), acl::SEARCH)
            {
                mask |= 1 << i.min(63);
            }
        }
        if plan.no_decode || plan.raw {
            return if mask == 0 {
                Ternary::True
            } else {
                Ternary::Undefined
            };
        }
        if mask == 0 {
            return if plan.exact {
                Ternary::True
            } else {
                self.compiled.matches(schema, entry)
            };
        }
        let hidden: Vec<&str> = plan
            .filter_types
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << (*i).min(63)) != 0)
            .map(|(_, at)| at.oid.as_str())
            .collect();
        let hide = |at: &AttributeType| hidden.contains(&at.oid.as_str());
        let filter = self.filter;
        if plan.filter_types.len() > 64 {
            return schema
                .compile_filter_hiding(filter, &hide)
                .matches(schema, entry);
        }
        self.masked
            .entry(mask)
            .or_insert_with(|| schema.compile_filter_hiding(filter, &hide))
            .matches(schema, entry)
    }

    /// Encode the hit just tested into `buf`.
    pub(super) fn emit(
        &mut self,
        emitter: &Emitter<'_>,
        hit: &Hit<'_>,
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let view = self.view;
        let guard = (!self.access.unrestricted()).then_some(Guard {
            access: &mut self.access,
            rules: &self.rules,
            norm: &hit.norm,
        });
        if self.plan.raw {
            // Attributes the search cannot return are passed over by name
            // before any schema lookup (a search naming one attribute
            // skips the other dozen of a person entry here).
            let wanted = self.plan.wanted.as_ref();
            let emitted = view.with_raw_in(hit.id, hit.record, |attrs| {
                let attrs = attrs.filter_names(|desc| wanted.is_none_or(|w| w.keep_bytes(desc)));
                emitter.emit_attrs(Some(view), Some(hit.id), &hit.dn, attrs, guard, &[], buf)
            })?;
            return emitted;
        }
        emitter.emit(
            Some(view),
            Some(hit.id),
            &hit.dn,
            &hit.entry,
            guard,
            &[],
            buf,
        )
    }
}
