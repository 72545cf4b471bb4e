//! How a store is opened: indexes, memory map, durability, compression.

use super::*;

/// One configured index: attribute name (canonical, lowercase) and kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSpec {
    pub attr: String,
    pub kinds: Vec<IndexKind>,
}

/// Memory for index keys while an index is (re)built from id2entry.
pub const REBUILD_MEMORY: usize = 256 << 20;

/// zstd level used unless configured: fast to write, most of the gain.
pub const DEFAULT_COMPRESSION_LEVEL: i32 = 3;

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Size of the memory map in bytes (upper bound of the database file).
    pub map_size: usize,
    pub indexes: Vec<IndexSpec>,
    /// Most operations applied in one write transaction.
    pub max_batch: usize,
    pub durability: Durability,
    /// zstd level for stored entries; None stores them plain.
    pub compression: Option<i32>,
    /// Check every page of the data file when opening it for writing (not
    /// only the paths read at open): about 0.4 s per 170 MB here.
    pub check_all_pages: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            map_size: DEFAULT_MAP_SIZE,
            indexes: Vec::new(),
            max_batch: 256,
            durability: Durability::Durable,
            compression: Some(DEFAULT_COMPRESSION_LEVEL),
            check_all_pages: true,
        }
    }
}
