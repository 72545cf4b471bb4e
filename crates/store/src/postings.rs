//! Posting lists kept in chunks: an index key's entry IDs are stored as one
//! record per range of 65,536 IDs (a Roaring container's worth), so adding
//! or removing one ID reads and rewrites one record of at most 8 KiB,
//! however many entries share the key (objectClass=inetOrgPerson in a
//! store of ten million). Reading a key's list reads its records in order.
//!
//! A record's key is the index key with each NUL byte written as `00 FF`,
//! then `00`, then the chunk number (the ID's bits above the low 16) in as
//! few bytes as sort in its order: one byte below 248 (every chunk of a
//! store of up to 16 million entries), else a byte 248 + n - 1 and the
//! number's n bytes big-endian. A chunk number's first byte is at most
//! `FD`, so a NUL followed by anything but `FF` ends the key. The escape
//! keeps LMDB's byte order equal to the order of (index key, chunk), so
//! ranges of index keys (the ordering index) are ranges of records, and
//! one key's records are contiguous. (Format 7; format 5 ended the key
//! with `00 00`, format 4 also wrote 6 bytes of chunk number always.)
//!
//! A record's value is the chunk's IDs, in the shortest of three forms:
//! 2 bytes (the low 16 bits) when it holds one ID, as for a unique
//! attribute; [`GAPS`] then the low 16 bits of the first ID and the gap
//! before each next one (minus one) as LEB128, when the IDs are sparse (at
//! most 4,096, as many as a Roaring array holds: a substring gram shared
//! by a thousand entries of a chunk takes about a byte each, half of
//! Roaring's array); or a serialised RoaringBitmap of the IDs' low 32 bits
//! (8 KiB for a dense chunk), whose first byte is never [`GAPS`].
//!
//! Must not know what the keys mean (the index layer does) or which
//! database holds them.

use std::collections::BTreeMap;
use std::ops::Bound;

use heed::{PutFlags, RoTxn, RwTxn};
use roaring::{RoaringBitmap, RoaringTreemap};

use crate::{Db, EntryId, StoreError};

/// Bits of an ID below its chunk number.
const LOW_BITS: u32 = 16;
/// Most bytes of a chunk number written big-endian after its length byte.
const CHUNK_BYTES: usize = 6;
/// The highest chunk number a record's key can hold (IDs have 64 bits).
const LAST_CHUNK: u64 = u64::MAX >> LOW_BITS;
/// Chunk numbers below this are written as one byte; a byte from here on
/// starts a longer number (its length - 1 added to this).
const ONE_BYTE: u64 = 0xF8;
/// Ends the escaped index key; sorts below every escaped byte, and an
/// escaped NUL (`00 FF`) is told from it by the next byte (no chunk
/// number starts with `FF`).
const END: [u8; 1] = [0];
/// Most IDs a chunk holds as gaps: Roaring's largest array container.
const SPARSE_MAX: u64 = 4096;
/// First byte of a value holding a chunk's IDs as gaps (a serialised
/// RoaringBitmap starts with its cookie, `3A` or `3B`).
const GAPS: u8 = 1;

/// The bytes an index key takes in a record's key before [`END`]: its
/// length plus one per NUL byte (each is escaped).
pub fn escaped_len(key: &[u8]) -> usize {
    key.len() + key.iter().filter(|&&b| b == 0).count()
}

/// The escaped key and [`END`]: every record of `key` starts with it.
fn prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped_len(key) + END.len() + CHUNK_BYTES);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&END);
    out
}

fn chunk_of(id: EntryId) -> u64 {
    id >> LOW_BITS
}

fn record_key(prefix: &[u8], chunk: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 1 + CHUNK_BYTES);
    k.extend_from_slice(prefix);
    put_chunk(&mut k, chunk);
    k
}

/// `chunk` in its shortest form (see the module comment): numbers sort as
/// their forms do, and no form is a prefix of another.
fn put_chunk(out: &mut Vec<u8>, chunk: u64) {
    if chunk < ONE_BYTE {
        out.push(chunk as u8);
        return;
    }
    let n = (64 - chunk.leading_zeros() as usize).div_ceil(8);
    out.push((ONE_BYTE as usize + n - 1) as u8);
    out.extend_from_slice(&chunk.to_be_bytes()[8 - n..]);
}

