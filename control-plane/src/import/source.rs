//! The input with its start looked at: a UTF-8 byte order mark skipped and the first non-blank
//! line buffered, so a format can tell JSON from CSV, NDJSON from one document, and `,` from
//! `;` before its parser takes the whole stream.

use std::io::{self, BufRead, BufReader, Chain, Cursor, Read};

/// Most bytes buffered while looking for the first non-blank line; a longer first line (a
/// minified JSON document) is looked at by its first [`HEAD_MAX`] bytes only.
pub(super) const HEAD_MAX: usize = 64 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What a format's parser reads: the buffered start, then the rest.
pub(super) type Input<R> = Chain<Cursor<Vec<u8>>, BufReader<R>>;

pub(super) struct Source<R> {
    head: Vec<u8>,
    rest: BufReader<R>,
}

impl<R: Read> Source<R> {
    pub(super) fn open(input: R) -> io::Result<Self> {
        let mut rest = BufReader::new(input);
        let mut head = Vec::new();
        while head.len() < HEAD_MAX {
            let room = (HEAD_MAX - head.len()) as u64;
            if (&mut rest).take(room).read_until(b'\n', &mut head)? == 0 {
                break;
            }
            let text = head.strip_prefix(BOM).unwrap_or(&head);
            if head.ends_with(b"\n") && text.iter().any(|b| !b.is_ascii_whitespace()) {
                break;
            }
        }
        if head.starts_with(BOM) {
            head.drain(..BOM.len());
        }
        Ok(Source { head, rest })
    }

    /// The first non-blank line, without its line break (at most [`HEAD_MAX`] bytes).
    pub(super) fn first_line(&self) -> &[u8] {
        let start = self
            .head
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(self.head.len());
        let line = &self.head[start..];
        let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
        line[..end].strip_suffix(b"\r").unwrap_or(&line[..end])
    }

    /// The first byte that is not white space, if any.
    pub(super) fn first_byte(&self) -> Option<u8> {
        self.first_line().first().copied()
    }

    /// Everything after the byte order mark, the buffered start included.
    pub(super) fn into_reader(self) -> Input<R> {
        Cursor::new(self.head).chain(self.rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(source: Source<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        source
            .into_reader()
            .read_to_end(&mut out)
            .expect("in memory");
        out
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_the_rest_kept() {
        let source = Source::open(&b"\xEF\xBB\xBFcode,long_url\r\nabc,https://a.example\n"[..])
            .expect("in memory");
        assert_eq!(source.first_line(), b"code,long_url");
        assert_eq!(all(source), b"code,long_url\r\nabc,https://a.example\n");
    }

    #[test]
    fn blank_lines_before_the_first_are_looked_past() {
        let source = Source::open(&b"\n  \n\t[\n{}]"[..]).expect("in memory");
        assert_eq!(source.first_byte(), Some(b'['));
        assert_eq!(all(source), b"\n  \n\t[\n{}]");
    }

    #[test]
    fn a_first_line_longer_than_the_limit_is_cut_there_and_nothing_is_lost() {
        let mut input = vec![b'['; HEAD_MAX + 10];
        input.push(b'\n');
        let source = Source::open(&input[..]).expect("in memory");
        assert_eq!(source.first_line().len(), HEAD_MAX);
        assert_eq!(all(source), input);
    }

    #[test]
    fn an_empty_input_has_no_first_byte() {
        let source = Source::open(&b""[..]).expect("in memory");
        assert_eq!(source.first_byte(), None);
        assert_eq!(source.first_line(), b"");
    }
}
