//! A consumer's lag in changes, per server ID: every `count_behind_secs`
//! (30 by default), it asks its
//! provider, on a short connection of its own made as the consumer's
//! (same URL, TLS and bind), how many operations the provider logged past
//! the consumer's stored cookie (Pando's `CHANGES_BEHIND_EXOP`, allowed to
//! authenticated identities that may read contextCSN). A provider that
//! does not know the operation (OpenLDAP's slapd) or refuses it to this
//! identity is not asked again until the next start; the lag in seconds
//! (`Status::delay`) does not need it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pando_proto::sync::Cookie;

use super::consumer::set;
use crate::ops::special::CHANGES_BEHIND_EXOP;
use crate::ops::write::replicated;
use crate::state::Server;
use pando_client::Client;

/// Changes a consumer lacks for one server ID, as its provider counted
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Behind {
    pub changes: u64,
    /// False when the provider's change log no longer reaches back to the
    /// consumer's CSN: `changes` is then a lower bound.
    pub complete: bool,
}

impl std::fmt::Display for Behind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = if self.complete { "=" } else { ">=" };
        write!(f, "changes{sign}{}", self.changes)
    }
}

/// Parse the provider's answer: `sid=001 changes=12` lines.
pub fn parse_answer(text: &str) -> Option<BTreeMap<u16, Behind>> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (sid, rest) = line.strip_prefix("sid=")?.split_once(" changes")?;
        let (complete, n) = match rest.strip_prefix(">=") {
            Some(n) => (false, n),
            None => (true, rest.strip_prefix('=')?),
        };
        let behind = Behind {
            changes: n.parse().ok()?,
            complete,
        };
        out.insert(u16::from_str_radix(sid, 16).ok()?, behind);
    }
    Some(out)
}

/// Count, every `count_behind_secs`, until the server closes or the
/// provider says it cannot or will not.
pub async fn follow(server: Arc<Server>, replica: Arc<super::Replica>) {
    let cfg = replica.cfg.clone();
    let replica = &*replica;
    if cfg.count_behind_secs == 0 {
        return;
    }
    let every = Duration::from_secs(cfg.count_behind_secs);
    let mut closing = server.rt.feed.closing();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = closing.changed() => return,
            _ = replica.stopped() => return,
        }
        let csns = match stored_csns(&server, cfg.rid) {
            Some(c) if !c.is_empty() => c,
            _ => continue, // nothing stored yet: the initial load runs
        };
        let asked = async {
            let endpoint = pando_client::Endpoint::from(&cfg);
            let mut client =
                Client::connect(&endpoint, server.cfg.config.limits.max_pdu_bytes).await?;
            client.bind(&endpoint).await?;
            let answer = client
                .extended(CHANGES_BEHIND_EXOP, csns.join(";").into_bytes())
                .await;
            client.unbind().await;
            answer
        };
        let asked = tokio::select! {
            a = asked => a,
            _ = replica.stopped() => return,
        };
        match asked {
            Ok(text) => match parse_answer(&String::from_utf8_lossy(&text)) {
                Some(behind) => set(replica, |s| s.behind = behind),
                None => {
                    tracing::warn!(rid = cfg.rid, provider = %cfg.provider, "the provider's count of changes behind is malformed")
                }
            },
            Err(e) if e.0.contains("(protocolError)") => {
                tracing::info!(rid = cfg.rid, provider = %cfg.provider, "the provider does not count changes behind (not a Pando server?): the lag is shown in seconds only");
                set(replica, |s| s.behind.clear());
                return;
            }
            Err(e) if e.0.contains("(insufficientAccessRights)") => {
                tracing::info!(rid = cfg.rid, provider = %cfg.provider, "the provider does not count changes behind for this consumer's identity (it needs to be authenticated and to read contextCSN): the lag is shown in seconds only");
                set(replica, |s| s.behind.clear());
                return;
            }
            Err(e) => tracing::debug!(rid = cfg.rid, "counting changes behind failed: {}", e.0),
        }
    }
}

/// The CSNs of the consumer's stored cookie.
fn stored_csns(server: &Server, rid: u16) -> Option<Vec<String>> {
    let rtxn = server.rt.store.read().ok()?;
    let text = replicated::stored_cookie(&rtxn.view(), rid).ok()??;
    Some(Cookie::parse(text.as_bytes()).ok()?.csns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_or_are_refused_whole() {
        let got = parse_answer("sid=000 changes=3\nsid=01a changes>=12\n").unwrap();
        assert_eq!(
            got[&0],
            Behind {
                changes: 3,
                complete: true
            }
        );
        assert_eq!(
            got[&0x1a],
            Behind {
                changes: 12,
                complete: false
            }
        );
        assert_eq!(got[&0x1a].to_string(), "changes>=12");
        assert!(parse_answer("").unwrap().is_empty());
        assert!(parse_answer("sid=000 changes=x\n").is_none());
        assert!(parse_answer("hello\n").is_none());
    }
}
