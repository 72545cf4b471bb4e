//! Packet captures (pcap and pcapng, as tcpdump and Wireshark write them)
//! read into TCP byte streams: each packet's link, IP (v4 or v6) and TCP
//! headers taken off, each direction of each connection put back in
//! sequence order. Everything read comes from a file someone captured:
//! every length is checked, and what cannot be read is skipped and
//! counted, never trusted.
//!
//! ```text
//! pcap:   header 24 bytes (magic a1b2c3d4 µs or a1b23c4d ns, either byte
//!         order; link type at 20), then per packet: seconds, fraction,
//!         captured length, original length (4 bytes each), the bytes
//! pcapng: blocks of type, length, body, length; section header 0a0d0d0a
//!         (byte-order magic 1a2b3c4d), interface description 1 (link type),
//!         enhanced packet 6 (interface, time high, time low, captured
//!         length, original length, bytes), simple packet 3
//! ```

use std::collections::HashMap;
use std::net::IpAddr;

/// One TCP segment's payload, with when and where it went.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Seconds since 1970.
    pub time: f64,
    pub src: (IpAddr, u16),
    pub dst: (IpAddr, u16),
    pub seq: u32,
    pub syn: bool,
    pub payload: Vec<u8>,
}

/// Every TCP segment of a capture, in file order, and how many packets
/// were skipped (not TCP over IP, or cut short).
pub fn segments(data: &[u8]) -> Result<(Vec<Segment>, usize), String> {
    let magic = data
        .get(..4)
        .ok_or("not a capture: shorter than a header")?;
    let mut out = Vec::new();
    let mut skipped = 0;
    let mut push = |time: f64, link: u32, bytes: &[u8]| match tcp_of(link, bytes) {
        Some(mut s) => {
            s.time = time;
            out.push(s);
        }
        None => skipped += 1,
    };
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => pcapng(data, &mut push)?,
        _ => pcap(data, &mut push)?,
    }
    Ok((out, skipped))
}

fn u16_at(d: &[u8], at: usize, le: bool) -> Option<u16> {
    let b: [u8; 2] = d.get(at..at + 2)?.try_into().ok()?;
    Some(if le {
        u16::from_le_bytes(b)
    } else {
        u16::from_be_bytes(b)
    })
}

fn u32_at(d: &[u8], at: usize, le: bool) -> Option<u32> {
    let b: [u8; 4] = d.get(at..at + 4)?.try_into().ok()?;
    Some(if le {
        u32::from_le_bytes(b)
    } else {
        u32::from_be_bytes(b)
    })
}

fn pcap(data: &[u8], push: &mut impl FnMut(f64, u32, &[u8])) -> Result<(), String> {
    let (le, nanos) = match data.get(..4) {
        Some([0xd4, 0xc3, 0xb2, 0xa1]) => (true, false),
        Some([0xa1, 0xb2, 0xc3, 0xd4]) => (false, false),
        Some([0x4d, 0x3c, 0xb2, 0xa1]) => (true, true),
        Some([0xa1, 0xb2, 0x3c, 0x4d]) => (false, true),
        _ => return Err("not a pcap or pcapng capture (unknown magic number)".into()),
    };
    let link = u32_at(data, 20, le).ok_or("pcap header cut short")? & 0xffff;
    let mut at = 24;
    while at + 16 <= data.len() {
        let (Some(sec), Some(frac), Some(len)) = (
            u32_at(data, at, le),
            u32_at(data, at + 4, le),
            u32_at(data, at + 8, le),
        ) else {
            break;
        };
        let start = at + 16;
        let Some(bytes) = data.get(start..start + len as usize) else {
            break; // the last packet cut short
        };
        let scale = if nanos { 1e-9 } else { 1e-6 };
        push(f64::from(sec) + f64::from(frac) * scale, link, bytes);
        at = start + len as usize;
    }
    Ok(())
}

fn pcapng(data: &[u8], push: &mut impl FnMut(f64, u32, &[u8])) -> Result<(), String> {
    let mut le = true;
    let mut links: Vec<u32> = Vec::new();
    let mut at = 0;
    while at + 12 <= data.len() {
        if data[at..at + 4] == [0x0a, 0x0d, 0x0d, 0x0a] {
            le = match data.get(at + 8..at + 12) {
                Some([0x4d, 0x3c, 0x2b, 0x1a]) => true,
                Some([0x1a, 0x2b, 0x3c, 0x4d]) => false,
                _ => return Err("pcapng section header without its byte-order magic".into()),
            };
            links.clear();
        }
        let kind = u32_at(data, at, le).unwrap_or(0);
        let len = u32_at(data, at + 4, le).unwrap_or(0) as usize;
        if len < 12 || at + len > data.len() {
            break;
        }
        let body = &data[at + 8..at + len - 4];
        match kind {
            1 => links.push(u32::from(u16_at(body, 0, le).unwrap_or(0))),
            6 => enhanced(body, le, &links, push),
            3 => {
                let link = links.first().copied().unwrap_or(1);
                if let (Some(n), Some(rest)) = (u32_at(body, 0, le), body.get(4..)) {
                    push(0.0, link, rest.get(..n as usize).unwrap_or(rest));
                }
            }
            _ => {}
        }
        at += len;
    }
    Ok(())
}

