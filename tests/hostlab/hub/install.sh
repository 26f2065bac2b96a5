#!/bin/bash
# The lab's hub: olah (a self-hosted Hugging Face hub mirror) serving local git repositories
# offline, as any endpoint that speaks the hub's API does (`HF_ENDPOINT`), and huggingface_hub, the
# hub's own client, to check what it serves. A venv of exact pins (requirements.txt) in a folder
# named by their key, reused as it is while the pins and this script stay.
#
#   tests/hostlab/hub/install.sh      # prints the folder; installs it first when missing
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${HUB_BASE:-/var/lib/reconcile-lab/hub-venv}
KEY=$(cat "$HERE/requirements.txt" "$HERE/install.sh" | sha256sum | cut -c1-16)
DIR=$BASE/$KEY
if [ -f "$DIR/.ok" ]; then echo "$DIR"; exit 0; fi
t0=$SECONDS
# Made in place (a venv's scripts name its folder); `.ok` last, so a cut install is redone.
rm -rf "$DIR"; mkdir -p "$BASE"
"${PYTHON:-python3}" -m venv "$DIR"
nice -n 19 "$DIR/bin/pip" install -q --disable-pip-version-check --no-deps \
  --only-binary=:all: -r "$HERE/requirements.txt"
touch "$DIR/.ok"
for old in "$BASE"/*; do [ "$old" = "$DIR" ] || rm -rf "$old"; done
echo "hub: installed in $((SECONDS - t0)) s at $DIR" >&2
echo "$DIR"
