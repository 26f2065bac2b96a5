//! A server group's verification: the first rank to fail cuts the others short.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::verify::together;
use super::*;
use crate::apply::verifier::Check;
use crate::remote::fake::FakeHost;
use crate::unit::UnitModel;
use crate::verify::{Expect, Failure, Reason};

/// Rank `fails` fails its loading at once; every other rank verifies until its token is
/// cancelled, then fails as a cancelled verification does.
struct OneFails {
    fails: Option<usize>,
}

impl Verifier for OneFails {
    fn verify<'a>(
        &'a self,
        _host: &'a dyn Host,
        check: Check<'a>,
    ) -> BoxFuture<'a, Result<Verification, Failure>> {
        let failure = |reason: Reason| Failure {
            stage: Stage::Loading,
            reason,
            verification: Box::default(),
        };
        Box::pin(async move {
            if self
                .fails
                .is_some_and(|i| check.label == format!("rank {i}"))
            {
                return Err(failure(Reason::Judged("a worker process died".into())));
            }
            check.cancel.cancelled().await;
            Err(failure(Reason::Cancelled(crate::signals::interrupted())))
        })
    }
}

async fn verify_three(verifier: &OneFails, group: &CancellationToken) -> Option<usize> {
    let hosts = [
        FakeHost::new("gpu-a"),
        FakeHost::new("gpu-b"),
        FakeHost::new("gpu-c"),
    ];
    let hosts: Vec<&dyn Host> = hosts.iter().map(|h| h as &dyn Host).collect();
    let spec = VerifySpec::default();
    let checks = (0..3)
        .map(|i| Check {
            unit: "s.service",
            spec: &spec,
            expect: Expect::from_unit(&UnitModel::default()),
            label: format!("rank {i}"),
            cancel: group,
            history: None,
        })
        .collect();
    let (results, first) = together(&hosts, verifier, checks, group).await;
    assert!(results.iter().all(Result::is_err), "every rank failed");
    first
}

#[tokio::test]
async fn the_first_rank_to_fail_cuts_its_group_short_but_not_the_run() {
    let run = CancellationToken::new();
    let group = run.child_token();
    let first = verify_three(&OneFails { fails: Some(1) }, &group).await;
    assert_eq!(first, Some(1));
    assert!(group.is_cancelled());
    assert!(
        !run.is_cancelled(),
        "the run goes on to roll the group back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_signal_cuts_the_group_short_and_no_rank_failed_first() {
    let run = CancellationToken::new();
    let group = run.child_token();
    let signal = run.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        signal.cancel();
    });
    let first = verify_three(&OneFails { fails: None }, &group).await;
    assert_eq!(first, None);
    assert!(group.is_cancelled());
}
