//! Bulk loading: entries appended in ID order, index postings built by an
//! external sort.
//!
//! `pando import` hands entries over in input order. Each is written at
//! once to `id2entry` and `id2parent` with LMDB's append mode (IDs only
//! grow, so every page is filled before the next is started) and to
//! `dn2id`. Its index keys go to [`Runs`]: (index slot, key, ID) triples
//! gathered in memory up to a budget, sorted and spilled to a file as a
//! sorted run when the budget is reached (sorted in parts, one per core,
//! merged as they are written out). [`BulkLoad::finish`] merges all
//! runs once and writes each posting list exactly once, in key order
//! (append mode again when the index was empty). So the input is read once
//! whatever its size, memory stays within the budget, and no posting list
//! is rewritten per batch.
//!
//! `dn2id` is written as entries arrive, for finding parents and refusing
//! duplicates, but its keys (parent ‖ RDN) do not arrive in key order
//! (`uid=user.10` sorts before `uid=user.2`), and each page split leaves a
//! half page that never fills again. When the load starts on an empty
//! `dn2id`, its records also go to the runs (slot [`DN2ID_SLOT`]); at the
//! end `dn2id` is emptied and written again from the merge in append
//! mode, full pages, the index merge reusing the pages it left.
//!
//! Runs hold records `[klen u16][slot u16][key][id u64]` (big endian), so
//! `slot ‖ key` is one byte string whose order is the index databases'
//! key order within a slot. Records of one run are sorted by
//! (`slot ‖ key`, id); runs are filled in ID order, so merging them with
//! ties broken by ID yields each key's IDs ascending.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use heed::{PutFlags, RwTxn};
use pando_model::Attribute;
use roaring::RoaringTreemap;

use crate::entry_codec::{self, Dict};
use crate::index::{self, IndexKind};
use crate::{
    attr_keys, attr_keys_into, dn2id_id, dn2id_value, id_bytes, id_from, put_place, Db, EntryId,
    Inner, Lookup, Placement, Store, StoreError, META_NEXT_ID,
};

/// The runs' slot of dn2id records (see [`BulkLoad::finish`]): above
/// every index's, so they merge last.
const DN2ID_SLOT: u16 = u16::MAX;

/// Sort handle of one buffered record: the first 16 bytes of `slot ‖ key`
/// (zero padded) as two integers, the key length and the record's offset.
/// Most comparisons end on the integers; for keys of up to 14 bytes equal
/// integers and lengths mean equal keys, and a longer key is read from the
/// arena only when the first 14 bytes tie. Records are appended in ID
/// order, so among equal keys the offset orders the IDs.
#[derive(Clone, Copy)]
struct SortEntry {
    p1: u64,
    p2: u64,
    off: u32,
    klen: u16,
}

/// Bytes of bookkeeping per buffered triple besides the record itself.
const SORT_ENTRY: usize = std::mem::size_of::<SortEntry>();
/// Key bytes covered by `p1` and `p2` (the slot takes 2 of the 16).
const PREFIX_KEY: usize = 14;
/// Largest index key kept (longer keys are cut by the index module anyway).
const MAX_KEY: usize = u16::MAX as usize - 2;

/// Receives each distinct (slot, key) of a merge with its IDs, ascending.
pub type PostingSink<'a> = dyn FnMut(u16, &[u8], &[EntryId]) -> Result<(), StoreError> + 'a;

/// Index keys of many entries, sorted in memory and spilled to files.
pub struct Runs {
    budget: usize,
    dir: PathBuf,
    arena: Vec<u8>,
    order: Vec<SortEntry>,
    files: Vec<PathBuf>,
    /// Triples pushed in total.
    pub triples: u64,
    /// The buffers' space was asked for (at the first push).
    reserved: bool,
}

fn sort_entry(sk: &[u8], off: u32) -> SortEntry {
    let mut p = [0u8; 16];
    let n = sk.len().min(16);
    p[..n].copy_from_slice(&sk[..n]);
    SortEntry {
        p1: u64::from_be_bytes(p[..8].try_into().unwrap_or([0; 8])),
        p2: u64::from_be_bytes(p[8..].try_into().unwrap_or([0; 8])),
        off,
        klen: (sk.len() - 2) as u16,
    }
}

