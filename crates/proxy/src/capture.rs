//! `pando proxy --read-capture FILE`: LDAP read out of a packet capture
//! (any port; `ldap_port` says which side is the server), printed decoded
//! as the proxy prints what it relays, and recorded for `pando bench
//! --replay` like the proxy's own record. Runs over the file and ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use pando_proto::{frame_length, DecodeLimits, LdapMessage};

use crate::decode_log::DecodeLog;
use crate::frame;
use crate::pcap::{self, Segment, Streams};
use crate::record::Recorder;

type End = (IpAddr, u16);

/// What was read.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    pub segments: usize,
    pub skipped_packets: usize,
    pub connections: usize,
    pub requests: usize,
    pub responses: usize,
    /// Bytes that were not LDAP (a stream resumed after a gap, or another
    /// protocol on the port).
    pub garbage: usize,
    pub gaps: usize,
}

/// A request waiting for its last response: when it was sent, entries and
/// bytes so far.
struct Waiting {
    time: f64,
    entries: u64,
    bytes: u64,
}

struct Reader<'a> {
    port: u16,
    log: Option<&'a DecodeLog>,
    record: Option<&'a Recorder>,
    first: Option<f64>,
    conns: HashMap<(End, End), u64>,
    buffers: HashMap<(End, End), Vec<u8>>,
    waiting: HashMap<(u64, i32), Waiting>,
    summary: Summary,
}

pub fn read(
    path: &Path,
    port: u16,
    log: Option<&DecodeLog>,
    record: Option<&Recorder>,
) -> Result<Summary, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (segments, skipped) =
        pcap::segments(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = Reader {
        port,
        log,
        record,
        first: None,
        conns: HashMap::new(),
        buffers: HashMap::new(),
        waiting: HashMap::new(),
        summary: Summary {
            segments: segments.len(),
            skipped_packets: skipped,
            ..Summary::default()
        },
    };
    let mut streams = Streams::default();
    for s in segments
        .iter()
        .filter(|s| s.src.1 == port || s.dst.1 == port)
    {
        let (bytes, gap) = streams.add(s);
        r.take(s, &bytes, gap);
    }
    r.summary.gaps = streams.gaps;
    r.summary.connections = r.conns.len();
    Ok(r.summary)
}

impl Reader<'_> {
    /// New bytes of one direction: every whole message in them handled.
    fn take(&mut self, s: &Segment, bytes: &[u8], gap: bool) {
        let key = (s.src, s.dst);
        let client_side = if s.dst.1 == self.port {
            key
        } else {
            (s.dst, s.src)
        };
        let next = self.conns.len() as u64 + 1;
        let conn = *self.conns.entry(client_side).or_insert(next);
        let mut buf = self.buffers.remove(&key).unwrap_or_default();
        if gap {
            buf.clear();
        }
        buf.extend_from_slice(bytes);
        let mut used = 0;
        loop {
            match frame_length(&buf[used..], usize::MAX) {
                Ok(Some(n)) => {
                    let frame = buf[used..used + n].to_vec();
                    used += n;
                    self.message(s, conn, &frame);
                }
                Ok(None) => break,
                Err(_) => {
                    self.garbage(s, &buf[used..]);
                    used = buf.len();
                    break;
                }
            }
        }
        buf.drain(..used);
        self.buffers.insert(key, buf);
    }

    fn garbage(&mut self, s: &Segment, bytes: &[u8]) {
        self.summary.garbage += bytes.len();
        if let Some(l) = self.log {
            l.set_time(s.time);
            let who = format!("{}:{} -> {}:{}", s.src.0, s.src.1, s.dst.0, s.dst.1);
            let side = if s.dst.1 == self.port {
                "client"
            } else {
                "server"
            };
            l.garbage(side, &who, bytes);
        }
    }

    fn message(&mut self, s: &Segment, conn: u64, frame: &[u8]) {
        let t0 = *self.first.get_or_insert(s.time);
        if let Some(l) = self.log {
            l.set_time(s.time);
        }
        if s.dst.1 == self.port {
            let Ok(msg) = LdapMessage::decode(frame, &DecodeLimits::default()) else {
                return self.garbage(s, frame);
            };
            self.summary.requests += 1;
            let to = format!("{}:{}", s.dst.0, s.dst.1);
            if let Some(l) = self.log {
                l.request(conn, &msg, &to, frame.len());
            }
            if let Some(r) = self.record {
                r.request_at(s.time - t0, conn, frame, &msg);
            }
            let w = Waiting {
                time: s.time,
                entries: 0,
                bytes: 0,
            };
            self.waiting.insert((conn, msg.id), w);
            return;
        }
        let Some((id, tag, rest)) = frame::split(frame) else {
            return self.garbage(s, frame);
        };
        self.summary.responses += 1;
        let Some(w) = self.waiting.get_mut(&(conn, id)) else {
            return; // its request was not captured (or an unsolicited notice)
        };
        w.bytes += frame.len() as u64;
        if tag == 0x64 {
            w.entries += 1;
        }
        if frame::is_final_response(tag) {
            if let (Some(l), Some(w)) = (self.log, self.waiting.remove(&(conn, id))) {
                let from = format!("{}:{}", s.src.0, s.src.1);
                let ms = (s.time - w.time) * 1000.0;
                l.response_ms(conn, id, &from, rest, ms, w.entries, w.bytes);
            }
        }
    }
}
