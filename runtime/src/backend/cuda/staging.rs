//! Pinned (page-locked) host buffers through which large uploads and reads travel: two
//! chunks, so that the copy engine moves one while the CPU copies the other between it and
//! the caller's pageable memory. From pageable memory the driver stages every copy itself,
//! through smaller buffers and without that overlap.
// Driver calls and copies between the chunks and the caller's slices, whose lengths are
// checked against CHUNK before each.
#![allow(unsafe_code)]

use super::device::{check, DriverError};
use cust::sys as cu;
use std::ffi::c_void;
use std::mem::MaybeUninit;

type CudaResult<T> = Result<T, DriverError>;

/// Bytes per chunk (two of them are allocated on the first large copy).
const CHUNK: usize = 16 << 20;
/// Copies from this size on go through the pinned chunks; smaller ones are not worth a
/// second copy.
pub(super) const MIN_STAGED: usize = 1 << 20;

/// Two pinned chunks, each with the event that marks the end of the last copy using it.
pub(super) struct Staging {
    chunks: [(*mut c_void, cu::CUevent); 2],
}

impl Staging {
    /// Allocates the chunks and their events (in the current context). On an error, what was
    /// made is freed as the half-made value drops (the rest is null).
    pub(super) fn new() -> CudaResult<Staging> {
        let mut staging = Staging { chunks: [(std::ptr::null_mut(), std::ptr::null_mut()); 2] };
        for (host, event) in &mut staging.chunks {
            check(unsafe { cu::cuMemAllocHost_v2(host, CHUNK) })?;
            check(unsafe { cu::cuEventCreate(event, cu::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32) })?;
        }
        Ok(staging)
    }

    /// Copies `data` to device memory at `dst` on `stream`, a chunk at a time. Returns once
    /// `data` is no longer needed (its bytes are in the chunks or already on the device);
    /// the last chunks' copies may still be in flight.
    pub(super) fn upload(&mut self, dst: cu::CUdeviceptr, data: &[u8], stream: cu::CUstream) -> CudaResult<()> {
        for (i, piece) in data.chunks(CHUNK).enumerate() {
            let (host, event) = self.chunks[i % 2];
            // The chunk's previous copy to the device is done before it is overwritten.
            check(unsafe { cu::cuEventSynchronize(event) })?;
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), host as *mut u8, piece.len()) };
            let at = dst + (i * CHUNK) as cu::CUdeviceptr;
            check(unsafe { cu::cuMemcpyHtoDAsync_v2(at, host, piece.len(), stream) })?;
            check(unsafe { cu::cuEventRecord(event, stream) })?;
        }
        Ok(())
    }

    /// Copies device memory at `src` into `host` on `stream` (after the work queued before
    /// it), a chunk at a time: chunk `i` is copied out of its pinned buffer while chunk
    /// `i + 1` comes from the device. Every byte of `host` is written when this returns `Ok`.
    pub(super) fn read(
        &mut self,
        src: cu::CUdeviceptr,
        host: &mut [MaybeUninit<u8>],
        stream: cu::CUstream,
    ) -> CudaResult<()> {
        let pieces = host.len().div_ceil(CHUNK);
        let drain = |this: &Self, host: &mut [MaybeUninit<u8>], i: usize| -> CudaResult<()> {
            let (chunk, event) = this.chunks[i % 2];
            check(unsafe { cu::cuEventSynchronize(event) })?;
            let end = ((i + 1) * CHUNK).min(host.len());
            let piece = &mut host[i * CHUNK..end];
            unsafe { std::ptr::copy_nonoverlapping(chunk as *const u8, piece.as_mut_ptr() as *mut u8, piece.len()) };
            Ok(())
        };
        for i in 0..pieces {
            let (chunk, event) = self.chunks[i % 2];
            let len = CHUNK.min(host.len() - i * CHUNK);
            let at = src + (i * CHUNK) as cu::CUdeviceptr;
            check(unsafe { cu::cuMemcpyDtoHAsync_v2(chunk, at, len, stream) })?;
            check(unsafe { cu::cuEventRecord(event, stream) })?;
            if i > 0 {
                drain(self, host, i - 1)?;
            }
        }
        if pieces > 0 {
            drain(self, host, pieces - 1)?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    /// Frees the chunks and events that were made (waiting for their copies first).
    fn drop(&mut self) {
        for (host, event) in &mut self.chunks {
            if !event.is_null() {
                unsafe {
                    cu::cuEventSynchronize(*event);
                    cu::cuEventDestroy_v2(*event);
                }
            }
            if !host.is_null() {
                unsafe { cu::cuMemFreeHost(*host) };
            }
        }
    }
}
