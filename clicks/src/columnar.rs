//! The archive's Parquet form: one row per event, one typed column per field of
//! [`lasthop_core::click::ArchivedClick`] (`core/EVENTS.md`, "The archive"), zstd, row groups
//! of [`ROW_GROUP`] rows, dictionary encoding where it pays (code, domain, pop, user agent).
//!
//! Written with the `parquet` crate's column writers and read with its column readers, without
//! Arrow (a tenth of the build, and the sink needs no record batches). Every row read back is
//! re-encoded and decoded as a binary event, so an object is checked by the same rules as a spool
//! frame; a file that is not Parquet, or not ours, or a row that fails them, is an error, never a
//! panic.

use std::sync::Arc;

use bytes::Bytes;
use lasthop_core::click::{ClickEvent, EventId, Method, Net, Protocol, MAX_EVENT_LEN};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::reader::{get_typed_column_reader, ColumnReader};
use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DataType, FixedLenByteArray, FixedLenByteArrayType,
    Int32Type, Int64Type,
};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

/// Rows a row group holds (the writer's memory bound per open object, before compression).
pub const ROW_GROUP: usize = 65_536;

/// The schema, in Parquet's message syntax. Names are the archive line's (`core/EVENTS.md`).
pub const SCHEMA: &str = "
message click {
  required int32 v (INTEGER(8,false));
  required fixed_len_byte_array(16) id;
  required int64 t (TIMESTAMP(MILLIS,true));
  required binary code (STRING);
  optional binary d (STRING);
  required binary pop (STRING);
  optional binary cc (STRING);
  required binary m (STRING);
  required boolean tls;
  required boolean pf;
  required binary proto (STRING);
  required boolean early;
  required int64 vis (INTEGER(64,false));
  optional binary net (STRING);
  required binary ua (STRING);
  required binary rh (STRING);
}";

/// The columns, in schema order.
const COLUMNS: [&str; 16] = [
    "v", "id", "t", "code", "d", "pop", "cc", "m", "tls", "pf", "proto", "early", "vis", "net",
    "ua", "rh",
];

/// The footer's key-value entry `LEN:CRC`: the CRC-32 (hex) of the first LEN bytes, the row
/// groups (the page indexes and the footer follow them). The
/// `parquet` crate neither writes page checksums nor survives every damaged page (some decoders
/// assert), so a reader checks the whole body before decoding a page of it; the footer itself
/// is checked against the block before it ([`FOOTER_SUM_MAGIC`]) before it is decoded.
pub const CRC_KEY: &str = "lasthop.crc32";

/// Why an object could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ColumnarError {
    /// The Parquet library refused (a file that is not Parquet, a torn one, a write error).
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A Parquet file whose columns are not the archive's.
    #[error("not a click archive object: {0}")]
    Schema(String),
    /// The body does not match the footer's checksum (or has none).
    #[error("damaged object: {0}")]
    Damaged(&'static str),
    /// A row that is not a valid event.
    #[error("row {row}: {reason}")]
    Row {
        /// Its index in the file.
        row: u64,
        /// What is wrong.
        reason: String,
    },
}

fn schema() -> Arc<Type> {
    // The schema is a constant; a test parses it.
    Arc::new(parquet::schema::parser::parse_message_type(SCHEMA).unwrap_or_else(|_| unreachable!()))
}

fn properties() -> Arc<WriterProperties> {
    let level = ZstdLevel::try_new(3).unwrap_or_default();
    Arc::new(
        WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_compression(Compression::ZSTD(level))
            .set_max_row_group_row_count(Some(ROW_GROUP))
            .set_statistics_enabled(EnabledStatistics::Chunk)
            // Random per event: a dictionary only costs.
            .set_column_dictionary_enabled("id".into(), false)
            .set_column_dictionary_enabled("vis".into(), false)
            .set_column_encoding("t".into(), Encoding::DELTA_BINARY_PACKED)
            .set_created_by(concat!("lasthop-clicks ", env!("CARGO_PKG_VERSION")).into())
            .build(),
    )
}

