//! Pando's LMDB store.
//!
//! One LMDB environment holds every suffix. Sub-databases (byte layouts in
//! `docs/design.md`):
//!
//! * `meta`      — format version, next entry ID, server secrets (hashes only)
//! * `id2entry`  — entry ID (u64 BE) → stored entry (see [`entry_codec`])
//! * `dn2id`     — parent ID (u64 BE) ‖ normalised RDN → entry ID (u64 BE);
//!   a suffix entry has parent 0 and its whole normalised DN as "RDN"
//! * `id2parent` — entry ID → parent ID ‖ u16 len ‖ RDN as given ‖ normalised RDN
//! * `idx:<attr>:<kind>` — index key → RoaringTreemap of entry IDs (see [`index`])
//!
//! Invariants (checked by `verify`): every id2entry record has exactly one
//! id2parent record and one dn2id key pointing back at it; every parent ID
//! other than 0 exists; every index posting names an existing entry whose
//! values produce that key, and every such key lists the entry.
//!
//! Reads use LMDB read transactions concurrently from any thread. All writes
//! go through one writer thread ([`writer`]) that applies queued operations
//! in a batch, each in its own nested transaction, and commits the batch with
//! one fsync before answering any of them (group commit).

mod accesslog;
pub mod bulk;
mod catalog;
mod change_numbers;
mod changelog;
pub mod clock;
mod context_csn;
mod dictionary;
mod dn_cache;
pub mod entry_codec;
pub mod file_check;
pub mod index;
mod index_build;
#[cfg(any(test, feature = "fuzzing"))]
pub mod model_check;
mod plan;
mod readers;
pub mod salvage;
pub mod unsynced_marker;
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
pub use changelog::{ChangelogSummary, LoggedChange, LoggedKind, LoggedMod, ModOp};
pub use context_csn::csn_sid;
pub use index::IndexKind;
pub use index_build::{BuildProgress, CatalogChange, IndexState};
pub use plan::Candidates;
pub use unsynced_marker::{sync_dir, write_private};
pub use writer::{Durability, WriteJobError, WriterFigures};

pub type EntryId = u64;
type Db = Database<Bytes, Bytes>;

/// Default memory map: 1 TiB of address space. The file only grows as data
/// is written, so a large map costs nothing and removes the "maxsize"
/// cliff; `map_size` is a cap an operator may set on purpose.
pub const DEFAULT_MAP_SIZE: usize = 1 << 40;

/// LMDB's data file inside the store directory.
pub const DATA_FILE: &str = "data.mdb";

fn missing_database(path: &Path, name: &str) -> StoreError {
    StoreError::Damaged(format!(
        "{} has no '{name}' database: not a Pando store, or damaged",
        path.join(DATA_FILE).display()
    ))
}

/// Check the data file before LMDB is given it (see [`file_check`]); say
/// whether it holds a store. A file written with durability `none` and
/// never synced after is checked whole; when `writable` and sound, it is
/// synced and its marker removed.
///
/// `whole`: check every page (reading commands that then read it all).
/// A server may be committing while a reading command checks: a check is
/// only believed when the newest snapshot did not change during it (and a
/// whole check that never sees a still snapshot is left to the server,
/// which checked the store when it started).
pub fn preflight(path: &Path, writable: bool, whole: bool) -> Result<bool, StoreError> {
    let data = path.join(DATA_FILE);
    // Not damage: the file cannot be read here (permissions, I/O).
    let io = |e: std::io::Error| {
        StoreError::Lmdb(format!(
            "cannot read {}: {e} (check its permissions and the disk)",
            data.display()
        ))
    };
    let file = match std::fs::File::open(&data) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(e)),
    };
    let len = file.metadata().map_err(io)?.len();
    let unsynced = unsynced_marker::present(path);
    // SAFETY: sysconf has no preconditions. LMDB's page size is the OS's.
    let os_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    // With the marker, a store lived here: an empty or torn file is damage.
    if !unsynced {
        if len == 0 {
            // Created, cut before LMDB wrote its first page: nothing in it.
            return Ok(false);
        }
        if len <= 2 * os_page && writable && file_check::DataFile::open(&file).is_err() {
            // Only LMDB's two initial meta pages, torn by a cut before the
            // first commit (which writes at least four pages): no store
            // ever lived here. Set aside, never deleted, and a new one made.
            let aside = path.join(format!("{DATA_FILE}.unfinished"));
            tracing::warn!(path = %data.display(), aside = %aside.display(), "the data file holds only torn initial meta pages (a first start was cut short): set aside, a new store is made");
            std::fs::rename(&data, &aside).map_err(io)?;
            unsynced_marker::sync_dir(path).map_err(io)?;
            return Ok(false);
        }
    }
    if unsynced {
        tracing::warn!(path = %data.display(), "the store was written with durability = none and not synced since: checking every page");
    }
    let newest = |f: &std::fs::File| file_check::DataFile::open(f).ok().map(|d| d.meta.txnid);
    let mut damage = Vec::new();
    let mut live = false;
    for _ in 0..5 {
        let before = newest(&file);
        damage = file_check::check_paths(&file);
        if damage.is_empty() && (unsynced || whole) {
            damage = match file_check::DataFile::open(&file) {
                Ok(d) => d.check_all(),
                Err(e) => vec![e],
            };
        }
        live = newest(&file) != before;
        if damage.is_empty() || !live {
            break;
        }
    }
    if !damage.is_empty() && live {
        // A server is committing: a whole check cannot see a still
        // snapshot, and that server checked the store when it started.
        // The paths (small, quickly read) must still hold.
        damage = file_check::check_paths(&file);
    }
    if !damage.is_empty() {
        let why = if unsynced {
            " (it was written with durability = none and not synced since)"
        } else {
            ""
        };
        return Err(StoreError::Damaged(format!(
            "{}{why}: {}",
            data.display(),
            damage.join("; ")
        )));
    }
    if unsynced && writable {
        tracing::warn!(path = %data.display(), "checked every page of the store written with durability = none: it is sound");
        file.sync_all().map_err(io)?;
        unsynced_marker::clear(path);
    }
    file_check::has_databases(&file)
        .map_err(|e| StoreError::Damaged(format!("{}: {e}", data.display())))
}

/// On-disk format of the whole store; bumped on any incompatible change.
/// 2: entries may be zstd-compressed (entry format 2) and single-ID
/// postings are 8 bytes. Format 1 stores are read as they are and marked
/// format 2 when opened for writing (every format-1 record is valid in 2).
pub const FORMAT_VERSION: u32 = 2;
/// Oldest store format this version reads.
pub const OLDEST_FORMAT: u32 = 1;
const META_FORMAT: &[u8] = b"format";
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The memory map (and so the database file) reached its configured size.
    MapFull,
    /// The filesystem holding the database has no space left.
    DiskFull,
    /// A record failed its checks: the store is damaged.
    Corrupt(String),
    /// The store was written by an incompatible version of Pando.
    Format(String),
    /// The data file's structure is damaged (or it is not a Pando store):
    /// found before LMDB was given it.
    Damaged(String),
    /// Any other LMDB or I/O failure.
    Lmdb(String),
    /// The writer thread is gone (server shutting down).
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MapFull => f.write_str("database map is full"),
            Self::DiskFull => f.write_str("no space left on the device holding the database"),
            Self::Corrupt(s) => write!(f, "store corruption: {s}"),
            Self::Format(s) => write!(f, "store format: {s}"),
            Self::Damaged(s) => write!(f, "damaged store: {s}"),
            Self::Lmdb(s) => write!(f, "storage error: {s}"),
            Self::Closed => f.write_str("store is closed"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<heed::Error> for StoreError {
    fn from(e: heed::Error) -> Self {
        match e {
            heed::Error::Mdb(heed::MdbError::MapFull) => StoreError::MapFull,
            heed::Error::Mdb(heed::MdbError::Other(ENOSPC)) => StoreError::DiskFull,
            heed::Error::Io(e) if e.raw_os_error() == Some(ENOSPC) => StoreError::DiskFull,
            other => StoreError::Lmdb(other.to_string()),
        }
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(ENOSPC) {
            return StoreError::DiskFull;
        }
        StoreError::Lmdb(e.to_string())
    }
}

/// errno for "no space left on device" (Linux).
const ENOSPC: i32 = 28;

/// One configured index: attribute name (canonical, lowercase) and kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSpec {
    pub attr: String,
    pub kinds: Vec<IndexKind>,
}

