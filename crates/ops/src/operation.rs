//! The typed operation every request becomes, and the response it ends
//! with. The connection decodes a PDU and passes it down the stack
//! (`stack::admit`), which makes the [`Operation`]; the connection either
//! answers it on its own task (bind, small searches) or hands it to
//! [`perform`] on another task.

use std::sync::Arc;

use pando_proto::{ExtendedResponse, LdapResult, ProtocolOp, ResultCode};

use super::write::{WriteCtx, Written};
use crate::error::{LdapError, OpResult};
pub use crate::job::{Operation, Response};
use crate::state::Server;

/// `request` answered with the error `e` (and its response controls).
pub fn refusal(request: &ProtocolOp, e: LdapError) -> Response {
    let (r, controls) = e.into_response();
    let op = match request {
        ProtocolOp::BindRequest(_) => ProtocolOp::BindResponse(pando_proto::BindResponse {
            result: r,
            server_sasl_creds: None,
        }),
        ProtocolOp::SearchRequest(_) => ProtocolOp::SearchResultDone(r),
        ProtocolOp::CompareRequest(_) => ProtocolOp::CompareResponse(r),
        ProtocolOp::AddRequest(_) => ProtocolOp::AddResponse(r),
        ProtocolOp::DelRequest(_) => ProtocolOp::DelResponse(r),
        ProtocolOp::ModifyRequest(_) => ProtocolOp::ModifyResponse(r),
        ProtocolOp::ModifyDnRequest(_) => ProtocolOp::ModifyDnResponse(r),
        // RFC 4511 4.14.2: a StartTLS response names the operation.
        ProtocolOp::ExtendedRequest(req) if req.name == pando_proto::oid::START_TLS => {
            ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: r,
                name: Some(req.name.clone()),
                value: None,
            })
        }
        _ => ProtocolOp::ExtendedResponse(ExtendedResponse {
            result: r,
            name: None,
            value: None,
        }),
    };
    Response { op, controls }
}

/// Whether the request changes the directory (such operations complete
/// and are answered even when abandoned, and run in arrival order).
pub fn is_update(op: &ProtocolOp) -> bool {
    matches!(
        op,
        ProtocolOp::AddRequest(_)
            | ProtocolOp::DelRequest(_)
            | ProtocolOp::ModifyRequest(_)
            | ProtocolOp::ModifyDnRequest(_)
            | ProtocolOp::ExtendedRequest(_)
    )
}

/// Run an add, delete, modify, modify DN, compare or extended operation.
/// None for requests this does not run (searches and binds have their own
/// paths). The target decides the tree: cn=config (`config_write::write`,
/// which applies the write controls around the tree's change), a remote
/// tree (`remote`), or the store.
pub async fn perform(server: &Arc<Server>, op: Operation) -> Option<Response> {
    match crate::stack::Bottom::of(server, &op.request) {
        crate::stack::Bottom::Config { norm, dn } => {
            let mk = write_response(&op.request);
            Some(written(
                crate::config_write::write(server, op, norm, dn).await,
                mk,
            ))
        }
        crate::stack::Bottom::Remote(t) => t.perform(server, op).await,
        crate::stack::Bottom::Store => on_store(server, op).await,
    }
}

/// The response a write request is answered with.
fn write_response(request: &ProtocolOp) -> fn(LdapResult) -> ProtocolOp {
    match request {
        ProtocolOp::AddRequest(_) => ProtocolOp::AddResponse,
        ProtocolOp::DelRequest(_) => ProtocolOp::DelResponse,
        ProtocolOp::ModifyDnRequest(_) => ProtocolOp::ModifyDnResponse,
        _ => ProtocolOp::ModifyResponse,
    }
}

/// The response to a write: success, No-Op's result, or the error.
pub fn written(r: OpResult<Written>, mk: fn(LdapResult) -> ProtocolOp) -> Response {
    match r {
        Ok(w) if w.no_op => Response {
            op: mk(LdapResult::new(ResultCode::NO_OPERATION, "")),
            controls: w.controls,
        },
        Ok(w) => Response {
            op: mk(LdapResult::success()),
            controls: w.controls,
        },
        Err(e) => {
            let (result, controls) = e.into_response();
            Response {
                op: mk(result),
                controls,
            }
        }
    }
}

/// The response to a compare.
pub fn compared(r: OpResult<ResultCode>) -> Response {
    let result = match r {
        Ok(code) => LdapResult::new(code, ""),
        Err(e) => e.into_result(),
    };
    Response {
        op: ProtocolOp::CompareResponse(result),
        controls: Vec::new(),
    }
}

/// An operation on the store.
async fn on_store(server: &Arc<Server>, op: Operation) -> Option<Response> {
    let Operation {
        who,
        request,
        controls,
        ..
    } = op;
    Some(match request {
        ProtocolOp::AddRequest(req) => {
            let ctx = WriteCtx::new(server, &who, controls);
            written(super::write::add(ctx, req).await, ProtocolOp::AddResponse)
        }
        ProtocolOp::DelRequest(dn) => {
            let ctx = WriteCtx::new(server, &who, controls);
            written(super::write::delete(ctx, dn).await, ProtocolOp::DelResponse)
        }
        ProtocolOp::ModifyRequest(req) => {
            let ctx = WriteCtx::new(server, &who, controls);
            written(
                super::write::modify(ctx, req).await,
                ProtocolOp::ModifyResponse,
            )
        }
        ProtocolOp::ModifyDnRequest(req) => {
            let ctx = WriteCtx::new(server, &who, controls);
            written(
                super::write::modify_dn(ctx, req).await,
                ProtocolOp::ModifyDnResponse,
            )
        }
        ProtocolOp::CompareRequest(req) => {
            let server = server.clone();
            let r = tokio::task::spawn_blocking(move || {
                super::compare::compare(&server, &who, &controls, &req)
            })
            .await
            .unwrap_or_else(|_| {
                Err(LdapError::new(
                    ResultCode::OTHER,
                    "compare failed unexpectedly",
                ))
            });
            compared(r)
        }
        ProtocolOp::ExtendedRequest(req) => {
            let r = super::extended::extended(server, &who, controls, req).await;
            let (resp, controls) = match r {
                Ok(resp) => (resp, Vec::new()),
                Err(e) => {
                    let (result, controls) = e.into_response();
                    let resp = ExtendedResponse {
                        result,
                        name: None,
                        value: None,
                    };
                    (resp, controls)
                }
            };
            Response {
                op: ProtocolOp::ExtendedResponse(resp),
                controls,
            }
        }
        _ => return None,
    })
}
