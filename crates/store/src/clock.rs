//! Timestamps and change sequence numbers (CSNs) for operational
//! attributes: the clock that makes them resumes after the newest CSN the
//! store records, so they keep increasing across restarts.

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

/// Days since 1970-01-01 for a civil date (the inverse of `civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn parts(micros: u64) -> String {
    let mut out = String::with_capacity(CSN_LEN);
    push_parts(&mut out, micros);
    out
}

/// The length of a CSN text.
const CSN_LEN: usize = "YYYYmmddHHMMSS.uuuuuuZ#cccccc#sss#000000".len();

/// [`parts`] appended to `out`, digit by digit (every write takes a CSN:
/// the formatting machinery cost more than the rest of it).
fn push_parts(out: &mut String, micros: u64) {
    let secs = (micros / 1_000_000) as i64;
    let (y, mo, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    push_radix(out, y.max(0) as u64, 4, 10);
    for v in [mo as i64, d as i64, s / 3600, s % 3600 / 60, s % 60] {
        push_radix(out, v as u64, 2, 10);
    }
}

/// `v` in `radix` (10 or 16, lowercase), zero-padded to `width` digits
/// (more when it needs them).
fn push_radix(out: &mut String, mut v: u64, width: usize, radix: u64) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    while v > 0 || n < width {
        digits[n] = b"0123456789abcdef"[(v % radix) as usize];
        v /= radix;
        n += 1;
    }
    out.extend(digits[..n].iter().rev().map(|&b| b as char));
}

pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The time of `micros` to the second as CSNs begin (`YYYYmmddHHMMSS`):
/// every CSN of that second or later sorts after it, every earlier one
/// before it.
pub fn csn_floor(micros: u64) -> String {
    parts(micros)
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

/// Bits of the packed clock state given to the counter (the rest hold
/// microseconds since the epoch, enough until the year 2112).
const COUNT_BITS: u32 = 12;

/// A CSN text that is not of the form `CsnClock` issues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCsn(pub String);

impl std::fmt::Display for BadCsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not a CSN of the form YYYYmmddHHMMSS.uuuuuuZ#cccccc#sid#000000: {:?}",
            self.0
        )
    }
}

impl std::error::Error for BadCsn {}

/// Issues strictly increasing CSNs of the OpenLDAP form
/// `YYYYmmddHHMMSS.uuuuuuZ#cccccc#sid#000000`; the counter separates changes
/// within one microsecond.
///
/// Invariant: every CSN issued is greater (as text, which is how CSNs are
/// compared) than every CSN issued before and than every CSN given to
/// `resume_after`. When the wall clock is behind that point (a clock step
/// backwards, or a restart onto a store written with a clock ahead of this
/// one) the clock keeps counting up from it instead of following the wall.
pub struct CsnClock {
    /// `micros << COUNT_BITS | counter`, so one atomic keeps both monotonic.
    last: AtomicU64,
    /// The server ID CSNs carry (`replication.server_id`; changes while
    /// serving).
    sid: std::sync::atomic::AtomicU16,
}

impl CsnClock {
    pub fn new(sid: u16) -> Self {
        CsnClock {
            last: AtomicU64::new(0),
            sid: std::sync::atomic::AtomicU16::new(sid),
        }
    }

    /// CSNs issued from now on carry `sid`.
    pub fn set_sid(&self, sid: u16) {
        self.sid.store(sid, Ordering::Relaxed);
    }

    /// Move the clock so that every later CSN is greater than `csn` (the
    /// newest CSN stored, read back at start). Never moves it backwards.
    pub fn resume_after(&self, csn: &str) -> Result<(), BadCsn> {
        let (micros, count) = parse_csn(csn)?;
        // A counter wider than ours (OpenLDAP allows 24 bits) is passed by
        // starting the next microsecond, which sorts after any counter.
        let packed = if count < 1 << COUNT_BITS {
            micros << COUNT_BITS | count
        } else {
            (micros + 1) << COUNT_BITS
        };
        self.last.fetch_max(packed, Ordering::Relaxed);
        Ok(())
    }

