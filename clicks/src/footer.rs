//! A walk of an archive object's Parquet footer (Thrift's compact protocol) before the
//! `parquet` crate decodes it: only a footer made of the fields this writer writes, each with
//! the wire type the crate's decoder expects, with every list's elements present in the bytes
//! and the counts the crate reserves room by within what this schema can hold, reaches it.
//!
//! Why a walk, when the footer is checksummed ([`super::columnar`]'s `LHF1` block): a checksum
//! finds damage, not a footer made on purpose, and the crate trusts the footer it decodes.
//! The fuzz campaign found four ways a small footer stops a reader:
//! - a `list<bool>` of two billion, which the crate skips without reading a byte an element
//!   (`bool-list-of-two-billion-in-footer`), also under a known field of another wire type,
//!   which the crate decodes by the type it expects (`bool-list-reached-by-the-typed-decoder`);
//! - a schema element declaring two billion children, for which it reserves room before
//!   reading one (`schema-children-reserved-before-read`), and a row group list of two billion
//!   likewise.
//!
//! Each has a rule here: no field outside the table (the crate skips nothing), no wire type
//! other than the table's (the crate reads what the walk read), every element walked (a list
//! is as long as its bytes), no more children than this schema has columns and no more row
//! groups than the crate numbers (`i16`).

/// The compact protocol's wire types.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const STRUCT: u8 = 12;