fn compare(arena: &[u8], a: &SortEntry, b: &SortEntry) -> Ordering {
    a.p1.cmp(&b.p1)
        .then(a.p2.cmp(&b.p2))
        .then_with(|| {
            if (a.klen as usize) <= PREFIX_KEY || (b.klen as usize) <= PREFIX_KEY {
                // Equal padded prefixes: the shorter key is a prefix of the
                // longer one (which continues with zero bytes).
                a.klen.cmp(&b.klen)
            } else {
                record_at(arena, a.off as usize)
                    .0
                    .cmp(record_at(arena, b.off as usize).0)
            }
        })
        .then(a.off.cmp(&b.off))
}

/// `slot ‖ key` and ID of the record at `off`.
fn record_at(arena: &[u8], off: usize) -> (&[u8], u64) {
    let klen = u16::from_be_bytes([arena[off], arena[off + 1]]) as usize;
    let sk = &arena[off + 2..off + 4 + klen];
    let id_at = off + 4 + klen;
    let id = u64::from_be_bytes(arena[id_at..id_at + 8].try_into().unwrap_or([0; 8]));
    (sk, id)
}

impl Runs {
    /// `budget`: bytes of memory for buffered triples; spill files go to `dir`.
    pub fn new(budget: usize, dir: &Path) -> Runs {
        Runs {
            budget: budget.max(1 << 20),
            dir: dir.to_path_buf(),
            arena: Vec::new(),
            order: Vec::new(),
            files: Vec::new(),
            triples: 0,
            reserved: false,
        }
    }

    pub fn spilled_runs(&self) -> usize {
        self.files.len()
    }

    fn used(&self) -> usize {
        self.arena.len() + self.order.len() * SORT_ENTRY
    }

    /// Add one triple. IDs must not decrease from one call to the next.
    pub fn push(&mut self, slot: u16, key: &[u8], id: EntryId) -> Result<(), StoreError> {
        let key = &key[..key.len().min(MAX_KEY)];
        if self.used() + key.len() + 12 + SORT_ENTRY > self.budget && !self.order.is_empty() {
            self.spill()?;
        }
        if !self.reserved {
            self.reserved = true;
            // Each buffer's largest possible share of the budget, up front
            // (address space only until used): growing them by doubling
            // copied and zeroed hundreds of MiB in a large import. A
            // triple takes at least 13 arena bytes beside its sort entry,
            // so the sort entries never pass 24/37 of the budget. Where the
            // system refuses that much address space (a budget above the
            // memory there is), the buffers grow as they fill instead.
            let _ = self.arena.try_reserve_exact(self.budget);
            let _ = self
                .order
                .try_reserve_exact(self.budget / (SORT_ENTRY + 13));
        }
        let off = self.arena.len();
        let off32 = u32::try_from(off).map_err(|_| {
            StoreError::Lmdb("import memory budget above 4 GiB per run is not supported".into())
        })?;
        self.arena
            .extend_from_slice(&(key.len() as u16).to_be_bytes());
        self.arena.extend_from_slice(&slot.to_be_bytes());
        self.arena.extend_from_slice(key);
        self.arena.extend_from_slice(&id.to_be_bytes());
        let (sk, _) = record_at(&self.arena, off);
        self.order.push(sort_entry(sk, off32));
        self.triples += 1;
        Ok(())
    }

    /// Add the packed keys of one entry (see [`Store::index_keys_packed`]).
    pub fn push_packed(&mut self, packed: &[u8], id: EntryId) -> Result<(), StoreError> {
        for (slot, key) in PackedKeys(packed) {
            self.push(slot, key, id)?;
        }
        Ok(())
    }

