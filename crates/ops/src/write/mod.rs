//! The write pipeline: add, delete, modify, modify DN and Password Modify
//! (RFC 4511 4.6–4.9, RFC 4525, RFC 3062) all pass through [`run`].
//!
//! ```text
//! parse + normalise + request checks    (each operation's file; no store access)
//! slow work (password hashing)          (after access is settled on a snapshot)
//! ── plan ── on the writer's view, or on a snapshot the writer confirms
//!    WriteOp::plan: resolve, access, compute the new entry, check the schema
//!    Hook::check, every hook in order    (assertion, read-entry access)
//! ── in the writer's transaction ──
//!    Hook::related                       (overlays: changes to other
//!                                         entries; uniqueness)
//!    stamp: one CSN; timestamps, names, UUID; contextCSN
//!    Hook::in_txn                        (pre-read / post-read values)
//!    write to the store; a change log record for each entry
//!    no-op control: roll back here, answer noOperation
//! ── commit (group commit, per the durability mode) ──
//!    on the writer thread: publish to the change feed (commit order)
//!    WriteOp::audit                     (post-commit: the audit log)
//! ```
//!
//! Everything that depends on stored state runs on the state that is
//! committed: a failing operation changes nothing, and a concurrent change
//! cannot slip between a check and the write. Modify plans on a snapshot
//! outside the writer (the writer only confirms that the entries it read
//! are byte-for-byte unchanged, else the operation is planned again), so
//! the single writer's time per modify stays short.

mod add;
mod ancestry;
pub mod change;
mod changes;
mod checks;
pub mod conflicts;
mod delete;
pub mod hooks;
mod local;
pub mod log;
pub mod merge;
mod modify;
mod multi_provider;
mod partial;
mod rename;
pub mod replicated;
pub mod tombstones;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pando_proto::{Control, ResultCode};
use pando_store::{EntryId, StoreError, View, WriteTxn};

pub use crate::job::WriteCtx;
pub use add::{add, request_for};
pub use change::{Before, Change};
pub use changes::{apply_changes, check_invariants};
pub use checks::random_uuid;
pub use delete::delete;
pub use local::Stamps;
pub use modify::modify;
pub use rename::modify_dn;

use super::feed::Committed;
use crate::error::{LdapError, OpResult};
use crate::state::Server;

/// One write operation, as the pipeline runs it.
///
/// Besides the operation's own steps (`plan`, `in_txn`, `audit`), the
/// pipeline has stages that depend on where a write comes from. Their
/// defaults are those of a write made here, by a client or by the server
/// itself (`local.rs`); a change a replication consumer received
/// (`replicated::Replicated`) gives its own. The pipeline itself never
/// asks where a write came from.
pub trait WriteOp: Send + Sync + 'static {
    /// Plan on a read snapshot, outside the writer (see the module header).
    const ON_SNAPSHOT: bool = false;

    /// Work out the changes on `view`: resolve the target, check access,
    /// compute the new entries, check the schema. The first change is the
    /// operation's target; others (a tree delete's subtree) follow.
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>>;

    /// After the changes are written, in the same transaction: what the
    /// operation keeps besides entries (none by default).
    fn in_txn(&self, _ctx: &WriteCtx, _w: &mut WriteTxn<'_>, _csn: &str) -> OpResult<()> {
        Ok(())
    }

    /// After the commit: the audit log.
    fn audit(&self, ctx: &WriteCtx, changes: &[Change]);

    /// On the writer, before anything: whether the write may still go.
    fn may_start(&self) -> OpResult<()> {
        Ok(())
    }

    /// On the writer's view, once planned: the changes to other entries
    /// the write makes (the overlays'), or its refusal.
    fn related(&self, ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
        local::related(ctx, view, changes)
    }

    /// The operation's CSN, and the stamps of the entries it writes.
    fn stamp(
        &self,
        ctx: &WriteCtx,
        w: &mut WriteTxn<'_>,
        changes: &mut [Change],
    ) -> OpResult<String> {
        local::stamp(ctx, w, changes)
    }

    /// Whom the change log names as the author of each change; None: the
    /// changes are not logged.
    fn logged_as<'a>(&'a self, ctx: &'a WriteCtx) -> Option<&'a str> {
        Some(ctx.who.dn())
    }

    /// The write failed (or its plan panicked).
    fn failed(&self) {}

    /// Whether the change feed carries the write out of CSN order.
    fn out_of_order(&self) -> bool {
        false
    }
}

