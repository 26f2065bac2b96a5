# reconcile's deep check (src/preflight/gather.rs): the host's own SGLang checks a unit's exact
# arguments and its model's config the way `python -m sglang.launch_server` would before it loads
# any weights; no scheduler starts, no port is bound, and the GPUs (the running server's) are hidden.
#
# stdin: JSON {"args": the unit's arguments after `-m sglang.launch_server`, "env": its
# Environment=, "cwd": its working directory}. It runs as the unit's User=, in its sandbox
# (`systemd-run`, gather.rs deep_argv). The answer is the last stdout line,
# `#reconcile-deep {"verdict": ..., ...}` (see reconcile_core::preflight::read_deep):
#   accepted    every check that could run passed;
#   refused     SGLang refused: "stage" (arguments, resolve, model-config, chat-template), "flag"
#               (the SGLang flag it is about, when known) and "reason" (the exception's first line,
#               or argparse's message);
#   gpu         resolve_once() needs a GPU, so its checks did not run (the others did);
#   unavailable this SGLang has no sglang.srt.server_args to check with.
# "unchecked" lists what could not be checked on this version, and why.
#
# What runs, as read from SGLang 0.5.23's wheel (paths under sglang/):
# 1. launch_server.py `__main__`: load_plugins() (srt/plugins), then prepare_server_args(argv)
#    (srt/server_args.py: argparse; 0.5.9 and older also run their checks in
#    ServerArgs.__post_init__ here, with the GPUs visible, as before).
# 2. launch_server.py run_server(): ServerArgs.resolve_once() (srt/server_args.py), which runs
#    arg_groups/pipeline.py run_resolution_pipeline. On 0.5.23 that reads the model's config.json
#    early (arg_groups/muse_spark_hook.py apply_muse_spark_env_defaults: get_config), then asks for
#    an accelerator (arg_groups/serving_hook.py handle_missing_default_values: get_device()), which
#    fails with the GPUs hidden ("No accelerator ..."): reported as `gpu`, and the checks below run
#    on a fresh, unresolved record instead. On a CPU-engine host it resolves in full, and builds the
#    ModelConfig itself (arg_groups/model_override_base.py model_config_of).
# 3. ModelConfig.from_server_args(record) (srt/configs/model_config.py), as the tokenizer manager
#    builds it at start (srt/managers/tokenizer_manager.py TokenizerManager.init_model_config) and
#    the scheduler (srt/managers/scheduler.py): ModelConfig.__init__ reads config.json through
#    get_config (srt/utils/hf_transformers/config.py), then _get_and_verify_dtype (--dtype against
#    the checkpoint's), _derive_context_length (--context-length above the model's, unless
#    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1), _verify_quantization (--quantization against
#    the checkpoint's quantization_config). It reads config files only; no weights.
# 4. --chat-template, as srt/parser/template_manager.py TemplateManager._load_explicit_chat_template
#    checks it (the server does so in srt/entrypoints/engine.py init_tokenizer_manager, while the
#    scheduler loads the weights): a built-in
#    name (parser/conversation.py chat_template_exists, parser/python_chat_template.py
#    get_python_chat_template) or a file. Importing template_manager costs 6-13 s (it imports the
#    tokenizer manager), so a built-in name or a readable .jinja file is accepted from the light
#    lookups, and only anything else goes through TemplateManager itself, for SGLang's own message.
# An older SGLang lacks some of these, or keeps them elsewhere (no resolve_once before 0.5.2x;
# srt/managers/template_manager.py and srt/conversation.py in older layouts, tried too; no
# configs.model_config in the test stand-in): each missing piece is listed as unchecked.
import json
import os
import sys
import traceback

# The ask on stdin: the unit's arguments ("args"), environment ("env") and working directory
# ("cwd"), never on a command line, where every local user could read a secret among them. The
# environment is the unit's as systemd would give it, at the process's start: the dynamic loader
# reads LD_LIBRARY_PATH only then, so the script runs itself again with it (sys.orig_argv,
# Python 3.10+), the ask handed over in its environment, which only its own user can read.
if "RECONCILE_DEEP_ASK" not in os.environ:
    text = sys.stdin.read() or "{}"
    ask = json.loads(text)
    if ask.get("env") and getattr(sys, "orig_argv", None) and sys.executable:
        os.execve(sys.executable, sys.orig_argv, dict(os.environ, **ask["env"], RECONCILE_DEEP_ASK=text))
else:
    ask = json.loads(os.environ.pop("RECONCILE_DEEP_ASK"))
os.environ.update(ask.get("env") or {})
try:
    os.chdir(ask.get("cwd") or "/")
except OSError:
    pass
argv = list(ask.get("args") or [])
unchecked = []
# Isolated (`python -I`), the check sees no current folder and no PYTHONPATH. The server, run as
# its own user, sees both (`python -m` puts its working directory first): so does the check, run
# as that user. Run as root, it imports only what root owns, and says what it left out.
unit_path = (ask.get("env") or {}).get("PYTHONPATH") or ""
if os.getuid() != 0:
    sys.path[0:0] = [os.getcwd()] + [p for p in unit_path.split(os.pathsep) if p]
elif unit_path:
    unchecked.append("PYTHONPATH: the check ran as root, which imports only what root owns")


class Tee:
    """stderr, remembering its last line: argparse's message before it exits 2."""

    def __init__(self, out):
        self.out, self.last = out, ""

    def write(self, text):
        for line in text.splitlines():
            if line.strip():
                self.last = line.strip()
        return self.out.write(text)

    def __getattr__(self, name):
        return getattr(self.out, name)


sys.stderr = Tee(sys.stderr)


