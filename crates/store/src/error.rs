//! The store's errors: what callers are told when LMDB, the disk or the
//! data refuse (each names the problem; `ENOSPC` becomes `DiskFull`).

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The memory map (and so the database file) reached its configured size.
    MapFull,
    /// The filesystem holding the database has no space left.
    DiskFull,
    /// A record failed its checks: the store is damaged.
    Corrupt(String),
    /// The store was written by an incompatible version of Pando.
    Format(String),
    /// The data file's structure is damaged (or it is not a Pando store):
    /// found before LMDB was given it.
    Damaged(String),
    /// Any other LMDB or I/O failure.
    Lmdb(String),
    /// The writer thread is gone (server shutting down).
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MapFull => f.write_str("database map is full"),
            Self::DiskFull => f.write_str("no space left on the device holding the database"),
            Self::Corrupt(s) => write!(f, "store corruption: {s}"),
            Self::Format(s) => write!(f, "store format: {s}"),
            Self::Damaged(s) => write!(f, "damaged store: {s}"),
            Self::Lmdb(s) => write!(f, "storage error: {s}"),
            Self::Closed => f.write_str("store is closed"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<heed::Error> for StoreError {
    fn from(e: heed::Error) -> Self {
        match e {
            heed::Error::Mdb(heed::MdbError::MapFull) => StoreError::MapFull,
            heed::Error::Mdb(heed::MdbError::Other(ENOSPC)) => StoreError::DiskFull,
            heed::Error::Io(e) if e.raw_os_error() == Some(ENOSPC) => StoreError::DiskFull,
            other => StoreError::Lmdb(other.to_string()),
        }
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(ENOSPC) {
            return StoreError::DiskFull;
        }
        StoreError::Lmdb(e.to_string())
    }
}

/// errno for "no space left on device" (Linux).
pub(crate) const ENOSPC: i32 = 28;
