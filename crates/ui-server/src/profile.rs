//! The request page's flame graph: a request's critical path with the CPU
//! samples of `deepspan record --profile`, as a tree of on- and off-CPU
//! frames (`deepspan_profile`, the same stacks `deepspan profile` writes
//! as pprof).
//!
//! The samples and the symbolizer are loaded on the first profile asked
//! for, once per server: a run's samples can be large and most visits
//! never look at a flame graph. They live on a thread of their own
//! (blazesym's symbolizer cannot move between threads), which answers one
//! request's path at a time and keeps its symbol caches between them.

use std::path::PathBuf;
use std::sync::{mpsc, OnceLock};

use deepspan_profile::{
    add_request, read_samples, FlameNode, FlameTree, PathPiece, SampleIndex, Symbols, Totals,
};
use serde_json::Value;

use crate::data::{DataError, Piece, RunData, RunDir, NONE};

/// Where a run keeps its samples, as its manifest says.
#[derive(Clone, Debug)]
struct Recorded {
    dir: PathBuf,
    hz: u64,
    lost: u64,
}

/// A path to turn into a flame tree, and where to send it.
struct Job {
    root: String,
    path: Vec<PathPiece>,
    reply: mpsc::Sender<Result<(FlameNode, Totals, Option<String>), String>>,
}

/// The run's CPU samples, if it was recorded with `--profile`.
pub struct Profiles {
    recorded: Option<Recorded>,
    /// The profiling thread, started on first use.
    worker: OnceLock<mpsc::Sender<Job>>,
}

/// One request's flame graph.
pub struct RequestProfile {
    /// The request's frame (`[service] operation`) and everything above it.
    pub tree: FlameNode,
    pub totals: Totals,
    pub hz: u64,
    /// What the reader of the graph should know (a cut samples file, lost samples).
    pub notes: Vec<String>,
}

impl Profiles {
    /// Reads the manifest's `profile` entry; the samples wait for [`Profiles::request`].
    pub fn open(dir: &RunDir) -> Result<Profiles, DataError> {
        let recorded = match dir.file("manifest.json") {
            Err(_) => None,
            Ok(path) => {
                let text = std::fs::read(&path).map_err(|e| {
                    DataError::Missing(format!("cannot read {}: {e}", path.display()))
                })?;
                let manifest: Value = serde_json::from_slice(&text).map_err(|e| {
                    DataError::Bad(format!("{} is not valid JSON: {e}", path.display()))
                })?;
                match manifest["profile"]["dir"].as_str() {
                    None => None,
                    Some(rel) => Some(Recorded {
                        // Through RunDir::file: a manifest cannot point outside the run.
                        dir: dir.file(rel)?,
                        hz: manifest["profile"]["hz"].as_u64().unwrap_or(0),
                        lost: manifest["profile"]["lost"].as_u64().unwrap_or(0),
                    }),
                }
            }
        };
        Ok(Profiles {
            recorded,
            worker: OnceLock::new(),
        })
    }

    /// Whether the run has CPU samples.
    pub fn recorded(&self) -> bool {
        self.recorded.is_some()
    }

    /// The profiling thread: reads the samples once, then answers jobs
    /// (each with the load error, if reading failed).
    fn worker(&self, recorded: &Recorded) -> &mpsc::Sender<Job> {
        self.worker.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let dir = recorded.dir.clone();
            std::thread::Builder::new()
                .name("ui-profile".into())
                .spawn(move || {
                    let loaded = read_samples(&dir)
                        .map(|s| (SampleIndex::new(s.samples), s.truncated))
                        .map_err(|e| e.to_string());
                    let mut symbols = Symbols::open(&dir);
                    for job in rx {
                        let answer = match &loaded {
                            Err(e) => Err(e.clone()),
                            Ok((index, truncated)) => {
                                let mut tree = FlameTree::new();
                                let totals = add_request(
                                    &mut tree,
                                    &job.root,
                                    &job.path,
                                    index,
                                    &mut symbols,
                                );
                                Ok((tree.finish(), totals, truncated.clone()))
                            }
                        };
                        // The asker may have gone (a closed page): nothing to do.
                        let _ = job.reply.send(answer);
                    }
                })
                .expect("spawn the profiling thread");
            tx
        })
    }

    /// The flame graph of request `span_id`. Blocking: the first call
    /// reads the samples, and symbolization reads ELF files.
    pub fn request(
        &self,
        data: &RunData,
        span_id: &str,
        request: &Value,
    ) -> Result<RequestProfile, String> {
        let recorded = self
            .recorded
            .as_ref()
            .ok_or_else(|| "this run has no CPU samples".to_string())?;
        let pieces = data.paths.get(span_id).map(Vec::as_slice).unwrap_or(&[]);
        let path: Vec<PathPiece> = pieces.iter().map(|p| path_piece(data, p)).collect();
        let root = format!(
            "[{}] {}",
            request["service"].as_str().unwrap_or("?"),
            request["operation"].as_str().unwrap_or("?")
        );
        let (reply, answer) = mpsc::channel();
        let job = Job {
            root: root.clone(),
            path,
            reply,
        };
        let gone = || "the profiling thread stopped".to_string();
        self.worker(recorded).send(job).map_err(|_| gone())?;
        let (all, totals, truncated) = answer.recv().map_err(|_| gone())??;
        let tree = all.children.into_iter().next().unwrap_or(FlameNode {
            name: root,
            ..FlameNode::default()
        });
        let mut notes: Vec<String> = truncated.into_iter().collect();
        if recorded.lost > 0 {
            notes.push(format!(
                "the kernel could not store {} CPU samples of this run",
                recorded.lost
            ));
        }
        Ok(RequestProfile {
            tree,
            totals,
            hz: recorded.hz,
            notes,
        })
    }
}

/// A piece as `deepspan_profile` takes it; a blocking request is named by
/// its `[service] operation` when the run has it (its span id otherwise).
fn path_piece(data: &RunData, p: &Piece) -> PathPiece {
    let name = |i: u32| if i == NONE { None } else { data.strings.get(i) };
    let text = |i| name(i).map(str::to_string);
    let blocked_by_request = name(p.blocked_by_request).map(|id| match data.request(id) {
        Some(r) => format!(
            "[{}] {}",
            r["service"].as_str().unwrap_or("?"),
            r["operation"].as_str().unwrap_or("?")
        ),
        None => id.to_string(),
    });
    PathPiece {
        start_ns: p.start.max(0) as u64,
        end_ns: p.end.max(0) as u64,
        state: text(p.state).unwrap_or_else(|| "UNKNOWN".into()),
        tid: p.tid.map(i64::from),
        comm: text(p.comm),
        syscall: text(p.syscall),
        blocked_by_request,
        throttled_ns: p.throttled_ns.max(0) as u64,
    }
}