/// Memory for index keys while an index is (re)built from id2entry.
pub const REBUILD_MEMORY: usize = 256 << 20;

/// zstd level used unless configured: fast to write, most of the gain.
pub const DEFAULT_COMPRESSION_LEVEL: i32 = 3;

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Size of the memory map in bytes (upper bound of the database file).
    pub map_size: usize,
    pub indexes: Vec<IndexSpec>,
    /// Most operations applied in one write transaction.
    pub max_batch: usize,
    pub durability: Durability,
    /// zstd level for stored entries; None stores them plain.
    pub compression: Option<i32>,
    /// Check every page of the data file when opening it for writing (not
    /// only the paths read at open): about 0.4 s per 170 MB here.
    pub check_all_pages: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            map_size: DEFAULT_MAP_SIZE,
            indexes: Vec::new(),
            max_batch: 256,
            durability: Durability::Durable,
            compression: Some(DEFAULT_COMPRESSION_LEVEL),
            check_all_pages: true,
        }
    }
}

pub(crate) struct Inner {
    env: Env,
    meta: Db,
    id2entry: Db,
    dn2id: Db,
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
}

/// The fixed databases.
struct Dbs {
    meta: Db,
    id2entry: Db,
    dn2id: Db,
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
        committed
    }

    fn new(
        env: Env,
        dbs: Dbs,
        indexes: HashMap<String, Vec<IndexDb>>,
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
        }
    }
}

/// A handle to the open store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    writer: writer::WriterHandle,
}

impl Store {
    /// Open (creating if needed) the store in directory `path`.
    pub fn open(
        path: &Path,
        schema: Arc<Schema>,
        opts: &StoreOptions,
    ) -> Result<Store, StoreError> {
        std::fs::create_dir_all(path)?;
        // The store holds every password hash: private to the service account.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
        }
        // An existing file is checked before LMDB trusts it, and is never
        // initialised over: only a directory without a store (or with one
        // whose creating transaction never committed) gets a new one.
        let existing = preflight(path, true, opts.check_all_pages)?;
        let mut env_opts = EnvOpenOptions::new();
        env_opts
            .map_size(opts.map_size)
            .max_dbs(16 + 5 * opts.indexes.len() as u32 + RUNTIME_INDEX_ROOM)
            .max_readers(1024);
        // SAFETY: the directory is opened by this process only through this
        // Store (the lock file also guards other processes); NO_TLS because
        // read transactions move between tokio's blocking threads.
        let env = unsafe {
            env_opts.flags(EnvFlags::NO_TLS);
            env_opts.open(path)?
        };
        let mut wtxn = env.write_txn()?;
        let (meta, id2entry, dn2id, id2parent): (Db, Db, Db, Db) = if existing {
            let open = |name: &str| -> Result<Db, StoreError> {
                env.open_database::<Bytes, Bytes>(&wtxn, Some(name))?
                    .ok_or_else(|| missing_database(path, name))
            };
            (
                open("meta")?,
                open("id2entry")?,
                open("dn2id")?,
                open("id2parent")?,
            )
        } else {
            (
                env.create_database(&mut wtxn, Some("meta"))?,
                env.create_database(&mut wtxn, Some("id2entry"))?,
                env.create_database(&mut wtxn, Some("dn2id"))?,
                env.create_database(&mut wtxn, Some("id2parent"))?,
            )
        };
        match meta.get(&wtxn, META_FORMAT)? {
            None if existing => {
                return Err(StoreError::Damaged(format!(
                    "{}: the 'meta' database has no format record",
                    path.join(DATA_FILE).display()
                )))
            }
            None => {
                meta.put(&mut wtxn, META_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
                meta.put(&mut wtxn, META_NEXT_ID, &1u64.to_be_bytes())?;
            }
            Some(v) => {
                let found = <[u8; 4]>::try_from(v)
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Format("unreadable format version in meta".into()))?;
                if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&found) {
                    return Err(StoreError::Format(format!(
                        "store {} has format {found}, this Pando reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}",
                        path.display()
                    )));
                }
                if found < FORMAT_VERSION {
                    // From now on records of the new format may be written.
                    meta.put(&mut wtxn, META_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
                }
            }
        }
        // `meta:indexes` lists the index databases kept up to date. A
        // configured index not on the list (new, or dropped from the
        // configuration earlier and so stale) is rebuilt, and the list
        // updated, in this same transaction: an index that is listed is
        // always complete. Indexes no longer configured are emptied.
        let listed: HashSet<String> = match meta.get(&wtxn, META_INDEXES)? {
            Some(v) => parse_listed(v).into_iter().collect(),
            // Stores from before the list: their existing indexes were built whole.
            None => {
                let mut existing = HashSet::new();
                for spec in &opts.indexes {
                    for &kind in &spec.kinds {
                        let name = index::db_name(&spec.attr.to_ascii_lowercase(), kind);
                        if env
                            .open_database::<Bytes, Bytes>(&wtxn, Some(&name))?
                            .is_some()
                        {
                            existing.insert(name);
                        }
                    }
                }
                existing
            }
        };
        let mut indexes: HashMap<String, Vec<IndexDb>> = HashMap::new();
        let mut to_build = Vec::new();
        let mut maintained: Vec<String> = Vec::new();
        for spec in &opts.indexes {
            let attr = spec.attr.to_ascii_lowercase();
            for &kind in &spec.kinds {
                let name = index::db_name(&attr, kind);
                let db: Db = env.create_database(&mut wtxn, Some(&name))?;
                if !listed.contains(&name) {
                    db.clear(&mut wtxn)?;
                    to_build.push((attr.clone(), kind, db));
                }
                maintained.push(name);
                indexes.entry(attr.clone()).or_default().push(IndexDb {
                    kind,
                    db,
                    ready: true,
                });
            }
        }
        // Dropped while serving and not emptied before the server stopped.
        let dropped: Vec<String> = match meta.get(&wtxn, META_INDEXES_DROPPED)? {
            Some(v) => parse_listed(v),
            None => Vec::new(),
        };
        meta.delete(&mut wtxn, META_INDEXES_DROPPED)?;
        for name in listed
            .iter()
            .chain(&dropped)
            .filter(|n| !maintained.contains(n))
        {
            if let Some(db) = env.open_database::<Bytes, Bytes>(&wtxn, Some(name))? {
                db.clear(&mut wtxn)?;
            }
        }
        let codec = load_codec(&wtxn, meta, opts.compression)?;
        if !to_build.is_empty() {
            bulk::fill_indexes(
                &schema,
                &codec,
                id2entry,
                &mut wtxn,
                &to_build,
                bulk::Runs::new(REBUILD_MEMORY, &path.join("index-runs")),
                &mut |_| {},
            )?;
        }
        meta.put(&mut wtxn, META_INDEXES, maintained.join("\n").as_bytes())?;
        context_csn::migrate(meta, &mut wtxn)?;
        let newest = {
            let mut newest: Option<Vec<u8>> = None;
            for item in meta.prefix_iter(&wtxn, b"context_csn:")? {
                let (_, v) = item?;
                if newest.as_deref().is_none_or(|n| v > n) {
                    newest = Some(v.to_vec());
                }
            }
            newest.map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        let changelog = Some(changelog::open(
            &env,
            &mut wtxn,
            meta,
            existing,
            newest.as_deref(),
        )?);
        let changenumbers = match changelog {
            Some(log) => Some(change_numbers::open(&env, &mut wtxn, log)?),
            None => None,
        };
        let accesslog = Some(accesslog::open(&env, &mut wtxn)?);
        wtxn.commit()?;
        let dbs = Dbs {
            meta,
            id2entry,
            dn2id,
            id2parent,
            changelog,
            changenumbers,
            accesslog,
        };
        let inner = Arc::new(Inner::new(
            env,
            dbs,
            indexes,
            schema,
            path,
            opts.durability,
            codec,
        ));
        inner
            .max_batch
            .store(opts.max_batch, std::sync::atomic::Ordering::Relaxed);
        let writer = writer::WriterHandle::start(inner.clone())?;
        inner.builds.connect(Arc::downgrade(&inner), writer.clone());
        Ok(Store { inner, writer })
    }

