//! Processes a test starts: killed and reaped when the guard drops, so a failing assertion
//! leaves nothing running.

use std::io::Read;
use std::time::Duration;

/// A CLI process a test started: killed on drop, so a failing test leaves nothing behind.
pub struct ChildGuard(pub std::process::Child);

impl ChildGuard {
    /// Its output once it exits, read as it comes (a big output must not block it); killed
    /// and reported when it has not exited within `limit`.
    pub fn wait_with_output(mut self, limit: Duration) -> std::process::Output {
        let mut stdout = self.0.stdout.take().expect("stdout piped");
        let mut stderr = self.0.stderr.take().expect("stderr piped");
        let out = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stdout.read_to_end(&mut bytes);
            bytes
        });
        let err = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes);
            bytes
        });
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.0.kill();
                let _ = self.0.wait();
                panic!("the command did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        std::process::Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
