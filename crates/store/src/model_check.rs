//! Model-based check of the store, a testing aid: the same random adds,
//! modifies, renames and deletes go to a [`Store`] and to an in-memory model
//! (a `BTreeMap` from normalised DN to entry), and afterwards `verify` must
//! find nothing and every reader-visible fact must agree with the model.
//!
//! Compiled for this crate's tests and with the `fuzzing` feature: the
//! `store_model` fuzz target feeds it arbitrary bytes, and a seeded unit test
//! feeds it pseudo-random ones, so a fuzzer's crash input replays as a plain
//! `cargo test`.
//!
//! What runs against the store is a miniature of the server's write
//! operations: each write job resolves DNs through its own transaction's
//! view, makes the checks the server makes (the DN is free, the parent
//! exists, a move does not go below the entry itself, a delete removes a
//! leaf) and calls `add`, `replace`, `rename` and `delete`. Some operations
//! skip those checks on purpose: then the store itself must refuse (its
//! guard against a caller's bug corrupting the tree), and the model says
//! when. Jobs run alone or several in one writer batch; a job with several
//! operations fails as a whole, and some jobs fail on purpose after writing,
//! so nested-transaction rollback is exercised too.
//!
//! The model trusts the schema's matching rules (it normalises with them)
//! and checks the store's bookkeeping: dn2id, id2parent, id2entry, the
//! indexes, the DN cache and snapshot isolation.
//!
//! Input format: a byte string decoded step by step; every byte string is a
//! valid input (a byte past the end reads as 0), and targets are mostly
//! picked among the model's entries so operations collide often.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use pando_model::{Attribute, Dn, Rdn, Schema};
use pando_proto::Filter;

use crate::{
    Candidates, Durability, EntryId, IndexKind, IndexSpec, Lookup, Placement, ReadTxn, Store,
    StoreError, StoreOptions, View, WriteTxn,
};

/// The one suffix; created before the first step, never renamed or deleted.
pub const SUFFIX: &str = "dc=example,dc=com";

/// Steps decoded from one input at most: bounds the time of one run.
const MAX_STEPS: usize = 96;
/// Full comparisons asked for by the input at most (one more runs at the end).
const MAX_CHECKS: usize = 4;
/// Jobs in one batch at most; below the writer's `max_batch`, so a gated
/// batch is one write transaction.
const MAX_BATCH: usize = 5;

/// Values of `cn` (and its option `cn;lang-x`): short strings over a small
/// alphabet in both cases, so equality and substring keys collide; the two
/// long ones share an index key (cut at `index::MAX_KEY`) and differ after it.
fn cn_values() -> [Vec<u8>; 16] {
    let long = |c: u8| {
        let mut v = vec![b'a'; crate::index::MAX_KEY + 5];
        v.push(c);
        v
    };
    [
        b"a".to_vec(),
        b"A".to_vec(),
        b"b".to_vec(),
        b"ab".to_vec(),
        b"Ab".to_vec(),
        b"ba".to_vec(),
        b"abc".to_vec(),
        b"ABC".to_vec(),
        b"bca".to_vec(),
        b"cab".to_vec(),
        b"abab".to_vec(),
        b"c".to_vec(),
        b"ca".to_vec(),
        b"bb".to_vec(),
        long(b'x'),
        long(b'y'),
    ]
}

/// Values of `uidNumber` (equality and ordering indexes): negative ones
/// check that the ordering key sorts numerically.
const UID_VALUES: [i64; 8] = [-10, -2, 0, 1, 3, 9, 10, 12];

const CLASSES: [&str; 4] = ["person", "organizationalUnit", "inetOrgPerson", "device"];

/// Attribute descriptions a modify touches. `cn` and `CN` are one attribute
/// (descriptions compare without case); `cn;lang-x` is another, indexed
/// under `cn`; `sn` and `description` have no index.
const DESCS: [&str; 6] = ["cn", "CN", "cn;lang-x", "uidNumber", "description", "sn"];

/// Store options of a model run: small map, no fsync, an index of each kind
/// the comparison queries, compression on (the long description values are
/// stored compressed).
pub fn options() -> StoreOptions {
    StoreOptions {
        map_size: 64 << 20,
        indexes: vec![
            IndexSpec {
                attr: "objectClass".into(),
                kinds: vec![IndexKind::Eq],
            },
            IndexSpec {
                attr: "cn".into(),
                kinds: vec![IndexKind::Eq, IndexKind::Sub, IndexKind::Pres],
            },
            IndexSpec {
                attr: "uidNumber".into(),
                kinds: vec![IndexKind::Eq, IndexKind::Ord],
            },
        ],
        max_batch: 8,
        durability: Durability::None,
        compression: Some(3),
        check_all_pages: true,
    }
}

/// Open a fresh store in `dir` (which should be empty), apply the steps
/// `data` decodes to, compare, and close it. Panics, describing the last
/// steps, at the first difference between the store and the model.
pub fn run(dir: &Path, data: &[u8]) {
    // Building the standard schema costs more than a whole short run.
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    let schema = SCHEMA.get_or_init(|| Arc::new(Schema::standard())).clone();
    let store = Store::open(dir, schema.clone(), &options()).expect("open the store");
    {
        let mut h = Harness::new(&store, schema);
        h.drive(&mut Input { data, pos: 0 });
        h.finish();
    }
    store.close();
}

/// A byte cursor: reading past the end gives 0, so every input decodes.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Element `byte mod len` of `items`.
    fn pick<'i, T>(&mut self, items: &'i [T]) -> &'i T {
        &items[self.byte() as usize % items.len()]
    }
}

/// Why an operation does not happen. The job returns the refusal its own
/// checks give; `ByStore` is the store's own refusal of an unchecked
/// operation (a `StoreError::Corrupt` saying what the caller got wrong).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    NoSuchObject,
    NoParent,
    Exists,
    NonLeaf,
    BelowItself,
    Suffix,
    NoSuchAttribute,
    /// The job did its writes, then failed on purpose.
    Aborted,
    ByStore,
}

/// What a write job returns when it fails.
#[derive(Debug)]
enum JobErr {
    Refused(Refusal),
    Store(StoreError),
}

impl From<StoreError> for JobErr {
    fn from(e: StoreError) -> Self {
        JobErr::Store(e)
    }
}

