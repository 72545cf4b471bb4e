//! A consumer: one task per `[[replication.consumer]]` that keeps its
//! subtree in step with the provider (RFC 4533, as OpenLDAP's `syncrepl`).
//!
//! A session connects, binds, and sends the search with a Sync Request
//! control carrying the cookie stored with the data (none the first time).
//! What comes back is applied through the write pipeline
//! (`ops::write::replicated`): entries by UUID, deletes, present UUIDs.
//! During the refresh, entries are queued on the writer many at a time
//! (one commit serves a batch) and the refresh's cookie is stored only
//! after all of them are in; in the persist stage each change is applied
//! with its cookie in one transaction. A crash at any moment therefore
//! resumes from a cookie whose changes are all stored (some may come
//! again; an entry is not replaced by one that is not newer).
//!
//! A present phase (refreshDeletes FALSE) ends by deleting every entry of
//! the subtree the provider did not mention. e-syncRefreshRequired (4096)
//! starts over at once without a cookie, asking for a reload. Any other
//! failure (connection, bind, a malformed or out-of-order message, a
//! change that cannot be applied) ends the session with a logged error
//! naming the problem; the data and the cookie stay as they were, and the
//! next try follows the `retry` schedule. refreshOnly sessions repeat
//! every `interval`.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use pando_model::{Attribute, Dn, Entry};
use pando_proto::sync::{
    uuid_text, Cookie, SyncDone, SyncInfo, SyncMode, SyncRequest, SyncState, SyncStateKind,
};
use pando_proto::{
    oid, Control, DerefAliases, Filter, LdapMessage, ProtocolOp, ResultCode, Scope, SearchRequest,
};

use super::client::{Client, ClientError};
use super::config::{ConsumerConfig, Retry};
use super::Replica;
use crate::ops::write::replicated::{self, apply_received, Received, ReplCtx};
use crate::ops::write::WriteCtx;
use crate::state::{Identity, Server, Session};

/// How a consumer is doing (cn=Monitor, `pando stat`).
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub provider: String,
    /// `connecting`, `refresh`, `persist`, `idle` (between refreshOnly
    /// sessions), `retrying` or `stopped`.
    pub phase: &'static str,
    /// Microseconds since the epoch.
    pub last_connect: Option<u64>,
    /// When the provider last sent anything.
    pub last_contact: Option<u64>,
    pub last_cookie: Option<String>,
    pub last_error: Option<String>,
    /// Entries added or changed, and deleted, from the provider.
    pub applied: u64,
    pub deleted: u64,
    pub refreshes: u64,
    /// Reloads asked for by the provider (4096).
    pub reloads: u64,
    pub failures: u64,
    /// Per server ID: how long after its CSN's time the last change of
    /// that server reached this consumer (persist stage), microseconds.
    pub delay: std::collections::BTreeMap<u16, u64>,
}

impl Status {
    pub fn new(provider: &str) -> Status {
        Status {
            provider: provider.to_string(),
            phase: "connecting",
            ..Status::default()
        }
    }
}

/// Entries queued on the writer at once during a refresh.
const WINDOW: usize = 256;

/// Start every configured consumer; each runs until the server closes.
pub fn start_all(server: &Arc<Server>) {
    for i in 0..server.cfg.config.replication.consumer.len() {
        let server = server.clone();
        tokio::spawn(async move { run(server, i).await });
    }
}

fn now() -> u64 {
    crate::clock::now_micros()
}

/// How a session ended without an error.
enum Ended {
    /// refreshOnly: the refresh is done; wait for the interval.
    Refreshed,
    /// The provider asked for a reload (4096).
    Reload,
}

/// A failed session: what went wrong, for the log and cn=Monitor.
struct Failed(String);

impl From<ClientError> for Failed {
    fn from(e: ClientError) -> Self {
        Failed(e.0)
    }
}

impl From<crate::error::LdapError> for Failed {
    fn from(e: crate::error::LdapError) -> Self {
        Failed(format!(
            "applying a change failed: {} ({})",
            e.message,
            e.code.name()
        ))
    }
}

