//! Large answers to a client on the dispatcher's host (`ipc://`) through shared memory: the
//! dispatcher makes a file per client in [`dir`] ([`AnswerFile`]) and names it in the read
//! it sends the worker, the worker writes the value into it where the value lies
//! ([`AnswerWriter`]; the dispatcher writes it when the worker cannot), and the answer names
//! it ([`crate::message::Reply::Data`]'s `file`) for the client to read it from there.
//! Through a Unix socket the data is copied into the kernel and out again, into a receive
//! buffer libzmq allocates fresh for each message, whose pages all fault in (a 64 MB read
//! moved at under 1 GB/s); through the file it is one copy into pages that stay from read to
//! read, and one copy out.
//!
//! Who may write when: the client takes the data out as it takes the answer off its socket,
//! and the file is written again only once the client has sent that answer's receipt back
//! (its next read says so), so a write never meets a read.

use gt_ir::data::{BytesError, Elements};
use gt_ir::TensorType;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// The smallest answer that goes through a file; smaller ones cost less through the socket
/// than a write and a read of a file.
pub const MIN_BYTES: usize = 1 << 20;

/// The name of client `client`'s answer file of the dispatcher in process `pid`.
pub fn answer_file_name(pid: u32, client: u64) -> String {
    format!("answers-{pid}-{client}")
}

/// Whether `name` is an answer file of client `client` ([`answer_file_name`], of any
/// dispatcher).
pub fn is_answer_file_of(name: &str, client: u64) -> bool {
    name.rsplit_once('-').is_some_and(|(_, c)| c.parse() == Ok(client))
}

/// This user's folder of answer files, in memory (`/dev/shm/gt-UID`).
pub fn dir() -> PathBuf {
    PathBuf::from("/dev/shm").join(format!("gt-{}", nix::unistd::getuid()))
}

/// Why an answer's file could not be read.
#[derive(Debug, Error)]
pub enum SharedError {
    /// The answer named something other than a plain file name of [`dir`].
    #[error("an answer named {name:?} as its file, which is not a file of {}", dir().display())]
    Outside {
        /// The name.
        name: String,
    },
    /// The file could not be opened or read, or is not a regular file of this user's.
    #[error("cannot read the answer's file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Its bytes are not values of the answer's type (a `bool` other than 0 or 1).
    #[error("the answer's file {path} does not hold {ty}: {source}")]
    Bytes {
        /// The file.
        path: PathBuf,
        /// The answer's type.
        ty: TensorType,
        /// Why.
        source: BytesError,
    },
}

/// The dispatcher's file for one client's answers; removed when dropped (the client removes
/// its name as soon as it has opened it, so that nothing is left if either side dies).
#[derive(Debug)]
pub struct AnswerFile {
    path: PathBuf,
    name: String,
    writer: AnswerWriter,
}

impl AnswerFile {
    /// A new, empty file `name` in [`dir`] (made private to this user if it is not there).
    /// A stale one (a dispatcher of the same pid that died) goes first, and the file is
    /// created exclusively, 0600, so that nothing is written through a link.
    pub fn create(name: &str) -> io::Result<AnswerFile> {
        let dir = crate::endpoint::ensure_private_dir(dir()).map_err(io::Error::other)?;
        let path = dir.join(name);
        let file = crate::endpoint::create_private(&path)?;
        Ok(AnswerFile { path, name: name.to_string(), writer: AnswerWriter { file, map: None } })
    }

    /// Its name in [`dir`], as an answer carries it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes `data` from offset 0, as [`AnswerWriter::write`] does.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.writer.write(data)
    }
}

impl Drop for AnswerFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A worker's side: a client's answer file, mapped into memory once and written there
/// (a write through `pwrite` takes and releases each page of the file in the kernel, which
/// cost as much as the copy itself).
#[derive(Debug)]
pub struct AnswerWriter {
    file: File,
    map: Option<memmap2::MmapMut>,
}

impl AnswerWriter {
    /// The answer file `name` of [`dir`], opened (not through a link, and only if it is this
    /// user's regular file).
    pub fn open(name: &str) -> io::Result<AnswerWriter> {
        if !plain(name) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a file name"));
        }
        let file = open_checked(&dir().join(name), true)?;
        Ok(AnswerWriter { file, map: None })
    }

    /// Writes `data` from offset 0, growing the file (never shrinking it) and its mapping
    /// when `data` is longer than both.
    #[allow(unsafe_code)]
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.map.as_ref().is_none_or(|m| m.len() < data.len()) {
            self.map = None;
            if self.file.metadata()?.len() < data.len() as u64 {
                self.file.set_len(data.len() as u64)?;
            }
            // SAFETY: the file is this user's answer file, which the dispatcher and the client
            // only ever grow (so the mapping never reaches past its end), and which nobody
            // else writes or reads while an answer is written into it (the module's protocol).
            self.map = Some(unsafe { memmap2::MmapMut::map_mut(&self.file)? });
        }
        let map = self.map.as_mut().expect("mapped above");
        map[..data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// Whether `name` is a plain file name (no path, not `.` or `..`).
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Opens a regular file of this user's (not through a link), for reading, and writing too
/// when `write`.
fn open_checked(path: &std::path::Path, write: bool) -> io::Result<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = OpenOptions::new().read(true).write(write).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "not a regular file of this user's"));
    }
    Ok(file)
}

/// The client's side: the answer file it has open (one per dispatcher connection), mapped.
#[derive(Debug, Default)]
pub struct AnswerReader {
    open: Option<(String, File, Option<memmap2::Mmap>)>,
    reads: u64,
}