def answer(verdict, code, **fields):
    fields.update(verdict=verdict, unchecked=unchecked)
    sys.stderr.flush()
    print("#reconcile-deep " + json.dumps(fields), flush=True)
    os._exit(code)  # no interpreter teardown (torch's takes a while)


def first_line(e):
    text = str(e).strip()
    return type(e).__name__ + (": " + text.splitlines()[0].strip() if text else "")


# Innermost first: the function that raised names the flag it checks.
FLAG_OF_FRAME = {
    "_derive_context_length": "context-length",
    "_get_and_verify_dtype": "dtype",
    "_verify_quantization": "quantization",
    "_parse_quant_hf_config": "quantization",
    "get_config": "model-path",
    "get_hf_text_config": "model-path",
    "get_generation_config": "model-path",
}
GPU_FRAMES = {
    "get_device",
    "get_device_memory_capacity",
    "get_nvgpu_memory_capacity",
    "get_device_core_count",
    "get_device_capability",
    "get_device_name",
    "_lazy_init",
}


def flag_of(e, text):
    if "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in text:  # 0.4.x checks inline in __init__
        return "context-length"
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.name in FLAG_OF_FRAME:
            return FLAG_OF_FRAME[frame.name]
    if "config.json" in text:
        return "model-path"
    return None


def needs_gpu(e, text):
    frames = traceback.extract_tb(e.__traceback__)
    if any("/torch/cuda/" in f.filename or f.name in GPU_FRAMES for f in frames):
        return True
    low = text.lower()
    return any(w in low for w in ("accelerator", "cuda", "nvidia-smi", "gpu", "nvml"))


def refuse_unless_gpu(e, stage):
    """Refuses (and exits), unless what failed only needs the GPUs the check hid: its reason."""
    text = first_line(e)
    flag = flag_of(e, text)
    if flag is None and needs_gpu(e, text):
        return text
    answer("refused", 1, stage=stage, flag=flag, reason=text)


def missing_sglang_module(e):
    return isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("sglang")


try:
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        load_plugins()
    from sglang.srt.server_args import prepare_server_args
except Exception as e:
    if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("sglang.srt"):
        answer("unavailable", 4, reason=first_line(e))
    answer("refused", 1, stage="arguments", flag=None, reason=first_line(e))


def parse():
    try:
        return prepare_server_args(argv)
    except SystemExit as e:
        if e.code in (0, None):
            answer("refused", 2, stage="arguments", flag=None, reason="argparse exited")
        answer("refused", 2, stage="arguments", flag=None, reason=sys.stderr.last)


gpu = None
try:
    args = parse()
except Exception as e:
    gpu = refuse_unless_gpu(e, "arguments")
    unchecked.append("resolution and model config: the arguments need a GPU (%s)" % gpu)
    answer("gpu", 3, reason=gpu)

os.environ["CUDA_VISIBLE_DEVICES"] = ""
record = args
resolve = getattr(args, "resolve_once", None)
if resolve is not None:
    try:
        resolve()
    except Exception as e:
        gpu = refuse_unless_gpu(e, "resolve")
        record = parse()  # resolution left its writes on the first record

try:
    from sglang.srt.configs.model_config import ModelConfig
except Exception as e:
    if not missing_sglang_module(e):
        refuse_unless_gpu(e, "model-config")
    ModelConfig = None
    unchecked.append("model config: %s" % first_line(e))
if ModelConfig is not None:
    if not hasattr(ModelConfig, "from_server_args"):
        unchecked.append("model config: this SGLang's ModelConfig has no from_server_args")
    else:
        try:
            ModelConfig.from_server_args(record)
        except Exception as e:
            unchecked.append("model config: needs a GPU (%s)" % refuse_unless_gpu(e, "model-config"))


def value(name):
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return getattr(resolving_view(record), name, None)
    except Exception:
        return getattr(record, name, None)


class Tokenizer:
    """What TemplateManager touches of the tokenizer: its chat_template, set from a .jinja file."""

    chat_template = None

    def apply_chat_template(self, *args, **kwargs):
        return ""


class TokenizerManager:
    tokenizer = Tokenizer()
    model_config = None


def check_chat_template(template):
    try:
        try:
            from sglang.srt.parser.conversation import chat_template_exists
        except ModuleNotFoundError:
            from sglang.srt.conversation import chat_template_exists
    except Exception as e:
        unchecked.append("chat template: %s" % first_line(e))
        return
    try:
        from sglang.srt.parser.python_chat_template import get_python_chat_template
    except Exception:
        get_python_chat_template = lambda name: None
    if chat_template_exists(template) or get_python_chat_template(template) is not None:
        return
    if template.endswith(".jinja") and os.path.isfile(template):
        try:
            with open(template) as f:
                f.read()
            return
        except OSError as e:
            answer("refused", 1, stage="chat-template", flag="chat-template", reason=first_line(e))
    try:
        try:
            from sglang.srt.parser.template_manager import TemplateManager
        except ModuleNotFoundError:
            from sglang.srt.managers.template_manager import TemplateManager
    except Exception as e:
        unchecked.append("chat template: %s" % first_line(e))
        return
    try:
        TemplateManager()._load_explicit_chat_template(TokenizerManager(), template)
    except (AttributeError, TypeError) as e:  # the stand-in tokenizer, not the template
        unchecked.append("chat template: %s" % first_line(e))
    except Exception as e:
        answer("refused", 1, stage="chat-template", flag="chat-template", reason=first_line(e))


template = value("chat_template")
if isinstance(template, str) and template:
    check_chat_template(template)

if gpu is not None:
    answer("gpu", 3, reason=gpu)
answer("accepted", 0)
