//! Consumer processes: the example's own binary started again (`current_exe`) with the
//! arguments of its consumer mode, their standard output read back as [`Event`]s, a process
//! killed with SIGKILL and started again, and a graceful stop by closing their standard
//! input.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::events::Event;

/// What the orchestrator hears from a consumer process.
#[derive(Debug)]
pub enum Heard {
    /// A line of its standard output that is an event.
    Event(Event),
    /// Its standard output closed: it exited, or was killed.
    Closed,
}

/// The consumer processes of one run, by name.
pub struct Fleet {
    program: PathBuf,
    arguments: Vec<OsString>,
    running: BTreeMap<String, Running>,
    sender: mpsc::UnboundedSender<(String, Heard)>,
    heard: mpsc::UnboundedReceiver<(String, Heard)>,
}

struct Running {
    child: Child,
    /// Closing it asks the process to stop (see [`until_stdin_closes`]).
    stdin: Option<ChildStdin>,
}

impl Fleet {
    /// Consumers started as this executable with `arguments` and then their name.
    ///
    /// # Errors
    /// The path of the running executable cannot be found.
    pub fn new<I, S>(arguments: I) -> std::io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let (sender, heard) = mpsc::unbounded_channel();
        Ok(Self {
            program: std::env::current_exe()?,
            arguments: arguments.into_iter().map(Into::into).collect(),
            running: BTreeMap::new(),
            sender,
            heard,
        })
    }

    /// Starts the consumer `name`. Its standard error goes to ours; its standard output is
    /// read line by line: events are heard, anything else is passed on to standard error.
    ///
    /// # Errors
    /// The process could not be started.
    pub fn start(&mut self, name: &str) -> std::io::Result<()> {
        let mut child = Command::new(&self.program)
            .args(&self.arguments)
            .arg(name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let sender = self.sender.clone();
        let owner = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match line.parse::<Event>() {
                    Ok(event) => {
                        let _ = sender.send((owner.clone(), Heard::Event(event)));
                    }
                    Err(_) => eprintln!("[{owner}] {line}"),
                }
            }
            let _ = sender.send((owner, Heard::Closed));
        });
        let stdin = child.stdin.take();
        self.running
            .insert(name.to_owned(), Running { child, stdin });
        Ok(())
    }

    /// The next thing a consumer said, or `None` after `wait` without any.
    pub async fn next(&mut self, wait: Duration) -> Option<(String, Heard)> {
        tokio::time::timeout(wait, self.heard.recv())
            .await
            .ok()
            .flatten()
    }

    /// Kills the consumer `name` with SIGKILL (on Unix `Child::kill` sends it): no handler
    /// finishes, no delivery is settled, no transaction commits. Returns once it is gone.
    ///
    /// # Errors
    /// It is not running, or the signal could not be sent.
    pub fn kill(&mut self, name: &str) -> std::io::Result<ExitStatus> {
        let mut running = self.running.remove(name).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("no consumer {name}"))
        })?;
        running.child.kill()?;
        running.child.wait()
    }

    /// Whether the consumer `name` has exited (of itself: [`kill`](Self::kill) forgets it).
    pub fn exited(&mut self, name: &str) -> Option<ExitStatus> {
        self.running
            .get_mut(name)
            .and_then(|running| running.child.try_wait().ok().flatten())
    }

    /// Asks every consumer to stop (closes its standard input), waits up to `grace` for
    /// them, kills those still running, and returns how each ended, by name.
    pub async fn stop(&mut self, grace: Duration) -> Vec<(String, Ended)> {
        for running in self.running.values_mut() {
            drop(running.stdin.take());
        }
        let deadline = Instant::now() + grace;
        let mut ended = Vec::new();
        while !self.running.is_empty() {
            let names: Vec<String> = self.running.keys().cloned().collect();
            for name in names {
                let running = self.running.get_mut(&name).expect("listed");
                match running.child.try_wait() {
                    Ok(Some(status)) => {
                        self.running.remove(&name);
                        ended.push((name, Ended::Exited(status)));
                    }
                    Ok(None) if Instant::now() < deadline => {}
                    _ => {
                        let _ = running.child.kill();
                        let _ = running.child.wait();
                        self.running.remove(&name);
                        ended.push((name, Ended::KilledAfterGrace));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ended
    }
}

/// How a consumer ended when the fleet stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited of itself, with this status.
    Exited(ExitStatus),
    /// It did not stop within the grace period and was killed.
    KilledAfterGrace,
}

/// A consumer not stopped by [`Fleet::stop`] (the orchestrator failed and returned early)
/// is killed, never left behind.
impl Drop for Fleet {
    fn drop(&mut self) {
        for running in self.running.values_mut() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

/// In a consumer process: completes when standard input closes — the orchestrator's request
/// to stop, or its exit. Give it to the pump as its shutdown.
pub async fn until_stdin_closes() {
    let (closed, wait) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed.send(());
    });
    let _ = wait.await;
}
