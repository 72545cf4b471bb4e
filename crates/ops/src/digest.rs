//! Replica digests: what two servers hold, compared without reading it all
//! over the network (`pando repl check`). Every entry of a subtree gets a
//! digest of its name and content — its DN, entryUUID, entryCSN and user
//! attributes, as a search for `* entryUUID entryCSN` returns them — and
//! the digests are folded into a hash tree keyed by entryUUID: 65,536
//! leaves by the UUID's first four hex digits, each node the XOR of the
//! digests below it, with their count. Two servers compare the root's
//! children, then the children of the nodes that differ, down to the
//! leaves, whose entries they list: only the ranges that differ are read.
//!
//! This module is the definition both sides share: the digest, the tree,
//! the text of the exchange (`DIGEST_EXOP`, answered in `digest_answer`).
//! Servers that do not know the operation (slapd) are read with searches
//! and digested by the caller with the same functions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use pando_model::Dn;
use sha2::{Digest as _, Sha256};

/// A digest, and a node's hash (the XOR of the digests below it).
pub type Hash = [u8; 16];
/// An entryUUID as 16 bytes.
pub type Uuid = [u8; 16];

/// Hex digits of a leaf's prefix.
pub const LEAF_DIGITS: usize = 4;
const LEAVES: usize = 1 << (4 * LEAF_DIGITS);
/// Most entries and deletes one `entries` answer lists.
pub const MAX_LISTED: usize = 20_000;
/// Most prefixes one request names.
pub const MAX_PREFIXES: usize = 4096;
/// Most lines one record request stores.
pub const MAX_RECORDED: usize = 1000;

