//! Streaming LDIF reader (RFC 2849).
//!
//! Work happens in two steps per record:
//!
//! 1. `fill_record` reads physical lines up to the next blank line, drops
//!    comments (and their continuation lines), unfolds continuation lines and
//!    appends each logical line to `rec`, remembering its byte range and the
//!    physical line it started on in `spans`. Both buffers are reused.
//! 2. `Parser` walks the spans and builds a [`Record`].
//!
//! Grammar reminders from RFC 2849 that the code relies on:
//!
//! ```text
//! ldif-file       = ldif-content / ldif-changes
//! ldif-content    = version-spec 1*(1*SEP ldif-attrval-record)
//! ldif-changes    = version-spec 1*(1*SEP ldif-change-record)
//! ldif-attrval-record = dn-spec SEP 1*attrval-spec
//! ldif-change-record  = dn-spec SEP *control changerecord
//! dn-spec         = "dn:" (FILL distinguishedName / ":" FILL base64-distinguishedName)
//! control         = "control:" FILL ldap-oid 0*1(1*SPACE ("true" / "false")) 0*1(value-spec) SEP
//! attrval-spec    = AttributeDescription value-spec SEP
//! value-spec      = ":" ( FILL 0*1(SAFE-STRING) / ":" FILL (BASE64-STRING) / "<" FILL url)
//! changerecord    = "changetype:" FILL (change-add / change-delete / change-modify / change-moddn)
//! change-moddn    = ("modrdn" / "moddn") SEP "newrdn:" ... SEP "deleteoldrdn:" FILL ("0" / "1") SEP
//!                   0*1("newsuperior:" ... SEP)
//! change-modify   = "modify" SEP *mod-spec
//! mod-spec        = ("add:" / "delete:" / "replace:") FILL AttributeDescription SEP
//!                   *attrval-spec "-" SEP
//! ```
//!
//! `increment:` comes from RFC 4525. ABNF literals are case-insensitive, so
//! keywords (`dn`, `changetype`, `add`, ...) are matched ignoring ASCII case.

use std::fmt;
use std::io::{self, BufRead, Read};

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

/// Default cap on one record's unfolded size (and on the sum of values it
/// pulls in from `file://` URLs).
pub const DEFAULT_MAX_RECORD_BYTES: usize = 16 << 20;

/// Some writers omit `=` padding; accept both forms, otherwise standard base64.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Read-size step used while discarding the remainder of an oversized record.
const DISCARD_CHUNK: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct ReaderOptions {
    /// `attr:< file:///path` reads a local file. Refused unless set: LDIF
    /// from an untrusted source must not be able to pull in server files.
    pub allow_file_urls: bool,
    /// A record whose unfolded text (plus file-URL values) exceeds this is
    /// rejected with an error and skipped. Bounds memory per record.
    pub max_record_bytes: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            allow_file_urls: false,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Content {
        dn: String,
        /// In file order, one pair per value line; names as written.
        attrs: Vec<(String, Vec<u8>)>,
        /// Physical line of the `dn:` line.
        line: u64,
    },
    Change {
        dn: String,
        /// (OID, criticality, value) in file order.
        controls: Vec<(String, bool, Option<Vec<u8>>)>,
        change: ChangeRecord,
        /// Physical line of the `dn:` line.
        line: u64,
    },
}

impl Record {
    pub fn dn(&self) -> &str {
        match self {
            Record::Content { dn, .. } | Record::Change { dn, .. } => dn,
        }
    }