#[derive(Clone, Debug)]
enum Change {
    /// Add the values not already present (byte for byte).
    Add(String, Vec<Vec<u8>>),
    /// Remove these values, or the whole attribute (None); the attribute
    /// must exist.
    Delete(String, Option<Vec<Vec<u8>>>),
    /// Set the values; none removes the attribute if present.
    Replace(String, Vec<Vec<u8>>),
}

#[derive(Clone, Debug)]
enum Op {
    Add {
        parent: Dn,
        rdn: Rdn,
        attrs: Vec<Attribute>,
        /// The job checks that the DN is free; otherwise the store must.
        checked: bool,
    },
    Modify {
        target: Dn,
        changes: Vec<Change>,
    },
    Rename {
        target: Dn,
        rdn: Rdn,
        new_parent: Option<Dn>,
        delete_old: bool,
        /// The job checks the new DN is free and not below the entry;
        /// otherwise the store must.
        checked: bool,
    },
    Delete {
        target: Dn,
        /// The job checks for children; otherwise the store must.
        checked: bool,
    },
}

/// One write job: its operations in one nested transaction, all or none.
#[derive(Clone, Debug)]
struct Job {
    ops: Vec<Op>,
    /// Fail after all operations succeeded: nothing of the job may remain.
    abort: bool,
}

/// Values for a failure message; long ones abbreviated.
fn show_values(vals: &[Vec<u8>]) -> String {
    vals.iter()
        .map(|v| {
            let t = String::from_utf8_lossy(v);
            if t.len() > 16 {
                let head: String = t.chars().take(8).collect();
                format!("{head}…({} bytes)", v.len())
            } else {
                t.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("|")
}

fn show_attrs(attrs: &[Attribute]) -> String {
    attrs
        .iter()
        .map(|a| format!("{}={}", a.desc, show_values(&a.values)))
        .collect::<Vec<_>>()
        .join(" ")
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let check = |c: &bool| if *c { "" } else { " unchecked" };
        match self {
            Op::Add {
                parent,
                rdn,
                attrs,
                checked,
            } => write!(
                f,
                "add{} '{rdn}' under '{parent}' [{}]",
                check(checked),
                show_attrs(attrs)
            ),
            Op::Modify { target, changes } => {
                write!(f, "modify '{target}':")?;
                for c in changes {
                    match c {
                        Change::Add(d, v) => write!(f, " add {d}={}", show_values(v))?,
                        Change::Delete(d, None) => write!(f, " delete {d}")?,
                        Change::Delete(d, Some(v)) => write!(f, " delete {d}={}", show_values(v))?,
                        Change::Replace(d, v) => write!(f, " replace {d}={}", show_values(v))?,
                    }
                }
                Ok(())
            }
            Op::Rename {
                target,
                rdn,
                new_parent,
                delete_old,
                checked,
            } => {
                write!(f, "rename{} '{target}' to '{rdn}'", check(checked))?;
                if let Some(p) = new_parent {
                    write!(f, " under '{p}'")?;
                }
                if *delete_old {
                    f.write_str(" deleting the old RDN")?;
                }
                Ok(())
            }
            Op::Delete { target, checked } => write!(f, "delete{} '{target}'", check(checked)),
        }
    }
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("job[")?;
        for (i, op) in self.ops.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{op}")?;
        }
        f.write_str(if self.abort { "; abort]" } else { "]" })
    }
}

/// Normalised RDNs from the suffix down: the suffix is `["dc=com",
/// "dc=example"]`, so a subtree is a key range.
type Key = Vec<String>;

#[derive(Clone, Debug)]
struct Node {
    /// Names the entry across renames; maps to its store ID once known.
    serial: u64,
    /// The RDN as given (the suffix: its whole DN), as `dn_string` shows it.
    rdn: String,
    attrs: Vec<Attribute>,
}

#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<Key, Node>,
}

fn key_of(schema: &Schema, dn: &Dn) -> Key {
    let mut k: Key = dn
        .rdns
        .iter()
        .map(|r| schema.normalize_rdn(r).expect("generated RDNs normalise"))
        .collect();
    k.reverse();
    k
}

fn suffix_key() -> Key {
    vec!["dc=com".to_string(), "dc=example".to_string()]
}

impl Model {
    fn contains(&self, k: &[String]) -> bool {
        self.nodes.contains_key(k)
    }

    /// Keys of `k` and everything below it, in order.
    fn subtree(&self, k: &[String]) -> Vec<Key> {
        self.nodes
            .range(k.to_vec()..)
            .map(|(key, _)| key)
            .take_while(|key| key.starts_with(k))
            .cloned()
            .collect()
    }

    fn children(&self, k: &[String]) -> Vec<Key> {
        self.subtree(k)
            .into_iter()
            .filter(|c| c.len() == k.len() + 1)
            .collect()
    }

