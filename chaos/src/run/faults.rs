//! The faults: the one a delivery's body is given, the kills, cuts and crashes injected
//! between deliveries, and the other writers of `--hot` on Galera.

use std::time::{Duration, Instant};

use super::broker::Run;
use crate::protocol::{Backend, Fault, Mode};

impl Run<'_> {
    pub(super) fn fault(&mut self, mode: Mode) -> Fault {
        let roll = self.rng.u32(0..100);
        match roll {
            0..3 => Fault::Panic,
            3..6 => Fault::Error,
            6..14 => Fault::Slow,
            14..17 if self.backend == Backend::Postgres => Fault::Timeout,
            17..20 if mode == Mode::Async => Fault::Cancel,
            _ => Fault::None,
        }
    }

    pub(super) fn inject(&mut self) -> Result<(), String> {
        let mut kinds = vec!["kill", "kill"];
        if self.db.can_cut() {
            kinds.push("cut");
        }
        if self.db.can_crash()
            && self
                .report
                .last_crash
                .is_none_or(|t| t.elapsed() > Duration::from_secs(5))
        {
            kinds.push("crash");
        }
        match kinds[self.rng.usize(0..kinds.len())] {
            "kill" => {
                let at = self.rng.usize(0..self.slots.len());
                self.kill(at)?;
            }
            "cut" => self.report.cuts += self.db.cut()? as u64,
            _ => {
                self.db.crash()?;
                self.report.crashes += 1;
                self.report.last_crash = Some(Instant::now());
            }
        }
        Ok(())
    }
}

/// One of the application's other writers ([`Database::other_writers`]): updates a hot row
/// in a transaction of its own, again and again until `stop`, connecting again after a
/// node's crash. Returns how many it committed.
///
/// [`Database::other_writers`]: crate::server::Database::other_writers
#[cfg(feature = "mysql")]
pub(super) fn other_writer(url: &str, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use diesel::Connection as _;
    use diesel::connection::SimpleConnection as _;
    let mut written = 0;
    let mut conn: Option<diesel::MysqlConnection> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = diesel::MysqlConnection::establish(url).ok();
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
            continue;
        };
        let row = fastrand::u8(0..crate::consumer::HOT_ROWS as u8);
        match c.batch_execute(&format!("UPDATE hot SET w = w + 1 WHERE id = {row}")) {
            Ok(()) => written += 1,
            Err(diesel::result::Error::DatabaseError(..)) => {}
            Err(_) => conn = None,
        }
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..2000)));
    }
    written
}

/// Without MySQL there is no Galera run, and no other writer.
#[cfg(not(feature = "mysql"))]
pub(super) fn other_writer(_: &str, _: &std::sync::atomic::AtomicBool) -> u64 {
    0
}
