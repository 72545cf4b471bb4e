//! What happens after a write succeeds, before the client hears of it:
//! the session's fence (read your writes: its later reads go only to
//! servers whose contextCSN covers the provider's right after the write)
//! and the write concern (`acknowledge = "replicas:N"`: success is
//! answered once N other servers cover it).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pando_proto::{DecodeLimits, LdapMessage, LdapResult, ProtocolOp, ResultCode};
use tokio::sync::oneshot;

use crate::csn::{self, Csns};
use crate::upstream::Role;
use crate::Proxy;

/// Where a session's reads may go after its last write.
#[derive(Clone, Debug)]
pub struct Fence {
    /// The server that took the write (it holds it).
    pub provider: usize,
    /// Its contextCSN just after; None when it could not be read (then
    /// reads stay on the provider).
    pub csns: Option<Csns>,
}

pub type SharedFence = Arc<Mutex<Option<Fence>>>;

/// How often waiting writes look at the other servers' contextCSN.
const POLL: Duration = Duration::from_millis(5);

/// Await a write's last response; when it is a success, set the fence and
/// wait for the write concern; then pass the response on.
pub async fn settle(
    proxy: Arc<Proxy>,
    provider: usize,
    held: oneshot::Receiver<Vec<u8>>,
    out: crate::link::ClientTx,
    fence: SharedFence,
    request_tag: u8,
) {
    let Ok(bytes) = held.await else {
        return;
    };
    let decoded = LdapMessage::decode(&bytes, &DecodeLimits::default()).ok();
    let succeeded = decoded
        .as_ref()
        .and_then(|m| result_code(&m.op))
        .is_some_and(|c| c == ResultCode::SUCCESS);
    if !succeeded {
        out.send(bytes);
        return;
    }
    let up = &proxy.upstreams[provider];
    let need = up.context_csns(Duration::ZERO).await.ok();
    if proxy.cfg.read_your_writes {
        if let Ok(mut f) = fence.lock() {
            *f = Some(Fence {
                provider,
                csns: need.clone(),
            });
        }
    }
    let n = proxy.cfg.acknowledge_replicas().unwrap_or(0);
    let copies = match (&need, n) {
        (_, 0) => Ok(()),
        (Some(need), n) => wait_for_copies(&proxy, provider, need, n).await,
        (None, _) => Err(format!(
            "{}: its contextCSN could not be read to know where the change is",
            up.url
        )),
    };
    let reply = match (copies, decoded) {
        (Ok(()), _) | (Err(_), None) => bytes,
        (Err(why), Some(m)) => {
            let why = format!("the change was made on {} but {why}", up.url);
            match ProtocolOp::response_for(
                request_tag,
                LdapResult::new(ResultCode::UNAVAILABLE, why),
            ) {
                Some(op) => LdapMessage { op, ..m }.to_bytes(),
                None => bytes,
            }
        }
    };
    out.send(reply);
}

fn result_code(op: &ProtocolOp) -> Option<ResultCode> {
    Some(match op {
        ProtocolOp::ExtendedResponse(r) => r.result.code,
        ProtocolOp::ModifyResponse(r)
        | ProtocolOp::AddResponse(r)
        | ProtocolOp::DelResponse(r)
        | ProtocolOp::ModifyDnResponse(r) => r.code,
        _ => return None,
    })
}

/// Until `n` servers other than `provider` cover `need`, within the
/// configured timeout.
async fn wait_for_copies(
    proxy: &Proxy,
    provider: usize,
    need: &Csns,
    n: usize,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(proxy.cfg.acknowledge_timeout_secs);
    loop {
        let mut have = 0;
        for (i, u) in proxy.upstreams.iter().enumerate() {
            if i == provider || !u.is_healthy() {
                continue;
            }
            if let Ok(c) = u.context_csns(POLL).await {
                if csn::covers(&c, need) {
                    have += 1;
                }
            }
        }
        if have >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "only {have} of the {n} other servers asked for held it after {}s",
                proxy.cfg.acknowledge_timeout_secs
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Where a read of a session goes: as any read while it has no fence;
/// else a replica in rotation known to cover the fence (the one balancing
/// picks is asked afresh when none is known to), else the provider that
/// took the write.
pub async fn read_target(proxy: &Proxy, fence: &SharedFence) -> Option<usize> {
    let f = fence.lock().ok().and_then(|f| f.clone());
    let Some(f) = f else {
        return proxy.read_target(|_| true);
    };
    let provider = || {
        let p = &proxy.upstreams[f.provider];
        (p.is_healthy())
            .then_some(f.provider)
            .or_else(|| proxy.read_target(|_| true))
    };
    let Some(need) = &f.csns else {
        return provider();
    };
    let holds = |u: &crate::upstream::Upstream| csn::covers(&u.known().0, need);
    if let Some(u) = proxy.read_target(holds) {
        if proxy.replicas_in_rotation().all(holds) {
            // Every replica has it: the fence has done its work.
            if let Ok(mut f) = fence.lock() {
                *f = None;
            }
        }
        return Some(u);
    }
    if let Some(u) = proxy.read_target(|_| true) {
        let up = &proxy.upstreams[u];
        if up.role == Role::Replica {
            let fresh = up.context_csns(POLL).await;
            if fresh.is_ok_and(|c| csn::covers(&c, need)) {
                return Some(u);
            }
        }
    }
    provider()
}
