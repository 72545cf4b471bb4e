//! Search filters: the RFC 4511 section 4.5.1.7 BER form and the RFC 4515
//! string form.
//!
//! Attribute descriptions are kept exactly as sent (UTF-8 checked, not
//! normalised); assertion values are raw bytes and may be binary.
//!
//! Recursion: decoding and string parsing recurse once per nesting level and
//! stop at a depth limit, so hostile input cannot exhaust the stack. The
//! other recursive functions here (encode, Display) only ever see filters
//! that came out of those bounded decoders or were built by trusted code.

use std::fmt::{self, Write as _};

use crate::ber::{self, tag, Reader};
use crate::{DecodeError, DecodeLimits};

/// A search filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// May be empty: RFC 4526 absolute true `(&)`.
    And(Vec<Filter>),
    /// May be empty: RFC 4526 absolute false `(|)`.
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Equality(Ava),
    Substrings(SubstringFilter),
    GreaterOrEqual(Ava),
    LessOrEqual(Ava),
    Present(String),
    Approx(Ava),
    Extensible(MatchingRuleAssertion),
}

/// AttributeValueAssertion.
#[derive(Debug, Clone, PartialEq)]
pub struct Ava {
    pub attr: String,
    pub value: Vec<u8>,
}

/// Invariant after decoding/parsing: at least one of `initial`, `any`,
/// `final_` is present.
#[derive(Debug, Clone, PartialEq)]
pub struct SubstringFilter {
    pub attr: String,
    pub initial: Option<Vec<u8>>,
    pub any: Vec<Vec<u8>>,
    pub final_: Option<Vec<u8>>,
}

/// Invariant after decoding/parsing: `rule` or `attr` (or both) is present
/// (RFC 4511 4.5.1.7.7: "If the matchingRule field is absent, the type field
/// MUST be present").
#[derive(Debug, Clone, PartialEq)]
pub struct MatchingRuleAssertion {
    pub rule: Option<String>,
    pub attr: Option<String>,
    pub value: Vec<u8>,
    pub dn_attributes: bool,
}

/// Nesting limit of the RFC 4515 string parser.
pub const STRING_FILTER_MAX_DEPTH: usize = 100;

/// Absolute cap on BER filter nesting, whatever [`DecodeLimits::max_depth`]
/// says, so a misconfigured limit cannot turn into a stack overflow.
pub const HARD_MAX_DEPTH: usize = 256;

// Context-specific identifiers of the Filter CHOICE.
const AND: u8 = 0xa0;
const OR: u8 = 0xa1;
const NOT: u8 = 0xa2;
const EQUALITY: u8 = 0xa3;
const SUBSTRINGS: u8 = 0xa4;
const GREATER_OR_EQUAL: u8 = 0xa5;
const LESS_OR_EQUAL: u8 = 0xa6;
const PRESENT: u8 = 0x87;
const APPROX: u8 = 0xa8;
const EXTENSIBLE: u8 = 0xa9;

impl Filter {
    /// Nesting depth: a simple item is 1, `(&(a=b))` is 2, `(&)` is 1.
    /// Iterative, so safe on filters of any depth.
    pub fn depth(&self) -> usize {
        let mut max = 0;
        let mut stack: Vec<(&Filter, usize)> = vec![(self, 1)];
        while let Some((f, d)) = stack.pop() {
            max = max.max(d);
            match f {
                Filter::And(v) | Filter::Or(v) => stack.extend(v.iter().map(|c| (c, d + 1))),
                Filter::Not(c) => stack.push((c, d + 1)),
                _ => {}
            }
        }
        max
    }

    /// Number of filter nodes, counting and/or/not nodes as well as items.
    /// Iterative, so safe on filters of any depth.
    pub fn term_count(&self) -> usize {
        let mut n = 0;
        let mut stack: Vec<&Filter> = vec![self];
        while let Some(f) = stack.pop() {
            n += 1;
            match f {
                Filter::And(v) | Filter::Or(v) => stack.extend(v.iter()),
                Filter::Not(c) => stack.push(c),
                _ => {}
            }
        }
        n
    }

    /// Parses an RFC 4515 string filter, e.g. `(&(objectClass=person)(cn=J*))`.
    ///
    /// Also accepted, as OpenLDAP's tools do: a bare item without parentheses
    /// (`cn=foo`), ASCII whitespace around the filter and between the
    /// members of `&`/`|`, the empty `(&)`/`(|)` of RFC 4526, and the RFC 1960
    /// escapes `\*`, `\(`, `\)`, `\\` next to RFC 4515's `\XX`.
    pub fn parse(s: &str) -> Result<Filter, FilterParseError> {
        let mut p = Parser {
            s: s.as_bytes(),
            pos: 0,
        };
        p.skip_ws();
        let f = if p.peek() == Some(b'(') {
            let f = p.filter(1)?;
            p.skip_ws();
            f
        } else {
            p.item(false)?
        };
        if p.pos != p.s.len() {
            return Err(p.err("trailing characters after filter"));
        }
        Ok(f)
    }

