mod manifest;
mod observed;
mod plan;
mod redact;
mod unit;
fn main() {}
