//! What a multi-provider server remembers of the entries deleted on it,
//! for as long as the change log keeps changes (`changelog_days`):
//!
//! - a change received later for a deleted entry (made on another server
//!   before the delete reached it) is not applied: the delete stands, and
//!   the change is recorded as a conflict when the deleting server had not
//!   seen it;
//! - an entry received below a deleted one (added on another server
//!   before the delete reached it) brings the deleted entry back, as it
//!   was, so it stays reachable; this too is recorded.
//!
//! Kept in the store's meta table, in the transaction of the delete:
//! `tomb:<uuid>` (the record), `tombdn:<normalised DN>` (the UUID) and
//! `tombcsn:<delete CSN> <uuid>` (for expiry in CSN order).

use base64::Engine;
use pando_model::{Dn, Entry};
use pando_store::{StoreError, View, WriteTxn};

use crate::write::change::{entry_csn, entry_uuid, Change};

const BY_UUID: &str = "tomb:";
const BY_DN: &str = "tombdn:";
const BY_CSN: &str = "tombcsn:";

/// A deleted entry.
pub struct Tombstone {
    /// The delete's CSN.
    pub deleted_at: String,
    /// The entry's entryCSN when it was deleted: the last change the
    /// deleting server had seen.
    pub seen: String,
    /// Its normalised DN.
    pub norm: String,
    /// The entry as it was.
    pub entry: Entry,
}

fn encode(t: &Tombstone) -> Vec<u8> {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let mut out = format!("{}\n{}\n{}\n{}\n", t.deleted_at, t.seen, t.norm, t.entry.dn);
    for a in &t.entry.attrs {
        for v in &a.values {
            out.push_str(&format!("{}:{}\n", a.desc, b64.encode(v)));
        }
    }
    out.into_bytes()
}

fn decode(bytes: &[u8]) -> Option<Tombstone> {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    let deleted_at = lines.next()?.to_string();
    let seen = lines.next()?.to_string();
    let norm = lines.next()?.to_string();
    let mut entry = Entry::new(Dn::parse(lines.next()?).ok()?);
    for line in lines {
        let (desc, value) = line.split_once(':')?;
        entry.add_values(desc, vec![b64.decode(value).ok()?]);
    }
    Some(Tombstone {
        deleted_at,
        seen,
        norm,
        entry,
    })
}

/// Remember `entry` (at `norm`), deleted by the change `deleted_at`.
pub fn put(
    w: &mut WriteTxn<'_>,
    norm: &str,
    entry: &Entry,
    deleted_at: &str,
) -> Result<(), StoreError> {
    let Some(uuid) = entry_uuid(entry) else {
        return Ok(());
    };
    let t = Tombstone {
        deleted_at: deleted_at.to_string(),
        seen: entry_csn(entry).unwrap_or_default().to_string(),
        norm: norm.to_string(),
        entry: entry.clone(),
    };
    w.meta_put(&format!("{BY_UUID}{uuid}"), &encode(&t))?;
    w.meta_put(&format!("{BY_DN}{norm}"), uuid.as_bytes())?;
    w.meta_put(&format!("{BY_CSN}{deleted_at} {uuid}"), b"")
}

/// What a `seen` CSN holds when the entry was never here: no received
/// copy counts as unseen by the delete (it sorts after every CSN).
const SEEN_UNKNOWN: &str = "~";

/// Remember `uuid`, deleted by the change `deleted_at` on another server
/// before any copy of it reached this one.
pub fn put_unknown(w: &mut WriteTxn<'_>, uuid: &str, deleted_at: &str) -> Result<(), StoreError> {
    let t = Tombstone {
        deleted_at: deleted_at.to_string(),
        seen: SEEN_UNKNOWN.to_string(),
        norm: String::new(),
        entry: Entry::new(Dn { rdns: Vec::new() }),
    };
    w.meta_put(&format!("{BY_UUID}{uuid}"), &encode(&t))?;
    w.meta_put(&format!("{BY_CSN}{deleted_at} {uuid}"), b"")
}

/// The deleted entry whose entryUUID is `uuid`.
pub fn get(view: &View<'_>, uuid: &str) -> Result<Option<Tombstone>, StoreError> {
    Ok(view
        .meta_get(&format!("{BY_UUID}{uuid}"))?
        .and_then(|b| decode(&b)))
}

