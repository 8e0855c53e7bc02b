//! Frames of the kernel-bypass path (engine/DESIGN.md, "The AF_XDP path"): what arrives on an
//! AF_XDP socket is a whole Ethernet frame, so the engine parses and writes the link, network
//! and transport headers itself. This module reads one Ethernet II frame carrying IPv4 or IPv6
//! and TCP, checking every length against the bytes that arrived and the checksums in software
//! (veth and most AF_XDP copy-mode paths offer no offload), and writes the reply a passive side
//! sends without a connection: the reset of RFC 9293 §3.10.7.1.
//!
//! IPv6 is taken only with TCP as the fixed header's next header: a segment behind extension
//! headers (hop-by-hop options, routing, a fragment) is refused, as the XDP program leaves such
//! packets to the kernel. IPv6 has no header checksum; the TCP checksum covers the addresses
//! through its pseudo-header (RFC 8200 §8.1).
//!
//! The header codecs are smoltcp's `wire` module (the maintained stack's own parser); this
//! module adds the policy: which frames are ours, what a reset answers, and errors that say why
//! a frame was dropped. Garbage is an `Err`, never a panic (`parse_never_panics` below).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
    Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpPacket,
};
/// The TCP header's representation, smoltcp's: what [`Segment::tcp`] holds and
/// [`write_frame`] writes.
pub use smoltcp::wire::{TcpControl, TcpRepr, TcpSeqNumber};

/// Bytes of an Ethernet II header (no VLAN tag: tagged frames are not ours).
pub const ETHERNET_HEADER: usize = 14;
/// Bytes of an IPv4 header without options, as we write it.
pub const IPV4_HEADER: usize = 20;
/// Bytes of the IPv6 fixed header (we write no extension headers).
pub const IPV6_HEADER: usize = 40;
/// Bytes of a TCP header without options, as a reset is written.
pub const TCP_HEADER: usize = 20;
/// The time to live (IPv6: hop limit) of what we send: Linux's default
/// (`net.ipv4.ip_default_ttl`, `net.ipv6.conf.*.hop_limit`).
pub const TTL: u8 = 64;
/// Bytes of the largest reset [`write_reset`] writes (IPv6).
pub const MAX_RESET: usize = ETHERNET_HEADER + IPV6_HEADER + TCP_HEADER;

/// The bytes of the IP header we write for `addr`'s family.
pub fn ip_header(addr: IpAddr) -> usize {
    match addr {
        IpAddr::V4(_) => IPV4_HEADER,
        IpAddr::V6(_) => IPV6_HEADER,
    }
}

/// Why a frame is not a TCP segment we can act on. The XDP program passes everything but TCP
/// to our address and port to the kernel, so outside tests these count malformed or forged
/// frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("the frame is shorter than an Ethernet header")]
    ShortEthernet,
    #[error("the frame carries neither IPv4 nor IPv6 (ARP, a VLAN tag)")]
    NotIp,
    #[error("the IPv4 header is malformed or longer than the frame")]
    BadIpv4,
    #[error("the IPv4 header checksum is wrong")]
    Ipv4Checksum,
    #[error("the IPv6 header is malformed or its payload longer than the frame")]
    BadIpv6,
    #[error("the packet is a fragment")]
    Fragment,
    #[error("the packet does not carry TCP (on IPv6: as its first next header)")]
    NotTcp,
    #[error("the TCP segment is malformed (lengths, ports, flags or options)")]
    BadTcp,
    #[error("the TCP checksum is wrong")]
    TcpChecksum,
    #[error("the segment is for another address or port")]
    NotOurs,
}

/// One TCP segment, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    pub eth_src: [u8; 6],
    pub eth_dst: [u8; 6],
    /// Both of one family: the frame's EtherType said which.
    pub src: IpAddr,
    pub dst: IpAddr,
    pub tcp: TcpRepr<'a>,
}

impl Segment<'_> {
    /// The segment's length in sequence space (payload, plus one each for SYN and FIN).
    pub fn seq_len(&self) -> usize {
        self.tcp.payload.len() + self.tcp.control.len()
    }
}

