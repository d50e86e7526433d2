//! [`Owned`]: a value that belongs to one thread (a Rust tensor and its `Rc` context) inside a
//! Python object that any thread may reach. Another thread gets a `RuntimeError` instead of
//! PyO3's panic for `unsendable` classes, and a drop on another thread leaks the value
//! rather than touching its non-atomic reference counts.

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;
use std::mem::ManuallyDrop;
use std::thread::ThreadId;

thread_local! {
    static ME: ThreadId = std::thread::current().id();
}

fn me() -> ThreadId {
    ME.with(|id| *id)
}

/// A value usable only on the thread that made it.
pub struct Owned<T> {
    owner: ThreadId,
    value: ManuallyDrop<T>,
    /// What the value is, for the error (`"tensor"`, `"optimizer"`, ...).
    what: &'static str,
}

// SAFETY: the value is reached only through `get`/`get_mut`, which check that the caller is
// the owning thread, and dropped only there (elsewhere it is leaked); the owner's id is
// immutable. So the value itself never crosses threads.
#[allow(unsafe_code)]
unsafe impl<T> Send for Owned<T> {}
#[allow(unsafe_code)]
unsafe impl<T> Sync for Owned<T> {}

impl<T> Owned<T> {
    /// `value`, owned by the calling thread.
    pub fn new(value: T, what: &'static str) -> Owned<T> {
        Owned { owner: me(), value: ManuallyDrop::new(value), what }
    }

    fn check(&self) -> PyResult<()> {
        if me() == self.owner {
            return Ok(());
        }
        Err(PyRuntimeError::new_err(format!(
            "this {} belongs to another thread: each Python thread has its own gt connection, so a {} made on one thread cannot be used on another (send its values with .numpy() and make a new one)",
            self.what, self.what
        )))
    }

    /// The value, on its own thread.
    pub fn get(&self) -> PyResult<&T> {
        self.check()?;
        Ok(&self.value)
    }

    /// The value, mutably, on its own thread.
    pub fn get_mut(&mut self) -> PyResult<&mut T> {
        self.check()?;
        Ok(&mut self.value)
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if me() == self.owner {
            // SAFETY: dropped once, here, on its own thread.
            #[allow(unsafe_code)]
            unsafe {
                ManuallyDrop::drop(&mut self.value)
            }
        }
        // On another thread (a Python object collected there): leaked.
    }
}
