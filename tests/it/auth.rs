//! The cluster key with real processes: `gt keygen` files, a keyed `gt server` with keyed
//! `gt worker`s and clients computing over TCP (collectives between workers included), peers
//! without the key or with another one kept out with a clear error while the server goes on
//! serving, and a server beyond the loopback refusing to start without a key unless told
//! `--insecure`.

use crate::distributed::{free_port, gt_run, server, Proc};
use gt::frontend::{Client, ClientError, ClientOptions, Origin};
use gt::ir::{Instr, TensorType, ValueId};
use gt::transport::{zmq, ClusterKey, Endpoint};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    crate::scratch("auth", name)
}

fn gt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gt")).args(args).output().unwrap()
}

/// A new key file at `path`, through `gt keygen`.
fn keygen(path: &Path) -> String {
    let out = gt(&["keygen", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path.to_str().unwrap().to_string()
}

/// `gt worker` over TCP (never the IPC socket), with `key` if given.
fn worker_cmd(port: u16, key: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gt"));
    cmd.args(["worker", "--connect", &format!("tcp://127.0.0.1:{port}"), "--wait", "20", "--reconnect", "0"]);
    if let Some(k) = key {
        cmd.args(["--key", k]);
    }
    cmd
}

fn tcp(port: u16) -> Endpoint {
    Endpoint::parse(&format!("tcp://127.0.0.1:{port}")).unwrap()
}

fn client(port: u16, key: Option<&ClusterKey>) -> Result<Client, ClientError> {
    Client::connect(&tcp(port), ClientOptions { key: key.cloned(), ..ClientOptions::default() })
}

/// Waits until `n` workers have registered with the keyed server on `port`.
fn wait_for_workers(port: u16, key: &ClusterKey, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if client(port, Some(key)).unwrap().stats().unwrap().0.len() == n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} workers register");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn full(c: &mut Client, value: f64) -> Vec<f32> {
    let origin = Origin { op: "full", span: None };
    c.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![2]), value }, origin).unwrap();
    c.read(ValueId(0)).unwrap().to_f32()
}

