//! The single writer thread and its group commit.
//!
//! Write jobs queue on a channel. The writer takes the first waiting job and
//! then everything else already queued (up to `max_batch`), runs each in a
//! nested transaction of one parent transaction (a failing job rolls back
//! only itself), commits the parent once — one fsync for the whole batch —
//! and only then answers each job. A job's success is therefore never
//! reported before it is durable.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::{Inner, StoreError, WriteTxn};

/// Sent back to a job after its batch committed (or failed to).
type Reply = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
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
    pub(crate) fn start(inner: Arc<Inner>, max_batch: usize) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("pando-writer".into())
            .spawn(move || run(inner, rx, max_batch.max(1)))?;
        Ok(WriterHandle {
            tx: Arc::new(Mutex::new(Some(tx))),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
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

fn run(inner: Arc<Inner>, rx: mpsc::Receiver<Job>, max_batch: usize) {
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let replies = apply_batch(&inner, &mut batch);
        for (reply, result) in replies {
            reply(result);
        }
    }
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
    for job in batch.drain(..) {
        let child = match inner.env.nested_write_txn(&mut parent) {
            Ok(c) => c,
            Err(e) => {
                let e = StoreError::from(e);
                job.fail(e);
                continue;
            }
        };
        let mut w = WriteTxn { txn: child, inner };
        let (keep, reply) = job.run(&mut w);
        let outcome = if keep {
            w.txn.commit().map_err(StoreError::from)
        } else {
            w.txn.abort();
            Ok(())
        };
        done.push((reply, outcome));
    }
    match parent.commit() {
        Ok(()) => done,
        Err(e) => {
            let e = StoreError::from(e);
            tracing::error!(error = %e, "write batch commit failed");
            done.into_iter().map(|(r, _)| (r, Err(e.clone()))).collect()
        }
    }
}
