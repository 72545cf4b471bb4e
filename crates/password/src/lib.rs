//! userPassword storage schemes (the crate `pando-password`).
//!
//! The lowest layer beside the protocol: hashing and verifying only. It
//! must not touch the store, configuration, sessions or the network; the
//! server decides which scheme and when (see `pando_server::hashing`).
//!
//! A stored value is `{SCHEME}data` (the RFC 2307 / RFC 3112 convention) or,
//! with no scheme prefix, the password in clear. New passwords are hashed with
//! argon2id. Verification also accepts the schemes that OpenLDAP and 389-DS
//! write, so their data can be imported unchanged:
//!
//! | scheme                          | data                                              |
//! |---------------------------------|---------------------------------------------------|
//! | `{ARGON2}`                      | PHC string `$argon2id$v=19$m=..,t=..,p=..$salt$hash` |
//! | `{MD5}` `{SHA}` `{SHA256}` `{SHA384}` `{SHA512}` | base64(digest(pw))               |
//! | `{SMD5}` `{SSHA}` `{SSHA256}` `{SSHA384}` `{SSHA512}` | base64(digest(pw ‖ salt) ‖ salt) |
//! | `{PBKDF2}` `{PBKDF2-SHA1}` `{PBKDF2-SHA256}` `{PBKDF2-SHA512}` | `iterations$salt$dk`, salt and dk in passlib's adapted base64 (`.` for `+`, no padding) or standard base64 |
//! | `{PBKDF2_SHA256}` (389-DS, NSS era) | base64(u32 BE iterations ‖ 64-byte salt ‖ 256-byte dk) |
//! | `{CRYPT}`                       | `$5$` sha256-crypt, `$6$` sha512-crypt, `$2a$` `$2b$` `$2y$` bcrypt here; every other crypt(3) method the system's libcrypt has (md5-crypt `$1$`, yescrypt `$y$`, scrypt `$7$`, DES…) through it, see [`system_crypt`] |
//! | `{CLEARTEXT}` `{CLEAR}` or none | the password itself                               |
//!
//! Scheme names match case-insensitively. Any malformed or unknown value
//! verifies as false; nothing here panics on a stored value.
//!
//! Stored values normally come from administrators, but an import can carry
//! anything, so work factors read from a stored value are capped (see the
//! `MAX_*` constants): a value demanding hours of CPU or gigabytes of memory
//! per bind is refused rather than computed.

use std::fmt;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Version};
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use rand::rngs::OsRng;
use rand::{Rng, RngCore};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha384, Sha512};

mod system_crypt;

/// Largest argon2 memory cost accepted from a stored value (1 GiB in KiB).
const MAX_ARGON2_M_KIB: u32 = 1 << 20;
/// Largest argon2 time cost accepted from a stored value.
const MAX_ARGON2_T: u32 = 64;
/// Largest argon2 parallelism accepted from a stored value.
const MAX_ARGON2_P: u32 = 16;
/// Largest PBKDF2 iteration count accepted from a stored value.
const MAX_PBKDF2_ITERATIONS: u32 = 10_000_000;
/// Largest sha-crypt rounds accepted from a stored value.
const MAX_CRYPT_ROUNDS: usize = 10_000_000;
/// Smallest sha-crypt rounds; smaller requests are raised to this, as glibc
/// does.
const MIN_CRYPT_ROUNDS: usize = 1_000;
/// sha-crypt's rounds when the value does not say.
const DEFAULT_CRYPT_ROUNDS: usize = 5_000;
/// Largest bcrypt cost accepted from a stored value (2^18 rounds, seconds).
const MAX_BCRYPT_COST: u32 = 18;
/// Longest scheme name looked for between the braces.
const MAX_SCHEME_LEN: usize = 32;
/// Salt length for new argon2 hashes (RFC 9106 recommends 16 bytes).
const ARGON2_SALT_LEN: usize = 16;

/// Stored values are usually padded, but some tools strip the padding.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Parameters for new argon2id hashes. The defaults are the OWASP minimum
/// (m = 19 MiB, t = 2, p = 1), which costs tens of milliseconds per bind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Argon2Params {
    /// Memory cost in KiB.
    pub m_cost_kib: u32,
    /// Number of passes.
    pub t_cost: u32,
    /// Degree of parallelism (lanes).
    pub p_cost: u32,
}

impl Default for Argon2Params {
    fn default() -> Self {
        Argon2Params {
            m_cost_kib: 19_456,
            t_cost: 2,
            p_cost: 1,
        }
    }
}

/// Why a new hash could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashError(String);

impl fmt::Display for HashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "password hashing failed: {}", self.0)
    }
}

impl std::error::Error for HashError {}

/// Fills `buf` from the OS; falls back to the thread-local CSPRNG (itself
/// seeded from the OS) if the OS source reports an error.
fn fill_random(buf: &mut [u8]) {
    if OsRng.try_fill_bytes(buf).is_err() {
        rand::thread_rng().fill_bytes(buf);
    }
}

