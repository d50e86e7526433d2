//! Compile errors of `gt!`: each `tests/ui/*.rs` must fail to compile with the messages
//! (and the spans) in its `.stderr` (regenerate with `TRYBUILD=overwrite`, then review).

#[test]
fn compile_errors_point_at_the_macro_input() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
