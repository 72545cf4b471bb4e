//! Timestamps and change sequence numbers for operational attributes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date from days since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn parts(micros: u64) -> String {
    let secs = (micros / 1_000_000) as i64;
    let (y, mo, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}{mo:02}{d:02}{:02}{:02}{:02}",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// GeneralizedTime with second precision, e.g. `20261122093000Z`.
pub fn generalized_time(micros: u64) -> String {
    format!("{}Z", parts(micros))
}

/// RFC 3339 time with microseconds, UTC: `2026-11-22T07:02:25.123456Z`.
pub fn rfc3339_micros(micros: u64) -> String {
    use std::cell::RefCell;
    use std::fmt::Write;
    thread_local! {
        /// The date-and-seconds part for the last second formatted on this
        /// thread (access-log lines come many per second).
        static LAST: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let secs = micros / 1_000_000;
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        if l.0 != secs {
            let p = parts(micros);
            l.1 = format!(
                "{}-{}-{}T{}:{}:{}",
                &p[0..4],
                &p[4..6],
                &p[6..8],
                &p[8..10],
                &p[10..12],
                &p[12..14]
            );
            l.0 = secs;
        }
        let mut out = String::with_capacity(28);
        out.push_str(&l.1);
        let _ = write!(out, ".{:06}Z", micros % 1_000_000);
        out
    })
}

/// Issues strictly increasing CSNs of the OpenLDAP form
/// `YYYYmmddHHMMSS.uuuuuuZ#cccccc#sid#000000`; the counter separates changes
/// within one microsecond.
pub struct CsnClock {
    last: AtomicU64,
    sid: u16,
}

impl CsnClock {
    pub fn new(sid: u16) -> Self {
        CsnClock {
            last: AtomicU64::new(0),
            sid,
        }
    }

    pub fn next(&self) -> String {
        let now = now_micros();
        // Packed as micros << 12 | counter so one atomic keeps both monotonic.
        let mut prev = self.last.load(Ordering::Relaxed);
        let packed = loop {
            let want = if (prev >> 12) >= now {
                prev + 1
            } else {
                now << 12
            };
            match self
                .last
                .compare_exchange_weak(prev, want, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break want,
                Err(p) => prev = p,
            }
        };
        let micros = packed >> 12;
        let count = packed & 0xfff;
        format!(
            "{}.{:06}Z#{count:06x}#{:03x}#000000",
            parts(micros),
            micros % 1_000_000,
            self.sid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(generalized_time(0), "19700101000000Z");
        // 2000-02-29 12:34:56 UTC
        assert_eq!(generalized_time(951_827_696_000_000), "20000229123456Z");
        assert_eq!(generalized_time(4_102_444_799_000_000), "20991231235959Z");
    }

    #[test]
    fn csns_increase() {
        let c = CsnClock::new(0);
        let mut last = String::new();
        for _ in 0..10_000 {
            let n = c.next();
            assert!(n > last, "{n} <= {last}");
            last = n;
        }
        assert_eq!(last.len(), "20261122093000.123456Z#000000#000#000000".len());
    }
}
