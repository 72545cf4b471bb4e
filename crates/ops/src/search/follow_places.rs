//! Places for searches that follow changes (persistent search, content
//! synchronization in refreshAndPersist mode).
//!
//! Every committed change is matched against each of them, so they are
//! counted: `limits.max_persistent_searches` server-wide, of which
//! `limits.persistent_search_reserve` only privileged requesters may take;
//! and for everyone else at most `limits.max_persistent_searches_per_connection`
//! on one connection and `limits.max_persistent_searches_per_identity` for
//! one identity over all its connections. Privileged: administrators,
//! the break-glass identity, and replication identities (the first
//! `[[limits.by]]` matching the requester has `replication = true`), so a
//! consumer or a multi-provider peer is served however many places
//! ordinary clients hold, and a client with many connections cannot take
//! them all.
//!
//! Invariant: `Holders::counts` holds, for every live [`Place`] of an
//! ordinary requester, one count under its connection and one under its
//! identity; entries at zero are removed. The checks and the count update
//! happen under one lock, so two requests cannot both pass a check that
//! only one of them may.

use pando_proto::{LdapResult, ResultCode};

use super::holders::{Holder, Place};
use super::SearchJob;
use crate::state::Server;
use pando_access::Identity;

/// A place for `job`, or the refusal (adminLimitExceeded naming the limit
/// that stopped it).
pub(super) fn take(job: &SearchJob) -> Result<Place, LdapResult> {
    let server = &job.server;
    let l = &server.cfg.config.limits;
    let places = server.rt.persistent_searches.places().clone();
    let refuse = |message: String| LdapResult::new(ResultCode::ADMIN_LIMIT_EXCEEDED, message);
    let full = || {
        match l.max_persistent_searches {
        0 => refuse("searches that follow changes are turned off (limits.max_persistent_searches = 0)".into()),
        n => refuse(format!("{n} searches that follow changes are open, the most this server allows (limits.max_persistent_searches)")),
    }
    };
    if privileged(server, &job.who) {
        let permit = places.try_acquire_owned().map_err(|_| full())?;
        return Ok(Place {
            _permit: permit,
            counted: None,
        });
    }
    let keys = [
        Holder::Connection(job.conn),
        Holder::Identity(job.who.norm().to_string()),
    ];
    let holders = server.rt.persistent_holders.clone();
    let mut counts = holders.counts.lock().unwrap_or_else(|p| p.into_inner());
    let held = |k: &Holder| counts.get(k).copied().unwrap_or(0);
    let per_conn = l.max_persistent_searches_per_connection;
    if per_conn > 0 && held(&keys[0]) >= per_conn {
        return Err(refuse(format!("{per_conn} searches that follow changes are open on this connection, the most one connection may hold (limits.max_persistent_searches_per_connection)")));
    }
    let per_identity = l.max_persistent_searches_per_identity;
    if per_identity > 0 && held(&keys[1]) >= per_identity {
        return Err(refuse(format!("{per_identity} searches that follow changes are open for this identity, the most one identity may hold (limits.max_persistent_searches_per_identity)")));
    }
    let reserve = l.persistent_search_reserve;
    if reserve > 0 && places.available_permits() <= reserve {
        return Err(refuse(format!("the {reserve} free places for searches that follow changes are kept for administrators and replication identities (limits.persistent_search_reserve)")));
    }
    let permit = places.try_acquire_owned().map_err(|_| full())?;
    for k in &keys {
        *counts.entry(k.clone()).or_insert(0) += 1;
    }
    drop(counts);
    Ok(Place {
        _permit: permit,
        counted: Some((holders, keys)),
    })
}

/// Administrators, the break-glass identity and replication identities.
fn privileged(server: &Server, who: &Identity) -> bool {
    if who.is_admin() || who.is_break_glass() {
        return true;
    }
    if !server
        .limits_by
        .iter()
        .any(|(_, f)| f.replication == Some(true))
    {
        return false;
    }
    // Subjects may name groups: decided on the store as it is now. A
    // store that cannot be read grants nothing.
    let Ok(rtxn) = server.rt.store.read() else {
        return false;
    };
    let view = rtxn.view();
    server
        .limits_by
        .iter()
        .find(|(w, _)| w.holds(who, &view))
        .is_some_and(|(_, f)| f.replication == Some(true))
}
