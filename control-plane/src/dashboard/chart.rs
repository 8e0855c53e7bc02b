//! The clicks-by-day chart: an SVG drawn here, bars of human clicks with the day's bot clicks
//! stacked above in grey, an axis with its maximum and the first and last days.
//!
//! Drawn by hand rather than with a charting crate: a bar chart is forty lines of `<rect>`s,
//! while plotters' SVG backend needs a font stack (its text layout) that the binary does not
//! otherwise carry. Every value is a number or an escaped day, so nothing in it is markup from
//! outside.

use maud::{html, Markup};

/// One bar: its label (a day), human clicks, bot clicks.
pub struct Bar<'a> {
    pub label: &'a str,
    pub human: u64,
    pub bot: u64,
}

const W: u64 = 720;
const H: u64 = 220;
const LEFT: u64 = 48;
const BOTTOM: u64 = 24;
const TOP: u64 = 10;

/// The chart of `bars`, titled `title` for assistive technology.
pub fn bars(title: &str, bars: &[Bar<'_>]) -> Markup {
    let max = bars
        .iter()
        .map(|b| b.human + b.bot)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = W - LEFT - 8;
    let plot_h = H - BOTTOM - TOP;
    let n = bars.len().max(1) as u64;
    let slot = plot_w as f64 / n as f64;
    let bar_w = (slot * 0.8).max(1.0);
    let y = |v: u64| TOP as f64 + plot_h as f64 * (1.0 - v as f64 / max as f64);
    let height = |v: u64| plot_h as f64 * v as f64 / max as f64;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) {
            title { (title) }
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(H - BOTTOM) stroke="#767676" {}
            line x1=(LEFT) y1=(H - BOTTOM) x2=(W - 8) y2=(H - BOTTOM) stroke="#767676" {}
            text x=(LEFT - 6) y=(TOP + 10) text-anchor="end" font-size="11" fill="#111" { (max) }
            text x=(LEFT - 6) y=(H - BOTTOM) text-anchor="end" font-size="11" fill="#111" { "0" }
            @for (i, b) in bars.iter().enumerate() {
                @let x = LEFT as f64 + slot * i as f64 + (slot - bar_w) / 2.0;
                g {
                    title { (b.label) ": " (b.human) " human, " (b.bot) " bot" }
                    rect x=(fmt(x)) y=(fmt(y(b.human))) width=(fmt(bar_w)) height=(fmt(height(b.human))) fill="#0b4f9c" {}
                    rect x=(fmt(x)) y=(fmt(y(b.human + b.bot))) width=(fmt(bar_w)) height=(fmt(height(b.bot))) fill="#b9b9b9" {}
                }
            }
            @if let (Some(first), Some(last)) = (bars.first(), bars.last()) {
                text x=(LEFT) y=(H - 6) font-size="11" fill="#111" { (first.label) }
                text x=(W - 8) y=(H - 6) text-anchor="end" font-size="11" fill="#111" { (last.label) }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_highest_day_and_escape_labels() {
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
        assert!(svg.contains("Clicks &lt;by day&gt;"), "{svg}");
        assert!(
            svg.contains(">4</text>"),
            "the axis says the highest stack: {svg}"
        );
        assert!(svg.contains("2026-03-01: 3 human, 1 bot"), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 4);
    }
}
