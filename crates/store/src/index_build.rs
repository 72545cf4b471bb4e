//! Adding and dropping indexes while the store serves.
//!
//! [`WriteTxn::change_catalog`] creates an added index's database, empty,
//! in the writer's transaction (with whatever else the change writes, such
//! as the configuration naming it). From that commit on the index is in
//! the catalog as *building*: every write keeps it up to date like any
//! other, and the planner does not use it. A builder thread fills in the
//! entries written before, a chunk at a time. Each chunk is a job on the
//! writer, committed with clients' writes between theirs: it reads the
//! next range of entry IDs in the writer's transaction and adds their
//! keys. Adding a key that is there, or removing one that is not, changes
//! nothing, so an entry written during the build ends right whichever
//! comes first. The chunk that reaches the last entry lists the index in
//! `meta:indexes` (complete) in its transaction; once that commits, the
//! catalog marks it ready and searches use it.
//!
//! Progress is kept in memory only. After a crash or a stop the index is
//! not listed, and the next open builds it whole (the external sort of
//! [`crate::bulk`] is faster than chunks, and nothing is served yet).
//!
//! A dropped index leaves the catalog (and `meta:indexes`) when its change
//! commits; its database is emptied by a later job, so that no reader that
//! still uses it sees it emptied (see [`crate::catalog::for_snapshot`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use heed::types::Bytes;
use pando_model::Schema;
use roaring::RoaringTreemap;

use crate::catalog::{Catalog, IndexDb};
use crate::index::{self, IndexKind};
use crate::writer::WriterHandle;
use crate::{
    attr_keys, id_bytes, id_from, EntryId, Inner, StoreError, WriteTxn, META_INDEXES,
    META_INDEXES_DROPPED,
};

/// Most entries one chunk reads.
const CHUNK_ENTRIES: usize = 2000;
/// A chunk stops reading after this long, so clients' writes queued
/// behind it wait little.
const CHUNK_TIME: Duration = Duration::from_millis(20);
/// Progress is logged at most this often per index.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A change to the schema and the indexes, made by the transaction that
/// stores the configuration asking for it.
#[derive(Default)]
pub struct CatalogChange {
    /// The new schema (None: unchanged).
    pub schema: Option<Arc<Schema>>,
    /// Indexes to start keeping and build, as (attribute, kind).
    pub add: Vec<(String, IndexKind)>,
    /// Indexes to stop keeping and empty.
    pub drop: Vec<(String, IndexKind)>,
}

impl CatalogChange {
    pub fn is_empty(&self) -> bool {
        self.schema.is_none() && self.add.is_empty() && self.drop.is_empty()
    }
}

/// An index and its state, for monitoring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexState {
    pub attr: String,
    pub kind: IndexKind,
    /// None when the index is ready.
    pub building: Option<BuildProgress>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildProgress {
    /// Entries read into the index so far.
    pub entries_done: u64,
    /// Entries the store held when the build began.
    pub entries_total: u64,
    pub elapsed: Duration,
}

/// The builds under way and the thread that runs them.
#[derive(Default)]
pub(crate) struct Builds {
    state: Mutex<State>,
    /// The store and its writer, set once the writer runs: what the
    /// builder thread and the emptying of dropped indexes go through.
    writer: OnceLock<(Weak<Inner>, WriterHandle)>,
}

#[derive(Default)]
struct State {
    driver_running: bool,
    driver: Option<std::thread::JoinHandle<()>>,
    /// By index database name.
    builds: BTreeMap<String, Build>,
}

struct Build {
    /// The next entry ID to read into the index.
    next: EntryId,
    done: u64,
    total: u64,
    started: Instant,
    logged: Instant,
}

/// What a chunk found to do.
enum Step {
    /// It read entries; there may be more.
    More,
    /// No index is being built.
    Idle,
}

