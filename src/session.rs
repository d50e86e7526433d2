//! Where a program runs: an embedded cluster (a dispatcher and `GT_WORKERS` workers in this
//! process, over `inproc://`; the default) or a remote dispatcher (`--connect HOST:PORT`).
//! A [`Session`] holds the client and, when embedded, the cluster it talks to.

use anyhow::Context as _;
use gt_frontend::{Client, ClientOptions};
use gt_runtime::config::EnvConfig;
use gt_runtime::{Cluster, ClusterOptions};
use gt_transport::{ClusterKey, Endpoint};

/// Where to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// In this process, with this many workers (`None`: `GT_WORKERS`, default 1).
    Embedded {
        /// Workers.
        workers: Option<usize>,
    },
    /// A dispatcher elsewhere: `HOST:PORT` or an endpoint URL.
    Remote(String),
}

/// A connected client (and the embedded cluster behind it, if any).
pub struct Session {
    // Field order is drop order: the client says goodbye before the cluster stops.
    /// The client.
    pub client: Client,
    cluster: Option<Cluster>,
}

/// Client options from the environment (`GT_CLIENT_BATCH_SIZE`, `GT_CLIENT_WINDOW`,
/// `GT_CONNECT_TIMEOUT` in seconds, `GT_MAX_MESSAGE_BYTES`).
pub fn client_options(name: &str, env: &EnvConfig) -> anyhow::Result<ClientOptions> {
    let mut o = ClientOptions {
        name: name.to_string(),
        max_message_bytes: env.max_message_bytes,
        spin: env.spin,
        doorbell: env.doorbell,
        lane: env.lane,
        shared_reads: env.shared_reads,
        ..Default::default()
    };
    if let Some(n) = positive("GT_CLIENT_BATCH_SIZE")? {
        o.batch_size = n as usize;
    }
    if let Some(n) = positive("GT_CLIENT_WINDOW")? {
        o.window = n as usize;
    }
    if let Some(secs) = positive("GT_CONNECT_TIMEOUT")? {
        o.connect_timeout = std::time::Duration::from_secs(secs);
    }
    Ok(o)
}

/// The cluster key `env` names (`GT_KEY_FILE`, or `--key`), read now, so that a missing or
/// bad file is an error naming it.
pub fn cluster_key(env: &EnvConfig) -> anyhow::Result<Option<ClusterKey>> {
    Ok(env.key_file.as_deref().map(ClusterKey::load).transpose()?)
}

/// A whole number of at least 1 from the environment, if set.
fn positive(var: &str) -> anyhow::Result<Option<u64>> {
    let Ok(v) = std::env::var(var) else { return Ok(None) };
    let n = v.trim().parse().ok().filter(|n| *n >= 1);
    n.map(Some).with_context(|| format!("{var}={v:?}: expected a whole number of at least 1"))
}

impl Session {
    /// Starts or connects to the target and says hello, with the environment's settings.
    pub fn open(target: &Target, name: &str) -> anyhow::Result<Session> {
        Session::open_with(target, name, &EnvConfig::from_env()?)
    }

    /// As [`Session::open`], with these settings (the environment's, amended).
    pub fn open_with(target: &Target, name: &str, env: &EnvConfig) -> anyhow::Result<Session> {
        let options = client_options(name, env)?;
        match target {
            Target::Embedded { workers } => {
                let mut cluster_options = ClusterOptions::from_config(env);
                if let Some(n) = workers {
                    cluster_options.workers = *n;
                }
                let cluster = Cluster::start(cluster_options)?;
                for m in cluster.monitor() {
                    eprintln!("gt: monitor on {m}");
                }
                let client = Client::connect_in(cluster.context(), cluster.endpoint(), options)?;
                Ok(Session { client, cluster: Some(cluster) })
            }
            Target::Remote(address) => {
                let endpoint = Endpoint::parse(address)?;
                // Only a remote dispatcher needs the key: the embedded one is in-process.
                let options = ClientOptions { key: cluster_key(env)?, ..options };
                let client = Client::connect(&endpoint, options)?;
                Ok(Session { client, cluster: None })
            }
        }
    }

