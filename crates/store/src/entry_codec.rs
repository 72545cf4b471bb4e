//! The stored form of an entry in `id2entry`, plain or zstd-compressed.
//!
//! ```text
//! format 1 (plain)
//! offset  size  field
//! 0       1     format (1)
//! 1       4     CRC-32 (IEEE) of every byte after this field, little-endian
//! 5       var   body:
//!                 attribute count (LEB128)
//!                 per attribute:
//!                   var   description length (LEB128), then the canonical description bytes
//!                   var   value count (LEB128)
//!                   per value: var length (LEB128), then the value bytes
//!
//! format 3 (compressed; store format 7)
//! 0       1     format (3)
//! 1       4     CRC-32 (IEEE) of every byte after this field, little-endian
//! 5       var   dictionary ID (LEB128; 0 = compressed without a dictionary)
//!         var   length of the body once decompressed (LEB128)
//!         rest  one zstd frame holding the format-1 body, without the
//!               frame's 4-byte magic number (zstd's magicless format)
//!
//! format 2 (compressed, written before store format 7): as format 3, the
//! frame with its magic number
//!
//! format 4 (compressed, split body; store format 8): as format 3, the body
//! split in two: every attribute's description and value count first,
//! then every value in the same order
//!                 attribute count (LEB128)
//!                 per attribute: description length (LEB128), description,
//!                   value count (LEB128)
//!                 per value of each attribute in turn: length (LEB128), bytes
//!               Entries of one shape then share their first part byte for
//!               byte, which a dictionary trained on split bodies matches
//!               in one go: users of `pando gen` compress 9 bytes smaller
//!               (of ~160). Written with dictionaries trained on split
//!               bodies only (`zstd_dict_split:<id>` in meta).
//!
//! placed (store format 6): the format byte with PLACED (0x80) set
//! 0       1     format (0x81 to 0x84)
//! 1       4     CRC-32 (IEEE) of every byte after this field, little-endian
//! 5       var   placement length P (LEB128)
//!         P     placement: the parent's ID (LEB128), then the RDN field
//!               of an `id2parent` record (see `keys`)
//!         rest  as format 1, 2, 3 or 4 after its CRC
//! ```
//!
//! The DN is not stored here, only the entry's place: its parent and RDN,
//! so that renaming or moving a subtree rewrites one record, not every
//! descendant. Stores before format 6 kept the place in `id2parent`; their
//! records (formats 1 and 2) read as they are, and gain their place when
//! next written. Reading the place needs no decompression. The checksum
//! lets reads and `pando verify` detect corruption end to end without
//! decompressing.
//!
//! Dictionaries are trained from a sample of the entries (by `pando import`)
//! and kept in `meta` under `zstd_dict:<id>`; `zstd_dict_current` names the
//! one new entries use. Each compressed entry names its dictionary, so a
//! dictionary can be retrained later and old entries still read; nothing is
//! ever rewritten to change dictionaries.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use pando_model::{Attribute, Dn, Entry};
use zstd::zstd_safe::{self, CCtx, CDict, CParameter, DCtx, DDict};

use crate::StoreError;

pub const ENTRY_FORMAT: u8 = 1;
/// Compressed, the zstd frame with its magic number (read only: written
/// before store format 7).
pub const ENTRY_FORMAT_ZSTD: u8 = 2;
/// Compressed, the zstd frame without its magic number.
pub const ENTRY_FORMAT_ZSTD_BARE: u8 = 3;
/// Compressed as format 3, the body split: descriptions first, then values.
pub const ENTRY_FORMAT_ZSTD_SPLIT: u8 = 4;
/// Set in the format byte of a record that holds its entry's placement.
pub const PLACED: u8 = 0x80;
const HEADER: usize = 5;
/// Bodies are never this large (a PDU is capped far below); a stored length
/// above it means corruption, not a reason to allocate.
const MAX_BODY: u64 = 1 << 30;
/// Below this a body is stored plain when no dictionary is in use:
/// zstd's frame overhead eats the gain.
const MIN_PLAIN_COMPRESS: usize = 256;

/// Meta key of dictionary `id`.
pub fn dict_meta_key(id: u32) -> String {
    format!("zstd_dict:{id}")
}
/// Meta key naming the dictionary new entries are compressed with.
pub const META_DICT_CURRENT: &str = "zstd_dict_current";
/// Meta key present when dictionary `id` was trained on split bodies
/// (entry format 4): entries compressed with it are written split.
pub fn dict_split_meta_key(id: u32) -> String {
    format!("zstd_dict_split:{id}")
}

/// A trained dictionary, prepared for both directions.
pub struct Dict {
    pub id: u32,
    pub bytes: Vec<u8>,
    cdict: CDict<'static>,
    ddict: DDict<'static>,
    /// Unique in the process (a store's dictionary numbers are not):
    /// names the dictionary a reused body came from (see [`Body`]).
    serial: u64,
    /// Trained on split bodies: entries are written in format 4 with it.
    pub split: bool,
}

