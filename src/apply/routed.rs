//! A server out of its sglang-router for a restart: a replica (`rollout::behind_router`) or a
//! server group's rank 0, the group's only API (`group`). It leaves the router (refused when that
//! would leave fewer than `min_available` healthy servers of its model), is drained and applied,
//! and goes back once its apply ended on a verified unit, new or old. Its own room, so that the
//! rollout and the group apply both use it without importing each other.

use std::sync::Arc;

use super::error::{ApplyError, RouterFailure};
use super::{Outcome, UnitReport};
use crate::manifest::RouterSpec;
use crate::router::{Router, RouterError, TakeOutError};
use crate::targets::Target;

/// A server taken out of its router for a restart: a replica, or a server group's rank 0 (the
/// only rank that serves the API). [`TakenOut::put_back`] ends it once the apply has.
pub(super) struct TakenOut {
    router: std::sync::Arc<Router>,
    /// The server's own manifest's `router:`: manifests sharing one router each keep their own
    /// worker URLs, `min_available` and timeouts.
    spec: RouterSpec,
    url: String,
    api_key: Option<String>,
    /// The router listed the server before: a new one goes in only once it converged.
    listed: bool,
    out: std::time::Duration,
}

impl TakenOut {
    /// Takes the server `t` runs out of `router`, unless that leaves too few healthy servers of
    /// its model (refused, nothing changed).
    pub(super) async fn take_out(
        router: std::sync::Arc<Router>,
        t: &Target,
    ) -> Result<TakenOut, ApplyError> {
        let endpoint = crate::verify::Expect::from_unit(&t.desired.model).endpoint;
        // `Routers::of` finds a router only through the manifest's `router:`.
        let Some(spec) = t.manifest.router.clone() else {
            return Err(ApplyError::Router(RouterFailure::NoSpec {
                manifest: t.source.clone(),
                host: t.host.clone(),
                url: router.url.clone(),
            }));
        };
        let url = spec.worker_url(&t.host, endpoint.port);
        let started = std::time::Instant::now();
        let listed = match router.take_out(&url, spec.min_available).await {
            Ok(listed) => listed.is_some(),
            Err(TakeOutError::Refused(why)) => return Err(ApplyError::Refused(why)),
            Err(TakeOutError::Router(e)) => {
                return Err(ApplyError::Router(RouterFailure::TakeOut(Arc::new(e))))
            }
        };
        Ok(TakenOut {
            router,
            spec,
            url,
            api_key: endpoint.api_key,
            listed,
            out: started.elapsed(),
        })
    }

    /// `t` with the drain its apply runs now that it is out (see [`draining`]).
    pub(super) fn draining(&self, t: &Target) -> Target {
        draining(t, &self.spec)
    }

    /// Puts the server back in once its apply ended as `report` says (see [`goes_back`]), and
    /// says in the report how long each step took, or why it stays out.
    pub(super) async fn put_back(self, report: &mut UnitReport) {
        let TakenOut {
            router,
            spec,
            url,
            api_key,
            listed,
            out,
        } = self;
        let applied = std::time::Instant::now();
        if goes_back(report.outcome, listed) {
            match router
                .put_back(&url, api_key.as_deref(), spec.healthy_timeout)
                .await
            {
                Ok(()) => {
                    let drained = report.drain.as_ref().map_or(0.0, |d| d.seconds);
                    let back = applied.elapsed().as_secs_f64();
                    report.notes.push(format!(
                        "router: {url} out in {:.2}s, drained in {drained:.2}s, back in {} and healthy after {back:.2}s (bookkeeping {:.2}s)",
                        out.as_secs_f64(),
                        spec.url,
                        out.as_secs_f64() + drained + back
                    ));
                }
                Err(e) => router_failed(report, e),
            }
        } else if listed {
            report.notes.push(format!(
                "router: {url} stays out of {}: it needs attention before it serves again",
                spec.url
            ));
        }
    }
}

/// Whether a server (a replica or a group's rank 0) goes (back) into the router after its apply
/// ended in `outcome`; `listed`: it was in before. What converged serves the new unit; refused,
/// interrupted or rolled back, the old unit serves (a rollback passed verification), so it goes
/// back where it was; a failed rollback leaves a server nobody verified, which stays out.
fn goes_back(outcome: Outcome, listed: bool) -> bool {
    match outcome {
        Outcome::Converged | Outcome::Reloaded | Outcome::Unchanged => true,
        Outcome::RollbackFailed => false,
        Outcome::Error | Outcome::NotStarted | Outcome::RolledBack => listed,
    }
}

/// `t` with the drain its apply runs once the server is out of the router: the manifest's own, or
/// `router.drain_timeout` refusing on timeout (cutting requests off is the operator's call).
pub(super) fn draining(t: &Target, router: &RouterSpec) -> Target {
    let mut t = t.clone();
    if t.manifest.drain.is_none() {
        std::sync::Arc::make_mut(&mut t.manifest).drain = Some(crate::manifest::DrainSpec {
            timeout: router.drain_timeout,
            on_timeout: crate::manifest::OnTimeout::Refuse,
        });
    }
    t
}

/// The server was applied but the router did not take it back: a converged one counts as
/// failed (the rollout stops); a rolled-back one keeps its outcome and says so.
fn router_failed(report: &mut UnitReport, why: RouterError) {
    if matches!(
        report.outcome,
        Outcome::Converged | Outcome::Reloaded | Outcome::Unchanged
    ) {
        let e = ApplyError::Router(RouterFailure::NotTakenBack {
            detail: std::mem::take(&mut report.detail),
            source: Arc::new(why),
        });
        report.outcome = Outcome::Error;
        report.error = Some(e.kind());
        report.detail = e.to_string();
    } else {
        report.detail = format!("{}; the router did not take it back: {why}", report.detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_goes_back_into_the_router() {
        // A new replica (not listed before) goes in only once it converged.
        assert!(goes_back(Outcome::Converged, false));
        assert!(!goes_back(Outcome::RolledBack, false));
        assert!(!goes_back(Outcome::Error, false));
        // A listed one goes back on its new unit, or on its verified old one.
        for outcome in [
            Outcome::Converged,
            Outcome::RolledBack,
            Outcome::Error,
            Outcome::NotStarted,
        ] {
            assert!(goes_back(outcome, true), "{outcome:?}");
        }
        assert!(!goes_back(Outcome::RollbackFailed, true));
    }
}