    /// `meta` records of the store in `path` (one per key, None for a
    /// missing one), read before the store is opened (the configuration
    /// kept in the store says how to open it). None when there is no store
    /// yet. The file passes the same check as for
    /// [`Store::open_read_only`] first; the environment is closed again
    /// before this returns, so the store can then be opened as usual.
    pub fn peek_meta(
        path: &Path,
        keys: &[&str],
    ) -> Result<Option<Vec<Option<Vec<u8>>>>, StoreError> {
        if !preflight(path, false, false)? {
            return Ok(None);
        }
        let mut env_opts = EnvOpenOptions::new();
        env_opts.max_dbs(16).max_readers(16);
        // SAFETY: as in `open_read_only`; the environment is closed below,
        // before anything else in this process opens the directory.
        let env = unsafe {
            env_opts.flags(EnvFlags::NO_TLS | EnvFlags::READ_ONLY);
            env_opts.open(path)?
        };
        let value = {
            let rtxn = env.read_txn()?;
            let meta = env
                .open_database::<Bytes, Bytes>(&rtxn, Some("meta"))?
                .ok_or_else(|| missing_database(path, "meta"))?;
            let mut values = Vec::with_capacity(keys.len());
            for key in keys {
                values.push(meta.get(&rtxn, key.as_bytes())?.map(<[u8]>::to_vec));
            }
            rtxn.commit()?;
            values
        };
        env.prepare_for_closing().wait();
        Ok(Some(value))
    }

