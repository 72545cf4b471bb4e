//! The server's side of replica digests (`DIGEST_EXOP`, see `digest`):
//! a server computes its tree in one pass over the subtree on a search
//! thread, as the requester may read it (access rules apply entry by
//! entry and attribute by attribute, as in a search), and keeps it for
//! the snapshot's content generation, so the descents of one check read
//! the store once; it lists the entries under leaves in another pass, and
//! stores a check's repairs in the conflict record.

use std::sync::Arc;

use pando_model::Dn;
use pando_proto::{ExtendedResponse, LdapResult, ResultCode};

use crate::digest::{
    encode_entries, encode_nodes, entry_digest, leaf_of, leaf_range, parse_uuid, Deleted, Listed,
    Names, Request, Tree, TreeKey, MAX_LISTED,
};
use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::acl::{self, Access, EntryRules};
use pando_access::Identity;

/// Answer a digest request (see [`Request`]): for authenticated
/// identities, over what they may read. Runs on a search thread, holding
/// one of the `limits.max_search_threads` places as a search does.
pub async fn answer(
    server: &Arc<Server>,
    who: &Identity,
    value: Option<Vec<u8>>,
) -> OpResult<ExtendedResponse> {
    if who.is_anonymous() {
        return Err(LdapError::access(
            "comparing replicas needs an authenticated identity",
        ));
    }
    let req = Request::decode(value.as_deref().unwrap_or_default())
        .map_err(|e| LdapError::protocol(format!("malformed digest request: {e}")))?;
    if let Request::Record { lines, .. } = req {
        return record(server, who, lines).await;
    }
    let slot = crate::extended::search_place(server).await?;
    let (server2, who2) = (server.clone(), who.clone());
    let text = tokio::task::spawn_blocking(move || {
        let out = run(&server2, &who2, &req);
        drop(slot);
        out
    })
    .await
    .map_err(|_| LdapError::new(ResultCode::OTHER, "digest task failed"))??;
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: Some(crate::special::DIGEST_EXOP.to_string()),
        value: Some(text.into_bytes()),
    })
}

/// What one requester's pass may cost: a pass over a subtree is an
/// unindexed search of it, held to the same limits (administrators and
/// the server itself: none).
pub(crate) struct Budget {
    pub(crate) deadline: Option<std::time::Instant>,
    pub(crate) unindexed: u64,
}

impl Budget {
    const NONE: Budget = Budget {
        deadline: None,
        unindexed: u64::MAX,
    };

    fn for_requester(server: &Server, who: &Identity, view: &pando_store::View<'_>) -> Budget {
        let l = crate::search::limits::Limits::for_requester(server, who, view);
        Budget {
            deadline: (l.time > 0).then(|| {
                std::time::Instant::now() + std::time::Duration::from_secs(u64::from(l.time))
            }),
            unindexed: l.unindexed,
        }
    }
}

/// Store a check's repair in the conflict record (one transaction).
async fn record(
    server: &Arc<Server>,
    who: &Identity,
    lines: Vec<String>,
) -> OpResult<ExtendedResponse> {
    crate::extended::admin_only(who, "add to the conflict record")?;
    let at = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let lines: Vec<String> = lines.into_iter().map(|l| format!("{at} {l}")).collect();
    for l in &lines {
        tracing::warn!(by = %who.dn(), "{l}");
    }
    server
        .rt
        .store
        .write(move |w| crate::write::conflicts::store(w, &lines))
        .await?;
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: Some(crate::special::DIGEST_EXOP.to_string()),
        value: None,
    })
}

fn run(server: &Server, who: &Identity, req: &Request) -> OpResult<String> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let (Request::Nodes { base, .. }
    | Request::Entries { base, .. }
    | Request::Record { base, .. }) = req;
    let base_id = base_entry(server, &view, base)?;
    let budget = Budget::for_requester(server, who, &view);
    match req {
        Request::Nodes { base, prefixes } => {
            let key = rtxn.generation().map(|generation| TreeKey {
                generation,
                base: base.to_ascii_lowercase(),
                // As the sort cache: DN, roles and transport facts, which
                // access rules may depend on.
                who: format!("{who:?}"),
            });
            let tree = match key.as_ref().and_then(|k| server.digests.get(k)) {
                Some(t) => t,
                None => {
                    let mut tree = Tree::default();
                    walk(
                        server,
                        &view,
                        Some(who),
                        &budget,
                        base_id,
                        &[""],
                        &mut |l| tree.add(&l.uuid, &l.digest),
                    )?;
                    let tree = Arc::new(tree);
                    if let Some(k) = key {
                        server.digests.put(k, tree.clone());
                    }
                    tree
                }
            };
            let mut nodes = Vec::new();
            for p in prefixes {
                nodes.extend(tree.children(p).unwrap_or_default());
            }
            Ok(encode_nodes(&nodes))
        }
        Request::Entries { prefixes, .. } => {
            let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
            let mut listed = Vec::new();
            walk(
                server,
                &view,
                Some(who),
                &budget,
                base_id,
                &prefixes,
                &mut |l| listed.push(l),
            )?;
            let deleted = remembered_deletes(&view, &prefixes)?;
            if listed.len() + deleted.len() > MAX_LISTED {
                return Err(LdapError::new(
                    ResultCode::SIZE_LIMIT_EXCEEDED,
                    format!("more than {MAX_LISTED} entries under these prefixes: ask for fewer"),
                ));
            }
            Ok(encode_entries(&listed, &deleted))
        }
        Request::Record { .. } => Ok(String::new()),
    }
}

