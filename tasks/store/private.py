"""A workspace private to its owner whatever the umask (issue 24 item 2), and a lake a lab may
open to one Unix group.

On a shared server, a workspace made under the usual umask 022 was readable by every local user:
Prefect's database, the lake, the catalog, the log, and each study's ``panel.sqlite`` (which maps
every blinded image to its tool and prompt, and holds the live answers). Three things keep it
private:

- **The umask**: every imagebench process sets umask 077 first thing (:func:`enter_private`:
  the entry point, ``python -m flows.cli``, the warm server, whose forked commands and Prefect
  APIs inherit it). So whatever it, SQLite (``-wal``, ``-shm``, ``-journal``), DuckDB (``.wal``),
  Prefect or any library creates is 0600, every folder 0700. The caller's own umask is kept in
  ``IMAGEBENCH_CALLER_UMASK`` for what a person asks to publish outside the workspace
  (:func:`publish_tree`: a report site, a study bundle).
- **The workspace folder**: checked at every command (:func:`secure_workspace`): one of another
  user is refused (someone who creates a lab's workspace path first would own what is written
  there); one open to others is closed to 0700, said in one line.
- **The lake's share group** (``IMAGEBENCH_SHARE_GROUP``): the workspace becomes 0710 (the
  group may pass, not list), its other entries stay 0700/0600, and only the lake (folders
  02750, files 0640, all of the group) and the catalog (0640) open to the group; lock files stay
  0600. A lake folder is shared when it is 02750, or set-group-id under a shared one (the kernel
  gives new folders the setgid bit and the group of their parent): :func:`settle` gives a file
  written into the lake, in any process (a Prefect worker's flow run included), the lake's mode.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
CALLER_UMASK_ENV = "IMAGEBENCH_CALLER_UMASK"
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
SHARED_HOME = 0o710  # the group may pass through the workspace to the lake and the catalog, not list it
SHARED_DIR, SHARED_FILE = 0o2750, 0o640
NEVER_SHARED = (".lock", ".tmp")  # lock files (a reader could hold them) and writers' temp files
_SETTLE_DEPTH = 12  # folders walked up from a file to find whether the lake is shared


class WorkspaceRefused(RuntimeError):
    """The workspace cannot be made private (another user's, an unknown share group)."""


# ---- the process ----------------------------------------------------------------------------------


def enter_private() -> None:
    """First thing in every imagebench process: new files 0600, new folders 0700. Remembers the
    caller's umask in the environment (a warm command's child gets its client's environment)."""
    old = os.umask(PRIVATE_UMASK)
    os.environ.setdefault(CALLER_UMASK_ENV, f"{old:04o}")


def caller_umask() -> int:
    """The umask of whoever ran the command (022 when unknown)."""
    try:
        return int(os.environ[CALLER_UMASK_ENV], 8) & 0o777
    except (KeyError, ValueError):
        return 0o022


def publish_tree(path: Path) -> None:
    """Give an output a person asked for outside the workspace (a report site, a bundle) the modes
    their own umask would have given it: it is theirs to publish."""
    mask = caller_umask()
    path = Path(path)
    entries = [path] if path.is_file() else [path, *path.rglob("*")]
    for p in entries:
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, 0o777 & ~mask)
        elif stat.S_ISREG(st.st_mode):
            os.chmod(p, 0o666 & ~mask)


def inside(path: Path, folder: Path) -> bool:
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


