//! Multi-provider conflict resolution (`replication.multi_provider`),
//! attribute by attribute.
//!
//! Every provider takes writes, so two copies of an entry can change at
//! once. Each entry carries its replication state in `pandoAttributeCSN`
//! (stored, operational, sent only to consumers that name it): for each
//! attribute type changed since the entry was made, the CSN of its last
//! change and the CSN of the change it overwrote (`mail <csn> <prev>`),
//! `@dn <csn> <prev>` for the entry's name, and `* <csn> -`, the base: the
//! CSN every other attribute was last set at. An entry without the
//! attribute (written before multi-provider, or sent by OpenLDAP) is taken
//! as set whole at its entryCSN.
//!
//! [`merge`] makes one entry of the copy held and a copy received: for
//! every type, the values of the side whose change has the greater CSN
//! (a tie, only possible between copies that carry no state, goes to the
//! greater values). The result depends only on the two copies, not on
//! which is held, so servers that receive the same changes in any order
//! end equal. A side's values lost to the other's are a conflict
//! ([`Loss`]) when the winning change did not overwrite them knowingly:
//! its `prev` is older than the losing change.
//!
//! When either copy carries no state (sent by OpenLDAP, which keeps none;
//! or never changed since it was added) the copy with the greater
//! entryCSN wins whole, its name included, as OpenLDAP resolves on its
//! side, so a ring of Pando and slapd ends alike on both. Between Pando
//! servers alone this is the same outcome as type by type (a copy without
//! state there is one never changed). With slapd and two or more Pando
//! servers in one ring, concurrent changes of one entry can leave the
//! Pando servers different (whole and type by type do not commute); each
//! loss is on the conflict record.

use std::collections::BTreeMap;

use pando_model::Entry;

/// The attribute holding an entry's replication state.
pub const STATE_ATTR: &str = "pandoAttributeCSN";

/// The state's key for the entry's name.
const DN_KEY: &str = "@dn";

/// The state's key for the base CSN.
const BASE_KEY: &str = "*";

/// Attributes not merged type by type: the stamps of the entry's newest
/// change, its UUID, and the state itself (all lowercase).
const ENTRY_LEVEL: [&str; 8] = [
    "entrycsn",
    "entryuuid",
    "modifiersname",
    "modifytimestamp",
    "creatorsname",
    "createtimestamp",
    "structuralobjectclass",
    "pandoattributecsn",
];

/// The last change of one attribute type (or of the name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub csn: String,
    /// The change it overwrote; empty: not known.
    pub prev: String,
}

/// An entry's replication state (see the module header).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    base: String,
    types: BTreeMap<String, Stamp>,
}

fn entry_csn(entry: &Entry) -> String {
    crate::write::change::entry_csn(entry)
        .unwrap_or_default()
        .to_string()
}

impl State {
    /// The state `entry` carries; without one, everything set at its
    /// entryCSN.
    pub fn of(entry: &Entry) -> State {
        let mut state = State::default();
        let mut base = None;
        for v in entry.values(STATE_ATTR) {
            let text = String::from_utf8_lossy(v);
            let mut parts = text.split(' ');
            let (Some(key), Some(csn)) = (parts.next(), parts.next()) else {
                continue;
            };
            let prev = parts.next().filter(|p| *p != "-").unwrap_or("");
            if key == BASE_KEY {
                base = Some(csn.to_string());
            } else {
                state.types.insert(
                    key.to_ascii_lowercase(),
                    Stamp {
                        csn: csn.to_string(),
                        prev: prev.to_string(),
                    },
                );
            }
        }
        state.base = base.unwrap_or_else(|| entry_csn(entry));
        state
    }

    /// The CSN every attribute without a stamp of its own was set at (for
    /// an entry never merged with a stateless copy: when it was added).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Every CSN the state names.
    pub fn csns(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.base.as_str()).chain(self.types.values().map(|s| s.csn.as_str()))
    }

    /// The last change of `key` (a lowercase type, or the name).
    pub fn stamp(&self, key: &str) -> Stamp {
        self.types.get(key).cloned().unwrap_or_else(|| Stamp {
            csn: self.base.clone(),
            prev: String::new(),
        })
    }

    /// Write the state into `entry` (replacing what it held), in its one
    /// canonical form: a type set at the base or before has no value of
    /// its own, and an entry set whole at its entryCSN carries none at all
    /// (servers holding equal entries hold equal states).
    pub fn store(&self, entry: &mut Entry) {
        entry.remove(STATE_ATTR);
        let mut values = Vec::new();
        for (key, s) in &self.types {
            if s.csn <= self.base {
                continue;
            }
            let prev = if s.prev.is_empty() { "-" } else { &s.prev };
            values.push(format!("{key} {} {prev}", s.csn).into_bytes());
        }
        if values.is_empty() && self.base == entry_csn(entry) {
            return;
        }
        values.insert(0, format!("{BASE_KEY} {} -", self.base).into_bytes());
        entry.add_values(STATE_ATTR, values);
    }
}

