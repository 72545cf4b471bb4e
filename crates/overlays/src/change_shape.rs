//! A logged change as the readers of a change log show it (cn=accesslog's
//! records, cn=changelog's entries): its modifications without this
//! server's own bookkeeping, and a rename's new RDN, new parent and
//! whether the old RDN's values went, read from the values it changed.

use pando_model::Dn;
use pando_store::{LoggedChange, LoggedKind, LoggedMod, ModOp};

/// What a rename did.
pub struct Rename {
    pub new_rdn: String,
    /// The new parent, when the entry moved.
    pub new_superior: Option<String>,
    pub delete_old_rdn: bool,
}

pub struct Shape<'c> {
    /// The entry the change was made to (a rename: its name before).
    pub target: &'c str,
    /// The modifications to show: a rename's RDN values are in `rename`.
    pub mods: Vec<&'c LoggedMod>,
    pub rename: Option<Rename>,
}

/// The attribute and value of a DN's first RDN (its first AVA).
fn first_rdn(dn: &str) -> Option<(String, String)> {
    let d = Dn::parse(dn).ok()?;
    let ava = d.rdns.first()?.avas.first()?.clone();
    Some((ava.attr, String::from_utf8_lossy(&ava.value).into_owned()))
}

/// Whether `m` is the RDN-value part of a rename from `old` to `new`, and
/// whether it removed the old RDN's value.
fn rename_part(m: &LoggedMod, old: &(String, String), new: &(String, String)) -> (bool, bool) {
    let base = pando_model::desc::base(&m.desc);
    let has = |v: &str| {
        m.values
            .iter()
            .any(|x| x.eq_ignore_ascii_case(v.as_bytes()))
    };
    let on_old = base.eq_ignore_ascii_case(&old.0);
    let on_new = base.eq_ignore_ascii_case(&new.0);
    match m.op {
        ModOp::Delete if on_old && has(&old.1) => (true, true),
        ModOp::Add if on_new && has(&new.1) => (true, false),
        // The attribute's values replaced by the new RDN's alone.
        ModOp::Replace if on_new && m.values.len() == 1 && has(&new.1) => {
            (true, on_old && !has(&old.1))
        }
        ModOp::Replace if on_old && !has(&old.1) => (false, true),
        _ => (false, false),
    }
}

pub fn of(c: &LoggedChange) -> Shape<'_> {
    let target = c.old_dn.as_deref().unwrap_or(&c.dn);
    let rdns = match (&c.old_dn, c.kind) {
        (Some(old), LoggedKind::ModDn) => first_rdn(old).zip(first_rdn(&c.dn)),
        _ => None,
    };
    let mut delete_old_rdn = false;
    let mut mods = Vec::new();
    for m in &c.mods {
        // Multi-provider merge state is this server's own (no other
        // server's schema knows it; a delta consumer would stop on it).
        let base = pando_model::desc::base(&m.desc);
        if base.eq_ignore_ascii_case(pando_ops::write::merge::STATE_ATTR) {
            continue;
        }
        if let Some((old, new)) = &rdns {
            let (part, deleted) = rename_part(m, old, new);
            delete_old_rdn |= deleted;
            if part {
                continue;
            }
        }
        mods.push(m);
    }
    let rename = (c.kind == LoggedKind::ModDn)
        .then(|| Dn::parse(&c.dn).ok())
        .flatten()
        .and_then(|new| {
            let rdn = new.rdns.first()?.clone();
            let new_parent = Dn {
                rdns: new.rdns[1..].to_vec(),
            };
            let old_parent = Dn::parse(target).ok().map(|o| Dn {
                rdns: o.rdns[1.min(o.rdns.len())..].to_vec(),
            });
            Some(Rename {
                new_rdn: Dn { rdns: vec![rdn] }.to_string(),
                new_superior: (old_parent.as_ref() != Some(&new_parent))
                    .then(|| new_parent.to_string()),
                delete_old_rdn,
            })
        });
    Shape {
        target,
        mods,
        rename,
    }
}