    /// Open an existing store read-only, beside a server that may be writing
    /// it (LMDB readers and a writer coexist across processes): for backup,
    /// export and verify. Writes through this handle fail with `Closed`.
    pub fn open_read_only(
        path: &Path,
        schema: Arc<Schema>,
        opts: &StoreOptions,
    ) -> Result<Store, StoreError> {
        if !preflight(path, false, false)? {
            return Err(StoreError::Format(format!(
                "no store in {}",
                path.display()
            )));
        }
        let mut env_opts = EnvOpenOptions::new();
        env_opts
            .map_size(opts.map_size)
            .max_dbs(16 + 5 * opts.indexes.len() as u32 + RUNTIME_INDEX_ROOM)
            .max_readers(1024);
        // SAFETY: as in `open`; READ_ONLY never writes the data file.
        let env = unsafe {
            env_opts.flags(EnvFlags::NO_TLS | EnvFlags::READ_ONLY);
            env_opts.open(path)?
        };
        let rtxn = env.read_txn()?;
        let open = |name: &str| -> Result<Db, StoreError> {
            env.open_database::<Bytes, Bytes>(&rtxn, Some(name))?
                .ok_or_else(|| missing_database(path, name))
        };
        let (meta, id2entry, dn2id, id2parent) = (
            open("meta")?,
            open("id2entry")?,
            open("dn2id")?,
            open("id2parent")?,
        );
        let found = meta
            .get(&rtxn, META_FORMAT)?
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_be_bytes);
        if !found.is_some_and(|f| (OLDEST_FORMAT..=FORMAT_VERSION).contains(&f)) {
            return Err(StoreError::Format(format!(
                "store {} has format {found:?}, this Pando reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}",
                path.display()
            )));
        }
        // Stores from before the list: every index there is complete.
        let listed: Option<HashSet<String>> = meta
            .get(&rtxn, META_INDEXES)?
            .map(|v| parse_listed(v).into_iter().collect());
        let mut indexes: HashMap<String, Vec<IndexDb>> = HashMap::new();
        for spec in &opts.indexes {
            let attr = spec.attr.to_ascii_lowercase();
            for &kind in &spec.kinds {
                let name = index::db_name(&attr, kind);
                // Unlisted: being built by a server that has it open.
                if let Some(db) = env.open_database::<Bytes, Bytes>(&rtxn, Some(&name))? {
                    indexes.entry(attr.clone()).or_default().push(IndexDb {
                        kind,
                        db,
                        ready: listed.as_ref().is_none_or(|l| l.contains(&name)),
                    });
                }
            }
        }
        let codec = load_codec(&rtxn, meta, opts.compression)?;
        let changelog = env.open_database::<Bytes, Bytes>(&rtxn, Some(changelog::NAME))?;
        let changenumbers = env.open_database::<Bytes, Bytes>(&rtxn, Some(change_numbers::NAME))?;
        let accesslog = env.open_database::<Bytes, Bytes>(&rtxn, Some(accesslog::NAME))?;
        rtxn.commit()?;
        let dbs = Dbs {
            meta,
            id2entry,
            dn2id,
            id2parent,
            changelog,
            changenumbers,
            accesslog,
        };
        let mut inner = Inner::new(env, dbs, indexes, schema, path, Durability::Durable, codec);
        // Another process may be writing: its renames would go unseen.
        inner.dn_generation = dn_cache::Generation::disabled();
        inner.content_generation = dn_cache::Generation::disabled();
        Ok(Store {
            inner: Arc::new(inner),
            writer: writer::WriterHandle::closed(),
        })
    }

    /// A consistent, compacted copy of the database file, made from one read
    /// transaction while writes continue.
    pub fn copy_compacted(&self, dest: &Path) -> Result<(), StoreError> {
        let f = self
            .inner
            .env
            .copy_to_file(dest, heed::CompactionOption::Enabled)?;
        f.sync_all()?;
        Ok(())
    }

    /// Make every committed write durable now, whatever the durability mode.
    pub fn sync(&self) -> Result<(), StoreError> {
        Ok(self.inner.env.force_sync()?)
    }

    /// The schema current now.
    pub fn schema(&self) -> Arc<Schema> {
        self.inner.catalog.load().schema.clone()
    }

    /// Every index kept, sorted, with the progress of those being built.
    pub fn indexes(&self) -> Vec<IndexState> {
        let catalog = self.inner.catalog.load();
        let mut out: Vec<IndexState> = catalog
            .indexes
            .iter()
            .flat_map(|(attr, dbs)| {
                dbs.iter().map(move |d| IndexState {
                    attr: attr.clone(),
                    kind: d.kind,
                    building: if d.ready {
                        None
                    } else {
                        Some(
                            self.inner
                                .builds
                                .progress(&index::db_name(attr, d.kind))
                                .unwrap_or(BuildProgress {
                                    entries_done: 0,
                                    entries_total: 0,
                                    elapsed: std::time::Duration::ZERO,
                                }),
                        )
                    },
                })
            })
            .collect();
        out.sort_by(|a, b| a.attr.cmp(&b.attr).then(a.kind.cmp(&b.kind)));
        out
    }

    /// Change when acknowledged writes reach the disk; applies from the
    /// writer's next batch.
    pub fn set_durability(&self, d: Durability) {
        self.inner.durability.set(d);
        // Wake the writer so a switch to `durable` syncs what earlier modes
        // left unsynced now, not at the next write.
        let _ = self
            .writer
            .submit(|_w: &mut WriteTxn<'_>| Ok::<(), StoreError>(()));
    }

    /// Most operations in one write transaction, from the writer's next
    /// batch.
    pub fn set_max_batch(&self, n: usize) {
        self.inner
            .max_batch
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn durability(&self) -> Durability {
        self.inner.durability.get()
    }

    pub fn writer_stats(&self) -> WriterFigures {
        self.inner.stats.snapshot()
    }

    /// Rebuild the indexes of the given attributes (all when empty) from
    /// id2entry, in one transaction, with an external sort bounded by
    /// [`REBUILD_MEMORY`]. `progress` gets the number of entries read so
    /// far. Returns the number of entries read.
    pub fn rebuild_indexes(
        &self,
        only: &[String],
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, StoreError> {
        let only: Vec<String> = only.iter().map(|a| a.to_ascii_lowercase()).collect();
        let inner = &self.inner;
        let catalog = inner.catalog.load_full();
        let mut targets = Vec::new();
        for (attr, dbs) in &catalog.indexes {
            if only.is_empty() || only.contains(attr) {
                for idx in dbs {
                    targets.push((attr.clone(), idx.kind, idx.db));
                }
            }
        }
        let mut txn = inner.env.write_txn()?;
        for (_, _, db) in &targets {
            db.clear(&mut txn)?;
        }
        let n = bulk::fill_indexes(
            &catalog.schema,
            &inner.codec,
            inner.id2entry,
            &mut txn,
            &targets,
            bulk::Runs::new(REBUILD_MEMORY, &inner.path.join("index-runs")),
            progress,
        )?;
        inner.commit(txn)?;
        Ok(n)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How entries are stored (compression, dictionaries).
    pub fn codec(&self) -> &entry_codec::Codec {
        &self.inner.codec
    }

    /// A consistent read-only snapshot.
    pub fn read(&self) -> Result<ReadTxn<'_>, StoreError> {
        let before = self.inner.dn_generation.before_open();
        let content = self.inner.content_generation.before_open();
        let catalog = self.inner.catalog.load_full();
        let txn = self.inner.env.read_txn()?;
        let catalog = catalog::for_snapshot(catalog, &self.inner.catalog.load());
        Ok(ReadTxn {
            txn,
            inner: &self.inner,
            catalog,
            slot: self.inner.readers.enter(),
            dn_snapshot: self.inner.dn_generation.after_open(before),
            content: self.inner.content_generation.after_open(content),
        })
    }

    /// Queue a write; `f` runs on the writer thread inside its own nested
    /// transaction. `Ok` is returned only after the batch holding it was
    /// committed and synced; an `Err` from `f` rolls back everything `f` did.
    pub async fn write<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    {
        let rx = self.writer.submit(f)?;
        rx.await.unwrap_or(Err(E::from(StoreError::Closed)))
    }

    /// Queue `f` on the writer now, in the order of this call among other
    /// jobs (where [`Store::write`] queues when first polled); await the
    /// receiver for its result.
    pub fn submit<R, E, F>(&self, f: F) -> Result<tokio::sync::oneshot::Receiver<Result<R, E>>, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    {
        self.writer.submit(f)
    }

    /// [`Store::write`] for callers outside an async runtime.
    pub fn write_blocking<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    {
        let rx = self.writer.submit(f)?;
        rx.blocking_recv()
            .unwrap_or(Err(E::from(StoreError::Closed)))
    }

    /// Stop the writer after the queued writes and close the environment.
    /// Other clones of this handle must be dropped first for the files to be
    /// released; this waits for the writer in any case.
    pub fn close(self) {
        self.writer.shutdown();
        self.inner.builds.join();
        let Store { inner, writer } = self;
        drop(writer);
        // The last handle: close the environment now rather than whenever
        // the final reference happens to drop.
        if let Ok(inner) = Arc::try_unwrap(inner) {
            inner.env.prepare_for_closing().wait();
        }
    }

    /// Bytes used by the database file.
    pub fn disk_size(&self) -> u64 {
        self.inner.env.real_disk_size().unwrap_or(0)
    }

    /// Figures for monitoring: sizes of the environment and of every
    /// database (pages × page size), reader slots, entries.
    pub fn stats(&self) -> Result<StoreStats, StoreError> {
        let inner = &self.inner;
        let info = inner.env.info();
        let txn = inner.env.read_txn()?;
        let mut databases = Vec::new();
        let mut page_size = 4096u64;
        let mut add = |name: String, db: &Db| -> Result<(), StoreError> {
            let st = db.stat(&txn)?;
            page_size = u64::from(st.page_size);
            let pages = (st.branch_pages + st.leaf_pages + st.overflow_pages) as u64;
            databases.push(DbFigures {
                name,
                bytes: pages * u64::from(st.page_size),
                items: st.entries as u64,
            });
            Ok(())
        };
        add("id2entry".into(), &inner.id2entry)?;
        add("dn2id".into(), &inner.dn2id)?;
        add("id2parent".into(), &inner.id2parent)?;
        add("meta".into(), &inner.meta)?;
        if let Some(db) = &inner.changelog {
            add(changelog::NAME.into(), db)?;
        }
        if let Some(db) = &inner.changenumbers {
            add(change_numbers::NAME.into(), db)?;
        }
        if let Some(db) = &inner.accesslog {
            add(accesslog::NAME.into(), db)?;
        }
        let catalog = inner.catalog.load();
        let mut names: Vec<&String> = catalog.indexes.keys().collect();
        names.sort();
        for attr in names {
            for idx in &catalog.indexes[attr] {
                add(format!("idx:{attr}:{}", idx.kind.as_str()), &idx.db)?;
            }
        }
        let entries = inner.id2entry.len(&txn)?;
        drop(txn);
        let (readers_open, oldest_reader_micros) = inner.readers.snapshot();
        Ok(StoreStats {
            readers_open,
            oldest_reader_micros,
            entries,
            disk_bytes: inner.env.real_disk_size().unwrap_or(0),
            map_size: info.map_size as u64,
            map_used_bytes: (info.last_page_number as u64 + 1) * page_size,
            reader_slots_used: u64::from(info.number_of_readers),
            last_txn_id: info.last_txn_id as u64,
            databases,
        })
    }
}

/// See [`Store::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub entries: u64,
    /// Size of the data file on disk.
    pub disk_bytes: u64,
    /// The configured map size (the data file's upper bound).
    pub map_size: u64,
    /// Pages in use up to the highest one written, in bytes.
    pub map_used_bytes: u64,
    /// LMDB reader-table slots in use (threads that have read; a slot
    /// stays assigned to its thread).
    pub reader_slots_used: u64,
    pub last_txn_id: u64,
    /// Read transactions open now (through [`Store::read`]).
    pub readers_open: u64,
    /// How long the oldest of them has been open, microseconds.
    pub oldest_reader_micros: u64,
    pub databases: Vec<DbFigures>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DbFigures {
    /// `id2entry`, `dn2id`, `id2parent`, `meta`, `idx:<attr>:<kind>`.
    pub name: String,
    pub bytes: u64,
    pub items: u64,
}

/// The values of attribute `attr_lower` (any options) in stored order.
fn values_of<'a>(attrs: &'a [Attribute], attr_lower: &str) -> Vec<(&'a str, &'a [Vec<u8>])> {
    attrs
        .iter()
        .filter(|a| pando_model::desc::base(&a.desc).eq_ignore_ascii_case(attr_lower))
        .map(|a| (a.desc.as_str(), a.values.as_slice()))
        .collect()
}

/// The keys that the values of `attr_lower` in `attrs` produce for `kind`.
fn attr_keys(
    schema: &Schema,
    attrs: &[Attribute],
    attr_lower: &str,
    kind: IndexKind,
) -> BTreeSet<Vec<u8>> {
    let mut keys = BTreeSet::new();
    for a in attrs {
        let base = pando_model::desc::base(&a.desc);
        if !base.eq_ignore_ascii_case(attr_lower) {
            continue;
        }
        if let Some(at) = schema.attribute(base) {
            for v in &a.values {
                index::keys_for(schema, at, kind, v, &mut keys);
            }
        }
    }
    keys
}

/// The entry codec for `compression`, with every dictionary kept in meta.
fn load_codec(
    txn: &RoTxn<'_>,
    meta: Db,
    compression: Option<i32>,
) -> Result<entry_codec::Codec, StoreError> {
    let codec = entry_codec::Codec::new(compression);
    let current = match meta.get(txn, entry_codec::META_DICT_CURRENT.as_bytes())? {
        Some(v) => Some(
            <[u8; 4]>::try_from(v)
                .map(u32::from_be_bytes)
                .map_err(|_| StoreError::Corrupt("meta: unreadable current dictionary".into()))?,
        ),
        None => None,
    };
    for item in meta.prefix_iter(txn, b"zstd_dict:")? {
        let (k, v) = item?;
        let id = std::str::from_utf8(&k[b"zstd_dict:".len()..])
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| StoreError::Corrupt("meta: unreadable dictionary key".into()))?;
        codec.add_dict(id, v.to_vec(), Some(id) == current);
    }
    Ok(codec)
}

