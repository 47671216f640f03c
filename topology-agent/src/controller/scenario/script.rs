//! The golden scenarios' form: one file per scenario, a commented script of verbs followed by
//! the files it names, each after a `-- name --` line (the txtar layout Cilium's script tests and
//! Go's use). Input and expectation sit together; `UPDATE_GOLDEN=1` rewrites the expectations in
//! place and leaves the script and its inputs alone.
//!
//! The verbs, one per line (`#` starts a comment):
//!
//! | verb | what it does |
//! |---|---|
//! | `node NAME` | the agent's node (before the first `cluster`) |
//! | `capacities {…}` | the map capacities, as the agent's `--capacities` file spells them |
//! | `steering NAMESPACE/NAME ADDR` | the cluster DNS Service steered to the responder at ADDR |
//! | `cluster FILE` | the cluster becomes FILE's objects: the first is the watch's lists, later ones the events a watch brings (every object applied, those gone deleted) |
//! | `sync` | the controller decides what changed and programs it |
//! | `reconcile` | the loop's periodic job: the whole plan applied again, retrying the ports that failed |
//! | `plan FILE` | the plan, as `explain --output json` prints it, is FILE |
//! | `maps FILE` | the applies since the last `maps` and the maps' contents are FILE |
//! | `traffic ADDR[,ADDR…] connects=N closed=N latency_us=N [refused=N]` | each backend's load counters (cumulative, as the kernel's load signal keeps them) grow by one interval's traffic: connections started, ended with that lifetime, refused |
//! | `feedback` | the feedback controller's look, one interval after its last: the ports it moves are synced at once |
//! | `restart` | the agent stops and a new one starts over the same maps: it reads them back, adopts them, and lists the cluster again |
//! | `fault MAP` / `fault grace` / `fault none` | writes to MAP fail (as a full or broken kernel map makes them), or every RCU grace period wait does, or nothing does |

use std::{fmt, net::SocketAddr};

use topology_common::map_names;
use topology_dataplane::Capacities;
use topology_model::ObjectKey;

/// A scenario file: the script, and the files after it in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Archive {
    /// Everything before the first file: the script and its comments.
    pub script: String,
    /// (name, contents), in the order of the file.
    pub files: Vec<(String, String)>,
}

impl Archive {
    /// Reads the layout: a line `-- name --` starts a file, which runs to the next one.
    pub fn parse(text: &str) -> Self {
        let mut archive = Self { script: String::new(), files: Vec::new() };
        for line in text.split_inclusive('\n') {
            let marker = line.trim_end().strip_prefix("-- ").and_then(|rest| rest.strip_suffix(" --"));
            match (marker, archive.files.last_mut()) {
                (Some(name), _) => archive.files.push((name.trim().to_owned(), String::new())),
                (None, Some((_, contents))) => contents.push_str(line),
                (None, None) => archive.script.push_str(line),
            }
        }
        archive
    }

    /// The contents of file `name`.
    pub fn file(&self, name: &str) -> Option<&str> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, contents)| contents.as_str())
    }

    /// Sets file `name` to `contents`, in its place, or after the others if it is new.
    pub fn set(&mut self, name: &str, contents: String) {
        match self.files.iter_mut().find(|(n, _)| n == name) {
            Some((_, old)) => *old = contents,
            None => self.files.push((name.to_owned(), contents)),
        }
    }
}

impl fmt::Display for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.script)?;
        for (name, contents) in &self.files {
            writeln!(f, "-- {name} --")?;
            f.write_str(contents)?;
            if !contents.is_empty() && !contents.ends_with('\n') {
                f.write_str("\n")?;
            }
        }
        Ok(())
    }
}

/// One verb of a script (see the module's table).
#[derive(Clone, Debug, PartialEq)]
pub enum Verb {
    /// `node NAME`.
    Node(String),
    /// `capacities {…}`.
    Capacities(Capacities),
    /// `steering NAMESPACE/NAME ADDR`.
    Steering(ObjectKey, SocketAddr),
    /// `cluster FILE`.
    Cluster(String),
    /// `sync`.
    Sync,
    /// `reconcile`.
    Reconcile,
    /// `plan FILE`.
    Plan(String),
    /// `maps FILE`.
    Maps(String),
    /// `traffic …`.
    Traffic(Traffic),
    /// `feedback`.
    Feedback,
    /// `restart`.
    Restart,
    /// `fault …`.
    Fault(Fault),
}

