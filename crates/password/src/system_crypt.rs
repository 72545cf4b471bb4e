//! `{CRYPT}` values whose method Pando does not implement itself, verified
//! by the system's crypt(3) (libxcrypt on Debian): md5-crypt `$1$`,
//! yescrypt `$y$`, gost-yescrypt `$gy$`, scrypt `$7$`, SunMD5 `$md5`, BSDi
//! `_`, NT `$3$` and traditional DES. slapd's `{CRYPT}` calls the same
//! function, so a store migrated from it verifies as it did there.
//! sha256/sha512-crypt and bcrypt stay in Rust (the parent module): they are
//! the common ones, and their work factors are capped there.
//!
//! A stored value sets its own work factor, and stored values can come from
//! an import, so each method's cost is read from the setting first and a
//! value above [`MAX_MEMORY`] or the round caps below verifies as false,
//! without calling crypt(3). Methods not listed here verify as false.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// Memory one verification may take (yescrypt, scrypt): 64 MiB, four times
/// Debian's yescrypt default, the same as scrypt's default.
const MAX_MEMORY: u64 = 64 << 20;
/// scrypt's parallelism (each lane repeats the whole memory-hard work).
const MAX_SCRYPT_P: u64 = 4;
/// SunMD5 rounds (mkpasswd picks about 40,000).
const MAX_SUNMD5_ROUNDS: u64 = 200_000;
/// BSDi extended DES iterations (mkpasswd picks 725).
const MAX_BSDI_ROUNDS: u64 = 100_000;
/// The size crypt_rn needs (`sizeof(struct crypt_data)` in crypt.h).
const CRYPT_DATA_SIZE: usize = 32_768;
/// Longest passphrase crypt(3) takes, without its terminating NUL.
const MAX_PHRASE: usize = 511;

#[link(name = "crypt")]
extern "C" {
    /// crypt.h: hashes `phrase` as `setting` says into `data`; a null
    /// pointer on any error (never a string starting with '*').
    fn crypt_rn(
        phrase: *const c_char,
        setting: *const c_char,
        data: *mut c_void,
        size: c_int,
    ) -> *mut c_char;
}

/// The crypt(3) alphabet: each character stands for its index.
const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn itoa64(c: u8) -> Option<u64> {
    ITOA64.iter().position(|&x| x == c).map(|i| i as u64)
}

/// `n` characters of crypt's base64 read as a little-endian number.
fn itoa64_le(s: &[u8]) -> Option<u64> {
    s.iter()
        .rev()
        .try_fold(0u64, |acc, &c| Some((acc << 6) | itoa64(c)?))
}

/// Whether crypt(3) may be asked to verify `hash` (the stored value after
/// `{CRYPT}`): a method listed in the module header, at a cost within the
/// caps.
fn affordable(hash: &str) -> bool {
    let b = hash.as_bytes();
    if let Some(rest) = hash.strip_prefix("$y$").or(hash.strip_prefix("$gy$")) {
        return yescrypt_affordable(rest.as_bytes());
    }
    if let Some(rest) = hash.strip_prefix("$7$") {
        return scrypt_affordable(rest.as_bytes());
    }
    if hash.starts_with("$1$") || hash.starts_with("$3$") {
        return true; // fixed cost
    }
    if let Some(rest) = hash.strip_prefix("$md5") {
        return sunmd5_affordable(rest);
    }
    if let Some(rest) = b.strip_prefix(b"_") {
        return rest.len() == 19 && itoa64_le(&rest[..4]).is_some_and(|n| n <= MAX_BSDI_ROUNDS);
    }
    // Traditional DES: two salt characters and eleven of hash.
    b.len() == 13 && b.iter().all(|&c| itoa64(c).is_some())
}

/// yescrypt's parameters, `$y$<flags><N><r>$salt$hash`: N is 2^(index+1),
/// r is index+1; memory is 128·r·N bytes. Longer parameter strings (the
/// optional p, t and g fields) are not accepted.
fn yescrypt_affordable(rest: &[u8]) -> bool {
    let Some(end) = rest.iter().position(|&c| c == b'$') else {
        return false;
    };
    let [flags, n, r] = rest[..end] else {
        return false;
    };
    let (Some(_), Some(n_log2), Some(r)) = (itoa64(flags), itoa64(n), itoa64(r)) else {
        return false;
    };
    n_log2 + 1 < 40 && (128 * (r + 1)) << (n_log2 + 1) <= MAX_MEMORY
}