/// Parses an Ethernet II frame carrying an IPv4 or IPv6 TCP segment, checking lengths and the
/// checksums. Ethernet padding past the IP packet's length is ignored.
pub fn parse(frame: &[u8]) -> Result<Segment<'_>, FrameError> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| FrameError::ShortEthernet)?;
    let (eth_src, eth_dst) = (eth.src_addr().0, eth.dst_addr().0);
    let (src, dst, payload) = match eth.ethertype() {
        EthernetProtocol::Ipv4 => ipv4(frame)?,
        EthernetProtocol::Ipv6 => ipv6(frame)?,
        _ => return Err(FrameError::NotIp),
    };
    let tcp = TcpPacket::new_checked(payload).map_err(|_| FrameError::BadTcp)?;
    let (src_ip, dst_ip) = (IpAddress::from(src), IpAddress::from(dst));
    if !tcp.verify_checksum(&src_ip, &dst_ip) {
        return Err(FrameError::TcpChecksum);
    }
    let caps = ChecksumCapabilities::ignored();
    let tcp = TcpRepr::parse(&tcp, &src_ip, &dst_ip, &caps).map_err(|_| FrameError::BadTcp)?;
    Ok(Segment {
        eth_src,
        eth_dst,
        src,
        dst,
        tcp,
    })
}

/// An IPv4 packet's addresses and TCP bytes (a slice of the frame itself, stopping at the
/// total length, so padding never reaches the TCP parser).
fn ipv4(frame: &[u8]) -> Result<(IpAddr, IpAddr, &[u8]), FrameError> {
    let ip = Ipv4Packet::new_checked(&frame[ETHERNET_HEADER..]).map_err(|_| FrameError::BadIpv4)?;
    if ip.version() != 4 {
        return Err(FrameError::BadIpv4);
    }
    if !ip.verify_checksum() {
        return Err(FrameError::Ipv4Checksum);
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Err(FrameError::Fragment);
    }
    if ip.next_header() != IpProtocol::Tcp {
        return Err(FrameError::NotTcp);
    }
    let start = ETHERNET_HEADER + usize::from(ip.header_len());
    let end = ETHERNET_HEADER + usize::from(ip.total_len());
    Ok((
        ip.src_addr().into(),
        ip.dst_addr().into(),
        &frame[start..end],
    ))
}

/// An IPv6 packet's addresses and TCP bytes, TCP being its first next header.
fn ipv6(frame: &[u8]) -> Result<(IpAddr, IpAddr, &[u8]), FrameError> {
    let ip = Ipv6Packet::new_checked(&frame[ETHERNET_HEADER..]).map_err(|_| FrameError::BadIpv6)?;
    if ip.version() != 6 {
        return Err(FrameError::BadIpv6);
    }
    match ip.next_header() {
        IpProtocol::Tcp => {}
        IpProtocol::Ipv6Frag => return Err(FrameError::Fragment),
        _ => return Err(FrameError::NotTcp),
    }
    let start = ETHERNET_HEADER + IPV6_HEADER;
    let end = start + usize::from(ip.payload_len());
    Ok((
        ip.src_addr().into(),
        ip.dst_addr().into(),
        &frame[start..end],
    ))
}

/// The TCP destination port of an Ethernet II frame that seems to carry TCP over IPv4 or IPv6,
/// read without checking anything else: which of a core's endpoints (plain or HTTPS) a frame
/// goes to, before that endpoint's [`parse`] checks it whole. `None` for anything shorter or of
/// another kind.
#[inline]
pub fn dst_port(frame: &[u8]) -> Option<u16> {
    let at = match frame.get(12..14)? {
        [0x08, 0x00] if *frame.get(ETHERNET_HEADER + 9)? == 6 => {
            ETHERNET_HEADER + usize::from(frame.get(ETHERNET_HEADER)? & 0x0f) * 4 + 2
        }
        [0x86, 0xdd] if *frame.get(ETHERNET_HEADER + 6)? == 6 => ETHERNET_HEADER + IPV6_HEADER + 2,
        _ => return None,
    };
    let port = frame.get(at..at + 2)?;
    Some(u16::from_be_bytes([port[0], port[1]]))
}

