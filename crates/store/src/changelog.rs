//! The change log: one record per entry each committed write operation
//! changed, written in the operation's own transaction, so the log and the
//! data never disagree (a crash keeps both or neither). Replication reads
//! it to tell a returning consumer what was deleted or moved away while it
//! was gone (RFC 4533's delete phase) and, later, to send changes
//! attribute by attribute (delta-sync).
//!
//! Key:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 40 | the operation's CSN (text; CSNs sort by time as text) |
//! | 40 | 1 | 0x00 |
//! | 41 | 4 | the entry's position among the operation's changes (u32, big-endian) |
//! | 45 | var | the entry's UUID (text): keeps keys apart when changes applied one by one share a CSN (a replicated tree delete) |
//!
//! so the log is in CSN order, and one operation's entries (a tree delete:
//! children first) in the order written. Value ([`encode`]):
//!
//! | field | encoding |
//! |---|---|
//! | record format | 1 byte (1) |
//! | kind | 1 byte: 1 add, 2 delete, 4 modify, 8 modify DN |
//! | entryUUID | length (LEB128) + text |
//! | DN afterwards (a delete: as it was) | length + UTF-8 |
//! | DN before a modify DN (else empty) | length + UTF-8 |
//! | modifications | count (LEB128), then per modification: operation (1 byte: 0 add, 1 delete, 2 replace), attribute description (length + text), value count, values (length + bytes) |
//! | who made it (format 2; format 1 records have none) | length + UTF-8: the requester's DN, empty for a change received from a provider or made by the server itself |
//!
//! An add logs every attribute of the new entry as `add`s; a modify or a
//! modify DN the difference between the entry before and after; a delete
//! none.
//!
//! **Coverage.** `meta:changelog_floor` holds a CSN: every change committed
//! through the write pipeline with a greater CSN is in the log. Purging
//! raises it to the newest CSN removed; writing data around the log (a new
//! store's first entries, `pando import`) raises it to the newest CSN
//! written. Absent: everything was logged from the start.
//!
//! **Writes around the log.** `meta:changelog_unlogged` counts the times
//! entries were written without records (a refresh from a provider, an
//! import, a restore): an incremental backup is exact only when the count
//! is the same as at its parent (u64, big-endian; absent = 0).

use std::collections::BTreeMap;
use std::ops::Bound;

use heed::types::Bytes;
use heed::PutFlags;

use crate::csn_sid;
use crate::entry_codec::{put_varint, Reader};
use crate::{Db, StoreError, View, WriteTxn};

/// The database's name in the environment.
pub const NAME: &str = "changelog";
/// What the change log replaced (deletes only); emptied when found.
const OLD_TOMBSTONES: &str = "tombstones";
const META_FLOOR: &[u8] = b"changelog_floor";
pub(crate) const META_UNLOGGED: &[u8] = b"changelog_unlogged";
/// Records are written in format 2 (with who made the change); format 1
/// records (without) are still read.
const RECORD_FORMAT: u8 = 2;

/// What a logged change did to its entry (the persistent search change
/// type codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoggedKind {
    Add = 1,
    Delete = 2,
    Modify = 4,
    ModDn = 8,
}

/// How a logged modification changes an attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModOp {
    Add = 0,
    Delete = 1,
    Replace = 2,
}

#[derive(Clone, PartialEq, Eq)]
pub struct LoggedMod {
    pub op: ModOp,
    pub desc: String,
    pub values: Vec<Vec<u8>>,
}

/// Values shown as text, a password's only as how many there are (an add
/// logs the new entry's userPassword hash).
impl std::fmt::Debug for LoggedMod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LoggedMod");
        d.field("op", &self.op).field("desc", &self.desc);
        if pando_model::desc::is_password(&self.desc) {
            d.field("values", &format_args!("<{} hidden>", self.values.len()));
        } else {
            let text: Vec<_> = self
                .values
                .iter()
                .map(|v| String::from_utf8_lossy(v))
                .collect();
            d.field("values", &text);
        }
        d.finish()
    }
}

