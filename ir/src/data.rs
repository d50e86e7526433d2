//! `HostTensor`: a tensor's type and data on the client side, and its printed form.

use crate::TensorType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A tensor's data on the host, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTensor {
    /// Its type.
    pub ty: TensorType,
    /// `ty.shape.numel()` elements (on the wire: raw bytes, see [`f32_bytes`]).
    #[serde(with = "f32_bytes")]
    pub data: Vec<f32>,
}

/// Tensor data in serialized messages as one byte string of little-endian `f32`s (a
/// msgpack `bin`), not an array of numbers: encoding and decoding are copies, so a read or an
/// upload moves hundreds of MB/s more than element-by-element encoding did.
pub mod f32_bytes {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    /// Writes `data` as its little-endian bytes (on a little-endian machine, the memory
    /// itself: no copy).
    pub fn serialize<S: Serializer>(data: &[f32], s: S) -> Result<S::Ok, S::Error> {
        if cfg!(target_endian = "little") {
            return s.serialize_bytes(bytemuck::cast_slice(data));
        }
        let mut bytes = Vec::with_capacity(data.len() * 4);
        for x in data {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        s.serialize_bytes(&bytes)
    }

    /// Reads little-endian bytes back; a length that is not a multiple of 4 is an error.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        struct Floats;
        impl Visitor<'_> for Floats {
            type Value = Vec<f32>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("little-endian f32 bytes")
            }
            fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Vec<f32>, E> {
                if !b.len().is_multiple_of(4) {
                    return Err(E::invalid_length(b.len(), &self));
                }
                if cfg!(target_endian = "little") {
                    // One copy into aligned memory (the bytes may sit at any address).
                    let mut out = vec![0f32; b.len() / 4];
                    bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(b);
                    return Ok(out);
                }
                Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<Vec<f32>, E> {
                self.visit_bytes(&b)
            }
        }
        d.deserialize_bytes(Floats)
    }
}

/// Above this many elements, printing shows the first and last [`EDGE_ITEMS`] of each axis.
pub const SUMMARY_THRESHOLD: usize = 1000;
/// Items shown at each end of a summarised axis.
pub const EDGE_ITEMS: usize = 3;

/// Formats one element: 4 decimals at most, trailing zeros trimmed, `-0` as `0`.
pub fn format_element(x: f32) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let ax = x.abs();
    let s = if ax != 0.0 && !(1e-4..1e16).contains(&ax) { format!("{x:.4e}") } else { format!("{x:.4}") };
    let s = trim_zeros(&s);
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

fn trim_zeros(s: &str) -> String {
    let (mantissa, exp) = match s.find('e') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let m = if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
    format!("{m}{exp}")
}

impl HostTensor {
    /// A tensor from its type and data (the caller keeps `data.len() == numel`).
    pub fn new(ty: TensorType, data: Vec<f32>) -> HostTensor {
        HostTensor { ty, data }
    }

    /// The values as nested brackets, NumPy style, summarised when large.
    pub fn format_values(&self) -> String {
        let dims = self.ty.shape.dims();
        // An empty tensor prints as `[]` (its type says the shape): nesting brackets for each
        // row of an `f32[1073741824, 0]` would print a billion of them.
        if self.ty.shape.numel() == 0 {
            return "[]".into();
        }
        let summarise = self.data.len() > SUMMARY_THRESHOLD;
        let mut out = String::new();
        self.format_axis(&mut out, dims, 0, summarise);
        out
    }

    fn format_axis(&self, out: &mut String, dims: &[usize], offset: usize, summarise: bool) {
        if dims.is_empty() {
            out.push_str(&format_element(self.data.get(offset).copied().unwrap_or(f32::NAN)));
            return;
        }
        let n = dims[0];
        let stride: usize = dims[1..].iter().product();
        out.push('[');
        let mut first = true;
        let mut push_item = |out: &mut String, i: usize| {
            if !first {
                out.push_str(", ");
            }
            first = false;
            self.format_axis(out, &dims[1..], offset + i * stride, summarise);
        };
        if summarise && n > 2 * EDGE_ITEMS {
            for i in 0..EDGE_ITEMS {
                push_item(out, i);
            }
            out.push_str(", ...");
            for i in n - EDGE_ITEMS..n {
                push_item(out, i);
            }
        } else {
            for i in 0..n {
                push_item(out, i);
            }
        }
        out.push(']');
    }
}

impl fmt::Display for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.ty, self.format_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printing is bounded by what it prints: an empty tensor with a billion rows is `[]`
    /// (it took 31 s and 4.2 GB as a billion `[]`s).
    #[test]
    fn an_empty_tensor_prints_at_once_whatever_its_dims() {
        let t = HostTensor::new(TensorType::f32(vec![1 << 30, 0]), Vec::new());
        assert_eq!(t.to_string(), "f32[1073741824, 0] []");
    }
}
