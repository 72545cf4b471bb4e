//! cn=config served: read and changed by administrators only. To everyone
//! else it does not exist (noSuchObject), so filters and compares cannot
//! reveal anything of it. A change is staged here and finished by the
//! operations (`ops::config_write::write`), which apply the write controls
//! around it; this file never sees them.

use std::sync::{Arc, Weak};

use pando_model::{Entry, Schema};
use pando_proto::{Change, ModOp, PartialAttribute, ProtocolOp, ResultCode};

use super::{apply, attr_of, overlay_tree, schema_tree, stored};
use crate::error::{LdapError, OpResult};
use crate::live::{Live, Refused};
use crate::ops::config_tree::may_see;
use crate::ops::seams::{ConfigAfter, ConfigChange, ConfigFuture, ConfigTree, StagedConfig};
use crate::state::Server;
use pando_access::Identity;

/// cn=config as the operations reach it (`ops::config_tree`): its entries
/// for the configuration a server runs with, and changes applied to the
/// running configuration through `live`.
pub struct Tree {
    pub live: Weak<Live>,
}

impl ConfigTree for Tree {
    fn entries(&self, server: &Server) -> Vec<(String, Entry)> {
        super::entries(&server.desired, &server.cfg.config)
    }

    fn shared_state(&self, server: &Server) -> Result<Vec<u8>, String> {
        let rtxn = server.rt.store.read().map_err(|e| e.to_string())?;
        let stamps = super::stored::stamps(&rtxn.view()).map_err(|e| e.to_string())?;
        Ok(super::shared::state_text(&server.desired, &stamps)?.into_bytes())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn stage<'a>(
        &'a self,
        _server: &'a Arc<Server>,
        change: ConfigChange<'a>,
    ) -> ConfigFuture<'a, Box<dyn StagedConfig<'a> + 'a>> {
        Box::pin(async move {
            let kind = kind_of(&change)?;
            let live = self.live.upgrade().ok_or_else(|| {
                LdapError::new(ResultCode::UNAVAILABLE, "the server is shutting down")
            })?;
            let changing = live.changing().await;
            let current = live.server();
            let before = entry_named(
                &current.schema,
                &current.desired,
                &current.cfg.config,
                change.norm,
            );
            let staged: Box<dyn StagedConfig<'a> + 'a> = Box::new(Staged {
                _changing: changing,
                live,
                current,
                before,
                change,
                kind,
            });
            Ok(staged)
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

fn is_schema(norm: &str) -> bool {
    norm == schema_tree::SCHEMA_NORM || norm.ends_with(&format!(",{}", schema_tree::SCHEMA_NORM))
}

/// What a change does to the configuration.
enum Kind<'a> {
    /// A schema document or an overlay (`overlay`), with its entry as
    /// requested (its DN, and the audit log's record).
    Add {
        overlay: bool,
        entry: Entry,
        attrs: &'a [PartialAttribute],
    },
    /// A schema document or an overlay (`overlay`).
    Delete {
        overlay: bool,
    },
    Modify(&'a [Change]),
}

/// What `change` does, or why the tree does not take it.
fn kind_of<'a>(change: &ConfigChange<'a>) -> OpResult<Kind<'a>> {
    let overlay = overlay_tree::is_overlay(change.norm);
    let other = !is_schema(change.norm) && !overlay;
    match change.request {
        ProtocolOp::ModifyRequest(req) => Ok(Kind::Modify(&req.changes)),
        ProtocolOp::AddRequest(_) if other => Err(refuse_other_writes(change.who, "added")),
        ProtocolOp::AddRequest(req) => Ok(Kind::Add {
            overlay,
            entry: crate::ops::config_write::entry_added(req)?,
            attrs: &req.attrs,
        }),
        ProtocolOp::DelRequest(_) if other => Err(refuse_other_writes(change.who, "deleted")),
        ProtocolOp::DelRequest(_) => Ok(Kind::Delete { overlay }),
        _ => Err(refuse_other_writes(change.who, "renamed")),
    }
}

/// A change of the configuration begun: other changes wait until it is
/// finished or dropped. A refused change changes nothing.
struct Staged<'a> {
    _changing: tokio::sync::OwnedMutexGuard<()>,
    live: Arc<Live>,
    /// The server running when the change began.
    current: Arc<Server>,
    before: Option<Entry>,
    change: ConfigChange<'a>,
    kind: Kind<'a>,
}