    pub fn next(&self) -> String {
        let now = now_micros();
        let mut prev = self.last.load(Ordering::Relaxed);
        let packed = loop {
            let want = if (prev >> COUNT_BITS) >= now {
                prev + 1
            } else {
                now << COUNT_BITS
            };
            match self
                .last
                .compare_exchange_weak(prev, want, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break want,
                Err(p) => prev = p,
            }
        };
        let micros = packed >> COUNT_BITS;
        let count = packed & ((1 << COUNT_BITS) - 1);
        let mut csn = String::with_capacity(CSN_LEN);
        push_parts(&mut csn, micros);
        csn.push('.');
        push_radix(&mut csn, micros % 1_000_000, 6, 10);
        csn.push_str("Z#");
        push_radix(&mut csn, count, 6, 16);
        csn.push('#');
        push_radix(&mut csn, self.sid.load(Ordering::Relaxed) as u64, 3, 16);
        csn.push_str("#000000");
        csn
    }
}

/// The time (microseconds since the epoch) and counter of a CSN text
/// `YYYYmmddHHMMSS.uuuuuuZ#cccccc#sid#000000`. The server ID and the
/// modification number are checked for form only: they do not order CSNs
/// of one server.
pub fn parse_csn(csn: &str) -> Result<(u64, u64), BadCsn> {
    let bad = || BadCsn(csn.chars().take(64).collect());
    let mut fields = csn.split('#');
    let (Some(time), Some(count), Some(sid), Some(modn), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(bad());
    };
    let hex = |s: &str, max_len: usize| {
        if s.is_empty() || s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(s, 16).ok()
    };
    let count = hex(count, 6).ok_or_else(bad)?;
    hex(sid, 3).ok_or_else(bad)?;
    hex(modn, 6).ok_or_else(bad)?;
    // `YYYYmmddHHMMSS.uuuuuuZ`: fixed width, digits only where digits go.
    let b = time.as_bytes();
    if b.len() != 22 || b[14] != b'.' || b[21] != b'Z' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let d = &b[r];
        d.iter()
            .all(u8::is_ascii_digit)
            .then(|| d.iter().fold(0u64, |n, c| n * 10 + u64::from(c - b'0')))
    };
    let field = |r| num(r).ok_or_else(bad);
    let (y, mo, d) = (field(0..4)?, field(4..6)?, field(6..8)?);
    let (h, mi, s, us) = (
        field(8..10)?,
        field(10..12)?,
        field(12..14)?,
        field(15..21)?,
    );
    // Day 31 of a short month is not checked against the month: it would
    // only move the time a day or so forward, which is safe for a seed.
    if y < 1970 || !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60
    {
        return Err(bad());
    }
    let days = days_from_civil(y as i64, mo as u32, d as u32) as u64;
    let micros = ((days * 86_400 + h * 3600 + mi * 60 + s) * 1_000_000) + us;
    // The packed state must hold micros + 1 shifted by the counter bits.
    if micros >= (1 << (64 - COUNT_BITS)) - 1 {
        return Err(bad());
    }
    Ok((micros, count))
}

