//! What one HAProxy process holds of certwatch's certificates, and the runtime API
//! commands that bring it to what the crt-list says, certificate by certificate.
//!
//! [`Known`] is what certwatch knows of one process ([`Instance`]): per certificate
//! name, what it holds ([`Held`]: the bundle's digest when certwatch pushed it or the
//! process loaded it from a file certwatch wrote, the server certificate's SHA-1 when
//! read from `show ssl cert <name>`, or nothing known), and its crt-list lines.
//!
//! [`plan`] turns one certificate's wanted state and its known state into commands,
//! each tagged with its [`Step`], and [`Known::apply`] reads each answer back into the
//! knowledge, so that a batch of many certificates' commands, pipelined, updates
//! exactly what succeeded. Every certificate stands alone: one that HAProxy refuses
//! (its key, its size) fails its own steps only.
//!
//! | wanted | known | commands |
//! |---|---|---|
//! | a line, new certificate | nothing | `new ssl cert`, `set ssl cert` (payload), `commit ssl cert`, `add ssl crt-list` |
//! | a line, new material | other material | `set ssl cert`, `commit ssl cert` |
//! | a line, new options or filter | another line | `del ssl crt-list`, `add ssl crt-list` |
//! | no line | a certificate, lines | `del ssl crt-list` (each line), `del ssl cert` |

use std::collections::HashMap;

use route_secrets::tls::ValidatedTls;

use super::crt_list::normalize_shown;
use super::runtime::{Command, Instance, Payload, Reply};
use crate::cert_dir::CrtEntry;
use crate::files::first_certificate_der;

/// What a process holds under a certificate name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The bundle with this SHA-256 (pushed by certwatch, or loaded from its file).
    Bundle([u8; 32]),
    /// A certificate whose server certificate has this SHA-1 (read back from HAProxy;
    /// its chain and key are not known).
    Leaf([u8; 20]),
    /// Something, or an empty store: not known what.
    Unknown,
}

impl Held {
    /// Whether this is `entry`'s material.
    pub fn matches(&self, entry: &CrtEntry) -> bool {
        match self {
            Self::Bundle(digest) => *digest == entry.digest,
            Self::Leaf(sha1) => leaf_sha1(&entry.tls).as_ref() == Some(sha1),
            Self::Unknown => false,
        }
    }
}

/// One crt-list line as a process holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLine {
    /// Its number in `show ssl crt-list -n` (`None`: added since, not known).
    pub number: Option<u32>,
    /// Options and filter, normalized ([`normalize_shown`]).
    pub rest: String,
}

/// What certwatch knows one process holds of its certificates.
#[derive(Clone, Debug)]
pub struct Known {
    /// The process.
    pub instance: Instance,
    /// Certificate name → what it holds.
    pub certs: HashMap<String, Held>,
    /// Certificate name → its lines in certwatch's crt-list.
    pub lines: HashMap<String, Vec<HeldLine>>,
    /// Set when an answer contradicted the knowledge: read it again before the next
    /// batch.
    pub stale: bool,
}

/// A step of bringing one certificate to its wanted state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `new ssl cert`.
    New,
    /// `set ssl cert` with the bundle.
    Set,
    /// `commit ssl cert`, completing the update to `digest`.
    Commit,
    /// `add ssl crt-list`.
    AddLine,
    /// `del ssl crt-list` of one line (by number) or of the name's only line.
    DeleteLine,
    /// `del ssl cert`.
    Delete,
    /// `abort ssl cert` (a leftover transaction).
    Abort,
}

impl Step {
    /// The command's name, for metrics.
    pub fn command(self) -> &'static str {
        match self {
            Self::New => "new ssl cert",
            Self::Set => "set ssl cert",
            Self::Commit => "commit ssl cert",
            Self::AddLine => "add ssl crt-list",
            Self::DeleteLine => "del ssl crt-list",
            Self::Delete => "del ssl cert",
            Self::Abort => "abort ssl cert",
        }
    }

    /// Whether `reply` says the step succeeded (the CLI has no status codes: each
    /// command's success message, as HAProxy 2.6 prints it).
    pub fn succeeded(self, reply: &Reply) -> bool {
        match self {
            Self::New => reply.contains("New empty certificate store"),
            Self::Set => {
                reply.contains("Transaction created") || reply.contains("Transaction updated")
            }
            Self::Commit | Self::AddLine => reply.contains("Success!"),
            Self::DeleteLine => reply.contains("deleted in crtlist"),
            Self::Delete => reply.contains("deleted!"),
            Self::Abort => reply.contains("Transaction aborted"),
        }
    }
}

