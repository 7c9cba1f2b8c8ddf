//! The shape of the server's source, as docs/architecture.md describes it: no two top-level
//! modules of `server/src` import each other (directly or around a circle), the socket wing
//! imports nothing of `http`, configuration imports nothing of the crate, the crate's map in
//! lib.rs names every module and lists each below all it imports, and no source file is
//! longer than 900 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 900;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None`: the crate root or the binary).
fn module_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src()).expect("under src");
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "bin")).then(|| name.to_owned())
}

/// The code of a file without comments and without its unit tests.
fn code(text: &str) -> String {
    let text = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate's top-level modules a piece of code names: `crate::m` and `crate::{m, ..}`.
fn named(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let head = item.trim().split("::").next().unwrap_or("");
                out.insert(head.trim().to_owned());
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.insert(rest[..end].to_owned());
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read");
        graph
            .entry(module.clone())
            .or_default()
            .extend(named(&code(&text)).into_iter().filter(|m| *m != module));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for uses in graph.values_mut() {
        uses.retain(|m| modules.contains(m));
    }
    graph
}

/// A circle through `from`, if there is one: the modules on it, in order.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_owned(), vec![from.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == from {
                return Some(path.clone());
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let graph = graph();
    assert!(graph.len() > 15, "read too little: {graph:?}");
    for module in graph.keys() {
        if let Some(circle) = circle(&graph, module) {
            panic!(
                "top-level modules import each other: {}",
                circle.join(" -> ")
            );
        }
    }
    let uses = |m: &str| graph.get(m).cloned().unwrap_or_default();
    assert!(
        !uses("socket").contains("http"),
        "the socket wing imports http"
    );
    assert!(
        uses("config").is_empty(),
        "config imports {:?}",
        uses("config")
    );
}

/// The modules lib.rs's map names, each with the number of its line in the map.
fn map() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let mut ranks = BTreeMap::new();
    let entries = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .filter(|l| l.starts_with("//! - "));
    for (rank, line) in entries.enumerate() {
        // The names before the colon: [`room`], or `fuzzing` (not linked: behind a feature).
        let head = line.split(": ").next().unwrap_or("");
        for name in head.split('`').skip(1).step_by(2) {
            ranks.insert(name.to_owned(), rank);
        }
    }
    ranks
}

#[test]
fn the_crate_map_names_every_module_below_what_it_imports() {
    let graph = graph();
    let map = map();
    for (module, uses) in &graph {
        let Some(rank) = map.get(module) else {
            panic!("lib.rs's map does not name `{module}`");
        };
        for used in uses {
            let used_rank = map.get(used).copied().unwrap_or(usize::MAX);
            assert!(
                used_rank < *rank,
                "`{module}` imports `{used}`, which lib.rs's map lists at or below it"
            );
        }
    }
}

#[test]
fn no_source_file_is_longer_than_900_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).expect("read").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines})", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "longer than {MAX_LINES} lines: {long:?}");
}
