//! The zero-copy reader: open (header and bounds), `lookup`, `verify` (checksums) and `audit`
//! (a full structural walk).

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use lasthop_core::{classify, classify_key, split_key, CodeKind, HighWater, LinkOptions};
use memmap2::Mmap;

use crate::error::{Section, SnapshotError};
use crate::format::{
    entry_at, entry_form_problem, entry_if_key, hash, home_bucket, section_checksum, slot_tag, tag,
    Header, BUCKET_LEN, CONTINUES, FIXED_HEADER_LEN, MAX_KEY_LEN, OFFSET_MASK, SHORT_KEY_MAX,
};

/// What a key resolves to: borrowed from the file, nothing copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    url: &'a [u8],
    expires_at_ms: Option<i64>,
    /// An options entry's packed word (version 4); `None`: the default options.
    options: Option<u32>,
}

impl<'a> Entry<'a> {
    /// The destination URL, exactly as the builder was given it.
    #[inline]
    pub fn url(&self) -> &'a [u8] {
        self.url
    }

    /// Expiry in Unix milliseconds, if the link has one.
    #[inline]
    pub fn expires_at_ms(&self) -> Option<i64> {
        self.expires_at_ms
    }

    /// How the link's redirect is served (version 4 carries a link's own options; every other
    /// link, and every link of versions 1 to 3, has the defaults). A word that does not unpack,
    /// which only a crafted file holds and `audit` refuses, reads as the defaults.
    #[inline]
    pub fn options(&self) -> LinkOptions {
        self.own_options().unwrap_or_default()
    }

    /// The link's own options, `None` for a plain entry (whose options are the defaults): what
    /// the request path asks, with nothing to compare for a plain link.
    #[inline]
    pub fn own_options(&self) -> Option<LinkOptions> {
        self.options.map(unpack_options)
    }
}

/// An options entry's word, unpacked out of line: the plain entries' hit path carries no copy
/// of it.
#[cold]
#[inline(never)]
fn unpack_options(word: u32) -> LinkOptions {
    LinkOptions::unpack(word).unwrap_or_default()
}

/// A lookup begun by [`Snapshot::prefetch`]: the key's hash under this snapshot's seed. Only
/// meaningful for the snapshot and key that made it.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    hash: u64,
}

/// Asks the CPU for the cache line at `p` ahead of its use.
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address, and reads nothing
    // into the program; `p` points into the mapped index anyway. SSE is baseline on x86-64.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// An open snapshot. Immutable and `Sync`: share one behind an `Arc` across serving cores.
pub struct Snapshot {
    bytes: Bytes,
    header: Header,
    high_water: HighWater,
    /// Version 1: the arena; versions 2 to 5: the overflow. Checked by `arena_checksum`.
    arena: Range<usize>,
    /// Version 1: the index; versions 2 to 5: the pages (bucket lines and inline entries).
    /// Checked by `index_checksum`; bucket `b` starts at `b · stride` in it.
    index: Range<usize>,
    /// Bytes from one bucket line to the next: 64 in version 1, the page length in versions 2
    /// to 4.
    stride: usize,
    /// What slot offsets count from: the arena in version 1, the pages and overflow together
    /// in versions 2 to 5.
    entries: Range<usize>,
    /// Version 5's legacy set, when the file has one.
    legacy: Option<Legacy>,
}