/// One row group's worth of events, column by column.
#[derive(Debug, Default)]
struct Columns {
    v: Vec<i32>,
    id: Vec<FixedLenByteArray>,
    t: Vec<i64>,
    code: Vec<ByteArray>,
    d: Vec<ByteArray>,
    d_def: Vec<i16>,
    pop: Vec<ByteArray>,
    cc: Vec<ByteArray>,
    cc_def: Vec<i16>,
    m: Vec<ByteArray>,
    tls: Vec<bool>,
    pf: Vec<bool>,
    proto: Vec<ByteArray>,
    early: Vec<bool>,
    vis: Vec<i64>,
    net: Vec<ByteArray>,
    net_def: Vec<i16>,
    ua: Vec<ByteArray>,
    rh: Vec<ByteArray>,
}

fn text(s: &str) -> ByteArray {
    ByteArray::from(Bytes::copy_from_slice(s.as_bytes()))
}

fn method(m: Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
    }
}

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::H1 => "h1",
        Protocol::H2 => "h2",
        Protocol::H3 => "h3",
    }
}

impl Columns {
    fn len(&self) -> usize {
        self.v.len()
    }

    fn push(&mut self, e: &ClickEvent<'_>) {
        self.v.push(i32::from(e.version()));
        self.id
            .push(FixedLenByteArray::from(e.id.0.to_be_bytes().to_vec()));
        self.t.push(i64::try_from(e.at_ms).unwrap_or(i64::MAX));
        self.code.push(text(e.code));
        match e.branded() {
            Some(d) => {
                self.d.push(text(d));
                self.d_def.push(1);
            }
            None => self.d_def.push(0),
        }
        self.pop.push(text(e.pop));
        match e.country_str() {
            Some(c) => {
                self.cc.push(text(c));
                self.cc_def.push(1);
            }
            None => self.cc_def.push(0),
        }
        self.m.push(ByteArray::from(method(e.method)));
        self.tls.push(e.tls);
        self.pf.push(e.prefetch);
        self.proto.push(ByteArray::from(protocol(e.protocol)));
        self.early.push(e.early);
        self.vis.push(e.visitor as i64);
        match e.net {
            Some(n) => {
                self.net.push(ByteArray::from(n.to_string().into_bytes()));
                self.net_def.push(1);
            }
            None => self.net_def.push(0),
        }
        self.ua.push(text(e.user_agent));
        self.rh.push(text(e.referrer_host));
    }

    fn clear(&mut self) {
        *self = Columns::default();
    }
}

/// Writes one object (a Parquet file in memory), row group by row group.
pub struct ObjectWriter {
    writer: SerializedFileWriter<Vec<u8>>,
    columns: Columns,
    rows: u64,
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

fn write<T: DataType>(
    rg: &mut parquet::file::writer::SerializedRowGroupWriter<'_, Vec<u8>>,
    values: &[T::T],
    def: Option<&[i16]>,
) -> Result<(), ColumnarError> {
    let mut col = rg
        .next_column()?
        .ok_or_else(|| ColumnarError::Schema("fewer columns than values".into()))?;
    col.typed::<T>().write_batch(values, def, None)?;
    col.close()?;
    Ok(())
}

impl ObjectWriter {
    /// An empty object.
    pub fn new() -> Result<ObjectWriter, ColumnarError> {
        Ok(ObjectWriter {
            writer: SerializedFileWriter::new(Vec::new(), schema(), properties())?,
            columns: Columns::default(),
            rows: 0,
        })
    }