impl Verb {
    /// The file of the archive the verb reads (`cluster`) or writes (`plan`, `maps`).
    pub fn file(&self) -> Option<&str> {
        match self {
            Self::Cluster(file) | Self::Plan(file) | Self::Maps(file) => Some(file),
            _ => None,
        }
    }
}

/// One interval's traffic to some backends (`traffic`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic {
    /// The backends, each of which had it all.
    pub backends: Vec<SocketAddr>,
    /// Handshakes started (the refused ones besides).
    pub connects: u64,
    /// Connections ended.
    pub closed: u64,
    /// How long each ended connection lasted, microseconds.
    pub latency_us: u64,
    /// Handshakes refused.
    pub refused: u64,
}

/// `traffic`'s arguments: the backends, then `name=value` counts.
fn traffic(args: &[&str]) -> Result<Traffic, String> {
    let usage = "`traffic` takes ADDR[,ADDR…] connects=N closed=N latency_us=N [refused=N]";
    let (first, counts) = args.split_first().ok_or(usage)?;
    let backends = first
        .split(',')
        .map(|backend| backend.parse().map_err(|error| format!("traffic: {backend:?}: {error}")))
        .collect::<Result<Vec<SocketAddr>, String>>()?;
    let mut traffic = Traffic { backends, connects: 0, closed: 0, latency_us: 0, refused: 0 };
    for count in counts {
        let (name, value) = count.split_once('=').ok_or(usage)?;
        let value: u64 = value.parse().map_err(|error| format!("traffic: {count:?}: {error}"))?;
        match name {
            "connects" => traffic.connects = value,
            "closed" => traffic.closed = value,
            "latency_us" => traffic.latency_us = value,
            "refused" => traffic.refused = value,
            _ => return Err(format!("traffic: no count {name:?} (connects, closed, latency_us, refused)")),
        }
    }
    Ok(traffic)
}

/// What `fault` makes fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Writes to this map.
    Map(&'static str),
    /// Waits for an RCU grace period.
    Grace,
    /// Nothing.
    None,
}

/// A verb and the line it is on (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Its line in the scenario file.
    pub line: usize,
    /// What it does.
    pub verb: Verb,
}

