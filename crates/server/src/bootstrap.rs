//! First-start work: suffix entries, the administrator password, demo data.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use pando_ldif::{LdifReader, ReaderOptions, Record};
use pando_model::{Dn, Entry, Schema};
use pando_store::{Lookup, Placement, Store, StoreError};

use crate::clock::{generalized_time, now_micros, CsnClock};
use crate::password;

/// Meta key holding the generated administrator password hash.
pub const META_ROOT_HASH: &str = "root_password_hash";
/// File (in the data directory) that receives a generated password once.
pub const ADMIN_PASSWORD_FILE: &str = "admin-password";

const DEMO_LDIF: &str = include_str!("demo.ldif");

#[derive(Debug)]
pub enum BootstrapError {
    Store(StoreError),
    Io(PathBuf, std::io::Error),
    Entry(String),
}

impl std::fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "{e}"),
            Self::Io(p, e) => write!(f, "{}: {e}", p.display()),
            Self::Entry(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for BootstrapError {}

impl From<StoreError> for BootstrapError {
    fn from(e: StoreError) -> Self {
        BootstrapError::Store(e)
    }
}

/// How the administrator password was settled.
pub enum RootPassword {
    /// From the configuration file.
    Configured(String),
    /// Generated earlier; only its hash is kept.
    Stored(String),
    /// Generated now; the clear text is in this file (mode 0600).
    Generated { hash: String, file: PathBuf },
}

impl RootPassword {
    pub fn hash(&self) -> &str {
        match self {
            Self::Configured(h) | Self::Stored(h) | Self::Generated { hash: h, .. } => h,
        }
    }
}

/// Settle the administrator password: configured hash, else the stored one,
/// else generate one, keep its hash, and write the clear text once to a
/// 0600 file that the operator reads and may delete.
pub fn root_password(
    store: &Store,
    data_dir: &Path,
    configured: Option<&str>,
) -> Result<RootPassword, BootstrapError> {
    if let Some(h) = configured {
        return Ok(RootPassword::Configured(h.to_string()));
    }
    if let Some(h) = store.read()?.view().meta_get(META_ROOT_HASH)? {
        return Ok(RootPassword::Stored(
            String::from_utf8_lossy(&h).into_owned(),
        ));
    }
    let clear = password::generate_password();
    let hash = password::hash_password(clear.as_bytes());
    let file = data_dir.join(ADMIN_PASSWORD_FILE);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&file)
        .map_err(|e| BootstrapError::Io(file.clone(), e))?;
    f.write_all(clear.as_bytes())
        .map_err(|e| BootstrapError::Io(file.clone(), e))?;
    f.sync_all()
        .map_err(|e| BootstrapError::Io(file.clone(), e))?;
    let h = hash.clone();
    store.write_blocking(move |w| w.meta_put(META_ROOT_HASH, h.as_bytes()))?;
    Ok(RootPassword::Generated { hash, file })
}

/// Object classes for a suffix entry named by its first RDN attribute.
fn suffix_entry(schema: &Schema, dn: &Dn) -> Result<Entry, String> {
    let rdn = dn.rdn().ok_or("empty suffix")?;
    let ava = rdn.avas.first().ok_or("empty RDN")?;
    let at = schema
        .attribute(&ava.attr)
        .ok_or_else(|| format!("unknown attribute '{}'", ava.attr))?;
    let value = ava.value.clone();
    let mut e = Entry::new(dn.clone());
    let (classes, extra): (&[&str], Option<(&str, Vec<u8>)>) =
        match at.name().to_ascii_lowercase().as_str() {
            "dc" => (
                &["top", "dcObject", "organization"],
                Some(("o", value.clone())),
            ),
            "o" => (&["top", "organization"], None),
            "ou" => (&["top", "organizationalUnit"], None),
            "c" => (&["top", "country"], None),
            "l" => (&["top", "locality"], None),
            _ => (&["top", "extensibleObject"], None),
        };
    e.add_values(
        "objectClass",
        classes.iter().map(|c| c.as_bytes().to_vec()).collect(),
    );
    for a in &rdn.avas {
        e.add_values(&a.attr, vec![a.value.clone()]);
    }
    if let Some((d, v)) = extra {
        e.add_values(d, vec![v]);
    }
    Ok(e)
}

