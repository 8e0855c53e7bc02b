//! JSON exports, one link object at a time, in the three shapes they come in:
//!
//! - a page as the API answers it, `{"links": [...], "pagination": {...}}` (Bitly) or
//!   `{"data": [...], "total": 120}` (Kutt), and several pages one after another;
//! - a bare array of link objects;
//! - NDJSON, one link object (or one page) per line.
//!
//! Arrays are walked by a `serde` visitor over `serde_json::Deserializer::from_reader`, so only
//! the element being read is in memory, whatever the file's size. The other fields of a page
//! (`pagination`, `total`) are read and dropped. A syntax error inside an array ends the read:
//! nothing says where the next element starts.
//!
//! NDJSON is told apart by its first non-blank line being a whole JSON object or array on its
//! own (a pretty-printed page or array starts with a line that is not). Its lines are read one by one,
//! each at most [`LINE_MAX`] bytes, so a line that is not JSON, or too long, is one refused record
//! and the next line is read as usual.

use std::io::{BufRead, BufReader, Read};

use anyhow::anyhow;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::short_link::quote;
use super::source::Source;

/// Longest NDJSON line read (a page of a hundred Bitly links is about 100 KiB).
pub(super) const LINE_MAX: usize = 16 << 20;

/// A link object, or why the element in its place is not one.
pub(super) type Element = Result<Map<String, Value>, String>;

/// Calls `each` with every element's number and the element, in file order. `page_key` names
/// the array in a page (`links`, `data`); `format` names the format in fatal errors.
pub(super) fn each_element<R: Read>(
    source: Source<R>,
    format: &str,
    page_key: &str,
    each: &mut dyn FnMut(u64, Element) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let ndjson = matches!(
        serde_json::from_slice::<Value>(source.first_line()),
        Ok(Value::Object(_) | Value::Array(_))
    );
    let mut walker = Walker {
        page_key,
        each,
        line: 0,
        stopped: None,
    };
    let input = BufReader::new(source.into_reader());
    if ndjson {
        walker.lines(input)
    } else {
        walker.stream(input, format)
    }
}

struct Walker<'a> {
    page_key: &'a str,
    each: &'a mut dyn FnMut(u64, Element) -> anyhow::Result<()>,
    line: u64,
    /// The callback's error, kept while the visitor unwinds with a placeholder.
    stopped: Option<anyhow::Error>,
}

impl Walker<'_> {
    fn element(&mut self, value: Value) -> anyhow::Result<()> {
        self.line += 1;
        let element = match value {
            Value::Object(object) => Ok(object),
            _ => Err("malformed row: not a JSON object".to_string()),
        };
        (self.each)(self.line, element)
    }

    fn refuse(&mut self, reason: String) -> anyhow::Result<()> {
        self.line += 1;
        (self.each)(self.line, Err(reason))
    }

    /// A whole value (an NDJSON line): an array, a page, or one element.
    fn value(&mut self, value: Value) -> anyhow::Result<()> {
        match value {
            Value::Array(items) => items.into_iter().try_for_each(|v| self.element(v)),
            Value::Object(mut object) => match object.remove(self.page_key) {
                Some(Value::Array(items)) => items.into_iter().try_for_each(|v| self.element(v)),
                Some(Value::Null) => Ok(()),
                Some(other) => {
                    object.insert(self.page_key.to_string(), other);
                    self.element(Value::Object(object))
                }
                None => self.element(Value::Object(object)),
            },
            other => self.element(other),
        }
    }

    fn lines(&mut self, mut input: impl BufRead) -> anyhow::Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut input)
                .take(LINE_MAX as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| anyhow!("reading the input: {e}"))?;
            if read == 0 {
                return Ok(());
            }
            if line.len() > LINE_MAX && !line.ends_with(b"\n") {
                skip_line(&mut input)?;
                self.refuse(format!("malformed row: a line over {} MiB", LINE_MAX >> 20))?;
                continue;
            }
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Value>(text) {
                Ok(value) => self.value(value)?,
                Err(e) => self.refuse(format!(
                    "malformed JSON: {} in {}",
                    e,
                    quote(&String::from_utf8_lossy(text))
                ))?,
            }
        }
    }

    fn stream(&mut self, input: impl Read, format: &str) -> anyhow::Result<()> {
        let mut de = serde_json::Deserializer::from_reader(input);
        loop {
            // Only white space left: done. Anything else is the next document.
            match de.end() {
                Ok(()) => return Ok(()),
                Err(e) if e.is_io() => return Err(anyhow!("reading the input: {e}")),
                Err(_) => {}
            }
            if let Err(e) = (TopLevel { walker: self }).deserialize(&mut de) {
                return Err(match self.stopped.take() {
                    Some(stopped) => stopped,
                    None if e.is_io() => anyhow!("reading the input: {e}"),
                    None => anyhow!("not {format} JSON (after element {}): {e}", self.line),
                });
            }
        }
    }

    /// The callback's error as the visitor's: kept aside, a placeholder in its place.
    fn stop<E: de::Error>(&mut self, err: anyhow::Error) -> E {
        self.stopped = Some(err);
        E::custom("stopped by the caller")
    }
}

