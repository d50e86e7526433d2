//! Fuzz target: arbitrary bytes through the parsers (programs and kernel text), the verifier
//! and the printers must never panic, and whatever parses must round-trip through the printer.
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
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(kernel) = gt_ir::kernel::text::parse(text) {
            let printed = kernel.to_string();
            let again = gt_ir::kernel::text::parse(&printed).expect("printed kernel must parse");
            assert_eq!(again.to_string(), printed);
            let _ = gt_ir::kernel::validate(&kernel);
        }
    }
});
