//! The delivery's rules in one table: for every standing a delivery can be in and every act
//! that may touch it, whether the act is refused, admits the delivery without moving it, or
//! moves it, and where.
//!
//! The SQL statements that carry out the acts (`crates/storage/src/sql/`) guard each move with
//! the standing it needs; `crates/storage/tests/storage/rules.rs` runs every act on a delivery
//! in every standing against the real PostgreSQL and fails where a guard disagrees with this
//! table. `docs/architecture.md` shows the table as [`markdown`] renders it, and a test holds
//! the two together.
//!
//! A standing is the delivery's state, whether an automatic attempt of it has been made, and
//! whether one is under way (its lease is held: `attempting_until` is set). The other
//! conditions of an act (the attempt is due, the webhook is enabled and has room, the caller saw
//! the automatic attempts the delivery has, a manual attempt was asked for) are the act's own,
//! and the test grants them.

use std::fmt::Write as _;

use super::DeliveryState::{self, Failed, Pending, Retrying, Succeeded, Waiting};

/// Where a delivery stands, as far as the rules are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Standing {
    pub state: DeliveryState,
    /// An automatic attempt of it has been made.
    pub attempted: bool,
    /// An automatic attempt of it is under way: its lease is held.
    pub under_way: bool,
}

impl Standing {
    const fn new(state: DeliveryState, attempted: bool, under_way: bool) -> Standing {
        Standing {
            state,
            attempted,
            under_way,
        }
    }

    /// Every standing a delivery can be in, in the table's column order. A finished delivery
    /// is one standing whatever its attempts; `waiting` and `pending` never hold a lease
    /// except `pending` while its first attempt is under way.
    pub const ALL: [Standing; 8] = [
        Standing::new(Pending, false, false),
        Standing::new(Pending, true, true),
        Standing::new(Waiting, false, false),
        Standing::new(Waiting, true, false),
        Standing::new(Retrying, true, false),
        Standing::new(Retrying, true, true),
        Standing::new(Succeeded, true, false),
        Standing::new(Failed, true, false),
    ];

    /// Its column heading.
    pub fn label(self) -> String {
        let mut label = self.state.as_str().to_owned();
        if self.under_way {
            label.push_str(", under way");
        } else if self.state == Waiting && self.attempted {
            label.push_str(", attempted");
        }
        label
    }

    fn column(self) -> usize {
        Standing::ALL
            .iter()
            .position(|standing| *standing == self)
            .expect("a standing of the table")
    }
}

/// Everything that may touch a delivery once the fan-out has made it. (The fan-out creates
/// each delivery `pending`, or `waiting` when its webhook is busy, disabled or owes the
/// incident an earlier event first, and claims a first attempt as [`Act::ClaimAutomatic`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Act {
    /// Claim the next automatic attempt (the fan-out's first, an attempt message, the waiting
    /// pass's, the sweeper's overdue one): it takes the lease before the request is sent.
    ClaimAutomatic,
    /// Claim a manual attempt an operator asked for; it takes no lease.
    ClaimManual,
    /// The automatic attempt under way succeeded.
    Succeed,
    /// The automatic attempt under way failed with attempts left.
    Retry,
    /// The automatic attempt under way failed, and it was the last allowed.
    Fail,
    /// A manual attempt succeeded.
    SucceedManual,
    /// A manual attempt failed: its outcome is recorded, the schedule is not touched.
    Keep,
    /// A due automatic attempt finds its webhook without room (busy, rate limited, ordering).
    Wait,
    /// The waiting pass takes a delivery waiting for room, to claim its attempt.
    Release,
    /// The sweeper takes an automatic attempt whose lease ended without an outcome, to record it
    /// `interrupted` (then [`Act::Retry`] or [`Act::Fail`]).
    Sweep,
    /// No automatic attempt is allowed any more (webhook deleted or disabled, schedule used up).
    Stop,
    /// An operator recovers the deliveries that waited while their webhook was disabled.
    Recover,
    /// An operator asks for a manual attempt (retry from the delivery log).
    RequestManual,
}

impl Act {
    pub const ALL: [Act; 13] = [
        Act::ClaimAutomatic,
        Act::ClaimManual,
        Act::Succeed,
        Act::Retry,
        Act::Fail,
        Act::SucceedManual,
        Act::Keep,
        Act::Wait,
        Act::Release,
        Act::Sweep,
        Act::Stop,
        Act::Recover,
        Act::RequestManual,
    ];

    /// Its row heading.
    pub fn label(self) -> &'static str {
        match self {
            Act::ClaimAutomatic => "claim an automatic attempt",
            Act::ClaimManual => "claim a manual attempt",
            Act::Succeed => "automatic attempt succeeded",
            Act::Retry => "automatic attempt failed, attempts left",
            Act::Fail => "automatic attempt failed, the last",
            Act::SucceedManual => "manual attempt succeeded",
            Act::Keep => "manual attempt failed",
            Act::Wait => "no room for the attempt",
            Act::Release => "waiting pass takes it",
            Act::Sweep => "sweeper finds the lease ended",
            Act::Stop => "no attempt allowed any more",
            Act::Recover => "recover after disabling",
            Act::RequestManual => "operator asks for an attempt",
        }
    }
}

/// What an act does to a delivery in a standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// Not allowed: nothing changes.
    Refused,
    /// Allowed; the delivery stays as it stands (an attempt is logged or recorded, or the
    /// delivery is taken for the next step).
    Admits,
    /// Allowed; the delivery moves to the state, and its lease is taken, ended or kept.
    Moves(DeliveryState, Lease),
}

/// What a move does to the lease of an automatic attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    Taken,
    Ended,
    Kept,
}

