//! The stack every request passes before it runs, written in one place:
//! [`ADMISSION`], in order. Each layer looks at the request and answers
//! [`Verdict::Continue`] or stops it (refused with a result, or an
//! injected fault). What passes them all is an [`Operation`], which the
//! operation's own code runs against the tree its target falls in (see
//! [`Bottom`]: cn=config, a remote tree, or the store; a search's is
//! chosen by [`search`]: a remote tree, a followed search, or the store
//! and the virtual trees, which `search` tells apart by its base; a bind
//! below a translucent suffix may be passed through to its remote, in
//! `bind`).
//!
//! The order, and why:
//! 0. observation ([`observed`]): outermost, around everything below: a
//!    request is counted, timed and begun in the access logs when it
//!    arrives, and completed there when it is answered, whatever a layer
//!    or the operation made of it;
//! 1. error injection (`[[overlay]] type = "errors"`): first, so every
//!    request type aimed at any tree can be made to fail, whatever else
//!    it carries;
//! 2. controls: each parsed and checked against the operation
//!    (`controls::parse`; an unknown critical one is refused);
//! 3. the restriction after a password reset (ppolicy's
//!    changeAfterReset): kept whatever identity the request asks to run
//!    as, so before proxied authorization;
//! 4. proxied authorization (RFC 4370): the identity the operation runs
//!    as from here on.
//!
//! Access and the overlays' hooks act inside the operation, on the
//! entries it touches (an access rule decides per entry and attribute,
//! as slapd's backends decide it; a hook sees the entries a write
//! plans), through the state's `acl` and `layers`; the audit log is the
//! write pipeline's last stage, after the commit.
//!
//! Must not name the network: the connection gives the request and acts
//! on the answer (writes the refusal, waits out a delay, disconnects).

pub mod observed;

use std::sync::Arc;
use std::time::Duration;

use pando_access::Identity;
use pando_proto::{Control, ProtocolOp};

use crate::controls::{self, OpKind, Requested};
use crate::error::{LdapError, OpResult};
use crate::job::{Finished, Operation, Response, SearchJob, SearchOutcome};
use crate::operation::refusal;
use crate::state::Server;

/// A request on its way down the stack.
pub struct Request<'a> {
    pub msg_id: i32,
    /// The identity it runs as (the connection's, until proxied
    /// authorization replaces it).
    pub who: Identity,
    pub request: ProtocolOp,
    /// The controls as sent.
    pub raw: &'a [Control],
    /// The controls parsed (by the controls layer).
    pub controls: Requested,
}

/// What one layer says of a request.
pub enum Verdict {
    Continue,
    /// Answer with this error.
    Refuse(LdapError),
    /// Error injection: wait, then disconnect or answer (or go on).
    Fault(crate::seams::Fault),
}

/// One layer of the stack.
pub trait Layer: Sync {
    /// What it is, for the debug log of the requests it refuses.
    fn name(&self) -> &'static str;

    fn admit(&self, server: &Server, req: &mut Request<'_>) -> Verdict;
}

/// The layers every request passes, in order (see the module header).
pub const ADMISSION: &[&dyn Layer] = &[
    &ErrorInjection,
    &Controls,
    &RestrictedAfterReset,
    &ProxiedAuthorization,
];

/// How a request leaves the stack. (`Run`, the common case, is not boxed:
/// an allocation per request costs more than moving it once.)
#[allow(clippy::large_enum_variant)]
pub enum Admitted {
    /// Passed every layer: run it, after `delay` (error injection's).
    Run {
        op: Operation,
        delay: Option<Duration>,
    },
    /// Refused by a layer: answer with this.
    Refused(Response),
    /// Error injection stopped it: wait `delay`, then close the connection
    /// (`disconnect`) or answer with `answer`. Not a refusal the client
    /// earned: the operator chose it (testing how applications cope).
    Injected {
        delay: Option<Duration>,
        disconnect: bool,
        answer: Option<Response>,
    },
}

/// Pass `request` (made by `who`) down the stack.
pub fn admit(
    server: &Server,
    msg_id: i32,
    who: Identity,
    request: ProtocolOp,
    raw: &[Control],
) -> Admitted {
    let mut req = Request {
        msg_id,
        who,
        request,
        raw,
        controls: Requested::default(),
    };
    let mut delay = None;
    for layer in ADMISSION {
        match layer.admit(server, &mut req) {
            Verdict::Continue => {}
            Verdict::Refuse(e) => {
                tracing::debug!(layer = layer.name(), code = e.code.0, "request refused");
                return Admitted::Refused(refusal(&req.request, e));
            }
            // Only a delay: the request goes on once it has passed.
            Verdict::Fault(f) if !f.disconnect && f.result.is_none() => delay = f.delay,
            Verdict::Fault(f) => {
                let answer = f
                    .result
                    .map(|(code, text)| refusal(&req.request, LdapError::new(code, text)));
                return Admitted::Injected {
                    delay: f.delay,
                    disconnect: f.disconnect,
                    answer,
                };
            }
        }
    }
    let op = Operation {
        msg_id: req.msg_id,
        who: req.who,
        request: req.request,
        controls: req.controls,
    };
    Admitted::Run { op, delay }
}

fn verdict(r: OpResult<()>) -> Verdict {
    match r {
        Ok(()) => Verdict::Continue,
        Err(e) => Verdict::Refuse(e),
    }
}

/// Error injection rules (`ops::seams::Faults`, given by the overlays).
struct ErrorInjection;

impl Layer for ErrorInjection {
    fn name(&self) -> &'static str {
        "error injection"
    }