impl<'a> StagedConfig<'a> for Staged<'a> {
    fn before(&self) -> Option<&Entry> {
        self.before.as_ref()
    }

    fn schema(&self) -> &Arc<Schema> {
        &self.current.schema
    }

    fn finish(self: Box<Self>, rehearse: bool) -> ConfigFuture<'a, ConfigAfter> {
        Box::pin(async move {
            let desired = self.desired()?;
            let relax = self.change.relax;
            let (now, running) = if rehearse {
                let running = self.live.rehearse(&desired, relax).await.map_err(refused)?;
                (self.current.clone(), running)
            } else {
                let stamp = crate::live::Stamp::New(self.current.rt.csn.next());
                let installed = self
                    .live
                    .commit(desired.clone(), None, relax, stamp)
                    .await
                    .map_err(refused)?;
                log_installed(&installed, self.change.who, self.change.dn);
                let running = installed.server.cfg.config.clone();
                (installed.server, running)
            };
            let entry = match self.kind {
                Kind::Delete { .. } => None,
                _ => entry_named(&now.schema, &desired, &running, self.change.norm),
            };
            if !rehearse {
                self.audit(&now, entry.as_ref());
            }
            Ok(ConfigAfter {
                entry,
                schema: now.schema.clone(),
            })
        })
    }
}

impl Staged<'_> {
    /// The configuration the change asks for, made from the stored one.
    fn desired(&self) -> OpResult<pando_config::Config> {
        let desired = &self.current.desired;
        let norm = self.change.norm;
        match &self.kind {
            Kind::Modify(changes) => {
                let tolerated;
                let changes = if self.change.permissive {
                    let entry = entry_named(&self.current.schema, desired, desired, norm);
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
            }
            Kind::Add {
                overlay: true,
                entry,
                attrs,
            } => overlay_tree::add(desired, &entry.dn, norm, attrs),
            Kind::Add { entry, attrs, .. } => schema_tree::add(desired, &entry.dn, norm, attrs),
            Kind::Delete { overlay: true } => overlay_tree::delete(desired, norm),
            Kind::Delete { .. } => schema_tree::delete(desired, norm),
        }
    }

    /// The audit log's record of the change made. A modify of an
    /// attribute that may hold a credential (a consumer's or a push's password) is
    /// logged as a replace with the values a read shows afterwards, never
    /// with what was sent.
    fn audit(&self, server: &Server, after: Option<&Entry>) {
        use pando_observe::audit::Record;
        let (who, dn) = (self.change.who, self.change.dn);
        match &self.kind {
            Kind::Add { entry, .. } => crate::ops::audit::write(
                server,
                who,
                Record::Add {
                    dn,
                    attrs: &entry.attrs,
                },
            ),
            Kind::Delete { .. } => crate::ops::audit::write(server, who, Record::Delete { dn }),
            Kind::Modify(changes) => {
                let logged = without_secrets(changes, after);
                crate::ops::audit::write(
                    server,
                    who,
                    Record::Modify {
                        dn,
                        changes: &logged,
                        passwords: None,
                    },
                )
            }
        }
    }
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

/// Whether values of the configuration attribute `name` may hold a
/// credential.
fn holds_secrets(name: &str) -> bool {
    super::key_for_attr(name)
        .is_some_and(|k| matches!(k.key, "replication.consumer" | "replication.push"))
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
