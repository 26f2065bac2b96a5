"""The peer in bench/fleet.sh: Ansible's `ansible-playbook --check --diff` over the same test hosts
as reconcile's dry-run, with one `template` task of the identical rendered unit.

Ansible gets its fast settings, so the comparison is with Ansible at its best, not a strawman:
  * pipelining on (modules go over the ssh session's stdin, no temp files copied to the host),
  * forks = the number of hosts (every host at once, as reconcile plans them),
  * ControlMaster=auto / ControlPersist in ssh_args (one ssh connection per host per run),
  * gather_facts: false, and the hosts' interpreter given (/usr/bin/python3: no discovery round),
  * remote_tmp given as an absolute path (the default folder; no `echo ~` round trip),
  * ssh_args start with `-F <the lab's ssh_config>`: the same host aliases, key, known_hosts and
    `StrictHostKeyChecking yes` that reconcile and the ssh floor use. host_key_checking is left at
    its default (on); nothing here turns host-key checking off.
Each timed run starts cold, like each reconcile run: a control-path folder of its own, and its ssh
masters are closed after the clock stops. The wall time is the whole `ansible-playbook` process,
its start-up included, which is what a person running it waits for.

Used by bench/fleet.py (ensure_venv, render_units, then check_runs for runs paired with its own,
or time_ansible_check for a list of times), or alone:
    python3 bench/ansible.py SSH_CONFIG REPEATS HOST... [--apply] [--compare]
renders the fleet bench's manifest for HOST... with target/release/reconcile, optionally applies it
first (--apply, so the hosts hold the unit and both tools find no change), prints each run's time
and the median, and with --compare also times `reconcile plan` in pairs with it and prints the
ratio of the medians.
"""

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# ansible-core 2.19 is the newest line whose controller runs on Python 3.11 (this machine's);
# its dependencies are pinned too, so two runs of the bench measure the same Ansible.
ANSIBLE_VERSION = "2.19.14"
PINS = [
    f"ansible-core=={ANSIBLE_VERSION}",
    "cffi==2.1.1",
    "cryptography==50.0.2",
    "Jinja2==3.1.6",
    "MarkupSafe==3.0.4",
    "packaging==26.4",
    "pycparser==3.12",
    "PyYAML==6.0.4",
    "resolvelib==1.2.1",
]
HOST_PYTHON = "/usr/bin/python3"  # the test hosts' (Debian's) python3; Ansible's modules run on it
UNIT_DIR = "/etc/systemd/system"
SETTINGS = ("forks {forks}, pipelining, ControlMaster/ControlPersist, gather_facts false, "
            f"interpreter {HOST_PYTHON}, absolute remote_tmp")


def default_venv():
    """A cache folder outside the bench's STATE (which down.sh clears), so the install is reused."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "reconcile-bench", f"ansible-core-{ANSIBLE_VERSION}")


def ensure_venv(path=None):
    """Makes (or reuses) a virtual environment with the pinned ansible-core; returns the path of
    its ansible-playbook. A venv is reused only once its install finished (the marker file)."""
    path = path or default_venv()
    playbook = os.path.join(path, "bin", "ansible-playbook")
    marker = os.path.join(path, ".installed")
    want = "\n".join(PINS) + "\n"
    if os.path.exists(marker) and open(marker).read() == want and os.path.exists(playbook):
        return playbook
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    subprocess.run([os.path.join(path, "bin", "pip"), "install", "--quiet", *PINS], check=True)
    with open(marker, "w") as f:
        f.write(want)
    return playbook


def render_units(reconcile_bin, workdir, hosts):
    """Each host's unit as reconcile renders it (`reconcile render --host H` in workdir), so
    Ansible is given exactly the bytes reconcile compares, not a hand-written copy."""
    units = {}
    for h in hosts:
        p = subprocess.run([reconcile_bin, "render", "--host", h], cwd=workdir,
                           capture_output=True, text=True, check=True)
        units[h] = p.stdout
    return units


def as_template(text):
    """The unit as a Jinja template that renders to exactly `text`. A raw block only when the text
    holds a Jinja delimiter; trim_blocks (on in Ansible) would eat a newline after a block tag,
    so the tags touch the text on both sides."""
    if not re.search(r"\{[{%#]", text):
        return text
    return "{% raw %}" + text + "{% endraw %}"


def write_project(d, ssh_config, hosts, unit_name, units):
    """Writes ansible.cfg, the inventory, one template per distinct unit text and the playbook."""
    sources = {}
    lines = []
    for h in hosts:
        text = units[h]
        if text not in sources:
            sources[text] = os.path.join(d, f"unit-{len(sources)}.j2")
            with open(sources[text], "w") as f:
                f.write(as_template(text))
        lines.append(f"{h} unit_src={sources[text]}")
    with open(f"{d}/inventory.ini", "w") as f:
        f.write("[fleet]\n" + "\n".join(lines) + "\n")
    with open(f"{d}/site.yml", "w") as f:
        f.write(f"""- hosts: fleet
  gather_facts: false
  tasks:
    - name: unit
      ansible.builtin.template:
        src: "{{{{ unit_src }}}}"
        dest: {UNIT_DIR}/{unit_name}
