//! Push replication (`[[replication.push]]`, OpenLDAP's push-mode
//! syncrepl): one task per push follows this server's change log for a
//! subtree and writes each change, as ordinary LDAP writes, to a target
//! that cannot pull it (slapd without syncprov, or any server).
//!
//! **Its place** is, per server ID, the CSN of the newest change pushed
//! (the store's contextCSN form), kept in the store's meta under
//! `push:NNN` with the target's URL: written after each whole-subtree
//! load and at most once a second while pushing, so a restart of either
//! side goes on from there. A change is pushed when its CSN is newer than
//! the place for its server ID, so changes received late from another
//! provider (multi-provider) are not skipped.
//!
//! **Idempotent pushing**: the changes made since the last place written
//! (at most a second's) are pushed again after a crash, and change
//! nothing: an add that meets the entry makes it equal, a delete that
//! meets nothing is done, modifies are permissive (values already there
//! or already gone are no error). A change the target refuses for its
//! content (schema, naming) is logged with its result code, counted in
//! the status, and passed; one it cannot take now (down, busy, access
//! refused, a referral) ends the session, which is retried on the
//! push's schedule from the same place.
//!
//! **Whole loads**: with no place (a new push, another target), or a
//! place the log no longer reaches (purged; this server's own refresh as
//! a consumer wrote around the log), the target's copy of the subtree is
//! read and made equal to this server's entry by entry (`target`).
//!
//! What is pushed: user attributes, less `exattrs`; operational ones
//! (entryUUID, entryCSN, timestamps) are the target's own.

mod target;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pando_config::consumer::Retry;
use pando_config::push::PushConfig;
use pando_model::{Dn, Schema};
use pando_proto::sync::csn_sid;
use pando_proto::{PartialAttribute, Scope};
use pando_store::{LoggedChange, LoggedKind, View};

use crate::state::Server;
use target::{Item, Target};

/// Per server ID, the newest CSN pushed.
type Place = BTreeMap<u16, String>;

/// Changes read and pushed in one go; the place moves after each.
const BATCH: usize = 256;
/// The place is written at most this often while changes flow.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// One configured push, as the rest of the server sees it.
pub struct Pusher {
    pub rid: u16,
    pub cfg: PushConfig,
    /// The normalised search base.
    base: String,
    status: Mutex<Status>,
    /// The place the target holds, once known (kept across sessions, so a
    /// target's restart costs no change pushed again), and whether it
    /// moved since it was last written.
    place: Mutex<Option<(Place, bool)>>,
    /// Its task, ended when the push is removed or replaced.
    tasks: super::Tasks,
}

/// How a push is doing (`pando repl status`, cn=Monitor).
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// connecting, loading, pushing, idle, retrying, stopped.
    pub phase: &'static str,
    /// Per server ID, the newest CSN the target holds.
    pub place: Vec<String>,
    /// Changes written to the target since the server started.
    pub pushed: u64,
    /// Changes the target refused for their content (each logged).
    pub refused: u64,
    /// Whole-subtree loads.
    pub loads: u64,
    pub failures: u64,
    pub last_error: Option<String>,
    /// When the last change was pushed (microseconds since 1970).
    pub last_push: Option<u64>,
}

impl Pusher {
    pub(super) fn new(schema: &Schema, cfg: &PushConfig) -> Pusher {
        Pusher {
            rid: cfg.rid,
            cfg: cfg.clone(),
            base: Dn::parse(&cfg.search_base)
                .ok()
                .and_then(|d| schema.normalize_dn(&d).ok())
                .unwrap_or_default(),
            status: Mutex::new(Status {
                phase: "connecting",
                ..Status::default()
            }),
            tasks: super::Tasks::default(),
            place: Mutex::new(None),
        }
    }

    fn place(&self) -> Option<Place> {
        self.place.lock().ok()?.as_ref().map(|(p, _)| p.clone())
    }

    /// The target now holds `place`; `dirty`: not yet written.
    fn hold(&self, place: &Place, dirty: bool) {
        if let Ok(mut p) = self.place.lock() {
            *p = Some((place.clone(), dirty));
        }
        self.set(|s| s.place = place.values().cloned().collect());
    }

    /// The place, if it moved since last written.
    fn unsaved(&self) -> Option<Place> {
        match self.place.lock().ok()?.as_ref() {
            Some((p, true)) => Some(p.clone()),
            _ => None,
        }
    }

