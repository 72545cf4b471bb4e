//! A log file written by its own thread, fed through a bounded channel.
//!
//! Request handling never writes to disk: it hands a finished line (or
//! record) to the channel. When the channel is full, `OnFull::Drop` counts
//! the line as dropped and moves on; `OnFull::Block` waits for room (the
//! audit log always blocks: an audit trail with holes is worthless).
//!
//! The writer rotates by size (`max_bytes`) and at midnight UTC (`daily`):
//! the current file is renamed to `<path>.<UTC timestamp>` and a new one is
//! created. `reopen` (SIGHUP) closes and reopens the same path, for
//! external rotation tools that have renamed the file. New files get
//! `mode` (0600 by default).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// While records keep coming, the writer collects them for this long
/// between writes.
const BUSY_PAUSE: Duration = Duration::from_millis(10);

pub use pando_config::OnFull;

#[derive(Clone, Debug)]
pub struct LogFileOptions {
    pub path: PathBuf,
    /// Lines (records) the channel holds.
    pub buffer: usize,
    pub on_full: OnFull,
    /// Rotate when the file reaches this size; 0 = never by size.
    pub max_bytes: u64,
    /// Rotate when the UTC date changes.
    pub daily: bool,
    /// Permission bits of files this creates.
    pub mode: u32,
}

enum Msg {
    Record(String),
    Reopen,
    /// Flush and answer (tests, shutdown).
    Sync(std::sync::mpsc::SyncSender<()>),
    /// Write what came before, then end the thread.
    Close,
}

/// The sending side; cheap to share. Dropping the last one ends the thread
/// after everything queued is written.
pub struct LogFile {
    /// Shared by every request thread without a lock (`SyncSender` is `Sync`).
    tx: SyncSender<Msg>,
    on_full: OnFull,
    pub dropped: Arc<AtomicU64>,
    pub write_errors: Arc<AtomicU64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    path: PathBuf,
}