# ---- the workspace --------------------------------------------------------------------------------


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def group_id(name: str) -> int:
    """The gid of ``IMAGEBENCH_SHARE_GROUP`` (a name or a number)."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise WorkspaceRefused(f"IMAGEBENCH_SHARE_GROUP={name}: no such group on this machine") from None


def _chgrp(path: Path, gid: int, group: str) -> None:
    try:
        os.chown(path, -1, gid, follow_symlinks=False)
    except PermissionError:
        raise WorkspaceRefused(f"IMAGEBENCH_SHARE_GROUP={group}: you are not a member of that group "
                               f"(cannot give it {path})") from None


def _set(path: Path, mode: int, gid: int | None = None, group: str = "") -> bool:
    """Mode (and group) of ``path``; True when something changed."""
    st = os.lstat(path)
    changed = False
    if gid is not None and st.st_gid != gid:
        _chgrp(path, gid, group)
        changed = True
    if stat.S_IMODE(st.st_mode) != mode or changed:  # chown may clear the setgid bit: set the mode again
        os.chmod(path, mode)
        changed = changed or stat.S_IMODE(st.st_mode) != mode
    return changed


def _share_lake_tree(lake: Path, gid: int, group: str) -> None:
    """Every folder 02750 and file 0640 of the group, lock and temp files 0600 (once, when the lake
    is opened to the group; afterwards :func:`settle` keeps each new file so)."""
    for root, dirs, files in os.walk(lake):
        for name in dirs:
            p = Path(root) / name
            if not os.path.islink(p):
                _set(p, SHARED_DIR, gid, group)
        for name in files:
            p = Path(root) / name
            if os.path.islink(p):
                continue
            private = name.endswith(NEVER_SHARED)
            _set(p, PRIVATE_FILE if private else SHARED_FILE, None if private else gid, group)
    _set(lake, SHARED_DIR, gid, group)  # last: a lake folder of 02750 says the walk is done


def _unshare_lake_tree(lake: Path) -> None:
    for root, dirs, files in os.walk(lake):
        for name in dirs + files:
            p = Path(root) / name
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) & 0o700)
    os.chmod(lake, PRIVATE_DIR)


def secure_workspace(home: Path, lake: Path, catalog: Path, share_group: str | None) -> list[str]:
    """Check and close the workspace ``home`` (nothing when it does not exist yet); what was
    changed that a person should know, in one line each. Raises :class:`WorkspaceRefused`."""
    home = Path(home)
    try:
        st = os.stat(home)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        raise WorkspaceRefused(f"workspace {home} is not a folder")
    if st.st_uid != os.geteuid():
        raise WorkspaceRefused(
            f"workspace {home} belongs to {_user(st.st_uid)}, not to you ({_user(os.geteuid())}): imagebench "
            "works only in a workspace folder of your own (IMAGEBENCH_HOME); a lab's analysts read a shared "
            "lake through IMAGEBENCH_SHARE_GROUP (docs/OPERATIONS.md)")
    said = []
    before = stat.S_IMODE(st.st_mode)
    if share_group is None:
        if before != PRIVATE_DIR:
            os.chmod(home, PRIVATE_DIR)
            if before & 0o077:
                said.append(f"workspace {home} was open to other users (mode {before:04o}): made private (0700); "
                            "IMAGEBENCH_SHARE_GROUP opens its lake to one group")
        lake_st = _lstat(lake)
        if lake_st is not None and stat.S_ISDIR(lake_st.st_mode) and lake_st.st_mode & 0o2077:
            _unshare_lake_tree(lake)  # the group's door was the lake's: closed behind it too
        for p in (catalog, Path(f"{catalog}.wal")):
            cst = _lstat(p)
            if cst is not None and stat.S_ISREG(cst.st_mode) and cst.st_mode & 0o077:
                os.chmod(p, PRIVATE_FILE)
        return said
    gid = group_id(share_group)
    if _set(home, SHARED_HOME, gid, share_group) and before & 0o007:
        said.append(f"workspace {home} was open to other users (mode {before:04o}): only its lake and catalog "
                    f"are now open, to group {share_group}")
    # Everything but the lake and the catalog: the owner's alone (the group may pass through home).
    shared_names = {lake.name, catalog.name, f"{catalog.name}.wal"} if Path(lake).parent == home else {catalog.name}
    with os.scandir(home) as entries:
        for entry in entries:
            if entry.name in shared_names or entry.name.startswith(f".{catalog.name}."):  # a catalog being built
                continue
            est = entry.stat(follow_symlinks=False)
            if not stat.S_ISLNK(est.st_mode) and est.st_mode & 0o077:
                os.chmod(entry.path, stat.S_IMODE(est.st_mode) & 0o700)
    lake = Path(lake)
    lake.mkdir(exist_ok=True)
    lake_st = os.lstat(lake)
    if stat.S_IMODE(lake_st.st_mode) != SHARED_DIR or lake_st.st_gid != gid:
        _share_lake_tree(lake, gid, share_group)
    for p in (catalog, Path(f"{catalog}.wal")):
        cst = _lstat(p)
        if cst is not None and stat.S_ISREG(cst.st_mode):
            _set(p, SHARED_FILE, gid, share_group)
    return said


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


# ---- files written into the lake ------------------------------------------------------------------


def _shared_folder(folder: Path) -> tuple[int, list[Path]] | None:
    """(gid, new folders to open) when ``folder`` is in a lake shared with a group, else None."""
    me, new = os.geteuid(), []
    d = Path(folder)
    for _ in range(_SETTLE_DEPTH):
        try:
            st = os.stat(d)
        except OSError:
            return None
        if st.st_uid != me:
            return None
        if stat.S_IMODE(st.st_mode) == SHARED_DIR:
            return st.st_gid, new
        if not st.st_mode & stat.S_ISGID:  # a private folder (and none shared above it)
            return None
        new.append(d)  # made inside a shared folder since: setgid and its group, not yet 02750
        d = d.parent
    return None


def settle(path: Path) -> None:
    """A file just written in the lake (before it is renamed into place): 0640 of the lake's
    group when the lake is shared, with any new folder above it 02750; otherwise nothing (the
    umask made it private)."""
    shared = _shared_folder(Path(path).parent)
    if shared is None:
        return
    gid, new = shared
    for d in reversed(new):
        _set(d, SHARED_DIR, gid)
    _set(Path(path), SHARED_FILE, gid)


def settle_like(path: Path, lake: Path) -> None:
    """A file outside the lake that the share group reads with it (the catalog): 0640 of the
    lake's group when the lake is shared."""
    try:
        st = os.stat(lake)
    except OSError:
        return
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == SHARED_DIR:
        _set(Path(path), SHARED_FILE, st.st_gid)
