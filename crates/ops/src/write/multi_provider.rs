//! Received changes on a multi-provider server (`replication.multi_provider`):
//! how a change made elsewhere meets what this server did meanwhile. Every
//! rule depends only on the entries involved, never on the order changes
//! arrive in, so servers that have received the same changes hold the
//! same entries (between Pando servers; with slapd and two or more Pando
//! servers in one ring, see `ops::write::merge`):
//!
//! - **the same entry** (same entryUUID): merged attribute by attribute,
//!   the newer change winning; a copy without per-attribute state (from
//!   slapd) against another, the newer copy whole (`ops::write::merge`);
//!   a glue entry never replaces an entry held here;
//! - **an entry deleted here**: the delete stands; a change the deleting
//!   server had not seen is recorded as lost;
//! - **two entries at one name** (added, or renamed onto it, on two
//!   servers at once): the one added first keeps the name, the other is
//!   removed and recorded whole; a held entry that loses to a received one
//!   becomes it in place, so the entries below it stay;
//! - **a delete of an entry that has entries below it here** (added on
//!   another server before the delete reached it): the entry stays; a
//!   server that deleted it brings it back, as it was, when an entry below
//!   it arrives (`ops::write::tombstones`);
//!
//! and each resolution is recorded once committed (`ops::write::conflicts`).

use pando_model::Entry;
use pando_store::{EntryId, Lookup, View};

use super::change::{entry_csn, entry_uuid, Before, Change};
use super::replicated::{before, is_glue, Replicated};
use super::WriteCtx;
use crate::error::{LdapError, OpResult};
use crate::write::conflicts::Conflict;
use crate::write::{merge, tombstones};

/// Values one side lost to a concurrent change of the other, as recorded.
fn loss_conflict(dn: &pando_model::Dn, loss: merge::Loss) -> Conflict {
    let side = match loss.side {
        merge::Side::Here => "here",
        merge::Side::Received => "received",
    };
    let (what, lost) = if loss.attr == "@dn" {
        (
            format!(
                "concurrent changes of the name (a rename); lost the name {}",
                String::from_utf8_lossy(loss.values.first().map_or(&[][..], |v| v))
            ),
            None,
        )
    } else {
        (
            format!("concurrent changes of {}", loss.attr),
            Some((loss.attr, loss.values)),
        )
    };
    Conflict {
        dn: dn.to_string(),
        what,
        lost,
        side,
        lost_csn: loss.lost_csn,
        won_csn: loss.won_csn,
    }
}

/// A whole entry lost (to a delete, or to another entry's name).
fn entry_lost(
    dn: &str,
    what: String,
    entry: &Entry,
    side: &'static str,
    lost_csn: &str,
    won_csn: &str,
) -> Conflict {
    Conflict {
        dn: dn.to_string(),
        what: format!("{what}; it held {}", summary(entry)),
        lost: None,
        side,
        lost_csn: lost_csn.to_string(),
        won_csn: won_csn.to_string(),
    }
}

/// An entry's attributes, for a record (secrets withheld).
fn summary(entry: &Entry) -> String {
    let parts: Vec<String> = entry
        .attrs
        .iter()
        .filter(|a| !a.desc.eq_ignore_ascii_case(merge::STATE_ATTR))
        .map(|a| {
            format!(
                "{}: {}",
                a.desc,
                crate::write::conflicts::shown_values(&a.desc, &a.values)
            )
        })
        .collect();
    parts.join("; ")
}

fn uuid_of(e: &Entry) -> String {
    entry_uuid(e).unwrap_or_default()
}

/// The CSN an entry was added at (as far as its state tells: its base).
fn added_at(e: &Entry) -> String {
    merge::State::of(e).base().to_string()
}

/// Of two entries claiming one name, whether `a` keeps it: the one added
/// first (then the smaller entryUUID, so every server decides alike).
fn keeps_name(a: &Entry, b: &Entry) -> bool {
    (added_at(a), uuid_of(a)) < (added_at(b), uuid_of(b))
}

