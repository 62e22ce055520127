"""The run's root filesystem: the interpreter, its shared libraries and its standard library, read-only,
a private /tmp with the work directory, a few device nodes and /proc; nothing else of the host.

`build_root` runs in init, in a fresh mount namespace: it stages a small tmpfs, binds into it what the
interpreter needs at the same paths as on the host (symlinked path components become the same symlinks, so the
interpreter's own paths keep working), masks every site-packages and every other import path of the caller with
empty read-only tmpfs (`packages_dirs`, the caller's `hide` list), pivots into it and drops the old root. The
package, its task data, the tests, site-packages, the run directory, /run (the host's AF_UNIX sockets), /etc, /home
and /sys are then simply absent. Bound read-only, nosuid, nodev, not recursive (mounts below a bound directory stay
hidden): the interpreter and its ELF program interpreter (ld.so), the directories of the child's `sys.path` (the
standard library and lib-dynload), and every shared library mapped into this process (its whole directory when
that is one of the dynamic linker's default directories or the interpreter's LIBDIR, else the file alone). What is
bound and masked, path by path: docs/sandbox.md, "The run's root file system".

No dimension legend: host-side Python, no arrays.
"""

import glob
import os
import platform
import struct
import sys
import sysconfig

from .common import SetupError

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
# statvfs's f_flag uses the MS_* values for these flags, except relatime (ST_RELATIME).
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, ST_RELATIME = 1024, 2048, 1 << 21, 4096
MNT_DETACH = 2
STAGE = "/tmp"  # the new root is staged on a tmpfs mounted over /tmp of the private mount namespace
WORKDIR = "/tmp/work"  # the work directory, as the run sees it
DEVICES = ("null", "zero", "full", "random", "urandom")
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


def mount(lib, src, dst, fstype, flags, data=None):
    import ctypes

    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if lib.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise SetupError("mount %s on %s failed: %s" % (src, dst, os.strerror(ctypes.get_errno())))


