//! Integration tests of `lasthop-snapshot`, in one binary.

/// The checked-in fixtures of format versions 1, 2 and 3 still read, with exact answers.
mod backwards_compat;
/// Round-trip and corruption properties of random snapshots.
mod properties;
