//! Digests of units and manifests, as recorded in plan files and deployment records, and their
//! short form for showing.

/// How many characters of a sha256 are shown, and of a git commit.
pub const SHA_SHOWN: usize = 12;
pub const COMMIT_SHOWN: usize = 7;

/// The sha256 of a text, in lowercase hex.
pub fn sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// The first `n` characters of `s` (a sha256 or a commit, shown short), or all of it when it is
/// shorter. Cut on a character boundary, never inside one: these strings come from hosts' records
/// and from git, and need not be ASCII.
pub fn short(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(at, _)| &s[..at])
}
