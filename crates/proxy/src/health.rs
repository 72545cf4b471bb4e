//! Health and lag: every `health_secs` (and at once when a connection to
//! a server fails) each server's root DSE is read; a server that does not
//! answer within `timeout_secs` leaves the rotation until it answers
//! again. With `max_lag_secs`, each server's contextCSN at `base` is read
//! too, and a replica behind the active provider (for some server ID, by
//! the CSNs' times) by more than that leaves the read rotation until it
//! catches up.

use std::sync::Arc;
use std::time::Duration;

use pando_client::Client;

use crate::csn::{self, Csns};
use crate::upstream::{Role, Upstream};
use crate::Proxy;

pub async fn run(proxy: Arc<Proxy>) {
    let period = Duration::from_secs(proxy.cfg.health_secs);
    loop {
        check_all(&proxy).await;
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = proxy.check_now.notified() => {
                // Several failures at once: one check after a short pause.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn check_all(proxy: &Arc<Proxy>) {
    // Together: one after another, dead servers' timeouts would add up.
    let handles: Vec<_> = proxy
        .upstreams
        .iter()
        .map(|u| {
            let (p, u) = (proxy.clone(), u.clone());
            tokio::spawn(async move { check(&p, &u).await })
        })
        .collect();
    let mut results: Vec<Result<Result<Csns, String>, String>> = Vec::with_capacity(handles.len());
    for h in handles {
        results.push(
            h.await
                .unwrap_or_else(|e| Err(format!("health check failed: {e}"))),
        );
    }
    let active = proxy
        .upstreams
        .iter()
        .zip(&results)
        .find(|(u, r)| u.role == Role::Provider && r.is_ok())
        .and_then(|(_, r)| r.as_ref().ok());
    let max_lag = proxy.cfg.max_lag_secs as f64;
    for (u, r) in proxy.upstreams.iter().zip(&results) {
        let Ok(csns) = r else {
            let why = r.as_ref().err().map_or("", |w| w.as_str());
            u.set_health(false, false, why);
            continue;
        };
        if max_lag == 0.0 || u.role != Role::Replica {
            u.set_health(true, false, "answering");
            continue;
        }
        let (lagging, why) = match (active, csns) {
            (Some(Ok(p)), Ok(mine)) => {
                let behind = csn::lag(p, mine);
                (
                    behind > max_lag,
                    format!("{behind:.1}s behind the active provider"),
                )
            }
            (Some(Err(why)), _) => (false, format!("the active provider's {why}")),
            (None, _) => (false, "no provider to compare with".to_string()),
            (_, Err(why)) => (true, why.clone()),
        };
        u.set_health(true, lagging, &why);
    }
}

/// Ok when the server answered; inside, its contextCSN or why not.
async fn check(proxy: &Proxy, u: &Upstream) -> Result<Result<Csns, String>, String> {
    let whole = proxy.cfg.timeout_secs * 2 + 1;
    let run = async {
        let mut c = Client::connect(&u.endpoint(), proxy.cfg.max_pdu_bytes)
            .await
            .map_err(|e| e.0)?;
        u.bind_control(&mut c).await?;
        // The root DSE answers (the check); its first naming context is
        // where contextCSN is read when `base` is not set.
        let contexts = csn::read(&mut c, "", "namingContexts").await?;
        let base = match (&proxy.cfg.base, contexts.first()) {
            (b, _) if !b.is_empty() => b.clone(),
            (_, Some(first)) => first.clone(),
            (_, None) => String::new(),
        };
        // contextCSN unreadable (no suffix, or not for this identity):
        // the server is healthy, and known to hold nothing (reads after a
        // write stay on the provider; with a lag check it is lagging).
        let csns = match base.is_empty() {
            true => Err("no naming context".to_string()),
            false => csn::read(&mut c, &base, "contextCSN").await,
        };
        let csns = match csns {
            Ok(values) => Ok(csn::from_values(&values)),
            Err(why) => Err(format!("contextCSN not readable: {why}")),
        };
        u.learned(&base, csns.clone().unwrap_or_default());
        c.unbind().await;
        Ok(csns)
    };
    match tokio::time::timeout(Duration::from_secs(whole), run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer to a health check within {whole}s")),
    }
}