/// The reset that answers `seg` when no connection owns it (RFC 9293 §3.10.7.1): a segment
/// with ACK gets `<SEQ=SEG.ACK><CTL=RST>`, one without gets `<SEQ=0><ACK=SEG.SEQ+SEG.LEN>
/// <CTL=RST,ACK>`. Written into `out` as a whole frame back to the sender (addresses swapped);
/// returns its length, or `None` for a segment that is itself a reset or to or from a
/// non-unicast address (never answered), or an `out` too short for the 54 bytes (74 on IPv6).
pub fn write_reset(seg: &Segment<'_>, out: &mut [u8]) -> Option<usize> {
    if seg.tcp.control == TcpControl::Rst || !unicast(seg.src) || !unicast(seg.dst) {
        return None;
    }
    let (seq, ack) = match seg.tcp.ack_number {
        Some(ack) => (ack, None),
        None => (TcpSeqNumber(0), Some(seg.tcp.seq_number + seg.seq_len())),
    };
    let reply = TcpRepr {
        src_port: seg.tcp.dst_port,
        dst_port: seg.tcp.src_port,
        control: TcpControl::Rst,
        seq_number: seq,
        ack_number: ack,
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    write_frame(seg.eth_dst, seg.eth_src, seg.dst, seg.src, &reply, out)
}

/// An address a TCP segment may come from or go to: not broadcast, multicast or unspecified
/// (RFC 1122 §4.2.3.10 and RFC 9293 §3.9.1: such segments are dropped, never answered).
pub fn unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => !(a.is_broadcast() || a.is_multicast() || a.is_unspecified()),
        IpAddr::V6(a) => !(a.is_multicast() || a.is_unspecified()),
    }
}

/// Writes one whole frame: Ethernet II, an IP header (IPv4 without options, DF set, TTL 64; or
/// the IPv6 fixed header, hop limit 64, flow label 0) and `tcp`, the checksums computed.
/// Returns the frame's length, or `None` if `out` is too short or the addresses are of two
/// families.
pub fn write_frame(
    eth_src: [u8; 6],
    eth_dst: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    tcp: &TcpRepr<'_>,
    out: &mut [u8],
) -> Option<usize> {
    let tcp_len = tcp.buffer_len();
    let ip_len = ip_header(src);
    let len = ETHERNET_HEADER + ip_len + tcp_len;
    if out.len() < len || ip_len + tcp_len > usize::from(u16::MAX) {
        return None;
    }
    let out = &mut out[..len];
    let ethertype = match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            write_ipv4(src, dst, tcp_len, &mut out[ETHERNET_HEADER..]);
            EthernetProtocol::Ipv4
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            write_ipv6(src, dst, tcp_len, &mut out[ETHERNET_HEADER..]);
            EthernetProtocol::Ipv6
        }
        _ => return None,
    };
    let mut eth = EthernetFrame::new_unchecked(&mut *out);
    EthernetRepr {
        src_addr: EthernetAddress(eth_src),
        dst_addr: EthernetAddress(eth_dst),
        ethertype,
    }
    .emit(&mut eth);
    let mut packet = TcpPacket::new_unchecked(&mut out[ETHERNET_HEADER + ip_len..]);
    tcp.emit(
        &mut packet,
        &IpAddress::from(src),
        &IpAddress::from(dst),
        &ChecksumCapabilities::default(),
    );
    Some(len)
}

/// The IPv4 header of a `tcp_len`-byte segment, checksummed, at the start of `out`.
fn write_ipv4(src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize, out: &mut [u8]) {
    let mut ip = Ipv4Packet::new_unchecked(out);
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len: tcp_len,
        hop_limit: TTL,
    }
    .emit(&mut ip, &ChecksumCapabilities::default());
    // Path MTU discovery: the kernel sets DF on TCP too. The checksum covers the flags.
    ip.set_dont_frag(true);
    ip.fill_checksum();
}

