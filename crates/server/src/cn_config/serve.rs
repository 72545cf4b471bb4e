//! cn=config served: read and changed by administrators only. To everyone
//! else it does not exist (noSuchObject), so filters and compares cannot
//! reveal anything of it.

use std::sync::Arc;

use pando_model::{Dn, Schema};
use pando_proto::{Change, ResultCode};

use super::{apply, attr_of, overlay_tree, schema_tree, stored, CONFIG_NORM};
use crate::error::{LdapError, OpResult};
use crate::live::Refused;
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
        "entries under cn=config cannot be {what}, other than schema (cn=<name>,cn=schema,cn=config) and overlays (olcOverlay=<type>,olcDatabase={{1}}mdb,cn=config); modify cn=config or olcDatabase={{1}}mdb,cn=config"
    ))
}

/// A modify of the configuration entry `norm`.
pub async fn modify(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    dn_text: &str,
    norm: &str,
    changes: &[Change],
) -> OpResult<()> {
    let record = crate::observe::audit::Record::Modify {
        dn: dn_text,
        changes,
        passwords: None,
    };
    change(server, who, relax, dn_text, record, |desired| {
        if is_schema(norm) {
            schema_tree::modify(desired, norm, changes)
        } else if overlay_tree::is_overlay(norm) {
            overlay_tree::modify(desired, norm, changes)
        } else {
            apply(desired, norm, changes)
        }
    })
    .await
}

/// An add below cn=config: a schema document (`ldapadd -f x.ldif`) or
/// an overlay.
pub async fn add(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    req: &pando_proto::AddRequest,
    norm: &str,
) -> OpResult<()> {
    let overlay = overlay_tree::is_overlay(norm);
    if !is_schema(norm) && !overlay {
        return Err(refuse_other_writes(who, "added"));
    }
    let dn = crate::ops::parse_dn(&req.dn)?;
    let attrs: Vec<pando_model::Attribute> = req
        .attrs
        .iter()
        .map(|a| pando_model::Attribute {
            desc: a.name.clone(),
            values: a.values.clone(),
        })
        .collect();
    let record = crate::observe::audit::Record::Add {
        dn: &req.dn,
        attrs: &attrs,
    };
    change(server, who, relax, &req.dn, record, |desired| {
        if overlay {
            overlay_tree::add(desired, &dn, norm, &req.attrs)
        } else {
            schema_tree::add(desired, &dn, norm, &req.attrs)
        }
    })
    .await
}

/// A delete below cn=config: a schema document or an overlay.
pub async fn delete(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    dn_text: &str,
    norm: &str,
) -> OpResult<()> {
    let overlay = overlay_tree::is_overlay(norm);
    if !is_schema(norm) && !overlay {
        return Err(refuse_other_writes(who, "deleted"));
    }
    let record = crate::observe::audit::Record::Delete { dn: dn_text };
    change(server, who, relax, dn_text, record, |desired| {
        if overlay {
            overlay_tree::delete(desired, norm)
        } else {
            schema_tree::delete(desired, norm)
        }
    })
    .await
}

fn is_schema(norm: &str) -> bool {
    norm == schema_tree::SCHEMA_NORM || norm.ends_with(&format!(",{}", schema_tree::SCHEMA_NORM))
}

/// One change of the configuration, made by `make` from the stored one and
/// committed ([`crate::live::Live::commit`]; definitions data still uses
/// may go only with the relax rules control); or nothing changes. Changes
/// are serialised.
async fn change(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    dn_text: &str,
    record: crate::observe::audit::Record<'_>,
    make: impl FnOnce(&crate::config::Config) -> OpResult<crate::config::Config>,
) -> OpResult<()> {
    if !may_see(who) {
        return Err(no_such_object());
    }
    let live = server
        .live
        .upgrade()
        .ok_or_else(|| LdapError::new(ResultCode::UNAVAILABLE, "the server is shutting down"))?;
    let _changing = live.changing().await;
    let desired = make(&live.server().desired)?;
    let installed = live
        .commit(desired, None, relax)
        .await
        .map_err(|refused| match refused {
            Refused::Schema(e) => LdapError::new(ResultCode::INVALID_ATTRIBUTE_SYNTAX, e),
            Refused::InUse(why) => LdapError::unwilling(why),
            Refused::Invalid(e) => LdapError::new(
                ResultCode::CONSTRAINT_VIOLATION,
                format!("{}: {}", attr_of(&e.key), e.problem),
            ),
            Refused::NotApplied(e) => {
                LdapError::new(ResultCode::OTHER, format!("not applied: {e}"))
            }
            Refused::Store(e) | Refused::NotStored(stored::SaveError::Store(e)) => {
                LdapError::from(e)
            }
            Refused::NotStored(e) => LdapError::new(ResultCode::OTHER, e.to_string()),
        })?;
    let changed: Vec<String> = installed.changed.iter().map(|k| attr_of(k)).collect();
    let later: Vec<String> = installed.at_next_start.iter().map(|k| attr_of(k)).collect();
    tracing::info!(
        by = who.dn(),
        entry = dn_text,
        changed = %changed.join(", "),
        at_next_start = %later.join(", "),
        "cn=config changed"
    );
    crate::observe::audit(&installed.server, who, record);
    Ok(())
}
