//! The manifest's JSON Schema, for editors (`# yaml-language-server: $schema=...`): generated from
//! the very types the parser reads a manifest into (`parse::RawManifest` and its parts), so a
//! field the parser knows is a field the schema knows. It says the structure: fields, types,
//! required fields, `hosts:` or `nodes:`, the port range. What needs more than one field or the
//! SGLang catalog to judge (a flag SGLang lacks, two manifests on one port) is `validate`'s and
//! `reconcile validate`'s alone.

use serde_json::Value;

use super::parse::RawManifest;

/// Where the schema is published in the repository, relative to its root (the `$id`'s path).
pub const SCHEMA_PATH: &str = "schemas/manifest.schema.json";

/// The manifest's JSON Schema (draft 2020-12), as `reconcile schema` prints it.
pub fn manifest() -> Value {
    let mut schema =
        serde_json::to_value(schemars::schema_for!(RawManifest)).expect("a schema is JSON");
    let root = schema.as_object_mut().expect("the schema is an object");
    root.insert("title".into(), "reconcile manifest".into());
    root.insert(
        "description".into(),
        "One SGLang service (one systemd unit) on its hosts, or one server over several hosts (`nodes:`); see docs/manifest.md".into(),
    );
    // Exactly one of `hosts:` (a server per host) and `nodes:` (one server over them): the parser's
    // `RawManifest::structure` check, said here so an editor flags it too.
    root.insert(
        "oneOf".into(),
        serde_json::json!([
            { "required": ["hosts"], "not": { "required": ["nodes"] } },
            { "required": ["nodes"], "not": { "required": ["hosts"] } }
        ]),
    );
    // Exactly one of `model_path:` and `model:` (the weights pinned by revision), and a pinned
    // model's one source, `hub:` or `store:`: `structure`'s checks too.
    let defs = root
        .get_mut("$defs")
        .and_then(Value::as_object_mut)
        .expect("the schema has $defs");
    for (def, one, other) in [
        ("RawSglang", "model_path", "model"),
        ("RawModel", "hub", "store"),
    ] {
        if let Some(def) = defs.get_mut(def).and_then(Value::as_object_mut) {
            def.insert(
                "oneOf".into(),
                serde_json::json!([
                    { "required": [one], "not": { "required": [other] } },
                    { "required": [other], "not": { "required": [one] } }
                ]),
            );
        }
    }
    schema
}

/// The schema as the file in the repository holds it: pretty JSON and a final newline.
pub fn manifest_text() -> String {
    let mut text = serde_json::to_string_pretty(&manifest()).expect("a schema is JSON");
    text.push('\n');
    text
}
