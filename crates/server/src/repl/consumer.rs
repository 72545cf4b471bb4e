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
//!
//! Delta-sync (`syncdata = "accesslog"`, OpenLDAP's delta-syncrepl): with
//! a cookie the session searches the provider's access log instead and
//! applies each record to the entry it names (`repl::delta`), with the
//! record's cookie. Without a cookie, or once the log cannot serve it
//! (4096) or a record does not apply here, one refreshOnly session loads
//! the data whole (as above, reload asked), and the log is followed from
//! the cookie it ends with.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use pando_model::{Attribute, Dn, Entry};
use pando_proto::sync::{
    uuid_text, Cookie, SyncDone, SyncInfo, SyncMode, SyncRequest, SyncState, SyncStateKind,
};
use pando_proto::{
    oid, Control, DerefAliases, Filter, LdapMessage, ProtocolOp, ResultCode, Scope, SearchRequest,
};

use super::delta::{self, LogRecord, Lost, RecordKind};
use super::Replica;
use crate::ops::write::change::{self, ReplCtx};
use crate::ops::write::replicated::{self, apply_received, Received};
use crate::ops::write::WriteCtx;
use crate::state::Server;
use pando_access::{Identity, Session};
use pando_client::{Client, ClientError};
use pando_config::consumer::{ConsumerConfig, Retry};

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
    /// Received changes that met a different state here (filled in by
    /// `Replica::snapshot`).
    pub conflicts: u64,
    /// Received changes dated more than [`FUTURE_CSN_SECS`] past this
    /// server's clock.
    pub future_changes: u64,
    /// Multi-provider: received changes already stored here, having come
    /// through another server (not written again).
    pub skipped: u64,
    /// Per server ID: how long after its CSN's time the last change of
    /// that server reached this consumer (persist stage), microseconds.
    pub delay: std::collections::BTreeMap<u16, u64>,
    /// Per server ID: changes the provider logged past this consumer's
    /// cookie, as it last counted them (`super::lag`).
    pub behind: std::collections::BTreeMap<u16, super::lag::Behind>,
    /// The last comparison with the provider by content (`super::check`).
    pub checked: super::check::Checked,
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
    super::Replicas::of(server).start_all(server);
}

fn now() -> u64 {
    pando_store::clock::now_micros()
}