    pub fn line(&self) -> u64 {
        match self {
            Record::Content { line, .. } | Record::Change { line, .. } => *line,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ChangeRecord {
    Add(Vec<(String, Vec<u8>)>),
    Delete,
    Modify(Vec<ModSpec>),
    ModDn {
        new_rdn: String,
        delete_old_rdn: bool,
        new_superior: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModKind {
    Add,
    Delete,
    Replace,
    /// RFC 4525 Modify-Increment.
    Increment,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModSpec {
    pub op: ModKind,
    pub attr: String,
    pub values: Vec<Vec<u8>>,
}

/// A parse or I/O error with the physical line (1-based) it refers to.
/// `line` is 0 only for an I/O error before the first line was read.
#[derive(Debug)]
pub struct LdifError {
    pub line: u64,
    pub message: String,
}

impl LdifError {
    fn new(line: u64, message: impl Into<String>) -> Self {
        LdifError {
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for LdifError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for LdifError {}

/// One unfolded logical line: `rec[start..end]`, starting on physical `line`.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    end: usize,
    line: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phys {
    /// No more input.
    Eof,
    /// A whole physical line (terminator stripped) is in `line`.
    Line,
    /// The read limit was hit before a line terminator.
    Partial,
}

pub struct LdifReader<R: BufRead> {
    inner: R,
    opts: ReaderOptions,
    /// The physical line just read, without its terminator. Reused.
    line: Vec<u8>,
    /// Unfolded logical lines of the current record, back to back. Reused.
    rec: Vec<u8>,
    /// Logical lines of the current record, in order; indexes into `rec`.
    spans: Vec<Span>,
    /// Number of physical lines consumed so far (= number of the last one).
    line_no: u64,
    /// True until the first record has been parsed: only there may a
    /// `version:` line appear.
    at_start: bool,
    /// End of input reached or I/O failed; nothing more will be produced.
    done: bool,
}

impl<R: BufRead> LdifReader<R> {
    /// The underlying reader (e.g. to ask how far it got).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn new(reader: R, options: ReaderOptions) -> Self {
        LdifReader {
            inner: reader,
            opts: options,
            line: Vec::with_capacity(256),
            rec: Vec::with_capacity(4096),
            spans: Vec::with_capacity(64),
            line_no: 0,
            at_start: true,
            done: false,
        }
    }

    /// A reader for a piece of a larger input: the piece starts after line
    /// `lines_before` (so errors name lines of the whole input) and not at
    /// the input's start (a `version:` line there is not accepted). The
    /// piece must begin at a record boundary.
    pub fn continuing(reader: R, options: ReaderOptions, lines_before: u64) -> Self {
        let mut r = LdifReader::new(reader, options);
        r.line_no = lines_before;
        r.at_start = false;
        r
    }

    /// Number of physical lines read so far.
    pub fn line_number(&self) -> u64 {
        self.line_no
    }

    /// Reads one physical line into `self.line` with its `\n` / `\r\n`
    /// stripped, consuming at most `limit` (>= 1) bytes.
    fn read_phys(&mut self, limit: usize) -> io::Result<Phys> {
        self.line.clear();
        let limit = limit.max(1) as u64;
        let n = (&mut self.inner)
            .take(limit)
            .read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Ok(Phys::Eof);
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        } else if n as u64 == limit {
            return Ok(Phys::Partial);
        }
        // Either a terminated line or the last line of a file without a final
        // newline; both may end in a CR left over from CRLF.
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(Phys::Line)
    }

    /// Consumes the rest of a physical line whose start was `Partial`.
    /// Returns false when input ended first.
    fn discard_rest_of_line(&mut self) -> io::Result<bool> {
        loop {
            match self.read_phys(DISCARD_CHUNK)? {
                Phys::Eof => return Ok(false),
                Phys::Line => return Ok(true),
                Phys::Partial => {}
            }
        }
    }

    fn io_error(&mut self, e: io::Error) -> LdifError {
        self.done = true;
        LdifError::new(self.line_no, format!("read error: {e}"))
    }

    /// Reads the next record's logical lines into `rec`/`spans`. Ok(false)
    /// means input ended with no further record. On a record-level error the
    /// whole record is still consumed, so the caller can continue after it.
    fn fill_record(&mut self) -> Result<bool, LdifError> {
        self.rec.clear();
        self.spans.clear();
        // Inside a comment, continuation lines belong to the comment.
        let mut in_comment = false;
        // Once set, the rest of the record is read and dropped, then this is
        // returned.
        let mut pending: Option<LdifError> = None;
        let max = self.opts.max_record_bytes;
        loop {
            let limit = if pending.is_some() {
                DISCARD_CHUNK
            } else {
                // + 3: a continuation's leading space and a CRLF do not count
                // toward the record size, and one more byte proves overflow.
                max.saturating_sub(self.rec.len()).saturating_add(3)
            };
            let kind = match self.read_phys(limit) {
                Ok(k) => k,
                Err(e) => return Err(self.io_error(e)),
            };
            if kind == Phys::Eof {
                self.done = true;
                break;
            }
            self.line_no += 1;
            if kind == Phys::Partial {
                if pending.is_none() {
                    pending = Some(self.too_large());
                }
                match self.discard_rest_of_line() {
                    Ok(true) => continue,
                    Ok(false) => {
                        self.done = true;
                        break;
                    }
                    Err(e) => return Err(self.io_error(e)),
                }
            }
            let first = match self.line.first() {
                None => {
                    // Blank line: ends a record, or is one of several
                    // separators / trailing a comment-only paragraph.
                    if !self.spans.is_empty() || pending.is_some() {
                        break;
                    }
                    in_comment = false;
                    continue;
                }
                Some(&b) => b,
            };
            if first == b' ' {
                if in_comment || pending.is_some() {
                    continue;
                }
                let Some(last) = self.spans.last_mut() else {
                    if self.line.iter().all(|&b| b == b' ') {
                        // Whitespace-only line between records: treat as blank.
                        continue;
                    }
                    pending = Some(LdifError::new(
                        self.line_no,
                        "continuation line (leading space) with no line to continue",
                    ));
                    continue;
                };
                let add = &self.line[1..];
                if self.rec.len() + add.len() > max {
                    pending = Some(self.too_large());
                    continue;
                }
                self.rec.extend_from_slice(add);
                // The last span always ends at rec.len(), so appending
                // extends exactly that logical line.
                last.end = self.rec.len();
            } else if first == b'#' {
                in_comment = true;
            } else {
                in_comment = false;
                if pending.is_some() {
                    continue;
                }
                if self.rec.len() + self.line.len() > max {
                    pending = Some(self.too_large());
                    continue;
                }
                let start = self.rec.len();
                self.rec.extend_from_slice(&self.line);
                self.spans.push(Span {
                    start,
                    end: self.rec.len(),
                    line: self.line_no,
                });
            }
        }
        if let Some(e) = pending {
            return Err(e);
        }
        Ok(!self.spans.is_empty())
    }

    fn too_large(&self) -> LdifError {
        let line = self.spans.first().map_or(self.line_no, |s| s.line);
        LdifError::new(
            line,
            format!(
                "record too large (limit {} bytes)",
                self.opts.max_record_bytes
            ),
        )
    }
}

impl<R: BufRead> Iterator for LdifReader<R> {
    type Item = Result<Record, LdifError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            match self.fill_record() {
                Err(e) => {
                    self.at_start = false;
                    return Some(Err(e));
                }
                Ok(false) => return None,
                Ok(true) => {}
            }
            let at_start = std::mem::replace(&mut self.at_start, false);
            let mut p = Parser {
                rec: &self.rec,
                spans: &self.spans,
                opts: &self.opts,
                file_budget: self.opts.max_record_bytes.saturating_sub(self.rec.len()),
            };
            match p.record(at_start) {
                Ok(Some(r)) => return Some(Ok(r)),
                // A paragraph holding only `version: 1`.
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The value part of an attrval-spec, not yet decoded.
#[derive(Clone, Copy)]
enum RawValue<'a> {
    /// After `:` and FILL.
    Plain(&'a [u8]),
    /// After `::` and FILL.
    Base64(&'a [u8]),
    /// After `:<` and FILL.
    Url(&'a [u8]),
}

/// One logical `name: value` line.
struct Field<'a> {
    name: &'a str,
    value: RawValue<'a>,
    line: u64,
}

struct Parser<'a> {
    rec: &'a [u8],
    spans: &'a [Span],
    opts: &'a ReaderOptions,
    /// Bytes still allowed for values read from file URLs in this record.
    file_budget: usize,
}

fn trim_spaces(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn skip_fill(mut s: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = s {
        s = rest;
    }
    s
}

/// Splits a value-spec that starts just after the first `:`.
fn raw_value(after_colon: &[u8]) -> RawValue<'_> {
    match after_colon {
        [b':', rest @ ..] => RawValue::Base64(skip_fill(rest)),
        [b'<', rest @ ..] => RawValue::Url(skip_fill(rest)),
        rest => RawValue::Plain(skip_fill(rest)),
    }
}

/// AttributeDescription = AttributeType options, where a type is a keyword
/// (ALPHA *(ALPHA / DIGIT / "-")) or a numeric OID and options are
/// `;`-separated keychars. Checked loosely: the character set and a leading
/// letter or digit.
fn valid_attr_desc(name: &[u8]) -> bool {
    match name.first() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    name.iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b';' || b == b'.')
}

fn show(bytes: &[u8]) -> String {
    const MAX: usize = 40;
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]);
    if bytes.len() > MAX {
        format!("{s}...")
    } else {
        s.into_owned()
    }
}

impl<'a> Parser<'a> {
    fn raw(&self, i: usize) -> &'a [u8] {
        let s = self.spans[i];
        &self.rec[s.start..s.end]
    }

    fn field(&self, i: usize) -> Result<Field<'a>, LdifError> {
        let line = self.spans[i].line;
        let raw = self.raw(i);
        let Some(colon) = raw.iter().position(|&b| b == b':') else {
            return Err(LdifError::new(
                line,
                format!("missing ':' in \"{}\"", show(raw)),
            ));
        };
        let name = &raw[..colon];
        if name.is_empty() {
            return Err(LdifError::new(line, "missing attribute name before ':'"));
        }
        if !valid_attr_desc(name) {
            return Err(LdifError::new(
                line,
                format!("invalid attribute description \"{}\"", show(name)),
            ));
        }
        // valid_attr_desc admits ASCII only, so this cannot fail.
        let name = std::str::from_utf8(name)
            .map_err(|_| LdifError::new(line, "attribute description is not ASCII"))?;
        Ok(Field {
            name,
            value: raw_value(&raw[colon + 1..]),
            line,
        })
    }

    fn value(&mut self, v: RawValue<'_>, line: u64) -> Result<Vec<u8>, LdifError> {
        match v {
            RawValue::Plain(s) => Ok(s.to_vec()),
            RawValue::Base64(s) => B64
                .decode(trim_spaces(s))
                .map_err(|e| LdifError::new(line, format!("bad base64 value: {e}"))),
            RawValue::Url(s) => self.read_url(trim_spaces(s), line),
        }
    }

    fn string_value(&mut self, f: &Field<'_>, what: &str) -> Result<String, LdifError> {
        let v = self.value(f.value, f.line)?;
        String::from_utf8(v)
            .map_err(|_| LdifError::new(f.line, format!("{what} is not valid UTF-8")))
    }

    fn read_url(&mut self, url: &[u8], line: u64) -> Result<Vec<u8>, LdifError> {
        const SCHEME: &[u8] = b"file://";
        let is_file = url.len() >= SCHEME.len() && url[..SCHEME.len()].eq_ignore_ascii_case(SCHEME);
        if !is_file {
            return Err(LdifError::new(
                line,
                format!("unsupported URL \"{}\" (only file:// URLs)", show(url)),
            ));
        }
        if !self.opts.allow_file_urls {
            return Err(LdifError::new(
                line,
                "file: URL values are not allowed (ReaderOptions::allow_file_urls)",
            ));
        }
        let rest = &url[SCHEME.len()..];
        // file://<host>/<path>; only an empty host or "localhost" is local.
        let path = if rest.first() == Some(&b'/') {
            rest
        } else if rest.len() > 9 && rest[..10].eq_ignore_ascii_case(b"localhost/") {
            &rest[9..]
        } else {
            return Err(LdifError::new(
                line,
                format!("file URL \"{}\" does not name a local path", show(url)),
            ));
        };
        let path = pando_proto::url::percent_decode(path)
            .and_then(|p| String::from_utf8(p).ok())
            .ok_or_else(|| LdifError::new(line, "file URL path is not valid"))?;
        let file = std::fs::File::open(&path)
            .map_err(|e| LdifError::new(line, format!("cannot open {path}: {e}")))?;
        let mut out = Vec::new();
        // Read one byte past the budget so overflow is detected without
        // trusting the file's reported size (it may change underneath).
        file.take(self.file_budget as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| LdifError::new(line, format!("cannot read {path}: {e}")))?;
        if out.len() > self.file_budget {
            return Err(LdifError::new(
                line,
                format!(
                    "record too large (limit {} bytes) with value from {path}",
                    self.opts.max_record_bytes
                ),
            ));
        }
        self.file_budget -= out.len();
        Ok(out)
    }

    fn record(&mut self, at_start: bool) -> Result<Option<Record>, LdifError> {
        let n = self.spans.len();
        let mut i = 0;
        let first = self.field(0)?;
        if at_start && first.name.eq_ignore_ascii_case("version") {
            let v = self.value(first.value, first.line)?;
            if trim_spaces(&v) != b"1" {
                return Err(LdifError::new(
                    first.line,
                    format!("unsupported LDIF version \"{}\"", show(&v)),
                ));
            }
            if n == 1 {
                return Ok(None);
            }
            i = 1;
        }
        let dnf = self.field(i)?;
        if !dnf.name.eq_ignore_ascii_case("dn") {
            return Err(LdifError::new(
                dnf.line,
                format!("missing dn: record starts with \"{}:\"", dnf.name),
            ));
        }
        let dn = self.string_value(&dnf, "DN")?;
        let line = dnf.line;
        i += 1;

        let mut controls = Vec::new();
        while i < n {
            let f = self.field(i)?;
            if !f.name.eq_ignore_ascii_case("control") {
                break;
            }
            controls.push(self.control(&f)?);
            i += 1;
        }

        let changetype = if i < n {
            let f = self.field(i)?;
            if f.name.eq_ignore_ascii_case("changetype") {
                Some(f)
            } else {
                None
            }
        } else {
            None
        };
        let Some(ct) = changetype else {
            if !controls.is_empty() {
                return Err(LdifError::new(
                    self.spans[i - 1].line,
                    "control: must be followed by changetype:",
                ));
            }
            let attrs = self.attrs(i)?;
            if attrs.is_empty() {
                return Err(LdifError::new(line, "entry has no attributes"));
            }
            return Ok(Some(Record::Content { dn, attrs, line }));
        };
        i += 1;
        let kind = self.value(ct.value, ct.line)?;
        let kind = trim_spaces(&kind);
        let change = if kind.eq_ignore_ascii_case(b"add") {
            let attrs = self.attrs(i)?;
            if attrs.is_empty() {
                return Err(LdifError::new(
                    ct.line,
                    "changetype: add with no attributes",
                ));
            }
            ChangeRecord::Add(attrs)
        } else if kind.eq_ignore_ascii_case(b"delete") {
            if i < n {
                return Err(LdifError::new(
                    self.spans[i].line,
                    "unexpected line after changetype: delete",
                ));
            }
            ChangeRecord::Delete
        } else if kind.eq_ignore_ascii_case(b"modify") {
            ChangeRecord::Modify(self.mods(i)?)
        } else if kind.eq_ignore_ascii_case(b"modrdn") || kind.eq_ignore_ascii_case(b"moddn") {
            self.moddn(i, ct.line)?
        } else {
            return Err(LdifError::new(
                ct.line,
                format!("unknown changetype \"{}\"", show(kind)),
            ));
        };
        Ok(Some(Record::Change {
            dn,
            controls,
            change,
            line,
        }))
    }

    /// `attrval-spec`s from span `i` to the end of the record.
    fn attrs(&mut self, mut i: usize) -> Result<Vec<(String, Vec<u8>)>, LdifError> {
        let mut out = Vec::with_capacity(self.spans.len().saturating_sub(i));
        while i < self.spans.len() {
            let f = self.field(i)?;
            let v = self.value(f.value, f.line)?;
            out.push((f.name.to_owned(), v));
            i += 1;
        }
        Ok(out)
    }

    /// control: FILL ldap-oid 0*1(1*SPACE ("true" / "false")) 0*1(value-spec)
    fn control(&mut self, f: &Field<'_>) -> Result<(String, bool, Option<Vec<u8>>), LdifError> {
        let RawValue::Plain(s) = f.value else {
            return Err(LdifError::new(
                f.line,
                "control: must be followed by an OID, not a base64 or URL value",
            ));
        };
        let oid_len = s
            .iter()
            .position(|&b| b == b' ' || b == b':')
            .unwrap_or(s.len());
        let (oid, mut rest) = s.split_at(oid_len);
        let oid_ok = !oid.is_empty()
            && oid.iter().all(|&b| b.is_ascii_digit() || b == b'.')
            && oid.first() != Some(&b'.')
            && oid.last() != Some(&b'.');
        if !oid_ok {
            return Err(LdifError::new(
                f.line,
                format!("bad control OID \"{}\"", show(oid)),
            ));
        }
        // ASCII digits and dots only (checked above).
        let oid = String::from_utf8_lossy(oid).into_owned();
        rest = skip_fill(rest);
        let mut critical = false;
        for (word, val) in [(&b"true"[..], true), (&b"false"[..], false)] {
            if rest.len() >= word.len()
                && rest[..word.len()].eq_ignore_ascii_case(word)
                && matches!(rest.get(word.len()), None | Some(b' ' | b':'))
            {
                critical = val;
                rest = skip_fill(&rest[word.len()..]);
                break;
            }
        }
        let value = match rest {
            [] => None,
            [b':', after @ ..] => Some(self.value(raw_value(after), f.line)?),
            _ => {
                return Err(LdifError::new(
                    f.line,
                    format!("unexpected \"{}\" in control: line", show(rest)),
                ))
            }
        };
        Ok((oid, critical, value))
    }

    fn mods(&mut self, mut i: usize) -> Result<Vec<ModSpec>, LdifError> {
        let n = self.spans.len();
        let mut out = Vec::new();
        while i < n {
            let f = self.field(i)?;
            let op = if f.name.eq_ignore_ascii_case("add") {
                ModKind::Add
            } else if f.name.eq_ignore_ascii_case("delete") {
                ModKind::Delete
            } else if f.name.eq_ignore_ascii_case("replace") {
                ModKind::Replace
            } else if f.name.eq_ignore_ascii_case("increment") {
                ModKind::Increment
            } else {
                return Err(LdifError::new(
                    f.line,
                    format!(
                        "expected add:, delete:, replace: or increment: in modify record, found \"{}:\"",
                        f.name
                    ),
                ));
            };
            let attr = self.string_value(&f, "attribute description")?;
            let attr = attr.trim_matches(' ').to_owned();
            if !valid_attr_desc(attr.as_bytes()) {
                return Err(LdifError::new(
                    f.line,
                    format!(
                        "invalid attribute description \"{}\"",
                        show(attr.as_bytes())
                    ),
                ));
            }
            i += 1;
            let mut values = Vec::new();
            // Values up to the "-" line. A missing final "-" at the end of the
            // record is tolerated (common in hand-written files).
            while i < n {
                let raw = self.raw(i);
                if raw.first() == Some(&b'-') {
                    if raw[1..].iter().any(|&b| b != b' ' && b != b'\t') {
                        return Err(LdifError::new(
                            self.spans[i].line,
                            "unexpected text after \"-\" separator",
                        ));
                    }
                    i += 1;
                    break;
                }
                let v = self.field(i)?;
                if !v.name.eq_ignore_ascii_case(&attr) {
                    return Err(LdifError::new(
                        v.line,
                        format!(
                            "attribute \"{}\" does not match \"{}\" of this modification (missing \"-\"?)",
                            v.name, attr
                        ),
                    ));
                }
                values.push(self.value(v.value, v.line)?);
                i += 1;
            }
            out.push(ModSpec { op, attr, values });
        }
        Ok(out)
    }

    fn moddn(&mut self, mut i: usize, ct_line: u64) -> Result<ChangeRecord, LdifError> {
        let n = self.spans.len();
        let next = |name: &str, i: usize, prev_line: u64| -> Result<Field<'a>, LdifError> {
            if i >= n {
                return Err(LdifError::new(prev_line, format!("missing {name}: line")));
            }
            let f = self.field(i)?;
            if !f.name.eq_ignore_ascii_case(name) {
                return Err(LdifError::new(
                    f.line,
                    format!("expected {name}:, found \"{}:\"", f.name),
                ));
            }
            Ok(f)
        };
        let rdn_f = next("newrdn", i, ct_line)?;
        i += 1;
        let del_f = next("deleteoldrdn", i, rdn_f.line)?;
        i += 1;
        let new_rdn = self.string_value(&rdn_f, "newrdn")?;
        let del = self.value(del_f.value, del_f.line)?;
        let delete_old_rdn = match trim_spaces(&del) {
            b"0" => false,
            b"1" => true,
            other => {
                return Err(LdifError::new(
                    del_f.line,
                    format!("deleteoldrdn must be 0 or 1, not \"{}\"", show(other)),
                ))
            }
        };
        let mut new_superior = None;
        if i < n {
            let f = self.field(i)?;
            if !f.name.eq_ignore_ascii_case("newsuperior") {
                return Err(LdifError::new(
                    f.line,
                    format!("unexpected \"{}:\" in modrdn record", f.name),
                ));
            }
            new_superior = Some(self.string_value(&f, "newsuperior")?);
            i += 1;
        }
        if i < n {
            return Err(LdifError::new(
                self.spans[i].line,
                "unexpected line after newsuperior:",
            ));
        }
        Ok(ChangeRecord::ModDn {
            new_rdn,
            delete_old_rdn,
            new_superior,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all_opts(text: &[u8], opts: ReaderOptions) -> Vec<Result<Record, LdifError>> {
        LdifReader::new(text, opts).collect()
    }

    fn read_all(text: &str) -> Vec<Result<Record, LdifError>> {
        read_all_opts(text.as_bytes(), ReaderOptions::default())
    }

    fn ok(text: &str) -> Vec<Record> {
        read_all(text)
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("unexpected error: {e}")))
            .collect()
    }

    fn err(text: &str) -> LdifError {
        match read_all(text).into_iter().find_map(|r| r.err()) {
            Some(e) => e,
            None => panic!("expected an error"),
        }
    }

    fn av(name: &str, v: &[u8]) -> (String, Vec<u8>) {
        (name.to_owned(), v.to_vec())
    }

    #[test]
    fn content_records_with_version_comments_and_folding() {
        let text = "version: 1\n\
                    \n\
                    # a comment\n\
                    #  continued comment\n\
                    \x20still the comment\n\
                    dn: cn=Barbara Jensen, ou=Product Development, dc=airius, dc=com\n\
                    objectclass: top\n\
                    cn;lang-en: Barbara Jensen\n\
                    description: a long line that is\n\
                    \x20 folded here\n\
                    jpegPhoto:: AAEC\n\
                    \x20/w==\n\
                    \n\
                    \n\
                    \n\
                    dn:: Y249UsOpbWksZGM9ZXhhbXBsZQ==\n\
                    empty:\n\
                    spaces:    lead\n";
        let recs = ok(text);
        assert_eq!(recs.len(), 2);
        assert_eq!(
            recs[0],
            Record::Content {
                dn: "cn=Barbara Jensen, ou=Product Development, dc=airius, dc=com".into(),
                attrs: vec![
                    av("objectclass", b"top"),
                    av("cn;lang-en", b"Barbara Jensen"),
                    av("description", b"a long line that is folded here"),
                    av("jpegPhoto", &[0, 1, 2, 0xff]),
                ],
                line: 6,
            }
        );
        assert_eq!(
            recs[1],
            Record::Content {
                dn: "cn=R\u{e9}mi,dc=example".into(),
                attrs: vec![av("empty", b""), av("spaces", b"lead")],
                line: 16,
            }
        );
    }

    #[test]
    fn version_on_the_line_before_dn_and_crlf() {
        let text = "version: 1\r\ndn: dc=a\r\ndc: a\r\n fold\r\n\r\ndn: dc=b\r\ndc: b";
        let recs = ok(text);
        assert_eq!(recs.len(), 2);
        assert_eq!(
            recs[0],
            Record::Content {
                dn: "dc=a".into(),
                attrs: vec![av("dc", b"afold")],
                line: 2
            }
        );
        assert_eq!(recs[1].dn(), "dc=b");
        assert_eq!(recs[1].line(), 6);
    }

    #[test]
    fn version_is_only_special_at_the_start() {
        let e = err("dn: dc=a\ndc: a\n\nversion: 1\ndn: dc=b\ndc: b\n");
        assert_eq!(e.line, 4);
        assert!(e.message.contains("missing dn"), "{e}");
        let e = err("version: 2\n\ndn: dc=a\ndc: a\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("version"), "{e}");
    }

    #[test]
    fn change_records() {
        let text = "version: 1\n\
# add\n\
dn: cn=a,dc=x\n\
changetype: add\n\
cn: a\n\
objectClass: person\n\
\n\
dn: cn=b,dc=x\n\
control: 1.2.840.113556.1.4.805 true\n\
control: 1.3.6.1.1.13.1: cn\n\
control: 1.2.3 false:: AAE=\n\
ChangeType: Delete\n\
\n\
dn: cn=c,dc=x\n\
changetype: modify\n\
add: mail\n\
mail: c@x\n\
mail: c2@x\n\
-\n\
delete: description\n\
-\n\
replace: cn;lang-en\n\
cn;lang-en:: Q8Op\n\
-\n\
increment: uidNumber\n\
uidNumber: 1\n\
-\n\
\n\
dn: cn=d,dc=x\n\
changetype: modrdn\n\
newrdn: cn=e\n\
deleteoldrdn: 1\n\
newsuperior: ou=new,dc=x\n\
\n\
dn: cn=f,dc=x\n\
changetype: moddn\n\
newrdn:: Y249w6k=\n\
deleteoldrdn: 0\n";
        let recs = ok(text);
        assert_eq!(recs.len(), 5);
        assert_eq!(
            recs[0],
            Record::Change {
                dn: "cn=a,dc=x".into(),
                controls: vec![],
                change: ChangeRecord::Add(vec![av("cn", b"a"), av("objectClass", b"person")]),
                line: 3,
            }
        );
        assert_eq!(
            recs[1],
            Record::Change {
                dn: "cn=b,dc=x".into(),
                controls: vec![
                    ("1.2.840.113556.1.4.805".into(), true, None),
                    ("1.3.6.1.1.13.1".into(), false, Some(b"cn".to_vec())),
                    ("1.2.3".into(), false, Some(vec![0, 1])),
                ],
                change: ChangeRecord::Delete,
                line: 8,
            }
        );
        assert_eq!(
            recs[2],
            Record::Change {
                dn: "cn=c,dc=x".into(),
                controls: vec![],
                change: ChangeRecord::Modify(vec![
                    ModSpec {
                        op: ModKind::Add,
                        attr: "mail".into(),
                        values: vec![b"c@x".to_vec(), b"c2@x".to_vec()]
                    },
                    ModSpec {
                        op: ModKind::Delete,
                        attr: "description".into(),
                        values: vec![]
                    },
                    ModSpec {
                        op: ModKind::Replace,
                        attr: "cn;lang-en".into(),
                        values: vec!["C\u{e9}".as_bytes().to_vec()]
                    },
                    ModSpec {
                        op: ModKind::Increment,
                        attr: "uidNumber".into(),
                        values: vec![b"1".to_vec()]
                    },
                ]),
                line: 14,
            }
        );
        assert_eq!(
            recs[3],
            Record::Change {
                dn: "cn=d,dc=x".into(),
                controls: vec![],
                change: ChangeRecord::ModDn {
                    new_rdn: "cn=e".into(),
                    delete_old_rdn: true,
                    new_superior: Some("ou=new,dc=x".into())
                },
                line: 29,
            }
        );
        assert_eq!(
            recs[4],
            Record::Change {
                dn: "cn=f,dc=x".into(),
                controls: vec![],
                change: ChangeRecord::ModDn {
                    new_rdn: "cn=\u{e9}".into(),
                    delete_old_rdn: false,
                    new_superior: None
                },
                line: 35,
            }
        );
    }

    #[test]
    fn mixed_content_and_change_records_and_missing_final_dash() {
        let recs = ok("dn: dc=a\ndc: a\n\ndn: dc=a\nchangetype: modify\nreplace: dc\ndc: b\n");
        assert!(matches!(recs[0], Record::Content { .. }));
        assert_eq!(
            recs[1],
            Record::Change {
                dn: "dc=a".into(),
                controls: vec![],
                change: ChangeRecord::Modify(vec![ModSpec {
                    op: ModKind::Replace,
                    attr: "dc".into(),
                    values: vec![b"b".to_vec()]
                }]),
                line: 4,
            }
        );
    }

    #[test]
    fn errors_name_the_line() {
        let cases: &[(&str, u64, &str)] = &[
            ("cn: x\nsn: y\n", 1, "missing dn"),
            ("\n\n# c\ndn: dc=a\ncn:: !!!!\n", 5, "bad base64"),
            ("dn: dc=a\ncn x\n", 2, "missing ':'"),
            ("dn: dc=a\n: x\n", 2, "missing attribute name"),
            ("dn: dc=a\nc n: x\n", 2, "invalid attribute description"),
            (
                "dn: dc=a\nchangetype: modify\nadd: cn\ncn: x\n- cn: y\n",
                5,
                "after \"-\"",
            ),
            ("dn: dc=a\nchangetype: rename\n", 2, "unknown changetype"),
            (
                "dn: dc=a\nchangetype: delete\ncn: x\n",
                3,
                "after changetype: delete",
            ),
            (
                "dn: dc=a\nchangetype: modify\nadd: cn\nsn: x\n-\n",
                4,
                "does not match",
            ),
            (
                "dn: dc=a\nchangetype: modify\nfrob: cn\n",
                3,
                "expected add:",
            ),
            (
                "dn: dc=a\nchangetype: modrdn\nnewrdn: cn=b\n",
                3,
                "missing deleteoldrdn",
            ),
            (
                "dn: dc=a\nchangetype: modrdn\nnewrdn: cn=b\ndeleteoldrdn: 2\n",
                4,
                "0 or 1",
            ),
            ("dn: dc=a\ncontrol: 1.2.3\ncn: x\n", 2, "changetype"),
            ("dn: dc=a\ncontrol: x.y\nchangetype: delete\n", 2, "OID"),
            ("dn: dc=a\n", 1, "no attributes"),
            ("dn:: /w==\ncn: x\n", 1, "UTF-8"),
            ("dn: dc=a\ncn: x\n\n cont\n", 4, "continuation"),
            (
                "dn: dc=a\ncn:< http://example.com/x\n",
                2,
                "unsupported URL",
            ),
            ("dn: dc=a\ncn:< file:///etc/hostname\n", 2, "not allowed"),
        ];
        for (text, line, needle) in cases {
            let e = err(text);
            assert_eq!(e.line, *line, "{text:?}: {e}");
            assert!(e.message.contains(needle), "{text:?}: {e}");
            assert_eq!(e.to_string(), format!("line {}: {}", e.line, e.message));
        }
    }

    #[test]
    fn reader_continues_after_a_bad_record() {
        let text = "dn: dc=a\ncn:: %%%\n more\n\ndn: dc=b\ndc: b\n";
        let out = read_all(text);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ref().err().map(|e| e.line), Some(2));
        assert_eq!(out[1].as_ref().ok().map(|r| r.dn()), Some("dc=b"));
    }

    #[test]
    fn record_too_large_is_reported_and_skipped() {
        let opts = ReaderOptions {
            max_record_bytes: 40,
            ..Default::default()
        };
        let long = "x".repeat(100);
        let text = format!(
            "dn: dc=a\ndc: a\n\ndn: dc=b\ndescription: {long}\n {long}\ncn: q\n\ndn: dc=c\ndc: c\n\ndn: dc=d\n {long}{long}{long}"
        );
        let out = read_all_opts(text.as_bytes(), opts.clone());
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].as_ref().ok().map(|r| r.dn()), Some("dc=a"));
        let e = out[1].as_ref().expect_err("too large");
        assert_eq!(e.line, 4);
        assert!(e.message.contains("too large"), "{e}");
        assert_eq!(out[2].as_ref().ok().map(|r| r.line()), Some(9));
        let e = out[3].as_ref().expect_err("too large");
        assert_eq!(e.line, 12);

        // Folded lines are measured unfolded: exactly at the limit is fine.
        let exact = "dn: x\ncn: 0123456789012345678901234567890\n";
        assert_eq!(exact.len() - 2, 40);
        let ok = read_all_opts(exact.as_bytes(), opts.clone());
        assert!(ok[0].is_ok());
        let over = "dn: x\ncn: 01234567890123456789012345678901\n";
        let bad = read_all_opts(over.as_bytes(), opts);
        assert!(bad[0].is_err());
    }

    #[test]
    fn file_urls_when_allowed() {
        let dir = std::env::temp_dir().join(format!("pando-ldif-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("photo a.bin");
        std::fs::write(&path, [0u8, 1, 2, 3, 0xff]).expect("write");
        let url = format!("file://{}", dir.display()).replace(' ', "%20") + "/photo%20a.bin";
        let text = format!("dn: cn=p\njpegPhoto:< {url}\n");
        let opts = ReaderOptions {
            allow_file_urls: true,
            ..Default::default()
        };
        let out = read_all_opts(text.as_bytes(), opts.clone());
        assert_eq!(
            out[0].as_ref().ok(),
            Some(&Record::Content {
                dn: "cn=p".into(),
                attrs: vec![av("jpegPhoto", &[0, 1, 2, 3, 0xff])],
                line: 1
            })
        );
        let small = ReaderOptions {
            max_record_bytes: 30,
            ..opts.clone()
        };
        let text = format!("dn: cn=p\nx:< {url}\n");
        let long_url_rec = read_all_opts(text.as_bytes(), small);
        assert!(long_url_rec[0].is_err());
        let missing = read_all_opts(b"dn: cn=p\nx:< file:///nonexistent/pando/x\n", opts.clone());
        assert_eq!(missing[0].as_ref().err().map(|e| e.line), Some(2));
        let remote = read_all_opts(b"dn: cn=p\nx:< file://otherhost/x\n", opts);
        assert!(remote[0].is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn empty_and_comment_only_inputs() {
        assert!(ok("").is_empty());
        assert!(ok("\n\n\n").is_empty());
        assert!(ok("# only\n#  a comment\n\n").is_empty());
        assert!(ok("version: 1\n").is_empty());
        // A comment inside a record does not end it.
        let recs = ok("dn: dc=a\n# note\ndc: a\n");
        assert_eq!(
            recs,
            vec![Record::Content {
                dn: "dc=a".into(),
                attrs: vec![av("dc", b"a")],
                line: 1
            }]
        );
    }

    #[test]
    fn io_errors_end_iteration() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("boom"))
            }
        }
        let mut r = LdifReader::new(io::BufReader::new(Failing), ReaderOptions::default());
        let first = r.next();
        assert!(matches!(first, Some(Err(ref e)) if e.message.contains("boom")));
        assert!(r.next().is_none());
    }
}
