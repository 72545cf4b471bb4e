//! cn=config served: read and changed by administrators only. To everyone
//! else it does not exist (noSuchObject), so filters and compares cannot
//! reveal anything of it.

use std::sync::{Arc, Weak};

use pando_model::{Entry, Schema};
use pando_proto::{oid, Change, Control, ModOp, PartialAttribute, ProtocolOp, ResultCode};

use super::{apply, attr_of, overlay_tree, schema_tree, stored};
use crate::error::{LdapError, OpResult};
use crate::live::{Live, Refused};
use crate::ops::config_tree::may_see;
use crate::ops::controls::Requested;
use crate::ops::operation::{written, Operation};
use crate::ops::seams::{Answer, ConfigTree};
use crate::ops::write::Written;
use crate::state::Server;
use pando_access::Identity;

/// cn=config as the operations reach it (`ops::config_tree`): its entries
/// for the configuration a server runs with, and writes applied to the
/// running configuration through `live`.
pub struct Tree {
    pub live: Weak<Live>,
}

impl ConfigTree for Tree {
    fn entries(&self, server: &Server) -> Vec<(String, Entry)> {
        super::entries(&server.desired, &server.cfg.config)
    }

    fn write<'a>(
        &'a self,
        server: &'a Arc<Server>,
        op: Operation,
        norm: String,
        dn: String,
    ) -> Answer<'a> {
        Box::pin(async move {
            let Operation {
                who,
                request,
                controls,
                ..
            } = op;
            match request {
                ProtocolOp::ModifyRequest(req) => written(
                    modify(
                        server,
                        &self.live,
                        &who,
                        &controls,
                        &dn,
                        &norm,
                        &req.changes,
                    )
                    .await,
                    ProtocolOp::ModifyResponse,
                ),
                ProtocolOp::AddRequest(req) => written(
                    add(&self.live, &who, &controls, &req, &norm).await,
                    ProtocolOp::AddResponse,
                ),
                ProtocolOp::DelRequest(_) => written(
                    delete(&self.live, &who, &controls, &dn, &norm).await,
                    ProtocolOp::DelResponse,
                ),
                _ => written(
                    Err(refuse_other_writes(&who, "renamed")),
                    ProtocolOp::ModifyDnResponse,
                ),
            }
        })
    }
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
    live: &Weak<Live>,
    who: &Identity,
    controls: &Requested,
    dn_text: &str,
    norm: &str,
    changes: &[Change],
) -> OpResult<Written> {
    let target = Target {
        dn: dn_text,
        norm,
        kind: Kind::Modify(changes),
    };
    let permissive = controls.permissive_modify;
    change(live, who, controls, target, |desired| {
        let tolerated;
        let changes = if permissive {
            let entry = entry_named(&server.schema, desired, desired, norm);
            tolerated = tolerant(changes, entry.as_ref());
            &tolerated[..]
        } else {
            changes
        };
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
    live: &Weak<Live>,
    who: &Identity,
    controls: &Requested,
    req: &pando_proto::AddRequest,
    norm: &str,
) -> OpResult<Written> {
    let overlay = overlay_tree::is_overlay(norm);
    if !is_schema(norm) && !overlay {
        return Err(refuse_other_writes(who, "added"));
    }
    let dn = crate::ops::parse_dn(&req.dn)?;
    let mut entry = Entry::new(dn.clone());
    for a in &req.attrs {
        entry.add_values(&a.name, a.values.clone());
    }
    let target = Target {
        dn: &req.dn,
        norm,
        kind: Kind::Add(entry),
    };
    change(live, who, controls, target, |desired| {
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
    live: &Weak<Live>,
    who: &Identity,
    controls: &Requested,
    dn_text: &str,
    norm: &str,
) -> OpResult<Written> {
    let overlay = overlay_tree::is_overlay(norm);
    if !is_schema(norm) && !overlay {
        return Err(refuse_other_writes(who, "deleted"));
    }
    let target = Target {
        dn: dn_text,
        norm,
        kind: Kind::Delete,
    };
    change(live, who, controls, target, |desired| {
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

/// The entry a change names, and what kind of change it is.
struct Target<'a> {
    /// As the request gave it (the audit log's record).
    dn: &'a str,
    norm: &'a str,
    kind: Kind<'a>,
}

enum Kind<'a> {
    /// With the entry to add, as requested (what an assertion tests).
    Add(Entry),
    Delete,
    Modify(&'a [Change]),
}

/// One change of the configuration, made by `make` from the stored one,
/// with the controls a data write honours, in the write pipeline's order
/// (`ops::write`): the assertion on the target (for an add, the entry
/// added) before the change is worked out; the change checked and built
/// whole ([`crate::live::Live::commit`]; definitions data still uses may
/// go only with the relax rules control); under No-Op everything but
/// storing and installing it ([`crate::live::Live::rehearse`]), answered
/// noOperation; pre-read and post-read of the entry. Changes are
/// serialised; a refused change changes nothing.
async fn change(
    live: &Weak<Live>,
    who: &Identity,
    controls: &Requested,
    target: Target<'_>,
    make: impl FnOnce(&pando_config::Config) -> OpResult<pando_config::Config>,
) -> OpResult<Written> {
    if !may_see(who) {
        return Err(no_such_object());
    }
    let live = live
        .upgrade()
        .ok_or_else(|| LdapError::new(ResultCode::UNAVAILABLE, "the server is shutting down"))?;
    let _changing = live.changing().await;
    let current = live.server();
    let before = entry_named(
        &current.schema,
        &current.desired,
        &current.cfg.config,
        target.norm,
    );
    let asserted = match &target.kind {
        Kind::Add(entry) => Some(entry),
        _ => before.as_ref(),
    };
    if let (Some(filter), Some(entry)) = (&controls.assertion, asserted) {
        crate::ops::assertion_on_whole_entry(&current.schema, entry, filter)?;
    }
    let desired = make(&current.desired)?;
    let (now, running) = if controls.no_op {
        let running = live
            .rehearse(&desired, controls.relax)
            .await
            .map_err(refused)?;
        (current, running)
    } else {
        let installed = live
            .commit(desired.clone(), None, controls.relax)
            .await
            .map_err(refused)?;
        log_installed(&installed, who, target.dn);
        let running = installed.server.cfg.config.clone();
        (installed.server, running)
    };
    let after = match target.kind {
        Kind::Delete => None,
        _ => entry_named(&now.schema, &desired, &running, target.norm),
    };
    if controls.no_op {
        let read = read_entries(&now.schema, controls, before.as_ref(), after.as_ref())?;
        return Ok(Written {
            controls: read,
            no_op: true,
        });
    }
    audit(&now, who, &target, after.as_ref());
    // Made: the answer says so even if an entry read cannot be encoded.
    let read =
        read_entries(&now.schema, controls, before.as_ref(), after.as_ref()).unwrap_or_else(|e| {
            tracing::warn!(
                entry = target.dn,
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

/// A refused configuration as the operation's error.
fn refused(r: Refused) -> LdapError {
    match r {
        Refused::Schema(e) => LdapError::new(ResultCode::INVALID_ATTRIBUTE_SYNTAX, e),
        Refused::InUse(why) => LdapError::unwilling(why),
        Refused::Invalid(e) => LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("{}: {}", attr_of(&e.key), e.problem),
        ),
        Refused::NotApplied(e) => LdapError::new(ResultCode::OTHER, format!("not applied: {e}")),
        Refused::Store(e) | Refused::NotStored(stored::SaveError::Store(e)) => LdapError::from(e),
        Refused::NotStored(e) => LdapError::new(ResultCode::OTHER, e.to_string()),
    }
}

fn log_installed(installed: &crate::live::Installed, who: &Identity, dn_text: &str) {
    let changed: Vec<String> = installed.changed.iter().map(|k| attr_of(k)).collect();
    let later: Vec<String> = installed.at_next_start.iter().map(|k| attr_of(k)).collect();
    tracing::info!(
        by = who.dn(),
        entry = dn_text,
        changed = %changed.join(", "),
        at_next_start = %later.join(", "),
        "cn=config changed"
    );
}

/// The entry named `norm` of the configuration `desired` (running as
/// `running`), as a read shows it. An entry named without its `{n}`
/// (`olcOverlay=memberof`, as added) is found under the `{n}` name it has.
fn entry_named(
    schema: &Schema,
    desired: &pando_config::Config,
    running: &pando_config::Config,
    norm: &str,
) -> Option<Entry> {
    let made = super::entries(desired, running);
    let norm_of = |e: &Entry| schema.normalize_dn(&e.dn).ok();
    let unordered = |n: &str| {
        let (rdn, rest) = n.split_once(',').unwrap_or((n, ""));
        let (attr, value) = rdn.split_once('=').unwrap_or(("", rdn));
        format!("{attr}={},{rest}", super::split_ordinal(value).1)
    };
    let names: Vec<Option<String>> = made.iter().map(|(_, e)| norm_of(e)).collect();
    let exact = names.iter().position(|n| n.as_deref() == Some(norm));
    let found = exact.or_else(|| {
        let wanted = unordered(norm);
        names
            .iter()
            .position(|n| n.as_deref().is_some_and(|n| unordered(n) == wanted))
    })?;
    made.into_iter().nth(found).map(|(_, e)| e)
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
        let value = crate::ops::search::encode_read_entry(
            schema, None, None, &norm, &dn, entry, &req.attrs,
        )?;
        out.push(Control {
            oid: oid.to_string(),
            critical: false,
            value: Some(value),
        });
    }
    Ok(out)
}

/// The audit log's record of a change made. A modify of an attribute that
/// may hold a credential (a consumer's password) is logged as a replace
/// with the values a read shows afterwards, never with what was sent.
fn audit(server: &Server, who: &Identity, target: &Target<'_>, after: Option<&Entry>) {
    use pando_observe::audit::Record;
    match &target.kind {
        Kind::Add(entry) => crate::ops::audit::write(
            server,
            who,
            Record::Add {
                dn: target.dn,
                attrs: &entry.attrs,
            },
        ),
        Kind::Delete => crate::ops::audit::write(server, who, Record::Delete { dn: target.dn }),
        Kind::Modify(changes) => {
            let logged = without_secrets(changes, after);
            crate::ops::audit::write(
                server,
                who,
                Record::Modify {
                    dn: target.dn,
                    changes: &logged,
                    passwords: None,
                },
            )
        }
    }
}

/// Whether values of the configuration attribute `name` may hold a
/// credential.
fn holds_secrets(name: &str) -> bool {
    super::key_for_attr(name).is_some_and(|k| k.key == "replication.consumer")
}

/// `changes` with every change of an attribute holding secrets replaced
/// by one replace with its values in `after` (as shown: hidden).
fn without_secrets(changes: &[Change], after: Option<&Entry>) -> Vec<Change> {
    let mut out: Vec<Change> = Vec::with_capacity(changes.len());
    for ch in changes {
        if !holds_secrets(&ch.attr.name) {
            out.push(ch.clone());
            continue;
        }
        if out
            .iter()
            .any(|c| c.attr.name.eq_ignore_ascii_case(&ch.attr.name))
        {
            continue;
        }
        let values = after
            .and_then(|e| e.get(&ch.attr.name))
            .map(|a| a.values.clone())
            .unwrap_or_default();
        out.push(Change {
            op: ModOp::Replace,
            attr: PartialAttribute {
                name: ch.attr.name.clone(),
                values,
            },
        });
    }
    out
}

/// Permissive modify: adding a value the entry holds, or deleting one it
/// does not, is no error (that value is left out of the change; a change
/// left without values goes, since a delete without values removes them
/// all).
fn tolerant(changes: &[Change], entry: Option<&Entry>) -> Vec<Change> {
    let Some(entry) = entry else {
        return changes.to_vec();
    };
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    changes
        .iter()
        .filter_map(|ch| {
            let have: Vec<String> = entry
                .get(&ch.attr.name)
                .map(|a| a.values.iter().map(|v| text(v)).collect())
                .unwrap_or_default();
            let held = |v: &Vec<u8>| {
                let v = text(v);
                let bare = super::split_ordinal(&v).1;
                have.iter()
                    .any(|h| *h == v || super::split_ordinal(h).1 == bare)
            };
            let kept: Vec<Vec<u8>> = match ch.op {
                ModOp::Add => ch
                    .attr
                    .values
                    .iter()
                    .filter(|v| !held(v))
                    .cloned()
                    .collect(),
                ModOp::Delete if !ch.attr.values.is_empty() => {
                    ch.attr.values.iter().filter(|v| held(v)).cloned().collect()
                }
                _ => return Some(ch.clone()),
            };
            (!kept.is_empty()).then(|| Change {
                op: ch.op,
                attr: PartialAttribute {
                    name: ch.attr.name.clone(),
                    values: kept,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_model::Dn;

    fn change(op: ModOp, name: &str, values: &[&str]) -> Change {
        Change {
            op,
            attr: PartialAttribute {
                name: name.into(),
                values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
            },
        }
    }

    fn entry(attrs: &[(&str, &[&str])]) -> Entry {
        let mut e = Entry::new(Dn::parse("cn=config").unwrap());
        for (name, values) in attrs {
            e.add_values(name, values.iter().map(|v| v.as_bytes().to_vec()).collect());
        }
        e
    }

    #[test]
    fn permissive_modify_leaves_out_what_is_already_so() {
        let e = entry(&[
            ("pandoListen", &["ldapi://", "ldap://a"]),
            ("olcAccess", &["{0}to * by * read"]),
        ]);
        let asked = [
            change(ModOp::Add, "pandoListen", &["ldapi://", "ldap://b"]),
            change(ModOp::Delete, "pandoListen", &["ldap://gone"]),
            change(ModOp::Delete, "olcAccess", &["to * by * read"]),
            change(ModOp::Replace, "olcSizeLimit", &["5"]),
        ];
        let kept = tolerant(&asked, Some(&e));
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[0].attr.values, vec![b"ldap://b".to_vec()]);
        assert_eq!(kept[1].attr.name, "olcAccess");
        assert_eq!(kept[2].attr.name, "olcSizeLimit");
    }

    #[test]
    fn the_audit_record_carries_no_consumer_password() {
        let shown = r#"{ rid = 1, credentials = "****" }"#;
        let after = entry(&[("pandoReplicationConsumer", &[shown])]);
        let sent = [
            change(
                ModOp::Delete,
                "pandoReplicationConsumer",
                &[r#"{ rid = 1, credentials = "old" }"#],
            ),
            change(
                ModOp::Add,
                "pandoReplicationConsumer",
                &[r#"{ rid = 1, credentials = "new" }"#],
            ),
            change(ModOp::Replace, "olcSizeLimit", &["5"]),
        ];
        let logged = without_secrets(&sent, Some(&after));
        assert_eq!(logged.len(), 2);
        assert_eq!(logged[0].op, ModOp::Replace);
        assert_eq!(logged[0].attr.values, vec![shown.as_bytes().to_vec()]);
        assert_eq!(logged[1].attr.name, "olcSizeLimit");
    }
}
