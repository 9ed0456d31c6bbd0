//! The modules' imports run one way: no file of `src/` imports, through any chain, a file that
//! imports it back. Read from the source text (`use crate::…`, `use super::…` and paths
//! written inline), with each path resolved to the file of the deepest module it names; test
//! modules (after a file's `#[cfg(test)]`) are left out, as are `main.rs` (a crate of its own)
//! and `lib.rs`'s module list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn source_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            source_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// The module path of a file under `src/`: `src/limit/redis/slots.rs` → `[limit, redis, slots]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "lib" && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The file of the deepest module that `path` names (the crate root when it names none).
fn file_of(src: &Path, path: &[String]) -> PathBuf {
    let mut file = src.join("lib.rs");
    let mut dir = src.to_path_buf();
    for segment in path {
        let flat = dir.join(format!("{segment}.rs"));
        let nested = dir.join(segment).join("mod.rs");
        if flat.is_file() {
            file = flat;
        } else if nested.is_file() {
            file = nested;
        } else {
            break;
        }
        dir = dir.join(segment);
    }
    file
}

/// The code of a file before its test module, without its comments.
fn code_before_tests(text: &str) -> String {
    let end = text.find("#[cfg(test)]").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|line| match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Every path a file names that starts with `crate::` or `super::`, expanded from `use` trees
/// (`use crate::{a::B, c::{D, E}}`) and read inline (`crate::gateway::X`).
fn paths_named(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let starts = (rest.starts_with(b"crate::") || rest.starts_with(b"super::"))
            && (at == 0 || !is_ident(bytes[at - 1]) && bytes[at - 1] != b':');
        if !starts {
            at += 1;
            continue;
        }
        let mut end = at;
        let mut depth = 0usize;
        while end < bytes.len() {
            match bytes[end] {
                b'{' => depth += 1,
                b'}' if depth > 0 => depth -= 1,
                b if depth > 0 && (is_ident(b) || b":, \n\t*".contains(&b)) => {}
                b if depth == 0 && (is_ident(b) || b == b':') => {}
                _ => break,
            }
            end += 1;
        }
        expand(code[at..end].trim_end_matches(':'), "", &mut paths);
        at = end.max(at + 1);
    }
    paths
}

/// `prefix` + each path of a use tree.
fn expand(tree: &str, prefix: &str, paths: &mut Vec<String>) {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    match tree.find('{') {
        None => paths.push(format!("{prefix}{tree}")),
        Some(open) => {
            let head = &tree[..open];
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (index, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&inner[start..index], &format!("{prefix}{head}"), paths);
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            expand(&inner[start..], &format!("{prefix}{head}"), paths);
        }
    }
}

/// The absolute module path a `crate::`/`super::` path names from `module`.
fn absolute(module: &[String], path: &str) -> Vec<String> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    // In `foo.rs` and `foo/mod.rs` alike, `super` is the parent of module `foo`.
    let mut base: Vec<String> = module.to_vec();
    if segments.first() == Some(&"crate") {
        base.clear();
        segments.remove(0);
    } else {
        while segments.first() == Some(&"super") {
            base.pop();
            segments.remove(0);
        }
    }
    base.extend(segments.iter().map(|s| s.to_string()));
    base
}

fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> {
    let mut files = Vec::new();
    source_files(src, &mut files);
    let mut graph: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        if file == src.join("main.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let module = module_of(src, &file);
        let edges = graph.entry(file.clone()).or_default();
        for path in paths_named(&code_before_tests(&text)) {
            let target = file_of(src, &absolute(&module, &path));
            if target != file {
                edges.entry(target).or_default().insert(path);
            }
        }
    }
    graph
}

/// Tarjan's strongly connected components with more than one file.
fn circles(graph: &BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>,
        index: BTreeMap<&'g PathBuf, usize>,
        low: BTreeMap<&'g PathBuf, usize>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, node: &'g PathBuf) {
            let next = self.index.len();
            self.index.insert(node, next);
            self.low.insert(node, next);
            self.stack.push(node);
            self.on_stack.insert(node);
            for target in self
                .graph
                .get(node)
                .into_iter()
                .flat_map(|edges| edges.keys())
            {
                if !self.graph.contains_key(target) {
                    continue;
                }
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[node].min(self.low[target]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[node].min(self.index[target]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.clone());
                    if member == node {
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
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src);
    let found = circles(&graph);
    let mut report = String::new();
    for circle in &found {
        report.push_str("circle:\n");
        for from in circle {
            for (to, names) in &graph[from] {
                if circle.contains(to) {
                    report.push_str(&format!(
                        "  {} -> {}: {}\n",
                        from.strip_prefix(&src).unwrap().display(),
                        to.strip_prefix(&src).unwrap().display(),
                        names.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{report}");
}

#[test]
fn the_reader_finds_grouped_inline_and_relative_paths() {
    let code = "use crate::{a::B, c::{d::E, F}};\nlet x = crate::g::H; use super::i::J;";
    assert_eq!(
        paths_named(code),
        [
            "crate::a::B",
            "crate::c::d::E",
            "crate::c::F",
            "crate::g::H",
            "super::i::J"
        ]
    );
    let module = ["gateway".to_owned(), "decide".to_owned()];
    assert_eq!(
        absolute(&module, "super::reject::Reject"),
        ["gateway", "reject", "Reject"]
    );
    // A circle of two files is found; a chain is not.
    let mut graph: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    let edge = |graph: &mut BTreeMap<_, BTreeMap<_, BTreeSet<String>>>, a: &str, b: &str| {
        graph
            .entry(PathBuf::from(a))
            .or_default()
            .insert(PathBuf::from(b), BTreeSet::new());
    };
    edge(&mut graph, "a", "b");
    edge(&mut graph, "b", "c");
    graph.entry(PathBuf::from("c")).or_default();
    assert!(circles(&graph).is_empty());
    edge(&mut graph, "c", "a");
    assert_eq!(circles(&graph).len(), 1);
}