/// The chunk number written as `form` (all of it); None unless `form` is
/// the shortest form of a number a record may hold.
fn read_chunk(form: &[u8]) -> Option<u64> {
    let (&first, rest) = form.split_first()?;
    if u64::from(first) < ONE_BYTE {
        return rest.is_empty().then_some(u64::from(first));
    }
    let n = usize::from(first) - ONE_BYTE as usize + 1;
    if n > CHUNK_BYTES || rest.len() != n || (n > 1 && rest[0] == 0) {
        return None;
    }
    let mut b = [0u8; 8];
    b[8 - n..].copy_from_slice(rest);
    let chunk = u64::from_be_bytes(b);
    (chunk >= ONE_BYTE).then_some(chunk)
}

/// Where the chunk number starts in a record's key: after the first NUL
/// byte not followed by `FF` (an escaped key's NUL bytes are).
fn chunk_start(rec: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = rec[at..].iter().position(|&b| b == 0) {
        let i = at + i;
        match rec.get(i + 1)? {
            0xFF => at = i + 2,
            _ => return Some(i + 1),
        }
    }
    None
}

/// A record's key as (index key, chunk number).
pub fn split_record_key(rec: &[u8]) -> Result<(Vec<u8>, u64), StoreError> {
    let bad = || StoreError::Corrupt(format!("index record key {rec:02x?} is malformed"));
    let start = chunk_start(rec).ok_or_else(bad)?;
    let body = &rec[..start - END.len()];
    let chunk = read_chunk(&rec[start..]).ok_or_else(bad)?;
    let mut key = Vec::with_capacity(body.len());
    let mut bytes = body.iter();
    while let Some(&b) = bytes.next() {
        if b == 0 && bytes.next() != Some(&0xFF) {
            return Err(bad());
        }
        key.push(b);
    }
    Ok((key, chunk))
}

/// The IDs of one chunk as stored (low 32 bits of each ID).
fn encode_chunk(bits: &RoaringBitmap, out: &mut Vec<u8>) {
    out.clear();
    if bits.len() == 1 {
        if let Some(one) = bits.min() {
            out.extend_from_slice(&(one as u16).to_be_bytes());
            return;
        }
    }
    // Gaps only where Roaring would keep an array: a chunk decoded from
    // gaps is then built by appending to an array, never to a bitmap
    // (whose append scans for its maximum each time).
    let one_chunk = bits.min().map(|x| x >> LOW_BITS) == bits.max().map(|x| x >> LOW_BITS);
    if bits.len() <= SPARSE_MAX && one_chunk && put_gaps(bits.iter(), bits.serialized_size(), out) {
        return;
    }
    out.reserve(bits.serialized_size());
    // Writing into a Vec cannot fail.
    let _ = bits.serialize_into(&mut *out);
}

/// [`encode_chunk`] of the IDs `ids` (ascending, all in one chunk)
/// without building their bitmap unless Roaring's form is the shortest.
fn encode_sorted(ids: &[EntryId], out: &mut Vec<u8>) {
    out.clear();
    if let [one] = ids {
        out.extend_from_slice(&(*one as u16).to_be_bytes());
        return;
    }
    let lows = ids.iter().map(|&id| id as u32);
    if ids.len() as u64 <= SPARSE_MAX && put_gaps(lows.clone(), array_form_len(ids.len()), out) {
        return;
    }
    // Strictly ascending (`append_sorted` checked), so the bitmap takes
    // every ID.
    let bits = RoaringBitmap::from_sorted_iter(lows).unwrap_or_default();
    out.reserve(bits.serialized_size());
    let _ = bits.serialize_into(&mut *out);
}

/// Bytes of a serialised RoaringBitmap holding `n` IDs (2 ≤ n ≤
/// [`SPARSE_MAX`]) of one chunk: one array container (a unit test holds
/// it to `serialized_size`).
fn array_form_len(n: usize) -> usize {
    16 + 2 * n
}

