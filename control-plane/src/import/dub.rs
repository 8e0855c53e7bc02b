//! Dub: the CSV of links its dashboard exports (`GET /api/links/export`).
//!
//! The columns are chosen in the export dialog; their labels and order come from
//! `exportLinksColumns` (dubinc/dub, `apps/web/lib/zod/schemas/links.ts`): `Short link` (the
//! full URL, `https://dub.sh/key`, from `linkConstructor`), `Destination URL`, `Clicks`,
//! `Leads`, `Conversions`, `Revenue`, `Created at` (`Date.toISOString()`), `Link ID`,
//! `Updated at`, `Tags` (tag names joined with `", "`), `Archived` (`Yes`/`No`). Earlier exports
//! used the field names as headers (`link`, `url`, `clicks`, `createdAt`, `tags`, `archived`),
//! and before that `domain` and `key` in two columns; all are read, names folded (`table.rs`).
//! `Title` and `Expires at` are read when a file has them.
//!
//! Dub's CSV writer (`apps/web/lib/analytics/utils/convert-to-csv.ts`) guards against
//! spreadsheet formula injection by putting `'` before any text that starts with `=`, `+`, `-`,
//! `@`, a tab or a line break; that `'` is taken off again here. A domain's root link (key
//! `_root`) has no path, so no code, and is refused.

use std::io::Read;

use super::fields;
use super::short_link;
use super::source::Source;
use super::table::{Delimiter, Table};
use super::{Emit, Refused, Row};

pub(super) fn read<R: Read>(source: Source<R>, sink: &mut dyn Emit) -> anyhow::Result<()> {
    let mut table = Table::open(source, Delimiter::Sniffed);
    let header = table.header()?;
    let long_url = header.require(
        "Dub",
        &["Destination URL", "url", "destination", "long_url"],
    )?;
    let short = header.find(&["Short link", "link", "short_url", "shortLink"]);
    let (domain, key) = (header.find(&["domain"]), header.find(&["key"]));
    if short.is_none() && key.is_none() {
        header.require("Dub", &["Short link", "link", "key"])?;
    }
    let title = header.find(&["title"]);
    let created_at = header.find(&["Created at", "createdAt"]);
    let expires_at = header.find(&["Expires at", "expiresAt"]);
    let tags = header.find(&["tags"]);
    let clicks = header.find(&["clicks"]);
    let archived = header.find(&["archived"]);
    while let Some((line, cells)) = table.next()? {
        let item = cells.and_then(|cells| {
            let cell = |column| unguard(cells.get(column));
            let link = match (cell(short), cell(domain), cell(key)) {
                ("", "", key) => short_link::code(key).map(|code| (None, code)),
                ("", domain, key) => short_link::short_link(&format!("{domain}/{key}")),
                (link, _, _) => short_link::short_link(link),
            };
            let (domain, code) = link.map_err(|bad| bad.at(line))?;
            let refuse = |reason| Refused {
                line,
                code: Some(code.clone()),
                reason,
            };
            Ok(Row {
                line,
                domain,
                long_url: fields::long_url(cell(Some(long_url))).map_err(&refuse)?,
                title: fields::text(cell(title)),
                created_at_ms: fields::time(cell(created_at), "Created at").map_err(&refuse)?,
                tags: fields::tags(cell(tags), &[',']),
                expires_at_ms: fields::time(cell(expires_at), "Expires at").map_err(&refuse)?,
                clicks: fields::clicks(cell(clicks)).map_err(&refuse)?,
                archived: fields::flag(cell(archived), "Archived").map_err(&refuse)?,
                code,
            })
        });
        sink.emit(item)?;
    }
    Ok(())
}