    /// Adds one event.
    pub fn push(&mut self, e: &ClickEvent<'_>) -> Result<(), ColumnarError> {
        self.columns.push(e);
        self.rows += 1;
        if self.columns.len() >= ROW_GROUP {
            self.flush_group()?;
        }
        Ok(())
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Compressed bytes so far (closed row groups).
    pub fn bytes(&self) -> usize {
        self.writer.bytes_written()
    }

    fn flush_group(&mut self) -> Result<(), ColumnarError> {
        if self.columns.len() == 0 {
            return Ok(());
        }
        let c = &self.columns;
        let mut rg = self.writer.next_row_group()?;
        write::<Int32Type>(&mut rg, &c.v, None)?;
        write::<FixedLenByteArrayType>(&mut rg, &c.id, None)?;
        write::<Int64Type>(&mut rg, &c.t, None)?;
        write::<ByteArrayType>(&mut rg, &c.code, None)?;
        write::<ByteArrayType>(&mut rg, &c.d, Some(&c.d_def))?;
        write::<ByteArrayType>(&mut rg, &c.pop, None)?;
        write::<ByteArrayType>(&mut rg, &c.cc, Some(&c.cc_def))?;
        write::<ByteArrayType>(&mut rg, &c.m, None)?;
        write::<BoolType>(&mut rg, &c.tls, None)?;
        write::<BoolType>(&mut rg, &c.pf, None)?;
        write::<ByteArrayType>(&mut rg, &c.proto, None)?;
        write::<BoolType>(&mut rg, &c.early, None)?;
        write::<Int64Type>(&mut rg, &c.vis, None)?;
        write::<ByteArrayType>(&mut rg, &c.net, Some(&c.net_def))?;
        write::<ByteArrayType>(&mut rg, &c.ua, None)?;
        write::<ByteArrayType>(&mut rg, &c.rh, None)?;
        rg.close()?;
        self.columns.clear();
        Ok(())
    }

    /// The finished file, its row groups' bytes checksummed in the footer ([`CRC_KEY`]) and
    /// the footer in the block before it.
    pub fn finish(mut self) -> Result<Vec<u8>, ColumnarError> {
        self.flush_group()?;
        self.writer
            .flush()
            .map_err(|e| ColumnarError::Parquet(e.into()))?;
        let body = self.writer.inner();
        let value = format!("{}:{:08x}", body.len(), crc32fast::hash(body));
        self.writer
            .append_key_value_metadata(KeyValue::new(CRC_KEY.into(), value));
        with_footer_sum(self.writer.into_inner()?)
    }
}

/// `events` (binary, back to back) as one Parquet file.
pub fn encode(events: &[ClickEvent<'_>]) -> Result<Vec<u8>, ColumnarError> {
    let mut w = ObjectWriter::new()?;
    for e in events {
        w.push(e)?;
    }
    w.finish()
}

/// One column of a row group, read whole.
struct Read<T: DataType> {
    values: Vec<T::T>,
    def: Vec<i16>,
}

fn read_column<T: DataType>(
    reader: ColumnReader,
    rows: usize,
    optional: bool,
) -> Result<Read<T>, ColumnarError> {
    let mut typed = get_typed_column_reader::<T>(reader);
    let mut values = Vec::with_capacity(rows);
    let mut def = Vec::with_capacity(if optional { rows } else { 0 });
    let mut got = 0;
    while got < rows {
        let (records, _, _) =
            typed.read_records(rows - got, optional.then_some(&mut def), None, &mut values)?;
        if records == 0 {
            break;
        }
        got += records;
    }
    if got != rows {
        return Err(ColumnarError::Schema(format!(
            "a column holds {got} rows of {rows}"
        )));
    }
    Ok(Read { values, def })
}

/// Values of an optional column, row by row.
struct Optional<'a, T> {
    values: std::slice::Iter<'a, T>,
    def: std::slice::Iter<'a, i16>,
}

impl<'a, T> Optional<'a, T> {
    fn new(r: &'a Read<impl DataType<T = T>>) -> Self {
        Optional {
            values: r.values.iter(),
            def: r.def.iter(),
        }
    }

    fn next(&mut self) -> Option<&'a T> {
        match self.def.next() {
            Some(1) => self.values.next(),
            _ => None,
        }
    }
}

fn utf8(b: &ByteArray) -> Result<&str, &'static str> {
    std::str::from_utf8(b.data()).map_err(|_| "not UTF-8")
}

/// What reading an object found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ObjectRead {
    /// Rows that are valid events (handed over).
    pub rows: u64,
    /// Row groups read.
    pub row_groups: u64,
}

