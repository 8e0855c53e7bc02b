//! Integration tests of `lasthop-snapshot`, in one binary.

/// The checked-in fixtures of format versions 1 to 4 still read, with exact answers.
mod backwards_compat;
/// Round-trip and corruption properties of random snapshots.
mod properties;
