//! The clicks-by-day chart: an SVG drawn server-side by plotters (its SVG backend, no font
//! stack needed), each day's human clicks in blue with the day's bot clicks stacked above in
//! grey. Labels are numbers and days, so nothing in it is markup from outside; the title is
//! escaped.

use maud::{html, Markup, PreEscaped};
use plotters::prelude::*;

/// One bar: its label (a day), human clicks, bot clicks.
pub struct Bar<'a> {
    pub label: &'a str,
    pub human: u64,
    pub bot: u64,
}

const SIZE: (u32, u32) = (720, 220);
const HUMAN: RGBColor = RGBColor(0x0b, 0x4f, 0x9c);
const BOT: RGBColor = RGBColor(0xb9, 0xb9, 0xb9);

/// The chart of `bars`, titled `title` for assistive technology.
pub fn bars(title: &str, bars: &[Bar<'_>]) -> Markup {
    match draw(bars) {
        Ok(svg) => {
            // The document as plotters wrote it, named for screen readers.
            let label = html! { (title) }.into_string();
            let svg = svg.replacen(
                "<svg ",
                &format!("<svg role=\"img\" aria-label=\"{label}\" "),
                1,
            );
            let svg = match svg.find('>') {
                Some(end) => format!("{}<title>{label}</title>{}", &svg[..=end], &svg[end + 1..]),
                None => svg,
            };
            html! { (PreEscaped(svg)) }
        }
        Err(e) => html! { p.error { "The chart could not be drawn: " (e) } },
    }
}

fn draw(bars: &[Bar<'_>]) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let n = bars.len().max(1) as u32;
    let max = bars
        .iter()
        .map(|b| b.human + b.bot)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(48)
            .build_cartesian_2d((0u32..n).into_segmented(), 0u64..max + max / 10 + 1)
            .map_err(|e| err(&e))?;
        let label_of = |v: &SegmentValue<u32>| match v {
            SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => bars
                .get(*i as usize)
                .map(|b| b.label.to_string())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(6)
            .x_label_formatter(&label_of)
            .y_labels(5)
            .label_style(("sans-serif", 11).into_font().color(&BLACK))
            .axis_style(RGBColor(0x76, 0x76, 0x76))
            .draw()
            .map_err(|e| err(&e))?;
        // Totals in grey, humans over them in blue: the grey left showing is the bots.
        for (color, with_bots) in [(BOT, true), (HUMAN, false)] {
            let height = |b: &Bar<'_>| b.human + if with_bots { b.bot } else { 0 };
            chart
                .draw_series(
                    Histogram::vertical(&chart)
                        .style(color.filled())
                        .margin(1)
                        .data(bars.iter().enumerate().map(|(i, b)| (i as u32, height(b)))),
                )
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_drawn_with_an_escaped_title() {
        let svg = bars(
            "Clicks <by day>",
            &[
                Bar {
                    label: "2026-03-01",
                    human: 3,
                    bot: 1,
                },
                Bar {
                    label: "2026-03-02",
                    human: 0,
                    bot: 0,
                },
            ],
        )
        .into_string();
        assert!(svg.starts_with("<svg role=\"img\""), "{svg}");
        assert!(
            svg.contains("<title>Clicks &lt;by day&gt;</title>"),
            "{svg}"
        );
        assert!(svg.contains("2026-03-01"), "the days label the axis: {svg}");
        assert!(
            svg.contains("#0B4F9C") || svg.contains("#0b4f9c"),
            "human bars: {svg}"
        );
        assert!(!svg.contains("<by day>"));
    }
}
