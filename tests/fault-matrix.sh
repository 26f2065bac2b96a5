#!/usr/bin/env bash
# The fault matrix: one line per fault, read from a `cargo test` log of the integration tests
# (tests/run.sh writes it), and a closing `N passed, N failed` line. A fault whose test did not
# run counts as failed.
set -uo pipefail
log=${1:?usage: tests/fault-matrix.sh CARGO_TEST_LOG}
matrix=(
  "SSH connection cut while connecting, installing, and verifying|apply::a_connection_cut_mid_apply_leaves_a_whole_unit_and_the_next_apply_recovers"
  "unit folder read-only|faults::a_read_only_unit_folder_changes_nothing"
  "unit folder full|faults::a_full_unit_folder_changes_nothing"
  "systemd fails daemon-reload|faults::a_systemd_that_cannot_reload_gets_its_previous_unit_back_and_asks_for_attention"
  "server exits at once|apply::a_server_that_exits_at_once_is_caught_within_a_second_and_the_new_unit_removed"
  "crash inside the crash window|apply::a_crash_in_the_window_rolls_back_to_the_previous_unit_which_serves_again"
  "crash during load|apply::a_crash_during_load_after_the_window_rolls_back"
  "load stall|apply::a_stalled_load_rolls_back"
  "memory runaway|apply::runaway_memory_over_the_ceiling_rolls_back"
  "wrong model|apply::a_wrong_model_rolls_back"
  "port never opens|apply::a_port_that_never_opens_misses_the_load_deadline"
  "GPU memory far from the plateau|apply::gpu_memory_far_from_the_expected_plateau_rolls_back"
  "garbage completion|apply::a_garbage_answer_fails_the_smoke_completion"
  "second concurrent apply|apply::a_second_apply_while_one_runs_is_refused_with_who_holds_the_lock"
  "lock held by another run|apply::an_apply_is_refused_while_another_holds_the_lock"
  "stale lock from a killed run|apply::a_lock_left_by_a_dead_run_on_this_machine_is_broken"
  "Ctrl-C during verification|apply::ctrl_c_during_verification_rolls_back"
  "previous unit also fails on rollback|faults::a_previous_unit_that_fails_on_rollback_is_reported_as_needing_attention"
  "canary fails in a rollout|fleet::a_failing_canary_stops_the_rollout_before_any_other_host_is_touched"
  "host rebooted during verification|faults::a_host_rebooted_during_verification_gets_its_previous_unit_back"
  "host down past the reconnect wait during verification|faults::a_host_down_past_the_wait_during_verification_is_reported_as_needing_attention"
  "nvidia-smi hangs (plan, then verification)|hangs::a_hung_nvidia_smi_ends_the_plan_naming_it_and_apply_goes_on_without_gpu_figures"
  "systemctl hangs during verification|hangs::a_systemctl_that_hangs_during_verification_fails_the_stage_and_rolls_back"
  "deployment record garbage, non-ASCII or from a newer reconcile|hangs::an_unreadable_deployment_record_refuses_the_unit_and_restarts_nothing"
  "SIGTERM during verification|hangs::sigterm_during_verification_rolls_back"
  "Ctrl-C with two units on one host|hangs::ctrl_c_with_two_units_on_one_host_leaves_the_second_untouched"
  "/health slower than a second (SGLang's health_generate)|real_sglang::a_health_check_slower_than_a_second_is_waited_for"
  "warmup answering 503|real_sglang::a_warmup_answering_503_is_progress_not_a_failure"
  "flat busy JIT phase 3x the stall timeout|real_sglang::a_flat_busy_phase_three_times_the_stall_timeout_is_not_a_stall"
  "dead TP rank, SGLang 0.5.9 (main process hangs)|real_sglang::a_dead_rank_of_sglang_0_5_9_is_a_worker_death_and_the_rollback_waits_out_a_slow_health"
  "dead TP rank, SGLang 0.5.23 (watchdog)|real_sglang::a_dead_rank_of_sglang_0_5_23_fails_the_start_and_is_rolled_back"
  "warmup that never ends|real_sglang::a_warmup_that_never_ends_fails_the_warmup_stage"
  "drop-in no manifest owns (systemctl edit)|systemd_unit_files::a_systemctl_edit_drop_in_is_planned_refused_named_then_replaced_and_put_back_by_a_rollback"
  "masked unit|systemd_unit_files::a_masked_unit_is_planned_refused_and_with_replace_unmasked_or_masked_again_by_a_rollback"
  "unit in /run that systemd loads instead|systemd_unit_files::a_unit_in_run_that_systemd_loads_instead_is_planned_refused_and_replaced_or_restored"
  "installed but disabled unit|systemd_unit_files::a_disabled_unit_is_planned_named_and_enabled_without_a_restart"
  "numbers moved by a change that starts and serves (logits perturbed by a flag)|quality::logits_perturbed_by_a_flag_change_are_rolled_back_at_stage_quality"
  "long-context retrieval broken past 4k tokens|quality::retrieval_broken_past_4k_tokens_is_caught_by_the_needle_and_the_long_context_tasks"
  "pinned weights: a file whose bytes are not the lock's|pinned::a_file_whose_bytes_are_not_the_locks_is_refused_before_anything_stops"
  "pinned weights: apply SIGKILLed mid-fetch|pinned::a_fetch_killed_with_its_apply_leaves_the_old_server_serving_and_the_next_apply_resumes_it"
  "wrong answers to the manifest's cases|quality::wrong_answers_are_caught_by_the_cases_and_with_gate_off_only_reported"
  "pull agents' canary fails|coordinator::a_failed_canary_stops_every_other_host_and_each_says_why"
  "pull agent killed (SIGKILL) mid-verification|coordinator::a_killed_agent_frees_its_slot_counts_against_the_budget_and_finishes_next_round"
  "coordinator (etcd) down mid-rollout|coordinator::while_etcd_is_down_no_agent_restarts_and_the_rollout_completes_after"
  "a server group's rank 1 crashes while loading (rank 0 dies of it)|group::rank_one_crashing_while_loading_rolls_both_ranks_back"
  "a server group's rank unreachable at plan time|group::an_unreachable_rank_leaves_the_group_unplanned_and_untouched"
  "Ctrl-C during a server group's verification|group::ctrl_c_during_the_groups_verification_puts_every_rank_back"
  "apply SIGKILLed (with its ssh) during the verification of a crash-looping change|guard::a_crash_looping_change_goes_back_when_the_controller_is_killed"
  "apply SIGKILLed during the verification of a healthy change|guard::a_healthy_change_whose_controller_dies_is_kept_and_the_next_apply_confirms_it"
  "apply SIGKILLed during its own rollback|guard::the_controller_killed_during_its_own_rollback_leaves_the_guard_to_finish_it"
  "a server group's apply SIGKILLed during the verification of a broken change|group::a_group_whose_apply_is_killed_gets_every_rank_back_from_its_hosts_guard"
  "host's link cut past the guard's lease during verification|guard::a_link_cut_past_the_deadline_leaves_the_rollback_to_the_host_and_apply_reports_it"
)
passed=0; failed=0
echo "fault matrix:"
for row in "${matrix[@]}"; do
  fault=${row%%|*}; test=${row#*|}
  if grep -qE "^test ${test} \.\.\. ok$" "$log"; then
    printf '  PASS  %s\n' "$fault"; passed=$((passed + 1))
  else
    printf '  FAIL  %s  (%s)\n' "$fault" "$test"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
