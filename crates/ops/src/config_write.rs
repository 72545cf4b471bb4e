//! A write to cn=config with the controls every write honours, applied
//! here around the tree's staged change (`seams::ConfigTree::stage`), so
//! the tree, which is the configuration layer's, never sees them.

use std::sync::Arc;

use pando_model::{Entry, Schema};
use pando_proto::{oid, Control, ProtocolOp, ResultCode};

use crate::config_tree::may_see;
use crate::controls::Requested;
use crate::error::{LdapError, OpResult};
use crate::job::Operation;
use crate::seams::ConfigChange;
use crate::state::Server;
use crate::write::Written;

/// A write aimed at the entry `dn` (normalised `norm`) of cn=config, with
/// the controls every write honours applied here, in the write pipeline's
/// order (`write`), around the tree's staged change: the assertion on the
/// target (for an add, the entry added) before the change is worked out;
/// under No-Op the change checked whole but neither stored nor installed,
/// answered noOperation; pre-read and post-read of the entry. To those
/// who may not see the tree it does not exist.
pub async fn write(
    server: &Arc<Server>,
    op: Operation,
    norm: String,
    dn: String,
) -> OpResult<Written> {
    let Operation {
        who,
        request,
        controls,
        ..
    } = op;
    if !may_see(&who) {
        return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
    }
    let added = match &request {
        ProtocolOp::AddRequest(req) => Some(entry_added(req)?),
        _ => None,
    };
    let change = ConfigChange {
        who: &who,
        request: &request,
        norm: &norm,
        dn: &dn,
        relax: controls.relax,
        permissive: controls.permissive_modify,
    };
    let tree = server.rt.config_tree.clone();
    let staged = tree.stage(server, change).await?;
    if let (Some(filter), Some(entry)) = (&controls.assertion, added.as_ref().or(staged.before())) {
        crate::assertion_on_whole_entry(staged.schema(), entry, filter)?;
    }
    let before = staged.before().cloned();
    let old_schema = staged.schema().clone();
    let after = staged.finish(controls.no_op).await?;
    let schema = if controls.no_op {
        &old_schema
    } else {
        &*after.schema
    };
    let read = read_entries(schema, &controls, before.as_ref(), after.entry.as_ref());
    if controls.no_op {
        return Ok(Written {
            controls: read?,
            no_op: true,
        });
    }
    // Made: the answer says so even if an entry read cannot be encoded.
    let read = read.unwrap_or_else(|e| {
        tracing::warn!(
            entry = dn,
            "cn=config read-entry control not returned: {}",
            e.message
        );
        Vec::new()
    });
    Ok(Written {
        controls: read,
        no_op: false,
    })
}

/// The entry an add asks for, as an assertion tests it.
pub fn entry_added(req: &pando_proto::AddRequest) -> OpResult<Entry> {
    let mut entry = Entry::new(crate::parse_dn(&req.dn)?);
    for a in &req.attrs {
        entry.add_values(&a.name, a.values.clone());
    }
    Ok(entry)
}

/// RFC 4527 pre-read and post-read controls of a configuration change:
/// its readers (administrators) read every configuration entry whole, as
/// a search of cn=config returns it.
fn read_entries(
    schema: &Schema,
    controls: &Requested,
    before: Option<&Entry>,
    after: Option<&Entry>,
) -> OpResult<Vec<Control>> {
    let mut out = Vec::new();
    for (oid, wanted, entry) in [
        (oid::PRE_READ, &controls.pre_read, before),
        (oid::POST_READ, &controls.post_read, after),
    ] {
        let (Some(req), Some(entry)) = (wanted, entry) else {
            continue;
        };
        let norm = schema.normalize_dn(&entry.dn).unwrap_or_default();
        let dn = entry.dn.to_string();
        let value =
            crate::search::encode_read_entry(schema, None, None, &norm, &dn, entry, &req.attrs)?;
        out.push(Control {
            oid: oid.to_string(),
            critical: false,
            value: Some(value),
        });
    }
    Ok(out)
}
