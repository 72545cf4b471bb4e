//! The operations a connection runs on other tasks, as Abandon (RFC 4511
//! 4.11) and Cancel (RFC 3909) see them.
//!
//! Abandon asks an operation to stop and expects no answer. Cancel asks the
//! same but is answered: the cancelled operation ends with `canceled` (118)
//! and then the Cancel itself succeeds; an operation that can no longer be
//! stopped — a write already applying, a compare or extended operation
//! under way, anything already finished — makes the Cancel `tooLate` (120);
//! an unknown message ID is `noSuchOperation` (119). Bind, Unbind, Abandon,
//! StartTLS and Cancel itself never appear here (`cannotCancel`, 121).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pando_proto::ResultCode;
use tokio::sync::watch;

/// The operations of one connection by message ID.
pub type Outstanding = Arc<Mutex<HashMap<i32, Arc<Running>>>>;

/// One operation running (or waiting to) on its own task.
pub struct Running {
    /// Set by Abandon and Cancel; the operation checks it as it goes (a
    /// search on every candidate) and stops.
    pub stop: Arc<AtomicBool>,
    /// Set by Cancel: stopping, the operation answers `canceled`.
    cancel: AtomicBool,
    /// False for what Cancel must not touch (a Cancel): cannotCancel.
    cancellable: bool,
    state: Mutex<State>,
    /// Becomes true once the operation has answered (or given up).
    finished: watch::Sender<bool>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Queued: a write behind the connection's earlier writes.
    Waiting,
    /// Under way; `interruptible` ones (searches) stop when asked.
    Started { interruptible: bool },
    /// Answered; `cancelled`: with `canceled`.
    Finished { cancelled: bool },
}

impl Running {
    pub fn new(stop: Arc<AtomicBool>) -> Arc<Running> {
        Arc::new(Running {
            stop,
            cancel: AtomicBool::new(false),
            cancellable: true,
            state: Mutex::new(State::Waiting),
            finished: watch::channel(false).0,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An operation the connection handles itself (Cancel): listed so that
    /// the connection waits for it, never stopped by Abandon or Cancel.
    pub fn uncancellable() -> Arc<Running> {
        Arc::new(Running {
            stop: Arc::default(),
            cancel: AtomicBool::new(false),
            cancellable: false,
            state: Mutex::new(State::Started {
                interruptible: false,
            }),
            finished: watch::channel(false).0,
        })
    }

    /// Abandon: stop, answer nothing.
    pub fn abandon(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The operation begins. False when it was cancelled or abandoned while
    /// waiting: it must not run (and answers `canceled` if cancelled).
    pub fn start(&self, interruptible: bool) -> bool {
        let mut st = self.state();
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        *st = State::Started { interruptible };
        true
    }

    /// Whether Cancel asked this operation to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The operation has answered: `canceled` when it did so because of a
    /// Cancel. Only the first call counts.
    pub fn finish(&self, canceled: bool) {
        {
            let mut st = self.state();
            if matches!(*st, State::Finished { .. }) {
                return;
            }
            *st = State::Finished {
                cancelled: canceled,
            };
        }
        self.finished.send_replace(true);
    }

    /// Cancel: Ok when the operation will stop and answer `canceled`
    /// (wait with [`Running::answered`]), else the Cancel's result.
    pub fn cancel(&self) -> Result<(), ResultCode> {
        let st = self.state();
        match *st {
            _ if !self.cancellable => Err(ResultCode::CANNOT_CANCEL),
            // One Cancel per operation (each waits for its answer).
            _ if self.cancelled() => Err(ResultCode::TOO_LATE),
            State::Waiting
            | State::Started {
                interruptible: true,
            } => {
                self.cancel.store(true, Ordering::Relaxed);
                self.stop.store(true, Ordering::Relaxed);
                Ok(())
            }
            State::Started {
                interruptible: false,
            }
            | State::Finished { .. } => Err(ResultCode::TOO_LATE),
        }
    }

    /// Wait until the operation has answered; true when it answered
    /// `canceled` (else it finished before it noticed: tooLate).
    pub async fn answered(&self) -> bool {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|done| *done).await;
        matches!(*self.state(), State::Finished { cancelled: true })
    }
}

/// Finishes the operation when dropped, whatever happened to its task:
/// a Cancel waiting on it is never left waiting.
pub struct FinishOnDrop(pub Arc<Running>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancel_by_state() {
        // Waiting: cancelled before it runs.
        let r = Running::new(Arc::default());
        assert_eq!(r.cancel(), Ok(()));
        assert!(!r.start(false) && r.cancelled());
        r.finish(true);
        assert!(r.answered().await);
        // A search under way stops when asked.
        let r = Running::new(Arc::default());
        assert!(r.start(true));
        assert_eq!(r.cancel(), Ok(()));
        assert!(r.stop.load(Ordering::Relaxed));
        // A write under way, or anything finished: too late.
        let r = Running::new(Arc::default());
        assert!(r.start(false));
        assert_eq!(r.cancel(), Err(ResultCode::TOO_LATE));
        r.finish(false);
        assert_eq!(r.cancel(), Err(ResultCode::TOO_LATE));
        assert!(!r.answered().await);
        // Abandon stops it without a Cancel.
        let r = Running::new(Arc::default());
        r.abandon();
        assert!(!r.start(true) && !r.cancelled());
    }
}
