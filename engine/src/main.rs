//! `lasthop-engine`: the edge redirect server. Not built yet (issue 4); this binary says so
//! rather than pretending to serve.

fn main() -> std::process::ExitCode {
    eprintln!("lasthop-engine: not implemented yet (see issue 4); nothing is served");
    std::process::ExitCode::from(2)
}
