//! Pando's LMDB store.
//!
//! One LMDB environment holds every suffix. Sub-databases (byte layouts in
//! `docs/design.md`):
//!
//! * `meta`      — format version, next entry ID, server secrets (hashes only)
//! * `id2entry`  — entry ID (u64 BE) → the entry's placement (parent ID,
//!   RDN) and its attributes (see [`entry_codec`])
//! * `dn2id`     — parent ID (u64 BE) ‖ normalised RDN → entry ID (BE, without
//!   leading zero bytes; 8 bytes in records written before format 7);
//!   a suffix entry has parent 0 and its whole normalised DN as "RDN"
//! * `id2parent` — entry ID → parent ID ‖ u16 len ‖ RDN as given ‖ normalised
//!   RDN, for records written before format 6 only (empty in newer stores)
//! * `ix:<attr>:<kind>` — index key → its entry IDs, one record per 65,536
//!   IDs (see [`index`] and [`postings`])
//!
//! Invariants (checked by `verify`): every id2entry record has exactly one
//! placement (in the record, or in id2parent for an older record, never
//! both) and one dn2id key pointing back at it; every parent ID
//! other than 0 exists; every index posting names an existing entry whose
//! values produce that key, and every such key lists the entry.
//!
//! Reads use LMDB read transactions concurrently from any thread. All writes
//! go through one writer thread ([`writer`]) that applies queued operations
//! in a batch, each in its own nested transaction, and commits the batch with
//! one fsync before answering any of them (group commit).
//!
//! This file is the facade: the handles (`Store`, `ReadTxn`, `WriteTxn`,
//! `View`) and the format constants. Their work is one file per layer:
//! `store.rs` (opening, transactions, statistics), `view.rs` (reading),
//! `write_txn.rs` (changing entries with their DN records and postings),
//! `keys.rs` (DN database layouts), `options.rs`, `error.rs`; the indexes,
//! the planner, the change log and the writer have their own files; so do
//! the data directory's layout and lock (`datadir`) and hot backups of the
//! store with their manifest (`backup`). The store knows nothing above the
//! data model: not sessions, access rules,
//! operations or the network.

mod accesslog;
pub mod backup;
pub mod bulk;
mod catalog;
mod change_numbers;
mod changelog;
pub mod clock;
mod context_csn;
pub mod datadir;
mod dictionary;
mod dn_cache;
pub mod entry_codec;
mod error;
pub mod file_check;
pub mod index;
mod index_build;
mod keys;
#[cfg(any(test, feature = "fuzzing"))]
pub mod model_check;
mod options;
mod plan;
pub mod postings;
mod readers;
pub mod salvage;
mod store;
mod txn_pool;
pub mod unsynced_marker;
mod view;
mod write_txn;
mod writer;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, RoTxn, RwTxn};
use pando_model::{Attribute, Dn, Entry, Schema};
use roaring::RoaringTreemap;

pub use accesslog::AccessLogSize;
pub use catalog::Catalog;
use catalog::IndexDb;
pub use changelog::{
    ChangeToLog, ChangelogSummary, LogValues, LoggedChange, LoggedKind, LoggedMod, ModOp, ModToLog,
};
pub use context_csn::csn_sid;
pub use error::StoreError;
pub use index::IndexKind;
pub use index_build::{BuildProgress, CatalogChange, IndexState};
use keys::*;
pub use options::*;
pub use plan::{Candidates, Exactness};
pub use store::{preflight, DbFigures, StoreStats};
pub use unsynced_marker::{sync_dir, write_private};
use view::*;
pub use writer::{Durability, WriteJobError, WriterFigures};

pub type EntryId = u64;
type Db = Database<Bytes, Bytes>;

/// Default memory map: 1 TiB of address space. The file only grows as data
/// is written, so a large map costs nothing and removes the "maxsize"
/// cliff; `map_size` is a cap an operator may set on purpose.
pub const DEFAULT_MAP_SIZE: usize = 1 << 40;

/// LMDB's data file inside the store directory.
pub const DATA_FILE: &str = "data.mdb";

