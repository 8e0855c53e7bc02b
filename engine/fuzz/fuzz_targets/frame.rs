//! Untrusted frames (IPv4 or IPv6), as an AF_XDP socket hands them over, through
//! `wire::parse`; for every frame it accepts, the reset `write_reset` answers with must parse
//! back as a reset going to the sender. Nothing may panic.
#![no_main]

use lasthop_edge::wire::{parse, write_reset, TcpControl, MAX_RESET};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(seg) = parse(data) {
        let mut out = [0u8; MAX_RESET];
        if let Some(n) = write_reset(&seg, &mut out) {
            let reset = parse(&out[..n]).expect("a reset we wrote parses");
            assert_eq!(reset.tcp.control, TcpControl::Rst);
            assert_eq!((reset.src, reset.dst), (seg.dst, seg.src));
            assert_eq!((reset.tcp.src_port, reset.tcp.dst_port), (seg.tcp.dst_port, seg.tcp.src_port));
        }
    }
});
