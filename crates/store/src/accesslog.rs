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

    /// Remove up to `max` records whose key sorts before `before` (None:
    /// any key), oldest first; how many went.
    pub fn purge_access_records(
        &mut self,
        before: Option<&str>,
        max: usize,
    ) -> Result<usize, StoreError> {
        let db = self.accesslog_db()?;
        let mut n = 0;
        let mut iter = db.iter_mut(&mut self.txn)?;
        while n < max {
            let Some(item) = iter.next() else { break };
            let (k, _) = item?;
            if before.is_some_and(|b| k >= b.as_bytes()) {
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

impl WriteTxn<'_> {
    /// Remove the oldest records until at most `max_records` remain and
    /// the log's pages take at most `max_bytes`; how many went. Pages are
    /// what the log holds on disk (records, their overflow pages and the
    /// tree above them), so the bound holds whatever the records' sizes.
    pub fn trim_access_records(
        &mut self,
        max_records: u64,
        max_bytes: u64,
    ) -> Result<u64, StoreError> {
        let mut purged = 0u64;
        loop {
            let now = self.view().access_log_size()?;
            let over_records = now.records.saturating_sub(max_records);
            let over_bytes = now.bytes.saturating_sub(max_bytes);
            if over_records == 0 && over_bytes == 0 {
                return Ok(purged);
            }
            // Records to drop for the bytes, from the mean record's pages;
            // at least a few per round so the loop ends quickly.
            let per_record = (now.bytes / now.records.max(1)).max(1);
            let chunk = over_records.max(over_bytes.div_ceil(per_record)).max(16);
            let gone = self.purge_access_records(None, chunk as usize)?;
            if gone == 0 {
                return Ok(purged);
            }
            purged += gone as u64;
        }
    }
}

/// How much the access log holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessLogSize {
    pub records: u64,
    /// Its pages (branch, leaf and overflow) times the page size.
    pub bytes: u64,
}

impl View<'_> {
    /// The access log's record count and pages, read from the database's
    /// statistics (no scan).
    pub fn access_log_size(&self) -> Result<AccessLogSize, StoreError> {
        let Some(db) = self.inner.accesslog.as_ref() else {
            return Ok(AccessLogSize::default());
        };
        let st = db.stat(self.txn)?;
        let pages = (st.branch_pages + st.leaf_pages + st.overflow_pages) as u64;
        Ok(AccessLogSize {
            records: st.entries as u64,
            bytes: pages * u64::from(st.page_size),
        })
    }
}

/// Open the access log, creating it when missing.
pub(crate) fn open(env: &heed::Env, wtxn: &mut heed::RwTxn<'_>) -> Result<Db, StoreError> {
    if let Some(db) = env.open_database::<Bytes, Bytes>(wtxn, Some(NAME))? {
        return Ok(db);
    }
    Ok(env.create_database::<Bytes, Bytes>(wtxn, Some(NAME))?)
}
