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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(svg.contains("points=\"70.0,353.5 520.0,73.0\""), "{svg}");
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
    }
}