/// The 16 bytes of a UUID written as 32 hex digits, with or without the
/// dashes of RFC 4122.
pub fn parse_uuid(text: &str) -> Option<Uuid> {
    let digits: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    if digits.len() != 32 || text.len() > 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A UUID in RFC 4122's form (lowercase).
pub fn uuid_text(u: &Uuid) -> String {
    let h = hex(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex16(text: &str) -> Option<Hash> {
    parse_uuid(text)
}

pub(crate) fn leaf_of(u: &Uuid) -> usize {
    usize::from(u16::from_be_bytes([u[0], u[1]]))
}

/// The leaves under `prefix` (0 to 4 lowercase hex digits; "" the root).
pub(crate) fn leaf_range(prefix: &str) -> Option<std::ops::Range<usize>> {
    if prefix.len() > LEAF_DIGITS || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let rest = 4 * (LEAF_DIGITS - prefix.len());
    let start = match prefix {
        "" => 0,
        p => usize::from_str_radix(p, 16).ok()? << rest,
    };
    Some(start..start + (1 << rest))
}

/// How attribute names are compared: a type's first name, lowercase (so
/// `commonName` and `cn` are one), options lowercase and sorted.
pub fn canonical_name(schema: &pando_model::Schema, desc: &str) -> String {
    let mut parts = desc.split(';');
    let base = parts.next().unwrap_or("");
    let mut out = match schema.attribute(base) {
        Some(at) => at.name().to_ascii_lowercase(),
        None => base.to_ascii_lowercase(),
    };
    let mut options: Vec<String> = parts.map(str::to_ascii_lowercase).collect();
    options.sort();
    for o in options {
        out.push(';');
        out.push_str(&o);
    }
    out
}

/// Attribute names as compared ([`canonical_name`]) and whether they go
/// into a digest ([`digested`]), remembered per description: a subtree
/// uses few, and looking each up in the schema for every value of every
/// entry was most of a digest's cost.
pub struct Names<'s> {
    schema: &'s pando_model::Schema,
    seen: HashMap<String, Named, std::hash::BuildHasherDefault<Fnv>>,
}

/// FNV-1a: the names hashed are a few short ASCII strings from this
/// server's own store or a search's answer, so a fast hash is enough.
#[derive(Default)]
pub struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// What [`Names`] knows of one description.
#[derive(Clone, Debug)]
pub struct Named {
    pub canonical: String,
    pub digested: bool,
}

impl<'s> Names<'s> {
    pub fn new(schema: &'s pando_model::Schema) -> Names<'s> {
        Names {
            schema,
            seen: HashMap::default(),
        }
    }

    pub fn get(&mut self, desc: &str) -> &Named {
        if !self.seen.contains_key(desc) {
            let named = Named {
                canonical: canonical_name(self.schema, desc),
                digested: digested(self.schema, desc),
            };
            self.seen.insert(desc.to_string(), named);
        }
        &self.seen[desc]
    }
}

/// A DN as compared: each attribute type's canonical name, values
/// lowercase (ASCII) and trimmed, the AVAs of an RDN sorted. A DN that
/// does not parse is compared as its lowercase text.
pub fn dn_key(names: &mut Names<'_>, dn: &str) -> String {
    let Ok(parsed) = Dn::parse(dn) else {
        return dn.to_ascii_lowercase();
    };
    let mut out = String::new();
    for (i, rdn) in parsed.rdns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut avas: Vec<String> = rdn
            .avas
            .iter()
            .map(|a| {
                let value = String::from_utf8_lossy(&a.value)
                    .trim()
                    .to_ascii_lowercase();
                format!("{}={}", names.get(&a.attr).canonical, value)
            })
            .collect();
        avas.sort();
        out.push_str(&avas.join("+"));
    }
    out
}

/// The digest of one entry: its UUID, its DN (as [`dn_key`] compares it)
/// and its attributes (values as bytes, in any order; only those
/// [`digested`] count).
pub fn entry_digest<'v>(
    names: &mut Names<'_>,
    uuid: &Uuid,
    dn: &str,
    attrs: impl IntoIterator<Item = (&'v str, Vec<&'v [u8]>)>,
) -> Hash {
    let attrs: Vec<(&str, Vec<&[u8]>)> = attrs.into_iter().collect();
    for (desc, _) in &attrs {
        names.get(desc);
    }
    let dn = dn_key(names, dn);
    let mut by_name: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::new();
    for (desc, values) in attrs {
        let named = &names.seen[desc];
        if named.digested {
            by_name
                .entry(named.canonical.as_str())
                .or_default()
                .extend(values);
        }
    }
    let mut h = Sha256::new();
    h.update(b"pando-digest-1\0");
    h.update(uuid);
    h.update(dn.as_bytes());
    h.update([0]);
    for (name, mut values) in by_name {
        values.sort();
        h.update(name.as_bytes());
        h.update([0]);
        h.update((values.len() as u32).to_be_bytes());
        for v in values {
            h.update((v.len() as u32).to_be_bytes());
            h.update(v);
        }
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Whether `desc` goes into a digest: user attributes, entryUUID and
/// entryCSN (what `* entryUUID entryCSN` returns).
pub fn digested(schema: &pando_model::Schema, desc: &str) -> bool {
    let base = desc.split(';').next().unwrap_or("");
    match schema.attribute(base) {
        Some(at) => {
            at.usage == pando_model::schema::Usage::UserApplications
                || at.name().eq_ignore_ascii_case("entryUUID")
                || at.name().eq_ignore_ascii_case("entryCSN")
        }
        None => true,
    }
}

/// An entry as a search for `* entryUUID entryCSN` returned it, digested
/// (None without an entryUUID: nothing to compare it by).
pub fn listed_from_search(
    names: &mut Names<'_>,
    e: &pando_proto::SearchResultEntry,
) -> Option<Listed> {
    let value = |name: &str| {
        e.attrs
            .iter()
            .find(|a| a.name.eq_ignore_ascii_case(name))
            .and_then(|a| a.values.first())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let uuid = parse_uuid(&value("entryUUID")?)?;
    let attrs = e.attrs.iter().map(|a| {
        (
            a.name.as_str(),
            a.values.iter().map(Vec::as_slice).collect(),
        )
    });
    Some(Listed {
        uuid,
        csn: value("entryCSN").unwrap_or_default(),
        digest: entry_digest(names, &uuid, &e.dn, attrs),
        dn: e.dn.clone(),
    })
}

/// One node of a tree: its prefix (hex digits of entryUUID), how many
/// entries are below it and the XOR of their digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub prefix: String,
    pub count: u64,
    pub hash: Hash,
}

/// A subtree's digests, by entryUUID.
#[derive(Clone)]
pub struct Tree {
    count: Vec<u32>,
    hash: Vec<Hash>,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree {
            count: vec![0; LEAVES],
            hash: vec![[0; 16]; LEAVES],
        }
    }
}

impl Tree {
    pub fn add(&mut self, uuid: &Uuid, digest: &Hash) {
        let i = leaf_of(uuid);
        self.count[i] += 1;
        for (a, b) in self.hash[i].iter_mut().zip(digest) {
            *a ^= b;
        }
    }

    /// The node at `prefix`, None when the prefix is not one.
    pub fn node(&self, prefix: &str) -> Option<Node> {
        let range = leaf_range(prefix)?;
        let mut node = Node {
            prefix: prefix.to_string(),
            count: 0,
            hash: [0; 16],
        };
        for i in range {
            node.count += u64::from(self.count[i]);
            for (a, b) in node.hash.iter_mut().zip(&self.hash[i]) {
                *a ^= b;
            }
        }
        Some(node)
    }

    /// The children of the node at `prefix` that hold entries.
    pub fn children(&self, prefix: &str) -> Option<Vec<Node>> {
        if prefix.len() >= LEAF_DIGITS {
            return None;
        }
        let mut out = Vec::new();
        for d in "0123456789abcdef".chars() {
            let node = self.node(&format!("{prefix}{d}"))?;
            if node.count > 0 {
                out.push(node);
            }
        }
        Some(out)
    }
}

/// One entry as listed under a leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub uuid: Uuid,
    /// Its entryCSN ("" when it has none).
    pub csn: String,
    pub digest: Hash,
    pub dn: String,
}

/// An entry a server remembers deleting (multi-provider Pando servers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deleted {
    pub uuid: Uuid,
    /// The delete's CSN.
    pub at: String,
    pub dn: String,
}

