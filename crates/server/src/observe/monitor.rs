//! The `cn=Monitor` subtree, computed when it is read:
//!
//! ```text
//! cn=Monitor                     version, start time, uptime, process (CPU, I/O, threads)
//!   cn=Connections,cn=Monitor    current, total, bytes and PDUs in/out
//!   cn=Operations,cn=Monitor     totals, in progress, entries sent, wait time
//!     cn=Search,cn=Operations,cn=Monitor   (one per type: Bind … Unbind)
//!                                initiated, completed, latency percentiles and buckets
//!   cn=Store,cn=Monitor          entries, sizes, map use, page-cache residency, per-database sizes
//!   cn=Indexes,cn=Monitor        indexes ready, and those being built with their progress
//!   cn=Overlays,cn=Monitor       overlays in order; error injection rules and how often each fired
//!   cn=Writer,cn=Monitor         batches, largest and mean batch size, commit latency, fsyncs
//!   cn=Logs,cn=Monitor           access-log lines dropped, write errors
//!   cn=Passwords,cn=Monitor      slow hashes computed and running, upgrades on bind
//! ```
//!
//! Attribute types are Pando's own (`pando…`, crates/model/schema/monitor.schema),
//! beside slapd's back-monitor classes and attributes where tools read
//! them; the entries slapd has that Pando's tree lacks are made in
//! `monitor_slapd`.
//!
//! Who may read it: holders of the administrator role (and break-glass).
//! Everyone else gets noSuchObject, as for an entry they may not see,
//! unless configured `[[access]]` rules name the entry (a `dn` and scope
//! or a `dn_regex` covering it): then those rules alone decide, evaluated
//! with the monitor entry's DN. A rule covering every entry (no `dn`)
//! opens no part of the monitor, also when another rule names a different
//! part of it (a rule for `cn=Connections,cn=Monitor` leaves
//! `cn=Conflicts,cn=Replication,cn=Monitor` closed).

use pando_model::{Attribute, Dn, Entry, Schema};
use std::sync::atomic::Ordering;

use crate::ops::seams::{VirtualEntry, VirtualTree};
use crate::ops::search::virtual_tree::with_norms;
use crate::state::Server;
use pando_access::acl::{self, Access};
use pando_access::Identity;
use pando_observe::metrics::{Latency, Metrics, ProcessFigures, LATENCY_BOUNDS, OP_KINDS};

pub const MONITOR_NORM: &str = "cn=monitor";

/// Is the normalised DN `cn=monitor` or below it?
pub fn is_monitor_dn(norm: &str) -> bool {
    norm == MONITOR_NORM || norm.ends_with(",cn=monitor")
}

/// May `who` read the monitor entry `norm` (holding `entry`)?
pub fn may_read(server: &Server, who: &Identity, norm: &str, entry: &Entry) -> bool {
    if who.is_admin() || who.is_break_glass() {
        return true;
    }
    let mut access = Access::new(&server.acl, who);
    let rules = access.named_entry(&server.schema, norm, entry);
    !Access::is_empty(&rules) && access.allows(None, &rules, norm, None, acl::READ)
}

pub(super) fn attr(desc: &str, values: impl IntoIterator<Item = impl Into<Vec<u8>>>) -> Attribute {
    Attribute {
        desc: desc.to_string(),
        values: values.into_iter().map(Into::into).collect(),
    }
}

pub(super) fn num(desc: &str, v: u64) -> Attribute {
    attr(desc, [v.to_string()])
}

/// A monitor entry of slapd's structural `class` (monitorContainer,
/// monitoredObject…) carrying Pando's figures under the auxiliary
/// pandoMonitor.
pub(super) fn node(class: &str, cn: &str, dn: &str, mut attrs: Vec<Attribute>) -> (String, Entry) {
    let mut all = vec![
        attr("objectClass", [class, "pandoMonitor"]),
        attr("cn", [cn]),
    ];
    all.append(&mut attrs);
    let parsed = Dn::parse(dn).unwrap_or(Dn { rdns: Vec::new() });
    (
        dn.to_string(),
        Entry {
            dn: parsed,
            attrs: all,
        },
    )
}

