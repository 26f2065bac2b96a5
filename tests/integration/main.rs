//! Integration tests: the real `reconcile` binary against real test hosts (systemd and OpenSSH in
//! containers booted by `tests/run.sh`). One binary, so the hosts are shared by every test.

mod agent;
mod apply;
mod benchmark;
mod builder;
mod coordinator;
mod crash;
mod diagnosis;
mod docs_guide;
mod drain;
mod dry_run;
mod experiment;
mod faults;
mod fleet;
mod group;
mod guard;
mod guide_blocks;
mod hangs;
mod hub;
mod import;
mod lab;
mod learned;
mod live;
mod package;
mod pinned;
mod plan_file;
mod preflight;
mod pty;
mod quality;
mod real_server;
mod real_sglang;
mod router;
mod security;
mod status;
mod systemd_escaping;
mod systemd_unit_files;
