//! What a request holds while it is in flight: its slot under the simple concurrency
//! limit (which also counts every request in flight) and, with API Priority and
//! Fairness on, its seat in a priority level. Both are given back together, when the
//! response body ends, or for a watch when its initialization is over.

use crate::control::flow_control::Seat;
use crate::control::limits::InflightPermit;

/// See the module documentation. Held for its drop only.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The slot under [`crate::LimitsConfig`].
    pub _inflight: InflightPermit,
    /// The APF seat, when APF is on.
    pub _seat: Option<Seat>,
}
