//! A consumer's comparison of its subtree with its provider's, by content,
//! every `check_secs` (3600 by default): equal contextCSN says both have
//! seen the same changes, not that they hold the same entries. On a short
//! connection of its own made as the consumer's (same URL, TLS and bind),
//! it compares hash trees over the entries (`ops::digest`): a Pando
//! provider answers with its tree's nodes and the entries under the
//! leaves that differ; any other provider (slapd) is read with a search,
//! one slice of the entryUUID space per pass (`check_slices`), and
//! digested here. What differs is shown on the consumer's cn=Monitor entry
//! (`pandoReplCheck…`) and in the metrics, and each difference is added
//! once to the conflict record, so an operator sees every divergence,
//! including those replication cannot resolve (a mixed ring with slapd).
//! Nothing is repaired here: `pando repl check --repair` does that.
//!
//! Only a consumer of a whole subtree is compared (scope `sub`, no filter,
//! all attributes): a part cannot be compared with the provider's whole.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use pando_client::Client;
use pando_proto::{Control, DerefAliases, Filter, LdapMessage, ProtocolOp, Scope, SearchRequest};

use super::consumer::set;
use crate::ops::digest::{self, Deleted, Hash, Listed, Node, Request, Tree, Uuid};
use crate::ops::digest_answer::{local_entries, local_tree};
use crate::ops::special::DIGEST_EXOP;
use crate::state::Server;

/// What the last pass found (on the consumer's status).
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// Passes made, and when the last ended (microseconds since the epoch).
    pub passes: u64,
    pub last: Option<u64>,
    /// Entries that differed in the last pass, and the first
    /// [`SHOWN`] of them described.
    pub differing: u64,
    pub shown: Vec<String>,
    pub error: Option<String>,
}

/// Most differences described on the monitor entry.
const SHOWN: usize = 100;

/// How long a Pando provider may take to answer a digest question (its
/// first builds its tree: a pass over the subtree, about 8 s per million
/// entries here).
const DIGEST_WAIT: Duration = Duration::from_secs(600);

/// One entry as one side holds it.
#[derive(Clone, Debug, PartialEq)]
enum Held {
    Entry(Listed),
    Deleted(Deleted),
    Missing,
}

impl Held {
    fn digest(&self) -> Option<Hash> {
        match self {
            Held::Entry(l) => Some(l.digest),
            _ => None,
        }
    }

    fn text(&self) -> String {
        match self {
            Held::Entry(l) => format!("entryCSN {} as {}", l.csn, l.dn),
            Held::Deleted(d) => format!("deleted at {}", d.at),
            Held::Missing => "missing".into(),
        }
    }

    fn dn(&self) -> Option<&str> {
        match self {
            Held::Entry(l) => Some(&l.dn),
            Held::Deleted(d) => Some(&d.dn),
            Held::Missing => None,
        }
    }
}

/// Whether the consumer keeps its whole subtree (what can be compared).
fn whole(cfg: &pando_config::consumer::ConsumerConfig) -> bool {
    let all = |a: &String| a == "*" || a == "+";
    cfg.scope == "sub"
        && cfg.filter.eq_ignore_ascii_case("(objectClass=*)")
        && cfg.attrs.iter().any(|a| a == "*")
        && cfg.attrs.iter().all(all)
}

/// The slice of the entryUUID space pass `n` covers: a prefix of hex
/// digits (empty: all).
fn slice_prefix(n: u64, slices: u32) -> String {
    let digits = match slices {
        16 => 1,
        256 => 2,
        4096 => 3,
        _ => return String::new(),
    };
    format!("{:0digits$x}", n % u64::from(slices))
}

/// Compare every `check_secs` until the server closes or the consumer
/// is removed.
pub async fn follow(server: Arc<Server>, replica: Arc<super::Replica>) {
    let cfg = replica.cfg.clone();
    if cfg.check_secs == 0 || !whole(&cfg) {
        return;
    }
    let every = Duration::from_secs(cfg.check_secs);
    let mut closing = server.rt.feed.closing();
    let mut recorded: BTreeMap<String, Recorded> = BTreeMap::new();
    let mut pass = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = closing.changed() => return,
            _ = replica.stopped() => return,
        }
        let prefix = slice_prefix(pass, cfg.check_slices);
        pass += 1;
        let found = tokio::select! {
            f = one_pass(&server, &cfg, &prefix) => f,
            _ = closing.changed() => return,
            _ = replica.stopped() => return,
        };
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(rid = cfg.rid, provider = %cfg.provider, "comparing with the provider failed: {e}");
                set(&replica, |s| {
                    s.checked.passes += 1;
                    s.checked.error = Some(e);
                });
                continue;
            }
        };
        let known = recorded.entry(found.slice.clone()).or_default();
        record_new(&server, &cfg, &found.differ, known).await;
        let found = found.differ;
        let shown = found
            .iter()
            .take(SHOWN)
            .map(|f| describe(f, &cfg.provider))
            .collect();
        set(&replica, |s| {
            s.checked.passes += 1;
            s.checked.last = Some(pando_store::clock::now_micros());
            s.checked.differing = found.len() as u64;
            s.checked.shown = shown;
            s.checked.error = None;
        });
    }
}

