//! Distinguished names (RFC 4514 string form).
//!
//! The parser is tolerant in the way OpenLDAP is: spaces are allowed around
//! `,`, `+` and `=`, and the characters RFC 4514 asks to be escaped but that
//! cannot be confused with structure (`"`, `;`, `<`, `>`, `=` inside a value)
//! are accepted unescaped. Values are unescaped to raw bytes; a `#hex` value
//! keeps the hex-decoded BER bytes. Attribute types are kept as written; the
//! schema turns a `Dn` into its normalised key (`Schema::normalize_dn`).
//!
//! Limits: a DN string is at most [`MAX_DN_LEN`] bytes and has at most
//! [`MAX_RDNS`] RDNs and [`MAX_AVAS`] AVAs in all, so parsing work and memory
//! are bounded by the input size and no recursion is involved.

use std::fmt;

/// Longest DN string accepted, in bytes (the same bound OpenLDAP uses).
pub const MAX_DN_LEN: usize = 8192;
/// Most RDNs in one DN.
pub const MAX_RDNS: usize = 512;
/// Most AVAs over all RDNs of one DN.
pub const MAX_AVAS: usize = 1024;

/// A parsed DN. `rdns[0]` is the leftmost RDN, the entry's own; an empty
/// list is the root DSE ("").
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dn {
    pub rdns: Vec<Rdn>,
}

/// One RDN: one or more attribute value assertions joined by `+`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rdn {
    pub avas: Vec<RdnAva>,
}

/// `attr=value` inside an RDN. `attr` is the type as written (name or OID);
/// `value` the unescaped bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RdnAva {
    pub attr: String,
    pub value: Vec<u8>,
}

/// Why a DN string was rejected; `pos` is the byte offset of the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnError {
    pub pos: usize,
    pub message: String,
}

impl fmt::Display for DnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid DN at byte {}: {}", self.pos, self.message)
    }
}

impl std::error::Error for DnError {}

fn err<T>(pos: usize, message: &str) -> Result<T, DnError> {
    Err(DnError {
        pos,
        message: message.to_string(),
    })
}

/// Cursor over the DN string's bytes.
struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    avas: usize,
}

