//! An instruction's structure hash: its op, attributes and types with every value id erased
//! and a literal's data left out, so that the iterations of a loop, which name fresh values,
//! hash alike (the `hotpath` pass's tokens, a profile row's `hash`).
//!
//! Computed by walking the instruction's `Serialize` impl with a serializer that folds each
//! field into the hash as it goes: nothing is cloned or encoded first, so it follows every
//! op of the table without a list of its own, and it costs tens of nanoseconds, not the
//! hundred or more of a msgpack encoding. The mix is fixed here (not std's hasher, which may
//! change between releases), so a hash is the same in every process and every run of one
//! build; field order is the IR's, so changing an instruction may change its hashes.

use crate::instr::Instr;
use serde::ser::{self, Serialize};
use std::fmt;

/// `instr`'s structure hash, continued over `extra` (e.g. its operand types).
pub fn structure_hash(instr: &Instr, extra: &[u8]) -> u64 {
    let mut h = Hasher { state: SEED, skip_data: false };
    // Our serializer never fails; a failure would only make the hash less specific.
    let _ = instr.serialize(&mut h);
    h.bytes(extra);
    h.finish()
}

const SEED: u64 = 0x243f_6a88_85a3_08d3;
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// The serializer: a running 64-bit state, each word folded in by xor, multiply and rotate.
struct Hasher {
    state: u64,
    /// Inside `Instr::Literal`: its `data` field is an input, not structure (and hashing
    /// megabytes of it would be slow).
    skip_data: bool,
}

impl Hasher {
    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w).wrapping_mul(MUL).rotate_left(29);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.word(b.len() as u64);
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.word(u64::from_le_bytes(tail));
    }

    fn finish(&self) -> u64 {
        // A final avalanche (splitmix64's), so that nearby states give unrelated hashes.
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Never produced: the hasher takes every value serde can give it.
#[derive(Debug)]
struct Never;

impl fmt::Display for Never {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("structure hash")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: fmt::Display>(_: T) -> Never {
        Never
    }
}

// Tags keep differently shaped values apart (a `None` from a `0`, a sequence's end from its
// next element).
const TAG_NONE: u64 = 1;
const TAG_SOME: u64 = 2;
const TAG_UNIT: u64 = 3;
const TAG_VALUE: u64 = 4;
const TAG_END: u64 = 5;

impl ser::Serializer for &mut Hasher {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), Never> {
        self.word(u64::from(v));
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Never> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Never> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Never> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Never> {
        self.word(v as u64);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Never> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Never> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Never> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Never> {
        self.word(v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Never> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Never> {
        self.word(v.to_bits());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.bytes(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Never> {
        self.bytes(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Never> {
        self.word(TAG_NONE);
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Never> {
        self.word(TAG_SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Never> {
        self.word(TAG_UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Never> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, index: u32, _: &'static str) -> Result<(), Never> {
        self.serialize_u32(index)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, name: &'static str, value: &T) -> Result<(), Never> {
        // Every value id is the same: iterations name fresh values.
        if name == "ValueId" {
            self.word(TAG_VALUE);
            return Ok(());
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), Never> {
        self.word(u64::from(index));
        value.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_tuple_variant(self, _: &'static str, index: u32, _: &'static str, _: usize) -> Result<Self, Never> {
        self.word(u64::from(index));
        Ok(self)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self, Never> {
        self.skip_data = name == "Instr" && variant == "Literal";
        self.word(u64::from(index));
        Ok(self)
    }
}

/// Each element is tagged, so `[[a], [b]]` and `[[a, b]]` differ.
macro_rules! compound {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for &mut Hasher {
            type Ok = ();
            type Error = Never;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Never> {
                self.word(TAG_SOME);
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Never> {
                self.word(TAG_END);
                Ok(())
            }
        }
    )*};
}

compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut Hasher {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Never> {
        self.word(TAG_SOME);
        key.serialize(&mut **self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.word(TAG_END);
        Ok(())
    }
}

/// Fields go in declaration order, so their names are left out.
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for &mut Hasher {
            type Ok = ();
            type Error = Never;
            fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result<(), Never> {
                if self.skip_data && key == "data" {
                    return Ok(());
                }
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Never> {
                self.word(TAG_END);
                Ok(())
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Elements;
    use crate::{DType, ReduceOp, TensorType, UnaryOp, ValueId};

    fn v(n: u32) -> ValueId {
        ValueId(n)
    }

    fn ty(shape: &[usize]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    fn hash(i: &Instr) -> u64 {
        structure_hash(i, &[])
    }

    #[test]
    fn value_ids_are_erased_and_everything_else_counts() {
        let relu = |d, s| Instr::Unary { op: UnaryOp::Relu, dst: v(d), src: v(s) };
        assert_eq!(hash(&relu(5, 4)), hash(&relu(105, 104)));
        assert_ne!(hash(&relu(5, 4)), hash(&Instr::Unary { op: UnaryOp::Neg, dst: v(5), src: v(4) }));
        let sum =
            |axes: Option<Vec<i64>>, keepdim| Instr::Reduce { op: ReduceOp::Sum, dst: v(2), src: v(1), axes, keepdim };
        let hashes = [
            hash(&sum(None, false)),
            hash(&sum(Some(vec![]), false)),
            hash(&sum(Some(vec![0]), false)),
            hash(&sum(Some(vec![1]), false)),
            hash(&sum(Some(vec![0, 1]), false)),
            hash(&sum(None, true)),
        ];
        for (a, x) in hashes.iter().enumerate() {
            for y in &hashes[a + 1..] {
                assert_ne!(x, y, "{hashes:?}");
            }
        }
        assert_ne!(
            hash(&Instr::Zeros { dst: v(1), ty: ty(&[2, 3]) }),
            hash(&Instr::Zeros { dst: v(1), ty: ty(&[3, 2]) })
        );
        assert_ne!(hash(&relu(5, 4)), structure_hash(&relu(5, 4), b"f32[2];"));
    }

    #[test]
    fn a_literal_hashes_by_its_type_not_its_data() {
        let lit = |x: f32, shape: &[usize]| Instr::Literal {
            dst: v(1),
            ty: ty(shape),
            data: Elements::F32(vec![x; shape.iter().product()]),
        };
        assert_eq!(hash(&lit(1.0, &[4])), hash(&lit(2.0, &[4])));
        assert_ne!(hash(&lit(1.0, &[4])), hash(&lit(1.0, &[2, 2])));
        assert_ne!(hash(&lit(1.0, &[4])), hash(&Instr::Zeros { dst: v(1), ty: ty(&[4]) }));
    }
}
