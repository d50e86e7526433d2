//! Fuzz target: arbitrary bytes through the parser, the verifier and the printer must never
//! panic, and whatever parses must round-trip through the printer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(program) = gt_ir::text::parse_bytes(data) {
        let _ = gt_ir::verify(&program);
        let printed = gt_ir::text::print(&program);
        let again = gt_ir::text::parse(&printed).expect("printed program must parse");
        // NaN literals make `==` false, so compare the printed forms.
        assert_eq!(gt_ir::text::print(&again), printed);
    }
});
