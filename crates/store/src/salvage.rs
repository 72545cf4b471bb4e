//! Salvage: every entry that can still be read from a damaged store.
//!
//! Reads the data file through [`file_check`] (plain reads, every page
//! checked), never through LMDB: a store LMDB cannot open still gives up
//! what survived. The newest snapshot is used; if its main database cannot
//! be read, the previous one. Entries come out parents first with their DN
//! rebuilt from the placements their records hold (`id2parent` in stores
//! before format 6); an entry whose checksum fails is left out, and
//! one whose DN cannot be rebuilt (its placement or a parent's is lost) is
//! reported with its content rather than placed somewhere it never was.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use pando_model::{Attribute, Dn};

use crate::file_check::{DataFile, DbRecord};
use crate::{decode_placement, entry_codec, read_place, EntryId, Placement, StoreError, DATA_FILE};

/// What salvage found, for its report.
#[derive(Debug, Default)]
pub struct SalvageReport {
    /// The snapshot read (LMDB transaction ID), and whether it was the
    /// older of the two because the newest could not be read.
    pub txnid: u64,
    pub previous_snapshot: bool,
    /// Entries written out.
    pub written: u64,
    /// Parts of the file that could not be read, in words.
    pub damage: Vec<String>,
    /// Entries whose stored bytes fail their checksum or cannot be decoded.
    pub unreadable: Vec<(EntryId, String)>,
    /// Entries read whole whose DN is lost: ID, what is known of the place,
    /// and the content.
    pub orphans: Vec<(EntryId, String, Vec<Attribute>)>,
    /// Entries lost whose children were read: written as placeholders
    /// (objectClass extensibleObject and the RDN) so the children import.
    pub placeholders: Vec<(EntryId, String)>,
}

impl SalvageReport {
    /// The report file's text: every finding, commented (`#`) so the file
    /// can sit beside the LDIF; entries without a DN with their content.
    pub fn describe(&self, store_dir: &Path, output: &Path) -> String {
        use std::fmt::Write;
        let mut r = String::new();
        let _ = writeln!(
            r,
            "# pando salvage of {}: snapshot {}{}\n# {} entries written to {}",
            store_dir.display(),
            self.txnid,
            if self.previous_snapshot {
                " (the previous one: the newest was unreadable)"
            } else {
                ""
            },
            self.written,
            output.display()
        );
        let _ = writeln!(r, "# {} part(s) of the file unreadable:", self.damage.len());
        for d in &self.damage {
            let _ = writeln!(r, "#   {d}");
        }
        let _ = writeln!(
            r,
            "# {} entries unreadable (checksum or encoding):",
            self.unreadable.len()
        );
        for (id, e) in &self.unreadable {
            let _ = writeln!(r, "#   entry {id}: {e}");
        }
        let _ = writeln!(
            r,
            "# {} lost entries written as placeholders (a structural class and extensibleObject with the RDN) so that their children import:",
            self.placeholders.len()
        );
        for (id, dn) in &self.placeholders {
            let _ = writeln!(r, "#   entry {id}: {dn}");
        }
        let _ = writeln!(
            r,
            "# {} entries read whole but whose DN is lost; their content follows, commented out:",
            self.orphans.len()
        );
        for (id, why, attrs) in &self.orphans {
            let _ = writeln!(r, "#\n# entry {id}: {why}");
            // As LDIF (base64 where needed), every line commented out.
            let mut block = Vec::new();
            let flat = attrs.iter().flat_map(|a| {
                a.values
                    .iter()
                    .map(move |v| (a.desc.as_str(), v.as_slice()))
            });
            let _ = pando_ldif::write_entry(&mut block, &format!("entryID={id}"), flat, Some(76));
            for line in String::from_utf8_lossy(&block).lines() {
                let _ = writeln!(r, "# {line}");
            }
        }
        r
    }
}

/// One entry for the output.
pub struct Salvaged<'a> {
    pub dn: &'a str,
    pub attrs: &'a [Attribute],
    /// A stand-in for a lost parent, not an entry that was read.
    pub placeholder: bool,
}

type Places = HashMap<EntryId, Placement>;

