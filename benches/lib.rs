//! Criterion suites live in `benches/`; this library is empty on purpose.
