//! The store against a model: arbitrary bytes decode to adds, modifies,
//! renames and deletes (alone, several in one job, several jobs in one
//! writer batch, some failing on purpose) applied both to a fresh store and
//! to an in-memory model; then `verify` must find nothing and lookups, DNs,
//! children, attributes and index candidates must match the model. The
//! decoder and the comparison are `pando_store::model_check`, which the
//! store's unit tests also run on seeded inputs.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// One directory per process: each input gets a fresh store there.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| pando_store::model_check::scratch_dir("store-model"))
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let _ = std::fs::remove_dir_all(dir);
    pando_store::model_check::run(dir, data);
    let _ = std::fs::remove_dir_all(dir);
});