/// What a successful write answers with.
#[derive(Debug, Default)]
pub struct Written {
    /// Response controls (pre-read, post-read).
    pub controls: Vec<Control>,
    /// The no-op control was honoured: nothing was committed, and the
    /// result is noOperation.
    pub no_op: bool,
}

/// How a job on the writer thread ends other than by committing. Any of
/// these rolls back the operation's nested transaction.
enum Stop {
    Failed(LdapError),
    /// The no-op control: everything was done, nothing is kept.
    NoOp(Vec<Control>),
    /// A snapshot-planned entry changed before the writer got to it.
    Replan,
}

impl From<LdapError> for Stop {
    fn from(e: LdapError) -> Self {
        Stop::Failed(e)
    }
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Failed(e.into())
    }
}

/// How many times a write is planned on a snapshot before, its entry
/// having changed under it each time, it is planned in the writer itself
/// (which nothing can change under): an entry written by many clients at
/// once is then written one request after another, as slapd's entry lock
/// does, instead of a request losing the race for good.
const SNAPSHOT_TRIES: usize = 4;

/// Checks of the request's controls that need no store access.
fn check_controls(ctx: &WriteCtx) -> OpResult<()> {
    if ctx.controls.relax && !ctx.who.is_admin() {
        return Err(LdapError::access(
            "the relax rules control is only for administrators",
        ));
    }
    Ok(())
}

/// What a job on the writer thread gives back when it commits.
type Committing = (Arc<Committed>, Vec<Control>);

/// The writer's job for `op`: plan (or confirm what was planned on a
/// snapshot), apply, publish.
fn job<W: WriteOp>(
    ctx: Arc<WriteCtx>,
    op: Arc<W>,
    planned: Option<Vec<Change>>,
) -> impl FnOnce(&mut WriteTxn<'_>) -> Result<Committing, Stop> + Send + 'static {
    move |w: &mut WriteTxn<'_>| {
        op.may_start()?;
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut changes = match planned {
                Some(changes) => confirm(w, changes)?,
                None => plan_and_check(&ctx, &*op, &w.view())?,
            };
            op.related(&ctx, &w.view(), &mut changes)?;
            let (csn, controls) = apply(&ctx, &*op, w, &mut changes)?;
            op.in_txn(&ctx, w, &csn)?;
            Ok((changes, csn, controls))
        }));
        let ended = match ended {
            Ok(ended) => ended,
            Err(panic) => {
                op.failed();
                std::panic::resume_unwind(panic)
            }
        };
        if let Err(Stop::Failed(_)) = &ended {
            op.failed();
        }
        let (changes, csn, controls) = ended?;
        if ctx.controls.no_op {
            return Err(Stop::NoOp(controls));
        }
        if changes.is_empty() {
            // Nothing written (a replicated cookie alone): nothing to tell.
            return Ok((
                Arc::new(Committed {
                    csn,
                    changes,
                    out_of_order: false,
                }),
                controls,
            ));
        }
        let out_of_order = op.out_of_order();
        Ok((
            publish(&ctx.server, w, csn, changes, out_of_order),
            controls,
        ))
    }
}

/// How a job ended, as the operation answers.
fn answer<W: WriteOp>(
    ctx: &WriteCtx,
    op: &W,
    ended: Result<Committing, Stop>,
) -> Option<OpResult<Written>> {
    Some(match ended {
        Ok((committed, controls)) => {
            op.audit(ctx, &committed.changes);
            train_dictionary_when_due(&ctx.server);
            Ok(Written {
                controls,
                no_op: false,
            })
        }
        Err(Stop::NoOp(controls)) => Ok(Written {
            controls,
            no_op: true,
        }),
        Err(Stop::Failed(e)) => Err(e),
        Err(Stop::Replan) => return None,
    })
}

