//! The schema: syntaxes and matching rules (built in code), attribute types
//! and object classes (from schema files in RFC 4512 description syntax).
//!
//! Schema file format (the embedded files under `schema/` use it):
//! - a line starting with `#` is a comment, a blank line ends a definition;
//! - a definition starts at column 0 with a keyword, `attributetype`,
//!   `objectclass` or `ldapsyntax` (case-insensitive), followed by an
//!   RFC 4512 AttributeTypeDescription / ObjectClassDescription /
//!   SyntaxDescription; it continues on following lines that start with
//!   whitespace;
//! - `objectidentifier NAME OID` (OpenLDAP's OID macros) names an OID, or
//!   `NAME OTHER:suffix` one under another macro; in the definitions that
//!   follow, a word `NAME` or `NAME:suffix` stands for the OID (suffix
//!   appended after a dot).
//!
//! Invariants after `add_definitions` succeeds:
//! - every SUP, MUST and MAY names a defined item, and SUPs were defined
//!   before their subordinates, so SUP chains are finite and acyclic;
//! - every matching rule named by an attribute type exists;
//! - `equality`, `ordering`, `substr` and `syntax` hold the values
//!   inherited from the SUP chain when not given, and rule names are the
//!   canonical names of the built-in rules;
//! - MUST/MAY/SUP lists hold primary names (`name()`) of the items.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a: name lookups are on every request path, and these tables are
/// built once from trusted schema files (clients cannot insert keys, so a
/// non-keyed hash invites no flooding).
#[derive(Clone, Copy)]
pub struct Fnv(u64);

/// The hasher of tables keyed by names the administrator defines
/// (attribute types, indexes): for those only, see [`Fnv`].
pub type NameHash = BuildHasherDefault<Fnv>;

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Names (as defined and lowercased) and OIDs to an index.
type NameMap = HashMap<String, usize, BuildHasherDefault<Fnv>>;

/// Case-insensitive lookup without allocating for names of usual length.
fn lookup(map: &NameMap, key: &str) -> Option<usize> {
    if let Some(i) = map.get(key) {
        return Some(*i);
    }
    if !key.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut buf = [0u8; 96];
    match buf.get_mut(..key.len()) {
        Some(dst) => {
            dst.copy_from_slice(key.as_bytes());
            dst.make_ascii_lowercase();
            // ASCII lowercasing keeps UTF-8 valid.
            map.get(std::str::from_utf8(dst).ok()?).copied()
        }
        None => map.get(&key.to_ascii_lowercase()).copied(),
    }
}
use std::fmt::{self, Write as _};

use crate::check::SchemaViolation;
use crate::desc::AttrDesc;
use crate::dn::{escape_value, is_numericoid, Dn, Rdn, RdnAva};
use crate::matching::{find_rule, phonetic, Algo, MATCHING_RULES};
use crate::prep::{prepare_bytes, Spaces};
use crate::syntax::{check_value, is_descr, uuid_bytes, Check, BUILTIN_SYNTAXES};
use pando_proto::ResultCode;

/// Attribute type usage (RFC 4512 section 4.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    UserApplications,
    DirectoryOperation,
    DistributedOperation,
    DsaOperation,
}

impl Usage {
    fn keyword(self) -> &'static str {
        match self {
            Usage::UserApplications => "userApplications",
            Usage::DirectoryOperation => "directoryOperation",
            Usage::DistributedOperation => "distributedOperation",
            Usage::DsaOperation => "dSAOperation",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeType {
    pub oid: String,
    pub names: Vec<String>,
    pub desc: Option<String>,
    pub obsolete: bool,
    pub sup: Option<String>,
    /// Matching rule names, inherited from SUP when absent.
    pub equality: Option<String>,
    pub ordering: Option<String>,
    pub substr: Option<String>,
    /// Syntax OID (without length bound), inherited from SUP when absent.
    pub syntax: Option<String>,
    pub single_value: bool,
    pub collective: bool,
    pub no_user_modification: bool,
    pub usage: Usage,
    /// The RFC 4512 description as declared (without inherited fields).
    pub definition: String,
    /// `sup`'s place in the schema (types are only ever appended).
    pub(crate) sup_id: Option<usize>,
}

impl AttributeType {
    /// First NAME, or the OID when the type has none.
    pub fn name(&self) -> &str {
        self.names.first().map(String::as_str).unwrap_or(&self.oid)
    }

    pub fn is_operational(&self) -> bool {
        self.usage != Usage::UserApplications
    }

    /// Whether `n` is one of the names (case-insensitive) or the OID.
    pub fn has_name(&self, n: &str) -> bool {
        self.oid == n || self.names.iter().any(|x| x.eq_ignore_ascii_case(n))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectClassKind {
    Abstract,
    Structural,
    Auxiliary,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectClass {
    pub oid: String,
    pub names: Vec<String>,
    pub desc: Option<String>,
    pub obsolete: bool,
    pub sup: Vec<String>,
    pub kind: ObjectClassKind,
    pub must: Vec<String>,
    pub may: Vec<String>,
    pub definition: String,
    /// The places of `must` and `may` in the schema, in the same order.
    pub(crate) must_ids: Vec<usize>,
    pub(crate) may_ids: Vec<usize>,
}

impl ObjectClass {
    pub fn name(&self) -> &str {
        self.names.first().map(String::as_str).unwrap_or(&self.oid)
    }

    pub fn has_name(&self, n: &str) -> bool {
        self.oid == n || self.names.iter().any(|x| x.eq_ignore_ascii_case(n))
    }
}

/// A syntax known to the schema.
#[derive(Clone, Debug)]
pub(crate) struct SyntaxDef {
    pub oid: String,
    pub check: Check,
    pub definition: String,
}

/// A schema definition problem; `line` is the 1-based line of the
/// definition in the text given to `add_definitions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schema line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for SchemaError {}

#[derive(Clone, Debug, Default)]
pub struct Schema {
    attrs: Vec<AttributeType>,
    /// Lowercased names and OIDs → index into `attrs`.
    attr_index: NameMap,
    classes: Vec<ObjectClass>,
    class_index: NameMap,
    syntaxes: Vec<SyntaxDef>,
    syntax_index: HashMap<String, usize>,
    /// OIDs of the attribute types that are the SUP of another.
    supertypes: HashSet<String>,
    /// OID macros (`objectidentifier`), lowercased name → numeric OID.
    macros: HashMap<String, String>,
}

const FILES: &[(&str, &str)] = &[
    ("core.schema", include_str!("../schema/core.schema")),
    ("cosine.schema", include_str!("../schema/cosine.schema")),
    (
        "inetorgperson.schema",
        include_str!("../schema/inetorgperson.schema"),
    ),
    (NIS_FILE, include_str!("../schema/nis.schema")),
    (
        "operational.schema",
        include_str!("../schema/operational.schema"),
    ),
    ("ppolicy.schema", include_str!("../schema/ppolicy.schema")),
    (
        "accesslog.schema",
        include_str!("../schema/accesslog.schema"),
    ),
    (
        "changelog.schema",
        include_str!("../schema/changelog.schema"),
    ),
    ("monitor.schema", include_str!("../schema/monitor.schema")),
    ("config.schema", include_str!("../schema/config.schema")),
];

const NIS_FILE: &str = "nis.schema";
const RFC2307BIS: &str = include_str!("../schema/rfc2307bis.schema");

/// Which definitions of the NIS classes the standard schema holds: RFC
/// 2307's (posixGroup structural, members by `memberUid`) or RFC 2307bis's
/// (posixGroup auxiliary beside groupOfNames, members by DN). They share
/// OIDs, so a schema has one or the other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PosixSchema {
    #[default]
    Rfc2307,
    Rfc2307bis,
}

impl PosixSchema {
    pub const NAMES: [&'static str; 2] = ["rfc2307", "rfc2307bis"];

    pub fn parse(name: &str) -> Option<PosixSchema> {
        match name {
            "rfc2307" => Some(PosixSchema::Rfc2307),
            "rfc2307bis" => Some(PosixSchema::Rfc2307bis),
            _ => None,
        }
    }
}

/// Longest SUP chain followed (attribute types or object classes). Chains
/// are acyclic by construction; this only bounds work.
pub(crate) const MAX_SUP_DEPTH: usize = 64;

// ---------------------------------------------------------------------------
// Tokenizer and description parser (RFC 4512 section 4.1)

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Open,
    Close,
    Dollar,
    Quoted(String),
    Word(String),
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if c.is_ascii_whitespace() => i += 1,
            b'(' => {
                out.push(Tok::Open);
                i += 1;
            }
            b')' => {
                out.push(Tok::Close);
                i += 1;
            }
            b'$' => {
                out.push(Tok::Dollar);
                i += 1;
            }
            b'\'' => {
                // qdstring: QUOTE dstring QUOTE, with \27 and \5C escapes.
                i += 1;
                let mut v = Vec::new();
                loop {
                    match b.get(i) {
                        None => return Err("unterminated quoted string".into()),
                        Some(b'\'') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let esc = b.get(i + 1..i + 3).unwrap_or(b"");
                            if esc.eq_ignore_ascii_case(b"27") {
                                v.push(b'\'');
                            } else if esc.eq_ignore_ascii_case(b"5c") {
                                v.push(b'\\');
                            } else {
                                return Err("invalid escape in quoted string".into());
                            }
                            i += 3;
                        }
                        Some(&c) => {
                            v.push(c);
                            i += 1;
                        }
                    }
                }
                let v = String::from_utf8(v).map_err(|_| "quoted string is not UTF-8")?;
                out.push(Tok::Quoted(v));
            }
            _ => {
                let start = i;
                while i < b.len() && !b[i].is_ascii_whitespace() && !b"()$'".contains(&b[i]) {
                    i += 1;
                }
                out.push(Tok::Word(s[start..i].to_string()));
            }
        }
    }
    Ok(out)
}

struct Desc {
    toks: Vec<Tok>,
    pos: usize,
}

impl Desc {
    fn new(text: &str) -> Result<Desc, String> {
        let toks = tokenize(text)?;
        if toks.first() != Some(&Tok::Open) || toks.last() != Some(&Tok::Close) {
            return Err("description must be enclosed in parentheses".into());
        }
        Ok(Desc { toks, pos: 1 })
    }

