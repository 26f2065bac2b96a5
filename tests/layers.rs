//! The map in docs/layout.md, checked against the source: no import circle between the modules
//! beside each other, and no module imports from a layer above its own.
//!
//! The compiler already keeps `core/` free of the binary (it cannot name it); this test keeps the
//! layers inside each crate honest, where one crate could import anything. It parses every module
//! with `syn`, the parser the Rust ecosystem's macros use, and reads what a reviewer would: every
//! `use`, and every path written in code, types, patterns and macro calls (`crate::`, `super::`,
//! `self::`, `reconcile_core::` and child modules), outside `#[cfg(test)]` items. A path is
//! followed through `use` and `pub use` (globs too) to the module that defines the item.
//!
//! What counts as a circle: among the children of one module, each taken with everything inside
//! it, the imports form no loop, at every depth of the tree. A child may use its parent's items:
//! it is part of its parent, as a function is part of its module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

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
        | "visit" | "history" | "load" | "import" | "preflight" | "probe" | "quality"
        | "router" | "signals" | "state" | "status" | "systemd" | "verify" | "plan_file"
        | "pinned" => Layer::Orchestration,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Krate {
    Core,
    Bin,
}

/// A module of a crate: its path from the crate root (`[]` is lib.rs or main.rs).
type ModuleId = (Krate, Vec<String>);

/// A path as written, and where: the module (file or inline) whose code holds it.
#[derive(Debug, Clone)]
struct Written {
    scope: Vec<String>,
    path: Vec<String>,
}

/// What one module (a file, or an inline `mod x { }` in it) defines and names.
#[derive(Debug, Default)]
struct Scope {
    /// The file module the scope is written in (itself for a file).
    file: Vec<String>,
    /// Names of items defined here (functions, types, modules, constants, macros).
    defined: BTreeSet<String>,
    /// Names brought in by `use`, public or not, and where each points (as written).
    aliases: BTreeMap<String, Vec<String>>,
    /// `use x::*` targets, as written.
    globs: Vec<Vec<String>>,
}

/// Everything the reader found in one crate.
#[derive(Debug, Default)]
struct Crate {
    scopes: BTreeMap<Vec<String>, Scope>,
    /// Every path written, with the file module whose code holds it.
    written: Vec<(Vec<String>, Written)>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_crate(krate: Krate, dir: &Path) -> Crate {
    let mut found = Crate::default();
    let mut files = Vec::new();
    list(krate, dir, dir, &mut files);
    for (module, path) in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        read_file(&mut found, &module, &file);
    }
    found
}

/// Every `.rs` file of a crate with its module path. src/bin/ holds programs of their own (the
/// host's guard), not modules of the binary's crate: `the_hosts_programs_link_only_the_core` keeps
/// them apart.
fn list(krate: Krate, base: &Path, dir: &Path, files: &mut Vec<(Vec<String>, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if krate == Krate::Bin && path == base.join("bin") {
            continue;
        }
        if path.is_dir() {
            list(krate, base, &path, files);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(base).unwrap().with_extension("");
        let mut module: Vec<String> = relative
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        files.push((module, path));
    }
}

fn read_file(found: &mut Crate, module: &[String], file: &syn::File) {
    let mut reader = Reader {
        found,
        file: module.to_vec(),
        scope: module.to_vec(),
    };
    reader.found.scopes.entry(module.to_vec()).or_default().file = module.to_vec();
    for item in &file.items {
        reader.visit_item(item);
    }
}

struct Reader<'a> {
    found: &'a mut Crate,
    file: Vec<String>,
    scope: Vec<String>,
}

impl Reader<'_> {
    fn here(&mut self) -> &mut Scope {
        let file = self.file.clone();
        let scope = self.found.scopes.entry(self.scope.clone()).or_default();
        scope.file = file;
        scope
    }

    fn write(&mut self, path: Vec<String>) {
        let written = Written {
            scope: self.scope.clone(),
            path,
        };
        self.found.written.push((self.file.clone(), written));
    }

    fn define(&mut self, name: &syn::Ident) {
        self.here().defined.insert(name.to_string());
    }
}

