//! The codec: a 4-byte header (`G`, `T`, protocol version as big-endian u16) followed by
//! the message in msgpack (`rmp-serde`, structs as arrays). Decoding checks the size limit
//! before anything else, then the header, so garbage, an old peer and an oversized frame
//! each get their own error.

use gt_ir::data::Elements;
use gt_ir::Instr;
use serde::de::{Deserialize, DeserializeOwned};
use serde::Serialize;
use thiserror::Error;

/// The protocol version this build speaks. Bump it on any change to [`crate::message`], and
/// on any change to how workers talk to each other (`gt_runtime::collective`'s wire): workers
/// of two builds then cannot register with one dispatcher, so they never meet in a collective.
/// (17: a client's `Hello` names its doorbell, a batch may carry a sync to ring it, `Done` says
/// whether it rang; a client's batch may end with its sync point. 18: `Hello` and `Register`
/// offer a lane.)
pub const PROTOCOL_VERSION: u16 = 19;

/// The default largest frame accepted (1 GiB; `GT_MAX_MESSAGE_BYTES` changes it).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1 << 30;

const MAGIC: [u8; 2] = *b"GT";
const HEADER_LEN: usize = 4;

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// The frame is larger than the limit.
    #[error("message of {size} bytes is over the limit of {max} bytes (GT_MAX_MESSAGE_BYTES)")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The frame does not start with gt's header.
    #[error("not a gt message (the frame does not start with the `GT` header)")]
    NotGt,
    /// The peer speaks another protocol version.
    #[error("peer speaks gt protocol version {found}, this build speaks {expected}")]
    Version {
        /// The peer's version.
        found: u16,
        /// Ours.
        expected: u16,
    },
    /// The body is not a valid message (bad msgpack, unknown message kind, wrong fields).
    #[error("malformed message: {0}")]
    Malformed(#[source] rmp_serde::decode::Error),
    /// A valid message followed by more bytes.
    #[error("malformed message: {extra} bytes after the message")]
    Trailing {
        /// The bytes left over.
        extra: usize,
    },
    /// A data frame whose length is not the value's.
    #[error("a data frame of {got} bytes for a {ty} value ({expected} bytes)")]
    DataLength {
        /// The value's type.
        ty: gt_ir::TensorType,
        /// Its bytes.
        expected: usize,
        /// The frame's.
        got: usize,
    },
    /// A data frame that is not elements of its dtype (a `bool` byte other than 0 or 1).
    #[error("a data frame that is not its dtype's elements: {0}")]
    Elements(gt_ir::data::BytesError),
    /// A `Data` message without its data frame, or another message with one.
    #[error("malformed message: {0}")]
    Frames(&'static str),
    /// A message's literal frames do not match the literals it leaves empty.
    #[error("malformed message: {literals} literals wait for their data frame, and {frames} frames came (at most {MAX_LITERAL_FRAMES} a message)")]
    LiteralFrames {
        /// The literals left empty for a frame.
        literals: usize,
        /// The frames after the message.
        frames: usize,
    },
    /// A message that serde could not write (none of gt's messages).
    #[error("cannot encode the message: {0}")]
    Encode(#[source] rmp_serde::encode::Error),
}

/// Encodes a message with the header. Fails only if the result would be over `max`.
pub fn encode<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, CodecError> {
    encode_sized(msg, max, 0)
}

/// [`encode`] into a buffer made for `data` bytes of literal data besides the message's own
/// few: a batch carrying a large literal is written once, not grown (and copied) by doublings.
pub fn encode_sized<T: Serialize>(msg: &T, max: usize, data: usize) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::with_capacity(data.min(max).saturating_add(256));
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    // Writing into a Vec cannot fail for I/O reasons; serde errors (none for our types) are
    // reported rather than unwrapped.
    rmp_serde::encode::write(&mut buf, msg).map_err(CodecError::Encode)?;
    if buf.len() > max {
        return Err(CodecError::TooLarge { size: buf.len(), max });
    }
    Ok(buf)
}

/// The bytes `msg` would take in a frame (header included), counted without keeping them:
/// the size logs report for a message handed over by a lane, never encoded.
pub fn encoded_len<T: Serialize>(msg: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(HEADER_LEN);
    // (Counting cannot fail for I/O reasons, and gt's messages always serialize.)
    let _ = rmp_serde::encode::write(&mut count, msg);
    count.0
}

/// Literals with at least this many bytes of data travel as frames of their own after
/// their message ([`detach_literals`]), lent so that a receiver in the same process takes
/// them without a copy ([`crate::loan`]); smaller ones travel inside it.
pub const DETACHED_LITERAL_BYTES: usize = 16 << 10;

/// The most literal frames one message carries: a sender sends its batch once it holds this
/// many (with the routing id, the message and one more to notice, see
/// [`crate::socket::MAX_FRAMES`]).
pub const MAX_LITERAL_FRAMES: usize = 16;

/// Whether `instr` is a literal whose data travels as a frame of its own: large, and of its
/// type's dtype and length (one that is not stays inside, where the checks name it).
pub fn is_detached_literal(instr: &Instr) -> bool {
    matches!(instr, Instr::Literal { ty, data, .. }
        if data.dtype() == ty.dtype
            && data.len() == ty.shape.numel()
            && data.size_bytes() >= DETACHED_LITERAL_BYTES)
}

/// Takes the data of `instrs`' large literals out, in order, leaving each empty (of its
/// dtype): the frames to send after the message that carries them.
pub fn detach_literals(instrs: &mut [Instr]) -> Vec<Elements> {
    let mut frames = Vec::new();
    for instr in instrs.iter_mut() {
        if is_detached_literal(instr) {
            if let Instr::Literal { data, .. } = instr {
                let empty = Elements::zeros(data.dtype(), 0);
                frames.push(std::mem::replace(data, empty));
            }
        }
    }
    frames
}

/// Puts `frames` back into the literals [`detach_literals`] emptied (those with no data and
/// a type that has elements), in order: a frame lent from this process is taken as it is,
/// another is copied. The frames must match those literals one for one.
pub fn attach_literals(instrs: &mut [Instr], frames: Vec<zmq::Message>) -> Result<(), CodecError> {
    let waiting = |i: &Instr| matches!(i, Instr::Literal { ty, data, .. } if data.is_empty() && data.dtype() == ty.dtype && ty.shape.numel() > 0);
    let literals = instrs.iter().filter(|i| waiting(i)).count();
    if literals != frames.len() || frames.len() > MAX_LITERAL_FRAMES {
        return Err(CodecError::LiteralFrames { literals, frames: frames.len() });
    }
    let mut frames = frames.into_iter();
    for instr in instrs.iter_mut().filter(|i| waiting(i)) {
        let (Instr::Literal { ty, data, .. }, Some(frame)) = (instr, frames.next()) else { continue };
        if frame.len() != ty.size_bytes() {
            return Err(CodecError::DataLength { ty: ty.clone(), expected: ty.size_bytes(), got: frame.len() });
        }
        *data = match crate::loan::take(frame, ty.dtype) {
            Ok(lent) => lent,
            Err(frame) => Elements::from_le_bytes(ty.dtype, &frame).map_err(CodecError::Elements)?,
        };
    }
    Ok(())
}

/// Decodes a frame: size, header, then body. Never panics on any input.
pub fn decode<T: DeserializeOwned>(frame: &[u8], max: usize) -> Result<T, CodecError> {
    if frame.len() > max {
        return Err(CodecError::TooLarge { size: frame.len(), max });
    }
    if frame.len() < HEADER_LEN || frame[..2] != MAGIC {
        return Err(CodecError::NotGt);
    }
    let version = u16::from_be_bytes([frame[2], frame[3]]);
    if version != PROTOCOL_VERSION {
        return Err(CodecError::Version { found: version, expected: PROTOCOL_VERSION });
    }
    let body = &frame[HEADER_LEN..];
    // Read in place: byte strings (literal data) are handed out borrowed and copied once,
    // where a reading decoder first copies them into a buffer it grows by doublings.
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let msg = T::deserialize(&mut de).map_err(CodecError::Malformed)?;
    match serde::de::IgnoredAny::deserialize(&mut de) {
        Err(rmp_serde::decode::Error::InvalidMarkerRead(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(msg),
        // Something follows the message: skip one message again with a decoder that says
        // where it stopped, to count the bytes left over (only ever on this error path).
        _ => {
            let mut rest = body;
            let skipped = serde::de::IgnoredAny::deserialize(&mut rmp_serde::Deserializer::new(&mut rest));
            skipped.map_err(CodecError::Malformed)?;
            Err(CodecError::Trailing { extra: rest.len() })
        }
    }
}

/// The data frame of a `Data` message: the elements' little-endian bytes (on a
/// little-endian machine, one copy of their memory), handed to ZeroMQ without another copy.
pub fn data_frame(data: &[f32]) -> zmq::Message {
    zmq::Message::from(le_bytes(data))
}

/// The elements' little-endian bytes (on a little-endian machine, one copy of their memory).
pub fn le_bytes(data: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        bytemuck::cast_slice(data).to_vec()
    } else {
        data.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

/// The elements whose little-endian bytes are `bytes` (a trailing partial element is
/// dropped): one copy into aligned memory on a little-endian machine.
pub fn from_le_bytes(bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / 4;
    let mut out = vec![0f32; n];
    if cfg!(target_endian = "little") {
        // The bytes may sit at any address: copied, not cast in place.
        bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(&bytes[..n * 4]);
    } else {
        for (x, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    out
}

/// The elements of a `ty` value's data frame; a frame of another length, or a `bool` byte
/// other than 0 or 1, is an error.
pub fn data_of(frame: &[u8], ty: &gt_ir::TensorType) -> Result<gt_ir::data::Elements, CodecError> {
    let expected = ty.size_bytes();
    if frame.len() != expected {
        return Err(CodecError::DataLength { ty: ty.clone(), expected, got: frame.len() });
    }
    gt_ir::data::Elements::from_le_bytes(ty.dtype, frame).map_err(CodecError::Elements)
}

/// A frame with a valid header but another version, for tests of version handling.
pub fn frame_with_version(version: u16, body: &[u8]) -> Vec<u8> {
    let mut buf = MAGIC.to_vec();
    buf.extend_from_slice(&version.to_be_bytes());
    buf.extend_from_slice(body);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Request;
    use gt_ir::{Instr, TensorType, ValueId};

    #[test]
    fn round_trip() {
        let msg = Request::Batch {
            first_seq: 7,
            instrs: vec![Instr::Zeros { dst: ValueId(3), ty: TensorType::f32(vec![2, 3]) }],
            lines: vec![4],
            then: Some(crate::message::Then::Sync { seq: 8 }),
        };
        let bytes = encode(&msg, DEFAULT_MAX_MESSAGE_BYTES).unwrap();
        assert_eq!(&bytes[..4], &[b'G', b'T', 0, PROTOCOL_VERSION as u8]);
        assert_eq!(decode::<Request>(&bytes, DEFAULT_MAX_MESSAGE_BYTES).unwrap(), msg);
        assert_eq!(encoded_len(&msg), bytes.len());
    }

    #[test]
    fn tensor_data_travels_as_raw_bytes_bit_for_bit() {
        let data = vec![1.5, -0.0, f32::NAN, f32::from_bits(0x7fc0_1234), f32::INFINITY, f32::MIN_POSITIVE / 8.0];
        let ty = TensorType::f32(vec![data.len()]);
        let frame = data_frame(&data);
        assert_eq!(frame.len(), 4 * data.len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&data_of(&frame, &ty).unwrap().to_f32()), bits(&data));
        // A frame of another length is an error naming both, not a panic.
        let e = data_of(&frame[1..], &ty).unwrap_err();
        assert_eq!(e.to_string(), "a data frame of 23 bytes for a f32[6] value (24 bytes)");
        assert!(data_of(&[], &TensorType::f32(vec![0])).unwrap().is_empty());
        // Every dtype: i64 bit for bit, and a bool byte that is not 0 or 1 refused.
        let ints = gt_ir::data::Elements::I64(vec![i64::MIN, -1, 0, i64::MAX]);
        let ty = TensorType::new(gt_ir::DType::I64, vec![4]);
        assert_eq!(data_of(&ints.to_le_bytes(), &ty).unwrap(), ints);
        let e = data_of(&[0, 1, 2], &TensorType::new(gt_ir::DType::Bool, vec![3])).unwrap_err();
        assert_eq!(e.to_string(), "a data frame that is not its dtype's elements: byte 2 is 2, not a bool (0 or 1)");
    }

    #[test]
    fn by_reference_encodes_as_by_value() {
        use crate::message::{Inbound, InboundRef, WorkerEvent};
        let req = Request::Get { seq: 3, value: ValueId(9), read: 0 };
        let ev = WorkerEvent::Failed {
            tag: 1,
            failure: crate::message::Failure::new(crate::message::FailureKind::Type, "x"),
        };
        let max = DEFAULT_MAX_MESSAGE_BYTES;
        assert_eq!(
            encode(&InboundRef::Client(&req), max).unwrap(),
            encode(&Inbound::Client(req.clone()), max).unwrap()
        );
        assert_eq!(encode(&InboundRef::Worker(&ev), max).unwrap(), encode(&Inbound::Worker(ev.clone()), max).unwrap());
    }

    #[test]
    fn errors_are_distinct() {
        let ok = encode(&Request::Bye, 1 << 20).unwrap();
        let size = ok.len();
        assert!(matches!(decode::<Request>(&ok, 2), Err(CodecError::TooLarge { size: s, max: 2 }) if s == size));
        assert!(matches!(decode::<Request>(b"hello world", 1 << 20), Err(CodecError::NotGt)));
        assert!(matches!(decode::<Request>(b"", 1 << 20), Err(CodecError::NotGt)));
        assert!(matches!(
            decode::<Request>(&frame_with_version(99, &ok[4..]), 1 << 20),
            Err(CodecError::Version { found: 99, expected: PROTOCOL_VERSION })
        ));
        assert!(matches!(
            decode::<Request>(&frame_with_version(PROTOCOL_VERSION, b"\xc1"), 1 << 20),
            Err(CodecError::Malformed(_))
        ));
        let mut trailing = ok.clone();
        trailing.push(0);
        let e = decode::<Request>(&trailing, 1 << 20).unwrap_err();
        assert!(matches!(e, CodecError::Trailing { extra: 1 }), "{e}");
        assert_eq!(e.to_string(), "malformed message: 1 bytes after the message");
        assert!(matches!(encode(&Request::Bye, 3), Err(CodecError::TooLarge { size: s, max: 3 }) if s == size));
    }

    #[test]
    fn unknown_kind_is_malformed() {
        // A msgpack map naming a variant that does not exist.
        let body = rmp_serde::to_vec(&std::collections::BTreeMap::from([("Launch", 1u8)])).unwrap();
        let e = decode::<Request>(&frame_with_version(PROTOCOL_VERSION, &body), 1 << 20).unwrap_err();
        assert!(matches!(&e, CodecError::Malformed(_)) && e.to_string().contains("Launch"), "{e}");
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::message::{Inbound, Reply, WorkerCommand};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any body behind a valid header decodes to a message or an error, never a panic.
        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let frame = frame_with_version(PROTOCOL_VERSION, &body);
            let _ = decode::<Inbound>(&frame, 1 << 20);
            let _ = decode::<Reply>(&frame, 1 << 20);
            let _ = decode::<WorkerCommand>(&frame, 1 << 20);
        }

        /// A valid message cut short or with one byte flipped is an error or another valid
        /// message, never a panic.
        #[test]
        fn damaged_messages_never_panic(cut in 0usize..64, flip in 0usize..64, bit in 0u8..8) {
            let msg = Inbound::Client(crate::message::Request::Batch {
                first_seq: 1,
                instrs: vec![gt_ir::Instr::Zeros { dst: gt_ir::ValueId(1), ty: gt_ir::TensorType::f32(vec![2, 3]) }],
                lines: Vec::new(),
                then: None,
            });
            let mut frame = encode(&msg, 1 << 20).unwrap();
            let n = frame.len();
            frame[flip % n] ^= 1 << bit;
            frame.truncate(n - cut % n);
            let _ = decode::<Inbound>(&frame, 1 << 20);
        }
    }
}
