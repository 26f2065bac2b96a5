//! "Did you mean": names close to one that is not known, for flags and env vars alike. A leaf:
//! `catalog` uses `env`, which suggests names, so suggesting must not need the catalog.

/// Up to three of `candidates` close to `name`: a small edit distance (a typo, a missing dash), or
/// one name containing the other (a dropped `enable-`).
pub fn did_you_mean<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let limit = (name.len() / 4).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .filter_map(|c| {
            let distance = strsim::levenshtein(name, c);
            let contained = name.len() >= 4 && (c.contains(name) || name.contains(c));
            (distance <= limit || contained).then_some((distance, c))
        })
        .collect();
    scored.sort_unstable();
    scored.dedup_by_key(|(_, c)| *c);
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}
