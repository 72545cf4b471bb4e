//! The steps of a change that reach beyond the new `Server`: checks made
//! against the store before anything changes, and what follows the
//! install (the store's catalog, consumers, the server ID, suffix entries).

use std::collections::BTreeSet;
use std::sync::Arc;

use pando_model::{Dn, Schema};

use super::Refused;
use crate::state::Server;
use pando_config::{Config, Resolved};

/// Run the store check `f` on the blocking pool: its refusal (`Some`)
/// becomes [`Refused::InUse`].
async fn check<F>(what: &str, f: F) -> Result<(), Refused>
where
    F: FnOnce() -> Result<Option<String>, pando_store::StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(why))) => Err(Refused::InUse(why)),
        Ok(Err(e)) => Err(Refused::Store(e)),
        Err(_) => Err(Refused::NotApplied(format!("the {what} check failed"))),
    }
}

/// The schema `desired` makes: the current one when its schema files and
/// documents are unchanged. Refused while stored entries use what it
/// removes or redefines, unless `relax`.
pub(super) async fn schema_for(
    current: &Server,
    desired: &Config,
    relax: bool,
) -> Result<Arc<Schema>, Refused> {
    if desired.schema_files == current.desired.schema_files
        && desired.schema == current.desired.schema
        && desired.posix_schema == current.desired.posix_schema
    {
        return Ok(current.schema.clone());
    }
    let built = pando_config::schema_files::build(desired)
        .map(Arc::new)
        .map_err(Refused::Schema)?;
    if !relax {
        let (store, old, new) = (
            current.rt.store.clone(),
            current.schema.clone(),
            built.clone(),
        );
        check("schema usage", move || {
            crate::cn_config::schema_tree::still_used(&store, &old, &new)
        })
        .await?;
    }
    Ok(built)
}

/// Refuse to remove a suffix that holds entries.
pub(super) async fn check_suffixes(
    current: &Server,
    resolved: &Resolved,
    schema: &Schema,
) -> Result<(), Refused> {
    let norm = |d: &Dn| schema.normalize_dn(d).unwrap_or_default();
    let kept: Vec<String> = resolved.suffixes.iter().map(norm).collect();
    let removed: Vec<Dn> = current
        .cfg
        .suffixes
        .iter()
        .filter(|d| !kept.contains(&norm(d)))
        .cloned()
        .collect();
    if removed.is_empty() {
        return Ok(());
    }
    let store = current.rt.store.clone();
    check("suffix", move || suffix_in_use(&store, &removed)).await
}

/// What the store's catalog takes with the stored configuration: the
/// indexes added and dropped, and the schema when it changed.
pub(super) fn catalog_change(current: &Server, next: &Server) -> pando_store::CatalogChange {
    let mut change = index_changes(&current.cfg.indexes, &next.cfg.indexes);
    if !Arc::ptr_eq(&current.schema, &next.schema) {
        change.schema = Some(next.schema.clone());
    }
    change
}

/// After `server` replaced `before`: the server ID CSNs carry, the
/// consumers and pushes running, the entries of new suffixes.
pub(super) async fn follow(server: &Arc<Server>, before: &Server) {
    let (old, new) = (
        &before.cfg.config.replication,
        &server.cfg.config.replication,
    );
    if old.server_id != new.server_id {
        server.rt.csn.set_sid(new.server_id);
        tracing::info!(
            server_id = new.server_id,
            "server ID changed: new CSNs carry it"
        );
    }
    if old.consumer != new.consumer {
        crate::repl::Replicas::of(server)
            .follow_configuration(server)
            .await;
    }
    if old.push != new.push {
        crate::repl::Replicas::of(server)
            .follow_pushes(server)
            .await;
    }
    if server.cfg.suffixes != before.cfg.suffixes {
        make_suffix_entries(server, before).await;
    }
}

/// Why one of the suffixes `removed` cannot go: it holds entries (the
/// count and an example DN). A suffix removed with entries would leave
/// them stored and unreachable.
fn suffix_in_use(
    store: &pando_store::Store,
    removed: &[Dn],
) -> Result<Option<String>, pando_store::StoreError> {
    let rtxn = store.read()?;
    let view = rtxn.view();
    for dn in removed {
        let Ok(pando_store::Lookup::Found(id)) = view.lookup(dn)? else {
            continue;
        };
        let below = view.children_up_to(id, 1)?;
        let example = match below.first() {
            Some(child) => view.dn(*child)?.to_string(),
            None => dn.to_string(),
        };
        let count = view
            .subtree(id, 1_000_000)?
            .map_or("over 1000000".to_string(), |s| s.len().to_string());
        return Ok(Some(format!(
            "suffix {dn} holds {count} entries (for example {example}): delete them (or export them) before removing it"
        )));
    }
    Ok(None)
}

/// Make the entries of suffixes `server` has and `before` had not (as at
/// start: not those a consumer replicates). A failure is logged: the
/// suffix is configured, and its entry can be added over LDAP.
async fn make_suffix_entries(server: &Arc<Server>, before: &Server) {
    let schema = server.schema.clone();
    let had: Vec<String> = before
        .cfg
        .suffixes
        .iter()
        .filter_map(|d| schema.normalize_dn(d).ok())
        .collect();
    let new: Vec<Dn> = crate::own_suffixes(&server.cfg, &schema)
        .into_iter()
        .filter(|d| schema.normalize_dn(d).is_ok_and(|n| !had.contains(&n)))
        .collect();
    if new.is_empty() {
        return;
    }
    match crate::bootstrap::ensure_suffixes(server, &new).await {
        Ok(created) => {
            for dn in created {
                tracing::info!(suffix = %dn, "suffix entry created");
            }
        }
        Err(e) => tracing::error!("the new suffix's entry could not be made: {e}"),
    }
}

/// The indexes to add and drop to go from `old` to `new`.
fn index_changes(
    old: &[pando_store::IndexSpec],
    new: &[pando_store::IndexSpec],
) -> pando_store::CatalogChange {
    fn pairs(specs: &[pando_store::IndexSpec]) -> BTreeSet<(String, pando_store::IndexKind)> {
        specs
            .iter()
            .flat_map(|s| s.kinds.iter().map(|k| (s.attr.to_ascii_lowercase(), *k)))
            .collect()
    }
    let (old, new) = (pairs(old), pairs(new));
    pando_store::CatalogChange {
        schema: None,
        add: new.difference(&old).cloned().collect(),
        drop: old.difference(&new).cloned().collect(),
    }
}