/// On-disk format of the whole store; bumped on any incompatible change.
/// 2: entries may be zstd-compressed (entry format 2) and single-ID
/// postings are 8 bytes. 3: postings are kept in chunks of 65,536 IDs in
/// `ix:` databases ([`postings`]). Older stores are upgraded when opened:
/// their records are valid as they are, except the `idx:` index databases,
/// which are emptied while the `ix:` ones are built from the entries (the
/// same rebuild as for an index added to the configuration). 4: an
/// `id2parent` record leaves out the normalised RDN when it is the RDN as
/// given or its ASCII lowercase ([`keys`]); format 3 records read as they
/// are, nothing is rebuilt. 5: index records end with the chunk number in
/// one byte where it fits ([`postings`]), and a UUID's equality key is its
/// 16 bytes ([`index`]); older stores' indexes are rebuilt once, in place.
/// 6: an entry's `id2entry` record holds its placement (parent and RDN,
/// [`entry_codec`]), so reading an entry and its place is one lookup and
/// `id2parent` stays empty; records of older stores read as they are, with
/// their placement from `id2parent`, and move it into the record when next
/// written. 7: equality keys of values longer than 3 bytes are 4 bytes,
/// a hash of the value or a UUID's first bytes ([`index::eq_key`]); older
/// stores' indexes are rebuilt once, in place. Also new in 7, read
/// alongside the older forms: sparse posting chunks as gaps
/// ([`postings`]), compressed entries without zstd's frame magic (entry
/// format 3, [`entry_codec`]), short `dn2id` values ([`keys`]). 8: `dn2id`
/// keys begin with the parent's ID in its shortest form ([`keys`]); older
/// stores' keys are rewritten once, in place, when opened for writing,
/// and read as they are when opened read-only.
pub const FORMAT_VERSION: u32 = 8;
/// The first format whose index databases are in this version's layout:
/// an older store's indexes are rebuilt when it is opened for writing, and
/// not used (searches scan) when it is opened read-only.
pub const INDEX_FORMAT: u32 = 7;
/// Oldest store format this version reads.
pub const OLDEST_FORMAT: u32 = 1;
const META_FORMAT: &[u8] = b"format";

/// The format number in a `meta:format` record; None when the record is
/// not one (not 4 bytes).
fn format_of(v: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(v).ok().map(u32::from_be_bytes)
}
const META_NEXT_ID: &[u8] = b"next_id";
/// Newline-separated names of the index databases kept complete.
const META_INDEXES: &[u8] = b"indexes";
/// Newline-separated names of index databases dropped while serving and
/// not emptied yet (see [`index_build`]).
const META_INDEXES_DROPPED: &[u8] = b"indexes.dropped";
/// Index databases that may be added while serving, beyond those open at
/// start. Each costs LMDB a few bytes in every transaction, so the room
/// is kept small; a restart makes more.
pub const RUNTIME_INDEX_ROOM: u32 = 32;

/// The names in a `meta:indexes` record.
fn parse_listed(v: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(v)
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

pub(crate) struct Inner {
    env: Env,
    meta: Db,
    id2entry: Db,
    dn2id: Db,
    /// How `dn2id` keys begin (from the store's format).
    dn2id_layout: Dn2idLayout,
    id2parent: Db,
    /// The change log ([`changelog`]); None only in a read-only view of
    /// a store written before the log existed.
    changelog: Option<Db>,
    /// Change numbers ([`change_numbers`]); None where the change log is.
    changenumbers: Option<Db>,
    /// Records of reads, binds and failed writes ([`accesslog`]); None
    /// only in a read-only view of a store written before it existed.
    accesslog: Option<Db>,
    /// The schema and the indexes ([`catalog`]), replaced whole when they
    /// change while serving; each transaction keeps the one current when
    /// it began.
    catalog: arc_swap::ArcSwap<Catalog>,
    /// Indexes being built while serving ([`index_build`]).
    builds: index_build::Builds,
    /// Most operations in one write transaction (changes while serving).
    max_batch: std::sync::atomic::AtomicUsize,
    /// Entry compression and the dictionaries from meta.
    codec: entry_codec::Codec,
    path: PathBuf,
    durability: writer::DurabilityCell,
    stats: writer::WriterStats,
    readers: readers::Readers,
    /// When DNs last changed (renames, deletes): see [`dn_cache`].
    dn_generation: dn_cache::Generation,
    /// Moved around every commit, whatever it changes: a snapshot taken at
    /// an even value holds exactly the data of that value, so results
    /// computed from it may be reused while the value stays
    /// ([`ReadTxn::generation`]).
    content_generation: dn_cache::Generation,
    /// Read transactions between readers ([`txn_pool`]).
    txns: txn_pool::TxnPool,
}

/// The fixed databases.
struct Dbs {
    meta: Db,
    id2entry: Db,
    dn2id: Db,
    dn2id_layout: Dn2idLayout,
    id2parent: Db,
    changelog: Option<Db>,
    changenumbers: Option<Db>,
    accesslog: Option<Db>,
}

impl Inner {
    /// Commit a write transaction so that read snapshots can tell the
    /// content before it from the content after it
    /// ([`ReadTxn::generation`]): every commit goes through here.
    pub(crate) fn commit(&self, txn: RwTxn<'_>) -> Result<(), heed::Error> {
        self.content_generation.changing();
        let committed = txn.commit();
        self.content_generation.settled();
        // Before any job of the batch is answered: no reader that follows
        // an answer takes a snapshot from before it.
        self.txns.clear();
        committed
    }

    fn new(
        env: Env,
        dbs: Dbs,
        indexes: crate::catalog::IndexMap,
        schema: Arc<Schema>,
        path: &Path,
        d: Durability,
        codec: entry_codec::Codec,
    ) -> Inner {
        Inner {
            env,
            meta: dbs.meta,
            id2entry: dbs.id2entry,
            dn2id: dbs.dn2id,
            dn2id_layout: dbs.dn2id_layout,
            id2parent: dbs.id2parent,
            changelog: dbs.changelog,
            changenumbers: dbs.changenumbers,
            accesslog: dbs.accesslog,
            catalog: arc_swap::ArcSwap::from_pointee(Catalog::new(schema, indexes)),
            builds: index_build::Builds::default(),
            max_batch: std::sync::atomic::AtomicUsize::new(StoreOptions::default().max_batch),
            codec,
            path: path.to_path_buf(),
            durability: writer::DurabilityCell::new(d),
            stats: writer::WriterStats::default(),
            readers: readers::Readers::new(),
            dn_generation: dn_cache::Generation::new(),
            content_generation: dn_cache::Generation::new(),
            txns: txn_pool::TxnPool::default(),
        }
    }
}

/// A handle to the open store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    writer: writer::WriterHandle,
}