""")
    # ControlPersist only has to outlive one run: its masters are closed after each run anyway.
    # remote_tmp is the default folder (~/.ansible/tmp; the lab logs in as root) written out, which
    # spares Ansible its `echo ~` round trip per host before the task.
    with open(f"{d}/ansible.cfg", "w") as f:
        f.write(f"""[defaults]
inventory = {d}/inventory.ini
forks = {len(hosts)}
gathering = explicit
interpreter_python = {HOST_PYTHON}
retry_files_enabled = False
remote_tmp = /root/.ansible/tmp
nocows = True

[ssh_connection]
pipelining = True
ssh_args = -F {os.path.abspath(ssh_config)} -o ControlMaster=auto -o ControlPersist=60s
""")


RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(output):
    """PLAY RECAP as {host: (ok, changed, unreachable, failed)}."""
    return {m[1]: tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(output)}


def close_masters(control_dir):
    """Ends the run's ssh masters (outside the timing), so no run inherits another's connections."""
    for sock in os.listdir(control_dir):
        subprocess.run(["ssh", "-o", f"ControlPath={os.path.join(control_dir, sock)}", "-O", "exit", "x"],
                       capture_output=True)


def children_cpu():
    """User+sys CPU seconds of this process's finished children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


CGROUPS = "/sys/fs/cgroup/unified"  # the cgroup v2 tree, where bench/fleet.py reads the hosts' CPU


def new_cgroup(name):
    """A cgroup of our own to run one command in, or None where we may not make one."""
    path = f"{CGROUPS}/reconcile-bench-{os.getpid()}-{name}"
    try:
        os.mkdir(path)
        return path
    except OSError:
        return None


def cgroup_cpu(path):
    """CPU seconds used in the cgroup, once everything in it has ended (up to 5 s for ssh masters
    told to exit); then removes it."""
    deadline = time.monotonic() + 5
    while open(f"{path}/cgroup.procs").read().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(f"{path}/cpu.stat") as f:
        usec = int(next(l for l in f if l.startswith("usage_usec")).split()[1])
    try:
        os.rmdir(path)
    except OSError:
        pass
    return usec / 1e6


