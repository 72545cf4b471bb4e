//! One entry's change as the pipeline plans and writes it ([`Change`],
//! with the entry as stored before it), the replication state a received
//! change carries ([`ReplCtx`]), and the stamps read back from an entry.
//! Plain data: everything that plans or writes changes imports this, and
//! this imports nothing of the operations but errors and DN resolution.

use std::sync::Arc;

use pando_model::Entry;
use pando_proto::ResultCode;
use pando_store::{EntryId, Placement, View};

use crate::error::{LdapError, OpResult};

/// The entry an operation changes, as stored before it.
pub struct Before {
    pub id: EntryId,
    /// With its DN.
    pub entry: Entry,
    /// Its normalised DN.
    pub norm: String,
    /// The stored record, when the change was planned on a snapshot: the
    /// writer goes ahead only if the record is still exactly this.
    pub bytes: Option<Vec<u8>>,
}

impl Before {
    /// The stored entry `id`, named `norm` (with its DN as stored: a
    /// request may spell it differently), planned on a snapshot: its
    /// record is kept for the writer to confirm.
    pub fn planned(view: &View<'_>, id: EntryId, norm: &str) -> OpResult<Before> {
        let bytes = view
            .entry_bytes(id)?
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let entry = Entry {
            dn: view.dn_in(id, &bytes)?,
            attrs: view.decode_attrs(id, &bytes)?,
        };
        Ok(Before {
            id,
            entry,
            norm: norm.to_string(),
            bytes: Some(bytes),
        })
    }
}

/// One entry's change, worked out before it is written.
pub struct Change {
    /// None for an add.
    pub before: Option<Before>,
    /// The entry as it will be, with its (new) DN; None for a delete.
    pub after: Option<Entry>,
    /// The normalised DN afterwards (add, rename); None: unchanged.
    pub after_norm: Option<String>,
    /// Where the entry goes (add, rename); None: where it is.
    pub place: Option<Placement>,
}

impl Change {
    /// A new entry, named `norm`, stored at `place`.
    pub fn add(entry: Entry, norm: String, place: Placement) -> Change {
        Change {
            before: None,
            after: Some(entry),
            after_norm: Some(norm),
            place: Some(place),
        }
    }

    /// The entry `before` goes.
    pub fn delete(before: Before) -> Change {
        Change {
            before: Some(before),
            after: None,
            after_norm: None,
            place: None,
        }
    }

    /// The entry `before` becomes `after` where it is.
    pub fn modify(before: Before, after: Entry) -> Change {
        Change {
            before: Some(before),
            after: Some(after),
            after_norm: None,
            place: None,
        }
    }

    /// The entry named `norm` (normalised), as `edit` leaves a copy of it:
    /// the plan of the server's own one-entry changes (password policy
    /// state, upgrade on bind).
    pub fn edit(
        view: &View<'_>,
        norm: &str,
        edit: impl FnOnce(&mut Entry) -> OpResult<()>,
    ) -> OpResult<Change> {
        let dn = crate::parse_dn(norm)?;
        let id = crate::resolve(view, &dn)?;
        let entry = view
            .entry(id)?
            .ok_or_else(|| LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"))?;
        let mut after = entry.clone();
        edit(&mut after)?;
        let before = Before {
            id,
            entry,
            norm: norm.to_string(),
            bytes: None,
        };
        Ok(Change::modify(before, after))
    }

    /// The entry `before` becomes `after`, named `norm`, at `place`.
    pub fn rename(before: Before, after: Entry, norm: String, place: Placement) -> Change {
        Change {
            before: Some(before),
            after: Some(after),
            after_norm: Some(norm),
            place: Some(place),
        }
    }

    /// The normalised DN the change is known by afterwards.
    pub fn norm(&self) -> &str {
        self.after_norm
            .as_deref()
            .or(self.before.as_ref().map(|b| b.norm.as_str()))
            .unwrap_or("")
    }
}

/// A parent placeholder: `GLUE_PARENT - k` names the entry added by
/// change `k` of the same operation (resolved as the pipeline writes).
pub const GLUE_PARENT: EntryId = u64::MAX;

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
    /// Part of an initial load (the session started with no state): the
    /// change log is not filled with a copy of every entry; storing the
    /// load's cookie raises the log's floor past it instead (as `pando
    /// import` does), so a consumer of this server that is older than the
    /// load gets a present phase.
    pub unlogged: bool,
    /// Part of a refresh, whose entries come in no CSN order (or passed on
    /// by a provider without a cookie, being such an entry where it was
    /// applied): contextCSN moves with the cookies, not with each entry
    /// (else it would say "in step" while older changes are still on
    /// their way, and a change coming meanwhile through another server
    /// would be taken as held).
    pub refreshing: bool,
    /// The consumer's search base (normalised): nothing outside it is
    /// touched, whatever the provider sends.
    pub base: String,
    /// The provider's whole state, when the change comes with it (the
    /// deletes of a refresh, applied at its end): a deleted entry whose
    /// last change that state does not take in was deleted by a server
    /// that had not seen the change (a conflict on record). None: only a
    /// change newer than the delete tells.
    pub seen_by: Option<pando_proto::sync::Cookie>,
    /// Counts received changes that met a different state here: an entry
    /// older than the one held (kept), or another entry holding its DN
    /// (replaced). Each is also logged with both sides.
    pub conflicts: Arc<std::sync::atomic::AtomicU64>,
}

/// An entry's entryCSN, when it has one that is text.
pub fn entry_csn(entry: &Entry) -> Option<&str> {
    let v = entry.get("entryCSN")?.values.first()?;
    std::str::from_utf8(v).ok()
}

/// An entry's entryUUID, as text.
pub fn entry_uuid(entry: &Entry) -> Option<String> {
    let v = entry.get("entryUUID")?.values.first()?;
    Some(String::from_utf8_lossy(v).into_owned())
}