/// A difference: the entry, what this server and the provider hold.
type Found = (Uuid, Held, Held);

/// The differences on record, per slice compared (those of other slices
/// are kept until their slice comes round again).
type Recorded = BTreeSet<(Uuid, Option<Hash>, Option<Hash>)>;

/// What one pass found, and over which slice ("" the whole subtree).
struct Pass {
    slice: String,
    differ: Vec<Found>,
}

fn describe((uuid, here, there): &Found, provider: &str) -> String {
    let dn = there.dn().or(here.dn()).unwrap_or("");
    format!(
        "{dn}: differs from {provider} (entryUUID {}): here {}; on the provider {}",
        digest::uuid_text(uuid),
        here.text(),
        there.text()
    )
}

/// Add the differences not recorded before to the conflict record.
async fn record_new(
    server: &Arc<Server>,
    cfg: &pando_config::consumer::ConsumerConfig,
    found: &[Found],
    recorded: &mut Recorded,
) {
    let now: BTreeSet<_> = found
        .iter()
        .map(|(u, h, t)| (*u, h.digest(), t.digest()))
        .collect();
    let at = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let lines: Vec<String> = found
        .iter()
        .filter(|(u, h, t)| !recorded.contains(&(*u, h.digest(), t.digest())))
        .map(|f| format!("{at} {} (found by a check)", describe(f, &cfg.provider)))
        .collect();
    *recorded = now;
    if lines.is_empty() {
        return;
    }
    for l in &lines {
        tracing::warn!(rid = cfg.rid, "{l}");
    }
    let stored = server
        .rt
        .store
        .write(move |w| crate::ops::write::conflicts::store(w, &lines))
        .await;
    if let Err(e) = stored {
        tracing::warn!(rid = cfg.rid, "the check's findings are not on record: {e}");
    }
}

/// One pass: every entry that differs (in the slice `prefix` when the
/// provider is read whole).
async fn one_pass(
    server: &Arc<Server>,
    cfg: &pando_config::consumer::ConsumerConfig,
    prefix: &str,
) -> Result<Pass, String> {
    let endpoint = pando_client::Endpoint::from(cfg);
    let mut client = Client::connect(&endpoint, server.cfg.config.limits.max_pdu_bytes)
        .await
        .map_err(|e| e.0)?;
    client.bind(&endpoint).await.map_err(|e| e.0)?;
    let base = cfg.search_base.clone();
    let (s2, b2) = (server.clone(), base.clone());
    let first = Request::Nodes {
        base: base.clone(),
        prefixes: vec![String::new()],
    };
    // Both whole trees at once: each is a pass over the subtree (a slice
    // would cost a Pando provider the same pass), so a Pando provider is
    // compared whole at every pass.
    let (local, asked) = tokio::join!(
        blocking(server, move || local_tree(&s2, &b2)),
        client.extended_within(DIGEST_EXOP, first.encode(), DIGEST_WAIT)
    );
    let local = local?;
    let found = match asked {
        Ok(answer) => {
            let roots = digest::decode_nodes(&String::from_utf8_lossy(&answer))?;
            let differ = by_digests(server, &mut client, &base, &local, roots).await;
            differ.map(|differ| Pass {
                slice: String::new(),
                differ,
            })
        }
        // Not a Pando server (or one refusing this identity): read it.
        Err(e) if e.0.contains("(protocolError)") || e.0.contains("(insufficientAccessRights)") => {
            let differ = by_reading(server, &mut client, &base, &local, prefix).await;
            differ.map(|differ| Pass {
                slice: prefix.to_string(),
                differ,
            })
        }
        Err(e) => Err(e.0),
    };
    client.unbind().await;
    found
}

/// Run `f` (a pass over this server's subtree) on a search thread,
/// holding one of the places searches take.
async fn blocking<T: Send + 'static>(
    server: &Server,
    f: impl FnOnce() -> crate::error::OpResult<T> + Send + 'static,
) -> Result<T, String> {
    let place = crate::ops::extended::search_place(server)
        .await
        .map_err(|e| e.message)?;
    let out = tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| "the comparison's task failed".to_string())?
        .map_err(|e| e.message);
    drop(place);
    out
}

