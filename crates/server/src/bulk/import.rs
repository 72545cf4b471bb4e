//! `pando import`: one pass over the LDIF, on every core.
//!
//! ```text
//! input ──cut──▶ chunks ──▶ workers (parse, schema check, normalise,
//!                            encode + compress, index keys)
//!                                │ results tagged with the chunk number
//!                                ▼
//!                 this thread: reorder, place under the parent, store
//!                 (append mode), index keys into sorted runs
//!                                │ end of input
//!                                ▼
//!                 merge the runs once, write every posting list once
//! ```
//!
//! Entries get IDs in input order. A child that comes before its parent
//! waits (bounded) until the parent arrives; one whose parent never comes
//! is reported with its line. The store carries an "import in progress"
//! mark from the first write until everything, indexes included, is
//! committed and synced: an interrupted import leaves a store the server
//! refuses to open, never one that looks complete.
//!
//! Compression: unless the store already has a dictionary, the first
//! entries are held back, a zstd dictionary is trained on them and kept in
//! the store, and from then on the workers compress with it.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use pando_ldif::{LdifReader, ReaderOptions, Record};
use pando_model::{Attribute, Dn, Entry, Schema};
use pando_store::bulk::{BulkLoad, BulkOptions};
use pando_store::entry_codec::{self, Dict};
use pando_store::{Durability, EntryId, Lookup, Placement, Store, StoreError, WriteTxn};

use super::input::{self, Chunk};
use super::META_IMPORTING;
use pando_store::clock::{generalized_time, now_micros, CsnClock};

/// Bytes of input per chunk handed to a worker.
const CHUNK_BYTES: usize = 512 << 10;
/// Entries a dictionary is trained on (fewer when the input is smaller):
/// held, not yet written, until it is trained. 15,000 entries of the
/// benchmark's users and a 64 KiB dictionary compress the entries 7% better
/// than the 5,000 and 32 KiB of before; 30,000 gained 1% more but the
/// training and the held entries' compression, while the import waits,
/// cost 4 s of a 1M import (docs/performance.md, issue 39 ninth part).
const DICT_SAMPLES: usize = 15_000;
/// Largest dictionary trained. Trained on records from all over the file,
/// 256 KiB compressed the users of a 10M import 2% better than 64 KiB
/// (docs/performance.md, issue 39 twelfth part).
const DICT_BYTES: usize = 256 << 10;
/// Places of a plain input file the dictionary's samples are read from,
/// and the bytes read at each (about `DICT_SAMPLES` records of 640
/// bytes in all).
const SPREAD_PIECES: usize = 100;
const SPREAD_BYTES: usize = 96 << 10;
/// Normalised DNs remembered to find parents without a dn2id walk.
const PARENT_CACHE: usize = 100_000;

#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub continue_on_error: bool,
    /// Creator recorded in creatorsName/modifiersName when the input has none.
    pub creator: String,
    /// Memory for buffered index keys (bytes); more is spilled to sorted runs.
    pub memory: usize,
    /// Parsing/checking threads.
    pub threads: usize,
    /// Entries per write transaction.
    pub commit_every: usize,
    pub allow_file_urls: bool,
    /// The server ID in the CSNs given to entries without one.
    pub server_id: u16,
    /// The memberof overlay, when configured: memberOf is set on every
    /// imported member before the store is declared complete.
    pub member_of: Option<pando_overlays::memberof::MemberOf>,
    /// The input's file when it is one (not a pipe): a dictionary is then
    /// trained on records read from all over it before the import starts,
    /// rather than on the first ones held back.
    pub sample_file: Option<std::path::PathBuf>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            continue_on_error: false,
            creator: String::new(),
            memory: 512 << 20,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            commit_every: 20_000,
            allow_file_urls: false,
            server_id: 0,
            member_of: None,
            sample_file: None,
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct ImportReport {
    pub entries: u64,
    pub rejected: u64,
    pub secs: f64,
    /// Bytes read from the input file (compressed size for compressed input).
    pub bytes_read: u64,
    /// Index keys sorted, and the sorted runs spilled to disk for them.
    pub index_keys: u64,
    pub spilled_runs: usize,
    /// Dictionary trained by this import (ID), if any.
    pub dictionary: Option<u32>,
    pub input_format: &'static str,
    /// userPassword values by scheme (as `password::describe` names them).
    pub password_schemes: std::collections::BTreeMap<String, SchemeCount>,
    /// Entries given memberOf (with the memberof overlay configured).
    pub member_of: u64,
}

