//! contextCSN values, read from a server and compared per server ID: how
//! the proxy knows whether a server holds a write (read your writes, the
//! write concern) and how far a replica is behind (the lag check).
//!
//! A CSN is `YYYYmmddHHMMSS.ffffffZ#count#sid#mod` (fixed widths), so
//! two CSNs of one server ID compare as text.

use std::collections::BTreeMap;

use pando_client::Client;
use pando_proto::{DerefAliases, Filter, ProtocolOp, ResultCode, Scope, SearchRequest};

/// A server's contextCSN: server ID → its newest CSN there.
pub type Csns = BTreeMap<String, String>;

/// The values of a contextCSN attribute, by server ID (the newest kept
/// where a server lists one ID twice).
pub fn from_values<'a>(values: impl IntoIterator<Item = &'a String>) -> Csns {
    let mut out = Csns::new();
    for v in values {
        let Some(sid) = v.split('#').nth(2) else {
            continue;
        };
        let newer = out.get(sid).is_none_or(|have| v > have);
        if newer {
            out.insert(sid.to_string(), v.clone());
        }
    }
    out
}

/// `have` holds everything `need` names: for each server ID of `need`, a
/// CSN at least as new.
pub fn covers(have: &Csns, need: &Csns) -> bool {
    need.iter()
        .all(|(sid, csn)| have.get(sid).is_some_and(|h| h >= csn))
}

/// How far `replica` is behind `provider`, in seconds of CSN time: the
/// largest gap over the provider's server IDs (infinite for an ID the
/// replica has never seen).
pub fn lag(provider: &Csns, replica: &Csns) -> f64 {
    provider
        .iter()
        .map(|(sid, p)| match (replica.get(sid), seconds(p)) {
            (Some(r), Some(pt)) => seconds(r).map_or(f64::INFINITY, |rt| (pt - rt).max(0.0)),
            (None, _) => f64::INFINITY,
            (_, None) => 0.0,
        })
        .fold(0.0, f64::max)
}

/// The CSN's time, in seconds since 1970.
pub fn seconds(csn: &str) -> Option<f64> {
    let time = csn.split('#').next()?;
    let digits = time.get(..14)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |a: usize, b: usize| digits[a..b].parse::<i64>().ok();
    let (y, mo, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (h, mi, s) = (n(8, 10)?, n(10, 12)?, n(12, 14)?);
    let frac = time
        .get(14..)
        .and_then(|f| f.strip_prefix('.'))
        .map(|f| f.trim_end_matches('Z'))
        .and_then(|f| format!("0.{f}").parse::<f64>().ok())
        .unwrap_or(0.0);
    let days = days_from_civil(y, mo, d);
    Some((days * 86_400 + h * 3600 + mi * 60 + s) as f64 + frac)
}

/// Days from 1970-01-01 to the given date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A base search of `dn` for one attribute: its values.
pub async fn read(c: &mut Client, dn: &str, attr: &str) -> Result<Vec<String>, String> {
    let req = SearchRequest {
        base: dn.to_string(),
        scope: Scope::Base,
        deref: DerefAliases::Never,
        size_limit: 1,
        time_limit: 0,
        types_only: false,
        filter: Filter::Present("objectClass".into()),
        attrs: vec![attr.to_string()],
    };
    let id = c
        .send(ProtocolOp::SearchRequest(req), Vec::new())
        .await
        .map_err(|e| e.0)?;
    let mut values = Vec::new();
    loop {
        let m = c.recv(Some(c.timeout())).await.map_err(|e| e.0)?;
        if m.id != id {
            continue;
        }
        match m.op {
            ProtocolOp::SearchResultEntry(e) => {
                let attrs = e
                    .attrs
                    .into_iter()
                    .filter(|a| a.name.eq_ignore_ascii_case(attr));
                for a in attrs {
                    values.extend(
                        a.values
                            .into_iter()
                            .map(|v| String::from_utf8_lossy(&v).into_owned()),
                    );
                }
            }
            ProtocolOp::SearchResultDone(r) if r.code == ResultCode::SUCCESS => return Ok(values),
            ProtocolOp::SearchResultDone(r) => {
                return Err(format!(
                    "reading {dn:?}: {} ({}) {}",
                    r.code.0,
                    r.code.name(),
                    r.message
                ))
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csns(list: &[&str]) -> Csns {
        let owned: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        from_values(&owned)
    }

    #[test]
    fn csns_compare_per_server_id_and_as_times() {
        assert!(
            (seconds("19700102000001.500000Z#000000#001#000000").unwrap() - 86_401.5).abs() < 1e-6
        );
        assert_eq!(
            seconds("20261129120000.000000Z#000000#000#000000").unwrap() as i64,
            1_795_953_600
        );
        assert!(seconds("garbage").is_none());
        let p = csns(&[
            "20261129120010.000000Z#000000#001#000000",
            "20261129120000.000000Z#000000#002#000000",
        ]);
        let r = csns(&[
            "20261129120007.000000Z#000000#001#000000",
            "20261129120000.000000Z#000000#002#000000",
        ]);
        assert_eq!(lag(&p, &r), 3.0);
        assert_eq!(lag(&r, &p), 0.0);
        assert!(lag(&p, &csns(&["20261129120010.000000Z#000000#001#000000"])).is_infinite());
        assert!(covers(&p, &r) && !covers(&r, &p));
        // The count breaks ties within one microsecond.
        let a = csns(&["20261129120010.000000Z#000001#001#000000"]);
        let b = csns(&["20261129120010.000000Z#000000#001#000000"]);
        assert!(covers(&a, &b) && !covers(&b, &a));
        // An ID listed twice: the newer.
        let two = csns(&[
            "20261129120010.000000Z#000000#001#000000",
            "20261129120011.000000Z#000000#001#000000",
        ]);
        assert_eq!(two["001"], "20261129120011.000000Z#000000#001#000000");
    }
}