/// A request of [`DIGEST_EXOP`](crate::special::DIGEST_EXOP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The children of these nodes.
    Nodes { base: String, prefixes: Vec<String> },
    /// The entries and remembered deletes under these nodes.
    Entries { base: String, prefixes: Vec<String> },
    /// Lines for the conflict record: a repair made by a check
    /// (administrators only).
    Record { base: String, lines: Vec<String> },
}

/// The root's prefix as written in a request.
const ROOT: &str = "-";

impl Request {
    /// The request's text: `base DN`, a newline, then `nodes` or
    /// `entries` and the prefixes, separated by spaces (`-` the root).
    pub fn encode(&self) -> Vec<u8> {
        let (word, base, prefixes) = match self {
            Request::Nodes { base, prefixes } => ("nodes", base, prefixes),
            Request::Entries { base, prefixes } => ("entries", base, prefixes),
            Request::Record { base, lines } => {
                let lines: Vec<String> = lines.iter().map(|l| l.replace('\n', " ")).collect();
                return format!("base {base}\nrecord\n{}\n", lines.join("\n")).into_bytes();
            }
        };
        let shown: Vec<&str> = prefixes
            .iter()
            .map(|p| if p.is_empty() { ROOT } else { p.as_str() })
            .collect();
        format!("base {base}\n{word} {}\n", shown.join(" ")).into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "the request is not UTF-8")?;
        let mut lines = text.lines();
        let base = lines
            .next()
            .and_then(|l| l.strip_prefix("base "))
            .ok_or("the request's first line must be 'base DN'")?
            .to_string();
        let line = lines.next().ok_or("the request names no question")?;
        if line == "record" {
            let lines: Vec<String> = lines
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            if lines.is_empty()
                || lines.len() > MAX_RECORDED
                || lines.iter().any(|l| l.len() > 4096)
            {
                return Err(format!(
                    "a record is 1 to {MAX_RECORDED} lines of at most 4096 bytes"
                ));
            }
            return Ok(Request::Record { base, lines });
        }
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut prefixes = Vec::new();
        for p in rest.split(' ').filter(|p| !p.is_empty()) {
            let p = if p == ROOT { "" } else { p };
            let lower = p.to_ascii_lowercase();
            if leaf_range(&lower).is_none() {
                return Err(format!("'{p}' is not a prefix of up to 4 hex digits"));
            }
            prefixes.push(lower);
        }
        if prefixes.is_empty() || prefixes.len() > MAX_PREFIXES {
            return Err(format!("name 1 to {MAX_PREFIXES} prefixes"));
        }
        match word {
            "nodes" if prefixes.iter().any(|p| p.len() >= LEAF_DIGITS) => {
                Err("a leaf has no children".into())
            }
            "nodes" => Ok(Request::Nodes { base, prefixes }),
            "entries" => Ok(Request::Entries { base, prefixes }),
            other => Err(format!("'{other}' is not a question (nodes, entries)")),
        }
    }
}

/// Nodes as answered: `prefix count hash` lines.
pub fn encode_nodes(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| format!("{} {} {}\n", n.prefix, n.count, hex(&n.hash)))
        .collect()
}

