//! Hooks every search passes through, in the order of [`HOOKS`]: the seam
//! where controls act on searches today and overlays will plug in (the
//! write side is `ops::write::hooks`).
//!
//! - `before` runs once the base entry is found and the requester may
//!   search it, before any candidate is looked at: it may refuse the
//!   search (the assertion control). The base entry is read only when a
//!   hook `wants_base`.
//! - `per_entry` gives, per search, a step each entry takes after scope,
//!   filter and access let it go out and before it is encoded: the step
//!   may change the entry's values (the matched values control); it does
//!   not decide whether the entry goes out (positions of sorted and paged
//!   results count entries sent). A search with a step decodes every
//!   entry it sends (no raw path).
//! - `after` sees the outcome, and the way the search went, before
//!   SearchResultDone is sent, and may add response controls (the sort
//!   control's reason for not sorting).
//!
//! The built-in hooks run first, then configured overlays' (value
//! sorting), in order.

use pando_model::{CompiledFilter, Dn, Entry, Ternary};
use pando_proto::ResultCode;
use pando_store::View;

use super::{sort, Path, SearchJob, SearchOutcome};
use crate::error::{LdapError, OpResult};
use crate::seams::{EntryStep, SearchHook};

/// The order built-in hooks run in.
const HOOKS: &[&dyn SearchHook] = &[&Assertion, &MatchedValues, &SortResponse];

/// Every hook, in order: the built-in ones, then the server's overlays.
fn all(job: &SearchJob) -> impl Iterator<Item = &dyn SearchHook> {
    HOOKS.iter().copied().chain(
        job.server
            .layers
            .search
            .iter()
            .map(|h| &**h as &dyn SearchHook),
    )
}

/// Every hook's `before`, in order; `load` reads the base entry, only
/// when a hook wants it.
pub fn before(
    job: &SearchJob,
    view: Option<&View<'_>>,
    norm: &str,
    load: &mut dyn FnMut() -> OpResult<Entry>,
) -> OpResult<()> {
    let mut base = None;
    for hook in all(job).filter(|h| h.wants_base(job)) {
        if base.is_none() {
            base = Some(load()?);
        }
        if let Some(entry) = &base {
            hook.before(job, view, norm, entry)?;
        }
    }
    Ok(())
}

/// The per-entry steps of this search, in hook order.
pub(super) fn entry_steps(job: &SearchJob) -> Vec<EntryStep> {
    all(job).filter_map(|h| h.per_entry(job)).collect()
}

/// Every hook's `after`, in order.
pub fn after(job: &SearchJob, path: Path, outcome: &mut SearchOutcome) {
    for hook in all(job) {
        hook.after(job, path, outcome);
    }
}

/// RFC 4528: the search goes ahead only if the assertion is TRUE for its
/// base entry (as the requester may see it).
struct Assertion;

impl SearchHook for Assertion {
    fn wants_base(&self, job: &SearchJob) -> bool {
        job.controls.assertion.is_some()
    }

    fn before(
        &self,
        job: &SearchJob,
        view: Option<&View<'_>>,
        norm: &str,
        base: &Entry,
    ) -> OpResult<()> {
        let Some(filter) = &job.controls.assertion else {
            return Ok(());
        };
        let schema = &*job.server.schema;
        let holds = match view {
            Some(view) => crate::assertion_holds(&job.server, view, &job.who, norm, base, filter),
            // A virtual tree's entries are readable whole or not at all.
            None => schema.compile_filter(filter).matches(schema, base) == Ternary::True,
        };
        if holds {
            Ok(())
        } else {
            Err(LdapError::new(
                ResultCode::ASSERTION_FAILED,
                "the assertion control's filter is not true for the base entry",
            ))
        }
    }
}

/// RFC 3876: only values that match one of the control's items go out,
/// and attributes left with none are omitted (as slapd does).
struct MatchedValues;

impl SearchHook for MatchedValues {
    fn per_entry(&self, job: &SearchJob) -> Option<EntryStep> {
        let items = job.controls.matched_values.as_ref()?;
        let schema = job.server.schema.clone();
        let compiled: Vec<CompiledFilter> =
            items.iter().map(|f| schema.compile_filter(f)).collect();
        Some(Box::new(move |_dn: &str, entry: &mut Entry| {
            for a in &mut entry.attrs {
                let desc = a.desc.clone();
                a.values
                    .retain(|v| value_matches(&schema, &compiled, &desc, v));
            }
            entry.attrs.retain(|a| !a.values.is_empty());
        }))
    }
}

/// Does one value of attribute `desc` match one of the matched values
/// items? Each item is evaluated against an entry holding only that
/// value, so items on other attribute types never match it.
fn value_matches(
    schema: &pando_model::Schema,
    items: &[CompiledFilter],
    desc: &str,
    value: &[u8],
) -> bool {
    let one = Entry {
        dn: Dn { rdns: Vec::new() },
        attrs: vec![pando_model::Attribute {
            desc: desc.to_string(),
            values: vec![value.to_vec()],
        }],
    };
    items
        .iter()
        .any(|f| f.matches(schema, &one) == Ternary::True)
}

/// RFC 2891: a search that asked for sorting and went through unsorted (a
/// non-critical sort the server cannot do, or a virtual tree's entries)
/// says why in the sort response control. Sorted searches and refusals
/// carry their own, or none.
struct SortResponse;

impl SearchHook for SortResponse {
    fn after(&self, job: &SearchJob, path: Path, outcome: &mut SearchOutcome) {
        let Some(s) = &job.controls.sort else {
            return;
        };
        let (code, attr) = match path {
            Path::VirtualTree => (ResultCode::UNWILLING_TO_PERFORM, None),
            // Sortable keys take the sorted path: these could not be used.
            Path::Streamed => match sort::resolve(&job.server.schema, s) {
                Ok(_) => return,
                Err(u) => (u.code, u.attr),
            },
            Path::Refused | Path::Sorted => return,
        };
        outcome.controls.push(sort::response(code, attr.as_deref()));
    }
}
