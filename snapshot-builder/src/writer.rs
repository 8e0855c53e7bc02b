//! The typestate writer: `SnapshotWriter::create` → `add`… → `seal` → an immutable file, in
//! format version 5.
//!
//! Entries stream to a staging area as they are added (memory, and for a file writer past
//! 256 MiB an unlinked temporary file beside the destination); the writer keeps 16 bytes per
//! link in memory besides (the key's hash, and where and how long its staged entry is). `seal` sorts those by
//! hash, which is also home-page order, so the pages are written one by one (the bucket line,
//! then the entries that fit, copied from the staging area) without the file ever being held
//! whole; the entries that did not fit follow as the overflow. Then it writes the header over
//! the placeholder at the front, fsyncs, renames into place and fsyncs the directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use lasthop_core::{classify_key, split_key, CodeKind, HighWater, LinkOptions};
use xxhash_rust::xxh3::Xxh3;

use crate::error::BuildError;
use crate::format::{
    align_up, encode_entry_head, entry_key, hash, header_len_for, home_bucket, section_checksum,
    slot_word, tag, Header, Layout, BUCKET_LEN, CONTINUES, ENTRY_HEAD_MAX, FORMAT_VERSION,
    INDEX_ALIGN, KEY_HEAD_MAX, MAX_ARENA_LEN, MAX_KEY_LEN, MAX_REGIONS, MAX_URL_LEN,
    SLOTS_PER_BUCKET,
};

/// What a snapshot is about, fixed when the writer is created.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SnapshotMeta {
    /// Feed sequence the snapshot is complete up to.
    pub sequence: u64,
    /// Id of the permutation key the codes were minted under.
    pub key_id: u32,
    /// Per-region high-water marks at `sequence`.
    pub high_water: HighWater,
    /// Seed of the index hash; `None` draws a random one (the default: aliases are chosen by
    /// users, and a seed they cannot predict keeps them from crafting long probe chains).
    pub hash_seed: Option<u64>,
    /// How pages are laid out: [`Layout::Compact`] (the default) or [`Layout::Paged`].
    pub layout: Layout,
}

impl SnapshotMeta {
    /// Meta with a random hash seed.
    pub fn new(sequence: u64, key_id: u32, high_water: HighWater) -> Self {
        SnapshotMeta {
            sequence,
            key_id,
            high_water,
            hash_seed: None,
            layout: Layout::default(),
        }
    }

    /// The page layout: memory against a hit's memory accesses.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// A fixed hash seed: byte-for-byte reproducible builds (fixtures, tests).
    pub fn with_hash_seed(mut self, seed: u64) -> Self {
        self.hash_seed = Some(seed);
        self
    }
}

/// What `seal` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SealedInfo {
    /// Final path, for file writers.
    pub path: Option<PathBuf>,
    pub file_len: u64,
    pub links: u64,
    /// Keys whose code is an alias, on any domain.
    pub aliases: u64,
    /// Keys with a domain (`domain/code`).
    pub branded: u64,
    pub expiring: u64,
    /// Links with options of their own (options entries; the header does not count them).
    pub with_options: u64,
    pub url_bytes: u64,
    /// Distinct keys in the legacy set (version 5; 0: the file has none).
    pub legacy_keys: u64,
    pub home_buckets: u64,
    pub total_buckets: u64,
    pub max_probe: u32,
    pub hash_seed: u64,
    /// Bytes per page: the bucket line and its inline entries.
    pub page_len: u32,
    /// Entries stored in the page that holds their slot (the rest are in the overflow).
    pub inline: u64,
}

impl SealedInfo {
    /// Bytes per link beyond the URL bytes themselves (header, index, keys, lengths, expiries).
    pub fn overhead_per_link(&self) -> f64 {
        (self.file_len - self.url_bytes) as f64 / self.links.max(1) as f64
    }
}

mod private {
    pub trait Sealed {}
}

/// Where a writer's bytes go: a file ([`FileSink`]) or memory ([`MemorySink`]). Sealed.
pub trait Sink: private::Sealed {
    /// What `seal` hands back.
    type Output;
    #[doc(hidden)]
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    #[doc(hidden)]
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    #[doc(hidden)]
    fn finish(self, info: SealedInfo) -> io::Result<Self::Output>;
    #[doc(hidden)]
    fn path(&self) -> PathBuf;
    #[doc(hidden)]
    fn staging(&self) -> io::Result<Staging>;
}

/// Where added entries wait for `seal` to place them: memory, and for a file writer past
/// [`STAGE_IN_MEMORY`] bytes a temporary file beside the destination, unlinked as soon as it is
/// created (so nothing is left behind however the writer ends) and read back with `pread`.
#[doc(hidden)]
#[derive(Debug)]
pub enum Staging {
    /// `spill`: where to move once `limit` bytes are staged (`None`: never, the in-memory
    /// writer).
    Memory {
        bytes: Vec<u8>,
        spill: Option<PathBuf>,
        limit: usize,
    },
    File(BufWriter<File>),
}

/// Staged bytes a file writer keeps in memory before it moves them to a file: a snapshot of up
/// to about 2M links is placed from memory (fast), a larger one from a file (its memory stays
/// 16 bytes a link, however large the URLs).
const STAGE_IN_MEMORY: usize = 256 << 20;

impl Staging {
    /// Memory only, never spilled (the in-memory writer's).
    fn in_memory() -> Staging {
        Staging::Memory {
            bytes: Vec::new(),
            spill: None,
            limit: usize::MAX,
        }
    }