/// Calls `event` with every row of the Parquet file `bytes`, checked as a binary event (its
/// bytes, as [`ClickEvent::encode`] writes them). Fails on the first row or part that is not
/// valid: an object is written whole or not at all, so a bad one is skipped whole.
pub fn read(bytes: Bytes, mut event: impl FnMut(&[u8])) -> Result<ObjectRead, ColumnarError> {
    // The checksum keeps damaged pages from the decoders; anything the library still asserts
    // on (a damaged footer that parses) is contained here and reported as damage.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_checked(bytes, &mut event)
    }))
    .unwrap_or(Err(ColumnarError::Damaged("the parquet decoder failed")))
}

/// [`read`] without its `catch_unwind`: for the fuzz target, so that a panic in the `parquet`
/// crate our checks let through is a crash to fix, not a contained error.
#[doc(hidden)]
pub fn read_unguarded(
    bytes: Bytes,
    mut event: impl FnMut(&[u8]),
) -> Result<ObjectRead, ColumnarError> {
    read_checked(bytes, &mut event)
}

/// The block the writer puts just before the footer: `LHF1`, the CRC-32 of the footer (the
/// thrift bytes between this block and the file's last 8 bytes) and the footer's length, both
/// little-endian. Readers of Parquet find the footer from the file's end and the pages from the
/// footer's offsets, so the block is invisible to them (chdb, DuckDB, Spark read the objects
/// as they are).
const FOOTER_SUM_MAGIC: &[u8; 4] = b"LHF1";
const FOOTER_SUM_LEN: usize = 12;

/// The footer's length from the file's tail, when the file ends like Parquet and the length
/// fits in it (as the crate reads a footer: it does not insist on room for the leading magic).
fn footer_len(file: &[u8]) -> Option<usize> {
    let n = file.len();
    if n < 8 || &file[n - 4..] != b"PAR1" {
        return None;
    }
    let len = u32::from_le_bytes([file[n - 8], file[n - 7], file[n - 6], file[n - 5]]) as usize;
    (len <= n - 8).then_some(len)
}

/// `file` as the parquet writer left it, with the footer checksum block put before its footer.
fn with_footer_sum(mut file: Vec<u8>) -> Result<Vec<u8>, ColumnarError> {
    let len = footer_len(&file).ok_or(ColumnarError::Damaged("the writer left no footer"))?;
    let start = file.len() - 8 - len;
    let mut block = [0u8; FOOTER_SUM_LEN];
    block[..4].copy_from_slice(FOOTER_SUM_MAGIC);
    block[4..8].copy_from_slice(&crc32fast::hash(&file[start..start + len]).to_le_bytes());
    block[8..].copy_from_slice(&(len as u32).to_le_bytes());
    file.splice(start..start, block);
    Ok(file)
}

/// Checks the footer against the block before it, before the `parquet` crate decodes a byte
/// of it. The footer is thrift, and that crate's decoder trusts it: it skips a list's `bool`
/// elements without reading a byte each (the compact protocol gives each one a byte), so a
/// footer of a few hundred bytes can declare a list of two billion and hold a reader for
/// minutes, and it reserves room for as many row groups as a list header declares before it
/// reads one. Found by the fuzz campaign: `bool-list-of-two-billion-in-footer`, then
/// `bool-list-reached-by-the-typed-decoder`, which a first guard (a walk of the footer as
/// generic thrift, counting) let through: the crate decodes known fields by the type it expects,
/// not the one on the wire, so no walk short of its own decoder sees what it will. Only a footer
/// this writer wrote, byte for byte, is decoded. A file without a footer the crate would read
/// (no trailing magic, or a length past the file) is left to the crate's own (quick) refusal.
fn footer_checked(file: &[u8]) -> Result<(), ColumnarError> {
    let Some(len) = footer_len(file) else {
        return Ok(());
    };
    // Room for the leading magic and the block before the footer: a footer the crate would
    // decode over them (found by the campaign: `footer-over-the-leading-magic`) is refused.
    let start = file.len() - 8 - len;
    let block = start
        .checked_sub(FOOTER_SUM_LEN)
        .filter(|&b| b >= 4)
        .map(|b| &file[b..start])
        .filter(|b| &b[..4] == FOOTER_SUM_MAGIC)
        .ok_or(ColumnarError::Damaged("no footer checksum"))?;
    let crc = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let stated = u32::from_le_bytes([block[8], block[9], block[10], block[11]]) as usize;
    if stated != len || crc32fast::hash(&file[start..start + len]) != crc {
        return Err(ColumnarError::Damaged("footer checksum mismatch"));
    }
    // A checksum finds damage, not a footer made to match one: the walk admits only what
    // this writer writes, in the shapes the crate decodes without trusting a count.
    crate::footer::check(&file[start..start + len], COLUMNS.len() as u32)
        .map_err(|r| ColumnarError::Damaged(r.0))
}

