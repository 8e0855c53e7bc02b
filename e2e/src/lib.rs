//! `lasthop-e2e`: whole-system tests, with no code of its own. The suites are in `tests/it`
//! (`cargo test -p lasthop-e2e --test it`): control planes, engines, the click processor, a
//! Kafka-protocol broker and a browser as real processes on loopback, started through
//! `lasthop-testkit`.