    fn next(&mut self) -> Option<Tok> {
        // The final Close is the end of the description.
        if self.pos + 1 >= self.toks.len() {
            return None;
        }
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn word(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Tok::Word(w)) => Ok(w),
            _ => Err(format!("expected {what}")),
        }
    }

    fn quoted(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Tok::Quoted(q)) => Ok(q),
            _ => Err(format!("expected quoted {what}")),
        }
    }

    /// qdescrs / qdstrings: one quoted string or a parenthesised list.
    fn quoted_list(&mut self, what: &str) -> Result<Vec<String>, String> {
        match self.next() {
            Some(Tok::Quoted(q)) => Ok(vec![q]),
            Some(Tok::Open) => {
                let mut v = Vec::new();
                loop {
                    match self.next() {
                        Some(Tok::Quoted(q)) => v.push(q),
                        Some(Tok::Close) => return Ok(v),
                        _ => return Err(format!("bad {what} list")),
                    }
                }
            }
            _ => Err(format!("expected {what}")),
        }
    }

    /// oids = oid / ( LPAREN WSP oidlist WSP RPAREN ), oidlist uses '$'.
    fn oids(&mut self, what: &str) -> Result<Vec<String>, String> {
        match self.next() {
            Some(Tok::Word(w)) => Ok(vec![w]),
            Some(Tok::Open) => {
                let mut v = Vec::new();
                let mut want_word = true;
                loop {
                    match self.next() {
                        Some(Tok::Word(w)) if want_word => {
                            v.push(w);
                            want_word = false;
                        }
                        Some(Tok::Dollar) if !want_word => want_word = true,
                        Some(Tok::Close) if !want_word => return Ok(v),
                        _ => return Err(format!("bad {what} list")),
                    }
                }
            }
            _ => Err(format!("expected {what}")),
        }
    }

    fn numericoid(&mut self) -> Result<String, String> {
        let w = self.word("numeric OID")?;
        if !is_numericoid(w.as_bytes()) {
            return Err(format!("'{w}' is not a numeric OID"));
        }
        Ok(w)
    }
}

/// `X-...` extensions: name and values, kept for the definition string.
type Extensions = Vec<(String, Vec<String>)>;

