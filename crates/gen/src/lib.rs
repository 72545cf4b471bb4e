//! MakeLDIF-compatible test-data generator.
//!
//! A template (the OpenDS/OpenDJ MakeLDIF language: `define`, `branch:`,
//! `template:` blocks with `<tags>` and `{attr}` references) is compiled once
//! by [`Template::parse`]; [`generate`] then streams LDIF to a writer. Nothing
//! but the current entry and a stack of `(parent DN, subordinate, count)`
//! frames is held in memory, so a hundred million entries cost the same
//! memory as ten. Parents are always written before their children.
//!
//! Output is a pure function of (template, seed, defines): the PRNG is a
//! xoshiro256** written here, not a dependency whose stream could change,
//! and there is no clock or file access. `<file:NAME>` only reaches the
//! built-in lists (`first.names`, `last.names`, `cities`, `states`,
//! `streets`, `months`), so a template cannot read files on the host.
//!
//! Differences from MakeLDIF worth knowing: `{attr}` may refer to a line
//! further down (lines run in dependency order, output keeps template
//! order); a line whose value comes out empty is left out (LDAP values may
//! not be empty for most syntaxes); `<RDN>` is an extra tag; there is no
//! `<GenerationTime>` and no `include`.

mod data;
mod rng;
mod template;

use std::fmt;
use std::io::{self, Write};

use pando_ldif::append_line as put_line;

use rng::Rng;
use template::{Body, Compiled, DnKind, Piece, Sub};

pub use pando_ldif::DEFAULT_WRAP;

const EXAMPLE: &str = include_str!("../templates/example.template");
const TELCO: &str = include_str!("../templates/telco.template");

/// Text of a template shipped with Pando: `"example"` (the classic MakeLDIF
/// people template) or `"telco"` (subscribers, devices and groups).
pub fn builtin(name: &str) -> Option<&'static str> {
    match name {
        "example" | "example.template" => Some(EXAMPLE),
        "telco" | "telco.template" => Some(TELCO),
        _ => None,
    }
}

/// Defaults: seed 0, no overrides, no folding.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Same seed, template and defines give byte-identical output.
    pub seed: u64,
    /// `-D name=value`: replaces (or adds) a template `define`.
    pub defines: Vec<(String, String)>,
    /// Fold LDIF lines longer than this many bytes; `None` never folds.
    pub wrap: Option<usize>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Debug)]
pub enum GenError {
    /// A problem in the template, found while parsing it or while
    /// generating (e.g. an RDN attribute left out by `<presence>`).
    Template {
        origin: String,
        line: usize,
        message: String,
    },
    /// A `-D name=value` the template neither defines nor uses.
    UnknownDefine {
        origin: String,
        name: String,
        /// The names the template defines.
        known: Vec<String>,
    },
    Io(io::Error),
}

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenError::Template {
                origin,
                line,
                message,
            } => write!(f, "{origin}:{line}: {message}"),
            GenError::UnknownDefine {
                origin,
                name,
                known,
            } => write!(
                f,
                "-D {name}: {origin} neither defines nor uses it (its defines: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
            GenError::Io(e) => write!(f, "writing LDIF: {e}"),
        }
    }
}

impl std::error::Error for GenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GenError::Io(e) => Some(e),
            GenError::Template { .. } | GenError::UnknownDefine { .. } => None,
        }
    }
}

impl From<io::Error> for GenError {
    fn from(e: io::Error) -> Self {
        GenError::Io(e)
    }
}