/// Write [`GAPS`] and the gaps of `lows` (ascending, one chunk) to the
/// empty `out`; kept and true when no longer than `limit` bytes, else
/// `out` is emptied again.
fn put_gaps(lows: impl Iterator<Item = u32>, limit: usize, out: &mut Vec<u8>) -> bool {
    out.push(GAPS);
    let mut next = 0u32;
    for low in lows.map(|x| x & 0xFFFF) {
        crate::entry_codec::put_varint(out, u64::from(low - next));
        next = low + 1;
    }
    if out.len() <= limit {
        return true;
    }
    out.clear();
    false
}

/// The IDs of a [`GAPS`] value (after the tag) in the chunk at `base`;
/// None when malformed (past the chunk, or cut short).
fn decode_gaps(base: u32, v: &[u8]) -> Option<RoaringBitmap> {
    let mut r = crate::entry_codec::Reader { buf: v };
    let mut bits = RoaringBitmap::new();
    let mut next = 0u64;
    while !r.buf.is_empty() {
        let low = next.checked_add(r.varint()?)?;
        if low > 0xFFFF || bits.len() >= SPARSE_MAX {
            return None;
        }
        bits.push(base | low as u32);
        next = low + 1;
    }
    (bits.len() >= 2).then_some(bits)
}

/// A chunk's IDs (low 32 bits) from its record; every ID must lie in
/// chunk `chunk`.
fn decode_chunk(chunk: u64, v: &[u8]) -> Result<RoaringBitmap, StoreError> {
    let base = ((chunk as u32) & 0xFFFF) << LOW_BITS;
    if let Ok(two) = <[u8; 2]>::try_from(v) {
        let mut one = RoaringBitmap::new();
        one.insert(base | u16::from_be_bytes(two) as u32);
        return Ok(one);
    }
    if let Some((&GAPS, gaps)) = v.split_first() {
        return decode_gaps(base, gaps)
            .ok_or_else(|| StoreError::Corrupt(format!("index chunk {chunk}: malformed gaps")));
    }
    let bits = RoaringBitmap::deserialize_from(v)
        .map_err(|e| StoreError::Corrupt(format!("index chunk {chunk}: {e}")))?;
    let inside = |x: u32| x >> LOW_BITS == base >> LOW_BITS;
    if bits.is_empty() || !bits.min().is_some_and(inside) || !bits.max().is_some_and(inside) {
        return Err(StoreError::Corrupt(format!(
            "index chunk {chunk} holds IDs outside its range"
        )));
    }
    Ok(bits)
}

/// Chunks gathered into a treemap: each OR-ed into the bitmap of its
/// 2^32-ID bucket (one key's chunks never overlap; a range's may). A
/// chunk of one ID (a unique attribute's key: the usual search) goes
/// straight into the treemap, without a bitmap of its own.
#[derive(Default)]
struct Gather {
    ids: RoaringTreemap,
    buckets: BTreeMap<u32, RoaringBitmap>,
}

impl Gather {
    fn add(&mut self, chunk: u64, v: &[u8]) -> Result<(), StoreError> {
        if let Ok(two) = <[u8; 2]>::try_from(v) {
            // A record key's chunk number has 48 bits: the ID fits.
            self.ids
                .insert(chunk << LOW_BITS | u16::from_be_bytes(two) as u64);
            return Ok(());
        }
        let bits = decode_chunk(chunk, v)?;
        *self.buckets.entry((chunk >> 16) as u32).or_default() |= bits;
        Ok(())
    }

    fn done(self) -> RoaringTreemap {
        if self.buckets.is_empty() {
            return self.ids;
        }
        RoaringTreemap::from_bitmaps(self.buckets) | self.ids
    }
}

/// The IDs listed under `key`.
pub fn read(txn: &RoTxn<'_>, db: &Db, key: &[u8]) -> Result<RoaringTreemap, StoreError> {
    let p = prefix(key);
    let hi = record_key(&p, LAST_CHUNK);
    gather(
        txn,
        db,
        (
            Bound::Included(p.as_slice()),
            Bound::Included(hi.as_slice()),
        ),
    )
}

/// The chunk number ending a record's key.
fn chunk_number(rec: &[u8]) -> Result<u64, StoreError> {
    chunk_start(rec)
        .and_then(|at| read_chunk(&rec[at..]))
        .ok_or_else(|| StoreError::Corrupt(format!("index record key {rec:02x?} is malformed")))
}