/// Where a version-5 legacy set's blocks are, and what its trailer says.
#[derive(Debug, Clone)]
struct Legacy {
    bytes: Range<usize>,
    blocks: u64,
    keys: u64,
    checksum: u64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("sequence", &self.header.sequence)
            .field("key_id", &self.header.key_id)
            .field("links", &self.header.links)
            .field("file_len", &self.header.file_len)
            .finish_non_exhaustive()
    }
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a snapshot file and returns it with its length, refusing one shorter than the fixed
/// header (what `open` and `load` check first).
fn open_file(path: &Path) -> Result<(File, u64), SnapshotError> {
    let io = io_error(path);
    let file = File::open(path).map_err(&io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < FIXED_HEADER_LEN as u64 {
        return Err(SnapshotError::TooShort {
            len,
            need: FIXED_HEADER_LEN as u64,
        });
    }
    Ok((file, len))
}

fn to_usize(v: u64, field: &'static str) -> Result<usize, SnapshotError> {
    usize::try_from(v).map_err(|_| SnapshotError::BadField {
        field,
        value: v,
        why: "does not fit this machine's address space",
    })
}

impl Snapshot {
    /// Maps the snapshot at `path` and checks its header and section bounds. Costs the same
    /// for any size of file: nothing is read beyond the header and the index padding. Call
    /// [`Snapshot::verify`] before serving from a file you did not just write.
    ///
    /// # Safety
    ///
    /// This function is safe to call; the `unsafe` inside is the mmap, and it holds because of
    /// how snapshots are published, not because of anything the caller does: a snapshot is
    /// written under a temporary name, fsynced, renamed into place and never modified or
    /// truncated afterwards (the writer's `seal` is the only producer; replacing a snapshot
    /// means renaming a new file over the name, which leaves this mapping on the old inode).
    /// A file changed in place while mapped would break Rust's aliasing rules (and truncation
    /// would raise SIGBUS); nothing in lasthop does that, and operators must not either.
    #[allow(unsafe_code)]
    pub fn open(path: impl AsRef<Path>) -> Result<Snapshot, SnapshotError> {
        let path = path.as_ref();
        let io = io_error(path);
        // The length check also avoids mapping an empty file, which mmap refuses.
        let (file, _) = open_file(path)?;
        // SAFETY: snapshot files are immutable once renamed into place (see `# Safety` above):
        // no process writes or truncates the file while this read-only private map exists, so
        // the bytes behind the `&[u8]` never change for the map's lifetime.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        #[cfg(unix)]
        {
            // Lookups hop at random; read-ahead would only evict useful pages. Advisory only.
            let _ = map.advise(memmap2::Advice::Random);
        }
        Snapshot::from_backing(Bytes::Mapped(map))
    }

    /// Reads the snapshot at `path` into private anonymous memory that asks the kernel for
    /// transparent huge pages, and checks it as [`Snapshot::open`] does. Lookups land at random
    /// across the file, so with 4 KiB pages nearly every one also misses the TLB (dearer still
    /// under a hypervisor's nested page tables); 2 MiB pages cut a 1M-link lookup from ~565 to
    /// ~380 ns on the development VM. The price: the file is read once at load (the engine
    /// verifies every byte at load anyway) and the copy is not shared with other processes.
    pub fn load(path: impl AsRef<Path>) -> Result<Snapshot, SnapshotError> {
        use std::io::Read;
        let path = path.as_ref();
        let io = io_error(path);
        let (mut file, len) = open_file(path)?;
        let len = to_usize(len, "file_len")?;
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(&io)?;
        #[cfg(target_os = "linux")]
        {
            // Advisory: where THP is off the copy still works, on small pages.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        file.read_exact(&mut map).map_err(&io)?;
        let map = map.make_read_only().map_err(io)?;
        Snapshot::from_backing(Bytes::Mapped(map))
    }

    /// Checks an in-memory snapshot the same way [`Snapshot::open`] checks a file (tests,
    /// fuzzing, and snapshots received over the network before they are written out).
    pub fn from_vec(bytes: Vec<u8>) -> Result<Snapshot, SnapshotError> {
        Snapshot::from_backing(Bytes::Owned(bytes))
    }

    /// [`Snapshot::from_vec`] on a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        Snapshot::from_vec(bytes.to_vec())
    }

    fn from_backing(bytes: Bytes) -> Result<Snapshot, SnapshotError> {
        let all = match &bytes {
            Bytes::Mapped(m) => &m[..],
            Bytes::Owned(v) => &v[..],
        };
        let header = Header::decode(all)?;
        let high_water = header.high_water()?;
        let file_len = to_usize(header.file_len, "file_len")?;
        let index_start = to_usize(header.index_offset, "index_offset")?;
        let (arena, index, stride, entries, gap) = if header.version == 1 {
            let arena_start = to_usize(header.arena_offset(), "header_len")?;
            let arena_end = to_usize(header.arena_offset() + header.arena_len, "arena_len")?;
            let arena = arena_start..arena_end;
            // Between arena and index.
            let gap = arena_end..index_start;
            (arena.clone(), index_start..file_len, BUCKET_LEN, arena, gap)
        } else {
            let stride = header.page_len as usize;
            let pages = to_usize(header.total_buckets, "total_buckets")?
                .checked_mul(stride)
                .and_then(|len| len.checked_add(index_start))
                .ok_or(SnapshotError::BadField {
                    field: "total_buckets",
                    value: header.total_buckets,
                    why: "does not fit this machine's address space",
                })?;
            // Between header and pages.
            let gap = header.header_len as usize..index_start;
            // The overflow ends the file but for a version-5 legacy set after it.
            let end = to_usize(header.arena_len, "arena_len")?
                .checked_add(pages)
                .filter(|&e| e <= file_len)
                .ok_or(SnapshotError::BadField {
                    field: "arena_len",
                    value: header.arena_len,
                    why: "runs past the end of the file",
                })?;
            (
                pages..end,
                index_start..pages,
                stride,
                index_start..end,
                gap,
            )
        };
        let legacy = match header.legacy_section(all)? {
            Some(l) => {
                let start = to_usize(l.offset, "legacy")?;
                let len = to_usize(l.blocks, "legacy")?.saturating_mul(crate::legacy::BLOCK_LEN);
                Some(Legacy {
                    bytes: start..start.saturating_add(len),
                    blocks: l.blocks,
                    keys: l.keys,
                    checksum: l.checksum,
                })
            }
            None => None,
        };
        // The padding before the index is covered by no checksum, so check it here (at most
        // 63 bytes): then every byte of the file is either checked on open or covered by a
        // checksum that `verify` checks.
        let padding = all.get(gap).ok_or(SnapshotError::BadField {
            field: "index_offset",
            value: header.index_offset,
            why: "before the end of the section it follows",
        })?;
        if padding.iter().any(|&b| b != 0) {
            return Err(SnapshotError::BadField {
                field: "index_offset",
                value: header.index_offset,
                why: "padding before the index is not zero",
            });
        }
        Ok(Snapshot {
            bytes,
            header,
            high_water,
            arena,
            index,
            stride,
            entries,
            legacy,
        })
    }

    /// Whether the legacy set (version 5) may hold `key`: false means the record holds no
    /// link of that key that an import made with a legacy or claimed code (as of this
    /// snapshot's sequence; the overlay has the ones since). False without a legacy set.
    /// One hash and one 32-byte block, in place in the mapping.
    #[inline]
    pub fn legacy_may_contain(&self, key: &[u8]) -> bool {
        match &self.legacy {
            Some(l) => crate::legacy::may_contain(
                self.all().get(l.bytes.clone()).unwrap_or(&[]),
                l.blocks,
                crate::legacy::key_hash(key, self.header.hash_seed),
            ),
            None => false,
        }
    }

    /// Distinct keys in the legacy set (0: none, and every file before version 5).
    pub fn legacy_keys(&self) -> u64 {
        self.legacy.as_ref().map_or(0, |l| l.keys)
    }

    #[inline]
    fn all(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    #[inline]
    fn arena(&self) -> &[u8] {
        self.all().get(self.arena.clone()).unwrap_or(&[])
    }

    #[inline]
    fn index(&self) -> &[u8] {
        self.all().get(self.index.clone()).unwrap_or(&[])
    }

    /// Where slot offsets point.
    #[inline]
    fn entries(&self) -> &[u8] {
        self.all().get(self.entries.clone()).unwrap_or(&[])
    }

    /// Bucket `b`'s page: its line, and in versions 2 to 5 the entries stored with it.
    #[inline]
    fn page(&self, b: u64) -> Option<&[u8]> {
        let start = usize::try_from(b).ok()?.checked_mul(self.stride)?;
        self.index().get(start..)?.get(..self.stride)
    }

    /// Bucket `b`'s line (the first of its page).
    #[inline]
    fn bucket(&self, b: u64) -> Option<&[u8; BUCKET_LEN]> {
        self.page(b)?.first_chunk::<BUCKET_LEN>()
    }

    /// The entry for the link key `key` (a generated code or an alias on the default domain,
    /// `domain/code` on a branded one: [`lasthop_core::link_key`]), or `None`. O(1): one bucket
    /// (one cache line, rarely the next) and, on a tag match, one entry (in versions 2 to 5
    /// usually in the same page). Never allocates.
    ///
    /// Keys of up to 126 bytes (every default-domain key) take the same path as in version 2,
    /// where a link with options of its own (version 4) is reached through an out-of-line parse
    /// when its entry's first byte says the escape; longer keys (long branded domains) take a
    /// separate, out-of-line path.
    ///
    /// On a file that opened but is corrupt (before `verify`), the answer may be wrong but the
    /// call is still bounded, panic-free and in bounds.
    #[inline]
    pub fn lookup(&self, key: &[u8]) -> Option<Entry<'_>> {
        if key.is_empty() || key.len() > SHORT_KEY_MAX {
            return self.lookup_long(key, None);
        }
        let h = hash(key, self.header.hash_seed);
        self.lookup_hashed::<false>(key, h).map(|(e, _, _)| e)
    }

    /// [`Snapshot::lookup`] (with `hash` when a probe computed it) of a key that is empty or
    /// longer than [`SHORT_KEY_MAX`]: kept out of the short keys' path.
    #[cold]
    #[inline(never)]
    fn lookup_long(&self, key: &[u8], hash_of: Option<u64>) -> Option<Entry<'_>> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return None;
        }
        let h = hash_of.unwrap_or_else(|| hash(key, self.header.hash_seed));
        self.lookup_hashed::<true>(key, h).map(|(e, _, _)| e)
    }

    /// Starts the memory fetch of `key`'s home page (versions 2 to 5: the bucket line and the
    /// entries stored with it, which hold the key's entry unless it went to the overflow; in
    /// version 1 the bucket line alone) and returns the [`Probe`] that
    /// [`Snapshot::lookup_probe`] finishes. The engine calls this as a request arrives, before
    /// parsing it and before the FF1 decrypt, so that work hides the memory access; the
    /// page's lines come in parallel, so a hit waits for one access, not two. The decrypt
    /// still decides whether the lookup happens at all. A prefetch is only a hint: it never
    /// faults a page in and never changes an answer.
    #[inline]
    pub fn prefetch(&self, key: &[u8]) -> Probe {
        let h = hash(key, self.header.hash_seed);
        let page = self.page(home_bucket(h, self.header.home_buckets));
        // At most 16 lines (1 KiB): the writer's pages are 12 lines for 95-byte URLs; a file
        // of far longer URLs (pages up to 64 lines) pays a second fetch for the rest instead
        // of a request's worth of memory bandwidth on every lookup.
        for line in page.unwrap_or_default().chunks(BUCKET_LEN).take(16) {
            prefetch_line(line.as_ptr());
        }
        Probe { hash: h }
    }

    /// [`Snapshot::prefetch`]'s probe without the page: the hash, and a hint for the bucket
    /// line alone, for a caller that prefetched the page already or does not know yet
    /// whether it will look up.
    #[inline]
    pub fn probe(&self, key: &[u8]) -> Probe {
        let h = hash(key, self.header.hash_seed);
        if let Some(line) = self.bucket(home_bucket(h, self.header.home_buckets)) {
            prefetch_line(line.as_ptr());
        }
        Probe { hash: h }
    }

    /// Reads `probe`'s home bucket (which [`Snapshot::prefetch`] asked for) and asks for the
    /// lines of the entry whose tag matches: the second of a lookup's two memory accesses in a
    /// version-1 or compact file (or for an entry in the overflow), started halfway through
    /// the caller's decrypt so the rest of the AES rounds hide it. A hint only:
    /// it reads the bucket (already bounds-checked by open), never an entry, and never changes an
    /// answer.
    #[inline]
    pub fn prefetch_entry(&self, probe: Probe) {
        let want = tag(probe.hash);
        let home = home_bucket(probe.hash, self.header.home_buckets);
        let Some(bucket) = self.bucket(home) else {
            return;
        };
        // The first slot whose tag matches (a second match is a 1-in-8M tag collision, left
        // to the lookup).
        let Some(word) = bucket
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .find(|&w| slot_tag(w) == want)
        else {
            return;
        };
        let entries = self.entries();
        let at = usize::try_from(word & OFFSET_MASK).unwrap_or(usize::MAX);
        // An entry (length bytes, key, URL, expiry) spans two or three lines for URLs of 60
        // to 150 bytes, most of them; the lines come in parallel (in versions 2 to 5 they are
        // usually the home page's, already asked for).
        for line in entries.get(at..).unwrap_or_default().chunks(64).take(3) {
            prefetch_line(line.as_ptr());
        }
    }

    /// [`Snapshot::lookup`] with the hash a [`Snapshot::prefetch`] of the same `key` computed.
    #[inline]
    pub fn lookup_probe(&self, key: &[u8], probe: Probe) -> Option<Entry<'_>> {
        if key.is_empty() || key.len() > SHORT_KEY_MAX {
            return self.lookup_long(key, Some(probe.hash));
        }
        self.lookup_hashed::<false>(key, probe.hash)
            .map(|(e, _, _)| e)
    }

    /// [`Snapshot::lookup_hashed`] for a key of any length (1..=[`MAX_KEY_LEN`]; `audit`).
    fn find(&self, key: &[u8], h: u64) -> Option<(Entry<'_>, u64, u64)> {
        if key.len() > SHORT_KEY_MAX {
            self.lookup_hashed::<true>(key, h)
        } else {
            self.lookup_hashed::<false>(key, h)
        }
    }

    /// The lookup proper; also returns the entry's offset (from the arena in version 1, from
    /// the first page in versions 2 to 5) and the bucket whose slot led to it (for `audit`).
    /// `LONG`: `key` is longer than [`SHORT_KEY_MAX`] (its entry's length is escaped). A short
    /// key's options entry (version 4) is escaped too: `entry_if_key` reads it out of line when
    /// byte 0's length bits, not the key's length, say the escape.
    /// The version is not consulted: an options entry in a file of an older version is only
    /// possible in a crafted file, which `audit` refuses.
    #[inline]
    fn lookup_hashed<const LONG: bool>(&self, key: &[u8], h: u64) -> Option<(Entry<'_>, u64, u64)> {
        let entries = self.entries();
        let want = tag(h);
        let home = home_bucket(h, self.header.home_buckets);
        // Both bounds come from a header that passed open; `min` keeps a lying max_probe from
        // walking past the index.
        let last = home
            .saturating_add(u64::from(self.header.max_probe))
            .min(self.header.total_buckets.saturating_sub(1));
        let mut bucket_no = home;
        loop {
            let bucket = self.bucket(bucket_no)?;
            let mut first = 0;
            for (i, chunk) in bucket.chunks_exact(8).enumerate() {
                let Ok(word) = <[u8; 8]>::try_from(chunk) else {
                    return None;
                };
                let word = u64::from_le_bytes(word);
                if i == 0 {
                    first = word;
                }
                if word == 0 {
                    return None;
                }
                if slot_tag(word) == want {
                    let offset = word & OFFSET_MASK;
                    let at = usize::try_from(offset).ok()?;
                    if let Some(e) = entries.get(at..).and_then(|b| entry_if_key::<LONG>(b, key)) {
                        let entry = Entry {
                            url: e.url,
                            expires_at_ms: e.expires_at_ms,
                            options: e.options,
                        };
                        return Some((entry, offset, bucket_no));
                    }
                }
            }
            if first & CONTINUES == 0 || bucket_no >= last {
                return None;
            }
            bucket_no += 1;
        }
    }

    /// Checks the section checksums (xxh3-64: v2 and v3 pages and overflow, v1 index and
    /// arena): reads the whole file once. The header's own checksum was checked by open. Run
    /// this before swapping a snapshot into service.
    pub fn verify(&self) -> Result<(), SnapshotError> {
        for (section, bytes, stored) in [
            (Section::Index, self.index(), self.header.index_checksum),
            (Section::Arena, self.arena(), self.header.arena_checksum),
        ] {
            let computed = section_checksum(bytes);
            if computed != stored {
                return Err(SnapshotError::Checksum {
                    section,
                    stored,
                    computed,
                });
            }
        }
        if let Some(l) = &self.legacy {
            let computed = section_checksum(self.all().get(l.bytes.clone()).unwrap_or(&[]));
            if computed != l.checksum {
                return Err(SnapshotError::Checksum {
                    section: Section::Legacy,
                    stored: l.checksum,
                    computed,
                });
            }
        }
        Ok(())
    }

    /// Walks every entry and checks the file is what the writer would have produced:
    /// entries parse back to back, every key is a valid link key (versions 3 and 4: a code or
    /// alias, on the default domain or `domain/code`; versions 1 and 2: a code or alias, no
    /// domain) and is found by `lookup` at its own offset, an options entry is in a version-4
    /// file and holds a word that unpacks to options other than the defaults, and the counts
    /// match the header. Checksums prove the bytes are the ones written; this proves the
    /// writer wrote a sound file (checksums are not signatures). About one lookup per link.
    pub fn audit(&self) -> Result<(), SnapshotError> {
        let entries = self.entries();
        let (mut links, mut aliases, mut expiring, mut url_bytes) = (0u64, 0u64, 0u64, 0u64);
        let mut branded = 0u64;
        // Versions 1 and 2 predate branded domains: a key with a domain (or over 64 bytes) is
        // one their writers never wrote.
        let kind_of: fn(&[u8]) -> CodeKind = if self.header.version >= 3 {
            classify_key
        } else {
            classify
        };
        // Walks the entries in `region` of the entry space back to back. In page `page`'s inline
        // area a zero byte ends them, every byte after it must be zero too, and each entry's
        // slot must be in that page's bucket (where the writer puts it; a crafted file that
        // hides an entry in another page is refused).
        let mut walk =
            |region: Range<usize>, page: Option<u64>| -> Result<(), SnapshotError> {
                let zero_tail = page.is_some();
                let mut at = region.start;
                while at < region.end {
                    let offset = at as u64;
                    let fail = |why| SnapshotError::Structure { offset, why };
                    let rest = entries.get(at..region.end).unwrap_or_default();
                    if zero_tail && rest.first() == Some(&0) {
                        if rest.iter().any(|&b| b != 0) {
                            return Err(fail("page padding is not zero"));
                        }
                        break;
                    }
                    let (entry, after) = entry_at(rest).ok_or(fail("entry does not parse"))?;
                    if let Some(why) = entry_form_problem(self.header.version, &entry) {
                        return Err(fail(why));
                    }
                    match kind_of(entry.key) {
                        CodeKind::Generated => {}
                        CodeKind::Alias => aliases += 1,
                        CodeKind::Legacy if self.header.version >= 5 => {
                            if !self.legacy_may_contain(entry.key) {
                                return Err(fail("a legacy code missing from the legacy set"));
                            }
                            aliases += 1;
                        }
                        CodeKind::Legacy => return Err(fail("a legacy code before version 5")),
                        CodeKind::Invalid if self.header.version >= 3 => {
                            return Err(fail(
                                "key is not a link key (code or alias, or domain/code)",
                            ))
                        }
                        CodeKind::Invalid => return Err(fail(
                            "key is neither a code nor an alias (versions 1 and 2 have no domains)",
                        )),
                    }
                    branded += u64::from(split_key(entry.key).0.is_some());
                    let h = hash(entry.key, self.header.hash_seed);
                    match self.find(entry.key, h) {
                        Some((_, found, bucket)) if found == offset => {
                            if page.is_some_and(|p| p != bucket) {
                                return Err(fail("entry is not in the page of its bucket"));
                            }
                        }
                        Some(_) => return Err(fail("key appears twice")),
                        None => return Err(fail("entry is not reachable from the index")),
                    }
                    links += 1;
                    expiring += u64::from(entry.expires_at_ms.is_some());
                    url_bytes += entry.url.len() as u64;
                    at = region.end - after.len();
                }
                Ok(())
            };
        let pages = self.index.len();
        if self.header.version >= 2 {
            for (page, start) in (0..pages).step_by(self.stride).enumerate() {
                walk(start + BUCKET_LEN..start + self.stride, Some(page as u64))?;
            }
        }
        walk(entries.len() - self.arena.len()..entries.len(), None)?;
        let end = entries.len() as u64;
        let slots = (0..self.header.total_buckets)
            .filter_map(|b| self.bucket(b))
            .flat_map(|line| line.chunks_exact(8))
            .filter(|c| c.iter().any(|&b| b != 0))
            .count() as u64;
        for (got, want, why) in [
            (
                links,
                self.header.links,
                "link count differs from the header",
            ),
            (
                aliases,
                self.header.aliases,
                "alias count differs from the header",
            ),
            (
                branded,
                self.header.branded,
                "branded count differs from the header",
            ),
            (
                expiring,
                self.header.expiring,
                "expiring count differs from the header",
            ),
            (
                url_bytes,
                self.header.url_bytes,
                "URL byte count differs from the header",
            ),
            (
                slots,
                links,
                "index slot count differs from the entry count",
            ),
        ] {
            if got != want {
                return Err(SnapshotError::Structure { offset: end, why });
            }
        }
        Ok(())
    }

    /// Format version of the file ([`crate::OLDEST_FORMAT_VERSION`] to
    /// [`crate::FORMAT_VERSION`]).
    pub fn format_version(&self) -> u32 {
        self.header.version
    }

    /// The feed sequence this snapshot is complete up to.
    pub fn sequence(&self) -> u64 {
        self.header.sequence
    }

    /// Id of the permutation key the codes were minted under.
    pub fn key_id(&self) -> u32 {
        self.header.key_id
    }

    /// Per-region high-water marks at `sequence`.
    pub fn high_water(&self) -> &HighWater {
        &self.high_water
    }

    /// Entries: generated codes plus aliases, on every domain.
    pub fn links(&self) -> u64 {
        self.header.links
    }

    /// Entries whose key's code is an alias, on any domain (so `links - aliases` are the
    /// generated codes, on any domain).
    pub fn aliases(&self) -> u64 {
        self.header.aliases
    }

    /// Entries whose key carries a domain (`domain/code`: a branded domain's generated codes
    /// and aliases). Zero in versions 1 and 2, which predate branded domains.
    pub fn branded(&self) -> u64 {
        self.header.branded
    }

    /// Entries with an expiry.
    pub fn expiring(&self) -> u64 {
        self.header.expiring
    }

    /// Sum of URL lengths.
    pub fn url_bytes(&self) -> u64 {
        self.header.url_bytes
    }

    /// File size in bytes.
    pub fn file_len(&self) -> u64 {
        self.header.file_len
    }

    /// Version 1: the arena's size in bytes; versions 2 to 5: the overflow's (entries that did
    /// not fit the page holding their slot).
    pub fn arena_len(&self) -> u64 {
        self.header.arena_len
    }

    /// Version 1: the index's size in bytes; versions 2 to 5: the pages' (bucket lines and the
    /// entries stored with them).
    pub fn index_len(&self) -> u64 {
        self.index.len() as u64
    }

    /// Versions 2 to 4: bytes per page (a bucket line and the entries stored with it); 0 in
    /// version 1.
    pub fn page_len(&self) -> u32 {
        self.header.page_len
    }

    /// Index geometry: (home buckets, total buckets including spill, longest probe).
    pub fn buckets(&self) -> (u64, u64, u32) {
        (
            self.header.home_buckets,
            self.header.total_buckets,
            self.header.max_probe,
        )
    }

    /// Seed of the index hash.
    pub fn hash_seed(&self) -> u64 {
        self.header.hash_seed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::reseal_header;
    use crate::{Layout, SnapshotMeta, SnapshotWriter};

    /// Header offsets of the fields these tests rewrite.
    const VERSION_AT: usize = 8;
    const BRANDED_AT: usize = 144;

    fn build(keys: &[&str], layout: Layout) -> Vec<u8> {
        let mut hw = HighWater::new(2, 100).unwrap();
        hw.raise(0, 10).unwrap();
        let meta = SnapshotMeta::new(5, 6, hw)
            .with_hash_seed(11)
            .with_layout(layout);
        let mut w = SnapshotWriter::in_memory(meta).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let url = format!("https://e.example/{i}");
            let expiry = (i % 3 == 0).then_some(i as i64);
            w.add(k.as_bytes(), url.as_bytes(), expiry).unwrap();
        }
        w.seal().unwrap().1
    }

    fn patch(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        b[at..at + value.len()].copy_from_slice(value);
        reseal_header(&mut b);
        b
    }

    const DEFAULT_KEYS: [&str; 6] = [
        "abcDEF1",
        "zzzzzz9",
        "0000000",
        "spring-sale",
        "a1234567",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    ];

    /// What a version-2 writer wrote is what today's writer writes for default-domain keys,
    /// but for the version: the same file labelled 2 still opens, verifies, audits and answers
    /// alike. (The checked-in `v2.snap` is the other half: `tests/backwards_compat.rs`.)
    #[test]
    fn v2_reader_refuses_nothing_it_read() {
        for layout in [Layout::Compact, Layout::Paged] {
            let v3 = build(&DEFAULT_KEYS, layout);
            let v2 = patch(&v3, VERSION_AT, &2u32.to_le_bytes());
            let (s3, s2) = (
                Snapshot::from_vec(v3).unwrap(),
                Snapshot::from_vec(v2).unwrap(),
            );
            assert_eq!((s3.format_version(), s2.format_version()), (5, 2));
            s2.verify().unwrap();
            s2.audit().unwrap();
            assert_eq!(s2.branded(), 0);
            assert_eq!((s2.links(), s2.aliases()), (s3.links(), s3.aliases()));
            for k in DEFAULT_KEYS {
                assert_eq!(s2.lookup(k.as_bytes()), s3.lookup(k.as_bytes()), "{k}");
                assert!(s2.lookup(k.as_bytes()).is_some(), "{k}");
            }
        }
    }

    /// Offset 144 is reserved before version 3: a version-2 (or 1) label on a file with a
    /// nonzero `branded` fails open; with it zeroed, a file holding a branded key fails audit.
    #[test]
    fn v2_with_branded_keys_or_reserved_field_fails() {
        let keys = ["abcDEF1", "spring-sale", "go.example.com/spring-sale"];
        for layout in [Layout::Compact, Layout::Paged] {
            let v3 = build(&keys, layout);
            let s = Snapshot::from_bytes(&v3).unwrap();
            s.audit().unwrap();
            assert_eq!(s.branded(), 1);
            let v2 = patch(&v3, VERSION_AT, &2u32.to_le_bytes());
            let err = Snapshot::from_vec(v2.clone()).unwrap_err();
            assert!(
                matches!(
                    err,
                    SnapshotError::BadField {
                        field: "reserved",
                        value: 1,
                        ..
                    }
                ),
                "{err}"
            );
            let v2 = patch(&v2, BRANDED_AT, &0u64.to_le_bytes());
            let s = Snapshot::from_vec(v2).unwrap();
            s.verify().unwrap();
            let err = s.audit().unwrap_err().to_string();
            assert!(err.contains("versions 1 and 2 have no domains"), "{err}");
        }
        // A default-domain file labelled 2 with any nonzero reserved value: refused.
        let v2 = patch(
            &build(&DEFAULT_KEYS, Layout::Compact),
            VERSION_AT,
            &2u32.to_le_bytes(),
        );
        for value in [1u64, 6, u64::MAX] {
            let f = patch(&v2, BRANDED_AT, &value.to_le_bytes());
            assert!(matches!(
                Snapshot::from_vec(f),
                Err(SnapshotError::BadField {
                    field: "reserved",
                    ..
                })
            ));
        }
    }

    /// Version 3's `branded`: more than `links` fails open; a count that is in range but
    /// wrong fails audit.
    #[test]
    fn v3_branded_count_is_checked() {
        let keys = ["abcDEF1", "spring-sale", "go.example.com/spring-sale"];
        let v3 = build(&keys, Layout::Paged);
        let err = Snapshot::from_vec(patch(&v3, BRANDED_AT, &4u64.to_le_bytes())).unwrap_err();
        assert!(
            matches!(
                err,
                SnapshotError::BadField {
                    field: "branded",
                    value: 4,
                    ..
                }
            ),
            "{err}"
        );
        for wrong in [0u64, 2, 3] {
            let s = Snapshot::from_vec(patch(&v3, BRANDED_AT, &wrong.to_le_bytes())).unwrap();
            s.verify().unwrap();
            let err = s.audit().unwrap_err().to_string();
            assert!(err.contains("branded count differs"), "{err}");
        }
    }

    /// Links with options of their own, on short and long keys, beside plain ones; each key
    /// with the options it was given (`options_of`), the defaults where `None`.
    fn build_with_options(layout: Layout) -> (Vec<u8>, Vec<(Vec<u8>, LinkOptions)>) {
        let long = format!("{}.{}.example/opt-long-key", "l".repeat(63), "o".repeat(50));
        assert!(long.len() > SHORT_KEY_MAX);
        let options = |status, cache_seconds, forward_query| LinkOptions {
            redirect_status: status,
            cache_seconds,
            forward_query,
            request_precedence: forward_query,
        };
        let links: Vec<(Vec<u8>, LinkOptions)> = vec![
            (b"abcDEF1".to_vec(), options(301, 86_400, false)),
            (b"abcDEF2".to_vec(), LinkOptions::default()),
            (b"no-store-alias".to_vec(), options(307, 0, false)),
            (
                b"go.example.com/spring-sale".to_vec(),
                options(308, 60, true),
            ),
            (b"spring-sale".to_vec(), LinkOptions::default()),
            (long.into_bytes(), options(302, 1, true)),
        ];
        let mut hw = HighWater::new(1, 100).unwrap();
        hw.raise(0, 10).unwrap();
        let meta = SnapshotMeta::new(5, 6, hw)
            .with_hash_seed(11)
            .with_layout(layout);
        let mut w = SnapshotWriter::in_memory(meta).unwrap();
        for (i, (k, o)) in links.iter().enumerate() {
            let expiry = (i % 2 == 0).then_some(i as i64);
            w.add_with_options(k, format!("https://e.example/{i}").as_bytes(), expiry, *o)
                .unwrap();
        }
        (w.seal().unwrap().1, links)
    }

    /// Version 4: every link answers with its own options, short keys and long, through
    /// `lookup` and `lookup_probe`; plain links with the defaults.
    #[test]
    fn options_entries_answer_with_their_options() {
        for layout in [Layout::Compact, Layout::Paged] {
            let (bytes, links) = build_with_options(layout);
            let s = Snapshot::from_vec(bytes).unwrap();
            s.verify().unwrap();
            s.audit().unwrap();
            assert_eq!(s.format_version(), 5);
            for (i, (k, o)) in links.iter().enumerate() {
                let e = s.lookup(k).unwrap();
                assert_eq!(e.options(), *o, "{}", String::from_utf8_lossy(k));
                assert_eq!(e.url(), format!("https://e.example/{i}").as_bytes());
                assert_eq!(e.expires_at_ms(), (i % 2 == 0).then_some(i as i64));
                let probe = s.prefetch(k);
                s.prefetch_entry(probe);
                assert_eq!(s.lookup_probe(k, probe), Some(e));
            }
            for absent in [&b"abcDEF3"[..], b"no-store-alia", b"go.example.com/abcDEF1"] {
                assert_eq!(s.lookup(absent), None);
            }
        }
    }

    /// A file labelled version 3 (or older) with an options entry fails audit; without one, a
    /// version-4 file is its version-3 file but for the version field.
    #[test]
    fn older_versions_refuse_options_entries() {
        for layout in [Layout::Compact, Layout::Paged] {
            let (bytes, links) = build_with_options(layout);
            let v3 = patch(&bytes, VERSION_AT, &3u32.to_le_bytes());
            let s = Snapshot::from_vec(v3).unwrap();
            s.verify().unwrap();
            let err = s.audit().unwrap_err().to_string();
            assert!(
                err.contains("options entry in a file of version 3"),
                "{err}"
            );
            // Lookups on it stay bounded and panic-free (their answers are the crafted file's).
            for (k, _) in &links {
                let _ = s.lookup(k).map(|e| e.options());
            }
            let plain = build(&DEFAULT_KEYS, layout);
            let s = Snapshot::from_vec(patch(&plain, VERSION_AT, &3u32.to_le_bytes())).unwrap();
            s.audit().unwrap();
            for k in DEFAULT_KEYS {
                assert!(s.lookup(k.as_bytes()).unwrap().options().is_default());
            }
        }
    }

    /// An options word rewritten in place: to the defaults' word (not canonical) or to one no
    /// options pack to, audit refuses the file; lookups read the defaults for the latter.
    #[test]
    fn audit_refuses_options_words_no_writer_writes() {
        let (bytes, _) = build_with_options(Layout::Compact);
        // `no-store-alias` (link 2: an expiry, a 22-byte URL): its word follows the key, the
        // one-byte URL length and the expiry.
        let key = b"no-store-alias";
        let at = bytes
            .windows(key.len())
            .position(|w| w == key)
            .expect("the key is in the file");
        let word_at = at + key.len() + 1 + 8;
        let word = LinkOptions {
            redirect_status: 307,
            cache_seconds: 0,
            ..LinkOptions::default()
        }
        .pack()
        .unwrap();
        assert_eq!(bytes[word_at..word_at + 4], word.to_le_bytes());
        let default = LinkOptions::default().pack().unwrap();
        for (bad, why) in [
            (default, "default options"),
            (u32::MAX, "no valid options"),
            (1 << 31, "no valid options"),
            (0x3fff_fff0, "no valid options"),
        ] {
            let mut b = bytes.clone();
            b[word_at..word_at + 4].copy_from_slice(&bad.to_le_bytes());
            let s = Snapshot::from_vec(b).unwrap();
            let err = s.audit().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:#x}: {err}");
            assert!(s.lookup(key).unwrap().options().is_default());
        }
    }

    /// The lookup refuses what no link key is, on any path, without reading the index.
    #[test]
    fn lookup_bounds() {
        let s = Snapshot::from_vec(build(&DEFAULT_KEYS, Layout::Compact)).unwrap();
        for key in [
            &b""[..],
            &[b'a'; MAX_KEY_LEN + 1],
            &[b'a'; 383],
            &[b'a'; 1000],
        ] {
            assert_eq!(s.lookup(key), None);
            assert_eq!(s.lookup_probe(key, s.prefetch(key)), None);
        }
    }
}
