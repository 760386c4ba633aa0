//! An SVG chart of a replay's time series: GPU utilisation (0–100 %) in the
//! top panel and queue depth in the bottom panel, over a shared time axis in
//! seconds since the first submission. Written by hand so the benchmarks
//! need no plotting dependency; any browser renders it.

use std::fmt::Write;

use crate::report::Sample;

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 770.0;
const UTIL_TOP: f64 = 60.0;
const UTIL_BOTTOM: f64 = 240.0;
const QUEUE_TOP: f64 = 300.0;
const QUEUE_BOTTOM: f64 = 480.0;
const UTIL_COLOUR: &str = "#1f77b4";
const QUEUE_COLOUR: &str = "#d62728";

/// A linear map from a data interval onto a pixel interval.
#[derive(Clone, Copy)]
struct Scale {
    from: (f64, f64),
    to: (f64, f64),
}

impl Scale {
    fn map(self, v: f64) -> f64 {
        self.to.0 + (v - self.from.0) / (self.from.1 - self.from.0) * (self.to.1 - self.to.0)
    }
}

/// A "nice" tick step (1, 2 or 5 × a power of ten) giving about five ticks
/// from 0 to at least `max`, and the top of the axis (a multiple of the
/// step). An empty range is shown as 0 to 1 so the axis still has ticks.
fn nice_axis(max: f64, whole_numbers: bool) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    if whole_numbers {
        step = step.max(1.0).round();
    }
    (step, (max / step).ceil() * step)
}

/// Tick values 0, step, …, top. Computed as k × step so they do not drift.
fn ticks(step: f64, top: f64) -> impl Iterator<Item = f64> {
    let count = (top / step).round() as u32;
    (0..=count).map(move |k| f64::from(k) * step)
}

