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

use deepspan_store::json::RequestEntry;
use std::path::PathBuf;
use std::sync::{mpsc, OnceLock};

use deepspan_profile::{
    add_request, read_samples, FlameNode, FlameTree, PathPiece, SampleIndex, Symbols, Totals,
};

use crate::data::{Piece, RequestPieces, RunData, RunDir};

/// Where a run keeps its samples, as its manifest says.
#[derive(Clone, Debug)]
struct Recorded {
    dir: PathBuf,
    hz: u64,
    lost: u64,
}

/// The whole tree (root `all`), the totals, a note on a cut samples file;
/// or why the samples could not be read.
type Answer = Result<(FlameNode, Totals, Option<String>), String>;

/// A path to turn into a flame tree, and where to send it.
struct Job {
    root: String,
    path: Vec<PathPiece>,
    reply: mpsc::Sender<Answer>,
}

/// The run's CPU samples, if it was recorded with `--profile`.
pub struct Profiles {
    /// None: recorded without `--profile`; Err: the manifest is unreadable.
    recorded: Result<Option<Recorded>, String>,
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
    /// Reads the manifest's `profile` entry; the samples wait for
    /// [`Profiles::request`]. A manifest that cannot be read does not stop
    /// the server: the flame graph endpoint says what is wrong instead.
    pub fn open(dir: &RunDir) -> Profiles {
        let recorded = match dir.file(deepspan_run::layout::MANIFEST) {
            Err(_) => Ok(None),
            Ok(_) => deepspan_run::Manifest::load_profile(dir.root())
                .map_err(|e| e.to_string())
                .and_then(|profile| match profile {
                    None => Ok(None),
                    Some(p) => Ok(Some(Recorded {
                        // Through RunDir::file: a manifest cannot point outside the run.
                        dir: dir.file(&p.dir).map_err(|e| e.to_string())?,
                        hz: p.hz,
                        lost: p.lost,
                    })),
                }),
        };
        Profiles {
            recorded,
            worker: OnceLock::new(),
        }
    }

    /// Whether the run was recorded with CPU samples (or its manifest
    /// could not be read, which [`Profiles::request`] reports).
    pub fn recorded(&self) -> bool {
        !matches!(self.recorded, Ok(None))
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
    /// reads the samples, symbolization reads ELF files, and the request's
    /// pieces may be read from disk.
    pub fn request(
        &self,
        data: &RunData,
        span_id: &str,
        request: &RequestEntry,
    ) -> Result<RequestProfile, String> {
        let recorded = self
            .recorded
            .clone()?
            .ok_or_else(|| "this run has no CPU samples".to_string())?;
        let pieces = data.pieces(span_id).map_err(|e| e.to_string())?;
        let path: Vec<PathPiece> = pieces
            .path
            .iter()
            .map(|p| path_piece(data, &pieces, p))
            .collect();
        let root = format!("[{}] {}", request.service, request.operation);
        let (reply, answer) = mpsc::channel();
        let job = Job {
            root: root.clone(),
            path,
            reply,
        };
        let gone = || "the profiling thread stopped".to_string();
        self.worker(&recorded).send(job).map_err(|_| gone())?;
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
fn path_piece(data: &RunData, names: &RequestPieces, p: &Piece) -> PathPiece {
    let name = |i: u32| names.name(i);
    let text = |i| name(i).map(str::to_string);
    let blocked_by_request = name(p.blocked_by_request).map(|id| match data.request(id) {
        Some(r) => format!("[{}] {}", r.service, r.operation),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run_with_manifest(manifest: &str) -> (tempfile::TempDir, RunDir) {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let files = deepspan_run::Run::new(&run);
        std::fs::create_dir_all(files.analysis_dir()).unwrap();
        std::fs::write(files.requests_json(), "{\"requests\": []}").unwrap();
        std::fs::write(files.manifest(), manifest).unwrap();
        std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
        std::fs::create_dir_all(files.profile_dir()).unwrap();
        let run_dir = RunDir::open(&run).unwrap();
        (dir, run_dir)
    }

    #[test]
    fn the_manifest_says_whether_there_are_samples_and_cannot_point_outside_the_run() {
        let (_d, run) = run_with_manifest("{}");
        let p = Profiles::open(&run);
        assert!(!p.recorded());

        let (_d, run) = run_with_manifest(
            r#"{"profile": {"dir": "profile", "hz": 99, "samples": 3, "lost": 0}}"#,
        );
        let p = Profiles::open(&run);
        assert!(p.recorded());
        let recorded = p.recorded.unwrap().unwrap();
        assert_eq!(
            (recorded.hz, recorded.dir.ends_with("run/profile")),
            (99, true)
        );

        // A manifest pointing outside the run, or unreadable: reported at the
        // endpoint (recorded() is true so that it answers), never followed.
        let (_d, run) = run_with_manifest(r#"{"profile": {"dir": "../elsewhere", "hz": 99}}"#);
        let p = Profiles::open(&run);
        assert!(p.recorded());
        assert!(
            matches!(&p.recorded, Err(e) if e.contains("outside the run folder")),
            "{:?}",
            p.recorded
        );
        let (_d, run) = run_with_manifest("{not json");
        let p = Profiles::open(&run);
        assert!(
            matches!(&p.recorded, Err(e) if e.contains("cannot read the run manifest")),
            "{:?}",
            p.recorded.err()
        );
    }
}
