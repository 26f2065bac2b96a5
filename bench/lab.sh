# Sourced by the benchmarks that boot throwaway test hosts of their own: the steps they all take
# before measuring, kept in one place so that a change to the lab's start reaches every bench.

# need_root WHY "$@": the test hosts are containers, so the bench runs as root: through sudo when
# there is one (root shells on servers and containers often have none); -E keeps the environment
# variables the bench reads.
need_root() {
  local why=$1
  shift
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "bench/${0##*/}: needs root ($why) and there is no sudo: run it from a root shell" >&2; exit 1; }
    exec sudo -E -- "$0" "$@"
  fi
}

# lab_up HOSTS: the test-host image and a release build, then HOSTS hosts under STATE, PREFIX and
# SUBNET (the caller's, apart from the test lab's), taken down again when the bench exits.
lab_up() {
  bash tests/hostlab/build-rootfs.sh >/dev/null
  cargo build --locked --release --quiet
  trap 'bash tests/hostlab/down.sh >/dev/null' EXIT
  bash tests/hostlab/up.sh "$1" >/dev/null
}