/// scrypt's parameters, `$7$<N:1><r:5><p:5>salt$hash`: N is 2^index, r and
/// p 30-bit numbers; memory is 128·r·N bytes, each of the p lanes once.
fn scrypt_affordable(rest: &[u8]) -> bool {
    if rest.len() < 11 {
        return false;
    }
    let (Some(n_log2), Some(r), Some(p)) = (
        itoa64(rest[0]),
        itoa64_le(&rest[1..6]),
        itoa64_le(&rest[6..11]),
    ) else {
        return false;
    };
    n_log2 < 40 && r > 0 && p > 0 && p <= MAX_SCRYPT_P && (128 * r) << n_log2 <= MAX_MEMORY
}

/// SunMD5: `$md5$salt$hash` (4096 rounds) or `$md5,rounds=N$salt$hash`.
fn sunmd5_affordable(rest: &str) -> bool {
    match rest.strip_prefix(",rounds=") {
        Some(r) => r
            .split('$')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n <= MAX_SUNMD5_ROUNDS),
        None => rest.starts_with('$'),
    }
}

/// The crypt(3) method of `data` (the value after `{CRYPT}`) by name, and
/// whether this server verifies it (here or in the parent module).
pub(super) fn method(data: &[u8]) -> (&'static str, bool) {
    let s = std::str::from_utf8(data).unwrap_or("");
    const NAMED: &[(&str, &str)] = &[
        ("$1$", "md5-crypt"),
        ("$2a$", "bcrypt"),
        ("$2b$", "bcrypt"),
        ("$2y$", "bcrypt"),
        ("$3$", "NT"),
        ("$5$", "sha256-crypt"),
        ("$6$", "sha512-crypt"),
        ("$7$", "scrypt"),
        ("$y$", "yescrypt"),
        ("$gy$", "gost-yescrypt"),
        ("$md5", "SunMD5"),
        ("_", "BSDi DES"),
    ];
    let name = match NAMED.iter().find(|(p, _)| s.starts_with(p)) {
        Some((_, n)) => n,
        None if s.len() == 13 && !s.starts_with('$') => "DES",
        None => return ("unknown method", false),
    };
    let here = s.starts_with("$2") || s.starts_with("$5$") || s.starts_with("$6$");
    (name, here || affordable(s))
}

/// How hard a crypt(3) value is to guess: see [`super::Strength`].
pub(super) fn strength(data: &[u8]) -> super::Strength {
    use super::Strength::*;
    match method(data).0 {
        "DES" | "BSDi DES" | "NT" => Digest,
        "md5-crypt" | "SunMD5" => WeakSalted,
        _ => KeyStretching,
    }
}