/// A parsed template. Keeps its source so `-D` overrides can recompile it.
pub struct Template {
    source: String,
    origin: String,
    compiled: Compiled,
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Template")
            .field("origin", &self.origin)
            .field("branches", &self.compiled.branches.len())
            .field(
                "templates",
                &self
                    .compiled
                    .templates
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Template {
    /// Parses and checks `text`; `origin` (usually the file name) prefixes
    /// every error as `origin:line: message`.
    pub fn parse(text: &str, origin: &str) -> Result<Template, GenError> {
        let compiled = template::compile(text, origin, &[])?;
        Ok(Template {
            source: text.to_string(),
            origin: origin.to_string(),
            compiled,
        })
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Number of entries [`generate`] writes with the template's own
    /// defines (saturating), e.g. for a progress display.
    pub fn entry_count(&self) -> u64 {
        count_entries(&self.compiled)
    }
}

fn count_entries(c: &Compiled) -> u64 {
    // Subordinate graphs are acyclic (checked at compile time); memoise so
    // wide diamonds stay cheap.
    fn size(c: &Compiled, t: usize, memo: &mut Vec<Option<u64>>) -> u64 {
        if let Some(n) = memo[t] {
            return n;
        }
        let n = subs_size(c, &c.templates[t].subs, memo).saturating_add(1);
        memo[t] = Some(n);
        n
    }
    fn subs_size(c: &Compiled, subs: &[Sub], memo: &mut Vec<Option<u64>>) -> u64 {
        subs.iter().fold(0u64, |acc, s| {
            acc.saturating_add(s.count.saturating_mul(size(c, s.template, memo)))
        })
    }
    let mut memo = vec![None; c.templates.len()];
    c.branches.iter().fold(0u64, |acc, b| {
        acc.saturating_add(subs_size(c, &b.subs, &mut memo).saturating_add(1))
    })
}

/// Writes the LDIF for `t` to `out` (give it a `BufWriter`; each entry is
/// one `write_all`). Returns what was written.
pub fn generate<W: Write>(t: &Template, opts: &Options, out: &mut W) -> Result<Stats, GenError> {
    let owned;
    let c = if opts.defines.is_empty() {
        &t.compiled
    } else {
        owned = template::compile(&t.source, &t.origin, &opts.defines)?;
        &owned
    };
    let mut g = Gen {
        c,
        origin: &t.origin,
        rng: Rng::new(opts.seed),
        wrap: opts.wrap,
        counters: c.counter_starts.clone(),
        vbuf: Vec::with_capacity(4096),
        vals: Vec::with_capacity(64),
        dn: Vec::with_capacity(256),
        comps: Vec::with_capacity(16),
        out: Vec::with_capacity(4096),
        logical: Vec::with_capacity(256),
        stats: Stats::default(),
    };

    /// Pending children of one parent: the parent's DN, its subordinate
    /// list, which entry of it is current and how many remain.
    struct Frame<'c> {
        parent: Vec<u8>,
        subs: &'c [Sub],
        idx: usize,
        remaining: u64,
    }
    let mut stack: Vec<Frame> = Vec::new();
    for b in &c.branches {
        g.entry(&b.body, None, b.dn.as_bytes(), b.parent.as_bytes(), out)?;
        if let Some(first) = b.subs.first() {
            g.enter(first.template);
            stack.push(Frame {
                parent: b.dn.as_bytes().to_vec(),
                subs: &b.subs,
                idx: 0,
                remaining: first.count,
            });
        }
        while let Some(top) = stack.last_mut() {
            if top.remaining == 0 {
                top.idx += 1;
                match top.subs.get(top.idx) {
                    Some(s) => {
                        top.remaining = s.count;
                        g.enter(s.template);
                    }
                    None => {
                        stack.pop();
                    }
                }
                continue;
            }
            top.remaining -= 1;
            let ti = top.subs[top.idx].template;
            let tm = &c.templates[ti];
            g.entry(&tm.body, Some(ti), b"", &top.parent, out)?;
            if let Some(first) = tm.subs.first() {
                g.enter(first.template);
                let parent = g.dn.clone();
                stack.push(Frame {
                    parent,
                    subs: &tm.subs,
                    idx: 0,
                    remaining: first.count,
                });
            }
        }
    }
    Ok(g.stats)
}

const ABSENT: (usize, usize) = (usize::MAX, 0);

struct Gen<'c> {
    c: &'c Compiled,
    origin: &'c str,
    rng: Rng,
    wrap: Option<usize>,
    /// Current value of every `<sequential>` counter.
    counters: Vec<i64>,
    /// Values of the current entry, back to back. Reused.
    vbuf: Vec<u8>,
    /// Per template line: its value's range in `vbuf`, or ABSENT.
    vals: Vec<(usize, usize)>,
    /// DN of the current entry (empty until built).
    dn: Vec<u8>,
    /// Scratch: RDN ranges of a DN being cut up by `<DN:n>`.
    comps: Vec<(usize, usize)>,
    /// The LDIF record being assembled. Reused.
    out: Vec<u8>,
    logical: Vec<u8>,
    stats: Stats,
}

impl Gen<'_> {
    /// A new parent starts a run of template `t`: reset its resetting
    /// sequential counters.
    fn enter(&mut self, t: usize) {
        for &k in &self.c.templates[t].resets {
            self.counters[k] = self.c.counter_starts[k];
        }
    }