    /// Sort what is buffered and write it to a new run file.
    fn spill(&mut self) -> Result<(), StoreError> {
        let parts = sort_parts(&self.arena, &mut self.order);
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("run-{:04}", self.files.len()));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        let mut sorted = Sorted::new(&self.arena, &self.order, &parts);
        while let Some(off) = sorted.next_offset() {
            let klen = u16::from_be_bytes([self.arena[off], self.arena[off + 1]]) as usize;
            out.write_all(&self.arena[off..off + 12 + klen])?;
        }
        out.into_inner()
            .map_err(|e| StoreError::from(e.into_error()))?
            .sync_data()
            .or_else(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        self.files.push(path);
        self.arena.clear();
        self.order.clear();
        Ok(())
    }

    /// Merge everything pushed, calling `each(slot, key, ids)` once per
    /// distinct (slot, key), in `slot ‖ key` order, IDs ascending. Spill
    /// files are removed afterwards.
    pub fn merge(mut self, each: &mut PostingSink<'_>) -> Result<(), StoreError> {
        let arena = std::mem::take(&mut self.arena);
        let mut order = std::mem::take(&mut self.order);
        let parts = sort_parts(&arena, &mut order);
        let mut sources: Vec<Source> = Vec::with_capacity(self.files.len() + 1);
        for f in &self.files {
            sources.push(Source::File {
                reader: BufReader::with_capacity(1 << 20, File::open(f)?),
                key: Vec::new(),
                id: 0,
            });
        }
        sources.push(Source::Memory {
            sorted: Sorted::new(&arena, &order, &parts),
            key: &[],
            id: 0,
        });
        // A min-heap of the sources with a record left, by (key, ID,
        // source): a sorted list is one.
        let mut heap = Vec::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            if s.advance()? {
                heap.push(i);
            }
        }
        heap.sort_by(|&a, &b| head_order(&sources, a, b));
        let mut group_key: Vec<u8> = Vec::new();
        let mut ids: Vec<EntryId> = Vec::new();
        while let Some(&top) = heap.first() {
            let s = &sources[top];
            if s.key() != group_key.as_slice() {
                if !ids.is_empty() {
                    emit(&group_key, &ids, each)?;
                }
                ids.clear();
                group_key.clear();
                group_key.extend_from_slice(s.key());
            }
            let id = s.id();
            if ids.last() != Some(&id) {
                ids.push(id);
            }
            if !sources[top].advance()? {
                heap.swap_remove(0);
            }
            sift_down(&mut heap, &sources);
        }
        if !ids.is_empty() {
            emit(&group_key, &ids, each)?;
        }
        drop(sources);
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        self.files.clear();
        Ok(())
    }
}

/// Sorts `order` in parts, one per thread the machine runs at once (up to
/// four), in parallel; returns each part's end. The parts hold records
/// pushed one after another, so merging them with ties broken by offset
/// ([`Sorted`]) gives the order of one sort.
fn sort_parts(arena: &[u8], order: &mut [SortEntry]) -> Vec<usize> {
    /// Below this many records one thread sorts them all.
    const MIN_PART: usize = 1 << 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    sort_in(arena, order, threads.min(4).min(order.len() / MIN_PART))
}

/// [`sort_parts`] in `parts` parts (at least one).
fn sort_in(arena: &[u8], order: &mut [SortEntry], parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    let size = order.len().div_ceil(parts).max(1);
    let sort = |part: &mut [SortEntry]| part.sort_unstable_by(|a, b| compare(arena, a, b));
    std::thread::scope(|scope| {
        let mut chunks = order.chunks_mut(size);
        let first = chunks.next();
        for part in chunks {
            scope.spawn(move || sort(part));
        }
        if let Some(part) = first {
            sort(part);
        }
    });
    (1..=parts).map(|i| (i * size).min(order.len())).collect()
}

/// The records of sorted parts of one buffer, merged.
struct Sorted<'a> {
    arena: &'a [u8],
    /// What is left of each part.
    parts: Vec<&'a [SortEntry]>,
}

