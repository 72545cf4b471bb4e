//! LDAP syntaxes (RFC 4517 section 3.3 and a few from other RFCs) and their
//! value checks. Syntaxes without a specific check accept any value.

use crate::dn::{is_numericoid, Dn};

/// OID prefix shared by the RFC 4517 syntaxes.
pub(crate) const P: &str = "1.3.6.1.4.1.1466.115.121.1.";

/// How values of a syntax are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    Any,
    DirectoryString,
    Ia5,
    Integer,
    Boolean,
    Dn,
    GeneralizedTime,
    Printable,
    Telephone,
    Numeric,
    Country,
    Oid,
    PostalAddress,
    BitString,
    NameAndOptionalUid,
    Uuid,
    Csn,
    Utf8,
}

/// A built-in syntax: OID, description, check.
pub(crate) struct BuiltinSyntax {
    pub oid: &'static str,
    pub desc: &'static str,
    pub check: Check,
    /// RFC 4517 marks some syntaxes "not human readable" (X-NOT-HUMAN-READABLE).
    pub binary: bool,
}

macro_rules! syn {
    ($suffix:literal, $desc:literal, $check:ident) => {
        BuiltinSyntax {
            oid: concat!("1.3.6.1.4.1.1466.115.121.1.", $suffix),
            desc: $desc,
            check: Check::$check,
            binary: false,
        }
    };
    ($suffix:literal, $desc:literal, $check:ident, binary) => {
        BuiltinSyntax {
            oid: concat!("1.3.6.1.4.1.1466.115.121.1.", $suffix),
            desc: $desc,
            check: Check::$check,
            binary: true,
        }
    };
}

pub(crate) const BUILTIN_SYNTAXES: &[BuiltinSyntax] = &[
    syn!("3", "Attribute Type Description", Utf8),
    syn!("4", "Audio", Any, binary),
    syn!("5", "Binary", Any, binary),
    syn!("6", "Bit String", BitString),
    syn!("7", "Boolean", Boolean),
    syn!("8", "Certificate", Any, binary),
    syn!("9", "Certificate List", Any, binary),
    syn!("10", "Certificate Pair", Any, binary),
    syn!("11", "Country String", Country),
    syn!("12", "DN", Dn),
    syn!("13", "Data Quality Syntax", Utf8),
    syn!("14", "Delivery Method", Utf8),
    syn!("15", "Directory String", DirectoryString),
    syn!("16", "DIT Content Rule Description", Utf8),
    syn!("17", "DIT Structure Rule Description", Utf8),
    syn!("19", "DSA Quality Syntax", Utf8),
    syn!("21", "Enhanced Guide", Utf8),
    syn!("22", "Facsimile Telephone Number", Utf8),
    syn!("23", "Fax", Any, binary),
    syn!("24", "Generalized Time", GeneralizedTime),
    syn!("25", "Guide", Utf8),
    syn!("26", "IA5 String", Ia5),
    syn!("27", "INTEGER", Integer),
    syn!("28", "JPEG", Any, binary),
    syn!("30", "Matching Rule Description", Utf8),
    syn!("31", "Matching Rule Use Description", Utf8),
    syn!("34", "Name And Optional UID", NameAndOptionalUid),
    syn!("35", "Name Form Description", Utf8),
    syn!("36", "Numeric String", Numeric),
    syn!("37", "Object Class Description", Utf8),
    syn!("38", "OID", Oid),
    syn!("39", "Other Mailbox", Ia5),
    syn!("40", "Octet String", Any),
    syn!("41", "Postal Address", PostalAddress),
    syn!("44", "Printable String", Printable),
    syn!("45", "SubtreeSpecification", Utf8),
    syn!("49", "Supported Algorithm", Any, binary),
    syn!("50", "Telephone Number", Telephone),
    syn!("51", "Teletex Terminal Identifier", Utf8),
    syn!("52", "Telex Number", Utf8),
    syn!("53", "UTC Time", Utf8),
    syn!("54", "LDAP Syntax Description", Utf8),
    syn!("58", "Substring Assertion", Utf8),
    BuiltinSyntax {
        oid: "1.3.6.1.1.16.1",
        desc: "UUID",
        check: Check::Uuid,
        binary: false,
    },
    BuiltinSyntax {
        oid: "1.3.6.1.4.1.4203.666.11.2.1",
        desc: "CSN",
        check: Check::Csn,
        binary: false,
    },
    // OpenLDAP's authorization rule syntax (dyngroup's dgAuthz).
    BuiltinSyntax {
        oid: "1.3.6.1.4.1.4203.666.2.7",
        desc: "OpenLDAP authz",
        check: Check::DirectoryString,
        binary: false,
    },
];