/// One entry's change in one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedChange {
    pub csn: String,
    /// The entry's position among the operation's changes, from 0.
    pub seq: u32,
    pub kind: LoggedKind,
    pub uuid: String,
    /// The DN afterwards; for a delete, as it was.
    pub dn: String,
    /// The DN before a modify DN.
    pub old_dn: Option<String>,
    pub mods: Vec<LoggedMod>,
    /// The requester's DN ("" when not known).
    pub by: String,
}

/// The values a logged modification carries, borrowed from the entry
/// the writer holds.
pub enum LogValues<'a> {
    /// Every value of the attribute.
    All(&'a [Vec<u8>]),
    /// Some of them.
    Picked(Vec<&'a [u8]>),
}

impl LogValues<'_> {
    pub fn len(&self) -> usize {
        match self {
            LogValues::All(vs) => vs.len(),
            LogValues::Picked(vs) => vs.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn each(&self, mut f: impl FnMut(&[u8])) {
        match self {
            LogValues::All(vs) => vs.iter().for_each(|v| f(v)),
            LogValues::Picked(vs) => vs.iter().for_each(|v| f(v)),
        }
    }
}

/// One modification as the writer logs it, borrowed.
pub struct ModToLog<'a> {
    pub op: ModOp,
    pub desc: &'a str,
    pub values: LogValues<'a>,
}

impl ModToLog<'_> {
    /// The modification as a reader gets it back.
    pub fn to_logged(&self) -> LoggedMod {
        let mut values = Vec::with_capacity(self.values.len());
        self.values.each(|v| values.push(v.to_vec()));
        LoggedMod {
            op: self.op,
            desc: self.desc.to_string(),
            values,
        }
    }
}

/// One entry's change as the writer logs it: borrowed from what the
/// writer holds and encoded straight into the record, so nothing of the
/// entry is copied first.
pub struct ChangeToLog<'a> {
    pub csn: &'a str,
    pub seq: u32,
    pub kind: LoggedKind,
    pub uuid: &'a str,
    pub dn: &'a str,
    pub old_dn: Option<&'a str>,
    pub mods: Vec<ModToLog<'a>>,
    pub by: &'a str,
}

impl LoggedChange {
    /// The change as the writer logs it.
    pub fn to_log(&self) -> ChangeToLog<'_> {
        ChangeToLog {
            csn: &self.csn,
            seq: self.seq,
            kind: self.kind,
            uuid: &self.uuid,
            dn: &self.dn,
            old_dn: self.old_dn.as_deref(),
            mods: self
                .mods
                .iter()
                .map(|m| ModToLog {
                    op: m.op,
                    desc: &m.desc,
                    values: LogValues::All(&m.values),
                })
                .collect(),
            by: &self.by,
        }
    }
}

