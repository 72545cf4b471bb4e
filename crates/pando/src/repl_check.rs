//! `pando repl check URL...`: whether replicas hold the same entries, and
//! which differ. Equal contextCSN says every server has seen the same
//! changes, not that it holds the same data; this compares the data.
//!
//! Each server's subtree is a hash tree over its entries keyed by
//! entryUUID (`ops::digest`): Pando servers answer with their tree's nodes
//! (`DIGEST_EXOP`), level by level, only under the nodes that differ, then
//! list the entries of the leaves that differ; other servers (slapd) are
//! read once with a search and digested here the same way. Every entry
//! that differs is named with what each server holds of it. With
//! `--repair`, the copy replication's rules make the winner (the newest
//! entryCSN; a remembered delete newer than every copy) is written again
//! where it is held, so that replication carries it to the others, and
//! the repair is recorded in each Pando server's conflict record.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pando_proto::Scope;
use pando_server::ops::digest::{self, Deleted, Listed, Node, Request, Tree, Uuid};
use pando_server::ops::special::DIGEST_EXOP;

use crate::ldap_client::search_request as search;
use crate::ldap_client::Ldap;
use crate::repl_diff::{differing_attrs, fetch, manage_dsa_it, shown, Differing, Held};

#[derive(clap::Args)]
pub struct ReplCheckArgs {
    /// Servers to compare: ldap://HOST:PORT or ldapi://PATH (percent-encoded).
    #[arg(required = true, num_args = 2..)]
    pub urls: Vec<String>,
    /// The subtree compared.
    #[arg(long, short = 'b', default_value = "dc=example,dc=com")]
    pub base: String,
    /// Read every server with a search, even Pando servers that could
    /// answer with their digests.
    #[arg(long)]
    pub read_all: bool,
    /// Write the winning copy of each differing entry again (or delete
    /// it where a newer delete is remembered) so that replication carries
    /// it everywhere, then check again.
    #[arg(long)]
    pub repair: bool,
    /// After a repair, how long to wait for the servers to agree (seconds).
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
    /// How to bind to every server.
    #[command(flatten)]
    pub bind: crate::ldap_client::BindArgs,
}

/// How one server is compared.
enum Source {
    /// A Pando server: asked for its digests.
    Digests { ldap: Ldap },
    /// Any other server: read whole once.
    Read {
        tree: Tree,
        entries: HashMap<Uuid, Listed>,
    },
}

/// One server in the comparison.
struct Server {
    url: String,
    source: Source,
    /// Requests sent and entries received (the check's cost).
    requests: u64,
    entries_read: u64,
    /// Bytes received from a server read whole.
    read_bytes: u64,
}

/// Whether the server answers digest requests (its root DSE says so).
fn knows_digests(l: &mut Ldap) -> Result<bool, String> {
    let found = l.search_all("", Scope::Base, &["supportedExtension"])?;
    Ok(found.values().any(|attrs| {
        attrs
            .get("supportedextension")
            .is_some_and(|v| v.iter().any(|o| o == DIGEST_EXOP))
    }))
}

impl Server {
    fn open(
        args: &ReplCheckArgs,
        url: &str,
        schema: &pando_model::Schema,
    ) -> Result<Server, String> {
        let mut ldap = args.bind.open(url)?;
        let mut server = Server {
            url: url.to_string(),
            source: Source::Read {
                tree: Tree::default(),
                entries: HashMap::new(),
            },
            requests: 1,
            entries_read: 0,
            read_bytes: 0,
        };
        if !args.read_all && knows_digests(&mut ldap)? {
            server.source = Source::Digests { ldap };
            return Ok(server);
        }
        let (mut tree, mut entries) = (Tree::default(), HashMap::new());
        let req = search(
            &args.base,
            Scope::Sub,
            "(objectClass=*)",
            &["*", "entryUUID", "entryCSN"],
        )?;
        let mut read = 0u64;
        let mut names = digest::Names::new(schema);
        let (code, message) = ldap.search_each(req, vec![manage_dsa_it()], &mut |e| {
            read += 1;
            if let Some(l) = digest::listed_from_search(&mut names, &e) {
                tree.add(&l.uuid, &l.digest);
                entries.insert(l.uuid, l);
            }
        })?;
        if code != 0 {
            return Err(format!("reading {} failed: {code} {message}", args.base));
        }
        server.requests += 1;
        server.entries_read = read;
        server.read_bytes = ldap.received;
        server.source = Source::Read { tree, entries };
        Ok(server)
    }