/// The leaves whose nodes differ, descending the provider's tree one
/// level per request (`top`: the root's children).
async fn by_digests(
    server: &Arc<Server>,
    client: &mut Client,
    base: &str,
    local: &Tree,
    top: Vec<Node>,
) -> Result<Vec<Found>, String> {
    let mut level = vec![String::new()];
    let mut remote = top;
    while level.first().is_some_and(|p| p.len() < digest::LEAF_DIGITS) {
        level = differing(local, &level, &remote);
        if level.is_empty() || level[0].len() >= digest::LEAF_DIGITS {
            break;
        }
        let req = Request::Nodes {
            base: base.to_string(),
            prefixes: level.clone(),
        };
        let answer = client
            .extended(DIGEST_EXOP, req.encode())
            .await
            .map_err(|e| e.0)?;
        remote = digest::decode_nodes(&String::from_utf8_lossy(&answer))?;
    }
    if level.is_empty() {
        return Ok(Vec::new());
    }
    let mut there = (Vec::new(), Vec::new());
    for chunk in level.chunks(256) {
        let req = Request::Entries {
            base: base.to_string(),
            prefixes: chunk.to_vec(),
        };
        let answer = client
            .extended(DIGEST_EXOP, req.encode())
            .await
            .map_err(|e| e.0)?;
        let (l, d) = digest::decode_entries(&String::from_utf8_lossy(&answer))?;
        there.0.extend(l);
        there.1.extend(d);
    }
    let here = entries_here(server, base, &level).await?;
    Ok(pair(here, there))
}

/// The children of `level` whose nodes differ between `local` and the
/// provider's `remote` children of the same nodes.
fn differing(local: &Tree, level: &[String], remote: &[Node]) -> Vec<String> {
    let mine: BTreeMap<String, Node> = level
        .iter()
        .flat_map(|p| local.children(p).unwrap_or_default())
        .map(|n| (n.prefix.clone(), n))
        .collect();
    let theirs: BTreeMap<&str, &Node> = remote.iter().map(|n| (n.prefix.as_str(), n)).collect();
    let names: BTreeSet<&str> = mine
        .keys()
        .map(String::as_str)
        .chain(theirs.keys().copied())
        .collect();
    names
        .into_iter()
        .filter(|p| mine.get(*p) != theirs.get(p).copied())
        .map(str::to_string)
        .collect()
}

async fn entries_here(
    server: &Arc<Server>,
    base: &str,
    leaves: &[String],
) -> Result<(Vec<Listed>, Vec<Deleted>), String> {
    let (s2, b2, l2) = (server.clone(), base.to_string(), leaves.to_vec());
    blocking(server, move || {
        let prefixes: Vec<&str> = l2.iter().map(String::as_str).collect();
        local_entries(&s2, &b2, &prefixes)
    })
    .await
}

/// Read the provider's slice whole and compare it with ours.
async fn by_reading(
    server: &Arc<Server>,
    client: &mut Client,
    base: &str,
    local: &Tree,
    prefix: &str,
) -> Result<Vec<Found>, String> {
    let (tree, entries) = read_slice(server, client, base, prefix).await?;
    let leaves: Vec<String> = leaves_below(prefix)
        .filter(|p| local.node(p) != tree.node(p))
        .collect();
    if leaves.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: BTreeSet<&str> = leaves.iter().map(String::as_str).collect();
    let there: Vec<Listed> = entries
        .into_values()
        .filter(|l| wanted.contains(&digest::hex(&l.uuid)[..digest::LEAF_DIGITS]))
        .collect();
    let here = entries_here(server, base, &leaves).await?;
    Ok(pair(here, (there, Vec::new())))
}

/// Every leaf prefix below `prefix`.
fn leaves_below(prefix: &str) -> impl Iterator<Item = String> + '_ {
    let free = digest::LEAF_DIGITS - prefix.len();
    (0..1usize << (4 * free)).map(move |i| format!("{prefix}{i:0free$x}"))
}

/// The search reading the slice `prefix` of the provider's subtree.
fn slice_search(base: &str, prefix: &str) -> Result<SearchRequest, String> {
    let bound = |p: &str| format!("{p:0<32}");
    let uuid = |hex: String| {
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    };
    let filter = if prefix.is_empty() {
        "(objectClass=*)".to_string()
    } else {
        let lo = uuid(bound(prefix));
        let next = usize::from_str_radix(prefix, 16).map_err(|e| e.to_string())? + 1;
        if next >= 1 << (4 * prefix.len()) {
            format!("(entryUUID>={lo})")
        } else {
            let hi = uuid(bound(&format!("{next:0w$x}", w = prefix.len())));
            format!("(&(entryUUID>={lo})(!(entryUUID>={hi})))")
        }
    };
    Ok(SearchRequest {
        base: base.to_string(),
        scope: Scope::Sub,
        deref: DerefAliases::Never,
        size_limit: 0,
        time_limit: 0,
        types_only: false,
        filter: Filter::parse(&filter).map_err(|e| e.to_string())?,
        attrs: vec!["*".into(), "entryUUID".into(), "entryCSN".into()],
    })
}

