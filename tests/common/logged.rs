//! A `tollgate` process of the test's own with JSON logs, read line by line as they come.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// `tollgate run --config FILE` logging JSON at info; sent SIGTERM and waited for when dropped.
pub struct LoggedGateway {
    process: Child,
    lines: Receiver<String>,
}

impl LoggedGateway {
    pub fn start(config: &Path) -> LoggedGateway {
        let mut process = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["--log-format", "json", "run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::io::BufReader::new(process.stderr.take().unwrap());
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        LoggedGateway { process, lines }
    }

    /// The next log line that contains `wanted`, parsed; within 20 s.
    pub fn next_line(&self, wanted: &str) -> serde_json::Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no log line with {wanted:?}"));
            if line.contains(wanted) {
                return serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
            }
        }
    }
}

impl Drop for LoggedGateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.process.id().to_string()])
            .status();
        let _ = self.process.wait();
    }
}