/// Hashes a new password with argon2id and the given parameters; returns
/// `{ARGON2}` followed by the PHC string. Fails only for parameters argon2
/// rejects or a password longer than argon2 allows (2^32 - 1 bytes).
pub fn hash_password_with(clear: &[u8], params: &Argon2Params) -> Result<String, HashError> {
    let p = argon2::Params::new(params.m_cost_kib, params.t_cost, params.p_cost, None)
        .map_err(|e| HashError(e.to_string()))?;
    let hasher = Argon2::new(Algorithm::Argon2id, Version::V0x13, p);
    let mut salt = [0u8; ARGON2_SALT_LEN];
    fill_random(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| HashError(e.to_string()))?;
    let phc = hasher
        .hash_password(clear, &salt)
        .map_err(|e| HashError(e.to_string()))?;
    Ok(format!("{{ARGON2}}{phc}"))
}

/// Hashes a new password with argon2id and the default parameters; returns
/// `{ARGON2}$argon2id$v=19$m=19456,t=2,p=1$salt$hash`.
///
/// With the fixed default parameters argon2 can only fail for a password over
/// 4 GiB, which no LDAP request can carry; should it fail anyway, the value is
/// hashed as `{SSHA512}` rather than panicking or storing it in clear.
pub fn hash_password(clear: &[u8]) -> String {
    HashPolicy::default().hash(clear)
}

/// How clear-text passwords written by clients are stored: the scheme
/// and its work factor (`[passwords]` in the configuration). Cost per hash
/// on this project's 2-core test machine is in docs/operations.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashPolicy {
    /// `{ARGON2}` argon2id (the default): memory-hard, tens of milliseconds.
    Argon2(Argon2Params),
    /// `{PBKDF2-SHA512}iterations$salt$dk` in passlib's format, for sites
    /// whose other systems read the stored hashes (FIPS-approved).
    Pbkdf2Sha512 { iterations: u32 },
    /// `{SSHA512}`: one salted SHA-512, microseconds; as cheap to guess
    /// offline as it is to check.
    Ssha512,
    /// `{SSHA}`: one salted SHA-1, what OpenLDAP's `password-hash` writes by
    /// default; for sites whose other servers or tools read only that.
    /// Weaker than `{SSHA512}`; upgrade on bind never rewrites towards it.
    Ssha,
}

impl Default for HashPolicy {
    fn default() -> Self {
        HashPolicy::Argon2(Argon2Params::default())
    }
}

impl HashPolicy {
    /// A stored value for `clear` under this policy. Never fails: should the
    /// configured scheme fail (argon2 on a password over 4 GiB, which no
    /// request carries), the value is stored as `{SSHA512}`, never in clear.
    pub fn hash(&self, clear: &[u8]) -> String {
        match self {
            HashPolicy::Argon2(p) => {
                hash_password_with(clear, p).unwrap_or_else(|_| ssha512(clear))
            }
            HashPolicy::Pbkdf2Sha512 { iterations } => pbkdf2_sha512(clear, *iterations),
            HashPolicy::Ssha512 => ssha512(clear),
            HashPolicy::Ssha => ssha1(clear),
        }
    }

    /// Whether one hash costs milliseconds (and so goes through the
    /// bounded hashing queue) rather than microseconds.
    pub fn is_slow(&self) -> bool {
        !matches!(self, HashPolicy::Ssha512 | HashPolicy::Ssha)
    }

    /// The [`Strength`] of the values this policy writes.
    pub fn strength(&self) -> Strength {
        match self {
            HashPolicy::Ssha512 => Strength::SaltedDigest,
            HashPolicy::Ssha => Strength::WeakSalted,
            _ => Strength::KeyStretching,
        }
    }
}

/// How hard a stored value is to guess offline, weakest first: what
/// upgrade on bind compares with the configured scheme's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Strength {
    /// No scheme, `{CLEARTEXT}`.
    Clear,
    /// One unsalted digest (`{MD5}`, `{SHA*}`), NT, DES and BSDi crypt.
    Digest,
    /// One salted digest of MD5 or SHA-1 (`{SMD5}`, `{SSHA}`), md5-crypt,
    /// SunMD5.
    WeakSalted,
    /// One salted SHA-2 digest (`{SSHA256}`…`{SSHA512}`).
    SaltedDigest,
    /// argon2, PBKDF2, bcrypt, sha-crypt, yescrypt, scrypt; and anything
    /// unknown, which is never rewritten.
    KeyStretching,
}

/// The [`Strength`] of a stored userPassword value.
pub fn strength(stored: &[u8]) -> Strength {
    let Some((name, data)) = split_scheme(stored) else {
        return Strength::Clear;
    };
    match scheme_by_name(name) {
        Some(Scheme::Clear) => Strength::Clear,
        Some(Scheme::Sha(_)) => Strength::Digest,
        Some(Scheme::Ssha(Hash::Md5 | Hash::Sha1)) => Strength::WeakSalted,
        Some(Scheme::Ssha(_)) => Strength::SaltedDigest,
        Some(Scheme::Crypt) => system_crypt::strength(data),
        _ => Strength::KeyStretching,
    }
}

/// A stored value's scheme as reports name it (`{SSHA}`, `{CRYPT} md5-crypt`,
/// `clear text`), and whether this server can verify it at all (a known
/// scheme at a cost within the caps).
pub fn describe(stored: &[u8]) -> (String, bool) {
    let Some((name, data)) = split_scheme(stored) else {
        return ("clear text".into(), true);
    };
    let upper = String::from_utf8_lossy(name).to_ascii_uppercase();
    match scheme_by_name(name) {
        None => (format!("{{{upper}}}"), false),
        Some(Scheme::Crypt) => {
            let (method, ok) = system_crypt::method(data);
            (format!("{{CRYPT}} {method}"), ok)
        }
        Some(_) => (format!("{{{upper}}}"), true),
    }
}

