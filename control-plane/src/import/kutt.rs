//! Kutt: API v2 link objects as JSON.
//!
//! `GET /api/v2/links` answers pages `{"limit": 50, "skip": 0, "total": 120, "data": [...]}`
//! (thedevs-network/kutt, `server/handlers/links`; Shlink's importer reads the same pages,
//! shlinkio/shlink-importer `src/Sources/Kutt/KuttImporter.php`). A link object
//! (`sanitize.link` in `server/utils/utils.js`) has `address` (the code), `target`, `domain`
//! (the custom domain, `null` for the instance's own), `description` (the title), `created_at`
//! and `expire_in` (ISO 8601 from `Date.toISOString()`, or `2024-01-02 03:04:05` in UTC from
//! SQLite in older versions; `expire_in` may be `null`), `visit_count`, and fields this reader
//! has no use for (`id`, `banned`, `password`, `link`, `updated_at`). Kutt has no tags; a `tags`
//! array of strings is read if some tool added one. Pages, bare arrays and NDJSON are all read
//! (`json.rs`).

use std::io::Read;

use serde_json::{Map, Value};

use super::fields;
use super::json;
use super::short_link::{self, quote};
use super::source::Source;
use super::{Emit, Refused, Row};

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    json::each_element(source, "Kutt", "data", &mut |line, element| {
        let item = match element {
            Ok(object) => link(line, &object),
            Err(reason) => Err(Refused {
                line,
                code: None,
                reason,
            }),
        };
        sink.emit(item)
    })
}

fn link(line: u64, object: &Map<String, Value>) -> Result<Row, Refused> {
    let refuse = |code: Option<String>| {
        move |reason| Refused {
            line,
            code: code.clone(),
            reason,
        }
    };
    let address = json::text(object, "address").map_err(refuse(None))?;
    let code = short_link::code(address).map_err(|bad| bad.at(line))?;
    let refuse = refuse(Some(code.clone()));
    let domain = match json::text(object, "domain").map_err(&refuse)? {
        "" => None,
        domain => Some(
            short_link::host(domain)
                .ok_or_else(|| refuse(format!("malformed domain: {}", quote(domain))))?,
        ),
    };
    Ok(Row {
        line,
        domain,
        long_url: fields::long_url(json::text(object, "target").map_err(&refuse)?)
            .map_err(&refuse)?,
        title: fields::text(json::text(object, "description").map_err(&refuse)?),
        created_at_ms: fields::time(
            json::text(object, "created_at").map_err(&refuse)?,
            "created_at",
        )
        .map_err(&refuse)?,
        tags: json::texts(object, "tags")
            .map_err(&refuse)?
            .into_iter()
            .filter_map(fields::text)
            .collect(),
        expires_at_ms: fields::time(
            json::text(object, "expire_in").map_err(&refuse)?,
            "expire_in",
        )
        .map_err(&refuse)?,
        clicks: json::count(object, "visit_count").map_err(&refuse)?,
        archived: false,
        code,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::Format;

    #[test]
    fn a_link_object_gives_its_fields() {
        let (rows, refused, _) = collect(
            Format::Kutt,
            r#"{"limit":50,"skip":0,"total":3,"data":[
              {"id":"6a3f","address":"aB3xY","banned":false,"created_at":"2024-01-02T03:04:05.678Z",
               "updated_at":"2024-01-02T03:04:05.678Z","description":"Ελληνικά","expire_in":"2025-01-01T00:00:00.000Z",
               "password":false,"target":"https://a.example/x","visit_count":17,"domain":"Go.Brand.Example",
               "link":"https://go.brand.example/aB3xY"},
              {"address":"/cd","target":"https://a.example/y","domain":null,"created_at":"2024-01-02 03:04:05",
               "expire_in":null,"visit_count":"4","tags":["a"," "]},
              {"address":"ef","target":"https://a.example/z","domain":"bad domain"}]}"#
                .as_bytes(),
        );
        assert_eq!(
            rows,
            [
                row(1, Some("go.brand.example"), "aB3xY", "https://a.example/x")
                    .title("Ελληνικά")
                    .created(1_704_164_645_678)
                    .expires(1_735_689_600_000)
                    .clicks(17),
                row(2, None, "cd", "https://a.example/y")
                    .created(1_704_164_645_000)
                    .clicks(4)
                    .tags(&["a"]),
            ]
        );
        assert_eq!(
            refusals(&refused),
            [(3, Some("ef"), "malformed domain: 'bad domain'")]
        );
    }

    #[test]
    fn wrong_types_are_refused_not_guessed() {
        let (_, refused, _) = collect(
            Format::Kutt,
            br#"[{"address":5,"target":"https://a.example"},
                 {"address":"a","target":"https://a.example","visit_count":-3},
                 {"address":"b","target":["https://a.example"]}]"#,
        );
        assert_eq!(
            refusals(&refused),
            [
                (1, None, "malformed row: address is not a string"),
                (2, Some("a"), "malformed visit_count: -3"),
                (3, Some("b"), "malformed row: target is not a string"),
            ]
        );
    }

    #[test]
    fn the_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Kutt, &fixture("kutt.json"));
        assert_eq!((counts.records, counts.rows, counts.refused), (31, 28, 3));
        assert_eq!(
            rows[0],
            row(
                1,
                None,
                "ENPZhp",
                "https://www.shop.example/spring/collection?utm_source=import"
            )
            .title("Spring collection")
            .created(1_704_251_046_678)
            .clicks(0)
        );
        assert_eq!(on(&rows, 16)[0].expires_at_ms, Some(1_736_121_600_000));
        assert_eq!(on(&rows, 17)[0].domain.as_deref(), Some("go.brand.example"));
        assert_eq!(on(&rows, 8)[0].domain.as_deref(), Some("go.brand.example"));
        assert_eq!(on(&rows, 9)[0].domain, None);
        assert_eq!(
            on(&rows, 23)[0].created_at_ms,
            Some(1_623_053_350_000),
            "SQLite's spelling, UTC"
        );
        assert_eq!(on(&rows, 24)[0].clicks, Some(42));
        assert_eq!(on(&rows, 31)[0].tags, ["promo", "kutt"]);
        assert_eq!(on(&rows, 19)[0].code, "ENPZhp", "the duplicate");
        assert_eq!(
            refusals(&refused),
            [
                (18, Some("has space"), "malformed code: 'has space'"),
                (20, Some("notarget"), "malformed row: missing long_url"),
                (
                    22,
                    Some(&*"K".repeat(65)),
                    &*format!("malformed code: '{}'", "K".repeat(65))
                ),
            ]
        );
    }
}