/// The IDs listed under every key from `from` (or the first) through
/// `to` (or the last), both included.
pub fn read_range(
    txn: &RoTxn<'_>,
    db: &Db,
    from: Option<&[u8]>,
    to: Option<&[u8]>,
) -> Result<RoaringTreemap, StoreError> {
    let lo = from.map(prefix);
    let hi = to.map(|k| record_key(&prefix(k), LAST_CHUNK));
    gather(
        txn,
        db,
        (
            lo.as_deref().map_or(Bound::Unbounded, Bound::Included),
            hi.as_deref().map_or(Bound::Unbounded, Bound::Included),
        ),
    )
}

/// The IDs of every record whose key lies in `range` (record keys, not
/// index keys). Chunks of different index keys overlap: each is OR-ed
/// into its bucket.
fn gather(
    txn: &RoTxn<'_>,
    db: &Db,
    range: (Bound<&[u8]>, Bound<&[u8]>),
) -> Result<RoaringTreemap, StoreError> {
    let mut g = Gather::default();
    for item in db.range(txn, &range)? {
        let (k, v) = item?;
        g.add(chunk_number(k)?, v)?;
    }
    Ok(g.done())
}

/// Add `id` to the list under `key` (`add`), or take it out: one chunk
/// read and rewritten (or deleted when it empties).
pub fn change(
    txn: &mut RwTxn<'_>,
    db: &Db,
    key: &[u8],
    id: EntryId,
    add: bool,
) -> Result<(), StoreError> {
    let chunk = chunk_of(id);
    let rk = record_key(&prefix(key), chunk);
    let mut bits = match db.get(txn, &rk)? {
        Some(v) => decode_chunk(chunk, v)?,
        None => RoaringBitmap::new(),
    };
    let changed = if add {
        bits.insert(id as u32)
    } else {
        bits.remove(id as u32)
    };
    if !changed {
        return Ok(());
    }
    if bits.is_empty() {
        db.delete(txn, &rk)?;
    } else {
        let mut buf = Vec::new();
        encode_chunk(&bits, &mut buf);
        db.put(txn, &rk, &buf)?;
    }
    Ok(())
}

/// Add the IDs `ids` to the list under `key`: each chunk they touch read
/// and rewritten once.
pub fn merge(
    txn: &mut RwTxn<'_>,
    db: &Db,
    key: &[u8],
    ids: &RoaringTreemap,
    buf: &mut Vec<u8>,
) -> Result<(), StoreError> {
    let p = prefix(key);
    for (chunk, mut bits) in chunks(ids) {
        let rk = record_key(&p, chunk);
        if let Some(v) = db.get(txn, &rk)? {
            bits |= decode_chunk(chunk, v)?;
        }
        encode_chunk(&bits, buf);
        db.put(txn, &rk, buf)?;
    }
    Ok(())
}

/// Write the records of `key` holding `ids` (ascending) after every
/// record of `db`: a bulk build filling an empty index in key order.
pub fn append_sorted(
    txn: &mut RwTxn<'_>,
    db: &Db,
    key: &[u8],
    ids: &[EntryId],
    buf: &mut Vec<u8>,
) -> Result<(), StoreError> {
    if ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(StoreError::Corrupt(
            "index IDs out of order in the merge".into(),
        ));
    }
    let p = prefix(key);
    let mut rest = ids;
    while let Some(&first) = rest.first() {
        let chunk = chunk_of(first);
        let (these, tail) = rest.split_at(rest.partition_point(|&id| chunk_of(id) == chunk));
        encode_sorted(these, buf);
        db.put_with_flags(txn, PutFlags::APPEND, &record_key(&p, chunk), buf)?;
        rest = tail;
    }
    Ok(())
}

/// `ids` cut into chunks, in order: (chunk number, the IDs' low 32 bits).
fn chunks(ids: &RoaringTreemap) -> Vec<(u64, RoaringBitmap)> {
    let mut out: Vec<(u64, RoaringBitmap)> = Vec::new();
    for (hi, bm) in ids.bitmaps() {
        for lo in bm.iter() {
            let chunk = ((hi as u64) << 16) | (lo >> LOW_BITS) as u64;
            // IDs come in ascending order: each is above its chunk's last.
            match out.last_mut() {
                Some((c, bits)) if *c == chunk => {
                    bits.push(lo);
                }
                _ => {
                    let mut bits = RoaringBitmap::new();
                    bits.push(lo);
                    out.push((chunk, bits));
                }
            }
        }
    }
    out
}