fn check_names(names: &[String]) -> Result<(), String> {
    for n in names {
        if !is_descr(n.as_bytes()) {
            return Err(format!("'{n}' is not a valid descriptor"));
        }
    }
    Ok(())
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\27"),
            '\\' => out.push_str("\\5C"),
            _ => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn render_names(out: &mut String, names: &[String]) {
    match names {
        [] => {}
        [one] => {
            let _ = write!(out, " NAME {}", quote(one));
        }
        many => {
            out.push_str(" NAME (");
            for n in many {
                let _ = write!(out, " {}", quote(n));
            }
            out.push_str(" )");
        }
    }
}

fn render_oids(out: &mut String, key: &str, list: &[String]) {
    match list {
        [] => {}
        [one] => {
            let _ = write!(out, " {key} {one}");
        }
        many => {
            let _ = write!(out, " {key} ( {} )", many.join(" $ "));
        }
    }
}

fn render_ext(out: &mut String, ext: &Extensions) {
    for (k, vals) in ext {
        if let [one] = vals.as_slice() {
            let _ = write!(out, " {k} {}", quote(one));
        } else {
            let _ = write!(out, " {k} (");
            for v in vals {
                let _ = write!(out, " {}", quote(v));
            }
            out.push_str(" )");
        }
    }
}

fn parse_extension(d: &mut Desc, key: String, ext: &mut Extensions) -> Result<(), String> {
    if !key.starts_with("X-") && !key.starts_with("x-") {
        return Err(format!("unknown keyword '{key}'"));
    }
    let vals = d.quoted_list(&key)?;
    ext.push((key, vals));
    Ok(())
}

// ---------------------------------------------------------------------------

/// An ordering rule chosen for a sort ([`Schema::sort_order`]).
#[derive(Clone, Copy, Debug)]
pub struct SortOrder(&'static crate::matching::MatchingRule);

impl SortOrder {
    /// The rule's name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }
}

impl Schema {
    /// Built-in syntaxes and matching rules plus the five embedded schema
    /// files (core, cosine, inetorgperson, nis, operational).
    ///
    /// The embedded files are part of the program and covered by tests; a
    /// failure to load them is a build defect, reported by panicking.
    pub fn standard() -> Schema {
        Schema::standard_with(PosixSchema::Rfc2307)
    }

    /// The standard schema with the chosen NIS definitions.
    pub fn standard_with(posix: PosixSchema) -> Schema {
        let mut s = Schema::builtin();
        for (name, text) in FILES {
            let text = match posix {
                PosixSchema::Rfc2307bis if *name == NIS_FILE => RFC2307BIS,
                _ => text,
            };
            if let Err(e) = s.add_definitions(text) {
                panic!("built-in schema file {name} is invalid: {e}");
            }
        }
        s
    }

    /// Only the built-in syntaxes (no attribute types or object classes).
    pub fn builtin() -> Schema {
        let mut s = Schema::default();
        for syn in BUILTIN_SYNTAXES {
            let mut def = format!("( {} DESC {}", syn.oid, quote(syn.desc));
            if syn.binary {
                def.push_str(" X-NOT-HUMAN-READABLE 'TRUE'");
            }
            def.push_str(" )");
            s.syntax_index.insert(syn.oid.to_string(), s.syntaxes.len());
            s.syntaxes.push(SyntaxDef {
                oid: syn.oid.to_string(),
                check: syn.check,
                definition: def,
            });
        }
        s
    }

    /// Add definitions in the schema file format (see the module docs).
    /// All or nothing: on error the schema is unchanged.
    pub fn add_definitions(&mut self, text: &str) -> Result<(), SchemaError> {
        let mut next = self.clone();
        for (line, block) in blocks(text) {
            let fail = |message: String| SchemaError { line, message };
            let block = block.trim();
            let (keyword, rest) = block
                .split_once(|c: char| c.is_ascii_whitespace() || c == '(')
                .map(|(k, _)| (k, &block[k.len()..]))
                .ok_or_else(|| fail("expected a keyword and a description".into()))?;
            let keyword = keyword.to_ascii_lowercase();
            if keyword == "objectidentifier" {
                next.add_macro(rest).map_err(fail)?;
                continue;
            }
            let rest = expand_macros(rest, &next.macros);
            match keyword.as_str() {
                // slapd takes any keyword beginning with `attribute` for
                // `attributetype` (it matches the directive by that prefix),
                // and Debian's dsee.schema has an `attributeype`.
                k if k.starts_with("attribute") => next.add_attribute_type(&rest).map_err(fail)?,
                "objectclass" | "objectclasses" => next.add_object_class(&rest).map_err(fail)?,
                "ldapsyntax" | "ldapsyntaxes" => next.add_syntax(&rest).map_err(fail)?,
                other => return Err(fail(format!("unknown definition keyword '{other}'"))),
            }
        }
        *self = next;
        Ok(())
    }

    /// `objectidentifier NAME OID`, where OID may be `OTHER:suffix`.
    fn add_macro(&mut self, text: &str) -> Result<(), String> {
        let mut words = text.split_whitespace();
        let (Some(name), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err("objectidentifier takes a name and an OID".into());
        };
        if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(format!(
                "objectidentifier {name}: a macro name starts with a letter"
            ));
        }
        let oid = expand_macros(value, &self.macros);
        let oid = oid.trim();
        if !is_numericoid(oid.as_bytes()) {
            return Err(format!(
                "objectidentifier {name}: '{value}' is not an OID or a known macro"
            ));
        }
        match self.macros.get(&name.to_ascii_lowercase()) {
            Some(old) if old != oid => Err(format!(
                "objectidentifier {name} is already defined as {old}"
            )),
            _ => {
                self.macros
                    .insert(name.to_ascii_lowercase(), oid.to_string());
                Ok(())
            }
        }
    }

    fn add_syntax(&mut self, text: &str) -> Result<(), String> {
        let mut d = Desc::new(text)?;
        let oid = d.numericoid()?;
        let mut desc = None;
        let mut ext = Extensions::new();
        while let Some(t) = d.next() {
            match t {
                Tok::Word(k) if k.eq_ignore_ascii_case("DESC") => desc = Some(d.quoted("DESC")?),
                Tok::Word(k) => parse_extension(&mut d, k, &mut ext)?,
                _ => return Err("unexpected token in syntax description".into()),
            }
        }
        if self.syntax_index.contains_key(&oid) {
            return Err(format!("syntax {oid} is already defined"));
        }
        let mut def = format!("( {oid}");
        if let Some(desc) = &desc {
            let _ = write!(def, " DESC {}", quote(desc));
        }
        render_ext(&mut def, &ext);
        def.push_str(" )");
        self.syntax_index.insert(oid.clone(), self.syntaxes.len());
        self.syntaxes.push(SyntaxDef {
            oid,
            check: Check::Any,
            definition: def,
        });
        Ok(())
    }

    fn add_attribute_type(&mut self, text: &str) -> Result<(), String> {
        let mut d = Desc::new(text)?;
        let oid = d.numericoid()?;
        let mut at = AttributeType {
            oid,
            names: Vec::new(),
            desc: None,
            obsolete: false,
            sup: None,
            equality: None,
            ordering: None,
            substr: None,
            syntax: None,
            single_value: false,
            collective: false,
            no_user_modification: false,
            usage: Usage::UserApplications,
            definition: String::new(),
            sup_id: None,
        };
        // Syntax as written, with its length bound, for the definition.
        let mut syntax_written = None;
        let mut ext = Extensions::new();
        while let Some(t) = d.next() {
            let Tok::Word(k) = t else {
                return Err("unexpected token in attribute type description".into());
            };
            match k.to_ascii_uppercase().as_str() {
                "NAME" => at.names = d.quoted_list("NAME")?,
                "DESC" => at.desc = Some(d.quoted("DESC")?),
                "OBSOLETE" => at.obsolete = true,
                "SUP" => at.sup = Some(d.word("SUP")?),
                "EQUALITY" => at.equality = Some(d.word("EQUALITY")?),
                "ORDERING" => at.ordering = Some(d.word("ORDERING")?),
                "SUBSTR" => at.substr = Some(d.word("SUBSTR")?),
                "SYNTAX" => {
                    // OpenLDAP also takes the OID quoted ('1.2.3'), as some
                    // shipped schema files write it.
                    let w = match d.next() {
                        Some(Tok::Word(w)) => w,
                        Some(Tok::Quoted(w)) => expand_word(&w, &self.macros),
                        _ => return Err("expected SYNTAX".into()),
                    };
                    let oid = w.split('{').next().unwrap_or("").to_string();
                    if !is_numericoid(oid.as_bytes()) {
                        return Err(format!("'{w}' is not a syntax OID"));
                    }
                    at.syntax = Some(oid);
                    syntax_written = Some(w);
                }
                "SINGLE-VALUE" => at.single_value = true,
                "COLLECTIVE" => at.collective = true,
                "NO-USER-MODIFICATION" => at.no_user_modification = true,
                "USAGE" => at.usage = usage(&d.word("USAGE")?)?,
                _ => parse_extension(&mut d, k, &mut ext)?,
            }
        }
        check_names(&at.names)?;

        at.definition = attribute_definition(&at, syntax_written.as_deref(), &ext);

        // Resolve rules to canonical names.
        for (slot, kinds) in [
            (&mut at.equality, "equality"),
            (&mut at.ordering, "ordering"),
            (&mut at.substr, "substrings"),
        ] {
            if let Some(r) = slot {
                let rule =
                    find_rule(r).ok_or_else(|| format!("unknown {kinds} matching rule '{r}'"))?;
                *r = rule.name.to_string();
            }
        }
        // Inherit from SUP.
        if let Some(sup) = &at.sup {
            let sup_id = lookup(&self.attr_index, sup)
                .ok_or_else(|| format!("SUP '{sup}' is not a defined attribute type"))?;
            let parent = &self.attrs[sup_id];
            if parent.usage != at.usage {
                return Err(format!("USAGE differs from that of SUP '{sup}'"));
            }
            at.sup = Some(parent.name().to_string());
            at.sup_id = Some(sup_id);
            at.equality = at.equality.take().or_else(|| parent.equality.clone());
            at.ordering = at.ordering.take().or_else(|| parent.ordering.clone());
            at.substr = at.substr.take().or_else(|| parent.substr.clone());
            at.syntax = at.syntax.take().or_else(|| parent.syntax.clone());
        } else if at.syntax.is_none() {
            return Err("attribute type needs SUP or SYNTAX".into());
        }
        if at.no_user_modification && at.usage == Usage::UserApplications {
            return Err("NO-USER-MODIFICATION requires an operational USAGE".into());
        }
        self.insert_attr(at)
    }

    fn insert_attr(&mut self, at: AttributeType) -> Result<(), String> {
        // A type defined again with its OID and name (msuser.schema's
        // memberOf, the built-in one the memberof overlay keeps): the
        // first definition stays.
        if let Some(old) = self.attribute(&at.oid) {
            if at.names.first().is_some_and(|n| old.has_name(n)) {
                return Ok(());
            }
        }
        let keys: Vec<String> = std::iter::once(at.oid.clone())
            .chain(at.names.iter().map(|n| n.to_ascii_lowercase()))
            .collect();
        for k in &keys {
            if self.attr_index.contains_key(k) {
                return Err(format!("attribute type '{k}' is already defined"));
            }
        }
        let i = self.attrs.len();
        for k in keys {
            self.attr_index.insert(k, i);
        }
        if let Some(sup) = at.sup.as_deref().and_then(|s| self.attribute(s)) {
            let oid = sup.oid.clone();
            self.supertypes.insert(oid);
        }
        // Names as defined too, so lookups by canonical name need no
        // lowercasing (cannot collide: they lowercase to this type's keys).
        for n in &at.names {
            self.attr_index.insert(n.clone(), i);
        }
        self.attrs.push(at);
        Ok(())
    }

    /// A new class's SUP, MUST and MAY named as the schema names them,
    /// and its MUST and MAY resolved to places; each must be defined.
    fn resolve_class_refs(&self, oc: &mut ObjectClass) -> Result<(), String> {
        for s in oc.sup.iter_mut() {
            let parent = self
                .object_class(s)
                .ok_or_else(|| format!("SUP '{s}' is not a defined object class"))?;
            *s = parent.name().to_string();
        }
        for (names, ids) in [
            (&mut oc.must, &mut oc.must_ids),
            (&mut oc.may, &mut oc.may_ids),
        ] {
            for a in names.iter_mut() {
                let i = lookup(&self.attr_index, a)
                    .ok_or_else(|| format!("attribute type '{a}' is not defined"))?;
                *a = self.attrs[i].name().to_string();
                ids.push(i);
            }
        }
        Ok(())
    }

    fn add_object_class(&mut self, text: &str) -> Result<(), String> {
        let mut d = Desc::new(text)?;
        let oid = d.numericoid()?;
        let mut oc = ObjectClass {
            oid,
            names: Vec::new(),
            desc: None,
            obsolete: false,
            sup: Vec::new(),
            kind: ObjectClassKind::Structural,
            must: Vec::new(),
            may: Vec::new(),
            definition: String::new(),
            must_ids: Vec::new(),
            may_ids: Vec::new(),
        };
        let mut kind_given = false;
        let mut ext = Extensions::new();
        while let Some(t) = d.next() {
            let Tok::Word(k) = t else {
                return Err("unexpected token in object class description".into());
            };
            match k.to_ascii_uppercase().as_str() {
                "NAME" => oc.names = d.quoted_list("NAME")?,
                "DESC" => oc.desc = Some(d.quoted("DESC")?),
                "OBSOLETE" => oc.obsolete = true,
                "SUP" => oc.sup = d.oids("SUP")?,
                "ABSTRACT" | "STRUCTURAL" | "AUXILIARY" => {
                    if kind_given {
                        return Err("more than one kind given".into());
                    }
                    kind_given = true;
                    oc.kind = match k.to_ascii_uppercase().as_str() {
                        "ABSTRACT" => ObjectClassKind::Abstract,
                        "AUXILIARY" => ObjectClassKind::Auxiliary,
                        _ => ObjectClassKind::Structural,
                    };
                }
                "MUST" => oc.must = d.oids("MUST")?,
                "MAY" => oc.may = d.oids("MAY")?,
                _ => parse_extension(&mut d, k, &mut ext)?,
            }
        }
        check_names(&oc.names)?;
        self.resolve_class_refs(&mut oc)?;
        let mut def = format!("( {}", oc.oid);
        render_names(&mut def, &oc.names);
        if let Some(x) = &oc.desc {
            let _ = write!(def, " DESC {}", quote(x));
        }
        if oc.obsolete {
            def.push_str(" OBSOLETE");
        }
        render_oids(&mut def, "SUP", &oc.sup);
        def.push_str(match oc.kind {
            ObjectClassKind::Abstract => " ABSTRACT",
            ObjectClassKind::Structural => " STRUCTURAL",
            ObjectClassKind::Auxiliary => " AUXILIARY",
        });
        render_oids(&mut def, "MUST", &oc.must);
        render_oids(&mut def, "MAY", &oc.may);
        render_ext(&mut def, &ext);
        def.push_str(" )");
        oc.definition = def;

        // A class defined again with its OID and name (dsee.schema's
        // changeLogEntry, the built-in one the retro change log shows):
        // the first definition stays, as for attribute types.
        if let Some(old) = self.object_class(&oc.oid) {
            if oc.names.first().is_some_and(|n| old.has_name(n)) {
                return Ok(());
            }
        }
        let keys: Vec<String> = std::iter::once(oc.oid.clone())
            .chain(oc.names.iter().map(|n| n.to_ascii_lowercase()))
            .collect();
        for k in &keys {
            if self.class_index.contains_key(k) {
                return Err(format!("object class '{k}' is already defined"));
            }
        }
        let i = self.classes.len();
        for k in keys {
            self.class_index.insert(k, i);
        }
        for n in &oc.names {
            self.class_index.insert(n.clone(), i);
        }
        self.classes.push(oc);
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Lookups

    /// True when some attribute type has `at` as its SUP.
    pub fn has_subtypes(&self, at: &AttributeType) -> bool {
        self.supertypes.contains(&at.oid)
    }

    /// The place of the attribute type named `name_or_oid` (see
    /// [`Schema::attribute_at`]).
    pub(crate) fn attribute_id(&self, name_or_oid: &str) -> Option<usize> {
        lookup(&self.attr_index, name_or_oid)
    }

    /// The attribute type at place `i` (from [`Schema::attribute_id`], a
    /// type's `sup_id` or a class's `must_ids` / `may_ids`).
    pub(crate) fn attribute_at(&self, i: usize) -> &AttributeType {
        &self.attrs[i]
    }

    /// Attribute type by name (case-insensitive) or OID.
    pub fn attribute(&self, name_or_oid: &str) -> Option<&AttributeType> {
        self.attrs.get(lookup(&self.attr_index, name_or_oid)?)
    }

    /// Object class by name (case-insensitive) or OID.
    pub fn object_class(&self, name_or_oid: &str) -> Option<&ObjectClass> {
        self.classes.get(lookup(&self.class_index, name_or_oid)?)
    }

    pub fn attributes(&self) -> impl Iterator<Item = &AttributeType> {
        self.attrs.iter()
    }

    pub fn object_classes(&self) -> impl Iterator<Item = &ObjectClass> {
        self.classes.iter()
    }

    /// Known syntaxes: (OID, RFC 4512 SyntaxDescription).
    pub fn syntaxes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.syntaxes
            .iter()
            .map(|s| (s.oid.as_str(), s.definition.as_str()))
    }

    pub(crate) fn syntax_check(&self, at: &AttributeType) -> Check {
        at.syntax
            .as_ref()
            .and_then(|s| self.syntax_index.get(s))
            .and_then(|&i| self.syntaxes.get(i))
            .map(|s| s.check)
            .unwrap_or(Check::Any)
    }

    /// Resolve an attribute description ("CN;Lang-EN") to its canonical
    /// form ("cn;lang-en": primary name as defined, options lowercased,
    /// sorted and deduplicated) and its type. Without options the form is
    /// the type's name, borrowed (most callers want only the type).
    pub fn canonical_desc(
        &self,
        desc: &str,
    ) -> Result<(Cow<'_, str>, &AttributeType), SchemaViolation> {
        let undefined = |message: String| SchemaViolation {
            code: ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
            message,
        };
        let parsed = AttrDesc::new(desc);
        let at = self
            .attribute(parsed.base())
            .ok_or_else(|| undefined(format!("{desc}: attribute type undefined")))?;
        let mut opts: Vec<String> = Vec::new();
        for o in parsed.options() {
            if o.is_empty() || !o.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
                return Err(undefined(format!("{desc}: invalid attribute option '{o}'")));
            }
            opts.push(o.to_ascii_lowercase());
        }
        if opts.is_empty() {
            return Ok((Cow::Borrowed(at.name()), at));
        }
        opts.sort();
        opts.dedup();
        let mut s = at.name().to_string();
        for o in opts {
            s.push(';');
            s.push_str(&o);
        }
        Ok((Cow::Owned(s), at))
    }

    /// Whether a description a client sent names userPassword, by any of
    /// its names or its OID (`2.5.4.35;x` too). Stored descriptions are
    /// canonical, so `desc::is_password` serves for them.
    pub fn names_password(&self, desc: &str) -> bool {
        self.attribute(AttrDesc::new(desc).base())
            .is_some_and(|at| at.oid == USER_PASSWORD_OID)
    }

    /// Whether `at` is `of` or a subtype of it (follows the SUP chain).
    pub fn is_subtype(&self, at: &AttributeType, of: &AttributeType) -> bool {
        let mut cur = Some(at);
        for _ in 0..MAX_SUP_DEPTH {
            let Some(c) = cur else { return false };
            if c.oid == of.oid {
                return true;
            }
            cur = c.sup.as_deref().and_then(|s| self.attribute(s));
        }
        false
    }

    /// `oc` and all its superclasses, each once, `oc` first.
    pub(crate) fn class_closure<'a>(&'a self, oc: &'a ObjectClass) -> Vec<&'a ObjectClass> {
        let mut out: Vec<&ObjectClass> = Vec::new();
        let mut stack = vec![oc];
        while let Some(c) = stack.pop() {
            // The schema holds each class once: compared by address.
            if out.iter().any(|x| std::ptr::eq(*x, c)) {
                continue;
            }
            out.push(c);
            // Bounded: each class is visited once and the schema is finite.
            for s in &c.sup {
                if let Some(p) = self.object_class(s) {
                    stack.push(p);
                }
            }
        }
        out
    }

    /// The class named `oc` followed by all its superclasses, each once.
    /// (An equality index on objectClass should index every class of this
    /// closure, so that `(objectClass=person)` finds inetOrgPerson entries
    /// as filter evaluation does.)
    pub fn superclasses(&self, oc: &str) -> Option<Vec<&ObjectClass>> {
        self.object_class(oc).map(|c| self.class_closure(c))
    }

    /// MUST and MAY attribute types of `oc` including those of its
    /// superclasses, MUST first, each once.
    pub fn object_class_attrs(&self, oc: &str) -> Option<Vec<&AttributeType>> {
        let oc = self.object_class(oc)?;
        let closure = self.class_closure(oc);
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for list in [true, false] {
            for c in &closure {
                for a in if list { &c.must } else { &c.may } {
                    if let Some(at) = self.attribute(a) {
                        if seen.insert(at.oid.as_str()) {
                            out.push(at);
                        }
                    }
                }
            }
        }
        Some(out)
    }

    // -----------------------------------------------------------------------
    // Values

    /// Check `value` against the type's syntax. DN-valued syntaxes must
    /// also name only known attribute types (the DN must normalise).
    pub fn validate(&self, at: &AttributeType, value: &[u8]) -> Result<(), String> {
        let check = self.syntax_check(at);
        check_value(check, value)?;
        if check == Check::Dn || check == Check::NameAndOptionalUid {
            let (dn, _) = crate::syntax::split_name_and_uid(value);
            let dn = if check == Check::Dn { value } else { dn };
            let s = std::str::from_utf8(dn).map_err(|_| "DN is not UTF-8".to_string())?;
            let parsed = Dn::parse(s).map_err(|e| e.to_string())?;
            self.normalize_dn(&parsed)?;
        }
        Ok(())
    }

    fn rule_of(slot: &Option<String>) -> Option<&'static crate::matching::MatchingRule> {
        slot.as_deref().and_then(find_rule)
    }

    /// Normalised form under the type's equality rule.
    pub fn normalize(&self, at: &AttributeType, value: &[u8]) -> Result<Vec<u8>, String> {
        let rule = Self::rule_of(&at.equality)
            .ok_or_else(|| format!("{} has no equality matching rule", at.name()))?;
        self.normalize_with(rule, value, 0)
    }

    /// [`Schema::normalize`] in as few bytes as the rule allows, for index
    /// keys: two values match exactly when their compact forms are equal,
    /// and compact forms sort as the normalised forms do. A UUID
    /// (uuidMatch) is its 16 bytes instead of 36 characters; under every
    /// other rule the normalised form is already the compact one.
    pub fn normalize_compact(&self, at: &AttributeType, value: &[u8]) -> Result<Vec<u8>, String> {
        let rule = Self::rule_of(&at.equality)
            .ok_or_else(|| format!("{} has no equality matching rule", at.name()))?;
        let n = self.normalize_with(rule, value, 0)?;
        Ok(match rule.algo {
            Algo::Uuid => uuid_bytes(&n).map_or(n, |b| b.to_vec()),
            _ => n,
        })
    }

    /// Whether the type's equality rule is uuidMatch: its compact values
    /// (16 bytes) are uniformly spread, so their first bytes serve as an
    /// index key that keeps ranges of UUIDs ranges of keys.
    pub fn equality_is_uuid(&self, at: &AttributeType) -> bool {
        Self::rule_of(&at.equality).is_some_and(|r| matches!(r.algo, Algo::Uuid))
    }

    /// A substring assertion part under the type's substrings rule (runs of
    /// spaces collapsed to one, ends kept).
    pub fn normalize_substring_part(
        &self,
        at: &AttributeType,
        part: &[u8],
    ) -> Result<Vec<u8>, String> {
        let rule = Self::rule_of(&at.substr)
            .ok_or_else(|| format!("{} has no substrings matching rule", at.name()))?;
        self.substring_part_with(rule, part)
    }

    /// The order a server-side sort (RFC 2891) uses for values of `at`:
    /// the ordering rule `requested` (name or OID), else the type's
    /// ORDERING rule, else the ordering rule that compares as its EQUALITY
    /// rule does — `cn`, `sn`, `mail` have no ORDERING in the standard
    /// schema, yet address books sort by them. Err names the problem when
    /// the requested rule is unknown or not an ordering rule, or when the
    /// type has no order at all.
    pub fn sort_order(
        &self,
        at: &AttributeType,
        requested: Option<&str>,
    ) -> Result<SortOrder, String> {
        use crate::matching::{Kind, MATCHING_RULES};
        if let Some(name) = requested {
            return match find_rule(name) {
                Some(r) if r.kind == Kind::Ordering => Ok(SortOrder(r)),
                Some(r) => Err(format!("{} is not an ordering rule", r.name)),
                None => Err(format!("unknown matching rule {name}")),
            };
        }
        if let Some(r) = Self::rule_of(&at.ordering) {
            return Ok(SortOrder(r));
        }
        let like_equality = Self::rule_of(&at.equality).and_then(|eq| {
            MATCHING_RULES
                .iter()
                .find(|r| r.kind == Kind::Ordering && r.algo == eq.algo)
        });
        like_equality
            .map(SortOrder)
            .ok_or_else(|| format!("{} has no ordering", at.name()))
    }

    /// Whether the type has an ORDERING rule of its own or inherited (else
    /// [`Schema::sort_order`] falls back to one like its EQUALITY rule).
    pub fn has_ordering(&self, at: &AttributeType) -> bool {
        Self::rule_of(&at.ordering).is_some()
    }

    /// Bytes whose memcmp order is `order`'s order for `value`; None when
    /// the value does not fit the rule (it then sorts as if absent).
    pub fn sort_key(&self, order: SortOrder, value: &[u8]) -> Option<Vec<u8>> {
        self.ordering_key_with(order.0, value)
    }

    /// Bytes whose memcmp order is the type's ordering rule's order.
    pub fn ordering_key(&self, at: &AttributeType, value: &[u8]) -> Option<Vec<u8>> {
        let rule = Self::rule_of(&at.ordering)?;
        self.ordering_key_with(rule, value)
    }

    /// Key for approximate matching (`~=`); two values match approximately
    /// iff their keys are equal. For string types: the caseIgnore-prepared
    /// value split into words, each replaced by a phonetic code
    /// (`matching::phonetic`), joined by single spaces. For other types:
    /// the equality-normalised value (approx = equality), or the raw bytes
    /// if it does not normalise.
    pub fn approx_key(&self, at: &AttributeType, value: &[u8]) -> Vec<u8> {
        let rule = Self::rule_of(&at.equality);
        let stringy = rule.is_some_and(|r| {
            matches!(
                r.algo,
                Algo::CaseIgnore
                    | Algo::CaseExact
                    | Algo::CaseIgnoreIa5
                    | Algo::CaseExactIa5
                    | Algo::CaseIgnoreList
            )
        });
        if stringy {
            if let Ok(p) = prepare_bytes(value, true, Spaces::Value) {
                let s = String::from_utf8_lossy(&p).into_owned();
                let words: Vec<String> = s
                    .split([' ', '$', '-', ','])
                    .filter(|w| !w.is_empty())
                    .map(phonetic)
                    .collect();
                return words.join(" ").into_bytes();
            }
        }
        match rule {
            Some(r) => self
                .normalize_with(r, value, 0)
                .unwrap_or_else(|_| value.to_vec()),
            None => value.to_vec(),
        }
    }

    // -----------------------------------------------------------------------
    // DNs

    /// Canonical DN string used as a database key: each type → lowercased
    /// primary name, each value normalised by its equality rule (raw when
    /// the type has none) and RFC 4514-escaped, AVAs of a multi-valued RDN
    /// sorted, RDNs joined by ',' without spaces.
    pub fn normalize_dn(&self, dn: &Dn) -> Result<String, String> {
        self.normalize_dn_depth(dn, 0)
    }

    pub fn normalize_rdn(&self, rdn: &Rdn) -> Result<String, String> {
        self.normalize_rdn_depth(rdn, 0)
    }

    pub(crate) fn normalize_dn_depth(&self, dn: &Dn, depth: u32) -> Result<String, String> {
        let mut out = String::new();
        for (i, rdn) in dn.rdns.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&self.normalize_rdn_depth(rdn, depth)?);
        }
        Ok(out)
    }

    fn normalize_rdn_depth(&self, rdn: &Rdn, depth: u32) -> Result<String, String> {
        // One AVA (nearly every RDN): nothing to sort or join.
        if let [ava] = rdn.avas.as_slice() {
            return self.normalize_ava(ava, depth);
        }
        let mut avas = Vec::with_capacity(rdn.avas.len());
        for ava in &rdn.avas {
            avas.push(self.normalize_ava(ava, depth)?);
        }
        avas.sort();
        // Two AVAs with the same type and value are one AVA.
        avas.dedup();
        Ok(avas.join("+"))
    }

    /// `type=value` of one AVA, both normalised, the value escaped.
    fn normalize_ava(&self, ava: &RdnAva, depth: u32) -> Result<String, String> {
        let at = self
            .attribute(&ava.attr)
            .ok_or_else(|| format!("undefined attribute type '{}' in DN", ava.attr))?;
        let value = match Self::rule_of(&at.equality) {
            Some(rule) => self
                .normalize_with(rule, &ava.value, depth)
                .map_err(|e| format!("invalid value for '{}' in DN: {e}", ava.attr))?,
            None => ava.value.clone(),
        };
        let mut s = String::with_capacity(at.name().len() + 1 + value.len());
        s.push_str(at.name());
        s.make_ascii_lowercase();
        s.push('=');
        escape_value(&value, &mut s);
        Ok(s)
    }

    // -----------------------------------------------------------------------
    // Subschema

    /// Values of the subschema subentry's attributes, each an RFC 4512
    /// description string.
    pub fn subschema_attrs(&self) -> Vec<(&'static str, Vec<String>)> {
        let ats = self.attrs.iter().map(|a| a.definition.clone()).collect();
        let ocs = self.classes.iter().map(|c| c.definition.clone()).collect();
        let syns = self.syntaxes.iter().map(|s| s.definition.clone()).collect();
        let mrs = MATCHING_RULES.iter().map(|r| r.definition()).collect();
        let mut uses = Vec::new();
        for r in MATCHING_RULES {
            let applies: Vec<&str> = self
                .attrs
                .iter()
                .filter(|a| {
                    [&a.equality, &a.ordering, &a.substr]
                        .iter()
                        .any(|x| x.as_deref() == Some(r.name))
                        || a.syntax.as_deref().is_some_and(|s| r.applies_to_syntax(s))
                })
                .map(|a| a.name())
                .collect();
            if applies.is_empty() {
                continue;
            }
            let mut def = format!("( {} NAME '{}'", r.oid, r.name);
            let list: Vec<String> = applies.iter().map(|s| s.to_string()).collect();
            render_oids(&mut def, "APPLIES", &list);
            def.push_str(" )");
            uses.push(def);
        }
        vec![
            ("attributeTypes", ats),
            ("objectClasses", ocs),
            ("ldapSyntaxes", syns),
            ("matchingRules", mrs),
            ("matchingRuleUse", uses),
        ]
    }
}

