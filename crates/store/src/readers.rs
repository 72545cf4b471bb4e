//! Which read transactions are open, and since when: a fixed table of
//! slots, one per open `ReadTxn`, each holding the transaction's start time
//! (microseconds since the table was made, +1 so 0 means free). Taking and
//! freeing a slot is one compare-and-swap and one store; monitoring scans
//! the table for the count and the oldest start. LMDB keeps its own reader
//! table but heed does not expose reader ages.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Slots (as many as LMDB reader slots the store opens with).
const SLOTS: usize = 1024;

pub(crate) struct Readers {
    epoch: Instant,
    slots: Box<[AtomicU64]>,
    /// Readers that found every slot taken (not timed, still counted).
    untracked: AtomicU64,
}

thread_local! {
    /// Where this thread starts probing, spreading threads over the table.
    static HINT: usize = NEXT_HINT.fetch_add(7, Ordering::Relaxed) % SLOTS;
}
static NEXT_HINT: AtomicUsize = AtomicUsize::new(0);

impl Readers {
    pub(crate) fn new() -> Readers {
        Readers {
            epoch: Instant::now(),
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            untracked: AtomicU64::new(0),
        }
    }

    /// A read transaction starts: its slot (None when none was free).
    pub(crate) fn enter(&self) -> Option<usize> {
        let now = self.epoch.elapsed().as_micros() as u64 + 1;
        let start = HINT.with(|h| *h);
        for i in 0..SLOTS {
            let s = (start + i) % SLOTS;
            if self.slots[s]
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Some(s);
            }
        }
        self.untracked.fetch_add(1, Ordering::Relaxed);
        None
    }

    pub(crate) fn leave(&self, slot: Option<usize>) {
        match slot {
            Some(s) => self.slots[s].store(0, Ordering::Relaxed),
            None => {
                self.untracked.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// (open read transactions, age of the oldest in microseconds).
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        let now = self.epoch.elapsed().as_micros() as u64 + 1;
        let mut open = self.untracked.load(Ordering::Relaxed);
        let mut oldest = 0u64;
        for s in self.slots.iter() {
            let t = s.load(Ordering::Relaxed);
            if t != 0 {
                open += 1;
                oldest = oldest.max(now.saturating_sub(t));
            }
        }
        (open, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ages() {
        let r = Readers::new();
        assert_eq!(r.snapshot(), (0, 0));
        let a = r.enter();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = r.enter();
        let (open, oldest) = r.snapshot();
        assert_eq!(open, 2);
        assert!(oldest >= 5000, "{oldest}");
        r.leave(a);
        r.leave(b);
        assert_eq!(r.snapshot().0, 0);
    }
}