    /// The client and the embedded cluster (if any), to be dropped in that order.
    pub fn into_parts(self) -> (Client, Option<Cluster>) {
        (self.client, self.cluster)
    }

    /// A session again from [`Session::into_parts`].
    pub fn from_parts(client: Client, cluster: Option<Cluster>) -> Session {
        Session { client, cluster }
    }
}

/// The pass counters of a client stream, one line per pass.
pub fn format_pass_stats(stats: &[gt_transport::PassStats]) -> String {
    if stats.is_empty() {
        return "passes: none ran (GT_PASSES=none switched them off)\n".into();
    }
    let mut out = String::new();
    for p in stats {
        let counters: Vec<String> = p.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!("pass {}: {}\n", p.pass, counters.join(" ")));
    }
    out
}

/// The worker statistics as a table (the seeds' `print_worker_stats`).
pub fn format_worker_stats(stats: &[gt_transport::WorkerStats]) -> String {
    let mut out = String::new();
    for w in stats {
        out.push_str(&format!(
            "worker {} ({}): {} instructions in {} batches, {} failed, {} reads; holds {} values, {} bytes (peak {} bytes)\n",
            w.name, w.backend, w.instructions, w.batches, w.failures, w.reads, w.live_values, w.live_bytes, w.peak_bytes
        ));
        let total: u64 = w.ops.iter().map(|o| o.nanos).sum::<u64>().max(1);
        out.push_str(&format!("  {:<14} {:>10} {:>12} {:>10} {:>6}\n", "op", "count", "total ms", "mean us", "%"));
        for o in &w.ops {
            out.push_str(&format!(
                "  {:<14} {:>10} {:>12.3} {:>10.2} {:>5.1}%\n",
                o.op,
                o.count,
                o.nanos as f64 / 1e6,
                o.nanos as f64 / 1e3 / o.count.max(1) as f64,
                100.0 * o.nanos as f64 / total as f64
            ));
        }
    }
    out
}

/// `gt-run --dump-after PASS`: the embedded dispatcher's own pass dumps (`GT_DUMP_PASSES`,
/// the one mechanism: the stream each pass really emitted, not a replay), written into a
/// private directory (or the one `GT_DUMP_PASSES` names) and read back per pass.
pub struct PassDumps {
    dir: std::path::PathBuf,
    /// Made for this run (and removed after it), not the user's `GT_DUMP_PASSES`.
    ours: bool,
}

impl PassDumps {
    /// Points the dispatcher's dumps (`env.dump_passes`) at a directory before the session
    /// opens. A remote dispatcher writes its dumps on its own machine: an error says how.
    pub fn start(target: &Target, env: &mut EnvConfig) -> anyhow::Result<PassDumps> {
        if let Target::Remote(address) = target {
            anyhow::bail!(
                "the dispatcher at {address} writes pass dumps on its own machine: start `gt server` with GT_DUMP_PASSES=DIR and read them there"
            );
        }
        if let Some(dir) = &env.dump_passes {
            return Ok(PassDumps { dir: dir.clone(), ours: false });
        }
        let base = gt_transport::endpoint::ensure_runtime_dir().context("no private directory for the pass dumps")?;
        let dir = base.join(format!("dumps-{}", std::process::id()));
        // A directory left by an earlier process with this pid is stale.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
        env.dump_passes = Some(dir.clone());
        Ok(PassDumps { dir, ours: true })
    }

    /// The stream after each of `passes` for client `client`, as `.gtir` text (read after the
    /// session ended, when the dispatcher has written everything).
    pub fn read(&self, client: u64, passes: &[&'static str]) -> anyhow::Result<Vec<(&'static str, String)>> {
        passes
            .iter()
            .map(|pass| {
                let path = self.dir.join(format!("client-{client}.{pass}.gtir"));
                // No file: the pass emitted nothing.
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
                };
                // The first line is the file's header (`; client-1 after pass `fuse``).
                let body = text.split_once('\n').map_or("", |(_, rest)| rest);
                Ok((*pass, body.to_string()))
            })
            .collect()
    }
}

impl Drop for PassDumps {
    fn drop(&mut self) {
        if self.ours {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
