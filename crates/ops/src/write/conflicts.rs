//! The record of the conflicts multi-provider replication resolved: each
//! is stored in the transaction that resolves it (so a crash keeps both or
//! neither; the newest 10,000 are kept), logged as a warning, and listed
//! in `cn=Conflicts,cn=Replication,cn=Monitor` (the newest 1000), naming
//! the entry, what was lost and both CSNs, so an operator can see and
//! undo it. Secret values (passwords) are never shown, only counted.

use pando_store::{StoreError, View, WriteTxn};

/// Records kept in the store.
const KEPT: usize = 10_000;

/// Records cn=Monitor lists.
pub const LISTED: usize = 1000;

/// Bytes of values shown per record.
const SHOWN: usize = 1024;

/// Meta keys: the records (newest first in key order) and the count.
const PREFIX: &str = "conflict:";
const TOTAL: &str = "conflicts:total";

/// One resolution.
pub struct Conflict {
    /// The entry (its DN as held or received).
    pub dn: String,
    /// What happened, e.g. "concurrent changes of mail".
    pub what: String,
    /// The attribute whose values were lost, with them (None: nothing to
    /// show beyond `what`).
    pub lost: Option<(String, Vec<Vec<u8>>)>,
    /// Which copy lost: "here" or "received".
    pub side: &'static str,
    pub lost_csn: String,
    pub won_csn: String,
}

/// Values as shown: text when printable, else base64; secrets withheld.
pub fn shown_values(attr: &str, values: &[Vec<u8>]) -> String {
    // Recorded descriptions are the schema's canonical names.
    let secret = pando_model::secret::is_secret(attr);
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

/// The record's text.
pub fn line(c: &Conflict) -> String {
    let lost = lost_text(c);
    let at = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let lost_at = if c.lost_csn.is_empty() {
        String::new()
    } else {
        format!(", at {}", c.lost_csn)
    };
    format!(
        "{at} {}: {}{lost} (the {} copy{lost_at}; kept the change at {})",
        c.dn, c.what, c.side, c.won_csn
    )
}

fn lost_text(c: &Conflict) -> String {
    c.lost
        .as_ref()
        .map(|(attr, values)| format!("; lost {attr}: {}", shown_values(attr, values)))
        .unwrap_or_default()
}

/// In the resolving transaction: store the records `lines`, count them,
/// and drop the oldest beyond the newest 10,000.
pub fn store(w: &mut WriteTxn<'_>, lines: &[String]) -> Result<(), StoreError> {
    if lines.is_empty() {
        return Ok(());
    }
    let newest_first = u64::MAX - pando_store::clock::now_micros();
    for (i, line) in lines.iter().enumerate() {
        // Within one transaction the last resolved is listed first.
        let key = format!("{PREFIX}{newest_first:020}:{:04}", 9999 - i.min(9999));
        w.meta_put(&key, line.as_bytes())?;
    }
    let total = total(&w.view())? + lines.len() as u64;
    w.meta_put(TOTAL, total.to_string().as_bytes())?;
    let old: Vec<String> = w
        .view()
        .meta_scan(PREFIX, KEPT + lines.len())?
        .into_iter()
        .skip(KEPT)
        .map(|(k, _)| k)
        .collect();
    for k in old {
        w.meta_delete(&k)?;
    }
    Ok(())
}

/// After the commit: the warning in the server's log.
pub fn log(c: &Conflict) {
    tracing::warn!(
        entry = c.dn.as_str(),
        lost_csn = c.lost_csn.as_str(),
        won_csn = c.won_csn.as_str(),
        loser = c.side,
        "replication conflict resolved: {}{}",
        c.what,
        lost_text(c)
    );
}

/// Conflicts resolved by this store since it was made.
pub fn total(view: &View<'_>) -> Result<u64, StoreError> {
    Ok(view
        .meta_get(TOTAL)?
        .and_then(|v| String::from_utf8_lossy(&v).parse().ok())
        .unwrap_or(0))
}

/// The newest `max` records, newest first.
pub fn recent(view: &View<'_>, max: usize) -> Result<Vec<String>, StoreError> {
    Ok(view
        .meta_scan(PREFIX, max)?
        .into_iter()
        .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
        .collect())
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
        for secret in [
            "sambaNTPassword",
            "authPassword;x",
            "pwdHistory",
            "unicodePwd",
        ] {
            assert_eq!(
                shown_values(secret, &[b"8846F7EA".to_vec()]),
                "(1 values, not shown)"
            );
        }
        assert_eq!(
            shown_values("mail", &[b"a@x".to_vec(), b"b@x".to_vec()]),
            "a@x | b@x"
        );
        assert_eq!(shown_values("jpegPhoto", &[vec![0xff, 0]]), ":: /wA=");
        assert_eq!(shown_values("mail", &[]), "(no values)");
        let long = shown_values("description", &[vec![b'x'; 5000]]);
        assert!(long.len() < 1100 && long.ends_with("(1 values)"));
    }
}
