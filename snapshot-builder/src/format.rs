//! Format versions 1 to 5, in code: the header, the index slot word, the entry and the hash.
//! `FORMAT.md` beside this crate is the prose version and the reasons; keep the two in step.

use lasthop_core::{region_range, HighWater, LinkOptions};
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use crate::error::{Section, SnapshotError};
use crate::varint::put_varint21;
use lasthop_core::cursor::Cursor;

/// First eight bytes of every snapshot. The high byte and the trailing `\n` catch 7-bit and
/// newline-mangling transfers, as PNG's magic does.
pub const MAGIC: [u8; 8] = [0x89, b'L', b'H', b'S', b'N', b'A', b'P', b'\n'];
/// The version this writer writes. The reader also reads [`OLDEST_FORMAT_VERSION`] and every
/// version between.
pub const FORMAT_VERSION: u32 = 5;
/// The oldest version this reader reads: an engine upgraded before its control plane keeps
/// serving the snapshots it is sent.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// Largest page (versions 2 to 5): 64 cache lines. A lookup prefetches its key's whole home
/// page, so pages stay a few lines long in practice (the writer sizes them from the data).
pub const MAX_PAGE_LEN: u32 = 4096;
/// Most regions a header may carry (bounds the allocation made on open).
pub const MAX_REGIONS: u32 = 4096;
/// Longest key the writer takes (version 3): the longest link key, a 253-byte domain, the
/// separator and a 64-byte alias ([`lasthop_core::code::KEY_MAX`]). Versions 1 and 2 hold keys
/// of at most 64 bytes.
pub const MAX_KEY_LEN: usize = lasthop_core::code::KEY_MAX;
/// Longest key of versions 1 and 2: the longest alias (they hold default-domain keys only).
pub(crate) const V2_MAX_KEY_LEN: usize = lasthop_core::code::ALIAS_MAX;
/// Longest URL: what a three-byte LEB128 length can say.
pub const MAX_URL_LEN: usize = (1 << 21) - 1;
/// Largest arena (version 1), or pages plus overflow (versions 2 to 5): what the 40-bit slot
/// offset can address (1 TiB).
pub const MAX_ARENA_LEN: u64 = 1 << 40;

/// Length of the fixed part of the header; region marks follow it.
pub(crate) const FIXED_HEADER_LEN: usize = 160;
/// Where the header checksum sits; the checksum covers everything else in the header.
const HEADER_CHECKSUM_AT: usize = 152;
/// Index buckets: eight 8-byte slots, one 64-byte cache line.
pub(crate) const SLOTS_PER_BUCKET: usize = 8;
pub(crate) const BUCKET_LEN: usize = 64;
/// The index starts on a cache-line boundary (the map itself is page-aligned).
pub(crate) const INDEX_ALIGN: u64 = 64;
/// Home buckets may not exceed 2^32 (the bucket is taken from the hash's high 32 bits).
const MAX_HOME_BUCKETS: u64 = 1 << 32;

/// Slot word: bits 0–39 entry offset (v2–v4: from the first page; v1: in the arena), bits 40–62
/// tag, bit 63 (slot 0 only) "continues".
pub(crate) const OFFSET_MASK: u64 = MAX_ARENA_LEN - 1;
const TAG_SHIFT: u32 = 40;
pub(crate) const TAG_MASK: u64 = (1 << 23) - 1;
/// Set on slot 0 of a full bucket when keys whose home is this bucket or earlier spill into
/// the next: a lookup may stop after a bucket without it.
pub(crate) const CONTINUES: u64 = 1 << 63;
/// Entry byte 0: bits 0–6 key length (or [`KEY_LEN_ESCAPE`]), bit 7 "an expiry follows".
pub(crate) const HAS_EXPIRY: u8 = 0x80;
const KEY_LEN_MASK: u8 = 0x7f;
/// Entry byte 0's key length bits when the key is [`KEY_LEN_ESCAPE`] bytes or longer
/// (version 3), or when the entry carries options (version 4, any key length): the next byte
/// holds `len - KEY_LEN_ESCAPE` (0–191 for the writer's keys of 127 to [`MAX_KEY_LEN`] bytes;
/// `audit` refuses 192–254) or [`OPTIONS_MARK`]. Versions 1 and 2 never hold an escape.
pub(crate) const KEY_LEN_ESCAPE: usize = KEY_LEN_MASK as usize;
/// Longest key whose length fits entry byte 0 alone: every default-domain key, and so every
/// version-2 entry, encodes exactly as before.
pub(crate) const SHORT_KEY_MAX: usize = KEY_LEN_ESCAPE - 1;
/// Entry byte 1 after the escape that says "an options entry" (version 4): the key length
/// follows as a u16, and the options word after the expiry. A long-key entry's byte 1 is at
/// most `MAX_KEY_LEN - KEY_LEN_ESCAPE` (191), so no version-3 writer ever wrote this value.
pub(crate) const OPTIONS_MARK: u8 = 0xff;
const _: () = assert!(MAX_KEY_LEN - KEY_LEN_ESCAPE < OPTIONS_MARK as usize);
const _: () = assert!(MAX_KEY_LEN <= u16::MAX as usize);
const _: () = assert!(V2_MAX_KEY_LEN <= SHORT_KEY_MAX);

/// The seeded hash of a key. Bucket and tag use disjoint bits of it.
#[inline]
pub(crate) fn hash(key: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(key, seed)
}

/// The 23-bit tag kept in a slot: never zero, so an all-zero slot means "empty".
#[inline]
pub(crate) fn tag(hash: u64) -> u64 {
    let t = hash & TAG_MASK;
    t | u64::from(t == 0)
}

/// The home bucket: the hash's high 32 bits scaled onto `[0, home_buckets)` (Lemire's
/// multiply-shift, no division). `home_buckets <= 2^32`, so the product fits in 64 bits.
#[inline]
pub(crate) fn home_bucket(hash: u64, home_buckets: u64) -> u64 {
    ((hash >> 32) * home_buckets) >> 32
}

#[inline]
pub(crate) fn slot_word(tag: u64, offset: u64) -> u64 {
    (tag << TAG_SHIFT) | offset
}

#[inline]
pub(crate) fn slot_tag(word: u64) -> u64 {
    (word >> TAG_SHIFT) & TAG_MASK
}