/// RFC 4517 PrintableCharacter.
fn is_printable(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"'()+,-./:?= ".contains(&c)
}

/// Check `v` against `check`; the error says what is wrong.
pub(crate) fn check_value(check: Check, v: &[u8]) -> Result<(), String> {
    match check {
        Check::Any => Ok(()),
        Check::Utf8 => utf8(v).map(|_| ()),
        Check::DirectoryString | Check::PostalAddress => {
            if v.is_empty() {
                return Err("empty value".into());
            }
            utf8(v).map(|_| ())
        }
        Check::Ia5 => {
            if v.is_ascii() {
                Ok(())
            } else {
                Err("not an IA5 (ASCII) string".into())
            }
        }
        Check::Integer => parse_integer(v).map(|_| ()),
        Check::Boolean => match v {
            b"TRUE" | b"FALSE" => Ok(()),
            _ => Err("boolean must be TRUE or FALSE".into()),
        },
        Check::Dn => {
            let s = utf8(v)?;
            Dn::parse(s).map(|_| ()).map_err(|e| e.to_string())
        }
        Check::GeneralizedTime => parse_generalized_time(v).map(|_| ()),
        Check::Printable | Check::Telephone => {
            if v.is_empty() {
                return Err("empty value".into());
            }
            if v.iter().all(|&c| is_printable(c)) {
                Ok(())
            } else {
                Err("not a printable string".into())
            }
        }
        Check::Numeric => {
            if !v.is_empty() && v.iter().all(|&c| c.is_ascii_digit() || c == b' ') {
                Ok(())
            } else {
                Err("numeric string must be digits and spaces".into())
            }
        }
        Check::Country => {
            if v.len() == 2 && v.iter().all(|&c| is_printable(c)) {
                Ok(())
            } else {
                Err("country string must be two printable characters".into())
            }
        }
        Check::Oid => {
            if is_numericoid(v) || is_descr(v) {
                Ok(())
            } else {
                Err("not an OID or descriptor".into())
            }
        }
        Check::BitString => {
            if is_bit_string(v) {
                Ok(())
            } else {
                Err("bit string must look like '0101'B".into())
            }
        }
        Check::NameAndOptionalUid => {
            let (dn, _) = split_name_and_uid(v);
            let s = utf8(dn)?;
            Dn::parse(s).map(|_| ()).map_err(|e| e.to_string())
        }
        Check::Uuid => {
            if is_uuid(v) {
                Ok(())
            } else {
                Err("UUID must be 8-4-4-4-12 hex digits".into())
            }
        }
        Check::Csn => {
            if !v.is_empty() && v.iter().all(|&c| c.is_ascii_graphic()) {
                Ok(())
            } else {
                Err("CSN must be non-empty printable ASCII".into())
            }
        }
    }
}

fn utf8(v: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(v).map_err(|_| "not valid UTF-8".to_string())
}

/// descr = leadkeychar *keychar
pub(crate) fn is_descr(v: &[u8]) -> bool {
    match v.first() {
        Some(c) if c.is_ascii_alphabetic() => {
            v.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
        }
        _ => false,
    }
}