/// At most this many deleted entries are named in one refresh.
const MAX_NAMED: usize = 1_000_000;

/// The UUIDs of the deleted entries remembered (at most [`MAX_NAMED`]).
pub fn deleted_uuids(view: &View<'_>) -> Result<Vec<String>, StoreError> {
    Ok(view
        .meta_scan(BY_UUID, MAX_NAMED)?
        .into_iter()
        .filter_map(|(k, _)| k.strip_prefix(BY_UUID).map(str::to_string))
        .collect())
}

/// The entry last deleted at `norm` (a normalised DN).
pub fn at_dn(view: &View<'_>, norm: &str) -> Result<Option<Tombstone>, StoreError> {
    match view.meta_get(&format!("{BY_DN}{norm}"))? {
        Some(uuid) => get(view, &String::from_utf8_lossy(&uuid)),
        None => Ok(None),
    }
}

/// An entry now lives at `norm` (with `uuid`): what was remembered of a
/// deleted entry there, or of that UUID, goes.
pub fn forget(w: &mut WriteTxn<'_>, norm: &str, uuid: Option<&str>) -> Result<(), StoreError> {
    let dn_key = format!("{BY_DN}{norm}");
    let at = w.view().meta_get(&dn_key)?;
    if at.is_some() {
        w.meta_delete(&dn_key)?;
    }
    let at = at.map(|u| String::from_utf8_lossy(&u).into_owned());
    for u in at.into_iter().chain(uuid.map(str::to_string)) {
        if let Some(t) = get(&w.view(), &u)? {
            w.meta_delete(&format!("{BY_CSN}{} {u}", t.deleted_at))?;
            w.meta_delete(&format!("{BY_UUID}{u}"))?;
        }
    }
    Ok(())
}

/// Forget at most `max` entries deleted before `cutoff` (a CSN or its
/// time prefix), oldest first; the expiry keys are in CSN order, so the
/// first one not due ends it.
pub fn expire(w: &mut WriteTxn<'_>, cutoff: &str, max: usize) -> Result<(), StoreError> {
    for _ in 0..max {
        let Some((key, _)) = w.view().meta_scan(BY_CSN, 1)?.pop() else {
            return Ok(());
        };
        let Some((csn, uuid)) = key.strip_prefix(BY_CSN).and_then(|r| r.split_once(' ')) else {
            // Not one this module wrote: it would hold up every other.
            w.meta_delete(&key)?;
            continue;
        };
        if csn >= cutoff {
            return Ok(());
        }
        let uuid = uuid.to_string();
        if let Some(t) = get(&w.view(), &uuid)? {
            let dn_key = format!("{BY_DN}{}", t.norm);
            // The DN record, if it still names this entry.
            if w.view().meta_get(&dn_key)?.as_deref() == Some(uuid.as_bytes()) {
                w.meta_delete(&dn_key)?;
            }
        }
        w.meta_delete(&format!("{BY_UUID}{uuid}"))?;
        w.meta_delete(&key)?;
    }
    Ok(())
}

/// Multi-provider: a deleted entry is remembered (`ops::write::tombstones`);
/// an entry written at a name, or with a UUID, that was deleted makes
/// that memory go.
pub(super) fn remember(w: &mut WriteTxn<'_>, c: &Change, csn: &str) -> Result<(), StoreError> {
    match (&c.before, &c.after) {
        (Some(before), None) => put(w, &before.norm, &before.entry, csn),
        (_, Some(after)) if c.after_norm.is_some() || c.before.is_none() => {
            forget(w, c.norm(), entry_uuid(after).as_deref())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tombstone_round_trips_with_binary_values() {
        let mut e = Entry::new(Dn::parse("cn=x,dc=example,dc=com").unwrap());
        e.add_values("cn", vec![b"x".to_vec()]);
        e.add_values("jpegPhoto", vec![vec![0, 0xff, b'\n', b':']]);
        let t = Tombstone {
            deleted_at: "c2".into(),
            seen: "c1".into(),
            norm: "cn=x,dc=example,dc=com".into(),
            entry: e.clone(),
        };
        let back = decode(&encode(&t)).unwrap();
        assert_eq!((back.deleted_at.as_str(), back.seen.as_str()), ("c2", "c1"));
        assert_eq!(back.entry, e);
    }
}