    fn err(&self, line: usize, message: String) -> GenError {
        GenError::Template {
            origin: self.origin.to_string(),
            line,
            message,
        }
    }

    /// First value of `slot` in the current entry.
    fn first_value(vals: &[(usize, usize)], body: &Body, slot: usize) -> Option<(usize, usize)> {
        body.slot_lines[slot]
            .iter()
            .map(|&l| vals[l])
            .find(|v| v.0 != usize::MAX)
    }

    /// Builds `self.dn` from the RDN attributes of template `ti`.
    fn build_dn(&mut self, body: &Body, ti: usize, parent: &[u8]) -> Result<(), GenError> {
        let t = &self.c.templates[ti];
        self.dn.clear();
        for (k, &slot) in t.rdn.iter().enumerate() {
            let Some((s, e)) = Self::first_value(&self.vals, body, slot) else {
                return Err(self.err(
                    t.line,
                    format!(
                        "template {}: RDN attribute {} got no value for an entry under {}",
                        t.name,
                        t.rdn_names[k],
                        String::from_utf8_lossy(parent)
                    ),
                ));
            };
            if k > 0 {
                self.dn.push(b'+');
            }
            self.dn.extend_from_slice(t.rdn_names[k].as_bytes());
            self.dn.push(b'=');
            escape_dn_value(&mut self.dn, &self.vbuf[s..e]);
        }
        if !parent.is_empty() {
            self.dn.push(b',');
            self.dn.extend_from_slice(parent);
        }
        Ok(())
    }

    /// Generates and writes one entry. `ti` is the template (None for a
    /// branch, whose DN is `fixed_dn`).
    fn entry<W: Write>(
        &mut self,
        body: &Body,
        ti: Option<usize>,
        fixed_dn: &[u8],
        parent: &[u8],
        w: &mut W,
    ) -> Result<(), GenError> {
        self.vbuf.clear();
        self.vals.clear();
        self.vals.resize(body.lines.len(), ABSENT);
        self.dn.clear();
        self.dn.extend_from_slice(fixed_dn);
        let mut dn_ready = ti.is_none();

        for &li in &body.order {
            let line = &body.lines[li];
            let start = self.vbuf.len();
            let mut keep = true;
            for p in &line.pieces {
                match p {
                    Piece::Ref { slot, chars } => {
                        if let Some((s, e)) = Self::first_value(&self.vals, body, *slot) {
                            let e = match chars {
                                Some(n) => char_prefix_end(&self.vbuf[s..e], *n) + s,
                                None => e,
                            };
                            self.vbuf.extend_from_within(s..e);
                        }
                    }
                    Piece::Dn { kind, n } => {
                        // The entry's own DN is built when first needed
                        // (its RDN values come before it in `order`).
                        let own = !matches!(kind, DnKind::Parent | DnKind::UnderscoreParent);
                        if own && !dn_ready {
                            if let Some(ti) = ti {
                                self.build_dn(body, ti, parent)?;
                            }
                            dn_ready = true;
                        }
                        self.push_dn(*kind, *n, parent);
                    }
                    Piece::Presence(p) => {
                        if self.rng.unit() >= *p {
                            keep = false;
                            break;
                        }
                    }
                    Piece::IfPresent { slot, value, want } => {
                        let present = match value {
                            None => Self::first_value(&self.vals, body, *slot).is_some(),
                            Some(v) => body.slot_lines[*slot].iter().any(|&l| {
                                let (s, e) = self.vals[l];
                                s != usize::MAX && self.vbuf[s..e] == v[..]
                            }),
                        };
                        if present != *want {
                            keep = false;
                            break;
                        }
                    }
                    other => self.push_generated(other),
                }
            }
            if keep && self.vbuf.len() > start {
                self.vals[li] = (start, self.vbuf.len());
            } else {
                self.vbuf.truncate(start);
            }
        }
        if !dn_ready {
            if let Some(ti) = ti {
                self.build_dn(body, ti, parent)?;
            }
        }

        self.write_entry(body, w)
    }