/// A read transaction over the store.
pub struct ReadTxn<'s> {
    /// Taken only by `drop`, to give it back to the pool.
    txn: Option<RoTxn<'static>>,
    inner: &'s Inner,
    catalog: Arc<Catalog>,
    /// Its entry in the table of open readers (monitoring).
    slot: Option<usize>,
    /// Whether (and for which generation) it may use cached DNs.
    dn_snapshot: Option<dn_cache::Snapshot>,
    /// The store's content generation this snapshot holds, when known.
    content: Option<dn_cache::Snapshot>,
}

impl ReadTxn<'_> {
    /// The content generation this snapshot holds, when it is known: two
    /// snapshots with the same value hold the same data, so whatever was
    /// computed from one is valid for the other. None when a commit was
    /// under way as the snapshot was taken, or another process may write.
    pub fn generation(&self) -> Option<u64> {
        self.content.map(|s| s.generation())
    }
}

impl Drop for ReadTxn<'_> {
    fn drop(&mut self) {
        self.inner.readers.leave(self.slot);
        if let (Some(txn), Some(content)) = (self.txn.take(), self.content) {
            let current = self.inner.content_generation.before_open();
            self.inner.txns.give(
                txn_pool::Pooled {
                    txn,
                    content,
                    dn: self.dn_snapshot,
                },
                current,
            );
        }
    }
}

impl<'s> ReadTxn<'s> {
    pub(crate) fn txn(&self) -> &RoTxn<'static> {
        self.txn
            .as_ref()
            .expect("a read transaction's txn is taken only by drop")
    }

    pub fn view(&self) -> View<'_> {
        View {
            txn: self.txn(),
            inner: self.inner,
            catalog: &self.catalog,
            dn_snapshot: self.dn_snapshot,
            content: self.generation(),
        }
    }
}

/// The write transaction handed to a write job.
pub struct WriteTxn<'e> {
    txn: RwTxn<'e>,
    inner: &'e Inner,
    catalog: Arc<Catalog>,
    /// Run once the job's batch has committed (see [`WriteTxn::after_commit`]).
    after_commit: Vec<writer::AfterCommit>,
}

/// Outcome of resolving a DN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(EntryId),
    /// No such entry; `matched` is the deepest existing ancestor, if any.
    Missing {
        matched: Option<EntryId>,
    },
}

/// Where an entry hangs: parent ID (0 for a suffix entry) and its RDN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub parent: EntryId,
    pub rdn: String,
    pub norm_rdn: String,
}

/// Read access shared by read and write transactions.
#[derive(Clone, Copy)]
pub struct View<'t> {
    txn: &'t RoTxn<'t>,
    inner: &'t Inner,
    catalog: &'t Catalog,
    dn_snapshot: Option<dn_cache::Snapshot>,
    /// The content generation the snapshot holds, when known.
    content: Option<u64>,
}

#[cfg(test)]
mod tests;