/// An enhanced packet block (times in microseconds: the default
/// resolution, which tcpdump writes).
fn enhanced(body: &[u8], le: bool, links: &[u32], push: &mut impl FnMut(f64, u32, &[u8])) {
    let (Some(iface), Some(hi), Some(lo), Some(n)) = (
        u32_at(body, 0, le),
        u32_at(body, 4, le),
        u32_at(body, 8, le),
        u32_at(body, 12, le),
    ) else {
        return;
    };
    let Some(bytes) = body.get(20..20 + n as usize) else {
        return;
    };
    let micros = (u64::from(hi) << 32) | u64::from(lo);
    let link = links.get(iface as usize).copied().unwrap_or(1);
    push(micros as f64 / 1e6, link, bytes);
}

/// The TCP segment inside one packet of link type `link`: Ethernet (1),
/// BSD loopback (0), raw IP (101, 12, 14), Linux cooked (113, 276).
fn tcp_of(link: u32, p: &[u8]) -> Option<Segment> {
    let (ethertype, ip) = match link {
        1 => {
            let mut at = 12;
            let mut t = u16_at(p, at, false)?;
            while t == 0x8100 || t == 0x88a8 {
                at += 4;
                t = u16_at(p, at, false)?;
            }
            (t, p.get(at + 2..)?)
        }
        0 => {
            let family = u32_at(p, 0, true)?;
            (if family == 2 { 0x0800 } else { 0x86dd }, p.get(4..)?)
        }
        101 | 12 | 14 => (if p.first()? >> 4 == 6 { 0x86dd } else { 0x0800 }, p),
        113 => (u16_at(p, 14, false)?, p.get(16..)?),
        276 => (u16_at(p, 0, false)?, p.get(20..)?),
        _ => return None,
    };
    let (src, dst, tcp) = match ethertype {
        0x0800 => ipv4(ip)?,
        0x86dd => ipv6(ip)?,
        _ => return None,
    };
    let off = usize::from(tcp.get(12)? >> 4) * 4;
    Some(Segment {
        time: 0.0,
        src: (src, u16_at(tcp, 0, false)?),
        dst: (dst, u16_at(tcp, 2, false)?),
        seq: u32_at(tcp, 4, false)?,
        syn: tcp.get(13)? & 0x02 != 0,
        payload: tcp.get(off..)?.to_vec(),
    })
}

fn ipv4(ip: &[u8]) -> Option<(IpAddr, IpAddr, &[u8])> {
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    let total = usize::from(u16_at(ip, 2, false)?);
    if *ip.get(9)? != 6 || ihl < 20 {
        return None;
    }
    let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
    let end = total.min(ip.len());
    Some((src.into(), dst.into(), ip.get(ihl..end)?))
}

fn ipv6(ip: &[u8]) -> Option<(IpAddr, IpAddr, &[u8])> {
    if *ip.get(6)? != 6 {
        return None; // extension headers: not followed
    }
    let len = usize::from(u16_at(ip, 4, false)?);
    let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
    let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
    let end = (40 + len).min(ip.len());
    Some((src.into(), dst.into(), ip.get(40..end)?))
}

/// Each direction of each connection, its bytes put back in order:
/// segments seen again are dropped, a gap (bytes never captured) starts
/// the stream afresh at the segment after it (its messages are then read
/// as they come; `gaps` counts them).
/// One direction of a connection: (from, to), each (address, port).
type Direction = ((IpAddr, u16), (IpAddr, u16));

#[derive(Default)]
pub struct Streams {
    next: HashMap<Direction, u32>,
    pub gaps: usize,
}