impl Replicated {
    pub(super) fn resolved(&self, r: Conflict) {
        if let Ok(mut c) = self.conflicts.lock() {
            c.push(r);
        }
    }

    /// An entry whose UUID is not here: deleted here (the delete stands),
    /// or its name held by another entry (the first added keeps it).
    /// None: neither, it is added as usual.
    pub(super) fn plan_new(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        got: &Entry,
        holder: Option<EntryId>,
    ) -> OpResult<Option<Vec<Change>>> {
        let uuid = uuid_of(got);
        if let Some(t) = tombstones::get(view, &uuid)? {
            let csn = entry_csn(got).unwrap_or_default();
            if csn > t.seen.as_str() {
                self.resolved(entry_lost(
                    &got.dn.to_string(),
                    format!(
                        "changed on another server after it was deleted here (at {}); the delete stands",
                        t.deleted_at
                    ),
                    got,
                    "received",
                    csn,
                    &t.deleted_at,
                ));
            }
            return Ok(Some(Vec::new()));
        }
        let Some(id) = holder else {
            return Ok(None);
        };
        let held = before(view, id)?;
        if is_glue(&held.entry) {
            return Ok(None);
        }
        if is_glue(got) {
            self.glue_not_taken(got, &held.entry);
            return Ok(Some(Vec::new()));
        }
        Ok(Some(self.name_clash(ctx, view, held, got.clone(), None)?))
    }

    /// A glue entry received for the name (or the UUID) of an entry held
    /// here: a placeholder another server made (slapd makes one for an
    /// entry whose parent it deleted, or turns an entry into one) never
    /// takes an entry's place; the servers now differ there, on record.
    fn glue_not_taken(&self, got: &Entry, held: &Entry) {
        self.resolved(Conflict {
            dn: got.dn.to_string(),
            what: format!(
                "another server holds a glue entry (entryUUID {}) here, made for entries below it; the entry here stays",
                uuid_of(got)
            ),
            lost: None,
            side: "received",
            lost_csn: entry_csn(got).unwrap_or_default().to_string(),
            won_csn: entry_csn(held).unwrap_or_default().to_string(),
        });
    }

    /// `got` (new here, or `moving`: the held entry it merges with, being
    /// renamed) claims the name `held` has. The loser goes; a held entry
    /// that loses to a new one becomes it in place. Refused (the session
    /// retries, the log says why) only when the loser to remove has
    /// entries below it and cannot be replaced in place.
    fn name_clash(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        held: Before,
        got: Entry,
        moving: Option<Before>,
    ) -> OpResult<Vec<Change>> {
        let dn = got.dn.to_string();
        let leaf = |b: &Before| -> OpResult<bool> { Ok(view.children(b.id)?.is_empty()) };
        let stuck = |b: &Before| {
            LdapError::unwilling(format!(
                "two entries claim '{dn}' and the one to remove ('{}') has entries below it: not resolved",
                b.entry.dn
            ))
        };
        let held_wins = keeps_name(&held.entry, &got);
        let (winner, loser) = if held_wins {
            (&held.entry, &got)
        } else {
            (&got, &held.entry)
        };
        let what = format!(
            "two entries claimed one name: kept entryUUID {} (added at {}), removed entryUUID {} (added at {}){}",
            uuid_of(winner),
            added_at(winner),
            uuid_of(loser),
            added_at(loser),
            if held_wins { "" } else { " held here" }
        );
        let side = if held_wins { "received" } else { "here" };
        let record = entry_lost(&dn, what, loser, side, &added_at(loser), &added_at(winner));
        let changes = match (held_wins, moving) {
            (true, None) => Vec::new(),
            // The held entry renamed onto the name goes.
            (true, Some(mover)) if leaf(&mover)? => vec![Change::delete(mover)],
            (true, Some(mover)) => return Err(stuck(&mover)),
            // New here: the held entry becomes it, in place.
            (false, None) => vec![Change::modify(held, got)],
            // Renamed onto the name: the holder goes, then the rename; or
            // the holder becomes it and its old record goes.
            (false, Some(mover)) if leaf(&held)? => {
                let norm = held.norm.clone();
                let (place, glue) = self.place_for(ctx, view, &got.dn)?;
                let mut c = vec![Change::rename(mover, got, norm, place)];
                c.extend(glue);
                c.push(Change::delete(held));
                c
            }
            (false, Some(mover)) if leaf(&mover)? => {
                vec![Change::modify(held, got), Change::delete(mover)]
            }
            (false, Some(mover)) => return Err(stuck(&mover)),
        };
        self.resolved(record);
        Ok(changes)
    }

