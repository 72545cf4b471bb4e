//! Offline bulk load (`pando import`) and LDIF export (`pando export`).
//!
//! * [`input`]: the raw input (plain, gzip or zstd) cut into chunks of
//!   whole records;
//! * [`import`]: chunks parsed and checked on every core, entries stored in
//!   input order, indexes built by one external sort;
//! * [`export`]: a consistent LDIF dump from one read transaction.

mod export;
mod import;
pub mod input;

pub use export::{export, ExportOptions};
pub use import::{
    import, password_schemes, ImportError, ImportOptions, ImportReport, Progress, Reject,
    SchemeCount,
};

use pando_store::Store;

/// Meta key present while an import runs; its presence means "incomplete".
pub const META_IMPORTING: &str = "import_in_progress";

/// Fail if a previous import did not finish.
pub fn check_complete(store: &Store) -> Result<(), String> {
    let r = store.read().map_err(|e| e.to_string())?;
    if r.view()
        .meta_get(META_IMPORTING)
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Err(format!(
            "the store in {} is incomplete: an import was interrupted. Import again into an empty data directory, or restore a backup",
            store.path().display()
        ));
    }
    Ok(())
}
