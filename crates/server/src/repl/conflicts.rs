//! The record of the conflicts multi-provider replication resolved: each
//! is counted, logged as a warning and kept (the newest 1000) for
//! `cn=Conflicts,cn=Replication,cn=Monitor`, naming the entry, what was
//! lost and both CSNs, so an operator can see and undo it. Secret values
//! (passwords) are never shown, only counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Records kept for cn=Monitor (the log has them all).
const KEPT: usize = 1000;

/// Bytes of values shown per record.
const SHOWN: usize = 1024;

/// One resolution.
pub struct Conflict<'a> {
    /// The entry (its DN as held or received).
    pub dn: &'a str,
    /// What happened, e.g. "concurrent changes of mail".
    pub what: String,
    /// The attribute whose values were lost, with them (None: nothing to
    /// show beyond `what`).
    pub lost: Option<(&'a str, &'a [Vec<u8>])>,
    /// Which copy lost: "here" or "received".
    pub side: &'a str,
    pub lost_csn: &'a str,
    pub won_csn: &'a str,
}

#[derive(Default)]
pub struct ConflictLog {
    total: AtomicU64,
    recent: Mutex<VecDeque<String>>,
}

/// Values as shown: text when printable, else base64; secrets withheld.
pub fn shown_values(attr: &str, values: &[Vec<u8>]) -> String {
    let secret = crate::ops::is_password(attr)
        || ["authPassword", "pwdHistory"]
            .iter()
            .any(|s| attr.eq_ignore_ascii_case(s));
    if values.is_empty() {
        return "(no values)".into();
    }
    if secret {
        return format!("({} values, not shown)", values.len());
    }
    let mut out = String::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        match std::str::from_utf8(v) {
            Ok(t) if !t.chars().any(char::is_control) => out.push_str(t),
            _ => {
                use base64::Engine;
                out.push_str(":: ");
                out.push_str(&base64::engine::general_purpose::STANDARD.encode(v));
            }
        }
        if out.len() > SHOWN {
            let mut cut = SHOWN;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str(&format!("… ({} values)", values.len()));
            break;
        }
    }
    out
}

impl ConflictLog {
    /// Count, log and keep `c`.
    pub fn record(&self, c: &Conflict<'_>) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let lost = c
            .lost
            .map(|(attr, values)| format!("; lost {attr}: {}", shown_values(attr, values)))
            .unwrap_or_default();
        tracing::warn!(
            entry = c.dn,
            lost_csn = c.lost_csn,
            won_csn = c.won_csn,
            loser = c.side,
            "replication conflict resolved: {}{lost}",
            c.what
        );
        let at = crate::clock::generalized_time(crate::clock::now_micros());
        let line = format!(
            "{at} {}: {}{lost} (the {} copy, at {}; kept the change at {})",
            c.dn, c.what, c.side, c.lost_csn, c.won_csn
        );
        if let Ok(mut r) = self.recent.lock() {
            if r.len() == KEPT {
                r.pop_back();
            }
            r.push_front(line);
        }
    }

    /// Conflicts resolved since the start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The newest records, newest first.
    pub fn recent(&self) -> Vec<String> {
        self.recent
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_counted_not_shown_and_binary_is_base64() {
        assert_eq!(
            shown_values("userPassword", &[b"secret".to_vec()]),
            "(1 values, not shown)"
        );
        assert_eq!(
            shown_values("mail", &[b"a@x".to_vec(), b"b@x".to_vec()]),
            "a@x | b@x"
        );
        assert_eq!(shown_values("jpegPhoto", &[vec![0xff, 0]]), ":: /wA=");
        assert_eq!(shown_values("mail", &[]), "(no values)");
        let long = shown_values("description", &[vec![b'x'; 5000]]);
        assert!(long.len() < 1100 && long.ends_with("(1 values)"));
    }

    #[test]
    fn records_are_kept_newest_first_and_counted() {
        let log = ConflictLog::default();
        for i in 0..(KEPT + 5) {
            log.record(&Conflict {
                dn: &format!("cn={i}"),
                what: "concurrent changes of mail".into(),
                lost: Some(("mail", &[b"old".to_vec()])),
                side: "here",
                lost_csn: "1",
                won_csn: "2",
            });
        }
        assert_eq!(log.total(), (KEPT + 5) as u64);
        let recent = log.recent();
        assert_eq!(recent.len(), KEPT);
        assert!(recent[0].contains(&format!("cn={}: ", KEPT + 4)));
        assert!(recent[0].contains("lost mail: old (the here copy, at 1; kept the change at 2)"));
    }
}
