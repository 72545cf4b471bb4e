//! RFC 2849 LDIF reading and writing.
//!
//! The reader is streaming: it holds one record at a time, never the whole
//! file, so it serves the demo-data loader and a multi-million-entry bulk
//! import alike. It reads physical lines with `BufRead::read_until` (a memchr
//! scan, no regex), unfolds them into one reusable buffer per record and only
//! then splits that record into attribute/value pairs, so the steady state
//! allocates nothing but the values it hands out. Wrap the input in a
//! `BufReader::with_capacity` of a megabyte or so for large files.
//!
//! Parse errors carry the physical line number they were found on and do not
//! stop the reader: the bad record has already been consumed, so the next call
//! to `next()` continues with the following record (an import can write a
//! rejects file and go on). I/O errors end the iteration.

mod reader;
mod writer;

pub use reader::{
    ChangeRecord, LdifError, LdifReader, ModKind, ModSpec, ReaderOptions, Record,
    DEFAULT_MAX_RECORD_BYTES,
};
pub use writer::{append_line, needs_base64, write_entry, DEFAULT_WRAP};
