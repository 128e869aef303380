//! Testing the back-off after repeated lost instances without depending on when the test's
//! thread runs: a call is refused only while the back-off lasts (50 ms after the third loss in
//! a row), and a busy machine may not run the test's next call within that.

use std::time::{Duration, Instant};

use kvwasm_host::KvError;

/// The first back-off after three lost instances in a row (`host/runtime/src/backoff.rs`);
/// each further loss doubles it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// How many times [`refused_while_backing_off`] tries.
const ATTEMPTS: usize = 20;

/// The reason of the refusal of a call made while a back-off lasts. `attempt` makes the guest
/// lose instances until a back-off starts, then makes the call that must be refused, and
/// returns when its last losing call began with the call's result.
///
/// A call not refused fails the test if it returned within [`FIRST_BACKOFF`] of that losing
/// call's start: the back-off (from the loss, which came after that start) cannot have ended
/// when the call was checked. Later, the back-off may have ended, as it should, because this
/// thread did not run in time; then `attempt` runs again, up to 20 times.
pub fn refused_while_backing_off<T: std::fmt::Debug>(
    mut attempt: impl FnMut() -> (Instant, Result<T, KvError>),
) -> String {
    for _ in 0..ATTEMPTS {
        let (last_loss, result) = attempt();
        let after = last_loss.elapsed();
        match result {
            Err(KvError::Unavailable(why)) => return why,
            other => assert!(
                after >= FIRST_BACKOFF,
                "not refused {after:?} after the losing call began: {other:?}"
            ),
        }
    }
    panic!(
        "in {ATTEMPTS} attempts no call came within {FIRST_BACKOFF:?} of a loss: \
         the machine is too busy to run this test"
    )
}