/// Writes between two looks at whether the store needs a compression
/// dictionary (`pando_store::Store::train_dictionary_if_missing`).
const DICTIONARY_CHECK_EVERY: u64 = 1024;

/// A store filled over LDAP (a consumer's initial load, ldapadd) gets the
/// dictionary `pando import` would have trained, once it holds enough
/// entries; trained on the blocking pool, off every write's path.
fn train_dictionary_when_due(server: &Arc<Server>) {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let codec = server.rt.store.codec();
    if codec.level().is_none() || codec.current_dict().is_some() {
        return;
    }
    if !WRITES
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(DICTIONARY_CHECK_EVERY)
    {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let store = server.rt.store.clone();
    rt.spawn_blocking(move || match store.train_dictionary_if_missing() {
        Ok(Some(id)) => tracing::info!(dictionary = id, "trained a compression dictionary on the entries written so far: entries written from now on use it"),
        Ok(None) => {}
        Err(e) => tracing::warn!("training a compression dictionary failed: {e}"),
    });
}

/// Run a write through the pipeline (see the module header).
pub async fn run<W: WriteOp>(ctx: Arc<WriteCtx>, op: Arc<W>) -> OpResult<Written> {
    let server = ctx.server.clone();
    for attempt in 0..=SNAPSHOT_TRIES {
        let planned = if W::ON_SNAPSHOT && attempt < SNAPSHOT_TRIES {
            let rtxn = server.rt.store.read()?;
            Some(plan_and_check(&ctx, &*op, &rtxn.view())?)
        } else {
            None
        };
        let ended = server
            .rt
            .store
            .write(job(ctx.clone(), op.clone(), planned))
            .await;
        if let Some(answered) = answer(&ctx, &*op, ended) {
            return answered;
        }
    }
    // Planned in the writer, a write is never sent back to be planned again.
    Err(LdapError::new(
        ResultCode::OTHER,
        "a write planned in the writer was sent back to be planned again",
    ))
}

/// Queue `op` (planned on the writer's view) now, in call order with
/// other queued writes, so a caller can have many in flight and still
/// know they are applied in order; the future gives its answer.
pub fn queue<W: WriteOp>(
    ctx: Arc<WriteCtx>,
    op: Arc<W>,
) -> impl std::future::Future<Output = OpResult<Written>> + Send + 'static {
    debug_assert!(!W::ON_SNAPSHOT);
    let queued = ctx
        .server
        .rt
        .store
        .submit(job(ctx.clone(), op.clone(), None));
    async move {
        let ended = match queued {
            Ok(rx) => rx
                .await
                .unwrap_or(Err(Stop::Failed(StoreError::Closed.into()))),
            Err(stop) => Err(stop),
        };
        answer(&ctx, &*op, ended).unwrap_or_else(|| {
            Err(LdapError::new(
                ResultCode::OTHER,
                "a queued write cannot be planned again",
            ))
        })
    }
}

/// Plan, then run every hook's check on the same view.
pub(super) fn plan_and_check<W: WriteOp>(
    ctx: &WriteCtx,
    op: &W,
    view: &View<'_>,
) -> OpResult<Vec<Change>> {
    let changes = op.plan(ctx, view)?;
    for hook in hooks::all(ctx) {
        hook.check(ctx, view, &changes)?;
    }
    Ok(changes)
}

