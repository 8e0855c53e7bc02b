//! Integration tests of `lasthop-snapshot`, in one binary.

/// The checked-in format-version-1 fixture still reads, with exact answers.
mod backwards_compat;
/// Round-trip and corruption properties of random snapshots.
mod properties;