impl From<pando_store::StoreError> for Failed {
    fn from(e: pando_store::StoreError) -> Self {
        Failed(format!("the store: {e}"))
    }
}

async fn run(server: Arc<Server>, index: usize) {
    let cfg = server.cfg.config.replication.consumer[index].clone();
    let replica = &server.replicas.0[index];
    let retry = Retry::parse(&cfg.retry).unwrap_or(Retry(vec![(Duration::from_secs(60), None)]));
    let interval = cfg
        .interval
        .duration()
        .unwrap_or(Duration::from_secs(86_400));
    let mut closing = server.feed.closing();
    let mut failures = 0u32;
    let mut reload = false;
    loop {
        set(replica, |s| s.phase = "connecting");
        let ended = tokio::select! {
            e = session(&server, &cfg, replica, reload) => e,
            _ = closing.changed() => break,
        };
        let wait = match ended {
            Ok(Ended::Refreshed) => {
                failures = 0;
                reload = false;
                set(replica, |s| s.phase = "idle");
                interval
            }
            Ok(Ended::Reload) => {
                tracing::warn!(rid = cfg.rid, provider = %cfg.provider, "the provider asked for a reload (e-syncRefreshRequired): refreshing the whole subtree");
                set(replica, |s| s.reloads += 1);
                reload = true;
                continue;
            }
            Err(Failed(why)) => {
                failures += 1;
                set(replica, |s| {
                    s.failures += 1;
                    s.phase = "retrying";
                    s.last_error = Some(why.clone());
                });
                match retry.wait(failures) {
                    Some(w) => {
                        tracing::warn!(rid = cfg.rid, provider = %cfg.provider, "replication failed, next try in {}s: {why}", w.as_secs());
                        w
                    }
                    None => {
                        tracing::error!(rid = cfg.rid, provider = %cfg.provider, "replication failed and the retry schedule ('{}') is used up; it stops until the server restarts: {why}", cfg.retry);
                        set(replica, |s| s.phase = "stopped");
                        return;
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = closing.changed() => break,
        }
    }
    set(replica, |s| s.phase = "stopped");
}

fn set(replica: &Replica, f: impl FnOnce(&mut Status)) {
    if let Ok(mut s) = replica.status.lock() {
        f(&mut s);
    }
}

/// What one session needs besides the client.
struct Session2<'a> {
    server: &'a Arc<Server>,
    cfg: &'a ConsumerConfig,
    replica: &'a Replica,
    who: Identity,
    /// Changes queued on the writer and not yet answered (refresh only).
    queued: VecDeque<
        std::pin::Pin<
            Box<
                dyn std::future::Future<Output = crate::error::OpResult<crate::ops::write::Written>>
                    + Send,
            >,
        >,
    >,
    /// UUIDs the provider mentioned in a present phase.
    present: HashSet<[u8; 16]>,
    /// The refresh is over (persist stage).
    persisting: bool,
    /// Set by the writer when one of this session's changes fails.
    failed: Arc<std::sync::atomic::AtomicBool>,
}

async fn session(
    server: &Arc<Server>,
    cfg: &ConsumerConfig,
    replica: &Replica,
    reload: bool,
) -> Result<Ended, Failed> {
    let mut client = Client::connect(cfg, server.cfg.config.limits.max_pdu_bytes).await?;
    client.bind(cfg).await?;
    set(replica, |s| {
        s.last_connect = Some(now());
        s.phase = "refresh";
        s.refreshes += 1;
    });
    let stored = {
        let rtxn = server.store.read()?;
        let view = rtxn.view();
        match replicated::stored_cookie(&view, cfg.rid)? {
            Some(c) => Some(c),
            // Never synchronised, yet the subtree is here (a provider's
            // backup restored, or its export imported with entryCSN and
            // entryUUID): its contextCSN is the state it holds, so only
            // what changed since is sent.
            None if matches!(
                view.lookup_norm(&split_norm(&replica.base))?,
                pando_store::Lookup::Found(_)
            ) =>
            {
                let csns = view.context_csns()?;
                (!csns.is_empty()).then(|| {
                    tracing::info!(
                        rid = cfg.rid,
                        "no cookie yet: starting from the store's contextCSN ({})",
                        csns.join(";")
                    );
                    Cookie {
                        csns,
                        ..Cookie::default()
                    }
                    .format()
                })
            }
            None => None,
        }
    };
    // Always a cookie, with at least the rid (OpenLDAP's providers echo
    // the rid they are given, and only that); CSNs unless reloading.
    let stored = if reload { None } else { stored };
    let cookie = Some(our_cookie(server, cfg, stored.as_deref().unwrap_or("")));
    let mode = if cfg.persist() {
        SyncMode::RefreshAndPersist
    } else {
        SyncMode::RefreshOnly
    };
    let sync = SyncRequest {
        mode,
        cookie: cookie.map(String::into_bytes),
        reload_hint: true,
    };
    let mut attrs = cfg.attrs.clone();
    if !attrs.iter().any(|a| a == "*") {
        for must in [
            "objectClass",
            "structuralObjectClass",
            "entryCSN",
            "entryUUID",
        ] {
            if !attrs.iter().any(|a| a.eq_ignore_ascii_case(must)) {
                attrs.push(must.into());
            }
        }
    }
    let req = SearchRequest {
        base: cfg.search_base.clone(),
        scope: match cfg.scope.as_str() {
            "base" => Scope::Base,
            "one" => Scope::One,
            "children" => Scope::Children,
            _ => Scope::Sub,
        },
        deref: DerefAliases::Never,
        size_limit: 0,
        time_limit: 0,
        types_only: false,
        filter: Filter::parse(&cfg.filter)
            .map_err(|_| Failed(format!("filter '{}' does not parse", cfg.filter)))?,
        attrs,
    };
    let controls = vec![
        Control {
            oid: oid::SYNC_REQUEST.into(),
            critical: false,
            value: Some(sync.encode()),
        },
        Control {
            oid: oid::MANAGE_DSA_IT.into(),
            critical: true,
            value: None,
        },
    ];
    let id = client
        .send(ProtocolOp::SearchRequest(req), controls)
        .await?;
    let session_who = Identity::authenticated(
        format!("cn=replication rid={:03}", cfg.rid),
        format!("cn=replication rid={:03}", cfg.rid),
        Arc::new(Session {
            peer_ip: None,
            peer_cred: None,
            tls: false,
            client_cert_dn: None,
        }),
    )
    .with_roles(true, true);
    let mut s = Session2 {
        server,
        cfg,
        replica,
        who: session_who,
        queued: VecDeque::new(),
        present: HashSet::new(),
        persisting: false,
        failed: Arc::default(),
    };
    let timeout = Duration::from_secs(cfg.timeout_secs);
    loop {
        // In the persist stage the provider may be quiet for long; the
        // connection's keepalive notices a dead one.
        let wait = (!s.persisting).then_some(timeout);
        if s.persisting && !client.has_message() {
            // Nothing more to read now: what is queued is answered first,
            // so a failure is reported without waiting for the provider
            // (during a refresh the window's answers are collected as it
            // fills, keeping the writer busy while entries arrive).
            s.settle().await?;
        }
        let m = client.recv(wait).await?;
        set(replica, |st| st.last_contact = Some(now()));
        if m.id != id {
            if m.id == 0 {
                // A notice of disconnection.
                return Err(Failed(format!(
                    "{} ended the session: {:?}",
                    cfg.provider,
                    m.op.tag()
                )));
            }
            return Err(Failed(format!(
                "{} answered message {} (expected {id})",
                cfg.provider, m.id
            )));
        }
        match s.handle(m).await? {
            Some(ended) => {
                client.unbind().await;
                return Ok(ended);
            }
            None => continue,
        }
    }
}

/// The cookie this consumer sends: its rid, its own server ID when it has
/// one, and the CSNs of the stored cookie.
fn our_cookie(server: &Server, cfg: &ConsumerConfig, stored: &str) -> String {
    let sid = server.cfg.config.replication.server_id;
    let csns = Cookie::parse(stored.as_bytes())
        .map(|c| c.csns)
        .unwrap_or_default();
    Cookie {
        rid: Some(cfg.rid),
        sid: (sid != 0).then_some(sid),
        csns,
        delcsn: None,
    }
    .format()
}

impl Session2<'_> {
    fn ctx(&self, cookie: Option<String>, csn: Option<String>) -> Arc<WriteCtx> {
        WriteCtx::replicated(
            self.server,
            &self.who,
            ReplCtx {
                rid: self.cfg.rid,
                cookie,
                csn,
                failed: self.failed.clone(),
            },
        )
    }

    /// Apply a received change: queued on the writer behind the others
    /// (many commit together), answers collected as the window fills and
    /// before the session waits for the provider. Each carries its cookie;
    /// one that fails stops those queued after it from being written.
    async fn apply(
        &mut self,
        received: Received,
        cookie: Option<String>,
        csn: Option<String>,
    ) -> Result<(), Failed> {
        let fut = apply_received(self.ctx(cookie, csn), received);
        self.queued.push_back(Box::pin(fut));
        while self.queued.len() >= WINDOW {
            self.settle_one().await?;
        }
        Ok(())
    }

    async fn settle_one(&mut self) -> Result<(), Failed> {
        if let Some(f) = self.queued.pop_front() {
            f.await?;
        }
        Ok(())
    }

    /// Wait for every queued change.
    async fn settle(&mut self) -> Result<(), Failed> {
        while !self.queued.is_empty() {
            self.settle_one().await?;
        }
        Ok(())
    }

    /// A cookie received: kept as text, with our rid (what is stored is
    /// what the provider said).
    fn cookie_text(&self, bytes: &[u8]) -> Result<String, Failed> {
        let c = Cookie::parse(bytes).map_err(|e| {
            Failed(format!(
                "{} sent a malformed cookie: {}",
                self.cfg.provider, e.reason
            ))
        })?;
        if let Some(rid) = c.rid {
            if rid != self.cfg.rid {
                return Err(Failed(format!(
                    "{} sent a cookie for rid {rid}, this consumer is rid {}",
                    self.cfg.provider, self.cfg.rid
                )));
            }
        }
        set(self.replica, |s| s.last_cookie = Some(c.format()));
        Ok(c.format())
    }

    /// Store a cookie alone (after everything queued is in).
    async fn store_cookie(&mut self, cookie: Option<&[u8]>) -> Result<(), Failed> {
        self.settle().await?;
        if let Some(bytes) = cookie {
            let text = self.cookie_text(bytes)?;
            apply_received(self.ctx(Some(text), None), Received::Cookie).await?;
        }
        Ok(())
    }

    /// The end of a present phase: everything in the subtree the provider
    /// did not mention goes.
    async fn delete_not_present(&mut self) -> Result<(), Failed> {
        self.settle().await?;
        let gone = {
            let rtxn = self.server.store.read()?;
            let view = rtxn.view();
            let base = &self.replica.base;
            let rdns: Vec<String> = split_norm(base);
            let Ok(pando_store::Lookup::Found(base_id)) = view.lookup_norm(&rdns) else {
                return Ok(());
            };
            let Some(ids) = view.subtree(base_id, u64::MAX)? else {
                return Ok(());
            };
            let mut gone = Vec::new();
            for id in &ids {
                let attrs = view.attrs_where(id, &|d: &str| d.eq_ignore_ascii_case("entryUUID"))?;
                let uuid = attrs
                    .and_then(|a| a.into_iter().next())
                    .and_then(|a| a.values.into_iter().next())
                    .and_then(|v| pando_proto::sync::uuid_bytes(&String::from_utf8_lossy(&v)));
                if uuid.is_none_or(|u| !self.present.contains(&u)) {
                    if let Some(u) = uuid {
                        gone.push(uuid_text(&u));
                    }
                }
            }
            gone
        };
        self.present.clear();
        if !gone.is_empty() {
            let n = gone.len() as u64;
            for batch in gone.chunks(WINDOW) {
                apply_received(self.ctx(None, None), Received::Delete(batch.to_vec())).await?;
            }
            set(self.replica, |s| s.deleted += n);
        }
        Ok(())
    }

    /// One message of the search; Some when the session is over.
    async fn handle(&mut self, m: LdapMessage) -> Result<Option<Ended>, Failed> {
        let provider = &self.cfg.provider;
        let controls = m.controls;
        let control = |oid: &str| controls.iter().find(|c| c.oid == oid);
        match m.op {
            ProtocolOp::SearchResultEntry(e) => {
                let Some(ctl) = control(oid::SYNC_STATE) else {
                    return Err(Failed(format!(
                        "{provider} sent entry '{}' without a Sync State control",
                        e.dn
                    )));
                };
                let state =
                    SyncState::decode(ctl.value.as_deref().unwrap_or_default()).map_err(|err| {
                        Failed(format!(
                            "{provider} sent entry '{}' with a malformed Sync State control: {}",
                            e.dn, err.reason
                        ))
                    })?;
                let cookie = match &state.cookie {
                    Some(c) => Some(self.cookie_text(c)?),
                    None => None,
                };
                let uuid = uuid_text(&state.uuid);
                match state.state {
                    SyncStateKind::Present => {
                        self.present.insert(state.uuid);
                    }
                    SyncStateKind::Delete => {
                        let csn = cookie.as_deref().and_then(newest_csn);
                        let delay = self
                            .persisting
                            .then(|| csn.as_deref().and_then(delay_of))
                            .flatten();
                        self.apply(Received::Delete(vec![uuid]), cookie, csn)
                            .await?;
                        set(self.replica, |s| {
                            s.deleted += 1;
                            if let Some((sid, d)) = delay {
                                s.delay.insert(sid, d);
                            }
                        });
                    }
                    SyncStateKind::Add | SyncStateKind::Modify => {
                        self.present.insert(state.uuid);
                        let dn = Dn::parse(&e.dn).map_err(|err| {
                            Failed(format!(
                                "{provider} sent an entry with a malformed DN '{}': {err}",
                                e.dn
                            ))
                        })?;
                        let entry = received_entry(dn, e.attrs, &uuid);
                        let csn = entry
                            .get("entryCSN")
                            .and_then(|a| a.values.first())
                            .map(|v| String::from_utf8_lossy(v).into_owned());
                        let delay = self
                            .persisting
                            .then(|| csn.as_deref().and_then(delay_of))
                            .flatten();
                        self.apply(Received::Entry(entry), cookie, csn).await?;
                        set(self.replica, |s| {
                            s.applied += 1;
                            if let Some((sid, d)) = delay {
                                s.delay.insert(sid, d);
                            }
                        });
                    }
                }
                Ok(None)
            }
            ProtocolOp::SearchResultReference(_) => Ok(None),
            ProtocolOp::IntermediateResponse { name, value } => {
                if name.as_deref() != Some(oid::SYNC_INFO) {
                    return Ok(None);
                }
                let info = SyncInfo::decode(value.as_deref().unwrap_or_default()).map_err(|e| {
                    Failed(format!(
                        "{provider} sent a malformed Sync Info message: {}",
                        e.reason
                    ))
                })?;
                match info {
                    SyncInfo::NewCookie(c) => self.store_cookie(Some(&c)).await?,
                    SyncInfo::IdSet {
                        cookie,
                        refresh_deletes,
                        uuids,
                    } => {
                        if refresh_deletes {
                            let n = uuids.len() as u64;
                            let texts = uuids.iter().map(uuid_text).collect();
                            let cookie = match &cookie {
                                Some(c) => Some(self.cookie_text(c)?),
                                None => None,
                            };
                            self.apply(Received::Delete(texts), cookie, None).await?;
                            set(self.replica, |s| s.deleted += n);
                        } else {
                            self.present.extend(uuids);
                            if let Some(c) = cookie {
                                self.store_cookie(Some(&c)).await?;
                            }
                        }
                    }
                    SyncInfo::RefreshPresent { cookie, done }
                    | SyncInfo::RefreshDelete { cookie, done } => {
                        let present_phase = matches!(info_kind(&value), Some(true));
                        if present_phase {
                            self.delete_not_present().await?;
                        }
                        self.store_cookie(cookie.as_deref()).await?;
                        if done {
                            self.persisting = true;
                            self.present.clear();
                            set(self.replica, |s| s.phase = "persist");
                        }
                    }
                }
                Ok(None)
            }
            ProtocolOp::SearchResultDone(r) => {
                if r.code == ResultCode::SYNC_REFRESH_REQUIRED {
                    self.settle().await?;
                    return Ok(Some(Ended::Reload));
                }
                if r.code != ResultCode::SUCCESS {
                    self.settle().await?;
                    return Err(Failed(format!(
                        "{provider} ended the synchronization: {} ({}) {}",
                        r.code.0,
                        r.code.name(),
                        r.message
                    )));
                }
                let done = match control(oid::SYNC_DONE) {
                    Some(c) => {
                        SyncDone::decode(c.value.as_deref().unwrap_or_default()).map_err(|e| {
                            Failed(format!(
                                "{provider} sent a malformed Sync Done control: {}",
                                e.reason
                            ))
                        })?
                    }
                    None => SyncDone::default(),
                };
                if !done.refresh_deletes {
                    self.delete_not_present().await?;
                }
                self.store_cookie(done.cookie.as_deref()).await?;
                if self.cfg.persist() {
                    return Err(Failed(format!(
                        "{provider} ended a refreshAndPersist search"
                    )));
                }
                Ok(Some(Ended::Refreshed))
            }
            other => Err(Failed(format!(
                "{provider} sent an unexpected {:?} message",
                other.tag()
            ))),
        }
    }
}

/// Whether a Sync Info value is refreshPresent (Some(true)) or
/// refreshDelete (Some(false)).
fn info_kind(value: &Option<Vec<u8>>) -> Option<bool> {
    match value.as_deref().and_then(|v| v.first()) {
        Some(0xa2) => Some(true),
        Some(0xa1) => Some(false),
        _ => None,
    }
}

/// The server ID of a change stamped `csn`, and how long ago (by this
/// server's clock) its CSN's time was, microseconds.
fn delay_of(csn: &str) -> Option<(u16, u64)> {
    let sid = pando_proto::sync::csn_sid(csn)?;
    let (at, _) = crate::clock::parse_csn(csn).ok()?;
    Some((sid, now().saturating_sub(at)))
}

/// The newest CSN of a cookie.
fn newest_csn(cookie: &str) -> Option<String> {
    Cookie::parse(cookie.as_bytes())
        .ok()?
        .csns
        .into_iter()
        .max()
}

/// The normalised RDNs of a normalised DN.
fn split_norm(norm: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for ch in norm.chars() {
        if ch == ',' && !escaped {
            out.push(std::mem::take(&mut cur));
            continue;
        }
        escaped = ch == '\\' && !escaped;
        cur.push(ch);
    }
    if !norm.is_empty() {
        out.push(cur);
    }
    out
}

/// The entry as received: computed attributes (each server computes its
/// own, contextCSN among them) dropped, entryUUID the one the Sync State
/// control names.
fn received_entry(dn: Dn, attrs: Vec<pando_proto::PartialAttribute>, uuid: &str) -> Entry {
    let mut entry = Entry::new(dn);
    for a in attrs {
        let base = a.name.split(';').next().unwrap_or("");
        let computed = crate::ops::COMPUTED
            .iter()
            .any(|c| c.eq_ignore_ascii_case(base));
        if computed || base.eq_ignore_ascii_case("entryUUID") || a.values.is_empty() {
            continue;
        }
        entry.attrs.push(Attribute {
            desc: a.name,
            values: a.values,
        });
    }
    entry.add_values("entryUUID", vec![uuid.as_bytes().to_vec()]);
    entry
}
