//! First-start work: suffix entries, the administrator password, demo data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pando_ldif::{LdifReader, ReaderOptions, Record};
use pando_model::{Dn, Entry, Schema};
use pando_proto::ResultCode;
use pando_store::{Store, StoreError};

use crate::ops::controls::Requested;
use crate::ops::write::WriteCtx;
use crate::state::Server;

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
///
/// Safe against a cut at any point, and never overwrites `admin-password`:
/// the clear text goes to `admin-password.new` (synced), the hash is
/// committed and synced, then the file is renamed into place. A start that
/// finds the hash and a `.new` file whose password matches it finishes the
/// rename; a stored hash without a file is normal (the operator deleted it).
/// An `admin-password` beside a store without a hash belongs to some other
/// store: the start is refused.
pub fn root_password(
    store: &Store,
    data_dir: &Path,
    configured: Option<&str>,
) -> Result<RootPassword, BootstrapError> {
    if let Some(h) = configured {
        return Ok(RootPassword::Configured(h.to_string()));
    }
    let file = data_dir.join(ADMIN_PASSWORD_FILE);
    let pending = data_dir.join(format!("{ADMIN_PASSWORD_FILE}.new"));
    if let Some(h) = store.read()?.view().meta_get(META_ROOT_HASH)? {
        let hash = String::from_utf8_lossy(&h).into_owned();
        finish_pending(&pending, &file, &hash, data_dir)?;
        return Ok(RootPassword::Stored(hash));
    }
    if file.exists() {
        return Err(BootstrapError::Entry(format!(
            "{} exists but the store holds no administrator password: the store is not the one that file was made for \
             (replaced, restored from elsewhere, or damaged). Nothing was changed. Restore the store from a backup, \
             or, to start a new directory on this store, move {} away",
            file.display(),
            file.display()
        )));
    }
    let clear = pando_password::generate_password();
    let hash = pando_password::hash_password(clear.as_bytes());
    write_private(&pending, clear.as_bytes())?;
    // The file's name must be durable before the hash that needs it.
    pando_store::sync_dir(data_dir).map_err(|e| BootstrapError::Io(data_dir.to_path_buf(), e))?;
    let h = hash.clone();
    store.write_blocking(move |w| w.meta_put(META_ROOT_HASH, h.as_bytes()))?;
    // Whatever the durability mode: the file must never outlive its hash.
    store.sync()?;
    rename_synced(&pending, &file, data_dir)?;
    Ok(RootPassword::Generated { hash, file })
}

/// After a cut between committing a generated hash and renaming its file.
fn finish_pending(
    pending: &Path,
    file: &Path,
    hash: &str,
    data_dir: &Path,
) -> Result<(), BootstrapError> {
    let Ok(clear) = std::fs::read(pending) else {
        return Ok(());
    };
    if !file.exists() && pando_password::verify_password(&clear, hash.as_bytes()) {
        rename_synced(pending, file, data_dir)
    } else {
        // Written for a hash that was never committed: worthless.
        std::fs::remove_file(pending).map_err(|e| BootstrapError::Io(pending.to_path_buf(), e))
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), BootstrapError> {
    pando_store::write_private(path, bytes).map_err(|e| BootstrapError::Io(path.to_path_buf(), e))
}

fn rename_synced(from: &Path, to: &Path, dir: &Path) -> Result<(), BootstrapError> {
    std::fs::rename(from, to).map_err(|e| BootstrapError::Io(to.to_path_buf(), e))?;
    pando_store::sync_dir(dir).map_err(|e| BootstrapError::Io(dir.to_path_buf(), e))
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

/// Who the server's own first entries are written by: the administrator
/// DN, past the access rules (which may hold even administrators to some
/// subtrees).
fn own_writer(server: &Server) -> pando_access::Identity {
    pando_access::Identity::authenticated(
        server.root_dn_norm.clone(),
        server.root_dn_norm.clone(),
        Default::default(),
    )
    .with_roles(true, true)
}

/// Add `entry` through the write pipeline as the server's own writer:
/// stamped, schema-checked, in the change log and the audit log, the
/// overlays' upkeep made. False when an entry of that name exists.
pub(crate) async fn add_own(server: &Arc<Server>, entry: Entry) -> Result<bool, BootstrapError> {
    let req = crate::ops::write::request_for(entry);
    let dn = req.dn.clone();
    let ctx = WriteCtx::new(server, &own_writer(server), Requested::default());
    match crate::ops::write::add(ctx, req).await {
        Ok(_) => Ok(true),
        Err(e) if e.code == ResultCode::ENTRY_ALREADY_EXISTS => Ok(false),
        Err(e) => Err(BootstrapError::Entry(format!("{dn}: {}", e.message))),
    }
}

/// Create the missing entries of `suffixes`; returns the DNs created.
pub async fn ensure_suffixes(
    server: &Arc<Server>,
    suffixes: &[Dn],
) -> Result<Vec<String>, BootstrapError> {
    let mut created = Vec::new();
    for dn in suffixes {
        let entry = suffix_entry(&server.schema, dn)
            .map_err(|e| BootstrapError::Entry(format!("suffix {dn}: {e}")))?;
        if add_own(server, entry)
            .await
            .map_err(|e| BootstrapError::Entry(format!("suffix {e}")))?
        {
            created.push(dn.to_string());
        }
    }
    Ok(created)
}

/// With RFC 2307bis a posixGroup is added to a structural group class: a
/// demo POSIX group becomes a groupOfNames naming its members by DN too.
fn as_rfc2307bis_group(entry: &mut Entry, suffix: &Dn) {
    let is_posix_group = entry.get("objectClass").is_some_and(|a| {
        a.values
            .iter()
            .any(|v| v.eq_ignore_ascii_case(b"posixGroup"))
    });
    if !is_posix_group {
        return;
    }
    let members: Vec<Vec<u8>> = entry
        .get("memberUid")
        .map(|a| a.values.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|uid| format!("uid={},ou=People,{suffix}", String::from_utf8_lossy(&uid)).into_bytes())
        .collect();
    entry.add_values("objectClass", vec![b"groupOfNames".to_vec()]);
    entry.add_values("member", members);
}

/// Load the demo tree under the first suffix through the write pipeline,
/// as the administrator adding it would: stamped, schema-checked, in the
/// change log and the audit log, the overlays' upkeep (memberOf) made as
/// each entry goes in. Entries already present are kept.
pub async fn load_demo(server: &Arc<Server>) -> Result<usize, BootstrapError> {
    let Some((suffix, _)) = server.suffixes.first() else {
        return Ok(0);
    };
    let text = DEMO_LDIF.replace("dc=example,dc=com", &suffix.to_string());
    let posix_group_is_auxiliary = server
        .schema
        .object_class("posixGroup")
        .is_some_and(|c| c.kind == pando_model::ObjectClassKind::Auxiliary);
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
        // A subtree a replication consumer keeps (a demo consumer of
        // ou=People) holds its provider's entries, not the demo's.
        let norm = server
            .schema
            .normalize_dn(&entry.dn)
            .map_err(|e| BootstrapError::Entry(format!("demo.ldif: {}: {e}", entry.dn)))?;
        if !server.multi_provider() && server.rt.replicas.holding(&norm).is_some() {
            continue;
        }
        if posix_group_is_auxiliary {
            as_rfc2307bis_group(&mut entry, suffix);
        }
        if add_own(server, entry)
            .await
            .map_err(|e| BootstrapError::Entry(format!("demo.ldif: {e}")))?
        {
            added += 1;
        }
    }
    Ok(added)
}
