//! Bitly: API v4 bitlink objects as JSON, or a CSV with the same column names.
//!
//! A bitlink (`BitlinkBody` in the API reference, dev.bitly.com/api-reference, as
//! `GET /v4/groups/{group_guid}/bitlinks` pages them under `links` with a `pagination` object)
//! has `id` (`bit.ly/3abcDEF`: host and code, no scheme), `link` (the same as a URL), `long_url`,
//! `title`, `created_at` (`2021-03-04T05:06:07+0000`: the offset without its colon), `archived`,
//! `tags` (strings) and `custom_bitlinks`: the full URLs of the same link's branded back-halves
//! (`https://brand.co/spring-sale`). Each custom bitlink is a row of its own, with the bitlink's
//! destination, title, tags, date and archived flag, after the bitlink's row and with its record
//! number. The code and domain come from `id`, from `link` when `id` is missing. Bitlinks carry
//! no click totals. Shlink's importer reads the same pages (shlinkio/shlink-importer,
//! `src/Sources/Bitly/BitlyApiImporter.php`), from `link`.
//!
//! The file is JSON when its first non-blank byte is `{` or `[`, and then any of the shapes in
//! `json.rs`: API pages, a bare array, NDJSON. Otherwise it is a CSV whose header names the
//! fields above (folded, so `Long URL` is `long_url`; also `bitlink` for `id` and `clicks` or
//! `total_clicks` for the old click total). Bitly publishes no layout for list fields in a CSV,
//! so `tags` and `custom_bitlinks` cells are read either as a JSON array of strings (a bitlink
//! object flattened by a JSON-to-CSV tool keeps them so) or as items separated by `,`, `;` or `|`
//! (what a person typing a spreadsheet uses; none of the three occurs in a tag lasthop accepts
//! or in a branded short link).
//!
//! A bitlink without `long_url` is refused, its custom bitlinks with it: Bitly has such records
//! (deleted destinations), and Shlink's importer skips them too.

use std::io::Read;

use serde_json::{Map, Value};

use super::fields;
use super::json;
use super::short_link::{self, quote};
use super::source::Source;
use super::table::{Cells, Delimiter, Table};
use super::{Emit, Refused, Row};

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    match source.first_byte() {
        Some(b'{' | b'[') => {
            json::each_element(
                source,
                "Bitly",
                "links",
                &mut |line, element| match element {
                    Ok(object) => emit(line, from_json(&object), sink),
                    Err(reason) => sink.emit(Err(Refused {
                        line,
                        code: None,
                        reason,
                    })),
                },
            )
        }
        _ => read_csv(source, sink),
    }
}

/// One bitlink's fields, from either spelling, before the checks.
struct Bitlink<'a> {
    long_url: &'a str,
    title: &'a str,
    created_at: &'a str,
    archived: bool,
    tags: Vec<String>,
    custom_bitlinks: Vec<String>,
    clicks: Option<u64>,
}

