//! `lasthop-trust`: the trust-and-safety rules, without I/O (the control plane reads files,
//! calls the verdict webhook and writes the store).
//!
//! - [`host`]: canonical hosts (case, trailing dots, percent-encoding, IDN, the IPv4 spellings,
//!   IPv4-mapped IPv6), index keys, registrable domains (Public Suffix List);
//! - [`destination`]: a destination's canonical host and the match key of the whole URL;
//! - [`lists`]: reputation list files (one entry a line, hosts files, URLhaus CSV, PhishTank
//!   CSV, OpenPhish), detected per file, parsed as untrusted bytes;
//! - [`index`]: every loaded list in one in-memory index, checked at creation and diffed on a
//!   reload (the time-bomb defence takes down what a new entry matches);
//! - [`heuristics`]: the scanner's own signals (IP literals, credentials, look-alike IDN hosts,
//!   brands in subdomains, deep subdomains);
//! - [`shorteners`]: other shorteners' domains, refused as destinations (chains);
//! - [`velocity`]: distinct destination domains per owner in a sliding hour.

pub mod destination;
pub mod heuristics;
pub mod host;
pub mod index;
pub mod lists;
pub mod shorteners;
pub mod velocity;

pub use destination::{host_of_key, url_key_hash, Destination};
pub use host::{CanonicalHost, HostError};
pub use index::{Added, Hit, ReputationIndex};
pub use lists::{parse_list, Entry, ListFormat, Malformed, ParsedList};