    /// The DN as given: each RDN as it was added or renamed.
    fn given_dn(&self, k: &[String]) -> String {
        (2..=k.len())
            .rev()
            .map(|l| self.nodes[&k[..l]].rdn.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Apply `op` as the store should; on a refusal nothing changes.
    /// Returns the serial of an added entry.
    fn apply(&mut self, schema: &Schema, op: &Op, serial: u64) -> Result<Option<u64>, Refusal> {
        match op {
            Op::Add {
                parent,
                rdn,
                attrs,
                checked,
            } => {
                let pk = key_of(schema, parent);
                let mut k = pk.clone();
                k.push(schema.normalize_rdn(rdn).expect("generated RDNs normalise"));
                if *checked && self.contains(&k) {
                    return Err(Refusal::Exists);
                }
                if !self.contains(&pk) {
                    return Err(Refusal::NoParent);
                }
                if self.contains(&k) {
                    return Err(Refusal::ByStore);
                }
                self.nodes.insert(
                    k,
                    Node {
                        serial,
                        rdn: rdn.to_string(),
                        attrs: attrs.clone(),
                    },
                );
                Ok(Some(serial))
            }
            Op::Modify { target, changes } => {
                let k = key_of(schema, target);
                let node = self.nodes.get_mut(&k).ok_or(Refusal::NoSuchObject)?;
                node.attrs = apply_changes(&node.attrs, changes)?;
                Ok(None)
            }
            Op::Rename {
                target,
                rdn,
                new_parent,
                delete_old,
                checked,
            } => self.rename(
                schema,
                target,
                rdn,
                new_parent.as_ref(),
                *delete_old,
                *checked,
            ),
            Op::Delete { target, checked } => {
                let k = key_of(schema, target);
                if !self.contains(&k) {
                    return Err(Refusal::NoSuchObject);
                }
                if k.len() <= 2 {
                    return Err(Refusal::Suffix);
                }
                if !self.children(&k).is_empty() {
                    return Err(if *checked {
                        Refusal::NonLeaf
                    } else {
                        Refusal::ByStore
                    });
                }
                self.nodes.remove(&k);
                Ok(None)
            }
        }
    }

    /// A rename, as the store should make it: the entry and everything
    /// below it move.
    fn rename(
        &mut self,
        schema: &Schema,
        target: &Dn,
        rdn: &Rdn,
        new_parent: Option<&Dn>,
        delete_old: bool,
        checked: bool,
    ) -> Result<Option<u64>, Refusal> {
        let k = key_of(schema, target);
        if !self.contains(&k) {
            return Err(Refusal::NoSuchObject);
        }
        if k.len() <= 2 {
            return Err(Refusal::Suffix);
        }
        let pk = match new_parent {
            Some(p) => key_of(schema, p),
            None => k[..k.len() - 1].to_vec(),
        };
        if !self.contains(&pk) {
            return Err(Refusal::NoParent);
        }
        let below = pk.starts_with(&k);
        let mut nk = pk;
        nk.push(schema.normalize_rdn(rdn).expect("generated RDNs normalise"));
        let taken = nk != k && self.contains(&nk);
        if checked && below {
            return Err(Refusal::BelowItself);
        }
        if checked && taken {
            return Err(Refusal::Exists);
        }
        if below || taken {
            return Err(Refusal::ByStore);
        }
        let mut moved = Vec::new();
        for old in self.subtree(&k) {
            let node = self.nodes.remove(&old).expect("listed just now");
            let mut new = nk.clone();
            new.extend_from_slice(&old[k.len()..]);
            moved.push((new, node));
        }
        self.nodes.extend(moved);
        let node = self.nodes.get_mut(&nk).expect("moved just now");
        node.rdn = rdn.to_string();
        node.attrs = rename_attrs(schema, &node.attrs, target.rdn(), rdn, delete_old);
        Ok(None)
    }
}

/// The attributes after `changes` (descriptions compare without case, values
/// byte for byte). Shared by the model and the write jobs: what is checked
/// is that the store keeps what it is given, not this function.
fn apply_changes(attrs: &[Attribute], changes: &[Change]) -> Result<Vec<Attribute>, Refusal> {
    let mut out = attrs.to_vec();
    let find = |out: &[Attribute], d: &str| out.iter().position(|a| a.desc.eq_ignore_ascii_case(d));
    for ch in changes {
        match ch {
            Change::Add(d, vals) => match find(&out, d) {
                Some(i) => {
                    for v in vals {
                        if !out[i].values.contains(v) {
                            out[i].values.push(v.clone());
                        }
                    }
                }
                None if vals.is_empty() => {}
                None => out.push(Attribute {
                    desc: d.clone(),
                    values: dedup(vals),
                }),
            },
            Change::Delete(d, vals) => {
                let i = find(&out, d).ok_or(Refusal::NoSuchAttribute)?;
                match vals {
                    None => {
                        out.remove(i);
                    }
                    Some(vals) => {
                        out[i].values.retain(|v| !vals.contains(v));
                        if out[i].values.is_empty() {
                            out.remove(i);
                        }
                    }
                }
            }
            Change::Replace(d, vals) => match (find(&out, d), vals.is_empty()) {
                (Some(i), true) => {
                    out.remove(i);
                }
                (Some(i), false) => out[i].values = dedup(vals),
                (None, true) => {}
                (None, false) => out.push(Attribute {
                    desc: d.clone(),
                    values: dedup(vals),
                }),
            },
        }
    }
    Ok(out)
}

fn dedup(vals: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for v in vals {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

/// The attributes of an entry renamed from `old` to `new` (as the server
/// does it): the old RDN's values go when asked, the new RDN's values come
/// in unless an equal value is there. Shared like [`apply_changes`].
fn rename_attrs(
    schema: &Schema,
    attrs: &[Attribute],
    old: Option<&Rdn>,
    new: &Rdn,
    delete_old: bool,
) -> Vec<Attribute> {
    let norm = |attr: &str, v: &[u8]| {
        schema
            .attribute(attr)
            .and_then(|at| schema.normalize(at, v).ok())
            .unwrap_or_else(|| v.to_vec())
    };
    let mut out = attrs.to_vec();
    if let (true, Some(old)) = (delete_old, old) {
        for ava in &old.avas {
            let gone = norm(&ava.attr, &ava.value);
            for a in out
                .iter_mut()
                .filter(|a| a.desc.eq_ignore_ascii_case(&ava.attr))
            {
                a.values.retain(|v| norm(&ava.attr, v) != gone);
            }
        }
        out.retain(|a| !a.values.is_empty());
    }
    for ava in &new.avas {
        let want = norm(&ava.attr, &ava.value);
        match out
            .iter_mut()
            .find(|a| a.desc.eq_ignore_ascii_case(&ava.attr))
        {
            Some(a) => {
                if !a.values.iter().any(|v| norm(&ava.attr, v) == want) {
                    a.values.push(ava.value.clone());
                }
            }
            None => out.push(Attribute {
                desc: ava.attr.clone(),
                values: vec![ava.value.clone()],
            }),
        }
    }
    out
}

/// Attributes in a comparable form: sorted by description, values sorted.
fn canonical(attrs: &[Attribute]) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut out: Vec<(String, Vec<Vec<u8>>)> = attrs
        .iter()
        .map(|a| {
            let mut v = a.values.clone();
            v.sort();
            (a.desc.clone(), v)
        })
        .collect();
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// The write jobs: what runs on the writer thread.

fn resolve(view: &View<'_>, dn: &Dn) -> Result<Option<EntryId>, StoreError> {
    match view.lookup(dn)?.expect("generated DNs normalise") {
        Lookup::Found(id) => Ok(Some(id)),
        Lookup::Missing { .. } => Ok(None),
    }
}

/// The store's refusal of an unchecked operation.
fn by_store(e: StoreError) -> JobErr {
    match e {
        StoreError::Corrupt(_) => JobErr::Refused(Refusal::ByStore),
        other => JobErr::Store(other),
    }
}

fn run_job(w: &mut WriteTxn<'_>, schema: &Schema, job: &Job) -> Result<Vec<EntryId>, JobErr> {
    let mut added = Vec::new();
    for op in &job.ops {
        if let Some(id) = run_op(w, schema, op)? {
            added.push(id);
        }
    }
    if job.abort {
        return Err(JobErr::Refused(Refusal::Aborted));
    }
    Ok(added)
}

/// A rename as the model's operation gives it: refused as the store's
/// callers refuse it when `checked`, else left to the store to refuse.
fn run_rename(
    w: &mut WriteTxn<'_>,
    schema: &Schema,
    target: &Dn,
    rdn: &Rdn,
    new_parent: Option<&Dn>,
    delete_old: bool,
    checked: bool,
) -> Result<Option<EntryId>, JobErr> {
    let refuse = |r| Err(JobErr::Refused(r));
    let view = w.view();
    let Some(id) = resolve(&view, target)? else {
        return refuse(Refusal::NoSuchObject);
    };
    if view.parent_of(id)?.is_none() {
        return refuse(Refusal::Suffix);
    }
    let parent_dn = match new_parent {
        Some(p) => (*p).clone(),
        None => target.parent().expect("a non-suffix DN has a parent"),
    };
    let Some(parent_id) = resolve(&view, &parent_dn)? else {
        return refuse(Refusal::NoParent);
    };
    if checked && view.is_within(parent_id, id)? {
        return refuse(Refusal::BelowItself);
    }
    if checked {
        if let Some(other) = resolve(&view, &parent_dn.child(rdn.clone()))? {
            if other != id {
                return refuse(Refusal::Exists);
            }
        }
    }
    let old = view.attrs(id)?.expect("a resolved entry has a record");
    let new = rename_attrs(schema, &old, target.rdn(), rdn, delete_old);
    let to = Placement {
        parent: parent_id,
        rdn: rdn.to_string(),
        norm_rdn: schema.normalize_rdn(rdn).expect("generated RDNs normalise"),
    };
    let renamed = w.rename(id, &to);
    if checked {
        renamed?
    } else {
        renamed.map_err(by_store)?
    }
    w.replace(id, &old, &new)?;
    Ok(None)
}

fn run_op(w: &mut WriteTxn<'_>, schema: &Schema, op: &Op) -> Result<Option<EntryId>, JobErr> {
    let refuse = |r| Err(JobErr::Refused(r));
    match op {
        Op::Add {
            parent,
            rdn,
            attrs,
            checked,
        } => {
            let view = w.view();
            if *checked && resolve(&view, &parent.child(rdn.clone()))?.is_some() {
                return refuse(Refusal::Exists);
            }
            let Some(parent_id) = resolve(&view, parent)? else {
                return refuse(Refusal::NoParent);
            };
            let place = Placement {
                parent: parent_id,
                rdn: rdn.to_string(),
                norm_rdn: schema.normalize_rdn(rdn).expect("generated RDNs normalise"),
            };
            let id = w.add(&place, attrs);
            Ok(Some(if *checked { id? } else { id.map_err(by_store)? }))
        }
        Op::Modify { target, changes } => {
            let view = w.view();
            let Some(id) = resolve(&view, target)? else {
                return refuse(Refusal::NoSuchObject);
            };
            let old = view.attrs(id)?.expect("a resolved entry has a record");
            let new = apply_changes(&old, changes).map_err(JobErr::Refused)?;
            w.replace(id, &old, &new)?;
            Ok(None)
        }
        Op::Rename {
            target,
            rdn,
            new_parent,
            delete_old,
            checked,
        } => run_rename(
            w,
            schema,
            target,
            rdn,
            new_parent.as_ref(),
            *delete_old,
            *checked,
        ),
        Op::Delete { target, checked } => {
            let view = w.view();
            let Some(id) = resolve(&view, target)? else {
                return refuse(Refusal::NoSuchObject);
            };
            if view.parent_of(id)?.is_none() {
                return refuse(Refusal::Suffix);
            }
            if *checked && view.has_children(id)? {
                return refuse(Refusal::NonLeaf);
            }
            let old = view.attrs(id)?.expect("a resolved entry has a record");
            let deleted = w.delete(id, &old);
            if *checked {
                deleted?
            } else {
                deleted.map_err(by_store)?
            }
            Ok(None)
        }
    }
}

// ---------------------------------------------------------------------------
// Driving a batch without an async runtime.

/// Wakes the driving thread (parked while jobs run).
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

type JobResult = Result<Vec<EntryId>, JobErr>;
type JobFuture<'s> = Pin<Box<dyn Future<Output = JobResult> + 's>>;

/// Poll every future once in order (each submits its job on its first poll,
/// so submission follows the vector's order), then until all are done.
fn block_on_all(mut futs: Vec<JobFuture<'_>>) -> Vec<JobResult> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut out: Vec<Option<JobResult>> = futs.iter().map(|_| None).collect();
    loop {
        for (f, slot) in futs.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                    *slot = Some(r);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().flatten().collect();
        }
        // A wake between the poll and here leaves the token: no lost wakeup.
        std::thread::park();
    }
}

// ---------------------------------------------------------------------------
// The harness: decode steps, run them on both sides, compare.

/// A planned job with what the model says of it.
struct Planned {
    job: Job,
    /// Serials of the entries its adds create, in order, or its refusal.
    expect: Result<Vec<u64>, Refusal>,
}

struct Harness<'s> {
    store: &'s Store,
    schema: Arc<Schema>,
    model: Model,
    /// Store ID of every entry the model ever held (serials are never reused).
    ids: HashMap<u64, EntryId>,
    next_serial: u64,
    /// Highest ID given out so far: IDs only grow.
    max_id: EntryId,
    /// An older read transaction and the model as it was then.
    snapshot: Option<(ReadTxn<'s>, Model)>,
    checks: usize,
    /// Every DN the model held after some step, as given: those gone (or
    /// not yet there, for an older snapshot) must not be found.
    known: BTreeMap<Key, String>,
    /// The steps so far, for the failure message.
    log: Vec<String>,
}

impl<'s> Harness<'s> {
    fn new(store: &'s Store, schema: Arc<Schema>) -> Harness<'s> {
        let attrs = vec![
            Attribute {
                desc: "objectClass".into(),
                values: vec![b"top".to_vec(), b"domain".to_vec()],
            },
            Attribute {
                desc: "dc".into(),
                values: vec![b"example".to_vec()],
            },
        ];
        let place = Placement {
            parent: 0,
            rdn: SUFFIX.into(),
            norm_rdn: SUFFIX.into(),
        };
        let stored = attrs.clone();
        let id = store
            .write_blocking(move |w| w.add(&place, &stored))
            .expect("add the suffix");
        let mut nodes = BTreeMap::new();
        nodes.insert(
            suffix_key(),
            Node {
                serial: 0,
                rdn: SUFFIX.into(),
                attrs,
            },
        );
        Harness {
            store,
            schema,
            model: Model { nodes },
            ids: HashMap::from([(0, id)]),
            next_serial: 1,
            max_id: id,
            snapshot: None,
            checks: 0,
            known: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    #[track_caller]
    fn fail(&self, what: String) -> ! {
        let from = self.log.len().saturating_sub(12);
        panic!(
            "store and model differ: {what}\nlast steps (of {}):\n{}",
            self.log.len(),
            self.log[from..].join("\n")
        );
    }

    /// One step per leading byte, taken mod 10: 0–5 a job of one
    /// operation, 6 a job of two to four, 7 a batch of two to five jobs,
    /// 8 a full comparison, 9 take a read snapshot or compare the one held.
    fn drive(&mut self, input: &mut Input<'_>) {
        for _ in 0..MAX_STEPS {
            if input.is_empty() {
                break;
            }
            match input.byte() % 10 {
                0..=5 => {
                    let p = self.plan(input, 1);
                    self.run_single(p);
                }
                6 => {
                    let n = 2 + input.byte() as usize % 3;
                    let p = self.plan(input, n);
                    self.run_single(p);
                }
                7 => {
                    let n = 2 + input.byte() as usize % (MAX_BATCH - 1);
                    self.run_batch(input, n);
                }
                8 => {
                    if self.checks < MAX_CHECKS {
                        self.checks += 1;
                        self.log.push("check".into());
                        self.check_now();
                    }
                }
                _ => self.toggle_snapshot(),
            }
            for k in self.model.nodes.keys() {
                if !self.known.contains_key(k) {
                    self.known.insert(k.clone(), self.model.given_dn(k));
                }
            }
        }
    }

    fn finish(&mut self) {
        self.log.push("final check".into());
        if let Some((txn, model)) = self.snapshot.take() {
            self.compare(&txn.view(), &model, "snapshot at the end");
        }
        self.check_now();
    }

    fn check_now(&self) {
        let r = self.store.read().expect("read transaction");
        self.compare(&r.view(), &self.model, "now");
    }

    /// Take a read snapshot, or compare the one held (after the writes
    /// since) with the model of its time and let it go.
    fn toggle_snapshot(&mut self) {
        match self.snapshot.take() {
            Some((txn, model)) => {
                self.log.push("compare snapshot".into());
                self.compare(&txn.view(), &model, "older snapshot");
            }
            None => {
                self.log.push("take snapshot".into());
                let txn = self.store.read().expect("read transaction");
                self.snapshot = Some((txn, self.model.clone()));
            }
        }
    }

    /// Decode one job of `n` operations against the model and predict it;
    /// the model is updated as if it ran.
    fn plan(&mut self, input: &mut Input<'_>, n: usize) -> Planned {
        let abort = input.byte().is_multiple_of(8);
        let mut work = self.model.clone();
        let mut ops = Vec::with_capacity(n);
        let mut serials = Vec::new();
        let mut refused = None;
        for _ in 0..n {
            let op = decode_op(input, &work);
            if refused.is_none() {
                match work.apply(&self.schema, &op, self.next_serial) {
                    Ok(Some(s)) => {
                        serials.push(s);
                        self.next_serial += 1;
                    }
                    Ok(None) => {}
                    Err(r) => refused = Some(r),
                }
            }
            ops.push(op);
        }
        let expect = match (refused, abort) {
            (Some(r), _) => Err(r),
            (None, true) => Err(Refusal::Aborted),
            (None, false) => {
                self.model = work;
                Ok(serials)
            }
        };
        let job = Job { ops, abort };
        self.log.push(format!("{job} => {expect:?}"));
        Planned { job, expect }
    }

    fn submit(&self, job: Job) -> JobFuture<'s> {
        let schema = self.schema.clone();
        Box::pin(
            self.store
                .write(move |w: &mut WriteTxn<'_>| run_job(w, &schema, &job)),
        )
    }

    fn run_single(&mut self, p: Planned) {
        let schema = self.schema.clone();
        let job = p.job.clone();
        let got = self
            .store
            .write_blocking(move |w: &mut WriteTxn<'_>| run_job(w, &schema, &job));
        self.settle(&p, got);
    }

    /// `n` jobs in one writer batch: a gate job holds the writer until all
    /// are queued, so it takes them together.
    fn run_batch(&mut self, input: &mut Input<'_>, n: usize) {
        self.log.push(format!("batch of {n}:"));
        let planned: Vec<Planned> = (0..n)
            .map(|_| {
                let ops = 1 + input.byte().is_multiple_of(4) as usize;
                self.plan(input, ops)
            })
            .collect();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let mut futs: Vec<JobFuture<'s>> = vec![Box::pin(self.store.write(
            move |_: &mut WriteTxn<'_>| -> JobResult {
                let _ = gate.recv();
                Ok(Vec::new())
            },
        ))];
        futs.extend(planned.iter().map(|p| self.submit(p.job.clone())));
        // Queue everything (the first poll submits), then let the gate go.
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut early = Vec::new();
        for f in futs.iter_mut() {
            early.push(f.as_mut().poll(&mut cx));
        }
        if early.iter().any(Poll::is_ready) {
            self.fail("a batched job finished before the gate opened".into());
        }
        let _ = open.send(());
        let results = block_on_all(futs);
        let mut results = results.into_iter();
        if let Some(Err(e)) = results.next() {
            self.fail(format!("the gate job failed: {e:?}"));
        }
        for (p, got) in planned.iter().zip(results) {
            self.settle(p, got);
        }
    }

    /// Compare a job's result with the prediction; record new IDs.
    fn settle(&mut self, p: &Planned, got: JobResult) {
        match (&p.expect, got) {
            (Ok(serials), Ok(ids)) if serials.len() == ids.len() => {
                for (s, id) in serials.iter().zip(ids) {
                    if id <= self.max_id {
                        self.fail(format!("new entry got ID {id}, not above {}", self.max_id));
                    }
                    self.max_id = id;
                    self.ids.insert(*s, id);
                }
            }
            (Err(want), Err(JobErr::Refused(r))) if *want == r => {}
            (want, Err(JobErr::Store(e))) => {
                self.fail(format!("{}: model says {want:?}, store failed: {e}", p.job))
            }
            (want, got) => self.fail(format!(
                "{}: model says {want:?}, store gave {got:?}",
                p.job
            )),
        }
    }

    fn id(&self, node: &Node) -> EntryId {
        match self.ids.get(&node.serial) {
            Some(&id) => id,
            None => self.fail(format!("no ID known for {node:?}")),
        }
    }

    /// Everything a reader sees through `view` must be what `model` holds.
    fn compare(&self, view: &View<'_>, model: &Model, when: &str) {
        let problems = view.verify().expect("verify runs");
        if !problems.is_empty() {
            self.fail(format!("{when}: verify found {problems:#?}"));
        }
        let count = view.entry_count().expect("count");
        if count != model.nodes.len() as u64 {
            self.fail(format!(
                "{when}: {count} entries stored, {} in the model",
                model.nodes.len()
            ));
        }
        let suffix_id = self.id(&model.nodes[&suffix_key()]);
        let roots = view.roots().expect("roots");
        if roots != vec![suffix_id] {
            self.fail(format!("{when}: roots {roots:?}, expected [{suffix_id}]"));
        }
        let all: BTreeSet<EntryId> = model.nodes.values().map(|n| self.id(n)).collect();
        let subtree: BTreeSet<EntryId> = view
            .subtree(suffix_id, u64::MAX)
            .expect("subtree")
            .expect("no limit")
            .iter()
            .collect();
        if subtree != all {
            self.fail(format!(
                "{when}: subtree of the suffix {subtree:?}, model {all:?}"
            ));
        }
        // Twice: the second pass answers lookups and DNs from the thread's
        // DN cache where the snapshot allows it.
        for _ in 0..2 {
            for (k, node) in &model.nodes {
                self.compare_entry(view, model, k, node, when);
            }
        }
        self.compare_missing(view, model, when);
        self.compare_indexes(view, model, when);
    }

    fn compare_entry(&self, view: &View<'_>, model: &Model, k: &Key, node: &Node, when: &str) {
        let id = self.id(node);
        let dn = model.given_dn(k);
        let parsed = Dn::parse(&dn).expect("generated DNs parse");
        let found = view.lookup(&parsed).expect("lookup").expect("normalises");
        if found != Lookup::Found(id) {
            self.fail(format!(
                "{when}: lookup of '{dn}' gave {found:?}, model has {id}"
            ));
        }
        let stored = view.dn_string(id).expect("dn_string");
        if stored != dn {
            self.fail(format!(
                "{when}: entry {id} has DN '{stored}', model '{dn}'"
            ));
        }
        let mut norm = k.clone();
        norm.reverse();
        let pair = view.dn_pair(id).expect("dn_pair");
        if pair != (dn.clone(), norm.join(",")) {
            self.fail(format!(
                "{when}: dn_pair of {id} is {pair:?}, model '{dn}' / {norm:?}"
            ));
        }
        let attrs = view.attrs(id).expect("attrs");
        if attrs.as_deref().map(canonical) != Some(canonical(&node.attrs)) {
            self.fail(format!(
                "{when}: '{dn}' holds [{}], model [{}]",
                show_attrs(attrs.as_deref().unwrap_or_default()),
                show_attrs(&node.attrs)
            ));
        }
        let parent = (k.len() > 2).then(|| self.id(&model.nodes[&k[..k.len() - 1]]));
        let place = view.placement(id).expect("placement");
        let want_place = Placement {
            parent: parent.unwrap_or(0),
            rdn: node.rdn.clone(),
            norm_rdn: if k.len() > 2 {
                k[k.len() - 1].clone()
            } else {
                norm.join(",")
            },
        };
        if place.as_ref() != Some(&want_place) {
            self.fail(format!(
                "{when}: placement of {id} {place:?}, model {want_place:?}"
            ));
        }
        if view.parent_of(id).expect("parent_of") != parent {
            self.fail(format!("{when}: parent_of({id}) is not {parent:?}"));
        }
        let kids: BTreeSet<EntryId> = model
            .children(k)
            .iter()
            .map(|c| self.id(&model.nodes[c]))
            .collect();
        let got: BTreeSet<EntryId> = view.children(id).expect("children").into_iter().collect();
        if got != kids
            || view.count_children(id).expect("count") != kids.len() as u64
            || view.has_children(id).expect("has_children") == kids.is_empty()
        {
            self.fail(format!(
                "{when}: children of '{dn}' {got:?}, model {kids:?}"
            ));
        }
        if let Some(p) = parent {
            if !view.is_within(id, p).expect("is_within")
                || view.is_within(p, id).expect("is_within")
            {
                self.fail(format!("{when}: is_within disagrees for {id} below {p}"));
            }
        }
    }

    /// DNs that are not there: Missing, naming the deepest existing ancestor.
    fn compare_missing(&self, view: &View<'_>, model: &Model, when: &str) {
        let expect_missing = |dn: &str, matched: &Node| {
            let id = self.id(matched);
            let parsed = Dn::parse(dn).expect("generated DNs parse");
            let got = view.lookup(&parsed).expect("lookup").expect("normalises");
            if got != (Lookup::Missing { matched: Some(id) }) {
                self.fail(format!(
                    "{when}: lookup of '{dn}' gave {got:?}, not missing below {id}"
                ));
            }
        };
        for (k, node) in model.nodes.iter().take(24) {
            let dn = model.given_dn(k);
            for extra in ["cn=zz,", "cn=zz,ou=zz,"] {
                expect_missing(&format!("{extra}{dn}"), node);
            }
        }
        // DNs renamed away, deleted, or (for an older snapshot) added since:
        // the deepest ancestor there is the matched entry.
        for (k, dn) in &self.known {
            if model.contains(k) {
                continue;
            }
            let ancestor = (2..k.len())
                .rev()
                .find_map(|l| model.nodes.get(&k[..l]))
                .expect("the suffix is always there");
            expect_missing(dn, ancestor);
        }
        let outside = Dn::parse("cn=a,dc=other").expect("parses");
        let got = view.lookup(&outside).expect("lookup").expect("normalises");
        if got != (Lookup::Missing { matched: None }) {
            self.fail(format!("{when}: a DN outside the suffix gave {got:?}"));
        }
    }

    /// Index candidates of a few filters are the model's matches (exactly
    /// where the index is exact, a superset where keys are cut).
    fn compare_indexes(&self, view: &View<'_>, model: &Model, when: &str) {
        let queries = index_queries(&self.schema);
        let everything = all_ids(self, model);
        for (text, exact, matches) in &queries {
            let f = Filter::parse(text).expect("query parses");
            let want: BTreeSet<EntryId> = model
                .nodes
                .values()
                .filter(|n| matches(n))
                .map(|n| self.id(n))
                .collect();
            let got: BTreeSet<EntryId> = match view.candidates(&f).expect("candidates") {
                Candidates::Ids(s) => s.iter().collect(),
                Candidates::All => self.fail(format!("{when}: {text} is unindexed")),
            };
            let ok = if *exact {
                got == want
            } else {
                got.is_superset(&want) && got.is_subset(&everything)
            };
            if !ok {
                self.fail(format!(
                    "{when}: candidates of {text} are {got:?}, model matches {want:?}"
                ));
            }
        }
        let cn_a = Filter::parse("(cn=a)").expect("parses");
        if view.candidates_exact(&cn_a).ok().map(|(_, e)| e) != Some(crate::plan::Exactness::Exact)
        {
            self.fail("(cn=a) should be answered by the index alone".into());
        }
    }
}

/// A query the indexes answer, whether they answer it exactly, and which
/// model entries match it.
type Test<'a> = Box<dyn Fn(&Node) -> bool + 'a>;

/// The filters [`Harness::compare_indexes`] asks the indexes, each with
/// whether the index answers it exactly and the model's own test.
fn index_queries(schema: &Schema) -> Vec<(String, bool, Test<'_>)> {
    let cn = schema.attribute("cn").expect("cn in the schema");
    let cn_norm = move |n: &Node| -> Vec<Vec<u8>> {
        n.attrs
            .iter()
            .filter(|a| pando_model::desc::base(&a.desc).eq_ignore_ascii_case("cn"))
            .flat_map(|a| a.values.iter())
            .filter_map(|v| schema.normalize(cn, v).ok())
            .collect()
    };
    let uids = |n: &Node| -> Vec<i64> {
        n.attrs
            .iter()
            .filter(|a| a.desc.eq_ignore_ascii_case("uidNumber"))
            .flat_map(|a| a.values.iter())
            .filter_map(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .collect()
    };
    let long = cn_values()[14].clone();
    let eq = move |v: &'static str| -> Test<'_> {
        let want = schema.normalize(cn, v.as_bytes()).expect("normalises");
        Box::new(move |n: &Node| cn_norm(n).contains(&want))
    };
    vec![
        ("(cn=a)".into(), true, eq("a")),
        ("(cn=AB)".into(), true, eq("ab")),
        ("(cn=abc)".into(), true, eq("abc")),
        ("(cn=ca)".into(), true, eq("ca")),
        ("(cn=zz)".into(), true, eq("zz")),
        (
            format!("(cn={})", String::from_utf8_lossy(&long)),
            false,
            Box::new(move |n: &Node| cn_norm(n).contains(&long)),
        ),
        (
            "(cn=ab*)".into(),
            true,
            Box::new(move |n: &Node| cn_norm(n).iter().any(|v| v.starts_with(b"ab"))),
        ),
        (
            "(cn=*ab)".into(),
            true,
            Box::new(move |n: &Node| cn_norm(n).iter().any(|v| v.ends_with(b"ab"))),
        ),
        (
            "(cn=*abc*)".into(),
            true,
            Box::new(move |n: &Node| cn_norm(n).iter().any(|v| v.windows(3).any(|w| w == b"abc"))),
        ),
        (
            "(cn=*bab*)".into(),
            true,
            Box::new(move |n: &Node| cn_norm(n).iter().any(|v| v.windows(3).any(|w| w == b"bab"))),
        ),
        (
            "(cn=*)".into(),
            true,
            Box::new(move |n: &Node| !cn_norm(n).is_empty()),
        ),
        (
            "(uidNumber=3)".into(),
            true,
            Box::new(move |n: &Node| uids(n).contains(&3)),
        ),
        (
            "(uidNumber=-2)".into(),
            true,
            Box::new(move |n: &Node| uids(n).contains(&-2)),
        ),
        (
            "(uidNumber>=3)".into(),
            true,
            Box::new(move |n: &Node| uids(n).iter().any(|&u| u >= 3)),
        ),
        (
            "(uidNumber<=0)".into(),
            true,
            Box::new(move |n: &Node| uids(n).iter().any(|&u| u <= 0)),
        ),
        (
            "(uidNumber>=-5)".into(),
            true,
            Box::new(move |n: &Node| uids(n).iter().any(|&u| u >= -5)),
        ),
    ]
}

fn all_ids(h: &Harness<'_>, model: &Model) -> BTreeSet<EntryId> {
    model.nodes.values().map(|n| h.id(n)).collect()
}

// ---------------------------------------------------------------------------
// Decoding operations.

/// An RDN from a name space of 16 normalised RDNs (`cn` or `ou`, eight
/// values), written in either case; one byte in four adds `+sn=<value>`
/// (a multi-valued RDN, its own name).
fn decode_rdn(input: &mut Input<'_>) -> Rdn {
    let b = input.byte();
    let value = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"][(b & 7) as usize];
    let value = if b & 16 != 0 {
        value.to_ascii_uppercase()
    } else {
        value.to_vec()
    };
    let attr = match (b & 8 != 0, b & 32 != 0) {
        (false, false) => "cn",
        (false, true) => "CN",
        (true, false) => "ou",
        (true, true) => "OU",
    };
    let v = String::from_utf8(value).expect("ASCII");
    let text = if b & 0xC0 == 0xC0 {
        format!("{attr}={v}+sn={v}")
    } else {
        format!("{attr}={v}")
    };
    Rdn::parse(&text).expect("generated RDNs parse")
}

/// A DN: mostly an entry of the model (written as stored), sometimes a
/// path of one to three RDNs below the suffix, which mostly does not exist.
fn decode_dn(input: &mut Input<'_>, model: &Model, with_suffix: bool) -> Dn {
    let b = input.byte();
    let keys: Vec<&Key> = model
        .nodes
        .keys()
        .filter(|k| with_suffix || k.len() > 2)
        .collect();
    if b < 200 && !keys.is_empty() {
        let k = keys[b as usize % keys.len()];
        return Dn::parse(&model.given_dn(k)).expect("model DNs parse");
    }
    let mut dn = Dn::parse(SUFFIX).expect("suffix parses");
    for _ in 0..1 + b % 3 {
        dn = dn.child(decode_rdn(input));
    }
    dn
}

fn decode_values(input: &mut Input<'_>, desc: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let b = input.byte();
            match pando_model::desc::base(desc).to_ascii_lowercase().as_str() {
                "uidnumber" => UID_VALUES[b as usize % UID_VALUES.len()]
                    .to_string()
                    .into_bytes(),
                // Long values are stored zstd-compressed.
                "description" if b.is_multiple_of(4) => {
                    "all work and no play ".repeat(20).into_bytes()
                }
                "description" => format!("d{}", b % 4).into_bytes(),
                "sn" => format!("s{}", b % 3).into_bytes(),
                _ => cn_values()[b as usize % 16].clone(),
            }
        })
        .collect()
}

fn decode_attrs(input: &mut Input<'_>) -> Vec<Attribute> {
    let mask = input.byte();
    let mut out = vec![Attribute {
        desc: "objectClass".into(),
        values: vec![b"top".to_vec(), input.pick(&CLASSES).as_bytes().to_vec()],
    }];
    for (bit, desc) in [
        (1, "cn"),
        (2, "cn;lang-x"),
        (4, "uidNumber"),
        (8, "description"),
        (16, "sn"),
    ] {
        if mask & bit != 0 {
            let n = 1 + input.byte() as usize % 3;
            let values = dedup(&decode_values(input, desc, n));
            out.push(Attribute {
                desc: desc.into(),
                values,
            });
        }
    }
    out
}

/// An operation: its first byte mod 8 picks add (0–2), modify (3), rename
/// (4–5) or delete (6–7); with bits 4 and 5 clear it is unchecked.
fn decode_op(input: &mut Input<'_>, model: &Model) -> Op {
    let b = input.byte();
    // Most operations make the checks the server makes; one in four
    // leaves the refusal to the store.
    let checked = b & 0x30 != 0;
    match b % 8 {
        // One add in four names an entry of the model again (in the case
        // it picks), so the DN is mostly taken.
        0..=2 if b & 0xC0 == 0 && model.nodes.len() > 1 => {
            let again = decode_dn(input, model, false);
            let upper = input.byte() & 1 != 0;
            let rdn = again.rdn().expect("below the suffix").to_string();
            let rdn = if upper {
                rdn.to_ascii_uppercase()
            } else {
                rdn.to_ascii_lowercase()
            };
            Op::Add {
                parent: again.parent().expect("below the suffix"),
                rdn: Rdn::parse(&rdn).expect("generated RDNs parse"),
                attrs: decode_attrs(input),
                checked,
            }
        }
        0..=2 => Op::Add {
            parent: decode_dn(input, model, true),
            rdn: decode_rdn(input),
            attrs: decode_attrs(input),
            checked,
        },
        3 => {
            let target = decode_dn(input, model, true);
            let n = 1 + input.byte() as usize % 3;
            let changes = (0..n)
                .map(|_| {
                    let kind = input.byte();
                    let desc = input.pick(&DESCS).to_string();
                    let nvals = input.byte() as usize % 3;
                    let vals = decode_values(input, &desc, nvals);
                    match kind % 4 {
                        0 => Change::Add(desc, vals),
                        1 => Change::Delete(desc, Some(vals)),
                        2 => Change::Delete(desc, None),
                        _ => Change::Replace(desc, vals),
                    }
                })
                .collect();
            Op::Modify { target, changes }
        }
        4 | 5 => {
            let target = decode_dn(input, model, false);
            let rdn = decode_rdn(input);
            let how = input.byte();
            let new_parent = (how & 1 != 0).then(|| decode_dn(input, model, true));
            Op::Rename {
                target,
                rdn,
                new_parent,
                delete_old: how & 2 != 0,
                checked,
            }
        }
        _ => Op::Delete {
            target: decode_dn(input, model, false),
            checked,
        },
    }
}

/// A scratch directory for one fuzzing process (`label` names the target),
/// on tmpfs when there is one so the files never reach a disk.
pub fn scratch_dir(label: &str) -> std::path::PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("pando-fuzz-{label}-{}", std::process::id()))
}

/// Hand a possibly damaged data file to every reading path a command takes:
/// the checks first, and LMDB only when they pass. Whatever the bytes, this
/// returns (an error or the entry count); it never crashes or hangs. Used
/// by the `store_file` fuzz target and the damaged-store tests.
pub fn read_damaged(base: &Path, bytes: &[u8]) -> Result<u64, StoreError> {
    // A new directory per call: a file rewritten under a path an earlier
    // call's environment still maps would be a different (and impossible
    // outside a test) kind of damage.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(n.to_string());
    let r = read_damaged_in(&dir, bytes);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn read_damaged_in(dir: &Path, bytes: &[u8]) -> Result<u64, StoreError> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(crate::DATA_FILE), bytes)?;
    if !crate::preflight(dir, false, true)? {
        return Ok(0);
    }
    let store = crate::Store::open_read_only(dir, Arc::new(Schema::standard()), &options())?;
    let n = {
        let r = store.read()?;
        let v = r.view();
        let _ = v.verify()?;
        v.entry_count()?
    };
    store.close();
    Ok(n)
}