/// Op type names as they appear in RDNs: slapd's, which tools read
/// (`cn=Modrdn`, not `cn=ModDN`).
fn title(name: &str) -> String {
    match name {
        "moddn" => "Modrdn".into(),
        other => {
            let mut c = other.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        }
    }
}

fn latency_attrs(l: &Latency) -> Vec<Attribute> {
    vec![
        num("pandoLatencyCount", l.count),
        num("pandoLatencySumMicros", l.sum),
        num("pandoLatencyP50", l.p50),
        num("pandoLatencyP90", l.p90),
        num("pandoLatencyP99", l.p99),
        num("pandoLatencyP999", l.p999),
        num("pandoLatencyMax", l.max),
        attr(
            "pandoLatencyBucket",
            LATENCY_BOUNDS
                .iter()
                .zip(&l.buckets)
                .map(|(b, c)| format!("{b} {c}"))
                .chain(std::iter::once(format!("+Inf {}", l.count))),
        ),
    ]
}

/// `pandoIndexReady` and `pandoIndexBuilding` values.
/// The overlay types this server has (slapd's `monitoredInfo`: the overlays
/// available, whether configured or not), the configured ones in order,
/// and how often each error injection rule fired.
fn overlays(server: &Server) -> Vec<Attribute> {
    let list: Vec<String> = server
        .layers
        .kinds
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{{{i}}}{k}"))
        .collect();
    let mut out = vec![
        attr(
            "description",
            ["Overlay types; the configured ones in pandoOverlay."],
        ),
        attr(
            "monitoredInfo",
            pando_config::overlay::TYPES.iter().map(|t| t.name),
        ),
    ];
    if !list.is_empty() {
        out.push(attr("pandoOverlay", list));
    }
    let rules = server.layers.injection_counts();
    if !rules.is_empty() {
        out.push(attr("pandoErrorInjected", rules));
    }
    out
}

fn indexes(server: &Server) -> Vec<Attribute> {
    let (mut ready, mut building) = (Vec::new(), Vec::new());
    for i in server.rt.store.indexes() {
        match i.building {
            None => ready.push(format!("{} {}", i.attr, i.kind)),
            Some(p) => building.push(format!(
                "{} {} {} {} {:.1}",
                i.attr,
                i.kind,
                p.entries_done,
                p.entries_total,
                p.elapsed.as_secs_f64()
            )),
        }
    }
    let mut out = Vec::new();
    if !ready.is_empty() {
        out.push(attr("pandoIndexReady", ready));
    }
    if !building.is_empty() {
        out.push(attr("pandoIndexBuilding", building));
    }
    out
}

/// Every monitor entry with its DN, parents before children.
pub fn entries(server: &Server) -> Vec<(String, Entry)> {
    let m = &server.rt.metrics;
    let mut out = vec![server_node(m), connections_node(m)];
    operation_nodes(m, &mut out);
    out.push(store_node(server));
    out.push(node(
        "monitoredObject",
        "Indexes",
        "cn=Indexes,cn=Monitor",
        indexes(server),
    ));
    out.push(node(
        "monitorContainer",
        "Overlays",
        "cn=Overlays,cn=Monitor",
        overlays(server),
    ));
    out.push(changes_node(server));
    replication(server, &mut out);
    out.push(writer_node(server));
    out.push(logs_node(server));
    out.push(passwords_node(server));
    super::monitor_slapd::add(server, &mut out);
    out
}

