"""Sandbox launcher: runs one Python program confined, then gets out of the way.

Started by envservers/sandbox.py as `python -I -S sandbox_launcher.py SPEC_JSON` in a new
process group; standard library only (it runs with -I, without our packages). It does in a
fresh process what would otherwise be a preexec_fn inside the multi-threaded gRPC server.

namespaces mode (root):
    unshare(mount, pid, net, ipc, uts) -> fork: the child is pid 1 of the new pid namespace
    child: private mounts; a tmpfs root holding read-only binds of /usr, /lib*, /bin, the
           interpreter's prefix and `ro_paths`, plus the scratch dir at /scratch (the only
           writable place); root remounted read-only; chroot; rlimits; drop to `uid` (no
           groups); parent-death signal; exec the interpreter on the program
    parent: waits and exits with the child's status
  -> no network (an empty net namespace: even 127.0.0.1 is unreachable), no host files
     (/etc/passwd does not exist in there), when pid 1 dies every process it left dies too.

rlimits mode (weak, no root needed): rlimits, the server's own uid, and a Python audit
hook that refuses sockets, subprocesses and opening files outside the scratch dir — it
stops honest mistakes, not a determined attacker (ctypes can get past it).
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
HOST_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")

_libc = ctypes.CDLL(None, use_errno=True)

AUDIT_HOOK = r"""
import os, sys
_scratch = os.path.realpath(os.getcwd())
_stdlib = tuple(os.path.realpath(p) for p in sys.path if p)
def _hook(event, args):
    if event.startswith("socket.") and event != "socket.getaddrinfo" or event in (
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork",
        "os.forkpty", "ctypes.dlopen", "os.spawn"):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if not (path == _scratch or path.startswith(_scratch + os.sep)
                or path.startswith(_stdlib) or path == "/dev/null"):
            raise PermissionError(f"sandbox: {path} is outside the scratch dir")
sys.addaudithook(_hook)
del _hook
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _bind_ro(host_path: str, root: str) -> None:
    inside = root + host_path
    if os.path.islink(host_path):
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        os.symlink(os.readlink(host_path), inside)
        return
    if not os.path.isdir(host_path):
        return
    os.makedirs(inside, exist_ok=True)
    _mount(host_path, inside, None, MS_BIND | MS_REC)
    _mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _set_limits(limits: dict) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(uid: int) -> None:
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _env(home: str = "/scratch") -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


def _run_confined(spec: dict) -> None:
    """Child side of namespaces mode: build the root, confine, exec. Never returns."""
    root, python = spec["root"], spec["python"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in (*HOST_DIRS, spec["prefix"], *spec["ro_paths"]):
        _bind_ro(path, root)
    os.makedirs(root + "/scratch")
    _mount(spec["scratch"], root + "/scratch", None, MS_BIND | MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/dev")
    open(root + "/dev/null", "w").close()
    _mount("/dev/null", root + "/dev/null", None, MS_BIND)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.chroot(root)
    os.chdir("/scratch")
    _set_limits(spec["limits"])
    _drop_privileges(spec["uid"])
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    os.execve(python, [python, "-I", "-S", "-B", *spec["argv"]], _env())


def run_namespaces(spec: dict) -> int:
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    _check(_libc.unshare(flags), "unshare")
    pid = os.fork()
    if pid == 0:
        try:
            _run_confined(spec)
        except BaseException as e:  # report why confinement failed; never run unconfined
            os.write(2, f"sandbox setup failed: {e}\n".encode())
        os._exit(125)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_rlimits(spec: dict) -> int:
    os.chdir(spec["scratch"])
    _set_limits(spec["limits"])
    python = spec["python"]
    argv = [python, "-I", "-S", "-B", "-c", AUDIT_HOOK, *spec["argv"]]
    os.execve(python, argv, _env(spec["scratch"]))
    return 125


def main() -> int:
    spec = json.loads(sys.argv[1])
    if spec["mode"] == "namespaces":
        return run_namespaces(spec)
    return run_rlimits(spec)


if __name__ == "__main__":
    code = main()
    sys.exit(128 - code if code < 0 else code)