    /// How the push is doing.
    pub fn snapshot(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    pub(super) fn start(self: &Arc<Self>, server: &Arc<Server>) {
        self.tasks
            .add([tokio::spawn(run(server.clone(), self.clone()))]);
    }

    /// Stop its task and wait (at most 10 s) for it to end.
    pub(super) async fn end(&self) {
        self.tasks.end(self.rid).await
    }

    async fn stopped(&self) {
        self.tasks.stopped().await
    }
}

/// Why a session ended; the text names the problem.
#[derive(Debug)]
pub(crate) struct Failed(pub String);

impl From<pando_client::ClientError> for Failed {
    fn from(e: pando_client::ClientError) -> Self {
        Failed(e.0)
    }
}

impl From<pando_store::StoreError> for Failed {
    fn from(e: pando_store::StoreError) -> Self {
        Failed(format!("reading this server's store: {e}"))
    }
}

impl From<crate::error::LdapError> for Failed {
    fn from(e: crate::error::LdapError) -> Self {
        Failed(format!("reading this server's store: {}", e.message))
    }
}

fn now() -> u64 {
    pando_store::clock::now_micros()
}

/// The push `p` until the server closes or the push is removed or
/// changed; after a failure, the next session waits as `retry` says.
async fn run(server: Arc<Server>, p: Arc<Pusher>) {
    let retry = Retry::parse(&p.cfg.retry).unwrap_or(Retry(vec![(Duration::from_secs(60), None)]));
    let mut closing = server.rt.feed.closing();
    let mut failures = 0u32;
    loop {
        p.set(|s| s.phase = "connecting");
        let current = server.current();
        let ended = tokio::select! {
            e = session(&current, &p, &mut failures) => e,
            _ = closing.changed() => break,
            _ = p.stopped() => break,
        };
        let Failed(why) = ended;
        failures += 1;
        p.set(|s| {
            s.failures += 1;
            s.phase = "retrying";
            s.last_error = Some(why.clone());
        });
        let Some(wait) = retry.wait(failures) else {
            tracing::error!(rid = p.rid, target = %p.cfg.target, "push failed and the retry schedule ('{}') is used up; it stops until the server restarts: {why}", p.cfg.retry);
            break;
        };
        tracing::warn!(rid = p.rid, target = %p.cfg.target, "push failed, next try in {}s: {why}", wait.as_secs());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = closing.changed() => break,
            _ = p.stopped() => break,
        }
    }
    // Where the target is, for the next start (best effort: the store
    // may be closing).
    if let Some(place) = p.unsaved() {
        let save = save_place(&server, &p, &place);
        if let Ok(Err(Failed(why))) = tokio::time::timeout(Duration::from_secs(2), save).await {
            tracing::warn!(rid = p.rid, "the push's place was not kept: {why}");
        }
    }
    p.set(|s| s.phase = "stopped");
}

/// One connection to the target: load the subtree whole when the place
/// says so, then push what the log holds past the place, waiting for
/// commits when there is nothing. Ends only by failing.
async fn session(server: &Arc<Server>, p: &Pusher, failures: &mut u32) -> Failed {
    match follow(server, p, failures).await {
        Ok(never) => match never {},
        Err(f) => f,
    }
}

