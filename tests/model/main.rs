//! The protocol, model-checked (stateright): every reachable state of a few relays over one
//! outbox table, and of a consumer group over one queue, under crashes, stalls, broker and
//! database faults and operator replays, checked against the guarantees of
//! `docs/guarantees.md` ("The checked model"). The relay's transitions are the crate's own table
//! (`outbox::protocol`), the one `store/` renders its SQL from; `mutants` shows that the check
//! catches real mistakes, each with a counterexample trace.
//!
//! `cargo test --test model` runs the bounded check (seconds); a deeper one, with more events,
//! relays and faults:
//!
//! ```text
//! OUTBOX_MODEL=deep cargo test --release --test model -- --nocapture
//! ```

mod consumer;
mod relay;

use std::collections::HashSet;

use stateright::{Checker, Model};

use consumer::ConsumerModel;
use relay::{Faults, RelayModel, Strategy};

fn deep() -> bool {
    std::env::var("OUTBOX_MODEL").is_ok_and(|v| v == "deep")
}

/// The deep run adds a third event (about 30 times the states).
fn events() -> usize {
    if deep() {
        3
    } else {
        2
    }
}

fn relay_model(strategy: Strategy) -> RelayModel {
    RelayModel::new(strategy, 2, events(), Faults::each_once())
}

/// Operators' pause and resume, retention and a caller's cancel, beside crashes, stalls and a broker fault (kept
/// apart from the other faults to stay small; the same in the deep run).
fn pause_and_retention_model(strategy: Strategy) -> RelayModel {
    let faults = Faults {
        db: 0,
        replays: 0,
        pauses: 1,
        retention: true,
        cancels: 1,
        ..Faults::each_once()
    };
    RelayModel::new(strategy, 2, 2, faults)
}

fn consumer_model() -> ConsumerModel {
    let mut m = ConsumerModel::new();
    if deep() {
        m.queue = vec![0, 1, 2, 0, 3, 1];
        m.events = 4;
        m.keys = vec![0, 1, 0, 0];
        m.crashes = 2;
        m.conflicts = 2;
        m.rebalances = 2;
        m.max_attempts = 2;
    }
    m
}

