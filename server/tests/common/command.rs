//! Commands run with a deadline: a child still running after its limit has its threads'
//! stacks printed (through gdb, when the machine has it) and is killed, so a hang fails its
//! test saying where it hung instead of holding the whole suite until CI's own limit.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a `quire` subcommand of the tests may take; each finishes in seconds.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

pub trait OutputWithin {
    /// As [`Command::output`], failing the test when the child outlives `limit`.
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut bytes);
                }
                bytes
            })
        };
        let stdout = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if started.elapsed() > limit {
                let stacks = Command::new("gdb")
                    .args(["-p", &child.id().to_string(), "-batch"])
                    .args(["-ex", "thread apply all bt"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_else(|e| format!("(no stacks: gdb: {e})"));
                let _ = child.kill();
                let _ = child.wait();
                let stderr = stderr.join().unwrap_or_default();
                panic!(
                    "{self:?} still ran after {limit:?}; its stderr:\n{}\nits threads:\n{stacks}",
                    String::from_utf8_lossy(&stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Ok(Output {
            status,
            stdout: stdout.join().unwrap_or_default(),
            stderr: stderr.join().unwrap_or_default(),
        })
    }
}