async fn follow(
    server: &Arc<Server>,
    p: &Pusher,
    failures: &mut u32,
) -> Result<std::convert::Infallible, Failed> {
    // Subscribed before the first read: no commit after it goes unnoticed.
    let mut feed = server.rt.feed.subscribe();
    let mut target = Target::connect(server, p).await?;
    let mut place = match p.place() {
        Some(place) => place,
        None => match stored_place(server, p)? {
            Some(place) => {
                p.hold(&place, false);
                place
            }
            None => load(server, p, &mut target).await?,
        },
    };
    *failures = 0;
    let mut saved = Instant::now();
    loop {
        if let Some(unsaved) = p.unsaved().filter(|_| saved.elapsed() >= SAVE_EVERY) {
            save_place(server, p, &unsaved).await?;
            saved = Instant::now();
        }
        let read = {
            let (s, at) = (server.clone(), place.clone());
            let base = p.base.clone();
            let cfg = p.cfg.clone();
            tokio::task::spawn_blocking(move || read_batch(&s, &base, &cfg, &at))
                .await
                .map_err(|_| Failed("reading the change log failed".into()))??
        };
        match read {
            Read::Idle => {
                p.set(|s| s.phase = "idle");
                let wait = match p.unsaved() {
                    Some(_) => SAVE_EVERY,
                    None => Duration::from_secs(30),
                };
                tokio::select! {
                    _ = feed.recv() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Read::Lost(why) => {
                tracing::warn!(rid = p.rid, target = %p.cfg.target, "{why}: loading the subtree whole");
                place = load(server, p, &mut target).await?;
                saved = Instant::now();
            }
            Read::Changes { steps, end } => {
                p.set(|s| s.phase = "pushing");
                push_steps(p, &mut target, steps, &mut place).await?;
                if let Some(end) = end {
                    place.extend(end);
                    p.hold(&place, true);
                }
            }
        }
    }
}

/// Push `steps`, moving `place` past each operation once all its entries
/// are pushed.
async fn push_steps(
    p: &Pusher,
    target: &mut Target<'_>,
    steps: Vec<Step>,
    place: &mut Place,
) -> Result<(), Failed> {
    let mut steps = steps.into_iter().peekable();
    while let Some(step) = steps.next() {
        if let Some(item) = step.item {
            target.push(item).await?;
            p.set(|s| {
                s.pushed += 1;
                s.last_push = Some(now());
            });
        }
        if steps.peek().is_none_or(|next| next.csn != step.csn) {
            place.insert(step.sid, step.csn);
            p.hold(place, true);
        }
    }
    Ok(())
}

/// Make the target's subtree equal to this server's, and write the
/// place that snapshot stands for.
async fn load(server: &Arc<Server>, p: &Pusher, target: &mut Target<'_>) -> Result<Place, Failed> {
    p.set(|s| {
        s.phase = "loading";
        s.loads += 1;
    });
    let (s, cfg) = (server.clone(), p.cfg.clone());
    let (entries, place) = tokio::task::spawn_blocking(move || -> Result<_, Failed> {
        let rtxn = s.rt.store.read()?;
        let view = rtxn.view();
        let filter = target::Pushed::new(&s.schema, &cfg.exattrs);
        let entries = local_subtree(&view, &cfg.search_base, &filter)?;
        Ok((entries, context_place(&view)?))
    })
    .await
    .map_err(|_| Failed("reading this server's subtree failed".into()))??;
    let count = entries.len();
    target.converge(&p.cfg.search_base, entries).await?;
    save_place(server, p, &place).await?;
    p.hold(&place, false);
    tracing::info!(rid = p.rid, target = %p.cfg.target, "pushed the subtree whole ({count} entries)");
    Ok(place)
}

/// What the change log holds past a place.
enum Read {
    /// Nothing new.
    Idle,
    /// The log does not reach back to the place (why).
    Lost(String),
    /// The logged changes past the place (at most about [`BATCH`],
    /// whole operations), and, when the log was read to its end, the
    /// place once they are pushed.
    Changes {
        steps: Vec<Step>,
        end: Option<Place>,
    },
}

/// One logged change, and what the target must do for it (None: it is
/// outside the subtree).
struct Step {
    sid: u16,
    csn: String,
    item: Option<Item>,
}

/// The changes in the subtree past `place`, from one snapshot.
fn read_batch(
    server: &Server,
    base: &str,
    cfg: &PushConfig,
    place: &Place,
) -> Result<Read, Failed> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let held = context_place(&view)?;
    let past = |sid: &u16| place.get(sid).map_or("", String::as_str);
    let pending: Vec<u16> = held
        .iter()
        .filter(|(sid, csn)| csn.as_str() > past(sid))
        .map(|(sid, _)| *sid)
        .collect();
    let Some(start) = pending.iter().map(past).min() else {
        return Ok(Read::Idle);
    };
    let floor = view.changelog_floor()?;
    if start < floor.as_str() {
        return Ok(Read::Lost(format!(
            "the change log no longer reaches back to this push's place ({}; it holds every change after {floor})",
            if start.is_empty() { "nothing pushed" } else { start }
        )));
    }
    let scope = Scoped {
        server,
        base,
        cfg,
        view: &view,
    };
    let mut steps: Vec<Step> = Vec::new();
    for change in view.changes_after(start)? {
        let c = change?;
        let Some(sid) = csn_sid(&c.csn) else { continue };
        if c.csn.as_str() <= past(&sid) {
            continue;
        }
        // Between operations, once the batch is full.
        if steps.len() >= BATCH && steps.last().is_some_and(|s| s.csn != c.csn) {
            return Ok(Read::Changes { steps, end: None });
        }
        let item = scope.item(&c)?;
        steps.push(Step {
            sid,
            csn: c.csn,
            item,
        });
    }
    // The log was read to its end: once these are pushed, the target
    // holds the snapshot's state (whose contextCSN may name a CSN no
    // logged change carries: a provider's cookie).
    Ok(Read::Changes {
        steps,
        end: Some(held),
    })
}

/// The contextCSN of `view`, per server ID.
fn context_place(view: &View<'_>) -> Result<Place, Failed> {
    Ok(view
        .context_csns()?
        .into_iter()
        .filter_map(|c| Some((csn_sid(&c)?, c)))
        .collect())
}

/// One snapshot's view of the pushed subtree.
struct Scoped<'a> {
    server: &'a Server,
    base: &'a str,
    cfg: &'a PushConfig,
    view: &'a View<'a>,
}