/// Checks every property over every reachable state and prints what was covered.
fn check<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + Clone + PartialEq + std::hash::Hash + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
{
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

#[test]
fn relays_under_a_lease_keep_every_guarantee() {
    check("lease", relay_model(Strategy::Lease));
}

#[test]
fn relays_in_held_rounds_keep_every_guarantee() {
    check("held", relay_model(Strategy::Held));
}

#[test]
fn pauses_and_retention_keep_every_guarantee_under_both_claims() {
    check("lease, pause and retention", pause_and_retention_model(Strategy::Lease));
    check("held, pause and retention", pause_and_retention_model(Strategy::Held));
}

/// `ordering = per-biz-no`: ordered relays claim under a lease; two events of one key.
fn ordered_model() -> RelayModel {
    let faults = Faults {
        db: u8::from(deep()),
        ..Faults::each_once()
    };
    let mut m = RelayModel::new(Strategy::Lease, 2, events(), faults);
    m.keys = Some(if deep() { vec![0, 1, 0] } else { vec![0, 0] });
    m
}

#[test]
fn ordered_relays_send_each_key_in_commit_order() {
    check("ordered", ordered_model());
}

#[test]
fn a_consumer_group_with_the_inbox_credits_every_order_exactly_once() {
    check("consumer", consumer_model());
}

#[test]
fn the_model_runs_every_transition_of_the_crate() {
    let model: HashSet<&str> = relay::Table::of_the_crate().all().iter().map(|t| t.name).collect();
    let crate_table: HashSet<&str> = outbox::protocol::TRANSITIONS.iter().map(|t| t.name).collect();
    assert_eq!(
        model, crate_table,
        "a transition of outbox::protocol the model does not run, or the reverse"
    );
    for t in relay::Table::of_the_crate().all() {
        assert!(
            outbox::protocol::TRANSITIONS.contains(&t),
            "{} differs from the crate's",
            t.name
        );
    }
}

/// Seeded mistakes: the checker must find each, with a trace.
mod mutants {
    use super::*;
    use outbox::protocol::Guard;
    use stateright::HasDiscoveries;
    use std::collections::BTreeSet;

    /// The shortest counterexample to `property`: breadth first, one depth bound after the other
    /// (stateright keeps the last counterexample found in a block of states, so the first bound
    /// with one makes every one found as short as can be). Printed one step a line.
    fn counterexample<M>(model: M, property: &'static str) -> String
    where
        M: Model + Clone + Send + Sync + 'static,
        M::State: std::fmt::Debug + Clone + PartialEq + std::hash::Hash + Send + Sync,
        M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
    {
        for depth in 2..=64 {
            let checker = model
                .clone()
                .checker()
                .target_max_depth(depth)
                .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
                .spawn_bfs()
                .join();
            if let Some(path) = checker.discovery(property) {
                let steps: Vec<String> = path.into_actions().iter().map(|a| format!("{a:?}")).collect();
                println!("{property}: counterexample in {} steps:", steps.len());
                for (i, step) in steps.iter().enumerate() {
                    println!("  {:>2}. {step}", i + 1);
                }
                return steps.join(", ");
            }
            assert!(
                checker.max_depth() + 1 >= depth,
                "the mutant was not caught: no counterexample to {property:?} in any reachable state"
            );
        }
        panic!("the mutant was not caught: no counterexample to {property:?} within 63 steps");
    }

    fn unfenced(g: Guard) -> Guard {
        Guard { mine: false, ..g }
    }

    #[test]
    fn an_ack_without_the_token_guard_is_caught() {
        let mut m = relay_model(Strategy::Lease);
        m.table.ack.guard = unfenced(m.table.ack.guard);
        m.table.delete_sent.guard = unfenced(m.table.delete_sent.guard);
        let trace = counterexample(m, "no row changes under a claim that is no longer its own");
        assert!(trace.contains("Record"), "{trace}");
    }

    #[test]
    fn a_reclaim_that_does_not_count_an_attempt_is_caught() {
        let mut m = relay_model(Strategy::Lease);
        m.table.reclaim.counts_attempt = false;
        let trace = counterexample(
            m,
            "every copy sent is attributable to a counted attempt, audit, replay or journal row",
        );
        assert!(trace.contains("Reclaim"), "{trace}");
    }

    #[test]
    fn a_renew_that_extends_a_reclaimed_row_is_caught() {
        let mut m = relay_model(Strategy::Lease);
        m.table.renew.guard = unfenced(m.table.renew.guard);
        let trace = counterexample(m, "no row changes under a claim that is no longer its own");
        assert!(trace.contains("Renew"), "{trace}");
    }

    #[test]
    fn a_lost_held_round_recovered_without_counting_is_caught() {
        let mut m = relay_model(Strategy::Held);
        m.table.lost_round.counts_attempt = false;
        m.table.lost_round_last.counts_attempt = false;
        // The audit alone still attributes the copy; with neither, the copy is unexplained.
        m.audit_lost_rounds = false;
        let trace = counterexample(
            m,
            "every copy sent is attributable to a counted attempt, audit, replay or journal row",
        );
        assert!(trace.contains("Recover"), "{trace}");
    }

    #[test]
    fn an_ordered_claim_that_does_not_start_at_the_keys_oldest_pending_row_is_caught() {
        let mut m = ordered_model();
        m.run_from_head = false;
        let trace = counterexample(
            m,
            "a key's events first reach the broker in commit order (but past a dead letter)",
        );
        assert!(trace.contains("Send"), "{trace}");
    }

    #[test]
    fn a_retention_that_deletes_unsent_rows_is_caught() {
        let mut m = pause_and_retention_model(Strategy::Held);
        m.table.retention.guard = Guard {
            status: outbox::protocol::Status::Wait,
            ..m.table.retention.guard
        };
        let trace = counterexample(m, "a row recorded as sent was sent");
        assert!(trace.contains("Retention"), "{trace}");
    }

    #[test]
    fn a_cancel_that_deletes_a_row_in_flight_is_caught() {
        let mut m = pause_and_retention_model(Strategy::Lease);
        m.table.cancel.guard = Guard {
            status: outbox::protocol::Status::Sending,
            ..m.table.cancel.guard
        };
        let trace = counterexample(m, "a cancel never deletes a row that a live claim is sending");
        assert!(trace.contains("Cancel"), "{trace}");
    }

    #[test]
    fn an_offset_committed_before_the_database_commit_is_caught() {
        let mut m = consumer_model();
        m.offset_before_commit = true;
        let trace = counterexample(
            m,
            "the offset never passes a message whose transaction has not committed",
        );
        assert!(trace.contains("CommitOffset"), "{trace}");
        let mut m = consumer_model();
        m.offset_before_commit = true;
        let trace = counterexample(m, "when nothing is left to do, every order is credited exactly once");
        assert!(trace.contains("Crash"), "{trace}");
    }
}
