//! The open store (`Store`): opening and checking the data file, read
//! and write transactions handed out, statistics. Reading entries is
//! `view.rs`; changing them, `write_txn.rs`.

use super::*;

pub(crate) fn missing_database(path: &Path, name: &str) -> StoreError {
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

/// The store's format: written when the store is new, checked when it
/// is not (one this Pando can read), raised to this Pando's when older,
/// with `dn2id`'s keys rewritten in this version's layout.
/// True when the indexes are in an older layout and must be rebuilt.
fn check_format(
    meta: Db,
    dn2id: Db,
    wtxn: &mut RwTxn<'_>,
    existing: bool,
    path: &Path,
) -> Result<bool, StoreError> {
    let mut rebuild = false;
    match meta.get(wtxn, META_FORMAT)? {
        None if existing => {
            return Err(StoreError::Damaged(format!(
                "{}: the 'meta' database has no format record",
                path.join(DATA_FILE).display()
            )))
        }
        None => {
            meta.put(wtxn, META_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
            meta.put(wtxn, META_NEXT_ID, &1u64.to_be_bytes())?;
        }
        Some(v) => {
            let found = format_of(v)
                .ok_or_else(|| StoreError::Format("unreadable format version in meta".into()))?;
            if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&found) {
                return Err(StoreError::Format(format!(
                    "store {} has format {found}, this Pando reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}",
                    path.display()
                )));
            }
            if found < INDEX_FORMAT {
                tracing::info!(
                    store = %path.display(),
                    from = found,
                    to = FORMAT_VERSION,
                    "store format upgrade: the indexes are rebuilt in this version's layout, once"
                );
                rebuild = true;
            }
            if found < keys::SHORT_DN2ID_FORMAT {
                let started = std::time::Instant::now();
                let keys = Dn2idLayout::shorten(dn2id, wtxn)?;
                tracing::info!(
                    store = %path.display(),
                    keys,
                    secs = started.elapsed().as_secs_f64(),
                    "store format upgrade: dn2id keys rewritten with short parent IDs"
                );
            }
            if found < FORMAT_VERSION {
                // From now on records of the new format may be written.
                meta.put(wtxn, META_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
            }
        }
    }
    Ok(rebuild)
}

/// The configured indexes' databases. `meta:indexes` lists the index
/// databases kept up to date. A configured index not on the list (new,
/// or dropped from the configuration earlier and so stale) is rebuilt, and
/// the list updated, in this same transaction: an index that is listed is
/// always complete. Indexes no longer configured are emptied. `rebuild`:
/// every configured index is rebuilt (they are in an older layout).
#[allow(clippy::too_many_arguments)]
fn open_indexes(
    env: &Env,
    wtxn: &mut RwTxn<'_>,
    meta: Db,
    id2entry: Db,
    schema: &Arc<Schema>,
    codec: &crate::entry_codec::Codec,
    opts: &StoreOptions,
    path: &Path,
    rebuild: bool,
) -> Result<crate::catalog::IndexMap, StoreError> {
    let listed: HashSet<String> = match meta.get(wtxn, META_INDEXES)? {
        Some(v) => parse_listed(v).into_iter().collect(),
        // Stores from before the list: their existing indexes were built whole.
        None => {
            let mut existing = HashSet::new();
            for spec in &opts.indexes {
                for &kind in &spec.kinds {
                    let name = index::db_name(&spec.attr.to_ascii_lowercase(), kind);
                    if env
                        .open_database::<Bytes, Bytes>(wtxn, Some(&name))?
                        .is_some()
                    {
                        existing.insert(name);
                    }
                }
            }
            existing
        }
    };
    let mut indexes: crate::catalog::IndexMap = Default::default();
    let mut to_build = Vec::new();
    let mut maintained: Vec<String> = Vec::new();
    for spec in &opts.indexes {
        let attr = spec.attr.to_ascii_lowercase();
        for &kind in &spec.kinds {
            let name = index::db_name(&attr, kind);
            let db: Db = env.create_database(wtxn, Some(&name))?;
            if rebuild || !listed.contains(&name) {
                db.clear(wtxn)?;
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
    let dropped: Vec<String> = match meta.get(wtxn, META_INDEXES_DROPPED)? {
        Some(v) => parse_listed(v),
        None => Vec::new(),
    };
    meta.delete(wtxn, META_INDEXES_DROPPED)?;
    for name in listed
        .iter()
        .chain(&dropped)
        .filter(|n| !maintained.contains(n))
    {
        if let Some(db) = env.open_database::<Bytes, Bytes>(wtxn, Some(name))? {
            db.clear(wtxn)?;
        }
    }
    if !to_build.is_empty() {
        bulk::fill_indexes(
            schema,
            codec,
            id2entry,
            wtxn,
            &to_build,
            bulk::Runs::new(REBUILD_MEMORY, &path.join("index-runs")),
            &mut |_| {},
        )?;
    }
    meta.put(wtxn, META_INDEXES, maintained.join("\n").as_bytes())?;
    Ok(indexes)
}

/// The newest of the store's context CSNs (one per server ID), if any.
fn newest_context_csn(meta: Db, wtxn: &RwTxn<'_>) -> Result<Option<String>, StoreError> {
    let mut newest: Option<Vec<u8>> = None;
    for item in meta.prefix_iter(wtxn, b"context_csn:")? {
        let (_, v) = item?;
        if newest.as_deref().is_none_or(|n| v > n) {
            newest = Some(v.to_vec());
        }
    }
    Ok(newest.map(|v| String::from_utf8_lossy(&v).into_owned()))
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
            .max_dbs(16 + 10 * opts.indexes.len() as u32 + RUNTIME_INDEX_ROOM)
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
        let rebuild = check_format(meta, dn2id, &mut wtxn, existing, path)?;
        // Every store this version writes is in its layout.
        let dn2id_layout = Dn2idLayout::of_format(FORMAT_VERSION);
        let codec = load_codec(&wtxn, meta, opts.compression)?;
        let indexes = open_indexes(
            &env, &mut wtxn, meta, id2entry, &schema, &codec, opts, path, rebuild,
        )?;
        context_csn::migrate(meta, &mut wtxn)?;
        let newest = newest_context_csn(meta, &wtxn)?;
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
            dn2id_layout,
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
            .max_dbs(16 + 10 * opts.indexes.len() as u32 + RUNTIME_INDEX_ROOM)
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
        let found = meta.get(&rtxn, META_FORMAT)?.and_then(format_of);
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
        let mut indexes: crate::catalog::IndexMap = Default::default();
        for spec in &opts.indexes {
            let attr = spec.attr.to_ascii_lowercase();
            for &kind in &spec.kinds {
                let name = index::db_name(&attr, kind);
                // Unlisted: being built by a server that has it open.
                if let Some(db) = env.open_database::<Bytes, Bytes>(&rtxn, Some(&name))? {
                    indexes.entry(attr.clone()).or_default().push(IndexDb {
                        kind,
                        db,
                        ready: found >= Some(INDEX_FORMAT)
                            && listed.as_ref().is_none_or(|l| l.contains(&name)),
                    });
                }
            }
        }
        // The `found` checked above: Some.
        let dn2id_layout = Dn2idLayout::of_format(found.unwrap_or(FORMAT_VERSION));
        let codec = load_codec(&rtxn, meta, opts.compression)?;
        let changelog = env.open_database::<Bytes, Bytes>(&rtxn, Some(changelog::NAME))?;
        let changenumbers = env.open_database::<Bytes, Bytes>(&rtxn, Some(change_numbers::NAME))?;
        let accesslog = env.open_database::<Bytes, Bytes>(&rtxn, Some(accesslog::NAME))?;
        rtxn.commit()?;
        let dbs = Dbs {
            meta,
            id2entry,
            dn2id,
            dn2id_layout,
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
        let inner = &self.inner;
        let before = inner.dn_generation.before_open();
        let content = inner.content_generation.before_open();
        let catalog = inner.catalog.load_full();
        // An idle snapshot of the current generation holds what a new one
        // would (`txn_pool`); its DN snapshot stands while DNs did not move.
        let (txn, dn_snapshot, content) = match inner.txns.take(content) {
            Some(p) => (
                p.txn,
                p.dn.filter(|d| d.generation() == before),
                Some(p.content),
            ),
            None => {
                let txn = inner.env.clone().static_read_txn()?;
                (
                    txn,
                    inner.dn_generation.after_open(before),
                    inner.content_generation.after_open(content),
                )
            }
        };
        let catalog = catalog::for_snapshot(catalog, &inner.catalog.load());
        Ok(ReadTxn {
            txn: Some(txn),
            inner,
            catalog,
            slot: inner.readers.enter(),
            dn_snapshot,
            content,
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
            // Idle read transactions hold the environment open.
            inner.txns.clear();
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
                add(index::db_name(attr, idx.kind), &idx.db)?;
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
    /// `id2entry`, `dn2id`, `id2parent`, `meta`, `ix:<attr>:<kind>`.
    pub name: String,
    pub bytes: u64,
    pub items: u64,
}

/// The entry codec for `compression`, with every dictionary kept in meta.
pub(crate) fn load_codec(
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
        let split = meta
            .get(txn, entry_codec::dict_split_meta_key(id).as_bytes())?
            .is_some();
        codec.add_dict(id, v.to_vec(), Some(id) == current, split)?;
    }
    Ok(codec)
}
