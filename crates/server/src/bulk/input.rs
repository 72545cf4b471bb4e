//! Import input: decompression by magic number and cutting into chunks of
//! whole LDIF records for the parsing threads.

use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The compression an input starting with `head` is in, by its magic
/// number: "gzip", "zstd" or "plain".
fn format_of(head: &[u8]) -> &'static str {
    if head.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else {
        "plain"
    }
}

/// Wrap `raw` in a gzip or zstd decoder when it starts with one of their
/// magic numbers; otherwise read it as it is.
pub fn decompressing(
    raw: Box<dyn Read + Send>,
) -> io::Result<(Box<dyn Read + Send>, &'static str)> {
    let mut r = BufReader::with_capacity(1 << 20, raw);
    let format = format_of(r.fill_buf()?);
    let out: Box<dyn Read + Send> = match format {
        "gzip" => Box::new(flate2::read::MultiGzDecoder::new(r)),
        "zstd" => Box::new(zstd::stream::read::Decoder::with_buffer(r)?),
        _ => Box::new(r),
    };
    Ok((out, format))
}

/// Counts the bytes read from the underlying file (before decompression),
/// so progress and ETA relate to the file's size.
pub struct Counted<R> {
    pub inner: R,
    pub bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A piece of the input made of whole records.
pub enum Chunk {
    Records {
        seq: u64,
        /// Physical lines before the chunk's first byte.
        lines_before: u64,
        bytes: Vec<u8>,
    },
    /// A record at `line` has no end within the size limit; it was skipped.
    TooLarge { seq: u64, line: u64 },
}

/// Where the last complete record of `buf` ends: just after the last blank
/// line (`\n\n` or `\n\r\n`). None when `buf` holds no blank line.
fn last_boundary(buf: &[u8]) -> Option<usize> {
    let mut i = buf.len();
    while i > 1 {
        i -= 1;
        if buf[i] != b'\n' {
            continue;
        }
        if buf[i - 1] == b'\n' || (i > 1 && buf[i - 1] == b'\r' && buf[i - 2] == b'\n') {
            return Some(i + 1);
        }
    }
    None
}

/// Where the first record of `buf` ends (just after the first blank line).
fn first_boundary(buf: &[u8]) -> Option<usize> {
    (1..buf.len()).find_map(|i| {
        let blank = buf[i] == b'\n'
            && (buf[i - 1] == b'\n' || (i > 1 && buf[i - 1] == b'\r' && buf[i - 2] == b'\n'));
        blank.then_some(i + 1)
    })
}

fn count_lines(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

/// Read `input` to its end, handing out chunks of about `chunk` bytes cut at
/// record boundaries. A record longer than `max_record` has no boundary in
/// reach: it is reported as [`Chunk::TooLarge`] and skipped. Stops early
/// (Ok) when `send` returns false.
pub fn cut(
    input: &mut dyn Read,
    chunk: usize,
    max_record: usize,
    send: &mut dyn FnMut(Chunk) -> bool,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(chunk * 2);
    let mut lines_before = 0u64;
    let mut seq = 0u64;
    // Inside an oversized record: drop bytes up to the next boundary.
    let mut skipping = false;
    loop {
        let old = buf.len();
        buf.resize(old + chunk, 0);
        let mut filled = old;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let eof = filled < buf.len();
        buf.truncate(filled);
        if skipping {
            match first_boundary(&buf).or(if eof { Some(buf.len()) } else { None }) {
                Some(end) => {
                    lines_before += count_lines(&buf[..end]);
                    buf.drain(..end);
                    skipping = false;
                }
                None => {
                    // Keep the last two bytes: they may begin a boundary.
                    let keep = buf.len().saturating_sub(2);
                    lines_before += count_lines(&buf[..keep]);
                    buf.drain(..keep);
                    continue;
                }
            }
        }
        let end = if eof {
            Some(buf.len())
        } else {
            last_boundary(&buf)
        };
        match end {
            Some(end) if end > 0 => {
                let rest = buf.split_off(end);
                let lines = count_lines(&buf);
                let bytes = std::mem::replace(&mut buf, rest);
                if !send(Chunk::Records {
                    seq,
                    lines_before,
                    bytes,
                }) {
                    return Ok(());
                }
                seq += 1;
                lines_before += lines;
                buf.reserve(chunk);
            }
            _ if buf.len() > max_record + chunk => {
                // First line of the oversized record: skip leading blank lines.
                let lead = buf
                    .iter()
                    .take_while(|&&c| c == b'\n' || c == b'\r')
                    .filter(|&&c| c == b'\n')
                    .count() as u64;
                if !send(Chunk::TooLarge {
                    seq,
                    line: lines_before + lead + 1,
                }) {
                    return Ok(());
                }
                seq += 1;
                skipping = true;
            }
            _ => {}
        }
        if eof {
            return Ok(());
        }
    }
}

/// Whole records from `pieces` places spread evenly over the plain LDIF
/// file at `path`, about `bytes` of them from each: what a compression
/// dictionary is trained on, so that it fits the whole file and not only
/// its first entries (the first users of a large file have shorter
/// numbers in their names, and a dictionary trained on them alone
/// compresses the rest 7% worse). Empty when the file is compressed (its
/// records cannot be reached at an offset) or holds no more than the
/// pieces would read, or is no regular file.
pub fn spread(path: &std::path::Path, pieces: usize, bytes: usize) -> io::Result<Vec<Vec<u8>>> {
    use std::io::{Seek, SeekFrom};
    // A pipe or a device is read once, by the import.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Ok(Vec::new());
    }
    let mut file = std::fs::File::open(path)?;
    let len = meta.len();
    let mut head = Vec::with_capacity(4);
    (&mut file).take(4).read_to_end(&mut head)?;
    if format_of(&head) != "plain" || len <= (pieces * bytes) as u64 {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(pieces);
    for k in 0..pieces as u64 {
        let at = len / pieces as u64 * k;
        file.seek(SeekFrom::Start(at))?;
        let mut buf = Vec::with_capacity(bytes);
        (&mut file).take(bytes as u64).read_to_end(&mut buf)?;
        // A piece starts after a blank line (but the file's first), and
        // ends with one: whole records only.
        let start = if at == 0 {
            Some(0)
        } else {
            first_boundary(&buf)
        };
        if let (Some(start), Some(end)) = (start, last_boundary(&buf)) {
            if start < end {
                out.push(buf[start..end].to_vec());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(input: &[u8], chunk: usize, max: usize) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        cut(&mut &input[..], chunk, max, &mut |c| {
            match c {
                Chunk::Records {
                    lines_before,
                    bytes,
                    ..
                } => out.push((lines_before, String::from_utf8(bytes).unwrap())),
                Chunk::TooLarge { line, .. } => out.push((line, "TOO LARGE".into())),
            }
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn cuts_only_between_records() {
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!("dn: cn=e{i},dc=x\ncn: e{i}\n long folded\n\n"));
        }
        let got = chunks(text.as_bytes(), 100, 1000);
        assert!(got.len() > 10);
        let joined: String = got.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(joined, text);
        for (lines_before, s) in &got {
            assert!(s.starts_with("dn: "), "{s:?}");
            assert_eq!(lines_before % 4, 0);
        }
    }

    #[test]
    fn crlf_boundaries_and_no_final_newline() {
        let text = "dn: a=1\r\n\r\ndn: a=2\r\n\r\ndn: a=3";
        let got = chunks(text.as_bytes(), 8, 100);
        let joined: String = got.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(joined, text);
    }

    #[test]
    fn oversized_record_is_reported_and_skipped() {
        let big = "x".repeat(5000);
        let text = format!("dn: a=1\n\ndn: a=2\ndescription: {big}\n\ndn: a=3\n\n");
        let got = chunks(text.as_bytes(), 64, 1000);
        assert!(
            got.iter().any(|(l, s)| s == "TOO LARGE" && *l == 3),
            "{got:?}"
        );
        let joined: String = got
            .iter()
            .filter(|(_, s)| s != "TOO LARGE")
            .map(|(_, s)| s.as_str())
            .collect();
        assert!(joined.contains("dn: a=1") && joined.contains("dn: a=3"));
        assert!(!joined.contains("a=2"));
        // Line numbers after the skipped record are still right.
        let last = got.iter().find(|(_, s)| s.contains("a=3")).unwrap();
        assert!(last.1.starts_with("dn: a=3"), "{last:?}");
        assert_eq!(last.0, 5);
    }

    #[test]
    fn spread_pieces_hold_whole_records_from_all_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.ldif");
        let mut text = String::new();
        for i in 0..5_000 {
            text.push_str(&format!("dn: cn=e{i},dc=x\ncn: e{i}\n long folded\n\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let pieces = spread(&path, 10, 500).unwrap();
        assert_eq!(pieces.len(), 10);
        for (k, p) in pieces.iter().enumerate() {
            let p = std::str::from_utf8(p).unwrap();
            assert!(p.starts_with("dn: cn=e"), "{p:?}");
            assert!(p.ends_with(" long folded\n\n"), "{p:?}");
            // Evenly spread: piece k is the first whole records at or
            // after a tenth k of the file.
            let at = text.len() / 10 * k;
            let start = if k == 0 {
                0
            } else {
                at + text[at..].find("\n\n").unwrap() + 2
            };
            assert!(text[start..].starts_with(p), "piece {k}");
            assert!(p.len() > 400, "piece {k}: {}", p.len());
        }
        // A file no larger than the pieces, or compressed, gives none.
        assert!(spread(&path, 10, text.len() / 10).unwrap().is_empty());
        let gz = dir.path().join("in.ldif.gz");
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut z, text.as_bytes()).unwrap();
        std::fs::write(&gz, z.finish().unwrap()).unwrap();
        assert!(spread(&gz, 10, 50).unwrap().is_empty());
    }
}
