//! Reading and checking the LMDB data file without trusting it.
//!
//! LMDB follows the page numbers and offsets it finds in its file without
//! checking them: a damaged file (a power cut in `none` mode, a torn copy, a
//! bad disk) can make it read outside a page or past the end of the file and
//! take the process down. Everything here reads the file with plain reads
//! (never the memory map) and checks every page it uses — type, number,
//! bounds, key order, depth, overflow runs — so a command can tell a damaged
//! store from a good one before handing it to LMDB, and salvage what is
//! still readable from one that is damaged.
//!
//! The layout is LMDB's (liblmdb 0.9 as bundled by `lmdb-master-sys`, 64-bit
//! little-endian): two meta pages, then branch, leaf and overflow pages of
//! B+trees. A committed snapshot accounts for every page below its
//! `last_pg` exactly once: used by a tree or listed in the free list.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

const MAGIC: u32 = 0xBEEF_C0DE;
const DATA_VERSION: u32 = 1;
const PAGE_HEADER: usize = 16;
const NODE_HEADER: usize = 8;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_META: u16 = 0x08;
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
const F_DUPDATA: u16 = 0x04;
const NO_ROOT: u64 = u64::MAX;
/// In-memory page states (dirty, loose, keep) that may linger in a header.
const IGNORED_FLAGS: u16 = 0x10 | 0x4000 | 0x8000;
/// LMDB's cursors hold at most 32 levels (CURSOR_STACK); a deeper tree
/// record is damage. (Bounds the walk's recursion too.)
const MAX_DEPTH: u16 = 32;

/// The databases every Pando store has.
pub const REQUIRED: [&str; 4] = ["meta", "id2entry", "dn2id", "id2parent"];

/// Where the bytes come from: the file, or a buffer (tests, fuzzing).
pub trait Source {
    fn size(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Source for File {
    fn size(&self) -> u64 {
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, offset)
    }
}

impl Source for [u8] {
    fn size(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
        {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// One B+tree's record: LMDB's `MDB_db`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbRecord {
    pub flags: u16,
    pub depth: u16,
    pub branch_pages: u64,
    pub leaf_pages: u64,
    pub overflow_pages: u64,
    pub entries: u64,
    pub root: u64,
}

impl DbRecord {
    const SIZE: usize = 48;

    fn parse(b: &[u8]) -> DbRecord {
        DbRecord {
            flags: u16_at(b, 4),
            depth: u16_at(b, 6),
            branch_pages: u64_at(b, 8),
            leaf_pages: u64_at(b, 16),
            overflow_pages: u64_at(b, 24),
            entries: u64_at(b, 32),
            root: u64_at(b, 40),
        }
    }
}

/// A meta page: the start of one committed snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub slot: usize,
    pub page_size: usize,
    pub free: DbRecord,
    pub main: DbRecord,
    pub last_page: u64,
    pub txnid: u64,
}

/// The data file, its meta pages read and checked.
pub struct DataFile<'s, S: Source + ?Sized> {
    src: &'s S,
    len: u64,
    /// The snapshot LMDB would open (the valid meta with the higher txnid).
    pub meta: Meta,
    /// The other snapshot, when its meta page is valid too.
    pub previous: Option<Meta>,
}

/// What a walk found wrong, in words that name the place.
pub type Damage = String;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn parse_meta(page: &[u8], slot: usize) -> Result<Meta, Damage> {
    if page.len() < PAGE_HEADER + 136 {
        return Err(format!("meta page {slot} is cut short"));
    }
    let flags = u16_at(page, 10);
    let m = &page[PAGE_HEADER..];
    if u32_at(m, 0) != MAGIC {
        return Err(format!(
            "meta page {slot} is not an LMDB meta page (bad magic)"
        ));
    }
    if u32_at(m, 4) != DATA_VERSION {
        return Err(format!(
            "meta page {slot} has LMDB data version {}, this build reads {DATA_VERSION}",
            u32_at(m, 4)
        ));
    }
    if flags & P_META == 0 || u64_at(page, 0) != slot as u64 {
        return Err(format!("meta page {slot} has a wrong page header"));
    }
    let free = DbRecord::parse(&m[24..24 + DbRecord::SIZE]);
    let main = DbRecord::parse(&m[24 + DbRecord::SIZE..24 + 2 * DbRecord::SIZE]);
    // The page size lives in the free list's record (`md_pad`).
    let page_size = u32_at(m, 24) as usize;
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(format!("meta page {slot} names a page size of {page_size}"));
    }
    let last_page = u64_at(m, 120);
    // LMDB page numbers stay far below this; a larger one is garbage (and
    // would overflow the arithmetic below).
    if last_page >= 1 << 48 {
        return Err(format!(
            "meta page {slot} names page {last_page} as the last"
        ));
    }
    // Transaction N writes meta page N % 2, and LMDB's readers find a
    // snapshot's databases by that rule: a meta page in the wrong slot
    // would have them read another snapshot's trees.
    let txnid = u64_at(m, 128);
    if txnid != 0 && txnid % 2 != slot as u64 {
        return Err(format!(
            "meta page {slot} holds transaction {txnid}, which belongs in meta page {}",
            txnid % 2
        ));
    }
    Ok(Meta {
        slot,
        page_size,
        free,
        main,
        last_page,
        txnid,
    })
}

