//! `pando repl status`: a suffix's contextCSN on several servers side by
//! side, per server ID, and how far behind the newest each server is.

use std::process::ExitCode;

use pando_proto::Scope;

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
    let (a, _) = pando_server::clock::parse_csn(older).ok()?;
    let (b, _) = pando_server::clock::parse_csn(newer).ok()?;
    Some(b.saturating_sub(a) as f64 / 1e6)
}

/// What one server holds for one server ID against the newest anywhere.
fn state(held: Option<&String>, newest: &str) -> String {
    match held {
        None => "missing".into(),
        Some(h) if h.as_str() == newest => "in step".into(),
        Some(h) => match seconds_between(h, newest) {
            Some(s) => format!("behind {s:.1}s"),
            None => "behind".into(),
        },
    }
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
        for (s, n) in &newest {
            let held = csns.iter().find(|c| sid(c) == Some(*s));
            let st = state(held, n);
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
        assert_eq!(state(Some(&new), &new), "in step");
        assert_eq!(state(Some(&old), &new), "behind 2.5s");
        assert_eq!(state(None, &new), "missing");
    }
}