fn is_bit_string(v: &[u8]) -> bool {
    v.len() >= 3
        && v[0] == b'\''
        && v.ends_with(b"'B")
        && v[1..v.len() - 2].iter().all(|&c| c == b'0' || c == b'1')
}

/// Split a Name And Optional UID value into the DN part and the optional
/// `#'bits'B` suffix (without the `#`). A `#` not followed by a valid bit
/// string belongs to the DN.
pub(crate) fn split_name_and_uid(v: &[u8]) -> (&[u8], Option<&[u8]>) {
    if let Some(i) = v.iter().rposition(|&c| c == b'#') {
        if is_bit_string(&v[i + 1..]) {
            return (&v[..i], Some(&v[i + 1..]));
        }
    }
    (v, None)
}

fn is_uuid(v: &[u8]) -> bool {
    v.len() == 36
        && v.iter().enumerate().all(|(i, &c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == b'-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// The 16 bytes of a UUID written as 8-4-4-4-12 hex digits (either case);
/// None when `v` is not one.
pub(crate) fn uuid_bytes(v: &[u8]) -> Option<[u8; 16]> {
    if !is_uuid(v) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut nibbles = v.iter().filter(|&&c| c != b'-').map(|&c| digit(c));
    let mut out = [0u8; 16];
    for b in &mut out {
        *b = (nibbles.next()?? << 4) | nibbles.next()??;
    }
    Some(out)
}

/// A parsed INTEGER: sign and decimal magnitude without leading zeros.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Integer<'a> {
    pub negative: bool,
    pub digits: &'a [u8],
}

/// INTEGER = (HYPHEN LDIGIT *DIGIT) / number. Leading zeros and "-0" are
/// rejected as RFC 4517 requires.
pub(crate) fn parse_integer(v: &[u8]) -> Result<Integer<'_>, String> {
    let (negative, digits) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        _ => (false, v),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("not an integer".into());
    }
    if digits[0] == b'0' && (digits.len() > 1 || negative) {
        return Err("integer has a leading zero".into());
    }
    Ok(Integer { negative, digits })
}

/// The integer as i64, if it fits (for the bitwise matching rules).
pub(crate) fn integer_to_i64(v: &[u8]) -> Option<i64> {
    parse_integer(v).ok()?;
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A generalized time converted to UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub nanos: u32,
}

impl UtcTime {
    /// "YYYYMMDDHHMMSS[.f]Z" with trailing fraction zeros removed.
    pub fn normalized(&self) -> String {
        let mut s = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        if self.nanos > 0 {
            let f = format!("{:09}", self.nanos);
            s.push('.');
            s.push_str(f.trim_end_matches('0'));
        }
        s.push('Z');
        s
    }

    /// Fixed-width "YYYYMMDDHHMMSSnnnnnnnnn": byte order is time order.
    pub fn ordering_key(&self) -> Vec<u8> {
        format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}{:09}",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.nanos
        )
        .into_bytes()
    }
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// Seconds since 1970-01-01T00:00:00Z of a GeneralizedTime value (its
/// fraction dropped); None when it is not one.
pub fn generalized_time_seconds(v: &[u8]) -> Option<i64> {
    let t = parse_generalized_time(v).ok()?;
    let days = days_from_civil(t.year, t.month, t.day);
    Some(days * 86400 + i64::from(t.hour) * 3600 + i64::from(t.minute) * 60 + i64::from(t.second))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Inverse of `days_from_civil`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn two_digits(v: &[u8], at: usize) -> Option<u32> {
    let a = *v.get(at)?;
    let b = *v.get(at + 1)?;
    if a.is_ascii_digit() && b.is_ascii_digit() {
        Some(u32::from(a - b'0') * 10 + u32::from(b - b'0'))
    } else {
        None
    }
}

/// A generalized time's fraction at `pos` (if any), in nanoseconds of
/// `unit` (the seconds of the last unit given); `pos` moves past it.
fn fraction(v: &[u8], pos: &mut usize, unit: u64) -> Result<u64, &'static str> {
    if !matches!(v.get(*pos), Some(b'.') | Some(b',')) {
        return Ok(0);
    }
    *pos += 1;
    let start = *pos;
    while v.get(*pos).is_some_and(u8::is_ascii_digit) {
        *pos += 1;
    }
    if *pos == start {
        return Err("empty fraction");
    }
    // At most 18 digits matter (u128 keeps the product exact).
    let digits = &v[start..(*pos).min(start + 18)];
    let mut num: u128 = 0;
    for d in digits {
        num = num * 10 + u128::from(d - b'0');
    }
    let den = 10u128.pow(digits.len() as u32);
    Ok((num * u128::from(unit) * 1_000_000_000 / den) as u64)
}

