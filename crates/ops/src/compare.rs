//! Compare (RFC 4511 4.10).

use std::sync::Arc;

use pando_proto::{CompareRequest, ResultCode};

use super::controls::Requested;
use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::Identity;

/// compareTrue / compareFalse as a successful result code.
/// With the assertion control (RFC 4528), the entry must match it first
/// (else assertionFailed).
pub fn compare(
    server: &Arc<Server>,
    who: &Identity,
    controls: &Requested,
    req: &CompareRequest,
) -> OpResult<ResultCode> {
    let schema = &*server.schema;
    let dn = super::parse_dn(&req.dn)?;
    let (at, want) = assertion(schema, req)?;
    // cn=config (administrators only): its entries are made, not stored.
    if let Some(norm) = super::config_tree::under_config(schema, &dn) {
        let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
        if !super::config_tree::may_see(who) {
            return Err(no_such());
        }
        let entries = server.rt.config_tree.entries(server);
        let entry = entries
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| schema.normalize_dn(&e.dn).is_ok_and(|n| n == norm))
            .ok_or_else(no_such)?;
        if let Some(filter) = &controls.assertion {
            super::assertion_on_whole_entry(schema, &entry, filter)?;
        }
        return compare_values(schema, at, &want, &entry.attrs);
    }
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let id = super::resolve_for(server, &view, who, &dn)?;
    let attrs = view.attrs(id)?.unwrap_or_default();
    let norm = super::norm_dn_of(&view, id)?;
    let entry = pando_model::Entry {
        dn: pando_model::Dn { rdns: Vec::new() },
        attrs,
    };
    compare_entry(server, &view, who, controls, &norm, &entry, req)
}

/// Compare against `entry` (named `norm`), as the requester may: compare
/// access to the attribute, the assertion control, then the values.
pub fn compare_entry(
    server: &Server,
    view: &pando_store::View<'_>,
    who: &Identity,
    controls: &Requested,
    norm: &str,
    entry: &pando_model::Entry,
    req: &CompareRequest,
) -> OpResult<ResultCode> {
    let schema = &*server.schema;
    let (at, want) = assertion(schema, req)?;
    super::require(
        server,
        view,
        who,
        norm,
        entry,
        &[(Some(at), pando_access::acl::COMPARE)],
    )?;
    if let Some(filter) = &controls.assertion {
        if !super::assertion_holds(server, view, who, norm, entry, filter) {
            return Err(super::assertion_failed());
        }
    }
    compare_values(schema, at, &want, &entry.attrs)
}

/// The attribute type the compare asks about (it must have an equality
/// rule) and the value asserted, normalised.
fn assertion<'s>(
    schema: &'s pando_model::Schema,
    req: &CompareRequest,
) -> OpResult<(&'s pando_model::AttributeType, Vec<u8>)> {
    let (_, at) = schema.canonical_desc(&req.ava.attr)?;
    if at.equality.is_none() {
        return Err(LdapError::new(
            ResultCode::INAPPROPRIATE_MATCHING,
            format!("{} has no equality matching rule", at.name()),
        ));
    }
    let want = schema.normalize(at, &req.ava.value).map_err(|e| {
        LdapError::new(
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            format!("{}: value invalid per syntax: {e}", at.name()),
        )
    })?;
    Ok((at, want.to_vec()))
}

/// compareTrue when a value of `at` (or a subtype) in `attrs` normalises to
/// `want`, compareFalse when there are values but none does.
fn compare_values(
    schema: &pando_model::Schema,
    at: &pando_model::AttributeType,
    want: &[u8],
    attrs: &[pando_model::Attribute],
) -> OpResult<ResultCode> {
    let mut present = false;
    for a in attrs {
        let base = pando_model::desc::base(&a.desc);
        let Some(t) = schema.attribute(base) else {
            continue;
        };
        if !schema.is_subtype(t, at) {
            continue;
        }
        present = true;
        if a.values
            .iter()
            .any(|v| schema.normalize(t, v).is_ok_and(|n| n[..] == *want))
        {
            return Ok(ResultCode::COMPARE_TRUE);
        }
    }
    if present {
        Ok(ResultCode::COMPARE_FALSE)
    } else {
        Err(LdapError::new(
            ResultCode::NO_SUCH_ATTRIBUTE,
            format!("entry has no {} attribute", at.name()),
        ))
    }
}