/// What a field holds.
#[derive(Clone, Copy)]
enum T {
    Bool,
    I8,
    I16,
    I32,
    I64,
    Binary,
    /// A list of this element, at most this many.
    List(&'static T, u32),
    Struct(&'static [(i16, T)]),
    /// A schema element's `num_children`: at most the columns the schema has (the crate
    /// reserves room for them before reading one).
    Children,
    /// A row group's column chunks: a list of at most the columns the schema has.
    Chunks,
}

impl T {
    /// Whether a value of this type may arrive as `wire` (a bool's value is its wire type).
    fn accepts(self, wire: u8) -> bool {
        wire == self.wire() || (matches!(self, T::Bool) && wire == BOOL_FALSE)
    }

    fn wire(self) -> u8 {
        match self {
            T::Bool => BOOL_TRUE,
            T::I8 => BYTE,
            T::I16 => I16,
            T::I32 => I32,
            T::I64 => I64,
            T::Binary => BINARY,
            T::List(..) | T::Chunks => LIST,
            T::Struct(_) => STRUCT,
            T::Children => I32,
        }
    }
}

/// No list in a footer this writer writes is longer than its bytes; the cap that matters is the
/// one a count reserves memory by.
const ANY: u32 = u32::MAX;
/// The crate numbers row groups with an `i16`.
const MAX_ROW_GROUPS: u32 = i16::MAX as u32;

const EMPTY: &[(i16, T)] = &[];
const TIME_UNIT: &[(i16, T)] = &[
    (1, T::Struct(EMPTY)),
    (2, T::Struct(EMPTY)),
    (3, T::Struct(EMPTY)),
];
const TIME: &[(i16, T)] = &[(1, T::Bool), (2, T::Struct(TIME_UNIT))];
const DECIMAL: &[(i16, T)] = &[(1, T::I32), (2, T::I32)];
const INT: &[(i16, T)] = &[(1, T::I8), (2, T::Bool)];
/// `LogicalType`: a union of (mostly empty) structs.
const LOGICAL: &[(i16, T)] = &[
    (1, T::Struct(EMPTY)),
    (2, T::Struct(EMPTY)),
    (3, T::Struct(EMPTY)),
    (4, T::Struct(EMPTY)),
    (5, T::Struct(DECIMAL)),
    (6, T::Struct(EMPTY)),
    (7, T::Struct(TIME)),
    (8, T::Struct(TIME)),
    (10, T::Struct(INT)),
    (11, T::Struct(EMPTY)),
    (12, T::Struct(EMPTY)),
    (13, T::Struct(EMPTY)),
    (14, T::Struct(EMPTY)),
    (15, T::Struct(EMPTY)),
];
/// `SchemaElement`; `num_children` at most the columns this schema has.
const SCHEMA_ELEMENT: &[(i16, T)] = &[
    (1, T::I32),
    (2, T::I32),
    (3, T::I32),
    (4, T::Binary),
    (5, T::Children),
    (6, T::I32),
    (7, T::I32),
    (8, T::I32),
    (9, T::I32),
    (10, T::Struct(LOGICAL)),
];
const KEY_VALUE: &[(i16, T)] = &[(1, T::Binary), (2, T::Binary)];
const STATISTICS: &[(i16, T)] = &[
    (1, T::Binary),
    (2, T::Binary),
    (3, T::I64),
    (4, T::I64),
    (5, T::Binary),
    (6, T::Binary),
    (7, T::Bool),
    (8, T::Bool),
];
const PAGE_ENCODING_STATS: &[(i16, T)] = &[(1, T::I32), (2, T::I32), (3, T::I32)];
const SIZE_STATISTICS: &[(i16, T)] = &[
    (1, T::I64),
    (2, T::List(&T::I64, ANY)),
    (3, T::List(&T::I64, ANY)),
];
const COLUMN_META: &[(i16, T)] = &[
    (1, T::I32),
    (2, T::List(&T::I32, ANY)),
    (3, T::List(&T::Binary, ANY)),
    (4, T::I32),
    (5, T::I64),
    (6, T::I64),
    (7, T::I64),
    (8, T::List(&T::Struct(KEY_VALUE), ANY)),
    (9, T::I64),
    (10, T::I64),
    (11, T::I64),
    (12, T::Struct(STATISTICS)),
    (13, T::List(&T::Struct(PAGE_ENCODING_STATS), ANY)),
    (14, T::I64),
    (15, T::I32),
    (16, T::Struct(SIZE_STATISTICS)),
];
const COLUMN_CHUNK: &[(i16, T)] = &[
    (1, T::Binary),
    (2, T::I64),
    (3, T::Struct(COLUMN_META)),
    (4, T::I64),
    (5, T::I32),
    (6, T::I64),
    (7, T::I32),
];
const SORTING_COLUMN: &[(i16, T)] = &[(1, T::I32), (2, T::Bool), (3, T::Bool)];
/// `RowGroup`.
const ROW_GROUP: &[(i16, T)] = &[
    (1, T::Chunks),
    (2, T::I64),
    (3, T::I64),
    (4, T::List(&T::Struct(SORTING_COLUMN), ANY)),
    (5, T::I64),
    (6, T::I64),
    (7, T::I16),
];
const COLUMN_ORDER: &[(i16, T)] = &[(1, T::Struct(EMPTY))];
/// `FileMetaData`; the schema's elements at most its columns and the root.
const FILE_META: &[(i16, T)] = &[
    (1, T::I32),
    (2, T::List(&T::Struct(SCHEMA_ELEMENT), ANY)),
    (3, T::I64),
    (4, T::List(&T::Struct(ROW_GROUP), MAX_ROW_GROUPS)),
    (5, T::List(&T::Struct(KEY_VALUE), ANY)),
    (6, T::Binary),
    (7, T::List(&T::Struct(COLUMN_ORDER), ANY)),
];

/// Why a footer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

/// Walks `footer` as the `FileMetaData` of a file with `columns` leaf columns under its root.
pub fn check(footer: &[u8], columns: u32) -> Result<(), Refused> {
    let mut w = Walk {
        bytes: footer,
        at: 0,
        columns,
    };
    w.strukt(FILE_META)?;
    if w.at != footer.len() {
        return Err(Refused("bytes after the footer's end"));
    }
    Ok(())
}

/// A compact-protocol integer's value from its zigzag form.
fn zigzag(z: u64) -> i64 {
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The schema's leaf columns.
    columns: u32,
}

impl Walk<'_> {
    fn byte(&mut self) -> Result<u8, Refused> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or(Refused("the footer ends inside a value"))?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self, max_bytes: u32) -> Result<u64, Refused> {
        let mut v = 0u64;
        for i in 0..max_bytes {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Refused("a varint longer than its type"))
    }