    /// Appends the BER encoding of this filter.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Filter::And(v) | Filter::Or(v) => {
                let m = ber::begin(
                    out,
                    if matches!(self, Filter::And(_)) {
                        AND
                    } else {
                        OR
                    },
                );
                for f in v {
                    f.encode(out);
                }
                ber::end(out, m);
            }
            Filter::Not(f) => {
                let m = ber::begin(out, NOT);
                f.encode(out);
                ber::end(out, m);
            }
            Filter::Equality(a) => encode_ava(out, EQUALITY, a),
            Filter::GreaterOrEqual(a) => encode_ava(out, GREATER_OR_EQUAL, a),
            Filter::LessOrEqual(a) => encode_ava(out, LESS_OR_EQUAL, a),
            Filter::Approx(a) => encode_ava(out, APPROX, a),
            Filter::Present(attr) => ber::write_tlv(out, PRESENT, attr.as_bytes()),
            Filter::Substrings(s) => {
                let m = ber::begin(out, SUBSTRINGS);
                ber::write_tlv(out, tag::OCTET_STRING, s.attr.as_bytes());
                let m2 = ber::begin(out, tag::SEQUENCE);
                if let Some(i) = &s.initial {
                    ber::write_tlv(out, 0x80, i);
                }
                for a in &s.any {
                    ber::write_tlv(out, 0x81, a);
                }
                if let Some(f) = &s.final_ {
                    ber::write_tlv(out, 0x82, f);
                }
                ber::end(out, m2);
                ber::end(out, m);
            }
            Filter::Extensible(e) => {
                let m = ber::begin(out, EXTENSIBLE);
                if let Some(r) = &e.rule {
                    ber::write_tlv(out, 0x81, r.as_bytes());
                }
                if let Some(a) = &e.attr {
                    ber::write_tlv(out, 0x82, a.as_bytes());
                }
                ber::write_tlv(out, 0x83, &e.value);
                // DEFAULT FALSE: omitted when false, as DER requires.
                if e.dn_attributes {
                    ber::write_bool(out, 0x84, true);
                }
                ber::end(out, m);
            }
        }
    }

    /// Decodes one filter element given its identifier and contents.
    pub fn decode(tag: u8, contents: &[u8], limits: &DecodeLimits) -> Result<Filter, DecodeError> {
        let mut d = FilterDecoder {
            max_depth: limits.max_depth.min(HARD_MAX_DEPTH),
            max_terms: limits.max_filter_terms,
            terms: 0,
        };
        d.decode(tag, contents, 1)
    }
}

fn encode_ava(out: &mut Vec<u8>, t: u8, a: &Ava) {
    let m = ber::begin(out, t);
    ber::write_tlv(out, tag::OCTET_STRING, a.attr.as_bytes());
    ber::write_tlv(out, tag::OCTET_STRING, &a.value);
    ber::end(out, m);
}

struct FilterDecoder {
    max_depth: usize,
    max_terms: usize,
    /// Nodes decoded so far in this filter, checked against `max_terms`
    /// before each node is built.
    terms: usize,
}

impl FilterDecoder {
    // Filter ::= CHOICE {
    //      and             [0] SET SIZE (1..MAX) OF filter Filter,
    //      or              [1] SET SIZE (1..MAX) OF filter Filter,
    //      not             [2] Filter,
    //      equalityMatch   [3] AttributeValueAssertion,
    //      substrings      [4] SubstringFilter,
    //      greaterOrEqual  [5] AttributeValueAssertion,
    //      lessOrEqual     [6] AttributeValueAssertion,
    //      present         [7] AttributeDescription,
    //      approxMatch     [8] AttributeValueAssertion,
    //      extensibleMatch [9] MatchingRuleAssertion,
    //      ...  }
    //
    // Empty and/or sets are accepted (RFC 4526 absolute true/false).
    // Unknown CHOICE alternatives are rejected rather than evaluated as
    // Undefined (RFC 4511 4.5.1.7), since Filter has no variant for them.
    fn decode(&mut self, t: u8, body: &[u8], depth: usize) -> Result<Filter, DecodeError> {
        if depth > self.max_depth {
            return Err(DecodeError::new(format!(
                "filter nested deeper than {}",
                self.max_depth
            )));
        }
        self.terms += 1;
        if self.terms > self.max_terms {
            return Err(DecodeError::new(format!(
                "filter has more than {} terms",
                self.max_terms
            )));
        }
        Ok(match t {
            AND | OR => {
                let mut r = Reader::new(body);
                let mut v = Vec::new();
                while !r.is_empty() {
                    let (ct, cb) = r.read_tlv()?;
                    v.push(self.decode(ct, cb, depth + 1)?);
                }
                if t == AND {
                    Filter::And(v)
                } else {
                    Filter::Or(v)
                }
            }
            NOT => {
                let mut r = Reader::new(body);
                let (ct, cb) = r.read_tlv()?;
                r.finish("not filter")?;
                Filter::Not(Box::new(self.decode(ct, cb, depth + 1)?))
            }
            EQUALITY => Filter::Equality(decode_ava(body)?),
            GREATER_OR_EQUAL => Filter::GreaterOrEqual(decode_ava(body)?),
            LESS_OR_EQUAL => Filter::LessOrEqual(decode_ava(body)?),
            APPROX => Filter::Approx(decode_ava(body)?),
            PRESENT => Filter::Present(ber::decode_str(body, "present attribute")?.to_owned()),
            SUBSTRINGS => Filter::Substrings(decode_substrings(body)?),
            EXTENSIBLE => Filter::Extensible(decode_extensible(body)?),
            other => {
                return Err(DecodeError::new(format!(
                    "unknown filter choice 0x{other:02x}"
                )))
            }
        })
    }
}