    fn append(&mut self, more: &[u8]) -> io::Result<()> {
        match self {
            Staging::Memory {
                bytes,
                spill,
                limit,
            } => {
                if let Some(path) = spill
                    .as_deref()
                    .filter(|_| bytes.len() + more.len() > *limit)
                {
                    let file = OpenOptions::new()
                        .write(true)
                        .read(true)
                        .create_new(true)
                        .open(path)?;
                    fs::remove_file(path)?;
                    let mut file = BufWriter::with_capacity(1 << 20, file);
                    file.write_all(bytes)?;
                    file.write_all(more)?;
                    *self = Staging::File(file);
                } else {
                    bytes.extend_from_slice(more);
                }
                Ok(())
            }
            Staging::File(f) => f.write_all(more),
        }
    }

    /// Everything staged, readable at random.
    fn finish(self) -> io::Result<Staged> {
        match self {
            Staging::Memory { bytes, .. } => Ok(Staged::Memory(bytes)),
            Staging::File(f) => Ok(Staged::File(f.into_inner().map_err(|e| e.into_error())?)),
        }
    }
}

/// The staging area once adding is over.
enum Staged {
    Memory(Vec<u8>),
    File(File),
}

impl Staged {
    /// Fills `dst` from staged offset `at`.
    fn read(&self, at: usize, dst: &mut [u8]) -> io::Result<()> {
        match self {
            Staged::Memory(v) => {
                let src = v
                    .get(at..at + dst.len())
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                dst.copy_from_slice(src);
                Ok(())
            }
            Staged::File(f) => f.read_exact_at(dst, at as u64),
        }
    }
}

/// A temporary file beside the destination, renamed into place by `seal`; removed if the
/// writer is dropped unsealed.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    temp: PathBuf,
    file: BufWriter<File>,
    done: bool,
}

impl FileSink {
    fn create(path: &Path) -> io::Result<FileSink> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp.{}.{nanos}", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&temp)?;
        Ok(FileSink {
            path: path.to_path_buf(),
            temp,
            file: BufWriter::with_capacity(1 << 20, file),
            done: false,
        })
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

impl private::Sealed for FileSink {}

impl Sink for FileSink {
    type Output = SealedInfo;

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().write_all_at(bytes, offset)
    }

    fn finish(mut self, mut info: SealedInfo) -> io::Result<SealedInfo> {
        self.file.flush()?;
        self.file.get_ref().sync_all()?;
        fs::rename(&self.temp, &self.path)?;
        self.done = true;
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
        info.path = Some(self.path.clone());
        Ok(info)
    }

    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn staging(&self) -> io::Result<Staging> {
        let mut name = self.temp.clone().into_os_string();
        name.push(".staging");
        Ok(Staging::Memory {
            bytes: Vec::new(),
            spill: Some(PathBuf::from(name)),
            limit: STAGE_IN_MEMORY,
        })
    }
}

/// An in-memory snapshot (tests, fuzzing, shipping bytes elsewhere).
#[derive(Debug, Default)]
pub struct MemorySink {
    bytes: Vec<u8>,
}

impl private::Sealed for MemorySink {}

impl Sink for MemorySink {
    type Output = (SealedInfo, Vec<u8>);

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let dst = usize::try_from(offset)
            .ok()
            .and_then(|o| self.bytes.get_mut(o..o + bytes.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "write past the end"))?;
        dst.copy_from_slice(bytes);
        Ok(())
    }

    fn finish(self, info: SealedInfo) -> io::Result<(SealedInfo, Vec<u8>)> {
        Ok((info, self.bytes))
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("<memory>")
    }

    fn staging(&self) -> io::Result<Staging> {
        Ok(Staging::in_memory())
    }
}

