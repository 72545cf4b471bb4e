//! Damaged data files: arbitrary bytes (mutated from real stores in
//! `seeds/store_file`) as `data.mdb`, read the way every command reads a
//! store — the plain-read checks first, LMDB only if they pass, then a full
//! `verify` and entry count. An error is fine; a crash, a hang or an abort
//! is a hole in `pando_store::file_check`. The same routine runs in the
//! store's unit tests on seeded damage (bit flips, zeroed pages,
//! truncations, sector mixes of two versions).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// One directory per process: each input gets a fresh store there.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| pando_store::model_check::scratch_dir("store-file"))
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let _ = pando_store::model_check::read_damaged(dir, data);
});
