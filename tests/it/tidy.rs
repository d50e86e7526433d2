//! Tidy checks: every Rust file opens with a `//!` line, crate dependencies point one way,
//! and `.ci/run` runs README's test command.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            // third_party/ holds upstream's sources as they are (its README says what changed).
            if !["target", ".git", "corpus", "artifacts", "third_party"].contains(&name.as_ref()) {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_doc_line() {
    let mut files = Vec::new();
    rust_files(root(), &mut files);
    assert!(files.len() > 10);
    let missing: Vec<String> = files
        .iter()
        .filter(|p| !std::fs::read_to_string(p).unwrap().trim_start().starts_with("//!"))
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a `//!` first line: {missing:?}");
}

fn deps(crate_dir: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join(crate_dir).join("Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap_or("").split("\n[").next().unwrap_or("").to_string();
    deps.lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|n| n.starts_with("gt-"))
        .map(String::from)
        .collect()
}

#[test]
fn crate_dependencies_point_one_way() {
    let allowed: &[(&str, &[&str])] = &[
        ("ir", &[]),
        ("passes", &["gt-ir"]),
        ("transport", &["gt-ir"]),
        ("runtime", &["gt-ir", "gt-passes", "gt-transport"]),
        ("frontend", &["gt-ir", "gt-transport"]),
        ("frontend/macros", &["gt-ir"]),
        ("tools", &["gt-ir", "gt-transport"]),
        // The Python package binds the facade (and the crates it names types from).
        ("python", &["gt-ir", "gt-transport", "gt-runtime", "gt-frontend"]),
    ];
    for (dir, ok) in allowed {
        for d in deps(dir) {
            assert!(ok.contains(&d.as_str()), "{dir}/ must not depend on {d} (ARCHITECTURE.md)");
        }
    }
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let cmd = "cargo test --workspace";
    assert!(readme.contains(cmd) && ci.lines().any(|l| l.trim() == cmd), "README and .ci/run share `{cmd}`");
}