/// `cn=Monitor` itself: version, start, the process's figures.
fn server_node(m: &Metrics) -> (String, Entry) {
    let p = ProcessFigures::read();
    let started = m
        .started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    node(
        "monitorServer",
        "Monitor",
        "cn=Monitor",
        vec![
            attr("description", ["The server's figures, computed when read."]),
            attr(
                "monitoredInfo",
                [format!("Pando {}", env!("CARGO_PKG_VERSION"))],
            ),
            attr(
                "pandoVersion",
                [format!("Pando {}", env!("CARGO_PKG_VERSION"))],
            ),
            attr(
                "pandoStartTime",
                [pando_store::clock::generalized_time(started)],
            ),
            num("pandoUptime", m.uptime_secs()),
            num("pandoThreads", p.threads),
            num("pandoCpuMicros", p.cpu_micros),
            num("pandoRssBytes", p.rss_bytes),
            num("pandoReadBytes", p.read_bytes),
            num("pandoWriteBytes", p.write_bytes),
            num("pandoReadSyscalls", p.syscr),
            num("pandoWriteSyscalls", p.syscw),
        ],
    )
}

/// `cn=Connections`: connections, bytes and messages.
fn connections_node(m: &Metrics) -> (String, Entry) {
    node(
        "monitorContainer",
        "Connections",
        "cn=Connections,cn=Monitor",
        vec![
            attr("description", ["Client connections."]),
            num("pandoCurrent", m.get(&m.conns_current)),
            num("pandoTotal", m.get(&m.conns_total)),
            num("pandoBytesIn", m.get(&m.bytes_in)),
            num("pandoBytesOut", m.get(&m.bytes_out)),
            num("pandoPdusIn", m.get(&m.pdus_in)),
            num("pandoPdusOut", m.get(&m.pdus_out)),
        ],
    )
}

/// `cn=Operations` and one entry per operation type.
fn operation_nodes(m: &Metrics, out: &mut Vec<(String, Entry)>) {
    let (ini, com) = OP_KINDS.iter().fold((0, 0), |(i, c), k| {
        (i + m.initiated(*k), c + m.completed(*k))
    });
    out.push(node(
        "monitorContainer",
        "Operations",
        "cn=Operations,cn=Monitor",
        vec![
            attr("description", ["Operations by type."]),
            num("monitorOpInitiated", ini),
            num("monitorOpCompleted", com),
            num("pandoInitiated", ini),
            num("pandoCompleted", com),
            num("pandoInProgress", ini.saturating_sub(com)),
            num("pandoEntriesSent", m.get(&m.entries_sent)),
            num("pandoWaitMicros", m.get(&m.wait_micros)),
        ],
    ));
    for k in OP_KINDS {
        let t = title(k.name());
        let mut attrs = vec![
            num("monitorOpInitiated", m.initiated(k)),
            num("monitorOpCompleted", m.completed(k)),
            num("pandoInitiated", m.initiated(k)),
            num("pandoCompleted", m.completed(k)),
        ];
        attrs.extend(latency_attrs(&m.latency(k)));
        let dn = format!("cn={t},cn=Operations,cn=Monitor");
        out.push(node("monitorOperation", &t, &dn, attrs));
    }
}

/// `cn=Store`: size, map, readers, databases, page cache.
fn store_node(server: &Server) -> (String, Entry) {
    let mut store = Vec::new();
    if let Ok(s) = server.rt.store.stats() {
        store.push(num("pandoEntries", s.entries));
        store.push(num("pandoDiskBytes", s.disk_bytes));
        store.push(num("pandoMapSize", s.map_size));
        store.push(num("pandoMapUsedBytes", s.map_used_bytes));
        store.push(num("pandoReaderSlots", s.reader_slots_used));
        store.push(num("pandoReadersOpen", s.readers_open));
        store.push(num("pandoOldestReaderMicros", s.oldest_reader_micros));
        store.push(num("pandoLastTxnId", s.last_txn_id));
        store.push(attr(
            "pandoDatabaseSize",
            s.databases
                .iter()
                .map(|d| format!("{} {} {}", d.name, d.bytes, d.items)),
        ));
    }
    if let Some(r) = resident(server) {
        store.push(attr("pandoResidentPercent", [format!("{:.1}", r * 100.0)]));
    }
    node("monitoredObject", "Store", "cn=Store,cn=Monitor", store)
}