impl<'a> Parser<'a> {
    /// A parser at the start of `s`, which must not be longer than a DN
    /// may be (`what` names it in the error).
    fn start(s: &'a str, what: &str) -> Result<Parser<'a>, DnError> {
        if s.len() > MAX_DN_LEN {
            return err(MAX_DN_LEN, &format!("{what} too long"));
        }
        Ok(Parser {
            s: s.as_bytes(),
            pos: 0,
            avas: 0,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    /// attributeType = descr / numericoid. Accepts `_` too, which some
    /// deployed schemas use in names.
    fn attr_type(&mut self) -> Result<String, DnError> {
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_alphanumeric() => {}
            _ => return err(self.pos, "expected attribute type"),
        }
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        let t = &self.s[start..self.pos];
        // A type starting with a digit must be a numericoid.
        if t[0].is_ascii_digit() && !is_numericoid(t) {
            return err(start, "malformed numeric OID");
        }
        Ok(String::from_utf8_lossy(t).into_owned())
    }

    fn value(&mut self) -> Result<Vec<u8>, DnError> {
        if self.peek() == Some(b'#') {
            return self.hex_value();
        }
        let mut out = Vec::new();
        // Length of `out` up to and including the last byte that is not an
        // unescaped space; unescaped trailing spaces are insignificant.
        let mut significant = 0;
        while let Some(c) = self.peek() {
            match c {
                b',' | b'+' => break,
                b'\\' => {
                    self.pos += 1;
                    let Some(n) = self.peek() else {
                        return err(self.pos, "dangling backslash");
                    };
                    if let Some(h) = hex_val(n) {
                        let Some(l) = self.s.get(self.pos + 1).copied().and_then(hex_val) else {
                            return err(self.pos, "incomplete hex pair");
                        };
                        out.push(h << 4 | l);
                        self.pos += 2;
                    } else if b" \"#+,;<=>\\".contains(&n) {
                        out.push(n);
                        self.pos += 1;
                    } else {
                        return err(self.pos, "invalid escape");
                    }
                    significant = out.len();
                }
                0 => return err(self.pos, "NUL in value must be escaped"),
                b' ' => {
                    out.push(c);
                    self.pos += 1;
                }
                _ => {
                    out.push(c);
                    self.pos += 1;
                    significant = out.len();
                }
            }
        }
        out.truncate(significant);
        Ok(out)
    }

    fn hex_value(&mut self) -> Result<Vec<u8>, DnError> {
        self.pos += 1; // '#'
        let start = self.pos;
        let mut out = Vec::new();
        while let Some(h) = self.peek().and_then(hex_val) {
            let Some(l) = self.s.get(self.pos + 1).copied().and_then(hex_val) else {
                return err(self.pos, "odd number of hex digits");
            };
            out.push(h << 4 | l);
            self.pos += 2;
        }
        if self.pos == start {
            return err(self.pos, "empty hex value");
        }
        Ok(out)
    }

    fn rdn(&mut self) -> Result<Rdn, DnError> {
        let mut avas = Vec::new();
        loop {
            self.avas += 1;
            if self.avas > MAX_AVAS {
                return err(self.pos, "too many attribute value assertions");
            }
            self.skip_spaces();
            let attr = self.attr_type()?;
            self.skip_spaces();
            if self.peek() != Some(b'=') {
                return err(self.pos, "expected '='");
            }
            self.pos += 1;
            self.skip_spaces();
            let value = self.value()?;
            self.skip_spaces();
            avas.push(RdnAva { attr, value });
            if self.peek() == Some(b'+') {
                self.pos += 1;
            } else {
                return Ok(Rdn { avas });
            }
        }
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// numericoid = number 1*( DOT number ), number without leading zeros.
pub(crate) fn is_numericoid(s: &[u8]) -> bool {
    if s.is_empty() {
        return false;
    }
    let mut parts = 0;
    for part in s.split(|&c| c == b'.') {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return false;
        }
        if part.len() > 1 && part[0] == b'0' {
            return false;
        }
        parts += 1;
    }
    parts >= 2
}

impl Dn {
    /// Parse an RFC 4514 DN string. "" (or only spaces) is the root DSE.
    pub fn parse(s: &str) -> Result<Dn, DnError> {
        let mut p = Parser::start(s, "DN")?;
        p.skip_spaces();
        let mut rdns = Vec::new();
        if p.peek().is_none() {
            return Ok(Dn { rdns });
        }
        loop {
            if rdns.len() >= MAX_RDNS {
                return err(p.pos, "too many RDNs");
            }
            rdns.push(p.rdn()?);
            match p.peek() {
                None => return Ok(Dn { rdns }),
                Some(b',') => p.pos += 1,
                Some(_) => return err(p.pos, "expected ',' or '+'"),
            }
        }
    }

    /// The root DSE's name: zero RDNs.
    pub fn root() -> Dn {
        Dn { rdns: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.rdns.is_empty()
    }

    /// The DN without its leftmost RDN; `None` for the root.
    pub fn parent(&self) -> Option<Dn> {
        if self.rdns.is_empty() {
            return None;
        }
        Some(Dn {
            rdns: self.rdns[1..].to_vec(),
        })
    }

    /// The leftmost RDN; `None` for the root.
    pub fn rdn(&self) -> Option<&Rdn> {
        self.rdns.first()
    }

    /// `rdn` + "," + self.
    pub fn child(&self, rdn: Rdn) -> Dn {
        let mut rdns = Vec::with_capacity(self.rdns.len() + 1);
        rdns.push(rdn);
        rdns.extend(self.rdns.iter().cloned());
        Dn { rdns }
    }

    /// Strictly below `ancestor` (a DN is not its own descendant), comparing
    /// RDNs by raw equality (types as written, case-sensitive). Callers
    /// that need schema-aware comparison should compare normalised DNs.
    pub fn is_descendant_of(&self, ancestor: &Dn) -> bool {
        self.rdns.len() > ancestor.rdns.len() && self.ends_with(ancestor)
    }

    /// `self == base` or `self.is_descendant_of(base)` (subtree scope), by
    /// raw equality.
    pub fn is_within(&self, base: &Dn) -> bool {
        self.rdns.len() >= base.rdns.len() && self.ends_with(base)
    }

    fn ends_with(&self, suffix: &Dn) -> bool {
        let skip = self.rdns.len() - suffix.rdns.len().min(self.rdns.len());
        self.rdns[skip..] == suffix.rdns[..]
    }
}

impl Rdn {
    /// The first RDN of a DN string and, when a `,` follows it, the rest of
    /// the string after that comma: where both parse, [`Dn::parse`] of `s`
    /// is this RDN followed by the RDNs of the rest (the rest's own AVA
    /// count starts again at zero; a caller relying on the limits parses
    /// whole).
    pub fn parse_first(s: &str) -> Result<(Rdn, Option<&str>), DnError> {
        let mut p = Parser::start(s, "DN")?;
        p.skip_spaces();
        let rdn = p.rdn()?;
        match p.peek() {
            None => Ok((rdn, None)),
            Some(b',') => Ok((rdn, Some(&s[p.pos + 1..]))),
            Some(_) => err(p.pos, "expected ',' or '+'"),
        }
    }

    /// Parse one RDN (`cn=a+uid=b`); a `,` outside an escape is an error.
    pub fn parse(s: &str) -> Result<Rdn, DnError> {
        let mut p = Parser::start(s, "RDN")?;
        let rdn = p.rdn()?;
        if p.peek().is_some() {
            return err(p.pos, "trailing characters after RDN");
        }
        Ok(rdn)
    }

    /// The value of the first AVA whose type is `attr` (ASCII
    /// case-insensitive; no alias resolution).
    pub fn get(&self, attr: &str) -> Option<&[u8]> {
        self.avas
            .iter()
            .find(|a| a.attr.eq_ignore_ascii_case(attr))
            .map(|a| a.value.as_slice())
    }
}

/// Append `value` to `out` in RFC 4514 string form with minimal escaping:
/// a leading `#` or space, a trailing space, the specials `, + " \ < > ; =`
/// and NUL are escaped; bytes that are not valid UTF-8 and other control
/// characters are written as `\XX` so the result is always valid UTF-8 and
/// parses back to the same bytes.
pub fn escape_value(value: &[u8], out: &mut String) {
    let last = value.len().saturating_sub(1);
    let mut i = 0;
    while i < value.len() {
        let c = value[i];
        if c < 0x80 {
            let special = matches!(c, b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' | b'=')
                || (i == 0 && (c == b'#' || c == b' '))
                || (i == last && c == b' ');
            if special {
                out.push('\\');
                out.push(c as char);
            } else if c < 0x20 || c == 0x7f {
                push_hex(out, c);
            } else {
                out.push(c as char);
            }
            i += 1;
            continue;
        }
        // Multi-byte: copy a whole valid UTF-8 sequence, or hex-escape the
        // offending byte.
        let len = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 0,
        };
        match value.get(i..i + len).map(std::str::from_utf8) {
            Some(Ok(s)) if len > 0 => {
                out.push_str(s);
                i += len;
            }
            _ => {
                push_hex(out, c);
                i += 1;
            }
        }
    }
}

fn push_hex(out: &mut String, c: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('\\');
    out.push(HEX[(c >> 4) as usize] as char);
    out.push(HEX[(c & 15) as usize] as char);
}

impl fmt::Display for Rdn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        for (i, ava) in self.avas.iter().enumerate() {
            if i > 0 {
                s.push('+');
            }
            s.push_str(&ava.attr);
            s.push('=');
            escape_value(&ava.value, &mut s);
        }
        f.write_str(&s)
    }
}

impl fmt::Display for Dn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rdn) in self.rdns.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{rdn}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_basic_and_spaces() {
        let dn = Dn::parse("CN=Foo\\, Bar+uid=x ,  DC=Example,dc=COM").unwrap();
        assert_eq!(dn.rdns.len(), 3);
        assert_eq!(dn.rdns[0].avas.len(), 2);
        assert_eq!(dn.rdns[0].avas[0].attr, "CN");
        assert_eq!(dn.rdns[0].avas[0].value, b"Foo, Bar");
        assert_eq!(dn.rdns[0].avas[1].value, b"x");
        assert_eq!(dn.rdns[1].avas[0].value, b"Example");
        assert_eq!(dn.to_string(), "CN=Foo\\, Bar+uid=x,DC=Example,dc=COM");
    }

    #[test]
    fn root_and_parent() {
        assert!(Dn::parse("").unwrap().is_root());
        assert!(Dn::parse("   ").unwrap().is_root());
        let dn = Dn::parse("a=1,b=2").unwrap();
        assert_eq!(dn.parent().unwrap().to_string(), "b=2");
        assert!(dn.parent().unwrap().parent().unwrap().is_root());
        assert!(Dn::root().parent().is_none());
        let base = Dn::parse("b=2").unwrap();
        assert!(dn.is_descendant_of(&base));
        assert!(!base.is_descendant_of(&base));
        assert!(base.is_within(&base));
        assert!(dn.is_descendant_of(&Dn::root()));
        let c = base.child(Rdn::parse("a=1").unwrap());
        assert_eq!(c, dn);
    }

    #[test]
    fn escapes_and_hex() {
        let dn = Dn::parse("cn=\\23a\\20\\2C\\e4\\B8\\AD,o=#04024869").unwrap();
        assert_eq!(dn.rdns[0].avas[0].value, "#a ,中".as_bytes());
        assert_eq!(dn.rdns[1].avas[0].value, vec![4, 2, b'H', b'i']);
        // Escaped trailing space is kept, unescaped ones are not.
        let dn = Dn::parse("cn=a\\ \\  , o=x").unwrap();
        assert_eq!(dn.rdns[0].avas[0].value, b"a  ");
        assert_eq!(dn.to_string(), "cn=a \\ ,o=x");
    }

    #[test]
    fn display_round_trip() {
        for v in [
            &b"#lead"[..],
            b" both ",
            b"a,b+c\"d\\e<f>g;h=i",
            b"nul\0x",
            b"\xff\xfe",
            "ünï".as_bytes(),
        ] {
            let dn = Dn {
                rdns: vec![Rdn {
                    avas: vec![RdnAva {
                        attr: "cn".into(),
                        value: v.to_vec(),
                    }],
                }],
            };
            let s = dn.to_string();
            assert_eq!(Dn::parse(&s).unwrap(), dn, "{s}");
        }
    }

    #[test]
    fn rejects() {
        for bad in [
            "cn",
            "=x",
            "cn=x,",
            "cn=x,,o=y",
            "cn=\\",
            "cn=\\4",
            "cn=\\q",
            "cn=#",
            "cn=#abc",
            "1.2.=x",
            "01.2=x",
            "cn=x,o",
        ] {
            assert!(Dn::parse(bad).is_err(), "{bad}");
        }
        assert!(Dn::parse(&"a".repeat(MAX_DN_LEN + 1)).is_err());
        let many = vec!["a=b"; MAX_RDNS + 1].join(",");
        assert!(Dn::parse(&many).is_err());
        assert!(Rdn::parse("a=b,c=d").is_err());
        assert_eq!(Rdn::parse("a=b+c=d").unwrap().get("C"), Some(&b"d"[..]));
    }

    #[test]
    fn oid_types() {
        let dn = Dn::parse("2.5.4.3=x").unwrap();
        assert_eq!(dn.rdns[0].avas[0].attr, "2.5.4.3");
        assert!(is_numericoid(b"1.2.840"));
        assert!(!is_numericoid(b"1"));
        assert!(!is_numericoid(b"1..2"));
    }
}
