//! cn=config served: read and changed by administrators only. To everyone
//! else it does not exist (noSuchObject), so filters and compares cannot
//! reveal anything of it.

use std::sync::Arc;

use pando_model::{Dn, Schema};
use pando_proto::{Change, ResultCode};

use super::{apply, attr_of, stored, CONFIG_NORM};
use crate::error::{LdapError, OpResult};
use crate::state::{Identity, Server};

/// The normalised DN when `dn` names cn=config or an entry below it.
pub fn under_config(schema: &Schema, dn: &Dn) -> Option<String> {
    // Only a last RDN of `cn=config` can be: others skip the normalising.
    let last = dn.rdns.last()?;
    if last.avas.len() != 1 || !last.avas[0].value.eq_ignore_ascii_case(b"config") {
        return None;
    }
    let norm = schema.normalize_dn(dn).ok()?;
    (norm == CONFIG_NORM || norm.ends_with(",cn=config")).then_some(norm)
}

/// Who may read and change the configuration.
pub fn may_see(who: &Identity) -> bool {
    who.is_admin() || who.is_break_glass()
}

fn no_such_object() -> LdapError {
    LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")
}

/// Add, delete and rename under cn=config: its entries are fixed.
pub fn refuse_other_writes(who: &Identity, what: &str) -> LdapError {
    if !may_see(who) {
        return no_such_object();
    }
    LdapError::unwilling(format!(
        "entries under cn=config cannot be {what}; modify cn=config or olcDatabase={{1}}mdb,cn=config"
    ))
}

/// A modify of the configuration entry `norm`: the new configuration is
/// made from the entry's changed values, validated whole, stored in one
/// transaction and installed, or nothing changes. Changes are serialised.
pub async fn modify(
    server: &Arc<Server>,
    who: &Identity,
    dn_text: &str,
    norm: &str,
    changes: &[Change],
) -> OpResult<()> {
    if !may_see(who) {
        return Err(no_such_object());
    }
    let live = server
        .live
        .upgrade()
        .ok_or_else(|| LdapError::new(ResultCode::UNAVAILABLE, "the server is shutting down"))?;
    let _changing = live.changing().await;
    let current = live.server();
    let desired = apply(&current.desired, norm, changes)?;
    let resolved = desired.clone().validate(&current.schema).map_err(|e| {
        LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("{}: {}", attr_of(&e.key), e.problem),
        )
    })?;
    let prepared = live
        .prepare(resolved, current.schema.clone())
        .map_err(|e| LdapError::new(ResultCode::OTHER, format!("not applied: {e}")))?;
    let text = stored::to_text(&desired).map_err(|e| LdapError::new(ResultCode::OTHER, e))?;
    // Stored first: a crash from here on restarts with the new
    // configuration; a failed write leaves the old one running.
    current
        .store
        .write(move |w| stored::put(w, &text, None))
        .await
        .map_err(LdapError::from)?;
    let changed: Vec<String> = prepared.changed.iter().map(|k| attr_of(k)).collect();
    let later: Vec<String> = prepared.at_next_start.iter().map(|k| attr_of(k)).collect();
    let installed = live.install_prepared(prepared);
    tracing::info!(
        by = who.dn(),
        entry = dn_text,
        changed = %changed.join(", "),
        at_next_start = %later.join(", "),
        "cn=config changed"
    );
    crate::observe::audit(
        &installed,
        who,
        crate::observe::audit::Record::Modify {
            dn: dn_text,
            changes,
            passwords: None,
        },
    );
    Ok(())
}