    /// Multi-provider: the copy received merged with the one held,
    /// attribute by attribute (`ops::write::merge`).
    pub(super) fn plan_merge(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        held: Before,
        got: Entry,
    ) -> OpResult<Vec<Change>> {
        if is_glue(&got) && !is_glue(&held.entry) {
            self.glue_not_taken(&got, &held.entry);
            return Ok(Vec::new());
        }
        let schema = &ctx.server.schema;
        let merged = merge::merge(&held.entry, &got);
        let mut after = merged.entry;
        if schema.check_entry(&mut after).is_err() {
            // Each side valid, their mix not (an object class from one,
            // its required attribute gone on the other): the copy with
            // the newer change stands whole, as servers without state do.
            let (h, g) = (entry_csn(&held.entry), entry_csn(&got));
            let (won, lost, side, kept) = if g > h {
                (g, h, "here", got.clone())
            } else {
                (h, g, "received", held.entry.clone())
            };
            self.resolved(Conflict {
                dn: got.dn.to_string(),
                what: "concurrent changes whose merge breaks the schema; the newer copy kept whole"
                    .into(),
                lost: None,
                side,
                lost_csn: lost.unwrap_or_default().to_string(),
                won_csn: won.unwrap_or_default().to_string(),
            });
            after = kept;
        } else {
            for loss in merged.losses {
                self.resolved(loss_conflict(&after.dn, loss));
            }
        }
        if same_entry(&held.entry, &after) {
            return Ok(Vec::new());
        }
        let norm = schema
            .normalize_dn(&after.dn)
            .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{}': {e}", after.dn)))?;
        if norm == held.norm {
            return Ok(vec![Change::modify(held, after)]);
        }
        if let Ok(Lookup::Found(other)) = view.lookup(&after.dn)? {
            let other = before(view, other)?;
            if !is_glue(&other.entry) {
                return self.name_clash(ctx, view, other, after, Some(held));
            }
        }
        let (place, glue) = self.place_for_free(ctx, view, &after.dn)?;
        let mut changes = vec![Change::rename(held, after, norm, place)];
        changes.extend(glue);
        Ok(changes)
    }

    /// Deletes received for the entries `ids`: each goes alone; one with
    /// entries below it here stays, recorded (they were added on another
    /// server before the delete reached it).
    pub(super) fn plan_deletes(&self, view: &View<'_>, uuids: &[String]) -> OpResult<Vec<Change>> {
        let (ids, missing) = self.found_within(view, uuids)?;
        // Deleted before a copy reached this server (it may still come,
        // through another server): remembered, so it is not added then.
        let mut unknown = Vec::new();
        for uuid in missing {
            if tombstones::get(view, uuid)?.is_none() {
                unknown.push(uuid.clone());
            }
        }
        if let Ok(mut u) = self.unknown_deleted.lock() {
            *u = unknown;
        }
        // The delete's CSN: a change here with a greater one was made
        // after the delete, so the deleting server had not seen it.
        let deleted_at = self.repl.csn.clone();
        let mut changes = Vec::new();
        let mut deleted = std::collections::HashSet::new();
        for id in deepest_first(view, ids)? {
            let held = before(view, id)?;
            // Entries below it that stay (not deleted with it) keep it.
            if !view.children(id)?.iter().all(|k| deleted.contains(k)) {
                self.note_kept_parent(view, id)?;
                continue;
            }
            let changed = entry_csn(&held.entry).unwrap_or_default();
            let unseen = match &self.repl.seen_by {
                Some(state) => !changed.is_empty() && !state.has_seen(changed),
                None => deleted_at.as_deref().is_some_and(|at| changed > at),
            };
            if unseen {
                let what = match &self.repl.seen_by {
                    Some(_) => "deleted on another server that had not seen its change here (the provider's state does not take it in); the delete stands".to_string(),
                    None => format!("deleted on another server (at {}) that had not seen its change here; the delete stands", deleted_at.as_deref().unwrap_or_default()),
                };
                let at = deleted_at.as_deref().unwrap_or_default();
                self.resolved(entry_lost(
                    &held.entry.dn.to_string(),
                    what,
                    &held.entry,
                    "here",
                    changed,
                    at,
                ));
            }
            deleted.insert(id);
            changes.push(Change::delete(held));
        }
        // Children first: the pipeline writes the list in reverse.
        changes.sort_by_key(|c: &Change| c.norm().matches(',').count());
        Ok(changes)
    }