/// Which pages a walk has seen: each may be used once.
pub struct PageSet {
    bits: Vec<u64>,
    pub count: u64,
}

impl PageSet {
    fn new(pages: u64) -> PageSet {
        PageSet {
            bits: vec![0; (pages as usize).div_ceil(64)],
            count: 0,
        }
    }
    /// Mark `pgno`; false when it was already marked.
    fn mark(&mut self, pgno: u64) -> bool {
        let (w, b) = ((pgno / 64) as usize, pgno % 64);
        let Some(word) = self.bits.get_mut(w) else {
            return false;
        };
        if *word & (1 << b) != 0 {
            return false;
        }
        *word |= 1 << b;
        self.count += 1;
        true
    }
}

/// What a leaf record's value is.
pub enum Value<'a> {
    /// Stored in the page.
    Inline(&'a [u8]),
    /// Stored in an overflow run, read and checked.
    Overflow(Vec<u8>),
    /// A named database's record (main database only).
    Database(DbRecord),
}

impl Value<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Value::Inline(b) => b,
            Value::Overflow(v) => v,
            Value::Database(_) => &[],
        }
    }
}

/// How a tree orders its keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    Bytes,
    /// The free list: native-endian integer keys.
    Integer,
}

struct Walker<'f, 's, S: Source + ?Sized> {
    file: &'f DataFile<'s, S>,
    meta: Meta,
    seen: PageSet,
    damage: Vec<Damage>,
    pages: [u64; 3],
    entries: u64,
}