/// The IPv6 fixed header of a `tcp_len`-byte segment at the start of `out` (IPv6 never
/// fragments on the way, so there is nothing like DF to set).
fn write_ipv6(src: Ipv6Addr, dst: Ipv6Addr, tcp_len: usize, out: &mut [u8]) {
    let mut ip = Ipv6Packet::new_unchecked(out);
    Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len: tcp_len,
        hop_limit: TTL,
    }
    .emit(&mut ip);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
    const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
    const SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    // The IPv6 benchmarking prefix (RFC 5180).
    const CLIENT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2));
    const SERVER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1));

    fn segment(control: TcpControl, ack: Option<u32>, payload: &[u8]) -> TcpRepr<'_> {
        TcpRepr {
            src_port: 40000,
            dst_port: 8080,
            control,
            seq_number: TcpSeqNumber(1000),
            ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
            window_len: 64240,
            window_scale: Some(7),
            max_seg_size: Some(1460),
            sack_permitted: true,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        }
    }

    fn frame(tcp: &TcpRepr<'_>) -> Vec<u8> {
        let mut out = vec![0u8; 1600];
        let n = write_frame(CLIENT_MAC, SERVER_MAC, CLIENT, SERVER, tcp, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn a_syn_parses_with_its_options() {
        let bytes = frame(&segment(TcpControl::Syn, None, &[]));
        let seg = parse(&bytes).unwrap();
        assert_eq!((seg.src, seg.dst), (CLIENT, SERVER));
        assert_eq!((seg.eth_src, seg.eth_dst), (CLIENT_MAC, SERVER_MAC));
        assert_eq!((seg.tcp.src_port, seg.tcp.dst_port), (40000, 8080));
        assert_eq!(seg.tcp.control, TcpControl::Syn);
        assert_eq!(seg.tcp.max_seg_size, Some(1460));
        assert_eq!(seg.tcp.window_scale, Some(7));
        assert_eq!(seg.seq_len(), 1);
    }

    #[test]
    fn a_syn_is_reset_with_ack_of_its_sequence_plus_one() {
        let bytes = frame(&segment(TcpControl::Syn, None, &[]));
        let seg = parse(&bytes).unwrap();
        let mut out = [0u8; 64];
        let n = write_reset(&seg, &mut out).unwrap();
        assert_eq!(n, ETHERNET_HEADER + IPV4_HEADER + TCP_HEADER);
        // The reply parses (so both checksums are right) and goes back where the SYN came from.
        let rst = parse(&out[..n]).unwrap();
        assert_eq!((rst.eth_src, rst.eth_dst), (SERVER_MAC, CLIENT_MAC));
        assert_eq!((rst.src, rst.dst), (SERVER, CLIENT));
        assert_eq!((rst.tcp.src_port, rst.tcp.dst_port), (8080, 40000));
        assert_eq!(rst.tcp.control, TcpControl::Rst);
        assert_eq!(rst.tcp.seq_number, TcpSeqNumber(0));
        assert_eq!(rst.tcp.ack_number, Some(TcpSeqNumber(1001)));
    }

    #[test]
    fn a_segment_with_ack_is_reset_at_that_ack_and_data_counts_in_sequence_space() {
        let bytes = frame(&segment(
            TcpControl::Psh,
            Some(5000),
            b"GET / HTTP/1.1\r\n\r\n",
        ));
        let seg = parse(&bytes).unwrap();
        assert_eq!(seg.seq_len(), 18);
        let mut out = [0u8; 64];
        let n = write_reset(&seg, &mut out).unwrap();
        let rst = parse(&out[..n]).unwrap().tcp;
        assert_eq!(rst.seq_number, TcpSeqNumber(5000));
        assert_eq!(rst.ack_number, None);

        let bytes = frame(&segment(TcpControl::Fin, None, b"ab"));
        let seg = parse(&bytes).unwrap();
        let n = write_reset(&seg, &mut out).unwrap();
        let rst = parse(&out[..n]).unwrap().tcp;
        assert_eq!(
            rst.ack_number,
            Some(TcpSeqNumber(1003)),
            "2 bytes and the FIN"
        );
    }

    #[test]
    fn a_reset_is_never_answered_and_a_short_buffer_is_refused() {
        let bytes = frame(&segment(TcpControl::Rst, None, &[]));
        let seg = parse(&bytes).unwrap();
        assert_eq!(write_reset(&seg, &mut [0u8; 64]), None);
        let bytes = frame(&segment(TcpControl::Syn, None, &[]));
        assert_eq!(write_reset(&parse(&bytes).unwrap(), &mut [0u8; 53]), None);
    }

    #[test]
    fn segments_to_or_from_broadcast_or_multicast_are_never_answered() {
        for (src, dst) in [
            (Ipv4Addr::BROADCAST.into(), SERVER),
            (Ipv4Addr::new(224, 0, 0, 1).into(), SERVER),
            (Ipv4Addr::UNSPECIFIED.into(), SERVER),
            (CLIENT, Ipv4Addr::new(239, 1, 2, 3).into()),
            (Ipv6Addr::UNSPECIFIED.into(), SERVER6),
            ("ff02::1".parse().unwrap(), SERVER6),
            (CLIENT6, "ff05::2".parse::<IpAddr>().unwrap()),
        ] {
            let mut bytes = vec![0u8; 128];
            let syn = segment(TcpControl::Syn, None, &[]);
            let n = write_frame(CLIENT_MAC, SERVER_MAC, src, dst, &syn, &mut bytes).unwrap();
            let seg = parse(&bytes[..n]).unwrap();
            assert_eq!(write_reset(&seg, &mut [0u8; 64]), None, "{src} -> {dst}");
        }
    }

    #[test]
    fn padding_past_the_ip_length_is_ignored() {
        let mut bytes = frame(&segment(TcpControl::None, Some(1), b"x"));
        bytes.extend_from_slice(&[0xee; 16]);
        assert_eq!(parse(&bytes).unwrap().tcp.payload, b"x");
    }

    #[test]
    fn each_refusal_says_why() {
        let good = frame(&segment(TcpControl::Syn, None, &[]));
        assert_eq!(parse(&good[..10]), Err(FrameError::ShortEthernet));
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse(&arp), Err(FrameError::NotIp));
        assert_eq!(parse(&good[..30]), Err(FrameError::BadIpv4));
        let mut bad = good.clone();
        bad[14 + 8] ^= 1; // TTL: the header checksum no longer matches
        assert_eq!(parse(&bad), Err(FrameError::Ipv4Checksum));
        let mut bad = good.clone();
        bad[14 + 40] ^= 1; // a byte of the TCP options
        assert_eq!(parse(&bad), Err(FrameError::TcpChecksum));
        let mut frag = good.clone();
        frag[14 + 6] |= 0x20; // more fragments
        refill_ip_checksum(&mut frag);
        assert_eq!(parse(&frag), Err(FrameError::Fragment));
        let mut udp = good.clone();
        udp[14 + 9] = 17;
        refill_ip_checksum(&mut udp);
        assert_eq!(parse(&udp), Err(FrameError::NotTcp));
        let mut short = good.clone();
        short[14 + 32] = 0x10; // TCP data offset 1 word: shorter than a header
        assert_eq!(parse(&short), Err(FrameError::BadTcp));
    }

    fn frame6(tcp: &TcpRepr<'_>) -> Vec<u8> {
        let mut out = vec![0u8; 1600];
        let n = write_frame(CLIENT_MAC, SERVER_MAC, CLIENT6, SERVER6, tcp, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn an_ipv6_syn_parses_and_is_reset_back_to_its_sender() {
        let bytes = frame6(&segment(TcpControl::Syn, None, &[]));
        assert_eq!(&bytes[12..14], [0x86, 0xdd]);
        assert_eq!(bytes[ETHERNET_HEADER] >> 4, 6, "version");
        assert_eq!(bytes[ETHERNET_HEADER + 7], TTL, "hop limit");
        let seg = parse(&bytes).unwrap();
        assert_eq!((seg.src, seg.dst), (CLIENT6, SERVER6));
        assert_eq!(seg.tcp.max_seg_size, Some(1460));
        assert_eq!(dst_port(&bytes), Some(8080));
        let mut out = [0u8; MAX_RESET];
        let n = write_reset(&seg, &mut out).unwrap();
        assert_eq!(n, ETHERNET_HEADER + IPV6_HEADER + TCP_HEADER);
        assert_eq!(write_reset(&seg, &mut out[..n - 1]), None, "a short buffer");
        let rst = parse(&out[..n]).unwrap();
        assert_eq!((rst.src, rst.dst), (SERVER6, CLIENT6));
        assert_eq!((rst.eth_src, rst.eth_dst), (SERVER_MAC, CLIENT_MAC));
        assert_eq!(rst.tcp.control, TcpControl::Rst);
        assert_eq!(rst.tcp.ack_number, Some(TcpSeqNumber(1001)));
    }

    #[test]
    fn each_ipv6_refusal_says_why() {
        let good = frame6(&segment(TcpControl::Psh, Some(9), b"GET /"));
        assert!(parse(&good).is_ok());
        assert_eq!(
            parse(&good[..ETHERNET_HEADER + 39]),
            Err(FrameError::BadIpv6)
        );
        let mut v4 = good.clone();
        v4[ETHERNET_HEADER] = 0x40; // version 4 under the IPv6 EtherType
        assert_eq!(parse(&v4), Err(FrameError::BadIpv6));
        let mut long = good.clone();
        long[ETHERNET_HEADER + 5] += 1; // a payload length past the frame's end
        assert_eq!(parse(&long), Err(FrameError::BadIpv6));
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1; // a byte of the payload
        assert_eq!(parse(&bad), Err(FrameError::TcpChecksum));
        let mut moved = good.clone();
        moved[ETHERNET_HEADER + 8 + 15] ^= 1; // the source address, under the pseudo-header
        assert_eq!(parse(&moved), Err(FrameError::TcpChecksum));
        let mut frag = good.clone();
        frag[ETHERNET_HEADER + 6] = 44; // a fragment header first
        assert_eq!(parse(&frag), Err(FrameError::Fragment));
        let mut hop = good.clone();
        hop[ETHERNET_HEADER + 6] = 0; // hop-by-hop options first
        assert_eq!(parse(&hop), Err(FrameError::NotTcp));
        assert_eq!(dst_port(&hop), None);
        let mut padded = good.clone();
        padded.extend_from_slice(&[0xee; 16]);
        assert_eq!(parse(&padded).unwrap().tcp.payload, b"GET /");
    }

    #[test]
    fn a_frame_of_two_families_is_not_written() {
        let syn = segment(TcpControl::Syn, None, &[]);
        let mut out = [0u8; 128];
        assert_eq!(
            write_frame(CLIENT_MAC, SERVER_MAC, CLIENT, SERVER6, &syn, &mut out),
            None
        );
        assert_eq!(
            write_frame(CLIENT_MAC, SERVER_MAC, CLIENT6, SERVER, &syn, &mut out),
            None
        );
    }

    fn refill_ip_checksum(frame: &mut [u8]) {
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[ETHERNET_HEADER..]);
        ip.fill_checksum();
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&bytes);
            let _ = dst_port(&bytes);
        }

        /// The unchecked port peek agrees with the whole parse on every frame the parse takes.
        #[test]
        fn dst_port_is_the_parsed_port(
            dport in 1u16.., at in 0usize..100, byte in any::<u8>(), mutate in any::<bool>(),
            v6 in any::<bool>(),
        ) {
            let mut tcp = segment(TcpControl::Syn, None, b"");
            tcp.dst_port = dport;
            let mut bytes = if v6 { frame6(&tcp) } else { frame(&tcp) };
            prop_assert_eq!(dst_port(&bytes), Some(dport));
            if mutate && at < bytes.len() {
                bytes[at] = byte;
            }
            if let Ok(seg) = parse(&bytes) {
                prop_assert_eq!(dst_port(&bytes), Some(seg.tcp.dst_port));
            }
        }

        #[test]
        fn parse_never_panics_on_mutated_segments(
            at in 0usize..100, byte in any::<u8>(), cut in 0usize..110,
            payload in proptest::collection::vec(any::<u8>(), 0..20), v6 in any::<bool>(),
        ) {
            let tcp = segment(TcpControl::Psh, Some(7), &payload);
            let mut bytes = if v6 { frame6(&tcp) } else { frame(&tcp) };
            if at < bytes.len() {
                bytes[at] = byte;
            }
            bytes.truncate(cut.max(1).min(bytes.len()));
            if let Ok(seg) = parse(&bytes) {
                let mut out = [0u8; MAX_RESET];
                if let Some(n) = write_reset(&seg, &mut out) {
                    prop_assert!(parse(&out[..n]).is_ok());
                }
            }
        }

        #[test]
        fn every_written_segment_parses_back(
            sport in 1u16.., dport in 1u16.., seq in any::<i32>(), ack in any::<Option<i32>>(),
            window in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let tcp = TcpRepr {
                src_port: sport, dst_port: dport, control: TcpControl::None,
                seq_number: TcpSeqNumber(seq), ack_number: ack.map(TcpSeqNumber),
                window_len: window, window_scale: None, max_seg_size: None,
                sack_permitted: false, sack_ranges: [None; 3], timestamp: None, payload: &payload,
            };
            let bytes = frame(&tcp);
            let seg = parse(&bytes).unwrap();
            prop_assert_eq!(seg.tcp, tcp);
        }
    }
}