impl Builds {
    pub(crate) fn connect(&self, inner: Weak<Inner>, writer: WriterHandle) {
        let _ = self.writer.set((inner, writer));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain numbers.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Progress of the index database `name`, if it is being built.
    pub(crate) fn progress(&self, name: &str) -> Option<BuildProgress> {
        self.lock().builds.get(name).map(|b| BuildProgress {
            entries_done: b.done,
            entries_total: b.total,
            elapsed: b.started.elapsed(),
        })
    }

    /// Begin building the indexes `names` (committed, in the catalog),
    /// over a store of `total` entries.
    fn start(&self, names: &[String], total: u64) {
        let mut st = self.lock();
        let now = Instant::now();
        for name in names {
            tracing::info!(index = %name, entries = total, "index build started");
            st.builds.insert(
                name.clone(),
                Build {
                    next: 0,
                    done: 0,
                    total,
                    started: now,
                    logged: now,
                },
            );
        }
        if st.driver_running || st.builds.is_empty() {
            return;
        }
        let Some((inner, writer)) = self.writer.get().cloned() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("pando-indexer".into())
            .spawn(move || drive(inner, writer));
        match spawned {
            Ok(handle) => {
                st.driver_running = true;
                // A finished earlier driver's handle: nothing to wait for.
                st.driver = Some(handle);
            }
            Err(e) => tracing::error!(error = %e, "cannot start the index builder thread"),
        }
    }

    fn forget(&self, name: &str) {
        self.lock().builds.remove(name);
    }

    /// Where each of `names` is; an unknown one starts from the beginning.
    fn cursors(&self, names: &[String]) -> Vec<EntryId> {
        let st = self.lock();
        names
            .iter()
            .map(|n| st.builds.get(n).map_or(0, |b| b.next))
            .collect()
    }

    /// A chunk committed: `names[i]` read `read[i]` more entries and goes
    /// on at `next` (or is complete, when `complete`).
    fn advanced(&self, names: &[String], read: &[u64], next: EntryId, complete: bool) {
        let mut st = self.lock();
        for (name, n) in names.iter().zip(read) {
            let Some(b) = st.builds.get_mut(name) else {
                continue;
            };
            b.done += n;
            b.next = b.next.max(next);
            if complete {
                tracing::info!(
                    index = %name,
                    entries = b.done,
                    seconds = format!("{:.1}", b.started.elapsed().as_secs_f64()),
                    "index ready"
                );
                st.builds.remove(name);
            } else if b.logged.elapsed() >= LOG_EVERY {
                b.logged = Instant::now();
                tracing::info!(
                    index = %name,
                    entries = b.done,
                    of = b.total,
                    "index build in progress"
                );
            }
        }
    }

    /// The builder found nothing to build: stop it unless a build was
    /// registered meanwhile. Says whether it stopped.
    fn stop_if_idle(&self) -> bool {
        let mut st = self.lock();
        if st.builds.is_empty() {
            st.driver_running = false;
            true
        } else {
            false
        }
    }

    fn driver_stopped(&self) {
        self.lock().driver_running = false;
    }

    /// Wait for the builder thread to end (the writer is shut down, so it
    /// ends at its next submission).
    pub(crate) fn join(&self) {
        let handle = self.lock().driver.take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Queue the emptying of the dropped index database `name`.
    fn empty_later(&self, attr: String, kind: IndexKind) {
        let Some((_, writer)) = self.writer.get() else {
            return;
        };
        let queued = writer.submit(move |w: &mut WriteTxn<'_>| -> Result<(), StoreError> {
            let name = index::db_name(&attr, kind);
            let mut dropped = w.name_list(META_INDEXES_DROPPED)?;
            if !dropped.remove(&name) {
                // Added back since: its own change emptied it.
                return Ok(());
            }
            w.put_name_list(META_INDEXES_DROPPED, &dropped)?;
            if let Some(db) = w
                .inner
                .env
                .open_database::<Bytes, Bytes>(&w.txn, Some(&name))?
            {
                db.clear(&mut w.txn)?;
            }
            Ok(())
        });
        if queued.is_err() {
            // Shutting down: the next open empties it (it is not listed).
            tracing::debug!("dropped index left for the next open to empty");
        }
    }
}

/// The builder thread: chunks until no index is being built.
fn drive(inner: Weak<Inner>, writer: WriterHandle) {
    let mut failures = 0u32;
    loop {
        let Ok(reply) = writer.submit(chunk) else {
            break;
        };
        let step = reply.blocking_recv().unwrap_or(Err(StoreError::Closed));
        let Some(store) = inner.upgrade() else {
            return;
        };
        match step {
            Ok(Step::More) => failures = 0,
            Ok(Step::Idle) => {
                if store.builds.stop_if_idle() {
                    return;
                }
                // Registered, and not yet in the catalog of that batch.
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(StoreError::Closed) => break,
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(60) {
                    tracing::error!(error = %e, failures, "index build chunk failed; retrying every second");
                }
                drop(store);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    if let Some(store) = inner.upgrade() {
        store.builds.driver_stopped();
    }
}

/// Read the next range of entries into every index being built.
fn chunk(w: &mut WriteTxn<'_>) -> Result<Step, StoreError> {
    let catalog = w.catalog.clone();
    let building = catalog.building();
    if building.is_empty() {
        return Ok(Step::Idle);
    }
    let inner = w.inner;
    let names: Vec<String> = building
        .iter()
        .map(|(a, k, _)| index::db_name(a, *k))
        .collect();
    let cursors = inner.builds.cursors(&names);
    let from = cursors.iter().copied().min().unwrap_or(0);
    let began = Instant::now();
    let mut postings: BTreeMap<(usize, Vec<u8>), RoaringTreemap> = BTreeMap::new();
    let mut read = vec![0u64; building.len()];
    let mut next = from;
    let mut complete = true;
    {
        let view = w.view();
        let start = id_bytes(from);
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(&start[..]), Bound::Unbounded);
        for (n, item) in inner.id2entry.range(&w.txn, &range)?.enumerate() {
            let (k, v) = item?;
            let id = id_from(k)?;
            if n >= CHUNK_ENTRIES || began.elapsed() >= CHUNK_TIME {
                complete = false;
                next = id;
                break;
            }
            let attrs = view.decode_attrs(id, v)?;
            for (i, (attr, kind, _)) in building.iter().enumerate() {
                if cursors[i] > id {
                    continue;
                }
                read[i] += 1;
                for key in attr_keys(&catalog.schema, &attrs, attr, *kind) {
                    postings.entry((i, key)).or_default().insert(id);
                }
            }
            next = id + 1;
        }
    }
    let mut buf = Vec::new();
    for ((i, key), ids) in postings {
        let db = building[i].2;
        crate::postings::merge(&mut w.txn, &db, &key, &ids, &mut buf)?;
    }
    if complete {
        let mut listed = w.name_list(META_INDEXES)?;
        listed.extend(names.iter().cloned());
        w.put_name_list(META_INDEXES, &listed)?;
    }
    w.after_commit_inner(move |inner| {
        if complete {
            inner.catalog.rcu(|c| c.with_ready(&names));
        }
        inner.builds.advanced(&names, &read, next, complete);
    });
    Ok(Step::More)
}

impl WriteTxn<'_> {
    /// Change the schema and the indexes once this job commits (see the
    /// module comment). Added indexes start empty and are built in the
    /// background; dropped ones stop being kept at once and are emptied
    /// after. Adding an index kept already, or dropping one that is not,
    /// changes nothing.
    pub fn change_catalog(&mut self, change: CatalogChange) -> Result<(), StoreError> {
        if change.is_empty() {
            return Ok(());
        }
        let mut listed = self.name_list(META_INDEXES)?;
        let mut to_empty = self.name_list(META_INDEXES_DROPPED)?;
        let mut added: Vec<(String, IndexDb)> = Vec::new();
        for (attr, kind) in &change.add {
            let attr = attr.to_ascii_lowercase();
            if self.catalog.index(&attr, *kind).is_some() {
                continue;
            }
            let name = index::db_name(&attr, *kind);
            let db = self
                .inner
                .env
                .create_database::<Bytes, Bytes>(&mut self.txn, Some(&name))
                .map_err(|e| match e {
                    heed::Error::Mdb(heed::MdbError::DbsFull) => StoreError::Lmdb(format!(
                        "cannot add index {name}: the store was opened with room for {} more index databases; restart the server to add more",
                        crate::RUNTIME_INDEX_ROOM
                    )),
                    other => StoreError::from(other),
                })?;
            // Left over from an earlier build or a drop: start afresh.
            db.clear(&mut self.txn)?;
            listed.remove(&name);
            to_empty.remove(&name);
            added.push((
                attr,
                IndexDb {
                    kind: *kind,
                    db,
                    ready: false,
                },
            ));
        }
        let mut dropped: Vec<(String, IndexKind)> = Vec::new();
        for (attr, kind) in &change.drop {
            let attr = attr.to_ascii_lowercase();
            if self.catalog.index(&attr, *kind).is_some() {
                let name = index::db_name(&attr, *kind);
                listed.remove(&name);
                to_empty.insert(name);
                dropped.push((attr, *kind));
            }
        }
        self.put_name_list(META_INDEXES, &listed)?;
        self.put_name_list(META_INDEXES_DROPPED, &to_empty)?;
        let total = self.inner.id2entry.len(&self.txn)?;
        let schema = change.schema;
        self.after_commit_inner(move |inner| {
            let names: Vec<String> = added
                .iter()
                .map(|(a, d)| index::db_name(a, d.kind))
                .collect();
            inner
                .catalog
                .rcu(|c| changed(c, schema.clone(), &added, &dropped));
            for (attr, kind) in dropped {
                tracing::info!(index = %index::db_name(&attr, kind), "index dropped");
                inner.builds.forget(&index::db_name(&attr, kind));
                inner.builds.empty_later(attr, kind);
            }
            inner.builds.start(&names, total);
        });
        Ok(())
    }

    /// A list of index database names kept in `meta` under `key`.
    fn name_list(&self, key: &[u8]) -> Result<BTreeSet<String>, StoreError> {
        Ok(self
            .inner
            .meta
            .get(&self.txn, key)?
            .map(crate::parse_listed)
            .unwrap_or_default()
            .into_iter()
            .collect())
    }

    fn put_name_list(&mut self, key: &[u8], names: &BTreeSet<String>) -> Result<(), StoreError> {
        let text = names.iter().cloned().collect::<Vec<_>>().join("\n");
        Ok(self.inner.meta.put(&mut self.txn, key, text.as_bytes())?)
    }
}

/// `c` with the schema replaced (when given), `added` in and `dropped` out.
fn changed(
    c: &Catalog,
    schema: Option<Arc<Schema>>,
    added: &[(String, IndexDb)],
    dropped: &[(String, IndexKind)],
) -> Catalog {
    let mut indexes = c.indexes.clone();
    for (attr, kind) in dropped {
        if let Some(dbs) = indexes.get_mut(attr) {
            dbs.retain(|d| d.kind != *kind);
            if dbs.is_empty() {
                indexes.remove(attr);
            }
        }
    }
    for (attr, db) in added {
        indexes.entry(attr.clone()).or_default().push(*db);
    }
    match schema {
        Some(s) => Catalog::new(s, indexes),
        None => c.with_indexes(indexes),
    }
}
