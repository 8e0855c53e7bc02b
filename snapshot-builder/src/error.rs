//! Why a snapshot could not be opened, verified or built.

use std::path::PathBuf;

/// The part of a file a checksum covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The header, region marks included.
    Header,
    /// The URL arena.
    Arena,
    /// The hash index.
    Index,
    /// Version 5's legacy set.
    Legacy,
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Section::Header => "header",
            Section::Legacy => "legacy set",
            Section::Arena => "arena",
            Section::Index => "index",
        })
    }
}

/// A snapshot that cannot be read, or does not check out. Every malformed input ends here;
/// nothing in the reader panics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("opening snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("snapshot is {len} bytes, shorter than the {need} its header needs")]
    TooShort { len: u64, need: u64 },
    #[error("not a lasthop snapshot (bad magic)")]
    BadMagic,
    #[error(
        "snapshot format version {found} is not supported (this reader reads 1 to {supported})"
    )]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("snapshot is {actual} bytes but its header records {recorded}")]
    FileLength { recorded: u64, actual: u64 },
    #[error("snapshot header field {field} = {value} is invalid: {why}")]
    BadField {
        field: &'static str,
        value: u64,
        why: &'static str,
    },
    #[error(
        "snapshot {section} checksum mismatch: stored {stored:#018x}, computed {computed:#018x}"
    )]
    Checksum {
        section: Section,
        stored: u64,
        computed: u64,
    },
    #[error("snapshot structure is inconsistent at entry offset {offset}: {why}")]
    Structure { offset: u64, why: &'static str },
}

/// Why a snapshot could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("writing snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "key {key:?} is not a link key: a generated code (7 base62 characters) or an alias (8-64 bytes), alone or after a lower-case domain and a slash (domain/code)"
    )]
    BadKey { key: String },
    #[error("key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("options of key {key:?} are invalid: {why}")]
    BadOptions { key: String, why: String },
    #[error("URL of {len} bytes is longer than the format's {max}")]
    UrlTooLong { len: usize, max: usize },
    #[error("the snapshot would exceed the format's limit: {what}")]
    TooLarge { what: &'static str },
    #[error("{regions} regions is more than the format's {max}")]
    TooManyRegions { regions: u32, max: u32 },
}

impl BuildError {
    pub(crate) fn key(key: &[u8]) -> String {
        String::from_utf8_lossy(key).into_owned()
    }
}
