//! `lasthop-snapshot`: the immutable snapshot file format (issue 3 fills this crate).