// AttributeValueAssertion ::= SEQUENCE {
//      attributeDesc   AttributeDescription,
//      assertionValue  AssertionValue }
//
// AttributeDescription ::= LDAPString
// AssertionValue ::= OCTET STRING
pub(crate) fn decode_ava(body: &[u8]) -> Result<Ava, DecodeError> {
    let mut r = Reader::new(body);
    let attr = r
        .read_str(tag::OCTET_STRING, "attribute description")?
        .to_owned();
    let value = r.read(tag::OCTET_STRING)?.to_vec();
    r.skip_extensions()?;
    Ok(Ava { attr, value })
}

// SubstringFilter ::= SEQUENCE {
//      type           AttributeDescription,
//      substrings     SEQUENCE SIZE (1..MAX) OF substring CHOICE {
//           initial [0] AssertionValue,  -- can occur at most once
//           any     [1] AssertionValue,
//           final   [2] AssertionValue } -- can occur at most once
//      }
//
// initial, when present, must come first and final last (RFC 4511
// 4.5.1.7.2 orders them so).
fn decode_substrings(body: &[u8]) -> Result<SubstringFilter, DecodeError> {
    let mut r = Reader::new(body);
    let attr = r
        .read_str(tag::OCTET_STRING, "attribute description")?
        .to_owned();
    let mut s = r.read_constructed(tag::SEQUENCE)?;
    r.skip_extensions()?;
    let mut out = SubstringFilter {
        attr,
        initial: None,
        any: Vec::new(),
        final_: None,
    };
    let mut count = 0usize;
    while !s.is_empty() {
        let (t, v) = s.read_tlv()?;
        if out.final_.is_some() {
            return Err(DecodeError::new("substring after final"));
        }
        match t {
            0x80 if count == 0 => out.initial = Some(v.to_vec()),
            0x80 => return Err(DecodeError::new("initial substring not first")),
            0x81 => out.any.push(v.to_vec()),
            0x82 => out.final_ = Some(v.to_vec()),
            other => {
                return Err(DecodeError::new(format!(
                    "unknown substring choice 0x{other:02x}"
                )))
            }
        }
        count += 1;
    }
    if count == 0 {
        return Err(DecodeError::new("empty substrings sequence"));
    }
    Ok(out)
}

// MatchingRuleAssertion ::= SEQUENCE {
//      matchingRule    [1] MatchingRuleId OPTIONAL,
//      type            [2] AttributeDescription OPTIONAL,
//      matchValue      [3] AssertionValue,
//      dnAttributes    [4] BOOLEAN DEFAULT FALSE }
//
// MatchingRuleId ::= LDAPString
fn decode_extensible(body: &[u8]) -> Result<MatchingRuleAssertion, DecodeError> {
    let mut r = Reader::new(body);
    let rule = r.read_str_opt(0x81, "matchingRule")?.map(str::to_owned);
    let attr = r
        .read_str_opt(0x82, "extensible match type")?
        .map(str::to_owned);
    let value = r.read(0x83)?.to_vec();
    let dn_attributes = match r.read_opt(0x84)? {
        Some(b) => ber::decode_bool(b)?,
        None => false,
    };
    r.skip_extensions()?;
    if rule.is_none() && attr.is_none() {
        return Err(DecodeError::new(
            "extensible match needs a matchingRule or a type",
        ));
    }
    Ok(MatchingRuleAssertion {
        rule,
        attr,
        value,
        dn_attributes,
    })
}

// ---------------------------------------------------------------- Display