/// How a session ended without an error.
enum Ended {
    /// refreshOnly: the refresh is done; wait for the interval.
    Refreshed,
    /// The provider asked for a reload (4096), or a delta-sync consumer
    /// lost step with the log.
    Reload,
    /// Delta-sync: the full refresh is done; follow the log now.
    ToLog,
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

/// What carries over from one session to the next.
#[derive(Default)]
struct Carry {
    /// Consecutive failed sessions (the retry schedule's position).
    failures: u32,
    /// The next session asks for a reload (after e-syncRefreshRequired).
    reload: bool,
    /// Reloads asked for in a row without a refresh completing.
    reloads_in_row: u32,
    /// The session started from the store's contextCSN, having no cookie
    /// of its own (see [`starting_cookie`]).
    guessed: bool,
}

/// Reloads in a row after which the next is treated as a failure (the
/// retry schedule spaces them out).
const MAX_RELOADS_IN_ROW: u32 = 3;

/// The consumer `replica` until the server closes or the consumer is
/// removed or changed. Each session runs under the configuration current
/// when it starts.
pub(super) async fn run(server: Arc<Server>, replica: Arc<Replica>) {
    let cfg = replica.cfg.clone();
    let replica = &*replica;
    let retry = Retry::parse(&cfg.retry).unwrap_or(Retry(vec![(Duration::from_secs(60), None)]));
    let interval = cfg
        .interval
        .duration()
        .unwrap_or(Duration::from_secs(86_400));
    let mut closing = server.rt.feed.closing();
    let mut carry = Carry::default();
    loop {
        set(replica, |s| s.phase = "connecting");
        let server = server.current();
        let ended = tokio::select! {
            e = session(&server, &cfg, replica, &mut carry) => e,
            _ = closing.changed() => break,
            _ = replica.stopped() => break,
        };
        let ended = match ended {
            Ok(Ended::Reload) if carry.reloads_in_row >= MAX_RELOADS_IN_ROW => {
                Err(Failed(format!(
                    "{} asked for a reload {} times in a row",
                    cfg.provider, carry.reloads_in_row
                )))
            }
            other => other,
        };
        let wait = match ended {
            Ok(Ended::Refreshed) => {
                set(replica, |s| s.phase = "idle");
                interval
            }
            Ok(Ended::ToLog) => continue,
            Ok(Ended::Reload) => {
                tracing::warn!(rid = cfg.rid, provider = %cfg.provider, "the provider asked for a reload (e-syncRefreshRequired), or the log could not be applied: refreshing the whole subtree");
                set(replica, |s| s.reloads += 1);
                carry.reload = true;
                carry.reloads_in_row += 1;
                continue;
            }
            Err(Failed(why)) => {
                if std::mem::take(&mut carry.guessed) && !carry.reload {
                    // The store's own state (a suffix entry made here
                    // before the consumer was configured, say) is not the
                    // provider's: load the subtree whole instead.
                    tracing::warn!(rid = cfg.rid, provider = %cfg.provider, "the provider refused the state this store holds ({why}); loading the subtree whole");
                    carry.reload = true;
                }
                carry.failures += 1;
                set(replica, |s| {
                    s.failures += 1;
                    s.phase = "retrying";
                    s.last_error = Some(why.clone());
                });
                match retry.wait(carry.failures) {
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
            _ = replica.stopped() => break,
        }
    }
    set(replica, |s| s.phase = "stopped");
}

pub(super) fn set(replica: &Replica, f: impl FnOnce(&mut Status)) {
    if let Ok(mut s) = replica.status.lock() {
        f(&mut s);
    }
}

type Queued = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = crate::error::OpResult<crate::ops::write::Written>> + Send,
    >,
>;

/// What one session needs besides the client.
struct Session2<'a> {
    server: &'a Arc<Server>,
    cfg: &'a ConsumerConfig,
    replica: &'a Replica,
    who: Identity,
    /// Changes queued on the writer and not yet answered.
    queued: VecDeque<Queued>,
    /// The refresh is over (persist stage).
    persisting: bool,
    /// Set by the writer when one of this session's changes fails.
    failed: Arc<std::sync::atomic::AtomicBool>,
    /// The session started with no state (an initial load or a reload):
    /// at the end of the refresh, what was not sent goes.
    initial: bool,
    /// During the refresh: UUIDs the provider sent or named present.
    present: HashSet<[u8; 16]>,
    /// During the refresh: UUIDs to delete once the refresh's cookie is
    /// known (they are stamped with its CSN, so the change log orders
    /// them right for this server's own consumers).
    pending_deletes: Vec<String>,
    /// During the refresh: the newest cookie seen, stored at its end.
    pending_cookie: Option<Cookie>,
    /// The last cookie stored: a persist message's cookie is compared
    /// with it to find the change's own CSN.
    last: Cookie,
    /// A present phase ended (refreshPresent): at the end of the refresh
    /// what was not named goes.
    present_phase: bool,
    /// When this session last warned of a change dated in the future.
    future_warned: Option<std::time::Instant>,
    /// Delta-sync: this session follows the provider's log.
    log: bool,
    /// Delta-sync: this session is the full refresh before the log.
    fallback: bool,
    /// Delta-sync: entries as the changes queued (and not yet answered)
    /// leave them, by normalised DN (None: deleted), so each record is
    /// applied to the latest state without waiting for the writer.
    recent: HashMap<String, Option<Entry>>,
}

/// A received change whose CSN is dated more than this far past this
/// server's clock is counted and warned of (at most once a minute per
/// session): the clock of the server that made it, or this server's, is
/// off, and CSNs decide which of two changes is newer.
const FUTURE_CSN_SECS: u64 = 60;

/// Where a session starts from.
enum Start {
    /// The cookie stored for the consumer's rid.
    Stored(String),
    /// No cookie stored: the store's contextCSN, as a cookie.
    Guessed(String),
    /// Nothing: an initial load.
    Initial,
}

/// The cookie to start from: the stored one; with none, the store's
/// contextCSN when the subtree is already here (a provider's backup
/// restored, or its export imported with entryCSN and entryUUID), so only
/// what changed since is sent. A base entry alone is not the subtree: it
/// is what a new server creates for its suffix, and its CSN (newer than
/// the provider's data) would skip everything the provider held before.
fn starting_cookie(
    server: &Server,
    cfg: &ConsumerConfig,
    replica: &Replica,
) -> Result<Start, Failed> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    if let Some(c) = replicated::stored_cookie(&view, cfg.rid)? {
        return Ok(Start::Stored(c));
    }
    let here = match view.lookup_norm(&crate::ops::norm_dn::split_rdns(&replica.base))? {
        pando_store::Lookup::Found(id) => view.has_children(id)?,
        pando_store::Lookup::Missing { .. } => false,
    };
    let csns = view.context_csns()?;
    // With multi-provider the store's contextCSN is no cookie for one
    // provider: it holds CSNs of changes that came through the others,
    // whose copies a provider's log files under the writer's server ID
    // (and so does not send back to it). Only this provider's own stream
    // says what was received from it: without a cookie, a whole load
    // (which deletes nothing the provider has not seen).
    if !here || csns.is_empty() || server.multi_provider() {
        tracing::info!(
            rid = cfg.rid,
            "no cookie yet and {}: loading the subtree whole",
            if server.multi_provider() {
                "multi-provider"
            } else {
                "no replicated subtree here"
            }
        );
        return Ok(Start::Initial);
    }
    tracing::info!(
        rid = cfg.rid,
        "no cookie yet: starting from the store's contextCSN ({})",
        csns.join(";")
    );
    Ok(Start::Guessed(
        Cookie {
            csns,
            ..Cookie::default()
        }
        .format(),
    ))
}

async fn session(
    server: &Arc<Server>,
    cfg: &ConsumerConfig,
    replica: &Replica,
    carry: &mut Carry,
) -> Result<Ended, Failed> {
    let endpoint = pando_client::Endpoint::from(cfg);
    let mut client = Client::connect(&endpoint, server.cfg.config.limits.max_pdu_bytes).await?;
    client.bind(&endpoint).await?;
    set(replica, |s| {
        s.last_connect = Some(now());
        s.phase = "refresh";
        s.refreshes += 1;
    });
    let start = if carry.reload {
        Start::Initial
    } else {
        starting_cookie(server, cfg, replica)?
    };
    carry.guessed = matches!(start, Start::Guessed(_));
    let stored = match start {
        Start::Stored(c) | Start::Guessed(c) => Some(c),
        Start::Initial => None,
    };
    let start = Cookie::parse(stored.as_deref().unwrap_or("").as_bytes()).unwrap_or_default();
    let (req, controls, log, fallback) = sync_search(server, cfg, &start)?;
    let id = client
        .send(ProtocolOp::SearchRequest(req), controls)
        .await?;
    let session_who = replication_identity(cfg.rid);
    let mut s = Session2 {
        server,
        cfg,
        replica,
        who: session_who,
        queued: VecDeque::new(),
        persisting: false,
        failed: Arc::default(),
        initial: start.csns.is_empty(),
        present: HashSet::new(),
        pending_deletes: Vec::new(),
        pending_cookie: None,
        last: start,
        present_phase: false,
        future_warned: None,
        log,
        fallback,
        recent: HashMap::new(),
    };
    // The state this session starts from is stored first, so a session
    // cut short starts over from it (not from a contextCSN the entries
    // received so far moved).
    let first = Cookie {
        rid: Some(cfg.rid),
        ..s.last.clone()
    };
    s.store_cookie(first, None, false).await?;
    follow(&mut s, client, id, carry).await
}

/// The sync search for a session starting at `start`: the request, its
/// controls, whether it follows the provider's log (delta-sync from a
/// cookie) and whether it is delta-sync's fallback refresh of the data.
fn sync_search(
    server: &Server,
    cfg: &ConsumerConfig,
    start: &Cookie,
) -> Result<(SearchRequest, Vec<Control>, bool, bool), Failed> {
    // Always a cookie, with at least the rid (OpenLDAP's providers echo
    // the rid they are given, and only that).
    let sid = server.cfg.config.replication.server_id;
    let sent = Cookie {
        rid: Some(cfg.rid),
        sid: (sid != 0).then_some(sid),
        csns: start.csns.clone(),
        delcsn: None,
    };
    // Delta-sync follows the log from a cookie; without one (or after
    // losing step) it refreshes the data whole first, once, as OpenLDAP's
    // consumer does.
    let log = cfg.delta() && !start.csns.is_empty();
    let fallback = cfg.delta() && !log;
    if log {
        tracing::info!(rid = cfg.rid, provider = %cfg.provider, "following the provider's log at '{}' from {}", cfg.logbase, start.format());
    }
    let mode = if cfg.persist() && !fallback {
        SyncMode::RefreshAndPersist
    } else {
        SyncMode::RefreshOnly
    };
    let sync = SyncRequest {
        mode,
        cookie: Some(sent.format().into_bytes()),
        reload_hint: !log,
    };
    let req = if log {
        log_search(cfg)?
    } else {
        data_search(cfg)?
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
    Ok((req, controls, log, fallback))
}

/// Who a consumer's changes are written as: an administrator to whom
/// access rules do not apply (the provider's rules decided what it sent).
fn replication_identity(rid: u16) -> Identity {
    let name = format!("cn=replication rid={rid:03}");
    Identity::authenticated(
        name.clone(),
        name,
        Arc::new(Session {
            peer_ip: None,
            peer_cred: None,
            tls: false,
            client_cert_dn: None,
        }),
    )
    .with_roles(true, true)
}

/// Read the provider's messages until the session ends: apply each, keep
/// the cookie, settle what is queued while the provider is quiet.
async fn follow(
    s: &mut Session2<'_>,
    mut client: Client,
    id: i32,
    carry: &mut Carry,
) -> Result<Ended, Failed> {
    let (cfg, replica) = (s.cfg, s.replica);
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
        let was_persisting = s.persisting;
        let ended = s.handle(m).await?;
        if s.persisting && !was_persisting {
            // A refresh completed: the slate is clean.
            carry.failures = 0;
            carry.reload = false;
            carry.reloads_in_row = 0;
        }
        match ended {
            Some(Ended::Refreshed) => {
                carry.failures = 0;
                carry.reload = false;
                carry.reloads_in_row = 0;
                client.unbind().await;
                if s.fallback && s.last.csns.is_empty() {
                    return Err(Failed(format!(
                        "{} ended the refresh without a state (contextCSN) to follow its log from",
                        cfg.provider
                    )));
                }
                return Ok(if s.fallback {
                    Ended::ToLog
                } else {
                    Ended::Refreshed
                });
            }
            Some(other) => {
                client.unbind().await;
                return Ok(other);
            }
            None => continue,
        }
    }
}

/// The search of the replicated data.
fn data_search(cfg: &ConsumerConfig) -> Result<SearchRequest, Failed> {
    let mut attrs = cfg.attrs.clone();
    let named = |attrs: &[String], a: &str| attrs.iter().any(|x| x.eq_ignore_ascii_case(a));
    if !named(&attrs, "*") && !named(&attrs, "objectClass") {
        attrs.push("objectClass".into());
    }
    if !named(&attrs, "+") {
        for must in ["structuralObjectClass", "entryCSN", "entryUUID"] {
            if !named(&attrs, must) {
                attrs.push(must.into());
            }
        }
    }
    // A Pando provider's per-attribute state (multi-provider), sent only
    // when named; other providers ignore a type they do not know.
    attrs.push(crate::ops::write::merge::STATE_ATTR.into());
    Ok(SearchRequest {
        base: cfg.search_base.clone(),
        scope: scope_of(cfg),
        deref: DerefAliases::Never,
        size_limit: 0,
        time_limit: 0,
        types_only: false,
        filter: Filter::parse(&cfg.filter)
            .map_err(|_| Failed(format!("filter '{}' does not parse", cfg.filter)))?,
        attrs,
    })
}

/// Delta-sync: the search of the provider's access log.
fn log_search(cfg: &ConsumerConfig) -> Result<SearchRequest, Failed> {
    Ok(SearchRequest {
        base: cfg.logbase.clone(),
        scope: Scope::Sub,
        deref: DerefAliases::Never,
        size_limit: 0,
        time_limit: 0,
        types_only: false,
        filter: Filter::parse(&cfg.logfilter)
            .map_err(|_| Failed(format!("logfilter '{}' does not parse", cfg.logfilter)))?,
        attrs: delta::RECORD_ATTRS.iter().map(|a| a.to_string()).collect(),
    })
}

fn scope_of(cfg: &ConsumerConfig) -> Scope {
    match cfg.scope.as_str() {
        "base" => Scope::Base,
        "one" => Scope::One,
        "children" => Scope::Children,
        _ => Scope::Sub,
    }
}

/// The CSN of the change a persist message's cookie reports: the one CSN
/// that moved since `last` (providers send only it; older Pando servers
/// sent every server's), else the newest.
fn change_csn(last: &Cookie, new: &Cookie) -> Option<String> {
    let moved = new
        .csns
        .iter()
        .filter(|c| {
            pando_proto::sync::csn_sid(c).is_some_and(|sid| last.csn_for(sid) != Some(c.as_str()))
        })
        .max();
    moved.or_else(|| new.csns.iter().max()).cloned()
}

impl Session2<'_> {
    /// The search runs in refreshAndPersist mode (a delta-sync consumer's
    /// full refresh is refreshOnly).
    fn persist_mode(&self) -> bool {
        self.cfg.persist() && !self.fallback
    }

