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
//!
//! [`VecLoan`] lends ranges of one `f32` vector at once (a collective's pieces to in-process
//! peers, who write into them); it keeps its own count of the frames out, not the table.
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
    let mut msg = frame(data);
    // (Dropping a message that was not sent releases what it holds.)
    send_or_keep(sock, raw(&mut msg), flags)
}

/// `data` as one frame, lending its buffer when its memory is its little-endian bytes (every
/// dtype but `bool`, on a little-endian machine), else its bytes: what [`send`] sends, and
/// what goes through a [`crate::lane`] as it is.
pub fn frame(data: Elements) -> zmq::Message {
    fn lend<T>(v: Vec<T>, dtype: DType) -> zmq::Message {
        let bytes = std::mem::size_of_val(v.as_slice());
        if bytes == 0 {
            return zmq::Message::new();
        }
        let mut v = std::mem::ManuallyDrop::new(v);
        let (ptr, capacity) = (v.as_mut_ptr(), v.capacity());
        static LOANS: AtomicUsize = AtomicUsize::new(1);
        let loan = LOANS.fetch_add(1, Ordering::Relaxed);
        let before = lent().insert(ptr as usize, Lent { loan, bytes, capacity, dtype, free: free_vec::<T> });
        debug_assert!(before.is_none(), "a live buffer lent twice");
        let mut msg = zmq::Message::new();
        let raw = raw(&mut msg);
        // SAFETY: `raw` is an initialized empty message (closed first, holding nothing), and
        // the buffer stays valid until `release` (it is lent).
        let rc = unsafe {
            zmq_sys::zmq_msg_close(raw);
            zmq_sys::zmq_msg_init_data(raw, ptr.cast(), bytes, Some(release), loan as *mut c_void)
        };
        if rc == -1 {
            // (Only when out of memory.) A copy instead; the vector goes back to be freed.
            // SAFETY: ZeroMQ did not take the buffer, so it is still ours to release.
            let copy = zmq::Message::from(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), bytes) });
            unsafe { release(ptr.cast(), loan as *mut c_void) };
            // SAFETY: `raw` failed to initialize; an empty one is left there to drop.
            unsafe { zmq_sys::zmq_msg_init(raw) };
            return copy;
        }
        msg
    }
    let little = cfg!(target_endian = "little");
    match data {
        Elements::F64(v) if little => lend(v, DType::F64),
        Elements::F32(v) if little => lend(v, DType::F32),
        Elements::F16(v) if little => lend(v, DType::F16),
        Elements::BF16(v) if little => lend(v, DType::BF16),
        Elements::I64(v) if little => lend(v, DType::I64),
        Elements::I32(v) if little => lend(v, DType::I32),
        other => zmq::Message::from(other.to_le_bytes().into_owned()),
    }
}

/// The ZeroMQ message inside `msg` (the `zmq` crate keeps its own accessor private).
fn raw(msg: &mut zmq::Message) -> *mut zmq_sys::zmq_msg_t {
    // `zmq::Message`'s one field is a `zmq_msg_t`; of the same size, it can only sit at
    // offset 0, so the message's address is the field's.
    const _: () = assert!(std::mem::size_of::<zmq::Message>() == std::mem::size_of::<zmq_sys::zmq_msg_t>());
    (msg as *mut zmq::Message).cast()
}

/// Sends an initialized message; one that cannot be sent is closed (releasing what it holds).
/// A send that fails leaves the message with its sender, so one a signal interrupted is simply
/// made again.
fn send_or_close(sock: &mut Socket, mut msg: zmq_sys::zmq_msg_t, flags: i32) -> zmq::Result<()> {
    let sent = send_or_keep(sock, &mut msg, flags);
    if sent.is_err() {
        // SAFETY: an initialized message that was not sent, still ours.
        unsafe { zmq_sys::zmq_msg_close(&mut msg) };
    }
    sent
}

/// Sends an initialized message, again after a signal; one that cannot be sent stays the
/// caller's.
fn send_or_keep(sock: &mut Socket, msg: *mut zmq_sys::zmq_msg_t, flags: i32) -> zmq::Result<()> {
    loop {
        // SAFETY: a live socket and an initialized message.
        match unsafe { zmq_sys::zmq_msg_send(msg, sock.as_mut_ptr(), flags) } {
            -1 => match zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() }) {
                zmq::Error::EINTR => continue,
                e => return Err(e),
            },
            _ => return Ok(()),
        }
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

/// An `f32` vector whose ranges go out as frames without a copy while its owner works on the
/// rest: a collective lends its chunk to an in-process peer, which folds into it and hands it on.
///
/// A range once lent stays the peers' until [`VecLoan::reclaim`]: [`VecLoan::slice_mut`] refuses
/// it, and no two lent ranges overlap, so a peer writing into its frame never races the owner.
/// Each frame holds a reference to the vector, dropped when ZeroMQ releases the frame; `reclaim`
/// waits for the last one, and a vector whose frames a peer never gives back is freed by the
/// last release, never while a frame can still reach it.
pub struct VecLoan {
    shared: std::sync::Arc<Owned>,
    lent: Vec<std::ops::Range<usize>>,
}