use Cell::{Admits as Yes, Refused as No};
use Lease::{Ended, Kept, Taken};

const fn to(state: DeliveryState, lease: Lease) -> Cell {
    Cell::Moves(state, lease)
}

/// The table: a row per act, a cell per standing of [`Standing::ALL`] — pending, pending under
/// way, waiting, waiting attempted, retrying, retrying under way, succeeded, failed.
#[rustfmt::skip]
const TABLE: [(Act, [Cell; 8]); 13] = [
    (Act::ClaimAutomatic, [to(Pending, Taken), No, to(Pending, Taken), to(Retrying, Taken), to(Retrying, Taken), No, No, No]),
    (Act::ClaimManual, [Yes, Yes, Yes, Yes, Yes, Yes, No, Yes]),
    (Act::Succeed, [No, to(Succeeded, Ended), No, No, No, to(Succeeded, Ended), No, No]),
    (Act::Retry, [No, to(Retrying, Ended), No, No, No, to(Retrying, Ended), No, No]),
    (Act::Fail, [No, to(Failed, Ended), No, No, No, to(Failed, Ended), No, No]),
    (Act::SucceedManual, [to(Succeeded, Kept), to(Succeeded, Kept), to(Succeeded, Kept), to(Succeeded, Kept), to(Succeeded, Kept), to(Succeeded, Kept), No, to(Succeeded, Kept)]),
    (Act::Keep, [Yes, Yes, Yes, Yes, Yes, Yes, Yes, Yes]),
    (Act::Wait, [to(Waiting, Kept), No, No, No, to(Waiting, Kept), No, No, No]),
    (Act::Release, [No, No, Yes, Yes, No, No, No, No]),
    (Act::Sweep, [No, Yes, No, No, No, Yes, No, No]),
    (Act::Stop, [to(Failed, Kept), No, to(Failed, Kept), to(Failed, Kept), to(Failed, Kept), No, No, No]),
    (Act::Recover, [No, No, to(Pending, Kept), to(Retrying, Kept), No, No, No, No]),
    (Act::RequestManual, [Yes, Yes, Yes, Yes, Yes, Yes, No, Yes]),
];

/// What `act` does to a delivery standing as `standing`.
pub fn cell(act: Act, standing: Standing) -> Cell {
    let (_, row) = TABLE
        .iter()
        .find(|(row_act, _)| *row_act == act)
        .expect("every act has a row");
    row[standing.column()]
}

/// Whether `act` is allowed for a delivery standing as `standing`.
pub fn allows(act: Act, standing: Standing) -> bool {
    cell(act, standing) != Cell::Refused
}

/// Whether `act` is allowed in every standing of `state` (for an act that depends on the
/// state alone, such as [`Act::RequestManual`]).
pub fn allows_in_state(act: Act, state: DeliveryState) -> bool {
    Standing::ALL
        .into_iter()
        .filter(|standing| standing.state == state)
        .all(|standing| allows(act, standing))
}

/// The table as a Markdown table, for the docs.
pub fn markdown() -> String {
    let mut text = String::from("| act |");
    for standing in Standing::ALL {
        let _ = write!(text, " {} |", standing.label());
    }
    text.push_str("\n|---|");
    text.push_str(&":-:|".repeat(Standing::ALL.len()));
    text.push('\n');
    for act in Act::ALL {
        let _ = write!(text, "| {} |", act.label());
        for standing in Standing::ALL {
            let shown = match cell(act, standing) {
                Cell::Refused => "—".to_owned(),
                Cell::Admits => "✓".to_owned(),
                Cell::Moves(state, Lease::Taken) => format!("→ {state}, lease taken"),
                Cell::Moves(state, Lease::Ended) => format!("→ {state}, lease ended"),
                Cell::Moves(state, Lease::Kept) => format!("→ {state}"),
            };
            let _ = write!(text, " {shown} |");
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_act_has_one_row_and_every_standing_is_distinct() {
        for act in Act::ALL {
            assert_eq!(
                TABLE.iter().filter(|(a, _)| *a == act).count(),
                1,
                "{act:?}"
            );
        }
        assert_eq!(TABLE.len(), Act::ALL.len());
        for (i, standing) in Standing::ALL.iter().enumerate() {
            assert_eq!(standing.column(), i);
        }
    }

    #[test]
    fn the_table_keeps_the_specifications_promises() {
        for act in Act::ALL {
            // Nothing moves a succeeded delivery.
            let succeeded = cell(act, Standing::ALL[6]);
            assert!(
                !matches!(succeeded, Cell::Moves(..)),
                "{act:?} moves a succeeded delivery"
            );
        }
        for standing in Standing::ALL {
            // One automatic attempt at a time: none is claimed while one is under way.
            if standing.under_way {
                assert_eq!(cell(Act::ClaimAutomatic, standing), Cell::Refused);
            }
            // A manual attempt never moves the schedule.
            assert!(!matches!(
                cell(Act::Keep, standing),
                Cell::Moves(..) | Cell::Refused
            ));
            // Only a claim takes a lease, and only an automatic attempt's outcome ends it.
            for act in Act::ALL {
                match cell(act, standing) {
                    Cell::Moves(_, Lease::Taken) => assert_eq!(act, Act::ClaimAutomatic),
                    Cell::Moves(_, Lease::Ended) => {
                        assert!(matches!(act, Act::Succeed | Act::Retry | Act::Fail))
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn the_docs_show_this_table() {
        let doc = include_str!("../../../../docs/architecture.md");
        assert!(
            doc.contains(&markdown()),
            "docs/architecture.md must hold the table as markdown() renders it:\n{}",
            markdown()
        );
    }
}