/// A planned command: which certificate, which step.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The certificate's name.
    pub name: String,
    /// The step.
    pub step: Step,
    /// The command.
    pub command: Command,
}

/// Why a certificate's plan could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unplannable {
    /// Its bundle does not fit in one runtime API request (`tune.bufsize`).
    TooLarge {
        /// The request's size.
        size: usize,
        /// HAProxy's limit.
        limit: usize,
    },
    /// A name with several lines whose numbers are not known: the lines must be read
    /// first.
    LinesUnknown,
}

/// The `set ssl cert` command for `entry`.
pub fn set_command(entry: &CrtEntry) -> Command {
    Command::with_payload(
        format!("set ssl cert {}", entry.name),
        Payload::new(entry.tls.pem_bundle().expose_secret().to_owned()),
    )
}

/// The commands that bring certificate `name` from what `known` says to `wanted`
/// (`None`: no line any more), on crt-list `list`; `max_request` is HAProxy's request
/// limit. Empty when nothing is to be done.
pub fn plan(
    name: &str,
    wanted: Option<&CrtEntry>,
    known: &Known,
    list: &str,
    max_request: usize,
) -> Result<Vec<Planned>, Unplannable> {
    let planned = |step: Step, command: Command| Planned {
        name: name.to_owned(),
        step,
        command,
    };
    let held = known.certs.get(name);
    let lines = known.lines.get(name).map_or(&[][..], Vec::as_slice);
    let mut out = Vec::new();
    let delete_lines = |out: &mut Vec<Planned>| -> Result<(), Unplannable> {
        match lines {
            [] => {}
            [_] => out.push(planned(
                Step::DeleteLine,
                Command::new(format!("del ssl crt-list {list} {name}")),
            )),
            many => {
                // Duplicates go one by one by number, the highest first, so that the
                // others keep theirs.
                let mut numbers = Vec::with_capacity(many.len());
                for line in many {
                    numbers.push(line.number.ok_or(Unplannable::LinesUnknown)?);
                }
                numbers.sort_unstable_by(|a, b| b.cmp(a));
                for number in numbers {
                    out.push(planned(
                        Step::DeleteLine,
                        Command::new(format!("del ssl crt-list {list} {name}:{number}")),
                    ));
                }
            }
        }
        Ok(())
    };
    match wanted {
        Some(entry) => {
            let upload = !held.is_some_and(|held| held.matches(entry));
            if upload {
                let set = set_command(entry);
                let size = set.request_size();
                if size > max_request {
                    return Err(Unplannable::TooLarge {
                        size,
                        limit: max_request,
                    });
                }
                if held.is_none() {
                    out.push(planned(
                        Step::New,
                        Command::new(format!("new ssl cert {name}")),
                    ));
                }
                out.push(planned(Step::Set, set));
                out.push(planned(
                    Step::Commit,
                    Command::new(format!("commit ssl cert {name}")),
                ));
            }
            let in_place = matches!(lines, [line] if line.rest == entry.line);
            if !in_place {
                delete_lines(&mut out)?;
                // Every line has an SNI filter: one without would capture every other
                // route's hosts.
                out.push(planned(
                    Step::AddLine,
                    Command::with_payload(
                        format!("add ssl crt-list {list}"),
                        Payload::new(format!("{name} {}", entry.line)),
                    ),
                ));
            }
        }
        None => {
            delete_lines(&mut out)?;
            if held.is_some() {
                out.push(planned(
                    Step::Delete,
                    Command::new(format!("del ssl cert {name}")),
                ));
            }
        }
    }
    Ok(out)
}

/// What an answer meant for a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The step succeeded.
    Done,
    /// HAProxy refused the certificate's material (its `new`, `set`, `commit` or
    /// `add ssl crt-list`): the certificate is refused until its material changes.
    MaterialRefused(String),
    /// Another step failed: the knowledge of this certificate was wrong; read it again.
    Failed(String),
    /// HAProxy could not do it now: its certificate operations were locked (another
    /// CLI session or HAProxy itself held them), or another certificate's transaction
    /// was open. Nothing changed; the step is tried again shortly.
    Busy,
}

/// Whether a refusal says that what certwatch knew of HAProxy was wrong (a certificate
/// missing or already there), rather than that the material cannot be used.
fn knowledge_error(reply: &Reply) -> bool {
    reply.contains("does not exist")
        || reply.contains("not found")
        || reply.contains("already exists")
        || reply.contains("Can't find")
}