/// The writer's side of a snapshot-planned write: every entry read must
/// still be stored exactly as it was read.
fn confirm(w: &WriteTxn<'_>, changes: Vec<Change>) -> Result<Vec<Change>, Stop> {
    let view = w.view();
    for c in &changes {
        match (&c.before, &c.after) {
            (Some(b), _) => {
                if let Some(bytes) = &b.bytes {
                    if view.entry_bytes(b.id)? != Some(bytes.as_slice()) {
                        return Err(Stop::Replan);
                    }
                }
            }
            // An entry added (a partial entry's new part) made meanwhile.
            (None, Some(after)) => {
                let rdns = crate::norm_rdns(&view, &after.dn)?;
                if let pando_store::Lookup::Found(_) = view.lookup_norm(&rdns)? {
                    return Err(Stop::Replan);
                }
            }
            (None, None) => {}
        }
    }
    Ok(changes)
}

/// The changes as the change feed will carry them, in the order written,
/// published once they are committed.
fn publish(
    server: &Arc<Server>,
    w: &mut WriteTxn<'_>,
    csn: String,
    changes: Vec<Change>,
    out_of_order: bool,
) -> Arc<Committed> {
    let mut changes = changes;
    changes.reverse();
    for c in &mut changes {
        if let Some(b) = c.before.as_mut() {
            b.bytes = None;
        }
    }
    let committed = Arc::new(Committed {
        csn,
        changes,
        out_of_order,
    });
    let (server, published) = (server.clone(), committed.clone());
    w.after_commit(move || server.rt.feed.publish(published));
    committed
}

/// In the writer's transaction: stamp, run the hooks, write. Returns the
/// operation's CSN and the response controls the hooks made.
fn apply<W: WriteOp>(
    ctx: &WriteCtx,
    op: &W,
    w: &mut WriteTxn<'_>,
    changes: &mut [Change],
) -> Result<(String, Vec<Control>), Stop> {
    let csn = op.stamp(ctx, w, changes)?;
    let logged_as = op.logged_as(ctx);
    let mut controls = Vec::new();
    for hook in hooks::all(ctx) {
        hook.in_txn(ctx, w, changes, &mut controls)?;
    }
    // In reverse: a tree delete lists its subtree in pre-order, and
    // children go before their parents. A replicated add may hang below
    // an entry added by a later change of the list (glue): its parent
    // names that change (`change::GLUE_PARENT - index`).
    let mut added: Vec<(usize, EntryId)> = Vec::new();
    let count = changes.len();
    if logged_as.is_none() && count > 0 {
        w.count_unlogged_write()?;
    }
    let multi_provider = ctx.server.multi_provider();
    for (seq, (index, c)) in changes.iter_mut().enumerate().rev().enumerate() {
        if let Some(place) = c.place.as_mut() {
            if place.parent > change::GLUE_PARENT - count as u64 {
                let wanted = (change::GLUE_PARENT - place.parent) as usize;
                place.parent = added
                    .iter()
                    .find(|(i, _)| *i == wanted)
                    .map(|(_, id)| *id)
                    .ok_or_else(|| {
                        LdapError::new(ResultCode::OTHER, "malformed write plan (glue)")
                    })?;
            }
        }
        if let Some(by) = logged_as {
            log::log(w, &csn, seq as u32, c, by)?;
        }
        if c.after.as_ref().is_some_and(crate::is_subentry) {
            ctx.server.rt.subentries.written();
        }
        if multi_provider {
            tombstones::remember(w, c, &csn)?;
        }
        match (&c.before, &c.after, &c.place) {
            (None, Some(after), Some(place)) => {
                added.push((index, w.add(place, &after.attrs)?));
            }
            (Some(before), None, _) => {
                w.delete(before.id, &before.entry.attrs)?;
            }
            (Some(before), Some(after), place) => {
                if let Some(place) = place {
                    w.rename(before.id, place)?;
                }
                w.replace(before.id, &before.entry.attrs, &after.attrs)?;
            }
            // An add always has a place; nothing else is planned.
            _ => return Err(LdapError::new(ResultCode::OTHER, "malformed write plan").into()),
        }
    }
    log::purge(w, &ctx.server.cfg.config.replication)?;
    if multi_provider {
        let days = ctx.server.cfg.config.replication.changelog_days;
        tombstones::expire(w, &log::cutoff(days), 16)?;
    }
    Ok((csn, controls))
}