impl<'a> Sorted<'a> {
    fn new(arena: &'a [u8], order: &'a [SortEntry], ends: &[usize]) -> Sorted<'a> {
        let mut start = 0;
        let mut parts = Vec::with_capacity(ends.len());
        for &end in ends {
            parts.push(&order[start..end]);
            start = end;
        }
        Sorted { arena, parts }
    }

    /// The arena offset of the next record in order; None at the end.
    fn next_offset(&mut self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, part) in self.parts.iter().enumerate() {
            let Some(head) = part.first() else { continue };
            let better = match best {
                Some(b) => compare(self.arena, head, &self.parts[b][0]) == Ordering::Less,
                None => true,
            };
            if better {
                best = Some(i);
            }
        }
        let b = best?;
        let head = self.parts[b][0];
        self.parts[b] = &self.parts[b][1..];
        Some(head.off as usize)
    }
}

/// Orders two sources of a merge by their current records: key, ID, then
/// the source's place (earlier runs hold earlier IDs).
fn head_order(sources: &[Source], a: usize, b: usize) -> Ordering {
    let (x, y) = (&sources[a], &sources[b]);
    x.key()
        .cmp(y.key())
        .then(x.id().cmp(&y.id()))
        .then(a.cmp(&b))
}

/// Restores the min-heap `heap` of sources after its first one moved on.
fn sift_down(heap: &mut [usize], sources: &[Source]) {
    let mut i = 0;
    loop {
        let left = 2 * i + 1;
        if left >= heap.len() {
            return;
        }
        let right = left + 1;
        let child = if right < heap.len()
            && head_order(sources, heap[right], heap[left]) == Ordering::Less
        {
            right
        } else {
            left
        };
        if head_order(sources, heap[child], heap[i]) != Ordering::Less {
            return;
        }
        heap.swap(i, child);
        i = child;
    }
}

impl Drop for Runs {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn emit(sk: &[u8], ids: &[EntryId], each: &mut PostingSink<'_>) -> Result<(), StoreError> {
    let slot = u16::from_be_bytes([sk[0], sk[1]]);
    each(slot, &sk[2..], ids)
}

enum Source<'a> {
    File {
        reader: BufReader<File>,
        key: Vec<u8>,
        id: EntryId,
    },
    Memory {
        sorted: Sorted<'a>,
        /// The current record's `slot ‖ key` and ID.
        key: &'a [u8],
        id: EntryId,
    },
}

impl Source<'_> {
    /// Move to the next record; false at the end.
    fn advance(&mut self) -> Result<bool, StoreError> {
        match self {
            Source::File { reader, key, id } => {
                let mut len = [0u8; 2];
                match reader.read_exact(&mut len) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
                let klen = u16::from_be_bytes(len) as usize;
                key.resize(klen + 2, 0);
                reader.read_exact(key)?;
                let mut b = [0u8; 8];
                reader.read_exact(&mut b)?;
                *id = u64::from_be_bytes(b);
                Ok(true)
            }
            Source::Memory { sorted, key, id } => match sorted.next_offset() {
                Some(off) => {
                    (*key, *id) = record_at(sorted.arena, off);
                    Ok(true)
                }
                None => Ok(false),
            },
        }
    }

    fn key(&self) -> &[u8] {
        match self {
            Source::File { key, .. } => key,
            Source::Memory { key, .. } => key,
        }
    }

    fn id(&self) -> EntryId {
        match self {
            Source::File { id, .. } => *id,
            Source::Memory { id, .. } => *id,
        }
    }
}

/// Iterator over packed keys `[slot u16][len u16][key]…`.
pub struct PackedKeys<'a>(pub &'a [u8]);

impl<'a> Iterator for PackedKeys<'a> {
    type Item = (u16, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.0.len() < 4 {
            return None;
        }
        let slot = u16::from_be_bytes([self.0[0], self.0[1]]);
        let len = u16::from_be_bytes([self.0[2], self.0[3]]) as usize;
        let key = self.0.get(4..4 + len)?;
        self.0 = &self.0[4 + len..];
        Some((slot, key))
    }
}

/// One index database taking part in a bulk build.
struct Target {
    db: Db,
    /// Empty when the build started: postings are appended, not merged.
    was_empty: bool,
}

