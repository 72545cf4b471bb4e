//! The single writer thread and its group commit.
//!
//! Write jobs queue on a channel. The writer takes the first waiting job and
//! then everything else already queued (up to `max_batch`), runs each in a
//! nested transaction of one parent transaction (a failing job rolls back
//! only itself), commits the parent once — one fsync for the whole batch —
//! and only then answers each job. A job's success is therefore never
//! reported before it is durable.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::{Inner, StoreError, WriteTxn};

/// Sent back to a job after its batch committed (or failed to).
type Reply = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// See [`WriteTxn::after_commit`].
pub(crate) type AfterCommit = Box<dyn FnOnce(&Inner) + Send>;
/// A queued write.
trait WriteJob: Send {
    /// Run inside the job's nested transaction; say whether to keep it, and
    /// how to answer once the batch's fate is known.
    fn run(self: Box<Self>, w: &mut WriteTxn<'_>) -> (bool, Reply);
    /// Answer without running (the transaction could not be started).
    fn fail(self: Box<Self>, e: StoreError);
}
type Job = Box<dyn WriteJob>;

struct Closure<F, R, E> {
    f: F,
    reply: oneshot::Sender<Result<R, E>>,
}

impl<R, E, F> WriteJob for Closure<F, R, E>
where
    R: Send + 'static,
    E: From<StoreError> + Send + 'static,
    F: FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
{
    fn run(self: Box<Self>, w: &mut WriteTxn<'_>) -> (bool, Reply) {
        let Closure { f, reply } = *self;
        let res = f(w);
        let keep = res.is_ok();
        let answer: Reply = Box::new(move |commit: Result<(), StoreError>| {
            let out = match commit {
                Ok(()) => res,
                Err(e) if keep => Err(E::from(e)),
                // The job failed on its own; its error says more than the batch's.
                Err(_) => res,
            };
            let _ = reply.send(out);
        });
        (keep, answer)
    }

    fn fail(self: Box<Self>, e: StoreError) {
        let _ = self.reply.send(Err(E::from(e)));
    }
}

/// Error when a write could not even be queued.
#[derive(Debug)]
pub struct WriteJobError;

#[derive(Clone)]
pub(crate) struct WriterHandle {
    tx: Arc<Mutex<Option<mpsc::Sender<Job>>>>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl WriterHandle {
    pub(crate) fn start(inner: Arc<Inner>) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("pando-writer".into())
            .spawn(move || run(inner, rx))?;
        Ok(WriterHandle {
            tx: Arc::new(Mutex::new(Some(tx))),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// A handle for a read-only store: every write is refused.
    pub(crate) fn closed() -> Self {
        WriterHandle {
            tx: Arc::new(Mutex::new(None)),
            thread: Arc::new(Mutex::new(None)),
        }
    }

    pub(crate) fn submit<R, E, F>(&self, f: F) -> Result<oneshot::Receiver<Result<R, E>>, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    {
        let (otx, orx) = oneshot::channel();
        let job: Job = Box::new(Closure { f, reply: otx });
        let guard = self.tx.lock().map_err(|_| E::from(StoreError::Closed))?;
        match guard.as_ref() {
            Some(tx) => tx.send(job).map_err(|_| E::from(StoreError::Closed))?,
            None => return Err(E::from(StoreError::Closed)),
        }
        Ok(orx)
    }

    /// Close the queue, let the writer finish what is queued, and wait for it.
    pub(crate) fn shutdown(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// When acknowledged writes reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledge after the batch's fsync (default).
    Durable,
    /// Acknowledge after the commit's data sync, before its meta page is
    /// synced: a power loss or OS crash undoes at most the newest commit,
    /// and only within `max_ms` (or `max_writes` writes) of it; the store
    /// stays intact. A process crash loses nothing.
    Batched { max_writes: u64, max_ms: u64 },
    /// Leave flushing to the OS (bulk loads, tests). A power loss or OS
    /// crash can damage the store; the server checks it at the next start.
    None,
}

impl Durability {
    fn code(self) -> u8 {
        match self {
            Durability::Durable => 0,
            Durability::Batched { .. } => 1,
            Durability::None => 2,
        }
    }
}

/// Writer figures for monitoring. Counters only grow.
#[derive(Default)]
pub struct WriterStats {
    pub batches: AtomicU64,
    pub operations: AtomicU64,
    pub failed_operations: AtomicU64,
    pub largest_batch: AtomicU64,
    /// Sum of commit (including fsync) times, microseconds.
    pub commit_micros: AtomicU64,
    pub last_commit_micros: AtomicU64,
    pub syncs: AtomicU64,
}

/// A snapshot of [`WriterStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterFigures {
    pub batches: u64,
    pub operations: u64,
    pub failed_operations: u64,
    pub largest_batch: u64,
    pub commit_micros: u64,
    pub last_commit_micros: u64,
    pub syncs: u64,
}

impl WriterStats {
    pub fn snapshot(&self) -> WriterFigures {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WriterFigures {
            batches: l(&self.batches),
            operations: l(&self.operations),
            failed_operations: l(&self.failed_operations),
            largest_batch: l(&self.largest_batch),
            commit_micros: l(&self.commit_micros),
            last_commit_micros: l(&self.last_commit_micros),
            syncs: l(&self.syncs),
        }
    }
}

/// The durability setting shared with the writer; changeable at runtime.
pub(crate) struct DurabilityCell {
    mode: AtomicU8,
    max_writes: AtomicU64,
    max_ms: AtomicU64,
}

impl DurabilityCell {
    pub(crate) fn new(d: Durability) -> Self {
        let c = DurabilityCell {
            mode: AtomicU8::new(0),
            max_writes: AtomicU64::new(0),
            max_ms: AtomicU64::new(0),
        };
        c.set(d);
        c
    }

    pub(crate) fn set(&self, d: Durability) {
        if let Durability::Batched { max_writes, max_ms } = d {
            self.max_writes.store(max_writes.max(1), Ordering::Relaxed);
            self.max_ms.store(max_ms.max(1), Ordering::Relaxed);
        }
        self.mode.store(d.code(), Ordering::Release);
    }

    pub(crate) fn get(&self) -> Durability {
        match self.mode.load(Ordering::Acquire) {
            0 => Durability::Durable,
            1 => Durability::Batched {
                max_writes: self.max_writes.load(Ordering::Relaxed),
                max_ms: self.max_ms.load(Ordering::Relaxed),
            },
            _ => Durability::None,
        }
    }
}

/// How LMDB is told to commit, per durability mode.
///
/// * `Synced` (durable): data pages fdatasync'd, then the meta page written
///   synchronously: a commit is on disk before it is answered.
/// * `MetaAsync` (batched): data pages fdatasync'd, the meta page written
///   without a sync (`MDB_NOMETASYNC`). LMDB documents that this keeps the
///   database's integrity: the unsynced meta page can only be lost whole
///   (the next commit's data sync, or the writer's timer, makes it durable),
///   so a power cut undoes at most the newest commit.
/// * `NoSync` (none): nothing synced (`MDB_NOSYNC`). A power cut can leave a
///   meta page pointing at pages that never reached the disk: the store may
///   be damaged. A marker file says so until the next sync, and the server
///   checks the whole store at start when it finds one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SyncFlags {
    Synced,
    MetaAsync,
    NoSync,
}

impl SyncFlags {
    fn of(mode: Durability) -> Self {
        match mode {
            Durability::Durable => SyncFlags::Synced,
            Durability::Batched { .. } => SyncFlags::MetaAsync,
            Durability::None => SyncFlags::NoSync,
        }
    }

    fn lmdb(self) -> heed::EnvFlags {
        match self {
            SyncFlags::Synced => heed::EnvFlags::empty(),
            SyncFlags::MetaAsync => heed::EnvFlags::NO_META_SYNC,
            SyncFlags::NoSync => heed::EnvFlags::NO_SYNC,
        }
    }
}

/// The writer's view of what is committed but not yet on disk.
struct Unsynced {
    flags: SyncFlags,
    /// Answered writes whose commit is not yet known to be durable.
    writes: u64,
    /// When the oldest of them was answered.
    since: Instant,
}

impl Unsynced {
    /// Switch LMDB to the flags `mode` needs. Only this thread commits, so
    /// changing flags between transactions is safe. Leaving a mode syncs
    /// first, and the no-sync marker exists exactly while unsynced writes
    /// might be damaging ones.
    fn switch(&mut self, inner: &Inner, mode: Durability) {
        let want = SyncFlags::of(mode);
        if want == self.flags {
            return;
        }
        // Leaving a mode that may hold unsynced commits (some, like bulk
        // import's, are not counted here): sync first, and stay (marker
        // kept) if the sync fails.
        if self.flags != SyncFlags::Synced && !self.sync(inner) {
            return;
        }
        if want == SyncFlags::NoSync {
            if let Err(e) = crate::unsynced_marker::set(&inner.path) {
                tracing::error!(error = %e, "cannot record that the store is written without syncing; staying in the current durability mode");
                return;
            }
        }
        let all = heed::EnvFlags::NO_SYNC | heed::EnvFlags::NO_META_SYNC;
        // SAFETY: no other thread calls set_flags, and no write transaction
        // is open on this thread here.
        let set = unsafe {
            inner
                .env
                .set_flags(all, heed::FlagSetMode::Disable)
                .and_then(|()| {
                    if want.lmdb().is_empty() {
                        Ok(())
                    } else {
                        inner.env.set_flags(want.lmdb(), heed::FlagSetMode::Enable)
                    }
                })
        };
        match set {
            Ok(()) => {
                if self.flags == SyncFlags::NoSync {
                    crate::unsynced_marker::clear(&inner.path);
                }
                self.flags = want;
            }
            Err(e) => tracing::error!(error = %e, "cannot change the durability mode"),
        }
    }

    /// A batch of `n` writes was committed and answered.
    fn committed(&mut self, n: u64) {
        match self.flags {
            SyncFlags::Synced => {}
            // This commit's data sync made the previous meta page durable:
            // only this commit is at risk.
            SyncFlags::MetaAsync => {
                self.writes = n;
                self.since = Instant::now();
            }
            SyncFlags::NoSync => {
                if self.writes == 0 {
                    self.since = Instant::now();
                }
                self.writes += n;
            }
        }
    }

    /// Sync everything committed; false (logged) when the sync failed.
    fn sync(&mut self, inner: &Inner) -> bool {
        match inner.env.force_sync() {
            Ok(()) => {
                self.writes = 0;
                inner.stats.syncs.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "fsync of the store failed");
                false
            }
        }
    }
}

fn run(inner: Arc<Inner>, rx: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::new();
    let mut state = Unsynced {
        flags: SyncFlags::Synced,
        writes: 0,
        since: Instant::now(),
    };
    loop {
        let mode = inner.durability.get();
        // With unsynced writes pending in batched mode, wake up in time to
        // sync them.
        let first = match (mode, state.writes) {
            (Durability::Batched { max_ms, .. }, n) if n > 0 => {
                let deadline = state.since + Duration::from_millis(max_ms);
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            _ => match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => break,
            },
        };
        state.switch(&inner, inner.durability.get());
        if let Some(first) = first {
            batch.push(first);
            let max_batch = inner.max_batch.load(Ordering::Relaxed).max(1);
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let n = batch.len() as u64;
            let replies = apply_batch(&inner, &mut batch);
            state.committed(n);
            for (reply, result) in replies {
                reply(result);
            }
        }
        if let Durability::Batched { max_writes, max_ms } = inner.durability.get() {
            if state.writes > 0
                && (state.writes >= max_writes
                    || state.since.elapsed() >= Duration::from_millis(max_ms))
            {
                state.sync(&inner);
            }
        }
    }
    // Shutting down: whatever the mode, leave nothing unsynced (and no
    // marker saying otherwise).
    state.switch(&inner, Durability::Durable);
}

fn apply_batch(inner: &Inner, batch: &mut Vec<Job>) -> Vec<(Reply, Result<(), StoreError>)> {
    let mut parent = match inner.env.write_txn() {
        Ok(t) => t,
        Err(e) => {
            let e = StoreError::from(e);
            for job in batch.drain(..) {
                job.fail(e.clone());
            }
            return Vec::new();
        }
    };
    let mut done: Vec<(Reply, Result<(), StoreError>)> = Vec::with_capacity(batch.len());
    let mut after_commit: Vec<AfterCommit> = Vec::new();
    // One schema for the whole batch.
    let catalog = inner.catalog.load_full();
    for job in batch.drain(..) {
        let child = match inner.env.nested_write_txn(&mut parent) {
            Ok(c) => c,
            Err(e) => {
                let e = StoreError::from(e);
                job.fail(e);
                continue;
            }
        };
        let mut w = WriteTxn {
            txn: child,
            inner,
            catalog: catalog.clone(),
            after_commit: Vec::new(),
        };
        // A bug in one job must not take the writer (and every later write)
        // down: its nested transaction is aborted and the batch goes on.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&mut w)));
        let (keep, reply) = match ran {
            Ok(r) => r,
            Err(_) => {
                tracing::error!("a write operation panicked; it was rolled back");
                w.txn.abort();
                inner
                    .stats
                    .failed_operations
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if !keep {
            inner
                .stats
                .failed_operations
                .fetch_add(1, Ordering::Relaxed);
        }
        let outcome = if keep {
            let committed = w
                .txn
                .commit()
                .map_err(|e| disk_full_or(inner, StoreError::from(e)));
            if committed.is_ok() {
                after_commit.append(&mut w.after_commit);
            }
            committed
        } else {
            w.txn.abort();
            Ok(())
        };
        done.push((reply, outcome));
    }
    let n = done.len() as u64;
    let started = Instant::now();
    let committed = inner.commit(parent);
    // Renamed or deleted DNs are now visible (or were never written).
    inner.dn_generation.settled();
    let micros = started.elapsed().as_micros() as u64;
    let st = &inner.stats;
    st.batches.fetch_add(1, Ordering::Relaxed);
    st.operations.fetch_add(n, Ordering::Relaxed);
    st.largest_batch.fetch_max(n, Ordering::Relaxed);
    st.commit_micros.fetch_add(micros, Ordering::Relaxed);
    st.last_commit_micros.store(micros, Ordering::Relaxed);
    match committed {
        Ok(()) => {
            for f in after_commit {
                // As for a job: a panicking callback must not stop the writer.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(inner))).is_err() {
                    tracing::error!("a post-commit step panicked");
                }
            }
            done
        }
        Err(e) => {
            let e = disk_full_or(inner, StoreError::from(e));
            tracing::error!(error = %e, "write batch commit failed");
            done.into_iter().map(|(r, _)| (r, Err(e.clone()))).collect()
        }
    }
}

/// LMDB reports a write cut short by a full filesystem as EIO; tell the two
/// apart by looking at the free space where the database lives.
pub(crate) fn disk_full_or(inner: &Inner, e: StoreError) -> StoreError {
    if !matches!(e, StoreError::Lmdb(_)) {
        return e;
    }
    let Ok(path) = std::ffi::CString::new(inner.path.as_os_str().as_encoded_bytes()) else {
        return e;
    };
    // SAFETY: a valid C string and a zeroed out-parameter of the right type.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return e;
    }
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    if free < 1 << 20 {
        StoreError::DiskFull
    } else {
        e
    }
}
