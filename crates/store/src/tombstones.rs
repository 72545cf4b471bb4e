//! Tombstones: a record of every deleted entry (its UUID, its last DN and
//! the CSN of the delete), written in the deleting transaction and kept for
//! a configured time, so that whoever was away when the entry went
//! (replication's delete phase, an incremental backup) can still learn of
//! it after the entry itself is gone.
//!
//! Key: the CSN, a NUL, the entry's position among the operation's
//! deletes (u32, big-endian), the UUID. CSNs sort by time as text and a
//! tree delete's entries (one CSN) by the order they were deleted, so the
//! database is in delete order, oldest first. Value: the DN as it was.

use std::ops::Bound;

use heed::types::Bytes;

use crate::{Db, StoreError, View, WriteTxn};

/// One deleted entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tombstone {
    pub csn: String,
    pub uuid: String,
    pub dn: String,
}

fn key(csn: &str, seq: u32, uuid: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(csn.len() + 5 + uuid.len());
    k.extend_from_slice(csn.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(uuid.as_bytes());
    k
}

fn decode(k: &[u8], v: &[u8]) -> Result<Tombstone, StoreError> {
    let bad = || StoreError::Corrupt("a tombstone record is malformed".into());
    let nul = k.iter().position(|&b| b == 0).ok_or_else(bad)?;
    let text = |b: &[u8]| {
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| bad())
    };
    let uuid = k.get(nul + 5..).ok_or_else(bad)?;
    Ok(Tombstone {
        csn: text(&k[..nul])?,
        uuid: text(uuid)?,
        dn: text(v)?,
    })
}

/// What the tombstones cover: how many there are and the oldest CSN.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TombstoneSummary {
    pub count: u64,
    pub oldest_csn: Option<String>,
}

impl View<'_> {
    fn tombstone_db(&self) -> Option<&Db> {
        self.inner.tombstones.as_ref()
    }

    /// Tombstones with a CSN after `after` (all when empty) and not older
    /// than `not_before` (a CSN or its time prefix: what has expired but
    /// was not purged yet stays out), oldest first, at most `limit`.
    pub fn tombstones(
        &self,
        after: &str,
        not_before: &str,
        limit: usize,
    ) -> Result<Vec<Tombstone>, StoreError> {
        let Some(db) = self.tombstone_db() else {
            return Ok(Vec::new());
        };
        let from = after.max(not_before);
        let mut out = Vec::new();
        // LMDB refuses an empty key, even as a bound.
        let start = match from {
            "" => Bound::Unbounded,
            f => Bound::Included(f.as_bytes()),
        };
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (start, Bound::Unbounded);
        for item in db.range(self.txn, &range)? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            let t = decode(k, v)?;
            if t.csn.as_str() <= after {
                continue;
            }
            out.push(t);
        }
        Ok(out)
    }

    pub fn tombstone_summary(&self) -> Result<TombstoneSummary, StoreError> {
        let Some(db) = self.tombstone_db() else {
            return Ok(TombstoneSummary::default());
        };
        let oldest = match db.first(self.txn)? {
            Some((k, v)) => Some(decode(k, v)?.csn),
            None => None,
        };
        Ok(TombstoneSummary {
            count: db.len(self.txn)?,
            oldest_csn: oldest,
        })
    }
}

impl WriteTxn<'_> {
    fn tombstone_db_mut(&self) -> Result<Db, StoreError> {
        self.inner
            .tombstones
            .ok_or_else(|| StoreError::Corrupt("the store has no tombstone database".into()))
    }

    /// Record that the entry `t.uuid`, known as `t.dn`, was deleted by
    /// `t.csn`, as the operation's `seq`th delete (from 0).
    pub fn put_tombstone(&mut self, t: &Tombstone, seq: u32) -> Result<(), StoreError> {
        let db = self.tombstone_db_mut()?;
        db.put(&mut self.txn, &key(&t.csn, seq, &t.uuid), t.dn.as_bytes())?;
        Ok(())
    }

    /// Remove up to `max` tombstones older than `before` (a CSN or its time
    /// prefix), oldest first; returns how many went.
    pub fn purge_tombstones(&mut self, before: &str, max: usize) -> Result<usize, StoreError> {
        let db = self.tombstone_db_mut()?;
        if before.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        let range: (Bound<&[u8]>, Bound<&[u8]>) =
            (Bound::Unbounded, Bound::Excluded(before.as_bytes()));
        let mut iter = db.range_mut(&mut self.txn, &range)?;
        while n < max {
            match iter.next() {
                Some(item) => {
                    item?;
                    // SAFETY: nothing borrowed from the cursor is kept
                    // across the deletion.
                    unsafe { iter.del_current()? };
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}

/// Open the tombstone database, creating it in stores from before it.
pub(crate) fn open(env: &heed::Env, wtxn: &mut heed::RwTxn<'_>) -> Result<Db, StoreError> {
    Ok(env.create_database::<Bytes, Bytes>(wtxn, Some(NAME))?)
}

/// The database's name in the environment.
pub const NAME: &str = "tombstones";