/// Split schema file text into (line number, definition text) blocks.
/// `text` with every word outside quotes that is an OID macro, or a macro
/// followed by `:suffix`, replaced by its OID.
fn expand_macros(text: &str, macros: &HashMap<String, String>) -> String {
    if macros.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let mut quoted = false;
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(&expand_word(word, macros));
        word.clear();
    };
    for c in text.chars() {
        if quoted {
            out.push(c);
            quoted = c != '\'';
        } else if c == '\'' {
            flush(&mut word, &mut out);
            out.push(c);
            quoted = true;
        } else if c.is_whitespace() || matches!(c, '(' | ')' | '$' | '{') {
            flush(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// `word` with an OID macro (`NAME` or `NAME:suffix`) replaced by its OID.
fn expand_word(word: &str, macros: &HashMap<String, String>) -> String {
    let (name, suffix) = match word.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (word, None),
    };
    // One or more numbers joined by dots.
    let ok_suffix = suffix.is_none_or(|s| {
        s.split('.')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    match macros.get(&name.to_ascii_lowercase()).filter(|_| ok_suffix) {
        Some(oid) => match suffix {
            Some(s) => format!("{oid}.{s}"),
            None => oid.clone(),
        },
        None => word.to_string(),
    }
}

fn blocks(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            open = false;
            continue;
        }
        let continuation = line.starts_with(|c: char| c.is_ascii_whitespace());
        match out.last_mut() {
            Some((_, cur)) if continuation && open => {
                cur.push(' ');
                cur.push_str(line.trim());
            }
            _ => {
                out.push((i + 1, line.trim().to_string()));
                open = true;
            }
        }
    }
    out
}

/// An attribute type's USAGE keyword (RFC 4512 4.1.2).
fn usage(u: &str) -> Result<Usage, String> {
    Ok(match u.to_ascii_lowercase().as_str() {
        "userapplications" => Usage::UserApplications,
        "directoryoperation" => Usage::DirectoryOperation,
        "distributedoperation" => Usage::DistributedOperation,
        "dsaoperation" => Usage::DsaOperation,
        _ => return Err(format!("unknown USAGE '{u}'")),
    })
}

/// An attribute type's definition as declared (its syntax as written,
/// length bound included), before its rules are resolved or anything is
/// inherited: what the subschema entry shows.
fn attribute_definition(
    at: &AttributeType,
    syntax_written: Option<&str>,
    ext: &Extensions,
) -> String {
    let mut def = format!("( {}", at.oid);
    render_names(&mut def, &at.names);
    if let Some(x) = &at.desc {
        let _ = write!(def, " DESC {}", quote(x));
    }
    if at.obsolete {
        def.push_str(" OBSOLETE");
    }
    for (k, v) in [
        ("SUP", &at.sup),
        ("EQUALITY", &at.equality),
        ("ORDERING", &at.ordering),
        ("SUBSTR", &at.substr),
        ("SYNTAX", &syntax_written.map(str::to_string)),
    ] {
        if let Some(v) = v {
            let _ = write!(def, " {k} {v}");
        }
    }
    for (flag, k) in [
        (at.single_value, "SINGLE-VALUE"),
        (at.collective, "COLLECTIVE"),
        (at.no_user_modification, "NO-USER-MODIFICATION"),
    ] {
        if flag {
            let _ = write!(def, " {k}");
        }
    }
    if at.usage != Usage::UserApplications {
        let _ = write!(def, " USAGE {}", at.usage.keyword());
    }
    render_ext(&mut def, ext);
    def.push_str(" )");
    def
}

const USER_PASSWORD_OID: &str = "2.5.4.35";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        let schema = Schema::standard();
        let canon = |d: &str| schema.canonical_desc(d).map(|(s, _)| s);
        assert_eq!(
            canon("CN;Lang-EN;binary;lang-en").unwrap(),
            "cn;binary;lang-en"
        );
        assert_eq!(canon("2.5.4.3").unwrap(), "cn");
        let e = canon("cn;;x").unwrap_err();
        assert_eq!(e.code, ResultCode::UNDEFINED_ATTRIBUTE_TYPE);
        assert!(e.message.contains("invalid attribute option ''"));
        assert!(canon("cn;a_b").is_err());
        assert!(canon("noSuchType")
            .unwrap_err()
            .message
            .contains("undefined"));
    }

    #[test]
    fn a_uuid_is_compacted_to_its_bytes_in_the_order_of_its_text() {
        let s = Schema::standard();
        let at = s.attribute("entryUUID").unwrap();
        let k = |v: &str| s.normalize_compact(at, v.as_bytes()).unwrap();
        let one = k("F7ABFB7F-75F2-44A3-91AA-5B2CE7704BFF");
        assert_eq!(one.len(), 16);
        assert_eq!(one[..4], [0xf7, 0xab, 0xfb, 0x7f]);
        assert_eq!(one[15], 0xff);
        assert_eq!(one, k("f7abfb7f-75f2-44a3-91aa-5b2ce7704bff"));
        // Byte order is the normalised text's order.
        let texts = [
            "00000000-0000-0000-0000-000000000000",
            "09ffffff-ffff-ffff-ffff-ffffffffffff",
            "0a000000-0000-0000-0000-000000000000",
            "f7abfb7f-75f2-44a3-91aa-5b2ce7704bfe",
            "f7abfb7f-75f2-44a3-91aa-5b2ce7704bff",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
        ];
        for w in texts.windows(2) {
            assert!(k(w[0]) < k(w[1]), "{} < {}", w[0], w[1]);
        }
        assert!(s
            .normalize_compact(at, b"f7abfb7f75f244a391aa5b2ce7704bff")
            .is_err());
        // Other rules: the normalised form itself.
        let cn = s.attribute("cn").unwrap();
        assert_eq!(
            s.normalize_compact(cn, b"  Kayla  Simpson ").unwrap(),
            s.normalize(cn, b"  Kayla  Simpson ").unwrap()
        );
    }

    #[test]
    fn names_password_by_any_name() {
        let schema = Schema::standard();
        assert!(schema.names_password("userPassword"));
        assert!(schema.names_password("2.5.4.35;x"));
        assert!(!schema.names_password("cn"));
    }

    #[test]
    fn standard_loads() {
        let s = Schema::standard();
        let cn = s.attribute("commonName").unwrap();
        assert_eq!(cn.name(), "cn");
        assert_eq!(cn.equality.as_deref(), Some("caseIgnoreMatch"));
        assert_eq!(cn.syntax.as_deref(), Some("1.3.6.1.4.1.1466.115.121.1.15"));
        assert_eq!(s.attribute("2.5.4.3").unwrap().oid, "2.5.4.3");
        assert!(s.is_subtype(cn, s.attribute("name").unwrap()));
        assert!(!s.is_subtype(s.attribute("name").unwrap(), cn));
        assert!(s.object_class("INETORGPERSON").is_some());
        for name in [
            "posixAccount",
            "shadowAccount",
            "dNSDomain",
            "referral",
            "subschema",
            "extensibleObject",
            "uidObject",
            "groupOfUniqueNames",
            "account",
        ] {
            assert!(s.object_class(name).is_some(), "{name}");
        }
        for name in [
            "entryUUID",
            "entryCSN",
            "contextCSN",
            "entryDN",
            "hasSubordinates",
            "numSubordinates",
            "supportedLDAPVersion",
            "vendorName",
            "rfc822Mailbox",
            "gidNumber",
            "x500UniqueIdentifier",
            "userPKCS12",
            "ref",
        ] {
            assert!(s.attribute(name).is_some(), "{name}");
        }
        let ts = s.attribute("modifyTimestamp").unwrap();
        assert!(ts.is_operational() && ts.no_user_modification);
        assert_eq!(
            s.attribute("contextCSN").unwrap().usage,
            Usage::DsaOperation
        );
    }

    #[test]
    fn object_class_attrs_include_superclasses() {
        let s = Schema::standard();
        let attrs = s.object_class_attrs("inetOrgPerson").unwrap();
        let names: Vec<&str> = attrs.iter().map(|a| a.name()).collect();
        for n in [
            "objectClass",
            "sn",
            "cn",
            "title",
            "mail",
            "telephoneNumber",
        ] {
            assert!(names.contains(&n), "{n}");
        }
        assert!(s.object_class_attrs("nope").is_none());
        let sup: Vec<&str> = s
            .superclasses("inetOrgPerson")
            .unwrap()
            .iter()
            .map(|c| c.name())
            .collect();
        assert_eq!(sup.len(), 4);
        for n in ["inetOrgPerson", "organizationalPerson", "person", "top"] {
            assert!(sup.contains(&n), "{n}");
        }
    }

    #[test]
    fn definitions_errors_name_line() {
        let mut s = Schema::standard();
        let e = s
            .add_definitions("# c\n\nattributetype ( 1.2.3.4 NAME 'x'\n  SUP nosuch )\n")
            .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("nosuch"), "{e}");
        let e = s
            .add_definitions("objectclass ( 1.2.3.5 NAME 'y' MAY foo )")
            .unwrap_err();
        assert!(e.message.contains("foo"));
        assert!(s
            .add_definitions("attributetype ( 2.5.4.3 NAME 'dup' SUP name )")
            .is_err());
        assert!(s
            .add_definitions("attributetype ( 1.2.3.6 NAME 'z' EQUALITY fooMatch SYNTAX 1.2.3 )")
            .is_err());
        assert!(s.add_definitions("bogus ( 1.2.3 )").is_err());
        // As slapd: any keyword beginning with `attribute` defines one.
        s.add_definitions("attributeype ( 1.2.3.9 NAME 'typo' SUP name )")
            .unwrap();
        assert!(s.attribute("typo").is_some());
        // All or nothing.
        let before = s.attributes().count();
        assert!(s
            .add_definitions(
                "attributetype ( 1.2.3.7 NAME 'ok' SUP name )\nattributetype ( 1.2.3.8 NAME 'bad' )"
            )
            .is_err());
        assert_eq!(s.attributes().count(), before);
        assert!(s.attribute("ok").is_none());
    }

    #[test]
    fn custom_definitions_and_rendering() {
        let mut s = Schema::standard();
        s.add_definitions(
            "ldapsyntax ( 1.2.3.1 DESC 'my syntax' )\n\
             attributetype ( 1.2.3.2 NAME ( 'fooName' 'fn' ) DESC 'it\\27s' SUP name\n  X-ORIGIN 'test' )\n\
             objectclass ( 1.2.3.3 NAME 'fooObject' SUP top AUXILIARY MUST fn MAY ( mail $ CN ) )",
        )
        .unwrap();
        let at = s.attribute("FN").unwrap();
        assert_eq!(at.equality.as_deref(), Some("caseIgnoreMatch"));
        assert_eq!(
            at.definition,
            "( 1.2.3.2 NAME ( 'fooName' 'fn' ) DESC 'it\\27s' SUP name X-ORIGIN 'test' )"
        );
        let oc = s.object_class("fooobject").unwrap();
        assert_eq!(oc.kind, ObjectClassKind::Auxiliary);
        assert_eq!(oc.may, vec!["mail", "cn"]);
        assert_eq!(
            oc.definition,
            "( 1.2.3.3 NAME 'fooObject' SUP top AUXILIARY MUST fooName MAY ( mail $ cn ) )"
        );
        let sub = s.subschema_attrs();
        let names: Vec<&str> = sub.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "attributeTypes",
                "objectClasses",
                "ldapSyntaxes",
                "matchingRules",
                "matchingRuleUse"
            ]
        );
        assert!(sub[2].1.iter().any(|d| d.contains("'my syntax'")));
        assert!(sub[3].1.iter().any(
            |d| d == "( 2.5.13.2 NAME 'caseIgnoreMatch' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )"
        ));
        // Every rendered definition parses again.
        let mut fresh = Schema::builtin();
        let mut text = String::new();
        for d in &sub[0].1 {
            text.push_str(&format!("attributetype {d}\n"));
        }
        for d in &sub[1].1 {
            text.push_str(&format!("objectclass {d}\n"));
        }
        fresh.add_definitions(&text).unwrap();
        assert_eq!(fresh.attributes().count(), s.attributes().count());
    }

    #[test]
    fn canonical_descriptions() {
        let s = Schema::standard();
        let (d, at) = s
            .canonical_desc("CommonName;Lang-EN;binary;lang-en")
            .unwrap();
        assert_eq!(d, "cn;binary;lang-en");
        assert_eq!(at.oid, "2.5.4.3");
        assert_eq!(s.canonical_desc("2.5.4.4").unwrap().0, "sn");
        let e = s.canonical_desc("nosuch").unwrap_err();
        assert_eq!(e.code, ResultCode::UNDEFINED_ATTRIBUTE_TYPE);
        assert!(s.canonical_desc("cn;").is_err());
        assert!(s.canonical_desc("cn;a_b").is_err());
    }

    #[test]
    fn sort_orders() {
        let s = Schema::standard();
        let at = |n: &str| s.attribute(n).unwrap();
        // The type's ORDERING rule; else the one that compares as its
        // EQUALITY rule; a requested rule must be an ordering rule.
        assert_eq!(
            s.sort_order(at("uidNumber"), None).unwrap().name(),
            "integerOrderingMatch"
        );
        assert_eq!(
            s.sort_order(at("cn"), None).unwrap().name(),
            "caseIgnoreOrderingMatch"
        );
        let exact = s.sort_order(at("cn"), Some("2.5.13.6")).unwrap();
        assert_eq!(exact.name(), "caseExactOrderingMatch");
        assert!(s.sort_order(at("cn"), Some("caseIgnoreMatch")).is_err());
        assert!(s.sort_order(at("cn"), Some("noSuchRule")).is_err());
        assert!(s.sort_order(at("objectClass"), None).is_err());
        // Keys order as the rule does: numbers numerically, text by case.
        let num = s.sort_order(at("uidNumber"), None).unwrap();
        assert!(s.sort_key(num, b"9") < s.sort_key(num, b"10"));
        assert!(s.sort_key(num, b"-5") < s.sort_key(num, b"3"));
        let ci = s.sort_order(at("cn"), None).unwrap();
        assert_eq!(s.sort_key(ci, b"Smith"), s.sort_key(ci, b"smith"));
        assert!(s.sort_key(exact, b"Smith") < s.sort_key(exact, b"smith"));
    }

    #[test]
    fn normalize_values() {
        let s = Schema::standard();
        let cn = s.attribute("cn").unwrap();
        assert_eq!(
            s.normalize(cn, b"  a   B ").unwrap(),
            s.normalize(cn, b"A b").unwrap()
        );
        let tel = s.attribute("telephoneNumber").unwrap();
        assert_eq!(s.normalize(tel, b"+1 555-0100").unwrap(), b"+15550100");
        let mail = s.attribute("mail").unwrap();
        assert_eq!(
            s.normalize(mail, b"Foo@Example.COM").unwrap(),
            b"foo@example.com"
        );
        let home = s.attribute("homeDirectory").unwrap();
        assert_eq!(s.normalize(home, b"/Home/X").unwrap(), b"/Home/X");
        let member = s.attribute("member").unwrap();
        assert_eq!(
            s.normalize(member, b"CN=A B , O=X").unwrap(),
            b"cn=a b,o=x".to_vec()
        );
        assert!(s.normalize(member, b"foo=bar").is_err());
        let um = s.attribute("uniqueMember").unwrap();
        assert_eq!(
            s.normalize(um, b"CN=A#'01'B").unwrap(),
            b"cn=a#'01'B".to_vec()
        );
        let oc = s.attribute("objectClass").unwrap();
        assert_eq!(s.normalize(oc, b"Person").unwrap(), b"2.5.6.6");
        assert_eq!(s.normalize(oc, b"2.5.6.6").unwrap(), b"2.5.6.6");
        let photo = s.attribute("jpegPhoto").unwrap();
        assert!(s.normalize(photo, b"x").is_err());
        let uidn = s.attribute("uidNumber").unwrap();
        assert!(s.normalize(uidn, b"12").is_ok());
        assert!(s.normalize(uidn, b"x").is_err());
        assert_eq!(
            s.normalize_substring_part(cn, b" A  B ").unwrap(),
            b" a b ".to_vec()
        );
        let uuid = s.attribute("entryUUID").unwrap();
        assert_eq!(
            s.normalize(uuid, b"597AE2F6-16A6-1027-98F4-D28B5365DC14")
                .unwrap(),
            b"597ae2f6-16a6-1027-98f4-d28b5365dc14".to_vec()
        );
    }

    #[test]
    fn ordering_keys() {
        let s = Schema::standard();
        let uidn = s.attribute("uidNumber").unwrap();
        let k: Vec<_> = ["-10", "-2", "0", "3", "25"]
            .iter()
            .map(|v| s.ordering_key(uidn, v.as_bytes()).unwrap())
            .collect();
        for w in k.windows(2) {
            assert!(w[0] < w[1]);
        }
        assert!(s.ordering_key(uidn, b"abc").is_none());
        let ts = s.attribute("createTimestamp").unwrap();
        let a = s.ordering_key(ts, b"20240101100000+0200").unwrap();
        let b = s.ordering_key(ts, b"20240101090000Z").unwrap();
        assert!(a < b);
        assert_eq!(
            s.normalize(ts, b"20240101100000+0200").unwrap(),
            b"20240101080000Z".to_vec()
        );
        assert!(s.ordering_key(s.attribute("cn").unwrap(), b"x").is_none());
    }

    #[test]
    fn approx_keys() {
        let s = Schema::standard();
        let cn = s.attribute("cn").unwrap();
        assert_eq!(
            s.approx_key(cn, b"Jon  Smith"),
            s.approx_key(cn, b"john smyth")
        );
        assert_ne!(
            s.approx_key(cn, b"Jon Smith"),
            s.approx_key(cn, b"Jon Jones")
        );
        let uidn = s.attribute("uidNumber").unwrap();
        assert_eq!(s.approx_key(uidn, b"5"), b"5");
    }

    #[test]
    fn dn_normalization() {
        let s = Schema::standard();
        let dn = Dn::parse("CN=Foo\\, Bar+uid=x ,  DC=Example,dc=COM").unwrap();
        let n = s.normalize_dn(&dn).unwrap();
        assert_eq!(n, "cn=foo\\, bar+uid=x,dc=example,dc=com");
        let dn2 = Dn::parse("UID=X+commonName=FOO\\2c   bar,dc=example,DC=com").unwrap();
        assert_eq!(s.normalize_dn(&dn2).unwrap(), n);
        // The normalised form parses back and is a fixed point.
        let again = Dn::parse(&n).unwrap();
        assert_eq!(s.normalize_dn(&again).unwrap(), n);
        assert_eq!(s.normalize_dn(&Dn::root()).unwrap(), "");
        assert_eq!(
            s.normalize_dn(&Dn::parse("2.5.4.3=A").unwrap()).unwrap(),
            "cn=a"
        );
        let e = s.normalize_dn(&Dn::parse("foo=bar").unwrap()).unwrap_err();
        assert!(e.contains("foo"));
        assert!(s
            .normalize_dn(&Dn::parse("uidNumber=abc").unwrap())
            .is_err());
        assert_eq!(
            s.normalize_rdn(&Rdn::parse("sn=B+cn=A").unwrap()).unwrap(),
            "cn=a+sn=b"
        );
        // Nested DN values are bounded.
        let deep = "seeAlso=".repeat(20) + "cn=x";
        assert!(s.normalize_dn(&Dn::parse(&deep).unwrap()).is_err());
    }

    #[test]
    fn validate_values() {
        let s = Schema::standard();
        let v = |a: &str, x: &[u8]| s.validate(s.attribute(a).unwrap(), x);
        assert!(v("uidNumber", b"10").is_ok());
        assert!(v("uidNumber", b"ten").is_err());
        assert!(v("hasSubordinates", b"TRUE").is_ok());
        assert!(v("hasSubordinates", b"yes").is_err());
        assert!(v("member", b"cn=a,o=b").is_ok());
        assert!(v("member", b"not a dn").is_err());
        assert!(v("member", b"nosuchattr=a").is_err());
        assert!(v("c", b"DE").is_ok());
        assert!(v("c", b"Germany").is_err());
        assert!(v("cn", b"").is_err());
        assert!(v("cn", b"\xff").is_err());
        assert!(v("jpegPhoto", b"\xff\xd8").is_ok());
        assert!(v("createTimestamp", b"20240101000000Z").is_ok());
        assert!(v("createTimestamp", b"2024").is_err());
        assert!(v("mail", "ü@x".as_bytes()).is_err());
    }
}

