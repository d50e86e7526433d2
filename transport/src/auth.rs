//! The cluster key: one CURVE key pair that every member of a cluster holds (`gt keygen`
//! writes it; `--key FILE` or `GT_KEY_FILE` reads it), its file format, and the ZAP handler
//! that lets only its holders through.
//!
//! Whoever holds the file is in the cluster. The dispatcher's TCP socket, each worker's peer
//! socket and the monitor socket are CURVE servers with the key pair; workers, clients and
//! tools connect as CURVE clients with the same pair as their own and its public half as the
//! server's. CURVE alone would let in anyone who knows the server's public key; the ZAP handler
//! ([`start_zap`]) also demands that the client's key be the cluster's, which only a holder of
//! the secret half can prove. So a peer without the file cannot finish the handshake, and
//! everything on the wire is encrypted. IPC and `inproc://` sockets stay as they are: they are
//! private to this user by file permissions already.
//!
//! The file is text: `#` comments and two `NAME = VALUE` lines, `public-key` and `secret-key`,
//! each a 40-character Z85 key (ZeroMQ's own text form of a 32-byte key).

use crate::socket::retry;
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;
use zmq::{Context, Socket, SocketType};

/// The environment variable naming the key file.
pub const KEY_FILE_VAR: &str = "GT_KEY_FILE";

/// Where ZeroMQ looks for the ZAP handler of a context (RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The most bytes read from a key file: a real one is about 300.
const MAX_KEY_FILE_BYTES: u64 = 64 << 10;

/// Characters of a Z85-encoded 32-byte key.
const Z85_KEY_LEN: usize = 40;

/// The cluster's CURVE key pair. Its `Debug` form leaves out the secret half.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey {
    public: [u8; 32],
    secret: [u8; 32],
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterKey").field("public", &z85_encode(&self.public)).finish_non_exhaustive()
    }
}

/// What is wrong with a key file's text (lines count from 1).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyFormatError {
    /// Longer than any key file.
    #[error("it is larger than {MAX_KEY_FILE_BYTES} bytes")]
    TooLarge,
    /// Not UTF-8 text.
    #[error("it is not text")]
    NotText,
    /// A line that is neither a comment nor `NAME = VALUE`.
    #[error("line {line}: expected `NAME = VALUE` or a `#` comment")]
    NotAssignment {
        /// The line.
        line: usize,
    },
    /// A name other than `public-key` and `secret-key`.
    #[error("line {line}: unknown name `{name}` (expected public-key or secret-key)")]
    UnknownName {
        /// The line.
        line: usize,
        /// The name found (clipped to 40 characters).
        name: String,
    },
    /// A name given twice.
    #[error("line {line}: {name} is given twice")]
    Duplicate {
        /// The line of the second one.
        line: usize,
        /// The name.
        name: &'static str,
    },
    /// A value that is not a Z85 key.
    #[error("line {line}: {name} is not a {Z85_KEY_LEN}-character Z85 key")]
    BadKey {
        /// The line.
        line: usize,
        /// The name.
        name: &'static str,
    },
    /// A name that is missing.
    #[error("no {name} line")]
    Missing {
        /// The name.
        name: &'static str,
    },
    /// A public key that is not the secret key's (an edited or mixed-up file): every member
    /// would be refused at the handshake, for a reason the handshake cannot tell.
    #[error("line {line}: the public-key is not the secret-key's (the file was edited, or its lines come from two files); make a new one with `gt keygen`")]
    Mismatch {
        /// The public key's line.
        line: usize,
    },
}

/// Why a key could not be made, read or written.
#[derive(Debug, Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read the key file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (in the message, not a `source`: a chain printed with `{:#}` would say it twice).
        error: std::io::Error,
    },
    /// The file is not a key file.
    #[error("{path} is not a gt cluster key file (made by `gt keygen`): {error}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: KeyFormatError,
    },
    /// Other users can read the file, so it proves nothing.
    #[error("the key file {path} can be read by other users (mode {mode:03o}); run `chmod 600 {path}`")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// `gt keygen` would replace a key.
    #[error("{path} already exists; pass --force to replace it (members holding the old key are then locked out)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be written.
    #[error("cannot write the key file {path}: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why (in the message, not a `source`: a chain printed with `{:#}` would say it twice).
        error: std::io::Error,
    },
    /// No default place for the file.
    #[error("neither XDG_CONFIG_HOME nor HOME is set, so there is no default key file; give a path")]
    NoDefaultPath,
    /// ZeroMQ could not make a key pair.
    #[error("cannot make a CURVE key pair: {0}")]
    Generate(zmq::Error),
}

