//! A diagnosis of a failed start from its journal: the known SGLang failure signatures, each
//! taken from a line that SGLang (or what it runs on: argparse, torch, transformers, uvicorn)
//! really prints, with the cause in words and what to change.
//!
//! The signatures are tried in this order and the first that matches wins:
//!
//! 1. argparse refused the command line (`error: unrecognized arguments`, `error: argument ...`);
//! 2. the model path is missing, or its folder has no usable `config.json` (transformers /
//!    huggingface_hub);
//! 3. `--context-length` above the model's derived context length (SGLang's `ModelConfig`);
//! 4. a chat template (`--chat-template`) that is neither a built-in name nor a file;
//! 5. a dtype or quantization this device or checkpoint refuses (`--kv-cache-dtype`,
//!    `--quantization`);
//! 6. `CUDA error: invalid device ordinal` (fewer GPUs visible than `--tp-size` asks for);
//! 7. CUDA out of memory, with its phase (weights, KV cache pool, CUDA graph capture, later);
//! 8. SGLang's own "Not enough memory" for the KV cache (no room left after the weights);
//! 9. CUDA graph capture failed for another reason;
//! 10. a port already in use (uvicorn's bind error, SGLang's port checks);
//! 11. an NCCL error;
//! 12. a scheduler killed by SIGKILL: during initialization (the OS OOM killer, host memory) or
//!     after start-up (SGLang's subprocess watchdog).
//!
//! Causes before consequences: argparse exits before anything runs; the model's config is read
//! next, and the context length is judged against it, both while the arguments are resolved,
//! before any process starts; the chat template is loaded when the tokenizer manager starts and a
//! refused dtype or quantization fails while the scheduler loads the model, both before a GPU
//! allocation could run out; a CUDA OOM often ends in NCCL errors on the other ranks, and a rank
//! that died of it in "scheduler died during initialization", so those come later. Rows 1 to 5
//! and 12 (after start-up) match lines of real SGLang 0.5.23 journals, kept as fixtures in
//! `fixtures/journals/sglang-0.5.23-cpu/`. Pure: the journal text in, a value out.

use serde::Serialize;

/// Why a start failed, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    pub cause: String,
    pub advice: String,
}

impl Diagnosis {
    fn new(cause: impl Into<String>, advice: impl Into<String>) -> Self {
        Diagnosis {
            cause: cause.into(),
            advice: advice.into(),
        }
    }
}

/// The first known failure signature in `journal`, or `None`.
pub fn diagnose(journal: &str) -> Option<Diagnosis> {
    let lines: Vec<&str> = journal.lines().collect();
    SIGNATURES.iter().find_map(|check| check(&lines))
}

type Check = fn(&[&str]) -> Option<Diagnosis>;

/// In the documented order (see the module's comment and docs/verification.md, "Diagnoses").
const SIGNATURES: [Check; 12] = [
    bad_arguments,
    missing_model,
    context_too_long,
    missing_chat_template,
    refused_dtype,
    invalid_device_ordinal,
    cuda_oom,
    kv_not_enough_memory,
    graph_capture_failed,
    port_in_use,
    nccl_error,
    scheduler_killed,
];

fn first<'a>(lines: &[&'a str], pred: impl Fn(&str) -> bool) -> Option<(usize, &'a str)> {
    lines.iter().copied().enumerate().find(|(_, l)| pred(l))
}

/// The text after `marker` on `line`, trimmed, at most 200 characters.
fn after<'a>(line: &'a str, marker: &str) -> &'a str {
    let rest = line
        .find(marker)
        .map_or("", |i| &line[i + marker.len()..])
        .trim();
    match rest.char_indices().nth(200) {
        Some((i, _)) => &rest[..i],
        None => rest,
    }
}

/// argparse (`ArgumentParser.error`, called from `parse_args` / `parse_known_args`; SGLang's
/// parser is built in `sglang/srt/server_args.py`: `prepare_server_args`) prints
/// `<prog>: error: unrecognized arguments: --x` or `<prog>: error: argument --port: invalid int
/// value: 'x'` and exits 2. Preflight refuses most of these before a host changes; this catches
/// the rest (a different SGLang on the host than the catalogue).
fn bad_arguments(lines: &[&str]) -> Option<Diagnosis> {
    if let Some((_, l)) = first(lines, |l| l.contains("error: unrecognized arguments:")) {
        let args = after(l, "error: unrecognized arguments:");
        return Some(Diagnosis::new(
            format!("SGLang does not know these arguments: {args}"),
            "remove or rename them in the manifest's flags; check the flag names of the SGLang \
             version on the host (`python3 -m sglang.launch_server --help`)",
        ));
    }
    let (_, l) = first(lines, |l| {
        (l.contains("launch_server.py: error: ") || l.contains("sglang serve: error: "))
            && l.contains("error: argument ")
    })?;
    Some(Diagnosis::new(
        format!("SGLang refused an argument: {}", after(l, "error: ")),
        "fix that flag's value in the manifest",
    ))
}

