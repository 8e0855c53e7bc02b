//! Untrusted UDP payloads on the QUIC listener through `quic::packets`, the long-header walk
//! the engine runs beside quinn-proto: nothing may panic, and the 0-RTT bytes it counts lie
//! within the datagram.
#![no_main]

use lasthop_edge::quic::packets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = packets(data);
    assert!(p.zero_rtt <= data.len());
});