/// Verifies `clear` against the crypt(3) string `hash`.
pub(super) fn verify(clear: &[u8], hash: &str) -> bool {
    if clear.len() > MAX_PHRASE || !affordable(hash) {
        return false;
    }
    let (Ok(phrase), Ok(setting)) = (CString::new(clear), CString::new(hash)) else {
        return false; // a NUL inside either cannot reach crypt(3)
    };
    // crypt_rn wants zeroed scratch space of this size ("initialized" = 0).
    let mut data = vec![0u8; CRYPT_DATA_SIZE];
    // SAFETY: both strings are NUL-terminated and live across the call;
    // `data` is writable for the size given; the result, when not null,
    // points into `data`, which outlives its use below.
    let out = unsafe {
        crypt_rn(
            phrase.as_ptr(),
            setting.as_ptr(),
            data.as_mut_ptr().cast(),
            CRYPT_DATA_SIZE as c_int,
        )
    };
    if out.is_null() {
        return false;
    }
    // SAFETY: crypt_rn returned a NUL-terminated string inside `data`.
    let computed = unsafe { CStr::from_ptr(out) }.to_bytes();
    let ok = super::ct_eq(computed, hash.as_bytes());
    data.fill(0); // the scratch area held key material
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made by `mkpasswd -m <method> 'pässwörd 1'` (Debian 12, libxcrypt)
    /// and `slappasswd -h {CRYPT} -c '$1$%.8s'`.
    const PW: &[u8] = "pässwörd 1".as_bytes();
    const VECTORS: &[&str] = &[
        "$1$HwMWikNh$BgtdkdxbpAr3aHm.yxUrd/",
        "$1$qJGpXKLY$GyoA47YNQ5KOHsznGrcGD.",
        "$y$j9T$beaM/riT2bfPHZyM$oCZXu4tPQj66n9y34TGJpRJ3JcYW9IDfaqKtnoekGs0",
        "$y$j9T$DLr2Gc2oa42e/pv0jX334/$.NFPqmSLxlDJIB9UBlsli5qYqJtAdhPl0744COIxYg2",
        "$gy$j9T$36yOSLZKaKDE6ydwMdA7C0$MqAke0hSzBvvYZ9GvGFk2MmHHGwREau4bNgHU3cKGp2",
        "$7$CU..../....ZvmVaDtjAne2lv7Q3uC.m/$AH3hUjejognkBPceP5WjVyBl6Rnf68XiOtLLOCaMUxA",
        "$md5,rounds=40660$p/As5MTW$$lxEYRLG94nVhDxqmDWcD5.",
        "_J9..7bkwcQSaxr6Mu4Q",
        "DMBrswQkdh52Q",
        "$3$$90461d4bf19b7f2c39bc01b371748061",
    ];

    #[test]
    fn every_method_verifies_and_refuses_a_wrong_password() {
        for v in VECTORS {
            assert!(verify(PW, v), "{v}");
            // (DES reads only the first eight bytes, so the wrong password
            // differs early.)
            assert!(!verify(b"another password", v), "{v}");
            assert!(!verify(b"", v), "{v}");
        }
    }

    #[test]
    fn costs_above_the_caps_are_refused_without_hashing() {
        // mkpasswd -m yescrypt -R 11: N = 2^18, 1 GiB.
        let big = "$y$jFT$S5offI3e/t38ePKQwyRj1/$vX33s7bsiFP5QJA6CNzK6rXZIr4/IWcVdqfkKykr5z6";
        assert!(!affordable(big));
        assert!(!verify(b"x", big));
        // mkpasswd -m scrypt -R 10: N = 2^17, 512 MiB.
        assert!(!affordable(
            "$7$FU..../....dSFocS9FDa.1sLzGsLS9Y0$2hhC23dcyQJJMqqaggu4ut1tXjI.XlETW/jPITnCbdC"
        ));
        assert!(!affordable(
            "$md5,rounds=99999999$p/As5MTW$$lxEYRLG94nVhDxqmDWcD5."
        ));
        assert!(!affordable("_zzzz7bkwcQSaxr6Mu4Q"));
        // Methods not listed, and garbage, never reach crypt(3).
        for v in [
            "$sha1$40000$abc$def",
            "$9$x",
            "",
            "*",
            "!!",
            "$y$j9$a$b",
            "$7$C",
        ] {
            assert!(!affordable(v), "{v}");
            assert!(!verify(b"x", v), "{v}");
        }
    }

    #[test]
    fn methods_are_named_and_ranked() {
        use super::super::Strength;
        assert_eq!(method(VECTORS[0].as_bytes()), ("md5-crypt", true));
        assert_eq!(method(b"DMBrswQkdh52Q"), ("DES", true));
        assert_eq!(method(b"$6$salt$x"), ("sha512-crypt", true));
        assert_eq!(method(b"$9$x"), ("unknown method", false));
        assert!(!method(b"$y$jFT$a$b").1); // above the memory cap
        assert_eq!(strength(b"DMBrswQkdh52Q"), Strength::Digest);
        assert_eq!(strength(VECTORS[0].as_bytes()), Strength::WeakSalted);
        assert_eq!(strength(VECTORS[2].as_bytes()), Strength::KeyStretching);
    }

    #[test]
    fn a_nul_in_the_password_verifies_as_false() {
        assert!(!verify(b"p\0x", VECTORS[0]));
    }
}