    fn admit(&self, server: &Server, req: &mut Request<'_>) -> Verdict {
        match server.layers.fault(&server.schema, &req.request) {
            Some(f) => Verdict::Fault(f),
            None => Verdict::Continue,
        }
    }
}

/// The request's controls, parsed and checked against its operation.
struct Controls;

impl Layer for Controls {
    fn name(&self) -> &'static str {
        "controls"
    }

    fn admit(&self, server: &Server, req: &mut Request<'_>) -> Verdict {
        let parsed = match pando_observe::kind_of(&req.request) {
            Some(OpKind::Abandon | OpKind::Unbind) | None => Ok(Requested::default()),
            Some(kind) => controls::parse(kind, req.raw, &server.decode_limits),
        };
        verdict(parsed.map(|c| req.controls = c))
    }
}

/// A connection restricted to changing its password (the bound identity's,
/// as slapd's ppolicy keeps it per connection) stays so whatever identity
/// an operation asks to run as: proxied authorization is refused there,
/// before it is looked at.
struct RestrictedAfterReset;

impl Layer for RestrictedAfterReset {
    fn name(&self) -> &'static str {
        "restriction after a password reset"
    }

    fn admit(&self, _server: &Server, req: &mut Request<'_>) -> Verdict {
        let restricted = req.who.is_restricted()
            && (req.controls.proxied_authz.is_some()
                || !crate::policy::allowed_while_restricted(&req.who, &req.request));
        if restricted {
            return Verdict::Refuse(crate::policy::restricted(req.controls.ppolicy));
        }
        Verdict::Continue
    }
}

/// Proxied authorization (RFC 4370): the operation runs as the identity
/// the control names, when the requester may assume it.
struct ProxiedAuthorization;

impl Layer for ProxiedAuthorization {
    fn name(&self) -> &'static str {
        "proxied authorization"
    }

    fn admit(&self, server: &Server, req: &mut Request<'_>) -> Verdict {
        let Some(authz) = req.controls.proxied_authz.as_deref() else {
            return Verdict::Continue;
        };
        match crate::proxy::assume(server, &req.who, authz) {
            Ok(who) => {
                req.who = who;
                Verdict::Continue
            }
            Err(e) => Verdict::Refuse(e),
        }
    }
}

/// The tree at the bottom of the stack a write, compare or extended
/// operation runs against, by its target.
pub enum Bottom {
    /// cn=config (not in the store; administrators only): its normalised
    /// and its given DN.
    Config { norm: String, dn: String },
    /// A suffix another server holds.
    Remote(Arc<dyn crate::seams::RemoteTree>),
    /// The store.
    Store,
}

impl Bottom {
    /// The tree `request` is aimed at.
    pub fn of(server: &Server, request: &ProtocolOp) -> Bottom {
        if let Some((norm, dn)) = config_target(server, request) {
            return Bottom::Config { norm, dn };
        }
        match remote_target(server, request) {
            Some(t) => Bottom::Remote(t),
            None => Bottom::Store,
        }
    }
}

/// The DN a write (or, with `compare`, a compare) names.
fn target_dn(request: &ProtocolOp, compare: bool) -> Option<&String> {
    match request {
        ProtocolOp::ModifyRequest(r) => Some(&r.dn),
        ProtocolOp::AddRequest(r) => Some(&r.dn),
        ProtocolOp::DelRequest(dn) => Some(dn),
        ProtocolOp::ModifyDnRequest(r) => Some(&r.dn),
        ProtocolOp::CompareRequest(r) if compare => Some(&r.dn),
        _ => None,
    }
}

/// The normalised and the given DN of a write aimed at cn=config.
fn config_target(server: &Server, request: &ProtocolOp) -> Option<(String, String)> {
    let dn = target_dn(request, false)?;
    // Most writes are elsewhere: a look at the text's end spares them the parse.
    let t = dn.trim_end().as_bytes();
    if t.len() < 6 || !t[t.len() - 6..].eq_ignore_ascii_case(b"config") {
        return None;
    }
    let parsed = pando_model::Dn::parse(dn).ok()?;
    let norm = crate::config_tree::under_config(&server.schema, &parsed)?;
    Some((norm, dn.clone()))
}

/// The remote tree serving the entry a write or compare names.
fn remote_target(
    server: &Server,
    request: &ProtocolOp,
) -> Option<Arc<dyn crate::seams::RemoteTree>> {
    crate::remote::serving(server, target_dn(request, true)?)
}

/// Run a search to its end on its own task, against the tree at its
/// bottom: a translucent suffix's remote tree (which cannot be followed),
/// a followed search (persistent, or a sync provider's), or the store and
/// the virtual trees. (A small search of the store may have been answered
/// inline first: `search::run_inline`.)
pub async fn search(job: &Arc<SearchJob>) -> Finished {
    if let Some(t) = crate::remote::serving(&job.server, &job.req.base) {
        if job.followed() {
            let e = LdapError::unwilling(
                "a translucent suffix's entries are read from its remote server: they cannot be followed or replicated",
            );
            return Finished::Done(SearchOutcome {
                result: e.into_result(),
                controls: Vec::new(),
                entries: 0,
            });
        }
        return t.search(job).await;
    }
    if job.controls.persistent.is_some() {
        crate::search::persistent::run(job).await
    } else if job.controls.sync.is_some() {
        crate::search::sync_provider::run(job).await
    } else {
        crate::search::run_to_end(job).await
    }
}
