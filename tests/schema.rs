//! The manifest's JSON Schema (`reconcile schema`, schemas/manifest.schema.json) against a real
//! JSON Schema validator: every manifest in the repository passes it, and the schema and the
//! parser agree on a corpus of valid and invalid manifests (fixtures/schema/): what one refuses,
//! the other refuses. The corpus is structural (fields, types, required fields, `hosts:` or
//! `nodes:`, ports); what needs SGLang's catalog or several manifests is `validate`'s alone.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("schemas/manifest.schema.json"))
        .expect("schemas/manifest.schema.json");
    serde_json::from_str(&text).expect("the schema is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&schema()).expect("the schema is a valid JSON Schema")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The schema's errors for a manifest (empty: valid), and the parser's.
fn judged(path: &Path) -> (Vec<String>, Result<(), String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let instance: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
    let schema_errors = validator()
        .iter_errors(&instance)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect();
    // The parser and its single-manifest checks, as `reconcile validate` runs them first.
    let parsed = reconcile_core::manifest::parse(&path.display().to_string(), &text)
        .and_then(|m| reconcile_core::manifest::validate(&m, &text))
        .map_err(|e| e.to_string());
    (schema_errors, parsed)
}

#[test]
fn the_committed_schema_is_what_reconcile_schema_prints() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reconcile"))
        .arg("schema")
        .output()
        .expect("reconcile runs");
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let committed = std::fs::read_to_string(root().join("schemas/manifest.schema.json")).unwrap();
    assert!(
        printed == committed,
        "schemas/manifest.schema.json is stale: run `cargo run -q -- schema > schemas/manifest.schema.json`"
    );
}

#[test]
fn every_manifest_in_the_repository_names_the_schema_and_passes_it() {
    let manifests = yaml_files(&root().join("manifests"));
    assert!(!manifests.is_empty());
    for path in manifests {
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().next(),
            Some("# yaml-language-server: $schema=../schemas/manifest.schema.json"),
            "{}: its first line points editors at the schema",
            path.display()
        );
        let (schema_errors, parsed) = judged(&path);
        assert!(
            schema_errors.is_empty(),
            "{}: {schema_errors:?}",
            path.display()
        );
        assert!(parsed.is_ok(), "{}: {parsed:?}", path.display());
    }
}

/// The manifests of `fixtures/schema/KIND`, at least `at_least` of them.
fn fixtures(kind: &str, at_least: usize) -> Vec<PathBuf> {
    let files = yaml_files(&root().join("fixtures/schema").join(kind));
    assert!(files.len() >= at_least);
    files
}

#[test]
fn the_schema_and_the_parser_accept_the_same_valid_manifests() {
    for path in fixtures("valid", 3) {
        let (schema_errors, parsed) = judged(&path);
        assert!(
            schema_errors.is_empty(),
            "{}: the schema refuses it: {schema_errors:?}",
            path.display()
        );
        assert!(
            parsed.is_ok(),
            "{}: the parser refuses it: {parsed:?}",
            path.display()
        );
    }
}

#[test]
fn what_the_parser_refuses_the_schema_refuses() {
    for path in fixtures("invalid", 15) {
        let (schema_errors, parsed) = judged(&path);
        assert!(parsed.is_err(), "{}: the parser accepts it", path.display());
        assert!(
            !schema_errors.is_empty(),
            "{}: the schema accepts what the parser refuses ({})",
            path.display(),
            parsed.unwrap_err()
        );
    }
}

#[test]
fn the_schema_describes_fields_for_an_editor() {
    let schema = schema();
    let text = schema.to_string();
    // Field docs come from the parser's own types: a hover in the editor says what a field is.
    assert!(
        text.contains("One server over several hosts, in rank order"),
        "{text}"
    );
    assert_eq!(schema["properties"]["sglang"]["$ref"], "#/$defs/RawSglang");
    assert_eq!(
        schema["$defs"]["RawSglang"]["properties"]["port"]["maximum"],
        65535
    );
}
