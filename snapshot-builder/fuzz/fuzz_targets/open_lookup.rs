//! Untrusted snapshot bytes (any format version): open, verify, audit, prefetch and look
//! keys up (short ones and, past 126 bytes, version 3's escaped ones; either may meet version
//! 4's options entries) and read their options. None of it may panic or read out of bounds,
//! whatever the input.
#![no_main]

use lasthop_snapshot::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The last 318 bytes (if any) double as lookup keys, so the fuzzer can steer them too.
    let keys = &data[data.len().saturating_sub(318)..];
    if let Ok(s) = Snapshot::from_bytes(data) {
        let _ = s.verify();
        let _ = s.audit();
        for len in [7usize, 8, 12, 64, 126, 127, 200, 318] {
            if let Some(k) = keys.get(..len) {
                // The hints (a page, a bucket line, an entry's lines) read only
                // what open checked.
                s.prefetch_entry(s.prefetch(k));
                let _ = s.lookup_probe(k, s.probe(k));
                let _ = s
                    .lookup(k)
                    .map(|e| (e.url().len(), e.expires_at_ms(), e.options()));
            }
        }
        let _ = s.lookup(b"abcDEF1");
    }
});