type Slice = (Tree, BTreeMap<Uuid, Listed>);

async fn read_slice(
    server: &Arc<Server>,
    client: &mut Client,
    base: &str,
    prefix: &str,
) -> Result<Slice, String> {
    let manage = Control {
        oid: pando_proto::oid::MANAGE_DSA_IT.into(),
        critical: false,
        value: None,
    };
    let id = client
        .send(
            ProtocolOp::SearchRequest(slice_search(base, prefix)?),
            vec![manage],
        )
        .await
        .map_err(|e| e.0)?;
    let (mut tree, mut entries) = (Tree::default(), BTreeMap::new());
    let mut names = digest::Names::new(&server.schema);
    loop {
        let LdapMessage { id: got, op, .. } =
            client.recv(Some(client.timeout())).await.map_err(|e| e.0)?;
        if got != id {
            continue;
        }
        match op {
            ProtocolOp::SearchResultEntry(e) => {
                let Some(l) = digest::listed_from_search(&mut names, &e) else {
                    continue;
                };
                if digest::hex(&l.uuid).starts_with(prefix) {
                    tree.add(&l.uuid, &l.digest);
                    entries.insert(l.uuid, l);
                }
            }
            ProtocolOp::SearchResultDone(r) if r.code.0 == 0 => return Ok((tree, entries)),
            ProtocolOp::SearchResultDone(r) => {
                return Err(format!(
                    "reading the provider: {} {}",
                    r.code.name(),
                    r.message
                ))
            }
            _ => {}
        }
    }
}

/// Pair what each side holds by UUID; keep what differs.
fn pair(here: (Vec<Listed>, Vec<Deleted>), there: (Vec<Listed>, Vec<Deleted>)) -> Vec<Found> {
    let mut by: BTreeMap<Uuid, (Held, Held)> = BTreeMap::new();
    let mut put = |side: usize, uuid: Uuid, h: Held| {
        let slot = by.entry(uuid).or_insert((Held::Missing, Held::Missing));
        let cell = if side == 0 { &mut slot.0 } else { &mut slot.1 };
        if !matches!(cell, Held::Entry(_)) {
            *cell = h;
        }
    };
    for (side, (listed, deleted)) in [(0, here), (1, there)] {
        for d in deleted {
            put(side, d.uuid, Held::Deleted(d));
        }
        for l in listed {
            put(side, l.uuid, Held::Entry(l));
        }
    }
    by.into_iter()
        .filter(|(_, (h, t))| h.digest() != t.digest())
        .map(|(u, (h, t))| (u, h, t))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_uuid_space_in_turn() {
        assert_eq!(slice_prefix(5, 1), "");
        assert_eq!(slice_prefix(17, 16), "1");
        assert_eq!(slice_prefix(0x1ab, 256), "ab");
        assert_eq!(slice_prefix(4095, 4096), "fff");
        assert_eq!(leaves_below("abc").count(), 16);
        assert_eq!(leaves_below("").count(), 65536);
        let s = slice_search("dc=x", "a").unwrap();
        let text = s.filter.to_string();
        assert!(
            text.contains("a0000000-0000-0000-0000-000000000000"),
            "{text}"
        );
        assert!(
            text.contains("b0000000-0000-0000-0000-000000000000"),
            "{text}"
        );
        let last = slice_search("dc=x", "ff").unwrap().filter.to_string();
        assert_eq!(last, "(entryUUID>=ff000000-0000-0000-0000-000000000000)");
    }

    #[test]
    fn only_what_differs_is_paired_out() {
        let l = |u: u8, d: u8| Listed {
            uuid: [u; 16],
            csn: "c".into(),
            digest: [d; 16],
            dn: format!("cn={u}"),
        };
        let del = Deleted {
            uuid: [3; 16],
            at: "x".into(),
            dn: "cn=3".into(),
        };
        let found = pair(
            (vec![l(1, 1), l(2, 2), l(3, 3)], vec![]),
            (vec![l(1, 1), l(2, 9)], vec![del]),
        );
        let uuids: Vec<u8> = found.iter().map(|f| f.0[0]).collect();
        assert_eq!(uuids, vec![2, 3]);
        assert!(matches!(found[1].2, Held::Deleted(_)));
    }
}
