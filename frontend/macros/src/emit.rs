//! An `Instr` value as Rust tokens that build it again (every variant and field type), with
//! the numbers that are `{expr}` holes replaced by the holes' run-time values.

use crate::text::{hole_of, Hole};
use gt_ir::data::Elements;
use gt_ir::{CollectiveOp, DType, Instr, Operand, Placement, Shape, SliceItem, SplitSpec, TensorType, ValueId};
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};

/// The Rust type a hole is converted to (with `as`), set by the field it stands in.
#[derive(Clone, Copy)]
pub(crate) enum HoleType {
    F64,
    F32,
    I64,
    U64,
    Usize,
}

impl HoleType {
    fn tokens(self, span: Span) -> TokenStream {
        match self {
            HoleType::F64 => quote_spanned!(span=> f64),
            HoleType::F32 => quote_spanned!(span=> f32),
            HoleType::I64 => quote_spanned!(span=> i64),
            HoleType::U64 => quote_spanned!(span=> u64),
            HoleType::Usize => quote_spanned!(span=> usize),
        }
    }
}

/// Builds an instruction's tokens; collects which holes it read and at which type.
pub(crate) struct Emitter<'a> {
    holes: &'a [Hole],
    /// The type each hole is used at, once found.
    pub(crate) used: Vec<Option<HoleType>>,
}

/// The local that holds hole `k`'s value (hygienic: invisible to the caller's code).
fn hole_ident(k: usize) -> Ident {
    format_ident!("__gt_hole{}", k, span = Span::mixed_site())
}

