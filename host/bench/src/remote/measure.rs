//! What an operation costs: wall time, CPU time of this process and of the
//! server, page faults.

use std::time::Instant;

use crate::Stat;

/// CPU time one side's operations took, ms per operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cpu {
    pub client: Stat,
    pub server: Option<Stat>,
    /// Minor page faults of the client process per operation.
    pub client_faults: Stat,
}

/// Measures an operation: its wall time, the CPU time of this process and
/// of the server process, if known.
#[derive(Clone, Copy)]
pub(super) struct Meter {
    pub(super) server_pid: Option<u32>,
}

/// An operation being measured: when it started, and the CPU clocks then.
pub(super) struct Span {
    meter: Meter,
    started: Instant,
    client_cpu_ms: f64,
    server_cpu_ms: Option<f64>,
    client_faults: u64,
}

/// What one operation took, ms (and page faults).
pub(super) struct Measured {
    ms: f64,
    client_cpu_ms: f64,
    server_cpu_ms: Option<f64>,
    client_faults: u64,
}

impl Meter {
    pub(super) fn start(self) -> Span {
        Span {
            meter: self,
            client_cpu_ms: crate::cpu::process_ms(),
            server_cpu_ms: self.server_cpu_ms(),
            client_faults: crate::cpu::minor_faults(),
            started: Instant::now(),
        }
    }

    fn server_cpu_ms(self) -> Option<f64> {
        self.server_pid.and_then(crate::cpu::of_pid)
    }
}

impl Span {
    pub(super) fn stop(self) -> Measured {
        let ms = 1e3 * self.started.elapsed().as_secs_f64();
        let server = self.meter.server_cpu_ms();
        Measured {
            ms,
            client_cpu_ms: crate::cpu::process_ms() - self.client_cpu_ms,
            server_cpu_ms: self.server_cpu_ms.zip(server).map(|(a, b)| b - a),
            client_faults: crate::cpu::minor_faults().saturating_sub(self.client_faults),
        }
    }
}

/// What one side's operations of one kind measured, in repetition order.
#[derive(Debug, Clone, Default)]
pub(super) struct Samples {
    pub(super) ms: Vec<f64>,
    client_cpu_ms: Vec<f64>,
    server_cpu_ms: Vec<f64>,
    client_faults: Vec<f64>,
}

impl Samples {
    pub(super) fn push(&mut self, m: Measured) {
        self.ms.push(m.ms);
        self.client_cpu_ms.push(m.client_cpu_ms);
        self.server_cpu_ms.extend(m.server_cpu_ms);
        self.client_faults.push(m.client_faults as f64);
    }

    pub(super) fn cpu(&self) -> Cpu {
        Cpu {
            client: Stat::new(self.client_cpu_ms.clone()),
            server: (!self.server_cpu_ms.is_empty()).then(|| Stat::new(self.server_cpu_ms.clone())),
            client_faults: Stat::new(self.client_faults.clone()),
        }
    }
}
