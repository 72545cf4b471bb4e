//! `pando repl status`: a suffix's contextCSN on several servers side by
//! side, per server ID, and how far behind the newest each server is: in
//! seconds (CSN times), and in changes as counted by the Pando server
//! holding the newest CSN (from its change log; see
//! `CHANGES_BEHIND_EXOP`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use pando_proto::Scope;
use pando_server::repl::lag::{parse_answer, Behind};

#[derive(clap::Args)]
pub struct ReplStatusArgs {
    /// Servers to compare: ldap://HOST:PORT or ldapi://PATH (percent-encoded).
    #[arg(required = true)]
    urls: Vec<String>,
    /// The suffix whose contextCSN is compared.
    #[arg(long, short = 'b', default_value = "dc=example,dc=com")]
    base: String,
    /// How to bind to every server.
    #[command(flatten)]
    bind: crate::ldap_client::BindArgs,
}

/// One server's contextCSN values, or why they could not be read.
fn read(args: &ReplStatusArgs, url: &str) -> Result<Vec<String>, String> {
    let mut l = args.bind.open(url)?;
    let found = l.search_all(&args.base, Scope::Base, &["contextCSN"])?;
    let mut csns: Vec<String> = found
        .into_values()
        .flat_map(|attrs| attrs.get("contextcsn").cloned().unwrap_or_default())
        .collect();
    csns.sort();
    Ok(csns)
}

fn sid(csn: &str) -> Option<u16> {
    pando_proto::sync::csn_sid(csn)
}

/// Seconds from `older` to `newer` (CSN times).
fn seconds_between(older: &str, newer: &str) -> Option<f64> {
    let (a, _) = pando_store::clock::parse_csn(older).ok()?;
    let (b, _) = pando_store::clock::parse_csn(newer).ok()?;
    Some(b.saturating_sub(a) as f64 / 1e6)
}

/// What one server holds for one server ID against the newest anywhere,
/// with the count of changes it lacks when known.
fn state(held: Option<&String>, newest: &str, changes: Option<Behind>) -> String {
    let changes = changes.map_or(String::new(), |b| match b.complete {
        true => format!(", {} changes", b.changes),
        false => format!(", at least {} changes", b.changes),
    });
    match held {
        None => format!("missing{changes}"),
        Some(h) if h.as_str() == newest => "in step".into(),
        Some(h) => match seconds_between(h, newest) {
            Some(s) => format!("behind {s:.1}s{changes}"),
            None => format!("behind{changes}"),
        },
    }
}

/// Per server ID, how many changes a server holding `csns` lacks, as the
/// server at `leader` counts them; empty when it cannot (not a Pando
/// server, or not allowed).
fn changes_behind(args: &ReplStatusArgs, leader: &str, csns: &[String]) -> BTreeMap<u16, Behind> {
    let oid = pando_server::ops::special::CHANGES_BEHIND_EXOP;
    let answer = args
        .bind
        .open(leader)
        .and_then(|mut l| l.extended(oid, csns.join(";").into_bytes()));
    answer
        .ok()
        .and_then(|text| parse_answer(&String::from_utf8_lossy(&text)))
        .unwrap_or_default()
}

/// Print the comparison; exit 0 when every server holds the newest CSN of
/// every server ID, 1 when one is behind, 2 when one cannot be read.
pub fn run(args: ReplStatusArgs) -> Result<ExitCode, String> {
    let read: Vec<(String, Result<Vec<String>, String>)> = args
        .urls
        .iter()
        .map(|u| (u.clone(), read(&args, u)))
        .collect();
    let mut newest: std::collections::BTreeMap<u16, String> = Default::default();
    for csn in read.iter().filter_map(|(_, r)| r.as_ref().ok()).flatten() {
        if let Some(s) = sid(csn) {
            let n = newest.entry(s).or_default();
            if csn > n {
                *n = csn.clone();
            }
        }
    }
    let width = args.urls.iter().map(String::len).max().unwrap_or(6).max(6);
    println!("{:width$}  sid  {:40}  state", "server", "contextCSN");
    let (mut behind, mut failed) = (false, false);
    for (url, r) in &read {
        let csns = match r {
            Ok(c) => c,
            Err(e) => {
                println!("{url:width$}  ---  {:40}  unreadable: {e}", "");
                failed = true;
                continue;
            }
        };
        if newest.is_empty() {
            println!("{url:width$}  ---  {:40}  no contextCSN anywhere", "");
        }
        let mut counted: BTreeMap<&str, BTreeMap<u16, Behind>> = BTreeMap::new();
        for (s, n) in &newest {
            let held = csns.iter().find(|c| sid(c) == Some(*s));
            let mut changes = None;
            if held != Some(n) {
                // Counted by a server that holds the newest CSN.
                let leader = read
                    .iter()
                    .find(|(_, r)| r.as_ref().is_ok_and(|c| c.contains(n)));
                if let Some((leader, _)) = leader {
                    let counts = counted
                        .entry(leader.as_str())
                        .or_insert_with(|| changes_behind(&args, leader, csns));
                    changes = counts.get(s).copied();
                }
            }
            let st = state(held, n, changes);
            behind |= st != "in step";
            let shown = held.map_or("-", |h| h.as_str());
            println!("{url:width$}  {s:03x}  {shown:40}  {st}");
        }
    }
    Ok(ExitCode::from(if failed {
        2
    } else if behind {
        1
    } else {
        0
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_name_the_lag() {
        let new = "20261125000010.500000Z#000000#001#000000".to_string();
        let old = "20261125000008.000000Z#000000#001#000000".to_string();
        assert_eq!(state(Some(&new), &new, None), "in step");
        assert_eq!(state(Some(&old), &new, None), "behind 2.5s");
        let behind = |changes, complete| Some(Behind { changes, complete });
        assert_eq!(
            state(Some(&old), &new, behind(3, true)),
            "behind 2.5s, 3 changes"
        );
        assert_eq!(
            state(None, &new, behind(7, false)),
            "missing, at least 7 changes"
        );
    }
}
