//! The map in docs/layout.md, checked against the source: no module reaches a module that
//! reaches it back (directly or around a loop), and none imports from a layer above its own.
//!
//! The compiler already keeps `core/` free of the binary (it cannot name it); this test keeps the
//! layers inside the binary honest, where one crate could import anything. It reads the sources the
//! way a reviewer would: every `crate::`, `super::`, `self::` and `reconcile_core::` path outside
//! comments, strings and `#[cfg(test)]` modules, with `pub use` re-exports followed to the module
//! that defines the item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where a module sits. A module may import from its own layer and those below it; the edge is
/// beside the core, below orchestration, and imports neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// `core/`: manifests, catalogs, render, plan, judges. No I/O.
    Core,
    /// `src/remote/`: SSH, local commands, HTTP, NVML. Knows nothing of systemd or SGLang.
    Edge,
    /// What runs against hosts: apply, rollout, verify, status, history, agent.
    Orchestration,
    /// The command line and what it prints.
    Face,
}

/// The binary's top-level modules by layer. A module missing here fails the test: put it on the map
/// (here and in docs/layout.md) when adding it.
fn layer_of(krate: Krate, module: &[String]) -> Option<Layer> {
    if krate == Krate::Core {
        return Some(Layer::Core);
    }
    let Some(first) = module.first() else {
        return Some(Layer::Face); // lib.rs / main.rs
    };
    Some(match first.as_str() {
        "remote" => Layer::Edge,
        "cli" | "report" | "run" => Layer::Face,
        "agent" | "apply" | "bench" | "coordinator" | "drain" | "dry_run" | "experiment"
        | "fleet" | "history" | "load" | "import" | "plan_io" | "preflight" | "probe"
        | "quality" | "router" | "signals" | "status" | "systemd" | "verify" | "plan_file"
        | "pinned" | "options" => Layer::Orchestration,
        _ => return None,
    })
}

