//! `pando repl check --repair`: make the replicas agree again, by the
//! rules replication itself follows, and through replication.
//!
//! For each entry that differs:
//! - a delete remembered by a server (multi-provider Pando servers keep
//!   them) newer than every copy wins: the entry is deleted where it is
//!   still held (deepest first);
//! - otherwise the copy with the newest entryCSN wins (the first server
//!   named among equals) and is written again on the server holding it:
//!   every attribute in which another copy differs is replaced by the
//!   winner's own values (objectClass when only the name, the entryCSN
//!   or the presence differs), so it gets a new CSN and replication
//!   carries the whole copy to every server, where it is newer than
//!   anything held;
//! - two entries at one name on different servers (one added on each
//!   side while they were apart): the newer keeps the name, as slapd
//!   decides, and the other is deleted where it is held.
//!
//! What was done is printed and stored in the conflict record of every
//! Pando server compared (`cn=Conflicts,cn=Replication,cn=Monitor`), with
//! the values each deleted entry held. The servers must replicate to each
//! other for the written copies to reach them; the check then runs again.

use std::collections::BTreeMap;

use pando_proto::{Change, ModOp, ModifyRequest, PartialAttribute, ProtocolOp};
use pando_server::ops::digest::{self, Request};
use pando_server::ops::special::DIGEST_EXOP;

use crate::ldap_client::BindArgs;
use crate::repl_diff::{differing_attrs, fetch, shown, Differing, Held};

/// What a repair does to one entry.
enum Action {
    /// Write the copy held at `server` again.
    Rewrite { server: usize },
    /// Delete it where it is held; `why` for the record.
    Delete { why: String },
}

/// Decide each entry's fate (see the module header).
fn decide(schema: &pando_model::Schema, diffs: &[Differing]) -> Vec<Action> {
    let mut actions: Vec<Action> = diffs
        .iter()
        .map(|d| match (d.newest(), d.newest_delete()) {
            (Some((_, l)), Some(del)) if del.at > l.csn => Action::Delete {
                why: format!("deleted at {}, after its newest change", del.at),
            },
            (None, Some(del)) => Action::Delete {
                why: format!("deleted at {}", del.at),
            },
            (Some((w, _)), _) => Action::Rewrite { server: w },
            (None, None) => Action::Delete {
                why: "held nowhere".into(),
            },
        })
        .collect();
    // One name, two entries: the newer keeps it.
    let mut by_name: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, d) in diffs.iter().enumerate() {
        if let (Action::Rewrite { .. }, Some((_, l))) = (&actions[i], d.newest()) {
            by_name
                .entry(digest::dn_key(&mut digest::Names::new(schema), &l.dn))
                .or_default()
                .push(i);
        }
    }
    for group in by_name.values().filter(|g| g.len() > 1) {
        let csn = |i: &usize| diffs[*i].newest().map(|(_, l)| l.csn.clone());
        let keeper = *group.iter().max_by_key(|i| csn(i)).unwrap_or(&group[0]);
        for i in group.iter().filter(|i| **i != keeper) {
            actions[*i] = Action::Delete {
                why: format!(
                    "its name is taken by the newer entry {}",
                    digest::uuid_text(&diffs[keeper].uuid)
                ),
            };
        }
    }
    actions
}