/// A model path that is neither a local folder nor a Hub id. SGLang reads the config through
/// transformers (`sglang/srt/utils/hf_transformers/config.py`: `get_config`, which re-raises the
/// parser's `OSError`/`ValueError`); transformers' `utils/hub.py` (`cached_files`) says
/// `... is not a local folder and is not a valid model identifier listed on
/// 'https://huggingface.co/models'`, its `configuration_utils.py` (`_get_config_dict`) `Can't
/// load the configuration of '...'`, and huggingface_hub (`utils/_validators.py`:
/// `validate_repo_id`) `Repo id must be in the form 'repo_name' or 'namespace/repo_name'` for an
/// absolute path that does not exist.
///
/// A folder that exists but holds no `config.json` is no `OSError` (real 0.5.23 journal,
/// `missing-config-json.log`): `cached_file` finds no file, the config is empty, and
/// transformers' `models/auto/configuration_auto.py` (`AutoConfig.from_pretrained`, reached from
/// `HfModelConfigParser.parse` in the same `config.py` while the arguments are resolved) raises
/// ``ValueError: Unrecognized model in /models/x. Should have a `model_type` key in its
/// config.json.``, which a `config.json` without `model_type` gives too.
fn missing_model(lines: &[&str]) -> Option<Diagnosis> {
    if let Some((_, l)) = first(lines, |l| {
        l.contains("Unrecognized model in ") && l.contains("Should have a `model_type` key in its")
    }) {
        let rest = after(l, "Unrecognized model in ");
        let folder = rest.find(". Should have").map_or(rest, |i| &rest[..i]);
        return Some(Diagnosis::new(
            format!(
                "the model folder {folder} has no config.json (or its config.json has no \
                 `model_type`)"
            ),
            "put the checkpoint's config.json in that folder on the host (a complete copy of the \
             model) or point --model-path at the folder that holds it; a config.json without \
             `model_type` is not a transformers model config",
        ));
    }
    let (_, l) = first(lines, |l| {
        l.contains("is not a local folder and is not a valid model identifier")
            || l.contains("Can't load the configuration of")
            || l.contains("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")
            || (l.contains("No such file or directory") && l.contains("config.json"))
    })?;
    let shown = l.trim();
    let shown = match shown.char_indices().nth(200) {
        Some((i, _)) => &shown[..i],
        None => shown,
    };
    Some(Diagnosis::new(
        format!("the model was not found: {shown}"),
        "check --model-path: the folder must exist on the host (with its config.json) or be a \
         Hub id the host can download; also check that the unit's user can read it",
    ))
}

/// The number in the first `(...)` after `marker` on `line`.
fn number_after(line: &str, marker: &str) -> Option<u64> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let open = rest.find('(')?;
    let close = open + rest[open..].find(')')?;
    rest[open + 1..close].trim().parse().ok()
}

/// 0.5.23 `sglang/srt/configs/model_config.py`: `ModelConfig._derive_context_length` (run while
/// the arguments are resolved, `srt/server_args.py`: `ServerArgs.resolve_once`) raises
/// `ValueError: Warning: User-specified context_length (1000000) is greater than the derived
/// context_length (2048). This may lead to incorrect model outputs or CUDA errors. ... To allow
/// overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1`
/// (real journal, `context-length-too-long.log`). With a draft model it says `Target model's
/// context_length (N)` instead, about the draft's derived length. With the variable set it only
/// logs the same text as a warning, without the variable's name, and the server starts: that
/// line is no cause.
fn context_too_long(lines: &[&str]) -> Option<Diagnosis> {
    let (_, l) = first(lines, |l| {
        l.contains("context_length (")
            && l.contains("is greater than the derived context_length (")
            && l.contains("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")
    })?;
    let asked = number_after(l, "context_length");
    let derived = number_after(l, "the derived context_length");
    let (Some(asked), Some(derived)) = (asked, derived) else {
        return Some(Diagnosis::new(
            format!("the context length is above the model's: {}", after(l, "")),
            "lower --context-length to at most the model's derived context length, or set \
             SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in the manifest's env only if the model \
             really supports the longer context (past it outputs can be wrong, or CUDA errors)",
        ));
    };
    if l.contains("Target model's context_length") {
        return Some(Diagnosis::new(
            format!(
                "the target model's context length {asked} is above the draft model's derived \
                 context length {derived}"
            ),
            format!(
                "lower --context-length to at most {derived}, or use a draft model with a longer \
                 context; SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in the manifest's env \
                 overrides it at the risk of wrong drafts"
            ),
        ));
    }
    Some(Diagnosis::new(
        format!(
            "--context-length {asked} is above the model's derived context length {derived} \
             (from its config.json)"
        ),
        format!(
            "lower --context-length to at most {derived}; or, only if the model really supports \
             {asked} tokens (e.g. with rope scaling), set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 \
             in the manifest's env: past the length the model was made for, SGLang warns of \
             incorrect outputs or CUDA errors"
        ),
    ))
}

