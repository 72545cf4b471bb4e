//! Changes a replication consumer received from its provider, applied
//! through the same pipeline as clients' writes (so they reach the change
//! log, the change feed and contextCSN, and a consumer can itself be a
//! provider), with three differences: entries are found by entryUUID, not
//! by DN; their operational attributes are kept as received (the
//! provider's CSN, UUID, timestamps and names); and the consumer's cookie
//! is written in the same transaction, so a crash keeps both or neither.
//!
//! An entry received as added or modified is made to match what was
//! received: added if no entry has its UUID (an entry found at its DN
//! with another UUID is a stale copy and is replaced), renamed or moved
//! if its DN changed, its attributes replaced when they differ. A delete
//! removes the entry and whatever is still below it here (the provider's
//! deletes of children may come after, or not at all when they were
//! outside this consumer's search).

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::sync::Cookie;
use pando_proto::{Ava, Filter, ResultCode};
use pando_store::{Candidates, EntryId, Lookup, Placement, StoreError, View, WriteTxn};

use super::{Before, Change, WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use crate::ops;

/// The replication state a received change carries into the pipeline.
#[derive(Clone, Debug)]
pub struct ReplCtx {
    /// The consumer (its `rid`), whose cookie is stored with the change.
    pub rid: u16,
    /// The cookie after this change (None: unchanged).
    pub cookie: Option<String>,
    /// The change's CSN: the operation is stamped with it, so the change
    /// log and contextCSN here say what they say on the provider. None:
    /// unknown (a delete phase names no CSN); the change log gets a CSN of
    /// this server and contextCSN moves only with the cookie.
    pub csn: Option<String>,
    /// Shared by a session's changes: set when one fails, so the changes
    /// queued after it are not written (nor their cookies).
    pub failed: Arc<std::sync::atomic::AtomicBool>,
}

/// What was received.
pub enum Received {
    /// An entry added or modified on the provider, whole (its entryUUID
    /// among its attributes).
    Entry(Entry),
    /// Entries deleted on the provider, or gone from the consumer's
    /// search, by entryUUID (text).
    Delete(Vec<String>),
    /// Nothing but the cookie.
    Cookie,
}

struct Replicated(Received);

/// Queue `received` on the writer now (see the module header): changes
/// queued one after another are applied in that order, whether or not the
/// caller waits for each.
pub fn apply_received(
    ctx: Arc<WriteCtx>,
    received: Received,
) -> impl std::future::Future<Output = OpResult<Written>> + Send + 'static {
    super::queue(ctx, Arc::new(Replicated(received)))
}

/// The meta key holding consumer `rid`'s cookie.
pub fn cookie_key(rid: u16) -> String {
    format!("syncrepl:{rid:03}")
}

/// In the change's transaction: the consumer's cookie, and its CSNs as
/// this server's context CSNs (the state it now holds, as OpenLDAP's
/// consumers keep it).
pub(super) fn store_cookie(w: &mut WriteTxn<'_>, repl: &ReplCtx) -> Result<(), StoreError> {
    let Some(cookie) = &repl.cookie else {
        return Ok(());
    };
    w.meta_put(&cookie_key(repl.rid), cookie.as_bytes())?;
    if let Ok(c) = Cookie::parse(cookie.as_bytes()) {
        for csn in &c.csns {
            w.advance_context_csn(csn)?;
        }
    }
    Ok(())
}

/// The cookie consumer `rid` stored (None: it never synchronised).
pub fn stored_cookie(view: &View<'_>, rid: u16) -> Result<Option<String>, StoreError> {
    Ok(view
        .meta_get(&cookie_key(rid))?
        .map(|v| String::from_utf8_lossy(&v).into_owned()))
}

/// The entry whose entryUUID is `uuid`, if any.
pub fn find_by_uuid(view: &View<'_>, uuid: &str) -> OpResult<Option<EntryId>> {
    let f = Filter::Equality(Ava {
        attr: "entryUUID".into(),
        value: uuid.as_bytes().to_vec(),
    });
    Ok(match view.candidates(&f)? {
        Candidates::Ids(ids) => ids.iter().next(),
        Candidates::All => None,
    })
}

/// The stored entry `id` as a change's `before`.
fn before(view: &View<'_>, id: EntryId) -> OpResult<Before> {
    let mut entry = ops::stored_entry(view, id)?;
    entry.dn = view.dn(id)?;
    Ok(Before {
        id,
        norm: ops::norm_dn_of(view, id)?,
        entry,
        bytes: None,
    })
}