/// Record `line`'s rows: the bitlink's, then one per custom bitlink; or one refusal when the
/// record itself cannot be read. `short_link` is `id`, else `link`.
fn emit(
    line: u64,
    (short_link, fields): (&str, Result<Bitlink<'_>, String>),
    sink: &mut dyn Emit,
) -> anyhow::Result<()> {
    let main = short_link::short_link(short_link);
    let shared = fields.and_then(|b| {
        let long_url = fields::long_url(b.long_url)?;
        let created_at_ms = fields::time(b.created_at, "created_at")?;
        Ok((b, long_url, created_at_ms))
    });
    let (bitlink, long_url, created_at_ms) = match shared {
        Ok(shared) => shared,
        Err(reason) => {
            let code = match main {
                Ok((_, code)) => Some(code),
                Err(bad) => bad.code,
            };
            return sink.emit(Err(Refused { line, code, reason }));
        }
    };
    let row = |(domain, code)| Row {
        line,
        code,
        domain,
        long_url: long_url.clone(),
        title: fields::text(bitlink.title),
        created_at_ms,
        tags: bitlink.tags.clone(),
        expires_at_ms: None,
        clicks: None,
        archived: bitlink.archived,
    };
    sink.emit(
        main.map(|link| Row {
            clicks: bitlink.clicks,
            ..row(link)
        })
        .map_err(|bad| bad.at(line)),
    )?;
    for custom in &bitlink.custom_bitlinks {
        sink.emit(
            short_link::short_link(custom)
                .map(row)
                .map_err(|bad| bad.at(line)),
        )?;
    }
    Ok(())
}

/// A bitlink object's short link and fields.
fn from_json(object: &Map<String, Value>) -> (&str, Result<Bitlink<'_>, String>) {
    let short_link = match json::text(object, "id") {
        Ok("") | Err(_) => json::text(object, "link").unwrap_or_default(),
        Ok(id) => id,
    };
    let fields = (|| {
        Ok(Bitlink {
            long_url: json::text(object, "long_url")?,
            title: json::text(object, "title")?,
            created_at: json::text(object, "created_at")?,
            archived: json::flag(object, "archived")?,
            tags: json::texts(object, "tags")?
                .into_iter()
                .filter_map(fields::text)
                .collect(),
            custom_bitlinks: json::texts(object, "custom_bitlinks")?
                .into_iter()
                .filter_map(fields::text)
                .collect(),
            clicks: None,
        })
    })();
    (short_link, fields)
}

/// Where a Bitly CSV keeps each field.
struct Columns {
    id: Option<usize>,
    link: Option<usize>,
    long_url: usize,
    title: Option<usize>,
    created_at: Option<usize>,
    archived: Option<usize>,
    tags: Option<usize>,
    custom_bitlinks: Option<usize>,
    clicks: Option<usize>,
}

fn read_csv<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    let mut table = Table::open(source, Delimiter::Sniffed);
    let header = table.header()?;
    let columns = Columns {
        long_url: header.require("Bitly", &["long_url", "destination_url", "destination"])?,
        id: header.find(&["id", "bitlink"]),
        link: header.find(&["link", "short_link", "short_url"]),
        title: header.find(&["title"]),
        created_at: header.find(&["created_at", "created", "date_created"]),
        archived: header.find(&["archived"]),
        tags: header.find(&["tags"]),
        custom_bitlinks: header.find(&["custom_bitlinks", "custom_links"]),
        clicks: header.find(&["clicks", "total_clicks"]),
    };
    if columns.id.is_none() && columns.link.is_none() {
        header.require("Bitly", &["id", "link", "bitlink"])?;
    }
    while let Some((line, cells)) = table.next()? {
        match cells {
            Ok(cells) => emit(line, from_cells(&cells, &columns), sink)?,
            Err(refused) => sink.emit(Err(refused))?,
        }
    }
    Ok(())
}

/// A CSV record's short link and fields.
fn from_cells<'a>(cells: &Cells<'a>, c: &Columns) -> (&'a str, Result<Bitlink<'a>, String>) {
    let short_link = match cells.get(c.id) {
        "" => cells.get(c.link),
        id => id,
    };
    let fields = (|| {
        Ok(Bitlink {
            long_url: cells.get(Some(c.long_url)),
            title: cells.get(c.title),
            created_at: cells.get(c.created_at),
            archived: fields::flag(cells.get(c.archived), "archived")?,
            tags: list(cells.get(c.tags), "tags")?,
            custom_bitlinks: list(cells.get(c.custom_bitlinks), "custom_bitlinks")?,
            clicks: fields::clicks(cells.get(c.clicks))?,
        })
    })();
    (short_link, fields)
}

