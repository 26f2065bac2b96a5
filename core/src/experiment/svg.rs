//! The chart as an SVG file: output tok/s against concurrency, one line per measured run, with
//! a legend. Hand-written SVG (no plotting crate): a few dozen elements, and the core stays pure.

/// Colours that stay apart for the first eight lines (Okabe-Ito, readable with colour blindness).
const COLOURS: [&str; 8] = [
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `series`: each run's name and its tok/s at each of `levels` (as `Report::series` gives them).
/// The x axis places the levels evenly (they are usually powers of two).
pub fn chart(title: &str, levels: &[u32], series: &[(String, Vec<f64>)]) -> String {
    let (w, h) = (720.0, 420.0);
    let (left, right, top, bottom) = (70.0, 200.0, 40.0, 50.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let max = super::results::nice_ceiling(
        series
            .iter()
            .flat_map(|(_, ys)| ys.iter().copied())
            .fold(0.0f64, f64::max),
    );
    let x = |i: usize| {
        if levels.len() <= 1 {
            left + plot_w / 2.0
        } else {
            left + plot_w * i as f64 / (levels.len() - 1) as f64
        }
    };
    let y = |v: f64| top + plot_h * (1.0 - v / max);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"24\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        out.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            left + plot_w,
            y(v),
            y(v),
            left - 6.0,
            y(v) + 4.0,
            crate::benchmark::thousands(v)
        ));
    }
    for (i, l) in levels.iter().enumerate() {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{l}</text>\n",
            x(i),
            top + plot_h + 18.0
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">concurrency</text>\n<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">output tok/s</text>\n",
        left + plot_w / 2.0,
        h - 10.0,
        top + plot_h / 2.0,
        top + plot_h / 2.0
    ));
    for (n, (name, ys)) in series.iter().enumerate() {
        let colour = COLOURS[n % COLOURS.len()];
        let points: Vec<String> = ys
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n",
            points.join(" ")
        ));
        for p in &points {
            let (px, py) = p.split_once(',').expect("a point has two coordinates");
            out.push_str(&format!(
                "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{colour}\"/>\n"
            ));
        }
        let ly = top + 10.0 + 18.0 * n as f64;
        out.push_str(&format!(
            "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            w - right + 15.0,
            w - right + 35.0,
            w - right + 40.0,
            ly + 4.0,
            escape(name)
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// The trade-off as an SVG scatter: each run at each level, `latency` across and output tok/s
/// up, the Pareto front in colour and joined in latency order, the dominated configurations
/// grey; each point labelled `run@concurrency`.
pub fn trade_off(title: &str, latency: &str, points: &[super::results::TradeOff]) -> String {
    let (w, h) = (720.0, 420.0);
    let (left, right, top, bottom) = (70.0, 30.0, 40.0, 50.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let max_x =
        super::results::nice_ceiling(points.iter().map(|p| p.latency_ms).fold(0.0, f64::max));
    let max_y = super::results::nice_ceiling(
        points
            .iter()
            .map(|p| p.output_tokens_per_s)
            .fold(0.0, f64::max),
    );
    let x = |v: f64| left + plot_w * v / max_x;
    let y = |v: f64| top + plot_h * (1.0 - v / max_y);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"24\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for t in 0..=4 {
        let (vx, vy) = (max_x * t as f64 / 4.0, max_y * t as f64 / 4.0);
        out.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            left + plot_w,
            y(vy),
            y(vy),
            left - 6.0,
            y(vy) + 4.0,
            crate::benchmark::thousands(vy),
            x(vx),
            top + plot_h + 18.0,
            crate::benchmark::thousands(vx)
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">output tok/s</text>\n",
        left + plot_w / 2.0,
        h - 10.0,
        escape(latency),
        top + plot_h / 2.0,
        top + plot_h / 2.0
    ));
    let mut front: Vec<&super::results::TradeOff> =
        points.iter().filter(|p| !p.dominated).collect();
    front.sort_by(|a, b| a.latency_ms.total_cmp(&b.latency_ms));
    let line: Vec<String> = front
        .iter()
        .map(|p| format!("{:.1},{:.1}", x(p.latency_ms), y(p.output_tokens_per_s)))
        .collect();
    out.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"{FRONT}\" stroke-width=\"2\" points=\"{}\"/>\n",
        line.join(" ")
    ));
    for p in points {
        let colour = if p.dominated { DOMINATED } else { FRONT };
        let (px, py) = (x(p.latency_ms), y(p.output_tokens_per_s));
        out.push_str(&format!(
            "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{colour}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\">{}@{}</text>\n",
            px + 6.0,
            py - 6.0,
            if p.dominated { DOMINATED } else { "#000000" },
            escape(&p.name),
            p.concurrency
        ));
    }
    out.push_str("</svg>\n");
    out
}

const FRONT: &str = "#0072B2";
const DOMINATED: &str = "#bbbbbb";

/// Charts stacked into one SVG file, top to bottom (each an `<svg>` of its own).
pub fn stacked(charts: &[String]) -> String {
    let size = |svg: &str, attr: &str| -> f64 {
        svg.split_once(&format!("{attr}=\""))
            .and_then(|(_, rest)| rest.split('"').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let width = charts.iter().map(|c| size(c, "width")).fold(0.0, f64::max);
    let height: f64 = charts.iter().map(|c| size(c, "height")).sum();
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">\n"
    );
    let mut at = 0.0;
    for c in charts {
        out.push_str(&c.replacen("<svg ", &format!("<svg y=\"{at}\" "), 1));
        at += size(c, "height");
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    #[test]
    fn one_polyline_and_legend_entry_per_series() {
        let s = vec![
            ("baseline".to_string(), vec![100.0, 400.0]),
            ("a<b".to_string(), vec![50.0, 900.0]),
        ];
        let svg = chart("t", &[1, 4], &s);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">a&lt;b</text>"));
        // 900 tops the axis at 1000: the highest point sits at 90 % of the plot's height.
        assert_holds(&svg, "points=\"70.0,353.5 520.0,73.0\"");
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
    }

    #[test]
    fn the_front_is_joined_in_colour_and_the_dominated_are_grey() {
        use super::super::results::TradeOff;
        let point = |name: &str, c: u32, tps: f64, ms: f64, dominated: bool| TradeOff {
            name: name.into(),
            concurrency: c,
            output_tokens_per_s: tps,
            latency_ms: ms,
            dominated,
        };
        let points = [
            point("base", 1, 100.0, 10.0, false),
            point("base", 4, 300.0, 40.0, false),
            point("slow", 4, 200.0, 60.0, true),
        ];
        let svg = trade_off("t", "ITL p99 ms", &points);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(
            svg.matches("fill=\"#bbbbbb\"").count(),
            2,
            "the grey point and its label"
        );
        assert!(svg.contains(">slow@4</text>") && svg.contains(">base@1</text>"));
        // The front's line joins base@1 (10 ms, 100 tok/s) then base@4 (40 ms, 300 tok/s).
        let line = svg.split("<polyline").nth(1).unwrap();
        assert_eq!(line.matches(',').count(), 2, "{line}");
        let both = stacked(&[svg.clone(), svg]);
        assert!(
            both.starts_with(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"840\""
            ),
            "{both}"
        );
        assert!(both.contains("<svg y=\"420\" "));
    }
}
