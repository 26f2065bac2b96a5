//! Verification's decisions: whether the samples of a restarting server show a crash, a stall, a
//! dead worker or memory out of bounds. Pure: the poller in the `reconcile` binary (`verify`)
//! owns the clock and the probes, and hands the samples in. `stage` names what passes or fails.

pub mod judge;
pub mod stage;

pub use stage::Stage;