/// The vector's parts, freed when the last holder (the loan or a frame) lets go.
struct Owned {
    ptr: *mut f32,
    len: usize,
    capacity: usize,
}

// SAFETY: `Owned` is the only owner of its vector's memory; who may touch which range is what
// `VecLoan` rules, and a frame reaches its range only through ZeroMQ, which moves it.
unsafe impl Send for Owned {}
unsafe impl Sync for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the parts of the `Vec` given up by `VecLoan::new`; dropped once, by the last
        // `Arc` holder.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.capacity) });
    }
}

/// ZeroMQ's release of a frame [`VecLoan::send`] made: drops its reference (`hint`).
unsafe extern "C" fn release_range(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Arc` that `VecLoan::send` turned into a raw pointer for this frame.
    drop(unsafe { std::sync::Arc::from_raw(hint as *const Owned) });
}

impl VecLoan {
    /// Takes `v` to lend ranges of.
    pub fn new(v: Vec<f32>) -> VecLoan {
        let mut v = std::mem::ManuallyDrop::new(v);
        let owned = Owned { ptr: v.as_mut_ptr(), len: v.len(), capacity: v.capacity() };
        VecLoan { shared: std::sync::Arc::new(owned), lent: Vec::new() }
    }

    /// Marks `range` lent; ranges lent one after another (a ring's pieces) merge, so the
    /// checks stay short.
    fn lend(&mut self, range: std::ops::Range<usize>) {
        match self.lent.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => self.lent.push(range),
        }
    }

    fn overlaps_lent(&self, range: &std::ops::Range<usize>) -> bool {
        self.lent.iter().any(|l| l.start < range.end && range.start < l.end)
    }

    fn valid(&self, range: &std::ops::Range<usize>) -> bool {
        range.start <= range.end && range.end <= self.shared.len
    }

    /// Sends `frames`, then `range` of the vector as the last frame without a copy (none of it
    /// blocking). From then on the range is the frame's, and whoever the frame reaches may
    /// write into it, until [`VecLoan::reclaim`]; while any frame is out, the whole vector stays
    /// allocated. `EINVAL` for a range that is empty, out of bounds or (partly) lent already,
    /// and for a socket that may share a message between receivers (only DEALER, ROUTER, PAIR
    /// and PUSH move it, so one receiver at a time can write into the range).
    pub fn send(&mut self, sock: &mut Socket, frames: &[&[u8]], range: std::ops::Range<usize>) -> zmq::Result<()> {
        if range.is_empty() || !self.valid(&range) || self.overlaps_lent(&range) {
            return Err(zmq::Error::EINVAL);
        }
        if !matches!(sock.get_socket_type()?, zmq::DEALER | zmq::ROUTER | zmq::PAIR | zmq::PUSH) {
            return Err(zmq::Error::EINVAL);
        }
        let hint = std::sync::Arc::into_raw(self.shared.clone()) as *mut c_void;
        // SAFETY: in bounds (checked above).
        let data = unsafe { self.shared.ptr.add(range.start) };
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `msg` is fresh; the range stays valid while the frame holds its reference
        // (`hint`, dropped by `release_range`), and no one else touches it (it is lent).
        let rc =
            unsafe { zmq_sys::zmq_msg_init_data(&mut msg, data.cast(), range.len() * 4, Some(release_range), hint) };
        if rc == -1 {
            let err = zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() });
            // SAFETY: ZeroMQ did not take the reference, so it is still ours to drop.
            drop(unsafe { std::sync::Arc::from_raw(hint as *const Owned) });
            return Err(err);
        }
        // The message exists before any frame goes, so a failure leaves no message half sent.
        for frame in frames {
            if let Err(e) = crate::socket::retry(|| sock.send(*frame, zmq::SNDMORE | zmq::DONTWAIT)) {
                // SAFETY: an initialized message that was not sent: closing it drops its reference.
                unsafe { zmq_sys::zmq_msg_close(&mut msg) };
                return Err(e);
            }
        }
        self.lend(range);
        // Closing an unsent message drops its reference (the range stays marked lent, unused).
        send_or_close(sock, msg, zmq::DONTWAIT)
    }

    /// `range` of the vector to read and write; `None` when out of bounds or (partly) lent.
    pub fn slice_mut(&mut self, range: std::ops::Range<usize>) -> Option<&mut [f32]> {
        if !self.valid(&range) || self.overlaps_lent(&range) {
            return None;
        }
        // SAFETY: in bounds, not lent (no frame reaches it), and borrowed from `&mut self`, so
        // no other slice of the loan is alive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.shared.ptr.add(range.start), range.len()) })
    }

    /// Whether `frame` is this loan's own frame of `range` come back (its data is then already
    /// in place).
    pub fn is_frame_of(&self, frame: &zmq::Message, range: std::ops::Range<usize>) -> bool {
        self.valid(&range)
            && !range.is_empty()
            && frame.len() == range.len() * 4
            && std::ptr::eq(frame.as_ptr(), self.shared.ptr.wrapping_add(range.start).cast())
    }

    /// The vector, once every frame is released (waiting up to `timeout`: a peer still reading
    /// or forwarding a frame lets go at once, mostly); `None` when a frame is still held then:
    /// the vector is then freed by the last frame's release.
    pub fn reclaim(self, timeout: std::time::Duration) -> Option<Vec<f32>> {
        let start = std::time::Instant::now();
        let mut shared = self.shared;
        let mut spins = 0u32;
        loop {
            // `try_unwrap` synchronizes with every release, so what peers wrote is seen.
            match std::sync::Arc::try_unwrap(shared) {
                Ok(owned) => {
                    let owned = std::mem::ManuallyDrop::new(owned);
                    // SAFETY: the parts `new` gave up; `owned` is not dropped, so they are moved.
                    return Some(unsafe { Vec::from_raw_parts(owned.ptr, owned.len, owned.capacity) });
                }
                Err(back) => shared = back,
            }
            if start.elapsed() >= timeout {
                return None;
            }
            // The last holder is a peer finishing its copy: a moment, mostly.
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

/// How many buffers [`send`] lent are out now (for tests: none may be left behind; a
/// [`VecLoan`] counts its own frames).
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
        // A frame made without a socket (to go through a lane) is taken back alike, and one
        // dropped frees its buffer; `bool` is its bytes.
        let lent = values.clone();
        let made_at = lent.as_ptr() as usize;
        match take(super::frame(Elements::F32(lent)), DType::F32) {
            Ok(Elements::F32(v)) => assert_eq!((v.as_ptr() as usize, v), (made_at, values)),
            other => panic!("not taken: {:?}", other.map(|e| e.len())),
        }
        drop(super::frame(Elements::I64(vec![4, 5])));
        assert_eq!(outstanding(), 0);
        assert_eq!(&super::frame(Elements::Bool(vec![true, false]))[..], &[1, 0]);
        assert_eq!(super::frame(Elements::F32(vec![])).len(), 0);
    }

    #[test]
    fn a_vec_loan_lends_ranges_and_takes_them_back() {
        let ctx = zmq::Context::new();
        let (mut tx, rx) = pair(&ctx, "inproc://vec-loan-test");
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let at = v.as_ptr();
        let mut loan = VecLoan::new(v);
        loan.send(&mut tx, &[b"head"], 2..5).unwrap();
        // A lent range is neither the owner's to write nor lent again; empty and out-of-bounds
        // ranges are refused.
        assert!(loan.slice_mut(3..4).is_none());
        for bad in [4..6, 7..9, 6..6] {
            assert_eq!(loan.send(&mut tx, &[], bad.clone()), Err(zmq::Error::EINVAL), "{bad:?}");
        }
        loan.slice_mut(5..8).unwrap()[0] = -5.0;
        assert_eq!(&rx.recv_msg(0).unwrap()[..], b"head");
        let mut frame = rx.recv_msg(0).unwrap();
        assert!(loan.is_frame_of(&frame, 2..5));
        assert!(!loan.is_frame_of(&frame, 1..4));
        // The receiver writes into the lender's memory; the lender sees it once the frame is gone.
        bytemuck::cast_slice_mut::<u8, f32>(&mut frame)[0] = 20.0;
        drop(frame);
        let back = loan.reclaim(Duration::from_secs(5)).unwrap();
        assert_eq!(back.as_ptr(), at);
        assert_eq!(back, [0.0, 1.0, 20.0, 3.0, 4.0, -5.0, 6.0, 7.0]);

        // A frame still held: the owner gives up on it, and its release frees the vector.
        let mut loan = VecLoan::new(vec![1.0; 1000]);
        loan.send(&mut tx, &[], 0..1000).unwrap();
        let frame = rx.recv_msg(0).unwrap();
        assert!(loan.reclaim(Duration::from_millis(10)).is_none());
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&frame)[999], 1.0);
        drop(frame);

        // Over TCP the receiver gets a copy; ZeroMQ's I/O thread lets go of the loan once sent.
        let (mut tx, rx) = pair(&ctx, "tcp://127.0.0.1:*");
        let mut loan = VecLoan::new(vec![2.5; 64]);
        loan.send(&mut tx, &[], 0..64).unwrap();
        let frame = rx.recv_msg(0).unwrap();
        assert!(!loan.is_frame_of(&frame, 0..64));
        assert_eq!(loan.reclaim(Duration::from_secs(5)).unwrap(), vec![2.5; 64]);
    }
}
