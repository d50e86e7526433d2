//! Data frames that lend their buffer: a typed vector leaves as a ZeroMQ frame without a
//! copy, and a receiver in the same process (over `inproc://`: an embedded cluster's read)
//! takes it back as that vector, again without a copy. Elsewhere the frame is plain bytes.
//!
//! ZeroMQ hands an `inproc://` frame on by pointer, and the dispatcher forwards a read's data
//! frame without opening it, so the frame a client receives is the very buffer the worker
//! filled. A process-wide table knows which buffers are lent, with the vector's layout: a
//! receiver that finds its frame there takes the vector out; ZeroMQ's release of a frame whose
//! vector was taken then frees nothing. A lent frame is only ever moved, never copied
//! (`zmq_msg_copy`), so whoever holds it holds its only reference.
#![allow(unsafe_code)]

use gt_ir::data::Elements;
use gt_ir::DType;
use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use zmq::Socket;

/// A lent vector: the loan's number, its length in bytes, its capacity in elements, and how
/// to free it.
struct Lent {
    loan: usize,
    bytes: usize,
    capacity: usize,
    dtype: DType,
    free: unsafe fn(*mut u8, usize, usize),
}

/// The buffers lent and not yet taken or released, by address.
fn lent() -> MutexGuard<'static, HashMap<usize, Lent>> {
    static LENT: OnceLock<Mutex<HashMap<usize, Lent>>> = OnceLock::new();
    LENT.get_or_init(Mutex::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Frees a vector of `T` from its raw parts (`len` and `capacity` in elements).
unsafe fn free_vec<T>(ptr: *mut u8, len: usize, capacity: usize) {
    // SAFETY: the parts are those of a `Vec<T>` given up by `send`.
    drop(unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, capacity) });
}

/// ZeroMQ's release of a frame's buffer (`hint`: the loan's number): frees the vector unless
/// a receiver took it. The number makes sure that a release can only ever free its own loan,
/// never a later one of the same address (a buffer taken, then lent again).
unsafe extern "C" fn release(data: *mut c_void, hint: *mut c_void) {
    let lent = {
        let mut lent = lent();
        match lent.get(&(data as usize)) {
            Some(l) if l.loan == hint as usize => lent.remove(&(data as usize)),
            _ => None,
        }
    };
    if let Some(Lent { bytes, capacity, dtype, free, .. }) = lent {
        // SAFETY: registered by `send` with these parts; removed here, so freed once.
        unsafe { free(data.cast(), bytes / dtype.size_bytes(), capacity) };
    }
}

/// Sends `data` as the last frame of a message (`flags` besides), lending its buffer when
/// its memory is its little-endian bytes (every dtype but `bool`, on a little-endian
/// machine); otherwise as a copy of its bytes.
pub fn send(sock: &mut Socket, data: Elements, flags: i32) -> zmq::Result<()> {
    fn lend<T>(sock: &mut Socket, v: Vec<T>, dtype: DType, flags: i32) -> zmq::Result<()> {
        let bytes = std::mem::size_of_val(v.as_slice());
        if bytes == 0 {
            return crate::socket::retry(|| sock.send(&[][..], flags));
        }
        let mut v = std::mem::ManuallyDrop::new(v);
        let (ptr, capacity) = (v.as_mut_ptr(), v.capacity());
        static LOANS: AtomicUsize = AtomicUsize::new(1);
        let loan = LOANS.fetch_add(1, Ordering::Relaxed);
        let before = lent().insert(ptr as usize, Lent { loan, bytes, capacity, dtype, free: free_vec::<T> });
        debug_assert!(before.is_none(), "a live buffer lent twice");
        let hint = loan as *mut c_void;
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `msg` is fresh; the buffer stays valid until `release` (it is lent).
        let rc = unsafe { zmq_sys::zmq_msg_init_data(&mut msg, ptr.cast(), bytes, Some(release), hint) };
        if rc == -1 {
            // Not sent: the vector is freed here instead.
            let err = zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() });
            // SAFETY: ZeroMQ did not take the buffer, so it is still ours to release.
            unsafe { release(ptr.cast(), hint) };
            return Err(err);
        }
        // A send that fails leaves the message with its sender, so one that a signal
        // interrupted is simply made again.
        let sent = loop {
            // SAFETY: a live socket and an initialized message.
            match unsafe { zmq_sys::zmq_msg_send(&mut msg, sock.as_mut_ptr(), flags) } {
                -1 => match zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() }) {
                    zmq::Error::EINTR => continue,
                    e => break Err(e),
                },
                _ => break Ok(()),
            }
        };
        if sent.is_err() {
            // Still ours: closing it releases the vector.
            // SAFETY: an initialized message that was not sent.
            unsafe { zmq_sys::zmq_msg_close(&mut msg) };
        }
        sent
    }
    let little = cfg!(target_endian = "little");
    match data {
        Elements::F64(v) if little => lend(sock, v, DType::F64, flags),
        Elements::F32(v) if little => lend(sock, v, DType::F32, flags),
        Elements::F16(v) if little => lend(sock, v, DType::F16, flags),
        Elements::BF16(v) if little => lend(sock, v, DType::BF16, flags),
        Elements::I64(v) if little => lend(sock, v, DType::I64, flags),
        Elements::I32(v) if little => lend(sock, v, DType::I32, flags),
        other => crate::socket::send_bytes(sock, other.to_le_bytes().into_owned(), flags),
    }
}