/// The last [`Dict::serial`] given out; 0 stands for no dictionary.
static DICT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Dict {
    /// Prepared from `bytes`; an error when zstd cannot load them (a
    /// damaged dictionary in a damaged store).
    pub fn new(id: u32, bytes: Vec<u8>, level: i32, split: bool) -> Result<Dict, StoreError> {
        let unusable =
            || StoreError::Corrupt(format!("meta: dictionary {id} cannot be loaded by zstd"));
        let cdict = CDict::try_create(&bytes, level).ok_or_else(unusable)?;
        let ddict = DDict::try_create(&bytes).ok_or_else(unusable)?;
        Ok(Dict {
            id,
            bytes,
            cdict,
            ddict,
            serial: DICT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
            split,
        })
    }
}

/// How entries are written and read: compression setting and the
/// dictionaries known to the store.
pub struct Codec {
    /// zstd level for new entries; [`PLAIN`] stores them plain. Changes
    /// while serving ([`Codec::set_level`]).
    level: std::sync::atomic::AtomicI32,
    dicts: RwLock<HashMap<u32, Arc<Dict>>>,
    current: RwLock<Option<Arc<Dict>>>,
}

// Each cell is borrowed only for one zstd call, or (BODY) emptied while in
// use, so a decode nested inside another on one thread never finds a cell
// borrowed.
thread_local! {
    static CCTX: RefCell<CCtx<'static>> = RefCell::new(frame_cctx());
    static DCTX: RefCell<DCtx<'static>> = RefCell::new(DCtx::create());
    static DCTX_BARE: RefCell<DCtx<'static>> = RefCell::new(bare_dctx());
    /// Decompressed bodies, reused; empty while a decode on this thread
    /// holds it (see `Codec::with_body`).
    static BODY: RefCell<Body> = RefCell::new(Body::default());
}

/// The last body decompressed on a thread, with what it was decompressed
/// from: a search testing a candidate's attribute and then sending its
/// attributes reads one record twice, and decompresses it once. The
/// record's bytes and the dictionary itself (its serial, not its number,
/// which another store may give another dictionary) decide; everything is
/// kept in one cell so that the body and its source are always taken and
/// put back together.
#[derive(Default)]
struct Body {
    plain: Vec<u8>,
    /// The format byte and the record's bytes after its header and
    /// placement; empty when `plain` holds nothing reusable.
    source: Vec<u8>,
    /// The [`Dict::serial`] of its dictionary, 0 for none.
    dict: u64,
}

impl Body {
    fn holds(&self, format: u8, stored: &[u8], dict: u64, len: u64) -> bool {
        self.dict == dict
            && self.plain.len() as u64 == len
            && self.source.split_first() == Some((&format, stored))
    }

    /// Decompress `frame` (of a record in `format` whose bytes after the
    /// header and placement are `stored`) into `plain`, expecting `len`
    /// bytes; Err says why not.
    fn fill(
        &mut self,
        format: u8,
        stored: &[u8],
        frame: &[u8],
        dict: Option<&Arc<Dict>>,
        len: u64,
    ) -> Result<(), String> {
        self.source.clear();
        self.plain.clear();
        self.plain.reserve(len as usize);
        // Borrowed only for the zstd call, which runs no Pando code, so
        // this borrow cannot nest.
        let ctx = match format {
            ENTRY_FORMAT_ZSTD => &DCTX,
            _ => &DCTX_BARE,
        };
        let res = ctx.with(|c| {
            let mut c = c.borrow_mut();
            match dict {
                Some(d) => c.decompress_using_ddict(&mut self.plain, frame, &d.ddict),
                None => c.decompress(&mut self.plain, frame),
            }
        });
        match res {
            Ok(n) if n as u64 == len => {}
            Ok(_) => return Err("decompressed length differs from the stored one".into()),
            Err(code) => return Err(format!("zstd: {}", zstd_safe::get_error_name(code))),
        }
        self.source.push(format);
        self.source.extend_from_slice(stored);
        self.dict = dict.map_or(0, |d| d.serial);
        Ok(())
    }
}

/// A compression context whose frames carry neither the content size nor
/// the dictionary ID (the entry header holds both) nor a checksum (CRC-32
/// covers the record) nor the magic number (the format byte says what
/// follows).
fn frame_cctx() -> CCtx<'static> {
    let mut c = CCtx::create();
    let _ = c.set_parameter(CParameter::ContentSizeFlag(false));
    let _ = c.set_parameter(CParameter::DictIdFlag(false));
    let _ = c.set_parameter(CParameter::ChecksumFlag(false));
    let _ = c.set_parameter(CParameter::Format(zstd_safe::FrameFormat::Magicless));
    c
}

/// A decompression context for frames without their magic number.
fn bare_dctx() -> DCtx<'static> {
    let mut d = DCtx::create();
    let _ = d.set_parameter(zstd_safe::DParameter::Format(
        zstd_safe::FrameFormat::Magicless,
    ));
    d
}

/// `Codec::level` when entries are stored plain.
const PLAIN: i32 = i32::MIN;

impl Codec {
    /// `level`: None = store entries plain.
    pub fn new(level: Option<i32>) -> Codec {
        Codec {
            level: std::sync::atomic::AtomicI32::new(level.unwrap_or(PLAIN)),
            dicts: RwLock::new(HashMap::new()),
            current: RwLock::new(None),
        }
    }

    pub fn level(&self) -> Option<i32> {
        match self.level.load(std::sync::atomic::Ordering::Relaxed) {
            PLAIN => None,
            l => Some(l),
        }
    }