    /// Append the value a generating piece makes (text, a counter, a
    /// random pick) to `vbuf`, drawing from the generator as it goes.
    fn push_generated(&mut self, p: &Piece) {
        match p {
            Piece::Text(t) => self.vbuf.extend_from_slice(t),
            Piece::Pick(list) => {
                let i = self.rng.below(list.len() as u64) as usize;
                self.vbuf.extend_from_slice(list[i].as_bytes());
            }
            Piece::PickSeq { list, counter } => {
                let n = &mut self.counters[*counter];
                let i = n.rem_euclid(list.len() as i64) as usize;
                *n = n.wrapping_add(1);
                self.vbuf.extend_from_slice(list[i].as_bytes());
            }
            Piece::Seq { counter } => {
                let n = &mut self.counters[*counter];
                push_int(&mut self.vbuf, *n, 0);
                *n = n.wrapping_add(1);
            }
            Piece::Chars { set, min, max } => {
                let len = if min == max {
                    *min
                } else {
                    min + self.rng.below((max - min + 1) as u64) as usize
                };
                let n = set.len() as u64;
                for _ in 0..len {
                    self.vbuf.push(set[self.rng.below(n) as usize]);
                }
            }
            Piece::Number { lo, hi, width } => {
                let v = self.rng.range_i64(*lo, *hi);
                push_int(&mut self.vbuf, v, *width);
            }
            Piece::Telephone => {
                self.vbuf.extend_from_slice(b"+1 ");
                for (i, group) in [3, 3, 4].into_iter().enumerate() {
                    if i > 0 {
                        self.vbuf.push(b' ');
                    }
                    for _ in 0..group {
                        self.vbuf.push(b'0' + self.rng.below(10) as u8);
                    }
                }
            }
            Piece::Month(n) => {
                let m = data::MONTHS[self.rng.below(12) as usize].as_bytes();
                let len = n.map_or(m.len(), |n| n.min(m.len()));
                self.vbuf.extend_from_slice(&m[..len]);
            }
            Piece::List { items, cum } => {
                let total = cum.last().copied().unwrap_or(0);
                let r = self.rng.below(total);
                let i = cum.partition_point(|&c| c <= r).min(items.len() - 1);
                self.vbuf.extend_from_slice(&items[i]);
            }
            Piece::Guid => {
                let a = self.rng.next_u64();
                // Version 4, RFC 4122 variant.
                let b = (self.rng.next_u64() & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
                let a = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
                let bytes = ((a as u128) << 64 | b as u128).to_be_bytes();
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        self.vbuf.push(b'-');
                    }
                    self.vbuf.push(HEX[(byte >> 4) as usize]);
                    self.vbuf.push(HEX[(byte & 15) as usize]);
                }
            }
            // Taken by `entry` itself: they read the entry being built.
            Piece::Ref { .. } | Piece::Dn { .. } | Piece::Presence(_) | Piece::IfPresent { .. } => {
            }
        }
    }

    /// Append what a `<DN>`-like tag takes from the entry's DN (built by
    /// then) or its parent's to `vbuf`.
    fn push_dn(&mut self, kind: DnKind, n: i32, parent: &[u8]) {
        let source: &[u8] = match kind {
            DnKind::Parent | DnKind::UnderscoreParent => parent,
            _ => &self.dn,
        };
        split_dn_bytes(source, &mut self.comps);
        let (sel, sep): (&[(usize, usize)], u8) = match kind {
            DnKind::Rdn => (&self.comps[..self.comps.len().min(1)], b','),
            DnKind::Parent => (&self.comps[..], b','),
            DnKind::UnderscoreParent => (&self.comps[..], b'_'),
            DnKind::Full | DnKind::Underscore => {
                let all = &self.comps[..];
                let k = n.unsigned_abs() as usize;
                let sel = if n == 0 {
                    all
                } else if n > 0 {
                    &all[..k.min(all.len())]
                } else {
                    &all[all.len().saturating_sub(k)..]
                };
                (sel, if kind == DnKind::Full { b',' } else { b'_' })
            }
        };
        for (i, &(s, e)) in sel.iter().enumerate() {
            if i > 0 {
                self.vbuf.push(sep);
            }
            self.vbuf.extend_from_slice(&source[s..e]);
        }
    }

    /// Write the entry built in `vbuf` and `dn` to `w` as one LDIF record.
    fn write_entry<W: Write>(&mut self, body: &Body, w: &mut W) -> Result<(), GenError> {
        self.out.clear();
        put_line(&mut self.out, &mut self.logical, b"dn", &self.dn, self.wrap);
        for (li, line) in body.lines.iter().enumerate() {
            let (s, e) = self.vals[li];
            if s != usize::MAX {
                put_line(
                    &mut self.out,
                    &mut self.logical,
                    line.name.as_bytes(),
                    &self.vbuf[s..e],
                    self.wrap,
                );
            }
        }
        self.out.push(b'\n');
        w.write_all(&self.out)?;
        self.stats.entries += 1;
        self.stats.bytes += self.out.len() as u64;
        Ok(())
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Byte length of the first `n` characters of UTF-8 `v`.
fn char_prefix_end(v: &[u8], n: usize) -> usize {
    let mut chars = 0;
    for (i, &b) in v.iter().enumerate() {
        if b & 0xC0 != 0x80 {
            if chars == n {
                return i;
            }
            chars += 1;
        }
    }
    v.len()
}

/// Decimal `v`, zero-padded to `width` digits.
fn push_int(out: &mut Vec<u8>, v: i64, width: usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    let digits = buf.len() - i;
    for _ in digits..width {
        out.push(b'0');
    }
    out.extend_from_slice(&buf[i..]);
}

/// RFC 4514 escaping of an attribute value inside a DN.
fn escape_dn_value(out: &mut Vec<u8>, v: &[u8]) {
    for (i, &b) in v.iter().enumerate() {
        match b {
            b'"' | b'+' | b',' | b';' | b'<' | b'>' | b'\\' => {
                out.push(b'\\');
                out.push(b);
            }
            b'#' if i == 0 => out.extend_from_slice(b"\\#"),
            b' ' if i == 0 || i == v.len() - 1 => out.extend_from_slice(b"\\ "),
            0 => out.extend_from_slice(b"\\00"),
            _ => out.push(b),
        }
    }
}

/// RDN ranges of `dn`, split at unescaped commas.
fn split_dn_bytes(dn: &[u8], out: &mut Vec<(usize, usize)>) {
    out.clear();
    if dn.is_empty() {
        return;
    }
    let (mut start, mut i) = (0, 0);
    while i < dn.len() {
        match dn[i] {
            b'\\' => i += 1,
            b',' => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push((start.min(dn.len()), dn.len()));
}

#[cfg(test)]
mod tests;
