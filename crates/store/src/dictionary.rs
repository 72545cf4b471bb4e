//! A compression dictionary for a store that was filled without one.
//!
//! `pando import` trains the store's dictionary on the first entries it
//! loads. A store filled over LDAP instead (a replication consumer's
//! initial load, a migration with ldapadd) would keep every entry
//! compressed without a dictionary, several times larger. Once such a
//! store holds enough entries, one is trained on a sample of them, kept in
//! meta like import's, and used for every entry written after; the entries
//! already there are not rewritten (they name no dictionary).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::{entry_codec, id_from, Store, StoreError};

/// Entries sampled, and the store's size when one is trained (`pando
/// import` samples more: it trains before it writes).
pub const SAMPLES: usize = 5_000;
/// Largest dictionary, bytes (as `pando import` makes them).
pub const MAX_BYTES: usize = 64 << 10;

/// One training at a time in this process (a second caller goes away).
static TRAINING: AtomicBool = AtomicBool::new(false);
/// zstd could not build a dictionary from a full sample: not tried again
/// in this process (the entries are too alike or too small to gain).
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// Keep dictionary `id`, trained on `entry_codec::body_of`'s split
/// bodies, in meta as the one new entries use (what `pando import` and a
/// store filled over LDAP both write).
pub(crate) fn put_new_dict(
    meta: crate::Db,
    txn: &mut heed::RwTxn<'_>,
    id: u32,
    bytes: &[u8],
) -> Result<(), StoreError> {
    meta.put(txn, entry_codec::dict_meta_key(id).as_bytes(), bytes)?;
    meta.put(
        txn,
        entry_codec::META_DICT_CURRENT.as_bytes(),
        &id.to_be_bytes(),
    )?;
    meta.put(txn, entry_codec::dict_split_meta_key(id).as_bytes(), b"1")?;
    Ok(())
}

impl Store {
    /// Train and install a dictionary when compression is on, none is in
    /// use, and the store holds at least [`SAMPLES`] entries. Blocking
    /// (reads a sample, waits for the writer): call it off the async
    /// runtime. The dictionary's ID when one was installed.
    pub fn train_dictionary_if_missing(&self) -> Result<Option<u32>, StoreError> {
        let codec = self.codec();
        if codec.level().is_none()
            || codec.current_dict().is_some()
            || GAVE_UP.load(Ordering::Relaxed)
        {
            return Ok(None);
        }
        if TRAINING.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        let result = self.train_now();
        TRAINING.store(false, Ordering::Release);
        result
    }

    fn train_now(&self) -> Result<Option<u32>, StoreError> {
        let samples = {
            let rtxn = self.read()?;
            let view = rtxn.view();
            let mut samples = Vec::with_capacity(SAMPLES);
            for item in view.inner.id2entry.iter(view.txn)? {
                let (k, v) = item?;
                let attrs = view.decode_attrs(id_from(k)?, v)?;
                samples.push(entry_codec::body_of(&attrs));
                if samples.len() == SAMPLES {
                    break;
                }
            }
            samples
        };
        if samples.len() < SAMPLES {
            return Ok(None);
        }
        let Some(bytes) = entry_codec::train(&samples, MAX_BYTES) else {
            GAVE_UP.store(true, Ordering::Relaxed);
            return Ok(None);
        };
        let kept = bytes.clone();
        // Kept in meta by the writer first; encoders use it only once that
        // committed (an entry must never name a dictionary meta lacks).
        let id = self.write_blocking(move |w| -> Result<Option<u32>, StoreError> {
            if w.inner.codec.current_dict().is_some() {
                return Ok(None);
            }
            let id = w.inner.codec.max_dict_id() + 1;
            put_new_dict(w.inner.meta, &mut w.txn, id, &kept)?;
            Ok(Some(id))
        })?;
        if let Some(id) = id {
            self.codec().add_dict(id, bytes, true, true)?;
        }
        Ok(id)
    }
}
