#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lasthop_fuzz::click_event(data));
