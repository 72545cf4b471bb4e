//! A translucent suffix as the operations see it: a remote tree
//! (`ops::remote`) serving searches, writes, compares and pass-through
//! binds below the suffix.

use std::sync::Arc;

use pando_model::Entry;
use pando_proto::{ProtocolOp, ResultCode};

use super::{write as tw, Translucent};
use pando_ops::error::{LdapError, OpResult};
use pando_ops::operation::{compared, written, Operation, Response};
use pando_ops::seams::{RemoteTree, Running};
use pando_ops::search::{Finished, SearchJob};
use pando_ops::state::Server;
use pando_ops::write::WriteCtx;

impl RemoteTree for Translucent {
    fn covers(&self, norm: &str) -> bool {
        Translucent::covers(self, norm)
    }

    fn search<'a>(&'a self, job: &'a Arc<SearchJob>) -> Running<'a, Finished> {
        Box::pin(super::search::run(job, self))
    }

    fn perform<'a>(
        &'a self,
        server: &'a Arc<Server>,
        op: Operation,
    ) -> Running<'a, Option<Response>> {
        Box::pin(perform(server, op, self))
    }

    fn is_part(&self, classes: &Entry) -> bool {
        super::is_part(classes)
    }

    fn bind<'a>(&'a self, name: &'a str, password: Vec<u8>) -> Running<'a, OpResult<bool>> {
        Box::pin(bind(self, name, password))
    }
}

/// A write or compare below the suffix.
async fn perform(server: &Arc<Server>, op: Operation, t: &Translucent) -> Option<Response> {
    let Operation {
        who,
        request,
        controls,
        ..
    } = op;
    let ctx = WriteCtx::new(server, &who, controls.clone());
    Some(match request {
        ProtocolOp::AddRequest(req) => written(tw::add(ctx, t, req).await, ProtocolOp::AddResponse),
        ProtocolOp::DelRequest(dn) => {
            written(tw::delete(ctx, t, dn).await, ProtocolOp::DelResponse)
        }
        ProtocolOp::ModifyRequest(req) => {
            written(tw::modify(ctx, t, req).await, ProtocolOp::ModifyResponse)
        }
        ProtocolOp::ModifyDnRequest(req) => written(
            tw::modify_dn(ctx, t, req).await,
            ProtocolOp::ModifyDnResponse,
        ),
        ProtocolOp::CompareRequest(req) => {
            compared(tw::compare(server, t, &who, &controls, &req).await)
        }
        _ => return None,
    })
}

/// A simple bind passed to a translucent suffix's remote server: whether
/// it accepted the password.
async fn bind(t: &Translucent, name: &str, pw: Vec<u8>) -> OpResult<bool> {
    let e = &t.remote.endpoint;
    if !e.start_tls && !e.url.starts_with("ldaps://") {
        return Err(LdapError::new(
            ResultCode::UNAVAILABLE,
            format!(
                "the password of this entry is checked by the remote server of {}, and passwords are sent there only over TLS (start_tls or an ldaps:// uri)",
                t.suffix
            ),
        ));
    }
    match t.remote.bind_as(name, pw).await {
        Ok(r) if r.code == ResultCode::SUCCESS => Ok(true),
        Ok(r) if r.code == ResultCode::INVALID_CREDENTIALS => Ok(false),
        Ok(r) => {
            tracing::warn!(remote = %t.remote.endpoint.url, code = r.code.0, "translucent: the remote server refused a bind");
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not check a password");
            Err(LdapError::new(
                ResultCode::UNAVAILABLE,
                format!(
                    "the remote server of {} could not check the password (the server's log says why)",
                    t.suffix
                ),
            ))
        }
    }
}