/// A cell without the `'` Dub's writer put before text a spreadsheet would run as a formula.
fn unguard(cell: &str) -> &str {
    match cell.strip_prefix('\'') {
        Some(rest) if rest.starts_with(['=', '+', '-', '@', '\t', '\r', '\n']) => rest,
        _ => cell,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{collect, fixture, on, refusals, row, Build};
    use super::super::Format;
    use super::unguard;

    #[test]
    fn the_current_labels_give_every_field() {
        let (rows, refused, _) = collect(
            Format::Dub,
            b"Short link,Destination URL,Clicks,Created at,Link ID,Tags,Archived\n\
              https://dub.sh/x7Yz_,https://a.example/x,12,2024-03-05T12:34:56.789Z,link_1,\"launch, q1\",Yes\n\
              https://Go.Acme.example/spring,https://a.example/y,0,2024-03-05T12:34:56.789Z,link_2,'-beta,No\n\
              https://dub.sh,https://a.example/z,0,2024-03-05T12:34:56.789Z,link_3,,No\n",
        );
        assert_eq!(
            rows,
            [
                row(1, Some("dub.sh"), "x7Yz_", "https://a.example/x")
                    .clicks(12)
                    .created(1_709_642_096_789)
                    .tags(&["launch", "q1"])
                    .archived(),
                row(2, Some("go.acme.example"), "spring", "https://a.example/y")
                    .clicks(0)
                    .created(1_709_642_096_789)
                    .tags(&["-beta"]),
            ]
        );
        assert_eq!(
            refusals(&refused),
            [(3, None, "malformed row: missing code")]
        );
    }

    #[test]
    fn older_headers_are_read_too() {
        let (rows, _, _) = collect(
            Format::Dub,
            b"domain,key,url,clicks,createdAt\ndub.sh,abc,https://a.example/x,3,2024-03-05T12:34:56.789Z\n",
        );
        assert_eq!(
            rows,
            [row(1, Some("dub.sh"), "abc", "https://a.example/x")
                .clicks(3)
                .created(1_709_642_096_789)]
        );
        let (rows, _, _) = collect(
            Format::Dub,
            b"link,url\nhttps://dub.sh/abc,https://a.example/x\n",
        );
        assert_eq!(rows, [row(1, Some("dub.sh"), "abc", "https://a.example/x")]);
    }

    #[test]
    fn only_the_formula_guard_is_taken_off() {
        assert_eq!(unguard("'=SUM(A1)"), "=SUM(A1)");
        assert_eq!(unguard("'-x"), "-x");
        assert_eq!(unguard("'quoted'"), "'quoted'");
        assert_eq!(unguard("plain"), "plain");
    }

    #[test]
    fn the_fixture_reads_as_its_readme_says() {
        let (rows, refused, counts) = collect(Format::Dub, &fixture("dub.csv"));
        assert_eq!((counts.records, counts.rows, counts.refused), (31, 26, 5));
        assert_eq!(
            on(&rows, 2),
            [row(
                2,
                Some("dub.sh"),
                "sq3YJgV",
                "https://docs.example/guide/getting-started#install"
            )
            .created(1_709_815_016_789)
            .tags(&["launch", "q1"])
            .clicks(13)]
        );
        assert_eq!(on(&rows, 7)[0].domain.as_deref(), Some("go.acme.example"));
        assert!(on(&rows, 20)[0].archived);
        assert_eq!(on(&rows, 22)[0].tags, ["-beta", "launch"]);
        assert_eq!(
            on(&rows, 23),
            [row(
                23,
                Some("go.acme.example"),
                "Spring_Sale",
                "https://café.example/menu/été"
            )
            .created(1_711_630_676_789)
            .clicks(99)]
        );
        assert_eq!(on(&rows, 18)[0].code, "371FlDH", "the duplicate");
        assert_eq!(
            refusals(&refused),
            [
                (16, None, "malformed row: missing code"),
                (17, Some("with space"), "malformed code: 'with space'"),
                (19, Some("nodest"), "malformed row: missing long_url"),
                (
                    21,
                    Some(&*"D".repeat(65)),
                    &*format!("malformed code: '{}'", "D".repeat(65))
                ),
                (25, Some("folder/key"), "malformed code: 'folder/key'"),
            ]
        );
    }
}
