//! Connection threads: every accepted connection is served, for its whole
//! life, by one of a fixed set of threads, each running its own
//! single-threaded event loop (its own epoll and timers). A request is read,
//! answered and written on one thread with no hand-over, so the cost of
//! waking another thread is paid only where work really crosses threads (the
//! writer, slow password hashes, large searches). A new connection goes to
//! the thread serving the fewest. Measured in docs/performance.md (issue 39,
//! second part): on a shared work-stealing pool a small search cost about
//! 9% more server CPU, in wake-ups and hand-overs between workers.
//!
//! This module must not: look at a connection's traffic or state (the
//! connection's task owns it), or decide limits (the accept loops do).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

/// The connection threads; dropping it stops each once the connections it
/// serves have ended (they end at the server's shutdown).
pub struct Shards {
    shards: Vec<Shard>,
}

struct Shard {
    handle: tokio::runtime::Handle,
    /// Connections this thread serves now.
    open: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
}

/// Counts one connection on its thread until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    /// `n` threads (0: one per CPU), each with 8 MiB of stack as the
    /// runtime's workers have.
    pub fn start(n: usize) -> std::io::Result<Shards> {
        let n = match n {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut shards = Vec::with_capacity(n);
        for i in 0..n {
            // Blocking threads (large searches, compares) each hold an
            // LMDB reader: the threads together keep tokio's one-runtime
            // bound of 512, under LMDB's 1024 readers.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads((512 / n).max(1))
                .build()?;
            let handle = rt.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            let open = Arc::new(AtomicUsize::new(0));
            let left = open.clone();
            std::thread::Builder::new()
                .name(format!("pando-conn-{i}"))
                .stack_size(8 << 20)
                .spawn(move || {
                    // Drives this thread's connections; once told to stop
                    // (or the sender is gone), until the last one ended.
                    rt.block_on(async move {
                        let _ = stopped.await;
                        while left.load(Ordering::Relaxed) > 0 {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                    })
                })?;
            shards.push(Shard {
                handle,
                open,
                stop: Some(stop),
            });
        }
        Ok(Shards { shards })
    }

    /// Run the future `make` returns on the thread serving the fewest
    /// connections. `make` itself runs there, so sockets it registers
    /// (`TcpStream::from_std`) belong to that thread's event loop.
    pub fn spawn<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(shard) = self
            .shards
            .iter()
            .min_by_key(|s| s.open.load(Ordering::Relaxed))
        else {
            return;
        };
        shard.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(shard.open.clone());
        shard.handle.spawn(async move {
            let _open = open;
            make().await
        });
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for s in &mut self.shards {
            if let Some(stop) = s.stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Connections each thread serves now.
    fn load(shards: &Shards) -> Vec<usize> {
        shards
            .shards
            .iter()
            .map(|s| s.open.load(Ordering::Relaxed))
            .collect()
    }

    #[test]
    fn tasks_run_on_the_least_loaded_thread_and_stay_there() {
        let shards = Shards::start(2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
        for _ in 0..4 {
            let tx = tx.clone();
            let mut hold = hold_rx.clone();
            shards.spawn(move || async move {
                let before = std::thread::current().name().map(str::to_string);
                // A timer and a wake-up from another thread: both driven here.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = hold.wait_for(|h| *h).await;
                let after = std::thread::current().name().map(str::to_string);
                tx.send((before, after)).unwrap();
            });
        }
        // Two connections on each thread while they are open.
        for _ in 0..100 {
            if load(&shards) == vec![2, 2] {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(load(&shards), vec![2, 2]);
        hold_tx.send(true).unwrap();
        let mut names = Vec::new();
        for _ in 0..4 {
            let (before, after) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(before, after, "a task moved between threads");
            names.push(before.unwrap());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "pando-conn-0",
                "pando-conn-0",
                "pando-conn-1",
                "pando-conn-1"
            ]
        );
        for _ in 0..100 {
            if load(&shards) == vec![0, 0] {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(load(&shards), vec![0, 0], "finished tasks are not counted");
    }
}