/// `cn=Changes`: persistent searches and the change log.
fn changes_node(server: &Server) -> (String, Entry) {
    let mut changes = vec![num(
        "pandoPersistentSearches",
        server.rt.persistent_searches.in_use() as u64,
    )];
    let log = server
        .rt
        .store
        .read()
        .and_then(|r| r.view().changelog_summary());
    if let Ok(log) = log {
        changes.push(num("pandoChangeLogRecords", log.count));
        if let Some(csn) = log.oldest_csn {
            changes.push(attr("pandoChangeLogOldestCSN", [csn]));
        }
        if !log.floor.is_empty() {
            changes.push(attr("pandoChangeLogFloorCSN", [log.floor]));
        }
    }
    node(
        "monitoredObject",
        "Changes",
        "cn=Changes,cn=Monitor",
        changes,
    )
}

/// `cn=Writer`: batches, commits, durability.
fn writer_node(server: &Server) -> (String, Entry) {
    let w = server.rt.store.writer_stats();
    node(
        "monitoredObject",
        "Writer",
        "cn=Writer,cn=Monitor",
        vec![
            num("pandoBatches", w.batches),
            num("pandoWriteOperations", w.operations),
            num("pandoFailedOperations", w.failed_operations),
            num("pandoLargestBatch", w.largest_batch),
            attr(
                "pandoMeanBatch",
                [format!(
                    "{:.2}",
                    w.operations as f64 / w.batches.max(1) as f64
                )],
            ),
            num("pandoCommitMicros", w.commit_micros),
            num("pandoLastCommitMicros", w.last_commit_micros),
            num("pandoSyncs", w.syncs),
            attr(
                "pandoDurability",
                [durability_text(server.rt.store.durability())],
            ),
        ],
    )
}

/// The durability mode in the configuration's words (`store.durability`
/// and, when batched, its two bounds).
fn durability_text(d: pando_store::Durability) -> String {
    match d {
        pando_store::Durability::Durable => "durable".into(),
        pando_store::Durability::Batched { max_writes, max_ms } => {
            format!("batched (batched_max_writes = {max_writes}, batched_max_ms = {max_ms})")
        }
        pando_store::Durability::None => "none".into(),
    }
}

/// `cn=Logs`: log files, drops and errors, cn=accesslog's counts.
fn logs_node(server: &Server) -> (String, Entry) {
    let mut logs = vec![
        num("pandoDropped", server.logs.access_dropped()),
        num("pandoWriteErrors", server.logs.write_errors()),
    ];
    if server.layers.op_log.is_some() {
        let a = &server.rt.metrics.accesslog;
        let l = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        logs.push(num(
            "pandoAccessLogRefusedAnonymous",
            l(&a.refused_anonymous),
        ));
        logs.push(num("pandoAccessLogDropped", l(&a.dropped)));
        logs.push(num("pandoAccessLogPurged", l(&a.purged)));
    }
    let files: Vec<String> = [
        server.logs.access.as_ref().map(|a| a.file.path()),
        server.logs.audit.as_ref().map(|a| a.file.path()),
    ]
    .into_iter()
    .flatten()
    .map(|p| p.display().to_string())
    .collect();
    if !files.is_empty() {
        logs.push(attr("pandoLogFile", files));
    }
    node("monitoredObject", "Logs", "cn=Logs,cn=Monitor", logs)
}

/// `cn=Passwords`: slow hashes and upgrades.
fn passwords_node(server: &Server) -> (String, Entry) {
    let h = server.passwords.stats();
    let passwords = vec![
        num("pandoPasswordHashes", h.total.load(Ordering::Relaxed)),
        num("pandoInProgress", h.running.load(Ordering::Relaxed)),
        num("pandoPasswordUpgrades", h.upgraded.load(Ordering::Relaxed)),
    ];
    node(
        "monitoredObject",
        "Passwords",
        "cn=Passwords,cn=Monitor",
        passwords,
    )
}

