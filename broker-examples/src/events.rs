//! What a consumer process tells the orchestrator: one line on its standard output per
//! event, read back by [`Fleet`](crate::fleet::Fleet). A process killed with SIGKILL loses
//! nothing it printed: Rust's standard output writes each line through as it ends.

use std::fmt;
use std::str::FromStr;

use inbox_diesel::{Outcome, Settle, Settlement};

/// One line of a consumer's standard output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Subscribed: deliveries may come.
    Ready,
    /// The broker delivered message `id`; `redelivered` is the broker's flag, `count` the
    /// delivery number (1 for the first).
    Delivered {
        /// The message's id.
        id: String,
        /// The broker delivered it before (to this consumer or another).
        redelivered: bool,
        /// The delivery number, this one included.
        count: u32,
    },
    /// The handler's body runs for `id`: the marker and the effect are written, not
    /// committed. Printed before the body's pause, so that a kill lands inside it.
    Handling {
        /// The message's id.
        id: String,
    },
    /// The handler answered; the pump settles the delivery next.
    Answered {
        /// The message's id.
        id: String,
        /// What it answered.
        answer: Answer,
    },
    /// An outbox relay's sink sent message `id` and the broker confirmed it; the relay marks
    /// its row sent next. Printed before the sink's pause, so that a kill lands between the
    /// send and the mark.
    Sent {
        /// The message's id.
        id: String,
    },
    /// The pump stopped after a shutdown; `report` is what it did, as it prints it.
    Stopped {
        /// The pump's report.
        report: String,
    },
}

/// A handler's answer, as the table counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `Outcome::Processed`: the effect committed with the marker.
    Processed,
    /// `Outcome::Duplicate`: an earlier delivery committed it; nothing was written.
    Duplicate,
    /// A failure the pump requeues after a delay (a busy database, a lost connection).
    Retry,
    /// A failure the pump dead-letters.
    DeadLetter,
    /// A failure that stops the pump.
    Halt,
}

impl Answer {
    /// The answer a handler's result stands for.
    pub fn of<T, E: Settle>(result: &Result<Outcome<T>, E>) -> Self {
        match result {
            Ok(Outcome::Processed(_)) => Answer::Processed,
            Ok(Outcome::Duplicate { .. }) => Answer::Duplicate,
            Err(e) => match e.settlement() {
                Settlement::Retry { .. } | Settlement::Held { .. } => Answer::Retry,
                Settlement::DeadLetter => Answer::DeadLetter,
                _ => Answer::Halt,
            },
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Answer::Processed => "processed",
            Answer::Duplicate => "duplicate",
            Answer::Retry => "retry",
            Answer::DeadLetter => "dead-letter",
            Answer::Halt => "halt",
        }
    }
}

/// Whether [`Event::emit`] prints: a process that no orchestrator reads (a bench) turns it
/// off with [`silence`].
static EMITTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Stops [`Event::emit`] printing, for the rest of the process.
pub fn silence() {
    EMITTING.store(false, std::sync::atomic::Ordering::Relaxed);
}

impl Event {
    /// Prints the event on standard output, where the orchestrator reads it (unless
    /// [`silence`]d).
    pub fn emit(&self) {
        if EMITTING.load(std::sync::atomic::Ordering::Relaxed) {
            println!("{self}");
        }
    }
}

/// One delivery of `id` as the orchestrator reads it: [`Event::Delivered`], then `handle`'s
/// answer — its error also printed on standard error as `consumer <name>: <id>: <error>` —
/// and [`Event::Answered`].
pub async fn reported<T, E: Settle + fmt::Display>(
    id: &str,
    redelivered: bool,
    count: u32,
    name: &str,
    handle: impl Future<Output = Result<Outcome<T>, E>>,
) -> Result<Outcome<T>, E> {
    Event::Delivered {
        id: id.to_owned(),
        redelivered,
        count,
    }
    .emit();
    let answer = handle.await;
    if let Err(e) = &answer {
        eprintln!("consumer {name}: {id}: {e}");
    }
    Event::Answered {
        answer: Answer::of(&answer),
        id: id.to_owned(),
    }
    .emit();
    answer
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ready => f.write_str("ready"),
            Event::Delivered {
                id,
                redelivered,
                count,
            } => write!(f, "delivered {id} {} {count}", u8::from(*redelivered)),
            Event::Handling { id } => write!(f, "handling {id}"),
            Event::Answered { id, answer } => write!(f, "answered {id} {}", answer.as_str()),
            Event::Sent { id } => write!(f, "sent {id}"),
            Event::Stopped { report } => write!(f, "stopped {report}"),
        }
    }
}

/// A line that is not an event (a consumer's stray output).
#[derive(Debug)]
pub struct NotAnEvent;

impl FromStr for Event {
    type Err = NotAnEvent;

    fn from_str(line: &str) -> Result<Self, NotAnEvent> {
        let mut words = line.split(' ');
        let event = match (words.next(), words.next()) {
            (Some("ready"), None) => Event::Ready,
            (Some("delivered"), Some(id)) => {
                let redelivered = match words.next() {
                    Some("1") => true,
                    Some("0") => false,
                    _ => return Err(NotAnEvent),
                };
                let count = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or(NotAnEvent)?;
                Event::Delivered {
                    id: id.to_owned(),
                    redelivered,
                    count,
                }
            }
            (Some("handling"), Some(id)) => Event::Handling { id: id.to_owned() },
            (Some("sent"), Some(id)) => Event::Sent { id: id.to_owned() },
            (Some("answered"), Some(id)) => {
                let answer = match words.next() {
                    Some("processed") => Answer::Processed,
                    Some("duplicate") => Answer::Duplicate,
                    Some("retry") => Answer::Retry,
                    Some("dead-letter") => Answer::DeadLetter,
                    Some("halt") => Answer::Halt,
                    _ => return Err(NotAnEvent),
                };
                Event::Answered {
                    id: id.to_owned(),
                    answer,
                }
            }
            (Some("stopped"), _) => {
                return Ok(Event::Stopped {
                    report: line["stopped".len()..].trim().to_owned(),
                });
            }
            _ => return Err(NotAnEvent),
        };
        match words.next() {
            None => Ok(event),
            Some(_) => Err(NotAnEvent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back_as_printed() {
        let events = [
            Event::Ready,
            Event::Delivered {
                id: "m007".into(),
                redelivered: true,
                count: 2,
            },
            Event::Handling { id: "m007".into() },
            Event::Answered {
                id: "m007".into(),
                answer: Answer::Duplicate,
            },
            Event::Answered {
                id: "m008".into(),
                answer: Answer::DeadLetter,
            },
            Event::Sent { id: "m009".into() },
            Event::Stopped {
                report: "Report { acked: 3 }".into(),
            },
        ];
        for event in events {
            assert_eq!(event.to_string().parse::<Event>().unwrap(), event);
        }
        assert!("handling".parse::<Event>().is_err());
        assert!("thread 'main' panicked".parse::<Event>().is_err());
    }
}
