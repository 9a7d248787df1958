"""The trainer's output pump: a small process between the trainer's stdout/stderr (a pipe) and
trainer.log.

A trainer writing straight into trainer.log dies with the state dir's disk: `print` raises
ENOSPC (Python) or the process takes the write error however it does. Through the pump a write
can fail only here: the pump drops what it cannot write, counts it, and tries again with the next
chunk, so logging resumes by itself once space returns. The trainer only ever sees a pipe being
drained.

It is a process of its own, not a keeper thread, so that neither a keeper stopped (SIGSTOP, a
debugger, swap) nor a keeper killed leaves the trainer writing into a pipe nobody reads: a full
pipe would block it, a pipe without a reader would raise EPIPE or SIGPIPE in it. The keeper holds a
spare read end of the same pipe and starts another pump on it if this one dies.

The file is opened by path again when it was renamed away or deleted (a rotation without
copytruncate), so the trainer's output goes to the trainer.log the keeper's reader follows. A
copytruncate needs nothing: the file is opened O_APPEND.

Only a regular file is written: the path is opened O_NONBLOCK|O_NOFOLLOW, so a FIFO planted at
trainer.log cannot block the pump (and, through a full pipe, the trainer) and a symlink there is
never followed to a file that is not trainroom's; what is not a regular file is refused, said, and
the trainer's output drained and dropped (counted) until trainer.log is a regular file again.

What it tells the keeper goes to its stdout, one line each, never blocking (the keeper may be
stopped; a line that does not fit is dropped, the next carries the totals):
  `refused TOTAL WHY...`   trainer.log is not a regular file (WHY in words): TOTAL bytes dropped
  `accepted TOTAL`   trainer.log is a regular file again; TOTAL bytes were dropped while refused
  `lost TOTAL SINCE`   bytes dropped so far, and when the first of this loss was dropped
  `resumed TOTAL SINCE UNTIL`   writing works again after a loss
  `eof`   every writer closed the pipe and all it carried was written (or counted lost)
Imports only the standard library: it starts in tens of milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import time

CHUNK = 1 << 16
PIPE_BYTES = 1 << 20  # the pipe's buffer: the trainer's burst the pump may take a moment to drain
REPORT_S = 0.5  # the most often a continuing loss is told
REOPEN_CHECK_S = 0.5  # the most often the path is compared with the file held
_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS}
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW


def _kind(mode: int) -> str:
    for test, words in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def open_log(path: str) -> tuple[int | None, str | None]:
    """`path` opened for appending (blocking writes), or (None, why it is refused), or (None, None)
    when it cannot be opened now (a full disk). Opened O_NONBLOCK (a FIFO without a reader cannot
    block the opener) and O_NOFOLLOW (a symlink is never followed); only a regular file is kept."""
    name = os.path.basename(path)
    try:
        fd = os.open(path, _OPEN_FLAGS, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, f"{name} is a symbolic link (never followed: where it points is not trainroom's)"
        if exc.errno == errno.ENXIO:
            return None, f"{name} is a FIFO or socket with no reader (not a regular file)"
        if exc.errno in (errno.EISDIR, errno.ENODEV, errno.EACCES, errno.EPERM):
            return None, f"{name} cannot be written ({exc.strerror or exc})"
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None, f"{name} is {_kind(st.st_mode)}, not a regular file"
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None, None
    return fd, None


class Pump:
    def __init__(self, path: str, src: int, status: int | None) -> None:
        self.path = path
        self.src = src
        self.status = status
        self.fd: int | None = None
        self.ident: tuple[int, int] | None = None
        self.lost = 0
        self.since: float | None = None  # the current loss began (None while writing works)
        self.told = 0.0
        self.checked = 0.0
        self.refused: str | None = None  # why the path is not written (not a regular file)
        self.dropped = 0  # bytes drained and dropped while it was refused
        self._open()

    def _open(self) -> None:
        fd, why = open_log(self.path)
        if why is not None:
            if self.fd is not None:  # what the path names now is refused: write nowhere else
                os.close(self.fd)
                self.fd, self.ident = None, None
            if why != self.refused:
                self.refused = why
                self._tell(f"refused {self.dropped} {why}\n")
            return
        if fd is None:
            return  # a full disk may refuse to create it: keep the one held, or drop until it can
        st = os.fstat(fd)
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)
        if self.refused is not None:
            self.refused = None
            self._tell(f"accepted {self.dropped}\n")

    def _follow(self, now: float) -> None:
        """The path names another file (or none): write where the reader reads."""
        if (self.fd is not None or self.refused is not None) and now - self.checked < REOPEN_CHECK_S:
            return
        self.checked = now
        try:
            st = os.lstat(self.path)
            same = (st.st_dev, st.st_ino) == self.ident
        except OSError:
            same = False
        if not same:
            self._open()

    def _tell(self, line: str) -> None:
        if self.status is None:
            return
        try:
            os.write(self.status, line.encode())
        except BlockingIOError:
            pass  # the keeper is not reading now: the next line carries the totals
        except OSError:
            self.status = None  # the keeper is gone: go on pumping

    def write(self, data: bytes) -> None:
        now = time.time()
        self._follow(now)
        if self.fd is None and self.refused is not None:
            self.dropped += len(data)  # drained all the same: the trainer never blocks on its output
            return
        view = memoryview(data)
        while view:
            try:
                if self.fd is None:
                    raise OSError(errno.ENOSPC, "trainer.log cannot be opened")
                n = os.write(self.fd, view)
            except OSError as exc:
                if exc.errno not in _WRITE_ERRORS and self.fd is not None:
                    raise
                self._lose(len(view), now)
                return
            view = view[n:]
        if self.since is not None:
            self._tell(f"resumed {self.lost} {self.since:.3f} {now:.3f}\n")
            self.since = None

    def _lose(self, n: int, now: float) -> None:
        self.lost += n
        if self.since is None:
            self.since = now
            self.told = 0.0
            self.checked = 0.0  # a full disk may come with a new file: look again next time
        if now - self.told >= REPORT_S:
            self.told = now
            self._tell(f"lost {self.lost} {self.since:.3f}\n")

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.src, CHUNK)
            except InterruptedError:
                continue
            if not data:
                break  # every writer closed: the trainer and whatever it left are gone
            self.write(data)
        if self.since is not None:
            self._tell(f"lost {self.lost} {self.since:.3f}\n")
        self._tell("eof\n")  # everything the trainer wrote is in the file (or counted lost)


def widen(fd: int) -> None:
    """A larger pipe buffer where the kernel allows it (Linux; 1 MiB is the default cap)."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m trainroom.core.keeper.outpump LOG_PATH < pipe", file=sys.stderr)
        return 2
    # Terminal and stop signals are the keeper's business; the trainer's output still flows.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    status: int | None = 1
    try:
        os.set_blocking(1, False)
    except OSError:
        status = None
    Pump(args[0], 0, status).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
