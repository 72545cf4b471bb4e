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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::sync::Cookie;
use pando_proto::{Ava, Filter, ResultCode, Scope};
use pando_store::{Candidates, EntryId, Lookup, Placement, StoreError, View, WriteTxn};

use super::change::{entry_csn, entry_uuid, Before, Change, ReplCtx};
use super::{WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use crate::norm_dn::in_scope;

/// What was received.
pub enum Received {
    /// An entry added or modified on the provider, whole (its entryUUID
    /// among its attributes).
    Entry(Entry),
    /// Entries deleted on the provider, or gone from the consumer's
    /// search, by entryUUID (text), each with whatever is below it.
    Delete(Vec<String>),
    /// Entries the provider no longer has in the search (the end of a
    /// present phase), by entryUUID: each alone, and only when nothing
    /// stays below it.
    Gone(Vec<String>),
    /// Nothing but the cookie.
    Cookie,
}

pub(super) struct Replicated {
    pub(super) received: Received,
    /// The replication state it carries (consumer, cookie, CSN).
    pub(super) repl: ReplCtx,
    /// Conflicts the plan resolved (multi-provider), recorded once the
    /// change is committed; the plan refills it each time it runs.
    pub(super) conflicts: std::sync::Mutex<Vec<crate::write::conflicts::Conflict>>,
    /// Multi-provider: UUIDs of deleted entries this server never had,
    /// remembered so a copy arriving later is not added.
    pub(super) unknown_deleted: std::sync::Mutex<Vec<String>>,
}

/// Queue `received` on the writer now (see the module header): changes
/// queued one after another are applied in that order, whether or not the
/// caller waits for each.
pub fn apply_received(
    ctx: Arc<WriteCtx>,
    repl: ReplCtx,
    received: Received,
) -> impl std::future::Future<Output = OpResult<Written>> + Send + 'static {
    super::queue(
        ctx,
        Arc::new(Replicated {
            received,
            repl,
            conflicts: Default::default(),
            unknown_deleted: Default::default(),
        }),
    )
}

/// The meta key holding consumer `rid`'s cookie.
pub fn cookie_key(rid: u16) -> String {
    format!("syncrepl:{rid:03}")
}