/// The elements of `dtype` that `frame` lends, taken without a copy; the frame back when it
/// lends none (it came from another process, or holds another dtype or length). Sound
/// because a lent frame is only ever moved (DEALER, ROUTER and PAIR sockets move messages;
/// `zmq::Message` is not `Clone`), so the receiver holds its only reference; a socket or
/// proxy that shares messages (PUB, `zmq_proxy` with capture) must never carry one.
pub fn take(frame: zmq::Message, dtype: DType) -> Result<Elements, zmq::Message> {
    let ptr = frame.as_ptr() as usize;
    let found = {
        let mut lent = lent();
        match lent.get(&ptr) {
            Some(l) if l.dtype == dtype && l.bytes == frame.len() => lent.remove(&ptr),
            _ => None,
        }
    };
    let Some(Lent { bytes, capacity, .. }) = found else { return Err(frame) };
    // The frame was the buffer's only holder: dropping it now releases nothing (it is no
    // longer lent), and the vector is ours alone.
    drop(frame);
    let len = bytes / dtype.size_bytes();
    /// # Safety
    /// The parts of a `Vec<T>` that no one else owns.
    unsafe fn vec<T>(ptr: usize, len: usize, capacity: usize) -> Vec<T> {
        unsafe { Vec::from_raw_parts(ptr as *mut T, len, capacity) }
    }
    // SAFETY: the parts of a `Vec` of `dtype`'s element type given up by `send` (the table
    // keeps its dtype), removed from the table above, so owned here alone.
    Ok(match dtype {
        DType::F64 => Elements::F64(unsafe { vec(ptr, len, capacity) }),
        DType::F32 => Elements::F32(unsafe { vec(ptr, len, capacity) }),
        DType::F16 => Elements::F16(unsafe { vec(ptr, len, capacity) }),
        DType::BF16 => Elements::BF16(unsafe { vec(ptr, len, capacity) }),
        DType::I64 => Elements::I64(unsafe { vec(ptr, len, capacity) }),
        DType::I32 => Elements::I32(unsafe { vec(ptr, len, capacity) }),
        // Never lent (see `send`).
        DType::Bool => unreachable!("bool frames are not lent"),
    })
}

/// How many buffers are lent now (for tests: none may be left behind).
pub fn outstanding() -> usize {
    lent().len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn pair(ctx: &zmq::Context, endpoint: &str) -> (Socket, Socket) {
        let rx = ctx.socket(zmq::PAIR).unwrap();
        rx.bind(endpoint).unwrap();
        let endpoint = rx.get_last_endpoint().unwrap().unwrap();
        let tx = ctx.socket(zmq::PAIR).unwrap();
        tx.connect(&endpoint).unwrap();
        (tx, rx)
    }

    /// Waits until every lent buffer was taken or released (ZeroMQ's I/O thread releases a
    /// frame it wrote to a socket a little after the send).
    fn none_outstanding() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while outstanding() > 0 {
            assert!(Instant::now() < deadline, "{} lent buffers were never given back", outstanding());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_lent_frame_is_taken_in_process_and_copied_across_sockets() {
        let ctx = zmq::Context::new();
        let values: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
        // Over inproc the receiver gets the sender's very buffer back.
        let (mut tx, rx) = pair(&ctx, "inproc://loan-test");
        let lent = values.clone();
        let sent_at = lent.as_ptr() as usize;
        send(&mut tx, Elements::F32(lent), 0).unwrap();
        assert_eq!(outstanding(), 1);
        let frame = rx.recv_msg(0).unwrap();
        // Asked for another dtype, it is not taken (and stays lent) ...
        let frame = take(frame, DType::I32).expect_err("an f32 buffer taken as i32");
        // ... as the right one, it is.
        match take(frame, DType::F32) {
            Ok(Elements::F32(v)) => {
                assert_eq!(v.as_ptr() as usize, sent_at, "copied instead of taken");
                assert_eq!(v, values);
            }
            other => panic!("not taken: {:?}", other.map(|e| e.len())),
        }
        assert_eq!(outstanding(), 0);
        // A lent frame dropped without being taken frees its buffer; so does one that
        // crossed TCP, where the receiver has a copy, which it cannot take.
        send(&mut tx, Elements::I64(vec![1, -2, 3]), 0).unwrap();
        drop(rx.recv_msg(0).unwrap());
        none_outstanding();
        let (mut tx, rx) = pair(&ctx, "tcp://127.0.0.1:*");
        for data in [Elements::F64(vec![1.5, -0.25]), Elements::I32(vec![7, -8, 9]), Elements::Bool(vec![true, false])]
        {
            let dtype = data.dtype();
            send(&mut tx, data.clone(), 0).unwrap();
            let frame = take(rx.recv_msg(0).unwrap(), dtype).expect_err("a copy from another socket taken");
            assert_eq!(Elements::from_le_bytes(dtype, &frame).unwrap(), data);
        }
        none_outstanding();
        // Empty data is an empty frame, lending nothing.
        let (mut tx, rx) = pair(&ctx, "inproc://loan-test-empty");
        send(&mut tx, Elements::F32(vec![]), 0).unwrap();
        assert_eq!(rx.recv_msg(0).unwrap().len(), 0);
        assert_eq!(outstanding(), 0);
    }
}