/// How the writer lays out pages: the trade between memory and a hit's memory
/// accesses. Readers take the page length and bucket count from the header, so both layouts
/// are the same format and any reader serves either.
/// Also the `--layout`/`--snapshot-layout` flag's values (`compact`, `paged`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
#[non_exhaustive]
pub enum Layout {
    /// Each page is its bucket line plus room for its keys' entries (5 keys a page on average,
    /// a quarter more room than they need on average): about 95% of entries sit in the page
    /// a lookup prefetches with the bucket, so a cold hit waits for one memory access
    /// instead of two. About 75 bytes a link beyond the URL, 55 more than `Compact`. Faster
    /// on the pure request path; not (yet) on the whole system here (`engine/DESIGN.md`).
    #[value(
        help = "each entry beside its bucket: one memory access per cold hit, ~75 bytes a link beyond the URL"
    )]
    Paged,
    /// The default. Pages are the bucket line alone (6.4 keys a page, a slot load of 0.8) and
    /// every entry is in the overflow, packed: format version 1's 19.5 bytes a link beyond the
    /// URL, and two dependent memory accesses per cold hit.
    #[default]
    #[value(
        help = "entries packed apart from the index: two memory accesses per cold hit, ~20 bytes a link (version 1's density)"
    )]
    Compact,
}

impl Layout {
    /// Home pages for `links` keys: 5 a page (`Paged`), or 6.4 (`Compact`); at least one.
    pub(crate) fn home_pages(self, links: u64) -> u64 {
        match self {
            Layout::Paged => links.div_ceil(PAGED_KEYS_PER_PAGE),
            Layout::Compact => links.saturating_mul(5).div_ceil(32),
        }
        .max(1)
    }

    /// Page length for `links` entries of `entry_bytes` in all: the bucket line plus, when
    /// `Paged`, an inline area of 1.25 average pages' worth of entries in whole lines (at most
    /// [`MAX_PAGE_LEN`]). The slack takes the spread of keys per page (Poisson around 5) and of
    /// URL lengths; what still does not fit goes to the overflow.
    pub(crate) fn page_len(self, links: u64, entry_bytes: u64) -> u32 {
        if self == Layout::Compact {
            return BUCKET_LEN as u32;
        }
        let mean = entry_bytes.checked_div(links).unwrap_or(0);
        let inline = mean
            .saturating_mul(PAGED_KEYS_PER_PAGE * 5)
            .div_ceil(4)
            .next_multiple_of(BUCKET_LEN as u64);
        let page = (BUCKET_LEN as u64).saturating_add(inline);
        u32::try_from(page.min(u64::from(MAX_PAGE_LEN))).unwrap_or(MAX_PAGE_LEN)
    }

    /// About how many file bytes a link with a `key_len`-byte key, a `url_len`-byte URL and
    /// the default options costs in this layout, for budgets: `Compact`, the key and URL plus
    /// 20 (entry head and slot); `Paged`, (key + URL + 10) · 1.4 + 13 (the entry head, the
    /// page's slack and the link's share of the bucket line), which is 170 bytes for 1M
    /// synthetic links of 95-byte URLs, as measured (`lasthop-snapshot synth --count 1000000`
    /// then `inspect`). A key of 127 bytes or more (a long branded domain's) costs one more,
    /// its length's second byte. [`Layout::link_cost_with_options`] for a link with options.
    pub fn link_cost(self, key_len: usize, url_len: usize) -> u64 {
        self.link_cost_with_options(key_len, url_len, &LinkOptions::default())
    }

    /// [`Layout::link_cost`] of a link with `options`: a link with options of its own
    /// (version 4's options entry) costs 7 bytes more than a plain link of a short key, 6 more
    /// than one of a long key (the escape's second byte, the key length as a u16, the options
    /// word); one with the default options costs what `link_cost` says.
    pub fn link_cost_with_options(
        self,
        key_len: usize,
        url_len: usize,
        options: &LinkOptions,
    ) -> u64 {
        let head = if !options.is_default() {
            OPTIONS_HEAD_EXTRA
        } else {
            u64::from(key_len > SHORT_KEY_MAX)
        };
        let entry = (key_len as u64)
            .saturating_add(url_len as u64)
            .saturating_add(head);
        match self {
            Layout::Compact => entry.saturating_add(20),
            Layout::Paged => entry.saturating_add(10).saturating_mul(7).div_ceil(5) + 13,
        }
    }
}

/// What an options entry's head holds beyond a short key's plain one: the escape's second byte,
/// the key length (u16) and the options word (u32).
const OPTIONS_HEAD_EXTRA: u64 = 1 + 2 + 4;

/// Keys per home page in the `Paged` layout (a slot load of 0.625): few enough that most
/// pages' entries fit and few buckets spill, which would cost a second fetch.
const PAGED_KEYS_PER_PAGE: u64 = 5;

pub(crate) fn align_up(x: u64, to: u64) -> Option<u64> {
    x.checked_next_multiple_of(to)
}

/// Encodes the part of an entry before the URL into `out`; returns its length. A plain entry
/// (`options` `None`): `[key_len | HAS_EXPIRY?] [key_len - 127]? [key] [LEB128 url_len]
/// [expires_at_ms i64 LE]?`, the second byte only for keys of 127 bytes or more (then byte 0's
/// length bits are 127). An options entry (version 4, `options` the packed word):
/// `[127 | HAS_EXPIRY?] [0xff] [key_len u16 LE] [key] [LEB128 url_len] [expires_at_ms i64 LE]?
/// [options u32 LE]`.
pub(crate) fn encode_entry_head(
    key: &[u8],
    url_len: usize,
    expires_at_ms: Option<i64>,
    options: Option<u32>,
    out: &mut [u8; ENTRY_HEAD_MAX],
) -> usize {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        if let Some(dst) = out.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        at += bytes.len();
    };
    // 1 <= key.len() <= MAX_KEY_LEN (318) < 127 + 256: checked by the writer before calling.
    let flag = if expires_at_ms.is_some() {
        HAS_EXPIRY
    } else {
        0
    };
    if options.is_some() {
        put(&[KEY_LEN_ESCAPE as u8 | flag, OPTIONS_MARK]);
        put(&(key.len() as u16).to_le_bytes());
    } else if key.len() < KEY_LEN_ESCAPE {
        put(&[key.len() as u8 | flag]);
    } else {
        put(&[
            KEY_LEN_ESCAPE as u8 | flag,
            (key.len() - KEY_LEN_ESCAPE) as u8,
        ]);
    }
    put(key);
    let mut varint = [0u8; 3];
    let n = put_varint21(url_len, &mut varint);
    put(varint.get(..n).unwrap_or(&[]));
    if let Some(e) = expires_at_ms {
        put(&e.to_le_bytes());
    }
    if let Some(word) = options {
        put(&word.to_le_bytes());
    }
    at
}