impl<'s, S: Source + ?Sized> DataFile<'s, S> {
    /// Read both meta pages. Fails when neither is valid, or the newest
    /// one's snapshot cannot lie in the file.
    pub fn open(src: &'s S) -> Result<DataFile<'s, S>, Damage> {
        Self::open_with(src, false)
    }

    /// As [`DataFile::open`], but settles for one valid meta page (salvage).
    pub fn open_lenient(src: &'s S) -> Result<DataFile<'s, S>, Damage> {
        Self::open_with(src, true)
    }

    fn open_with(src: &'s S, lenient: bool) -> Result<DataFile<'s, S>, Damage> {
        let len = src.size();
        let read = |off: u64, n: usize| -> Option<Vec<u8>> {
            let mut b = vec![0u8; n];
            src.read_at(&mut b, off).ok().map(|()| b)
        };
        let head = read(0, PAGE_HEADER + 160).ok_or_else(|| {
            format!("the file is {len} bytes long: too short for LMDB's meta pages")
        })?;
        let first = parse_meta(&head, 0);
        // The second meta page sits one page further; without a readable
        // first page, try the usual page size.
        let psize = first.as_ref().map(|m| m.page_size).unwrap_or(4096);
        let second = read(psize as u64, PAGE_HEADER + 160)
            .ok_or_else(|| format!("the file is {len} bytes long: the second meta page is missing"))
            .and_then(|b| parse_meta(&b, 1));
        let (meta, previous) = match (first, second) {
            (Ok(a), Ok(b)) => {
                if a.page_size != b.page_size {
                    return Err("the two meta pages disagree on the page size".into());
                }
                if a.txnid >= b.txnid {
                    (a, Some(b))
                } else {
                    (b, Some(a))
                }
            }
            // LMDB refuses a file with either meta page invalid; so do we,
            // naming both problems.
            (Err(a), Err(b)) => return Err(format!("{a}; {b}")),
            (Err(_), Ok(m)) | (Ok(m), Err(_)) if lenient => (m, None),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
        };
        let f = DataFile {
            src,
            len,
            meta,
            previous,
        };
        match f.check_meta(&meta) {
            Ok(()) => Ok(f),
            Err(e) if lenient => f.previous_snapshot().ok_or(e),
            Err(e) => Err(e),
        }
    }

    fn check_meta(&self, m: &Meta) -> Result<(), Damage> {
        if m.last_page < 1 {
            return Err(format!("meta page {} says the file has no pages", m.slot));
        }
        for (name, db) in [("free list", &m.free), ("main database", &m.main)] {
            if db.root != NO_ROOT && (db.root < 2 || db.root > m.last_page) {
                return Err(format!(
                    "meta page {} (transaction {}): the {name}'s root page {} is outside the file",
                    m.slot, m.txnid, db.root
                ));
            }
        }
        Ok(())
    }

    /// Pages the file holds (LMDB may leave the end of the file unwritten
    /// when its last pages are free; pages used by a tree never are).
    fn pages_in_file(&self) -> u64 {
        (self.len / self.meta.page_size as u64).min(self.meta.last_page + 1)
    }

    /// Whether the file is shorter than the snapshot says.
    fn is_short(&self) -> bool {
        self.pages_in_file() < self.meta.last_page + 1
    }

    /// The same file read at its other snapshot (for salvage).
    pub fn previous_snapshot(&self) -> Option<DataFile<'s, S>> {
        let m = self.previous?;
        self.check_meta(&m).ok()?;
        Some(DataFile {
            src: self.src,
            len: self.len,
            meta: m,
            previous: None,
        })
    }

    /// `count` pages from `pgno`, which must lie inside the snapshot and
    /// the file.
    fn read_pages(&self, pgno: u64, count: u64) -> Result<Vec<u8>, Damage> {
        let ps = self.meta.page_size as u64;
        let end = pgno
            .checked_add(count)
            .filter(|&e| e <= self.meta.last_page + 1);
        let bytes = end
            .and_then(|e| e.checked_mul(ps))
            .filter(|&b| b <= self.len);
        if pgno < 2 || bytes.is_none() {
            return Err(format!(
                "page {pgno}{} lies outside the file",
                if count > 1 {
                    format!(" (run of {count})")
                } else {
                    String::new()
                }
            ));
        }
        let mut buf = vec![0u8; (count * ps) as usize];
        self.src
            .read_at(&mut buf, pgno * ps)
            .map_err(|e| format!("page {pgno}: {e}"))?;
        Ok(buf)
    }

    /// A tree's root page: inside the file, numbered and typed as its
    /// record says.
    fn root_ok(&self, db: &DbRecord) -> Result<(), Damage> {
        if db.root == NO_ROOT {
            return Ok(());
        }
        let page = self.read_pages(db.root, 1)?;
        let want = if db.depth == 1 { P_LEAF } else { P_BRANCH };
        if u64_at(&page, 0) != db.root
            || u16_at(&page, 10) & !IGNORED_FLAGS != want
            || db.depth > MAX_DEPTH
        {
            return Err(format!(
                "root page {} is not what the tree's record says",
                db.root
            ));
        }
        Ok(())
    }

    pub fn page_size(&self) -> usize {
        self.meta.page_size
    }

    fn walker(&self) -> Walker<'_, 's, S> {
        Walker {
            file: self,
            meta: self.meta,
            seen: PageSet::new(self.pages_in_file()),
            damage: Vec::new(),
            pages: [0; 3],
            entries: 0,
        }
    }

    /// The named databases, from the main database. Damage found on the
    /// way is added to `damage`; the databases read before it are kept.
    pub fn databases(&self, damage: &mut Vec<Damage>) -> BTreeMap<String, DbRecord> {
        let mut w = self.walker();
        let dbs = w.catalogue().into_iter().collect();
        damage.append(&mut w.damage);
        dbs
    }

    /// Every record of one database, in key order, skipping what cannot be
    /// read (each skipped part is described in `damage`).
    pub fn records(
        &self,
        name: &str,
        db: &DbRecord,
        damage: &mut Vec<Damage>,
        visit: &mut dyn FnMut(&[u8], &[u8]),
    ) {
        let mut w = self.walker();
        w.tree(name, db, Order::Bytes, false, &mut |k, v| {
            visit(k, v.bytes())
        });
        damage.append(&mut w.damage);
    }

    /// Check the whole snapshot: every tree, the free list, and that every
    /// page is accounted for exactly once. Empty when the file is sound.
    pub fn check_all(&self) -> Vec<Damage> {
        let mut w = self.walker();
        let dbs = w.catalogue();
        for (name, db) in &dbs {
            w.tree(name, db, Order::Bytes, false, &mut |_, _| {});
        }
        let freed = w.free_list();
        let last = self.meta.last_page;
        let in_file = self.pages_in_file();
        let (mut twice, mut past_end) = (0u64, 0u64);
        for p in freed {
            if (in_file..=last).contains(&p) {
                past_end += 1;
            } else if p < 2 || p > last || !w.seen.mark(p) {
                twice += 1;
            }
        }
        if twice > 0 {
            w.damage.push(format!(
                "{twice} page(s) of the free list are outside the file or also in use"
            ));
        }
        let accounted = w.seen.count + past_end + 2;
        if w.damage.is_empty() && accounted != last + 1 {
            w.damage.push(if accounted < last + 1 && self.is_short() {
                format!(
                    "the file ends at page {in_file} but the snapshot has {} pages: it was cut short",
                    last + 1
                )
            } else {
                format!(
                    "{} of the snapshot's {} pages are neither in use nor free",
                    (last + 1).saturating_sub(accounted),
                    last + 1
                )
            });
        }
        w.damage
    }
}

impl<S: Source + ?Sized> Walker<'_, '_, S> {
    /// The page numbers the free list holds. A record is a count and that
    /// many page numbers; LMDB may leave a record longer than its count
    /// (space it reserved and did not fill), and reads only the count.
    fn free_list(&mut self) -> Vec<u64> {
        let mut freed = Vec::new();
        let mut bad = 0u64;
        let free = self.meta.free;
        self.tree("free list", &free, Order::Integer, false, &mut |_, v| {
            let b = v.bytes();
            let count = if b.len() >= 8 { u64_at(b, 0) } else { u64::MAX };
            match count.checked_add(1).and_then(|n| n.checked_mul(8)) {
                Some(need) if need <= b.len() as u64 => {
                    freed.extend((1..=count as usize).map(|i| u64_at(b, i * 8)));
                }
                _ => bad += 1,
            }
        });
        if bad > 0 {
            self.damage
                .push(format!("the free list has {bad} malformed record(s)"));
        }
        freed
    }

    /// The named databases listed in the main database, in name order.
    fn catalogue(&mut self) -> Vec<(String, DbRecord)> {
        let mut dbs = Vec::new();
        let main = self.meta.main;
        self.tree("main database", &main, Order::Bytes, true, &mut |k, v| {
            if let Value::Database(d) = v {
                dbs.push((String::from_utf8_lossy(k).into_owned(), d));
            }
        });
        dbs
    }

    /// Walk one tree; each record goes to `visit`. Damage is recorded and
    /// the damaged subtree skipped. The tree's record is checked against
    /// what was found when the walk met no damage.
    fn tree(
        &mut self,
        name: &str,
        db: &DbRecord,
        order: Order,
        main: bool,
        visit: &mut dyn FnMut(&[u8], Value<'_>),
    ) {
        if db.root == NO_ROOT {
            if db.entries != 0 || db.depth != 0 {
                self.damage
                    .push(format!("{name}: no root page but {} records", db.entries));
            }
            return;
        }
        if db.depth == 0 || db.depth > MAX_DEPTH {
            self.damage
                .push(format!("{name}: a tree of depth {}", db.depth));
            return;
        }
        if !main && order == Order::Bytes && db.flags != 0 {
            self.damage.push(format!(
                "{name}: database flags {:#x} (Pando creates plain databases)",
                db.flags
            ));
            return;
        }
        let before = self.damage.len();
        self.pages = [0; 3];
        self.entries = 0;
        self.node(name, db.root, 1, db.depth, None, None, order, main, visit);
        if self.damage.len() == before {
            let found = (self.pages, self.entries);
            let recorded = (
                [db.branch_pages, db.leaf_pages, db.overflow_pages],
                db.entries,
            );
            if found != recorded {
                self.damage.push(format!(
                    "{name}: its record counts {:?} pages (branch, leaf, overflow) and {} records, the tree holds {:?} and {}",
                    recorded.0, recorded.1, found.0, found.1
                ));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn node(
        &mut self,
        name: &str,
        pgno: u64,
        level: u16,
        depth: u16,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        order: Order,
        main: bool,
        visit: &mut dyn FnMut(&[u8], Value<'_>),
    ) {
        let page = match self.file.read_pages(pgno, 1) {
            Ok(p) => p,
            Err(e) => return self.damage.push(format!("{name}: {e}")),
        };
        let ps = page.len();
        let at = |what: &str| format!("{name}: page {pgno}: {what}");
        let want = if level == depth { P_LEAF } else { P_BRANCH };
        let (n, upper) = match self.header(&page, pgno, want, level, depth) {
            Ok(found) => found,
            Err(what) => return self.damage.push(at(&what)),
        };
        self.pages[if want == P_LEAF { 1 } else { 0 }] += 1;
        let mut prev: Option<Vec<u8>> = None;
        // (key, child) of a branch page, checked before descending.
        let mut children: Vec<(Vec<u8>, u64)> = Vec::new();
        for i in 0..n {
            let off = u16_at(&page, PAGE_HEADER + 2 * i) as usize;
            if off < upper || off + NODE_HEADER > ps {
                return self.damage.push(at(&format!("record {i} at offset {off}")));
            }
            let (lo, hi, nflags, ksize) = (
                u16_at(&page, off) as u64,
                u16_at(&page, off + 2) as u64,
                u16_at(&page, off + 4),
                u16_at(&page, off + 6) as usize,
            );
            let kstart = off + NODE_HEADER;
            let Some(key) = page.get(kstart..kstart + ksize) else {
                return self
                    .damage
                    .push(at(&format!("record {i}: key of {ksize} bytes")));
            };
            // The first key of a branch page is never compared: LMDB leaves it empty.
            let compared = !(want == P_BRANCH && i == 0);
            if compared {
                let in_order = match (&prev, order) {
                    (Some(p), Order::Bytes) => p.as_slice() < key,
                    (Some(p), Order::Integer) => {
                        key.len() == 8 && p.len() == 8 && u64_at(p, 0) < u64_at(key, 0)
                    }
                    (None, _) => true,
                };
                let in_range = order == Order::Integer
                    || (!matches!(low, Some(l) if key < l) && !matches!(high, Some(h) if key >= h));
                if !in_order || !in_range {
                    return self
                        .damage
                        .push(at(&format!("record {i}: keys out of order")));
                }
                prev = Some(key.to_vec());
            }
            if want == P_BRANCH {
                let child = lo | (hi << 16) | ((nflags as u64) << 32);
                children.push((key.to_vec(), child));
                continue;
            }
            let dsize = (lo | (hi << 16)) as usize;
            let dstart = kstart + ksize;
            self.entries += 1;
            let value = &page[dstart.min(ps)..];
            match self.leaf_value(key, value, dsize, nflags, main, visit) {
                Ok(None) => {}
                // A bad overflow run: the page's other records are read.
                Ok(Some(what)) => self.damage.push(at(&format!("record {i}: {what}"))),
                Err(what) => return self.damage.push(at(&format!("record {i}: {what}"))),
            }
        }
        for (i, (key, child)) in children.iter().enumerate() {
            let lo_key = if i == 0 { low } else { Some(key.as_slice()) };
            let hi_key = children.get(i + 1).map(|(k, _)| k.as_slice()).or(high);
            self.node(
                name,
                *child,
                level + 1,
                depth,
                lo_key,
                hi_key,
                order,
                main,
                visit,
            );
        }
    }

    /// A tree page's header checked: it names itself, is the kind its
    /// level needs, is not used twice, and its free-space bounds hold.
    /// The number of records and where its free space ends; or what is
    /// wrong.
    fn header(
        &mut self,
        page: &[u8],
        pgno: u64,
        want: u16,
        level: u16,
        depth: u16,
    ) -> Result<(usize, usize), String> {
        let flags = u16_at(page, 10);
        if u64_at(page, 0) != pgno {
            return Err(format!("header names page {}", u64_at(page, 0)));
        }
        if flags & !IGNORED_FLAGS != want {
            return Err(format!(
                "flags {flags:#x}, expected a {} page at level {level} of {depth}",
                if want == P_LEAF { "leaf" } else { "branch" }
            ));
        }
        if !self.seen.mark(pgno) {
            return Err("used twice".into());
        }
        let (lower, upper) = (u16_at(page, 12) as usize, u16_at(page, 14) as usize);
        if lower < PAGE_HEADER
            || lower > upper
            || upper > page.len()
            || (lower - PAGE_HEADER) & 1 != 0
        {
            return Err(format!("free-space bounds {lower}..{upper}"));
        }
        let n = (lower - PAGE_HEADER) / 2;
        if n == 0 && want == P_BRANCH {
            return Err("a branch page without children".into());
        }
        Ok((n, upper))
    }

    /// One leaf record's value (`dsize` bytes from the start of `value`,
    /// or an overflow run it points to), given to `visit`. `Ok(Some)`:
    /// the overflow run it points to is damaged (the page is still read);
    /// `Err`: the record itself is, and the page is not read further.
    fn leaf_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        dsize: usize,
        nflags: u16,
        main: bool,
        visit: &mut dyn FnMut(&[u8], Value<'_>),
    ) -> Result<Option<String>, String> {
        if nflags & F_DUPDATA != 0 || (nflags & F_SUBDATA != 0 && !main) || nflags > 0x07 {
            return Err(format!("flags {nflags:#x}"));
        }
        if nflags & F_BIGDATA != 0 {
            let pb = value.get(..8).ok_or("overflow pointer")?;
            return Ok(match self.overflow(u64_at(pb, 0), dsize) {
                Ok(v) => {
                    visit(key, Value::Overflow(v));
                    None
                }
                Err(e) => Some(e.to_string()),
            });
        }
        let data = value
            .get(..dsize)
            .ok_or_else(|| format!("value of {dsize} bytes"))?;
        if nflags & F_SUBDATA != 0 {
            if dsize != DbRecord::SIZE {
                return Err(format!("database record of {dsize} bytes"));
            }
            visit(key, Value::Database(DbRecord::parse(data)));
        } else {
            visit(key, Value::Inline(data));
        }
        Ok(None)
    }

    /// An overflow run. LMDB may leave a run longer than its value needs
    /// (a value rewritten smaller in the transaction that wrote it keeps
    /// its pages), so the run's own length counts, and only the value's
    /// bytes are read.
    fn overflow(&mut self, first: u64, size: usize) -> Result<Vec<u8>, Damage> {
        let ps = self.meta.page_size;
        let needed = ((PAGE_HEADER - 1 + size) / ps + 1) as u64;
        let head = self.file.read_pages(first, 1)?;
        let pages = u32_at(&head, 12) as u64;
        if u64_at(&head, 0) != first
            || u16_at(&head, 10) & !IGNORED_FLAGS != P_OVERFLOW
            || pages < needed
        {
            return Err(format!("overflow page {first} has a wrong header"));
        }
        // The whole run must lie in the file; only the value is read.
        self.file.read_pages(first + pages - 1, 1)?;
        let run = self.file.read_pages(first, needed)?;
        for p in first..first + pages {
            if !self.seen.mark(p) {
                return Err(format!("overflow page {p} used twice"));
            }
        }
        self.pages[2] += pages;
        Ok(run[PAGE_HEADER..PAGE_HEADER + size].to_vec())
    }
}

/// The checks `serve` makes before opening a store with LMDB: meta pages,
/// the main database, the databases a store must have, and the whole
/// `meta` database (which holds the format record). Empty when sound.
pub fn check_paths<S: Source + ?Sized>(src: &S) -> Vec<Damage> {
    let f = match DataFile::open(src) {
        Ok(f) => f,
        Err(e) => return vec![e],
    };
    if f.is_short() {
        // Only free pages may lie past the end: LMDB would fault on any
        // other. Worth a whole check, which says which.
        let damage = f.check_all();
        if !damage.is_empty() {
            return damage;
        }
    }
    let mut damage = Vec::new();
    let dbs = f.databases(&mut damage);
    if !damage.is_empty() {
        return damage;
    }
    if dbs.is_empty() {
        // A store whose creation never committed: nothing in it.
        return damage;
    }
    for name in REQUIRED {
        if !dbs.contains_key(name) {
            damage.push(format!(
                "has no '{name}' database: not a Pando store, or damaged"
            ));
        }
    }
    if let Some(meta) = dbs.get("meta") {
        let mut format = None;
        f.records("meta", meta, &mut damage, &mut |k, v| {
            if k == b"format" {
                format = Some(v.to_vec());
            }
        });
        if damage.is_empty() && format.is_none() {
            damage.push("the 'meta' database has no format record".into());
        }
    }
    for (name, db) in &dbs {
        if let Err(e) = f.root_ok(db) {
            damage.push(format!("{name}: {e}"));
        }
    }
    // LMDB reads the free list on the first write: its records must hold.
    let mut w = f.walker();
    w.free_list();
    damage.append(&mut w.damage);
    damage
}

/// Whether the file holds a store at all: false for a file whose first
/// transaction (creating the databases) never committed.
pub fn has_databases<S: Source + ?Sized>(src: &S) -> Result<bool, Damage> {
    let f = DataFile::open(src)?;
    Ok(f.meta.main.root != NO_ROOT)
}