pub fn decode_nodes(text: &str) -> Result<Vec<Node>, String> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut f = l.split(' ');
            let bad = || format!("malformed node line '{l}'");
            let prefix = f.next().ok_or_else(bad)?.to_string();
            let count = f.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
            let hash = f.next().and_then(unhex16).ok_or_else(bad)?;
            Ok(Node {
                prefix,
                count,
                hash,
            })
        })
        .collect()
}

/// Entries as answered: `e UUID CSN DIGEST DN` and `d UUID CSN DN` lines
/// (`-` for an entry without entryCSN).
pub fn encode_entries(listed: &[Listed], deleted: &[Deleted]) -> String {
    let mut out = String::new();
    for e in listed {
        let csn = if e.csn.is_empty() { "-" } else { &e.csn };
        out.push_str(&format!(
            "e {} {csn} {} {}\n",
            uuid_text(&e.uuid),
            hex(&e.digest),
            e.dn.replace('\n', " ")
        ));
    }
    for d in deleted {
        out.push_str(&format!(
            "d {} {} {}\n",
            uuid_text(&d.uuid),
            d.at,
            d.dn.replace('\n', " ")
        ));
    }
    out
}

pub fn decode_entries(text: &str) -> Result<(Vec<Listed>, Vec<Deleted>), String> {
    let (mut listed, mut deleted) = (Vec::new(), Vec::new());
    for l in text.lines().filter(|l| !l.is_empty()) {
        let bad = || format!("malformed entry line '{l}'");
        let mut f = l.splitn(5, ' ');
        let kind = f.next().ok_or_else(bad)?;
        let uuid = f.next().and_then(parse_uuid).ok_or_else(bad)?;
        let csn = f.next().ok_or_else(bad)?;
        let csn = if csn == "-" { "" } else { csn }.to_string();
        match kind {
            "e" => {
                let digest = f.next().and_then(unhex16).ok_or_else(bad)?;
                let dn = f.next().unwrap_or("").to_string();
                listed.push(Listed {
                    uuid,
                    csn,
                    digest,
                    dn,
                });
            }
            "d" => {
                let rest: Vec<&str> = f.collect();
                deleted.push(Deleted {
                    uuid,
                    at: csn,
                    dn: rest.join(" "),
                });
            }
            _ => return Err(bad()),
        }
    }
    Ok((listed, deleted))
}

/// Trees kept for reuse: a check descends one tree in several requests.
/// One per (base, requester), valid for one content generation of the
/// store; at most [`KEPT_TREES`] (a tree is 1.3 MB).
#[derive(Default)]
pub struct TreeCache {
    trees: Mutex<Vec<(TreeKey, Arc<Tree>)>>,
}

const KEPT_TREES: usize = 4;

#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TreeKey {
    pub(crate) generation: u64,
    pub(crate) base: String,
    pub(crate) who: String,
}

impl TreeCache {
    pub(crate) fn get(&self, key: &TreeKey) -> Option<Arc<Tree>> {
        let trees = self.trees.lock().ok()?;
        trees.iter().find(|(k, _)| k == key).map(|(_, t)| t.clone())
    }

