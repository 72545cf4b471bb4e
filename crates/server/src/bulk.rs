//! Offline bulk load (`pando import`) and LDIF export (`pando export`).
//!
//! Import streams the LDIF once: each record is parsed, schema-checked like
//! an add (operational attributes from a slapcat/export are kept, missing
//! ones generated) and written in large transactions with durability off,
//! then the store is synced once. Memory stays bounded by the batch size
//! whatever the input size. A meta flag marks the store incomplete for the
//! whole run, so an interrupted import leaves a store the server refuses to
//! serve rather than one that looks valid.
//!
//! Export walks the tree parents-first inside one read transaction, so it
//! is consistent and works while the server runs.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use pando_ldif::{LdifReader, ReaderOptions, Record};
use pando_model::{Dn, Entry, Schema};
use pando_store::{
    Durability, EntryId, Lookup, PendingPostings, Placement, Store, StoreError, WriteTxn,
};

use crate::clock::{generalized_time, now_micros, CsnClock};

/// Meta key present while an import runs; its presence means "incomplete".
pub const META_IMPORTING: &str = "import_in_progress";

/// Computed on read; never stored.
const COMPUTED: &[&str] = &[
    "entryDN",
    "subschemaSubentry",
    "hasSubordinates",
    "numSubordinates",
];

#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub continue_on_error: bool,
    /// Entries per write transaction.
    pub batch: usize,
    /// Creator recorded in creatorsName/modifiersName when the input has none.
    pub creator: String,
}

#[derive(Debug, Default, Clone)]
pub struct ImportReport {
    pub entries: u64,
    pub rejected: u64,
    pub secs: f64,
    pub bytes_read: u64,
}

/// One rejected record: where it was and why.
#[derive(Debug, Clone)]
pub struct Reject {
    pub line: u64,
    pub dn: String,
    pub reason: String,
}

/// Error out of the import, naming the input line.
#[derive(Debug)]
pub struct ImportError(pub String);

impl From<StoreError> for ImportError {
    fn from(e: StoreError) -> Self {
        ImportError(e.to_string())
    }
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Fail if a previous import did not finish.
pub fn check_complete(store: &Store) -> Result<(), String> {
    let r = store.read().map_err(|e| e.to_string())?;
    if r.view()
        .meta_get(META_IMPORTING)
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Err(format!(
            "the store in {} is incomplete: an import was interrupted. Import again into an empty data directory, or restore a backup",
            store.path().display()
        ));
    }
    Ok(())
}

/// A parsed, checked entry ready to store.
struct Ready {
    line: u64,
    entry: Entry,
    norm_rdns: Vec<String>,
}