/// Names in the file.
const PUBLIC: &str = "public-key";
const SECRET: &str = "secret-key";

impl ClusterKey {
    /// A fresh key pair from ZeroMQ (libsodium's random source).
    pub fn generate() -> Result<ClusterKey, KeyError> {
        let pair = zmq::CurveKeyPair::new().map_err(KeyError::Generate)?;
        Ok(ClusterKey { public: pair.public_key, secret: pair.secret_key })
    }

    /// The public half, in Z85 (what a log may show).
    pub fn public_z85(&self) -> String {
        z85_encode(&self.public)
    }

    /// The public half.
    pub fn public(&self) -> &[u8; 32] {
        &self.public
    }

    /// The secret half.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The key file's text.
    pub fn to_file_text(&self) -> String {
        format!(
            "# gt cluster key, made by `gt keygen`.\n\
             # Whoever holds this file is a member of the cluster: keep it private (mode 0600)\n\
             # and copy it only to the cluster's machines (`--key FILE` or GT_KEY_FILE=FILE).\n\
             {PUBLIC} = {}\n\
             {SECRET} = {}\n",
            z85_encode(&self.public),
            z85_encode(&self.secret)
        )
    }

    /// Reads a key file's text.
    pub fn parse(text: &str) -> Result<ClusterKey, KeyFormatError> {
        let (mut public, mut secret) = (None, None);
        let mut public_line = 0;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let (name, value) = content.split_once('=').ok_or(KeyFormatError::NotAssignment { line })?;
            let (slot, name) = match name.trim() {
                PUBLIC => (&mut public, PUBLIC),
                SECRET => (&mut secret, SECRET),
                other => {
                    let name = other.chars().take(40).collect();
                    return Err(KeyFormatError::UnknownName { line, name });
                }
            };
            if slot.is_some() {
                return Err(KeyFormatError::Duplicate { line, name });
            }
            if name == PUBLIC {
                public_line = line;
            }
            *slot = Some(z85_decode_key(value.trim()).ok_or(KeyFormatError::BadKey { line, name })?);
        }
        let public = public.ok_or(KeyFormatError::Missing { name: PUBLIC })?;
        let secret = secret.ok_or(KeyFormatError::Missing { name: SECRET })?;
        if curve_public(&secret) != Some(public) {
            return Err(KeyFormatError::Mismatch { line: public_line });
        }
        Ok(ClusterKey { public, secret })
    }

    /// Reads the key file at `path`, which only this user may read.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        use std::io::Read;
        let read_err = |error| KeyError::Read { path: path.to_path_buf(), error };
        let file = std::fs::File::open(path).map_err(read_err)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let mode = file.metadata().map_err(read_err)?.mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Exposed { path: path.to_path_buf(), mode });
            }
        }
        let mut bytes = Vec::new();
        file.take(MAX_KEY_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
        let format_err = |error| KeyError::Format { path: path.to_path_buf(), error };
        if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
            return Err(format_err(KeyFormatError::TooLarge));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| format_err(KeyFormatError::NotText))?;
        ClusterKey::parse(text).map_err(format_err)
    }

    /// Writes the key file at `path` (mode 0600, in a fresh file; its directory is made, mode
    /// 0700, when missing). An existing file is replaced only when `force` is set.
    pub fn save(&self, path: &Path, force: bool) -> Result<(), KeyError> {
        let write_err = |error| KeyError::Write { path: path.to_path_buf(), error };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(dir).map_err(write_err)?;
        }
        if force {
            // A fresh inode: nothing is written through a link planted at the path.
            return crate::endpoint::write_private(path, self.to_file_text().as_bytes()).map_err(write_err);
        }
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = match options.open(path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(KeyError::Exists { path: path.to_path_buf() })
            }
            opened => opened.map_err(write_err)?,
        };
        file.write_all(self.to_file_text().as_bytes()).map_err(write_err)
    }
}