impl AnswerReader {
    /// How many answers it has read from files.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The data of an answer of type `ty` in file `name` of [`dir`], from offset 0, copied
    /// once into new elements. The file is opened the first time it is named (not through a
    /// link, and only if it is this user's regular file) and its name removed: the
    /// dispatcher and the worker write through the file they hold open.
    #[allow(unsafe_code)]
    pub fn read(&mut self, name: &str, ty: &TensorType) -> Result<Elements, SharedError> {
        if !plain(name) {
            return Err(SharedError::Outside { name: name.to_string() });
        }
        let path = dir().join(name);
        let io = |source| SharedError::Io { path: path.clone(), source };
        if self.open.as_ref().is_none_or(|(open, ..)| open != name) {
            let file = open_checked(&path, false).map_err(io)?;
            std::fs::remove_file(&path).map_err(io)?;
            self.open = Some((name.to_string(), file, None));
        }
        let (_, file, map) = self.open.as_mut().expect("opened above");
        let want = ty.size_bytes();
        let bytes: &[u8] = if want == 0 {
            &[]
        } else {
            if map.as_ref().is_none_or(|m| m.len() < want) {
                *map = None;
                let len = file.metadata().map_err(io)?.len();
                if len < want as u64 {
                    let short = format!("the file holds {len} bytes, the answer {want}");
                    return Err(io(io::Error::new(io::ErrorKind::UnexpectedEof, short)));
                }
                // SAFETY: the file is this user's answer file, which its writers only ever
                // grow (the mapping never reaches past its end), and which the dispatcher
                // writes again only after this answer's receipt has gone back (the module's
                // protocol): nothing writes it while it is read here.
                *map = Some(unsafe { memmap2::Mmap::map(&*file) }.map_err(io)?);
            }
            &map.as_ref().expect("mapped above")[..want]
        };
        let data = Elements::from_le_bytes(ty.dtype, bytes).map_err(|source| SharedError::Bytes {
            path: path.clone(),
            ty: ty.clone(),
            source,
        })?;
        self.reads += 1;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::DType;

    /// What the dispatcher writes the client reads, for every dtype; a file the client has
    /// opened keeps working after its name is gone, and is written again in place.
    #[test]
    fn answers_written_are_read_back() {
        let name = format!("test-{}-roundtrip", std::process::id());
        let mut file = AnswerFile::create(&name).unwrap();
        let mut reader = AnswerReader::default();
        let cases = [
            Elements::F32((0..300_000).map(|i| i as f32 * 0.5).collect()),
            Elements::F64(vec![1.5, -2.0, f64::NAN]),
            Elements::I32(vec![1, -2, 3]),
            Elements::I64(vec![i64::MAX, 0]),
            Elements::F16(vec![half::f16::from_f32(1.5); 5]),
            Elements::BF16(vec![half::bf16::from_f32(-3.0); 7]),
            Elements::Bool(vec![true, false, true]),
        ];
        for data in cases {
            let ty = TensorType::new(data.dtype(), vec![data.len()]);
            file.write(&data.to_le_bytes()).unwrap();
            let got = reader.read(file.name(), &ty).unwrap();
            assert_eq!(got.to_le_bytes(), data.to_le_bytes(), "{ty}");
            assert!(!dir().join(&name).exists(), "the client removes the name once it has the file open");
        }
        assert_eq!(reader.reads(), 7);
        // A worker's writes, through its mapping, growing the file past its length.
        assert!(AnswerWriter::open(&name).is_err(), "the client removed the name");
        let name2 = format!("test-{}-writer", std::process::id());
        let file2 = AnswerFile::create(&name2).unwrap();
        let mut writer = AnswerWriter::open(&name2).unwrap();
        let mut reader2 = AnswerReader::default();
        for n in [10usize, 300_000, 1000, 700_000] {
            let data = Elements::F32((0..n).map(|i| i as f32 - 7.0).collect());
            writer.write(&data.to_le_bytes()).unwrap();
            let ty = TensorType::f32(vec![n]);
            assert_eq!(reader2.read(file2.name(), &ty).unwrap(), data, "{n}");
        }
        assert!(AnswerWriter::open("../etc").is_err());
        let name = answer_file_name(12, 3);
        assert!(is_answer_file_of(&name, 3) && !is_answer_file_of(&name, 13) && !is_answer_file_of(&name, 12));
        // A bool byte other than 0 or 1, and a file shorter than the answer.
        file.write(&[0, 1, 2]).unwrap();
        let bools = TensorType::new(DType::Bool, vec![3]);
        assert!(matches!(reader.read(file.name(), &bools), Err(SharedError::Bytes { .. })));
        let long = TensorType::f32(vec![1 << 20]);
        assert!(matches!(reader.read(file.name(), &long), Err(SharedError::Io { .. })));
    }

    /// A name that is not a plain file name of the folder, a link, and another's name that
    /// is not there: refused, never followed.
    #[test]
    fn only_plain_files_of_the_folder_are_read() {
        let ty = TensorType::f32(vec![1]);
        let mut reader = AnswerReader::default();
        for bad in ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\0b"] {
            assert!(matches!(reader.read(bad, &ty), Err(SharedError::Outside { .. })), "{bad:?}");
        }
        let folder = crate::endpoint::ensure_private_dir(dir()).unwrap();
        let link = format!("test-{}-link", std::process::id());
        let target = folder.join(format!("test-{}-target", std::process::id()));
        std::fs::write(&target, [0u8; 4]).unwrap();
        std::os::unix::fs::symlink(&target, folder.join(&link)).unwrap();
        assert!(matches!(reader.read(&link, &ty), Err(SharedError::Io { .. })));
        std::fs::remove_file(folder.join(&link)).unwrap();
        std::fs::remove_file(&target).unwrap();
        assert!(matches!(reader.read("no-such-answer", &ty), Err(SharedError::Io { .. })));
    }
}