#[cfg(unix)]
#[test]
fn gt_keygen_writes_a_private_file_and_never_overwrites_one() {
    use std::os::unix::fs::MetadataExt;
    let d = scratch("keygen");
    let path = d.join("cluster.key");
    keygen(&path);
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    let first = std::fs::read(&path).unwrap();
    let key = ClusterKey::load(&path).unwrap();
    let again = gt(&["keygen", path.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("already exists") && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), first, "a refused keygen changed the file");
    let forced = gt(&["keygen", "--force", path.to_str().unwrap()]);
    assert!(forced.status.success());
    assert_ne!(ClusterKey::load(&path).unwrap(), key);
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    // The default place: under XDG_CONFIG_HOME, in a private directory.
    let out = Command::new(env!("CARGO_BIN_EXE_gt")).arg("keygen").env("XDG_CONFIG_HOME", &d).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ClusterKey::load(&d.join("gt/cluster.key")).unwrap();
    assert_eq!(std::fs::metadata(d.join("gt")).unwrap().mode() & 0o777, 0o700);
    // A file that is not a key is an error naming it, for every member.
    std::fs::write(d.join("bad.key"), "public-key = nope\n").unwrap();
    let bad = d.join("bad.key").to_str().unwrap().to_string();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for args in [vec!["server", "--key", &bad], vec!["worker", "--key", &bad]] {
        let out = gt(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("bad.key is not a gt cluster key file") && err.contains("line 1"), "{err}");
    }
    let out = gt_run(&["--connect", "tcp://127.0.0.1:1", "--key", &bad, "examples/mlp.gtir"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.key is not a gt cluster key file"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_keyed_cluster_gives_the_embedded_numbers_over_tcp_with_collectives() {
    let d = scratch("keyed");
    let key_file = keygen(&d.join("cluster.key"));
    let key = ClusterKey::load(Path::new(&key_file)).unwrap();
    let port = free_port();
    let (_server, lines) = server(port, "127.0.0.1", &[("GT_KEY_FILE", &key_file)]);
    assert!(lines.iter().any(|l| l.contains("lets in over TCP only holders of")), "{lines:?}");
    assert!(lines.last().unwrap().ends_with(&format!("--key {key_file}")), "{lines:?}");
    let _workers: Vec<Proc> = (0..2).map(|_| Proc(worker_cmd(port, Some(&key_file)).spawn().unwrap())).collect();
    wait_for_workers(port, &key, 2);
    let address = format!("tcp://127.0.0.1:{port}");
    for example in ["examples/mlp.gtir", "examples/sharded.gtir"] {
        let embedded = gt_run(&[example]);
        assert!(embedded.status.success());
        let remote = gt_run(&["--connect", &address, "--key", &key_file, "--pass-stats", example]);
        assert!(remote.status.success(), "{}", String::from_utf8_lossy(&remote.stderr));
        assert_eq!(remote.stdout, embedded.stdout, "{example}");
        if example.contains("sharded") {
            // The workers exchanged data through their keyed peer sockets.
            let stats = String::from_utf8_lossy(&remote.stderr);
            assert!(stats.contains("collectives=") && !stats.contains("collectives=0 "), "{stats}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn peers_without_the_clusters_key_are_kept_out_and_told_so() {
    let d = scratch("outsiders");
    let key_file = keygen(&d.join("cluster.key"));
    let other_file = keygen(&d.join("other.key"));
    let (key, other) =
        (ClusterKey::load(Path::new(&key_file)).unwrap(), ClusterKey::load(Path::new(&other_file)).unwrap());
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[("GT_KEY_FILE", &key_file)]);
    let _worker = Proc(worker_cmd(port, Some(&key_file)).spawn().unwrap());
    wait_for_workers(port, &key, 1);
    let mut member = client(port, Some(&key)).unwrap();
    assert_eq!(full(&mut member, 1.5), vec![1.5f32; 2]);

    // Workers without the key, or with another one, are refused at once with the reason
    // (exit 2: nothing to run on), long before their 20 s wait.
    for k in [None, Some(other_file.as_str())] {
        let start = Instant::now();
        let out = worker_cmd(port, k).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("did not let this worker in") && err.contains("same key file"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    }
    // Clients likewise, through the API and through gt-run.
    for k in [None, Some(&other)] {
        let start = Instant::now();
        match client(port, k) {
            Err(e @ ClientError::Handshake { .. }) => assert!(e.to_string().contains("gt keygen"), "{e}"),
            Err(e) => panic!("expected a handshake failure, got {e}"),
            Ok(_) => panic!("a client without the cluster's key got in"),
        }
        assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    }
    let out = gt_run(&["--connect", &format!("tcp://127.0.0.1:{port}"), "examples/mlp.gtir"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did not let this client in"), "{stderr}");
    // A raw socket without CURVE sending garbage gets nothing back.
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::DEALER).unwrap();
    raw.set_linger(0).unwrap();
    raw.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    raw.send(&b"hello world"[..], 0).unwrap();
    assert_eq!(raw.poll(zmq::POLLIN, 1000).unwrap(), 0, "an outsider was answered");

    // Only the one keyed worker registered, and the member is still served.
    assert_eq!(member.stats().unwrap().0.len(), 1);
    assert_eq!(full(&mut member, 2.5), vec![2.5; 2]);
    assert_eq!(full(&mut client(port, Some(&key)).unwrap(), 3.5), vec![3.5; 2]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_server_beyond_the_loopback_needs_a_key_or_insecure() {
    let port = free_port();
    let out = gt(&["server", "--host", "0.0.0.0", "-p", &port.to_string()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on tcp://*:") && err.contains("gt keygen") && err.contains("--insecure"),
        "{err}"
    );
    // Told to, it starts (with a warning) and serves.
    let (_server, lines) = server(port, "0.0.0.0", &[("GT_INSECURE", "1")]);
    assert!(lines[0].contains(&format!("tcp://*:{port}")), "{lines:?}");
    let _worker = Proc(worker_cmd(port, None).spawn().unwrap());
    let mut c = Client::connect(&tcp(port), ClientOptions::default()).unwrap();
    assert_eq!(full(&mut c, 4.0), vec![4.0; 2]);
    // With a key, no flag is needed, and its TCP monitor lets in only the key's holders.
    let d = scratch("beyond");
    let key_file = keygen(&d.join("cluster.key"));
    let key = ClusterKey::load(Path::new(&key_file)).unwrap();
    let port = free_port();
    let (_server, lines) = server(port, "0.0.0.0", &[("GT_KEY_FILE", &key_file)]);
    let monitor = lines.iter().find_map(|l| l.strip_prefix("gt server monitor on tcp://*:")).expect("a TCP monitor");
    let monitor = format!("tcp://127.0.0.1:{monitor}");
    let _worker = Proc(worker_cmd(port, Some(&key_file)).spawn().unwrap());
    wait_for_workers(port, &key, 1);
    let ctx = zmq::Context::new();
    let subscribe = |k: Option<&ClusterKey>| {
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_linger(0).unwrap();
        sub.set_subscribe(b"").unwrap();
        gt::transport::socket::connect(&sub, &monitor, k).unwrap();
        sub
    };
    let (member, outsider) = (subscribe(Some(&key)), subscribe(None));
    let mut c = client(port, Some(&key)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while member.poll(zmq::POLLIN, 50).unwrap() == 0 {
        assert!(Instant::now() < deadline, "no events for the member on {monitor}");
        full(&mut c, 1.0);
    }
    full(&mut c, 1.0);
    assert_eq!(outsider.poll(zmq::POLLIN, 200).unwrap(), 0, "an outsider read the monitor");
    let _ = std::fs::remove_dir_all(&d);
}