/// Share of the database file in the page cache.
/// `cn=Replication,cn=Monitor`, `cn=Conflicts` below it (multi-provider
/// resolutions, newest first), and one `cn=Consumer NNN` per consumer,
/// with OpenLDAP's olmSR* names where they exist.
/// cn=Conflicts,cn=Replication,cn=Monitor: how many conflict records the
/// store holds, and the newest.
/// A consumer's last comparison with its provider by content.
fn checked_attrs(c: &crate::repl::check::Checked) -> Vec<Attribute> {
    let mut out = vec![num("pandoReplCheckPasses", c.passes)];
    if let Some(t) = c.last {
        out.push(attr(
            "pandoReplCheckTime",
            [pando_store::clock::generalized_time(t)],
        ));
        out.push(num("pandoReplCheckDiffering", c.differing));
    }
    if !c.shown.is_empty() {
        out.push(attr("pandoReplCheckEntry", c.shown.clone()));
    }
    if let Some(e) = &c.error {
        out.push(attr("pandoReplCheckError", [e.clone()]));
    }
    out
}

fn conflicts_node(server: &Server) -> (String, Entry) {
    use crate::ops::write::conflicts;
    let (total, recent) = server
        .rt
        .store
        .read()
        .ok()
        .and_then(|r| {
            let view = r.view();
            let total = conflicts::total(&view).ok()?;
            let recent = conflicts::recent(&view, conflicts::LISTED).ok()?;
            Some((total, recent))
        })
        .unwrap_or_default();
    let mut attrs = vec![num("pandoReplConflicts", total)];
    if !recent.is_empty() {
        attrs.push(attr("pandoReplConflictRecord", recent));
    }
    node(
        "monitoredObject",
        "Conflicts",
        "cn=Conflicts,cn=Replication,cn=Monitor",
        attrs,
    )
}

fn replication(server: &Server, out: &mut Vec<(String, Entry)>) {
    let replicas = crate::repl::Replicas::of(server).list();
    out.push(node(
        "monitoredObject",
        "Replication",
        "cn=Replication,cn=Monitor",
        vec![
            num("pandoReplConsumers", replicas.len() as u64),
            num(
                "pandoReplPushes",
                crate::repl::Replicas::of(server).pushes().len() as u64,
            ),
        ],
    ));
    out.push(conflicts_node(server));
    pushes(server, out);
    let time = |t: Option<u64>| t.map(pando_store::clock::generalized_time);
    for r in replicas.iter() {
        let Some(s) = r.snapshot() else {
            continue;
        };
        let cn = format!("Consumer {:03}", r.rid);
        let mut attrs = vec![
            attr("objectClass", ["olmSyncReplInstance"]),
            attr("olmSRProviderURIList", [s.provider.clone()]),
            attr("olmSRSyncPhase", [s.phase]),
            num("pandoReplApplied", s.applied),
            num("pandoReplDeleted", s.deleted),
            num("pandoReplRefreshes", s.refreshes),
            num("pandoReplReloads", s.reloads),
            num("pandoReplFailures", s.failures),
            num("pandoReplConflicts", s.conflicts),
            num("pandoReplFutureChanges", s.future_changes),
            num("pandoReplSkipped", s.skipped),
        ];
        if let Some(t) = time(s.last_connect) {
            attrs.push(attr("olmSRLastConnect", [t]));
        }
        if let Some(t) = time(s.last_contact) {
            attrs.push(attr("olmSRLastContact", [t]));
        }
        if let Some(c) = s.last_cookie {
            attrs.push(attr("olmSRLastCookieRcvd", [c]));
        }
        if let Some(e) = s.last_error {
            attrs.push(attr("pandoReplLastError", [e]));
        }
        if !s.delay.is_empty() {
            let values: Vec<String> = s
                .delay
                .iter()
                .map(|(sid, us)| format!("{sid:03x} {}.{:06}", us / 1_000_000, us % 1_000_000))
                .collect();
            attrs.push(attr("pandoReplDelay", values));
        }
        if !s.behind.is_empty() {
            let values: Vec<String> = s
                .behind
                .iter()
                .map(|(sid, b)| format!("{sid:03x} {b}"))
                .collect();
            attrs.push(attr("pandoReplChangesBehind", values));
        }
        attrs.extend(checked_attrs(&s.checked));
        let (dn, mut entry) = node(
            "monitoredObject",
            &cn,
            &format!("cn={cn},cn=Replication,cn=Monitor"),
            attrs,
        );
        // Two objectClass attributes became one: the node's and this one.
        let classes: Vec<Vec<u8>> = entry
            .attrs
            .iter()
            .filter(|a| a.desc == "objectClass")
            .flat_map(|a| a.values.clone())
            .collect();
        entry.attrs.retain(|a| a.desc != "objectClass");
        entry.attrs.insert(
            0,
            Attribute {
                desc: "objectClass".into(),
                values: classes,
            },
        );
        out.push((dn, entry));
    }
}

