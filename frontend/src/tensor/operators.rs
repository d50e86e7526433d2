//! Operator sugar: `+ - * /` and unary `-` on tensors and scalars, by value and by
//! reference, and the compound assignments. Rust operators cannot return a `Result` without
//! making every expression `(a + b)?`, so these **panic** with the op's error (a shape
//! mismatch, a closed runtime); the methods (`a.add(&b)?`) return it instead.

use super::{Arg, Tensor};
use gt_ir::BinaryOp;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

fn expect(result: super::Result<Tensor>) -> Tensor {
    result.unwrap_or_else(|e| panic!("{e}"))
}

macro_rules! binary_operators {
    ($($trait:ident $method:ident $op:ident;)*) => {$(
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                expect(super::binary(BinaryOp::$op, Arg::Tensor(self), Arg::Tensor(rhs)))
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                <&Tensor as $trait<&Tensor>>::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                <&Tensor as $trait<&Tensor>>::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                <&Tensor as $trait<&Tensor>>::$method(&self, &rhs)
            }
        }
        binary_operators!(@scalar $trait $method $op f32);
    )*};
    (@scalar $trait:ident $method:ident $op:ident $s:ty) => {
        impl $trait<$s> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: $s) -> Tensor {
                expect(super::binary(BinaryOp::$op, Arg::Tensor(self), Arg::Scalar(rhs as f64)))
            }
        }
        impl $trait<$s> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: $s) -> Tensor {
                <&Tensor as $trait<$s>>::$method(&self, rhs)
            }
        }
        impl $trait<&Tensor> for $s {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                expect(super::binary(BinaryOp::$op, Arg::Scalar(self as f64), Arg::Tensor(rhs)))
            }
        }
        impl $trait<Tensor> for $s {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                <$s as $trait<&Tensor>>::$method(self, &rhs)
            }
        }
    };
}

binary_operators! {
    Add add Add;
    Sub sub Sub;
    Mul mul Mul;
    Div div Div;
}

impl Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        expect(Tensor::neg(self))
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        -&self
    }
}

macro_rules! assign_operators {
    ($($trait:ident $method:ident $inherent:ident;)*) => {$(
        impl $trait<&Tensor> for Tensor {
            fn $method(&mut self, rhs: &Tensor) {
                Tensor::$inherent(self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<Tensor> for Tensor {
            fn $method(&mut self, rhs: Tensor) {
                Tensor::$inherent(self, &rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<f32> for Tensor {
            fn $method(&mut self, rhs: f32) {
                Tensor::$inherent(self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
    )*};
}

assign_operators! {
    AddAssign add_assign add_assign;
    SubAssign sub_assign sub_assign;
    MulAssign mul_assign mul_assign;
    DivAssign div_assign div_assign;
}
