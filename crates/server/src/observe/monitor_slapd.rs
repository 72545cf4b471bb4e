//! The entries of slapd's back-monitor that Pando's own tree lacks, so that
//! tools written for slapd (LDAP Account Manager's server information page,
//! phpLDAPadmin) find them under the same DNs with the same classes and
//! attributes:
//!
//! ```text
//! cn=Backends       config, monitor, lmdb; one cn=Backend N each
//! cn=Connections    + cn=Max File Descriptors, cn=Total, cn=Current
//! cn=Databases      cn=Database 0 (cn=config), 1 (the store), 2 (cn=Monitor)
//! cn=Listeners      one cn=Listener N per configured listener
//! cn=Log, cn=SASL, cn=TLS, cn=Waiters   containers
//! cn=Overlays       + one cn=Overlay N per overlay type
//! cn=Statistics     cn=Bytes, cn=PDU, cn=Entries (sent)
//! cn=Threads        cn=Open (threads of the process)
//! cn=Time           cn=Start, cn=Current, cn=Uptime
//! ```
//!
//! Every figure is one Pando measures; where slapd has a figure Pando does
//! not (per-connection entries, referrals sent, thread pool states, waiter
//! counts), the entry or attribute is left out rather than made up
//! (docs/operations.md, "slapd's shapes").

use pando_model::{Attribute, Entry};

use super::monitor::{attr, node, num};
use crate::state::Server;
use pando_config::Listener;

const BACKENDS: &str = "cn=Backends,cn=Monitor";
const DATABASES: &str = "cn=Databases,cn=Monitor";
const OVERLAYS: &str = "cn=Overlays,cn=Monitor";

/// Backend N serves database N: the names slapd would give them.
const BACKEND_NAMES: [&str; 3] = ["config", "lmdb", "monitor"];
const STORE: usize = 1;

/// Append slapd's entries to `out`, each after its parent.
pub(super) fn add(server: &Server, out: &mut Vec<(String, Entry)>) {
    backends(out);
    connections(server, out);
    databases(server, out);
    listeners(server, out);
    container(out, "Log", "Logging; Pando's figures are in cn=Logs.");
    overlays(server, out);
    container(out, "SASL", "SASL.");
    statistics(server, out);
    threads(out);
    time(server, out);
    container(out, "TLS", "TLS.");
    container(
        out,
        "Waiters",
        "Read and write waiters (none: connections are async tasks).",
    );
}

fn container(out: &mut Vec<(String, Entry)>, cn: &str, description: &str) {
    let dn = format!("cn={cn},cn=Monitor");
    out.push(node(
        "monitorContainer",
        cn,
        &dn,
        vec![attr("description", [description])],
    ));
}

fn counter(out: &mut Vec<(String, Entry)>, cn: &str, parent: &str, v: u64) {
    let dn = format!("cn={cn},{parent}");
    out.push(node(
        "monitorCounterObject",
        cn,
        &dn,
        vec![num("monitorCounter", v)],
    ));
}

fn boolean(desc: &str, v: bool) -> Attribute {
    attr(desc, [if v { "TRUE" } else { "FALSE" }])
}

fn backends(out: &mut Vec<(String, Entry)>) {
    out.push(node(
        "monitorContainer",
        "Backends",
        BACKENDS,
        vec![
            attr("description", ["Backends."]),
            attr("monitoredInfo", BACKEND_NAMES),
        ],
    ));
    for (i, name) in BACKEND_NAMES.iter().enumerate() {
        let cn = format!("Backend {i}");
        let mut attrs = vec![
            attr("monitoredInfo", [*name]),
            // cn=Monitor alone cannot be reconfigured while running.
            boolean("monitorRuntimeConfig", *name != "monitor"),
            attr("seeAlso", [format!("cn=Database {i},{DATABASES}")]),
        ];
        if i == STORE {
            attrs.push(attr(
                "supportedControl",
                crate::ops::controls::supported_oids(),
            ));
        }
        out.push(node(
            "monitoredObject",
            &cn,
            &format!("cn={cn},{BACKENDS}"),
            attrs,
        ));
    }
}

fn connections(server: &Server, out: &mut Vec<(String, Entry)>) {
    let m = &server.rt.metrics;
    let parent = "cn=Connections,cn=Monitor";
    if let Some(fds) = max_file_descriptors() {
        counter(out, "Max File Descriptors", parent, fds);
    }
    counter(out, "Total", parent, m.get(&m.conns_total));
    counter(out, "Current", parent, m.get(&m.conns_current));
}

/// The soft limit on open files, which bounds the connections.
fn max_file_descriptors() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct passed.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some(lim.rlim_cur)
}