#[cfg(test)]
mod macro_tests {
    use super::*;

    #[test]
    fn a_definition_repeated_with_its_oid_and_name_keeps_the_first() {
        let mut s = Schema::standard();
        let before = s.object_class("changeLogEntry").unwrap().definition.clone();
        s.add_definitions(
            "objectclass ( 2.16.840.1.113730.3.2.1 NAME 'changeLogEntry' SUP top STRUCTURAL MUST changeNumber )\n\
             attributetype ( 2.16.840.1.113730.3.1.5 NAME 'changeNumber' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n",
        )
        .unwrap();
        assert_eq!(s.object_class("changeLogEntry").unwrap().definition, before);
        // Another name on a known OID is still refused.
        let e = s
            .add_definitions("objectclass ( 2.16.840.1.113730.3.2.1 NAME 'other' SUP top )\n")
            .unwrap_err();
        assert!(e.message.contains("already defined"), "{e}");
    }

    #[test]
    fn oid_macros_expand_in_definitions() {
        let mut s = Schema::standard();
        s.add_definitions(
            "objectidentifier siteOID 1.3.6.1.4.1.99999\n\
             objectidentifier siteAT siteOID:1\n\
             attributetype ( siteAT:1 NAME 'siteBadge' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n",
        )
        .unwrap();
        assert_eq!(
            s.attribute("siteBadge").unwrap().oid,
            "1.3.6.1.4.1.99999.1.1"
        );
        // Unknown macros and quoted words are left alone.
        let e = s
            .add_definitions("objectidentifier other nope:1\n")
            .unwrap_err();
        assert!(e.message.contains("not an OID or a known macro"), "{e}");
        assert_eq!(
            expand_macros("( siteOID:3 NAME 'siteOID' )", &s.macros),
            "( 1.3.6.1.4.1.99999.3 NAME 'siteOID' )"
        );
        // A macro keeps its value; the same value again is harmless.
        let e = s
            .add_definitions("objectidentifier siteOID 1.2.3.4\n")
            .unwrap_err();
        assert!(e.message.contains("already defined"), "{e}");
        s.add_definitions("objectidentifier siteOID 1.3.6.1.4.1.99999\n")
            .unwrap();
        assert!(s.add_definitions("objectidentifier 2bad 1.2.3\n").is_err());
    }
}