/// In the change's transaction: the consumer's cookie, and its CSNs as
/// this server's context CSNs (the state it now holds, as OpenLDAP's
/// consumers keep it).
fn store_cookie(w: &mut WriteTxn<'_>, repl: &ReplCtx) -> Result<(), StoreError> {
    let Some(cookie) = &repl.cookie else {
        return Ok(());
    };
    w.meta_put(&cookie_key(repl.rid), cookie.as_bytes())?;
    if let Ok(c) = Cookie::parse(cookie.as_bytes()) {
        for csn in &c.csns {
            w.advance_context_csn(csn)?;
        }
        if let (true, Some(newest)) = (repl.unlogged, c.csns.iter().max()) {
            w.raise_changelog_floor(newest)?;
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
pub(super) fn before(view: &View<'_>, id: EntryId) -> OpResult<Before> {
    let mut entry = crate::stored_entry(view, id)?;
    entry.dn = view.dn(id)?;
    Ok(Before {
        id,
        norm: crate::norm_dn_of(view, id)?,
        entry,
        bytes: None,
    })
}

impl Replicated {
    /// Where an entry named `dn` goes. Its parent must exist, or be within
    /// the consumer's base: then the missing ancestors are added as glue
    /// entries (objectClass glue, the RDN's values, a new UUID; with
    /// multi-provider, the entry deleted there when one is remembered),
    /// changes 1, 2… of the operation, nearest first. A glue entry
    /// becomes the real one when the provider sends it (found by its DN).
    pub(super) fn place_for(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        dn: &Dn,
    ) -> OpResult<(Placement, Vec<Change>)> {
        let rdns = crate::norm_rdns(view, dn)?;
        let base = self.repl.base.as_str();
        let may_make = |_: usize, ancestor: &str, _| {
            match in_scope(base, Scope::Sub, ancestor) {
            true => Ok(()),
            false => Err(LdapError::new(
                ResultCode::NO_SUCH_OBJECT,
                format!("'{ancestor}', an ancestor of '{dn}', is not here and is outside this consumer's search base"),
            )),
        }
        };
        let make = |level: usize, norm: &str| {
            let mut e = Entry::new(Dn {
                rdns: dn.rdns[level..].to_vec(),
            });
            e.add_values("objectClass", vec![b"top".to_vec(), b"glue".to_vec()]);
            e.add_values("structuralObjectClass", vec![b"glue".to_vec()]);
            for ava in dn.rdns[level].avas.iter() {
                e.add_values(&ava.attr, vec![ava.value.clone()]);
            }
            e.add_values("entryUUID", vec![super::random_uuid().into_bytes()]);
            super::multi_provider::restore_or_glue(ctx, view, norm, e)
        };
        let missing = super::ancestry::Missing {
            may_make: &may_make,
            make: &make,
        };
        super::ancestry::place(&ctx.server, view, dn, &rdns, missing)
    }

    /// [`place_for`], refusing a DN another entry holds.
    pub(super) fn place_for_free(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        dn: &Dn,
    ) -> OpResult<(Placement, Vec<Change>)> {
        if let Ok(Lookup::Found(_)) = view.lookup(dn)? {
            return Err(LdapError::new(
                ResultCode::ENTRY_ALREADY_EXISTS,
                format!("'{dn}' is taken here by an entry the provider did not name"),
            ));
        }
        self.place_for(ctx, view, dn)
    }
}

/// Deletes of the entries `ids` and of everything below them, parents
/// before children (the pipeline writes in reverse: children first).
pub(super) fn subtree_deletes(view: &View<'_>, ids: &[EntryId]) -> OpResult<Vec<Change>> {
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

/// A placeholder this consumer made for an ancestor outside its search.
pub(super) fn is_glue(e: &Entry) -> bool {
    e.get("objectClass")
        .is_some_and(|a| a.values.iter().any(|v| v.eq_ignore_ascii_case(b"glue")))
}

impl Replicated {
    /// Count and log a conflict between what came and what is here.
    fn conflict(&self, what: std::fmt::Arguments<'_>) {
        let r = &self.repl;
        r.conflicts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(rid = r.rid, "replication conflict: {what}");
    }

    /// The entries with these UUIDs within the consumer's base, and the
    /// UUIDs no entry here has.
    pub(super) fn found_within<'u>(
        &self,
        view: &View<'_>,
        uuids: &'u [String],
    ) -> OpResult<(Vec<EntryId>, Vec<&'u String>)> {
        let base = self.repl.base.as_str();
        let (mut ids, mut missing) = (Vec::new(), Vec::new());
        for uuid in uuids {
            match find_by_uuid(view, uuid)? {
                Some(id) if in_scope(base, Scope::Sub, &crate::norm_dn_of(view, id)?) => {
                    ids.push(id)
                }
                Some(_) => {}
                None => missing.push(uuid),
            }
        }
        Ok((ids, missing))
    }

    fn plan_entry(&self, ctx: &WriteCtx, view: &View<'_>, entry: &Entry) -> OpResult<Vec<Change>> {
        let server = &*ctx.server;
        let Located {
            uuid,
            norm,
            after,
            at_dn,
            by_uuid,
        } = locate(ctx, view, &self.repl.base, entry)?;
        if server.multi_provider() {
            if let Some(id) = by_uuid {
                return self.plan_merge(ctx, view, before(view, id)?, after);
            }
            if let Some(changes) = self.plan_new(ctx, view, &after, at_dn)? {
                return Ok(changes);
            }
        }
        let (local, stale) = match by_uuid {
            // Another entry holds the new DN: a stale copy (the provider's
            // delete of it may not have come yet). It goes first.
            Some(id) => (Some(id), at_dn.filter(|&o| o != id)),
            None => (at_dn, None),
        };
        // Another entry at the DN: a stale copy (deleted first), or, when
        // the UUID is unknown here, the entry taken over in place. A glue
        // entry standing in for it is no conflict.
        let other = at_dn.filter(|&o| Some(o) != by_uuid);
        let held = other.map(|o| view.entry(o)).transpose()?.flatten();
        if let Some(held) = held.filter(|e| !is_glue(e)) {
            let held_uuid = held.get("entryUUID");
            let held_uuid = held_uuid.and_then(|a| a.values.first());
            self.conflict(format_args!(
                    "'{}' was held here by entryUUID {}, the provider's is {uuid}: replaced by the provider's",
                    entry.dn,
                    held_uuid.map_or("(none)".into(), |v| String::from_utf8_lossy(v)),
                ),
            );
        }
        let deletes = subtree_deletes(view, stale.as_slice())?;
        // The target is change 0, the glue its new place needs 1…, the
        // deletes of a stale entry after them (all written in reverse).
        let (main, glue) = match local {
            None => {
                let (place, glue) = self.place_for(ctx, view, &entry.dn)?;
                self.note_restored(&after, &glue);
                (Change::add(after, norm.clone(), place), glue)
            }
            Some(id) => {
                let before = before(view, id)?;
                // The same entry (by UUID), here as new as what came (a
                // change sent twice, or overtaken): kept. At the same CSN
                // under another DN, an ancestor moved: it follows.
                let same = before.entry.get("entryUUID") == after.get("entryUUID");
                let (held, got) = (entry_csn(&before.entry), entry_csn(&after));
                let moved = held == got && before.norm != norm;
                if same && held.is_some() && held >= got && !moved {
                    if held > got {
                        self.conflict(format_args!(
                            "'{}' received at {} is older than the copy here ({}): kept",
                            entry.dn,
                            got.unwrap_or("no entryCSN"),
                            held.unwrap_or(""),
                        ));
                    }
                    return Ok(deletes);
                }
                if before.norm != norm {
                    // Where the stale entry is (deleted first), or a free DN.
                    let (place, glue) = if stale.is_some() {
                        self.place_for(ctx, view, &entry.dn)?
                    } else {
                        self.place_for_free(ctx, view, &entry.dn)?
                    };
                    (Change::rename(before, after, norm, place), glue)
                } else if before.entry.attrs == after.attrs && before.entry.dn == after.dn {
                    return Ok(deletes);
                } else {
                    (Change::modify(before, after), Vec::new())
                }
            }
        };
        let mut changes = vec![main];
        changes.extend(glue);
        changes.extend(deletes);
        Ok(changes)
    }
}

impl WriteOp for Replicated {
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        if let Ok(mut c) = self.conflicts.lock() {
            c.clear();
        }
        if let Ok(mut u) = self.unknown_deleted.lock() {
            u.clear();
        }
        match &self.received {
            Received::Entry(e) => self.plan_entry(ctx, view, e),
            Received::Delete(uuids) | Received::Gone(uuids) if ctx.server.multi_provider() => {
                self.plan_deletes(view, uuids)
            }
            Received::Delete(uuids) => subtree_deletes(view, &self.found_within(view, uuids)?.0),
            Received::Gone(uuids) => {
                let (ids, _) = self.found_within(view, uuids)?;
                let going: std::collections::HashSet<EntryId> = ids.iter().copied().collect();
                let mut changes = Vec::new();
                for &id in &ids {
                    // Children staying (outside the filter, or named
                    // present; with multi-provider, added elsewhere) keep
                    // their parent.
                    if view.children(id)?.iter().any(|k| !going.contains(k)) {
                        if ctx.server.multi_provider() {
                            self.note_kept_parent(view, id)?;
                        }
                        continue;
                    }
                    changes.push(Change::delete(before(view, id)?));
                }
                changes.sort_by_key(|c: &Change| c.norm().matches(',').count());
                Ok(changes)
            }
            Received::Cookie => Ok(Vec::new()),
        }
    }

    fn in_txn(&self, _ctx: &WriteCtx, w: &mut WriteTxn<'_>, csn: &str) -> OpResult<()> {
        store_cookie(w, &self.repl)?;
        let unknown = self
            .unknown_deleted
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default();
        for uuid in unknown {
            crate::write::tombstones::put_unknown(w, &uuid, csn)?;
        }
        let lines: Vec<String> = self
            .conflicts
            .lock()
            .map(|c| c.iter().map(crate::write::conflicts::line).collect())
            .unwrap_or_default();
        crate::write::conflicts::store(w, &lines)?;
        Ok(())
    }

    /// Received changes are queued in order: once one fails, the ones
    /// after it (and their cookies) must not be written.
    fn may_start(&self) -> OpResult<()> {
        if self.repl.failed.load(Ordering::Relaxed) {
            return Err(LdapError::new(
                ResultCode::OTHER,
                "not applied: an earlier change of this replication session failed",
            ));
        }
        Ok(())
    }

    fn failed(&self) {
        self.repl.failed.store(true, Ordering::Relaxed);
    }

    /// None: the provider sends what its own overlays changed.
    fn related(&self, _: &WriteCtx, _: &View<'_>, _: &mut Vec<Change>) -> OpResult<()> {
        Ok(())
    }

    /// The provider's CSN and stamps: the entries are written as received.
    fn stamp(
        &self,
        ctx: &WriteCtx,
        w: &mut WriteTxn<'_>,
        changes: &mut [Change],
    ) -> OpResult<String> {
        let repl = &self.repl;
        let csn = match &repl.csn {
            Some(csn) => {
                // A change of this server's own coming back (multi-provider)
                // must not let the clock issue older CSNs later.
                let _ = ctx.server.rt.csn.resume_after(csn);
                csn.clone()
            }
            // Only the cookie moves: no CSN of this server is spent.
            None if changes.is_empty() => return Ok(String::new()),
            // A delete phase names no CSN: the change log gets one of this
            // server's, but the state held is what the cookie says (stored
            // with it), so contextCSN does not move.
            None => return Ok(ctx.server.rt.csn.next()),
        };
        // During a refresh the state held moves with its cookie only (the
        // entries come in no particular CSN order).
        if !repl.unlogged && !repl.refreshing {
            w.advance_context_csn(&csn)?;
        }
        Ok(csn)
    }

    /// Logged with no author (the provider's), except an initial load.
    fn logged_as<'a>(&'a self, _: &'a WriteCtx) -> Option<&'a str> {
        (!self.repl.unlogged).then_some("")
    }

    fn out_of_order(&self) -> bool {
        self.repl.refreshing
    }

    fn audit(&self, _ctx: &WriteCtx, _changes: &[Change]) {
        let resolved = self
            .conflicts
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default();
        for r in resolved {
            self.repl
                .conflicts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::write::conflicts::log(&r);
        }
    }
}

/// A received entry, checked, and where it is held here.
struct Located {
    uuid: String,
    /// Its normalised DN.
    norm: String,
    /// The entry as received, schema-checked.
    after: Entry,
    /// The entry held at its DN, and the one holding its entryUUID.
    at_dn: Option<EntryId>,
    by_uuid: Option<EntryId>,
}

/// Check a received entry (an entryUUID, a DN within the consumer's base,
/// valid under the schema) and find what holds its DN and its entryUUID
/// here (refused when that is outside the base).
fn locate(ctx: &WriteCtx, view: &View<'_>, base: &str, entry: &Entry) -> OpResult<Located> {
    let server = &*ctx.server;
    let uuid = entry_uuid(entry)
        .ok_or_else(|| LdapError::protocol("a replicated entry has no entryUUID"))?;
    let norm = server
        .schema
        .normalize_dn(&entry.dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{}': {e}", entry.dn)))?;
    if !in_scope(base, Scope::Sub, &norm) {
        return Err(LdapError::unwilling(format!(
            "'{}' is outside this consumer's search base",
            entry.dn
        )));
    }
    let mut after = entry.clone();
    if is_glue(entry) {
        server.schema.check_glue_entry(&mut after)?;
    } else {
        server.schema.check_entry(&mut after)?;
    }
    let at_dn = match view.lookup(&entry.dn)? {
        Ok(Lookup::Found(id)) => Some(id),
        _ => None,
    };
    let by_uuid = match find_by_uuid(view, &uuid)? {
        Some(id) if !in_scope(base, Scope::Sub, &crate::norm_dn_of(view, id)?) => {
            return Err(LdapError::unwilling(format!(
                "entryUUID {uuid} names an entry outside this consumer's search base"
            )))
        }
        found => found,
    };
    Ok(Located {
        uuid,
        norm,
        after,
        at_dn,
        by_uuid,
    })
}
