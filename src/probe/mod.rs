//! What is read on a host about a running server beyond systemd's own state, over the edge's
//! primitives: it knows SGLang and systemd's cgroups, which `remote` does not.

pub mod liveness;