/// The error for an I/O failure on the snapshot at `path`.
fn io_err(path: &Path) -> impl Fn(io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One added key: its hash, and where its entry starts in the staging area and how long it is.
/// 16 bytes per link is all the writer holds in memory.
#[derive(Debug, Clone, Copy)]
struct Pending {
    hash: u64,
    /// Bits 0–39 staged offset, 40–62 entry length (under 2^22), 63 "placed in the overflow".
    staged: u64,
}

const STAGED_LEN_SHIFT: u32 = 40;
const IN_OVERFLOW: u64 = 1 << 63;

impl Pending {
    fn new(hash: u64, offset: u64, len: usize) -> Pending {
        Pending {
            hash,
            staged: offset | ((len as u64) << STAGED_LEN_SHIFT),
        }
    }

    /// The staged entry's byte range.
    fn range(&self) -> std::ops::Range<usize> {
        let start = (self.staged & crate::format::OFFSET_MASK) as usize;
        let len = ((self.staged & !IN_OVERFLOW) >> STAGED_LEN_SHIFT) as usize;
        start..start + len
    }

    fn in_overflow(&self) -> bool {
        self.staged & IN_OVERFLOW != 0
    }
}

/// Gives each key (sorted by hash, so by home page) a slot: bucket by bucket, each takes the
/// next pending keys whose home is at or before it, up to 8, and spills the rest forward
/// (spill buckets after the last home bucket, so probing never wraps). `page` gets each
/// bucket's number, its keys in slot order and whether keys homed at or before it follow (the
/// continues bit). Returns the bucket count and the longest probe.
fn assign_slots(
    pending: &mut [Pending],
    home_buckets: u64,
    mut page: impl FnMut(u64, &mut [Pending], bool) -> Result<(), BuildError>,
) -> Result<(u64, u64), BuildError> {
    let home_of = |p: &Pending| home_bucket(p.hash, home_buckets);
    let (mut next, mut bucket_no, mut max_probe) = (0usize, 0u64, 0u64);
    while bucket_no < home_buckets || next < pending.len() {
        let start = next;
        while next - start < SLOTS_PER_BUCKET
            && pending.get(next).is_some_and(|p| home_of(p) <= bucket_no)
        {
            max_probe = max_probe.max(bucket_no - home_of(&pending[next]));
            next += 1;
        }
        let continues = next - start == SLOTS_PER_BUCKET
            && pending.get(next).is_some_and(|p| home_of(p) <= bucket_no);
        page(bucket_no, &mut pending[start..next], continues)?;
        bucket_no += 1;
    }
    Ok((bucket_no, max_probe))
}

/// Builds one snapshot. Create it, [`add`](SnapshotWriter::add) every link once (any order),
/// then [`seal`](SnapshotWriter::seal), which consumes it: a sealed snapshot cannot be added
/// to, and an unsealed file writer leaves nothing behind.
pub struct SnapshotWriter<S: Sink = FileSink> {
    sink: S,
    meta: SnapshotMeta,
    seed: u64,
    header_len: u64,
    staging: Staging,
    staged_len: u64,
    /// An `add` failed to stage its entry: `seal` refuses.
    failed: bool,
    pending: Vec<Pending>,
    aliases: u64,
    branded: u64,
    expiring: u64,
    with_options: u64,
    url_bytes: u64,
    /// The legacy set's key hashes ([`SnapshotWriter::add_legacy`]; repeats allowed).
    legacy: Vec<u64>,
}

impl<S: Sink> std::fmt::Debug for SnapshotWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("path", &self.sink.path())
            .field("sequence", &self.meta.sequence)
            .field("links", &self.pending.len())
            .field("staged_len", &self.staged_len)
            .finish_non_exhaustive()
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

impl SnapshotWriter<FileSink> {
    /// A writer that will seal into `path` (through a temporary file in the same directory).
    pub fn create(path: impl AsRef<Path>, meta: SnapshotMeta) -> Result<Self, BuildError> {
        let path = path.as_ref();
        let sink = FileSink::create(path).map_err(io_err(path))?;
        SnapshotWriter::with_sink(sink, meta)
    }
}

impl SnapshotWriter<MemorySink> {
    /// A writer whose `seal` returns the snapshot's bytes.
    pub fn in_memory(meta: SnapshotMeta) -> Result<Self, BuildError> {
        SnapshotWriter::with_sink(MemorySink::default(), meta)
    }
}

impl<S: Sink> SnapshotWriter<S> {
    fn with_sink(mut sink: S, meta: SnapshotMeta) -> Result<Self, BuildError> {
        let regions = meta.high_water.regions();
        if regions > MAX_REGIONS {
            return Err(BuildError::TooManyRegions {
                regions,
                max: MAX_REGIONS,
            });
        }
        let header_len = header_len_for(regions);
        let path = sink.path();
        let io = io_err(&path);
        // Placeholder; `seal` writes the real header here once the counts are known.
        sink.append(&vec![0u8; header_len]).map_err(&io)?;
        let staging = sink.staging().map_err(io)?;
        Ok(SnapshotWriter {
            sink,
            seed: meta.hash_seed.unwrap_or_else(random_seed),
            meta,
            header_len: header_len as u64,
            staging,
            staged_len: 0,
            failed: false,
            pending: Vec::new(),
            aliases: 0,
            branded: 0,
            expiring: 0,
            with_options: 0,
            url_bytes: 0,
            legacy: Vec::new(),
        })
    }

    /// Reserves room for `links` more links (avoids the `Vec` doubling past the need).
    pub fn reserve(&mut self, links: usize) {
        self.pending.reserve_exact(links);
    }

    fn io(&self, source: io::Error) -> BuildError {
        io_err(&self.sink.path())(source)
    }

    /// Adds one link, with the default options. `key` is its link key
    /// ([`lasthop_core::link_key`]): a generated code (7 base62 characters) or an alias (8–64
    /// bytes) on the default domain, or `domain/code` on a branded domain (at most
    /// [`MAX_KEY_LEN`] bytes in all); `url` is stored byte for byte (empty is allowed: how a
    /// caller may record a deleted link that keeps its code). Duplicate keys are reported by
    /// `seal`.
    pub fn add(
        &mut self,
        key: &[u8],
        url: &[u8],
        expires_at_ms: Option<i64>,
    ) -> Result<(), BuildError> {
        self.stage(key, url, expires_at_ms, None)
    }

    /// [`SnapshotWriter::add`] for a link with `options`: options other than the defaults
    /// make an options entry (version 4: 7 bytes more than a plain entry of a short key, 6 of
    /// a long one; [`Layout::link_cost_with_options`]); the defaults, the plain entry `add`
    /// writes, byte for byte. Options that do not validate are refused.
    pub fn add_with_options(
        &mut self,
        key: &[u8],
        url: &[u8],
        expires_at_ms: Option<i64>,
        options: LinkOptions,
    ) -> Result<(), BuildError> {
        if options.is_default() {
            return self.stage(key, url, expires_at_ms, None);
        }
        let word = options.pack().ok_or_else(|| BuildError::BadOptions {
            key: BuildError::key(key),
            why: options
                .validate()
                .err()
                .map_or_else(|| "options do not pack".to_string(), |e| e.to_string()),
        })?;
        self.stage(key, url, expires_at_ms, Some(word))
    }

    /// Stages one entry; `options`, an options entry's packed word.
    fn stage(
        &mut self,
        key: &[u8],
        url: &[u8],
        expires_at_ms: Option<i64>,
        options: Option<u32>,
    ) -> Result<(), BuildError> {
        let alias = match classify_key(key) {
            // classify_key bounds the domain and the code, so the key too; checked again here
            // because the entry head has room for MAX_KEY_LEN bytes and no more.
            _ if key.len() > MAX_KEY_LEN => None,
            CodeKind::Generated => Some(false),
            CodeKind::Alias => Some(true),
            // A legacy code is a name, as an alias is (version 5), and in the legacy set.
            CodeKind::Legacy => Some(true),
            CodeKind::Invalid => None,
        };
        let Some(alias) = alias else {
            return Err(BuildError::BadKey {
                key: BuildError::key(key),
            });
        };
        let branded = split_key(key).0.is_some();
        if url.len() > MAX_URL_LEN {
            return Err(BuildError::UrlTooLong {
                len: url.len(),
                max: MAX_URL_LEN,
            });
        }
        let mut head = [0u8; ENTRY_HEAD_MAX];
        let n = encode_entry_head(key, url.len(), expires_at_ms, options, &mut head);
        let head = head.get(..n).unwrap_or(&[]);
        let offset = self.staged_len;
        let end = offset + (n + url.len()) as u64;
        // Slot offsets are 40 bits, and the pages come before the overflow: entries past
        // 1 TiB could never be addressed.
        if end > crate::format::OFFSET_MASK {
            return Err(BuildError::TooLarge {
                what: "entries over 1 TiB",
            });
        }
        // A failure between the two appends would leave a head staged that no record points
        // at, and every later offset wrong: such a writer refuses to seal.
        if let Err(e) = self
            .staging
            .append(head)
            .and_then(|()| self.staging.append(url))
        {
            self.failed = true;
            return Err(self.io(e));
        }
        self.staged_len = end;
        self.pending
            .push(Pending::new(hash(key, self.seed), offset, n + url.len()));
        self.aliases += u64::from(alias);
        if alias && classify_key(key) == CodeKind::Legacy {
            self.legacy.push(crate::legacy::key_hash(key, self.seed));
        }
        self.branded += u64::from(branded);
        self.expiring += u64::from(expires_at_ms.is_some());
        self.with_options += u64::from(options.is_some());
        self.url_bytes += url.len() as u64;
        Ok(())
    }

    /// Adds `key` to the legacy set (version 5) without an entry: every legacy key of the
    /// record goes in, hot or not, so an engine asks its origin about the cold ones and 404s
    /// every other key of that shape without a lookup. A legacy code's shape (an entry with
    /// one is added by `add` itself), or a claimed 7-character code (a generated code's shape
    /// whose counter is above its region's mark: only the caller knows it is claimed).
    pub fn add_legacy(&mut self, key: &[u8]) -> Result<(), BuildError> {
        match classify_key(key) {
            CodeKind::Legacy | CodeKind::Generated => {
                self.legacy.push(crate::legacy::key_hash(key, self.seed));
                Ok(())
            }
            CodeKind::Alias | CodeKind::Invalid => Err(BuildError::BadKey {
                key: BuildError::key(key),
            }),
        }
    }

    /// Raises region `region`'s high-water mark (marks never go down) before sealing, for
    /// callers that learn the marks from the links themselves (the TSV `build`).
    pub fn raise_high_water(
        &mut self,
        region: u32,
        mark: u64,
    ) -> Result<(), lasthop_core::RegionError> {
        self.meta.high_water.raise(region, mark)
    }

    /// Links added so far.
    pub fn len(&self) -> u64 {
        self.pending.len() as u64
    }

    /// True before the first `add`.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Sorts by hash and rejects duplicate keys: equal keys have equal hashes, so they end up
    /// adjacent; only runs of equal 64-bit hashes (rare) are read back and compared.
    fn sort_and_check_duplicates(
        pending: &mut [Pending],
        staged: &Staged,
        path: &Path,
    ) -> Result<(), BuildError> {
        // The key of a staged entry: its first one, two or four bytes hold the length
        // (≤ MAX_KEY_LEN).
        let key_of = |p: &Pending| -> io::Result<Vec<u8>> {
            let range = p.range();
            let mut head = vec![0u8; range.len().min(KEY_HEAD_MAX)];
            staged.read(range.start, &mut head)?;
            Ok(entry_key(&head).unwrap_or(&[]).to_vec())
        };
        pending.sort_unstable_by_key(|p| p.hash);
        let mut i = 0;
        while i < pending.len() {
            let h = pending[i].hash;
            let mut j = i + 1;
            while j < pending.len() && pending[j].hash == h {
                j += 1;
            }
            if j - i > 1 {
                let mut keys = pending[i..j]
                    .iter()
                    .map(key_of)
                    .collect::<io::Result<Vec<_>>>()
                    .map_err(io_err(path))?;
                keys.sort();
                if let Some(pair) = keys.windows(2).find(|w| w[0] == w[1]) {
                    return Err(BuildError::DuplicateKey {
                        key: BuildError::key(&pair[0]),
                    });
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Places every entry, writes the pages, the overflow and the header, and makes the
    /// snapshot durable: for a file, fsync, rename into place, fsync the directory. Fails on
    /// duplicate keys.
    pub fn seal(mut self) -> Result<S::Output, BuildError> {
        if self.failed {
            return Err(self.io(io::Error::other(
                "an earlier add failed to stage its entry; the snapshot would be corrupt",
            )));
        }
        let links = self.pending.len() as u64;
        let layout = self.meta.layout;
        let home_buckets = layout.home_pages(links);
        if home_buckets > 1 << 32 {
            return Err(BuildError::TooLarge {
                what: "more than 2^32 home buckets",
            });
        }
        let staging = std::mem::replace(&mut self.staging, Staging::in_memory());
        let staged = staging.finish().map_err(|e| self.io(e))?;
        let mut pending = std::mem::take(&mut self.pending);
        Self::sort_and_check_duplicates(&mut pending, &staged, &self.sink.path())?;
        let index_offset = align_up(self.header_len, INDEX_ALIGN).ok_or(BuildError::TooLarge {
            what: "file length overflows",
        })?;
        let padding = [0u8; INDEX_ALIGN as usize];
        let pad = padding
            .get(..(index_offset - self.header_len) as usize)
            .unwrap_or(&[]);
        self.sink.append(pad).map_err(|e| self.io(e))?;

        // First pass: the bucket count, which fixes where the overflow starts.
        let (total_buckets, _) = assign_slots(&mut pending, home_buckets, |_, _, _| Ok(()))?;
        let page_len = layout.page_len(links, self.staged_len);
        let pages_len = total_buckets
            .checked_mul(page_len.into())
            .filter(|len| len.saturating_add(self.staged_len) <= MAX_ARENA_LEN)
            .ok_or(BuildError::TooLarge {
                what: "pages and entries over 1 TiB",
            })?;
        // Second pass: each page is its bucket line, then the entries of its slots that fit
        // (in slot order), then zeros; an entry that does not fit goes to the overflow.
        let mut index_sum = Xxh3::new();
        let mut overflow_at = pages_len;
        let mut inline = 0u64;
        let mut page = vec![0u8; page_len as usize];
        let sink = &mut self.sink;
        let path = sink.path();
        let (_, max_probe) =
            assign_slots(&mut pending, home_buckets, |bucket_no, keys, continues| {
                page.fill(0);
                let mut used = BUCKET_LEN;
                for (slot, p) in keys.iter_mut().enumerate() {
                    let entry = p.range();
                    let offset = match page.get_mut(used..used + entry.len()) {
                        Some(dst) => {
                            staged.read(entry.start, dst).map_err(io_err(&path))?;
                            inline += 1;
                            used += entry.len();
                            bucket_no * u64::from(page_len) + (used - entry.len()) as u64
                        }
                        None => {
                            p.staged |= IN_OVERFLOW;
                            overflow_at += entry.len() as u64;
                            overflow_at - entry.len() as u64
                        }
                    };
                    let mut word = slot_word(tag(p.hash), offset);
                    if slot == 0 && continues {
                        word |= CONTINUES;
                    }
                    if let Some(dst) = page.get_mut(slot * 8..slot * 8 + 8) {
                        dst.copy_from_slice(&word.to_le_bytes());
                    }
                }
                index_sum.update(&page);
                sink.append(&page).map_err(io_err(&path))
            })?;
        // Third pass: the overflow, in the order its offsets were given out.
        let mut arena_sum = Xxh3::new();
        let mut entry = Vec::new();
        for p in pending.iter().filter(|p| p.in_overflow()) {
            entry.resize(p.range().len(), 0);
            staged
                .read(p.range().start, &mut entry)
                .map_err(|e| self.io(e))?;
            arena_sum.update(&entry);
            self.sink.append(&entry).map_err(|e| self.io(e))?;
        }
        drop(pending);
        let max_probe = u32::try_from(max_probe).map_err(|_| BuildError::TooLarge {
            what: "probe length over 2^32",
        })?;
        let arena_len = overflow_at - pages_len;
        let mut file_len = index_offset + overflow_at;
        // Version 5: the legacy set, when there are legacy keys (zeros to 64, the blocks, the
        // trailer); without any, the file ends at the overflow as version 4's did.
        let mut legacy = std::mem::take(&mut self.legacy);
        legacy.sort_unstable();
        legacy.dedup();
        let legacy_keys = legacy.len() as u64;
        if !legacy.is_empty() {
            let (blocks, filter) = crate::legacy::build(&legacy);
            drop(legacy);
            let start = align_up(file_len, INDEX_ALIGN).ok_or(BuildError::TooLarge {
                what: "file length overflows",
            })?;
            let pad = padding.get(..(start - file_len) as usize).unwrap_or(&[]);
            self.sink.append(pad).map_err(|e| self.io(e))?;
            self.sink.append(&filter).map_err(|e| self.io(e))?;
            let mut trailer = Vec::with_capacity(crate::legacy::TRAILER_LEN);
            trailer.extend_from_slice(&blocks.to_le_bytes());
            trailer.extend_from_slice(&legacy_keys.to_le_bytes());
            trailer.extend_from_slice(&section_checksum(&filter).to_le_bytes());
            trailer.extend_from_slice(&crate::legacy::TRAILER_MAGIC);
            self.sink.append(&trailer).map_err(|e| self.io(e))?;
            file_len = start + filter.len() as u64 + trailer.len() as u64;
        }
        debug_assert!(overflow_at <= MAX_ARENA_LEN);

        let hw = &self.meta.high_water;
        let header = Header {
            version: FORMAT_VERSION,
            // header_len_for(regions <= MAX_REGIONS) is at most 160 + 8 * 4096.
            header_len: self.header_len as u32,
            sequence: self.meta.sequence,
            key_id: self.meta.key_id,
            regions: hw.regions(),
            reserve: hw.reserve(),
            hash_seed: self.seed,
            links,
            aliases: self.aliases,
            expiring: self.expiring,
            url_bytes: self.url_bytes,
            arena_len,
            index_offset,
            home_buckets,
            total_buckets,
            max_probe,
            page_len,
            file_len,
            arena_checksum: arena_sum.digest(),
            index_checksum: index_sum.digest(),
            branded: self.branded,
            marks: hw.marks().to_vec(),
        };
        self.sink
            .write_at(0, &header.encode())
            .map_err(|e| self.io(e))?;
        let info = SealedInfo {
            path: None,
            file_len,
            links,
            aliases: self.aliases,
            branded: self.branded,
            expiring: self.expiring,
            with_options: self.with_options,
            url_bytes: self.url_bytes,
            legacy_keys,
            home_buckets,
            total_buckets,
            max_probe,
            hash_seed: self.seed,
            page_len,
            inline,
        };
        let path = self.sink.path();
        self.sink.finish(info).map_err(io_err(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::KEY_LEN_ESCAPE;
    use crate::Snapshot;
    use lasthop_core::code::DOMAIN_MAX;

    fn meta() -> SnapshotMeta {
        let mut hw = HighWater::new(1, 100).unwrap();
        hw.raise(0, 10).unwrap();
        SnapshotMeta::new(9, 77, hw).with_hash_seed(1)
    }

    #[test]
    fn build_and_read_in_memory() {
        let mut w = SnapshotWriter::in_memory(meta()).unwrap();
        w.add(b"abcDEF1", b"https://a.example/", None).unwrap();
        w.add(b"my-alias", b"https://b.example/", Some(5)).unwrap();
        w.add(b"zzzzzz9", b"", None).unwrap();
        let (info, bytes) = w.seal().unwrap();
        assert_eq!(info.links, 3);
        assert_eq!(info.file_len, bytes.len() as u64);
        let s = Snapshot::from_vec(bytes).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        assert_eq!(s.sequence(), 9);
        assert_eq!(s.key_id(), 77);
        assert_eq!(s.high_water().marks(), &[10]);
        assert_eq!(s.aliases(), 1);
        assert_eq!(s.expiring(), 1);
        let e = s.lookup(b"my-alias").unwrap();
        assert_eq!(e.url(), b"https://b.example/");
        assert_eq!(e.expires_at_ms(), Some(5));
        assert_eq!(s.lookup(b"zzzzzz9").unwrap().url(), b"");
        assert_eq!(s.lookup(b"abcDEF2"), None);
        assert_eq!(s.lookup(b""), None);
    }

    /// A domain name of exactly `len` bytes: labels of up to 63 letters, then `.example`.
    fn long_domain(len: usize) -> String {
        let mut d = String::new();
        let mut label = b'a';
        while d.len() + 63 + ".example".len() < len {
            d.push_str(&(label as char).to_string().repeat(63));
            d.push('.');
            label += 1;
        }
        d.push_str(&"z".repeat(len - ".example".len() - d.len()));
        d.push_str(".example");
        assert_eq!(d.len(), len);
        d
    }

    /// Branded keys: the same code on two domains is two links; counts say which are
    /// aliases (on any domain) and which carry a domain; keys past 126 bytes (the length
    /// escape) up to the longest link key round-trip and are found, in both layouts.
    #[test]
    fn branded_and_long_keys() {
        let domain = long_domain(DOMAIN_MAX);
        assert!(lasthop_core::code::domain_shape(domain.as_bytes()));
        let longest = format!("{domain}/{}", "L".repeat(64));
        assert_eq!(longest.len(), MAX_KEY_LEN);
        let at_escape = format!("{}/abcDEF9", long_domain(KEY_LEN_ESCAPE - 8));
        assert_eq!(at_escape.len(), KEY_LEN_ESCAPE);
        let below_escape = format!("{}/abcDEF8", long_domain(KEY_LEN_ESCAPE - 9));
        assert_eq!(below_escape.len(), KEY_LEN_ESCAPE - 1);
        let links: Vec<(&str, &str, Option<i64>)> = vec![
            ("abcDEF1", "https://a.example/", None),
            ("spring-sale", "https://default.example/spring", None),
            (
                "go.example.com/spring-sale",
                "https://go.example/spring",
                Some(7),
            ),
            ("go.example.com/zzzzzz9", "https://go.example/code", None),
            (longest.as_str(), "https://longest.example/", Some(-1)),
            (at_escape.as_str(), "https://escape.example/", None),
            (below_escape.as_str(), "https://below.example/", None),
        ];
        for layout in [Layout::Compact, Layout::Paged] {
            let mut w = SnapshotWriter::in_memory(meta().with_layout(layout)).unwrap();
            for &(k, u, e) in &links {
                w.add(k.as_bytes(), u.as_bytes(), e).unwrap();
            }
            let (info, bytes) = w.seal().unwrap();
            assert_eq!((info.links, info.aliases, info.branded), (7, 3, 5));
            let s = Snapshot::from_vec(bytes).unwrap();
            s.verify().unwrap();
            s.audit().unwrap();
            assert_eq!(s.format_version(), 5);
            assert_eq!((s.links(), s.aliases(), s.branded()), (7, 3, 5));
            for &(k, u, e) in &links {
                let probe = s.prefetch(k.as_bytes());
                s.prefetch_entry(probe);
                let found = s.lookup(k.as_bytes()).unwrap();
                assert_eq!(
                    (found.url(), found.expires_at_ms()),
                    (u.as_bytes(), e),
                    "{k}"
                );
                assert_eq!(s.lookup_probe(k.as_bytes(), probe), Some(found));
            }
            for absent in [
                "go.example.com/abcDEF1",
                "other.example/spring-sale",
                "go.example.com/spring-sal",
                "go.example.com",
                "go.example.com/",
                "/spring-sale",
                &longest[1..],
                &format!("{longest}x")[..],
                &format!("{}/abcDEF9", long_domain(KEY_LEN_ESCAPE - 7))[..],
            ] {
                assert_eq!(s.lookup(absent.as_bytes()), None, "{absent}");
            }
        }
        // Duplicates are found among long keys too (their length takes two bytes).
        let mut w = SnapshotWriter::in_memory(meta()).unwrap();
        w.add(longest.as_bytes(), b"one", None).unwrap();
        w.add(at_escape.as_bytes(), b"two", None).unwrap();
        w.add(longest.as_bytes(), b"three", None).unwrap();
        assert!(matches!(
            w.seal(),
            Err(BuildError::DuplicateKey { key }) if key == longest
        ));
    }

    /// The defaults make the plain entry `add` writes, byte for byte; other options an options
    /// entry, counted; options that do not validate are refused.
    #[test]
    fn options_entries_only_for_options_other_than_the_defaults() {
        let build = |options: Option<LinkOptions>| {
            let mut w = SnapshotWriter::in_memory(meta()).unwrap();
            w.add(b"abcDEF1", b"https://a.example/", None).unwrap();
            match options {
                Some(o) => w.add_with_options(b"my-alias", b"https://b.example/", Some(5), o),
                None => w.add(b"my-alias", b"https://b.example/", Some(5)),
            }
            .unwrap();
            w.seal().unwrap()
        };
        let plain = build(None);
        let defaults = build(Some(LinkOptions::default()));
        assert_eq!(plain, defaults);
        assert_eq!(plain.0.with_options, 0);
        let permanent = LinkOptions {
            redirect_status: 308,
            ..LinkOptions::default()
        };
        let (info, bytes) = build(Some(permanent));
        assert_eq!(info.with_options, 1);
        assert_eq!(
            info.file_len,
            plain.0.file_len + 7,
            "compact: the entry's 7 bytes"
        );
        let s = Snapshot::from_vec(bytes).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        assert_eq!(s.lookup(b"my-alias").unwrap().options(), permanent);
        assert!(s.lookup(b"abcDEF1").unwrap().options().is_default());

        let mut w = SnapshotWriter::in_memory(meta()).unwrap();
        for bad in [
            LinkOptions {
                redirect_status: 303,
                ..LinkOptions::default()
            },
            LinkOptions {
                cache_seconds: lasthop_core::options::CACHE_SECONDS_MAX + 1,
                ..LinkOptions::default()
            },
        ] {
            assert!(matches!(
                w.add_with_options(b"abcDEF1", b"u", None, bad),
                Err(BuildError::BadOptions { .. })
            ));
        }
        assert!(w.is_empty());
        assert!(matches!(
            w.add_with_options(b"sh.rt", b"u", None, permanent),
            Err(BuildError::BadKey { .. })
        ));
        // A duplicate is a duplicate whatever the entries' forms.
        w.add_with_options(b"abcDEF1", b"one", None, permanent)
            .unwrap();
        w.add(b"abcDEF1", b"two", None).unwrap();
        assert!(matches!(
            w.seal(),
            Err(BuildError::DuplicateKey { key }) if key == "abcDEF1"
        ));
    }

    #[test]
    fn empty_snapshot() {
        let (info, bytes) = SnapshotWriter::in_memory(meta()).unwrap().seal().unwrap();
        assert_eq!(info.links, 0);
        let s = Snapshot::from_vec(bytes).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        assert_eq!(s.lookup(b"abcDEF1"), None);
    }

    /// Version 5: legacy codes are entries and in the legacy set; claimed codes and cold legacy
    /// keys are in the set without an entry; other keys are not; a file without any is version
    /// 4's layout.
    #[test]
    fn legacy_codes_and_the_legacy_set() {
        for layout in [Layout::Compact, Layout::Paged] {
            let mut w = SnapshotWriter::in_memory(meta().with_layout(layout)).unwrap();
            w.add(b"abc", b"https://a.example/", None).unwrap();
            w.add(b"12345678", b"https://b.example/", None).unwrap();
            w.add(b"lh.example/x_y-z", b"https://c.example/", Some(9))
                .unwrap();
            w.add(b"abcDEF1", b"https://d.example/", None).unwrap();
            w.add_legacy(b"cold1").unwrap();
            w.add_legacy(b"Zz9Zz9Z").unwrap();
            w.add_legacy(b"abc").unwrap();
            assert!(matches!(
                w.add_legacy(b"an-alias"),
                Err(BuildError::BadKey { .. })
            ));
            let (info, bytes) = w.seal().unwrap();
            assert_eq!((info.links, info.aliases, info.legacy_keys), (4, 3, 5));
            let s = Snapshot::from_vec(bytes.clone()).unwrap();
            s.verify().unwrap();
            s.audit().unwrap();
            assert_eq!((s.format_version(), s.legacy_keys()), (5, 5));
            assert_eq!(s.lookup(b"abc").unwrap().url(), b"https://a.example/");
            assert_eq!(
                s.lookup(b"lh.example/x_y-z").unwrap().expires_at_ms(),
                Some(9)
            );
            for k in [
                &b"abc"[..],
                b"12345678",
                b"lh.example/x_y-z",
                b"cold1",
                b"Zz9Zz9Z",
            ] {
                assert!(s.legacy_may_contain(k), "{}", String::from_utf8_lossy(k));
            }
            let strays = (0..10_000)
                .filter(|i| s.legacy_may_contain(format!("q{i}").as_bytes()))
                .count();
            assert!(strays < 100, "{strays} false positives of 10000");
            // A flipped bit of the set is caught by verify; a cut trailer at open.
            let mut bad = bytes.clone();
            let at = bad.len() - crate::legacy::TRAILER_LEN - 1;
            bad[at] ^= 0x10;
            let s = Snapshot::from_vec(bad).unwrap();
            assert!(matches!(
                s.verify(),
                Err(crate::SnapshotError::Checksum {
                    section: crate::Section::Legacy,
                    ..
                })
            ));
            let cut = bytes[..bytes.len() - 1].to_vec();
            assert!(Snapshot::from_vec(cut).is_err());
        }
        let mut w = SnapshotWriter::in_memory(meta()).unwrap();
        w.add(b"abcDEF1", b"https://d.example/", None).unwrap();
        let (info, bytes) = w.seal().unwrap();
        let s = Snapshot::from_vec(bytes).unwrap();
        assert_eq!((info.legacy_keys, s.legacy_keys()), (0, 0));
        assert!(!s.legacy_may_contain(b"abc"));
    }

    #[test]
    fn rejects_bad_input() {
        let mut w = SnapshotWriter::in_memory(meta()).unwrap();
        assert!(matches!(
            w.add(b"sh.rt", b"u", None),
            Err(BuildError::BadKey { .. })
        ));
        assert!(matches!(
            w.add(b"abc.EF1", b"u", None),
            Err(BuildError::BadKey { .. })
        ));
        assert!(matches!(
            w.add(&[b'a'; 65], b"u", None),
            Err(BuildError::BadKey { .. })
        ));
        for bad in [
            &b"/spring-sale"[..],
            b"LH.example/spring-sale",
            b"localhost/spring-sale",
            b"lh.example/",
            b"lh.example/sh.rt",
            b"lh.example/a/b-and-more",
            b"lh.example:8080/spring-sale",
        ] {
            assert!(
                matches!(w.add(bad, b"u", None), Err(BuildError::BadKey { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut too_long = long_domain(DOMAIN_MAX + 1).into_bytes();
        too_long.extend_from_slice(b"/abcDEF1");
        assert!(matches!(
            w.add(&too_long, b"u", None),
            Err(BuildError::BadKey { .. })
        ));
        assert!(matches!(
            w.add(b"abcDEF1", &vec![b'u'; MAX_URL_LEN + 1], None),
            Err(BuildError::UrlTooLong { .. })
        ));
        w.add(b"abcDEF1", b"one", None).unwrap();
        w.add(b"abcDEF2", b"two", None).unwrap();
        w.add(b"abcDEF1", b"three", None).unwrap();
        assert!(matches!(
            w.seal(),
            Err(BuildError::DuplicateKey { key }) if key == "abcDEF1"
        ));
    }

    #[test]
    fn file_writer_renames_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let mut w = SnapshotWriter::create(&path, meta()).unwrap();
        w.add(b"abcDEF1", b"https://a.example/", None).unwrap();
        assert!(!path.exists(), "nothing at the final name before seal");
        let info = w.seal().unwrap();
        assert_eq!(info.path.as_deref(), Some(path.as_path()));
        let s = Snapshot::open(&path).unwrap();
        s.verify().unwrap();
        assert_eq!(s.file_len(), info.file_len);

        let other = dir.path().join("t.snap");
        let w = SnapshotWriter::create(&other, meta()).unwrap();
        drop(w);
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "an unsealed writer leaves no temp file");
    }

    #[test]
    fn a_large_build_stages_in_an_unlinked_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let mut w = SnapshotWriter::create(&path, meta()).unwrap();
        // Spill after a few entries, as a build past 256 MiB does.
        if let Staging::Memory { limit, .. } = &mut w.staging {
            *limit = 200;
        }
        let key = |i: u32| format!("alias-{i:06}");
        for i in 0..500 {
            let url = format!("https://e.example/{}", "x".repeat(i as usize % 90));
            w.add(key(i).as_bytes(), url.as_bytes(), None).unwrap();
        }
        assert!(matches!(w.staging, Staging::File(_)), "spilled");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(
            left.len(),
            1,
            "the staging file is unlinked: only the temp file shows"
        );
        w.seal().unwrap();
        let s = Snapshot::open(&path).unwrap();
        s.verify().unwrap();
        s.audit().unwrap();
        for i in 0..500 {
            let url = format!("https://e.example/{}", "x".repeat(i as usize % 90));
            assert_eq!(s.lookup(key(i).as_bytes()).unwrap().url(), url.as_bytes());
        }
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the snapshot");
    }

    #[test]
    fn same_input_same_bytes_any_order() {
        let build = |order: &[usize]| {
            let keys = [&b"abcDEF1"[..], b"abcDEF2", b"an-alias-here", b"9999999"];
            let mut w = SnapshotWriter::in_memory(meta()).unwrap();
            for &i in order {
                w.add(keys[i], keys[i], None).unwrap();
            }
            let bytes = w.seal().unwrap().1;
            let s = Snapshot::from_vec(bytes.clone()).unwrap();
            let answers = keys
                .iter()
                .map(|k| s.lookup(k).map(|e| e.url().to_vec()))
                .collect::<Vec<_>>();
            (answers, bytes)
        };
        // Placement follows the hash, not the order of adds: the same bytes.
        assert_eq!(build(&[0, 1, 2, 3]), build(&[3, 2, 1, 0]));
    }

    /// An entry moved into another page (its slot pointed at it there) still looks up, but
    /// audit refuses the file: the writer keeps each inline entry in its own bucket's page.
    #[test]
    fn audit_refuses_an_entry_outside_its_page() {
        let mut w = SnapshotWriter::in_memory(meta().with_layout(Layout::Paged)).unwrap();
        for i in 0..40u32 {
            w.add(
                format!("alias-{i:04}").as_bytes(),
                b"https://e.example/",
                None,
            )
            .unwrap();
        }
        let mut bytes = w.seal().unwrap().1;
        let s = Snapshot::from_vec(bytes.clone()).unwrap();
        s.audit().unwrap();
        let (stride, pages) = (s.page_len() as usize, s.index_len() as usize);
        let base = (bytes.len() as u64 - s.arena_len() - s.index_len()) as usize;
        // Page 0's last inline entry (so the zeros left behind are its padding) and its slot;
        // the last page's free tail.
        let (slot, word) = (0..SLOTS_PER_BUCKET)
            .map(|i| {
                let w = &bytes[base + i * 8..base + i * 8 + 8];
                (i, u64::from_le_bytes(w.try_into().unwrap()))
            })
            .filter(|&(_, w)| w != 0 && ((w & crate::format::OFFSET_MASK) as usize) < stride)
            .max_by_key(|&(_, w)| w & crate::format::OFFSET_MASK)
            .expect("page 0 holds an entry");
        let at = (word & crate::format::OFFSET_MASK) as usize;
        let key_len = usize::from(bytes[base + at] & 0x7f);
        let len = 1 + key_len + 1 + b"https://e.example/".len();
        let last = pages - stride;
        let free = (last + BUCKET_LEN..last + stride)
            .rev()
            .take_while(|&i| bytes[base + i] == 0)
            .last()
            .unwrap();
        assert!(last + stride - free > len, "room in the last page");
        let entry = bytes[base + at..base + at + len].to_vec();
        bytes[base + free..base + free + len].copy_from_slice(&entry);
        bytes[base + at..base + at + len].fill(0);
        let moved = (word & !crate::format::OFFSET_MASK) | (free as u64);
        bytes[base + slot * 8..base + slot * 8 + 8].copy_from_slice(&moved.to_le_bytes());
        let s = Snapshot::from_vec(bytes).unwrap();
        assert!(
            s.lookup(&entry[1..1 + key_len]).is_some(),
            "it still looks up"
        );
        let err = s.audit().unwrap_err().to_string();
        assert!(err.contains("not in the page of its bucket"), "{err}");
    }
}