fn key(c: &ChangeToLog<'_>) -> Vec<u8> {
    let mut k = Vec::with_capacity(c.csn.len() + 5 + c.uuid.len());
    k.extend_from_slice(c.csn.as_bytes());
    k.push(0);
    k.extend_from_slice(&c.seq.to_be_bytes());
    k.extend_from_slice(c.uuid.as_bytes());
    k
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The value of `c`'s record.
fn encode(c: &ChangeToLog<'_>) -> Vec<u8> {
    let mut size = 16 + c.uuid.len() + c.dn.len() + c.by.len();
    size += c.old_dn.map_or(0, str::len);
    for m in &c.mods {
        size += 8 + m.desc.len();
        m.values.each(|v| size += 3 + v.len());
    }
    let mut out = Vec::with_capacity(size);
    out.push(RECORD_FORMAT);
    out.push(c.kind as u8);
    put_bytes(&mut out, c.uuid.as_bytes());
    put_bytes(&mut out, c.dn.as_bytes());
    put_bytes(&mut out, c.old_dn.unwrap_or("").as_bytes());
    put_varint(&mut out, c.mods.len() as u64);
    for m in &c.mods {
        out.push(m.op as u8);
        put_bytes(&mut out, m.desc.as_bytes());
        put_varint(&mut out, m.values.len() as u64);
        m.values.each(|v| put_bytes(&mut out, v));
    }
    put_bytes(&mut out, c.by.as_bytes());
    out
}

/// The next length-prefixed field of a record as text.
fn text(f: &mut Reader<'_>) -> Option<String> {
    std::str::from_utf8(f.bytes()?).ok().map(str::to_string)
}

pub(crate) fn decode(k: &[u8], v: &[u8]) -> Result<LoggedChange, StoreError> {
    let bad = || {
        StoreError::Corrupt(format!(
            "change log record {:?} is malformed",
            String::from_utf8_lossy(k)
        ))
    };
    let nul = k.iter().position(|&b| b == 0).ok_or_else(bad)?;
    let csn = std::str::from_utf8(&k[..nul])
        .map_err(|_| bad())?
        .to_string();
    let seq = k
        .get(nul + 1..nul + 5)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or_else(bad)?;
    let mut f = Reader { buf: v };
    let format = f.byte().ok_or_else(bad)?;
    if format != 1 && format != RECORD_FORMAT {
        return Err(bad());
    }
    let kind = match f.byte().ok_or_else(bad)? {
        1 => LoggedKind::Add,
        2 => LoggedKind::Delete,
        4 => LoggedKind::Modify,
        8 => LoggedKind::ModDn,
        _ => return Err(bad()),
    };
    let uuid = text(&mut f).ok_or_else(bad)?;
    let dn = text(&mut f).ok_or_else(bad)?;
    let old_dn =
        Some(text(&mut f).ok_or_else(bad)?).filter(|d| !d.is_empty() || kind == LoggedKind::ModDn);
    let count = f.varint().ok_or_else(bad)?;
    let mut mods = Vec::new();
    for _ in 0..count {
        let op = match f.byte().ok_or_else(bad)? {
            0 => ModOp::Add,
            1 => ModOp::Delete,
            2 => ModOp::Replace,
            _ => return Err(bad()),
        };
        let desc = text(&mut f).ok_or_else(bad)?;
        let n = f.varint().ok_or_else(bad)?;
        let mut values = Vec::new();
        for _ in 0..n {
            values.push(f.bytes().ok_or_else(bad)?.to_vec());
        }
        mods.push(LoggedMod { op, desc, values });
    }
    let by = if format >= 2 {
        text(&mut f).ok_or_else(bad)?
    } else {
        String::new()
    };
    Ok(LoggedChange {
        csn,
        seq,
        kind,
        uuid,
        dn,
        old_dn,
        mods,
        by,
    })
}

/// The log's records as stored (key, value).
pub(crate) type RawRecords<'v> =
    Box<dyn Iterator<Item = Result<(&'v [u8], &'v [u8]), StoreError>> + 'v>;

/// What the change log holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangelogSummary {
    pub count: u64,
    pub oldest_csn: Option<String>,
    /// Every change with a greater CSN is logged ("" = every change).
    pub floor: String,
}

