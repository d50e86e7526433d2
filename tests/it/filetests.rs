//! Runs every `tests/gtir/**.gtir` filetest and snapshots its output under `snapshots/`.

#[test]
fn filetests() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    let mut failures = Vec::new();
    settings.bind(|| {
        insta::glob!("../gtir", "**/*.gtir", |path| {
            match gt::filetest::run_file(path) {
                Ok(snapshot) => insta::assert_snapshot!(snapshot),
                Err(e) => failures.push(format!("{}: {e:#}", path.display())),
            }
        });
    });
    assert!(failures.is_empty(), "{} filetest(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}