/// Writes `v` in RFC 4515 valueencoding: `*`, `(`, `)`, `\`, NUL, control and
/// other non-printable characters, and bytes that are not UTF-8 become `\XX`.
fn write_value(f: &mut fmt::Formatter<'_>, v: &[u8]) -> fmt::Result {
    for chunk in v.utf8_chunks() {
        for c in chunk.valid().chars() {
            let special = matches!(c, '*' | '(' | ')' | '\\' | '\0');
            if special || c.is_control() || c == '\u{fffd}' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    write!(f, "\\{b:02x}")?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        for b in chunk.invalid() {
            write!(f, "\\{b:02x}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('(')?;
        match self {
            Filter::And(v) | Filter::Or(v) => {
                f.write_char(if matches!(self, Filter::And(_)) {
                    '&'
                } else {
                    '|'
                })?;
                for c in v {
                    fmt::Display::fmt(c, f)?;
                }
            }
            Filter::Not(c) => {
                f.write_char('!')?;
                fmt::Display::fmt(c, f)?;
            }
            Filter::Equality(a) => {
                write!(f, "{}=", a.attr)?;
                write_value(f, &a.value)?;
            }
            Filter::GreaterOrEqual(a) => {
                write!(f, "{}>=", a.attr)?;
                write_value(f, &a.value)?;
            }
            Filter::LessOrEqual(a) => {
                write!(f, "{}<=", a.attr)?;
                write_value(f, &a.value)?;
            }
            Filter::Approx(a) => {
                write!(f, "{}~=", a.attr)?;
                write_value(f, &a.value)?;
            }
            Filter::Present(a) => write!(f, "{a}=*")?,
            Filter::Substrings(s) => {
                write!(f, "{}=", s.attr)?;
                if let Some(i) = &s.initial {
                    write_value(f, i)?;
                }
                f.write_char('*')?;
                for a in &s.any {
                    write_value(f, a)?;
                    f.write_char('*')?;
                }
                if let Some(x) = &s.final_ {
                    write_value(f, x)?;
                }
            }
            Filter::Extensible(e) => {
                if let Some(a) = &e.attr {
                    f.write_str(a)?;
                }
                if e.dn_attributes {
                    f.write_str(":dn")?;
                }
                if let Some(r) = &e.rule {
                    write!(f, ":{r}")?;
                }
                f.write_str(":=")?;
                write_value(f, &e.value)?;
            }
        }
        f.write_char(')')
    }
}

// ---------------------------------------------------------------- string parser

/// Why an RFC 4515 string filter was rejected; `pos` is a byte offset into
/// the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterParseError {
    pub pos: usize,
    pub reason: &'static str,
}

impl fmt::Display for FilterParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad search filter at offset {}: {}",
            self.pos, self.reason
        )
    }
}

impl std::error::Error for FilterParseError {}

struct Parser<'a> {
    s: &'a [u8],
    /// Byte offset of the next unread character; always <= s.len().
    pos: usize,
}

