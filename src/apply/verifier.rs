//! The seam between apply and verification: apply asks a [`Verifier`] whether a restarted unit
//! came up right. In production that is [`ServerVerifier`], staged verification against the server
//! (`crate::verify::verify`); tests script the answers, so install and rollback run without a
//! server.

use futures::future::BoxFuture;
use indicatif::MultiProgress;
use tokio_util::sync::CancellationToken;

use crate::manifest::VerifySpec;
use crate::remote::Host;
use crate::verify::{verify, Expect, Failure, Progress, Verification};

/// One verification to run.
pub struct Check<'a> {
    pub unit: &'a str,
    pub spec: &'a VerifySpec,
    pub expect: Expect,
    /// Shown with the live display's line for it.
    pub label: String,
    /// Cancelling it fails the verification in progress.
    pub cancel: &'a CancellationToken,
    /// The unit's last good loads, for the live display to compare with.
    pub history: Option<&'a reconcile_core::learned::LoadHistory>,
}

pub trait Verifier: Sync {
    fn verify<'a>(
        &'a self,
        host: &'a dyn Host,
        check: Check<'a>,
    ) -> BoxFuture<'a, Result<Verification, Failure>>;
}

/// Staged verification against the real server, with a line on the live display when there is one.
pub struct ServerVerifier<'p> {
    pub progress: Option<&'p MultiProgress>,
}

impl Verifier for ServerVerifier<'_> {
    fn verify<'a>(
        &'a self,
        host: &'a dyn Host,
        check: Check<'a>,
    ) -> BoxFuture<'a, Result<Verification, Failure>> {
        Box::pin(async move {
            let progress =
                Progress::new(check.label, self.progress).against(check.history.cloned());
            verify(
                host,
                check.unit,
                check.spec,
                &check.expect,
                &progress,
                check.cancel,
            )
            .await
        })
    }
}

#[cfg(test)]
pub mod fake {
    //! A verifier that answers from a script, and remembers what it was asked.

    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    pub struct Scripted {
        answers: Mutex<VecDeque<Result<Verification, Failure>>>,
        /// The labels of the verifications asked for, in order.
        pub asked: Mutex<Vec<String>>,
    }

    impl Scripted {
        pub fn new(answers: Vec<Result<Verification, Failure>>) -> Scripted {
            Scripted {
                answers: Mutex::new(answers.into()),
                asked: Mutex::default(),
            }
        }
    }

    impl Verifier for Scripted {
        fn verify<'a>(
            &'a self,
            _host: &'a dyn Host,
            check: Check<'a>,
        ) -> BoxFuture<'a, Result<Verification, Failure>> {
            self.asked.lock().unwrap().push(check.label);
            let answer = self
                .answers
                .lock()
                .unwrap()
                .pop_front()
                .expect("the script has an answer for every verification");
            Box::pin(async move { answer })
        }
    }
}
