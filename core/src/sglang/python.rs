//! Python's own readings of numbers (`int(text)`, `float(text)`), which SGLang's converters and
//! its env vars go through. A leaf: the flag checks (`values`) and the env checks (`env`) both
//! use it, and `catalog` uses `env`, so it must not need either.

/// Python's `int(text)`: surrounding whitespace, a sign, digits with single `_` between them.
pub fn python_int(text: &str) -> Option<i128> {
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    if !digits.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// Python's `float(text)`: what Rust reads plus whitespace and `_` between digits.
pub fn python_float(text: &str) -> Option<f64> {
    let t = text.trim();
    let bytes = t.as_bytes();
    let underscores_ok = t.char_indices().filter(|(_, c)| *c == '_').all(|(i, _)| {
        i > 0
            && i + 1 < bytes.len()
            && bytes[i - 1].is_ascii_digit()
            && bytes[i + 1].is_ascii_digit()
    });
    if !underscores_ok {
        return None;
    }
    t.replace('_', "").parse().ok()
}