/// Where `gt keygen` writes the key when given no path: `$XDG_CONFIG_HOME/gt/cluster.key`,
/// else `$HOME/.config/gt/cluster.key`.
pub fn default_key_path() -> Result<PathBuf, KeyError> {
    let set = |var| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    let config = set("XDG_CONFIG_HOME").or_else(|| set("HOME").map(|h| h.join(".config")));
    Ok(config.ok_or(KeyError::NoDefaultPath)?.join("gt").join("cluster.key"))
}

/// Makes `socket` a CURVE server with `key` for the endpoints it binds from now on, with
/// the cluster's ZAP handler started on `ctx` first, so that no connection is ever let in
/// unchecked.
pub fn curve_server(ctx: &Context, socket: &Socket, key: &ClusterKey) -> zmq::Result<()> {
    start_zap(ctx, key)?;
    socket.set_curve_secretkey(&key.secret)?;
    socket.set_curve_server(true)
}

/// Makes `socket` a CURVE client of a cluster server for the endpoints it connects to from
/// now on: the cluster's pair is its own, and the cluster's public key the server's.
pub fn curve_client(socket: &Socket, key: &ClusterKey) -> zmq::Result<()> {
    socket.set_curve_serverkey(&key.public)?;
    socket.set_curve_publickey(&key.public)?;
    socket.set_curve_secretkey(&key.secret)
}

/// Makes `socket` bind or connect without security from now on (the NULL mechanism, for IPC
/// and `inproc://` endpoints of a socket that also has a CURVE one).
pub fn no_security(socket: &Socket) -> zmq::Result<()> {
    socket.set_plain_username(None)
}

/// Starts the ZAP handler of `ctx`: a thread answering ZeroMQ's authentication requests,
/// letting in only the CURVE mechanism with `key`'s public half as the client's key. One per
/// context: when `ctx` has one already, it is kept (a process has one cluster key). The thread
/// ends when the context is terminated.
pub fn start_zap(ctx: &Context, key: &ClusterKey) -> zmq::Result<()> {
    let socket = ctx.socket(SocketType::REP)?;
    socket.set_linger(0)?;
    match socket.bind(ZAP_ENDPOINT) {
        Err(zmq::Error::EADDRINUSE) => return Ok(()),
        bound => bound?,
    }
    // The handler must not keep the context alive, or the context could never be terminated
    // and the thread never told to end: `from_raw` gives a socket without the context's
    // reference, and the thread ends at the context's ETERM.
    #[allow(unsafe_code)]
    // SAFETY: the pointer comes from `into_raw` of a live socket, and nothing else keeps it.
    let socket = unsafe { Socket::from_raw(socket.into_raw()) };
    let allowed = key.public;
    std::thread::Builder::new()
        .name("gt-zap".into())
        .spawn(move || zap_loop(&socket, &allowed))
        .map_err(|_| zmq::Error::ENOMEM)?;
    Ok(())
}

fn zap_loop(socket: &Socket, allowed: &[u8; 32]) {
    loop {
        let request = match retry(|| socket.recv_multipart(0)) {
            Ok(frames) => frames,
            // ETERM: the context is going away.
            Err(_) => return,
        };
        let reply = zap_reply(&request, allowed);
        if retry(|| socket.send_multipart(reply.iter(), 0)).is_err() {
            return;
        }
    }
}

/// The answer to one ZAP request (RFC 27): version, request id, status code and text, user id,
/// metadata.
fn zap_reply(request: &[Vec<u8>], allowed: &[u8; 32]) -> Vec<Vec<u8>> {
    let id = request.get(1).cloned().unwrap_or_default();
    let (code, text): (&[u8], &[u8]) = match request {
        [version, _id, _domain, _address, _identity, mechanism, key] if version == b"1.0" => {
            if mechanism == b"CURVE" && key.as_slice() == allowed {
                (b"200", b"OK")
            } else {
                (b"400", b"not the cluster's key")
            }
        }
        _ => (b"500", b"malformed request"),
    };
    vec![b"1.0".to_vec(), id, code.to_vec(), text.to_vec(), Vec::new(), Vec::new()]
}

