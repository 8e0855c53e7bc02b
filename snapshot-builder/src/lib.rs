//! `lasthop-snapshot`: the immutable snapshot the edge answers from.
//!
//! A snapshot maps every link (generated code or alias, under its link key: the code on the
//! default domain, `domain/code` on a branded one) that existed at feed sequence `S` to
//! its URL, expiry and serving options (version 4; a link with the defaults stores none),
//! plus the per-region high-water marks at `S` and the id of the key the codes were minted
//! under. The byte layout, and why it is that way, is in `FORMAT.md`.
//!
//! - `format`: versions 1 to 5's constants, header, slots and entries, and the writer's
//!   [`Layout`] choice (pages with their entries inline, or compact);
//! - [`reader`](Snapshot): [`Snapshot::open`] maps a file (the crate's `unsafe` blocks are that
//!   map and the prefetch hint) and checks
//!   the header and every bound; [`Snapshot::lookup`] is O(1) and zero-copy;
//!   [`Snapshot::verify`] checks the checksums; [`Snapshot::audit`] walks every entry;
//! - [`writer`](SnapshotWriter): `SnapshotWriter::create(path, SnapshotMeta::new(seq, key_id,
//!   high_water))`, then `add(key, url, expires_at_ms)` (or `add_with_options`) per link, then
//!   `seal()`: temp file, fsync, rename, fsync the directory. Duplicate keys fail the seal;
//! - [`synth`](Synth): realistic synthetic links for capacity tests;
//! - [`tsv`](parse_line): the `build` command's input lines.
//!
//! ```
//! use lasthop_core::HighWater;
//! use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter};
//!
//! let meta = SnapshotMeta::new(42, 0x1234, HighWater::new(1, 1_000).unwrap());
//! let mut writer = SnapshotWriter::in_memory(meta).unwrap();
//! writer.add(b"abcDEF1", b"https://example.com/", None).unwrap();
//! // A branded domain's link, under its link key `domain/code`.
//! writer.add(b"go.example.com/spring-sale", b"https://example.com/spring", None).unwrap();
//! let (_info, bytes) = writer.seal().unwrap();
//! let snapshot = Snapshot::from_vec(bytes).unwrap();
//! snapshot.verify().unwrap();
//! assert_eq!(snapshot.lookup(b"abcDEF1").unwrap().url(), b"https://example.com/");
//! assert_eq!(snapshot.branded(), 1);
//! assert_eq!(snapshot.lookup(b"spring-sale"), None);
//! ```

mod error;
mod format;
mod legacy;
mod reader;
mod synth;
mod tsv;
mod varint;
mod writer;

pub use error::{BuildError, Section, SnapshotError};
pub use format::{
    Layout, FORMAT_VERSION, MAGIC, MAX_ARENA_LEN, MAX_KEY_LEN, MAX_PAGE_LEN, MAX_REGIONS,
    MAX_URL_LEN, OLDEST_FORMAT_VERSION,
};
pub use reader::{Entry, Probe, Snapshot};
pub use synth::{Synth, SynthLink};
pub use tsv::{parse_line, TsvError, TsvLink};
pub use writer::{FileSink, MemorySink, SealedInfo, Sink, SnapshotMeta, SnapshotWriter};