impl View<'_> {
    fn changelog_db(&self) -> Option<&Db> {
        self.inner.changelog.as_ref()
    }

    /// Every change made through the write pipeline with a CSN greater
    /// than this is in the log ("": every change).
    pub fn changelog_floor(&self) -> Result<String, StoreError> {
        Ok(match self.inner.meta.get(self.txn, META_FLOOR)? {
            Some(v) => String::from_utf8_lossy(v).into_owned(),
            // A read-only view of a store from before the log: nothing is covered.
            None if self.changelog_db().is_none() => "~".to_string(),
            None => String::new(),
        })
    }

    /// How many times entries were written around the log (see the
    /// module's header).
    pub fn unlogged_writes(&self) -> Result<u64, StoreError> {
        Ok(match self.inner.meta.get(self.txn, META_UNLOGGED)? {
            Some(v) => <[u8; 8]>::try_from(v).map_or(0, u64::from_be_bytes),
            None => 0,
        })
    }

    /// The raw records (key, value) with a CSN greater than `after` ("":
    /// all), in key order: for a backup, which copies them as they are.
    pub(crate) fn raw_changes_after<'v>(
        &'v self,
        after: &str,
    ) -> Result<RawRecords<'v>, StoreError> {
        let Some(db) = self.changelog_db() else {
            return Ok(Box::new(std::iter::empty()));
        };
        // Every key of CSN `after` is `after` ‖ 0 ‖ …, which sorts before
        // `after` ‖ 1: the range starts past all of them.
        let mut from = after.as_bytes().to_vec();
        from.push(1);
        let start = match after {
            "" => Bound::Unbounded,
            _ => Bound::Included(from.as_slice()),
        };
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (start, Bound::Unbounded);
        let iter = db.range(self.txn, &range)?;
        Ok(Box::new(iter.map(|item| item.map_err(StoreError::from))))
    }

    /// The logged changes with a CSN greater than `after` ("": all), in
    /// CSN order, one operation's entries in the order written.
    pub fn changes_after<'v>(
        &'v self,
        after: &str,
    ) -> Result<Box<dyn Iterator<Item = Result<LoggedChange, StoreError>> + 'v>, StoreError> {
        let raw = self.raw_changes_after(after)?;
        Ok(Box::new(raw.map(|item| {
            let (k, v) = item?;
            decode(k, v)
        })))
    }

    /// The logged change whose record has key `k` (see [`key`]).
    pub(crate) fn change_by_key(&self, k: &[u8]) -> Result<Option<LoggedChange>, StoreError> {
        let Some(db) = self.changelog_db() else {
            return Ok(None);
        };
        match db.get(self.txn, k)? {
            Some(v) => Ok(Some(decode(k, v)?)),
            None => Ok(None),
        }
    }

    /// The logged changes of the operation stamped `csn`, in the order
    /// written.
    pub fn changes_at(&self, csn: &str) -> Result<Vec<LoggedChange>, StoreError> {
        let Some(db) = self.changelog_db() else {
            return Ok(Vec::new());
        };
        // Its keys are `csn` ‖ 0 ‖ seq ‖ uuid: at or after `csn` ‖ 0,
        // before `csn` ‖ 1.
        let (mut from, mut to) = (csn.as_bytes().to_vec(), csn.as_bytes().to_vec());
        from.push(0);
        to.push(1);
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (
            Bound::Included(from.as_slice()),
            Bound::Excluded(to.as_slice()),
        );
        db.range(self.txn, &range)?
            .map(|item| {
                let (k, v) = item?;
                decode(k, v)
            })
            .collect()
    }

    /// Per server ID, how many logged operations (distinct CSNs) are newer
    /// than `seen`'s CSN for that server ID, looking at no more than
    /// `max_ops` operations: the bool says whether the counts are exact.
    /// Keys only, from the oldest CSN of `seen` on (older keys are not
    /// newer than any of them), so a caller that is nearly current costs
    /// little whatever the log's length. A server ID `seen` lacks is
    /// counted from there too: its count is a lower bound (and the log's
    /// floor bounds every count; see `changelog_floor`).
    pub fn count_changes_after(
        &self,
        seen: &BTreeMap<u16, String>,
        max_ops: u64,
    ) -> Result<(BTreeMap<u16, u64>, bool), StoreError> {
        let mut counts = BTreeMap::new();
        let Some(db) = self.changelog_db() else {
            return Ok((counts, true));
        };
        // Keys of CSN `c` are `c` ‖ 0 ‖ …: `c` ‖ 1 sorts past all of them.
        let from = seen.values().min().map(|c| {
            let mut k = c.as_bytes().to_vec();
            k.push(1);
            k
        });
        let start = match &from {
            Some(k) => Bound::Included(k.as_slice()),
            None => Bound::Unbounded,
        };
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (start, Bound::Unbounded);
        let mut last: Vec<u8> = Vec::new();
        let mut ops = 0u64;
        for item in db.range(self.txn, &range)? {
            let (k, _) = item?;
            let csn = &k[..k.iter().position(|&b| b == 0).unwrap_or(k.len())];
            if csn == last.as_slice() {
                continue;
            }
            if ops == max_ops {
                return Ok((counts, false));
            }
            ops += 1;
            last.clear();
            last.extend_from_slice(csn);
            let text = std::str::from_utf8(csn).unwrap_or("");
            let Some(sid) = csn_sid(text) else { continue };
            if seen.get(&sid).is_some_and(|s| text <= s.as_str()) {
                continue;
            }
            *counts.entry(sid).or_insert(0) += 1;
        }
        Ok((counts, true))
    }

    /// Records in the change log (LMDB keeps the count: no page is read).
    pub fn changelog_len(&self) -> Result<u64, StoreError> {
        match self.changelog_db() {
            Some(db) => Ok(db.len(self.txn)?),
            None => Ok(0),
        }
    }

    pub fn changelog_summary(&self) -> Result<ChangelogSummary, StoreError> {
        let floor = self.changelog_floor()?;
        let Some(db) = self.changelog_db() else {
            return Ok(ChangelogSummary {
                floor,
                ..ChangelogSummary::default()
            });
        };
        let oldest = match db.first(self.txn)? {
            Some((k, v)) => Some(decode(k, v)?.csn),
            None => None,
        };
        Ok(ChangelogSummary {
            count: db.len(self.txn)?,
            oldest_csn: oldest,
            floor,
        })
    }
}