/// Z85's alphabet (ZeroMQ RFC 32).
const Z85: &[u8; 85] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

fn z85_encode(bytes: &[u8; 32]) -> String {
    let mut out = String::with_capacity(Z85_KEY_LEN);
    for chunk in bytes.chunks_exact(4) {
        let mut value = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let mut digits = [0u8; 5];
        for d in digits.iter_mut().rev() {
            *d = Z85[(value % 85) as usize];
            value /= 85;
        }
        out.extend(digits.iter().map(|&c| c as char));
    }
    out
}

/// A 32-byte key from its Z85 text; `None` for anything else (ZeroMQ's own decoder takes
/// characters outside the alphabet, so it is not used).
/// The CURVE public key of `secret` (libzmq's `zmq_curve_public`); `None` where libzmq
/// cannot derive it.
#[allow(unsafe_code)]
fn curve_public(secret: &[u8; 32]) -> Option<[u8; 32]> {
    let mut secret_z85 = z85_encode(secret).into_bytes();
    secret_z85.push(0);
    let mut public_z85 = [0u8; Z85_KEY_LEN + 1];
    // SAFETY: both buffers are 41 bytes, a Z85 key and its NUL, as the call requires; it
    // reads the secret's and writes the public's.
    let rc = unsafe { zmq_sys::zmq_curve_public(public_z85.as_mut_ptr().cast(), secret_z85.as_ptr().cast()) };
    let text = std::str::from_utf8(&public_z85[..Z85_KEY_LEN]).ok()?;
    if rc == 0 {
        z85_decode_key(text)
    } else {
        None
    }
}