/// A read transaction over the store.
pub struct ReadTxn<'s> {
    txn: RoTxn<'s>,
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
    }
}

impl<'s> ReadTxn<'s> {
    pub fn view(&self) -> View<'_> {
        View {
            txn: &self.txn,
            inner: self.inner,
            catalog: &self.catalog,
            dn_snapshot: self.dn_snapshot,
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

fn id_bytes(id: EntryId) -> [u8; 8] {
    id.to_be_bytes()
}

fn id_from(b: &[u8]) -> Result<EntryId, StoreError> {
    <[u8; 8]>::try_from(b)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(format!("bad entry ID of {} bytes", b.len())))
}

fn dn2id_key(parent: EntryId, norm_rdn: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + norm_rdn.len());
    k.extend_from_slice(&id_bytes(parent));
    k.extend_from_slice(norm_rdn.as_bytes());
    k
}

fn encode_placement(p: &Placement) -> Vec<u8> {
    let mut v = Vec::with_capacity(10 + p.rdn.len() + p.norm_rdn.len());
    v.extend_from_slice(&id_bytes(p.parent));
    v.extend_from_slice(&(p.rdn.len() as u16).to_be_bytes());
    v.extend_from_slice(p.rdn.as_bytes());
    v.extend_from_slice(p.norm_rdn.as_bytes());
    v
}

fn decode_placement(id: EntryId, v: &[u8]) -> Result<Placement, StoreError> {
    let bad = || StoreError::Corrupt(format!("id2parent record {id} is malformed"));
    if v.len() < 10 {
        return Err(bad());
    }
    let parent = id_from(&v[..8])?;
    let len = u16::from_be_bytes([v[8], v[9]]) as usize;
    let rest = &v[10..];
    if rest.len() < len {
        return Err(bad());
    }
    let rdn = std::str::from_utf8(&rest[..len])
        .map_err(|_| bad())?
        .to_string();
    let norm_rdn = std::str::from_utf8(&rest[len..])
        .map_err(|_| bad())?
        .to_string();
    Ok(Placement {
        parent,
        rdn,
        norm_rdn,
    })
}

/// Resolve normalised RDNs (most specific first) through dn2id.
fn lookup_in(inner: &Inner, txn: &RoTxn<'_>, norm_rdns: &[String]) -> Result<Lookup, StoreError> {
    // Find the longest suffix entry (parent 0) that ends this DN, then walk down.
    for start in 0..norm_rdns.len() {
        let suffix = norm_rdns[start..].join(",");
        if let Some(v) = inner.dn2id.get(txn, &dn2id_key(0, &suffix))? {
            let mut id = id_from(v)?;
            for i in (0..start).rev() {
                match inner.dn2id.get(txn, &dn2id_key(id, &norm_rdns[i]))? {
                    Some(v) => id = id_from(v)?,
                    None => return Ok(Lookup::Missing { matched: Some(id) }),
                }
            }
            return Ok(Lookup::Found(id));
        }
    }
    Ok(Lookup::Missing { matched: None })
}

/// Read access shared by read and write transactions.
#[derive(Clone, Copy)]
pub struct View<'t> {
    txn: &'t RoTxn<'t>,
    inner: &'t Inner,
    catalog: &'t Catalog,
    dn_snapshot: Option<dn_cache::Snapshot>,
}