/// A generalized time's zone at `pos` ("Z" or an offset), in seconds
/// east of UTC; `pos` moves past it.
fn zone_offset(v: &[u8], pos: &mut usize) -> Result<i64, &'static str> {
    match v.get(*pos) {
        Some(b'Z') => {
            *pos += 1;
            Ok(0)
        }
        Some(&sign @ (b'+' | b'-')) => {
            let oh = two_digits(v, *pos + 1).ok_or("bad time zone offset")?;
            *pos += 3;
            let mut om = 0;
            if let Some(m) = two_digits(v, *pos) {
                om = m;
                *pos += 2;
            }
            if oh > 23 || om > 59 {
                return Err("time zone offset out of range");
            }
            let o = i64::from(oh * 3600 + om * 60);
            Ok(if sign == b'-' { -o } else { o })
        }
        _ => Err("missing time zone"),
    }
}

/// Parse RFC 4517 GeneralizedTime:
/// `century year month day hour [minute [second]] [fraction] g-time-zone`,
/// fraction = ("." / ",") 1*DIGIT applying to the last unit given,
/// g-time-zone = "Z" / ("+" / "-") hour [minute].
/// The result is converted to UTC; years outside 0000..=9999 after the
/// conversion are rejected so the fixed-width forms stay ordered.
pub(crate) fn parse_generalized_time(v: &[u8]) -> Result<UtcTime, String> {
    let bad = |m: &str| Err(format!("invalid generalized time: {m}"));
    if v.len() > 64 {
        return bad("too long");
    }
    let (Some(cc), Some(yy), Some(month), Some(day), Some(hour)) = (
        two_digits(v, 0),
        two_digits(v, 2),
        two_digits(v, 4),
        two_digits(v, 6),
        two_digits(v, 8),
    ) else {
        return bad("expected YYYYMMDDHH");
    };
    let year = i64::from(cc * 100 + yy);
    let mut pos = 10;
    let mut minute = 0;
    let mut second = 0;
    // Seconds in the last unit given, for the fraction.
    let mut unit: u64 = 3600;
    if let Some(m) = two_digits(v, pos) {
        minute = m;
        pos += 2;
        unit = 60;
        if let Some(s) = two_digits(v, pos) {
            second = s;
            pos += 2;
            unit = 1;
        }
    }
    let frac_nanos = match fraction(v, &mut pos, unit) {
        Ok(n) => n,
        Err(m) => return bad(m),
    };
    let offset_secs = match zone_offset(v, &mut pos) {
        Ok(o) => o,
        Err(m) => return bad(m),
    };
    if pos != v.len() {
        return bad("trailing characters");
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return bad("date out of range");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return bad("time out of range");
    }
    let mut secs = days_from_civil(year, month, day) * 86400
        + i64::from(hour * 3600 + minute * 60 + second)
        - offset_secs
        + (frac_nanos / 1_000_000_000) as i64;
    let nanos = (frac_nanos % 1_000_000_000) as u32;
    let days = secs.div_euclid(86400);
    secs = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return bad("year out of range after conversion to UTC");
    }
    Ok(UtcTime {
        year: y,
        month: m,
        day: d,
        hour: (secs / 3600) as u32,
        minute: (secs % 3600 / 60) as u32,
        second: (secs % 60) as u32,
        nanos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert!(parse_integer(b"0").is_ok());
        assert!(parse_integer(b"-12").is_ok());
        for bad in [&b""[..], b"-", b"-0", b"007", b"1a", b"+1", b" 1"] {
            assert!(parse_integer(bad).is_err(), "{bad:?}");
        }
        assert_eq!(integer_to_i64(b"-5"), Some(-5));
        assert_eq!(integer_to_i64(b"99999999999999999999"), None);
    }

    #[test]
    fn generalized_time_offsets() {
        let a = parse_generalized_time(b"20240101000000Z").unwrap();
        let b = parse_generalized_time(b"20231231190000-0500").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.normalized(), "20240101000000Z");
        let c = parse_generalized_time(b"2024010100+0130").unwrap();
        assert_eq!(c.normalized(), "20231231223000Z");
        // Fraction of an hour and of a second.
        let d = parse_generalized_time(b"2024010112.5Z").unwrap();
        assert_eq!(d.normalized(), "20240101123000Z");
        let e = parse_generalized_time(b"20240101120000,25Z").unwrap();
        assert_eq!(e.normalized(), "20240101120000.25Z");
        assert!(e.ordering_key() < d.ordering_key());
        // Leap day handling.
        assert!(parse_generalized_time(b"20240229000000Z").is_ok());
        assert!(parse_generalized_time(b"20230229000000Z").is_err());
        for bad in [
            &b"20240101000000"[..],
            b"2024010100000Z",
            b"20241301000000Z",
            b"20240101240000Z",
            b"20240101000000+2400",
            b"20240101000000Zx",
            b"20240101000000.Z",
            b"00000101000000+0100",
        ] {
            assert!(parse_generalized_time(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn checks() {
        assert!(check_value(Check::Country, b"DE").is_ok());
        assert!(check_value(Check::Country, b"DEU").is_err());
        assert!(check_value(Check::Boolean, b"true").is_err());
        assert!(check_value(Check::Dn, b"cn=x,o=y").is_ok());
        assert!(check_value(Check::Dn, b"cn").is_err());
        assert!(check_value(Check::Telephone, b"+1 555 0100").is_ok());
        assert!(check_value(Check::Telephone, b"555@1").is_err());
        assert!(check_value(Check::Oid, b"2.5.4.3").is_ok());
        assert!(check_value(Check::Oid, b"person").is_ok());
        assert!(check_value(Check::Oid, b"-x").is_err());
        assert!(check_value(Check::BitString, b"'0101'B").is_ok());
        assert!(check_value(Check::NameAndOptionalUid, b"cn=a#'01'B").is_ok());
        assert_eq!(
            split_name_and_uid(b"cn=a#'01'B"),
            (&b"cn=a"[..], Some(&b"'01'B"[..]))
        );
        assert!(check_value(Check::Uuid, b"597ae2f6-16a6-1027-98f4-d28b5365dc14").is_ok());
        assert!(check_value(Check::Uuid, b"597ae2f6-16a6-1027-98f4-d28b5365dc1").is_err());
        assert!(check_value(Check::DirectoryString, b"").is_err());
        assert!(check_value(Check::Numeric, b"12 34").is_ok());
    }
}

#[cfg(test)]
mod seconds_tests {
    #[test]
    fn generalized_time_reads_as_seconds_since_the_epoch() {
        assert_eq!(super::generalized_time_seconds(b"19700101000000Z"), Some(0));
        assert_eq!(
            super::generalized_time_seconds(b"20000301000001.5Z"),
            Some(951868801)
        );
        assert_eq!(
            super::generalized_time_seconds(b"19700101010000+0100"),
            Some(0)
        );
        assert_eq!(super::generalized_time_seconds(b"nonsense"), None);
    }
}