/// Salt length of new PBKDF2 hashes (passlib uses 16 bytes).
const PBKDF2_SALT_LEN: usize = 16;

fn pbkdf2_sha512(clear: &[u8], iterations: u32) -> String {
    let iterations = iterations.clamp(1, MAX_PBKDF2_ITERATIONS);
    let mut salt = [0u8; PBKDF2_SALT_LEN];
    fill_random(&mut salt);
    let mut dk = [0u8; 64];
    pbkdf2_into(Hash::Sha512, clear, &salt, iterations, &mut dk);
    let ab64 = |b: &[u8]| {
        base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(b)
            .replace('+', ".")
    };
    format!(
        "{{PBKDF2-SHA512}}{iterations}${}${}",
        ab64(&salt),
        ab64(&dk)
    )
}

fn ssha512(clear: &[u8]) -> String {
    salted::<Sha512>("SSHA512", clear)
}

fn ssha1(clear: &[u8]) -> String {
    salted::<Sha1>("SSHA", clear)
}

/// `{NAME}` base64(digest(clear ‖ salt) ‖ salt), a 16-byte random salt: the
/// RFC 2307 salted-digest form every LDAP server verifies.
fn salted<D: Digest>(name: &str, clear: &[u8]) -> String {
    let mut salt = [0u8; 16];
    fill_random(&mut salt);
    let mut h = D::new();
    h.update(clear);
    h.update(salt);
    let mut raw = h.finalize().to_vec();
    raw.extend_from_slice(&salt);
    format!("{{{name}}}{}", STANDARD.encode(raw))
}

/// Characters for generated passwords: letters and digits without the
/// look-alikes 0/O/o, 1/l/I, so a password read aloud or off a screen is not
/// mistyped. 54 symbols, so 24 of them carry about 138 bits.
const GEN_ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
const GEN_LEN: usize = 24;

/// A random password for generated credentials (Password Modify without a new
/// password, the first-start administrator password).
pub fn generate_password() -> String {
    let mut rng = OsRng;
    (0..GEN_LEN)
        .map(|_| {
            // gen_range samples uniformly (no modulo bias).
            let i = rng.gen_range(0..GEN_ALPHABET.len());
            GEN_ALPHABET[i] as char
        })
        .collect()
}

/// Digest algorithms used by the SHA, SSHA and PBKDF2 families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hash {
    /// `{MD5}` and `{SMD5}` only: weak, verified so that migrated stores
    /// keep working (and rehashed on bind where the site allows it).
    Md5,
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scheme {
    Argon2,
    Sha(Hash),
    Ssha(Hash),
    Pbkdf2(Hash),
    /// 389-DS's NSS-era `{PBKDF2_SHA256}` binary layout.
    Pbkdf2Sha256Nss,
    Crypt,
    Clear,
}

fn scheme_by_name(name: &[u8]) -> Option<Scheme> {
    const TABLE: &[(&str, Scheme)] = &[
        ("ARGON2", Scheme::Argon2),
        ("SHA", Scheme::Sha(Hash::Sha1)),
        ("SHA256", Scheme::Sha(Hash::Sha256)),
        ("SHA384", Scheme::Sha(Hash::Sha384)),
        ("SHA512", Scheme::Sha(Hash::Sha512)),
        ("SSHA", Scheme::Ssha(Hash::Sha1)),
        ("SSHA256", Scheme::Ssha(Hash::Sha256)),
        ("SSHA384", Scheme::Ssha(Hash::Sha384)),
        ("SSHA512", Scheme::Ssha(Hash::Sha512)),
        ("PBKDF2", Scheme::Pbkdf2(Hash::Sha1)),
        ("PBKDF2-SHA1", Scheme::Pbkdf2(Hash::Sha1)),
        ("PBKDF2-SHA256", Scheme::Pbkdf2(Hash::Sha256)),
        ("PBKDF2-SHA512", Scheme::Pbkdf2(Hash::Sha512)),
        ("PBKDF2_SHA256", Scheme::Pbkdf2Sha256Nss),
        ("CRYPT", Scheme::Crypt),
        ("CLEARTEXT", Scheme::Clear),
        ("CLEAR", Scheme::Clear),
        ("MD5", Scheme::Sha(Hash::Md5)),
        ("SMD5", Scheme::Ssha(Hash::Md5)),
    ];
    TABLE
        .iter()
        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
        .map(|&(_, s)| s)
}

/// Splits `{NAME}rest`. None when the value has no well-formed scheme prefix
/// (then it is a cleartext password).
fn split_scheme(stored: &[u8]) -> Option<(&[u8], &[u8])> {
    if stored.first() != Some(&b'{') {
        return None;
    }
    let close = stored
        .iter()
        .take(MAX_SCHEME_LEN + 2)
        .position(|&b| b == b'}')?;
    let name = &stored[1..close];
    let plausible = !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plausible.then(|| (name, &stored[close + 1..]))
}