/// Reads through the end of the current line.
fn skip_line(input: &mut impl BufRead) -> anyhow::Result<()> {
    loop {
        let buf = input
            .fill_buf()
            .map_err(|e| anyhow!("reading the input: {e}"))?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// One document: an array of elements, a page, or a lone element.
struct TopLevel<'w, 'a> {
    walker: &'w mut Walker<'a>,
}

impl<'de> DeserializeSeed<'de> for TopLevel<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of link objects or an object")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Elements {
            walker: self.walker,
        }
        .visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // A page's array is walked where it stands; its other fields are small and dropped. An
        // object without the page's array is itself an element.
        let mut fields = Map::new();
        let mut paged = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.walker.page_key {
                map.next_value_seed(Elements {
                    walker: &mut *self.walker,
                })?;
                paged = true;
            } else if paged {
                map.next_value::<IgnoredAny>()?;
            } else {
                fields.insert(key, map.next_value()?);
            }
        }
        if paged {
            return Ok(());
        }
        let walker = self.walker;
        walker
            .element(Value::Object(fields))
            .map_err(|e| walker.stop(e))
    }
}

/// A page's array, or a bare one: each element handed over as soon as it is read.
struct Elements<'w, 'a> {
    walker: &'w mut Walker<'a>,
}

impl<'de> DeserializeSeed<'de> for Elements<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of link objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let walker = self.walker;
        while let Some(value) = seq.next_element::<Value>()? {
            walker.element(value).map_err(|e| walker.stop(e))?;
        }
        Ok(())
    }

    /// `"links": null`: an empty page.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A text field: trimmed, absent when null or empty; any other type refuses the record.
pub(super) fn text<'v>(object: &'v Map<String, Value>, key: &str) -> Result<&'v str, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.trim()),
        Some(_) => Err(format!("malformed row: {key} is not a string")),
    }
}

/// An array of texts (null or absent: none).
pub(super) fn texts<'v>(object: &'v Map<String, Value>, key: &str) -> Result<Vec<&'v str>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.as_str()),
                _ => Err(format!("malformed row: {key} holds a non-string")),
            })
            .collect(),
        Some(_) => Err(format!("malformed row: {key} is not an array")),
    }
}

/// A count: a non-negative integer, as a number or a string of digits.
pub(super) fn count(object: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("malformed {key}: {n}")),
        Some(Value::String(s)) => super::fields::clicks(s),
        Some(_) => Err(format!("malformed row: {key} is not a number")),
    }
}