/// Where an entry named `dn` goes: its parent must exist (an entry at the
/// DN itself was dealt with by the caller).
fn place_for(ctx: &WriteCtx, view: &View<'_>, dn: &Dn, norm: &str) -> OpResult<Placement> {
    if ctx.server.is_suffix(norm) {
        return Ok(Placement {
            parent: 0,
            rdn: dn.to_string(),
            norm_rdn: norm.to_string(),
        });
    }
    let rdns = ops::norm_rdns(view, dn)?;
    match view.lookup_norm(&rdns[1..])? {
        Lookup::Found(parent) => Ok(Placement {
            parent,
            rdn: dn.rdn().map(|r| r.to_string()).unwrap_or_default(),
            norm_rdn: rdns[0].clone(),
        }),
        Lookup::Missing { .. } => Err(LdapError::new(
            ResultCode::NO_SUCH_OBJECT,
            format!("the parent of '{dn}' is not here (outside this consumer's search?)"),
        )),
    }
}

/// Deletes of the entries `ids` and of everything below them, parents
/// before children (the pipeline writes in reverse: children first).
fn subtree_deletes(view: &View<'_>, ids: &[EntryId]) -> OpResult<Vec<Change>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for &id in ids {
        let mut stack = vec![id];
        while let Some(next) = stack.pop() {
            if !seen.insert(next) {
                continue;
            }
            out.push(Change::delete(before(view, next)?));
            let mut kids = view.children(next)?;
            kids.reverse();
            stack.extend(kids);
        }
    }
    // An entry listed after one of its descendants: order by depth.
    out.sort_by_key(|c: &Change| c.norm().matches(',').count());
    Ok(out)
}

/// [`place_for`], refusing a DN another entry holds.
fn place_for_free(ctx: &WriteCtx, view: &View<'_>, dn: &Dn, norm: &str) -> OpResult<Placement> {
    if let Ok(Lookup::Found(_)) = view.lookup(dn)? {
        return Err(LdapError::new(
            ResultCode::ENTRY_ALREADY_EXISTS,
            format!("'{dn}' is taken here by an entry the provider did not name"),
        ));
    }
    place_for(ctx, view, dn, norm)
}

impl Replicated {
    fn plan_entry(&self, ctx: &WriteCtx, view: &View<'_>, entry: &Entry) -> OpResult<Vec<Change>> {
        let server = &*ctx.server;
        let uuid = entry
            .get("entryUUID")
            .and_then(|a| a.values.first())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .ok_or_else(|| LdapError::protocol("a replicated entry has no entryUUID"))?;
        let norm = server
            .schema
            .normalize_dn(&entry.dn)
            .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{}': {e}", entry.dn)))?;
        let mut after = entry.clone();
        server.schema.check_entry(&mut after)?;
        let at_dn = match view.lookup(&entry.dn)? {
            Ok(Lookup::Found(id)) => Some(id),
            _ => None,
        };
        let (local, stale) = match find_by_uuid(view, &uuid)? {
            // Another entry holds the new DN: a stale copy (the provider's
            // delete of it may not have come yet). It goes first.
            Some(id) => (Some(id), at_dn.filter(|&o| o != id)),
            None => (at_dn, None),
        };
        let deletes = subtree_deletes(view, stale.as_slice())?;
        let main = match local {
            None => Change::add(after, norm.clone(), place_for(ctx, view, &entry.dn, &norm)?),
            Some(id) => {
                let before = before(view, id)?;
                // The same entry (by UUID), here as new as what came (a
                // change sent twice, or overtaken): kept.
                let csn = |e: &Entry| e.get("entryCSN").and_then(|a| a.values.first()).cloned();
                let same = before.entry.get("entryUUID") == after.get("entryUUID");
                if same && csn(&before.entry).is_some() && csn(&before.entry) >= csn(&after) {
                    return Ok(deletes);
                }
                if before.norm != norm {
                    // Where the stale entry is (deleted first), or a free DN.
                    let place = if stale.is_some() {
                        place_for(ctx, view, &entry.dn, &norm)?
                    } else {
                        place_for_free(ctx, view, &entry.dn, &norm)?
                    };
                    Change::rename(before, after, norm, place)
                } else if before.entry.attrs == after.attrs && before.entry.dn == after.dn {
                    return Ok(deletes);
                } else {
                    Change::modify(before, after)
                }
            }
        };
        // The target first; the deletes are written before it.
        let mut changes = vec![main];
        changes.extend(deletes);
        Ok(changes)
    }
}

impl WriteOp for Replicated {
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        match &self.0 {
            Received::Entry(e) => self.plan_entry(ctx, view, e),
            Received::Delete(uuids) => {
                let mut ids = Vec::new();
                for uuid in uuids {
                    ids.extend(find_by_uuid(view, uuid)?);
                }
                subtree_deletes(view, &ids)
            }
            Received::Cookie => Ok(Vec::new()),
        }
    }

    fn audit(&self, _ctx: &WriteCtx, _changes: &[Change]) {}
}