    /// A delete received for `id` not applied: entries below it here
    /// were added on another server before the delete reached it.
    pub(super) fn note_kept_parent(&self, view: &View<'_>, id: EntryId) -> OpResult<()> {
        let held = before(view, id)?;
        let below = view.children(id)?.len();
        self.resolved(Conflict {
            dn: held.entry.dn.to_string(),
            what: format!(
                "deleted on another server while {below} entries were added below it here; it stays so they stay reachable"
            ),
            lost: None,
            side: "received",
            lost_csn: String::new(),
            won_csn: entry_csn(&held.entry).unwrap_or_default().to_string(),
        });
        Ok(())
    }

    /// Record the deleted entries `glue` brought back (see
    /// [`restore_or_glue`]).
    pub(super) fn note_restored(&self, got: &Entry, glue: &[Change]) {
        for c in glue {
            let e = c.entry();
            if is_glue(e) {
                continue;
            }
            self.resolved(Conflict {
                dn: e.dn.to_string(),
                what: format!(
                    "deleted here, brought back as it was: '{}' was added below it on another server",
                    got.dn
                ),
                lost: None,
                side: "here",
                lost_csn: String::new(),
                won_csn: entry_csn(got).unwrap_or_default().to_string(),
            });
        }
    }
}

/// `ids` ordered so entries below others come before them (by the depth
/// of their DNs).
fn deepest_first(view: &View<'_>, ids: Vec<EntryId>) -> OpResult<Vec<EntryId>> {
    let mut by_depth = Vec::with_capacity(ids.len());
    for id in ids {
        by_depth.push((crate::norm_dn_of(view, id)?.matches(',').count(), id));
    }
    by_depth.sort_by_key(|d| std::cmp::Reverse(d.0));
    Ok(by_depth.into_iter().map(|(_, id)| id).collect())
}

/// A missing ancestor `dn` (normalised `norm`) of a received entry: the
/// entry deleted there, as it was, when this server remembers one
/// (multi-provider), else a glue placeholder.
pub(super) fn restore_or_glue(
    ctx: &WriteCtx,
    view: &View<'_>,
    norm: &str,
    glue: Entry,
) -> OpResult<Entry> {
    if !ctx.server.multi_provider() {
        return Ok(glue);
    }
    Ok(match tombstones::at_dn(view, norm)? {
        Some(t) => {
            let mut e = t.entry;
            e.dn = glue.dn;
            e
        }
        None => glue,
    })
}

/// The same DN and attributes, in any order.
fn same_entry(a: &Entry, b: &Entry) -> bool {
    let canon = |e: &Entry| {
        let mut attrs: Vec<(String, Vec<Vec<u8>>)> = e
            .attrs
            .iter()
            .map(|a| {
                let mut v = a.values.clone();
                v.sort();
                (a.desc.to_ascii_lowercase(), v)
            })
            .collect();
        attrs.sort();
        attrs
    };
    a.dn == b.dn && canon(a) == canon(b)
}