fn z85_decode_key(text: &str) -> Option<[u8; 32]> {
    let text = text.as_bytes();
    if text.len() != Z85_KEY_LEN {
        return None;
    }
    let mut key = [0u8; 32];
    for (chunk, out) in text.chunks_exact(5).zip(key.chunks_exact_mut(4)) {
        let mut value: u32 = 0;
        for &c in chunk {
            let digit = Z85.iter().position(|&z| z == c)? as u32;
            value = value.checked_mul(85)?.checked_add(digit)?;
        }
        out.copy_from_slice(&value.to_be_bytes());
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        crate::testing::scratch("auth", name)
    }

    #[test]
    fn libzmq_has_curve() {
        assert_eq!(zmq::has("curve"), Some(true), "libzmq was built without libsodium (third_party/zmq-sys)");
    }

    #[test]
    fn z85_matches_zeromq() {
        // RFC 32's test vector, and a generated key through ZeroMQ's own encoder.
        let rfc = [0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B];
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&rfc);
        assert!(z85_encode(&key).starts_with("HelloWorld"));
        let k = ClusterKey::generate().unwrap();
        assert_eq!(z85_encode(&k.public), zmq::z85_encode(&k.public).unwrap());
        assert_eq!(z85_decode_key(&z85_encode(&k.secret)), Some(k.secret));
    }

    #[test]
    fn a_key_file_reads_back_and_hides_its_secret_in_debug() {
        let k = ClusterKey::generate().unwrap();
        assert_eq!(ClusterKey::parse(&k.to_file_text()), Ok(k.clone()));
        let shown = format!("{k:?}");
        assert!(shown.contains(&k.public_z85()) && !shown.contains(&z85_encode(&k.secret)), "{shown}");
        assert_ne!(ClusterKey::generate().unwrap(), k);
    }

    #[test]
    fn malformed_key_files_are_errors_naming_the_line() {
        let k = ClusterKey::generate().unwrap();
        let (p, s) = (format!("public-key = {}", k.public_z85()), format!("secret-key = {}", z85_encode(&k.secret)));
        let other_secret = format!("secret-key = {}", z85_encode(&ClusterKey::generate().unwrap().secret));
        let cases: Vec<(String, KeyFormatError)> = vec![
            (String::new(), KeyFormatError::Missing { name: PUBLIC }),
            (format!("{p}\n"), KeyFormatError::Missing { name: SECRET }),
            (format!("{p}\nhello\n{s}"), KeyFormatError::NotAssignment { line: 2 }),
            (format!("{p}\n{p}\n{s}"), KeyFormatError::Duplicate { line: 2, name: PUBLIC }),
            (format!("# c\ncolour = blue\n{s}"), KeyFormatError::UnknownName { line: 2, name: "colour".into() }),
            (format!("{p}\nsecret-key = short"), KeyFormatError::BadKey { line: 2, name: SECRET }),
            // Right length, a character outside Z85.
            (format!("{p}\nsecret-key = {}", "\"".repeat(40)), KeyFormatError::BadKey { line: 2, name: SECRET }),
            // Right length and alphabet, a 5-character group over 2^32.
            (format!("{p}\nsecret-key = {}", "#".repeat(40)), KeyFormatError::BadKey { line: 2, name: SECRET }),
            // Multi-byte characters (40 bytes, not 40 characters) never split a character.
            (format!("{p}\nsecret-key = {}", "é".repeat(20)), KeyFormatError::BadKey { line: 2, name: SECRET }),
            // Another pair's secret, or the halves swapped: a mismatch, named at the public key.
            (format!("# c\n{p}\n{}", other_secret), KeyFormatError::Mismatch { line: 2 }),
            (
                format!("public-key = {}\nsecret-key = {}", z85_encode(&k.secret), k.public_z85()),
                KeyFormatError::Mismatch { line: 1 },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(ClusterKey::parse(&text), Err(want), "{text:?}");
        }
        // Arbitrary bytes never panic.
        for seed in 0u64..2000 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let text: String = (0..(seed % 97))
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    [' ', '=', '#', '\n', 'a', '-', 'k', '\u{e9}', '0', '.'][(x % 10) as usize]
                })
                .collect();
            let _ = ClusterKey::parse(&format!("public-key{text}"));
        }
    }

    #[cfg(unix)]
    #[test]
    fn key_files_are_private_never_overwritten_and_checked_on_load() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = scratch("files");
        let path = d.join("sub").join("cluster.key");
        let k = ClusterKey::generate().unwrap();
        k.save(&path, false).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777, 0o700);
        assert_eq!(ClusterKey::load(&path).unwrap(), k);
        let other = ClusterKey::generate().unwrap();
        let e = other.save(&path, false).unwrap_err();
        assert!(matches!(e, KeyError::Exists { .. }), "{e}");
        assert_eq!(ClusterKey::load(&path).unwrap(), k, "a refused overwrite changed the file");
        other.save(&path, true).unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap(), other);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("can be read by other users (mode 644)") && e.contains("chmod 600"), "{e}");
        let e = ClusterKey::load(&d.join("missing.key")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the key file") && e.contains("missing.key"), "{e}");
        let junk = d.join("junk.key");
        crate::endpoint::write_private(&junk, &[0xff; 10]).unwrap();
        let e = ClusterKey::load(&junk).unwrap_err().to_string();
        assert!(e.contains("junk.key is not a gt cluster key file") && e.contains("not text"), "{e}");
        crate::endpoint::write_private(&junk, &vec![b'#'; 70_000]).unwrap();
        assert!(ClusterKey::load(&junk).unwrap_err().to_string().contains("larger than"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn zap_lets_in_only_the_clusters_curve_key() {
        let k = ClusterKey::generate().unwrap();
        let req = |mech: &[u8], key: &[u8]| -> Vec<Vec<u8>> {
            [&b"1.0"[..], b"7", b"", b"127.0.0.1", b"", mech, key].iter().map(|f| f.to_vec()).collect()
        };
        let code = |reply: Vec<Vec<u8>>| (reply[1].clone(), reply[2].clone());
        assert_eq!(code(zap_reply(&req(b"CURVE", &k.public), &k.public)), (b"7".to_vec(), b"200".to_vec()));
        assert_eq!(code(zap_reply(&req(b"CURVE", &k.secret), &k.public)).1, b"400");
        assert_eq!(code(zap_reply(&req(b"PLAIN", &k.public), &k.public)).1, b"400");
        assert_eq!(code(zap_reply(&[b"2.0".to_vec()], &k.public)).1, b"500");
        assert_eq!(code(zap_reply(&[], &k.public)).1, b"500");
    }
}