impl<'t> View<'t> {
    pub fn schema(&self) -> &'t Schema {
        &self.catalog.schema
    }

    /// Resolve `dn` (already split into normalised RDNs, leftmost first).
    pub fn lookup_norm(&self, norm_rdns: &[String]) -> Result<Lookup, StoreError> {
        // A cached ID may have been learnt by a newer snapshot of the same
        // generation, holding entries added since this one was taken (see
        // `dn_cache`): it counts only if this snapshot holds the entry too.
        if let Some(id) = dn_cache::id_of(self.dn_snapshot, norm_rdns) {
            if self.holds(id)? {
                return Ok(Lookup::Found(id));
            }
        }
        // A known parent (a user's bind DN under ou=People): one lookup. A
        // child found in this snapshot's dn2id is in it; on a miss the
        // parent is the matched entry only if this snapshot holds it.
        if let Some((rdn, up)) = norm_rdns.split_first() {
            if let Some(parent) = dn_cache::id_of(self.dn_snapshot, up) {
                match self.inner.dn2id.get(self.txn, &dn2id_key(parent, rdn))? {
                    Some(v) => return Ok(Lookup::Found(id_from(v)?)),
                    None if self.holds(parent)? => {
                        return Ok(Lookup::Missing {
                            matched: Some(parent),
                        })
                    }
                    None => {}
                }
            }
        }
        let found = lookup_in(self.inner, self.txn, norm_rdns)?;
        if let Lookup::Found(id) = found {
            dn_cache::remember_id(self.dn_snapshot, norm_rdns, id);
        }
        Ok(found)
    }

    /// Whether entry `id` is in this snapshot (its id2parent record, the
    /// smallest of its records, is).
    fn holds(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self.inner.id2parent.get(self.txn, &id_bytes(id))?.is_some())
    }

    /// Normalise each RDN of `dn` with the schema.
    pub fn normalize_rdns(&self, dn: &Dn) -> Result<Vec<String>, String> {
        dn.rdns
            .iter()
            .map(|r| self.catalog.schema.normalize_rdn(r))
            .collect()
    }

    pub fn lookup(&self, dn: &Dn) -> Result<Result<Lookup, String>, StoreError> {
        match self.normalize_rdns(dn) {
            Ok(n) => self.lookup_norm(&n).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }

    pub fn placement(&self, id: EntryId) -> Result<Option<Placement>, StoreError> {
        match self.inner.id2parent.get(self.txn, &id_bytes(id))? {
            Some(v) => decode_placement(id, v).map(Some),
            None => Ok(None),
        }
    }

    /// Parent ID (None for a suffix entry or a missing one), reading only
    /// the first field of the id2parent record.
    pub fn parent_of(&self, id: EntryId) -> Result<Option<EntryId>, StoreError> {
        match self.inner.id2parent.get(self.txn, &id_bytes(id))? {
            Some(v) if v.len() >= 8 => Ok(Some(id_from(&v[..8])?).filter(|&p| p != 0)),
            Some(_) => Err(StoreError::Corrupt(format!(
                "id2parent record {id} is malformed"
            ))),
            None => Ok(None),
        }
    }

    /// The DN of `id` as stored and normalised (empty for a missing entry).
    /// Parents' DNs come from (and go to) the thread's [`dn_cache`].
    pub fn dn_pair(&self, id: EntryId) -> Result<(String, String), StoreError> {
        if let Some(n) = dn_cache::node(self.dn_snapshot, id) {
            return Ok((n.dn, n.norm));
        }
        match self.placement(id)? {
            Some(p) => self.dn_pair_of(&p),
            None => Ok((String::new(), String::new())),
        }
    }

    /// [`View::dn_pair`] of the entry placed at `p` (read by the caller).
    pub fn dn_pair_of(&self, p: &Placement) -> Result<(String, String), StoreError> {
        self.dn_below(p, 0)
    }

    /// The DN of the entry placed at `p`: its RDN before its parent's DN,
    /// formatted from the cached parent when there is one. `depth`: parents
    /// walked so far.
    fn dn_below(&self, p: &Placement, depth: u32) -> Result<(String, String), StoreError> {
        let join = |n: &dn_cache::Node| {
            (
                format!("{},{}", p.rdn, n.dn),
                format!("{},{}", p.norm_rdn, n.norm),
            )
        };
        if p.parent != 0 {
            if let Some(pair) = dn_cache::with_node(self.dn_snapshot, p.parent, join) {
                return Ok(pair);
            }
            if let Some(parent) = self.learn_node(p.parent, depth)? {
                return Ok(join(&parent));
            }
        }
        Ok((p.rdn.clone(), p.norm_rdn.clone()))
    }

    /// Read what [`View::dn_pair`] needs of a parent that is not cached, and
    /// remember it for the next time.
    fn learn_node(&self, id: EntryId, depth: u32) -> Result<Option<dn_cache::Node>, StoreError> {
        // Depth is bounded by the DN length limit; this also stops a
        // corrupted parent cycle.
        if depth >= 1024 {
            return Err(StoreError::Corrupt(format!(
                "parent chain of entry {id} does not end"
            )));
        }
        let Some(p) = self.placement(id)? else {
            return Ok(None);
        };
        let (dn, norm) = self.dn_below(&p, depth + 1)?;
        let node = dn_cache::Node {
            parent: p.parent,
            dn,
            norm,
        };
        dn_cache::remember(self.dn_snapshot, id, node.clone());
        Ok(Some(node))
    }

    /// The entry's DN as stored (RDNs as given when added or renamed).
    pub fn dn_string(&self, id: EntryId) -> Result<String, StoreError> {
        let mut out = String::new();
        let mut cur = id;
        // Depth is bounded by the DN length limit; the counter also stops a
        // corrupted parent cycle from looping forever.
        for _ in 0..1024 {
            let p = self.placement(cur)?.ok_or_else(|| {
                StoreError::Corrupt(format!("entry {cur} has no id2parent record"))
            })?;
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&p.rdn);
            if p.parent == 0 {
                return Ok(out);
            }
            cur = p.parent;
        }
        Err(StoreError::Corrupt(format!(
            "parent chain of entry {id} does not end"
        )))
    }

    pub fn dn(&self, id: EntryId) -> Result<Dn, StoreError> {
        let s = self.dn_string(id)?;
        Dn::parse(&s)
            .map_err(|e| StoreError::Corrupt(format!("stored DN '{s}' of entry {id}: {e}")))
    }

    /// The stored (possibly compressed) record of entry `id`.
    pub fn entry_bytes(&self, id: EntryId) -> Result<Option<&'t [u8]>, StoreError> {
        Ok(self.inner.id2entry.get(self.txn, &id_bytes(id))?)
    }

    /// The attributes in a record read with [`View::entry_bytes`].
    pub fn decode_attrs(&self, id: EntryId, bytes: &[u8]) -> Result<Vec<Attribute>, StoreError> {
        Ok(self
            .inner
            .codec
            .decode(id, Dn { rdns: vec![] }, bytes)?
            .attrs)
    }

    /// Only the attributes of entry `id` whose description `keep` accepts.
    pub fn attrs_where(
        &self,
        id: EntryId,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<Attribute>>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => Ok(Some(
                self.inner
                    .codec
                    .decode_where(id, Dn { rdns: vec![] }, b, Some(keep))?
                    .attrs,
            )),
            None => Ok(None),
        }
    }

    /// Run `f` on entry `id`'s attributes borrowed from the store, without
    /// copying them; None when there is no such entry.
    pub fn with_raw_attrs<R>(
        &self,
        id: EntryId,
        f: impl FnOnce(entry_codec::RawAttrs<'_>) -> R,
    ) -> Result<Option<R>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => Ok(Some(self.inner.codec.with_raw(id, b, f)?)),
            None => Ok(None),
        }
    }

    /// The entry without its DN resolved (cheaper when the DN is not needed).
    pub fn attrs(&self, id: EntryId) -> Result<Option<Vec<Attribute>>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => Ok(Some(self.decode_attrs(id, b)?)),
            None => Ok(None),
        }
    }

    pub fn entry(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => {
                let dn = self.dn(id)?;
                Ok(Some(self.inner.codec.decode(id, dn, b)?))
            }
            None => Ok(None),
        }
    }

    /// Immediate children, in key order.
    pub fn children(&self, id: EntryId) -> Result<Vec<EntryId>, StoreError> {
        let mut out = Vec::new();
        for item in self.inner.dn2id.prefix_iter(self.txn, &id_bytes(id))? {
            out.push(id_from(item?.1)?);
        }
        Ok(out)
    }

    /// The first `max` children of `id` (in dn2id order, by RDN), for
    /// callers that must bound their work on a large parent.
    pub fn children_up_to(&self, id: EntryId, max: usize) -> Result<Vec<EntryId>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .inner
            .dn2id
            .prefix_iter(self.txn, &id_bytes(id))?
            .take(max)
        {
            out.push(id_from(item?.1)?);
        }
        Ok(out)
    }

    pub fn has_children(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self
            .inner
            .dn2id
            .prefix_iter(self.txn, &id_bytes(id))?
            .next()
            .transpose()?
            .is_some())
    }

    pub fn count_children(&self, id: EntryId) -> Result<u64, StoreError> {
        let mut n = 0;
        for item in self.inner.dn2id.prefix_iter(self.txn, &id_bytes(id))? {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// `id` and all its descendants. Stops with `None` once more than `limit`
    /// IDs were found (the caller decides whether that is an error).
    pub fn subtree(&self, id: EntryId, limit: u64) -> Result<Option<RoaringTreemap>, StoreError> {
        let mut set = RoaringTreemap::new();
        set.insert(id);
        let mut stack = vec![id];
        while let Some(cur) = stack.pop() {
            for item in self.inner.dn2id.prefix_iter(self.txn, &id_bytes(cur))? {
                let child = id_from(item?.1)?;
                set.insert(child);
                if set.len() > limit {
                    return Ok(None);
                }
                stack.push(child);
            }
        }
        Ok(Some(set))
    }

    /// True when `id` is `ancestor` or below it.
    pub fn is_within(&self, id: EntryId, ancestor: EntryId) -> Result<bool, StoreError> {
        let mut cur = id;
        for _ in 0..1024 {
            if cur == ancestor {
                return Ok(true);
            }
            let up = match dn_cache::parent(self.dn_snapshot, cur) {
                Some(p) => Some(p).filter(|&p| p != 0),
                None => self.parent_of(cur)?,
            };
            match up {
                Some(p) => cur = p,
                None => return Ok(false),
            }
        }
        Err(StoreError::Corrupt(format!(
            "parent chain of entry {id} does not end"
        )))
    }

    /// Number of entries in the store.
    pub fn entry_count(&self) -> Result<u64, StoreError> {
        Ok(self.inner.id2entry.len(self.txn)?)
    }

    /// IDs of the suffix entries (parent 0).
    pub fn roots(&self) -> Result<Vec<EntryId>, StoreError> {
        self.children(0)
    }

    pub fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .inner
            .meta
            .get(self.txn, key.as_bytes())?
            .map(|v| v.to_vec()))
    }

    /// The first `max` meta records whose keys start with `prefix`, in key
    /// order.
    pub fn meta_scan(
        &self,
        prefix: &str,
        max: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for item in self.inner.meta.prefix_iter(self.txn, prefix.as_bytes())? {
            if out.len() == max {
                break;
            }
            let (k, v) = item?;
            out.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
        }
        Ok(out)
    }

    /// Candidate IDs for a filter from the indexes (see [`plan`]).
    pub fn candidates(&self, filter: &pando_proto::Filter) -> Result<Candidates, StoreError> {
        plan::candidates(self, filter)
    }

    /// The candidates of `filter` are exactly the entries it matches (see
    /// `plan::exact`): a caller may skip testing them.
    pub fn candidates_are_exact(&self, filter: &pando_proto::Filter) -> bool {
        plan::exact(self, filter)
    }

    fn posting(&self, db: &Db, key: &[u8]) -> Result<RoaringTreemap, StoreError> {
        match db.get(self.txn, key)? {
            Some(v) => index::decode_posting(v).map_err(StoreError::Corrupt),
            None => Ok(RoaringTreemap::new()),
        }
    }

    /// The index (attribute, kind) if the planner may use it.
    fn index_db(&self, attr_lower: &str, kind: IndexKind) -> Option<&'t Db> {
        self.catalog.ready_db(attr_lower, kind)
    }

    /// The keys that `attrs` produce in the index (attr, kind).
    fn keys_of(&self, attrs: &[Attribute], attr_lower: &str, kind: IndexKind) -> BTreeSet<Vec<u8>> {
        attr_keys(&self.catalog.schema, attrs, attr_lower, kind)
    }

    /// Every (index name, key) pair `attrs` produce: used by `verify`.
    pub fn all_index_keys(&self, attrs: &[Attribute]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for (attr, idx) in self.catalog.ready() {
            for k in self.keys_of(attrs, attr, idx.kind) {
                out.push((index::db_name(attr, idx.kind), k));
            }
        }
        out
    }

    /// Walk every store invariant; returns a list of problems (empty = consistent).
    pub fn verify(&self) -> Result<Vec<String>, StoreError> {
        let mut problems = Vec::new();
        let mut ids = RoaringTreemap::new();
        let mut expected: HashMap<(String, Vec<u8>), RoaringTreemap> = HashMap::new();
        for item in self.inner.id2entry.iter(self.txn)? {
            let (k, v) = item?;
            let id = id_from(k)?;
            ids.insert(id);
            let attrs = match self.decode_attrs(id, v) {
                Ok(a) => a,
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            match self.placement(id)? {
                None => problems.push(format!("entry {id} has no id2parent record")),
                Some(p) => {
                    match self
                        .inner
                        .dn2id
                        .get(self.txn, &dn2id_key(p.parent, &p.norm_rdn))?
                    {
                        Some(v) if id_from(v)? == id => {}
                        _ => problems.push(format!("entry {id} ({}) is missing from dn2id", p.rdn)),
                    }
                    if p.parent != 0
                        && self
                            .inner
                            .id2entry
                            .get(self.txn, &id_bytes(p.parent))?
                            .is_none()
                    {
                        problems.push(format!("entry {id} has a dangling parent {}", p.parent));
                    }
                }
            }
            for key in self.all_index_keys(&attrs) {
                expected.entry(key).or_default().insert(id);
            }
        }
        for item in self.inner.dn2id.iter(self.txn)? {
            let (_, v) = item?;
            let id = id_from(v)?;
            if !ids.contains(id) {
                problems.push(format!(
                    "dn2id names entry {id}, which has no id2entry record"
                ));
            }
        }
        for item in self.inner.id2parent.iter(self.txn)? {
            let (k, _) = item?;
            let id = id_from(k)?;
            if !ids.contains(id) {
                problems.push(format!("id2parent has a record for missing entry {id}"));
            }
        }
        for (attr, idx) in self.catalog.ready() {
            let name = index::db_name(attr, idx.kind);
            let mut seen = HashSet::new();
            for item in idx.db.iter(self.txn)? {
                let (k, v) = item?;
                let got = index::decode_posting(v)
                    .map_err(|e| StoreError::Corrupt(format!("{name}: {e}")))?;
                let want = expected
                    .get(&(name.clone(), k.to_vec()))
                    .cloned()
                    .unwrap_or_default();
                if got != want {
                    problems.push(format!(
                        "{name}: key {:?} lists {} IDs, entries produce {} (extra {:?}, missing {:?})",
                        String::from_utf8_lossy(k),
                        got.len(),
                        want.len(),
                        (&got - &want).iter().take(5).collect::<Vec<_>>(),
                        (&want - &got).iter().take(5).collect::<Vec<_>>()
                    ));
                }
                seen.insert(k.to_vec());
            }
            for ((n, k), set) in &expected {
                if n == &name && !seen.contains(k) {
                    problems.push(format!(
                        "{name}: key {:?} is missing (entries {:?})",
                        String::from_utf8_lossy(k),
                        set.iter().take(5).collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(problems)
    }
}

impl<'e> WriteTxn<'e> {
    /// Run `f` on the writer thread once this job's changes are committed
    /// (durably, as the durability mode says), before any job of the batch
    /// is answered. Jobs' callbacks run in the order the jobs committed, so
    /// whatever `f` publishes is in commit order. Dropped unrun when the
    /// job or its batch is rolled back.
    pub fn after_commit(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after_commit.push(Box::new(move |_: &Inner| f()));
    }

    /// [`WriteTxn::after_commit`] for the store's own steps.
    pub(crate) fn after_commit_inner(&mut self, f: impl FnOnce(&Inner) + Send + 'static) {
        self.after_commit.push(Box::new(f));
    }

    pub fn view(&self) -> View<'_> {
        // A writer sees its own uncommitted changes: no cached DNs.
        View {
            txn: &self.txn,
            inner: self.inner,
            catalog: &self.catalog,
            dn_snapshot: None,
        }
    }

    pub fn meta_delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.inner.meta.delete(&mut self.txn, key.as_bytes())?;
        Ok(())
    }

    pub fn meta_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Ok(self.inner.meta.put(&mut self.txn, key.as_bytes(), value)?)
    }

    fn allocate_id(&mut self) -> Result<EntryId, StoreError> {
        let next = match self.inner.meta.get(&self.txn, META_NEXT_ID)? {
            Some(v) => id_from(v)?,
            None => return Err(StoreError::Corrupt("meta has no next_id".into())),
        };
        self.inner
            .meta
            .put(&mut self.txn, META_NEXT_ID, &id_bytes(next + 1))?;
        Ok(next)
    }

    /// Store a new entry under `place`. The caller has checked that the parent
    /// exists and that no sibling has the same normalised RDN.
    pub fn add(&mut self, place: &Placement, attrs: &[Attribute]) -> Result<EntryId, StoreError> {
        let id = self.insert_records(place, attrs)?;
        self.update_indexes(id, &[], attrs)?;
        Ok(id)
    }

    /// id2entry, id2parent and dn2id records of a new entry (no indexes).
    fn insert_records(
        &mut self,
        place: &Placement,
        attrs: &[Attribute],
    ) -> Result<EntryId, StoreError> {
        let key = dn2id_key(place.parent, &place.norm_rdn);
        if self.inner.dn2id.get(&self.txn, &key)?.is_some() {
            return Err(StoreError::Corrupt(format!(
                "dn2id already holds '{}'",
                place.rdn
            )));
        }
        let id = self.allocate_id()?;
        let mut buf = Vec::new();
        self.inner.codec.encode(attrs, &mut buf);
        self.inner
            .id2entry
            .put(&mut self.txn, &id_bytes(id), &buf)?;
        self.inner
            .id2parent
            .put(&mut self.txn, &id_bytes(id), &encode_placement(place))?;
        self.inner.dn2id.put(&mut self.txn, &key, &id_bytes(id))?;
        Ok(id)
    }

    /// Replace the attributes of entry `id` (`old` must be what is stored).
    pub fn replace(
        &mut self,
        id: EntryId,
        old: &[Attribute],
        new: &[Attribute],
    ) -> Result<(), StoreError> {
        let mut buf = Vec::new();
        self.inner.codec.encode(new, &mut buf);
        self.inner
            .id2entry
            .put(&mut self.txn, &id_bytes(id), &buf)?;
        self.update_indexes(id, old, new)
    }

    /// Remove leaf entry `id` (`old` must be what is stored).
    pub fn delete(&mut self, id: EntryId, old: &[Attribute]) -> Result<(), StoreError> {
        self.inner.dn_generation.changing();
        if self.view().has_children(id)? {
            return Err(StoreError::Corrupt(format!(
                "delete of entry {id}, which has children"
            )));
        }
        let place = self
            .view()
            .placement(id)?
            .ok_or_else(|| StoreError::Corrupt(format!("entry {id} has no id2parent record")))?;
        self.inner
            .dn2id
            .delete(&mut self.txn, &dn2id_key(place.parent, &place.norm_rdn))?;
        self.inner.id2parent.delete(&mut self.txn, &id_bytes(id))?;
        self.inner.id2entry.delete(&mut self.txn, &id_bytes(id))?;
        self.update_indexes(id, old, &[])
    }

    /// Give entry `id` a new parent and/or RDN. Descendants are untouched:
    /// their DNs derive from this record.
    ///
    /// The caller has checked that the new DN is free and that the new
    /// parent is not the entry or below it; as `add` does for its DN, the
    /// store refuses all the same rather than let a caller's bug corrupt
    /// the tree: a taken dn2id key would be overwritten (its entry lost
    /// from dn2id), and a move below itself would cut the subtree off from
    /// every suffix in a parent cycle.
    pub fn rename(&mut self, id: EntryId, to: &Placement) -> Result<(), StoreError> {
        self.inner.dn_generation.changing();
        let from = self
            .view()
            .placement(id)?
            .ok_or_else(|| StoreError::Corrupt(format!("entry {id} has no id2parent record")))?;
        let key = dn2id_key(to.parent, &to.norm_rdn);
        // The entry's own key is free for it: a change of case only.
        if let Some(v) = self.inner.dn2id.get(&self.txn, &key)? {
            if id_from(v)? != id {
                return Err(StoreError::Corrupt(format!(
                    "dn2id already holds '{}'",
                    to.rdn
                )));
            }
        }
        if to.parent != 0 && self.view().is_within(to.parent, id)? {
            return Err(StoreError::Corrupt(format!(
                "move of entry {id} below itself"
            )));
        }
        self.inner
            .dn2id
            .delete(&mut self.txn, &dn2id_key(from.parent, &from.norm_rdn))?;
        self.inner.dn2id.put(&mut self.txn, &key, &id_bytes(id))?;
        self.inner
            .id2parent
            .put(&mut self.txn, &id_bytes(id), &encode_placement(to))?;
        Ok(())
    }

    fn update_indexes(
        &mut self,
        id: EntryId,
        old: &[Attribute],
        new: &[Attribute],
    ) -> Result<(), StoreError> {
        // Building indexes too (see `index_build`).
        let catalog = self.catalog.clone();
        for (attr, dbs) in &catalog.indexes {
            // Most modifications leave most indexed attributes alone: when
            // the values are the same, so are the keys.
            if !old.is_empty() && !new.is_empty() && values_of(old, attr) == values_of(new, attr) {
                continue;
            }
            for idx in dbs {
                let (before, after) = {
                    let view = self.view();
                    (
                        view.keys_of(old, attr, idx.kind),
                        view.keys_of(new, attr, idx.kind),
                    )
                };
                for k in before.difference(&after) {
                    self.change_posting(&idx.db, k, id, false)?;
                }
                for k in after.difference(&before) {
                    self.change_posting(&idx.db, k, id, true)?;
                }
            }
        }
        Ok(())
    }

    fn change_posting(
        &mut self,
        db: &Db,
        key: &[u8],
        id: EntryId,
        add: bool,
    ) -> Result<(), StoreError> {
        let mut set = self.view().posting(db, key)?;
        let changed = if add { set.insert(id) } else { set.remove(id) };
        if !changed {
            return Ok(());
        }
        if set.is_empty() {
            db.delete(&mut self.txn, key)?;
        } else {
            let mut buf = Vec::new();
            index::encode_posting(&set, &mut buf);
            db.put(&mut self.txn, key, &buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
