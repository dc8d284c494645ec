"""A learner's submission folder, read as data and never as a path to follow.

The learner chose every name in the folder, and the grader, often root, reads and copies it:
a symbolic link would make it read whatever the link names (the gradebook, /etc/shadow), a
hard link is another name of a file that may lie outside the folder, a fifo blocks its
reader, a device is not a file at all. So the folder is walked by file descriptor: every name
is opened relative to its folder's descriptor with O_NOFOLLOW, checked with fstat against
what lstat saw, and read within a bound. `check` says why a folder cannot be graded,
`copy_tree` copies one and refuses again whatever `check` refused (the folder may have changed
since), `digest` hashes one without refusing anything (the parent's fingerprint), and
`read_small` and `small_text` read one of nbgrader's small files (its timestamp, its secret).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMESTAMP, SECRET = "timestamp.txt", "submission_secret.txt"   # nbgrader's, per submission
SMALL = 4096          # bytes: nbgrader writes about 30 for a timestamp and 128 for a secret
MAX_DEPTH = 32        # folders in folders: more is no notebook's working folder
CHUNK = 2**20
ADVICE = "hand in regular files; a link is never followed"

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: something swapped in for a fifo since lstat must not block the open
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class NotData(ValueError):
    """Why a learner's folder or file is not something the grader reads or copies: the
    submission's NOT GRADED reason."""


@dataclass(frozen=True)
class _Entry:
    path: str                  # relative to the top folder, "/" between names
    name: str
    st: os.stat_result         # lstat: what the name is, never what it points at
    dir_fd: int                # its folder's descriptor, open while the entry is current

    @property
    def depth(self) -> int:
        return self.path.count("/") + 1


def _shown(path: str) -> str:
    """A learner's file name as it may be printed on one line of a report."""
    return path if path.isprintable() else ascii(path)


def _open_top(folder: Path) -> int:
    try:
        return os.open(folder, _DIR)
    except OSError as exc:
        if os.path.islink(folder):
            raise NotData(f"the submission folder {folder.name} is a symbolic link (to "
                          f"{_shown(os.readlink(folder))}): {ADVICE}") from exc
        raise


def _entries(fd: int, prefix: str = "") -> Iterator[_Entry]:
    """Every name below the folder open as `fd`, sorted, each folder before what it holds,
    no deeper than MAX_DEPTH; a folder is entered only through a descriptor opened without
    following and found to be the folder lstat saw."""
    for name in sorted(os.listdir(fd)):
        entry = _Entry(prefix + name, name, os.stat(name, dir_fd=fd, follow_symlinks=False), fd)
        yield entry
        if stat.S_ISDIR(entry.st.st_mode) and entry.depth < MAX_DEPTH:
            sub = os.open(name, _DIR, dir_fd=fd)
            try:
                _same(entry, os.fstat(sub))
                yield from _entries(sub, entry.path + "/")
            finally:
                os.close(sub)


def _same(entry: _Entry, st: os.stat_result) -> None:
    if (st.st_dev, st.st_ino) != (entry.st.st_dev, entry.st.st_ino):
        raise NotData(f"{_shown(entry.path)} changed while it was read: hand in a folder "
                      "that is not being changed")


def _problem(entry: _Entry) -> str:
    """Why this entry may not be in a submission, or ""."""
    mode = entry.st.st_mode
    where = _shown(entry.path)
    if stat.S_ISLNK(mode):
        target = _shown(os.readlink(entry.name, dir_fd=entry.dir_fd))
        return f"{where} is a symbolic link (to {target}): {ADVICE}"
    if stat.S_ISDIR(mode):
        return "" if entry.depth < MAX_DEPTH else (
            f"{where} lies {MAX_DEPTH} folders deep: hand in a flatter folder")
    if stat.S_ISREG(mode):
        # A hard link cannot be told from the file it names, and that file may lie outside
        # the folder: in the gradebook, or /etc/shadow where fs.protected_hardlinks is off,
        # for a grader running as root to read. nbgrader's collect copies every file, so an
        # honest submission never holds one; the learner can copy the file instead.
        return "" if entry.st.st_nlink == 1 else (
            f"{where} is a hard link (the same file has {entry.st.st_nlink - 1} other "
            f"name(s), maybe outside the submission): {ADVICE}")
    kind = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "device",
            stat.S_IFBLK: "device"}.get(stat.S_IFMT(mode), "special file")
    return f"{where} is a {kind}, not a regular file: hand in regular files and folders only"