    /// Compress entries written from now on at `level` (None: plain).
    /// Dictionaries are prepared again for the new level; entries already
    /// stored stay readable whatever their form.
    pub fn set_level(&self, level: Option<i32>) {
        let mut dicts = self.dicts.write().unwrap_or_else(|e| e.into_inner());
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        self.level
            .store(level.unwrap_or(PLAIN), std::sync::atomic::Ordering::Relaxed);
        for d in dicts.values_mut() {
            // Loaded once already: these bytes load again (or, failing
            // that, the dictionary keeps its level).
            if let Ok(n) = Dict::new(d.id, d.bytes.clone(), level.unwrap_or(3), d.split) {
                *d = Arc::new(n);
            }
        }
        if let Some(c) = current.as_mut() {
            if let Some(d) = dicts.get(&c.id) {
                *c = d.clone();
            }
        }
    }

    /// Make dictionary `id` (bytes as kept in meta) readable; `current`
    /// also makes it the one new entries use; `split`: it was trained on
    /// split bodies ([`body_of`]).
    pub fn add_dict(
        &self,
        id: u32,
        bytes: Vec<u8>,
        current: bool,
        split: bool,
    ) -> Result<Arc<Dict>, StoreError> {
        let d = Arc::new(Dict::new(id, bytes, self.level().unwrap_or(3), split)?);
        self.dicts
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, d.clone());
        if current {
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(d.clone());
        }
        Ok(d)
    }

    pub fn current_dict(&self) -> Option<Arc<Dict>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Highest dictionary ID known (0 when none).
    pub fn max_dict_id(&self) -> u32 {
        let d = self.dicts.read().unwrap_or_else(|e| e.into_inner());
        d.keys().copied().max().unwrap_or(0)
    }

    /// The stored form of `attrs` into `out` (cleared first), compressed
    /// with the current dictionary when compression is on.
    pub fn encode(&self, attrs: &[Attribute], out: &mut Vec<u8>) {
        let dict = self.current_dict();
        self.encode_with(attrs, dict.as_deref(), out)
    }

    /// Like [`Codec::encode`] with an explicit dictionary (None: none).
    pub fn encode_with(&self, attrs: &[Attribute], dict: Option<&Dict>, out: &mut Vec<u8>) {
        let Some(level) = self.level() else {
            return encode_plain(attrs, out);
        };
        let split = dict.is_some_and(|d| d.split);
        let mut body = Vec::with_capacity(512);
        encode_body(attrs, split, &mut body);
        if dict.is_none() && body.len() < MIN_PLAIN_COMPRESS {
            return encode_plain(attrs, out);
        }
        out.clear();
        out.push(if split {
            ENTRY_FORMAT_ZSTD_SPLIT
        } else {
            ENTRY_FORMAT_ZSTD_BARE
        });
        out.extend_from_slice(&[0; 4]);
        put_varint(out, dict.map_or(0, |d| d.id) as u64);
        put_varint(out, body.len() as u64);
        let start = out.len();
        out.reserve(zstd_safe::compress_bound(body.len()));
        let ok = CCTX.with(|c| {
            let mut c = c.borrow_mut();
            let r = match dict {
                Some(d) => c.ref_cdict(&d.cdict),
                None => c
                    .load_dictionary(&[])
                    .and_then(|_| c.set_parameter(CParameter::CompressionLevel(level))),
            };
            // The frame goes after the header already in `out`.
            let mut at = std::io::Cursor::new(&mut *out);
            at.set_position(start as u64);
            r.is_ok() && c.compress2(&mut at, &body).is_ok()
        });
        // Compression cannot fail with a bound-sized buffer; should it, or
        // should it not pay, the entry is stored plain.
        if !ok || out.len() - start >= body.len() {
            return encode_plain(attrs, out);
        }
        let crc = crc32fast::hash(&out[HEADER..]);
        out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decode a stored entry; `dn` comes from `id2parent`.
    pub fn decode(&self, id: u64, dn: Dn, bytes: &[u8]) -> Result<Entry, StoreError> {
        self.decode_where(id, dn, bytes, None)
    }

    /// [`Codec::decode`] keeping only the attributes `keep` accepts (the
    /// others are skipped without being copied).
    pub fn decode_where(
        &self,
        id: u64,
        dn: Dn,
        bytes: &[u8],
        keep: Keep<'_>,
    ) -> Result<Entry, StoreError> {
        self.with_body(id, bytes, |body, split| {
            decode_body(id, dn, body, split, keep)
        })
    }

    /// Run `f` on a stored entry's attributes as borrowed slices, without
    /// copying them (see [`RawAttrs`]).
    pub fn with_raw<R>(
        &self,
        id: u64,
        bytes: &[u8],
        f: impl FnOnce(RawAttrs<'_>) -> R,
    ) -> Result<R, StoreError> {
        self.with_body(id, bytes, |body, split| {
            Ok(f(RawAttrs::new(id, body, split)?))
        })
    }

    /// Check a record and run `f` on its plain body (decompressed into a
    /// per-thread buffer when compressed) and whether the body is split.
    fn with_body<R>(
        &self,
        id: u64,
        bytes: &[u8],
        f: impl FnOnce(&[u8], bool) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let corrupt = |why: &str| StoreError::Corrupt(format!("id2entry record {id}: {why}"));
        if bytes.len() < HEADER {
            return Err(corrupt("shorter than its header"));
        }
        let stored_crc = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        if crc32fast::hash(&bytes[HEADER..]) != stored_crc {
            return Err(corrupt("checksum mismatch"));
        }
        let mut after = &bytes[HEADER..];
        if bytes[0] & PLACED != 0 {
            let mut r = Reader { buf: after };
            r.bytes().ok_or_else(|| corrupt("truncated placement"))?;
            after = r.buf;
        }
        match bytes[0] & !PLACED {
            ENTRY_FORMAT => f(after, false),
            format @ (ENTRY_FORMAT_ZSTD | ENTRY_FORMAT_ZSTD_BARE | ENTRY_FORMAT_ZSTD_SPLIT) => {
                let stored = after;
                let mut r = Reader { buf: after };
                let dict_id = r
                    .varint()
                    .ok_or_else(|| corrupt("truncated dictionary ID"))?;
                let len = r.varint().ok_or_else(|| corrupt("truncated body length"))?;
                if len > MAX_BODY {
                    return Err(corrupt("implausible body length"));
                }
                // The dictionaries' lock is held (shared) only while
                // decompressing, not while `f` runs: a nested decode taking
                // it again could wait behind an `add_dict` waiting for us.
                let dicts = self.dicts.read().unwrap_or_else(|e| e.into_inner());
                let dict = match dict_id {
                    0 => None,
                    n => Some(dicts.get(&(n as u32)).ok_or_else(|| {
                        corrupt(&format!(
                            "compressed with dictionary {n}, which the store does not hold"
                        ))
                    })?),
                };
                let serial = dict.map_or(0, |d| d.serial);
                // The body is taken out of its cell while `f` runs, so that
                // `f` may decode another entry on this thread (the raw
                // search path runs access checks that read groups): the
                // nested decode finds the cell empty and uses a fresh one.
                // Taking and putting back move pointers; the common case
                // reuses one buffer and allocates nothing.
                let mut body = BODY.with(RefCell::take);
                if !body.holds(format, stored, serial, len) {
                    body.fill(format, stored, r.buf, dict, len)
                        .map_err(|why| corrupt(&why))?;
                }
                drop(dicts);
                let out = f(&body.plain, format == ENTRY_FORMAT_ZSTD_SPLIT);
                // Put back unless huge (a huge entry's buffer is not kept);
                // after nested decodes, the larger of the buffers stays.
                if body.plain.capacity() <= 1 << 20 {
                    BODY.with(|cell| {
                        let mut kept = cell.borrow_mut();
                        if body.plain.capacity() >= kept.plain.capacity() {
                            *kept = body;
                        }
                    });
                }
                out
            }
            f => Err(corrupt(&format!("unknown entry format {f}"))),
        }
    }
}

/// `record` (a stored entry, placed or not) placed at `placement` (the
/// placement's bytes, as the DN layouts write them), into `out`
/// (cleared first). The record's checksum is recomputed, not checked.
pub(crate) fn place(record: &[u8], placement: &[u8], out: &mut Vec<u8>) -> Result<(), StoreError> {
    let rest = unplaced_rest(record)?;
    out.clear();
    out.reserve(HEADER + 2 + placement.len() + rest.len());
    out.push(record[0] | PLACED);
    out.extend_from_slice(&[0; 4]);
    put_varint(out, placement.len() as u64);
    out.extend_from_slice(placement);
    out.extend_from_slice(rest);
    let crc = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What follows the header (and the placement, when there is one) of a
/// stored entry.
fn unplaced_rest(record: &[u8]) -> Result<&[u8], StoreError> {
    let bad = || StoreError::Corrupt("id2entry record too short or malformed".into());
    if record.len() < HEADER
        || !matches!(
            record[0] & !PLACED,
            ENTRY_FORMAT | ENTRY_FORMAT_ZSTD | ENTRY_FORMAT_ZSTD_BARE | ENTRY_FORMAT_ZSTD_SPLIT
        )
    {
        return Err(bad());
    }
    let mut r = Reader {
        buf: &record[HEADER..],
    };
    if record[0] & PLACED != 0 {
        r.bytes().ok_or_else(bad)?;
    }
    Ok(r.buf)
}

/// The placement bytes a stored entry holds; None for a record written
/// before store format 6 (its placement is in `id2parent`). Not checked
/// against the record's checksum (reads of the entry check it).
pub(crate) fn placement_of(id: u64, record: &[u8]) -> Result<Option<&[u8]>, StoreError> {
    match record.first() {
        Some(f) if f & PLACED != 0 && record.len() > HEADER => Reader {
            buf: &record[HEADER..],
        }
        .bytes()
        .map(Some)
        .ok_or_else(|| StoreError::Corrupt(format!("id2entry record {id}: truncated placement"))),
        Some(_) => Ok(None),
        None => Err(StoreError::Corrupt(format!(
            "id2entry record {id} is empty"
        ))),
    }
}

/// Train a dictionary of at most `max_size` bytes from sample bodies
/// (the encoded, uncompressed entries). None when the samples are too few
/// or too alike for zstd to build one.
pub fn train(samples: &[Vec<u8>], max_size: usize) -> Option<Vec<u8>> {
    if samples.len() < 8 {
        return None;
    }
    zstd::dict::from_samples(samples, max_size).ok()
}

/// The plain body of `attrs` as entries compressed with a new dictionary
/// hold it, split (what a dictionary is trained on).
pub fn body_of(attrs: &[Attribute]) -> Vec<u8> {
    let mut b = Vec::with_capacity(512);
    encode_body(attrs, true, &mut b);
    b
}

/// Format 1 of `attrs` into `out` (cleared first).
pub fn encode_plain(attrs: &[Attribute], out: &mut Vec<u8>) {
    out.clear();
    out.push(ENTRY_FORMAT);
    out.extend_from_slice(&[0; 4]);
    encode_body(attrs, false, out);
    let crc = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// The body of entry formats 1 to 3 (`split` false: each description
/// and count followed by its values) or 4 (`split`: every description and
/// count, then every value).
fn encode_body(attrs: &[Attribute], split: bool, out: &mut Vec<u8>) {
    let values = |a: &Attribute, out: &mut Vec<u8>| {
        for v in &a.values {
            put_varint(out, v.len() as u64);
            out.extend_from_slice(v);
        }
    };
    put_varint(out, attrs.len() as u64);
    for a in attrs {
        put_varint(out, a.desc.len() as u64);
        out.extend_from_slice(a.desc.as_bytes());
        put_varint(out, a.values.len() as u64);
        if !split {
            values(a, out);
        }
    }
    if split {
        attrs.iter().for_each(|a| values(a, out));
    }
}

/// Which attributes a decode keeps (by description); None keeps all.
pub type Keep<'a> = Option<&'a dyn Fn(&str) -> bool>;

fn decode_body(
    id: u64,
    dn: Dn,
    body: &[u8],
    split: bool,
    keep: Keep<'_>,
) -> Result<Entry, StoreError> {
    let raw = RawAttrs::new(id, body, split)?;
    let mut attrs = Vec::with_capacity(raw.left.min(1024) as usize);
    for (desc, values) in raw {
        if keep.is_some_and(|k| !k(desc)) {
            continue;
        }
        attrs.push(Attribute {
            desc: desc.to_string(),
            values: values.map(<[u8]>::to_vec).collect(),
        });
    }
    Ok(Entry { dn, attrs })
}

/// A stored entry's attributes borrowed from its body, for callers that
/// only pass them on (a search writing them to the wire): no attribute or
/// value is copied. The body's structure is checked once, up front, so
/// iterating cannot fail.
pub struct RawAttrs<'b> {
    /// Descriptions and value counts (and, in a body that is not split,
    /// the values after each).
    names: Reader<'b>,
    /// A split body's values; unused otherwise.
    values: Reader<'b>,
    split: bool,
    left: u64,
}

/// The values of one attribute of [`RawAttrs`].
pub struct RawValues<'b> {
    r: Reader<'b>,
    left: u64,
}

impl<'b> RawAttrs<'b> {
    fn new(id: u64, body: &'b [u8], split: bool) -> Result<RawAttrs<'b>, StoreError> {
        let corrupt = |why: &str| StoreError::Corrupt(format!("id2entry record {id}: {why}"));
        let mut r = Reader { buf: body };
        let count = r
            .varint()
            .ok_or_else(|| corrupt("truncated attribute count"))?;
        let start = r;
        // Values to pass over after the descriptions (split bodies).
        let mut values = 0u64;
        for _ in 0..count {
            let desc = r.bytes().ok_or_else(|| corrupt("truncated description"))?;
            // Descriptions are ASCII (RFC 4512); the full check only otherwise.
            if !desc.is_ascii() {
                std::str::from_utf8(desc).map_err(|_| corrupt("description is not UTF-8"))?;
            }
            let n = r.varint().ok_or_else(|| corrupt("truncated value count"))?;
            if split {
                values = values.saturating_add(n);
                continue;
            }
            for _ in 0..n {
                r.bytes().ok_or_else(|| corrupt("truncated value"))?;
            }
        }
        let first_value = r;
        for _ in 0..values {
            r.bytes().ok_or_else(|| corrupt("truncated value"))?;
        }
        if !r.buf.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(RawAttrs {
            names: start,
            values: first_value,
            split,
            left: count,
        })
    }
}

impl<'b> RawAttrs<'b> {
    /// The next attribute, its description as stored.
    fn next_raw(&mut self) -> Option<(&'b [u8], RawValues<'b>)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let desc = self.names.bytes()?;
        let n = self.names.varint()?;
        let r = if self.split {
            &mut self.values
        } else {
            &mut self.names
        };
        let values = RawValues { r: *r, left: n };
        for _ in 0..n {
            r.bytes()?;
        }
        Some((desc, values))
    }

    /// Only the attributes whose stored description `keep` accepts: the
    /// others are passed over before their description is read as text.
    pub fn filter_names(
        mut self,
        keep: impl Fn(&[u8]) -> bool,
    ) -> impl Iterator<Item = (&'b str, RawValues<'b>)> {
        std::iter::from_fn(move || loop {
            let (desc, values) = self.next_raw()?;
            if keep(desc) {
                // Checked in `new`.
                return Some((std::str::from_utf8(desc).ok()?, values));
            }
        })
    }
}

impl<'b> Iterator for RawAttrs<'b> {
    type Item = (&'b str, RawValues<'b>);

    fn next(&mut self) -> Option<Self::Item> {
        let (desc, values) = self.next_raw()?;
        // Checked in `new`.
        Some((std::str::from_utf8(desc).ok()?, values))
    }
}

impl<'b> Iterator for RawValues<'b> {
    type Item = &'b [u8];

    fn next(&mut self) -> Option<&'b [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.r.bytes()
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads LEB128 lengths and length-prefixed bytes off a record (entry
/// bodies, change log records); None when the bytes end early.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }

    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(len);
        self.buf = rest;
        Some(head)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `record` without its placement, as stores before format 6 wrote it.
    pub(crate) fn unplaced(record: &[u8]) -> Result<Vec<u8>, StoreError> {
        let rest = unplaced_rest(record)?;
        let mut out = vec![record[0] & !PLACED, 0, 0, 0, 0];
        out.extend_from_slice(rest);
        let crc = crc32fast::hash(&out[HEADER..]);
        out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    fn sample(n: usize) -> Vec<Attribute> {
        vec![
            Attribute {
                desc: "objectClass".into(),
                values: vec![b"top".to_vec(), b"person".to_vec()],
            },
            Attribute {
                desc: "cn".into(),
                values: vec![format!("Person Number {n}").into_bytes(), vec![0xff; 300]],
            },
            Attribute {
                desc: "description".into(),
                values: vec![format!("This is the description for person {n}.").into_bytes()],
            },
        ]
    }

    fn none() -> Dn {
        Dn { rdns: vec![] }
    }

    /// Every way an entry can be stored: plain, zstd without a dictionary,
    /// with one trained on split bodies, and with one trained on bodies
    /// that are not (made before entry format 4).
    fn codecs() -> Vec<(Codec, &'static str)> {
        let plain = Codec::new(None);
        let nodict = Codec::new(Some(3));
        let dict = Codec::new(Some(3));
        let samples: Vec<Vec<u8>> = (0..500).map(|i| body_of(&sample(i))).collect();
        let trained = train(&samples, 4096).expect("trainable");
        dict.add_dict(1, trained, true, true).unwrap();
        let old = Codec::new(Some(3));
        let samples: Vec<Vec<u8>> = (0..500)
            .map(|i| {
                let mut b = Vec::new();
                encode_body(&sample(i), false, &mut b);
                b
            })
            .collect();
        let trained = train(&samples, 4096).expect("trainable");
        old.add_dict(1, trained, true, false).unwrap();
        vec![
            (plain, "plain"),
            (nodict, "zstd"),
            (dict, "zstd+dict"),
            (old, "zstd+old dict"),
        ]
    }

    #[test]
    fn a_dictionary_zstd_cannot_load_is_an_error_not_a_panic() {
        // zstd's dictionary magic, then entropy tables that are not.
        let mut bytes = vec![0x37, 0xA4, 0x30, 0xEC, 9, 0, 0, 0];
        bytes.extend(std::iter::repeat_n(0xFF, 600));
        let codec = Codec::new(Some(3));
        let e = codec
            .add_dict(9, bytes, true, true)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("dictionary 9 cannot be loaded")),
            "{e:?}"
        );
        assert!(codec.current_dict().is_none());
    }

    #[test]
    fn round_trip() {
        for (c, name) in codecs() {
            let mut buf = Vec::new();
            c.encode(&sample(7), &mut buf);
            let e = c.decode(7, none(), &buf).unwrap();
            assert_eq!(e.attrs, sample(7), "{name}");
            let format = match name {
                "plain" => ENTRY_FORMAT,
                "zstd+dict" => ENTRY_FORMAT_ZSTD_SPLIT,
                _ => ENTRY_FORMAT_ZSTD_BARE,
            };
            assert_eq!(buf[0], format, "{name}");
        }
    }

    /// A split body lists every description first: what the attributes
    /// hold, in order, whatever their number of values (none included).
    #[test]
    fn split_bodies_read_as_interleaved_ones() {
        let mut attrs = sample(3);
        attrs.push(Attribute {
            desc: "seeAlso".into(),
            values: Vec::new(),
        });
        attrs.push(Attribute {
            desc: "mail".into(),
            values: (0..200).map(|i| format!("m{i}@x").into_bytes()).collect(),
        });
        let (mut split, mut interleaved) = (Vec::new(), Vec::new());
        encode_body(&attrs, true, &mut split);
        encode_body(&attrs, false, &mut interleaved);
        assert_eq!(split.len(), interleaved.len());
        assert_ne!(split, interleaved);
        // Descriptions and counts first: the values come after the last one.
        let names_end = split.windows(4).position(|w| w == b"mail").unwrap() + 4;
        assert_eq!(split[names_end], 200);
        assert!(split[..names_end].windows(3).all(|w| w != b"top"));
        let a = decode_body(1, none(), &split, true, None).unwrap().attrs;
        let b = decode_body(1, none(), &interleaved, false, None)
            .unwrap()
            .attrs;
        assert_eq!((&a, &b), (&attrs, &attrs));
        let raw = RawAttrs::new(1, &split, true).unwrap();
        let names: Vec<&str> = raw.filter_names(|d| d != b"cn").map(|(d, _)| d).collect();
        assert_eq!(names, ["objectClass", "description", "seeAlso", "mail"]);
        let keep = |d: &str| d == "mail";
        let kept = decode_body(1, none(), &split, true, Some(&keep))
            .unwrap()
            .attrs;
        assert_eq!(kept, attrs[4..]);
        // Read the wrong way, or cut, the structure does not hold.
        assert!(decode_body(1, none(), &split, false, None).is_err());
        assert!(decode_body(1, none(), &split[..split.len() - 1], true, None).is_err());
        let mut longer = split.clone();
        longer.push(0);
        assert!(decode_body(1, none(), &longer, true, None).is_err());
    }

    /// A record placed, placed again elsewhere and unplaced decodes to the
    /// same entry in every form, and holds the placement it was given;
    /// damage to the placement is caught by the checksum or named.
    #[test]
    fn placed_records_hold_their_placement_and_decode_as_before() {
        for (c, name) in codecs() {
            let mut rec = Vec::new();
            c.encode(&sample(7), &mut rec);
            assert_eq!(placement_of(7, &rec).unwrap(), None, "{name}");
            let mut placed = Vec::new();
            place(&rec, b"first place", &mut placed).unwrap();
            assert_eq!(placed[0], rec[0] | PLACED, "{name}");
            assert_eq!(placement_of(7, &placed).unwrap(), Some(&b"first place"[..]));
            let mut moved = Vec::new();
            place(&placed, b"second", &mut moved).unwrap();
            assert_eq!(placement_of(7, &moved).unwrap(), Some(&b"second"[..]));
            assert_eq!(
                moved.len(),
                placed.len() - 5,
                "{name}: the old placement replaced"
            );
            for r in [&rec, &placed, &moved, &unplaced(&moved).unwrap()] {
                assert_eq!(c.decode(7, none(), r).unwrap().attrs, sample(7), "{name}");
                let raw = c.with_raw(7, r, |a| a.count()).unwrap();
                assert_eq!(raw, 3, "{name}");
            }
            assert_eq!(unplaced(&moved).unwrap(), rec, "{name}");
            let mut bad = moved.clone();
            bad[6] ^= 1;
            let e = c.decode(7, none(), &bad).unwrap_err().to_string();
            assert!(e.contains("checksum"), "{name}: {e}");
            // A placement length past the record's end.
            let cut = &moved[..8];
            assert!(placement_of(7, cut).is_err(), "{name}");
            assert!(place(cut, b"x", &mut Vec::new()).is_err(), "{name}");
        }
        assert!(place(&[9, 0, 0, 0, 0], b"x", &mut Vec::new()).is_err());
        assert!(placement_of(7, &[]).is_err());
    }

    /// A record compressed before store format 7 (format 2, the frame
    /// with its magic number) reads as it did, with or without a
    /// dictionary and placed or not.
    #[test]
    fn frames_with_their_magic_number_still_read() {
        // Format 2 bodies were never split.
        let interleaved = codecs()
            .into_iter()
            .filter(|(_, name)| !matches!(*name, "plain" | "zstd+dict"));
        for (c, name) in interleaved {
            let mut bare = Vec::new();
            c.encode(&sample(4), &mut bare);
            assert_eq!(bare[0], ENTRY_FORMAT_ZSTD_BARE, "{name}");
            // The same frame with zstd's magic number (28 B5 2F FD) put back.
            let mut r = Reader {
                buf: &bare[HEADER..],
            };
            r.varint().unwrap();
            r.varint().unwrap();
            let at = bare.len() - r.buf.len();
            let mut old = bare.clone();
            old.splice(at..at, [0x28, 0xB5, 0x2F, 0xFD]);
            old[0] = ENTRY_FORMAT_ZSTD;
            let crc = crc32fast::hash(&old[HEADER..]);
            old[1..HEADER].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(
                c.decode(4, none(), &old).unwrap().attrs,
                sample(4),
                "{name}"
            );
            let mut placed = Vec::new();
            place(&old, b"here", &mut placed).unwrap();
            assert_eq!(c.with_raw(4, &placed, |a| a.count()).unwrap(), 3, "{name}");
            // Read as the other form, each is damage, named as such.
            old[0] = ENTRY_FORMAT_ZSTD_BARE;
            let crc = crc32fast::hash(&old[HEADER..]);
            old[1..HEADER].copy_from_slice(&crc.to_le_bytes());
            let e = c.decode(4, none(), &old).unwrap_err().to_string();
            assert!(e.contains("zstd") || e.contains("length"), "{name}: {e}");
        }
    }

    #[test]
    fn the_level_changes_for_new_entries_and_old_ones_stay_readable() {
        let (dict, _) = codecs().pop().unwrap();
        let mut zstd = Vec::new();
        dict.encode(&sample(1), &mut zstd);
        dict.set_level(None);
        let mut plain = Vec::new();
        dict.encode(&sample(2), &mut plain);
        assert_eq!((zstd[0], plain[0]), (ENTRY_FORMAT_ZSTD_BARE, ENTRY_FORMAT));
        dict.set_level(Some(9));
        let mut again = Vec::new();
        dict.encode(&sample(3), &mut again);
        assert_eq!(again[0], ENTRY_FORMAT_ZSTD_BARE);
        assert_eq!(dict.current_dict().map(|d| d.id), Some(1));
        for (n, buf) in [(1, &zstd), (2, &plain), (3, &again)] {
            assert_eq!(
                dict.decode(n, none(), buf).unwrap().attrs,
                sample(n as usize)
            );
        }
    }

    #[test]
    fn raw_attributes_are_the_decoded_ones() {
        for (c, name) in codecs() {
            let mut buf = Vec::new();
            c.encode(&sample(9), &mut buf);
            let raw: Vec<Attribute> = c
                .with_raw(9, &buf, |attrs| {
                    attrs
                        .map(|(d, vs)| Attribute {
                            desc: d.to_string(),
                            values: vs.map(<[u8]>::to_vec).collect(),
                        })
                        .collect()
                })
                .unwrap();
            assert_eq!(raw, sample(9), "{name}");
            let kept: Vec<String> = c
                .with_raw(9, &buf, |attrs| {
                    attrs
                        .filter_names(|d| d != b"cn")
                        .map(|(d, vs)| format!("{d}={}", vs.count()))
                        .collect()
                })
                .unwrap();
            assert_eq!(kept, ["objectClass=2", "description=1"], "{name}");
            // Damage is reported before any attribute is handed out.
            for cut in 0..buf.len() {
                assert!(
                    c.with_raw(9, &buf[..cut], |a| a.count()).is_err(),
                    "{name} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn decode_where_keeps_only_the_chosen_attributes() {
        for (c, name) in codecs() {
            let mut buf = Vec::new();
            c.encode(&sample(9), &mut buf);
            let keep = |d: &str| d == "cn";
            let e = c.decode_where(9, none(), &buf, Some(&keep)).unwrap();
            assert_eq!(e.attrs, vec![sample(9)[1].clone()], "{name}");
        }
    }

    /// A body decompressed once is reused only for the same record bytes
    /// and the same dictionary: records decoded in turn, one inside
    /// another's decode, and one record read through two stores whose
    /// dictionaries share a number each decode as on their own.
    #[test]
    fn a_reused_body_is_the_records_own() {
        let cs = codecs();
        for (c, name) in &cs {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            c.encode(&sample(1), &mut a);
            c.encode(&sample(2), &mut b);
            for rec in [&a, &a, &b, &a, &b, &b] {
                let want = if rec == &a { sample(1) } else { sample(2) };
                assert_eq!(c.decode(1, none(), rec).unwrap().attrs, want, "{name}");
            }
            let inner = c
                .with_raw(1, &a, |_| c.decode(2, none(), &b).unwrap().attrs)
                .unwrap();
            assert_eq!(inner, sample(2), "{name}");
            assert_eq!(c.decode(1, none(), &a).unwrap().attrs, sample(1), "{name}");
            assert_eq!(c.decode(2, none(), &b).unwrap().attrs, sample(2), "{name}");
        }
        // Another dictionary under the same number: the record's bytes are
        // the same, what they decompress to is not.
        let other = Codec::new(Some(3));
        let samples: Vec<Vec<u8>> = (0..500)
            .map(|i| {
                let mut attrs = sample(i);
                attrs[2].values[0] = format!("Quite another text, number {i}").into_bytes();
                body_of(&attrs)
            })
            .collect();
        other
            .add_dict(1, train(&samples, 4096).expect("trainable"), true, true)
            .unwrap();
        let mut rec = Vec::new();
        cs[2].0.encode(&sample(3), &mut rec);
        let fresh = std::thread::scope(|s| {
            s.spawn(|| {
                other
                    .decode(3, none(), &rec)
                    .map(|e| e.attrs)
                    .map_err(|e| e.to_string())
            })
            .join()
            .unwrap()
        });
        assert_eq!(cs[2].0.decode(3, none(), &rec).unwrap().attrs, sample(3));
        let after = other
            .decode(3, none(), &rec)
            .map(|e| e.attrs)
            .map_err(|e| e.to_string());
        assert_eq!(after, fresh);
        assert_ne!(after, Ok(sample(3)));
    }

    #[test]
    fn dictionary_shrinks_entries() {
        let cs = codecs();
        let size = |c: &Codec| {
            let mut buf = Vec::new();
            c.encode(&sample(12345), &mut buf);
            buf.len()
        };
        let (plain, nodict, dict) = (size(&cs[0].0), size(&cs[1].0), size(&cs[2].0));
        assert!(dict < nodict && nodict < plain, "{plain} {nodict} {dict}");
    }

    #[test]
    fn unknown_dictionary_is_corruption_not_a_panic() {
        let cs = codecs();
        let mut buf = Vec::new();
        cs[2].0.encode(&sample(1), &mut buf);
        let err = Codec::new(Some(3)).decode(1, none(), &buf).unwrap_err();
        assert!(err.to_string().contains("dictionary 1"), "{err}");
    }

    #[test]
    fn flipped_byte_is_detected() {
        for (c, name) in codecs() {
            let mut buf = Vec::new();
            c.encode(&sample(3), &mut buf);
            for i in 0..buf.len() {
                let mut copy = buf.clone();
                copy[i] ^= 0x10;
                assert!(
                    c.decode(1, none(), &copy).is_err(),
                    "{name}: flip at {i} undetected"
                );
            }
        }
    }

    #[test]
    fn truncation_is_detected() {
        for (c, name) in codecs() {
            let mut buf = Vec::new();
            c.encode(&sample(3), &mut buf);
            for len in 0..buf.len() {
                assert!(c.decode(1, none(), &buf[..len]).is_err(), "{name} {len}");
            }
        }
    }
}
