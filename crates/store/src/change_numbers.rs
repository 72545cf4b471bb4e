//! Change numbers: each change log record ([`crate::changelog`]) gets the
//! next number of a counter when it is written, so a reader can walk the
//! log in the order the changes were committed here, by number, as the
//! retro change log (`cn=changelog`) of DSEE and 389-DS is read.
//!
//! The change log itself is in CSN order, and a change received from
//! another provider may carry a CSN older than changes already logged: its
//! place in CSN order is in the middle, but its number is the next one, so
//! a reader that has passed that place still sees it.
//!
//! Key: the number (u64, big-endian); value: the change log record's key.
//! Written in the transaction that logs the change. Purging the log drops
//! the numbers whose records are gone from the front of the index; a
//! number whose record went while an older one stays (a received change
//! purged by its old CSN) is skipped when read and dropped when the front
//! reaches it. `meta:changenumber_next` holds the next number when the
//! index is empty after a purge, so numbers are never given twice.
//!
//! Numbers are given only while they are on ([`WriteTxn::number_changes`],
//! kept in meta; on in a store that never turned them off): a server turns
//! them off when no retro change log reads them, since the index costs a
//! write per change. Turning them off drops the index (the next number
//! stays in meta); turning them on again numbers every change the log then
//! holds, in CSN order, after the last number given: a change read before
//! is read again under a new number, none is missed and no number is given
//! twice.
//!
//! A store written before the index numbers its logged changes in CSN
//! order when it is first opened.

use heed::types::Bytes;
use heed::PutFlags;

use crate::{Db, StoreError, View, WriteTxn};

/// The database's name in the environment.
pub const NAME: &str = "changenumbers";
const META_NEXT: &[u8] = b"changenumber_next";
/// Present while numbers are off.
const META_OFF: &[u8] = b"changenumbers_off";

/// Whether logged changes get numbers, as meta says.
pub(crate) fn numbering_on(meta: &Db, txn: &heed::RoTxn<'_>) -> Result<bool, StoreError> {
    Ok(meta.get(txn, META_OFF)?.is_none())
}

/// Logged changes with their numbers, as read.
pub type NumberedChanges<'v> =
    Box<dyn Iterator<Item = Result<(u64, crate::LoggedChange), StoreError>> + 'v>;

fn number_of(k: &[u8]) -> u64 {
    <[u8; 8]>::try_from(k).map(u64::from_be_bytes).unwrap_or(0)
}

/// The next number to give: one past the index's last, else the one kept
/// in meta, else 1.
fn next_number(db: &Db, meta: &Db, txn: &heed::RoTxn<'_>) -> Result<u64, StoreError> {
    if let Some((k, _)) = db.last(txn)? {
        return Ok(number_of(k) + 1);
    }
    Ok(match meta.get(txn, META_NEXT)? {
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(1),
        None => 1,
    })
}

impl View<'_> {
    /// The first and last change numbers whose records are in the log
    /// (None when it holds none).
    pub fn change_number_range(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let first = self.changes_from_number(0)?.next().transpose()?;
        let Some((first, _)) = first else {
            return Ok(None);
        };
        let (Some(db), Some(log)) = (
            self.inner.changenumbers.as_ref(),
            self.inner.changelog.as_ref(),
        ) else {
            return Ok(None);
        };
        // The newest number whose record is still there.
        for item in db.rev_iter(self.txn)? {
            let (k, logkey) = item?;
            if log.get(self.txn, logkey)?.is_some() {
                return Ok(Some((first, number_of(k))));
            }
        }
        Ok(None)
    }

    /// The logged changes numbered `from` or more, in number order, each
    /// with its number.
    pub fn changes_from_number<'v>(&'v self, from: u64) -> Result<NumberedChanges<'v>, StoreError> {
        let (Some(db), Some(_)) = (
            self.inner.changenumbers.as_ref(),
            self.inner.changelog.as_ref(),
        ) else {
            return Ok(Box::new(std::iter::empty()));
        };
        let start = from.to_be_bytes();
        let range = (
            std::ops::Bound::Included(&start[..]),
            std::ops::Bound::Unbounded,
        );
        let iter = db.range(self.txn, &range)?;
        Ok(Box::new(iter.filter_map(move |item| {
            let (k, logkey) = match item {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e.into())),
            };
            match self.change_by_key(logkey) {
                Ok(Some(c)) => Some(Ok((number_of(k), c))),
                // Purged ahead of its number (see the module's header).
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            }
        })))
    }
}