/// Settings of a bulk load.
#[derive(Clone, Debug)]
pub struct BulkOptions {
    /// Memory for buffered index keys, in bytes.
    pub memory: usize,
    /// Where sorted runs are spilled (created and removed by the load).
    pub spill_dir: PathBuf,
    /// Entries per write transaction.
    pub commit_every: usize,
}

/// Figures of a finished bulk load.
#[derive(Clone, Debug, Default)]
pub struct BulkFigures {
    pub entries: u64,
    pub index_triples: u64,
    pub spilled_runs: usize,
    pub posting_lists: u64,
}

/// An import in progress: owns the store's write transaction until
/// [`BulkLoad::finish`]. Nothing else may write the store meanwhile.
pub struct BulkLoad<'s> {
    inner: &'s Inner,
    txn: Option<RwTxn<'s>>,
    next_id: EntryId,
    runs: Runs,
    targets: Vec<Target>,
    uncommitted: usize,
    commit_every: usize,
    entries: u64,
    /// Reused buffer for placements.
    buf: Vec<u8>,
    /// The record being written, placed (see `entry_codec::place`).
    placed: Vec<u8>,
    /// dn2id was empty at the start: its records also go to the runs, and
    /// it is written again from them in key order at the end.
    repack_dn2id: bool,
}

impl Store {
    /// Every index key of `attrs`, packed as `[slot u16][len u16][key]…`
    /// into `out` (cleared first).
    pub fn index_keys_packed(&self, attrs: &[Attribute], out: &mut Vec<u8>) {
        out.clear();
        let catalog = self.inner.catalog.load();
        let bases: Vec<&str> = attrs
            .iter()
            .map(|a| pando_model::desc::base(&a.desc))
            .collect();
        let schema = &catalog.schema;
        let mut keys = BTreeSet::new();
        for (slot, (attr, kind)) in catalog.slots.iter().enumerate() {
            keys.clear();
            attr_keys_into(schema, attrs, bases.iter().copied(), attr, *kind, &mut keys);
            for key in &keys {
                let key = &key[..key.len().min(MAX_KEY)];
                out.extend_from_slice(&(slot as u16).to_be_bytes());
                out.extend_from_slice(&(key.len() as u16).to_be_bytes());
                out.extend_from_slice(key);
            }
        }
    }

    /// Start a bulk load. The store's own writer must stay idle until it
    /// finishes (offline import).
    pub fn bulk_load(&self, opts: &BulkOptions) -> Result<BulkLoad<'_>, StoreError> {
        let inner: &Inner = &self.inner;
        let txn = inner.env.write_txn()?;
        let next_id = match inner.meta.get(&txn, META_NEXT_ID)? {
            Some(v) => id_from(v)?,
            None => return Err(StoreError::Corrupt("meta has no next_id".into())),
        };
        let repack_dn2id = inner.dn2id.is_empty(&txn)?;
        let mut targets = Vec::new();
        let catalog = inner.catalog.load_full();
        for (attr, kind) in &catalog.slots {
            let db = catalog.index(attr, *kind).map(|i| i.db).ok_or_else(|| {
                StoreError::Corrupt(format!("index {} vanished", index::db_name(attr, *kind)))
            })?;
            targets.push(Target {
                db,
                was_empty: db.is_empty(&txn)?,
            });
        }
        Ok(BulkLoad {
            inner,
            txn: Some(txn),
            next_id,
            runs: Runs::new(opts.memory, &opts.spill_dir),
            targets,
            uncommitted: 0,
            commit_every: opts.commit_every.max(1),
            entries: 0,
            buf: Vec::new(),
            placed: Vec::new(),
            repack_dn2id,
        })
    }
}

