//! The PTX generator as [`F64Ops`]: each operation of `f64`'s transcendental functions
//! (`gt_ir::math64`, which the CPU computes too) emitted as one or a few instructions, so a
//! GPU kernel gives the CPU's bits.

use super::emit::{f64_imm, Emitter, Reg};
use gt_ir::math64::F64Ops;

impl F64Ops for Emitter {
    type V = String;
    type P = String;

    fn c(&mut self, x: f64) -> String {
        f64_imm(x)
    }
    fn add(&mut self, a: &String, b: &String) -> String {
        self.value(Reg::F64, "add.rn.f64", &format!("{a}, {b}"))
    }
    fn sub(&mut self, a: &String, b: &String) -> String {
        self.value(Reg::F64, "sub.rn.f64", &format!("{a}, {b}"))
    }
    fn mul(&mut self, a: &String, b: &String) -> String {
        self.value(Reg::F64, "mul.rn.f64", &format!("{a}, {b}"))
    }
    fn div(&mut self, a: &String, b: &String) -> String {
        self.value(Reg::F64, "div.rn.f64", &format!("{a}, {b}"))
    }
    fn fma(&mut self, a: &String, b: &String, c: &String) -> String {
        self.value(Reg::F64, "fma.rn.f64", &format!("{a}, {b}, {c}"))
    }
    fn rint(&mut self, a: &String) -> String {
        self.value(Reg::F64, "cvt.rni.f64.f64", a)
    }
    fn trunc(&mut self, a: &String) -> String {
        self.value(Reg::F64, "cvt.rzi.f64.f64", a)
    }
    fn abs(&mut self, a: &String) -> String {
        self.value(Reg::F64, "abs.f64", a)
    }
    fn neg(&mut self, a: &String) -> String {
        self.value(Reg::F64, "neg.f64", a)
    }
    fn copysign(&mut self, magnitude: &String, sign: &String) -> String {
        // PTX's `copysign` takes the sign first.
        self.value(Reg::F64, "copysign.f64", &format!("{sign}, {magnitude}"))
    }
    fn clear_low_word(&mut self, a: &String) -> String {
        let bits = self.value(Reg::B64, "mov.b64", a);
        let high = self.value(Reg::B64, "and.b64", &format!("{bits}, 0xFFFFFFFF00000000"));
        self.value(Reg::F64, "mov.b64", &high)
    }
    fn frexp(&mut self, a: &String) -> (String, String) {
        let bits = self.value(Reg::B64, "mov.b64", a);
        let biased = self.value(Reg::B64, "shr.u64", &format!("{bits}, 52"));
        let field = self.value(Reg::B64, "and.b64", &format!("{biased}, 2047"));
        let wide = self.value(Reg::F64, "cvt.rn.f64.u64", &field);
        let e = self.value(Reg::F64, "sub.rn.f64", &format!("{wide}, {}", f64_imm(1023.0)));
        let mant = self.value(Reg::B64, "and.b64", &format!("{bits}, {}", 0x000F_FFFF_FFFF_FFFFu64));
        let mbits = self.value(Reg::B64, "or.b64", &format!("{mant}, {}", 0x3FF0_0000_0000_0000u64));
        (self.value(Reg::F64, "mov.b64", &mbits), e)
    }
    fn ldexp(&mut self, a: &String, k: &String) -> String {
        let k = self.value(Reg::B32, "cvt.rni.s32.f64", k);
        // k = k1 + k2, each within the normal exponents: 2^k1 and 2^k2 are exact.
        let k1 = self.value(Reg::B32, "shr.s32", &format!("{k}, 1"));
        let k2 = self.value(Reg::B32, "sub.s32", &format!("{k}, {k1}"));
        let power = |e: &mut Emitter, k: &str| {
            let biased = e.value(Reg::B32, "add.s32", &format!("{k}, 1023"));
            let wide = e.value(Reg::B64, "cvt.u64.u32", &biased);
            let bits = e.value(Reg::B64, "shl.b64", &format!("{wide}, 52"));
            e.value(Reg::F64, "mov.b64", &bits)
        };
        let (p1, p2) = (power(self, &k1), power(self, &k2));
        let once = self.value(Reg::F64, "mul.rn.f64", &format!("{a}, {p1}"));
        self.value(Reg::F64, "mul.rn.f64", &format!("{once}, {p2}"))
    }
    fn lt(&mut self, a: &String, b: &String) -> String {
        self.predicate("lt.f64", a, b)
    }
    fn gt(&mut self, a: &String, b: &String) -> String {
        self.predicate("gt.f64", a, b)
    }
    fn eq(&mut self, a: &String, b: &String) -> String {
        self.predicate("eq.f64", a, b)
    }
    fn ne(&mut self, a: &String, b: &String) -> String {
        self.predicate("neu.f64", a, b)
    }
    fn is_nan(&mut self, a: &String) -> String {
        self.predicate("nan.f64", a, a)
    }
    fn or(&mut self, p: &String, q: &String) -> String {
        self.value(Reg::Pred, "or.pred", &format!("{p}, {q}"))
    }
    fn and(&mut self, p: &String, q: &String) -> String {
        self.value(Reg::Pred, "and.pred", &format!("{p}, {q}"))
    }
    fn select(&mut self, p: &String, on_true: &String, on_false: &String) -> String {
        self.value(Reg::F64, "selp.f64", &format!("{on_true}, {on_false}, {p}"))
    }
}
