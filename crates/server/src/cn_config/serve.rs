//! cn=config served: read and changed by administrators only. To everyone
//! else it does not exist (noSuchObject), so filters and compares cannot
//! reveal anything of it.

use std::sync::Arc;

use pando_model::{Dn, Schema};
use pando_proto::{Change, ResultCode};

use super::{apply, attr_of, schema_tree, stored, CONFIG_NORM};
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
        } else {
            apply(desired, norm, changes)
        }
    })
    .await
}

/// An add below cn=config: a schema document (`ldapadd -f x.ldif`).
pub async fn add(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    req: &pando_proto::AddRequest,
    norm: &str,
) -> OpResult<()> {
    if !is_schema(norm) {
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
        schema_tree::add(desired, &dn, norm, &req.attrs)
    })
    .await
}

/// A delete below cn=config: a schema document.
pub async fn delete(
    server: &Arc<Server>,
    who: &Identity,
    relax: bool,
    dn_text: &str,
    norm: &str,
) -> OpResult<()> {
    if !is_schema(norm) {
        return Err(refuse_other_writes(who, "deleted"));
    }
    let record = crate::observe::audit::Record::Delete { dn: dn_text };
    change(server, who, relax, dn_text, record, |desired| {
        schema_tree::delete(desired, norm)
    })
    .await
}

fn is_schema(norm: &str) -> bool {
    norm == schema_tree::SCHEMA_NORM || norm.ends_with(&format!(",{}", schema_tree::SCHEMA_NORM))
}

/// One change of the configuration, made by `make` from the stored one:
/// validated whole (against the schema it makes, when it changes the
/// schema; definitions data still uses may go only with the relax rules
/// control), stored in one transaction, installed; or nothing changes.
/// Changes are serialised.
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
    let current = live.server();
    let desired = make(&current.desired)?;
    let schema = if desired.schema_files == current.desired.schema_files
        && desired.schema == current.desired.schema
    {
        current.schema.clone()
    } else {
        let built = crate::schema_files::build(&desired.schema_files, &desired.schema)
            .map_err(|e| LdapError::new(ResultCode::INVALID_ATTRIBUTE_SYNTAX, e))?;
        let built = Arc::new(built);
        if !relax {
            let (store, old, new) = (current.store.clone(), current.schema.clone(), built.clone());
            let used = tokio::task::spawn_blocking(move || still_used(&store, &old, &new))
                .await
                .map_err(|_| LdapError::new(ResultCode::OTHER, "the usage check failed"))??;
            if let Some(why) = used {
                return Err(LdapError::unwilling(why));
            }
        }
        built
    };
    let resolved = desired.clone().validate(&schema).map_err(|e| {
        LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("{}: {}", attr_of(&e.key), e.problem),
        )
    })?;
    let prepared = live
        .prepare(resolved, schema)
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
    crate::observe::audit(&installed, who, record);
    Ok(())
}

/// Why the schema `new` cannot replace `old` while entries use what it
/// removes or redefines (None: nothing stored uses it). Reads every entry.
pub(crate) fn still_used(
    store: &pando_store::Store,
    old: &Schema,
    new: &Schema,
) -> OpResult<Option<String>> {
    let gone_types: Vec<&pando_model::AttributeType> = old
        .attributes()
        .filter(|a| {
            new.attribute(&a.oid)
                .is_none_or(|n| n.definition != a.definition)
        })
        .collect();
    let gone_classes: Vec<&pando_model::ObjectClass> = old
        .object_classes()
        .filter(|c| {
            new.object_class(&c.oid)
                .is_none_or(|n| n.definition != c.definition)
        })
        .collect();
    if gone_types.is_empty() && gone_classes.is_empty() {
        return Ok(None);
    }
    let rtxn = store.read()?;
    let view = rtxn.view();
    let mut uses: Vec<(String, u64, Option<String>)> = Vec::new();
    let mut note = |what: String, id: pando_store::EntryId| -> OpResult<()> {
        match uses.iter_mut().find(|(w, _, _)| *w == what) {
            Some(u) => u.1 += 1,
            None => uses.push((what, 1, Some(view.dn_string(id)?))),
        }
        Ok(())
    };
    for root in view.roots()? {
        let Some(ids) = view.subtree(root, u64::MAX)? else {
            continue;
        };
        for id in ids {
            let Some(attrs) = view.attrs(id)? else {
                continue;
            };
            for a in &attrs {
                let base = a.desc.split(';').next().unwrap_or("");
                if let Some(t) = gone_types
                    .iter()
                    .find(|t| t.has_name(base) || t.oid == base)
                {
                    note(format!("attribute type {}", t.name()), id)?;
                }
                if a.desc.eq_ignore_ascii_case("objectClass") {
                    for v in &a.values {
                        let v = String::from_utf8_lossy(v);
                        if let Some(c) = gone_classes.iter().find(|c| c.has_name(&v) || c.oid == v)
                        {
                            note(format!("object class {}", c.name()), id)?;
                        }
                    }
                }
            }
        }
    }
    Ok(uses.first().map(|(what, n, example)| {
        format!(
            "{what} is used by {n} entr{} (e.g. {}); change or delete {} first, or send the relax rules control (administrators) to remove it anyway",
            if *n == 1 { "y" } else { "ies" },
            example.as_deref().unwrap_or("?"),
            if *n == 1 { "it" } else { "them" },
        )
    }))
}