fn databases(server: &Server, out: &mut Vec<(String, Entry)>) {
    let suffixes: Vec<String> = server.suffixes.iter().map(|(d, _)| d.to_string()).collect();
    let mut contexts = suffixes.clone();
    contexts.push(crate::ops::config_tree::CONFIG_DN.to_string());
    out.push(node(
        "monitorContainer",
        "Databases",
        DATABASES,
        vec![
            attr("description", ["Databases."]),
            attr("namingContexts", contexts),
            attr("monitorContext", ["cn=Monitor"]),
        ],
    ));
    let shadow = !crate::repl::Replicas::of(server).list().is_empty();
    let kinds: Vec<&str> = server.layers.kinds.clone();
    for (i, name) in BACKEND_NAMES.iter().enumerate() {
        let cn = format!("Database {i}");
        let dn = format!("cn={cn},{DATABASES}");
        let mut attrs = vec![
            attr("monitoredInfo", [*name]),
            boolean("monitorIsShadow", i == STORE && shadow),
            // cn=Monitor takes no writes.
            boolean("readOnly", *name == "monitor"),
        ];
        match *name {
            "config" => attrs.push(attr("namingContexts", [crate::ops::config_tree::CONFIG_DN])),
            "monitor" => attrs.push(attr("monitorContext", ["cn=Monitor"])),
            _ => {
                attrs.push(attr("namingContexts", suffixes.clone()));
                if !kinds.is_empty() {
                    attrs.push(attr("monitorOverlay", kinds.clone()));
                }
            }
        }
        let mut see = vec![format!("cn=Backend {i},{BACKENDS}")];
        if i == STORE {
            see.extend(kinds.iter().map(|k| overlay_dn(k)));
        }
        attrs.push(attr("seeAlso", see));
        out.push(node("monitoredObject", &cn, &dn, attrs));
        if i == STORE {
            for (n, k) in kinds.iter().enumerate() {
                let cn = format!("Overlay {n}");
                let attrs = vec![
                    attr("monitoredInfo", [*k]),
                    attr("seeAlso", [overlay_dn(k)]),
                    attr("namingContexts", suffixes.clone()),
                ];
                out.push(node(
                    "monitoredObject",
                    &cn,
                    &format!("cn={cn},{dn}"),
                    attrs,
                ));
            }
        }
    }
}

/// The DN of an overlay type's entry under cn=Overlays.
fn overlay_dn(kind: &str) -> String {
    let n = pando_config::overlay::TYPES
        .iter()
        .position(|t| t.name == kind)
        .unwrap_or(0);
    format!("cn=Overlay {n},{OVERLAYS}")
}

/// One entry per overlay type (as slapd lists those available), pointing
/// at the database when it is configured.
fn overlays(server: &Server, out: &mut Vec<(String, Entry)>) {
    let kinds: Vec<&str> = server.layers.kinds.clone();
    for (n, t) in pando_config::overlay::TYPES.iter().enumerate() {
        let cn = format!("Overlay {n}");
        let mut attrs = vec![
            attr("monitoredInfo", [t.name]),
            boolean("monitorRuntimeConfig", true),
        ];
        if kinds.contains(&t.name) {
            attrs.push(attr(
                "seeAlso",
                [format!("cn=Database {STORE},{DATABASES}")],
            ));
        }
        out.push(node(
            "monitoredObject",
            &cn,
            &format!("cn={cn},{OVERLAYS}"),
            attrs,
        ));
    }
}

fn listeners(server: &Server, out: &mut Vec<(String, Entry)>) {
    let parent = "cn=Listeners,cn=Monitor";
    out.push(node(
        "monitorContainer",
        "Listeners",
        parent,
        vec![attr("description", ["Listeners."])],
    ));
    for (i, l) in server.cfg.listeners.iter().enumerate() {
        let local = match l {
            Listener::Tcp(a) | Listener::Ldaps(a) => format!("IP={a}"),
            Listener::Ldapi(p) => format!("PATH={}", p.display()),
        };
        let cn = format!("Listener {i}");
        let attrs = vec![
            attr("monitorConnectionLocalAddress", [local]),
            attr("labeledURI", [format!("{}/", l.url())]),
        ];
        out.push(node(
            "monitoredObject",
            &cn,
            &format!("cn={cn},{parent}"),
            attrs,
        ));
    }
}

fn statistics(server: &Server, out: &mut Vec<(String, Entry)>) {
    let m = &server.rt.metrics;
    let parent = "cn=Statistics,cn=Monitor";
    out.push(node(
        "monitorContainer",
        "Statistics",
        parent,
        vec![attr("description", ["What was sent to clients."])],
    ));
    counter(out, "Bytes", parent, m.get(&m.bytes_out));
    counter(out, "PDU", parent, m.get(&m.pdus_out));
    counter(out, "Entries", parent, m.get(&m.entries_sent));
}

fn threads(out: &mut Vec<(String, Entry)>) {
    let parent = "cn=Threads,cn=Monitor";
    out.push(node(
        "monitorContainer",
        "Threads",
        parent,
        vec![attr("description", ["Threads."])],
    ));
    let open = pando_observe::metrics::ProcessFigures::read().threads;
    let attrs = vec![
        attr("monitoredInfo", [open.to_string()]),
        attr("description", ["Threads of the process"]),
    ];
    out.push(node(
        "monitoredObject",
        "Open",
        &format!("cn=Open,{parent}"),
        attrs,
    ));
}

fn time(server: &Server, out: &mut Vec<(String, Entry)>) {
    let m = &server.rt.metrics;
    let parent = "cn=Time,cn=Monitor";
    out.push(node(
        "monitorContainer",
        "Time",
        parent,
        vec![attr("description", ["Time."])],
    ));
    let started = m
        .started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let stamps = [
        ("Start", started),
        ("Current", pando_store::clock::now_micros()),
    ];
    for (cn, t) in stamps {
        let attrs = vec![attr(
            "monitorTimestamp",
            [pando_store::clock::generalized_time(t)],
        )];
        out.push(node(
            "monitoredObject",
            cn,
            &format!("cn={cn},{parent}"),
            attrs,
        ));
    }
    let attrs = vec![attr("monitoredInfo", [m.uptime_secs().to_string()])];
    out.push(node(
        "monitoredObject",
        "Uptime",
        &format!("cn=Uptime,{parent}"),
        attrs,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_entries_follow_the_type_list() {
        let types = pando_config::overlay::TYPES;
        assert_eq!(
            overlay_dn(types[0].name),
            format!("cn=Overlay 0,{OVERLAYS}")
        );
        let last = types.len() - 1;
        assert_eq!(
            overlay_dn(types[last].name),
            format!("cn=Overlay {last},{OVERLAYS}")
        );
        assert!(max_file_descriptors().is_some_and(|n| n > 0));
    }
}
