//! The replay report's two charts, as inline SVG: nothing to load, nothing to run.

use std::fmt::Write as _;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 260.0;
/// Room for the axes' labels: left, right, top, bottom.
const MARGIN: [f64; 4] = [64.0, 16.0, 12.0, 40.0];
pub(super) const ADMITTED: &str = "#4a7ebb";
pub(super) const REFUSED: &str = "#d9534f";

/// Admitted and refused requests per bin, stacked; `start` in Unix seconds, `width` the
/// seconds a bin covers.
pub(super) fn timeline(start: i64, width: i64, bins: &[[u64; 2]]) -> String {
    let mut svg = open("admitted and refused requests over time");
    let most = bins
        .iter()
        .map(|bin| bin[0] + bin[1])
        .max()
        .unwrap_or(0)
        .max(1);
    let top = nice_ceiling(most as f64);
    let (left, bottom) = (MARGIN[0], HEIGHT - MARGIN[3]);
    let plot_width = WIDTH - MARGIN[0] - MARGIN[1];
    let plot_height = bottom - MARGIN[2];
    y_axis(
        &mut svg,
        top,
        |value| bottom - value / top * plot_height,
        "requests",
    );
    let bar = plot_width / bins.len().max(1) as f64;
    for (index, [admitted, refused]) in bins.iter().enumerate() {
        let x = left + index as f64 * bar;
        let admitted_height = *admitted as f64 / top * plot_height;
        let refused_height = *refused as f64 / top * plot_height;
        let bar_width = (bar - 0.5).max(0.5);
        if *admitted > 0 {
            rect(
                &mut svg,
                x,
                bottom - admitted_height,
                bar_width,
                admitted_height,
                ADMITTED,
            );
        }
        if *refused > 0 {
            let y = bottom - admitted_height - refused_height;
            rect(&mut svg, x, y, bar_width, refused_height, REFUSED);
        }
    }
    let end = start + width * bins.len() as i64;
    time_ticks(&mut svg, (start, end), (left, plot_width, bottom));
    text(&mut svg, left, HEIGHT - 4.0, "start", &utc(start));
    text(&mut svg, WIDTH - MARGIN[1], HEIGHT - 4.0, "end", &utc(end));
    let per_bin = format!(
        "one bar: {}",
        humantime::format_duration(std::time::Duration::from_secs(width.max(1) as u64))
    );
    text(
        &mut svg,
        left + plot_width / 2.0,
        HEIGHT - 4.0,
        "middle",
        &per_bin,
    );
    svg.push_str("</svg>");
    svg
}

/// How many keys peaked at each usage (tokens they needed), with the configured capacity and
/// the suggestions marked. Counts on a logarithmic scale: most keys need little, and the few
/// that need much are the point.
pub(super) fn peak_usage(peaks: &[f64], marks: &[(&str, f64, &str)]) -> String {
    const BINS: usize = 48;
    let mut svg = open("keys by peak usage, with the capacity");
    let highest = peaks
        .iter()
        .copied()
        .chain(marks.iter().map(|mark| mark.1))
        .fold(1.0, f64::max);
    let right_end = nice_ceiling(highest * 1.05);
    let mut counts = [0u64; BINS];
    for peak in peaks {
        let index = ((peak / right_end) * BINS as f64) as usize;
        counts[index.min(BINS - 1)] += 1;
    }
    let (left, bottom) = (MARGIN[0], HEIGHT - MARGIN[3]);
    let plot_width = WIDTH - MARGIN[0] - MARGIN[1];
    let plot_height = bottom - MARGIN[2];
    let most = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let decades = most.log10().ceil().max(1.0);
    let y_of = |count: f64| {
        bottom - (1.0 + count).log10() / (1.0 + 10f64.powf(decades)).log10() * plot_height
    };
    for decade in 0..=decades as i32 {
        let value = 10f64.powi(decade);
        let y = y_of(value);
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##,
            WIDTH - MARGIN[1]
        );
        text(&mut svg, left - 6.0, y + 4.0, "end", &format!("{value}"));
    }
    axis_title(&mut svg, "keys");
    let bar = plot_width / BINS as f64;
    for (index, count) in counts.iter().enumerate() {
        if *count > 0 {
            let y = y_of(*count as f64);
            rect(
                &mut svg,
                left + index as f64 * bar,
                y,
                bar - 1.0,
                bottom - y,
                ADMITTED,
            );
        }
    }
    capacity_marks(&mut svg, marks, right_end);
    text(&mut svg, left, HEIGHT - 14.0, "start", "0");
    text(
        &mut svg,
        WIDTH - MARGIN[1],
        HEIGHT - 14.0,
        "end",
        &format!("{right_end} tokens"),
    );
    text(
        &mut svg,
        left + plot_width / 2.0,
        HEIGHT - 14.0,
        "middle",
        "peak usage (the capacity a key needed never to be refused)",
    );
    svg.push_str("</svg>");
    svg
}

/// The configured capacity and the suggestions, each a dashed line labelled at the top.
fn capacity_marks(svg: &mut String, marks: &[(&str, f64, &str)], right_end: f64) {
    let (left, bottom) = (MARGIN[0], HEIGHT - MARGIN[3]);
    let plot_width = WIDTH - MARGIN[0] - MARGIN[1];
    let x_of = |tokens: f64| left + tokens / right_end * plot_width;
    for (index, (label, tokens, colour)) in marks.iter().enumerate() {
        let x = x_of(*tokens);
        let _ = write!(
            svg,
            r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{bottom}" stroke="{colour}" stroke-width="2" stroke-dasharray="6 3"/>"#,
            MARGIN[2]
        );
        let anchor = if x > WIDTH / 2.0 { "end" } else { "start" };
        let nudge = if anchor == "end" { -4.0 } else { 4.0 };
        let label = format!("{label} {tokens}");
        let y = MARGIN[2] + 14.0 + 14.0 * index as f64;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{y:.1}" text-anchor="{anchor}" fill="{colour}">{}</text>"#,
            x + nudge,
            escape(&label)
        );
    }
}