fn prepare(
    schema: &Schema,
    csn: &CsnClock,
    opts: &ImportOptions,
    line: u64,
    dn: &str,
    attrs: Vec<(String, Vec<u8>)>,
) -> Result<Ready, String> {
    let dn = Dn::parse(dn).map_err(|e| format!("invalid DN '{dn}': {e}"))?;
    if dn.is_root() {
        return Err("the root DSE cannot be imported".into());
    }
    let norm_rdns = dn
        .rdns
        .iter()
        .map(|r| schema.normalize_rdn(r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid DN '{dn}': {e}"))?;
    let mut entry = Entry::new(dn);
    for (a, v) in attrs {
        let base = a.split(';').next().unwrap_or("");
        if COMPUTED.iter().any(|c| c.eq_ignore_ascii_case(base)) {
            continue;
        }
        entry.add_values(&a, vec![v]);
    }
    let structural = schema
        .check_entry(&mut entry)
        .map_err(|v| format!("{} ({})", v.message, v.code.name()))?;
    // Operational attributes from the input (slapcat, pando export) are
    // kept as they are; missing ones are generated.
    let has = |e: &Entry, d: &str| e.get(d).is_some();
    let now = generalized_time(now_micros());
    let fill = |e: &mut Entry, d: &str, v: String| {
        if !has(e, d) {
            e.add_values(d, vec![v.into_bytes()]);
        }
    };
    fill(&mut entry, "structuralObjectClass", structural);
    fill(&mut entry, "entryUUID", crate::ops::write::random_uuid());
    fill(&mut entry, "entryCSN", csn.next());
    fill(&mut entry, "createTimestamp", now.clone());
    fill(&mut entry, "modifyTimestamp", now);
    fill(&mut entry, "creatorsName", opts.creator.clone());
    fill(&mut entry, "modifiersName", opts.creator.clone());
    Ok(Ready {
        line,
        entry,
        norm_rdns,
    })
}

/// Where `r` goes; Err names the order problem precisely.
fn place(w: &WriteTxn<'_>, suffixes: &[String], r: &Ready) -> Result<Placement, String> {
    let view = w.view();
    let norm_dn = r.norm_rdns.join(",");
    if let Lookup::Found(_) = view.lookup_norm(&r.norm_rdns).map_err(|e| e.to_string())? {
        return Err(format!("entry '{}' already exists", r.entry.dn));
    }
    if suffixes.contains(&norm_dn) {
        return Ok(Placement {
            parent: 0,
            rdn: r.entry.dn.to_string(),
            norm_rdn: norm_dn,
        });
    }
    if !suffixes.iter().any(|s| norm_dn.ends_with(&format!(",{s}"))) {
        return Err(format!(
            "'{}' is outside every configured suffix",
            r.entry.dn
        ));
    }
    match view
        .lookup_norm(&r.norm_rdns[1..])
        .map_err(|e| e.to_string())?
    {
        Lookup::Found(parent) => Ok(Placement {
            parent,
            rdn: r.entry.dn.rdn().map(|x| x.to_string()).unwrap_or_default(),
            norm_rdn: r.norm_rdns[0].clone(),
        }),
        Lookup::Missing { .. } => Err(format!(
            "parent '{}' of '{}' does not exist (yet): LDIF entries must follow their parent",
            r.entry
                .dn
                .parent()
                .map(|p| p.to_string())
                .unwrap_or_default(),
            r.entry.dn
        )),
    }
}

/// Write one batch in one transaction. Returns the rejects of the batch
/// (only with `continue_on_error`; otherwise the first problem is an error).
fn write_batch(
    store: &Store,
    suffixes: Arc<Vec<String>>,
    batch: Vec<Ready>,
    keep_going: bool,
) -> Result<(u64, Vec<Reject>), ImportError> {
    store.write_blocking(
        move |w: &mut WriteTxn<'_>| -> Result<(u64, Vec<Reject>), ImportError> {
            let mut rejects = Vec::new();
            let mut added = 0;
            let mut pending = PendingPostings::default();
            for r in &batch {
                match place(w, &suffixes, r) {
                    Ok(p) => {
                        w.add_deferred(&p, &r.entry.attrs, &mut pending)?;
                        added += 1;
                    }
                    Err(reason) if keep_going => rejects.push(Reject {
                        line: r.line,
                        dn: r.entry.dn.to_string(),
                        reason,
                    }),
                    Err(reason) => return Err(ImportError(format!("{}: {reason}", r.line))),
                }
            }
            w.apply_postings(pending)?;
            Ok((added, rejects))
        },
    )
}

/// Import LDIF from `input` (origin names it in messages). `on_progress` is
/// called after each batch with (entries so far, bytes read so far).
pub fn import<R: BufRead>(
    store: &Store,
    suffixes: &[String],
    input: R,
    origin: &str,
    opts: &ImportOptions,
    rejects_out: &mut dyn FnMut(&Reject),
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, ImportError> {
    let started = Instant::now();
    let schema = store.schema().clone();
    let csn = CsnClock::new(0);
    let suffixes = Arc::new(suffixes.to_vec());
    let counter = CountingReader {
        inner: input,
        bytes: 0,
    };
    let mut reader = LdifReader::new(counter, ReaderOptions::default());
    store.write_blocking(|w: &mut WriteTxn<'_>| w.meta_put(META_IMPORTING, b"1"))?;
    let previous = store.durability();
    store.set_durability(Durability::None);
    let mut report = ImportReport::default();
    // Newest CSN among the imported entries: the store's replication state
    // afterwards (CSNs compare correctly as strings).
    let mut newest_csn: Option<Vec<u8>> = None;
    let mut batch: Vec<Ready> = Vec::with_capacity(opts.batch);
    // Write what is gathered; count and pass on its rejects.
    let flush = |batch: &mut Vec<Ready>,
                 report: &mut ImportReport,
                 rejects_out: &mut dyn FnMut(&Reject)| {
        if batch.is_empty() {
            return Ok(());
        }
        let (n, rj) = write_batch(
            store,
            suffixes.clone(),
            std::mem::take(batch),
            opts.continue_on_error,
        )
        .map_err(|e| ImportError(format!("{origin}:{e}")))?;
        report.entries += n;
        report.rejected += rj.len() as u64;
        rj.iter().for_each(&mut *rejects_out);
        Ok::<(), ImportError>(())
    };
    let result = (|| -> Result<(), ImportError> {
        loop {
            let rec = match reader.next() {
                None => break,
                Some(Ok(r)) => r,
                Some(Err(e)) if opts.continue_on_error => {
                    let rj = Reject {
                        line: e.line,
                        dn: String::new(),
                        reason: e.message.clone(),
                    };
                    rejects_out(&rj);
                    report.rejected += 1;
                    continue;
                }
                Some(Err(e)) => {
                    return Err(ImportError(format!("{origin}:{}: {}", e.line, e.message)))
                }
            };
            let (dn, attrs, line) = match rec {
                Record::Content { dn, attrs, line } => (dn, attrs, line),
                Record::Change { line, dn, .. } => {
                    let reason = "change records are not imported (use ldapmodify)".to_string();
                    if opts.continue_on_error {
                        rejects_out(&Reject { line, dn, reason });
                        report.rejected += 1;
                        continue;
                    }
                    return Err(ImportError(format!("{origin}:{line}: {reason}")));
                }
            };
            match prepare(&schema, &csn, opts, line, &dn, attrs) {
                Ok(r) => {
                    if let Some(c) = r.entry.get("entryCSN").and_then(|a| a.values.first()) {
                        if newest_csn.as_ref().is_none_or(|n| c > n) {
                            newest_csn = Some(c.clone());
                        }
                    }
                    batch.push(r)
                }
                Err(reason) if opts.continue_on_error => {
                    rejects_out(&Reject { line, dn, reason });
                    report.rejected += 1;
                }
                Err(reason) => {
                    // Records before this one may fail too: report the first in file order.
                    if !batch.is_empty() {
                        write_batch(store, suffixes.clone(), std::mem::take(&mut batch), false)
                            .map_err(|e| ImportError(format!("{origin}:{e}")))?;
                    }
                    return Err(ImportError(format!("{origin}:{line}: {dn}: {reason}")));
                }
            }
            if batch.len() >= opts.batch {
                flush(&mut batch, &mut report, rejects_out)?;
                on_progress(report.entries, reader_bytes(&reader));
            }
        }
        flush(&mut batch, &mut report, rejects_out)?;
        Ok(())
    })();
    store.set_durability(previous);
    result?;
    // Everything is in; one sync (by a durable write), then the store is
    // declared complete.
    store.write_blocking(move |w: &mut WriteTxn<'_>| -> Result<(), StoreError> {
        if let Some(csn) = newest_csn {
            let newer = w
                .view()
                .meta_get(crate::backup::META_CONTEXT_CSN)?
                .is_none_or(|cur| csn > cur);
            if newer {
                w.meta_put(crate::backup::META_CONTEXT_CSN, &csn)?;
            }
        }
        w.meta_delete(META_IMPORTING)
    })?;
    report.bytes_read = reader_bytes(&reader);
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn reader_bytes<R: BufRead>(r: &LdifReader<CountingReader<R>>) -> u64 {
    r.get_ref().bytes
}

/// Counts bytes consumed, for progress reports.
pub struct CountingReader<R> {
    inner: R,
    pub bytes: u64,
}

impl<R: std::io::Read> std::io::Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for CountingReader<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.bytes += amt as u64;
        self.inner.consume(amt)
    }
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only this subtree (default: every suffix).
    pub base: Option<Dn>,
    pub filter: Option<pando_proto::Filter>,
    /// Include stored operational attributes (entryUUID, timestamps…).
    pub operational: bool,
    pub wrap: Option<usize>,
}

/// Write LDIF for the store's entries, parents before children, from one
/// read transaction. Returns the number of entries written.
pub fn export<W: Write>(store: &Store, out: &mut W, opts: &ExportOptions) -> Result<u64, String> {
    let schema = store.schema().clone();
    let rtxn = store.read().map_err(|e| e.to_string())?;
    let view = rtxn.view();
    let starts: Vec<EntryId> = match &opts.base {
        Some(base) => match view.lookup(base).map_err(|e| e.to_string())? {
            Ok(Lookup::Found(id)) => vec![id],
            Ok(Lookup::Missing { .. }) => return Err(format!("no entry '{base}' in the store")),
            Err(e) => return Err(format!("invalid base '{base}': {e}")),
        },
        None => view.roots().map_err(|e| e.to_string())?,
    };
    let filter = opts.filter.as_ref().map(|f| schema.compile_filter(f));
    let mut n = 0;
    let mut stack: Vec<EntryId> = starts.into_iter().rev().collect();
    while let Some(id) = stack.pop() {
        let mut kids = view.children(id).map_err(|e| e.to_string())?;
        kids.reverse();
        stack.extend(kids);
        let Some(entry) = view.entry(id).map_err(|e| e.to_string())? else {
            continue;
        };
        if let Some(f) = &filter {
            if f.matches(&schema, &entry) != pando_model::Ternary::True {
                continue;
            }
        }
        let dn = view.dn_string(id).map_err(|e| e.to_string())?;
        let pairs = entry.attrs.iter().filter(|a| {
            opts.operational
                || schema
                    .attribute(a.desc.split(';').next().unwrap_or(""))
                    .is_none_or(|t| !t.is_operational())
        });
        let flat = pairs.flat_map(|a| {
            a.values
                .iter()
                .map(move |v| (a.desc.as_str(), v.as_slice()))
        });
        pando_ldif::write_entry(out, &dn, flat, opts.wrap)
            .map_err(|e| format!("write failed: {e}"))?;
        n += 1;
    }
    Ok(n)
}