fn may_import(from: Layer, to: Layer) -> bool {
    match from {
        Layer::Core => to == Layer::Core,
        Layer::Edge => to == Layer::Edge,
        Layer::Orchestration => to != Layer::Face,
        Layer::Face => true,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Krate {
    Core,
    Bin,
}

type ModuleId = (Krate, Vec<String>);

struct Module {
    /// The source with comments, strings and test modules blanked out.
    code: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn modules() -> BTreeMap<ModuleId, Module> {
    let mut found = BTreeMap::new();
    for (krate, dir) in [
        (Krate::Bin, root().join("src")),
        (Krate::Core, root().join("core/src")),
    ] {
        if dir.is_dir() {
            collect(krate, &dir, &dir, &mut found);
        }
    }
    found
}

fn collect(krate: Krate, base: &Path, dir: &Path, found: &mut BTreeMap<ModuleId, Module>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        // src/bin/ holds programs of their own (the host's guard), not modules of the binary's
        // crate: `the_hosts_programs_link_only_the_core` keeps them apart.
        if krate == Krate::Bin && path == base.join("bin") {
            continue;
        }
        if path.is_dir() {
            collect(krate, base, &path, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(base).unwrap().with_extension("");
        let mut segments: Vec<String> = relative
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if matches!(
            segments.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            segments.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = without_tests(&blank_comments_and_strings(&text));
        let id = (krate, segments);
        // main.rs and lib.rs are both the root: keep both texts.
        match found.get_mut(&id) {
            Some(m) => m.code.push_str(&code),
            None => {
                found.insert(id, Module { code });
            }
        }
    }
}

/// Replaces comments and string/char literals with spaces, so paths in docs and messages are not
/// read as imports.
fn blank_comments_and_strings(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(prev(&b, i)) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('a', '\n', '"'), not a lifetime ('a).
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&j| b[j] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => {
                    out.push_str("' '");
                    i = j + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev(b: &[char], i: usize) -> char {
    if i == 0 {
        ' '
    } else {
        b[i - 1]
    }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Drops `#[cfg(test)] mod name { ... }` blocks: tests may reach anywhere; the layers are about
/// what the program itself uses.
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        let open = after.find(['{', ';']);
        match (is_mod, open) {
            (true, Some(o)) if after.as_bytes()[o] == b'{' => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, ch) in after[o..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// Every path the code names: `use` trees expanded, plus paths written inline.
fn paths(code: &str) -> Vec<(bool, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = code;
    // `use` statements (re-exports flagged), expanded from their brace trees.
    while let Some(at) = find_word(rest, "use") {
        let before = rest[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let body_start = at + 3;
        let Some(end) = rest[body_start..].find(';') else {
            break;
        };
        let tree = tidy(&rest[body_start..body_start + end]);
        for p in expand(&tree) {
            found.push((public, p));
        }
        rest = &rest[body_start + end..];
    }
    // Inline paths: `crate::x::y(...)`, `super::z`.
    for start in ["crate::", "super::", "reconcile_core::"] {
        let mut from = 0;
        while let Some(k) = code[from..].find(start) {
            let at = from + k;
            from = at + start.len();
            if at > 0 && ident_char(code[..at].chars().last().unwrap()) {
                continue;
            }
            let segment: String = code[at..]
                .chars()
                .take_while(|c| ident_char(*c) || *c == ':')
                .collect();
            let parts: Vec<String> = segment
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            found.push((false, parts));
        }
    }
    found
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = text[from..].find(word) {
        let at = from + k;
        let before = text[..at].chars().last().unwrap_or(' ');
        let after = text[at + word.len()..].chars().next().unwrap_or(' ');
        if !ident_char(before) && after.is_whitespace() {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// A `use` tree on one line, spaces kept only where they separate words (`c as d`).
fn tidy(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut out = String::new();
    for w in words {
        let glue = out.ends_with([':', '{', ',']) || w.starts_with([':', '{', '}', ',']);
        if !out.is_empty() && !glue {
            out.push(' ');
        }
        out.push_str(w);
    }
    out
}

/// `a::{b,c::{d,e}}` -> `a::b`, `a::c::d`, `a::c::e`. `as` renames are dropped (the path is what
/// counts); `self` in a group means the group's own path.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim_start_matches("::");
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![path
            .split("::")
            .filter(|s| !s.is_empty() && *s != "*")
            .map(String::from)
            .collect()];
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        for tail in expand(part) {
            let tail: Vec<String> = tail.into_iter().filter(|s| s != "self").collect();
            out.push(prefix.iter().cloned().chain(tail).collect());
        }
    }
    out
}

/// Turns a path written in `module` into an absolute one in some crate, or None for outside crates.
fn absolute(krate: Krate, module: &[String], path: &[String]) -> Option<(Krate, Vec<String>)> {
    let first = path.first()?;
    match first.as_str() {
        "crate" => Some((krate, path[1..].to_vec())),
        "reconcile_core" => Some((Krate::Core, path[1..].to_vec())),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = module.len().checked_sub(ups)?;
            Some((
                krate,
                module[..base].iter().chain(&path[ups..]).cloned().collect(),
            ))
        }
        "self" => Some((krate, module.iter().chain(&path[1..]).cloned().collect())),
        _ => None,
    }
}

struct Graph {
    modules: BTreeMap<ModuleId, Module>,
    /// Per module: exported name -> where it points.
    reexports: BTreeMap<ModuleId, BTreeMap<String, (Krate, Vec<String>)>>,
}

impl Graph {
    fn new() -> Graph {
        let modules = modules();
        let mut reexports: BTreeMap<ModuleId, BTreeMap<String, (Krate, Vec<String>)>> =
            BTreeMap::new();
        for ((krate, path), m) in &modules {
            for (public, p) in paths(&m.code) {
                if !public {
                    continue;
                }
                let rooted = if matches!(
                    p.first().map(String::as_str),
                    Some("crate" | "super" | "self" | "reconcile_core")
                ) {
                    p.clone()
                } else {
                    // `pub use child::X` in a module is relative to it.
                    std::iter::once("self".to_string())
                        .chain(p.clone())
                        .collect()
                };
                if let (Some(name), Some(target)) = (p.last(), absolute(*krate, path, &rooted)) {
                    reexports
                        .entry((*krate, path.clone()))
                        .or_default()
                        .insert(name.clone(), target);
                }
            }
        }
        Graph { modules, reexports }
    }

    /// The module an absolute path lands in: its longest prefix that is a module, with re-exports
    /// followed.
    fn resolve(&self, mut target: (Krate, Vec<String>)) -> Option<ModuleId> {
        for _ in 0..8 {
            let (krate, path) = &target;
            let mut n = path.len();
            while n > 0 && !self.modules.contains_key(&(*krate, path[..n].to_vec())) {
                n -= 1;
            }
            let module = (*krate, path[..n].to_vec());
            if !self.modules.contains_key(&module) {
                return None;
            }
            let next = path
                .get(n)
                .and_then(|name| self.reexports.get(&module)?.get(name));
            match next {
                Some(t) if *t != target => target = t.clone(),
                _ => return Some(module),
            }
        }
        None
    }

    /// Every module each module imports from (itself and its own ancestors' re-export hops aside).
    fn edges(&self) -> BTreeMap<ModuleId, BTreeSet<ModuleId>> {
        let mut edges: BTreeMap<ModuleId, BTreeSet<ModuleId>> = BTreeMap::new();
        for (id, m) in &self.modules {
            let (krate, path) = id;
            for (public, p) in paths(&m.code) {
                let Some(target) = absolute(*krate, path, &p) else {
                    continue;
                };
                // A `pub use` in a module is a path for others, not a use of its own.
                if public {
                    continue;
                }
                if let Some(to) = self.resolve(target) {
                    if &to != id && !(to.0 == id.0 && to.1.is_empty()) {
                        edges.entry(id.clone()).or_default().insert(to);
                    }
                }
            }
        }
        edges
    }
}

fn name((krate, path): &ModuleId) -> String {
    let head = match krate {
        Krate::Core => "core",
        Krate::Bin => "reconcile",
    };
    std::iter::once(head.to_string())
        .chain(path.iter().cloned())
        .collect::<Vec<_>>()
        .join("::")
}

/// Strongly connected components with more than one module (Tarjan).
fn loops(edges: &BTreeMap<ModuleId, BTreeSet<ModuleId>>) -> Vec<Vec<ModuleId>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModuleId, BTreeSet<ModuleId>>,
        index: BTreeMap<ModuleId, usize>,
        low: BTreeMap<ModuleId, usize>,
        stack: Vec<ModuleId>,
        on_stack: BTreeSet<ModuleId>,
        found: Vec<Vec<ModuleId>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &ModuleId) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            for w in self.edges.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let low = self.low[v].min(self.low[&w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(&w) {
                    let low = self.low[v].min(self.index[&w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(&w);
                    component.push(w.clone());
                    if &w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let graph = Graph::new();
    let edges = graph.edges();
    let found = loops(&edges);
    let described: Vec<String> = found
        .iter()
        .map(|component| {
            let members: BTreeSet<&ModuleId> = component.iter().collect();
            let arrows: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    edges[from]
                        .iter()
                        .filter(|to| members.contains(to))
                        .map(move |to| format!("{} -> {}", name(from), name(to)))
                })
                .collect();
            arrows.join(", ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "import loops:\n  {}",
        described.join("\n  ")
    );
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let graph = Graph::new();
    let mut wrong = Vec::new();
    let mut unmapped = BTreeSet::new();
    for (from, targets) in graph.edges() {
        let Some(from_layer) = layer_of(from.0, &from.1) else {
            unmapped.insert(name(&from));
            continue;
        };
        for to in targets {
            let Some(to_layer) = layer_of(to.0, &to.1) else {
                unmapped.insert(name(&to));
                continue;
            };
            if !may_import(from_layer, to_layer) {
                wrong.push(format!(
                    "{} ({from_layer:?}) imports {} ({to_layer:?})",
                    name(&from),
                    name(&to)
                ));
            }
        }
    }
    assert!(
        unmapped.is_empty(),
        "modules missing from the layer map (tests/layers.rs and docs/layout.md): {unmapped:?}"
    );
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n  {}",
        wrong.join("\n  ")
    );
}

/// The checker itself: a loop and a layer break it must see, in code it reads as the real tree.
#[test]
fn the_reader_expands_use_trees_and_skips_comments_strings_and_tests() {
    let code = blank_comments_and_strings(
        "use crate::{a::{b, c as d}, e};\n// use crate::hidden;\nlet s = \"crate::nope\";\n",
    );
    let code = without_tests(&format!(
        "{code}#[cfg(test)]\nmod tests {{ use crate::test_only; }}\nfn f() {{ crate::x::y(); }}"
    ));
    let found: Vec<Vec<String>> = paths(&code).into_iter().map(|(_, p)| p).collect();
    let want = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert!(found.contains(&want("crate::a::b")), "{found:?}");
    assert!(found.contains(&want("crate::a::c")), "{found:?}");
    assert!(found.contains(&want("crate::e")), "{found:?}");
    assert!(found.contains(&want("crate::x::y")), "{found:?}");
    assert!(!found
        .iter()
        .flatten()
        .any(|s| s == "hidden" || s == "nope" || s == "test_only"));
    let mut edges = BTreeMap::new();
    let a: ModuleId = (Krate::Bin, vec!["a".into()]);
    let b: ModuleId = (Krate::Bin, vec!["b".into()]);
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(loops(&edges), vec![vec![a, b]]);
    assert!(!may_import(Layer::Edge, Layer::Core));
    assert!(!may_import(Layer::Orchestration, Layer::Face));
    assert!(may_import(Layer::Face, Layer::Orchestration));
}

/// The programs that run on hosts as root (src/bin/) link the pure core and the standard library,
/// never the binary's crate: what root runs there stays small and decides nothing the model
/// checker does not see.
#[test]
fn the_hosts_programs_link_only_the_core() {
    let dir = root().join("src/bin");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let code = without_tests(&blank_comments_and_strings(
            &std::fs::read_to_string(&path).unwrap(),
        ));
        for word in [
            "reconcile::",
            "crate::",
            "tokio::",
            "reqwest::",
            "openssh::",
        ] {
            let named = code
                .match_indices(word)
                .any(|(at, _)| !ident_char(code[..at].chars().last().unwrap_or(' ')));
            assert!(!named, "{} names {word}", path.display());
        }
        seen += 1;
    }
    assert!(seen > 0, "no program in {}", dir.display());
}