def timed(name, argv, after=lambda: None, **kw):
    """Runs argv; returns (process, wall seconds, CPU seconds). The clock stops when argv exits;
    `after` runs then (closing ssh masters). The CPU is that of argv and all it started, detached
    ssh masters too, from a cgroup of its own; without one, of argv and its waited-for children
    only (a lower bound for Ansible, whose ControlPersist masters detach)."""
    cg = new_cgroup(name)
    join = (lambda: open(f"{cg}/cgroup.procs", "w").write(str(os.getpid()))) if cg else None
    cpu, start = children_cpu(), time.perf_counter()
    p = subprocess.run(argv, preexec_fn=join, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - start
    after()
    return p, wall, (cgroup_cpu(cg) if cg else children_cpu() - cpu)


def check_once(playbook, d, run):
    """One timed `ansible-playbook --check --diff`; returns (wall seconds, CPU seconds, recap,
    output), the CPU as `timed` measures it."""
    control_dir = os.path.join(d, f"cp-{run}")
    os.makedirs(control_dir)
    env = dict(os.environ, ANSIBLE_CONFIG=f"{d}/ansible.cfg", ANSIBLE_HOME=f"{d}/home",
               ANSIBLE_SSH_CONTROL_PATH_DIR=control_dir, LC_ALL="C.UTF-8")
    p, wall, cpu = timed(f"ansible-{run}", [playbook, "--check", "--diff", f"{d}/site.yml"],
                         after=lambda: close_masters(control_dir), env=env)
    return wall, cpu, recap(p.stdout), p.stdout + p.stderr


def check_runs(ssh_config, hosts, unit_name, rendered_unit_text, ansible_playbook=None):
    """A function that runs one timed check per call and returns (wall s, CPU s, recap); raises
    when a host fails or is unreachable, as a time for a run that did not read every host would
    flatter Ansible."""
    units = rendered_unit_text if isinstance(rendered_unit_text, dict) else {h: rendered_unit_text for h in hosts}
    playbook = ansible_playbook or ensure_venv()
    d = tempfile.mkdtemp(prefix="ansible-bench-")
    write_project(d, ssh_config, hosts, unit_name, units)
    runs = iter(range(1 << 30))

    def once():
        wall, cpu, rc, out = check_once(playbook, d, next(runs))
        bad = [h for h in hosts if h not in rc or rc[h][2] or rc[h][3]]
        if bad:
            raise RuntimeError(f"ansible-playbook --check --diff failed on {bad}:\n{out[-4000:]}")
        return wall, cpu, rc

    return once


def time_ansible_check(ssh_config, hosts, unit_name, rendered_unit_text, repeats, ansible_playbook=None):
    """Wall seconds of `repeats` runs of `ansible-playbook --check --diff` over `hosts`.
    rendered_unit_text: the unit's text for every host, or {host: text}."""
    once = check_runs(ssh_config, hosts, unit_name, rendered_unit_text, ansible_playbook)
    return [once()[0] for _ in range(repeats)]


def fleet_manifest(hosts, release="1", faults=None):
    """The manifest bench/fleet.py plans (here, for the standalone run: release 1, no faults).
    `faults` maps hosts to a stand-in failure mode, a second in."""
    faults = faults or {}
    entries = "".join(
        f"\n  - name: {h}\n    env: {{ RELEASE: \"{release}\""
        + (f", FAKE_SGLANG_FAIL: {faults[h]}, FAKE_SGLANG_FAIL_AT: \"1\"" if h in faults else "")
        + " }"
        for h in hosts
    )
    return f"""service: bench-fleet
hosts:{entries}
sglang: {{ python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench, port: 30000, flags: {{ tp-size: 2 }} }}
env: {{ CUDA_VISIBLE_DEVICES: "0,1", FAKE_SGLANG_LOAD_SECONDS: "1" }}
verify: {{ crash_window: 3s, sample_interval: 500ms, stall_timeout: 5s, load_deadline: 30s }}
"""


def hosts_cpu(hosts):
    """CPU seconds the hosts' containers have used so far (from each one's cgroup, as
    bench/fleet.py reads them), or None off the test hosts. The hosts share this machine's cores,
    so what a tool makes them run slows the tool itself too."""
    try:
        total = 0
        for h in hosts:
            with open(f"/sys/fs/cgroup/unified/hostlab/{h}/cpu.stat") as f:
                total += int(next(l for l in f if l.startswith("usage_usec")).split()[1])
        return total / 1e6
    except OSError:
        return None


def on_hosts(hosts, fn):
    """(fn's result, the CPU seconds it cost on the hosts, or None)."""
    before = hosts_cpu(hosts)
    result = fn()
    after = hosts_cpu(hosts)
    return result, (None if before is None else after - before)


def cpu_text(local, remote):
    return f"CPU {local:.2f} s" + ("" if remote is None else f" here + {remote:.2f} s on the hosts")


def reconcile_plan(binary, workdir, ssh_config, hosts):
    """(wall seconds, CPU seconds with its ssh masters) of one `reconcile plan` (the dry-run)."""
    args = [a for h in hosts for a in ("--host", h)]
    p, wall, cpu = timed("reconcile", [binary, "plan", *args, "--ssh-config", ssh_config], cwd=workdir)
    if p.returncode not in (0, 2):  # 2: changes pending, a plan like any other
        raise RuntimeError(f"reconcile plan exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return wall, cpu


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    if len(args) < 3 or flags - {"--apply", "--compare"}:
        sys.exit("usage: python3 bench/ansible.py SSH_CONFIG REPEATS HOST... [--apply] [--compare]")
    ssh_config, repeats, hosts = os.path.abspath(args[0]), int(args[1]), args[2:]
    binary = os.path.abspath("target/release/reconcile")
    unit = "bench-fleet.service"
    workdir = tempfile.mkdtemp(prefix="ansible-bench-manifests-")
    os.makedirs(f"{workdir}/manifests")
    with open(f"{workdir}/manifests/m.yaml", "w") as f:
        f.write(fleet_manifest(hosts))
    if "--apply" in flags:
        subprocess.run([binary, "apply", "--canary", "1", "--max-parallel", str(len(hosts)), "--ssh-config", ssh_config],
                       cwd=workdir, check=True, capture_output=True)
    playbook = ensure_venv()
    once = check_runs(ssh_config, hosts, unit, render_units(binary, workdir, hosts), playbook)
    print(f"ansible-core {ANSIBLE_VERSION}, {len(hosts)} hosts: {SETTINGS.format(forks=len(hosts))}")
    ours, theirs = [], []
    for i in range(repeats):
        (wall, cpu, rc), remote = on_hosts(hosts, once)
        changed = sum(r[1] for r in rc.values())
        theirs.append((wall, cpu, remote or 0))
        line = f"run {i + 1}: ansible --check --diff {wall:.3f} s, {cpu_text(cpu, remote)} (hosts reporting a change: {changed})"
        if "--compare" in flags:
            (wall, cpu), remote = on_hosts(hosts, lambda: reconcile_plan(binary, workdir, ssh_config, hosts))
            ours.append((wall, cpu, remote or 0))
            line += f"; reconcile plan {wall:.3f} s, {cpu_text(cpu, remote)}"
        print(line)
    a = [statistics.median(x[k] for x in theirs) for k in range(3)]
    print(f"median: ansible {a[0]:.3f} s wall, CPU {a[1]:.2f} s here + {a[2]:.2f} s on the hosts")
    if ours:
        r = [statistics.median(x[k] for x in ours) for k in range(3)]
        print(f"median: reconcile {r[0]:.3f} s wall, CPU {r[1]:.2f} s here + {r[2]:.2f} s on the hosts")
        print(f"ansible / reconcile: {a[0] / r[0]:.2f}x wall, {a[1] / r[1]:.2f}x CPU here"
              + (f", {a[2] / r[2]:.2f}x CPU on the hosts" if r[2] else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
