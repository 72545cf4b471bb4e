//! A consumer with `config = true` also follows its provider's shared
//! configuration (`cn_config::shared`): every few seconds it reads the
//! provider's shared keys and their stamps (`CONFIG_STATE_EXOP`, as an
//! administrator there) and commits, as one change of this server's
//! configuration, every key stamped later there than here, with the
//! provider's stamps. A key this server refuses (its schema in use here,
//! say) is logged and tried again at the next pass.

use std::sync::Arc;
use std::time::Duration;

use pando_client::Client;

use super::Replica;
use crate::cn_config::shared;
use crate::live::{Live, Stamp};
use crate::state::Server;

/// Time between two readings of the provider's configuration.
const EVERY: Duration = Duration::from_secs(3);

/// Follow `replica`'s provider's configuration until the consumer ends
/// (nothing when it does not ask to).
pub(super) async fn follow(server: Arc<Server>, replica: Arc<Replica>) {
    if !replica.cfg.config {
        return;
    }
    let mut closing = server.rt.feed.closing();
    let mut last_error = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = closing.changed() => return,
            _ = replica.stopped() => return,
        }
        match once(&server.current(), &replica).await {
            Ok(keys) if !keys.is_empty() => {
                tracing::info!(rid = replica.rid, provider = %replica.cfg.provider, keys = %keys.join(", "), "configuration taken from the provider");
                last_error.clear();
            }
            Ok(_) => last_error.clear(),
            // Said once until it changes: the provider may be down for long.
            Err(e) if e != last_error => {
                tracing::warn!(rid = replica.rid, provider = %replica.cfg.provider, "the provider's configuration was not followed: {e}");
                last_error = e;
            }
            Err(_) => {}
        }
    }
}

/// One reading; the keys taken.
async fn once(server: &Arc<Server>, replica: &Replica) -> Result<Vec<String>, String> {
    let endpoint = pando_client::Endpoint::from(&replica.cfg);
    let mut client = Client::connect(&endpoint, server.cfg.config.limits.max_pdu_bytes)
        .await
        .map_err(|e| e.0)?;
    client.bind(&endpoint).await.map_err(|e| e.0)?;
    let answer = client
        .extended(crate::ops::special::CONFIG_STATE_EXOP, Vec::new())
        .await;
    client.unbind().await;
    let text = String::from_utf8(answer.map_err(|e| e.0)?)
        .map_err(|_| "the provider's configuration is not UTF-8".to_string())?;
    let (there, stamps_there) = shared::parse_state(&text)?;
    let live = live_of(server)?;
    let _changing = live.changing().await;
    let current = live.server();
    let stamps_here = {
        let rtxn = current.rt.store.read().map_err(|e| e.to_string())?;
        crate::cn_config::stored::stamps(&rtxn.view()).map_err(|e| e.to_string())?
    };
    let keys = shared::newer(&stamps_here, &stamps_there);
    if keys.is_empty() {
        return Ok(keys);
    }
    let (desired, copied) = shared::taken(&current.desired, &there, &stamps_there, &keys);
    live.commit(desired, None, false, Stamp::Copied(copied))
        .await
        .map_err(|e| format!("keys {}: {e}", keys.join(", ")))?;
    Ok(keys)
}

/// The running configuration's handle, from the cn=config tree.
fn live_of(server: &Server) -> Result<Arc<Live>, String> {
    server
        .rt
        .config_tree
        .as_any()
        .downcast_ref::<crate::cn_config::serve::Tree>()
        .and_then(|t| t.live.upgrade())
        .ok_or_else(|| "this server's configuration cannot be changed now".to_string())
}