impl<'s> BulkLoad<'s> {
    /// The open transaction; gone only after a failed commit, after which
    /// the load is over (every later call fails rather than panics).
    fn txn(&mut self) -> Result<&mut RwTxn<'s>, StoreError> {
        self.txn.as_mut().ok_or(StoreError::Closed)
    }

    /// The entry at `norm_rdns` (most specific first), read through
    /// what this load has written so far.
    pub fn lookup_norm(&mut self, norm_rdns: &[String]) -> Result<Lookup, StoreError> {
        let inner = self.inner;
        let txn = self.txn()?;
        crate::lookup_in(inner, txn, norm_rdns)
    }

    /// Keep a dictionary trained on split bodies ([`entry_codec::body_of`])
    /// in meta (next free ID) and make it the one new entries use; returns
    /// it for the encoders.
    pub fn install_dict(&mut self, bytes: Vec<u8>) -> Result<Arc<Dict>, StoreError> {
        let inner = self.inner;
        let id = inner.codec.max_dict_id() + 1;
        crate::dictionary::put_new_dict(inner.meta, self.txn()?, id, &bytes)?;
        inner.codec.add_dict(id, bytes, true, true)
    }

    /// Store one entry: `record` is its encoded form (see
    /// [`entry_codec::Codec::encode_with`]), `keys` its packed index keys.
    /// Err(None) when `place` is already taken (a duplicate DN).
    pub fn add(
        &mut self,
        place: &Placement,
        record: &[u8],
        keys: &[u8],
    ) -> Result<Result<EntryId, EntryId>, StoreError> {
        self.add_inner(place, record, keys)
            .map_err(|e| crate::writer::disk_full_or(self.inner, e))
    }

    fn add_inner(
        &mut self,
        place: &Placement,
        record: &[u8],
        keys: &[u8],
    ) -> Result<Result<EntryId, EntryId>, StoreError> {
        let inner = self.inner;
        let id = self.next_id;
        let key = inner.dn2id_layout.key(place.parent, &place.norm_rdn);
        let txn = self.txn.as_mut().ok_or(StoreError::Closed)?;
        match inner
            .dn2id
            .put_with_flags(txn, PutFlags::NO_OVERWRITE, &key, &dn2id_value(id))
        {
            Ok(()) => {}
            Err(heed::Error::Mdb(heed::MdbError::KeyExist)) => {
                let existing = inner.dn2id.get(txn, &key)?.map(dn2id_id).transpose()?;
                return Ok(Err(existing.unwrap_or(0)));
            }
            Err(e) => return Err(e.into()),
        }
        // IDs only grow: the record goes at the end of id2entry.
        put_place(place, &mut self.buf);
        entry_codec::place(record, &self.buf, &mut self.placed)?;
        inner
            .id2entry
            .put_with_flags(txn, PutFlags::APPEND, &id_bytes(id), &self.placed)?;
        self.runs.push_packed(keys, id)?;
        if self.repack_dn2id {
            self.runs.push(DN2ID_SLOT, &key, id)?;
        }
        self.next_id += 1;
        self.entries += 1;
        self.uncommitted += 1;
        if self.uncommitted >= self.commit_every {
            self.commit()?;
        }
        Ok(Ok(id))
    }

    /// Commit what is written so far and continue in a new transaction.
    fn commit(&mut self) -> Result<(), StoreError> {
        self.commit_inner()
            .map_err(|e| crate::writer::disk_full_or(self.inner, e))
    }

    fn commit_inner(&mut self) -> Result<(), StoreError> {
        let inner = self.inner;
        let next = self.next_id;
        let mut txn = self.txn.take().ok_or(StoreError::Closed)?;
        inner.meta.put(&mut txn, META_NEXT_ID, &id_bytes(next))?;
        inner.commit(txn)?;
        self.txn = Some(inner.env.write_txn()?);
        self.uncommitted = 0;
        Ok(())
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Merge the index runs into the index databases and commit.
    /// `progress(done, total)` is called now and then with triples merged.
    pub fn finish(self, progress: &mut dyn FnMut(u64, u64)) -> Result<BulkFigures, StoreError> {
        let inner = self.inner;
        self.finish_inner(progress)
            .map_err(|e| crate::writer::disk_full_or(inner, e))
    }

    fn finish_inner(
        mut self,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<BulkFigures, StoreError> {
        self.commit()?;
        if self.repack_dn2id {
            // Rewritten from the runs below; its pages are reused.
            self.inner.dn2id.clear(self.txn()?)?;
            self.commit()?;
        }
        let BulkLoad {
            inner,
            txn: mut txn_slot,
            runs,
            targets,
            entries,
            repack_dn2id,
            ..
        } = self;
        let dn2id_records = if repack_dn2id { entries } else { 0 };
        let mut fig = BulkFigures {
            entries,
            index_triples: runs.triples - dn2id_records,
            spilled_runs: runs.spilled_runs(),
            posting_lists: 0,
        };
        let total = runs.triples;
        let mut done = 0u64;
        let mut written = 0u64;
        let mut buf = Vec::new();
        let mut each = |slot: u16, key: &[u8], ids: &[EntryId]| -> Result<(), StoreError> {
            let txn = txn_slot.as_mut().ok_or(StoreError::Closed)?;
            if slot == DN2ID_SLOT {
                // Keys are unique (taken with NO_OVERWRITE) and come in
                // key order, after every index's.
                for &id in ids {
                    inner
                        .dn2id
                        .put_with_flags(txn, PutFlags::APPEND, key, &dn2id_value(id))?;
                }
            } else {
                let t = targets.get(slot as usize).ok_or_else(|| {
                    StoreError::Corrupt(format!("index slot {slot} out of range"))
                })?;
                write_posting(txn, t, key, ids, &mut buf)?;
                fig.posting_lists += 1;
            }
            done += ids.len() as u64;
            written += 1;
            if written.is_multiple_of(200_000) {
                // Bound the dirty pages of one transaction on huge imports.
                inner.commit(txn_slot.take().ok_or(StoreError::Closed)?)?;
                txn_slot = Some(inner.env.write_txn()?);
                progress(done, total);
            }
            Ok(())
        };
        runs.merge(&mut each)?;
        inner.commit(txn_slot.take().ok_or(StoreError::Closed)?)?;
        progress(total, total);
        Ok(fig)
    }
}

/// Write the posting list of `key` in target `t` (merged with what is
/// stored when the index was not empty at the start).
fn write_posting(
    txn: &mut RwTxn<'_>,
    t: &Target,
    key: &[u8],
    ids: &[EntryId],
    buf: &mut Vec<u8>,
) -> Result<(), StoreError> {
    if t.was_empty {
        return crate::postings::append_sorted(txn, &t.db, key, ids, buf);
    }
    let set = RoaringTreemap::from_sorted_iter(ids.iter().copied())
        .map_err(|_| StoreError::Corrupt("index IDs out of order in the merge".into()))?;
    crate::postings::merge(txn, &t.db, key, &set, buf)
}

/// Build the postings of every entry into the (emptied) index databases
/// `targets` with an external sort. Returns the number of entries read.
pub(crate) fn fill_indexes(
    inner_schema: &pando_model::Schema,
    codec: &entry_codec::Codec,
    id2entry: Db,
    txn: &mut RwTxn<'_>,
    targets: &[(String, IndexKind, Db)],
    mut runs: Runs,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, StoreError> {
    let mut entries = 0u64;
    for item in id2entry.iter(txn)? {
        let (k, v) = item?;
        let id = id_from(k)?;
        let attrs = codec.decode(id, pando_model::Dn { rdns: vec![] }, v)?.attrs;
        for (slot, (attr, kind, _)) in targets.iter().enumerate() {
            for key in attr_keys(inner_schema, &attrs, attr, *kind) {
                runs.push(slot as u16, &key, id)?;
            }
        }
        entries += 1;
        if entries.is_multiple_of(50_000) {
            progress(entries);
        }
    }
    let mut buf = Vec::new();
    let mut each = |slot: u16, key: &[u8], ids: &[EntryId]| -> Result<(), StoreError> {
        let t = Target {
            db: targets[slot as usize].2,
            was_empty: true,
        };
        write_posting(txn, &t, key, ids, &mut buf)
    };
    runs.merge(&mut each)?;
    progress(entries);
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(runs: Runs) -> Vec<(u16, Vec<u8>, Vec<u64>)> {
        let mut out = Vec::new();
        runs.merge(&mut |s, k, ids| {
            out.push((s, k.to_vec(), ids.to_vec()));
            Ok(())
        })
        .unwrap();
        out
    }

    fn sample(budget: usize, dir: &Path) -> Runs {
        let mut r = Runs::new(budget, dir);
        for id in 1..=20_000u64 {
            r.push(1, format!("user.{id}").as_bytes(), id).unwrap();
            r.push(0, b"person", id).unwrap();
            r.push(1, format!("group{}", id % 7).as_bytes(), id)
                .unwrap();
            // Keys that tie on the padded prefix: zero bytes, long shared starts.
            r.push(2, &b"ab\0\0"[..2 + (id % 3) as usize], id).unwrap();
            r.push(2, format!("a-long-shared-prefix-{}", id % 5).as_bytes(), id)
                .unwrap();
        }
        r
    }

    #[test]
    fn spilled_and_in_memory_merges_agree() {
        let dir = tempfile::tempdir().unwrap();
        let big = sample(1 << 30, &dir.path().join("a"));
        assert_eq!(big.spilled_runs(), 0);
        let small = sample(1 << 20, &dir.path().join("b"));
        assert!(small.spilled_runs() >= 2, "{}", small.spilled_runs());
        let (a, b) = (collect(big), collect(small));
        assert_eq!(a, b);
        // Slot 0 first, keys in byte order, IDs ascending.
        assert_eq!(a[0].0, 0);
        assert_eq!(a[0].2.len(), 20_000);
        assert!(a.windows(2).all(|w| (w[0].0, &w[0].1) < (w[1].0, &w[1].1)));
        assert!(a
            .iter()
            .all(|(_, _, ids)| ids.windows(2).all(|w| w[0] < w[1])));
        assert_eq!(a.len(), 1 + 20_000 + 7 + 3 + 5);
        let slot2: Vec<&[u8]> = a.iter().filter(|t| t.0 == 2).map(|t| &t.1[..]).collect();
        assert_eq!(
            &slot2[..3],
            &[
                &b"a-long-shared-prefix-0"[..],
                b"a-long-shared-prefix-1",
                b"a-long-shared-prefix-2"
            ]
        );
        assert_eq!(&slot2[5..], &[&b"ab"[..], b"ab\0", b"ab\0\0"]);
        // Spill files are gone.
        assert!(!dir.path().join("b").exists());
    }

    /// Parts sorted apart and merged give the order of one sort, ties
    /// (equal keys) by push order.
    #[test]
    fn parts_sorted_apart_merge_as_one_sort() {
        let dir = tempfile::tempdir().unwrap();
        let r = sample(1 << 30, dir.path());
        let mut whole = r.order.clone();
        whole.sort_unstable_by(|a, b| compare(&r.arena, a, b));
        let want: Vec<u32> = whole.iter().map(|e| e.off).collect();
        for parts in [1, 2, 3, 4, 7] {
            let mut order = r.order.clone();
            let ends = sort_in(&r.arena, &mut order, parts);
            assert_eq!((ends.len(), ends.last()), (parts, Some(&order.len())));
            let mut sorted = Sorted::new(&r.arena, &order, &ends);
            let got: Vec<u32> = std::iter::from_fn(|| sorted.next_offset())
                .map(|o| o as u32)
                .collect();
            assert_eq!(got, want, "{parts} parts");
        }
    }

    #[test]
    fn packed_keys_round_trip() {
        let mut buf = Vec::new();
        for (s, k) in [(0u16, &b"a"[..]), (3, b""), (1, b"xyz")] {
            buf.extend_from_slice(&s.to_be_bytes());
            buf.extend_from_slice(&(k.len() as u16).to_be_bytes());
            buf.extend_from_slice(k);
        }
        let got: Vec<_> = PackedKeys(&buf).collect();
        assert_eq!(got, vec![(0, &b"a"[..]), (3, &b""[..]), (1, &b"xyz"[..])]);
    }
}