/// This server's own tree of the subtree at `base` (every entry, no
/// access rules: for the server's own comparisons).
pub fn local_tree(server: &Server, base: &str) -> OpResult<Tree> {
    let mut tree = Tree::default();
    local_walk(server, base, &[""], &mut |l| tree.add(&l.uuid, &l.digest))?;
    Ok(tree)
}

/// This server's own entries and remembered deletes under `prefixes`.
pub fn local_entries(
    server: &Server,
    base: &str,
    prefixes: &[&str],
) -> OpResult<(Vec<Listed>, Vec<Deleted>)> {
    let mut listed = Vec::new();
    let view_deletes = local_walk(server, base, prefixes, &mut |l| listed.push(l))?;
    Ok((listed, view_deletes))
}

/// [`walk`] as the server itself (no access rules, no limits); the
/// deletes remembered under `prefixes`, from the same snapshot.
fn local_walk(
    server: &Server,
    base: &str,
    prefixes: &[&str],
    each: &mut dyn FnMut(Listed),
) -> OpResult<Vec<Deleted>> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let base_id = base_entry(server, &view, base)?;
    walk(server, &view, None, &Budget::NONE, base_id, prefixes, each)?;
    remembered_deletes(&view, prefixes)
}

fn base_entry(server: &Server, view: &pando_store::View<'_>, base: &str) -> OpResult<u64> {
    let dn = Dn::parse(base)
        .map_err(|e| LdapError::new(ResultCode::INVALID_DN_SYNTAX, format!("base: {e}")))?;
    let norm = server
        .schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::new(ResultCode::INVALID_DN_SYNTAX, format!("base: {e}")))?;
    match view.lookup_norm(&crate::norm_dn::split_rdns(&norm))? {
        pando_store::Lookup::Found(id) => Ok(id),
        _ => Err(LdapError::new(
            ResultCode::NO_SUCH_OBJECT,
            format!("{base} is not held here"),
        )),
    }
}

/// The entries of the subtree at `base` that may be under `prefixes`:
/// for leaves, those the entryUUID index lists under them (a few among
/// many); else every entry of the subtree.
fn candidates(
    view: &pando_store::View<'_>,
    budget: &Budget,
    base: u64,
    prefixes: &[&str],
) -> OpResult<roaring::RoaringTreemap> {
    let ids = view.subtree(base, u64::MAX)?.unwrap_or_default();
    let whole = || {
        if ids.len() > budget.unindexed {
            return Err(LdapError::new(
                ResultCode::ADMIN_LIMIT_EXCEEDED,
                format!(
                    "the subtree holds {} entries, more than this identity's unindexed search limit ({})",
                    ids.len(),
                    budget.unindexed
                ),
            ));
        }
        Ok(ids.clone())
    };
    if prefixes
        .iter()
        .any(|p| p.len() < crate::digest::LEAF_DIGITS)
    {
        return whole();
    }
    let mut under = roaring::RoaringTreemap::new();
    for p in prefixes {
        // The UUIDs under a prefix of hex digits lie between it filled out
        // with 0s and with fs; the index gives a superset of them, which
        // the walk tests against the prefixes.
        let from = crate::digest::parse_uuid(&format!("{p:0<32}"));
        let to = crate::digest::parse_uuid(&format!("{p:f<32}"));
        let (Some(from), Some(to)) = (from, to) else {
            return whole();
        };
        match view.ids_in_uuid_range("entryuuid", &from, &to)? {
            Some(found) => under |= found,
            None => return whole(),
        }
    }
    Ok(under & ids)
}

