//! The shape of the server's source, as docs/architecture.md describes it: no two top-level
//! modules of `server/src` import each other (directly or around a circle), the socket wing
//! imports nothing of `http`, configuration imports nothing of the crate, the crate's map in
//! lib.rs names every module and lists each below all it imports, no two files of a folder
//! import each other (directly or around a circle), and no source file is longer than 900
//! lines.

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
    let text = text
        .split("\n#[cfg(test)]\npub(crate) mod tests")
        .next()
        .unwrap_or("");
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

/// The names a piece of code reaches through `prefix` (`super::`, `crate::room::`): `prefix
/// name` and `prefix{name, ..}`.
fn reached(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        // (`super::super::x` is not `super::x`; `$crate::` is a macro's text, written for
        // where it is used.)
        let before = &code[..at];
        if (prefix.starts_with("super::") && before.ends_with("super::")) || before.ends_with('$') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let heads: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(|item| item.trim().split("::").next().unwrap_or("").trim())
                .collect(),
            None => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                vec![&rest[..end]]
            }
        };
        out.extend(heads.into_iter().map(str::to_owned));
    }
    out
}

/// For each folder of `src` (a module with files of its own), the graph of its files: each
/// file or subfolder, and the siblings it names (`super::x` from a file directly in it,
/// `super::super::x` from one a level down, `crate::path::x` from anywhere).
fn folder_graphs() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(src()).expect("under src");
        let parts: Vec<String> = relative
            .components()
            .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
            .collect();
        let text = code(&std::fs::read_to_string(file).expect("read"));
        // Every folder above the file: the file belongs to the unit right below it.
        for depth in 1..parts.len() {
            let folder = parts[..depth].join("/");
            let unit = parts[depth].trim_end_matches(".rs").to_owned();
            if unit == "mod" || folder == "bin" || folder.starts_with("bin/") {
                continue;
            }
            let below = parts.len() - depth - 1;
            let mut names = reached(&text, &"super::".repeat(below + 1));
            names.extend(reached(
                &text,
                &format!("crate::{}::", parts[..depth].join("::")),
            ));
            let graph = out.entry(folder).or_default();
            let uses = graph.entry(unit.clone()).or_default();
            uses.extend(names.into_iter().filter(|n| *n != unit));
        }
    }
    for graph in out.values_mut() {
        let units: BTreeSet<String> = graph.keys().cloned().collect();
        for uses in graph.values_mut() {
            uses.retain(|u| units.contains(u));
        }
    }
    out
}

#[test]
fn no_two_files_of_a_folder_import_each_other() {
    let folders = folder_graphs();
    assert!(
        folders.contains_key("room/actor") && folders.contains_key("socket/hocuspocus"),
        "read too little: {:?}",
        folders.keys()
    );
    assert!(
        folders["room/actor"]["pipeline"].contains("held"),
        "the sibling imports are not read: {:?}",
        folders["room/actor"]
    );
    let mut circles = Vec::new();
    for (folder, graph) in &folders {
        for unit in graph.keys() {
            if let Some(circle) = circle(graph, unit) {
                circles.push(format!("{folder}: {}", circle.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of a folder import each other: {circles:#?}"
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
    // Every crate of the workspace (the server, the wire protocol, the WASM client, the
    // benchmark, the fuzz targets), outside its tests.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "server/src",
        "protocol/src",
        "client-wasm/src",
        "bench/src",
        "fuzz/fuzz_targets",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files.push(root.join("fuzz/gen_seeds.rs"));
    assert!(
        files.iter().any(|f| f.ends_with("client-wasm/src/lib.rs"))
            && files.iter().any(|f| f.ends_with("bench/src/main.rs")),
        "read too little: {files:?}"
    );
    let is_test = |f: &Path| {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name == "tests.rs" || name.ends_with("_tests.rs")
    };
    let long: Vec<String> = files
        .iter()
        .filter(|f| !is_test(f))
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).expect("read").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines})", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "longer than {MAX_LINES} lines: {long:?}");
}

/// docs/architecture.md names every file of the server, each in the row of the modules table
/// of the top-level module it belongs to (a top-level file in its own row, or with others in
/// one, as `metrics.rs`, `telemetry.rs`, `close.rs`), and every file of the WASM client.
#[test]
fn the_architecture_document_names_every_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read doc");
    let rows: Vec<(&str, &str)> = doc
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let mut cells = l.split('|').skip(1);
            Some((cells.next()?, l))
        })
        .collect();
    assert!(rows.len() > 20, "read too few rows: {}", rows.len());
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(src()).expect("under src");
        let parts: Vec<&str> = relative.iter().filter_map(|p| p.to_str()).collect();
        let name = parts[parts.len() - 1];
        if name == "mod.rs" || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        if parts.len() == 1 {
            if name != "lib.rs"
                && !rows
                    .iter()
                    .any(|(head, _)| head.contains(&format!("`{name}`")))
            {
                missing.push(relative.display().to_string());
            }
            continue;
        }
        let top = parts[0];
        // A file in a folder: named (by its name, or its path within the folder) in a row
        // of its top-level module.
        let within = parts[1..].join("/");
        let path = parts.join("/");
        let named = rows.iter().any(|(head, row)| {
            (head.contains(&format!("`{top}/")) || head.contains(&format!("`{top}.rs`")))
                && [name, &within, &path]
                    .iter()
                    .any(|n| row.contains(&format!("`{n}`")))
        });
        if !named {
            missing.push(relative.display().to_string());
        }
    }
    let mut client = Vec::new();
    rust_files(&root.join("client-wasm/src"), &mut client);
    for file in &client {
        let relative = file
            .strip_prefix(root.join("client-wasm/src"))
            .expect("under src");
        let shown = relative.display().to_string();
        if !doc.contains(&shown) {
            missing.push(format!("client-wasm/src/{shown}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these files where their module is: {missing:#?}"
    );
}