/// A boolean (null or absent: false).
pub(super) fn flag(object: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("malformed row: {key} is not true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each element's number and its `k` field, or its refusal.
    fn walk(input: &[u8]) -> anyhow::Result<Vec<(u64, Result<String, String>)>> {
        let mut seen = Vec::new();
        each_element(
            Source::open(input).expect("in memory"),
            "test",
            "links",
            &mut |line, element| {
                let k = element.map(|o| o.get("k").map(|v| v.to_string()).unwrap_or_default());
                seen.push((line, k));
                Ok(())
            },
        )?;
        Ok(seen)
    }

    fn ok(line: u64, k: &str) -> (u64, Result<String, String>) {
        (line, Ok(k.to_string()))
    }

    #[test]
    fn the_three_shapes_give_the_same_elements() {
        let expected = vec![ok(1, "1"), ok(2, "2"), ok(3, "3")];
        for input in [
            &b"[{\"k\":1},{\"k\":2},{\"k\":3}]"[..],
            b"[\n  {\"k\": 1},\n  {\"k\": 2},\n  {\"k\": 3}\n]\n",
            b"{\n \"pagination\": {\"next\": \"\"},\n \"links\": [{\"k\":1},{\"k\":2},{\"k\":3}]\n}",
            b"{\"links\":[{\"k\":1},{\"k\":2}],\"pagination\":{\"total\":3}}\n{\"links\":[{\"k\":3}]}\n",
            b"{\n\"links\":[{\"k\":1},{\"k\":2}]}\n{\"links\":[{\"k\":3}],\"total\":3}",
            b"{\"k\":1}\n\n{\"k\":2}\r\n{\"k\":3}",
            b"\xEF\xBB\xBF  \n[{\"k\":1},\n{\"k\":2},{\"k\":3}]",
        ] {
            assert_eq!(walk(input).expect("reads"), expected, "{}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn an_element_that_is_not_an_object_is_refused_in_its_place() {
        let seen = walk(b"[{\"k\":1}, 7, null, {\"k\":2}]").expect("reads");
        assert_eq!(
            seen[1],
            (2, Err("malformed row: not a JSON object".to_string()))
        );
        assert_eq!(seen[2].0, 3);
        assert_eq!(seen[3], ok(4, "2"));
    }

    #[test]
    fn a_bad_ndjson_line_is_refused_and_the_next_line_read() {
        let seen = walk(b"{\"k\":1}\n{\"k\":\n{\"k\":3}\n").expect("reads");
        assert_eq!(seen.len(), 3);
        assert!(seen[1]
            .1
            .as_ref()
            .expect_err("bad")
            .starts_with("malformed JSON: "));
        assert_eq!(seen[2], ok(3, "3"));
    }

    #[test]
    fn an_ndjson_line_over_the_limit_is_refused_without_being_held() {
        let mut input = b"{\"k\":1}\n{\"k\":\"".to_vec();
        input.resize(input.len() + LINE_MAX + 10, b'x');
        input.extend_from_slice(b"\"}\n{\"k\":3}\n");
        let seen = walk(&input).expect("reads");
        assert_eq!(
            seen[1],
            (2, Err("malformed row: a line over 16 MiB".to_string()))
        );
        assert_eq!(seen[2], ok(3, "3"));
    }

    #[test]
    fn a_syntax_error_inside_an_array_or_a_scalar_document_is_fatal() {
        let err = walk(b"[\n{\"k\":1},\n{\"k\" 2}\n]").expect_err("syntax");
        assert!(
            err.to_string()
                .starts_with("not test JSON (after element 1): "),
            "{err}"
        );
        assert!(walk(b"\"links\"").is_err());
        assert!(walk(b"[{\"k\":1}").is_err());
    }

    #[test]
    fn an_empty_input_has_no_elements() {
        assert_eq!(walk(b"").expect("reads"), vec![]);
        assert_eq!(walk(b" \n ").expect("reads"), vec![]);
        assert_eq!(walk(b"{\"links\": null}").expect("reads"), vec![]);
        assert_eq!(walk(b"{\"links\": []}").expect("reads"), vec![]);
    }

    #[test]
    fn the_callers_error_stops_the_walk_and_comes_back_as_is() {
        let mut calls = 0;
        let err = each_element(
            Source::open(&b"[{\"k\":1},{\"k\":2}]\n"[..]).expect("in memory"),
            "test",
            "links",
            &mut |_, _| {
                calls += 1;
                Err(anyhow!("disk full"))
            },
        )
        .expect_err("stopped");
        assert_eq!((calls, err.to_string()), (1, "disk full".to_string()));
        let err = each_element(
            Source::open(&b"[\n{\"k\":1},{\"k\":2}]\n"[..]).expect("in memory"),
            "test",
            "links",
            &mut |_, _| Err(anyhow!("disk full")),
        )
        .expect_err("stopped");
        assert_eq!(err.to_string(), "disk full");
    }
}
