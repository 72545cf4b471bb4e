//! The seams between the operations and the layers above them: every
//! trait through which the state holds what it must not name (cn=config,
//! the overlays, the password policy, remote trees, virtual trees) and
//! the hooks writes and searches pass through. Types only: this file,
//! `state` and `job` import each other and nothing else of the crate
//! but plain data (controls, errors, changes).
//!
//! Each trait is implemented above the operations (the configuration
//! layer, the overlays, observability) and given to the state when it is
//! assembled; the file named beside each section says how the operations
//! use it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use pando_access::Identity;
use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::sync::{Cookie, SyncRequest};
use pando_proto::{Control, ProtocolOp, ResultCode};
use pando_store::{View, WriteTxn};

use crate::error::{LdapError, OpResult};
use crate::job::{Finished, Operation, Path, Response, SearchJob, SearchOutcome, WriteCtx};
use crate::state::Server;
use crate::write::change::Change;

// ── cn=config (`config_tree`) ─────────────────────────────────────────

/// A change of cn=config as its tree is asked for it. The controls the
/// operations act on (assertion, No-Op, pre- and post-read) are not in
/// it: `config_write::write` applies them around the tree's staged change,
/// so the tree cannot leave one out.
pub struct ConfigChange<'a> {
    pub who: &'a Identity,
    /// The add, delete, modify or modify DN.
    pub request: &'a ProtocolOp,
    /// The target's DN, normalised and as the request gave it.
    pub norm: &'a str,
    pub dn: &'a str,
    /// The relax rules control: definitions data still uses may go.
    pub relax: bool,
    /// Permissive modify: values already so are left out.
    pub permissive: bool,
}

/// The target entry after a change of cn=config (none after a delete),
/// and the schema the configuration it made runs with.
pub struct ConfigAfter {
    pub entry: Option<Entry>,
    pub schema: Arc<Schema>,
}

/// A future of the configuration's tree.
pub type ConfigFuture<'a, T> = Pin<Box<dyn Future<Output = OpResult<T>> + Send + 'a>>;

/// The cn=config tree.
pub trait ConfigTree: Send + Sync {
    /// Every entry of the tree with its DN, for the configuration `server`
    /// runs with.
    fn entries(&self, server: &Server) -> Vec<(String, Entry)>;

    /// Begin `change`: refuse what the tree never takes (a rename, an add
    /// of something other than a schema or an overlay), then hold every
    /// other change of the configuration off until the staged change is
    /// finished or dropped.
    fn stage<'a>(
        &'a self,
        server: &'a Arc<Server>,
        change: ConfigChange<'a>,
    ) -> ConfigFuture<'a, Box<dyn StagedConfig<'a> + 'a>>;

    /// The configuration other servers share with this one (its shared
    /// keys and when each last changed), as `CONFIG_STATE_EXOP` answers
    /// it to a consumer that follows this server's configuration.
    fn shared_state(&self, server: &Server) -> Result<Vec<u8>, String>;

    /// This tree, for the layer that made it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A change of cn=config begun and not yet made.
pub trait StagedConfig<'a>: Send {
    /// The target entry as it stands (none for a new or missing entry).
    fn before(&self) -> Option<&Entry>;

    /// The schema the running configuration reads entries with.
    fn schema(&self) -> &Arc<Schema>;

    /// Work the change out and check it whole; then, unless `rehearse`
    /// (No-Op), store it, install it and write its audit record.
    fn finish(self: Box<Self>, rehearse: bool) -> ConfigFuture<'a, ConfigAfter>;
}

// ── entries the store holds only part of (`write::partial`) ──────────

/// An entry the store holds only part of: a translucent suffix's remote
/// entry, whose local part (if it has one yet) the store keeps. Given on
/// a modify's `WriteCtx` by the layer serving the entry: the pipeline
/// plans the modify on the entry as the requester sees it (access, the
/// assertion, the schema) and stores the part the layer keeps of it.
pub trait Partial: Send + Sync {
    /// The entry as the requester sees it, with `part` what the store
    /// holds under its name (None: nothing yet).
    fn shown(&self, schema: &Schema, part: Option<&Entry>) -> Entry;

    /// The part the store keeps once the entry as shown goes from
    /// `before` to `after`.
    fn kept(&self, schema: &Schema, part: Option<&Entry>, before: &Entry, after: &Entry) -> Entry;

    /// Parts for the target's ancestors held only elsewhere, nearest
    /// first: made with the target's part when the store lacks them.
    fn ancestors(&self) -> &[Entry];
}

// ── the overlays as the operations run them (`Layers`) ────────────────

/// What error injection does to one operation.
pub struct Fault {
    /// Wait this long first.
    pub delay: Option<Duration>,
    /// Close the connection instead of answering.
    pub disconnect: bool,
    /// Answer with this result instead of running it.
    pub result: Option<(ResultCode, String)>,
}

