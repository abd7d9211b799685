//! Layout check: no two modules of the workspace import each other, directly or through a
//! circle. Crates cannot (cargo refuses circular dependencies); this finds circles between
//! the modules inside each crate.
//!
//! Every crate's module tree is read from its `lib.rs`/`main.rs` by following `mod x;`
//! declarations; each file is parsed with `syn`, skipping `#[cfg(test)]` items. An edge
//! A -> B is a path in A's code (a `use` or a path in code or types) that names module B or
//! an item in it: `crate::…`, `super::…`, `self::…`, or a child module of A by name. A
//! module contains its submodules, so paths between a module and its own ancestors or
//! descendants (a parent's re-exports, a child's use of its parent's items) are not edges. The strongly connected components of the
//! graph with more than one module are the circles; each is printed with one example
//! path per edge (file:line). `cargo test --test import_cycles -- --nocapture` prints the
//! graph's size too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
}

/// The modules of one crate, by path from the crate root ([] = the root).
fn module_tree(root_file: &Path) -> BTreeMap<ModPath, Module> {
    let mut mods = BTreeMap::new();
    let mut todo = vec![(Vec::new(), root_file.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        let mut children = BTreeSet::new();
        for item in &ast.items {
            let syn::Item::Mod(m) = item else { continue };
            if m.content.is_some() || is_cfg_test(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let cand = [
                dir.join(format!("{name}.rs")),
                dir.join(&name).join("mod.rs"),
            ];
            let child_file = cand
                .iter()
                .find(|p| p.is_file())
                .unwrap_or_else(|| panic!("{}: mod {name}: no file", file.display()))
                .clone();
            let mut child = path.clone();
            child.push(name.clone());
            children.insert(name);
            todo.push((child, child_file));
        }
        mods.insert(path, Module { file, children });
    }
    mods
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Paths named in one file (each as segments, with its line), `#[cfg(test)]` items skipped.
#[derive(Default)]
struct PathCollector {
    paths: Vec<(Vec<String>, usize)>,
    /// Inline `mod x { … }` nesting: their `super` paths are made relative to the file.
    depth: usize,
}

impl PathCollector {
    fn push(&mut self, mut segs: Vec<String>, line: usize) {
        let supers = segs.iter().take_while(|s| *s == "super").count();
        let inside = supers.min(self.depth);
        if inside > 0 {
            segs.drain(..inside);
            if supers == inside {
                segs.insert(0, "self".into());
            }
        }
        self.paths.push((segs, line));
    }
}

impl PathCollector {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.push(full, n.ident.span().start().line);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.push(full, r.ident.span().start().line);
            }
            syn::UseTree::Glob(g) => {
                self.push(prefix.clone(), g.star_token.spans[0].start().line);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for PathCollector {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(m) => &m.attrs,
            syn::Item::Use(m) => &m.attrs,
            syn::Item::Const(m) => &m.attrs,
            syn::Item::Static(m) => &m.attrs,
            syn::Item::Struct(m) => &m.attrs,
            syn::Item::Enum(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, i),
        };
        if is_cfg_test(attrs) {
            return;
        }
        let inline = matches!(i, syn::Item::Mod(m) if m.content.is_some());
        self.depth += usize::from(inline);
        syn::visit::visit_item(self, i);
        self.depth -= usize::from(inline);
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() >= 2 {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = p.segments[0].ident.span().start().line;
            self.push(segs, line);
        }
        syn::visit::visit_path(self, p);
    }
}

/// The module a path names (its longest prefix that is a module), from module `at`.
fn target(mods: &BTreeMap<ModPath, Module>, at: &ModPath, segs: &[String]) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = segs;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &segs[1..];
        }
        Some("self") => {
            base = at.clone();
            rest = &segs[1..];
        }
        Some("super") => {
            base = at.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) if mods.get(at).is_some_and(|m| m.children.contains(first)) => {
            base = at.clone();
        }
        _ => return None,
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if !mods.contains_key(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// Edges (from, to) -> an example "file:line".
fn edges(mods: &BTreeMap<ModPath, Module>) -> BTreeMap<(ModPath, ModPath), String> {
    let mut out = BTreeMap::new();
    for (at, m) in mods {
        let text = std::fs::read_to_string(&m.file).unwrap();
        let ast = syn::parse_file(&text).unwrap();
        let mut c = PathCollector::default();
        c.visit_file(&ast);
        for (segs, line) in c.paths {
            let Some(to) = target(mods, at, &segs) else {
                continue;
            };
            // A module contains its submodules: a parent using its children (its facade)
            // or a child using its ancestors' items is containment, not an import.
            if to.starts_with(at) || at.starts_with(&to) {
                continue;
            }
            out.entry((at.clone(), to))
                .or_insert_with(|| format!("{}:{line} ({})", m.file.display(), segs.join("::")));
        }
    }
    out
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(nodes: &[ModPath], edges: &BTreeMap<(ModPath, ModPath), String>) -> Vec<Vec<ModPath>> {
    struct T<'a> {
        adj: BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a ModPath) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.adj.get(v).cloned().unwrap_or_default() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        adj: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for (a, b) in edges.keys() {
        t.adj.entry(a).or_default().push(b);
    }
    for v in nodes {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

fn name(krate: &str, m: &ModPath) -> String {
    if m.is_empty() {
        krate.to_string()
    } else {
        format!("{krate}::{}", m.join("::"))
    }
}

/// Every crate root of the workspace: (crate name, root file).
fn crate_roots() -> Vec<(String, PathBuf)> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![("drpttracer".to_string(), ws.join("src/lib.rs"))];
    let mut dirs: Vec<_> = std::fs::read_dir(ws.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for d in dirs {
        let krate = d.file_name().unwrap().to_string_lossy().replace('-', "_");
        for f in ["src/lib.rs", "src/main.rs"] {
            if d.join(f).is_file() {
                roots.push((krate.clone(), d.join(f)));
            }
        }
    }
    roots
}

/// A circle: its modules and, for each edge inside it, one example path.
struct Circle {
    modules: BTreeSet<String>,
    edges: Vec<String>,
}

/// Every circle in the workspace, with the number of modules and edges read.
fn workspace_circles() -> (usize, usize, Vec<Circle>) {
    let (mut n_mods, mut n_edges, mut found) = (0, 0, Vec::new());
    for (krate, root) in crate_roots() {
        let mods = module_tree(&root);
        let e = edges(&mods);
        n_mods += mods.len();
        n_edges += e.len();
        let nodes: Vec<ModPath> = mods.keys().cloned().collect();
        for scc in circles(&nodes, &e) {
            let inside: BTreeSet<&ModPath> = scc.iter().collect();
            let why = e
                .iter()
                .filter(|((a, b), _)| inside.contains(a) && inside.contains(b))
                .map(|((a, b), at)| format!("{} -> {}: {at}", name(&krate, a), name(&krate, b)))
                .collect();
            found.push(Circle {
                modules: scc.iter().map(|m| name(&krate, m)).collect(),
                edges: why,
            });
        }
    }
    (n_mods, n_edges, found)
}

#[test]
fn no_module_imports_another_that_imports_it_back() {
    let (n_mods, n_edges, found) = workspace_circles();
    println!(
        "import graph: {n_mods} modules, {n_edges} edges, {} circles",
        found.len()
    );
    let mut report = String::new();
    for c in &found {
        let mods: Vec<&str> = c.modules.iter().map(String::as_str).collect();
        report.push_str(&format!("circle: {}\n", mods.join(", ")));
        for e in &c.edges {
            report.push_str(&format!("  {e}\n"));
        }
    }
    print!("{report}");
    assert!(
        n_mods > 100,
        "the module tree was not read ({n_mods} modules)"
    );
    assert!(found.is_empty(), "import circles:\n{report}");
}

/// The graph reader itself finds a circle where there is one, and none where the paths only
/// run between a module and its ancestors or inside `#[cfg(test)]`.
#[test]
fn circles_are_found_in_a_small_crate() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use a::A;\n",
    )
    .unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::helper;\npub struct A;\n").unwrap();
    std::fs::write(
        src.join("b/mod.rs"),
        "mod inner;\npub fn helper() { inner::x(); super::a::A; }\n",
    )
    .unwrap();
    std::fs::write(src.join("b/inner.rs"), "pub fn x() { super::helper(); }\n").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "use crate::a::A;\n#[cfg(test)]\nmod tests { use crate::c; }\nmod x { use super::super::b; }\n",
    )
    .unwrap();
    let mods = module_tree(&src.join("lib.rs"));
    let e = edges(&mods);
    let nodes: Vec<ModPath> = mods.keys().cloned().collect();
    let found = circles(&nodes, &e);
    let names: Vec<Vec<String>> = found
        .iter()
        .map(|c| c.iter().map(|m| name("t", m)).collect())
        .collect();
    // a <-> b is a circle; b <-> b::inner is containment; c -> a, c -> b (from its inline
    // module) are one-way.
    assert_eq!(names, vec![vec!["t::a".to_string(), "t::b".to_string()]]);
    let keys: Vec<(String, String)> = e
        .keys()
        .map(|(a, b)| (name("t", a), name("t", b)))
        .collect();
    assert_eq!(
        keys,
        [
            ("t::a", "t::b"),
            ("t::b", "t::a"),
            ("t::c", "t::a"),
            ("t::c", "t::b")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .to_vec()
    );
}
