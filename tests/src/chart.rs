//! `bench --svg FILE`: the bench table as a bar chart, one bar per op, its length tefl's
//! speed relative to the best peer of the same run (best peer's time / tefl's time), a line
//! at 1.0 (parity). Plain SVG text, no plotting dependency.

use std::fmt::Write as _;

/// One bar: the op, tefl's speed relative to its best peer, and that peer's name.
pub struct Bar {
    /// The op and shape, as in the table.
    pub op: String,
    /// Best peer's time over tefl's (above 1: tefl is faster).
    pub speed: f64,
    /// Which peer was best.
    pub peer: String,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The chart of `bars` with `title` over it.
pub fn svg(title: &str, bars: &[Bar]) -> String {
    const LEFT: f64 = 330.0;
    const PLOT: f64 = 520.0;
    const ROW: f64 = 26.0;
    const TOP: f64 = 56.0;
    let max = bars.iter().map(|b| b.speed).fold(1.25_f64, f64::max).min(4.0);
    let scale = |v: f64| LEFT + PLOT * v.min(max) / max;
    let height = TOP + ROW * bars.len() as f64 + 40.0;
    let width = LEFT + PLOT + 150.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(s, r##"<text x="12" y="24" font-size="15" font-weight="bold">{}</text>"##, escape(title));
    let _ = writeln!(
        s,
        r##"<text x="12" y="42" fill="#555">tefl's speed relative to the best peer in the same run (best peer's time / tefl's time; right of the line: tefl faster)</text>"##
    );
    for (i, b) in bars.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let colour = if b.speed >= 1.0 { "#3a8f4b" } else { "#d9822b" };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 8.0,
            y + 16.0,
            escape(&b.op)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"/>"##,
            y + 4.0,
            scale(b.speed) - LEFT,
            ROW - 8.0
        );
        let more = if b.speed > max { "+" } else { "" };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}">{:.2}×{more} vs {}</text>"##,
            scale(b.speed) + 6.0,
            y + 16.0,
            b.speed,
            escape(&b.peer)
        );
    }
    let x1 = scale(1.0);
    let bottom = TOP + ROW * bars.len() as f64;
    let _ = writeln!(
        s,
        r##"<line x1="{x1:.1}" y1="{:.1}" x2="{x1:.1}" y2="{bottom:.1}" stroke="black" stroke-dasharray="4 3"/>"##,
        TOP - 4.0
    );
    let _ = writeln!(s, r##"<text x="{x1:.1}" y="{:.1}" text-anchor="middle">1.0</text>"##, bottom + 18.0);
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_with_speed_and_names_are_escaped() {
        let bars = [
            Bar { op: "gemm 4096^3".into(), speed: 2.0, peer: "eager".into() },
            Bar { op: "a<b & c".into(), speed: 0.5, peer: "sdpa_cudnn".into() },
        ];
        let s = svg("H100 <test>", &bars);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("a&lt;b &amp; c") && s.contains("H100 &lt;test&gt;") && !s.contains("a<b"));
        // Widths: 2.0 of a 2.0 axis fills the plot; 0.5 a quarter of it.
        assert!(s.contains(r##"width="520.0" height="18.0" fill="#3a8f4b""##), "{s}");
        assert!(s.contains(r##"width="130.0" height="18.0" fill="#d9822b""##), "{s}");
        assert!(s.contains("2.00× vs eager") && s.contains("0.50× vs sdpa_cudnn"));
    }
}