fn read_checked(bytes: Bytes, event: &mut impl FnMut(&[u8])) -> Result<ObjectRead, ColumnarError> {
    footer_checked(&bytes)?;
    let reader = SerializedFileReader::new(bytes.clone())?;
    let fields = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .to_vec();
    let names: Vec<&str> = fields.iter().map(|c| c.name()).collect();
    if names != COLUMNS {
        return Err(ColumnarError::Schema(format!("columns {names:?}")));
    }
    let want = schema();
    if reader.metadata().file_metadata().schema() != &*want {
        return Err(ColumnarError::Schema("column types differ".into()));
    }
    let (body, stored) = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == CRC_KEY))
        .and_then(|k| k.value.as_deref())
        .and_then(|v| v.split_once(':'))
        .and_then(|(len, crc)| {
            Some((
                len.parse::<usize>().ok()?,
                u32::from_str_radix(crc, 16).ok()?,
            ))
        })
        .ok_or(ColumnarError::Damaged("no lasthop checksum in the footer"))?;
    if body < 4 || body > bytes.len() || crc32fast::hash(&bytes[..body]) != stored {
        return Err(ColumnarError::Damaged("checksum mismatch"));
    }
    // The footer's checksum says these bytes were written, not that a writer wrote them right:
    // its row counts and chunk ranges must still be what this writer makes (row groups of at most ROW_GROUP rows, every chunk inside the checksummed
    // body) before a page is read or a buffer sized from them.
    let mut rows_total = 0i64;
    // Column chunks follow each other from the magic on, as the writer lays them out.
    let mut next_chunk = 4u64;
    for g in reader.metadata().row_groups() {
        let n = g.num_rows();
        if !(0..=ROW_GROUP as i64).contains(&n) {
            return Err(ColumnarError::Damaged(
                "a row group larger than the writer makes",
            ));
        }
        rows_total += n;
        for c in g.columns() {
            // `byte_range` asserts on negative offsets: read the fields themselves (fuzz
            // regression `archive_object/negative-column-offset-in-footer`).
            let dictionary = c.dictionary_page_offset();
            let start = dictionary.unwrap_or(c.data_page_offset());
            let (Ok(start), Ok(len)) = (u64::try_from(start), u64::try_from(c.compressed_size()))
            else {
                return Err(ColumnarError::Damaged("a negative column chunk offset"));
            };
            if start != next_chunk || start.checked_add(len).is_none_or(|end| end > body as u64) {
                return Err(ColumnarError::Damaged(
                    "a column chunk outside the checksummed body",
                ));
            }
            next_chunk = start + len;
            // A dictionary-encoded chunk starts with its dictionary page, and only such a chunk
            // has one: the decoder asserts on a dictionary page it was not told of (fuzz
            // regression `archive_object/dictionary-page-dropped-from-footer`).
            let uses_dictionary = c
                .encodings()
                .any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY));
            let dictionary_first = dictionary.is_some_and(|d| d < c.data_page_offset());
            if uses_dictionary != dictionary.is_some()
                || (dictionary.is_some() && !dictionary_first)
            {
                return Err(ColumnarError::Damaged(
                    "dictionary pages and encodings disagree",
                ));
            }
        }
    }
    if rows_total != reader.metadata().file_metadata().num_rows() {
        return Err(ColumnarError::Damaged(
            "row groups do not add up to the file's rows",
        ));
    }
    let mut out = ObjectRead::default();
    let mut buf = Vec::with_capacity(MAX_EVENT_LEN);
    for g in 0..reader.num_row_groups() {
        let rg = reader.get_row_group(g)?;
        let rows = usize::try_from(rg.metadata().num_rows())
            .map_err(|_| ColumnarError::Schema("negative row count".into()))?;
        let col = |i: usize| rg.get_column_reader(i);
        let v = read_column::<Int32Type>(col(0)?, rows, false)?;
        let id = read_column::<FixedLenByteArrayType>(col(1)?, rows, false)?;
        let t = read_column::<Int64Type>(col(2)?, rows, false)?;
        let code = read_column::<ByteArrayType>(col(3)?, rows, false)?;
        let d = read_column::<ByteArrayType>(col(4)?, rows, true)?;
        let pop = read_column::<ByteArrayType>(col(5)?, rows, false)?;
        let cc = read_column::<ByteArrayType>(col(6)?, rows, true)?;
        let m = read_column::<ByteArrayType>(col(7)?, rows, false)?;
        let tls = read_column::<BoolType>(col(8)?, rows, false)?;
        let pf = read_column::<BoolType>(col(9)?, rows, false)?;
        let proto = read_column::<ByteArrayType>(col(10)?, rows, false)?;
        let early = read_column::<BoolType>(col(11)?, rows, false)?;
        let vis = read_column::<Int64Type>(col(12)?, rows, false)?;
        let net = read_column::<ByteArrayType>(col(13)?, rows, true)?;
        let ua = read_column::<ByteArrayType>(col(14)?, rows, false)?;
        let rh = read_column::<ByteArrayType>(col(15)?, rows, false)?;
        let (mut d_it, mut cc_it, mut net_it) =
            (Optional::new(&d), Optional::new(&cc), Optional::new(&net));
        for r in 0..rows {
            let row = out.rows;
            let bad = |reason: &str| ColumnarError::Row {
                row,
                reason: reason.to_owned(),
            };
            let id: [u8; 16] = id.values[r]
                .data()
                .try_into()
                .map_err(|_| bad("id is not 16 bytes"))?;
            let country = match cc_it.next() {
                None => None,
                Some(c) => {
                    Some(<[u8; 2]>::try_from(c.data()).map_err(|_| bad("cc is not two letters"))?)
                }
            };
            let net = match net_it.next() {
                None => None,
                Some(n) => Some(
                    utf8(n)
                        .map_err(bad)?
                        .parse::<Net>()
                        .map_err(|_| bad("net"))?,
                ),
            };
            let e = ClickEvent {
                id: EventId(u128::from_be_bytes(id)),
                at_ms: u64::try_from(t.values[r]).map_err(|_| bad("t is negative"))?,
                code: utf8(&code.values[r]).map_err(bad)?,
                domain: d_it
                    .next()
                    .map(utf8)
                    .transpose()
                    .map_err(bad)?
                    .unwrap_or(""),
                pop: utf8(&pop.values[r]).map_err(bad)?,
                country,
                method: match m.values[r].data() {
                    b"GET" => Method::Get,
                    b"HEAD" => Method::Head,
                    _ => return Err(bad("m")),
                },
                tls: tls.values[r],
                prefetch: pf.values[r],
                protocol: match proto.values[r].data() {
                    b"h1" => Protocol::H1,
                    b"h2" => Protocol::H2,
                    b"h3" => Protocol::H3,
                    _ => return Err(bad("proto")),
                },
                early: early.values[r],
                visitor: vis.values[r] as u64,
                net,
                user_agent: utf8(&ua.values[r]).map_err(bad)?,
                referrer_host: utf8(&rh.values[r]).map_err(bad)?,
            };
            if i32::from(e.version()) != v.values[r] {
                return Err(bad("v does not match the event"));
            }
            // One set of rules: the binary form's decoder checks every field.
            buf.clear();
            e.encode(&mut buf);
            match ClickEvent::decode(&buf) {
                Ok((checked, n)) if n == buf.len() && checked == e => event(&buf),
                Ok(_) => return Err(bad("a field does not survive the binary form")),
                Err(err) => return Err(bad(&err.to_string())),
            }
            out.rows += 1;
        }
        out.row_groups += 1;
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn event(i: u64, ua: &str) -> ClickEvent<'_> {
        ClickEvent {
            id: EventId::new(0xabc, i),
            at_ms: 1_764_504_000_000 + i,
            code: if i % 5 == 4 {
                "old-bitly_code"
            } else {
                "Ab3dE9x"
            },
            domain: if i % 3 == 2 { "go.example.com" } else { "" },
            pop: "fra1",
            country: (i % 2 == 0).then_some(*b"DE"),
            method: if i % 3 == 0 {
                Method::Head
            } else {
                Method::Get
            },
            tls: i % 2 == 1,
            prefetch: i % 4 == 1,
            protocol: [Protocol::H1, Protocol::H2, Protocol::H3][(i % 3) as usize],
            early: i % 4 == 2,
            visitor: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            net: match i % 3 {
                0 => None,
                1 => Some(Net::V4([203, 0, 113])),
                _ => Some(Net::V6([0x20, 0x01, 0x0d, 0xb8, 0, 1])),
            },
            user_agent: ua,
            referrer_host: if i % 2 == 0 { "" } else { "news.example.com" },
        }
    }

    fn read_all(bytes: Vec<u8>) -> Result<Vec<Vec<u8>>, ColumnarError> {
        let mut out = Vec::new();
        read(Bytes::from(bytes), |b| out.push(b.to_vec()))?;
        Ok(out)
    }

    #[test]
    fn the_schema_parses_and_names_the_archived_fields() {
        let s = schema();
        let names: Vec<&str> = s.get_fields().iter().map(|f| f.name()).collect();
        assert_eq!(names, COLUMNS);
        // The archive line's fields, in its order.
        let line = serde_json::to_value(event(2, "x").archived()).unwrap();
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for k in keys {
            assert!(COLUMNS.contains(&k), "{k} has no column");
        }
    }

    #[test]
    fn round_trip_across_row_groups() {
        let uas: Vec<String> = (0..200).map(|i| format!("Mozilla/5.0 agent {i}")).collect();
        let n = ROW_GROUP as u64 + 1000;
        let events: Vec<ClickEvent<'_>> =
            (0..n).map(|i| event(i, &uas[(i % 200) as usize])).collect();
        let bytes = encode(&events).unwrap();
        let got = read_all(bytes).unwrap();
        assert_eq!(got.len(), events.len());
        for (b, e) in got.iter().zip(&events) {
            assert_eq!(ClickEvent::decode(b).unwrap().0, *e);
        }
    }

    #[test]
    fn an_empty_object_reads_as_no_rows() {
        assert!(read_all(encode(&[]).unwrap()).unwrap().is_empty());
    }

    #[test]
    fn a_parquet_file_of_other_columns_is_refused() {
        let other =
            parquet::schema::parser::parse_message_type("message x { required int32 v; }").unwrap();
        let mut w = SerializedFileWriter::new(Vec::new(), Arc::new(other), properties()).unwrap();
        let mut rg = w.next_row_group().unwrap();
        write::<Int32Type>(&mut rg, &[1, 2], None).unwrap();
        rg.close().unwrap();
        let bytes = with_footer_sum(w.into_inner().unwrap()).unwrap();
        assert!(matches!(read_all(bytes), Err(ColumnarError::Schema(_))));
    }

    /// A footer whose list declares two billion bools, which the `parquet` crate skips without
    /// reading a byte each, or two billion row groups, for which it reserves room before
    /// reading one: refused before the crate sees it, without the block or with a block that
    /// does not match (the crate's own errors are `Parquet`, never `Damaged`); the same footers
    /// under a matching block reach the crate.
    #[test]
    fn only_a_footer_under_its_checksum_is_decoded() {
        let parquet_of = |footer: &[u8]| {
            let mut f = b"PAR1".to_vec();
            f.extend_from_slice(footer);
            f.extend_from_slice(&(footer.len() as u32).to_le_bytes());
            f.extend_from_slice(b"PAR1");
            f
        };
        // FileMetaData { 99: list<bool> of 2^31-1 }: a field header with a full id, a list
        // header "size follows, bool", the size, the struct's stop.
        let bools = parquet_of(&[0x09, 0xc6, 0x01, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]);
        // FileMetaData { 4: list<struct> of 2^31-1 } (the row groups), nothing after.
        let groups = parquet_of(&[0x49, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07]);
        for (what, bytes) in [("bools", bools), ("row groups", groups)] {
            let got = read_all(bytes.clone());
            assert!(
                matches!(got, Err(ColumnarError::Damaged("no footer checksum"))),
                "{what}: {got:?}"
            );
            let mut summed = with_footer_sum(bytes).unwrap();
            let last = summed.len() - 9;
            summed[last] ^= 1; // the footer's last byte
            let got = read_all(summed);
            assert!(
                matches!(got, Err(ColumnarError::Damaged("footer checksum mismatch"))),
                "{what}: {got:?}"
            );
        }
        // Under a matching block, the walk of the footer refuses what the crate would trust:
        // the row groups' list declaring more than it holds, and its two billion.
        let short = with_footer_sum(parquet_of(&[0x49, 0xfc, 0x02, 0x00])).unwrap();
        let got = read_all(short);
        assert!(
            matches!(
                got,
                Err(ColumnarError::Damaged("the footer ends inside a value"))
            ),
            "{got:?}"
        );
        let groups = with_footer_sum(parquet_of(&[0x49, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07]));
        let got = read_all(groups.unwrap());
        assert!(
            matches!(
                got,
                Err(ColumnarError::Damaged(
                    "a list longer than this schema holds"
                ))
            ),
            "{got:?}"
        );
        // A footer stated to begin over the leading magic, where no block fits (the crate
        // reads it all the same): refused (`footer-over-the-leading-magic`).
        // FileMetaData { 1: version 2, 2: no schema, 3: no rows, 4: no row groups }.
        let empty = [0x15, 0x04, 0x19, 0x0c, 0x16, 0x00, 0x19, 0x0c, 0x00];
        let mut over = parquet_of(&empty);
        let n = over.len();
        over[n - 8..n - 4].copy_from_slice(&((n - 8) as u32).to_le_bytes());
        let got = read_all(over);
        assert!(
            matches!(got, Err(ColumnarError::Damaged("no footer checksum"))),
            "{got:?}"
        );
        // A footer the crate decodes (an empty schema) still reaches it, and it refuses.
        let bare = with_footer_sum(parquet_of(&empty));
        let got = read_all(bare.unwrap());
        assert!(
            matches!(
                got,
                Err(ColumnarError::Parquet(_) | ColumnarError::Schema(_))
            ),
            "{got:?}"
        );
        // Our own objects: the block is right before the footer.
        let events: Vec<ClickEvent<'_>> = (0..50).map(|i| event(i, "Mozilla/5.0")).collect();
        let ours = encode(&events).unwrap();
        assert!(footer_checked(&ours).is_ok());
        let start = ours.len() - 8 - footer_len(&ours).unwrap();
        assert_eq!(&ours[start - FOOTER_SUM_LEN..start - 8], FOOTER_SUM_MAGIC);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Garbage, a truncated object and a flipped byte are errors or valid events, never a
        /// panic (the object store is read as untrusted bytes).
        #[test]
        fn damaged_objects_never_panic(
            garbage in proptest::collection::vec(any::<u8>(), 0..2048),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let _ = read_all(garbage);
            let events: Vec<ClickEvent<'_>> = (0..50).map(|i| event(i, "Mozilla/5.0")).collect();
            let good = encode(&events).unwrap();
            let _ = read_all(good[..cut.index(good.len())].to_vec());
            let footer_len = u32::from_le_bytes(good[good.len() - 8..good.len() - 4].try_into().unwrap()) as usize + 8;
            // Anywhere, and in the footer (under its own checksum) in particular.
            for at in [flip.index(good.len()), good.len() - 1 - flip.index(footer_len)] {
                let mut flipped = good.clone();
                flipped[at] ^= 1 << bit;
                if let Ok(rows) = read_all(flipped) {
                    for b in rows {
                        prop_assert!(ClickEvent::decode(&b).is_ok());
                    }
                }
            }
        }
    }
}