/// `#[cfg(test)]` (alone or inside `all(...)`): tests may reach anywhere; the layers are about what
/// the program itself uses.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let tokens = a.meta.require_list().map(|l| l.tokens.to_string());
            tokens.is_ok_and(|t| {
                t.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == "test")
            })
        }
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        use syn::Item::*;
        match item {
            Const(i) => self.define(&i.ident),
            Enum(i) => self.define(&i.ident),
            Fn(i) => self.define(&i.sig.ident),
            Static(i) => self.define(&i.ident),
            Struct(i) => self.define(&i.ident),
            Trait(i) => self.define(&i.ident),
            Type(i) => self.define(&i.ident),
            Union(i) => self.define(&i.ident),
            Macro(i) => {
                if let Some(name) = &i.ident {
                    self.define(name);
                }
            }
            _ => {}
        }
        visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.define(&item.ident);
        if let Some((_, items)) = &item.content {
            self.scope.push(item.ident.to_string());
            self.here();
            for item in items {
                self.visit_item(item);
            }
            self.scope.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut uses = Vec::new();
        expand(&item.tree, Vec::new(), &mut uses);
        for used in uses {
            match used {
                Use::Name(alias, path) => {
                    self.here().aliases.insert(alias, path.clone());
                    self.write(path);
                }
                Use::Glob(path) => {
                    self.here().globs.push(path.clone());
                    self.write(path);
                }
            }
        }
    }

    /// `pub(crate)`, `pub(super)`, `pub(in a::b)`: who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.write(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        for path in paths_in_tokens(mac.tokens.clone()) {
            self.write(path);
        }
    }
}

/// One name a `use` brings in.
enum Use {
    /// `use a::b` (name `b`), `use a::b as c` (name `c`), `use a::{self}` (name `a`).
    Name(String, Vec<String>),
    /// `use a::*`.
    Glob(Vec<String>),
}

