//! One task drives a connection's socket in both directions.
//!
//! Requests are read into `input`; responses made on the connection's own
//! task (binds, small searches) are encoded straight into `output`, and those
//! of operations running on other tasks arrive on a channel and are appended.
//! Whatever is pending is written whenever the task runs, so a small search
//! costs one read and one write, with no task spawned or woken.
//!
//! Responses to requests that arrived together go out together: with output
//! pending, a connection's task steps aside once before writing, so the
//! other connections its thread found ready answer theirs first and the
//! sends follow one another. The client is then woken once for the batch
//! instead of once per response; that wake-up (an interprocessor interrupt,
//! dear on a virtual machine) was the largest single cost of a small search
//! (docs/performance.md, issue 39, sixth part). At most [`BATCH`]
//! connections of a thread hold their output back at once, so a response
//! waits for at most that many others: with every connection of a thread
//! held back, clients whose requests alternate between two connections
//! (search, then bind) would move between the threads in convoys.
//!
//! Flow control: while more than [`OUTPUT_HIGH`] bytes wait for a client that
//! is not reading, no more requests are read and the channel is left alone
//! (operations on other tasks then wait on it); a client that takes nothing
//! for [`WRITE_STALL`] is dropped, so it cannot hold operations (and their
//! read transactions) forever.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use crate::state::Server;

/// Longest a response may wait for a client that reads nothing, by
/// default (`limits.write_timeout`).
pub const WRITE_STALL: Duration = Duration::from_secs(60);

/// Output waiting beyond this stops reading requests.
pub const OUTPUT_HIGH: usize = 256 * 1024;

/// Most connections of one thread holding their output back at once.
pub const BATCH: u32 = 4;