impl WriteTxn<'_> {
    fn changelog_db_mut(&self) -> Result<Db, StoreError> {
        self.inner
            .changelog
            .ok_or_else(|| StoreError::Corrupt("the store has no change log".into()))
    }

    /// Log `c` (in the transaction that makes the change).
    pub fn log_change(&mut self, c: &LoggedChange) -> Result<(), StoreError> {
        self.log(&c.to_log())
    }

    /// Log `c`, borrowed (in the transaction that makes the change).
    pub fn log(&mut self, c: &ChangeToLog<'_>) -> Result<(), StoreError> {
        let db = self.changelog_db_mut()?;
        let (k, v) = (key(c), encode(c));
        // Appended at the end (this server's CSNs only grow), which fills
        // pages instead of splitting them in halves; a received change
        // older than the newest record goes in its place.
        let new = match db.put_with_flags(&mut self.txn, PutFlags::APPEND, &k, &v) {
            Err(heed::Error::Mdb(heed::MdbError::KeyExist)) => {
                let new = db.get(&self.txn, &k)?.is_none();
                db.put(&mut self.txn, &k, &v)?;
                new
            }
            other => {
                other?;
                true
            }
        };
        // A record written again (the same change received twice) keeps
        // its number.
        if new {
            self.number_change(&k)?;
        }
        Ok(())
    }

    /// Entries were written without change log records (counted: see the
    /// module's header).
    pub fn count_unlogged_write(&mut self) -> Result<(), StoreError> {
        let n = self.view().unlogged_writes()? + 1;
        self.inner
            .meta
            .put(&mut self.txn, META_UNLOGGED, &n.to_be_bytes())?;
        Ok(())
    }

    /// Data was written around the log, up to `csn`: the log covers only
    /// what comes after. Never lowers the floor.
    pub fn raise_changelog_floor(&mut self, csn: &str) -> Result<(), StoreError> {
        let floor = self.view().changelog_floor()?;
        if csn > floor.as_str() {
            self.inner
                .meta
                .put(&mut self.txn, META_FLOOR, csn.as_bytes())?;
        }
        Ok(())
    }

    /// Remove up to `max` records, oldest first, while they are older than
    /// `before` (a CSN or its time prefix) or more than `keep` remain; the
    /// floor rises to the newest CSN removed. Returns how many went.
    pub fn purge_changes(
        &mut self,
        before: &str,
        keep: u64,
        max: usize,
    ) -> Result<usize, StoreError> {
        let db = self.changelog_db_mut()?;
        let mut count = db.len(&self.txn)?;
        let mut n = 0;
        let mut newest: Option<String> = None;
        {
            let mut iter = db.iter_mut(&mut self.txn)?;
            while n < max {
                let Some(item) = iter.next() else { break };
                let (k, _) = item?;
                let csn_end = k.iter().position(|&b| b == 0).unwrap_or(k.len());
                let csn = &k[..csn_end];
                if csn >= before.as_bytes() && count <= keep {
                    break;
                }
                let csn = String::from_utf8_lossy(csn).into_owned();
                // SAFETY: nothing borrowed from the cursor is kept across
                // the deletion (the CSN was copied).
                unsafe { iter.del_current()? };
                newest = Some(csn);
                count -= 1;
                n += 1;
            }
        }
        if let Some(csn) = newest {
            self.raise_changelog_floor(&csn)?;
            self.drop_purged_numbers(max.saturating_mul(2))?;
        }
        Ok(n)
    }
}