/// True when `stored` carries a known hashed scheme prefix, so it must be
/// stored as is and not hashed again. Prefix-only: a malformed `{SSHA}...`
/// still counts as hashed (hashing it would hide the administrator's error
/// behind a password nobody knows).
pub fn is_hashed(stored: &[u8]) -> bool {
    match split_scheme(stored).and_then(|(name, _)| scheme_by_name(name)) {
        None | Some(Scheme::Clear) => false,
        Some(_) => true,
    }
}

/// The password an unhashed value stands for: the value itself, or what
/// follows a `{CLEARTEXT}`/`{CLEAR}` prefix (so a client or an import that
/// marks clear text that way gets that password hashed, not the prefix
/// with it). Hashed values are returned unchanged.
pub fn clear_text_of(value: &[u8]) -> &[u8] {
    match split_scheme(value) {
        Some((name, rest)) if scheme_by_name(name) == Some(Scheme::Clear) => rest,
        _ => value,
    }
}

/// Salted-digest schemes and clear text take microseconds to check;
/// key-stretching ones (argon2, bcrypt, crypt, PBKDF2) milliseconds, by
/// design.
pub fn is_cheap_to_verify(stored: &[u8]) -> bool {
    const CHEAP: &[&str] = &[
        "{MD5}",
        "{SMD5}",
        "{SHA}",
        "{SSHA}",
        "{SHA256}",
        "{SSHA256}",
        "{SHA384}",
        "{SSHA384}",
        "{SHA512}",
        "{SSHA512}",
    ];
    if stored.first() != Some(&b'{') {
        return true; // clear text
    }
    CHEAP
        .iter()
        .any(|p| stored.len() >= p.len() && stored[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// Verifies a clear password against one stored userPassword value.
pub fn verify_password(clear: &[u8], stored: &[u8]) -> bool {
    let Some((name, data)) = split_scheme(stored) else {
        return clear_eq(clear, stored);
    };
    match scheme_by_name(name) {
        None => false,
        Some(Scheme::Clear) => clear_eq(clear, data),
        Some(Scheme::Argon2) => verify_argon2(clear, data),
        Some(Scheme::Sha(h)) => verify_sha(h, clear, data, false),
        Some(Scheme::Ssha(h)) => verify_sha(h, clear, data, true),
        Some(Scheme::Pbkdf2(h)) => verify_pbkdf2(h, clear, data),
        Some(Scheme::Pbkdf2Sha256Nss) => verify_pbkdf2_nss(clear, data),
        Some(Scheme::Crypt) => verify_crypt(clear, data),
    }
}

/// Equality whose running time depends only on the lengths. Lengths compared
/// here are digest sizes fixed by the scheme, so they reveal nothing.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// Cleartext comparison that leaks neither content nor length: both sides
/// are reduced to SHA-256 first, then compared in constant time.
fn clear_eq(clear: &[u8], stored: &[u8]) -> bool {
    ct_eq(&Sha256::digest(clear), &Sha256::digest(stored))
}

fn digest(h: Hash, parts: &[&[u8]]) -> Vec<u8> {
    fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
        let mut d = D::new();
        for p in parts {
            d.update(p);
        }
        d.finalize().to_vec()
    }
    match h {
        Hash::Md5 => run::<md5::Md5>(parts),
        Hash::Sha1 => run::<Sha1>(parts),
        Hash::Sha256 => run::<Sha256>(parts),
        Hash::Sha384 => run::<Sha384>(parts),
        Hash::Sha512 => run::<Sha512>(parts),
    }
}

fn digest_len(h: Hash) -> usize {
    match h {
        Hash::Md5 => 16,
        Hash::Sha1 => 20,
        Hash::Sha256 => 32,
        Hash::Sha384 => 48,
        Hash::Sha512 => 64,
    }
}

/// `{SHA*}`: base64(digest). `{SSHA*}`: base64(digest(pw ‖ salt) ‖ salt) with
/// at least one salt byte (as OpenLDAP requires).
fn verify_sha(h: Hash, clear: &[u8], data: &[u8], salted: bool) -> bool {
    let Ok(raw) = B64.decode(data) else {
        return false;
    };
    let n = digest_len(h);
    if salted {
        if raw.len() <= n {
            return false;
        }
        let (expected, salt) = raw.split_at(n);
        ct_eq(&digest(h, &[clear, salt]), expected)
    } else {
        raw.len() == n && ct_eq(&digest(h, &[clear]), &raw)
    }
}

/// Decodes passlib's "adapted base64" (`.` instead of `+`, padding dropped);
/// standard base64 is accepted too since `+` passes through unchanged.
fn ab64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mapped: Vec<u8> = s
        .iter()
        .map(|&b| if b == b'.' { b'+' } else { b })
        .collect();
    B64.decode(mapped).ok()
}

fn pbkdf2_into(h: Hash, clear: &[u8], salt: &[u8], rounds: u32, out: &mut [u8]) {
    match h {
        Hash::Md5 => pbkdf2::pbkdf2_hmac::<md5::Md5>(clear, salt, rounds, out),
        Hash::Sha1 => pbkdf2::pbkdf2_hmac::<Sha1>(clear, salt, rounds, out),
        Hash::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(clear, salt, rounds, out),
        Hash::Sha384 => pbkdf2::pbkdf2_hmac::<Sha384>(clear, salt, rounds, out),
        Hash::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(clear, salt, rounds, out),
    }
}

/// `iterations$salt$dk` (OpenLDAP contrib pw-pbkdf2, passlib ldap_pbkdf2_*,
/// 389-DS pwdchan). The derived key length is whatever was stored.
fn verify_pbkdf2(h: Hash, clear: &[u8], data: &[u8]) -> bool {
    let mut parts = data.split(|&b| b == b'$');
    let (Some(iter), Some(salt), Some(dk), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some(rounds) = parse_decimal(iter) else {
        return false;
    };
    let (Some(salt), Some(dk)) = (ab64_decode(salt), ab64_decode(dk)) else {
        return false;
    };
    if rounds == 0 || rounds > u64::from(MAX_PBKDF2_ITERATIONS) || dk.len() < 8 || dk.len() > 512 {
        return false;
    }
    let mut out = vec![0u8; dk.len()];
    // rounds <= MAX_PBKDF2_ITERATIONS, which fits in u32.
    pbkdf2_into(h, clear, &salt, rounds as u32, &mut out);
    ct_eq(&out, &dk)
}

/// 389-DS `{PBKDF2_SHA256}`: base64 of this 324-byte layout:
///
/// | offset | size | field                      |
/// |--------|------|----------------------------|
/// | 0      | 4    | iterations, big-endian u32 |
/// | 4      | 64   | salt                       |
/// | 68     | 256  | PBKDF2-HMAC-SHA256 output  |
fn verify_pbkdf2_nss(clear: &[u8], data: &[u8]) -> bool {
    const ITER: usize = 4;
    const SALT: usize = 64;
    const DK: usize = 256;
    let Ok(raw) = B64.decode(data) else {
        return false;
    };
    if raw.len() != ITER + SALT + DK {
        return false;
    }
    let rounds = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
    if rounds == 0 || rounds > MAX_PBKDF2_ITERATIONS {
        return false;
    }
    let salt = &raw[ITER..ITER + SALT];
    let mut out = [0u8; DK];
    pbkdf2_into(Hash::Sha256, clear, salt, rounds, &mut out);
    ct_eq(&out, &raw[ITER + SALT..])
}

/// Parses a decimal number of at most 10 digits.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 10 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

fn verify_argon2(clear: &[u8], data: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(phc) = PasswordHash::new(s) else {
        return false;
    };
    let Ok(params) = argon2::Params::try_from(&phc) else {
        return false;
    };
    if params.m_cost() > MAX_ARGON2_M_KIB
        || params.t_cost() > MAX_ARGON2_T
        || params.p_cost() > MAX_ARGON2_P
    {
        return false;
    }
    // The verifier takes algorithm, version and parameters from the PHC
    // string, and compares outputs in constant time.
    Argon2::default().verify_password(clear, &phc).is_ok()
}

fn verify_crypt(clear: &[u8], data: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(data) else {
        return false;
    };
    if let Some(rest) = s.strip_prefix("$6$") {
        verify_sha_crypt(clear, rest, true)
    } else if let Some(rest) = s.strip_prefix("$5$") {
        verify_sha_crypt(clear, rest, false)
    } else if s.starts_with("$2a$") || s.starts_with("$2b$") || s.starts_with("$2y$") {
        verify_bcrypt(clear, s)
    } else {
        system_crypt::verify(clear, s)
    }
}

/// sha-crypt (Drepper): `[rounds=N$]salt$hash`, after the `$5$`/`$6$` id.
fn verify_sha_crypt(clear: &[u8], rest: &str, is512: bool) -> bool {
    let mut fields: Vec<&str> = rest.split('$').collect();
    let rounds = match fields.first().and_then(|f| f.strip_prefix("rounds=")) {
        Some(n) => {
            let Some(n) = parse_decimal(n.as_bytes()) else {
                return false;
            };
            fields.remove(0);
            // glibc raises too-small counts to the minimum.
            (n as usize).max(MIN_CRYPT_ROUNDS)
        }
        None => DEFAULT_CRYPT_ROUNDS,
    };
    if rounds > MAX_CRYPT_ROUNDS {
        return false;
    }
    let [salt, hash] = fields[..] else {
        return false;
    };
    let computed = if is512 {
        match sha_crypt::Sha512Params::new(rounds) {
            Ok(p) => sha_crypt::sha512_crypt_b64(clear, salt.as_bytes(), &p),
            Err(_) => return false,
        }
    } else {
        match sha_crypt::Sha256Params::new(rounds) {
            Ok(p) => sha_crypt::sha256_crypt_b64(clear, salt.as_bytes(), &p),
            Err(_) => return false,
        }
    };
    match computed {
        Ok(c) => ct_eq(c.as_bytes(), hash.as_bytes()),
        Err(_) => false,
    }
}

/// bcrypt `$2?$cc$<22 salt><31 hash>`. Like every bcrypt, only the first 72
/// password bytes count.
fn verify_bcrypt(clear: &[u8], s: &str) -> bool {
    let cost = s.get(4..6).and_then(|c| parse_decimal(c.as_bytes()));
    match cost {
        Some(c) if c <= u64::from(MAX_BCRYPT_COST) => {}
        _ => return false,
    }
    // bcrypt::verify compares in constant time.
    bcrypt::verify(clear, s).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors below were computed outside Rust (python3 hashlib/crypt/bcrypt,
    /// cross-checked with `openssl passwd -6`) for this password.
    const PW: &[u8] = "pässwörd 1".as_bytes();

    const VECTORS: &[&str] = &[
        // slappasswd -h {MD5} / {SMD5} / {SSHA512} (pw-sha2) / {CRYPT} -c '$1$%.8s'
        "{MD5}znS4ktpEGwD0thUjhyvGtA==",
        "{SMD5}oe3aSoo4vna5cn+O3wCsXLsZc08=",
        "{SSHA512}66fIP9Tyz64vlRGoc4vO699k+6+uWWGtDbFRaefIikxUpBAwdxWSAGBbKMRJQxFGUfSwGZzQ5Pj4CIUBlj4W8gozKJPgjEIf",
        "{CRYPT}$1$HwMWikNh$BgtdkdxbpAr3aHm.yxUrd/",
        "{CRYPT}$y$j9T$beaM/riT2bfPHZyM$oCZXu4tPQj66n9y34TGJpRJ3JcYW9IDfaqKtnoekGs0",
        "{SHA}/Hrn08gEogcgvDjo5YNQSGibZVE=",
        "{SSHA}wpSedL3OZySxml3LWqErV89KxvGhssPU5fYHGA==",
        "{SHA256}UODX5JZHe18JVwv9yvMbAoeS719Y7fwn28vMuM/OHRU=",
        "{SSHA256}U34egc6zMrkRkHSES5Qbvg8W6yv5uEhyo/jBMhbxTOChssPU5fYHGA==",
        "{SHA512}MGrCWX/OaIyw5xBZ0RrM2vwe1YHoo2MD/NKt2+vkfLiudEOMnHxXTsVXCSooO5eehIdUJFylnTmr3TTyK23wMw==",
        "{SSHA512}YMYAqAm7X6cXhHHOlBSeTHM8Idc7WbVXMmWhcU3yXFONBmB3L7esC3hanDrTRY1AausrKJl5V6z+/OV/AFTCtKGyw9Tl9gcY",
        "{PBKDF2-SHA256}1000$../.ABEiM0T77/5VZneImQ$1NRDdK8RwQpPrRzgjX24NtSJWsqsZgeQKe4gFaLai/k",
        "{PBKDF2-SHA256}1000$++/+ABEiM0T77/5VZneImQ==$1NRDdK8RwQpPrRzgjX24NtSJWsqsZgeQKe4gFaLai/k=",
        "{PBKDF2-SHA512}1000$../.ABEiM0T77/5VZneImQ$fMiH4NtVRh2V2taXHiCUGwP/jrW6JaqlQep3F1VWCaAKF.qJ.AuhhVW6bjg9nEj8CLiu.fHvoM9XxxDkOHc6vQ",
        "{PBKDF2-SHA512}1000$++/+ABEiM0T77/5VZneImQ==$fMiH4NtVRh2V2taXHiCUGwP/jrW6JaqlQep3F1VWCaAKF+qJ+AuhhVW6bjg9nEj8CLiu+fHvoM9XxxDkOHc6vQ==",
        "{PBKDF2-SHA1}1000$../.ABEiM0T77/5VZneImQ$2JD/EYMz2hrzbwX0gY.qqVdbal0",
        "{PBKDF2}1000$../.ABEiM0T77/5VZneImQ$2JD/EYMz2hrzbwX0gY.qqVdbal0",
        "{PBKDF2_SHA256}AAAD6AABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4fICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj9gpIbCeBH8TXdA3zzjhGTpPGOrDULfR6KWiy84fZHcTlc2Tu2TzeWDHV3KT8dDwVa/Ogi7F9mVeB7At1MnWepuvKOCe/4Q8v3Z9AsAVWlU/QPqVMGqodynju77dq1Xk+kkKkFYu58Sd1VOowtnRC31xInPhGTAlpY/Z/QjQqoC8seZOgeMSTWwlqMIZzRvyKT+EiM/AydRJTFeml28LNa9WCZ2UFp+Dt5050NbYX/PwfPpzCMtHegSVDcfFLwjujdH8SYxBiJqODIhLyWyo4zz5VeHLiwI25jwPORZA7yDf+qY4xF9NRSuHkATd4iVoaAPkLMbXutUzKIKN3ofIR3+",
        "{CRYPT}$5$saltstring$tRveeBE08OC0Xt.1FqH3L9Vgf4d.lly6LSun3wGlEr9",
        "{CRYPT}$5$rounds=2000$roundsalt$ZnuEE/cuFoQwg2Mscg2nfB5Kx99gWKbq/ibX1u.D..B",
        "{CRYPT}$6$saltstring$yaZyFOA9PSXJeUCatew92hHpPTZ/6dsQX.VbaF30WAGcxnJDwwuxLgKsy/cNZswddgMx1K/L3yWN7Z0sRD2i./",
        "{CRYPT}$6$rounds=1000$roundsalt$3XZLYOpBVIy5iuHK5asehwqb.8/D/5C3tJhXdDsma4k.tTlFQKlu0Z3WW6sSXimPSpG4PnOmnARcgNpjofoVg1",
        "{CRYPT}$2b$04$abcdefghijklmnopqrstuuttEEnz76zm7MjVN//MHDv0G89wKAxhO",
        "{CRYPT}$2a$04$abcdefghijklmnopqrstuuttEEnz76zm7MjVN//MHDv0G89wKAxhO",
        "{CRYPT}$2y$04$abcdefghijklmnopqrstuuttEEnz76zm7MjVN//MHDv0G89wKAxhO",
    ];

    #[test]
    fn known_vectors_verify_and_reject_wrong_passwords() {
        for v in VECTORS {
            assert!(verify_password(PW, v.as_bytes()), "{v}");
            assert!(
                !verify_password(b"p\xc3\xa4ssw\xc3\xb6rd 2", v.as_bytes()),
                "{v}"
            );
            assert!(!verify_password(b"", v.as_bytes()), "{v}");
            assert!(is_hashed(v.as_bytes()), "{v}");
        }
    }

    #[test]
    fn scheme_names_are_case_insensitive() {
        for v in VECTORS {
            let lower = match v.find('}') {
                Some(i) => format!("{}{}", v[..i].to_ascii_lowercase(), &v[i..]),
                None => panic!("vector without scheme"),
            };
            assert!(verify_password(PW, lower.as_bytes()), "{lower}");
        }
    }

    #[test]
    fn argon2_round_trip() {
        let stored = hash_password(b"hunter2");
        assert!(
            stored.starts_with("{ARGON2}$argon2id$v=19$m=19456,t=2,p=1$"),
            "{stored}"
        );
        assert!(verify_password(b"hunter2", stored.as_bytes()));
        assert!(!verify_password(b"hunter3", stored.as_bytes()));
        assert!(is_hashed(stored.as_bytes()));
        // Salted: the same password hashes differently each time.
        let again = hash_password(b"hunter2");
        assert_ne!(stored, again);
        // Custom parameters are recorded in the PHC string and honoured.
        let cheap = Argon2Params {
            m_cost_kib: 64,
            t_cost: 1,
            p_cost: 1,
        };
        let stored = hash_password_with(PW, &cheap).expect("valid params");
        assert!(stored.contains("$m=64,t=1,p=1$"), "{stored}");
        assert!(!verify_password(PW, stored.to_ascii_lowercase().as_bytes()));
        let upper_scheme = stored.replacen("{ARGON2}", "{argon2}", 1);
        assert!(verify_password(PW, upper_scheme.as_bytes()));
        assert!(hash_password_with(
            PW,
            &Argon2Params {
                m_cost_kib: 0,
                ..cheap
            }
        )
        .is_err());
    }

    #[test]
    fn argon2_work_factors_are_capped() {
        // A syntactically valid hash demanding 4 GiB of memory is refused
        // without allocating it.
        let huge = "{ARGON2}$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHRzYWx0$\
                    AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        assert!(!verify_password(PW, huge.as_bytes()));
        let many_passes = "{ARGON2}$argon2id$v=19$m=64,t=1000,p=1$c2FsdHNhbHRzYWx0$\
                           AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        assert!(!verify_password(PW, many_passes.as_bytes()));
    }

    #[test]
    fn cleartext_values() {
        assert!(verify_password(b"secret", b"secret"));
        assert!(!verify_password(b"secret", b"secret "));
        assert!(!verify_password(b"secret", b"Secret"));
        assert!(!verify_password(b"", b"x"));
        assert!(verify_password(b"", b""));
        assert!(verify_password(b"secret", b"{CLEARTEXT}secret"));
        assert!(verify_password(b"secret", b"{clear}secret"));
        // Not a scheme prefix: compared as cleartext.
        assert!(verify_password(b"{not a scheme}x", b"{not a scheme}x"));
        assert!(verify_password(b"{SSHA", b"{SSHA"));
        assert!(!is_hashed(b"secret"));
        assert!(!is_hashed(b"{CLEARTEXT}secret"));
        assert!(!is_hashed(b"{UNKNOWN}abc"));
        assert!(!is_hashed(b""));
        assert!(is_hashed(b"{MD5}X03MO1qnZdYdgyfeuILPmQ=="));
        assert_eq!(clear_text_of(b"{CLEARTEXT}secret"), b"secret");
        assert_eq!(clear_text_of(b"{clear}secret"), b"secret");
        assert_eq!(clear_text_of(b"secret"), b"secret");
        assert_eq!(clear_text_of(b"{SSHA}abc"), b"{SSHA}abc");
    }

    #[test]
    fn strength_ranks_schemes_and_describe_names_them() {
        assert_eq!(strength(b"secret"), Strength::Clear);
        assert_eq!(strength(b"{CLEARTEXT}secret"), Strength::Clear);
        assert_eq!(strength(VECTORS[0].as_bytes()), Strength::Digest); // {MD5}
        assert_eq!(strength(VECTORS[1].as_bytes()), Strength::WeakSalted); // {SMD5}
        assert_eq!(strength(b"{SSHA}x"), Strength::WeakSalted);
        assert_eq!(strength(b"{SSHA512}x"), Strength::SaltedDigest);
        assert_eq!(strength(b"{ARGON2}x"), Strength::KeyStretching);
        assert_eq!(strength(b"{UNKNOWN}x"), Strength::KeyStretching);
        assert!(strength(b"{SSHA}x") < HashPolicy::Ssha512.strength());
        assert!(strength(b"{SSHA512}x") == HashPolicy::Ssha512.strength());
        // `ssha` writes what it sees as its own strength: never upgraded.
        let v = HashPolicy::Ssha.hash(b"secret");
        assert!(v.starts_with("{SSHA}"), "{v}");
        assert_eq!(strength(v.as_bytes()), HashPolicy::Ssha.strength());
        assert!(verify_password(b"secret", v.as_bytes()));
        assert!(!verify_password(b"Secret", v.as_bytes()));
        assert_eq!(describe(b"{md5}abc"), ("{MD5}".to_string(), true));
        assert_eq!(
            describe(b"{KERBEROS}bob"),
            ("{KERBEROS}".to_string(), false)
        );
        assert_eq!(describe(b"s3cret"), ("clear text".to_string(), true));
        assert_eq!(
            describe(VECTORS[3].as_bytes()),
            ("{CRYPT} md5-crypt".to_string(), true)
        );
    }

    #[test]
    fn unknown_and_malformed_values_are_false() {
        let bad: &[&[u8]] = &[
            b"{UNKNOWN}abc",
            b"{SSHA}",
            b"{SSHA}!!!notbase64",
            // Exactly a SHA-1 digest: no salt.
            b"{SSHA}/Hrn08gEogcgvDjo5YNQSGibZVE=",
            // Truncated digest.
            b"{SHA}/Hrn08gEogcgvDjo5YNQSGibZ",
            b"{SHA256}/Hrn08gEogcgvDjo5YNQSGibZVE=",
            b"{PBKDF2-SHA256}",
            b"{PBKDF2-SHA256}1000$abc",
            b"{PBKDF2-SHA256}0$../.ABEiM0T77/5VZneImQ$1NRDdK8RwQpPrRzgjX24NtSJWsqsZgeQKe4gFaLai/k",
            b"{PBKDF2-SHA256}x1000$../.ABEiM0T77/5VZneImQ$1NRDdK8RwQpPrRzgjX24NtSJWsqsZgeQKe4gFaLai/k",
            b"{PBKDF2-SHA256}99999999999$AA$AAAAAAAAAAAAAAAAAAAAAA",
            b"{PBKDF2-SHA256}1000$../.ABEiM0T77/5VZneImQ$1NRDdK8RwQpPrRzgjX24NtSJWsqsZgeQKe4gFaLai/k$x",
            b"{PBKDF2_SHA256}AAAD6AAB",
            b"{CRYPT}",
            b"{CRYPT}abJnggxhB/yWI",
            b"{CRYPT}$1$saltsalt$hash",
            b"{CRYPT}$6$",
            b"{CRYPT}$6$saltstring",
            b"{CRYPT}$6$rounds=x$salt$hash",
            b"{CRYPT}$6$rounds=999999999$roundsalt$3XZLYOpBVIy5iuHK5asehwqb",
            b"{CRYPT}$6$a$b$c$d",
            b"{CRYPT}$2b$04$short",
            b"{CRYPT}$2b$31$abcdefghijklmnopqrstuuttEEnz76zm7MjVN//MHDv0G89wKAxhO",
            b"{CRYPT}$2b$xx$abcdefghijklmnopqrstuuttEEnz76zm7MjVN//MHDv0G89wKAxhO",
            b"{CRYPT}\xff\xfe",
            b"{ARGON2}",
            b"{ARGON2}$argon2id$v=19$m=19456",
            b"{ARGON2}$argon2xx$v=19$m=64,t=1,p=1$c2FsdHNhbHQ$AAAA",
            b"{ARGON2}\xff",
        ];
        for v in bad {
            assert!(!verify_password(PW, v), "{}", String::from_utf8_lossy(v));
        }
    }

    #[test]
    fn non_utf8_passwords_work_with_byte_schemes() {
        let clear = b"\xff\x00\xfe";
        let stored = hash_password_with(
            clear,
            &Argon2Params {
                m_cost_kib: 64,
                t_cost: 1,
                p_cost: 1,
            },
        )
        .expect("hash");
        assert!(verify_password(clear, stored.as_bytes()));
        assert!(!verify_password(b"\xff\x00\xfd", stored.as_bytes()));
        let fallback = ssha512(clear);
        assert!(fallback.starts_with("{SSHA512}"));
        assert!(verify_password(clear, fallback.as_bytes()));
        assert!(!verify_password(b"\xff", fallback.as_bytes()));
    }

    #[test]
    fn generated_passwords() {
        let a = generate_password();
        let b = generate_password();
        assert_eq!(a.len(), GEN_LEN);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| GEN_ALPHABET.contains(&c)), "{a}");
        for c in b"0O1lIo" {
            assert!(!GEN_ALPHABET.contains(c));
        }
        // Every symbol is reachable (catches an off-by-one in the range).
        let mut seen = [false; 256];
        for _ in 0..200 {
            for c in generate_password().bytes() {
                seen[c as usize] = true;
            }
        }
        assert!(GEN_ALPHABET.iter().all(|&c| seen[c as usize]));
    }

    #[test]
    fn ct_eq_basics() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
