//! Compare (RFC 4511 4.10).

use std::sync::Arc;

use pando_proto::{CompareRequest, ResultCode};

use super::controls::Requested;
use crate::error::{LdapError, OpResult};
use crate::state::{Identity, Server};

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
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let id = super::resolve_for(server, &view, who, &dn)?;
    let attrs = view.attrs(id)?.unwrap_or_default();
    let norm = super::norm_dn_of(&view, id)?;
    let entry = pando_model::Entry {
        dn: pando_model::Dn { rdns: Vec::new() },
        attrs,
    };
    super::require(
        server,
        &view,
        who,
        &norm,
        &entry,
        &[(Some(at), crate::acl::COMPARE)],
    )?;
    if let Some(filter) = &controls.assertion {
        if !super::assertion_holds(server, &view, who, &norm, &entry, filter) {
            return Err(LdapError::new(
                ResultCode::ASSERTION_FAILED,
                "the assertion control's filter is not true for the entry",
            ));
        }
    }
    let attrs = entry.attrs;
    let mut present = false;
    for a in &attrs {
        let base = a.desc.split(';').next().unwrap_or("");
        let Some(t) = schema.attribute(base) else {
            continue;
        };
        if !schema.is_subtype(t, at) {
            continue;
        }
        present = true;
        if a.values
            .iter()
            .any(|v| schema.normalize(t, v).is_ok_and(|n| n == want))
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
