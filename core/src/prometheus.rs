//! Prometheus' text exposition format (0.0.4), as SGLang's `/metrics` writes it through
//! prometheus_client: the samples of a metric family, read by `drain` (the gauges of running
//! and queued requests) and `bake` (the latency histograms and request counters).

/// A sample's labels, sorted by name.
pub type Labels = Vec<(String, String)>;

/// What is wrong with a sample line, as a [`BadLine`] (or the drain's `MetricsError::BadLine`)
/// names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleFault {
    /// Nothing after the name and labels.
    #[error("no value")]
    NoValue,
    /// The optional timestamp is not an integer.
    #[error("the timestamp is not a number")]
    Timestamp(#[source] std::num::ParseIntError),
    /// More fields than a value and a timestamp.
    #[error("more than a value and a timestamp")]
    ExtraFields,
    /// A label with no `=`.
    #[error("a label without `=`")]
    NoEquals,
    /// A label name that is no identifier.
    #[error("a label name that is not one")]
    LabelName,
    /// A label value that does not open with `"`.
    #[error("a label value without quotes")]
    Unquoted,
    /// Labels not separated by commas.
    #[error("labels not separated by commas")]
    NoComma,
    /// An escape other than `\\`, `\"` and `\n`.
    #[error("an unknown escape in a label value")]
    Escape,
    /// A label value that does not close.
    #[error("a label value without its closing quote")]
    Unclosed,
    /// The value is not a float as prometheus_client writes one.
    #[error("the value is not a number")]
    NotANumber,
    /// A request gauge's value that is not a whole, non-negative count.
    #[error("the value is not a count of requests")]
    NotACount,
}

/// `{k="v",...} VALUE [TIMESTAMP]` or ` VALUE [TIMESTAMP]`: the labels (sorted) and the value.
pub fn split_sample(rest: &str) -> Result<(Labels, &str), SampleFault> {
    let (mut labels, after) = match rest.strip_prefix('{') {
        Some(inner) => parse_labels(inner)?,
        None => (Vec::new(), rest),
    };
    let mut fields = after.split_whitespace();
    let value = fields.next().ok_or(SampleFault::NoValue)?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().map_err(SampleFault::Timestamp)?;
    }
    if fields.next().is_some() {
        return Err(SampleFault::ExtraFields);
    }
    labels.sort();
    Ok((labels, value))
}

/// The labels up to the closing `}`, with the text after it. Values are quoted, with `\\`, `\"`
/// and `\n` escaped (the exposition format's only escapes); a trailing comma is allowed.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), SampleFault> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or(SampleFault::NoEquals)?;
        let name = s[..eq].trim();
        if !crate::is_identifier(name) {
            return Err(SampleFault::LabelName);
        }
        let quoted = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or(SampleFault::Unquoted)?;
        let (value, after) = unquote(quoted)?;
        labels.push((name.to_string(), value));
        s = after.trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(SampleFault::NoComma);
        }
    }
}

/// The value of a label up to its closing quote, and the text after it.
fn unquote(s: &str) -> Result<(String, &str), SampleFault> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, '\\')) => value.push('\\'),
                Some((_, '"')) => value.push('"'),
                Some((_, 'n')) => value.push('\n'),
                _ => return Err(SampleFault::Escape),
            },
            c => value.push(c),
        }
    }
    Err(SampleFault::Unclosed)
}

/// The samples of the metric `name` in an exposition (`name{labels} value`, not `name_suffix`):
/// each one's labels and value. A sample line that does not read is an error naming its line.
pub fn samples(text: &str, name: &str) -> Result<Vec<(Labels, f64)>, BadLine> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !rest.starts_with(['{', ' ', '\t']) {
            continue;
        }
        let bad = |why| BadLine {
            line: i + 1,
            why,
            text: line.chars().take(200).collect(),
        };
        let (labels, value) = split_sample(rest).map_err(bad)?;
        let value = parse_value(value).ok_or_else(|| bad(SampleFault::NotANumber))?;
        found.push((labels, value));
    }
    Ok(found)
}

/// A sample's value as prometheus_client writes it (`3.0`, `+Inf`, `NaN`).
fn parse_value(value: &str) -> Option<f64> {
    match value {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        v => v.parse().ok(),
    }
}

/// A sample line that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("/metrics line {line}: {why}: `{text}`")]
pub struct BadLine {
    pub line: usize,
    pub why: SampleFault,
    pub text: String,
}