/// How many userPassword values an import held in one scheme.
#[derive(Debug, Default, Clone, Copy)]
pub struct SchemeCount {
    pub values: u64,
    /// This server can verify them (a known scheme within the cost caps).
    pub verifiable: bool,
    /// Weak or legacy (clear text, unsalted digests, MD5 or SHA-1):
    /// rewritten at the user's next bind under `upgrade_on_bind`.
    pub legacy: bool,
}

/// The scheme of each userPassword value of an entry with `attrs`, for
/// the reports of `pando import` and `pando migrate --data`.
pub fn password_schemes(attrs: &[Attribute]) -> Vec<(String, SchemeCount)> {
    crate::ops::password_values(attrs)
        .iter()
        .map(|v| {
            let (name, verifiable) = pando_password::describe(v);
            let legacy = pando_password::strength(v) <= pando_password::Strength::WeakSalted;
            let one = SchemeCount {
                values: 1,
                verifiable,
                legacy,
            };
            (name, one)
        })
        .collect()
}

/// One rejected record: where it was and why.
#[derive(Debug, Clone)]
pub struct Reject {
    pub line: u64,
    pub dn: String,
    pub reason: String,
}

/// What the import is doing, for progress displays.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// Entries stored so far and input bytes read.
    Loading { entries: u64, bytes: u64 },
    /// Index keys merged so far, of `total`.
    Indexing { done: u64, total: u64 },
}

/// Error out of the import, naming the input line, and saying what became
/// of the store.
#[derive(Debug)]
pub struct ImportError {
    pub message: String,
    /// Writing to the store failed: what the import stored may lack its
    /// index keys. False for a problem of the input.
    pub from_store: bool,
}

impl ImportError {
    /// A problem of the input (its bytes, a record, the order of records).
    fn input(message: String) -> ImportError {
        ImportError {
            message,
            from_store: false,
        }
    }
}

impl From<StoreError> for ImportError {
    fn from(e: StoreError) -> Self {
        ImportError {
            message: e.to_string(),
            from_store: true,
        }
    }
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A parsed, checked entry ready to store.
struct Ready {
    line: u64,
    dn: String,
    norm_dn: String,
    /// Normalised RDNs, most specific first.
    norm_rdns: Vec<String>,
    /// Suffix entries hang under ID 0.
    is_suffix: bool,
    rdn: String,
    /// The encoded record; empty while `attrs` still has to be encoded
    /// (entries read before the dictionary existed).
    record: Vec<u8>,
    attrs: Vec<Attribute>,
    keys: Vec<u8>,
    csn: Option<Vec<u8>>,
    /// The schemes of its userPassword values, for the report.
    schemes: Vec<(String, SchemeCount)>,
}

impl Ready {
    /// The parent's normalised DN (not for suffix entries; read before the
    /// first RDN is taken for storing).
    fn parent_norm(&self) -> &str {
        &self.norm_dn[self.norm_rdns[0].len() + 1..]
    }
}

/// What a worker makes of one record.
enum Item {
    Ready(Box<Ready>),
    Reject(Reject),
}

/// Everything the workers share.
struct Shared<'a> {
    store: &'a Store,
    schema: Arc<Schema>,
    csn: CsnClock,
    opts: &'a ImportOptions,
    suffixes: &'a [String],
    /// Set once a dictionary exists; workers compress with it from then on.
    dict: OnceLock<Arc<Dict>>,
    compress: bool,
}