/// A script line that is no verb, or a verb with the wrong arguments.
#[derive(Debug, PartialEq, Eq)]
pub struct ScriptError {
    /// The line (1-based).
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The steps of `script`, or the first line that is not one.
pub fn parse(script: &str) -> Result<Vec<Step>, ScriptError> {
    let mut steps = Vec::new();
    for (at, text) in script.lines().enumerate() {
        let line = at + 1;
        let text = text.split_once('#').map_or(text, |(verb, _)| verb).trim();
        let Some((word, rest)) =
            text.split_once(char::is_whitespace).or(Some((text, ""))).filter(|(w, _)| !w.is_empty())
        else {
            continue;
        };
        let verb = verb(word, rest.trim()).map_err(|message| ScriptError { line, message })?;
        steps.push(Step { line, verb });
    }
    Ok(steps)
}

/// One verb from its word and the rest of its line.
fn verb(word: &str, rest: &str) -> Result<Verb, String> {
    let args: Vec<&str> = rest.split_whitespace().collect();
    let one = |what: &str| match args.as_slice() {
        [arg] => Ok((*arg).to_owned()),
        _ => Err(format!("`{word}` takes one argument, {what}; found {args:?}")),
    };
    let none = |verb: Verb| if args.is_empty() { Ok(verb) } else { Err(format!("`{word}` takes no argument")) };
    match word {
        "node" => one("the node's name").map(Verb::Node),
        "capacities" => {
            serde_yaml::from_str(rest).map(Verb::Capacities).map_err(|error| format!("capacities: {error}"))
        }
        "steering" => match args.as_slice() {
            [service, responder] => {
                let (namespace, name) =
                    service.split_once('/').ok_or_else(|| format!("steering: {service:?} is not namespace/name"))?;
                let responder = responder.parse().map_err(|error| format!("steering: {responder:?}: {error}"))?;
                Ok(Verb::Steering(ObjectKey::new(namespace, name), responder))
            }
            _ => Err("`steering` takes namespace/name and the responder's address".into()),
        },
        "cluster" => one("a file of cluster objects").map(Verb::Cluster),
        "sync" => none(Verb::Sync),
        "reconcile" => none(Verb::Reconcile),
        "plan" => one("the file the plan is").map(Verb::Plan),
        "maps" => one("the file the maps are").map(Verb::Maps),
        "traffic" => traffic(&args).map(Verb::Traffic),
        "feedback" => none(Verb::Feedback),
        "restart" => none(Verb::Restart),
        "fault" => match one("a map's name, grace or none")?.as_str() {
            "none" => Ok(Verb::Fault(Fault::None)),
            "grace" => Ok(Verb::Fault(Fault::Grace)),
            map => map_names::MAPS
                .iter()
                .find(|spec| spec.name == map)
                .map(|spec| Verb::Fault(Fault::Map(spec.name)))
                .ok_or_else(|| format!("fault: no map is named {map:?}")),
        },
        other => Err(format!(
            "no verb {other:?} (node, capacities, steering, cluster, sync, reconcile, plan, maps, traffic, feedback, restart, fault)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_round_trips_and_keeps_its_script() {
        let text = "# a comment\nsync\n-- a.yaml --\nx: 1\n-- b.plan --\n-- c --\nlast\n";
        let archive = Archive::parse(text);
        assert_eq!(archive.script, "# a comment\nsync\n");
        assert_eq!(archive.file("a.yaml"), Some("x: 1\n"));
        assert_eq!(archive.file("b.plan"), Some(""));
        assert_eq!(archive.to_string(), text);
        let mut changed = archive.clone();
        changed.set("b.plan", "{}\n".into());
        changed.set("d.maps", "m".into());
        assert_eq!(
            changed.to_string(),
            "# a comment\nsync\n-- a.yaml --\nx: 1\n-- b.plan --\n{}\n-- c --\nlast\n-- d.maps --\nm\n"
        );
    }

    #[test]
    fn verbs_parse_with_their_lines_and_bad_ones_are_named() {
        let steps =
            parse("# setup\nnode node-a  # ours\n\ncluster one.yaml\nsync\nfault topo_slots\nfault none\n").unwrap();
        let verbs: Vec<_> = steps.iter().map(|s| (s.line, s.verb.clone())).collect();
        assert_eq!(
            verbs,
            [
                (2, Verb::Node("node-a".into())),
                (4, Verb::Cluster("one.yaml".into())),
                (5, Verb::Sync),
                (6, Verb::Fault(Fault::Map("topo_slots"))),
                (7, Verb::Fault(Fault::None)),
            ]
        );
        let error = |script: &str| parse(script).unwrap_err().to_string();
        assert_eq!(
            error("sync\nsink\n"),
            "line 2: no verb \"sink\" (node, capacities, steering, cluster, sync, reconcile, plan, maps, traffic, feedback, restart, fault)"
        );
        assert_eq!(error("sync now"), "line 1: `sync` takes no argument");
        assert_eq!(error("fault topo_nothing"), "line 1: fault: no map is named \"topo_nothing\"");
        assert!(
            error("capacities {slots: x}").starts_with("line 1: capacities: "),
            "{}",
            error("capacities {slots: x}")
        );
        assert_eq!(error("steering kube-dns 1.2.3.4:53"), "line 1: steering: \"kube-dns\" is not namespace/name");
        let traffic = parse("traffic 10.0.1.1:80,10.0.1.2:80 connects=20 closed=10 latency_us=4000\nfeedback").unwrap();
        let want = Traffic {
            backends: vec!["10.0.1.1:80".parse().unwrap(), "10.0.1.2:80".parse().unwrap()],
            connects: 20,
            closed: 10,
            latency_us: 4000,
            refused: 0,
        };
        assert_eq!(traffic.iter().map(|s| s.verb.clone()).collect::<Vec<_>>(), [Verb::Traffic(want), Verb::Feedback]);
        assert_eq!(
            error("traffic 10.0.1.1:80 slow=1"),
            "line 1: traffic: no count \"slow\" (connects, closed, latency_us, refused)"
        );
        assert!(error("traffic web connects=1").starts_with("line 1: traffic: \"web\": "));
    }
}