    fn skip(&mut self, n: u64) -> Result<(), Refused> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(Refused("a value longer than the footer"));
        }
        self.at += n as usize;
        Ok(())
    }

    /// One value of `t`.
    fn value(&mut self, t: T) -> Result<(), Refused> {
        match t {
            T::Bool => Ok(()),
            T::I8 => self.byte().map(drop),
            T::I16 => self.varint(3).map(drop),
            T::I32 => self.varint(5).map(drop),
            T::I64 => self.varint(10).map(drop),
            T::Binary => {
                let n = self.varint(5)?;
                self.skip(n)
            }
            T::List(element, max) => self.list(element, max),
            T::Chunks => self.list(&T::Struct(COLUMN_CHUNK), self.columns),
            T::Struct(fields) => self.strukt(fields),
            T::Children => {
                let n = zigzag(self.varint(5)?);
                if (0..=i64::from(self.columns)).contains(&n) {
                    Ok(())
                } else {
                    Err(Refused("more children than this schema has columns"))
                }
            }
        }
    }

    fn list(&mut self, element: &T, max: u32) -> Result<(), Refused> {
        let header = self.byte()?;
        if header == 0 {
            // Some writers write an empty list's header as 0; so does the crate's reader.
            return Ok(());
        }
        let size = match header >> 4 {
            15 => self.varint(5)?,
            n => u64::from(n),
        };
        if size > 0 && !element.accepts(header & 0x0f) {
            return Err(Refused("a list of another element type"));
        }
        if size > u64::from(max) {
            return Err(Refused("a list longer than this schema holds"));
        }
        // Every element is walked, so a list is never longer than its bytes; a list of bools
        // (one byte each on the wire) is in no table.
        for _ in 0..size {
            self.value(*element)?;
        }
        Ok(())
    }

    /// A struct of `fields`. The tables nest no struct in itself, so they bound the depth.
    fn strukt(&mut self, fields: &[(i16, T)]) -> Result<(), Refused> {
        let mut last: i16 = 0;
        loop {
            let header = self.byte()?;
            if header == 0 {
                break;
            }
            let wire = header & 0x0f;
            let id = match header >> 4 {
                0 => i16::try_from(zigzag(self.varint(3)?))
                    .map_err(|_| Refused("a field id past i16"))?,
                delta => last
                    .checked_add(i16::from(delta))
                    .ok_or(Refused("a field id past i16"))?,
            };
            last = id;
            let Some(&(_, t)) = fields.iter().find(|(f, _)| *f == id) else {
                return Err(Refused("a field this writer never writes"));
            };
            if !t.accepts(wire) {
                return Err(Refused("a field of another wire type than its own"));
            }
            self.value(t)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FileMetaData { 1: version 2, 2: [root { 4: "r", 5: children }], 3: rows 0, 4: [] }
    fn footer(children: u8) -> Vec<u8> {
        vec![
            0x15, 0x04, // version: i32 2
            0x19, 0x1c, // schema: list of 1 struct
            0x48, 0x01, b'r', // name "r"
            0x15, children, // num_children (zigzag)
            0x00,     // end of the element
            0x16, 0x00, // num_rows 0
            0x19, 0x0c, // row groups: empty list of structs
            0x00,
        ]
    }

    #[test]
    fn a_small_footer_walks_and_forged_counts_do_not() {
        assert_eq!(check(&footer(2), 1), Ok(()));
        // Two billion children (zigzag 0xfe 0xff 0xff 0xff 0x0f), as the finding has it.
        let mut f = footer(0);
        f.splice(8..9, [0xfe, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(
            check(&f, 16),
            Err(Refused("more children than this schema has columns"))
        );
        // A row group list declaring two billion: refused by count before the crate reserves.
        let mut f = footer(2);
        let n = f.len();
        f.splice(n - 2.., [0xfc, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]);
        assert_eq!(
            check(&f, 16),
            Err(Refused("a list longer than this schema holds"))
        );
        // A list<bool> under an unknown field, and a known field on another wire type.
        let mut f = footer(2);
        let n = f.len();
        f.splice(
            n - 1..n - 1,
            [0x09, 0xc6, 0x01, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07],
        );
        assert_eq!(
            check(&f, 16),
            Err(Refused("a field this writer never writes"))
        );
        let mut f = footer(2);
        f[10] = 0x15; // num_rows as an i32
        assert_eq!(
            check(&f, 16),
            Err(Refused("a field of another wire type than its own"))
        );
        // Truncated anywhere: refused, never a panic.
        let f = footer(2);
        for cut in 0..f.len() {
            assert!(check(&f[..cut], 16).is_err(), "cut at {cut}");
        }
    }
}