    /// Queue `received` on the writer now, with the state it carries; the
    /// future gives its answer.
    fn receive(
        &self,
        received: Received,
        cookie: Option<String>,
        csn: Option<String>,
        unlogged: bool,
        seen_by: Option<Cookie>,
    ) -> impl std::future::Future<Output = crate::error::OpResult<crate::ops::write::Written>>
           + Send
           + 'static {
        // Written under the configuration current now (its logs, its
        // limits), not the one the consumer started with. Entries of a
        // refresh, and changes passed on without a cookie, come in no CSN
        // order (a log's records come in CSN order, each with its cookie
        // or before one).
        let refreshing = !self.log && (!self.persisting || cookie.is_none());
        let ctx = WriteCtx::new(&self.server.current(), &self.who, Default::default());
        let repl = ReplCtx {
            rid: self.cfg.rid,
            cookie,
            csn,
            failed: self.failed.clone(),
            unlogged,
            refreshing,
            base: self.replica.base.clone(),
            conflicts: self.replica.conflicts.clone(),
            seen_by,
        };
        apply_received(ctx, repl, received)
    }

    /// Queue a received change on the writer behind the others (many
    /// commit together); answers are collected as the window fills and
    /// before the session waits for the provider. One that fails stops
    /// those queued after it from being written (their cookies too).
    async fn apply(
        &mut self,
        received: Received,
        cookie: Option<String>,
        csn: Option<String>,
    ) -> Result<(), Failed> {
        // An initial load does not copy every entry into the change log
        // (its cookie raises the log's floor instead); deletes are always
        // logged.
        let unlogged = self.initial && !self.persisting && matches!(received, Received::Entry(_));
        let fut = self.receive(received, cookie, csn, unlogged, None);
        self.queued.push_back(Box::pin(fut));
        while self.queued.len() >= WINDOW {
            self.settle_one().await?;
        }
        Ok(())
    }

    /// [`Self::apply`] a change that came after the refresh (or from a
    /// log), counted as applied or deleted, with how long it took to come
    /// when its CSN is known.
    async fn apply_counted(
        &mut self,
        received: Received,
        cookie: Option<String>,
        csn: Option<String>,
    ) -> Result<(), Failed> {
        let delay = csn.as_deref().and_then(delay_of);
        let deleted = match &received {
            Received::Delete(uuids) => uuids.len() as u64,
            _ => 0,
        };
        self.apply(received, cookie, csn).await?;
        set(self.replica, |s| {
            match deleted {
                0 => s.applied += 1,
                n => s.deleted += n,
            }
            if let Some((sid, d)) = delay {
                s.delay.insert(sid, d);
            }
        });
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

    /// Count, and warn of, a received change dated in the future (see
    /// [`FUTURE_CSN_SECS`]).
    fn check_clock(&mut self, csn: Option<&str>, dn: &Dn) {
        let Some(Ok((at, _))) = csn.map(pando_store::clock::parse_csn) else {
            return;
        };
        let now = pando_store::clock::now_micros();
        if at <= now + FUTURE_CSN_SECS * 1_000_000 {
            return;
        }
        set(self.replica, |s| s.future_changes += 1);
        let quiet = self
            .future_warned
            .is_some_and(|w| w.elapsed().as_secs() < FUTURE_CSN_SECS);
        if !quiet {
            self.future_warned = Some(std::time::Instant::now());
            tracing::warn!(
                rid = self.cfg.rid,
                provider = %self.cfg.provider,
                entry = %dn,
                csn = csn.unwrap_or_default(),
                ahead_secs = (at - now) / 1_000_000,
                "a received change is dated in the future: the clock of the server that made it, or this server's, is off (CSNs decide which change is newer); counted in pandoReplFutureChanges"
            );
        }
    }

    /// The state held once a persist-stage cookie is taken in: providers
    /// name there only the CSN that moved (OpenLDAP's, and Pando's), so
    /// the CSNs of the other server IDs are kept from what was held.
    fn held_with(&self, received: Cookie) -> Cookie {
        let mut held = self.last.clone();
        for csn in &received.csns {
            held.advance(csn);
        }
        Cookie {
            csns: held.csns,
            ..received
        }
    }

    /// A cookie received, checked: it must parse and name this consumer's
    /// rid (or none).
    fn cookie_of(&self, bytes: &[u8]) -> Result<Cookie, Failed> {
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
        Ok(c)
    }

    /// Store `cookie` (after everything queued is in), with `received`
    /// in the same transaction; `raise_floor`: it ends an initial load.
    async fn store_cookie(
        &mut self,
        cookie: Cookie,
        csn: Option<String>,
        raise_floor: bool,
    ) -> Result<(), Failed> {
        self.settle().await?;
        let cookie = Cookie {
            rid: Some(self.cfg.rid),
            ..cookie
        };
        self.receive(
            Received::Cookie,
            Some(cookie.format()),
            csn,
            raise_floor,
            None,
        )
        .await?;
        self.last = cookie;
        Ok(())
    }

    /// The refresh is over (`cookie`: the one it ended with, if any;
    /// `deletes`: refreshDeletes, i.e. no present phase): deletes held
    /// back are applied, and after a present phase or an initial load
    /// whatever the provider did not send goes; then the cookie is stored.
    async fn end_refresh(&mut self, cookie: Option<Cookie>, deletes: bool) -> Result<(), Failed> {
        self.settle().await?;
        if self.log {
            // The records came with their own cookies; this one names the
            // provider's state when the refresh ended.
            self.recent.clear();
            let cookie = cookie.or_else(|| self.pending_cookie.take());
            if let Some(c) = cookie {
                let held = self.held_with(c);
                self.store_cookie(held, None, false).await?;
            }
            return Ok(());
        }
        let cookie = cookie
            .or_else(|| self.pending_cookie.take())
            .unwrap_or_else(|| self.last.clone());
        let csn = cookie.csns.iter().max().cloned();
        let mut gone = std::mem::take(&mut self.pending_deletes);
        if (!deletes || self.present_phase || self.initial) && self.server.multi_provider() {
            // With multi-provider, what one provider lacks may be on its
            // way to it. An entry whose last change the provider's state
            // takes in (its entryCSN not newer than the provider's CSN for
            // that server ID) reached the provider and is gone there: it
            // goes here too (a provider without tombstones, as slapd, names
            // no deletes). The others are kept and counted.
            let (unnamed, kept) = self.not_present(Some(&cookie))?;
            gone.extend(unnamed);
            if kept > 0 {
                tracing::warn!(
                    rid = self.cfg.rid,
                    provider = %self.cfg.provider,
                    entries = kept,
                    "the provider's refresh did not name some entries held here whose last change it has not seen; with multi-provider they are kept (they may be on their way to it)"
                );
            }
        } else if !deletes || self.present_phase || self.initial {
            gone.extend(self.not_present(None)?.0);
        }
        // A remembered delete the provider sent is also not named present.
        let mut once = HashSet::new();
        gone.retain(|uuid| once.insert(uuid.clone()));
        let n = gone.len() as u64;
        // The provider's state at the end of its refresh: what it names is
        // what the servers that deleted had seen.
        for batch in gone.chunks(WINDOW) {
            let seen_by = Some(cookie.clone());
            self.receive(
                Received::Gone(batch.to_vec()),
                None,
                csn.clone(),
                false,
                seen_by,
            )
            .await?;
        }
        set(self.replica, |s| s.deleted += n);
        self.present = HashSet::new();
        self.store_cookie(cookie, None, self.initial).await
    }

    /// Entries of the search here (within its base and scope, matching its
    /// filter) that the provider did not send or name present, deepest
    /// first. With
    /// `seen_by`, only those whose entryCSN that state takes in; the
    /// others are counted (the second value).
    fn not_present(&self, seen_by: Option<&Cookie>) -> Result<(Vec<String>, usize), Failed> {
        let server = self.server;
        let schema = &*server.schema;
        let filter = Filter::parse(&self.cfg.filter)
            .map_err(|_| Failed(format!("filter '{}' does not parse", self.cfg.filter)))?;
        let compiled = schema.compile_filter(&filter);
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        let Ok(pando_store::Lookup::Found(base_id)) =
            view.lookup_norm(&crate::ops::norm_dn::split_rdns(&self.replica.base))
        else {
            return Ok((Vec::new(), 0));
        };
        let ids: Vec<u64> = match scope_of(self.cfg) {
            Scope::Base => vec![base_id],
            Scope::One => view.children(base_id)?,
            scope => {
                let all = view.subtree(base_id, u64::MAX)?.unwrap_or_default();
                all.iter()
                    .filter(|&id| scope == Scope::Sub || id != base_id)
                    .collect()
            }
        };
        let (mut gone, mut kept) = (Vec::new(), 0);
        for id in ids {
            let Some(entry) = view.entry(id)? else {
                continue;
            };
            let uuid = entry
                .get("entryUUID")
                .and_then(|a| a.values.first())
                .and_then(|v| pando_proto::sync::uuid_bytes(&String::from_utf8_lossy(v)));
            let Some(uuid) = uuid else { continue };
            if self.present.contains(&uuid) {
                continue;
            }
            if compiled.matches(schema, &entry) != pando_model::Ternary::True {
                continue;
            }
            let csn = entry.get("entryCSN").and_then(|a| a.values.first());
            let seen = |c: &Cookie| csn.is_some_and(|v| c.has_seen(&String::from_utf8_lossy(v)));
            if seen_by.is_none_or(seen) {
                gone.push((entry.dn.rdns.len(), uuid_text(&uuid)));
            } else {
                kept += 1;
            }
        }
        // Entries below others first: a parent goes with (after) them, in
        // this batch or an earlier one.
        gone.sort_by_key(|g| std::cmp::Reverse(g.0));
        Ok((gone.into_iter().map(|(_, u)| u).collect(), kept))
    }

    /// A malformed or out-of-place message from the provider.
    fn refuse(&self, what: impl std::fmt::Display) -> Failed {
        Failed(format!("{} sent {what}", self.cfg.provider))
    }

    /// One message of the search; Some when the session is over.
    async fn handle(&mut self, m: LdapMessage) -> Result<Option<Ended>, Failed> {
        let controls = m.controls;
        let control = |oid: &str| controls.iter().find(|c| c.oid == oid);
        match m.op {
            ProtocolOp::SearchResultEntry(e) => {
                let Some(ctl) = control(oid::SYNC_STATE) else {
                    return Err(self.refuse(format_args!(
                        "entry '{}' without a Sync State control",
                        e.dn
                    )));
                };
                let state =
                    SyncState::decode(ctl.value.as_deref().unwrap_or_default()).map_err(|err| {
                        self.refuse(format_args!(
                            "entry '{}' with a malformed Sync State control: {}",
                            e.dn, err.reason
                        ))
                    })?;
                let cookie = state
                    .cookie
                    .as_deref()
                    .map(|c| self.cookie_of(c))
                    .transpose()?;
                if self.log {
                    return self.on_log_record(e, cookie).await;
                }
                self.on_entry(e, state, cookie).await?;
                Ok(None)
            }
            ProtocolOp::SearchResultReference(_) => Ok(None),
            ProtocolOp::IntermediateResponse { name, value } => {
                if name.as_deref() != Some(oid::SYNC_INFO) {
                    return Ok(None);
                }
                let info = SyncInfo::decode(value.as_deref().unwrap_or_default()).map_err(|e| {
                    self.refuse(format_args!("a malformed Sync Info message: {}", e.reason))
                })?;
                self.on_info(info).await?;
                Ok(None)
            }
            ProtocolOp::SearchResultDone(r) => {
                self.settle().await?;
                if r.code == ResultCode::SYNC_REFRESH_REQUIRED {
                    return Ok(Some(Ended::Reload));
                }
                if r.code != ResultCode::SUCCESS {
                    return Err(Failed(format!(
                        "{} ended the synchronization: {} ({}) {}",
                        self.cfg.provider,
                        r.code.0,
                        r.code.name(),
                        r.message
                    )));
                }
                if self.persisting || self.persist_mode() {
                    return Err(self.refuse("the end of a refreshAndPersist search"));
                }
                let done = match control(oid::SYNC_DONE) {
                    Some(c) => {
                        SyncDone::decode(c.value.as_deref().unwrap_or_default()).map_err(|e| {
                            self.refuse(format_args!("a malformed Sync Done control: {}", e.reason))
                        })?
                    }
                    None => SyncDone::default(),
                };
                let cookie = done
                    .cookie
                    .as_deref()
                    .map(|c| self.cookie_of(c))
                    .transpose()?;
                self.end_refresh(cookie, done.refresh_deletes).await?;
                Ok(Some(Ended::Refreshed))
            }
            other => Err(self.refuse(format_args!("an unexpected {:?} message", other.tag()))),
        }
    }

    async fn on_entry(
        &mut self,
        e: pando_proto::SearchResultEntry,
        state: SyncState,
        cookie: Option<Cookie>,
    ) -> Result<(), Failed> {
        let uuid = uuid_text(&state.uuid);
        if !self.persisting {
            // During the refresh cookies are kept for its end.
            if cookie.is_some() {
                self.pending_cookie = cookie.clone();
            }
            match state.state {
                SyncStateKind::Present => {
                    self.present.insert(state.uuid);
                }
                SyncStateKind::Delete => self.pending_deletes.push(uuid),
                SyncStateKind::Add | SyncStateKind::Modify => {
                    self.present.insert(state.uuid);
                    let entry = self.entry(e, &uuid)?;
                    let csn = csn_of(&entry);
                    self.check_clock(csn.as_deref(), &entry.dn);
                    self.apply(Received::Entry(entry), None, csn).await?;
                    set(self.replica, |s| s.applied += 1);
                }
            }
            return Ok(());
        }
        let csn_from_cookie = cookie.as_ref().and_then(|c| change_csn(&self.last, c));
        let cookie = cookie.map(|c| self.held_with(c));
        if self.came_another_way(csn_from_cookie.as_deref())? {
            // The cookie moves with the next change written.
            if let Some(c) = cookie {
                self.last = c;
            }
            set(self.replica, |s| s.skipped += 1);
            return Ok(());
        }
        let text = cookie.as_ref().map(Cookie::format);
        match state.state {
            SyncStateKind::Present => return Err(self.refuse("a present entry after the refresh")),
            SyncStateKind::Delete => {
                self.apply_counted(Received::Delete(vec![uuid]), text, csn_from_cookie)
                    .await?;
            }
            SyncStateKind::Add | SyncStateKind::Modify => {
                let entry = self.entry(e, &uuid)?;
                let csn = csn_of(&entry);
                self.check_clock(csn.as_deref(), &entry.dn);
                self.apply_counted(Received::Entry(entry), text, csn)
                    .await?;
            }
        }
        if let Some(c) = cookie {
            self.last = c;
        }
        Ok(())
    }

    /// Delta-sync: one record of the provider's log, applied to the entry
    /// it names (with its cookie, if it carries one); `Ended::Reload` when
    /// it cannot be: this replica lost step with the log.
    async fn on_log_record(
        &mut self,
        e: pando_proto::SearchResultEntry,
        cookie: Option<Cookie>,
    ) -> Result<Option<Ended>, Failed> {
        let csn_from_cookie = cookie.as_ref().and_then(|c| change_csn(&self.last, c));
        let cookie = cookie.map(|c| self.held_with(c));
        let rec = match delta::parse_record(&e.attrs) {
            Ok(rec) => rec,
            Err(why) => return Ok(Some(self.lost_step(&e.dn, &why))),
        };
        let csn = rec.csn.clone().or(csn_from_cookie);
        // Held already: sent again, or older than this replica's state.
        let sid = csn.as_deref().and_then(pando_proto::sync::csn_sid);
        let held = sid.and_then(|sid| self.last.csn_for(sid));
        if held.is_some_and(|t| csn.as_deref().is_some_and(|c| c <= t)) {
            return Ok(None);
        }
        self.check_clock(csn.as_deref(), &rec.dn);
        if self.recent.len() > 16 * WINDOW || rec.kind == RecordKind::ModRdn {
            // A rename moves what is below it: read from the store.
            self.settle().await?;
            self.recent.clear();
        }
        let received = match self.change_for_record(&rec, csn.as_deref())? {
            Ok(r) => r,
            Err(Lost(why)) => return Ok(Some(self.lost_step(&e.dn, &why))),
        };
        let text = cookie.as_ref().map(Cookie::format);
        match received {
            Some(r) => {
                self.apply_counted(r, text, csn).await?;
                if let Some(c) = cookie {
                    self.last = c;
                }
                if rec.kind == RecordKind::ModRdn {
                    self.settle().await?;
                }
            }
            None => {
                if let Some(c) = cookie {
                    self.store_cookie(c, None, false).await?;
                }
            }
        }
        Ok(None)
    }

    fn lost_step(&self, record: &str, why: &str) -> Ended {
        tracing::warn!(
            rid = self.cfg.rid,
            provider = %self.cfg.provider,
            record,
            "delta-sync lost step with the provider's log ({why}): refreshing the data whole, then following the log again"
        );
        Ended::Reload
    }

    /// The entry held here at `dn` (normalised `norm`), as the changes
    /// queued leave it.
    fn held_entry(&self, dn: &Dn, norm: &str) -> Result<Option<Entry>, Failed> {
        if let Some(e) = self.recent.get(norm) {
            return Ok(e.clone());
        }
        let rtxn = self.server.rt.store.read()?;
        let view = rtxn.view();
        Ok(match view.lookup(dn)? {
            Ok(pando_store::Lookup::Found(id)) => view.entry(id)?,
            _ => None,
        })
    }

    /// What a log record changes here: None when nothing (applied before,
    /// or outside this consumer's base); Lost when it cannot apply.
    fn change_for_record(
        &mut self,
        rec: &LogRecord,
        csn: Option<&str>,
    ) -> Result<Result<Option<Received>, Lost>, Failed> {
        let schema = self.server.schema.clone();
        let norm_of = |dn: &Dn| {
            schema
                .normalize_dn(dn)
                .map_err(|e| self.refuse(format_args!("a log record naming '{dn}': {e}")))
        };
        let norm = norm_of(&rec.dn)?;
        let base = self.replica.base.as_str();
        let inside = |n: &str| crate::ops::norm_dn::in_scope(base, Scope::Sub, n);
        let held = self.held_entry(&rec.dn, &norm)?;
        let lost = |what: &str| Ok(Err(Lost(format!("'{}' {what}", rec.dn))));
        let changed = match (rec.kind, held) {
            _ if !inside(&norm) && rec.kind != RecordKind::ModRdn => return Ok(Ok(None)),
            (RecordKind::Add, Some(h)) => {
                // Added before (the record came again): done.
                let done = csn.is_some_and(|c| change::entry_csn(&h).is_some_and(|t| t >= c));
                return if done {
                    Ok(Ok(None))
                } else {
                    lost("is added by the log but another entry holds its name here")
                };
            }
            (RecordKind::Add, None) => match delta::added_entry(&schema, rec) {
                Ok(e) => without_computed(e),
                Err(l) => return Ok(Err(l)),
            },
            (RecordKind::Delete, None) => return Ok(Ok(None)),
            (RecordKind::Delete, Some(h)) => {
                let Some(uuid) = change::entry_uuid(&h) else {
                    return lost("has no entryUUID here");
                };
                self.recent.insert(norm, None);
                return Ok(Ok(Some(Received::Delete(vec![uuid]))));
            }
            (_, None) if !inside(&norm) => {
                return lost("is renamed into the replicated subtree by the log but is not here")
            }
            (_, None) => return lost("is changed by the log but is not here"),
            (_, Some(h)) => match delta::changed_entry(&schema, &h, rec) {
                Ok(e) => e,
                Err(l) => return Ok(Err(l)),
            },
        };
        let new_norm = norm_of(&changed.dn)?;
        if !inside(&new_norm) {
            // Renamed out of the replicated subtree: gone from here.
            let Some(uuid) = change::entry_uuid(&changed) else {
                return lost("has no entryUUID here");
            };
            return Ok(Ok(Some(Received::Delete(vec![uuid]))));
        }
        if rec.kind != RecordKind::ModRdn {
            self.recent.insert(new_norm, Some(changed.clone()));
        }
        Ok(Ok(Some(Received::Entry(changed))))
    }

    /// Multi-provider, persist stage: whether the change stamped `csn`
    /// is already stored here, having come through another server (each
    /// change reaches a server by every path of the mesh). A server's
    /// changes come on every path in their CSN order, so one not newer
    /// than the state held for its server ID was applied; skipping it
    /// spares a write. (Refreshes, which send entries in no CSN order,
    /// are never skipped.)
    fn came_another_way(&self, csn: Option<&str>) -> Result<bool, Failed> {
        let Some(csn) = csn.filter(|_| self.server.multi_provider()) else {
            return Ok(false);
        };
        let Some(sid) = pando_proto::sync::csn_sid(csn) else {
            return Ok(false);
        };
        let rtxn = self.server.rt.store.read()?;
        let held = rtxn.view().context_csns()?;
        Ok(held
            .iter()
            .any(|h| pando_proto::sync::csn_sid(h) == Some(sid) && csn <= h.as_str()))
    }

    fn entry(&self, e: pando_proto::SearchResultEntry, uuid: &str) -> Result<Entry, Failed> {
        let dn = Dn::parse(&e.dn).map_err(|err| {
            self.refuse(format_args!(
                "an entry with a malformed DN '{}': {err}",
                e.dn
            ))
        })?;
        Ok(received_entry(dn, e.attrs, uuid))
    }

    async fn on_info(&mut self, info: SyncInfo) -> Result<(), Failed> {
        // From a log, UUIDs to delete or keep would name records, not
        // entries (OpenLDAP's consumer would apply them to its data).
        let names_uuids = matches!(
            info,
            SyncInfo::IdSet { .. } | SyncInfo::RefreshPresent { .. }
        );
        if self.log && names_uuids {
            return Err(self.refuse(format_args!(
                "UUIDs to keep or delete while following the log at '{}' (a log is never refreshed by a present phase)",
                self.cfg.logbase
            )));
        }
        match info {
            SyncInfo::NewCookie(c) => {
                let c = self.cookie_of(&c)?;
                if self.persisting {
                    let c = self.held_with(c);
                    self.store_cookie(c, None, false).await?;
                } else {
                    self.pending_cookie = Some(c);
                }
            }
            SyncInfo::IdSet {
                cookie,
                refresh_deletes,
                uuids,
            } => {
                let cookie = cookie.as_deref().map(|c| self.cookie_of(c)).transpose()?;
                if !self.persisting {
                    if cookie.is_some() {
                        self.pending_cookie = cookie;
                    }
                    if refresh_deletes {
                        self.pending_deletes.extend(uuids.iter().map(uuid_text));
                    } else {
                        self.present.extend(uuids);
                    }
                } else if refresh_deletes {
                    let n = uuids.len() as u64;
                    let csn = cookie.as_ref().and_then(|c| change_csn(&self.last, c));
                    if self.came_another_way(csn.as_deref())? {
                        if let Some(c) = cookie {
                            self.last = self.held_with(c);
                        }
                        set(self.replica, |s| s.skipped += 1);
                        return Ok(());
                    }
                    let text = cookie.as_ref().map(Cookie::format);
                    self.apply(
                        Received::Delete(uuids.iter().map(uuid_text).collect()),
                        text,
                        csn,
                    )
                    .await?;
                    if let Some(c) = cookie {
                        self.last = c;
                    }
                    set(self.replica, |s| s.deleted += n);
                } else {
                    return Err(self.refuse("present UUIDs after the refresh"));
                }
            }
            SyncInfo::RefreshPresent { cookie, done } => {
                self.on_refresh_end(cookie, done, false).await?
            }
            SyncInfo::RefreshDelete { cookie, done } => {
                self.on_refresh_end(cookie, done, true).await?
            }
        }
        Ok(())
    }

    /// refreshPresent (`deletes` FALSE) or refreshDelete: the end of a
    /// present or delete phase; with refreshDone the refresh is over and
    /// the persist stage begins.
    async fn on_refresh_end(
        &mut self,
        cookie: Option<Vec<u8>>,
        done: bool,
        deletes: bool,
    ) -> Result<(), Failed> {
        if self.persisting {
            return Err(self.refuse("a second end of the refresh"));
        }
        let cookie = cookie.as_deref().map(|c| self.cookie_of(c)).transpose()?;
        self.present_phase |= !deletes;
        if !done {
            // A phase ended, the refresh goes on (RFC 4533 3.4: a present
            // phase may be followed by a delete phase).
            if cookie.is_some() {
                self.pending_cookie = cookie;
            }
            return Ok(());
        }
        self.end_refresh(cookie, deletes).await?;
        if self.persist_mode() {
            self.persisting = true;
            set(self.replica, |s| s.phase = "persist");
        }
        Ok(())
    }
}

fn csn_of(entry: &Entry) -> Option<String> {
    change::entry_csn(entry).map(str::to_string)
}

/// The server ID of a change stamped `csn`, and how long ago (by this
/// server's clock) its CSN's time was, microseconds.
fn delay_of(csn: &str) -> Option<(u16, u64)> {
    let sid = pando_proto::sync::csn_sid(csn)?;
    let (at, _) = pando_store::clock::parse_csn(csn).ok()?;
    Some((sid, now().saturating_sub(at)))
}

/// An entry built from a log record, without the attributes each server
/// computes for itself.
fn without_computed(mut entry: Entry) -> Entry {
    entry.attrs.retain(|a| {
        let base = pando_model::desc::base(&a.desc);
        !crate::ops::COMPUTED
            .iter()
            .any(|c| c.eq_ignore_ascii_case(base))
    });
    entry
}

/// The entry as received: computed attributes (each server computes its
/// own, contextCSN among them) dropped, entryUUID the one the Sync State
/// control names.
fn received_entry(dn: Dn, attrs: Vec<pando_proto::PartialAttribute>, uuid: &str) -> Entry {
    let mut entry = Entry::new(dn);
    for a in attrs {
        let base = pando_model::desc::base(&a.name);
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
