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
//! Except the second of two connections opened one after the other (within
//! a second, the first still open) from one address: it joins the first's
//! thread. A client that looks a user up on one connection and binds as
//! the user on another (a login service, ldbench's auth) then has its
//! whole flow on one thread, instead of every lookup connection on one
//! thread and every bind connection on the other, each waiting on the
//! other through the client (docs/performance.md, issue 39, thirteenth
//! part: +14% auths a second, p99 lower).
//!
//! This module must not: look at a connection's traffic or state (the
//! connection's task owns it), or decide limits (the accept loops do).

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The connection threads; dropping it stops each once the connections it
/// serves have ended (they end at the server's shutdown).
pub struct Shards {
    shards: Vec<Shard>,
    /// The last connection that could lead a pair.
    last: Mutex<Option<Leader>>,
}

/// A connection placed by load, which the next one from its address may
/// join (once, within [`PAIR_WITHIN`], while it is open).
struct Leader {
    ip: IpAddr,
    shard: usize,
    at: Instant,
    /// Gone once the connection ended (a probe that connected, asked and
    /// left pairs with nothing).
    open: std::sync::Weak<()>,
}

/// How soon after the first the second connection of a pair is opened.
const PAIR_WITHIN: Duration = Duration::from_secs(1);

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
        Ok(Shards {
            shards,
            last: Mutex::new(None),
        })
    }

    /// Run the future `make` returns on the thread [`Shards::place`]
    /// chooses for a connection from `peer`. `make` itself runs there, so
    /// sockets it registers (`TcpStream::from_std`) belong to that
    /// thread's event loop.
    pub fn spawn<F, Fut>(&self, peer: Option<IpAddr>, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let alive = Arc::new(());
        let at = self.place(peer, Instant::now(), Arc::downgrade(&alive));
        let Some(shard) = self.shards.get(at) else {
            return;
        };
        shard.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(shard.open.clone());
        shard.handle.spawn(async move {
            let _open = open;
            let _alive = alive;
            make().await
        });
    }

    /// The thread for a connection from `peer` opened at `now` (`open`
    /// lives as long as it does): the previous connection's when that one
    /// came from the same address within [`PAIR_WITHIN`], is still open
    /// and did not itself join another; else the thread serving the
    /// fewest.
    fn place(&self, peer: Option<IpAddr>, now: Instant, open: std::sync::Weak<()>) -> usize {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let leader = last.take();
        if let (Some(ip), Some(l)) = (peer, &leader) {
            if l.ip == ip
                && now.saturating_duration_since(l.at) <= PAIR_WITHIN
                && l.open.strong_count() > 0
            {
                return l.shard;
            }
        }
        let shard = (0..self.shards.len())
            .min_by_key(|&i| self.shards[i].open.load(Ordering::Relaxed))
            .unwrap_or(0);
        *last = peer.map(|ip| Leader {
            ip,
            shard,
            at: now,
            open,
        });
        shard
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

    /// Place a connection as `spawn` does, counting it on its thread; it
    /// stays open as long as `shards` does.
    fn put(shards: &Shards, peer: Option<&str>, at: Instant) -> usize {
        let alive = Box::leak(Box::new(Arc::new(())));
        let i = shards.place(peer.map(|p| p.parse().unwrap()), at, Arc::downgrade(alive));
        shards.shards[i].open.fetch_add(1, Ordering::Relaxed);
        i
    }

    #[test]
    fn a_connection_opened_right_after_another_from_its_address_joins_its_thread() {
        let shards = Shards::start(2).unwrap();
        let t = Instant::now();
        let ms = Duration::from_millis;
        let a = Some("192.0.2.1");
        // Pairs by address, each pair on the thread serving the fewest.
        assert_eq!(put(&shards, a, t), 0);
        assert_eq!(put(&shards, a, t + ms(1)), 0, "the second of a pair");
        assert_eq!(put(&shards, a, t + ms(2)), 1, "a third leads a new pair");
        assert_eq!(put(&shards, a, t + ms(3)), 1);
        // Another address between two breaks the pair.
        assert_eq!(put(&shards, a, t + ms(4)), 0);
        assert_eq!(put(&shards, Some("2001:db8::1"), t + ms(5)), 1);
        assert_eq!(put(&shards, a, t + ms(6)), 0);
        assert_eq!(load(&shards), vec![4, 3]);
        // Too late to pair: placed by load.
        assert_eq!(put(&shards, a, t + ms(6) + PAIR_WITHIN + ms(1)), 1);
        // A local socket never pairs, nor does the one after it.
        assert_eq!(put(&shards, None, t + PAIR_WITHIN * 2), 0);
        assert_eq!(put(&shards, a, t + PAIR_WITHIN * 2 + ms(1)), 1);
        assert_eq!(put(&shards, None, t + PAIR_WITHIN * 2 + ms(2)), 0);
        assert_eq!(load(&shards), vec![6, 5]);
        // A connection that ended (a probe) is no one to join.
        let probe = Arc::new(());
        let later = t + PAIR_WITHIN * 3;
        assert_eq!(
            shards.place(a.map(|p| p.parse().unwrap()), later, Arc::downgrade(&probe)),
            1
        );
        drop(probe);
        assert_eq!(put(&shards, a, later + ms(1)), 1, "placed by load");
        assert_eq!(
            put(&shards, a, later + ms(2)),
            1,
            "the second of a new pair"
        );
    }

    #[test]
    fn tasks_run_on_the_least_loaded_thread_and_stay_there() {
        let shards = Shards::start(2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
        for _ in 0..4 {
            let tx = tx.clone();
            let mut hold = hold_rx.clone();
            shards.spawn(None, move || async move {
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