/// The lowercase attribute types of `entry` that are merged one by one.
fn merged_types(entry: &Entry) -> impl Iterator<Item = String> + '_ {
    entry
        .attrs
        .iter()
        .map(|a| a.desc.to_ascii_lowercase())
        .filter(|d| !ENTRY_LEVEL.contains(&d.as_str()))
}

fn values_of<'e>(entry: &'e Entry, key: &str) -> &'e [Vec<u8>] {
    entry
        .attrs
        .iter()
        .find(|a| a.desc.eq_ignore_ascii_case(key))
        .map_or(&[], |a| a.values.as_slice())
}

/// Values in a comparable order (their order carries no meaning).
fn sorted(values: &[Vec<u8>]) -> Vec<&Vec<u8>> {
    let mut v: Vec<&Vec<u8>> = values.iter().collect();
    v.sort();
    v
}

/// Values compared as sets.
fn same_values(a: &[Vec<u8>], b: &[Vec<u8>]) -> bool {
    sorted(a) == sorted(b)
}

/// A client's write on this server, stamped `csn`: the state of `after`
/// records the types (and the name) that differ from `before` (None: an
/// add, whose base is `csn`).
pub fn record_write(before: Option<&Entry>, after: &mut Entry, csn: &str) {
    let Some(before) = before else {
        State {
            base: csn.to_string(),
            types: BTreeMap::new(),
        }
        .store(after);
        return;
    };
    let mut state = State::of(before);
    let mut keys: Vec<String> = merged_types(before).chain(merged_types(after)).collect();
    keys.sort();
    keys.dedup();
    let mut touched: Vec<String> = keys
        .into_iter()
        .filter(|k| !same_values(values_of(before, k), values_of(after, k)))
        .collect();
    if before.dn != after.dn {
        touched.push(DN_KEY.to_string());
    }
    for key in touched {
        let prev = state.stamp(&key).csn;
        state.types.insert(
            key,
            Stamp {
                csn: csn.to_string(),
                prev,
            },
        );
    }
    state.store(after);
}

/// Which copy a conflict's losing values came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The copy held here.
    Here,
    /// The copy received.
    Received,
}

/// Values one side lost to a concurrent change of the other (see the
/// module header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    /// The attribute type, or `@dn` for the entry's name.
    pub attr: String,
    /// The values lost (empty: the attribute's absence; for the name, the
    /// DN lost).
    pub values: Vec<Vec<u8>>,
    pub side: Side,
    pub lost_csn: String,
    pub won_csn: String,
}

/// The merge of two copies of one entry (same entryUUID).
pub struct Merged {
    pub entry: Entry,
    pub losses: Vec<Loss>,
}

/// The side whose change of a type wins: the greater CSN; on a tie the
/// greater values, so the outcome is the same whichever copy is held.
fn received_wins(here: &Stamp, got: &Stamp, here_vals: &[Vec<u8>], got_vals: &[Vec<u8>]) -> bool {
    if got.csn != here.csn {
        return got.csn > here.csn;
    }
    sorted(got_vals) > sorted(here_vals)
}

/// A lost change is a conflict when the winner did not overwrite it
/// knowingly (its `prev` is older). A winner without history (a copy
/// set whole at its entryCSN, as OpenLDAP sends every entry) may or may
/// not have seen the change it replaces: a change recorded here (it has
/// a `prev`) from another server than the winner's is counted, as a
/// possible conflict, rather than lost unseen.
///
/// A copy with state that won whole over one without (see [`merge`]):
/// a value of the winner set before the loser's change was not set
/// knowing it (`winner_whole_with_state`).
fn is_conflict(winner: &Stamp, loser: &Stamp, winner_whole_with_state: bool) -> bool {
    if winner.prev.is_empty() && winner_whole_with_state {
        return loser.csn > winner.csn;
    }
    if winner.prev.is_empty() {
        let sid = pando_proto::sync::csn_sid;
        return !loser.prev.is_empty() && sid(&winner.csn) != sid(&loser.csn);
    }
    loser.csn > winner.prev
}

/// The two copies being merged, with their states.
struct Pair<'e> {
    here: &'e Entry,
    got: &'e Entry,
    hs: State,
    gs: State,
    /// Either copy carries no state: they are resolved whole ([`merge`]).
    whole: bool,
}

/// How one key (an attribute type, or the name) is resolved.
struct Decision {
    /// The received copy's values win.
    take: bool,
    winner: Stamp,
    loser: Stamp,
    /// The losing values are a conflict (if they differ).
    conflict: bool,
}

