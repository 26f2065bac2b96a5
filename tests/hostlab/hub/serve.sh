#!/bin/bash
# serve.sh NETNS ADDRESS PORT ROOT -- the lab's hub: olah serving the git repositories under
# ROOT/mirrors/models/ORG/NAME, offline, on ADDRESS:PORT inside the test host NETNS's network
# namespace (so that `tc` on that host's link shapes what it sends). Runs in the background until
# down.sh stops the namespace's processes; a hub already answering is left as it is.
# Olah's own settings: olah `configs.py` `OlahConfig.read_toml` (mirrors-path, [accessibility]
# offline); with `offline`, nothing is asked of an upstream hub, and the upstream names a closed
# local port besides.
set -euo pipefail
NETNS=$1 ADDRESS=$2 PORT=$3 ROOT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
answers() { ip netns exec "$NETNS" python3 -c "import socket,sys; socket.create_connection(('$ADDRESS', $PORT), 1)" 2>/dev/null; }
answers && exit 0
VENV=$(bash "$HERE/install.sh")
mkdir -p "$ROOT/mirrors/models" "$ROOT/cache"
cat > "$ROOT/olah.toml" <<TOML
[basic]
host = "$ADDRESS"
port = $PORT
repos-path = "$ROOT/cache"
mirrors-path = ["$ROOT/mirrors"]
hf-scheme = "http"
hf-netloc = "127.0.0.1:9"
hf-lfs-netloc = "127.0.0.1:9"

[accessibility]
offline = true
TOML
cd "$ROOT"
ip netns exec "$NETNS" setsid "$VENV/bin/olah-cli" -c "$ROOT/olah.toml" >"$ROOT/olah.log" 2>&1 </dev/null &
for _ in $(seq 300); do
  answers && exit 0
  sleep 0.1
done
echo "serve.sh: the hub did not answer on $ADDRESS:$PORT in 30 s; its log:" >&2
tail -20 "$ROOT/olah.log" >&2
exit 1