impl WriteTxn<'_> {
    /// Number logged changes from now on, or stop (see the module's
    /// header); nothing to do when they already are as asked. Writes read
    /// it from meta in their own transaction, so they follow exactly what
    /// commits.
    pub fn number_changes(&mut self, on: bool) -> Result<(), StoreError> {
        let (Some(db), Some(log)) = (self.inner.changenumbers, self.inner.changelog) else {
            return Ok(());
        };
        let meta = self.inner.meta;
        if numbering_on(&meta, &self.txn)? != on {
            let next = next_number(&db, &meta, &self.txn)?;
            if on {
                number_log(&mut self.txn, db, log, next)?;
                meta.delete(&mut self.txn, META_OFF)?;
            } else {
                db.clear(&mut self.txn)?;
                meta.put(&mut self.txn, META_NEXT, next.to_string().as_bytes())?;
                meta.put(&mut self.txn, META_OFF, b"")?;
            }
        }
        Ok(())
    }

    /// Give the change log record `logkey` (just written, new) the next
    /// number.
    pub(crate) fn number_change(&mut self, logkey: &[u8]) -> Result<(), StoreError> {
        let Some(db) = self.inner.changenumbers else {
            return Ok(());
        };
        // One read of the small meta table, against the index's write.
        if !numbering_on(&self.inner.meta, &self.txn)? {
            return Ok(());
        }
        let n = next_number(&db, &self.inner.meta, &self.txn)?;
        db.put_with_flags(&mut self.txn, PutFlags::APPEND, &n.to_be_bytes(), logkey)?;
        Ok(())
    }

    /// Drop the numbers at the front of the index whose records are gone
    /// (after a purge), at most `max`.
    pub(crate) fn drop_purged_numbers(&mut self, max: usize) -> Result<(), StoreError> {
        let (Some(db), Some(log)) = (self.inner.changenumbers, self.inner.changelog) else {
            return Ok(());
        };
        let mut newest = None;
        let mut gone = Vec::new();
        for item in db.iter(&self.txn)? {
            let (k, logkey) = item?;
            if gone.len() >= max || log.get(&self.txn, logkey)?.is_some() {
                break;
            }
            newest = Some(number_of(k));
            gone.push(k.to_vec());
        }
        for k in &gone {
            db.delete(&mut self.txn, k)?;
        }
        if let Some(n) = newest {
            let next = (n + 1).to_string();
            self.inner
                .meta
                .put(&mut self.txn, META_NEXT, next.as_bytes())?;
        }
        Ok(())
    }
}

/// Open the index, creating it when missing; a change log from before it
/// is numbered in CSN order.
pub(crate) fn open(
    env: &heed::Env,
    wtxn: &mut heed::RwTxn<'_>,
    changelog: Db,
) -> Result<Db, StoreError> {
    if let Some(db) = env.open_database::<Bytes, Bytes>(wtxn, Some(NAME))? {
        return Ok(db);
    }
    let db = env.create_database::<Bytes, Bytes>(wtxn, Some(NAME))?;
    number_log(wtxn, db, changelog, 1)?;
    Ok(db)
}

/// Number every record of the change log into the empty index `db`, in
/// CSN order, from `first`.
fn number_log(
    wtxn: &mut heed::RwTxn<'_>,
    db: Db,
    changelog: Db,
    first: u64,
) -> Result<(), StoreError> {
    // In chunks, so a long log is not held in memory whole.
    let mut after: Option<Vec<u8>> = None;
    let mut n = first;
    loop {
        let start = match &after {
            Some(k) => std::ops::Bound::Excluded(k.as_slice()),
            None => std::ops::Bound::Unbounded,
        };
        let range: (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>) =
            (start, std::ops::Bound::Unbounded);
        let keys: Vec<Vec<u8>> = changelog
            .range(wtxn, &range)?
            .take(10_000)
            .map(|item| item.map(|(k, _)| k.to_vec()))
            .collect::<Result<_, _>>()?;
        let Some(last) = keys.last().cloned() else {
            break;
        };
        for k in &keys {
            db.put_with_flags(wtxn, PutFlags::APPEND, &n.to_be_bytes(), k)?;
            n += 1;
        }
        after = Some(last);
    }
    Ok(())
}