/// A clock for this server that resumes after the newest CSN `store`
/// records (of any server ID: the newest context CSN), so CSNs keep
/// increasing across restarts even when the wall clock went back
/// meanwhile, and a change made here is newer than every one it follows. A stored CSN that cannot be
/// read does not stop the server (it is replication metadata, not data):
/// it is logged and the clock starts from the wall clock.
pub fn clock_for_store(store: &crate::Store, sid: u16) -> CsnClock {
    let clock = CsnClock::new(sid);
    let stored = store.read().and_then(|r| r.view().newest_csn());
    match stored {
        Ok(Some(text)) => {
            if let Err(e) = clock.resume_after(&text) {
                tracing::warn!("stored contextCSN ignored, CSNs start from the wall clock: {e}");
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!("cannot read the stored contextCSN, CSNs start from the wall clock: {e}")
        }
    }
    clock
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
    fn csns_are_written_as_the_formatting_machinery_would() {
        let c = CsnClock::new(0x2a);
        for micros in [
            0,
            951_827_696_000_001,
            3_000_000_000_123_456,
            4_102_444_799_999_999,
        ] {
            c.last
                .store(micros << COUNT_BITS | 0xabc, Ordering::Relaxed);
            let secs = (micros / 1_000_000) as i64;
            let (y, mo, d) = civil(secs.div_euclid(86_400));
            let s = secs.rem_euclid(86_400);
            let want = format!(
                "{y:04}{mo:02}{d:02}{:02}{:02}{:02}.{:06}Z#{:06x}#{:03x}#000000",
                s / 3600,
                s % 3600 / 60,
                s % 60,
                micros % 1_000_000,
                0xabd,
                0x2a
            );
            // The wall clock is behind: the next CSN counts on from the stored one.
            if micros > now_micros() {
                assert_eq!(c.next(), want);
                assert_eq!(c.next().len(), CSN_LEN);
            }
            assert_eq!(generalized_time(micros), format!("{}Z", &want[..14]));
        }
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

    #[test]
    fn civil_days_round_trip() {
        for days in [-1, 0, 59, 365, 10_957, 11_016, 47_481, 51_134] {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn csn_parse_format_round_trip() {
        let c = CsnClock::new(0x2a);
        for _ in 0..100 {
            let csn = c.next();
            let (micros, count) = parse_csn(&csn).unwrap();
            assert_eq!(c.last.load(Ordering::Relaxed), micros << COUNT_BITS | count);
        }
        assert_eq!(
            parse_csn("20000229123456.000007Z#00000a#000#000000"),
            Ok((951_827_696_000_007, 10))
        );
    }

    #[test]
    fn a_clock_resumed_after_a_future_csn_issues_greater_csns() {
        // As after a restart onto a store last written in 2099: the wall
        // clock is far behind, and CSNs still go up from the stored one.
        let stored = "20991231235959.999999Z#000005#000#000000";
        let c = CsnClock::new(0);
        c.resume_after(stored).unwrap();
        let mut last = stored.to_string();
        for _ in 0..5000 {
            let n = c.next();
            assert!(n > last, "{n} <= {last}");
            last = n;
        }
        // A counter wider than ours moves to the next microsecond.
        let c = CsnClock::new(0);
        c.resume_after("20991231235959.999999Z#ffffff#000#000000")
            .unwrap();
        assert_eq!(c.next(), "21000101000000.000000Z#000001#000#000000");
        // Resuming never moves the clock back.
        c.resume_after("19991231235959.000000Z#000000#000#000000")
            .unwrap();
        assert!(c.next().starts_with("2100"));
    }

    #[test]
    fn a_clock_for_a_store_resumes_after_its_context_csn() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(
            dir.path(),
            std::sync::Arc::new(pando_model::Schema::standard()),
            &crate::StoreOptions::default(),
        )
        .unwrap();
        let put = |v: &'static [u8]| {
            store
                .write_blocking(move |w| w.meta_put("context_csn:000", v))
                .unwrap()
        };
        let stored = "20991231235959.999999Z#000005#000#000000";
        put(stored.as_bytes());
        assert!(clock_for_store(&store, 0).next().as_str() > stored);
        // Unreadable: logged, and the clock follows the wall clock.
        put(b"garbage");
        let n = clock_for_store(&store, 0).next();
        assert!(parse_csn(&n).is_ok() && n.as_str() < stored, "{n}");
        store.close();
    }

    #[test]
    fn garbage_csns_are_rejected() {
        for bad in [
            "",
            "garbage",
            "20991231235959.999999Z",
            "20991231235959.999999Z#000000#000",
            "20991231235959.999999Z#000000#000#000000#0",
            "2099123123595.9999999Z#000000#000#000000",
            "20991331235959.999999Z#000000#000#000000",
            "19691231235959.999999Z#000000#000#000000",
            "99991231235959.999999Z#000000#000#000000",
            "20991231235959.999999Z#zz0000#000#000000",
            "20991231235959.999999Z#0000000#000#000000",
            "2099123123595\u{e9}.99999Z#000000#000#000000",
        ] {
            let c = CsnClock::new(0);
            assert!(c.resume_after(bad).is_err(), "{bad:?}");
            assert_eq!(c.last.load(Ordering::Relaxed), 0, "{bad:?}");
        }
    }
}