/// One `cn=Push NNN,cn=Replication,cn=Monitor` per push.
fn pushes(server: &Server, out: &mut Vec<(String, Entry)>) {
    for p in crate::repl::Replicas::of(server).pushes().iter() {
        let s = p.snapshot();
        let cn = format!("Push {:03}", p.rid);
        let mut attrs = vec![
            attr("pandoPushTarget", [p.cfg.target.clone()]),
            attr("pandoPushPhase", [s.phase]),
            num("pandoPushPushed", s.pushed),
            num("pandoPushRefused", s.refused),
            num("pandoPushLoads", s.loads),
            num("pandoReplFailures", s.failures),
        ];
        if !s.place.is_empty() {
            attrs.push(attr("pandoPushPlace", s.place));
        }
        if let Some(t) = s.last_push {
            attrs.push(attr(
                "pandoPushLastTime",
                [pando_store::clock::generalized_time(t)],
            ));
        }
        if let Some(e) = s.last_error {
            attrs.push(attr("pandoReplLastError", [e]));
        }
        let dn = format!("cn={cn},cn=Replication,cn=Monitor");
        let (dn, mut entry) = node("monitoredObject", &cn, &dn, attrs);
        if let Some(oc) = entry.attrs.iter_mut().find(|a| a.desc == "objectClass") {
            oc.values.push(b"pandoPushInstance".to_vec());
        }
        out.push((dn, entry));
    }
}

pub fn resident(server: &Server) -> Option<f64> {
    let file = crate::store_dir(&server.cfg.config.data_dir).join("data.mdb");
    crate::datadir::resident_fraction(&file)
}

/// cn=Monitor as a tree searches read (`ops::search::virtual_tree`): made per search, each entry returned
/// only to those who may read it.
pub struct Tree;

impl VirtualTree for Tree {
    // Only a last RDN of one `cn` value can name it: others skip the
    // normalising.
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        base.rdns
            .last()
            .filter(|r| {
                r.avas.len() == 1
                    && schema
                        .attribute(&r.avas[0].attr)
                        .is_some_and(|t| t.has_name("cn"))
            })
            .and_then(|r| schema.normalize_rdn(r).ok())
            .is_some_and(|r| r == MONITOR_NORM)
    }

    fn may_enter(&self, server: &Server, who: &Identity, base_norm: &str) -> bool {
        let probe = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: Vec::new(),
        };
        may_read(server, who, base_norm, &probe)
    }

    fn may_read(&self, server: &Server, who: &Identity, e: &VirtualEntry) -> bool {
        may_read(server, who, &e.norm, &e.entry)
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        with_norms(server, entries(server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_dns() {
        assert!(is_monitor_dn("cn=monitor"));
        assert!(is_monitor_dn("cn=search,cn=operations,cn=monitor"));
        assert!(!is_monitor_dn("cn=monitor,dc=example,dc=com"));
        assert!(!is_monitor_dn("cn=notmonitor"));
        assert_eq!(title("moddn"), "Modrdn");
        assert_eq!(title("search"), "Search");
    }
}