impl Scoped<'_> {
    fn holds(&self, dn: &str) -> bool {
        Dn::parse(dn)
            .ok()
            .and_then(|d| self.server.schema.normalize_dn(&d).ok())
            .is_some_and(|n| crate::ops::norm_dn::in_scope(self.base, Scope::Sub, &n))
    }

    /// What the target must do for the logged change `c` (None: nothing,
    /// it is outside the subtree).
    fn item(&self, c: &LoggedChange) -> Result<Option<Item>, Failed> {
        let filter = target::Pushed::new(&self.server.schema, &self.cfg.exattrs);
        let now_in = self.holds(&c.dn);
        let was_in = c.old_dn.as_deref().is_some_and(|d| self.holds(d));
        Ok(match c.kind {
            LoggedKind::Add if now_in => Some(Item::Add {
                dn: c.dn.clone(),
                attrs: filter.added(&c.mods),
            }),
            LoggedKind::Delete if now_in => Some(Item::Delete { dn: c.dn.clone() }),
            LoggedKind::Modify if now_in => {
                let mods = filter.mods(&c.mods);
                (!mods.is_empty()).then(|| Item::Modify {
                    dn: c.dn.clone(),
                    mods,
                })
            }
            LoggedKind::ModDn => match (was_in, now_in, c.old_dn.as_deref()) {
                (true, true, Some(old)) => Some(target::rename(old, &c.dn, &c.mods, &filter)),
                // Moved out: the target's copy goes.
                (true, false, Some(old)) => Some(Item::Subtree {
                    dn: old.to_string(),
                    entries: Vec::new(),
                }),
                // Moved in: the subtree as it is now.
                (false, true, _) => Some(Item::Subtree {
                    dn: c.dn.clone(),
                    entries: local_subtree(self.view, &c.dn, &filter)?,
                }),
                _ => None,
            },
            _ => None,
        })
    }
}

/// The entries of this server's subtree `base` (parents before
/// children), with the attributes pushed.
fn local_subtree(
    view: &View<'_>,
    base: &str,
    filter: &target::Pushed<'_>,
) -> Result<Vec<(String, Vec<PartialAttribute>)>, Failed> {
    let dn = Dn::parse(base).map_err(|e| Failed(format!("'{base}': {e}")))?;
    let Ok(pando_store::Lookup::Found(top)) = view.lookup(&dn)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut level = vec![top];
    while !level.is_empty() {
        let mut below = Vec::new();
        for id in level {
            let entry = crate::ops::stored_entry(view, id)?;
            out.push((view.dn_string(id)?, filter.entry(&entry.attrs)));
            below.extend(view.children(id)?);
        }
        level = below;
    }
    Ok(out)
}

/// The meta key of push `rid`'s place.
fn place_key(rid: u16) -> String {
    format!("push:{rid:03}")
}

/// The place stored for `p`, if it was made for the same target.
fn stored_place(server: &Server, p: &Pusher) -> Result<Option<Place>, Failed> {
    let rtxn = server.rt.store.read()?;
    let Some(v) = rtxn.view().meta_get(&place_key(p.rid))? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&v);
    let (url, csns) = text.split_once('\n').unwrap_or((&text, ""));
    if url != p.cfg.target {
        tracing::info!(
            rid = p.rid,
            "this push's place was kept for {url}, not {}: loading the subtree whole",
            p.cfg.target
        );
        return Ok(None);
    }
    Ok(Some(
        csns.split(';')
            .filter_map(|c| Some((csn_sid(c)?, c.to_string())))
            .collect(),
    ))
}

/// Write `place` as the place the target holds.
async fn save_place(server: &Server, p: &Pusher, place: &Place) -> Result<(), Failed> {
    let csns: Vec<&str> = place.values().map(String::as_str).collect();
    let value = format!("{}\n{}", p.cfg.target, csns.join(";"));
    let key = place_key(p.rid);
    server
        .rt
        .store
        .write(move |w| w.meta_put(&key, value.as_bytes()))
        .await
        .map_err(|e: pando_store::StoreError| Failed(format!("keeping the push's place: {e}")))?;
    if let Ok(mut held) = p.place.lock() {
        if let Some((now, dirty)) = held.as_mut() {
            if now == place {
                *dirty = false;
            }
        }
    }
    Ok(())
}