/// Error injection rules.
pub trait Faults: Send + Sync {
    /// The fault a rule puts on `request`, if one fires.
    fn pick(&self, schema: &Schema, request: &ProtocolOp) -> Option<Fault>;

    /// Each rule with how often it fired (cn=Monitor).
    fn counts(&self) -> Vec<String>;
}

/// A record begun when a request arrives, completed at its end.
pub type Begun = Box<dyn Any + Send + Sync>;

/// A log of operations (cn=accesslog).
pub trait OpLog: Send + Sync {
    /// The start of `request`'s record, when it is logged.
    fn begin(
        &self,
        conn: u64,
        who: &Identity,
        request: &ProtocolOp,
        schema: &Schema,
    ) -> Option<Begun>;

    /// The operation ended with `code` (None: no response), having sent
    /// `entries`.
    fn end(&self, server: &Server, begun: Begun, code: Option<u32>, entries: u64);
}

/// The configured overlays, compiled, in order, as the operations run
/// them: built by the overlays from the configuration.
#[derive(Default)]
pub struct Layers {
    /// Each configured overlay's type, in order.
    pub kinds: Vec<&'static str>,
    /// Hooks on writes, in the configured order.
    pub write: Vec<Arc<dyn WriteHook + Send + Sync>>,
    /// Hooks on searches, in the configured order.
    pub search: Vec<Arc<dyn SearchHook + Send + Sync>>,
    pub faults: Vec<Arc<dyn Faults>>,
    pub op_log: Option<Arc<dyn OpLog>>,
}

impl Layers {
    /// No overlay is configured.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The fault error injection puts on `request`, if a rule fires.
    pub fn fault(&self, schema: &Schema, request: &ProtocolOp) -> Option<Fault> {
        self.faults.iter().find_map(|f| f.pick(schema, request))
    }

    /// Each error injection rule with how often it fired.
    pub fn injection_counts(&self) -> Vec<String> {
        self.faults.iter().flat_map(|f| f.counts()).collect()
    }
}

// ── the password policy (`policy`) ────────────────────────────────────

/// An account being bound, as the policy read it in the bind's snapshot
/// (its state and its policy); only the policy looks inside.
pub type Account = Box<dyn Any + Send + Sync>;

/// The outcome of a bind under a policy.
pub enum BindVerdict {
    /// The bind succeeds: its response controls, and whether the
    /// connection is restricted to changing the password.
    Allow {
        controls: Vec<Control>,
        restricted: bool,
    },
    Refuse(LdapError),
}

pub trait PasswordPolicy: Send + Sync {
    /// Whether failures of the account `norm` wait to be written (looked
    /// at before a bind reads the account).
    fn has_pending(&self, norm: &str) -> bool;

    /// The account `entry` (holding at least its password and pwd*
    /// attributes), read in a bind's snapshot, with its policy.
    fn account(&self, view: &View<'_>, generation: Option<u64>, entry: Entry) -> OpResult<Account>;

    /// The verdict on a bind to `norm` whose password was `verified` or
    /// not; `pending`: failures were waiting when the bind began.
    fn judge_bind<'a>(
        &'a self,
        server: &'a Arc<Server>,
        norm: &'a str,
        account: Account,
        pending: bool,
        verified: bool,
        wants: bool,
    ) -> Running<'a, OpResult<BindVerdict>>;

    /// A check of the password of `norm` made outside a bind (Password
    /// Modify's old password), `verified` or not: whether it counts as
    /// right.
    fn on_password_check<'a>(
        &'a self,
        server: &'a Arc<Server>,
        norm: &'a str,
        verified: bool,
    ) -> Running<'a, OpResult<bool>>;

    /// Checks of a password change of the account `target` to `new` (clear
    /// text, or None when sent hashed), before it is hashed; `old_given`:
    /// the change names the old password.
    #[allow(clippy::too_many_arguments)]
    fn check_change<'a>(
        &'a self,
        server: &'a Arc<Server>,
        who: &'a Identity,
        target: &'a str,
        new: Option<&'a [u8]>,
        old_given: bool,
        wants: bool,
    ) -> Running<'a, OpResult<()>>;

    /// Checks of a new entry's password, before it is hashed.
    fn check_add(
        &self,
        server: &Arc<Server>,
        who: &Identity,
        entry: &Entry,
        wants: bool,
    ) -> OpResult<()>;

    /// `count` failed binds of the account `dn` a replica forwards.
    fn forwarded_failures<'a>(
        &'a self,
        server: &'a Arc<Server>,
        who: &'a Identity,
        dn: &'a str,
        count: usize,
    ) -> Running<'a, OpResult<()>>;
}

// ── suffixes another server holds (`remote`) ──────────────────────────

