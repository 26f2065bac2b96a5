#!/usr/bin/env bash
# Builds the Debian package of reconcile: the binary, the agent's service and timer, shell
# completions and man pages (both generated from the binary's own command line), into
# target/debian/reconcile_<version>_<arch>.deb, and prints the path.
#
#   packaging/deb/build.sh            # from a release build (cargo build --release --locked)
#   BIN=path/to/reconcile packaging/deb/build.sh   # from a binary built already (the tests')
#
# Only dpkg-deb (dpkg, on every Debian and Ubuntu), strip and gzip are needed; the package passes
# `lintian` with no error (tests/integration/package.rs checks it). Nothing is enabled on install: the
# agent needs its repository first (/etc/default/reconcile-agent), then
# `systemctl enable --now reconcile-agent.timer`.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=packaging/deb
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked
  BIN=target/release/reconcile
fi
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
ARCH=$(dpkg --print-architecture)
OUT=${OUT:-target/debian}
ROOT=$(mktemp -d); trap 'rm -rf "$ROOT"' EXIT
# Stripped, as Debian ships binaries (the release profile keeps line tables for backtraces; the
# tests' binary is a debug build): 214 MB of debug build or 114 MB of release become about 20 MB.
install -D -m 0755 "$BIN" "$ROOT/usr/bin/reconcile"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$ROOT/usr/bin/reconcile"
# The host's guard, beside reconcile: apply copies it to each host it changes (1.5 MB stripped).
install -D -m 0755 "$(dirname "$BIN")/reconcile-guard" "$ROOT/usr/bin/reconcile-guard"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$ROOT/usr/bin/reconcile-guard"
install -D -m 0644 "$HERE/reconcile-agent.service" "$ROOT/lib/systemd/system/reconcile-agent.service"
install -D -m 0644 "$HERE/reconcile-agent.timer" "$ROOT/lib/systemd/system/reconcile-agent.timer"
install -D -m 0644 "$HERE/reconcile-agent.default" "$ROOT/etc/default/reconcile-agent"
mkdir -p "$ROOT/usr/share/bash-completion/completions" "$ROOT/usr/share/zsh/vendor-completions" \
  "$ROOT/usr/share/fish/vendor_completions.d" "$ROOT/usr/share/man/man1" "$ROOT/usr/share/doc/reconcile"
"$BIN" completions bash > "$ROOT/usr/share/bash-completion/completions/reconcile"
"$BIN" completions zsh > "$ROOT/usr/share/zsh/vendor-completions/_reconcile"
"$BIN" completions fish > "$ROOT/usr/share/fish/vendor_completions.d/reconcile.fish"
"$BIN" manpages "$ROOT/usr/share/man/man1" >/dev/null
gzip -9n "$ROOT"/usr/share/man/man1/*.1
cp "$HERE/copyright" "$ROOT/usr/share/doc/reconcile/copyright"
install -D -m 0644 "$HERE/lintian-overrides" "$ROOT/usr/share/lintian/overrides/reconcile"
# A native package's changelog: one entry for the version built, dated by the last commit (the
# build is reproducible), or now outside a git checkout.
MAINTAINER=$(sed -n 's/^Maintainer: //p' "$HERE/control")
DATE=$(git log -1 --format=%cD 2>/dev/null || date -R)
printf 'reconcile (%s) unstable; urgency=medium\n\n  * Built from reconcile %s: see README.md for what it does.\n\n -- %s  %s\n' \
  "$VERSION" "$VERSION" "$MAINTAINER" "$DATE" | gzip -9n > "$ROOT/usr/share/doc/reconcile/changelog.gz"
mkdir -p "$ROOT/DEBIAN"
for script in postinst prerm postrm; do install -m 0755 "$HERE/$script" "$ROOT/DEBIAN/$script"; done
echo /etc/default/reconcile-agent > "$ROOT/DEBIAN/conffiles"
SIZE=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$SIZE/" "$HERE/control" > "$ROOT/DEBIAN/control"
mkdir -p "$OUT"
DEB="$OUT/reconcile_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "$DEB"