    /// The children of the nodes at `prefixes`.
    fn children(&mut self, base: &str, prefixes: &[String]) -> Result<Vec<Node>, String> {
        match &mut self.source {
            Source::Read { tree, .. } => Ok(prefixes
                .iter()
                .flat_map(|p| tree.children(p).unwrap_or_default())
                .collect()),
            Source::Digests { ldap } => {
                let mut out = Vec::new();
                for chunk in prefixes.chunks(digest::MAX_PREFIXES) {
                    let req = Request::Nodes {
                        base: base.to_string(),
                        prefixes: chunk.to_vec(),
                    };
                    let answer = ldap.extended(DIGEST_EXOP, req.encode())?;
                    self.requests += 1;
                    out.extend(digest::decode_nodes(&String::from_utf8_lossy(&answer))?);
                }
                Ok(out)
            }
        }
    }

    /// The entries and remembered deletes under the leaves `prefixes`.
    fn entries(
        &mut self,
        base: &str,
        prefixes: &[String],
    ) -> Result<(Vec<Listed>, Vec<Deleted>), String> {
        match &mut self.source {
            Source::Read { entries, .. } => {
                let wanted: BTreeSet<&str> = prefixes.iter().map(String::as_str).collect();
                let listed = entries
                    .values()
                    .filter(|l| wanted.contains(&digest::hex(&l.uuid)[..digest::LEAF_DIGITS]))
                    .cloned()
                    .collect();
                Ok((listed, Vec::new()))
            }
            Source::Digests { ldap } => {
                let (mut listed, mut deleted) = (Vec::new(), Vec::new());
                for chunk in prefixes.chunks(256) {
                    let req = Request::Entries {
                        base: base.to_string(),
                        prefixes: chunk.to_vec(),
                    };
                    let answer = ldap.extended(DIGEST_EXOP, req.encode())?;
                    self.requests += 1;
                    let (l, d) = digest::decode_entries(&String::from_utf8_lossy(&answer))?;
                    self.entries_read += (l.len() + d.len()) as u64;
                    listed.extend(l);
                    deleted.extend(d);
                }
                Ok((listed, deleted))
            }
        }
    }

    /// Bytes received from the server.
    fn received(&self) -> u64 {
        match &self.source {
            Source::Digests { ldap } => ldap.received,
            Source::Read { .. } => self.read_bytes,
        }
    }

    fn kind(&self) -> &'static str {
        match self.source {
            Source::Digests { .. } => "digests",
            Source::Read { .. } => "read whole",
        }
    }
}

