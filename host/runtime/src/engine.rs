//! The process-wide wasmtime [`Engine`] and its epoch ticker.
//!
//! One engine per process: compiled code, the type registry and the artifact
//! cache key all depend on it. The ticker thread that drives call deadlines
//! starts with the engine and lives as long as the process.

use std::sync::OnceLock;

use wasmtime::{Config, Engine, OptLevel};

use crate::limits::EPOCH_TICK;

/// The shared engine, created on first use.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let engine = Engine::new(&config()).expect("the kvwasm engine configuration is valid");
        start_epoch_ticker(engine.clone());
        engine
    })
}

/// The engine configuration. Anything that changes generated code must be
/// set here: [`Engine::precompile_compatibility_hash`] covers it, so cached
/// artifacts from another configuration are never loaded.
fn config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.cranelift_opt_level(OptLevel::Speed);
    config
}

fn start_epoch_ticker(engine: Engine) {
    std::thread::Builder::new()
        .name("kvwasm-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("spawn the epoch ticker thread");
}