fn open(label: &str) -> String {
    let mut svg = String::with_capacity(16 * 1024);
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{}" font-family="sans-serif" font-size="11">"#,
        escape(label)
    );
    let (left, bottom) = (MARGIN[0], HEIGHT - MARGIN[3]);
    let _ = write!(
        svg,
        r##"<line x1="{left}" y1="{}" x2="{left}" y2="{bottom}" stroke="#555"/><line x1="{left}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#555"/>"##,
        MARGIN[2],
        WIDTH - MARGIN[1]
    );
    svg
}

/// Grid lines and labels at 0, ¼, ½, ¾ and all of `top`.
fn y_axis(svg: &mut String, top: f64, y_of: impl Fn(f64) -> f64, title: &str) {
    for quarter in 0..=4 {
        let value = top * f64::from(quarter) / 4.0;
        let y = y_of(value);
        let _ = write!(
            svg,
            r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##,
            MARGIN[0],
            WIDTH - MARGIN[1]
        );
        text(svg, MARGIN[0] - 6.0, y + 4.0, "end", &format!("{value}"));
    }
    axis_title(svg, title);
}

fn axis_title(svg: &mut String, title: &str) {
    let middle = (MARGIN[2] + HEIGHT - MARGIN[3]) / 2.0;
    let _ = write!(
        svg,
        r#"<text x="14" y="{middle}" text-anchor="middle" transform="rotate(-90 14 {middle})">{}</text>"#,
        escape(title)
    );
}

fn rect(svg: &mut String, x: f64, y: f64, width: f64, height: f64, fill: &str) {
    let _ = write!(
        svg,
        r#"<rect x="{x:.2}" y="{y:.2}" width="{width:.2}" height="{height:.2}" fill="{fill}"/>"#
    );
}

fn text(svg: &mut String, x: f64, y: f64, anchor: &str, content: &str) {
    let _ = write!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}">{}</text>"#,
        escape(content)
    );
}

/// 1, 2 or 5 times a power of ten, at least `value`: axis ends a reader can take in.
fn nice_ceiling(value: f64) -> f64 {
    let magnitude = 10f64.powf(value.max(1.0).log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|step| step * magnitude)
        .find(|candidate| *candidate >= value)
        .unwrap_or(10.0 * magnitude)
}

/// Ticks along the time axis at the quarters, labelled in the log's time (UTC): the time of
/// day, with the date where the span is longer than a day.
fn time_ticks(svg: &mut String, (start, end): (i64, i64), (left, width, bottom): (f64, f64, f64)) {
    let format = if end - start > 86_400 {
        "%m-%d %H:%M"
    } else {
        "%H:%M:%S"
    };
    for quarter in 0..=4 {
        let x = left + width * f64::from(quarter) / 4.0;
        let seconds = start + (end - start) * i64::from(quarter) / 4;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888"/>"##,
            bottom + 4.0
        );
        let label = jiff::Timestamp::from_second(seconds)
            .map(|time| time.strftime(format).to_string())
            .unwrap_or_default();
        let anchor = match quarter {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        text(svg, x, bottom + 16.0, anchor, &label);
    }
}

fn utc(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|time| time.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

/// Text for HTML and SVG alike.
pub(super) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ends_are_round() {
        assert_eq!(nice_ceiling(0.3), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(11.0), 20.0);
        assert_eq!(nice_ceiling(420.0), 500.0);
        assert_eq!(nice_ceiling(500.0), 500.0);
    }

    #[test]
    fn a_timeline_draws_a_bar_per_nonempty_count_and_escapes_nothing_it_should_not() {
        let svg = timeline(1_796_083_200, 60, &[[3, 0], [0, 0], [2, 5]]);
        assert_eq!(svg.matches(&format!(r#"fill="{ADMITTED}""#)).count(), 2);
        assert_eq!(svg.matches(&format!(r#"fill="{REFUSED}""#)).count(), 1);
        assert!(svg.contains("2026-12-01 00:00:00 UTC"), "{svg}");
        assert!(svg.contains("2026-12-01 00:03:00 UTC"), "{svg}");
        // The axis is labelled in the log's time at its quarters.
        for tick in ["00:00:00", "00:00:45", "00:01:30", "00:02:15", "00:03:00"] {
            assert!(svg.contains(&format!(">{tick}</text>")), "{tick}: {svg}");
        }
        let days = timeline(1_796_083_200, 86_400, &[[1, 0], [1, 0]]);
        assert!(days.contains(">12-02 00:00</text>"), "{days}");
        assert!(svg.ends_with("</svg>"));
    }

    #[test]
    fn peak_usage_marks_the_capacity_and_counts_every_key() {
        let peaks = [120.0, 30.0, 5.0, 4.0, 1.0];
        let svg = peak_usage(
            &peaks,
            &[("capacity", 20.0, "#000"), ("every key", 120.0, "#080")],
        );
        // 120, 30, 5 and (4, 1) fall into four bars of 200 / 48 tokens.
        assert_eq!(svg.matches("<rect").count(), 4, "{svg}");
        assert!(svg.contains("capacity 20"));
        assert!(svg.contains("every key 120"));
        assert!(escape("<a&\"b>").eq("&lt;a&amp;&quot;b&gt;"));
    }
}