/// Characters of an attribute description (RFC 4512 `attributetype options`:
/// descr / numericoid followed by `;option`s) and of a matching rule OID.
fn is_attr_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b';' | b'_')
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl<'a> Parser<'a> {
    fn err(&self, reason: &'static str) -> FilterParseError {
        FilterParseError {
            pos: self.pos,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn peek2(&self) -> Option<u8> {
        self.s.get(self.pos + 1).copied()
    }

    fn bump(&mut self) {
        if self.pos < self.s.len() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, b: u8, reason: &'static str) -> Result<(), FilterParseError> {
        if self.peek() == Some(b) {
            self.bump();
            Ok(())
        } else {
            Err(self.err(reason))
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.bump();
        }
    }

    // filter    = LPAREN filtercomp RPAREN
    // filtercomp = and / or / not / item
    // and = AMPERSAND filterlist ; or = VERTBAR filterlist ; not = EXCLAMATION filter
    fn filter(&mut self, depth: usize) -> Result<Filter, FilterParseError> {
        if depth > STRING_FILTER_MAX_DEPTH {
            return Err(self.err("filter nested too deeply"));
        }
        self.expect(b'(', "expected '('")?;
        let f = match self.peek() {
            Some(b'&') => {
                self.bump();
                Filter::And(self.list(depth)?)
            }
            Some(b'|') => {
                self.bump();
                Filter::Or(self.list(depth)?)
            }
            Some(b'!') => {
                self.bump();
                self.skip_ws();
                Filter::Not(Box::new(self.filter(depth + 1)?))
            }
            _ => self.item(true)?,
        };
        self.skip_ws();
        self.expect(b')', "expected ')'")?;
        Ok(f)
    }

    // filterlist = 1*filter   (0 members accepted: RFC 4526)
    fn list(&mut self, depth: usize) -> Result<Vec<Filter>, FilterParseError> {
        let mut v = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b')') => return Ok(v),
                Some(b'(') => v.push(self.filter(depth + 1)?),
                _ => return Err(self.err("expected '(' or ')' in filter list")),
            }
        }
    }

    fn attr(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(is_attr_char) {
            self.bump();
        }
        // Only ASCII bytes were consumed, so the slice is valid UTF-8.
        std::str::from_utf8(self.s.get(start..self.pos).unwrap_or_default()).unwrap_or_default()
    }

    // item       = simple / present / substring / extensible
    // simple     = attr filtertype assertionvalue
    // present    = attr EQUALS ASTERISK
    // substring  = attr EQUALS [initial] any [final]
    // extensible = ( attr [dnattrs] [matchingrule] COLON EQUALS assertionvalue )
    //              / ( [dnattrs] matchingrule COLON EQUALS assertionvalue )
    fn item(&mut self, in_parens: bool) -> Result<Filter, FilterParseError> {
        let attr_pos = self.pos;
        let attr = self.attr().to_owned();
        let op = self.peek();
        if attr.is_empty() && op != Some(b':') {
            return Err(self.err("expected attribute description"));
        }
        let f = match op {
            Some(b'=') => {
                self.bump();
                let parts = self.value_parts(in_parens)?;
                match parts.as_slice() {
                    [v] => Filter::Equality(Ava {
                        attr,
                        value: v.clone(),
                    }),
                    // `a=*`, and also `a=**` etc.: a pattern of only empty
                    // pieces matches any value, and a substrings filter
                    // without pieces cannot be encoded (SIZE (1..MAX)).
                    all if all.iter().all(Vec::is_empty) => Filter::Present(attr),
                    [first, middle @ .., last] => Filter::Substrings(SubstringFilter {
                        attr,
                        initial: Some(first.clone()).filter(|v| !v.is_empty()),
                        // RFC 4515's grammar allows empty `any` pieces
                        // (`a**b`); they constrain nothing, so drop them.
                        any: middle.iter().filter(|v| !v.is_empty()).cloned().collect(),
                        final_: Some(last.clone()).filter(|v| !v.is_empty()),
                    }),
                    [] => return Err(self.err("missing assertion value")),
                }
            }
            Some(b'~' | b'>' | b'<') => {
                if self.peek2() != Some(b'=') {
                    return Err(self.err("expected '=' after filter type"));
                }
                self.bump();
                self.bump();
                let value = self.single_value(in_parens)?;
                let ava = Ava { attr, value };
                match op {
                    Some(b'~') => Filter::Approx(ava),
                    Some(b'>') => Filter::GreaterOrEqual(ava),
                    _ => Filter::LessOrEqual(ava),
                }
            }
            Some(b':') => self.extensible(attr, in_parens)?,
            _ => {
                return Err(FilterParseError {
                    pos: if attr.is_empty() { attr_pos } else { self.pos },
                    reason: "invalid character in attribute description or missing filter type",
                })
            }
        };
        Ok(f)
    }

    // dnattrs      = COLON "dn"
    // matchingrule = COLON oid
    fn extensible(&mut self, attr: String, in_parens: bool) -> Result<Filter, FilterParseError> {
        let mut dn_attributes = false;
        let mut rule: Option<String> = None;
        loop {
            self.expect(b':', "expected ':'")?;
            if self.peek() == Some(b'=') {
                self.bump();
                break;
            }
            let tok = self.attr();
            if tok.is_empty() {
                return Err(self.err("expected 'dn' or matching rule"));
            }
            if tok.eq_ignore_ascii_case("dn") && !dn_attributes && rule.is_none() {
                dn_attributes = true;
            } else if rule.is_none() && !tok.contains(';') {
                rule = Some(tok.to_owned());
            } else {
                return Err(self.err("unexpected component in extensible match"));
            }
        }
        if attr.is_empty() && rule.is_none() {
            return Err(self.err("extensible match without type needs a matching rule"));
        }
        let value = self.single_value(in_parens)?;
        Ok(Filter::Extensible(MatchingRuleAssertion {
            rule,
            attr: Some(attr).filter(|a| !a.is_empty()),
            value,
            dn_attributes,
        }))
    }

    fn single_value(&mut self, in_parens: bool) -> Result<Vec<u8>, FilterParseError> {
        let mut parts = self.value_parts(in_parens)?;
        if parts.len() != 1 {
            return Err(self.err("unescaped '*' not allowed in this assertion value"));
        }
        Ok(parts.pop().unwrap_or_default())
    }

    /// Reads an assertion value up to the closing ')' (or the end of input
    /// for a bare item), unescaping it and splitting it at unescaped '*'.
    /// Always returns at least one (possibly empty) part.
    fn value_parts(&mut self, in_parens: bool) -> Result<Vec<Vec<u8>>, FilterParseError> {
        let mut parts = Vec::new();
        let mut cur = Vec::new();
        loop {
            match self.peek() {
                None if in_parens => return Err(self.err("unterminated filter")),
                None => break,
                Some(b')') => break,
                Some(b'(') => return Err(self.err("unescaped '(' in value")),
                Some(0) => return Err(self.err("NUL in value")),
                Some(b'*') => {
                    self.bump();
                    parts.push(std::mem::take(&mut cur));
                }
                Some(b'\\') => {
                    let (a, b) = (self.peek2(), self.s.get(self.pos + 2).copied());
                    match (a.and_then(hex_val), b.and_then(hex_val)) {
                        (Some(h), Some(l)) => {
                            cur.push((h << 4) | l);
                            self.pos += 3;
                        }
                        _ => match a {
                            // RFC 1960 style single-character escapes.
                            Some(c @ (b'*' | b'(' | b')' | b'\\')) => {
                                cur.push(c);
                                self.pos += 2;
                            }
                            _ => return Err(self.err("invalid escape sequence")),
                        },
                    }
                }
                Some(c) => {
                    cur.push(c);
                    self.bump();
                }
            }
        }
        parts.push(cur);
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eq(a: &str, v: &[u8]) -> Filter {
        Filter::Equality(Ava {
            attr: a.into(),
            value: v.into(),
        })
    }

    fn ber(f: &Filter) -> Vec<u8> {
        let mut out = Vec::new();
        f.encode(&mut out);
        out
    }

    fn from_ber(b: &[u8], limits: &DecodeLimits) -> Result<Filter, DecodeError> {
        let mut r = Reader::new(b);
        let (t, c) = r.read_tlv()?;
        r.finish("filter")?;
        Filter::decode(t, c, limits)
    }

    #[test]
    fn parse_simple_items() {
        assert_eq!(
            Filter::parse("(cn=Babs Jensen)").unwrap(),
            eq("cn", b"Babs Jensen")
        );
        assert_eq!(Filter::parse("(cn=)").unwrap(), eq("cn", b""));
        assert_eq!(
            Filter::parse("(objectClass=*)").unwrap(),
            Filter::Present("objectClass".into())
        );
        assert_eq!(
            Filter::parse("(age>=21)").unwrap(),
            Filter::GreaterOrEqual(Ava {
                attr: "age".into(),
                value: b"21".to_vec()
            })
        );
        assert_eq!(
            Filter::parse("(age<=21)").unwrap(),
            Filter::LessOrEqual(Ava {
                attr: "age".into(),
                value: b"21".to_vec()
            })
        );
        assert_eq!(
            Filter::parse("(sn~=smith)").unwrap(),
            Filter::Approx(Ava {
                attr: "sn".into(),
                value: b"smith".to_vec()
            })
        );
        assert_eq!(
            Filter::parse("(cn;lang-en=x)").unwrap(),
            eq("cn;lang-en", b"x")
        );
        assert_eq!(Filter::parse("(2.5.4.3=x)").unwrap(), eq("2.5.4.3", b"x"));
        assert_eq!(
            Filter::parse("(cn=**)").unwrap(),
            Filter::Present("cn".into())
        );
    }

    #[test]
    fn parse_rfc4515_examples() {
        let f = Filter::parse("(&(objectClass=Person)(|(sn=Jensen)(cn=Babs J*)))").unwrap();
        assert_eq!(
            f,
            Filter::And(vec![
                eq("objectClass", b"Person"),
                Filter::Or(vec![
                    eq("sn", b"Jensen"),
                    Filter::Substrings(SubstringFilter {
                        attr: "cn".into(),
                        initial: Some(b"Babs J".to_vec()),
                        any: vec![],
                        final_: None
                    })
                ])
            ])
        );
        let f = Filter::parse("(o=univ*of*mich*)").unwrap();
        assert_eq!(
            f,
            Filter::Substrings(SubstringFilter {
                attr: "o".into(),
                initial: Some(b"univ".to_vec()),
                any: vec![b"of".to_vec(), b"mich".to_vec()],
                final_: None
            })
        );
        let f = Filter::parse("(seeAlso=)").unwrap();
        assert_eq!(f, eq("seeAlso", b""));
        let f = Filter::parse("(!(cn=Tim Howes))").unwrap();
        assert_eq!(f, Filter::Not(Box::new(eq("cn", b"Tim Howes"))));
        let f = Filter::parse("(cn=*x*)").unwrap();
        assert_eq!(
            f,
            Filter::Substrings(SubstringFilter {
                attr: "cn".into(),
                initial: None,
                any: vec![b"x".to_vec()],
                final_: None
            })
        );
    }

    #[test]
    fn parse_escapes() {
        assert_eq!(
            Filter::parse(r"(o=Parens R Us \28for all your parenthetical needs\29)").unwrap(),
            eq("o", b"Parens R Us (for all your parenthetical needs)")
        );
        assert_eq!(
            Filter::parse(r"(cn=*\2A*)").unwrap().to_string(),
            r"(cn=*\2a*)"
        );
        assert_eq!(
            Filter::parse(r"(filename=C:\5cMyFile)").unwrap(),
            eq("filename", b"C:\\MyFile")
        );
        assert_eq!(
            Filter::parse(r"(bin=\00\00\00\04)").unwrap(),
            eq("bin", &[0, 0, 0, 4])
        );
        assert_eq!(
            Filter::parse(r"(sn=Lu\c4\8di\c4\87)").unwrap(),
            eq("sn", "Lučić".as_bytes())
        );
        assert_eq!(
            Filter::parse("(sn=Lučić)").unwrap(),
            eq("sn", "Lučić".as_bytes())
        );
        // RFC 1960 legacy escape.
        assert_eq!(Filter::parse(r"(cn=a\*b)").unwrap(), eq("cn", b"a*b"));
        assert!(Filter::parse(r"(cn=a\zz)").is_err());
        assert!(Filter::parse(r"(cn=a\4)").is_err());
    }

    #[test]
    fn parse_extensible() {
        let f = Filter::parse("(cn:caseExactMatch:=Fred Flintstone)").unwrap();
        assert_eq!(
            f,
            Filter::Extensible(MatchingRuleAssertion {
                rule: Some("caseExactMatch".into()),
                attr: Some("cn".into()),
                value: b"Fred Flintstone".to_vec(),
                dn_attributes: false
            })
        );
        let f = Filter::parse("(cn:=Betty Rubble)").unwrap();
        assert_eq!(
            f,
            Filter::Extensible(MatchingRuleAssertion {
                rule: None,
                attr: Some("cn".into()),
                value: b"Betty Rubble".to_vec(),
                dn_attributes: false
            })
        );
        let f = Filter::parse("(sn:dn:2.4.6.8.10:=Barney Rubble)").unwrap();
        assert_eq!(
            f,
            Filter::Extensible(MatchingRuleAssertion {
                rule: Some("2.4.6.8.10".into()),
                attr: Some("sn".into()),
                value: b"Barney Rubble".to_vec(),
                dn_attributes: true
            })
        );
        let f = Filter::parse("(o:dn:=Ace Industry)").unwrap();
        assert!(matches!(f, Filter::Extensible(ref m) if m.dn_attributes && m.rule.is_none()));
        let f = Filter::parse("(:1.2.3:=Wilma Flintstone)").unwrap();
        assert_eq!(
            f,
            Filter::Extensible(MatchingRuleAssertion {
                rule: Some("1.2.3".into()),
                attr: None,
                value: b"Wilma Flintstone".to_vec(),
                dn_attributes: false
            })
        );
        let f = Filter::parse("(:DN:2.4.6.8.10:=Dino)").unwrap();
        assert!(matches!(f, Filter::Extensible(ref m) if m.dn_attributes && m.attr.is_none()));
        assert!(Filter::parse("(:dn:=x)").is_err());
        assert!(Filter::parse("(:=x)").is_err());
        assert!(Filter::parse("(cn:1.2:3.4:=x)").is_err());
        assert!(Filter::parse("(cn:=a*b)").is_err());
    }

    #[test]
    fn parse_bare_item_and_whitespace() {
        assert_eq!(Filter::parse("cn=foo").unwrap(), eq("cn", b"foo"));
        assert_eq!(
            Filter::parse("uid=*").unwrap(),
            Filter::Present("uid".into())
        );
        assert_eq!(
            Filter::parse(" (& (a=1) (b=2) ) ").unwrap(),
            Filter::And(vec![eq("a", b"1"), eq("b", b"2")])
        );
        assert_eq!(Filter::parse("(&)").unwrap(), Filter::And(vec![]));
        assert_eq!(Filter::parse("(|)").unwrap(), Filter::Or(vec![]));
    }

    #[test]
    fn parse_rejections() {
        for bad in [
            "",
            "(",
            "()",
            "(cn=a",
            "(cn=a))",
            "(=a)",
            "(cn)",
            "(cn=a(b)",
            "(cn~a)",
            "(cn>=a*)",
            "(&(a=1)b=2)",
            "(!)",
            "(!(a=1)(b=2))",
            "(c n=a)",
            "cn=a)",
        ] {
            assert!(Filter::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn parse_depth_limit() {
        let ok = format!("{}(a=b){}", "(!".repeat(99), ")".repeat(99));
        assert_eq!(Filter::parse(&ok).unwrap().depth(), 100);
        let bad = format!("{}(a=b){}", "(!".repeat(100), ")".repeat(100));
        assert!(Filter::parse(&bad).is_err());
        let huge = format!("{}(a=b){}", "(&".repeat(100_000), ")".repeat(100_000));
        assert!(Filter::parse(&huge).is_err());
    }

    #[test]
    fn display_escapes_and_round_trips() {
        let f = eq("cn", b"a*b(c)d\\e\0f");
        assert_eq!(f.to_string(), r"(cn=a\2ab\28c\29d\5ce\00f)");
        assert_eq!(Filter::parse(&f.to_string()).unwrap(), f);
        let f = eq("userCertificate", &[0xff, 0x01, b'a', 0xc3]);
        assert_eq!(f.to_string(), r"(userCertificate=\ff\01a\c3)");
        assert_eq!(Filter::parse(&f.to_string()).unwrap(), f);
        let f = eq("sn", "Lučić".as_bytes());
        assert_eq!(f.to_string(), "(sn=Lučić)");
        for s in [
            "(&(objectClass=person)(|(sn=Jensen)(cn=Babs J*))(!(uid=x)))",
            "(o=univ*of*mich*)",
            "(cn=*a*b*c)",
            "(sn:dn:2.4.6.8.10:=Barney Rubble)",
            "(:1.2.3:=x)",
            "(a>=1)",
            "(a<=1)",
            "(a~=1)",
            "(a=*)",
            "(&)",
            "(|)",
        ] {
            let f = Filter::parse(s).unwrap();
            assert_eq!(f.to_string(), s);
        }
    }

    #[test]
    fn ber_round_trip() {
        let limits = DecodeLimits::default();
        for s in [
            "(&(objectClass=person)(|(sn=Jensen)(cn=Babs J*))(!(uid=x)))",
            "(o=univ*of*mich*)",
            "(cn=*a*b*c)",
            "(sn:dn:2.4.6.8.10:=Barney Rubble)",
            "(:1.2.3:=x)",
            "(cn:=x)",
            "(a>=1)",
            "(a<=1)",
            "(a~=1)",
            "(a=*)",
            "(&)",
            r"(bin=\00\ff)",
        ] {
            let f = Filter::parse(s).unwrap();
            assert_eq!(from_ber(&ber(&f), &limits).unwrap(), f, "{s}");
        }
    }

    #[test]
    fn ber_known_bytes() {
        // (cn=x) and (objectClass=*)
        assert_eq!(
            ber(&eq("cn", b"x")),
            [0xa3, 0x07, 0x04, 0x02, b'c', b'n', 0x04, 0x01, b'x']
        );
        assert_eq!(ber(&Filter::Present("cn".into())), [0x87, 0x02, b'c', b'n']);
    }

    #[test]
    fn ber_depth_limit_without_stack_overflow() {
        // 10,000 nested NOTs around (a=*), built from the inside out.
        let mut b = vec![0x87, 0x01, b'a'];
        for _ in 0..10_000 {
            let mut n = vec![NOT];
            ber::write_len(&mut n, b.len());
            n.extend_from_slice(&b);
            b = n;
        }
        let limits = DecodeLimits::default();
        let e = from_ber(&b, &limits).unwrap_err();
        assert!(e.reason.contains("nested"), "{e}");
        // Exactly at the limit is fine.
        let mut b = vec![0x87, 0x01, b'a'];
        for _ in 0..limits.max_depth - 1 {
            let mut n = vec![NOT];
            ber::write_len(&mut n, b.len());
            n.extend_from_slice(&b);
            b = n;
        }
        assert_eq!(from_ber(&b, &limits).unwrap().depth(), limits.max_depth);
        // A huge configured limit is still capped.
        let big = DecodeLimits {
            max_depth: usize::MAX,
            max_filter_terms: usize::MAX,
            ..DecodeLimits::default()
        };
        let mut b = vec![0x87, 0x01, b'a'];
        for _ in 0..HARD_MAX_DEPTH {
            let mut n = vec![NOT];
            ber::write_len(&mut n, b.len());
            n.extend_from_slice(&b);
            b = n;
        }
        assert!(from_ber(&b, &big).is_err());
    }

    #[test]
    fn ber_term_limit() {
        let mut body = Vec::new();
        for _ in 0..100_000 {
            body.extend_from_slice(&[0x87, 0x01, b'a']);
        }
        let mut b = vec![OR];
        ber::write_len(&mut b, body.len());
        b.extend_from_slice(&body);
        let e = from_ber(&b, &DecodeLimits::default()).unwrap_err();
        assert!(e.reason.contains("terms"), "{e}");
        let f = from_ber(
            &b,
            &DecodeLimits {
                max_depth: 64,
                max_filter_terms: 100_001,
                ..DecodeLimits::default()
            },
        )
        .unwrap();
        assert_eq!(f.term_count(), 100_001);
    }

    #[test]
    fn ber_rejections() {
        let l = DecodeLimits::default();
        // substrings: empty sequence, initial not first, two finals, unknown choice
        for body in [
            &[0xa4, 0x05, 0x04, 0x01, b'a', 0x30, 0x00][..],
            &[
                0xa4, 0x0b, 0x04, 0x01, b'a', 0x30, 0x06, 0x81, 0x01, b'x', 0x80, 0x01, b'y',
            ][..],
            &[
                0xa4, 0x0b, 0x04, 0x01, b'a', 0x30, 0x06, 0x82, 0x01, b'x', 0x82, 0x01, b'y',
            ][..],
            &[0xa4, 0x08, 0x04, 0x01, b'a', 0x30, 0x03, 0x83, 0x01, b'x'][..],
            // extensible with neither rule nor type
            &[0xa9, 0x03, 0x83, 0x01, b'x'][..],
            // not with two children
            &[0xa2, 0x06, 0x87, 0x01, b'a', 0x87, 0x01, b'b'][..],
            // unknown choice
            &[0xaa, 0x00][..],
            // non-UTF-8 attribute
            &[0x87, 0x01, 0xff][..],
            // AVA with garbage trailing bytes
            &[0xa3, 0x07, 0x04, 0x01, b'a', 0x04, 0x01, b'b', 0x05][..],
        ] {
            assert!(from_ber(body, &l).is_err(), "{body:02x?}");
        }
        // Binary assertion values are fine.
        let f = from_ber(
            &[0xa3, 0x08, 0x04, 0x01, b'a', 0x04, 0x03, 0x00, 0xff, 0xfe],
            &l,
        )
        .unwrap();
        assert_eq!(f, eq("a", &[0x00, 0xff, 0xfe]));
    }
}