/// Longest entry head: flag byte, the escape's byte, the u16 key length, 318-byte key, 3-byte
/// URL length, 8-byte expiry, 4-byte options word.
pub(crate) const ENTRY_HEAD_MAX: usize = 4 + MAX_KEY_LEN + 3 + 8 + 4;
/// Longest key length prefix and key: what the writer reads back to compare keys.
pub(crate) const KEY_HEAD_MAX: usize = 4 + MAX_KEY_LEN;

/// One parsed entry, borrowed from the file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawEntry<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) url: &'a [u8],
    pub(crate) expires_at_ms: Option<i64>,
    /// An options entry's word (version 4: [`LinkOptions::pack`]); `None` for a plain entry,
    /// whose link has the default options.
    pub(crate) options: Option<u32>,
}

/// Parses the entry at the front of `bytes` if its key is `want` (compared before the rest is
/// read, so a tag collision costs one short compare). `None` on mismatch or malformed bytes.
///
/// `LONG` says whether `want` is longer than [`SHORT_KEY_MAX`] (the caller knows before its
/// probe loop, so each loop is compiled for one case). A short key's plain entry is byte 0
/// then the key, exactly as in version 2: when byte 0's length bits are the key's length
/// it is parsed here as before. Only when they are not, and say the escape (127, no short
/// key's length), may the entry still be the key's: an options entry (version 4), parsed out of
/// line by [`escaped_entry_if_key`], which also parses every entry of a long key (a long-key
/// entry, or an options entry).
#[inline]
pub(crate) fn entry_if_key<'a, const LONG: bool>(
    bytes: &'a [u8],
    want: &[u8],
) -> Option<RawEntry<'a>> {
    debug_assert_eq!(LONG, want.len() > SHORT_KEY_MAX);
    if LONG {
        return escaped_entry_if_key(bytes, want);
    }
    let mut c = Cursor::new(bytes);
    let first = c.u8().ok()?;
    let len = usize::from(first & KEY_LEN_MASK);
    if len != want.len() {
        if len == KEY_LEN_ESCAPE {
            return escaped_entry_if_key(bytes, want);
        }
        return None;
    }
    let key = c.take(want.len()).ok()?;
    if key != want {
        return None;
    }
    finish_entry(first, key, false, &mut c)
}

/// [`entry_if_key`] for an entry whose byte 0 says the escape: a long-key entry (version 3)
/// or an options entry (version 4), for a key of any length. Out of line, so the short keys'
/// loop stays version 2's.
#[cold]
#[inline(never)]
fn escaped_entry_if_key<'a>(bytes: &'a [u8], want: &[u8]) -> Option<RawEntry<'a>> {
    let mut c = Cursor::new(bytes);
    let first = c.u8().ok()?;
    if usize::from(first & KEY_LEN_MASK) != KEY_LEN_ESCAPE {
        return None;
    }
    let (len, options) = escaped_key_len(&mut c)?;
    if len != want.len() {
        return None;
    }
    let key = c.take(len).ok()?;
    if key != want {
        return None;
    }
    finish_entry(first, key, options, &mut c)
}

/// The key length an escaped entry's next bytes give, and whether it is an options entry:
/// byte 1 [`OPTIONS_MARK`] and a u16 length (version 4), or byte 1 `len - 127` (version 3).
/// `None` when the bytes are missing.
#[inline]
fn escaped_key_len(c: &mut Cursor<'_>) -> Option<(usize, bool)> {
    let second = c.u8().ok()?;
    if second == OPTIONS_MARK {
        Some((usize::from(c.u16().ok()?), true))
    } else {
        Some((KEY_LEN_ESCAPE + usize::from(second), false))
    }
}

/// The key length an entry's first bytes give, and whether it is an options entry. `None`
/// when the escape's bytes are missing.
#[inline]
fn key_len(first: u8, c: &mut Cursor<'_>) -> Option<(usize, bool)> {
    let len = usize::from(first & KEY_LEN_MASK);
    if len == KEY_LEN_ESCAPE {
        escaped_key_len(c)
    } else {
        Some((len, false))
    }
}

/// Parses the entry at the front of `bytes`, whatever its key; also returns the bytes after it.
pub(crate) fn entry_at(bytes: &[u8]) -> Option<(RawEntry<'_>, &[u8])> {
    let mut c = Cursor::new(bytes);
    let first = c.u8().ok()?;
    let (len, options) = key_len(first, &mut c)?;
    let key = c.take(len).ok()?;
    let entry = finish_entry(first, key, options, &mut c)?;
    Some((entry, c.rest()))
}

/// The key of the entry whose head starts `head` (at least the length bytes and the key).
pub(crate) fn entry_key(head: &[u8]) -> Option<&[u8]> {
    let mut c = Cursor::new(head);
    let first = c.u8().ok()?;
    let (len, _) = key_len(first, &mut c)?;
    c.take(len).ok()
}

/// The rest of an entry after its key; `options`: an options entry, whose word follows the
/// expiry (a constant `false` on the short keys' path, where the read folds away).
#[inline]
fn finish_entry<'a>(
    first: u8,
    key: &'a [u8],
    options: bool,
    c: &mut Cursor<'a>,
) -> Option<RawEntry<'a>> {
    // At most three bytes (URLs under 2 MiB), shortest form.
    let url_len = usize::try_from(c.varint(3).ok()?).ok()?;
    let expires_at_ms = if first & HAS_EXPIRY != 0 {
        Some(c.i64().ok()?)
    } else {
        None
    };
    let options = if options { Some(c.u32().ok()?) } else { None };
    let url = c.take(url_len).ok()?;
    Some(RawEntry {
        key,
        url,
        expires_at_ms,
        options,
    })
}

/// What `audit` refuses in an entry that parsed, from its form alone (before its key is
/// classified): a key length no writer writes (the long-key escape says up to 382 bytes,
/// the options entry's u16 up to 65535, and an options entry's key can be empty), an options
/// entry in a file of a version before 4, and an options word that does not unpack or that
/// unpacks to the defaults (a link with the defaults has a plain entry: one form per link).
pub(crate) fn entry_form_problem(version: u32, e: &RawEntry<'_>) -> Option<&'static str> {
    if e.key.len() > MAX_KEY_LEN {
        return Some("key longer than the longest link key (an escaped length no writer writes)");
    }
    let word = e.options?;
    if version < 4 {
        return Some("options entry in a file of version 3 or older");
    }
    if e.key.is_empty() {
        return Some("options entry with an empty key");
    }
    match LinkOptions::unpack(word) {
        None => Some("options word that no valid options pack to"),
        Some(o) if o.is_default() => {
            Some("options entry with the default options (their link's entry is a plain one)")
        }
        Some(_) => None,
    }
}

/// Version 5's legacy set ([`crate::legacy`]): where its blocks start, how many, the distinct
/// keys it was built from, and the xxh3-64 of its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LegacySection {
    /// Where the overflow ends (zeros follow up to `offset`).
    pub(crate) overflow_end: u64,
    pub(crate) offset: u64,
    pub(crate) blocks: u64,
    pub(crate) keys: u64,
    pub(crate) checksum: u64,
}