    pub(crate) fn put(&self, key: TreeKey, tree: Arc<Tree>) {
        if let Ok(mut trees) = self.trees.lock() {
            trees.retain(|(k, _)| k.generation >= key.generation && *k != key);
            if trees.len() >= KEPT_TREES {
                trees.remove(0);
            }
            trees.push((key, tree));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> pando_model::Schema {
        pando_model::Schema::standard()
    }

    #[test]
    fn uuids_read_with_or_without_dashes_and_print_as_rfc_4122() {
        let u = parse_uuid("0A1B2C3D-4e5f-6071-8293-a4b5c6d7e8f9").unwrap();
        assert_eq!(uuid_text(&u), "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9");
        assert_eq!(parse_uuid("0a1b2c3d4e5f60718293a4b5c6d7e8f9"), Some(u));
        assert_eq!(parse_uuid("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f"), None);
        assert_eq!(parse_uuid("zz1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"), None);
    }

    #[test]
    fn a_digest_ignores_value_order_name_spelling_and_dn_case() {
        let schema = schema();
        let s = &mut Names::new(&schema);
        let u = [7u8; 16];
        let a = entry_digest(
            s,
            &u,
            "uid=Bob,ou=People,dc=example,dc=com",
            vec![
                ("cn", vec![&b"Bob"[..], b"Robert"]),
                ("objectClass", vec![&b"top"[..], b"person"]),
            ],
        );
        let b = entry_digest(
            s,
            &u,
            "UID=bob, ou=people,dc=EXAMPLE,dc=com",
            vec![
                ("objectclass", vec![&b"person"[..], b"top"]),
                ("commonName", vec![&b"Robert"[..], b"Bob"]),
            ],
        );
        assert_eq!(a, b);
        // A value, a name, the UUID: each changes it.
        let c = entry_digest(
            s,
            &u,
            "uid=bob,ou=people,dc=example,dc=com",
            vec![
                ("cn", vec![&b"bob"[..], b"Robert"]),
                ("objectClass", vec![&b"top"[..], b"person"]),
            ],
        );
        assert_ne!(a, c);
        let d = entry_digest(
            s,
            &u,
            "uid=bob2,ou=people,dc=example,dc=com",
            vec![
                ("cn", vec![&b"Bob"[..], b"Robert"]),
                ("objectClass", vec![&b"top"[..], b"person"]),
            ],
        );
        assert_ne!(a, d);
        let e = entry_digest(
            s,
            &[8u8; 16],
            "uid=bob,ou=people,dc=example,dc=com",
            vec![
                ("cn", vec![&b"Bob"[..], b"Robert"]),
                ("objectClass", vec![&b"top"[..], b"person"]),
            ],
        );
        assert_ne!(a, e);
    }

    #[test]
    fn a_tree_finds_the_one_leaf_that_differs_level_by_level() {
        let mut a = Tree::default();
        let mut b = Tree::default();
        for i in 0..5000u32 {
            let mut u = [0u8; 16];
            u[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
            let d = [i as u8; 16];
            a.add(&u, &d);
            if i != 1234 {
                b.add(&u, &d);
            } else {
                b.add(&u, &[1; 16]);
            }
        }
        let mut level = vec![String::new()];
        for _ in 0..LEAF_DIGITS {
            let mut next = Vec::new();
            for p in &level {
                let (ca, cb) = (a.children(p).unwrap(), b.children(p).unwrap());
                for n in &ca {
                    if !cb.contains(n) {
                        next.push(n.prefix.clone());
                    }
                }
            }
            assert_eq!(next.len(), 1, "one node differs at each level");
            level = next;
        }
        let mut u = [0u8; 16];
        u[..4].copy_from_slice(&1234u32.wrapping_mul(2_654_435_761).to_be_bytes());
        assert_eq!(level[0], hex(&u)[..4]);
        assert_eq!(a.node("").unwrap().count, 5000);
        assert!(a.children("abcd").is_none());
    }

    #[test]
    fn requests_and_answers_read_back_and_bad_ones_are_named() {
        let r = Request::Nodes {
            base: "dc=example,dc=com".into(),
            prefixes: vec!["".into(), "0a".into()],
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let r = Request::Entries {
            base: "dc=example,dc=com".into(),
            prefixes: vec!["0abc".into()],
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let r = Request::Record {
            base: "dc=example,dc=com".into(),
            lines: vec!["one".into(), "two".into()],
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        for (bad, says) in [
            (&b"base dc=x\nrecord\n"[..], "1 to 1000 lines"),
            (b"nodes -\n", "base DN"),
            (b"base dc=x\nnodes 0abcd\n", "4 hex digits"),
            (b"base dc=x\nnodes 0abc\n", "no children"),
            (b"base dc=x\nnodes\n", "prefixes"),
            (b"base dc=x\nguess 0\n", "not a question"),
            (b"base dc=x\nnodes xy\n", "hex"),
        ] {
            let e = Request::decode(bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let nodes = vec![Node {
            prefix: "0a".into(),
            count: 3,
            hash: [9; 16],
        }];
        assert_eq!(decode_nodes(&encode_nodes(&nodes)), Ok(nodes));
        let listed = vec![Listed {
            uuid: [1; 16],
            csn: "20261129000000.000000Z#000000#001#000000".into(),
            digest: [2; 16],
            dn: "cn=a b,dc=example,dc=com".into(),
        }];
        let deleted = vec![Deleted {
            uuid: [3; 16],
            at: "20261129000001.000000Z#000000#002#000000".into(),
            dn: "cn=c d,dc=example,dc=com".into(),
        }];
        let text = encode_entries(&listed, &deleted);
        assert_eq!(decode_entries(&text), Ok((listed, deleted)));
        assert!(decode_entries("e nonsense\n").is_err());
    }
}