/// Whether an answer says HAProxy could not act now, rather than that it refused.
fn busy(reply: &Reply) -> bool {
    reply.contains("currently locked") || reply.contains("The ongoing transaction is about")
}

impl Known {
    /// Knowledge of a process nothing is known of yet.
    pub fn new(instance: Instance) -> Self {
        Self {
            instance,
            certs: HashMap::new(),
            lines: HashMap::new(),
            stale: false,
        }
    }

    /// Records the answer to `planned` (for `wanted`, the certificate's wanted state
    /// when the plan was made).
    pub fn apply(
        &mut self,
        planned: &Planned,
        wanted: Option<&CrtEntry>,
        reply: &Reply,
    ) -> Applied {
        let name = &planned.name;
        if !planned.step.succeeded(reply) && busy(reply) {
            return Applied::Busy;
        }
        if !planned.step.succeeded(reply) {
            let message = reply.summary();
            return match planned.step {
                Step::Set => {
                    // Whatever the store held before is unchanged; an empty store
                    // created by `new` stays empty.
                    Applied::MaterialRefused(message)
                }
                Step::Commit => {
                    if reply.contains("No ongoing transaction") {
                        // Its `set` was refused (and reported).
                        return Applied::Done;
                    }
                    self.certs.insert(name.clone(), Held::Unknown);
                    Applied::MaterialRefused(message)
                }
                Step::Abort => Applied::Done,
                // A store or a line HAProxy cannot make from this material (a key its
                // OpenSSL security level refuses fails here, when the certificate's
                // context is built). One it says is missing, or already there, is
                // knowledge gone wrong instead.
                Step::New | Step::AddLine if !knowledge_error(reply) => {
                    Applied::MaterialRefused(message)
                }
                _ => {
                    self.stale = true;
                    Applied::Failed(message)
                }
            };
        }
        match planned.step {
            Step::New => {
                self.certs.insert(name.clone(), Held::Unknown);
            }
            Step::Set | Step::Abort => {}
            Step::Commit => {
                let held = wanted.map_or(Held::Unknown, |entry| Held::Bundle(entry.digest));
                self.certs.insert(name.clone(), held);
            }
            Step::AddLine => {
                if let Some(entry) = wanted {
                    self.lines.entry(name.clone()).or_default().push(HeldLine {
                        number: None,
                        rest: entry.line.clone(),
                    });
                }
            }
            Step::DeleteLine => {
                // Lines go in the plan's order; once the last is deleted the name has
                // none.
                if let Some(lines) = self.lines.get_mut(name) {
                    lines.pop();
                    if lines.is_empty() {
                        self.lines.remove(name);
                    }
                }
            }
            Step::Delete => {
                self.certs.remove(name);
            }
        }
        Applied::Done
    }

    /// Whether the certificate is as `wanted` says (`None`: absent, no line).
    pub fn holds(&self, name: &str, wanted: Option<&CrtEntry>) -> bool {
        let lines = self.lines.get(name).map_or(&[][..], Vec::as_slice);
        match wanted {
            Some(entry) => {
                self.certs.get(name).is_some_and(|held| held.matches(entry))
                    && matches!(lines, [line] if line.rest == entry.line)
            }
            None => lines.is_empty() && !self.certs.contains_key(name),
        }
    }
}

/// `show ssl cert`: committed certificate names, and names with a transaction open.
pub fn parse_certificates(answer: &str) -> (Vec<String>, Vec<String>) {
    let mut committed = Vec::new();
    let mut transactions = Vec::new();
    for line in answer.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix('*') {
            Some(name) => transactions.push(name.to_owned()),
            None => committed.push(line.to_owned()),
        }
    }
    (committed, transactions)
}

/// `show ssl crt-list -n <list>`: (name, number, rest) per line.
pub fn parse_crt_list(answer: &str) -> Vec<(String, u32, String)> {
    answer
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
            let (name, number) = head.rsplit_once(':')?;
            Some((name.to_owned(), number.parse().ok()?, normalize_shown(rest)))
        })
        .collect()
}

/// The SHA-1 fingerprint in a `show ssl cert <name>` answer (`None`: an empty store).
pub fn parse_sha1(answer: &str) -> Option<[u8; 20]> {
    answer.lines().find_map(|line| {
        let hex = line.trim().strip_prefix("SHA1 FingerPrint:")?.trim();
        parse_hex20(hex)
    })
}