/// 0.5.23 `sglang/srt/parser/template_manager.py`: `TemplateManager._load_explicit_chat_template`
/// (from `initialize_templates`, which `srt/entrypoints/engine.py`: `init_tokenizer_manager`
/// runs after the scheduler started, before the HTTP port opens) raises `RuntimeError: Chat
/// template /x.jinja is not a built-in template name or a valid chat template file path.` (real
/// journal, `missing-chat-template.log`).
fn missing_chat_template(lines: &[&str]) -> Option<Diagnosis> {
    let (_, l) = first(lines, |l| {
        l.contains("is not a built-in template name or a valid chat template file path")
    })?;
    let rest = after(l, "Chat template ");
    let template = rest
        .find(" is not a built-in template name")
        .map_or(rest, |i| &rest[..i]);
    Some(Diagnosis::new(
        format!(
            "the chat template {template} is neither a built-in template name nor a file on the host"
        ),
        "copy the template to that path on the host (readable by the unit's user), fix \
         --chat-template (a file path or a built-in name), or drop it to use the tokenizer's own \
         chat template",
    ))
}

/// A dtype or quantization that the device or the checkpoint refuses, raised in the scheduler
/// while it loads the model (`Scheduler hit an exception:`), each from a real 0.5.23 journal on
/// the CPU engine:
/// - `ValueError: --kv-cache-dtype fp8_e5m2 is not supported on CPU.`
///   (`sglang/srt/mem_cache/kv_cache_dtype.py`: `configure_kv_cache_dtype`;
///   `kv-cache-dtype-fp8-e5m2-cpu.log`);
/// - `AssertionError: Fp8LinearMethod on CPU requires that CPU has AMX support` (`Fp8MoEMethod`
///   for MoE layers; `sglang/srt/layers/quantization/fp8.py`:
///   `Fp8LinearMethod.process_weights_after_loading`; AMX there is `srt/utils/common.py`:
///   `cpu_has_amx_support`, AMX tiles and sgl-kernel's CPU op `convert_weight_packed`;
///   `quantization-fp8-cpu-without-amx.log`);
/// - `ValueError: Cannot find the config file for awq`: `--quantization` names a method whose
///   config the checkpoint lacks (`sglang/srt/model_loader/weight_utils.py`:
///   `get_quant_config`; `quantization-awq-unquantized-model.log`).
fn refused_dtype(lines: &[&str]) -> Option<Diagnosis> {
    // Not the traceback's source line (`raise ValueError("--kv-cache-dtype fp8_e5m2 ...")`,
    // `raise ValueError(f"Cannot find the config file for {model_config.quantization}")`), the
    // exception's own.
    let (_, l) = first(lines, |l| {
        !l.trim_start().starts_with("raise ")
            && ((l.contains("--kv-cache-dtype ") && l.contains(" is not supported on "))
                || l.contains("on CPU requires that CPU has AMX support")
                || l.contains("Cannot find the config file for "))
    })?;
    if l.contains("--kv-cache-dtype ") {
        let shown = &l[l.find("--kv-cache-dtype ").unwrap_or(0)..];
        let shown = shown.trim_end();
        let shown = shown.strip_suffix('.').unwrap_or(shown);
        return Some(Diagnosis::new(
            format!("SGLang refused the KV cache dtype: {shown}"),
            "remove --kv-cache-dtype (auto: the model's dtype) or choose one this device \
             supports",
        ));
    }
    if l.contains("AMX support") {
        return Some(Diagnosis::new(
            "FP8 (--quantization fp8 or an FP8 checkpoint) on SGLang's CPU engine needs Intel \
             AMX, which this host lacks (a CPU with AMX tiles and the CPU build of sgl-kernel)",
            "drop --quantization fp8 and serve an unquantized (bf16) checkpoint on this host, or \
             move the unit to a host with AMX (`grep -o amx_tile /proc/cpuinfo`) and sgl-kernel's \
             CPU build",
        ));
    }
    let method = after(l, "Cannot find the config file for ");
    Some(Diagnosis::new(
        format!(
            "--quantization {method} needs a checkpoint quantized with {method}, and the model \
             folder has no quantization config for it"
        ),
        format!(
            "remove --quantization {method} if the checkpoint is not a {method} one (the \
             checkpoint's config.json names its own quantization), or point --model-path at a \
             {method} checkpoint"
        ),
    ))
}