impl<'a> Emitter<'a> {
    /// An emitter for an invocation with these holes (none for plain `.gtir`).
    pub(crate) fn new(holes: &'a [Hole]) -> Emitter<'a> {
        Emitter { holes, used: vec![None; holes.len()] }
    }

    /// `let __gt_holeK = {expr} as T;` for each hole the emitted instructions read since
    /// the last call, and those holes.
    pub(crate) fn take_hole_lets(&mut self) -> (TokenStream, Vec<usize>) {
        let mut out = TokenStream::new();
        let mut taken = Vec::new();
        for (k, ty) in self.used.iter_mut().enumerate() {
            if let Some(t) = ty.take() {
                taken.push(k);
                let group = &self.holes[k].group;
                let span = group.span();
                let (id, ty) = (hole_ident(k), t.tokens(span));
                let value = quote_spanned!(span=> #group as #ty);
                out.extend(quote! {
                    #[allow(clippy::unnecessary_cast)]
                    let #id: #ty = #value;
                });
            }
        }
        (out, taken)
    }

    /// The hole an integer-valued number is, if it is one.
    fn hole(&mut self, v: i128, ty: HoleType) -> Option<TokenStream> {
        let (k, neg) = hole_of(v, self.holes.len())?;
        self.used[k] = Some(ty);
        let id = hole_ident(k);
        Some(if neg { quote!((-#id)) } else { quote!(#id) })
    }

    fn float_hole(&mut self, v: f64, ty: HoleType) -> Option<TokenStream> {
        (v.is_finite() && v.fract() == 0.0 && v.abs() < 1e30).then(|| self.hole(v as i128, ty)).flatten()
    }

    fn f64(&mut self, v: f64) -> TokenStream {
        self.float(v, HoleType::F64, quote!(f64), || Literal::f64_suffixed(v.abs()))
    }

    fn f32(&mut self, v: f32) -> TokenStream {
        // Widening keeps NaN, the infinities and the sign; the literal is the f32 itself.
        self.float(f64::from(v), HoleType::F32, quote!(f32), || Literal::f32_suffixed(v.abs()))
    }

    /// Literal data: `f32` elements may be holes; other dtypes are written out (halves as the
    /// `f32`s they hold exactly, cast back).
    fn elements(&mut self, data: &Elements) -> TokenStream {
        let e = quote!(::gt::ir::data::Elements);
        match data {
            Elements::F32(v) => {
                let v = v.iter().map(|&x| self.f32(x)).collect::<Vec<_>>();
                quote!(#e::F32(::std::vec![#(#v),*]))
            }
            Elements::F64(v) => {
                let v = v.iter().map(|&x| self.f64(x)).collect::<Vec<_>>();
                quote!(#e::F64(::std::vec![#(#v),*]))
            }
            Elements::F16(_) | Elements::BF16(_) => {
                let d = dtype(data.dtype());
                let v = data.to_f32().into_iter().map(|x| self.f32(x)).collect::<Vec<_>>();
                quote!(#e::F32(::std::vec![#(#v),*]).cast(#d))
            }
            Elements::I64(v) => {
                let v = v.iter().map(|&x| Literal::i64_suffixed(x));
                quote!(#e::I64(::std::vec![#(#v),*]))
            }
            Elements::I32(v) => {
                let v = v.iter().map(|&x| Literal::i32_suffixed(x));
                quote!(#e::I32(::std::vec![#(#v),*]))
            }
            Elements::Bool(v) => quote!(#e::Bool(::std::vec![#(#v),*])),
        }
    }

    /// A float of primitive type `prim`: a hole, a special value by name, or `lit` (the
    /// magnitude, made only for finite values: a literal cannot be NaN or infinite).
    fn float(&mut self, v: f64, ty: HoleType, prim: TokenStream, lit: impl FnOnce() -> Literal) -> TokenStream {
        if let Some(h) = self.float_hole(v, ty) {
            return h;
        }
        if v.is_nan() {
            quote!(::core::primitive::#prim::NAN)
        } else if v.is_infinite() {
            if v > 0.0 {
                quote!(::core::primitive::#prim::INFINITY)
            } else {
                quote!(::core::primitive::#prim::NEG_INFINITY)
            }
        } else {
            let lit = lit();
            if v.is_sign_negative() {
                quote!((-#lit))
            } else {
                quote!(#lit)
            }
        }
    }

    fn i64(&mut self, v: i64) -> TokenStream {
        if let Some(h) = self.hole(i128::from(v), HoleType::I64) {
            return h;
        }
        if v == i64::MIN {
            quote!(::core::primitive::i64::MIN)
        } else if v < 0 {
            let lit = Literal::i64_suffixed(-v);
            quote!((-#lit))
        } else {
            Literal::i64_suffixed(v).into_token_stream()
        }
    }

    fn u64(&mut self, v: u64) -> TokenStream {
        match self.hole(i128::from(v), HoleType::U64) {
            Some(h) => h,
            None => Literal::u64_suffixed(v).into_token_stream(),
        }
    }

    fn usize(&mut self, v: usize) -> TokenStream {
        match self.hole(v as i128, HoleType::Usize) {
            Some(h) => h,
            None => Literal::usize_suffixed(v).into_token_stream(),
        }
    }

    fn i64s(&mut self, v: &[i64]) -> TokenStream {
        let items = v.iter().map(|&x| self.i64(x)).collect::<Vec<_>>();
        quote!(::std::vec![#(#items),*])
    }

    fn usizes(&mut self, v: &[usize]) -> TokenStream {
        let items = v.iter().map(|&x| self.usize(x)).collect::<Vec<_>>();
        quote!(::std::vec![#(#items),*])
    }

    fn opt_i64s(&mut self, v: &Option<Vec<i64>>) -> TokenStream {
        match v {
            Some(v) => {
                let v = self.i64s(v);
                quote!(::core::option::Option::Some(#v))
            }
            None => quote!(::core::option::Option::None),
        }
    }

    fn opt_i64(&mut self, v: Option<i64>) -> TokenStream {
        match v {
            Some(v) => {
                let v = self.i64(v);
                quote!(::core::option::Option::Some(#v))
            }
            None => quote!(::core::option::Option::None),
        }
    }

    fn ty(&mut self, t: &TensorType) -> TokenStream {
        let dtype = dtype(t.dtype);
        let Shape(dims) = &t.shape;
        let dims = self.usizes(dims);
        quote!(::gt::ir::TensorType { dtype: #dtype, shape: ::gt::ir::Shape::new(#dims) })
    }

    fn operand(&mut self, o: &Operand) -> TokenStream {
        match o {
            Operand::Value(v) => {
                let v = value(*v);
                quote!(::gt::ir::Operand::Value(#v))
            }
            Operand::Scalar(s) => {
                let s = self.f64(*s);
                quote!(::gt::ir::Operand::Scalar(#s))
            }
        }
    }

    fn slice_item(&mut self, item: &SliceItem) -> TokenStream {
        match *item {
            SliceItem::Range { start, end, step } => {
                let (start, end, step) = (self.opt_i64(start), self.opt_i64(end), self.i64(step));
                quote!(::gt::ir::SliceItem::Range { start: #start, end: #end, step: #step })
            }
            SliceItem::Index(i) => {
                let i = self.i64(i);
                quote!(::gt::ir::SliceItem::Index(#i))
            }
            SliceItem::NewAxis => quote!(::gt::ir::SliceItem::NewAxis),
            SliceItem::Ellipsis => quote!(::gt::ir::SliceItem::Ellipsis),
        }
    }

    fn split_spec(&mut self, spec: &SplitSpec) -> TokenStream {
        match spec {
            SplitSpec::Size(n) => {
                let n = self.usize(*n);
                quote!(::gt::ir::SplitSpec::Size(#n))
            }
            SplitSpec::Sizes(v) => {
                let v = self.usizes(v);
                quote!(::gt::ir::SplitSpec::Sizes(#v))
            }
            SplitSpec::Chunks(n) => {
                let n = self.usize(*n);
                quote!(::gt::ir::SplitSpec::Chunks(#n))
            }
        }
    }

    /// Tokens of an expression of type `::gt::ir::Instr` equal to `instr` (holes aside).
    pub(crate) fn instr(&mut self, instr: &Instr) -> TokenStream {
        match instr {
            Instr::Randn { dst, ty, seed } | Instr::Rand { dst, ty, seed } => {
                let variant = if matches!(instr, Instr::Randn { .. }) { quote!(Randn) } else { quote!(Rand) };
                let (dst, ty, seed) = (value(*dst), self.ty(ty), self.u64(*seed));
                quote!(::gt::ir::Instr::#variant { dst: #dst, ty: #ty, seed: #seed })
            }
            Instr::Zeros { dst, ty } | Instr::Ones { dst, ty } => {
                let variant = if matches!(instr, Instr::Zeros { .. }) { quote!(Zeros) } else { quote!(Ones) };
                let (dst, ty) = (value(*dst), self.ty(ty));
                quote!(::gt::ir::Instr::#variant { dst: #dst, ty: #ty })
            }
            Instr::Full { dst, ty, value: v } => {
                let (dst, ty, v) = (value(*dst), self.ty(ty), self.f64(*v));
                quote!(::gt::ir::Instr::Full { dst: #dst, ty: #ty, value: #v })
            }
            Instr::Arange { dst, dtype: d, start, end, step } => {
                let (dst, d) = (value(*dst), dtype(*d));
                let (start, end, step) = (self.f64(*start), self.f64(*end), self.f64(*step));
                quote!(::gt::ir::Instr::Arange { dst: #dst, dtype: #d, start: #start, end: #end, step: #step })
            }
            Instr::Literal { dst, ty, data } => {
                let (dst, ty) = (value(*dst), self.ty(ty));
                let data = self.elements(data);
                quote!(::gt::ir::Instr::Literal { dst: #dst, ty: #ty, data: #data })
            }
            Instr::Cast { dst, src, dtype: d } => {
                let (dst, src, d) = (value(*dst), value(*src), dtype(*d));
                quote!(::gt::ir::Instr::Cast { dst: #dst, src: #src, dtype: #d })
            }
            Instr::Unary { dst, op, src } => {
                let (dst, src, op) = (value(*dst), value(*src), variant(op));
                quote!(::gt::ir::Instr::Unary { dst: #dst, op: ::gt::ir::UnaryOp::#op, src: #src })
            }
            Instr::Binary { dst, op, lhs, rhs } => {
                let (dst, op, lhs, rhs) = (value(*dst), variant(op), self.operand(lhs), self.operand(rhs));
                quote!(::gt::ir::Instr::Binary { dst: #dst, op: ::gt::ir::BinaryOp::#op, lhs: #lhs, rhs: #rhs })
            }
            Instr::Where { dst, cond, on_true, on_false } => {
                let (dst, cond) = (value(*dst), value(*cond));
                let (t, f) = (self.operand(on_true), self.operand(on_false));
                quote!(::gt::ir::Instr::Where { dst: #dst, cond: #cond, on_true: #t, on_false: #f })
            }
            Instr::MatMul { dst, lhs, rhs } => {
                let (dst, lhs, rhs) = (value(*dst), value(*lhs), value(*rhs));
                quote!(::gt::ir::Instr::MatMul { dst: #dst, lhs: #lhs, rhs: #rhs })
            }
            Instr::Reduce { dst, op, src, axes, keepdim } => {
                let (dst, op, src, axes) = (value(*dst), variant(op), value(*src), self.opt_i64s(axes));
                quote!(::gt::ir::Instr::Reduce {
                    dst: #dst, op: ::gt::ir::ReduceOp::#op, src: #src, axes: #axes, keepdim: #keepdim
                })
            }
            Instr::Transpose { dst, src, dim0, dim1 } => {
                let (dst, src, dim0, dim1) = (value(*dst), value(*src), self.i64(*dim0), self.i64(*dim1));
                quote!(::gt::ir::Instr::Transpose { dst: #dst, src: #src, dim0: #dim0, dim1: #dim1 })
            }
            Instr::Permute { dst, src, perm } => {
                let (dst, src, perm) = (value(*dst), value(*src), self.i64s(perm));
                quote!(::gt::ir::Instr::Permute { dst: #dst, src: #src, perm: #perm })
            }
            Instr::Reshape { dst, src, shape } => {
                let (dst, src, shape) = (value(*dst), value(*src), self.i64s(shape));
                quote!(::gt::ir::Instr::Reshape { dst: #dst, src: #src, shape: #shape })
            }
            Instr::Squeeze { dst, src, axes } => {
                let (dst, src, axes) = (value(*dst), value(*src), self.opt_i64s(axes));
                quote!(::gt::ir::Instr::Squeeze { dst: #dst, src: #src, axes: #axes })
            }
            Instr::Unsqueeze { dst, src, axis } => {
                let (dst, src, axis) = (value(*dst), value(*src), self.i64(*axis));
                quote!(::gt::ir::Instr::Unsqueeze { dst: #dst, src: #src, axis: #axis })
            }
            Instr::BroadcastTo { dst, src, shape } => {
                let (dst, src, shape) = (value(*dst), value(*src), self.usizes(shape));
                quote!(::gt::ir::Instr::BroadcastTo { dst: #dst, src: #src, shape: #shape })
            }
            Instr::Concat { dst, srcs, axis } => {
                let (dst, srcs, axis) = (value(*dst), values(srcs), self.i64(*axis));
                quote!(::gt::ir::Instr::Concat { dst: #dst, srcs: #srcs, axis: #axis })
            }
            Instr::Slice { dst, src, index } => {
                let (dst, src) = (value(*dst), value(*src));
                let index = index.iter().map(|i| self.slice_item(i)).collect::<Vec<_>>();
                quote!(::gt::ir::Instr::Slice { dst: #dst, src: #src, index: ::std::vec![#(#index),*] })
            }
            Instr::Split { dsts, src, axis, spec } => {
                let (dsts, src, axis, spec) = (values(dsts), value(*src), self.i64(*axis), self.split_spec(spec));
                quote!(::gt::ir::Instr::Split { dsts: #dsts, src: #src, axis: #axis, spec: #spec })
            }
            Instr::Fused { dst, ty, srcs, kernel } => {
                let (dst, ty, srcs) = (value(*dst), self.ty(ty), values(srcs));
                // The kernel's text form parses back to the same kernel (a gt-ir invariant).
                let text = kernel.to_string();
                quote!(::gt::ir::Instr::Fused {
                    dst: #dst,
                    ty: #ty,
                    srcs: #srcs,
                    kernel: ::std::boxed::Box::new(
                        ::gt::ir::kernel::text::parse(#text).expect("a printed kernel parses back")
                    ),
                })
            }
            Instr::Collective { dsts, op, srcs } => {
                let (dsts, srcs) = (values(dsts), values(srcs));
                let op = match op {
                    CollectiveOp::AllReduce(r) => {
                        let r = variant(r);
                        quote!(::gt::ir::CollectiveOp::AllReduce(::gt::ir::ReduceOp::#r))
                    }
                    CollectiveOp::AllGather { axis } => {
                        let axis = self.i64(*axis);
                        quote!(::gt::ir::CollectiveOp::AllGather { axis: #axis })
                    }
                    CollectiveOp::ReduceScatter { op, axis } => {
                        let (r, axis) = (variant(op), self.i64(*axis));
                        quote!(::gt::ir::CollectiveOp::ReduceScatter { op: ::gt::ir::ReduceOp::#r, axis: #axis })
                    }
                    CollectiveOp::Broadcast => quote!(::gt::ir::CollectiveOp::Broadcast),
                    CollectiveOp::Move => quote!(::gt::ir::CollectiveOp::Move),
                };
                quote!(::gt::ir::Instr::Collective { dsts: #dsts, op: #op, srcs: #srcs })
            }
            Instr::Free { src } => {
                let src = value(*src);
                quote!(::gt::ir::Instr::Free { src: #src })
            }
            Instr::GetData { src } => {
                let src = value(*src);
                quote!(::gt::ir::Instr::GetData { src: #src })
            }
            Instr::HotPathStart { id } => {
                let id = Literal::u64_suffixed(*id);
                quote!(::gt::ir::Instr::HotPathStart { id: #id })
            }
            Instr::HotPathEnd { id } => {
                let id = Literal::u64_suffixed(*id);
                quote!(::gt::ir::Instr::HotPathEnd { id: #id })
            }
            Instr::SignalStart { name, compile, backward, place } => {
                let place = match place {
                    None => quote!(::std::option::Option::None),
                    Some(Placement::Split { axis, workers }) => {
                        let axis = self.i64(*axis);
                        quote!(::std::option::Option::Some(::gt::ir::Placement::Split { axis: #axis, workers: ::std::vec![#(#workers),*] }))
                    }
                    Some(Placement::Replicated { workers }) => {
                        quote!(::std::option::Option::Some(::gt::ir::Placement::Replicated {
                            workers: ::std::vec![#(#workers),*]
                        }))
                    }
                };
                quote!(::gt::ir::Instr::SignalStart { name: ::std::string::String::from(#name), compile: #compile, backward: #backward, place: #place })
            }
            Instr::SignalEnd { name } => {
                quote!(::gt::ir::Instr::SignalEnd { name: ::std::string::String::from(#name) })
            }
        }
    }
}

fn value(v: ValueId) -> TokenStream {
    let n = Literal::u32_suffixed(v.0);
    quote!(::gt::ir::ValueId(#n))
}

fn values(vs: &[ValueId]) -> TokenStream {
    let items = vs.iter().map(|&v| value(v));
    quote!(::std::vec![#(#items),*])
}

/// An enum value's variant name (op tables and dtypes derive `Debug` as their variant name).
fn variant(v: &impl std::fmt::Debug) -> Ident {
    Ident::new(&format!("{v:?}"), Span::call_site())
}

fn dtype(d: DType) -> TokenStream {
    let v = variant(&d);
    quote!(::gt::ir::DType::#v)
}