/// A list cell: a JSON array of strings, or items separated by `,`, `;` or `|`.
fn list(cell: &str, name: &str) -> Result<Vec<String>, String> {
    if cell.starts_with('[') {
        let items: Vec<String> =
            serde_json::from_str(cell).map_err(|_| format!("malformed {name}: {}", quote(cell)))?;
        return Ok(items.iter().filter_map(|s| fields::text(s)).collect());
    }
    Ok(fields::tags(cell, &[',', ';', '|']))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::Format;

    /// 2021-03-04T05:06:07Z.
    const MARCH_4: i64 = 1_614_834_367_000;

    #[test]
    fn a_bitlink_gives_its_row_then_one_per_custom_bitlink() {
        let (rows, refused, counts) = collect(
            Format::Bitly,
            r#"{"links":[{"id":"bit.ly/3abcDEF","link":"https://bit.ly/3abcDEF",
                "long_url":" https://shop.example/spring ","title":"Printemps été",
                "created_at":"2021-03-04T05:06:07+0000","archived":true,"tags":["sale"," ",""],
                "custom_bitlinks":["https://Brand.example/spring-sale","https://brand.example/a b"]}],
                "pagination":{"next":""}}"#
                .as_bytes(),
        );
        assert_eq!(
            rows,
            [
                row(1, Some("bit.ly"), "3abcDEF", "https://shop.example/spring")
                    .title("Printemps été")
                    .created(MARCH_4)
                    .tags(&["sale"])
                    .archived(),
                row(
                    1,
                    Some("brand.example"),
                    "spring-sale",
                    "https://shop.example/spring"
                )
                .title("Printemps été")
                .created(MARCH_4)
                .tags(&["sale"])
                .archived(),
            ]
        );
        assert_eq!(
            refusals(&refused),
            [(1, Some("a b"), "malformed code: 'a b'")]
        );
        assert_eq!((counts.records, counts.rows, counts.refused), (1, 2, 1));
    }

    #[test]
    fn a_bitlink_without_a_destination_is_refused_once_with_its_custom_bitlinks() {
        let (rows, refused, _) = collect(
            Format::Bitly,
            b"{\"id\":\"bit.ly/x\",\"custom_bitlinks\":[\"https://b.example/y\"]}\n{\"link\":\"https://bit.ly/z\",\"long_url\":\"https://a.example\"}\n",
        );
        assert_eq!(
            refusals(&refused),
            [(1, Some("x"), "malformed row: missing long_url")]
        );
        assert_eq!(rows, [row(2, Some("bit.ly"), "z", "https://a.example")]);
    }

    #[test]
    fn a_field_of_the_wrong_type_refuses_the_record() {
        let (rows, refused, _) = collect(
            Format::Bitly,
            br#"[{"id":"bit.ly/a","long_url":"https://a.example","tags":"x"},
                 {"id":"bit.ly/b","long_url":"https://a.example","archived":"yes"},
                 {"id":"bit.ly/c","long_url":"https://a.example","created_at":"soon"}]"#,
        );
        assert!(rows.is_empty());
        assert_eq!(
            refusals(&refused),
            [
                (1, Some("a"), "malformed row: tags is not an array"),
                (2, Some("b"), "malformed row: archived is not true or false"),
                (3, Some("c"), "malformed created_at: 'soon'"),
            ]
        );
    }

    #[test]
    fn csv_list_cells_are_json_arrays_or_separated_items() {
        let (rows, refused, _) = collect(
            Format::Bitly,
            b"id,long_url,tags,custom_bitlinks,clicks\n\
              bit.ly/a,https://a.example,\"[\"\"x\"\",\"\"y\"\"]\",,3\n\
              bit.ly/b,https://a.example,x; y | z,https://b.example/c|https://b.example/d,\n\
              bit.ly/e,https://a.example,[x,,\n",
        );
        assert_eq!(
            rows,
            [
                row(1, Some("bit.ly"), "a", "https://a.example")
                    .tags(&["x", "y"])
                    .clicks(3),
                row(2, Some("bit.ly"), "b", "https://a.example").tags(&["x", "y", "z"]),
                row(2, Some("b.example"), "c", "https://a.example").tags(&["x", "y", "z"]),
                row(2, Some("b.example"), "d", "https://a.example").tags(&["x", "y", "z"]),
            ]
        );
        assert_eq!(refusals(&refused), [(3, Some("e"), "malformed tags: '[x'")]);
    }

    #[test]
    fn a_csv_without_the_columns_is_not_bitly() {
        let err = super::super::read(
            Format::Bitly,
            &b"keyword,url\nabc,https://a.example\n"[..],
            |_| Ok(()),
        )
        .expect_err("not bitly");
        assert!(
            err.to_string()
                .starts_with("not a Bitly export: the header has no long_url column"),
            "{err}"
        );
        let err = super::super::read(
            Format::Bitly,
            &b"title,long_url\nabc,https://a.example\n"[..],
            |_| Ok(()),
        )
        .expect_err("not bitly");
        assert!(err.to_string().contains("no id column"), "{err}");
    }

    #[test]
    fn the_json_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Bitly, &fixture("bitly.json"));
        assert_eq!((counts.records, counts.rows, counts.refused), (33, 32, 4));
        assert_eq!(
            rows[0],
            row(
                1,
                Some("bit.ly"),
                "3kTmZ9q",
                "https://www.shop.example/spring/collection?utm_source=bitly"
            )
            .title("Spring collection")
            .created(1_614_834_367_000)
            .tags(&["spring", "shop"])
        );
        let sale = |domain, code| {
            row(
                7,
                Some(domain),
                code,
                "https://shop.example/search?q=shoes,red&sort=\"price\"",
            )
            .title("Spring sale")
            .created(1_616_673_967_000)
            .tags(&["sale"])
        };
        assert_eq!(
            on(&rows, 7),
            [
                sale("bit.ly", "bV2uwDj"),
                sale("brand.example", "spring-sale"),
                sale("brand.example", "ss")
            ]
        );
        assert_eq!(on(&rows, 8)[0].domain.as_deref(), Some("brand.example"));
        assert_eq!(on(&rows, 8)[0].code, "L");
        assert_eq!(on(&rows, 13)[0].title.as_deref(), Some("Привет, мир"));
        assert!(on(&rows, 13)[0].archived);
        assert_eq!(on(&rows, 30)[0].code, "2XFxOoV", "from link, no id");
        assert_eq!(on(&rows, 2)[0].code, on(&rows, 21)[0].code, "the duplicate");
        assert_eq!(
            on(&rows, 22)[0].long_url,
            "https://listed.example/promo/free-gift"
        );
        assert_eq!(
            refusals(&refused),
            [
                (9, Some("k9"), "malformed row: missing long_url"),
                (20, Some("bad code"), "malformed code: 'bad code'"),
                (
                    23,
                    Some(&*"Z".repeat(65)),
                    &*format!("malformed code: '{}'", "Z".repeat(65))
                ),
                (29, Some("mUc853g"), "malformed created_at: 'last tuesday'"),
            ]
        );
    }

    #[test]
    fn the_csv_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Bitly, &fixture("bitly.csv"));
        assert_eq!((counts.records, counts.rows, counts.refused), (31, 29, 4));
        assert_eq!(
            rows[0],
            row(
                1,
                Some("bit.ly"),
                "4hQwErT",
                "https://news.example/article/2022/05/rust, \"fast\" & safe"
            )
            .title("Rust, \"fast\" & safe")
            .created(1_651_400_000_000)
            .tags(&["news", "rust"])
            .clicks(120)
        );
        assert_eq!(on(&rows, 4)[0].tags, ["a", "b"], "a JSON array cell");
        let branded: Vec<_> = on(&rows, 17)
            .into_iter()
            .map(|r| (r.domain, r.code, r.tags, r.clicks))
            .collect();
        let tags = vec!["summer".to_string(), "sale".to_string()];
        assert_eq!(
            branded,
            [
                (
                    Some("bit.ly".to_string()),
                    "vzETBAx".to_string(),
                    tags.clone(),
                    None
                ),
                (
                    Some("brand.example".to_string()),
                    "summer".to_string(),
                    tags.clone(),
                    None
                ),
                (
                    Some("brand.example".to_string()),
                    "Summer_24".to_string(),
                    tags,
                    None
                ),
            ]
        );
        assert!(on(&rows, 23)[0].archived);
        assert_eq!(on(&rows, 24)[0].code, "mH1uQWP", "from link, no id");
        assert_eq!(on(&rows, 19)[0].code, "314159");
        assert_eq!(on(&rows, 2)[0].code, on(&rows, 20)[0].code, "the duplicate");
        assert_eq!(
            refusals(&refused),
            [
                (7, Some("no url"), "malformed code: 'no url'"),
                (18, Some("mNb"), "malformed row: missing long_url"),
                (22, None, "malformed row: missing code"),
                (
                    25,
                    Some(&*"Q".repeat(65)),
                    &*format!("malformed code: '{}'", "Q".repeat(65))
                ),
            ]
        );
    }
}