/// CUDA's `cudaErrorInvalidDevice` as torch raises it (`torch.AcceleratorError: CUDA error:
/// invalid device ordinal`, c10/cuda `C10_CUDA_CHECK`), when a rank sets a GPU index that is not
/// visible: `--tp-size` (times `--dp-size`, from `--base-gpu-id`) more than the GPUs in
/// `CUDA_VISIBLE_DEVICES`.
fn invalid_device_ordinal(lines: &[&str]) -> Option<Diagnosis> {
    first(lines, |l| l.contains("invalid device ordinal"))?;
    Some(Diagnosis::new(
        "CUDA error: invalid device ordinal: the server asked for a GPU that is not visible",
        "make --tp-size (and --base-gpu-id) fit the GPUs in CUDA_VISIBLE_DEVICES, or give the \
         unit more GPUs",
    ))
}

/// Where in the start a CUDA OOM came, from the last phase line SGLang logged before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Unknown,
    /// `Load weight begin.` (`sglang/srt/model_executor/model_runner.py`: `ModelRunner.load_model`).
    Weights,
    /// `Load weight end.` (same function): the next big allocation is the KV cache pool
    /// (`KV Cache is allocated.`, `sglang/srt/mem_cache/memory_pool.py` in 0.5.9; `Memory pool
    /// end.`, `sglang/srt/mem_cache/kv_cache_configurator.py`: `configure` in 0.5.23).
    KvPool,
    /// `Capture target decode CUDA graph begin.` (0.5.23
    /// `sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py`:
    /// `capture_decode_graph`), `Capture cuda graph begin. This can take up to several minutes.`
    /// (0.5.9 `model_runner.py`: `ModelRunner.init_device_graphs`), the `Capturing batches`
    /// progress bar (0.5.9 `cuda_graph_runner.py`: `CudaGraphRunner.capture`), or the error's own `Capture cuda graph failed:` (`decode_cuda_graph_runner.py`:
    /// `DecodeCudaGraphRunner.__init__`; 0.5.9 `cuda_graph_runner.py`: `CudaGraphRunner.__init__`).
    Graph,
    /// After `... CUDA graph end.`: warmup or the first requests.
    Serving,
}

fn phase_of(line: &str, phase: Phase) -> Phase {
    let lower = line.to_ascii_lowercase();
    if lower.contains("capture cuda graph failed")
        || lower.contains("capture prefill cuda graph failed")
    {
        Phase::Graph
    } else if lower.contains("cuda graph end") {
        Phase::Serving
    } else if lower.contains("cuda graph begin") || lower.contains("capturing batches") {
        Phase::Graph
    } else if line.contains("Load weight end") || line.contains("KV Cache is allocated") {
        Phase::KvPool
    } else if line.contains("Load weight begin") || line.contains("Loading safetensors checkpoint")
    {
        Phase::Weights
    } else {
        phase
    }
}

/// torch's allocator (c10/cuda/CUDACachingAllocator.cpp) raises `torch.OutOfMemoryError: CUDA out
/// of memory. Tried to allocate ...`; a raw CUDA call says `CUDA error: out of memory`. SGLang
/// logs the scheduler's exception (`sglang/srt/managers/scheduler.py`: `run_scheduler_process`,
/// `Scheduler hit an exception: ...`) and wraps capture failures in `Capture cuda graph failed:
/// {e}` with its `CUDA_GRAPH_CAPTURE_FAILED_MSG`
/// (`sglang/srt/model_executor/runner_backend_utils/__init__.py`).
fn cuda_oom(lines: &[&str]) -> Option<Diagnosis> {
    let (at, _) = first(lines, |l| {
        l.contains("CUDA out of memory")
            || l.contains("OutOfMemoryError")
            || l.contains("CUDA error: out of memory")
    })?;
    let phase = lines[..=at]
        .iter()
        .fold(Phase::Unknown, |p, l| phase_of(l, p));
    Some(match phase {
        Phase::Weights => Diagnosis::new(
            "CUDA out of memory while loading the weights: the model does not fit the GPUs",
            "use more GPUs (raise --tp-size), a quantized checkpoint or --quantization, or free \
             the GPUs of other processes",
        ),
        Phase::KvPool => Diagnosis::new(
            "CUDA out of memory allocating the KV cache (memory pool)",
            "lower --mem-fraction-static (or cap --max-total-tokens), or free the GPUs of other \
             processes",
        ),
        Phase::Graph => Diagnosis::new(
            "CUDA out of memory during CUDA graph capture",
            "lower --cuda-graph-max-bs-decode (0.5.9: --cuda-graph-max-bs) or \
             --mem-fraction-static",
        ),
        Phase::Serving => Diagnosis::new(
            "CUDA out of memory after start-up (warmup or the first requests)",
            "lower --mem-fraction-static, --max-running-requests or --chunked-prefill-size",
        ),
        Phase::Unknown => Diagnosis::new(
            "CUDA out of memory",
            "lower --mem-fraction-static, raise --tp-size, or free the GPUs of other processes",
        ),
    })
}

