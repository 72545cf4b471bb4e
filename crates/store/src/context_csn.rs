//! The context CSN: for each server ID, the newest CSN of that server's
//! changes the store holds (RFC 4533 replication state, one `contextCSN`
//! value per server ID on each suffix entry, as OpenLDAP keeps it).
//! Updated in the transaction of the change it follows, so it is never
//! stale (OpenLDAP keeps it in memory and writes it at checkpoints).
//!
//! `meta:context_csn:<sid>` (three lowercase hex digits) → the CSN text.
//! Stores from before per-server values kept one `meta:context_csn`; it
//! becomes the value for its CSN's server ID when the store is opened for
//! writing.

use crate::{Db, StoreError, View, WriteTxn};

const PREFIX: &str = "context_csn:";
const OLD_KEY: &[u8] = b"context_csn";

pub use pando_proto::sync::csn_sid;

fn key(sid: u16) -> String {
    format!("{PREFIX}{sid:03x}")
}

impl View<'_> {
    /// The newest CSN per server ID, ordered by server ID.
    pub fn context_csns(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for item in self.inner.meta.prefix_iter(self.txn, PREFIX.as_bytes())? {
            let (_, v) = item?;
            out.push(String::from_utf8_lossy(v).into_owned());
        }
        // A read-only view of a store from before per-server values.
        if out.is_empty() {
            if let Some(v) = self.inner.meta.get(self.txn, OLD_KEY)? {
                out.push(String::from_utf8_lossy(v).into_owned());
            }
        }
        Ok(out)
    }

    /// The newest CSN of any server.
    pub fn newest_csn(&self) -> Result<Option<String>, StoreError> {
        Ok(self.context_csns()?.into_iter().max())
    }
}

impl WriteTxn<'_> {
    /// A change stamped `csn` is written: it becomes its server's context
    /// CSN unless that is newer already. False: `csn` is not a CSN.
    pub fn advance_context_csn(&mut self, csn: &str) -> Result<bool, StoreError> {
        let Some(sid) = csn_sid(csn) else {
            return Ok(false);
        };
        let k = key(sid);
        let newer = match self.inner.meta.get(&self.txn, k.as_bytes())? {
            Some(v) => csn.as_bytes() > v,
            None => true,
        };
        if newer {
            self.inner
                .meta
                .put(&mut self.txn, k.as_bytes(), csn.as_bytes())?;
        }
        Ok(true)
    }
}

/// Turn a store's single context CSN into its server's value.
pub(crate) fn migrate(meta: Db, wtxn: &mut heed::RwTxn<'_>) -> Result<(), StoreError> {
    let Some(old) = meta.get(wtxn, OLD_KEY)?.map(<[u8]>::to_vec) else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(&old).into_owned();
    if let Some(sid) = csn_sid(&text) {
        let k = key(sid);
        let newer = match meta.get(wtxn, k.as_bytes())? {
            Some(v) => old.as_slice() > v,
            None => true,
        };
        if newer {
            meta.put(wtxn, k.as_bytes(), &old)?;
        }
    }
    meta.delete(wtxn, OLD_KEY)?;
    Ok(())
}