/// Every readable placement and entry record: placements from `id2parent`
/// (stores before format 6) and from the records themselves.
fn places_and_entries(
    snapshot: &DataFile<'_, std::fs::File>,
    dbs: &BTreeMap<String, DbRecord>,
    damage: &mut Vec<String>,
) -> (Places, BTreeMap<EntryId, Vec<u8>>) {
    let mut places = Places::new();
    records(snapshot, dbs, "id2parent", damage, &mut |id, v| {
        if let Ok(p) = decode_placement(id, v) {
            places.insert(id, p);
        }
    });
    let mut entries = BTreeMap::new();
    records(snapshot, dbs, "id2entry", damage, &mut |id, v| {
        if let Ok(Some(p)) = entry_codec::placement_of(id, v) {
            if let Ok(p) = read_place(id, p) {
                places.insert(id, p);
            }
        }
        entries.insert(id, v.to_vec());
    });
    (places, entries)
}

/// Read what can be read from the store in `store_dir`; give each entry to
/// `out`, parents before children.
pub fn salvage(
    store_dir: &Path,
    out: &mut dyn FnMut(Salvaged<'_>) -> std::io::Result<()>,
) -> Result<SalvageReport, StoreError> {
    let path = store_dir.join(DATA_FILE);
    let file = std::fs::File::open(&path)
        .map_err(|e| StoreError::Damaged(format!("{}: {e}", path.display())))?;
    let newest = DataFile::open_lenient(&file)
        .map_err(|e| StoreError::Damaged(format!("{}: {e}", path.display())))?;
    let mut report = SalvageReport::default();
    let mut dbs = newest.databases(&mut report.damage);
    let mut snapshot = &newest;
    let previous = newest.previous_snapshot();
    if !["id2entry", "id2parent"]
        .iter()
        .all(|n| dbs.contains_key(*n))
    {
        if let Some(prev) = &previous {
            let mut d = Vec::new();
            let older = prev.databases(&mut d);
            if older.contains_key("id2entry") {
                report.damage.push(format!(
                    "the newest snapshot's database list is unreadable; read the previous one (transaction {})",
                    prev.meta.txnid
                ));
                report.damage.extend(d);
                dbs = older;
                snapshot = prev;
                report.previous_snapshot = true;
            }
        }
    }
    report.txnid = snapshot.meta.txnid;
    let codec = codec_from(snapshot, dbs.get("meta"), &mut report.damage);
    let (places, entries) = places_and_entries(snapshot, &dbs, &mut report.damage);
    let (order, lost) = in_order(&places, &entries);
    let decode = |id: EntryId, bytes: &[u8]| -> Result<Vec<Attribute>, String> {
        codec
            .decode(id, Dn::root(), bytes)
            .map(|e| e.attrs)
            .map_err(|e| e.to_string())
    };
    for (_, id, dn, placeholder) in order {
        let attrs = if placeholder {
            match stand_in(&dn) {
                Some(a) => a,
                None => continue,
            }
        } else {
            match decode(id, &entries[&id]) {
                Ok(a) => a,
                Err(e) => {
                    report.unreadable.push((id, e));
                    continue;
                }
            }
        };
        out(Salvaged {
            dn: &dn,
            attrs: &attrs,
            placeholder,
        })
        .map_err(StoreError::from)?;
        if placeholder {
            report.placeholders.push((id, dn));
        } else {
            report.written += 1;
        }
    }
    for (id, why) in lost {
        match decode(id, &entries[&id]) {
            Ok(attrs) => report.orphans.push((id, why, attrs)),
            Err(e) => report.unreadable.push((id, e)),
        }
    }
    Ok(report)
}

/// Every entry read, with its DN, parents first ((depth, id) order), and
/// placeholders for lost parents of entries that were read (so what
/// survived below them can be imported), each marked `true`; and the
/// entries whose DN cannot be made, with why.
#[allow(clippy::type_complexity)]
fn in_order(
    places: &HashMap<EntryId, Placement>,
    entries: &BTreeMap<EntryId, Vec<u8>>,
) -> (Vec<(usize, EntryId, String, bool)>, Vec<(EntryId, String)>) {
    // DNs, parents first: (depth, id) order.
    let mut placed: Vec<(usize, EntryId, String)> = Vec::new();
    let mut lost: Vec<(EntryId, String)> = Vec::new();
    for &id in entries.keys() {
        match dn_of(id, places, entries) {
            Ok((depth, dn)) => placed.push((depth, id, dn)),
            Err(why) => lost.push((id, why)),
        }
    }
    // Lost parents of entries that were read: placeholders, so that what
    // survived below them can be imported.
    let mut stand_ins: BTreeMap<EntryId, (usize, String)> = BTreeMap::new();
    for (_, id, _) in &placed {
        let mut cur = places[id].parent;
        while cur != 0 && !entries.contains_key(&cur) && !stand_ins.contains_key(&cur) {
            match dn_of(cur, places, entries) {
                Ok(found) => {
                    stand_ins.insert(cur, found);
                }
                Err(_) => break,
            }
            cur = places.get(&cur).map_or(0, |p| p.parent);
        }
    }
    let mut order: Vec<(usize, EntryId, String, bool)> = placed
        .into_iter()
        .map(|(d, id, dn)| (d, id, dn, false))
        .chain(stand_ins.into_iter().map(|(id, (d, dn))| (d, id, dn, true)))
        .collect();
    order.sort();
    (order, lost)
}

/// A placeholder's attributes: its RDN's values, a structural class the
/// first RDN attribute suits, and extensibleObject (which allows the rest).
fn stand_in(dn: &str) -> Option<Vec<Attribute>> {
    let dn = Dn::parse(dn).ok()?;
    let rdn = dn.rdn()?;
    let structural: &[u8] = match rdn.avas.first()?.attr.to_ascii_lowercase().as_str() {
        "dc" => b"domain",
        "o" => b"organization",
        "ou" => b"organizationalUnit",
        "c" => b"country",
        "l" => b"locality",
        "cn" => b"device",
        "uid" => b"account",
        _ => b"extensibleObject",
    };
    let mut classes = vec![b"top".to_vec(), structural.to_vec()];
    if structural != b"extensibleObject" {
        classes.push(b"extensibleObject".to_vec());
    }
    let mut attrs = vec![Attribute {
        desc: "objectClass".into(),
        values: classes,
    }];
    for ava in &rdn.avas {
        attrs.push(Attribute {
            desc: ava.attr.clone(),
            values: vec![ava.value.clone()],
        });
    }
    Some(attrs)
}

/// Records of one database keyed by entry ID.
fn records(
    f: &DataFile<'_, std::fs::File>,
    dbs: &BTreeMap<String, DbRecord>,
    name: &str,
    damage: &mut Vec<String>,
    visit: &mut dyn FnMut(EntryId, &[u8]),
) {
    let Some(db) = dbs.get(name) else {
        damage.push(format!("the '{name}' database is missing"));
        return;
    };
    f.records(name, db, damage, &mut |k, v| {
        if let Ok(id) = <[u8; 8]>::try_from(k) {
            visit(u64::from_be_bytes(id), v);
        }
    });
}

/// The entry codec with the dictionaries the `meta` database still holds.
fn codec_from(
    f: &DataFile<'_, std::fs::File>,
    meta: Option<&DbRecord>,
    damage: &mut Vec<String>,
) -> entry_codec::Codec {
    let codec = entry_codec::Codec::new(None);
    let Some(meta) = meta else {
        damage.push("the 'meta' database is missing: compressed entries cannot be read".into());
        return codec;
    };
    let mut unusable = Vec::new();
    f.records("meta", meta, damage, &mut |k, v| {
        if let Some(id) = k
            .strip_prefix(b"zstd_dict:")
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<u32>().ok())
        {
            // Only read with: how it was trained matters to writes alone.
            if let Err(e) = codec.add_dict(id, v.to_vec(), false, false) {
                unusable.push(format!("{e}: entries compressed with it cannot be read"));
            }
        }
    });
    damage.extend(unusable);
    codec
}

/// An entry's DN from the placements, and its depth; or why it is lost.
fn dn_of(
    id: EntryId,
    places: &HashMap<EntryId, Placement>,
    entries: &BTreeMap<EntryId, Vec<u8>>,
) -> Result<(usize, String), String> {
    let mut rdns: Vec<&str> = Vec::new();
    let mut cur = id;
    loop {
        let Some(p) = places.get(&cur) else {
            return Err(if cur == id {
                "its placement (id2parent record) is lost".into()
            } else {
                format!(
                    "RDN path '{}' leads to entry {cur}, whose placement is lost",
                    rdns.join(",")
                )
            });
        };
        rdns.push(&p.rdn);
        if p.parent == 0 {
            break;
        }
        if !entries.contains_key(&p.parent) && !places.contains_key(&p.parent) {
            return Err(format!(
                "RDN path '{}' leads to entry {}, which is lost",
                rdns.join(","),
                p.parent
            ));
        }
        if rdns.len() > 512 {
            return Err("its parents form a loop".into());
        }
        cur = p.parent;
    }
    Ok((rdns.len(), rdns.join(",")))
}