/// The leaves whose nodes differ between the servers, found top-down.
fn differing_leaves(servers: &mut [Server], base: &str) -> Result<Vec<String>, String> {
    let mut level = vec![String::new()];
    for _ in 0..digest::LEAF_DIGITS {
        // Every server at once: each computes its tree the first time.
        let asked: Vec<Result<Vec<Node>, String>> = std::thread::scope(|t| {
            let level = &level;
            let running: Vec<_> = servers
                .iter_mut()
                .map(|s| {
                    t.spawn(move || {
                        s.children(base, level)
                            .map_err(|e| format!("{}: {e}", s.url))
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a thread failed".into())))
                .collect()
        });
        let mut seen: Vec<BTreeMap<String, Node>> = Vec::new();
        for nodes in asked {
            seen.push(nodes?.into_iter().map(|n| (n.prefix.clone(), n)).collect());
        }
        let all: BTreeSet<&String> = seen.iter().flat_map(|m| m.keys()).collect();
        level = all
            .into_iter()
            .filter(|p| seen.iter().any(|m| m.get(*p) != seen[0].get(*p)))
            .cloned()
            .collect();
        if level.is_empty() {
            break;
        }
    }
    Ok(level)
}

/// Every entry that differs, in DN order.
fn compare(servers: &mut [Server], base: &str) -> Result<Vec<Differing>, String> {
    let leaves = differing_leaves(servers, base)?;
    if leaves.is_empty() {
        return Ok(Vec::new());
    }
    let n = servers.len();
    let mut by_uuid: BTreeMap<Uuid, Vec<Held>> = BTreeMap::new();
    for (i, s) in servers.iter_mut().enumerate() {
        let (listed, deleted) = s
            .entries(base, &leaves)
            .map_err(|e| format!("{}: {e}", s.url))?;
        for d in deleted {
            let u = d.uuid;
            by_uuid.entry(u).or_insert_with(|| vec![Held::Missing; n])[i] = Held::Deleted(d);
        }
        for l in listed {
            let u = l.uuid;
            by_uuid.entry(u).or_insert_with(|| vec![Held::Missing; n])[i] = Held::Entry(l);
        }
    }
    let mut out: Vec<Differing> = by_uuid
        .into_iter()
        .filter(|(_, held)| !all_same(held))
        .map(|(uuid, held)| Differing { uuid, held })
        .collect();
    out.sort_by_key(|d| d.dn().to_ascii_lowercase());
    Ok(out)
}

/// Every server holds the same copy, or none holds it (deletes
/// remembered by some only are not a difference).
fn all_same(held: &[Held]) -> bool {
    let digests: Vec<Option<&digest::Hash>> = held
        .iter()
        .map(|h| match h {
            Held::Entry(l) => Some(&l.digest),
            _ => None,
        })
        .collect();
    digests.iter().all(|d| *d == digests[0])
}

/// Most differing entries whose attributes are compared one by one.
const DETAILED: usize = 100;

fn report(
    args: &ReplCheckArgs,
    schema: &pando_model::Schema,
    servers: &[Server],
    diffs: &[Differing],
) {
    for (k, d) in diffs.iter().enumerate() {
        println!("{} (entryUUID {})", d.dn(), digest::uuid_text(&d.uuid));
        for (i, h) in d.held.iter().enumerate() {
            println!("    [{}] {}", i + 1, shown(h));
        }
        if k >= DETAILED {
            continue;
        }
        let Some((w, _)) = d.newest() else {
            continue;
        };
        let Ok(Some(winner)) = fetch(&args.bind, &args.base, &servers[w].url, &d.uuid) else {
            continue;
        };
        for (i, h) in d.held.iter().enumerate() {
            if i == w || !matches!(h, Held::Entry(_)) {
                continue;
            }
            if let Ok(Some(other)) = fetch(&args.bind, &args.base, &servers[i].url, &d.uuid) {
                let names = differing_attrs(schema, &winner, &other);
                if !names.is_empty() {
                    println!(
                        "    [{}] differs from [{}] in: {}",
                        i + 1,
                        w + 1,
                        names.join(", ")
                    );
                }
            }
        }
    }
}

/// Open every server and compare; the servers (for their costs) and what
/// differs.
fn check_once(
    args: &ReplCheckArgs,
    schema: &pando_model::Schema,
) -> Result<(Vec<Server>, Vec<Differing>), String> {
    // Every server at once: reading one whole can take a while.
    let opened: Vec<Result<Server, String>> = std::thread::scope(|t| {
        let running: Vec<_> = args
            .urls
            .iter()
            .map(|url| {
                t.spawn(move || Server::open(args, url, schema).map_err(|e| format!("{url}: {e}")))
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread failed".into())))
            .collect()
    });
    let servers: Result<Vec<Server>, String> = opened.into_iter().collect();
    let mut servers = servers?;
    let diffs = compare(&mut servers, &args.base)?;
    Ok((servers, diffs))
}

fn summary(servers: &[Server], diffs: &[Differing], took: Duration) {
    for (i, s) in servers.iter().enumerate() {
        println!(
            "[{}] {}: {}, {} requests, {} entries read, {} bytes received",
            i + 1,
            s.url,
            s.kind(),
            s.requests,
            s.entries_read,
            s.received()
        );
    }
    match diffs.len() {
        0 => println!("the same entries everywhere ({:.2}s)", took.as_secs_f64()),
        n => println!("{n} entries differ ({:.2}s)", took.as_secs_f64()),
    }
}

/// Compare; exit 0 when every server holds the same entries, 1 when some
/// differ (after a repair: when some still differ), 2 when a server
/// cannot be read.
pub fn run(args: ReplCheckArgs) -> Result<ExitCode, String> {
    let schema = pando_model::Schema::standard();
    let started = Instant::now();
    let (servers, diffs) = match check_once(&args, &schema) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot compare: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    report(&args, &schema, &servers, &diffs);
    summary(&servers, &diffs, started.elapsed());
    if diffs.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if !args.repair {
        return Ok(ExitCode::from(1));
    }
    crate::repl_repair::repair(
        &args.bind,
        &args.base,
        &schema,
        &servers_urls(&servers),
        &diffs,
    )?;
    let deadline = Instant::now() + Duration::from_secs(args.wait);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let again = check_once(&args, &schema).map(|(_, d)| d);
        let left = match &again {
            Ok(d) => d.len(),
            Err(_) => usize::MAX,
        };
        if left == 0 {
            println!("after the repair: the same entries everywhere");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            match again {
                Ok(d) => {
                    println!("after the repair, {} entries still differ:", d.len());
                    for x in &d {
                        println!("    {}", x.dn());
                    }
                }
                Err(e) => println!("after the repair: cannot compare: {e}"),
            }
            return Ok(ExitCode::from(1));
        }
    }
}

fn servers_urls(servers: &[Server]) -> Vec<(String, bool)> {
    servers
        .iter()
        .map(|s| (s.url.clone(), matches!(s.source, Source::Digests { .. })))
        .collect()
}