def _open_file(entry: _Entry) -> int:
    """A descriptor of the regular file `entry` names, checked to be the one lstat saw."""
    try:
        fd = os.open(entry.name, _FILE, dir_fd=entry.dir_fd)
    except OSError as exc:   # ELOOP: it became a link since lstat
        raise NotData(f"{_shown(entry.path)} could not be opened as a regular file "
                      f"({exc.strerror}): {ADVICE}") from exc
    try:
        st = os.fstat(fd)
        _same(entry, st)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise NotData(_problem(_Entry(entry.path, entry.name, st, entry.dir_fd)) or
                          f"{_shown(entry.path)} changed while it was read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _walk(folder: Path, max_files: int) -> Iterator[_Entry]:
    """The entries of a submission folder, refusing the first that may not be there."""
    try:
        top = _open_top(folder)
    except OSError as exc:
        raise NotData(f"the submission folder could not be opened: {exc.strerror}") from exc
    try:
        for count, entry in enumerate(_entries(top), 1):
            if count > max_files:
                raise NotData(f"the submission holds more than {max_files} files and folders")
            why = _problem(entry)
            if why:
                raise NotData(why)
            yield entry
    except OSError as exc:
        raise NotData(f"the submission could not be read: {exc.strerror or exc}") from exc
    finally:
        os.close(top)


def check(folder: Path, *, max_files: int) -> int:
    """The bytes of the regular files in `folder`, a submission, reading none of them; raises
    NotData for anything that is not a regular file or a folder (a symbolic or hard link,
    a fifo, a socket, a device), for more than `max_files` entries, or for folders nested
    MAX_DEPTH deep."""
    return sum(e.st.st_size for e in _walk(folder, max_files) if stat.S_ISREG(e.st.st_mode))


def copy_tree(src: Path, dest: Path, *, max_bytes: int, max_files: int) -> int:
    """Copy the submission `src` to `dest` (which must not exist), refusing (NotData) what
    `check` refuses and more than `max_bytes` in all; nothing is left at `dest` when it
    refuses. Files keep their times and permission bits (never set-id bits). Returns the
    bytes copied."""
    os.mkdir(dest, 0o755)
    copied = 0
    try:
        for entry in _walk(src, max_files):
            target = dest / entry.path
            if stat.S_ISDIR(entry.st.st_mode):
                os.mkdir(target, 0o755)
                continue
            fd = _open_file(entry)
            try:
                copied += _copy_fd(fd, target, max_bytes - copied, (
                    f"{_shown(entry.path)} takes the folder over {max_bytes} bytes"))
            finally:
                os.close(fd)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return copied


def _copy_fd(fd: int, target: Path, budget: int, over: str) -> int:
    st = os.fstat(fd)
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  stat.S_IMODE(st.st_mode) & 0o777)
    written = 0
    with os.fdopen(out, "wb") as f:
        while chunk := os.read(fd, min(CHUNK, budget - written + 1)):
            written += len(chunk)
            if written > budget:
                raise NotData(over)
            f.write(chunk)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    return written


def digest(folder: Path, h: Any, *, max_bytes: int, skip: str = ".ipynb_checkpoints") -> None:
    """Feed `h` (a hashlib object) what `folder` holds: every name and what it is, the bytes
    of its regular files up to `max_bytes` in all, without following a link or refusing
    anything (a link is hashed as its target's name, a hard-linked or special file as its
    kind and size, unread). Regular files under a folder named `skip` are left out."""
    budget = max_bytes
    try:
        top = os.open(folder, _DIR)
    except OSError as exc:
        h.update(f"unreadable: {exc.errno}\0".encode())
        return
    try:
        for entry in _entries(top):
            mode, path = entry.st.st_mode, os.fsencode(entry.path)
            plain = stat.S_ISREG(mode) and entry.st.st_nlink == 1
            if (plain or stat.S_ISDIR(mode)) and skip in entry.path.split("/"):
                continue
            h.update(b"%s\0%o\0%d\0" % (path, stat.S_IFMT(mode), entry.st.st_size))
            if stat.S_ISLNK(mode):
                h.update(os.fsencode(os.readlink(entry.name, dir_fd=entry.dir_fd)) + b"\0")
            elif plain:
                budget -= _hash_file(entry, h, budget)
    except (OSError, NotData) as exc:   # changed under us: hashed as such, graded or not
        h.update(f"unreadable: {exc}\0".encode())
    finally:
        os.close(top)


def _hash_file(entry: _Entry, h: Any, budget: int) -> int:
    fd = _open_file(entry)
    used = 0
    try:
        while used < budget and (chunk := os.read(fd, min(CHUNK, budget - used))):
            h.update(chunk)
            used += len(chunk)
    finally:
        os.close(fd)
    h.update(b"\0")
    return used


def read_small(folder: Path, name: str, max_bytes: int = SMALL) -> bytes | None:
    """The bytes of the file `name` directly in `folder`, or None where either is absent;
    raises NotData where it is a link, not a regular file or over `max_bytes`."""
    try:
        top = _open_top(folder)
    except FileNotFoundError:
        return None
    try:
        try:
            st = os.stat(name, dir_fd=top, follow_symlinks=False)
        except FileNotFoundError:
            return None
        entry = _Entry(name, name, st, top)
        why = _problem(entry) or ("" if stat.S_ISREG(st.st_mode) else f"{name} is a folder")
        if why:
            raise NotData(why)
        if st.st_size > max_bytes:
            raise NotData(f"{name} holds {st.st_size} bytes, more than the {max_bytes} a "
                          "file there may hold")
        fd = _open_file(entry)
        try:   # what fstat said, and one byte more: a file that grew since is refused
            chunks, size = [], 0
            while size <= st.st_size and (
                    chunk := os.read(fd, min(1 << 20, st.st_size + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        if len(data) > min(max_bytes, st.st_size):
            raise NotData(f"{name} holds more than {max_bytes} bytes")
        return data
    finally:
        os.close(top)


def small_text(folder: Path, name: str) -> str | None:
    """The text of nbgrader's small file `name` in a learner's `folder` (its timestamp or
    its secret), or None where it is absent or not what nbgrader writes there: a link, not
    a regular file, over SMALL bytes, not UTF-8. Never raises for the learner's file."""
    try:
        data = read_small(folder, name)
        return None if data is None else data.decode("utf-8")
    except (NotData, OSError, UnicodeDecodeError):
        return None


__all__ = ["ADVICE", "MAX_DEPTH", "SECRET", "SMALL", "TIMESTAMP", "NotData", "check",
           "copy_tree", "digest", "read_small", "small_text"]