fn parse_hex20(hex: &str) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let mut out = [0; 20];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// SHA-1 of the server certificate's DER, as `show ssl cert` prints it.
pub fn leaf_sha1(tls: &ValidatedTls) -> Option<[u8; 20]> {
    let der = first_certificate_der(tls.chain_pem())?;
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &der);
    let mut out = [0; 20];
    out.copy_from_slice(digest.as_ref());
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jiff::Timestamp;
    use route_secrets::route::RouteKey;
    use route_secrets::testing::{LeafSpec, Pki};
    use route_secrets::tls::TlsValidator;

    use super::*;
    use crate::cert_dir::bundle_digest;

    fn entry(pki: &Pki, name: &str, line: &str) -> CrtEntry {
        let now = Timestamp::now();
        let secret = pki
            .issue(&LeafSpec::new("a.example", now))
            .secret("ns", "s");
        let tls = Arc::new(
            TlsValidator::default()
                .validate_secret(&secret, Some("a.example"), now)
                .unwrap(),
        );
        CrtEntry {
            route: RouteKey::new("ns", "a"),
            name: name.to_owned(),
            line: line.to_owned(),
            digest: bundle_digest(&tls),
            tls,
        }
    }

    fn steps(plan: &[Planned]) -> Vec<Step> {
        plan.iter().map(|planned| planned.step).collect()
    }

    fn reply(text: &str) -> Reply {
        Reply::new(text)
    }

    #[test]
    fn plans_follow_the_table() {
        let pki = Pki::new(Timestamp::now());
        let wanted = entry(&pki, "/l/ns_a.pem", "a.example");
        let mut known = Known::new(Instance { pid: 1, started: 0 });
        let plan = |known: &Known, wanted: Option<&CrtEntry>| {
            plan("/l/ns_a.pem", wanted, known, "/crt-list", 16_383).unwrap()
        };
        assert_eq!(
            steps(&plan(&known, Some(&wanted))),
            [Step::New, Step::Set, Step::Commit, Step::AddLine]
        );
        // Each answer is recorded; then nothing is left to do.
        for planned in plan(&known.clone(), Some(&wanted)) {
            let text = match planned.step {
                Step::New => "New empty certificate store '/l/ns_a.pem'!\n",
                Step::Set => "Transaction created for certificate /l/ns_a.pem!\n",
                Step::Commit | Step::AddLine => "Success!\n",
                _ => unreachable!(),
            };
            assert_eq!(
                known.apply(&planned, Some(&wanted), &reply(text)),
                Applied::Done
            );
        }
        assert!(known.holds("/l/ns_a.pem", Some(&wanted)));
        assert!(plan(&known, Some(&wanted)).is_empty());

        // New material: set and commit only.
        let rotated = entry(&pki, "/l/ns_a.pem", "a.example");
        assert_eq!(
            steps(&plan(&known, Some(&rotated))),
            [Step::Set, Step::Commit]
        );
        // New options: the line is replaced.
        let alpn = CrtEntry {
            line: "[alpn h2,http/1.1] a.example".to_owned(),
            ..wanted.clone()
        };
        assert_eq!(
            steps(&plan(&known, Some(&alpn))),
            [Step::DeleteLine, Step::AddLine]
        );
        // Gone: its line, then the certificate.
        assert_eq!(steps(&plan(&known, None)), [Step::DeleteLine, Step::Delete]);
    }

    #[test]
    fn a_refused_certificate_fails_alone() {
        let pki = Pki::new(Timestamp::now());
        let wanted = entry(&pki, "/l/ns_a.pem", "a.example");
        let mut known = Known::new(Instance { pid: 1, started: 0 });
        let plan = plan("/l/ns_a.pem", Some(&wanted), &known, "/crt-list", 16_383).unwrap();
        let answers = [
            "New empty certificate store '/l/ns_a.pem'!\n",
            "unable to load the private key\nCan't update /l/ns_a.pem!\n",
            "No ongoing transaction! !\n",
            "Success!\n",
        ];
        let applied: Vec<Applied> = plan
            .iter()
            .zip(answers)
            .map(|(planned, text)| known.apply(planned, Some(&wanted), &reply(text)))
            .collect();
        assert!(matches!(applied[1], Applied::MaterialRefused(_)));
        assert_eq!(applied[2], Applied::Done);
        assert!(!known.stale);
        assert!(!known.holds("/l/ns_a.pem", Some(&wanted)));
    }

    /// A key below HAProxy's OpenSSL security level passes `set` and `commit` and fails
    /// when its line builds the SSL context: a refusal of that certificate, not a
    /// reason to read HAProxy again. A line naming a store HAProxy does not have is
    /// knowledge gone wrong instead.
    #[test]
    fn a_line_haproxy_cannot_build_is_refused() {
        let pki = Pki::new(Timestamp::now());
        let wanted = entry(&pki, "/l/ns_a.pem", "a.example");
        let mut known = Known::new(Instance { pid: 1, started: 0 });
        let plan = plan("/l/ns_a.pem", Some(&wanted), &known, "/crt-list", 16_383).unwrap();
        let answers = [
            "New empty certificate store '/l/ns_a.pem'!\n",
            "Transaction created for certificate /l/ns_a.pem!\n",
            "Committing /l/ns_a.pem\nSuccess!\n",
            "Inserting certificate '/l/ns_a.pem' in crt-list '/crt-list'.\n\
             unable to load SSL certificate into SSL Context '/l/ns_a.pem'.\nFailed!\n",
        ];
        let applied: Vec<Applied> = plan
            .iter()
            .zip(answers)
            .map(|(planned, text)| known.apply(planned, Some(&wanted), &reply(text)))
            .collect();
        assert_eq!(applied[..3], [Applied::Done, Applied::Done, Applied::Done]);
        assert!(
            matches!(applied[3], Applied::MaterialRefused(_)),
            "{applied:?}"
        );
        assert!(!known.stale);
        assert!(!known.holds("/l/ns_a.pem", Some(&wanted)));

        let mut known = Known::new(Instance { pid: 1, started: 0 });
        let add = plan
            .iter()
            .find(|planned| planned.step == Step::AddLine)
            .unwrap();
        let missing = known.apply(
            add,
            Some(&wanted),
            &reply("certificate '/l/ns_a.pem' does not exist!\n"),
        );
        assert!(matches!(missing, Applied::Failed(_)), "{missing:?}");
        assert!(known.stale);
    }

    /// HAProxy's certificate lock held by someone else is no refusal: nothing changes,
    /// and the step is tried again.
    #[test]
    fn a_locked_answer_is_busy_not_refused() {
        let pki = Pki::new(Timestamp::now());
        let wanted = entry(&pki, "/l/ns_a.pem", "a.example");
        let mut known = Known::new(Instance { pid: 1, started: 0 });
        known.certs.insert("/l/ns_a.pem".to_owned(), Held::Unknown);
        let plan = plan("/l/ns_a.pem", Some(&wanted), &known, "/crt-list", 16_383).unwrap();
        assert_eq!(steps(&plan)[..2], [Step::Set, Step::Commit]);
        let locked = reply(
            "Can't update the certificate! Operations on certificates are currently locked!\n",
        );
        assert_eq!(known.apply(&plan[0], Some(&wanted), &locked), Applied::Busy);
        let other = reply(
            "The ongoing transaction is about '/l/ns_b.pem' but you are trying to set '/l/ns_a.pem'\n",
        );
        assert_eq!(known.apply(&plan[0], Some(&wanted), &other), Applied::Busy);
        assert_eq!(known.apply(&plan[1], Some(&wanted), &locked), Applied::Busy);
        assert!(!known.stale);
        assert_eq!(known.certs["/l/ns_a.pem"], Held::Unknown);
    }

    #[test]
    fn an_oversized_bundle_cannot_be_planned() {
        let pki = Pki::new(Timestamp::now());
        let wanted = entry(&pki, "/l/ns_a.pem", "a.example");
        let known = Known::new(Instance { pid: 1, started: 0 });
        assert!(matches!(
            plan("/l/ns_a.pem", Some(&wanted), &known, "/crt-list", 100),
            Err(Unplannable::TooLarge { limit: 100, .. })
        ));
    }

    #[test]
    fn answers_of_show_commands_are_read() {
        let (committed, open) =
            parse_certificates("# transaction\n*/l/b.pem\n# filename\n/d.pem\n/l/a.pem\n");
        assert_eq!(committed, ["/d.pem", "/l/a.pem"]);
        assert_eq!(open, ["/l/b.pem"]);
        let lines = parse_crt_list(
            "# /crt-list\n/l/a.pem:1 a.example\n/l/b.pem:2 [alpn h2,http/1.1\0] b.example\n",
        );
        assert_eq!(
            lines[1],
            (
                "/l/b.pem".to_owned(),
                2,
                "[alpn h2,http/1.1] b.example".to_owned()
            )
        );
        let sha1 =
            parse_sha1("Serial: 1\nSHA1 FingerPrint: 13689085248A2C3ED52E16F44FBCADD61D93D7A9\n")
                .unwrap();
        assert_eq!((sha1[0], sha1[19]), (0x13, 0xA9));
        assert!(parse_hex20("1368").is_none());
    }
}