fn expand(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<Use>) {
    let with = |name: &syn::Ident| {
        let mut p = prefix.clone();
        p.push(name.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => expand(&p.tree, with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            if let Some(last) = prefix.last() {
                out.push(Use::Name(last.clone(), prefix.clone()));
            }
        }
        syn::UseTree::Name(n) => out.push(Use::Name(n.ident.to_string(), with(&n.ident))),
        syn::UseTree::Rename(r) => {
            let path = if r.ident == "self" {
                prefix.clone()
            } else {
                with(&r.ident)
            };
            out.push(Use::Name(r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => out.push(Use::Glob(prefix)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                expand(t, prefix.clone(), out);
            }
        }
    }
}

/// Paths inside a macro call's tokens (`format!("{}", crate::x::y())`, `matches!(v, super::A)`):
/// each run of `ident :: ident ...` not preceded by `::`.
fn paths_in_tokens(tokens: TokenStream) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => found.extend(paths_in_tokens(g.stream())),
            TokenTree::Ident(first) => {
                let after_colons = i >= 2 && is_colon(&trees[i - 1]) && is_colon(&trees[i - 2]);
                let mut path = vec![first.to_string()];
                let mut j = i + 1;
                while j + 1 < trees.len() && is_colon(&trees[j]) && is_colon(&trees[j + 1]) {
                    match trees.get(j + 2) {
                        Some(TokenTree::Ident(next)) => {
                            path.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                if !after_colons && path.len() > 1 {
                    found.push(path);
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn is_colon(tree: &TokenTree) -> bool {
    matches!(tree, TokenTree::Punct(p) if p.as_char() == ':')
}

/// Both crates, read, with what resolving a path needs.
struct Tree {
    crates: BTreeMap<Krate, Crate>,
}

impl Tree {
    fn read() -> Tree {
        let mut crates = BTreeMap::new();
        for (krate, dir) in [
            (Krate::Bin, root().join("src")),
            (Krate::Core, root().join("core/src")),
        ] {
            crates.insert(krate, read_crate(krate, &dir));
        }
        Tree { crates }
    }

    fn is_module(&self, krate: Krate, path: &[String]) -> bool {
        self.crates[&krate].scopes.contains_key(path)
    }

    /// A path as written in `scope` made absolute, or None where it leaves both crates (std, a
    /// dependency) or names something local (a variable, `Self`, a generic).
    fn absolute(&self, krate: Krate, scope: &[String], path: &[String]) -> Option<ModuleId> {
        self.absolute_within(krate, scope, path, 0)
    }

    fn absolute_within(
        &self,
        krate: Krate,
        scope: &[String],
        path: &[String],
        hops: usize,
    ) -> Option<ModuleId> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some((krate, path[1..].to_vec())),
            "reconcile_core" => Some((Krate::Core, path[1..].to_vec())),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let base = scope.len().checked_sub(ups)?;
                Some((
                    krate,
                    scope[..base].iter().chain(&path[ups..]).cloned().collect(),
                ))
            }
            "self" => Some((krate, scope.iter().chain(&path[1..]).cloned().collect())),
            name => {
                // A child module, or a name this scope imported (`use crate::a; a::f()`).
                let child: Vec<String> = scope.iter().chain(path).cloned().collect();
                if self.is_module(krate, &child[..scope.len() + 1]) {
                    return Some((krate, child));
                }
                let alias = self.crates[&krate].scopes.get(scope)?.aliases.get(name)?;
                // `use serde;`, or `use x::x;` read again: outside the crates.
                if alias.first().map(String::as_str) == Some(name) || hops > 16 {
                    return None;
                }
                let mut whole = self.absolute_within(krate, scope, alias, hops + 1)?;
                whole.1.extend(path[1..].iter().cloned());
                Some(whole)
            }
        }
    }

    /// The file module that defines what an absolute path names: its longest prefix that is a
    /// module, then through `use` aliases and globs there to where the name is defined.
    fn defining_file(&self, mut target: ModuleId, hops: usize) -> Option<ModuleId> {
        if hops > 16 {
            return None;
        }
        let (krate, path) = &target;
        let krate = *krate;
        let mut n = path.len();
        while n > 0 && !self.is_module(krate, &path[..n]) {
            n -= 1;
        }
        let module = path[..n].to_vec();
        let scope = self.crates[&krate].scopes.get(&module)?;
        let file = (krate, scope.file.clone());
        let Some(name) = path.get(n) else {
            return Some(file);
        };
        if scope.defined.contains(name) {
            return Some(file);
        }
        if let Some(alias) = scope.aliases.get(name) {
            let mut next = self.absolute(krate, &module, alias)?;
            next.1.extend(path[n + 1..].iter().cloned());
            if next == target {
                return Some(file);
            }
            target = next;
            return self.defining_file(target, hops + 1);
        }
        for glob in &scope.globs {
            let Some(mut next) = self.absolute(krate, &module, glob) else {
                continue;
            };
            next.1.extend(path[n..].iter().cloned());
            if let Some(found) = self.defining_file(next, hops + 1) {
                if self.defines(&found, &path[n..]) {
                    return Some(found);
                }
            }
        }
        Some(file)
    }

    /// Whether a file module (or an inline module in it) holds the first name of `rest`.
    fn defines(&self, (krate, file): &ModuleId, rest: &[String]) -> bool {
        let Some(name) = rest.first() else {
            return true;
        };
        self.crates[krate]
            .scopes
            .values()
            .filter(|s| &s.file == file)
            .any(|s| s.defined.contains(name) || s.aliases.contains_key(name))
    }

    /// Every file module each file module imports from, itself aside.
    fn edges(&self) -> BTreeMap<ModuleId, BTreeSet<ModuleId>> {
        let mut edges: BTreeMap<ModuleId, BTreeSet<ModuleId>> = BTreeMap::new();
        for (&krate, found) in &self.crates {
            for (file, written) in &found.written {
                let from = (krate, file.clone());
                let Some(target) = self.absolute(krate, &written.scope, &written.path) else {
                    continue;
                };
                if let Some(to) = self.defining_file(target, 0) {
                    if to != from {
                        edges.entry(from.clone()).or_default().insert(to);
                    }
                }
            }
        }
        edges
    }
}

/// The edges between siblings: each file edge lifted to the two children of the modules' nearest
/// common ancestor it joins. An edge between a module and one inside it joins no siblings.
fn sibling_edges(
    edges: &BTreeMap<ModuleId, BTreeSet<ModuleId>>,
) -> BTreeMap<ModuleId, BTreeSet<ModuleId>> {
    let mut lifted: BTreeMap<ModuleId, BTreeSet<ModuleId>> = BTreeMap::new();
    for (from, targets) in edges {
        for to in targets {
            if from.0 != to.0 {
                continue; // Across crates: the compiler keeps the core from naming the binary.
            }
            let common = from.1.iter().zip(&to.1).take_while(|(a, b)| a == b).count();
            if common == from.1.len() || common == to.1.len() {
                continue;
            }
            lifted
                .entry((from.0, from.1[..=common].to_vec()))
                .or_default()
                .insert((to.0, to.1[..=common].to_vec()));
        }
    }
    lifted
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

/// The loops among siblings, each as its arrows (`a -> b`), each arrow with the file modules
/// behind it.
fn circles(edges: &BTreeMap<ModuleId, BTreeSet<ModuleId>>) -> Vec<String> {
    let siblings = sibling_edges(edges);
    let within =
        |module: &ModuleId, inner: &ModuleId| module.0 == inner.0 && inner.1.starts_with(&module.1);
    loops(&siblings)
        .iter()
        .map(|component| {
            let members: BTreeSet<&ModuleId> = component.iter().collect();
            let arrows: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    siblings[from]
                        .iter()
                        .filter(|to| members.contains(to))
                        .map(move |to| (from, to))
                })
                .map(|(from, to)| {
                    let behind: Vec<String> = edges
                        .iter()
                        .filter(|(f, _)| within(from, f))
                        .flat_map(|(f, ts)| ts.iter().map(move |t| (f, t)))
                        .filter(|(_, t)| within(to, t))
                        .map(|(f, t)| format!("{} -> {}", name(f), name(t)))
                        .collect();
                    format!("{} -> {} ({})", name(from), name(to), behind.join(", "))
                })
                .collect();
            arrows.join("\n    ")
        })
        .collect()
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let tree = Tree::read();
    let found = circles(&tree.edges());
    assert!(
        found.is_empty(),
        "import circles:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let tree = Tree::read();
    let mut wrong = Vec::new();
    let mut unmapped = BTreeSet::new();
    for (from, targets) in tree.edges() {
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

/// The checker itself, on a small crate written here: what it must follow, what it must skip,
/// and a circle it must see.
#[test]
fn the_reader_follows_uses_and_paths_and_sees_a_circle() {
    let mut found = Crate::default();
    let files = [
        (vec![], "pub mod a; pub mod b; pub mod c; pub mod d;"),
        (
            vec!["a"],
            "mod inner; pub use inner::Deep; use crate::b::{self, Thing as Renamed};\n\
             // use crate::c::Hidden;\n\
             pub fn f() -> Renamed { let _ = \"crate::d::nope\"; b::g() }\n\
             #[cfg(test)] mod tests { use crate::d::TestOnly; }",
        ),
        (vec!["a", "inner"], "pub struct Deep; pub fn up() { super::f(); }"),
        (
            vec!["b"],
            "pub struct Thing; pub fn g() -> Thing { let _ = format!(\"{:?}\", crate::c::h()); Thing }",
        ),
        (vec!["c"], "pub fn h() -> crate::a::Deep { crate::a::Deep }"),
        (vec!["d"], "pub struct TestOnly;"),
    ];
    for (module, code) in &files {
        let module: Vec<String> = module.iter().map(|s: &&str| s.to_string()).collect();
        read_file(&mut found, &module, &syn::parse_file(code).unwrap());
    }
    let tree = Tree {
        crates: BTreeMap::from([(Krate::Bin, found), (Krate::Core, Crate::default())]),
    };
    let module =
        |p: &[&str]| -> ModuleId { (Krate::Bin, p.iter().map(|s| s.to_string()).collect()) };
    let edges = tree.edges();
    // `use crate::b::{self, Thing}` and `b::g()`; `crate::c::h()` inside `format!`; `pub use
    // inner::Deep` followed to the file that defines `Deep`.
    assert!(
        edges[&module(&["a"])].contains(&module(&["b"])),
        "{edges:?}"
    );
    assert!(
        edges[&module(&["b"])].contains(&module(&["c"])),
        "{edges:?}"
    );
    assert!(
        edges[&module(&["c"])].contains(&module(&["a", "inner"])),
        "{edges:?}"
    );
    // A comment, a string and a test module are not imports.
    assert!(
        !edges.values().flatten().any(|to| *to == module(&["d"])),
        "{edges:?}"
    );
    // a -> b -> c -> a (c names a's child): one circle among the siblings a, b, c. The child
    // using its parent (`super::f`) is not one.
    let found = circles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("reconcile::c -> reconcile::a"),
        "{found:?}"
    );
    assert!(
        edges[&module(&["a", "inner"])].contains(&module(&["a"])),
        "{edges:?}"
    );
    assert!(!found[0].contains("inner -> reconcile::a"), "{found:?}");
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
        let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut program = Crate::default();
        read_file(&mut program, &[], &file);
        for (_, written) in &program.written {
            let first = written.path.first().map(String::as_str).unwrap_or("");
            assert!(
                !["reconcile", "crate", "tokio", "reqwest", "openssh"].contains(&first),
                "{} names {}",
                path.display(),
                written.path.join("::")
            );
        }
        seen += 1;
    }
    assert!(seen > 0, "no program in {}", dir.display());
}