impl Streams {
    /// The new bytes `s` adds to its direction's stream (empty when none);
    /// `true` when a gap came before them.
    pub fn add(&mut self, s: &Segment) -> (Vec<u8>, bool) {
        let key = (s.src, s.dst);
        let start = if s.syn { s.seq.wrapping_add(1) } else { s.seq };
        let expected = *self.next.entry(key).or_insert(start);
        let len = s.payload.len() as u32;
        let ahead = start.wrapping_sub(expected);
        if s.payload.is_empty() {
            return (Vec::new(), false);
        }
        if ahead == 0 {
            self.next.insert(key, expected.wrapping_add(len));
            return (s.payload.clone(), false);
        }
        if ahead < 1 << 31 {
            // Past what was expected: bytes missing before these.
            self.gaps += 1;
            self.next.insert(key, start.wrapping_add(len));
            return (s.payload.clone(), true);
        }
        // Behind: a retransmission; only what is new is kept.
        let seen = expected.wrapping_sub(start);
        if seen >= len {
            return (Vec::new(), false);
        }
        self.next.insert(key, start.wrapping_add(len));
        (s.payload[seen as usize..].to_vec(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv4/TCP packet from 127.0.0.1:`sport` to :`dport`.
    fn packet(sport: u16, dport: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 14];
        p[12] = 0x08;
        let total = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&ip);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[12] = 5 << 4;
        p.extend_from_slice(&tcp);
        p.extend_from_slice(payload);
        p
    }

    fn capture(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut f = vec![
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0, 0,
        ];
        for (i, p) in packets.iter().enumerate() {
            for v in [i as u32 + 100, 500_000, p.len() as u32, p.len() as u32] {
                f.extend_from_slice(&v.to_le_bytes());
            }
            f.extend_from_slice(p);
        }
        f
    }

    #[test]
    fn segments_come_out_of_a_pcap_and_streams_are_put_in_order() {
        let data = capture(&[
            packet(5000, 389, 10, b"abc"),
            packet(5000, 389, 13, b"def"),
            packet(5000, 389, 10, b"abcdef"), // seen again
            packet(5000, 389, 16, b"gh"),
            packet(5000, 389, 30, b"zz"), // after a gap
            vec![1, 2, 3],                // not a packet
        ]);
        let (segs, skipped) = segments(&data).unwrap();
        assert_eq!((segs.len(), skipped), (5, 1));
        assert_eq!(segs[0].time, 100.5);
        assert_eq!(segs[0].dst.1, 389);
        let mut st = Streams::default();
        let got: Vec<(Vec<u8>, bool)> = segs.iter().map(|s| st.add(s)).collect();
        let bytes: Vec<u8> = got.iter().flat_map(|(b, _)| b.clone()).collect();
        assert_eq!(bytes, b"abcdefghzz");
        assert_eq!(st.gaps, 1);
        assert!(got[4].1);
        // A capture cut inside its last packet reads what is whole.
        let mut cut = data.clone();
        cut.truncate(data.len() - 20);
        assert!(segments(&cut).unwrap().0.len() >= 4);
        assert!(segments(b"nope").is_err() && segments(b"").is_err());
    }

    #[test]
    fn a_pcapng_is_read_too() {
        let block = |kind: u32, body: &[u8]| {
            let len = (12 + body.len()) as u32;
            let mut b = kind.to_le_bytes().to_vec();
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(body);
            b.extend_from_slice(&len.to_le_bytes());
            b
        };
        let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut data = block(0x0a0d_0d0a, &shb);
        data.extend(block(1, &[1, 0, 0, 0, 0, 0, 0, 0]));
        let pkt = packet(40000, 3389, 7, b"hello");
        let micros: u64 = 1_700_000_000_250_000;
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((micros >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(micros as u32).to_le_bytes());
        epb.extend_from_slice(&(pkt.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(pkt.len() as u32).to_le_bytes());
        epb.extend_from_slice(&pkt);
        while !epb.len().is_multiple_of(4) {
            epb.push(0);
        }
        data.extend(block(6, &epb));
        let (segs, skipped) = segments(&data).unwrap();
        assert_eq!((segs.len(), skipped), (1, 0));
        assert_eq!(segs[0].payload, b"hello");
        assert_eq!(segs[0].dst.1, 3389);
        assert!((segs[0].time - 1_700_000_000.25).abs() < 1e-6);
    }

    #[test]
    fn any_bytes_are_read_without_panicking() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let base = capture(&[packet(1, 389, 1, b"0123456789")]);
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut d = base.clone();
            let i = (x as usize) % d.len();
            d[i] = (x >> 40) as u8;
            d.truncate(((x >> 20) as usize) % (d.len() + 1));
            if let Ok((segs, _)) = segments(&d) {
                let mut st = Streams::default();
                for s in &segs {
                    let _ = st.add(s);
                }
            }
        }
    }
}