fn label(v: f64) -> String {
    // Shortest round-trip form after rounding away float noise such as
    // 0.30000000000000004.
    let rounded = (v * 1e6).round() / 1e6;
    format!("{rounded}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `series` as a standalone SVG document titled `title`. Samples
/// with a non-finite time or utilisation are left out, so every number in
/// the output is finite. An empty series gives the axes with empty lines.
pub fn render_svg(series: &[Sample], title: &str) -> String {
    let points: Vec<&Sample> = series
        .iter()
        .filter(|s| s.t_seconds.is_finite() && s.gpu_utilisation.is_finite())
        .collect();
    let t_max = points.iter().map(|s| s.t_seconds).fold(0.0, f64::max);
    let q_max = points.iter().map(|s| s.queue_depth).max().unwrap_or(0);
    let (t_step, t_top) = nice_axis(t_max, false);
    let (q_step, q_top) = nice_axis(f64::from(q_max), true);
    let x = Scale {
        from: (0.0, t_top),
        to: (LEFT, RIGHT),
    };
    let y_util = Scale {
        from: (0.0, 100.0),
        to: (UTIL_BOTTOM, UTIL_TOP),
    };
    let y_queue = Scale {
        from: (0.0, q_top),
        to: (QUEUE_BOTTOM, QUEUE_TOP),
    };

    let mut svg = String::new();
    // Writing to a String cannot fail, so the fmt::Results are dropped.
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.2}" y="30" text-anchor="middle" font-size="16">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );

    panel(
        &mut svg,
        "GPU utilisation (%)",
        (UTIL_TOP, UTIL_BOTTOM),
        y_util,
        ticks(25.0, 100.0),
        x,
        (t_step, t_top),
    );
    panel(
        &mut svg,
        "queue depth (jobs)",
        (QUEUE_TOP, QUEUE_BOTTOM),
        y_queue,
        ticks(q_step, q_top),
        x,
        (t_step, t_top),
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">time since first submission (s)</text>"#,
        (LEFT + RIGHT) / 2.0,
        QUEUE_BOTTOM + 45.0
    );

    let line = |value: &dyn Fn(&Sample) -> f64, y: Scale| -> String {
        points
            .iter()
            .map(|s| format!("{:.2},{:.2}", x.map(s.t_seconds), y.map(value(s))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        svg,
        r#"<polyline class="gpu-utilisation" fill="none" stroke="{UTIL_COLOUR}" stroke-width="1.5" points="{}"/>"#,
        line(&|s| s.gpu_utilisation * 100.0, y_util)
    );
    let _ = writeln!(
        svg,
        r#"<polyline class="queue-depth" fill="none" stroke="{QUEUE_COLOUR}" stroke-width="1.5" points="{}"/>"#,
        line(&|s| f64::from(s.queue_depth), y_queue)
    );
    svg.push_str("</svg>\n");
    svg
}

/// One panel: frame, horizontal grid lines with y tick labels, x ticks with
/// labels under the panel, and the rotated y-axis title.
fn panel(
    svg: &mut String,
    y_title: &str,
    (top, bottom): (f64, f64),
    y: Scale,
    y_ticks: impl Iterator<Item = f64>,
    x: Scale,
    (t_step, t_top): (f64, f64),
) {
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT:.2}" y="{top:.2}" width="{:.2}" height="{:.2}" fill="none" stroke="#333"/>"##,
        RIGHT - LEFT,
        bottom - top
    );
    for v in y_ticks {
        let py = y.map(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT:.2}" y1="{py:.2}" x2="{RIGHT:.2}" y2="{py:.2}" stroke="#ddd"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            py + 4.0,
            label(v)
        );
    }
    for t in ticks(t_step, t_top) {
        let px = x.map(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.2}" y1="{bottom:.2}" x2="{px:.2}" y2="{:.2}" stroke="#333"/>"##,
            bottom + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{px:.2}" y="{:.2}" text-anchor="middle">{}</text>"#,
            bottom + 18.0,
            label(t)
        );
    }
    let (cx, cy) = (LEFT - 50.0, (top + bottom) / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{cx:.2}" y="{cy:.2}" text-anchor="middle" transform="rotate(-90 {cx:.2} {cy:.2})">{}</text>"#,
        escape(y_title)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, u: f64, q: u32) -> Sample {
        Sample {
            t_seconds: t,
            gpu_utilisation: u,
            queue_depth: q,
        }
    }

    /// Checks that tags nest: every opened element is closed in order.
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let end = rest[start..].find('>').map(|e| start + e);
            let Some(end) = end else {
                panic!("unterminated tag in {svg}");
            };
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap_or(""));
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed: {open:?}");
    }

    fn polyline_points(svg: &str, class: &str) -> Vec<(f64, f64)> {
        let marker = format!(r#"class="{class}""#);
        let line = svg
            .lines()
            .find(|l| l.starts_with("<polyline") && l.contains(&marker))
            .unwrap_or_default();
        let points = line
            .split(r#"points=""#)
            .nth(1)
            .and_then(|p| p.split('"').next())
            .unwrap_or_default();
        points
            .split_whitespace()
            .map(|pair| {
                let mut xy = pair
                    .split(',')
                    .map(|n| n.parse::<f64>().unwrap_or(f64::NAN));
                (xy.next().unwrap_or(f64::NAN), xy.next().unwrap_or(f64::NAN))
            })
            .collect()
    }

    fn all_numbers_finite(svg: &str) -> bool {
        svg.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
            .filter(|w| w.starts_with(|c: char| c.is_ascii_digit() || c == '-'))
            .filter_map(|w| w.parse::<f64>().ok())
            .all(f64::is_finite)
            && !svg.contains("NaN")
            && !svg.contains("inf")
    }

    #[test]
    fn document_is_well_formed_with_title_axes_and_lines() {
        let series = [
            sample(0.0, 0.0, 0),
            sample(50.0, 0.5, 3),
            sample(100.0, 1.0, 7),
        ];
        let svg = render_svg(&series, "replay <tiresias> & co");
        assert!(svg.starts_with("<svg"));
        assert!(svg.ends_with("</svg>\n"));
        assert_well_formed(&svg);
        assert!(svg.contains("replay &lt;tiresias&gt; &amp; co"));
        assert!(svg.contains("GPU utilisation (%)"));
        assert!(svg.contains("queue depth (jobs)"));
        assert!(svg.contains("time since first submission (s)"));
        assert!(svg.contains(">100</text>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(all_numbers_finite(&svg));
    }

    #[test]
    fn points_map_onto_the_panels() {
        // t axis: max 100 -> ticks of 20 up to 100; queue: max 7 -> ticks
        // of 2 up to 8.
        let series = [
            sample(0.0, 0.0, 0),
            sample(50.0, 0.5, 4),
            sample(100.0, 1.0, 8),
        ];
        let svg = render_svg(&series, "t");
        let util = polyline_points(&svg, "gpu-utilisation");
        let queue = polyline_points(&svg, "queue-depth");
        let mid_x = (LEFT + RIGHT) / 2.0;
        assert_eq!(
            util,
            vec![
                (LEFT, UTIL_BOTTOM),
                (mid_x, (UTIL_TOP + UTIL_BOTTOM) / 2.0),
                (RIGHT, UTIL_TOP)
            ]
        );
        assert_eq!(
            queue,
            vec![
                (LEFT, QUEUE_BOTTOM),
                (mid_x, (QUEUE_TOP + QUEUE_BOTTOM) / 2.0),
                (RIGHT, QUEUE_TOP)
            ]
        );
    }

    #[test]
    fn axes_round_up_to_nice_ticks() {
        assert_eq!(nice_axis(100.0, false), (20.0, 100.0));
        assert_eq!(nice_axis(7.0, true), (2.0, 8.0));
        assert_eq!(nice_axis(3.0, true), (1.0, 3.0));
        assert_eq!(nice_axis(1830.0, false), (500.0, 2000.0));
        assert_eq!(nice_axis(0.0, true), (1.0, 1.0));
        assert_eq!(label(0.1 + 0.2), "0.3");
        assert_eq!(ticks(0.1, 0.3).count(), 4);
    }

    #[test]
    fn degenerate_series_stay_finite() {
        for series in [
            vec![],
            vec![sample(0.0, 0.0, 0)],
            vec![sample(0.0, 0.25, 0), sample(f64::NAN, f64::INFINITY, 2)],
        ] {
            let svg = render_svg(&series, "edge");
            assert_well_formed(&svg);
            assert_eq!(svg.matches("<polyline").count(), 2);
            assert!(all_numbers_finite(&svg), "{svg}");
        }
    }
}