/// The values of an entry as the record shows them (secrets counted,
/// not shown, as in every conflict record).
fn content(e: &pando_proto::SearchResultEntry) -> String {
    use pando_server::ops::write::conflicts::shown_values;
    e.attrs
        .iter()
        .map(|a| format!("{}: {}", a.name, shown_values(&a.name, &a.values)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn modify(bind: &BindArgs, url: &str, req: ProtocolOp) -> Result<(), String> {
    let mut l = bind.open(url)?;
    match l.request(req, Vec::new())? {
        (0, _) => Ok(()),
        (code, _) => Err(format!("answered {code}")),
    }
}

/// Delete the entry everywhere it is held; the record's line.
fn delete_everywhere(
    bind: &BindArgs,
    base: &str,
    urls: &[(String, bool)],
    d: &Differing,
    why: &str,
) -> String {
    let mut line = format!(
        "{}: repaired by a check (entryUUID {}): deleted where held, {why}",
        d.dn(),
        digest::uuid_text(&d.uuid)
    );
    for (i, h) in d.held.iter().enumerate() {
        let Held::Entry(l) = h else {
            continue;
        };
        let url = &urls[i].0;
        let lost = fetch(bind, base, url, &d.uuid)
            .ok()
            .flatten()
            .map(|e| content(&e))
            .unwrap_or_default();
        let done = modify(bind, url, ProtocolOp::DelRequest(l.dn.clone()));
        let outcome = match &done {
            Ok(()) => "deleted".to_string(),
            Err(e) => format!("not deleted ({e})"),
        };
        println!("{url}: {} {outcome}", l.dn);
        line.push_str(&format!("; on {url} ({}) {outcome}; lost {lost}", shown(h)));
    }
    line
}

/// Write the winning copy again on its server; the record's line.
fn rewrite(
    bind: &BindArgs,
    base: &str,
    schema: &pando_model::Schema,
    urls: &[(String, bool)],
    d: &Differing,
    w: usize,
) -> Result<String, String> {
    let url = &urls[w].0;
    let winner = fetch(bind, base, url, &d.uuid)?
        .ok_or_else(|| format!("{url} no longer holds {}", d.dn()))?;
    let mut names: Vec<String> = Vec::new();
    for (i, h) in d.held.iter().enumerate() {
        if i == w || !matches!(h, Held::Entry(_)) {
            continue;
        }
        if let Some(other) = fetch(bind, base, &urls[i].0, &d.uuid)? {
            for n in differing_attrs(schema, &winner, &other) {
                if n != "the DN" && !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    if names.is_empty() {
        names.push("objectclass".into());
    }
    let changes = names
        .iter()
        .map(|n| Change {
            op: ModOp::Replace,
            attr: PartialAttribute {
                name: n.clone(),
                values: winner
                    .attrs
                    .iter()
                    .filter(|a| digest::canonical_name(schema, &a.name) == *n)
                    .flat_map(|a| a.values.clone())
                    .collect(),
            },
        })
        .collect();
    let req = ProtocolOp::ModifyRequest(ModifyRequest {
        dn: winner.dn.clone(),
        changes,
    });
    modify(bind, url, req).map_err(|e| format!("{url}: rewriting {}: {e}", winner.dn))?;
    println!("{url}: {} written again ({})", winner.dn, names.join(", "));
    let mut line = format!(
        "{}: repaired by a check (entryUUID {}): kept the copy of {url}, written again ({})",
        winner.dn,
        digest::uuid_text(&d.uuid),
        names.join(", ")
    );
    for (i, h) in d.held.iter().enumerate().filter(|(i, _)| *i != w) {
        line.push_str(&format!("; {} held {}", urls[i].0, shown(h)));
    }
    Ok(line)
}

/// Repair every differing entry and record it on the Pando servers
/// (`urls`: each server and whether it is one).
pub fn repair(
    bind: &BindArgs,
    base: &str,
    schema: &pando_model::Schema,
    urls: &[(String, bool)],
    diffs: &[Differing],
) -> Result<(), String> {
    let actions = decide(schema, diffs);
    let mut lines = Vec::new();
    // Deletes first (deepest first), freeing names the rewritten take.
    let mut deletes: Vec<(usize, &String)> = actions
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            Action::Delete { why } => Some((i, why)),
            _ => None,
        })
        .collect();
    deletes.sort_by_key(|(i, _)| std::cmp::Reverse(diffs[*i].dn().matches(',').count()));
    for (i, why) in deletes {
        lines.push(delete_everywhere(bind, base, urls, &diffs[i], why));
    }
    for (i, a) in actions.iter().enumerate() {
        if let Action::Rewrite { server } = a {
            match rewrite(bind, base, schema, urls, &diffs[i], *server) {
                Ok(line) => lines.push(line),
                Err(e) => eprintln!("not repaired: {e}"),
            }
        }
    }
    for chunk in lines.chunks(digest::MAX_RECORDED) {
        let req = Request::Record {
            base: base.to_string(),
            lines: chunk.to_vec(),
        };
        for (url, _) in urls.iter().filter(|(_, pando)| *pando) {
            let stored = bind
                .open(url)
                .and_then(|mut l| l.extended(DIGEST_EXOP, req.encode()));
            if let Err(e) = stored {
                eprintln!("{url}: the repair is not on its conflict record: {e}");
            }
        }
    }
    Ok(())
}