/// Every (index key, IDs) of `db` in key order: for `verify`.
pub fn each_key(
    txn: &RoTxn<'_>,
    db: &Db,
    f: &mut dyn FnMut(&[u8], RoaringTreemap),
) -> Result<(), StoreError> {
    let mut current: Option<(Vec<u8>, Gather)> = None;
    for item in db.iter(txn)? {
        let (k, v) = item?;
        let (key, chunk) = split_record_key(k)?;
        match &mut current {
            Some((ck, g)) if *ck == key => g.add(chunk, v)?,
            _ => {
                if let Some((ck, g)) = current.take() {
                    f(&ck, g.done());
                }
                let mut g = Gather::default();
                g.add(chunk, v)?;
                current = Some((key, g));
            }
        }
    }
    if let Some((ck, g)) = current {
        f(&ck, g.done());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_keep_the_order_of_index_keys_and_chunks() {
        let keys: Vec<&[u8]> = vec![
            b"",
            b"\x00",
            b"\x00\x00",
            b"\x00\x01",
            b"\x01",
            b"a",
            b"a\x00",
            b"a\x00b",
            b"a\x01",
            b"ab",
            b"abc",
            b"b",
            b"\xff",
            b"\xff\x00",
        ];
        let mut recs = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            for chunk in [0u64, 1, 247, 248, 255, 256, 65_535, 1 << 40, LAST_CHUNK] {
                recs.push(((i, chunk), record_key(&prefix(k), chunk)));
            }
        }
        let mut sorted = recs.clone();
        sorted.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            sorted.iter().map(|r| r.0).collect::<Vec<_>>(),
            recs.iter().map(|r| r.0).collect::<Vec<_>>()
        );
        for ((i, chunk), rk) in &recs {
            assert_eq!(split_record_key(rk).unwrap(), (keys[*i].to_vec(), *chunk));
        }
        assert!(split_record_key(b"a\x00b\x00\x00\x00\x00\x00\x00\x00\x01").is_err());
        assert!(split_record_key(b"short").is_err());
        // Chunk numbers in their shortest form only, and nothing after.
        assert_eq!(record_key(&prefix(b"a"), 247), b"a\x00\xf7");
        assert_eq!(record_key(&prefix(b"a"), 248), b"a\x00\xf8\xf8");
        assert_eq!(record_key(&prefix(b"a"), 256), b"a\x00\xf9\x01\x00");
        assert_eq!(record_key(&prefix(b"a\x00"), 0), b"a\x00\xff\x00\x00");
        assert_eq!(record_key(b"", LAST_CHUNK).len(), 7);
        assert!(record_key(b"", LAST_CHUNK)[0] < 0xFF);
        for bad in [
            &b"a\x00"[..],
            b"a\x00\x01\x02",
            b"a\x00\xf8\x05",
            b"a\x00\xf9\x00\xff",
            b"a\x00\xf9\x01",
            b"a\x00\xfe\x01\x01\x01\x01\x01\x01\x01",
            b"a\x00\xff",
        ] {
            assert!(split_record_key(bad).is_err(), "{bad:02x?}");
            assert!(chunk_number(bad).is_err(), "{bad:02x?}");
        }
    }

    #[test]
    fn chunks_round_trip() {
        for ids in [
            vec![7u64],
            vec![1, 2, 3, 65_535, 65_536, 1 << 32, (1 << 32) + 70_000],
            (0..200_000).collect(),
            vec![u64::MAX >> 16],
        ] {
            let set: RoaringTreemap = ids.iter().copied().collect();
            let mut g = Gather::default();
            let mut buf = Vec::new();
            for (chunk, bits) in chunks(&set) {
                assert!(bits.len() <= 65_536);
                encode_chunk(&bits, &mut buf);
                assert_eq!(buf.len() == 2, bits.len() == 1);
                assert!(buf.len() <= 8_300, "a chunk of {} bytes", buf.len());
                g.add(chunk, &buf).unwrap();
            }
            assert_eq!(g.done(), set);
        }
        assert!(decode_chunk(0, b"garbage").is_err());
        // Sparse chunks are gaps, about a byte per ID; dense ones Roaring.
        let sparse: RoaringBitmap = (0..1000u32).map(|i| (3 << 16) | (i * 60)).collect();
        let mut buf = Vec::new();
        encode_chunk(&sparse, &mut buf);
        assert_eq!((buf[0], buf.len()), (GAPS, 1 + 1000));
        assert_eq!(decode_chunk(3, &buf).unwrap(), sparse);
        let dense: RoaringBitmap = (0..30_000u32).map(|i| i * 2).collect();
        encode_chunk(&dense, &mut buf);
        assert_ne!(buf[0], GAPS);
        assert_eq!(decode_chunk(0, &buf).unwrap(), dense);
        // Past Roaring's arrays, a bitmap, even where gaps would be shorter
        // (consecutive IDs: a byte each); and gaps listing more are refused.
        let run: RoaringBitmap = (0..4097u32).collect();
        encode_chunk(&run, &mut buf);
        assert_ne!(buf[0], GAPS);
        let at_most: RoaringBitmap = (0..4096u32).collect();
        encode_chunk(&at_most, &mut buf);
        assert_eq!((buf[0], buf.len()), (GAPS, 1 + 4096));
        buf.push(0);
        assert!(decode_chunk(0, &buf).is_err(), "4,097 IDs as gaps");
        for bad in [
            &[GAPS][..],
            &[GAPS, 5, 0x80],
            &[GAPS, 0x85, 0x80],
            &[GAPS, 0xFF, 0xFF, 0x03, 1],
            &[GAPS, 0xFF, 0xFF, 0x03, 0],
        ] {
            assert!(decode_chunk(0, bad).is_err(), "{bad:02x?}");
        }
        let mut far = RoaringBitmap::new();
        far.insert(1 << 20);
        far.insert(5);
        let mut buf = Vec::new();
        encode_chunk(&far, &mut buf);
        assert!(
            decode_chunk(0, &buf).is_err(),
            "IDs of two chunks in one record"
        );
    }

    /// The bulk build's encoding from a sorted slice writes what
    /// [`encode_chunk`] writes for the same IDs, chunk by chunk.
    #[test]
    fn sorted_slices_encode_as_their_bitmaps() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let base = 5u64 << 16;
        let mut sets: Vec<Vec<u64>> = vec![
            vec![base + 9],
            vec![base, base + 65_535],
            (0..4096).map(|i| base + i).collect(),
            (0..4097).map(|i| base + i).collect(),
            (0..4096).map(|i| base + i * 16).collect(),
            (0..30_000).map(|i| base + i * 2).collect(),
        ];
        for n in [2usize, 3, 15, 16, 17, 200, 4095, 4096, 4097, 9000] {
            let mut ids: Vec<u64> = (0..n).map(|_| base + next() % 65_536).collect();
            ids.sort_unstable();
            ids.dedup();
            sets.push(ids);
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for ids in &sets {
            let bits: RoaringBitmap = ids.iter().map(|&id| id as u32).collect();
            if (2..=SPARSE_MAX).contains(&bits.len()) {
                assert_eq!(array_form_len(ids.len()), bits.serialized_size());
            }
            encode_chunk(&bits, &mut a);
            encode_sorted(ids, &mut b);
            assert_eq!(a, b, "{} IDs", ids.len());
        }
    }

    /// Random adds and removes on a few keys (one a prefix of another, one
    /// with NUL bytes), with IDs around chunk boundaries and beyond 2^32:
    /// after each step, every key's list, the key walk and ranges of keys
    /// equal a plain model's.
    #[test]
    fn lists_agree_with_a_model_after_random_changes() {
        use std::collections::BTreeSet;
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: a fresh directory only this test opens.
        let env = unsafe {
            heed::EnvOpenOptions::new()
                .map_size(1 << 30)
                .max_dbs(2)
                .open(dir.path())
                .unwrap()
        };
        let mut w = env.write_txn().unwrap();
        let db: Db = env.create_database(&mut w, Some("ix:t:eq")).unwrap();
        w.commit().unwrap();
        let keys: [&[u8]; 5] = [b"a", b"a\x00", b"ab", b"\x00\x00", b"b"];
        let mut model: BTreeMap<Vec<u8>, BTreeSet<u64>> = BTreeMap::new();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for step in 0..3_000 {
            let mut w = env.write_txn().unwrap();
            for _ in 0..20 {
                let key = keys[(next() % keys.len() as u64) as usize];
                let base = [0u64, 65_536, 1 << 32, (1 << 32) + (5 << 16)][(next() % 4) as usize];
                let id = base + next() % 70_000;
                let add = next() % 3 != 0;
                change(&mut w, &db, key, id, add).unwrap();
                let set = model.entry(key.to_vec()).or_default();
                if add {
                    set.insert(id);
                } else {
                    set.remove(&id);
                }
            }
            if step % 100 == 0 {
                // A bulk merge into lists that already hold IDs.
                let key = keys[(next() % keys.len() as u64) as usize];
                let more: RoaringTreemap = (0..300).map(|_| next() % 200_000).collect();
                let mut buf = Vec::new();
                merge(&mut w, &db, key, &more, &mut buf).unwrap();
                model.entry(key.to_vec()).or_default().extend(more.iter());
            }
            w.commit().unwrap();
            if step % 250 != 249 {
                continue;
            }
            let r = env.read_txn().unwrap();
            let want = |k: &[u8]| -> RoaringTreemap {
                model
                    .get(k)
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default()
            };
            for k in keys {
                assert_eq!(read(&r, &db, k).unwrap(), want(k), "step {step}, key {k:?}");
            }
            let mut walked = Vec::new();
            each_key(&r, &db, &mut |k, ids| walked.push((k.to_vec(), ids))).unwrap();
            let expected: Vec<_> = model
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(k, s)| (k.clone(), s.iter().copied().collect::<RoaringTreemap>()))
                .collect();
            assert_eq!(walked, expected, "step {step}");
            for lo in keys {
                for hi in keys {
                    let mut union = RoaringTreemap::new();
                    for (k, s) in &model {
                        if k.as_slice() >= lo && k.as_slice() <= hi {
                            union.extend(s.iter().copied());
                        }
                    }
                    let got = read_range(&r, &db, Some(lo), Some(hi)).unwrap();
                    assert_eq!(got, union, "step {step}, {lo:?}..={hi:?}");
                }
                let below: RoaringTreemap = model
                    .iter()
                    .filter(|(k, _)| k.as_slice() <= lo)
                    .flat_map(|(_, s)| s.iter().copied())
                    .collect();
                assert_eq!(read_range(&r, &db, None, Some(lo)).unwrap(), below);
            }
        }
        // One change rewrites one record, however long the list.
        let mut w = env.write_txn().unwrap();
        let big: RoaringTreemap = (0..1_000_000u64).collect();
        let mut buf = Vec::new();
        merge(&mut w, &db, b"big", &big, &mut buf).unwrap();
        w.commit().unwrap();
        let r = env.read_txn().unwrap();
        let records = db.prefix_iter(&r, &prefix(b"big")).unwrap().count();
        assert_eq!(records, 16, "a million IDs in 65,536-ID chunks");
        let largest = db
            .prefix_iter(&r, &prefix(b"big"))
            .unwrap()
            .map(|i| i.unwrap().1.len())
            .max()
            .unwrap();
        assert!(largest <= 8_300, "largest record {largest} bytes");
        assert_eq!(read(&r, &db, b"big").unwrap(), big);
        drop(r);
        // A bulk build appends a key's records after every other key's.
        let appended: Vec<u64> = (0..70_000u64)
            .chain([200_000, 300_000, 300_001, 1 << 32, (1 << 40) + 3])
            .collect();
        let mut w = env.write_txn().unwrap();
        append_sorted(&mut w, &db, b"zz\x00", &appended, &mut buf).unwrap();
        w.commit().unwrap();
        let r = env.read_txn().unwrap();
        let want: RoaringTreemap = appended.iter().copied().collect();
        assert_eq!(read(&r, &db, b"zz\x00").unwrap(), want);
        assert_eq!(read(&r, &db, b"big").unwrap(), big);
        drop(r);
        let mut w = env.write_txn().unwrap();
        for bad in [&[5u64, 5][..], &[7, 3]] {
            let err = append_sorted(&mut w, &db, b"zzz", bad, &mut buf).unwrap_err();
            assert!(err.to_string().contains("out of order"), "{err}");
        }
    }
}