/// `Not enough memory. Please try to increase --mem-fraction-static.`: the weights left no room
/// for a KV cache (`max_total_num_tokens <= 0`). 0.5.23
/// `sglang/srt/model_executor/pool_configurator.py`: `MemoryPoolConfig.__post_init__`; 0.5.9
/// `sglang/srt/model_executor/model_runner_kv_cache_mixin.py`.
fn kv_not_enough_memory(lines: &[&str]) -> Option<Diagnosis> {
    first(lines, |l| {
        l.contains("Not enough memory. Please try to increase --mem-fraction-static")
    })?;
    Some(Diagnosis::new(
        "no GPU memory left for the KV cache after the weights (SGLang: \"Not enough memory\")",
        "raise --mem-fraction-static, or use more GPUs (raise --tp-size) or a smaller or \
         quantized model",
    ))
}

/// `Capture cuda graph failed: {e}` without an OOM in it (`decode_cuda_graph_runner.py`:
/// `DecodeCudaGraphRunner.__init__`; 0.5.9 `cuda_graph_runner.py`: `CudaGraphRunner.__init__`),
/// whose `CUDA_GRAPH_CAPTURE_FAILED_MSG` lists the same remedies.
fn graph_capture_failed(lines: &[&str]) -> Option<Diagnosis> {
    let (_, l) = first(lines, |l| {
        l.contains("Capture cuda graph failed:") || l.contains("Capture prefill CUDA graph failed:")
    })?;
    Some(Diagnosis::new(
        format!("CUDA graph capture failed: {}", after(l, "failed:")),
        "lower --mem-fraction-static or --cuda-graph-max-bs-decode (0.5.9: --cuda-graph-max-bs); \
         as a last resort --disable-cuda-graph (slow)",
    ))
}

/// The HTTP port: uvicorn (`uvicorn/server.py`: `Server.startup`, run by
/// `sglang/srt/entrypoints/http_server.py`: `launch_server`) logs `[Errno 98] error while
/// attempting to bind on address ('0.0.0.0', 30000): address already in use`. SGLang's own
/// ports (derived from `--port`): `sglang/srt/server_args.py`: `PortArgs.init_new` logs `Port is
/// already in use. ...` after `sglang/srt/utils/network.py`: `wait_port_available` raised `...
/// at N is not available in 30 seconds`.
fn port_in_use(lines: &[&str]) -> Option<Diagnosis> {
    let (_, l) = first(lines, |l| {
        l.contains("error while attempting to bind on address")
            || l.contains("Port is already in use.")
            || (l.contains(" is not available in ") && l.contains("seconds"))
    })?;
    let cause = if l.contains("error while attempting to bind on address") {
        // `('::', 30000)`: up to the first `)`, which a host address never holds.
        let addr = after(l, "bind on address");
        let addr = addr.find(')').map_or(addr, |i| &addr[..=i]);
        format!("the HTTP port is already in use: {addr}")
    } else {
        "a port SGLang needs (--port or one derived from it) is already in use".to_string()
    };
    Some(Diagnosis::new(
        cause,
        "stop what holds the port (`ss -ltnp`) or move the unit to a free --port; SGLang also \
         uses ports above --port",
    ))
}

/// `NCCL error: ...` (`sglang/srt/distributed/device_communicators/pynccl_wrapper.py`:
/// `NCCLLibrary.NCCL_CHECK`), and torch's `ProcessGroupNCCL` / `DistBackendError: NCCL error`.
fn nccl_error(lines: &[&str]) -> Option<Diagnosis> {
    let (_, l) = first(lines, |l| {
        l.contains("NCCL error")
            || l.contains("ProcessGroupNCCL")
            || l.contains("ncclInternalError")
    })?;
    let shown = match (l.find("NCCL error"), l.contains("exception:")) {
        (Some(i), _) => after(&l[i..], ""),
        (None, true) => after(l, "exception:"),
        (None, false) => after(l, ""),
    };
    Some(Diagnosis::new(
        format!("NCCL (the GPUs' collective communication) failed: {shown}"),
        "check the GPUs and their links (`nvidia-smi topo -m`), that the ranks' GPUs are \
         healthy, and rerun with NCCL_DEBUG=INFO in the manifest's env for details",
    ))
}