thread_local! {
    /// Connections of this thread holding their output back now.
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a connection holds one of its thread's places; a connection
/// that ends while holding one gives it back.
struct Held(bool);

impl Held {
    fn release(&mut self) {
        if std::mem::take(&mut self.0) {
            HELD.with(|h| h.set(h.get().saturating_sub(1)));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Why [`Wire::turn`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Bytes were appended to `input`.
    Read,
    /// The client closed its side (or reading failed).
    Closed,
    /// Writing failed, or the client stopped reading.
    WriteFailed,
    /// Nothing was read for the idle timeout.
    Idle,
    /// The server is shutting down.
    Shutdown,
}

pub struct Wire<S> {
    pub stream: S,
    /// Bytes received and not yet consumed.
    pub input: Vec<u8>,
    /// Encoded responses; `output[written..]` is still to be written.
    pub output: Vec<u8>,
    /// `input` holds requests left unanswered because the output was above
    /// [`OUTPUT_HIGH`]: [`turn`](Self::turn) returns [`Event::Read`] as soon
    /// as the output drains below it, without waiting for more input.
    pub backlog: bool,
    written: usize,
    /// Bytes written since the last successful flush (TLS buffers them).
    unflushed: bool,
    /// End of the current write window, armed when the socket first refused
    /// output and cleared once everything pending is written.
    stall: Option<Pin<Box<Sleep>>>,
    /// Bytes the client took since the window began.
    window_taken: usize,
    /// `limits.write_timeout`.
    write_window: Duration,
    /// `limits.min_write_rate`, bytes per second.
    min_rate: u64,
    /// Set once writing failed or stalled: output is discarded from then on.
    broken: bool,
    /// This connection holds one of its thread's [`BATCH`] places.
    held: Held,
    /// Responses of operations running on other tasks.
    rx: mpsc::Receiver<Vec<u8>>,
    idle: Option<Idle>,
    server: Arc<Server>,
}

/// The idle timeout as one long-lived timer, moved on only when it fires
/// (a timer per read would cost a timer-wheel insert and removal per request).
struct Idle {
    limit: Duration,
    last_read: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Wire<S> {
    pub fn new(
        stream: S,
        rx: mpsc::Receiver<Vec<u8>>,
        idle: Option<Duration>,
        server: Arc<Server>,
    ) -> Wire<S> {
        Wire {
            stream,
            input: Vec::with_capacity(16 * 1024),
            output: Vec::new(),
            backlog: false,
            written: 0,
            unflushed: false,
            stall: None,
            window_taken: 0,
            write_window: Duration::from_secs(server.cfg.config.limits.write_timeout.max(1)),
            min_rate: server.cfg.config.limits.min_write_rate,
            broken: false,
            held: Held(false),
            rx,
            idle: idle.map(|limit| Idle {
                limit,
                last_read: Instant::now(),
                timer: Box::pin(tokio::time::sleep(limit)),
            }),
            server,
        }
    }

    /// Change the idle timeout (it depends on who is bound); time already
    /// spent idle counts toward the new limit.
    pub fn set_idle(&mut self, limit: Option<Duration>) {
        if self.idle.as_ref().map(|i| i.limit) == limit {
            return;
        }
        let last_read = self
            .idle
            .as_ref()
            .map_or_else(Instant::now, |i| i.last_read);
        self.idle = limit.map(|limit| Idle {
            limit,
            last_read,
            timer: Box::pin(tokio::time::sleep_until(last_read + limit)),
        });
    }

    /// Bytes encoded and not yet written.
    pub fn pending(&self) -> usize {
        self.output.len() - self.written
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Write what is pending and take in responses from other tasks until
    /// a request arrives or the connection must end.
    pub async fn turn<F: Future>(&mut self, mut shutdown: Pin<&mut F>) -> Event {
        std::future::poll_fn(|cx| {
            if self.hold_back(cx) {
                return Poll::Pending;
            }
            if let Poll::Ready(Err(())) = self.poll_output(cx) {
                return Poll::Ready(Event::WriteFailed);
            }
            if self.pending() < OUTPUT_HIGH {
                if self.backlog {
                    self.backlog = false;
                    return Poll::Ready(Event::Read);
                }
                if self.input.capacity() - self.input.len() < 4096 {
                    self.input.reserve(16 * 1024);
                }
                let read = self.stream.read_buf(&mut self.input);
                match std::pin::pin!(read).poll(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Event::Closed),
                    Poll::Ready(Ok(n)) => {
                        let m = &self.server.rt.metrics;
                        m.add(&m.bytes_in, n as u64);
                        if let Some(idle) = &mut self.idle {
                            idle.last_read = Instant::now();
                        }
                        return Poll::Ready(Event::Read);
                    }
                    Poll::Pending => {}
                }
            }
            if shutdown.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Shutdown);
            }
            if let Some(idle) = &mut self.idle {
                while idle.timer.as_mut().poll(cx).is_ready() {
                    let due = idle.last_read + idle.limit;
                    if due <= Instant::now() {
                        // Counted afresh if the caller carries on.
                        idle.last_read = Instant::now();
                        idle.timer.as_mut().reset(idle.last_read + idle.limit);
                        return Poll::Ready(Event::Idle);
                    }
                    idle.timer.as_mut().reset(due);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// With output pending, step aside once (woken again at once, behind
    /// the tasks already ready on this thread) if fewer than [`BATCH`]
    /// connections of the thread are holding back; true when it did.
    fn hold_back(&mut self, cx: &mut Context<'_>) -> bool {
        if self.held.0 {
            self.held.release();
            return false;
        }
        if self.pending() == 0 || HELD.with(|h| h.get()) >= BATCH {
            return false;
        }
        HELD.with(|h| h.set(h.get() + 1));
        self.held.0 = true;
        cx.waker().wake_by_ref();
        true
    }

    /// Await `fut` while keeping output flowing (operations on other tasks
    /// may be waiting on the channel for `fut` to be able to finish).
    pub async fn pump_while<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(v);
            }
            let _ = self.poll_output(cx);
            Poll::Pending
        })
        .await
    }

    /// Move the responses already waiting in the channel into the output
    /// (before a last notice, so that it comes after them).
    pub fn take_ready(&mut self) {
        while let Ok(b) = self.rx.try_recv() {
            self.output.extend_from_slice(&b);
        }
    }

    /// Write everything pending and everything the channel still brings,
    /// until every sender is gone. False when the client could not be
    /// written to.
    pub async fn finish(&mut self) -> bool {
        std::future::poll_fn(|cx| loop {
            match self.poll_write_pending(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(())) => return Poll::Ready(false),
                Poll::Pending => return Poll::Pending,
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(b)) => self.output.extend_from_slice(&b),
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }

    /// Take in responses from the channel (while there is room) and write.
    /// Ready(Ok) when all is written, Pending while the socket is full.
    fn poll_output(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        loop {
            let mut took = false;
            // The channel was polled until it had nothing (so its waker is
            // registered): without that, output written in full while the
            // channel was full would leave nothing to wake this task when
            // senders wait on the channel and the client sends nothing.
            let mut drained = false;
            while self.pending() < OUTPUT_HIGH {
                match self.rx.poll_recv(cx) {
                    Poll::Ready(Some(b)) => {
                        self.output.extend_from_slice(&b);
                        took = true;
                    }
                    _ => {
                        drained = true;
                        break;
                    }
                }
            }
            match self.poll_write_pending(cx) {
                Poll::Ready(Ok(())) if took || !drained => continue,
                other => return other,
            }
        }
    }

    fn poll_write_pending(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        if self.broken {
            self.output.clear();
            self.written = 0;
            return Poll::Ready(Err(()));
        }
        while self.written < self.output.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.output[self.written..]) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    self.written += n;
                    self.unflushed = true;
                    self.window_taken += n;
                    let m = &self.server.rt.metrics;
                    m.add(&m.bytes_out, n as u64);
                }
                Poll::Ready(_) => return self.fail(),
                Poll::Pending => return self.poll_stall(cx),
            }
        }
        self.written = 0;
        if self.output.capacity() > 4 * OUTPUT_HIGH {
            self.output = Vec::new();
        } else {
            self.output.clear();
        }
        if self.unflushed {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(_)) => return self.fail(),
                Poll::Pending => return self.poll_stall(cx),
            }
        }
        self.stall = None;
        self.window_taken = 0;
        Poll::Ready(Ok(()))
    }

    /// The socket takes no more for now. Output has been waiting since the
    /// window's timer was armed; each time a window of
    /// `limits.write_timeout` ends with output still waiting, the client
    /// must have taken at least `limits.min_write_rate` bytes a second over
    /// it, or it is dropped: a client that trickles a few bytes a minute
    /// cannot keep its operations (their threads and read transactions)
    /// alive for days.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        loop {
            let window = self.write_window;
            if self.stall.is_none() {
                // What the kernel took before it first refused does not
                // count toward the window.
                self.window_taken = 0;
            }
            let timer = self
                .stall
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(window)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let needed = self.min_rate.saturating_mul(window.as_secs().max(1));
            if self.window_taken == 0 || (self.window_taken as u64) < needed {
                tracing::info!(
                    taken = self.window_taken,
                    seconds = window.as_secs(),
                    "closing a connection whose client stopped reading or reads too slowly"
                );
                return self.fail();
            }
            self.window_taken = 0;
            timer.as_mut().reset(Instant::now() + window);
        }
    }

    fn fail(&mut self) -> Poll<Result<(), ()>> {
        self.broken = true;
        self.output.clear();
        self.written = 0;
        Poll::Ready(Err(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server over a store in `dir` (only its metrics and limits are used).
    fn server(dir: &std::path::Path) -> Arc<Server> {
        crate::test_server::bare(dir, "")
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_dropped_after_the_stall() {
        let dir = tempfile::tempdir().unwrap();
        let (_client, side) = tokio::io::duplex(1024);
        let (_tx, rx) = mpsc::channel(4);
        let mut wire = Wire::new(side, rx, None, server(dir.path()));
        wire.output.extend_from_slice(&[7u8; 64 * 1024]);
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let started = tokio::time::Instant::now();
        assert_eq!(wire.turn(never.as_mut()).await, Event::WriteFailed);
        assert!(started.elapsed() >= WRITE_STALL, "{:?}", started.elapsed());
        assert!(wire.is_broken());
    }

    /// A client reading `per_tick` bytes every second until the server
    /// side goes away (at most 600 s).
    async fn trickle_reader(
        mut client: tokio::io::DuplexStream,
        per_tick: usize,
    ) -> tokio::io::DuplexStream {
        let mut buf = vec![0u8; per_tick];
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if client.read_exact(&mut buf).await.is_err() {
                break;
            }
        }
        client
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_reading_below_the_minimum_rate_is_dropped_after_one_window() {
        let dir = tempfile::tempdir().unwrap();
        let (client, side) = tokio::io::duplex(1024);
        let (_tx, rx) = mpsc::channel(4);
        let mut wire = Wire::new(side, rx, None, server(dir.path()));
        wire.output.extend_from_slice(&[7u8; 512 * 1024]);
        // 16 bytes a second: progress every second, far below 1 KiB/s.
        let reader = tokio::spawn(trickle_reader(client, 16));
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let started = tokio::time::Instant::now();
        assert_eq!(wire.turn(never.as_mut()).await, Event::WriteFailed);
        let took = started.elapsed();
        assert!(
            took >= WRITE_STALL && took < WRITE_STALL + Duration::from_secs(2),
            "{took:?}"
        );
        drop(wire);
        reader.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_reading_above_the_minimum_rate_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let (client, side) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(4);
        let mut wire = Wire::new(side, rx, None, server(dir.path()));
        // 300 KiB at 2 KiB/s: 150 s, two and a half windows, each above
        // the minimum of 1 KiB/s.
        wire.output.extend_from_slice(&[7u8; 300 * 1024]);
        let reader = tokio::spawn(trickle_reader(client, 2048));
        drop(tx);
        assert!(wire.finish().await, "dropped a client reading 2 KiB/s");
        assert!(!wire.is_broken());
        drop(wire);
        reader.await.unwrap();
    }

    /// Regression: output above the high-water mark, written in full in
    /// one go, with the channel full of more: the channel must still be
    /// emptied although the client sends nothing (it stalled forever).
    #[tokio::test(start_paused = true)]
    async fn a_full_channel_is_drained_after_output_above_the_mark_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (mut client, side) = tokio::io::duplex(1 << 20);
        let (tx, rx) = mpsc::channel(2);
        let mut wire = Wire::new(side, rx, None, server(dir.path()));
        wire.output.extend_from_slice(&[1u8; OUTPUT_HIGH + 1]);
        let total = OUTPUT_HIGH + 1 + 8 * 1024;
        let sender = tokio::spawn(async move {
            for _ in 0..8 {
                tx.send(vec![2u8; 1024]).await.unwrap();
            }
        });
        // The wire on a task of its own, as in the server: only its own
        // wakers can make it run again.
        let serving = tokio::spawn(async move {
            let never = std::future::pending::<()>();
            tokio::pin!(never);
            wire.turn(never.as_mut()).await
        });
        let mut got = vec![0u8; total];
        let read = tokio::time::timeout(Duration::from_secs(30), client.read_exact(&mut got)).await;
        assert!(read.is_ok(), "stalled: the channel was never emptied");
        assert_eq!(got.iter().filter(|b| **b == 2).count(), 8 * 1024);
        sender.await.unwrap();
        serving.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn output_and_channel_flow_while_waiting_for_input_or_another_future() {
        let dir = tempfile::tempdir().unwrap();
        let (mut client, side) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(4);
        let mut wire = Wire::new(side, rx, None, server(dir.path()));
        // More than the pipe holds, from both sources: written as the
        // client reads, in order.
        wire.output.extend_from_slice(&[1u8; 10_000]);
        let sender = tokio::spawn(async move {
            for b in 2..=5u8 {
                tx.send(vec![b; 10_000]).await.unwrap();
            }
        });
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 50_000];
            client.read_exact(&mut got).await.unwrap();
            client.write_all(b"x").await.unwrap();
            (client, got)
        });
        // A future that ends only once everything was read: pump_while
        // must keep writing meanwhile.
        let (mut client, got) = wire.pump_while(reader).await.unwrap();
        sender.await.unwrap();
        for (i, chunk) in got.chunks(10_000).enumerate() {
            assert!(
                chunk.iter().all(|&b| b == i as u8 + 1),
                "chunk {i} out of order"
            );
        }
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        assert_eq!(wire.turn(never.as_mut()).await, Event::Read);
        assert_eq!(wire.input, b"x");
        assert_eq!(wire.pending(), 0);
        drop(client.shutdown().await);
        drop(client);
        assert_eq!(wire.turn(never.as_mut()).await, Event::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fires_once_nothing_was_read_for_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut client, side) = tokio::io::duplex(1024);
        let (_tx, rx) = mpsc::channel(4);
        let limit = Duration::from_secs(30);
        let mut wire = Wire::new(side, rx, Some(limit), server(dir.path()));
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        tokio::time::sleep(Duration::from_secs(20)).await;
        client.write_all(b"a").await.unwrap();
        assert_eq!(wire.turn(never.as_mut()).await, Event::Read);
        let read_at = tokio::time::Instant::now();
        // The timer set at the start fires at 30 s, finds a read at 20 s
        // and moves to 50 s.
        assert_eq!(wire.turn(never.as_mut()).await, Event::Idle);
        assert!(read_at.elapsed() >= limit, "{:?}", read_at.elapsed());
    }

    /// A stream recording, into a shared log, the order in which the
    /// wires wrote.
    struct Logged {
        name: u8,
        log: Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl AsyncRead for Logged {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Logged {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.log.lock().unwrap().push(self.name);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Six connections of one thread, each with a response to write, run
    /// in order: the first BATCH step aside, the other two write at once,
    /// then the first four write in their turn; no place stays taken.
    #[test]
    fn responses_of_connections_ready_together_go_out_together() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let local = tokio::task::LocalSet::new();
        let mut senders = Vec::new();
        for name in 0..6u8 {
            let (tx, rx) = mpsc::channel(4);
            senders.push(tx);
            let stream = Logged {
                name,
                log: log.clone(),
            };
            let mut wire = Wire::new(stream, rx, None, server.clone());
            wire.output.push(name);
            local.spawn_local(async move {
                let stop = std::future::ready(());
                tokio::pin!(stop);
                assert_eq!(wire.turn(stop.as_mut()).await, Event::Shutdown);
                assert!(!wire.held.0);
            });
        }
        rt.block_on(local);
        assert_eq!(*log.lock().unwrap(), vec![4, 5, 0, 1, 2, 3]);
        assert_eq!(HELD.with(|h| h.get()), 0);
    }

    /// A connection dropped while holding back gives its place back.
    #[test]
    fn a_connection_ended_while_holding_back_frees_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let (_tx, rx) = mpsc::channel(4);
        let stream = Logged {
            name: 0,
            log: Arc::new(std::sync::Mutex::new(Vec::new())),
        };
        let mut wire = Wire::new(stream, rx, None, server(dir.path()));
        wire.output.push(1);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(wire.hold_back(&mut cx));
        assert_eq!(HELD.with(|h| h.get()), 1);
        drop(wire);
        assert_eq!(HELD.with(|h| h.get()), 0);
    }
}