impl<'e> Pair<'e> {
    fn new(here: &'e Entry, got: &'e Entry) -> Pair<'e> {
        let with_state = |e: &Entry| e.get(STATE_ATTR).is_some();
        Pair {
            here,
            got,
            hs: State::of(here),
            gs: State::of(got),
            whole: !with_state(here) || !with_state(got),
        }
    }

    /// Resolve `key` (values `hv` here, `gv` received).
    fn decide(&self, key: &str, hv: &[Vec<u8>], gv: &[Vec<u8>]) -> Decision {
        let (h, g) = (self.hs.stamp(key), self.gs.stamp(key));
        let take = if self.whole {
            let at = |e: &Entry| Stamp {
                csn: entry_csn(e),
                prev: String::new(),
            };
            received_wins(&at(self.here), &at(self.got), hv, gv)
        } else {
            received_wins(&h, &g, hv, gv)
        };
        let winner_copy = if take { self.got } else { self.here };
        let whole_with_state = self.whole && winner_copy.get(STATE_ATTR).is_some();
        let (winner, loser) = if take { (g, h) } else { (h, g) };
        let conflict = is_conflict(&winner, &loser, whole_with_state);
        Decision {
            take,
            winner,
            loser,
            conflict,
        }
    }
}

/// Merge the copy held here with a copy received (see the module
/// header). The entry-level stamps (entryCSN, modifiersName,
/// modifyTimestamp) come from the copy with the greater entryCSN.
///
/// When either copy carries no state (sent by a server that keeps none,
/// as OpenLDAP, or not changed since it was made), the copy with the
/// greater entryCSN wins whole, its name included: OpenLDAP resolves so
/// on its side, and a mixed ring ends alike on both (a rename there and a
/// modify here kept both here and neither there). Between copies with
/// state (Pando's own), the rules of the module header.
pub fn merge(here: &Entry, got: &Entry) -> Merged {
    let pair = Pair::new(here, got);
    let (hs, gs) = (&pair.hs, &pair.gs);
    let mut out = here.clone();
    let mut state = State {
        base: hs.base.clone().max(gs.base.clone()),
        types: BTreeMap::new(),
    };
    let mut losses = Vec::new();
    let mut keys: Vec<String> = merged_types(here)
        .chain(merged_types(got))
        .chain(hs.types.keys().cloned())
        .chain(gs.types.keys().cloned())
        .filter(|k| k != DN_KEY)
        .collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let (hv, gv) = (values_of(here, &key), values_of(got, &key));
        let d = pair.decide(&key, hv, gv);
        let (lost, side) = if d.take {
            (hv, Side::Here)
        } else {
            (gv, Side::Received)
        };
        if !same_values(hv, gv) && d.conflict {
            losses.push(Loss {
                attr: key.clone(),
                values: lost.to_vec(),
                side,
                lost_csn: d.loser.csn.clone(),
                won_csn: d.winner.csn.clone(),
            });
        }
        if d.take && !same_values(hv, gv) {
            let desc = got
                .attrs
                .iter()
                .find(|a| a.desc.eq_ignore_ascii_case(&key))
                .map_or(key.clone(), |a| a.desc.clone());
            out.remove(&key);
            if !gv.is_empty() {
                out.add_values(&desc, gv.to_vec());
            }
        }
        if key == "objectclass" && d.take {
            if let Some(a) = got.get("structuralObjectClass") {
                let a = a.clone();
                out.remove("structuralObjectClass");
                out.add_values("structuralObjectClass", a.values);
            }
        }
        state.types.insert(key, d.winner);
    }
    // The name.
    let (hd, gd) = (here.dn.to_string(), got.dn.to_string());
    let d = pair.decide(
        DN_KEY,
        &[hd.clone().into_bytes()],
        &[gd.clone().into_bytes()],
    );
    if hd != gd && d.conflict {
        losses.push(Loss {
            attr: DN_KEY.to_string(),
            values: vec![if d.take { hd } else { gd }.into_bytes()],
            side: if d.take { Side::Here } else { Side::Received },
            lost_csn: d.loser.csn.clone(),
            won_csn: d.winner.csn.clone(),
        });
    }
    if d.take {
        out.dn = got.dn.clone();
    }
    state.types.insert(DN_KEY.to_string(), d.winner);
    keep_rdn_values(&mut out);
    // Entry-level stamps follow the newest change.
    if entry_csn(got) > entry_csn(here) {
        for name in ["entryCSN", "modifiersName", "modifyTimestamp"] {
            out.remove(name);
            if let Some(a) = got.get(name) {
                out.add_values(name, a.values.clone());
            }
        }
    }
    if pair.whole {
        // Whole copies: the state of the copy that won (none when it has
        // none), not a mix of both.
        state = if entry_csn(got) > entry_csn(here) {
            gs.clone()
        } else {
            hs.clone()
        };
    }
    state.store(&mut out);
    Merged { entry: out, losses }
}

/// The values of the entry's RDN stay among its attributes (a name taken
/// from one side, attributes from the other).
fn keep_rdn_values(entry: &mut Entry) {
    let Some(rdn) = entry.dn.rdns.first().cloned() else {
        return;
    };
    for ava in rdn.avas {
        let held = values_of(entry, &ava.attr)
            .iter()
            .any(|v| v.eq_ignore_ascii_case(&ava.value));
        if !held {
            entry.add_values(&ava.attr, vec![ava.value.clone()]);
        }
    }
}

#[cfg(test)]
mod tests;
