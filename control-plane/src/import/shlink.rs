//! Shlink: the CSV its web client exports (the "Export" button over the short URLs list).
//!
//! The client (shlinkio/shlink-web-component, `src/short-urls/helpers/ExportShortUrlsBtn.tsx`)
//! maps each short URL to `createdAt, domain, shortCode, shortUrl, longUrl, title, tags,
//! visits` and writes them with json2csv, header first, every text quoted. `createdAt` is the
//! API's `dateCreated`, PHP's ATOM (`2023-05-01T10:00:00+02:00`); `domain` is the host of
//! `shortUrl`; `tags` are joined with `|` (as Shlink's own CSV importer splits them,
//! shlinkio/shlink-importer `src/Sources/Csv/CsvImporter.php`); `visits` is the total. Earlier
//! clients wrote `createdAt, title, shortUrl, longUrl, tags, visits`, without `domain` and
//! `shortCode`: then the code and domain come from `shortUrl`.
//!
//! When the file has a `domain` column it decides the domain: empty, or `DEFAULT` (the API's
//! name for the default domain), is none, even though `shortUrl` has a host.

use std::io::Read;

use super::fields;
use super::short_link::{self, quote};
use super::source::Source;
use super::table::{Delimiter, Table};
use super::{Emit, Refused, Row};

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    let mut table = Table::open(source, Delimiter::Sniffed);
    let header = table.header()?;
    let long_url = header.require("Shlink", &["longUrl"])?;
    let short_code = header.find(&["shortCode"]);
    let short_url = header.find(&["shortUrl"]);
    if short_code.is_none() && short_url.is_none() {
        header.require("Shlink", &["shortCode", "shortUrl"])?;
    }
    let domain = header.find(&["domain"]);
    let title = header.find(&["title"]);
    let created_at = header.find(&["createdAt", "dateCreated"]);
    let tags = header.find(&["tags"]);
    let visits = header.find(&["visits", "visitsCount"]);
    while let Some((line, cells)) = table.next()? {
        let item = cells.and_then(|cells| {
            let (host, code) = match cells.get(short_code) {
                "" => short_link::short_link(cells.get(short_url)),
                code => short_link::code(code).map(|code| (None, code)),
            }
            .map_err(|bad| bad.at(line))?;
            let refuse = |reason| Refused {
                line,
                code: Some(code.clone()),
                reason,
            };
            let domain = match (domain, cells.get(domain)) {
                (None, _) => host.or_else(|| {
                    short_link::short_link(cells.get(short_url))
                        .ok()
                        .and_then(|(host, _)| host)
                }),
                (Some(_), "") => None,
                (Some(_), d) if d.eq_ignore_ascii_case("DEFAULT") => None,
                (Some(_), d) => Some(
                    short_link::host(d)
                        .ok_or_else(|| refuse(format!("malformed domain: {}", quote(d))))?,
                ),
            };
            Ok(Row {
                line,
                domain,
                long_url: fields::long_url(cells.get(Some(long_url))).map_err(&refuse)?,
                title: fields::text(cells.get(title)),
                created_at_ms: fields::time(cells.get(created_at), "createdAt").map_err(&refuse)?,
                tags: fields::tags(cells.get(tags), &['|']),
                expires_at_ms: None,
                clicks: fields::clicks(cells.get(visits)).map_err(&refuse)?,
                archived: false,
                code,
            })
        });
        sink.emit(item)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::Format;

    #[test]
    fn the_current_export_gives_domain_code_and_piped_tags() {
        let (rows, refused, _) = collect(
            Format::Shlink,
            b"\"createdAt\",\"domain\",\"shortCode\",\"shortUrl\",\"longUrl\",\"title\",\"tags\",\"visits\"\n\
              \"2023-05-01T10:00:00+02:00\",\"S.Example\",\"abc12\",\"https://s.example/abc12\",\"https://a.example/x\",\"\",\"one|two\",5\n\
              \"2023-05-01T10:00:00+02:00\",\"DEFAULT\",\"def\",\"https://s.example/def\",\"https://a.example/y\",\"T\",\"\",0\n\
              \"2023-05-01T10:00:00+02:00\",\"\",\"ghi\",\"https://s.example/ghi\",\"https://a.example/z\",\"\",\"\",\n",
        );
        assert_eq!(
            rows,
            [
                row(1, Some("s.example"), "abc12", "https://a.example/x")
                    .created(1_682_928_000_000)
                    .tags(&["one", "two"])
                    .clicks(5),
                row(2, None, "def", "https://a.example/y")
                    .title("T")
                    .created(1_682_928_000_000)
                    .clicks(0),
                row(3, None, "ghi", "https://a.example/z").created(1_682_928_000_000),
            ]
        );
        assert!(refused.is_empty());
    }

    #[test]
    fn the_older_export_takes_code_and_domain_from_the_short_url() {
        let (rows, _, _) = collect(
            Format::Shlink,
            b"createdAt,title,shortUrl,longUrl,tags,visits\n\
              2019-08-26T19:49:25+02:00,,https://S.example/Xy_1,https://a.example/x,,3\n",
        );
        assert_eq!(
            rows,
            [row(1, Some("s.example"), "Xy_1", "https://a.example/x")
                .created(1_566_841_765_000)
                .clicks(3)]
        );
    }

    #[test]
    fn the_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Shlink, &fixture("shlink.csv"));
        assert_eq!((counts.records, counts.rows, counts.refused), (30, 26, 4));
        assert_eq!(
            rows[0],
            row(
                1,
                Some("s.example"),
                "f8mjV",
                "https://www.shop.example/spring/collection?utm_source=import"
            )
            .title("Spring collection")
            .created(1_683_018_000_000)
            .clicks(0)
        );
        assert_eq!(on(&rows, 2)[0].tags, ["shlink", "import"]);
        assert_eq!(on(&rows, 9)[0].domain.as_deref(), Some("doma.in"));
        assert_eq!(
            (
                on(&rows, 16)[0].domain.clone(),
                on(&rows, 17)[0].domain.clone()
            ),
            (None, None)
        );
        assert_eq!(on(&rows, 19)[0].code, "t1fVl", "the duplicate");
        assert_eq!(on(&rows, 24)[0].code, "007");
        assert_eq!(
            refusals(&refused),
            [
                (18, Some("a b"), "malformed code: 'a b'"),
                (20, Some("missing"), "malformed row: missing long_url"),
                (
                    22,
                    Some(&*"S".repeat(65)),
                    &*format!("malformed code: '{}'", "S".repeat(65))
                ),
                (23, Some("multi/segment"), "malformed code: 'multi/segment'"),
            ]
        );
    }
}