/// Open the change log, creating it when missing. A store from before the
/// log gets its floor at its newest CSN (`newest`): nothing older is
/// covered. The tombstones the log replaced are dropped with it.
pub(crate) fn open(
    env: &heed::Env,
    wtxn: &mut heed::RwTxn<'_>,
    meta: Db,
    existing_store: bool,
    newest: Option<&str>,
) -> Result<Db, StoreError> {
    if let Some(db) = env.open_database::<Bytes, Bytes>(wtxn, Some(NAME))? {
        return Ok(db);
    }
    let db = env.create_database::<Bytes, Bytes>(wtxn, Some(NAME))?;
    if existing_store {
        meta.put(wtxn, META_FLOOR, newest.unwrap_or("").as_bytes())?;
        if let Some(old) = env.open_database::<Bytes, Bytes>(wtxn, Some(OLD_TOMBSTONES))? {
            old.clear(wtxn)?;
        }
    }
    Ok(db)
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn format_1_records_still_read_and_format_2_keeps_who() {
        let c = LoggedChange {
            csn: "20261125000000.000000Z#000000#001#000000".into(),
            seq: 0,
            kind: LoggedKind::Modify,
            uuid: "u".into(),
            dn: "cn=a".into(),
            old_dn: None,
            mods: vec![LoggedMod {
                op: ModOp::Replace,
                desc: "sn".into(),
                values: vec![b"x".to_vec()],
            }],
            by: "cn=admin".into(),
        };
        let (k, v) = (key(&c.to_log()), encode(&c.to_log()));
        assert_eq!(decode(&k, &v).unwrap(), c);
        // Format 1: the same record without who made it.
        let mut old = v.clone();
        old[0] = 1;
        old.truncate(old.len() - 1 - c.by.len());
        let read = decode(&k, &old).unwrap();
        assert_eq!(read.by, "");
        assert_eq!(read.mods, c.mods);
    }

    #[test]
    fn a_logged_password_is_not_printed() {
        let m = |desc: &str| LoggedMod {
            op: ModOp::Add,
            desc: desc.into(),
            values: vec![b"{SSHA}c2VjcmV0".to_vec()],
        };
        let shown = format!("{:?}", m("userPassword;x-opt"));
        assert!(!shown.contains("SSHA"), "{shown}");
        assert!(shown.contains("<1 hidden>"), "{shown}");
        assert!(format!("{:?}", m("description")).contains("{SSHA}c2VjcmV0"));
    }
}