/// The header, decoded. Field order here is file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) version: u32,
    /// Fixed part plus marks (in version 1 the arena starts here).
    pub(crate) header_len: u32,
    pub(crate) sequence: u64,
    pub(crate) key_id: u32,
    pub(crate) regions: u32,
    pub(crate) reserve: u64,
    pub(crate) hash_seed: u64,
    pub(crate) links: u64,
    pub(crate) aliases: u64,
    pub(crate) expiring: u64,
    pub(crate) url_bytes: u64,
    pub(crate) arena_len: u64,
    pub(crate) index_offset: u64,
    pub(crate) home_buckets: u64,
    pub(crate) total_buckets: u64,
    pub(crate) max_probe: u32,
    /// Versions 2 to 4: the page length (bucket line plus inline entries); zero in version 1.
    pub(crate) page_len: u32,
    pub(crate) file_len: u64,
    pub(crate) arena_checksum: u64,
    pub(crate) index_checksum: u64,
    /// Versions 3 and 4: entries whose key carries a domain (`domain/code`); reserved (zero) in
    /// versions 1 and 2.
    pub(crate) branded: u64,
    /// Absolute counter marks, one per region.
    pub(crate) marks: Vec<u64>,
}

pub(crate) fn header_len_for(regions: u32) -> usize {
    FIXED_HEADER_LEN + 8 * regions as usize
}

fn bad(field: &'static str, value: u64, why: &'static str) -> SnapshotError {
    SnapshotError::BadField { field, value, why }
}

/// xxh3-64 of the header bytes with the checksum field left out.
fn header_checksum(header: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(header.get(..HEADER_CHECKSUM_AT).unwrap_or(&[]));
    h.update(header.get(HEADER_CHECKSUM_AT + 8..).unwrap_or(&[]));
    h.digest()
}

