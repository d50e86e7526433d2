//! Spare buffers of small `f32` results, kept per thread: a value the interpreter lets go
//! (freed, or replaced by a new result) leaves its buffer here, and the next small result
//! of about its size is written into it. A steady loop of small ops (a training step's
//! elementwise work, a tiny op and its free) then allocates nothing per op.

use super::value::Value;
use std::cell::RefCell;

/// The largest buffer kept, in elements (64 KiB): larger results are few per step and the
/// allocator reuses their memory well; keeping them would hold memory for nothing.
const MAX_ELEMENTS: usize = 16 << 10;
/// The most buffers a thread keeps.
const MAX_SPARES: usize = 32;

std::thread_local! {
    static SPARES: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// An empty vector with room for `n` elements: a spare one of `n` to `2n` when this thread
/// keeps one, else a new one.
pub(crate) fn take(n: usize) -> Vec<f32> {
    if (1..=MAX_ELEMENTS).contains(&n) {
        let found = SPARES.with_borrow_mut(|spares| {
            let i = spares.iter().rposition(|v| (n..=2 * n).contains(&v.capacity()))?;
            Some(spares.swap_remove(i))
        });
        if let Some(v) = found {
            return v;
        }
    }
    Vec::with_capacity(n)
}

/// Lets go of `value`, keeping its buffer for a later result when it is a small `f32` one.
pub(crate) fn give(value: Value) {
    let Value::F32(a) = value else { return };
    if a.len() > MAX_ELEMENTS || a.is_empty() {
        return;
    }
    let (mut v, _) = a.into_raw_vec_and_offset();
    if v.capacity() > 2 * MAX_ELEMENTS {
        return;
    }
    v.clear();
    SPARES.with_borrow_mut(|spares| {
        if spares.len() < MAX_SPARES {
            spares.push(v);
        }
    });
}

/// How many buffers this thread keeps (for tests).
#[cfg(test)]
pub(crate) fn kept() -> usize {
    SPARES.with_borrow(Vec::len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    #[test]
    fn a_small_buffer_let_go_is_taken_again_by_a_result_of_its_size() {
        let value = |n: usize| Value::F32(ArrayD::from_shape_vec(IxDyn(&[n]), vec![1.0; n]).unwrap());
        let before = kept();
        let v = value(1000);
        let at = match &v {
            Value::F32(a) => a.as_ptr(),
            _ => unreachable!(),
        };
        give(v);
        assert_eq!(kept(), before + 1);
        // Too small a need for it (under half its size) and too large a one get new ones.
        let (small, large) = (take(400), take(1001));
        assert!(small.as_ptr() != at && large.as_ptr() != at);
        let again = take(900);
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the spare, emptied");
        assert_eq!(kept(), before);
        // Large values and other dtypes are not kept; nor are more than MAX_SPARES.
        give(value(MAX_ELEMENTS + 1));
        give(Value::I32(ArrayD::from_shape_vec(IxDyn(&[4]), vec![1; 4]).unwrap()));
        assert_eq!(kept(), before);
        for _ in 0..MAX_SPARES + 5 {
            give(value(10));
        }
        assert_eq!(kept(), MAX_SPARES);
    }
}
