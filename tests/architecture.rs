//! The layering of `docs/architecture.md` holds in the code: every `crate::<module>` import in
//! `src/` names a module listed after the importing one in the document's `layers` block, and no
//! `never` pair is imported. The document is the rule; this test reads it, so the two cannot
//! drift apart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Layers {
    /// Module name -> position in the order (0 = top).
    rank: HashMap<String, usize>,
    /// The modules of the top layer: the only ones that may use what `lib.rs` itself defines or
    /// re-exports (`crate::open`, `crate::Config`).
    hosts: Vec<String>,
    never: Vec<(String, String)>,
}

fn layers() -> Layers {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md");
    let block = doc
        .split("```layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/architecture.md has a ```layers block");
    let mut rank = HashMap::new();
    let mut hosts = Vec::new();
    let mut never = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (name, modules) = line.split_once(':').expect("`name: modules` lines");
        let modules: Vec<String> = modules.split_whitespace().map(String::from).collect();
        if name.trim() == "never" {
            assert_eq!(modules.len(), 2, "a never line names two modules: {line}");
            never.push((modules[0].clone(), modules[1].clone()));
        } else {
            if rank.is_empty() {
                hosts = modules.clone();
            }
            for m in modules {
                let n = rank.len();
                assert!(rank.insert(m.clone(), n).is_none(), "{m} is listed twice");
            }
        }
    }
    Layers { rank, hosts, never }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level module a file of `src/` belongs to (`src/relay/worker.rs` -> `relay`,
/// `src/bin/outboxd/main.rs` -> `bin`), or `None` for `lib.rs`.
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root().join("src")).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `name` is a module of the crate (a file or folder under `src/`), rather than an item
/// `lib.rs` defines or re-exports.
fn is_module(name: &str) -> bool {
    let src = root().join("src");
    src.join(format!("{name}.rs")).is_file() || src.join(name).is_dir()
}

/// The names a file uses as `crate::<name>` in its code, with their lines: plain paths
/// (`crate::store::Store`) and each head of a group (`use crate::{store::Store, relay};`, over
/// several lines too). Comments are left out: doc links in comments are prose, not imports.
fn imports(text: &str) -> Vec<(usize, String)> {
    // The code without its comments, line breaks kept, so that a position tells its line.
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        let rest = at + "crate::".len();
        from = rest;
        // `$crate::` in a macro expands where the macro is used.
        if at > 0 && code.as_bytes()[at - 1] == b'$' {
            continue;
        }
        if code[rest..].starts_with('{') {
            for (offset, name) in group_heads(&code[rest + 1..]) {
                found.push((line_of(rest + 1 + offset), name));
            }
        } else {
            let name = ident(&code[rest..]);
            if !name.is_empty() {
                found.push((line_of(at), name));
            }
        }
    }
    found
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first segment of each item of a `{...}` group (`s` starts after the `{`), with its offset
/// in `s`, up to the group's closing brace; `self` is the group's own path, not an import.
fn group_heads(s: &str) -> Vec<(usize, String)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && !c.is_whitespace() => {
                item_start = false;
                let name = ident(&s[i..]);
                if !name.is_empty() && name != "self" {
                    heads.push((i, name));
                }
            }
            _ => {}
        }
    }
    heads
}

/// Every import of `files` (path under `src/`, text) that runs against `layers`.
fn violations(layers: &Layers, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (file, text) in files {
        let Some(from) = module_of(file) else { continue };
        let from_rank = *layers.rank.get(&from).unwrap_or_else(|| {
            panic!(
                "module `{from}` ({}) is not in docs/architecture.md's layers",
                file.display()
            )
        });
        for (line, to) in imports(text) {
            if to == from {
                continue;
            }
            let shown = format!("{}:{line}", file.strip_prefix(root()).unwrap_or(file).display());
            if !is_module(&to) {
                // An item of lib.rs (`crate::Config`, `crate::open`): the crate's face, for hosts.
                if !layers.hosts.contains(&from) {
                    wrong.push(format!(
                        "{shown}: `{from}` uses `crate::{to}` through lib.rs; import it from its module"
                    ));
                }
                continue;
            }
            match layers.rank.get(&to) {
                None => wrong.push(format!("{shown}: imports `{to}`, which the layers do not list")),
                Some(&to_rank) if to_rank <= from_rank => {
                    wrong.push(format!("{shown}: `{from}` imports `{to}`, which is listed above it"))
                }
                Some(_) if layers.never.contains(&(from.clone(), to.clone())) => {
                    wrong.push(format!("{shown}: `{from}` must never import `{to}`"))
                }
                Some(_) => {}
            }
        }
    }
    wrong
}

#[test]
fn imports_run_one_way_as_docs_architecture_md_says() {
    let layers = layers();
    let mut paths = Vec::new();
    rust_files(&root().join("src"), &mut paths);
    paths.sort();
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a source file");
            (p, text)
        })
        .collect();
    let wrong = violations(&layers, &files);
    assert!(
        wrong.is_empty(),
        "imports against docs/architecture.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_of_lib_rs_is_in_the_layers() {
    let layers = layers();
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    for line in lib.lines() {
        let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
        if let Some(name) = decl.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
            assert!(
                layers.rank.contains_key(name),
                "src/lib.rs declares `{name}`, missing from the layers"
            );
        }
    }
}

#[test]
fn the_reader_finds_imports_and_skips_comments_and_macro_paths() {
    let text = "use crate::store::Store;\n// see crate::relay\nlet x = crate::db::connect(c); $crate::ffi::boundary::x;\n/// [`crate::consumer`]\nuse crate::Config;";
    let found: Vec<(usize, String)> = vec![(1, "store".into()), (3, "db".into()), (5, "Config".into())];
    assert_eq!(imports(text), found);
    assert!(is_module("store") && is_module("relay") && !is_module("Config") && !is_module("open"));
}

#[test]
fn the_reader_finds_the_heads_of_grouped_imports_on_their_lines() {
    let text = "use crate::{store::Store, relay};\nuse crate::{\n    self,\n    config::{Config, SentRows}, // crate::ffi\n    db,\n};";
    let found: Vec<(usize, String)> = vec![
        (1, "store".into()),
        (1, "relay".into()),
        (4, "config".into()),
        (5, "db".into()),
    ];
    assert_eq!(imports(text), found);
}

#[test]
fn a_grouped_import_against_the_layers_fails_the_check() {
    let layers = layers();
    // `store` (a service) importing `relay` (a half, above it) inside a group.
    let file = root().join("src/store/example.rs");
    let text = "use crate::{\n    error::Result,\n    relay::Relay,\n};".to_string();
    let wrong = violations(&layers, &[(file, text)]);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(
        wrong[0].contains("src/store/example.rs:3") && wrong[0].contains("`store` imports `relay`"),
        "{wrong:?}"
    );
}