fn prepare(
    sh: &Shared<'_>,
    line: u64,
    dn: &str,
    attrs: Vec<(String, Vec<u8>)>,
) -> Result<Ready, String> {
    let schema = &sh.schema;
    let parsed = Dn::parse(dn).map_err(|e| format!("invalid DN '{dn}': {e}"))?;
    if parsed.is_root() {
        return Err("the root DSE cannot be imported".into());
    }
    let norm_rdns = parsed
        .rdns
        .iter()
        .map(|r| schema.normalize_rdn(r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid DN '{dn}': {e}"))?;
    let norm_dn = norm_rdns.join(",");
    let is_suffix = sh.suffixes.contains(&norm_dn);
    let below = |s: &String| {
        norm_dn
            .strip_suffix(s.as_str())
            .is_some_and(|head| head.ends_with(','))
    };
    if !is_suffix && !sh.suffixes.iter().any(below) {
        return Err(format!("'{dn}' is outside every configured suffix"));
    }
    let rdn = if is_suffix {
        parsed.to_string()
    } else {
        parsed.rdn().map(|x| x.to_string()).unwrap_or_default()
    };
    let mut entry = Entry::new(parsed);
    for (a, v) in attrs {
        let base = pando_model::desc::base(&a);
        if crate::ops::COMPUTED
            .iter()
            .any(|c| c.eq_ignore_ascii_case(base))
        {
            continue;
        }
        entry.add_values(&a, vec![v]);
    }
    let structural = schema
        .check_entry(&mut entry)
        .map_err(|v| format!("{} ({})", v.message, v.code.name()))?;
    // Operational attributes from the input (slapcat, pando export) are
    // kept as they are; missing ones are generated.
    if entry.get("structuralObjectClass").is_none() {
        entry.add_values("structuralObjectClass", vec![structural.into_bytes()]);
    }
    let (now, csn) = (generalized_time(now_micros()), sh.csn.next());
    let stamps = crate::ops::write::Stamps {
        who: &sh.opts.creator,
        csn: &csn,
        now: &now,
    };
    stamps.put(&mut entry, true, |name, e| e.get(name).is_some());
    let csn = entry
        .get("entryCSN")
        .and_then(|a| a.values.first())
        .cloned();
    let schemes = password_schemes(&entry.attrs);
    let mut keys = Vec::new();
    sh.store.index_keys_packed(&entry.attrs, &mut keys);
    let mut record = Vec::new();
    let codec = sh.store.codec();
    let attrs = match (sh.compress, sh.dict.get()) {
        (false, _) => {
            codec.encode_with(&entry.attrs, None, &mut record);
            Vec::new()
        }
        (true, Some(d)) => {
            codec.encode_with(&entry.attrs, Some(d), &mut record);
            Vec::new()
        }
        (true, None) => entry.attrs,
    };
    Ok(Ready {
        line,
        dn: dn.to_string(),
        norm_dn,
        norm_rdns,
        is_suffix,
        rdn,
        record,
        attrs,
        keys,
        csn,
        schemes,
    })
}

/// Parse and check one chunk.
fn work(sh: &Shared<'_>, chunk: Chunk) -> (u64, Vec<Item>) {
    let (seq, lines_before, bytes) = match chunk {
        Chunk::Records {
            seq,
            lines_before,
            bytes,
        } => (seq, lines_before, bytes),
        Chunk::TooLarge { seq, line } => {
            let reason = format!(
                "record is larger than {} bytes (no blank line ends it in reach)",
                pando_ldif::DEFAULT_MAX_RECORD_BYTES
            );
            return (
                seq,
                vec![Item::Reject(Reject {
                    line,
                    dn: String::new(),
                    reason,
                })],
            );
        }
    };
    let opts = ReaderOptions {
        allow_file_urls: sh.opts.allow_file_urls,
        ..ReaderOptions::default()
    };
    let reader = if seq == 0 {
        LdifReader::new(&bytes[..], opts)
    } else {
        LdifReader::continuing(&bytes[..], opts, lines_before)
    };
    let mut out = Vec::new();
    for rec in reader {
        let item = match rec {
            Err(e) => Item::Reject(Reject {
                line: e.line,
                dn: String::new(),
                reason: e.message,
            }),
            Ok(Record::Change { line, dn, .. }) => Item::Reject(Reject {
                line,
                dn,
                reason: "change records are not imported (use ldapmodify)".into(),
            }),
            Ok(Record::Content { dn, attrs, line }) => match prepare(sh, line, &dn, attrs) {
                Ok(r) => Item::Ready(Box::new(r)),
                Err(reason) => Item::Reject(Reject { line, dn, reason }),
            },
        };
        out.push(item);
    }
    (seq, out)
}

/// The storing side: places entries in input order.
struct Loader<'s, 'r> {
    load: BulkLoad<'s>,
    shared: &'r Shared<'r>,
    origin: &'r str,
    parents: HashMap<String, EntryId>,
    /// Children whose parent has not appeared yet, by the parent's normalised DN.
    orphans: HashMap<String, Vec<Ready>>,
    orphan_count: usize,
    orphan_limit: usize,
    /// Entries held back until the dictionary is trained.
    held: Vec<Ready>,
    dict_pending: bool,
    report: ImportReport,
    /// The newest entryCSN loaded, per server ID.
    newest_csn: std::collections::BTreeMap<u16, Vec<u8>>,
    rejects_out: &'r mut dyn FnMut(&Reject),
}

impl Loader<'_, '_> {
    fn reject(&mut self, r: Reject) -> Result<(), ImportError> {
        if !self.shared.opts.continue_on_error {
            let dn = if r.dn.is_empty() {
                String::new()
            } else {
                format!("{}: ", r.dn)
            };
            return Err(ImportError::input(format!(
                "{}:{}: {dn}{}",
                self.origin, r.line, r.reason
            )));
        }
        self.report.rejected += 1;
        (self.rejects_out)(&r);
        Ok(())
    }

    fn item(&mut self, item: Item) -> Result<(), ImportError> {
        match item {
            Item::Reject(r) => self.reject(r),
            Item::Ready(r) if self.dict_pending => {
                self.held.push(*r);
                if self.held.len() >= DICT_SAMPLES {
                    self.train()?;
                }
                Ok(())
            }
            Item::Ready(r) => self.place(*r),
        }
    }

    /// Train the dictionary on the held entries, then store them.
    fn train(&mut self) -> Result<(), ImportError> {
        let samples: Vec<Vec<u8>> = self
            .held
            .iter()
            .map(|r| entry_codec::body_of(&r.attrs))
            .collect();
        self.install(&samples)?;
        for r in std::mem::take(&mut self.held) {
            self.place(r)?;
        }
        Ok(())
    }

    /// Train the dictionary on records read from all over `path` before
    /// the first entry is stored. Nothing happens when the file gives too
    /// few (small or compressed): the first entries are held instead.
    fn train_on_spread(&mut self, path: &std::path::Path) -> Result<(), ImportError> {
        let pieces = input::spread(path, SPREAD_PIECES, SPREAD_BYTES)
            .map_err(|e| ImportError::input(format!("{}: {e}", path.display())))?;
        let per_piece = DICT_SAMPLES.div_ceil(SPREAD_PIECES);
        let opts = ReaderOptions {
            allow_file_urls: self.shared.opts.allow_file_urls,
            ..ReaderOptions::default()
        };
        let mut samples = Vec::with_capacity(DICT_SAMPLES);
        for piece in &pieces {
            let records = LdifReader::continuing(&piece[..], opts.clone(), 0);
            // Records the import will reject are no samples; it reports them.
            let ready = records.filter_map(|rec| match rec {
                Ok(Record::Content { dn, attrs, line }) => {
                    prepare(self.shared, line, &dn, attrs).ok()
                }
                _ => None,
            });
            samples.extend(
                ready
                    .take(per_piece)
                    .map(|r| entry_codec::body_of(&r.attrs)),
            );
        }
        if samples.len() >= DICT_SAMPLES / 2 {
            self.install(&samples)?;
        }
        Ok(())
    }

    /// Train a dictionary on `samples`, keep it in the store and compress
    /// with it from now on (without one when zstd could not train one).
    fn install(&mut self, samples: &[Vec<u8>]) -> Result<(), ImportError> {
        self.dict_pending = false;
        if let Some(bytes) = entry_codec::train(samples, DICT_BYTES) {
            let d = self.load.install_dict(bytes)?;
            self.report.dictionary = Some(d.id);
            let _ = self.shared.dict.set(d);
        }
        Ok(())
    }

    fn parent_of(&mut self, r: &Ready) -> Result<Option<EntryId>, ImportError> {
        if r.is_suffix {
            return Ok(Some(0));
        }
        let parent_norm = r.parent_norm();
        if let Some(&id) = self.parents.get(parent_norm) {
            return Ok(Some(id));
        }
        match self.load.lookup_norm(&r.norm_rdns[1..])? {
            Lookup::Found(id) => {
                self.remember(parent_norm.to_string(), id);
                Ok(Some(id))
            }
            Lookup::Missing { .. } => Ok(None),
        }
    }

    fn remember(&mut self, norm_dn: String, id: EntryId) {
        if self.parents.len() >= PARENT_CACHE {
            self.parents.clear();
        }
        self.parents.insert(norm_dn, id);
    }

    /// Store `r` under its parent, or park it until the parent comes.
    fn place(&mut self, r: Ready) -> Result<(), ImportError> {
        let mut stack = vec![r];
        while let Some(mut r) = stack.pop() {
            let Some(parent) = self.parent_of(&r)? else {
                if self.orphan_count >= self.orphan_limit {
                    return Err(ImportError::input(format!(
                        "{}:{}: parent of '{}' has not appeared, and {} entries already wait for theirs: sort the LDIF parents first",
                        self.origin, r.line, r.dn, self.orphan_count
                    )));
                }
                let parent_norm = r.parent_norm().to_string();
                self.orphans.entry(parent_norm).or_default().push(r);
                self.orphan_count += 1;
                continue;
            };
            if r.record.is_empty() {
                let dict = self.shared.dict.get().map(|d| &**d);
                self.shared
                    .store
                    .codec()
                    .encode_with(&r.attrs, dict, &mut r.record);
            }
            let place = Placement {
                parent,
                rdn: std::mem::take(&mut r.rdn),
                norm_rdn: if r.is_suffix {
                    r.norm_dn.clone()
                } else {
                    std::mem::take(&mut r.norm_rdns[0])
                },
            };
            match self.load.add(&place, &r.record, &r.keys)? {
                Ok(id) => {
                    self.report.entries += 1;
                    for (scheme, one) in r.schemes.drain(..) {
                        self.report
                            .password_schemes
                            .entry(scheme)
                            .and_modify(|c| c.values += 1)
                            .or_insert(one);
                    }
                    if let Some(c) = r.csn.take() {
                        let sid = pando_store::csn_sid(&String::from_utf8_lossy(&c));
                        if let Some(sid) = sid {
                            let newest = self.newest_csn.entry(sid).or_default();
                            if c > *newest {
                                *newest = c;
                            }
                        }
                    }
                    if !self.orphans.is_empty() {
                        if let Some(kids) = self.orphans.remove(&r.norm_dn) {
                            self.orphan_count -= kids.len();
                            stack.extend(kids.into_iter().rev());
                        }
                    }
                    self.remember(std::mem::take(&mut r.norm_dn), id);
                }
                Err(_) => {
                    let reject = Reject {
                        line: r.line,
                        dn: r.dn.clone(),
                        reason: "an entry with this DN already exists".into(),
                    };
                    self.reject(reject)?;
                    // Its children (if parked) cannot be placed either.
                }
            }
        }
        Ok(())
    }

    /// Entries still waiting for a parent at the end: each is an error.
    fn orphans_left(&mut self) -> Result<(), ImportError> {
        let mut left: Vec<Ready> = self.orphans.drain().flat_map(|(_, v)| v).collect();
        left.sort_by_key(|r| r.line);
        for r in left {
            let reason = format!(
                "parent '{}' exists neither in the input nor in the store",
                r.parent_norm()
            );
            self.reject(Reject {
                line: r.line,
                dn: r.dn,
                reason,
            })?;
        }
        self.orphan_count = 0;
        Ok(())
    }
}

/// Import LDIF from `input` (a file's bytes, possibly gzip/zstd
/// compressed; `origin` names it in messages). An error says what became
/// of the store: marked incomplete (it is not served until imported again
/// or restored), or, for a problem of the input met while importing into
/// a store that held entries already, complete with what was stored
/// before the problem.
pub fn import(
    store: &Store,
    suffixes: &[String],
    input: Box<dyn Read + Send>,
    origin: &str,
    opts: &ImportOptions,
    rejects_out: &mut dyn FnMut(&Reject),
    on_progress: &mut dyn FnMut(Progress),
) -> Result<ImportReport, ImportError> {
    let had_entries = store.read()?.view().entry_count()? > 0;
    let run = Run {
        store,
        suffixes,
        origin,
        opts,
        had_entries,
    };
    import_marked(&run, input, rejects_out, on_progress).map_err(|e| {
        let advice = match (super::check_complete(store).is_ok(), had_entries) {
            (true, true) => {
                "import stopped there; the store held entries before this import, \
                 so it stays complete and can be served, holding them and the entries \
                 imported before the problem: fix the input and import the rest \
                 (with --continue-on-error, entries already stored are rejected as existing)"
            }
            (true, false) => "import stopped before storing anything; the store is as it was",
            (false, true) => {
                "import stopped: the store is marked incomplete and will not be served; \
                 restore a backup (pando restore), then import again"
            }
            (false, false) => {
                "import stopped: the store is marked incomplete and will not be served; \
                 import again into an empty data directory"
            }
        };
        ImportError {
            message: format!("{}\n{advice}", e.message),
            ..e
        }
    })
}

/// What one import works on.
struct Run<'a> {
    store: &'a Store,
    suffixes: &'a [String],
    origin: &'a str,
    opts: &'a ImportOptions,
    /// The store held entries when the import began.
    had_entries: bool,
}

/// [`import`] between marking the store incomplete and declaring it
/// complete again.
fn import_marked(
    run: &Run<'_>,
    input: Box<dyn Read + Send>,
    rejects_out: &mut dyn FnMut(&Reject),
    on_progress: &mut dyn FnMut(Progress),
) -> Result<ImportReport, ImportError> {
    let (store, origin, opts) = (run.store, run.origin, run.opts);
    let started = Instant::now();
    let bytes_read = Arc::new(AtomicU64::new(0));
    let counted = input::Counted {
        inner: input,
        bytes: bytes_read.clone(),
    };
    let (input, format) = input::decompressing(Box::new(counted))
        .map_err(|e| ImportError::input(format!("{origin}: {e}")))?;
    // Mark the store incomplete, and stop syncing, before the first entry.
    store.write_blocking(|w: &mut WriteTxn<'_>| w.meta_put(META_IMPORTING, b"1"))?;
    let previous = store.durability();
    store.set_durability(Durability::None);
    store.write_blocking(|_: &mut WriteTxn<'_>| Ok::<(), StoreError>(()))?;
    let spill_dir = store.path().join("import-runs");
    let _ = std::fs::remove_dir_all(&spill_dir);
    let shared = Shared {
        store,
        schema: store.schema().clone(),
        // Entries without an entryCSN get one after the store's newest.
        csn: pando_store::clock::clock_for_store(store, opts.server_id),
        opts,
        suffixes: run.suffixes,
        dict: OnceLock::new(),
        compress: store.codec().level().is_some(),
    };
    if let Some(d) = store.codec().current_dict() {
        let _ = shared.dict.set(d);
    }
    let load = store.bulk_load(&BulkOptions {
        memory: opts.memory,
        spill_dir,
        commit_every: opts.commit_every,
    })?;
    let mut loader = Loader {
        load,
        shared: &shared,
        origin,
        parents: HashMap::new(),
        orphans: HashMap::new(),
        orphan_count: 0,
        orphan_limit: (opts.memory / 4096).max(10_000),
        held: Vec::new(),
        dict_pending: shared.compress && shared.dict.get().is_none(),
        report: ImportReport {
            input_format: format,
            ..ImportReport::default()
        },
        newest_csn: Default::default(),
        rejects_out,
    };
    let mut stopped = load_all(&mut loader, input, &bytes_read, on_progress).err();
    // A problem of the input must not take a store that held entries out
    // of service: what came before it is stored (the entries held back for
    // the dictionary too) and indexed, and the store declared complete.
    let kept =
        |e: &Option<ImportError>| run.had_entries && e.as_ref().is_some_and(|e| !e.from_store);
    if kept(&stopped) && !loader.held.is_empty() {
        if let Err(e) = loader.train() {
            stopped = Some(e);
        }
    }
    let Loader {
        load,
        mut report,
        newest_csn,
        ..
    } = loader;
    if !kept(&stopped) {
        if let Some(e) = stopped {
            drop(load);
            store.set_durability(previous);
            return Err(e);
        }
    }
    let figures = load.finish(&mut |done, total| on_progress(Progress::Indexing { done, total }));
    store.set_durability(previous);
    let figures = figures?;
    debug_assert_eq!(figures.entries, report.entries);
    report.index_keys = figures.index_triples;
    report.spilled_runs = figures.spilled_runs;
    if let Some(m) = &opts.member_of {
        report.member_of = set_member_of(store, m)?;
    }
    declare_complete(store, newest_csn)?;
    match stopped {
        Some(e) => Err(e),
        None => {
            report.bytes_read = bytes_read.load(Ordering::Relaxed);
            report.secs = started.elapsed().as_secs_f64();
            Ok(report)
        }
    }
}

/// Every entry of `input` stored, with a dictionary trained first from
/// the input file when there is one, or else on the first entries.
fn load_all(
    loader: &mut Loader<'_, '_>,
    input: Box<dyn Read + Send>,
    bytes_read: &AtomicU64,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<(), ImportError> {
    let opts = loader.shared.opts;
    if let (true, Some(path)) = (loader.dict_pending, &opts.sample_file) {
        loader.train_on_spread(path)?;
    }
    let threads = opts.threads.max(1);
    run_workers(loader, input, threads, bytes_read, on_progress)?;
    if loader.dict_pending {
        loader.train()?;
    }
    loader.orphans_left()
}

/// Read `input` in chunks on one thread, parse and check them on
/// `threads` workers, and store the results in input order (`drain`) on
/// this one.
fn run_workers(
    loader: &mut Loader<'_, '_>,
    mut input: Box<dyn Read + Send>,
    threads: usize,
    bytes_read: &AtomicU64,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<(), ImportError> {
    let origin = loader.origin;
    std::thread::scope(|s| -> Result<(), ImportError> {
        let (chunk_tx, chunk_rx) = sync_channel::<Chunk>(threads * 2);
        let (done_tx, done_rx) = sync_channel::<(u64, Vec<Item>)>(threads * 2);
        let reader = s.spawn(move || {
            input::cut(
                &mut input,
                CHUNK_BYTES,
                pando_ldif::DEFAULT_MAX_RECORD_BYTES,
                &mut |c| chunk_tx.send(c).is_ok(),
            )
        });
        let chunk_rx = Arc::new(Mutex::new(chunk_rx));
        for _ in 0..threads {
            let rx = chunk_rx.clone();
            let tx = done_tx.clone();
            let sh = loader.shared;
            s.spawn(move || loop {
                let next = rx.lock().map(|r| r.recv());
                let Ok(Ok(chunk)) = next else { break };
                if tx.send(work(sh, chunk)).is_err() {
                    break;
                }
            });
        }
        // Only the workers hold the chunk queue now: once they stop, the
        // reader's next send fails and it ends too.
        drop(chunk_rx);
        drop(done_tx);
        let outcome = drain(loader, done_rx, bytes_read, on_progress);
        // Whatever happened, the reader ends: `drain` dropped the result
        // queue, so the workers stop, and with them the chunk queue.
        match reader.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) if outcome.is_ok() => {
                return Err(ImportError::input(format!("{origin}: read error: {e}")))
            }
            _ => {}
        }
        outcome
    })
}

/// The memberof overlay's upkeep, as part of the import: every entry a
/// group lists gets memberOf naming exactly those groups (what the
/// overlay would have set had each entry been added over LDAP; the same
/// computation `pando memberof rebuild` and `pando verify` use). Written
/// before the store is declared complete, so it is imported state, not a
/// change: no change log record, no new CSN. Returns the entries changed.
fn set_member_of(
    store: &Store,
    m: &pando_overlays::memberof::MemberOf,
) -> Result<u64, ImportError> {
    let schema = store.schema().clone();
    let todo = {
        let rtxn = store.read()?;
        m.disagreements(&schema, &rtxn.view())?
    };
    let attr = m.attribute().to_string();
    for batch in todo.chunks(1_000) {
        let attr = attr.clone();
        let batch: Vec<(String, Vec<String>)> = batch
            .iter()
            .map(|d| (d.dn.clone(), d.expected.clone()))
            .collect();
        store.write_blocking(move |w: &mut WriteTxn<'_>| -> Result<(), ImportError> {
            for (dn, groups) in &batch {
                let parsed = Dn::parse(dn).map_err(|e| ImportError::input(format!("{dn}: {e}")))?;
                let view = w.view();
                let rdns = view.normalize_rdns(&parsed).map_err(ImportError::input)?;
                let Lookup::Found(id) = view.lookup_norm(&rdns)? else {
                    continue;
                };
                let Some(old) = view.attrs(id)? else {
                    continue;
                };
                let mut new: Vec<Attribute> = old
                    .iter()
                    .filter(|a| !pando_model::desc::base(&a.desc).eq_ignore_ascii_case(&attr))
                    .cloned()
                    .collect();
                if !groups.is_empty() {
                    new.push(Attribute {
                        desc: attr.clone(),
                        values: groups.iter().map(|g| g.as_bytes().to_vec()).collect(),
                    });
                }
                w.replace(id, &old, &new)?;
            }
            Ok(())
        })?;
    }
    Ok(todo.len() as u64)
}

/// Everything is in: one synced commit declares the store complete,
/// with the imported entries' CSNs per server (the change log covers
/// only what comes after them).
fn declare_complete(
    store: &Store,
    newest_csn: std::collections::BTreeMap<u16, Vec<u8>>,
) -> Result<(), ImportError> {
    store.write_blocking(move |w: &mut WriteTxn<'_>| -> Result<(), StoreError> {
        for csn in newest_csn.values() {
            w.advance_context_csn(&String::from_utf8_lossy(csn))?;
        }
        if let Some(newest) = w.view().newest_csn()? {
            w.raise_changelog_floor(&newest)?;
        }
        w.count_unlogged_write()?;
        w.meta_delete(META_IMPORTING)
    })?;
    Ok(())
}

/// Take the workers' results in input order and store them.
fn drain(
    loader: &mut Loader<'_, '_>,
    done_rx: Receiver<(u64, Vec<Item>)>,
    bytes_read: &AtomicU64,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<(), ImportError> {
    let mut waiting: BTreeMap<u64, Vec<Item>> = BTreeMap::new();
    let mut next = 0u64;
    let mut last_report = 0u64;
    for (seq, items) in done_rx.iter() {
        waiting.insert(seq, items);
        while let Some(items) = waiting.remove(&next) {
            next += 1;
            for item in items {
                loader.item(item)?;
            }
            let n = loader.report.entries;
            if n - last_report >= 2_000 {
                last_report = n;
                on_progress(Progress::Loading {
                    entries: n,
                    bytes: bytes_read.load(Ordering::Relaxed),
                });
            }
        }
    }
    on_progress(Progress::Loading {
        entries: loader.report.entries,
        bytes: bytes_read.load(Ordering::Relaxed),
    });
    Ok(())
}