impl LogFile {
    /// Open (create) the file now, so a bad path is reported at start, and
    /// start the writer thread.
    pub fn open(opts: LogFileOptions) -> Result<LogFile, String> {
        let file = open_append(&opts.path, opts.mode)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = sync_channel(opts.buffer.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let write_errors = Arc::new(AtomicU64::new(0));
        let path = opts.path.clone();
        let on_full = opts.on_full;
        let errors = write_errors.clone();
        let thread = std::thread::Builder::new()
            .name("pando-log".into())
            .spawn(move || {
                let mut w = Writer {
                    out: BufWriter::with_capacity(64 * 1024, file),
                    size,
                    day: today(),
                    opts,
                    errors,
                };
                w.run(rx)
            })
            .map_err(|e| format!("cannot start the log writer thread: {e}"))?;
        Ok(LogFile {
            tx,
            on_full,
            dropped,
            write_errors,
            thread: Mutex::new(Some(thread)),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue one record (it must end with a newline). Never blocks with
    /// `OnFull::Drop`.
    pub fn write(&self, record: String) {
        match self.on_full {
            OnFull::Drop => match self.tx.try_send(Msg::Record(record)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            },
            OnFull::Block => {
                if self.tx.send(Msg::Record(record)).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Close and reopen the path (after an external rotation).
    pub fn reopen(&self) {
        let _ = self.tx.send(Msg::Reopen);
    }

    /// Wait until everything queued so far is written and flushed.
    pub fn sync(&self) {
        let (done_tx, done_rx) = sync_channel(1);
        if self.tx.send(Msg::Sync(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }

    /// Write what is queued and stop the thread. Records written after
    /// this are counted as dropped.
    pub fn close(&self) {
        let _ = self.tx.send(Msg::Close);
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        self.close();
    }
}

fn open_append(path: &Path, mode: u32) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("cannot open log file {}: {e}", path.display()))
}

/// Days since the epoch, UTC.
fn today() -> u64 {
    pando_store::clock::now_micros() / 86_400_000_000
}

struct Writer {
    out: BufWriter<File>,
    size: u64,
    day: u64,
    opts: LogFileOptions,
    errors: Arc<AtomicU64>,
}

impl Writer {
    /// Two modes. Idle: block until a record arrives (a sender's wake-up).
    /// Busy: sleep `BUSY_PAUSE`, then take everything queued and write it
    /// with one flush. While busy the thread is never parked in `recv`, so
    /// senders do not pay for waking it: under load the cost per line is the
    /// formatting and one queue push, and the file gets one write per pause.
    fn run(&mut self, rx: Receiver<Msg>) {
        let mut busy = false;
        loop {
            if busy {
                std::thread::sleep(BUSY_PAUSE);
            } else {
                // Idle: wake at least once a minute for daily rotation.
                match rx.recv_timeout(Duration::from_secs(60)) {
                    Ok(m) => {
                        if !self.handle(m) {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        self.maybe_rotate();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            let mut n = 0;
            let mut closed = false;
            loop {
                match rx.try_recv() {
                    Ok(m) => {
                        n += 1;
                        if !self.handle(m) {
                            closed = true;
                            break;
                        }
                    }
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            self.flush();
            if closed {
                break;
            }
            busy = n > 0;
        }
        self.flush();
    }

    /// Apply one message; false when the log is closing.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Record(r) => {
                self.maybe_rotate();
                if self.out.write_all(r.as_bytes()).is_err() {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
                self.size += r.len() as u64;
            }
            Msg::Reopen => self.reopen(false),
            Msg::Sync(done) => {
                self.flush();
                let _ = done.send(());
            }
            Msg::Close => return false,
        }
        true
    }

    fn flush(&mut self) {
        if self.out.flush().is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn maybe_rotate(&mut self) {
        let by_size = self.opts.max_bytes > 0 && self.size >= self.opts.max_bytes;
        let by_day = self.opts.daily && today() != self.day;
        if by_size || by_day {
            self.reopen(true);
        }
    }

    /// Flush, optionally rename the current file aside, and open the path.
    fn reopen(&mut self, rotate: bool) {
        self.flush();
        if rotate {
            let stamp = pando_store::clock::generalized_time(pando_store::clock::now_micros());
            let mut aside = self.opts.path.as_os_str().to_owned();
            aside.push(format!(".{}", stamp.trim_end_matches('Z')));
            let mut aside = PathBuf::from(aside);
            // Two rotations within one second: add a counter.
            let mut n = 1;
            while aside.exists() {
                let mut a = self.opts.path.as_os_str().to_owned();
                a.push(format!(".{}.{n}", stamp.trim_end_matches('Z')));
                aside = PathBuf::from(a);
                n += 1;
            }
            if let Err(e) = std::fs::rename(&self.opts.path, &aside) {
                tracing::error!(path = %self.opts.path.display(), "log rotation failed: {e}");
            }
        }
        match open_append(&self.opts.path, self.opts.mode) {
            Ok(f) => {
                self.size = f.metadata().map(|m| m.len()).unwrap_or(0);
                self.out = BufWriter::with_capacity(64 * 1024, f);
                self.day = today();
            }
            Err(e) => {
                // Keep writing to the old handle rather than lose lines.
                tracing::error!("{e}");
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn opts(dir: &Path, buffer: usize, on_full: OnFull, max_bytes: u64) -> LogFileOptions {
        LogFileOptions {
            path: dir.join("access.log"),
            buffer,
            on_full,
            max_bytes,
            daily: false,
            mode: 0o600,
        }
    }

    #[test]
    fn writes_lines_with_mode_0600() {
        let d = tempfile::tempdir().unwrap();
        let l = LogFile::open(opts(d.path(), 16, OnFull::Block, 0)).unwrap();
        l.write("one\n".into());
        l.write("two\n".into());
        l.sync();
        let p = d.path().join("access.log");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn rotates_by_size() {
        let d = tempfile::tempdir().unwrap();
        let l = LogFile::open(opts(d.path(), 16, OnFull::Block, 10)).unwrap();
        for i in 0..5 {
            l.write(format!("line {i}\n"));
        }
        l.close();
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.len() >= 3, "{names:?}");
        let mut all = String::new();
        for n in &names {
            all.push_str(&std::fs::read_to_string(d.path().join(n)).unwrap());
        }
        for i in 0..5 {
            assert!(all.contains(&format!("line {i}\n")));
        }
    }

    #[test]
    fn rotates_when_the_day_changes() {
        let d = tempfile::tempdir().unwrap();
        let mut o = opts(d.path(), 16, OnFull::Block, 0);
        o.daily = true;
        let file = open_append(&o.path, o.mode).unwrap();
        let mut w = Writer {
            out: BufWriter::new(file),
            size: 0,
            // Opened "yesterday".
            day: today() - 1,
            opts: o,
            errors: Arc::new(AtomicU64::new(0)),
        };
        w.handle(Msg::Record("old day\n".into()));
        w.flush();
        // The record that finds the date changed went to a new file.
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(
            std::fs::read_to_string(d.path().join("access.log")).unwrap(),
            "old day\n"
        );
        assert_eq!(w.day, today());
        w.handle(Msg::Record("same day\n".into()));
        w.flush();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    #[test]
    fn reopen_after_external_rename() {
        let d = tempfile::tempdir().unwrap();
        let l = LogFile::open(opts(d.path(), 16, OnFull::Block, 0)).unwrap();
        l.write("before\n".into());
        l.sync();
        std::fs::rename(d.path().join("access.log"), d.path().join("old.log")).unwrap();
        l.reopen();
        l.write("after\n".into());
        l.sync();
        assert_eq!(
            std::fs::read_to_string(d.path().join("old.log")).unwrap(),
            "before\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("access.log")).unwrap(),
            "after\n"
        );
    }

    #[test]
    fn full_buffer_drops_and_counts() {
        let d = tempfile::tempdir().unwrap();
        // A writer stuck behind a Sync whose answer nobody reads keeps the
        // channel full.
        let l = LogFile::open(opts(d.path(), 2, OnFull::Drop, 0)).unwrap();
        let (stuck_tx, _stuck_rx) = sync_channel(0);
        l.tx.send(Msg::Sync(stuck_tx)).unwrap();
        // Give the thread time to pick up the Sync and block on it.
        std::thread::sleep(Duration::from_millis(100));
        for i in 0..10 {
            l.write(format!("{i}\n"));
        }
        assert_eq!(l.dropped.load(Ordering::Relaxed), 8);
        drop(_stuck_rx);
        l.close();
        assert_eq!(
            std::fs::read_to_string(d.path().join("access.log")).unwrap(),
            "0\n1\n"
        );
    }
}
