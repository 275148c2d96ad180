//! The machine the figures were taken on, as far as it bears on them: how many vCPUs, how
//! busy it was (the load average as the run began and as it ended: the targets hold on a
//! quiet machine, and a neighbour's build halves a rate), and whether an idle vCPU polls
//! before it halts (on a VM that halts at once, every wake of an idle thread waits for the
//! hypervisor: half of an echo on the host of BENCHMARKS.md's thirty-eighth session).

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Host {
    pub vcpus: usize,
    /// The one-minute load average when the run began and when it ended.
    pub load_before: Option<f64>,
    pub load_after: Option<f64>,
    /// How long an idle vCPU of a KVM guest polls before it halts (`haltpoll`'s
    /// `guest_halt_poll_ns`), where the kernel says.
    pub halt_poll_ns: Option<u64>,
}

impl Host {
    /// The machine as the run begins.
    pub(super) fn now() -> Host {
        Host {
            vcpus: std::thread::available_parallelism().map_or(1, usize::from),
            load_before: load(),
            load_after: None,
            halt_poll_ns: read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
                .and_then(|s| s.trim().parse().ok()),
        }
    }

    /// Notes the load as the run ends.
    pub(super) fn ended(mut self) -> Host {
        self.load_after = load();
        self
    }

    /// One line: `2 vCPUs, load 0.26 as the run began, 1.43 as it ended; ...`.
    pub(super) fn describe(&self) -> String {
        let shown = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
        let mut line = format!(
            "{} vCPUs, load {} as the run began, {} as it ended",
            self.vcpus,
            shown(self.load_before),
            shown(self.load_after)
        );
        match self.halt_poll_ns {
            Some(0) => line.push_str("; an idle vCPU halts at once (guest_halt_poll_ns 0)"),
            Some(ns) => line.push_str(&format!("; an idle vCPU polls {ns} ns before it halts")),
            None => {}
        }
        line
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn load() -> Option<f64> {
    read("/proc/loadavg").and_then(|text| one_minute_load(&text))
}

/// The first figure of `/proc/loadavg` ("0.26 1.43 1.82 1/234 5678").
fn one_minute_load(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_is_the_first_figure_of_proc_loadavg() {
        assert_eq!(one_minute_load("0.26 1.43 1.82 1/234 5678\n"), Some(0.26));
        assert_eq!(one_minute_load(""), None);
        assert_eq!(one_minute_load("busy 1.0"), None);
    }

    #[test]
    fn the_line_says_how_busy_the_machine_was_and_how_its_vcpus_idle() {
        let host = Host {
            vcpus: 2,
            load_before: Some(0.26),
            load_after: Some(1.5),
            halt_poll_ns: Some(0),
        };
        assert_eq!(
            host.describe(),
            "2 vCPUs, load 0.26 as the run began, 1.50 as it ended; an idle vCPU halts at once (guest_halt_poll_ns 0)"
        );
        let elsewhere = Host {
            load_after: None,
            halt_poll_ns: None,
            ..host
        };
        assert_eq!(
            elsewhere.describe(),
            "2 vCPUs, load 0.26 as the run began, ? as it ended"
        );
    }
}
