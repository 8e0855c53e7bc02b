#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lasthop_fuzz::http1(data));