/// Rewrites the header checksum of `file` to match its header (tests that rewrite a field).
#[cfg(test)]
pub(crate) fn reseal_header(file: &mut [u8]) {
    let header_len = file
        .get(12..16)
        .and_then(|b| b.try_into().ok())
        .map_or(FIXED_HEADER_LEN, |b| u32::from_le_bytes(b) as usize)
        .clamp(FIXED_HEADER_LEN, file.len());
    let sum = header_checksum(&file[..header_len]);
    file[HEADER_CHECKSUM_AT..HEADER_CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
}

pub(crate) fn section_checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

impl Header {
    /// The header's bytes, checksum included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(header_len_for(self.regions));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.header_len.to_le_bytes());
        out.extend_from_slice(&self.sequence.to_le_bytes());
        out.extend_from_slice(&self.key_id.to_le_bytes());
        out.extend_from_slice(&self.regions.to_le_bytes());
        for v in [
            self.reserve,
            self.hash_seed,
            self.links,
            self.aliases,
            self.expiring,
            self.url_bytes,
            self.arena_len,
            self.index_offset,
            self.home_buckets,
            self.total_buckets,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.max_probe.to_le_bytes());
        out.extend_from_slice(&self.page_len.to_le_bytes()); // reserved (zero) in version 1
        out.extend_from_slice(&self.file_len.to_le_bytes());
        out.extend_from_slice(&self.arena_checksum.to_le_bytes());
        out.extend_from_slice(&self.index_checksum.to_le_bytes());
        out.extend_from_slice(&self.branded.to_le_bytes()); // reserved (zero) before version 3
        out.extend_from_slice(&0u64.to_le_bytes()); // header checksum, filled below
        debug_assert_eq!(out.len(), FIXED_HEADER_LEN);
        for m in &self.marks {
            out.extend_from_slice(&m.to_le_bytes());
        }
        let sum = header_checksum(&out);
        if let Some(dst) = out.get_mut(HEADER_CHECKSUM_AT..HEADER_CHECKSUM_AT + 8) {
            dst.copy_from_slice(&sum.to_le_bytes());
        }
        out
    }

    /// Decodes and checks the header at the front of `file`: magic, version, exact lengths,
    /// checksum, then every field against the file's real length. After this, every section
    /// range is inside `file` and the layout is the canonical one of the file's version.
    pub(crate) fn decode(file: &[u8]) -> Result<Header, SnapshotError> {
        let actual = file.len() as u64;
        let short = |need: usize| SnapshotError::TooShort {
            len: actual,
            need: need as u64,
        };
        let fixed = file
            .get(..FIXED_HEADER_LEN)
            .ok_or(short(FIXED_HEADER_LEN))?;
        let mut c = Cursor::new(fixed);
        let truncated = |_: lasthop_core::cursor::Truncated| short(FIXED_HEADER_LEN);
        let magic: [u8; 8] = c.array().map_err(truncated)?;
        if magic != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let version = c.u32().map_err(truncated)?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(SnapshotError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let header_len = c.u32().map_err(truncated)?;
        let sequence = c.u64().map_err(truncated)?;
        let key_id = c.u32().map_err(truncated)?;
        let regions = c.u32().map_err(truncated)?;
        if regions == 0 || regions > MAX_REGIONS {
            return Err(bad("regions", regions.into(), "must be 1..=4096"));
        }
        let need = header_len_for(regions);
        if header_len as usize != need {
            return Err(bad(
                "header_len",
                header_len.into(),
                "must be 160 + 8 * regions",
            ));
        }
        let whole = file.get(..need).ok_or(short(need))?;
        let mut u64s = [0u64; 10];
        for v in &mut u64s {
            *v = c.u64().map_err(truncated)?;
        }
        let [reserve, hash_seed, links, aliases, expiring, url_bytes, arena_len, index_offset, home_buckets, total_buckets] =
            u64s;
        let max_probe = c.u32().map_err(truncated)?;
        let page_len = c.u32().map_err(truncated)?;
        let file_len = c.u64().map_err(truncated)?;
        let arena_checksum = c.u64().map_err(truncated)?;
        let index_checksum = c.u64().map_err(truncated)?;
        let branded = c.u64().map_err(truncated)?;
        let stored = c.u64().map_err(truncated)?;
        let computed = header_checksum(whole);
        if stored != computed {
            return Err(SnapshotError::Checksum {
                section: Section::Header,
                stored,
                computed,
            });
        }
        let mut marks_cursor = Cursor::new(whole.get(FIXED_HEADER_LEN..).unwrap_or(&[]));
        let marks = (0..regions)
            .map(|_| marks_cursor.u64().map_err(truncated))
            .collect::<Result<Vec<_>, _>>()?;
        let header = Header {
            version,
            header_len,
            sequence,
            key_id,
            regions,
            reserve,
            hash_seed,
            links,
            aliases,
            expiring,
            url_bytes,
            arena_len,
            index_offset,
            home_buckets,
            total_buckets,
            max_probe,
            page_len,
            file_len,
            arena_checksum,
            index_checksum,
            branded,
            marks,
        };
        if version < 3 && branded != 0 {
            return Err(bad("reserved", branded, "must be zero before version 3"));
        }
        let content_end = match header.legacy_section(file)? {
            Some(legacy) => legacy.overflow_end,
            None => actual,
        };
        header.check_layout(actual, content_end)?;
        Ok(header)
    }

    /// Version 5's legacy set, when the file has one: after the overflow (padded with zeros
    /// to 64) come its blocks, then the trailer (blocks, keys, checksum, magic) at the very end.
    /// `None` when the overflow ends the file (no legacy codes, and every older version).
    pub(crate) fn legacy_section(
        &self,
        file: &[u8],
    ) -> Result<Option<LegacySection>, SnapshotError> {
        if self.version < 5 {
            return Ok(None);
        }
        let actual = file.len() as u64;
        let end = self
            .total_buckets
            .checked_mul(self.page_len.into())
            .and_then(|len| len.checked_add(self.index_offset))
            .and_then(|e| e.checked_add(self.arena_len));
        let Some(end) = end.filter(|&e| e < actual) else {
            // Exactly the overflow's end, or a layout check_layout refuses.
            return Ok(None);
        };
        let fail = |why| bad("legacy", actual, why);
        let trailer_at = actual
            .checked_sub(crate::legacy::TRAILER_LEN as u64)
            .ok_or(fail("no room for the legacy set's trailer"))?;
        let trailer = file
            .get(trailer_at as usize..)
            .ok_or(fail("no room for the legacy set's trailer"))?;
        let mut c = Cursor::new(trailer);
        let (blocks, keys, checksum) = match (c.u64(), c.u64(), c.u64(), c.array::<8>()) {
            (Ok(b), Ok(k), Ok(s), Ok(m)) if m == crate::legacy::TRAILER_MAGIC => (b, k, s),
            _ => return Err(fail("bytes after the overflow that are no legacy set")),
        };
        let offset = align_up(end, INDEX_ALIGN).ok_or(fail("overflows"))?;
        let filter_end = blocks
            .checked_mul(crate::legacy::BLOCK_LEN as u64)
            .and_then(|len| len.checked_add(offset));
        if blocks == 0 || blocks > 1 << 32 || filter_end != Some(trailer_at) {
            return Err(fail("the legacy set's blocks do not fill it"));
        }
        if keys == 0 || blocks != crate::legacy::blocks_for(keys) {
            return Err(fail("the legacy set's size is not its keys'"));
        }
        let pad = file
            .get(end as usize..offset as usize)
            .ok_or(fail("overflows"))?;
        if pad.iter().any(|&b| b != 0) {
            return Err(fail("the padding before the legacy set is not zero"));
        }
        Ok(Some(LegacySection {
            overflow_end: end,
            offset,
            blocks,
            keys,
            checksum,
        }))
    }

    /// Every offset, length and count against the file length and each other; the sections
    /// before the legacy set end at `content_end` (the file's end without one).
    fn check_layout(&self, actual: u64, content_end: u64) -> Result<(), SnapshotError> {
        if self.file_len != actual {
            return Err(SnapshotError::FileLength {
                recorded: self.file_len,
                actual,
            });
        }
        if self.home_buckets == 0 || self.home_buckets > MAX_HOME_BUCKETS {
            return Err(bad("home_buckets", self.home_buckets, "must be 1..=2^32"));
        }
        if self.total_buckets < self.home_buckets
            || self.total_buckets - self.home_buckets > u64::from(self.max_probe)
        {
            return Err(bad(
                "total_buckets",
                self.total_buckets,
                "must be home_buckets plus at most max_probe spill buckets",
            ));
        }
        if self.version == 1 {
            self.check_v1_sections(actual)?;
        } else {
            self.check_v2_sections(content_end)?;
        }
        if u64::from(self.max_probe) >= self.total_buckets {
            return Err(bad(
                "max_probe",
                self.max_probe.into(),
                "must be below total_buckets",
            ));
        }
        if self.links > self.total_buckets.saturating_mul(SLOTS_PER_BUCKET as u64) {
            return Err(bad("links", self.links, "more than the index has slots"));
        }
        if self.aliases > self.links {
            return Err(bad("aliases", self.aliases, "more than links"));
        }
        if self.branded > self.links {
            return Err(bad("branded", self.branded, "more than links"));
        }
        if self.expiring > self.links {
            return Err(bad("expiring", self.expiring, "more than links"));
        }
        if self.url_bytes > actual {
            return Err(bad("url_bytes", self.url_bytes, "more than the file holds"));
        }
        for (region, &mark) in (0u32..).zip(&self.marks) {
            let range = region_range(region, self.regions)
                .map_err(|_| bad("regions", self.regions.into(), "no such region"))?;
            if mark < range.start || mark > range.end {
                return Err(bad("high_water", mark, "mark outside its region's range"));
            }
        }
        Ok(())
    }

    /// Version 1: header, arena, zero padding to 64, index (`total_buckets` lines) to the end.
    fn check_v1_sections(&self, actual: u64) -> Result<(), SnapshotError> {
        if self.page_len != 0 {
            return Err(bad(
                "reserved",
                self.page_len.into(),
                "must be zero in version 1",
            ));
        }
        let arena_end = u64::from(self.header_len)
            .checked_add(self.arena_len)
            .filter(|&end| end <= actual && self.arena_len <= MAX_ARENA_LEN)
            .ok_or(bad(
                "arena_len",
                self.arena_len,
                "runs past the end of the file",
            ))?;
        if Some(self.index_offset) != align_up(arena_end, INDEX_ALIGN) {
            return Err(bad(
                "index_offset",
                self.index_offset,
                "must be the arena's end rounded up to 64",
            ));
        }
        let index_end = self
            .total_buckets
            .checked_mul(BUCKET_LEN as u64)
            .and_then(|len| len.checked_add(self.index_offset));
        if index_end != Some(actual) {
            return Err(bad(
                "total_buckets",
                self.total_buckets,
                "index must end exactly at the end of the file",
            ));
        }
        if self.url_bytes > self.arena_len {
            return Err(bad(
                "url_bytes",
                self.url_bytes,
                "more than the arena holds",
            ));
        }
        Ok(())
    }

    /// Versions 2 to 5: header, zero padding to 64, `total_buckets` pages of `page_len`, overflow
    /// (`arena_len`) to `actual` (the file's end, or version 5's legacy set); slot offsets count
    /// from the first page.
    fn check_v2_sections(&self, actual: u64) -> Result<(), SnapshotError> {
        if self.page_len < BUCKET_LEN as u32
            || self.page_len > MAX_PAGE_LEN
            || self.page_len % BUCKET_LEN as u32 != 0
        {
            return Err(bad(
                "page_len",
                self.page_len.into(),
                "must be a multiple of 64 in 64..=4096",
            ));
        }
        if Some(self.index_offset) != align_up(self.header_len.into(), INDEX_ALIGN) {
            return Err(bad(
                "index_offset",
                self.index_offset,
                "must be the header's end rounded up to 64",
            ));
        }
        let pages_end = self
            .total_buckets
            .checked_mul(self.page_len.into())
            .and_then(|len| len.checked_add(self.index_offset));
        let end = pages_end.and_then(|e| e.checked_add(self.arena_len));
        if end != Some(actual) {
            return Err(bad(
                "arena_len",
                self.arena_len,
                "pages and overflow must end exactly at the end of the file",
            ));
        }
        if actual - self.index_offset > MAX_ARENA_LEN {
            return Err(bad(
                "file_len",
                actual,
                "pages and overflow past what a slot offset addresses",
            ));
        }
        Ok(())
    }

    /// The marks as the core type the engine checks codes against.
    pub(crate) fn high_water(&self) -> Result<HighWater, SnapshotError> {
        let mut hw = HighWater::new(self.regions, self.reserve)
            .map_err(|_| bad("regions", self.regions.into(), "not a valid region count"))?;
        for (region, &mark) in (0u32..).zip(&self.marks) {
            hw.raise(region, mark)
                .map_err(|_| bad("regions", self.regions.into(), "not a valid region count"))?;
        }
        Ok(hw)
    }

    /// Start of the arena (right after the header).
    pub(crate) fn arena_offset(&self) -> u64 {
        u64::from(self.header_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        let arena_len = 100;
        let header_len = header_len_for(2) as u64;
        let index_offset = align_up(header_len + arena_len, 64).unwrap();
        // A version-1 layout: header, arena, index.
        Header {
            version: 1,
            header_len: header_len as u32,
            sequence: 42,
            key_id: 0xabcd,
            regions: 2,
            reserve: 1000,
            hash_seed: 7,
            links: 3,
            aliases: 1,
            expiring: 1,
            url_bytes: 60,
            arena_len,
            index_offset,
            home_buckets: 1,
            total_buckets: 1,
            max_probe: 0,
            page_len: 0,
            file_len: index_offset + 64,
            arena_checksum: 1,
            index_checksum: 2,
            branded: 0,
            marks: vec![10, region_range(1, 2).unwrap().start + 5],
        }
    }

    fn file_for(h: &Header) -> Vec<u8> {
        let mut file = h.encode();
        file.resize(h.file_len as usize, 0);
        file
    }

    #[test]
    fn header_round_trip() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(bytes.len(), header_len_for(2));
        assert_eq!(Header::decode(&file_for(&h)).unwrap(), h);
        let hw = h.high_water().unwrap();
        assert_eq!(hw.marks(), &h.marks[..]);
        assert_eq!(hw.reserve(), 1000);
    }

    #[test]
    fn header_rejections() {
        let h = sample();
        let file = file_for(&h);
        assert!(matches!(
            Header::decode(&file[..100]),
            Err(SnapshotError::TooShort { .. })
        ));
        let mut f = file.clone();
        f[0] ^= 1;
        assert!(matches!(Header::decode(&f), Err(SnapshotError::BadMagic)));
        let mut f = file.clone();
        f[8] = 6;
        assert!(matches!(
            Header::decode(&f),
            Err(SnapshotError::UnsupportedVersion { found: 6, .. })
        ));
        // Version 1 with a page length: the field is reserved there.
        let mut paged_v1 = h.clone();
        paged_v1.page_len = 64;
        assert!(matches!(
            Header::decode(&file_for(&paged_v1)),
            Err(SnapshotError::BadField {
                field: "reserved",
                ..
            })
        ));
        let mut f = file.clone();
        f[20] ^= 1; // sequence
        assert!(matches!(
            Header::decode(&f),
            Err(SnapshotError::Checksum {
                section: Section::Header,
                ..
            })
        ));
        let mut f = file.clone();
        f.push(0);
        assert!(matches!(
            Header::decode(&f),
            Err(SnapshotError::FileLength { .. })
        ));
        // A self-consistent header (checksum recomputed) with a bad layout field.
        let mut bad_index = h.clone();
        bad_index.index_offset += 64;
        assert!(matches!(
            Header::decode(&file_for(&bad_index)),
            Err(SnapshotError::BadField { .. })
        ));
        let mut bad_mark = h.clone();
        bad_mark.marks[0] = region_range(1, 2).unwrap().end;
        assert!(matches!(
            Header::decode(&file_for(&bad_mark)),
            Err(SnapshotError::BadField {
                field: "high_water",
                ..
            })
        ));
    }

    /// A version-2 layout of `sample`'s counts (the pages right after the header).
    fn sample_v(version: u32) -> Header {
        let mut h = sample();
        h.version = version;
        h.page_len = 64;
        h.arena_len = 100;
        h.index_offset = align_up(h.header_len.into(), 64).unwrap();
        h.file_len = h.index_offset + 64 + h.arena_len;
        h
    }

    /// Offset 144: reserved (zero) in versions 1 and 2, `branded` in version 3, at most
    /// `links`.
    #[test]
    fn branded_field() {
        for version in [2, 3] {
            assert_eq!(
                Header::decode(&file_for(&sample_v(version))).unwrap(),
                sample_v(version)
            );
        }
        let mut v3 = sample_v(3);
        v3.branded = v3.links;
        assert_eq!(Header::decode(&file_for(&v3)).unwrap().branded, 3);
        v3.branded = v3.links + 1;
        assert!(matches!(
            Header::decode(&file_for(&v3)),
            Err(SnapshotError::BadField {
                field: "branded",
                ..
            })
        ));
        // Versions 1 and 2 still refuse a nonzero reserved u64, whatever the counts.
        for mut h in [sample(), sample_v(2)] {
            h.branded = 1;
            assert!(
                matches!(
                    Header::decode(&file_for(&h)),
                    Err(SnapshotError::BadField {
                        field: "reserved",
                        value: 1,
                        ..
                    })
                ),
                "version {}",
                h.version
            );
        }
    }

    /// Version 3's escape: keys below 127 bytes encode as in version 2 (byte 0 alone), longer
    /// ones with 127 in byte 0 and the rest of the length in byte 1; each decodes only as
    /// itself.
    #[test]
    fn long_key_entries() {
        let url = b"https://example.com/long";
        let key_of = |len: usize| {
            let mut k = b"a.example/".to_vec();
            k.resize(len, b'x');
            k
        };
        let lens = [7, 64, SHORT_KEY_MAX, KEY_LEN_ESCAPE, 128, 200, MAX_KEY_LEN];
        for &len in &lens {
            let key = key_of(len);
            for expiry in [None, Some(9)] {
                let mut head = [0u8; ENTRY_HEAD_MAX];
                let n = encode_entry_head(&key, url.len(), expiry, None, &mut head);
                let long = len > SHORT_KEY_MAX;
                let flag = if expiry.is_some() { HAS_EXPIRY } else { 0 };
                assert_eq!(
                    n,
                    1 + usize::from(long) + len + 1 + 8 * usize::from(expiry.is_some())
                );
                if long {
                    assert_eq!(head[..2], [0x7f | flag, (len - 127) as u8], "{len}");
                } else {
                    assert_eq!(head[0], len as u8 | flag, "{len}");
                }
                let mut bytes = head[..n].to_vec();
                bytes.extend_from_slice(url);
                let found = if long {
                    entry_if_key::<true>(&bytes, &key)
                } else {
                    entry_if_key::<false>(&bytes, &key)
                };
                let e = found.unwrap();
                assert_eq!(
                    (e.key, e.url, e.expires_at_ms, e.options),
                    (&key[..], &url[..], expiry, None)
                );
                let (e, rest) = entry_at(&bytes).unwrap();
                assert_eq!((e.key, rest), (&key[..], &[][..]));
                assert_eq!(entry_form_problem(3, &e), None);
                assert_eq!(entry_key(&bytes[..n]), Some(&key[..]));
                // No other length's key matches it.
                for &other in lens.iter().filter(|&&o| o != len) {
                    let other = key_of(other);
                    let m = if other.len() > SHORT_KEY_MAX {
                        entry_if_key::<true>(&bytes, &other)
                    } else {
                        entry_if_key::<false>(&bytes, &other)
                    };
                    assert!(m.is_none(), "{len} found as {}", other.len());
                }
                for cut in 0..bytes.len() {
                    assert!(entry_at(&bytes[..cut]).is_none(), "{len} cut at {cut}");
                }
            }
        }
        // The longest length the escape can say (255 is version 4's options mark), though
        // the writer stops at MAX_KEY_LEN and audit refuses the rest.
        let mut bytes = vec![0x7f, 254];
        bytes.extend_from_slice(&[b'k'; 381]);
        bytes.push(0);
        let (e, _) = entry_at(&bytes).unwrap();
        assert_eq!(e.key.len(), 381);
        assert!(entry_form_problem(4, &e).is_some());
        for second in (MAX_KEY_LEN - KEY_LEN_ESCAPE + 1) as u8..OPTIONS_MARK {
            let len = KEY_LEN_ESCAPE + usize::from(second);
            let mut bytes = vec![0x7f, second];
            bytes.extend_from_slice(&vec![b'k'; len]);
            bytes.push(0);
            let (e, _) = entry_at(&bytes).unwrap();
            assert_eq!(e.key.len(), len);
            assert!(
                entry_form_problem(4, &e).is_some_and(|why| why.contains("longer")),
                "{second}"
            );
        }
    }

    fn packed(status: u16, cache_seconds: u32, forward: bool, request: bool) -> u32 {
        LinkOptions {
            redirect_status: status,
            cache_seconds,
            forward_query: forward,
            request_precedence: request,
        }
        .pack()
        .unwrap()
    }

    /// Version 4's options entry: the escape, the mark, a u16 length, the key, the URL length,
    /// the expiry, the options word; for every key length, parsed back exactly, found by its
    /// key on the short keys' path (through the escape) and the long keys', and by no other.
    #[test]
    fn options_entries() {
        let url = b"https://example.com/options";
        let key_of = |len: usize| {
            let mut k = b"a.example/".to_vec();
            k.resize(len, b'x');
            k
        };
        let word = packed(301, 86_400, true, false);
        let lens = [1, 7, 64, SHORT_KEY_MAX, KEY_LEN_ESCAPE, 200, MAX_KEY_LEN];
        for &len in &lens {
            let key = key_of(len);
            for expiry in [None, Some(-9)] {
                let mut head = [0u8; ENTRY_HEAD_MAX];
                let n = encode_entry_head(&key, url.len(), expiry, Some(word), &mut head);
                let flag = if expiry.is_some() { HAS_EXPIRY } else { 0 };
                assert_eq!(n, 4 + len + 1 + 8 * usize::from(expiry.is_some()) + 4);
                assert_eq!(head[..4], [0x7f | flag, 0xff, len as u8, (len >> 8) as u8]);
                assert_eq!(head[n - 4..n], word.to_le_bytes());
                // 7 bytes more than the plain entry of a short key, 6 more than a long key's.
                let mut plain = [0u8; ENTRY_HEAD_MAX];
                let m = encode_entry_head(&key, url.len(), expiry, None, &mut plain);
                assert_eq!(n - m, if len > SHORT_KEY_MAX { 6 } else { 7 });
                let mut bytes = head[..n].to_vec();
                bytes.extend_from_slice(url);
                let found = if len > SHORT_KEY_MAX {
                    entry_if_key::<true>(&bytes, &key)
                } else {
                    entry_if_key::<false>(&bytes, &key)
                };
                let e = found.unwrap();
                assert_eq!(
                    (e.key, e.url, e.expires_at_ms, e.options),
                    (&key[..], &url[..], expiry, Some(word))
                );
                let (e, rest) = entry_at(&bytes).unwrap();
                assert_eq!((e.key, e.options, rest), (&key[..], Some(word), &[][..]));
                assert_eq!(entry_key(&bytes[..4 + len]), Some(&key[..]));
                assert_eq!(entry_form_problem(4, &e), None);
                assert_eq!(
                    entry_form_problem(3, &e),
                    Some("options entry in a file of version 3 or older")
                );
                for &other in lens.iter().filter(|&&o| o != len) {
                    let other = key_of(other);
                    let m = if other.len() > SHORT_KEY_MAX {
                        entry_if_key::<true>(&bytes, &other)
                    } else {
                        entry_if_key::<false>(&bytes, &other)
                    };
                    assert!(m.is_none(), "{len} found as {}", other.len());
                }
                let mut near = key.clone();
                *near.last_mut().unwrap() ^= 1;
                assert!(entry_at(&bytes).is_some());
                if len > SHORT_KEY_MAX {
                    assert!(entry_if_key::<true>(&bytes, &near).is_none());
                } else {
                    assert!(entry_if_key::<false>(&bytes, &near).is_none());
                }
                for cut in 0..bytes.len() {
                    assert!(entry_at(&bytes[..cut]).is_none(), "{len} cut at {cut}");
                    assert!(entry_key(&bytes[..cut.min(3)]).is_none());
                }
            }
        }
    }

    /// What audit refuses in an options entry's own bytes: a word no options pack to, the
    /// defaults' word (one form per link), a key length of 0 or past the longest link key.
    #[test]
    fn options_entry_problems() {
        let entry = |key: &[u8], word: u32| {
            let mut bytes = vec![0x7f, 0xff];
            bytes.extend_from_slice(&(key.len() as u16).to_le_bytes());
            bytes.extend_from_slice(key);
            bytes.push(1);
            bytes.extend_from_slice(&word.to_le_bytes());
            bytes.push(b'u');
            bytes
        };
        let problem = |bytes: &[u8]| entry_form_problem(4, &entry_at(bytes).unwrap().0);
        assert_eq!(
            problem(&entry(b"abcDEF1", packed(308, 300, false, false))),
            None
        );
        assert_eq!(
            problem(&entry(b"abcDEF1", packed(302, 0, false, false))),
            None
        );
        let default = LinkOptions::default().pack().unwrap();
        assert!(
            problem(&entry(b"abcDEF1", default)).is_some_and(|why| why.contains("default options"))
        );
        for bad in [
            u32::MAX,
            1 << 30,
            (lasthop_core::options::CACHE_SECONDS_MAX + 1) << 4,
        ] {
            assert!(LinkOptions::unpack(bad).is_none());
            assert!(
                problem(&entry(b"abcDEF1", bad)).is_some_and(|why| why.contains("no valid")),
                "{bad:#x}"
            );
        }
        assert!(problem(&entry(b"", packed(301, 1, false, false)))
            .is_some_and(|why| why.contains("empty key")));
        let long = vec![b'k'; MAX_KEY_LEN + 1];
        assert!(problem(&entry(&long, packed(301, 1, false, false)))
            .is_some_and(|why| why.contains("longer")));
        assert!(problem(&entry(&long[1..], packed(301, 1, false, false))).is_none());
    }

    #[test]
    fn entry_encoding() {
        let mut head = [0u8; ENTRY_HEAD_MAX];
        let url = b"https://example.com/x";
        let n = encode_entry_head(b"abcDEF1", url.len(), Some(-3), None, &mut head);
        assert_eq!(n, 1 + 7 + 1 + 8);
        let mut bytes = head[..n].to_vec();
        bytes.extend_from_slice(url);
        bytes.push(0xff);
        let e = entry_if_key::<false>(&bytes, b"abcDEF1").unwrap();
        assert_eq!(e.url, url);
        assert_eq!(e.expires_at_ms, Some(-3));
        assert!(entry_if_key::<false>(&bytes, b"abcDEF2").is_none());
        assert!(entry_if_key::<false>(&bytes, b"abcDEF").is_none());
        let (e, rest) = entry_at(&bytes).unwrap();
        assert_eq!(e.key, b"abcDEF1");
        assert_eq!(rest, &[0xff]);
        for cut in 0..bytes.len() - 1 {
            assert!(
                entry_if_key::<false>(&bytes[..cut], b"abcDEF1").is_none(),
                "{cut}"
            );
        }
    }

    #[test]
    fn slot_bits() {
        let w = slot_word(tag(u64::MAX), OFFSET_MASK);
        assert_eq!(w & OFFSET_MASK, OFFSET_MASK);
        assert_eq!(slot_tag(w), TAG_MASK);
        assert_eq!(w & CONTINUES, 0);
        assert_eq!(tag(1 << 23), 1, "a zero tag becomes one");
        assert_eq!(home_bucket(u64::MAX, 1 << 32), (1 << 32) - 1);
        assert_eq!(home_bucket(0, 5), 0);
        assert_eq!(Layout::Compact.home_pages(0), 1);
        assert_eq!(Layout::Compact.home_pages(10_000_000), 1_562_500);
        assert_eq!(Layout::Paged.home_pages(0), 1);
        assert_eq!(Layout::Paged.home_pages(10_000_000), 2_000_000);
        assert_eq!(Layout::Compact.page_len(1000, 100_000), 64);
        // 100-byte entries: 5 a page need 500 bytes, 625 with the slack, 640 in lines.
        assert_eq!(Layout::Paged.page_len(1000, 100_000), 64 + 640);
        assert_eq!(Layout::Paged.page_len(0, 0), 64);
        assert_eq!(Layout::Paged.page_len(1, 1 << 21), MAX_PAGE_LEN);
        assert_eq!(Layout::Compact.link_cost(7, 95), 122);
        assert_eq!(Layout::Paged.link_cost(7, 95), 170);
        // A key past 126 bytes adds its length's second byte.
        assert_eq!(Layout::Compact.link_cost(126, 95), 241);
        assert_eq!(Layout::Compact.link_cost(127, 95), 243);
        // Options: 7 bytes more for a short key, 6 for a long one; the defaults, none.
        let options = LinkOptions {
            redirect_status: 301,
            ..LinkOptions::default()
        };
        let default = LinkOptions::default();
        assert_eq!(Layout::Compact.link_cost_with_options(7, 95, &default), 122);
        assert_eq!(Layout::Compact.link_cost_with_options(7, 95, &options), 129);
        assert_eq!(
            Layout::Compact.link_cost_with_options(127, 95, &options),
            249
        );
        assert_eq!(Layout::Paged.link_cost_with_options(7, 95, &default), 170);
        assert_eq!(Layout::Paged.link_cost_with_options(7, 95, &options), 180);
    }
}