/// Stamp the operational attributes of an entry the server creates itself;
/// returns its entryCSN.
fn stamp(entry: &mut Entry, creator: &str, csn: &CsnClock) -> String {
    let now = generalized_time(now_micros());
    let entry_csn = csn.next();
    for (d, v) in [
        ("creatorsName", creator.to_string()),
        ("modifiersName", creator.to_string()),
        ("createTimestamp", now.clone()),
        ("modifyTimestamp", now),
        ("entryCSN", entry_csn.clone()),
        ("entryUUID", crate::ops::write::random_uuid()),
    ] {
        entry.remove(d);
        entry.add_values(d, vec![v.into_bytes()]);
    }
    entry_csn
}

/// Add `entry` (schema-checked) unless it exists; true when added.
pub(crate) fn add_if_missing(
    store: &Store,
    mut entry: Entry,
    creator: &str,
    csn: &CsnClock,
    is_suffix: bool,
) -> Result<bool, BootstrapError> {
    let schema = store.schema().clone();
    let structural = schema
        .check_entry(&mut entry)
        .map_err(|v| BootstrapError::Entry(format!("{}: {}", entry.dn, v.message)))?;
    entry.remove("structuralObjectClass");
    entry.add_values("structuralObjectClass", vec![structural.into_bytes()]);
    let entry_csn = stamp(&mut entry, creator, csn);
    store.write_blocking(move |w| -> Result<bool, BootstrapError> {
        let view = w.view();
        let rdns = view
            .normalize_rdns(&entry.dn)
            .map_err(BootstrapError::Entry)?;
        let place = match view.lookup_norm(&rdns)? {
            Lookup::Found(_) => return Ok(false),
            Lookup::Missing { matched } => {
                if is_suffix {
                    Placement {
                        parent: 0,
                        rdn: entry.dn.to_string(),
                        norm_rdn: rdns.join(","),
                    }
                } else {
                    let parent = matched.ok_or_else(|| {
                        BootstrapError::Entry(format!("{}: parent missing", entry.dn))
                    })?;
                    let rdn = entry.dn.rdn().map(|r| r.to_string()).unwrap_or_default();
                    Placement {
                        parent,
                        rdn,
                        norm_rdn: rdns[0].clone(),
                    }
                }
            }
        };
        w.add(&place, &entry.attrs)?;
        // Recorded like any write's CSN, so the next start resumes after it.
        w.meta_put(crate::backup::META_CONTEXT_CSN, entry_csn.as_bytes())?;
        Ok(true)
    })
}

/// Create missing suffix entries; returns the DNs created.
pub fn ensure_suffixes(
    store: &Store,
    suffixes: &[Dn],
    creator: &str,
    csn: &CsnClock,
) -> Result<Vec<String>, BootstrapError> {
    let mut created = Vec::new();
    for dn in suffixes {
        let entry = suffix_entry(store.schema(), dn)
            .map_err(|e| BootstrapError::Entry(format!("suffix {dn}: {e}")))?;
        if add_if_missing(store, entry, creator, csn, true)? {
            created.push(dn.to_string());
        }
    }
    Ok(created)
}

/// Load the demo tree under `suffix` (entries already present are kept).
pub fn load_demo(
    store: &Store,
    suffix: &Dn,
    creator: &str,
    csn: &CsnClock,
) -> Result<usize, BootstrapError> {
    let text = DEMO_LDIF.replace("dc=example,dc=com", &suffix.to_string());
    let mut added = 0;
    for rec in LdifReader::new(text.as_bytes(), ReaderOptions::default()) {
        let rec = rec.map_err(|e| BootstrapError::Entry(format!("demo.ldif {e}")))?;
        let Record::Content { dn, attrs, .. } = rec else {
            continue;
        };
        let dn =
            Dn::parse(&dn).map_err(|e| BootstrapError::Entry(format!("demo.ldif: {dn}: {e}")))?;
        let mut entry = Entry::new(dn);
        for (a, v) in attrs {
            entry.add_values(&a, vec![v]);
        }
        if add_if_missing(store, entry, creator, csn, false)? {
            added += 1;
        }
    }
    Ok(added)
}
