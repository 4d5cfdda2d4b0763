//! The list of deliberate differences in docs/daemon.md, read and compared with what the
//! differential test observed: every observed difference must be listed, with exactly
//! the steps it occurs in, and every listed one must still occur.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use super::corpus::{Admitted, Corpus};

/// Where the list begins and ends in docs/daemon.md.
pub const BEGIN: &str = "<!-- differential-test differences: begin -->";
pub const END: &str = "<!-- differential-test differences: end -->";

/// Written in the steps column for a difference in every step the route exists in.
const EVERY_STEP: &str = "every step";

/// One route whose `Admitted` condition differs between the two routers after a step.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub case: String,
    pub step: &'static str,
    pub router: Admitted,
    pub certwatch: Admitted,
}

/// A difference: a case, the router's answer and certwatch's.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Difference {
    pub case: String,
    pub router: Admitted,
    pub certwatch: Admitted,
}

/// The documented list: each difference with the steps it occurs in.
#[derive(Clone, Debug, Default)]
pub struct Documented {
    pub rows: BTreeMap<Difference, Steps>,
}

/// The steps a difference occurs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Steps {
    Every,
    Only(BTreeSet<String>),
}

pub fn daemon_md() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/daemon.md")
}

impl Documented {
    /// Reads the list from docs/daemon.md.
    pub fn read() -> Self {
        let path = daemon_md();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
        Self::parse(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    /// Parses the table between [`BEGIN`] and [`END`]: `| case | steps | OpenShift
    /// router | certwatch | why |`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let start = text
            .find(BEGIN)
            .ok_or_else(|| format!("no {BEGIN:?} marker"))?;
        let end = text[start..]
            .find(END)
            .ok_or_else(|| format!("no {END:?} marker"))?;
        let mut rows = BTreeMap::new();
        for line in text[start + BEGIN.len()..start + end].lines() {
            let line = line.trim();
            if !line.starts_with('|') || line.starts_with("|---") || line.starts_with("| case") {
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [case, steps, router, certwatch, why] = cells[..] else {
                return Err(format!(
                    "a row of the differences must have 5 cells: {line}"
                ));
            };
            if why.is_empty() {
                return Err(format!("a difference without its reason: {line}"));
            }
            let parse = |cell: &str| {
                Admitted::parse(cell)
                    .ok_or_else(|| format!("not an Admitted condition: {cell:?} in {line}"))
            };
            let difference = Difference {
                case: case.trim_matches('`').to_owned(),
                router: parse(router)?,
                certwatch: parse(certwatch)?,
            };
            let steps = if steps == EVERY_STEP {
                Steps::Every
            } else {
                Steps::Only(
                    steps
                        .split(',')
                        .map(|step| step.trim().trim_matches('`').to_owned())
                        .collect(),
                )
            };
            if rows.insert(difference, steps).is_some() {
                return Err(format!("a difference listed twice: {line}"));
            }
        }
        Ok(Self { rows })
    }

    /// What certwatch is documented to write for `case` after `step` when the router
    /// wrote `router`.
    pub fn certwatch_for(
        &self,
        corpus: &Corpus,
        case: &str,
        step: &str,
        router: &Admitted,
    ) -> Option<Admitted> {
        self.rows.iter().find_map(|(difference, steps)| {
            (difference.case == case
                && difference.router == *router
                && steps_of(corpus, case, steps).contains(step))
            .then(|| difference.certwatch.clone())
        })
    }
}

/// The steps `steps` names for `case` ([`Steps::Every`]: every step it exists in).
fn steps_of(corpus: &Corpus, case: &str, steps: &Steps) -> BTreeSet<String> {
    match steps {
        Steps::Only(steps) => steps.clone(),
        Steps::Every => existing_steps(corpus, case),
    }
}

/// The steps after which `case` exists (from the step that creates it to the step
/// before the one that deletes it).
fn existing_steps(corpus: &Corpus, case: &str) -> BTreeSet<String> {
    let mut exists = false;
    let mut steps = BTreeSet::new();
    for step in &corpus.steps {
        if step.gone.iter().any(|gone| gone == case) {
            exists = false;
        }
        if step.actions.iter().any(
            |action| matches!(action, super::corpus::Action::PutRoute { name, .. } if name == case),
        ) {
            exists = true;
        }
        if exists {
            steps.insert(step.id.to_owned());
        }
    }
    steps
}

/// Compares what was observed with the list; returns what does not agree (empty: all
/// does), with the rows the list should have.
pub fn compare(corpus: &Corpus, documented: &Documented, findings: &[Finding]) -> Vec<String> {
    let mut observed: BTreeMap<Difference, BTreeSet<String>> = BTreeMap::new();
    for finding in findings {
        observed
            .entry(Difference {
                case: finding.case.clone(),
                router: finding.router.clone(),
                certwatch: finding.certwatch.clone(),
            })
            .or_default()
            .insert(finding.step.to_owned());
    }
    let mut problems = Vec::new();
    for (difference, steps) in &observed {
        match documented.rows.get(difference) {
            None => problems.push(format!(
                "not in docs/daemon.md's list: {} in {} (router {}, certwatch {})",
                difference.case,
                join(steps),
                difference.router,
                difference.certwatch
            )),
            Some(listed) => {
                let listed = steps_of(corpus, &difference.case, listed);
                if listed != *steps {
                    problems.push(format!(
                        "{} (router {}, certwatch {}) occurs in {}, docs/daemon.md lists {}",
                        difference.case,
                        difference.router,
                        difference.certwatch,
                        join(steps),
                        join(&listed)
                    ));
                }
            }
        }
    }
    for difference in documented.rows.keys() {
        if !observed.contains_key(difference) {
            problems.push(format!(
                "listed in docs/daemon.md but no longer observed: {} (router {}, certwatch {}): remove it",
                difference.case, difference.router, difference.certwatch
            ));
        }
    }
    if !problems.is_empty() {
        let mut table = String::from("the list as observed (the why column is yours to write):\n");
        for (difference, steps) in &observed {
            let every = existing_steps(corpus, &difference.case);
            let steps = if *steps == every {
                EVERY_STEP.to_owned()
            } else {
                in_corpus_order(corpus, steps)
            };
            let _ = writeln!(
                table,
                "| `{}` | {steps} | {} | {} | … |",
                difference.case, difference.router, difference.certwatch
            );
        }
        problems.push(table);
    }
    problems
}

fn join(steps: &BTreeSet<String>) -> String {
    steps.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// `steps` in the corpus's order, each in backticks.
fn in_corpus_order(corpus: &Corpus, steps: &BTreeSet<String>) -> String {
    corpus
        .steps
        .iter()
        .filter(|step| steps.contains(step.id))
        .map(|step| format!("`{}`", step.id))
        .collect::<Vec<_>>()
        .join(", ")
}