/// Every entry of the subtree at `base` under one of `prefixes` that
/// `who` may read (None: the server itself, reading all), digested from
/// what it may read of it.
fn walk(
    server: &Server,
    view: &pando_store::View<'_>,
    who: Option<&Identity>,
    budget: &Budget,
    base: u64,
    prefixes: &[&str],
    each: &mut dyn FnMut(Listed),
) -> OpResult<()> {
    let schema = &*server.schema;
    let ranges: Vec<_> = prefixes.iter().filter_map(|p| leaf_range(p)).collect();
    let mut access = who.map(|w| Access::new(&server.acl, w));
    let mut rules = EntryRules::default();
    let mut names = Names::new(schema);
    let open = access.as_ref().is_none_or(|a| a.unrestricted());
    for (n, id) in candidates(view, budget, base, prefixes)?.iter().enumerate() {
        if n % 1024 == 1023
            && budget
                .deadline
                .is_some_and(|d| std::time::Instant::now() > d)
        {
            return Err(LdapError::new(
                ResultCode::TIME_LIMIT_EXCEEDED,
                "the digest pass ran past this identity's time limit",
            ));
        }
        if open {
            if let Some(l) = digest_whole(view, &mut names, id, &ranges)? {
                each(l);
            }
            continue;
        }
        let Some(attrs) = view.attrs(id)? else {
            continue;
        };
        let (mut uuid, mut csn) = (None, String::new());
        for a in &attrs {
            let first = || {
                a.values
                    .first()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            match names.get(&a.desc).canonical.as_str() {
                "entryuuid" => uuid = first().and_then(|v| parse_uuid(&v)),
                "entrycsn" => csn = first().unwrap_or_default(),
                _ => {}
            }
        }
        let Some(uuid) = uuid else {
            continue; // not replicated: nothing to compare it by
        };
        if !ranges.iter().any(|r| r.contains(&leaf_of(&uuid))) {
            continue;
        }
        let (dn, norm) = view.dn_pair(id)?;
        let entry = pando_model::Entry {
            dn: Dn { rdns: Vec::new() },
            attrs,
        };
        let mut guard = access.as_mut().filter(|a| !a.unrestricted());
        if let Some(a) = guard.as_mut() {
            a.entry_into(schema, &norm, &entry, &mut rules);
            if !a.allows(Some(view), &rules, &norm, None, acl::READ) {
                continue;
            }
        }
        let mut kept = Vec::with_capacity(entry.attrs.len());
        for a in &entry.attrs {
            if let Some(g) = guard.as_mut() {
                let at = schema.attribute(pando_model::desc::base(&a.desc));
                if !at.is_some_and(|at| g.allows(Some(view), &rules, &norm, Some(at), acl::READ)) {
                    if names.get(&a.desc).canonical == "entrycsn" {
                        csn.clear();
                    }
                    continue;
                }
            }
            kept.push((
                a.desc.as_str(),
                a.values.iter().map(Vec::as_slice).collect(),
            ));
        }
        let digest = entry_digest(&mut names, &uuid, &dn, kept);
        each(Listed {
            uuid,
            csn,
            digest,
            dn,
        });
    }
    Ok(())
}

/// Entry `id` digested whole from its stored record (no copy made), if
/// it is replicated and under one of `ranges`: for requesters every
/// attribute is open to.
fn digest_whole(
    view: &pando_store::View<'_>,
    names: &mut Names<'_>,
    id: u64,
    ranges: &[std::ops::Range<usize>],
) -> OpResult<Option<Listed>> {
    let got = view.with_raw_attrs(id, |raw| -> OpResult<Option<Listed>> {
        let attrs: Vec<(&str, Vec<&[u8]>)> = raw.map(|(d, v)| (d, v.collect())).collect();
        let (mut uuid, mut csn) = (None, String::new());
        for (desc, values) in &attrs {
            let first = || values.first().and_then(|v| std::str::from_utf8(v).ok());
            match names.get(desc).canonical.as_str() {
                "entryuuid" => uuid = first().and_then(parse_uuid),
                "entrycsn" => csn = first().unwrap_or_default().to_string(),
                _ => {}
            }
        }
        let Some(uuid) = uuid.filter(|u| ranges.iter().any(|r| r.contains(&leaf_of(u)))) else {
            return Ok(None);
        };
        let dn = view.dn_string(id)?;
        let digest = entry_digest(names, &uuid, &dn, attrs);
        Ok(Some(Listed {
            uuid,
            csn,
            digest,
            dn,
        }))
    })?;
    got.transpose().map(Option::flatten)
}

/// The deletes a multi-provider server remembers under `prefixes`.
fn remembered_deletes(view: &pando_store::View<'_>, prefixes: &[&str]) -> OpResult<Vec<Deleted>> {
    let mut out = Vec::new();
    for uuid in crate::write::tombstones::deleted_uuids(view)? {
        let Some(u) = parse_uuid(&uuid) else {
            continue;
        };
        if !prefixes
            .iter()
            .filter_map(|p| leaf_range(p))
            .any(|r| r.contains(&leaf_of(&u)))
        {
            continue;
        }
        if let Some(t) = crate::write::tombstones::get(view, &uuid)? {
            out.push(Deleted {
                uuid: u,
                at: t.deleted_at,
                dn: t.entry.dn.to_string(),
            });
        }
    }
    Ok(out)
}
