#!/bin/bash
# The real-SGLang tier of the test lab: the real, unmodified sglang 0.5.23 from the package index,
# on its CPU engine, with a tiny random model made here, in a folder that up.sh binds read-only
# into every test host at /opt/sglang-cpu. Adapted from the team's recipe (shared/sglang-cpu).
#
#   tests/hostlab/sglang-cpu/install.sh      # prints the folder; installs it first when missing
#
# The folder is named by a key of everything that goes into it (the pins, this script, the model
# maker, the stub), so a changed pin builds a new folder and an unchanged one is reused as it is:
# a second `tests/run.sh` downloads nothing. Wheels are kept in $CACHE/wheels (3.6 GB) so a new key
# downloads only the wheels it does not have. Installed: about 7.4 GB.
#
# What is in the folder:
#   venv/        the packages (137 exact pins, installed with --no-deps: sglang's own metadata pulls
#                CUDA-only packages a CPU launch never imports; the index's torch is its CUDA build,
#                whose nvidia-* libraries are needed just to `import torch`)
#   cudastub/    libcuda.so.1, a stub that answers "no device" (see cudastub.c)
#   tiny-model/  a random two-layer Qwen2 with a byte-level BPE tokenizer and a ChatML template,
#                max_position_embeddings 2048 (make_model.py)
#   bin/python3  the Python a test manifest names as its `sglang.python`: the host's own, with
#                pyvenv.cfg making the folder a venv of venv/'s packages (below)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${SGLANG_CPU_BASE:-/var/lib/reconcile-lab/sglang-cpu}
CACHE=${SGLANG_CPU_CACHE:-/var/cache/reconcile-lab/sglang-cpu}
KEY=$(cat "$HERE/requirements.txt" "$HERE/make_model.py" "$HERE/cudastub.c" "$HERE/install.sh" | sha256sum | cut -c1-16)
DIR=$BASE/$KEY
if [ -f "$DIR/.ok" ]; then echo "$DIR"; exit 0; fi

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
  echo "sglang-cpu: needs Python 3.11 (the test hosts' Debian 12 runs 3.11; the packages are cp311 builds)" >&2; exit 1; }
command -v cc >/dev/null || { echo "sglang-cpu: needs a C compiler (cc) for the libcuda stub" >&2; exit 1; }

t0=$SECONDS
rm -rf "$DIR.tmp"; mkdir -p "$DIR.tmp" "$CACHE/wheels"
# Heavy steps run under nice: the machine may be building or testing at the same time.
"$python" -m venv "$DIR.tmp/venv"
# PIP_FIND_LINKS and friends of the machine stay as they are: this is the machine's own pip
# setting up a folder of its own.
nice -n 19 "$python" -m pip download -q --disable-pip-version-check --no-deps \
  --only-binary=:all: -d "$CACHE/wheels" -r "$HERE/requirements.txt"
echo "sglang-cpu: wheels in $CACHE/wheels after $((SECONDS - t0)) s ($(du -sh "$CACHE/wheels" | cut -f1))" >&2
nice -n 19 "$DIR.tmp/venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-index \
  --find-links "$CACHE/wheels" -r "$HERE/requirements.txt"

# sgl_kernel is imported unconditionally on the CPU engine (sglang/kernels/ops/kvcache/cache_move.py)
# and the index has only its CUDA build, linked against the driver's libcuda.so.1, which a GPU-less
# machine lacks. The stub only lets it be loaded; nothing on the CPU path calls it.
mkdir -p "$DIR.tmp/cudastub"
cp "$HERE/cudastub.c" "$DIR.tmp/cudastub/"
nice -n 19 cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$DIR.tmp/cudastub/libcuda.so.1" "$DIR.tmp/cudastub/cudastub.c"

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 XDG_CACHE_HOME="$DIR.tmp/cache" HF_HOME="$DIR.tmp/cache/hf" \
  nice -n 19 "$DIR.tmp/venv/bin/python" "$HERE/make_model.py" "$DIR.tmp/tiny-model" >&2
rm -rf "$DIR.tmp/cache"

# The folder is a venv for the test hosts, as `python3 -m venv` lays one out: a host's own Python
# 3.11 (Debian 12's) runs the packages this machine's Python 3.11 installed. reconcile starts a
# host's Python isolated (`python -I`: no PYTHONPATH), so the folder says where its packages are
# the way a venv does, with pyvenv.cfg beside bin/. What makes a host a GPU-less machine running
# the CPU engine offline is the unit's environment (tests/integration/real_server/mod.rs).
mkdir -p "$DIR.tmp/bin" "$DIR.tmp/lib/python3.11"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' >"$DIR.tmp/pyvenv.cfg"
ln -s /usr/bin/python3.11 "$DIR.tmp/bin/python3"
ln -s ../../venv/lib/python3.11/site-packages "$DIR.tmp/lib/python3.11/site-packages"
touch "$DIR.tmp/.ok"
rm -rf "$DIR"; mv "$DIR.tmp" "$DIR"
# Older keys' folders are 7 GB each: keep only this one.
for old in "$BASE"/*; do [ "$old" = "$DIR" ] || rm -rf "$old"; done
echo "sglang-cpu: installed in $((SECONDS - t0)) s at $DIR ($(du -sh "$DIR" | cut -f1))" >&2
echo "$DIR"