/// 0.5.23 `sglang/srt/entrypoints/engine.py`: `_scheduler_died_error`: `Rank N scheduler died
/// during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS
/// OOM killer.`
///
/// After start-up (real 0.5.23 journal, `scheduler-sigkill-after-ready.log`), the subprocess
/// watchdog that `Engine._launch_subprocesses` starts (`sglang/srt/utils/watchdog.py`:
/// `SubprocessWatchdog._check_processes`, once a second) logs `Subprocess scheduler_0 (pid=N)
/// crashed with exit code -9. Triggering SIGQUIT for cleanup...`; the tokenizer manager's
/// handler (`srt/managers/tokenizer_manager.py`: `SignalHandler.running_phase_sigquit_handler`)
/// sleeps 5 s and `kill_process_tree` (`srt/utils/common.py`) SIGKILLs the tree and the main
/// process itself: the unit's main process ends killed by signal 9 (exit status 137).
fn scheduler_killed(lines: &[&str]) -> Option<Diagnosis> {
    if let Some((_, l)) = first(lines, |l| {
        l.contains("Subprocess ") && l.contains(" crashed with exit code -9")
    }) {
        let rest = after(l, "Subprocess ");
        let name = rest.find(" (pid=").map_or("a subprocess", |i| &rest[..i]);
        let pid = after(rest, "(pid=");
        let pid = pid.find(')').map_or("", |i| &pid[..i]);
        return Some(Diagnosis::new(
            format!(
                "SGLang's {name} process (pid {pid}) was killed (SIGKILL) after start-up, and \
                 SGLang then killed the whole server"
            ),
            "something outside SGLang sent SIGKILL: most often the OS OOM killer (check `dmesg \
             -T | grep -i oom` and the unit's MemoryMax), else an operator's or a tool's `kill \
             -9`; give the unit more host memory or lower what it holds in RAM",
        ));
    }
    first(lines, |l| {
        l.contains("scheduler died during initialization (exit code: -9)")
    })?;
    Some(Diagnosis::new(
        "a scheduler was killed (SIGKILL) during initialization, most likely by the OS OOM \
         killer (host memory)",
        "check `dmesg -T | grep -i oom`; give the unit more host memory (MemoryMax) or lower \
         what it holds in RAM while loading",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(journal: &str) -> String {
        diagnose(journal).expect("a diagnosis").cause
    }

    #[test]
    fn unrecognized_arguments_from_argparse() {
        let j =
            "usage: sglang serve [-h] ...\nsglang serve: error: unrecognized arguments: --bogus 3";
        let d = diagnose(j).unwrap();
        assert_eq!(d.cause, "SGLang does not know these arguments: --bogus 3");
        assert!(d.advice.contains("flags"));
    }

    #[test]
    fn bad_argument_value_from_argparse() {
        let j = "launch_server.py: error: argument --port: invalid int value: 'notanint'";
        assert_eq!(
            cause(j),
            "SGLang refused an argument: argument --port: invalid int value: 'notanint'"
        );
    }

    #[test]
    fn missing_model() {
        for line in [
            "OSError: /models/nope is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'",
            "OSError: Can't load the configuration of '/models/nope'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name.",
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/nope'. Use `repo_type` argument if needed.",
        ] {
            let d = diagnose(line).unwrap();
            assert!(d.cause.starts_with("the model was not found: "), "{line}");
            assert!(d.advice.contains("--model-path"));
        }
    }

    #[test]
    fn invalid_device_ordinal() {
        let j = "Traceback (most recent call last):\ntorch.AcceleratorError: CUDA error: invalid device ordinal";
        let d = diagnose(j).unwrap();
        assert!(d.cause.contains("invalid device ordinal"));
        assert!(d.advice.contains("--tp-size") && d.advice.contains("CUDA_VISIBLE_DEVICES"));
    }

    const OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.58 GiB of which 0 bytes is free.";

    #[test]
    fn oom_while_loading_weights() {
        let j = format!(
            "[2026-01-01 00:00:00] Load weight begin. avail mem=95.00 GB\n\
             [2026-01-01 00:00:01] Scheduler hit an exception: Traceback (most recent call last):\n{OOM}"
        );
        let d = diagnose(&j).unwrap();
        assert_eq!(
            d.cause,
            "CUDA out of memory while loading the weights: the model does not fit the GPUs"
        );
        assert!(d.advice.contains("--tp-size"));
    }

    #[test]
    fn oom_in_kv_pool() {
        let j = format!(
            "Load weight begin. avail mem=95.00 GB\n\
             Load weight end. elapsed=3.00 s, type=X, avail mem=40.00 GB, mem usage=55.00 GB.\n{OOM}"
        );
        let d = diagnose(&j).unwrap();
        assert_eq!(
            d.cause,
            "CUDA out of memory allocating the KV cache (memory pool)"
        );
        assert!(d.advice.contains("--mem-fraction-static"));
    }

    #[test]
    fn oom_in_cuda_graph_capture() {
        // 0.5.23's begin line, and 0.5.9's wrapped error without a begin line.
        let j = format!(
            "Load weight end. elapsed=3.00 s\nKV Cache is allocated. #tokens: 100, KV size: 1.00 GB\n\
             Memory pool end. avail mem=3.00 GB\n\
             Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=3.00 GB\n{OOM}"
        );
        let d = diagnose(&j).unwrap();
        assert_eq!(d.cause, "CUDA out of memory during CUDA graph capture");
        assert!(
            d.advice.contains("--cuda-graph-max-bs-decode")
                && d.advice.contains("--mem-fraction-static")
        );
        let j = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB.\nPossible solutions:";
        assert_eq!(cause(j), "CUDA out of memory during CUDA graph capture");
    }

    #[test]
    fn oom_after_capture_and_without_phase() {
        let j =
            format!("Capture cuda graph begin.\nCapture cuda graph end. Time elapsed: 3 s\n{OOM}");
        assert_eq!(
            cause(&j),
            "CUDA out of memory after start-up (warmup or the first requests)"
        );
        assert_eq!(cause(OOM), "CUDA out of memory");
        assert_eq!(
            cause("RuntimeError: CUDA error: out of memory"),
            "CUDA out of memory"
        );
    }

    #[test]
    fn kv_not_enough_memory() {
        let j = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.5";
        let d = diagnose(j).unwrap();
        assert!(d.cause.contains("KV cache"));
        assert!(d.advice.starts_with("raise --mem-fraction-static"));
    }

    #[test]
    fn graph_capture_failed_without_oom() {
        let j = "Exception: Capture cuda graph failed: an illegal instruction\nPossible solutions:";
        assert_eq!(
            cause(j),
            "CUDA graph capture failed: an illegal instruction"
        );
    }

    #[test]
    fn port_in_use() {
        let j = "[2026-01-01 00:00:05] ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', 37001): address already in use";
        let d = diagnose(j).unwrap();
        assert_eq!(
            d.cause,
            "the HTTP port is already in use: ('127.0.0.1', 37001)"
        );
        assert!(d.advice.contains("--port"));
        let j = "ERROR: [Errno 98] error while attempting to bind on address ('::', 30000): address already in use";
        assert_eq!(cause(j), "the HTTP port is already in use: ('::', 30000)");
        let j = "Port is already in use. dist_init_port=30001 port_base=30002";
        assert!(cause(j).contains("already in use"));
        let j = "ValueError: port_base at 30002 is not available in 30 seconds. port_base at 30002 is not available";
        assert!(cause(j).contains("already in use"));
    }

    #[test]
    fn nccl_error() {
        let j = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)";
        let d = diagnose(j).unwrap();
        assert_eq!(
            d.cause,
            "NCCL (the GPUs' collective communication) failed: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
        );
        assert!(d.advice.contains("NCCL_DEBUG"));
        // torch's watchdog line (as the stand-in's dead-rank mode prints it).
        let j = "[rank3]:[E1201 09:09:48.753042 29333 ProcessGroupNCCL.cpp:1910] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered";
        assert_eq!(
            cause(j),
            "NCCL (the GPUs' collective communication) failed: CUDA error: an illegal memory access was encountered"
        );
    }

    #[test]
    fn scheduler_killed() {
        let j = "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.";
        assert!(cause(j).contains("OOM killer"));
    }

    // Real SGLang 0.5.23 journals (CPU engine, 2026-12-01), the last 50 lines as `journalctl -n
    // 50 -o cat` gives them, redacted; see fixtures/journals/sglang-0.5.23-cpu/README.md.
    macro_rules! real {
        ($name:literal) => {
            include_str!(concat!("../../fixtures/journals/sglang-0.5.23-cpu/", $name))
        };
    }

    #[test]
    fn real_context_length_too_long() {
        let d = diagnose(real!("context-length-too-long.log")).unwrap();
        assert_eq!(
            d.cause,
            "--context-length 1000000 is above the model's derived context length 2048 (from its config.json)"
        );
        assert!(d
            .advice
            .starts_with("lower --context-length to at most 2048;"));
        assert!(d
            .advice
            .contains("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"));
        assert!(d.advice.contains("incorrect outputs or CUDA errors"));
    }

    #[test]
    fn context_length_of_a_draft_model() {
        let j = "ValueError: Warning: Target model's context_length (65536) is greater than the derived context_length (4096). This may lead to incorrect model outputs or CUDA errors.";
        let j = format!("{j} To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1");
        let d = diagnose(&j).unwrap();
        assert_eq!(
            d.cause,
            "the target model's context length 65536 is above the draft model's derived context length 4096"
        );
        assert!(d
            .advice
            .starts_with("lower --context-length to at most 4096"));
    }

    #[test]
    fn context_length_allowed_by_the_variable_is_only_a_warning() {
        // With SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 the same text is a warning and the
        // start goes on: a later failure is the cause.
        let j = format!(
            "[2026-12-01 21:31:14] Warning: User-specified context_length (1000000) is greater than the derived context_length (2048). This may lead to incorrect model outputs or CUDA errors.\n\
             Load weight begin. avail mem=95.00 GB\n{OOM}"
        );
        assert_eq!(
            cause(&j),
            "CUDA out of memory while loading the weights: the model does not fit the GPUs"
        );
    }

    #[test]
    fn real_missing_config_json() {
        let d = diagnose(real!("missing-config-json.log")).unwrap();
        assert_eq!(
            d.cause,
            "the model folder /models/tiny-model-without-config has no config.json (or its config.json has no `model_type`)"
        );
        assert!(d.advice.contains("config.json") && d.advice.contains("--model-path"));
    }

    #[test]
    fn real_missing_chat_template() {
        let d = diagnose(real!("missing-chat-template.log")).unwrap();
        assert_eq!(
            d.cause,
            "the chat template /nonexistent/template.jinja is neither a built-in template name nor a file on the host"
        );
        assert!(d.advice.contains("--chat-template"));
    }

    #[test]
    fn real_refused_kv_cache_dtype() {
        let d = diagnose(real!("kv-cache-dtype-fp8-e5m2-cpu.log")).unwrap();
        assert_eq!(
            d.cause,
            "SGLang refused the KV cache dtype: --kv-cache-dtype fp8_e5m2 is not supported on CPU"
        );
        assert!(d.advice.starts_with("remove --kv-cache-dtype"));
    }

    #[test]
    fn real_fp8_without_amx() {
        let d = diagnose(real!("quantization-fp8-cpu-without-amx.log")).unwrap();
        assert!(d.cause.starts_with(
            "FP8 (--quantization fp8 or an FP8 checkpoint) on SGLang's CPU engine needs Intel AMX"
        ));
        assert!(d.advice.starts_with("drop --quantization fp8"));
    }

    #[test]
    fn real_quantization_without_its_config() {
        let d = diagnose(real!("quantization-awq-unquantized-model.log")).unwrap();
        assert_eq!(
            d.cause,
            "--quantization awq needs a checkpoint quantized with awq, and the model folder has no quantization config for it"
        );
        assert!(d.advice.starts_with("remove --quantization awq"));
    }

    #[test]
    fn real_scheduler_killed_after_start_up() {
        let d = diagnose(real!("scheduler-sigkill-after-ready.log")).unwrap();
        assert_eq!(
            d.cause,
            "SGLang's scheduler_0 process (pid 30844) was killed (SIGKILL) after start-up, and SGLang then killed the whole server"
        );
        assert!(d.advice.contains("OOM killer") && d.advice.contains("MemoryMax"));
    }

    #[test]
    fn real_scheduler_killed_during_initialization() {
        let d = diagnose(real!("scheduler-sigkill-during-init.log")).unwrap();
        assert_eq!(
            d.cause,
            "a scheduler was killed (SIGKILL) during initialization, most likely by the OS OOM killer (host memory)"
        );
        assert!(d.advice.contains("dmesg"));
    }

    #[test]
    fn real_unrecognized_argument() {
        let d = diagnose(real!("unrecognized-argument.log")).unwrap();
        assert_eq!(
            d.cause,
            "SGLang does not know these arguments: --tp-sizee 1"
        );
    }

    /// Every real journal kept as a fixture gets a diagnosis: a new fixture without one fails.
    #[test]
    fn every_real_journal_has_a_diagnosis() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/journals/sglang-0.5.23-cpu");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the fixtures folder") {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("log") {
                continue;
            }
            let journal = std::fs::read_to_string(&path).unwrap();
            assert!(
                journal.lines().count() <= 50,
                "{}: more than the 50 lines apply reads",
                path.display()
            );
            let d = diagnose(&journal);
            assert!(d.is_some(), "no diagnosis for {}", path.display());
            seen += 1;
        }
        assert!(seen >= 8, "only {seen} real journals in {}", dir.display());
    }

    #[test]
    fn none_without_a_signature() {
        assert_eq!(diagnose(""), None);
        let j =
            "[2026-01-01] Load weight begin. avail mem=95.00 GB\nRuntimeError: simulated crash\n\
                 Received sigquit from a child process. It usually means the child failed.";
        assert_eq!(diagnose(j), None);
    }

    #[test]
    fn order_causes_before_consequences() {
        // An OOM on one rank and NCCL errors on the others: the OOM.
        let j = format!("[rank1]: NCCL error: unhandled cuda error\nLoad weight begin.\n{OOM}");
        assert_eq!(
            cause(&j),
            "CUDA out of memory while loading the weights: the model does not fit the GPUs"
        );
        // The rank that died of it: still the OOM.
        let j = format!("{OOM}\nRank 0 scheduler died during initialization (exit code: -9).");
        assert_eq!(cause(&j), "CUDA out of memory");
        // An invalid device ordinal before an OOM; argparse before everything.
        let j = format!("CUDA error: invalid device ordinal\n{OOM}");
        assert!(cause(&j).contains("invalid device ordinal"));
        let j = "CUDA error: invalid device ordinal\nlaunch_server.py: error: unrecognized arguments: --x";
        assert!(cause(j).starts_with("SGLang does not know"));
        // An OOM inside a capture failure is an OOM, not a plain capture failure.
        let j = "Capture cuda graph failed: CUDA out of memory.";
        assert_eq!(cause(j), "CUDA out of memory during CUDA graph capture");
    }
}
