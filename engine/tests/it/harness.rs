//! What only the engine's own tests need: its binary as cargo built it for them. (Sites,
//! engines as real processes, clients, load and the broker come from `lasthop-testkit`.)

pub const ENGINE: &str = env!("CARGO_BIN_EXE_lasthop-engine");