def bind_read_only(lib, src, dst, flags):
    """Bind `src` on `dst` (not recursively) and make it read-only with `flags`, keeping the flags of the
    source's mount (in a user namespace the kernel refuses to clear them)."""
    mount(lib, src, dst, None, MS_BIND)
    kept = os.statvfs(src).f_flag
    flags |= kept & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    flags |= MS_RELATIME if kept & ST_RELATIME else 0
    mount(lib, None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def program_interpreter(path):
    """The PT_INTERP path of ELF file `path` (the dynamic linker it needs), or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only (the platforms the filter knows)
            return None
        end = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack(end + "Q", head[32:40])
        phentsize, phnum = struct.unpack(end + "HH", head[54:58])
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack(end + "IIQQQQ", f.read(40))
            if p_type == 3:
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


def mapped_files():
    """Regular files mapped into this process (the interpreter and its loaded shared libraries)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and not parts[5].rstrip().endswith("(deleted)"):
                path = parts[5].rstrip("\n")
                if os.path.isfile(path) and path not in out:
                    out.append(path)
    return out


def library_dirs():
    """Real paths of the dynamic linker's default directories and of the interpreter's own library
    directory (libpython's; in a conda or pyenv prefix also the libraries its extension modules load)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = set()
    for base in ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib32", "/usr/lib32"):
        for d in (base, os.path.join(base, multiarch) if multiarch else base):
            if os.path.isdir(d):
                dirs.add(os.path.realpath(d))
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and os.path.isdir(libdir):
        dirs.add(os.path.realpath(libdir))
    return dirs


class Plan:
    """What the new root holds: directories bound, files bound, symlinks, and masks over bound parts."""

    def __init__(self):
        self.binds = {}  # path (no symlink in it) -> "dir" | "file"
        self.links = {}  # path -> symlink target, as on the host

    def add(self, path, kind, depth=0):
        """Make `path` reachable in the new root under the same name: each symlinked component becomes
        the same symlink, and what it points to is added in turn."""
        if depth > 40:
            raise SetupError("too many symlinks resolving %s" % path)
        parts = os.path.normpath(path).strip("/").split("/")
        cur = ""
        for i, part in enumerate(parts):
            cur += "/" + part
            if os.path.islink(cur):
                target = os.readlink(cur)
                self.links[cur] = target
                real = os.path.normpath(os.path.join(os.path.dirname(cur), target))
                rest = "/".join(parts[i + 1:])
                return self.add(os.path.join(real, rest) if rest else real, kind, depth + 1)
        self.binds[cur] = kind
        return cur

    def covered(self, path):
        """Whether `path` already lies inside a bound directory."""
        return any(k == "dir" and path != d and path.startswith(d.rstrip("/") + "/") for d, k in self.binds.items())


def packages_dirs(dirs):
    """The site-packages and dist-packages directories in or one level below each of `dirs` (a bound interpreter
    prefix's lib/ holds python3.X/site-packages; Debian's /usr/lib holds python3/dist-packages), at their real
    paths (a mount point must not pass through a symlink)."""
    found = []
    for d in dirs:
        for name in ("site-packages", "dist-packages"):
            for path in [os.path.join(d, name), *glob.glob(os.path.join(glob.escape(d), "*", name))]:
                if os.path.isdir(path) and os.path.realpath(path) == path:
                    found.append(path)
    return found


def make_plan(cfg):
    """The bind mounts, symlinks and masks of the run's root (module docstring)."""
    plan = Plan()
    stdlib = [plan.add(p, "dir") for p in sys.path if os.path.isdir(p)]
    if not stdlib:
        raise SetupError("the child's sys.path names no standard library directory")
    lib_dirs = library_dirs()
    exe = os.path.realpath(sys.executable)
    plan.add(sys.executable, "file")
    interp = program_interpreter(exe)
    if interp:
        plan.add(interp, "file")
    for path in mapped_files():
        real = os.path.realpath(path)
        if os.path.dirname(real) in lib_dirs:
            plan.add(os.path.dirname(real), "dir")
        else:
            plan.add(path, "file")
    for path in [p for p in plan.binds if plan.covered(p)]:
        del plan.binds[path]
    for path in [p for p in plan.links if plan.covered(p)]:
        del plan.links[path]
    # Masks: every import path of the caller (site-packages, the package's checkout, editable installs)
    # that a bound directory would show, unless the standard library itself lives there.
    masks = set(packages_dirs([p for p, k in plan.binds.items() if k == "dir"]))
    for p in cfg.get("hide", []):
        real = os.path.realpath(p) if p else ""
        if not real or not os.path.isdir(real) or not plan.covered(real):
            continue
        if any(s == real or s.startswith(real.rstrip("/") + "/") for s in stdlib):
            continue
        masks.add(real)
    return plan, sorted(masks)


def _mkdirs(root, path):
    os.makedirs(root + path, mode=0o755, exist_ok=True)


def build_root(lib, cfg, uid):
    """Replace this mount namespace's root by the run's root (module docstring); returns the work
    directory. Runs in init after unshare(CLONE_NEWNS)."""
    import ctypes

    plan, masks = make_plan(cfg)
    mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    mount(lib, "tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    root = STAGE
    # The private /tmp and the work directory first: a uid that cannot be used fails here, by name.
    _mkdirs(root, "/tmp")
    mount(lib, "tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          "size=%dm,mode=1777" % max(1, int(cfg["limits"]["fsize_mb"])))
    os.mkdir(root + WORKDIR, 0o700)
    try:
        os.chown(root + WORKDIR, uid, uid)
    except OSError as e:
        raise SetupError("chown of the work directory %s to uid %d failed: %s" % (WORKDIR, uid, e))
    for path in sorted(plan.binds):
        target = root + path
        if plan.binds[path] == "dir":
            _mkdirs(root, path)
        else:
            _mkdirs(root, os.path.dirname(path))
            open(target, "a").close()
        bind_read_only(lib, path, target, MS_NOSUID | MS_NODEV)
    for path in masks:
        mount(lib, "tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
    for path, target in sorted(plan.links.items()):
        _mkdirs(root, os.path.dirname(path))
        if not os.path.lexists(root + path):
            os.symlink(target, root + path)
    _mkdirs(root, "/dev")
    for name in DEVICES:
        src = "/dev/" + name
        if os.path.exists(src):
            open(root + src, "a").close()
            bind_read_only(lib, src, root + src, MS_NOSUID)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    _mkdirs(root, "/dev/shm")
    mount(lib, "tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=1777")
    _mkdirs(root, "/proc")
    nr = _SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise SetupError("no pivot_root syscall number for %s" % platform.machine(), unavailable=True)
    os.chdir(root)
    lib.syscall.restype = ctypes.c_long
    if lib.syscall(ctypes.c_long(nr), b".", b".") != 0:
        raise SetupError("pivot_root failed: %s" % os.strerror(ctypes.get_errno()))
    if lib.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked under the new one
        raise SetupError("detaching the old root failed: %s" % os.strerror(ctypes.get_errno()))
    os.chdir("/")
    mount(lib, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return WORKDIR
