//! The access log: records of operations the change log does not hold
//! (reads, binds, failed writes), kept for the server's access log view
//! (`cn=accesslog`). The store keeps them as opaque values in key order;
//! the server chooses the keys (request start times, which sort as text)
//! and encodes the records.

use std::ops::Bound;

use heed::types::Bytes;

use crate::{Db, StoreError, View, WriteTxn};

/// The database's name in the environment.
pub const NAME: &str = "accesslog";

/// Access log records as read: (key, value) each.
pub type AccessRecords<'v> = Box<dyn Iterator<Item = Result<(String, Vec<u8>), StoreError>> + 'v>;

impl View<'_> {
    /// Records with a key at or after `from` ("": all), in key order.
    pub fn access_records_from<'v>(&'v self, from: &str) -> Result<AccessRecords<'v>, StoreError> {
        let Some(db) = self.inner.accesslog.as_ref() else {
            return Ok(Box::new(std::iter::empty()));
        };
        let start = match from {
            "" => Bound::Unbounded,
            f => Bound::Included(f.as_bytes()),
        };
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (start, Bound::Unbounded);
        let iter = db.range(self.txn, &range)?;
        Ok(Box::new(iter.map(|item| {
            let (k, v) = item?;
            Ok((String::from_utf8_lossy(k).into_owned(), v.to_vec()))
        })))
    }

    /// The record with key `key`.
    pub fn access_record(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(db) = self.inner.accesslog.as_ref() else {
            return Ok(None);
        };
        Ok(db.get(self.txn, key.as_bytes())?.map(<[u8]>::to_vec))
    }
}

impl WriteTxn<'_> {
    fn accesslog_db(&self) -> Result<Db, StoreError> {
        self.inner
            .accesslog
            .ok_or_else(|| StoreError::Corrupt("the store has no access log".into()))
    }

    /// Add a record.
    pub fn put_access_record(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let db = self.accesslog_db()?;
        db.put(&mut self.txn, key.as_bytes(), value)?;
        Ok(())
    }

    /// Remove up to `max` records whose key sorts before `before`, oldest
    /// first; how many went.
    pub fn purge_access_records(&mut self, before: &str, max: usize) -> Result<usize, StoreError> {
        let db = self.accesslog_db()?;
        let mut n = 0;
        let mut iter = db.iter_mut(&mut self.txn)?;
        while n < max {
            let Some(item) = iter.next() else { break };
            let (k, _) = item?;
            if k >= before.as_bytes() {
                break;
            }
            // SAFETY: nothing borrowed from the cursor is kept across the
            // deletion.
            unsafe { iter.del_current()? };
            n += 1;
        }
        Ok(n)
    }
}

/// Open the access log, creating it when missing.
pub(crate) fn open(env: &heed::Env, wtxn: &mut heed::RwTxn<'_>) -> Result<Db, StoreError> {
    if let Some(db) = env.open_database::<Bytes, Bytes>(wtxn, Some(NAME))? {
        return Ok(db);
    }
    Ok(env.create_database::<Bytes, Bytes>(wtxn, Some(NAME))?)
}
