//! QR codes of short URLs (`GET /v1/links/{code}/qr.svg`, `qr.png?size=N`, and the console's).
//!
//! The symbol is the `qrcode` crate's (error correction M, the version the text needs, a quiet
//! zone of four modules on every side as ISO/IEC 18004 asks). The SVG is its renderer's; the
//! PNG is drawn here from the module grid (whole pixels per module, centred in exactly N×N
//! pixels) and encoded by the `png` crate, so no image library is pulled in for one bitmap.

use qrcode::{Color, EcLevel, QrCode};

/// The smallest, largest and default `size` in pixels.
pub const SIZE_MIN: u32 = 64;
pub const SIZE_MAX: u32 = 2048;
pub const SIZE_DEFAULT: u32 = 512;
/// Modules of quiet zone on each side.
const QUIET: u32 = 4;

/// Why a QR code could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QrError {
    /// `size` is not a whole number of pixels from [`SIZE_MIN`] to [`SIZE_MAX`].
    #[error("size must be a whole number of pixels from {SIZE_MIN} to {SIZE_MAX}")]
    BadSize,
    /// The symbol needs more modules than `size` has pixels.
    #[error("{size} pixels are fewer than this code's {modules} modules; ask for a larger size")]
    TooSmall { size: u32, modules: u32 },
    /// The text does not fit any QR version.
    #[error("the text is too long for a QR code")]
    TooLong,
    /// The PNG encoder failed.
    #[error("encoding the PNG: {0}")]
    Png(String),
}

/// The `size` a query asks for: [`SIZE_DEFAULT`] when absent.
pub fn size(asked: Option<&str>) -> Result<u32, QrError> {
    match asked {
        None => Ok(SIZE_DEFAULT),
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (SIZE_MIN..=SIZE_MAX).contains(n))
            .ok_or(QrError::BadSize),
    }
}

fn symbol(text: &str) -> Result<QrCode, QrError> {
    QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M).map_err(|_| QrError::TooLong)
}

/// `text` as an SVG document of `size`×`size` pixels (dark modules on white).
pub fn svg(text: &str, size: u32) -> Result<String, QrError> {
    let code = symbol(text)?;
    let modules = code.width() as u32 + 2 * QUIET;
    if size < modules {
        return Err(QrError::TooSmall { size, modules });
    }
    let mut svg = code
        .render::<qrcode::render::svg::Color<'_>>()
        .quiet_zone(true)
        .dark_color(qrcode::render::svg::Color("#000000"))
        .light_color(qrcode::render::svg::Color("#ffffff"))
        .build();
    // The renderer sizes the document in whole modules; the viewBox keeps its drawing and the
    // width and height say the size asked for, so it scales to exactly that.
    if let (Some(w), Some(h)) = (attr(&svg, "width"), attr(&svg, "height")) {
        svg = svg.replacen(
            &format!("width=\"{w}\" height=\"{h}\""),
            &format!("width=\"{size}\" height=\"{size}\" viewBox=\"0 0 {w} {h}\""),
            1,
        );
    }
    Ok(svg)
}

/// The value of the first `name="…"` attribute in `doc`.
fn attr<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let start = doc.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = doc[start..].find('"')?;
    Some(&doc[start..start + len])
}

/// `text` as a grayscale PNG of exactly `size`×`size` pixels: each module a square of whole
/// pixels, the symbol with its quiet zone centred on white.
pub fn png(text: &str, size: u32) -> Result<Vec<u8>, QrError> {
    let code = symbol(text)?;
    let width = code.width() as u32;
    let modules = width + 2 * QUIET;
    let scale = size / modules;
    if scale == 0 {
        return Err(QrError::TooSmall { size, modules });
    }
    let offset = (size - modules * scale) / 2 + QUIET * scale;
    let colors = code.to_colors();
    let side = size as usize;
    let mut pixels = vec![255u8; side * side];
    for (i, c) in colors.iter().enumerate() {
        if *c != Color::Dark {
            continue;
        }
        let (mx, my) = (i as u32 % width, i as u32 / width);
        let (x0, y0) = (offset + mx * scale, offset + my * scale);
        for y in y0..y0 + scale {
            let row = y as usize * side;
            pixels[row + x0 as usize..row + (x0 + scale) as usize].fill(0);
        }
    }
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, size, size);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .map_err(|e| QrError::Png(e.to_string()))?;
        writer
            .write_image_data(&pixels)
            .map_err(|e| QrError::Png(e.to_string()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(size(None), Ok(SIZE_DEFAULT));
        assert_eq!(size(Some("64")), Ok(64));
        assert_eq!(size(Some("2048")), Ok(2048));
        for bad in ["63", "2049", "", "1e3", "-1", "512px"] {
            assert_eq!(size(Some(bad)), Err(QrError::BadSize), "{bad}");
        }
    }

    /// The PNG is exactly the size asked, a valid image whose corners are the quiet zone and
    /// whose finder pattern's first module is dark.
    #[test]
    fn png_is_exactly_the_size_asked() {
        for n in [64, 100, 512, 2048] {
            let bytes = png("https://lh.example/AbCdEf1", n).unwrap();
            let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
            let mut reader = decoder.read_info().unwrap();
            let mut buf = vec![0; reader.output_buffer_size().unwrap()];
            let info = reader.next_frame(&mut buf).unwrap();
            assert_eq!((info.width, info.height), (n, n));
            assert_eq!(buf[0], 255, "the corner is quiet zone");
            let code = symbol("https://lh.example/AbCdEf1").unwrap();
            let modules = code.width() as u32 + 8;
            let scale = n / modules;
            let first = (n - modules * scale) / 2 + 4 * scale;
            assert_eq!(
                buf[(first * n + first) as usize],
                0,
                "finder pattern at {n}"
            );
        }
        assert!(matches!(
            png(&"x".repeat(200), 64),
            Err(QrError::TooSmall { .. })
        ));
    }

    #[test]
    fn svg_says_the_size_asked() {
        let s = svg("https://lh.example/AbCdEf1", 300).unwrap();
        assert!(
            s.contains("width=\"300\" height=\"300\" viewBox=\"0 0 "),
            "{s}"
        );
        assert!(s.starts_with("<?xml") || s.starts_with("<svg"), "{s}");
        assert_eq!(svg(&"x".repeat(5000), 512), Err(QrError::TooLong));
    }
}