/// Work a remote tree does, running to its end.
pub type Running<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait RemoteTree: Send + Sync {
    /// Whether the normalised DN `norm` is within this tree.
    fn covers(&self, norm: &str) -> bool;

    /// A search based in this tree (the job's controls already checked).
    fn search<'a>(&'a self, job: &'a Arc<SearchJob>) -> Running<'a, Finished>;

    /// An add, delete, modify, modify DN or compare naming an entry of
    /// this tree; None for other requests.
    fn perform<'a>(
        &'a self,
        server: &'a Arc<Server>,
        op: Operation,
    ) -> Running<'a, Option<Response>>;

    /// Whether a stored entry (given by its object classes) is only this
    /// server's part of a remote entry: a bind to it is the remote's to
    /// check.
    fn is_part(&self, classes: &Entry) -> bool;

    /// A simple bind passed to the remote server: whether it accepted the
    /// password.
    fn bind<'a>(&'a self, name: &'a str, password: Vec<u8>) -> Running<'a, OpResult<bool>>;
}

// ── trees searched like stored entries (`search::virtual_tree`) ───────

/// An entry of a virtual tree: DN as returned, normalised DN, content.
pub struct VirtualEntry {
    pub dn: String,
    pub norm: String,
    pub entry: Arc<Entry>,
}

pub trait VirtualTree: Send + Sync {
    /// Whether this tree holds the entry named `base` (or would, were it
    /// to exist: a missing entry below cn=Monitor is noSuchObject here).
    fn owns(&self, schema: &Schema, base: &Dn) -> bool;

    /// Searches may only read the base entry itself (other scopes find
    /// nothing: noSuchObject).
    fn base_only(&self) -> bool {
        false
    }

    /// Whether `who` may read the entry; checked for each entry before
    /// anything else about it is looked at.
    fn may_read(&self, _server: &Server, _who: &Identity, _e: &VirtualEntry) -> bool {
        true
    }

    /// Whether `who` may see anything at all below `base_norm`, checked
    /// before the entries are made (making cn=Monitor's costs work).
    fn may_enter(&self, _server: &Server, _who: &Identity, _base_norm: &str) -> bool {
        true
    }

    /// The entries, now.
    fn entries(&self, server: &Server) -> Vec<VirtualEntry>;

    /// A content synchronization (RFC 4533) based at this tree, when the
    /// tree serves one itself (the access log, for delta-sync consumers);
    /// None: refused as for any virtual tree.
    fn synchronize<'a>(
        &self,
        _job: &'a Arc<SearchJob>,
        _req: SyncRequest,
        _theirs: Cookie,
    ) -> Option<Synchronizing<'a>> {
        None
    }

    /// Attributes this tree adds to the root DSE when it is read (a log
    /// naming its range).
    fn root_dse_attrs(&self, _server: &Server) -> Vec<Attribute> {
        Vec::new()
    }

    /// The entries a search may return: all of them, unless the tree is
    /// too large to make whole and narrows them by the search itself
    /// (every entry given is still checked for scope and filter).
    fn entries_for(
        &self,
        server: &Server,
        _job: &SearchJob,
        _base_norm: &str,
    ) -> Vec<VirtualEntry> {
        self.entries(server)
    }
}

/// A synchronization search running to its end.
pub type Synchronizing<'a> = Pin<Box<dyn Future<Output = Finished> + Send + 'a>>;

// ── hooks on writes (`write::hooks`) and searches (`search::hooks`) ───

/// A hook every write passes through; `write::hooks` says when each
/// method runs and in which order the hooks do.
pub trait WriteHook: Sync {
    fn on_target(
        &self,
        _ctx: &WriteCtx,
        _view: &View<'_>,
        _norm: &str,
        _entry: &Entry,
    ) -> OpResult<()> {
        Ok(())
    }

    fn check(&self, _ctx: &WriteCtx, _view: &View<'_>, _changes: &[Change]) -> OpResult<()> {
        Ok(())
    }

    fn related(
        &self,
        _ctx: &WriteCtx,
        _view: &View<'_>,
        _changes: &mut Vec<Change>,
    ) -> OpResult<()> {
        Ok(())
    }

    fn in_txn(
        &self,
        _ctx: &WriteCtx,
        _w: &mut WriteTxn<'_>,
        _changes: &mut [Change],
        _controls: &mut Vec<Control>,
    ) -> OpResult<()> {
        Ok(())
    }
}

/// What a hook does to each entry of one search, given the entry's DN
/// as sent (decoded entries do not carry their DN).
pub type EntryStep = Box<dyn Fn(&str, &mut Entry) + Send + Sync>;

/// A hook every search passes through (`search::hooks`).
pub trait SearchHook: Sync {
    /// Whether `before` needs the base entry for this search.
    fn wants_base(&self, _job: &SearchJob) -> bool {
        false
    }

    /// `view`: the store snapshot, None for a virtual tree's base.
    fn before(
        &self,
        _job: &SearchJob,
        _view: Option<&View<'_>>,
        _norm: &str,
        _base: &Entry,
    ) -> OpResult<()> {
        Ok(())
    }

    fn per_entry(&self, _job: &SearchJob) -> Option<EntryStep> {
        None
    }

    fn after(&self, _job: &SearchJob, _path: Path, _outcome: &mut SearchOutcome) {}
}
